//! Whether a run of the task waits for a builder's approval, asked on every fire (not
//! a resume). The answer needs the state database, whose first open in a process
//! parses its schema and rebuilds the write-ahead log's index (about 1 ms), so it is
//! asked on a thread of its own from the moment the task lock is taken, while the
//! preparation reads HEAD's settings and the builder paths' status. The fire takes
//! the answer before it writes a record, a card or a manifest, and before it syncs
//! ([`WaitingCheck::answer`]); the connection the thread opened is kept for the
//! fire's next open of the database. What comes before only reads: a sync step a
//! killed fire left half done is settled after the answer, and a stop before it (an
//! eval fire's refusal) still yields to a waiting run.
//!
//! While a run waits, a fire runs nothing and records nothing. Once the pause is
//! decided and a `runtime resume` of it was interrupted (its row says `running`, its
//! process is gone), the fire does not wait on it: it continues the paused run as that
//! resume would have, so a killed resume never holds the task at exit 4; the tool
//! ledger keeps the approved call to at most one run.

use super::{FireContext, FireEnd, FireSummary};
use crate::records::RunStatus;
use crate::state::StateDb;
use std::path::Path;
use std::thread::JoinHandle;

/// What the state database says about the task's paused runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Waiting {
    /// No run waits (or the database could not tell: the fire goes on, as before).
    No,
    /// The decided pause `run`, whose resume was interrupted: the fire continues it.
    Continue(String),
    /// `run` waits: for a builder's decision, or (`decided`) for `runtime resume`.
    Waits { run: String, decided: bool },
    /// `run` waits, but its checkpoint cannot be read (`why`): nothing can ever decide
    /// or resume it, so the fire gives it up, on a card, and runs afresh.
    Unreadable { run: String, why: String },
}

/// The question, asked on a thread; answered once.
pub(super) struct WaitingCheck {
    asking: Option<JoinHandle<Waiting>>,
    /// The answer, when it was asked in line (no thread could be started).
    asked: Option<Waiting>,
}

impl WaitingCheck {
    /// Starts asking for the fire of `ctx` (a resume asks nothing). Where no thread can
    /// be started, the question is asked here and now.
    pub(super) fn start(ctx: &FireContext) -> WaitingCheck {
        if ctx.opts.resume.is_some() {
            return WaitingCheck::none();
        }
        let (root, task) = (ctx.opts.root.clone(), ctx.opts.task.clone());
        match std::thread::Builder::new()
            .name("waiting-check".into())
            .spawn(move || check(&root, &task))
        {
            Ok(asking) => WaitingCheck {
                asking: Some(asking),
                asked: None,
            },
            Err(e) => {
                tracing::debug!(error = %e, "no thread for the waiting check: asked in line");
                WaitingCheck {
                    asking: None,
                    asked: Some(check(&ctx.opts.root, &ctx.opts.task)),
                }
            }
        }
    }

    /// A fire that asks nothing (a dry run, a resume).
    pub(super) fn none() -> WaitingCheck {
        WaitingCheck {
            asking: None,
            asked: None,
        }
    }

    /// The answer, waiting for the thread if it is still asking.
    pub(super) fn answer(&mut self) -> Waiting {
        if let Some(w) = self.asked.take() {
            return w;
        }
        match self.asking.take().map(JoinHandle::join) {
            None => Waiting::No,
            Some(Ok(w)) => w,
            // A bug in the check: it ends the fire as it did when asked in line.
            Some(Err(panic)) => std::panic::resume_unwind(panic),
        }
    }
}

impl Drop for WaitingCheck {
    /// Never left running: the fire enters its sandbox (which binds the calling
    /// thread and those it creates afterwards) and writes its records after the
    /// thread is done.
    fn drop(&mut self) {
        if let Some(asking) = self.asking.take() {
            let _ = asking.join();
        }
    }
}

/// The summary of a fire that found `run` waiting.
pub(super) fn waiting_summary(ctx: &FireContext, run: &str, decided: bool) -> FireSummary {
    let mut summary = ctx.unrecorded(
        RunStatus::WaitingApproval,
        FireEnd::WaitingApproval,
        if decided {
            format!("run {run} of this task is decided and waits for `runtime resume`; nothing was run")
        } else {
            format!("run {run} of this task waits for a builder's approval; nothing was run")
        },
    );
    summary.hint = Some(if decided {
        format!("`runtime resume {run}` runs the decided call and finishes the run")
    } else {
        format!("`builder approve-call {run} <call-id>` (add `--deny` to refuse it), then `runtime resume {run}`")
    });
    summary
}

#[tracing::instrument(level = "debug", name = "waiting", skip_all)]
fn check(root: &Path, task: &str) -> Waiting {
    let db = match StateDb::open_for_reading(root) {
        Ok(db) => db,
        Err(e) => {
            tracing::warn!(error = %e, "cannot tell whether a run waits for approval");
            return Waiting::No;
        }
    };
    let run = match db.waiting_run(task) {
        Ok(Some(run)) => run,
        Ok(None) => return Waiting::No,
        Err(e) => {
            tracing::warn!(error = %e, "cannot tell whether a run waits for approval");
            return Waiting::No;
        }
    };
    let checkpoint = match db.checkpoint(&run) {
        Ok(c) => c,
        Err(e) => {
            return Waiting::Unreadable {
                run,
                why: e.to_string(),
            }
        }
    };
    let decided = checkpoint.and_then(|c| {
        let p = c.state.pending?;
        db.decision(&run, &p.call.id, &p.args_hash).ok().flatten()
    });
    if decided.is_some() {
        let interrupted = crate::journal::live_runs(db.store(), task)
            .unwrap_or_default()
            .into_iter()
            .any(|l| l.ledger_run == run && l.run_id != run && l.owner_gone());
        if interrupted {
            tracing::info!(run = %run, "a resume of the decided pause was interrupted: this fire continues it");
            return Waiting::Continue(run);
        }
    }
    Waiting::Waits {
        run,
        decided: decided.is_some(),
    }
}
