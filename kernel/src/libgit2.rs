//! What of libgit2 is reached only through C or through its global options:
//! `git_path_is_gitfile`, the matcher of `.gitmodules`, `.gitattributes` and
//! `.gitignore` lookalikes (linked through `libgit2-sys`, which does not declare it),
//! and the limits of libgit2's pack file maps.

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

/// Why libgit2's pack maps were not limited.
#[derive(Debug, thiserror::Error)]
pub enum PackMapsError {
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
pub fn limit_pack_maps(window: usize, mapped: usize) -> Result<(), PackMapsError> {
    let threads = crate::process::thread_count().map_err(PackMapsError::Threads)?;
    if threads != 1 {
        return Err(PackMapsError::Threaded(threads));
    }
    // SAFETY: the process has a single thread (checked above), so no other uses
    // libgit2 while its global options change; the calls take integers.
    unsafe { git2::opts::set_mwindow_size(window).and_then(|()| git2::opts::set_mwindow_mapped_limit(mapped)) }?;
    Ok(())
}
