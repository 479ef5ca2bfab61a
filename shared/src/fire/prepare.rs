//! Steps 1-4 of a fire, before any model-influenced code runs: open the repository,
//! take the task's lock, refuse unreviewed changes, load and validate settings, prompt
//! and scope into one [`FireConfig`], and build the first conversation (prefetch, or a
//! paused run's checkpoint). Each phase either hands on what it made or stops with a
//! [`Stop`]; a stop with a card becomes a [`Refusal`] whose records the one writer
//! writes.

use super::config::{self, FireConfig};
use super::ending::{hint_for, Ending};
use super::finish::{self, RecordSink};
use super::prefetch;
use super::recover;
use super::{EarlyEnd, FireContext, FireEnd, FireOptions, FireRun, FireSummary, RunRecords};
use crate::agent::{context, CardDraft, LoopState};
use crate::journal::{Journal, RunStart};
use crate::layout::{Ownership, SCOPE_FILE, SETTINGS_FILE};
use crate::prompt;
use crate::provider::Message;
use crate::records::{self, CardKind, Inputs, RunStatus, SandboxRecord, StopReason};
use crate::settings::{self, RuntimeSettings};
use crate::state::{self, LockFile, LockWait, StateDb};

/// Why preparation stopped: how the fire ends, and the card to record (none when
/// there is nothing worth a record).
pub(crate) struct Stop {
    end: FireEnd,
    /// Boxed: a `Stop` is every preparation step's error, and stays small.
    card: Option<Box<CardDraft>>,
    message: String,
    /// The next step for this situation, when the card kind's usual hint
    /// ([`hint_for`]) would point the wrong way.
    hint: Option<String>,
}

impl Stop {
    fn carded(end: FireEnd, kind: CardKind, summary: String, detail: String) -> Stop {
        Stop {
            end,
            message: summary.clone(),
            card: Some(Box::new(CardDraft {
                kind,
                summary,
                detail,
                evidence: vec![],
            })),
            hint: None,
        }
    }

    fn with_hint(mut self, hint: impl Into<String>) -> Stop {
        self.hint = Some(hint.into());
        self
    }

    fn bare(end: FireEnd, message: impl Into<String>) -> Stop {
        Stop {
            end,
            card: None,
            message: message.into(),
            hint: None,
        }
    }
}

/// A fire refused during preparation, with what it records.
pub struct Refusal {
    ctx: FireContext,
    end: FireEnd,
    card: CardDraft,
    /// Cards recovery wrote before the refusal (runs it closed as `crashed`): always
    /// recorded with it, never dropped, so a refusal that carries them is recorded
    /// even when it repeats the task's last one.
    recovered: Vec<CardDraft>,
    /// The message, when it is not the card's summary.
    message: Option<String>,
    /// A paused run whose approved call can no longer run (`approval_stale`): its
    /// checkpoint goes once the refusal is recorded, so the task is not held at exit 4
    /// by a pause nothing can settle.
    close_paused: Option<String>,
    inputs: Inputs,
    settings: Option<RuntimeSettings>,
    repo: git2::Repository,
    /// With `sync`: the refusal's records are pushed like a fire's.
    sync: Option<crate::fire::sync::FireSync>,
    _lock: Option<LockFile>,
    /// The situation's own next step, over the card kind's usual one.
    hint: Option<String>,
}

impl Refusal {
    /// Writes the refusal's card, report and receipt, and commits them; a refusal
    /// identical to the task's last one (same fingerprint, same builder tree) is only
    /// counted in the state database.
    pub(crate) fn finish(self) -> FireSummary {
        let redactor = config::redactor(self.settings.as_ref());
        let task = &self.ctx.opts.task;
        let fingerprint = records::fingerprint(task, self.card.kind, &redactor.redact(&self.card.detail));
        let tree = builder_tree(&self.repo);
        let mut db = StateDb::open(&self.ctx.opts.root);
        if let (Ok(db), true) = (&mut db, self.recovered.is_empty()) {
            if let Some(summary) = self.already_recorded(db, &fingerprint, &tree) {
                return summary;
            }
        }
        let mut state = LoopState::default();
        state.cards.extend(self.recovered.iter().cloned());
        state.cards.push(self.card.clone());
        let mut records = RunRecords {
            status: RunStatus::Failed,
            stop: StopReason::NotStarted,
            inputs: self.inputs,
            sandbox: SandboxRecord::default(),
            state,
            acceptance: vec![],
        };
        let sink = refusal_sink(&self.repo, self.settings.as_ref(), redactor);
        let message = match (&self.message, self.card.kind) {
            (Some(m), _) => m.clone(),
            // The paths, so the person reading cron's mail knows what to commit.
            (None, CardKind::UnreviewedChanges) => format!("{}: {}", self.card.summary, self.card.detail),
            (None, _) => self.card.summary.clone(),
        };
        let hint = self
            .hint
            .clone()
            .or_else(|| hint_for(self.card.kind, &self.ctx.run_id, None));
        let ending = Ending::refused(self.end, message, hint);
        let summary = finish::write(&self.ctx, &sink, &mut records, db.as_mut().ok(), |_| ending);
        if let (Some(sync), Some(_)) = (&self.sync, &summary.commit) {
            // The refusal's card reaches the remote as a fire's records do; a push
            // that fails leaves it committed here for the next push.
            if let Err(e) = sync.push(&self.repo, &sink.identity.email) {
                tracing::warn!(error = %e, "the refusal's records were not pushed");
            }
        }
        if let (Ok(db), Some(card_id), Some(_)) = (&mut db, summary.cards.first(), &summary.commit) {
            if let Err(e) = db.remember_refusal(task, &fingerprint, &tree, card_id, self.ctx.started_at) {
                tracing::warn!(error = %e, "the refusal was not remembered; the next one is recorded again");
            }
        }
        if let (Some(paused), Ok(db)) = (&self.close_paused, &mut db) {
            if let Err(e) = db.delete_checkpoint(paused) {
                tracing::warn!(error = %e, run = %paused, "the stale pause was not closed; the task's fires still wait on it");
            }
        }
        summary
    }

    /// The summary of a refusal identical to the task's last one (same fingerprint,
    /// same builder tree), counted in the state database and not recorded again;
    /// `None` records it.
    fn already_recorded(&self, db: &mut StateDb, fingerprint: &str, tree: &str) -> Option<FireSummary> {
        let task = &self.ctx.opts.task;
        match db.repeat_refusal(task, fingerprint, tree, self.ctx.started_at) {
            Ok(Some(seen)) => {
                let mut summary = self.ctx.unrecorded(RunStatus::Failed, self.end, "");
                summary.message = format!(
                    "{} (unchanged since card {}, refused {} times; not recorded again)",
                    self.card.summary, seen.card_id, seen.count
                );
                summary.hint = self
                    .hint
                    .clone()
                    .or_else(|| hint_for(self.card.kind, &self.ctx.run_id, None));
                Some(summary)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the last refusal; recording this one");
                None
            }
        }
    }
}

/// Where a refusal's records go and who signs them. Settings that did not load
/// still name the runtime (and its signing key) in HEAD's text: the refusal's commit
/// is made, and signed, as theirs.
fn refusal_sink<'r>(
    repo: &'r git2::Repository,
    settings: Option<&RuntimeSettings>,
    redactor: crate::secrets::Redactor,
) -> RecordSink<'r> {
    RecordSink {
        redactor,
        identity: match settings {
            Some(s) => s.runtime_identity.clone(),
            None => repo
                .head()
                .and_then(|h| h.peel_to_tree())
                .and_then(|t| crate::review::runtime_commits::runtime_identity_of(repo, &t))
                .unwrap_or_default(),
        },
        telemetry: config::exporter(settings),
        repo,
        limits: settings.map(|s| s.limits).unwrap_or_default(),
        durability: settings.map(|s| s.durability).unwrap_or_default(),
        // A refused fire ran no tool.
        write_roots: Vec::new(),
    }
}

/// An approved call runs on resume only on the files it was approved on: a file it
/// names that changed since the pause ([`crate::agent::pins`]) refuses the resume
/// with an `approval_stale` card, before anything runs, and closes the pause (the
/// next fire of the task runs afresh and asks again). A denied call runs nothing,
/// so its pins do not matter. The tool ledger is read first: a call an earlier resume
/// started or completed (the files it names may have changed by its own doing) is
/// never judged stale; the loop settles it from the ledger (its recorded result, or
/// `SIDE_EFFECT_UNCERTAIN`) and never runs it again.
fn refuse_stale_approval(
    db: &StateDb,
    root: &std::path::Path,
    run_id: &str,
    pending: &crate::agent::PendingApproval,
) -> Result<(), Stop> {
    let decision = db
        .decision(run_id, &pending.call.id, &pending.args_hash)
        .map_err(|e| Stop::bare(FireEnd::Environment, e.to_string()))?;
    if decision != Some(crate::agent::CallDecision::Approve) {
        return Ok(());
    }
    let ledger = crate::journal::ledger_entry(db.store(), run_id, &pending.call.id)
        .map_err(|e| Stop::bare(FireEnd::Environment, e.to_string()))?;
    if ledger.is_some_and(|e| e.args_hash == pending.args_hash && e.stage != crate::journal::CallStage::Intended) {
        return Ok(());
    }
    let changed = crate::agent::pins::changed(root, &pending.pins);
    if changed.is_empty() {
        return Ok(());
    }
    let mut stop = Stop::carded(
        FireEnd::Failed,
        CardKind::ApprovalStale,
        format!(
            "the approved call `{}` of run `{run_id}` was not run: {} file(s) it names changed since the pause; the pause is closed",
            pending.call.id,
            changed.len()
        ),
        format!(
            "approved: {} {}; changed since the pause: {}",
            pending.call.name,
            pending.call.arguments,
            changed.iter().map(|c| c.path.as_str()).collect::<Vec<_>>().join(", ")
        ),
    );
    if let Some(card) = &mut stop.card {
        card.evidence = changed.iter().map(ToString::to_string).collect();
    }
    Err(stop)
}

/// HEAD's tree of builder-owned paths, or an empty marker when it cannot be read.
fn builder_tree(repo: &git2::Repository) -> String {
    crate::git::head_resolved(repo)
        .and_then(|h| h.peel_to_tree())
        .ok()
        .and_then(|t| crate::review::builder_tree_of(repo, &t).ok())
        .map(|o| o.to_string())
        .unwrap_or_default()
}

/// How long a fire waits for its task's lock before it skips. A process a fire had
/// just started (forked, not yet `exec`ed) holds a copy of its descriptors, the lock's
/// among them, for a moment after that fire was killed: a fire right after the kill
/// would otherwise skip on a lock no fire holds (seen in the crash suite on a loaded
/// machine). A fire that is really running holds it far longer.
const TASK_LOCK_GRACE: std::time::Duration = std::time::Duration::from_millis(250);

/// The task's lock, waiting at most [`TASK_LOCK_GRACE`]; `None` when another fire
/// still holds it then.
#[tracing::instrument(level = "debug", skip_all)]
fn take_task_lock(path: &std::path::Path) -> std::io::Result<Option<state::LockFile>> {
    let start = std::time::Instant::now();
    loop {
        match state::take_lock(path, LockWait::NoWait)? {
            Some(lock) => return Ok(Some(lock)),
            None if start.elapsed() < TASK_LOCK_GRACE => std::thread::sleep(std::time::Duration::from_millis(10)),
            None => return Ok(None),
        }
    }
}

/// The task's lock, or the fire's end: skipped (another fire of the task holds it),
/// or failed (it cannot be taken).
fn task_lock(ctx: &FireContext) -> Result<LockFile, EarlyEnd> {
    match take_task_lock(&state::task_lock_path(&ctx.opts.root, &ctx.opts.task)) {
        Ok(Some(lock)) => Ok(lock),
        Ok(None) => Err(EarlyEnd::Unrecorded(Box::new(skipped(ctx)))),
        Err(e) => {
            let why = format!("cannot take the task lock in {}: {e}", ctx.opts.root.display());
            Err(EarlyEnd::Unrecorded(Box::new(ctx.unrecorded(
                RunStatus::Failed,
                FireEnd::Environment,
                why,
            ))))
        }
    }
}

/// Steps 1-4: repository, lock, dirty check, load and validate, prefetch.
pub fn prepare(mut opts: FireOptions) -> Result<FireRun, EarlyEnd> {
    let opened = opts.opened.take();
    let ctx = FireContext::new(opts);
    // The state database opens meanwhile; it is asked once the lock is held.
    let mut waiting = super::waiting::WaitingCheck::start(&ctx);
    let repo = match open_task(&ctx, opened) {
        Ok(repo) => repo,
        Err(summary) => return Err(EarlyEnd::Unrecorded(summary)),
    };
    let lock = task_lock(&ctx)?;
    waiting.ask();
    // Started before the state database is read: its start overlaps all of that.
    let worker = start_worker_process(&ctx);
    let mut p = Preparing::new(ctx, repo, false);
    p.task_lock = Some(lock);
    p.worker = worker;
    p.waiting_check = waiting;
    let phases = p.phases();
    if phases.is_err() {
        // A stop before the answer was taken (an eval fire's refusal) still yields to
        // a waiting run, which records nothing.
        let _ = p.settle_waiting();
    }
    if let (Err(_), Some(summary)) = (&phases, p.waiting_summary.take()) {
        return Err(EarlyEnd::Unrecorded(summary));
    }
    match phases {
        Ok((config, state)) => {
            let lock = p.task_lock.take();
            Ok(p.into_run(config, state, lock))
        }
        Err(Stop {
            end,
            card,
            message,
            hint,
        }) => {
            let close_paused = p.close_paused.take();
            let mut recovered = std::mem::take(&mut p.recovery_cards);
            // A stop with nothing of its own to record still records what recovery
            // did (runs it closed as crashed): those cards are never dropped.
            let (card, message) = match card {
                Some(card) => (*card, None),
                None if !recovered.is_empty() => (recovered.remove(0), Some(message)),
                None => {
                    p.close_unrecorded();
                    return Err(EarlyEnd::Unrecorded(Box::new(p.ctx.unrecorded(
                        RunStatus::Failed,
                        end,
                        message,
                    ))));
                }
            };
            Err(EarlyEnd::Refused(Box::new(Refusal {
                ctx: p.ctx,
                end,
                card,
                recovered,
                message,
                close_paused,
                inputs: p.inputs,
                settings: p.settings,
                repo: p.repo,
                sync: p.sync,
                _lock: p.task_lock.take(),
                hint,
            })))
        }
    }
}

/// Step 1 before the lock: a valid task name, the repository, a commit to fire on and
/// a prompt for the task; otherwise the summary of a fire that writes nothing.
#[tracing::instrument(level = "debug", skip_all)]
fn open_task(ctx: &FireContext, opened: Option<git2::Repository>) -> Result<git2::Repository, Box<FireSummary>> {
    if !prompt::valid_task_name(&ctx.opts.task) {
        let why = format!(
            "`{}` is not a valid task name (letters, digits, `-`, `_`)",
            ctx.opts.task
        );
        return Err(Box::new(ctx.unrecorded(RunStatus::Failed, FireEnd::InvalidInput, why)));
    }
    let repo = match opened {
        Some(repo) => repo,
        None => crate::git::open_work_tree(&ctx.opts.root)
            .map(|wt| wt.repo)
            .map_err(|e| Box::new(ctx.unrecorded(RunStatus::Failed, FireEnd::Environment, e.to_string())))?,
    };
    match not_a_task(ctx, &repo) {
        Some(summary) => Err(Box::new(summary)),
        None => Ok(repo),
    }
}

/// A dry run of steps 1-4 (docs/design.md): what [`prepare`] resolves (settings,
/// policy, tools, prefetch output, the first conversation) without the task's lock and
/// without a record; uncommitted builder-owned changes, which a fire refuses, become a
/// note. The caller removes the scratch directory.
pub(crate) fn prepare_dry(mut opts: FireOptions) -> Result<(FireRun, DryNotes), Box<FireSummary>> {
    let opened = opts.opened.take();
    let ctx = FireContext::new(opts);
    let repo = open_task(&ctx, opened)?;
    let mut p = Preparing::new(ctx, repo, true);
    match p.phases() {
        Ok((config, state)) => {
            let notes = DryNotes {
                notes: std::mem::take(&mut p.notes),
                prefetched: std::mem::take(&mut p.prefetched),
            };
            Ok((p.into_run(config, state, None), notes))
        }
        Err(stop) => {
            // No card is written, so the message carries the card's detail (redacted):
            // the diagnostics with file:line, the failed prefetch script's output.
            let redactor = config::redactor(p.settings.as_ref());
            let message = match &stop.card {
                Some(card) if !card.detail.is_empty() && card.detail != stop.message => {
                    format!("{}\n{}", stop.message, redactor.redact(card.detail.trim_end()))
                }
                Some(_) | None => stop.message.clone(),
            };
            let mut summary = p.ctx.unrecorded(RunStatus::Failed, stop.end, message);
            if let Some(card) = &stop.card {
                summary.hint = stop.hint.clone().or_else(|| hint_for(card.kind, &p.ctx.run_id, None));
            }
            Err(Box::new(summary))
        }
    }
}

/// What a dry run's preparation learned beside the run itself.
pub(crate) struct DryNotes {
    /// What a fire would have refused or warned about.
    pub notes: Vec<String>,
    /// The prefetch output appended to the task prompt (markdown; empty for none).
    pub prefetched: String,
}

/// A fire that cannot be one: no commit to fire on (no commits yet, or HEAD names a
/// branch whose ref is missing), a HEAD that tracks the runtime's private state, or
/// no prompt for the task. It writes nothing, not even a directory.
fn not_a_task(ctx: &FireContext, repo: &git2::Repository) -> Option<FireSummary> {
    let (message, hint) = if let Some(branch) = crate::git::head_branch_missing(repo) {
        (
            format!("HEAD names {branch}, which does not exist (deleted, or not created yet)"),
            "check out an existing branch (`git branch -a` lists them) or restore this one from `git reflog`"
                .to_string(),
        )
    } else if matches!(crate::git::head_commit(repo), Ok(None)) {
        (
            "the repository has no commits yet".to_string(),
            "commit the scaffold first: `git add -A && git commit -m scaffold`".to_string(),
        )
    } else if let Some(refusal) = state::tracked_state_refusal(repo) {
        refusal
    } else if !ctx.opts.root.join(prompt::prompt_path(&ctx.opts.task)).is_file() {
        let known = prompt::task_names(&ctx.opts.root);
        let hint = match prompt::closest_task(&ctx.opts.task, &known) {
            Some(t) => format!("did you mean `{t}`?"),
            None if known.is_empty() => "no task has a prompt yet: add one under prompts/".into(),
            None => format!("known tasks: {}", known.join(", ")),
        };
        (
            format!(
                "no task `{}`: {} does not exist",
                ctx.opts.task,
                prompt::prompt_path(&ctx.opts.task).display()
            ),
            hint,
        )
    } else {
        return None;
    };
    let mut summary = ctx.unrecorded(RunStatus::Failed, FireEnd::InvalidInput, message);
    summary.hint = Some(hint);
    Some(summary)
}

/// Starts the tool worker's process now, so that its start (an exec of this binary)
/// overlaps the rest of the preparation; it waits for its configuration, which
/// [`Preparing::configure_worker`] sends. A process that could not be started is tried
/// again in step 5, where the failure is recorded. A refused fire drops it (and so
/// ends it: [`super::run::WorkerProcess`]).
#[tracing::instrument(level = "debug", skip_all)]
fn start_worker_process(ctx: &FireContext) -> Option<super::run::WorkerProcess> {
    let (exe, args) = &ctx.opts.worker_cmd;
    let env = crate::tools::exec::ExecContext::scrubbed_env(&ctx.scratch);
    match crate::agent::worker_client::spawn_process(exe, args, &env) {
        // The spare too, by a thread of its own: a spawn waits for its child's `exec`
        // (a `vfork`), which would otherwise hold the preparation.
        Ok(child) => Some(match spawn_spare(exe, args, env) {
            Ok(spare) => super::run::WorkerProcess::with_spare(child, spare),
            Err(_) => super::run::WorkerProcess::new(child),
        }),
        Err(e) => {
            tracing::debug!(error = %e, "the tool worker was not started early");
            None
        }
    }
}

/// Spawns the spare tool worker ([`crate::agent::worker_client::spawn_parked`]) on a
/// thread of its own.
fn spawn_spare(
    exe: &std::path::Path,
    args: &[String],
    env: Vec<(String, String)>,
) -> std::io::Result<std::thread::JoinHandle<std::io::Result<std::process::Child>>> {
    let (exe, args) = (exe.to_path_buf(), args.to_vec());
    std::thread::Builder::new()
        .name("spare-worker".into())
        .spawn(move || crate::agent::worker_client::spawn_parked(&exe, &args, &env))
}

/// A skipped fire leaves a row in the state database, never a file: a minute cron
/// must not flood history.
fn skipped(ctx: &FireContext) -> FireSummary {
    let recorded = StateDb::open(&ctx.opts.root)
        .map_err(|e| e.to_string())
        .and_then(|mut db| {
            db.record_skip(&ctx.run_id, &ctx.opts.task, ctx.started_at)
                .map_err(|e| e.to_string())
        });
    if let Err(e) = recorded {
        tracing::warn!(error = %e, "the skipped fire was not recorded");
    }
    ctx.unrecorded(
        RunStatus::Skipped,
        FireEnd::Skipped,
        "another fire of this task holds the lock",
    )
}

/// Git's status of the builder-owned paths ([`Preparing::builder_status`]).
struct BuilderStatus {
    ownership: Ownership,
    dirty: Result<Vec<String>, crate::git::GitError>,
}

/// The state preparation builds up: what a refusal needs to record.
struct Preparing {
    ctx: FireContext,
    repo: git2::Repository,
    inputs: Inputs,
    /// Set once the settings loaded, so a later refusal redacts their key variables.
    settings: Option<RuntimeSettings>,
    /// A dry run: note uncommitted builder-owned changes instead of refusing.
    dry_run: bool,
    notes: Vec<String>,
    prefetched: String,
    /// The run's journal, once its `running` row is written (never in a dry run).
    journal: Option<Journal>,
    /// Cards for interrupted runs closed as `crashed`, for this fire to record.
    recovery_cards: Vec<CardDraft>,
    /// A paused run to close once a refusal is recorded (its approval went stale).
    close_paused: Option<String>,
    /// With `sync`: what the sync before the fire found, for the push after it.
    sync: Option<crate::fire::sync::FireSync>,
    /// The metadata the fire was judged on, compared again at its end.
    metadata: Option<(crate::manifest::Manifest, Ownership)>,
    /// Cards the fire records though it runs (an unapproved remote tip).
    pending_cards: Vec<CardDraft>,
    /// Whether a run of the task waits for approval, being asked on a thread.
    waiting_check: super::waiting::WaitingCheck,
    /// The summary of a fire that found a run waiting ([`Preparing::settle_waiting`]).
    waiting_summary: Option<Box<FireSummary>>,
    /// The tool worker's process, started early ([`start_worker_process`])
    /// and sent its configuration once that is known ([`Preparing::configure_worker`]).
    worker: Option<super::run::WorkerProcess>,
    /// The task's lock, held from [`prepare`] on (none in a dry run); recovery keeps
    /// its sweep mark on it ([`recover::recover`]).
    task_lock: Option<LockFile>,
    /// This fire continues a decided pause whose resume was interrupted
    /// ([`super::waiting::Waiting::Continue`]), not a `runtime resume` a person ran.
    continues_pause: bool,
}

impl Preparing {
    fn new(ctx: FireContext, repo: git2::Repository, dry_run: bool) -> Preparing {
        Preparing {
            inputs: Inputs {
                commit: crate::git::head_commit(&repo).ok().flatten().map(|o| o.to_string()),
                ..Inputs::default()
            },
            ctx,
            repo,
            settings: None,
            dry_run,
            notes: Vec::new(),
            prefetched: String::new(),
            journal: None,
            recovery_cards: Vec::new(),
            close_paused: None,
            sync: None,
            metadata: None,
            pending_cards: Vec::new(),
            worker: None,
            waiting_check: super::waiting::WaitingCheck::none(),
            waiting_summary: None,
            task_lock: None,
            continues_pause: false,
        }
    }

    /// Takes the answer of the waiting check ([`super::waiting`]) before the fire
    /// writes or syncs anything: a run that waits ends the fire with nothing recorded
    /// (its summary kept in `waits`); an interrupted resume of a decided pause makes
    /// this fire that resume.
    fn settle_waiting(&mut self) -> Result<(), Stop> {
        use super::waiting::Waiting;
        match self.waiting_check.answer() {
            Waiting::No => Ok(()),
            Waiting::Continue(run) => {
                self.ctx.opts.resume = Some(run);
                self.continues_pause = true;
                Ok(())
            }
            Waiting::Waits { run, decided } => {
                let summary = super::waiting::waiting_summary(&self.ctx, &run, decided);
                let stop = Stop::bare(FireEnd::WaitingApproval, summary.message.clone());
                self.waiting_summary = Some(Box::new(summary));
                Err(stop)
            }
            Waiting::Unreadable { run, why } => {
                // A dry run writes nothing: it says what a fire would do.
                if self.dry_run {
                    self.notes.push(format!(
                        "a fire would give up run {run}, whose checkpoint cannot be read: {why}"
                    ));
                    return Ok(());
                }
                // The card is owed before the run is given up: a fire killed between
                // the two leaves it to the next fire's records (`state::owe_card`).
                let card = crate::agent::CardDraft {
                    kind: CardKind::CheckpointFailed,
                    summary: format!("run {run} waited for approval, but its checkpoint cannot be read: it was given up"),
                    detail: format!(
                        "{why}. No decision (`builder approve-call`) and no `runtime resume` could finish it, so the task would have waited on it forever; it is marked failed (checkpoint_failed), and the fire that gave it up ran the task afresh, asking again for any call that needs approval."
                    ),
                    evidence: vec![run.clone()],
                };
                let owed = crate::state::owe_card(&self.ctx.opts.root, &format!("checkpoint-failed-{run}"), &card)
                    .map_err(|e| format!("its card could not be kept: {e}"));
                let given_up = owed.and_then(|note| {
                    let done = StateDb::open(&self.ctx.opts.root).and_then(|mut db| db.give_up_waiting(&run));
                    done.map_err(|e| {
                        // Still waiting: no card says it was given up.
                        crate::state::card_reported(&note);
                        e.to_string()
                    })
                });
                if let Err(e) = given_up {
                    return Err(Stop::bare(
                        FireEnd::Environment,
                        format!("run {run} waits for approval, its checkpoint cannot be read ({why}), and it could not be given up: {e}"),
                    ));
                }
                crate::failpoint!("checkpoint-given-up");
                Ok(())
            }
        }
    }

    /// Sends the early worker its configuration as soon as the fire's configuration
    /// is complete, so it builds its sandbox while the preparation goes on (it then
    /// waits for the masks, which the runtime walks in step 5). A worker the
    /// configuration could not reach is dropped: step 5 starts another.
    #[tracing::instrument(level = "debug", skip_all)]
    fn configure_worker(&mut self, config: &FireConfig) {
        let Some(mut worker) = self.worker.take() else {
            return;
        };
        let setup = super::run::WorkerSetup::new(&self.ctx.opts.root, &self.repo, config);
        let Some(child) = worker.child_mut() else {
            return;
        };
        match crate::agent::worker_client::send_config_now(child, &setup.config) {
            Ok(()) => {
                worker.sent = Some(setup);
                self.worker = Some(worker);
            }
            Err(e) => tracing::debug!(error = %e, "the early tool worker could not be configured"),
        }
    }

    fn into_run(self, config: FireConfig, state: LoopState, lock: Option<LockFile>) -> FireRun {
        FireRun {
            ctx: self.ctx,
            config,
            _lock: lock,
            inputs: self.inputs,
            sandbox: SandboxRecord::default(),
            state,
            // A signal during preparation (prefetch included): no loop, the run ends
            // as cancelled with its records.
            stop: if crate::cancel::requested() {
                StopReason::Cancelled
            } else {
                StopReason::NotStarted
            },
            acceptance: Vec::new(),
            abort: None,
            repo: self.repo,
            worker: self.worker,
            spare_worker: None,
            mask_walk: Default::default(),
            mcp_workers: Vec::new(),
            journal: self.journal,
            sync: self.sync,
            metadata: self.metadata,
        }
    }

    /// The settings of what the fire runs on: HEAD's committed blobs (the approved
    /// bytes, issue 17 item 3), or, for a dry run (which runs nothing of the model's),
    /// the work tree with its uncommitted edits.
    #[tracing::instrument(level = "debug", skip_all)]
    fn load_settings(&self) -> Result<settings::Settings, crate::diag::Diagnostics> {
        if self.dry_run {
            return settings::load(&self.ctx.opts.root);
        }
        match self.committed() {
            Ok(committed) => settings::load_from(&committed),
            Err(e) => Err(crate::diag::Diagnostics(vec![crate::diag::Diagnostic::new(
                SETTINGS_FILE,
                0,
                "",
                format!("cannot read HEAD's tree: {}", e.message()),
            )])),
        }
    }

    /// The commit this fire runs on, as read once ([`Preparing::new`], after an
    /// interrupted sync, after the fire's own sync): every builder file, the
    /// approval and the links are judged on this one commit, even while a person
    /// rebases or checks out in the same work tree and HEAD moves under the fire.
    fn fired_commit(&self) -> Result<git2::Oid, git2::Error> {
        match &self.inputs.commit {
            Some(id) => git2::Oid::from_str(id),
            // HEAD named no commit that could be read when the fire began (a
            // repository with no commits was refused before, as not a task). Read
            // again now, HEAD could name another commit than the one the fire was
            // judged on: the fire stops instead.
            None => Err(git2::Error::from_str(
                "HEAD named no commit that could be read when the fire began",
            )),
        }
    }

    /// The committed tree of [`Preparing::fired_commit`], links resolved inside it.
    fn committed(&self) -> Result<crate::review::committed::Committed<'_>, git2::Error> {
        crate::review::committed::Committed::at(&self.repo, self.fired_commit()?)
    }

    /// Reads the builder-owned text file `rel` the fire runs on: from HEAD's committed
    /// tree (links resolved inside it, [`crate::review::committed`]), or for a dry run
    /// from the work tree.
    fn read_builder_file(&self, rel: &str) -> Result<String, String> {
        if self.dry_run {
            return std::fs::read_to_string(self.ctx.opts.root.join(rel)).map_err(|e| e.to_string());
        }
        self.committed()
            .map_err(|e| e.message().to_string())?
            .read_to_string(rel)
            .map_err(|e| e.to_string())
    }

    fn phases(&mut self) -> Result<(FireConfig, LoopState), Stop> {
        if self.ctx.opts.eval {
            self.refuse_outside_git_dirs()?;
        }
        self.settle_interrupted_sync()?;
        let loaded = self.load_settings();
        let status = self.builder_status(loaded.as_ref().ok().map(|s| &s.runtime));
        // Everything so far only read: a run that waits ends the fire here, before the
        // manifest, a card or a record is written.
        self.settle_waiting()?;
        self.refuse_unreviewed(status)?;
        tracing::debug!(
            elapsed_ms = self.ctx.started.elapsed().as_millis() as u64,
            "lock taken, builder paths clean"
        );
        let mut settings = loaded
            .map_err(|d| {
                let text = d.to_string();
                Stop::carded(
                    FireEnd::InvalidInput,
                    CardKind::InvalidConfig,
                    format!("invalid settings: {}", first_line(&text)),
                    text,
                )
            })?
            .runtime;
        if let Some(trusted) = &self.ctx.opts.trusted {
            settings = crate::powers::confine(&settings, trusted).map_err(|w| refuse_widening(&w.0))?;
        }
        if self.ctx.opts.no_commit {
            // Nothing is committed, so nothing is pushed and no branch moves: an eval
            // fire in a detached worktree, or a trial fire, never syncs.
            settings.sync = None;
        }
        if let Some(trace) = &self.ctx.opts.replay {
            settings.provider = settings::ProviderSettings {
                kind: settings::ProviderKind::Replay,
                base_url: None,
                model: None,
                api_key_env: None,
                replay: Some(trace.to_string_lossy().into_owned()),
                max_context_tokens: settings.provider.max_context_tokens,
            };
            settings.fallback = None;
        }
        self.settings = Some(settings.clone());
        let settings = self.sync(settings)?;
        self.check_signing_key(&settings)?;
        self.refuse_links(&settings)?;
        // A person may move HEAD from here on (a rebase, a checkout): the fire goes on
        // with the commit it read its settings from (a test stops the fire here).
        crate::failpoint!("after-settings-read");
        self.require_approval(&settings)?;
        let mut config = self.load_config(settings)?;
        std::fs::create_dir_all(&config.scratch).map_err(|e| {
            Stop::bare(
                FireEnd::Environment,
                format!(
                    "cannot create the run's scratch directory {}: {e}",
                    config.scratch.display()
                ),
            )
        })?;
        self.materialise_tools(&mut config)?;
        self.configure_worker(&config);
        match self.conversation(&config) {
            Ok(state) => Ok((config, state)),
            Err(stop) => {
                // The worker may be working in the scratch: it ends first.
                self.worker = None;
                let _ = std::fs::remove_dir_all(&config.scratch);
                Err(stop)
            }
        }
    }

    /// An eval fire runs in a repository of its own ([`crate::eval::TempWorktree`]).
    /// Its tools may read the git directories of the repository they run in, so one
    /// outside the work tree (a linked worktree's common directory: its checkout's
    /// config with credentials, stash, hooks and branches) refuses the fire before
    /// anything of it runs.
    fn refuse_outside_git_dirs(&self) -> Result<(), Stop> {
        let root = &self.ctx.opts.root;
        let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.clone());
        let outside: Vec<String> = crate::git::git_dirs(&self.repo)
            .into_iter()
            .filter(|d| !d.starts_with(&root))
            .map(|d| d.display().to_string())
            .collect();
        if outside.is_empty() {
            return Ok(());
        }
        Err(Stop::carded(
            FireEnd::Failed,
            CardKind::SandboxUnavailable,
            format!(
                "refused: an eval fire's git directory lies outside its work tree ({})",
                outside.join(", ")
            ),
            "an eval fire's tools may read the git directories of the repository they run in, and these belong to another checkout (a linked worktree's common directory holds its config with credentials, its stash, hooks and branches): nothing of this revision ran".into(),
        )
        .with_hint("evaluate through `builder eval` or `builder review`, which fire each revision in a repository of its own"))
    }

    /// The run's first conversation once its configuration is in hand: an interrupted
    /// run's state, a paused run's checkpoint, or a fresh one with its prefetch.
    fn conversation(&mut self, config: &FireConfig) -> Result<LoopState, Stop> {
        let recovered = self.recover(config)?;
        self.begin_run();
        let mut state = match recovered {
            Some(state) => state,
            None => self.first_state(config)?,
        };
        state.cards.append(&mut self.recovery_cards);
        state.cards.append(&mut self.pending_cards);
        Ok(state)
    }

    /// Settles the task's interrupted runs ([`recover`]): the state of the one this
    /// fire continues (under its run id), or `None` to start as asked. `runtime
    /// resume` of a paused run goes on to its checkpoint in [`Preparing::first_state`].
    #[tracing::instrument(level = "debug", skip_all)]
    fn recover(&mut self, config: &FireConfig) -> Result<Option<LoopState>, Stop> {
        if self.dry_run {
            return Ok(None);
        }
        let explicit = self.ctx.opts.resume.clone();
        if let Some(id) = &explicit {
            let paused = StateDb::open(&self.ctx.opts.root)
                .map_err(|e| e.to_string())
                .and_then(|db| db.checkpoint(id).map_err(|e| e.to_string()))
                .map_err(|e| Stop::bare(FireEnd::Environment, e))?;
            if paused.is_some() {
                // An earlier resume of it that was interrupted is superseded: closed.
                let window = std::time::Duration::from_secs(config.limits.resume_window_s);
                let found = recover::recover(
                    &self.ctx,
                    &self.repo,
                    &self.inputs,
                    window,
                    Some(id),
                    self.task_lock.as_ref(),
                    (&config.identity.name, &config.identity.email),
                );
                self.recovery_cards = found.cards;
                if let Some((run, state)) = found.resume {
                    return Ok(Some(self.take_over(run, state)));
                }
                if let Some(by) = found.pause_finished_by {
                    return self.pause_already_finished(id, &by);
                }
                return Ok(None);
            }
        }
        let window = std::time::Duration::from_secs(config.limits.resume_window_s);
        let found = recover::recover(
            &self.ctx,
            &self.repo,
            &self.inputs,
            window,
            explicit.as_deref(),
            self.task_lock.as_ref(),
            (&config.identity.name, &config.identity.email),
        );
        self.recovery_cards = found.cards;
        let Some((run, state)) = found.resume else {
            return match explicit {
                Some(id) if found.deferred.is_some() => Err(Stop::bare(
                    FireEnd::Environment,
                    format!("run `{id}` is not resumed now: {}", found.deferred.unwrap_or_default()),
                )),
                Some(id) => Err(Stop::bare(
                    FireEnd::InvalidInput,
                    format!("run `{id}` has no checkpoint to resume (not paused, not interrupted)"),
                )),
                None => Ok(None),
            };
        };
        Ok(Some(self.take_over(run, state)))
    }

    /// This fire becomes the interrupted `run` (its id, start and pause), going on
    /// from its checkpoint `state`.
    fn take_over(&mut self, run: crate::journal::LiveRun, mut state: LoopState) -> LoopState {
        if let Ok(t) = chrono::DateTime::parse_from_rfc3339(&run.started_at) {
            self.ctx.started_at = t.with_timezone(&chrono::Utc);
        }
        self.ctx.opts.resume = (run.ledger_run != run.run_id).then(|| run.ledger_run.clone());
        self.ctx.run_id = run.run_id;
        state.trace = Default::default();
        self.ctx.open_root(&mut state.trace);
        state
    }

    /// The pause `paused` was ended by its resume `by`, which finished and was killed
    /// before its commit (recovery kept its records for the next commit and closed the
    /// pause): a fire that came to continue it is an ordinary fire now; a person's
    /// `runtime resume` is told so.
    fn pause_already_finished(&mut self, paused: &str, by: &str) -> Result<Option<LoopState>, Stop> {
        if self.continues_pause {
            self.ctx.opts.resume = None;
            return Ok(None);
        }
        Err(Stop::bare(
            FireEnd::InvalidInput,
            format!("run `{paused}` was finished by its resume {by}, killed before its commit: nothing is left to resume (its records go with the next fire's commit)"),
        ))
    }

    /// The run exists from here on (before prefetch): its row says `running` and names
    /// this process. A state database that cannot be written costs the run its
    /// checkpoints, not the fire.
    #[tracing::instrument(level = "debug", skip_all)]
    fn begin_run(&mut self) {
        if self.dry_run {
            return;
        }
        let inputs = serde_json::to_string(&self.inputs).unwrap_or_default();
        let begun = StateDb::open(&self.ctx.opts.root).and_then(|db| {
            Journal::begin(
                db.into_store(),
                &RunStart {
                    run_id: &self.ctx.run_id,
                    task: &self.ctx.opts.task,
                    started_at: self.ctx.started_at,
                    ledger_run: self.ctx.approval_run(),
                    inputs: &inputs,
                    durability: self.settings.as_ref().map(|s| s.durability).unwrap_or_default(),
                },
            )
        });
        match begun {
            Ok(journal) => self.journal = Some(journal),
            Err(e) => tracing::warn!(error = %e, "the run's row was not written; it has no checkpoints"),
        }
    }

    /// A run that stops with nothing worth a record is closed as `failed`.
    fn close_unrecorded(&mut self) {
        if let Some(journal) = self.journal.take() {
            let mut store = journal.into_store();
            if let Err(e) = crate::journal::close_unrecorded(&mut store, &self.ctx.run_id, chrono::Utc::now()) {
                tracing::warn!(error = %e, "the run's row was not closed");
            }
        }
    }

    /// The cron box (`sync`, see [`crate::sync`]): fetch, and move to the remote tip
    /// when the box may fire it; the settings of the tree the fire then runs on. A tip
    /// it cannot fire (or a rewritten remote history) gets one card per cause, kept in
    /// the state database's refusals under the sync's own key; a failed fetch is a
    /// `sync_failed` card and exit 1.
    #[tracing::instrument(level = "debug", skip_all)]
    fn sync(&mut self, settings: RuntimeSettings) -> Result<RuntimeSettings, Stop> {
        let Some(sync) = settings.sync.clone() else {
            return Ok(settings);
        };
        if self.dry_run {
            self.notes.push(format!(
                "a fire would first fetch {}/{} and move to its tip if approved, and push after",
                sync.remote, sync.branch
            ));
            return Ok(settings);
        }
        if !super::sync::applies(&self.ctx.opts) {
            return Ok(settings);
        }
        let root = self.ctx.opts.root.clone();
        let rule = approval_rule(&settings)?;
        let signing_key = settings.runtime_identity.signing_key.as_deref();
        let began =
            crate::fire::sync::FireSync::begin(&self.repo, &root, (sync, signing_key), &rule, self.ctx.started_at)
                .map_err(|e| {
                    let detail = match &e.hint {
                        Some(h) => format!("{e}\nNext: {h}"),
                        None => e.to_string(),
                    };
                    let stop = Stop::carded(
                        FireEnd::Environment,
                        CardKind::SyncFailed,
                        first_line(&e.to_string()),
                        detail,
                    );
                    match &e.hint {
                        Some(h) => stop.with_hint(h.clone()),
                        None => stop,
                    }
                })?;
        self.pending_cards.extend(began.card);
        self.sync = Some(began.fire);
        let Some(to) = began.moved else {
            return Ok(settings);
        };
        self.inputs.commit = Some(to.to_string());
        let moved = self
            .load_settings()
            .map_err(|d| {
                let text = d.to_string();
                Stop::carded(
                    FireEnd::InvalidInput,
                    CardKind::InvalidConfig,
                    format!("invalid settings after sync: {}", first_line(&text)),
                    text,
                )
            })?
            .runtime;
        self.settings = Some(moved.clone());
        Ok(moved)
    }

    /// A sync step killed mid-way: its locks and half-moved branch go first (the fire
    /// then fires where the branch is now), once no run waits: a fire that finds one
    /// writes nothing.
    fn settle_interrupted_sync(&mut self) -> Result<(), Stop> {
        if self.dry_run || !crate::sync::interrupted(&self.repo) {
            return Ok(());
        }
        self.settle_waiting()?;
        if crate::sync::finish_interrupted(&self.repo) {
            self.inputs.commit = crate::git::head_commit(&self.repo)
                .ok()
                .flatten()
                .map(|o| o.to_string());
        }
        Ok(())
    }

    /// Which builder-owned paths differ from HEAD (git's status of them), read before
    /// the waiting answer is taken: it writes nothing.
    #[tracing::instrument(level = "debug", skip_all)]
    fn builder_status(&self, settings: Option<&RuntimeSettings>) -> BuilderStatus {
        let root = &self.ctx.opts.root;
        let extra_builder = settings.map(|s| s.builder_paths.as_slice()).unwrap_or(&[]);
        let ownership = Ownership::new(root)
            .with_globs(extra_builder, &[])
            .unwrap_or_else(|_| Ownership::new(root));
        let dirty = crate::git::dirty_builder_paths(&self.repo, &ownership);
        BuilderStatus { ownership, dirty }
    }

    /// Builder paths must be committed: the fire runs on reviewed versions only.
    #[tracing::instrument(level = "debug", skip_all)]
    fn refuse_unreviewed(&mut self, status: BuilderStatus) -> Result<(), Stop> {
        let BuilderStatus { ownership, dirty } = status;
        let dirty = dirty.map_err(|e| Stop::bare(FireEnd::Environment, e.to_string()))?;
        if dirty.is_empty() {
            return self.refuse_metadata_changes(&ownership);
        }
        if self.dry_run {
            self.notes.push(format!(
                "a fire would refuse: {} builder-owned path(s) have uncommitted changes: {}",
                dirty.len(),
                dirty.join(", ")
            ));
            return Ok(());
        }
        Err(Stop::carded(
            FireEnd::Failed,
            CardKind::UnreviewedChanges,
            format!("{} builder-owned path(s) have uncommitted changes", dirty.len()),
            format!("refusing to fire on unreviewed changes: {}", dirty.join(", ")),
        )
        .with_hint("land the changes through review (`builder propose <name>`), or `git stash` them, then fire again"))
    }

    /// What git does not track (docs/design.md: modes and owners are builder-owned
    /// too): a mode or owner of a builder-owned path, or a hook, that changed since the
    /// last accepted manifest ([`crate::manifest`]) refuses the fire as a dirty path
    /// does; otherwise the current state is recorded as accepted.
    #[tracing::instrument(level = "debug", skip_all)]
    fn refuse_metadata_changes(&mut self, ownership: &Ownership) -> Result<(), Stop> {
        let root = &self.ctx.opts.root;
        let env = |e: String| Stop::bare(FireEnd::Environment, e);
        // A dry run writes nothing, not even a state database; a fire that cannot
        // write one still compares (and records nothing); one that cannot read it
        // cannot vouch for the metadata and refuses.
        let opened = if self.dry_run {
            if !crate::state::db_path(root).is_file() {
                return Ok(());
            }
            StateDb::open_for_reading(root)
        } else {
            StateDb::open(root).or_else(|e| {
                tracing::warn!(error = %e, "the state database cannot be written: the metadata manifest is compared, not recorded");
                StateDb::open_for_reading(root)
            })
        };
        let mut db = opened.map_err(|e| env(format!("cannot read the metadata manifest: {e}")))?;
        let (now, changes) = crate::manifest::check_and_record(&self.repo, root, ownership, &mut db, !self.dry_run)
            .map_err(|e| env(e.to_string()))?;
        if changes.is_empty() {
            self.metadata = Some((now, ownership.clone()));
            return Ok(());
        }
        let listed = changes.iter().map(ToString::to_string).collect::<Vec<_>>();
        let summary = format!(
            "{} builder-owned path(s) or hook(s) changed mode, owner or content outside git",
            changes.len()
        );
        if self.dry_run {
            self.notes
                .push(format!("a fire would refuse: {summary}: {}", listed.join(", ")));
            return Ok(());
        }
        let mut stop = Stop::carded(
            FireEnd::Failed,
            CardKind::UnreviewedChanges,
            summary,
            format!(
                "refusing to fire on metadata changed since the last accepted manifest: {} (put it back, or accept it with `builder audit --accept-metadata`)",
                listed.join(", ")
            ),
        );
        if let Some(card) = &mut stop.card {
            card.evidence = listed;
        }
        Err(stop
            .with_hint("put the mode, owner or hook back, or accept the change with `builder audit --accept-metadata`"))
    }

    /// Two keys (docs/design.md): with `require_reviewed`, HEAD's tree of
    /// builder-owned paths must be named by an approval on `refs/builder/approvals`;
    /// the approval goes into the receipt. The refusal's detail names the tree and not
    /// the commit, so the refusal repeats (counted, not recorded) until the tree changes.
    #[tracing::instrument(level = "debug", skip_all)]
    fn require_approval(&mut self, settings: &RuntimeSettings) -> Result<(), Stop> {
        if self.ctx.opts.eval && self.ctx.opts.no_commit {
            // An eval fire of a proposal under review commits nothing and runs in a
            // repository that holds no approvals: it judges none, and reads nothing
            // the revision's `review` settings name (an allowed-signers path is the
            // proposal's to choose, and a file it names must not be read for it).
            return Ok(());
        }
        let env = |e: git2::Error| {
            if crate::review::canonical::is_refused_tree(&e) {
                return Stop::carded(
                    FireEnd::Failed,
                    CardKind::UnreviewedChanges,
                    "a commit the fire would judge holds a tree git itself refuses; no approval covers it".into(),
                    e.message().to_string(),
                );
            }
            Stop::bare(FireEnd::Environment, format!("reading approvals: {e}"))
        };
        let root = (!self.dry_run).then(|| self.ctx.opts.root.clone());
        let root = root.as_deref();
        let head = self.fired_commit().map_err(env)?;
        // An unapproved switch-off of signatures (or to another list) is judged by the
        // rule before it: the switch-off of review too, or an unsigned approval would
        // vouch for a tip that turned both off.
        let rule = crate::review::trust::Trust::rule_in_force(&self.repo, head, approval_rule(settings)?, root)
            .map_err(env)?;
        if !settings.require_reviewed {
            if let Some(done) = self.review_switched_off(head, &rule, root).map_err(env)? {
                return done;
            }
        }
        // The walk to the last approved tree is remembered in `.runtime/`, so
        // records-only commits since then are read once, not on every fire.
        let judged = crate::review::trust::Trust::new(&self.repo, rule.clone())
            .map_err(env)?
            .remembering(root)
            .commit(head)
            .map_err(env)?;
        if let Some(a) = &judged.approval {
            self.inputs.approval = Some(a.as_ref());
            return self.refuse_rollback(&judged);
        }
        if let Some(d) = &judged.unreadable {
            return Err(unreadable_signers(d));
        }
        let tree = judged.tree;
        let rejected = judged.rejected.clone();
        let summary = format!(
            "HEAD's tree of builder-owned paths {} has no approval{}",
            crate::text::short_oid(tree),
            if rejected.is_empty() { "" } else { " that counts" }
        );
        if self.dry_run {
            self.notes.push(format!("a fire would refuse: {summary}"));
            return Ok(());
        }
        Err(Stop::carded(
            FireEnd::Failed,
            CardKind::UnreviewedChanges,
            summary,
            format!(
                "require_reviewed is {} and no approval on {} that counts names builder tree {tree}: land prompt changes through `builder propose`, `builder approve` (by someone else) and `builder merge`, and fetch refs/builder/* where the runtime fires{}",
                if settings.require_reviewed {
                    "on"
                } else {
                    "off in HEAD's settings, but the change that turned it off has no approval, so review is still owed"
                },
                crate::review::APPROVALS_REF,
                rejected
                    .iter()
                    .map(|r| format!("\n- {r}"))
                    .chain((!rejected.is_empty()).then(|| format!("\n({})", judged.judged_by(&rule))))
                    .collect::<String>()
            ),
        )
        .with_hint("have the change approved by someone else (`builder review <name>`, then `builder approve <name>`), and fetch refs/builder/* where the runtime fires"))
    }

    /// With review switched off in HEAD's settings: only an approved switch-off
    /// counts (as `audit` judges it). `Some` when that settles the fire (it goes on,
    /// or a rollback refuses it), `None` when review is still owed. Resting on an
    /// approved tree (the switch-off's, or one replayed from before), approvals only
    /// move forward from it, as under review.
    fn review_switched_off(
        &mut self,
        head: git2::Oid,
        rule: &crate::review::signing::ApprovalRule,
        root: Option<&std::path::Path>,
    ) -> Result<Option<Result<(), Stop>>, git2::Error> {
        // One judge for both questions: the approvals and the walk memo read once.
        let mut trust = crate::review::trust::Trust::new(&self.repo, rule.clone())?.remembering(root);
        let owed = trust.owed_review(head)?;
        if owed.owed {
            return Ok(None);
        }
        let Some(at) = owed.covered_at else {
            return Ok(Some(Ok(())));
        };
        let judged = trust.commit(at)?;
        Ok(Some(match judged.approval {
            Some(_) => self.refuse_rollback(&judged),
            None => Ok(()),
        }))
    }

    /// Approvals only move forward (issue 17 item 4, [`crate::review::forward`]): the
    /// approved tree HEAD holds must not be older than the newest this box ran, unless
    /// a newer approval names it again. A rollback refuses the fire with one
    /// `unreviewed_changes` card (repeats are counted, as for any refusal of the same
    /// tree); otherwise the box remembers the approval it runs under.
    fn refuse_rollback(&mut self, judged: &crate::review::trust::Judged) -> Result<(), Stop> {
        if self.dry_run {
            return Ok(());
        }
        let root = &self.ctx.opts.root;
        let ran = crate::review::forward::read(&self.repo, root);
        if let Some(back) = crate::review::forward::check(&self.repo, judged.tree, &judged.counting, ran.as_ref()) {
            return Err(Stop::carded(
                FireEnd::Failed,
                CardKind::UnreviewedChanges,
                back.summary(),
                back.detail(),
            ));
        }
        if let Err(e) = crate::review::forward::remember(&self.repo, root, &judged.counting) {
            tracing::warn!(error = %e, "the approval this fire runs under was not remembered");
        }
        Ok(())
    }

    /// With `runtime_identity.signing_key`, the fire's records commit is signed: a key
    /// that cannot be used refuses the fire before anything runs (`invalid_config`),
    /// rather than leaving commits unsigned that `builder audit` would flag as forged.
    fn check_signing_key(&self, settings: &RuntimeSettings) -> Result<(), Stop> {
        let Some(key) = settings.runtime_identity.signing_key.as_deref() else {
            return Ok(());
        };
        // A dry run signs nothing, nor does an eval fire (no commit): the key the
        // revision names is not even opened for it.
        if self.dry_run || self.ctx.opts.eval {
            return Ok(());
        }
        match crate::review::runtime_commits::RuntimeKey::load(key, &self.ctx.opts.root) {
            Ok(_) => Ok(()),
            Err(e) => Err(Stop::carded(
                FireEnd::InvalidInput,
                CardKind::InvalidConfig,
                "the runtime's signing key cannot be used".into(),
                format!("{SETTINGS_FILE}: {e}"),
            )),
        }
    }

    /// A builder-owned link that the kernel would resolve outside the builder-owned
    /// paths, into what tools write, into `/proc` or `/dev` or out of the repository
    /// (or a submodule) refuses every fire ([`crate::review::links`]): nothing is loaded
    /// through it, and an approval covers the link, not what it reaches. Under
    /// `require_reviewed` that is an unreviewed change (exit 1), otherwise a
    /// configuration error (exit 2).
    #[tracing::instrument(level = "debug", skip_all)]
    fn refuse_links(&mut self, settings: &RuntimeSettings) -> Result<(), Stop> {
        let env = |e: String| Stop::bare(FireEnd::Environment, format!("reading HEAD's tree: {e}"));
        let refused = if self.dry_run {
            let owned = crate::review::owned::OwnedPaths::of_settings(settings);
            crate::review::links::refused_links(&crate::review::links::WorkView::new(&self.ctx.opts.root), &owned)
        } else {
            let committed = self.committed().map_err(|e| env(e.message().to_string()))?;
            committed.refused_links()
        }
        .map_err(|e| env(e.to_string()))?;
        // Eval fires too: they run a proposal's tree on the reviewer's machine, where a
        // prompt linked to the reviewer's file would be read and sent to the model.
        if refused.is_empty() {
            return Ok(());
        }
        let paths: Vec<String> = refused.iter().map(|l| format!("{} -> {}", l.path, l.target)).collect();
        let summary = format!("HEAD's builder-owned paths link outside them: {}", paths.join(", "));
        if self.dry_run {
            self.notes.push(format!("a fire would refuse: {summary}"));
            return Ok(());
        }
        let (end, kind) = if settings.require_reviewed {
            (FireEnd::Failed, CardKind::UnreviewedChanges)
        } else {
            (FireEnd::InvalidInput, CardKind::InvalidConfig)
        };
        let mut stop = Stop::carded(
            end,
            kind,
            summary,
            format!(
                "links among the builder-owned paths are resolved as the kernel would, and these leave them (or reach what tools write, /proc, /dev or outside the repository): nothing is loaded through them, and an approval covers a link, not what it reaches, so whoever changes the target changes what runs; put the content itself under prompts/, scope/, settings/, tools/, evals/ or builder_paths (through review){}",
                crate::review::links::listed(&refused)
            ),
        )
        .with_hint("put the content itself in place of the link, through review");
        if let Some(card) = &mut stop.card {
            card.evidence = paths;
        }
        Err(stop)
    }

    /// The scripts a task runs (prefetch and acceptance `run:`) execute from the
    /// committed `tools/`, written out under the hand-over directory (once per tree),
    /// which tool processes see read-only ([`crate::review::committed`]); a dry run runs
    /// the work tree's.
    #[tracing::instrument(level = "debug", skip_all)]
    fn materialise_tools(&mut self, config: &mut FireConfig) -> Result<(), Stop> {
        let front = &config.prompt.front;
        let runs_scripts = !front.prefetch.is_empty() || front.acceptance.iter().any(|a| a.run.is_some());
        if self.dry_run || !runs_scripts {
            return Ok(());
        }
        let root = &self.ctx.opts.root;
        let handoff = std::path::PathBuf::from(crate::layout::STATE_DIR).join(crate::layout::HANDOFF_DIR);
        let failed = |e: String| {
            Stop::carded(
                FireEnd::Environment,
                CardKind::PrefetchFailed,
                "the committed tools/ could not be written out for this run".into(),
                e,
            )
        };
        std::fs::create_dir_all(root.join(&handoff)).map_err(|e| failed(e.to_string()))?;
        let committed = self.committed().map_err(|e| failed(e.message().to_string()))?;
        let copy = committed
            .tools_copy(&root.join(&handoff))
            .map_err(|e| failed(e.to_string()))?;
        // No committed tools/: the scripts do not exist (never the work tree's, which
        // an ignore rule could hide from the dirty check).
        config.tools_dir = Some(handoff.join(copy.unwrap_or_else(|| "no-tools".into())));
        Ok(())
    }

    /// Prompt, scope and policy on top of the settings, resolved into one config; the
    /// input versions go into the receipt.
    #[tracing::instrument(level = "debug", skip_all)]
    fn load_config(&mut self, settings: RuntimeSettings) -> Result<FireConfig, Stop> {
        let root = self.ctx.opts.root.clone();
        let invalid = |summary: String, detail: String| {
            Stop::carded(FireEnd::InvalidInput, CardKind::InvalidConfig, summary, detail)
        };
        let rel = prompt::prompt_path(&self.ctx.opts.task);
        let text = self.read_builder_file(&rel.to_string_lossy());
        let prompt = prompt::load_text(&self.ctx.opts.task, text, &settings).map_err(|d| {
            let text = crate::diag::Diagnostics(d).to_string();
            invalid(format!("invalid prompt: {}", first_line(&text)), text)
        })?;
        if let Some(trusted) = &self.ctx.opts.trusted {
            let widened =
                crate::powers::prefetch_widenings(trusted, &prompt.file.to_string_lossy(), &prompt.front.prefetch);
            if !widened.is_empty() {
                return Err(refuse_widening(&widened));
            }
        }
        if let Some(var) = settings.missing_key_variable() {
            return Err(invalid(
                format!("the provider's key variable `{var}` is unset or empty"),
                format!("{SETTINGS_FILE}: provider api_key_env names `{var}`, which is unset or empty in the fire's environment; no request was sent"),
            )
            .with_hint(format!("set `{var}` in the environment the fire runs in (for cron: in the crontab line or the script it calls)")));
        }
        let scope = match self.read_builder_file(SCOPE_FILE) {
            Ok(scope) if !scope.trim().is_empty() => scope,
            Ok(_) => {
                return Err(invalid(
                    "scope/SCOPE.md is empty".into(),
                    format!("{SCOPE_FILE}:1: the boundary document is required and says nothing"),
                ))
            }
            // Missing, not UTF-8 text, or a refused link: the reader says which.
            Err(why) => {
                return Err(invalid(
                    format!("the boundary document cannot be read: {}", first_line(&why)),
                    format!("{SCOPE_FILE}:0: the boundary document is required: {why}"),
                ))
            }
        };
        // The versions of the commit the fire read them from, not of HEAD now.
        let tree = self.committed().ok().map(|c| c.tree().clone());
        let blob = |p: &str| {
            let entry = tree.as_ref()?.get_path(std::path::Path::new(p)).ok()?;
            Some(entry.id().to_string())
        };
        let (prompt_id, scope_id, settings_id) = (
            blob(&prompt.file.to_string_lossy()),
            blob(SCOPE_FILE),
            blob(SETTINGS_FILE),
        );
        drop(tree);
        self.inputs.prompt = prompt_id;
        self.inputs.scope = scope_id;
        self.inputs.settings = settings_id;
        self.inputs.provider = format!("{:?}", settings.provider.kind).to_lowercase();
        FireConfig::resolve(&root, self.ctx.scratch.clone(), settings, prompt, scope)
            .map_err(|e| invalid("invalid permissions".into(), e.to_string()))
    }

    /// The conversation the loop starts from: a paused run's checkpoint (no prefetch
    /// again), or the system prompt and the task prompt with its prefetched context.
    fn first_state(&mut self, config: &FireConfig) -> Result<LoopState, Stop> {
        match self.ctx.opts.resume.clone() {
            Some(paused) => self.resumed_state(&paused),
            None => self.fresh_state(config),
        }
    }

    /// A paused run's checkpoint, with a new trace and no cards; refused when an
    /// approved call's files changed since the pause (and the pause then closed).
    fn resumed_state(&mut self, paused: &str) -> Result<LoopState, Stop> {
        let db = StateDb::open(&self.ctx.opts.root).map_err(|e| Stop::bare(FireEnd::Environment, e.to_string()))?;
        let checkpoint = db
            .checkpoint(paused)
            .map_err(|e| Stop::bare(FireEnd::Environment, e.to_string()))?
            .ok_or_else(|| {
                Stop::bare(
                    FireEnd::InvalidInput,
                    format!("run `{paused}` has no checkpoint to resume"),
                )
            })?;
        if let Some(pending) = &checkpoint.state.pending {
            if let Err(stop) = refuse_stale_approval(&db, &self.ctx.opts.root, paused, pending) {
                if stop.card.is_some() {
                    self.close_paused = Some(paused.to_string());
                }
                return Err(stop);
            }
        }
        let mut state = checkpoint.state;
        state.trace = Default::default();
        self.ctx.open_root(&mut state.trace);
        state.cards.clear();
        Ok(state)
    }

    /// A new run's conversation: the system prompt and the task prompt with its
    /// prefetched context (a card for each prefetch cut to its cap).
    #[tracing::instrument(level = "debug", skip_all)]
    fn fresh_state(&mut self, config: &FireConfig) -> Result<LoopState, Stop> {
        let mut state = LoopState::default();
        self.ctx.open_root(&mut state.trace);
        let prefetched = prefetch::run_all(
            &self.ctx.opts.root,
            &self.ctx.opts.worker_cmd,
            config,
            &mut state.trace,
            &*self.ctx.opts.progress,
        )
        .or_else(|failed| {
            if failed.cancelled {
                // No refusal: the run ends as cancelled, with its records, in `finish`.
                return Ok(Default::default());
            }
            Err(failed)
        })
        .map_err(|failed| {
            let _ = std::fs::remove_dir_all(&config.scratch);
            Stop::carded(
                FireEnd::Failed,
                if failed.sandbox {
                    CardKind::SandboxUnavailable
                } else {
                    CardKind::PrefetchFailed
                },
                format!("prefetch `{}` failed", failed.name),
                failed.detail,
            )
        })?;
        if self.dry_run {
            self.prefetched = prefetched.text.clone();
        }
        for name in &prefetched.truncated {
            state.cards.push(CardDraft {
                kind: CardKind::PrefetchTruncated,
                summary: format!("prefetch `{name}` wrote more than its cap; the middle was cut"),
                detail: format!(
                    "the output of prefetch `{name}` went over limits.tool_output_bytes ({} bytes): the model saw its head and tail around a marker",
                    config.limits.tool_output_bytes
                ),
                evidence: vec![],
            });
        }
        let body = &config.prompt.body;
        let user = if prefetched.text.is_empty() {
            body.clone()
        } else {
            format!("{}\n\n## Prefetched context{}", body.trim_end(), prefetched.text)
        };
        state.messages = vec![
            Message::System {
                content: context::system_prompt(&config.scope),
            },
            Message::User { content: user },
        ];
        Ok(state)
    }
}

/// The refusal of an eval fire whose settings or prompt would widen the trusted
/// configuration's powers (see [`crate::powers`]): nothing of it runs.
fn refuse_widening(widened: &[crate::powers::PowerChange]) -> Stop {
    Stop::carded(
        FireEnd::Failed,
        CardKind::InvalidConfig,
        format!(
            "refused: {} power(s) wider than the trusted configuration ({})",
            widened.len(),
            widened.iter().map(|w| w.key.as_str()).collect::<Vec<_>>().join(", ")
        ),
        format!(
            "this eval fire runs under trusted settings (--trusted-settings), and {}",
            crate::powers::describe_widenings(widened)
        ),
    )
    .with_hint("nothing of this revision ran; to evaluate it, name an operator's settings file that grants these powers with --trusted-settings")
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").to_string()
}

/// The rule approvals are judged by (signatures when settings ask for them); an
/// unreadable operator's allowed-signers file refuses the fire with an
/// `invalid_config` card.
fn approval_rule(settings: &RuntimeSettings) -> Result<crate::review::signing::ApprovalRule, Stop> {
    crate::review::signing::ApprovalRule::from_settings(settings).map_err(|d| unreadable_signers(&d))
}

/// The refusal of a fire whose allowed-signers list cannot be read.
fn unreadable_signers(d: &crate::diag::Diagnostic) -> Stop {
    Stop::carded(
        FireEnd::InvalidInput,
        CardKind::InvalidConfig,
        format!("unreadable allowed-signers file: {}", d.message),
        d.to_string(),
    )
}

/// What `runtime check` shows of the fire's own gates, judged by the fire's code (a
/// dry run's preparation, which notes what a fire would refuse instead of refusing):
/// builder-owned changes not committed, metadata changed outside git, links leaving
/// the builder-owned paths, HEAD's tree of builder-owned paths without an approval
/// that counts; HEAD's approval; and, with `sync`, what a fire's sync would find.
#[derive(Debug)]
pub struct Gate {
    /// The settings' `require_reviewed` and `review.require_signed`.
    pub require_reviewed: bool,
    pub require_signed: bool,
    /// HEAD's tree of builder-owned paths.
    pub tree: String,
    /// The approval that covers it, and whether it is signed.
    pub approval: Option<(crate::records::ApprovalRef, bool)>,
    /// Why a fire would refuse, one line each.
    pub refusals: Vec<String>,
    /// With `sync`: what a fire's sync would find (fetching, moving nothing).
    pub sync: Option<(
        settings::SyncSettings,
        Result<crate::sync::Look, crate::sync::SyncError>,
    )>,
}

/// The fire's gates for `runtime check` ([`Gate`]); `Err` when the repository or its
/// settings cannot be read at all.
pub fn check_gate(root: &std::path::Path) -> Result<Gate, String> {
    let opts = FireOptions {
        root: root.to_path_buf(),
        task: "check".into(),
        no_commit: true,
        worker_cmd: (std::path::PathBuf::new(), Vec::new()),
        resume: None,
        progress: std::sync::Arc::new(crate::progress::Silent),
        replay: None,
        eval: false,
        trusted: None,
        opened: None,
    };
    let repo = crate::git::open_work_tree(root).map_err(|e| e.to_string())?.repo;
    let tree = builder_tree(&repo);
    let mut p = Preparing::new(FireContext::new(opts), repo, true);
    let settings = settings::load(root).map_err(|d| d.to_string())?.runtime;
    let mut refusals = Vec::new();
    let mut gate = |r: Result<(), Stop>| {
        if let Err(stop) = r {
            refusals.push(stop.message);
        }
    };
    let status = p.builder_status(Some(&settings));
    gate(p.refuse_unreviewed(status));
    gate(p.require_approval(&settings));
    gate(p.refuse_links(&settings));
    refusals.extend(
        p.notes
            .iter()
            .filter_map(|n| n.strip_prefix("a fire would refuse: "))
            .map(str::to_string),
    );
    let approval = p.inputs.approval.take().map(|a| {
        let signed = crate::review::approvals::load(&p.repo)
            .ok()
            .and_then(|all| all.into_iter().find(|x| x.id.to_string() == a.id))
            .is_some_and(|x| x.body.signature.is_some());
        (a, signed)
    });
    let sync = match (&settings.sync, approval_rule(&settings)) {
        (None, _) => None,
        (Some(s), Ok(rule)) => Some((s.clone(), crate::sync::look(&p.repo, s, &rule, None))),
        (Some(_), Err(stop)) => {
            refusals.push(stop.message);
            None
        }
    };
    Ok(Gate {
        require_reviewed: settings.require_reviewed,
        require_signed: settings.review.require_signed,
        tree,
        approval,
        refusals,
        sync,
    })
}
