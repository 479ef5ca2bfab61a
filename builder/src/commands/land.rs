//! `builder land <name>`: fetch, merge the approved proposal onto the remote's current
//! tip of the protected branch (settings `sync.branch`, else the remote's default
//! branch), push, and merge onto the new tip when the remote moved meanwhile (the
//! cron box pushed records): one command for the person who lands a change
//! ([`shared::review::land::land`]). This clone's branch follows when that is a
//! fast-forward.

use crate::command_error::{CommandError, Outcome};
use shared::review::land::{self, LocalBranch};
use std::path::Path;

/// Merge an approved proposal onto the remote's tip and push it
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The proposal's name
    pub name: String,
    /// The remote (default: settings sync.remote, the branch's upstream, or origin)
    #[arg(long, value_name = "NAME")]
    pub remote: Option<String>,
}

pub fn run(args: Args, repo_path: &Path) -> Result<Outcome, CommandError> {
    let wt = super::open_repo(repo_path)?;
    let actor = super::acting_identity(&wt.repo, "GIT_AUTHOR_NAME/GIT_AUTHOR_EMAIL")?;
    super::recover_interrupted(&wt)?;
    // The branch's own settings, not the work tree's: a CI job landing the proposal
    // it checked out would otherwise judge its approval by the proposal's rule.
    let (settings, remote) = super::settings_to_land_by(&wt, args.remote.as_deref())?;
    let rule = super::approval_rule(&settings)?;
    let branch = shared::review::remote::protected_branch(&wt.repo, &remote, settings.sync.as_ref());
    let landed = land::land(&wt.repo, &wt.root, &args.name, &actor, &rule, &remote, &branch)?;
    if landed.already {
        println!(
            "{remote}/{branch} has proposals/{} already (at {}): nothing to push",
            args.name,
            shared::text::short_oid(landed.commit)
        );
    } else {
        println!(
            "landed proposals/{} on {remote}/{branch} as {} (merged onto {}; {} push(es); Reviewed-by: {})",
            args.name,
            shared::text::short_oid(landed.commit),
            shared::text::short_oid(landed.onto),
            landed.tries,
            landed.approval.as_ref().map(|a| a.body.approver.as_str()).unwrap_or("")
        );
    }
    if landed.approvals_pushed > 0 {
        println!("pushed {} approval(s) {remote} lacked", landed.approvals_pushed);
    }
    match landed.local {
        LocalBranch::FastForwarded => println!("{branch} (checked out) moved to it"),
        LocalBranch::Moved => println!("{branch} moved to it"),
        LocalBranch::Unchanged | LocalBranch::Absent => {}
        LocalBranch::Diverged => {
            println!("hint: your {branch} has commits {remote} lacks: `git pull` merges the landed change into it")
        }
    }
    if matches!(landed.local, LocalBranch::FastForwarded) {
        super::merge::triage_fixed(&wt.root, &args.name, &landed.fixes, &actor.to_string());
    } else if !landed.fixes.is_empty() {
        println!(
            "hint: it fixes card(s) {}: `builder cards triage` them once your branch has the merge",
            landed.fixes.join(", ")
        );
    }
    Ok(Outcome::Ok)
}
