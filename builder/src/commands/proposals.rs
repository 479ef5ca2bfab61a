//! `builder proposals`: one line per proposal: name, state (`open`, `approved`,
//! `stale`, `merged`), author(s).

use crate::command_error::{CommandError, Outcome};
use shared::review::proposals;
use shared::text::{printable, printable_json};
use std::path::Path;

/// List proposals with their state and author
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args, repo_path: &Path) -> Result<Outcome, CommandError> {
    let wt = super::open_repo(repo_path)?;
    let (settings, _) = super::review_settings(&wt.root)?;
    let list = proposals::list(&wt.repo, &super::approval_rule(&settings)?)?;
    if args.json {
        println!("{}", printable_json(&serde_json::to_string_pretty(&list)?));
        return Ok(Outcome::Ok);
    }
    for p in &list {
        println!(
            "{}\t{}\t{}",
            printable(&p.name),
            p.state.name(),
            printable(&p.authors.join(", "))
        );
    }
    Ok(Outcome::Ok)
}
