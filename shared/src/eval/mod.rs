//! `builder eval` (docs/design.md and "Eval output"): the golden
//! cases of `evals/<task>/*.yaml` run on a base and a head revision in one go, each
//! revision in a temporary repository of its own (see [`run`]), side by side: pass rate,
//! steps, tool calls, tokens, cost, denials, duration. A head case that breaks an
//! assertion, or passes less often than its `min_pass`, fails the eval and is named
//! with the assertion; when the base passed it, that is a regression.
//!
//! The cases are the head's (the revision under review), plus any case the head
//! deleted and the base's version of any case it edited, so neither removing nor
//! weakening a case hides a regression; each runs on both revisions.

pub mod case;
pub mod render;
pub mod run;
pub mod scratch;
pub mod trusted;

use crate::diag::Diagnostic;
use case::Case;
use serde::Serialize;
use std::path::PathBuf;

pub use run::{EvalError, Firing, TempWorktree};
pub use trusted::{RevisionPowers, Trusted, TrustedSource};

/// One revision to evaluate.
#[derive(Debug, Clone, Serialize)]
pub struct Revision {
    /// What the caller named (`HEAD~1`, `main`, `proposals/x`).
    pub rev: String,
    pub commit: String,
}

/// What `evaluate` is asked to do.
pub struct EvalOptions {
    /// The repository's work-tree root (each revision is fetched from it).
    pub root: PathBuf,
    pub base: Option<Revision>,
    pub head: Revision,
    /// Only the cases of this task.
    pub task: Option<String>,
    /// The `runtime` binary that fires the cases.
    pub runtime: PathBuf,
    /// Whose powers every eval fire runs under.
    pub trusted: TrustedSource,
    /// The most live model fires (`model: provider` cases, each `repeat` times) one
    /// revision may ask for: each spends the provider account of whoever runs the
    /// eval, and the cases are the proposal's to write. Over it, no live case fires.
    pub max_live_fires: u32,
}

/// `--max-live-fires` when not given: room for a few live cases run a few times each.
pub const DEFAULT_MAX_LIVE_FIRES: u32 = 20;

/// The "assertion" a live case fails when the cases ask for more live fires than
/// [`EvalOptions::max_live_fires`] allows.
pub const LIVE_FIRES: &str = "live_fires";

/// An assertion a fire broke, and what was seen instead.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failure {
    /// The assertion as the case wrote it (`must_call: run_command`), or `fire`.
    pub assertion: String,
    pub detail: String,
}

/// One case's fires on one revision, summed over its runs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CaseRun {
    pub runs: u32,
    pub passed: u32,
    pub steps: u64,
    pub tool_calls: u64,
    pub tokens: u64,
    pub cost_usd: f64,
    pub denials: u64,
    pub duration_ms: u64,
    /// Each broken assertion once (the first fire's detail).
    pub failures: Vec<Failure>,
    /// The sandbox the last fire's receipt records (eval fires get the full sandbox
    /// of the trusted configuration, as cron fires do).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<crate::records::SandboxRecord>,
}

impl CaseRun {
    pub fn pass_rate(&self) -> f64 {
        if self.runs == 0 {
            0.0
        } else {
            f64::from(self.passed) / f64::from(self.runs)
        }
    }
}

/// One row of the eval output: a case on a revision.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub case: String,
    pub file: String,
    pub task: String,
    /// `base` or `head`.
    pub revision: &'static str,
    pub model: &'static str,
    pub min_pass: f64,
    pub pass_rate: f64,
    #[serde(flatten)]
    pub run: CaseRun,
    /// The case failed here: a broken assertion, or a pass rate under `min_pass`.
    pub failed: bool,
    /// Cards the case guards against (its `fixes:`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fixes: Vec<String>,
}

/// A head case that fails, by assertion.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub case: String,
    pub file: String,
    pub assertion: String,
    pub detail: String,
    /// The base passed this assertion: the head made it worse.
    pub regression: bool,
}

/// Totals for one revision.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    pub cases: usize,
    pub passed: usize,
    pub pass_rate: f64,
    pub steps: u64,
    pub tool_calls: u64,
    pub tokens: u64,
    pub cost_usd: f64,
    pub denials: u64,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub base: Option<Totals>,
    pub head: Totals,
    /// Every failing head case and assertion (regressions marked).
    pub failures: Vec<Finding>,
    /// Case files that do not load (file:line: field: problem).
    pub problems: Vec<Diagnostic>,
    /// No failure and no problem.
    pub ok: bool,
}

/// The whole eval: rows (each case on base, then on head), then the summary.
#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    pub base: Option<Revision>,
    pub head: Revision,
    /// Where the trusted configuration came from, in words.
    pub trusted: String,
    /// Each revision's powers against the trusted configuration (base, then head).
    pub powers: Vec<RevisionPowers>,
    pub rows: Vec<Row>,
    pub summary: Summary,
}

fn model_name(c: &Case) -> &'static str {
    match c.model {
        case::CaseModel::Scripted(_) => "scripted",
        case::CaseModel::Replay(_) => "replay",
        case::CaseModel::Provider => "provider",
    }
}

/// Runs every case on every revision under the trusted configuration `opts.trusted`.
pub fn evaluate(opts: &EvalOptions) -> Result<EvalReport, EvalError> {
    let repo = crate::git::open_work_tree(&opts.root)
        .map_err(|e| EvalError::Worktree(e.to_string()))?
        .repo;
    let trusted = Trusted::resolve(&repo, &opts.trusted, opts.base.as_ref())?;
    evaluate_trusted(opts, &repo, &trusted)
}

/// Runs every case on every revision under `trusted`. Each revision gets one
/// temporary repository; the two revisions run side by side on two threads. A revision
/// whose powers go beyond `trusted` is not fired: its rows say why.
pub fn evaluate_trusted(
    opts: &EvalOptions,
    repo: &git2::Repository,
    trusted: &Trusted,
) -> Result<EvalReport, EvalError> {
    let head_wt = TempWorktree::add(repo, &opts.root, &opts.head.commit)?;
    let base_wt = match &opts.base {
        Some(b) => Some(TempWorktree::add(repo, &opts.root, &b.commit)?),
        None => None,
    };
    let mut problems = Vec::new();
    let cases = gather_cases(opts.task.as_deref(), &head_wt, base_wt.as_ref(), &mut problems);
    let mut tasks: Vec<String> = cases.iter().map(|c| c.task.clone()).collect();
    tasks.sort();
    tasks.dedup();
    let mut head_powers = trusted.judge(repo, "head", &opts.head, &tasks)?;
    if let Some(base) = &opts.base {
        trusted::refuse_code_outside_review(repo, base, &opts.head, &mut head_powers)?;
    }
    let base_powers = match &opts.base {
        Some(b) => Some(trusted.judge(repo, "base", b, &tasks)?),
        None => None,
    };
    let runtime = opts.runtime.as_path();
    let all = &cases;
    let too_many = too_many_live_fires(&cases, opts.max_live_fires);
    let too_many = too_many.as_deref();
    let (base_runs, head_runs) = std::thread::scope(|s| {
        let base = base_wt.as_ref().map(|wt| {
            let refused = base_powers.as_ref().and_then(|p| p.refused.clone());
            s.spawn(move || run_all(&Firing::new(runtime, wt, trusted), all, refused, too_many))
        });
        let head = run_all(
            &Firing::new(runtime, &head_wt, trusted),
            all,
            head_powers.refused.clone(),
            too_many,
        );
        let base = base.map(|h| {
            h.join()
                .unwrap_or_else(|_| Err(EvalError::Worktree("an eval thread panicked".into())))
        });
        (base.transpose(), head)
    });
    let (base_runs, head_runs) = (base_runs?, head_runs?);
    let mut r = report(opts, &cases, base_runs, head_runs, problems);
    r.trusted = trusted.from.clone();
    r.powers = base_powers.into_iter().chain([head_powers]).collect();
    Ok(r)
}

/// The cases an eval runs: the head's; every case of the base the head deleted, so
/// removing a failing case does not hide it; and the base's version of every case the
/// head edited (its file, or the trace a `replay` case names), as `<name> (base's
/// version)` ([`Case::as_the_base_has_it`]), so weakening a case (`min_pass: 0`, an
/// assertion dropped, a friendlier trace) does not hide a regression either. Problems
/// are the head's.
fn gather_cases(
    task: Option<&str>,
    head: &TempWorktree,
    base: Option<&TempWorktree>,
    problems: &mut Vec<Diagnostic>,
) -> Vec<Case> {
    let mut cases = case::load_cases(&head.path, task, problems);
    let Some(base) = base else {
        return cases;
    };
    let in_head = case::case_files(&head.path, task);
    for c in case::load_cases(&base.path, task, &mut Vec::new()) {
        if !in_head.contains(&c.file) {
            cases.push(c);
        } else if !case::same_in(&head.path, &base.path, &c) {
            cases.extend(c.as_the_base_has_it(&base.path));
        }
    }
    cases
}

/// Why no live case fires: the cases ask for more live model fires per revision
/// than `max` (`None` when they do not).
fn too_many_live_fires(cases: &[Case], max: u32) -> Option<String> {
    let live: u64 = cases
        .iter()
        .filter(|c| matches!(c.model, case::CaseModel::Provider))
        .map(|c| u64::from(c.repeat))
        .sum();
    (live > u64::from(max)).then(|| {
        format!(
            "the cases ask for {live} live model fires per revision (`model: provider` cases, counting `repeat`), more than the {max} allowed, and each spends the provider account of whoever runs the eval: no live case fired (raise the bound with --max-live-fires after reading the cases)"
        )
    })
}

/// A case not fired, failing `assertion` with `why`.
fn not_fired(assertion: &str, why: &str) -> CaseRun {
    CaseRun {
        failures: vec![Failure {
            assertion: assertion.into(),
            detail: why.into(),
        }],
        ..CaseRun::default()
    }
}

/// Every case on one revision. A revision `refused` (its powers go beyond the trusted
/// configuration) is not fired, and each of its rows fails with the reason; with
/// `too_many_live` no live case fires, and each of their rows fails with that.
fn run_all(
    f: &Firing,
    cases: &[Case],
    refused: Option<String>,
    too_many_live: Option<&str>,
) -> Result<Vec<CaseRun>, EvalError> {
    if let Some(why) = refused {
        return Ok(cases.iter().map(|_| not_fired(REFUSED, &why)).collect());
    }
    let secrets = f.trusted.redactor();
    cases
        .iter()
        .map(|c| match (too_many_live, &c.model) {
            (Some(why), case::CaseModel::Provider) => Ok(not_fired(LIVE_FIRES, why)),
            _ => run::run_case(f, c, &secrets),
        })
        .collect()
}

/// The "assertion" a refused revision's rows fail: the trusted configuration's powers.
pub const REFUSED: &str = "powers";

fn row(c: &Case, revision: &'static str, run: CaseRun) -> Row {
    let pass_rate = run.pass_rate();
    Row {
        case: c.name.clone(),
        file: c.file.to_string_lossy().into_owned(),
        task: c.task.clone(),
        revision,
        model: model_name(c),
        min_pass: c.min_pass,
        pass_rate,
        failed: pass_rate < c.min_pass,
        fixes: c.fixes.clone(),
        run,
    }
}

fn totals(rows: &[&Row]) -> Totals {
    let mut t = Totals {
        cases: rows.len(),
        ..Totals::default()
    };
    for r in rows {
        t.passed += usize::from(!r.failed);
        t.steps += r.run.steps;
        t.tool_calls += r.run.tool_calls;
        t.tokens += r.run.tokens;
        t.cost_usd += r.run.cost_usd;
        t.denials += r.run.denials;
        t.duration_ms += r.run.duration_ms;
    }
    t.pass_rate = if t.cases == 0 {
        1.0
    } else {
        t.passed as f64 / t.cases as f64
    };
    t
}

fn report(
    opts: &EvalOptions,
    cases: &[Case],
    base: Option<Vec<CaseRun>>,
    head: Vec<CaseRun>,
    problems: Vec<Diagnostic>,
) -> EvalReport {
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let mut base = base.map(Vec::into_iter);
    for (c, h) in cases.iter().zip(head) {
        let b = base.as_mut().and_then(Iterator::next).map(|r| row(c, "base", r));
        let h = row(c, "head", h);
        if h.failed {
            let base_broke = |a: &str| {
                b.as_ref()
                    .is_none_or(|b| b.run.failures.iter().any(|f| f.assertion == a))
            };
            // The base's version of an edited case judges the head alone: what the
            // base broke too is the base's, and correcting it is the edit's point.
            let judged = |regression: bool| regression || !c.base_version;
            for f in h.run.failures.iter().filter(|f| judged(!base_broke(&f.assertion))) {
                failures.push(Finding {
                    case: c.name.clone(),
                    file: h.file.clone(),
                    assertion: f.assertion.clone(),
                    detail: f.detail.clone(),
                    regression: !base_broke(&f.assertion),
                });
            }
            let regression = b.as_ref().is_some_and(|b| b.pass_rate >= c.min_pass);
            if (h.run.runs > 1 || h.run.failures.is_empty()) && judged(regression) {
                failures.push(Finding {
                    case: c.name.clone(),
                    file: h.file.clone(),
                    assertion: format!("min_pass: {}", c.min_pass),
                    detail: format!("passed {} of {} runs", h.run.passed, h.run.runs),
                    regression,
                });
            }
        }
        rows.extend(b);
        rows.push(h);
    }
    let of = |rev: &str| -> Vec<&Row> { rows.iter().filter(|r| r.revision == rev).collect() };
    let summary = Summary {
        base: opts.base.as_ref().map(|_| totals(&of("base"))),
        head: totals(&of("head")),
        ok: failures.is_empty() && problems.is_empty(),
        failures,
        problems,
    };
    EvalReport {
        base: opts.base.clone(),
        head: opts.head.clone(),
        trusted: String::new(),
        powers: Vec::new(),
        rows,
        summary,
    }
}
