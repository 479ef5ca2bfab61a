//! Secret redaction. The values of the environment variables named by `api_key_env`,
//! strings shaped like common API keys, and credentials in the shapes commands and
//! URLs carry them (a URL's password, `curl -u user:pw`, `--password pw`,
//! `password=pw`) must never reach a report, receipt, card, trace or log line. Every writer of those passes text through [`Redactor::redact`].
//! A known value is also redacted in the forms a tool would print it in: base64
//! (standard and URL-safe, at any alignment inside a longer encoded stream), hex
//! (either case), URL-encoding, and inside a string literal as JSON (serde's, Python's
//! all-ASCII, Go's) or Python's `repr` writes it.

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

/// Credentials in the shapes commands and URLs carry them: a URL's password
/// (`https://user:PASSWORD@host`), `curl -u user:PASSWORD`, `--password PASSWORD` or
/// `--password=PASSWORD`, `password=PASSWORD` (also `passwd`, any case, `:`
/// for `=`), `sshpass -p PASSWORD`, and `mysql`/`mariadb`'s glued `-pPASSWORD`. Only
/// the `secret` group is replaced, so the text still says what it was.
#[allow(clippy::expect_used)]
fn credential_shapes() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(concat!(
            r"(?i)[a-z][a-z0-9+.\-]*://[^\s/:@]+:(?P<secret>[^\s@/]+)@",
            r#"|(?i)(?:^|\s)(?:-u|--user)\s+['"]?[^\s:'"]+:(?P<secret2>[^\s'"]+)"#,
            r#"|(?i)--pass(?:word|wd)?(?:=|\s+)['"]?(?P<secret3>[^\s'"]+)"#,
            r#"|(?i)\b(?:password|passwd)\s*[=:]\s*['"]?(?P<secret4>[^\s'",;&]+)"#,
            r#"|(?i)\bsshpass\s+-p\s*['"]?(?P<secret5>[^\s'"]+)"#,
            r#"|(?i)\b(?:mysql|mariadb|mysqldump)\b[^\n|;&]*?\s-p(?P<secret6>[^\s'"]+)"#,
        ))
        .expect("the credential pattern is a valid regex")
    })
}

/// Literals every match of [`key_shapes`] contains (its prefixes, exactly: a short
/// one such as `gh` would be in most English text), looked for ASCII
/// case-insensitively: a text holding none cannot match, and is not run through the
/// pattern. The patterns cost about 1.4 ms to compile, which most texts then never
/// pay. The literals are ASCII: Unicode case folds the patterns' `(?i)` also accepts
/// (`ſ` for `s`) are not looked for.
const KEY_LITERALS: &[&str] = &[
    "sk-",
    "akia",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "xox",
    "aiza",
    "bearer",
];

/// The same for [`credential_shapes`] (a URL's password needs `@` too, see
/// [`may_hold_shapes`]).
const CREDENTIAL_LITERALS: &[&str] = &["://", "-u", "--pass", "passw", "sshpass", "mysql", "mariadb"];

/// Whether `text` may hold a key shape, and a credential shape.
#[allow(clippy::expect_used)]
fn may_hold_shapes(text: &str) -> (bool, bool) {
    static LITERALS: OnceLock<aho_corasick::AhoCorasick> = OnceLock::new();
    let literals = LITERALS.get_or_init(|| {
        aho_corasick::AhoCorasick::builder()
            .ascii_case_insensitive(true)
            .build(KEY_LITERALS.iter().chain(CREDENTIAL_LITERALS))
            .expect("the shape literals build an automaton")
    });
    let (mut key, mut credential) = (false, false);
    for m in literals.find_overlapping_iter(text) {
        match m.pattern().as_usize().checked_sub(KEY_LITERALS.len()) {
            None => key = true,
            Some(i) => credential |= CREDENTIAL_LITERALS[i] != "://" || text.contains('@'),
        }
        if key && credential {
            break;
        }
    }
    (key, credential)
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
        let encoded: Vec<String> = values.iter().flat_map(|v| encodings(v)).collect();
        values.extend(encoded);
        let mut redactor = Redactor { values };
        redactor.settle();
        redactor
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
            self.values.extend(encodings(&v));
            self.values.push(v);
            self.settle();
        }
        self
    }

    /// Adds the values `other` knows (a log line's redactor learning a fire's).
    pub fn merge(&mut self, other: &Redactor) {
        self.values.extend(other.values.iter().cloned());
        self.settle();
    }

    /// Longest values first (a value inside a longer one must not cut it up), each
    /// once: equal lengths sorted too, so a value learned again is dropped however
    /// often a fire builds its redactor.
    fn settle(&mut self) {
        self.values.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        self.values.dedup();
    }

    /// Whether `bytes` (not text: a binary file) hold a known secret value in any of
    /// its encoded forms.
    pub fn holds_secret(&self, bytes: &[u8]) -> bool {
        self.values
            .iter()
            .any(|v| memchr::memmem::find(bytes, v.as_bytes()).is_some())
    }

    /// Whether the path `rel` (a file a model named) holds a secret as a person or a
    /// decoder would read its name: as it is, with its directories run together (a
    /// value split across two levels), and percent-decoded (any mix of escaped and
    /// plain bytes, either case: helper-104, helper-106).
    pub fn path_holds_secret(&self, rel: &str) -> bool {
        let joined = rel.replace('/', "");
        [Some(rel.to_string()), Some(joined.clone()), percent_decoded(&joined)]
            .into_iter()
            .flatten()
            .any(|form| self.redact(&form) != form)
    }

    /// `rel` as a record shows it: redacted as text is, and where the secret is only
    /// in one of [`Redactor::path_holds_secret`]'s other readings, everything past its
    /// first directory hidden.
    pub fn redact_path(&self, rel: &str) -> String {
        let redacted = self.redact(rel);
        if redacted != rel || !self.path_holds_secret(rel) {
            return redacted.into_owned();
        }
        format!("{}/{REDACTED}", rel.split('/').next().unwrap_or_default())
    }

    pub fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for v in &self.values {
            if out.contains(v.as_str()) {
                out = Cow::Owned(out.replace(v.as_str(), REDACTED));
            }
        }
        let (key, credential) = may_hold_shapes(&out);
        if key && key_shapes().is_match(&out) {
            out = Cow::Owned(key_shapes().replace_all(&out, REDACTED).into_owned());
        }
        if credential && credential_shapes().is_match(&out) {
            out = Cow::Owned(redact_credentials(&out));
        }
        out
    }
}

/// What log lines are redacted of: process-wide, as logging is. The binaries add the
/// secret-looking variables at start ([`Redactor::from_secret_like_env`]); a fire
/// adds the variables its settings name for keys and tokens once it has read them
/// ([`crate::fire::config::redactor`]), whatever their names, so a key a provider
/// or a proxy echoes in an error body is not printed in a `-v` line of cron's mail.
static LOG_REDACTOR: std::sync::RwLock<Redactor> = std::sync::RwLock::new(Redactor { values: Vec::new() });

/// Log lines are redacted of `more`'s values too, from now on.
pub fn redact_in_logs(more: &Redactor) {
    if let Ok(mut log) = LOG_REDACTOR.write() {
        log.merge(more);
    }
}

/// `text` as a log line may show it ([`redact_in_logs`]).
pub fn redact_log_line(text: &str) -> Cow<'_, str> {
    match LOG_REDACTOR.read() {
        Ok(log) => log.redact(text),
        // Poisoned only by a panic while merging: redact shapes at least.
        Err(_) => Redactor::default().redact(text),
    }
}

/// `text` with the secret part of every [`credential_shapes`] match replaced.
fn redact_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last = 0;
    for caps in credential_shapes().captures_iter(text) {
        let secret = (1..caps.len())
            .filter_map(|i| caps.get(i))
            .find(|m| !m.as_str().is_empty());
        let Some(secret) = secret else { continue };
        if secret.as_str() == REDACTED || secret.start() < last {
            continue;
        }
        out.push_str(&text[last..secret.start()]);
        out.push_str(REDACTED);
        last = secret.end();
    }
    out.push_str(&text[last..]);
    out
}

/// The shortest encoded fragment worth redacting (shorter ones would also match text
/// that merely happens to contain them).
const MIN_ENCODED: usize = 8;

/// The forms of `v` a tool is likely to print: base64 in both alphabets at each of the
/// three byte alignments (only the characters determined by `v`'s bytes alone, so the
/// fragment matches wherever `v` sits inside a longer encoded stream), hex in both
/// cases, percent-encoding (both hex cases) when it differs from `v`, and the escaped
/// forms of [`json_escaped`].
fn encodings(v: &str) -> Vec<String> {
    use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
    use base64::Engine;
    let bytes = v.as_bytes();
    let mut out = Vec::new();
    for offset in 0..3usize {
        let mut buf = vec![0u8; offset];
        buf.extend_from_slice(bytes);
        let (start, end) = ((8 * offset).div_ceil(6), 8 * (offset + bytes.len()) / 6);
        for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
            let enc = engine.encode(&buf);
            if let Some(fragment) = enc.get(start..end) {
                out.push(fragment.to_string());
            }
        }
    }
    out.push(hex::encode(bytes));
    out.push(hex::encode_upper(bytes));
    // RFC 3986 (`-_.~` kept) and the stricter form that escapes every non-alphanumeric.
    for keep in [&b"-_.~"[..], &b""[..]] {
        let mut pct = String::new();
        for &b in bytes {
            if b.is_ascii_alphanumeric() || keep.contains(&b) {
                pct.push(char::from(b));
            } else {
                pct.push_str(&format!("%{b:02X}"));
            }
        }
        if pct != v {
            out.push(lowercase_escapes(&pct));
            out.push(pct);
        }
    }
    // Every byte escaped, letters too (helper-104: `%73%6B%2D...` passed).
    let every: String = bytes.iter().map(|b| format!("%{b:02X}")).collect();
    out.push(lowercase_escapes(&every));
    out.push(every);
    out.extend(json_escaped(v));
    out.retain(|e| e.len() >= MIN_ENCODED && e != v);
    out
}

/// `v` inside a string literal, as a server or a record serialises it (helper-112: a
/// token with a `"` or `\` in it, echoed through `json.dumps`, passed as
/// `db-Pa55\"word`): serde_json's escaping; the all-ASCII form (`\u00e4`, with
/// surrogate pairs) Python's `json.dumps` writes by default; Go's `encoding/json`,
/// which also writes `&`, `<`, `>` as `\u0026`, `\u003c`, `\u003e`; and Python's
/// `repr` (helper-113: `str(dict)`), a doubled backslash, `\'` where both quotes occur.
/// Hex escapes in both cases.
fn json_escaped(v: &str) -> Vec<String> {
    let mut out = Vec::new();
    let repr = v.replace('\\', "\\\\");
    if repr != v {
        out.push(repr.clone());
    }
    if v.contains('\'') && v.contains('"') {
        out.push(repr.replace('\'', "\\'"));
    }
    if let Ok(quoted) = serde_json::to_string(v) {
        let inner = &quoted[1..quoted.len() - 1];
        if inner != v {
            out.push(inner.to_string());
        }
        if inner.contains(['&', '<', '>']) {
            for (amp, lt, gt) in [("\\u0026", "\\u003c", "\\u003e"), ("\\u0026", "\\u003C", "\\u003E")] {
                out.push(inner.replace('&', amp).replace('<', lt).replace('>', gt));
            }
        }
        if !v.is_ascii() {
            for upper in [false, true] {
                let mut ascii = String::new();
                for c in inner.chars() {
                    if c.is_ascii() {
                        ascii.push(c);
                        continue;
                    }
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        ascii.push_str(&if upper {
                            format!("\\u{u:04X}")
                        } else {
                            format!("\\u{u:04x}")
                        });
                    }
                }
                out.push(ascii);
            }
        }
    }
    out
}

/// `s` with each `%XX` (either case) decoded, when it holds any.
fn percent_decoded(s: &str) -> Option<String> {
    if !s.contains('%') {
        return None;
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// `%2F` -> `%2f`: some encoders write lowercase hex digits.
fn lowercase_escapes(pct: &str) -> String {
    let mut out = String::with_capacity(pct.len());
    let mut rest = 0;
    for c in pct.chars() {
        if c == '%' {
            rest = 2;
            out.push(c);
        } else if rest > 0 {
            rest -= 1;
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_value_learned_again_is_kept_once() {
        // Equal lengths, so a sort by length alone would not bring the copies together.
        let fire = Redactor::default().with_value("kestrel-1").with_value("kestrel-2");
        let mut log = fire.clone();
        log.merge(&fire);
        log.merge(&fire);
        assert_eq!(log.values, fire.values);
        assert!(log.values.windows(2).all(|w| w[0].len() >= w[1].len()), "longest first");
    }

    #[test]
    fn log_lines_learn_the_values_a_fire_names_whatever_their_variable() {
        let line = "upstream said quokka-passphrase-4471";
        assert_eq!(redact_log_line(line), line, "not secret-shaped, not yet known");
        redact_in_logs(&Redactor::default().with_value("quokka-passphrase-4471"));
        assert_eq!(redact_log_line(line), "upstream said [REDACTED]");
        let encoded = redact_log_line("in base64 cXVva2thLXBhc3NwaHJhc2UtNDQ3MQ==");
        assert!(encoded.starts_with("in base64 [REDACTED]"), "{encoded}");
    }

    #[test]
    fn a_path_holds_a_secret_split_across_directories_or_escaped_in_any_mix() {
        let r = Redactor::default().with_value("kestrel-secret-99");
        for rel in [
            "reports/kestrel-secret-99.md",
            "reports/kestrel-se/cret-99.md",
            "reports/kestrel%2Dsecret%2d99.md",
            "reports/%6Bestrel-secret-9%39.md",
        ] {
            assert!(r.path_holds_secret(rel), "{rel}");
            assert!(!r.redact_path(rel).contains("secret"), "{rel}: {}", r.redact_path(rel));
        }
        assert_eq!(r.redact_path("reports/kestrel-se/cret-99.md"), "reports/[REDACTED]");
        assert!(!r.path_holds_secret("reports/kestrel-plain.md"));
        assert_eq!(r.redact_path("reports/100%.md"), "reports/100%.md");
    }

    /// A value with characters JSON escapes, inside a JSON string as a server or a
    /// record writes it (`json.dumps`: `\"`, `\\`, and `\u00e4` for non-ASCII).
    #[test]
    fn a_value_escaped_inside_a_json_string_is_redacted() {
        let r = Redactor::default().with_value("db-Pa55\"word\\with-SECRET-7731");
        let dumped = serde_json::json!({"auth": "db-Pa55\"word\\with-SECRET-7731"}).to_string();
        assert_eq!(r.redact(&dumped), r#"{"auth":"[REDACTED]"}"#);
        let go = Redactor::default().with_value("db-Pa55&word<with>-SECRET-7731");
        let marshalled = r#"{"auth":"db-Pa55\u0026word\u003cwith\u003e-SECRET-7731"}"#;
        assert_eq!(go.redact(marshalled), r#"{"auth":"[REDACTED]"}"#);
        let repr = r#"{'auth': 'db-Pa55"word\\with-SECRET-7731'}"#;
        let r = Redactor::default().with_value("db-Pa55\"word\\with-SECRET-7731");
        assert_eq!(r.redact(repr), "{'auth': '[REDACTED]'}");
        let r = Redactor::default().with_value("schlüssel-geheim-42");
        for form in ["schl\\u00fcssel-geheim-42", "schl\\u00FCssel-geheim-42"] {
            assert_eq!(
                r.redact(&format!("{{\"k\": \"{form}\"}}")),
                r#"{"k": "[REDACTED]"}"#,
                "{form}"
            );
        }
    }

    #[test]
    fn a_value_with_every_byte_percent_escaped_is_redacted() {
        let r = Redactor::default().with_value("kestrel-secret-99");
        let every: String = "kestrel-secret-99".bytes().map(|b| format!("%{b:02X}")).collect();
        for form in [every.clone(), every.to_lowercase()] {
            assert_eq!(r.redact(&format!("x {form} y")), "x [REDACTED] y", "{form}");
        }
    }

    #[test]
    fn a_text_without_any_shape_literal_skips_the_patterns() {
        assert_eq!(
            may_hold_shapes("a plain report: 3 files, http://host/x"),
            (false, false)
        );
        assert_eq!(may_hold_shapes("Authorization: BEARER abc"), (true, false));
        assert_eq!(may_hold_shapes("https://u:p@host"), (false, true));
        assert_eq!(may_hold_shapes("PassWord=1"), (false, true));
    }

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

    #[test]
    fn redacts_credentials_in_command_and_url_shapes() {
        let r = Redactor::default();
        for (text, secret) in [
            ("curl https://admin:hunter2pw@db.example.com/x", "hunter2pw"),
            ("curl -u admin:hunter2pw https://x", "hunter2pw"),
            ("tool --password hunter2pw --x", "hunter2pw"),
            ("tool --password=hunter2pw", "hunter2pw"),
            ("export PASSWORD=hunter2pw; run", "hunter2pw"),
            ("db password: hunter2pw", "hunter2pw"),
            ("sshpass -p hunter2pw ssh host", "hunter2pw"),
            ("mysql -u root -phunter2pw mydb", "hunter2pw"),
        ] {
            let out = r.redact(text);
            assert!(!out.contains(secret), "{text:?} -> {out:?}");
            assert!(out.contains(REDACTED), "{out}");
        }
        let out = r.redact("curl -u admin:hunter2pw https://x");
        assert!(out.contains("admin:"), "what it was is still said: {out}");
        for plain in [
            "mkdir -p reports/x",
            "the token budget: 2000",
            "http://example.com/a:b",
            "pwd",
            "PWD=/work/repo",
        ] {
            assert_eq!(r.redact(plain), plain);
        }
    }

    #[test]
    fn redacts_the_encoded_forms_of_a_value() {
        use base64::engine::general_purpose::{STANDARD, URL_SAFE};
        use base64::Engine;
        let key = "sk-test-SUPER/SECRET+VALUE=1234567890";
        let r = Redactor::default().with_value(key);
        let forms = [
            STANDARD.encode(key),
            URL_SAFE.encode(key),
            STANDARD.encode(format!("KEY={key}\n")),
            STANDARD.encode(format!("Authorization: {key}")),
            hex::encode(key),
            hex::encode_upper(key),
            "sk-test-SUPER%2FSECRET%2BVALUE%3D1234567890".to_string(),
            "sk-test-SUPER%2fSECRET%2bVALUE%3d1234567890".to_string(),
            "sk%2Dtest%2DSUPER%2FSECRET%2BVALUE%3D1234567890".to_string(),
        ];
        for form in &forms {
            let text = format!("out: {form} done");
            let out = r.redact(&text);
            assert!(out.contains(REDACTED), "{form} not redacted: {out}");
            // What is left of the encoded form cannot be decoded back to the key.
            assert!(!out.contains(&form[4..form.len() - 4]), "{form} survived: {out}");
        }
        assert_eq!(r.redact("plain text with no key"), "plain text with no key");
    }
}
