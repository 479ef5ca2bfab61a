//! `builder install-hooks`: add the non-forced approvals refspec
//! `refs/builder/approved/*:refs/builder/approved/*` to every remote's fetch and push
//! refspecs (replacing the forced `+refs/builder/*` of earlier versions), keep fetches
//! from pruning approvals, set `pull.rebase false` so `git pull` keeps merges, convert
//! a legacy approvals chain once, and install the pre-push hook that judges the new
//! commits pushed to the protected branch and fails closed without `builder` on PATH
//! ([`shared::review::hooks`]).

use crate::command_error::{CommandError, Outcome};
use shared::review::hooks::{self, HookState};
use std::path::Path;

/// Carry approvals with fetch and push, keep merges on pull, judge what is pushed
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args, repo_path: &Path) -> Result<Outcome, CommandError> {
    let wt = super::open_repo(repo_path)?;
    super::recover_interrupted(&wt)?;
    let done = hooks::install(&wt.repo)?;
    print_installed(&done);
    let hook = done.hook.display();
    match done.hook_state {
        HookState::Created => println!("installed {hook}"),
        HookState::Updated => println!("updated {hook}"),
        HookState::Unchanged => println!("{hook} is up to date"),
        HookState::Foreign => {
            eprintln!("warning: {hook} exists and was not written by builder: left alone");
            eprintln!("hint: add `builder audit || exit 1` to it so pushes are audited");
        }
    }
    // The hook as installed is the intended one: the next fire does not refuse it as
    // changed. A foreign hook left alone is not accepted here (`builder audit
    // --accept-metadata` does that); the builder files' entries stay as accepted.
    let written: &[&str] = match done.hook_state {
        HookState::Foreign => &[],
        HookState::Created | HookState::Updated | HookState::Unchanged => &["pre-push"],
    };
    let ownership = shared::layout::Ownership::new(&wt.root);
    if shared::manifest::accept_hooks(&wt.repo, &wt.root, &ownership, written)? {
        println!("recorded {} as intended in the metadata manifest", done.hook.display());
    }
    if done.refspecs.is_empty() && wt.repo.remotes()?.is_empty() {
        println!("no remotes yet: run `builder install-hooks` again after `git remote add`");
    }
    Ok(Outcome::Ok)
}

/// Prints what [`hooks::install`] changed in the repository's config and approvals.
pub fn print_installed(done: &hooks::Installed) {
    for r in &done.removed {
        println!("removed {r} (forced: a fetch could replace approvals not pushed yet)");
    }
    for r in &done.refspecs {
        println!("added {r}");
    }
    for s in &done.settings {
        match s.split_once(' ') {
            Some(("pull.rebase", _)) => println!(
                "set {s}: `git pull` merges the remote's new commits and keeps an approved merge as it is (a rebase would flatten it and the pre-push hook would refuse it)"
            ),
            Some((key, _)) if key.ends_with(".prune") => {
                println!("set {s}: a fetch never deletes approvals the remote no longer has")
            }
            _ => println!("set {s}"),
        }
    }
    if done.adopted > 0 {
        println!(
            "converted {} approval(s) of the legacy chain {} into refs of their own",
            done.adopted,
            shared::review::APPROVALS_REF
        );
    }
}
