//! Landlock enforcement of a [`SandboxSpec`] on the calling thread and everything it
//! creates afterwards. Callers restrict before any other thread exists (the tool
//! worker does it first thing in `main`; the runtime before it builds its tokio
//! runtime). The mechanism (the ABI, the rights of each, the ruleset) is the kernel
//! crate's ([`kernel::landlock`]); this is the policy: what a mode requires, and the
//! record of what was enforced. The tool worker's ruleset scopes its IPC, so from ABI
//! 9 `connect` to a pathname UNIX socket is refused unless the sandbox made the
//! socket: a host daemon's socket is out of reach wherever it is, also one created in
//! the repository after the worker started (the socket masks of
//! [`super::namespaces`] see only those present at its start).

use super::SandboxSpec;
use crate::records::{LandlockStatus, SandboxMode, SandboxRecord};
use crate::settings::LandlockMode;
pub use kernel::landlock::{kernel_abi, supported_rights, TrustedDir, NEWEST_HANDLED_ABI, TARGET_ABI};
use kernel::landlock::{restrict_self, Rules};
use landlock::RulesetStatus;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("landlock: {0}")]
    Landlock(#[from] landlock::RulesetError),
    #[error("landlock is {status} on this kernel (ABI {abi}) and settings require it fully enforced")]
    NotFullyEnforced { status: LandlockStatus, abi: u32 },
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
    let rules = Rules {
        read_dirs: &spec.read_dirs,
        write_dirs: &spec.write_dirs,
        write_files: &spec.write_files,
        trusted,
        connect_ports: &spec.connect_ports,
        scope_ipc: spec.scope_ipc,
    };
    let status = restrict_self(&rules, abi)?;
    let name = match status {
        RulesetStatus::FullyEnforced if below_target => LandlockStatus::PartiallyEnforced,
        RulesetStatus::FullyEnforced => LandlockStatus::FullyEnforced,
        RulesetStatus::PartiallyEnforced => LandlockStatus::PartiallyEnforced,
        RulesetStatus::NotEnforced => LandlockStatus::NotEnforced,
    };
    if mode == LandlockMode::Required && status != RulesetStatus::FullyEnforced {
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
