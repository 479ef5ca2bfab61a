//! Terminals: the width of the one on stderr, and a pseudo-terminal for tests that
//! show what a program draws there.

use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;

/// Columns of the terminal on stderr, when it is one.
pub fn stderr_columns() -> Option<usize> {
    let ws = rustix::termios::tcgetwinsize(std::io::stderr()).ok()?;
    (ws.ws_col > 0).then_some(ws.ws_col as usize)
}

/// A pseudo-terminal: (controller, terminal), the terminal's window `columns` wide
/// and `rows` high; neither becomes the caller's controlling terminal.
pub fn pty(columns: u16, rows: u16) -> io::Result<(OwnedFd, OwnedFd)> {
    let controller = rustix::pty::openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY)?;
    rustix::pty::grantpt(&controller)?;
    rustix::pty::unlockpt(&controller)?;
    let name = rustix::pty::ptsname(&controller, Vec::new())?;
    let terminal = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOCTTY)
        .open(std::ffi::OsStr::from_bytes(name.as_bytes()))?;
    let window = Winsize {
        ws_row: rows,
        ws_col: columns,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    rustix::termios::tcsetwinsize(&terminal, window)?;
    Ok((controller, OwnedFd::from(terminal)))
}
