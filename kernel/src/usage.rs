//! Resource usage of child processes (`wait4`, `getrusage`), for benches that
//! report a program's peak memory and the CPU time of what it started.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

/// How a waited-for process ended, and the most memory it held.
#[derive(Debug, Clone, Copy)]
pub struct Ended {
    pub status: ExitStatus,
    /// Peak resident set size, KiB.
    pub max_rss_kb: i64,
}

fn zeroed_rusage() -> libc::rusage {
    // SAFETY: `rusage` is plain integers and `timeval`s, for which all zeros is a
    // valid value.
    unsafe { std::mem::zeroed() }
}

/// Waits for `child` (not reaped yet) with `wait4`, which reports its usage too.
pub fn wait_with_usage(child: &std::process::Child) -> io::Result<Ended> {
    let pid = libc::pid_t::try_from(child.id()).map_err(io::Error::other)?;
    let mut status = 0;
    let mut usage = zeroed_rusage();
    // SAFETY: both pointers are live locals the call fills.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    if r != pid {
        return Err(io::Error::last_os_error());
    }
    Ok(Ended {
        status: ExitStatus::from_raw(status),
        max_rss_kb: usage.ru_maxrss,
    })
}

/// The usage of every child of this process that ended and was waited for, and of
/// their waited-for descendants (`RUSAGE_CHILDREN`).
pub fn children() -> io::Result<libc::rusage> {
    let mut all = zeroed_rusage();
    // SAFETY: the pointer is a live local the call fills.
    if unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut all) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(all)
}
