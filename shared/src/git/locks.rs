//! Intent records, which git locks a runtime process is about to hold, and taking
//! and releasing those locks.
//!
//! A runtime killed while it holds a git lock leaves the lock behind, and git (the
//! engineer's and every later fire's) then refuses to work. Before creating a lock the
//! runtime writes what it is about to lock into `.runtime/locks/git-intent-<pid>.json`
//! (fsynced), and removes the record once the locks are gone. The next commit judges
//! each record: a record whose process is gone (no `/proc/<pid>`, or a process there
//! that started at another time: the pid was reused) had its locks removed, exactly
//! those it names, and only when they are provably the dead process's (see
//! [`recover_stale_locks`]). A lock with no record is never touched: it may be a
//! person's git at work.

use super::GitError;
use git2::Oid;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where a repository's commits keep their intent records: `<root>/.runtime/locks`.
pub fn intent_dir(root: &Path) -> PathBuf {
    root.join(crate::layout::STATE_DIR).join("locks")
}

/// `<path>.lock`, git's name for the lock of `path`.
pub(super) fn lock_path_of(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".lock");
    PathBuf::from(s)
}

/// Creates `lock` exclusively, waiting up to `wait` while another process holds it.
/// Returns the inode of the lock file created.
pub(super) fn take_index_lock(lock: &Path, wait: Duration) -> Result<LockId, GitError> {
    take_marked_lock(lock, wait, Unmarked::Allowed)
}

/// Whether a lock may be created and then written, where it cannot be created whole
/// ([`create_lock_with`]): a kill in between leaves it empty, and only an intent
/// record that names it lets the next runtime remove it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Unmarked {
    /// The caller's intent record names the lock.
    Allowed,
    /// No record names it: the lock is created whole or not taken.
    Refused,
}

/// [`take_index_lock`], the lock holding [`HOLDER_MARK`] with this process's pid
/// and start time.
fn take_marked_lock(lock: &Path, wait: Duration, unmarked: Unmarked) -> Result<LockId, GitError> {
    let deadline = std::time::Instant::now() + wait;
    let pid = std::process::id();
    // An unknown start time is written as `-`: read back, it is none, and the holder
    // is judged by its pid alone (never taken for a reused pid).
    let started = process_start_time(pid).map_or_else(|| "-".to_string(), |t| t.to_string());
    let mark = format!("{HOLDER_MARK} {pid} {started}\n");
    loop {
        match create_lock_with(lock, mark.as_bytes(), unmarked) {
            Ok(m) => return Ok(LockId::of(&m)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                if remove_if_dead_holder(lock) {
                    continue;
                }
                if std::time::Instant::now() >= deadline {
                    return Err(GitError::Locked {
                        path: lock.to_path_buf(),
                        waited: wait,
                    });
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            Err(e) => {
                return Err(GitError::Io {
                    path: lock.to_path_buf(),
                    source: e,
                })
            }
        }
    }
}

/// Creates `lock` holding `mark`, whole or not at all: an unnamed file in the lock's
/// directory (`O_TMPFILE`) is written first, then given the lock's name (`linkat`,
/// which fails when the name exists), so a kill at any moment leaves no lock or one
/// that names its holder. Where that cannot be done (a file system without
/// `O_TMPFILE`, a sandbox that refuses the link), the lock is created, then written.
/// Returns the lock's metadata once it holds the mark.
fn create_lock_with(lock: &Path, mark: &[u8], unmarked: Unmarked) -> std::io::Result<std::fs::Metadata> {
    use std::io::Write;
    match link_written(lock, mark, false) {
        Ok(m) => Ok(m),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists || unmarked == Unmarked::Refused => Err(e),
        Err(e) => {
            tracing::debug!(error = %e, "an unnamed lock file could not be linked: created, then written");
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).open(lock)?;
            f.write_all(mark)?;
            f.metadata()
        }
    }
}

/// [`create_lock_with`]'s first way: `O_TMPFILE`, written (and with `durable`,
/// flushed to disk), linked by its `/proc/self/fd` name.
fn link_written(lock: &Path, mark: &[u8], durable: bool) -> std::io::Result<std::fs::Metadata> {
    use rustix::fs::{AtFlags, Mode, OFlags, CWD};
    use std::io::Write;
    use std::os::fd::AsRawFd;
    let dir = lock_dir(lock);
    let fd = rustix::fs::open(
        dir,
        OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o644),
    )?;
    let mut file = std::fs::File::from(fd);
    file.write_all(mark)?;
    if durable {
        file.sync_data()?;
    }
    let by_fd = format!("/proc/self/fd/{}", file.as_raw_fd());
    rustix::fs::linkat(CWD, by_fd.as_str(), CWD, lock, AtFlags::SYMLINK_FOLLOW)?;
    file.metadata()
}

/// The first word of what a runtime writes into every git index lock it takes,
/// followed by its pid and start time: a lock taken with no intent record
/// ([`make_dirs_under_index_lock`]) is judged by it.
const HOLDER_MARK: &str = "runtime-lock";

/// The directory `lock` is in (`.` for a bare name).
fn lock_dir(lock: &Path) -> &Path {
    lock.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// An exclusive `flock` of `lock`'s directory, held while a runtime removes a lock
/// another process left ([`remove_if_dead_holder`], [`recover_stale_locks`]): only
/// for a `stat` and an `unlink`, so waiting for it is short. `None` when the
/// directory cannot be opened or locked.
fn one_remover(lock: &Path) -> Option<OwnedFd> {
    use rustix::fs::{FlockOperation, Mode, OFlags};
    let dir = lock_dir(lock);
    let fd = rustix::fs::open(dir, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    rustix::fs::flock(&fd, FlockOperation::LockExclusive).ok()?;
    Some(fd)
}

/// The pid a runtime's mark in `lock` names ([`HOLDER_MARK`]), with its start time.
fn marked_holder(lock: &Path) -> Option<(u32, Option<u64>)> {
    if std::fs::symlink_metadata(lock).ok()?.len() > 64 {
        return None;
    }
    let text = std::fs::read_to_string(lock).ok()?;
    let mut words = text.split_whitespace();
    if words.next() != Some(HOLDER_MARK) {
        return None;
    }
    let pid = words.next()?.parse().ok()?;
    Some((pid, words.next().and_then(|s| s.parse().ok())))
}

/// Removes `lock` when a runtime process marked it as its own ([`HOLDER_MARK`]) and
/// that process is gone (killed while it held the lock for a `mkdir`). Git's own
/// locks hold an index or a ref, never that mark, and are never touched.
fn remove_if_dead_holder(lock: &Path) -> bool {
    let Ok(meta) = std::fs::symlink_metadata(lock) else {
        return false;
    };
    if !meta.is_file() {
        return false;
    }
    let Some((pid, start)) = marked_holder(lock) else {
        return false;
    };
    if !process_is_gone(pid, start) {
        return false;
    }
    // One remover at a time (an exclusive `flock` of the lock's directory, which git
    // never takes): between two runtimes that both found the dead lock, the second
    // could otherwise remove the lock someone took after the first removed it. Under
    // it the name still holds the dead lock, as only a remover takes a lock away.
    let Some(_one_remover) = one_remover(lock) else {
        return false;
    };
    let removed = remove_if_same(lock, LockId::of(&meta)).unwrap_or(false);
    if removed {
        tracing::warn!(lock = %lock.display(), pid, "a lock a killed runtime held was removed");
    }
    removed
}

/// The index lock of the repository whose work tree is `root`: `<root>/.git/index.lock`,
/// or, where `.git` is a file (a linked worktree, a submodule), the one in the git
/// directory it names.
fn index_lock_of_work_tree(root: &Path) -> Option<PathBuf> {
    let dot_git = root.join(".git");
    let meta = std::fs::metadata(&dot_git).ok()?;
    let git_dir = if meta.is_dir() {
        dot_git
    } else {
        let text = std::fs::read_to_string(&dot_git).ok()?;
        let named = Path::new(text.strip_prefix("gitdir:")?.trim());
        root.join(named)
    };
    Some(lock_path_of(&git_dir.join("index")))
}

/// Makes the directory `rel` exist under the work tree `root` ([`crate::beneath::make_dirs`]),
/// creating any missing level with git's index lock held. A person's `git checkout`
/// or rebase step holds that lock while it updates the work tree, and git checks a
/// directory is missing before it makes it: a directory of ours made in between stops
/// git half-way (`cannot create directory at 'runs/t': Is a directory`). A directory
/// that exists costs one `stat` and no lock. A lock still held after `wait` (a
/// person's git left it) is waited out no longer: the directory is made anyway, as a
/// record is never lost. The lock names this process ([`HOLDER_MARK`]), so one left by
/// a kill is removed by the next runtime that meets it.
pub fn make_dirs_under_index_lock(root: &Path, rel: &Path, wait: Duration) -> std::io::Result<()> {
    if std::fs::symlink_metadata(root.join(rel)).is_ok_and(|m| m.is_dir()) {
        return Ok(());
    }
    let Some(lock) = index_lock_of_work_tree(root) else {
        return crate::beneath::make_dirs(root, rel);
    };
    let _held = match take_marked_lock(&lock, wait, Unmarked::Refused) {
        Ok(id) => Some(HeldLock { path: lock, id }),
        Err(e) => {
            tracing::warn!(error = %e, dir = %rel.display(), "git's index lock stayed held: the records directory is made without it");
            None
        }
    };
    crate::failpoint!("records-dir-locked");
    crate::beneath::make_dirs(root, rel)
}

/// Runs `f` with git's index lock of the work tree `root` held (marked as this
/// process's, as [`make_dirs_under_index_lock`] takes it), so that no person's
/// checkout, rebase step or commit changes the work tree or the index meanwhile (each
/// takes that lock first, and fails or waits while it is held). `None` when the lock
/// stays another's past `wait`, or the work tree has no git directory: `f` did not run.
/// The lock is released however `f` ends, a panic included (a person's git would
/// otherwise meet it until the next fire removed it).
pub fn with_index_lock<T>(root: &Path, wait: Duration, f: impl FnOnce() -> T) -> Option<T> {
    let lock = index_lock_of_work_tree(root)?;
    let id = take_marked_lock(&lock, wait, Unmarked::Refused).ok()?;
    let _held = HeldLock { path: lock, id };
    Some(f())
}

/// A lock this process took, released when dropped (if it is still the one taken).
struct HeldLock {
    path: PathBuf,
    id: LockId,
}

impl Drop for HeldLock {
    fn drop(&mut self) {
        if let Err(e) = remove_if_same(&self.path, self.id) {
            tracing::warn!(lock = %self.path.display(), error = %e, "the index lock was not released");
        }
    }
}

/// Removes `path` if it is still the file `id` names.
pub(super) fn remove_if_same(path: &Path, id: LockId) -> std::io::Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if LockId::of(&m) == id => std::fs::remove_file(path).map(|()| true),
        Ok(_) => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// The private files a commit by process `pid` keeps beside the index: the copy it
/// writes the new index into (libgit2 writes it through `<copy>.lock`), and the
/// index as it was, to put back if the commit fails.
pub(super) struct SideFiles {
    pub(super) temp_index: PathBuf,
    pub(super) saved_index: PathBuf,
}

impl SideFiles {
    pub(super) fn of(index_path: &Path, pid: u32) -> SideFiles {
        let side = |what: &str| {
            index_path.with_file_name(format!(
                "{}.runtime-{pid}{what}",
                index_path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
            ))
        };
        SideFiles {
            temp_index: side(""),
            saved_index: side(".orig"),
        }
    }
}

/// Every file a commit creates in `.git` and may leave behind if killed: the index
/// lock, its side files, the lock libgit2 takes to write the private index copy, and
/// the branch's ref lock.
pub(super) fn intent_locks(index_lock: &Path, side: &SideFiles, ref_lock: &Path) -> Vec<IntentLock> {
    vec![
        IntentLock::path(index_lock),
        IntentLock::path(&side.temp_index),
        IntentLock::path(&lock_path_of(&side.temp_index)),
        IntentLock::path(&side.saved_index),
        IntentLock::path(ref_lock),
    ]
}

/// How long after an intent was last written the runtime may create a lock it names
/// without having recorded the lock's inode (libgit2 takes a ref lock milliseconds
/// after the record names it).
pub(super) const LOCK_GRACE: Duration = Duration::from_secs(2);

/// Prefix of intent record files.
pub(super) const INTENT_PREFIX: &str = "git-intent-";

/// One lock an intent names; `inode` (and `ctime_ns`) once the lock exists and is
/// known to be ours.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct IntentLock {
    pub path: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inode: Option<u64>,
    /// The lock's change time in ns: a file system reuses a freed inode number at
    /// once, so a runtime killed after it released its lock but before it dropped its
    /// intent would otherwise name a lock someone else's git took since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ctime_ns: Option<i64>,
}

impl IntentLock {
    pub(super) fn path(p: &Path) -> IntentLock {
        IntentLock {
            path: p.to_path_buf(),
            inode: None,
            ctime_ns: None,
        }
    }

    /// Whether the file `m` describes is the one this names by identity.
    fn is(&self, m: &std::fs::Metadata) -> Option<bool> {
        let ino = self.inode?;
        let id = LockId::of(m);
        Some(id.ino == ino && self.ctime_ns.is_none_or(|c| c == id.ctime_ns))
    }
}

/// Which file a lock is: its inode and change time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct LockId {
    pub(super) ino: u64,
    pub(super) ctime_ns: i64,
}

impl LockId {
    pub(super) fn of(m: &std::fs::Metadata) -> LockId {
        use std::os::unix::fs::MetadataExt;
        LockId {
            ino: m.ino(),
            ctime_ns: m.ctime().saturating_mul(1_000_000_000).saturating_add(m.ctime_nsec()),
        }
    }
}

/// What `.runtime/locks/git-intent-<pid>.json` holds.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct IntentRecord {
    pub pid: u32,
    /// The process's start time (`/proc/<pid>/stat` field 22, clock ticks since
    /// boot), so a reused pid is not taken for the runtime.
    pub start_time: Option<u64>,
    pub locks: Vec<IntentLock>,
    /// The records being committed: a dead runtime that moved the branch but never
    /// wrote the index left these out of the index, and the next commit adds them.
    #[serde(default)]
    pub files: Vec<String>,
    /// The commit about to become the branch's tip, once written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// When this record was saved (ns since the epoch): a lock named by its path
    /// alone is the writer's only if not newer than this plus [`LOCK_GRACE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub saved_ns: Option<i64>,
    /// The blob id of each of `files` as its writer held it: the next commit takes a
    /// file in only while the work tree still holds those bytes (a later fire's model
    /// may edit an uncommitted report under `reports/`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub blobs: std::collections::BTreeMap<String, String>,
}

/// This process's intent record and where it lives.
pub(super) struct Intent {
    path: PathBuf,
    pub(super) record: IntentRecord,
    /// Whether the directory entry is durable (after the first save).
    dir_synced: bool,
    /// Whether this process has written to the file (its first save makes it whole,
    /// or appends to what a failed commit of the same pid left).
    opened: bool,
    /// Whether saving fsyncs at all ([`super::CommitOptions::durable_intent`]).
    pub(super) durable: bool,
}

impl Intent {
    pub(super) fn new(dir: &Path, files: &[(String, Oid)]) -> Intent {
        let pid = std::process::id();
        let mut intent = Intent {
            path: dir.join(format!("{INTENT_PREFIX}{pid}.json")),
            record: IntentRecord {
                pid,
                start_time: process_start_time(pid),
                locks: vec![],
                files: vec![],
                commit: None,
                saved_ns: None,
                blobs: Default::default(),
            },
            dir_synced: false,
            opened: false,
            durable: true,
        };
        intent.name(files);
        intent
    }

    /// Adds `files` to the records this intent names (once each), with their blob ids.
    pub(super) fn name(&mut self, files: &[(String, Oid)]) {
        for (f, b) in files {
            if !self.record.files.contains(f) {
                self.record.files.push(f.clone());
            }
            self.record.blobs.insert(f.clone(), b.to_string());
        }
    }

    /// After a failed commit, with every lock released: the record keeps naming the
    /// records and no lock, so the next commit (once this process is gone, or a later
    /// one of this process) takes them in.
    pub(super) fn leave_pending(&mut self) {
        self.record.locks.clear();
        self.record.commit = None;
        if let Err(e) = self.save() {
            tracing::warn!(error = %e, "the records left for the next commit were not recorded");
        }
    }

    /// Writes the record before any lock it names is created. The first save makes
    /// the file whole (written unnamed, then linked: no reader ever sees it half
    /// written); later ones append a line each, so the record before stays whole if
    /// this process dies mid-write (readers take the last whole line,
    /// [`last_record`]). Appending rather than renaming a temporary file over the
    /// record makes no new file and frees none: on a file system that scans recently
    /// freed inodes for every new one, each costs a fire time (docs/benchmarks.md).
    /// When durable, with an fsync of the file and, the first time, of the directory.
    pub(super) fn save(&mut self) -> Result<(), GitError> {
        use std::io::Write;
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |e| GitError::Io { path, source: e }
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        if !self.opened {
            std::fs::create_dir_all(dir).map_err(io(dir))?;
        }
        self.record.saved_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .ok()
            .and_then(|d| i64::try_from(d.as_nanos()).ok());
        let json = serde_json::to_vec(&self.record).map_err(|e| GitError::Io {
            path: self.path.clone(),
            source: std::io::Error::other(e),
        })?;
        // Every line starts a line of its own: after a torn or failed write too.
        let line = [b"\n".as_slice(), &json, b"\n"].concat();
        let linked = !self.opened && link_written(&self.path, &line, self.durable).is_ok();
        self.opened = true;
        if !linked {
            // A record this pid left earlier (its own failed commit's), a later save,
            // or no unnamed files here.
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&self.path)
                .map_err(io(&self.path))?;
            f.write_all(&line).map_err(io(&self.path))?;
            if self.durable {
                f.sync_data().map_err(io(&self.path))?;
            }
        }
        if self.durable && !self.dir_synced {
            std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
            self.dir_synced = true;
        }
        Ok(())
    }

    pub(super) fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The record an intent file holds ([`last_record`]), or `None`: for a temporary
/// file (an older runtime's, written then renamed; removed once a minute old, a
/// live writer's is younger) and for a file with no whole record (left alone, named
/// in the log: a record is written whole before any lock it names is taken, so this
/// is another program's file, or a newer runtime's record this one cannot read).
fn readable_record(path: &Path, name: &str, meta: &std::fs::Metadata) -> Option<IntentRecord> {
    if name.ends_with(".json.tmp") {
        let old = meta.modified().ok().and_then(|m| m.elapsed().ok());
        if old.is_some_and(|age| age > Duration::from_secs(60)) {
            let _ = std::fs::remove_file(path);
        }
        return None;
    }
    let record = last_record(&std::fs::read(path).ok()?);
    if record.is_none() {
        tracing::warn!(path = %path.display(), "unreadable git intent record left alone");
    }
    record
}

/// The newest whole record of an intent file: its last line that parses (a writer
/// killed mid-append leaves a torn last line; the record before it stands).
fn last_record(text: &[u8]) -> Option<IntentRecord> {
    text.split(|b| *b == b'\n')
        .rev()
        .find_map(|line| serde_json::from_slice::<IntentRecord>(line).ok())
}

/// The start time of process `pid` in clock ticks since boot, `None` when it cannot
/// be read (no such process, no `/proc`).
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // `pid (comm) state ...`: comm may hold spaces and parentheses; fields after the
    // last `)` start at field 3, so field 22 is the 20th of them.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process an intent names is gone: no `/proc/<pid>` (on a system with
/// `/proc`), a zombie, or another process that reuses the pid.
pub fn process_is_gone(pid: u32, start_time: Option<u64>) -> bool {
    if !Path::new("/proc/self/stat").exists() {
        return false; // cannot tell: assume it lives
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return false;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    if fields.first() == Some(&"Z") || fields.first() == Some(&"X") {
        return true;
    }
    match (start_time, fields.get(19).and_then(|f| f.parse::<u64>().ok())) {
        (Some(recorded), Some(now)) => recorded != now,
        _ => false,
    }
}

/// What [`recover_stale_locks`] did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovered {
    /// Lock files removed.
    pub removed: Vec<PathBuf>,
    /// Files dead runtimes were committing, or that a failed commit left for the next
    /// one (added to the index if HEAD has them).
    pub orphaned_files: Vec<String>,
    /// The blob id each of those files had when its writer held it, where recorded.
    pub blobs: std::collections::BTreeMap<String, String>,
}

/// Leaves `files` (repo-relative, with the bytes their writer holds) for the next
/// commit of any runtime process: records a fire wrote and could not commit (git's
/// index lock held by a person's git past the wait, a branch that kept moving). They
/// join this process's intent record, which names no lock; the next commit, once this
/// process is gone (or this process's own next one), commits each file whose work-tree
/// bytes are still those, with its own records.
pub fn leave_for_next_commit(intent_dir: &Path, files: &[(String, Vec<u8>)]) -> Result<(), GitError> {
    let hashed = files
        .iter()
        .map(|(f, bytes)| Ok((f.clone(), Oid::hash_object(git2::ObjectType::Blob, bytes)?)))
        .collect::<Result<Vec<_>, git2::Error>>()?;
    let mut intent = Intent::new(intent_dir, &[]);
    if let Some(old) = std::fs::read(&intent.path).ok().and_then(|b| last_record(&b)) {
        intent.record.files = old.files;
        intent.record.blobs = old.blobs;
    }
    intent.name(&hashed);
    intent.save()
}

/// An intent record held by a process other than a fire's commit (the builder's
/// commands: an approval's ref, a merge's index and branch): it names the locks the
/// process is about to take, written durably before the first of them, so that
/// [`recover_stale_locks`] removes exactly those if the process dies holding them.
/// Dropping it removes the record (after the locks are released).
pub struct LockIntent(Intent);

impl LockIntent {
    /// Records that this process is about to take `locks`.
    pub fn hold(dir: &Path, locks: &[PathBuf]) -> Result<LockIntent, GitError> {
        let mut intent = Intent::new(dir, &[]);
        intent.record.locks = locks.iter().map(|l| IntentLock::path(l)).collect();
        intent.save()?;
        Ok(LockIntent(intent))
    }
}

impl Drop for LockIntent {
    fn drop(&mut self) {
        self.0.remove();
    }
}

/// The lock file git takes to write `path` (`<path>.lock`).
pub fn lock_file_of(path: &Path) -> PathBuf {
    lock_path_of(path)
}

/// Judges every intent record in `dir`. A record of a live process is left alone. For
/// a dead one, each lock it names is removed if it still exists and is provably the
/// dead process's: the inode and change time the record holds, or, when none was
/// recorded, a file not newer than the record (plus [`LOCK_GRACE`], the time within
/// which the runtime creates such a lock after writing the record). Then the record is
/// removed.
pub fn recover_stale_locks(dir: &Path) -> Result<Recovered, GitError> {
    let mut out = Recovered::default();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => {
            return Err(GitError::Io {
                path: dir.to_path_buf(),
                source: e,
            })
        }
    };
    let own_start = process_start_time(std::process::id());
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(INTENT_PREFIX) {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = std::fs::metadata(&path) else { continue };
        let Some(record) = readable_record(&path, &name, &meta) else {
            continue;
        };
        if record.pid == std::process::id() && record.start_time == own_start {
            // This process's own record, left by a commit of its own that failed: it
            // holds no lock now (commits run one at a time), only records.
            out.orphaned_files.extend(record.files);
            out.blobs.extend(record.blobs);
            std::fs::remove_file(&path).map_err(|e| GitError::Io { path, source: e })?;
            continue;
        }
        if !process_is_gone(record.pid, record.start_time) {
            continue;
        }
        // When the record in force was saved: a later line torn by the kill moved
        // the file's time, not the record's.
        let written = match record.saved_ns.and_then(|ns| u64::try_from(ns).ok()) {
            Some(ns) => Some(std::time::UNIX_EPOCH + Duration::from_nanos(ns)),
            None => meta.modified().ok(),
        };
        for lock in &record.locks {
            let Ok(m) = std::fs::symlink_metadata(&lock.path) else {
                continue;
            };
            // A lock that names a live runtime is that runtime's, whatever its age.
            let live_holder = || {
                marked_holder(&lock.path).is_some_and(|(pid, start)| pid != record.pid && !process_is_gone(pid, start))
            };
            let ours = match lock.is(&m) {
                Some(same) => same,
                None => match (m.modified().ok(), written) {
                    (Some(lm), Some(w)) => lm <= w + LOCK_GRACE && !live_holder(),
                    _ => false,
                },
            };
            let _one = ours.then(|| one_remover(&lock.path));
            let still_ours =
                ours && std::fs::symlink_metadata(&lock.path).is_ok_and(|now| LockId::of(&now) == LockId::of(&m));
            if still_ours && std::fs::remove_file(&lock.path).is_ok() {
                tracing::warn!(lock = %lock.path.display(), pid = record.pid, "removed a git lock a dead runtime left");
                out.removed.push(lock.path.clone());
            }
        }
        out.orphaned_files.extend(record.files);
        out.blobs.extend(record.blobs);
        std::fs::remove_file(&path).map_err(|e| GitError::Io { path, source: e })?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sets `path`'s modification time to `at`.
    fn backdate(path: &Path, at: std::time::SystemTime) {
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(at)
            .unwrap();
    }

    /// A record is appended line by line: a writer killed mid-append leaves a torn
    /// line after the record it had, which stands, dated by its own save time (not
    /// the file's, which the torn write moved); a file with no whole record is left
    /// alone (the first record is written whole, so it is no runtime's half-written
    /// one).
    #[test]
    fn a_torn_intent_line_leaves_the_record_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let old = std::time::SystemTime::now() - Duration::from_secs(120);
        let old_ns = old.duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as i64;
        let stale = root.join("index.lock");
        std::fs::write(&stale, "").unwrap();
        backdate(&stale, old);
        // Made after the record was saved, past the grace: someone else's.
        let later = root.join("HEAD.lock");
        std::fs::write(&later, "").unwrap();
        // A process that is gone (no such pid) named both by path, then began a
        // second save and was killed in it (which stamped the file now).
        let whole = serde_json::json!({"pid": i32::MAX, "start_time": 1, "saved_ns": old_ns,
            "locks": [{"path": stale}, {"path": later}], "files": ["runs/t/a.json"]});
        let intent = root.join(format!("{INTENT_PREFIX}{}.json", i32::MAX));
        std::fs::write(&intent, format!("\n{whole}\n\n{{\"pid\": {}, \"start_ti", i32::MAX)).unwrap();
        let recovered = recover_stale_locks(root).unwrap();
        assert_eq!(
            recovered.removed,
            vec![stale.clone()],
            "the whole record's own lock goes, no other"
        );
        assert!(later.exists());
        assert_eq!(recovered.orphaned_files, vec!["runs/t/a.json".to_string()]);
        assert!(!intent.exists());
        // No whole record: left alone, however old.
        std::fs::write(&intent, "{\"pid\": 12").unwrap();
        backdate(&intent, old);
        assert_eq!(recover_stale_locks(root).unwrap(), Recovered::default());
        assert!(intent.exists(), "an unreadable record is left alone");
    }

    /// A record under this process's pid that another process wrote (a pid reused,
    /// after a reboot say: another start time) is judged as a dead process's, its
    /// lock removed, not taken for this process's own.
    #[test]
    fn a_record_of_a_reused_pid_is_a_dead_processs() {
        let dir = tempfile::tempdir().unwrap();
        let lock = dir.path().join("index.lock");
        std::fs::write(&lock, "").unwrap();
        let old = std::time::SystemTime::now() - Duration::from_secs(120);
        backdate(&lock, old);
        let pid = std::process::id();
        let record = serde_json::json!({"pid": pid, "start_time": 1, "locks": [{"path": lock}], "files": []});
        let intent = dir.path().join(format!("{INTENT_PREFIX}{pid}.json"));
        std::fs::write(&intent, record.to_string()).unwrap();
        backdate(&intent, old);
        assert_eq!(recover_stale_locks(dir.path()).unwrap().removed, vec![lock.clone()]);
        assert!(!lock.exists() && !intent.exists());
    }

    /// Saves append whole lines, the first after what the same pid left on a line of
    /// its own, and the last line read is the newest record.
    #[test]
    fn intent_saves_append_and_the_last_line_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("{INTENT_PREFIX}{}.json", std::process::id()));
        std::fs::write(
            &path,
            br#"{"pid": 1, "start_time": null, "locks": [], "files": ["runs/t/old.json"]}"#,
        )
        .unwrap();
        let mut intent = Intent::new(dir.path(), &[]);
        intent.durable = false;
        intent.record.files = vec!["runs/t/a.json".into()];
        intent.save().unwrap();
        intent.record.files.push("runs/t/b.json".into());
        intent.save().unwrap();
        let text = std::fs::read(&path).unwrap();
        assert_eq!(
            text.split(|b| *b == b'\n').filter(|l| !l.is_empty()).count(),
            3,
            "{}",
            String::from_utf8_lossy(&text)
        );
        assert_eq!(
            last_record(&text).unwrap().files,
            vec!["runs/t/a.json", "runs/t/b.json"]
        );
        // A first save where nothing was: the file whole at once.
        let fresh = tempfile::tempdir().unwrap();
        let mut first = Intent::new(fresh.path(), &[]);
        first.durable = false;
        first.save().unwrap();
        let text = std::fs::read(&first.path).unwrap();
        assert!(last_record(&text).is_some_and(|r| r.pid == std::process::id()));
    }

    /// A missing directory waits for a lock someone holds and is made once it goes; a
    /// lock of git's own that stays is waited out and the directory made anyway; a
    /// lock a dead runtime marked is removed at once; one a live runtime marked is not.
    #[test]
    fn a_records_directory_waits_for_gits_index_lock() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        git2::Repository::init(&root).unwrap();
        let lock = root.join(".git/index.lock");
        std::fs::write(&lock, b"DIRC git's own index being written").unwrap();
        let (release, root2) = (lock.clone(), root.clone());
        let maker = std::thread::spawn(move || {
            make_dirs_under_index_lock(&root2, Path::new("runs/t/day"), Duration::from_secs(20)).unwrap();
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(!root.join("runs").exists(), "made while git held its lock");
        std::fs::remove_file(&release).unwrap();
        maker.join().unwrap();
        assert!(root.join("runs/t/day").is_dir() && !lock.exists());
        // An existing directory takes no lock, whoever holds it.
        std::fs::write(&lock, b"DIRC").unwrap();
        make_dirs_under_index_lock(&root, Path::new("runs/t/day"), Duration::ZERO).unwrap();
        // Git's lock past the wait: made anyway, the lock left as it was.
        make_dirs_under_index_lock(&root, Path::new("runs/t/other"), Duration::from_millis(50)).unwrap();
        assert!(root.join("runs/t/other").is_dir());
        assert_eq!(std::fs::read(&lock).unwrap(), b"DIRC");
        // A runtime that is gone (no such pid): its lock goes at once.
        std::fs::write(&lock, format!("{HOLDER_MARK} {} 1\n", i32::MAX)).unwrap();
        make_dirs_under_index_lock(&root, Path::new("cards/day"), Duration::ZERO).unwrap();
        assert!(root.join("cards/day").is_dir() && !lock.exists());
        // A live one (this process): kept.
        let live = format!(
            "{HOLDER_MARK} {} {}\n",
            std::process::id(),
            process_start_time(std::process::id()).unwrap()
        );
        std::fs::write(&lock, &live).unwrap();
        make_dirs_under_index_lock(&root, Path::new("cards/later"), Duration::ZERO).unwrap();
        assert_eq!(std::fs::read_to_string(&lock).unwrap(), live);
    }

    /// The index lock [`with_index_lock`] takes is held while its work runs and
    /// released however the work ends, a panic included: a person's git must not
    /// meet it after.
    #[test]
    fn the_index_lock_is_released_when_the_work_under_it_panics() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        git2::Repository::init(&root).unwrap();
        let lock = root.join(".git/index.lock");
        let held = with_index_lock(&root, Duration::ZERO, || lock.exists());
        assert_eq!(held, Some(true), "held while the work runs");
        assert!(!lock.exists());
        let root2 = root.clone();
        let panicked = std::thread::spawn(move || {
            with_index_lock(&root2, Duration::ZERO, || {
                assert!(root2.join(".git/index.lock").exists());
                panic!("the work failed");
            })
        })
        .join();
        assert!(panicked.is_err(), "the work panicked");
        assert!(!lock.exists(), "the lock outlived a panic");
    }
}
