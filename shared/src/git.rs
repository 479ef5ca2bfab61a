//! Git helpers over git2: open the repository, read HEAD and the blob ids a fire runs
//! on, check builder-owned paths for uncommitted changes, and commit a set of *new*
//! files under a given identity, refusing any path outside an allowed set. The commit
//! is built from HEAD's tree plus the new files (never from whatever the index holds),
//! so an engineer's staged work is never swept into a runtime commit. It is made under
//! git's index lock, index before branch, the branch moved by compare-and-swap, so an
//! engineer committing at the same second neither loses the records nor has theirs
//! lost ([`commit_new_files_with`]); intent records let the next commit remove exactly
//! the git locks a killed runtime left ([`recover_stale_locks`]). After it, as
//! `git commit` does, `git gc --auto` packs loose objects once there are many. History
//! readers (the index, the audit) diff trees with [`TreeDiffer`].

use crate::layout::{Owner, Ownership, BUILDER_DIRS};
use git2::{build::TreeUpdateBuilder, FileMode, Oid, Repository, Signature, Status, StatusOptions};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("{path}: not a git repository (or any parent): {message}")]
    NotARepo { path: PathBuf, message: String },
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    #[error("refusing to commit `{path}`: {why}")]
    Refused { path: String, why: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{repo}: who is acting? {message}")]
    NoIdentity { repo: PathBuf, message: String },
    #[error("{}: held by another git process for more than {}s (if no git runs, a crashed one left it: remove it)", path.display(), waited.as_secs())]
    Locked { path: PathBuf, waited: Duration },
    #[error("{branch} kept moving: the commit was built {tries} times on a new tip and lost every race")]
    HeadMoving { branch: String, tries: u32 },
    #[error("{branch} points to {commit}, which git's index does not reflect: {message}")]
    Undo {
        branch: String,
        commit: String,
        message: String,
    },
    #[error("{0}")]
    Blocked(Blocker),
}

/// Why the runtime does not commit now, though nothing is wrong with its records:
/// someone else's git operation is under way in the checkout, or HEAD is not on a
/// branch. A commit then would land inside that operation (a rebase's detached HEAD,
/// which `git rebase --abort` throws away) or nowhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocker {
    /// A rebase, merge, cherry-pick, revert, bisect or `git am` in progress: what it
    /// is, the file of the git directory that says so, and how a person ends it.
    Operation {
        what: &'static str,
        marker: PathBuf,
        end: &'static str,
    },
    /// HEAD names a commit, not a branch.
    Detached { at: String },
    /// HEAD names a branch whose ref does not exist (deleted, or never created).
    MissingBranch { branch: String },
}

impl std::fmt::Display for Blocker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Blocker::Operation { what, marker, end } => write!(
                f,
                "{what} is in progress ({}): the runtime never commits into someone else's operation; once it is finished ({end}), the next fire commits these records",
                marker.display()
            ),
            Blocker::Detached { at } => write!(
                f,
                "HEAD is detached at {at}: the runtime commits only on a branch; once a branch is checked out, the next fire commits these records"
            ),
            Blocker::MissingBranch { branch } => write!(
                f,
                "HEAD names {branch}, which does not exist (deleted, or not created yet): check out an existing branch (`git branch -a`) or restore it from `git reflog`"
            ),
        }
    }
}

/// Why a commit on HEAD's branch must not be made now ([`Blocker`]), `None` when
/// nothing stands in the way. Cheap (a few `stat`s and HEAD's ref): the commit asks
/// before it takes git's index lock and again right before it moves the branch.
/// Builder commands that commit into a person's checkout can ask the same.
pub fn commit_blocker(repo: &Repository) -> Result<Option<Blocker>, GitError> {
    use git2::RepositoryState as S;
    let git_dir = repo.path();
    let op = |what, marker: &str, end| {
        Some(Blocker::Operation {
            what,
            marker: git_dir.join(marker),
            end,
        })
    };
    let found = match repo.state() {
        S::Clean => None,
        S::Merge => op("a merge", "MERGE_HEAD", "commit it, or `git merge --abort`"),
        S::Revert | S::RevertSequence => op("a revert", "REVERT_HEAD", "`git revert --continue` or `--abort`"),
        S::CherryPick | S::CherryPickSequence => op(
            "a cherry-pick",
            "CHERRY_PICK_HEAD",
            "`git cherry-pick --continue` or `--abort`",
        ),
        S::Bisect => op("a bisect", "BISECT_LOG", "`git bisect reset`"),
        S::Rebase | S::RebaseInteractive | S::RebaseMerge => {
            let marker = if git_dir.join("rebase-merge").exists() {
                "rebase-merge"
            } else {
                "rebase-apply"
            };
            op("a rebase", marker, "`git rebase --continue` or `--abort`")
        }
        S::ApplyMailbox | S::ApplyMailboxOrRebase => {
            op("a `git am`", "rebase-apply", "`git am --continue` or `--abort`")
        }
    };
    if found.is_some() {
        return Ok(found);
    }
    let head = repo.find_reference("HEAD")?;
    match head.symbolic_target()? {
        None => Ok(Some(Blocker::Detached {
            at: head
                .target()
                .map(|o| o.to_string()[..12].to_string())
                .unwrap_or_default(),
        })),
        Some(branch) => match repo.find_reference(branch) {
            Ok(_) => Ok(None),
            Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(Some(Blocker::MissingBranch {
                branch: branch.to_string(),
            })),
            Err(e) => Err(e.into()),
        },
    }
}

/// The branch HEAD names when that branch's ref is missing while the repository has
/// other refs (a deleted branch, a fresh `git checkout --orphan`): not "no commits yet".
pub fn head_branch_missing(repo: &Repository) -> Option<String> {
    let head = repo.find_reference("HEAD").ok()?;
    let branch = head.symbolic_target().ok()??.to_string();
    if repo.find_reference(&branch).is_ok() {
        return None;
    }
    let any_other = repo
        .references()
        .ok()?
        .flatten()
        .any(|r| r.name().is_ok_and(|n| n != "HEAD"));
    any_other.then_some(branch)
}

/// The work tree root of `repo`.
pub fn workdir(repo: &Repository) -> Result<PathBuf, GitError> {
    repo.workdir()
        .map(|p| p.to_path_buf())
        .ok_or_else(|| GitError::NotARepo {
            path: repo.path().to_path_buf(),
            message: "bare repository".into(),
        })
}

/// The directories git writes for `repo`'s work tree, canonical: its git directory
/// and the common directory holding objects and refs. In a plain checkout both are
/// `<root>/.git`, listed once; in a linked worktree (`git worktree add`, where `.git`
/// is a file) they are `<main>/.git/worktrees/<name>` and `<main>/.git`. The runtime's
/// sandbox allows writing exactly these, since a commit writes objects and moves a ref.
pub fn git_dirs(repo: &Repository) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    for dir in [repo.path(), repo.commondir()] {
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        if !out.contains(&dir) {
            out.push(dir);
        }
    }
    out
}

/// HEAD's commit id, `None` on an unborn branch.
pub fn head_commit(repo: &Repository) -> Result<Option<Oid>, GitError> {
    match repo.head() {
        Ok(h) => Ok(Some(h.peel_to_commit()?.id())),
        Err(e) if e.code() == git2::ErrorCode::UnbornBranch || e.code() == git2::ErrorCode::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Blob id of `rel` in HEAD's tree, `None` if absent.
pub fn head_blob(repo: &Repository, rel: &str) -> Result<Option<Oid>, GitError> {
    let Some(head) = head_commit(repo)? else {
        return Ok(None);
    };
    let tree = repo.find_commit(head)?.tree()?;
    match tree.get_path(Path::new(rel)) {
        Ok(entry) => Ok(Some(entry.id())),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Builder-owned paths with uncommitted changes (modified, staged, untracked,
/// deleted, renamed), relative to the work tree.
pub fn dirty_builder_paths(repo: &Repository, ownership: &Ownership) -> Result<Vec<String>, GitError> {
    let mut opts = StatusOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false)
        .exclude_submodules(false);
    // Extra builder globs from settings may live anywhere: look at everything.
    // Otherwise only the fixed directories, given as literal paths: libgit2 then
    // skips whatever lies outside them in the index and the work tree, where
    // patterns make it walk all of both (1.3-1.6 s at 220,000 tracked files).
    if !ownership.has_extra_builder_paths() {
        opts.disable_pathspec_match(true);
        for d in BUILDER_DIRS.iter().filter(|d| **d != ".git") {
            opts.pathspec(*d);
        }
    }
    // An index that reads as invalid while people's git commands and other fires
    // replace it (seen once in 1,200 fires racing a rebasing engineer, the file whole
    // again a moment later) is read again before the fire gives up on it.
    let statuses = read_again(
        || repo.statuses(Some(&mut opts)),
        |e| e.class() == git2::ErrorClass::Index,
    )?;
    let mut out = Vec::new();
    for s in statuses.iter() {
        if s.status() == Status::CURRENT || s.status().contains(Status::IGNORED) {
            continue;
        }
        if let Ok(p) = s.path() {
            if ownership.classify(p) == Owner::Builder {
                out.push(p.to_string());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// How many times [`read_again`] reads a file of git's that read as damaged.
const READ_TRIES: u32 = 4;

/// Runs `read` until it succeeds or fails otherwise than `transient` says, at most
/// [`READ_TRIES`] times in all, 25 ms apart. For files other processes replace while
/// the runtime reads them (the index, HEAD: seen damaged once in some hundreds of
/// fires racing a person's rebase, and whole again a moment later, though every
/// writer we know renames into place).
fn read_again<T>(
    mut read: impl FnMut() -> Result<T, git2::Error>,
    transient: impl Fn(&git2::Error) -> bool,
) -> Result<T, git2::Error> {
    let mut tries = 1;
    loop {
        match read() {
            Err(e) if transient(&e) && tries < READ_TRIES => {
                tries += 1;
                tracing::debug!(error = %e, tries, "a file of git's read as damaged; reading it again");
                std::thread::sleep(Duration::from_millis(25));
            }
            other => return other,
        }
    }
}

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

/// Where a repository's commits keep their intent records: `<root>/.runtime/locks`.
pub fn intent_dir(root: &Path) -> PathBuf {
    root.join(crate::layout::STATE_DIR).join("locks")
}

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
    let mut blobs = Vec::with_capacity(files.len());
    for f in files {
        let oid = match opts.held.iter().find(|(p, _)| p == f) {
            Some((_, bytes)) => {
                check_record_path(f, &allowed)?;
                repo.blob(bytes)?
            }
            None => record_blob(repo, &root, f, &allowed)?,
        };
        blobs.push((f.clone(), oid));
    }
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
    // Records a dead runtime was committing: committed with these when HEAD lacks
    // them, and put in the index either way. Where its intent names the blob and the
    // object database has it, those bytes are committed (and put back in the work
    // tree), whatever the file holds now.
    let mut orphans = Vec::new();
    let mut adopted: Vec<(String, Vec<u8>)> = Vec::new();
    if let Some(dir) = &opts.intent_dir {
        let recovered = recover_stale_locks(dir)?;
        for f in recovered.orphaned_files {
            if files.contains(&f) || orphans.iter().any(|(o, _)| o == &f) {
                continue;
            }
            let expected = recovered.blobs.get(&f).and_then(|b| Oid::from_str(b).ok());
            // Only a file the work tree still has: one recovery removed (an interrupted
            // run's leftovers, its row closed as crashed) is not brought back.
            let present = std::fs::symlink_metadata(root.join(&f)).is_ok();
            if let Some(kept) = expected
                .filter(|_| present)
                .and_then(|e| kept_bytes(repo, &root, &f, e, &allowed))
            {
                orphans.push((f.clone(), kept.0));
                adopted.push((f, kept.1));
                continue;
            }
            match record_blob(repo, &root, &f, &allowed) {
                Ok(oid) if expected.is_some_and(|e| e != oid) => tracing::warn!(
                    file = %f,
                    "a record left for this commit changed since its run wrote it: left uncommitted"
                ),
                Ok(oid) => orphans.push((f, oid)),
                Err(e) => tracing::warn!(file = %f, error = %e, "a record left for this commit is left alone"),
            }
        }
    }
    // Records kept under `refs/runtime/pending/` by fires whose commit was blocked:
    // committed from their blobs with these ([`crate::pending`]).
    let head_tree = match head_commit(repo)? {
        Some(h) => Some(repo.find_commit(h)?.tree()?),
        None => None,
    };
    let in_head = |f: &str| head_tree.as_ref().is_some_and(|t| t.get_path(Path::new(f)).is_ok());
    let mut pending_taken = Vec::new();
    for set in crate::pending::list(repo).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "pending records could not be read");
        Vec::new()
    }) {
        let mut take = Vec::new();
        let mut whole = true;
        for (f, oid) in &set.files {
            if in_head(f) || files.contains(f) || orphans.iter().any(|(o, _)| o == f) {
                continue;
            }
            match kept_bytes(repo, &root, f, *oid, &allowed) {
                Some((oid, bytes)) => take.push((f.clone(), oid, bytes)),
                None => whole = false,
            }
        }
        if !whole {
            tracing::warn!(reference = %set.reference, "pending records could not be put back in the work tree; they wait for a later commit");
            continue;
        }
        for (f, oid, bytes) in take {
            orphans.push((f.clone(), oid));
            adopted.push((f, bytes));
        }
        pending_taken.push(set.reference);
        crate::failpoint!("after-pending-restored");
    }
    drop(head_tree);
    // The new intent names the records of a dead or blocked runtime too: their intent
    // is gone, and if this commit fails or this process dies, the next one must still
    // find them.
    let named: Vec<(String, Oid)> = blobs.iter().chain(&orphans).cloned().collect();
    let mut intent = opts.intent_dir.as_ref().map(|dir| {
        let mut i = Intent::new(dir, &named);
        i.durable = opts.durable_intent;
        i
    });
    if let Some(i) = &mut intent {
        i.record.locks = intent_locks(&index_lock, &side, &ref_lock);
        i.save()?;
    }
    let held = match take_index_lock(&index_lock, opts.lock_wait) {
        Ok(h) => h,
        Err(e) => {
            if let Some(i) = &mut intent {
                i.leave_pending();
            }
            return Err(e);
        }
    };
    // Records of the last commits that an engineer's `git commit` dropped: it can
    // write back an index it read before ours (see above), and its next commit then
    // deletes them from HEAD while they stay in the work tree.
    let mut kept = Vec::new();
    if let Some(dir) = &opts.intent_dir {
        let watched = watched_records(repo, dir);
        kept = watched.kept;
        for f in watched.dropped {
            if files.contains(&f) || orphans.iter().any(|(o, _)| o == &f) {
                continue;
            }
            if let Ok(oid) = record_blob(repo, &root, &f, &allowed) {
                tracing::warn!(file = %f, "a record an engineer's commit dropped is committed again");
                orphans.push((f, oid));
            }
        }
        for (f, blob) in watched.discarded {
            if files.contains(&f) || orphans.iter().any(|(o, _)| o == &f) {
                continue;
            }
            if let Some((oid, bytes)) = kept_bytes(repo, &root, &f, blob, &allowed) {
                tracing::warn!(file = %f, "a record whose commit a reset threw away is committed again");
                orphans.push((f.clone(), oid));
                adopted.push((f, bytes));
            }
        }
    }
    let held_bytes: Vec<(String, Vec<u8>)> = opts.held.iter().cloned().chain(adopted).collect();
    let parts = CommitParts {
        blobs: &blobs,
        held: &held_bytes,
        orphans: &orphans,
        kept: &kept,
        branch: &branch,
        index_path: &index_path,
        temp_index: &side.temp_index,
        saved_index: &side.saved_index,
        name,
        email,
        message,
    };
    // The lock's inode, recorded at once: a lock taken after a long wait would
    // otherwise look newer than the record.
    let recorded = match &mut intent {
        Some(i) => {
            i.record.locks[0].inode = Some(held.ino);
            i.record.locks[0].ctime_ns = Some(held.ctime_ns);
            i.save()
        }
        None => Ok(()),
    };
    let result = recorded.and_then(|()| commit_locked(repo, &parts, intent.as_mut(), opts));
    // Ours, by inode: release it.
    if let Err(e) = remove_if_same(&index_lock, held) {
        tracing::warn!(lock = %index_lock.display(), error = %e, "the index lock was not released");
    }
    let _ = std::fs::remove_file(&side.temp_index);
    let _ = std::fs::remove_file(&side.saved_index);
    if let Some(i) = &mut intent {
        match &result {
            Ok(_) => i.remove(),
            // Its locks are released: what stays is the list of records, for the next
            // commit to take in (see [`leave_for_next_commit`]).
            Err(_) => i.leave_pending(),
        }
    }
    if let (Ok(oid), Some(dir)) = (&result, &opts.intent_dir) {
        let mut all: Vec<String> = files.to_vec();
        all.extend(orphans.iter().map(|(f, _)| f.clone()));
        remember_records(dir, *oid, all);
    }
    if result.is_ok() {
        // Committed: the refs that kept them go (a crash before this leaves refs whose
        // files HEAD has, which the next commit drops).
        crate::failpoint!("before-pending-dropped");
        for reference in &pending_taken {
            crate::pending::drop_set(repo, reference);
        }
    }
    result
}

/// The bytes of blob `oid` for the record `f`, put back in the work tree (written
/// where missing, replaced where the file holds other bytes: a later fire's model may
/// have edited an uncommitted report): the bytes the record's writer held, which the
/// commit carries. `None` when the object database lacks the blob, a person's git
/// operation is now in progress, or the work tree cannot be made to hold it (a full
/// disk): the record waits.
fn kept_bytes(
    repo: &Repository,
    root: &Path,
    f: &str,
    oid: Oid,
    allowed: &impl Fn(&str) -> bool,
) -> Option<(Oid, Vec<u8>)> {
    if let Err(e) = check_record_path(f, allowed) {
        tracing::warn!(file = %f, error = %e, "a kept record is not committed");
        return None;
    }
    let bytes = repo.find_blob(oid).ok()?.content().to_vec();
    // Asked again right before the work tree is written: a person's rebase or
    // checkout that began since this commit started must not find a record put back
    // under a commit it is about to replay (`untracked files would be overwritten`).
    if !matches!(commit_blocker(repo), Ok(None)) {
        tracing::info!(file = %f, "a person's git operation began: a kept record waits for a later commit");
        return None;
    }
    match crate::pending::restore(root, f, &bytes) {
        Ok(crate::pending::Restored::Same) => {}
        Ok(crate::pending::Restored::Written) => {
            tracing::info!(file = %f, "a kept record was missing from the work tree: written back")
        }
        Ok(crate::pending::Restored::Replaced) => tracing::warn!(
            file = %f,
            "a kept record was changed in the work tree since its run wrote it: put back as written"
        ),
        Err(e) => {
            tracing::warn!(file = %f, error = %e, "a kept record could not be written back");
            return None;
        }
    }
    Some((oid, bytes))
}

/// The runtime's last commits and their records, kept in the intent directory.
const RECENT_FILE: &str = "git-recent-records.json";
/// How many of the runtime's last commits [`watched_records`] watches.
const RECENT_KEEP: usize = 64;

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct RecentCommits {
    commits: Vec<(String, Vec<String>)>,
}

fn read_recent(dir: &Path) -> RecentCommits {
    std::fs::read(dir.join(RECENT_FILE))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Adds a commit to the watched ones (best effort: a lost list only loses the watch).
fn remember_records(dir: &Path, commit: Oid, files: Vec<String>) {
    let mut recent = read_recent(dir);
    recent.commits.push((commit.to_string(), files));
    let excess = recent.commits.len().saturating_sub(RECENT_KEEP);
    recent.commits.drain(..excess);
    let tmp = dir.join(format!("{RECENT_FILE}.{}", std::process::id()));
    let written = serde_json::to_vec(&recent)
        .map_err(std::io::Error::other)
        .and_then(|b| std::fs::write(&tmp, b))
        .and_then(|()| std::fs::rename(&tmp, dir.join(RECENT_FILE)));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        tracing::debug!(error = %e, "the list of recent records was not updated");
    }
}

/// What became of the records of the runtime's last commits ([`watched_records`]).
#[derive(Debug, Default)]
struct Watched {
    /// Still in the work tree, but HEAD lost them (an engineer's commit dropped them).
    dropped: Vec<String>,
    /// Still in the work tree, and HEAD has them.
    kept: Vec<String>,
    /// Gone from the work tree and from every branch with the commit that held them,
    /// and the blob it held: a `git rebase --abort` or `reset --hard` that put a
    /// branch back to where it was before a runtime commit landed on it (a commit
    /// that raced the first moments of a person's rebase, before git marks one in
    /// progress).
    discarded: Vec<(String, Oid)>,
}

/// The records of the runtime's last commits: those HEAD lost while the work tree
/// still holds them, those it has, and those a reset threw away with their commit
/// ([`Watched`]). The kept ones are put back in the index if it lost them (see
/// [`write_index`]), which reads the index once anyway.
fn watched_records(repo: &Repository, dir: &Path) -> Watched {
    let recent = read_recent(dir);
    let mut out = Watched::default();
    if recent.commits.is_empty() {
        return out;
    }
    let Ok(Some(head)) = head_commit(repo) else {
        return out;
    };
    let Ok(tree) = repo.find_commit(head).and_then(|c| c.tree()) else {
        return out;
    };
    let root = repo.workdir().unwrap_or(Path::new("."));
    let mut head_dirs = DirTrees::new(repo, tree);
    let seen = |out: &Watched, f: &String| {
        out.dropped.contains(f) || out.kept.contains(f) || out.discarded.iter().any(|(d, _)| d == f)
    };
    for (commit, files) in &recent.commits {
        // Asked once per commit, and only when one of its records left the work tree.
        let mut orphaned: Option<Option<git2::Tree>> = None;
        for f in files {
            if seen(&out, f) {
                continue;
            }
            let in_head = head_dirs.entry(f).is_some();
            if !root.join(f).is_file() {
                if in_head {
                    continue;
                }
                let lost_tree = orphaned.get_or_insert_with(|| {
                    Oid::from_str(commit)
                        .ok()
                        .filter(|c| !on_a_branch(repo, *c))
                        .and_then(|c| repo.find_commit(c).and_then(|c| c.tree()).ok())
                });
                if let Some(blob) = lost_tree.as_ref().and_then(|t| t.get_path(Path::new(f)).ok()) {
                    out.discarded.push((f.clone(), blob.id()));
                }
                continue;
            }
            if in_head {
                out.kept.push(f.clone());
            } else {
                out.dropped.push(f.clone());
            }
        }
    }
    out
}

/// Entries of one tree looked up by path, each directory's tree read once. The
/// records of the last commits sit in a few large directories (`runs/<task>/<day>/`):
/// looked up from the root each, every lookup read and parsed those trees again
/// (libgit2 caches no tree over 4 KB), which made the commit's cost grow with the
/// records a day holds.
struct DirTrees<'r> {
    repo: &'r Repository,
    root: git2::Tree<'r>,
    dirs: std::collections::HashMap<String, Option<git2::Tree<'r>>>,
}

impl<'r> DirTrees<'r> {
    fn new(repo: &'r Repository, root: git2::Tree<'r>) -> DirTrees<'r> {
        DirTrees {
            repo,
            root,
            dirs: std::collections::HashMap::new(),
        }
    }

    /// The id of the entry at `path` (`/`-separated), if the tree has one.
    fn entry(&mut self, path: &str) -> Option<Oid> {
        let Some((dir, name)) = path.rsplit_once('/') else {
            return self.root.get_name(path).map(|e| e.id());
        };
        if !self.dirs.contains_key(dir) {
            let sub = self
                .root
                .get_path(Path::new(dir))
                .ok()
                .filter(|e| e.kind() == Some(git2::ObjectType::Tree))
                .and_then(|e| self.repo.find_tree(e.id()).ok());
            self.dirs.insert(dir.to_string(), sub);
        }
        self.dirs.get(dir)?.as_ref()?.get_name(name).map(|e| e.id())
    }
}

/// Whether any local branch holds `commit`.
fn on_a_branch(repo: &Repository, commit: Oid) -> bool {
    let Ok(branches) = repo.references_glob("refs/heads/*") else {
        return true;
    };
    branches
        .flatten()
        .filter_map(|r| r.target())
        .any(|tip| tip == commit || repo.graph_descendant_of(tip, commit).unwrap_or(true))
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
struct CommitParts<'a> {
    blobs: &'a [(String, Oid)],
    /// Files staged from these bytes rather than from the work tree.
    held: &'a [(String, Vec<u8>)],
    orphans: &'a [(String, Oid)],
    /// Records of recent runtime commits that HEAD has: back into the index if missing.
    kept: &'a [String],
    branch: &'a str,
    index_path: &'a Path,
    temp_index: &'a Path,
    saved_index: &'a Path,
    name: &'a str,
    email: &'a str,
    message: &'a str,
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
        // The records stay in the work tree, not staged: put the index back.
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
    result
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

/// Keeps the index as it is (a hard link, or a copy with the index's own stamp), to
/// put back if the commit fails; `false` when there is no index yet.
fn save_index(p: &CommitParts) -> Result<bool, GitError> {
    let _ = std::fs::remove_file(p.saved_index);
    let saved = std::fs::hard_link(p.index_path, p.saved_index).or_else(|_| {
        std::fs::copy(p.index_path, p.saved_index)?;
        keep_index_stamp(p.index_path, p.saved_index)
    });
    match saved {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !p.index_path.exists() => Ok(false),
        Err(e) => Err(GitError::Io {
            path: p.saved_index.to_path_buf(),
            source: e,
        }),
    }
}

/// Step 4: the index on disk now plus `add`, renamed over the index while the lock
/// stays held (only the holder writes the index; the lock file itself is only the
/// claim). libgit2 writes an index only through its own lock, so it writes a private
/// copy.
fn write_index(repo: &Repository, p: &CommitParts, add: &[&str]) -> Result<(), GitError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |e| GitError::Io { path, source: e }
    };
    let _ = std::fs::remove_file(p.temp_index);
    match std::fs::copy(p.index_path, p.temp_index) {
        Ok(_) => keep_index_stamp(p.index_path, p.temp_index).map_err(io(p.temp_index))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !p.index_path.exists() => {}
        Err(e) => return Err(io(p.temp_index)(e)),
    }
    let written = (|| -> Result<(), GitError> {
        let mut index = git2::Index::open(p.temp_index)?;
        // Bound to the repository, the copy finds the work tree for `add_path`.
        repo.set_index(&mut index)?;
        for f in add {
            match p.held.iter().find(|(h, _)| h == f) {
                Some((_, bytes)) => match worktree_entry(repo, f, bytes) {
                    Some(entry) => index.add(&entry)?,
                    None => index.add_frombuffer(&held_entry(f), bytes)?,
                },
                None => index.add_path(Path::new(f))?,
            }
        }
        for f in p.kept {
            if index.get_path(Path::new(f), 0).is_none() {
                tracing::warn!(file = %f, "a record the index lost is put back");
                index.add_path(Path::new(f))?;
            }
        }
        index.write()?;
        Ok(())
    })();
    let published = written.and_then(|()| std::fs::rename(p.temp_index, p.index_path).map_err(io(p.index_path)));
    // Whatever happened, the handle goes back to the real index.
    let restored = git2::Index::open(p.index_path).and_then(|mut real| repo.set_index(&mut real));
    published?;
    restored?;
    Ok(())
}

/// Gives the copy the index's modification time. Git and libgit2 trust an entry's
/// cached stat data only when the entry is older than the index file; an entry written
/// in the same instant as the index is "racily clean" and its content is checked. A copy
/// stamped now would make libgit2 treat every such entry as settled and write it out
/// unchecked under a newer index, so a file an engineer changed in that instant (same
/// size) would look unchanged to `git status`, `git stash` and `git commit -a`. With the
/// old stamp, libgit2 checks those entries against the work tree and marks the changed
/// ones for git to read again, as git itself does.
///
/// The stamp is cut to the whole second: git compares these times by the second (as
/// Debian builds it, without `USE_NSEC`) and libgit2 by the nanosecond, so an entry
/// written a moment before the index in the same second is racy to git but was settled
/// to libgit2. Cut, it is racy to both; the cost is a content check of the files
/// changed in that second.
fn keep_index_stamp(index: &Path, copy: &Path) -> std::io::Result<()> {
    let stamp = std::fs::metadata(index)?.modified()?;
    let second = stamp
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| Duration::from_secs(d.as_secs()))
        .unwrap_or_default();
    std::fs::File::options()
        .write(true)
        .open(copy)?
        .set_modified(std::time::UNIX_EPOCH + second)
}

/// Cuts the modification time of `repo`'s index file to the whole second, before a
/// libgit2 operation reads the index to write it back (a checkout with
/// `update_index`, `read_tree` + `write`) in a work tree a person may be editing: the
/// same reason as [`keep_index_stamp`] (libgit2 judges racy entries by the nanosecond,
/// git by the second). Only makes more entries racy (content-checked), so it is safe
/// without git's lock: a writer renaming a new index in meanwhile loses nothing.
pub fn cut_index_stamp(repo: &Repository) {
    let Ok(path) = index_path(repo) else {
        return;
    };
    let Ok(stamp) = std::fs::metadata(&path).and_then(|m| m.modified()) else {
        return;
    };
    let Ok(since) = stamp.duration_since(std::time::UNIX_EPOCH) else {
        return;
    };
    let cut = std::time::UNIX_EPOCH + Duration::from_secs(since.as_secs());
    if cut != stamp {
        let _ = std::fs::File::options()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_modified(cut));
    }
}

/// The index file of `repo` (`GIT_INDEX_FILE` when set, else `<git dir>/index`).
fn index_path(repo: &Repository) -> Result<PathBuf, GitError> {
    Ok(repo
        .index()?
        .path()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| repo.path().join("index")))
}

/// `<path>.lock`, git's name for the lock of `path`.
fn lock_path_of(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".lock");
    PathBuf::from(s)
}

/// The ref HEAD points to (`refs/heads/<branch>`), or `HEAD` itself when detached.
fn head_branch(repo: &Repository) -> Result<String, GitError> {
    let head = repo.find_reference("HEAD")?;
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

/// Creates `lock` exclusively, waiting up to `wait` while another process holds it.
/// Returns the inode of the lock file created.
fn take_index_lock(lock: &Path, wait: Duration) -> Result<LockId, GitError> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        match std::fs::OpenOptions::new().write(true).create_new(true).open(lock) {
            Ok(f) => {
                return f.metadata().map(|m| LockId::of(&m)).map_err(|e| GitError::Io {
                    path: lock.to_path_buf(),
                    source: e,
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
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

/// Removes `path` if it is still the file `id` names.
fn remove_if_same(path: &Path, id: LockId) -> std::io::Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if LockId::of(&m) == id => std::fs::remove_file(path).map(|()| true),
        Ok(_) => Ok(false),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

// ---------------------------------------------------------------------------
// Intent records: which git locks a runtime process is about to hold
//
// A runtime killed while it holds a git lock leaves the lock behind, and git (the
// engineer's and every later fire's) then refuses to work. Before creating a lock the
// runtime writes what it is about to lock into `.runtime/locks/git-intent-<pid>.json`
// (fsynced), and removes the record once the locks are gone. The next commit judges
// each record: a record whose process is gone (no `/proc/<pid>`, or a process there
// that started at another time: the pid was reused) had its locks removed, exactly
// those it names, and only when they are provably the dead process's (see
// [`recover_stale_locks`]). A lock with no record is never touched: it may be a
// person's git at work.

/// The private files a commit by process `pid` keeps beside the index: the copy it
/// writes the new index into (libgit2 writes it through `<copy>.lock`), and the
/// index as it was, to put back if the commit fails.
struct SideFiles {
    temp_index: PathBuf,
    saved_index: PathBuf,
}

impl SideFiles {
    fn of(index_path: &Path, pid: u32) -> SideFiles {
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
fn intent_locks(index_lock: &Path, side: &SideFiles, ref_lock: &Path) -> Vec<IntentLock> {
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
const LOCK_GRACE: Duration = Duration::from_secs(2);

/// Prefix of intent record files.
const INTENT_PREFIX: &str = "git-intent-";

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
    fn path(p: &Path) -> IntentLock {
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
struct LockId {
    ino: u64,
    ctime_ns: i64,
}

impl LockId {
    fn of(m: &std::fs::Metadata) -> LockId {
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
    /// The blob id of each of `files` as its writer held it: the next commit takes a
    /// file in only while the work tree still holds those bytes (a later fire's model
    /// may edit an uncommitted report under `reports/`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub blobs: std::collections::BTreeMap<String, String>,
}

/// This process's intent record and where it lives.
struct Intent {
    path: PathBuf,
    record: IntentRecord,
    /// Whether the directory entry is durable (after the first save).
    dir_synced: bool,
    /// Whether saving fsyncs at all ([`CommitOptions::durable_intent`]).
    durable: bool,
}

impl Intent {
    fn new(dir: &Path, files: &[(String, Oid)]) -> Intent {
        let pid = std::process::id();
        let mut intent = Intent {
            path: dir.join(format!("{INTENT_PREFIX}{pid}.json")),
            record: IntentRecord {
                pid,
                start_time: process_start_time(pid),
                locks: vec![],
                files: vec![],
                commit: None,
                blobs: Default::default(),
            },
            dir_synced: false,
            durable: true,
        };
        intent.name(files);
        intent
    }

    /// Adds `files` to the records this intent names (once each), with their blob ids.
    fn name(&mut self, files: &[(String, Oid)]) {
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
    fn leave_pending(&mut self) {
        self.record.locks.clear();
        self.record.commit = None;
        if let Err(e) = self.save() {
            tracing::warn!(error = %e, "the records left for the next commit were not recorded");
        }
    }

    /// Writes the record (temporary file, rename) before any lock it names is created;
    /// when durable, with an fsync before the rename and, the first time, one of the
    /// directory.
    fn save(&mut self) -> Result<(), GitError> {
        use std::io::Write;
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |e| GitError::Io { path, source: e }
        };
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        let tmp = self.path.with_extension("json.tmp");
        let body = serde_json::to_vec(&self.record).map_err(|e| GitError::Io {
            path: self.path.clone(),
            source: std::io::Error::other(e),
        })?;
        let mut f = std::fs::File::create(&tmp).map_err(io(&tmp))?;
        f.write_all(&body).map_err(io(&tmp))?;
        if self.durable {
            f.sync_all().map_err(io(&tmp))?;
        }
        std::fs::rename(&tmp, &self.path).map_err(io(&self.path))?;
        if self.durable && !self.dir_synced {
            std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
            self.dir_synced = true;
        }
        Ok(())
    }

    fn remove(&self) {
        let _ = std::fs::remove_file(&self.path);
    }
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
    if let Some(old) = std::fs::read(&intent.path)
        .ok()
        .and_then(|b| serde_json::from_slice::<IntentRecord>(&b).ok())
    {
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
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(INTENT_PREFIX) {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = std::fs::metadata(&path) else { continue };
        if name.ends_with(".json.tmp") {
            // A record being written by a process that died before renaming it named
            // no lock yet; a live writer's is younger than a minute.
            let old = meta.modified().ok().and_then(|m| m.elapsed().ok());
            if old.is_some_and(|age| age > Duration::from_secs(60)) {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let record: IntentRecord = match serde_json::from_str(&text) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "unreadable git intent record left alone");
                continue;
            }
        };
        if record.pid == std::process::id() {
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
        let written = meta.modified().ok();
        for lock in &record.locks {
            let Ok(m) = std::fs::symlink_metadata(&lock.path) else {
                continue;
            };
            let ours = match lock.is(&m) {
                Some(same) => same,
                None => match (m.modified().ok(), written) {
                    (Some(lm), Some(w)) => lm <= w + LOCK_GRACE,
                    _ => false,
                },
            };
            if ours && std::fs::remove_file(&lock.path).is_ok() {
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

/// The index entry of a record committed from held bytes when the work tree holds
/// exactly those bytes (as a regular file with one name, read through no link): with
/// the stat data of the file read, as `git add` writes it. Git's own checkouts (the
/// one `git rebase` and `git pull --rebase` start with) trust an entry's stat data
/// without refreshing it: an entry without any (see [`held_entry`]) reads as a local
/// change there, and the person's rebase stops with "your local changes would be
/// overwritten" although nothing changed. `None` when the work tree holds anything
/// else.
fn worktree_entry(repo: &Repository, f: &str, bytes: &[u8]) -> Option<git2::IndexEntry> {
    use std::os::unix::fs::MetadataExt;
    let root = repo.workdir()?;
    let dir = crate::beneath::open_root(root).ok()?;
    let (found, meta) = crate::beneath::read_regular_with_meta(&dir, Path::new(f), bytes.len() as u64).ok()?;
    // Committed as a plain blob: an executable file's mode would not match it.
    if found != bytes || meta.mode() & 0o111 != 0 {
        return None;
    }
    // Git keeps these fields as 32 bits, truncated as here.
    let time = |s: i64, ns: i64| git2::IndexTime::new(s as i32, ns as u32);
    Some(git2::IndexEntry {
        ctime: time(meta.ctime(), meta.ctime_nsec()),
        mtime: time(meta.mtime(), meta.mtime_nsec()),
        dev: meta.dev() as u32,
        ino: meta.ino() as u32,
        mode: u32::from(FileMode::Blob),
        uid: meta.uid(),
        gid: meta.gid(),
        file_size: meta.len() as u32,
        id: Oid::hash_object(git2::ObjectType::Blob, bytes).ok()?,
        flags: 0,
        flags_extended: 0,
        path: f.as_bytes().to_vec(),
    })
}

/// An index entry for a file committed from held bytes: no stat data, so `git status`
/// compares it with the work tree by content.
fn held_entry(path: &str) -> git2::IndexEntry {
    let zero = git2::IndexTime::new(0, 0);
    git2::IndexEntry {
        ctime: zero,
        mtime: zero,
        dev: 0,
        ino: 0,
        mode: u32::from(FileMode::Blob),
        uid: 0,
        gid: 0,
        file_size: 0,
        id: Oid::ZERO_SHA1,
        flags: 0,
        flags_extended: 0,
        path: path.as_bytes().to_vec(),
    }
}

/// The id of the tree holding only the builder-owned directories of `tree`, built by
/// writing that tree object: the test oracle for [`crate::review::builder_tree_of`],
/// which computes the same id without writing anything.
#[cfg(test)]
pub fn builder_tree_id(repo: &Repository, tree: &git2::Tree) -> Result<Oid, GitError> {
    let mut builder = repo.treebuilder(None)?;
    for dir in BUILDER_DIRS.iter().filter(|d| **d != ".git") {
        if let Some(entry) = tree.get_name(dir) {
            builder.insert(dir, entry.id(), entry.filemode())?;
        }
    }
    Ok(builder.write()?)
}

/// What a fire's commit did about loose objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AutoGc {
    /// Fewer loose objects than `gc.auto` (or `gc.auto` is 0).
    NotNeeded,
    /// `git gc --auto` ran (it packs in the background unless `gc.autoDetach` is false).
    Ran,
    /// It was needed but could not run (no `git` on PATH, or it failed).
    Failed(String),
}

/// Git's default `gc.auto`: loose objects before `git gc --auto` packs them.
const GC_AUTO_DEFAULT: i64 = 6700;

/// What `git commit` does after writing objects, which libgit2 never does: when
/// the loose objects pass `gc.auto` (0 turns this off), run `git gc --auto`, which
/// packs them. A history walk over loose objects is several times slower than over a
/// pack. The estimate is git's own (the entries of one of the 256 object
/// directories), so the check costs one small directory read and `git` runs only
/// when it will pack. It gets no environment beyond what git needs (no API keys).
pub fn auto_gc(repo: &Repository) -> AutoGc {
    let sample = repo.commondir().join("objects").join("17");
    let loose = std::fs::read_dir(&sample)
        .map(|d| d.filter_map(Result::ok).filter(|e| e.file_name().len() == 38).count())
        .unwrap_or(0) as i64;
    // Any positive `gc.auto` allows at least one per directory: no config read then.
    if loose <= 1 {
        return AutoGc::NotNeeded;
    }
    let limit = repo
        .config()
        .and_then(|c| c.get_i64("gc.auto"))
        .unwrap_or(GC_AUTO_DEFAULT);
    if limit <= 0 || loose <= (limit + 255) / 256 {
        return AutoGc::NotNeeded;
    }
    let mut git = std::process::Command::new("git");
    git.arg("--git-dir")
        .arg(repo.commondir())
        .args(["gc", "--auto", "--quiet"])
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    // What tool commands get, plus where git finds the user's config.
    let passed = crate::env::PASSTHROUGH_ENV.iter().chain(&["HOME", "XDG_CONFIG_HOME"]);
    for key in passed {
        if let Some(v) = std::env::var_os(key) {
            git.env(key, v);
        }
    }
    match git.output() {
        Ok(o) if o.status.success() => AutoGc::Ran,
        Ok(o) => AutoGc::Failed(format!(
            "git gc --auto: {}: {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => AutoGc::Failed(format!("git gc --auto: {e}")),
    }
}

/// Tunes libgit2 for walking history: reading, not writing, so skip re-hashing
/// every object read (SHA-1 with collision detection was a fifth of an audit's time
/// on loose objects; `git fsck` is the tool for that check), and keep no object
/// cache: a walk reads each object about once, and the cache cost more in
/// bookkeeping (and 300 MB of memory on a 10,000-commit audit) than it saved.
pub fn tune_for_history_walks() {
    git2::opts::strict_hash_verification(false);
    git2::opts::enable_caching(false);
}

/// How one path differs between two trees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Deleted,
    Modified,
}

/// One changed file (not directory) between two trees.
#[derive(Debug, Clone)]
pub struct TreeChange {
    pub path: String,
    pub kind: ChangeKind,
    pub old: Option<(Oid, i32)>,
    pub new: Option<(Oid, i32)>,
}

/// Files that differ between `old` and `new` (either may be absent), optionally only
/// below the top-level directories in `only`. One-off form of [`TreeDiffer::diff`].
pub fn diff_trees(
    repo: &Repository,
    old: Option<Oid>,
    new: Option<Oid>,
    only: &[&str],
) -> Result<Vec<TreeChange>, git2::Error> {
    TreeDiffer::open(repo)?.diff(old, new, only)
}

/// Diffs trees read as raw objects from libgit2's object database. Subtrees with the
/// same id are skipped without being read, and entries both versions of a tree begin
/// with are skipped without being decoded, so the cost follows the size of the
/// change, not of the tree (libgit2's tree-to-tree diff walks every entry). Entries
/// are decoded in place by gix-object, never built into libgit2 tree objects. Trees
/// read by one diff are kept for the next, so walking a chain of commits reads every
/// tree once, not twice. Walk newest first: packs store older versions as deltas on
/// newer ones, and libgit2's delta base cache then holds the base each read needs.
pub struct TreeDiffer<'r> {
    odb: git2::Odb<'r>,
    previous: HashMap<gix_hash::ObjectId, Rc<[u8]>>,
    current: HashMap<gix_hash::ObjectId, Rc<[u8]>>,
}

impl<'r> TreeDiffer<'r> {
    /// A differ over `repo`'s object database (its alternates included).
    pub fn open(repo: &'r Repository) -> Result<Self, git2::Error> {
        let odb = repo.odb()?;
        Ok(TreeDiffer {
            odb,
            previous: HashMap::new(),
            current: HashMap::new(),
        })
    }

    /// Files that differ between the trees `old` and `new`, in git's path order.
    /// Renames show as a delete plus an add.
    pub fn diff(&mut self, old: Option<Oid>, new: Option<Oid>, only: &[&str]) -> Result<Vec<TreeChange>, git2::Error> {
        let mut out = Vec::new();
        let id = |o: Oid| {
            gix_hash::ObjectId::try_from(o.as_bytes())
                .map_err(|e| git2::Error::from_str(&format!("object id {o}: {e}")))
        };
        let (old, new) = (old.map(id).transpose()?, new.map(id).transpose()?);
        self.diff_level(old, new, "", only, &mut out)?;
        std::mem::swap(&mut self.previous, &mut self.current);
        self.current.clear();
        Ok(out)
    }

    fn read(&mut self, oid: gix_hash::ObjectId) -> Result<Rc<[u8]>, git2::Error> {
        let cached = self.previous.get(&oid).or_else(|| self.current.get(&oid)).cloned();
        let data = match cached {
            Some(d) => d,
            None => {
                let o = self.odb.read(Oid::from_bytes(oid.as_bytes())?)?;
                if o.kind() != git2::ObjectType::Tree {
                    return Err(git2::Error::from_str(&format!(
                        "{oid}: expected a tree, found a {}",
                        o.kind()
                    )));
                }
                Rc::from(o.data())
            }
        };
        self.current.insert(oid, data.clone());
        Ok(data)
    }

    fn diff_level(
        &mut self,
        old: Option<gix_hash::ObjectId>,
        new: Option<gix_hash::ObjectId>,
        prefix: &str,
        only: &[&str],
        out: &mut Vec<TreeChange>,
    ) -> Result<(), git2::Error> {
        use std::cmp::Ordering;
        let a = old.map(|o| self.read(o)).transpose()?;
        let b = new.map(|o| self.read(o)).transpose()?;
        let skip = match (&a, &b) {
            (Some(a), Some(b)) => common_entries_len(a, b),
            _ => 0,
        };
        let mut ia = TreeEntries::new(a.as_deref().map(|d| &d[skip..]), old);
        let mut ib = TreeEntries::new(b.as_deref().map(|d| &d[skip..]), new);
        let (mut ea, mut eb) = (ia.next()?, ib.next()?);
        // Both trees are sorted in git's order, so one merge pass pairs their entries
        // without building maps; only changed entries allocate a path.
        loop {
            let order = match (&ea, &eb) {
                (Some(x), Some(y)) => {
                    gix_object::tree::name_order(x.filename, x.mode.is_tree(), y.filename, y.mode.is_tree())
                }
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => break,
            };
            let (x, y) = match order {
                Ordering::Less => (ea.take(), None),
                Ordering::Greater => (None, eb.take()),
                Ordering::Equal => (ea.take(), eb.take()),
            };
            if x.is_some() {
                ea = ia.next()?;
            }
            if y.is_some() {
                eb = ib.next()?;
            }
            if let (Some(x), Some(y)) = (&x, &y) {
                if x.oid == y.oid && x.mode == y.mode {
                    continue;
                }
            }
            let Some(name) = x.or(y).map(|e| String::from_utf8_lossy(e.filename)) else {
                continue;
            };
            if prefix.is_empty() && !only.is_empty() && !only.contains(&name.as_ref()) {
                continue;
            }
            let path = if prefix.is_empty() {
                name.into_owned()
            } else {
                format!("{prefix}/{name}")
            };
            let tree = |e: Option<EntryRef>| e.filter(|e| e.mode.is_tree()).map(|e| e.oid.to_owned());
            let (tree_a, tree_b) = (tree(x), tree(y));
            if tree_a.is_some() || tree_b.is_some() {
                self.diff_level(tree_a, tree_b, &path, only, out)?;
            }
            let blob = |e: Option<EntryRef>| {
                e.filter(|e| !e.mode.is_tree())
                    .map(|e| Ok::<_, git2::Error>((Oid::from_bytes(e.oid.as_bytes())?, i32::from(e.mode.value()))))
                    .transpose()
            };
            let (blob_a, blob_b) = (blob(x)?, blob(y)?);
            let kind = match (blob_a, blob_b) {
                (None, None) => continue,
                (Some(_), None) => ChangeKind::Deleted,
                (None, Some(_)) => ChangeKind::Added,
                (Some(_), Some(_)) => ChangeKind::Modified,
            };
            out.push(TreeChange {
                path,
                kind,
                old: blob_a,
                new: blob_b,
            });
        }
        Ok(())
    }
}

type EntryRef<'a> = gix_object::tree::EntryRef<'a>;

/// The object ids this build of libgit2 reads (it has no SHA-256 support).
const OBJECT_HASH: gix_hash::Kind = gix_hash::Kind::Sha1;

/// Bytes of the whole entries two raw trees begin with alike: a run of identical
/// bytes ending on an entry boundary is the same entries in both. An entry is
/// `<mode> <name>\0<id>`, and a name holds no NUL, so entries are found by
/// their NULs without decoding them.
fn common_entries_len(a: &[u8], b: &[u8]) -> usize {
    const BLOCK: usize = 64;
    const ID_LEN: usize = OBJECT_HASH.len_in_bytes();
    let limit = a.len().min(b.len());
    let mut same = 0;
    while same + BLOCK <= limit && a[same..same + BLOCK] == b[same..same + BLOCK] {
        same += BLOCK;
    }
    same += a[same..limit]
        .iter()
        .zip(&b[same..limit])
        .take_while(|(x, y)| x == y)
        .count();
    let mut boundary = 0;
    while let Some(nul) = memchr::memchr(0, &a[boundary..same]) {
        let end = boundary + nul + 1 + ID_LEN;
        if end > same {
            break;
        }
        boundary = end;
    }
    boundary
}

/// The entries of one raw tree (none for an absent tree); a malformed tree is an
/// error naming its id.
struct TreeEntries<'a> {
    iter: Option<gix_object::TreeRefIter<'a>>,
    oid: Option<gix_hash::ObjectId>,
}

impl<'a> TreeEntries<'a> {
    fn new(data: Option<&'a [u8]>, oid: Option<gix_hash::ObjectId>) -> Self {
        TreeEntries {
            iter: data.map(|d| gix_object::TreeRefIter::from_bytes(d, OBJECT_HASH)),
            oid,
        }
    }

    fn next(&mut self) -> Result<Option<EntryRef<'a>>, git2::Error> {
        match self.iter.as_mut().and_then(Iterator::next) {
            None => Ok(None),
            Some(Ok(e)) => Ok(Some(e)),
            Some(Err(e)) => Err(git2::Error::from_str(&format!(
                "tree {}: malformed entry: {e}",
                self.oid.map(|o| o.to_string()).unwrap_or_default()
            ))),
        }
    }
}

// ---------------------------------------------------------------------------
// Opening a repository and learning who is acting
//
// Every command of both binaries opens its repository through [`open_work_tree`],
// and every person a builder command records (approver, triager) comes from
// [`acting_identity`], so `-C`, worktrees, git's environment and git's config chain
// mean the same thing everywhere.

/// A person as git names them: `Name <email>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    pub name: String,
    pub email: String,
}

impl std::fmt::Display for Person {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} <{}>", self.name, self.email)
    }
}

/// An opened repository and the root of its work tree.
pub struct WorkTree {
    pub repo: Repository,
    /// Canonical work-tree root (for a linked worktree, that worktree's root).
    pub root: PathBuf,
}

/// Opens the repository whose work tree contains `path`, as git does: searching up
/// from `path`, following a `.git` file to a linked worktree's git directory, and
/// reading git's environment (`GIT_CONFIG_GLOBAL`, `GIT_CONFIG_NOSYSTEM`,
/// `GIT_CEILING_DIRECTORIES`, `GIT_WORK_TREE`, `GIT_INDEX_FILE`, `GIT_OBJECT_DIRECTORY`
/// as in a `pre-receive` quarantine, ...; `path` wins over `GIT_DIR`). libgit2 1.9
/// honours those variables only for a repository opened with `FROM_ENV`: opened any
/// other way, `GIT_CONFIG_GLOBAL` is ignored and `~/.gitconfig` read instead.
///
/// Errors: [`GitError::Io`] when `path` cannot be read (missing, permissions),
/// [`GitError::NotARepo`] outside a repository or in a bare one, [`GitError::Git`]
/// for anything else libgit2 reports (a lock, an untrusted owner, a corrupt config).
pub fn open_work_tree(path: &Path) -> Result<WorkTree, GitError> {
    let abs = std::fs::canonicalize(path).map_err(|e| GitError::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    let no_ceilings: [&std::ffi::OsStr; 0] = [];
    let repo = Repository::open_ext(&abs, git2::RepositoryOpenFlags::FROM_ENV, no_ceilings).map_err(|e| {
        if e.code() == git2::ErrorCode::NotFound {
            GitError::NotARepo {
                path: abs.clone(),
                message: e.message().to_string(),
            }
        } else {
            GitError::Git(e)
        }
    })?;
    let workdir = repo.workdir().ok_or_else(|| GitError::NotARepo {
        path: abs.clone(),
        message: "a bare repository has no work tree".into(),
    })?;
    let root = std::fs::canonicalize(workdir).map_err(|e| GitError::Io {
        path: workdir.to_path_buf(),
        source: e,
    })?;
    settle_head(&repo);
    Ok(WorkTree { repo, root })
}

/// Reads HEAD until it parses ([`read_again`]); one still unreadable is left to the
/// caller's own read, which names the error.
fn settle_head(repo: &Repository) {
    let _ = read_again(
        || repo.head().map(|_| ()),
        |e| e.class() == git2::ErrorClass::Reference && e.message().contains("corrupted"),
    );
}

/// Who is acting in `repo`, the way `git commit` picks its author:
/// `GIT_AUTHOR_NAME` / `GIT_AUTHOR_EMAIL`, then `user.name` / `user.email` from git's
/// config chain (system, `GIT_CONFIG_GLOBAL` or `~/.gitconfig`, the repository's own
/// config), then `EMAIL` for the address. `repo` must come from [`open_work_tree`]
/// for `GIT_CONFIG_GLOBAL` to count. Nothing else is guessed: no `$USER`, no
/// placeholder; a missing name or address is [`GitError::NoIdentity`].
pub fn acting_identity(repo: &Repository) -> Result<Person, GitError> {
    let no_identity = |message: String| GitError::NoIdentity {
        repo: repo.workdir().unwrap_or_else(|| repo.path()).components().collect(),
        message,
    };
    let sig = repo.author_from_env().map_err(|e| {
        no_identity(if e.code() == git2::ErrorCode::NotFound {
            "no user.name or user.email in git's config, and GIT_AUTHOR_NAME / GIT_AUTHOR_EMAIL are not set".into()
        } else {
            e.message().to_string()
        })
    })?;
    let (name, email) = match (sig.name(), sig.email()) {
        (Ok(n), Ok(e)) => (n.trim().to_string(), e.trim().to_string()),
        _ => return Err(no_identity("the configured name or email is not UTF-8".into())),
    };
    if name.is_empty() || email.is_empty() {
        return Err(no_identity("the configured name or email is empty".into()));
    }
    Ok(Person { name, email })
}

#[cfg(test)]
mod open_tests {
    use super::*;

    #[test]
    fn a_path_outside_any_repository_is_not_a_repo() {
        let dir = tempfile::tempdir().unwrap();
        // Ceiling: without it the search could climb into a repository above /tmp.
        let no_ceilings: [&std::ffi::OsStr; 0] = [];
        if Repository::open_ext(dir.path(), git2::RepositoryOpenFlags::empty(), no_ceilings).is_ok() {
            eprintln!("skipped: the temp dir lies inside a git repository");
            return;
        }
        match open_work_tree(dir.path()) {
            Err(GitError::NotARepo { path, .. }) => assert_eq!(path, dir.path().canonicalize().unwrap()),
            Err(e) => panic!("expected NotARepo, got {e}"),
            Ok(_) => panic!("expected NotARepo, got a repository"),
        }
    }

    #[test]
    fn a_missing_path_is_an_io_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no/such/dir");
        match open_work_tree(&missing) {
            Err(GitError::Io { path, source }) => {
                assert_eq!(path, missing);
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
            }
            Err(e) => panic!("expected Io, got {e}"),
            Ok(_) => panic!("expected Io, got a repository"),
        }
    }

    #[test]
    fn a_subdirectory_opens_at_the_work_tree_root() {
        let dir = tempfile::tempdir().unwrap();
        Repository::init(dir.path()).unwrap();
        let sub = dir.path().join("a/b");
        std::fs::create_dir_all(&sub).unwrap();
        let wt = open_work_tree(&sub).unwrap();
        assert_eq!(wt.root, dir.path().canonicalize().unwrap());
    }

    #[test]
    fn a_linked_worktree_opens_at_its_own_root() {
        let dir = tempfile::tempdir().unwrap();
        let (main, linked) = crate::git::linked_worktree_fixture(dir.path());
        assert!(linked.join(".git").is_file(), "a linked worktree has a .git file");
        let wt = open_work_tree(&linked).unwrap();
        assert_eq!(wt.root, linked.canonicalize().unwrap());
        let git = main.join(".git").canonicalize().unwrap();
        assert_eq!(git_dirs(&wt.repo), vec![git.join("worktrees/linked"), git]);
        let main_wt = open_work_tree(&main).unwrap();
        assert_eq!(git_dirs(&main_wt.repo), vec![main.join(".git").canonicalize().unwrap()]);
    }

    #[test]
    fn a_bare_repository_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        Repository::init_bare(dir.path()).unwrap();
        assert!(matches!(open_work_tree(dir.path()), Err(GitError::NotARepo { .. })));
    }

    #[test]
    fn the_repository_config_names_the_actor() {
        // Only when the test process has no GIT_AUTHOR_* of its own: they win, as in git.
        if std::env::var_os("GIT_AUTHOR_NAME").is_some() || std::env::var_os("GIT_AUTHOR_EMAIL").is_some() {
            eprintln!("skipped: GIT_AUTHOR_NAME or GIT_AUTHOR_EMAIL is set in the test environment");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let mut cfg = repo.config().unwrap();
        cfg.set_str("user.name", "Repo Person").unwrap();
        cfg.set_str("user.email", "repo@example.com").unwrap();
        let wt = open_work_tree(dir.path()).unwrap();
        let p = acting_identity(&wt.repo).unwrap();
        assert_eq!(p.to_string(), "Repo Person <repo@example.com>");
    }
}

/// A repository at `<dir>/main` with one empty commit and a linked worktree of it at
/// `<dir>/linked` (where `.git` is a file), for the tests of every module that has to
/// find git's directories from a worktree.
#[cfg(test)]
pub(crate) fn linked_worktree_fixture(dir: &Path) -> (PathBuf, PathBuf) {
    let main = dir.join("main");
    let repo = Repository::init(&main).unwrap();
    let sig = Signature::now("T", "t@example.com").unwrap();
    let tree = repo
        .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
        .unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "init", &tree, &[]).unwrap();
    let linked = dir.join("linked");
    repo.worktree("linked", &linked, None).unwrap();
    (main, linked)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A repository whose one commit holds `prompts/t.md`.
    pub(super) fn repo() -> (tempfile::TempDir, Repository) {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        std::fs::create_dir_all(dir.path().join("prompts")).unwrap();
        std::fs::write(dir.path().join("prompts/t.md"), "hi").unwrap();
        let mut idx = repo.index().unwrap();
        idx.add_path(Path::new("prompts/t.md")).unwrap();
        idx.write().unwrap();
        let tree = repo.find_tree(idx.write_tree().unwrap()).unwrap();
        let sig = Signature::now("eng", "eng@x").unwrap();
        repo.commit(Some("HEAD"), &sig, &sig, "init", &tree, &[]).unwrap();
        drop(tree);
        (dir, repo)
    }

    #[test]
    fn diff_trees_reports_file_changes_and_skips_equal_subtrees() {
        let (dir, repo) = repo();
        let before = repo.head().unwrap().peel_to_tree().unwrap();
        std::fs::create_dir_all(dir.path().join("reports/t")).unwrap();
        std::fs::write(dir.path().join("reports/t/a.md"), "a").unwrap();
        std::fs::write(dir.path().join("prompts/t.md"), "changed").unwrap();
        let mut idx = repo.index().unwrap();
        idx.add_path(Path::new("reports/t/a.md")).unwrap();
        idx.add_path(Path::new("prompts/t.md")).unwrap();
        let after = repo.find_tree(idx.write_tree().unwrap()).unwrap();
        let changes = diff_trees(&repo, Some(before.id()), Some(after.id()), &[]).unwrap();
        let got: Vec<(&str, ChangeKind)> = changes.iter().map(|c| (c.path.as_str(), c.kind)).collect();
        assert_eq!(
            got,
            vec![
                ("prompts/t.md", ChangeKind::Modified),
                ("reports/t/a.md", ChangeKind::Added)
            ]
        );
        let only = diff_trees(&repo, Some(before.id()), Some(after.id()), &["reports"]).unwrap();
        assert_eq!(only.len(), 1);
        let back = diff_trees(&repo, Some(after.id()), Some(before.id()), &[]).unwrap();
        assert!(back
            .iter()
            .any(|c| c.path == "reports/t/a.md" && c.kind == ChangeKind::Deleted));
        assert!(diff_trees(&repo, Some(after.id()), Some(after.id()), &[])
            .unwrap()
            .is_empty());
    }

    /// A change as (path, old blob and mode, new blob and mode).
    type Change = (String, Option<(Oid, i32)>, Option<(Oid, i32)>);

    /// Every file of `tree`, path to (blob id, mode).
    fn flatten(repo: &Repository, tree: Oid) -> std::collections::BTreeMap<String, (Oid, i32)> {
        let mut files = std::collections::BTreeMap::new();
        repo.find_tree(tree)
            .unwrap()
            .walk(git2::TreeWalkMode::PreOrder, |dir, e| {
                if e.kind() != Some(git2::ObjectType::Tree) {
                    files.insert(format!("{dir}{}", e.name().unwrap()), (e.id(), e.filemode()));
                }
                git2::TreeWalkResult::Ok
            })
            .unwrap();
        files
    }

    /// What a diff must say, from the two flattened trees.
    fn expected_changes(repo: &Repository, old: Oid, new: Oid) -> Vec<Change> {
        let (a, b) = (flatten(repo, old), flatten(repo, new));
        let paths: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
        paths
            .into_iter()
            .filter(|p| a.get(*p) != b.get(*p))
            .map(|p| (p.clone(), a.get(p).copied(), b.get(p).copied()))
            .collect()
    }

    fn sorted(changes: Vec<TreeChange>) -> Vec<Change> {
        let mut v: Vec<_> = changes
            .into_iter()
            .map(|c| {
                let kind = match (c.old, c.new) {
                    (None, Some(_)) => ChangeKind::Added,
                    (Some(_), None) => ChangeKind::Deleted,
                    _ => ChangeKind::Modified,
                };
                assert_eq!(kind, c.kind, "{}", c.path);
                (c.path, c.old, c.new)
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn tree_differ_matches_flattened_trees_over_a_random_history() {
        // Names chosen to stress git's tree order ("a" as file vs dir, "a.b", "a-b",
        // "a0" sort around "a/"), file <-> directory swaps, mode-only and symlink
        // changes, and appends at the end of long trees (the common-prefix skip).
        let (_dir, repo) = repo();
        let names = ["a", "a.b", "a-b", "a0", "b", "zz"];
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let empty = repo
            .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
            .unwrap();
        let mut trees = vec![repo.head().unwrap().peel_to_tree().unwrap().id()];
        for step in 0..300 {
            let base = repo.find_tree(*trees.last().unwrap()).unwrap();
            let mut files = flatten(&repo, base.id());
            for _ in 0..1 + next(3) {
                let depth = 1 + next(3) as usize;
                let path: Vec<&str> = (0..depth).map(|_| names[next(names.len() as u64) as usize]).collect();
                let path = path.join("/");
                if next(4) == 0 {
                    files.retain(|p, _| p != &path && !p.starts_with(&format!("{path}/")));
                    continue;
                }
                // A file replaces whatever sat at its path or above or below it.
                files.retain(|p, _| {
                    p != &path && !p.starts_with(&format!("{path}/")) && !path.starts_with(&format!("{p}/"))
                });
                let mode = [0o100644, 0o100755, 0o120000][next(3) as usize];
                let blob = repo.blob(format!("{step}-{}", next(4)).as_bytes()).unwrap();
                files.insert(path, (blob, mode));
            }
            // Appends: many files in one directory, one more each step.
            let blob = repo.blob(format!("append {step}").as_bytes()).unwrap();
            files.insert(format!("log/{step:05}.md"), (blob, 0o100644));
            let mut update = TreeUpdateBuilder::new();
            for (p, (oid, mode)) in &files {
                let mode = match *mode {
                    0o100755 => FileMode::BlobExecutable,
                    0o120000 => FileMode::Link,
                    _ => FileMode::Blob,
                };
                update.upsert(p.as_str(), *oid, mode);
            }
            trees.push(update.create_updated(&repo, &empty).unwrap());
        }
        // One differ walked newest first (as the audit does), one walked oldest first,
        // and a fresh one per pair must all agree with the flattened trees.
        let mut newest_first = TreeDiffer::open(&repo).unwrap();
        for pair in trees.windows(2).rev() {
            let want = expected_changes(&repo, pair[0], pair[1]);
            assert!(!want.is_empty());
            assert_eq!(
                sorted(newest_first.diff(Some(pair[0]), Some(pair[1]), &[]).unwrap()),
                want
            );
        }
        let mut oldest_first = TreeDiffer::open(&repo).unwrap();
        for pair in trees.windows(2) {
            let want = expected_changes(&repo, pair[0], pair[1]);
            assert_eq!(
                sorted(oldest_first.diff(Some(pair[0]), Some(pair[1]), &[]).unwrap()),
                want
            );
            assert_eq!(
                sorted(diff_trees(&repo, Some(pair[1]), Some(pair[0]), &[]).unwrap()).len(),
                want.len()
            );
        }
        let first = trees[0];
        let last = *trees.last().unwrap();
        assert_eq!(
            sorted(diff_trees(&repo, None, Some(last), &[]).unwrap()).len(),
            flatten(&repo, last).len()
        );
        assert_eq!(
            sorted(diff_trees(&repo, Some(first), Some(last), &[]).unwrap()),
            expected_changes(&repo, first, last)
        );
    }

    #[test]
    fn common_entries_stop_before_the_first_entry_that_differs() {
        let entry = |name: &str, id: [u8; 20]| {
            let mut e = format!("100644 {name}\0").into_bytes();
            e.extend_from_slice(&id);
            e
        };
        let mut id = [7u8; 20];
        id[3] = 0; // a NUL inside an id must not be taken for the end of a name
        let a = [entry("one", id), entry("two", [1; 20])].concat();
        let mut other = [1; 20];
        other[19] = 2;
        let b = [entry("one", id), entry("two", other)].concat();
        let first_len = entry("one", id).len();
        assert_eq!(common_entries_len(&a, &b), first_len);
        assert_eq!(common_entries_len(&a, &a), a.len());
        let c = [entry("one", id), entry("two", [1; 20]), entry("zzz", [3; 20])].concat();
        assert_eq!(common_entries_len(&a, &c), a.len());
        assert_eq!(common_entries_len(&b, &entry("onf", id)), 0);
        assert_eq!(common_entries_len(&[], &a), 0);
    }

    #[test]
    fn a_damaged_read_is_tried_again_a_bounded_number_of_times() {
        let damaged = || git2::Error::new(git2::ErrorCode::GenericError, git2::ErrorClass::Index, "bad");
        let other = || git2::Error::new(git2::ErrorCode::NotFound, git2::ErrorClass::Os, "gone");
        let transient = |e: &git2::Error| e.class() == git2::ErrorClass::Index;
        // Damaged twice, then whole: read three times, the third answer returned.
        let mut calls = 0;
        let got = read_again(
            || {
                calls += 1;
                if calls < 3 {
                    Err(damaged())
                } else {
                    Ok(calls)
                }
            },
            transient,
        );
        assert_eq!(got.unwrap(), 3);
        // Damaged for good: given up after READ_TRIES reads, with the error.
        let mut calls = 0;
        let got: Result<(), _> = read_again(
            || {
                calls += 1;
                Err(damaged())
            },
            transient,
        );
        assert_eq!(got.unwrap_err().class(), git2::ErrorClass::Index);
        assert_eq!(calls, READ_TRIES);
        // Any other error: not read again.
        let mut calls = 0;
        let got: Result<(), _> = read_again(
            || {
                calls += 1;
                Err(other())
            },
            transient,
        );
        assert!(got.is_err());
        assert_eq!(calls, 1);
    }

    #[test]
    fn detects_dirty_builder_paths_only() {
        let (dir, repo) = repo();
        let own = Ownership::new(dir.path());
        assert!(dirty_builder_paths(&repo, &own).unwrap().is_empty());
        std::fs::create_dir_all(dir.path().join("reports")).unwrap();
        std::fs::write(dir.path().join("reports/r.md"), "r").unwrap();
        assert!(dirty_builder_paths(&repo, &own).unwrap().is_empty());
        std::fs::write(dir.path().join("prompts/t.md"), "changed").unwrap();
        std::fs::create_dir_all(dir.path().join("tools")).unwrap();
        std::fs::write(dir.path().join("tools/new.sh"), "x").unwrap();
        assert_eq!(
            dirty_builder_paths(&repo, &own).unwrap(),
            vec!["prompts/t.md", "tools/new.sh"]
        );
        // Deleted, staged-only and deeply nested untracked changes count too; a
        // directory whose name merely starts like a builder one does not.
        std::fs::remove_file(dir.path().join("prompts/t.md")).unwrap();
        std::fs::create_dir_all(dir.path().join("settings")).unwrap();
        std::fs::write(dir.path().join("settings/runtime.yaml"), "staged").unwrap();
        let mut idx = repo.index().unwrap();
        idx.add_path(Path::new("settings/runtime.yaml")).unwrap();
        idx.write().unwrap();
        std::fs::create_dir_all(dir.path().join("evals/t/cases")).unwrap();
        std::fs::write(dir.path().join("evals/t/cases/a.yaml"), "x").unwrap();
        std::fs::create_dir_all(dir.path().join("prompts-old")).unwrap();
        std::fs::write(dir.path().join("prompts-old/x.md"), "x").unwrap();
        assert_eq!(
            dirty_builder_paths(&repo, &own).unwrap(),
            vec![
                "evals/t/cases/a.yaml",
                "prompts/t.md",
                "settings/runtime.yaml",
                "tools/new.sh"
            ]
        );
    }

    #[test]
    fn held_bytes_are_committed_not_the_file_the_work_tree_now_holds() {
        let (dir, repo) = repo();
        std::fs::create_dir_all(dir.path().join("reports/t")).unwrap();
        // The record was written, then replaced by a link to a builder file.
        std::os::unix::fs::symlink("../../prompts/t.md", dir.path().join("reports/t/a.md")).unwrap();
        let held = vec![("reports/t/a.md".to_string(), b"runtime bytes".to_vec())];
        let oid = commit_new_files(&repo, &["reports/t/a.md".into()], &held, |_| true, "r", "r@x", "m").unwrap();
        let tree = repo.find_commit(oid).unwrap().tree().unwrap();
        let entry = tree.get_path(Path::new("reports/t/a.md")).unwrap();
        assert_eq!(entry.filemode(), i32::from(FileMode::Blob));
        assert_eq!(repo.find_blob(entry.id()).unwrap().content(), b"runtime bytes");
        let index = repo.index().unwrap();
        let staged = index.get_path(Path::new("reports/t/a.md"), 0).unwrap();
        assert_eq!(staged.id, entry.id());
        assert_eq!(staged.mode, u32::from(FileMode::Blob));
    }

    #[test]
    fn commits_only_new_allowed_files() {
        let (dir, repo) = repo();
        std::fs::create_dir_all(dir.path().join("reports/t")).unwrap();
        std::fs::write(dir.path().join("reports/t/a.md"), "a").unwrap();
        let own = Ownership::new(dir.path());
        let allowed = |p: &str| own.classify(p) == Owner::Runtime;
        let oid = commit_new_files(
            &repo,
            &["reports/t/a.md".into()],
            &[],
            allowed,
            "runtime",
            "runtime@localhost",
            "fire",
        )
        .unwrap();
        let c = repo.find_commit(oid).unwrap();
        assert_eq!(c.author().name().ok(), Some("runtime"));
        assert!(c.tree().unwrap().get_path(Path::new("prompts/t.md")).is_ok());
        assert!(head_blob(&repo, "reports/t/a.md").unwrap().is_some());
        let refused = commit_new_files(&repo, &["prompts/t.md".into()], &[], allowed, "r", "r@x", "m");
        assert!(matches!(refused, Err(GitError::Refused { .. })));
        let again = commit_new_files(&repo, &["reports/t/a.md".into()], &[], allowed, "r", "r@x", "m");
        assert!(
            matches!(again, Err(GitError::Refused { .. })),
            "rewriting a record is refused"
        );
        let statuses = repo.statuses(None).unwrap();
        assert!(statuses.iter().all(|s| s.path().ok() != Some("reports/t/a.md")));
    }
}

#[cfg(test)]
mod commit_tests {
    use super::*;

    #[test]
    fn dir_trees_find_what_get_path_finds() {
        let (dir, repo) = super::tests::repo();
        for f in [
            "top.txt",
            "runs/t/d/r1.json",
            "runs/t/d/r2.json",
            "runs/t/e/r3.json",
            "reports/x.md",
        ] {
            std::fs::create_dir_all(dir.path().join(f).parent().unwrap()).unwrap();
            std::fs::write(dir.path().join(f), f).unwrap();
        }
        let mut index = repo.index().unwrap();
        index.add_all(["*"], git2::IndexAddOption::DEFAULT, None).unwrap();
        let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
        let mut dirs = DirTrees::new(&repo, tree.clone());
        for f in [
            "top.txt",
            "runs/t/d/r1.json",
            "runs/t/d/r2.json",
            "runs/t/e/r3.json",
            "runs/t/e/missing.json",
            "runs/t/gone/r.json",
            "runs/t",
            "reports/x.md",
            "top.txt/under-a-file",
            "nothing",
        ] {
            let expected = tree.get_path(Path::new(f)).ok().map(|e| e.id());
            assert_eq!(dirs.entry(f), expected, "{f}");
        }
        assert!(dirs.entry("runs/t/d/r1.json").is_some());
    }

    /// A repository with one engineer's commit, a record written in the work tree, and
    /// options that wait briefly and keep intents in `.runtime/locks`.
    fn setup() -> (tempfile::TempDir, Repository) {
        let (dir, repo) = super::tests::repo();
        std::fs::create_dir_all(dir.path().join("runs/t")).unwrap();
        std::fs::write(dir.path().join("runs/t/r1.json"), "{}").unwrap();
        (dir, repo)
    }

    fn opts(root: &Path) -> CommitOptions<'static> {
        CommitOptions {
            lock_wait: Duration::from_millis(300),
            ..CommitOptions::new(root)
        }
    }

    fn commit(repo: &Repository, o: &CommitOptions) -> Result<Oid, GitError> {
        commit_record(repo, "runs/t/r1.json", o)
    }

    /// The runtime's commit of the record `rel` (allowed: anything under `runs/`).
    fn commit_record(repo: &Repository, rel: &str, o: &CommitOptions) -> Result<Oid, GitError> {
        commit_new_files_with(
            repo,
            &[rel.into()],
            |p| p.starts_with("runs/"),
            "runtime",
            "runtime@localhost",
            "runtime: t",
            o,
        )
    }

    /// The record is in HEAD's tree and in git's index as HEAD has it.
    fn assert_committed_and_indexed(repo: &Repository, rel: &str) {
        let in_head = head_blob(repo, rel).unwrap().expect("record in HEAD");
        let mut index = repo.index().unwrap();
        index.read(true).unwrap();
        let entry = index.get_path(Path::new(rel), 0).expect("record in the index");
        assert_eq!(entry.id, in_head);
        let st = repo.status_file(Path::new(rel)).unwrap();
        assert_eq!(st, Status::CURRENT, "git status sees {rel} as committed");
    }

    #[test]
    fn head_and_index_agree_after_a_commit_and_no_lock_or_intent_is_left() {
        let (dir, repo) = setup();
        let oid = commit(&repo, &opts(dir.path())).unwrap();
        assert_eq!(head_commit(&repo).unwrap(), Some(oid));
        assert_committed_and_indexed(&repo, "runs/t/r1.json");
        assert!(!repo.path().join("index.lock").exists());
        let left: Vec<_> = std::fs::read_dir(dir.path().join(".runtime/locks"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(INTENT_PREFIX))
            .collect();
        assert!(left.is_empty(), "intent records left: {left:?}");
        let reflog = repo.reflog("HEAD").unwrap();
        assert_eq!(reflog.get(0).unwrap().message().unwrap(), Some("commit: runtime: t"));
    }

    #[test]
    fn an_engineers_staged_change_stays_staged_and_out_of_the_commit() {
        let (dir, repo) = setup();
        std::fs::write(dir.path().join("prompts/t.md"), "staged").unwrap();
        let mut idx = repo.index().unwrap();
        idx.add_path(Path::new("prompts/t.md")).unwrap();
        idx.write().unwrap();
        let oid = commit(&repo, &opts(dir.path())).unwrap();
        let tree = repo.find_commit(oid).unwrap().tree().unwrap();
        let committed = tree.get_path(Path::new("prompts/t.md")).unwrap().id();
        assert_eq!(repo.find_blob(committed).unwrap().content(), b"hi");
        let st = repo.status_file(Path::new("prompts/t.md")).unwrap();
        assert!(st.contains(Status::INDEX_MODIFIED), "still staged: {st:?}");
    }

    /// The race of an engineer's `echo > notes; git stash` with a fire's commit, made
    /// exact: `prompts/t.md` changes, keeping its size and mtime, in the second the
    /// index was written (`index_after` later than the file; the entry is "racily
    /// clean" to git, which compares times by the second). ctime is not trusted here,
    /// as on file systems whose ctime git cannot use, so only the racy rule can see it.
    fn racy_change_survives_a_commit(index_after: Duration) {
        racy_change_survives(index_after, |repo, dir| {
            commit(repo, &opts(dir)).unwrap();
            assert_committed_and_indexed(repo, "runs/t/r1.json");
        });
    }

    /// [`racy_change_survives_a_commit`] for any writer of git's index.
    fn racy_change_survives(index_after: Duration, write: impl FnOnce(&Repository, &Path)) {
        let (dir, repo) = setup();
        let git = |args: &[&str]| {
            let out = std::process::Command::new("git")
                .args(args)
                .current_dir(dir.path())
                .output()
                .unwrap();
            String::from_utf8(out.stdout).unwrap()
        };
        git(&["config", "core.trustctime", "false"]);
        // Seconds ago (so that the fire's commit writes its index in a later second),
        // a tenth into a second (so that `index_after` stays within it).
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            - 10;
        let mtime = std::time::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(100);
        let stamp = |path: &Path, at: std::time::SystemTime| {
            std::fs::File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_modified(at)
                .unwrap()
        };
        let file = dir.path().join("prompts/t.md");
        stamp(&file, mtime);
        git(&["update-index", "--refresh"]);
        std::fs::write(&file, "ho").unwrap();
        stamp(&file, mtime);
        let index = repo.path().join("index");
        let racy = || stamp(&index, mtime + index_after);
        let changed = || git(&["diff-files", "--name-only"]);
        racy();
        assert_eq!(changed(), "prompts/t.md\n", "git sees the change before the commit");
        racy();
        write(&repo, dir.path());
        assert_eq!(
            changed(),
            "prompts/t.md\n",
            "git still sees the change after the index was written (index {index_after:?} after the file)"
        );
    }

    #[test]
    fn a_libgit2_checkout_after_the_stamp_is_cut_hides_no_racy_change() {
        // What the box's sync and the builder's own checkouts do in a person's work
        // tree: a checkout that updates the index, then the index read from a tree
        // and written.
        racy_change_survives(Duration::from_millis(200), |repo, _| {
            cut_index_stamp(repo);
            let tree = repo.head().unwrap().peel_to_tree().unwrap();
            let mut co = git2::build::CheckoutBuilder::new();
            co.force().update_index(true).path("runs/t/none");
            repo.checkout_tree(tree.as_object(), Some(&mut co)).unwrap();
            let mut index = repo.index().unwrap();
            index.read_tree(&tree).unwrap();
            index.write().unwrap();
        });
    }

    #[test]
    fn a_file_changed_in_the_instant_git_wrote_its_index_still_reads_as_changed_after_a_commit() {
        racy_change_survives_a_commit(Duration::ZERO);
    }

    #[test]
    fn a_file_changed_earlier_in_the_second_git_wrote_its_index_still_reads_as_changed_after_a_commit() {
        // libgit2 compares times to the nanosecond and would take this entry as settled.
        racy_change_survives_a_commit(Duration::from_millis(200));
    }

    #[test]
    fn a_held_index_lock_is_waited_for_then_named_and_head_stays() {
        let (dir, repo) = setup();
        let before = head_commit(&repo).unwrap();
        let lock = repo.path().join("index.lock");
        std::fs::write(&lock, "").unwrap();
        let t = std::time::Instant::now();
        match commit(&repo, &opts(dir.path())) {
            Err(e @ GitError::Locked { .. }) => {
                assert!(e.to_string().contains(&lock.display().to_string()), "{e}");
            }
            other => panic!("expected Locked, got {other:?}"),
        }
        assert!(t.elapsed() >= Duration::from_millis(300), "it waited");
        assert_eq!(head_commit(&repo).unwrap(), before, "HEAD unmoved");
        assert!(lock.exists(), "a lock with no intent record is never removed");
        // Released by its holder, the next commit goes through.
        std::fs::remove_file(&lock).unwrap();
        commit(&repo, &opts(dir.path())).unwrap();
        assert_committed_and_indexed(&repo, "runs/t/r1.json");
    }

    /// A child process that stands for a runtime holding the lock.
    fn holder() -> std::process::Child {
        std::process::Command::new("sleep").arg("30").spawn().unwrap()
    }

    fn write_intent(dir: &Path, pid: u32, start_time: Option<u64>, locks: Vec<IntentLock>) -> PathBuf {
        let locks_dir = dir.join(".runtime/locks");
        std::fs::create_dir_all(&locks_dir).unwrap();
        let path = locks_dir.join(format!("{INTENT_PREFIX}{pid}.json"));
        let record = IntentRecord {
            pid,
            start_time,
            locks,
            files: vec![],
            commit: None,
            blobs: Default::default(),
        };
        std::fs::write(&path, serde_json::to_vec(&record).unwrap()).unwrap();
        path
    }

    #[test]
    fn records_left_for_the_next_commit_are_taken_in_while_their_bytes_are_unchanged() {
        let (dir, repo) = setup();
        let (r2, r3) = (b"{\"r\":2}".to_vec(), b"{\"r\":3}".to_vec());
        std::fs::write(dir.path().join("runs/t/r2.json"), &r2).unwrap();
        std::fs::write(dir.path().join("runs/t/r3.json"), &r3).unwrap();
        let intents = intent_dir(dir.path());
        leave_for_next_commit(&intents, &[("runs/t/r2.json".into(), r2)]).unwrap();
        leave_for_next_commit(&intents, &[("runs/t/r3.json".into(), r3)]).unwrap();
        // Edited after its run left it: not committed as someone else's bytes.
        std::fs::write(dir.path().join("runs/t/r3.json"), "forged").unwrap();
        commit(&repo, &opts(dir.path())).unwrap();
        assert_committed_and_indexed(&repo, "runs/t/r2.json");
        assert_committed_and_indexed(&repo, "runs/t/r1.json");
        assert!(head_blob(&repo, "runs/t/r3.json").unwrap().is_none());
        assert_eq!(
            std::fs::read_dir(&intents)
                .unwrap()
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(INTENT_PREFIX))
                .count(),
            0
        );
    }

    #[test]
    fn a_commit_that_fails_leaves_its_records_for_the_next_one() {
        let (dir, repo) = setup();
        let lock = repo.path().join("index.lock");
        std::fs::write(&lock, "").unwrap();
        assert!(matches!(commit(&repo, &opts(dir.path())), Err(GitError::Locked { .. })));
        std::fs::remove_file(&lock).unwrap();
        // Another record's commit takes the blocked one in.
        std::fs::write(dir.path().join("runs/t/r4.json"), "{}").unwrap();
        commit_record(&repo, "runs/t/r4.json", &opts(dir.path())).unwrap();
        assert_committed_and_indexed(&repo, "runs/t/r1.json");
        assert_committed_and_indexed(&repo, "runs/t/r4.json");
    }

    #[test]
    fn a_live_runtimes_lock_is_kept_and_a_dead_ones_is_removed() {
        let (dir, repo) = setup();
        let lock = repo.path().join("index.lock");
        let mut child = holder();
        let pid = child.id();
        let intent = write_intent(dir.path(), pid, process_start_time(pid), vec![IntentLock::path(&lock)]);
        std::fs::write(&lock, "").unwrap();
        assert!(matches!(commit(&repo, &opts(dir.path())), Err(GitError::Locked { .. })));
        assert!(lock.exists() && intent.exists(), "the holder lives: nothing removed");
        child.kill().unwrap();
        child.wait().unwrap();
        commit(&repo, &opts(dir.path())).unwrap();
        assert!(!intent.exists(), "the dead runtime's intent is gone");
        assert!(!lock.exists());
        assert_committed_and_indexed(&repo, "runs/t/r1.json");
    }

    #[test]
    fn a_reused_pid_is_not_taken_for_the_runtime_that_recorded_it() {
        let (dir, repo) = setup();
        let lock = repo.path().join("index.lock");
        let mut child = holder();
        let pid = child.id();
        // Same pid, another start time: the process that wrote the record is gone.
        let start = process_start_time(pid).unwrap();
        write_intent(dir.path(), pid, Some(start + 1), vec![IntentLock::path(&lock)]);
        std::fs::write(&lock, "").unwrap();
        let r = commit(&repo, &opts(dir.path()));
        child.kill().unwrap();
        child.wait().unwrap();
        r.unwrap();
        assert_committed_and_indexed(&repo, "runs/t/r1.json");
    }

    #[test]
    fn a_dead_runtimes_intent_removes_only_its_own_locks() {
        let (dir, repo) = setup();
        let mut child = holder();
        let pid = child.id();
        let start = process_start_time(pid);
        child.kill().unwrap();
        child.wait().unwrap();
        let index_lock = repo.path().join("index.lock");
        let ref_lock = repo.path().join("refs/heads/other.lock");
        // The index lock was replaced since (another inode): someone else's now.
        std::fs::write(&index_lock, "").unwrap();
        let wrong_inode = {
            use std::os::unix::fs::MetadataExt;
            std::fs::metadata(&index_lock).unwrap().ino() + 1
        };
        std::fs::write(&ref_lock, "").unwrap();
        let unnamed = repo.path().join("refs/heads/unnamed.lock");
        std::fs::write(&unnamed, "").unwrap();
        let intent = write_intent(
            dir.path(),
            pid,
            start,
            vec![
                IntentLock {
                    path: index_lock.clone(),
                    inode: Some(wrong_inode),
                    ctime_ns: None,
                },
                IntentLock::path(&ref_lock),
            ],
        );
        let got = recover_stale_locks(&dir.path().join(".runtime/locks")).unwrap();
        assert_eq!(got.removed, vec![ref_lock.clone()]);
        assert!(index_lock.exists(), "another inode: not the dead runtime's lock");
        assert!(unnamed.exists(), "a lock no intent names is never removed");
        assert!(!ref_lock.exists() && !intent.exists());
    }

    #[test]
    fn a_runtime_killed_while_writing_its_index_copy_leaves_no_file_in_git() {
        let (dir, repo) = setup();
        let mut child = holder();
        let pid = child.id();
        let start = process_start_time(pid);
        child.kill().unwrap();
        child.wait().unwrap();
        let index_path = repo.path().join("index");
        let index_lock = lock_path_of(&index_path);
        let ref_lock = repo.path().join("refs/heads/main.lock");
        let side = SideFiles::of(&index_path, pid);
        // Killed inside libgit2's write of the private copy: its lock, the copy, the
        // saved index and both git locks are on disk.
        let left = [
            index_lock.clone(),
            side.temp_index.clone(),
            lock_path_of(&side.temp_index),
            side.saved_index.clone(),
            ref_lock.clone(),
        ];
        for f in &left {
            std::fs::write(f, "").unwrap();
        }
        write_intent(dir.path(), pid, start, intent_locks(&index_lock, &side, &ref_lock));
        recover_stale_locks(&dir.path().join(".runtime/locks")).unwrap();
        for f in &left {
            assert!(!f.exists(), "{} left behind", f.display());
        }
    }

    #[test]
    fn a_lock_on_a_reused_inode_is_someone_elses_and_kept() {
        let (dir, repo) = setup();
        let mut child = holder();
        let pid = child.id();
        let start = process_start_time(pid);
        child.kill().unwrap();
        child.wait().unwrap();
        // The dead runtime released its lock but died before dropping its intent; a
        // person's git took the lock since, on the very inode number (as file systems
        // reuse them): only the change time tells the two files apart.
        let lock = repo.path().join("index.lock");
        std::fs::write(&lock, "").unwrap();
        let now = LockId::of(&std::fs::metadata(&lock).unwrap());
        let recorded = IntentLock {
            path: lock.clone(),
            inode: Some(now.ino),
            ctime_ns: Some(now.ctime_ns - 1_000_000),
        };
        let intent = write_intent(dir.path(), pid, start, vec![recorded.clone()]);
        let got = recover_stale_locks(&dir.path().join(".runtime/locks")).unwrap();
        assert!(got.removed.is_empty(), "{got:?}");
        assert!(lock.exists(), "the person's lock stays");
        assert!(!intent.exists(), "the dead runtime's record is dropped");
        // The same inode and change time: the dead runtime's own lock, removed.
        let own = IntentLock {
            ctime_ns: Some(now.ctime_ns),
            ..recorded
        };
        write_intent(dir.path(), pid, start, vec![own]);
        let got = recover_stale_locks(&dir.path().join(".runtime/locks")).unwrap();
        assert_eq!(got.removed, vec![lock.clone()]);
    }

    #[test]
    fn a_lock_newer_than_the_intent_is_kept() {
        let (dir, repo) = setup();
        let mut child = holder();
        let pid = child.id();
        let start = process_start_time(pid);
        child.kill().unwrap();
        child.wait().unwrap();
        let lock = repo.path().join("index.lock");
        let intent = write_intent(dir.path(), pid, start, vec![IntentLock::path(&lock)]);
        std::fs::write(&lock, "").unwrap();
        // Created well after the record was last written: not the dead runtime's.
        let later = std::time::SystemTime::now() + LOCK_GRACE + Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&lock)
            .unwrap()
            .set_modified(later)
            .unwrap();
        let got = recover_stale_locks(&dir.path().join(".runtime/locks")).unwrap();
        assert!(got.removed.is_empty());
        assert!(lock.exists());
        assert!(!intent.exists(), "the record of a dead process is dropped");
    }

    #[test]
    fn head_moved_between_reading_and_updating_is_rebuilt_on_the_new_tip() {
        let (dir, repo) = setup();
        let moved = std::cell::Cell::new(None);
        let attempts = std::cell::Cell::new(0);
        let hook = |attempt: u32| {
            attempts.set(attempt);
            if attempt == 1 {
                // The engineer's commit lands between our read of HEAD and our update
                // (their git would wait for the index lock; this one writes the ref
                // directly, as `git update-ref` or another worktree does).
                let other = Repository::open(dir.path()).unwrap();
                let head = other.head().unwrap().peel_to_commit().unwrap();
                let sig = Signature::now("eng", "eng@x").unwrap();
                let tree = head.tree().unwrap();
                let id = other
                    .commit(Some("HEAD"), &sig, &sig, "engineer", &tree, &[&head])
                    .unwrap();
                moved.set(Some(id));
            }
        };
        let o = CommitOptions {
            before_ref_update: Some(&hook),
            ..opts(dir.path())
        };
        let oid = commit(&repo, &o).unwrap();
        assert_eq!(attempts.get(), 2, "built twice");
        let c = repo.find_commit(oid).unwrap();
        assert_eq!(Some(c.parent_id(0).unwrap()), moved.get(), "built on the new tip");
        assert_eq!(head_commit(&repo).unwrap(), Some(oid));
        assert_committed_and_indexed(&repo, "runs/t/r1.json");
    }

    #[test]
    fn a_head_that_never_stops_moving_fails_within_the_bound() {
        let (dir, repo) = setup();
        // The engineer's `git commit` would wait for the index lock we hold: this one
        // moves the branch without git's index, as `update-ref` or another worktree does.
        let hook2 = |_: u32| {
            let other = Repository::open(dir.path()).unwrap();
            let head = other.head().unwrap().peel_to_commit().unwrap();
            let sig = Signature::now("eng", "eng@x").unwrap();
            other
                .commit(Some("HEAD"), &sig, &sig, "engineer", &head.tree().unwrap(), &[&head])
                .unwrap();
        };
        let o = CommitOptions {
            before_ref_update: Some(&hook2),
            tries: 3,
            ..opts(dir.path())
        };
        assert!(matches!(commit(&repo, &o), Err(GitError::HeadMoving { tries: 3, .. })));
        assert!(head_blob(&repo, "runs/t/r1.json").unwrap().is_none());
        assert!(!repo.path().join("index.lock").exists());
        let mut index = repo.index().unwrap();
        index.read(true).unwrap();
        assert!(
            index.get_path(Path::new("runs/t/r1.json"), 0).is_none(),
            "the index is put back: the record is not left staged"
        );
        assert!(index.get_path(Path::new("prompts/t.md"), 0).is_some());
    }

    #[test]
    fn an_index_that_cannot_be_written_leaves_head_where_it_was() {
        let (dir, repo) = setup();
        let before = head_commit(&repo).unwrap();
        // Something occupies the private copy's path: the index cannot be written.
        let blocker = repo.path().join(format!("index.runtime-{}", std::process::id()));
        std::fs::create_dir(&blocker).unwrap();
        std::fs::write(blocker.join("x"), "").unwrap();
        assert!(commit(&repo, &opts(dir.path())).is_err());
        assert_eq!(head_commit(&repo).unwrap(), before, "HEAD unmoved");
        assert!(!repo.path().join("index.lock").exists(), "the lock is released");
        let mut index = repo.index().unwrap();
        index.read(true).unwrap();
        assert!(index.get_path(Path::new("runs/t/r1.json"), 0).is_none());
    }

    #[test]
    fn the_index_has_the_records_before_the_branch_moves_and_the_lock_is_held_throughout() {
        // `git commit` reads HEAD, then the index, then takes the lock: whoever can see
        // the new HEAD must also see the new index.
        let (dir, repo) = setup();
        let before = head_commit(&repo).unwrap();
        let seen = std::cell::Cell::new(false);
        let hook = |_: u32| {
            let other = Repository::open(dir.path()).unwrap();
            let index = other.index().unwrap();
            assert!(index.get_path(Path::new("runs/t/r1.json"), 0).is_some(), "index first");
            assert_eq!(head_commit(&other).unwrap(), before, "then the branch");
            assert!(other.path().join("index.lock").exists(), "under the lock");
            seen.set(true);
        };
        let o = CommitOptions {
            before_ref_update: Some(&hook),
            ..opts(dir.path())
        };
        commit(&repo, &o).unwrap();
        assert!(seen.get());
        assert_committed_and_indexed(&repo, "runs/t/r1.json");
    }

    #[test]
    fn records_a_dead_runtime_left_uncommitted_join_the_next_commit() {
        let (dir, repo) = setup();
        std::fs::write(dir.path().join("runs/t/r0.json"), "{\"dead\": true}").unwrap();
        let mut child = holder();
        let pid = child.id();
        let start = process_start_time(pid);
        child.kill().unwrap();
        child.wait().unwrap();
        let intent = write_intent(dir.path(), pid, start, vec![]);
        let mut record: IntentRecord = serde_json::from_slice(&std::fs::read(&intent).unwrap()).unwrap();
        record.files = vec!["runs/t/r0.json".into(), "prompts/t.md".into()];
        std::fs::write(&intent, serde_json::to_vec(&record).unwrap()).unwrap();
        let oid = commit(&repo, &opts(dir.path())).unwrap();
        assert_committed_and_indexed(&repo, "runs/t/r0.json");
        assert_committed_and_indexed(&repo, "runs/t/r1.json");
        let c = repo.find_commit(oid).unwrap();
        let parent = c.parent(0).unwrap();
        let blob = c.tree().unwrap().get_path(Path::new("prompts/t.md")).unwrap().id();
        assert_eq!(
            blob,
            parent.tree().unwrap().get_path(Path::new("prompts/t.md")).unwrap().id(),
            "a path outside the runtime's is never taken from an intent"
        );
    }

    #[test]
    fn records_a_dead_runtime_committed_but_never_indexed_are_indexed_by_the_next_commit() {
        let (dir, repo) = setup();
        // A runtime moved the branch to a commit with runs/t/r0.json, then died
        // before writing the index.
        std::fs::write(dir.path().join("runs/t/r0.json"), "{}").unwrap();
        let blob = repo.blob(b"{}").unwrap();
        let head = repo.head().unwrap().peel_to_commit().unwrap();
        let mut update = TreeUpdateBuilder::new();
        update.upsert("runs/t/r0.json", blob, FileMode::Blob);
        let tree = repo
            .find_tree(update.create_updated(&repo, &head.tree().unwrap()).unwrap())
            .unwrap();
        let sig = Signature::now("runtime", "r@x").unwrap();
        repo.commit(Some("HEAD"), &sig, &sig, "dead", &tree, &[&head]).unwrap();
        let mut child = holder();
        let pid = child.id();
        let start = process_start_time(pid);
        child.kill().unwrap();
        child.wait().unwrap();
        let intent = write_intent(dir.path(), pid, start, vec![]);
        let mut record: IntentRecord = serde_json::from_slice(&std::fs::read(&intent).unwrap()).unwrap();
        record.files = vec!["runs/t/r0.json".into()];
        std::fs::write(&intent, serde_json::to_vec(&record).unwrap()).unwrap();
        assert!(repo.index().unwrap().get_path(Path::new("runs/t/r0.json"), 0).is_none());
        commit(&repo, &opts(dir.path())).unwrap();
        assert_committed_and_indexed(&repo, "runs/t/r0.json");
        assert_committed_and_indexed(&repo, "runs/t/r1.json");
    }

    #[test]
    fn a_record_an_engineers_stale_index_dropped_is_committed_again_by_the_next_commit() {
        let (dir, repo) = setup();
        // The engineer's `git commit` read the index before ours was written, and wrote
        // it back after: their next commit drops the record from HEAD.
        let stale = std::fs::read(repo.path().join("index")).unwrap();
        commit(&repo, &opts(dir.path())).unwrap();
        std::fs::write(repo.path().join("index"), stale).unwrap();
        let other = Repository::open(dir.path()).unwrap();
        let mut idx = other.index().unwrap();
        let tree = other.find_tree(idx.write_tree().unwrap()).unwrap();
        let head = other.head().unwrap().peel_to_commit().unwrap();
        let sig = Signature::now("eng", "eng@x").unwrap();
        other.commit(Some("HEAD"), &sig, &sig, "eng", &tree, &[&head]).unwrap();
        assert!(head_blob(&repo, "runs/t/r1.json").unwrap().is_none(), "dropped");
        std::fs::write(dir.path().join("runs/t/r2.json"), "{}").unwrap();
        commit_record(&repo, "runs/t/r2.json", &opts(dir.path())).unwrap();
        assert_committed_and_indexed(&repo, "runs/t/r1.json");
        assert_committed_and_indexed(&repo, "runs/t/r2.json");
    }

    #[test]
    fn a_record_a_stale_index_write_back_lost_is_put_back_in_the_index() {
        let (dir, repo) = setup();
        let stale = std::fs::read(repo.path().join("index")).unwrap();
        commit(&repo, &opts(dir.path())).unwrap();
        std::fs::write(repo.path().join("index"), stale).unwrap();
        assert_ne!(repo.status_file(Path::new("runs/t/r1.json")).unwrap(), Status::CURRENT);
        std::fs::write(dir.path().join("runs/t/r2.json"), "{}").unwrap();
        commit_record(&repo, "runs/t/r2.json", &opts(dir.path())).unwrap();
        assert_committed_and_indexed(&repo, "runs/t/r1.json");
        assert_committed_and_indexed(&repo, "runs/t/r2.json");
    }

    #[test]
    fn a_linked_worktree_commits_to_its_own_branch_and_index() {
        let (dir, repo) = setup();
        let linked = dir
            .path()
            .parent()
            .unwrap()
            .join(format!("{}-linked", dir.path().file_name().unwrap().to_string_lossy()));
        repo.worktree("wt", &linked, None).unwrap();
        let main_head = head_commit(&repo).unwrap();
        std::fs::create_dir_all(linked.join("runs/t")).unwrap();
        std::fs::write(linked.join("runs/t/r1.json"), "{}").unwrap();
        let wt = Repository::open(&linked).unwrap();
        let oid = commit(&wt, &opts(&linked)).unwrap();
        assert_eq!(head_commit(&wt).unwrap(), Some(oid));
        assert_committed_and_indexed(&wt, "runs/t/r1.json");
        assert_eq!(
            head_commit(&repo).unwrap(),
            main_head,
            "the main worktree's branch stays"
        );
        assert!(repo.index().unwrap().get_path(Path::new("runs/t/r1.json"), 0).is_none());
        let _ = std::fs::remove_dir_all(&linked);
    }
}
