//! What of libgit2 is reached only through C or through its global options:
//! `git_path_is_gitfile`, the matcher of `.gitmodules`, `.gitattributes` and
//! `.gitignore` lookalikes (linked through `libgit2-sys`, which does not declare it),
//! the limits of libgit2's pack file maps, and the size of tree it keeps in its
//! object cache.

use std::os::raw::{c_char, c_int};

// libgit2's public matcher (`git2/sys/path.h`).
extern "C" {
    fn git_path_is_gitfile(path: *const c_char, pathlen: usize, gitfile: c_int, fs: c_int) -> c_int;
}

/// The files libgit2 knows lookalikes of (`git_path_gitfile`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GitFile {
    Gitignore = 0,
    Gitmodules = 1,
    Gitattributes = 2,
}

impl GitFile {
    const ALL: [GitFile; 3] = [GitFile::Gitignore, GitFile::Gitmodules, GitFile::Gitattributes];

    /// The file's name.
    pub fn name(self) -> &'static str {
        match self {
            GitFile::Gitignore => ".gitignore",
            GitFile::Gitmodules => ".gitmodules",
            GitFile::Gitattributes => ".gitattributes",
        }
    }
}

/// `GIT_PATH_FS_GENERIC`: both the NTFS and the HFS+ rules.
const FS_GENERIC: c_int = 0;

/// The file libgit2 reads the path component `name` as on NTFS or HFS+ (`gitmod~1`,
/// `.gitmodules` with HFS+ ignorables), if any. A name holding a NUL byte, which no
/// file name holds, is none.
pub fn lookalike_of(name: &str) -> Option<GitFile> {
    // libgit2 reads a few bytes past `pathlen` looking for the name's end: it needs
    // the terminating NUL.
    let c_name = std::ffi::CString::new(name).ok()?;
    GitFile::ALL.into_iter().find(|file| {
        // SAFETY: a NUL-terminated copy of `name` that outlives the call, and its
        // length; libgit2 only reads it and keeps nothing.
        unsafe { git_path_is_gitfile(c_name.as_ptr(), name.len(), *file as c_int, FS_GENERIC) > 0 }
    })
}

/// Why one of libgit2's global options was not set.
#[derive(Debug, thiserror::Error)]
pub enum GitOptionError {
    #[error("the process has {0} threads already: libgit2's options are set before any other starts")]
    Threaded(usize),
    #[error("cannot count this process's threads: {0}")]
    Threads(#[source] std::io::Error),
    #[error(transparent)]
    Git(#[from] git2::Error),
}

/// Sets the size of libgit2's pack map windows and the most it keeps mapped, in
/// bytes. For the start of a process: refused once it has another thread (one could
/// be using libgit2 while its options change).
pub fn limit_pack_maps(window: usize, mapped: usize) -> Result<(), GitOptionError> {
    single_threaded()?;
    // SAFETY: the process has a single thread (checked above), so no other uses
    // libgit2 while its global options change; the calls take integers.
    unsafe { git2::opts::set_mwindow_size(window).and_then(|()| git2::opts::set_mwindow_mapped_limit(mapped)) }?;
    Ok(())
}

/// Lets libgit2 keep trees of up to `bytes` in its object cache (its default is
/// 4 KiB: a tree of more entries, such as a day's directory of run records, is read,
/// inflated and parsed again at every lookup through it). For the start of a process,
/// as [`limit_pack_maps`].
pub fn cache_trees_up_to(bytes: usize) -> Result<(), GitOptionError> {
    single_threaded()?;
    // SAFETY: the process has a single thread (checked above), so no other uses
    // libgit2 while its global options change; the call takes an enum and an integer.
    unsafe { git2::opts::set_cache_object_limit(git2::ObjectType::Tree, bytes) }?;
    Ok(())
}

/// Refuses once the process has another thread: libgit2's global options are not
/// safe to change while another thread may be using libgit2.
fn single_threaded() -> Result<(), GitOptionError> {
    let threads = crate::process::thread_count().map_err(GitOptionError::Threads)?;
    if threads != 1 {
        return Err(GitOptionError::Threaded(threads));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn global_options_are_refused_once_another_thread_runs() {
        let (ready, wait) = std::sync::mpsc::channel::<()>();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            ready.send(()).unwrap();
            let _ = stopped.recv();
        });
        wait.recv().unwrap();
        let refused = cache_trees_up_to(1 << 20);
        assert!(
            matches!(refused, Err(GitOptionError::Threaded(n)) if n >= 2),
            "{refused:?}"
        );
        let refused = limit_pack_maps(1 << 20, 8 << 20);
        assert!(
            matches!(refused, Err(GitOptionError::Threaded(n)) if n >= 2),
            "{refused:?}"
        );
        stop.send(()).unwrap();
        other.join().unwrap();
    }
}
