//! `builder cards`: list cards grouped by fingerprint, show, triage, export. One file
//! per verb, each with its arguments beside what it does; the filter that `list` and
//! `export` share lives here.

mod export;
mod list;
mod show;
mod triage;

use crate::command_error::{CommandError, Outcome};
use crate::commands::index::{self, known_task, since, Indexed};
use crate::commands::named;
use shared::history::CardFilter;
use shared::records::{CardKind, CardStatus};
use std::path::Path;

/// Work with the runtime's failure cards
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<CardsCommand>,
}

#[derive(Debug, clap::Subcommand)]
pub enum CardsCommand {
    /// List cards grouped by fingerprint (one line per failure, however often seen)
    List(list::Args),
    /// Show the cards of one id or fingerprint
    Show(show::Args),
    /// Record a triage decision in the card files
    Triage(triage::Args),
    /// Export card groups (as GitHub issue bodies)
    Export(export::Args),
}

#[derive(Debug, Clone, Default, clap::Args)]
pub struct FilterArgs {
    /// Only this task
    #[arg(long)]
    pub task: Option<String>,
    /// Only this kind
    #[arg(long, value_parser = named::<CardKind>())]
    pub kind: Option<CardKind>,
    /// Only groups whose latest card has this status
    #[arg(long, value_parser = named::<CardStatus>())]
    pub status: Option<CardStatus>,
    /// Only cards created on or after this date (YYYY-MM-DD or RFC 3339)
    #[arg(long)]
    pub since: Option<String>,
}

impl FilterArgs {
    /// The filter, once `--since` parses and `--task` names a task the repository knows.
    fn filter(&self, ix: &Indexed) -> Result<CardFilter, CommandError> {
        if let Some(t) = &self.task {
            known_task(ix, t)?;
        }
        Ok(CardFilter {
            task: self.task.clone(),
            kind: self.kind,
            status: self.status,
            since: since(self.since.clone())?,
        })
    }
}

pub fn run(args: Args, repo: &Path) -> Result<Outcome, CommandError> {
    // Status comes from the card files: the work tree's edits overlaid on HEAD's.
    let mut ix = index::open_with_cards(repo)?;
    match args.command.unwrap_or(CardsCommand::List(list::Args::default())) {
        CardsCommand::List(a) => list::run(a, &ix),
        CardsCommand::Show(a) => show::run(a, &ix),
        CardsCommand::Triage(a) => triage::run(a, &mut ix),
        CardsCommand::Export(a) => export::run(a, &ix),
    }
}

fn no_card(id: &str) -> CommandError {
    CommandError::usage(format!("no card or fingerprint `{id}`")).hint("`builder cards list` shows fingerprints")
}
