//! The sync step's locks, and how a killed sync step's locks are found and removed.
//!
//! A sync step (the fetch and move before a fire, the push after it) takes git's ref
//! locks in three places: the box's own refs (its branch, the remote-tracking ref,
//! `refs/builder/*`), the box's index, and, for a remote on disk, the remote's branch
//! (`refs/heads/<branch>.lock` in the origin). A runtime killed while it holds one
//! leaves the lock behind; one left on the origin blocks every push to it, the
//! laptop's too. So:
//!
//! * Sync steps of one box run one at a time, under an flock of
//!   `.runtime/locks/sync.lock` (released by the kernel when the process dies).
//!   Under it, a lock file in the runtime's private ref namespace
//!   (`refs/runtime-sync/`) can only be a dead step's, and is removed.
//! * Every other lock is named in an intent record,
//!   `.runtime/locks/sync-intent-<pid>.json` (fsynced), before it is taken, and the
//!   lock's identity (inode and change time) is added as soon as it exists. The next
//!   step removes exactly the locks a dead process's record names, and only those
//!   that are provably its own: the recorded identity, or, when the process died
//!   before it could record one, a lock not newer than the record plus
//!   [`LOCK_GRACE`]. A lock no record names (a person's git, another box's push) is
//!   never touched: the caller reports it with the command that removes it.
//!
//! Ref updates go through libgit2's transactions, so the lock is held between
//! [`set_ref`]'s named crash points exactly as git holds it: the crash suite kills
//! the runtime there.

use crate::git::{process_is_gone, process_start_time};
use crate::state::{self, LockFile, LockWait};
use git2::{Oid, Repository};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long after its record names a lock the runtime may create it without having
/// recorded its identity: libgit2 creates a ref lock microseconds after
/// [`Intent::about_to_lock`] returns.
const LOCK_GRACE: Duration = Duration::from_secs(2);

/// Prefix of the sync step's intent records in `.runtime/locks`.
pub(super) const INTENT_PREFIX: &str = "sync-intent-";

/// The box's private ref namespace (fetched tips, the last joined tip, staged
/// approvals, histories kept after a replay): only the runtime writes there.
pub(super) const PRIVATE_REFS: &str = "refs/runtime-sync/";

/// How long a fire waits for another fire's sync step on the same box.
const SYNC_LOCK_WAIT: Duration = Duration::from_secs(300);

/// The box-wide sync lock, held for one sync step.
pub(super) struct SyncLock {
    _file: LockFile,
}

/// Takes the box's sync lock (`.runtime/locks/sync.lock`), waiting at most
/// [`SYNC_LOCK_WAIT`] for another fire's sync step.
pub(super) fn take(root: &Path) -> Result<SyncLock, String> {
    let path = root.join(crate::layout::STATE_DIR).join("locks").join("sync.lock");
    let deadline = std::time::Instant::now() + SYNC_LOCK_WAIT;
    loop {
        match state::take_lock(&path, LockWait::NoWait) {
            Ok(Some(file)) => return Ok(SyncLock { _file: file }),
            Ok(None) if std::time::Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                return Err(format!(
                    "another fire's sync step held {} for more than {} s",
                    path.display(),
                    SYNC_LOCK_WAIT.as_secs()
                ))
            }
            Err(e) => return Err(format!("cannot take {}: {e}", path.display())),
        }
    }
}

/// One lock a record names, with its identity once it exists.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
struct Named {
    path: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ino: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ctime_ns: Option<i64>,
}

impl Named {
    /// Whether `m` is the file this names: by identity when recorded, else by age
    /// against the record's write time.
    fn is(&self, m: &std::fs::Metadata, written: Option<std::time::SystemTime>) -> bool {
        use std::os::unix::fs::MetadataExt;
        match self.ino {
            Some(ino) => m.ino() == ino && self.ctime_ns.is_none_or(|c| c == ctime_ns(m)),
            None => match (m.modified().ok(), written) {
                (Some(made), Some(w)) => made <= w + LOCK_GRACE,
                _ => false,
            },
        }
    }
}

fn ctime_ns(m: &std::fs::Metadata) -> i64 {
    use std::os::unix::fs::MetadataExt;
    m.ctime().saturating_mul(1_000_000_000).saturating_add(m.ctime_nsec())
}

/// What `.runtime/locks/sync-intent-<pid>.json` holds.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct Record {
    pid: u32,
    start_time: Option<u64>,
    locks: Vec<Named>,
    /// A move of the box's branch under way: the work tree, the index and the branch
    /// are updated one after the other, and a process killed in between leaves them
    /// disagreeing until the next sync step finishes the move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    moving: Option<Moving>,
}

/// A move of the box's branch `branch` from `from` to `to` (commit ids); `paths`:
/// only those paths of the work tree change (records), else every path that differs.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(super) struct Moving {
    pub branch: String,
    pub from: String,
    pub to: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths: Option<Vec<String>>,
}

/// What [`recover`] found.
#[derive(Debug, Default)]
pub(super) struct Recovered {
    /// Locks removed.
    pub removed: Vec<PathBuf>,
    /// Moves dead processes left half done, each with its record (removed once the
    /// move is finished).
    pub moves: Vec<(Moving, PathBuf)>,
}

/// This process's intent record: the locks its sync step is about to take or holds.
pub(super) struct Intent {
    path: PathBuf,
    record: Record,
}

impl Intent {
    /// The record of this process in `dir` (`.runtime/locks`); nothing is written
    /// until a lock is named.
    pub(super) fn new(dir: &Path) -> Intent {
        let pid = std::process::id();
        Intent {
            path: dir.join(format!("{INTENT_PREFIX}{pid}.json")),
            record: Record {
                pid,
                start_time: process_start_time(pid),
                locks: Vec::new(),
                moving: None,
            },
        }
    }

    /// Names `lock` (a path that does not exist yet) before it is created.
    pub(super) fn about_to_lock(&mut self, lock: &Path) -> std::io::Result<()> {
        self.record.locks.retain(|n| n.path != lock);
        self.record.locks.push(Named {
            path: lock.to_path_buf(),
            ino: None,
            ctime_ns: None,
        });
        self.save()
    }

    /// Records the identity of `lock`, which this process has just created.
    pub(super) fn holding(&mut self, lock: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(lock)?;
        for n in self.record.locks.iter_mut().filter(|n| n.path == lock) {
            n.ino = Some(m.ino());
            n.ctime_ns = Some(ctime_ns(&m));
        }
        self.save()
    }

    /// A move of the box's branch begins (`Some`) or is done (`None`).
    pub(super) fn moving(&mut self, moving: Option<Moving>) -> std::io::Result<()> {
        self.record.moving = moving;
        self.sync_file()
    }

    /// `lock` is released: the record stops naming it (and goes once it names none).
    pub(super) fn released(&mut self, lock: &Path) {
        self.record.locks.retain(|n| n.path != lock);
        if let Err(e) = self.sync_file() {
            tracing::warn!(record = %self.path.display(), error = %e, "the sync intent record was not updated");
        }
    }

    /// Saves the record, or removes it once it names no lock and no move.
    fn sync_file(&self) -> std::io::Result<()> {
        if self.record.locks.is_empty() && self.record.moving.is_none() {
            match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        } else {
            self.save()
        }
    }

    /// Writes the record durably ([`crate::durable`]).
    fn save(&self) -> std::io::Result<()> {
        let body = serde_json::to_vec(&self.record).map_err(std::io::Error::other)?;
        crate::durable::replace(&self.path, &body)
    }
}

/// Removes what dead sync steps left, under the sync lock: each lock a dead process's
/// record names and that is provably its own, then the record (unless it names a
/// move, which the caller finishes first); and every lock file under the private
/// namespace `refs/runtime-sync/` of `git_dir` (no other sync step runs).
pub(super) fn recover(_held: &SyncLock, intents: &Path, git_dir: &Path) -> Recovered {
    let mut out = Recovered::default();
    let removed = &mut out.removed;
    for entry in std::fs::read_dir(intents).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(INTENT_PREFIX) {
            continue;
        }
        let path = entry.path();
        if name.ends_with(crate::durable::TMP_SUFFIX) {
            // Renamed into place only once complete: a dead writer's leftover.
            let _ = std::fs::remove_file(&path);
            continue;
        }
        let written = std::fs::metadata(&path).and_then(|m| m.modified()).ok();
        let Some(record) = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Record>(&b).ok())
        else {
            tracing::warn!(record = %path.display(), "an unreadable sync intent record is left alone");
            continue;
        };
        let own = record.pid == std::process::id();
        if !own && !process_is_gone(record.pid, record.start_time) {
            continue;
        }
        for lock in &record.locks {
            let Ok(m) = std::fs::symlink_metadata(&lock.path) else {
                continue;
            };
            if lock.is(&m, written) && std::fs::remove_file(&lock.path).is_ok() {
                tracing::warn!(lock = %lock.path.display(), pid = record.pid, "removed a lock a killed sync step left");
                removed.push(lock.path.clone());
            }
        }
        match record.moving {
            Some(m) => out.moves.push((m, path)),
            None => {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let mut stack = vec![git_dir.join(PRIVATE_REFS.trim_end_matches('/'))];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(_) if p.extension().is_some_and(|x| x == "lock") && std::fs::remove_file(&p).is_ok() => {
                    tracing::warn!(lock = %p.display(), "removed a lock a killed sync step left in the runtime's own refs");
                    removed.push(p);
                }
                _ => {}
            }
        }
    }
    out
}

/// The lock file git takes to update ref `name` of `repo`.
pub(super) fn ref_lock_path(repo: &Repository, name: &str) -> PathBuf {
    let mut p = repo.commondir().join(name).into_os_string();
    p.push(".lock");
    PathBuf::from(p)
}

/// What a ref must hold for [`set_ref`] to move it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expect {
    /// Whatever it holds.
    Any,
    /// Exactly this (`None`: the ref must not exist).
    Is(Option<Oid>),
}

/// Where a ref update holds its lock, for the named crash points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Point {
    /// The remote's branch (a remote on disk).
    Remote,
    /// The box's branch.
    Branch,
    /// The box's remote-tracking ref or an approval ref.
    Other,
}

/// How [`set_ref`] ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum SetRef {
    Set,
    /// The ref held something else: nothing was written.
    Differs(Option<Oid>),
    /// Another process holds the ref's lock.
    Locked(PathBuf),
}

/// Moves ref `name` of `repo` to `new` under git's lock, when it holds what `expect`
/// says (a compare-and-swap: a ref moved by someone else meanwhile is never
/// overwritten). The lock is named in `intent` before it is taken and its identity
/// recorded once it exists.
pub(super) fn set_ref(
    repo: &Repository,
    intent: &mut Intent,
    name: &str,
    new: Oid,
    expect: Expect,
    point: Point,
    message: &str,
) -> Result<SetRef, git2::Error> {
    let lock = ref_lock_path(repo, name);
    let io = |e: std::io::Error| git2::Error::from_str(&format!("{}: {e}", lock.display()));
    intent.about_to_lock(&lock).map_err(io)?;
    let mut tx = repo.transaction()?;
    match tx.lock_ref(name) {
        Ok(()) => {}
        Err(e) if e.code() == git2::ErrorCode::Locked => {
            drop(tx);
            intent.released(&lock);
            return Ok(SetRef::Locked(lock));
        }
        Err(e) => {
            drop(tx);
            intent.released(&lock);
            return Err(e);
        }
    }
    crash_point(point, Stage::LockedUnrecorded);
    let recorded = intent.holding(&lock).map_err(io);
    crash_point(point, Stage::Locked);
    let result = recorded.and_then(|()| {
        let now = match repo.refname_to_id(name) {
            Ok(o) => Some(o),
            Err(e) if e.code() == git2::ErrorCode::NotFound => None,
            Err(e) => return Err(e),
        };
        if let Expect::Is(want) = expect {
            if now != want {
                return Ok(SetRef::Differs(now));
            }
        }
        if now == Some(new) {
            return Ok(SetRef::Set);
        }
        let who = git2::Signature::now("runtime", "runtime@localhost")?;
        tx.set_target(name, new, Some(&who), message)?;
        tx.commit().map(|()| SetRef::Set)
    });
    // Committed or not, the transaction's lock is gone once it is dropped (`commit`
    // consumed it on success).
    if result.as_ref().is_ok_and(|r| *r == SetRef::Set) {
        crash_point(point, Stage::Moved);
    }
    intent.released(&lock);
    result
}

#[derive(Debug, Clone, Copy)]
enum Stage {
    /// The lock exists; its identity is not recorded yet.
    LockedUnrecorded,
    /// The lock exists and the record names it by identity.
    Locked,
    /// The ref moved and its lock is released; the record still names the lock.
    Moved,
}

/// The crash points of a ref update: `sync-<where>-<stage>`.
fn crash_point(point: Point, stage: Stage) {
    match (point, stage) {
        (Point::Remote, Stage::LockedUnrecorded) => {
            crate::failpoint!("sync-remote-lock-unrecorded");
        }
        (Point::Remote, Stage::Locked) => {
            crate::failpoint!("sync-remote-locked");
        }
        (Point::Remote, Stage::Moved) => {
            crate::failpoint!("sync-remote-moved");
        }
        (Point::Branch, Stage::LockedUnrecorded) => {
            crate::failpoint!("sync-branch-lock-unrecorded");
        }
        (Point::Branch, Stage::Locked) => {
            crate::failpoint!("sync-branch-locked");
        }
        (Point::Branch, Stage::Moved) => {
            crate::failpoint!("sync-branch-moved");
        }
        (Point::Other, Stage::LockedUnrecorded) => {
            crate::failpoint!("sync-ref-lock-unrecorded");
        }
        (Point::Other, Stage::Locked) => {
            crate::failpoint!("sync-ref-locked");
        }
        (Point::Other, Stage::Moved) => {
            crate::failpoint!("sync-ref-moved");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo(dir: &Path) -> (Repository, Oid) {
        let repo = Repository::init_bare(dir).unwrap();
        let sig = git2::Signature::now("a", "a@x").unwrap();
        let tree = repo.treebuilder(None).unwrap().write().unwrap();
        let tree = repo.find_tree(tree).unwrap();
        let c = repo.commit(None, &sig, &sig, "c", &tree, &[]).unwrap();
        drop(tree);
        (repo, c)
    }

    #[test]
    fn a_ref_moves_by_compare_and_swap_and_leaves_no_lock_or_record() {
        let dir = tempfile::tempdir().unwrap();
        let (repo, c) = repo(&dir.path().join("r.git"));
        let intents = dir.path().join("locks");
        let mut intent = Intent::new(&intents);
        let name = "refs/heads/main";
        let set = |i: &mut Intent, e| set_ref(&repo, i, name, c, e, Point::Other, "t").unwrap();
        assert_eq!(set(&mut intent, Expect::Is(Some(c))), SetRef::Differs(None));
        assert_eq!(set(&mut intent, Expect::Is(None)), SetRef::Set);
        assert_eq!(repo.refname_to_id(name).unwrap(), c);
        assert_eq!(set(&mut intent, Expect::Is(None)), SetRef::Differs(Some(c)));
        assert!(!ref_lock_path(&repo, name).exists());
        assert_eq!(std::fs::read_dir(&intents).unwrap().count(), 0, "no record left");
        // A lock someone else holds is reported, never removed.
        std::fs::write(ref_lock_path(&repo, name), "").unwrap();
        assert_eq!(
            set(&mut intent, Expect::Any),
            SetRef::Locked(ref_lock_path(&repo, name))
        );
        assert!(ref_lock_path(&repo, name).exists());
    }

    #[test]
    fn only_a_dead_processs_own_locks_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let (repo, _) = repo(&dir.path().join("r.git"));
        let intents = dir.path().join("locks");
        std::fs::create_dir_all(&intents).unwrap();
        let held = take(dir.path()).unwrap();
        let ours = ref_lock_path(&repo, "refs/heads/a");
        let theirs = ref_lock_path(&repo, "refs/heads/b");
        let reused = ref_lock_path(&repo, "refs/heads/c");
        std::fs::create_dir_all(ours.parent().unwrap()).unwrap();
        std::fs::write(&ours, "").unwrap();
        std::fs::write(&reused, "").unwrap();
        let id = |p: &Path| {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(p).unwrap();
            (Some(m.ino()), Some(ctime_ns(&m)))
        };
        let (ino, ctime) = id(&ours);
        // A process that does not exist (pid beyond pid_max) named three locks: its
        // own (by identity), one by another file at the path now (a lock a person's
        // git took since), and one it never recorded an identity for, made long after.
        let record = Record {
            moving: None,
            pid: 4_194_305,
            start_time: Some(1),
            locks: vec![
                Named {
                    path: ours.clone(),
                    ino,
                    ctime_ns: ctime,
                },
                // The identity of another file that exists (`ours`): never `reused`'s.
                Named {
                    path: reused.clone(),
                    ino,
                    ctime_ns: ctime,
                },
                Named {
                    path: theirs.clone(),
                    ino: None,
                    ctime_ns: None,
                },
            ],
        };
        let rec = intents.join(format!("{INTENT_PREFIX}4194305.json"));
        std::fs::write(&rec, serde_json::to_vec(&record).unwrap()).unwrap();
        let old = std::time::SystemTime::now() - Duration::from_secs(60);
        std::fs::File::open(&rec).unwrap().set_modified(old).unwrap();
        std::fs::write(&theirs, "").unwrap();
        // A live process's record (this one's parent's pid, say) is left alone.
        let live = Record {
            moving: None,
            pid: std::os::unix::process::parent_id(),
            start_time: process_start_time(std::os::unix::process::parent_id()),
            locks: vec![Named {
                path: theirs.clone(),
                ino: None,
                ctime_ns: None,
            }],
        };
        let live_rec = intents.join(format!("{INTENT_PREFIX}{}.json", live.pid));
        std::fs::write(&live_rec, serde_json::to_vec(&live).unwrap()).unwrap();
        // And a stale lock in the private namespace.
        let private = dir.path().join("r.git/refs/runtime-sync/fetched/origin/main.lock");
        std::fs::create_dir_all(private.parent().unwrap()).unwrap();
        std::fs::write(&private, "").unwrap();
        let removed = recover(&held, &intents, &dir.path().join("r.git")).removed;
        assert_eq!(removed.len(), 2, "{removed:?}");
        assert!(!ours.exists() && !private.exists());
        assert!(
            theirs.exists(),
            "made after the record: not provably the dead process's"
        );
        assert!(reused.exists(), "another file at the path");
        assert!(!rec.exists() && live_rec.exists());
    }
}
