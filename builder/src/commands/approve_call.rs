//! `builder approve-call <run-id> <call-id> [--deny]`: decide a call a headless fire
//! paused on. The decision is bound to the call's hash (tool + arguments) and stored
//! in the runtime's local state (`.runtime/state.db` of this checkout); `runtime
//! resume <run-id>` then continues the run.

use crate::command_error::{CommandError, Outcome};
use shared::agent::CallDecision;
use shared::state::{StateDb, StateError};
use std::path::Path;

/// Approve (or deny) the exact call a paused run waits on
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The paused run's id (from its `approval_needed` card)
    pub run_id: String,
    /// The call's id in that run (from the same card)
    pub call_id: String,
    /// Deny the call instead of approving it
    #[arg(long)]
    pub deny: bool,
    /// Who decides (default: git's author identity, as `git commit` picks it)
    #[arg(long)]
    pub by: Option<String>,
}

pub fn run(args: Args, repo: &Path) -> Result<Outcome, CommandError> {
    let wt = super::open_repo(repo)?;
    let by = match args.by {
        Some(b) => b,
        None => super::acting_identity(&wt.repo, "--by")?.to_string(),
    };
    let decision = if args.deny {
        CallDecision::Deny
    } else {
        CallDecision::Approve
    };
    let recorded = StateDb::open(&wt.root)
        .map_err(StateError::from)
        .and_then(|mut db| db.record_decision(&args.run_id, &args.call_id, decision, &by));
    match recorded {
        Ok(call) => {
            println!(
                "{} {call} for run {}",
                if args.deny { "denied" } else { "approved" },
                args.run_id
            );
            println!("hint: `runtime resume {}` continues the run", args.run_id);
            Ok(Outcome::Ok)
        }
        // The state database itself failed: the machine's problem, classified.
        Err(StateError::Store(e)) => Err(e.into()),
        // A refused approval (no such paused call, a changed call) is the check's
        // finding, not a usage error: exit 1 as before.
        Err(e) => {
            eprintln!("error: {e}");
            Ok(Outcome::Problems)
        }
    }
}
