//! The directories an eval makes in the system's temporary directory (a revision's
//! checkout, the trusted settings file), and the sweep of those a killed eval left.
//!
//! A `builder review` in CI that the job's timeout SIGKILLs runs no destructor, so its
//! checkouts stayed in `/tmp` for good, one or two per killed run. Each directory is
//! now held while it is in use: an `flock` on a `.held` file inside it, taken before
//! the file gets that name (so no sweep can find it unheld in between) and let go by
//! the kernel when the process ends, however it ends. Making a new directory first
//! removes every directory of the same prefix and owner whose `.held` nobody holds;
//! one without a `.held` (an older build's, or an eval killed between making the
//! directory and naming the file) is removed once it is an hour old. A tree a tool
//! left unreadable (a directory of mode 000 in the checkout, which the write-back
//! keeps) is made readable by its owner and removed, on drop and in the sweep alike.

use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The file whose lock says a directory is in use.
const HELD: &str = ".held";

/// How old a directory with no `.held` must be before a sweep takes it.
const UNHELD_GRACE: Duration = Duration::from_secs(3600);

/// A directory in the temporary directory, removed on drop and held until then.
pub struct Scratch {
    dir: PathBuf,
    _held: File,
}

impl Scratch {
    /// Sweeps what killed evals left under `prefix` in the temporary directory, then
    /// makes and holds a new one there. An error names the path it was about.
    pub fn new(prefix: &str) -> Result<Scratch, (PathBuf, std::io::Error)> {
        let tmp = std::env::temp_dir();
        sweep_abandoned(&tmp, prefix);
        let at = |path: &Path| {
            let path = path.to_path_buf();
            move |e| (path, e)
        };
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir_in(&tmp)
            .map_err(at(&tmp))?;
        let taking = dir.path().join(".held-taking");
        let held = File::create(&taking).map_err(at(&taking))?;
        kernel::fs::lock_exclusive(&held, kernel::fs::Wait::Yes).map_err(at(&taking))?;
        std::fs::rename(&taking, dir.path().join(HELD)).map_err(at(&taking))?;
        Ok(Scratch {
            dir: dir.keep(),
            _held: held,
        })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Scratch {
    /// Removes the tree while still holding it (`_held` closes after this).
    fn drop(&mut self) {
        remove_tree(&self.dir);
    }
}

/// Removes the tree at `dir`; where that fails (a directory its owner cannot list or
/// write), gives every directory in it, reached through no link, its owner's rights
/// and tries once more. Best effort: what still cannot be removed stays.
fn remove_tree(dir: &Path) {
    if std::fs::remove_dir_all(dir).is_ok() {
        return;
    }
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let (Some(parent), Some(name)) = (d.parent(), d.file_name()) else {
            continue;
        };
        let Ok(parent_fd) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::DIRECTORY.bits() as i32 | rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(parent)
        else {
            continue;
        };
        let Ok(name) = std::ffi::CString::new(name.as_encoded_bytes()) else {
            continue;
        };
        use std::os::fd::AsFd;
        if kernel::fs::chmod_nofollow(parent_fd.as_fd(), &name, 0o700).is_err() {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        // The entry's type from the listing: a link is not followed.
        stack.extend(
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.path()),
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Removes the directories of `tmp` named `prefix…`, owned by this user, that no
/// process holds (see the module's text). Best effort: what cannot be read or removed
/// stays.
fn sweep_abandoned(tmp: &Path, prefix: &str) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    let me = rustix::process::geteuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_str().is_some_and(|n| n.starts_with(prefix)) {
            continue;
        }
        let dir = entry.path();
        // Not followed: a link named like ours is not ours.
        let Ok(meta) = std::fs::symlink_metadata(&dir) else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != me {
            continue;
        }
        if abandoned(&dir, &meta) {
            remove_tree(&dir);
        }
    }
}

/// Whether `dir` is no longer any live process's: its `.held` lock is free, or it has
/// none and is older than [`UNHELD_GRACE`]. `.held` is opened through no link, without
/// waiting (a FIFO in its place would block every eval), and counts only as a regular
/// file.
fn abandoned(dir: &Path, meta: &std::fs::Metadata) -> bool {
    let flags = rustix::fs::OFlags::NOFOLLOW | rustix::fs::OFlags::NONBLOCK;
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(dir.join(HELD));
    match opened {
        // Taken now means nobody held it; the file closes at the end of this call.
        Ok(held) if held.metadata().is_ok_and(|m| m.is_file()) => {
            kernel::fs::lock_exclusive(&held, kernel::fs::Wait::No).unwrap_or(false)
        }
        Ok(_) => false,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => meta
            .modified()
            .ok()
            .and_then(|at| SystemTime::now().duration_since(at).ok())
            .is_some_and(|age| age > UNHELD_GRACE),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_takes_the_unheld_and_the_old_and_leaves_the_held_and_the_young() {
        let tmp = tempfile::tempdir().unwrap();
        let prefix = "eval-scratch-test-";
        let made = |name: &str| {
            let d = tmp.path().join(format!("{prefix}{name}"));
            std::fs::create_dir_all(d.join("wt/.git")).unwrap();
            std::fs::write(d.join("wt/.git/HEAD"), "x").unwrap();
            d
        };
        // Killed with its lock: the file is there and nobody holds it; a tool left a
        // directory of its checkout unreadable (mode 000).
        let killed = made("killed");
        std::fs::write(killed.join(HELD), "").unwrap();
        std::fs::create_dir_all(killed.join("wt/locked/in")).unwrap();
        std::fs::set_permissions(
            killed.join("wt/locked"),
            std::os::unix::fs::PermissionsExt::from_mode(0o000),
        )
        .unwrap();
        // In use by a live eval (this process, on another open file description).
        let live = made("live");
        let held = File::create(live.join(HELD)).unwrap();
        assert!(kernel::fs::lock_exclusive(&held, kernel::fs::Wait::No).unwrap());
        // Made a moment ago, its `.held` not named yet.
        let young = made("young");
        // An older build's, two hours old.
        let old = made("old");
        let two_hours_ago = SystemTime::now() - Duration::from_secs(7200);
        File::open(&old).unwrap().set_modified(two_hours_ago).unwrap();
        // Another prefix is never touched, even unheld.
        let other = tmp.path().join("other-killed");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join(HELD), "").unwrap();

        sweep_abandoned(tmp.path(), prefix);

        assert!(!killed.exists() && !old.exists());
        assert!(live.join("wt/.git/HEAD").exists() && young.exists() && other.exists());
        drop(held);
        sweep_abandoned(tmp.path(), prefix);
        assert!(!live.exists(), "once its holder is gone it is swept");
    }

    #[test]
    fn a_new_scratch_is_held_until_dropped() {
        let s = Scratch::new("eval-scratch-held-").unwrap();
        let path = s.path().to_path_buf();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(path.join(HELD).exists() && !path.join(".held-taking").exists());
        assert!(!abandoned(&path, &meta), "its own lock holds it");
        drop(s);
        assert!(!path.exists());
    }
}
