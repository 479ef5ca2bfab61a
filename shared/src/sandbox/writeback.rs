//! What tools wrote in the write ACL's directories, copied into the repository by
//! trusted code (issue 17, item 6: a model must not fill the host disk). In the tool
//! worker's namespace each write directory is an overlay: the real directory is its
//! lower layer, read-only to the kernel's overlay code, and what tools write lands in
//! its upper layer, on one tmpfs of `sandbox.write_bytes` shared by every writable
//! directory of the worker (see [`super::rootfs`]). After each call, once every
//! process the call started is gone, the worker (PID 1 of the namespace, which runs no
//! model-chosen code) mirrors each upper layer into the real directory through
//! descriptors it opened before it restricted itself: new and changed files, links,
//! directories and FIFOs, and the deletions the overlay recorded as whiteouts and
//! opaque directories. So the host receives at most what the tmpfs could hold, and a
//! write past the limit fails in the tool with `ENOSPC`.
//!
//! Why not something simpler: `RLIMIT_FSIZE` bounds one file, not a directory (a
//! model writes a thousand files); disk quotas need the host's file system and its
//! administrator; a tmpfs over the write directory alone would hide the reports that
//! are already there. The overlay keeps the tools' view exactly the real directory
//! plus their own changes.
//!
//! Every path is walked one component at a time from a directory descriptor with
//! `O_NOFOLLOW` (and a mode is set with `fchmodat2`'s `AT_SYMLINK_NOFOLLOW`), so a
//! link a tool left (in the upper layer or, copied earlier, in the
//! real directory) is copied as a link and never followed. Files are written to a
//! temporary name and renamed into place, so a hard link the real directory held is
//! replaced, not written through. The overlay is not told that its lower layer
//! changed under it; the copy only ever makes the lower layer agree with what the
//! merged view already shows, and the bookkeeping below does not rely on the overlay
//! noticing: an entry copied earlier that is gone from the upper layer without a
//! whiteout is removed from the real directory too. The scratch directory (under
//! `.runtime/`) is an overlay on the same tmpfs but is never copied back.
//!
//! A git repository never reaches the repository (issue 17, item 6): an entry named
//! `.git` in any spelling git knows ([`crate::gitpath::is_dot_git`]), or the `HEAD`
//! of a directory that also holds `objects` and `refs`, or `commondir` (a bare
//! repository, [`bare_repository`]), is not
//! copied but removed through the merged view, so tools no longer see it either and
//! an engineer's `git` in that directory never runs its config or hooks. Every
//! changed entry is looked at, however many there are; the runtime names them in a
//! card ([`Synced::repositories`]).

use rustix::fs::{self as rfs, AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;
use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString, OsStr};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::gitpath::{forms_repository, REPOSITORY_ENTRIES};
use crate::tools::NestedRepository;

/// The overlay's opaque-directory mark with `userxattr` (the overlay is mounted in the
/// worker's user namespace): a directory removed and made again, whose old entries in
/// the lower layer are gone.
const OPAQUE_XATTR: &CStr = c"user.overlay.opaque";

/// The bits of a mode the copy keeps: no setuid or setgid (the seccomp filter would
/// refuse them, and a set-id file stored under the repository owner's ids is what that
/// filter exists to prevent), no sticky bit, and nothing writable by the group or
/// others: the copy is stored under the repository owner's ids, where a world-writable
/// report would let any local user change it before it is committed or read.
const MODE_BITS: u32 = 0o755;

/// When an entry of the upper layer last changed, as the copy saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    ino: u64,
    ctime: i64,
    ctime_ns: i64,
}

impl Stamp {
    fn of(st: &Stat) -> Stamp {
        Stamp {
            ino: st.st_ino,
            ctime: st.st_ctime,
            ctime_ns: st.st_ctime_nsec as i64,
        }
    }
}

/// One write directory: its real directory, its upper layer, the merged view tools
/// see, and what the last copy wrote (relative paths and the upper entries' stamps
/// then).
pub struct Layer {
    path: PathBuf,
    lower: OwnedFd,
    upper: OwnedFd,
    merged: OwnedFd,
    synced: HashMap<PathBuf, Stamp>,
    /// The bytes each regular file the copy wrote into the real directory takes (its
    /// blocks in the upper layer), while it is there.
    held: HashMap<PathBuf, u64>,
}

impl Layer {
    /// `path`: the directory as tools see it (for messages); `lower`, `upper`,
    /// `merged`: descriptors of the real directory, of the upper layer and of the
    /// overlay tools write through.
    pub fn new(path: PathBuf, lower: OwnedFd, upper: OwnedFd, merged: OwnedFd) -> Layer {
        Layer {
            path,
            lower,
            upper,
            merged,
            synced: HashMap::new(),
            held: HashMap::new(),
        }
    }
}

/// The write-back of one tool worker.
pub struct WriteBack {
    layers: Vec<Layer>,
    /// The tmpfs holding every upper layer and the scratch (for its free space).
    tmpfs: OwnedFd,
    limit: u64,
}

/// A path the copy could not bring into the repository, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotCopied {
    pub path: PathBuf,
    pub why: String,
}

/// What one copy did not bring into the repository.
#[derive(Debug, Default, PartialEq)]
pub struct Synced {
    pub problems: Vec<NotCopied>,
    pub repositories: Vec<NestedRepository>,
    /// The entries it made, replaced or removed in the real directories, as tools see
    /// them: files, links and FIFOs copied, entries removed (whiteouts), and
    /// directories removed and made again (their old entries gone).
    pub made: Vec<PathBuf>,
}

impl WriteBack {
    pub fn new(layers: Vec<Layer>, tmpfs: OwnedFd, limit: u64) -> WriteBack {
        WriteBack { layers, tmpfs, limit }
    }

    /// The directories the worker reaches by descriptor: the real write directories
    /// and the merged views (written) and the tmpfs of the upper layers (read), for
    /// Landlock.
    pub fn trusted_dirs(&self) -> Vec<super::landlock::TrustedDir<'_>> {
        let mut out: Vec<_> = self
            .layers
            .iter()
            .flat_map(|l| [l.lower.as_fd(), l.merged.as_fd()])
            .map(|dir| super::landlock::TrustedDir { dir, write: true })
            .collect();
        out.push(super::landlock::TrustedDir {
            dir: self.tmpfs.as_fd(),
            write: false,
        });
        out
    }

    /// The limit, in bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Whether the tmpfs is full (no block or no inode left): a tool's write failed
    /// or will fail with `ENOSPC`.
    pub fn full(&self) -> bool {
        rfs::fstatvfs(&self.tmpfs).is_ok_and(|v| v.f_bavail == 0 || v.f_favail == 0)
    }

    /// Copies what changed in every upper layer since the last call into the real
    /// directories. Must run when no tool process is left.
    /// The real directories receive at most `sandbox.write_bytes` from this worker
    /// in all (what it copied and they still hold): the upper layers never hold more,
    /// but a file with many names (hard links, one inode on the tmpfs) is copied once
    /// per name, and without the bound one 3 MB file linked 300 times put 900 MB on
    /// the host (helper-92).
    pub fn sync(&mut self) -> Synced {
        let mut synced = Synced::default();
        let held: u64 = self.layers.iter().flat_map(|l| l.held.values()).sum();
        let mut room = self.limit.saturating_sub(held);
        for layer in &mut self.layers {
            sync_layer(layer, &mut synced, &mut room);
        }
        synced
    }
}

/// One walk of a layer.
struct Walk<'a> {
    layer_path: &'a Path,
    merged: BorrowedFd<'a>,
    previous: &'a HashMap<PathBuf, Stamp>,
    now: HashMap<PathBuf, Stamp>,
    out: &'a mut Synced,
    /// The layer's [`Layer::held`], and the bytes the real directories may still take
    /// from this worker.
    held: &'a mut HashMap<PathBuf, u64>,
    room: &'a mut u64,
}

impl Walk<'_> {
    /// Takes room for the file `rel` (`st`: its upper entry) before it is copied, the
    /// bytes its earlier copy took given back first; refused past the room left.
    fn reserve(&mut self, rel: &Path, st: &Stat) -> std::io::Result<()> {
        let need = (st.st_blocks as u64).saturating_mul(512);
        let before = self.held.get(rel).copied().unwrap_or(0);
        let room = self.room.saturating_add(before);
        if need > room {
            return Err(std::io::Error::other(format!(
                "the repository already holds what this worker may write to it (`sandbox.write_bytes`; a file with several names is written once per name): {need} bytes more do not fit"
            )));
        }
        *self.room = room - need;
        self.held.insert(rel.to_path_buf(), need);
        Ok(())
    }

    /// Gives back the room of what the copy wrote at and below `rel`, removed.
    fn free(&mut self, rel: &Path) {
        let gone: Vec<PathBuf> = self.held.keys().filter(|p| p.starts_with(rel)).cloned().collect();
        for p in gone {
            *self.room = self.room.saturating_add(self.held.remove(&p).unwrap_or(0));
        }
    }

    fn fail(&mut self, rel: &Path, why: impl std::fmt::Display) {
        self.out.problems.push(NotCopied {
            path: self.layer_path.join(rel),
            why: why.to_string(),
        });
    }

    /// Notes how the copy of the entry `rel` went: a failure, or (`made`) an entry
    /// of its own brought into the real directory.
    fn done(&mut self, rel: &Path, done: std::io::Result<()>, made: bool) {
        match done {
            Err(e) => self.fail(rel, e),
            Ok(()) if made => self.out.made.push(self.layer_path.join(rel)),
            Ok(()) => {}
        }
    }

    /// What was copied from beneath `rel` before counts as still there: `rel` could
    /// not be listed or opened this time, and an entry not seen is not an entry
    /// gone (its removal from the real directory would lose what a tool wrote).
    fn keep_beneath(&mut self, rel: &Path) {
        self.keep_where(|p| p.starts_with(rel) && p != rel);
    }

    /// As [`Walk::keep_beneath`], for `rel` itself and what lies beneath it.
    fn keep(&mut self, rel: &Path) {
        self.keep_where(|p| p.starts_with(rel));
    }

    fn keep_where(&mut self, kept: impl Fn(&Path) -> bool) {
        let kept: Vec<(PathBuf, Stamp)> = self
            .previous
            .iter()
            .filter(|(p, _)| kept(p))
            .map(|(p, s)| (p.clone(), *s))
            .collect();
        self.now.extend(kept);
    }

    /// Removes the entry `rel` (of a repository at `repository`) through the merged
    /// view, and names the repository.
    fn remove_repository(&mut self, repository: &Path, rel: &Path) {
        let left = remove_path(self.merged, rel).err().map(|e| e.to_string());
        self.out.repositories.push(NestedRepository {
            path: self.layer_path.join(repository).to_string_lossy().into_owned(),
            left,
        });
    }

    /// Whether the entry at `rel` changed since the last copy (or is new).
    fn changed(&self, rel: &Path, stamp: Stamp) -> bool {
        self.previous.get(rel) != Some(&stamp)
    }
}

fn sync_layer(layer: &mut Layer, out: &mut Synced, room: &mut u64) {
    let mut walk = Walk {
        layer_path: &layer.path,
        merged: layer.merged.as_fd(),
        previous: &layer.synced,
        now: HashMap::new(),
        out,
        held: &mut layer.held,
        room,
    };
    sync_dir(&mut walk, layer.upper.as_fd(), layer.lower.as_fd(), Path::new(""));
    // Copied before, gone from the upper layer now, with no whiteout in its place:
    // the overlay did not know the real directory held it. Remove it there too.
    let gone: Vec<PathBuf> = layer
        .synced
        .keys()
        .filter(|p| !walk.now.contains_key(*p))
        .cloned()
        .collect();
    let now = std::mem::take(&mut walk.now);
    for rel in gone {
        // The room comes back only with the bytes (a removal that failed keeps them).
        match remove_path(layer.lower.as_fd(), &rel) {
            Ok(()) => walk.free(&rel),
            Err(e) => walk.fail(&rel, e),
        }
    }
    layer.synced = now;
}

/// Read and search lent to an upper directory whose mode a tool took them from
/// (`chmod 000 reports`: a write directory's root too, which no parent's open can
/// lend them to) for as long as the copy walks it; its mode is given back on drop.
/// The worker owns the upper layer, so it may.
struct Lent<'a> {
    dir: BorrowedFd<'a>,
    mode: Option<u32>,
}

impl<'a> Lent<'a> {
    fn to(dir: BorrowedFd<'a>) -> Lent<'a> {
        let mode = rfs::fstat(dir)
            .ok()
            .map(|st| st.st_mode & 0o7777)
            .filter(|m| m & 0o500 != 0o500)
            .filter(|m| rfs::fchmod(dir, Mode::from_raw_mode(m | 0o500)).is_ok());
        Lent { dir, mode }
    }
}

impl Drop for Lent<'_> {
    fn drop(&mut self) {
        if let Some(m) = self.mode {
            let _ = rfs::fchmod(self.dir, Mode::from_raw_mode(m));
        }
    }
}

/// The names in a directory, `.` and `..` left out.
fn entries(dir: BorrowedFd<'_>) -> std::io::Result<Vec<CString>> {
    let mut out = Vec::new();
    let mut d = rfs::Dir::read_from(dir)?;
    while let Some(e) = d.read() {
        let e = e?;
        let name = e.file_name();
        if name != c"." && name != c".." {
            out.push(name.to_owned());
        }
    }
    Ok(out)
}

fn rel_join(rel: &Path, name: &CStr) -> PathBuf {
    rel.join(OsStr::from_bytes(name.to_bytes()))
}

fn open_dir(dir: BorrowedFd<'_>, name: &CStr) -> rustix::io::Result<OwnedFd> {
    rfs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Opens `name` in the upper layer with `flags`; when its own mode forbids it (a tool
/// made it `000`), the worker, its owner, lends itself the bits `need` for the open
/// and gives the mode back.
fn open_upper(dir: BorrowedFd<'_>, name: &CStr, st: &Stat, flags: OFlags, need: u32) -> rustix::io::Result<OwnedFd> {
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match rfs::openat(dir, name, flags, Mode::empty()) {
        Err(Errno::ACCESS) => {
            let mode = st.st_mode & MODE_BITS;
            kernel::fs::chmod_nofollow(dir, name, mode | need).map_err(io_errno)?;
            let opened = rfs::openat(dir, name, flags, Mode::empty());
            let restored = kernel::fs::chmod_nofollow(dir, name, mode).map_err(io_errno);
            let fd = opened?;
            restored?;
            Ok(fd)
        }
        r => r,
    }
}

/// Mirrors the upper directory `up` into the real directory `low` (both at `rel`).
fn sync_dir(walk: &mut Walk<'_>, up: BorrowedFd<'_>, low: BorrowedFd<'_>, rel: &Path) {
    let _lent = Lent::to(up);
    let names = match entries(up) {
        Ok(n) => n,
        Err(e) => {
            walk.keep_beneath(rel);
            return walk.fail(rel, format!("cannot list it: {e}"));
        }
    };
    let (shaping, bare) = remove_bare_head(walk, up, low, rel, &names);
    for name in &names {
        let path = rel_join(rel, name);
        let mut st = match rfs::statat(up, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // A bare repository's `HEAD` removed above.
            Err(Errno::NOENT) => continue,
            Err(e) => {
                walk.keep(&path);
                walk.fail(&path, e);
                continue;
            }
        };
        if !is_whiteout(&st) && !plain_name(name) {
            // Stays in the tools' view, named in their result.
            walk.fail(&path, "the name holds control characters or is not UTF-8: git, terminals and the card would each show it as something else");
            continue;
        }
        let dot_git = std::str::from_utf8(name.to_bytes()).is_ok_and(crate::gitpath::is_dot_git);
        if dot_git && !is_whiteout(&st) {
            walk.remove_repository(&path, &path);
        }
        if (dot_git || (bare && name.as_c_str() == c"HEAD")) && !is_whiteout(&st) {
            // What the removal left in the upper layer: nothing (the real directory
            // held no such entry), a whiteout over the real one (removed below), or
            // the entry itself when it could not be removed (never copied).
            match rfs::statat(up, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
                Ok(now) if is_whiteout(&now) => st = now,
                _ => continue,
            }
        }
        let stamp = Stamp::of(&st);
        let changed = walk.changed(&path, stamp);
        walk.now.insert(path.clone(), stamp);
        let done = match FileType::from_raw_mode(st.st_mode) {
            _ if is_whiteout(&st) => {
                // A whiteout: the tool removed what the real directory holds here.
                if changed {
                    let removed = remove_entry(low, name).map_err(std::io::Error::from);
                    if removed.is_ok() {
                        walk.free(&path);
                    }
                    removed
                } else {
                    Ok(())
                }
            }
            FileType::Directory => {
                sync_subdir(walk, up, low, name, &st, &path, changed);
                Ok(())
            }
            FileType::RegularFile if changed => walk.reserve(&path, &st).and_then(|()| copy_file(up, low, name, &st)),
            FileType::Symlink if changed => copy_link(up, low, name),
            FileType::Fifo if changed => replace_with(low, name, |tmp| {
                rfs::mkfifoat(low, tmp, Mode::from_raw_mode(st.st_mode & MODE_BITS))
            }),
            // Sockets and device nodes are not data: they stay in the tools' view.
            _ => Ok(()),
        };
        let made = changed && (is_whiteout(&st) || copies(FileType::from_raw_mode(st.st_mode)));
        walk.done(&path, done, made);
    }
    if shaping && !bare {
        refuse_assembled_repository(walk, low, rel);
    }
}

/// A bare repository taking shape in the directory `rel` (`names`: its upper
/// entries), whichever of its three entries this call added: its `HEAD` goes, from
/// the tools' view and from the real directory. Whether one is taking shape, and
/// whether it is whole (its `HEAD` removed).
fn remove_bare_head(
    walk: &mut Walk<'_>,
    up: BorrowedFd<'_>,
    low: BorrowedFd<'_>,
    rel: &Path,
    names: &[CString],
) -> (bool, bool) {
    let shaping = names.iter().any(|n| REPOSITORY_ENTRIES.contains(&n.as_c_str()));
    let bare = shaping && bare_repository(up, low);
    if bare {
        walk.remove_repository(rel, &rel.join("HEAD"));
        if let Err(e) = remove_entry(low, c"HEAD") {
            walk.fail(&rel.join("HEAD"), e);
        }
    }
    (shaping, bare)
}

/// Whether `name` is UTF-8 without control characters: the only names the copy brings
/// into the repository (helper-102: a file named with an escape sequence or in another
/// encoding was left in the repository, on a card under a name that was not its own,
/// and stayed there after every later fire).
fn plain_name(name: &CStr) -> bool {
    std::str::from_utf8(name.to_bytes()).is_ok_and(|n| !n.chars().any(char::is_control))
}

/// Whether the copy brings an entry of this type into the real directory as an entry
/// of its own (not a directory, which it walks; not a socket or a device node, which
/// stay in the tools' view).
fn copies(kind: FileType) -> bool {
    matches!(kind, FileType::RegularFile | FileType::Symlink | FileType::Fifo)
}

fn sync_subdir(
    walk: &mut Walk<'_>,
    up: BorrowedFd<'_>,
    low: BorrowedFd<'_>,
    name: &CStr,
    st: &Stat,
    path: &Path,
    changed: bool,
) {
    // Git keeps no directory's mode: what a tool set serves only to stop the
    // runtime's own walks of the real directory (`chmod 311` leaves it unlistable).
    // Its owner keeps `rwx`.
    let mode = (st.st_mode & MODE_BITS) | 0o700;
    let up_child = match open_upper(up, name, st, OFlags::RDONLY | OFlags::DIRECTORY, 0o500) {
        Ok(fd) => fd,
        Err(e) => {
            walk.keep_beneath(path);
            return walk.fail(path, e);
        }
    };
    let low_child = match ensure_dir(low, name) {
        Ok(fd) => fd,
        Err(e) => {
            walk.keep_beneath(path);
            return walk.fail(path, e);
        }
    };
    if changed && is_opaque(up_child.as_fd()) {
        // Removed and made again by a tool: nothing of the real directory's old
        // content is in the merged view.
        walk.out.made.push(walk.layer_path.join(path));
        let _lent = Lent::to(up_child.as_fd());
        let listed = entries(up_child.as_fd());
        match listed.and_then(|keep| Ok((keep, entries(low_child.as_fd())?))) {
            Ok((keep, old)) => {
                let keep: HashSet<CString> = keep.into_iter().collect();
                for n in old.iter().filter(|n| !keep.contains(*n)) {
                    // Only what leaves the real directory gives its room back (the
                    // kept names hold theirs until copied again: helper-93, freeing
                    // the whole directory gave a call the full room once more).
                    let gone = rel_join(path, n);
                    match remove_entry(low_child.as_fd(), n) {
                        Ok(()) => walk.free(&gone),
                        Err(e) => walk.fail(&gone, e),
                    }
                }
            }
            Err(e) => walk.fail(path, e),
        }
    }
    sync_dir(walk, up_child.as_fd(), low_child.as_fd(), path);
    // The mode last, so a directory a tool made read-only still received its entries.
    if changed {
        if let Err(e) = rfs::fchmod(&low_child, Mode::from_raw_mode(mode)) {
            walk.fail(path, e);
        }
    }
}

/// A [`kernel::fs`] error as the errno the rest of this file speaks.
fn io_errno(e: std::io::Error) -> Errno {
    Errno::from_io_error(&e).unwrap_or(Errno::IO)
}

/// The overlay's mark of a removed entry: a character device numbered 0/0.
fn is_whiteout(st: &Stat) -> bool {
    FileType::from_raw_mode(st.st_mode) == FileType::CharacterDevice && st.st_rdev == 0
}

/// Whether the directory tools see (upper layer `up` over the real `low`) is what
/// git takes for a repository of its own (`is_git_directory`): a `HEAD` beside
/// `objects` and `refs`, or beside a `commondir` file (which points git at the
/// objects, refs and config of another directory, one the model may also have
/// made). An entry hidden by a whiteout is absent; one of an opaque directory's real
/// entries counts as present (refusing more, never less).
fn bare_repository(up: BorrowedFd<'_>, low: BorrowedFd<'_>) -> bool {
    forms_repository(|n| match rfs::statat(up, n, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) => !is_whiteout(&st),
        Err(Errno::NOENT) => rfs::statat(low, n, AtFlags::SYMLINK_NOFOLLOW).is_ok(),
        Err(_) => true,
    })
}

/// After the copy, the real directory `low` alone: another writer of it (a fire of
/// another task, an MCP server's worker) may have copied the rest of a repository
/// while this one copied its part. Each writer checks after it wrote, so the later of
/// two sees both parts and removes the `HEAD`.
fn refuse_assembled_repository(walk: &mut Walk<'_>, low: BorrowedFd<'_>, rel: &Path) {
    if forms_repository(|n| rfs::statat(low, n, AtFlags::SYMLINK_NOFOLLOW).is_ok()) {
        walk.remove_repository(rel, &rel.join("HEAD"));
        if let Err(e) = remove_entry(low, c"HEAD") {
            walk.fail(&rel.join("HEAD"), e);
        }
    }
}

fn is_opaque(dir: BorrowedFd<'_>) -> bool {
    let mut buf = [0u8; 4];
    matches!(rfs::fgetxattr(dir, OPAQUE_XATTR, &mut buf), Ok(n) if n >= 1 && buf[0] == b'y')
}

/// The real directory's `name` as a directory, made when absent and replacing any
/// other kind of entry there. Made writable for the worker while it copies into it.
fn ensure_dir(low: BorrowedFd<'_>, name: &CStr) -> rustix::io::Result<OwnedFd> {
    match rfs::statat(low, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
            if st.st_mode & 0o700 != 0o700 {
                kernel::fs::chmod_nofollow(low, name, (st.st_mode & MODE_BITS) | 0o700).map_err(io_errno)?;
            }
        }
        Ok(_) => {
            remove_entry(low, name)?;
            rfs::mkdirat(low, name, Mode::from_raw_mode(0o700))?;
        }
        Err(Errno::NOENT) => rfs::mkdirat(low, name, Mode::from_raw_mode(0o700))?,
        Err(e) => return Err(e),
    }
    open_dir(low, name)
}

/// The prefix of [`temp_name`]'s names.
const TEMP_PREFIX: &str = ".sandbox-copy-";

/// A name for a temporary entry beside the one it replaces.
fn temp_name() -> CString {
    let n: u64 = rand::random();
    // A hex string has no NUL byte.
    CString::new(format!("{TEMP_PREFIX}{n:016x}")).unwrap_or_default()
}

/// Whether `name` is one [`temp_name`] makes: a copy being written back, or one a
/// worker killed mid-copy left (never a tool's output).
pub fn is_temp_name(name: &str) -> bool {
    name.strip_prefix(TEMP_PREFIX)
        .is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Makes a temporary entry with `make`, then puts it in place of `name`.
fn replace_with(
    low: BorrowedFd<'_>,
    name: &CStr,
    make: impl FnOnce(&CStr) -> rustix::io::Result<()>,
) -> std::io::Result<()> {
    let tmp = temp_name();
    make(&tmp)?;
    put_in_place(low, &tmp, name)
}

/// Renames the temporary entry `tmp` over `name` (a directory there is removed first:
/// a rename cannot replace one with a file); on failure `tmp` is removed.
fn put_in_place(low: BorrowedFd<'_>, tmp: &CStr, name: &CStr) -> std::io::Result<()> {
    let placed = (|| {
        if let Ok(st) = rfs::statat(low, name, AtFlags::SYMLINK_NOFOLLOW) {
            if FileType::from_raw_mode(st.st_mode) == FileType::Directory {
                remove_entry(low, name)?;
            }
        }
        rfs::renameat(low, tmp, low, name)
    })();
    placed.map_err(|e| {
        let _ = rfs::unlinkat(low, tmp, AtFlags::empty());
        std::io::Error::from(e)
    })
}

fn copy_file(up: BorrowedFd<'_>, low: BorrowedFd<'_>, name: &CStr, st: &Stat) -> std::io::Result<()> {
    let src = open_upper(up, name, st, OFlags::RDONLY | OFlags::NONBLOCK, 0o400)?;
    let tmp = temp_name();
    let dst = rfs::openat(
        low,
        tmp.as_c_str(),
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    let written = (|| -> std::io::Result<()> {
        let from = std::fs::File::from(src);
        let mut to = std::fs::File::from(dst);
        copy_keeping_holes(&from, &mut to, st.st_size as u64)?;
        rfs::fchmod(&to, Mode::from_raw_mode(st.st_mode & MODE_BITS))?;
        let times = rfs::Timestamps {
            last_access: rfs::Timespec {
                tv_sec: st.st_atime,
                tv_nsec: st.st_atime_nsec as _,
            },
            last_modification: rfs::Timespec {
                tv_sec: st.st_mtime,
                tv_nsec: st.st_mtime_nsec as _,
            },
        };
        rfs::futimens(&to, &times)?;
        Ok(())
    })();
    if let Err(e) = written {
        // A full disk leaves no half copy behind.
        let _ = rfs::unlinkat(low, tmp.as_c_str(), AtFlags::empty());
        return Err(e);
    }
    put_in_place(low, &tmp, name)
}

/// Copies the `len` bytes of `from` into `to` keeping its holes: only the ranges
/// `SEEK_DATA` finds are written and the length is set last, so a sparse file takes
/// on the host what it took on the tools' tmpfs (`truncate -s 1G` takes nothing there;
/// copied byte for byte it took a gigabyte of the host's disk past
/// `sandbox.write_bytes`, helper-91).
fn copy_keeping_holes(from: &std::fs::File, to: &mut std::fs::File, len: u64) -> std::io::Result<()> {
    use std::io::{Read, Seek, SeekFrom};
    let mut at = 0;
    while at < len {
        let start = match rfs::seek(from, rfs::SeekFrom::Data(at)) {
            Ok(start) => start,
            // Nothing but a hole from `at` to the end.
            Err(Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let end = rfs::seek(from, rfs::SeekFrom::Hole(start))?.min(len);
        let mut reader = from;
        reader.seek(SeekFrom::Start(start))?;
        to.seek(SeekFrom::Start(start))?;
        let mut range = reader.take(end.saturating_sub(start));
        std::io::copy(&mut range, to)?;
        at = end.max(start + 1);
    }
    to.set_len(len)
}

fn copy_link(up: BorrowedFd<'_>, low: BorrowedFd<'_>, name: &CStr) -> std::io::Result<()> {
    let target = rfs::readlinkat(up, name, Vec::new())?;
    replace_with(low, name, |tmp| rfs::symlinkat(target.as_c_str(), low, tmp))
}

/// Removes `name` from `dir`, a directory with everything in it; absent is fine.
fn remove_entry(dir: BorrowedFd<'_>, name: &CStr) -> rustix::io::Result<()> {
    match rfs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(Errno::ISDIR) | Err(Errno::PERM) => {
            let child = match open_dir(dir, name) {
                Ok(fd) => fd,
                Err(Errno::NOTDIR) | Err(Errno::LOOP) => return rfs::unlinkat(dir, name, AtFlags::empty()),
                Err(Errno::ACCESS) => {
                    // A directory made unreadable: its owner (the worker) opens it up.
                    kernel::fs::chmod_nofollow(dir, name, 0o700).map_err(io_errno)?;
                    open_dir(dir, name)?
                }
                Err(e) => return Err(e),
            };
            let st = rfs::fstat(&child)?;
            if st.st_mode & 0o700 != 0o700 {
                rfs::fchmod(&child, Mode::from_raw_mode(0o700))?;
            }
            for n in entries(child.as_fd()).map_err(io_errno)? {
                remove_entry(child.as_fd(), &n)?;
            }
            match rfs::unlinkat(dir, name, AtFlags::REMOVEDIR) {
                Ok(()) | Err(Errno::NOENT) => Ok(()),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

/// Removes the entry at `rel` under `root`, walking its directories without following
/// links; a missing step means it is gone already.
fn remove_path(root: BorrowedFd<'_>, rel: &Path) -> rustix::io::Result<()> {
    let parts: Vec<CString> = rel.iter().filter_map(|c| CString::new(c.as_bytes()).ok()).collect();
    let Some((last, dirs)) = parts.split_last() else {
        return Ok(());
    };
    let mut held: Option<OwnedFd> = None;
    for d in dirs {
        let at = held.as_ref().map(|f| f.as_fd()).unwrap_or(root);
        match open_dir(at, d) {
            Ok(fd) => held = Some(fd),
            Err(Errno::NOENT) | Err(Errno::NOTDIR) | Err(Errno::LOOP) => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    remove_entry(held.as_ref().map(|f| f.as_fd()).unwrap_or(root), last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn dir_fd(p: &Path) -> OwnedFd {
        OwnedFd::from(std::fs::File::open(p).unwrap())
    }

    /// A layer over two plain directories (no overlay: the upper side is written as
    /// the overlay would, whiteouts included when the test can make them).
    /// The merged view is the upper directory itself: what is removed through it is
    /// gone from the upper layer, as in an overlay over a real directory that held no
    /// such entry.
    fn layer(t: &tempfile::TempDir) -> (PathBuf, PathBuf, Layer) {
        let (lower, upper) = (t.path().join("lower"), t.path().join("upper"));
        std::fs::create_dir_all(&lower).unwrap();
        std::fs::create_dir_all(&upper).unwrap();
        let l = Layer::new(
            PathBuf::from("/repo/reports"),
            dir_fd(&lower),
            dir_fd(&upper),
            dir_fd(&upper),
        );
        (lower, upper, l)
    }

    fn sync_all(l: &mut Layer) -> Synced {
        let (mut out, mut room) = (Synced::default(), u64::MAX);
        sync_layer(l, &mut out, &mut room);
        out
    }

    fn sync(l: &mut Layer) -> Vec<NotCopied> {
        let out = sync_all(l);
        assert_eq!(out.repositories, vec![]);
        out.problems
    }

    #[test]
    fn no_git_repository_reaches_the_real_directory_however_deep_or_spelled() {
        let t = tempfile::tempdir().unwrap();
        let (lower, upper, mut l) = layer(&t);
        // Past any entry count a walk of the real tree would stop at.
        std::fs::create_dir_all(upper.join("many")).unwrap();
        for i in 0..25_000 {
            std::fs::write(upper.join(format!("many/{i}")), "").unwrap();
        }
        std::fs::create_dir_all(upper.join("z/deep/n/.git/hooks")).unwrap();
        std::fs::write(
            upper.join("z/deep/n/.git/config"),
            "[core]\n\tfsmonitor = touch pwned\n",
        )
        .unwrap();
        std::fs::create_dir_all(upper.join("w")).unwrap();
        std::fs::write(upper.join("w/.GIT"), "gitdir: /elsewhere\n").unwrap();
        std::fs::create_dir_all(upper.join("b/objects")).unwrap();
        std::fs::create_dir_all(upper.join("b/refs")).unwrap();
        std::fs::write(upper.join("b/HEAD"), "ref: refs/heads/main\n").unwrap();
        // A `HEAD` and a `commondir` naming another directory's objects, refs and
        // config (which has no `HEAD` of its own).
        std::fs::create_dir_all(upper.join("c/objects")).unwrap();
        std::fs::create_dir_all(upper.join("c/refs")).unwrap();
        std::fs::write(upper.join("c/config"), "[core]\n\tfsmonitor = touch pwned\n").unwrap();
        std::fs::create_dir_all(upper.join("e")).unwrap();
        std::fs::write(upper.join("e/HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::write(upper.join("e/commondir"), "../c\n").unwrap();
        // `HEAD` alone, or beside only one of the two, is an ordinary file.
        std::fs::create_dir_all(upper.join("notes/refs")).unwrap();
        std::fs::write(upper.join("notes/HEAD"), "a file named HEAD\n").unwrap();
        let out = sync_all(&mut l);
        assert_eq!(out.problems, vec![]);
        let mut named: Vec<_> = out
            .repositories
            .iter()
            .map(|r| (r.path.clone(), r.left.clone()))
            .collect();
        named.sort();
        assert_eq!(
            named,
            vec![
                ("/repo/reports/b".to_string(), None),
                ("/repo/reports/e".to_string(), None),
                ("/repo/reports/w/.GIT".to_string(), None),
                ("/repo/reports/z/deep/n/.git".to_string(), None),
            ]
        );
        for gone in ["z/deep/n/.git", "w/.GIT", "b/HEAD", "e/HEAD"] {
            assert!(
                lower.join(gone).symlink_metadata().is_err(),
                "{gone} reached the real directory"
            );
            assert!(
                upper.join(gone).symlink_metadata().is_err(),
                "{gone} is still in the tools' view"
            );
        }
        assert!(lower.join("b/objects").is_dir() && lower.join("b/refs").is_dir());
        assert!(lower.join("z/deep/n").is_dir() && lower.join("many/24999").is_file());
        assert_eq!(
            std::fs::read_to_string(lower.join("notes/HEAD")).unwrap(),
            "a file named HEAD\n"
        );
    }

    #[test]
    fn a_repository_another_writer_completes_meanwhile_loses_its_head() {
        let t = tempfile::tempdir().unwrap();
        let (lower, _upper, mut l) = layer(&t);
        // This worker copied `objects` and `refs`; another wrote `HEAD` after this
        // one looked (its own check saw no `objects` yet).
        for d in ["objects", "refs"] {
            std::fs::create_dir_all(lower.join(d)).unwrap();
        }
        std::fs::write(lower.join("HEAD"), "ref: refs/heads/main\n").unwrap();
        let mut out = Synced::default();
        let mut walk = Walk {
            layer_path: &l.path,
            merged: l.merged.as_fd(),
            previous: &l.synced,
            now: HashMap::new(),
            out: &mut out,
            held: &mut l.held,
            room: &mut 0,
        };
        refuse_assembled_repository(&mut walk, l.lower.as_fd(), Path::new(""));
        assert_eq!(out.repositories.len(), 1, "{out:?}");
        assert!(lower.join("HEAD").symlink_metadata().is_err());
        assert!(lower.join("objects").is_dir());
    }

    #[test]
    fn a_bare_repository_assembled_over_calls_or_fires_loses_its_head() {
        let t = tempfile::tempdir().unwrap();
        let (lower, upper, mut l) = layer(&t);
        // A HEAD copied earlier, then `objects` and `refs` beside it: the HEAD goes.
        std::fs::create_dir_all(upper.join("later")).unwrap();
        std::fs::write(upper.join("later/HEAD"), "x").unwrap();
        assert_eq!(sync(&mut l), vec![]);
        assert!(lower.join("later/HEAD").is_file());
        std::fs::create_dir_all(upper.join("later/objects")).unwrap();
        std::fs::create_dir_all(upper.join("later/refs")).unwrap();
        let out = sync_all(&mut l);
        assert_eq!(out.repositories.len(), 1, "{out:?}");
        assert!(lower.join("later/HEAD").symlink_metadata().is_err());
        // A later fire's worker (an empty upper layer): the real directory holds the
        // HEAD, the tool adds `objects` and `refs`.
        let t2 = tempfile::tempdir().unwrap();
        let (lower, upper, mut l) = layer(&t2);
        std::fs::create_dir_all(lower.join("old")).unwrap();
        std::fs::write(lower.join("old/HEAD"), "ref: refs/heads/main\n").unwrap();
        std::fs::create_dir_all(upper.join("old/objects")).unwrap();
        std::fs::create_dir_all(upper.join("old/refs")).unwrap();
        let out = sync_all(&mut l);
        assert_eq!(out.repositories.len(), 1, "{out:?}");
        assert!(lower.join("old/HEAD").symlink_metadata().is_err());
        assert!(lower.join("old/objects").is_dir());
    }

    #[test]
    fn new_and_changed_files_links_and_directories_reach_the_real_directory() {
        let t = tempfile::tempdir().unwrap();
        let (lower, upper, mut l) = layer(&t);
        std::fs::write(lower.join("old.md"), "old").unwrap();
        std::fs::create_dir_all(upper.join("a/b")).unwrap();
        std::fs::write(upper.join("a/b/new.md"), "new").unwrap();
        std::os::unix::fs::symlink("../../etc/passwd", upper.join("a/link")).unwrap();
        std::fs::write(upper.join("old.md"), "changed").unwrap();
        std::fs::set_permissions(upper.join("old.md"), PermissionsExt::from_mode(0o000)).unwrap();
        assert_eq!(sync(&mut l), vec![]);
        assert_eq!(std::fs::read_to_string(lower.join("a/b/new.md")).unwrap(), "new");
        assert_eq!(
            std::fs::read_link(lower.join("a/link")).unwrap(),
            Path::new("../../etc/passwd"),
            "a link is copied as a link, not followed"
        );
        let old = std::fs::metadata(lower.join("old.md")).unwrap();
        assert_eq!(old.mode() & 0o777, 0o000, "the mode the tool set");
        std::fs::set_permissions(lower.join("old.md"), PermissionsExt::from_mode(0o644)).unwrap();
        assert_eq!(std::fs::read_to_string(lower.join("old.md")).unwrap(), "changed");
        assert_eq!(
            std::fs::metadata(upper.join("old.md")).unwrap().mode() & 0o777,
            0,
            "the upper file keeps its mode"
        );
        // Nothing changed: nothing is copied again (a file changed in the real
        // directory meanwhile stays as it is).
        std::fs::write(lower.join("a/b/new.md"), "host").unwrap();
        assert_eq!(sync(&mut l), vec![]);
        assert_eq!(std::fs::read_to_string(lower.join("a/b/new.md")).unwrap(), "host");
        // Gone from the upper layer without a whiteout: gone from the real one.
        std::fs::remove_file(upper.join("a/b/new.md")).unwrap();
        assert_eq!(sync(&mut l), vec![]);
        assert!(!lower.join("a/b/new.md").exists());
        assert!(lower.join("a/b").is_dir());
    }

    #[test]
    fn names_with_control_characters_or_not_utf8_stay_in_the_tools_view() {
        use std::os::unix::ffi::OsStrExt;
        let t = tempfile::tempdir().unwrap();
        let (lower, upper, mut l) = layer(&t);
        let odd = [
            std::ffi::OsStr::new("\u{1b}]0;pwn\u{7}.md"),
            std::ffi::OsStr::new("a\nb.md"),
            std::ffi::OsStr::from_bytes(b"\xff.md"),
        ];
        for name in odd {
            std::fs::write(upper.join(name), "x").unwrap();
        }
        std::fs::create_dir(upper.join("d\u{9b}")).unwrap();
        std::fs::write(upper.join("d\u{9b}/inside.md"), "x").unwrap();
        std::fs::write(upper.join("plain.md"), "x").unwrap();
        let problems = sync(&mut l);
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(
            problems.iter().all(|p| p.why.contains("control characters")),
            "{problems:?}"
        );
        let copied: Vec<_> = std::fs::read_dir(&lower)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(copied, vec![std::ffi::OsString::from("plain.md")]);
        assert!(upper.join(odd[0]).exists(), "the tools still see it");
    }

    /// A file with many names takes the real directory's room once per name: past the
    /// room the worker may use there, the rest are not copied (helper-92: 300 links
    /// of a 3 MB file put 900 MB on the host); a name removed gives its room back.
    #[test]
    fn hard_links_are_copied_only_within_the_room_the_worker_has() {
        let t = tempfile::tempdir().unwrap();
        let (lower, upper, mut l) = layer(&t);
        std::fs::write(upper.join("a"), vec![7u8; 100 * 1024]).unwrap();
        for i in 0..9 {
            std::fs::hard_link(upper.join("a"), upper.join(format!("link{i}"))).unwrap();
        }
        let mut room = 450 * 1024;
        let mut out = Synced::default();
        sync_layer(&mut l, &mut out, &mut room);
        let copied = std::fs::read_dir(&lower).unwrap().count();
        assert!((3..=4).contains(&copied), "{copied} names copied");
        assert_eq!(out.problems.len(), 10 - copied, "{:?}", out.problems);
        assert!(
            out.problems[0].why.contains("sandbox.write_bytes"),
            "{:?}",
            out.problems
        );
        let held: u64 = l.held.values().sum();
        assert!(held <= 450 * 1024 && room == 450 * 1024 - held, "{held} {room}");
        // A copied name removed by the tool gives its room back.
        let first = std::fs::read_dir(&lower).unwrap().next().unwrap().unwrap().file_name();
        std::fs::remove_file(upper.join(&first)).unwrap();
        let mut again = Synced::default();
        sync_layer(&mut l, &mut again, &mut room);
        assert!(!lower.join(&first).exists());
        assert_eq!(l.held.values().sum::<u64>() + room, 450 * 1024);
    }

    /// A directory a tool removed and made again (opaque in the upper layer) gives
    /// back only the room of what leaves the real directory: names it kept hold
    /// theirs (helper-93: freeing the whole directory gave each call the full room
    /// again, and the host grew past `sandbox.write_bytes` call by call).
    #[test]
    fn a_directory_made_again_keeps_the_room_of_what_stays() {
        let t = tempfile::tempdir().unwrap();
        let (lower, upper, mut l) = layer(&t);
        std::fs::create_dir(upper.join("d")).unwrap();
        for f in ["x", "y"] {
            std::fs::write(upper.join("d").join(f), vec![1u8; 100 * 1024]).unwrap();
        }
        let mut room = 250 * 1024;
        let mut out = Synced::default();
        sync_layer(&mut l, &mut out, &mut room);
        assert_eq!(out.problems, vec![]);
        rustix::fs::setxattr(upper.join("d"), OPAQUE_XATTR, b"y", rustix::fs::XattrFlags::empty()).unwrap();
        std::fs::write(upper.join("d/z"), vec![1u8; 100 * 1024]).unwrap();
        let mut again = Synced::default();
        sync_layer(&mut l, &mut again, &mut room);
        assert!(!lower.join("d/z").exists(), "the host got more than its room");
        assert!(
            again.problems.iter().any(|p| p.why.contains("sandbox.write_bytes")),
            "{:?}",
            again.problems
        );
        assert!(lower.join("d/x").exists() && lower.join("d/y").exists());
    }

    /// A sparse file reaches the real directory with its holes (helper-91: a 1 GiB
    /// `truncate` took a gigabyte of the host's disk), its bytes intact; every entry
    /// copied is named as made.
    #[test]
    fn a_sparse_file_keeps_its_holes_and_what_is_copied_is_named() {
        use std::io::{Seek, SeekFrom, Write};
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        let (lower, upper, mut l) = layer(&t);
        let mut f = std::fs::File::create(upper.join("sparse.bin")).unwrap();
        f.seek(SeekFrom::Start(64 << 20)).unwrap();
        f.write_all(b"middle").unwrap();
        f.set_len(256 << 20).unwrap();
        drop(f);
        std::fs::write(upper.join("dense.txt"), "dense").unwrap();
        let synced = sync_all(&mut l);
        assert_eq!(synced.problems, vec![]);
        let copied = std::fs::metadata(lower.join("sparse.bin")).unwrap();
        assert_eq!(copied.len(), 256 << 20);
        assert!(copied.blocks() * 512 < 1 << 20, "{} blocks", copied.blocks());
        let bytes = std::fs::read(lower.join("sparse.bin")).unwrap();
        assert_eq!(&bytes[64 << 20..(64 << 20) + 6], b"middle");
        assert!(bytes[..64 << 20].iter().all(|b| *b == 0));
        let mut made: Vec<_> = synced.made.iter().map(|p| p.file_name().unwrap().to_owned()).collect();
        made.sort();
        assert_eq!(made, ["dense.txt", "sparse.bin"]);
        // Nothing changed: nothing named again.
        assert_eq!(sync_all(&mut l).made, Vec::<PathBuf>::new());
    }

    #[test]
    fn a_directory_a_tool_closed_to_its_owner_reaches_the_real_directory_open_to_it() {
        let t = tempfile::tempdir().unwrap();
        let (lower, upper, mut l) = layer(&t);
        for (d, set, kept) in [("wx", 0o311, 0o711), ("none", 0o000, 0o700), ("ro", 0o555, 0o755)] {
            std::fs::create_dir_all(upper.join(d)).unwrap();
            std::fs::write(upper.join(d).join("f"), "x").unwrap();
            std::fs::set_permissions(upper.join(d), PermissionsExt::from_mode(set)).unwrap();
            assert_eq!(sync(&mut l), vec![], "{d}");
            let real = std::fs::metadata(lower.join(d)).unwrap().mode() & 0o7777;
            assert_eq!(real, kept, "{d}: {real:o}");
            assert_eq!(std::fs::read_to_string(lower.join(d).join("f")).unwrap(), "x");
        }
    }

    #[test]
    fn nothing_reaches_the_real_directory_writable_by_others() {
        let t = tempfile::tempdir().unwrap();
        let (lower, upper, mut l) = layer(&t);
        std::fs::create_dir_all(upper.join("ww")).unwrap();
        std::fs::write(upper.join("ww/f"), "x").unwrap();
        std::fs::set_permissions(upper.join("ww/f"), PermissionsExt::from_mode(0o777)).unwrap();
        std::fs::set_permissions(upper.join("ww"), PermissionsExt::from_mode(0o1777)).unwrap();
        assert_eq!(sync(&mut l), vec![]);
        let mode = |p: &str| std::fs::metadata(lower.join(p)).unwrap().mode() & 0o7777;
        assert_eq!(mode("ww/f"), 0o755);
        assert_eq!(mode("ww"), 0o755);
    }

    #[test]
    fn a_hard_link_in_the_real_directory_is_replaced_not_written_through() {
        let t = tempfile::tempdir().unwrap();
        let (lower, upper, mut l) = layer(&t);
        std::fs::write(t.path().join("builder.md"), "builder").unwrap();
        std::fs::hard_link(t.path().join("builder.md"), lower.join("hard.md")).unwrap();
        std::fs::write(upper.join("hard.md"), "model").unwrap();
        assert_eq!(sync(&mut l), vec![]);
        assert_eq!(std::fs::read_to_string(lower.join("hard.md")).unwrap(), "model");
        assert_eq!(std::fs::read_to_string(t.path().join("builder.md")).unwrap(), "builder");
    }

    #[test]
    fn a_link_in_the_real_directory_is_never_followed() {
        let t = tempfile::tempdir().unwrap();
        let (lower, upper, mut l) = layer(&t);
        let outside = t.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        // The real directory holds a link where the tool now has a directory.
        std::os::unix::fs::symlink(&outside, lower.join("d")).unwrap();
        std::fs::create_dir_all(upper.join("d")).unwrap();
        std::fs::write(upper.join("d/f"), "x").unwrap();
        assert_eq!(sync(&mut l), vec![]);
        assert!(lower.join("d").symlink_metadata().unwrap().is_dir());
        assert_eq!(std::fs::read_to_string(lower.join("d/f")).unwrap(), "x");
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "nothing written through the link"
        );
        // A file replacing a directory, and the other way round.
        std::fs::remove_dir_all(upper.join("d")).unwrap();
        std::fs::write(upper.join("d"), "file now").unwrap();
        assert_eq!(sync(&mut l), vec![]);
        assert_eq!(std::fs::read_to_string(lower.join("d")).unwrap(), "file now");
    }
}
