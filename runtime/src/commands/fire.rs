//! `runtime fire <task>`: one fire. Preparation runs single-threaded, then the process
//! enters its Landlock sandbox, and only then is the async runtime built for the loop.

use crate::command_error::{self, CommandError, Outcome};
use shared::fire::{self, FireOptions, FireSummary, Prepared};
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

/// How a fire reports itself.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// The summary as JSON on stdout.
    pub json: bool,
    /// `-v`: also say so when the fire was skipped.
    pub verbose: bool,
}

pub fn run(args: Args, root: &Path, verbose: bool) -> Result<Outcome, CommandError> {
    let output = Output {
        json: args.json,
        verbose,
    };
    fire_task(root, args.task, args.no_commit, output, None)
}

/// One fire, fresh or resumed; shared by `fire` and `resume`.
pub fn fire_task(
    root: &Path,
    task: String,
    no_commit: bool,
    output: Output,
    resume: Option<String>,
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
        Prepared::Done(s) => s,
        Prepared::Ready(mut run) => match run.enter_sandbox() {
            Some(s) => s,
            None => {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                let early = rt.block_on(async {
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
                match early {
                    Some(s) => s,
                    None => run.finish(),
                }
            }
        },
    };
    let result = command_error::fire_outcome(summary.exit_code, &summary.message);
    print(&summary, &result, output);
    result.map_err(|e| {
        if summary.cards.is_empty() {
            e
        } else {
            e.hint(CARDS_HINT)
        }
    })
}

const CARDS_HINT: &str = "`builder cards list` shows the cards; the receipt has the details";

fn print(s: &FireSummary, result: &Result<Outcome, CommandError>, output: Output) {
    if output.json {
        println!("{}", serde_json::to_string_pretty(s).unwrap_or_default());
        return;
    }
    let ok = matches!(result, Ok(Outcome::Ok));
    // Quiet for cron on success and on a skip; a person at a terminal gets one line.
    if ok && !std::io::stdout().is_terminal() {
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
    match result {
        Ok(Outcome::Ok) => println!("{line}"),
        Ok(Outcome::Skipped) => {
            if output.verbose {
                eprintln!("skipped: {}", s.message);
                eprintln!("{line}");
            }
        }
        Ok(Outcome::Failed | Outcome::Waiting | Outcome::NeedsAttention) => {
            eprintln!("error: {}", s.message);
            eprintln!("{line}");
            if !s.cards.is_empty() {
                eprintln!("hint: {CARDS_HINT}");
            }
        }
        // `main` prints the error and its hints.
        Err(_) => eprintln!("{line}"),
    }
}
