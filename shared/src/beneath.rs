//! Files the runtime creates or reads in places a tool process can reach (`reports/`,
//! `cards/`, `runs/`), opened so that nothing the model planted there can redirect
//! them. Every path is resolved one component at a time from a directory fd of the
//! repository root with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)`: a symlink
//! anywhere on the way (a `reports/<task>` directory replaced by a link into `.git`)
//! makes the call fail with `ELOOP`/`EXDEV` instead of being followed. Files are
//! created `O_CREAT | O_EXCL | O_NOFOLLOW` (never truncated, never reused) and read
//! `O_NOFOLLOW | O_NONBLOCK` then checked with `fstat` on the open descriptor (a FIFO
//! does not hang the read, a file swapped after the check is not the one read).
//!
//! On kernels without `openat2` (before 5.6: `ENOSYS`) each component is opened with
//! plain `openat(O_NOFOLLOW)` from its parent's fd, which refuses a symlink in the
//! same places (a final-component symlink gives `ELOOP`, an intermediate one cannot
//! be reached because no path with a `/` is ever resolved by the kernel).

use rustix::fs::{Mode, OFlags, ResolveFlags};
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Component, Path};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once `openat2` answered `ENOSYS`: every later open takes the `openat` path.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// Opens one path component `name` (no `/`) under `dir` without following links.
fn open_one(dir: &OwnedFd, name: &str, flags: OFlags, mode: Mode) -> std::io::Result<OwnedFd> {
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    if !NO_OPENAT2.load(Ordering::Relaxed) {
        match rustix::fs::openat2(dir, name, flags, mode, RESOLVE) {
            Err(rustix::io::Errno::NOSYS) => {
                NO_OPENAT2.store(true, Ordering::Relaxed);
                tracing::debug!("openat2 is not available: records are opened with openat(O_NOFOLLOW)");
            }
            r => return r.map_err(std::io::Error::from),
        }
    }
    rustix::fs::openat(dir, name, flags, mode).map_err(std::io::Error::from)
}

/// The plain components of a repo-relative path; anything else (`..`, `.`, a root,
/// an empty path) is refused.
fn components(rel: &Path) -> std::io::Result<Vec<&str>> {
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a plain repo-relative path");
    let mut out = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(s) => out.push(s.to_str().ok_or_else(bad)?),
            Component::CurDir | Component::ParentDir | Component::RootDir | Component::Prefix(_) => return Err(bad()),
        }
    }
    if out.is_empty() {
        return Err(bad());
    }
    Ok(out)
}

/// A directory fd of the repository root (the anchor every path is resolved from).
pub fn open_root(root: &Path) -> std::io::Result<OwnedFd> {
    rustix::fs::open(
        root,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(std::io::Error::from)
}

/// Creates the directory `rel` under the repository `root` level by level (as
/// [`open_dirs`]): a symlink, a non-directory or a `..` at any level is refused, so a
/// link an earlier fire's tool left in a write directory cannot turn a later fire's
/// write directory (its Landlock rule, its overlay) into a directory elsewhere.
pub fn make_dirs(root: &Path, rel: &Path) -> std::io::Result<()> {
    let mut names = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => names.push(n.to_str().ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{}: not UTF-8", rel.display()),
                )
            })?),
            Component::CurDir => {}
            _ => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{}: only plain names may lead to a write directory", rel.display()),
                ))
            }
        }
    }
    let fd = open_root(root)?;
    open_dirs(&fd, &names, MakeDirs::Yes).map(drop).map_err(|e| {
        let linked = matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR | libc::EXDEV));
        std::io::Error::new(
            e.kind(),
            if linked {
                format!(
                    "{}: a level of it is a symbolic link or not a directory ({e}); a write directory is used only through plain directories",
                    rel.display()
                )
            } else {
                format!("{}: {e}", rel.display())
            },
        )
    })
}

/// Opens the directory `dirs` under `root`, creating each missing level with `mkdirat`
/// and refusing a symlink or a non-directory at any level. A level this process owns
/// but may not use (a tool ran `chmod 000 reports/t`: tools write `reports/` as the
/// same user when the runtime is not root) gets its owner's `rwx` back first
/// ([`open_dir_usable`]): no mode a tool sets stops the runtime's records.
fn open_dirs(root: &OwnedFd, dirs: &[&str], make: MakeDirs) -> std::io::Result<OwnedFd> {
    let mut cur = open_one(root, ".", OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty())?;
    for d in dirs {
        if make == MakeDirs::Yes {
            match rustix::fs::mkdirat(&cur, *d, Mode::from_raw_mode(0o755)) {
                Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        cur = open_dir_usable(&cur, d)?;
    }
    Ok(cur)
}

/// Whether a write makes the missing directories on its way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MakeDirs {
    Yes,
    /// No: a missing one fails the write with `NotFound` (the caller makes it, as
    /// `crate::git`'s lock protocol asks).
    No,
}

/// Opens directory `name` under `dir` (no link followed) for reading and for creating
/// entries in it. When this process owns it but its owner bits lack `rwx` (a mode a
/// tool set), they are given back, on the inode reached through no link (an `O_PATH`
/// descriptor, changed through its `/proc/self/fd` name), and a warning says so; a
/// directory someone else owns is left as it is (the open then fails as it would).
fn open_dir_usable(dir: &OwnedFd, name: &str) -> std::io::Result<OwnedFd> {
    let opened = open_one(dir, name, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty());
    let needs = match &opened {
        Ok(fd) => lacks_owner_rwx(fd),
        Err(e) => e.raw_os_error() == Some(libc::EACCES),
    };
    if !needs {
        return opened;
    }
    let handle = open_one(dir, name, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
    let st = rustix::fs::fstat(&handle)?;
    if st.st_uid != rustix::process::geteuid().as_raw() {
        return opened;
    }
    let mode = (st.st_mode & 0o7777) | 0o700;
    use std::os::fd::AsRawFd;
    let by_fd = format!("/proc/self/fd/{}", handle.as_raw_fd());
    rustix::fs::chmod(by_fd.as_str(), Mode::from_raw_mode(mode))?;
    tracing::warn!(
        dir = name,
        was = format!("{:o}", st.st_mode & 0o7777),
        "a records directory had its owner's rights taken away (a tool's chmod): given back"
    );
    open_one(dir, name, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty())
}

/// Whether the directory `fd` is this process's and misses some of its owner's `rwx`.
fn lacks_owner_rwx(fd: &OwnedFd) -> bool {
    rustix::fs::fstat(fd)
        .is_ok_and(|st| st.st_uid == rustix::process::geteuid().as_raw() && st.st_mode & 0o700 != 0o700)
}

/// Creates `rel` under `root` holding `bytes`, whole or not at all: written to a
/// temporary name in the same directory ([`temp_name`]) and renamed into place
/// without replacing anything, so a process killed meanwhile leaves no empty or
/// half-written file at `rel`, only a temporary one its pid names. Fails with
/// `AlreadyExists` when anything is at that name, and with `ELOOP`/`EXDEV`/`ENOTDIR`
/// when a directory on the way is a symlink or not a directory.
pub fn create_new(root: &OwnedFd, rel: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_new(root, rel, bytes, false, MakeDirs::Yes, Placing::New)
}

/// [`create_new`] or [`create_new_synced`] (`fsync`), making the missing directories
/// on the way or not (`make`).
pub fn create_new_with(root: &OwnedFd, rel: &Path, bytes: &[u8], fsync: bool, make: MakeDirs) -> std::io::Result<()> {
    write_new(root, rel, bytes, fsync, make, Placing::New)
}

/// [`create_new`] that survives a power loss once it returns: the temporary file is
/// fsynced before its rename and the directory after it (`durability: strict`).
pub fn create_new_synced(root: &OwnedFd, rel: &Path, bytes: &[u8]) -> std::io::Result<()> {
    write_new(root, rel, bytes, true, MakeDirs::Yes, Placing::New)
}

/// Puts a file holding `bytes`, with `mode`, at `rel` under `root` in place of the
/// file or link there (never a directory: `EISDIR`), making the missing directories
/// on the way: written to a temporary name as [`create_new`] does and renamed over
/// the name, so a process killed meanwhile leaves the old entry at `rel` (and a
/// temporary file its pid names), never no file. `fsync` as [`create_new_synced`].
pub fn replace_file(root: &OwnedFd, rel: &Path, bytes: &[u8], mode: u32, fsync: bool) -> std::io::Result<()> {
    write_new(root, rel, bytes, fsync, MakeDirs::Yes, Placing::Over { mode })
}

/// How [`write_new`] puts its temporary file at the name.
#[derive(Clone, Copy)]
enum Placing {
    /// Only where nothing is ([`create_new`]).
    New,
    /// Over what is there, with this mode ([`replace_file`]).
    Over { mode: u32 },
}

fn write_new(
    root: &OwnedFd,
    rel: &Path,
    bytes: &[u8],
    fsync: bool,
    make: MakeDirs,
    placing: Placing,
) -> std::io::Result<()> {
    let parts = components(rel)?;
    let (name, dirs) = parts
        .split_last()
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let dir = open_dirs(root, dirs, make)?;
    let temp = temp_name(name, std::process::id());
    let fd = open_one(
        &dir,
        &temp,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL,
        Mode::from_raw_mode(0o644),
    )?;
    let mut file = std::fs::File::from(fd);
    let written = file
        .write_all(bytes)
        .and_then(|()| match placing {
            Placing::Over { mode } => {
                rustix::fs::fchmod(&file, Mode::from_raw_mode(mode)).map_err(std::io::Error::from)
            }
            Placing::New => Ok(()),
        })
        .and_then(|()| if fsync { file.sync_all() } else { Ok(()) })
        .and_then(|()| match placing {
            Placing::New => {
                crate::failpoint!("mid-record-write");
                rustix::fs::renameat_with(&dir, temp.as_str(), &dir, *name, rustix::fs::RenameFlags::NOREPLACE)
                    .map_err(std::io::Error::from)
            }
            Placing::Over { .. } => {
                crate::failpoint!("mid-put-back");
                rustix::fs::renameat(&dir, temp.as_str(), &dir, *name).map_err(std::io::Error::from)
            }
        })
        .and_then(|()| match fsync {
            true => rustix::fs::fsync(&dir).map_err(std::io::Error::from),
            false => Ok(()),
        });
    if written.is_err() {
        let _ = rustix::fs::unlinkat(&dir, temp.as_str(), rustix::fs::AtFlags::empty());
    }
    written
}

/// The temporary name [`create_new`] writes `name` under first: hidden, naming the
/// writing process, with a random part a tool cannot guess (a file planted at the
/// name would fail the exclusive create).
pub fn temp_name(name: &str, pid: u32) -> String {
    format!(".{name}.{pid}-{:08x}.tmp", rand::random::<u32>())
}

/// The name and the writing process's pid a [`temp_name`] holds, if `file` is one
/// (the form without the random part, written by earlier versions, too).
pub fn temp_target(file: &str) -> Option<(&str, u32)> {
    let inner = file.strip_prefix('.')?.strip_suffix(".tmp")?;
    let (name, tail) = inner.rsplit_once('.')?;
    let pid = match tail.split_once('-') {
        Some((pid, random)) if random.len() == 8 && random.bytes().all(|b| b.is_ascii_hexdigit()) => pid,
        Some(_) => return None,
        None => tail,
    };
    Some((name, pid.parse().ok()?))
}

/// The pid a [`temp_name`] names, if `file` is one.
pub fn temp_owner(file: &str) -> Option<u32> {
    temp_target(file).map(|(_, pid)| pid)
}

/// Removes the file `rel` under `root` (never a directory, never through a link: the
/// last component is unlinked in the directory reached without following any).
pub fn remove_file(root: &OwnedFd, rel: &Path) -> std::io::Result<()> {
    let (dir, name) = parent_of(root, rel)?;
    rustix::fs::unlinkat(&dir, name, rustix::fs::AtFlags::empty()).map_err(std::io::Error::from)
}

/// Removes the empty directory `rel` under `root`, reached through no link (`rmdir`:
/// one that holds anything stays, `ENOTEMPTY`).
pub fn remove_dir(root: &OwnedFd, rel: &Path) -> std::io::Result<()> {
    let (dir, name) = parent_of(root, rel)?;
    rustix::fs::unlinkat(&dir, name, rustix::fs::AtFlags::REMOVEDIR).map_err(std::io::Error::from)
}

/// The directory that holds `rel`'s last component under `root`, reached without
/// following any link, and that component.
fn parent_of<'a>(root: &OwnedFd, rel: &'a Path) -> std::io::Result<(OwnedFd, &'a str)> {
    let parts = components(rel)?;
    let (name, dirs) = parts
        .split_last()
        .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut dir = open_one(root, ".", OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty())?;
    for d in dirs {
        dir = open_dir_usable(&dir, d)?;
    }
    Ok((dir, name))
}

/// Why a file the model left was not read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotRegular {
    /// A symlink, FIFO, socket, device or directory (named by `kind`).
    Special(&'static str),
    /// A regular file with other names elsewhere (a hard link).
    HardLink(u64),
    /// Larger than the cap.
    TooLarge(u64),
    /// Could not be opened or read.
    Io(String),
}

impl std::fmt::Display for NotRegular {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotRegular::Special(kind) => write!(f, "not a regular file ({kind})"),
            NotRegular::HardLink(n) => write!(f, "a hard link ({n} names)"),
            NotRegular::TooLarge(n) => write!(f, "{n} bytes, over the per-file cap"),
            NotRegular::Io(e) => write!(f, "unreadable: {e}"),
        }
    }
}

/// The kind of a file, in words.
pub fn kind_of(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_symlink() {
        "symlink"
    } else if t.is_dir() {
        "directory"
    } else if t.is_fifo() {
        "FIFO"
    } else if t.is_socket() {
        "socket"
    } else if t.is_block_device() || t.is_char_device() {
        "device"
    } else if t.is_file() {
        "regular file"
    } else {
        "unknown file type"
    }
}

fn kind_name(t: rustix::fs::FileType) -> &'static str {
    use rustix::fs::FileType;
    match t {
        FileType::Symlink => "symlink",
        FileType::Directory => "directory",
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::CharacterDevice | FileType::BlockDevice => "device",
        FileType::RegularFile => "regular file",
        FileType::Unknown => "unknown file type",
    }
}

/// Reads `rel` under `root` only if it is a regular file with one name and at most
/// `cap` bytes, checked on the open descriptor (opened non-blocking, so a FIFO
/// neither blocks the open nor the check).
pub fn read_regular(root: &OwnedFd, rel: &Path, cap: u64) -> Result<Vec<u8>, NotRegular> {
    read_regular_with_meta(root, rel, cap).map(|(bytes, _)| bytes)
}

/// [`read_regular`], with the metadata of the descriptor the bytes were read from (so
/// a caller can describe the very file it read, as git's index does).
pub fn read_regular_with_meta(
    root: &OwnedFd,
    rel: &Path,
    cap: u64,
) -> Result<(Vec<u8>, std::fs::Metadata), NotRegular> {
    use std::os::unix::fs::MetadataExt;
    let io = |e: std::io::Error| NotRegular::Io(e.to_string());
    let parts = components(rel).map_err(io)?;
    let (name, dirs) = parts.split_last().ok_or_else(|| NotRegular::Io("empty path".into()))?;
    let mut dir = open_one(root, ".", OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).map_err(io)?;
    for d in dirs {
        dir = open_one(&dir, d, OFlags::DIRECTORY | OFlags::RDONLY, Mode::empty()).map_err(io)?;
    }
    let fd = match open_one(
        &dir,
        name,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        // What could not be opened (a link: ELOOP, a socket: ENXIO) is named by its type.
        Err(e) => {
            return Err(
                match rustix::fs::statat(&dir, *name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
                    Ok(st) => match rustix::fs::FileType::from_raw_mode(st.st_mode) {
                        rustix::fs::FileType::RegularFile => io(e),
                        t => NotRegular::Special(kind_name(t)),
                    },
                    Err(_) => io(e),
                },
            )
        }
    };
    let f = std::fs::File::from(fd);
    let meta = f.metadata().map_err(io)?;
    if !meta.file_type().is_file() {
        return Err(NotRegular::Special(kind_of(meta.file_type())));
    }
    if meta.nlink() > 1 {
        return Err(NotRegular::HardLink(meta.nlink()));
    }
    if meta.len() > cap {
        return Err(NotRegular::TooLarge(meta.len()));
    }
    let mut bytes = Vec::new();
    f.take(cap.saturating_add(1)).read_to_end(&mut bytes).map_err(io)?;
    if bytes.len() as u64 > cap {
        return Err(NotRegular::TooLarge(bytes.len() as u64));
    }
    Ok((bytes, meta))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_new_writes_whole_files_through_a_temporary_name_and_never_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let root = open_root(dir.path()).unwrap();
        create_new(&root, Path::new("a/b/r.json"), b"{}").unwrap();
        assert_eq!(std::fs::read(dir.path().join("a/b/r.json")).unwrap(), b"{}");
        let e = create_new(&root, Path::new("a/b/r.json"), b"other").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(dir.path().join("a/b/r.json")).unwrap(), b"{}");
        let names: Vec<String> = std::fs::read_dir(dir.path().join("a/b"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["r.json"], "no temporary file is left");
        let temp = temp_name("r.json", 4242);
        assert!(temp.starts_with(".r.json.4242-") && temp.ends_with(".tmp"), "{temp}");
        assert_ne!(temp, temp_name("r.json", 4242), "a random part");
        assert_eq!(temp_owner(&temp), Some(4242));
        assert_eq!(temp_target(&temp), Some(("r.json", 4242)));
        assert_eq!(temp_owner(".r.json.4242.tmp"), Some(4242));
        assert_eq!(temp_owner("r.json"), None);
        assert_eq!(temp_owner(".r.json.tmp"), None);
        assert_eq!(temp_owner(".r.json.4242-zz.tmp"), None);
    }

    #[test]
    fn creates_levels_and_refuses_to_reuse_a_name() {
        let dir = tempfile::tempdir().unwrap();
        let root = open_root(dir.path()).unwrap();
        create_new(&root, Path::new("reports/t/2026-01-01/r.md"), b"one").unwrap();
        assert_eq!(
            std::fs::read(dir.path().join("reports/t/2026-01-01/r.md")).unwrap(),
            b"one"
        );
        let again = create_new(&root, Path::new("reports/t/2026-01-01/r.md"), b"two").unwrap_err();
        assert_eq!(again.kind(), std::io::ErrorKind::AlreadyExists);
        assert!(create_new(&root, Path::new("reports/../x"), b"x").is_err());
    }

    #[test]
    fn a_symlinked_directory_or_name_is_never_followed() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("reports")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("reports/t")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("f"), dir.path().join("reports/f")).unwrap();
        let root = open_root(dir.path()).unwrap();
        assert!(create_new(&root, Path::new("reports/t/2026/r.md"), b"x").is_err());
        assert!(create_new(&root, Path::new("reports/f"), b"x").is_err());
        assert_eq!(
            std::fs::read_dir(outside.path()).unwrap().count(),
            0,
            "nothing written through a link"
        );
        assert_eq!(
            read_regular(&root, Path::new("reports/f"), 10),
            Err(NotRegular::Special("symlink"))
        );
    }

    #[test]
    fn the_openat_fallback_refuses_links_too() {
        // As on a kernel without openat2 (the flag only ever moves to the fallback,
        // which is as strict, so other tests running meanwhile are unaffected).
        NO_OPENAT2.store(true, Ordering::Relaxed);
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("reports")).unwrap();
        std::os::unix::fs::symlink(outside.path(), dir.path().join("reports/t")).unwrap();
        let root = open_root(dir.path()).unwrap();
        assert!(create_new(&root, Path::new("reports/t/x.md"), b"x").is_err());
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        create_new(&root, Path::new("reports/u/x.md"), b"x").unwrap();
        assert_eq!(
            create_new(&root, Path::new("reports/u/x.md"), b"y").unwrap_err().kind(),
            std::io::ErrorKind::AlreadyExists
        );
    }

    #[test]
    fn reads_only_small_regular_files_with_one_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir_all(p.join("reports")).unwrap();
        std::fs::write(p.join("reports/a.md"), "hello").unwrap();
        std::fs::write(p.join("b.md"), "x").unwrap();
        std::fs::hard_link(p.join("b.md"), p.join("reports/hard")).unwrap();
        let root = open_root(p).unwrap();
        rustix::fs::mknodat(
            &root,
            "reports/fifo",
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        assert_eq!(read_regular(&root, Path::new("reports/a.md"), 5).unwrap(), b"hello");
        assert_eq!(
            read_regular(&root, Path::new("reports/a.md"), 4),
            Err(NotRegular::TooLarge(5))
        );
        assert_eq!(
            read_regular(&root, Path::new("reports/hard"), 5),
            Err(NotRegular::HardLink(2))
        );
        assert_eq!(
            read_regular(&root, Path::new("reports/fifo"), 5),
            Err(NotRegular::Special("FIFO"))
        );
    }
}
