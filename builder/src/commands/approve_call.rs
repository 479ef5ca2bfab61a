//! `builder approve-call <run-id> <call-id> [--deny]`: decide a call a headless fire
//! paused on. The decision is bound to the call's hash (tool + arguments) and stored
//! in the runtime's local state (`.runtime/state.db` of this checkout); `runtime
//! resume <run-id>` then continues the run.

use shared::agent::CallDecision;
use shared::state::{StateDb, StateError};
use std::path::Path;

/// Approve (or deny) the exact call a paused run waits on
#[derive(Debug, clap::Args)]
pub struct Args {
    pub run_id: String,
    pub call_id: String,
    /// Deny the call instead of approving it
    #[arg(long)]
    pub deny: bool,
    /// Who decides (default: git config user.name and user.email)
    #[arg(long)]
    pub by: Option<String>,
}

pub fn run(args: Args, repo: &Path) -> anyhow::Result<i32> {
    let root = git2::Repository::discover(repo)
        .ok()
        .and_then(|r| r.workdir().map(Path::to_path_buf))
        .unwrap_or_else(|| repo.to_path_buf());
    let by = match args.by {
        Some(b) => b,
        None => git2::Repository::open(&root)
            .ok()
            .and_then(|r| r.signature().ok())
            .and_then(|s| Some(format!("{} <{}>", s.name().ok()?, s.email().ok()?)))
            .unwrap_or_else(|| std::env::var("USER").unwrap_or_else(|_| "unknown".into())),
    };
    let decision = if args.deny {
        CallDecision::Deny
    } else {
        CallDecision::Approve
    };
    let recorded = StateDb::open(&root)
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
            Ok(0)
        }
        Err(e) => {
            eprintln!("error: {e}");
            Ok(1)
        }
    }
}
