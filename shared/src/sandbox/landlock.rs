//! Landlock enforcement of a [`SandboxSpec`] on the calling thread and everything it
//! creates afterwards. Callers restrict before any other thread exists (the tool
//! worker does it first thing in `main`; the runtime before it builds its tokio
//! runtime). Handles every right of ABI 6: Refer (cross-directory rename and link),
//! Truncate, IoctlDev, TCP connect/bind, and signal / abstract-socket scoping; and,
//! when the kernel offers ABI 9, `LANDLOCK_ACCESS_FS_RESOLVE_UNIX` for a sandbox that
//! scopes its IPC (the tool worker): `connect` to a pathname UNIX socket is refused
//! unless a process of the same Landlock domain made the socket. No directory is
//! granted the right, so a host daemon's socket is out of reach wherever it is, also
//! one created in the repository after the worker started (the socket masks of
//! [`super::namespaces`] see only those present at its start).

use super::SandboxSpec;
use crate::records::{LandlockStatus, SandboxMode, SandboxRecord};
use crate::settings::LandlockMode;
use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, BitFlags, NetPort, PathBeneath, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use std::os::fd::BorrowedFd;

/// The ABI `landlock: required` needs: every right below it is enforced.
pub const TARGET_ABI: ABI = ABI::V6;

/// The newest ABI whose rights this code asks for when the kernel offers them: 7 and
/// 8 add no access right, 9 adds `RESOLVE_UNIX`. This kernel's ABI shows in `runtime
/// check`; ABI 9 (Linux 7.1) could not be run here (the CI kernel offers 7), so its
/// use is checked by [`rights_of`]'s unit test, not against a kernel.
pub const NEWEST_HANDLED_ABI: ABI = ABI::V9;

/// A directory the sandboxed process itself reaches through a descriptor it opened
/// before restricting itself, not through a path (the tool worker's write-back: the
/// real write directories and the layer tools wrote into, see
/// [`super::writeback`]): granted by descriptor, so no path leads a tool to it.
pub struct TrustedDir<'a> {
    pub dir: BorrowedFd<'a>,
    pub write: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("landlock: {0}")]
    Landlock(#[from] landlock::RulesetError),
    #[error("landlock is {status} on this kernel (ABI {abi}) and settings require it fully enforced")]
    NotFullyEnforced { status: LandlockStatus, abi: u32 },
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
    let mut r = vec!["fs.read".to_string(), "fs.write".into(), "fs.execute".into()];
    if abi >= 2 {
        r.push("fs.refer".into());
    }
    if abi >= 3 {
        r.push("fs.truncate".into());
    }
    if abi >= 4 {
        r.push("net.connect_tcp".into());
        r.push("net.bind_tcp".into());
    }
    if abi >= 5 {
        r.push("fs.ioctl_dev".into());
    }
    if abi >= 6 {
        r.push("scope.signal".into());
        r.push("scope.abstract_unix_socket".into());
    }
    if abi >= 9 {
        r.push("fs.resolve_unix".into());
    }
    if abi == 0 {
        r.clear();
    }
    r
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

/// Restricts the calling thread (and its future children) to `spec`. `Off` does
/// nothing; `Required` fails unless every requested right is enforced.
pub fn enforce(spec: &SandboxSpec, mode: LandlockMode) -> Result<SandboxRecord, SandboxError> {
    enforce_with(spec, mode, &[])
}

/// [`enforce`], with `trusted` directories granted by descriptor besides the paths of
/// `spec`.
pub fn enforce_with(
    spec: &SandboxSpec,
    mode: LandlockMode,
    trusted: &[TrustedDir<'_>],
) -> Result<SandboxRecord, SandboxError> {
    let kernel = kernel_abi();
    // The ABI actually used: the kernel's, lowered by `max_abi` (to behave as on an
    // older kernel), never above the ABI this code handles.
    let abi = kernel.min(spec.max_abi.unwrap_or(u32::MAX));
    let mode_name = match mode {
        LandlockMode::Required => SandboxMode::Required,
        LandlockMode::BestEffort => SandboxMode::BestEffort,
        LandlockMode::Off => SandboxMode::Off,
    };
    if mode == LandlockMode::Off {
        return Ok(SandboxRecord {
            landlock: LandlockStatus::Off,
            abi: Some(abi),
            mode: mode_name,
            rights: Vec::new(),
        });
    }
    let below_target = abi < TARGET_ABI as u32;
    if mode == LandlockMode::Required && below_target {
        return Err(SandboxError::NotFullyEnforced {
            status: if abi == 0 {
                LandlockStatus::NotEnforced
            } else {
                LandlockStatus::PartiallyEnforced
            },
            abi,
        });
    }
    let use_abi = ABI::from(abi.min(NEWEST_HANDLED_ABI as u32) as i32);
    let fs = rights_of(use_abi, spec.scope_ipc);
    let mut ruleset = Ruleset::default().handle_access(fs.handled)?;
    // Rights an ABI does not have are left out rather than requested empty.
    let net = AccessNet::from_all(use_abi);
    if !net.is_empty() {
        ruleset = ruleset.handle_access(net)?;
    }
    let scopes = Scope::from_all(use_abi);
    if spec.scope_ipc && !scopes.is_empty() {
        ruleset = ruleset.scope(scopes)?;
    }
    let existing = |paths: &[std::path::PathBuf]| paths.iter().filter(|p| p.exists()).cloned().collect::<Vec<_>>();
    let mut created = ruleset
        .create()?
        .add_rules(path_beneath_rules(existing(&spec.read_dirs), fs.read))?
        .add_rules(path_beneath_rules(existing(&spec.write_dirs), fs.write_dir))?
        .add_rules(path_beneath_rules(existing(&spec.write_files), fs.write_file))?;
    for t in trusted {
        let access = if t.write { fs.write_dir } else { fs.read };
        created = created.add_rule(PathBeneath::new(t.dir, access))?;
    }
    for port in spec.connect_ports.iter().filter(|_| !net.is_empty()) {
        created = created.add_rule(NetPort::new(*port, AccessNet::ConnectTcp))?;
    }
    let status = created.restrict_self()?;
    let name = match status.ruleset {
        RulesetStatus::FullyEnforced if below_target => LandlockStatus::PartiallyEnforced,
        RulesetStatus::FullyEnforced => LandlockStatus::FullyEnforced,
        RulesetStatus::PartiallyEnforced => LandlockStatus::PartiallyEnforced,
        RulesetStatus::NotEnforced => LandlockStatus::NotEnforced,
    };
    if mode == LandlockMode::Required && status.ruleset != RulesetStatus::FullyEnforced {
        return Err(SandboxError::NotFullyEnforced { status: name, abi });
    }
    let mut rights = supported_rights(abi.min(NEWEST_HANDLED_ABI as u32));
    if !spec.scope_ipc {
        rights.retain(|r| !r.starts_with("scope.") && r != "fs.resolve_unix");
    }
    Ok(SandboxRecord {
        landlock: name,
        abi: Some(abi),
        mode: mode_name,
        rights,
    })
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
}
