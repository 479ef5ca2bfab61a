//! `builder history index`: bring the history index up to date and say what it took in.

use crate::command_error::{CommandError, Outcome};
use crate::commands::index;
use std::path::Path;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args, repo: &Path) -> Result<Outcome, CommandError> {
    let Args { json } = args;
    let ix = index::open_with_cards(repo)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&ix.stats)?);
    } else {
        let s = &ix.stats;
        println!(
            "indexed {} receipts and {} cards ({}), removed {}, {} card files from the work tree",
            s.receipts,
            s.cards,
            if s.full { "full" } else { "incremental" },
            s.removed,
            s.overlaid_cards
        );
    }
    Ok(Outcome::Ok)
}
