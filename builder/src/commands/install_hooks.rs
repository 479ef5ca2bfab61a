//! `builder install-hooks`: add `+refs/builder/*:refs/builder/*` to every remote's
//! fetch and push refspecs (approvals travel with the branch) and install the pre-push
//! hook that runs `builder audit` and fails closed without `builder` on PATH.

use crate::command_error::{CommandError, Outcome};
use shared::review::hooks::{self, HookState};
use std::path::Path;

/// Carry approvals with fetch and push, and audit before every push
#[derive(Debug, clap::Args)]
pub struct Args {}

pub fn run(_args: Args, repo_path: &Path) -> Result<Outcome, CommandError> {
    let wt = super::open_repo(repo_path)?;
    let done = hooks::install(&wt.repo)?;
    for r in &done.refspecs {
        println!("added {r}");
    }
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
