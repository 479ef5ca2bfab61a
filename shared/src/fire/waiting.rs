//! Whether a run of the task waits for a builder's approval, asked on every fire (not
//! a resume). The answer needs the state database, whose first open in a process
//! parses its schema and rebuilds the write-ahead log's index (about 1 ms), so it is
//! asked on a thread of its own: the thread opens the database as the fire begins,
//! while the repository is opened and the task lock taken, and asks once the lock is
//! held ([`WaitingCheck::ask`]: before it, another fire of the task could still pause),
//! while the preparation reads HEAD's settings and the builder paths' status. The fire takes
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
    /// Tells the thread the task lock is held: it asks then (dropped unsent, it asks
    /// nothing).
    go: Option<std::sync::mpsc::Sender<()>>,
    /// Where no thread could be started: what to ask in line, once the lock is held.
    in_line: Option<(std::path::PathBuf, String)>,
    /// The answer, when it was asked in line.
    asked: Option<Waiting>,
}

impl WaitingCheck {
    /// Opens the state database for the fire of `ctx` on a thread of its own (a resume
    /// asks nothing); [`WaitingCheck::ask`] asks once the task lock is held. Where no
    /// thread can be started, the question is asked in line then.
    pub(super) fn start(ctx: &FireContext) -> WaitingCheck {
        if ctx.opts.resume.is_some() {
            return WaitingCheck::none();
        }
        let (root, task) = (ctx.opts.root.clone(), ctx.opts.task.clone());
        let (go, lock_held) = std::sync::mpsc::channel();
        let asking = std::thread::Builder::new().name("waiting-check".into()).spawn(move || {
            let early = opens_without_writing(&root)
                .then(|| StateDb::open_if_sound(&root))
                .flatten();
            match lock_held.recv() {
                Ok(()) => early
                    .or_else(|| open(&root))
                    .map_or(Waiting::No, |db| check(&db, &task)),
                Err(_) => Waiting::No,
            }
        });
        match asking {
            Ok(asking) => WaitingCheck {
                asking: Some(asking),
                go: Some(go),
                in_line: None,
                asked: None,
            },
            Err(e) => {
                tracing::debug!(error = %e, "no thread for the waiting check: asked in line");
                WaitingCheck {
                    asking: None,
                    go: None,
                    in_line: Some((ctx.opts.root.clone(), ctx.opts.task.clone())),
                    asked: None,
                }
            }
        }
    }

    /// A fire that asks nothing (a dry run, a resume).
    pub(super) fn none() -> WaitingCheck {
        WaitingCheck {
            asking: None,
            go: None,
            in_line: None,
            asked: None,
        }
    }

    /// The task lock is held: the question is asked now.
    pub(super) fn ask(&mut self) {
        if let Some(go) = self.go.take() {
            let _ = go.send(());
        }
        if let Some((root, task)) = self.in_line.take() {
            self.asked = Some(open(&root).map_or(Waiting::No, |db| check(&db, &task)));
        }
    }

    /// The answer, waiting for the thread if it is still asking.
    pub(super) fn answer(&mut self) -> Waiting {
        self.ask();
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
        // Unsent, the thread asks nothing.
        self.go = None;
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

/// Whether the state database may be opened before the task lock is held: only one
/// that exists, in a `.runtime` that is a directory. A fire that ends before its
/// lock (a mistyped task, a repository without commits, a `.runtime` a revision
/// linked elsewhere, which the lock refuses) creates no database, and the early open
/// moves no damaged one aside ([`StateDb::open_if_sound`]): that is left to the open
/// after the lock, as the fire's own.
fn opens_without_writing(root: &Path) -> bool {
    let is =
        |p: &Path, dir: bool| std::fs::symlink_metadata(p).is_ok_and(|m| if dir { m.is_dir() } else { m.is_file() });
    is(&root.join(crate::layout::STATE_DIR), true) && is(&crate::state::db_path(root), false)
}

/// The state database, or `None` (warned: the fire goes on, as when it cannot tell).
fn open(root: &Path) -> Option<StateDb> {
    StateDb::open_for_reading(root)
        .map_err(|e| tracing::warn!(error = %e, "cannot tell whether a run waits for approval"))
        .ok()
}

#[tracing::instrument(level = "debug", name = "waiting", skip_all)]
fn check(db: &StateDb, task: &str) -> Waiting {
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
