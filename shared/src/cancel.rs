//! A fire's cancellation by SIGINT, SIGTERM or SIGHUP (docs/design.md, issue 11
//! item 5; SIGHUP, a closed terminal or ssh session, is treated like SIGTERM),
//! answered in every phase: [`install`] replaces the default action (death, with no
//! records) by a flag as the fire starts, before prefetch, so a signal at any point
//! ends the fire as `cancelled` with its records. The async loop also listens through
//! tokio (the same signal registry, so both see each signal); the synchronous phases
//! poll [`requested`]. A child the fire waits on synchronously (a prefetch worker) is
//! named with [`ChildGuard`] and SIGKILLed from the handler itself, so a blocking read
//! of its output ends at once; its namespace's PID 1 dies with it, and with that PID 1
//! every process of the namespace. The handler is the kernel crate's
//! ([`kernel::cancel`]).

pub use kernel::cancel::{install, requested, ChildGuard};
