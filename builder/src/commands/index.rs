//! Opening the repository and bringing the history index up to date, shared by every
//! command that reads runs or cards. Shows a progress bar on a terminal when there is
//! a lot to index (a first index of a large repo); prints nothing otherwise.

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
