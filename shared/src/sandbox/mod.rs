//! Sandbox *policy*: plain data saying what a sandboxed process may read, write and
//! connect to, derived from the repository layout and settings. Enforcement with
//! Landlock lives apart in [`landlock`], so the policy can be built, logged, sent to
//! the tool worker and tested without touching the kernel.

mod etc_view;
pub mod isolate;
pub mod landlock;
mod mask_links;
pub mod mask_walk;
pub mod namespaces;
pub mod rootfs;
pub mod seccomp;
pub mod writeback;

use crate::layout::{Owner, Ownership, STATE_DIR};
use crate::settings::{NetworkMode, NetworkSetting, RuntimeSettings};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// System locations a sandboxed process may read and execute from.
pub const SYSTEM_READ_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt", "/proc", "/sys", "/dev", "/run",
];

/// What one sandboxed process may do.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxSpec {
    /// Directories readable (and executable) beneath.
    pub read_dirs: Vec<PathBuf>,
    /// Directories writable beneath (create, write, remove, rename).
    pub write_dirs: Vec<PathBuf>,
    /// Single files writable (`/dev/null`).
    pub write_files: Vec<PathBuf>,
    /// TCP ports connect() may reach; everything else is refused (ABI 4+).
    pub connect_ports: Vec<u16>,
    /// Scope signals and abstract unix sockets to the sandbox (ABI 6+), and pathname
    /// UNIX sockets (ABI 9+: `connect` only to sockets the sandbox itself made).
    pub scope_ipc: bool,
    /// Use at most this Landlock ABI (from [`ABI_CAP_ENV`]), as on an older kernel.
    #[serde(default)]
    pub max_abi: Option<u32>,
}

/// Environment variable that caps the Landlock ABI the runtime uses, to check how a
/// fire behaves on an older kernel (`required` refuses below ABI 6).
pub const ABI_CAP_ENV: &str = "RUNTIME_LANDLOCK_ABI_CAP";

/// Test hook: a comma-separated list of layers to behave as missing (`userns`,
/// `idmap`, `seccomp`, `proc`: the worker's own `/proc`, mounted in its clone, as a
/// container whose `/proc` is partly covered refuses it; and `write_dir_gone`: a
/// write directory gone before the clone's overlay over it, `ENOENT`), to check that a fire fails closed and says why.
pub const SIMULATE_MISSING_ENV: &str = "RUNTIME_SANDBOX_SIMULATE_MISSING";

/// Whether [`SIMULATE_MISSING_ENV`] names `layer`.
pub fn simulated_missing(layer: &str) -> bool {
    std::env::var(SIMULATE_MISSING_ENV).is_ok_and(|v| v.split(',').any(|l| l.trim() == layer))
}

/// The cap from [`ABI_CAP_ENV`], if set.
pub fn abi_cap_from_env() -> Option<u32> {
    std::env::var(ABI_CAP_ENV).ok().and_then(|v| v.parse().ok())
}

/// The tool worker's sandbox: reads in system dirs, the repo (with its git
/// directories, `git_dirs`, which lie outside it in a linked worktree, so `git log`
/// works there as in a plain checkout) and the settings' extra read roots; writes only
/// where the write ACL points (never a builder path), the per-run scratch dir and
/// `/dev/null`; TCP only to granted ports.
pub fn worker_spec(
    root: &Path,
    git_dirs: &[PathBuf],
    scratch: &Path,
    s: &RuntimeSettings,
    ownership: &Ownership,
) -> SandboxSpec {
    let mut read_dirs = base_read_dirs(root, git_dirs);
    read_dirs.extend(s.permissions.additional_directories.iter().map(PathBuf::from));
    let mut write_dirs = vec![scratch.to_path_buf()];
    for dir in acl_dirs(&s.permissions.write) {
        if ownership.classify(&dir) != Owner::Builder {
            write_dirs.push(root.join(dir));
        }
    }
    let connect_ports = match &s.sandbox.network {
        NetworkSetting::Ports(p) => p.clone(),
        NetworkSetting::Mode(NetworkMode::None | NetworkMode::Provider) => Vec::new(),
    };
    SandboxSpec {
        read_dirs,
        write_dirs,
        write_files: vec![PathBuf::from("/dev/null")],
        connect_ports,
        scope_ipc: true,
        max_abi: abi_cap_from_env(),
    }
}

/// What every worker reads: the system directories, the repository and its git
/// directories outside it (a linked worktree's common directory).
pub fn base_read_dirs(root: &Path, git_dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut read_dirs: Vec<PathBuf> = SYSTEM_READ_DIRS.iter().map(PathBuf::from).collect();
    read_dirs.push(root.to_path_buf());
    read_dirs.extend(git_dirs.iter().filter(|d| !d.starts_with(root)).cloned());
    read_dirs
}

/// The runtime's own sandbox, entered before the loop: it may write its records, its
/// state and the repository's git directories (`git_dirs`, from `git::git_dirs`:
/// `<root>/.git`, or in a linked worktree its own git dir and the common dir), and
/// connect only to the provider's port(s).
pub fn runtime_spec(root: &Path, git_dirs: &[PathBuf], provider_ports: &[u16]) -> SandboxSpec {
    let mut write_dirs: Vec<PathBuf> = crate::layout::RUNTIME_DIRS.iter().map(|d| root.join(d)).collect();
    write_dirs.extend(git_dirs.iter().cloned());
    write_dirs.push(root.join(STATE_DIR));
    SandboxSpec {
        read_dirs: vec![PathBuf::from("/")],
        write_dirs,
        write_files: vec![PathBuf::from("/dev/null")],
        connect_ports: provider_ports.to_vec(),
        scope_ipc: false,
        max_abi: abi_cap_from_env(),
    }
}

/// The literal directory prefix of each write glob (`reports/**` -> `reports`).
pub fn acl_dirs(globs: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for g in globs {
        let lit: String = g.chars().take_while(|c| !matches!(c, '*' | '?' | '[' | '{')).collect();
        let dir = match lit.rfind('/') {
            Some(i) if lit.len() < g.len() => lit[..i].to_string(),
            _ if lit.len() < g.len() => String::new(),
            _ => lit.trim_end_matches('/').to_string(),
        };
        let dir = dir.trim_start_matches("./").to_string();
        if !dir.is_empty() && !out.contains(&dir) {
            out.push(dir);
        }
    }
    out
}

/// Creates the write directories so Landlock can open them (a missing path cannot
/// carry a rule and would silently lose its access). One inside the repository `root`
/// is made through plain directories only ([`crate::beneath::make_dirs`]): a level
/// that is a link (one a tool left) is refused, never followed. The repository's own
/// `.git` (the runtime's write directory; read-only to tools) may be a link.
pub fn prepare_dirs(spec: &SandboxSpec, root: &Path) -> std::io::Result<()> {
    for d in &spec.write_dirs {
        match beneath_repository(root, d) {
            Some(rel) => crate::beneath::make_dirs(root, rel)?,
            None => std::fs::create_dir_all(d)?,
        }
    }
    Ok(())
}

/// The write directory `dir` relative to the repository `root` when it is one tools
/// can reach links in: inside the repository, outside its `.git` (which tools never
/// write, and which may itself be a link: a worktree's, a submodule's). Such a
/// directory is made, and cloned for the worker, through plain directories only.
pub fn beneath_repository<'d>(root: &Path, dir: &'d Path) -> Option<&'d Path> {
    dir.strip_prefix(root).ok().filter(|rel| !rel.starts_with(".git"))
}

/// What the worker says when a write directory in the repository cannot be opened
/// through plain directories (a tool of another fire swapped a link in since the
/// runtime made it, or made a directory on the way unreadable): it refuses in every
/// mode but `off`, as an attack rather than a missing kernel layer (`best_effort`
/// would otherwise go on with less of the sandbox, the one downgrade such a link
/// could buy). A directory that is gone is only left out.
pub const UNREACHABLE_WRITE_DIR: &str = "a write directory is not reached through plain directories";

/// What the worker says when its masks cannot be had or mounted (the walk failed on a
/// directory it can enter but not list, or a mask's mount failed): like
/// [`UNREACHABLE_WRITE_DIR`], it refuses the worker in every mode but `off`. It is no
/// kernel layer missing; under `best_effort` the worker went on inside its half-made
/// sandbox without its masks, its capability drop and its process cap.
pub const DENY_MASKS: &str = "read deny masks";

/// [`DENY_MASKS`] for the masks over sockets.
pub const SOCKET_MASKS: &str = "socket masks";

/// A write directory in the repository, opened through plain directories only
/// ([`kernel::mount::open_beneath`]): `None` when it is gone, the refusal
/// ([`UNREACHABLE_WRITE_DIR`], naming it) for anything else on the way.
pub fn open_write_dir(root: &Path, rel: &Path) -> Result<Option<std::os::fd::OwnedFd>, std::io::Error> {
    match kernel::mount::open_beneath(root, rel) {
        Ok(dir) => Ok(Some(dir)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(std::io::Error::new(
            e.kind(),
            format!("{UNREACHABLE_WRITE_DIR}: {}: {e}", root.join(rel).display()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acl_dirs_are_literal_prefixes() {
        let g = |v: &[&str]| acl_dirs(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(
            g(&["reports/**", "cards/**", "out/a/*.txt", "./logs/x.log", "**"]),
            vec!["reports", "cards", "out/a", "logs/x.log"]
        );
    }

    #[test]
    fn worker_never_gets_builder_dirs() {
        let mut d = Vec::new();
        let mut s = crate::settings::parse_runtime_yaml(
            "version: 1\nprovider: {kind: replay, replay: x}\npermissions: {write: [\"reports/**\"]}\n",
            &mut d,
        )
        .unwrap();
        s.permissions.write.push("prompts/**".into());
        let own = Ownership::new("/repo");
        let git = [PathBuf::from("/repo/.git")];
        let spec = worker_spec(
            Path::new("/repo"),
            &git,
            Path::new("/repo/.runtime/scratch/r"),
            &s,
            &own,
        );
        assert_eq!(
            spec.write_dirs,
            vec![
                PathBuf::from("/repo/.runtime/scratch/r"),
                PathBuf::from("/repo/reports")
            ]
        );
        assert!(spec.connect_ports.is_empty());
        assert!(
            !spec.read_dirs.contains(&PathBuf::from("/repo/.git")),
            "read beneath the root already"
        );
    }

    #[test]
    fn a_linked_worktree_writes_its_git_dirs_not_a_dot_git_file() {
        let git = [PathBuf::from("/main/.git/worktrees/wt"), PathBuf::from("/main/.git")];
        let spec = runtime_spec(Path::new("/wt"), &git, &[8080]);
        assert!(spec.write_dirs.contains(&git[0]) && spec.write_dirs.contains(&git[1]));
        assert!(
            !spec.write_dirs.contains(&PathBuf::from("/wt/.git")),
            "{:?}",
            spec.write_dirs
        );
        assert!(!spec.write_dirs.iter().any(|d| d == Path::new("/main")));

        let s =
            crate::settings::parse_runtime_yaml("version: 1\nprovider: {kind: replay, replay: x}\n", &mut Vec::new())
                .unwrap();
        let w = worker_spec(
            Path::new("/wt"),
            &git,
            Path::new("/wt/.runtime/scratch/r"),
            &s,
            &Ownership::new("/wt"),
        );
        assert!(w.read_dirs.contains(&git[1]), "git log reads the common dir");
        assert!(
            !w.write_dirs.iter().any(|d| d.starts_with("/main")),
            "{:?}",
            w.write_dirs
        );
    }
}
