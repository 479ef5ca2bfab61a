//! Git helpers over git2: open the repository and learn who is acting, read HEAD and
//! the blob ids a fire runs on, check builder-owned paths for uncommitted changes,
//! and, after a commit, let `git gc --auto` pack loose objects as `git commit` does.
//! The two larger parts live in files of their own and are re-exported here, so
//! callers name everything `git::x`: the crash-safe commit of a fire's new files
//! (`git/commit.rs`, built on the index copy and its stamps in `git/index.rs`, the
//! intent records and git's locks in `git/locks.rs`, and the watch over the runtime's
//! last commits in `git/recent.rs`), and reading history (`git/history.rs`: tree
//! diffs with [`TreeDiffer`]).

mod commit;
mod history;
mod index;
mod locks;
mod recent;

pub use commit::{
    commit_new_files, commit_new_files_with, commit_object, CommitOptions, SignCommit, COMMIT_TRIES, INDEX_LOCK_WAIT,
};
pub use history::{diff_trees, tune_for_history_walks, ChangeKind, TreeChange, TreeDiffer};
pub use index::cut_index_stamp;
pub use locks::{
    intent_dir, leave_for_next_commit, lock_file_of, make_dirs_under_index_lock, process_is_gone, process_start_time,
    recover_stale_locks, with_index_lock, IntentLock, IntentRecord, LockIntent, Recovered,
};
pub use recent::{made_by_this_runtime, remember_replaced};

use crate::layout::{Owner, Ownership, BUILDER_DIRS};
#[cfg(test)]
use git2::Signature;
use git2::{Oid, Repository, Status, StatusOptions};
use std::path::{Path, PathBuf};
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
    let head = head_ref(repo)?;
    match head.symbolic_target()? {
        None => Ok(Some(Blocker::Detached {
            at: head.target().map(crate::text::short_oid).unwrap_or_default(),
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
    let head = head_ref(repo).ok()?;
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
    match head_resolved(repo) {
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
    dirty_paths_where(repo, ownership.has_extra_builder_paths(), |p| {
        ownership.classify(p) == Owner::Builder
    })
}

/// The paths with uncommitted changes that `owned` keeps, sorted. `anywhere`: owned
/// paths may lie outside the five builder directories (extra `builder_paths`), so
/// the whole work tree is looked at.
pub fn dirty_paths_where(
    repo: &Repository,
    anywhere: bool,
    owned: impl Fn(&str) -> bool,
) -> Result<Vec<String>, GitError> {
    let mut opts = StatusOptions::new();
    opts.include_untracked(true)
        .recurse_untracked_dirs(true)
        .include_ignored(false)
        .exclude_submodules(false);
    // Extra builder globs from settings may live anywhere: look at everything.
    // Otherwise only the fixed directories, given as literal paths: libgit2 then
    // skips whatever lies outside them in the index and the work tree, where
    // patterns make it walk all of both (1.3-1.6 s at 220,000 tracked files).
    if !anywhere {
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
        |e| e.class() == git2::ErrorClass::Index || replaced_while_read(e),
    )?;
    let mut out = Vec::new();
    for s in statuses.iter() {
        if s.status() == Status::CURRENT || s.status().contains(Status::IGNORED) {
            continue;
        }
        if let Ok(p) = s.path() {
            if owned(p) {
                out.push(p.to_string());
            }
        }
    }
    out.extend(hidden_from_status(repo, anywhere, &owned)?);
    out.sort();
    out.dedup();
    Ok(out)
}

/// The owned paths whose index entries tell git not to look at the work tree
/// (`git update-index --skip-worktree` or `--assume-unchanged`): a change there shows
/// in no status, yet a script that sources the file, or a tool the model runs, reads
/// the work tree's bytes. Each is named with its mark, as a dirty path.
fn hidden_from_status(
    repo: &Repository,
    anywhere: bool,
    owned: &impl Fn(&str) -> bool,
) -> Result<Vec<String>, GitError> {
    let index = repo.index()?;
    let hidden = |e: &git2::IndexEntry| {
        let skip = git2::IndexEntryExtendedFlag::from_bits_truncate(e.flags_extended)
            .contains(git2::IndexEntryExtendedFlag::SKIP_WORKTREE);
        let assumed = git2::IndexEntryFlag::from_bits_truncate(e.flags).contains(git2::IndexEntryFlag::VALID);
        match (skip, assumed) {
            (true, _) => Some("skip-worktree"),
            (false, true) => Some("assume-unchanged"),
            (false, false) => None,
        }
    };
    let mut out = Vec::new();
    let mut look = |from: usize, prefix: Option<&str>| {
        for i in from..index.len() {
            let Some(e) = index.get(i) else { break };
            let path = String::from_utf8_lossy(&e.path).into_owned();
            if prefix.is_some_and(|p| !path.starts_with(p)) {
                break;
            }
            if let Some(mark) = hidden(&e).filter(|_| owned(&path)) {
                out.push(format!(
                    "{path} (marked --{mark}: git status does not look at it; `git update-index --no-{mark} {path}` clears it)"
                ));
            }
        }
    };
    if anywhere {
        look(0, None);
    } else {
        for d in BUILDER_DIRS.iter().filter(|d| **d != ".git") {
            let prefix = format!("{d}/");
            if let Ok(from) = index.find_prefix(prefix.as_str()) {
                look(from, Some(&prefix));
            }
        }
    }
    Ok(out)
}

/// How many times [`read_again`] reads a file of git's that read as damaged.
const READ_TRIES: u32 = 4;

/// Runs `read` until it succeeds or fails otherwise than `transient` says, at most
/// [`READ_TRIES`] times in all, 25 ms apart. For files other processes replace while
/// the runtime reads them (the index, HEAD: seen damaged once in some hundreds of
/// fires racing a person's rebase, and whole again a moment later, though every
/// writer we know renames into place; see [`replaced_while_read`] for one way).
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

/// Whether `e` is libgit2's short read of a file replaced while it read it: it takes a
/// file's size from its path, then opens the path, and a file git renamed into place
/// in between (HEAD going from a detached commit, 41 bytes, back to `ref:
/// refs/heads/main`, 21, as a rebase ends) reads as "could not read (expected 41
/// bytes, read 21)".
fn replaced_while_read(e: &git2::Error) -> bool {
    e.class() == git2::ErrorClass::Filesystem && e.message().starts_with("could not read (expected")
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

/// The largest tree libgit2 keeps parsed in its object cache, once
/// [`cache_large_trees`] has raised it: a day's directory of run records (several
/// hundred entries under cron, some tens of KiB) is read at each of a commit's
/// lookups through it. 1 MiB holds about 15,000 entries.
const TREE_CACHE_LIMIT: usize = 1 << 20;

/// Lets libgit2 cache trees up to [`TREE_CACHE_LIMIT`] (its default stops at 4 KiB):
/// a commit then inflates and parses each large directory once, not once per lookup.
/// For the start of `main`, before any other thread exists (refused after, or
/// without `/proc` to count threads: only speed is lost, said at debug level, so
/// cron mails nothing).
pub fn cache_large_trees() {
    if let Err(e) = kernel::libgit2::cache_trees_up_to(TREE_CACHE_LIMIT) {
        tracing::debug!("cannot raise libgit2's tree cache limit: {e}");
    }
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
        // No hook runs: the runtime runs this itself, with nobody watching, and a
        // hook file is whatever reached `.git/hooks` (issue 17, helper-95).
        .args(["-c", "core.hooksPath=/dev/null", "gc", "--auto", "--quiet"])
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
    let _ = read_again(|| repo.head().map(|_| ()), head_read_transient);
}

/// HEAD's own reference (symbolic or detached), read again while a person's git
/// command replaces it ([`head_read_transient`]).
pub(crate) fn head_ref(repo: &Repository) -> Result<git2::Reference<'_>, git2::Error> {
    read_again(|| repo.find_reference("HEAD"), head_read_transient)
}

/// HEAD resolved to its branch's commit (`git2::Repository::head`), read again as
/// [`head_ref`] is.
pub(crate) fn head_resolved(repo: &Repository) -> Result<git2::Reference<'_>, git2::Error> {
    read_again(|| repo.head(), head_read_transient)
}

/// A read of HEAD that failed because HEAD was being replaced: damaged for a moment,
/// or shorter than when libgit2 took its size ([`replaced_while_read`]).
fn head_read_transient(e: &git2::Error) -> bool {
    (e.class() == git2::ErrorClass::Reference && e.message().contains("corrupted")) || replaced_while_read(e)
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
    fn a_short_read_of_a_replaced_file_is_read_again_and_other_errors_are_not() {
        let short = || {
            git2::Error::new(
                git2::ErrorCode::GenericError,
                git2::ErrorClass::Filesystem,
                "could not read (expected 41 bytes, read 21)",
            )
        };
        assert!(replaced_while_read(&short()));
        let missing = git2::Error::new(
            git2::ErrorCode::NotFound,
            git2::ErrorClass::Filesystem,
            "could not open '/x/HEAD': No such file or directory",
        );
        assert!(!replaced_while_read(&missing));
        // Replaced once, then whole: read_again returns the second read.
        let mut reads = 0;
        let got = read_again(
            || {
                reads += 1;
                if reads == 1 {
                    Err(short())
                } else {
                    Ok(reads)
                }
            },
            replaced_while_read,
        );
        assert_eq!(got.unwrap(), 2);
    }

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
}
