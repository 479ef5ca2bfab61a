//! The team's remote, through the `git` command line (so a person's ssh keys,
//! credential helpers, URL rewrites and hooks apply as they do to their own `git`):
//! which remote and which branch the review commands work against, and the fetch,
//! push and listing they need. `builder approve --push`, `propose --push` and `land`
//! use these; the cron box's sync keeps its own (sandboxed, scrubbed) transport.
//!
//! The protected branch is the one the box fires from: `sync.branch` of the
//! settings, else the branch the remote's `HEAD` names (`refs/remotes/<remote>/HEAD`,
//! which `git clone` writes and `git remote set-head <remote> --auto` restores), else
//! `main` or `master`, whichever the remote has (`main` first), else `main`. A
//! proposal's branch (`proposals/...`) is never the protected one. The default remote
//! is `sync.remote`, else the current branch's upstream remote, else `origin`, else
//! the only remote there is. The protected branch that judges approvals is read from
//! the remote the local `main` (or `master`) tracks, else `origin`, else the only
//! remote: never from the checked-out branch's upstream ([`judging_remote`]).

use super::{ReviewError, APPROVALS_REFSPEC, APPROVED_PREFIX, PROPOSAL_PREFIX};
use crate::settings::SyncSettings;
use git2::{Oid, Repository};
use std::path::Path;
use std::process::{Command, Output, Stdio};

/// The remote review commands talk to; `None` when the repository has no remote.
pub fn default_remote(repo: &Repository, sync: Option<&SyncSettings>) -> Result<Option<String>, git2::Error> {
    if let Some(s) = sync {
        return Ok(Some(s.remote.clone()));
    }
    let head = repo.head().ok().and_then(|h| h.name().ok().map(str::to_string));
    remote_tracked_by(repo, head.as_deref().into_iter())
}

/// The remote whose protected branch judges approvals (`super::base::protected_tip`):
/// the upstream remote of the local `main` or `master`, else `origin`, else the only
/// remote. Never the checked-out branch's upstream, as [`default_remote`] takes it: a
/// reviewer on a branch that tracks a colleague's fork would be judged by the fork's
/// `main`, which the colleague controls.
pub fn judging_remote(repo: &Repository) -> Result<Option<String>, git2::Error> {
    remote_tracked_by(repo, ["refs/heads/main", "refs/heads/master"].into_iter())
}

/// The upstream remote of the first of `branches` that has one among the repository's
/// remotes, else `origin`, else the only remote; `None` without a remote.
fn remote_tracked_by<'a>(
    repo: &Repository,
    branches: impl Iterator<Item = &'a str>,
) -> Result<Option<String>, git2::Error> {
    let remotes: Vec<String> = repo.remotes()?.iter().flatten().flatten().map(str::to_string).collect();
    for branch in branches {
        if let Ok(buf) = repo.branch_upstream_remote(branch) {
            if let Ok(r) = buf.as_str() {
                if remotes.iter().any(|x| x == r) {
                    return Ok(Some(r.to_string()));
                }
            }
        }
    }
    if remotes.iter().any(|r| r == "origin") {
        return Ok(Some("origin".into()));
    }
    Ok(match remotes.as_slice() {
        [only] => Some(only.clone()),
        _ => None,
    })
}

/// The protected branch (see the module's doc), without `refs/heads/`.
pub fn protected_branch(repo: &Repository, remote: &str, sync: Option<&SyncSettings>) -> String {
    if let Some(s) = sync {
        return s.branch.clone();
    }
    let head = format!("refs/remotes/{remote}/HEAD");
    let prefix = format!("refs/remotes/{remote}/");
    if let Ok(r) = repo.find_reference(&head) {
        if let Some(target) = r.symbolic_target().ok().flatten().and_then(|t| t.strip_prefix(&prefix)) {
            if !target.starts_with(PROPOSAL_PREFIX) {
                return target.to_string();
            }
        }
    }
    ["main", "master"]
        .into_iter()
        .find(|b| repo.find_reference(&tracking_ref(remote, b)).is_ok())
        .unwrap_or("main")
        .to_string()
}

/// The remote-tracking ref of `branch` on `remote`.
pub fn tracking_ref(remote: &str, branch: &str) -> String {
    format!("refs/remotes/{remote}/{branch}")
}

/// Runs `git` in `root` with the person's environment, no prompt on a terminal, and
/// the directory of the running `builder` first on PATH (the pre-push hook a push
/// runs calls `builder`: the same one).
fn git(root: &Path, args: &[&str]) -> Result<Output, ReviewError> {
    let mut cmd = Command::new("git");
    cmd.arg("-C").arg(root).args(args).stdin(Stdio::null());
    cmd.env("GIT_TERMINAL_PROMPT", "0");
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut joined = std::ffi::OsString::from(dir.as_os_str());
        joined.push(":");
        joined.push(path);
        cmd.env("PATH", joined);
    }
    let error = |e: std::io::Error| ReviewError::Remote {
        command: format!("git {}", args.join(" ")),
        message: e.to_string(),
    };
    // Its output goes to files, not pipes: a `builder` killed mid-fetch or mid-push
    // would close the pipes, and git, writing to them, would die of SIGPIPE while it
    // holds a ref's lock (`refs/remotes/origin/main.lock`), which then stops every
    // later fetch. Writing to files, git finishes and removes its locks.
    let (mut stdout, mut stderr) = (
        tempfile::tempfile().map_err(error)?,
        tempfile::tempfile().map_err(error)?,
    );
    cmd.stdout(stdout.try_clone().map_err(error)?)
        .stderr(stderr.try_clone().map_err(error)?);
    let status = cmd.status().map_err(error)?;
    let read = |f: &mut std::fs::File| -> std::io::Result<Vec<u8>> {
        use std::io::{Read, Seek};
        let mut bytes = Vec::new();
        f.seek(std::io::SeekFrom::Start(0))?;
        f.read_to_end(&mut bytes)?;
        Ok(bytes)
    };
    Ok(Output {
        status,
        stdout: read(&mut stdout).map_err(error)?,
        stderr: read(&mut stderr).map_err(error)?,
    })
}

fn failed(args: &[&str], out: &Output) -> ReviewError {
    ReviewError::Remote {
        command: format!("git {}", args.join(" ")),
        message: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    }
}

/// Fetches every branch of `remote` (into `refs/remotes/<remote>/`, proposals
/// included) and every approval (never replacing one this clone has). A fetch whose
/// only failure is an approval ref the remote moved (someone forced it) still counts
/// as done: this clone keeps its own, and [`unpublished`] reports the difference.
pub fn fetch(root: &Path, remote: &str) -> Result<(), ReviewError> {
    let branches = format!("+refs/heads/*:refs/remotes/{remote}/*");
    let args = ["fetch", "--quiet", "--no-tags", remote, &branches, APPROVALS_REFSPEC];
    let mut out = git(root, &args)?;
    // Another fetch of this clone at the same moment (an editor's background fetch,
    // the `git` a killed builder started) moves a tracking ref between this fetch's
    // read and its update, or holds its lock: git refuses that one update (`cannot
    // lock ref ...`). The fetch run again goes through.
    for wait_ms in [100, 300, 900] {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || !stderr.contains("cannot lock ref") || stderr.contains("exists; cannot create") {
            break;
        }
        tracing::debug!(stderr = %stderr.trim(), "another git moved a ref this fetch updates: fetched again");
        std::thread::sleep(std::time::Duration::from_millis(wait_ms));
        out = git(root, &args)?;
    }
    if out.status.success() {
        return Ok(());
    }
    // A branch deleted on the remote and one pushed below its name (`release`, then
    // `release/1.0`): this clone's tracking ref of the old one stops the update (and
    // `install-hooks` turned pruning off, to keep approvals). The tracking ref is
    // only a copy of the remote's: it goes, and the fetch runs again (helper-101).
    if drop_stale_tracking_refs(root, remote, &String::from_utf8_lossy(&out.stderr)) {
        out = git(root, &args)?;
        if out.status.success() {
            return Ok(());
        }
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    if name_conflict(&stderr) {
        // A ref pushed below an approval's name (`<id>/x`, someone's push) cannot
        // sit beside this clone's `<id>`: git refuses the whole update. Fetched
        // again naming the approvals one by one, only the names builder writes.
        tracing::warn!(remote, stderr = %stderr.trim(), "the remote holds a ref below an approval's name: approvals fetched by name");
        // One this clone took in earlier (before it had the approval) names no
        // approval either, and would stop the approval's own ref from being made.
        drop_malformed_approval_refs(root);
        let mut specs = vec![branches.clone()];
        specs.extend(
            ls_remote(root, remote, &format!("{APPROVED_PREFIX}*"))?
                .into_iter()
                .filter(|(n, _)| super::approvals::named_id(n).is_some())
                .map(|(n, _)| format!("{n}:{n}")),
        );
        let mut args = vec!["fetch", "--quiet", "--no-tags", remote];
        args.extend(specs.iter().map(String::as_str));
        out = git(root, &args)?;
        if out.status.success() {
            return Ok(());
        }
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let only_approvals = stderr
        .lines()
        .filter(|l| l.contains("[rejected]"))
        .all(|l| l.contains(APPROVED_PREFIX.trim_start_matches("refs/")));
    if stderr.contains("[rejected]") && only_approvals {
        tracing::warn!(remote, stderr = %stderr.trim(), "the remote holds approval refs unlike this clone's: kept this clone's");
        return Ok(());
    }
    Err(failed(&args, &out))
}

/// Deletes the tracking refs of `remote` that git's `stderr` names as standing in the
/// way of another (`cannot lock ref 'A': 'B' exists; cannot create 'A'`). Whether it
/// deleted any.
fn drop_stale_tracking_refs(root: &Path, remote: &str, stderr: &str) -> bool {
    let tracking = format!("refs/remotes/{remote}/");
    let stale: Vec<&str> = (stderr.lines())
        .filter(|l| l.contains("exists; cannot create"))
        .filter_map(|l| l.split("': '").nth(1)?.split("' exists").next())
        .filter(|r| r.starts_with(&tracking))
        .collect();
    let Ok(repo) = Repository::open(root) else {
        return false;
    };
    let mut dropped = false;
    for name in stale {
        match repo.find_reference(name).and_then(|mut r| r.delete()) {
            Ok(()) => {
                tracing::warn!(
                    name,
                    "a tracking ref of a branch the remote no longer has stood in the way: deleted"
                );
                dropped = true;
            }
            Err(e) => tracing::warn!(name, error = %e, "a stale tracking ref was not deleted"),
        }
    }
    dropped
}

/// Deletes this clone's refs under the approvals that name no approval
/// ([`super::approvals::named_id`]): someone's push, fetched by git's refspec.
fn drop_malformed_approval_refs(root: &Path) {
    let Ok(repo) = Repository::open(root) else {
        return;
    };
    let Ok(refs) = repo.references_glob(&format!("{APPROVED_PREFIX}*")) else {
        return;
    };
    for mut r in refs.flatten() {
        let malformed = r.name().is_ok_and(|n| super::approvals::named_id(n).is_none());
        if malformed {
            if let Err(e) = r.delete() {
                tracing::warn!(error = %e, "a ref under the approvals that names no approval was not deleted");
            }
        }
    }
}

/// Whether git's `stderr` says a ref could not be made because another's name is a
/// directory of it or the reverse (`'refs/x/a' exists; cannot create 'refs/x/a/b'`)
/// under the approvals.
fn name_conflict(stderr: &str) -> bool {
    stderr
        .lines()
        .any(|l| l.contains(APPROVED_PREFIX) && (l.contains("exists; cannot create") || l.contains("cannot process")))
}

/// How a push went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pushed {
    Done,
    /// The remote moved (not a fast-forward, a stale lease) or its ref was locked by
    /// another push at that moment: fetch and try again.
    Moved(String),
}

/// Pushes `specs` to `remote` (never forced; git's pre-push hook runs).
pub fn push(root: &Path, remote: &str, specs: &[String]) -> Result<Pushed, ReviewError> {
    let mut args = vec!["push", "--porcelain", "--quiet", remote];
    args.extend(specs.iter().map(String::as_str));
    let out = git(root, &args)?;
    if out.status.success() {
        return Ok(Pushed::Done);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let moved = stdout
        .lines()
        .chain(stderr.lines())
        .filter(|l| l.starts_with('!') || l.contains("[rejected]") || l.contains("[remote rejected]"))
        .find(|l| {
            // `failed to update ref`: the remote's ref moved between its advertisement
            // and this update (a push a killed command started, still running on
            // the remote, landed it meanwhile: seen in `team_crash`).
            [
                "fetch first",
                "non-fast-forward",
                "stale info",
                "failed to lock",
                "cannot lock",
                "lock",
                "failed to update ref",
            ]
            .iter()
            .any(|k| l.contains(k))
        });
    match moved {
        Some(line) => Ok(Pushed::Moved(line.trim().to_string())),
        None => Err(ReviewError::Remote {
            command: format!("git {}", args.join(" ")),
            message: format!("{}{}", stdout.trim(), stderr.trim()),
        }),
    }
}

/// The refs of `remote` matching `pattern` (as `git ls-remote` takes it).
pub fn ls_remote(root: &Path, remote: &str, pattern: &str) -> Result<Vec<(String, Oid)>, ReviewError> {
    let args = ["ls-remote", "--quiet", remote, pattern];
    let out = git(root, &args)?;
    if !out.status.success() {
        return Err(failed(&args, &out));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (id, name) = l.split_once('\t')?;
            Some((name.to_string(), Oid::from_str(id).ok()?))
        })
        .collect())
}

/// How this clone's approval refs compare with a remote's.
#[derive(Debug, Default)]
pub struct Compared {
    /// The approval refs this clone has and the remote lacks (a forced push or a
    /// deleted ref there, or approvals not pushed yet), by name.
    pub missing: Vec<String>,
    /// The remote's refs under the approvals that name no approval (someone's push:
    /// `<id>/x` stops every clone's `git pull`), by name.
    pub malformed: Vec<String>,
    /// The remote's approval refs force-moved off the approval their name holds (to
    /// a commit that does not descend from it): git refuses that update, so every
    /// clone's `git pull` fails, and its `git push` of the approvals too (helper-103).
    pub moved_off: Vec<String>,
}

/// Compares this clone's approval refs with `remote`'s.
pub fn unpublished(repo: &Repository, root: &Path, remote: &str) -> Result<Compared, ReviewError> {
    let listed = ls_remote(root, remote, &format!("{APPROVED_PREFIX}*"))?;
    let mut malformed = Vec::new();
    let mut moved_off = Vec::new();
    let mut theirs = std::collections::HashSet::new();
    for (name, target) in listed {
        let Some(id) = super::approvals::named_id(&name) else {
            malformed.push(name);
            continue;
        };
        // A move forward (a child of the approval) is a fast-forward every fetch
        // takes; one the clone cannot place below the approval is not. A target this
        // clone has not fetched yet cannot be judged: the fetch that brings it says.
        let fetched = repo.find_commit(target).is_ok();
        if target != id && fetched && !repo.graph_descendant_of(target, id).unwrap_or(false) {
            moved_off.push(name.clone());
        }
        theirs.insert(name);
    }
    let missing = super::approvals::local_refs(repo)?
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| super::approvals::named_id(n).is_some() && !theirs.contains(n))
        .collect();
    Ok(Compared {
        missing,
        malformed,
        moved_off,
    })
}

/// Publishes every approval this clone has that `remote` lacks (all of
/// `refs/builder/approved/*`, never forced: an approval the remote has already is
/// left as it is). Returns how many were missing there.
pub fn publish_approvals(repo: &Repository, root: &Path, remote: &str) -> Result<usize, ReviewError> {
    let Compared { missing, malformed, .. } = unpublished(repo, root, remote)?;
    // One the remote holds a ref below cannot be made there (git refuses the name):
    // left, so the others, the new one among them, go (`builder proposals` names it).
    let below = |n: &String| malformed.iter().any(|m| m.starts_with(&format!("{n}/")));
    let (blocked, missing): (Vec<String>, Vec<String>) = missing.into_iter().partition(below);
    if !blocked.is_empty() {
        tracing::warn!(
            remote,
            ?blocked,
            "approvals the remote holds a ref below are not pushed"
        );
    }
    if missing.is_empty() {
        return Ok(0);
    }
    let specs: Vec<String> = missing.iter().map(|n| format!("{n}:{n}")).collect();
    // New refs never conflict; a push can still meet another push's lock: retry.
    for _ in 0..PUSH_TRIES {
        match push(root, remote, &specs)? {
            Pushed::Done => return Ok(missing.len()),
            Pushed::Moved(_) => continue,
        }
    }
    Err(ReviewError::Refused(format!(
        "could not push {} approval(s) to {remote} after {PUSH_TRIES} tries: it kept refusing them",
        missing.len()
    )))
}

/// How many times a push is tried when the remote moved or was locked meanwhile.
pub const PUSH_TRIES: u32 = 8;

/// The remote-tracking head of proposal `name` on `remote`, when fetched.
pub fn remote_proposal(repo: &Repository, remote: &str, name: &str) -> Option<Oid> {
    repo.refname_to_id(&tracking_ref(remote, &format!("{PROPOSAL_PREFIX}{name}")))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git_ok(dir: &Path, args: &[&str]) -> String {
        let out = Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .env("GIT_AUTHOR_NAME", "a")
            .env("GIT_AUTHOR_EMAIL", "a@x")
            .env("GIT_COMMITTER_NAME", "a")
            .env("GIT_COMMITTER_EMAIL", "a@x")
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Without `refs/remotes/origin/HEAD` (a `git remote add` and fetch, not a clone),
    /// a team on `master` is protected on `master`; a remote `HEAD` naming a
    /// proposal's branch is not believed; one naming a branch is.
    #[test]
    fn the_protected_branch_is_found_without_the_remotes_head_and_is_never_a_proposal() {
        let t = tempfile::tempdir().unwrap();
        let repo = Repository::init(t.path()).unwrap();
        let sig = git2::Signature::now("a", "a@x").unwrap();
        let tree = repo
            .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
            .unwrap();
        let c = repo.commit(None, &sig, &sig, "one", &tree, &[]).unwrap();
        assert_eq!(protected_branch(&repo, "origin", None), "main", "nothing to go by");
        for b in ["master", "proposals/x", "dev"] {
            repo.reference(&tracking_ref("origin", b), c, true, "fetch").unwrap();
        }
        assert_eq!(protected_branch(&repo, "origin", None), "master");
        let head = "refs/remotes/origin/HEAD";
        repo.reference_symbolic(head, &tracking_ref("origin", "proposals/x"), true, "set-head")
            .unwrap();
        assert_eq!(protected_branch(&repo, "origin", None), "master");
        repo.reference_symbolic(head, &tracking_ref("origin", "dev"), true, "set-head")
            .unwrap();
        assert_eq!(protected_branch(&repo, "origin", None), "dev");
        repo.reference(&tracking_ref("origin", "main"), c, true, "fetch")
            .unwrap();
        repo.find_reference(head).unwrap().delete().unwrap();
        assert_eq!(protected_branch(&repo, "origin", None), "main", "main before master");
    }

    /// A tracking ref another git holds locked when the fetch first tries (an
    /// editor's background fetch) is updated by the fetch run again.
    #[test]
    fn a_fetch_that_meets_another_fetchs_ref_lock_goes_through_once_it_is_gone() {
        let t = tempfile::tempdir().unwrap();
        let (origin, work, clone) = (t.path().join("origin.git"), t.path().join("w"), t.path().join("c"));
        git_ok(
            t.path(),
            &["init", "-q", "--bare", "-b", "main", origin.to_str().unwrap()],
        );
        git_ok(
            t.path(),
            &["clone", "-q", origin.to_str().unwrap(), work.to_str().unwrap()],
        );
        git_ok(&work, &["commit", "-q", "--allow-empty", "-m", "one"]);
        git_ok(&work, &["push", "-q", "origin", "HEAD:main"]);
        git_ok(
            t.path(),
            &["clone", "-q", origin.to_str().unwrap(), clone.to_str().unwrap()],
        );
        git_ok(&work, &["commit", "-q", "--allow-empty", "-m", "two"]);
        git_ok(&work, &["push", "-q", "origin", "HEAD:main"]);
        let lock = clone.join(".git/refs/remotes/origin/main.lock");
        std::fs::write(&lock, "").unwrap();
        let held = lock.clone();
        let other = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(250));
            std::fs::remove_file(held).unwrap();
        });
        fetch(&clone, "origin").unwrap();
        other.join().unwrap();
        let tip = git_ok(&work, &["rev-parse", "HEAD"]);
        assert_eq!(git_ok(&clone, &["rev-parse", "refs/remotes/origin/main"]), tip);
    }
}
