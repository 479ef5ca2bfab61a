//! The approved call is exactly-once through every crash (issue 22, item 2). A run
//! paused on an `ask` call, approved with `builder approve-call`, then `runtime
//! resume` killed at a named point around the approved call: before it
//! (`before-approved-call`), after its ledger entry (`after-ledger-started`), after its
//! effect (`after-tool-side-effect`) and after its result is recorded
//! (`after-approved-call`). The next step is either another `runtime resume` or the
//! task's next cron `fire` (which continues the interrupted resume instead of waiting
//! at exit 4). Whatever the point, the call ran at most once, a call that ran is never
//! called stale, one that may have run is `SIDE_EFFECT_UNCERTAIN` with its card, the
//! killed resume's `crashed` card is recorded, the run finishes and nothing is left
//! waiting. The approved command writes `reports/log.txt`, a file it names: pinned as
//! absent at the pause, so its own effect is what the stale check would see.

use crate::crash::{hit_calls, killed, runtime_crashing};
use crate::util::*;
use serde_json::Value;

/// A repository whose task `t` asks for `sh tools/bump.sh reports/log.txt` (which
/// leaves a file under `reports/hits/` per run and appends its call id to the log).
fn approval_env() -> TestEnv {
    let env = crate::crash::counter_env(true);
    env.write(
        "tools/bump.sh",
        "echo \"${RUNTIME_CALL_ID:-none}\" > \"reports/hits/$(date +%s%N)-$$\"\n[ -n \"$1\" ] && echo \"${RUNTIME_CALL_ID:-none}\" >> \"$1\"\nexit 0\n",
    );
    let trace = serde_json::json!({"version": 1, "turns": [
        {"tool_calls": [{"id": "c1", "name": "run_command", "arguments": {"command": "sh tools/bump.sh reports/log.txt"}}]},
        {"content": "# Done\nbumped once"}
    ]});
    env.write("evals/t/replay.json", &trace.to_string());
    let settings = env
        .read("settings/runtime.yaml")
        .replace("\"Bash(sh tools/bump.sh)\"", "\"Bash(sh tools/bump.sh*)\"");
    env.write("settings/runtime.yaml", &settings);
    env.commit_all("an approved call that writes a file it names");
    env
}

/// Fires `t` until it pauses and approves the call; the paused run's id.
fn paused_and_approved(env: &TestEnv) -> String {
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 4, "{summary}\n{stderr}");
    let paused = summary["run_id"].as_str().unwrap().to_string();
    let ok = env.builder(&["approve-call", &paused, "c1", "--by", "Eng <eng@example.com>"]);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    paused
}

/// The next step after the killed resume.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Next {
    Resume,
    CronFire,
}

fn next_step(env: &TestEnv, next: Next, paused: &str) -> (i32, Value) {
    let out = match next {
        Next::Resume => env.runtime(&["resume", paused, "--json"]),
        Next::CronFire => env.runtime(&["fire", "t", "--json"]),
    };
    let summary: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), summary)
}

#[test]
fn a_resume_killed_anywhere_around_the_approved_call_runs_it_at_most_once_and_finishes() {
    // (point, whether the command ran before the kill, the outcome the finished run
    // records for it). A resume killed after its first checkpoint (after the approved
    // call) is continued from that checkpoint, under its own id, with no card; one
    // killed before it is closed as crashed and the pause is continued.
    let points = [
        ("before-approved-call", false, "ok"),
        ("after-ledger-started", false, "SIDE_EFFECT_UNCERTAIN"),
        ("after-tool-side-effect", true, "SIDE_EFFECT_UNCERTAIN"),
        ("after-approved-call", true, "ok"),
    ];
    for (point, ran_before, outcome) in points {
        let continued = point == "after-approved-call";
        for next in [Next::Resume, Next::CronFire] {
            let case = format!("{point} then {next:?}");
            let env = approval_env();
            let paused = paused_and_approved(&env);
            let out = runtime_crashing(&env, point, &["resume", &paused, "--json"]);
            assert!(killed(&out), "{case}: the crash point fired: {:?}", out.status);
            assert_eq!(
                hit_calls(&env).len(),
                usize::from(ran_before),
                "{case}: the effect before the kill"
            );
            let (code, summary) = next_step(&env, next, &paused);
            let cards = env.card_kinds(&summary);
            assert_eq!(summary["status"], "completed", "{case}: {summary}");
            assert_eq!(code, if continued { 0 } else { 5 }, "{case}: {summary}");
            assert!(
                !cards.contains(&"approval_stale".to_string()),
                "{case}: never stale: {cards:?}"
            );
            assert_eq!(
                cards.contains(&"crashed".to_string()),
                !continued,
                "{case}: a killed resume with no checkpoint of its own is carded: {cards:?}"
            );
            assert_eq!(
                cards.contains(&"side_effect_uncertain".to_string()),
                outcome == "SIDE_EFFECT_UNCERTAIN",
                "{case}: {cards:?}"
            );
            let calls = hit_calls(&env);
            assert!(calls.len() <= 1, "{case}: the approved call ran {} times", calls.len());
            assert_eq!(
                calls.len(),
                usize::from(ran_before || outcome == "ok"),
                "{case}: {calls:?}"
            );
            let receipt = env.receipt(&summary);
            assert_eq!(receipt["resumed_from"], paused.as_str(), "{case}: {receipt}");
            let last = receipt["tool_calls"].as_array().unwrap().last().unwrap().clone();
            assert_eq!(last["outcome"], outcome, "{case}: {last}");
            // Nothing waits any more: the next tick runs the task afresh (and asks
            // again, as every fresh run of this task does), never the old pause.
            let (code, tick, _) = env.fire("t");
            assert_eq!(code, 4, "{case}: {tick}");
            assert_ne!(tick["run_id"], paused.as_str(), "{case}: a fresh run");
            assert!(
                !tick["cards"].as_array().unwrap().is_empty(),
                "{case}: asked again: {tick}"
            );
            crate::crash_suite::check(&env).unwrap_or_else(|e| panic!("{case}: {e}"));
        }
    }
}

#[test]
fn a_stale_approval_closes_the_pause_and_keeps_the_recovery_cards() {
    let env = approval_env();
    let paused = paused_and_approved(&env);
    // A resume killed before the call, then a person changes the file the call names.
    let out = runtime_crashing(&env, "before-approved-call", &["resume", &paused, "--json"]);
    assert!(killed(&out), "the crash point fired: {:?}", out.status);
    env.write("reports/log.txt", "a person's line\n");
    let (code, summary) = next_step(&env, Next::Resume, &paused);
    assert_eq!(code, 1, "{summary}");
    let cards = env.card_kinds(&summary);
    assert!(cards.contains(&"approval_stale".to_string()), "{cards:?}");
    assert!(
        cards.contains(&"crashed".to_string()),
        "the killed resume's card is recorded with the refusal: {cards:?}"
    );
    assert!(summary["commit"].is_string(), "{summary}");
    assert!(hit_calls(&env).is_empty(), "the stale call never ran");
    // The pause is closed: the task is not held at exit 4 by it; the next fire runs
    // afresh and asks again, and that pause can be approved and resumed.
    let (code, tick, _) = env.fire("t");
    assert_eq!(code, 4, "{tick}");
    let fresh = tick["run_id"].as_str().unwrap().to_string();
    assert_ne!(fresh, paused);
    let ok = env.builder(&["approve-call", &fresh, "c1", "--by", "Eng <eng@example.com>"]);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    let (code, done) = next_step(&env, Next::Resume, &fresh);
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(code, TestEnv::completed_code(&done));
    assert_eq!(hit_calls(&env), vec!["c1"], "the re-asked call ran once");
    let paths = env.last_commit_paths();
    assert!(
        paths.iter().any(|p| p == done["receipt"].as_str().unwrap()),
        "the finished run's records are committed: {paths:?}"
    );
    // (The person's `reports/log.txt` went into the stale resume's commit as a file
    // new under `reports/`; the re-asked call appends to it, and the runtime never
    // rewrites a committed file: that one change stays the person's to commit.)
}

#[test]
fn a_decided_pause_the_cron_tick_cannot_continue_names_resume_only() {
    let env = approval_env();
    let paused = paused_and_approved(&env);
    // Approved, never resumed: the tick waits, and its hint is the one way out.
    let (code, tick, _) = env.fire("t");
    assert_eq!(code, 4, "{tick}");
    let hint = tick["hint"].as_str().unwrap();
    assert!(hint.contains(&format!("runtime resume {paused}")), "{hint}");
    assert!(!hint.contains("approve-call"), "already approved: {hint}");
}

/// A fire killed right after it gave up such a pause (the run row says failed,
/// `checkpoint_failed`) and before its commit does not lose the card: it was kept
/// before the row changed, and the next fire commits it (helper-81: the card was lost,
/// and the paused run's committed receipt still said waiting).
#[test]
fn a_pause_given_up_by_a_fire_killed_before_its_commit_still_gets_its_card() {
    let env = approval_env();
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 4, "{summary}\n{stderr}");
    let paused = summary["run_id"].as_str().unwrap().to_string();
    let db = rusqlite::Connection::open(env.root.join(".runtime/state.db")).unwrap();
    db.execute("UPDATE checkpoints SET state = 'garbage' WHERE run_id = ?1", [&paused])
        .unwrap();
    drop(db);
    let out = runtime_crashing(&env, "checkpoint-given-up", &["fire", "t", "--json"]);
    assert!(
        killed(&out),
        "killed at the point: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let db = rusqlite::Connection::open(env.root.join(".runtime/state.db")).unwrap();
    let row: (String, String) = db
        .query_row(
            "SELECT status, stop_reason FROM runs WHERE run_id = ?1",
            [&paused],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    drop(db);
    assert_eq!(
        row,
        ("failed".into(), "checkpoint_failed".into()),
        "given up before the kill"
    );
    // Committed `checkpoint_failed` cards naming the paused run.
    let committed = |env: &TestEnv| {
        let out = env.git_in(
            &env.root,
            &["grep", "-l", "-e", "checkpoint_failed", "HEAD", "--", "cards"],
        );
        let files = String::from_utf8_lossy(&out.stdout).into_owned();
        files
            .lines()
            .filter(|f| env.git_ok(&env.root, &["show", f]).contains(&paused))
            .count()
    };
    assert_eq!(committed(&env), 0, "nothing committed by the killed fire");
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 4, "the task runs afresh and asks again: {summary}\n{stderr}");
    assert_eq!(committed(&env), 1, "the card, once: {summary}");
    let (_, again, _) = env.fire("t");
    assert_eq!(committed(&env), 1, "not repeated by a later fire: {again}");
}

/// A paused run whose checkpoint cannot be read (a damaged row, or a format an
/// upgrade cannot read) no longer holds its task forever: the next fire gives it up
/// on a `checkpoint_failed` card and runs afresh, pausing again for its call
/// (helper-79: every fire exited 4, and `approve-call` and `resume` both failed).
#[test]
fn a_pause_whose_checkpoint_cannot_be_read_is_given_up_on_a_card() {
    let env = approval_env();
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 4, "{summary}\n{stderr}");
    let paused = summary["run_id"].as_str().unwrap().to_string();
    let db = rusqlite::Connection::open(env.root.join(".runtime/state.db")).unwrap();
    let damaged = db
        .execute("UPDATE checkpoints SET state = 'garbage' WHERE run_id = ?1", [&paused])
        .unwrap();
    assert_eq!(damaged, 1);
    drop(db);
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 4, "it asks again: {summary}\n{stderr}");
    assert_ne!(
        summary["run_id"].as_str(),
        Some(paused.as_str()),
        "a new run: {summary}"
    );
    assert!(
        env.card_kinds(&summary).contains(&"checkpoint_failed".to_string()),
        "{summary}"
    );
    let runs = env.runtime(&["runs", "--json"]);
    let runs: Value = serde_json::from_slice(&runs.stdout).unwrap();
    let old = runs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["run_id"] == paused.as_str())
        .unwrap()
        .clone();
    assert_eq!(
        (old["status"].as_str(), old["stop_reason"].as_str()),
        (Some("failed"), Some("checkpoint_failed")),
        "{old}"
    );
}
