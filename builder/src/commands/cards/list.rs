//! `builder cards list` (and `builder cards` alone): card groups, one line per
//! fingerprint, however often seen.

use super::FilterArgs;
use crate::command_error::{CommandError, Outcome};
use crate::commands::index::Indexed;
use shared::history;
use shared::text::{printable, printable_json};

#[derive(Debug, Clone, Default, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args, ix: &Indexed) -> Result<Outcome, CommandError> {
    let groups = history::card_groups(&ix.store, &a.filter.filter(ix)?)?;
    if a.json {
        println!("{}", printable_json(&serde_json::to_string_pretty(&groups)?));
    } else if groups.is_empty() {
        println!("no cards");
    } else {
        println!(
            "{:>5}  {:<10} {:<10} {:<20} {:<14} {:<10} {:<16}  SUMMARY",
            "COUNT", "FIRST", "LAST", "KIND", "TASK", "STATUS", "FINGERPRINT"
        );
        for g in &groups {
            println!(
                "{:>5}  {:<10} {:<10} {:<20} {:<14} {:<10} {:<16}  {}",
                g.count,
                printable(&g.first_seen.chars().take(10).collect::<String>()),
                printable(&g.last_seen.chars().take(10).collect::<String>()),
                g.kind,
                printable(&g.task),
                g.status,
                printable(&g.fingerprint),
                printable(&g.summary)
            );
        }
    }
    Ok(Outcome::Ok)
}
