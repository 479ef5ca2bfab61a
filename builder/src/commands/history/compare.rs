//! `builder history compare`: a task's runs on the input version at two revisions,
//! and the regressions between them (a significant drop in success rate, or worse
//! averages).

use crate::command_error::{CommandError, Outcome};
use crate::commands::{index, resolve_commit};
use shared::history;
use shared::text::{printable, printable_json};
use std::path::Path;

#[derive(Debug, clap::Args)]
pub struct Args {
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
}

pub fn run(args: Args, repo: &Path) -> Result<Outcome, CommandError> {
    let Args {
        task,
        before,
        after,
        min_runs,
        json,
    } = args;
    let ix = index::open(repo)?;
    index::known_task(&ix, &task)?;
    resolve_commit(&ix.repo, "--before", &before)?;
    resolve_commit(&ix.repo, "--after", &after)?;
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
