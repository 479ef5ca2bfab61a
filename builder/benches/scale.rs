//! Scale benchmark for the builder: a generated repo of 100,000 receipts and 20,000
//! cards over 10,000 runtime commits. Targets: full index at most 20 s; incremental
//! index of 100 new receipts at most 200 ms (the pass every command runs first, and
//! the `builder history index` command); `builder cards list` at most 300 ms;
//! `builder history diff` at most 100 ms; `builder audit` over 10,000 commits at most
//! 2 s. Prints the numbers; exits 1 if a target is missed. The repo is generated once
//! under the system temp dir, packed with `git gc`, and reused (`SCALE_REPO`
//! overrides where).
// Benchmark code is test code: a failed setup step should panic and stop the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use chrono::{Duration as Days, TimeZone, Utc};
use git2::{build::TreeUpdateBuilder, FileMode, Repository, Signature};
use shared::records::{
    self, Card, CardKind, Inputs, LandlockStatus, Receipt, RecordedDecision, RunStatus, SandboxMode, SandboxRecord,
    StopReason, Tokens, ToolCallRecord, ToolOutcome,
};
use shared::tools::Tool;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const COMMITS: usize = 10_000;
const RECEIPTS_PER_COMMIT: usize = 10;
const CARDS_EVERY: usize = 5; // one card per 5 receipts: 20,000 cards
const TASKS: &[&str] = &["digest", "sorter", "trader", "triage", "weekly"];

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

fn receipt(i: usize) -> Receipt {
    let task = TASKS[i % TASKS.len()];
    let start = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).unwrap() + Days::minutes((i * 3) as i64);
    let status = if i.is_multiple_of(7) {
        RunStatus::Failed
    } else {
        RunStatus::Accepted
    };
    Receipt {
        run_id: format!("{}-{:08x}", start.format("%Y%m%dT%H%M%SZ"), i),
        task: task.into(),
        status,
        stop_reason: if status == RunStatus::Failed {
            StopReason::MaxSteps
        } else {
            StopReason::FinalAnswer
        },
        started_at: start,
        finished_at: start + Days::milliseconds(1500 + (i % 900) as i64),
        inputs: Inputs {
            commit: Some(format!("{:040x}", i / 50)),
            prompt: Some(format!("{:040x}", i / 2000)),
            scope: Some(format!("{:040x}", 7)),
            settings: Some(format!("{:040x}", 9)),
            provider: "openai".into(),
            model: "gpt-4o-mini".into(),
            approval: None,
        },
        sandbox: SandboxRecord {
            landlock: LandlockStatus::FullyEnforced,
            abi: Some(6),
            mode: SandboxMode::Required,
            rights: vec![],
        },
        steps: (i % 9) as u32 + 1,
        tool_calls: (0..3)
            .map(|c| ToolCallRecord {
                id: format!("call_{c}"),
                name: [Tool::ReadFile, Tool::RunCommand, Tool::ListDir][c].name().into(),
                decision: if c == 1 && i.is_multiple_of(11) {
                    RecordedDecision::Deny
                } else {
                    RecordedDecision::Allow
                },
                rule: Some("Bash(git log*)".into()),
                reason: "matches an allow rule".into(),
                outcome: ToolOutcome::Ok,
                duration_ms: (i % 97) as u64,
            })
            .collect(),
        tokens: Tokens {
            input: 1000 + (i % 500) as u64,
            output: 100 + (i % 50) as u64,
        },
        cost_usd: 0.0002 * (i % 10) as f64,
        retries: 0,
        denials: u32::from(i.is_multiple_of(11)),
        outputs: vec![format!(
            "reports/{task}/{}/{}.md",
            records::day(start),
            format_args!("{}-{:08x}", start.format("%Y%m%dT%H%M%SZ"), i)
        )],
        cards: vec![],
        acceptance: vec![],
        resumed_from: None,
    }
}

fn card(i: usize, r: &Receipt) -> Card {
    let kind = [
        CardKind::PermissionDenied,
        CardKind::MaxSteps,
        CardKind::MissingTool,
        CardKind::ProviderError,
    ][i % 4];
    Card::new(
        kind,
        &r.task,
        &r.run_id,
        format!("failure type {}", i % 40),
        format!("detail of failure type {}", i % 40),
        vec![],
        r.finished_at,
    )
}

/// Adds `n` receipts (and their cards) as one runtime commit, files written too.
fn add_commit(repo: &Repository, root: &Path, commit_no: usize, n: usize) {
    let head = repo.head().ok().and_then(|h| h.peel_to_commit().ok());
    let base = match &head {
        Some(c) => c.tree().unwrap(),
        None => repo
            .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
            .unwrap(),
    };
    let mut update = TreeUpdateBuilder::new();
    for k in 0..n {
        let i = commit_no * RECEIPTS_PER_COMMIT + k;
        let r = receipt(i);
        let rel = records::receipt_path(&r.task, &r.run_id, r.started_at);
        let json = records::receipt_json(&r).unwrap();
        write(root, &rel, json.as_bytes());
        update.upsert(
            rel.to_str().unwrap(),
            repo.blob(json.as_bytes()).unwrap(),
            FileMode::Blob,
        );
        let report = r.outputs[0].clone();
        let body = format!("# {} report {i}\n\nline {}\n", r.task, i % 13);
        write(root, Path::new(&report), body.as_bytes());
        update.upsert(report.as_str(), repo.blob(body.as_bytes()).unwrap(), FileMode::Blob);
        if i.is_multiple_of(CARDS_EVERY) {
            let c = card(i, &r);
            let y = records::card_yaml(&c).unwrap();
            let rel = c.rel_path();
            write(root, &rel, y.as_bytes());
            update.upsert(rel.to_str().unwrap(), repo.blob(y.as_bytes()).unwrap(), FileMode::Blob);
        }
    }
    let tree = repo.find_tree(update.create_updated(repo, &base).unwrap()).unwrap();
    let sig = Signature::new(
        "runtime",
        "runtime@localhost",
        &git2::Time::new(1_767_225_600 + commit_no as i64 * 60, 0),
    )
    .unwrap();
    let parents: Vec<&git2::Commit> = head.iter().collect();
    repo.commit(
        Some("HEAD"),
        &sig,
        &sig,
        &format!("runtime: fire {commit_no}"),
        &tree,
        &parents,
    )
    .unwrap();
}

/// Drops the last commit and its files (the index follows on its next run).
fn reset_last_commit(repo: &Repository) {
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    let parent = head.parent(0).unwrap();
    repo.reset(parent.as_object(), git2::ResetType::Hard, None).unwrap();
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

fn write(root: &Path, rel: &Path, bytes: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, bytes).unwrap();
}

fn generate(root: &Path) {
    shared::scaffold::init(root).unwrap();
    let repo = Repository::open(root).unwrap();
    // The scaffold, committed by an engineer.
    let mut idx = repo.index().unwrap();
    idx.add_all(["*"], git2::IndexAddOption::DEFAULT, None).unwrap();
    idx.write().unwrap();
    let tree = repo.find_tree(idx.write_tree().unwrap()).unwrap();
    let sig = Signature::now("Eng", "eng@example.com").unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "scaffold", &tree, &[]).unwrap();
    for c in 0..COMMITS {
        add_commit(&repo, root, c, RECEIPTS_PER_COMMIT);
    }
    // Pack it, as `git gc` (auto or scheduled) leaves a repository that people pull
    // and push; a fire's commits are loose objects until then.
    let gc = Command::new("git")
        .args(["-c", "gc.auto=0", "gc", "--quiet"])
        .current_dir(root)
        .status()
        .unwrap();
    assert!(gc.success(), "git gc failed");
    // Bring the index in line with HEAD so `git status` is clean.
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    repo.reset(head.as_object(), git2::ResetType::Mixed, None).unwrap();
}
