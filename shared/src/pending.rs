//! Records a fire could not commit, kept in git itself until a later commit takes
//! them in. A commit can be blocked (a person's git holds the index lock, a rebase or
//! merge is in progress, HEAD is detached, a disk is full) and the records must
//! survive that with the bytes the runtime wrote, whatever happens to the work tree
//! meanwhile: a later fire's model may edit an uncommitted report under `reports/`, a
//! person's `git clean` or `git stash -u` may remove the files, and a full disk may
//! have kept some from being written at all. So the runtime writes their blobs into
//! the object database and names them with a ref, `refs/runtime/pending/<run-id>`,
//! pointing at a parentless commit whose tree holds the records at their paths (a ref
//! keeps the objects from `git gc`; the objects live under `.git`, not `.runtime`,
//! which may be the full disk). The next commit of any fire writes back each file the
//! work tree lacks or holds other bytes in, through [`crate::beneath`] (never through
//! a link), commits the kept bytes, and then drops the ref. Nothing here takes a lock
//! or touches the index: a pending ref never stands in the way of a person's git.

use git2::{Oid, Repository};
use std::path::Path;

/// Where pending records are named.
pub const PENDING_NAMESPACE: &str = "refs/runtime/pending/";

/// Why pending records could not be kept or read.
#[derive(Debug, thiserror::Error)]
pub enum PendingError {
    #[error("keeping records in git's object database: {0}")]
    Git(#[from] git2::Error),
    #[error("`{label}` cannot name a pending ref")]
    BadLabel { label: String },
}

/// One set of records kept for a later commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingSet {
    /// The ref that keeps them (`refs/runtime/pending/<label>`).
    pub reference: String,
    /// Each record's repo-relative path and blob.
    pub files: Vec<(String, Oid)>,
}

/// Keeps `files` (repo-relative paths and the bytes their writer held) under
/// `refs/runtime/pending/<label>` (with `-2`, `-3`, ... when taken). Returns the ref.
pub fn keep(
    repo: &Repository,
    label: &str,
    files: &[(String, Vec<u8>)],
    identity: (&str, &str),
) -> Result<String, PendingError> {
    if label.is_empty()
        || !label
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
    {
        return Err(PendingError::BadLabel { label: label.into() });
    }
    let empty = repo.find_tree(repo.treebuilder(None)?.write()?)?;
    let mut update = git2::build::TreeUpdateBuilder::new();
    for (path, bytes) in files {
        update.upsert(path.as_str(), repo.blob(bytes)?, git2::FileMode::Blob);
    }
    let tree = repo.find_tree(update.create_updated(repo, &empty)?)?;
    let sig = git2::Signature::now(identity.0, identity.1)?;
    let message = format!(
        "runtime: records of {label} left for a later commit\n\nThis commit is on no branch: the next fire's commit takes its files in and drops {PENDING_NAMESPACE}{label}.\n"
    );
    let commit = repo.commit(None, &sig, &sig, &message, &tree, &[])?;
    let mut n = 1;
    loop {
        let name = match n {
            1 => format!("{PENDING_NAMESPACE}{label}"),
            _ => format!("{PENDING_NAMESPACE}{label}-{n}"),
        };
        match repo.reference(&name, commit, false, "runtime: records left for a later commit") {
            Ok(_) => return Ok(name),
            Err(e) if e.code() == git2::ErrorCode::Exists && n < 100 => n += 1,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Every set of pending records, oldest ref name first. A ref that does not point at
/// a commit with a readable tree is skipped (and logged): it is none of ours.
pub fn list(repo: &Repository) -> Result<Vec<PendingSet>, PendingError> {
    let mut out = Vec::new();
    for r in repo.references_glob(&format!("{PENDING_NAMESPACE}*"))? {
        let r = r?;
        let Ok(name) = r.name().map(str::to_string) else {
            continue;
        };
        let tree = match r.peel_to_commit().and_then(|c| c.tree()) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(reference = %name, error = %e, "a pending ref that names no records is left alone");
                continue;
            }
        };
        let mut files = Vec::new();
        tree.walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
            if entry.kind() == Some(git2::ObjectType::Blob) {
                if let Ok(n) = entry.name() {
                    files.push((format!("{dir}{n}"), entry.id()));
                }
            }
            git2::TreeWalkResult::Ok
        })?;
        out.push(PendingSet { reference: name, files });
    }
    out.sort_by(|a, b| a.reference.cmp(&b.reference));
    Ok(out)
}

/// The blob of `rel` kept by a pending ref, if any: a record that is neither committed
/// nor lost (recovery leaves it and its run alone).
pub fn blob_of(repo: &Repository, rel: &str) -> Option<Oid> {
    list(repo)
        .ok()?
        .into_iter()
        .find_map(|s| s.files.into_iter().find(|(p, _)| p == rel).map(|(_, b)| b))
}

/// Drops the pending ref `reference` (its records are committed).
pub fn drop_set(repo: &Repository, reference: &str) {
    match repo.find_reference(reference).and_then(|mut r| r.delete()) {
        Ok(()) => {}
        Err(e) if e.code() == git2::ErrorCode::NotFound => {}
        Err(e) => tracing::warn!(reference, error = %e, "a pending ref whose records are committed was not dropped"),
    }
}

/// What [`restore`] found in the work tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restored {
    /// The file held these bytes already.
    Same,
    /// It was missing and is written now.
    Written,
    /// It held other bytes (or was a link, a FIFO, a hard link): replaced.
    Replaced,
}

/// Makes the work tree hold `bytes` at `rel` (under `root`), created through no link
/// (see [`crate::beneath`]): a record's file as its writer held it, so the work tree
/// matches the commit that takes it in.
pub fn restore(root: &Path, rel: &str, bytes: &[u8]) -> std::io::Result<Restored> {
    let dir = crate::beneath::open_root(root)?;
    let path = Path::new(rel);
    let cap = bytes.len() as u64;
    let found = match crate::beneath::read_regular(&dir, path, cap) {
        Ok(b) if b == bytes => return Ok(Restored::Same),
        Ok(_) | Err(crate::beneath::NotRegular::TooLarge(_)) | Err(crate::beneath::NotRegular::HardLink(_)) => true,
        Err(crate::beneath::NotRegular::Special(kind)) => kind != "directory",
        Err(crate::beneath::NotRegular::Io(_)) => std::fs::symlink_metadata(root.join(rel)).is_ok(),
    };
    if found {
        crate::beneath::remove_file(&dir, path)?;
    }
    crate::beneath::create_new(&dir, path, bytes)?;
    Ok(if found { Restored::Replaced } else { Restored::Written })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> (tempfile::TempDir, Repository) {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        (dir, repo)
    }

    #[test]
    fn kept_records_are_listed_with_their_blobs_until_dropped() {
        let (_dir, repo) = repo();
        let files = vec![
            ("runs/t/2026-01-01/r1.json".to_string(), b"{}".to_vec()),
            ("reports/t/2026-01-01/r1.md".to_string(), b"report".to_vec()),
        ];
        let name = keep(&repo, "r1", &files, ("runtime", "runtime@localhost")).unwrap();
        assert_eq!(name, "refs/runtime/pending/r1");
        let again = keep(&repo, "r1", &files[..1], ("runtime", "runtime@localhost")).unwrap();
        assert_eq!(again, "refs/runtime/pending/r1-2");
        let sets = list(&repo).unwrap();
        assert_eq!(sets.len(), 2);
        let blob = blob_of(&repo, "reports/t/2026-01-01/r1.md").unwrap();
        assert_eq!(repo.find_blob(blob).unwrap().content(), b"report");
        drop_set(&repo, &name);
        drop_set(&repo, &again);
        assert!(list(&repo).unwrap().is_empty());
        assert!(blob_of(&repo, "reports/t/2026-01-01/r1.md").is_none());
        assert!(keep(&repo, "../x", &files, ("r", "r@x")).is_err());
    }

    #[test]
    fn restore_writes_missing_files_and_replaces_changed_ones_through_no_link() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        assert_eq!(restore(root, "reports/t/r.md", b"kept").unwrap(), Restored::Written);
        assert_eq!(restore(root, "reports/t/r.md", b"kept").unwrap(), Restored::Same);
        std::fs::write(root.join("reports/t/r.md"), "edited by a model").unwrap();
        assert_eq!(restore(root, "reports/t/r.md", b"kept").unwrap(), Restored::Replaced);
        assert_eq!(std::fs::read(root.join("reports/t/r.md")).unwrap(), b"kept");
        let outside = tempfile::tempdir().unwrap();
        std::fs::remove_file(root.join("reports/t/r.md")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("x"), root.join("reports/t/r.md")).unwrap();
        assert_eq!(restore(root, "reports/t/r.md", b"kept").unwrap(), Restored::Replaced);
        assert!(!outside.path().join("x").exists(), "nothing written through the link");
        assert_eq!(std::fs::read(root.join("reports/t/r.md")).unwrap(), b"kept");
    }
}
