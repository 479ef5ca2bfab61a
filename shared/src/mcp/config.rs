//! The `mcp:` section of `settings/runtime.yaml`: the MCP tool servers a builder
//! declares (docs/design.md). Each entry says what starts (a stdio argv), which
//! variables of the runtime's environment it may see, which TCP ports it may reach,
//! which extra directories it may read, and whether a fire may go on without it; or,
//! for a server that runs elsewhere, its streamable-HTTP `url:` (https, or http to
//! this machine's loopback only), and nothing about a process.
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
    /// A streamable-HTTP endpoint instead of a command: the runtime connects to it
    /// (the server runs elsewhere, outside any sandbox of ours; its tools still go
    /// through the pins and the gate).
    #[serde(default)]
    pub url: Option<String>,
    /// For a `url:` server: the runtime's environment variable whose value is sent as
    /// `Authorization: Bearer` (redacted from every record like the provider's key).
    #[serde(default)]
    pub token_env: Option<String>,
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
    /// What the entry starts (its argv) or connects to (its URL), as one line.
    pub fn what_starts(&self) -> String {
        match (&self.url, &self.token_env) {
            (Some(u), Some(t)) => format!("{u} (bearer ${t})"),
            (Some(u), None) => u.clone(),
            (None, _) => self.command.join(" "),
        }
    }

    /// The endpoint of a `url:` server, when its URL is one ([`http_endpoint`]).
    pub fn endpoint(&self) -> Option<url::Url> {
        self.url.as_deref().and_then(|u| http_endpoint(u).ok())
    }

    /// The variables whose values the server is handed and that count as secrets:
    /// its `token_env` and its `env_allow` but the system's own (`HOME`, `LANG`:
    /// redacting those would blank every path and word they hold).
    pub fn secret_vars(&self) -> impl Iterator<Item = &str> {
        self.token_env.as_deref().into_iter().chain(
            self.env_allow
                .iter()
                .map(String::as_str)
                .filter(|name| !crate::env::is_well_known_setting(name)),
        )
    }

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

/// A streamable-HTTP server's URL, checked: `https://`, or `http://` to the
/// loopback (`127.0.0.1`, `[::1]`, `localhost`), where nothing on the way can read
/// or change the tool definitions; no credentials in it (they would be committed).
pub fn http_endpoint(raw: &str) -> Result<url::Url, String> {
    let url = url::Url::parse(raw).map_err(|e| format!("`{raw}` is not a URL: {e}"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err("a URL with credentials in it would be committed: leave them out".into());
    }
    let loopback = matches!(
        url.host(),
        Some(url::Host::Domain("localhost"))
            | Some(url::Host::Ipv4(std::net::Ipv4Addr::LOCALHOST))
            | Some(url::Host::Ipv6(std::net::Ipv6Addr::LOCALHOST))
    );
    match url.scheme() {
        "https" => Ok(url),
        "http" if loopback => Ok(url),
        "http" => Err(format!(
            "`{raw}`: plain http only to this machine's loopback; use https for a server elsewhere"
        )),
        other => Err(format!("`{raw}`: `{other}:` is not http or https")),
    }
}

/// Whether `name` can be a server's name: the middle of `mcp__<server>__<tool>`, so
/// no `__` and no `_` at either end (server `a_` with tool `b` and server `a` with
/// tool `_b` would both be `mcp__a___b`).
pub fn valid_server_name(name: &str) -> bool {
    !name.is_empty()
        && !name.contains("__")
        && !name.starts_with('_')
        && !name.ends_with('_')
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
                    "lower-case letters, digits, `-` and single `_` inside (it is the middle of `mcp__<server>__<tool>`)",
                ),
            );
        }
        if s.start_timeout_s == 0 || s.start_timeout_s > 300 {
            d.push(Diagnostic::new(
                file,
                line("start_timeout_s"),
                field("start_timeout_s"),
                "out of range: 1 to 300 seconds",
            ));
        }
        if let Some(v) = s.token_env.as_deref().filter(|v| !crate::env::is_variable_name(v)) {
            d.push(
                Diagnostic::new(
                    file,
                    line("token_env"),
                    field("token_env"),
                    format!("`{v}` is not an environment variable name"),
                )
                .with_hint(
                    "name the variable that holds the token (MCP_TOKEN); never put the token itself in the repo",
                ),
            );
        }
        if let Some(v) = s.token_env.as_deref().filter(|v| key_env.contains(v)) {
            d.push(Diagnostic::new(
                file,
                line("token_env"),
                field("token_env"),
                format!("`{v}` holds the provider's key; a tool server never gets it"),
            ));
        }
        match &s.url {
            Some(url) => validate_http(file, src, name, s, url, d),
            None => validate_stdio(file, src, name, s, key_env, d),
        }
    }
}

/// The checks of a stdio entry: a command (a launcher's package pinned to an exact
/// version), no key variable in its environment, real ports, plain read roots.
fn validate_stdio(file: &Path, src: &str, name: &str, s: &McpServer, key_env: &[&str], d: &mut Vec<Diagnostic>) {
    let line = |k: &str| yamlpos::line_of(src, &["mcp", name, k]);
    let field = |k: &str| format!("mcp.{name}.{k}");
    if s.token_env.is_some() {
        d.push(Diagnostic::new(
            file,
            line("token_env"),
            field("token_env"),
            "`token_env` is sent to a `url:` server; a stdio server gets variables through `env_allow`",
        ));
    }
    if s.command.is_empty() || s.command[0].is_empty() {
        d.push(Diagnostic::new(
            file,
            line("command"),
            field("command"),
            "a server needs a `command:` (program and arguments) or a `url:`",
        ));
    } else if let Err(why) = package_spec(&s.command) {
        d.push(Diagnostic::new(file, line("command"), field("command"), why));
    }
    for v in s.env_allow.iter().filter(|v| !crate::env::is_variable_name(v)) {
        d.push(Diagnostic::new(
            file,
            yamlpos::line_of_item(src, &["mcp", name, "env_allow"], v),
            field("env_allow"),
            format!("`{v}` is not an environment variable name"),
        ));
    }
    for v in s.env_allow.iter().filter(|v| key_env.contains(&v.as_str())) {
        d.push(Diagnostic::new(
            file,
            yamlpos::line_of_item(src, &["mcp", name, "env_allow"], v),
            field("env_allow"),
            format!("`{v}` holds the provider's key; a tool server never gets it"),
        ));
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
}

/// The checks of a `url:` entry: a good endpoint, and none of the keys that describe
/// a process the runtime starts (it starts none for this server).
fn validate_http(file: &Path, src: &str, name: &str, s: &McpServer, url: &str, d: &mut Vec<Diagnostic>) {
    let line = |k: &str| yamlpos::line_of(src, &["mcp", name, k]);
    if let Err(why) = http_endpoint(url) {
        d.push(Diagnostic::new(file, line("url"), format!("mcp.{name}.url"), why));
    }
    let process_keys = [
        ("command", !s.command.is_empty()),
        ("env_allow", !s.env_allow.is_empty()),
        ("network", !s.network.is_empty()),
        ("read", !s.read.is_empty()),
    ];
    for (key, _) in process_keys.iter().filter(|(_, set)| *set) {
        d.push(
            Diagnostic::new(
                file,
                line(key),
                format!("mcp.{name}.{key}"),
                format!("`{key}` describes a process the runtime starts; a `url:` server runs elsewhere"),
            )
            .with_hint(
                "keep `url:` (and `token_env`, `required`, `start_timeout_s`), or declare a stdio `command:` instead",
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The diagnostics of the `mcp:` section of `src`, as `field: message`.
    fn diagnose(src: &str) -> Vec<String> {
        let doc: serde_yaml::Value = serde_yaml::from_str(src).unwrap();
        let servers: McpServers = serde_yaml::from_value(doc["mcp"].clone()).unwrap();
        let mut d = Vec::new();
        validate(
            Path::new("settings/runtime.yaml"),
            src,
            &servers,
            &["OPENAI_API_KEY"],
            &mut d,
        );
        d.iter()
            .map(|d| format!("{}:{} {}", d.line, d.field, d.message))
            .collect()
    }

    #[test]
    fn variable_names_are_names_and_never_the_providers_key() {
        let src = "mcp:\n  remote:\n    url: https://mcp.example.com/mcp\n    token_env: \"ghp_abc def\"\n  local:\n    command: [srv]\n    env_allow: [HOME, \"A=B\", OPENAI_API_KEY]\n";
        let found = diagnose(src);
        let has = |at: &str, says: &str| found.iter().any(|d| d.starts_with(at) && d.contains(says));
        assert!(
            has("4:mcp.remote.token_env", "not an environment variable name"),
            "{found:?}"
        );
        assert!(has("7:mcp.local.env_allow", "`A=B` is not"), "{found:?}");
        assert!(
            has("7:mcp.local.env_allow", "`OPENAI_API_KEY` holds the provider's key"),
            "{found:?}"
        );
        assert!(!has("", "`HOME`"), "{found:?}");
        let fine = diagnose("mcp:\n  remote:\n    url: https://mcp.example.com/mcp\n    token_env: MCP_TOKEN\n");
        assert!(fine.is_empty(), "{fine:?}");
    }

    #[test]
    fn http_endpoints_are_https_or_loopback_http_without_credentials() {
        for good in [
            "https://mcp.example.com/mcp",
            "http://127.0.0.1:8931/mcp",
            "http://localhost:3000/",
            "http://[::1]:9000/mcp",
        ] {
            assert!(http_endpoint(good).is_ok(), "{good}");
        }
        for bad in [
            "http://mcp.example.com/mcp",
            "http://10.0.0.5:80/",
            "https://user:pw@mcp.example.com/",
            "ftp://127.0.0.1/",
            "not a url",
        ] {
            assert!(http_endpoint(bad).is_err(), "{bad}");
        }
    }

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
        for bad in ["", "a__b", "Tickets", "a b", "a/b", "a_", "_b"] {
            assert!(!valid_server_name(bad), "{bad}");
        }
    }
}
