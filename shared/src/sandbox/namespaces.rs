//! Namespaces of the tool worker (issue 10, item 1). The worker, still unrestricted
//! and single-threaded, clones itself into fresh user, mount, PID, IPC and (unless
//! settings grant tools network) network namespaces; the clone is PID 1 of its
//! namespace and serves the tool calls, the original only waits for it and forwards
//! SIGTERM/SIGINT. Everything a call started is killed when the call ends (PID 1's
//! `kill(-1)`), and everything left dies with PID 1 at the end of the fire.
//!
//! The mount namespace is a minimal root of its own (see [`super::rootfs`]): the
//! system directories read-only, an allow-list of `/etc`, a small `/dev`, its own
//! `/proc`, and at their real paths the repository read-only, the write ACL's
//! directories and the run's scratch writable (`nosuid,nodev`, overlays whose writes
//! go to one tmpfs of `sandbox.write_bytes`, see [`super::writeback`]), `.git`
//! read-only with the rest of the repository, `.runtime` as an empty read-only tmpfs
//! (its task and commit locks and the state database are the runtime's alone: a tool
//! that could open them could flock them or hold an SQLite lock and block other
//! fires) with only the scratch and the acceptance hand-over directory mounted back,
//! and the read roots settings name. Every path a `Read` deny rule matches is masked
//! (files by `/dev/null`, directories by an empty read-only tmpfs), and so is every
//! UNIX socket found in the repository (all of `.git` included) and the read roots.
//!
//! Who the tools run as: the runtime's own uid when it is not root (mapped to itself;
//! the repository is its own, so the write directories stay writable). When the
//! runtime runs as root, tools run as `nobody` (65534) with no capability anywhere,
//! and see the repository through *idmapped* mounts made before the namespaces
//! exist (they need `CAP_SYS_ADMIN` in the initial namespace): the repository owner's
//! on-disk ids appear as 65534, so the write directories are writable for `nobody`
//! and what it writes is stored under the owner's ids; `git` sees a repository owned
//! by its user. No chown of builder files, no world-writable directory on disk.

use super::etc_view::EtcView;
use super::mask_walk::{self, Mask};
use super::rootfs::{self, Sources, Tree};
use super::writeback::WriteBack;
use super::SandboxSpec;
use kernel::mount::{clone_opened, clone_tree, ATTR_NODEV, ATTR_NOSUID, ATTR_RDONLY};
use kernel::process::{Cloned, Namespaces, Pid};
use rustix::mount::{mount, mount_bind, mount_change, MountFlags, MountPropagationFlags};
use serde::{Deserialize, Serialize};
use std::io::{PipeReader, PipeWriter, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The uid and gid tools run as when the runtime runs as root.
pub const UNPRIVILEGED_ID: u32 = 65534;

/// At most this many processes (threads included) of the tools' uid at once in the
/// worker's namespace (`RLIMIT_NPROC`, counted per user namespace): a fork bomb stops
/// there instead of filling the host's process table until the call's timeout.
pub const MAX_TOOL_PROCESSES: u64 = 1024;

/// What the worker's mount namespace shows, sent to it with its sandbox.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespacePlan {
    /// The repository: visible read-only.
    pub root: PathBuf,
    /// Directories outside the repository and the system shown read-only (a linked
    /// worktree's common git directory, `additional_directories`).
    pub read_dirs: Vec<PathBuf>,
    /// The write ACL's directories and the scratch: writable, `nosuid,nodev`.
    pub write_dirs: Vec<PathBuf>,
    /// `Read` deny globs (relative to the root): matched paths are masked.
    pub masked: Vec<String>,
    /// Settings grant tools network: the host network namespace is kept (Landlock
    /// scopes TCP to the granted ports, seccomp refuses everything but TCP).
    pub network: bool,
    /// `sandbox.write_bytes`: the size of the tmpfs every write of the worker's
    /// processes goes to.
    #[serde(default = "default_write_bytes")]
    pub write_bytes: u64,
    /// Where the list of paths to mask comes from.
    #[serde(default)]
    pub masks: MaskSource,
    /// Where the worker keeps what it makes for its sandbox (the `/etc` snapshots,
    /// the hand-over directory): `None` is the repository's state directory, as in a
    /// fire. `builder mcp pin` gives a directory of its own, so a pin writes nothing
    /// in the repository it pins (helper-115: a branch's link at
    /// `.runtime/sandbox-etc` had the snapshot's clean-up remove the person's files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
}

/// Where a worker gets the paths its namespace masks (see [`super::mask_walk`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum MaskSource {
    /// It walks for them itself, once its root is built.
    #[default]
    Walk,
    /// The runtime walks for them (with its cache) while the worker builds its root,
    /// and sends them as the line after the configuration: a [`MaskLine`].
    NextLine,
}

/// The line a [`MaskSource::NextLine`] worker reads: the paths to mask (as bytes: a
/// path need not be UTF-8), or why the runtime could not find them (the worker then
/// refuses to start).
pub type MaskLine = Result<Vec<(Vec<u8>, Mask)>, String>;

/// The [`MaskLine`] of the masks found (or why none could be).
pub fn mask_line(found: Result<Vec<(PathBuf, Mask)>, String>) -> MaskLine {
    use std::os::unix::ffi::OsStringExt;
    found.map(|found| {
        found
            .into_iter()
            .map(|(p, m)| (p.into_os_string().into_vec(), m))
            .collect()
    })
}

/// Reads the line after the worker's configuration, once.
pub type NextLine<'a> = &'a mut dyn FnMut() -> std::io::Result<Option<String>>;

fn default_write_bytes() -> u64 {
    crate::settings::SandboxSettings::default().write_bytes
}

impl NamespacePlan {
    /// The plan for a worker in `spec`: read dirs outside the system and the root are
    /// mounted back; write dirs as they are, their writes limited to `write_bytes`.
    pub fn new(spec: &SandboxSpec, root: &Path, masked: Vec<String>, write_bytes: u64) -> NamespacePlan {
        let system: Vec<PathBuf> = super::SYSTEM_READ_DIRS.iter().map(PathBuf::from).collect();
        NamespacePlan {
            root: root.to_path_buf(),
            read_dirs: spec
                .read_dirs
                .iter()
                .filter(|d| !system.contains(d) && !d.starts_with(root))
                .cloned()
                .collect(),
            write_dirs: spec.write_dirs.clone(),
            masked,
            network: !spec.connect_ports.is_empty(),
            write_bytes,
            masks: MaskSource::Walk,
            state_dir: None,
        }
    }

    /// Where the worker keeps what it makes for its sandbox ([`Self::state_dir`]).
    fn own_state_dir(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| self.root.join(crate::layout::STATE_DIR))
    }
}

/// A step of the set-up that failed: which piece, and the kernel's answer.
#[derive(Debug, thiserror::Error)]
#[error("{piece}: {source}")]
pub struct NsError {
    pub piece: &'static str,
    #[source]
    pub source: std::io::Error,
}

pub(super) fn step<T, E: Into<std::io::Error>>(piece: &'static str, r: Result<T, E>) -> Result<T, NsError> {
    r.map_err(|e| NsError {
        piece,
        source: e.into(),
    })
}

pub(super) fn simulated(piece: &'static str) -> NsError {
    NsError {
        piece,
        source: std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("simulated by {}", super::SIMULATE_MISSING_ENV),
        ),
    }
}

/// Why the worker entered no namespaces.
#[derive(Debug, thiserror::Error)]
pub enum NotEntered {
    /// A layer this host does not give (the clone, its id maps, a mount the kernel
    /// refuses in the clone's namespaces): the worker is as it was before [`enter`]
    /// (a clone that failed is gone), and `best_effort` may go on without namespaces.
    #[error("{0}")]
    Unavailable(String),
    /// No missing layer: a write directory reached through a link, masks that cannot
    /// be had, the file system's state failing the clone's root (see
    /// [`NotEntered::of_clone`]), a clone that ended without a report, or anything
    /// after the clone's root was built (the clone is then half made and cannot go
    /// back). Refuses the worker in every mode but `off`.
    #[error("{0}")]
    Refused(String),
}

/// The pieces whose failure is no missing kernel layer (see [`NotEntered::Refused`]).
const REFUSING: [&str; 3] = [super::UNREACHABLE_WRITE_DIR, super::DENY_MASKS, super::SOCKET_MASKS];

impl From<NsError> for NotEntered {
    fn from(e: NsError) -> NotEntered {
        if REFUSING.contains(&e.piece) {
            NotEntered::Refused(e.to_string())
        } else {
            NotEntered::Unavailable(e.to_string())
        }
    }
}

impl NotEntered {
    /// A failure of the clone while it builds its root. Only the kernel or the host
    /// refusing an operation (`EPERM`, `EACCES`, `EINVAL`, `ENOSYS`, `EOPNOTSUPP`,
    /// `ENODEV`: a mount type or a mount in a user namespace it does not allow) is a
    /// missing layer. The file system's state (a path gone or swapped for a link or a
    /// file, a full tmpfs, no memory), which another fire's tools can bring about
    /// between the runtime's checks and the clone's mounts, refuses: it must not buy a
    /// fire without namespaces.
    fn of_clone(e: NsError) -> NotEntered {
        use rustix::io::Errno;
        use std::io::ErrorKind;
        let refused_by_the_host = match e.source.raw_os_error() {
            Some(n) => [
                Errno::PERM,
                Errno::ACCESS,
                Errno::INVAL,
                Errno::NOSYS,
                Errno::OPNOTSUPP,
                Errno::NODEV,
            ]
            .contains(&Errno::from_raw_os_error(n)),
            // An error rebuilt with a path in its message (and the test hook's) keeps
            // only its kind: the same codes but `ENODEV`.
            None => matches!(
                e.source.kind(),
                ErrorKind::PermissionDenied | ErrorKind::InvalidInput | ErrorKind::Unsupported
            ),
        };
        match NotEntered::from(e) {
            NotEntered::Unavailable(why) if !refused_by_the_host => NotEntered::Refused(why),
            other => other,
        }
    }

    /// The clone's report of a root it could not build, for the original: a byte
    /// for the kind, then the reason.
    fn report(&self) -> Vec<u8> {
        let (kind, why) = match self {
            NotEntered::Unavailable(why) => (b'U', why),
            NotEntered::Refused(why) => (b'R', why),
        };
        [&[kind][..], why.as_bytes()].concat()
    }

    /// Reads a [`NotEntered::report`]; one cut short refuses.
    fn from_report(report: &[u8]) -> NotEntered {
        let why = String::from_utf8_lossy(report.get(1..).unwrap_or_default()).into_owned();
        match report.first() {
            Some(b'U') if !why.is_empty() => NotEntered::Unavailable(why),
            Some(b'R') if !why.is_empty() => NotEntered::Refused(why),
            _ => NotEntered::Refused("the worker's namespaces: the clone ended with an unreadable report".into()),
        }
    }
}

/// The trees of a plan, cloned: read-only ones, writable ones.
type Clones = (Vec<Tree>, Vec<Tree>);
/// What the original made before the clone: as root, the trees and `/etc`'s
/// snapshot cloned; and `/etc` walked.
type Premade = (Option<(Clones, Option<OwnedFd>)>, EtcView);

/// Enters the namespaces. Returns in the namespaced clone (PID 1, no capability left,
/// ready for Landlock and seccomp) with the write-back of its write directories; the
/// original process never returns from a successful call (it waits for the clone and
/// exits with its status). A clone that cannot build its root reports why to the
/// original and ends, so a layer this host lacks returns in the original, as it was
/// before the call. Must run while the process is single-threaded.
pub fn enter(plan: &NamespacePlan, next_line: NextLine<'_>) -> Result<WriteBack, NotEntered> {
    if super::simulated_missing("userns") {
        return Err(simulated("user namespaces").into());
    }
    let as_root = rustix::process::geteuid().is_root();
    let owner = step("repository owner", std::fs::metadata(&plan.root))?;
    let ids = if as_root {
        (UNPRIVILEGED_ID, UNPRIVILEGED_ID)
    } else {
        (rustix::process::geteuid().as_raw(), rustix::process::getegid().as_raw())
    };
    // `/etc` walked, and its snapshot made, as the runtime's user.
    let etc = EtcView::prepare(&plan.own_state_dir());
    // As root the trees are cloned and idmapped here, before the namespaces exist;
    // so is `/etc`'s snapshot (not idmapped: its files are root's, read as others').
    let premade = if as_root {
        if super::simulated_missing("idmap") {
            return Err(simulated("idmapped mounts").into());
        }
        let userns = step("idmapped mounts", idmap_userns(owner.uid(), owner.gid()))?;
        let etc_tree = etc
            .snapshot()
            .and_then(|s| clone_tree(s, ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV, None).ok());
        Some((clones(plan, Some(&userns))?, etc_tree))
    } else {
        None
    };
    let namespaces = Namespaces {
        net: !plan.network,
        ..Namespaces::ALL
    };
    let (release_r, release_w) = step("pipe", std::io::pipe())?;
    let (ready_r, ready_w) = step("pipe", std::io::pipe())?;
    let (built_r, built_w) = step("pipe", std::io::pipe())?;
    match step("user namespaces", kernel::process::clone(namespaces))? {
        Cloned::Child => {
            drop((release_w, ready_r, built_r));
            let pipes = ClonePipes {
                ready: ready_w,
                release: release_r,
                built: built_w,
            };
            in_clone(plan, next_line, ids, as_root, (premade, etc), pipes)
        }
        Cloned::Parent(pid) => {
            drop((release_r, ready_w, built_w));
            release_clone(pid, ids, as_root, premade, (ready_r, release_w, built_r))
        }
    }
}

/// The clone's ends of the pipes to the original: it says it is there (`ready`),
/// waits until its id maps are written (`release`), and reports on building its root
/// (`built`: [`BUILT`] once built, else a [`NotEntered::report`]).
struct ClonePipes {
    ready: PipeWriter,
    release: PipeReader,
    built: PipeWriter,
}

/// The clone's side of [`enter`]: says it is there, waits until the original has
/// written its id maps, then builds its view of the file system. A root it cannot
/// build, it reports to the original and ends there; anything failing after, it
/// refuses (see [`NotEntered::Refused`]).
fn in_clone(
    plan: &NamespacePlan,
    next_line: NextLine<'_>,
    ids: (u32, u32),
    as_root: bool,
    premade: Premade,
    pipes: ClonePipes,
) -> Result<WriteBack, NotEntered> {
    let ClonePipes { ready, release, built } = pipes;
    let _ = kernel::hardening::die_with_parent();
    // The worker is not dumpable (see `kernel::hardening`), nor is this copy of it:
    // its `/proc` files belong to root then, and an unprivileged original could
    // not write its id maps. Dumpable until `finish_clone` ends, running nothing else.
    let _ = kernel::hardening::set_dumpable(true);
    let mut w = ready;
    let _ = w.write_all(b"1");
    drop(w);
    let mut byte = [0u8; 1];
    let mut r = release;
    if !matches!(r.read(&mut byte), Ok(1)) {
        // The original could not write our id maps; it reports why. Leaving without
        // running the original's destructors.
        kernel::process::exit_now(1);
    }
    let write_back = match build_root(plan, ids, as_root, premade) {
        Ok(write_back) => write_back,
        Err(e) => {
            let mut built = built;
            let _ = built.write_all(&NotEntered::of_clone(e).report());
            // The original goes on (or refuses) as it was; this half-made copy ends
            // without running the original's destructors.
            kernel::process::exit_now(1);
        }
    };
    let mut built = built;
    let _ = built.write_all(BUILT);
    drop(built);
    finish_clone(plan, next_line).map_err(|e| {
        // Not dumpable again, whatever the worker does next in this process.
        let _ = kernel::hardening::set_dumpable(false);
        NotEntered::Refused(e.to_string())
    })?;
    Ok(write_back)
}

/// The original's side of [`enter`]: once the clone is there, writes its id maps and
/// lets it go on (the premade trees are the clone's now: the original's copies are
/// closed). Once the clone has built its root, supervises it until it ends; a clone
/// that could not is reaped, and its reason returned.
fn release_clone(
    pid: Pid,
    ids: (u32, u32),
    as_root: bool,
    premade: Option<(Clones, Option<OwnedFd>)>,
    (ready, release, built): (PipeReader, PipeWriter, PipeReader),
) -> Result<WriteBack, NotEntered> {
    let mut ready = ready;
    let _ = ready.read(&mut [0u8; 1]);
    drop(ready);
    if let Err(e) = write_maps(pid, ids, as_root) {
        kernel::process::kill_and_reap(pid);
        return Err(e.into());
    }
    drop(premade);
    let mut w = release;
    let _ = w.write_all(b"1");
    drop(w);
    let mut report = Vec::new();
    let mut built = built;
    let _ = built.read_to_end(&mut report);
    if report == BUILT {
        kernel::process::supervise(pid)
    }
    let status = kernel::process::wait(pid);
    if report.is_empty() {
        // Ended (killed, or a panic) before it could say.
        let status = status.map_or(-1, kernel::process::shell_code);
        return Err(NotEntered::Refused(format!(
            "the worker's namespaces: the clone ended while building its root (status {status})"
        )));
    }
    Err(NotEntered::from_report(&report))
}

/// What a clone that built its root sends on its `built` pipe before closing it.
const BUILT: &[u8] = b"B";

/// The id maps of the clone `pid`: 65534 to itself as root (the uid tools run as),
/// else the runtime's own ids to themselves.
fn write_maps(pid: Pid, (uid, gid): (u32, u32), as_root: bool) -> Result<(), NsError> {
    let write = |name: &str, text: String| {
        step(
            "user namespace id maps",
            std::fs::write(format!("/proc/{pid}/{name}"), text),
        )
    };
    if !as_root {
        write("setgroups", "deny".into())?;
    }
    write("uid_map", format!("{uid} {uid} 1\n"))?;
    write("gid_map", format!("{gid} {gid} 1\n"))
}

/// A user namespace whose map makes the repository owner's ids (`uid`, `gid`) appear
/// as 65534, for idmapped mounts.
fn idmap_userns(uid: u32, gid: u32) -> std::io::Result<OwnedFd> {
    kernel::namespaces::user_namespace(
        &format!("{uid} {UNPRIVILEGED_ID} 1\n"),
        &format!("{gid} {UNPRIVILEGED_ID} 1\n"),
    )
}

/// The plan's trees, cloned: the repository, the hand-over directory and the other
/// read dirs read-only; the write dirs (the scratch among them) writable.
fn clones(plan: &NamespacePlan, userns: Option<&OwnedFd>) -> Result<Clones, NsError> {
    let piece = if userns.is_some() {
        "idmapped mounts"
    } else {
        "mount namespace"
    };
    let ro = ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV;
    let mut read_only = vec![(plan.root.clone(), step(piece, clone_tree(&plan.root, ro, userns))?)];
    let handoff = handoff_dir(plan);
    if handoff.is_dir() {
        read_only.push((handoff.clone(), step(piece, clone_tree(&handoff, ro, userns))?));
    }
    for d in plan.read_dirs.iter().filter(|d| d.is_dir()) {
        read_only.push((d.clone(), step(piece, clone_tree(d, ro, userns))?));
    }
    let mut writable = Vec::new();
    for d in plan.write_dirs.iter().filter(|d| d.is_dir()) {
        if let Some(tree) = clone_write_dir(&plan.root, d, userns, piece)? {
            writable.push((d.clone(), tree));
        }
    }
    Ok((read_only, writable))
}

/// One write directory, cloned writable; `None` when it is gone. One in the
/// repository is reached through plain directories only: a link a tool of another
/// fire put on the way since the runtime checked it, or a directory on the way made
/// unreadable, fails the worker ([`super::UNREACHABLE_WRITE_DIR`], in every mode)
/// instead of making the link's target its write directory. Only the clone itself
/// failing is a missing layer (`piece`).
fn clone_write_dir(
    root: &Path,
    d: &Path,
    userns: Option<&OwnedFd>,
    piece: &'static str,
) -> Result<Option<OwnedFd>, NsError> {
    let rw = ATTR_NOSUID | ATTR_NODEV;
    let Some(rel) = super::beneath_repository(root, d) else {
        return step(piece, clone_tree(d, rw, userns)).map(Some);
    };
    let opened = super::open_write_dir(root, rel).map_err(|source| NsError {
        piece: super::UNREACHABLE_WRITE_DIR,
        source,
    })?;
    opened
        .map(|dir| step(piece, clone_opened(&dir, rw, userns)))
        .transpose()
}

/// In the clone: take the ids, build the minimal root and pivot into it.
fn build_root(
    plan: &NamespacePlan,
    (uid, gid): (u32, u32),
    as_root: bool,
    (premade, etc): Premade,
) -> Result<WriteBack, NsError> {
    if as_root {
        step("drop to nobody", rustix::thread::set_thread_groups(&[]))?;
        let gid = rustix::process::Gid::from_raw(gid);
        step("drop to nobody", rustix::thread::set_thread_res_gid(gid, gid, gid))?;
        let uid = rustix::process::Uid::from_raw(uid);
        step("drop to nobody", rustix::thread::set_thread_res_uid(uid, uid, uid))?;
        // A change of uid clears the parent-death signal: arm it again, so the
        // namespace (and every process in it) still dies with the worker. (The
        // worker cannot be gone yet: it waits for this clone's first answer.)
        let _ = kernel::hardening::die_with_parent();
    }
    step(
        "mount namespace",
        mount_change("/", MountPropagationFlags::PRIVATE | MountPropagationFlags::REC),
    )?;
    let ((read_only, writable), etc_tree) = match premade {
        Some(t) => t,
        None => (clones(plan, None)?, None),
    };
    let sources = Sources {
        read_only,
        writable,
        system: rootfs::system_entries(&etc, etc_tree)?,
    };
    rootfs::build(plan, sources)
}

/// In the clone, its root built: mask what `Read` deny rules name, drop every
/// capability, cap the processes, and leave the worker non-dumpable.
fn finish_clone(plan: &NamespacePlan, next_line: NextLine<'_>) -> Result<(), NsError> {
    mask_denied(plan, next_line)?;
    step("mount namespace", std::env::set_current_dir(&plan.root))?;
    step("drop capabilities", kernel::hardening::drop_capabilities())?;
    let cap = rustix::process::Rlimit {
        current: Some(MAX_TOOL_PROCESSES),
        maximum: Some(MAX_TOOL_PROCESSES),
    };
    step(
        "process cap",
        rustix::process::setrlimit(rustix::process::Resource::Nproc, cap),
    )?;
    // Tools run as this process's uid when the runtime is not root: left dumpable,
    // its `/proc/1/fd`, `pidfd_getfd` and `/proc/1/mem` would hand them the pipes to
    // the runtime (answers forged for the worker, an acceptance check passed).
    step("non-dumpable worker", kernel::hardening::set_dumpable(false))
}

/// Where the runtime hands the report to acceptance scripts: created here, before
/// the namespaces, so that it can be mounted back over the state directory's mask.
fn handoff_dir(plan: &NamespacePlan) -> PathBuf {
    let dir = plan.own_state_dir().join(crate::layout::HANDOFF_DIR);
    let _ = std::fs::create_dir_all(&dir);
    dir
}

/// Masks what [`super::mask_walk`] finds (walked here, or by the runtime and read
/// from the next line). A socket is masked by `/dev/null` mounted over it, so
/// `connect` is refused; a path gone since the runtime's walk has nothing left to
/// mask.
fn mask_denied(plan: &NamespacePlan, next_line: NextLine<'_>) -> Result<(), NsError> {
    let found = match plan.masks {
        MaskSource::Walk => mask_walk::plan_masks(plan, None)?,
        MaskSource::NextLine => {
            let line = step(super::DENY_MASKS, next_line())?.unwrap_or_default();
            let sent: MaskLine = step(
                super::DENY_MASKS,
                serde_json::from_str(&line).map_err(|e| std::io::Error::other(format!("unreadable mask line: {e}"))),
            )?;
            use std::os::unix::ffi::OsStringExt;
            let sent = step(super::DENY_MASKS, sent.map_err(std::io::Error::other))?;
            sent.into_iter()
                .map(|(p, m)| (PathBuf::from(std::ffi::OsString::from_vec(p)), m))
                .collect()
        }
    };
    for (path, mask) in found {
        let masked = match mask {
            Mask::Socket => step(super::SOCKET_MASKS, mount_bind("/dev/null", &path)),
            Mask::File => step(super::DENY_MASKS, mount_bind("/dev/null", &path)),
            Mask::Dir => step(
                super::DENY_MASKS,
                mount(
                    "tmpfs",
                    &path,
                    "tmpfs",
                    MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
                    c"size=4k",
                ),
            ),
        };
        match masked {
            // Gone since the runtime's walk: nothing left to mask. (Only the target:
            // a missing `/dev/null` still refuses the worker.)
            Err(e)
                if plan.masks == MaskSource::NextLine
                    && e.source.kind() == std::io::ErrorKind::NotFound
                    && path
                        .symlink_metadata()
                        .is_err_and(|m| m.kind() == std::io::ErrorKind::NotFound) => {}
            other => other?,
        }
    }
    Ok(())
}

/// Whether idmapped mounts of `root` can be made here, as a fire needs when the
/// runtime runs as root (`runtime check`); `Ok(false)` when not root (not needed).
pub fn probe_idmap(root: &Path) -> Result<bool, NsError> {
    if !rustix::process::geteuid().is_root() {
        return Ok(false);
    }
    if super::simulated_missing("idmap") {
        return Err(simulated("idmapped mounts"));
    }
    let owner = step("repository owner", std::fs::metadata(root))?;
    let userns = step("idmapped mounts", idmap_userns(owner.uid(), owner.gid()))?;
    step("idmapped mounts", clone_tree(root, ATTR_RDONLY, Some(&userns)))?;
    Ok(true)
}

/// Whether a tool worker's file-system view can be built here (`runtime check`): a
/// throwaway worker clone builds the minimal root for `root` (its `Read` deny masks
/// left out) with one write directory of its own behind a `write_bytes` overlay,
/// pivots into it, and exits.
pub fn probe_minimal_root(root: &Path, write_bytes: u64) -> Result<(), NsError> {
    if super::simulated_missing("userns") {
        return Err(simulated("user namespaces"));
    }
    let piece = "minimal root";
    let write = step(piece, tempfile::Builder::new().prefix("runtime-check-").tempdir())?;
    let plan = NamespacePlan {
        root: root.to_path_buf(),
        read_dirs: Vec::new(),
        write_dirs: vec![write.path().to_path_buf()],
        masked: Vec::new(),
        network: false,
        write_bytes,
        masks: MaskSource::Walk,
        state_dir: None,
    };
    let (mut r, w) = step("pipe", std::io::pipe())?;
    let pid = match step("user namespaces", kernel::process::clone(Namespaces::default()))? {
        Cloned::Child => {
            drop(r);
            let code = match enter(&plan, &mut || Ok(None)) {
                Ok(_) => 0,
                Err(e) => {
                    let mut w = w;
                    let _ = w.write_all(e.to_string().as_bytes());
                    1
                }
            };
            // The probe's copies leave without running the caller's destructors.
            kernel::process::exit_now(code);
        }
        Cloned::Parent(pid) => pid,
    };
    drop(w);
    let mut why = String::new();
    let _ = r.read_to_string(&mut why);
    // A wait that fails leaves the status at 0, as a probe that succeeded.
    let status = kernel::process::wait(pid).map_or(0, std::os::unix::process::ExitStatusExt::into_raw);
    if status == 0 {
        return Ok(());
    }
    Err(NsError {
        piece,
        source: std::io::Error::other(if why.is_empty() {
            format!("the probe ended with status {status}")
        } else {
            why
        }),
    })
}

/// Whether namespaces can be made here (`runtime check`): a clone into fresh user,
/// mount, PID, IPC and network namespaces that exits at once.
pub fn probe() -> Result<(), NsError> {
    if super::simulated_missing("userns") {
        return Err(simulated("user namespaces"));
    }
    step("user namespaces", kernel::namespaces::probe(Namespaces::ALL))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clones_report_reads_back_and_one_cut_short_refuses() {
        let unavailable: NotEntered = NsError {
            piece: "pid namespace /proc",
            source: std::io::Error::other("refused"),
        }
        .into();
        let refused: NotEntered = NsError {
            piece: super::super::DENY_MASKS,
            source: std::io::Error::other("cannot list"),
        }
        .into();
        for (sent, unavailable) in [(unavailable, true), (refused, false)] {
            let read = NotEntered::from_report(&sent.report());
            assert_eq!(read.to_string(), sent.to_string());
            assert_eq!(matches!(read, NotEntered::Unavailable(_)), unavailable, "{read}");
        }
        let in_clone = |piece, errno: i32| {
            NotEntered::of_clone(NsError {
                piece,
                source: std::io::Error::from_raw_os_error(errno),
            })
        };
        for errno in [libc::EPERM, libc::EINVAL, libc::ENODEV] {
            assert!(matches!(
                in_clone("pid namespace /proc", errno),
                NotEntered::Unavailable(_)
            ));
        }
        for errno in [libc::ENOENT, libc::ENOTDIR, libc::ELOOP, libc::ENOSPC] {
            assert!(
                matches!(in_clone("writable directories", errno), NotEntered::Refused(_)),
                "{errno}"
            );
        }
        assert!(matches!(
            in_clone(super::super::DENY_MASKS, libc::EPERM),
            NotEntered::Refused(_)
        ));
        assert!(matches!(
            NotEntered::of_clone(simulated("pid namespace /proc")),
            NotEntered::Unavailable(_)
        ));
        let rebuilt = |errno: i32| {
            let e = std::io::Error::from_raw_os_error(errno);
            NotEntered::of_clone(NsError {
                piece: "minimal root",
                source: std::io::Error::new(e.kind(), format!("/usr: {e}")),
            })
        };
        assert!(matches!(rebuilt(libc::EOPNOTSUPP), NotEntered::Unavailable(_)));
        assert!(matches!(rebuilt(libc::ENOENT), NotEntered::Refused(_)));
        for cut in [&b""[..], b"U", b"x why"] {
            assert!(
                matches!(NotEntered::from_report(cut), NotEntered::Refused(_)),
                "{cut:?}"
            );
        }
    }

    #[test]
    fn a_write_directory_reached_through_a_link_is_named_as_such() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        std::fs::create_dir_all(root.join("prompts")).unwrap();
        std::os::unix::fs::symlink("prompts", root.join("reports")).unwrap();
        std::fs::create_dir_all(root.join("out")).unwrap();
        std::os::unix::fs::symlink("../prompts", root.join("out/daily")).unwrap();
        std::fs::write(root.join("out/file"), "x").unwrap();
        for linked in ["reports", "out/daily", "out/file/x"] {
            let e = clone_write_dir(root, &root.join(linked), None, "mount namespace").unwrap_err();
            assert_eq!(e.piece, super::super::UNREACHABLE_WRITE_DIR, "{linked}: {e}");
            assert!(e.to_string().contains(linked), "{e}");
        }
        // A directory that is gone is left out: nothing to write there.
        assert!(clone_write_dir(root, &root.join("gone"), None, "mount namespace")
            .unwrap()
            .is_none());
    }
}
