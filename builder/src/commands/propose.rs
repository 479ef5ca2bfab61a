//! `builder propose <name>`: move the work tree's changes to builder-owned paths onto a
//! commit on `proposals/<name>`; the current branch does not move and is left clean of
//! those changes (docs/design.md). `--push` publishes the branch
//! (with its upstream set), so reviewers' clones see it after a fetch. A run after one
//! that was killed first finishes what that one left.

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
    /// Push the proposal branch to the remote (with its upstream set)
    #[arg(long)]
    pub push: bool,
    /// The remote (default: settings sync.remote, the branch's upstream, or origin)
    #[arg(long, value_name = "NAME")]
    pub remote: Option<String>,
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
    let recovered = super::recover_interrupted(&wt)?;
    let remote = super::team_remote(&wt.repo, args.remote.as_deref(), &settings, args.push)?;
    let branch = format!("{}{}", shared::review::PROPOSAL_PREFIX, args.name);
    if recovered.finished_proposal(&branch) {
        println!("finished the interrupted proposal {branch}");
        return publish(&wt, &branch, remote.as_deref(), args.push, &args.name);
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
        shared::text::short_oid(done.commit),
        done.paths.len(),
        done.paths.join(", ")
    );
    publish(&wt, &branch, remote.as_deref(), args.push, &args.name)
}

/// Pushes the proposal branch when asked (setting its upstream), else says how.
fn publish(
    wt: &shared::git::WorkTree,
    branch: &str,
    remote: Option<&str>,
    push: bool,
    name: &str,
) -> Result<Outcome, CommandError> {
    match (remote, push) {
        (Some(r), true) => {
            let spec = format!("refs/heads/{branch}:refs/heads/{branch}");
            match shared::review::remote::push(&wt.root, r, &[spec])? {
                shared::review::remote::Pushed::Done => {}
                shared::review::remote::Pushed::Moved(why) => {
                    return Err(CommandError::from(shared::review::ReviewError::Refused(format!(
                        "{r} refused {branch}: {why}"
                    )))
                    .hint(format!("someone else pushed a proposal of that name: pick another name, or `git fetch {r}` and look at {r}/{branch}")));
                }
            }
            let mut config = wt.repo.config()?;
            config.set_str(&format!("branch.{branch}.remote"), r)?;
            config.set_str(&format!("branch.{branch}.merge"), &format!("refs/heads/{branch}"))?;
            println!("pushed {branch} to {r}");
            println!("hint: another person approves it with `builder approve {name} --push`, then anyone lands it with `builder land {name}`");
        }
        (Some(r), false) => {
            println!("hint: publish it for review with `git push -u {r} {branch}` (or propose with --push)");
            println!("hint: another person approves it with `builder approve {name} --push`");
        }
        (None, _) => println!("hint: another person approves it with `builder approve {name}`"),
    }
    Ok(Outcome::Ok)
}
