//! `builder init [<path>]`: scaffold an agent repository; never overwrites a file.

use crate::command_error::{CommandError, Outcome};
use std::path::{Path, PathBuf};

/// Scaffold an agent repo (layout, example task, .gitignore, hooks as install-hooks)
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Where to create it (default: the -C directory)
    pub path: Option<PathBuf>,
}

pub fn run(args: Args, repo: &Path) -> Result<Outcome, CommandError> {
    let target = args.path.unwrap_or_else(|| repo.to_path_buf());
    let report = shared::scaffold::init(&target)?;
    if report.git_initialised {
        println!("initialised a git repository in {}", target.display());
    }
    for c in &report.created {
        println!("created {}", c.display());
    }
    if let Some(hooks) = &report.hooks {
        super::install_hooks::print_installed(hooks);
        if hooks.hook_state == shared::review::hooks::HookState::Foreign {
            eprintln!(
                "warning: {} exists and was not written by builder: left alone",
                hooks.hook.display()
            );
        }
    }
    if report.created.is_empty() {
        println!("nothing to do: every file already exists");
    } else {
        println!(
            "next: commit the scaffold, then `builder check -C {0}` and `runtime fire digest -C {0}`",
            target.display()
        );
    }
    Ok(Outcome::Ok)
}
