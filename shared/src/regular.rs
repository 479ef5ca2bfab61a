//! Reading a file a path names (a signing key a setting names, a trace given on the
//! command line, a file a tool or a paused call names) only when it is a regular
//! file. It is opened without blocking and checked on the open descriptor, so a FIFO
//! named there is refused instead of holding the process (and its task's lock) until
//! a writer comes, and a device (`/dev/zero`) is never read to the end of memory:
//! reads stop one byte past their cap.

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::Path;

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
            format!("not a regular file ({})", crate::beneath::kind_of(t)),
        ));
    }
    Ok(f)
}

/// The bytes of the regular file `path`, at most `max` of them: a larger file is an
/// error ("larger than `max` bytes"), not a silent cut.
pub fn read(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    open(path, false)?.take(max + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(std::io::Error::new(
            ErrorKind::InvalidInput,
            format!("larger than {max} bytes: too large to read"),
        ));
    }
    Ok(bytes)
}
