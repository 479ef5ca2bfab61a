//! One fire of a task (docs/design.md), in phases so the binary can enter the
//! sandbox between them: [`prepare`] (repository, lock, dirty check, load and validate,
//! prefetch) runs single-threaded and ends in a [`FireRun`] or an [`EarlyEnd`]; the
//! binary then restricts itself with Landlock ([`FireRun::enter_sandbox`]) and starts
//! its async runtime for [`FireRun::run`] (tool worker, loop, acceptance checks);
//! [`FireRun::finish`] writes the report, receipt and cards through the one records
//! writer ([`finish`]) and commits them under the runtime identity. The fire's
//! configuration is resolved once, in [`config`].
//!
//! The library says how a fire ended ([`FireEnd`]); the binary chooses the exit code.

pub mod config;
mod dry_run;
mod ending;
mod finish;
mod masks;
mod mcp_start;
mod outputs;
mod prefetch;
mod prepare;
mod recover;
mod run;
pub(crate) mod sync;
mod waiting;

use crate::agent::{CardDraft, LoopState};
use crate::progress::ProgressSink;
use crate::records::{AcceptanceRecord, Inputs, RunStatus, SandboxRecord, StopReason};
use crate::state::LockFile;
use chrono::{DateTime, Utc};
use config::FireConfig;
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

pub use dry_run::{dry_run, DryRun, ProviderView};
pub use finish::PAUSE_BEFORE_COMMIT_ENV;
pub use prepare::{check_gate, prepare, Gate};

/// What the caller asks of one fire.
pub struct FireOptions {
    pub root: PathBuf,
    pub task: String,
    pub no_commit: bool,
    /// Program and arguments that start the tool worker.
    pub worker_cmd: (PathBuf, Vec<String>),
    /// Continue this paused run from its checkpoint instead of starting afresh.
    pub resume: Option<String>,
    /// Where the fire reports its progress (prefetch, steps, model and tool calls,
    /// retries, fallback); [`crate::progress::Silent`] shows nothing.
    pub progress: Arc<dyn ProgressSink>,
    /// Answer from this recorded trace (the replay provider's format) instead of the
    /// settings' provider, with no fallback: `builder eval`'s scripted cases and a
    /// card's run re-run with its recorded model responses.
    pub replay: Option<PathBuf>,
    /// A fire of `builder eval` (only with `no_commit`): under `require_reviewed` it
    /// runs a builder tree no approval covers yet (the proposal under review) instead
    /// of refusing; nothing it does is committed.
    pub eval: bool,
    /// For an eval fire: the trusted configuration whose powers (sandbox, network,
    /// read directories, provider and key variable, telemetry) the fire runs under
    /// instead of the revision's own ([`crate::powers::confine`]); settings that would
    /// widen any of them refuse the fire.
    pub trusted: Option<crate::settings::RuntimeSettings>,
    /// The repository at `root` when the caller opened it already
    /// ([`crate::git::open_work_tree`], as `runtime fire` does to find `root`): the
    /// fire goes on with this handle instead of opening the repository again.
    pub opened: Option<git2::Repository>,
}

/// How a fire ended, in the terms the binary maps to exit codes (docs/design.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FireEnd {
    /// Accepted, or completed without acceptance checks.
    Completed,
    /// The run failed: a stop other than a final answer, a failed acceptance check, a
    /// refusal to fire (unreviewed changes, a failed prefetch, no sandbox), a signal.
    Failed,
    /// The task name, settings, prompt or scope are wrong: fix the input.
    InvalidInput,
    /// The machine got in the way: a lock held, permissions, a full disk, no repository.
    Environment,
    /// Another fire of the task holds its lock.
    Skipped,
    /// Paused on a call that needs a builder's approval.
    WaitingApproval,
    /// Completed, but cards were written: needs attention.
    NeedsAttention,
    /// A bug in the runtime.
    Internal,
}

/// Output of a fire, printed with `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct FireSummary {
    pub run_id: String,
    pub task: String,
    pub status: RunStatus,
    pub stop_reason: StopReason,
    pub end: FireEnd,
    pub report: Option<String>,
    /// The report's text as this fire wrote it (redacted), for `--print-report`: kept
    /// from the write, never read back from a file the model could have replaced.
    #[serde(skip)]
    pub report_text: Option<String>,
    pub receipt: Option<String>,
    pub cards: Vec<String>,
    pub commit: Option<String>,
    /// The records were written (or kept in git) but not committed: a
    /// `commit_blocked` card says what stood in the way (a person's rebase, a lock, a
    /// full disk), and the next fire of any task commits them.
    pub records_kept: bool,
    /// One line: what happened, and for a failure, why.
    pub message: String,
    /// The next command to run, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

/// Who this fire is: its options, run id and start times. Fixed at the first moment.
pub(crate) struct FireContext {
    pub opts: FireOptions,
    pub run_id: String,
    pub started_at: DateTime<Utc>,
    /// Monotonic start, for budgets and durations.
    pub started: Instant,
    /// The run's private scratch directory ([`config::scratch_dir`]), chosen now: the
    /// tool worker's process, started early, has it as its `HOME`.
    pub scratch: std::path::PathBuf,
}

impl FireContext {
    fn new(opts: FireOptions) -> FireContext {
        let started_at = crate::trace::now_utc();
        FireContext {
            run_id: crate::records::new_id(started_at, &opts.task),
            started_at,
            started: Instant::now(),
            scratch: config::scratch_dir(&opts.root),
            opts,
        }
    }

    /// Opens the fire's root span in `trace`, started when the fire started.
    fn open_root(&self, trace: &mut crate::trace::Trace) {
        let start_ns = self.started_at.timestamp_nanos_opt().unwrap_or(0).max(0) as u64;
        trace.open_root(format!("fire {}", self.opts.task), start_ns);
    }

    /// The run whose approvals apply: this one, or the paused run being resumed.
    fn approval_run(&self) -> &str {
        self.opts.resume.as_deref().unwrap_or(&self.run_id)
    }

    /// The outcome of a fire that ended before it had anything to record.
    fn unrecorded(&self, status: RunStatus, end: FireEnd, message: impl Into<String>) -> FireSummary {
        FireSummary {
            run_id: self.run_id.clone(),
            task: self.opts.task.clone(),
            status,
            stop_reason: StopReason::NotStarted,
            end,
            report: None,
            report_text: None,
            receipt: None,
            cards: vec![],
            commit: None,
            records_kept: false,
            message: message.into(),
            hint: None,
        }
    }
}

/// Everything one run leaves behind, described once: [`finish::write`] turns it into
/// the report, the receipt, the cards, the trace row and the commit.
pub(crate) struct RunRecords {
    pub status: RunStatus,
    pub stop: StopReason,
    pub inputs: Inputs,
    pub sandbox: SandboxRecord,
    pub state: LoopState,
    pub acceptance: Vec<AcceptanceRecord>,
}

/// A fire that ended before its loop.
pub enum EarlyEnd {
    /// Nothing to record: not a task, the lock is held, no repository, a bug.
    Unrecorded(Box<FireSummary>),
    /// Refused with a card, a report and a receipt (bad settings, unreviewed changes,
    /// a failed prefetch).
    Refused(Box<prepare::Refusal>),
}

impl EarlyEnd {
    /// Writes what the early end leaves behind, and says how the fire ended.
    pub fn finish(self) -> FireSummary {
        match self {
            EarlyEnd::Unrecorded(summary) => *summary,
            EarlyEnd::Refused(refusal) => refusal.finish(),
        }
    }
}

/// Why a prepared fire stopped before or during its loop without a stop reason of
/// the loop's own (no sandbox, no provider).
struct Abort {
    end: FireEnd,
    card: CardDraft,
}

/// Marks a fire that cannot go on: call [`FireRun::finish`] to record why.
#[derive(Debug)]
pub struct Aborted;

/// A fire that passed preparation.
pub struct FireRun {
    ctx: FireContext,
    config: FireConfig,
    /// The task's lock, held to the end; none in a dry run.
    _lock: Option<LockFile>,
    inputs: Inputs,
    /// The sandbox that model-run actions run in, for the receipt.
    pub sandbox: SandboxRecord,
    state: LoopState,
    stop: StopReason,
    acceptance: Vec<AcceptanceRecord>,
    abort: Option<Abort>,
    /// Opened for the dirty check and kept for the commit: git's index is loaded
    /// once per fire, not twice (0.3 s a load at 220,000 tracked files).
    repo: git2::Repository,
    /// The tool worker's process, started early in the preparation (before this
    /// process restricts itself: it makes namespaces, which Landlock would refuse
    /// it) and adopted by the loop.
    worker: Option<run::WorkerProcess>,
    /// A second worker process started with it, to replace it once if it dies.
    spare_worker: Option<std::process::Child>,
    /// The thread walking the worker's masks, joined when the fire's run is dropped.
    mask_walk: masks::WalkThread,
    /// A worker process per declared MCP server, started with the tool worker.
    mcp_workers: Vec<crate::agent::mcp_client::Spawned>,
    /// The run's journal (its row, a checkpoint after every step, the tool ledger);
    /// `None` in a dry run or where the state database cannot be written.
    journal: Option<crate::journal::Journal>,
    /// With `sync`: what the sync before the fire found, and the push after it.
    sync: Option<crate::fire::sync::FireSync>,
    /// The metadata manifest the fire was judged on (see [`crate::manifest`]), with
    /// the ownership it was scanned by: compared again when the fire ends.
    metadata: Option<(crate::manifest::Manifest, crate::layout::Ownership)>,
}
