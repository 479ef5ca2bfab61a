//! The metadata manifest (issue 10, item 6): git tracks the content of builder-owned
//! files and their executable bit, nothing else, and Landlock does not stop `chmod`,
//! `chown` or `utime` on a file a process may read. So the runtime keeps, in
//! `.runtime/state.db` (where no tool can reach it), the last accepted mode and owner
//! of every builder-owned file and directory git tracks, and the content hash, mode and
//! owner of each hook in the hooks directory. Before a fire, after the dirty check
//! passed, the current state is compared with it: a difference refuses the fire like a
//! dirty builder path, and `builder audit` reports it.
//!
//! What is accepted without a word, so an engineer's intended change is never flagged
//! forever: a file whose blob or git mode changed since it was recorded (the change
//! came through a commit: its new mode and owner are recorded), a file that is new or
//! gone (git sees those), and hooks rewritten by `builder install-hooks`, which records
//! the hooks it leaves. Anything else (a mode or owner changed by hand) is accepted by
//! `builder audit --accept-metadata`. A repository without a manifest (a fresh clone's
//! first fire) records one and refuses nothing.

use crate::layout::{Ownership, BUILDER_DIRS};
use crate::sandbox::mask_walk::SETTLED;
use crate::state::StateDb;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The file type bits of `st_mode`.
const TYPE_BITS: u32 = 0o170_000;
/// The permission bits shown in a change (`mode 0644 -> 0666`).
const PERM_BITS: u32 = 0o7777;

/// Mode and owner of one builder-owned path, and what git has for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileMeta {
    /// `st_mode` (type and permission bits), not following a symlink.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// The index entry's blob id and git mode (`100644 <oid>`); `None` for a directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<String>,
}

/// One hook: its mode, owner and content hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookMeta {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// `sha256:<hex>` of the content (a symlinked hook: of what it points to; an
    /// unreadable one: empty).
    pub sha256: String,
    /// The regular file's identity and times as hashed, when its `ctime` was already
    /// [`SETTLED`] then: a later scan that finds them unchanged keeps the hash
    /// without reading the file again. Any write, rename or `chmod` sets `ctime` to
    /// the present, which no process can set back, so a settled one that still
    /// reads the same means the bytes hashed are the bytes there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unchanged_since: Option<FileStamp>,
}

/// What tells a file's content unchanged without reading it ([`HookMeta`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStamp {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
}

impl FileStamp {
    fn of(md: &std::fs::Metadata) -> FileStamp {
        FileStamp {
            dev: md.dev(),
            ino: md.ino(),
            size: md.size(),
            mtime: (md.mtime(), md.mtime_nsec()),
            ctime: (md.ctime(), md.ctime_nsec()),
        }
    }

    /// Whether `ctime` is [`SETTLED`] older than `now`.
    fn settled(&self, now: std::time::SystemTime) -> bool {
        let (Ok(secs), Ok(nanos)) = (u64::try_from(self.ctime.0), u32::try_from(self.ctime.1)) else {
            return false;
        };
        let ctime = std::time::UNIX_EPOCH + std::time::Duration::new(secs, nanos);
        now.duration_since(ctime).is_ok_and(|age| age > SETTLED)
    }
}

/// What one fire or audit saw: builder-owned paths (repo-relative) and hooks by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Where hooks run from (`core.hooksPath`, else the common directory's `hooks/`).
    pub hooks_dir: String,
    pub files: BTreeMap<String, FileMeta>,
    pub hooks: BTreeMap<String, HookMeta>,
}

/// What a difference concerns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "name")]
pub enum Subject {
    /// A builder-owned path (repo-relative).
    File(String),
    /// A hook, by name.
    Hook(String),
    /// The hooks directory itself moved (`core.hooksPath`).
    HooksDir,
}

/// One difference from the last accepted manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Change {
    pub subject: Subject,
    /// What changed, e.g. `mode 0644 -> 0666`, `owner 1000 -> 0`, `not executable`.
    pub what: String,
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.subject {
            Subject::File(path) => write!(f, "{path}: {}", self.what),
            Subject::Hook(name) => write!(f, "hook {name}: {}", self.what),
            Subject::HooksDir => write!(f, "hooks directory: {}", self.what),
        }
    }
}

/// Reading the work tree, git's index or the state database failed.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("reading git's index for the metadata manifest: {0}")]
    Git(#[from] git2::Error),
    #[error("the metadata manifest in the state database: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("the metadata manifest in the state database does not parse: {0}")]
    Parse(#[from] serde_json::Error),
    #[error("cannot open the repository root {0} for the metadata manifest: {1}")]
    Root(std::path::PathBuf, #[source] std::io::Error),
}

/// Scans the current metadata: every builder-owned path in git's index (and the
/// directories holding them, up to the builder directory), and the hooks directory.
/// A hook `known` holds with the same settled stamp keeps its hash unread
/// ([`HookMeta::unchanged_since`]).
pub fn scan(
    repo: &git2::Repository,
    root: &Path,
    ownership: &Ownership,
    known: Option<&Manifest>,
) -> Result<Manifest, ManifestError> {
    let mut index = repo.index()?;
    // As on disk now: a handle this process read before a commit of its own wrote
    // the index is stale (the commit does not swap it unless it must).
    index.read(false)?;
    let mut files = BTreeMap::new();
    // Each path is looked up from a descriptor of the root (one component walk less
    // than from `/`, a link on the last component not followed).
    let anchor = crate::beneath::open_root(root).map_err(|e| ManifestError::Root(root.to_path_buf(), e))?;
    let record = |rel: &str, git: Option<String>, files: &mut BTreeMap<String, FileMeta>| {
        if let Ok(st) = rustix::fs::statat(&anchor, rel, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
            files.insert(
                rel.to_string(),
                FileMeta {
                    mode: st.st_mode,
                    uid: st.st_uid,
                    gid: st.st_gid,
                    git,
                },
            );
        }
    };
    let entry = |e: git2::IndexEntry, files: &mut BTreeMap<String, FileMeta>| {
        let Ok(rel) = std::str::from_utf8(&e.path) else {
            return;
        };
        // The directories above the file, within builder-owned paths, once each.
        let mut end = rel.len();
        while let Some(slash) = rel[..end].rfind('/') {
            let dir = &rel[..slash];
            if files.contains_key(dir) || !ownership.touches_builder(dir) {
                break;
            }
            record(dir, None, files);
            end = slash;
        }
        record(rel, Some(format!("{:o} {}", e.mode, e.id)), files);
    };
    if ownership.has_extra_builder_paths() {
        for e in index.iter() {
            if std::str::from_utf8(&e.path)
                .is_ok_and(|p| ownership.classify_normalized(p) == crate::layout::Owner::Builder)
            {
                entry(e, &mut files);
            }
        }
    } else {
        for dir in BUILDER_DIRS.iter().filter(|d| **d != ".git") {
            let prefix = format!("{dir}/");
            let Ok(first) = index.find_prefix(prefix.as_str()) else {
                continue;
            };
            for i in first..index.len() {
                let Some(e) = index.get(i) else { break };
                if !e.path.starts_with(prefix.as_bytes()) {
                    break;
                }
                entry(e, &mut files);
            }
        }
    }
    for dir in BUILDER_DIRS.iter().filter(|d| **d != ".git") {
        if !files.contains_key(*dir) {
            record(dir, None, &mut files);
        }
    }
    let (hooks_dir, hooks) = hooks_of(repo, known);
    Ok(Manifest {
        hooks_dir,
        files,
        hooks,
    })
}

/// Where hooks run from, and each hook there ([`scan_hooks`]; the hashes `known`
/// holds count only for the same directory).
fn hooks_of(repo: &git2::Repository, known: Option<&Manifest>) -> (String, BTreeMap<String, HookMeta>) {
    let dir = crate::review::hooks::hooks_dir(repo);
    let name = dir.to_string_lossy().into_owned();
    let known = known.filter(|k| k.hooks_dir == name).map(|k| &k.hooks);
    let hooks = scan_hooks(&dir, known);
    (name, hooks)
}

/// Hooks larger than this are not read: their hash says so (a hook is a script).
const MAX_HOOK_BYTES: u64 = 1 << 20;

/// Each entry of the hooks directory (git runs `<dir>/<name>`; samples included, a
/// rename of `pre-push` to `pre-push.sample` is a removed hook). Only regular files
/// are read (a FIFO planted there must not hang the fire); a symlink is hashed by
/// where it points. A regular file `known` holds with the stamp it has now keeps
/// its hash.
fn scan_hooks(dir: &Path, known: Option<&BTreeMap<String, HookMeta>>) -> BTreeMap<String, HookMeta> {
    scan_hooks_at(dir, known, std::time::SystemTime::now())
}

/// [`scan_hooks`] as at `now`.
fn scan_hooks_at(
    dir: &Path,
    known: Option<&BTreeMap<String, HookMeta>>,
    now: std::time::SystemTime,
) -> BTreeMap<String, HookMeta> {
    let mut out = BTreeMap::new();
    let (Ok(entries), Ok(anchor)) = (std::fs::read_dir(dir), crate::beneath::open_root(dir)) else {
        return out;
    };
    for e in entries.flatten() {
        let Ok(md) = e.path().symlink_metadata() else {
            continue;
        };
        if md.is_dir() {
            continue;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        let hash = |bytes: &[u8]| format!("sha256:{}", hex::encode(Sha256::digest(bytes)));
        // Taken before the read: a write after it leaves a newer `ctime`.
        let stamp = FileStamp::of(&md);
        let unchanged_since = (md.is_file() && stamp.settled(now)).then_some(stamp);
        let kept = known
            .and_then(|k| k.get(&name))
            .filter(|k| unchanged_since.is_some() && k.unchanged_since == unchanged_since);
        let sha256 = if let Some(kept) = kept {
            kept.sha256.clone()
        } else if md.is_symlink() {
            std::fs::read_link(e.path())
                .map(|to| hash(format!("symlink:{}", to.display()).as_bytes()))
                .unwrap_or_default()
        } else if md.is_file() {
            match crate::beneath::read_regular(&anchor, Path::new(&e.file_name()), MAX_HOOK_BYTES) {
                Ok(bytes) => hash(&bytes),
                Err(why) => hash(format!("{why} {}", md.len()).as_bytes()),
            }
        } else {
            String::new()
        };
        out.insert(
            name,
            HookMeta {
                mode: md.mode(),
                uid: md.uid(),
                gid: md.gid(),
                sha256,
                unchanged_since,
            },
        );
    }
    out
}

fn type_name(mode: u32) -> &'static str {
    match mode & TYPE_BITS {
        0o100_000 => "file",
        0o040_000 => "directory",
        0o120_000 => "symlink",
        0o010_000 => "fifo",
        0o140_000 => "socket",
        0o020_000 => "character device",
        0o060_000 => "block device",
        _ => "unknown",
    }
}

/// The mode and owner differences of one path: `mode 0644 -> 0666; owner 1000 -> 0`.
fn meta_changes(was: (u32, u32, u32), now: (u32, u32, u32)) -> Vec<String> {
    let mut out = Vec::new();
    if was.0 & TYPE_BITS != now.0 & TYPE_BITS {
        out.push(format!("type {} -> {}", type_name(was.0), type_name(now.0)));
    } else if was.0 & PERM_BITS != now.0 & PERM_BITS {
        out.push(format!("mode {:04o} -> {:04o}", was.0 & PERM_BITS, now.0 & PERM_BITS));
    }
    if was.1 != now.1 {
        out.push(format!("owner {} -> {}", was.1, now.1));
    }
    if was.2 != now.2 {
        out.push(format!("group {} -> {}", was.2, now.2));
    }
    out
}

impl Manifest {
    /// What changed since `last` that no commit explains (see the module comment):
    /// sorted by path, hooks after files.
    pub fn changes_since(&self, last: &Manifest) -> Vec<Change> {
        let mut out = Vec::new();
        for (path, now) in &self.files {
            let Some(was) = last.files.get(path) else { continue };
            if was.git != now.git {
                continue;
            }
            let what = meta_changes((was.mode, was.uid, was.gid), (now.mode, now.uid, now.gid));
            if !what.is_empty() {
                out.push(Change {
                    subject: Subject::File(path.clone()),
                    what: what.join("; "),
                });
            }
        }
        if self.hooks_dir != last.hooks_dir {
            out.push(Change {
                subject: Subject::HooksDir,
                what: format!("{} -> {}", last.hooks_dir, self.hooks_dir),
            });
            return out;
        }
        let names: std::collections::BTreeSet<&String> = last.hooks.keys().chain(self.hooks.keys()).collect();
        for name in names {
            let what = match (last.hooks.get(name), self.hooks.get(name)) {
                (Some(_), None) => vec!["removed".to_string()],
                (None, Some(_)) => vec!["added".to_string()],
                (Some(was), Some(now)) => {
                    let mut what = Vec::new();
                    if was.sha256 != now.sha256 {
                        what.push("content changed".to_string());
                    }
                    let exec = |m: u32| m & 0o111 != 0;
                    if exec(was.mode) && !exec(now.mode) && was.mode & TYPE_BITS == now.mode & TYPE_BITS {
                        what.push("not executable".to_string());
                        what.extend(meta_changes((was.mode, was.uid, was.gid), (was.mode, now.uid, now.gid)));
                    } else {
                        what.extend(meta_changes((was.mode, was.uid, was.gid), (now.mode, now.uid, now.gid)));
                    }
                    what
                }
                (None, None) => Vec::new(),
            };
            if !what.is_empty() {
                out.push(Change {
                    subject: Subject::Hook(name.clone()),
                    what: what.join("; "),
                });
            }
        }
        out
    }
}

/// The last accepted manifest in the state database, if one was recorded.
pub fn load(db: &StateDb) -> Result<Option<Manifest>, ManifestError> {
    match db.metadata_manifest()? {
        Some(text) => Ok(Some(serde_json::from_str(&text)?)),
        None => Ok(None),
    }
}

/// Records `manifest` as the accepted state (nothing is written when it is the one
/// already recorded).
pub fn save(db: &mut StateDb, manifest: &Manifest, last: Option<&Manifest>) -> Result<(), ManifestError> {
    if last == Some(manifest) {
        return Ok(());
    }
    db.save_metadata_manifest(&serde_json::to_string(manifest)?, chrono::Utc::now())?;
    Ok(())
}

/// The check before a fire: compares the current state with the last accepted
/// manifest and returns it with the differences. With none, the current state becomes
/// the accepted one (also when there was no manifest yet); with some, nothing is
/// written, so every later fire refuses too until the engineer puts things back or
/// accepts them.
pub fn check_and_record(
    repo: &git2::Repository,
    root: &Path,
    ownership: &Ownership,
    db: &mut StateDb,
    record: bool,
) -> Result<(Manifest, Vec<Change>), ManifestError> {
    let last = load(db)?;
    let now = scan(repo, root, ownership, last.as_ref())?;
    let changes = last.as_ref().map(|l| now.changes_since(l)).unwrap_or_default();
    if changes.is_empty() && record {
        // Not recorded (a full disk, a read-only database): the next fire compares
        // with the older manifest, which is still what was last accepted.
        if let Err(e) = save(db, &now, last.as_ref()) {
            tracing::warn!(error = %e, "the metadata manifest was not recorded");
        }
    }
    Ok((now, changes))
}

/// After `builder install-hooks`: the hooks it wrote (`names`) become the accepted
/// ones, with the hooks directory; every other entry stays as it was (a chmod of a
/// prompt or another hook made meanwhile is still seen). Does nothing where no
/// manifest was recorded yet (the first fire records one).
pub fn accept_hooks(
    repo: &git2::Repository,
    root: &Path,
    ownership: &Ownership,
    names: &[&str],
) -> Result<bool, ManifestError> {
    if !crate::state::db_path(root).is_file() {
        return Ok(false);
    }
    let mut db = StateDb::open(root)?;
    let Some(mut last) = load(&db)? else {
        return Ok(false);
    };
    let now = scan(repo, root, ownership, None)?;
    let before = last.clone();
    if last.hooks_dir != now.hooks_dir {
        // Another directory: every hook in it is new; what it holds is what runs now.
        last.hooks.clear();
    }
    last.hooks_dir = now.hooks_dir;
    for name in names {
        match now.hooks.get(*name) {
            Some(hook) => last.hooks.insert((*name).to_string(), hook.clone()),
            None => last.hooks.remove(*name),
        };
    }
    save(&mut db, &last, Some(&before))?;
    Ok(true)
}

/// `builder audit`: the differences between the work tree and the last accepted
/// manifest, without recording anything (none where no fire recorded one yet). The
/// state database is not created when missing.
pub fn work_tree_changes(
    repo: &git2::Repository,
    root: &Path,
    ownership: &Ownership,
) -> Result<Vec<Change>, ManifestError> {
    if !crate::state::db_path(root).is_file() {
        return Ok(Vec::new());
    }
    let db = StateDb::open_for_reading(root)?;
    let Some(last) = load(&db)? else {
        return Ok(Vec::new());
    };
    Ok(scan(repo, root, ownership, None)?.changes_since(&last))
}

/// `builder audit --accept-metadata`: the current state becomes the accepted one;
/// returns what it accepted (the differences from the last manifest).
pub fn accept(repo: &git2::Repository, root: &Path, ownership: &Ownership) -> Result<Vec<Change>, ManifestError> {
    let mut db = StateDb::open(root)?;
    let last = load(&db)?;
    let now = scan(repo, root, ownership, None)?;
    let changes = last.as_ref().map(|l| now.changes_since(l)).unwrap_or_default();
    save(&mut db, &now, last.as_ref())?;
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn repo_with_scaffold() -> (tempfile::TempDir, git2::Repository) {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init(dir.path()).unwrap();
        for (p, text) in [("prompts/a.md", "a"), ("prompts/sub/b.md", "b"), ("reports/r.md", "r")] {
            let path = dir.path().join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        std::fs::write(dir.path().join(".git/hooks/pre-push"), "#!/bin/sh\nbuilder audit\n").unwrap();
        std::fs::set_permissions(dir.path().join(".git/hooks/pre-push"), PermissionsExt::from_mode(0o755)).unwrap();
        let mut index = repo.index().unwrap();
        index.add_all(["*"], git2::IndexAddOption::DEFAULT, None).unwrap();
        index.write().unwrap();
        (dir, repo)
    }

    #[test]
    fn a_chmod_is_named_with_both_modes_and_a_commit_is_accepted() {
        let (dir, repo) = repo_with_scaffold();
        let own = Ownership::new(dir.path());
        let first = scan(&repo, dir.path(), &own, None).unwrap();
        assert!(first.files.contains_key("prompts/sub/b.md"), "{first:?}");
        assert!(first.files.contains_key("prompts/sub"), "its directory too");
        assert!(
            !first.files.contains_key("reports/r.md"),
            "runtime paths are not builder-owned"
        );
        let file = dir.path().join("prompts/a.md");
        std::fs::set_permissions(&file, PermissionsExt::from_mode(0o666)).unwrap();
        let now = scan(&repo, dir.path(), &own, None).unwrap();
        let changes: Vec<String> = now.changes_since(&first).iter().map(ToString::to_string).collect();
        let was = first.files["prompts/a.md"].mode & PERM_BITS;
        assert_eq!(changes, [format!("prompts/a.md: mode {was:04o} -> 0666")]);
        // The same file staged with new content: the change came with its content.
        std::fs::write(&file, "a, edited").unwrap();
        let mut index = repo.index().unwrap();
        index.add_path(Path::new("prompts/a.md")).unwrap();
        index.write().unwrap();
        let now = scan(&repo, dir.path(), &own, None).unwrap();
        assert!(now.changes_since(&first).is_empty(), "{:?}", now.changes_since(&first));
    }

    #[test]
    fn a_hook_made_non_executable_or_rewritten_is_named() {
        let (dir, repo) = repo_with_scaffold();
        let own = Ownership::new(dir.path());
        let first = scan(&repo, dir.path(), &own, None).unwrap();
        let hook = dir.path().join(".git/hooks/pre-push");
        std::fs::set_permissions(&hook, PermissionsExt::from_mode(0o644)).unwrap();
        let now = scan(&repo, dir.path(), &own, None).unwrap();
        let said: Vec<String> = now.changes_since(&first).iter().map(ToString::to_string).collect();
        assert_eq!(said, ["hook pre-push: not executable"]);
        std::fs::write(&hook, "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::write(dir.path().join(".git/hooks/post-checkout"), "x").unwrap();
        let now = scan(&repo, dir.path(), &own, None).unwrap();
        let said: Vec<String> = now.changes_since(&first).iter().map(ToString::to_string).collect();
        assert!(said.contains(&"hook post-checkout: added".to_string()), "{said:?}");
        assert!(
            said.contains(&"hook pre-push: content changed; not executable".to_string()),
            "{said:?}"
        );
    }

    #[test]
    fn the_first_check_records_and_a_refused_one_does_not() {
        let (dir, repo) = repo_with_scaffold();
        let own = Ownership::new(dir.path());
        let mut db = StateDb::open(dir.path()).unwrap();
        assert!(check_and_record(&repo, dir.path(), &own, &mut db, true)
            .unwrap()
            .1
            .is_empty());
        assert!(load(&db).unwrap().is_some(), "the first check recorded a manifest");
        std::fs::set_permissions(dir.path().join("prompts/sub"), PermissionsExt::from_mode(0o777)).unwrap();
        let (_, changes) = check_and_record(&repo, dir.path(), &own, &mut db, true).unwrap();
        assert_eq!(changes.len(), 1, "{changes:?}");
        let (_, again) = check_and_record(&repo, dir.path(), &own, &mut db, true).unwrap();
        assert_eq!(again, changes, "a refused state is not recorded: it stays a difference");
    }

    #[test]
    fn a_settled_hook_keeps_its_hash_until_its_file_changes() {
        let dir = tempfile::tempdir().unwrap();
        let hook = dir.path().join("pre-commit");
        std::fs::write(&hook, "#!/bin/sh\nexit 0\n").unwrap();
        let now = std::time::SystemTime::now;
        // Just written: not settled, so nothing is kept and every scan reads it.
        let fresh = scan_hooks_at(dir.path(), None, now());
        assert_eq!(fresh["pre-commit"].unchanged_since, None);
        // As seen later, once settled: its stamp is recorded.
        let later = || now() + SETTLED * 2;
        let first = scan_hooks_at(dir.path(), None, later());
        assert!(first["pre-commit"].unchanged_since.is_some());
        // A known hash with the same stamp is kept unread (a forged one shows it).
        let mut known = first.clone();
        known.get_mut("pre-commit").unwrap().sha256 = "sha256:kept".into();
        assert_eq!(
            scan_hooks_at(dir.path(), Some(&known), later())["pre-commit"].sha256,
            "sha256:kept"
        );
        // Rewritten with the same length: its ctime moved, so it is read again.
        std::fs::write(&hook, "#!/bin/sh\nexit 1\n").unwrap();
        let again = scan_hooks_at(dir.path(), Some(&known), later());
        assert_ne!(again["pre-commit"].sha256, "sha256:kept");
        assert_ne!(again["pre-commit"].sha256, first["pre-commit"].sha256);
        // A chmod moves it too.
        let known = again.clone();
        let mut forged = known.clone();
        forged.get_mut("pre-commit").unwrap().sha256 = "sha256:kept".into();
        std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        assert_eq!(
            scan_hooks_at(dir.path(), Some(&forged), later())["pre-commit"].sha256,
            known["pre-commit"].sha256
        );
    }
}
