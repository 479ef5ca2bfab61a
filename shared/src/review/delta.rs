//! The capability delta of a proposal (docs/design.md): every tool call recorded in the run history, decided again under the
//! base's settings and under the proposal's, keeping only the calls whose decision
//! changes, grouped by the rules that decided them before and after. A reviewer
//! approves "this would have allowed 3 denied `git push` calls", not a text diff of
//! YAML.
//!
//! The calls come from the runtime's state database (`.runtime/state.db`, the only
//! history that keeps a call's arguments; committed receipts name the tool and its
//! decision only), so the delta covers the fires of the machine the database comes
//! from. The settings of each side are read from the commit's own `settings/` tree.

use crate::policy::{Call, Decision, Policy};
use crate::settings::RuntimeSettings;
use crate::store::{Store, StoreError};
use crate::tools::{parse_args, Tool, ToolArgs};
use git2::{Oid, Repository};
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::Path;

/// One call from the history.
#[derive(Debug, Clone)]
pub struct RecordedCall {
    pub run_id: String,
    pub call_id: String,
    pub tool: String,
    /// The call's arguments as recorded (JSON text).
    pub arguments: String,
}

/// One call in a delta group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeltaCall {
    pub run_id: String,
    pub call_id: String,
    pub tool: String,
    pub command_or_path: String,
}

/// Calls whose decision moves the same way under the same pair of rules.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeltaGroup {
    pub rule_before: Option<String>,
    pub rule_after: Option<String>,
    pub from: Decision,
    pub to: Decision,
    pub count: usize,
    pub calls: Vec<DeltaCall>,
}

/// One side of the comparison: a revision's policy, enabled tools and declared MCP
/// servers.
pub struct Side {
    policy: Policy,
    tools: Vec<Tool>,
    mcp_servers: Vec<String>,
}

/// A recorded call as the gate decides it.
enum Gated {
    /// A built-in tool with its arguments parsed.
    Builtin(Tool, ToolArgs),
    /// `mcp__<server>__<tool>` with its arguments made canonical (as the gate matches
    /// rule specifiers against them).
    Mcp {
        server: String,
        tool: String,
        canonical: String,
    },
}

impl Gated {
    /// The call as the gate saw it; `None` for a call refused before any policy (a
    /// name no tool has, arguments that never parsed).
    fn of(c: &RecordedCall) -> Option<Gated> {
        if let Some(tool) = Tool::from_name(&c.tool) {
            // The state database keeps the validated arguments (tagged with their
            // tool); a model's raw arguments parse the way the gate parses them.
            let args = serde_json::from_str::<ToolArgs>(&c.arguments)
                .or_else(|_| parse_args(&c.tool, &c.arguments).map_err(|_| ()))
                .ok()?;
            return Some(Gated::Builtin(tool, args));
        }
        let (server, tool) = crate::mcp::split_name(&c.tool)?;
        let args = serde_json::from_str::<serde_json::Value>(&c.arguments).ok()?;
        let obj = args.as_object()?;
        // What the gate records for arguments that never parsed: exactly one string
        // under `_invalid`. A model's own `_invalid` key among others is a real call.
        if obj.len() == 1 && obj.get("_invalid").is_some_and(serde_json::Value::is_string) {
            return None;
        }
        Some(Gated::Mcp {
            server: server.to_string(),
            tool: tool.to_string(),
            canonical: crate::mcp::lock::canonical_args(&args),
        })
    }

    /// What the call is about, for a reviewer: the command, else the path, else an MCP
    /// call's arguments (cut).
    fn subject(&self) -> String {
        match self {
            Gated::Builtin(_, args) => subject(args),
            Gated::Mcp { canonical, .. } => canonical.chars().take(200).collect(),
        }
    }
}

impl Side {
    /// The side of `settings`, deciding paths relative to `root`.
    pub fn new(root: &Path, settings: &RuntimeSettings) -> Result<Side, crate::policy::PolicyError> {
        Ok(Side {
            policy: Policy::new(root, &settings.permissions, &settings.builder_paths)?,
            tools: settings.tools.clone(),
            mcp_servers: settings.mcp.keys().cloned().collect(),
        })
    }

    /// The decision and the rule that made it (a tool the settings do not enable is
    /// denied by the settings' `tools` list; an MCP tool of a server the settings do
    /// not declare is never offered, so denied too).
    fn decide(&self, call: &Gated) -> (Decision, Option<String>) {
        let v = match call {
            Gated::Builtin(tool, _) if !self.tools.contains(tool) => {
                return (Decision::Deny, Some(format!("tools: {tool} not enabled")))
            }
            Gated::Builtin(_, args) => self.policy.decide(Call::from(args)),
            Gated::Mcp { server, .. } if !self.mcp_servers.contains(server) => {
                return (Decision::Deny, Some(format!("mcp: server `{server}` not declared")))
            }
            Gated::Mcp {
                server,
                tool,
                canonical,
            } => self.policy.decide_mcp(server, tool, canonical),
        };
        (v.decision, v.rule)
    }
}

/// Why the history or a revision's settings could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DeltaError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    #[error("settings of {rev}: {diags}")]
    Settings {
        rev: String,
        diags: crate::diag::Diagnostics,
    },
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("permissions of {rev}: {source}")]
    Policy {
        rev: String,
        source: crate::policy::PolicyError,
    },
    /// The walk down the protected branch to a reviewed commit refused (lines that
    /// disagree, too many merges that owe review, a shallow clone's missing parent).
    #[error("{0}")]
    NoTrustedBase(String),
    /// The protected branch went back from the reviewed commit this clone judged by,
    /// which it no longer has ([`super::judged`]).
    #[error(transparent)]
    WentBack(Box<super::judged::WentBack>),
}

/// The calls of the history at `db` (the runtime's state database), those of runs
/// started at or after `since` (RFC 3339) when given, in run and call order.
pub fn recorded_calls(db: &Path, since: Option<&str>) -> Result<Vec<RecordedCall>, StoreError> {
    if !db.exists() {
        return Ok(vec![]);
    }
    let store = Store::open_read_only(db, crate::state::RUNTIME_SCHEMA)?;
    store.query_all(
        "SELECT c.run_id, c.call_id, c.name, c.arguments FROM tool_calls c JOIN runs r ON r.run_id = c.run_id
         WHERE ?1 IS NULL OR r.started_at >= ?1 ORDER BY r.started_at, c.run_id, c.step, c.call_id",
        [since],
        |r| {
            Ok(RecordedCall {
                run_id: r.get(0)?,
                call_id: r.get(1)?,
                tool: r.get(2)?,
                arguments: r.get(3)?,
            })
        },
    )
}

/// The settings in commit `commit`'s own `settings/` directory, loaded the way a fire
/// loads them (every source, validated).
pub fn settings_of_commit(repo: &Repository, commit: Oid, rev: &str) -> Result<RuntimeSettings, DeltaError> {
    let tree = repo.find_commit(commit)?.tree()?;
    let dir = tempfile::tempdir().map_err(|e| DeltaError::Io {
        path: std::env::temp_dir(),
        source: e,
    })?;
    let settings_dir = dir.path().join("settings");
    std::fs::create_dir_all(&settings_dir).map_err(|e| DeltaError::Io {
        path: settings_dir.clone(),
        source: e,
    })?;
    if let Some(entry) = tree.get_name("settings") {
        let sub = repo.find_tree(entry.id())?;
        for e in sub.iter().filter(|e| e.kind() == Some(git2::ObjectType::Blob)) {
            let (Ok(name), Ok(blob)) = (e.name(), repo.find_blob(e.id())) else {
                continue;
            };
            let path = settings_dir.join(name);
            std::fs::write(&path, blob.content()).map_err(|source| DeltaError::Io { path, source })?;
        }
    }
    crate::settings::load(dir.path())
        .map(|s| s.runtime)
        .map_err(|diags| DeltaError::Settings {
            rev: rev.to_string(),
            diags,
        })
}

/// What the call is about, for a reviewer: the command, else the path.
fn subject(args: &ToolArgs) -> String {
    match args {
        ToolArgs::RunCommand { command, .. } => command.clone(),
        ToolArgs::ReadFile { path, .. }
        | ToolArgs::ListDir { path }
        | ToolArgs::Grep { path, .. }
        | ToolArgs::WriteFile { path, .. }
        | ToolArgs::EditFile { path, .. } => path.clone(),
    }
}

/// Every call of `calls` whose decision differs between `before` and `after`,
/// grouped by (rule before, rule after, from, to); groups with the most calls first.
/// Calls whose arguments never parsed (refused before any policy) are left out; MCP
/// calls are decided by their server's and tool's rules over their arguments.
pub fn capability_delta(calls: &[RecordedCall], before: &Side, after: &Side) -> Vec<DeltaGroup> {
    type Key = (Option<String>, Option<String>, Decision, Decision);
    let mut groups: BTreeMap<String, (Key, Vec<DeltaCall>)> = BTreeMap::new();
    for c in calls {
        let Some(gated) = Gated::of(c) else {
            continue;
        };
        let (from, rule_before) = before.decide(&gated);
        let (to, rule_after) = after.decide(&gated);
        if from == to {
            continue;
        }
        let sort_key = format!("{rule_before:?}\u{0}{rule_after:?}\u{0}{from:?}\u{0}{to:?}");
        groups
            .entry(sort_key)
            .or_insert_with(|| ((rule_before, rule_after, from, to), Vec::new()))
            .1
            .push(DeltaCall {
                run_id: c.run_id.clone(),
                call_id: c.call_id.clone(),
                tool: c.tool.clone(),
                command_or_path: gated.subject(),
            });
    }
    let mut out: Vec<DeltaGroup> = groups
        .into_values()
        .map(|((rule_before, rule_after, from, to), calls)| DeltaGroup {
            rule_before,
            rule_after,
            from,
            to,
            count: calls.len(),
            calls,
        })
        .collect();
    out.sort_by_key(|g| std::cmp::Reverse(g.count));
    out
}

/// One line per group: "would have allowed 3 call(s) denied before: `Bash(curl*)`
/// before, `Bash(curl*)` after: curl -s https://example.com/feed".
pub fn describe(g: &DeltaGroup) -> String {
    describe_with(g, |r| format!("`{r}`"), |c| c.command_or_path.clone())
}

/// [`describe`] for markdown, for a pull-request comment: the rules as code spans,
/// and the calls by their runs, not by their commands. The history is this machine's
/// (a copy of the cron box's, in CI), and the proposal chooses the rules, and so
/// which of its recorded commands change decision: quoted, they would carry the
/// box's commands (hosts, paths, arguments) into a comment anyone reading the pull
/// request sees (helper-103). `builder review` in text shows them where they are.
pub fn describe_markdown(g: &DeltaGroup) -> String {
    describe_with(g, crate::text::markdown_code, |c| {
        crate::text::markdown_code(&format!("{} {}", c.run_id, c.call_id))
    })
}

/// The one wording of a delta group, with its rules and example calls shown by
/// `rule_span` and `example`.
fn describe_with(g: &DeltaGroup, rule_span: impl Fn(&str) -> String, example: impl Fn(&DeltaCall) -> String) -> String {
    let rule = |r: &Option<String>| match r {
        Some(r) => rule_span(r),
        None => "no rule (the default)".to_string(),
    };
    let shown: Vec<String> = g.calls.iter().map(example).collect();
    let mut examples: Vec<&str> = shown.iter().map(String::as_str).collect();
    examples.dedup();
    let more = if examples.len() > 3 {
        format!(", ... ({} distinct)", examples.len())
    } else {
        String::new()
    };
    examples.truncate(3);
    format!(
        "would have {} {} call(s) {} before: {} before, {} after: {}{more}",
        verb(g.to),
        g.count,
        verb(g.from),
        rule(&g.rule_before),
        rule(&g.rule_after),
        examples.join("; ")
    )
}

fn verb(d: Decision) -> &'static str {
    match d {
        Decision::Allow => "allowed",
        Decision::Ask => "asked about",
        Decision::Deny => "denied",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Permissions;

    fn side(root: &Path, allow: &[&str], deny: &[&str]) -> Side {
        let mut s: RuntimeSettings =
            serde_yaml::from_str("version: 1\nprovider: {kind: replay, replay: x.json}\n").unwrap();
        s.permissions = Permissions {
            allow: allow.iter().map(|r| r.to_string()).collect(),
            deny: deny.iter().map(|r| r.to_string()).collect(),
            write: vec!["reports/**".into()],
            ..s.permissions
        };
        Side::new(root, &s).unwrap()
    }

    /// A call as the state database records it: the validated arguments, tagged.
    fn call(i: usize, tool: &str, args: serde_json::Value) -> RecordedCall {
        let mut args = args;
        if let Some(o) = args.as_object_mut() {
            o.insert("tool".into(), tool.into());
        }
        RecordedCall {
            run_id: format!("run-{}", i / 10),
            call_id: format!("c{i}"),
            tool: tool.into(),
            arguments: args.to_string(),
        }
    }

    #[test]
    fn allowing_a_denied_command_lists_exactly_those_calls() {
        let dir = tempfile::tempdir().unwrap();
        let before = side(dir.path(), &["Bash(ls*)", "Read(**)"], &["Bash(curl*)"]);
        let after = side(
            dir.path(),
            &["Bash(ls*)", "Read(**)", "Bash(curl -s https://example.com/*)"],
            &[],
        );
        let mut calls = Vec::new();
        for i in 0..30 {
            calls.push(match i % 3 {
                0 => call(
                    i,
                    "run_command",
                    serde_json::json!({"command": "curl -s https://example.com/feed"}),
                ),
                1 => call(i, "run_command", serde_json::json!({"command": "ls cards"})),
                _ => call(i, "read_file", serde_json::json!({"path": "README.md"})),
            });
        }
        calls.push(call(99, "run_command", serde_json::json!("not an object")));
        let delta = capability_delta(&calls, &before, &after);
        assert_eq!(delta.len(), 1, "{delta:?}");
        let g = &delta[0];
        assert_eq!((g.from, g.to, g.count), (Decision::Deny, Decision::Allow, 10));
        assert_eq!(g.rule_before.as_deref(), Some("Bash(curl*)"));
        assert_eq!(g.rule_after.as_deref(), Some("Bash(curl -s https://example.com/*)"));
        let ids: Vec<&str> = g.calls.iter().map(|c| c.call_id.as_str()).collect();
        let want: Vec<String> = (0..30).filter(|i| i % 3 == 0).map(|i| format!("c{i}")).collect();
        assert_eq!(ids, want);
        assert!(
            describe(g).starts_with("would have allowed 10 call(s) denied before"),
            "{}",
            describe(g)
        );
        assert!(capability_delta(&calls, &before, &before).is_empty());
    }

    #[test]
    fn mcp_calls_are_decided_again_by_their_rules_and_their_servers_declaration() {
        let dir = tempfile::tempdir().unwrap();
        let mut before = side(
            dir.path(),
            &["mcp__files"],
            &["mcp__files__write_file(*\"path\":\"settings/*)"],
        );
        before.mcp_servers = vec!["files".into()];
        let mut after = side(dir.path(), &["mcp__files"], &[]);
        after.mcp_servers = vec!["files".into()];
        let mcp = |i: usize, tool: &str, args: serde_json::Value| RecordedCall {
            run_id: "run-1".into(),
            call_id: format!("c{i}"),
            tool: tool.into(),
            arguments: args.to_string(),
        };
        let calls = vec![
            mcp(
                0,
                "mcp__files__write_file",
                serde_json::json!({"path": "settings/x.yaml", "content": "x"}),
            ),
            mcp(
                1,
                "mcp__files__write_file",
                serde_json::json!({"path": "reports/a.md", "content": "x"}),
            ),
            mcp(2, "mcp__files__echo", serde_json::json!({"text": "hi"})),
            mcp(3, "mcp__files__echo", serde_json::json!({"_invalid": "{not json"})),
            // A model that names a key `_invalid` does not hide its call.
            mcp(
                4,
                "mcp__files__write_file",
                serde_json::json!({"path": "settings/y.yaml", "_invalid": "x"}),
            ),
        ];
        let delta = capability_delta(&calls, &before, &after);
        assert_eq!(delta.len(), 1, "{delta:?}");
        let g = &delta[0];
        assert_eq!((g.from, g.to, g.count), (Decision::Deny, Decision::Allow, 2));
        assert_eq!(
            g.rule_before.as_deref(),
            Some("mcp__files__write_file(*\"path\":\"settings/*)")
        );
        assert_eq!(g.rule_after.as_deref(), Some("mcp__files"));
        assert_eq!(g.calls[0].call_id, "c0");
        assert!(g.calls[0].command_or_path.contains("settings/x.yaml"), "{g:?}");
        // A proposal that drops the server: every call of it is denied from then on.
        after.mcp_servers.clear();
        let dropped = capability_delta(&calls[1..3], &before, &after);
        assert_eq!(dropped.len(), 1, "{dropped:?}");
        assert_eq!(
            (dropped[0].from, dropped[0].to, dropped[0].count),
            (Decision::Allow, Decision::Deny, 2)
        );
        assert_eq!(
            dropped[0].rule_after.as_deref(),
            Some("mcp: server `files` not declared")
        );
    }

    #[test]
    fn a_tool_the_proposal_disables_is_a_denial() {
        let dir = tempfile::tempdir().unwrap();
        let before = side(dir.path(), &["Read(**)"], &[]);
        let mut after = side(dir.path(), &["Read(**)"], &[]);
        after.tools.retain(|t| *t != Tool::ReadFile);
        let calls = vec![call(0, "read_file", serde_json::json!({"path": "a.md"}))];
        let delta = capability_delta(&calls, &before, &after);
        assert_eq!(delta.len(), 1);
        assert_eq!(delta[0].to, Decision::Deny);
        assert_eq!(delta[0].rule_after.as_deref(), Some("tools: read_file not enabled"));
    }
}
