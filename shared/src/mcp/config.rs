//! The `mcp:` section of `settings/runtime.yaml`: the MCP tool servers a builder
//! declares (docs/design.md). Each entry says what starts (a stdio argv), which
//! variables of the runtime's environment it may see, which TCP ports it may reach,
//! which extra directories it may read, and whether a fire may go on without it.
//! The checks here are the ones a reviewer relies on: a name usable in rule names, a
//! package launcher given an exact version (never `@latest`), no way to hand the
//! provider's key to a server.

use crate::diag::Diagnostic;
use crate::yamlpos;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One declared server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    /// The program and its arguments, started over stdio inside the tool sandbox.
    #[serde(default)]
    pub command: Vec<String>,
    /// A streamable-HTTP endpoint instead of a command (not supported yet: refused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Names of the runtime's environment variables the server gets (nothing else).
    #[serde(default)]
    pub env_allow: Vec<String>,
    /// TCP ports the server may connect to (none by default).
    #[serde(default)]
    pub network: Vec<u16>,
    /// Extra directories it may read (absolute, or `~/` for the runtime's home).
    #[serde(default)]
    pub read: Vec<String>,
    /// A server that does not start fails the fire instead of being left out.
    #[serde(default)]
    pub required: bool,
    /// Seconds the server has to start and list its tools.
    #[serde(default = "default_start_timeout")]
    pub start_timeout_s: u64,
}

fn default_start_timeout() -> u64 {
    10
}

/// The servers, by name.
pub type McpServers = BTreeMap<String, McpServer>;

impl McpServer {
    /// The read roots with `~/` expanded against `home`.
    pub fn read_dirs(&self, home: Option<&Path>) -> Vec<PathBuf> {
        self.read
            .iter()
            .filter_map(|r| match r.strip_prefix("~/") {
                Some(rest) => home.map(|h| h.join(rest)),
                None => Some(PathBuf::from(r)),
            })
            .collect()
    }
}

/// Whether `name` can be a server's name: the middle of `mcp__<server>__<tool>`.
pub fn valid_server_name(name: &str) -> bool {
    !name.is_empty()
        && !name.contains("__")
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// Launchers that fetch a package by name before running it, and the flags of each
/// whose value is the package spec.
const LAUNCHERS: &[(&str, &[&str])] = &[
    ("npx", &["-p", "--package"]),
    ("bunx", &["-p", "--package"]),
    ("pnpx", &[]),
    ("uvx", &["--from"]),
    ("pipx", &["--spec"]),
];

/// The package a launcher command fetches (`npx -y pkg@1.2.3` -> `pkg@1.2.3`), if the
/// command is one; `Err` says why its spec is not pinned to an exact version.
pub fn package_spec(argv: &[String]) -> Result<Option<String>, String> {
    let Some(program) = argv.first() else {
        return Ok(None);
    };
    let base = program.rsplit('/').next().unwrap_or(program);
    let Some((_, spec_flags)) = LAUNCHERS.iter().find(|(l, _)| *l == base) else {
        return Ok(None);
    };
    let mut words = argv[1..].iter().peekable();
    let mut spec = None;
    while let Some(w) = words.next() {
        if spec_flags.contains(&w.as_str()) {
            spec = words.next().cloned();
            break;
        }
        if let Some(v) = spec_flags.iter().find_map(|f| w.strip_prefix(&format!("{f}="))) {
            spec = Some(v.to_string());
            break;
        }
        if base == "pipx" && w == "run" {
            continue;
        }
        if !w.starts_with('-') {
            spec = Some(w.clone());
            break;
        }
    }
    let Some(spec) = spec else {
        return Err(format!("`{base}` is given no package to run"));
    };
    match exact_version(&spec) {
        true => Ok(Some(spec)),
        false => Err(format!(
            "`{spec}` is not pinned to an exact version (write e.g. `name@1.2.3`; `@latest`, ranges and bare names change under review)"
        )),
    }
}

/// `name@1.2.3`, `@scope/name@1.2.3`, `name==1.2.3`: an exact version, no range, no tag.
fn exact_version(spec: &str) -> bool {
    let version = match spec.split_once("==") {
        Some((_, v)) => v,
        None => {
            // The version follows the last `@` that is not the scope's leading one.
            match spec[1..].rfind('@') {
                Some(i) => &spec[i + 2..],
                None => return false,
            }
        }
    };
    let core = version.split(['-', '+']).next().unwrap_or("");
    let parts: Vec<&str> = core.split('.').collect();
    parts.len() >= 2
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// Meaning checks of the `mcp:` section (its types already checked); `key_env` is the
/// provider's key variable(s), which no server may be given.
pub fn validate(file: &Path, src: &str, servers: &McpServers, key_env: &[&str], d: &mut Vec<Diagnostic>) {
    for (name, s) in servers {
        let line = |k: &str| yamlpos::line_of(src, &["mcp", name, k]);
        let field = |k: &str| format!("mcp.{name}.{k}");
        if !valid_server_name(name) {
            d.push(
                Diagnostic::new(
                    file,
                    yamlpos::line_of(src, &["mcp", name]),
                    format!("mcp.{name}"),
                    format!("`{name}` is not a server name"),
                )
                .with_hint(
                    "lower-case letters, digits, `-` and single `_` (it is the middle of `mcp__<server>__<tool>`)",
                ),
            );
        }
        if s.url.is_some() {
            d.push(
                Diagnostic::new(
                    file,
                    line("url"),
                    field("url"),
                    "streamable-HTTP servers are not supported yet",
                )
                .with_hint("declare a stdio `command:`; it runs inside the tool sandbox"),
            );
        } else if s.command.is_empty() || s.command[0].is_empty() {
            d.push(Diagnostic::new(
                file,
                line("command"),
                field("command"),
                "a server needs a `command:` (program and arguments)",
            ));
        } else if let Err(why) = package_spec(&s.command) {
            d.push(Diagnostic::new(file, line("command"), field("command"), why));
        }
        for v in &s.env_allow {
            if key_env.contains(&v.as_str()) {
                d.push(Diagnostic::new(
                    file,
                    yamlpos::line_of_item(src, &["mcp", name, "env_allow"], v),
                    field("env_allow"),
                    format!("`{v}` holds the provider's key; a tool server never gets it"),
                ));
            }
        }
        if s.network.contains(&0) {
            d.push(Diagnostic::new(
                file,
                line("network"),
                field("network"),
                "port 0 is not a port",
            ));
        }
        for r in &s.read {
            if !(r.starts_with('/') || r.starts_with("~/")) || r.split('/').any(|c| c == "..") {
                d.push(Diagnostic::new(
                    file,
                    yamlpos::line_of_item(src, &["mcp", name, "read"], r),
                    field("read"),
                    format!("`{r}` must be an absolute path or start with `~/`, without `..`"),
                ));
            }
        }
        if s.start_timeout_s == 0 || s.start_timeout_s > 300 {
            d.push(Diagnostic::new(
                file,
                line("start_timeout_s"),
                field("start_timeout_s"),
                "out of range: 1 to 300 seconds",
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn launchers_need_an_exact_version() {
        assert_eq!(
            package_spec(&argv("npx -y @modelcontextprotocol/server-filesystem@2025.8.21 /")).unwrap(),
            Some("@modelcontextprotocol/server-filesystem@2025.8.21".into())
        );
        assert_eq!(
            package_spec(&argv("uvx mcp-server-git==0.6.2")).unwrap(),
            Some("mcp-server-git==0.6.2".into())
        );
        assert_eq!(package_spec(&argv("/usr/bin/my-server --flag")).unwrap(), None);
        for bad in [
            "npx -y some-server@latest",
            "npx -y some-server",
            "npx @scope/server",
            "npx -y some-server@^1.2.0",
            "uvx mcp-server-git",
            "npx -y",
        ] {
            assert!(package_spec(&argv(bad)).is_err(), "{bad}");
        }
        assert_eq!(
            package_spec(&argv("npx --package=tool@1.0.0 tool")).unwrap(),
            Some("tool@1.0.0".into())
        );
    }

    #[test]
    fn server_names_fit_rule_names() {
        assert!(valid_server_name("tickets") && valid_server_name("my-db_2"));
        for bad in ["", "a__b", "Tickets", "a b", "a/b"] {
            assert!(!valid_server_name(bad), "{bad}");
        }
    }
}
