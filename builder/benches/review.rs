//! Review benchmark: `builder eval` with 20 scripted cases on base and head (target
//! at most 2 s: 40 real fires through the replay path, no commits, two temporary
//! worktrees), and the capability delta of a settings proposal over a runtime state
//! database of 2,000 recorded calls (target at most 1 s: reading the calls, loading
//! both sides' settings from git, deciding every call twice). Prints the numbers
//! (best of 5); exits 1 if a target is missed. Needs the `runtime` binary beside
//! `builder` (`cargo build --release -p runtime` before `cargo bench`).

#![forbid(unsafe_code)]
// Benchmark code is test code: a failed setup step should panic and stop the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared::review::delta::{self, Side};
use shared::store::Store;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const CASES: usize = 20;
const RUNS: usize = 500;
const CALLS_PER_RUN: usize = 4;

fn builder(root: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_builder"))
        .args(args)
        .current_dir(root)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "Eng")
        .env("GIT_AUTHOR_EMAIL", "eng@example.com")
        .env("GIT_COMMITTER_NAME", "Eng")
        .env("GIT_COMMITTER_EMAIL", "eng@example.com")
        .output()
        .unwrap()
}

fn git(root: &Path, args: &[&str]) {
    let out = Command::new("git")
        .args(args)
        .current_dir(root)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "Eng")
        .env("GIT_AUTHOR_EMAIL", "eng@example.com")
        .env("GIT_COMMITTER_NAME", "Eng")
        .env("GIT_COMMITTER_EMAIL", "eng@example.com")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn best_of<T>(n: usize, mut f: impl FnMut() -> T) -> (Duration, T) {
    let mut best = Duration::MAX;
    let mut last = None;
    for _ in 0..n {
        let t = Instant::now();
        let v = f();
        best = best.min(t.elapsed());
        last = Some(v);
    }
    (best, last.unwrap())
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let runtime = Path::new(env!("CARGO_BIN_EXE_builder")).with_file_name("runtime");
    assert!(
        runtime.is_file(),
        "{} is missing: build it first (cargo build --release -p runtime)",
        runtime.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    let out = builder(dir.path(), &["init", root.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    std::fs::remove_file(root.join("evals/digest/basic.yaml")).unwrap();
    for i in 0..CASES {
        std::fs::write(
            root.join(format!("evals/digest/case-{i:02}.yaml")),
            format!(
                "name: case-{i:02}\nmodel: scripted\nscript:\n  - call: {{ tool: run_command, args: {{ command: \"ls cards\" }} }}\n  - call: {{ tool: read_file, args: {{ path: README.md }} }}\n  - text: \"# Digest\\n\\nOpen cards: none in case {i}. Activity: quiet, nothing new to report today; worth a look: the cards directory stays empty.\"\nassert:\n  - must_call: [run_command, read_file]\n  - no_denials: true\n  - report_contains: \"Open cards\"\n  - max_steps: 5\n"
            ),
        )
        .unwrap();
    }
    std::fs::write(root.join("README.md"), "bench\n").unwrap();
    git(&root, &["add", "-A"]);
    git(&root, &["commit", "-qm", "base"]);
    let prompt = std::fs::read_to_string(root.join("prompts/digest.md")).unwrap();
    std::fs::write(root.join("prompts/digest.md"), format!("{prompt}\nKeep it short.\n")).unwrap();
    git(&root, &["commit", "-qam", "head"]);

    let (eval_time, out) = best_of(5, || builder(&root, &["eval", "--json"]));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!(report["rows"].as_array().unwrap().len(), 2 * CASES);

    // The history: RUNS runs of CALLS_PER_RUN calls, a quarter of them a denied curl.
    let db = root.join(".runtime/state.db");
    let mut store = Store::open(&db, shared::state::RUNTIME_SCHEMA).unwrap();
    store
        .write(|tx| {
            for r in 0..RUNS {
                let run = format!("20261130T0000{:02}Z-{r:08x}", r % 60);
                tx.execute(
                    "INSERT INTO runs (run_id, task, status, stop_reason, started_at) VALUES (?1, 'digest', 'completed', 'final_answer', ?2)",
                    rusqlite::params![run, format!("2026-11-30T00:{:02}:{:02}+00:00", r / 60 % 60, r % 60)],
                )?;
                let calls = [
                    ("run_command", format!(r#"{{"tool":"run_command","command":"curl -s https://example.com/feed/{r}","timeout_s":null}}"#), "deny"),
                    ("run_command", r#"{"tool":"run_command","command":"git log --oneline -n 5 | head -3","timeout_s":null}"#.to_string(), "allow"),
                    ("read_file", r#"{"tool":"read_file","path":"README.md","offset":null,"limit":null}"#.to_string(), "allow"),
                    ("write_file", r#"{"tool":"write_file","path":"reports/x.md","content":"x"}"#.to_string(), "allow"),
                ];
                for (i, (name, args, decision)) in calls.iter().take(CALLS_PER_RUN).enumerate() {
                    tx.execute(
                        "INSERT INTO tool_calls (run_id, call_id, step, name, arguments, args_hash, decision, rule, reason, outcome, duration_ms) VALUES (?1, ?2, ?3, ?4, ?5, '', ?6, NULL, '', 'ok', 1)",
                        rusqlite::params![run, format!("c{i}"), i as i64, name, args, decision],
                    )?;
                }
            }
            Ok(())
        })
        .unwrap();
    drop(store);
    let settings = std::fs::read_to_string(root.join("settings/runtime.yaml")).unwrap();
    let allowing = settings.replacen("    - \"Bash(curl*)\"\n", "", 1).replacen(
        "  allow:\n",
        "  allow:\n    - \"Bash(curl -s https://example.com/*)\"\n",
        1,
    );
    assert_ne!(allowing, settings);
    std::fs::write(root.join("settings/runtime.yaml"), allowing).unwrap();
    let out = builder(&root, &["propose", "feed", "-m", "allow the feed"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let repo = git2::Repository::open(&root).unwrap();
    let base = repo.head().unwrap().peel_to_commit().unwrap().id();
    let head = repo.revparse_single("proposals/feed").unwrap().id();
    let (delta_time, groups) = best_of(5, || {
        let before = delta::settings_of_commit(&repo, base, "base").unwrap();
        let after = delta::settings_of_commit(&repo, head, "head").unwrap();
        let calls = delta::recorded_calls(&db, None).unwrap();
        assert_eq!(calls.len(), RUNS * CALLS_PER_RUN);
        delta::capability_delta(
            &calls,
            &Side::new(&root, &before).unwrap(),
            &Side::new(&root, &after).unwrap(),
        )
    });
    assert_eq!(groups.len(), 1, "{groups:?}");
    assert_eq!(groups[0].count, RUNS, "exactly the curl calls change");

    let (review_time, out) = best_of(3, || builder(&root, &["review", "feed", "--format", "json"]));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "builder eval, {CASES} scripted cases on base and head: {:.0} ms (target 2000 ms)",
        ms(eval_time)
    );
    println!(
        "capability delta, {} recorded calls: {:.1} ms (target 1000 ms)",
        RUNS * CALLS_PER_RUN,
        ms(delta_time)
    );
    println!(
        "builder review (diff, check, delta over {} calls, {CASES} cases on base and head): {:.0} ms",
        RUNS * CALLS_PER_RUN,
        ms(review_time)
    );
    if eval_time > Duration::from_secs(2) || delta_time > Duration::from_secs(1) {
        eprintln!("a target was missed");
        std::process::exit(1);
    }
}
