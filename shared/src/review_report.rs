//! `builder review <name>` (docs/design.md): what a
//! reviewer needs to approve a proposal, gathered in one value: the diff of
//! builder-owned paths against the base, `builder check` on the proposal's tree, the
//! capability delta over the recorded history ([`crate::review::delta`]), the eval table for
//! base and head ([`crate::eval`]), and for each card the proposal says it fixes, the
//! evidence that it would not recur. Rendered as text, JSON or a pull-request comment.
//! A module of its own above both `review` and `eval` (an eval fires, and the fire
//! reads approvals from `review`).

use crate::diag::Diagnostic;
use crate::eval::{EvalOptions, EvalReport, Firing, Revision, TempWorktree, Trusted, TrustedSource};
use crate::review::delta::{self, DeltaGroup, Side};
use crate::review::owned::OwnedPaths;
use crate::review::proposals::UnderReview;
use crate::review::ReviewError;
use git2::{Oid, Repository};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One changed builder-owned path.
#[derive(Debug, Clone, Serialize)]
pub struct Changed {
    pub path: String,
    /// `added`, `deleted` or `modified`.
    pub status: &'static str,
}

/// What the base holds that no approval covers: an approval names the proposal's whole
/// builder tree, so approving the proposal covers these changes too (the way a team
/// covers a push past review after the fact, docs/team.md), and the review shows them.
#[derive(Debug, Clone, Serialize)]
pub struct UnreviewedBase {
    /// The base's nearest reviewed ancestor ([`crate::review::base::reviewed_ancestor`]).
    pub reviewed: String,
    /// The commits from the base down to it that owe review, newest first (at most
    /// 50).
    pub commits: Vec<BaseCommit>,
    /// How many more such commits there are.
    pub more_commits: usize,
    /// The builder-owned paths they change.
    pub changes: Vec<Changed>,
    /// The unified diff of those paths.
    #[serde(skip)]
    pub patch: String,
}

/// One commit of [`UnreviewedBase`].
#[derive(Debug, Clone, Serialize)]
pub struct BaseCommit {
    pub id: String,
    pub author: String,
    pub summary: String,
}

/// The evidence for one card the proposal fixes.
#[derive(Debug, Clone, Serialize)]
pub struct FixEvidence {
    pub card: String,
    pub kind: Option<String>,
    pub run_id: Option<String>,
    /// What was done to show the card would not recur, in words.
    pub method: String,
    /// The card's run's recorded calls whose decision the proposal changes.
    pub calls_changed: Vec<DeltaGroup>,
    /// The card's run re-run on the proposal with its recorded model responses.
    pub rerun: Option<crate::eval::run::Refired>,
    /// Eval cases that name the card (`fixes:`), with their result on the head.
    pub cases: Vec<CaseEvidence>,
    /// The evidence holds: the changed calls or the cases show the fix.
    pub shown: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct CaseEvidence {
    pub case: String,
    pub passes_on_head: bool,
}

/// Everything `builder review` shows.
#[derive(Debug, Clone, Serialize)]
pub struct ReviewReport {
    pub proposal: String,
    pub base: String,
    pub head: String,
    /// Changed builder-owned paths.
    pub diff: Vec<String>,
    /// The same paths with how each changed.
    pub changes: Vec<Changed>,
    /// The unified diff of those paths.
    #[serde(skip)]
    pub patch: String,
    /// Paths the proposal changes outside the builder-owned ones: no approval covers
    /// them, and `builder land` refuses the proposal while it holds any.
    pub unowned: Vec<String>,
    /// Builder-owned changes the base holds that no approval covers (pushed past
    /// review), which an approval of the proposal covers too; `None` when the base owes
    /// no review.
    pub unreviewed_base: Option<UnreviewedBase>,
    /// `builder check` on the proposal's tree.
    pub check: Vec<Diagnostic>,
    /// How many recorded calls were decided again, and from where.
    pub history: HistoryScope,
    pub capability_delta: Vec<DeltaGroup>,
    /// Where the trusted configuration evals run under came from, in words.
    pub trusted: String,
    /// Every power (sandbox, network, read directories, provider and key variable,
    /// telemetry, sync, prefetch ports) the proposal sets differently from the trusted
    /// configuration, with before and after.
    pub powers: Vec<crate::powers::PowerChange>,
    /// Why the proposal's evals were refused (it widens a power), if they were.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
    pub evals: EvalReport,
    pub fixes: Vec<FixEvidence>,
    /// Checks and evals pass.
    pub ok: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct HistoryScope {
    pub database: String,
    pub calls: usize,
    pub since: Option<String>,
}

/// What the review is asked for.
pub struct ReviewOptions {
    pub root: PathBuf,
    pub name: String,
    /// The runtime's state database the calls come from.
    pub history: PathBuf,
    /// Only runs started at or after this time (RFC 3339).
    pub since: Option<String>,
    /// The `runtime` binary that fires the eval cases.
    pub runtime: PathBuf,
    /// Whose powers the eval fires (and the re-runs of fixed cards' runs) run under.
    pub trusted: TrustedSource,
    /// The most live model fires the eval may make per revision
    /// ([`crate::eval::EvalOptions::max_live_fires`]).
    pub max_live_fires: u32,
}

/// Why a review could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error(transparent)]
    Review(#[from] ReviewError),
    #[error(transparent)]
    Delta(#[from] delta::DeltaError),
    #[error(transparent)]
    Eval(#[from] crate::eval::EvalError),
    #[error("git: {0}")]
    Git(#[from] git2::Error),
}

/// Gathers the review of proposal `opts.name` in `repo`.
pub fn review(repo: &Repository, opts: &ReviewOptions) -> Result<ReviewReport, ReportError> {
    let p: UnderReview = crate::review::proposals::under_review(repo, &opts.name)?;
    let (changes, patch) = builder_diff(repo, p.base, p.head)?;
    let unowned = crate::review::unowned_changes(repo, p.base, p.head)?;
    let unreviewed_base = unreviewed_base(repo, p.base)?;
    let diff = changes.iter().map(|c| c.path.clone()).collect();
    let head_wt = TempWorktree::add(repo, &opts.root, &p.head.to_string())?;
    let check = crate::check::check_repo(&head_wt.path).problems;
    let before = delta::settings_of_commit(repo, p.base, "the base")?;
    let after = delta::settings_of_commit(repo, p.head, &format!("proposals/{}", opts.name))?;
    let side = |s: &crate::settings::RuntimeSettings, rev: &str| {
        Side::new(&opts.root, s).map_err(|source| delta::DeltaError::Policy {
            rev: rev.to_string(),
            source,
        })
    };
    let (before, after) = (side(&before, "the base")?, side(&after, "the proposal")?);
    let calls = delta::recorded_calls(&opts.history, opts.since.as_deref()).map_err(delta::DeltaError::from)?;
    let capability_delta = delta::capability_delta(&calls, &before, &after);
    let eval_opts = EvalOptions {
        root: opts.root.clone(),
        base: Some(Revision {
            rev: "base".into(),
            commit: p.base.to_string(),
        }),
        head: Revision {
            rev: format!("proposals/{}", opts.name),
            commit: p.head.to_string(),
        },
        task: None,
        runtime: opts.runtime.clone(),
        trusted: opts.trusted.clone(),
        max_live_fires: opts.max_live_fires,
    };
    let trusted = Trusted::resolve(repo, &opts.trusted, eval_opts.base.as_ref())?;
    let evals = crate::eval::evaluate_trusted(&eval_opts, repo, &trusted)?;
    let head_powers = evals.powers.iter().find(|p| p.revision == "head");
    let powers = head_powers.map(|p| p.changes.clone()).unwrap_or_default();
    let refused = head_powers.and_then(|p| p.refused.clone());
    let ctx = FixContext {
        opts,
        head: Firing::new(&opts.runtime, &head_wt, &trusted),
        refused: refused.as_deref(),
        calls: &calls,
        sides: (&before, &after),
        evals: &evals,
    };
    let fixes = p.fixes.iter().map(|card| fix_evidence(&ctx, card)).collect();
    drop(head_wt);
    let ok = check.is_empty() && evals.summary.ok && unowned.is_empty() && unreviewed_base.is_none();
    Ok(ReviewReport {
        proposal: opts.name.clone(),
        base: p.base.to_string(),
        head: p.head.to_string(),
        diff,
        changes,
        patch,
        unowned,
        unreviewed_base,
        check,
        history: HistoryScope {
            database: opts.history.to_string_lossy().into_owned(),
            calls: calls.len(),
            since: opts.since.clone(),
        },
        capability_delta,
        trusted: trusted.from.clone(),
        powers,
        refused,
        evals,
        fixes,
        ok,
    })
}

/// The builder-owned paths that differ between the base and the proposal, and their
/// unified diff. A path is builder-owned here when either side's committed
/// `builder_paths` says so, never by the reviewer's work tree: a proposal that makes
/// `lib/**` builder-owned and changes `lib/x.sh` has that change approved with its
/// tree, so it is shown here (the head's paths), and what it stops owning is shown too
/// (the base's), besides being listed as unowned.
fn builder_diff(repo: &Repository, from: Oid, to: Oid) -> Result<(Vec<Changed>, String), git2::Error> {
    let base = repo.find_commit(from)?.tree()?;
    let head = repo.find_commit(to)?.tree()?;
    let base_owned = OwnedPaths::of_tree(repo, &base)?;
    let head_owned = OwnedPaths::of_tree(repo, &head)?;
    // A file over the size bound is diffed as binary ("Binary files differ"), and
    // the text kept stops at its own bound: a proposal's 256 MiB text file is not
    // held in memory or printed whole.
    let mut opts = git2::DiffOptions::new();
    opts.max_size(DIFF_FILE_BYTES);
    let diff = repo.diff_tree_to_tree(Some(&base), Some(&head), Some(&mut opts))?;
    let owned = |d: &git2::DiffDelta| {
        d.new_file()
            .path()
            .or(d.old_file().path())
            .map(|p| p.to_string_lossy().into_owned())
            .filter(|p| head_owned.is_builder(p) || base_owned.is_builder(p))
    };
    let mut changed = Vec::new();
    for d in diff.deltas() {
        if let Some(path) = owned(&d) {
            let status = match d.status() {
                git2::Delta::Added => "added",
                git2::Delta::Deleted => "deleted",
                _ => "modified",
            };
            changed.push(Changed { path, status });
        }
    }
    let mut patch = String::new();
    let mut left_out = 0usize;
    diff.print(git2::DiffFormat::Patch, |d, _hunk, line| {
        if owned(&d).is_some() {
            if patch.len() >= DIFF_TEXT_BYTES {
                left_out += line.content().len();
                return true;
            }
            if matches!(line.origin(), '+' | '-' | ' ') {
                patch.push(line.origin());
            }
            patch.push_str(&String::from_utf8_lossy(line.content()));
        }
        true
    })?;
    if left_out > 0 {
        patch.push_str(&format!(
            "\n[{left_out} more bytes of diff not shown: `git diff {from} {to}` has it all]\n"
        ));
    }
    Ok((changed, patch))
}

/// What `base` holds that no approval covers ([`UnreviewedBase`]), if anything: the
/// commits that owe review on the way down to its nearest reviewed ancestor
/// ([`crate::review::base::reviewed_ancestor_path`]), at most [`BASE_COMMITS_SHOWN`]
/// of them listed. `None` as well when nothing below is reviewed at all (review was
/// never bootstrapped: every fire refuses anyway).
fn unreviewed_base(repo: &Repository, base: Oid) -> Result<Option<UnreviewedBase>, ReportError> {
    let path = match crate::review::base::reviewed_ancestor_path(repo, base) {
        Ok(path) if path.reviewed != base => path,
        Ok(_) => return Ok(None),
        Err(ReviewError::Git(e)) => return Err(e.into()),
        Err(_) => return Ok(None),
    };
    let mut commits = Vec::new();
    for id in path.owed.iter().take(BASE_COMMITS_SHOWN) {
        let c = repo.find_commit(*id)?;
        commits.push(BaseCommit {
            id: c.id().to_string(),
            author: c.author().to_string(),
            summary: c.summary().ok().flatten().unwrap_or("").to_string(),
        });
    }
    let (changes, patch) = builder_diff(repo, path.reviewed, base)?;
    Ok(Some(UnreviewedBase {
        reviewed: path.reviewed.to_string(),
        commits,
        more_commits: path.owed.len().saturating_sub(BASE_COMMITS_SHOWN),
        changes,
        patch,
    }))
}

/// The most commits of [`UnreviewedBase`] a review lists.
const BASE_COMMITS_SHOWN: usize = 50;

/// Files larger than this are diffed as binary in a review.
const DIFF_FILE_BYTES: i64 = 1 << 20;
/// The most diff text a review keeps and prints.
const DIFF_TEXT_BYTES: usize = 4 << 20;

/// What the evidence for a fixed card is gathered from.
struct FixContext<'a> {
    opts: &'a ReviewOptions,
    /// Eval fires of the proposal's head, under the trusted configuration.
    head: Firing<'a>,
    /// Why the proposal is not fired at all, if it is not.
    refused: Option<&'a str>,
    calls: &'a [delta::RecordedCall],
    sides: (&'a Side, &'a Side),
    evals: &'a EvalReport,
}

/// The model responses run `run_id` recorded (each model span's output messages, in
/// order), as a replay trace; `None` when the history has none of them.
fn recorded_responses(db: &Path, run_id: &str) -> Option<crate::provider::ReplayTrace> {
    use crate::provider::{ReplayCall, ReplayTrace, ReplayTurn, ReplayUsage};
    if !db.exists() {
        return None;
    }
    let store = crate::store::Store::open_read_only(db, crate::state::RUNTIME_SCHEMA).ok()?;
    let rows: Vec<(String, i64, i64)> = store
        .query_all(
            "SELECT attributes, tokens_in, tokens_out FROM spans WHERE run_id = ?1 AND kind = 'model' ORDER BY start_ns, span_id",
            [run_id],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .ok()?;
    let mut turns = Vec::new();
    for (attrs, tokens_in, tokens_out) in rows {
        let attrs: serde_json::Value = serde_json::from_str(&attrs).ok()?;
        let Some(out) = attrs["gen_ai.output.messages"].as_str() else {
            continue;
        };
        let messages: serde_json::Value = serde_json::from_str(out).ok()?;
        let mut turn = ReplayTurn {
            content: None,
            tool_calls: vec![],
            usage: ReplayUsage {
                input: tokens_in.max(0) as u64,
                output: tokens_out.max(0) as u64,
            },
        };
        for part in messages[0]["parts"].as_array().into_iter().flatten() {
            match part["type"].as_str() {
                Some("text") => turn.content = part["content"].as_str().map(str::to_string),
                Some("tool_call") => turn.tool_calls.push(ReplayCall {
                    id: part["id"].as_str().unwrap_or_default().to_string(),
                    name: part["name"].as_str().unwrap_or_default().to_string(),
                    arguments: part["arguments"].clone(),
                }),
                _ => {}
            }
        }
        turns.push(turn);
    }
    (!turns.is_empty()).then_some(ReplayTrace {
        version: 1,
        model: Some("recorded".into()),
        turns,
    })
}

/// The evidence that `card` would not recur under the proposal: when its cause lies
/// in settings or tools, its run re-run on the proposal's tree with the model
/// responses it recorded, and its recorded calls decided again under both settings;
/// always, the eval cases that name it.
fn fix_evidence(ctx: &FixContext, card: &str) -> FixEvidence {
    let (root, evals) = (&ctx.opts.root, ctx.evals);
    let found = crate::cards::work_tree_card_paths(root, card)
        .into_iter()
        .find_map(|p| crate::records::read_card(&root.join(p)).ok());
    let cases: Vec<CaseEvidence> = evals
        .rows
        .iter()
        .filter(|r| r.revision == "head" && r.fixes.iter().any(|f| f == card))
        .map(|r| CaseEvidence {
            case: r.case.clone(),
            passes_on_head: !r.failed,
        })
        .collect();
    let mut ev = FixEvidence {
        card: card.to_string(),
        kind: found.as_ref().map(|c| c.kind.as_str().to_string()),
        run_id: found.as_ref().map(|c| c.run_id.clone()),
        method: String::new(),
        calls_changed: vec![],
        rerun: None,
        shown: false,
        cases,
    };
    let mut said = Vec::new();
    match &found {
        None => said.push("no card file here: nothing to re-run".to_string()),
        Some(c) if settings_cause(c.kind) => {
            decide_calls_again(ctx, c, &mut ev, &mut said);
            rerun_on_proposal(ctx, c, &mut ev, &mut said);
        }
        Some(c) => said.push(format!(
            "a {} card's cause is not in settings or tools: the eval cases that name it are the evidence",
            c.kind.as_str()
        )),
    }
    if ev.cases.is_empty() {
        said.push("no eval case names the card (add `fixes: [<card-id>]` to one)".into());
    } else {
        let passing = ev.cases.iter().filter(|c| c.passes_on_head).count();
        said.push(format!(
            "{passing} of {} eval case(s) naming the card pass on the head",
            ev.cases.len()
        ));
        // Cases the proposal wrote itself never outweigh a re-run of the card's own
        // run in which the card came back.
        let recurred = ev
            .rerun
            .as_ref()
            .zip(found.as_ref())
            .is_some_and(|(r, c)| card_recurs(r, c));
        if recurred && passing == ev.cases.len() {
            said.push("the re-run, in which the card came back, outweighs them".into());
        }
        ev.shown = !recurred && (ev.shown || passing == ev.cases.len());
    }
    ev.method = said.join("; ");
    ev
}

/// Decides the card's run's recorded calls again under both sides' settings: the
/// calls whose decision the proposal changes show the fix.
fn decide_calls_again(ctx: &FixContext, c: &crate::records::Card, ev: &mut FixEvidence, said: &mut Vec<String>) {
    let run: Vec<delta::RecordedCall> = ctx.calls.iter().filter(|x| x.run_id == c.run_id).cloned().collect();
    if run.is_empty() {
        said.push(format!(
            "the card's cause lies in settings or tools, but run {} has no recorded calls in this history",
            c.run_id
        ));
    } else {
        ev.calls_changed = delta::capability_delta(&run, ctx.sides.0, ctx.sides.1);
        let n: usize = ev.calls_changed.iter().map(|g| g.count).sum();
        said.push(format!(
            "decided run {}'s {} recorded call(s) again under the proposal's settings: {n} change decision",
            c.run_id,
            run.len()
        ));
        ev.shown = n > 0;
    }
}

/// Re-runs the card's run on the proposal's tree with the model responses it
/// recorded (unless the proposal's evals are refused): a card that does not recur
/// shows the fix.
fn rerun_on_proposal(ctx: &FixContext, c: &crate::records::Card, ev: &mut FixEvidence, said: &mut Vec<String>) {
    match recorded_responses(&ctx.opts.history, &c.run_id) {
        None => said.push(format!("run {} recorded no model responses here: not re-run", c.run_id)),
        Some(_) if ctx.refused.is_some() => said.push(format!(
            "run {} was not re-run on the proposal: its evals are refused (it widens a power)",
            c.run_id
        )),
        Some(trace) => {
            let turns = trace.turns.len();
            match crate::eval::run::refire(&ctx.head, &c.task, trace) {
                Ok(r) => {
                    let recurs = card_recurs(&r, c);
                    said.push(format!(
                        "re-ran run {} on the proposal with its {turns} recorded model response(s): {}, cards [{}]: the {} card {}",
                        c.run_id,
                        r.status,
                        r.card_kinds.join(", "),
                        c.kind.as_str(),
                        if recurs { "recurs" } else { "does not recur" }
                    ));
                    ev.rerun = Some(r);
                    ev.shown = !recurs;
                }
                Err(e) => said.push(format!("re-running run {} failed: {e}", c.run_id)),
            }
        }
    }
}

/// Whether the re-run `r` of card `c`'s run wrote a card of `c`'s kind again.
fn card_recurs(r: &crate::eval::run::Refired, c: &crate::records::Card) -> bool {
    r.card_kinds.iter().any(|k| k == c.kind.as_str())
}

/// Card kinds whose cause lies in the settings or the tools.
fn settings_cause(kind: crate::records::CardKind) -> bool {
    use crate::records::CardKind as K;
    match kind {
        K::PermissionDenied | K::MissingTool | K::ApprovalNeeded | K::McpDrift | K::McpServerFailed => true,
        K::BudgetExceeded
        | K::MaxSteps
        | K::RepeatedCall
        | K::RepeatedError
        | K::ProviderError
        | K::PrefetchFailed
        | K::AcceptanceFailed
        | K::InvalidConfig
        | K::UnreviewedChanges
        | K::SandboxUnavailable
        | K::SideEffectUncertain
        | K::Crashed
        | K::EmptyReport
        | K::ContextOverflow
        | K::PrefetchTruncated
        | K::OutputRejected
        | K::StateReset
        | K::SyncFailed
        | K::ApprovalStale
        | K::CommitBlocked
        | K::CheckpointFailed => false,
    }
}

/// The review as text (`--format text`). Every field a proposer or a model chose
/// goes through [`crate::text::printable`] (the patch through its multi-line form).
pub fn text(r: &ReviewReport) -> String {
    use crate::text::printable as p;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "review of proposals/{} ({}) against base {}",
        p(&r.proposal),
        crate::text::short_id(&r.head),
        crate::text::short_id(&r.base)
    );
    let _ = writeln!(o, "\n== diff of builder-owned paths ({})", r.diff.len());
    text_changes(&mut o, &r.changes, &r.patch);
    if !r.unowned.is_empty() {
        let _ = writeln!(
            o,
            "\n== changed outside builder-owned paths ({}): no approval covers these, and `builder land` refuses the proposal while it holds them",
            r.unowned.len()
        );
        for path in &r.unowned {
            let _ = writeln!(o, "{}", p(path));
        }
    }
    text_unreviewed_base(&mut o, r);
    let _ = writeln!(o, "\n== check of the proposal: {} problem(s)", r.check.len());
    for d in &r.check {
        let _ = writeln!(o, "{}", p(&d.to_string()));
    }
    let _ = writeln!(
        o,
        "\n== capability delta: {} recorded call(s) from {} decided again; {} change",
        r.history.calls,
        p(&r.history.database),
        r.capability_delta.iter().map(|g| g.count).sum::<usize>()
    );
    for g in &r.capability_delta {
        let _ = writeln!(o, "{}", p(&delta::describe(g)));
    }
    let _ = writeln!(
        o,
        "\n== powers: {} change(s) against the trusted configuration, {}",
        r.powers.len(),
        p(&r.trusted)
    );
    for c in &r.powers {
        let _ = writeln!(o, "{}", p(&c.to_string()));
    }
    let _ = writeln!(o, "\n== evals");
    o.push_str(&crate::eval::render::text(&r.evals));
    if !r.fixes.is_empty() {
        let _ = writeln!(o, "\n== fixes");
        for f in &r.fixes {
            let _ = writeln!(
                o,
                "card {}: {} ({})",
                p(&f.card),
                if f.shown { "evidence shown" } else { "not shown" },
                p(&f.method)
            );
        }
    }
    let _ = writeln!(o, "\n{}", verdict(r));
    o
}

/// The text review's section on the base's changes no approval covers, if any.
fn text_unreviewed_base(o: &mut String, r: &ReviewReport) {
    use crate::text::printable as p;
    let Some(u) = &r.unreviewed_base else {
        return;
    };
    let _ = writeln!(
        o,
        "\n== also approved with it: the base's builder-owned changes since {} that no approval covers ({} commit(s))",
        crate::text::short_id(&u.reviewed),
        u.commits.len() + u.more_commits
    );
    for c in &u.commits {
        let _ = writeln!(
            o,
            "commit {} {}: {}",
            crate::text::short_id(&c.id),
            p(&c.author),
            p(&c.summary)
        );
    }
    if u.more_commits > 0 {
        let _ = writeln!(o, "... and {} more commit(s)", u.more_commits);
    }
    text_changes(o, &u.changes, &u.patch);
}

/// Changed builder-owned paths, a line each, then their diff (text review).
fn text_changes(o: &mut String, changes: &[Changed], patch: &str) {
    use crate::text::{printable, printable_multiline};
    for c in changes {
        let _ = writeln!(o, "{:<8} {}", c.status, printable(&c.path));
    }
    if !patch.is_empty() {
        let _ = writeln!(o, "\n{}", printable_multiline(patch.trim_end()));
    }
}

/// Changed builder-owned paths, an item each, then their diff folded away (comment).
fn github_changes(o: &mut String, changes: &[Changed], patch: &str) {
    use crate::text::{markdown_code, markdown_fence};
    for c in changes {
        let _ = writeln!(o, "- {} ({})", markdown_code(&c.path), c.status);
    }
    if !patch.is_empty() {
        let _ = writeln!(
            o,
            "\n<details><summary>diff</summary>\n\n{}</details>",
            markdown_fence(patch.trim_end(), "diff")
        );
    }
}

/// The review's last line.
pub fn verdict(r: &ReviewReport) -> &'static str {
    match (&r.refused, r.ok) {
        // Only the runtime's records, and nothing widened: the head was fired (no code
        // there), but land refuses it (helper-90: the review said the evals were
        // refused).
        _ if r.refused.is_none()
            && !r.unowned.is_empty()
            && r.unowned.iter().all(|p| crate::layout::in_runtime_dirs(p)) =>
        {
            "FAIL: the proposal changes the runtime's records (`reports/`, `runs/`, `cards/`), which `builder land` refuses; its evals ran"
        }
        // Changed paths outside the builder-owned ones refuse the head's evals too:
        // the more telling reason first.
        _ if !r.unowned.is_empty() => {
            "FAIL: the proposal changes paths outside the builder-owned ones; its head's evals were refused"
        }
        (Some(_), _) => "FAIL: the proposal widens powers; its evals were refused",
        (None, true) => "ok: checks and evals pass",
        (None, false) if r.unreviewed_base.is_some() => {
            "FAIL: the base holds builder-owned changes no approval covers; approving the proposal covers them too"
        }
        (None, false) => "FAIL: checks or evals fail",
    }
}

/// A pull-request comment body (`--format github`). Everything a proposer or a model
/// chose is in code ([`crate::text::markdown_code`], [`crate::text::markdown_fence`])
/// or escaped prose ([`crate::text::markdown_text`]): no HTML, image, link, mention or
/// heading of theirs is live in the comment.
pub fn github(r: &ReviewReport) -> String {
    use crate::text::{markdown_code as code, markdown_text as prose};
    let mut o = String::new();
    let mark = if r.ok { "✅" } else { "❌" };
    let _ = writeln!(
        o,
        "## {mark} builder review: {}\n",
        code(&format!("proposals/{}", r.proposal))
    );
    let _ = writeln!(
        o,
        "Base `{}`, head `{}`.\n",
        crate::text::short_id(&r.base),
        crate::text::short_id(&r.head)
    );
    let _ = writeln!(o, "### Changed builder-owned paths\n");
    github_changes(&mut o, &r.changes, &r.patch);
    if !r.unowned.is_empty() {
        let _ = writeln!(
            o,
            "\n### Changed outside builder-owned paths\n\nNo approval covers these, and `builder land` refuses the proposal while it holds them.\n"
        );
        for path in &r.unowned {
            let _ = writeln!(o, "- {}", code(path));
        }
    }
    if let Some(u) = &r.unreviewed_base {
        let _ = writeln!(
            o,
            "\n### Also approved with it\n\nThe base's builder-owned changes since `{}` that no approval covers: approving the proposal covers them too.\n",
            crate::text::short_id(&u.reviewed)
        );
        for c in &u.commits {
            let _ = writeln!(
                o,
                "- {} {}: {}",
                code(crate::text::short_id(&c.id)),
                code(&c.author),
                prose(&c.summary)
            );
        }
        if u.more_commits > 0 {
            let _ = writeln!(o, "- ... and {} more commit(s)", u.more_commits);
        }
        github_changes(&mut o, &u.changes, &u.patch);
    }
    let _ = writeln!(o, "\n### Check\n");
    if r.check.is_empty() {
        let _ = writeln!(o, "No problems.");
    }
    for d in &r.check {
        let _ = writeln!(
            o,
            "- {} {}: {}",
            code(&format!("{}:{}", d.file.display(), d.line)),
            code(&d.field),
            prose(&d.message)
        );
    }
    github_delta_and_powers(&mut o, r);
    github_evals_and_fixes(&mut o, r);
    o
}

/// The comment's capability delta and powers sections (and the refusal, if any).
fn github_delta_and_powers(o: &mut String, r: &ReviewReport) {
    use crate::text::{markdown_code as code, markdown_text as prose};
    let _ = writeln!(
        o,
        "\n### Capability delta\n\n{} recorded call(s) decided again under both settings.\n",
        r.history.calls
    );
    if r.capability_delta.is_empty() {
        let _ = writeln!(o, "No recorded call changes decision.");
    }
    for g in &r.capability_delta {
        let _ = writeln!(o, "- {}", delta::describe_markdown(g));
    }
    let _ = writeln!(
        o,
        "\n### Powers\n\nAgainst the trusted configuration ({}) that every eval fire runs under.\n",
        prose(&r.trusted)
    );
    if r.powers.is_empty() {
        let _ = writeln!(o, "No power changes.");
    }
    for c in &r.powers {
        let _ = writeln!(
            o,
            "- {}: {} → {} (**{}**: {})",
            code(&c.key),
            code(&c.before),
            code(&c.after),
            c.effect.as_str(),
            prose(&c.why)
        );
    }
    if let Some(why) = &r.refused {
        let _ = writeln!(o, "\n**The proposal's evals were refused.** {}", prose(why));
    }
}

/// The comment's evals section, each failure under it, and the fixes section.
fn github_evals_and_fixes(o: &mut String, r: &ReviewReport) {
    use crate::text::{markdown_code as code, markdown_text as prose};
    let _ = writeln!(o, "\n### Evals\n");
    o.push_str(&crate::eval::render::markdown(&r.evals));
    for f in &r.evals.summary.failures {
        let _ = writeln!(
            o,
            "\n- ❌ {}: {}{}: {}",
            code(&f.case),
            code(&f.assertion),
            if f.regression { " (regression)" } else { "" },
            prose(&f.detail)
        );
    }
    if !r.fixes.is_empty() {
        let _ = writeln!(o, "\n### Fixes\n");
        for f in &r.fixes {
            let _ = writeln!(
                o,
                "- card {}: {} ({})",
                code(&f.card),
                if f.shown { "shown" } else { "not shown" },
                prose(&f.method)
            );
        }
    }
}
