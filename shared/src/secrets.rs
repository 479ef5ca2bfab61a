//! Secret redaction. The values of the environment variables named by `api_key_env`,
//! and strings shaped like common API keys, must never reach a report, receipt, card,
//! trace or log line. Every writer of those passes text through [`Redactor::redact`].

use regex::Regex;
use std::borrow::Cow;
use std::sync::OnceLock;

/// Placeholder written instead of a secret.
pub const REDACTED: &str = "[REDACTED]";

// The pattern is a literal, compiled on first use and covered by the unit tests below;
// there is no input that makes it fail, and no safe fallback (skipping key shapes
// would leak secrets), so a panic here is the honest form of a build defect.
#[allow(clippy::expect_used)]
fn key_shapes() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(concat!(
            r"sk-ant-[A-Za-z0-9_\-]{16,}",
            r"|sk-(?:proj-)?[A-Za-z0-9_\-]{20,}",
            r"|AKIA[0-9A-Z]{16}",
            r"|gh[pousr]_[A-Za-z0-9]{30,}",
            r"|github_pat_[A-Za-z0-9_]{30,}",
            r"|xox[abprs]-[A-Za-z0-9\-]{10,}",
            r"|AIza[0-9A-Za-z_\-]{35}",
            r"|(?i:bearer)\s+[A-Za-z0-9._\-]{16,}",
        ))
        .expect("the key-shape pattern is a valid regex")
    })
}

/// Redacts known secret values and key-shaped strings.
#[derive(Debug, Clone, Default)]
pub struct Redactor {
    values: Vec<String>,
}

impl Redactor {
    /// A redactor for the values currently held by `env_names`.
    pub fn from_env<'a>(env_names: impl IntoIterator<Item = &'a str>) -> Redactor {
        let mut values: Vec<String> = env_names
            .into_iter()
            .filter_map(|n| std::env::var(n).ok())
            .filter(|v| v.len() >= 6)
            .collect();
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        values.dedup();
        Redactor { values }
    }

    /// A redactor for every environment variable whose name looks secret
    /// (`*KEY*`, `*TOKEN*`, `*SECRET*`, `*PASSWORD*`), used for log lines.
    pub fn from_secret_like_env() -> Redactor {
        let names: Vec<String> = std::env::vars()
            .map(|(k, _)| k)
            .filter(|k| {
                ["KEY", "TOKEN", "SECRET", "PASSWORD"]
                    .iter()
                    .any(|m| k.to_ascii_uppercase().contains(m))
            })
            .collect();
        Redactor::from_env(names.iter().map(String::as_str))
    }

    /// Adds a literal secret value.
    pub fn with_value(mut self, v: impl Into<String>) -> Redactor {
        let v = v.into();
        if v.len() >= 6 {
            self.values.push(v);
        }
        self
    }

    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for v in &self.values {
            if out.contains(v.as_str()) {
                out = Cow::Owned(out.replace(v.as_str(), REDACTED));
            }
        }
        if key_shapes().is_match(&out) {
            out = Cow::Owned(key_shapes().replace_all(&out, REDACTED).into_owned());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_values_and_shapes() {
        let r = Redactor::default().with_value("hunter2-secret");
        let text = "key=hunter2-secret auth: Bearer abcdefghijklmnopqrstu sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX ghp_abcdefghijklmnopqrstuvwxyz0123456789 AKIAABCDEFGHIJKLMNOP ok";
        let out = r.redact(text);
        for secret in [
            "hunter2-secret",
            "abcdefghijklmnopqrstu",
            "sk-proj-ABCD",
            "ghp_abc",
            "AKIAABCD",
        ] {
            assert!(!out.contains(secret), "{secret} leaked: {out}");
        }
        assert!(out.ends_with(" ok"));
        assert_eq!(r.redact("plain text"), "plain text");
    }
}
