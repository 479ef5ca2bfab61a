//! Cancellation by SIGINT, SIGTERM or SIGHUP as a flag, for a process that must end
//! its work with records rather than die: [`install`] replaces the default action
//! (death) by the flag; synchronous code polls [`requested`], and async code may
//! listen through tokio too (the same signal registry, so both see each signal). A
//! child the process waits on synchronously is named with [`ChildGuard`] and
//! SIGKILLed from the handler itself, so a blocking read of its output ends at once.
//! The handler lives here because it is the part that must be async-signal-safe.

use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);
static CHILD: AtomicI32 = AtomicI32::new(0);
static INSTALLED: std::sync::Once = std::sync::Once::new();

/// Installs the SIGINT/SIGTERM/SIGHUP handler (once per process); returns an error naming
/// the signal the kernel refused.
pub fn install() -> std::io::Result<()> {
    let mut result = Ok(());
    INSTALLED.call_once(|| {
        for signal in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            // SAFETY: the action only stores to atomics and calls kill(2), both
            // async-signal-safe; it allocates nothing and takes no lock.
            let registered = unsafe { signal_hook_registry::register(signal, on_signal) };
            if let Err(e) = registered {
                result = Err(std::io::Error::new(e.kind(), format!("signal {signal}: {e}")));
                return;
            }
        }
    });
    result
}

fn on_signal() {
    REQUESTED.store(true, Ordering::SeqCst);
    let pid = CHILD.load(Ordering::SeqCst);
    if pid > 0 {
        // SAFETY: kill(2) is async-signal-safe; `pid` is a child this process has not
        // reaped yet (the guard clears it before the wait), so the pid is not reused.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
    }
}

/// Whether SIGINT, SIGTERM or SIGHUP arrived since [`install`].
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// Names the child the process is waiting on, for the handler to kill; clears it
/// when dropped. Drop it before reaping the child.
pub struct ChildGuard(());

impl ChildGuard {
    /// Names child `pid`; a signal that came before is answered at once.
    pub fn new(pid: u32) -> ChildGuard {
        CHILD.store(pid as i32, Ordering::SeqCst);
        if requested() {
            on_signal();
        }
        ChildGuard(())
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        CHILD.store(0, Ordering::SeqCst);
    }
}
