//! Recovery of interrupted runs (issue 11, item 4), before a fire's own run begins: a
//! run of the task whose row still says `running` while the process that ran it is
//! gone was interrupted (killed, OOM, reboot). With the task's lock held no live fire
//! of the task can own such a row. The newest one, within `limits.resume_window_s`
//! of its last checkpoint and on the same prompt, scope, settings and provider, is
//! resumed from that checkpoint under its own run id; every other is closed as
//! `crashed`, with a card naming its last completed step. A run whose receipt is
//! already committed (or staged by a commit killed before it moved the branch, which
//! the next commit completes, or kept in git by a commit that was blocked) only gets
//! its row from that receipt. Records an interrupted run left uncommitted (its report,
//! receipt and cards) are removed before it is resumed or closed, and named in the
//! card: the resumed run writes them anew.

use super::FireContext;
use crate::agent::{CardDraft, LoopState};
use crate::journal::LiveRun;
use crate::records::{self, CardKind, Inputs};
use crate::state::{LockFile, StateDb};
use crate::store::Store;
use chrono::{DateTime, Utc};
use std::time::Duration;

/// What recovery found for the fire about to start.
#[derive(Default)]
pub(super) struct Recovery {
    /// The interrupted run to continue: its row and its checkpointed state.
    pub resume: Option<(LiveRun, LoopState)>,
    /// Cards for runs closed as `crashed`, recorded by this fire.
    pub cards: Vec<CardDraft>,
    /// Why interrupted runs were left for a later fire: a person's operation (a
    /// rebase, a merge) is in progress or HEAD is off a branch.
    pub deferred: Option<String>,
    /// The resume of a paused run that had finished (killed before its commit, its
    /// records kept for this fire's): the pause it ended is closed, and nothing is
    /// left to continue from it.
    pub pause_finished_by: Option<String>,
}

/// Why interrupted runs wait for a later fire, if they do. Under a person's operation
/// HEAD is not the branch the runs committed to (a rebase's detached HEAD lacks the
/// commits it replays): a run would be taken for uncommitted, and a resume would
/// write again, as untracked files, records the operation's own commits hold, which
/// then stop `git rebase --abort`.
fn deferred(repo: &git2::Repository) -> Option<String> {
    use crate::git::Blocker;
    let b = crate::git::commit_blocker(repo).ok()??;
    tracing::info!(blocker = %b, "interrupted runs are left for a later fire");
    Some(match b {
        Blocker::Operation { what, marker, end } => format!(
            "{what} is in progress ({}); once it is finished ({end}), the next fire or `runtime resume` continues it",
            marker.display()
        ),
        Blocker::Detached { at } => format!(
            "HEAD is detached at {at}; once a branch is checked out, the next fire or `runtime resume` continues it"
        ),
        other => other.to_string(),
    })
}

/// Why an interrupted run is not resumed, if it is not.
fn not_resumable(run: &LiveRun, inputs: &Inputs, window: Duration, now: DateTime<Utc>) -> Option<String> {
    if run.state.is_none() {
        return Some("it had no checkpoint yet".into());
    }
    // On the boot clock, never the wall clock alone: a clock stepped forward would
    // close a resumable run and the fresh run would repeat its side effects.
    let age = run.idle(now);
    if age > window {
        return Some(format!(
            "its last checkpoint is {}s old, over limits.resume_window_s ({}s)",
            age.as_secs(),
            window.as_secs()
        ));
    }
    let theirs: Inputs = serde_json::from_str(&run.inputs).unwrap_or_default();
    let same = theirs.prompt == inputs.prompt
        && theirs.scope == inputs.scope
        && theirs.settings == inputs.settings
        && theirs.provider == inputs.provider;
    (!same).then(|| "its prompt, scope, settings or provider changed since".into())
}

/// Why the interrupted `run` is not resumed when `runtime resume` (or the fire that
/// continues a decided pause) names `asked`; `None` when it is the one: `asked`
/// itself, or the newest interrupted resume of the pause `asked`, with a checkpoint
/// of its own. That resume is continued from its checkpoint, not the pause from its
/// own: the calls it completed after the approved one would run again (helper-98),
/// as the model asks for them anew.
fn not_the_one_asked(run: &LiveRun, asked: &str, newest: bool) -> Option<String> {
    if asked == run.run_id || (asked == run.ledger_run && newest && run.state.is_some()) {
        return None;
    }
    Some(match asked == run.ledger_run {
        true => format!(
            "it was an interrupted resume of paused run {asked} with no checkpoint of its own, or not the latest: the pause is continued (the tool ledger keeps the approved call from running twice)"
        ),
        false => "another run was asked to resume".to_string(),
    })
}

/// Finds and settles the interrupted runs of the fire's task; `explicit` is a run
/// `runtime resume` names, resumed whatever its age.
pub(super) fn recover(
    ctx: &FireContext,
    repo: &git2::Repository,
    inputs: &Inputs,
    window: Duration,
    explicit: Option<&str>,
    lock: Option<&LockFile>,
    identity: (&str, &str),
) -> Recovery {
    crate::failpoint!("during-recovery");
    remove_dead_temps(ctx, lock);
    let mut out = Recovery::default();
    let Some((mut store, interrupted)) = interrupted_runs(ctx) else {
        return out;
    };
    if !interrupted.is_empty() {
        out.deferred = deferred(repo);
        if out.deferred.is_some() {
            return out;
        }
    }
    let now = Utc::now();
    let newest = interrupted.last().map(|r| r.run_id.clone());
    for run in interrupted {
        let started = DateTime::parse_from_rfc3339(&run.started_at)
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or(now);
        let ended = committed_receipt(ctx, repo, &mut store, &run, started).or_else(|| {
            let (status, changed) = finished_uncommitted(ctx, repo, &mut store, &run, started, identity)?;
            if !changed.is_empty() {
                out.cards.push(changed_records_card(&run.run_id, &changed));
            }
            Some(status)
        });
        if let Some(status) = ended {
            if end_pause_of(&mut store, &run, status) {
                out.pause_finished_by = Some(run.run_id.clone());
            }
            continue;
        }
        let removed = remove_leftovers(ctx, repo, &run, started);
        let newest = newest.as_deref() == Some(run.run_id.as_str());
        let why_not = match explicit {
            Some(id) => not_the_one_asked(&run, id, newest),
            None if !newest => Some("a later run of the task was interrupted too".into()),
            None => not_resumable(&run, inputs, window, now),
        };
        let state = run
            .state
            .as_deref()
            .and_then(|s| serde_json::from_str::<LoopState>(s).ok());
        match (why_not, state) {
            (None, Some(state)) => {
                tracing::info!(run = %run.run_id, step = run.step, "resuming an interrupted run");
                out.resume = Some((run, state));
            }
            (why, _) => {
                let why = why.unwrap_or_else(|| "its checkpoint could not be read".into());
                if let Err(e) = crate::journal::close_crashed(&mut store, &run.run_id, now) {
                    tracing::warn!(error = %e, run = %run.run_id, "the interrupted run was not closed");
                    continue;
                }
                out.cards.push(crashed_card(&run, &why, &removed));
            }
        }
    }
    out
}

/// The state database and the task's interrupted runs (their rows say `running`,
/// their process is gone), oldest first; `None` when they cannot be read.
fn interrupted_runs(ctx: &FireContext) -> Option<(Store, Vec<LiveRun>)> {
    let read = StateDb::open(&ctx.opts.root)
        .map(StateDb::into_store)
        .map_err(|e| e.to_string())
        .and_then(|store| {
            let live = crate::journal::live_runs(&store, &ctx.opts.task).map_err(|e| e.to_string())?;
            Ok((store, live))
        });
    match read {
        Ok((store, live)) => {
            let gone = |r: &LiveRun| r.run_id != ctx.run_id && r.owner_gone();
            Some((store, live.into_iter().filter(gone).collect()))
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read interrupted runs");
            None
        }
    }
}

/// The `crashed` card of an interrupted run closed without resuming.
fn crashed_card(run: &LiveRun, why: &str, removed: &[String]) -> CardDraft {
    let mut evidence = vec![
        format!("run {}", run.run_id),
        format!("last completed step {}", run.step),
        format!("pid {} gone", run.pid),
    ];
    evidence.extend(removed.iter().map(|p| format!("removed uncommitted record {p}")));
    CardDraft {
        kind: CardKind::Crashed,
        summary: format!(
            "run {} was interrupted after step {} and closed as crashed",
            run.run_id, run.step
        ),
        detail: format!("not resumed: {why}"),
        evidence,
    }
}

/// A run whose receipt HEAD already holds (or the index, staged by a commit that was
/// killed before it moved the branch) ended; only its row was left behind: the row is
/// rebuilt from that receipt.
fn committed_receipt(
    ctx: &FireContext,
    repo: &git2::Repository,
    store: &mut Store,
    run: &LiveRun,
    started: DateTime<Utc>,
) -> Option<records::RunStatus> {
    let rel = records::receipt_path(&ctx.opts.task, &run.run_id, started);
    let rel = rel.to_string_lossy();
    let blob = committed_or_staged(repo, &rel)?;
    let receipt = repo
        .find_blob(blob)
        .ok()
        .and_then(|b| serde_json::from_slice::<records::Receipt>(b.content()).ok())?;
    rebuild_row(store, run, &receipt, &rel);
    Some(receipt.status)
}

/// The row of the ended `run` rebuilt from its `receipt` (at `receipt_rel`; its report
/// is the first of its outputs), its live row gone.
fn rebuild_row(store: &mut Store, run: &LiveRun, receipt: &records::Receipt, receipt_rel: &str) {
    let report = receipt.outputs.first().map(String::as_str);
    let saved = store.write(|tx| {
        crate::store::insert_run(tx, receipt, receipt_rel, report)?;
        crate::journal::end(tx, &run.run_id)
    });
    if let Err(e) = saved {
        tracing::warn!(error = %e, run = %run.run_id, "the ended run's row was not rebuilt");
    }
}

/// After the interrupted `run` is found ended (its records committed or kept), with
/// its receipt saying `status`: a resume of a paused run that ended, not paused
/// again, has ended that pause too, and its checkpoint goes (helper-100: kept, the
/// pause was continued again and the resume's calls ran twice). `true` when it did.
fn end_pause_of(store: &mut Store, run: &LiveRun, status: records::RunStatus) -> bool {
    if run.ledger_run == run.run_id || status == records::RunStatus::WaitingApproval {
        return false;
    }
    let ended = crate::state::delete_checkpoint_of(store, &run.ledger_run);
    if let Err(e) = &ended {
        tracing::warn!(error = %e, run = %run.ledger_run, "the pause a finished resume ended was not closed");
    }
    ended.is_ok()
}

/// The most bytes a finished run's record is read with ([`finished_uncommitted`]).
const FINISHED_RECORD_CAP: u64 = 64 << 20;

/// A run killed after it wrote its receipt (the last of its records) and before its
/// commit had ended. Its records are kept in git for the next commit to take in
/// ([`crate::pending::keep`], which this fire's commit does), and its row is rebuilt
/// from the receipt, rather than the run being resumed or closed as crashed with its
/// finished records removed (helper-96). Only the bytes it wrote: each record is
/// checked against the SHA-256 the run noted before its receipt
/// ([`crate::state::StateDb::note_records`]), and one a person or another task's
/// tool changed since (uncommitted records under `reports/` are any tool's to edit)
/// is left where it is, named in the card returned, not committed as the run's
/// (helper-98). The receipt's status and those files; `None` when the run had not
/// finished (no receipt, or not the one it noted), or its records could not be kept:
/// it is then settled as before.
fn finished_uncommitted(
    ctx: &FireContext,
    repo: &git2::Repository,
    store: &mut Store,
    run: &LiveRun,
    started: DateTime<Utc>,
    identity: (&str, &str),
) -> Option<(records::RunStatus, Vec<String>)> {
    let hashes = run.record_hashes()?;
    let dir = crate::beneath::open_root(&ctx.opts.root).ok()?;
    let read = |rel: &str| crate::beneath::read_regular(&dir, std::path::Path::new(rel), FINISHED_RECORD_CAP).ok();
    let as_written = |rel: &str, bytes: &[u8]| hashes.get(rel) == Some(&crate::journal::sha256_hex(bytes));
    let receipt_rel = records::receipt_path(&ctx.opts.task, &run.run_id, started)
        .to_string_lossy()
        .into_owned();
    let bytes = read(&receipt_rel).filter(|b| as_written(&receipt_rel, b))?;
    let receipt = serde_json::from_slice::<records::Receipt>(&bytes).ok()?;
    // What the receipt names (its report, the first of its outputs, wherever a planted
    // file made it go, and the model's outputs it accepted) and its cards.
    let mut files = vec![(receipt_rel.clone(), bytes)];
    let mut changed = Vec::new();
    let cards = uncommitted_cards_of(ctx, repo, &dir, &run.run_id);
    for rel in receipt.outputs.iter().cloned().chain(cards) {
        match read(&rel) {
            Some(b) if as_written(&rel, &b) => files.push((rel, b)),
            Some(_) => changed.push(rel),
            // Gone since (another task's tool removed it; helper-105: the receipt was
            // committed without its report, on no card).
            None => changed.push(format!("{rel} (missing)")),
        }
    }
    if let Err(e) = crate::pending::keep(repo, &run.run_id, &files, identity) {
        tracing::warn!(error = %e, run = %run.run_id, "a finished run's records were not kept for the next commit");
        return None;
    }
    rebuild_row(store, run, &receipt, &receipt_rel);
    tracing::info!(run = %run.run_id, kept = files.len(), "an interrupted run had finished: its records go with this fire's commit");
    Some((receipt.status, changed))
}

/// The card of records of the finished run `run` that were changed after it wrote
/// them, and so were not committed as its own.
fn changed_records_card(run: &str, changed: &[String]) -> CardDraft {
    CardDraft {
        kind: CardKind::OutputRejected,
        summary: format!("{} record(s) of run {run} changed or removed after it wrote them: not committed as its own", changed.len()),
        detail: "The run was killed before its commit; the next fire committed what it wrote, except these files, which a person or another task's tool changed or removed since (uncommitted files under `reports/` are any tool's to edit). They are left in the work tree as they are.".into(),
        evidence: changed.to_vec(),
    }
}

/// The blob of `rel` in HEAD, or else in the index: a run killed between writing the
/// index and moving the branch left its records staged, and the dead commit's intent
/// names them, so the next commit takes them in (`crate::git`); or else kept in git
/// for a later commit by a run whose commit was blocked ([`crate::pending`]), which
/// the next commit takes in too.
fn committed_or_staged(repo: &git2::Repository, rel: &str) -> Option<git2::Oid> {
    if let Ok(Some(blob)) = crate::git::head_blob(repo, rel) {
        return Some(blob);
    }
    let staged = repo.index().ok().and_then(|mut index| {
        index.read(true).ok()?;
        index.get_path(std::path::Path::new(rel), 0).map(|e| e.id)
    });
    staged.or_else(|| crate::pending::blob_of(repo, rel))
}

/// Removes the report and receipt an interrupted run wrote but did not commit (the
/// resumed run writes its own; a closed one has none); returns their paths.
fn remove_leftovers(ctx: &FireContext, repo: &git2::Repository, run: &LiveRun, started: DateTime<Utc>) -> Vec<String> {
    let Ok(dir) = crate::beneath::open_root(&ctx.opts.root) else {
        return Vec::new();
    };
    let mut removed = Vec::new();
    for rel in [
        records::report_path(&ctx.opts.task, &run.run_id, started),
        records::receipt_path(&ctx.opts.task, &run.run_id, started),
    ] {
        let name = rel.to_string_lossy().into_owned();
        if matches!(crate::git::head_blob(repo, &name), Ok(Some(_))) {
            continue;
        }
        if crate::beneath::remove_file(&dir, &rel).is_ok() {
            removed.push(name);
        }
    }
    for rel in uncommitted_cards_of(ctx, repo, &dir, &run.run_id) {
        if crate::beneath::remove_file(&dir, std::path::Path::new(&rel)).is_ok() {
            removed.push(rel);
        }
    }
    removed
}

/// Card files under `cards/` that HEAD does not hold and that name `run_id`.
fn uncommitted_cards_of(
    ctx: &FireContext,
    repo: &git2::Repository,
    dir: &std::os::fd::OwnedFd,
    run_id: &str,
) -> Vec<String> {
    let Ok(days) = std::fs::read_dir(ctx.opts.root.join("cards")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for day in days.flatten().filter(|d| d.file_type().is_ok_and(|t| t.is_dir())) {
        let Ok(files) = std::fs::read_dir(day.path()) else {
            continue;
        };
        for f in files.flatten() {
            let rel = format!(
                "cards/{}/{}",
                day.file_name().to_string_lossy(),
                f.file_name().to_string_lossy()
            );
            if !rel.ends_with(".yaml") || matches!(crate::git::head_blob(repo, &rel), Ok(Some(_))) {
                continue;
            }
            let names_run = crate::beneath::read_regular(dir, std::path::Path::new(&rel), 1 << 20)
                .ok()
                .and_then(|b| serde_yaml::from_slice::<serde_yaml::Value>(&b).ok())
                .is_some_and(|v| v["run_id"].as_str() == Some(run_id));
            if names_run {
                out.push(rel);
            }
        }
    }
    out
}

/// How much older than the last sweep's start a record directory's last change must
/// be for the next sweep to pass it over: directory times come from the kernel's
/// coarse clock, and a clock set back a little must not hide a dead writer's file.
const SWEEP_MARGIN: Duration = Duration::from_secs(600);

/// Removes the temporary files of record writes a dead process left (a fire killed
/// while writing a report, receipt or card: [`crate::beneath::create_new`]) under the
/// task's record directories and `cards/`.
///
/// Only the day directories that changed since shortly before the task's last sweep
/// are listed, so a fire does not list the task's whole history (at 20,000 records
/// that took 12-27 ms of every fire). Making a temporary file changes its directory,
/// and a sweep that saw no live writer's file left none behind in what it listed: a
/// directory that has not changed since then holds none. The start of such a sweep
/// is kept on the task's lock ([`LockFile::mark_swept`]); a sweep that saw a writer
/// still at work keeps the earlier mark, so its file is looked at again, and so does
/// one that could not list a day or remove a file. Without a mark (no lock, a new
/// one), or with one later than now (a clock set back), every day is listed.
fn remove_dead_temps(ctx: &FireContext, lock: Option<&LockFile>) {
    let began = std::time::SystemTime::now();
    let Ok(dir) = crate::beneath::open_root(&ctx.opts.root) else {
        return;
    };
    let since = lock
        .and_then(LockFile::last_sweep)
        .filter(|mark| *mark <= began)
        .and_then(|t| t.checked_sub(SWEEP_MARGIN));
    let unchanged = |day: &std::fs::DirEntry| {
        since.is_some_and(|since| day.metadata().and_then(|m| m.modified()).is_ok_and(|m| m < since))
    };
    // A file left for a later sweep: a writer still at work, or one not removed.
    let mut writer_at_work = false;
    let task = &ctx.opts.task;
    for top in [format!("reports/{task}"), format!("runs/{task}"), "cards".to_string()] {
        let Ok(days) = std::fs::read_dir(ctx.opts.root.join(&top)) else {
            continue;
        };
        for day in days.flatten().filter(|d| d.file_type().is_ok_and(|t| t.is_dir())) {
            if unchanged(&day) {
                continue;
            }
            let Ok(files) = std::fs::read_dir(day.path()) else {
                writer_at_work = true;
                continue;
            };
            for f in files.flatten() {
                let name = f.file_name().to_string_lossy().into_owned();
                let Some(pid) = crate::beneath::temp_owner(&name) else {
                    continue;
                };
                if !crate::git::process_is_gone(pid, None) {
                    writer_at_work = true;
                    continue;
                }
                let rel = std::path::Path::new(&top).join(day.file_name()).join(&name);
                match crate::beneath::remove_file(&dir, &rel) {
                    Ok(()) => tracing::info!(file = %rel.display(), pid, "removed a dead fire's half-written record"),
                    Err(_) => writer_at_work = true,
                }
            }
        }
    }
    if let (Some(lock), false) = (lock, writer_at_work) {
        if let Err(e) = lock.mark_swept(began) {
            tracing::debug!(error = %e, "the sweep of dead writers' files was not marked: the next one lists every day");
        }
    }
}
