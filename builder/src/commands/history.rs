//! `builder history`: index receipts, list and show runs, diff two runs, compare a
//! task's metrics across a prompt change.

use super::{index, named};
use crate::command_error::{CommandError, Outcome};
use anyhow::Context;
use shared::history;
use shared::records::RunStatus;
use shared::runs::{self, RunFilter};
use shared::text::{printable, printable_json, printable_multiline};
use std::path::Path;

/// Read the runtime's run history (receipts indexed into SQLite)
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: HistoryCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum HistoryCommand {
    /// Bring the index up to date (every other subcommand does this first)
    Index {
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// List runs, newest first
    Runs {
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
    },
    /// Show one run's receipt
    Show {
        /// The run's id (as `builder history runs` lists it)
        run_id: String,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Diff two runs: input versions with the text diff, metrics, report text
    Diff {
        /// The earlier run's id
        a: String,
        /// The later run's id
        b: String,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
    /// Compare a task's runs on the input version (prompt, scope, settings, model) at two revisions
    Compare {
        /// The task (a prompt, or runs of it in the index)
        task: String,
        /// The revision whose input version is the baseline
        #[arg(long)]
        before: String,
        /// The revision whose input version is judged against it
        #[arg(long, default_value = "HEAD")]
        after: String,
        /// Runs each side needs before anything is judged (refused runs do not count)
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(i64).range(1..))]
        min_runs: i64,
        /// Print JSON
        #[arg(long)]
        json: bool,
    },
}

pub fn run(args: Args, repo: &Path) -> Result<Outcome, CommandError> {
    match args.command {
        HistoryCommand::Index { json } => {
            let ix = index::open_with_cards(repo)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&ix.stats)?);
            } else {
                let s = &ix.stats;
                println!(
                    "indexed {} receipts and {} cards ({}), removed {}, {} card files from the work tree",
                    s.receipts,
                    s.cards,
                    if s.full { "full" } else { "incremental" },
                    s.removed,
                    s.overlaid_cards
                );
            }
            Ok(Outcome::Ok)
        }
        HistoryCommand::Runs {
            task,
            status,
            since,
            limit,
            json,
        } => {
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
                if let Some(path) = &r.receipt_path {
                    if history::forged_record(&ix.store, path)?.is_some() {
                        prompt.push_str("  FORGED");
                        forged += 1;
                    }
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
                    "{forged} run(s) FORGED: their receipts came in commits named as the runtime without a valid runtime signature (`builder audit` lists them)"
                );
            }
            Ok(Outcome::Ok)
        }
        HistoryCommand::Show { run_id, json } => {
            let ix = index::open(repo)?;
            let Some(r) = runs::run(&ix.store, &run_id)? else {
                return Err(CommandError::usage(format!("no run `{run_id}` in the history index"))
                    .hint("`builder history runs` lists runs; records must be committed to be indexed"));
            };
            // The builder's index holds committed receipts only, so the path is set.
            let receipt_path = r.receipt_path.clone().unwrap_or_default();
            let full = ix.root.join(&receipt_path);
            let receipt = std::fs::read_to_string(&full).with_context(|| full.display().to_string())?;
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
                if let Some((commit, why)) = history::forged_record(&ix.store, &receipt_path)? {
                    println!(
                        "FORGED: this receipt came in commit {}, named as the runtime without a valid runtime signature ({})\n",
                        &commit[..commit.len().min(12)],
                        printable(&why)
                    );
                }
                println!("{}", printable_multiline(&receipt));
            }
            Ok(Outcome::Ok)
        }
        HistoryCommand::Diff { a, b, json } => {
            let ix = index::open(repo)?;
            let Some(d) = history::diff(&ix.repo, &ix.store, &a, &b)? else {
                return Err(
                    CommandError::usage(format!("`{a}` or `{b}` is not exactly one indexed run"))
                        .hint("`builder history runs` lists runs; a unique prefix of a run id is enough"),
                );
            };
            if json {
                println!("{}", printable_json(&serde_json::to_string_pretty(&d)?));
                return Ok(Outcome::Ok);
            }
            println!(
                "a: {} {} ({}) on {}",
                printable(&d.a.run_id),
                printable(&d.a.task),
                d.a.status,
                d.a.commit_id.as_deref().unwrap_or("-")
            );
            println!(
                "b: {} {} ({}) on {}\n",
                printable(&d.b.run_id),
                printable(&d.b.task),
                d.b.status,
                d.b.commit_id.as_deref().unwrap_or("-")
            );
            println!("## inputs");
            for i in &d.inputs {
                let short = |o: &Option<String>| {
                    o.as_deref()
                        .map(|s| s[..s.len().min(10)].to_string())
                        .unwrap_or_else(|| "-".into())
                };
                println!(
                    "{}: {} -> {}{}",
                    i.name,
                    short(&i.a),
                    short(&i.b),
                    if i.diff.is_empty() { " (same)" } else { "" }
                );
                print!("{}", printable_multiline(&i.diff));
            }
            println!("\n## metrics");
            for m in &d.metrics {
                println!("{:<12} {:>12.4} {:>12.4} {:>+12.4}", m.name, m.a, m.b, m.delta);
            }
            println!("\n## report");
            print!(
                "{}",
                if d.report_diff.is_empty() {
                    "(same text)\n".to_string()
                } else {
                    printable_multiline(&d.report_diff).into_owned()
                }
            );
            Ok(Outcome::Ok)
        }
        HistoryCommand::Compare {
            task,
            before,
            after,
            min_runs,
            json,
        } => {
            let ix = index::open(repo)?;
            index::known_task(&ix, &task)?;
            super::resolve_commit(&ix.repo, "--before", &before)?;
            super::resolve_commit(&ix.repo, "--after", &after)?;
            let c = history::compare(&ix.repo, &ix.store, &task, &before, &after, min_runs)?;
            if json {
                println!("{}", printable_json(&serde_json::to_string_pretty(&c)?));
            } else {
                print_comparison(&c);
            }
            Ok(if c.regressions.is_empty() {
                Outcome::Ok
            } else {
                Outcome::Problems
            })
        }
    }
}

fn print_comparison(c: &history::Comparison) {
    let short = |o: &Option<String>| {
        o.as_deref()
            .map(|s| s[..s.len().min(8)].to_string())
            .unwrap_or_else(|| "-".into())
    };
    println!(
        "{:<10} {:>6} {:>9} {:>7} {:>9} {:>9} {:>8}  PROMPT   SCOPE    SETTINGS MODEL",
        "VERSION", "RUNS", "SUCCESS", "STEPS", "TOKENS", "COST", "DENIALS"
    );
    for v in [&c.before, &c.after] {
        println!(
            "{:<10} {:>6} {:>8.0}% {:>7.2} {:>9.1} {:>9.4} {:>8.2}  {:<8} {:<8} {:<8} {}",
            v.rev,
            v.runs,
            v.success_rate * 100.0,
            v.avg_steps,
            v.avg_tokens,
            v.avg_cost_usd,
            v.avg_denials,
            short(&v.version.prompt_blob),
            short(&v.version.scope_blob),
            short(&v.version.settings_blob),
            printable(v.version.model.as_deref().unwrap_or("-"))
        );
    }
    for v in [&c.before, &c.after] {
        if v.refused > 0 || v.other_models > 0 {
            println!(
                "{}: left out {} refused run(s) and {} run(s) on another model",
                v.rev, v.refused, v.other_models
            );
        }
    }
    if !c.enough_runs {
        println!(
            "too few runs to compare: {} on {} and {} on {}; each side needs at least {} (--min-runs)",
            c.before.runs, c.before.rev, c.after.runs, c.after.rev, c.min_runs
        );
        return;
    }
    if let Some(t) = &c.success_test {
        if !t.regression {
            println!(
                "success rate {:.0}% ({}/{}) -> {:.0}% ({}/{}): no significant drop (Fisher's exact test, one-sided p = {})",
                c.before.success_rate * 100.0,
                c.before.successes,
                c.before.runs,
                c.after.success_rate * 100.0,
                c.after.successes,
                c.after.runs,
                history::format_p(t.p_value)
            );
        }
    }
    if c.regressions.is_empty() {
        println!("no regressions");
    } else {
        for r in &c.regressions {
            println!("REGRESSION: {r}");
        }
    }
}
