//! System calls a seccomp filter or a sandbox must refuse, made on purpose so a test
//! can check that they are refused (and with which error). Each is a sound call with
//! fixed arguments; none is needed by the product itself.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

fn fd_or_error(r: libc::c_long) -> io::Result<OwnedFd> {
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a successful socket call returns a new descriptor no one else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(r as libc::c_int) })
}

fn done(r: libc::c_long) -> io::Result<()> {
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `socket(domain, kind, 0)`.
pub fn socket(domain: libc::c_int, kind: libc::c_int) -> io::Result<OwnedFd> {
    socket_of(domain, kind, 0)
}

/// `socket(domain, kind, protocol)`: a socket of a named protocol (MPTCP, SCTP).
pub fn socket_of(domain: libc::c_int, kind: libc::c_int, protocol: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes integers and returns a new descriptor.
    fd_or_error(unsafe { libc::socket(domain, kind, protocol) }.into())
}

/// `ptrace(PTRACE_TRACEME)`: the parent would become the caller's tracer.
pub fn ptrace_traceme() -> io::Result<()> {
    // SAFETY: PTRACE_TRACEME reads no pointer.
    done(unsafe { libc::ptrace(libc::PTRACE_TRACEME, 0, 0, 0) })
}

/// Reads `RLIMIT_NOFILE` of `pid` with `prlimit64` (0: the caller).
pub fn prlimit_nofile(pid: libc::pid_t) -> io::Result<()> {
    let mut limit = libc::rlimit64 {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: no new limit is passed; the old one is written into a live local.
    done(unsafe { libc::prlimit64(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut limit) }.into())
}

/// `unshare(CLONE_NEWUSER)`.
pub fn unshare_user_namespace() -> io::Result<()> {
    // SAFETY: unshare(2) takes an integer; a new user namespace touches no memory.
    done(unsafe { libc::unshare(libc::CLONE_NEWUSER) }.into())
}

/// `mknod` of the character device 1:3 (`/dev/null`) at `path`.
pub fn mknod_char_device(path: &std::ffi::CStr) -> io::Result<()> {
    // SAFETY: `path` is NUL-terminated and outlives the call.
    done(unsafe { libc::mknod(path.as_ptr(), libc::S_IFCHR | 0o600, libc::makedev(1, 3)) }.into())
}

/// The x32 bit as a syscall number's type.
const X32_SYSCALL_BIT: libc::c_long = crate::seccomp::X32_SYSCALL_BIT as libc::c_long;

/// `getpid` through its x32 number; without x32 in the kernel, `ENOSYS`.
pub fn x32_getpid() -> io::Result<libc::c_long> {
    // SAFETY: getpid takes no argument, under either number.
    let r = unsafe { libc::syscall(X32_SYSCALL_BIT | libc::SYS_getpid) };
    done(r).map(|()| r)
}

/// A UDP socket through the x32 number of `socket`.
pub fn x32_udp_socket() -> io::Result<OwnedFd> {
    // SAFETY: socket takes integers and returns a new descriptor, under either
    // number.
    fd_or_error(unsafe { libc::syscall(X32_SYSCALL_BIT | libc::SYS_socket, libc::AF_INET, libc::SOCK_DGRAM, 0) })
}

/// `getpid` through the native syscall (not libc's cached answer).
pub fn native_getpid() -> io::Result<libc::c_long> {
    // SAFETY: getpid takes no argument.
    let r = unsafe { libc::syscall(libc::SYS_getpid) };
    done(r).map(|()| r)
}
