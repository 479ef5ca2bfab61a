//! The runtime's commit of a set of *new* files under a given identity, refusing any
//! path outside an allowed set. The commit is built from HEAD's tree plus the new
//! files (never from whatever the index holds), so an engineer's staged work is never
//! swept into a runtime commit. It is made under git's index lock, index before
//! branch, the branch moved by compare-and-swap, so an engineer committing at the same
//! second neither loses the records nor has theirs lost ([`commit_new_files_with`]);
//! intent records let the next commit remove exactly the git locks a killed runtime
//! left ([`super::recover_stale_locks`]), and take in the records it, or a blocked
//! fire, left behind.

use super::index::{index_path, save_index, write_index};
use super::locks::{
    intent_dir, intent_locks, lock_path_of, remove_if_same, take_index_lock, Intent, IntentLock, LockId, Recovered,
    SideFiles,
};
use super::recent::{remember_records, watched_records};
use super::{commit_blocker, head_commit, recover_stale_locks, workdir, Blocker, GitError};
use git2::{build::TreeUpdateBuilder, FileMode, Oid, Repository, Signature};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long [`commit_new_files`] waits for git's index lock held by someone else.
pub const INDEX_LOCK_WAIT: Duration = Duration::from_secs(5);
/// How often [`commit_new_files`] rebuilds its commit on a HEAD that moved meanwhile.
pub const COMMIT_TRIES: u32 = 10;

/// How a commit is made; [`CommitOptions::new`] gives what a fire uses.
pub struct CommitOptions<'a> {
    /// Where intent records go (`.runtime/locks`); `None` writes none (and recovers none).
    pub intent_dir: Option<PathBuf>,
    /// How long to wait for an index lock someone else holds.
    pub lock_wait: Duration,
    /// How many times to build the commit on a HEAD that keeps moving.
    pub tries: u32,
    /// Called with the attempt number after the commit object is written and before
    /// the ref moves: tests move HEAD here, at exactly the moment that matters.
    pub before_ref_update: Option<&'a dyn Fn(u32)>,
    /// Files committed (and staged) from these bytes, the ones their writer holds in
    /// memory, never re-read from the work tree, where a tool process may have
    /// replaced them since (a symlink, a FIFO, other bytes).
    pub held: &'a [(String, Vec<u8>)],
    /// Signs the commit object (its text, as git signs it) and returns the armored
    /// signature for its `gpgsig` header: the runtime's `runtime_identity.signing_key`
    /// (`review::runtime_commits`); `None` makes an unsigned commit.
    pub sign: Option<&'a SignCommit<'a>>,
    /// Whether the intent record is fsynced (file and directory) before the locks it
    /// names are taken: `durability: strict`. Without it the record survives a crash
    /// of the process (the page cache keeps it), not a power loss, as the records
    /// themselves under `durability: normal`; each fsync costs a few ms on a disk.
    pub durable_intent: bool,
}

/// Signs a commit's text, returning the armored signature (see [`CommitOptions::sign`]).
pub type SignCommit<'a> = dyn Fn(&str) -> Result<String, String> + 'a;

impl CommitOptions<'_> {
    /// A fire's settings: intents under [`intent_dir`], the default bounds.
    pub fn new(root: &Path) -> CommitOptions<'static> {
        CommitOptions {
            intent_dir: Some(intent_dir(root)),
            lock_wait: INDEX_LOCK_WAIT,
            tries: COMMIT_TRIES,
            before_ref_update: None,
            held: &[],
            sign: None,
            durable_intent: true,
        }
    }
}

/// Commits `files` (repo-relative, already written in the work tree) on top of HEAD.
/// Every file must satisfy `allowed` and must not exist in HEAD: the runtime only
/// ever adds records. A file with an entry in `held` is committed from those bytes
/// ([`CommitOptions::held`]); the others are read from the work tree. Returns the new
/// commit id. See [`commit_new_files_with`].
pub fn commit_new_files(
    repo: &Repository,
    files: &[String],
    held: &[(String, Vec<u8>)],
    allowed: impl Fn(&str) -> bool,
    name: &str,
    email: &str,
    message: &str,
) -> Result<Oid, GitError> {
    let root = workdir(repo)?;
    let opts = CommitOptions {
        held,
        ..CommitOptions::new(&root)
    };
    commit_new_files_with(repo, files, allowed, name, email, message, &opts)
}

/// [`commit_new_files`] done under git's index lock, so HEAD and git's index never
/// disagree about the new files, and no engineer's `git commit` can drop them:
///
/// 1. remove the locks a dead runtime left (see [`recover_stale_locks`]); records it
///    was committing, still in the work tree, join this commit;
/// 2. record the intent (pid, process start time, the lock paths), fsynced;
/// 3. take the index lock (`<index>.lock`, created exclusively), waiting up to
///    `lock_wait` for another git;
/// 4. read HEAD, build the tree (HEAD's tree plus the new files), write the commit;
/// 5. write the index (what is on disk now plus the new files) and rename it over
///    the index, keeping the lock;
/// 6. move the branch with a compare-and-swap against the HEAD read in 4 (with a
///    reflog entry); when HEAD moved meanwhile, go back to 4 on the new tip (the files
///    are new paths, so this never conflicts), at most `tries` times;
/// 7. release the lock, remove the intent.
///
/// The index goes before the branch, unlike in `git commit`, because `git commit`
/// reads HEAD, then the index, and only then takes the lock: publishing HEAD first
/// would let an engineer's commit pair the new HEAD with the index that lacks the
/// records, and commit their deletion. This way a `git commit` that read the old
/// HEAD fails its own compare-and-swap, and one that read the new HEAD reads the new
/// index. When 4-6 fail, the index is put back as it was. Linked worktrees work: the
/// index and HEAD are those of `repo.path()`, the branch and objects those of the
/// common directory, as libgit2 resolves them.
///
/// What no index writer outside git can prevent: a `git commit` that read the index
/// before step 5 and takes the lock after step 7 writes its stale copy back (it
/// refreshes and writes the index before it moves HEAD), and the engineer's next
/// commit then lacks the records. Steps 5-7 follow each other at once to keep that
/// stretch as short as a ref update.
pub fn commit_new_files_with(
    repo: &Repository,
    files: &[String],
    allowed: impl Fn(&str) -> bool,
    name: &str,
    email: &str,
    message: &str,
    opts: &CommitOptions,
) -> Result<Oid, GitError> {
    let root = workdir(repo)?;
    // Never into someone else's operation, never off a branch: the caller leaves the
    // records for a later commit.
    if let Some(b) = commit_blocker(repo)? {
        return Err(GitError::Blocked(b));
    }
    // Every object this commit references is written just below or already in HEAD's
    // tree; skip libgit2's existence re-checks (a measurable share of a fire's time).
    git2::opts::strict_object_creation(false);
    let blobs = own_blobs(repo, &root, files, opts.held, &allowed)?;
    // Refuse a rewrite before taking any lock.
    if let Some(head) = head_commit(repo)? {
        let tree = repo.find_commit(head)?.tree()?;
        refuse_existing(&tree, files)?;
    }
    let index_path = index_path(repo)?;
    let index_lock = lock_path_of(&index_path);
    let branch = head_branch(repo)?;
    let ref_lock = lock_path_of(&ref_file(repo, &branch));
    let side = SideFiles::of(&index_path, std::process::id());
    let mut others = Others::new(repo, &root, files, &allowed);
    if let Some(dir) = &opts.intent_dir {
        others.take_in_dead_runtimes(recover_stale_locks(dir)?);
    }
    let mut pending_taken = others.take_in_pending_refs()?;
    // The new intent names the records of a dead or blocked runtime too: their intent
    // is gone, and if this commit fails or this process dies, the next one must still
    // find them.
    let named: Vec<(String, Oid)> = blobs.iter().chain(&others.orphans).cloned().collect();
    let mut intent = start_intent(opts, &named, intent_locks(&index_lock, &side, &ref_lock))?;
    let held = take_index_lock(&index_lock, opts.lock_wait).inspect_err(|_| {
        if let Some(i) = &mut intent {
            i.leave_pending();
        }
    })?;
    let kept = match &opts.intent_dir {
        Some(dir) => others.take_in_last_commits(dir),
        None => Vec::new(),
    };
    others.put_back_in_work_tree(&mut pending_taken, (name, email));
    let held_bytes: Vec<(String, Vec<u8>)> = opts.held.iter().cloned().chain(others.adopted).collect();
    let parts = CommitParts {
        blobs: &blobs,
        held: &held_bytes,
        orphans: &others.orphans,
        kept: &kept,
        branch: &branch,
        index_path: &index_path,
        temp_index: &side.temp_index,
        saved_index: &side.saved_index,
        name,
        email,
        message,
    };
    let recorded = match &mut intent {
        Some(i) => record_lock_id(i, held),
        None => Ok(()),
    };
    let result = recorded.and_then(|()| commit_locked(repo, &parts, intent.as_mut(), opts));
    release(&index_lock, held, &side);
    if let Some(i) = &mut intent {
        settle_intent(i, &result);
    }
    if let Ok(oid) = &result {
        committed(repo, *oid, opts, files, &others.orphans, &pending_taken);
    }
    result
}

/// The blobs of the commit's own files: from the bytes held for them
/// ([`CommitOptions::held`]), or read from the work tree.
fn own_blobs(
    repo: &Repository,
    root: &Path,
    files: &[String],
    held: &[(String, Vec<u8>)],
    allowed: &impl Fn(&str) -> bool,
) -> Result<Vec<(String, Oid)>, GitError> {
    let mut blobs = Vec::with_capacity(files.len());
    for f in files {
        let oid = match held.iter().find(|(p, _)| p == f) {
            Some((_, bytes)) => {
                check_record_path(f, allowed)?;
                repo.blob(bytes)?
            }
            None => record_blob(repo, root, f, allowed)?,
        };
        blobs.push((f.clone(), oid));
    }
    Ok(blobs)
}

/// Step 2 of [`commit_new_files_with`]: this process's intent, naming `files` and
/// `locks`, saved before any of the locks is taken; `None` without an intent directory.
fn start_intent(
    opts: &CommitOptions,
    files: &[(String, Oid)],
    locks: Vec<IntentLock>,
) -> Result<Option<Intent>, GitError> {
    let Some(dir) = &opts.intent_dir else {
        return Ok(None);
    };
    let mut intent = Intent::new(dir, files);
    intent.durable = opts.durable_intent;
    intent.record.locks = locks;
    intent.save()?;
    Ok(Some(intent))
}

/// The lock's inode, recorded at once: a lock taken after a long wait would otherwise
/// look newer than the record.
fn record_lock_id(intent: &mut Intent, lock: LockId) -> Result<(), GitError> {
    intent.record.locks[0].inode = Some(lock.ino);
    intent.record.locks[0].ctime_ns = Some(lock.ctime_ns);
    intent.save()
}

/// Step 7: releases the index lock (ours, by inode) and removes the side files.
fn release(index_lock: &Path, held: LockId, side: &SideFiles) {
    if let Err(e) = remove_if_same(index_lock, held) {
        tracing::warn!(lock = %index_lock.display(), error = %e, "the index lock was not released");
    }
    let _ = std::fs::remove_file(&side.temp_index);
    let _ = std::fs::remove_file(&side.saved_index);
}

/// Once the locks are released: the intent goes, or after a failed commit keeps only
/// the list of records, for the next commit to take in (see
/// [`super::leave_for_next_commit`]).
fn settle_intent(intent: &mut Intent, result: &Result<Oid, GitError>) {
    match result {
        Ok(_) => intent.remove(),
        Err(_) => intent.leave_pending(),
    }
}

/// After a commit landed: its records join the watched ones, and the refs that kept
/// the pending records it took in go (a crash before this leaves refs whose files
/// HEAD has, which the next commit drops).
fn committed(
    repo: &Repository,
    oid: Oid,
    opts: &CommitOptions,
    files: &[String],
    orphans: &[(String, Oid)],
    pending_taken: &[String],
) {
    if let Some(dir) = &opts.intent_dir {
        let mut all: Vec<String> = files.to_vec();
        all.extend(orphans.iter().map(|(f, _)| f.clone()));
        remember_records(dir, oid, all);
    }
    crate::failpoint!("before-pending-dropped");
    drop_pending_refs(repo, opts, pending_taken);
}

/// Drops the refs that kept the pending records a commit took in, under an intent
/// naming their locks: a process killed while git holds one of them leaves a lock the
/// next commit's recovery removes ([`recover_stale_locks`]: a lock no intent names is
/// never removed, and the ref could never be dropped again).
fn drop_pending_refs(repo: &Repository, opts: &CommitOptions, refs: &[String]) {
    if refs.is_empty() {
        return;
    }
    let mut intent = opts.intent_dir.as_ref().map(|dir| {
        let mut intent = Intent::new(dir, &[]);
        intent.durable = opts.durable_intent;
        intent.record.locks = refs
            .iter()
            .map(|r| IntentLock::path(&lock_path_of(&ref_file(repo, r))))
            .collect();
        intent
    });
    if let Some(Err(e)) = intent.as_mut().map(Intent::save) {
        tracing::warn!(error = %e, "the pending refs are dropped with no intent naming their locks");
    }
    crate::failpoint!("pending-drop-named");
    for reference in refs {
        crate::pending::drop_set(repo, reference);
    }
    if let Some(intent) = &mut intent {
        intent.remove();
    }
}

/// The records a commit takes in besides its own files, each with its blob
/// (`orphans`), and the bytes of those committed as held rather than read from the
/// work tree again (`adopted`).
struct Others<'a, A> {
    repo: &'a Repository,
    root: &'a Path,
    /// The commit's own files.
    files: &'a [String],
    allowed: &'a A,
    orphans: Vec<(String, Oid)>,
    adopted: Vec<(String, Vec<u8>)>,
    /// Which pending ref each adopted record came from, if any.
    from_pending: Vec<(String, String)>,
}

impl<'a, A: Fn(&str) -> bool> Others<'a, A> {
    fn new(repo: &'a Repository, root: &'a Path, files: &'a [String], allowed: &'a A) -> Self {
        Others {
            repo,
            root,
            files,
            allowed,
            orphans: Vec::new(),
            adopted: Vec::new(),
            from_pending: Vec::new(),
        }
    }

    /// Whether `f` is in the commit already, as one of its own files or one taken in.
    fn has(&self, f: &str) -> bool {
        self.files.iter().any(|own| own == f) || self.orphans.iter().any(|(o, _)| o == f)
    }

    /// Records a dead runtime was committing: committed with these when HEAD lacks
    /// them, and put in the index either way. Where its intent names the blob and the
    /// object database has it, those bytes are committed (and put back in the work
    /// tree), whatever the file holds now.
    fn take_in_dead_runtimes(&mut self, recovered: Recovered) {
        for f in recovered.orphaned_files {
            if self.has(&f) {
                continue;
            }
            let expected = recovered.blobs.get(&f).and_then(|b| Oid::from_str(b).ok());
            // Only a file the work tree still has: one recovery removed (an interrupted
            // run's leftovers, its row closed as crashed) is not brought back.
            let present = std::fs::symlink_metadata(self.root.join(&f)).is_ok();
            if let Some(kept) = expected
                .filter(|_| present)
                .and_then(|e| kept_bytes(self.repo, &f, e, self.allowed))
            {
                self.orphans.push((f.clone(), kept.0));
                self.adopted.push((f, kept.1));
                continue;
            }
            match record_blob(self.repo, self.root, &f, self.allowed) {
                Ok(oid) if expected.is_some_and(|e| e != oid) => tracing::warn!(
                    file = %f,
                    "a record left for this commit changed since its run wrote it: left uncommitted"
                ),
                Ok(oid) => self.orphans.push((f, oid)),
                Err(e) => tracing::warn!(file = %f, error = %e, "a record left for this commit is left alone"),
            }
        }
    }

    /// Records kept under `refs/runtime/pending/` by fires whose commit was blocked:
    /// committed from their blobs with these ([`crate::pending`]). Returns the refs of
    /// the sets taken in whole.
    fn take_in_pending_refs(&mut self) -> Result<Vec<String>, GitError> {
        let head_tree = match head_commit(self.repo)? {
            Some(h) => Some(self.repo.find_commit(h)?.tree()?),
            None => None,
        };
        let in_head = |f: &str| head_tree.as_ref().is_some_and(|t| t.get_path(Path::new(f)).is_ok());
        let mut pending_taken = Vec::new();
        for set in crate::pending::list(self.repo).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "pending records could not be read");
            Vec::new()
        }) {
            let mut take = Vec::new();
            let mut whole = true;
            for (f, oid) in &set.files {
                if in_head(f) || self.has(f) {
                    continue;
                }
                match kept_bytes(self.repo, f, *oid, self.allowed) {
                    Some((oid, bytes)) => take.push((f.clone(), oid, bytes)),
                    None => whole = false,
                }
            }
            if !whole {
                tracing::warn!(reference = %set.reference, "pending records whose objects are missing wait for a later commit");
                continue;
            }
            for (f, oid, bytes) in take {
                self.orphans.push((f.clone(), oid));
                self.from_pending.push((f.clone(), set.reference.clone()));
                self.adopted.push((f, bytes));
            }
            pending_taken.push(set.reference);
        }
        Ok(pending_taken)
    }

    /// Puts each adopted record back in the work tree as its writer held it (written
    /// where missing, replaced where the file holds other bytes: a later fire's model
    /// may have edited an uncommitted report), so the work tree matches the commit. A
    /// record that cannot be written (a full disk) leaves the commit, with every
    /// pending set: they wait for a later commit ([`Others::wait_for_a_later_commit`]).
    ///
    /// Called with git's index lock held, and does nothing while a person's operation
    /// is in progress (the commit then refuses anyway): a person's checkout or rebase
    /// step holds that lock while it updates the work tree, and must never meet a file
    /// of ours appearing under it (`untracked working tree files would be
    /// overwritten`, a directory made between git's check and its `mkdir`).
    fn put_back_in_work_tree(&mut self, pending_taken: &mut Vec<String>, identity: (&str, &str)) {
        if !matches!(commit_blocker(self.repo), Ok(None)) {
            // Not written into the operation, and so not committed either: a commit
            // goes on if the operation ends before it moves the branch, and would then
            // commit records the work tree lacks (seen in the race test, after a
            // `rebase --abort` threw a commit's records away). They all wait.
            let all: Vec<String> = self.adopted.iter().map(|(f, _)| f.clone()).collect();
            if !all.is_empty() {
                self.wait_for_a_later_commit(&all, pending_taken, identity);
            }
            return;
        }
        let mut failed = Vec::new();
        for (f, bytes) in &self.adopted {
            match crate::pending::restore(self.root, f, bytes) {
                Ok(crate::pending::Restored::Same) => {}
                Ok(crate::pending::Restored::Written) => {
                    tracing::info!(file = %f, "a kept record was missing from the work tree: written back")
                }
                Ok(crate::pending::Restored::Replaced) => tracing::warn!(
                    file = %f,
                    "a kept record was changed in the work tree since its run wrote it: put back as written"
                ),
                Err(e) => {
                    tracing::warn!(file = %f, error = %e, "a kept record could not be written back: it waits for a later commit");
                    failed.push(f.clone());
                }
            }
        }
        if !failed.is_empty() {
            self.wait_for_a_later_commit(&failed, pending_taken, identity);
        }
        crate::failpoint!("after-pending-restored");
    }

    /// After a put-back that failed for `failed`: every pending set waits, its ref
    /// kept (a set that skipped a file another set adopted may hold other bytes for
    /// it), and the failed records of dead runtimes and discarded commits, whose
    /// bytes nothing else names now, are kept under a pending ref of their own.
    fn wait_for_a_later_commit(&mut self, failed: &[String], pending_taken: &mut Vec<String>, identity: (&str, &str)) {
        let from_sets: Vec<&String> = self.from_pending.iter().map(|(f, _)| f).collect();
        let unnamed: Vec<(String, Vec<u8>)> = (self.adopted.iter())
            .filter(|(f, _)| failed.contains(f) && !from_sets.contains(&f))
            .cloned()
            .collect();
        if !unnamed.is_empty() {
            let label = format!("put-back-{}", std::process::id());
            if let Err(e) = crate::pending::keep(self.repo, &label, &unnamed, identity) {
                tracing::warn!(error = %e, "records that could not be put back were not kept in git either");
            }
        }
        let out = |f: &String| failed.contains(f) || from_sets.contains(&f);
        self.orphans.retain(|(f, _)| !out(f));
        self.adopted.retain(|(f, _)| !out(f));
        pending_taken.clear();
    }

    /// Records of the last commits that an engineer's `git commit` dropped: it can
    /// write back an index it read before ours (see [`commit_new_files_with`]), and its
    /// next commit then deletes them from HEAD while they stay in the work tree; and
    /// records whose commit a reset threw away. Returns the watched records HEAD has,
    /// to put back in the index if it lost them.
    fn take_in_last_commits(&mut self, dir: &Path) -> Vec<String> {
        let watched = watched_records(self.repo, dir);
        for (f, made) in watched.dropped {
            if self.has(&f) {
                continue;
            }
            // Only with the bytes the runtime committed: the work tree's copy may be
            // what a tool wrote at that path since (a model rewriting an earlier run's
            // report a person's commit removed), which no runtime commit may carry.
            let now = git2::Oid::hash_file(git2::ObjectType::Blob, self.root.join(&f)).ok();
            match made.filter(|m| Some(*m) == now) {
                Some(blob) => {
                    if let Some((oid, bytes)) = kept_bytes(self.repo, &f, blob, self.allowed) {
                        tracing::warn!(file = %f, "a record an engineer's commit dropped is committed again");
                        self.orphans.push((f.clone(), oid));
                        self.adopted.push((f, bytes));
                    }
                }
                None => {
                    tracing::warn!(file = %f, "a record HEAD lost holds other bytes than the runtime committed: not committed again")
                }
            }
        }
        for (f, blob) in watched.discarded {
            if self.has(&f) {
                continue;
            }
            if let Some((oid, bytes)) = kept_bytes(self.repo, &f, blob, self.allowed) {
                tracing::warn!(file = %f, "a record whose commit a reset threw away is committed again");
                self.orphans.push((f.clone(), oid));
                self.adopted.push((f, bytes));
            }
        }
        watched.kept
    }
}

/// The bytes of blob `oid` for the record `f`, which the commit carries: the bytes
/// the record's writer held ([`Others::put_back_in_work_tree`] writes them to the work
/// tree once the index lock is held). `None` when the path is not a record's or the
/// object database lacks the blob: the record waits.
fn kept_bytes(repo: &Repository, f: &str, oid: Oid, allowed: &impl Fn(&str) -> bool) -> Option<(Oid, Vec<u8>)> {
    if let Err(e) = check_record_path(f, allowed) {
        tracing::warn!(file = %f, error = %e, "a kept record is not committed");
        return None;
    }
    let bytes = repo.find_blob(oid).ok()?.content().to_vec();
    Some((oid, bytes))
}

/// Checks one record and writes its blob. The file is read beneath the root, through
/// no link on the way, only when it is a regular file with one name: a record taken
/// from the work tree (a dead runtime's, or one an engineer's commit dropped) may sit
/// where a tool process could have replaced it.
fn record_blob(repo: &Repository, root: &Path, f: &str, allowed: &impl Fn(&str) -> bool) -> Result<Oid, GitError> {
    check_record_path(f, allowed)?;
    let io = |e: std::io::Error| GitError::Io {
        path: root.join(f),
        source: e,
    };
    let dir = crate::beneath::open_root(root).map_err(io)?;
    let bytes = crate::beneath::read_regular(&dir, Path::new(f), MAX_RECORD_BYTES).map_err(|e| match e {
        crate::beneath::NotRegular::Io(message) => io(std::io::Error::other(message)),
        other => GitError::Refused {
            path: f.to_string(),
            why: format!("not a plain file ({other}): only regular files with one name are committed"),
        },
    })?;
    Ok(repo.blob(&bytes)?)
}

/// The largest record file the runtime commits from the work tree.
const MAX_RECORD_BYTES: u64 = 64 * 1024 * 1024;

/// A record's path must be plain and repo-relative, `allowed`, and a name git takes
/// on every file system ([`crate::gitpath`]).
fn check_record_path(f: &str, allowed: &impl Fn(&str) -> bool) -> Result<(), GitError> {
    if f.contains("..") || f.starts_with('/') || f.contains("//") || !allowed(f) {
        return Err(GitError::Refused {
            path: f.to_string(),
            why: "outside the runtime-owned paths".into(),
        });
    }
    if let Some(why) = crate::gitpath::refused_path(f) {
        return Err(GitError::Refused {
            path: f.to_string(),
            why,
        });
    }
    Ok(())
}

/// What one locked commit needs.
pub(super) struct CommitParts<'a> {
    pub(super) blobs: &'a [(String, Oid)],
    /// Files staged from these bytes rather than from the work tree.
    pub(super) held: &'a [(String, Vec<u8>)],
    pub(super) orphans: &'a [(String, Oid)],
    /// Records of recent runtime commits that HEAD has: back into the index if missing.
    pub(super) kept: &'a [String],
    pub(super) branch: &'a str,
    pub(super) index_path: &'a Path,
    pub(super) temp_index: &'a Path,
    pub(super) saved_index: &'a Path,
    pub(super) name: &'a str,
    pub(super) email: &'a str,
    pub(super) message: &'a str,
}

/// Steps 4-6 of [`commit_new_files_with`], with the index lock held. The commit is
/// built (and the intent saved) before the index is published, so that the index
/// rename, the branch update and the lock's release follow each other at once: a
/// `git commit` that read the index before the rename and takes the lock after the
/// release writes its stale copy back (it writes the index before moving HEAD), and
/// the shorter that stretch, the rarer that is.
fn commit_locked(
    repo: &Repository,
    p: &CommitParts,
    mut intent: Option<&mut Intent>,
    opts: &CommitOptions,
) -> Result<Oid, GitError> {
    let add: Vec<&str> = p.blobs.iter().chain(p.orphans).map(|(f, _)| f.as_str()).collect();
    let had_index = save_index(p)?;
    let mut published = false;
    let result = (|| {
        let sig = Signature::now(p.name, p.email)?;
        let subject = p.message.lines().next().unwrap_or_default();
        let reflog = format!("commit: {subject}");
        let own: Vec<String> = p.blobs.iter().map(|(f, _)| f.clone()).collect();
        for attempt in 1..=opts.tries.max(1) {
            let old = branch_target(repo, p.branch)?;
            let new = build_commit(repo, p, old, &own, &sig, opts.sign)?;
            if let Some(i) = intent.as_deref_mut() {
                i.record.commit = Some(new.to_string());
                i.save()?;
            }
            if !published {
                write_index(repo, p, &add)?;
                published = true;
            }
            // A person's operation that began while this commit was being built (a
            // rebase reads HEAD, then detaches it): not into it.
            if let Some(b) = commit_blocker(repo)? {
                return Err(GitError::Blocked(b));
            }
            crate::failpoint!("before-ref-update");
            if let Some(hook) = opts.before_ref_update {
                hook(attempt);
            }
            // A branch that vanished (deleted under the fire) is not re-created as a
            // root commit holding only records.
            let Some(old) = old else {
                return Err(GitError::Blocked(Blocker::MissingBranch {
                    branch: p.branch.to_string(),
                }));
            };
            let moved = repo.reference_matching(p.branch, new, true, old, &reflog);
            match moved {
                Ok(_) => return Ok(new),
                Err(e)
                    if matches!(
                        e.code(),
                        git2::ErrorCode::Modified | git2::ErrorCode::Exists | git2::ErrorCode::Locked
                    ) =>
                {
                    tracing::debug!(attempt, error = %e, "HEAD moved meanwhile; building the commit on the new tip");
                    if e.code() == git2::ErrorCode::Locked {
                        std::thread::sleep(Duration::from_millis(20 * u64::from(attempt)));
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(GitError::HeadMoving {
            branch: p.branch.to_string(),
            tries: opts.tries.max(1),
        })
    })();
    if result.is_err() && published {
        put_index_back(repo, p, had_index);
    }
    result
}

/// After a failed commit whose index was published: the records stay in the work
/// tree, not staged, so the index goes back to what it was (or away, if there was none).
fn put_index_back(repo: &Repository, p: &CommitParts, had_index: bool) {
    let restored = if had_index {
        std::fs::rename(p.saved_index, p.index_path)
    } else {
        std::fs::remove_file(p.index_path)
    };
    if let Err(e) = restored {
        tracing::warn!(index = %p.index_path.display(), error = %e, "the index was not put back");
    }
    if let Ok(mut real) = git2::Index::open(p.index_path) {
        let _ = repo.set_index(&mut real);
    }
}

/// Step 5: the commit of HEAD's tree (`old`'s) plus the records, on `old`.
fn build_commit(
    repo: &Repository,
    p: &CommitParts,
    old: Option<Oid>,
    own: &[String],
    sig: &Signature,
    sign: Option<&SignCommit<'_>>,
) -> Result<Oid, GitError> {
    let parent = old.map(|h| repo.find_commit(h)).transpose()?;
    let base_tree = match &parent {
        Some(c) => c.tree()?,
        None => repo.find_tree(repo.treebuilder(None)?.write()?)?,
    };
    refuse_existing(&base_tree, own)?;
    let mut update = TreeUpdateBuilder::new();
    for (f, oid) in p.blobs {
        update.upsert(f.as_str(), *oid, FileMode::Blob);
    }
    for (f, oid) in p.orphans {
        if base_tree.get_path(Path::new(f)).is_err() {
            update.upsert(f.as_str(), *oid, FileMode::Blob);
        }
    }
    let tree = repo.find_tree(update.create_updated(repo, &base_tree)?)?;
    let parents: Vec<&git2::Commit> = parent.iter().collect();
    commit_object(repo, sig, sig, p.message, &tree, &parents, sign)
}

/// Writes a commit object (no ref moves): signed through `sign` when given, as git's
/// own signing does (the signature over the commit's text, in its `gpgsig` header).
pub fn commit_object(
    repo: &Repository,
    author: &Signature,
    committer: &Signature,
    message: &str,
    tree: &git2::Tree,
    parents: &[&git2::Commit],
    sign: Option<&SignCommit<'_>>,
) -> Result<Oid, GitError> {
    let Some(sign) = sign else {
        return Ok(repo.commit(None, author, committer, message, tree, parents)?);
    };
    let buffer = repo.commit_create_buffer(author, committer, message, tree, parents)?;
    let text = std::str::from_utf8(&buffer)
        .map_err(|_| git2::Error::from_str("the commit's text is not UTF-8, so it cannot be signed"))?;
    let signature = sign(text).map_err(|why| git2::Error::from_str(&format!("signing the commit failed: {why}")))?;
    Ok(repo.commit_signed(text, &signature, Some("gpgsig"))?)
}

/// Refuses any of `files` that `tree` already has.
fn refuse_existing(tree: &git2::Tree, files: &[String]) -> Result<(), GitError> {
    for f in files {
        if tree.get_path(Path::new(f)).is_ok() {
            return Err(GitError::Refused {
                path: f.clone(),
                why: "already in HEAD; the runtime only adds new files".into(),
            });
        }
    }
    Ok(())
}

/// The ref HEAD points to (`refs/heads/<branch>`), or `HEAD` itself when detached.
fn head_branch(repo: &Repository) -> Result<String, GitError> {
    let head = crate::git::head_ref(repo)?;
    Ok(match head.symbolic_target()? {
        Some(t) => t.to_string(),
        None => "HEAD".to_string(),
    })
}

/// Where the loose file of ref `name` lives: HEAD in this worktree's git directory,
/// branches in the common directory.
fn ref_file(repo: &Repository, name: &str) -> PathBuf {
    if name == "HEAD" {
        repo.path().join("HEAD")
    } else {
        repo.commondir().join(name)
    }
}

/// The commit ref `name` points to now, `None` while the branch is unborn.
fn branch_target(repo: &Repository, name: &str) -> Result<Option<Oid>, GitError> {
    match repo.find_reference(name) {
        Ok(r) => Ok(Some(r.peel_to_commit()?.id())),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests;
