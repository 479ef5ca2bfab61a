//! `builder history show`: one indexed run's receipt, with where its records are and
//! whether its commit was forged.

use crate::command_error::{CommandError, Outcome};
use crate::commands::index;
use shared::history;
use shared::runs;
use shared::text::{printable, printable_json, printable_multiline};
use std::path::Path;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The run's id (as `builder history runs` lists it)
    run_id: String,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args, repo: &Path) -> Result<Outcome, CommandError> {
    let Args { run_id, json } = args;
    let ix = index::open(repo)?;
    let Some(r) = runs::run(&ix.store, &run_id)? else {
        return Err(CommandError::usage(format!("no run `{run_id}` in the history index"))
            .hint("`builder history runs` lists runs; records must be committed to be indexed"));
    };
    // The builder's index holds committed receipts only, so the path is set.
    let receipt_path = r.receipt_path.clone().unwrap_or_default();
    let receipt = shared::records::record_text(&ix.root, &ix.repo, &receipt_path).ok_or_else(|| {
        CommandError::environment(format!(
            "{receipt_path}: not a record that can be read (gone from the work tree and HEAD, not a plain file, or larger than a record is shown)"
        ))
        .hint(format!("`git checkout HEAD -- {receipt_path}` puts the committed receipt back"))
    })?;
    if json {
        println!("{}", printable_json(&receipt));
    } else {
        println!(
            "run {} ({})\nreceipt {}\nreport {}\n",
            printable(&r.run_id),
            printable(&r.task),
            printable(&receipt_path),
            printable(r.report_path.as_deref().unwrap_or("-"))
        );
        if let Some((commit, why)) = history::forged_run(&ix.store, &r)? {
            println!(
                "FORGED: this run's records came in commit {}, which the runtime did not make ({})\n",
                shared::text::short_id(&commit),
                printable(&why)
            );
        }
        println!("{}", printable_multiline(&receipt));
    }
    Ok(Outcome::Ok)
}
