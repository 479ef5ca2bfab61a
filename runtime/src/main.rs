//! `runtime`: fires agent tasks unattended. `main` parses arguments, sets up quiet
//! logging (cron mails whatever is printed), and dispatches; commands that need an
//! async runtime build it themselves *after* entering the Landlock sandbox, because
//! Landlock restricts only the calling thread and what it creates afterwards. The
//! exit code is decided in one place, `command_error::exit_code`.

#![forbid(unsafe_code)]

mod command_error;
mod commands;
mod logging;
mod progress;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    // No core dump of the runtime (it holds the provider's key) or of the tool worker
    // (the same binary), and no reading either's memory through /proc or ptrace.
    if let Err(e) = kernel::hardening::forbid_core_dumps() {
        eprintln!("error: {e}");
        return ExitCode::from(1);
    }
    // The tool worker enters its sandbox before anything else runs in its process.
    if std::env::args().nth(1).as_deref() == Some(commands::WORKER_COMMAND) {
        if let Err(e) = shared::worker::die_with_runtime() {
            eprintln!("error: tool worker: {e}");
            return ExitCode::from(1);
        }
        let stdin = std::io::stdin();
        let stdout = std::io::stdout();
        return match shared::worker::serve(stdin.lock(), stdout.lock()) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: tool worker: {e}");
                ExitCode::from(command_error::exit::INTERNAL)
            }
        };
    }
    restore_sigpipe();
    let cli = commands::Cli::parse();
    logging::init(cli.global.verbose, cli.global.log_format);
    shared::git::cache_large_trees();
    shared::failpoints::arm();
    let result = commands::run(cli);
    if let Err(e) = &result {
        e.print("runtime");
    }
    ExitCode::from(command_error::exit_code(&result))
}

/// `runtime runs | head` should end quietly like any Unix tool, not panic on a closed
/// pipe: restore the default SIGPIPE action Rust replaces at start-up. (A fire prints
/// only after its records are written and committed.)
fn restore_sigpipe() {
    kernel::signal::restore_default(kernel::signal::Signal::Pipe);
}
