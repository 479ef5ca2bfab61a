//! `builder cards export`: card groups as GitHub issue bodies.

use super::FilterArgs;
use crate::command_error::{CommandError, Outcome};
use crate::commands::index::Indexed;
use shared::cards;
use shared::history;
use shared::text::printable_json;

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ExportFormat {
    Github,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Output format
    #[arg(long, value_enum, default_value = "github")]
    format: ExportFormat,
    #[command(flatten)]
    filter: FilterArgs,
}

pub fn run(args: Args, ix: &Indexed) -> Result<Outcome, CommandError> {
    let Args {
        format: ExportFormat::Github,
        filter,
    } = args;
    let groups = history::card_groups(&ix.store, &filter.filter(ix)?)?;
    let issues: Vec<_> = groups
        .iter()
        .map(|g| {
            let latest = shared::records::read_card(&ix.root.join(&g.latest_path)).ok();
            cards::github_issue(g, latest.as_ref())
        })
        .collect();
    println!("{}", printable_json(&serde_json::to_string_pretty(&issues)?));
    Ok(Outcome::Ok)
}
