//! The layers around Landlock in the tool worker, in order: namespaces before it (the
//! mount calls need a process Landlock does not restrict yet), the seccomp filter
//! after it. Fails closed (issue 10, item 7): under `landlock: required` a layer that
//! cannot be set up refuses the worker with a reason that names the missing piece and
//! the setting that allows a weaker mode; under `best_effort` the fire goes on and its
//! receipt names what is missing (not without namespaces for a runtime run as root,
//! whose tools would run as root, nor past what is no missing layer: see
//! [`NotEntered::Refused`]); `off` uses none of them.

use super::landlock::TrustedDir;
use super::namespaces::{self, NamespacePlan, NotEntered};
use super::seccomp;
use super::writeback::WriteBack;
use crate::records::SandboxRecord;
use crate::settings::LandlockMode;

/// What the namespaces step left: notes for the receipt, and the write-back of the
/// write directories (none without namespaces: tools then write the real ones).
pub struct Layers {
    notes: Vec<String>,
    write_back: Option<WriteBack>,
}

impl Layers {
    /// The directories the worker reaches by descriptor, for Landlock.
    pub fn trusted_dirs(&self) -> Vec<TrustedDir<'_>> {
        self.write_back
            .as_ref()
            .map(WriteBack::trusted_dirs)
            .unwrap_or_default()
    }
}

/// The refusal under `landlock: required`, naming the missing piece and the setting.
fn refusal(missing: &str) -> String {
    format!(
        "{missing}; settings require the full sandbox (`sandbox.landlock: required`); set `sandbox.landlock: best_effort` in settings/runtime.yaml to run without this layer"
    )
}

/// Enters the namespaces of `plan` (see [`namespaces::enter`]).
pub fn before_landlock(
    plan: Option<&NamespacePlan>,
    mode: LandlockMode,
    next_line: namespaces::NextLine<'_>,
) -> Result<Layers, String> {
    let mut notes = Vec::new();
    let none = |notes| {
        Ok(Layers {
            notes,
            write_back: None,
        })
    };
    let Some(plan) = plan else {
        return none(notes);
    };
    if mode == LandlockMode::Off {
        return none(notes);
    }
    match namespaces::enter(plan, next_line) {
        Ok(write_back) => {
            notes.push(if plan.network {
                "namespaces: user, mount, pid, ipc (host network granted)".to_string()
            } else {
                "namespaces: user, mount, pid, ipc, net".to_string()
            });
            notes.push(
                "file system: minimal root (pivot_root; system directories, the repository, read roots)".to_string(),
            );
            notes.push(format!(
                "writes: at most {} bytes (tmpfs; write directories through overlays, copied back)",
                plan.write_bytes
            ));
            Ok(Layers {
                notes,
                write_back: Some(write_back),
            })
        }
        Err(e) => without_namespaces(&e, mode, kernel::process::is_root(), notes),
    }
}

/// After the namespaces failed with `e`: refused, or under `best_effort`, when the
/// layer is only unavailable here, the worker goes on without them (in the process
/// as it was before) and says so. What is no missing layer (see
/// [`NotEntered::Refused`]) refuses the worker in any mode, and so does a worker run
/// `as_root`: its tools run as 65534 only inside the namespaces, and would run as
/// root, with every capability, without them.
fn without_namespaces(
    e: &NotEntered,
    mode: LandlockMode,
    as_root: bool,
    mut notes: Vec<String>,
) -> Result<Layers, String> {
    match e {
        NotEntered::Refused(why) => Err(why.clone()),
        NotEntered::Unavailable(why) if as_root => Err(format!(
            "namespaces unavailable: {why}; a runtime run as root runs tools as 65534 inside its namespaces only, and without them they would run as root: no `sandbox.landlock` mode but `off` fires so (run the runtime as the repository's owner for `best_effort` without namespaces)"
        )),
        NotEntered::Unavailable(why) if !goes_on_without_namespaces(mode, as_root) => {
            Err(refusal(&format!("namespaces unavailable: {why}")))
        }
        NotEntered::Unavailable(why) => {
            notes.push(format!("missing: namespaces ({why})"));
            Ok(Layers {
                notes,
                write_back: None,
            })
        }
    }
}

/// Whether a worker in `mode` fires without namespaces the host does not give it: only
/// under `best_effort` (`off` uses none), and never for a runtime run `as_root` (its
/// tools run as 65534 inside the namespaces only).
pub fn goes_on_without_namespaces(mode: LandlockMode, as_root: bool) -> bool {
    mode == LandlockMode::BestEffort && !as_root
}

/// Installs the seccomp filter and completes the record of the worker's sandbox;
/// hands on the write-back.
pub fn after_landlock(
    plan: Option<&NamespacePlan>,
    mode: LandlockMode,
    layers: Layers,
    mut record: SandboxRecord,
) -> Result<(SandboxRecord, Option<WriteBack>), String> {
    let Layers { notes, write_back } = layers;
    record.rights.extend(notes);
    let Some(plan) = plan else {
        return Ok((record, write_back));
    };
    if mode == LandlockMode::Off {
        return Ok((record, write_back));
    }
    match seccomp::install(plan.network) {
        Ok(()) => record.rights.push("seccomp".to_string()),
        Err(e) if mode == LandlockMode::Required => return Err(refusal(&e.to_string())),
        Err(e) => record.rights.push(format!("missing: seccomp ({e})")),
    }
    Ok((record, write_back))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failed(piece: &'static str) -> NotEntered {
        namespaces::NsError {
            piece,
            source: std::io::Error::other("refused"),
        }
        .into()
    }

    #[test]
    fn a_linked_write_directory_or_failed_masks_refuse_the_worker_where_a_missing_layer_would_not() {
        let linked = failed(super::super::UNREACHABLE_WRITE_DIR);
        for mode in [LandlockMode::Required, LandlockMode::BestEffort] {
            let why = without_namespaces(&linked, mode, false, Vec::new()).err().unwrap();
            assert!(why.contains("plain directories"), "{mode:?}: {why}");
        }
        for piece in [super::super::DENY_MASKS, super::super::SOCKET_MASKS] {
            let unmasked = failed(piece);
            for mode in [LandlockMode::Required, LandlockMode::BestEffort] {
                let why = without_namespaces(&unmasked, mode, false, Vec::new()).err().unwrap();
                assert!(why.starts_with(piece), "{mode:?}: {why}");
            }
        }
        let missing = failed("user namespaces");
        let why = without_namespaces(&missing, LandlockMode::Required, false, Vec::new())
            .err()
            .unwrap();
        assert!(why.contains("best_effort"), "{why}");
        let why = without_namespaces(&missing, LandlockMode::BestEffort, true, Vec::new())
            .err()
            .unwrap();
        assert!(why.contains("would run as root"), "{why}");
        let layers = without_namespaces(&missing, LandlockMode::BestEffort, false, Vec::new()).unwrap();
        assert_eq!(
            layers.notes,
            vec!["missing: namespaces (user namespaces: refused)".to_string()]
        );
        assert!(layers.write_back.is_none());
    }
}
