//! Prefetch (DESIGN.md section 4, step 4): the builder's deterministic context
//! scripts from `tools/`, run before any model call with a timeout, an output cap and
//! a scrubbed environment, their output appended to the prompt as markdown so the
//! model spends no turns on it.

use super::config::FireConfig;
use crate::progress::{Event, ProgressSink};
use crate::tools::exec::ExecContext;
use crate::tools::{ToolArgs, ToolRequest};
use crate::trace::{SpanKind, SpanStatus, Trace};
use std::path::Path;
use std::time::{Duration, Instant};

/// A prefetch script that failed: its entry's name and what went wrong (redacted).
pub(crate) struct PrefetchFailure {
    pub name: String,
    pub detail: String,
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
        let timeout = Duration::from_secs(p.timeout_s.unwrap_or(config.limits.prefetch_timeout_s));
        match run_script(
            root,
            &config.scratch,
            &p.run,
            &p.args,
            timeout,
            config.limits.tool_output_bytes,
        ) {
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
            Err(why) => {
                finished(false);
                trace.end(span, SpanStatus::Error);
                return Err(PrefetchFailure {
                    name: p.name.clone(),
                    detail: format!("{}: {}", p.run, config.redactor.redact(&why)),
                });
            }
        }
    }
    Ok(out)
}

/// Runs a builder script from `tools/` with a timeout and a scrubbed environment.
fn run_script(
    root: &Path,
    scratch: &Path,
    script: &str,
    args: &[String],
    timeout: Duration,
    cap: usize,
) -> Result<(String, bool), String> {
    if !root.join(script).is_file() {
        return Err(format!("script `{script}` does not exist"));
    }
    let ctx = ExecContext {
        root: root.to_path_buf(),
        scratch: scratch.to_path_buf(),
        env: ExecContext::scrubbed_env(scratch),
    };
    let mut command = shell_quote(script);
    for a in args {
        command.push(' ');
        command.push_str(&shell_quote(a));
    }
    let req = ToolRequest {
        masked: Vec::new(),
        call_id: "prefetch".into(),
        args: ToolArgs::RunCommand {
            command,
            timeout_s: None,
        },
        timeout_ms: timeout.as_millis() as u64,
        output_limit: cap,
    };
    let r = crate::tools::exec::execute(&ctx, &req);
    match r.error {
        None => Ok((r.output, r.truncated)),
        Some(c) => Err(format!("{}: {}", c.as_str(), r.output.trim())),
    }
}

/// Quotes `s` as one word for `sh`.
pub(crate) fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}
