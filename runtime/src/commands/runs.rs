//! `runtime runs`: the local run list from `.runtime/state.db`.

use crate::command_error::{CommandError, Outcome};
use shared::state::StateDb;
use std::path::Path;

/// List local runs, newest first
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only this task
    #[arg(long)]
    pub task: Option<String>,
    /// How many runs to show
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args, root: &Path) -> Result<Outcome, CommandError> {
    let db = StateDb::open_for_reading(root)?;
    let store = db.store();
    let rows = shared::trace::list_runs(store, args.task.as_deref(), args.limit)?;
    if args.json {
        println!(
            "{}",
            shared::text::printable_json(&serde_json::to_string_pretty(&rows)?)
        );
        return Ok(Outcome::Ok);
    }
    if rows.is_empty() {
        println!("no runs yet (try `runtime fire <task>`)");
        return Ok(Outcome::Ok);
    }
    println!(
        "{:<26} {:<14} {:<17} {:<15} {:>5} {:>8} {:>9} {:>8}",
        "RUN", "TASK", "STATUS", "STOP", "STEPS", "TOKENS", "COST", "MS"
    );
    for r in rows {
        println!(
            "{:<26} {:<14} {:<17} {:<15} {:>5} {:>8} {:>9.4} {:>8}",
            shared::text::printable(&r.run_id),
            shared::text::printable(&r.task),
            r.status,
            r.stop_reason,
            r.steps,
            r.tokens,
            r.cost_usd,
            r.duration_ms
        );
    }
    Ok(Outcome::Ok)
}
