//! `builder proposals`: one line per proposal: name, state (`open`, `approved`,
//! `stale`, `merged`, `merged without approval`), author(s), and where its branch
//! stands against the remote's when they differ. Proposals only the remote has (as
//! last fetched) are listed too. When the remote lacks approvals this clone has (a
//! forced push there, or approvals never pushed), it says how many.

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
    let (settings, _) = super::protected_branch_settings(&wt)?;
    let remote = super::team_remote(&wt.repo, None, &settings, false)?;
    let list = proposals::list_with(&wt.repo, &super::approval_rule(&settings)?, remote.as_deref())?;
    if args.json {
        println!("{}", printable_json(&serde_json::to_string_pretty(&list)?));
    } else {
        for p in &list {
            let line = format!(
                "{}\t{}\t{}",
                printable(&p.name),
                p.state.name(),
                printable(&p.authors.join(", "))
            );
            match &p.remote {
                Some(note) => println!("{line}\t{}", printable(note)),
                None => println!("{line}"),
            }
        }
    }
    if let Some(r) = &remote {
        super::report_unpublished(&wt, r);
    }
    Ok(Outcome::Ok)
}
