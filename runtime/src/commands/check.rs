//! `runtime check`: can this repository and kernel fire? Prints each layer of the
//! sandbox on its own (the Landlock ABI and the rights it supports, user namespaces,
//! idmapped mounts when running as root, seccomp, the tool worker's minimal root and
//! its size-limited writes, built for real in a throwaway worker), and whether
//! settings and prompts load.

use crate::command_error::{CommandError, Outcome};
use shared::sandbox::{landlock, namespaces, seccomp};
use shared::settings::{Durability, LandlockMode};
use std::path::Path;

/// Check that this repo and kernel can fire (Landlock ABI, settings, prompts)
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args, root: &Path) -> Result<Outcome, CommandError> {
    let abi = landlock::kernel_abi();
    let rights = landlock::supported_rights(abi);
    let checked = shared::check::check_repo(root);
    let problems = checked.problems;
    let mode = checked.settings.as_ref().map(|s| s.runtime.sandbox.landlock);
    let durability = checked.settings.as_ref().map(|s| s.runtime.durability);
    let missing_key = checked
        .settings
        .as_ref()
        .and_then(|s| s.runtime.missing_key_variable())
        .map(|var| format!("problem: the provider's key variable `{var}` (settings/runtime.yaml api_key_env) is unset or empty here: a fire would refuse (exit 2)"));
    let full = abi >= landlock::TARGET_ABI as u32;
    let userns = namespaces::probe().map(|()| "available".to_string());
    let idmap = namespaces::probe_idmap(root).map(|needed| {
        if needed {
            "available".to_string()
        } else {
            "not needed (the runtime does not run as root)".to_string()
        }
    });
    let filter = seccomp::probe().map(|()| "available".to_string());
    let write_bytes = checked
        .settings
        .as_ref()
        .map(|s| s.runtime.sandbox.write_bytes)
        .unwrap_or_else(|| shared::settings::SandboxSettings::default().write_bytes);
    let view = namespaces::probe_minimal_root(root, write_bytes)
        .map(|()| format!("minimal root (pivot_root), writes limited to {write_bytes} bytes (overlay on tmpfs)"));
    let layers_ok = userns.is_ok() && idmap.is_ok() && filter.is_ok() && view.is_ok();
    let show = |r: &Result<String, String>| match r {
        Ok(s) => s.clone(),
        Err(e) => format!("UNAVAILABLE: {e}"),
    };
    let userns = show(&userns.map_err(|e| e.to_string()));
    let idmap = show(&idmap.map_err(|e| e.to_string()));
    let filter = show(&filter.map_err(|e| e.to_string()));
    let view = show(&view.map_err(|e| e.to_string()));
    let sandbox_ok = match mode {
        Some(LandlockMode::Required) | None => full && layers_ok,
        Some(LandlockMode::BestEffort) | Some(LandlockMode::Off) => true,
    };
    let ok = problems.is_empty() && sandbox_ok && missing_key.is_none();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"landlock_abi": abi, "target_abi": landlock::TARGET_ABI as u32, "rights": rights, "user_namespaces": userns, "idmapped_mounts": idmap, "seccomp": filter, "file_system": view, "mode": mode, "durability": durability, "problems": problems, "missing_key": missing_key, "ok": ok})
            )?
        );
    } else {
        println!(
            "landlock ABI: {abi} (runtime targets ABI {}{})",
            landlock::TARGET_ABI as u32,
            if full {
                ", fully enforceable"
            } else {
                ", NOT fully enforceable"
            }
        );
        println!(
            "rights: {}",
            if rights.is_empty() {
                "none".to_string()
            } else {
                rights.join(", ")
            }
        );
        println!("user namespaces: {userns}");
        println!("idmapped mounts: {idmap}");
        println!("seccomp: {filter}");
        println!("file system view: {view}");
        if !layers_ok {
            println!("(settings `sandbox.landlock: best_effort` runs without the missing layers)");
        }
        println!(
            "sandbox mode in settings: {}",
            mode.map(|m| format!("{m:?}"))
                .unwrap_or_else(|| "(settings do not load)".into())
        );
        if let Some(d) = durability {
            println!(
                "durability in settings: {} ({})",
                d.as_str(),
                match d {
                    Durability::Normal => "checkpoints and records survive a crash of the process, not a power loss",
                    Durability::Strict => "checkpoints and records are fsynced before the fire goes on",
                }
            );
        }
        for p in &problems {
            println!("{p}");
        }
        if let Some(line) = &missing_key {
            println!("{line}");
        }
        println!(
            "{}",
            if ok {
                "ok: this repository can fire"
            } else {
                "not ready to fire"
            }
        );
    }
    Ok(if ok { Outcome::Ok } else { Outcome::Failed })
}
