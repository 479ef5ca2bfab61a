//! `builder check`: lint prompts, scope and settings together; exit 1 on any problem.

use crate::command_error::{CommandError, Outcome};
use std::path::Path;

/// Lint prompts, scope and settings; list every problem with file:line and a hint
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print problems as JSON
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args, repo: &Path) -> Result<Outcome, CommandError> {
    let wt = super::open_repo(repo)?;
    let checked = shared::check::check_repo(&wt.root);
    let problems = checked.problems;
    // The key belongs to the machine that fires (the cron box), not to the repository:
    // said, but not counted as a problem of the files.
    if let Some(var) = checked.settings.as_ref().and_then(|s| s.runtime.missing_key_variable()) {
        eprintln!("note: the provider's key variable `{var}` (settings/runtime.yaml api_key_env) is unset or empty here; a fire on this machine would refuse (exit 2)");
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&problems)?);
    } else if problems.is_empty() {
        println!("ok: prompts, scope and settings check out");
    } else {
        for p in &problems {
            println!("{p}");
        }
        println!("{} problem(s)", problems.len());
    }
    Ok(if problems.is_empty() {
        Outcome::Ok
    } else {
        Outcome::Problems
    })
}
