//! File-system calls std does not offer: an exclusive `flock` on an open file (the
//! runtime's task and commit locks), making a FIFO, and a `chmod` that never follows
//! a link (`fchmodat2`, which rustix does not offer).

use rustix::fs::FlockOperation;
use std::io;
use std::path::Path;

/// Whether [`lock_exclusive`] waits for the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Block until the lock is free.
    Yes,
    /// Answer at once.
    No,
}

/// Takes an exclusive `flock` on `file`, held until the file is closed. `Ok(false)`:
/// another holder has it (only with [`Wait::No`]).
pub fn lock_exclusive(file: &std::fs::File, wait: Wait) -> io::Result<bool> {
    let op = match wait {
        Wait::Yes => FlockOperation::LockExclusive,
        Wait::No => FlockOperation::NonBlockingLockExclusive,
    };
    match rustix::fs::flock(file, op) {
        Ok(()) => Ok(true),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Makes a FIFO at `path` with permission bits `mode`.
pub fn make_fifo(path: &Path, mode: u32) -> io::Result<()> {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(mode),
        0,
    )
    .map_err(io::Error::from)
}

/// Sets the mode of `name` in `dir` without following it if it is a link
/// (`fchmodat2` with `AT_SYMLINK_NOFOLLOW`, Linux 6.6): a link swapped in since the
/// caller looked is refused (`EOPNOTSUPP`, as Linux refuses to change a link's mode),
/// never followed to its target. On an older kernel (`ENOSYS`) the mode is set with
/// plain `fchmodat`, which follows a link.
pub fn chmod_nofollow(dir: std::os::fd::BorrowedFd<'_>, name: &std::ffi::CStr, mode: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fchmodat2 reads the NUL-terminated name `name` points to, which lives
    // for the call, and takes the descriptor and two integers; it writes nothing.
    let r = unsafe {
        libc::syscall(
            libc::SYS_fchmodat2,
            dir.as_raw_fd(),
            name.as_ptr(),
            mode as libc::c_uint,
            libc::AT_SYMLINK_NOFOLLOW as libc::c_uint,
        )
    };
    if r == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::ENOSYS) {
        return Err(e);
    }
    Ok(rustix::fs::chmodat(
        dir,
        name,
        rustix::fs::Mode::from_raw_mode(mode),
        rustix::fs::AtFlags::empty(),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_link_is_never_followed_by_chmod_nofollow() {
        let t = tempfile::tempdir().unwrap();
        std::fs::write(t.path().join("target"), "").unwrap();
        std::fs::set_permissions(t.path().join("target"), PermissionsExt::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink("target", t.path().join("link")).unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        let dir = std::fs::File::open(t.path()).unwrap();
        chmod_nofollow(dir.as_fd(), c"d", 0o700).unwrap();
        let mode = |n: &str| {
            std::fs::symlink_metadata(t.path().join(n))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777
        };
        assert_eq!(mode("d"), 0o700);
        // Before Linux 6.6 (no fchmodat2) the fallback follows the link, as documented.
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut numbers = release
            .split(|c: char| !c.is_ascii_digit())
            .filter_map(|n| n.parse::<u32>().ok());
        let (major, minor) = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
        assert!(major > 0, "no kernel release in {release:?}");
        if (major, minor) < (6, 6) {
            eprintln!("kernel {release} has no fchmodat2: the no-follow case is not checked");
            return;
        }
        let linked = chmod_nofollow(dir.as_fd(), c"link", 0o755);
        assert!(linked.is_err(), "a link's mode cannot be set on Linux");
        assert_eq!(mode("target"), 0o600, "the link's target is untouched");
    }
}
