//! `builder retro`: a markdown retro since the last one, with an SVG chart beside it.

use super::index;
use crate::command_error::{CommandError, Outcome};
use anyhow::Context;
use chrono::{Duration, Utc};
use shared::history;
use std::path::{Path, PathBuf};

/// Write a markdown retro: runs, top cards, cost and tokens per day, denials, missing tools
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Start here (YYYY-MM-DD or RFC 3339) instead of at the last retro
    #[arg(long, conflicts_with = "since_last")]
    pub since: Option<String>,
    /// Start at the last retro (the default; the first retro covers 7 days)
    #[arg(long)]
    pub since_last: bool,
    /// Write the markdown here (the chart goes beside it as .svg) and move the
    /// last-retro mark; default stdout, which leaves the mark where it is
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Move the last-retro mark even when printing to stdout
    #[arg(long, conflicts_with = "dry_run")]
    pub mark: bool,
    /// Do not move the last-retro mark, even with -o
    #[arg(long)]
    pub dry_run: bool,
}

pub fn run(args: Args, repo: &Path) -> Result<Outcome, CommandError> {
    // Card status comes from the card files (work-tree triage overlaid, undone triage gone).
    let mut ix = index::open_with_cards(repo)?;
    let now = Utc::now();
    let since = match index::since(args.since)? {
        Some(s) => s,
        None => history::get_meta(&ix.store, "last_retro")?.unwrap_or_else(|| (now - Duration::days(7)).to_rfc3339()),
    };
    let svg_path = match &args.output {
        Some(p) => p.with_extension("svg"),
        None => ix.root.join(".runtime/retro.svg"),
    };
    let svg_name = svg_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "retro.svg".into());
    let retro = shared::retro::build(&ix.store, &since, &now.to_rfc3339(), &svg_name)?;
    std::fs::write(&svg_path, &retro.svg).with_context(|| svg_path.display().to_string())?;
    match &args.output {
        Some(p) => {
            std::fs::write(p, &retro.markdown).with_context(|| p.display().to_string())?;
            println!("wrote {} and {}", p.display(), svg_path.display());
        }
        None => print!("{}", shared::text::printable_multiline(&retro.markdown)),
    }
    // A retro read on the terminal is a look, not a retro held: only one written to a
    // file (or asked for with --mark) moves the mark.
    if (args.output.is_some() || args.mark) && !args.dry_run {
        history::set_meta(&mut ix.store, "last_retro", &now.to_rfc3339())?;
    }
    Ok(Outcome::Ok)
}
