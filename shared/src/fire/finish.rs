//! Step 6 of a fire: the one records writer. A [`RunRecords`] value says what the run
//! leaves behind; [`write`] creates the cards, the report and the receipt (create-only,
//! redacted), stores the run's row and trace in the state database, and commits the
//! new files under the runtime identity. [`FireRun::finish`] builds that value for a
//! run that reached the loop.

use super::ending::{hint_for, After, Ending};
use super::{FireContext, FireEnd, FireRun, FireSummary, RunRecords};
use crate::agent::{CardDraft, LoopState};
use crate::git::AutoGc;
use crate::layout::{Owner, Ownership, RUNTIME_DIRS};
use crate::records::{self, AcceptanceRecord, Card, CardKind, Receipt, RunStatus, StopReason, WriteError};
use crate::secrets::Redactor;
use crate::settings::Identity;
use crate::state::{self, Checkpoint, LockWait, StateDb};
use crate::telemetry::Exporter;
use crate::trace::SpanStatus;
use chrono::Utc;

/// Where records go and who signs them.
pub(crate) struct RecordSink<'a> {
    pub redactor: Redactor,
    pub identity: Identity,
    /// Where the trace goes when the fire ends, if anywhere.
    pub telemetry: Option<Exporter>,
    /// The fire's own repository handle (git's index is loaded once per fire).
    pub repo: &'a git2::Repository,
    /// The caps on what the model may leave under `reports/` and see committed.
    pub limits: crate::settings::Limits,
    /// `strict`: each record is fsynced before its rename, its directory after.
    pub durability: crate::settings::Durability,
    /// The write ACL's directories, repo-relative: where a tool may have left what git
    /// reads from the work tree ([`super::outputs::git_read_files`]).
    pub write_roots: Vec<String>,
}

/// Why writing the records failed, and what that makes of the fire.
struct WriteFailure {
    end: FireEnd,
    message: String,
}

impl From<WriteError> for WriteFailure {
    fn from(e: WriteError) -> WriteFailure {
        let end = match &e {
            // A record we built that does not serialise is our bug.
            WriteError::Serialise { .. } => FireEnd::Internal,
            WriteError::Exists { .. } | WriteError::Io { .. } => FireEnd::Environment,
        };
        WriteFailure {
            end,
            message: e.to_string(),
        }
    }
}

/// What the records writer has produced so far, step by step: the records written
/// and their bytes, those the work tree could not take, the cards' ids, the first
/// failure that decides the fire, and the commit.
#[derive(Default)]
struct Written {
    /// Records written to the work tree (and accepted model outputs), repo-relative.
    files: Vec<String>,
    /// The bytes of each of `files`, as committed (never re-read from the work tree).
    held: Vec<(String, Vec<u8>)>,
    /// Records that could not be written to the work tree (a full disk, a directory a
    /// tool made unwritable): path, bytes and why. Kept with the others in git for the
    /// next fire to write and commit, never lost ([`crate::pending`]).
    unwritten: Vec<(String, Vec<u8>, String)>,
    /// The ids of the cards made (written or not).
    card_ids: Vec<String>,
    failure: Option<WriteFailure>,
    /// The records' commit, once made.
    commit: Option<String>,
    /// The commit was blocked: a `commit_blocked` card says why.
    blocked: bool,
}

/// The fire's report: where it went (repo-relative) and its text, `None` when it
/// could not be made.
struct ReportPlaced {
    rel: std::path::PathBuf,
    text: Option<String>,
}

/// Writes cards, report and receipt (create-only), closes and stores the trace,
/// commits, and last exports the trace (best effort: it never changes the outcome).
/// The commit carries the bytes written here (held in memory), the model's accepted
/// files from `reports/` (see [`super::outputs`]), and nothing re-read from a path a
/// tool process could have replaced. `db` is the state database the caller opened
/// (once per fire; opening it checks it and rebuilds a damaged one), `None` when it
/// could not be opened.
pub(crate) fn write(
    ctx: &FireContext,
    sink: &RecordSink,
    rec: &mut RunRecords,
    db: Option<&mut StateDb>,
    decide: impl FnOnce(&RunRecords) -> Ending,
) -> FireSummary {
    let task = &ctx.opts.task;
    close_root(ctx, rec);
    let owed = owed_cards(ctx, rec);
    let finished_at = crate::trace::now_utc();
    let mut w = Written::default();
    let canonical_report = records::report_path(task, &ctx.run_id, ctx.started_at);
    let mut outputs = model_outputs(ctx, sink, &canonical_report, &rec.state.made_by_tools, db.as_deref());
    outputs.rejected.extend(rec.state.removed_before_checks.iter().cloned());
    let cost = (rec.state.cost_usd * 1e6).round() / 1e6;
    let report = sink
        .redactor
        .redact(&render_report(task, &ctx.run_id, rec, cost))
        .into_owned();
    crate::failpoint!("before-report-write");
    let report = write_report(ctx, sink, canonical_report, report, &mut outputs.rejected, &mut w);
    if let Some(card) = rejected_card(&outputs.rejected, &sink.redactor) {
        rec.state.cards.push(card);
    }
    // Every card is known now: the fire's ending is decided here, once, before any
    // card, receipt or commit; what follows can only worsen it (`Ending::worsen`).
    let mut ending = decide(rec);
    crate::failpoint!("during-records-write");
    let rec = &*rec;
    write_cards(ctx, sink, &rec.state.cards, finished_at, &mut w);
    let mut outputs_list = vec![report.rel.to_string_lossy().into_owned()];
    for (rel, bytes) in outputs.accepted {
        outputs_list.push(rel.clone());
        w.files.push(rel.clone());
        w.held.push((rel, bytes));
    }
    let receipt_rel = records::receipt_path(task, &ctx.run_id, ctx.started_at);
    let receipt = receipt_of(ctx, rec, finished_at, cost, outputs_list, w.card_ids.clone());
    let receipt_bytes = records::receipt_json(&receipt).map(|j| sink.redactor.redact(&j).into_owned().into_bytes());
    let mut db = db;
    if let (Ok(bytes), Some(db)) = (&receipt_bytes, db.as_deref_mut()) {
        note_records(db, &ctx.run_id, &w.held, (&receipt_rel, bytes));
    }
    write_receipt(ctx, sink, receipt_bytes, &receipt_rel, &mut w);
    crate::failpoint!("between-records-and-commit");
    commit_or_keep(ctx, sink, rec.status, &mut w);
    // The row is final only once the records are committed: a run killed before
    // keeps its `running` row, and the next fire resumes it (rewriting its records)
    // or finds its receipt committed and takes the row from there.
    save_run(db, &rec.state, &receipt, &receipt_rel, &report.rel);
    // Owed cards are forgotten once committed: a `--no-commit` fire (a person's
    // trial run) leaves them to the next fire that commits.
    if w.failure.is_none() && w.commit.is_some() {
        for note in &owed {
            state::card_reported(note);
        }
    }
    if let Some(failure) = w.failure.take() {
        tracing::error!(error = %failure.message, "writing the fire's records failed");
        ending.worsen(After::Failed {
            end: failure.end,
            message: failure.message,
            hint: w
                .blocked
                .then(|| hint_for(CardKind::CommitBlocked, &ctx.run_id, None))
                .flatten(),
        });
    }
    if let Some(exporter) = &sink.telemetry {
        export(ctx, exporter, &rec.state.trace);
    }
    summary_of(ctx, rec, w, ending, report, &receipt_rel)
}

/// Creates the report (at its canonical name, or under `runs/` when a tool took
/// that: the name taken is added to `rejected`). One the work tree cannot take is
/// kept as unwritten; another failure is the fire's.
#[tracing::instrument(level = "debug", skip_all)]
fn write_report(
    ctx: &FireContext,
    sink: &RecordSink,
    canonical: std::path::PathBuf,
    report: String,
    rejected: &mut Vec<(String, String)>,
    w: &mut Written,
) -> ReportPlaced {
    let placed = place_report(
        &ctx.opts.root,
        &canonical,
        &ctx.run_id,
        &ctx.opts.task,
        ctx.started_at,
        &report,
        sink.durability.fsyncs(),
    );
    match placed {
        Ok((rel, taken)) => {
            rejected.extend(taken);
            let name = rel.to_string_lossy().into_owned();
            w.files.push(name.clone());
            w.held.push((name, report.clone().into_bytes()));
            ReportPlaced {
                rel,
                text: Some(report),
            }
        }
        Err(WriteError::Io { source, .. }) => {
            let name = canonical.to_string_lossy().into_owned();
            w.unwritten
                .push((name, report.clone().into_bytes(), source.to_string()));
            ReportPlaced {
                rel: canonical,
                text: Some(report),
            }
        }
        Err(e) => {
            w.failure = Some(e.into());
            ReportPlaced {
                rel: canonical,
                text: None,
            }
        }
    }
}

/// Creates a card file for each draft, in order.
fn write_cards(
    ctx: &FireContext,
    sink: &RecordSink,
    drafts: &[CardDraft],
    finished_at: chrono::DateTime<Utc>,
    w: &mut Written,
) {
    for draft in drafts {
        match write_card(ctx, sink, draft, finished_at) {
            Ok((id, rel, bytes)) => {
                w.files.push(rel.clone());
                w.held.push((rel, bytes));
                w.card_ids.push(id);
            }
            Err(CardWrite::Unwritten { id, rel, bytes, why }) => {
                w.unwritten.push((rel, bytes, why));
                w.card_ids.push(id);
            }
            Err(CardWrite::Failed(e)) => w.failure = Some(e.into()),
        }
    }
}

/// Creates the receipt (redacted) at `receipt_rel`.
#[tracing::instrument(level = "debug", skip_all)]
fn write_receipt(
    ctx: &FireContext,
    sink: &RecordSink,
    receipt_bytes: Result<Vec<u8>, WriteError>,
    receipt_rel: &std::path::Path,
    w: &mut Written,
) {
    let fsync = sink.durability.fsyncs();
    let name = receipt_rel.to_string_lossy().into_owned();
    match receipt_bytes.map(|b| (records::create_new_synced(&ctx.opts.root, receipt_rel, &b, fsync), b)) {
        Ok((Ok(()), b)) => {
            w.files.push(name.clone());
            w.held.push((name, b));
        }
        Ok((Err(WriteError::Io { source, .. }), b)) => w.unwritten.push((name, b, source.to_string())),
        Ok((Err(e), _)) | Err(e) => w.failure = Some(e.into()),
    }
}

/// Notes the SHA-256 of every record the run wrote and of its receipt (`receipt`:
/// path and bytes, written next) on its live row: a run killed before its commit is
/// then committed by the next fire only with those bytes (`recover`), never with what
/// a person or another task's tool changed meanwhile. A note that cannot be written
/// costs only that: such a run is then treated as unfinished.
fn note_records(db: &mut StateDb, run_id: &str, held: &[(String, Vec<u8>)], receipt: (&std::path::Path, &Vec<u8>)) {
    let receipt_name = receipt.0.to_string_lossy().into_owned();
    let files: Vec<(String, &[u8])> = (held.iter().map(|(p, b)| (p.clone(), b.as_slice())))
        .chain(std::iter::once((receipt_name, receipt.1.as_slice())))
        .collect();
    if let Err(e) = db.note_records(run_id, &files) {
        tracing::warn!(error = %e, "the run's record hashes were not noted");
    }
}

/// Commits the records written (unless `--no-commit` or a failure); records the work
/// tree could not take, or a commit that fails, leave them kept in git with a
/// `commit_blocked` card ([`leave_blocked`]).
#[tracing::instrument(level = "debug", skip_all)]
fn commit_or_keep(ctx: &FireContext, sink: &RecordSink, status: RunStatus, w: &mut Written) {
    if !w.unwritten.is_empty() && w.failure.is_none() {
        let (path, _, why) = &w.unwritten[0];
        let mut e = WriteFailure {
            end: FireEnd::Environment,
            message: format!(
                "{} record(s) could not be written to the work tree ({path}: {why})",
                w.unwritten.len()
            ),
        };
        if !ctx.opts.no_commit {
            w.held
                .extend(w.unwritten.iter().map(|(f, b, _)| (f.clone(), b.clone())));
            w.card_ids.extend(leave_blocked(ctx, sink, w.held.clone(), &mut e));
            w.blocked = true;
        }
        w.failure = Some(e);
    } else if !ctx.opts.no_commit && w.failure.is_none() {
        test_pause_before_commit(&ctx.opts.root);
        match commit_records(ctx, sink, &w.files, &w.held, status) {
            Ok(c) => w.commit = Some(c),
            Err(mut e) => {
                w.card_ids
                    .extend(leave_blocked(ctx, sink, std::mem::take(&mut w.held), &mut e));
                w.blocked = true;
                w.failure = Some(e);
            }
        }
    }
}

/// The fire's summary once its records are written (or not), ending as decided.
fn summary_of(
    ctx: &FireContext,
    rec: &RunRecords,
    w: Written,
    ending: Ending,
    report: ReportPlaced,
    receipt_rel: &std::path::Path,
) -> FireSummary {
    FireSummary {
        run_id: ctx.run_id.clone(),
        task: ctx.opts.task.clone(),
        status: rec.status,
        stop_reason: rec.stop,
        end: ending.end,
        report: Some(report.rel.to_string_lossy().into_owned()),
        report_text: report.text,
        receipt: Some(receipt_rel.to_string_lossy().into_owned()),
        cards: w.card_ids,
        commit: w.commit,
        records_kept: w.blocked,
        message: ending.message,
        hint: ending.hint,
    }
}

/// Adds the cards owed to the next commit ([`state::owed_cards`]: a reset of the state
/// database, a paused run given up) to this fire's; returns the notes to drop once
/// the cards are committed.
fn owed_cards(ctx: &FireContext, rec: &mut RunRecords) -> Vec<std::path::PathBuf> {
    state::owed_cards(&ctx.opts.root)
        .into_iter()
        .map(|(note, card)| {
            rec.state.cards.push(card);
            note
        })
        .collect()
}

/// Ends the fire's root span with the run's status (opening it first for a fire
/// refused before its trace began).
fn close_root(ctx: &FireContext, rec: &mut RunRecords) {
    let trace = &mut rec.state.trace;
    let root = match trace.root {
        Some(root) => root,
        None => {
            ctx.open_root(trace);
            trace.root.unwrap_or_default()
        }
    };
    trace.attr(root, "agent.status", rec.status.as_str());
    trace.attr(root, "agent.stop_reason", rec.stop.as_str());
    trace.attr(root, "agent.steps", rec.state.step);
    // `agent.status` says exactly how the run ended; the span says whether it went well.
    let status = match rec.status {
        RunStatus::Accepted | RunStatus::Completed | RunStatus::Skipped | RunStatus::WaitingApproval => SpanStatus::Ok,
        RunStatus::Failed | RunStatus::Crashed | RunStatus::Running => SpanStatus::Failed,
        RunStatus::Cancelled => SpanStatus::Cancelled,
    };
    trace.end(root, status);
}

/// Sends the trace to the OTLP endpoint. A failure is logged and nothing else: the
/// records are written and committed by now, and the exit code does not change.
fn export(ctx: &FireContext, exporter: &Exporter, trace: &crate::trace::Trace) {
    let t = std::time::Instant::now();
    let request = crate::trace::otlp_request(&ctx.run_id, &ctx.opts.task, trace, exporter.include_content);
    match exporter.export(&request) {
        Ok(()) => tracing::debug!(
            export_ms = t.elapsed().as_secs_f64() * 1e3,
            url = %exporter.url,
            spans = trace.spans.len(),
            "trace exported"
        ),
        Err(e) => tracing::warn!(error = %e, "the trace was not exported"),
    }
}

/// Test-only (debug builds): with this variable set, a fire stops after writing its
/// records and before committing them, creates `.runtime/test-pause.paused` and waits
/// (at most 30 s) for `.runtime/test-pause.go`: the named point at which an attack
/// test replaces a written record. Release builds ignore it.
pub const PAUSE_BEFORE_COMMIT_ENV: &str = "RUNTIME_TEST_PAUSE_BEFORE_COMMIT";

#[cfg(debug_assertions)]
fn test_pause_before_commit(root: &std::path::Path) {
    if std::env::var_os(PAUSE_BEFORE_COMMIT_ENV).is_none_or(|v| v.is_empty()) {
        return;
    }
    let dir = root.join(crate::layout::STATE_DIR);
    let _ = std::fs::write(dir.join("test-pause.paused"), b"");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !dir.join("test-pause.go").exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[cfg(not(debug_assertions))]
fn test_pause_before_commit(_root: &std::path::Path) {}

/// The receipt of a run whose records are being written.
fn receipt_of(
    ctx: &FireContext,
    rec: &RunRecords,
    finished_at: chrono::DateTime<Utc>,
    cost_usd: f64,
    outputs: Vec<String>,
    cards: Vec<String>,
) -> Receipt {
    Receipt {
        run_id: ctx.run_id.clone(),
        task: ctx.opts.task.clone(),
        status: rec.status,
        stop_reason: rec.stop,
        started_at: ctx.started_at,
        finished_at,
        inputs: rec.inputs.clone(),
        sandbox: rec.sandbox.clone(),
        steps: rec.state.step,
        tool_calls: rec.state.tool_calls.clone(),
        tokens: rec.state.tokens,
        cost_usd,
        retries: rec.state.retries,
        denials: rec.state.denials,
        outputs,
        cards,
        acceptance: rec.acceptance.clone(),
        resumed_from: ctx.opts.resume.clone(),
    }
}

/// Why a card was not written: its file could not be created (the card exists, as
/// bytes, for the records kept in git), or it could not be made at all.
enum CardWrite {
    Unwritten {
        id: String,
        rel: String,
        bytes: Vec<u8>,
        why: String,
    },
    Failed(WriteError),
}

impl From<CardWrite> for WriteError {
    fn from(e: CardWrite) -> WriteError {
        match e {
            CardWrite::Failed(e) => e,
            CardWrite::Unwritten { rel, why, .. } => WriteError::Io {
                path: rel.into(),
                source: std::io::Error::other(why),
            },
        }
    }
}

/// Creates one card file (redacted, and capped in size: [`records::cap_card`]);
/// returns its id, repo-relative path and bytes.
fn write_card(
    ctx: &FireContext,
    sink: &RecordSink,
    draft: &CardDraft,
    at: chrono::DateTime<Utc>,
) -> Result<(String, String, Vec<u8>), CardWrite> {
    let redact = |s: &str| sink.redactor.redact(s).into_owned();
    // Evidence and detail lines name model files: a secret only their path shows (split
    // across directories, partly escaped) is hidden too.
    let redact_lines = |s: &str| {
        let lines: Vec<String> = s.lines().map(|l| sink.redactor.redact_path(l)).collect();
        lines.join("\n")
    };
    let mut card = Card::new(
        draft.kind,
        &ctx.opts.task,
        &ctx.run_id,
        redact(&draft.summary),
        redact_lines(&draft.detail),
        draft.evidence.iter().map(|e| sink.redactor.redact_path(e)).collect(),
        at,
    );
    records::cap_card(&mut card);
    let rel = card.rel_path();
    let bytes = records::card_yaml(&card).map_err(CardWrite::Failed)?.into_bytes();
    match records::create_new_synced(&ctx.opts.root, &rel, &bytes, sink.durability.fsyncs()) {
        Ok(()) => Ok((card.id, rel.to_string_lossy().into_owned(), bytes)),
        Err(WriteError::Io { source, .. }) => Err(CardWrite::Unwritten {
            id: card.id,
            rel: rel.to_string_lossy().into_owned(),
            bytes,
            why: source.to_string(),
        }),
        Err(e) => Err(CardWrite::Failed(e)),
    }
}

/// After a failed or blocked commit (or records the work tree could not take): one
/// `commit_blocked` card saying why, and the run's records (the card with them) kept
/// in git for the next fire's commit ([`crate::pending::keep`]: their blobs and a ref
/// under `refs/runtime/pending/`), which writes back any the work tree lacks or holds
/// other bytes in and commits the bytes written here. Where git cannot take them (its
/// disk full too), they are named for the next commit in `.runtime/` instead, taken
/// in while the work tree still holds them. The run's row (stored next) points at its
/// receipt all the same. Returns the card's id; the failure's message says where the
/// records went.
fn leave_blocked(
    ctx: &FireContext,
    sink: &RecordSink,
    mut held: Vec<(String, Vec<u8>)>,
    failure: &mut WriteFailure,
) -> Option<String> {
    let draft = CardDraft {
        kind: CardKind::CommitBlocked,
        summary: format!(
            "the records of run {} were not committed; the next fire's commit takes them in",
            ctx.run_id
        ),
        detail: failure.message.clone(),
        evidence: held.iter().map(|(f, _)| format!("left uncommitted: {f}")).collect(),
    };
    let card = match write_card(ctx, sink, &draft, Utc::now()) {
        Ok((id, rel, bytes)) => {
            held.push((rel, bytes));
            Some(id)
        }
        Err(CardWrite::Unwritten { id, rel, bytes, why }) => {
            tracing::warn!(card = %rel, error = %why, "the commit_blocked card could not be written to the work tree; it is kept with the records");
            held.push((rel, bytes));
            Some(id)
        }
        Err(CardWrite::Failed(e)) => {
            tracing::warn!(error = %e, "the commit_blocked card was not written");
            None
        }
    };
    let identity = (sink.identity.name.as_str(), sink.identity.email.as_str());
    let kept = crate::pending::keep(sink.repo, &ctx.run_id, &held, identity);
    crate::failpoint!("after-pending-kept");
    match kept {
        Ok(reference) => failure.message.push_str(&format!(
            "; the records are kept in git ({reference}) and the next fire's commit (of any task) writes back and commits them"
        )),
        Err(e) => {
            tracing::warn!(error = %e, "the records could not be kept in git; naming them in .runtime/ instead");
            match crate::git::leave_for_next_commit(&crate::git::intent_dir(&ctx.opts.root), &held) {
                Ok(()) => failure.message.push_str(&format!(
                    "; the records stay in the work tree and the next fire's commit (of any task) takes them in (not kept in git: {e})"
                )),
                Err(e2) => {
                    tracing::warn!(error = %e2, "the records were not left for the next commit");
                    failure.message.push_str(&format!(
                        "; the records stay in the work tree, uncommitted (not kept for the next commit: {e}; {e2})"
                    ));
                }
            }
        }
    }
    card
}

/// Sorts what the model left under `reports/` (none for a fire refused before it
/// ran anything: then nothing under `reports/` changed since it started). `db`: the
/// fire's one state handle, asked whether a report-shaped file is its run's own.
#[tracing::instrument(level = "debug", skip_all)]
fn model_outputs(
    ctx: &FireContext,
    sink: &RecordSink,
    report: &std::path::Path,
    made_by_tools: &std::collections::BTreeSet<String>,
    db: Option<&StateDb>,
) -> super::outputs::Outputs {
    let t = std::time::Instant::now();
    // A resumed run's outputs go back to its pause: a resume killed after the approved
    // call made a file left it for this one (its id holds its start, to the second).
    let paused_at = ctx
        .opts
        .resume
        .as_deref()
        .and_then(|id| chrono::NaiveDateTime::parse_from_str(id.get(..16)?, "%Y%m%dT%H%M%SZ").ok())
        .map(|t| t.and_utc());
    let from = paused_at.map_or(ctx.started_at, |p| p.min(ctx.started_at));
    let since = (from.timestamp(), i64::from(from.timestamp_subsec_nanos()));
    let head_id = crate::git::head_commit(sink.repo).ok().flatten();
    let head = head_id
        .and_then(|c| sink.repo.find_commit(c).ok())
        .and_then(|c| c.tree().ok());
    let in_head = |p: &str| {
        head.as_ref()
            .and_then(|t| t.get_path(std::path::Path::new(p)).ok())
            .map(|e| e.id())
    };
    let own = [report.to_string_lossy().into_owned()];
    let head_dir = |dir: &str| head_entries(sink.repo, head.as_ref(), dir);
    let by_tools = |rel: &str| made_by_tools.contains(rel);
    // A report the database cannot be asked about counts as genuine: it is kept.
    let genuine_report = |rel: &str| db.is_none_or(|db| is_runs_own_report(db, rel));
    let known = super::outputs::Known {
        in_head: &in_head,
        head_dir: &head_dir,
        by_tools: &by_tools,
        genuine_report: &genuine_report,
    };
    let mut out = super::outputs::collect(&ctx.opts.root, since, &own, &known, &sink.limits);
    forget_staged_removals(sink.repo, &mut out);
    put_back(
        &ctx.opts.root,
        sink.repo,
        head_id,
        made_by_tools,
        &mut out,
        sink.durability.fsyncs(),
    );
    let secrets = refuse_secrets(&sink.redactor, &mut out);
    (out.rejected).extend(super::outputs::git_read_files(&ctx.opts.root, &sink.write_roots, since));
    let root = &ctx.opts.root;
    let removable = |rel: &str| {
        super::outputs::is_git_read(rel)
            || made_by_tools.contains(rel)
            || secrets.iter().any(|s| s == rel)
            || (on_the_way(report, rel) && std::fs::symlink_metadata(root.join(rel)).is_ok_and(|m| !m.is_dir()))
    };
    remove_rejected(&ctx.opts.root, &mut out.rejected, &in_head, &removable);
    tracing::debug!(
        scan_ms = t.elapsed().as_secs_f64() * 1e3,
        accepted = out.accepted.len(),
        rejected = out.rejected.len(),
        "model outputs sorted"
    );
    out
}

/// Whether `rel` (`reports/<task>/<day>/<run-id>.md`) is where the run it names wrote
/// its report: the state database knows the run, of that task, started that day
/// (helper-107: an earlier run's id, read from `runs/`, under another task or day
/// passed as genuine). A database that cannot answer vouches for it.
fn is_runs_own_report(db: &StateDb, rel: &str) -> bool {
    let parts: Vec<&str> = rel.split('/').collect();
    let [_, task, day, file] = parts.as_slice() else {
        return false;
    };
    let run = file.trim_end_matches(".md");
    match crate::runs::run(db.store(), run) {
        Ok(Some(row)) => {
            let started = run.get(..8).map(|d| format!("{}-{}-{}", &d[..4], &d[4..6], &d[6..]));
            row.run_id == run && row.task == *task && started.as_deref() == Some(*day)
        }
        Ok(None) => false,
        Err(_) => true,
    }
}

/// Moves the accepted model files holding a secret (the key in any form the redactor
/// knows) in their bytes or their name (helper-102: a report named after the key was
/// committed under it) to the rejected: not committed, and removed from the work
/// tree with every rejected output. Returns their names.
fn refuse_secrets(redactor: &Redactor, out: &mut super::outputs::Outputs) -> Vec<String> {
    let mut secrets = Vec::new();
    for (rel, bytes) in std::mem::take(&mut out.accepted) {
        let why = if redactor.path_holds_secret(&rel) {
            "its name holds a secret value: not committed"
        } else if match std::str::from_utf8(&bytes) {
            Ok(text) => redactor.redact(text) != text,
            Err(_) => redactor.holds_secret(&bytes),
        } {
            "holds a secret value: not committed"
        } else {
            out.accepted.push((rel, bytes));
            continue;
        };
        secrets.push(rel.clone());
        out.rejected.push((rel, why.into()));
    }
    secrets
}

/// The entries of the directory `dir` in HEAD's `tree` (trees, and everything else:
/// files, links, submodules), for [`super::outputs::collect`].
fn head_entries(repo: &git2::Repository, tree: Option<&git2::Tree<'_>>, dir: &str) -> Vec<super::outputs::HeadEntry> {
    let sub = match dir {
        "" => tree.cloned(),
        _ => tree
            .and_then(|t| t.get_path(std::path::Path::new(dir)).ok())
            .and_then(|e| e.to_object(repo).ok())
            .and_then(|o| o.into_tree().ok()),
    };
    let Some(sub) = sub else {
        return Vec::new();
    };
    sub.iter()
        .filter_map(|e| {
            let name = e.name().ok()?.to_string();
            // A link or a submodule counts as a file: a directory in its place (or
            // the reverse) is a name git cannot commit both ways (helper-93).
            Some((name, e.id(), e.kind() == Some(git2::ObjectType::Tree)))
        })
        .collect()
}

/// Drops what a person removed with `git rm` (every file of it gone from the index as
/// well) from the committed files found missing: theirs to commit, not a card on
/// every fire that writes beside it (helper-94).
fn forget_staged_removals(repo: &git2::Repository, out: &mut super::outputs::Outputs) {
    let Ok(mut index) = repo.index() else {
        return;
    };
    let _ = index.read(true);
    let put_back = &out.put_back;
    let staged = |named: &str| {
        let under = |rel: &String| rel == named || rel.starts_with(&format!("{named}/"));
        let mut files = put_back.iter().filter(|(rel, _)| under(rel)).peekable();
        files.peek().is_some() && files.all(|(rel, _)| index.get_path(std::path::Path::new(rel), 0).is_none())
    };
    let gone: Vec<String> = (out.rejected.iter())
        .filter(|(rel, why)| why.starts_with(super::outputs::MISSING) && staged(rel))
        .map(|(rel, _)| rel.clone())
        .collect();
    let dropped = |rel: &String| gone.iter().any(|g| rel == g || rel.starts_with(&format!("{g}/")));
    out.rejected.retain(|(rel, _)| !dropped(rel));
    out.put_back.retain(|(rel, _)| !dropped(rel));
}

/// Puts back, with HEAD's bytes, the committed files the fire found rewritten or
/// removed ([`super::outputs::Outputs::put_back`]) by its tools (the file, or for one
/// removed a directory above it, in `made`: a person's edit is never undone), and
/// says so in each one's reason on the card (the rejected entry that names it, or the
/// directory it was in). The file is written to a temporary name and renamed over
/// whatever file or link stands at the name ([`crate::beneath::replace_file`], through
/// no link): a fire killed meanwhile leaves the tools' file, never no file, and its
/// resumed run judges and puts it back again (the tools' list of what they made is
/// in the checkpoint; a fire killed during a call, before its list was kept, leaves
/// the file named on the card instead). All of it with
/// git's index lock held ([`crate::git::with_index_lock`]), and only while HEAD is
/// still `head_at` (the commit the files were judged by), no merge, rebase or other
/// operation is under way, and the index holds each file as HEAD does: a person's
/// checkout of a branch without the file removed it, and must not find it put back as
/// an untracked file in its way.
fn put_back(
    root: &std::path::Path,
    repo: &git2::Repository,
    head_at: Option<git2::Oid>,
    made: &std::collections::BTreeSet<String>,
    out: &mut super::outputs::Outputs,
    fsync: bool,
) {
    let in_the_way = in_the_way(made, out);
    let by_tools = |rel: &String| {
        std::path::Path::new(rel)
            .ancestors()
            .any(|a| made.contains(a.to_string_lossy().as_ref()))
            || in_the_way.iter().any(|(gone, _)| gone == rel)
    };
    let (mine, theirs): (Vec<_>, Vec<_>) = std::mem::take(&mut out.put_back)
        .into_iter()
        .partition(|(rel, _)| by_tools(rel));
    if mine.is_empty() && theirs.is_empty() {
        return;
    }
    let wait = std::time::Duration::from_secs(2);
    let failed = match mine.is_empty() {
        true => Vec::new(),
        false => crate::git::with_index_lock(root, wait, || {
            put_back_locked(root, repo, head_at, &in_the_way, &mine, fsync)
        })
        .unwrap_or_else(|| {
            let why = "git's index lock stayed held (a person's git is at work)";
            mine.iter().map(|(rel, _)| (rel.clone(), why.to_string())).collect()
        }),
    };
    let committed = |why: &str| {
        [
            super::outputs::REWRITTEN,
            super::outputs::MISSING,
            super::outputs::REPLACED,
        ]
        .iter()
        .any(|named| why.starts_with(named))
    };
    for (named, why) in out.rejected.iter_mut().filter(|(_, why)| committed(why)) {
        let under = |rel: &String| rel == named || rel.starts_with(&format!("{named}/"));
        if let Some((rel, e)) = failed.iter().find(|(rel, _)| under(rel)) {
            why.push_str(&format!("; not put back ({rel}: {e})"));
        } else if mine.iter().any(|(rel, _)| under(rel)) {
            why.push_str("; put back as committed");
        } else if theirs.iter().any(|(rel, _)| under(rel)) {
            why.push_str("; left as it is (not known to be the tools' doing)");
        }
    }
}

/// What the tools left in the way of putting committed files back, to remove first,
/// each with whether it is a directory: a file where HEAD has a directory
/// ([`super::outputs::Outputs::dirs_replaced`]); a directory where HEAD has a file
/// ([`super::outputs::Outputs::files_replaced`]), its files the tools made, then its
/// directories, deepest first, then itself. Anything else in such a directory (a
/// person's file) keeps it: the file is then not put back, and named so.
fn in_the_way(made: &std::collections::BTreeSet<String>, out: &super::outputs::Outputs) -> Vec<(String, bool)> {
    let mut gone: Vec<(String, bool)> = (out.dirs_replaced.iter())
        .filter(|d| made.contains(d.as_str()))
        .map(|d| (d.clone(), false))
        .collect();
    for file in &out.files_replaced {
        let below = format!("{file}/");
        let made_below: Vec<&String> = made
            .range(below.clone()..)
            .take_while(|m| m.starts_with(&below))
            .collect();
        if made_below.is_empty() {
            continue;
        }
        let mut dirs = std::collections::BTreeSet::new();
        for m in &made_below {
            gone.push(((*m).clone(), false));
            let parents = std::path::Path::new(m.as_str()).ancestors().skip(1);
            dirs.extend(
                parents
                    .map(|a| a.to_string_lossy().into_owned())
                    .take_while(|a| a.len() > file.len()),
            );
        }
        let mut dirs: Vec<String> = dirs.into_iter().collect();
        dirs.sort_by_key(|d| std::cmp::Reverse(d.matches('/').count()));
        gone.extend(dirs.into_iter().map(|d| (d, true)));
        gone.push((file.clone(), true));
    }
    gone
}

/// [`put_back`]'s work under the index lock: the files it could not put back, and why.
/// `in_the_way`: what the tools left where committed files go ([`in_the_way`]),
/// removed first.
fn put_back_locked(
    root: &std::path::Path,
    repo: &git2::Repository,
    head_at: Option<git2::Oid>,
    in_the_way: &[(String, bool)],
    wanted: &[(String, git2::Oid)],
    fsync: bool,
) -> Vec<(String, String)> {
    let at_work = "git is at work on the checkout (HEAD or the index moved)";
    let quiet = crate::git::commit_blocker(repo).is_ok_and(|b| b.is_none())
        && crate::git::head_commit(repo).ok().flatten() == head_at;
    // Read again from disk: the handle may hold an index older than a person's git.
    let index = repo.index().ok().filter(|_| quiet).map(|mut i| {
        let _ = i.read(true);
        i
    });
    let dir = match crate::beneath::open_root(root) {
        Ok(dir) => dir,
        Err(e) => return wanted.iter().map(|(rel, _)| (rel.clone(), e.to_string())).collect(),
    };
    if index.is_some() {
        for (gone, is_dir) in in_the_way {
            let path = std::path::Path::new(gone);
            let _ = match is_dir {
                true => crate::beneath::remove_dir(&dir, path),
                false => crate::beneath::remove_file(&dir, path),
            };
        }
    }
    let head = head_at
        .and_then(|c| repo.find_commit(c).ok())
        .and_then(|c| c.tree().ok());
    let mut failed = Vec::new();
    for (rel, blob) in wanted {
        let path = std::path::Path::new(rel);
        let indexed = index
            .as_ref()
            .and_then(|i| i.get_path(path, 0))
            .is_some_and(|e| e.id == *blob);
        if !indexed {
            failed.push((rel.clone(), at_work.to_string()));
            continue;
        }
        // Regular files only, with their mode: a link or a submodule written back as
        // a plain file would change its kind for a person's `git commit -a`.
        let mode = head.as_ref().and_then(|t| t.get_path(path).ok()).map(|e| e.filemode());
        if !matches!(mode, Some(0o100644 | 0o100755)) {
            let why = format!("HEAD holds no regular file there (`git checkout -- {rel}` puts it back)");
            failed.push((rel.clone(), why));
            continue;
        }
        let bits = if mode == Some(0o100755) { 0o755 } else { 0o644 };
        let done = repo
            .find_blob(*blob)
            .map_err(|e| e.message().to_string())
            .and_then(|b| {
                crate::beneath::replace_file(&dir, path, b.content(), bits, fsync).map_err(|e| e.to_string())
            });
        if let Err(e) = done {
            failed.push((rel.clone(), e));
        }
    }
    failed
}

/// The rejected outputs that HEAD does not hold are removed from the work tree
/// (named on the card) when the tools made them this fire, as the tool workers'
/// write-backs named them ([`crate::loop_state::LoopState::made_by_tools`]: left,
/// they would pile up over fires), or when they would harm if left: a file git reads
/// ([`super::outputs::GIT_READS`]) would work on the person's git; a file holding a
/// secret would be committed by the next `git add -A`; a link on the way to where
/// this task's reports go would divert every later fire's report. Nothing else is
/// removed (a fire without a write-back knows what the model made only by when it
/// changed, and a person's file, or another fire's, made meanwhile must not go).
/// The runtime unlinks that one name, through no link.
fn remove_rejected(
    root: &std::path::Path,
    rejected: &mut [(String, String)],
    in_head: &dyn Fn(&str) -> Option<git2::Oid>,
    removable: &dyn Fn(&str) -> bool,
) {
    let Ok(dir) = crate::beneath::open_root(root) else {
        return;
    };
    for (rel, why) in rejected.iter_mut() {
        if !removable(rel) || in_head(rel).is_some() {
            continue;
        }
        match crate::beneath::remove_file(&dir, std::path::Path::new(rel.as_str())) {
            Ok(()) => why.push_str("; removed from the work tree"),
            // Gone already, or with its directory (the put-back removed a directory
            // the tools made where a committed report was).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR) => {}
            Err(e) => why.push_str(&format!("; not removed from the work tree ({e})")),
        }
    }
}

/// Whether `rel` lies on the way to the report `report`
/// (`reports/<task>/<day>/<run>.md`): the task's directory or its day's (removed only
/// when it is no directory: a link, or a file that blocks the way).
fn on_the_way(report: &std::path::Path, rel: &str) -> bool {
    let rel = std::path::Path::new(rel);
    report.starts_with(rel) && rel != report && rel.components().count() >= 2
}

/// Creates the report at its name, `reports/<task>/<day>/<run-id>.md`. When something
/// is already there, or a directory on the way is a link or not a directory (the
/// model planted it: only a tool process writes under `reports/` during a fire), the
/// runtime neither writes through it nor commits it as its report: the report goes to
/// `runs/<task>/<day>/<run-id>.report.md` (the write ACL never reaches `runs/`), and
/// the name is returned as rejected so the fire's `output_rejected` card names it.
fn place_report(
    root: &std::path::Path,
    rel: &std::path::Path,
    run_id: &str,
    task: &str,
    at: chrono::DateTime<Utc>,
    text: &str,
    fsync: bool,
) -> Result<(std::path::PathBuf, Option<(String, String)>), WriteError> {
    let why = match records::create_new_synced(root, rel, text.as_bytes(), fsync) {
        Ok(()) => return Ok((rel.to_path_buf(), None)),
        Err(WriteError::Exists { .. }) => "something was already at the report's name".to_string(),
        Err(WriteError::Io { source, .. }) if is_planted(&source) => {
            format!("a link or a non-directory on the way to the report's name ({source})")
        }
        Err(e) => return Err(e),
    };
    let fallback = std::path::PathBuf::from(format!("runs/{task}/{}/{run_id}.report.md", records::day(at)));
    records::create_new_synced(root, &fallback, text.as_bytes(), fsync)?;
    tracing::warn!(report = %fallback.display(), "the report's name was taken; the report went to runs/");
    let name = rel.to_string_lossy().into_owned();
    Ok((
        fallback.clone(),
        Some((name, format!("{why}; the runtime's report is {}", fallback.display()))),
    ))
}

/// The errors a planted link or file on a record's path gives under `openat2`.
fn is_planted(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ELOOP | libc::EXDEV | libc::ENOTDIR | libc::EEXIST)
    )
}

/// How many rejected files an `output_rejected` card names one by one.
const REJECTED_LISTED: usize = 50;

/// One `output_rejected` card for the files left out of the commit, if any: their
/// count, the first [`REJECTED_LISTED`] with the reason, and how many more (a model
/// can leave thousands; the card stays small: see [`records::cap_card`]).
/// A name that holds a secret in a form only a path shows (split across directories,
/// partly escaped) is shown with its name hidden ([`Redactor::redact_path`]; the card
/// is committed: helper-106).
fn rejected_card(rejected: &[(String, String)], redactor: &Redactor) -> Option<CardDraft> {
    if rejected.is_empty() {
        return None;
    }
    let mut detail: Vec<String> = rejected
        .iter()
        .take(REJECTED_LISTED)
        .map(|(p, why)| format!("{}: {why}", redactor.redact_path(p)))
        .collect();
    if rejected.len() > REJECTED_LISTED {
        detail.push(format!(
            "... and {} more file(s) not listed",
            rejected.len() - REJECTED_LISTED
        ));
    }
    Some(CardDraft {
        kind: CardKind::OutputRejected,
        summary: format!(
            "{} file(s) the model left under reports/ were not committed",
            rejected.len()
        ),
        detail: detail.join("\n"),
        evidence: rejected.iter().map(|(p, _)| redactor.redact_path(p)).collect(),
    })
}

/// Stores the run's row and trace in the state database. A failure here loses the
/// local trace only (the receipt is in git), so it is logged, not fatal.
#[tracing::instrument(level = "debug", skip_all)]
fn save_run(
    db: Option<&mut StateDb>,
    state: &LoopState,
    receipt: &Receipt,
    receipt_rel: &std::path::Path,
    report_rel: &std::path::Path,
) {
    let t = std::time::Instant::now();
    let Some(db) = db else {
        tracing::warn!("the state database is not open: the trace is not stored");
        return;
    };
    let saved = db.save_run(
        &state.trace,
        receipt,
        &receipt_rel.to_string_lossy(),
        &report_rel.to_string_lossy(),
    );
    if let Err(e) = saved {
        tracing::warn!(error = %e, "could not store the trace");
    }
    tracing::debug!(store_ms = t.elapsed().as_secs_f64() * 1e3, "trace stored");
}

/// How long a fire waits for another fire's commit. A commit takes milliseconds; a
/// lock held far longer is held by something else (a tool process that outlived its
/// call can open the lock file read-only and flock it), and the fire must end rather
/// than hang: its records stay in the work tree for the next fire's commit, with a
/// `commit_blocked` card, and it exits 1.
const COMMIT_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Takes the commit lock, waiting at most `wait`.
fn commit_lock(lock_path: &std::path::Path, wait: std::time::Duration) -> Result<state::LockFile, WriteFailure> {
    let fail = |why: String| WriteFailure {
        end: FireEnd::Environment,
        message: format!("cannot take the commit lock {}: {why}", lock_path.display()),
    };
    let start = std::time::Instant::now();
    loop {
        match state::take_lock(lock_path, LockWait::NoWait) {
            Ok(Some(guard)) => return Ok(guard),
            Ok(None) if start.elapsed() < wait => std::thread::sleep(std::time::Duration::from_millis(20)),
            Ok(None) => {
                return Err(fail(format!(
                    "held for more than {}s (another process holds it: look for one that outlived a fire)",
                    wait.as_secs()
                )))
            }
            Err(e) => return Err(fail(e.to_string())),
        }
    }
}

/// Commits the fire's records with the fire's own repository handle, under the
/// runtime identity, only ever adding files under the runtime-owned directories.
fn commit_records(
    ctx: &FireContext,
    sink: &RecordSink,
    files: &[String],
    held: &[(String, Vec<u8>)],
    status: RunStatus,
) -> Result<String, WriteFailure> {
    let t = std::time::Instant::now();
    let root = &ctx.opts.root;
    let lock_path = state::commit_lock_path(root);
    let _guard = commit_lock(&lock_path, COMMIT_LOCK_WAIT)?;
    let own = Ownership::new(root);
    let (task, run_id) = (&ctx.opts.task, &ctx.run_id);
    let msg = format!(
        "runtime: {task} {} ({run_id})\n\nRun-Id: {run_id}\nTask: {task}\nStatus: {}\n",
        status.as_str(),
        status.as_str()
    );
    let runtime_owned =
        |p: &str| own.classify(p) == Owner::Runtime && RUNTIME_DIRS.iter().any(|d| p.starts_with(&format!("{d}/")));
    // With `runtime_identity.signing_key`, the commit is signed (its key checked when
    // the fire began; one that cannot be read now leaves the commit unsigned, which
    // `builder audit` flags).
    let key = crate::review::runtime_commits::RuntimeKey::for_commits(sink.identity.signing_key.as_deref(), root);
    let sign = |text: &str| key.as_ref().map_or(Err("no key".to_string()), |k| k.sign(text));
    let opts = crate::git::CommitOptions {
        held,
        sign: key
            .is_some()
            .then_some(&sign as &dyn Fn(&str) -> Result<String, String>),
        durable_intent: sink.durability.fsyncs(),
        ..crate::git::CommitOptions::new(root)
    };
    let oid = crate::git::commit_new_files_with(
        sink.repo,
        files,
        runtime_owned,
        &sink.identity.name,
        &sink.identity.email,
        &msg,
        &opts,
    )
    .map_err(|e| WriteFailure {
        end: FireEnd::Environment,
        message: match &e {
            crate::git::GitError::Blocked(b) => format!("not committed: {b}"),
            // libgit2 does not say which lock: name it, and what to do.
            crate::git::GitError::Git(g) if g.code() == git2::ErrorCode::Locked => format!(
                "commit failed: {e}: {} is held by another git process (or was left by a crashed one; remove it if none runs)",
                sink.repo.path().join("index.lock").display()
            ),
            _ => format!("commit failed: {e}"),
        },
    })?;
    match crate::git::auto_gc(sink.repo) {
        AutoGc::NotNeeded => {}
        AutoGc::Ran => tracing::info!("packed loose objects (git gc --auto)"),
        AutoGc::Failed(e) => tracing::warn!(error = %e, "loose objects were not packed"),
    }
    tracing::debug!(commit_ms = t.elapsed().as_secs_f64() * 1e3, "records committed");
    Ok(oid.to_string())
}

fn render_report(task: &str, run_id: &str, rec: &RunRecords, cost: f64) -> String {
    let state = &rec.state;
    let mut r = format!(
        "<!-- runtime report -->\n| task | run | status | stop reason | steps | tokens | cost |\n|---|---|---|---|---|---|---|\n| {task} | {run_id} | {} | {} | {} | {} | ${cost:.4} |\n\n",
        rec.status.as_str(),
        rec.stop.as_str(),
        state.step,
        state.tokens.total()
    );
    if !rec.acceptance.is_empty() {
        r.push_str("Acceptance: ");
        r.push_str(
            &rec.acceptance
                .iter()
                .map(|a| format!("{} {}", if a.passed { "✓" } else { "✗" }, a.check))
                .collect::<Vec<_>>()
                .join(", "),
        );
        r.push_str("\n\n");
    }
    match &state.final_answer {
        Some(a) => r.push_str(a.trim_end()),
        None => {
            r.push_str(&format!(
                "_No final answer: the fire stopped with `{}`._",
                rec.stop.as_str()
            ));
            if let Some(c) = &state.last_content {
                r.push_str("\n\nLast message from the model:\n\n");
                r.push_str(c.trim_end());
            }
        }
    }
    r.push('\n');
    r
}

/// Opens the state database for the records; `None` (logged) when it cannot be.
/// The state database for the records: through the run journal's connection where the
/// run has one ([`StateDb::reopen`]), so a fire holds one state handle.
fn open_state_db(root: &std::path::Path, journal: Option<crate::journal::Journal>) -> Option<StateDb> {
    let opened = match journal {
        Some(journal) => StateDb::reopen(journal.into_store(), root),
        None => StateDb::open(root),
    };
    match opened {
        Ok(db) => Some(db),
        Err(e) => {
            tracing::warn!(error = %e, "cannot open the state database");
            None
        }
    }
}

impl FireRun {
    /// Step 6: report, cards, receipt, trace, commit; then the checkpoint of a paused
    /// run (or its removal once resumed) and the scratch directory.
    #[tracing::instrument(level = "debug", skip_all)]
    pub fn finish(mut self) -> FireSummary {
        let status = self.closing_cards();
        let abort = self.abort.take();
        if let Some(a) = &abort {
            self.stop = StopReason::NotStarted;
            self.state.cards.push(a.card.clone());
        }
        let mut records = self.take_records(status);
        // The tools are done with their scratch (the loop and the checks are over):
        // gone before the records are written, so space a tool filled there (on the
        // file system of `.runtime/`) is back for the records and the state.
        let _ = std::fs::remove_dir_all(&self.config.scratch);
        let sink = RecordSink {
            redactor: self.config.redactor.clone(),
            identity: self.config.identity.clone(),
            telemetry: self.config.telemetry.clone(),
            repo: &self.repo,
            limits: self.config.limits,
            durability: self.config.settings.durability,
            write_roots: crate::sandbox::acl_dirs(&self.config.settings.permissions.write),
        };
        // One state handle per fire: the journal's, where the run has one.
        let mut db = open_state_db(&self.ctx.opts.root, self.journal.take());
        // A paused run's checkpoint is saved before its records are committed: a crash
        // in between leaves a run `runtime resume` can still continue, never a committed
        // `waiting_approval` receipt with nothing to resume.
        if status == RunStatus::WaitingApproval {
            self.save_checkpoint(db.as_mut(), &records.state);
        }
        let (task, run_id) = (&self.ctx.opts.task, &self.ctx.run_id);
        let decide = |rec: &RunRecords| Ending::of_run(task, run_id, rec, abort.as_ref());
        let mut summary = super::finish::write(&self.ctx, &sink, &mut records, db.as_mut(), decide);
        tracing::debug!(
            elapsed_ms = self.ctx.started.elapsed().as_millis() as u64,
            "records written and committed"
        );
        self.push_records(&sink, &mut summary);
        self.after_records(db.as_mut(), status);
        if let (Some(sync), Some(_)) = (&self.sync, &summary.commit) {
            sync.remember(db.as_mut(), &self.ctx.run_id, self.ctx.started_at);
        }
        summary
    }

    /// The cards the end of the run adds (failed checks, an empty report, a
    /// cancellation, metadata changed meanwhile) and the run's status. A signal up to
    /// here (the loop, acceptance, the start of the write) ends the run as cancelled;
    /// one during the write lets the write finish as it began.
    fn closing_cards(&mut self) -> RunStatus {
        if crate::cancel::requested() && self.abort.is_none() {
            self.stop = StopReason::Cancelled;
        }
        let acceptance_card = failed_checks_card(&self.acceptance);
        let failed_checks = acceptance_card.is_some();
        self.state.cards.extend(acceptance_card);
        if self.stop == StopReason::FinalAnswer
            && self.state.final_answer.as_deref().is_none_or(|a| a.trim().is_empty())
        {
            self.state.cards.push(CardDraft {
                kind: CardKind::EmptyReport,
                summary: "the model's final answer was empty: the report says nothing".into(),
                detail: "final answer with no text".into(),
                evidence: vec![format!("step {}", self.state.step)],
            });
        }
        let status = match &self.abort {
            Some(_) => RunStatus::Failed,
            None => status_of(self.stop, failed_checks, self.acceptance.is_empty()),
        };
        if self.stop == StopReason::Cancelled {
            self.state.cards.push(CardDraft {
                kind: CardKind::Crashed,
                summary: "the fire was cancelled by a signal".into(),
                detail: "SIGINT, SIGTERM or SIGHUP".into(),
                evidence: vec![format!("step {}", self.state.step)],
            });
        }
        self.state.cards.extend(self.metadata_changed_during_the_fire());
        status
    }

    /// The run's records, taken out of the fire.
    fn take_records(&mut self, status: RunStatus) -> RunRecords {
        RunRecords {
            status,
            stop: self.stop,
            inputs: std::mem::take(&mut self.inputs),
            sandbox: std::mem::take(&mut self.sandbox),
            state: std::mem::take(&mut self.state),
            acceptance: std::mem::take(&mut self.acceptance),
        }
    }

    /// The metadata of builder-owned paths and hooks as the fire ends, against what it
    /// was judged on: a change made meanwhile (by a tool where the sandbox is weaker
    /// than namespaces, or by another process) gets a card here, and the manifest
    /// keeps the state before it, so the next fire refuses until it is put back or
    /// accepted.
    fn metadata_changed_during_the_fire(&self) -> Option<CardDraft> {
        let (start, ownership) = self.metadata.as_ref()?;
        let changes = match crate::manifest::scan(&self.repo, &self.ctx.opts.root, ownership, Some(start)) {
            Ok(now) => now.changes_since(start),
            Err(e) => {
                tracing::warn!(error = %e, "the metadata was not compared at the end of the fire");
                return None;
            }
        };
        if changes.is_empty() {
            return None;
        }
        let listed: Vec<String> = changes.iter().map(ToString::to_string).collect();
        Some(CardDraft {
            kind: CardKind::UnreviewedChanges,
            summary: format!(
                "{} builder-owned path(s) or hook(s) changed mode, owner or content during the fire",
                changes.len()
            ),
            detail: format!(
                "metadata changed while the fire ran: {}; the next fire refuses until it is put back or accepted (`builder audit --accept-metadata`)",
                listed.join(", ")
            ),
            evidence: listed,
        })
    }

    /// With `sync`: pushes the branch after the commit ([`crate::fire::sync::FireSync`]).
    /// A box that cannot fire what the remote holds ends as needing attention. A
    /// failed push is a `sync_failed` card, committed locally (the next fire pushes
    /// it with the rest), and exit 1.
    fn push_records(&self, sink: &RecordSink, summary: &mut FireSummary) {
        let Some(sync) = &self.sync else {
            return;
        };
        if summary.commit.is_none() {
            summary.worsen_with(sync.attention(None));
            return;
        }
        match sync.push(&self.repo, &self.config.identity.email) {
            Ok(pushed) => {
                tracing::info!(?pushed, "records pushed");
                summary.worsen_with(sync.attention(Some(&pushed)));
            }
            Err(e) => {
                let draft = CardDraft {
                    kind: CardKind::SyncFailed,
                    summary: format!("sync {} failed", e.step),
                    detail: match &e.hint {
                        Some(h) => format!("{e}\nNext: {h}"),
                        None => e.to_string(),
                    },
                    evidence: vec![],
                };
                let recorded = write_card(&self.ctx, sink, &draft, Utc::now())
                    .map_err(|e| WriteError::from(e).to_string())
                    .and_then(|(id, rel, bytes)| {
                        commit_records(
                            &self.ctx,
                            sink,
                            std::slice::from_ref(&rel),
                            &[(rel.clone(), bytes)],
                            RunStatus::Failed,
                        )
                        .map(|_| id)
                        .map_err(|f| f.message)
                    });
                match recorded {
                    Ok(id) => summary.cards.push(id),
                    Err(why) => tracing::warn!(%why, "the sync_failed card was not recorded"),
                }
                summary.worsen_with(Some(After::Failed {
                    end: FireEnd::Environment,
                    message: e.to_string(),
                    hint: e.hint.clone(),
                }));
            }
        }
    }

    /// The checkpoint lets `runtime resume` continue a paused run.
    fn save_checkpoint(&self, db: Option<&mut StateDb>, state: &LoopState) {
        let run = self.ctx.approval_run();
        let checkpoint = Checkpoint {
            task: self.ctx.opts.task.clone(),
            state: state.clone(),
        };
        let saved = db
            .ok_or_else(|| "the state database is not open".to_string())
            .and_then(|db| db.save_checkpoint(run, &checkpoint).map_err(|e| e.to_string()));
        if let Err(e) = saved {
            tracing::warn!(error = %e, run, "the paused run's checkpoint was not saved");
        }
    }

    /// Once the records are written: a resumed run that no longer waits drops its
    /// checkpoint, and a run that reached its loop ends the task's streak of refusals.
    fn after_records(&self, db: Option<&mut StateDb>, status: RunStatus) {
        let run = self.ctx.approval_run();
        let kept = db
            .ok_or_else(|| "the state database is not open".to_string())
            .and_then(|db| {
                db.clear_refusal(&self.ctx.opts.task).map_err(|e| e.to_string())?;
                if status != RunStatus::WaitingApproval && self.ctx.opts.resume.is_some() {
                    db.delete_checkpoint(run).map_err(|e| e.to_string())
                } else {
                    Ok(())
                }
            });
        if let Err(e) = kept {
            tracing::warn!(error = %e, run, "the run's checkpoint was not updated");
        }
    }
}

/// The run's status from its stop reason and acceptance checks.
fn status_of(stop: StopReason, failed_checks: bool, no_checks: bool) -> RunStatus {
    match stop {
        StopReason::FinalAnswer if failed_checks => RunStatus::Failed,
        StopReason::FinalAnswer if no_checks => RunStatus::Completed,
        StopReason::FinalAnswer => RunStatus::Accepted,
        StopReason::WaitingApproval => RunStatus::WaitingApproval,
        StopReason::Cancelled => RunStatus::Cancelled,
        StopReason::MaxSteps
        | StopReason::MaxWallTime
        | StopReason::TokenBudget
        | StopReason::CostBudget
        | StopReason::RepeatedCall
        | StopReason::RepeatedError
        | StopReason::PermissionDenied
        | StopReason::ProviderError
        | StopReason::ContextOverflow
        | StopReason::CheckpointFailed
        | StopReason::NotStarted => RunStatus::Failed,
    }
}

/// One `acceptance_failed` card naming every failed check, if any failed.
fn failed_checks_card(acceptance: &[AcceptanceRecord]) -> Option<CardDraft> {
    let failed: Vec<&AcceptanceRecord> = acceptance.iter().filter(|a| !a.passed).collect();
    if failed.is_empty() {
        return None;
    }
    Some(CardDraft {
        kind: CardKind::AcceptanceFailed,
        summary: format!("{} acceptance check(s) failed", failed.len()),
        detail: failed
            .iter()
            .map(|a| format!("{}: {}", a.check, a.detail))
            .collect::<Vec<_>>()
            .join("\n"),
        evidence: vec![],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_lock_held_elsewhere_ends_the_wait() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("commit.lock");
        let held = state::take_lock(&path, LockWait::NoWait).unwrap().unwrap();
        let t = std::time::Instant::now();
        let err = commit_lock(&path, std::time::Duration::from_millis(200)).err().unwrap();
        assert!(t.elapsed() >= std::time::Duration::from_millis(200));
        assert_eq!(err.end, FireEnd::Environment);
        assert!(err.message.contains("held for more than"), "{}", err.message);
        drop(held);
        assert!(commit_lock(&path, std::time::Duration::from_millis(200)).is_ok());
    }

    #[test]
    fn a_taken_report_name_sends_the_report_to_runs() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let at = Utc::now();
        let day = records::day(at);
        let rel = records::report_path("t", "r1", at);
        // Free: the report is where it always is.
        let (placed, taken) = place_report(root, &rel, "r1", "t", at, "report", false).unwrap();
        assert_eq!((placed.as_path(), taken), (rel.as_path(), None));
        // Something at the name: neither overwritten nor reused.
        let rel2 = records::report_path("t", "r2", at);
        std::fs::write(root.join(&rel2), "forged").unwrap();
        let (placed, taken) = place_report(root, &rel2, "r2", "t", at, "report", false).unwrap();
        assert_eq!(placed, std::path::PathBuf::from(format!("runs/t/{day}/r2.report.md")));
        assert_eq!(std::fs::read_to_string(root.join(&rel2)).unwrap(), "forged");
        assert_eq!(std::fs::read_to_string(root.join(&placed)).unwrap(), "report");
        assert_eq!(taken.unwrap().0, rel2.to_string_lossy());
        // A link on the way: not followed.
        std::fs::create_dir_all(root.join("prompts")).unwrap();
        std::fs::create_dir_all(root.join("reports/u")).unwrap();
        std::os::unix::fs::symlink("../../prompts", root.join(format!("reports/u/{day}"))).unwrap();
        let rel3 = records::report_path("u", "r3", at);
        let (placed, taken) = place_report(root, &rel3, "r3", "u", at, "report", false).unwrap();
        assert!(placed.starts_with("runs/u"), "{placed:?}");
        assert!(taken.is_some());
        assert_eq!(std::fs::read_dir(root.join("prompts")).unwrap().count(), 0);
    }
}
