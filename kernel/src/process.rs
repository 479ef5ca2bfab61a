//! Copies of the calling process: `clone(2)` with fork semantics, into fresh
//! namespaces or none, and what goes with it (leaving a copy without running the
//! caller's destructors, waiting for one, a parent that only waits for its clone and
//! forwards it SIGTERM and SIGINT). A copy of a process that has other threads may
//! find a lock held forever or a structure half-updated by a thread that no longer
//! exists in it, so [`clone`] refuses unless the caller is single-threaded; the
//! internal clones whose copy only makes async-signal-safe calls and leaves need no
//! such check.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};

/// A process id.
pub type Pid = libc::pid_t;

/// The namespaces a clone gets fresh ones of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Namespaces {
    pub user: bool,
    pub mount: bool,
    pub pid: bool,
    pub ipc: bool,
    pub net: bool,
}

impl Namespaces {
    /// Every namespace [`Namespaces`] names.
    pub const ALL: Namespaces = Namespaces {
        user: true,
        mount: true,
        pid: true,
        ipc: true,
        net: true,
    };

    /// The `CLONE_NEW*` flags.
    pub(crate) fn flags(self) -> libc::c_int {
        [
            (self.user, libc::CLONE_NEWUSER),
            (self.mount, libc::CLONE_NEWNS),
            (self.pid, libc::CLONE_NEWPID),
            (self.ipc, libc::CLONE_NEWIPC),
            (self.net, libc::CLONE_NEWNET),
        ]
        .into_iter()
        .filter(|(on, _)| *on)
        .fold(0, |flags, (_, flag)| flags | flag)
    }
}

/// Which side of a clone the caller is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cloned {
    /// The new process.
    Child,
    /// The original, with the new process's id.
    Parent(Pid),
}

/// Why a clone was not made.
#[derive(Debug, thiserror::Error)]
pub enum CloneError {
    #[error("cannot copy a process of {0} threads: only a single-threaded one")]
    Threaded(usize),
    #[error("cannot count this process's threads: {0}")]
    Threads(#[source] io::Error),
    #[error("{0}")]
    Clone(#[source] io::Error),
}

impl From<CloneError> for io::Error {
    fn from(e: CloneError) -> io::Error {
        match e {
            CloneError::Clone(e) => e,
            other => io::Error::other(other.to_string()),
        }
    }
}

/// How many threads this process has (the entries of `/proc/self/task`).
pub(crate) fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// Copies the calling process into fresh `namespaces` (none: a plain fork). Refuses
/// unless the process is single-threaded.
pub fn clone(namespaces: Namespaces) -> Result<Cloned, CloneError> {
    let threads = thread_count().map_err(CloneError::Threads)?;
    if threads != 1 {
        return Err(CloneError::Threaded(threads));
    }
    // SAFETY: the process has a single thread (checked above, and no thread can start
    // between the check and the call but from this one), so the copy holds no lock
    // another thread took and sees no structure half-updated.
    unsafe { clone_unchecked(namespaces.flags()) }.map_err(CloneError::Clone)
}

/// `clone(2)` with `flags` and fork semantics (no new stack, no shared memory).
///
/// # Safety
///
/// In a multithreaded process the copy may only make async-signal-safe calls (it
/// holds every lock another thread held at the call, forever).
pub(crate) unsafe fn clone_unchecked(flags: libc::c_int) -> io::Result<Cloned> {
    // SAFETY: without CLONE_VM or a new stack, clone behaves as fork: the copy runs on
    // its own copy of the memory, from this very call; the caller keeps the rest of
    // the contract (see above).
    let pid = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    };
    match pid {
        p if p < 0 => Err(io::Error::last_os_error()),
        0 => Ok(Cloned::Child),
        p => Ok(Cloned::Parent(p as Pid)),
    }
}

/// Ends the calling process at once with `code`: no destructor, no `atexit`
/// handler, no flush of the standard library's buffers (a copy leaves this way so as
/// not to run the original's clean-up twice).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit(2) takes an integer and does not return; skipping destructors
    // only leaks.
    unsafe { libc::_exit(code) }
}

/// Waits for the child `pid` to end (retrying when a signal interrupts the wait).
pub fn wait(pid: Pid) -> io::Result<ExitStatus> {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a live local the call fills.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid {
            return Ok(ExitStatus::from_raw(status));
        }
        let e = io::Error::last_os_error();
        if r >= 0 || e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Kills the child `pid` and reaps it.
pub fn kill_and_reap(pid: Pid) {
    // SAFETY: kill(2) and waitpid(2) on our own child, no pointer passed.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
    }
}

/// The code a shell would report for `status`: the exit code, or 128 plus the signal
/// that ended the process.
pub fn shell_code(status: ExitStatus) -> i32 {
    match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 128,
    }
}

/// The clone [`supervise`] waits for, for its signal forwarder.
static SUPERVISED: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = SUPERVISED.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe and takes no pointer.
        unsafe { libc::kill(pid, sig) };
    }
}

/// The original process after a clone that does its work: lets go of its stdin and
/// stdout (reopened on `/dev/null`; the clone keeps its own copies, so whoever reads
/// them sees their end when the clone ends), forwards SIGTERM and SIGINT to the
/// clone, and exits as the clone did.
pub fn supervise(pid: Pid) -> ! {
    SUPERVISED.store(pid, Ordering::Relaxed);
    // SAFETY: the handler only loads an atomic and calls kill(2), both
    // async-signal-safe; open, dup2 and close work on descriptors 0 and 1 and one
    // this block opens and closes (the standard handles hold no buffer of their own
    // across this: the caller wrote and flushed what it had).
    unsafe {
        libc::signal(libc::SIGTERM, forward as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, forward as *const () as libc::sighandler_t);
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            libc::close(null);
        }
    }
    let code = match wait(pid) {
        Ok(status) => shell_code(status),
        Err(_) => 0,
    };
    std::process::exit(code)
}

/// Whether this process is PID 1 of its PID namespace (the sandboxed worker is).
/// When it ends, the kernel kills every other process of that namespace, so nothing
/// it spawned can outlive it.
pub fn is_namespace_init() -> bool {
    rustix::process::getpid().as_raw_nonzero().get() == 1
}

/// In PID 1 of a PID namespace: kills every other process of the namespace
/// (whatever the last job left behind, in any session or group) and reaps them.
/// Does nothing in any other process (there `kill(-1)` would reach every process of
/// the user).
pub fn kill_rest_of_namespace() {
    if !is_namespace_init() {
        return;
    }
    // SAFETY: kill(-1) from PID 1 signals every other process of its namespace;
    // waitpid reaps them (orphans are ours as PID 1); no pointer is passed.
    unsafe {
        libc::kill(-1, libc::SIGKILL);
        while libc::waitpid(-1, std::ptr::null_mut(), 0) > 0 {}
    }
}

/// Whether the process runs as root (effective uid 0).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// The effective uid of the process.
pub fn effective_uid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Lowers the calling thread's scheduling priority to the nice value `nice`. Linux
/// keeps a nice value per thread, and `setpriority(PRIO_PROCESS, 0)` changes only the
/// caller's. For background work that should yield to the rest of the process where
/// they compete for a CPU. Without `CAP_SYS_NICE` (or an `RLIMIT_NICE` that allows
/// it) the thread cannot raise it back: use it on a thread of its own.
pub fn lower_thread_priority(nice: i32) -> io::Result<()> {
    rustix::process::setpriority_process(None, nice).map_err(io::Error::from)
}
