//! Prefetch (docs/design.md, step 4): the builder's deterministic context
//! scripts from `tools/`, run before any model call with a timeout, an output cap and
//! a scrubbed environment, their output appended to the prompt as markdown so the
//! model spends no turns on it. Each script runs in a tool worker of its own, in the
//! worker's namespaces, Landlock domain and seccomp filter (issue 10), writing only
//! where the write ACL points and to the run's scratch.

use super::config::FireConfig;
use crate::agent::worker_client::spawn_process;
use crate::progress::{Event, ProgressSink};
use crate::sandbox::{self, namespaces::NamespacePlan};
use crate::tools::exec::ExecContext;
use crate::tools::{ToolArgs, ToolRequest, ToolResult};
use crate::trace::{SpanKind, SpanStatus, Trace};
use crate::worker::{WorkerConfig, WorkerHello};
use std::io::{BufRead, Write};
use std::path::Path;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A prefetch script that failed: its entry's name and what went wrong (redacted).
pub(crate) struct PrefetchFailure {
    pub name: String,
    pub detail: String,
    /// The script's sandbox could not be set up (the script did not run).
    pub sandbox: bool,
    /// SIGINT or SIGTERM came: the script was killed or never started.
    pub cancelled: bool,
}

/// What the prefetch scripts gave: their outputs as markdown sections, and the
/// entries whose output went over the cap (kept as head and tail around a marker).
#[derive(Debug, Default)]
pub(crate) struct Prefetched {
    pub text: String,
    pub truncated: Vec<String>,
}

/// Runs every prefetch entry of the prompt in order, reporting each to `progress`;
/// returns their outputs, or the first failure.
pub(crate) fn run_all(
    root: &Path,
    worker_cmd: &(PathBuf, Vec<String>),
    config: &FireConfig,
    trace: &mut Trace,
    progress: &dyn ProgressSink,
) -> Result<Prefetched, PrefetchFailure> {
    let mut out = Prefetched::default();
    for p in &config.prompt.front.prefetch {
        let span = trace.start(SpanKind::Prefetch, format!("prefetch {}", p.name));
        progress.event(&Event::PrefetchStarted { name: p.name.clone() });
        let started = Instant::now();
        let finished = |ok: bool| {
            progress.event(&Event::PrefetchFinished {
                name: p.name.clone(),
                elapsed: started.elapsed(),
                ok,
            })
        };
        crate::failpoint!("during-prefetch");
        if crate::cancel::requested() {
            finished(false);
            trace.end(span, SpanStatus::Cancelled);
            return Err(PrefetchFailure {
                name: p.name.clone(),
                detail: format!("{}: not run: the fire was cancelled", p.run),
                sandbox: false,
                cancelled: true,
            });
        }
        let timeout = Duration::from_secs(p.timeout_s.unwrap_or(config.limits.prefetch_timeout_s));
        let script = Script {
            path: &p.run,
            args: &p.args,
            ports: &p.network,
            timeout,
            cap: config.limits.tool_output_bytes,
        };
        match run_script(root, worker_cmd, config, &script) {
            Ok((text, truncated)) => {
                finished(true);
                trace.attr(span, "agent.output_bytes", text.len() as u64);
                trace.end(span, SpanStatus::Ok);
                if truncated {
                    out.truncated.push(p.name.clone());
                }
                out.text.push_str(&format!(
                    "\n\n### {}\n\n```\n{}\n```",
                    p.name,
                    config.redactor.redact(text.trim_end())
                ));
            }
            Err((why, sandbox)) => {
                finished(false);
                let cancelled = crate::cancel::requested();
                trace.end(
                    span,
                    if cancelled {
                        SpanStatus::Cancelled
                    } else {
                        SpanStatus::Error
                    },
                );
                return Err(PrefetchFailure {
                    name: p.name.clone(),
                    detail: format!("{}: {}", p.run, config.redactor.redact(&why)),
                    sandbox: sandbox && !cancelled,
                    cancelled,
                });
            }
        }
    }
    Ok(out)
}

/// One prefetch script to run.
struct Script<'a> {
    path: &'a str,
    args: &'a [String],
    /// The TCP ports the entry grants (its `network`), instead of the tools'.
    ports: &'a [u16],
    timeout: Duration,
    cap: usize,
}

/// Runs a builder script from `tools/` with a timeout and a scrubbed environment, in
/// a sandboxed worker of its own. `Err` says why, and whether the sandbox failed.
fn run_script(
    root: &Path,
    worker_cmd: &(PathBuf, Vec<String>),
    config: &FireConfig,
    script: &Script,
) -> Result<(String, bool), (String, bool)> {
    // The committed script, written out for this run (or the work tree's in a dry run).
    let path = config.script_path(script.path);
    if !root.join(&path).is_file() {
        return Err((format!("script `{}` does not exist", script.path), false));
    }
    let mut command = shell_quote(&path);
    for a in script.args {
        command.push(' ');
        command.push_str(&shell_quote(a));
    }
    let req = ToolRequest {
        apart: false,
        masked: Vec::new(),
        call_id: "prefetch".into(),
        args: ToolArgs::RunCommand {
            command,
            timeout_s: None,
        },
        timeout_ms: script.timeout.as_millis() as u64,
        output_limit: script.cap,
    };
    // The tool worker's sandbox (the root's git directory only), with the network
    // the entry grants rather than the tools'.
    let mut spec = sandbox::worker_spec(root, &[], &config.scratch, &config.settings, config.policy.ownership());
    spec.connect_ports = script.ports.to_vec();
    let worker = WorkerConfig {
        root: root.to_path_buf(),
        scratch: config.scratch.clone(),
        isolation: Some(NamespacePlan::new(
            &spec,
            root,
            Vec::new(),
            config.settings.sandbox.write_bytes,
        )),
        mcp: None,
        spec,
        mode: config.settings.sandbox.landlock,
        env: ExecContext::scrubbed_env(&config.scratch),
    };
    let r = run_in_worker(worker_cmd, &worker, &req)?;
    match r.error {
        None => Ok((r.output, r.truncated)),
        Some(c) => Err((format!("{}: {}", c.as_str(), r.output.trim()), false)),
    }
}

/// Starts a worker, sends it `config` and the one request, and reads its answer.
fn run_in_worker(
    (exe, args): &(PathBuf, Vec<String>),
    config: &WorkerConfig,
    req: &ToolRequest,
) -> Result<ToolResult, (String, bool)> {
    let broken = |e: String| (format!("the prefetch worker failed: {e}"), true);
    let mut child = spawn_process(exe, args, &config.env).map_err(|e| broken(e.to_string()))?;
    // SIGINT/SIGTERM kills the worker (and with it the script's namespace) at once.
    let guard = crate::cancel::ChildGuard::new(child.id());
    let sent = (|| -> Result<(), String> {
        let mut stdin = child.stdin.take().ok_or("no stdin")?;
        let config = serde_json::to_string(config).map_err(|e| e.to_string())?;
        let req = serde_json::to_string(req).map_err(|e| e.to_string())?;
        stdin
            .write_all(format!("{config}\n{req}\n").as_bytes())
            .map_err(|e| e.to_string())
    })();
    let answer = sent.and_then(|()| {
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let mut next = || match lines.next() {
            Some(Ok(l)) => Ok(l),
            Some(Err(e)) => Err(e.to_string()),
            None => Err("the worker exited without answering".to_string()),
        };
        let hello = next()?;
        let result = match serde_json::from_str::<WorkerHello>(&hello) {
            Ok(WorkerHello::Ready(_)) => next(),
            Ok(WorkerHello::Refused(why)) => return Ok(Err(why)),
            Err(e) => Err(format!("{e}: {hello}")),
        }?;
        serde_json::from_str::<ToolResult>(&result)
            .map(Ok)
            .map_err(|e| format!("{e}: {result}"))
    });
    // A worker that stopped answering: how it ended says why (a signal is the OOM
    // killer or another process, not a sandbox that could not be set up).
    let ended = match &answer {
        Err(_) => exit_of(&mut child),
        Ok(_) => None,
    };
    let _ = child.kill();
    drop(guard);
    let _ = child.wait();
    match (answer, ended) {
        (Ok(Ok(r)), _) => Ok(r),
        (Ok(Err(why)), _) => Err((format!("the script's sandbox could not be set up: {why}"), true)),
        (Err(e), Some(status)) => Err((worker_ended(status, &e), false)),
        (Err(e), None) => Err(broken(e)),
    }
}

/// How the worker ended, waiting a moment for a worker that closed its output
/// (`None`: still running, or its status could not be read).
fn exit_of(child: &mut std::process::Child) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) | Err(_) => return None,
        }
    }
}

/// Why a prefetch worker that ended with `status` gave no answer, in words.
fn worker_ended(status: std::process::ExitStatus, read: &str) -> String {
    use std::os::unix::process::ExitStatusExt;
    // The process started is the sandbox's outer half: it reports a worker that a
    // signal killed inside the namespaces as 128 + the signal, as a shell does.
    let signal = status
        .signal()
        .or_else(|| status.code().filter(|c| (129..=128 + 64).contains(c)).map(|c| c - 128));
    match signal {
        Some(sig) => format!(
            "the prefetch worker was killed by signal {sig}{} while the script ran (the OOM killer or another process; not the sandbox): the script may have partly run and its output is lost",
            if sig == libc::SIGKILL { " (SIGKILL)" } else { "" }
        ),
        None => format!(
            "the prefetch worker exited ({status}) without answering: {read}"
        ),
    }
}

/// Quotes `s` as one word for `sh` ([`crate::shell::quote`]).
pub(crate) fn shell_quote(s: &str) -> String {
    crate::shell::quote(s)
}
