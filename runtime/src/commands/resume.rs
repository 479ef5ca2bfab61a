//! `runtime resume <run-id>`: continue a run paused for approval, once a builder has
//! approved (or denied) the exact call with `builder approve-call`.

use crate::command_error::{CommandError, Outcome};
use shared::state::StateDb;
use std::path::Path;

/// Continue a run that waits for approval (after `builder approve-call`)
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The paused run's id
    pub run_id: String,
    /// Write the records but do not commit them
    #[arg(long)]
    pub no_commit: bool,
    /// Print the result as JSON on stdout
    #[arg(long)]
    pub json: bool,
    /// Print the report the fire wrote to stdout at the end
    #[arg(long, conflicts_with = "json")]
    pub print_report: bool,
    /// When to show a live status line on stderr
    ///
    /// The line shows the step, the model call and its elapsed time, each tool call
    /// with its decision, retries and fallback switches. `-v` prints one plain line per
    /// event instead; NO_COLOR turns colour off
    #[arg(long, value_enum, value_name = "WHEN", default_value_t = crate::progress::When::Auto)]
    pub progress: crate::progress::When,
}

pub fn run(args: Args, root: &Path, verbose: bool) -> Result<Outcome, CommandError> {
    let checkpoint = StateDb::open(root)?.checkpoint(&args.run_id)?;
    let task = match checkpoint {
        Some(c) => c.task,
        None => {
            return Err(
                CommandError::usage(format!("run `{}` has no checkpoint waiting for approval", args.run_id))
                    .hint("`runtime runs` lists runs; only `waiting_approval` runs can be resumed"),
            )
        }
    };
    let out = super::fire::Output {
        json: args.json,
        verbose,
        print_report: args.print_report,
        progress: args.progress,
    };
    let fire = super::fire::Fire {
        task,
        no_commit: args.no_commit,
        resume: Some(args.run_id),
        replay: None,
        eval: false,
    };
    super::fire::fire_task(root, fire, out)
}
