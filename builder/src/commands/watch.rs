//! `builder watch`: print each new card and receipt as it lands (a local fire or a
//! `git pull`), using filesystem notifications. Ctrl-C ends it cleanly.

use crate::command_error::{CommandError, Outcome};
use anyhow::Context;
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

pub fn run(args: Args, repo: &Path) -> Result<Outcome, CommandError> {
    let root = super::open_repo(repo)?.root;
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    ctrlc::set_handler(move || s.store(true, Ordering::SeqCst)).context("installing the Ctrl-C handler")?;
    let (tx, rx) = mpsc::channel();
    let mut watcher = notify::recommended_watcher(tx).context("starting the file watcher")?;
    for d in ["cards", "runs"] {
        let p = root.join(d);
        std::fs::create_dir_all(&p).with_context(|| p.display().to_string())?;
        watcher
            .watch(&p, RecursiveMode::Recursive)
            .with_context(|| format!("watching {}", p.display()))?;
    }
    eprintln!(
        "watching {}/cards and {}/runs (Ctrl-C to stop)",
        root.display(),
        root.display()
    );
    let mut seen = std::collections::HashSet::new();
    // Files seen half-written, retried on every tick until they parse.
    let mut pending: std::collections::BTreeSet<std::path::PathBuf> = Default::default();
    // New directories are rescanned for a while: files created in them before their
    // watch was in place produce no event of their own.
    let mut fresh_dirs: Vec<(std::path::PathBuf, std::time::Instant)> = Vec::new();
    while !stop.load(Ordering::SeqCst) {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(Ok(event)) => {
                if matches!(event.kind, EventKind::Create(_) | EventKind::Modify(_) | EventKind::Any) {
                    // A new directory (a new day, or a `git pull`) may already hold
                    // records written before its watch was added: look inside.
                    for p in event.paths {
                        if p.is_dir() {
                            fresh_dirs.push((p.clone(), std::time::Instant::now()));
                        }
                        let mut files = Vec::new();
                        collect_files(&p, &mut files);
                        pending.extend(files);
                    }
                }
            }
            Ok(Err(e)) => tracing::warn!("watch error: {e}"),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        fresh_dirs.retain(|(_, at)| at.elapsed() < Duration::from_secs(5));
        for (dir, _) in &fresh_dirs {
            let mut files = Vec::new();
            collect_files(dir, &mut files);
            pending.extend(files);
        }
        let candidates: Vec<std::path::PathBuf> = std::mem::take(&mut pending).into_iter().collect();
        for path in candidates {
            let rel = path.strip_prefix(&root).unwrap_or(&path).to_string_lossy().into_owned();
            if seen.contains(&rel) {
                continue;
            }
            match describe(&path, &rel, args.json) {
                Some(Some(line)) => {
                    seen.insert(rel);
                    // One line per record: a newline or escape in a field stays visible.
                    if args.json {
                        println!("{}", shared::text::printable_json(&line));
                    } else {
                        println!("{}", shared::text::printable(&line));
                    }
                    use std::io::Write;
                    let _ = std::io::stdout().flush();
                }
                Some(None) => {
                    pending.insert(path);
                }
                None => {}
            }
        }
    }
    Ok(Outcome::Ok)
}

fn collect_files(p: &Path, out: &mut Vec<std::path::PathBuf>) {
    if p.is_dir() {
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                collect_files(&e.path(), out);
            }
        }
    } else {
        out.push(p.to_path_buf());
    }
}

/// The line to print for a record file: `None` when it is not a record, `Some(None)`
/// when it does not parse yet (still being written).
fn describe(path: &Path, rel: &str, json: bool) -> Option<Option<String>> {
    if rel.starts_with("cards/") && rel.ends_with(".yaml") {
        Some(shared::records::read_card(path).ok().map(|c| {
            if json {
                serde_json::json!({"type": "card", "path": rel, "id": c.id, "kind": c.kind.as_str(), "task": c.task, "summary": c.summary}).to_string()
            } else {
                format!("card    {} {} {}: {}", c.kind.as_str(), c.task, c.id, c.summary)
            }
        }))
    } else if rel.starts_with("runs/") && rel.ends_with(".json") {
        Some(shared::records::read_receipt(path).ok().map(|r| {
            if json {
                serde_json::json!({"type": "receipt", "path": rel, "run_id": r.run_id, "task": r.task, "status": r.status.as_str(), "stop_reason": r.stop_reason.as_str()}).to_string()
            } else {
                format!("receipt {} {} {} ({}), {} steps, ${:.4}", r.task, r.run_id, r.status.as_str(), r.stop_reason.as_str(), r.steps, r.cost_usd)
            }
        }))
    } else {
        None
    }
}
