//! Eval case files, `evals/<task>/<case>.yaml` (docs/eval-cases.md):
//! read strictly, so an unknown key, an unknown assertion or a value of the wrong
//! type is a diagnostic with file, line and field (what `builder check` lists), never
//! a case that silently asserts less than its author meant.

use crate::diag::Diagnostic;
use crate::provider::{ReplayCall, ReplayTrace, ReplayTurn, ReplayUsage};
use crate::yamlpos::{line_of, line_of_item};
use serde_yaml::Value;
use std::path::{Path, PathBuf};

/// Where eval cases live, one directory per task.
pub const EVALS_DIR: &str = "evals";

/// The keys a case file may have.
const CASE_KEYS: &[&str] = &[
    "name", "task", "model", "script", "replay", "repeat", "min_pass", "assert", "fixes",
];

/// The assertions a case may make, by name.
pub const ASSERTIONS: &[&str] = &[
    "must_call",
    "must_not_call",
    "call_order",
    "report_contains",
    "report_matches",
    "max_steps",
    "max_cost_usd",
    "no_denials",
    "acceptance_passes",
    "no_secret_in_records",
];

/// Where a case's model turns come from.
#[derive(Debug, Clone)]
pub enum CaseModel {
    /// The turns written in the case (`script`), answered by the replay provider.
    Scripted(ReplayTrace),
    /// A recorded trace file, repo-relative (`replay`).
    Replay(String),
    /// The settings' provider: a live model.
    Provider,
}

/// One assertion about a fire.
#[derive(Debug, Clone)]
pub enum Assertion {
    MustCall(Vec<String>),
    MustNotCall(Vec<String>),
    CallOrder(Vec<String>),
    ReportContains(Vec<String>),
    ReportMatches(regex::Regex),
    MaxSteps(u32),
    MaxCostUsd(f64),
    NoDenials,
    AcceptancePasses,
    NoSecretInRecords,
}

impl Assertion {
    /// The assertion's key in a case file.
    pub fn key(&self) -> &'static str {
        match self {
            Assertion::MustCall(_) => "must_call",
            Assertion::MustNotCall(_) => "must_not_call",
            Assertion::CallOrder(_) => "call_order",
            Assertion::ReportContains(_) => "report_contains",
            Assertion::ReportMatches(_) => "report_matches",
            Assertion::MaxSteps(_) => "max_steps",
            Assertion::MaxCostUsd(_) => "max_cost_usd",
            Assertion::NoDenials => "no_denials",
            Assertion::AcceptancePasses => "acceptance_passes",
            Assertion::NoSecretInRecords => "no_secret_in_records",
        }
    }

    /// `key: value`, as the case wrote it.
    pub fn label(&self) -> String {
        let list = |v: &[String]| v.join(", ");
        match self {
            Assertion::MustCall(v)
            | Assertion::MustNotCall(v)
            | Assertion::CallOrder(v)
            | Assertion::ReportContains(v) => format!("{}: {}", self.key(), list(v)),
            Assertion::ReportMatches(r) => format!("{}: {}", self.key(), r.as_str()),
            Assertion::MaxSteps(n) => format!("{}: {n}", self.key()),
            Assertion::MaxCostUsd(x) => format!("{}: {x}", self.key()),
            Assertion::NoDenials | Assertion::AcceptancePasses | Assertion::NoSecretInRecords => {
                format!("{}: true", self.key())
            }
        }
    }
}

/// One golden case.
#[derive(Debug, Clone)]
pub struct Case {
    /// Repo-relative path of the case file.
    pub file: PathBuf,
    /// The case's `name`, else its file stem.
    pub name: String,
    pub task: String,
    pub model: CaseModel,
    /// Runs per revision (live models; scripted and replayed cases run once).
    pub repeat: u32,
    /// The pass rate (0 to 1) a revision must reach.
    pub min_pass: f64,
    pub asserts: Vec<Assertion>,
    /// Cards this case guards against (`fixes: [card-id]`), for `builder review`.
    pub fixes: Vec<String>,
    /// The base's version of a case the head edited ([`Case::as_the_base_has_it`]):
    /// only what it passed on the base and fails on the head fails the eval.
    pub base_version: bool,
}

impl Case {
    /// This case of the base's checkout at `base`, run on both revisions as the base
    /// has it: named `<name> (base's version)`, and a `replay` case answering from the
    /// base's trace (read now, through no link), not from the trace file of whichever
    /// checkout it runs in. `None` when that trace cannot be read.
    pub fn as_the_base_has_it(mut self, base: &Path) -> Option<Case> {
        if let CaseModel::Replay(rel) = &self.model {
            let trace = crate::provider::Replay::load(base, &base.join(rel)).ok()?;
            self.model = CaseModel::Scripted(trace.into_trace());
        }
        self.name = format!("{} (base's version)", self.name);
        self.base_version = true;
        Some(self)
    }
}

/// Every case file under `evals/` (of `task` only, when given), sorted by path.
pub fn case_files(root: &Path, task: Option<&str>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(dirs) = std::fs::read_dir(root.join(EVALS_DIR)) else {
        return out;
    };
    for dir in dirs.flatten() {
        let name = dir.file_name().to_string_lossy().into_owned();
        if task.is_some_and(|t| t != name) || !dir.path().is_dir() {
            continue;
        }
        let Ok(files) = std::fs::read_dir(dir.path()) else {
            continue;
        };
        for f in files.flatten() {
            let fname = f.file_name().to_string_lossy().into_owned();
            if fname.ends_with(".yaml") || fname.ends_with(".yml") {
                out.push(PathBuf::from(EVALS_DIR).join(&name).join(fname));
            }
        }
    }
    out.sort();
    out
}

/// Loads every case (of `task`, when given); problems go to `diags`, and a file with
/// a problem yields no case.
pub fn load_cases(root: &Path, task: Option<&str>, diags: &mut Vec<Diagnostic>) -> Vec<Case> {
    let mut cases = Vec::new();
    let Ok(dir) = crate::beneath::open_root(root) else {
        return cases;
    };
    for rel in case_files(root, task) {
        match read_case_file(&dir, &rel) {
            Ok(src) => {
                if let Some(c) = parse_case(&rel, &src, diags) {
                    // A name that is not a task's is refused before any file is looked
                    // for: `task: ../../x` would ask whether a file outside exists.
                    if !crate::layout::valid_task_name(&c.task) {
                        diags.push(Diagnostic::new(
                            &rel,
                            line_of(&src, &["task"]),
                            "task",
                            format!(
                                "`{}` is not a valid task name (letters, digits, `-`, `_`)",
                                crate::text::printable(&c.task)
                            ),
                        ));
                    } else if root.join(crate::prompt::prompt_path(&c.task)).is_file() {
                        cases.push(c);
                    } else {
                        let line = if src.lines().any(|l| l.starts_with("task:")) {
                            line_of(&src, &["task"])
                        } else {
                            0
                        };
                        diags.push(
                            Diagnostic::new(
                                &rel,
                                line,
                                "task",
                                format!("no task `{}`: prompts/{}.md does not exist", c.task, c.task),
                            )
                            .with_hint("a case runs the task its directory (or `task:`) names"),
                        );
                    }
                }
            }
            Err(e) => diags.push(
                Diagnostic::new(&rel, 0, "", format!("cannot read: {e}"))
                    .with_hint("a case is a regular file inside the repository: a link (to a file or through a directory) is never followed"),
            ),
        }
    }
    // Two cases of one task under one name would share a row of the eval table.
    let mut seen: Vec<(&str, &str, &Path)> = Vec::new();
    for c in &cases {
        match seen.iter().find(|(t, n, _)| *t == c.task && *n == c.name) {
            Some((_, _, first)) => diags.push(
                Diagnostic::new(
                    &c.file,
                    0,
                    "name",
                    format!(
                        "case `{}` of task `{}` is named in {} too",
                        c.name,
                        c.task,
                        first.display()
                    ),
                )
                .with_hint("give each case of a task its own `name`"),
            ),
            None => seen.push((&c.task, &c.name, &c.file)),
        }
    }
    cases
}

/// The most a case file may hold.
const CASE_FILE_CAP: u64 = 1 << 20;

/// A case file's text, read through no link at any level and only from a regular
/// file: a case is the revision's own, and a proposal whose `evals/` links to a file of
/// the reviewer's (a key, a token file) gets nothing of it read.
fn read_case_file(root: &std::os::fd::OwnedFd, rel: &Path) -> Result<String, String> {
    let bytes = crate::beneath::read_regular(root, rel, CASE_FILE_CAP).map_err(|e| e.to_string())?;
    String::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_string())
}

/// Whether case `c` reads the same in the checkouts at `a` and `b`: its file, and
/// for a `replay` case the trace it names (a head that leaves the case alone and
/// edits the trace changes what the case checks as much). Each file is read as the
/// eval reads it, through no link; one that cannot be read counts as changed.
pub fn same_in(a: &Path, b: &Path, c: &Case) -> bool {
    let bytes = |root: &Path, rel: &Path, cap: u64| {
        let dir = crate::beneath::open_root(root).ok()?;
        crate::beneath::read_regular(&dir, rel, cap).ok()
    };
    // The same bytes, or the same document: an edit of layout, quoting or comments
    // changes nothing the case does, and would only run it twice.
    let same = |rel: &Path, cap: u64, doc: fn(&[u8]) -> Option<Value>| match (bytes(a, rel, cap), bytes(b, rel, cap)) {
        (Some(x), Some(y)) => x == y || doc(&x).is_some_and(|x| doc(&y).is_some_and(|y| x == y)),
        _ => false,
    };
    same(&c.file, CASE_FILE_CAP, yaml_document)
        && match &c.model {
            CaseModel::Replay(rel) => same(Path::new(rel), crate::provider::TRACE_CAP, json_document),
            _ => true,
        }
}

/// A case file's YAML document (`None` where [`parse_case`] would not parse it).
fn yaml_document(src: &[u8]) -> Option<Value> {
    if crate::yamlpos::too_many_flow_openings(src).is_some() {
        return None;
    }
    serde_yaml::from_slice(src).ok()
}

/// A replay trace's JSON document, as YAML's data model (JSON is YAML).
fn json_document(src: &[u8]) -> Option<Value> {
    serde_json::from_slice(src).ok()
}

/// Parses one case file; `rel` is its repo-relative path (`evals/<task>/<case>.yaml`).
pub fn parse_case(rel: &Path, src: &str, diags: &mut Vec<Diagnostic>) -> Option<Case> {
    let before = diags.len();
    let mut p = Parser { rel, src, diags };
    if let Some(why) = crate::yamlpos::too_many_flow_openings(src.as_bytes()) {
        p.diags.push(Diagnostic::new(rel, 0, "", why));
        return None;
    }
    let doc: Value = match serde_yaml::from_str(src) {
        Ok(v) => v,
        Err(e) => {
            let line = e.location().map_or(0, |l| l.line());
            p.diags.push(Diagnostic::new(rel, line, "", format!("not YAML: {e}")));
            return None;
        }
    };
    let Some(map) = doc.as_mapping() else {
        p.diags.push(Diagnostic::new(
            rel,
            1,
            "",
            "a case is a mapping (name, model, script, assert)",
        ));
        return None;
    };
    p.unknown_keys(map);
    let get = |k: &str| map.get(k);
    let stem = rel
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let dir_task = rel
        .parent()
        .and_then(|d| d.file_name())
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = p.string(get("name"), "name").unwrap_or(stem);
    let task = p.string(get("task"), "task").unwrap_or(dir_task);
    let repeat = p.repeat(get("repeat"));
    let min_pass = p.min_pass(get("min_pass"));
    let model = p.model(get("model"), get("script"), get("replay"));
    let asserts = p.asserts(get("assert"));
    let fixes = match get("fixes") {
        None => vec![],
        Some(v) => p.strings(v, &["fixes"], "fixes").unwrap_or_default(),
    };
    if diags.len() > before {
        return None;
    }
    Some(Case {
        file: rel.to_path_buf(),
        name,
        task,
        model: model?,
        repeat,
        min_pass,
        asserts,
        fixes,
        base_version: false,
    })
}

struct Parser<'a> {
    rel: &'a Path,
    src: &'a str,
    diags: &'a mut Vec<Diagnostic>,
}

impl Parser<'_> {
    fn unknown_keys(&mut self, map: &serde_yaml::Mapping) {
        for (k, _) in map {
            let key = k.as_str().unwrap_or("");
            if !CASE_KEYS.contains(&key) {
                self.problem(
                    &[key],
                    key,
                    format!("unknown key `{key}`; a case has {}", CASE_KEYS.join(", ")),
                );
            }
        }
    }

    /// `repeat`: how many times the case fires (1 when absent or invalid).
    fn repeat(&mut self, v: Option<&Value>) -> u32 {
        match v.map(Value::as_u64) {
            None => 1,
            Some(Some(n)) if (1..=1000).contains(&n) => n as u32,
            Some(_) => {
                self.problem(&["repeat"], "repeat", "expected a whole number from 1 to 1000");
                1
            }
        }
    }

    /// `min_pass`: the share of fires that must pass (1 when absent or invalid).
    fn min_pass(&mut self, v: Option<&Value>) -> f64 {
        match v.map(Value::as_f64) {
            None => 1.0,
            Some(Some(x)) if (0.0..=1.0).contains(&x) => x,
            Some(_) => {
                self.problem(&["min_pass"], "min_pass", "expected a pass rate from 0 to 1");
                1.0
            }
        }
    }

    fn problem(&mut self, path: &[&str], field: &str, message: impl Into<String>) {
        let line = line_of(self.src, path);
        self.diags.push(Diagnostic::new(self.rel, line, field, message));
    }

    fn item_problem(&mut self, key: &str, field: &str, message: impl Into<String>) {
        let line = line_of_item(self.src, &["assert"], key);
        self.diags.push(Diagnostic::new(self.rel, line, field, message));
    }

    fn string(&mut self, v: Option<&Value>, key: &str) -> Option<String> {
        match v? {
            Value::String(s) if !s.trim().is_empty() => Some(s.clone()),
            _ => {
                self.problem(&[key], key, "expected a non-empty string");
                None
            }
        }
    }

    /// A string or a list of strings.
    fn strings(&mut self, v: &Value, path: &[&str], field: &str) -> Option<Vec<String>> {
        let out: Option<Vec<String>> = match v {
            Value::String(s) => Some(vec![s.clone()]),
            Value::Sequence(items) => items.iter().map(|i| i.as_str().map(str::to_string)).collect(),
            _ => None,
        };
        match out {
            Some(v) if !v.is_empty() && v.iter().all(|s| !s.is_empty()) => Some(v),
            _ => {
                self.problem(path, field, "expected a string or a list of strings");
                None
            }
        }
    }

    fn model(&mut self, model: Option<&Value>, script: Option<&Value>, replay: Option<&Value>) -> Option<CaseModel> {
        let kind = match model {
            None if script.is_some() => "scripted".to_string(),
            None if replay.is_some() => "replay".to_string(),
            None => "provider".to_string(),
            Some(v) => self.string(Some(v), "model")?,
        };
        let stray = |p: &mut Self, key: &str, v: Option<&Value>| {
            if v.is_some() {
                p.problem(&[key], key, format!("`{key}` is only for `model: {key}`"));
            }
        };
        match kind.as_str() {
            "scripted" => {
                stray(self, "replay", replay);
                let Some(script) = script else {
                    self.problem(
                        &["model"],
                        "script",
                        "`model: scripted` needs a `script` (the model's turns)",
                    );
                    return None;
                };
                self.script(script).map(CaseModel::Scripted)
            }
            "replay" => {
                stray(self, "script", script);
                let path = self.string(replay, "replay");
                if path.is_none() && replay.is_none() {
                    self.problem(&["model"], "replay", "`model: replay` needs `replay: <recorded trace>`");
                }
                path.map(CaseModel::Replay)
            }
            "provider" => {
                stray(self, "script", script);
                stray(self, "replay", replay);
                Some(CaseModel::Provider)
            }
            other => {
                self.problem(
                    &["model"],
                    "model",
                    format!("unknown model `{other}`; expected scripted, provider or replay"),
                );
                None
            }
        }
    }

    /// `script`: a list of turns, each `call: {tool, args}` (one tool call) or `text:`
    /// (an answer), with an optional `usage: {input, output}`.
    fn script(&mut self, v: &Value) -> Option<ReplayTrace> {
        let Some(items) = v.as_sequence().filter(|s| !s.is_empty()) else {
            self.problem(
                &["script"],
                "script",
                "expected a non-empty list of turns (call: or text:)",
            );
            return None;
        };
        let mut turns = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let Some(m) = item.as_mapping() else {
                self.turn_problem(i, "expected `call: {tool, args}` or `text: ...`".into());
                continue;
            };
            turns.push(self.script_turn(i, m));
        }
        Some(ReplayTrace {
            version: 1,
            model: Some("scripted".into()),
            turns,
        })
    }

    /// A problem with the `i`th turn of `script`, at its `- ` line.
    fn turn_problem(&mut self, i: usize, msg: String) {
        let line = line_of(self.src, &["script"]) + 1 + i;
        let line = self
            .src
            .lines()
            .enumerate()
            .skip(line_of(self.src, &["script"]))
            .filter(|(_, l)| l.trim_start().starts_with("- "))
            .nth(i)
            .map_or(line, |(n, _)| n + 1);
        self.diags
            .push(Diagnostic::new(self.rel, line, format!("script[{i}]"), msg));
    }

    /// The `i`th turn of `script`: its text, its call and its usage.
    fn script_turn(&mut self, i: usize, m: &serde_yaml::Mapping) -> ReplayTurn {
        let problems_before = self.diags.len();
        let mut turn = ReplayTurn {
            content: None,
            tool_calls: vec![],
            usage: ReplayUsage::default(),
        };
        for (k, val) in m {
            match k.as_str().unwrap_or("") {
                "text" => match val.as_str() {
                    Some(t) => turn.content = Some(t.to_string()),
                    None => self.turn_problem(i, "`text` must be a string".into()),
                },
                "call" => match script_call(i, val) {
                    Some(call) => turn.tool_calls.push(call),
                    None => self.turn_problem(
                        i,
                        "`call` needs `tool: <name>` and `args: {..}` (a mapping), nothing else".into(),
                    ),
                },
                "usage" => {
                    let n = |key: &str| val.get(key).map(Value::as_u64);
                    match (n("input"), n("output")) {
                        (Some(Some(i)), Some(Some(o))) => turn.usage = ReplayUsage { input: i, output: o },
                        _ => self.turn_problem(i, "`usage` needs `input` and `output` token counts".into()),
                    }
                }
                other => self.turn_problem(i, format!("unknown key `{other}`; a turn has call, text, usage")),
            }
        }
        if turn.content.is_none() && turn.tool_calls.is_empty() && self.diags.len() == problems_before {
            self.turn_problem(i, "a turn needs `call` or `text`".into());
        }
        turn
    }

    /// `assert`: a list of one-key mappings (`- must_call: run_command`).
    fn asserts(&mut self, v: Option<&Value>) -> Vec<Assertion> {
        let Some(v) = v else {
            self.problem(&[], "assert", "a case needs `assert` (what must hold of the fire)");
            return vec![];
        };
        let items: Vec<(String, Value)> = match v {
            Value::Sequence(items) if items.is_empty() => {
                // A case that asserts nothing passes whatever the fire does.
                self.problem(
                    &["assert"],
                    "assert",
                    "the list is empty: a case with no assertion passes whatever the fire does",
                );
                return vec![];
            }
            Value::Sequence(items) => items
                .iter()
                .filter_map(|i| {
                    let m = i.as_mapping().filter(|m| m.len() == 1);
                    if m.is_none() {
                        self.problem(&["assert"], "assert", "each item is one `assertion: value`");
                    }
                    m.and_then(|m| m.iter().next())
                        .map(|(k, v)| (k.as_str().unwrap_or("").to_string(), v.clone()))
                })
                .collect(),
            _ => {
                self.problem(&["assert"], "assert", "expected a list (`- must_call: run_command`)");
                return vec![];
            }
        };
        items
            .into_iter()
            .filter_map(|(key, val)| self.assertion(&key, &val))
            .collect()
    }

    /// One `assertion: value` item, or `None` (with a problem, unless it is a flag
    /// set to false).
    fn assertion(&mut self, key: &str, val: &Value) -> Option<Assertion> {
        let field = format!("assert.{key}");
        let flag = |p: &mut Self, a: Assertion| match val.as_bool() {
            Some(true) => Some(a),
            Some(false) => None,
            None => {
                p.item_problem(key, &field, "expected true or false");
                None
            }
        };
        let strings = |p: &mut Self| match val {
            Value::String(s) if !s.is_empty() => Some(vec![s.clone()]),
            Value::Sequence(items) if !items.is_empty() => {
                let v: Option<Vec<String>> = items.iter().map(|i| i.as_str().map(str::to_string)).collect();
                if v.is_none() {
                    p.item_problem(key, &field, "expected a string or a list of strings");
                }
                v
            }
            _ => {
                p.item_problem(key, &field, "expected a string or a list of strings");
                None
            }
        };
        match key {
            "must_call" => strings(self).map(Assertion::MustCall),
            "must_not_call" => strings(self).map(Assertion::MustNotCall),
            "call_order" => strings(self).map(Assertion::CallOrder),
            "report_contains" => strings(self).map(Assertion::ReportContains),
            "report_matches" => match val
                .as_str()
                .map(|s| regex::RegexBuilder::new(s).multi_line(true).build())
            {
                Some(Ok(r)) => Some(Assertion::ReportMatches(r)),
                Some(Err(e)) => {
                    self.item_problem(key, &field, format!("not a regular expression: {e}"));
                    None
                }
                None => {
                    self.item_problem(key, &field, "expected a regular expression (a string)");
                    None
                }
            },
            "max_steps" => match val.as_u64() {
                Some(n) if n <= u32::MAX as u64 => Some(Assertion::MaxSteps(n as u32)),
                _ => {
                    self.item_problem(key, &field, "expected a whole number of steps");
                    None
                }
            },
            "max_cost_usd" => match val.as_f64() {
                Some(x) if x >= 0.0 => Some(Assertion::MaxCostUsd(x)),
                _ => {
                    self.item_problem(key, &field, "expected a cost in USD (a number, at least 0)");
                    None
                }
            },
            "no_denials" => flag(self, Assertion::NoDenials),
            "acceptance_passes" => flag(self, Assertion::AcceptancePasses),
            "no_secret_in_records" => flag(self, Assertion::NoSecretInRecords),
            other => {
                self.item_problem(
                    other,
                    &field,
                    format!("unknown assertion `{other}`; known: {}", ASSERTIONS.join(", ")),
                );
                None
            }
        }
    }
}

/// A turn's `call: {tool, args}` as the `i`th call of the script, or `None` when it
/// lacks a tool, its args are not a mapping or it has other keys.
fn script_call(i: usize, val: &Value) -> Option<ReplayCall> {
    let tool = val.get("tool").and_then(Value::as_str);
    let args = val.get("args").cloned().unwrap_or(Value::Mapping(Default::default()));
    let unknown = val
        .as_mapping()
        .map(|c| c.keys().filter_map(Value::as_str).any(|k| k != "tool" && k != "args"))
        .unwrap_or(true);
    match (tool, serde_json::to_value(&args)) {
        (Some(tool), Ok(json)) if !unknown && json.is_object() => Some(ReplayCall {
            id: format!("call_{}", i + 1),
            name: tool.to_string(),
            arguments: json,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(src: &str) -> (Option<Case>, Vec<Diagnostic>) {
        let mut d = vec![];
        let c = parse_case(Path::new("evals/digest/a.yaml"), src, &mut d);
        (c, d)
    }

    #[test]
    fn the_design_example_parses() {
        let src = "name: lists-open-cards\nmodel: scripted\nscript:\n  - call: { tool: run_command, args: { command: \"ls cards\" } }\n  - text: \"Open cards: none.\"\nrepeat: 1\nmin_pass: 1\nassert:\n  - must_call: run_command\n  - must_not_call: write_file\n  - call_order: [run_command]\n  - report_contains: \"Open cards\"\n  - report_matches: \"^Open cards\"\n  - max_steps: 5\n  - max_cost_usd: 0.01\n  - no_denials: true\n  - acceptance_passes: true\n  - no_secret_in_records: true\n";
        let (c, d) = parse(src);
        assert!(d.is_empty(), "{d:?}");
        let c = c.unwrap();
        assert_eq!((c.name.as_str(), c.task.as_str()), ("lists-open-cards", "digest"));
        assert_eq!(c.asserts.len(), 10);
        let CaseModel::Scripted(trace) = &c.model else {
            panic!("scripted")
        };
        assert_eq!(trace.turns.len(), 2);
        assert_eq!(trace.turns[0].tool_calls[0].arguments["command"], "ls cards");
    }

    #[test]
    fn unknown_keys_and_assertions_name_file_line_and_field() {
        let src = "model: scripted\nscript:\n  - text: hi\ncolour: red\nassert:\n  - must_call: x\n  - must_sing: true\n  - max_steps: many\n";
        let (c, d) = parse(src);
        assert!(c.is_none());
        let lines: Vec<String> = d.iter().map(|d| d.to_string()).collect();
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("evals/digest/a.yaml:4: colour: unknown key")),
            "{lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("evals/digest/a.yaml:7: assert.must_sing: unknown assertion")),
            "{lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("evals/digest/a.yaml:8: assert.max_steps: expected a whole number")),
            "{lines:?}"
        );
    }

    #[test]
    fn a_bad_turn_points_at_its_item() {
        let src = "model: scripted\nscript:\n  - text: hi\n  - call: { tool: run_command, argz: {} }\nassert:\n  - no_denials: true\n";
        let (_, d) = parse(src);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!((d[0].line, d[0].field.as_str()), (4, "script[1]"));
    }

    #[test]
    fn a_task_name_that_climbs_out_is_refused_without_looking_for_its_prompt() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        std::fs::create_dir_all(root.join("evals/t")).unwrap();
        std::fs::create_dir_all(root.join("prompts")).unwrap();
        // The file the name reaches exists: the message must not depend on that.
        std::fs::write(dir.path().join("plan.md"), "private\n").unwrap();
        let messages = |task: &str| {
            std::fs::write(
                root.join("evals/t/a.yaml"),
                format!("task: \"{task}\"\nmodel: scripted\nscript:\n  - text: hi\nassert:\n  - no_denials: true\n"),
            )
            .unwrap();
            let mut d = vec![];
            let cases = load_cases(&root, None, &mut d);
            assert!(cases.is_empty());
            d.iter().map(|d| d.message.replace(task, "NAME")).collect::<Vec<_>>()
        };
        let there = messages("../../plan");
        assert_eq!(
            there,
            messages("../../absent"),
            "the answer tells whether the file exists"
        );
        assert_eq!(there.len(), 1, "{there:?}");
        assert!(there[0].contains("not a valid task name"), "{there:?}");
    }

    #[test]
    fn a_flow_bomb_is_refused_unparsed_naming_the_file() {
        // Deep enough to hold libyaml for minutes if it were parsed.
        let bomb = format!("name: x\nmodel: {}{}\n", "[".repeat(300_000), "]".repeat(300_000));
        let (c, d) = parse(&bomb);
        assert!(c.is_none());
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].to_string().starts_with("evals/digest/a.yaml"), "{d:?}");
        assert!(d[0].message.contains("not parsed"), "{d:?}");
        let mut d = Vec::new();
        assert!(crate::settings::parse_runtime_yaml(&bomb, &mut d).is_none());
        assert!(d[0].message.contains("not parsed"), "{d:?}");
    }

    #[test]
    fn a_case_edited_only_in_layout_is_the_same_and_one_edited_in_substance_is_not() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let write = |root: &Path, rel: &str, text: &str| {
            std::fs::create_dir_all(root.join(rel).parent().unwrap()).unwrap();
            std::fs::write(root.join(rel), text).unwrap();
        };
        let case = "name: c\nmodel: replay\nreplay: evals/digest/t.json\nassert:\n  - must_call: run_command\n";
        let trace = r##"{"version": 1, "turns": [{"content": "# Done"}]}"##;
        write(a.path(), "evals/digest/c.yaml", case);
        write(a.path(), "evals/digest/t.json", trace);
        let (c, d) = parse(case);
        assert!(d.is_empty(), "{d:?}");
        let c = Case {
            file: PathBuf::from("evals/digest/c.yaml"),
            ..c.unwrap()
        };
        let same = |case_b: &str, trace_b: &str| {
            write(b.path(), "evals/digest/c.yaml", case_b);
            write(b.path(), "evals/digest/t.json", trace_b);
            same_in(a.path(), b.path(), &c)
        };
        assert!(same(case, trace));
        // Comments, quoting, flow style, key order and JSON layout: the same case.
        let relaid = "# reworded\nassert: [{must_call: \"run_command\"}]\nreplay: 'evals/digest/t.json'\nmodel: replay\nname: c\n";
        assert!(same(
            relaid,
            "{\n  \"turns\": [ { \"content\": \"# Done\" } ],\n  \"version\": 1\n}\n"
        ));
        // What it checks, or what the model says, changed: not the same.
        assert!(!same(&case.replace("must_call", "must_not_call"), trace));
        assert!(!same(case, &trace.replace("# Done", "# Other")));
        // A file the eval would not parse is changed.
        assert!(!same(&format!("{case}{}", "[".repeat(20_000)), trace));
    }

    #[test]
    fn the_scaffold_case_checks_out() {
        let (c, d) = parse(include_str!("../../../evals/digest/basic.yaml"));
        assert!(d.is_empty(), "{d:?}");
        assert!(matches!(c.unwrap().model, CaseModel::Replay(_)));
    }
}
