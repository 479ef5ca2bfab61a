//! Many fires at once (issue 22, item 5): 16, then 32 fires of different tasks
//! started together, eight rounds of each size (384 fires). Each fire writes its
//! report through a temporary name in `reports/<task>/<day>/` while the others walk
//! `reports/` for what their models left there; a fire must never take another
//! fire's half-written temporary file for an output of its own. Every fire exits 0,
//! every receipt is in HEAD with its report, nothing temporary is committed or left
//! behind, and the crash suite's checks hold (one row per receipt, no lock, `git
//! fsck` clean).

use crate::util::*;
use std::sync::{Arc, Barrier};

const ROUNDS: usize = 8;

/// Fires `n` tasks (`t1`..`tn`) at once; each `(task, exit code, summary, stderr)`.
fn round(env: &Arc<TestEnv>, n: usize) -> Vec<(String, i32, serde_json::Value, String)> {
    let start = Arc::new(Barrier::new(n));
    let fires: Vec<_> = (1..=n)
        .map(|i| {
            let (env, start) = (env.clone(), start.clone());
            std::thread::spawn(move || {
                let task = format!("t{i}");
                start.wait();
                let (code, summary, stderr) = env.fire(&task);
                (task, code, summary, stderr)
            })
        })
        .collect();
    fires.into_iter().map(|h| h.join().unwrap()).collect()
}

#[test]
fn sixteen_and_thirty_two_fires_at_once_never_take_each_others_temporary_files() {
    let env = Arc::new(TestEnv::new());
    let prompt = env.read("prompts/digest.md");
    for i in 1..=32 {
        env.write(&format!("prompts/t{i}.md"), &prompt);
    }
    env.commit_all("32 tasks");
    let mut bad = Vec::new();
    let mut receipts = Vec::new();
    let mut fired = 0;
    for n in [16, 32] {
        for _ in 0..ROUNDS {
            for (task, code, summary, stderr) in round(&env, n) {
                fired += 1;
                if code != 0 {
                    bad.push(format!("{task} ({n} at once) exited {code}: {summary}\n{stderr}"));
                }
                receipts.extend(summary["receipt"].as_str().map(str::to_string));
            }
        }
    }
    assert_eq!(fired, 384);
    assert!(
        bad.is_empty(),
        "{} of {fired} fires did not exit 0:\n{}",
        bad.len(),
        bad.join("\n")
    );
    let repo = git2::Repository::open(&env.root).unwrap();
    let tree = repo.head().unwrap().peel_to_tree().unwrap();
    let mut committed = Vec::new();
    tree.walk(git2::TreeWalkMode::PreOrder, |dir, e| {
        committed.push(format!("{dir}{}", e.name().unwrap_or_default()));
        git2::TreeWalkResult::Ok
    })
    .unwrap();
    let temporary: Vec<&String> = committed.iter().filter(|p| p.ends_with(".tmp")).collect();
    assert!(temporary.is_empty(), "temporary files committed: {temporary:?}");
    for r in &receipts {
        assert!(committed.contains(r), "{r} is not in HEAD");
    }
    crate::crash_suite::check(&env).unwrap();
}
