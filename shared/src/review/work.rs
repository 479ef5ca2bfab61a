//! The builder's commands are crash-safe as the runtime's commit is: before a command
//! takes a git lock it names the lock in an intent record
//! ([`crate::git::LockIntent`], kept in the git directory's `builder/`, apart from the
//! runtime's own records in `.runtime/locks`, which name records a fire must still
//! commit, and out of the work tree a person's tools see), and before it moves a work
//! tree or a branch it records what it is about to do there
//! (`builder/work-<pid>.json`, fsynced). The next run of any of these
//! commands ([`recover`]) removes the locks a dead builder left (exactly those its
//! records name, as [`crate::git::recover_stale_locks`] judges them) and finishes or
//! undoes its half-done work: a work tree moved part of the way from one tree to
//! another is put back where its branch is, and only in files that hold one of the two
//! versions (a person's edit since is never overwritten).
//!
//! Named crash points (`crate::failpoint!`, armed through `RUNTIME_FAILPOINTS` in
//! builds for tests) mark each step; the crash tests kill the builder there.

use super::ReviewError;
use crate::git::{process_is_gone, process_start_time};
use git2::{Oid, Repository};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Where the builder's intent and work records live: the (per-worktree) git
/// directory's `builder/`.
pub fn intent_dir(repo: &Repository) -> PathBuf {
    repo.path().join("builder")
}

const WORK_PREFIX: &str = "work-";

/// What a builder command is about to do to the work tree and a branch.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Move the work tree (and index) from commit `from`'s tree to commit `to`'s, then
    /// the branch `branch` (a full ref name) from `from` to `to`: a merge or the
    /// fast-forward after a land.
    Move { branch: String, from: String, to: String },
    /// Put the paths a proposal took (those that differ between `head`'s tree and
    /// `commit`'s) back to `head`'s version, after creating `branch` at `commit`.
    Propose {
        branch: String,
        head: String,
        commit: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct WorkRecord {
    pid: u32,
    start_time: Option<u64>,
    #[serde(flatten)]
    op: Op,
}

/// A record of work under way; dropping it (once the work is done) removes it.
pub struct Work {
    path: PathBuf,
}

impl Work {
    /// Records `op` durably before it starts.
    pub fn begin(repo: &Repository, op: Op) -> Result<Work, ReviewError> {
        let dir = intent_dir(repo);
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |e| ReviewError::Io { path, source: e }
        };
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let pid = std::process::id();
        let path = dir.join(format!("{WORK_PREFIX}{pid}.json"));
        let record = WorkRecord {
            pid,
            start_time: process_start_time(pid),
            op,
        };
        let body = serde_json::to_vec(&record).map_err(|e| ReviewError::Io {
            path: path.clone(),
            source: std::io::Error::other(e),
        })?;
        crate::durable::replace(&path, &body).map_err(io(&path))?;
        Ok(Work { path })
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Moves (or creates) the ref `name` to `to`, its lock named in an intent record
/// first, so a builder killed while libgit2 holds that lock leaves nothing the next
/// run's [`recover`] cannot remove. With `from`, only if the ref is still there.
pub fn write_ref(repo: &Repository, name: &str, to: Oid, from: Option<Oid>, log: &str) -> Result<(), ReviewError> {
    let _lock = crate::git::LockIntent::hold(
        &intent_dir(repo),
        &[crate::git::lock_file_of(&repo.commondir().join(name))],
    )?;
    match from {
        Some(from) => repo.reference_matching(name, to, true, from, log)?,
        None => repo.reference(name, to, true, log)?,
    };
    Ok(())
}

/// What [`recover`] did.
#[derive(Debug, Default, Clone)]
pub struct Recovered {
    /// Stale locks removed.
    pub locks: Vec<PathBuf>,
    /// The interrupted operations it finished or undid, with what it did.
    pub work: Vec<(Op, String)>,
}

impl Recovered {
    pub fn is_empty(&self) -> bool {
        self.locks.is_empty() && self.work.is_empty()
    }

    /// Whether an interrupted proposal of `branch` was finished.
    pub fn finished_proposal(&self, branch: &str) -> bool {
        self.work
            .iter()
            .any(|(op, _)| matches!(op, Op::Propose { branch: b, .. } if b == branch))
    }
}

/// Removes the locks dead builder processes left and finishes or undoes their work.
pub fn recover(repo: &Repository) -> Result<Recovered, ReviewError> {
    let dir = intent_dir(repo);
    let mut out = Recovered {
        locks: crate::git::recover_stale_locks(&dir)?.removed,
        work: Vec::new(),
    };
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(ReviewError::Io { path: dir, source: e }),
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if !name.starts_with(WORK_PREFIX) {
            continue;
        }
        if name.ends_with(crate::durable::TMP_SUFFIX) {
            // A record being written: its writer died before the record existed
            // (nothing was started), or it is another builder command's, writing now
            // (this recovery holds no lock), left to it.
            if writer_is_gone(&name) {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        let Ok(record) = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<WorkRecord>(&b).ok())
            .ok_or(())
        else {
            tracing::warn!(path = %path.display(), "unreadable builder work record left alone");
            continue;
        };
        if record.pid != std::process::id() && !process_is_gone(record.pid, record.start_time) {
            continue;
        }
        let did = match &record.op {
            Op::Move { branch, from, to } => settle_move(repo, branch, from, to)?,
            Op::Propose { branch, head, commit } => settle_propose(repo, branch, head, commit)?,
        };
        std::fs::remove_file(&path).map_err(|e| ReviewError::Io {
            path: path.clone(),
            source: e,
        })?;
        out.work.push((record.op, did));
    }
    Ok(out)
}

/// Whether the builder process that was writing the temporary file `name`
/// (`work-<pid>.json.<random>.tmp`, see [`Work::begin`]) is gone; one that does not
/// name its writer is. By pid alone (the name has no start time): a dead writer whose
/// pid another process took leaves its file until that process ends, which costs
/// only the file.
fn writer_is_gone(name: &str) -> bool {
    let writer = name
        .strip_prefix(WORK_PREFIX)
        .and_then(|rest| rest.split('.').next())
        .and_then(|pid| pid.parse::<u32>().ok());
    writer.is_none_or(|pid| pid != std::process::id() && process_is_gone(pid, None))
}

fn oid(s: &str) -> Result<Oid, ReviewError> {
    Oid::from_str(s).map_err(ReviewError::from)
}

/// The paths that differ between the trees of commits `a` and `b`.
fn changed_paths(repo: &Repository, a: Oid, b: Oid) -> Result<Vec<String>, ReviewError> {
    let ta = repo.find_commit(a)?.tree()?;
    let tb = repo.find_commit(b)?.tree()?;
    let diff = repo.diff_tree_to_tree(Some(&ta), Some(&tb), None)?;
    Ok(diff
        .deltas()
        .filter_map(|d| d.new_file().path().or(d.old_file().path()))
        .map(|p| p.to_string_lossy().into_owned())
        .collect())
}

/// The blob id of the work tree's `path` (a symlink's target as git stores it),
/// `None` when it is absent.
fn work_blob(repo: &Repository, path: &str) -> Result<Option<Oid>, ReviewError> {
    let root = repo.workdir().unwrap_or_else(|| repo.path());
    let full = root.join(path);
    match std::fs::symlink_metadata(&full) {
        Ok(m) if m.file_type().is_symlink() => {
            let target = std::fs::read_link(&full).map_err(|e| ReviewError::Io { path: full, source: e })?;
            Ok(Some(Oid::hash_object(
                git2::ObjectType::Blob,
                target.as_os_str().as_encoded_bytes(),
            )?))
        }
        Ok(m) if m.is_file() => Ok(Some(Oid::hash_file(git2::ObjectType::Blob, &full)?)),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ReviewError::Io { path: full, source: e }),
    }
}

fn blob_in(tree: &git2::Tree, path: &str) -> Option<Oid> {
    tree.get_path(Path::new(path))
        .ok()
        .filter(|e| e.kind() == Some(git2::ObjectType::Blob))
        .map(|e| e.id())
}

/// Puts each of `paths` to its version in commit `target` (work tree and index).
/// A path holding neither `target`'s nor `other`'s version (or lacking the file where
/// one of them does) holds a write the crash cut short, or a person's edit since:
/// its content is copied under `.git/builder/recovered/<time>/` first, so the retry
/// can go on and nothing is lost; one that cannot be copied is left alone. Returns
/// the paths copied and where, and those left.
fn settle_paths(repo: &Repository, paths: &[String], target: Oid, other: Oid) -> Result<KeptAside, ReviewError> {
    let t = repo.find_commit(target)?.tree()?;
    let o = repo.find_commit(other)?.tree()?;
    let mut ours = Vec::new();
    let mut odd = Vec::new();
    for p in paths {
        let now = work_blob(repo, p)?;
        if now != blob_in(&t, p) && now != blob_in(&o, p) {
            odd.push(p.clone());
        }
        ours.push(p.clone());
    }
    let recovered = keep_copies(repo, &odd)?;
    // A file that could not be copied (larger than the cap, not a regular file) is a
    // person's, for all this can tell: left as it is, and named.
    ours.retain(|p| !recovered.left.contains(p));
    if !ours.is_empty() {
        crate::git::cut_index_stamp(repo);
        let mut co = git2::build::CheckoutBuilder::new();
        co.force()
            .remove_untracked(false)
            .update_index(true)
            .disable_pathspec_match(true);
        for p in &ours {
            co.path(p);
        }
        repo.checkout_tree(t.as_object(), Some(&mut co))?;
        // A file `target` lacks is not removed by a checkout of its tree: remove it.
        let mut index = repo.index()?;
        let root = repo.workdir().unwrap_or_else(|| repo.path()).to_path_buf();
        let mut removed = false;
        for p in &ours {
            if t.get_path(Path::new(p)).is_err() {
                let _ = std::fs::remove_file(root.join(p));
                let _ = index.remove_path(Path::new(p));
                removed = true;
            }
        }
        if removed {
            index.write()?;
        }
    }
    Ok(recovered)
}

/// What [`settle_paths`] copied aside before settling (the paths and the
/// directory), and what it could not copy and so left alone.
struct KeptAside {
    paths: Vec<String>,
    dir: std::path::PathBuf,
    left: Vec<String>,
}

impl KeptAside {
    /// `what` the settling did, and what it kept, for the command's message.
    fn say(&self, what: &str) -> String {
        let mut said = what.to_string();
        if !self.paths.is_empty() {
            said.push_str(&format!(
                "; {} held neither version (a write the crash cut short, or an edit since): a copy of each is in {}",
                self.paths.join(", "),
                self.dir.display()
            ));
        }
        if !self.left.is_empty() {
            said.push_str(&format!("; left edited files alone: {}", self.left.join(", ")));
        }
        said
    }
}

/// The largest file [`keep_copies`] copies (builder-owned files are prompts, settings
/// and scripts).
const KEEP_MAX_BYTES: u64 = 64 << 20;

/// Copies each of `paths` (work-tree files) under a new directory
/// `.git/builder/recovered/<unix time>/`, keeping their relative paths.
fn keep_copies(repo: &Repository, paths: &[String]) -> Result<KeptAside, ReviewError> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let dir = repo.commondir().join("builder/recovered").join(stamp.to_string());
    if paths.is_empty() {
        return Ok(KeptAside {
            paths: vec![],
            dir,
            left: vec![],
        });
    }
    let root = repo.workdir().unwrap_or_else(|| repo.path()).to_path_buf();
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ReviewError::Io { path, source }
    };
    let beneath = crate::beneath::open_root(&root).map_err(io(&root))?;
    let mut kept = Vec::new();
    let mut left = Vec::new();
    for p in paths {
        let from = root.join(p);
        if from.symlink_metadata().is_err() {
            continue; // gone: nothing to keep, the settling puts it back
        }
        // Read through no link, as a regular file.
        let Ok(bytes) = crate::beneath::read_regular(&beneath, Path::new(p), KEEP_MAX_BYTES) else {
            left.push(p.clone());
            continue;
        };
        let to = dir.join(p);
        if let Some(parent) = to.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&to, bytes).map_err(io(&from))?;
        kept.push(p.clone());
    }
    Ok(KeptAside { paths: kept, dir, left })
}

/// An interrupted move: the work tree goes where the branch is (`from` when the
/// branch never moved, `to` when it did); a branch moved elsewhere since is left as
/// it is.
fn settle_move(repo: &Repository, branch: &str, from: &str, to: &str) -> Result<String, ReviewError> {
    let (from, to) = (oid(from)?, oid(to)?);
    let Ok(at) = repo.refname_to_id(branch) else {
        return Ok(format!("{branch} is gone: nothing to finish"));
    };
    let (target, other, what) = if at == from {
        (from, to, "undid the interrupted update of the work tree")
    } else if at == to {
        (to, from, "finished the interrupted update of the work tree")
    } else {
        return Ok(format!("{branch} moved since: left as it is"));
    };
    // Only the checked-out branch has a work tree to settle.
    let checked_out = repo
        .head()
        .ok()
        .and_then(|h| h.name().ok().map(str::to_string))
        .as_deref()
        == Some(branch);
    if !checked_out {
        return Ok(format!("{branch} is not checked out: nothing to settle"));
    }
    let paths = changed_paths(repo, from, to)?;
    Ok(settle_paths(repo, &paths, target, other)?.say(what))
}

/// An interrupted proposal: once its branch is at `commit` and HEAD still at `head`,
/// the paths it took go back to `head`'s version; when the branch was never made,
/// nothing was moved.
fn settle_propose(repo: &Repository, branch: &str, head: &str, commit: &str) -> Result<String, ReviewError> {
    let (head, commit) = (oid(head)?, oid(commit)?);
    if repo.refname_to_id(&format!("refs/heads/{branch}")).ok() != Some(commit) {
        return Ok(format!("{branch} was not made: the changes are still in the work tree"));
    }
    if crate::git::head_commit(repo)? != Some(head) {
        return Ok("HEAD moved since: the work tree is left as it is".into());
    }
    let paths = changed_paths(repo, head, commit)?;
    Ok(settle_paths(repo, &paths, head, commit)?.say(&format!("finished the interrupted proposal {branch}")))
}

/// Which command moves a work tree (for its named crash points).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mover {
    Merge,
    Land,
}

/// Moves the checked-out `branch` (a full ref name) from commit `from` to commit
/// `to`: records the move, names the index's and the branch's locks, checks `to`'s
/// tree out (safe mode: a local edit in a path it touches stops it, changing
/// nothing), then moves the branch by compare-and-swap against `from`. A process
/// killed anywhere in between leaves what [`recover`] settles.
pub fn move_checked_out(repo: &Repository, branch: &str, from: Oid, to: Oid, mover: Mover) -> Result<(), ReviewError> {
    // A tree git refuses anywhere in what the checkout writes (a link and a directory
    // of one name: libgit2 writes the directory's files through the link, into
    // `.git/hooks` or a person's home) stops the move before anything is written:
    // anyone who can push puts one on the origin, outside the builder paths.
    let from_tree = repo.find_commit(from)?.tree_id();
    let to_tree = repo.find_commit(to)?.tree_id();
    super::canonical::check_changed(repo, Some(from_tree), to_tree, "").map_err(|e| {
        match super::canonical::is_refused_tree(&e) {
            true => ReviewError::Refused(format!(
                "{branch} is not moved to {}: {}",
                crate::text::short_oid(to),
                e.message()
            )),
            false => e.into(),
        }
    })?;
    let _work = Work::begin(
        repo,
        Op::Move {
            branch: branch.to_string(),
            from: from.to_string(),
            to: to.to_string(),
        },
    )?;
    let _locks = crate::git::LockIntent::hold(
        &intent_dir(repo),
        &[
            crate::git::lock_file_of(&repo.path().join("index")),
            crate::git::lock_file_of(&repo.commondir().join(branch)),
        ],
    )?;
    match mover {
        Mover::Merge => {
            crate::failpoint!("merge-before-checkout");
        }
        Mover::Land => {
            crate::failpoint!("land-before-checkout");
        }
    }
    let tree = repo.find_commit(to)?.tree()?;
    crate::git::cut_index_stamp(repo);
    let mut co = git2::build::CheckoutBuilder::new();
    co.safe();
    co.progress(move |_, _, _| match mover {
        Mover::Merge => {
            crate::failpoint!("merge-mid-checkout");
        }
        Mover::Land => {
            crate::failpoint!("land-mid-checkout");
        }
    });
    repo.checkout_tree(tree.as_object(), Some(&mut co))?;
    match mover {
        Mover::Merge => {
            crate::failpoint!("merge-before-ref");
        }
        Mover::Land => {
            crate::failpoint!("land-before-ref");
        }
    }
    let log = format!("builder: move to {to}");
    repo.reference_matching(branch, to, true, from, &log)?;
    match mover {
        Mover::Merge => {
            crate::failpoint!("merge-after-ref");
        }
        Mover::Land => {
            crate::failpoint!("land-after-ref");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two builder commands at once: one's recovery leaves the record the other is
    /// writing, and removes what a dead writer left.
    #[test]
    fn recovery_leaves_a_live_writers_temporary_record_and_removes_a_dead_ones() {
        let t = tempfile::tempdir().unwrap();
        let repo = Repository::init(t.path()).unwrap();
        let dir = intent_dir(&repo);
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let mut sleeper = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let live = sleeper.id();
        let name = |pid: u32| format!("{WORK_PREFIX}{pid}.json.a1B2c3{}", crate::durable::TMP_SUFFIX);
        for pid in [dead, live, std::process::id()] {
            std::fs::write(dir.join(name(pid)), b"{").unwrap();
        }
        std::fs::write(dir.join(format!("{WORK_PREFIX}x{}", crate::durable::TMP_SUFFIX)), b"{").unwrap();
        let done = recover(&repo).unwrap();
        let _ = sleeper.kill();
        let _ = sleeper.wait();
        assert!(done.work.is_empty());
        assert!(!dir.join(name(dead)).exists(), "a dead writer's leftover stays");
        assert!(!dir
            .join(format!("{WORK_PREFIX}x{}", crate::durable::TMP_SUFFIX))
            .exists());
        assert!(dir.join(name(live)).exists(), "a live writer's record was removed");
        assert!(
            dir.join(name(std::process::id())).exists(),
            "this process's own writer's record was removed"
        );
    }
}
