//! `builder history`: index receipts, list and show runs, diff two runs, compare a
//! task's metrics across a prompt change. One file per verb, each with its arguments
//! beside what it does.

mod compare;
mod diff;
mod index;
mod runs;
mod show;

use crate::command_error::{CommandError, Outcome};
use std::path::Path;

/// Read the runtime's run history (receipts indexed into SQLite)
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: HistoryCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum HistoryCommand {
    /// Bring the index up to date (every other subcommand does this first)
    Index(index::Args),
    /// List runs, newest first
    Runs(runs::Args),
    /// Show one run's receipt
    Show(show::Args),
    /// Diff two runs: input versions with the text diff, metrics, report text
    Diff(diff::Args),
    /// Compare a task's runs on the input version (prompt, scope, settings, model) at two revisions
    Compare(compare::Args),
}

pub fn run(args: Args, repo: &Path) -> Result<Outcome, CommandError> {
    match args.command {
        HistoryCommand::Index(a) => index::run(a, repo),
        HistoryCommand::Runs(a) => runs::run(a, repo),
        HistoryCommand::Show(a) => show::run(a, repo),
        HistoryCommand::Diff(a) => diff::run(a, repo),
        HistoryCommand::Compare(a) => compare::run(a, repo),
    }
}
