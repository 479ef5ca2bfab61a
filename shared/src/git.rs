//! Git helpers over git2: open the repository, read HEAD and the blob ids a fire runs
//! on, check builder-owned paths for uncommitted changes, and commit a set of *new*
//! files under a given identity, refusing any path outside an allowed set. The commit
//! is built from HEAD's tree plus the new files (never from whatever the index holds),
//! so an engineer's staged work is never swept into a runtime commit.

use crate::layout::{Owner, Ownership, BUILDER_DIRS};
use git2::{build::TreeUpdateBuilder, FileMode, Oid, Repository, Signature, Status, StatusOptions};
use std::path::{Path, PathBuf};

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
}

/// Opens the repository whose work tree contains `path`.
pub fn discover(path: &Path) -> Result<Repository, GitError> {
    Repository::discover(path).map_err(|e| GitError::NotARepo {
        path: path.to_path_buf(),
        message: e.message().to_string(),
    })
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
    // Extra builder globs from settings may live anywhere; otherwise only the fixed
    // directories need looking at.
    if !ownership.has_extra_builder_paths() {
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
/// ever adds records. Returns the new commit id.
pub fn commit_new_files(
    repo: &Repository,
    files: &[String],
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
    // Keep the index in step so `git status` shows the new files as committed.
    let mut index = repo.index()?;
    for f in files {
        index.add_path(Path::new(f))?;
    }
    index.write()?;
    Ok(oid)
}

/// Tunes libgit2 for walking history: reading, not writing, so skip re-hashing
/// every object read (SHA-1 with collision detection was a fifth of an audit's time
/// on loose objects); `git fsck` is the tool for that check.
pub fn tune_for_history_walks() {
    git2::opts::strict_hash_verification(false);
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
/// below the top-level directories in `only`. Subtrees with the same id are skipped
/// without being read, so the cost follows the size of the change, not of the tree
/// (libgit2's tree-to-tree diff walks every entry). Renames show as delete + add.
pub fn diff_trees(
    repo: &Repository,
    old: Option<&git2::Tree>,
    new: Option<&git2::Tree>,
    only: &[&str],
) -> Result<Vec<TreeChange>, git2::Error> {
    let mut out = Vec::new();
    diff_level(repo, old, new, "", only, &mut out)?;
    Ok(out)
}

fn diff_level(
    repo: &Repository,
    old: Option<&git2::Tree>,
    new: Option<&git2::Tree>,
    prefix: &str,
    only: &[&str],
    out: &mut Vec<TreeChange>,
) -> Result<(), git2::Error> {
    use std::cmp::Ordering;
    // Both trees are sorted in git's order, so one merge pass pairs their entries
    // without building maps; only changed entries allocate a path.
    let (la, lb) = (old.map_or(0, |t| t.len()), new.map_or(0, |t| t.len()));
    let (mut i, mut j) = (0, 0);
    while i < la || j < lb {
        let ea = if i < la { old.and_then(|t| t.get(i)) } else { None };
        let eb = if j < lb { new.and_then(|t| t.get(j)) } else { None };
        let order = match (&ea, &eb) {
            (Some(x), Some(y)) => git_order(x, y),
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (None, None) => break,
        };
        let (ea, eb) = match order {
            Ordering::Less => {
                i += 1;
                (ea, None)
            }
            Ordering::Greater => {
                j += 1;
                (None, eb)
            }
            Ordering::Equal => {
                i += 1;
                j += 1;
                (ea, eb)
            }
        };
        if let (Some(x), Some(y)) = (&ea, &eb) {
            if x.id() == y.id() && x.filemode() == y.filemode() {
                continue;
            }
        }
        let name = ea
            .as_ref()
            .or(eb.as_ref())
            .map(|e| String::from_utf8_lossy(e.name_bytes()).into_owned())
            .unwrap_or_default();
        if prefix.is_empty() && !only.is_empty() && !only.contains(&name.as_str()) {
            continue;
        }
        let path = if prefix.is_empty() {
            name
        } else {
            format!("{prefix}/{name}")
        };
        let is_tree =
            |e: &Option<git2::TreeEntry>| e.as_ref().is_some_and(|e| e.kind() == Some(git2::ObjectType::Tree));
        if is_tree(&ea) || is_tree(&eb) {
            let ta = if is_tree(&ea) {
                ea.as_ref().map(|e| repo.find_tree(e.id())).transpose()?
            } else {
                None
            };
            let tb = if is_tree(&eb) {
                eb.as_ref().map(|e| repo.find_tree(e.id())).transpose()?
            } else {
                None
            };
            diff_level(repo, ta.as_ref(), tb.as_ref(), &path, only, out)?;
        }
        let blob = |e: &Option<git2::TreeEntry>| {
            e.as_ref()
                .filter(|e| e.kind() != Some(git2::ObjectType::Tree))
                .map(|e| (e.id(), e.filemode()))
        };
        let (blob_a, blob_b) = (blob(&ea), blob(&eb));
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

/// Git's tree order: names compared bytewise, a directory as if it ended in `/`.
fn git_order(a: &git2::TreeEntry, b: &git2::TreeEntry) -> std::cmp::Ordering {
    use std::cmp::Ordering;
    let (na, nb) = (a.name_bytes(), b.name_bytes());
    if let Some((x, y)) = na.iter().zip(nb).find(|(x, y)| x != y) {
        return x.cmp(y);
    }
    // One name is a prefix of the other (or they are equal): a tree's name goes on
    // with '/', a blob's name ends.
    let common = na.len().min(nb.len());
    let next = |e: &git2::TreeEntry| -> Option<u8> {
        match e.name_bytes().get(common) {
            Some(c) => Some(*c),
            None if e.kind() == Some(git2::ObjectType::Tree) => Some(b'/'),
            None => None,
        }
    };
    match (next(a), next(b)) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(x), Some(y)) => x.cmp(&y),
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
        let changes = diff_trees(&repo, Some(&before), Some(&after), &[]).unwrap();
        let got: Vec<(&str, ChangeKind)> = changes.iter().map(|c| (c.path.as_str(), c.kind)).collect();
        assert_eq!(
            got,
            vec![
                ("prompts/t.md", ChangeKind::Modified),
                ("reports/t/a.md", ChangeKind::Added)
            ]
        );
        let only = diff_trees(&repo, Some(&before), Some(&after), &["reports"]).unwrap();
        assert_eq!(only.len(), 1);
        let back = diff_trees(&repo, Some(&after), Some(&before), &[]).unwrap();
        assert!(back
            .iter()
            .any(|c| c.path == "reports/t/a.md" && c.kind == ChangeKind::Deleted));
        assert!(diff_trees(&repo, Some(&after), Some(&after), &[]).unwrap().is_empty());
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
        let refused = commit_new_files(&repo, &["prompts/t.md".into()], allowed, "r", "r@x", "m");
        assert!(matches!(refused, Err(GitError::Refused { .. })));
        let again = commit_new_files(&repo, &["reports/t/a.md".into()], allowed, "r", "r@x", "m");
        assert!(
            matches!(again, Err(GitError::Refused { .. })),
            "rewriting a record is refused"
        );
        let statuses = repo.statuses(None).unwrap();
        assert!(statuses.iter().all(|s| s.path().ok() != Some("reports/t/a.md")));
    }
}
