//! Git helpers over git2: open the repository, read HEAD and the blob ids a fire runs
//! on, check builder-owned paths for uncommitted changes, and commit a set of *new*
//! files under a given identity, refusing any path outside an allowed set. The commit
//! is built from HEAD's tree plus the new files (never from whatever the index holds),
//! so an engineer's staged work is never swept into a runtime commit. After it, as
//! `git commit` does, `git gc --auto` packs loose objects once there are many. History
//! readers (the index, the audit) diff trees with [`TreeDiffer`].

use crate::layout::{Owner, Ownership, BUILDER_DIRS};
use git2::{build::TreeUpdateBuilder, FileMode, Oid, Repository, Signature, Status, StatusOptions};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

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
    let mut out = Vec::new();
    for s in repo.statuses(Some(&mut opts))?.iter() {
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

/// Commits `files` (repo-relative, already written in the work tree) on top of HEAD.
/// Every file must satisfy `allowed` and must not exist in HEAD: the runtime only
/// ever adds records. A file with an entry in `held` is committed (and staged) with
/// those bytes, the ones its writer holds in memory, never re-read from the work
/// tree, where a tool process may have replaced it since (a symlink, a FIFO, other
/// bytes); the others are read from the work tree. Returns the new commit id.
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
    // Every object this commit references is written just below or already in HEAD's
    // tree; skip libgit2's existence re-checks (a measurable share of a fire's time).
    git2::opts::strict_object_creation(false);
    let head = head_commit(repo)?;
    let parent = head.map(|h| repo.find_commit(h)).transpose()?;
    let base_tree = match &parent {
        Some(p) => p.tree()?,
        None => repo.find_tree(repo.treebuilder(None)?.write()?)?,
    };
    let mut update = TreeUpdateBuilder::new();
    for f in files {
        if f.contains("..") || f.starts_with('/') || f.contains("//") || !allowed(f) {
            return Err(GitError::Refused {
                path: f.clone(),
                why: "outside the runtime-owned paths".into(),
            });
        }
        if base_tree.get_path(Path::new(f)).is_ok() {
            return Err(GitError::Refused {
                path: f.clone(),
                why: "already in HEAD; the runtime only adds new files".into(),
            });
        }
        if let Some((_, bytes)) = held.iter().find(|(p, _)| p == f) {
            let oid = repo.blob(bytes)?;
            update.upsert(f.as_str(), oid, FileMode::Blob);
            continue;
        }
        let full = root.join(f);
        let meta = std::fs::symlink_metadata(&full).map_err(|e| GitError::Io {
            path: full.clone(),
            source: e,
        })?;
        if !meta.file_type().is_file() {
            return Err(GitError::Refused {
                path: f.clone(),
                why: "not a regular file (symlinks and devices are never committed)".into(),
            });
        }
        let bytes = std::fs::read(&full).map_err(|e| GitError::Io {
            path: full.clone(),
            source: e,
        })?;
        let oid = repo.blob(&bytes)?;
        update.upsert(f.as_str(), oid, FileMode::Blob);
    }
    let tree_id = update.create_updated(repo, &base_tree)?;
    let tree = repo.find_tree(tree_id)?;
    let sig = Signature::now(name, email)?;
    let parents: Vec<&git2::Commit> = parent.iter().collect();
    let oid = repo.commit(Some("HEAD"), &sig, &sig, message, &tree, &parents)?;
    // Keep the index in step so `git status` shows the new files as committed. The
    // handle may have loaded it a while ago: take what is on disk now (a no-op when
    // the file is unchanged), so nothing staged meanwhile is written over.
    let mut index = repo.index()?;
    index.read(false)?;
    for f in files {
        match held.iter().find(|(p, _)| p == f) {
            Some((_, bytes)) => index.add_frombuffer(&held_entry(f), bytes)?,
            None => index.add_path(Path::new(f))?,
        }
    }
    index.write()?;
    Ok(oid)
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

/// The id of the tree holding only the builder-owned directories of `tree` (what an
/// approval names, and what makes two refusals "on the same builder tree"). Writes
/// that small tree object into the repository (a no-op when it exists).
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
/// for anything else libgit2 reports (a lock, an unsafe owner, a corrupt config).
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
    Ok(WorkTree { repo, root })
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
        let main = dir.path().join("main");
        let repo = Repository::init(&main).unwrap();
        let sig = Signature::now("T", "t@example.com").unwrap();
        let tree = repo
            .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
            .unwrap();
        repo.commit(Some("HEAD"), &sig, &sig, "init", &tree, &[]).unwrap();
        let linked = dir.path().join("linked");
        repo.worktree("linked", &linked, None).unwrap();
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

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> (tempfile::TempDir, Repository) {
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
