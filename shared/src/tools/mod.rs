//! The runtime's tools (docs/design.md): `read_file`, `list_dir`, `grep`,
//! `write_file`, `edit_file`, `run_command`. Each has a JSON schema, a risk level, a
//! timeout and an output limit. Arguments are parsed strictly from the model's raw
//! JSON; anything malformed becomes an `INVALID_ARGUMENTS` observation, never a crash
//! and never a stored "valid" call. Execution ([`exec`]) runs inside the sandboxed
//! tool worker process ([`crate::worker`]).

pub mod exec;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Risk {
    Read,
    Write,
    Network,
    Destructive,
}

/// How a tool call failed; goes back to the model as part of the observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash, strum::IntoStaticStr)]
#[strum(serialize_all = "SCREAMING_SNAKE_CASE")]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ErrorClass {
    InvalidArguments,
    NotFound,
    PermissionDenied,
    Timeout,
    OutputTooLarge,
    SideEffectUncertain,
    UnknownTool,
    Failed,
}

impl ErrorClass {
    pub fn as_str(&self) -> &'static str {
        (*self).into()
    }
}

/// Validated arguments of one tool call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "tool", rename_all = "snake_case")]
pub enum ToolArgs {
    ReadFile {
        path: String,
        offset: Option<usize>,
        limit: Option<usize>,
    },
    ListDir {
        path: String,
    },
    Grep {
        pattern: String,
        path: String,
    },
    WriteFile {
        path: String,
        content: String,
    },
    EditFile {
        path: String,
        old: String,
        new: String,
    },
    RunCommand {
        command: String,
        timeout_s: Option<u64>,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReadArgs {
    path: String,
    #[serde(default)]
    offset: Option<usize>,
    #[serde(default)]
    limit: Option<usize>,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PathArgs {
    #[serde(default = "dot")]
    path: String,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrepArgs {
    pattern: String,
    #[serde(default = "dot")]
    path: String,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteArgs {
    path: String,
    content: String,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EditArgs {
    path: String,
    old: String,
    new: String,
}
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CommandArgs {
    command: String,
    #[serde(default)]
    timeout_s: Option<u64>,
}
fn dot() -> String {
    ".".into()
}

/// A tool the runtime implements. Its snake_case name is what the model calls, what
/// settings and front matter list, and what a tool request carries; every other
/// spelling of a tool's identity goes through [`Tool::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tool {
    ReadFile,
    ListDir,
    Grep,
    WriteFile,
    EditFile,
    RunCommand,
}

impl Tool {
    /// Every tool, in the order settings list them by default.
    pub const ALL: [Tool; 6] = [
        Tool::ReadFile,
        Tool::ListDir,
        Tool::Grep,
        Tool::WriteFile,
        Tool::EditFile,
        Tool::RunCommand,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Tool::ReadFile => "read_file",
            Tool::ListDir => "list_dir",
            Tool::Grep => "grep",
            Tool::WriteFile => "write_file",
            Tool::EditFile => "edit_file",
            Tool::RunCommand => "run_command",
        }
    }

    /// The tool called `name`, if there is one.
    pub fn from_name(name: &str) -> Option<Tool> {
        Tool::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The known names, comma-separated (for hints and errors).
    pub fn names() -> String {
        Tool::ALL.map(Tool::name).join(", ")
    }

    pub fn spec(self) -> &'static ToolSpec {
        match self {
            Tool::ReadFile => &READ_FILE,
            Tool::ListDir => &LIST_DIR,
            Tool::Grep => &GREP,
            Tool::WriteFile => &WRITE_FILE,
            Tool::EditFile => &EDIT_FILE,
            Tool::RunCommand => &RUN_COMMAND,
        }
    }
}

impl std::fmt::Display for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.name())
    }
}

/// Static facts about a tool.
pub struct ToolSpec {
    pub name: &'static str,
    pub description: &'static str,
    pub risk: Risk,
    pub schema: fn() -> Value,
}

static READ_FILE: ToolSpec = ToolSpec {
    name: Tool::ReadFile.name(),
    description: "Read a text file in the repository. Optional 1-based line `offset` and line `limit`.",
    risk: Risk::Read,
    schema: || json!({"type": "object", "properties": {"path": {"type": "string"}, "offset": {"type": "integer", "minimum": 1}, "limit": {"type": "integer", "minimum": 1}}, "required": ["path"], "additionalProperties": false}),
};
static LIST_DIR: ToolSpec = ToolSpec {
    name: Tool::ListDir.name(),
    description: "List a directory (directories end with `/`).",
    risk: Risk::Read,
    schema: || json!({"type": "object", "properties": {"path": {"type": "string"}}, "additionalProperties": false}),
};
static GREP: ToolSpec = ToolSpec {
    name: Tool::Grep.name(),
    description: "Search files under `path` for a regular expression; prints `file:line: text`.",
    risk: Risk::Read,
    schema: || json!({"type": "object", "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}}, "required": ["pattern"], "additionalProperties": false}),
};
static WRITE_FILE: ToolSpec = ToolSpec {
    name: Tool::WriteFile.name(),
    description: "Create a new file (it must not exist) where the write ACL allows.",
    risk: Risk::Write,
    schema: || json!({"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"], "additionalProperties": false}),
};
static EDIT_FILE: ToolSpec = ToolSpec {
    name: Tool::EditFile.name(),
    description: "Replace the one occurrence of `old` with `new` in a file this run created.",
    risk: Risk::Write,
    schema: || json!({"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}}, "required": ["path", "old", "new"], "additionalProperties": false}),
};
static RUN_COMMAND: ToolSpec = ToolSpec {
    name: Tool::RunCommand.name(),
    description: "Run a shell command in the repository root (sandboxed; no network unless granted).",
    risk: Risk::Destructive,
    schema: || json!({"type": "object", "properties": {"command": {"type": "string"}, "timeout_s": {"type": "integer", "minimum": 1}}, "required": ["command"], "additionalProperties": false}),
};

/// Parses the model's raw argument text for tool `name`. Each tool has its own arm:
/// a name that is not a [`Tool`] is `UNKNOWN_TOOL`, never a shell command.
pub fn parse_args(name: &str, raw: &str) -> Result<ToolArgs, (ErrorClass, String)> {
    let invalid = |m: String| (ErrorClass::InvalidArguments, m);
    let Some(tool) = Tool::from_name(name) else {
        return Err((
            ErrorClass::UnknownTool,
            format!("there is no tool `{name}`; available: {}", Tool::names()),
        ));
    };
    let raw = if raw.trim().is_empty() { "{}" } else { raw };
    let v: Value = serde_json::from_str(raw).map_err(|e| invalid(format!("arguments are not valid JSON: {e}")))?;
    if !v.is_object() {
        return Err(invalid("arguments must be a JSON object".into()));
    }
    let de = |e: serde_json::Error| invalid(format!("invalid arguments for `{name}`: {e}"));
    let args = match tool {
        Tool::ReadFile => {
            let a: ReadArgs = serde_json::from_value(v).map_err(de)?;
            ToolArgs::ReadFile {
                path: a.path,
                offset: a.offset,
                limit: a.limit,
            }
        }
        Tool::ListDir => ToolArgs::ListDir {
            path: serde_json::from_value::<PathArgs>(v).map_err(de)?.path,
        },
        Tool::Grep => {
            let a: GrepArgs = serde_json::from_value(v).map_err(de)?;
            ToolArgs::Grep {
                pattern: a.pattern,
                path: a.path,
            }
        }
        Tool::WriteFile => {
            let a: WriteArgs = serde_json::from_value(v).map_err(de)?;
            ToolArgs::WriteFile {
                path: a.path,
                content: a.content,
            }
        }
        Tool::EditFile => {
            let a: EditArgs = serde_json::from_value(v).map_err(de)?;
            ToolArgs::EditFile {
                path: a.path,
                old: a.old,
                new: a.new,
            }
        }
        Tool::RunCommand => {
            let a: CommandArgs = serde_json::from_value(v).map_err(de)?;
            ToolArgs::RunCommand {
                command: a.command,
                timeout_s: a.timeout_s,
            }
        }
    };
    if let Some(p) = args.path() {
        if p.is_empty() {
            return Err(invalid("path is empty".into()));
        }
    }
    Ok(args)
}

impl ToolArgs {
    pub fn tool(&self) -> Tool {
        match self {
            ToolArgs::ReadFile { .. } => Tool::ReadFile,
            ToolArgs::ListDir { .. } => Tool::ListDir,
            ToolArgs::Grep { .. } => Tool::Grep,
            ToolArgs::WriteFile { .. } => Tool::WriteFile,
            ToolArgs::EditFile { .. } => Tool::EditFile,
            ToolArgs::RunCommand { .. } => Tool::RunCommand,
        }
    }

    pub fn name(&self) -> &'static str {
        self.tool().name()
    }

    pub fn path(&self) -> Option<&str> {
        match self {
            ToolArgs::ReadFile { path, .. }
            | ToolArgs::ListDir { path }
            | ToolArgs::Grep { path, .. }
            | ToolArgs::WriteFile { path, .. }
            | ToolArgs::EditFile { path, .. } => Some(path),
            ToolArgs::RunCommand { .. } => None,
        }
    }
}

/// A request to the tool worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolRequest {
    pub call_id: String,
    pub args: ToolArgs,
    pub timeout_ms: u64,
    pub output_limit: usize,
    /// Globs of files the call must not read (the `Read` deny rules), for tools that
    /// walk directories; repo-relative unless absolute.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masked: Vec<String>,
    /// `run_command` only: run apart from every earlier command, with a fresh empty
    /// `HOME` and `TMPDIR` of its own (an acceptance check: nothing a model's command
    /// left in the shared scratch, such as an interpreter's startup file, is read).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub apart: bool,
}

/// The worker's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    pub call_id: String,
    pub error: Option<ErrorClass>,
    pub output: String,
    pub truncated: bool,
    pub duration_ms: u64,
    /// The kernel refused an operation (EACCES/EPERM/EROFS) during the call.
    #[serde(default)]
    pub kernel_denied: bool,
    /// What the worker's write-back did after the call; absent when the worker has
    /// none (no overlay over the write directories).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_back: Option<WrittenBack>,
}

/// What a worker's write-back ([`crate::sandbox::writeback`]) did after a call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WrittenBack {
    /// Git repositories a tool made in a write directory: never copied, removed from
    /// the tools' view.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nested_repositories: Vec<NestedRepository>,
    /// How many more were removed than the list names (it is capped at
    /// [`NESTED_REPOSITORIES_SENT`], so one answer line stays small).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_repositories: usize,
    /// The entries the copy made, replaced or removed in the real directories, as
    /// tools see them ([`crate::sandbox::writeback::Synced::made`]), at most
    /// [`MADE_SENT`]: the model's doing, which the fire's end removes when it rejects
    /// them, or puts back when they were committed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub made: Vec<String>,
}

/// The most nested repositories one answer names ([`WrittenBack`]).
pub const NESTED_REPOSITORIES_SENT: usize = 100;

/// The most entries made one answer names ([`WrittenBack::made`]).
pub const MADE_SENT: usize = 1000;

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// A git repository a tool made: its `.git` entry, or a bare repository's directory,
/// as tools see it, and why it could not be removed, if it could not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NestedRepository {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left: Option<String>,
}

impl ToolResult {
    pub fn error(call_id: &str, class: ErrorClass, msg: impl Into<String>) -> ToolResult {
        ToolResult {
            call_id: call_id.to_string(),
            error: Some(class),
            output: msg.into(),
            truncated: false,
            duration_ms: 0,
            kernel_denied: false,
            written_back: None,
        }
    }

    /// Text for the model.
    pub fn observation(&self) -> String {
        match self.error {
            None if self.truncated => format!("{}\n[output truncated]", self.output),
            None => self.output.clone(),
            Some(c) => format!("ERROR {}: {}", c.as_str(), self.output),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_classifies_bad_arguments() {
        assert_eq!(
            parse_args("read_file", r#"{"path":"a"}"#).unwrap(),
            ToolArgs::ReadFile {
                path: "a".into(),
                offset: None,
                limit: None
            }
        );
        assert_eq!(
            parse_args("list_dir", "").unwrap(),
            ToolArgs::ListDir { path: ".".into() }
        );
        assert_eq!(
            parse_args("read_file", "{\"path\": ").unwrap_err().0,
            ErrorClass::InvalidArguments
        );
        assert_eq!(
            parse_args("read_file", r#"{"path": 3}"#).unwrap_err().0,
            ErrorClass::InvalidArguments
        );
        assert_eq!(
            parse_args("read_file", r#"{"path": "a", "mode": "x"}"#).unwrap_err().0,
            ErrorClass::InvalidArguments
        );
        assert_eq!(
            parse_args("read_file", r#"[1]"#).unwrap_err().0,
            ErrorClass::InvalidArguments
        );
        assert_eq!(parse_args("teleport", "{}").unwrap_err().0, ErrorClass::UnknownTool);
        let long = format!("{{\"path\": \"{}\"}}", "a/".repeat(5000));
        assert!(
            parse_args("read_file", &long).is_ok(),
            "length is the policy's call, so the denial is traced"
        );
    }

    #[test]
    fn every_tool_has_a_valid_schema() {
        for t in Tool::ALL {
            let s = t.spec();
            let schema = (s.schema)();
            assert_eq!(schema["type"], "object", "{}", s.name);
            assert_eq!(s.name, t.name());
        }
    }

    #[test]
    fn tool_names_are_the_serialized_forms() {
        let table = [
            (Tool::ReadFile, "read_file"),
            (Tool::ListDir, "list_dir"),
            (Tool::Grep, "grep"),
            (Tool::WriteFile, "write_file"),
            (Tool::EditFile, "edit_file"),
            (Tool::RunCommand, "run_command"),
        ];
        assert_eq!(table.len(), Tool::ALL.len());
        for (t, name) in table {
            assert_eq!(t.name(), name);
            assert_eq!(serde_json::to_value(t).unwrap(), json!(name));
            assert_eq!(serde_json::from_value::<Tool>(json!(name)).unwrap(), t);
            assert_eq!(Tool::from_name(name), Some(t));
        }
        assert!(serde_json::from_value::<Tool>(json!("teleport")).is_err());
        let args = ToolArgs::Grep {
            pattern: "x".into(),
            path: ".".into(),
        };
        assert_eq!(serde_json::to_value(&args).unwrap()["tool"], "grep");
    }

    /// Guards the old fall-through: a name with no parse arm of its own became a
    /// `run_command`, so a tool added to the list ran its arguments as a shell command.
    #[test]
    fn every_tool_parses_to_itself_and_no_other_name_reaches_the_shell() {
        for t in Tool::ALL {
            let raw = match t {
                Tool::ReadFile | Tool::ListDir => r#"{"path": "a"}"#,
                Tool::Grep => r#"{"pattern": "x"}"#,
                Tool::WriteFile => r#"{"path": "a", "content": "x"}"#,
                Tool::EditFile => r#"{"path": "a", "old": "x", "new": "y"}"#,
                Tool::RunCommand => r#"{"command": "ls"}"#,
            };
            assert_eq!(parse_args(t.name(), raw).unwrap().tool(), t);
        }
        for name in ["bash", "shell", "Run_Command", "run_command ", ""] {
            let err = parse_args(name, r#"{"command": "ls"}"#).unwrap_err();
            assert_eq!(err.0, ErrorClass::UnknownTool, "{name:?}");
        }
    }
}
