//! The agent repository's layout and who owns which path (docs/design.md).
//! One function, [`Ownership::classify`], decides whether any path a tool or command
//! names is builder-owned, runtime-owned or neither; builder-owned always wins and a
//! path that escapes the repository is never writable. Everything that guards writes
//! (policy engine, sandbox rules, commit check, audit) asks this module.

use globset::{Glob, GlobSet, GlobSetBuilder};
use std::path::{Component, Path, PathBuf};

/// Top-level directories the builder owns. The runtime never writes below them.
pub const BUILDER_DIRS: &[&str] = &["prompts", "scope", "settings", "tools", "evals", ".git"];
/// Top-level directories the runtime owns (it only ever creates files in them).
pub const RUNTIME_DIRS: &[&str] = &["reports", "cards", "runs"];
/// Whether the repository path `rel` lies under one of the [`RUNTIME_DIRS`].
pub fn in_runtime_dirs(rel: &str) -> bool {
    RUNTIME_DIRS
        .iter()
        .any(|d| rel.strip_prefix(d).is_some_and(|r| r.starts_with('/')))
}

/// The runtime's local, git-ignored state directory.
pub const STATE_DIR: &str = ".runtime";
/// Under [`STATE_DIR`]: where the runtime hands the report to acceptance scripts, the
/// one part of it a tool process sees (read-only).
pub const HANDOFF_DIR: &str = "handoff";
/// Where the boundary document lives.
pub const SCOPE_FILE: &str = "scope/SCOPE.md";
/// Where the runtime settings live.
pub const SETTINGS_FILE: &str = "settings/runtime.yaml";
/// The branch prefix of proposals (never the protected branch).
pub const PROPOSAL_PREFIX: &str = "proposals/";
/// Directory of task prompts.
pub const PROMPTS_DIR: &str = "prompts";

/// Is `task` a valid task name (it becomes a file and directory name: `prompts/<task>.md`,
/// `runs/<task>/`, `reports/<task>/`)?
pub fn valid_task_name(task: &str) -> bool {
    !task.is_empty()
        && task.len() <= 64
        && task.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        && !task.starts_with('-')
}

/// Who may write a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Owner {
    Builder,
    Runtime,
    Neither,
}

/// Ownership rules of one repository: the fixed directories plus what settings add.
#[derive(Debug, Clone)]
pub struct Ownership {
    root: PathBuf,
    extra_builder: Option<GlobSet>,
    granted_write: Option<GlobSet>,
    /// Whether the root exists (checked once; symlink resolution needs it).
    root_exists: bool,
    /// The root as a string, for the absolute-path fast path (empty if not UTF-8).
    root_str: String,
}

impl Ownership {
    /// Ownership with only the fixed builder and runtime directories.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let root_exists = root.exists();
        let root_str = root
            .to_str()
            .map(|r| r.trim_end_matches('/').to_string())
            .filter(|r| !r.is_empty() && !r.split('/').any(|s| s == ".." || s == "."))
            .unwrap_or_default();
        Ownership {
            root,
            extra_builder: None,
            granted_write: None,
            root_exists,
            root_str,
        }
    }

    /// Adds builder-owned globs (from settings `builder_paths`) and write paths the
    /// settings grant to the runtime. Invalid globs are reported by settings loading;
    /// here they are an error too so no caller can silently drop one.
    pub fn with_globs(mut self, extra_builder: &[String], granted_write: &[String]) -> Result<Self, globset::Error> {
        self.extra_builder = compile_globs(extra_builder)?;
        self.granted_write = compile_globs(granted_write)?;
        Ok(self)
    }

    /// Do settings add builder-owned globs beyond the fixed directories?
    pub fn has_extra_builder_paths(&self) -> bool {
        self.extra_builder.is_some()
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Classifies `path` (relative to the repo root, or absolute) lexically.
    pub fn classify(&self, path: &str) -> Owner {
        if self.extra_builder.is_none() && self.granted_write.is_none() {
            // Without globs only the first component decides: find it without
            // allocating, for relative paths and absolute ones under the root.
            let rel = if path.starts_with('/') {
                path.strip_prefix(self.root_str.as_str())
                    .filter(|_| !self.root_str.is_empty())
                    .and_then(|r| r.strip_prefix('/'))
                    .filter(|r| !r.split('/').any(|s| s == ".."))
            } else {
                Some(path)
            };
            if let Some(rel) = rel {
                match first_component(rel) {
                    FirstComponent::Escapes => return Owner::Neither,
                    FirstComponent::Is(first) => return self.classify_normalized(first),
                    FirstComponent::TooDeep => {}
                }
            }
        }
        match normalize(&self.root, path) {
            None => Owner::Neither,
            Some(rel) => self.classify_normalized(&rel),
        }
    }

    /// Classifies `path` after resolving symlinks in the part of it that exists, so a
    /// link in `reports/` that points into `prompts/` is classified by its target.
    pub fn classify_resolved(&self, path: &str) -> Owner {
        let lexical = self.classify(path);
        if lexical == Owner::Builder {
            return lexical;
        }
        if !self.root_exists {
            return lexical;
        }
        match resolve_existing(&self.root, path) {
            Some(rel) => {
                let resolved = self.classify_normalized(&rel);
                if resolved == Owner::Builder || lexical == Owner::Neither {
                    resolved
                } else {
                    lexical.min_trust(resolved)
                }
            }
            None => Owner::Neither,
        }
    }

    /// Classifies an already normalised repo-relative path (`a/b`, no `..`).
    pub fn classify_normalized(&self, rel: &str) -> Owner {
        let first = rel.split('/').next().unwrap_or("");
        if BUILDER_DIRS.contains(&first) || self.extra_builder.as_ref().is_some_and(|g| g.is_match(rel)) {
            return Owner::Builder;
        }
        if RUNTIME_DIRS.contains(&first) || self.granted_write.as_ref().is_some_and(|g| g.is_match(rel)) {
            return Owner::Runtime;
        }
        Owner::Neither
    }

    /// Is `rel` (normalised) under a builder-owned directory or glob, or a parent of one
    /// (deleting or renaming a parent would take builder files with it)?
    pub fn touches_builder(&self, rel: &str) -> bool {
        rel.is_empty() || rel == "." || self.classify_normalized(rel) == Owner::Builder
    }
}

impl Owner {
    fn min_trust(self, other: Owner) -> Owner {
        match (self, other) {
            (Owner::Builder, _) | (_, Owner::Builder) => Owner::Builder,
            (Owner::Neither, _) | (_, Owner::Neither) => Owner::Neither,
            (Owner::Runtime, Owner::Runtime) => Owner::Runtime,
        }
    }
}

/// Returns the builder directory a write glob could match, if any (settings reject
/// such a write ACL; the policy engine denies such a glob-shaped write target).
pub fn overlapping_builder_dir(m: &globset::GlobMatcher, raw: &str) -> Option<&'static str> {
    overlapping_dir(BUILDER_DIRS, m, raw)
}

/// Directories only the runtime process writes (receipts and cards): the model asks
/// for a card through a tool or its final answer, it never writes one.
pub const RECORD_DIRS: &[&str] = &["runs", "cards"];

/// A receipt's path (`runs/<task>/<day>/<run>.json`): written by the runtime alone.
pub fn is_receipt_path(path: &str) -> bool {
    path.starts_with("runs/") && path.ends_with(".json")
}

/// Whether a write glob reaches the runtime's state directory ([`STATE_DIR`]: its
/// database, its walk memo, the report it hands to acceptance scripts).
pub fn overlaps_state_dir(m: &globset::GlobMatcher, raw: &str) -> bool {
    overlapping_dir(&[STATE_DIR], m, raw).is_some()
}

/// The record directory (`runs`, `cards`) a write glob reaches, if any.
pub fn overlapping_record_dir(m: &globset::GlobMatcher, raw: &str) -> Option<&'static str> {
    // Also the shapes of real records, so `**/*.json` (a forged receipt) is caught.
    let record_shape = |dir: &str| {
        ["t/2026-01-01/r.json", "2026-01-01/c.yaml", "t/2026-01-01/r.report.md"]
            .iter()
            .any(|tail| m.is_match(format!("{dir}/{tail}")))
    };
    overlapping_dir(RECORD_DIRS, m, raw).or_else(|| RECORD_DIRS.iter().copied().find(|d| record_shape(d)))
}

fn overlapping_dir(dirs: &[&'static str], m: &globset::GlobMatcher, raw: &str) -> Option<&'static str> {
    dirs.iter().copied().find(|dir| {
        m.is_match(dir)
            || m.is_match(format!("{dir}/x"))
            || m.is_match(format!("{dir}/a/b.md"))
            || raw.trim_start_matches("./").starts_with(&format!("{dir}/"))
    })
}

/// The literal directory prefix of a glob: the components before the first one
/// holding a glob character (`docs/policy/**` -> `docs/policy`, `docs/*.md` -> `docs`,
/// `**/*.md` -> ``). For a write glob it is what the kernel sandbox grants beneath.
pub fn literal_prefix(glob: &str) -> String {
    let glob = glob.trim_start_matches("./").trim_end_matches('/');
    let mut out: Vec<&str> = Vec::new();
    for part in glob.split('/') {
        if part.contains(['*', '?', '[', '{', '\\']) {
            break;
        }
        out.push(part);
    }
    out.retain(|p| !p.is_empty() && *p != ".");
    out.join("/")
}

/// Whether the repo-relative `a` is `b` or lies beneath it (`b` empty: everything
/// does).
pub fn at_or_beneath(a: &str, b: &str) -> bool {
    b.is_empty() || a == b || (a.len() > b.len() && a.starts_with(b) && a.as_bytes()[b.len()] == b'/')
}

/// The `builder_paths` globs whose paths the write ACL reaches, each with the write
/// glob (or the directory the sandbox grants for it) that reaches it: tools could
/// write, remove or replace files the approval names. A write glob reaches what its
/// literal directory holds (the kernel grants `docs/` for `docs/*.md`), and a
/// builder glob without a literal directory (`**/*.md`) may match anywhere.
pub fn builder_paths_in_reach(builder_paths: &[String], write: &[String]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for b in builder_paths {
        let bp = literal_prefix(b);
        let matcher = Glob::new(b.trim_end_matches('/')).ok().map(|g| g.compile_matcher());
        for w in write {
            let wd = literal_prefix(w);
            let reaches = at_or_beneath(&bp, &wd)
                || at_or_beneath(&wd, &bp)
                || matcher
                    .as_ref()
                    .is_some_and(|m| m.is_match(&wd) || m.is_match(format!("{wd}/x")));
            if reaches {
                out.push((b.clone(), if wd.is_empty() { w.clone() } else { format!("{wd}/") }));
            }
        }
    }
    out
}

pub(crate) fn compile_globs(globs: &[String]) -> Result<Option<GlobSet>, globset::Error> {
    if globs.is_empty() {
        return Ok(None);
    }
    let mut b = GlobSetBuilder::new();
    for g in globs {
        b.add(Glob::new(g.trim_end_matches('/'))?);
        // `reports/**` should also cover the directory itself.
        if let Some(dir) = g.strip_suffix("/**") {
            b.add(Glob::new(dir)?);
        }
    }
    Ok(Some(b.build()?))
}

enum FirstComponent<'a> {
    Is(&'a str),
    Escapes,
    TooDeep,
}

/// The first component of a relative path after folding `.`, `..` and `//`, using a
/// fixed stack (no allocation); `TooDeep` past 32 levels.
fn first_component(rel: &str) -> FirstComponent<'_> {
    let mut stack: [&str; 32] = [""; 32];
    let mut n = 0;
    for seg in rel.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                if n == 0 {
                    return FirstComponent::Escapes;
                }
                n -= 1;
            }
            s => {
                if n == stack.len() {
                    return FirstComponent::TooDeep;
                }
                stack[n] = s;
                n += 1;
            }
        }
    }
    FirstComponent::Is(stack[0])
}

/// Lexically normalises `path` to a repo-relative `a/b/c` string: strips the root
/// when absolute, folds `.`, `..`, `//` and trailing `/`. `None` when it escapes.
pub fn normalize(root: &Path, path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::with_capacity(8);
    if path.starts_with('/') {
        // Fold the whole absolute path first (`/repo/x/../../repo/prompts`); `/..`
        // stays at `/` as in the kernel.
        fold_into(path, &mut parts);
        let mut root_parts: Vec<&str> = Vec::with_capacity(8);
        fold_into(root.to_str()?, &mut root_parts);
        if parts.len() < root_parts.len() || parts[..root_parts.len()] != root_parts[..] {
            return None;
        }
        return Some(parts[root_parts.len()..].join("/"));
    }
    for seg in path.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    Some(parts.join("/"))
}

fn fold_into<'a>(abs: &'a str, parts: &mut Vec<&'a str>) {
    for seg in abs.split('/') {
        match seg {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
}

fn join_rel(p: &Path) -> Option<String> {
    let parts: Option<Vec<&str>> = p.components().map(|c| c.as_os_str().to_str()).collect();
    Some(parts?.join("/"))
}

/// Folds `.` and `..` in an absolute path without touching the filesystem.
fn fold(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    Some(out)
}

/// Resolves symlinks in the longest existing prefix of `path` and re-relativises it
/// to the (canonical) root. `None` when the result is outside the repository.
pub fn resolve_existing(root: &Path, path: &str) -> Option<String> {
    let root_c = root.canonicalize().ok()?;
    let joined = if Path::new(path).is_absolute() {
        PathBuf::from(path)
    } else {
        root.join(path)
    };
    let folded = fold(&joined)?;
    let mut existing = folded.clone();
    let mut rest: Vec<std::ffi::OsString> = Vec::new();
    loop {
        // A dangling symlink: resolve through its target text.
        if let Ok(meta) = std::fs::symlink_metadata(&existing) {
            if meta.file_type().is_symlink() && std::fs::metadata(&existing).is_err() {
                let target = std::fs::read_link(&existing).ok()?;
                let parent = existing.parent()?.to_path_buf();
                let t = if target.is_absolute() {
                    target
                } else {
                    parent.join(target)
                };
                let mut full = fold(&t)?;
                for r in rest.iter().rev() {
                    full.push(r);
                }
                return resolve_existing(root, full.to_str()?);
            }
            break;
        }
        let name = existing.file_name()?.to_os_string();
        rest.push(name);
        if !existing.pop() {
            return None;
        }
    }
    let mut resolved = existing.canonicalize().ok()?;
    for r in rest.iter().rev() {
        resolved.push(r);
    }
    let rel = resolved.strip_prefix(&root_c).ok()?;
    join_rel(rel)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own() -> Ownership {
        Ownership::new("/repo")
            .with_globs(&["docs/policy/**".into()], &["out/**".into()])
            .unwrap()
    }

    #[test]
    fn classifies_fixed_dirs() {
        let o = own();
        for p in [
            "prompts/x.md",
            "scope/SCOPE.md",
            "settings",
            "tools/a.sh",
            "evals/t/a.yaml",
            ".git/config",
        ] {
            assert_eq!(o.classify(p), Owner::Builder, "{p}");
        }
        for p in ["reports/t/a.md", "cards/2026-01-01/c.yaml", "runs", "out/x"] {
            assert_eq!(o.classify(p), Owner::Runtime, "{p}");
        }
        assert_eq!(o.classify("README.md"), Owner::Neither);
        assert_eq!(o.classify("docs/policy/a.md"), Owner::Builder);
        assert_eq!(o.classify("docs/other.md"), Owner::Neither);
    }

    #[test]
    fn normalises_tricks() {
        let o = own();
        assert_eq!(o.classify("./prompts/../prompts/x"), Owner::Builder);
        assert_eq!(o.classify("reports/../prompts/x"), Owner::Builder);
        assert_eq!(o.classify("reports//../prompts//x"), Owner::Builder);
        assert_eq!(o.classify("/repo/prompts/x"), Owner::Builder);
        assert_eq!(o.classify("/repo/./reports/../settings/"), Owner::Builder);
        assert_eq!(o.classify("/repo/x/../../repo/prompts/a"), Owner::Builder);
        assert_eq!(o.classify("prompts/"), Owner::Builder);
        assert_eq!(o.classify("reports/a/"), Owner::Runtime);
    }

    #[test]
    fn escapes_are_neither() {
        let o = own();
        assert_eq!(o.classify("../outside"), Owner::Neither);
        assert_eq!(o.classify("reports/../../x"), Owner::Neither);
        assert_eq!(o.classify("/etc/passwd"), Owner::Neither);
        assert_eq!(o.classify("/repo2/prompts/x"), Owner::Neither);
    }

    #[test]
    fn builder_wins_over_granted_write() {
        let o = Ownership::new("/repo").with_globs(&[], &["prompts/**".into()]).unwrap();
        assert_eq!(o.classify("prompts/x"), Owner::Builder);
    }

    #[test]
    fn symlinks_resolve_to_their_target() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("reports")).unwrap();
        std::fs::create_dir_all(root.join("prompts")).unwrap();
        std::os::unix::fs::symlink(root.join("prompts"), root.join("reports/link")).unwrap();
        std::os::unix::fs::symlink("../prompts/new.md", root.join("reports/dangling")).unwrap();
        let o = Ownership::new(root);
        assert_eq!(o.classify("reports/link/x.md"), Owner::Runtime);
        assert_eq!(o.classify_resolved("reports/link/x.md"), Owner::Builder);
        assert_eq!(o.classify_resolved("reports/dangling"), Owner::Builder);
        assert_eq!(o.classify_resolved("reports/plain.md"), Owner::Runtime);
    }

    #[test]
    fn write_globs_that_reach_builder_paths_are_caught() {
        for g in [
            "**",
            "*/x",
            "prompts/**",
            "./settings/a",
            "{reports,tools}/**",
            ".git/hooks/*",
        ] {
            let m = globset::Glob::new(g).unwrap().compile_matcher();
            assert!(overlapping_builder_dir(&m, g).is_some(), "{g}");
        }
        for g in ["reports/**", "cards/**", "out/*.txt"] {
            let m = globset::Glob::new(g).unwrap().compile_matcher();
            assert!(overlapping_builder_dir(&m, g).is_none(), "{g}");
        }
    }

    #[test]
    fn literal_prefixes_stop_at_the_first_glob_component() {
        for (glob, want) in [
            ("docs/policy/**", "docs/policy"),
            ("docs/*.md", "docs"),
            ("**/*.md", ""),
            ("./lib/x.sh", "lib/x.sh"),
            ("lib/", "lib"),
            ("a/{b,c}/d", "a"),
            ("out/a*/b", "out"),
        ] {
            assert_eq!(literal_prefix(glob), want, "{glob}");
        }
        // What the sandbox grants for a write glob (its literal directory, as the
        // sandbox's `acl_dirs` computes it).
        for (glob, dir) in [
            ("reports/**", "reports"),
            ("out/a/*.txt", "out/a"),
            ("./logs/x.log", "logs/x.log"),
        ] {
            assert_eq!(literal_prefix(glob), dir, "{glob}");
        }
    }

    #[test]
    fn a_write_acl_that_reaches_builder_paths_is_caught() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        // The kernel grants `docs/` for `docs/*.md`: `docs/policy` is reachable.
        assert_eq!(
            builder_paths_in_reach(&s(&["docs/policy/**"]), &s(&["docs/*.md"])),
            vec![("docs/policy/**".to_string(), "docs/".to_string())]
        );
        assert_eq!(
            builder_paths_in_reach(&s(&["docs/**"]), &s(&["docs/out/*.md"])).len(),
            1
        );
        assert_eq!(
            builder_paths_in_reach(&s(&["**/*.policy"]), &s(&["reports/**"])).len(),
            1
        );
        assert!(builder_paths_in_reach(&s(&["docs/policy/**"]), &s(&["reports/**", "out/*.txt"])).is_empty());
    }

    #[test]
    fn write_globs_that_reach_record_dirs_are_caught() {
        for g in [
            "cards/**",
            "runs/t/*.json",
            "{reports,cards}/**",
            "**/*.json",
            "**/*.yaml",
        ] {
            let m = globset::Glob::new(g).unwrap().compile_matcher();
            assert!(overlapping_record_dir(&m, g).is_some(), "{g}");
        }
        for g in ["reports/**", "out/*.txt", "reports/*/cards/**"] {
            let m = globset::Glob::new(g).unwrap().compile_matcher();
            assert!(overlapping_record_dir(&m, g).is_none(), "{g}");
        }
    }
}
