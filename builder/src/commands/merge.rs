//! `builder merge <name>`: land an approved proposal on the current branch as a merge
//! commit (never a fast-forward) with `Reviewed-by:`, `Approved-tree:` and
//! `Fixes-card:` trailers, then triage each fixed card as fixed by the proposal (in
//! the work tree; the engineer commits the card files). A run after one that was
//! killed first settles what that one left; a proposal merged already is done.
//! `builder land` does the same against the remote's tip and pushes.

use crate::command_error::{CommandError, Outcome};
use shared::cards::{self, TriageDecision};
use shared::review::proposals;
use std::path::Path;

/// Merge an approved proposal into the current branch
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The proposal's name
    pub name: String,
}

pub fn run(args: Args, repo_path: &Path) -> Result<Outcome, CommandError> {
    let wt = super::open_repo(repo_path)?;
    // Judged by the protected branch's committed settings, as `approve` and `land` are:
    // a branch carrying a proposal's settings would make its author's rule the judge.
    let (settings, ownership) = super::protected_branch_settings(&wt)?;
    let actor = super::acting_identity(&wt.repo, "GIT_AUTHOR_NAME/GIT_AUTHOR_EMAIL")?;
    let rule = super::approval_rule(&settings)?;
    super::recover_interrupted(&wt)?;
    shared::review::links::refuse_in_proposal(&wt.repo, &args.name, "merge")?;
    let merged = proposals::merge(&wt.repo, &ownership, &args.name, &actor, &rule)?;
    if merged.already {
        println!(
            "proposals/{} is merged already (approved by {}): nothing to do",
            args.name, merged.approval.body.approver
        );
        return Ok(Outcome::Ok);
    }
    println!(
        "merged proposals/{} as {} (Reviewed-by: {}, Approved-tree: {})",
        args.name,
        shared::text::short_oid(merged.commit),
        merged.approval.body.approver,
        merged.approval.body.tree
    );
    triage_fixed(&wt.root, &args.name, &merged.fixes, &actor.to_string());
    println!(
        "hint: `builder land {}` merges onto the remote's tip and pushes in one step",
        args.name
    );
    Ok(Outcome::Ok)
}

/// Triages each card in `fixes` as fixed by the proposal `name`, in the work tree.
pub fn triage_fixed(root: &Path, name: &str, fixes: &[String], actor: &str) {
    let fixed_by = TriageDecision::FixedBy(format!("proposals/{name}"));
    let mut triaged = 0;
    for id in fixes {
        let paths = shared::cards::work_tree_card_paths(root, id);
        if paths.is_empty() {
            println!("card {id}: no card file here; not triaged");
            continue;
        }
        match cards::triage(root, &paths, &fixed_by, actor, None) {
            Ok(done) => triaged += done.len(),
            Err(e) => println!("card {id}: not triaged: {e}"),
        }
    }
    if triaged > 0 {
        println!("triaged {triaged} card(s) as fixed by proposals/{name}");
        println!("hint: commit the card files to share the triage (git add cards && git commit)");
    }
}
