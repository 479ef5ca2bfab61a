//! `runtime fire <task>`: one fire. Preparation runs single-threaded, then the process
//! enters its Landlock sandbox, and only then is the async runtime built for the loop.

use crate::command_error::{self, CommandError, Outcome};
use shared::fire::{self, FireEnd, FireOptions, FireSummary};
use std::io::IsTerminal;
use std::path::Path;

/// Fire a task once
#[derive(Debug, clap::Args)]
#[command(after_help = command_error::exit_codes_help())]
pub struct Args {
    /// Task name (prompts/<task>.md)
    pub task: String,
    /// Write the records but do not commit them
    #[arg(long)]
    pub no_commit: bool,
    /// Print the result as JSON on stdout
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args, root: &Path, verbose: bool) -> Result<Outcome, CommandError> {
    let out = Output {
        json: args.json,
        verbose,
    };
    fire_task(root, args.task, args.no_commit, None, out)
}

/// How a fire's outcome is printed.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// The summary as JSON on stdout.
    pub json: bool,
    /// `-v`: a skipped fire says so only then.
    pub verbose: bool,
}

/// One fire, fresh or resumed; shared by `fire` and `resume`.
pub fn fire_task(
    root: &Path,
    task: String,
    no_commit: bool,
    resume: Option<String>,
    out: Output,
) -> Result<Outcome, CommandError> {
    let exe = std::env::current_exe()?;
    let opts = FireOptions {
        root: root.to_path_buf(),
        task,
        no_commit,
        worker_cmd: (exe, vec![super::WORKER_COMMAND.to_string()]),
        resume,
    };
    let summary = match fire::prepare(opts) {
        Err(early) => early.finish(),
        Ok(mut run) => {
            if run.enter_sandbox().is_ok() {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                // An abort inside the loop phase is recorded by `finish` below.
                let _ = rt.block_on(async {
                    let (tx, rx) = tokio::sync::watch::channel(false);
                    tokio::spawn(async move {
                        use tokio::signal::unix::{signal, SignalKind};
                        let (Ok(mut term), Ok(mut int)) =
                            (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
                        else {
                            return;
                        };
                        tokio::select! {
                            _ = term.recv() => {}
                            _ = int.recv() => {}
                        }
                        tracing::warn!("signal received; ending the fire as cancelled");
                        let _ = tx.send(true);
                    });
                    run.run(rx).await
                });
            }
            run.finish()
        }
    };
    let result = command_error::fire_outcome(&summary);
    print(&summary, command_error::exit_code(&result), out);
    result
}

fn print(s: &FireSummary, exit_code: u8, out: Output) {
    if out.json {
        // The summary and the exit code it leads to.
        let mut value = serde_json::to_value(s).unwrap_or_default();
        value["exit_code"] = exit_code.into();
        println!("{}", serde_json::to_string_pretty(&value).unwrap_or_default());
        return;
    }
    let line = format!(
        "{} {} {} ({}) report={} receipt={} cards={}{}",
        s.task,
        s.run_id,
        s.status.as_str(),
        s.stop_reason.as_str(),
        s.report.as_deref().unwrap_or("-"),
        s.receipt.as_deref().unwrap_or("-"),
        s.cards.len(),
        s.commit
            .as_deref()
            .map(|c| format!(" commit={}", &c[..c.len().min(12)]))
            .unwrap_or_default()
    );
    // Cron mails whatever is printed: a success prints only at a terminal, a skip
    // only with -v; everything else says what happened and what to do next.
    let tag = match s.end {
        FireEnd::Completed => {
            if std::io::stdout().is_terminal() {
                println!("{line}");
            }
            return;
        }
        FireEnd::Skipped => {
            if out.verbose {
                eprintln!("skipped: {} ({})", s.message, s.task);
            }
            return;
        }
        FireEnd::NeedsAttention => "attention",
        FireEnd::WaitingApproval => "waiting",
        FireEnd::Failed => "error",
        // `main` prints the error and its hint; the records line goes first.
        FireEnd::InvalidInput | FireEnd::Environment | FireEnd::Internal => {
            if s.receipt.is_some() {
                eprintln!("{line}");
            }
            return;
        }
    };
    eprintln!("{tag}: {}", s.message);
    if s.receipt.is_some() {
        eprintln!("{line}");
    }
    if let Some(hint) = &s.hint {
        eprintln!("hint: {hint}");
    }
}
