//! `builder init`: scaffold an agent repository (docs/design.md) with the example
//! task this repository itself ships. The templates are the top-level files of this
//! repo, compiled in, so the scaffold and the working example never drift apart.
//! Idempotent: an existing file is never overwritten, and a second run changes nothing.
//! It also installs the hooks (`crate::review::hooks`), as `builder install-hooks` does.

use std::path::{Path, PathBuf};

/// (repo-relative path, contents, executable)
pub const TEMPLATES: &[(&str, &str, bool)] = &[
    ("prompts/digest.md", include_str!("../../prompts/digest.md"), false),
    ("scope/SCOPE.md", include_str!("../../scope/SCOPE.md"), false),
    (
        "settings/runtime.yaml",
        include_str!("../../settings/runtime.yaml"),
        false,
    ),
    (
        "tools/digest-context.sh",
        include_str!("../../tools/digest-context.sh"),
        true,
    ),
    (
        "evals/digest/replay.json",
        include_str!("../../evals/digest/replay.json"),
        false,
    ),
    (
        "evals/digest/basic.yaml",
        include_str!("../../evals/digest/basic.yaml"),
        false,
    ),
    ("cards/.gitkeep", "", false),
    ("reports/.gitkeep", "", false),
    ("runs/.gitkeep", "", false),
];

/// Lines every agent repo's `.gitignore` must hold.
pub const GITIGNORE_LINES: &[&str] = &[".runtime/"];

/// What `init` did.
#[derive(Debug, Default)]
pub struct InitReport {
    pub created: Vec<PathBuf>,
    pub kept: Vec<PathBuf>,
    pub git_initialised: bool,
    /// What installing the hooks did.
    pub hooks: Option<crate::review::hooks::Installed>,
}

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: git init failed: {source}")]
    Git { path: PathBuf, source: git2::Error },
    #[error("installing the hooks: {0}")]
    Hooks(#[from] crate::review::ReviewError),
}

/// Scaffolds the agent repo at `root`.
pub fn init(root: &Path) -> Result<InitReport, InitError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |e| InitError::Io {
            path: path.clone(),
            source: e,
        }
    };
    std::fs::create_dir_all(root).map_err(io(root))?;
    let mut report = InitReport::default();
    let repo = match git2::Repository::open(root) {
        Ok(r) => r,
        Err(_) => {
            report.git_initialised = true;
            let mut opts = git2::RepositoryInitOptions::new();
            opts.initial_head("main");
            git2::Repository::init_opts(root, &opts).map_err(|e| InitError::Git {
                path: root.to_path_buf(),
                source: e,
            })?
        }
    };
    for (rel, body, exec) in TEMPLATES {
        let path = root.join(rel);
        if create_if_missing(&path, body.as_bytes(), *exec).map_err(io(&path))? {
            report.created.push(PathBuf::from(rel));
        } else {
            report.kept.push(PathBuf::from(rel));
        }
    }
    let gi = root.join(".gitignore");
    let existing = std::fs::read_to_string(&gi).unwrap_or_default();
    let missing: Vec<&str> = GITIGNORE_LINES
        .iter()
        .copied()
        .filter(|l| !existing.lines().any(|e| e.trim() == *l))
        .collect();
    if !missing.is_empty() {
        // Appending a missing ignore line is the one edit init makes to an existing file.
        let mut text = existing.clone();
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        for l in &missing {
            text.push_str(l);
            text.push('\n');
        }
        std::fs::write(&gi, text).map_err(io(&gi))?;
        report.created.push(PathBuf::from(".gitignore"));
    } else {
        report.kept.push(PathBuf::from(".gitignore"));
    }
    // What `builder install-hooks` does: the refspecs that carry approvals, and the
    // pre-push audit hook (fails closed without `builder` on PATH).
    let hooks = crate::review::hooks::install(&repo)?;
    if hooks.hook_state == crate::review::hooks::HookState::Created {
        report.created.push(PathBuf::from(".git/hooks/pre-push"));
    }
    report.hooks = Some(hooks);
    Ok(report)
}

fn create_if_missing(path: &Path, body: &[u8], exec: bool) -> std::io::Result<bool> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true).mode(if exec { 0o755 } else { 0o644 });
    match opts.open(path) {
        Ok(mut f) => {
            f.write_all(body)?;
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_twice_changes_nothing_and_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("agent");
        let first = init(&root).unwrap();
        assert!(first.git_initialised);
        assert!(first.created.contains(&PathBuf::from("prompts/digest.md")));
        std::fs::write(root.join("prompts/digest.md"), "mine").unwrap();
        let snapshot = |r: &Path| -> Vec<(PathBuf, Vec<u8>)> {
            let mut v: Vec<(PathBuf, Vec<u8>)> = TEMPLATES
                .iter()
                .map(|(p, _, _)| (PathBuf::from(p), std::fs::read(r.join(p)).unwrap()))
                .collect();
            v.push((".gitignore".into(), std::fs::read(r.join(".gitignore")).unwrap()));
            v
        };
        let before = snapshot(&root);
        let second = init(&root).unwrap();
        assert!(!second.git_initialised);
        assert!(second.created.is_empty(), "{:?}", second.created);
        assert_eq!(snapshot(&root), before);
        assert_eq!(std::fs::read_to_string(root.join("prompts/digest.md")).unwrap(), "mine");
    }

    #[test]
    fn init_in_a_linked_worktree_puts_the_hook_where_git_runs_it() {
        let dir = tempfile::tempdir().unwrap();
        let (main, linked) = crate::git::linked_worktree_fixture(dir.path());
        let report = init(&linked).unwrap();
        assert!(!report.git_initialised, "the worktree is a repository already");
        assert!(report.created.contains(&PathBuf::from(".git/hooks/pre-push")));
        assert!(main.join(".git/hooks/pre-push").is_file(), "the common dir's hooks");
        assert!(linked.join(".git").is_file(), "the .git file is left alone");
    }
}
