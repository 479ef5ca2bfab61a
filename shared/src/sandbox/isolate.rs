//! The layers around Landlock in the tool worker, in order: namespaces before it (the
//! mount calls need a process Landlock does not restrict yet), the seccomp filter
//! after it. Fails closed (issue 10, item 7): under `landlock: required` a layer that
//! cannot be set up refuses the worker with a reason that names the missing piece and
//! the setting that allows a weaker mode; under `best_effort` the fire goes on and its
//! receipt names what is missing; `off` uses none of them.

use super::namespaces::{self, NamespacePlan};
use super::seccomp;
use crate::records::SandboxRecord;
use crate::settings::LandlockMode;

/// What the namespaces step left for the receipt.
pub struct Layers {
    notes: Vec<String>,
}

/// The refusal under `landlock: required`, naming the missing piece and the setting.
fn refusal(missing: &str) -> String {
    format!(
        "{missing}; settings require the full sandbox (`sandbox.landlock: required`); set `sandbox.landlock: best_effort` in settings/runtime.yaml to run without this layer"
    )
}

/// Enters the namespaces of `plan` (see [`namespaces::enter`]).
pub fn before_landlock(plan: Option<&NamespacePlan>, mode: LandlockMode) -> Result<Layers, String> {
    let mut notes = Vec::new();
    let Some(plan) = plan else {
        return Ok(Layers { notes });
    };
    if mode == LandlockMode::Off {
        return Ok(Layers { notes });
    }
    match namespaces::enter(plan) {
        Ok(()) if plan.network => notes.push("namespaces: user, mount, pid, ipc (host network granted)".to_string()),
        Ok(()) => notes.push("namespaces: user, mount, pid, ipc, net".to_string()),
        Err(e) if mode == LandlockMode::Required => return Err(refusal(&format!("namespaces unavailable: {e}"))),
        Err(e) => notes.push(format!("missing: namespaces ({e})")),
    }
    Ok(Layers { notes })
}

/// Installs the seccomp filter and completes the record of the worker's sandbox.
pub fn after_landlock(
    plan: Option<&NamespacePlan>,
    mode: LandlockMode,
    layers: Layers,
    mut record: SandboxRecord,
) -> Result<SandboxRecord, String> {
    record.rights.extend(layers.notes);
    let Some(plan) = plan else {
        return Ok(record);
    };
    if mode == LandlockMode::Off {
        return Ok(record);
    }
    match seccomp::install(plan.network) {
        Ok(()) => record.rights.push("seccomp".to_string()),
        Err(e) if mode == LandlockMode::Required => return Err(refusal(&e.to_string())),
        Err(e) => record.rights.push(format!("missing: seccomp ({e})")),
    }
    Ok(record)
}
