//! The generated repository the builder's scale benchmarks run on (`scale`,
//! `serve`): 100,000 receipts and 20,000 cards over 10,000 runtime commits, five
//! tasks, one receipt in seven failed, a denied call in one in eleven. Included by
//! each bench with `#[path]` (a bench is its own crate).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use chrono::{Duration as Days, TimeZone, Utc};
use git2::{build::TreeUpdateBuilder, FileMode, Repository, Signature};
use shared::records::{
    self, Card, CardKind, Inputs, LandlockStatus, Receipt, RecordedDecision, RunStatus, SandboxMode, SandboxRecord,
    StopReason, Tokens, ToolCallRecord, ToolOutcome,
};
use shared::tools::Tool;
use std::path::Path;
use std::process::Command;

pub const COMMITS: usize = 10_000;
pub const RECEIPTS_PER_COMMIT: usize = 10;
pub const CARDS_EVERY: usize = 5; // one card per 5 receipts: 20,000 cards
pub const TASKS: &[&str] = &["digest", "sorter", "trader", "triage", "weekly"];

pub fn receipt(i: usize) -> Receipt {
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
                mcp: None,
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

pub fn card(i: usize, r: &Receipt) -> Card {
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
pub fn add_commit(repo: &Repository, root: &Path, commit_no: usize, n: usize) {
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
pub fn reset_last_commit(repo: &Repository) {
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    let parent = head.parent(0).unwrap();
    repo.reset(parent.as_object(), git2::ResetType::Hard, None).unwrap();
}

pub fn write(root: &Path, rel: &Path, bytes: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, bytes).unwrap();
}

pub fn generate(root: &Path) {
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
