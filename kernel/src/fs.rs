//! File-system calls std does not offer: an exclusive `flock` on an open file (the
//! runtime's task and commit locks), and making a FIFO.

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
