//! Signals: sending one to a process, a process group or the caller itself, setting a
//! signal's action back to the default or to ignored, and a flag that SIGTERM and
//! SIGINT raise instead of ending the process (the tool worker kills its running
//! command on it and goes on serving).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

/// The signals the workspace sends or handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Kill,
    Term,
    Int,
    Hup,
    Quit,
    Pipe,
    /// Stops the process until a `SIGCONT` (a test holds a process at a named point).
    Stop,
}

impl Signal {
    /// The signal's number.
    pub fn number(self) -> libc::c_int {
        match self {
            Signal::Kill => libc::SIGKILL,
            Signal::Term => libc::SIGTERM,
            Signal::Int => libc::SIGINT,
            Signal::Hup => libc::SIGHUP,
            Signal::Quit => libc::SIGQUIT,
            Signal::Pipe => libc::SIGPIPE,
            Signal::Stop => libc::SIGSTOP,
        }
    }
}

/// `id` as a positive pid (`Child::id` is a `u32`); 0 and what does not fit are
/// refused, since 0 and negative numbers reach whole groups.
fn positive(id: u32) -> io::Result<libc::pid_t> {
    match libc::pid_t::try_from(id) {
        Ok(pid) if pid > 0 => Ok(pid),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a process id: {id}"),
        )),
    }
}

fn sent(r: libc::c_int) -> io::Result<()> {
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sends `signal` to the process `pid`.
pub fn kill(pid: u32, signal: Signal) -> io::Result<()> {
    let pid = positive(pid)?;
    // SAFETY: kill(2) takes two integers and no pointer.
    sent(unsafe { libc::kill(pid, signal.number()) })
}

/// Sends `signal` to every process of the process group `pgid`.
pub fn kill_group(pgid: u32, signal: Signal) -> io::Result<()> {
    let pgid = positive(pgid)?;
    // SAFETY: kill(2) takes two integers and no pointer.
    sent(unsafe { libc::kill(-pgid, signal.number()) })
}

/// Sends `signal` to the calling thread; a handler runs before this returns.
pub fn raise(signal: Signal) -> io::Result<()> {
    // SAFETY: raise(3) takes an integer and no pointer.
    sent(unsafe { libc::raise(signal.number()) })
}

/// Sets `signal`'s action back to the default (for SIGPIPE: the process ends).
pub fn restore_default(signal: Signal) {
    // SAFETY: SIG_DFL installs no handler, so no code of ours runs on the signal.
    unsafe {
        libc::signal(signal.number(), libc::SIG_DFL);
    }
}

/// Makes the process ignore `signal` (for SIGPIPE: a write to a closed pipe fails
/// with `EPIPE` instead).
pub fn ignore(signal: Signal) {
    // SAFETY: SIG_IGN installs no handler, so no code of ours runs on the signal.
    unsafe {
        libc::signal(signal.number(), libc::SIG_IGN);
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Makes SIGTERM and SIGINT raise a flag ([`take_interrupt`]) instead of ending the
/// process.
pub fn catch_interrupts() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        let handler = on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGINT, handler);
    }
}

/// True once after SIGTERM or SIGINT reached the process since [`catch_interrupts`].
pub fn take_interrupt() -> bool {
    INTERRUPTED.swap(false, Ordering::SeqCst)
}
