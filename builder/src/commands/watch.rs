//! `builder watch`: print each new card and receipt as it lands (a local fire or a
//! `git pull`), using filesystem notifications. Ctrl-C ends it cleanly.

use notify::{EventKind, RecursiveMode, Watcher};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// Follow new cards and receipts as they land
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print one JSON object per line
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args, repo: &Path) -> anyhow::Result<i32> {
    let root = git2::Repository::discover(repo)
        .ok()
        .and_then(|r| r.workdir().map(Path::to_path_buf))
        .unwrap_or_else(|| repo.to_path_buf());
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    ctrlc::set_handler(move || s.store(true, Ordering::SeqCst))?;
    let (tx, rx) = mpsc::channel();
    let mut watcher = notify::recommended_watcher(tx)?;
    for d in ["cards", "runs"] {
        let p = root.join(d);
        std::fs::create_dir_all(&p)?;
        watcher.watch(&p, RecursiveMode::Recursive)?;
    }
    eprintln!(
        "watching {}/cards and {}/runs (Ctrl-C to stop)",
        root.display(),
        root.display()
    );
    let mut seen = std::collections::HashSet::new();
    while !stop.load(Ordering::SeqCst) {
        let event = match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(Ok(e)) => e,
            Ok(Err(e)) => {
                tracing::warn!("watch error: {e}");
                continue;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        };
        if !matches!(event.kind, EventKind::Create(_) | EventKind::Modify(_)) {
            continue;
        }
        for path in event.paths {
            let rel = path.strip_prefix(&root).unwrap_or(&path).to_string_lossy().into_owned();
            let is_card = rel.starts_with("cards/") && rel.ends_with(".yaml");
            let is_receipt = rel.starts_with("runs/") && rel.ends_with(".json");
            if !(is_card || is_receipt) || seen.contains(&rel) {
                continue;
            }
            // Records are written in one go; wait until this one parses.
            let line = if is_card {
                match shared::records::read_card(&path) {
                    Ok(c) => {
                        if args.json {
                            serde_json::json!({"type": "card", "path": rel, "id": c.id, "kind": c.kind.as_str(), "task": c.task, "summary": c.summary}).to_string()
                        } else {
                            format!("card    {} {} {}: {}", c.kind.as_str(), c.task, c.id, c.summary)
                        }
                    }
                    Err(_) => continue,
                }
            } else {
                match shared::records::read_receipt(&path) {
                    Ok(r) => {
                        if args.json {
                            serde_json::json!({"type": "receipt", "path": rel, "run_id": r.run_id, "task": r.task, "status": r.status.as_str(), "stop_reason": r.stop_reason.as_str()}).to_string()
                        } else {
                            format!(
                                "receipt {} {} {} ({}), {} steps, ${:.4}",
                                r.task,
                                r.run_id,
                                r.status.as_str(),
                                r.stop_reason.as_str(),
                                r.steps,
                                r.cost_usd
                            )
                        }
                    }
                    Err(_) => continue,
                }
            };
            seen.insert(rel);
            println!("{line}");
            use std::io::Write;
            let _ = std::io::stdout().flush();
        }
    }
    Ok(0)
}
