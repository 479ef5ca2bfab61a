//! The tool worker: a separate process that enters its Landlock sandbox first thing,
//! then executes tool requests read as JSON lines on stdin and answers on stdout.
//! Everything the model can cause (file tools, `run_command` and its children) runs
//! here, so no write the model influences can bypass the kernel's rules, and the
//! runtime process that holds `.git` and `.runtime/` never runs model-chosen actions.

use crate::records::SandboxRecord;
use crate::sandbox::writeback::WriteBack;
use crate::sandbox::{isolate, landlock, namespaces::NamespacePlan, SandboxSpec};
use crate::settings::LandlockMode;
use crate::tools::exec::{execute, install_interrupt_handlers, ExecContext};
use crate::tools::{ErrorClass, ToolRequest, ToolResult, WrittenBack, NESTED_REPOSITORIES_SENT};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::PathBuf;

/// Sent as the first line to a new worker. A field it does not know fails its start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    pub root: PathBuf,
    pub scratch: PathBuf,
    pub spec: SandboxSpec,
    pub mode: LandlockMode,
    pub env: Vec<(String, String)>,
    /// The worker's namespaces (issue 10): `None` runs it in the runtime's own.
    #[serde(default)]
    pub isolation: Option<NamespacePlan>,
    /// Run this MCP server instead of serving tool calls: once in its sandbox, the
    /// worker starts it on its own stdin and stdout and waits for it ([`crate::mcp`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<crate::mcp::McpLaunch>,
}

/// The worker's first answer: the sandbox it is in, or why it could not enter it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum WorkerHello {
    Ready(SandboxRecord),
    Refused(String),
}

/// The `runtime` binary's hidden subcommand that starts a sandboxed worker (the
/// fire's, or `builder mcp pin`'s for a server it lists). Its number is the
/// protocol's: raise it whenever a [`WorkerConfig`] an older worker would read
/// differently (a field it would ignore) is sent, so a `builder` beside an older
/// `runtime` fails at once instead of having its sandbox built the old way
/// (helper-117: an older worker ignored the pin's own state directory).
pub const WORKER_COMMAND: &str = "__tool-worker-2";

/// The variable naming the runtime that spawned a worker (its pid).
pub const PARENT_ENV: &str = "RUNTIME_WORKER_PARENT";

/// Has the kernel kill this worker (and with it everything it runs) when the runtime
/// that spawned it ends, also by SIGKILL. Called first thing in the worker's process;
/// `Err` when that runtime has already ended. A worker started by hand, with no
/// runtime named, dies with whatever parent it has.
pub fn die_with_runtime() -> std::io::Result<()> {
    match std::env::var(PARENT_ENV).ok().and_then(|p| p.parse::<u32>().ok()) {
        Some(runtime) => kernel::hardening::die_with_parent_of(runtime),
        None => kernel::hardening::die_with_parent(),
    }
}

/// What an MCP server's worker does before it passes on an answer and once the
/// server ends: copies the write layer into the repository, says on stderr what it
/// kept out, and returns the note for the runtime.
fn mcp_sync(wb: &mut WriteBack) -> Vec<String> {
    let (lines, written) = write_back_notes(wb);
    for line in lines {
        eprintln!("{line}");
    }
    crate::mcp::sandbox_note(&written).into_iter().collect()
}

/// The worker's main loop. Must run before any other thread of the process starts.
pub fn serve(input: impl BufRead, mut output: impl Write) -> std::io::Result<()> {
    // SIGTERM/SIGINT kill the running command, not the worker.
    install_interrupt_handlers();
    // This process uses only stdin, stdout and stderr, and no other thread exists yet.
    kernel::hardening::close_inherited_descriptors();
    let mut lines = input.lines();
    let Some(first) = lines.next().transpose()? else {
        return Ok(());
    };
    let config: WorkerConfig = match serde_json::from_str(&first) {
        Ok(c) => c,
        Err(e) => {
            writeln!(
                output,
                "{}",
                serde_json::to_string(&WorkerHello::Refused(format!("bad worker config: {e}")))?
            )?;
            return Ok(());
        }
    };
    let (hello, mut write_back) = match enter_sandbox_reading_masks(&config, &mut lines) {
        Ok((rec, write_back)) => (WorkerHello::Ready(rec), write_back),
        Err(e) => (WorkerHello::Refused(e), None),
    };
    let refused = matches!(hello, WorkerHello::Refused(_));
    // An interrupt before the report concerns no call (the runtime sends its own only
    // during one, again until it ends): left standing, it would cancel the first
    // command at its start.
    forget_interrupt();
    writeln!(output, "{}", serde_json::to_string(&hello)?)?;
    output.flush()?;
    if refused {
        return Ok(());
    }
    if let Some(launch) = &config.mcp {
        // The server's lines go out on the worker's stdout from a thread of their
        // own: a descriptor of its own (the caller's handle stays with this thread).
        // Close-on-exec: the server must never hold a line to the runtime that
        // bypasses this worker (a plain `dup` would hand it one).
        let out = std::fs::File::from(rustix::io::fcntl_dupfd_cloexec(std::io::stdout(), 3)?);
        let sync = move || write_back.as_mut().map(mcp_sync).unwrap_or_default();
        // A server gone while the session is open ends the worker (and its line).
        let gone = || std::process::exit(0);
        return crate::mcp::run_server(&config.root, &config.env, launch, lines, out, sync, gone);
    }
    let ctx = ExecContext {
        root: config.root,
        scratch: config.scratch,
        env: config.env,
    };
    for line in lines {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        // An interrupt that came while no call ran (the model was thinking) is meant
        // for none: a cancelled runtime interrupts a call until it ends.
        forget_interrupt();
        let result = match serde_json::from_str::<ToolRequest>(&line) {
            Ok(req) => {
                let mut result = execute(&ctx, &req);
                if matches!(req.args, crate::tools::ToolArgs::RunCommand { .. }) {
                    kernel::process::kill_rest_of_namespace();
                }
                // Every process of the call is gone: what it wrote in the write
                // directories goes into the repository now, before the answer.
                if let Some(wb) = write_back.as_mut() {
                    note_write_back(&mut result, wb);
                }
                result
            }
            Err(e) => ToolResult::error("", ErrorClass::InvalidArguments, format!("bad request: {e}")),
        };
        writeln!(output, "{}", serde_json::to_string(&result)?)?;
        output.flush()?;
    }
    Ok(())
}

/// Drops an interrupt (SIGTERM, SIGINT) that reached the worker outside a call.
fn forget_interrupt() {
    let _ = kernel::signal::take_interrupt();
}

/// [`enter_sandbox`], with the line after the configuration when the runtime sends
/// the masks: read where the namespace is built, or after when none is (read all
/// the same, so it is not taken for a call).
fn enter_sandbox_reading_masks(
    config: &WorkerConfig,
    lines: &mut impl Iterator<Item = std::io::Result<String>>,
) -> Result<(SandboxRecord, Option<WriteBack>), String> {
    let masks_follow = config
        .isolation
        .as_ref()
        .is_some_and(|p| p.masks == crate::sandbox::namespaces::MaskSource::NextLine);
    let mut masks_read = false;
    let entered = enter_sandbox(config, &mut || {
        masks_read = true;
        lines.next().transpose()
    });
    if masks_follow && !masks_read {
        let _ = lines.next();
    }
    entered
}

/// Enters the worker's sandbox, layer by layer: its write directories made, the
/// namespaces, Landlock, the seccomp filter. Returns the record of what it is in and
/// the write-back of the write directories, or why it could not enter it.
fn enter_sandbox(
    config: &WorkerConfig,
    next_line: crate::sandbox::namespaces::NextLine<'_>,
) -> Result<(SandboxRecord, Option<WriteBack>), String> {
    crate::sandbox::prepare_dirs(&config.spec, &config.root)
        .map_err(|e| e.to_string())
        .and_then(|_| isolate::before_landlock(config.isolation.as_ref(), config.mode, next_line))
        .and_then(|layers| {
            let (spec, beneath) = match landlock::write_dirs_beneath(&config.spec, &config.root) {
                Ok(opened) => opened,
                // `off` enforces nothing, by path or by descriptor.
                Err(_) if config.mode == crate::settings::LandlockMode::Off => (config.spec.clone(), Vec::new()),
                Err(why) => return Err(why),
            };
            let mut trusted = layers.trusted_dirs();
            trusted.extend(beneath.iter().map(|fd| landlock::TrustedDir {
                dir: std::os::fd::AsFd::as_fd(fd),
                write: true,
            }));
            let rec = landlock::enforce_with(&spec, config.mode, &trusted).map_err(|e| e.to_string())?;
            isolate::after_landlock(config.isolation.as_ref(), config.mode, layers, rec)
        })
}

/// Copies the call's writes into the repository and tells the model in the result
/// what did not get there, and when the write limit was reached.
fn note_write_back(result: &mut ToolResult, wb: &mut WriteBack) {
    let (notes, written_back) = write_back_notes(wb);
    result.written_back = Some(written_back);
    if !notes.is_empty() {
        if !result.output.is_empty() && !result.output.ends_with('\n') {
            result.output.push('\n');
        }
        result.output.push_str(&notes.join("\n"));
    }
}

/// Copies what tools (or an MCP server) wrote into the repository; the lines that say
/// what did not get there, and when the write limit was reached, and the git
/// repositories the copy removed (for the runtime's card).
fn write_back_notes(wb: &mut WriteBack) -> (Vec<String>, WrittenBack) {
    const SHOWN: usize = 5;
    let synced = wb.sync();
    let problems = synced.problems;
    let mut notes = Vec::new();
    for r in synced.repositories.iter().take(SHOWN) {
        notes.push(match &r.left {
            None => format!(
                "[sandbox] a git repository is not written to the repository and was removed: {}",
                r.path
            ),
            Some(why) => format!(
                "[sandbox] a git repository is not written to the repository: {}: could not remove it: {why}",
                r.path
            ),
        });
    }
    if synced.repositories.len() > SHOWN {
        notes.push(format!(
            "[sandbox] ... and {} more git repositories not written",
            synced.repositories.len() - SHOWN
        ));
    }
    if wb.full() {
        notes.push(format!(
            "[sandbox] the write limit is reached: at most {} bytes in all (`sandbox.write_bytes`); writes past it fail with `No space left on device`",
            wb.limit()
        ));
    }
    for p in problems.iter().take(SHOWN) {
        notes.push(format!(
            "[sandbox] not written to the repository: {}: {}",
            p.path.display(),
            p.why
        ));
    }
    if problems.len() > SHOWN {
        notes.push(format!("[sandbox] ... and {} more not written", problems.len() - SHOWN));
    }
    let mut repositories = synced.repositories;
    let more_repositories = repositories.len().saturating_sub(NESTED_REPOSITORIES_SENT);
    repositories.truncate(NESTED_REPOSITORIES_SENT);
    // The files git reads are named past the cap too: the acceptance checks must not
    // run beside one the model left (helper-94).
    let git_reads = synced.made.iter().skip(crate::tools::MADE_SENT);
    let git_reads = git_reads.filter(|p| crate::gitpath::is_git_read(&p.to_string_lossy()));
    let made = synced.made.iter().take(crate::tools::MADE_SENT).chain(git_reads);
    let written_back = WrittenBack {
        nested_repositories: repositories,
        more_repositories,
        made: made.map(|p| p.to_string_lossy().into_owned()).collect(),
    };
    (notes, written_back)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_configuration_with_a_field_this_worker_does_not_know_is_refused() {
        let config = WorkerConfig {
            root: "/r".into(),
            scratch: "/s".into(),
            spec: crate::sandbox::SandboxSpec::default(),
            mode: crate::settings::LandlockMode::Required,
            env: Vec::new(),
            isolation: Some(crate::sandbox::namespaces::NamespacePlan::default()),
            mcp: Some(crate::mcp::McpLaunch {
                server: "files".into(),
                argv: vec!["/bin/true".into()],
            }),
        };
        let mut line = serde_json::to_value(&config).unwrap();
        assert!(serde_json::from_value::<WorkerConfig>(line.clone()).is_ok());
        // As a newer builder's field would reach an older worker: at every level.
        for at in ["", "/spec", "/isolation", "/mcp"] {
            let mut changed = line.clone();
            changed.pointer_mut(at).unwrap()["state_dir_v9"] = serde_json::json!("/elsewhere");
            assert!(serde_json::from_value::<WorkerConfig>(changed).is_err(), "{at}");
        }
        line["isolation"]["state_dir"] = serde_json::json!("/pin-state");
        let read: WorkerConfig = serde_json::from_value(line).unwrap();
        assert_eq!(read.isolation.unwrap().state_dir, Some("/pin-state".into()));
    }
}
