//! The runtime's own overhead per fire: the release `runtime fire` binary on the
//! replay provider (no model latency), a 10-step tool run, records and commit
//! included. Two of the ten steps run external commands (`git log`, `ls`); their own
//! run time is measured separately and subtracted, as it is the tools' cost, not the
//! runtime's. Then the same fire with no tool call (the tool worker still starts in
//! its namespaces), and that fire phase by phase (the runtime's debug spans). Targets:
//! median overhead at most 25 ms for each, peak RSS at most 40 MB. Prints the numbers
//! (raw and net); exits 1 if a target is missed.

#![forbid(unsafe_code)]
// Benchmark code is test code: a failed setup step should panic and stop the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const FIRES: usize = 40;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    shared::scaffold::init(&root).unwrap();
    let calls = [
        ("list_dir", r#"{"path": "."}"#),
        ("read_file", r#"{"path": "prompts/digest.md"}"#),
        ("list_dir", r#"{"path": "prompts"}"#),
        ("grep", r#"{"pattern": "digest", "path": "prompts"}"#),
        ("read_file", r#"{"path": "scope/SCOPE.md"}"#),
        ("run_command", r#"{"command": "git log --oneline -n 3"}"#),
        ("list_dir", r#"{"path": "tools"}"#),
        ("read_file", r#"{"path": "settings/runtime.yaml"}"#),
        ("run_command", r#"{"command": "ls reports"}"#),
        ("list_dir", r#"{"path": "evals"}"#),
    ];
    let mut turns: Vec<String> = calls.iter().enumerate().map(|(i, (n, a))| format!(r#"{{"tool_calls": [{{"id": "c{i}", "name": "{n}", "arguments": {a}}}], "usage": {{"input": 100, "output": 10}}}}"#)).collect();
    turns.push(r##"{"content": "# Digest\n\nten steps done", "usage": {"input": 100, "output": 10}}"##.into());
    std::fs::write(
        root.join("evals/digest/replay.json"),
        format!(r#"{{"version": 1, "turns": [{}]}}"#, turns.join(",")),
    )
    .unwrap();
    let prompt = "---\ndescription: bench\nbudgets:\n  max_steps: 12\n---\nTen steps.\n";
    std::fs::write(root.join("prompts/bench.md"), prompt).unwrap();
    commit_all(&root);
    let exe = env!("CARGO_BIN_EXE_runtime");
    let (mut times, peak_kb) = time_fires(exe, &root);
    // Descendants (the tool worker) that were waited for, too.
    let all = kernel::usage::children().unwrap();
    times.sort();
    let raw_median = times[times.len() / 2];
    // What the two external commands cost on their own, spawned directly.
    let mut external: Vec<Duration> = (0..FIRES)
        .map(|_| {
            let t = Instant::now();
            for (prog, args) in [("git", &["log", "--oneline", "-n", "3"][..]), ("ls", &["reports"][..])] {
                let out = Command::new(prog).args(args).current_dir(&root).output().unwrap();
                assert!(out.status.success());
            }
            t.elapsed()
        })
        .collect();
    external.sort();
    let external_median = external[external.len() / 2];
    let median = raw_median.saturating_sub(external_median);
    let receipts = count_files(&root.join("runs/bench"));
    assert_eq!(receipts, FIRES, "every fire left a receipt");
    println!(
        "fire (replay, 10 tool steps, commit): raw median {:.2} ms (p90 {:.2} ms) over {FIRES} fires; external commands alone {:.2} ms; runtime overhead {:.2} ms; peak RSS runtime {:.1} MB, any process {:.1} MB",
        ms(raw_median),
        ms(times[times.len() * 9 / 10]),
        ms(external_median),
        ms(median),
        peak_kb as f64 / 1024.0,
        all.ru_maxrss as f64 / 1024.0
    );
    // A fire that calls no tool (its worker still starts, in its namespaces), commit
    // included.
    std::fs::write(
        root.join("evals/digest/replay.json"),
        r##"{"version": 1, "turns": [{"content": "# Digest\n\nno tools", "usage": {"input": 100, "output": 10}}]}"##,
    )
    .unwrap();
    commit_all(&root);
    let (mut bare, _) = time_fires(exe, &root);
    bare.sort();
    let bare_median = bare[bare.len() / 2];
    println!(
        "fire (replay, no tool, commit): median {:.2} ms (p90 {:.2} ms) over {FIRES} fires (target <= 25 ms)",
        ms(bare_median),
        ms(bare[bare.len() * 9 / 10])
    );
    print_phases(exe, &root);
    if median > Duration::from_millis(25) || bare_median > Duration::from_millis(25) || peak_kb > 40 * 1024 {
        println!("TARGET MISSED (median <= 25 ms, peak RSS <= 40 MB)");
        std::process::exit(1);
    }
}

/// Fires the `bench` task [`FIRES`] times: each fire's wall time, and the peak RSS
/// of the runtime process in KiB.
#[allow(clippy::zombie_processes)] // reaped with wait4 below, which also reports the peak RSS
fn time_fires(exe: &str, root: &Path) -> (Vec<Duration>, i64) {
    let mut times = Vec::new();
    let mut peak_kb = 0;
    for _ in 0..FIRES {
        let t = Instant::now();
        let child = Command::new(exe)
            .args(["-C", root.to_str().unwrap(), "fire", "bench"])
            .spawn()
            .unwrap();
        let ended = kernel::usage::wait_with_usage(&child).unwrap();
        let elapsed = t.elapsed();
        assert!(ended.status.success(), "fire failed: {:?}", ended.status);
        times.push(elapsed);
        peak_kb = peak_kb.max(ended.max_rss_kb);
    }
    (times, peak_kb)
}

/// The no-tool fire phase by phase: [`FIRES`] more fires (untimed: their debug log
/// costs) whose phases, the runtime's debug spans, report their busy time as each
/// closes; prints each phase's median in the order the phases first closed. A nested
/// phase is named `outer:inner` and counted in its outer phase too.
fn print_phases(exe: &str, root: &Path) {
    let mut order: Vec<String> = Vec::new();
    let mut times: std::collections::HashMap<String, Vec<f64>> = Default::default();
    for _ in 0..FIRES {
        let out = Command::new(exe)
            .args(["-C", root.to_str().unwrap(), "--log-format", "json", "fire", "bench"])
            .env("RUNTIME_LOG", "debug")
            .output()
            .unwrap();
        assert!(out.status.success(), "fire failed: {:?}", out.status);
        for line in String::from_utf8_lossy(&out.stderr).lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            let (Some("close"), Some(busy), Some(name)) = (
                v["fields"]["message"].as_str(),
                v["fields"]["time.busy"].as_str(),
                v["span"]["name"].as_str(),
            ) else {
                continue;
            };
            let outer: Vec<&str> = v["spans"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s["name"].as_str())
                .collect();
            let phase = outer.into_iter().chain([name]).collect::<Vec<_>>().join(":");
            if !order.contains(&phase) {
                order.push(phase.clone());
            }
            times.entry(phase).or_default().push(span_ms(busy));
        }
    }
    println!("fire (replay, no tool, commit) phase by phase, median busy time over {FIRES} fires:");
    for phase in order {
        let t = times.get_mut(&phase).unwrap();
        t.sort_by(f64::total_cmp);
        println!("  {:>8.3} ms  {phase}", t[t.len() / 2]);
    }
}

/// A span's time as tracing prints it (`184µs`, `1.20ms`, `311ns`, `2.1s`), in ms.
fn span_ms(text: &str) -> f64 {
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (value, unit) = text.split_at(split);
    let value: f64 = value.parse().unwrap();
    value
        * match unit {
            "ns" => 1e-6,
            "µs" => 1e-3,
            "ms" => 1.0,
            "s" => 1e3,
            other => panic!("unknown unit {other} in {text}"),
        }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| if e.path().is_dir() { count_files(&e.path()) } else { 1 })
                .sum()
        })
        .unwrap_or(0)
}

fn commit_all(root: &Path) {
    let repo = git2::Repository::open(root).unwrap();
    let mut idx = repo.index().unwrap();
    idx.add_all(["*"], git2::IndexAddOption::DEFAULT, None).unwrap();
    idx.write().unwrap();
    let tree = repo.find_tree(idx.write_tree().unwrap()).unwrap();
    let sig = git2::Signature::now("Eng", "eng@example.com").unwrap();
    let parent = repo.head().ok().and_then(|h| h.peel_to_commit().ok());
    let parents: Vec<&git2::Commit> = parent.iter().collect();
    repo.commit(Some("HEAD"), &sig, &sig, "bench", &tree, &parents).unwrap();
}
