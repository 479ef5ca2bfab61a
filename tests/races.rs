//! The race test (issue 11): fires of 8 tasks in a loop while an engineer commits to
//! the same branch in a loop with the `git` CLI, for `RACE_TEST_SECONDS` (60 by
//! default; CI runs the default). The engineer's commits take git's index lock
//! (`git commit`) or none (`git commit-tree` + `git update-ref`, which moves HEAD
//! under a fire that already read it). `git commit` reads the index before it takes
//! the lock and writes it back before it moves HEAD, so now and then it writes back an
//! index from before a fire's and its next commit drops that fire's records from HEAD
//! (they stay in the work tree); the next fire commits them again. After the race and
//! one settling fire, every receipt a fire reported is in HEAD, every engineer commit
//! is there, `git status` shows no runtime record deleted
//! or untracked, `git fsck` is clean and no lock or intent record is left.

use crate::util::*;
use std::path::Path;
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TASKS: usize = 8;
const SECONDS_ENV: &str = "RACE_TEST_SECONDS";

/// `git -C <repo> args...` with the test's own HOME and identity.
pub(crate) fn git(env: &TestEnv, args: &[&str]) -> Output {
    env.git_in(&env.root, args)
}

pub(crate) fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// One engineer commit, `eng-<n>`, in one of three ways; `false` when git refused
/// (a lock held by a fire, a ref that moved): the caller tries again.
fn engineer_commit(env: &TestEnv, n: usize) -> bool {
    let msg = format!("eng-{n}");
    match n % 3 {
        0 => {
            let rel = format!("notes/{n}.txt");
            std::fs::create_dir_all(env.root.join("notes")).unwrap();
            std::fs::write(env.root.join(&rel), &msg).unwrap();
            git(env, &["add", &rel]).status.success() && git(env, &["commit", "-q", "-m", &msg]).status.success()
        }
        1 => git(env, &["commit", "-q", "--allow-empty", "-m", &msg])
            .status
            .success(),
        _ => {
            // No index lock: HEAD moves under whatever a fire read.
            let old = stdout(&git(env, &["rev-parse", "HEAD"]));
            let new = git(env, &["commit-tree", "HEAD^{tree}", "-p", &old, "-m", &msg]);
            if !new.status.success() {
                return false;
            }
            git(env, &["update-ref", "HEAD", &stdout(&new), &old]).status.success()
        }
    }
}

#[test]
fn fires_racing_an_engineers_commit_loop_lose_nothing() {
    let seconds: u64 = std::env::var(SECONDS_ENV)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let env = Arc::new(TestEnv::new());
    let prompt = env.read("prompts/digest.md");
    for i in 1..=TASKS {
        env.write(&format!("prompts/t{i}.md"), &prompt);
    }
    env.commit_all("eight tasks");

    let stop = Arc::new(AtomicBool::new(false));
    let engineer = {
        let (env, stop) = (env.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut done, mut refused) = (0usize, 0usize);
            while !stop.load(Ordering::Relaxed) {
                if engineer_commit(&env, done) {
                    done += 1;
                } else {
                    refused += 1;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            // A staged note whose commit was refused last: commit it now.
            if env.root.join(format!("notes/{done}.txt")).exists() {
                while !engineer_commit(&env, done) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                done += 1;
            }
            (done, refused)
        })
    };
    // Two fire loops (tasks 1-4 and 5-8), so fires also race each other's commits.
    let receipts = Arc::new(Mutex::new(Vec::<String>::new()));
    let bad = Arc::new(Mutex::new(Vec::<String>::new()));
    let started = Instant::now();
    let deadline = started + Duration::from_secs(seconds);
    let loops: Vec<_> = (0..2)
        .map(|half| {
            let (env, receipts, bad) = (env.clone(), receipts.clone(), bad.clone());
            std::thread::spawn(move || {
                let mut fires = 0usize;
                let mut i = 0;
                while Instant::now() < deadline {
                    let task = format!("t{}", half * 4 + i % 4 + 1);
                    i += 1;
                    let (code, summary, stderr) = env.fire(&task);
                    fires += 1;
                    if ![0, 3, 5].contains(&code) {
                        bad.lock().unwrap().push(format!("{task} exited {code}: {stderr}"));
                    }
                    if let Some(r) = summary["receipt"].as_str() {
                        receipts.lock().unwrap().push(r.to_string());
                    }
                }
                fires
            })
        })
        .collect();
    let fires: usize = loops.into_iter().map(|h| h.join().unwrap()).sum();
    stop.store(true, Ordering::Relaxed);
    let (engineer_commits, refused) = engineer.join().unwrap();
    let elapsed = started.elapsed();
    // Records a `git commit` dropped (it writes back an index it read before a fire's,
    // which git's own locking allows) are committed again by the next fire: one more,
    // after the engineer stopped, so the last of them are back too.
    let dropped_before_settling = {
        let tree = stdout(&git(&env, &["ls-tree", "-r", "--name-only", "HEAD"]));
        let in_head: std::collections::HashSet<&str> = tree.lines().collect();
        let receipts = receipts.lock().unwrap();
        receipts.iter().filter(|r| !in_head.contains(r.as_str())).count()
    };
    let (code, summary, stderr) = env.fire("t1");
    assert!([0, 5].contains(&code), "settling fire exited {code}: {stderr}");
    receipts
        .lock()
        .unwrap()
        .extend(summary["receipt"].as_str().map(str::to_string));
    println!("race: {dropped_before_settling} receipts out of HEAD at the end of the race, before the settling fire");
    println!(
        "race: {fires} fires, {engineer_commits} engineer commits ({refused} refused by git and retried) in {:.1} s",
        elapsed.as_secs_f64()
    );
    let bad = bad.lock().unwrap();
    assert!(bad.is_empty(), "fires that did not exit 0, 3 or 5:\n{}", bad.join("\n"));
    assert!(elapsed >= Duration::from_secs(seconds));
    assert!(fires >= 8 && engineer_commits >= 8, "the race hardly ran");

    // Every receipt a fire reported is in HEAD's tree.
    let tree = stdout(&git(&env, &["ls-tree", "-r", "--name-only", "HEAD"]));
    let in_head: std::collections::HashSet<&str> = tree.lines().collect();
    let receipts = receipts.lock().unwrap();
    let missing: Vec<&String> = receipts.iter().filter(|r| !in_head.contains(r.as_str())).collect();
    assert!(
        missing.is_empty(),
        "{} of {} receipts missing from HEAD: {missing:?}",
        missing.len(),
        receipts.len()
    );
    // Every engineer commit is in HEAD's history, once.
    let subjects = stdout(&git(&env, &["log", "--format=%s", "HEAD"]));
    let mut eng: Vec<usize> = subjects
        .lines()
        .filter_map(|s| s.strip_prefix("eng-"))
        .map(|n| n.parse().unwrap())
        .collect();
    eng.sort_unstable();
    assert_eq!(eng, (0..engineer_commits).collect::<Vec<_>>(), "engineer commits");
    // No runtime record deleted or untracked; nothing left locked.
    let status = stdout(&git(&env, &["status", "--porcelain", "--untracked-files=all"]));
    let wrong: Vec<&str> = status
        .lines()
        .filter(|l| ["runs/", "cards/", "reports/"].iter().any(|d| l[3..].starts_with(d)))
        .collect();
    assert!(
        wrong.is_empty(),
        "runtime records not as committed:\n{}",
        wrong.join("\n")
    );
    let fsck = git(&env, &["fsck", "--no-progress"]);
    assert!(
        fsck.status.success(),
        "git fsck: {}{}",
        stdout(&fsck),
        String::from_utf8_lossy(&fsck.stderr)
    );
    assert!(!env.root.join(".git/index.lock").exists(), "index.lock left");
    let locks = std::fs::read_dir(env.root.join(".runtime/locks")).unwrap();
    let intents: Vec<String> = locks
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("git-intent-"))
        .collect();
    assert!(intents.is_empty(), "intent records left: {intents:?}");
    assert!(!Path::new(&env.root.join(".git/refs/heads")).join("main.lock").exists());
}
