//! The cron box end to end (`sync` in settings): a laptop clone and a cron clone of
//! one bare origin. An approved change reaches the cron box's next fire; an
//! unapproved one does not (one card, not one per fire, and nothing pushed) until it
//! is approved, when the records of the fires in between are joined onto it; fires
//! pushing while the laptop pushes in a loop lose no record and rewrite no commit the
//! origin had; a network remote (a `git daemon` on 127.0.0.1) goes through the `git`
//! command line with the same guarantees, from inside the runtime's sandbox; a remote
//! the box cannot reach is a named error and a card.

use crate::review::{builder_in, builder_ok, fire_in, git, with_origin, REVIEWER};
use crate::util::TestEnv;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The laptop turns on review and sync through review, pushes, and the cron box
/// clones the origin. Returns (origin, cron clone).
fn laptop_and_cron_box(env: &TestEnv) -> (PathBuf, PathBuf) {
    let origin = with_origin(env);
    let settings = env.read("settings/runtime.yaml");
    env.write(
        "settings/runtime.yaml",
        &format!("{settings}require_reviewed: true\nsync:\n  remote: origin\n  branch: main\n"),
    );
    builder_ok(env, &env.root, None, &["propose", "cron", "-m", "Review and sync"]);
    builder_ok(env, &env.root, Some(REVIEWER), &["approve", "cron"]);
    builder_ok(env, &env.root, None, &["merge", "cron"]);
    git(env, &env.root, &["push", "-q", "origin"]);
    git(env, &env.root, &["fetch", "-q", "origin"]);
    git(env, &env.root, &["branch", "-q", "--set-upstream-to=origin/main"]);
    let cron = env.home.join("cron");
    git(
        env,
        &env.home,
        &["clone", "-q", origin.to_str().unwrap(), cron.to_str().unwrap()],
    );
    builder_ok(env, &cron, None, &["install-hooks"]);
    (origin, cron)
}

fn rev(env: &TestEnv, dir: &Path, what: &str) -> String {
    git(env, dir, &["rev-parse", what])
}

fn is_ancestor(env: &TestEnv, dir: &Path, a: &str, b: &str) -> bool {
    crate::review::git_with_path(env, dir, "/usr/bin:/bin", &["merge-base", "--is-ancestor", a, b])
        .status
        .success()
}

/// Every receipt under the cron box's `runs/`: (path, commit it names).
fn receipts(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.join("runs")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "json") {
                let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
                if let Some(c) = v["inputs"]["commit"].as_str() {
                    let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                    out.push((rel, c.to_string()));
                }
            }
        }
    }
    out
}

/// Every receipt is in the origin's tip and names a commit the tip descends from.
fn assert_receipts_hold(env: &TestEnv, cron: &Path, origin: &Path) {
    let tip = rev(env, origin, "refs/heads/main");
    let all = receipts(cron);
    assert!(!all.is_empty());
    let files = git(env, origin, &["ls-tree", "-r", "--name-only", &tip]);
    for (path, commit) in &all {
        assert!(
            files.lines().any(|l| l == path),
            "receipt {path} is not in the origin's tip"
        );
        assert!(
            is_ancestor(env, origin, commit, &tip),
            "receipt {path} names {commit}, not in the origin's history"
        );
    }
}

#[test]
fn approved_changes_reach_the_cron_box_and_unapproved_ones_wait_with_one_card() {
    let env = TestEnv::new();
    let (origin, cron) = laptop_and_cron_box(&env);

    // The first fire: up to date, fires, pushes.
    let (code, summary) = fire_in(&env, &cron, "digest");
    assert_eq!(code, 0, "{summary}");
    assert_eq!(rev(&env, &cron, "HEAD"), rev(&env, &origin, "refs/heads/main"));

    // An approved change on the laptop reaches the cron box's next fire.
    git(&env, &env.root, &["pull", "-q", "--ff-only"]);
    approve_a_change_and_fire(&env, &cron);
    assert!(std::fs::read_to_string(cron.join("prompts/digest.md"))
        .unwrap()
        .contains("weather"));
    assert_eq!(rev(&env, &cron, "HEAD"), rev(&env, &origin, "refs/heads/main"));

    // An unapproved change (pushed past the hook) does not reach it: one card, no push.
    git(&env, &env.root, &["pull", "-q", "--ff-only"]);
    env.write("prompts/digest.md", "---\n---\nSomething nobody approved.\n");
    env.commit_all("unreviewed prompt");
    git(&env, &env.root, &["push", "-q", "--no-verify", "origin"]);
    let unapproved = rev(&env, &env.root, "HEAD");
    let before = rev(&env, &cron, "HEAD");
    let (code, summary) = fire_in(&env, &cron, "digest");
    assert_eq!(code, 5, "{summary}");
    assert_eq!(env_cards(&cron, &summary), vec!["unreviewed_changes"]);
    assert!(!std::fs::read_to_string(cron.join("prompts/digest.md"))
        .unwrap()
        .contains("nobody"));
    let receipt: Value =
        serde_json::from_str(&std::fs::read_to_string(cron.join(summary["receipt"].as_str().unwrap())).unwrap())
            .unwrap();
    assert_eq!(receipt["inputs"]["commit"], before.as_str(), "it fired on what it had");
    assert_eq!(rev(&env, &origin, "refs/heads/main"), unapproved, "nothing pushed");
    let (code, again) = fire_in(&env, &cron, "digest");
    assert_eq!(code, 0, "one card per unapproved tree, not per fire: {again}");
    assert_eq!(rev(&env, &origin, "refs/heads/main"), unapproved, "nothing pushed");

    // Approved after the fact (Rev approves that exact tree): the next fire joins the
    // records of the fires in between onto it and pushes them all.
    // A proposal with that exact tree (the same file content on the commit before).
    git(&env, &env.root, &["checkout", "-q", "-b", "proposals/late", "HEAD~1"]);
    env.write("prompts/digest.md", "---\n---\nSomething nobody approved.\n");
    env.commit_all("the same change, proposed");
    git(&env, &env.root, &["checkout", "-q", "main"]);
    builder_ok(&env, &env.root, Some(REVIEWER), &["approve", "late"]);
    git(
        &env,
        &env.root,
        &["push", "-q", "--no-verify", "origin", "refs/builder/*:refs/builder/*"],
    );
    let (code, summary) = fire_in(&env, &cron, "digest");
    assert_eq!(code, 0, "{summary}");
    assert!(std::fs::read_to_string(cron.join("prompts/digest.md"))
        .unwrap()
        .contains("nobody"));
    assert_eq!(rev(&env, &cron, "HEAD"), rev(&env, &origin, "refs/heads/main"));
    assert!(is_ancestor(&env, &origin, &unapproved, "refs/heads/main"));
    assert_receipts_hold(&env, &cron, &origin);
    let (code, out, _) = builder_in(&env, &cron, None, &["audit"]);
    assert_eq!(code, 0, "{out}");
}

pub(crate) fn env_cards(dir: &Path, summary: &Value) -> Vec<String> {
    let mut kinds = Vec::new();
    for id in summary["cards"].as_array().unwrap() {
        let id = id.as_str().unwrap();
        let card = std::fs::read_dir(dir.join("cards"))
            .unwrap()
            .flatten()
            .map(|d| d.path().join(format!("{id}.yaml")))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("card {id} not found"));
        let v: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(card).unwrap()).unwrap();
        kinds.push(v["kind"].as_str().unwrap().to_string());
    }
    kinds
}

#[test]
fn fires_pushing_while_the_laptop_pushes_lose_no_record_and_rewrite_no_commit() {
    let env = TestEnv::new();
    let (origin, cron) = laptop_and_cron_box(&env);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let pushes = std::sync::atomic::AtomicUsize::new(0);
    let laptop = {
        let (root, stop, pushes) = (env.root.clone(), &stop, &pushes);
        let env = &env;
        std::thread::scope(|s| {
            let pusher = s.spawn(move || {
                let mut pushed = Vec::new();
                let mut last_failure = String::new();
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 400 {
                    n += 1;
                    let pull = crate::review::git_with_path(env, &root, "/usr/bin:/bin", &["pull", "-q", "--rebase"]);
                    if !pull.status.success() {
                        last_failure = format!("pull: {}", String::from_utf8_lossy(&pull.stderr));
                    }
                    // Records-like files from elsewhere, and now and then a file
                    // outside the records (the fire then defers its push).
                    let rel = if n % 3 == 0 {
                        format!("notes/laptop-{n}.md")
                    } else {
                        format!("reports/laptop/{n}.md")
                    };
                    env.write(&rel, "from the laptop\n");
                    git(env, &root, &["add", &rel]);
                    git(env, &root, &["commit", "-qm", &format!("laptop {n}")]);
                    let out = crate::review::git_with_path(
                        env,
                        &root,
                        "/usr/bin:/bin",
                        &["push", "-q", "--no-verify", "origin", "main"],
                    );
                    if out.status.success() {
                        pushed.push(rel);
                        pushes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    } else {
                        last_failure = format!("push: {}", String::from_utf8_lossy(&out.stderr));
                    }
                }
                (pushed, last_failure)
            });
            let mut tips = Vec::new();
            // At least 8 fires, and on until the laptop has pushed a few times.
            while tips.len() < 8 || (pushes.load(std::sync::atomic::Ordering::Relaxed) < 6 && tips.len() < 60) {
                let (code, summary) = fire_in(env, &cron, "digest");
                assert!(code == 0 || code == 5, "{summary}");
                tips.push(rev(env, &origin, "refs/heads/main"));
                // A pause between fires, as cron has: the laptop gets its turns.
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let pushed = pusher.join().unwrap();
            (pushed, tips)
        })
    };
    let ((pushed, last_failure), tips) = laptop;
    assert!(
        !pushed.is_empty(),
        "the laptop pushed meanwhile; its last failure: {last_failure}"
    );
    // One fire after the laptop stopped pushes whatever was deferred.
    let (code, summary) = fire_in(&env, &cron, "digest");
    assert_eq!(code, 0, "{summary}");
    let tip = rev(&env, &origin, "refs/heads/main");
    assert_eq!(rev(&env, &cron, "HEAD"), tip);
    for t in &tips {
        assert!(is_ancestor(&env, &origin, t, &tip), "origin tip {t} was rewritten");
    }
    assert_eq!(receipts(&cron).len(), tips.len() + 1);
    assert_receipts_hold(&env, &cron, &origin);
    // Every file the laptop pushed is still there: the fires' rebuilt commits kept them.
    let files = git(&env, &origin, &["ls-tree", "-r", "--name-only", &tip]);
    for rel in &pushed {
        assert!(files.lines().any(|l| l == rel), "the laptop's {rel} was lost");
    }
}

#[test]
fn an_unreachable_remote_is_a_named_error_and_a_card() {
    let env = TestEnv::new();
    let (_origin, cron) = laptop_and_cron_box(&env);
    git(
        &env,
        &cron,
        &["remote", "set-url", "origin", "https://example.invalid/agent.git"],
    );
    let (code, summary) = fire_in(&env, &cron, "digest");
    assert_eq!(code, 1, "{summary}");
    assert_eq!(env_cards(&cron, &summary), vec!["sync_failed"]);
    assert!(summary["message"].as_str().unwrap().contains("sync"), "{summary}");
    let card = sync_card(&cron).unwrap();
    // The `git` command line tried the host (no such host: git's own message).
    assert!(card.contains("example.invalid"), "{card}");
}

/// The text of the cron box's `sync_failed` card, if any.
fn sync_card(cron: &Path) -> Option<String> {
    std::fs::read_dir(cron.join("cards"))
        .ok()?
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.path()).into_iter().flatten().flatten())
        .filter_map(|f| std::fs::read_to_string(f.path()).ok())
        .find(|t| t.contains("sync_failed"))
}

/// A `git daemon` (git://, receive-pack on) serving `base` on a free port of
/// 127.0.0.1, killed on drop: the cron box's network remote.
struct Daemon {
    child: std::process::Child,
    port: u16,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // `git daemon` runs `git-daemon` as its child: the whole group goes.
        // SAFETY: kill(2) of the process group the daemon was started in.
        unsafe { libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// On the laptop: proposes, approves (by the reviewer) and merges a prompt change and
/// pushes it; then fires the cron box, which must run on exactly that approved tip.
fn approve_a_change_and_fire(env: &TestEnv, cron: &Path) {
    env.write(
        "prompts/digest.md",
        &format!("{}\nMention the weather.\n", env.read("prompts/digest.md")),
    );
    builder_ok(env, &env.root, None, &["propose", "weather"]);
    builder_ok(env, &env.root, Some(REVIEWER), &["approve", "weather"]);
    builder_ok(env, &env.root, None, &["merge", "weather"]);
    git(env, &env.root, &["push", "-q", "origin"]);
    let approved = rev(env, &env.root, "HEAD");
    let (code, summary) = fire_in(env, cron, "digest");
    assert_eq!(code, 0, "{summary}");
    let receipt: Value =
        serde_json::from_str(&std::fs::read_to_string(cron.join(summary["receipt"].as_str().unwrap())).unwrap())
            .unwrap();
    assert_eq!(
        receipt["inputs"]["commit"],
        approved.as_str(),
        "it fired on the approved tip"
    );
}

fn git_daemon(base: &Path) -> Daemon {
    use std::os::unix::process::CommandExt;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = std::process::Command::new("git")
        .args(["daemon", "--reuseaddr", "--export-all", "--enable=receive-pack"])
        .arg("--listen=127.0.0.1")
        .arg(format!("--port={port}"))
        .arg(format!("--base-path={}", base.display()))
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .process_group(0)
        .spawn()
        .unwrap();
    let daemon = Daemon { child, port };
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return daemon;
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    panic!("git daemon did not listen on {port}");
}

#[test]
fn over_a_network_remote_the_cron_box_fetches_and_pushes_through_git_from_its_sandbox() {
    let env = TestEnv::new();
    let (origin, cron) = laptop_and_cron_box(&env);
    let daemon = git_daemon(&env.home);
    let url = format!("git://127.0.0.1:{}/origin.git", daemon.port);
    git(&env, &cron, &["remote", "set-url", "origin", &url]);

    // The first fire: fetched over git://, fires, pushes from inside its sandbox.
    let (code, summary) = fire_in(&env, &cron, "digest");
    assert_eq!(code, 0, "{summary} {:?}", sync_card(&cron));
    assert_eq!(rev(&env, &cron, "HEAD"), rev(&env, &origin, "refs/heads/main"));

    // An approved change reaches the next fire.
    git(&env, &env.root, &["pull", "-q", "--ff-only"]);
    approve_a_change_and_fire(&env, &cron);
    assert_eq!(rev(&env, &cron, "HEAD"), rev(&env, &origin, "refs/heads/main"));

    // The laptop pushes a record; the cron box's next fire joins it and pushes.
    git(&env, &env.root, &["pull", "-q", "--ff-only"]);
    env.write("reports/laptop/1.md", "from the laptop\n");
    git(&env, &env.root, &["add", "reports/laptop/1.md"]);
    git(&env, &env.root, &["commit", "-qm", "laptop record"]);
    git(&env, &env.root, &["push", "-q", "--no-verify", "origin", "main"]);
    let laptop = rev(&env, &env.root, "HEAD");
    let (code, summary) = fire_in(&env, &cron, "digest");
    assert_eq!(code, 0, "{summary}");
    let tip = rev(&env, &origin, "refs/heads/main");
    assert_eq!(rev(&env, &cron, "HEAD"), tip);
    assert!(
        is_ancestor(&env, &origin, &laptop, &tip),
        "the laptop's commit was kept"
    );
    assert_receipts_hold(&env, &cron, &origin);
    drop(daemon);
}
