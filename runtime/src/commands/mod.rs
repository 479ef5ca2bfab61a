//! The `runtime` command line: one module per subcommand, each with its `Args` (doc
//! comment = help text) beside its `run` function.

mod check;
mod fire;
mod resume;
mod runs;
mod show;

use crate::command_error::{self, CommandError, Outcome};
use crate::logging::LogFormat;
use clap::{CommandFactory, Parser, Subcommand};
use std::path::{Path, PathBuf};

pub use shared::worker::WORKER_COMMAND;

/// Fire agent tasks unattended, inside a sandbox, leaving reports, receipts and cards
#[derive(Debug, Parser)]
#[command(name = "runtime", version = cli::VERSION, propagate_version = true, after_help = command_error::exit_codes_help())]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, clap::Args)]
pub struct Global {
    /// Run as if started in <REPO> (like git -C)
    #[arg(short = 'C', global = true, value_name = "REPO", default_value = ".")]
    pub repo: PathBuf,
    /// Log more (-v info, -vv debug); logs go to stderr
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// Log line format
    #[arg(long, value_enum, default_value = "text", global = true)]
    pub log_format: LogFormat,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    Fire(fire::Args),
    Resume(resume::Args),
    Runs(runs::Args),
    Show(show::Args),
    Check(check::Args),
    /// Print shell completions
    Completions {
        /// The shell to complete for
        shell: clap_complete::Shell,
    },
    Man(cli::man::Args),
}

pub fn run(cli: Cli) -> Result<Outcome, CommandError> {
    command_error::forced_internal_error()?;
    let repo = &cli.global.repo;
    let verbose = cli.global.verbose > 0;
    match cli.command {
        Command::Fire(a) => fire::run(a, open_root(repo)?, verbose),
        Command::Resume(a) => resume::run(a, &resolve_root(repo)?, verbose),
        Command::Runs(a) => runs::run(a, &resolve_root(repo)?),
        Command::Show(a) => show::run(a, &resolve_root(repo)?),
        Command::Check(a) => check::run(a, &resolve_root(repo)?),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "runtime", &mut std::io::stdout());
            Ok(Outcome::Ok)
        }
        Command::Man(a) => cli::man::run(a, Cli::command()).map(|()| Outcome::Ok),
    }
}

/// The work-tree root of the repository containing `path` (the `-C` directory),
/// opened the one way every command does.
fn resolve_root(path: &Path) -> Result<PathBuf, CommandError> {
    Ok(open_root(path)?.root)
}

/// The work tree at `path`, opened as git does: a fire goes on with this handle.
fn open_root(path: &Path) -> Result<shared::git::WorkTree, CommandError> {
    Ok(shared::git::open_work_tree(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_subcommand_and_argument_has_help() {
        let mut cmd = Cli::command();
        cmd.build();
        let missing = cli::help::missing_help(&cmd, "runtime");
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }

    #[test]
    fn the_cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn man_dir_writes_a_page_per_subcommand() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("man1");
        let pages = cli::man::write_pages(Cli::command(), &out).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut expected: Vec<String> = Cli::command()
            .get_subcommands()
            .filter(|s| s.get_name() != "help")
            .map(|s| format!("runtime-{}.1", s.get_name()))
            .chain(["runtime.1".to_string()])
            .collect();
        expected.sort();
        assert_eq!(names, expected);
        assert!(names.contains(&"runtime-fire.1".to_string()));
        assert_eq!(pages.len(), names.len());
        for p in pages {
            let text = std::fs::read_to_string(&p).unwrap();
            assert!(text.contains("\n.TH "), "{} is a man page", p.display());
        }
        let fire = std::fs::read_to_string(out.join("runtime-fire.1")).unwrap();
        assert!(fire.contains("\\-\\-no\\-commit"), "the fire page lists its options");
    }
}
