//! `builder install-hooks` (and `builder init`): make every clone carry approvals and
//! audit before it pushes. Adds `+refs/builder/*:refs/builder/*` to every remote's
//! fetch and push refspecs, and installs a pre-push hook that runs `builder audit` and
//! fails closed when `builder` is not on PATH. Idempotent: a second run changes
//! nothing. A pre-push hook builder did not write is left alone and reported.
//!
//! A remote with no push refspec of its own also gets `HEAD`: once any push refspec is
//! configured, a bare `git push` pushes only the configured ones, so without it the
//! current branch would stop being pushed.

use super::{ReviewError, BUILDER_REFSPEC};
use git2::Repository;
use std::path::PathBuf;

/// The pre-push hook: audit, and refuse to push when the audit cannot run.
pub const PRE_PUSH_HOOK: &str = "#!/bin/sh\n\
# Installed by `builder install-hooks`: refuse to push history that breaks the\n\
# builder/runtime invariant or carries unapproved builder changes under review.\n\
if ! command -v builder >/dev/null 2>&1; then\n\
  echo \"pre-push: builder is not on PATH, so \\`builder audit\\` cannot run: refusing to push.\" >&2\n\
  echo \"pre-push: install builder (or put it on PATH); git push --no-verify skips this check on purpose.\" >&2\n\
  exit 1\n\
fi\n\
exec builder audit\n";

/// A line every hook builder wrote contains (older ones said `builder init`).
const MARKER: &str = "# Installed by `builder ";

/// What happened to the hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookState {
    Created,
    Updated,
    Unchanged,
    /// Someone else's hook is there; it was not touched.
    Foreign,
}

/// What `install` did.
#[derive(Debug, Clone)]
pub struct Installed {
    /// `remote.<name>.fetch` / `.push` values added, as `remote.<name>.<key> <value>`.
    pub refspecs: Vec<String>,
    pub hook: PathBuf,
    pub hook_state: HookState,
}

/// Where hooks live: `core.hooksPath` when set (relative to the work tree), else the
/// common git directory's `hooks/` (shared by linked worktrees).
pub fn hooks_dir(repo: &Repository) -> PathBuf {
    let configured = repo
        .config()
        .and_then(|mut c| c.snapshot())
        .and_then(|c| c.get_path("core.hooksPath"));
    match configured {
        Ok(p) if p.is_absolute() => p,
        Ok(p) => repo.workdir().unwrap_or_else(|| repo.commondir()).join(p),
        Err(_) => repo.commondir().join("hooks"),
    }
}

/// Adds the refspecs and installs the hook.
pub fn install(repo: &Repository) -> Result<Installed, ReviewError> {
    let mut refspecs = Vec::new();
    let mut config = repo.config()?;
    for name in repo.remotes()?.iter().flatten().flatten() {
        for key in ["fetch", "push"] {
            let var = format!("remote.{name}.{key}");
            let existing = multivar(&config, &var)?;
            if key == "push" && existing.is_empty() {
                config.set_multivar(&var, "^$", "HEAD")?;
                refspecs.push(format!("{var} HEAD"));
            }
            if !existing.iter().any(|v| v == BUILDER_REFSPEC) {
                config.set_multivar(&var, "^$", BUILDER_REFSPEC)?;
                refspecs.push(format!("{var} {BUILDER_REFSPEC}"));
            }
        }
    }
    let dir = hooks_dir(repo);
    let hook = dir.join("pre-push");
    let io = |e| ReviewError::Io {
        path: hook.clone(),
        source: e,
    };
    let hook_state = match std::fs::read_to_string(&hook) {
        // Made non-executable (git then skips it without a word): set it back.
        Ok(text) if text == PRE_PUSH_HOOK && !is_executable(&hook) => {
            write_hook(&hook).map_err(io)?;
            HookState::Updated
        }
        Ok(text) if text == PRE_PUSH_HOOK => HookState::Unchanged,
        Ok(text) if text.contains(MARKER) => {
            write_hook(&hook).map_err(io)?;
            HookState::Updated
        }
        Ok(_) => HookState::Foreign,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(&dir).map_err(|e| ReviewError::Io {
                path: dir.clone(),
                source: e,
            })?;
            write_hook(&hook).map_err(io)?;
            HookState::Created
        }
        Err(e) => return Err(io(e)),
    };
    Ok(Installed {
        refspecs,
        hook,
        hook_state,
    })
}

fn multivar(config: &git2::Config, var: &str) -> Result<Vec<String>, git2::Error> {
    let mut out = Vec::new();
    let mut entries = match config.multivar(var, None) {
        Ok(e) => e,
        Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    while let Some(entry) = entries.next() {
        if let Ok(v) = entry?.value() {
            out.push(v.to_string());
        }
    }
    Ok(out)
}

fn is_executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.permissions().mode() & 0o111 == 0o111)
}

fn write_hook(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, PRE_PUSH_HOOK)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_adds_refspecs_once_and_keeps_foreign_hooks() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        repo.remote("origin", "/nowhere/origin.git").unwrap();
        let first = install(&repo).unwrap();
        assert_eq!(first.hook_state, HookState::Created);
        assert_eq!(first.refspecs.len(), 3, "{:?}", first.refspecs);
        let config = repo.config().unwrap().snapshot().unwrap();
        let fetch = multivar(&config, "remote.origin.fetch").unwrap();
        assert!(
            fetch.contains(&"+refs/heads/*:refs/remotes/origin/*".to_string()),
            "{fetch:?}"
        );
        assert!(fetch.contains(&BUILDER_REFSPEC.to_string()));
        assert_eq!(
            multivar(&config, "remote.origin.push").unwrap(),
            vec!["HEAD".to_string(), BUILDER_REFSPEC.to_string()]
        );
        let second = install(&repo).unwrap();
        assert!(second.refspecs.is_empty());
        assert_eq!(second.hook_state, HookState::Unchanged);
        // Made non-executable, git would skip it without a word: set back.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&first.hook, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(install(&repo).unwrap().hook_state, HookState::Updated);
        let mode = std::fs::metadata(&first.hook).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o755);
        std::fs::write(&first.hook, "#!/bin/sh\necho mine\n").unwrap();
        assert_eq!(install(&repo).unwrap().hook_state, HookState::Foreign);
        assert_eq!(std::fs::read_to_string(&first.hook).unwrap(), "#!/bin/sh\necho mine\n");
    }

    #[test]
    fn a_linked_worktree_installs_into_the_common_hooks() {
        let dir = tempfile::tempdir().unwrap();
        let (main, linked) = crate::git::linked_worktree_fixture(dir.path());
        let wt = Repository::open(&linked).unwrap();
        let done = install(&wt).unwrap();
        assert_eq!(done.hook, main.join(".git/hooks/pre-push"));
        assert!(done.hook.is_file());
    }
}
