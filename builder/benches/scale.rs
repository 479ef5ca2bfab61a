//! Scale benchmark for the builder: a generated repo of 100,000 receipts and 20,000
//! cards over 10,000 runtime commits. Targets: full index at most 20 s; incremental
//! index of 100 new receipts at most 200 ms (the pass every command runs first, and
//! the `builder history index` command); `builder cards list` at most 300 ms;
//! `builder history diff` at most 100 ms; `builder audit` over 10,000 commits at most
//! 2 s. Prints the numbers; exits 1 if a target is missed. The repo is generated once
//! under the system temp dir, packed with `git gc`, and reused (`SCALE_REPO`
//! overrides where).

#![forbid(unsafe_code)]
// Benchmark code is test code: a failed setup step should panic and stop the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/scale_repo.rs"]
mod scale_repo;

use git2::Repository;
use scale_repo::{add_commit, generate, reset_last_commit, CARDS_EVERY, COMMITS, RECEIPTS_PER_COMMIT};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let root = std::env::var("SCALE_REPO")
        .map(PathBuf::from)
        .unwrap_or_else(|_| std::env::temp_dir().join("builder-scale-repo-v1"));
    if !root.join(".generated").exists() {
        let _ = std::fs::remove_dir_all(&root);
        let t = Instant::now();
        generate(&root);
        std::fs::write(root.join(".generated"), "").unwrap();
        println!(
            "generated {} receipts, {} cards, {COMMITS} commits in {:.1} s",
            COMMITS * RECEIPTS_PER_COMMIT,
            COMMITS * RECEIPTS_PER_COMMIT / CARDS_EVERY,
            t.elapsed().as_secs_f64()
        );
    }
    let builder = env!("CARGO_BIN_EXE_builder");
    let _ = std::fs::remove_file(root.join(".runtime/builder.db"));
    let _ = std::fs::remove_file(root.join(".runtime/builder.db-wal"));
    let _ = std::fs::remove_file(root.join(".runtime/builder.db-shm"));
    let repo = Repository::open(&root).unwrap();
    let mut store = shared::history::open_store(&root).unwrap();
    let t = Instant::now();
    let stats = shared::history::index(&repo, &mut store, &|_, _| {}).unwrap();
    let full = t.elapsed();
    assert_eq!(stats.receipts, COMMITS * RECEIPTS_PER_COMMIT);
    assert_eq!(stats.cards, COMMITS * RECEIPTS_PER_COMMIT / CARDS_EVERY);
    drop(store);

    // Best of 5 runs, with the last run's stdout.
    let run = |args: &[&str]| -> (Duration, String) {
        let mut best = Duration::MAX;
        let mut out = String::new();
        for _ in 0..5 {
            let (took, stdout) = run_once(builder, &root, args);
            best = best.min(took);
            out = stdout;
        }
        (best, out)
    };
    let (cards_list, out) = run(&["cards", "list", "--json"]);
    let groups: serde_json::Value = serde_json::from_str(&out).unwrap();
    let total: u64 = groups
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["count"].as_u64().unwrap())
        .sum();
    assert_eq!(
        total as usize,
        COMMITS * RECEIPTS_PER_COMMIT / CARDS_EVERY,
        "every card is in a group"
    );
    let ids: Vec<String> = {
        let store = shared::history::open_store(&root).unwrap();
        shared::runs::runs(
            &store,
            &shared::runs::RunFilter {
                task: Some("digest".into()),
                limit: Some(2),
                ..Default::default()
            },
        )
        .unwrap()
        .into_iter()
        .map(|r| r.run_id)
        .collect()
    };
    let (diff, out) = run(&["history", "diff", &ids[0], &ids[1]]);
    assert!(out.contains("## metrics"), "{out}");
    let (audit, out) = run(&["audit"]);
    assert!(out.contains(&format!("audited {} commits", COMMITS + 1)), "{out}");

    // 100 new receipts in one new runtime commit, then an incremental index: as
    // every builder command runs it first, and as `builder history index` (which also
    // looks at the work tree's card files; its first look is taken before).
    let (first_look, _) = run_once(builder, &root, &["history", "index"]);
    add_commit(&repo, &root, COMMITS, 100);
    let mut store = shared::history::open_store(&root).unwrap();
    let t = Instant::now();
    let stats = shared::history::index(&repo, &mut store, &|_, _| {}).unwrap();
    let incremental = t.elapsed();
    assert_eq!(stats.receipts, 100, "{stats:?}");
    drop(store);
    reset_last_commit(&repo);
    run_once(builder, &root, &["history", "index"]);
    add_commit(&repo, &root, COMMITS + 1, 100);
    let (incremental_cli, _) = run_once(builder, &root, &["history", "index"]);
    reset_last_commit(&repo);

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "full index of 100,000 receipts + 20,000 cards: {:.2} s (target <= 20 s)",
        full.as_secs_f64()
    );
    println!(
        "incremental index of 100 new receipts: {:.1} ms (target <= 200 ms)",
        ms(incremental)
    );
    println!(
        "builder history index after 100 new receipts (one run): {:.1} ms (target <= 200 ms); \
         its first look at 20,000 work-tree cards: {:.1} ms",
        ms(incremental_cli),
        ms(first_look)
    );
    println!(
        "builder cards list (20,000 cards, best of 5): {:.1} ms (target <= 300 ms)",
        ms(cards_list)
    );
    println!(
        "builder history diff (best of 5): {:.1} ms (target <= 100 ms)",
        ms(diff)
    );
    println!(
        "builder audit over {} commits (best of 5): {:.1} ms (target <= 2000 ms)",
        COMMITS + 1,
        ms(audit)
    );
    let missed = full > Duration::from_secs(20)
        || incremental > Duration::from_millis(200)
        || incremental_cli > Duration::from_millis(200)
        || cards_list > Duration::from_millis(300)
        || diff > Duration::from_millis(100)
        || audit > Duration::from_secs(2);
    if missed {
        println!("TARGET MISSED");
        std::process::exit(1);
    }
}

/// Runs the builder once in `root` (exit 0 or 1: audit reports findings with 1);
/// how long it took, and its stdout.
fn run_once(builder: &str, root: &Path, args: &[&str]) -> (Duration, String) {
    let t = Instant::now();
    let o = Command::new(builder).args(args).current_dir(root).output().unwrap();
    let took = t.elapsed();
    assert!(
        o.status.code().is_some_and(|c| c <= 1),
        "{args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    (took, String::from_utf8_lossy(&o.stdout).into_owned())
}
