//! A fire's cancellation by SIGINT, SIGTERM or SIGHUP (DESIGN.md section 4, issue 11
//! item 5; SIGHUP, a closed terminal or ssh session, is treated like SIGTERM),
//! answered in every phase: [`install`] replaces the default action (death, with no
//! records) by a flag as the fire starts, before prefetch, so a signal at any point
//! ends the fire as `cancelled` with its records. The async loop also listens through
//! tokio (the same signal registry, so both see each signal); the synchronous phases
//! poll [`requested`]. A child the fire waits on synchronously (a prefetch worker) is
//! named with [`ChildGuard`] and SIGKILLed from the handler itself, so a blocking read
//! of its output ends at once; its namespace's PID 1 dies with it, and with that PID 1
//! every process of the namespace.

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

/// Names the child the fire is waiting on, for the handler to kill; clears it when
/// dropped. Drop it before reaping the child.
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
