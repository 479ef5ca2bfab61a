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

/// One row as `runtime runs` shows it: the stored row, and for a row that says
/// `running`, whether the process that runs it is still there (a run killed with its
/// machine or by the OOM killer keeps that row until the next fire of its task).
#[derive(Debug, serde::Serialize)]
struct Listed {
    #[serde(flatten)]
    row: shared::runs::RunSummary,
    /// `alive` or `gone`, for `running` rows only.
    #[serde(skip_serializing_if = "Option::is_none")]
    process: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pid: Option<u32>,
}

pub fn run(args: Args, root: &Path) -> Result<Outcome, CommandError> {
    let db = StateDb::open_for_reading(root)?;
    let store = db.store();
    let rows = shared::trace::list_runs(store, args.task.as_deref(), args.limit)?;
    let rows: Vec<Listed> = rows
        .into_iter()
        .map(|row| {
            let live = match row.status {
                shared::records::RunStatus::Running => shared::journal::live_run(store, &row.run_id).ok().flatten(),
                _ => None,
            };
            let process = live.as_ref().map(|l| if l.owner_gone() { "gone" } else { "alive" });
            Listed {
                pid: live.map(|l| l.pid),
                process,
                row,
            }
        })
        .collect();
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
    let mut interrupted = 0;
    for Listed { row: r, process, .. } in &rows {
        let status = match process {
            Some("gone") => {
                interrupted += 1;
                "interrupted".to_string()
            }
            _ => r.status.to_string(),
        };
        println!(
            "{:<26} {:<14} {:<17} {:<15} {:>5} {:>8} {:>9.4} {:>8}",
            shared::text::printable(&r.run_id),
            shared::text::printable(&r.task),
            status,
            r.stop_reason,
            r.steps,
            r.tokens,
            r.cost_usd,
            r.duration_ms
        );
    }
    if interrupted > 0 {
        println!(
            "interrupted: the process that ran it is gone; the next fire of its task resumes or closes it, or commits its records if it had finished (`runtime resume <run>` continues one killed mid-run now)"
        );
    }
    Ok(Outcome::Ok)
}
