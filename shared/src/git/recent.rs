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

impl RecentCommits {
    /// Adds `commits` after those held, keeping the last [`RECENT_KEEP`].
    fn extend(&mut self, commits: impl IntoIterator<Item = (String, Vec<String>)>) {
        self.commits.extend(commits);
        let excess = self.commits.len().saturating_sub(RECENT_KEEP);
        self.commits.drain(..excess);
    }
}

/// The watched commits, oldest first ([`parse_recent`]).
fn read_recent(dir: &Path) -> RecentCommits {
    std::fs::read(dir.join(RECENT_FILE)).map_or_else(|_| RecentCommits::default(), |b| parse_recent(&b))
}

/// The file's commits: one line per commit, `[commit, [records]]`, the last
/// [`RECENT_KEEP`] kept (a torn last line, from a writer killed mid-append, is passed
/// over; a file in the older form, one `{"commits": [...]}` object, is read as well).
fn parse_recent(bytes: &[u8]) -> RecentCommits {
    let mut recent = RecentCommits::default();
    for line in bytes.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        if let Ok(one) = serde_json::from_slice::<(String, Vec<String>)>(line) {
            recent.extend([one]);
        } else if let Ok(older) = serde_json::from_slice::<RecentCommits>(line) {
            recent.extend(older.commits);
        }
    }
    recent
}

/// The commits the runtime of the work tree at `root` made: its last [`RECENT_KEEP`]
/// records commits, as it remembers them (what a person rewrote, or authored under
/// the runtime's name, is not among them).
pub fn made_by_this_runtime(root: &Path) -> std::collections::HashSet<Oid> {
    read_recent(&super::locks::intent_dir(root))
        .commits
        .iter()
        .filter_map(|(c, _)| Oid::from_str(c).ok())
        .collect()
}

/// Names `now` in place of each of `before` among the watched commits, when the sync
/// put those commits' records on the branch as `now` (rebuilt or replayed): the watch
/// then follows the commit the branch holds, so a record a person later removes with
/// a commit stays removed (the commit it came in is on the branch), instead of being
/// taken for one a reset threw away and committed again.
pub fn remember_replaced(root: &Path, before: &[Oid], now: Oid) {
    let dir = super::locks::intent_dir(root);
    let mut recent = read_recent(&dir);
    let olds: Vec<String> = before.iter().map(Oid::to_string).collect();
    let mut changed = false;
    for (commit, _) in recent.commits.iter_mut().filter(|(c, _)| olds.contains(c)) {
        *commit = now.to_string();
        changed = true;
    }
    if changed {
        compact(&dir, &recent);
    }
}

/// Adds a commit to the watched ones (best effort: a lost list only loses the watch).
/// Appended as a line, so no file is made and none freed per commit (each costs a
/// fire time on a file system that scans recently freed inodes); once the file would
/// hold twice [`RECENT_KEEP`] lines it is written again with the last ones
/// (temporary file, rename).
pub(super) fn remember_records(dir: &Path, commit: Oid, files: Vec<String>) {
    use std::io::Write;
    let path = dir.join(RECENT_FILE);
    let existing = std::fs::read(&path).unwrap_or_default();
    if existing.iter().filter(|b| **b == b'\n').count() + 1 >= 2 * RECENT_KEEP {
        let mut recent = parse_recent(&existing);
        recent.extend([(commit.to_string(), files)]);
        return compact(dir, &recent);
    }
    let written = serde_json::to_vec(&(commit.to_string(), &files))
        .map_err(std::io::Error::other)
        .and_then(|mut line| {
            line.push(b'\n');
            // After a torn line (or a file in the older form), start a new one.
            if existing.last().is_some_and(|b| *b != b'\n') {
                line.insert(0, b'\n');
            }
            std::fs::OpenOptions::new()
                .append(true)
                .create(true)
                .open(&path)?
                .write_all(&line)
        });
    if let Err(e) = written {
        tracing::debug!(error = %e, "the list of recent records was not updated");
    }
}

/// Writes the file again with `recent` alone.
fn compact(dir: &Path, recent: &RecentCommits) {
    let tmp = dir.join(format!("{RECENT_FILE}.{}", std::process::id()));
    let mut text = Vec::new();
    for one in &recent.commits {
        if let Ok(line) = serde_json::to_vec(one) {
            text.extend(line);
            text.push(b'\n');
        }
    }
    let written = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, dir.join(RECENT_FILE)));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        tracing::debug!(error = %e, "the list of recent records was not compacted");
    }
}

/// What became of the records of the runtime's last commits ([`watched_records`]).
#[derive(Debug, Default)]
pub(super) struct Watched {
    /// Still in the work tree, but HEAD lost them (an engineer's commit dropped them),
    /// each with the blob the runtime's commit held (`None`: that commit is not here).
    pub(super) dropped: Vec<(String, Option<Oid>)>,
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
        out.dropped.iter().any(|(d, _)| d == f) || out.kept.contains(f) || out.discarded.iter().any(|(d, _)| d == f)
    };
    for (commit, files) in &recent.commits {
        // Asked once per commit, and only when one of its records left the work tree.
        let mut orphaned: Option<Option<git2::Tree>> = None;
        // The commit's own tree, for a record HEAD lost: its bytes are the record's.
        let mut made: Option<Option<git2::Tree>> = None;
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
                let tree = made.get_or_insert_with(|| {
                    Oid::from_str(commit)
                        .ok()
                        .and_then(|c| repo.find_commit(c).and_then(|c| c.tree()).ok())
                });
                let blob = tree
                    .as_ref()
                    .and_then(|t| t.get_path(Path::new(f)).ok())
                    .map(|e| e.id());
                out.dropped.push((f.clone(), blob));
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

    /// Commits are appended a line each, read oldest first, the last RECENT_KEEP
    /// kept; a torn line is passed over and the next append starts a line of its own;
    /// the file is written again once it would hold twice RECENT_KEEP lines; a file in
    /// the older form is read.
    #[test]
    fn recent_commits_are_appended_and_compacted() {
        let dir = tempfile::tempdir().unwrap();
        let older = serde_json::json!({"commits": [["aa", ["runs/t/0.json"]]]});
        std::fs::write(dir.path().join(RECENT_FILE), older.to_string()).unwrap();
        let oid = |i: usize| Oid::hash_object(git2::ObjectType::Blob, i.to_string().as_bytes()).unwrap();
        remember_records(dir.path(), oid(1), vec!["runs/t/1.json".into()]);
        let read = read_recent(dir.path()).commits;
        assert_eq!(read.len(), 2, "{read:?}");
        assert_eq!(read[0].0, "aa");
        assert_eq!(read[1], (oid(1).to_string(), vec!["runs/t/1.json".to_string()]));
        // A writer killed mid-append.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join(RECENT_FILE))
            .unwrap();
        std::io::Write::write_all(&mut f, b"[\"bb\", [\"runs/t/").unwrap();
        remember_records(dir.path(), oid(2), vec!["runs/t/2.json".into()]);
        let read = read_recent(dir.path()).commits;
        assert_eq!(
            read.iter().map(|c| c.0.clone()).collect::<Vec<_>>(),
            vec!["aa".to_string(), oid(1).to_string(), oid(2).to_string()]
        );
        for i in 3..2 * RECENT_KEEP + 10 {
            remember_records(dir.path(), oid(i), vec![format!("runs/t/{i}.json")]);
        }
        let text = std::fs::read_to_string(dir.path().join(RECENT_FILE)).unwrap();
        assert!(
            text.lines().count() < 2 * RECENT_KEEP,
            "compacted: {} lines",
            text.lines().count()
        );
        let read = read_recent(dir.path()).commits;
        assert_eq!(read.len(), RECENT_KEEP);
        assert_eq!(read.last().unwrap().0, oid(2 * RECENT_KEEP + 9).to_string());
    }

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
