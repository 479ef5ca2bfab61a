//! Faults named, not hidden (issue 11, item 6): a damaged state database is moved
//! aside, rebuilt and reported with a `state_reset` card while the fire completes;
//! `runtime runs` and `runtime show` read the store without writing, so they work on
//! a read-only `.runtime` and on a full disk (both in a private mount namespace,
//! `unshare -m`, since chmod does not stop root).

use crate::exit_codes::{in_namespace, no_mount_namespace};
use crate::util::*;
use serde_json::Value;

#[test]
fn a_damaged_state_db_gives_a_state_reset_card_and_the_fire_completes() {
    let env = TestEnv::new();
    let (code, first, stderr) = env.fire("digest");
    assert_eq!(code, 0, "{stderr}");
    let db = env.root.join(".runtime/state.db");
    // Damaged on disk, log and all (pages still in the log would hide the damage:
    // SQLite reads them from there).
    std::fs::write(&db, vec![0x42; 16384]).unwrap();
    for side in ["state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(env.root.join(".runtime").join(side));
    }

    // A fire that ends before its task lock (a mistyped task) leaves the damaged
    // file where it is: moving it aside is the locked fire's to do, and to card.
    let (code, _, stderr) = env.fire("digset");
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(std::fs::read(&db).unwrap(), vec![0x42; 16384], "{stderr}");
    let aside = |root: &std::path::Path| -> Vec<String> {
        std::fs::read_dir(root.join(".runtime"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("state.db.damaged-"))
            .collect()
    };
    assert!(aside(&env.root).is_empty(), "{:?}", aside(&env.root));

    let (code, summary, stderr) = env.fire("digest");
    assert_eq!(code, 5, "completed with a card: {stderr}");
    assert_eq!(summary["status"], "accepted");
    assert_eq!(env.card_kinds(&summary), vec!["state_reset"]);
    let card = &env.cards(&summary)[0];
    let detail = card["detail"].as_str().unwrap();
    assert!(detail.contains(".runtime/state.db.damaged-"), "{detail}");
    assert!(detail.contains("not a database"), "{detail}");
    let moved: Vec<String> = std::fs::read_dir(env.root.join(".runtime"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("state.db.damaged-") && !n.ends_with("-wal"))
        .collect();
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert_eq!(
        std::fs::read(env.root.join(".runtime").join(&moved[0])).unwrap(),
        vec![0x42; 16384],
        "the damaged file is kept as it was"
    );
    assert!(env.last_commit_paths().iter().any(|p| p.starts_with("cards/")));

    // Reported once: the next fire is clean, and the new database has its runs.
    let (code, _, stderr) = env.fire("digest");
    assert_eq!(code, 0, "{stderr}");
    let out = env.runtime(&["runs", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let runs: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    let ids: Vec<&str> = runs.iter().map(|r| r["run_id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(
        !ids.contains(&first["run_id"].as_str().unwrap()),
        "the old rows are gone"
    );
}

/// `runtime runs` and `runtime show <run>` in a namespace set up by `setup`.
fn read_commands_work(env: &TestEnv, setup: &str, what: &str) {
    let run_id = {
        let out = env.runtime(&["runs", "--json"]);
        let runs: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        runs[0]["run_id"].as_str().unwrap().to_string()
    };
    let runs = in_namespace(env, setup, &env.command("runtime", &["runs", "--json"]));
    assert_eq!(
        runs.status.code(),
        Some(0),
        "runtime runs on {what}: {}",
        String::from_utf8_lossy(&runs.stderr)
    );
    let listed: Vec<Value> = serde_json::from_slice(&runs.stdout).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["run_id"], run_id.as_str());
    let show = in_namespace(env, setup, &env.command("runtime", &["show", &run_id]));
    assert_eq!(
        show.status.code(),
        Some(0),
        "runtime show on {what}: {}",
        String::from_utf8_lossy(&show.stderr)
    );
    assert!(String::from_utf8_lossy(&show.stdout).contains(&run_id));
}

#[test]
fn runs_and_show_work_on_a_read_only_runtime_dir_and_a_full_disk() {
    if let Some(why) = no_mount_namespace() {
        println!("skipped: {why}");
        return;
    }
    let env = TestEnv::new();
    let (code, _, stderr) = env.fire("digest");
    assert_eq!(code, 0, "{stderr}");
    let read_only = "mount --bind -o ro \"$0/.runtime\" \"$0/.runtime\"";
    // The same files on a small file system filled to the last block.
    let full = "d=$(mktemp -d) && cp -a \"$0/.runtime/.\" \"$d\" && mount -t tmpfs -o size=8m tmpfs \"$0/.runtime\" && cp -a \"$d/.\" \"$0/.runtime\" && rm -rf \"$d\" && { dd if=/dev/zero of=\"$0/.runtime/fill\" bs=4k 2>/dev/null || true; }";
    // As a fire leaves it: the write-ahead log and its shared-memory index beside it.
    read_commands_work(&env, read_only, "a read-only .runtime");
    read_commands_work(&env, full, "a full disk");
    // As a clean close leaves it: no log, no shared-memory file, which SQLite then
    // cannot create to read the database.
    let db = env.root.join(".runtime/state.db");
    let mut store = shared::store::Store::open(&db, shared::state::RUNTIME_SCHEMA).unwrap();
    store.checkpoint().unwrap();
    drop(store);
    for side in ["state.db-wal", "state.db-shm"] {
        std::fs::remove_file(env.root.join(".runtime").join(side)).unwrap();
    }
    read_commands_work(&env, read_only, "a read-only .runtime, no log");
    read_commands_work(&env, full, "a full disk, no log");
    // No database at all: nothing to list, and no error.
    let empty = TestEnv::new();
    let setup = "mkdir -p \"$0/.runtime\" && mount -t tmpfs -o size=64k tmpfs \"$0/.runtime\" && { dd if=/dev/zero of=\"$0/.runtime/fill\" bs=4k 2>/dev/null || true; }";
    let out = in_namespace(&empty, setup, &empty.command("runtime", &["runs", "--json"]));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap(),
        serde_json::json!([])
    );
}

/// The start time of `pid` (`/proc/<pid>/stat` field 22).
fn start_time(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(')').unwrap() + 1..];
    rest.split_whitespace().nth(19).unwrap().parse().unwrap()
}

#[test]
fn a_git_lock_a_killed_runtime_left_is_removed_by_the_next_fire_and_no_other() {
    let env = TestEnv::new();
    // A runtime that recorded its intent, took the index lock, and was killed.
    let mut dead = std::process::Command::new("sleep").arg("30").spawn().unwrap();
    let (pid, started) = (dead.id(), start_time(dead.id()));
    dead.kill().unwrap();
    dead.wait().unwrap();
    let lock = env.root.join(".git/index.lock");
    std::fs::write(&lock, "").unwrap();
    let intents = env.root.join(".runtime/locks");
    std::fs::create_dir_all(&intents).unwrap();
    let intent = intents.join(format!("git-intent-{pid}.json"));
    let record = serde_json::json!({"pid": pid, "start_time": started, "locks": [{"path": lock}], "files": []});
    std::fs::write(&intent, record.to_string()).unwrap();

    let (code, summary, stderr) = env.fire("digest");
    assert_eq!(code, 0, "{stderr}");
    assert!(summary["commit"].is_string());
    assert!(!lock.exists() && !intent.exists());
    let status = std::process::Command::new("git")
        .args(["-C", env.root.to_str().unwrap(), "status", "--porcelain"])
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    assert!(status.status.success());
    assert_eq!(String::from_utf8_lossy(&status.stdout), "", "HEAD and the index agree");

    // A lock no intent names may be a person's git: named, never removed.
    std::fs::write(&lock, "").unwrap();
    let t = std::time::Instant::now();
    let (code, summary, stderr) = env.fire("digest");
    assert_eq!(code, 1, "{stderr}");
    assert!(
        t.elapsed() >= std::time::Duration::from_secs(5),
        "it waited for the lock"
    );
    let message = summary["message"].as_str().unwrap();
    assert!(message.contains(&lock.display().to_string()), "{message}");
    assert!(lock.exists());
    let receipt = summary["receipt"].as_str().unwrap();
    assert!(env.root.join(receipt).exists(), "the records stay in the work tree");
}

/// `(status, receipt_path)` of run `run_id` in the state database.
fn run_row(env: &TestEnv, run_id: &str) -> (String, Option<String>) {
    let db = rusqlite::Connection::open(env.root.join(".runtime/state.db")).unwrap();
    db.query_row(
        "SELECT status, receipt_path FROM runs WHERE run_id = ?1",
        [run_id],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .unwrap()
}

#[test]
fn a_commit_blocked_by_a_persons_index_lock_is_carded_and_the_next_fire_of_any_task_commits_its_records() {
    let env = crate::crash::counter_env(false);
    env.write("prompts/u.md", PLAIN_PROMPT);
    env.commit_all("a second task");
    // A person's git at work: an index lock no runtime intent names, held throughout
    // the fire.
    let lock = env.root.join(".git/index.lock");
    std::fs::write(&lock, "a person's git").unwrap();
    let head = env.head_id();
    let (code, blocked, stderr) = env.fire("t");
    assert_eq!(code, 1, "{blocked}\n{stderr}");
    assert!(
        stderr.contains(&lock.display().to_string()),
        "the lock is named: {stderr}"
    );
    assert!(blocked["commit"].is_null());
    assert_eq!(env.head_id(), head, "nothing committed");
    assert_eq!(
        std::fs::read_to_string(&lock).unwrap(),
        "a person's git",
        "the lock is left alone"
    );
    let cards = env.cards(&blocked);
    let card = cards
        .iter()
        .find(|c| c["kind"] == "commit_blocked")
        .unwrap_or_else(|| panic!("a commit_blocked card: {cards:?}"));
    assert!(card["detail"].as_str().unwrap().contains("index.lock"), "{card:?}");
    let run = blocked["run_id"].as_str().unwrap();
    let receipt = blocked["receipt"].as_str().unwrap().to_string();
    let report = blocked["report"].as_str().unwrap().to_string();
    assert!(env.root.join(&receipt).is_file() && env.root.join(&report).is_file());
    assert_eq!(
        run_row(&env, run),
        ("completed".to_string(), Some(receipt.clone())),
        "the blocked run's row points at its receipt"
    );
    assert_eq!(crate::crash::hits(&env).len(), 1, "the side effect ran once");

    // The person's git is done: the next fire, of another task, commits the blocked
    // run's records with its own.
    std::fs::remove_file(&lock).unwrap();
    let (code, next, stderr) = env.fire("u");
    assert_eq!(code, 0, "{next}\n{stderr}");
    let repo = git2::Repository::open(&env.root).unwrap();
    let tree = repo.head().unwrap().peel_to_tree().unwrap();
    let card_paths: Vec<String> = blocked["cards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| {
            let id = id.as_str().unwrap();
            let day = std::fs::read_dir(env.root.join("cards"))
                .unwrap()
                .flatten()
                .find(|d| d.path().join(format!("{id}.yaml")).exists())
                .unwrap();
            format!("cards/{}/{id}.yaml", day.file_name().to_string_lossy())
        })
        .collect();
    for path in [&receipt, &report].into_iter().chain(&card_paths) {
        let entry = tree
            .get_path(std::path::Path::new(path))
            .unwrap_or_else(|_| panic!("{path} is committed"));
        assert_eq!(
            repo.find_blob(entry.id()).unwrap().content(),
            std::fs::read(env.root.join(path)).unwrap(),
            "{path} committed as written"
        );
    }
    let (code, _, stderr) = env.fire("t");
    assert_eq!(code, 0, "{stderr}");
    // Nothing lost, duplicated or left uncommitted; one row per receipt; no lock left.
    crate::crash_suite::check(&env).unwrap();
    let audit = env.builder(&["audit"]);
    assert!(audit.status.success(), "{}", String::from_utf8_lossy(&audit.stdout));
}

#[test]
fn a_checkpoint_that_cannot_be_written_stops_the_fire_before_its_next_tool_call() {
    if let Some(why) = no_mount_namespace() {
        println!("skipped: {why}");
        return;
    }
    // The model's first call fills the disk under `.runtime` (its scratch directory
    // lives there) and leaves a marker; its second would run the side-effecting
    // `tools/bump.sh`.
    let env = crate::crash::counter_env(false);
    env.write(
        "tools/fill.sh",
        "[ -e reports/filled ] && exit 0\ndd if=/dev/zero of=\"$TMPDIR/fill\" bs=64k 2>/dev/null\necho \"$(du -k \"$TMPDIR/fill\" | cut -f1) KB\" > reports/filled\n",
    );
    let trace = serde_json::json!({"version": 1, "turns": [
        {"tool_calls": [{"id": "c1", "name": "run_command", "arguments": {"command": "sh tools/fill.sh"}}]},
        {"tool_calls": [{"id": "c2", "name": "run_command", "arguments": {"command": "sh tools/bump.sh"}}]},
        {"content": "# Done\nfilled, then bumped"}
    ]});
    env.write("evals/t/replay.json", &trace.to_string());
    // With the sandbox on, the scratch lives in the tool worker's size-limited tmpfs
    // and never reaches `.runtime`'s disk (tests/host_view.rs): the full disk is
    // played with the sandbox off, where the scratch is the directory on disk.
    let settings = env
        .read("settings/runtime.yaml")
        .replace(
            "    - \"Bash(sh tools/bump.sh)\"",
            "    - \"Bash(sh tools/bump.sh)\"\n    - \"Bash(sh tools/fill.sh)\"",
        )
        .replace("  landlock: required", "  landlock: off");
    env.write("settings/runtime.yaml", &settings);
    env.commit_all("a task that fills the disk");

    // Two fires on one small tmpfs at `.runtime` (a private mount namespace): the
    // first meets the full disk, the second runs after it.
    let out = env.home.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let script = r#"mkdir -p "$0/.runtime" && mount -t tmpfs -o size=1m tmpfs "$0/.runtime" && cd "$0" &&
for n in 1 2; do "$1" fire t --json > "$2/$n.json" 2> "$2/$n.err"; echo $? > "$2/$n.code"; done &&
cp .runtime/state.db .runtime/state.db-wal "$2/""#;
    let template = env.command("runtime", &[]);
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["-m", "sh", "-c", script])
        .arg(&env.root)
        .arg(bin("runtime"))
        .arg(&out)
        .env_clear();
    for (k, v) in template.get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    let ran = cmd.output().unwrap();
    assert!(ran.status.success(), "{}", String::from_utf8_lossy(&ran.stderr));
    let read = |name: &str| std::fs::read_to_string(out.join(name)).unwrap();
    let (first, stderr): (Value, String) = (serde_json::from_str(&read("1.json")).unwrap(), read("1.err"));

    // The payload ran: the disk was filled.
    let filled = env.read("reports/filled");
    assert!(filled.trim().ends_with("KB"), "the fill ran: {filled}");
    // ... and the fire stopped before the next call: exit 1, named, carded.
    assert_eq!(read("1.code").trim(), "1", "{first}\n{stderr}");
    assert_eq!(first["stop_reason"], "checkpoint_failed", "{first}");
    assert!(
        stderr.contains(".runtime/state.db"),
        "the state database is named: {stderr}"
    );
    let cards = env.cards(&first);
    let card = cards
        .iter()
        .find(|c| c["kind"] == "checkpoint_failed")
        .unwrap_or_else(|| panic!("a checkpoint_failed card: {cards:?}"));
    assert!(
        card["summary"].as_str().unwrap().contains(".runtime/state.db"),
        "{card:?}"
    );
    let run1 = first["run_id"].as_str().unwrap();
    assert!(first["commit"].is_string(), "the records are committed: {first}");
    let hits = crate::crash::hits(&env);
    assert!(
        !hits.iter().any(|h| h.starts_with(run1)),
        "no tool call after the step that was not saved: {hits:?}"
    );

    // The next fire completes, and runs the side effect once.
    let second: Value = serde_json::from_str(&read("2.json")).unwrap();
    assert_eq!(read("2.code").trim(), "0", "{second}\n{}", read("2.err"));
    let run2 = second["run_id"].as_str().unwrap();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert!(hits[0].starts_with(run2), "{hits:?}");
    // The state the namespace held, where the checks read it.
    for f in ["state.db", "state.db-wal"] {
        std::fs::copy(out.join(f), env.root.join(".runtime").join(f)).unwrap();
    }
    crate::crash_suite::check(&env).unwrap();
}

#[test]
fn an_emptied_state_db_is_a_reset_with_a_card_and_the_waiting_run_is_asked_again() {
    let env = crate::crash::counter_env(true);
    let (code, paused, _) = env.fire("t");
    assert_eq!(code, 4, "{paused}");
    let paused_run = paused["run_id"].as_str().unwrap().to_string();
    // The state database is emptied (a full disk, a file system crash): 0 bytes.
    let db = env.root.join(".runtime/state.db");
    {
        let mut store = shared::store::Store::open(&db, shared::state::RUNTIME_SCHEMA).unwrap();
        store.checkpoint().unwrap();
    }
    for side in ["state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(env.root.join(".runtime").join(side));
    }
    std::fs::write(&db, b"").unwrap();
    // The next tick says so with a card, and the task is not held by a pause nobody
    // can settle: it runs afresh and asks again.
    let (code, tick, stderr) = env.fire("t");
    assert_eq!(code, 4, "{tick}\n{stderr}");
    assert_ne!(tick["run_id"], paused_run.as_str(), "a fresh run asks again");
    let kinds = env.card_kinds(&tick);
    assert!(kinds.contains(&"state_reset".to_string()), "{kinds:?}");
    assert!(kinds.contains(&"approval_needed".to_string()), "{kinds:?}");
    let card = env
        .cards(&tick)
        .into_iter()
        .find(|c| c["kind"] == "state_reset")
        .unwrap();
    let detail = card["detail"].as_str().unwrap();
    assert!(
        detail.contains("empty (0 bytes)") && detail.contains("asks again"),
        "{detail}"
    );
    assert!(crate::crash::hits(&env).is_empty(), "nothing ran unasked");
}

#[test]
fn a_damaged_state_db_keeps_a_readable_pause_waiting() {
    let env = crate::crash::counter_env(true);
    let (code, paused, _) = env.fire("t");
    assert_eq!(code, 4, "{paused}");
    let paused_run = paused["run_id"].as_str().unwrap().to_string();
    let ok = env.builder(&["approve-call", &paused_run, "c1", "--by", "Eng <eng@example.com>"]);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    // Pages of the tail of the file scribbled over, its log gone: quick_check fails,
    // the pause is still readable.
    let db = env.root.join(".runtime/state.db");
    {
        let mut store = shared::store::Store::open(&db, shared::state::RUNTIME_SCHEMA).unwrap();
        store
            .write(|tx| {
                for i in 0..3000 {
                    tx.execute(
                        "INSERT INTO meta (key, value) VALUES (?1, ?2)",
                        rusqlite::params![format!("k{i:05}"), "v".repeat(200)],
                    )?;
                }
                Ok(())
            })
            .unwrap();
        store.checkpoint().unwrap();
    }
    for side in ["state.db-wal", "state.db-shm"] {
        let _ = std::fs::remove_file(env.root.join(".runtime").join(side));
    }
    let mut bytes = std::fs::read(&db).unwrap();
    let len = bytes.len();
    for b in &mut bytes[len - 40 * 4096..len - 20 * 4096] {
        *b = 0xff;
    }
    std::fs::write(&db, bytes).unwrap();
    let out = env.runtime(&["resume", &paused_run, "--json"]);
    let resumed: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(resumed["status"], "completed", "the kept pause resumed: {resumed}");
    let kinds = env.card_kinds(&resumed);
    assert!(kinds.contains(&"state_reset".to_string()), "{kinds:?}");
    let card = env
        .cards(&resumed)
        .into_iter()
        .find(|c| c["kind"] == "state_reset")
        .unwrap();
    assert!(card["detail"].as_str().unwrap().contains(&paused_run), "{card:?}");
    assert_eq!(crate::crash::hit_calls(&env), vec!["c1"], "the approved call ran once");
}

/// A model (or a trace) reporting absurd token counts: the fire ends as any other,
/// its counts held to the cap, and `builder history` indexes and sums them (helper-79:
/// a panic, exit 101, and every later fire resumed into it; a receipt edited to hold
/// such counts made `history runs` and `retro` exit 70).
#[test]
fn absurd_token_counts_are_held_to_a_cap_and_never_overflow() {
    let env = TestEnv::new();
    let trace = env.home.join("huge.json");
    let turn = serde_json::json!({"content": format!("# Digest\n{}", "x".repeat(200)), "usage": {"input": u64::MAX, "output": 5}});
    std::fs::write(
        &trace,
        serde_json::json!({"version": 1, "model": "m", "turns": [turn]}).to_string(),
    )
    .unwrap();
    for _ in 0..2 {
        let out = env.runtime(&["fire", "digest", "--json", "--replay", trace.to_str().unwrap()]);
        let summary: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        assert_eq!(out.status.code(), Some(TestEnv::completed_code(&summary)), "{summary}");
        let receipt = env.receipt(&summary);
        assert_eq!(
            receipt["tokens"]["input"].as_u64(),
            Some(shared::records::Tokens::CAP),
            "{receipt}"
        );
    }
    // A person edits a receipt to hold counts past any integer's reach.
    let rel = env
        .git_ok(&env.root, &["ls-files", "runs"])
        .lines()
        .find(|l| l.ends_with(".json"))
        .unwrap()
        .to_string();
    let mut receipt: Value = serde_json::from_str(&env.read(&rel)).unwrap();
    receipt["tokens"] = serde_json::json!({"input": u64::MAX, "output": u64::MAX});
    env.write(&rel, &serde_json::to_string_pretty(&receipt).unwrap());
    env.commit_all("edit a receipt");
    for args in [&["history", "runs"][..], &["retro"]] {
        let out = env.builder(args);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
