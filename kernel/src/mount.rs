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
    let fd = open_tree(
        rustix::fs::CWD,
        path,
        OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC | OpenTreeFlags::AT_RECURSIVE,
    )?;
    set_attributes(&fd, set, userns)?;
    Ok(fd)
}
