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

/// The most bytes read of one builder file of a work tree (a prompt, the scope, a
/// settings file, the MCP lock, as `builder check` and the builder's commands read
/// them): far above any real one, far below a memory's end.
pub const WORK_TREE_FILE_MAX: u64 = 16 * 1024 * 1024;

/// The bytes of the file `rel` of the work tree at `root`, as [`read`] reads them,
/// only where it resolves inside the repository: a checkout's link to `/dev/zero`, a
/// FIFO, `/proc/self/environ` or a reviewer's own file is not read (helper-108: `builder
/// check` of a proposal read a link to `/dev/zero` until memory ran out, and quoted
/// back parts of a file outside the repository in its errors), nor where it resolves
/// into the git directory (`.git/config` may hold a CI token) or the runtime's private
/// state (`.runtime`). The link itself is named by the check of links (which also
/// refuses links within the repository that leave the builder-owned paths); this only
/// keeps the reader from following one out. The path is resolved, then opened, so a
/// process that can swap a link in the work tree between the two could still lead
/// the read elsewhere: a fire's tools cannot write builder-owned paths, and a branch
/// does not race its own checkout, so this guards what a checkout holds, not a race.
pub fn read_within(root: &Path, rel: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let real_root = std::fs::canonicalize(root)?;
    let real = std::fs::canonicalize(root.join(rel))?;
    let private = [".git", crate::layout::STATE_DIR]
        .iter()
        .any(|d| real.starts_with(real_root.join(d)));
    if !real.starts_with(&real_root) || private {
        return Err(std::io::Error::new(
            ErrorKind::InvalidInput,
            format!(
                "it resolves outside the repository or into its private state (to {}): not read",
                real.display()
            ),
        ));
    }
    read(&real, max)
}

/// [`read_within`] of a text file, at most [`WORK_TREE_FILE_MAX`] bytes; not UTF-8 is
/// an error (`InvalidData`).
pub fn read_text_within(root: &Path, rel: &Path) -> std::io::Result<String> {
    let bytes = read_within(root, rel, WORK_TREE_FILE_MAX)?;
    String::from_utf8(bytes).map_err(|e| std::io::Error::new(ErrorKind::InvalidData, e.utf8_error()))
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
