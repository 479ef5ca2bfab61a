//! `builder history runs`: list indexed runs, newest first, with their filters, and
//! mark those whose receipts came in forged commits.

use crate::command_error::{CommandError, Outcome};
use crate::commands::{index, named};
use shared::history;
use shared::records::RunStatus;
use shared::runs::{self, RunFilter};
use shared::text::{printable, printable_json};
use std::path::Path;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only this task (a prompt, or runs of it in the index)
    #[arg(long)]
    task: Option<String>,
    /// Only runs with this status
    #[arg(long, value_parser = named::<RunStatus>())]
    status: Option<RunStatus>,
    /// Only runs started on or after this date (YYYY-MM-DD or RFC 3339)
    #[arg(long)]
    since: Option<String>,
    /// Print at most this many runs
    #[arg(long, default_value_t = 50)]
    limit: usize,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args, repo: &Path) -> Result<Outcome, CommandError> {
    let Args {
        task,
        status,
        since,
        limit,
        json,
    } = args;
    let ix = index::open(repo)?;
    if let Some(t) = &task {
        index::known_task(&ix, t)?;
    }
    let since = index::since(since)?;
    let rows = runs::runs(
        &ix.store,
        &RunFilter {
            task,
            status,
            since,
            limit: Some(limit),
        },
    )?;
    if json {
        println!("{}", printable_json(&serde_json::to_string_pretty(&rows)?));
        return Ok(Outcome::Ok);
    }
    println!(
        "{:<26} {:<12} {:<16} {:<15} {:>5} {:>8} {:>9} {:>8}  PROMPT",
        "RUN", "TASK", "STATUS", "STOP", "STEPS", "TOKENS", "COST", "MS"
    );
    let mut forged = 0;
    for r in rows {
        let mut prompt = r
            .prompt_blob
            .as_deref()
            .map(|p| &p[..p.len().min(8)])
            .unwrap_or("-")
            .to_string();
        if history::forged_run(&ix.store, &r)?.is_some() {
            prompt.push_str("  FORGED");
            forged += 1;
        }
        println!(
            "{:<26} {:<12} {:<16} {:<15} {:>5} {:>8} {:>9.4} {:>8}  {prompt}",
            printable(&r.run_id),
            printable(&r.task),
            r.status,
            r.stop_reason,
            r.steps,
            r.tokens,
            r.cost_usd,
            r.duration_ms
        );
    }
    if forged > 0 {
        println!(
            "{forged} run(s) FORGED: their records came in commits named as the runtime without a valid runtime signature, or in people's commits (`builder audit` lists them)"
        );
    }
    Ok(Outcome::Ok)
}
