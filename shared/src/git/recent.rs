//! The records of the runtime's last commits, watched by each later commit: an
//! engineer's `git commit` that wrote back an index it read before a runtime commit
//! drops them from HEAD while they stay in the work tree, and a `git rebase --abort`
//! or `reset --hard` can throw their commit away; the next runtime commit takes them
//! in again ([`super::commit_new_files_with`]).

use super::head_commit;
use git2::{Oid, Repository};
use std::path::Path;

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
pub(super) fn remember_records(dir: &Path, commit: Oid, files: Vec<String>) {
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
pub(super) struct Watched {
    /// Still in the work tree, but HEAD lost them (an engineer's commit dropped them).
    pub(super) dropped: Vec<String>,
    /// Still in the work tree, and HEAD has them.
    pub(super) kept: Vec<String>,
    /// Gone from the work tree and from every branch with the commit that held them,
    /// and the blob it held: a `git rebase --abort` or `reset --hard` that put a
    /// branch back to where it was before a runtime commit landed on it (a commit
    /// that raced the first moments of a person's rebase, before git marks one in
    /// progress).
    pub(super) discarded: Vec<(String, Oid)>,
}

/// The records of the runtime's last commits: those HEAD lost while the work tree
/// still holds them, those it has, and those a reset threw away with their commit
/// ([`Watched`]). The kept ones are put back in the index if it lost them (see
/// [`super::index::write_index`]), which reads the index once anyway.
pub(super) fn watched_records(repo: &Repository, dir: &Path) -> Watched {
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
/// looked up from the root each, every lookup read, inflated and hash-checked those
/// trees again (libgit2 caches no tree over 4 KB), which made the commit's cost grow
/// with the records a day holds.
pub(super) struct DirTrees<'r> {
    repo: &'r Repository,
    root: git2::Tree<'r>,
    dirs: std::collections::HashMap<String, Option<git2::Tree<'r>>>,
}

impl<'r> DirTrees<'r> {
    pub(super) fn new(repo: &'r Repository, root: git2::Tree<'r>) -> DirTrees<'r> {
        DirTrees {
            repo,
            root,
            dirs: std::collections::HashMap::new(),
        }
    }

    /// The id of the entry at `path` (`/`-separated), if the tree has one.
    pub(super) fn entry(&mut self, path: &str) -> Option<Oid> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_trees_find_what_get_path_finds() {
        let (dir, repo) = crate::git::tests::repo();
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
}
