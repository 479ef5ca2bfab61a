//! Reading a file a path names (a signing key a setting names, a trace given on the
//! command line, a file a tool or a paused call names) only when it is a regular
//! file. It is opened without blocking and checked on the open descriptor, so a FIFO
//! named there is refused instead of holding the process (and its task's lock) until
//! a writer comes, and a device (`/dev/zero`) is never read to the end of memory:
//! reads stop one byte past their cap.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::Path;

/// Why a path is refused though it opened: carried inside the `io::Error` the
/// readers return ([`refused`] finds it), so callers tell it apart by type.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("not a regular file ({0})")]
    NotRegular(&'static str),
    #[error("larger than {0} bytes: too large to read")]
    TooLarge(u64),
}

/// The [`Refused`] inside an error [`open`] or [`read`] returned, if it is one.
pub fn refused(e: &std::io::Error) -> Option<&Refused> {
    e.get_ref()?.downcast_ref()
}

/// Opens `path` (links followed) for reading, and writing with `write`, only if it is
/// a regular file.
pub fn open(path: &Path, write: bool) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let t = f.metadata()?.file_type();
    if !t.is_file() {
        return Err(std::io::Error::new(
            ErrorKind::InvalidInput,
            Refused::NotRegular(crate::beneath::kind_of(t)),
        ));
    }
    Ok(f)
}

/// The bytes of the regular file `path`, at most `max` of them: a larger file is an
/// error ("larger than `max` bytes"), not a silent cut.
pub fn read(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    read_open(&open(path, false)?, max)
}

/// The bytes of `file` (opened by [`open`]), at most `max` of them, as [`read`].
pub fn read_open(file: &File, max: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::new(ErrorKind::InvalidInput, Refused::TooLarge(max)));
    }
    Ok(bytes)
}
