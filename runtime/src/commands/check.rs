//! `runtime check`: can this repository and kernel fire? Prints each layer of the
//! sandbox on its own (the Landlock ABI and the rights it supports, user namespaces,
//! idmapped mounts when running as root, seccomp, the tool worker's minimal root and
//! its size-limited writes, built for real in a throwaway worker), whether settings
//! and prompts load, the two-key state of HEAD and, on a cron box, what the sync would
//! find; the refusals are the fire's own ([`shared::fire::check_gate`],
//! [`shared::sync::look`]), so `check` exits 1 exactly when a fire would refuse or
//! could not fire what the remote holds.

use crate::command_error::{CommandError, Outcome};
use shared::sandbox::{isolate, landlock, namespaces, seccomp};
use shared::settings::{Durability, LandlockMode};
use shared::sync::{Look, SyncError, Way};
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
    let namespaces_ok = userns.is_ok() && idmap.is_ok() && view.is_ok();
    let layers_ok = namespaces_ok && filter.is_ok();
    let as_root = kernel::process::is_root();
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
        Some(m @ LandlockMode::BestEffort) => namespaces_ok || isolate::goes_on_without_namespaces(m, as_root),
        Some(LandlockMode::Off) => true,
    };
    let gate = checked.settings.as_ref().map(|_| shared::fire::check_gate(root));
    let gate_lines = gate.as_ref().map(gate_lines).unwrap_or_default();
    let gate_ok = gate.as_ref().is_none_or(|g| g.as_ref().is_ok_and(gate_fires));
    // A rebase, merge or detached HEAD in progress: a fire would run, keep its records
    // uncommitted and exit 1 with a `commit_blocked` card.
    let commit_blocked = git2::Repository::open(root)
        .ok()
        .and_then(|repo| shared::git::commit_blocker(&repo).ok().flatten())
        .map(|b| format!("problem: a fire now would keep its records uncommitted (exit 1): {b}"));
    // The box's signing key, as the fire loads it (it refuses one it cannot use).
    let unusable_key = checked
        .settings
        .as_ref()
        .and_then(|s| s.runtime.runtime_identity.signing_key.clone())
        .and_then(|k| shared::review::runtime_commits::RuntimeKey::load(&k, root).err())
        .map(|e| {
            format!("problem: runtime_identity.signing_key (settings/runtime.yaml): {e}: a fire would refuse (exit 2)")
        });
    // What of this machine and checkout would stop a fire, besides the settings.
    let machine_problems = commit_blocked.into_iter().chain(unusable_key).collect::<Vec<_>>();
    let ok = problems.is_empty() && sandbox_ok && missing_key.is_none() && gate_ok && machine_problems.is_empty();
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"landlock_abi": abi, "target_abi": landlock::TARGET_ABI as u32, "rights": rights, "user_namespaces": userns, "idmapped_mounts": idmap, "seccomp": filter, "file_system": view, "mode": mode, "durability": durability, "problems": problems, "missing_key": missing_key, "machine_problems": machine_problems, "two_keys": gate.as_ref().map(two_keys_json), "sync": gate.as_ref().and_then(sync_json), "refusals": gate.as_ref().map(|g| g.as_ref().map(|g| g.refusals.clone()).unwrap_or_else(|e| vec![e.clone()])), "ok": ok})
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
        if !namespaces_ok && as_root && mode != Some(LandlockMode::Off) {
            println!("(a runtime run as root refuses to fire without namespaces, `best_effort` included: its tools would run as root)");
        } else if !layers_ok {
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
        for line in missing_key.iter().chain(&machine_problems) {
            println!("{line}");
        }
        for line in &gate_lines {
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

type GateResult = Result<shared::fire::Gate, String>;

/// Whether a fire would run what it should: no refusal, and with `sync` a remote it
/// reaches and a tip it may fire.
fn gate_fires(g: &shared::fire::Gate) -> bool {
    g.refusals.is_empty()
        && g.sync
            .as_ref()
            .is_none_or(|(_, look)| look.as_ref().is_ok_and(|l| !matches!(l.way, Way::Stuck(_))))
}

/// The two-key state, the sync and every refusal, one line each.
fn gate_lines(gate: &GateResult) -> Vec<String> {
    let g = match gate {
        Ok(g) => g,
        Err(e) => return vec![format!("problem: the two-key state cannot be read: {e}")],
    };
    let mut out = Vec::new();
    let tree = shared::text::short_id(&g.tree);
    out.push(match (&g.approval, g.require_reviewed) {
        (Some((a, signed)), on) => format!(
            "two keys: require_reviewed {}; HEAD's builder tree {tree} approved by {} (approval {}, {}{})",
            if on { "on" } else { "off" },
            shared::text::printable(&a.approver),
            shared::text::short_id(&a.id),
            if *signed { "signed" } else { "unsigned" },
            if g.require_signed {
                "; signatures required"
            } else {
                "; signatures not required"
            }
        ),
        (None, true) => {
            format!("two keys: require_reviewed on; HEAD's builder tree {tree} has NO approval that counts")
        }
        (None, false) => format!("two keys: off (require_reviewed is false); HEAD's builder tree {tree}"),
    });
    if let Some((s, look)) = &g.sync {
        let at = format!("{}/{}", s.remote, s.branch);
        out.push(match look {
            Err(e) => format!("sync: {at}: UNREACHABLE or unusable: {}", e.message),
            Ok(l) => format!(
                "sync: {at}: reachable; {} approved tree(s) here; the box is {} ahead, {} behind; {}",
                l.approvals.unwrap_or(0),
                l.ahead,
                l.behind,
                match &l.way {
                    Way::UpToDate => "up to date".to_string(),
                    Way::Ahead => "a fire pushes the box's records".to_string(),
                    Way::FastForward | Way::Join { .. } => {
                        format!("a fire moves to {}", shared::text::short_oid(l.remote))
                    }
                    Way::Replay { .. } => format!(
                        "a fire replays the box's records onto the rewritten {} and moves there",
                        shared::text::short_oid(l.remote)
                    ),
                    Way::Stuck(stuck) =>
                        format!("STUCK: {}: a fire runs on what the box has and exits 5", stuck.reason()),
                }
            ),
        });
        if let Ok(Look { rewritten: Some(r), .. }) = look {
            out.push(format!(
                "sync: {at} was rewritten (a force push): {} is no longer in it, with {} commit(s) the box had",
                shared::text::short_oid(r.from),
                r.lost
            ));
        }
        if let Err(SyncError { hint: Some(h), .. }) = look {
            out.push(format!("hint: {h}"));
        }
    }
    out.extend(g.refusals.iter().map(|r| format!("problem: a fire would refuse: {r}")));
    out
}

fn two_keys_json(gate: &GateResult) -> serde_json::Value {
    match gate {
        Err(e) => serde_json::json!({ "error": e }),
        Ok(g) => serde_json::json!({
            "require_reviewed": g.require_reviewed,
            "require_signed": g.require_signed,
            "tree": g.tree,
            "approval": g.approval.as_ref().map(|(a, signed)| serde_json::json!({
                "id": a.id, "approver": a.approver, "tree": a.tree, "signed": signed,
            })),
        }),
    }
}

fn sync_json(gate: &GateResult) -> Option<serde_json::Value> {
    let (s, look) = gate.as_ref().ok()?.sync.as_ref()?;
    Some(match look {
        Err(e) => serde_json::json!({
            "remote": s.remote, "branch": s.branch, "reachable": false,
            "error": e.to_string(), "hint": e.hint,
        }),
        Ok(l) => serde_json::json!({
            "remote": s.remote, "branch": s.branch, "reachable": true,
            "local": l.local.to_string(), "remote_tip": l.remote.to_string(),
            "ahead": l.ahead, "behind": l.behind, "approved_trees": l.approvals,
            "way": match &l.way {
                Way::UpToDate => "up_to_date",
                Way::Ahead => "ahead",
                Way::FastForward => "fast_forward",
                Way::Join { .. } => "join",
                Way::Replay { .. } => "replay",
                Way::Stuck(_) => "stuck",
            },
            "stuck": match &l.way { Way::Stuck(s) => Some(s.reason()), _ => None },
            "rewritten_from": l.rewritten.as_ref().map(|r| r.from.to_string()),
        }),
    })
}
