//! The `runtime` command line: one module per subcommand, each with its `Args` (doc
//! comment = help text) beside its `run` function.

mod check;
mod fire;
mod resume;
mod runs;
mod show;

use crate::logging::LogFormat;
use clap::{CommandFactory, Parser, Subcommand};
use std::path::PathBuf;

/// Hidden subcommand that starts the sandboxed tool worker.
pub const WORKER_COMMAND: &str = "__tool-worker";

/// Fire agent tasks unattended, inside a sandbox, leaving reports, receipts and cards
#[derive(Debug, Parser)]
#[command(name = "runtime", version, propagate_version = true)]
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
        shell: clap_complete::Shell,
    },
    /// Print the man page
    Man,
}

pub fn run(cli: Cli) -> anyhow::Result<i32> {
    let root = resolve_root(&cli.global.repo)?;
    match cli.command {
        Command::Fire(a) => fire::run(a, &root, cli.global.verbose),
        Command::Resume(a) => resume::run(a, &root, cli.global.verbose),
        Command::Runs(a) => runs::run(a, &root),
        Command::Show(a) => show::run(a, &root),
        Command::Check(a) => check::run(a, &root),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "runtime", &mut std::io::stdout());
            Ok(0)
        }
        Command::Man => {
            clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?;
            Ok(0)
        }
    }
}

/// The work-tree root of the repository containing `path`, or `path` itself when it
/// is not in one (commands that need git report that themselves).
fn resolve_root(path: &std::path::Path) -> anyhow::Result<PathBuf> {
    let abs = std::fs::canonicalize(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(match git2::Repository::discover(&abs) {
        Ok(r) => r.workdir().map(|w| w.to_path_buf()).unwrap_or(abs),
        Err(_) => abs,
    }
    .canonicalize()?)
}
