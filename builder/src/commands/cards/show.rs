//! `builder cards show`: the card files of one card id or fingerprint.

use super::no_card;
use crate::command_error::{CommandError, Outcome};
use crate::commands::index::Indexed;
use anyhow::Context;
use shared::history;
use shared::text::{printable, printable_multiline};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Card id or fingerprint
    id: String,
}

pub fn run(args: Args, ix: &Indexed) -> Result<Outcome, CommandError> {
    let Args { id } = args;
    let paths = history::card_paths(&ix.store, &id)?;
    if paths.is_empty() {
        return Err(no_card(&id));
    }
    for p in &paths {
        let full = ix.root.join(p);
        println!("# {}", printable(p));
        if let Some((commit, why)) = history::forged_record(&ix.store, p)? {
            println!(
                "# FORGED: this card came in commit {}, which the runtime did not make ({})",
                printable(&commit),
                printable(&why)
            );
        }
        print!(
            "{}",
            printable_multiline(&std::fs::read_to_string(&full).with_context(|| full.display().to_string())?)
        );
    }
    Ok(Outcome::Ok)
}
