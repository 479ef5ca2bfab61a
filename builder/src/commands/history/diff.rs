//! `builder history diff`: two runs side by side: their input versions with the text
//! diff, their metrics and their reports.

use crate::command_error::{CommandError, Outcome};
use crate::commands::index;
use shared::history;
use shared::text::{printable, printable_json, printable_multiline};
use std::path::Path;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The earlier run's id
    a: String,
    /// The later run's id
    b: String,
    /// Print JSON
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args, repo: &Path) -> Result<Outcome, CommandError> {
    let Args { a, b, json } = args;
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
