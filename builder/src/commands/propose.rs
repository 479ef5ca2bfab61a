//! `builder propose <name>`: move the work tree's changes to builder-owned paths onto a
//! commit on `proposals/<name>`; the current branch does not move and is left clean of
//! those changes (DESIGN.md section 8, "Proposals").

use crate::command_error::{CommandError, Outcome};
use shared::review::{proposals, refuse_runtime};
use std::path::Path;

/// Propose the uncommitted changes to builder-owned paths for review
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The proposal's name (the branch is proposals/<name>)
    pub name: String,
    /// The commit message
    #[arg(short, long)]
    pub message: Option<String>,
    /// A card this proposal fixes (repeatable; becomes a Fixes-card: trailer)
    #[arg(long = "fixes", value_name = "CARD")]
    pub fixes: Vec<String>,
}

pub fn run(args: Args, repo_path: &Path) -> Result<Outcome, CommandError> {
    let wt = super::open_repo(repo_path)?;
    let (settings, ownership) = super::review_settings(&wt.root)?;
    let author = super::acting_identity(&wt.repo, "GIT_AUTHOR_NAME/GIT_AUTHOR_EMAIL")?;
    refuse_runtime(&author, &super::runtime_person(&settings), "propose")?;
    for card in &args.fixes {
        if shared::cards::work_tree_card_paths(&wt.root, card).is_empty() {
            return Err(
                CommandError::usage(format!("--fixes {card}: no card file cards/<day>/{card}.yaml"))
                    .hint("`builder cards list` shows cards; `builder cards show <id>` one of them"),
            );
        }
    }
    shared::review::links::refuse_in_work_tree(&wt.root, &settings, "propose")?;
    let message = args.message.unwrap_or_else(|| format!("Propose {}", args.name));
    let done = proposals::propose(
        &wt.repo,
        &wt.root,
        &ownership,
        &args.name,
        &message,
        &args.fixes,
        &author,
    )?;
    println!(
        "proposed {} as {} ({} path(s)): {}",
        done.branch,
        &done.commit.to_string()[..12],
        done.paths.len(),
        done.paths.join(", ")
    );
    println!("hint: another person approves it with `builder approve {}`", args.name);
    Ok(Outcome::Ok)
}
