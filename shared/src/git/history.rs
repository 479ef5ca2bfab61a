//! Reading history: the files that differ between two trees, for the readers that
//! walk many commits (the builder's history index, the audit). [`TreeDiffer`] reads
//! raw tree objects and skips what both sides share, so a diff costs what changed,
//! not the size of the tree.

use git2::{Oid, Repository};
use std::collections::HashMap;
use std::rc::Rc;

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
            self.diff_entry(x, y, prefix, only, out)?;
        }
        Ok(())
    }

    /// One name of the trees at `prefix` whose entries `x` (old) and `y` (new) differ:
    /// the subtrees below it diffed, the file at it reported.
    fn diff_entry(
        &mut self,
        x: Option<EntryRef>,
        y: Option<EntryRef>,
        prefix: &str,
        only: &[&str],
        out: &mut Vec<TreeChange>,
    ) -> Result<(), git2::Error> {
        let Some(name) = x.or(y).map(|e| String::from_utf8_lossy(e.filename)) else {
            return Ok(());
        };
        if prefix.is_empty() && !only.is_empty() && !only.contains(&name.as_ref()) {
            return Ok(());
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
            (None, None) => return Ok(()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::tests::repo;
    use git2::{build::TreeUpdateBuilder, FileMode};
    use std::path::Path;

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

    /// The trees of a random history of 300 steps from HEAD's tree, oldest first.
    /// Names chosen to stress git's tree order ("a" as file vs dir, "a.b", "a-b",
    /// "a0" sort around "a/"), file <-> directory swaps, mode-only and symlink
    /// changes, and appends at the end of long trees (the common-prefix skip).
    fn random_history(repo: &Repository) -> Vec<Oid> {
        let names = ["a", "a.b", "a-b", "a0", "b", "zz"];
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let mut trees = vec![repo.head().unwrap().peel_to_tree().unwrap().id()];
        for step in 0..300 {
            let base = repo.find_tree(*trees.last().unwrap()).unwrap();
            let mut files = flatten(repo, base.id());
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
            trees.push(tree_of(repo, &files));
        }
        trees
    }

    /// Writes the tree holding `files` (path to blob id and mode).
    fn tree_of(repo: &Repository, files: &std::collections::BTreeMap<String, (Oid, i32)>) -> Oid {
        let empty = repo
            .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
            .unwrap();
        let mut update = TreeUpdateBuilder::new();
        for (p, (oid, mode)) in files {
            let mode = match *mode {
                0o100755 => FileMode::BlobExecutable,
                0o120000 => FileMode::Link,
                _ => FileMode::Blob,
            };
            update.upsert(p.as_str(), *oid, mode);
        }
        update.create_updated(repo, &empty).unwrap()
    }

    #[test]
    fn tree_differ_matches_flattened_trees_over_a_random_history() {
        let (_dir, repo) = repo();
        let trees = random_history(&repo);
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
}
