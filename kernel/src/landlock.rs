//! Landlock on the calling thread and everything it creates afterwards: which ABI the
//! kernel offers, which rights each ABI handles, and [`restrict_self`], which applies
//! one ruleset of paths, descriptors and TCP ports. Handles every right of ABI 6:
//! Refer (cross-directory rename and link), Truncate, IoctlDev, TCP connect/bind, and
//! signal / abstract-socket scoping; and, when the kernel offers ABI 9,
//! `LANDLOCK_ACCESS_FS_RESOLVE_UNIX` for a ruleset that scopes its IPC: `connect` to
//! a pathname UNIX socket is refused unless a process of the same Landlock domain
//! made the socket. No directory is granted the right, so a host daemon's socket is
//! out of reach wherever it is. Which paths and ports, and what a mode requires, is
//! the caller's policy.

use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, BitFlags, NetPort, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreated, RulesetCreatedAttr, RulesetError, RulesetStatus, Scope, ABI,
};
use std::os::fd::BorrowedFd;
use std::path::PathBuf;

/// The ABI `landlock: required` needs: every right below it is enforced.
pub const TARGET_ABI: ABI = ABI::V6;

/// The newest ABI whose rights this code asks for when the kernel offers them: 7 and
/// 8 add no access right, 9 adds `RESOLVE_UNIX`. This kernel's ABI shows in `runtime
/// check`; ABI 9 (Linux 7.1) could not be run here (the CI kernel offers 7), so its
/// use is checked by [`rights_of`]'s unit test, not against a kernel.
pub const NEWEST_HANDLED_ABI: ABI = ABI::V9;

/// A directory the sandboxed process itself reaches through a descriptor it opened
/// before restricting itself, not through a path (the tool worker's write-back: the
/// real write directories and the layer tools wrote into): granted by descriptor, so
/// no path leads a tool to it.
pub struct TrustedDir<'a> {
    pub dir: BorrowedFd<'a>,
    pub write: bool,
}

/// The Landlock ABI the running kernel supports (0: none).
pub fn kernel_abi() -> u32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: the documented version query: NULL attr, size 0, VERSION flag.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if v < 0 {
        0
    } else {
        v as u32
    }
}

/// Rights this kernel will enforce for our target ABI, as readable names.
pub fn supported_rights(abi: u32) -> Vec<String> {
    if abi == 0 {
        return Vec::new();
    }
    let by_abi: [(u32, &[&str]); 7] = [
        (1, &["fs.read", "fs.write", "fs.execute"]),
        (2, &["fs.refer"]),
        (3, &["fs.truncate"]),
        (4, &["net.connect_tcp", "net.bind_tcp"]),
        (5, &["fs.ioctl_dev"]),
        (6, &["scope.signal", "scope.abstract_unix_socket"]),
        (9, &["fs.resolve_unix"]),
    ];
    by_abi
        .iter()
        .filter(|(from, _)| abi >= *from)
        .flat_map(|(_, names)| names.iter().map(|n| n.to_string()))
        .collect()
}

/// The file-system rights of one ruleset at `abi`: those it handles, and those it
/// grants beneath the read directories, the write directories and the single
/// writable files. `RESOLVE_UNIX` (ABI 9) is handled only for a sandbox that scopes
/// its IPC and granted nowhere: connecting to a socket of the same domain needs no
/// grant, and a grant on a write directory would let a host daemon listening there
/// be reached.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FsRights {
    pub handled: BitFlags<AccessFs>,
    pub read: BitFlags<AccessFs>,
    pub write_dir: BitFlags<AccessFs>,
    pub write_file: BitFlags<AccessFs>,
}

/// [`FsRights`] at `abi` (already capped by the kernel and [`NEWEST_HANDLED_ABI`]).
pub fn rights_of(abi: ABI, scope_ipc: bool) -> FsRights {
    let mut handled = AccessFs::from_all(abi);
    if !scope_ipc {
        handled.remove(AccessFs::ResolveUnix);
    }
    let mut write_dir = handled;
    write_dir.remove(AccessFs::ResolveUnix);
    FsRights {
        handled,
        read: AccessFs::from_read(abi),
        write_dir,
        write_file: write_dir & AccessFs::from_file(abi),
    }
}

/// One ruleset: what the restricted thread may still reach.
pub struct Rules<'a> {
    /// Directories readable (and executable) beneath.
    pub read_dirs: &'a [PathBuf],
    /// Directories writable beneath (create, write, remove, rename).
    pub write_dirs: &'a [PathBuf],
    /// Single writable files.
    pub write_files: &'a [PathBuf],
    /// Directories granted by descriptor.
    pub trusted: &'a [TrustedDir<'a>],
    /// TCP ports `connect` may reach (ABI 4+).
    pub connect_ports: &'a [u16],
    /// Scope signals and abstract UNIX sockets (ABI 6+), and pathname UNIX sockets
    /// (ABI 9+).
    pub scope_ipc: bool,
}

/// Restricts the calling thread (and its future children) to `rules`, asking for the
/// rights of `abi` (capped at [`NEWEST_HANDLED_ABI`]); paths that do not exist are
/// left out (they cannot carry a rule). Returns how much the kernel enforces.
pub fn restrict_self(rules: &Rules<'_>, abi: u32) -> Result<RulesetStatus, RulesetError> {
    let use_abi = ABI::from(abi.min(NEWEST_HANDLED_ABI as u32) as i32);
    let fs = rights_of(use_abi, rules.scope_ipc);
    let mut ruleset = Ruleset::default().handle_access(fs.handled)?;
    // Rights an ABI does not have are left out rather than requested empty.
    let net = AccessNet::from_all(use_abi);
    if !net.is_empty() {
        ruleset = ruleset.handle_access(net)?;
    }
    let scopes = Scope::from_all(use_abi);
    if rules.scope_ipc && !scopes.is_empty() {
        ruleset = ruleset.scope(scopes)?;
    }
    let mut created = add_paths(ruleset.create()?, rules, &fs)?;
    for port in rules.connect_ports.iter().filter(|_| !net.is_empty()) {
        created = created.add_rule(NetPort::new(*port, AccessNet::ConnectTcp))?;
    }
    Ok(created.restrict_self()?.ruleset)
}

/// The path and descriptor rules of `rules`, with the rights of `fs`.
fn add_paths(created: RulesetCreated, rules: &Rules<'_>, fs: &FsRights) -> Result<RulesetCreated, RulesetError> {
    let existing = |paths: &[PathBuf]| paths.iter().filter(|p| p.exists()).cloned().collect::<Vec<_>>();
    let mut created = created
        .add_rules(path_beneath_rules(existing(rules.read_dirs), fs.read))?
        .add_rules(path_beneath_rules(existing(rules.write_dirs), fs.write_dir))?
        .add_rules(path_beneath_rules(existing(rules.write_files), fs.write_file))?;
    for t in rules.trusted {
        let access = if t.write { fs.write_dir } else { fs.read };
        created = created.add_rule(PathBeneath::new(t.dir, access))?;
    }
    Ok(created)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolve_unix_is_handled_from_abi_9_for_the_tool_worker_and_granted_nowhere() {
        let at9 = rights_of(ABI::V9, true);
        assert!(at9.handled.contains(AccessFs::ResolveUnix), "{at9:?}");
        for granted in [at9.read, at9.write_dir, at9.write_file] {
            assert!(!granted.contains(AccessFs::ResolveUnix), "{at9:?}");
        }
        // The rest of the write rights are still granted beneath write directories.
        assert!(at9
            .write_dir
            .contains(AccessFs::MakeSock | AccessFs::Refer | AccessFs::WriteFile));
        // Not handled below ABI 9 (the kernel would refuse the ruleset), nor for the
        // runtime's own sandbox (its git and signing may use sockets anywhere).
        assert!(!rights_of(ABI::V7, true).handled.contains(AccessFs::ResolveUnix));
        assert!(!rights_of(ABI::V9, false).handled.contains(AccessFs::ResolveUnix));
        assert_eq!(
            rights_of(ABI::V6, true),
            rights_of(ABI::V7, true),
            "ABI 7 adds no access right"
        );
    }

    #[test]
    fn supported_rights_grow_with_the_abi() {
        assert!(supported_rights(0).is_empty());
        assert_eq!(supported_rights(1), ["fs.read", "fs.write", "fs.execute"]);
        let at6 = supported_rights(6);
        assert_eq!(at6.len(), 10, "{at6:?}");
        assert_eq!(supported_rights(7), at6);
        assert_eq!(supported_rights(9).last().map(String::as_str), Some("fs.resolve_unix"));
    }
}
