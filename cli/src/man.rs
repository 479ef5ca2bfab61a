//! `<binary> man [--dir <DIR>]`: the manual. Without `--dir` the top page is printed;
//! with it, one page per subcommand (`runtime.1`, `runtime-fire.1`,
//! `builder-cards-list.1`, ...) is written for packaging, the way `git help` has a
//! page per command.

use crate::error::CommandError;
use anyhow::Context;
use std::path::{Path, PathBuf};

/// Print the man page, or write one page per subcommand into a directory
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Write the top page and one page per subcommand (nested ones too) into DIR (created if missing)
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

/// Prints the top page of `cmd`, or writes every page into `args.dir` and prints
/// their paths.
pub fn run(args: Args, cmd: clap::Command) -> Result<(), CommandError> {
    match args.dir {
        None => clap_mangen::Man::new(cmd).render(&mut std::io::stdout())?,
        Some(dir) => {
            for page in write_pages(cmd, &dir)? {
                println!("{}", page.display());
            }
        }
    }
    Ok(())
}

/// Writes one page per (visible) command of `cmd`'s tree into `dir`; returns their
/// paths, the top page first.
pub fn write_pages(cmd: clap::Command, dir: &Path) -> Result<Vec<PathBuf>, CommandError> {
    std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    clap_mangen::generate_to(cmd.clone(), dir).with_context(|| dir.display().to_string())?;
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut pages = Vec::new();
    collect(&cmd, dir, &mut pages);
    Ok(pages)
}

fn collect(cmd: &clap::Command, dir: &Path, out: &mut Vec<PathBuf>) {
    out.push(dir.join(format!("{}.1", cmd.get_display_name().unwrap_or(cmd.get_name()))));
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        collect(sub, dir, out);
    }
}
