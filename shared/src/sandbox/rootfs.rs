//! The tool worker's file-system view (issue 17, item 2): default-deny. In the
//! worker's mount namespace, before Landlock, a fresh tmpfs becomes the root. It
//! holds read-only binds of what programs need from the system (`/usr`, and `/bin`,
//! `/sbin`, `/lib*` as the host has them: symlinks or directories), the `/etc`
//! entries of [`ETC_ENTRIES`] (small files copied, or one bind of their snapshot, see
//! [`super::etc_view`]; the rest bound), a `/dev` of
//! [`DEV_NODES`], the worker's own `/proc`,
//! and the trees of the plan at their real paths (the repository and its masks, the
//! read roots, the write directories, the scratch). The worker pivots into it and
//! detaches the old root: no other host path exists for tools, so no host socket
//! either (`/run`, `/var/lib/<svc>`, `/srv`, a home directory), and
//! `/proc/self/mountinfo` lists only this tree. The root itself is read-only.
//!
//! Writable directories are overlays whose upper layers share one tmpfs of
//! `sandbox.write_bytes` (see [`super::writeback`]). A real directory is cloned
//! before the view is built (idmapped as root), mounted at a staging path only long
//! enough for the overlay to take it as its lower layer and for the worker to open
//! a descriptor of it, then detached.

use super::etc_view::EtcView;
use super::namespaces::{step, NamespacePlan, NsError};
use super::writeback::{Layer, WriteBack};
use kernel::mount::{clone_tree, ATTR_NODEV, ATTR_NOSUID, ATTR_RDONLY};
use rustix::mount::{
    fsconfig_create, fsconfig_set_flag, fsconfig_set_string, fsmount, fsopen, mount, move_mount, unmount, FsMountFlags,
    FsOpenFlags, MountAttrFlags, MountFlags, MoveMountFlags, UnmountFlags,
};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Top-level system directories, bound read-only when the host has them as
/// directories, made the same symlinks when it has links (a merged `/usr`).
pub const SYSTEM_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// What tools see of `/etc`: names and lookups (users, hosts, services), the dynamic
/// linker's cache, time zone, certificates, Debian's alternatives (links that
/// `/usr/bin` programs go through), interpreters' and git's system files, locale
/// aliases. Everything else there (credentials such as `npmrc` or `pip.conf`, service
/// configuration, `ld.so.preload`) is absent. Names may be nested (`ssl/certs`); a
/// name ending in `*` takes every entry of `/etc` that begins with it. More can be
/// added as `permissions.additional_directories`.
pub const ETC_ENTRIES: &[&str] = &[
    "passwd",
    "group",
    "nsswitch.conf",
    "host.conf",
    "hosts",
    "resolv.conf",
    "gai.conf",
    "services",
    "protocols",
    "networks",
    "shells",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "localtime",
    "timezone",
    "alternatives",
    "ssl/certs",
    "ssl/openssl.cnf",
    "ca-certificates",
    "ca-certificates.conf",
    "pki/ca-trust",
    "pki/tls/certs",
    "pki/tls/cert.pem",
    "pki/tls/openssl.cnf",
    "crypto-policies",
    "gitconfig",
    "mtab",
    "os-release",
    "lsb-release",
    "debian_version",
    "redhat-release",
    "system-release",
    "mime.types",
    "magic",
    "magic.mime",
    "inputrc",
    "bash.bashrc",
    "profile",
    "locale.alias",
    "locale.conf",
    "terminfo",
    "perl",
    "python*",
];

/// The device nodes of `/dev` (besides `fd`, `stdin`, `stdout` and `stderr`, links
/// into the worker's own `/proc`). No `tty` nor terminal multiplexer: tools run
/// without a terminal.
pub const DEV_NODES: &[&str] = &["null", "zero", "full", "random", "urandom"];

/// Where the new root's tmpfs is mounted while it is built: the first that is a
/// directory. Whatever it hides was cloned before.
const BASE_CANDIDATES: &[&str] = &["/tmp", "/mnt", "/var/tmp", "/run", "/media"];

/// The staging directory in the new root, removed before tools run.
const STAGE: &str = ".sandbox-stage";

/// A detached mount and its path (on the host, and the same in the new root).
pub(super) type Tree = (PathBuf, OwnedFd);

/// An entry of the new root taken from the host's view.
pub(super) enum SystemEntry {
    Link {
        path: PathBuf,
        target: PathBuf,
    },
    Mount {
        path: PathBuf,
        tree: OwnedFd,
        dir: bool,
    },
    /// A small regular file of `/etc`, copied (a mount costs about 0.1 ms, a copy a
    /// few microseconds; the copy is a snapshot taken as the worker starts).
    Copy {
        path: PathBuf,
        bytes: Vec<u8>,
        mode: u32,
    },
    /// A directory of a small `/etc` tree, made with its entries copied after it.
    Dir {
        path: PathBuf,
        mode: u32,
    },
}

/// What the new root is made of, cloned while the host's tree is still in view.
pub(super) struct Sources {
    /// The repository, the acceptance hand-over directory, the read roots.
    pub read_only: Vec<Tree>,
    /// The write directories and the scratch (writable clones: the overlays' lower
    /// layers and the write-back's targets).
    pub writable: Vec<Tree>,
    pub system: Vec<SystemEntry>,
}

/// Clones the system part of the new root ([`SYSTEM_DIRS`], `/etc` as `etc` has it,
/// [`DEV_NODES`]) from the host's view. `etc_snapshot` is the clone of `etc`'s
/// snapshot when the caller made it; else, when `etc` has a snapshot, it is cloned
/// here, and if that fails the small entries are copied.
pub(super) fn system_entries(etc: &EtcView, etc_snapshot: Option<OwnedFd>) -> Result<Vec<SystemEntry>, NsError> {
    let piece = "minimal root";
    let ro = ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV;
    let mut out = Vec::new();
    for d in SYSTEM_DIRS {
        step(piece, host_entry(&Path::new("/").join(d), ro, &mut out))?;
    }
    let snapshot = etc_snapshot.or_else(|| etc.snapshot().and_then(|s| clone_tree(s, ro, None).ok()));
    if let Some(s) = etc.snapshot().filter(|_| snapshot.is_some()) {
        super::etc_view::touch(s);
    }
    out.extend(step(
        piece,
        etc.entries(snapshot, &mut |path, out| host_entry(path, ro, out)),
    )?);
    for n in DEV_NODES {
        let path = Path::new("/dev").join(n);
        if path.symlink_metadata().is_ok_and(|m| m.file_type().is_char_device()) {
            // Device nodes need `nodev` off; read-only still lets them be written.
            let tree = step(piece, clone_tree(&path, ATTR_RDONLY | ATTR_NOSUID, None))?;
            out.push(SystemEntry::Mount { path, tree, dir: false });
        }
    }
    Ok(out)
}

/// One host entry: a link as a link, a directory or file as a clone with `set`;
/// absent, or of another kind, it is left out.
fn host_entry(path: &Path, set: u64, out: &mut Vec<SystemEntry>) -> std::io::Result<()> {
    let md = match path.symlink_metadata() {
        Ok(md) => md,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    };
    let t = md.file_type();
    if t.is_symlink() {
        out.push(SystemEntry::Link {
            path: path.to_path_buf(),
            target: std::fs::read_link(path)?,
        });
    } else if t.is_dir() || t.is_file() {
        let tree = clone_tree(path, set, None)
            .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        out.push(SystemEntry::Mount {
            path: path.to_path_buf(),
            tree,
            dir: t.is_dir(),
        });
    }
    Ok(())
}

/// The first of [`BASE_CANDIDATES`] that is a directory.
fn base_dir() -> Result<&'static Path, NsError> {
    BASE_CANDIDATES
        .iter()
        .map(Path::new)
        .find(|p| p.symlink_metadata().is_ok_and(|m| m.is_dir()))
        .ok_or_else(|| NsError {
            piece: "minimal root",
            source: std::io::Error::other(format!(
                "none of {} is a directory to build the new root on",
                BASE_CANDIDATES.join(", ")
            )),
        })
}

/// `p` (absolute) under `base`.
fn under(base: &Path, p: &Path) -> PathBuf {
    base.join(p.strip_prefix("/").unwrap_or(p))
}

fn attach(tree: &OwnedFd, at: &Path) -> std::io::Result<()> {
    move_mount(
        tree.as_fd(),
        "",
        rustix::fs::CWD,
        at,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(std::io::Error::from)
}

fn open_dir(p: &Path) -> std::io::Result<OwnedFd> {
    rustix::fs::open(
        p,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(std::io::Error::from)
}

/// Mounts an overlay of `lower` (read-only to it) and `upper` (with `work`, on the
/// same tmpfs) at `target`. `userxattr`: its marks are `user.` attributes, the ones a
/// user namespace may set.
fn overlay(lower: &Path, upper: &Path, work: &Path, target: &Path) -> std::io::Result<()> {
    let fs = fsopen("overlay", FsOpenFlags::FSOPEN_CLOEXEC)?;
    fsconfig_set_string(fs.as_fd(), "lowerdir", lower)?;
    fsconfig_set_string(fs.as_fd(), "upperdir", upper)?;
    fsconfig_set_string(fs.as_fd(), "workdir", work)?;
    fsconfig_set_flag(fs.as_fd(), "userxattr")?;
    fsconfig_create(fs.as_fd())?;
    let mnt = fsmount(
        fs.as_fd(),
        FsMountFlags::FSMOUNT_CLOEXEC,
        MountAttrFlags::MOUNT_ATTR_NOSUID | MountAttrFlags::MOUNT_ATTR_NODEV,
    )?;
    attach(&mnt, target)
}

/// The tmpfs options of the writable layer: `limit` bytes, and one inode per 4 KiB of
/// it (at least 1,024), so a million empty files cannot be copied to the host either.
fn writable_options(limit: u64) -> std::ffi::CString {
    let inodes = (limit / 4096).max(1024);
    // Digits and ASCII only: no NUL byte.
    std::ffi::CString::new(format!("size={limit},nr_inodes={inodes},mode=0700")).unwrap_or_default()
}

/// The mount flags of the new root's tmpfs mounts.
const TMPFS: MountFlags = MountFlags::NOSUID.union(MountFlags::NODEV);

/// Builds the new root from `sources` and pivots into it. Returns the write-back of
/// the write directories (the scratch, under the state directory, is not copied).
pub(super) fn build(plan: &NamespacePlan, sources: Sources) -> Result<WriteBack, NsError> {
    let base = base_dir()?;
    step(ROOT, mount("tmpfs", base, "tmpfs", TMPFS, c"mode=0755,size=4m"))?;
    let mut placer = SystemPlacer::new(base);
    for entry in sources.system {
        placer.place(entry)?;
    }
    place_dev_links(base)?;
    mount_proc(base)?;
    let state = plan.root.join(crate::layout::STATE_DIR);
    let state_masked = place_read_only(base, plan, &state, sources.read_only)?;
    let writable = place_writable(base, plan, &state, sources.writable)?;
    if state_masked {
        step(
            "state directory mask",
            rustix::mount::mount_remount(
                under(base, &state),
                MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
                c"",
            ),
        )?;
    }
    pivot(base, &writable.staged)?;
    Ok(WriteBack::new(writable.layers, writable.rw, plan.write_bytes))
}

/// The piece of the set-up an error of the root's own building names.
const ROOT: &str = "minimal root";

/// Places the system part of the new root under `base`, remembering the last parent
/// directory it made (most entries are siblings in `/etc`) and the process's umask
/// (a file created with its mode needs no `chmod` unless the umask took bits away).
struct SystemPlacer<'a> {
    base: &'a Path,
    umask: u32,
    made: PathBuf,
}

impl<'a> SystemPlacer<'a> {
    fn new(base: &'a Path) -> SystemPlacer<'a> {
        let umask = rustix::process::umask(rustix::fs::Mode::empty());
        rustix::process::umask(umask);
        SystemPlacer {
            base,
            umask: umask.bits(),
            made: PathBuf::new(),
        }
    }

    /// Creates the parent directories of `path`, unless they were the last made.
    fn make_parent(&mut self, path: &Path) -> Result<(), NsError> {
        if let Some(parent) = path.parent() {
            if parent != self.made {
                step(ROOT, std::fs::create_dir_all(parent))?;
                self.made = parent.to_path_buf();
            }
        }
        Ok(())
    }

    /// One entry of the system part, placed at its path under `base`.
    fn place(&mut self, entry: SystemEntry) -> Result<(), NsError> {
        match entry {
            SystemEntry::Link { path, target } => {
                let link = under(self.base, &path);
                self.make_parent(&link)?;
                step(ROOT, std::os::unix::fs::symlink(&target, &link))
            }
            SystemEntry::Copy { path, bytes, mode } => {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                let file = under(self.base, &path);
                self.make_parent(&file)?;
                let mut f = step(
                    ROOT,
                    std::fs::OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .mode(mode)
                        .open(&file),
                )?;
                step(ROOT, f.write_all(&bytes))?;
                if mode & self.umask != 0 {
                    step(ROOT, f.set_permissions(PermissionsExt::from_mode(mode)))?;
                }
                Ok(())
            }
            SystemEntry::Dir { path, mode } => {
                let dir = under(self.base, &path);
                step(ROOT, std::fs::create_dir_all(&dir))?;
                step(
                    ROOT,
                    std::fs::set_permissions(&dir, PermissionsExt::from_mode(mode | 0o700)),
                )
            }
            SystemEntry::Mount { path, tree, dir } => {
                let target = under(self.base, &path);
                // A mount point may be there already: `/etc`'s snapshot (read-only)
                // has one for each entry bound over it.
                if dir {
                    step(ROOT, std::fs::create_dir_all(&target))?;
                } else if target.symlink_metadata().is_err() {
                    self.make_parent(&target)?;
                    step(ROOT, std::fs::File::create(&target))?;
                }
                step(ROOT, attach(&tree, &target))
            }
        }
    }
}

/// `/dev/fd`, `/dev/stdin`, `/dev/stdout` and `/dev/stderr`: links into the worker's
/// own `/proc`.
fn place_dev_links(base: &Path) -> Result<(), NsError> {
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let link = under(base, &Path::new("/dev").join(name));
        step(ROOT, std::fs::create_dir_all(under(base, Path::new("/dev"))))?;
        step(ROOT, std::os::unix::fs::symlink(target, link))?;
    }
    Ok(())
}

/// The worker's own /proc, mounted while the host's is still in view (the kernel
/// lets a user namespace mount proc only where one is fully visible).
fn mount_proc(base: &Path) -> Result<(), NsError> {
    if super::simulated_missing("proc") {
        return Err(super::namespaces::simulated("pid namespace /proc"));
    }
    let proc_at = under(base, Path::new("/proc"));
    step(ROOT, std::fs::create_dir_all(&proc_at))?;
    step(
        "pid namespace /proc",
        mount(
            "proc",
            &proc_at,
            "proc",
            MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
            None,
        ),
    )
}

/// The repository, the hand-over directory and the read roots, parents first (a
/// read root above the repository must not cover it). Returns whether the state
/// directory `state` was masked (it is remounted read-only once the writable
/// directories beneath it are in place).
fn place_read_only(base: &Path, plan: &NamespacePlan, state: &Path, mut read_only: Vec<Tree>) -> Result<bool, NsError> {
    read_only.sort_by_key(|(p, _)| p.components().count());
    let mut state_masked = false;
    for (path, tree) in &read_only {
        let target = under(base, path);
        let _ = std::fs::create_dir_all(&target);
        step(ROOT, attach(tree, &target))?;
        // The repository is in place: hide its state directory before the scratch
        // and the hand-over directory are mounted back into it.
        if *path == plan.root && under(base, state).symlink_metadata().is_ok_and(|md| md.is_dir()) {
            state_masked = true;
            step(
                "state directory mask",
                mount(
                    "tmpfs",
                    under(base, state),
                    "tmpfs",
                    TMPFS | MountFlags::NOEXEC,
                    c"mode=0755,size=16k",
                ),
            )?;
        }
    }
    Ok(state_masked)
}

/// The piece of the set-up an error of the writable directories names.
const WRITABLE: &str = "size-limited writable directories (overlay on tmpfs)";

/// What [`place_writable`] left: the write-back's layers and writable layer, and the
/// staging paths of the lower layers (under the base), detached after the pivot.
struct Writable {
    layers: Vec<Layer>,
    rw: OwnedFd,
    staged: Vec<PathBuf>,
}

/// The writable layer (one tmpfs of `write_bytes`), then an overlay per writable
/// directory, outermost first.
fn place_writable(
    base: &Path,
    plan: &NamespacePlan,
    state: &Path,
    mut writable: Vec<Tree>,
) -> Result<Writable, NsError> {
    let stage = under(base, Path::new("/").join(STAGE).as_path());
    let rw = stage.join("rw");
    step(WRITABLE, std::fs::create_dir_all(&rw))?;
    step(
        WRITABLE,
        mount(
            "tmpfs",
            &rw,
            "tmpfs",
            TMPFS,
            writable_options(plan.write_bytes).as_c_str(),
        ),
    )?;
    writable.sort_by_key(|(p, _)| p.components().count());
    let mut placed: Vec<PathBuf> = Vec::new();
    let mut staged: Vec<PathBuf> = Vec::new();
    let mut layers = Vec::new();
    for (i, (path, tree)) in writable.into_iter().enumerate() {
        // Beneath an overlay already: the outer one holds its writes.
        if placed.iter().any(|p| path.starts_with(p)) {
            continue;
        }
        let lower = stage.join(format!("l{i}"));
        let (upper, work) = (rw.join(format!("u{i}")), rw.join(format!("w{i}")));
        let merged = under(base, &path);
        if super::simulated_missing("write_dir_gone") {
            // As a write directory another fire's tools removed since it was opened.
            return step(WRITABLE, Err(std::io::Error::from_raw_os_error(libc::ENOENT)));
        }
        overlay_tree(tree, &lower, &upper, &work, &merged)?;
        if !path.starts_with(state) {
            layers.push(Layer::new(
                path.clone(),
                step(WRITABLE, open_dir(&lower))?,
                step(WRITABLE, open_dir(&upper))?,
                step(WRITABLE, open_dir(&merged))?,
            ));
        }
        staged.push(lower);
        placed.push(path);
    }
    let rw = step(WRITABLE, open_dir(&rw))?;
    Ok(Writable { layers, rw, staged })
}

/// Mounts `tree` at the staging path `lower` and an overlay of it with `upper` and
/// `work` at `target`; the merged directory shows the upper layer's mode, so that
/// one is set to the real directory's.
fn overlay_tree(tree: OwnedFd, lower: &Path, upper: &Path, work: &Path, target: &Path) -> Result<(), NsError> {
    step(WRITABLE, std::fs::create_dir_all(lower))?;
    step(WRITABLE, attach(&tree, lower))?;
    drop(tree);
    step(WRITABLE, std::fs::create_dir_all(upper))?;
    step(WRITABLE, std::fs::create_dir_all(work))?;
    let mode = step(WRITABLE, std::fs::metadata(lower))?.mode() & 0o1777;
    step(
        WRITABLE,
        std::fs::set_permissions(upper, PermissionsExt::from_mode(mode)),
    )?;
    let _ = std::fs::create_dir_all(target);
    step(WRITABLE, overlay(lower, upper, work, target))
}

/// Into the new root at `base`; the old one is detached (pivot_root(".", ".")
/// stacks it on top of the new one, where unmounting takes it away). Then the
/// staging mounts `staged` (paths under `base`) and the staging directory go, and the
/// root becomes read-only.
fn pivot(base: &Path, staged: &[PathBuf]) -> Result<(), NsError> {
    step(ROOT, std::env::set_current_dir(base))?;
    step(ROOT, rustix::process::pivot_root(".", "."))?;
    step(ROOT, unmount(".", UnmountFlags::DETACH))?;
    step(ROOT, std::env::set_current_dir("/"))?;
    let stage = Path::new("/").join(STAGE);
    for l in staged {
        let l = under(Path::new("/"), l.strip_prefix(base).unwrap_or(l));
        step(ROOT, unmount(&l, UnmountFlags::DETACH))?;
        step(ROOT, std::fs::remove_dir(&l))?;
    }
    step(ROOT, unmount(stage.join("rw"), UnmountFlags::DETACH))?;
    step(ROOT, std::fs::remove_dir(stage.join("rw")))?;
    step(ROOT, std::fs::remove_dir(&stage))?;
    step(
        ROOT,
        rustix::mount::mount_remount(
            "/",
            MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
            c"",
        ),
    )
}
