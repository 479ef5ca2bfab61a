//! MCP tool servers (Model Context Protocol) behind the same gate, sandbox and review
//! as the built-in tools. Builders declare servers in settings ([`config`]) and pin
//! what review approved in `settings/mcp.lock` ([`lock`]). At a fire's start each
//! stdio server starts as the child of a tool worker of its own, inside the worker's
//! namespaces, seccomp filter, Landlock domain and uid drop, with only its allowed
//! environment; the runtime speaks the protocol to it through the worker's stdin and
//! stdout with the official SDK (`rmcp`, client side), lists its tools once and offers
//! the model only those whose definition matches its pin (`agent::mcp_client`; the
//! worker's half is [`launch`]; `builder mcp pin` is `agent::mcp_pin`). Calls are named
//! `mcp__<server>__<tool>` and decided by the policy like any other ([`rule_matches`]).

pub mod argv;
pub mod config;
pub mod digest;
pub mod launch;
pub mod lock;

pub use config::{McpServer, McpServers};
pub use launch::{run_server, sandbox_note, McpLaunch, SANDBOX_NOTE};

use crate::rules::{Rule, Spec};

/// The prefix of every MCP tool name.
pub const PREFIX: &str = "mcp__";

/// The model-facing name of `tool` on `server`.
pub fn tool_name(server: &str, tool: &str) -> String {
    format!("{PREFIX}{server}__{tool}")
}

/// `mcp__<server>__<tool>` split into its server and tool; `None` for other names.
pub fn split_name(name: &str) -> Option<(&str, &str)> {
    let rest = name.strip_prefix(PREFIX)?;
    let (server, tool) = rest.split_once("__")?;
    (!server.is_empty() && !tool.is_empty()).then_some((server, tool))
}

/// Whether the rule `r` covers a call of `tool` on `server` with `args` (the call's
/// arguments as compact JSON, keys in order): `mcp__<server>` and `mcp__<server>__*`
/// name the whole server, `mcp__<server>__<tool>` one tool; a specifier,
/// `mcp__s__t(pattern)`, must match the arguments' JSON, `*` matching any run.
pub fn rule_matches(r: &Rule, server: &str, tool: &str, args: &str) -> bool {
    let Some(rest) = r.tool.strip_prefix(PREFIX) else {
        return false;
    };
    let named = match rest.split_once("__") {
        None => rest == server,
        Some((s, "*")) => s == server,
        Some((s, t)) => s == server && t == tool,
    };
    named
        && match &r.spec {
            Spec::Any => true,
            Spec::Literal(pattern) => wildcard(pattern, args),
            Spec::Command(_) | Spec::Path(_) => false,
        }
}

/// `*` matches any run of characters, everything else itself.
fn wildcard(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let Some((first, rest)) = parts.split_first() else {
        return text.is_empty();
    };
    let Some(mut left) = text.strip_prefix(first) else {
        return false;
    };
    let Some((last, middle)) = rest.split_last() else {
        return left.is_empty();
    };
    for m in middle {
        match left.find(m) {
            Some(i) => left = &left[i + m.len()..],
            None => return false,
        }
    }
    left.len() >= last.len() && left.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_name_servers_tools_and_arguments() {
        let args = r#"{"path":"reports/a.md"}"#;
        let hit = |rule: &str, tool: &str| rule_matches(&Rule::parse(rule).unwrap(), "fs", tool, args);
        assert!(hit("mcp__fs", "write_file"));
        assert!(hit("mcp__fs__*", "write_file"));
        assert!(hit("mcp__fs__write_file", "write_file"));
        assert!(!hit("mcp__fs__read_file", "write_file"));
        assert!(!hit("mcp__fsx", "write_file"));
        assert!(!hit("Bash", "write_file"));
        assert!(hit(r#"mcp__fs__write_file(*"path":"reports/*)"#, "write_file"));
        assert!(!hit(r#"mcp__fs__write_file(*"path":"settings/*)"#, "write_file"));
        assert_eq!(split_name("mcp__fs__write_file"), Some(("fs", "write_file")));
        assert_eq!(split_name("mcp__fs"), None);
        assert_eq!(split_name("read_file"), None);
    }
}
