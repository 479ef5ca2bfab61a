//! What tools see of `/etc`, and the snapshot that makes it one mount. The small
//! entries of [`ETC_ENTRIES`] are copied into the new root, the large ones bound;
//! copying some forty files into every worker's root cost about 1.5 ms of its start
//! (reading them on the host, writing them into the tmpfs). So the copy is kept as a
//! snapshot in the state directory (`.runtime/sandbox-etc/<stamp>`), made by the
//! worker before it enters its namespaces and bound read-only at `/etc`, for as long
//! as every entry keeps its stamp (device, inode, kind, mode, size, modification and
//! change times, a link's target). The walk that takes the stamps reads no file.
//!
//! A snapshot is made only when no entry changed in the last [`SETTLE`]: a change
//! within the file system's time granularity could keep an entry's stamp. Until
//! then, and wherever a snapshot cannot be made or cloned, the entries are copied
//! into the root as before. Snapshots not used for a day are removed when a new
//! one is made; one in use is never removed sooner, so a worker that bound it keeps
//! its files.

use super::rootfs::{SystemEntry, ETC_ENTRIES};
use std::hash::{Hash, Hasher};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// `/etc` files up to this size are copied into the new root rather than bound.
const COPY_MAX: u64 = 256 * 1024;
/// `/etc` directories of at most this many entries (files up to [`COPY_MAX`], links,
/// directories) are copied rather than bound; larger ones (`alternatives`,
/// `ssl/certs`) are bound.
const COPY_MAX_ENTRIES: usize = 64;
/// How long every entry must have been unchanged before a snapshot is made of it.
const SETTLE: Duration = Duration::from_secs(2);
/// How long an unused snapshot is kept.
const KEEP_UNUSED: Duration = Duration::from_secs(24 * 3600);
/// The snapshots' directory, under the state directory.
pub(super) const SNAPSHOTS_DIR: &str = "sandbox-etc";
/// Changes whenever the snapshot's layout changes, so an old one is not taken.
const LAYOUT_VERSION: u32 = 1;

/// One entry of the new root's `/etc`, as found on the host.
#[derive(Debug, Clone, PartialEq)]
enum EtcItem {
    /// A directory of a small tree, made with its entries after it.
    Dir {
        path: PathBuf,
        mode: u32,
    },
    /// A small regular file, copied.
    File {
        path: PathBuf,
        mode: u32,
    },
    Link {
        path: PathBuf,
        target: PathBuf,
    },
    /// A large file or tree, bound from the host (`dir`: a directory).
    Bound {
        path: PathBuf,
        dir: bool,
    },
}

/// The new root's `/etc`: its entries and, when there is one, their snapshot.
#[derive(Debug, Default)]
pub struct EtcView {
    items: Vec<EtcItem>,
    snapshot: Option<PathBuf>,
}

impl EtcView {
    /// Walks the host's entries (reading no file) and finds their snapshot under
    /// `state`, or makes it when they are settled. Run before the namespaces, as the
    /// runtime's user: the snapshot is written into the state directory.
    pub fn prepare(state: &Path) -> EtcView {
        let (items, stamp, settled) = walk(Path::new("/etc"));
        let dir = state.join(SNAPSHOTS_DIR);
        let snapshot = dir.join(format!("{stamp:016x}"));
        let found = !linked(&dir)
            && (snapshot.symlink_metadata().is_ok_and(|m| m.is_dir())
                || (settled && make_snapshot(&items, Path::new("/etc"), &dir, &snapshot).is_ok()));
        EtcView {
            items,
            snapshot: found.then_some(snapshot),
        }
    }

    /// The snapshot's directory, if there is one.
    pub fn snapshot(&self) -> Option<&Path> {
        self.snapshot.as_deref()
    }

    /// The system entries of `/etc`: with `snapshot` (the snapshot's directory,
    /// cloned), it bound at `/etc` and the large entries bound over it; else the
    /// small entries copied, read now (what this process cannot read is left out:
    /// tools could not read it either). `bind` clones a host entry.
    pub(super) fn entries(
        &self,
        snapshot: Option<std::os::fd::OwnedFd>,
        bind: &mut dyn FnMut(&Path, &mut Vec<SystemEntry>) -> std::io::Result<()>,
    ) -> std::io::Result<Vec<SystemEntry>> {
        let mut out = Vec::new();
        if let Some(tree) = snapshot {
            out.push(SystemEntry::Mount {
                path: PathBuf::from("/etc"),
                tree,
                dir: true,
            });
            for item in &self.items {
                if let EtcItem::Bound { path, .. } = item {
                    bind(path, &mut out)?;
                }
            }
            return Ok(out);
        }
        for item in &self.items {
            match item {
                EtcItem::Dir { path, mode } => out.push(SystemEntry::Dir {
                    path: path.clone(),
                    mode: *mode,
                }),
                EtcItem::File { path, mode } => {
                    if let Ok(bytes) = std::fs::read(path) {
                        out.push(SystemEntry::Copy {
                            path: path.clone(),
                            bytes,
                            mode: *mode,
                        });
                    }
                }
                EtcItem::Link { path, target } => out.push(SystemEntry::Link {
                    path: path.clone(),
                    target: target.clone(),
                }),
                EtcItem::Bound { path, .. } => bind(path, &mut out)?,
            }
        }
        Ok(out)
    }
}

/// [`ETC_ENTRIES`] with the `*` names expanded against the host's `/etc`.
fn etc_names(etc: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let listing: Vec<String> = std::fs::read_dir(etc)
        .map(|d| d.flatten().filter_map(|e| e.file_name().into_string().ok()).collect())
        .unwrap_or_default();
    for name in ETC_ENTRIES {
        match name.strip_suffix('*') {
            Some(prefix) => out.extend(listing.iter().filter(|e| e.starts_with(prefix)).cloned()),
            None => out.push(name.to_string()),
        }
    }
    out
}

/// The entries of [`ETC_ENTRIES`] under `etc`, the stamp of them all, and whether
/// every one is older than [`SETTLE`].
fn walk(etc: &Path) -> (Vec<EtcItem>, u64, bool) {
    let mut stamps = std::hash::DefaultHasher::new();
    LAYOUT_VERSION.hash(&mut stamps);
    let settled_before = SystemTime::now() - SETTLE;
    let mut settled = true;
    let mut stamp = |path: &Path, md: &std::fs::Metadata| {
        path.hash(&mut stamps);
        (md.dev(), md.ino(), md.mode(), md.size()).hash(&mut stamps);
        (md.mtime(), md.mtime_nsec(), md.ctime(), md.ctime_nsec()).hash(&mut stamps);
        let changed = std::time::UNIX_EPOCH + Duration::new(md.mtime().max(md.ctime()).max(0) as u64, 0);
        settled &= changed + Duration::from_secs(1) <= settled_before;
    };
    let mut items = Vec::new();
    for name in etc_names(etc) {
        let path = etc.join(name);
        let Ok(md) = path.symlink_metadata() else { continue };
        stamp(&path, &md);
        let t = md.file_type();
        if t.is_symlink() {
            if let Ok(target) = std::fs::read_link(&path) {
                items.push(EtcItem::Link { path, target });
            }
        } else if t.is_file() {
            items.push(if md.len() > COPY_MAX {
                EtcItem::Bound { path, dir: false }
            } else {
                EtcItem::File {
                    path,
                    mode: md.mode() & 0o777,
                }
            });
        } else if t.is_dir() {
            match small_tree(&path, &mut stamp) {
                Some(tree) => {
                    items.push(EtcItem::Dir {
                        path,
                        mode: md.mode() & 0o777,
                    });
                    items.extend(tree);
                }
                None => items.push(EtcItem::Bound { path, dir: true }),
            }
        }
    }
    for item in &items {
        if let EtcItem::Link { target, .. } = item {
            target.hash(&mut stamps);
        }
    }
    (items, stamps.finish(), settled)
}

/// The entries of the directory `path` (a tree within [`COPY_MAX_ENTRIES`] whose
/// files are within [`COPY_MAX`]), parents first, each stamped; `None` when it is
/// to be bound.
fn small_tree(path: &Path, stamp: &mut dyn FnMut(&Path, &std::fs::Metadata)) -> Option<Vec<EtcItem>> {
    // The names first (a large tree is given up on before anything is looked at).
    let mut found: Vec<(PathBuf, std::fs::FileType)> = Vec::new();
    let mut stack = vec![path.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(listing) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in listing.flatten() {
            if found.len() >= COPY_MAX_ENTRIES {
                return None;
            }
            let Ok(t) = e.file_type() else { continue };
            if t.is_dir() {
                stack.push(e.path());
            }
            found.push((e.path(), t));
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::new();
    for (p, t) in found {
        let Ok(md) = p.symlink_metadata() else { continue };
        stamp(&p, &md);
        if t.is_symlink() {
            out.push(EtcItem::Link {
                target: std::fs::read_link(&p).ok()?,
                path: p,
            });
        } else if t.is_dir() {
            out.push(EtcItem::Dir {
                path: p,
                mode: md.mode() & 0o777,
            });
        } else if t.is_file() && md.len() > COPY_MAX {
            return None;
        } else if t.is_file() {
            out.push(EtcItem::File {
                path: p,
                mode: md.mode() & 0o777,
            });
        }
    }
    Some(out)
}

/// Whether the snapshots' directory `dir`, or the state directory it is in, is a link:
/// then no snapshot is taken, made or cleaned up there, since the clean-up of unused
/// snapshots removes what it finds (helper-115: a branch's `.runtime/sandbox-etc`
/// linked to `../..` had the person's directories removed).
fn linked(dir: &Path) -> bool {
    [Some(dir), dir.parent()]
        .into_iter()
        .flatten()
        .any(|p| p.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink()))
}

/// Writes the snapshot of `items` as `snapshot` (in `dir`): made under a temporary
/// name and renamed, so a worker never binds half of one; another worker's rename
/// first is as good. Files this process cannot read are left out; the large
/// entries get an empty file or directory to be bound over. Then snapshots unused
/// for [`KEEP_UNUSED`] are removed.
fn make_snapshot(items: &[EtcItem], etc: &Path, dir: &Path, snapshot: &Path) -> std::io::Result<()> {
    if linked(dir) {
        return Err(std::io::Error::other(format!(
            "{} is reached through a link",
            dir.display()
        )));
    }
    std::fs::DirBuilder::new().recursive(true).mode(0o755).create(dir)?;
    let temp = dir.join(format!(".new-{:016x}", rand::random::<u64>()));
    std::fs::DirBuilder::new().mode(0o755).create(&temp)?;
    let written = write_items(items, etc, &temp).and_then(|()| {
        std::fs::set_permissions(&temp, PermissionsExt::from_mode(0o755))?;
        std::fs::rename(&temp, snapshot)
    });
    if written.is_err() {
        let _ = std::fs::remove_dir_all(&temp);
        // Another worker's rename came first.
        if snapshot.symlink_metadata().is_ok_and(|m| m.is_dir()) {
            return Ok(());
        }
        return written;
    }
    remove_unused(dir, snapshot);
    Ok(())
}

/// Writes `items` (paths under `etc`) under `to`.
fn write_items(items: &[EtcItem], etc: &Path, to: &Path) -> std::io::Result<()> {
    let at = |path: &Path| {
        path.strip_prefix(etc)
            .map(|rel| to.join(rel))
            .map_err(|_| std::io::Error::other(format!("{} is not under {}", path.display(), etc.display())))
    };
    for item in items {
        match item {
            EtcItem::Dir { path, mode } => {
                let d = at(path)?;
                std::fs::create_dir_all(&d)?;
                std::fs::set_permissions(&d, PermissionsExt::from_mode(mode | 0o700))?;
            }
            EtcItem::File { path, mode } => {
                let Ok(bytes) = std::fs::read(path) else { continue };
                let f = at(path)?;
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(*mode)
                    .open(&f)?;
                std::io::Write::write_all(&mut file, &bytes)?;
                file.set_permissions(PermissionsExt::from_mode(*mode))?;
            }
            EtcItem::Link { path, target } => std::os::unix::fs::symlink(target, at(path)?)?,
            EtcItem::Bound { path, dir: true } => std::fs::create_dir_all(at(path)?)?,
            EtcItem::Bound { path, dir: false } => {
                let f = at(path)?;
                if let Some(parent) = f.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::File::create(f)?;
            }
        }
    }
    Ok(())
}

/// Removes the snapshots in `dir` other than `keep` (and temporary ones a killed
/// worker left) not modified for [`KEEP_UNUSED`]. A snapshot is touched each time a
/// worker takes it, see [`touch`].
fn remove_unused(dir: &Path, keep: &Path) {
    let Ok(listing) = std::fs::read_dir(dir) else { return };
    let old = SystemTime::now() - KEEP_UNUSED;
    for e in listing.flatten() {
        let p = e.path();
        if p == keep {
            continue;
        }
        if e.metadata().and_then(|m| m.modified()).is_ok_and(|t| t < old) {
            let _ = std::fs::remove_dir_all(&p);
        }
    }
}

/// Marks `snapshot` as used now, at most once an hour (its modification time), so
/// [`remove_unused`] keeps it.
pub(super) fn touch(snapshot: &Path) {
    let now = SystemTime::now();
    let stale = std::fs::metadata(snapshot)
        .and_then(|m| m.modified())
        .map_or(true, |t| t + Duration::from_secs(3600) < now);
    if stale {
        let _ = std::fs::File::open(snapshot).and_then(|d| d.set_modified(now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake_etc() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        let etc = d.path();
        std::fs::write(etc.join("passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
        std::fs::write(etc.join("hosts"), "127.0.0.1 localhost\n").unwrap();
        std::fs::create_dir(etc.join("ld.so.conf.d")).unwrap();
        std::fs::write(etc.join("ld.so.conf.d/x.conf"), "/opt/x\n").unwrap();
        std::os::unix::fs::symlink("/proc/self/mounts", etc.join("mtab")).unwrap();
        std::fs::create_dir(etc.join("alternatives")).unwrap();
        for i in 0..COPY_MAX_ENTRIES + 1 {
            std::fs::write(etc.join(format!("alternatives/a{i}")), "x").unwrap();
        }
        d
    }

    #[test]
    fn the_stamp_follows_every_change_and_a_large_tree_is_bound() {
        let d = fake_etc();
        let (items, first, _) = walk(d.path());
        assert!(items.contains(&EtcItem::Bound {
            path: d.path().join("alternatives"),
            dir: true
        }));
        assert!(items.contains(&EtcItem::Link {
            path: d.path().join("mtab"),
            target: PathBuf::from("/proc/self/mounts")
        }));
        assert_eq!(walk(d.path()).1, first, "an unchanged /etc keeps its stamp");
        // A file changed in place, same size, inside a copied directory.
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(d.path().join("ld.so.conf.d/x.conf"), "/opt/y\n").unwrap();
        let (_, second, settled) = walk(d.path());
        assert_ne!(second, first);
        assert!(!settled, "a change this moment is not settled");
        std::fs::remove_file(d.path().join("mtab")).unwrap();
        std::os::unix::fs::symlink("/proc/mounts", d.path().join("mtab")).unwrap();
        assert_ne!(walk(d.path()).1, second, "a link's new target is a new stamp");
    }

    #[test]
    fn a_snapshot_holds_the_copies_and_the_mount_points() {
        let d = fake_etc();
        let (items, stamp, _) = walk(d.path());
        let state = tempfile::tempdir().unwrap();
        let dir = state.path().join(SNAPSHOTS_DIR);
        let snapshot = dir.join(format!("{stamp:016x}"));
        make_snapshot(&items, d.path(), &dir, &snapshot).unwrap();
        assert_eq!(
            std::fs::read_to_string(snapshot.join("ld.so.conf.d/x.conf")).unwrap(),
            "/opt/x\n"
        );
        assert_eq!(
            std::fs::read_link(snapshot.join("mtab")).unwrap(),
            PathBuf::from("/proc/self/mounts")
        );
        // The large tree is bound over an empty directory.
        assert_eq!(std::fs::read_dir(snapshot.join("alternatives")).unwrap().count(), 0);
        // A second worker's snapshot of the same stamp: the first one stands.
        make_snapshot(&items, d.path(), &dir, &snapshot).unwrap();
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left.len(), 1, "{left:?}");
    }

    #[test]
    fn no_snapshot_is_made_or_cleaned_up_through_a_link() {
        let victim = tempfile::tempdir().unwrap();
        let plant = |name: &str| {
            let old = victim.path().join(name);
            std::fs::create_dir(&old).unwrap();
            std::fs::write(old.join("id_ed25519"), "key").unwrap();
            let three_days_ago = SystemTime::now() - Duration::from_secs(3 * 24 * 3600);
            std::fs::File::open(&old).unwrap().set_modified(three_days_ago).unwrap();
            old
        };
        // Through a real directory the clean-up removes what is old there.
        let d = fake_etc();
        let (items, stamp, _) = walk(d.path());
        let snapshot_in = |dir: &Path| make_snapshot(&items, d.path(), dir, &dir.join(format!("{stamp:016x}")));
        let swept = plant(".ssh");
        snapshot_in(victim.path()).unwrap();
        assert!(!swept.exists(), "the clean-up did not run");
        // Through a link, nothing is made or removed.
        let state = tempfile::tempdir().unwrap();
        let link = state.path().join(SNAPSHOTS_DIR);
        std::os::unix::fs::symlink(victim.path(), &link).unwrap();
        let kept = plant(".gnupg");
        assert!(snapshot_in(&link).is_err());
        assert!(kept.join("id_ed25519").is_file(), "the person's directory was removed");
        // Nor by a worker's preparation, whether the snapshots' directory or the state
        // directory is the link.
        std::fs::remove_dir_all(victim.path().join(format!("{stamp:016x}"))).unwrap();
        let kept = plant("Documents");
        assert!(EtcView::prepare(state.path()).snapshot().is_none());
        let linked_state = tempfile::tempdir().unwrap();
        let state_link = linked_state.path().join("state");
        std::fs::create_dir(victim.path().join(SNAPSHOTS_DIR)).unwrap();
        std::os::unix::fs::symlink(victim.path(), &state_link).unwrap();
        assert!(EtcView::prepare(&state_link).snapshot().is_none());
        assert!(kept.join("id_ed25519").is_file(), "the person's directory was removed");
        let made: Vec<_> = std::fs::read_dir(victim.path().join(SNAPSHOTS_DIR)).unwrap().collect();
        assert!(made.is_empty(), "a snapshot was written through the link");
    }
}
