//! Detached copies of mount trees (`open_tree` with `OPEN_TREE_CLONE`) with mount
//! attributes set on them recursively (`mount_setattr`, which rustix does not
//! offer): read-only, `nosuid`, `nodev`, and idmapped through a user namespace. The
//! tool worker clones the trees it shows this way, and attaches them in its own root.

use rustix::mount::{open_tree, OpenTreeFlags};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

/// `MOUNT_ATTR_RDONLY`: writes refused.
pub const ATTR_RDONLY: u64 = 0x1;
/// `MOUNT_ATTR_NOSUID`: set-id bits ignored.
pub const ATTR_NOSUID: u64 = 0x2;
/// `MOUNT_ATTR_NODEV`: device nodes not opened.
pub const ATTR_NODEV: u64 = 0x4;
/// `MOUNT_ATTR_IDMAP`: ids mapped through a user namespace.
const ATTR_IDMAP: u64 = 0x0010_0000;

/// `struct mount_attr` of `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Sets the attributes `set` on the detached tree `tree`, recursively; with `userns`,
/// idmapped through that user namespace.
fn set_attributes(tree: &OwnedFd, set: u64, userns: Option<&OwnedFd>) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: set | if userns.is_some() { ATTR_IDMAP } else { 0 },
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.map(|u| u.as_raw_fd() as u64).unwrap_or(0),
    };
    // SAFETY: the path is a NUL-terminated literal and the struct lives across the
    // call, its size passed with it; the kernel only reads both.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A detached recursive copy of the mounts at `path` with the attributes `set`
/// (`ATTR_*`), idmapped through `userns` when given.
pub fn clone_tree(path: &Path, set: u64, userns: Option<&OwnedFd>) -> io::Result<OwnedFd> {
    clone_at(rustix::fs::CWD, path, OpenTreeFlags::empty(), set, userns)
}

/// `open_tree(dir, path, OPEN_TREE_CLONE | extra)`, recursive, with the attributes
/// `set`.
fn clone_at(
    dir: impl std::os::fd::AsFd,
    path: &Path,
    extra: OpenTreeFlags,
    set: u64,
    userns: Option<&OwnedFd>,
) -> io::Result<OwnedFd> {
    let flags = OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC | OpenTreeFlags::AT_RECURSIVE | extra;
    let fd = open_tree(dir, path, flags)?;
    set_attributes(&fd, set, userns)?;
    Ok(fd)
}

/// The directory `rel` beneath the directory `root`, reached without following any
/// link and without leaving `root` (`openat2` with `RESOLVE_NO_SYMLINKS |
/// RESOLVE_BENEATH`), as an `O_PATH` descriptor. A link anywhere on the way, put
/// there after the path was checked, fails with `ELOOP` instead of leading elsewhere.
pub fn open_beneath(root: &Path, rel: &Path) -> io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let dir = rustix::fs::open(root, flags, Mode::empty())?;
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    let resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS;
    Ok(rustix::fs::openat2(&dir, rel, flags, Mode::empty(), resolve)?)
}

/// [`clone_tree`] of the directory `dir` is open on (one [`open_beneath`] reached):
/// what is cloned is the directory that was checked, never a link's target swapped
/// in since.
pub fn clone_opened(dir: impl std::os::fd::AsFd, set: u64, userns: Option<&OwnedFd>) -> io::Result<OwnedFd> {
    clone_at(dir, Path::new(""), OpenTreeFlags::AT_EMPTY_PATH, set, userns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_on_the_way_beneath_the_root_is_never_followed() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        std::fs::create_dir_all(root.join("prompts")).unwrap();
        std::fs::create_dir_all(root.join("reports/real")).unwrap();
        std::os::unix::fs::symlink("../prompts", root.join("reports/daily")).unwrap();
        std::os::unix::fs::symlink(root.join("prompts"), root.join("reports/abs")).unwrap();
        assert!(open_beneath(root, Path::new("reports/real")).is_ok());
        for rel in ["reports/daily", "reports/abs", "reports/daily/.", "../x"] {
            let e = open_beneath(root, Path::new(rel)).expect_err(rel);
            assert!(
                matches!(
                    e.raw_os_error(),
                    Some(libc::ELOOP) | Some(libc::EXDEV) | Some(libc::ENOENT)
                ),
                "{rel}: {e}"
            );
        }
        // Through a plain directory and back inside is fine; a file is not a directory.
        assert!(open_beneath(root, Path::new("reports/real/../real")).is_ok());
        std::fs::write(root.join("reports/f"), "").unwrap();
        assert!(open_beneath(root, Path::new("reports/f")).is_err());
    }
}
