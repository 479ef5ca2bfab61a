//! Git's index as the runtime's commit writes it: the index read under a private
//! name, the new records added, the result renamed over the index while git's index
//! lock is held, the index as it was kept to put back if the commit fails, and the
//! modification stamp cut to the second so no racily clean entry of a person's work
//! tree is taken for settled.

use super::commit::CommitParts;
use super::GitError;
use git2::{FileMode, Oid, Repository};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Keeps the index as it is (a hard link, or a copy with the index's own stamp), to
/// put back if the commit fails; `false` when there is no index yet.
pub(super) fn save_index(p: &CommitParts) -> Result<bool, GitError> {
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
/// claim). libgit2 writes an index only through its own lock, so it reads the index
/// under a private name and writes its new index there. The repository's index
/// handle is left as it was unless an entry needed it: whoever reads the index
/// through it afterwards reads it again first (`Index::read(false)`).
pub(super) fn write_index(repo: &Repository, p: &CommitParts, add: &[&str]) -> Result<(), GitError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |e| GitError::Io { path, source: e }
    };
    let _ = std::fs::remove_file(p.temp_index);
    // A second name for the index rather than a copy: libgit2 writes its new index
    // through a lock file renamed over that name, so the index file itself is never
    // written, and no file is made for a copy (each file a fire makes costs it time,
    // see docs/benchmarks.md). The stamp is then cut on the index itself, which only
    // makes more entries racy (see `cut_index_stamp`).
    let linked =
        std::fs::hard_link(p.index_path, p.temp_index).or_else(|_| std::fs::copy(p.index_path, p.temp_index).map(drop));
    match linked {
        Ok(()) => keep_index_stamp(p.index_path, p.temp_index).map_err(io(p.temp_index))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !p.index_path.exists() => {}
        Err(e) => return Err(io(p.temp_index)(e)),
    }
    // Bound to the repository, the index finds the work tree for `add_path`, the
    // object database for `add_frombuffer`, and the work tree again for libgit2's
    // check of racily clean entries as it writes (an index of no repository skips
    // it). An entry made from held bytes needs none of them, and an index whose racy
    // entries all still hold their blobs ([`racy_entries_unchanged`]) needs no check:
    // then the repository's handle is never swapped (nor the real index read again
    // to swap it back).
    let stamp = second_of_stamp(p.temp_index);
    let bound = std::cell::Cell::new(false);
    let written = (|| -> Result<(), GitError> {
        let mut index = git2::Index::open(p.temp_index)?;
        let bind = |index: &mut git2::Index| -> Result<(), git2::Error> {
            if !bound.get() {
                repo.set_index(index)?;
                bound.set(true);
            }
            Ok(())
        };
        for f in add {
            match p.held.iter().find(|(h, _)| h == f) {
                Some((_, bytes)) => match worktree_entry(repo, f, bytes) {
                    Some(entry) => index.add(&entry)?,
                    None => {
                        bind(&mut index)?;
                        index.add_frombuffer(&held_entry(f), bytes)?
                    }
                },
                None => {
                    bind(&mut index)?;
                    index.add_path(Path::new(f))?
                }
            }
        }
        for f in p.kept {
            if index.get_path(Path::new(f), 0).is_none() {
                tracing::warn!(file = %f, "a record the index lost is put back");
                bind(&mut index)?;
                index.add_path(Path::new(f))?;
            }
        }
        // Last, right before the write (as libgit2's own check runs in it): the
        // entries just added hold what was just hashed. Bound already, libgit2
        // checks them itself.
        if !bound.get() && !racy_entries_unchanged(repo, &index, stamp, add) {
            bind(&mut index)?;
        }
        index.write()?;
        Ok(())
    })();
    let published = written.and_then(|()| std::fs::rename(p.temp_index, p.index_path).map_err(io(p.index_path)));
    // Whatever happened, a swapped handle goes back to the real index.
    let restored = match bound.get() {
        true => git2::Index::open(p.index_path).and_then(|mut real| repo.set_index(&mut real)),
        false => Ok(()),
    };
    published?;
    restored?;
    Ok(())
}

/// The second of `index`'s modification time, which git's racy rule compares with.
fn second_of_stamp(index: &Path) -> Option<u64> {
    let modified = std::fs::metadata(index).and_then(|m| m.modified()).ok()?;
    Some(modified.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs())
}

/// Whether every entry of `index` that changed in or after the second of the index
/// file's (cut) stamp, the entries only a look at the work tree can tell clean (git's
/// racy rule, by the second), still has its content there: then libgit2's own check
/// of them as it writes (a diff of the index against the work tree, with the
/// attributes and filters of each path loaded: about a quarter of a fire's commit)
/// has nothing to mark, and the index need not be bound to the repository for it.
///
/// A racy entry reads as unchanged only when its path holds a regular file with one
/// name, reached through no link, whose bytes hash to the entry's blob and are bytes
/// no filter of git's changes (no carriage return for the line-ending filters, no
/// `$Id` for `ident`): git compares a file's content after its clean filter, so a
/// file those filters could change is left to libgit2, which filters as git does.
/// Anything else too (a changed or missing file, a link, a submodule, a conflict, an
/// unknown stamp) is left to libgit2, which marks what changed for git to read again.
/// The paths of `added` are skipped: their entries hold what was just hashed.
fn racy_entries_unchanged(repo: &Repository, index: &git2::Index, stamp: Option<u64>, added: &[&str]) -> bool {
    let Some(stamp) = stamp else { return false };
    let mut racy = index
        .iter()
        .filter(|e| e.mode != u32::from(FileMode::Commit))
        .filter(|e| !added.iter().any(|a| a.as_bytes() == e.path.as_slice()))
        .filter(|e| u64::try_from(e.mtime.seconds()).map_or(true, |s| s >= stamp))
        .peekable();
    if racy.peek().is_none() {
        return true;
    }
    let Some(root) = repo.workdir().and_then(|w| crate::beneath::open_root(w).ok()) else {
        return false;
    };
    racy.all(|e| {
        let conflict = (e.flags >> 12) & 0x3 != 0;
        let blob = e.mode == u32::from(FileMode::Blob) || e.mode == u32::from(FileMode::BlobExecutable);
        let Ok(path) = std::str::from_utf8(&e.path) else {
            return false;
        };
        !conflict
            && blob
            && crate::beneath::read_regular(&root, Path::new(path), u64::from(e.file_size))
                .ok()
                .filter(|bytes| !filterable(bytes))
                .and_then(|bytes| Oid::hash_object(git2::ObjectType::Blob, &bytes).ok())
                .is_some_and(|id| id == e.id)
    })
}

/// Bytes one of git's own clean filters could change: line endings (`text`, `eol`,
/// `core.autocrlf`) or an `ident` keyword.
fn filterable(bytes: &[u8]) -> bool {
    bytes.contains(&b'\r') || bytes.windows(3).any(|w| w == b"$Id")
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
pub(super) fn index_path(repo: &Repository) -> Result<PathBuf, GitError> {
    Ok(repo
        .index()?
        .path()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| repo.path().join("index")))
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::tests::repo;

    #[test]
    fn bytes_a_clean_filter_could_change_are_left_to_libgit2() {
        assert!(filterable(b"a\r\nb"));
        assert!(filterable(b"x $Id$ y"));
        assert!(!filterable(b"plain\nlines\n"));
    }

    #[test]
    fn a_racy_entry_is_unchanged_only_while_its_file_holds_its_blob() {
        let (dir, repo) = repo();
        let file = dir.path().join("prompts/t.md");
        let racy_at = second_of_stamp(&file);
        let unchanged = || racy_entries_unchanged(&repo, &repo.index().unwrap(), racy_at, &[]);
        assert!(unchanged(), "the committed bytes are still there");
        // Same size, other bytes: libgit2 has to look (and mark it for git).
        std::fs::write(&file, "ho").unwrap();
        assert!(!unchanged());
        // Its bytes again, but through a second name, or as a link to them.
        std::fs::write(&file, "hi").unwrap();
        assert!(unchanged());
        std::fs::hard_link(&file, dir.path().join("second-name")).unwrap();
        assert!(!unchanged());
        std::fs::remove_file(dir.path().join("second-name")).unwrap();
        std::fs::write(dir.path().join("hi"), "hi").unwrap();
        std::fs::remove_file(&file).unwrap();
        std::os::unix::fs::symlink(dir.path().join("hi"), &file).unwrap();
        assert!(!unchanged());
        // Gone: changed. Unknown stamp: every entry is racy and left to libgit2.
        std::fs::remove_file(&file).unwrap();
        assert!(!unchanged());
        std::fs::write(&file, "hi").unwrap();
        assert!(!racy_entries_unchanged(&repo, &repo.index().unwrap(), None, &[]));
        // A path just added is not looked at, whatever its file holds.
        std::fs::write(&file, "ho").unwrap();
        assert!(racy_entries_unchanged(
            &repo,
            &repo.index().unwrap(),
            racy_at,
            &["prompts/t.md"]
        ));
        std::fs::write(&file, "hi").unwrap();
        // An index stamped after the entry's second has no racy entry: nothing is read.
        std::fs::remove_file(&file).unwrap();
        let later = racy_at.map(|s| s + 1);
        assert!(racy_entries_unchanged(&repo, &repo.index().unwrap(), later, &[]));
    }
}
