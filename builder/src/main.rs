//! `builder`: the engineer's side of an agent repository: scaffold, lint, triage the
//! runtime's cards, read run history, review prompt changes and audit git history.
//! `main` parses, sets up logging, dispatches to one module per subcommand, and turns
//! the result into the exit code (`command_error`, the only place codes are decided).

#![forbid(unsafe_code)]

mod command_error;
mod commands;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    restore_sigpipe();
    let cli = commands::Cli::parse();
    let level = match cli.global.verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("BUILDER_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    // Redacted as the runtime's are (`builder mcp pin` sends a server its token).
    cli::log::redact_secret_like_env();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| cli::log::RedactingStderr { before: || {} })
        .with_target(false)
        .try_init();
    shared::git::cache_large_trees();
    // Named crash points (builds for tests only: `failpoints`), as the runtime arms them.
    shared::failpoints::arm();
    let result = commands::run(cli);
    if let Err(e) = &result {
        e.print("builder");
    }
    ExitCode::from(command_error::exit_code(&result))
}

/// `runtime runs | head` should end quietly like any Unix tool, not panic on a closed
/// pipe: restore the default SIGPIPE action Rust replaces at start-up. (A fire prints
/// only after its records are written and committed.)
fn restore_sigpipe() {
    kernel::signal::restore_default(kernel::signal::Signal::Pipe);
}
