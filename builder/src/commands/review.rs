//! `builder review <name>`: what a reviewer needs before approving a proposal: the
//! diff of builder-owned paths against its base, `builder check` on its tree, the
//! capability delta over the recorded tool calls, the eval table for base and head,
//! and the evidence for each card it says it fixes. Exit 1 when the check or the
//! evals fail. The head shown is remembered: `builder approve` approves that head
//! only ([`shared::review::reviewed`]).

use crate::command_error::{CommandError, Outcome};
use shared::review_report::{self, ReportError, ReviewOptions};
use shared::text::{printable_json, printable_multiline};
use std::path::{Path, PathBuf};

/// How the review is printed.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Format {
    /// Sections for a terminal
    Text,
    /// The review as JSON (its fields: docs/review.md)
    Json,
    /// A pull-request comment body (markdown)
    Github,
}

/// Review a proposal: diff, check, capability delta, evals and fixed cards
///
/// The capability delta decides every tool call recorded in the runtime's state
/// database again under the base's settings and under the proposal's, and lists the
/// calls whose decision changes, grouped by rule. The evals run base and head in
/// temporary worktrees, as `builder eval` does, under the trusted configuration (the
/// base's settings, or --trusted-settings): the powers the proposal changes (sandbox,
/// network, read directories, provider, key variable, telemetry, sync, prefetch ports)
/// are listed with before and after, and a proposal that widens one is not fired
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The proposal's name
    pub name: String,
    /// Output format
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub format: Format,
    /// Only tool calls of runs started in the last N days
    #[arg(long, value_name = "N")]
    pub days: Option<u32>,
    /// The runtime state database holding the recorded calls [default: .runtime/state.db]
    #[arg(long, value_name = "DB")]
    pub history: Option<PathBuf>,
    /// Run the evals under this settings file's powers instead of the base's
    #[arg(long, value_name = "FILE")]
    pub trusted_settings: Option<PathBuf>,
    /// The most live model fires (`model: provider` cases times their `repeat`) the
    /// evals may make per revision; over it, no live case fires
    #[arg(long, value_name = "N", default_value_t = shared::eval::DEFAULT_MAX_LIVE_FIRES)]
    pub max_live_fires: u32,
}

pub fn run(args: Args, repo_path: &Path) -> Result<Outcome, CommandError> {
    let wt = super::open_repo(repo_path)?;
    let history = args.history.unwrap_or_else(|| {
        wt.root
            .join(shared::layout::STATE_DIR)
            .join(shared::state::STATE_DB_FILE)
    });
    let since = args
        .days
        .map(|d| (chrono::Utc::now() - chrono::Duration::days(i64::from(d))).to_rfc3339());
    let opts = ReviewOptions {
        root: wt.root.clone(),
        name: args.name,
        history,
        since,
        runtime: super::eval::runtime_binary()?,
        trusted: super::eval::trusted_source(args.trusted_settings),
        max_live_fires: args.max_live_fires,
    };
    let report = review_report::review(&wt.repo, &opts).map_err(|e| match e {
        ReportError::Review(e) => CommandError::from(e),
        ReportError::Git(e) => CommandError::from(e),
        ReportError::Delta(shared::review::delta::DeltaError::Store(e)) => CommandError::from(e),
        ReportError::Delta(e) => CommandError::new(crate::command_error::Kind::Config, e),
        ReportError::Eval(e) => super::eval::eval_error(e),
    })?;
    // `builder approve` holds the proposal to the head shown here.
    if let Ok(head) = git2::Oid::from_str(&report.head) {
        if let Err(e) = shared::review::reviewed::remember(wt.repo.commondir(), &report.proposal, head) {
            tracing::warn!(error = %e, "the reviewed head was not remembered: `builder approve` will need --head");
        }
    }
    match args.format {
        // The renderers escape each field; printing through the multi-line escape too
        // keeps a field a renderer missed from driving the terminal.
        Format::Text => print!("{}", printable_multiline(&review_report::text(&report))),
        Format::Json => println!("{}", printable_json(&serde_json::to_string_pretty(&report)?)),
        Format::Github => print!("{}", printable_multiline(&review_report::github(&report))),
    }
    Ok(if report.ok { Outcome::Ok } else { Outcome::Problems })
}
