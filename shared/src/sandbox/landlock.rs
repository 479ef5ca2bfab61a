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
use std::os::fd::OwnedFd;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("landlock: {0}")]
    Landlock(#[from] landlock::RulesetError),
    #[error("landlock is {status} on this kernel (ABI {abi}) and settings require it fully enforced")]
    NotFullyEnforced { status: LandlockStatus, abi: u32 },
}

/// The write directories of `spec` that lie in the repository `root`, each opened
/// through plain directories only ([`kernel::mount::open_beneath`]) for Landlock to
/// grant by descriptor, and `spec` without them. Granted by path, a directory a tool
/// of another fire replaced by a link since it was made (`reports` -> `prompts`)
/// would make the link's target writable; by descriptor, a link swapped in after
/// this opened the directory changes nothing. One not reached through plain
/// directories now refuses the worker ([`super::UNREACHABLE_WRITE_DIR`]); one that is
/// gone is left out (nothing is granted there).
pub fn write_dirs_beneath(spec: &SandboxSpec, root: &Path) -> Result<(SandboxSpec, Vec<OwnedFd>), String> {
    let mut by_path = spec.clone();
    by_path.write_dirs.clear();
    let mut opened = Vec::new();
    for d in &spec.write_dirs {
        let Some(rel) = super::beneath_repository(root, d) else {
            by_path.write_dirs.push(d.clone());
            continue;
        };
        match super::open_write_dir(root, rel) {
            Ok(Some(fd)) => opened.push(fd),
            Ok(None) => tracing::warn!(dir = %d.display(), "a write directory is gone: not writable"),
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok((by_path, opened))
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// A write directory replaced by a link to `prompts/` is granted neither by path
    /// nor by descriptor: written through the link before the ruleset (the link leads
    /// there), refused after it, while the plain write directory stays writable.
    #[test]
    fn a_write_directory_turned_link_is_not_granted_its_target() {
        if kernel_abi() == 0 {
            crate::test_skip::skip(crate::test_skip::Capability::Landlock, "this kernel has no Landlock");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let root = t.path().to_path_buf();
        for d in ["reports", "prompts"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::os::unix::fs::symlink("prompts", root.join("cards")).unwrap();
        let spec = SandboxSpec {
            read_dirs: vec![root.clone()],
            write_dirs: vec![root.join("reports"), root.join("cards")],
            ..SandboxSpec::default()
        };
        let refused = write_dirs_beneath(&spec, &root).unwrap_err();
        assert!(
            refused.starts_with(super::super::UNREACHABLE_WRITE_DIR) && refused.contains("cards"),
            "{refused}"
        );
        // Opened while plain, then swapped for a link before Landlock is entered: the
        // grant is the directory opened, never the link's target.
        let spec = SandboxSpec {
            write_dirs: vec![root.join("reports")],
            ..spec
        };
        let (by_path, beneath) = write_dirs_beneath(&spec, &root).unwrap();
        assert!(by_path.write_dirs.is_empty(), "{:?}", by_path.write_dirs);
        assert_eq!(beneath.len(), 1);
        std::fs::rename(root.join("reports"), root.join("reports-opened")).unwrap();
        std::os::unix::fs::symlink("prompts", root.join("reports")).unwrap();
        std::fs::write(root.join("reports/before"), "x").unwrap();
        assert!(
            root.join("prompts/before").is_file(),
            "the link does not lead to prompts/"
        );
        let r = root.clone();
        let (opened, linked) = std::thread::spawn(move || {
            let trusted: Vec<TrustedDir<'_>> = (beneath.iter())
                .map(|fd| TrustedDir {
                    dir: fd.as_fd(),
                    write: true,
                })
                .collect();
            enforce_with(&by_path, LandlockMode::BestEffort, &trusted).unwrap();
            (
                std::fs::write(r.join("reports-opened/after"), "x"),
                std::fs::write(r.join("reports/after"), "x"),
            )
        })
        .join()
        .unwrap();
        opened.unwrap();
        assert_eq!(linked.unwrap_err().kind(), std::io::ErrorKind::PermissionDenied);
        assert!(!root.join("prompts/after").exists());
    }
}
