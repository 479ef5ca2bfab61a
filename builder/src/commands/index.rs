//! Opening the repository and bringing the history index up to date, shared by every
//! command that reads runs or cards, and checking the filters those commands take
//! against it. Shows a progress bar on a terminal when there is a lot to index (a
//! first index of a large repo); prints nothing otherwise.

use crate::command_error::CommandError;
use indicatif::{ProgressBar, ProgressStyle};
use shared::history::{self, IndexStats};
use shared::store::Store;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

pub struct Indexed {
    pub repo: git2::Repository,
    pub store: Store,
    pub root: PathBuf,
    pub stats: IndexStats,
}

pub fn open(path: &Path) -> Result<Indexed, CommandError> {
    let shared::git::WorkTree { repo, root } = super::open_repo(path)?;
    let mut store = history::open_store(&root)?;
    let bar = std::io::stderr().is_terminal().then(|| {
        let b = ProgressBar::hidden();
        b.set_style(
            ProgressStyle::with_template("indexing {bar:40} {pos}/{len} records")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        b
    });
    let progress = |done: u64, total: u64| {
        if let Some(b) = &bar {
            if total > 2000 && b.is_hidden() {
                b.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            }
            b.set_length(total);
            b.set_position(done);
        }
    };
    let stats = history::index(&repo, &mut store, &progress)?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    for s in &stats.skipped {
        tracing::warn!("skipped a record that does not parse: {s}");
    }
    Ok(Indexed {
        repo,
        store,
        root,
        stats,
    })
}

/// [`open`], then the work tree's card files overlaid, so triage status is what the
/// card files say (an uncommitted triage shows, a checked-out one is gone): for every
/// command that reads cards.
pub fn open_with_cards(path: &Path) -> Result<Indexed, CommandError> {
    let mut ix = open(path)?;
    ix.stats.overlaid_cards = history::overlay_worktree_cards(&ix.repo, &mut ix.store, &mut ix.stats.skipped)?;
    Ok(ix)
}

/// A `--since` value as the index compares it; anything but a date or an RFC 3339
/// time is a usage error.
pub fn since(value: Option<String>) -> Result<Option<String>, CommandError> {
    value
        .map(|v| {
            history::parse_since(&v).ok_or_else(|| {
                CommandError::usage(format!("--since `{v}` is not a date (YYYY-MM-DD) or RFC 3339 time"))
                    .hint("for example --since 2026-01-31 or --since 2026-01-31T08:00:00Z")
            })
        })
        .transpose()
}

/// A task name must be one the repository knows (a prompt, or runs or cards of it in
/// the index); otherwise a usage error with the closest known name.
pub fn known_task(ix: &Indexed, task: &str) -> Result<(), CommandError> {
    let known = history::known_tasks(&ix.root, &ix.store)?;
    if known.iter().any(|k| k == task) {
        return Ok(());
    }
    let hint = match shared::prompt::closest_task(task, &known) {
        Some(close) => format!("did you mean `{close}`?"),
        None if known.is_empty() => "this repository has no tasks yet: add prompts/<task>.md".to_string(),
        None => format!("known tasks: {}", known.join(", ")),
    };
    Err(CommandError::usage(format!(
        "no task `{task}`: no prompts/{task}.md and no runs or cards of it in the history index"
    ))
    .hint(hint))
}
