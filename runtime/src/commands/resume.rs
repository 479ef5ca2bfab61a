//! `runtime resume <run-id>`: continue a run paused for approval, once a builder has
//! approved (or denied) the exact call with `builder approve-call`, or a run that was
//! interrupted (its row still `running`, its process gone) from its last checkpoint.

use crate::command_error::{CommandError, Kind, Outcome};
use shared::state::StateDb;
use std::path::Path;

/// Continue a run that waits for approval (after `builder approve-call`) or was interrupted
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The paused or interrupted run's id
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
    // Before the state database is read: a HEAD that tracks it may have written it.
    let repo = shared::git::open_work_tree(root)?.repo;
    if let Some((message, hint)) = shared::state::tracked_state_refusal(&repo) {
        return Err(CommandError::new(Kind::Config, anyhow::Error::msg(message)).hint(hint));
    }
    drop(repo);
    let db = StateDb::open(root)?;
    let task =
        match db.checkpoint(&args.run_id)? {
            Some(c) => c.task,
            None => match shared::journal::live_run(db.store(), &args.run_id)? {
                Some(live) if live.owner_gone() => live.task,
                Some(live) => {
                    return Err(CommandError::usage(format!(
                        "run `{}` is still running (pid {})",
                        args.run_id, live.pid
                    )))
                }
                None => return Err(CommandError::usage(format!(
                    "run `{}` has no checkpoint to resume (not paused, not interrupted)",
                    args.run_id
                ))
                .hint(
                    "`runtime runs` lists runs; `waiting_approval` runs and interrupted `running` ones can be resumed",
                )),
            },
        };
    drop(db);
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
        trusted: None,
        opened: None,
    };
    super::fire::fire_task(root, fire, out)
}
