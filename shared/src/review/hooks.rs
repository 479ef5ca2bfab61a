//! `builder install-hooks` (and `builder init`): make every clone carry approvals and
//! judge what it pushes. Each remote gets the non-forced refspec
//! [`APPROVALS_REFSPEC`] for fetch and push (a forced `+refs/builder/*` refspec of
//! earlier versions is replaced: it let a `git pull` replace approvals not pushed
//! yet) and `remote.<name>.prune false` (a pruning fetch would delete approvals the
//! origin lost); the repository gets `pull.rebase false`, so `git pull` merges the
//! origin's new commits (the box's records) and keeps an approved merge as it is (a
//! rebase would flatten it into commits no approval covers). The pre-push hook runs
//! `builder audit --pre-push <remote>`, which judges only the new commits git is about
//! to push to the protected branch ([`super::pushed`]), and fails closed when
//! `builder` is not on PATH. Idempotent: a second run changes nothing. A pre-push hook
//! builder did not write is left alone and reported. A legacy approvals chain is
//! converted into per-approval refs once ([`super::approvals::adopt_legacy`]).
//!
//! A remote with no push refspec of its own also gets `HEAD`: once any push refspec is
//! configured, a bare `git push` pushes only the configured ones, so without it the
//! current branch would stop being pushed.

use super::{ReviewError, APPROVALS_REFSPEC, BUILDER_REFSPEC};
use git2::Repository;
use std::path::PathBuf;

/// The pre-push hook: judge what is pushed, and refuse to push when that cannot run.
pub const PRE_PUSH_HOOK: &str = "#!/bin/sh\n\
# Installed by `builder install-hooks`: refuse to push new commits to the protected\n\
# branch that break the builder/runtime invariant or carry unapproved builder changes.\n\
if ! command -v builder >/dev/null 2>&1; then\n\
  echo \"pre-push: builder is not on PATH, so \\`builder audit --pre-push\\` cannot run: refusing to push.\" >&2\n\
  echo \"pre-push: install builder (or put it on PATH); git push --no-verify skips this check on purpose.\" >&2\n\
  exit 1\n\
fi\n\
exec builder audit --pre-push \"$1\"\n";

/// A line every hook builder wrote contains (older ones said `builder init`).
const MARKER: &str = "# Installed by `builder ";

/// The repository settings `install` makes, as `(key, value)`.
pub const PULL_SETTINGS: &[(&str, &str)] = &[("pull.rebase", "false")];

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
    /// Forced refspecs of earlier versions removed, likewise.
    pub removed: Vec<String>,
    /// Other settings made, as `<key> <value>`.
    pub settings: Vec<String>,
    /// Approvals of the legacy chain given refs of their own.
    pub adopted: usize,
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

/// Adds the refspecs and settings, converts a legacy approvals chain, and installs
/// the hook. The config's lock is named in an intent record first, so a process
/// killed while writing it leaves nothing the next run cannot remove.
pub fn install(repo: &Repository) -> Result<Installed, ReviewError> {
    let _intent = match repo.workdir() {
        Some(_) => Some(crate::git::LockIntent::hold(
            &super::work::intent_dir(repo),
            &[crate::git::lock_file_of(&repo.commondir().join("config"))],
        )?),
        None => None,
    };
    let mut refspecs = Vec::new();
    let mut removed = Vec::new();
    let mut settings = Vec::new();
    let mut config = repo.config()?.open_level(git2::ConfigLevel::Local)?;
    for name in repo.remotes()?.iter().flatten().flatten() {
        for key in ["fetch", "push"] {
            let var = format!("remote.{name}.{key}");
            let existing = multivar(&config, &var)?;
            if existing.iter().any(|v| v == BUILDER_REFSPEC) {
                config.remove_multivar(&var, &regex_literal(BUILDER_REFSPEC))?;
                removed.push(format!("{var} {BUILDER_REFSPEC}"));
            }
            let remaining = multivar(&config, &var)?;
            if key == "push" && remaining.is_empty() {
                config.set_multivar(&var, "^$", "HEAD")?;
                refspecs.push(format!("{var} HEAD"));
            }
            if !remaining.iter().any(|v| v == APPROVALS_REFSPEC) {
                config.set_multivar(&var, "^$", APPROVALS_REFSPEC)?;
                refspecs.push(format!("{var} {APPROVALS_REFSPEC}"));
            }
        }
        let prune = format!("remote.{name}.prune");
        if config.get_bool(&prune).ok() != Some(false) {
            config.set_bool(&prune, false)?;
            settings.push(format!("{prune} false"));
        }
    }
    for (key, value) in PULL_SETTINGS {
        if config.get_string(key).ok().as_deref() != Some(*value) {
            config.set_str(key, value)?;
            settings.push(format!("{key} {value}"));
        }
    }
    drop(config);
    let adopted = super::approvals::adopt_legacy(repo)?;
    let (hook, hook_state) = install_hook(repo)?;
    Ok(Installed {
        refspecs,
        removed,
        settings,
        adopted,
        hook,
        hook_state,
    })
}

/// Writes the pre-push hook where git looks for it, unless a hook of someone else's
/// is there; says what it found.
fn install_hook(repo: &Repository) -> Result<(PathBuf, HookState), ReviewError> {
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
    Ok((hook, hook_state))
}

/// `text` as a regular expression matching exactly it (git's config takes a regex
/// for the value of a multivar to remove).
fn regex_literal(text: &str) -> String {
    format!("^{}$", regex::escape(text))
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

/// Writes the hook whole or not at all (a temporary file renamed over it): a
/// process killed mid-write never leaves a truncated hook, which the next install
/// would take for someone else's and leave alone.
fn write_hook(path: &std::path::Path) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("builder-tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(PRE_PUSH_HOOK.as_bytes())?;
    f.set_permissions(std::fs::Permissions::from_mode(0o755))?;
    f.sync_all()?;
    crate::failpoint!("install-hooks-before-rename");
    std::fs::rename(&tmp, path)
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
        assert!(
            first.settings.contains(&"pull.rebase false".to_string()),
            "{:?}",
            first.settings
        );
        let config = repo.config().unwrap().snapshot().unwrap();
        let fetch = multivar(&config, "remote.origin.fetch").unwrap();
        assert!(
            fetch.contains(&"+refs/heads/*:refs/remotes/origin/*".to_string()),
            "{fetch:?}"
        );
        assert!(fetch.contains(&APPROVALS_REFSPEC.to_string()));
        assert_eq!(
            multivar(&config, "remote.origin.push").unwrap(),
            vec!["HEAD".to_string(), APPROVALS_REFSPEC.to_string()]
        );
        assert_eq!(config.get_bool("remote.origin.prune").ok(), Some(false));
        let second = install(&repo).unwrap();
        assert!(second.refspecs.is_empty() && second.settings.is_empty());
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
    fn the_forced_refspec_of_earlier_versions_is_replaced_and_the_legacy_chain_adopted() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        repo.remote("origin", "/nowhere/origin.git").unwrap();
        let mut config = repo.config().unwrap();
        config
            .set_multivar("remote.origin.fetch", "^$", BUILDER_REFSPEC)
            .unwrap();
        config.set_multivar("remote.origin.push", "^$", "HEAD").unwrap();
        config
            .set_multivar("remote.origin.push", "^$", BUILDER_REFSPEC)
            .unwrap();
        // A legacy chain of two approvals.
        let sig = git2::Signature::now("Rev", "rev@example.com").unwrap();
        let mut parent: Option<git2::Oid> = None;
        for p in ["a", "b"] {
            let body = crate::review::approvals::ApprovalBody {
                proposal: p.into(),
                tree: git2::Oid::ZERO_SHA1.to_string(),
                approver: "Rev <rev@example.com>".into(),
                approved_at: chrono::Utc::now(),
                head: None,
                signature: None,
            };
            let blob = repo.blob(serde_yaml::to_string(&body).unwrap().as_bytes()).unwrap();
            let mut tb = repo.treebuilder(None).unwrap();
            tb.insert("approval.yaml", blob, 0o100644).unwrap();
            let tree = repo.find_tree(tb.write().unwrap()).unwrap();
            let parents: Vec<git2::Commit> = parent.iter().map(|p| repo.find_commit(*p).unwrap()).collect();
            let refs: Vec<&git2::Commit> = parents.iter().collect();
            parent = Some(
                repo.commit(Some(super::super::APPROVALS_REF), &sig, &sig, "a", &tree, &refs)
                    .unwrap(),
            );
        }
        let done = install(&repo).unwrap();
        assert_eq!(done.removed.len(), 2, "{:?}", done.removed);
        assert_eq!(done.adopted, 2);
        let config = repo.config().unwrap().snapshot().unwrap();
        let fetch = multivar(&config, "remote.origin.fetch").unwrap();
        assert!(!fetch.contains(&BUILDER_REFSPEC.to_string()), "{fetch:?}");
        assert!(fetch.contains(&APPROVALS_REFSPEC.to_string()), "{fetch:?}");
        assert_eq!(
            multivar(&config, "remote.origin.push").unwrap(),
            vec!["HEAD".to_string(), APPROVALS_REFSPEC.to_string()]
        );
        assert_eq!(crate::review::approvals::local_refs(&repo).unwrap().len(), 2);
        assert_eq!(
            crate::review::approvals::load(&repo).unwrap().len(),
            2,
            "read once each"
        );
        assert_eq!(install(&repo).unwrap().adopted, 0, "adopted once");
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
