//! Landlock enforcement of a [`SandboxSpec`] on the calling thread and everything it
//! creates afterwards. Callers restrict before any other thread exists (the tool
//! worker does it first thing in `main`; the runtime before it builds its tokio
//! runtime). Handles every right of ABI 6: Refer (cross-directory rename and link),
//! Truncate, IoctlDev, TCP connect/bind, and signal / abstract-socket scoping.

use super::SandboxSpec;
use crate::records::{LandlockStatus, SandboxMode, SandboxRecord};
use crate::settings::LandlockMode;
use landlock::{
    path_beneath_rules, Access, AccessFs, AccessNet, NetPort, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    Scope, ABI,
};

/// The newest ABI whose rights this code handles and was tested with.
pub const TARGET_ABI: ABI = ABI::V6;

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
    if abi == 0 {
        r.clear();
    }
    r
}

/// Restricts the calling thread (and its future children) to `spec`. `Off` does
/// nothing; `Required` fails unless every requested right is enforced.
pub fn enforce(spec: &SandboxSpec, mode: LandlockMode) -> Result<SandboxRecord, SandboxError> {
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
    let use_abi = if below_target {
        ABI::from(abi as i32)
    } else {
        TARGET_ABI
    };
    let fs_all = AccessFs::from_all(use_abi);
    let mut ruleset = Ruleset::default().handle_access(fs_all)?;
    // Rights an ABI does not have are left out rather than requested empty.
    let net = AccessNet::from_all(use_abi);
    if !net.is_empty() {
        ruleset = ruleset.handle_access(net)?;
    }
    let scopes = Scope::from_all(use_abi);
    if spec.scope_ipc && !scopes.is_empty() {
        ruleset = ruleset.scope(scopes)?;
    }
    let read = AccessFs::from_read(use_abi);
    let file_write = AccessFs::from_file(use_abi);
    let existing = |paths: &[std::path::PathBuf]| paths.iter().filter(|p| p.exists()).cloned().collect::<Vec<_>>();
    let mut created = ruleset
        .create()?
        .add_rules(path_beneath_rules(existing(&spec.read_dirs), read))?
        .add_rules(path_beneath_rules(existing(&spec.write_dirs), fs_all))?
        .add_rules(path_beneath_rules(existing(&spec.write_files), file_write))?;
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
    let mut rights = supported_rights(abi.min(TARGET_ABI as u32));
    if !spec.scope_ipc {
        rights.retain(|r| !r.starts_with("scope."));
    }
    Ok(SandboxRecord {
        landlock: name,
        abi: Some(abi),
        mode: mode_name,
        rights,
    })
}
