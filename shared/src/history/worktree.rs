//! Card files changed in the work tree (triage not committed yet, hand edits) win
//! over HEAD in the index, and a card goes back to HEAD's version once its edit is
//! gone (committed, checked out, deleted). Found without `git status`, which loads
//! git's whole index (a third of a second at 220,000 tracked files): a stat cache of
//! `cards/` in the builder's database (`card_files`) says which files changed since
//! the last look, only those are hashed, and HEAD's side comes from a tree diff of
//! `cards/` since the commit of the last look. A file modified within two seconds of
//! a look is hashed again next time (a later write could keep its mtime).

use super::{get_meta, remove_record, upsert_record, HistoryError, RecordError};
use crate::git::TreeDiffer;
use crate::store::Store;
use git2::{ObjectType, Oid, Repository};
use rusqlite::params;
use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Key in `meta` of the HEAD commit at the last look.
const LOOKED_AT: &str = "worktree_cards_head";
/// Modified this recently (ns): the stat is not trusted next time.
const RACY_NS: i64 = 2_000_000_000;

/// What the last look saw of one card path.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    /// -1 when the stat must not be trusted (racy, or the file is absent).
    mtime_ns: i64,
    /// -1 when the file was absent from the work tree.
    size: i64,
    /// Blob id of the work-tree content (empty when absent).
    blob: String,
    /// The work tree differs from HEAD here, so the index holds the work tree's side.
    dirty: bool,
}

/// A change to the index of records.
enum IndexOp {
    Upsert(String, Vec<u8>),
    Remove(String),
}

/// Brings the index's cards in line with the work tree; returns how many card files
/// differ from HEAD (their work-tree side is what the index holds).
pub fn overlay(repo: &Repository, store: &mut Store, skipped: &mut Vec<String>) -> Result<usize, HistoryError> {
    let Some(root) = repo.workdir().map(Path::to_path_buf) else {
        return Ok(0);
    };
    let started = std::time::Instant::now();
    let head = repo.head().ok().and_then(|h| h.peel_to_commit().ok());
    let mut seen = load(store)?;
    let head_side = HeadSide::new(repo, store, &seen, head.as_ref())?;
    let loaded_ms = started.elapsed().as_secs_f64() * 1e3;
    let mut look = Look::default();
    look.walk(&root, &seen, &head_side, skipped)?;
    look.absent(&seen, &head_side);
    for (path, row) in &look.rows {
        match row {
            Some(s) => seen.insert(path.clone(), s.clone()),
            None => seen.remove(path),
        };
    }
    let dirty = seen.values().filter(|s| s.dirty).count();
    let walked_ms = started.elapsed().as_secs_f64() * 1e3;
    let head_id = head.map(|c| c.id().to_string());
    look.save(store, head_id.as_deref(), skipped)?;
    tracing::debug!(
        files = look.walked.len(),
        hashed = look.hashed,
        index_updates = look.ops.len(),
        cache_updates = look.rows.len(),
        loaded_ms,
        walked_ms,
        total_ms = started.elapsed().as_secs_f64() * 1e3,
        "looked at the work tree's cards"
    );
    Ok(dirty)
}

/// HEAD's side of the cards: what HEAD changed since the last look, and HEAD's tree
/// for the paths the cache cannot vouch for.
struct HeadSide<'r> {
    /// No usable last look: nothing in the cache speaks for HEAD.
    first_look: bool,
    /// HEAD's blobs that the cache cannot vouch for: every card on a first look,
    /// else those HEAD changed since the last one (`None`: gone from HEAD).
    changed: HashMap<String, Option<Oid>>,
    tree: Option<git2::Tree<'r>>,
}

impl<'r> HeadSide<'r> {
    fn new(
        repo: &'r Repository,
        store: &Store,
        seen: &HashMap<String, Seen>,
        head: Option<&git2::Commit<'r>>,
    ) -> Result<HeadSide<'r>, HistoryError> {
        let head_tree = head.map(|c| c.tree_id());
        let since = get_meta(store, LOOKED_AT)?
            .filter(|_| !seen.is_empty())
            .and_then(|l| Oid::from_str(&l).ok())
            .and_then(|o| repo.find_commit(o).ok())
            .map(|c| c.tree_id());
        let first_look = since.is_none();
        let changed: HashMap<String, Option<Oid>> = if !first_look && since == head_tree {
            HashMap::new()
        } else {
            TreeDiffer::open(repo)?
                .diff(since, head_tree, &["cards"])?
                .into_iter()
                .filter(|c| crate::records::is_card_path(&c.path))
                .map(|c| (c.path, c.new.map(|(oid, _)| oid)))
                .collect()
        };
        let tree = head_tree.map(|t| repo.find_tree(t)).transpose()?;
        Ok(HeadSide {
            first_look,
            changed,
            tree,
        })
    }

    /// HEAD's blob at `path`, given what the last look saw there.
    fn blob(&self, path: &str, before: Option<&Seen>) -> Option<Oid> {
        if let Some(b) = self.changed.get(path) {
            return *b;
        }
        match before {
            _ if self.first_look => None,
            // Clean last time: HEAD held what the work tree held, and HEAD has not
            // changed this path since.
            Some(s) if !s.dirty => Oid::from_str(&s.blob).ok(),
            Some(_) => self.tree.as_ref()?.get_path(Path::new(path)).ok().map(|e| e.id()),
            None => None,
        }
    }
}

/// What one look found: the index and cache changes to write, and what it walked.
#[derive(Default)]
struct Look {
    ops: Vec<IndexOp>,
    /// New cache rows (`None`: drop the row).
    rows: Vec<(String, Option<Seen>)>,
    walked: HashSet<String>,
    hashed: usize,
}

impl Look {
    /// Looks at every card file in the work tree.
    fn walk(
        &mut self,
        root: &Path,
        seen: &HashMap<String, Seen>,
        head: &HeadSide,
        skipped: &mut Vec<String>,
    ) -> Result<(), HistoryError> {
        let now_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64);
        for (path, meta) in files_below(&root.join("cards")) {
            let Ok(rel) = path.strip_prefix(root) else { continue };
            let rel = rel.to_string_lossy().replace('\\', "/");
            if !crate::records::is_card_path(&rel) {
                continue;
            }
            let before = seen.get(&rel);
            let file = WorkFile {
                path: &path,
                rel,
                meta: &meta,
                before,
            };
            self.file(file, head, now_ns, skipped)?;
        }
        Ok(())
    }

    /// Looks at one card file present in the work tree.
    fn file(
        &mut self,
        file: WorkFile,
        head: &HeadSide,
        now_ns: i64,
        skipped: &mut Vec<String>,
    ) -> Result<(), HistoryError> {
        let WorkFile {
            path,
            rel,
            meta,
            before,
        } = file;
        let mtime_ns = meta.mtime() * 1_000_000_000 + meta.mtime_nsec();
        let size = meta.size() as i64;
        let stat_same = before.is_some_and(|s| s.mtime_ns >= 0 && s.mtime_ns == mtime_ns && s.size == size);
        let work_blob = match before {
            Some(s) if stat_same => Oid::from_str(&s.blob)?,
            _ => match Oid::hash_file(ObjectType::Blob, path) {
                Ok(oid) => {
                    self.hashed += 1;
                    oid
                }
                Err(e) => {
                    skipped.push(format!("{rel}: {}", e.message()));
                    return Ok(());
                }
            },
        };
        let dirty = head.blob(&rel, before) != Some(work_blob);
        let was_dirty = before.is_some_and(|s| s.dirty);
        // The index holds HEAD's side unless the last look overlaid this file (and
        // HEAD did not rewrite it since): upsert when that is not what it should hold.
        let stale = if dirty {
            !was_dirty || !stat_same || head.changed.contains_key(&rel)
        } else {
            was_dirty
        };
        if stale {
            match std::fs::read(path) {
                Ok(bytes) => self.ops.push(IndexOp::Upsert(rel.clone(), bytes)),
                Err(e) => skipped.push(format!("{rel}: {e}")),
            }
        }
        let now = Seen {
            mtime_ns: if now_ns - mtime_ns < RACY_NS { -1 } else { mtime_ns },
            size,
            blob: work_blob.to_string(),
            dirty,
        };
        if before != Some(&now) {
            self.rows.push((rel.clone(), Some(now)));
        }
        self.walked.insert(rel);
        Ok(())
    }

    /// Paths gone from the work tree: seen before, or in HEAD's changes.
    fn absent(&mut self, seen: &HashMap<String, Seen>, head: &HeadSide) {
        let absent: HashSet<&String> = seen
            .keys()
            .chain(head.changed.keys())
            .filter(|p| !self.walked.contains(*p))
            .collect();
        for path in absent {
            let before = seen.get(path);
            let in_head = head.blob(path, before).is_some();
            let marked = before.is_some_and(|s| s.size < 0);
            if in_head {
                // Deleted in the work tree only: the index drops it until it is back.
                if !marked || head.changed.contains_key(path) {
                    self.ops.push(IndexOp::Remove(path.clone()));
                }
                if !marked {
                    self.rows.push((
                        path.clone(),
                        Some(Seen {
                            mtime_ns: -1,
                            size: -1,
                            blob: String::new(),
                            dirty: true,
                        }),
                    ));
                }
            } else if let Some(s) = before {
                if s.dirty {
                    self.ops.push(IndexOp::Remove(path.clone()));
                }
                self.rows.push((path.clone(), None));
            }
        }
    }

    /// Writes the index changes, the cache rows and the HEAD of this look (`None`:
    /// no HEAD) in one transaction; cards that do not parse go to `skipped`.
    fn save(&self, store: &mut Store, head_id: Option<&str>, skipped: &mut Vec<String>) -> Result<(), HistoryError> {
        store.write(|tx| {
            for op in &self.ops {
                match op {
                    IndexOp::Remove(p) => {
                        remove_record(tx, p)?;
                    }
                    IndexOp::Upsert(p, bytes) => match upsert_record(tx, p, bytes) {
                        Ok(_) => {}
                        Err(RecordError::Parse(m)) => skipped.push(format!("{p}: {m}")),
                        Err(RecordError::Sql(e)) => return Err(e),
                    },
                }
            }
            let mut put = tx.prepare_cached(
                "INSERT OR REPLACE INTO card_files (path, mtime_ns, size, blob, dirty) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            let mut drop = tx.prepare_cached("DELETE FROM card_files WHERE path = ?1")?;
            for (path, row) in &self.rows {
                match row {
                    Some(s) => put.execute(params![path, s.mtime_ns, s.size, s.blob, s.dirty])?,
                    None => drop.execute([path])?,
                };
            }
            match head_id {
                Some(h) => tx.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)",
                    params![LOOKED_AT, h],
                )?,
                None => tx.execute("DELETE FROM meta WHERE key = ?1", [LOOKED_AT])?,
            };
            Ok(())
        })?;
        Ok(())
    }
}

/// A card file found in the work tree, with what the last look saw of it.
struct WorkFile<'a> {
    path: &'a Path,
    /// Repository-relative, `/`-separated.
    rel: String,
    meta: &'a std::fs::Metadata,
    before: Option<&'a Seen>,
}

/// Regular files below `dir` (not following symlinks) with their metadata, the
/// subdirectories of `dir` split over the cores. Each file is stat'ed relative to its
/// open directory (walkdir stats by full path, a path walk per file); the stats are
/// most of a look at 20,000 cards.
fn files_below(dir: &Path) -> Vec<(PathBuf, std::fs::Metadata)> {
    let mut top = Vec::new();
    let mut subdirs = Vec::new();
    walk_dir(dir, &mut top, &mut subdirs);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    let chunk = subdirs.len().div_ceil(threads).max(1);
    let parts: Vec<Vec<(PathBuf, std::fs::Metadata)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = subdirs
            .chunks(chunk)
            .map(|dirs| {
                scope.spawn(move || {
                    let mut files = Vec::new();
                    let mut pending = dirs.to_vec();
                    while let Some(d) = pending.pop() {
                        walk_dir(&d, &mut files, &mut pending);
                    }
                    files
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_default()).collect()
    });
    top.into_iter().chain(parts.into_iter().flatten()).collect()
}

/// The entries of one directory: files (with metadata) to `files`, directories to
/// `dirs`; an unreadable directory is skipped, as git status skips it.
fn walk_dir(dir: &Path, files: &mut Vec<(PathBuf, std::fs::Metadata)>, dirs: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.filter_map(Result::ok) {
        match e.file_type() {
            Ok(t) if t.is_dir() => dirs.push(e.path()),
            Ok(t) if t.is_file() => {
                if let Ok(m) = e.metadata() {
                    files.push((e.path(), m));
                }
            }
            _ => {}
        }
    }
}

fn load(store: &Store) -> Result<HashMap<String, Seen>, HistoryError> {
    let rows = store.query_all("SELECT path, mtime_ns, size, blob, dirty FROM card_files", [], |r| {
        Ok((
            r.get::<_, String>(0)?,
            Seen {
                mtime_ns: r.get(1)?,
                size: r.get(2)?,
                blob: r.get(3)?,
                dirty: r.get(4)?,
            },
        ))
    })?;
    Ok(rows.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{self, Card, CardKind};

    struct Repo {
        dir: tempfile::TempDir,
        repo: Repository,
        store: Store,
    }

    impl Repo {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let repo = Repository::init(dir.path()).unwrap();
            let store = super::super::open_store(dir.path()).unwrap();
            Repo { dir, repo, store }
        }

        /// Writes a card file with `summary`; returns its path.
        fn card(&self, summary: &str) -> String {
            let c = Card::new(
                CardKind::MaxSteps,
                "t",
                "run-1",
                summary,
                "detail",
                vec![],
                chrono::Utc::now(),
            );
            let rel = c.rel_path().to_string_lossy().into_owned();
            self.write(&rel, &records::card_yaml(&c).unwrap());
            rel
        }

        fn write(&self, rel: &str, body: &str) {
            let p = self.dir.path().join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, body).unwrap();
        }

        fn read(&self, rel: &str) -> String {
            std::fs::read_to_string(self.dir.path().join(rel)).unwrap()
        }

        fn commit_all(&self) {
            let mut idx = self.repo.index().unwrap();
            idx.add_all(["*"], git2::IndexAddOption::DEFAULT, None).unwrap();
            idx.update_all(["*"], None).unwrap();
            idx.write().unwrap();
            let tree = self.repo.find_tree(idx.write_tree().unwrap()).unwrap();
            let sig = git2::Signature::now("eng", "eng@x").unwrap();
            let parent = self.repo.head().ok().and_then(|h| h.peel_to_commit().ok());
            let parents: Vec<&git2::Commit> = parent.iter().collect();
            self.repo
                .commit(Some("HEAD"), &sig, &sig, "c", &tree, &parents)
                .unwrap();
        }

        /// `builder history index`: HEAD first, then the work tree; the overlay count.
        fn index(&mut self) -> usize {
            super::super::index(&self.repo, &mut self.store, &|_, _| {}).unwrap();
            let mut skipped = Vec::new();
            let n = overlay(&self.repo, &mut self.store, &mut skipped).unwrap();
            assert!(skipped.is_empty(), "{skipped:?}");
            n
        }

        fn summary(&self, rel: &str) -> Option<String> {
            self.store
                .conn()
                .query_row("SELECT summary FROM cards WHERE path = ?1", [rel], |r| r.get(0))
                .ok()
        }
    }

    /// Moves a file's mtime into the past, as if written long before the look (so
    /// the stat cache trusts it instead of treating it as racy).
    fn age(r: &Repo, rel: &str) {
        let f = std::fs::File::options()
            .write(true)
            .open(r.dir.path().join(rel))
            .unwrap();
        f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(60))
            .unwrap();
    }

    #[test]
    fn work_tree_cards_overlay_head_and_fall_back_to_it() {
        let mut r = Repo::new();
        let a = r.card("a committed");
        let b = r.card("b committed");
        r.commit_all();
        age(&r, &a);
        age(&r, &b);
        assert_eq!(r.index(), 0, "a clean work tree overlays nothing");
        assert_eq!(r.summary(&a).as_deref(), Some("a committed"));

        // A hand edit wins over HEAD.
        let committed_a = r.read(&a);
        r.write(&a, &committed_a.replace("a committed", "a edited"));
        assert_eq!(r.index(), 1);
        assert_eq!(r.summary(&a).as_deref(), Some("a edited"));
        // Looking again changes nothing (the cached stat of an unchanged file).
        age(&r, &a);
        assert_eq!(r.index(), 1);
        assert_eq!(r.summary(&a).as_deref(), Some("a edited"));

        // Committing the edit: HEAD and the work tree agree again.
        r.commit_all();
        assert_eq!(r.index(), 0);
        assert_eq!(r.summary(&a).as_deref(), Some("a edited"));

        // A tracked card deleted in the work tree leaves the index; restored, it is back.
        let committed_b = r.read(&b);
        std::fs::remove_file(r.dir.path().join(&b)).unwrap();
        assert_eq!(r.index(), 1);
        assert_eq!(r.summary(&b), None);
        r.write(&b, &committed_b);
        assert_eq!(r.index(), 0);
        assert_eq!(r.summary(&b).as_deref(), Some("b committed"));

        // An untracked card is indexed while it exists.
        let c = r.card("c untracked");
        assert_eq!(r.index(), 1);
        assert_eq!(r.summary(&c).as_deref(), Some("c untracked"));
        std::fs::remove_file(r.dir.path().join(&c)).unwrap();
        assert_eq!(r.index(), 0);
        assert_eq!(r.summary(&c), None);

        // A local edit survives a new commit that changes another card (a pull).
        r.write(&b, &committed_b.replace("b committed", "b edited"));
        assert_eq!(r.index(), 1);
        let d = r.card("d from a pull");
        {
            let mut idx = r.repo.index().unwrap();
            idx.add_path(Path::new(&d)).unwrap();
            idx.write().unwrap();
            let tree = r.repo.find_tree(idx.write_tree().unwrap()).unwrap();
            let sig = git2::Signature::now("runtime", "runtime@localhost").unwrap();
            let head = r.repo.head().unwrap().peel_to_commit().unwrap();
            r.repo
                .commit(Some("HEAD"), &sig, &sig, "pull", &tree, &[&head])
                .unwrap();
        }
        assert_eq!(r.index(), 1);
        assert_eq!(r.summary(&b).as_deref(), Some("b edited"));
        assert_eq!(r.summary(&d).as_deref(), Some("d from a pull"));
        // Checked out again: back to HEAD's version.
        r.write(&b, &committed_b);
        assert_eq!(r.index(), 0);
        assert_eq!(r.summary(&b).as_deref(), Some("b committed"));
    }

    #[test]
    fn an_edit_that_keeps_size_and_mtime_is_still_seen_while_racy() {
        let mut r = Repo::new();
        let a = r.card("aaaa");
        r.commit_all();
        // Looked at right after it was written: the stat is not trusted next time.
        assert_eq!(r.index(), 0);
        let meta = std::fs::metadata(r.dir.path().join(&a)).unwrap();
        let edited = r.read(&a).replace("aaaa", "bbbb");
        r.write(&a, &edited);
        let f = std::fs::File::options()
            .write(true)
            .open(r.dir.path().join(&a))
            .unwrap();
        f.set_modified(meta.modified().unwrap()).unwrap();
        assert_eq!(r.index(), 1, "same size and mtime, new content");
        assert_eq!(r.summary(&a).as_deref(), Some("bbbb"));
    }
}
