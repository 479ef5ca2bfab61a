//! `runtime fire <task>`: one fire. Preparation runs single-threaded, then the process
//! enters its Landlock sandbox, and only then is the async runtime built for the loop.

use shared::fire::{self, FireEnd, FireOptions, FireSummary};
use std::io::IsTerminal;
use std::path::Path;

/// Fire a task once; exit 0 done, 1 failed, 2 bad config, 3 skipped, 4 waiting approval
#[derive(Debug, clap::Args)]
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

pub fn run(args: Args, root: &Path) -> anyhow::Result<i32> {
    fire_task(root, args.task.clone(), args.no_commit, args.json, None)
}

/// One fire, fresh or resumed; shared by `fire` and `resume`.
pub fn fire_task(
    root: &Path,
    task: String,
    no_commit: bool,
    json: bool,
    resume: Option<String>,
) -> anyhow::Result<i32> {
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
    let code = exit_code(summary.end);
    print(&summary, code, json);
    Ok(code)
}

/// The exit code of a fire that ended as `end` (DESIGN.md section 7).
pub fn exit_code(end: FireEnd) -> i32 {
    match end {
        FireEnd::Completed => 0,
        FireEnd::Failed | FireEnd::Environment => 1,
        FireEnd::InvalidInput => 2,
        FireEnd::Skipped => 3,
        FireEnd::WaitingApproval => 4,
        FireEnd::Internal => 70,
    }
}

fn print(s: &FireSummary, exit_code: i32, json: bool) {
    if json {
        // The summary and the exit code it leads to.
        let mut out = serde_json::to_value(s).unwrap_or_default();
        out["exit_code"] = exit_code.into();
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return;
    }
    let ok = s.end == FireEnd::Completed;
    // Quiet for cron on success; a person at a terminal gets one line.
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
    if ok {
        println!("{line}");
    } else {
        eprintln!("error: {}", s.message);
        eprintln!("{line}");
        if !s.cards.is_empty() {
            eprintln!("hint: `builder cards list` shows the cards; the receipt has the details");
        }
    }
}
