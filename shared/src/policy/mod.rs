//! The policy engine (docs/design.md): every tool call is decided
//! allow / ask / deny before it runs. Deny rules first, then ask, then allow; first
//! match wins; builder-owned paths are always denied for writes, and writes outside
//! the write ACL are always denied. Reads inside the read roots and writes inside the
//! ACL are allowed unless a deny or ask rule matches; anything else gets the
//! configured default (deny in a fire). Shell commands are analysed segment by
//! segment (see [`shell`]); a command the parser cannot understand is denied.

use crate::layout::{normalize, overlapping_builder_dir, Owner, Ownership, BUILDER_DIRS};
use crate::rules::{Canon, Rule, RuleError, Spec};
use crate::settings::{DefaultDecision, Permissions};
use crate::shell::{self, Segment, Word};
use crate::tools::ToolArgs;
use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    Allow,
    Ask,
    Deny,
}

/// The outcome of a decision: what, which rule (if any), and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub decision: Decision,
    pub rule: Option<String>,
    pub reason: String,
}

impl Verdict {
    fn new(decision: Decision, rule: Option<&Rule>, reason: impl Into<String>) -> Verdict {
        Verdict {
            decision,
            rule: rule.map(|r| r.source.clone()),
            reason: reason.into(),
        }
    }
}

/// A tool call, as the policy engine sees it.
#[derive(Debug, Clone, Copy)]
pub enum Call<'a> {
    ReadFile(&'a str),
    ListDir(&'a str),
    Grep(&'a str),
    WriteFile(&'a str),
    EditFile(&'a str),
    RunCommand(&'a str),
}

impl<'a> From<&'a ToolArgs> for Call<'a> {
    /// The call as the policy engine sees it.
    fn from(args: &'a ToolArgs) -> Call<'a> {
        match args {
            ToolArgs::ReadFile { path, .. } => Call::ReadFile(path),
            ToolArgs::ListDir { path } => Call::ListDir(path),
            ToolArgs::Grep { path, .. } => Call::Grep(path),
            ToolArgs::WriteFile { path, .. } => Call::WriteFile(path),
            ToolArgs::EditFile { path, .. } => Call::EditFile(path),
            ToolArgs::RunCommand { command, .. } => Call::RunCommand(command),
        }
    }
}

impl Call<'_> {
    fn rule_tools(&self) -> &'static [&'static str] {
        match self {
            Call::ReadFile(_) => &["Read"],
            Call::ListDir(_) => &["Read", "LS", "Glob"],
            Call::Grep(_) => &["Read", "Grep"],
            Call::WriteFile(_) => &["Write", "Edit"],
            Call::EditFile(_) => &["Edit", "MultiEdit", "Write"],
            Call::RunCommand(_) => &["Bash"],
        }
    }
}

/// A compiled policy for one repository.
#[derive(Debug, Clone)]
pub struct Policy {
    ownership: Ownership,
    deny: Vec<Rule>,
    ask: Vec<Rule>,
    allow: Vec<Rule>,
    /// Bash allow rules by the literal first word of their pattern, so a command is
    /// matched against its own program's rules only (plus `unindexed_bash_allow`).
    bash_allow_by_word: std::collections::HashMap<String, Vec<usize>>,
    unindexed_bash_allow: Vec<usize>,
    write_acl: GlobSet,
    default: Decision,
    read_roots: Vec<PathBuf>,
    scratch: Option<PathBuf>,
    /// Some deny rule names `Read` (then shell reads are judged too).
    read_denied: bool,
    /// Some deny or ask rule names `Read`.
    read_judged: bool,
}

/// Why a policy could not be built (settings loading reports these with lines first).
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("rule `{rule}`: {source}")]
    Rule { rule: String, source: RuleError },
    #[error("glob `{glob}`: {source}")]
    Glob { glob: String, source: globset::Error },
}

const BUILDER_WRITE_REASON: &str = "writes a builder-owned path";

/// The first of `rules` that names one of `tools` and whose path pattern matches the
/// path (`rel` to the root when inside it, and `abs`).
fn path_rule_hit(rules: &[Rule], tools: &[&str], rel: Option<&str>, abs: &Path, anywhere: bool) -> Option<usize> {
    rules.iter().position(|r| {
        r.names_any(tools)
            && match &r.spec {
                Spec::Any => true,
                Spec::Path(p) if anywhere => p.matches_anywhere(rel, abs),
                Spec::Path(p) => p.matches(rel, abs),
                Spec::Command(_) | Spec::Literal(_) => false,
            }
    })
}

/// The rule tool names that govern reading a file (`Read(**/.env)` denies them all).
const READ_TOOLS: &[&str] = &["Read"];

impl Policy {
    /// Compiles the permissions for the repository at `root`. `builder_paths` are the
    /// settings' extra builder-owned globs.
    pub fn new(root: &Path, perms: &Permissions, builder_paths: &[String]) -> Result<Policy, PolicyError> {
        let compile = |list: &[String]| -> Result<Vec<Rule>, PolicyError> {
            list.iter()
                .map(|r| {
                    Rule::parse(r).map_err(|e| PolicyError::Rule {
                        rule: r.clone(),
                        source: e,
                    })
                })
                .collect()
        };
        let mut acl = GlobSetBuilder::new();
        for g in &perms.write {
            let glob = |s: &str| {
                Glob::new(s).map_err(|e| PolicyError::Glob {
                    glob: g.clone(),
                    source: e,
                })
            };
            acl.add(glob(g.trim_end_matches('/'))?);
            if let Some(dir) = g.strip_suffix("/**") {
                acl.add(glob(dir)?);
            }
        }
        let ownership = Ownership::new(root)
            .with_globs(builder_paths, &perms.write)
            .map_err(|e| PolicyError::Glob {
                glob: e.glob().unwrap_or("").to_string(),
                source: e,
            })?;
        let mut read_roots = vec![root.to_path_buf()];
        for d in &perms.additional_directories {
            read_roots.push(match d.strip_prefix("~/") {
                Some(rest) => PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(rest),
                None => PathBuf::from(d),
            });
        }
        let allow = compile(&perms.allow)?;
        let mut bash_allow_by_word: std::collections::HashMap<String, Vec<usize>> = Default::default();
        let mut unindexed_bash_allow = Vec::new();
        for (i, r) in allow.iter().enumerate().filter(|(_, r)| r.tool == "Bash") {
            match &r.spec {
                Spec::Command(p) if p.first_word().is_some() => bash_allow_by_word
                    .entry(p.first_word().unwrap_or_default().to_string())
                    .or_default()
                    .push(i),
                Spec::Command(_) | Spec::Any | Spec::Path(_) | Spec::Literal(_) => unindexed_bash_allow.push(i),
            }
        }
        let deny = compile(&perms.deny)?;
        let ask = compile(&perms.ask)?;
        let read_denied = deny.iter().any(|r| r.names_any(READ_TOOLS));
        let read_judged = read_denied || ask.iter().any(|r| r.names_any(READ_TOOLS));
        Ok(Policy {
            ownership,
            deny,
            ask,
            read_denied,
            read_judged,
            allow,
            bash_allow_by_word,
            unindexed_bash_allow,
            write_acl: acl.build().map_err(|e| PolicyError::Glob {
                glob: String::new(),
                source: e,
            })?,
            default: match perms.default {
                DefaultDecision::Deny => Decision::Deny,
                DefaultDecision::Ask => Decision::Ask,
            },
            read_roots,
            scratch: None,
        })
    }

    /// Allows writes below a per-run scratch directory.
    pub fn with_scratch(mut self, dir: impl Into<PathBuf>) -> Self {
        self.scratch = Some(dir.into());
        self
    }

    pub fn ownership(&self) -> &Ownership {
        &self.ownership
    }

    /// Decides one call.
    pub fn decide(&self, call: Call) -> Verdict {
        match call {
            Call::ReadFile(p) | Call::ListDir(p) | Call::Grep(p) => self.decide_path(call, p, false),
            Call::WriteFile(p) | Call::EditFile(p) => self.decide_path(call, p, true),
            Call::RunCommand(cmd) => self.decide_command(cmd),
        }
    }

    /// Decides a call of MCP tool `tool` on `server` with `args` (compact JSON, keys
    /// in order) by the same lists as every other call: deny, then ask, then allow
    /// ([`crate::mcp::rule_matches`]); no rule gets the default (deny in a fire).
    pub fn decide_mcp(&self, server: &str, tool: &str, args: &str) -> Verdict {
        let hit = |rules: &[Rule]| {
            rules
                .iter()
                .position(|r| crate::mcp::rule_matches(r, server, tool, args))
        };
        if let Some(i) = hit(&self.deny) {
            return Verdict::new(Decision::Deny, Some(&self.deny[i]), "matches a deny rule");
        }
        if let Some(i) = hit(&self.ask) {
            return Verdict::new(Decision::Ask, Some(&self.ask[i]), "matches an ask rule");
        }
        if let Some(i) = hit(&self.allow) {
            return Verdict::new(Decision::Allow, Some(&self.allow[i]), "matches an allow rule");
        }
        Verdict::new(self.default, None, "no rule names this MCP tool")
    }

    fn abs(&self, path: &str, cwd: Option<&str>) -> PathBuf {
        let base = match cwd {
            Some(c) => self.ownership.root().join(c),
            None => self.ownership.root().to_path_buf(),
        };
        let joined = if Path::new(path).is_absolute() {
            PathBuf::from(path)
        } else {
            base.join(path)
        };
        joined
    }

    /// The spellings of the path `abs` (`rel` inside the repository) that deny and ask
    /// rules are matched against, worked out once per decision: as named, and where its
    /// links lead when that differs (`/srv/./data/x`, a read root named through a link,
    /// a link inside the repository); each with whether it lies in a read root.
    fn spellings(&self, rel: Option<String>, abs: PathBuf) -> Vec<(Option<String>, PathBuf, bool)> {
        let real = std::fs::canonicalize(&abs).ok().filter(|r| *r != abs);
        let mut out = vec![(rel, abs)];
        if let Some(real) = real {
            out.push((normalize(self.ownership.root(), &real.to_string_lossy()), real));
        }
        out.into_iter()
            .map(|(rel, abs)| {
                let roots = self.in_read_roots(&abs);
                (rel, abs, roots)
            })
            .collect()
    }

    /// The first of `rules` (deny or ask) that holds for any of `spellings`
    /// ([`Policy::spellings`]): a rule for any depth in the read roots too.
    fn held_by(rules: &[Rule], tools: &[&str], spellings: &[(Option<String>, PathBuf, bool)]) -> Option<usize> {
        spellings
            .iter()
            .find_map(|(rel, abs, roots)| path_rule_hit(rules, tools, rel.as_deref(), abs, *roots))
    }

    /// Whether `abs` (folded: no `.` or `..`) lies in a read root: where rules for any
    /// depth hold outside the repository. Elsewhere only absolute rules name a path,
    /// and the default decides the rest.
    fn in_read_roots(&self, abs: &Path) -> bool {
        normalize(Path::new("/"), &abs.to_string_lossy())
            .map(|p| PathBuf::from(format!("/{p}")))
            .is_some_and(|f| self.read_roots.iter().any(|r| f.starts_with(r)))
    }

    /// Checks a write target against ownership, the ACL and the scratch dir. `None`
    /// when the write is inside the ACL.
    fn check_write(&self, path: &str, cwd: Option<&str>) -> Option<Verdict> {
        if let Some(v) = unusable_path(path) {
            return Some(v);
        }
        if path == "/dev/null" || path == "/dev/stdout" || path == "/dev/stderr" {
            return None;
        }
        let abs = self.abs(path, cwd);
        let abs_s = abs.to_string_lossy();
        let rel = normalize(self.ownership.root(), &abs_s);
        if let Some(rel) = &rel {
            if self.ownership.touches_builder(rel) || self.ownership.classify_resolved(rel) == Owner::Builder {
                return Some(Verdict::new(
                    Decision::Deny,
                    None,
                    format!("{BUILDER_WRITE_REASON} `{}`", if rel.is_empty() { "." } else { rel }),
                ));
            }
            if glob_reaches_builder(rel) {
                return Some(Verdict::new(
                    Decision::Deny,
                    None,
                    format!("pattern `{rel}` may expand to a builder-owned path"),
                ));
            }
            if self.write_acl.is_match(rel) && self.ownership.classify_resolved(rel) != Owner::Neither {
                return None;
            }
        }
        if let Some(scratch) = &self.scratch {
            if let Some(folded) = normalize(scratch, &abs_s) {
                if !folded.contains("..") {
                    return None;
                }
            }
        }
        Some(Verdict::new(
            Decision::Deny,
            None,
            format!("`{path}` is outside the write ACL"),
        ))
    }

    fn decide_path(&self, call: Call, path: &str, write: bool) -> Verdict {
        if write {
            if let Some(v) = self.check_write(path, None) {
                return v;
            }
        } else if let Some(v) = unusable_path(path) {
            return v;
        }
        let abs = self.abs(path, None);
        let rel = normalize(self.ownership.root(), &abs.to_string_lossy());
        let tools = call.rule_tools();
        let spellings = self.spellings(rel.clone(), abs.clone());
        if let Some(i) = Policy::held_by(&self.deny, tools, &spellings) {
            return Verdict::new(Decision::Deny, Some(&self.deny[i]), "matches a deny rule");
        }
        if let Some(i) = Policy::held_by(&self.ask, tools, &spellings) {
            return Verdict::new(Decision::Ask, Some(&self.ask[i]), "matches an ask rule");
        }
        if let Some(i) = path_rule_hit(&self.allow, tools, rel.as_deref(), &abs, false) {
            return Verdict::new(Decision::Allow, Some(&self.allow[i]), "matches an allow rule");
        }
        if write {
            return Verdict::new(Decision::Allow, None, "inside the write ACL");
        }
        if self.in_read_roots(&abs) {
            return Verdict::new(Decision::Allow, None, "inside the read roots");
        }
        Verdict::new(self.default, None, "outside the read roots and no rule matches")
    }

    fn decide_command(&self, cmd: &str) -> Verdict {
        let segments = match shell::analyse(cmd) {
            Ok(s) => s,
            Err(e) => return Verdict::new(Decision::Deny, None, e.to_string()),
        };
        let mut pending_ask: Option<Verdict> = None;
        let mut allowed: Option<Verdict> = None;
        for seg in &segments {
            let v = self.decide_segment(seg);
            match v.decision {
                Decision::Deny => return v,
                Decision::Ask => {
                    pending_ask.get_or_insert(v);
                }
                Decision::Allow => {
                    if allowed.is_none() || allowed.as_ref().is_some_and(|a| a.rule.is_none()) {
                        allowed = Some(v);
                    }
                }
            }
        }
        if let Some(ask) = pending_ask {
            return ask;
        }
        let mut v = allowed.unwrap_or_else(|| Verdict::new(Decision::Deny, None, "empty command"));
        if segments.len() > 1 {
            v.reason = format!("all {} segments allowed", segments.len());
        }
        v
    }

    fn decide_segment(&self, seg: &Segment) -> Verdict {
        let line = seg.line();
        let cwd = match segment_cwd(seg, &line) {
            Ok(cwd) => cwd,
            Err(v) => return v,
        };
        let view = SegmentView::new(seg, &line);
        if let Some(i) = self.deny.iter().position(|r| view.matches(r)) {
            return Verdict::new(
                Decision::Deny,
                Some(&self.deny[i]),
                format!("`{line}` matches a deny rule"),
            );
        }
        for target in &seg.writes {
            if let Some(v) = self.check_write_word(target, cwd) {
                return Verdict {
                    reason: format!("`{line}` {}", v.reason),
                    ..v
                };
            }
        }
        if let Some(v) = self.check_reads(seg, cwd) {
            return Verdict {
                reason: format!("`{line}` {}", v.reason),
                ..v
            };
        }
        if let Some(v) = inline_code_verdict(seg) {
            return v;
        }
        if let Some(i) = self.ask.iter().position(|r| view.matches(r)) {
            return Verdict::new(
                Decision::Ask,
                Some(&self.ask[i]),
                format!("`{line}` matches an ask rule"),
            );
        }
        if shell::NEUTRAL.contains(&seg.program()) && seg.writes.is_empty() {
            return Verdict::new(Decision::Allow, None, "changes only the shell's own state");
        }
        if let Some(i) = self.allow_hit(&view) {
            return Verdict::new(
                Decision::Allow,
                Some(&self.allow[i]),
                format!("`{line}` matches an allow rule"),
            );
        }
        Verdict::new(self.default, None, format!("`{line}` matches no rule"))
    }

    /// The globs of the `Read` deny rules: files a tool that walks a directory (the
    /// `grep` tool) must pass over, as `read_file` is refused them.
    pub fn read_masks(&self) -> Vec<String> {
        self.deny
            .iter()
            .filter(|r| r.names_any(READ_TOOLS))
            .filter_map(|r| match &r.spec {
                Spec::Path(p) => Some(p.glob().to_string()),
                Spec::Any => Some("**".to_string()),
                Spec::Command(_) | Spec::Literal(_) => None,
            })
            .collect()
    }

    /// A `Read` deny (or ask) rule holds for shell reads as it does for `read_file`: the
    /// files a reading command names (`cat .env`, `head -n 3 .env`, `grep key .env`)
    /// are decided as reads. A read target only known at run time (`cat $F`, `cat *`)
    /// is denied while any `Read` deny rule exists, since it could be the denied file.
    fn check_reads(&self, seg: &Segment, cwd: Option<&str>) -> Option<Verdict> {
        if !self.read_judged {
            return None;
        }
        let read_denied = self.read_denied;
        if read_denied && shell::searches_recursively(seg) {
            return Some(Verdict::new(
                Decision::Deny,
                None,
                "searches recursively, which would read files a Read deny rule covers; the grep tool searches and skips them",
            ));
        }
        let targets = shell::read_targets(seg);
        if targets.is_empty() {
            return None;
        }
        for w in targets {
            if w.dynamic || w.text.contains(['*', '?', '[']) {
                if read_denied {
                    return Some(Verdict::new(
                        Decision::Deny,
                        None,
                        format!(
                            "reads `{}`, a path only known at run time, while Read deny rules exist",
                            w.text
                        ),
                    ));
                }
                continue;
            }
            let abs = self.abs(&w.text, cwd);
            let rel = normalize(self.ownership.root(), &abs.to_string_lossy());
            let spellings = self.spellings(rel, abs);
            let hit = |rules: &[Rule]| Policy::held_by(rules, READ_TOOLS, &spellings);
            if let Some(i) = hit(&self.deny) {
                return Some(Verdict::new(
                    Decision::Deny,
                    Some(&self.deny[i]),
                    format!("reads `{}`, which matches a deny rule", w.text),
                ));
            }
            if let Some(i) = hit(&self.ask) {
                return Some(Verdict::new(
                    Decision::Ask,
                    Some(&self.ask[i]),
                    format!("reads `{}`, which matches an ask rule", w.text),
                ));
            }
        }
        None
    }

    /// The allow rule for a segment: the outermost form allowed outright (e.g.
    /// `Bash(sudo*)`), or the inner command allowed and every wrapper around it
    /// harmless.
    fn allow_hit(&self, view: &SegmentView) -> Option<usize> {
        let seg = view.seg;
        let outer = view.wrapper_lines.first().map(String::as_str).unwrap_or(view.line);
        self.first_allow(outer, seg.open_args && seg.layers.is_empty())
            .or_else(|| {
                let wrappers_benign = seg.layers.iter().all(|l| is_benign_wrapper(l));
                if wrappers_benign {
                    self.first_allow(view.line, seg.open_args)
                } else {
                    None
                }
            })
    }

    /// The first Bash allow rule that matches the command line `l` (`open`: it may get
    /// more arguments than it shows), among the rules for its first word and the
    /// unindexed ones.
    fn first_allow(&self, l: &str, open: bool) -> Option<usize> {
        let first = l.split(' ').next().unwrap_or("");
        let indexed = self.bash_allow_by_word.get(first).map(Vec::as_slice).unwrap_or(&[]);
        // Both lists are in rule order; merge them so the first matching rule wins.
        let (mut a, mut b) = (indexed.iter().peekable(), self.unindexed_bash_allow.iter().peekable());
        while let Some(&i) = match (a.peek(), b.peek()) {
            (Some(x), Some(y)) if x < y => a.next(),
            (Some(_), Some(_)) | (None, Some(_)) => b.next(),
            (Some(_), None) => a.next(),
            (None, None) => None,
        } {
            let hit = match &self.allow[i].spec {
                Spec::Any => true,
                Spec::Command(p) => p.matches_line(l, open),
                Spec::Path(_) | Spec::Literal(_) => false,
            };
            if hit {
                return Some(i);
            }
        }
        None
    }

    fn check_write_word(&self, w: &Word, cwd: Option<&str>) -> Option<Verdict> {
        if w.dynamic {
            return Some(Verdict::new(
                Decision::Deny,
                None,
                format!("writes `{}`, a path only known at run time", w.text),
            ));
        }
        let text = if let Some(rest) = w.text.strip_prefix("~/") {
            format!("{}/{rest}", std::env::var("HOME").unwrap_or_default())
        } else {
            w.text.clone()
        };
        self.check_write(&text, cwd)
    }
}

/// The directory a segment runs in (`None`: the root). A directory only known at
/// run time is the root for rule matching, but writes relative to it are denied.
fn segment_cwd<'s>(seg: &'s Segment, line: &str) -> Result<Option<&'s str>, Verdict> {
    match &seg.cwd {
        Some(w) if w.dynamic => {
            if !seg.writes.is_empty() {
                return Err(Verdict::new(
                    Decision::Deny,
                    None,
                    format!("`{line}` writes relative to a directory only known at run time"),
                ));
            }
            Ok(None)
        }
        Some(w) => Ok(Some(w.text.as_str())),
        None => Ok(None),
    }
}

/// A deny for inline interpreter code that names a builder-owned directory.
fn inline_code_verdict(seg: &Segment) -> Option<Verdict> {
    seg.opaque_code.iter().find_map(|code| {
        mentions_builder_path(code).map(|dir| {
            Verdict::new(
                Decision::Deny,
                None,
                format!("`{}` runs inline code that names builder-owned `{dir}`", seg.program()),
            )
        })
    })
}

/// A shell segment as deny and ask rules see it: its line, the lines of its
/// wrappers, and (built only when a rule names one of its programs) the canonical
/// forms of every layer.
struct SegmentView<'s> {
    seg: &'s Segment,
    line: &'s str,
    program: &'s str,
    wrapper_lines: Vec<String>,
    canons: std::cell::OnceCell<Vec<Canon<'s>>>,
}

impl<'s> SegmentView<'s> {
    fn new(seg: &'s Segment, line: &'s str) -> SegmentView<'s> {
        SegmentView {
            seg,
            line,
            program: seg.program(),
            wrapper_lines: seg.layers.iter().map(|l| shell::join(l)).collect(),
            canons: std::cell::OnceCell::new(),
        }
    }

    /// The wrappers' lines, outermost first, then the segment's own.
    fn lines(&self) -> impl Iterator<Item = &str> {
        self.wrapper_lines
            .iter()
            .map(String::as_str)
            .chain(std::iter::once(self.line))
    }

    fn canons(&self) -> &[Canon<'s>] {
        self.canons.get_or_init(|| {
            self.seg
                .layers
                .iter()
                .map(Vec::as_slice)
                .chain(std::iter::once(self.seg.argv.as_slice()))
                .map(|l| Canon::from_words(l.iter().map(|w| w.text.as_str())))
                .collect()
        })
    }

    /// Is `p` the program of the segment or of one of its wrappers?
    fn has_program(&self, p: &str) -> bool {
        p == self.program
            || self
                .seg
                .layers
                .iter()
                .any(|l| l.first().is_some_and(|w| basename(&w.text) == p))
    }

    /// Does the Bash rule `r` match any layer of the segment, as written or in
    /// canonical form?
    fn matches(&self, r: &Rule) -> bool {
        r.tool == "Bash"
            && match &r.spec {
                Spec::Any => true,
                Spec::Command(p) => {
                    self.lines().any(|l| p.matches_line(l, false))
                        || (p.program().is_some_and(|prog| self.has_program(prog))
                            && self.canons().iter().any(|c| p.matches_canon(c)))
                }
                Spec::Path(_) | Spec::Literal(_) => false,
            }
    }
}

/// Longest path a call may name (Linux PATH_MAX).
pub const MAX_PATH_BYTES: usize = 4096;

/// Paths no tool may use: an embedded NUL, or longer than PATH_MAX.
fn unusable_path(path: &str) -> Option<Verdict> {
    if path.contains('\0') {
        return Some(Verdict::new(Decision::Deny, None, "path contains a NUL byte"));
    }
    if path.len() > MAX_PATH_BYTES {
        return Some(Verdict::new(
            Decision::Deny,
            None,
            format!("path is {} bytes, longer than {MAX_PATH_BYTES}", path.len()),
        ));
    }
    None
}

fn basename(p: &str) -> &str {
    p.rsplit('/').next().unwrap_or(p)
}

fn is_benign_wrapper(layer: &[Word]) -> bool {
    let p = layer
        .first()
        .map(|w| w.text.rsplit('/').next().unwrap_or(&w.text))
        .unwrap_or("");
    matches!(
        p,
        "env" | "timeout" | "nice" | "nohup" | "command" | "builtin" | "stdbuf" | "time" | "ionice" | "xargs" | "find"
    )
}

/// A write target with glob or brace characters could expand to a builder path.
fn glob_reaches_builder(rel: &str) -> bool {
    if !rel.contains(['*', '?', '[', '{']) {
        return false;
    }
    let Ok(g) = Glob::new(rel) else { return true };
    overlapping_builder_dir(&g.compile_matcher(), rel).is_some()
}

/// Does inline interpreter code name a builder-owned directory?
fn mentions_builder_path(code: &str) -> Option<&'static str> {
    BUILDER_DIRS.iter().copied().find(|dir| {
        code.match_indices(dir).any(|(i, _)| {
            let before = code[..i].chars().next_back();
            let after = code[i + dir.len()..].chars().next();
            !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        })
    })
}

#[cfg(test)]
mod tests;
