//! Task prompts: `prompts/<task>.md`, YAML front matter between `---` lines, then the
//! markdown body. Front matter may only narrow the settings for its task (model,
//! tools, budgets, extra deny rules) and declares prefetch commands and acceptance
//! checks. Errors name the file, the line in the file, and the field.

use crate::diag::{DiagKind, Diagnostic};
pub use crate::layout::valid_task_name;
use crate::settings::{check_sections, section, take_unknown_tools, unknown_tool, Budgets, RuntimeSettings};
use crate::tools::Tool;
use crate::yamlpos;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The front matter of a task prompt.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FrontMatter {
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    /// A subset of the settings' tools.
    #[serde(default)]
    pub tools: Option<Vec<Tool>>,
    #[serde(default)]
    pub budgets: Option<BudgetOverrides>,
    /// Extra deny rules for this task.
    #[serde(default)]
    pub deny: Vec<String>,
    #[serde(default)]
    pub prefetch: Vec<Prefetch>,
    #[serde(default)]
    pub acceptance: Vec<Acceptance>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BudgetOverrides {
    pub max_steps: Option<u32>,
    pub max_wall_s: Option<u64>,
    pub max_tokens: Option<u64>,
    pub max_cost_usd: Option<f64>,
}

/// A deterministic context command: a builder script under `tools/` plus arguments.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Prefetch {
    pub name: String,
    /// Repo-relative script path (under `tools/`).
    pub run: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub timeout_s: Option<u64>,
    /// TCP ports the script may connect to (a database, an API). Without any, the
    /// script has no network; with them, it keeps the host's network namespace and
    /// may open TCP sockets only (seccomp), to these ports only (Landlock).
    #[serde(default)]
    pub network: Vec<u16>,
}

/// A check run after the loop; the fire is `accepted` only if every check passes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Acceptance {
    pub name: String,
    /// The report must contain this text.
    #[serde(default)]
    pub report_contains: Option<String>,
    /// A builder script under `tools/`, run with the report path as its argument.
    #[serde(default)]
    pub run: Option<String>,
    /// The report must have at least this many bytes.
    #[serde(default)]
    pub min_report_bytes: Option<usize>,
}

/// A loaded task prompt.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub task: String,
    pub file: PathBuf,
    pub front: FrontMatter,
    pub body: String,
}

const FRONT_KEYS: &[&str] = &[
    "description",
    "model",
    "tools",
    "budgets",
    "deny",
    "prefetch",
    "acceptance",
];

/// The tasks of the repository at `root`: the stems of `prompts/*.md`, sorted.
pub fn task_names(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root.join(crate::layout::PROMPTS_DIR))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".md")
                .filter(|t| valid_task_name(t))
                .map(str::to_string)
        })
        .collect();
    names.sort();
    names
}

/// The known task closest to a mistyped `task`, when one is close enough to be what
/// was meant.
pub fn closest_task<'a>(task: &str, known: &'a [String]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (strsim::jaro_winkler(task, k), k))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k.as_str())
}

/// Repo-relative path of a task's prompt.
pub fn prompt_path(task: &str) -> PathBuf {
    Path::new(crate::layout::PROMPTS_DIR).join(format!("{task}.md"))
}

/// Loads `prompts/<task>.md` under `root` and checks it against `settings`.
pub fn load(root: &Path, task: &str, settings: &RuntimeSettings) -> Result<Prompt, Vec<Diagnostic>> {
    let rel = prompt_path(task);
    if !valid_task_name(task) {
        return Err(vec![Diagnostic::new(
            &rel,
            0,
            "",
            format!("`{task}` is not a valid task name (letters, digits, `-`, `_`)"),
        )]);
    }
    load_text(
        task,
        crate::regular::read_text_within(root, &rel).map_err(|e| e.to_string()),
        settings,
    )
}

/// [`load`] of text read elsewhere (a fire reads the committed blob): `text` is the
/// prompt's content, or why it could not be read.
pub fn load_text(
    task: &str,
    text: Result<String, String>,
    settings: &RuntimeSettings,
) -> Result<Prompt, Vec<Diagnostic>> {
    let rel = prompt_path(task);
    if !valid_task_name(task) {
        return Err(vec![Diagnostic::new(
            &rel,
            0,
            "",
            format!("`{task}` is not a valid task name (letters, digits, `-`, `_`)"),
        )]);
    }
    let src = text.map_err(|e| {
        vec![Diagnostic::new(&rel, 0, "", format!("cannot read: {e}"))
            .with_hint(format!("create {} or check the task name", rel.display()))]
    })?;
    parse(task, &rel, &src, settings)
}

/// Parses prompt text; `rel` is used for diagnostics.
pub fn parse(task: &str, rel: &Path, src: &str, settings: &RuntimeSettings) -> Result<Prompt, Vec<Diagnostic>> {
    let mut diags = Vec::new();
    let Split {
        front: front_src,
        body,
        offset,
        unclosed,
    } = split_front_matter(src);
    if unclosed {
        diags.push(
            Diagnostic::new(
                rel,
                1,
                "front matter",
                "opened by `---` on line 1 and never closed by a `---` line: none of it would apply",
            )
            .with_hint("end the front matter with a line `---` (or begin the prompt with something other than `---`)"),
        );
    }
    let (front, unknown_tools) = match front_src {
        None => (FrontMatter::default(), Vec::new()),
        Some(fm) => parse_front(rel, fm, offset, &mut diags).unwrap_or_default(),
    };
    if body.trim().is_empty() {
        diags.push(
            Diagnostic::new(
                rel,
                offset + front_src.map(|f| f.lines().count() + 2).unwrap_or(1),
                "body",
                "the prompt body is empty",
            )
            .with_hint("write the task instructions below the front matter"),
        );
    }
    if let Some(fm) = front_src {
        diags.extend(narrowing_problems(rel, fm, offset, &front, &unknown_tools, settings));
    }
    if diags.is_empty() {
        Ok(Prompt {
            task: task.to_string(),
            file: rel.to_path_buf(),
            front,
            body: body.to_string(),
        })
    } else {
        Err(diags)
    }
}

/// The front matter alone, when it parses (used by `builder check` to look at
/// scripts even when other parts of the prompt are wrong).
pub fn front_matter(rel: &Path, src: &str) -> Option<FrontMatter> {
    let split = split_front_matter(src);
    let mut ignored = Vec::new();
    split
        .front
        .and_then(|fm| parse_front(rel, fm, split.offset, &mut ignored))
        .map(|(front, _)| front)
}

/// A prompt's text split: its front matter, its body, and the line offset of the
/// front matter's first line minus one.
struct Split<'a> {
    front: Option<&'a str>,
    body: &'a str,
    offset: usize,
    /// Opened by `---` and never closed: none of it would apply.
    unclosed: bool,
}

/// Splits `---\n...\n---\n` front matter off (after a byte-order mark an editor may
/// have put first, which would otherwise hide the front matter and every narrowing
/// in it).
fn split_front_matter(src: &str) -> Split<'_> {
    let src = src.strip_prefix('\u{feff}').unwrap_or(src);
    let plain = |unclosed| Split {
        front: None,
        body: src,
        offset: 0,
        unclosed,
    };
    let Some(rest) = src.strip_prefix("---\n").or_else(|| src.strip_prefix("---\r\n")) else {
        return plain(false);
    };
    let mut pos = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            return Split {
                front: Some(&rest[..pos]),
                body: &rest[pos + line.len()..],
                offset: 1,
                unclosed: false,
            };
        }
        pos += line.len();
    }
    plain(true)
}

/// The front matter, and the `tools:` entries that named no tool (with their index in
/// the list; they are taken out so the rest deserializes, and reported with the
/// narrowing problems).
type Front = (FrontMatter, Vec<(usize, String)>);

fn parse_front(rel: &Path, fm: &str, offset: usize, diags: &mut Vec<Diagnostic>) -> Option<Front> {
    if let Some(why) = crate::yamlpos::too_many_flow_openings(fm.as_bytes()) {
        diags.push(Diagnostic::new(rel, offset, "front matter", why));
        return None;
    }
    let mut value: serde_yaml::Value = match serde_yaml::from_str(fm) {
        Ok(serde_yaml::Value::Null) => return Some(Front::default()),
        Ok(v) => v,
        Err(e) => {
            let (line, what) = crate::yamlpos::syntax_error(fm, &e);
            let line = line + offset;
            diags.push(Diagnostic::new(
                rel,
                line,
                "front matter",
                format!("YAML syntax error: {what}"),
            ));
            return None;
        }
    };
    let mut local = Vec::new();
    check_sections(rel, fm, &value, FRONT_KEYS, &mut local, |key, v, d| match key {
        "description" | "model" => section::<String>(rel, fm, key, v, d),
        "tools" | "deny" => section::<Vec<String>>(rel, fm, key, v, d),
        "budgets" => section::<BudgetOverrides>(rel, fm, key, v, d),
        "prefetch" => section::<Vec<Prefetch>>(rel, fm, key, v, d),
        "acceptance" => section::<Vec<Acceptance>>(rel, fm, key, v, d),
        _ => {}
    });
    let failed = !local.is_empty();
    diags.extend(local.into_iter().map(|mut d| {
        d.line += offset;
        d
    }));
    if failed {
        return None;
    }
    let unknown_tools = value.get_mut("tools").map(take_unknown_tools).unwrap_or_default();
    match serde_yaml::from_value(value) {
        Ok(f) => Some((f, unknown_tools)),
        Err(e) => {
            diags.push(Diagnostic::new(rel, offset + 1, "front matter", e.to_string()));
            None
        }
    }
}

fn narrowing_problems(
    rel: &Path,
    fm: &str,
    offset: usize,
    front: &FrontMatter,
    unknown_tools: &[(usize, String)],
    s: &RuntimeSettings,
) -> Vec<Diagnostic> {
    let pos = FrontPos { rel, fm, offset };
    let mut d = Vec::new();
    model_problems(&pos, front, s, &mut d);
    tool_problems(&pos, front, unknown_tools, s, &mut d);
    budget_problems(&pos, front, s, &mut d);
    rule_and_script_problems(&pos, front, &mut d);
    d
}

/// Where a front matter key or list item is, as a line of the prompt file.
struct FrontPos<'a> {
    rel: &'a Path,
    fm: &'a str,
    offset: usize,
}

impl FrontPos<'_> {
    fn at(&self, path: &[&str]) -> usize {
        yamlpos::line_of(self.fm, path) + self.offset
    }

    fn item(&self, path: &[&str], needle: &str) -> usize {
        yamlpos::line_of_item(self.fm, path, needle) + self.offset
    }
}

/// A model other than the provider's or the fallback's widens the settings.
fn model_problems(pos: &FrontPos, front: &FrontMatter, s: &RuntimeSettings, d: &mut Vec<Diagnostic>) {
    let rel = pos.rel;
    if let Some(model) = &front.model {
        let allowed = s.provider.model.as_deref() == Some(model.as_str())
            || s.fallback.as_ref().and_then(|f| f.model.as_deref()) == Some(model.as_str());
        if !allowed {
            d.push(
                Diagnostic::new(
                    rel,
                    pos.at(&["model"]),
                    "model",
                    format!("model `{model}` is not the provider's model; front matter may only narrow settings"),
                )
                .with_hint("change the model in settings/runtime.yaml through review")
                .with_kind(DiagKind::Widens),
            );
        }
    }
}

/// Tools that are unknown, or known but not enabled in settings, in list order.
fn tool_problems(
    pos: &FrontPos,
    front: &FrontMatter,
    unknown_tools: &[(usize, String)],
    s: &RuntimeSettings,
    d: &mut Vec<Diagnostic>,
) {
    let rel = pos.rel;
    // In list order: the unknown names were taken out of the list at their indexes.
    let mut known = front.tools.iter().flatten();
    let mut unknown = unknown_tools.iter().peekable();
    for i in 0.. {
        if let Some((_, name)) = unknown.next_if(|(at, _)| *at == i) {
            d.push(unknown_tool(rel, pos.item(&["tools"], name), name));
        } else if let Some(t) = known.next() {
            if !s.tools.contains(t) {
                d.push(
                    Diagnostic::new(
                        rel,
                        pos.item(&["tools"], t.name()),
                        "tools",
                        format!("tool `{t}` is not enabled in settings; front matter may only narrow"),
                    )
                    .with_kind(DiagKind::Widens),
                );
            }
        } else {
            break;
        }
    }
}

/// Budgets above the settings' (or zero) widen them.
fn budget_problems(pos: &FrontPos, front: &FrontMatter, s: &RuntimeSettings, d: &mut Vec<Diagnostic>) {
    let rel = pos.rel;
    if let Some(b) = &front.budgets {
        let base = s.budgets;
        let checks: [(&str, bool); 4] = [
            ("max_steps", b.max_steps.is_some_and(|v| v > base.max_steps || v == 0)),
            (
                "max_wall_s",
                b.max_wall_s.is_some_and(|v| v > base.max_wall_s || v == 0),
            ),
            (
                "max_tokens",
                b.max_tokens.is_some_and(|v| v > base.max_tokens || v == 0),
            ),
            (
                "max_cost_usd",
                b.max_cost_usd.is_some_and(|v| v > base.max_cost_usd || v <= 0.0),
            ),
        ];
        for (name, bad) in checks {
            if bad {
                d.push(
                    Diagnostic::new(
                        rel,
                        pos.at(&["budgets", name]),
                        format!("budgets.{name}"),
                        "budget widens (or zeroes) the settings' budget; front matter may only narrow",
                    )
                    .with_hint(format!("settings allow at most {}", budget_value(&base, name)))
                    .with_kind(DiagKind::Widens),
                );
            }
        }
    }
}

/// Whether a prefetch or acceptance `run:` names a script under `tools/` (no `..`):
/// the only scripts a prompt may run, and the only paths `builder check` looks at.
pub fn script_under_tools(run: &str) -> bool {
    run.starts_with("tools/") && !run.contains("..")
}

/// Deny rules that do not parse, and prefetch and acceptance scripts outside tools/.
fn rule_and_script_problems(pos: &FrontPos, front: &FrontMatter, d: &mut Vec<Diagnostic>) {
    let rel = pos.rel;
    for r in &front.deny {
        if let Err(e) = crate::rules::Rule::parse(r) {
            d.push(Diagnostic::new(
                rel,
                pos.item(&["deny"], r),
                "deny",
                format!("rule `{r}` does not parse: {e}"),
            ));
        }
    }
    for (i, p) in front.prefetch.iter().enumerate() {
        if p.timeout_s == Some(0) {
            d.push(Diagnostic::new(
                rel,
                pos.item(&["prefetch"], &p.run),
                format!("prefetch[{i}].timeout_s"),
                "0 seconds: the script would be stopped before it starts, on every fire",
            ));
        }
        if !script_under_tools(&p.run) {
            d.push(Diagnostic::new(
                rel,
                pos.item(&["prefetch"], &p.run),
                format!("prefetch[{i}].run"),
                format!("`{}` must be a script under tools/", p.run),
            ));
        }
    }
    for (i, a) in front.acceptance.iter().enumerate() {
        if a.report_contains.is_none() && a.run.is_none() && a.min_report_bytes.is_none() {
            d.push(Diagnostic::new(
                rel,
                pos.item(&["acceptance"], &a.name),
                format!("acceptance[{i}]"),
                "a check needs `report_contains`, `min_report_bytes` or `run`",
            ));
        }
        if let Some(run) = &a.run {
            if !script_under_tools(run) {
                d.push(Diagnostic::new(
                    rel,
                    pos.item(&["acceptance"], run),
                    format!("acceptance[{i}].run"),
                    format!("`{run}` must be a script under tools/"),
                ));
            }
        }
    }
}

fn budget_value(b: &Budgets, name: &str) -> String {
    match name {
        "max_steps" => b.max_steps.to_string(),
        "max_wall_s" => b.max_wall_s.to_string(),
        "max_tokens" => b.max_tokens.to_string(),
        _ => b.max_cost_usd.to_string(),
    }
}

impl Prompt {
    /// The settings' budgets narrowed by the front matter.
    pub fn budgets(&self, s: &RuntimeSettings) -> Budgets {
        let b = self.front.budgets.clone().unwrap_or_default();
        Budgets {
            max_steps: b.max_steps.unwrap_or(s.budgets.max_steps).min(s.budgets.max_steps),
            max_wall_s: b.max_wall_s.unwrap_or(s.budgets.max_wall_s).min(s.budgets.max_wall_s),
            max_tokens: b.max_tokens.unwrap_or(s.budgets.max_tokens).min(s.budgets.max_tokens),
            max_cost_usd: b
                .max_cost_usd
                .unwrap_or(s.budgets.max_cost_usd)
                .min(s.budgets.max_cost_usd),
        }
    }

    /// The tools this task may use.
    pub fn tools(&self, s: &RuntimeSettings) -> Vec<Tool> {
        match &self.front.tools {
            Some(t) => s.tools.iter().filter(|x| t.contains(x)).copied().collect(),
            None => s.tools.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> RuntimeSettings {
        let mut d = Vec::new();
        crate::settings::parse_runtime_yaml("version: 1\nprovider: {kind: openai, model: m}\nbudgets: {max_steps: 10}\ntools: [read_file, run_command]\n", &mut d).unwrap()
    }

    #[test]
    fn a_typo_suggests_the_task_meant() {
        let known: Vec<String> = ["digest", "nightly-report", "sort_docs"].map(String::from).to_vec();
        assert_eq!(closest_task("digets", &known), Some("digest"));
        assert_eq!(closest_task("nightly-reprot", &known), Some("nightly-report"));
        assert_eq!(closest_task("zzz", &known), None);
    }

    #[test]
    fn parses_front_matter_and_body() {
        let src = "---\ndescription: x\nbudgets:\n  max_steps: 5\nprefetch:\n  - name: log\n    run: tools/log.sh\n---\n# Task\nDo it.\n";
        let p = parse("t", Path::new("prompts/t.md"), src, &settings()).unwrap();
        assert_eq!(p.front.prefetch[0].run, "tools/log.sh");
        assert_eq!(p.budgets(&settings()).max_steps, 5);
        assert!(p.body.starts_with("# Task"));
    }

    /// A byte-order mark an editor put first neither hides the front matter (and its
    /// narrowing) nor reaches the body; front matter never closed is an error, not
    /// prompt text (helper-79: both fired with none of the prompt's narrowing).
    #[test]
    fn a_byte_order_mark_keeps_the_front_matter_and_an_unclosed_one_is_refused() {
        let src =
            "\u{feff}---\ntools: [read_file]\ndeny: [\"Bash(git log*)\"]\nbudgets: {max_steps: 3}\n---\nWrite it.\n";
        let p = parse("t", Path::new("prompts/t.md"), src, &settings()).unwrap();
        assert_eq!(p.budgets(&settings()).max_steps, 3);
        assert_eq!(p.front.deny, vec!["Bash(git log*)".to_string()]);
        assert_eq!(p.body, "Write it.\n");
        let src = "---\ntools: [read_file]\nbudgets: {max_steps: 3}\nWrite it.\n";
        let d = parse("t", Path::new("prompts/t.md"), src, &settings()).unwrap_err();
        assert_eq!((d[0].line, d[0].field.as_str()), (1, "front matter"), "{d:?}");
        assert!(d[0].message.contains("never closed"), "{d:?}");
    }

    #[test]
    fn widening_is_refused_with_file_lines() {
        let src = "---\nmodel: bigger\ntools: [read_file, write_file]\nbudgets:\n  max_steps: 50\n---\nbody\n";
        let d = parse("t", Path::new("prompts/t.md"), src, &settings()).unwrap_err();
        let got: Vec<(usize, &str)> = d.iter().map(|d| (d.line, d.field.as_str())).collect();
        assert_eq!(got, vec![(2, "model"), (3, "tools"), (5, "budgets.max_steps")], "{d:?}");
    }

    #[test]
    fn widening_problems_are_typed_apart_from_other_problems() {
        let src = "---\nmodel: bigger\ntools: [write_file, teleport]\nbudgets:\n  max_steps: 50\n---\nbody\n";
        let d = parse("t", Path::new("prompts/t.md"), src, &settings()).unwrap_err();
        let got: Vec<(&str, DiagKind)> = d.iter().map(|d| (d.field.as_str(), d.kind)).collect();
        assert_eq!(
            got,
            vec![
                ("model", DiagKind::Widens),
                ("tools", DiagKind::Widens),
                ("tools", DiagKind::Input),
                ("budgets.max_steps", DiagKind::Widens)
            ],
            "{d:?}"
        );
    }

    #[test]
    fn unknown_and_unenabled_tools_are_reported_in_list_order() {
        for (list, first, second) in [
            (
                "[teleport, write_file]",
                "unknown tool `teleport`",
                "tool `write_file` is not enabled",
            ),
            (
                "[write_file, teleport]",
                "tool `write_file` is not enabled",
                "unknown tool `teleport`",
            ),
        ] {
            let src = format!("---\ntools: {list}\n---\nbody\n");
            let d = parse("t", Path::new("prompts/t.md"), &src, &settings()).unwrap_err();
            assert_eq!(d.len(), 2, "{d:?}");
            assert!(d[0].message.starts_with(first), "{d:?}");
            assert!(d[1].message.starts_with(second), "{d:?}");
            assert!(d.iter().all(|d| d.line == 2 && d.field == "tools"), "{d:?}");
        }
        let src = "---\ntools: [read_file]\n---\nbody\n";
        let p = parse("t", Path::new("prompts/t.md"), src, &settings()).unwrap();
        assert_eq!(p.tools(&settings()), vec![Tool::ReadFile]);
    }

    #[test]
    fn empty_body_and_unknown_keys() {
        let d = parse("t", Path::new("prompts/t.md"), "---\ncolour: red\n---\n\n", &settings()).unwrap_err();
        assert!(d.iter().any(|d| d.field == "colour" && d.line == 2), "{d:?}");
        assert!(d.iter().any(|d| d.field == "body"), "{d:?}");
    }

    #[test]
    fn task_names() {
        assert!(valid_task_name("daily-digest_2"));
        assert!(!valid_task_name("../x"));
        assert!(!valid_task_name(""));
    }
}
