//! Crash-safe runs (issue 11, items 2 and 3): a run exists from its first moment (a
//! `running` row before prefetch, a checkpoint after every step), and each call the
//! worker runs moves through the tool ledger `intended -> started -> completed`. The
//! runtime binary here is built with the `failpoints` feature: `RUNTIME_FAILPOINTS`
//! SIGKILLs it at a named point, so each crash lands exactly where the test says.

use crate::skip::Capability;
use crate::util::*;
use serde_json::Value;
use std::process::Output;

/// A repository whose task `t` runs `sh tools/bump.sh` once (the script leaves a new
/// file under `reports/hits/` holding its `RUNTIME_CALL_ID`, `<run-id>:<call-id>`: one
/// file per time the side effect happened), then answers.
pub fn counter_env(ask: bool) -> TestEnv {
    let env = TestEnv::new();
    let trace = serde_json::json!({"version": 1, "turns": [
        {"tool_calls": [{"id": "c1", "name": "run_command", "arguments": {"command": "sh tools/bump.sh"}}]},
        {"content": "# Done\nbumped once"}
    ]});
    env.write("evals/t/replay.json", &trace.to_string());
    env.write(
        "tools/bump.sh",
        "echo \"${RUNTIME_CALL_ID:-none}\" > \"reports/hits/$(date +%s%N)-$$\"\n",
    );
    let rule = "    - \"Bash(sh tools/bump.sh)\"";
    let settings = env
        .read("settings/runtime.yaml")
        .replace("evals/digest/replay.json", "evals/t/replay.json")
        .replace(
            "    - \"Bash(curl*)\"",
            &format!("    - \"Bash(curl*)\"\n{}", if ask { rule } else { "" }),
        )
        .replace(
            "    - \"Bash(head*)\"",
            &format!("    - \"Bash(head*)\"\n{}", if ask { "" } else { rule }),
        );
    env.write("settings/runtime.yaml", &settings);
    env.write("prompts/t.md", PLAIN_PROMPT);
    env.commit_all("counter task");
    std::fs::create_dir_all(env.root.join("reports/hits")).unwrap();
    env
}

/// Runs `runtime <args>` with the crash points `points` armed.
pub fn runtime_crashing(env: &TestEnv, points: &str, args: &[&str]) -> Output {
    env.command("runtime", args)
        .env("RUNTIME_FAILPOINTS", points)
        .output()
        .expect("run runtime")
}

/// Whether the process was killed by SIGKILL.
pub fn killed(out: &Output) -> bool {
    use std::os::unix::process::ExitStatusExt;
    out.status.signal() == Some(libc::SIGKILL)
}

/// The `RUNTIME_CALL_ID` in each file of `reports/hits`: one per time the side effect
/// happened.
pub fn hits(env: &TestEnv) -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(env.root.join("reports/hits"))
        .map(|d| {
            d.flatten()
                .map(|e| std::fs::read_to_string(e.path()).unwrap().trim().to_string())
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

/// The call ids of [`hits`] (the part after the run id).
pub fn hit_calls(env: &TestEnv) -> Vec<String> {
    hits(env)
        .iter()
        .map(|h| h.rsplit(':').next().unwrap().to_string())
        .collect()
}

/// `runtime runs --json`.
pub fn runs(env: &TestEnv) -> Vec<Value> {
    let out = env.runtime(&["runs", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice::<Value>(&out.stdout)
        .unwrap()
        .as_array()
        .cloned()
        .unwrap()
}

/// The tool ledger: `(run_id, call_id, stage, result_hash)` rows.
pub fn ledger(env: &TestEnv) -> Vec<(String, String, String, Option<String>)> {
    let db = rusqlite::Connection::open(env.root.join(".runtime/state.db")).unwrap();
    let mut stmt = db
        .prepare("SELECT run_id, call_id, stage, result_hash FROM tool_ledger ORDER BY run_id, call_id")
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn a_killed_run_keeps_its_running_row_and_its_started_call() {
    let env = counter_env(false);
    let out = runtime_crashing(&env, "after-ledger-started", &["fire", "t", "--json"]);
    assert!(killed(&out), "the crash point fired: {:?}", out.status);
    assert!(hits(&env).is_empty(), "killed before the tool ran");
    let rows = runs(&env);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["status"], "running");
    assert_eq!(rows[0]["process"], "gone", "runs checks the run's process: {rows:?}");
    assert_eq!(rows[0]["steps"], 1, "the first step's checkpoint is in the row");
    let listed = env.runtime(&["runs"]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        text.lines().any(|l| l.split_whitespace().nth(2) == Some("interrupted")),
        "a dead run is not shown as running: {text}"
    );
    let run_id = rows[0]["run_id"].as_str().unwrap().to_string();
    let show = env.runtime(&["show", &run_id]);
    assert!(show.status.success(), "{}", String::from_utf8_lossy(&show.stderr));
    assert!(String::from_utf8_lossy(&show.stdout).contains("running"));
    assert_eq!(
        ledger(&env),
        vec![(run_id.clone(), "c1".into(), "started".into(), None)]
    );
    // The step's checkpoint holds the conversation up to the model's call.
    let db = rusqlite::Connection::open(env.root.join(".runtime/state.db")).unwrap();
    let (step, state): (u32, String) = db
        .query_row("SELECT step, state FROM live_runs WHERE run_id = ?1", [&run_id], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(step, 1);
    let state: Value = serde_json::from_str(&state).unwrap();
    let last = state["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["tool_calls"][0]["id"], "c1", "{last}");
}

#[test]
fn a_completed_call_is_in_the_ledger_with_its_result_hash_and_its_call_id_reached_the_tool() {
    let env = counter_env(false);
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        hits(&env),
        vec![format!("{}:c1", summary["run_id"].as_str().unwrap())],
        "RUNTIME_CALL_ID names the run and the call"
    );
    let rows = ledger(&env);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0].1.as_str(), rows[0].2.as_str()), ("c1", "completed"));
    assert_eq!(rows[0].3.as_ref().map(String::len), Some(64), "a SHA-256 of the result");
    let listed = runs(&env);
    assert_eq!(listed[0]["run_id"], summary["run_id"]);
    assert_eq!(listed[0]["status"], "completed");
    let db = rusqlite::Connection::open(env.root.join(".runtime/state.db")).unwrap();
    let live: i64 = db
        .query_row("SELECT count(*) FROM live_runs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(live, 0, "an ended run leaves no live row");
}

#[test]
fn an_approved_call_runs_once_however_often_resume_is_killed_and_run() {
    let env = counter_env(true);
    let (code, summary, _) = env.fire("t");
    assert_eq!(code, 4, "waiting for approval");
    let paused = summary["run_id"].as_str().unwrap().to_string();
    let ok = env.builder(&["approve-call", &paused, "c1", "--by", "Eng <eng@example.com>"]);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    // The first resume runs the approved call and is killed before it is recorded.
    let out = runtime_crashing(&env, "after-tool-side-effect", &["resume", &paused, "--json"]);
    assert!(killed(&out), "the crash point fired: {:?}", out.status);
    assert_eq!(hit_calls(&env), vec!["c1"]);
    // The next resume finds the call started: a command is never run again; the model
    // is told and a card says so.
    let out = env.runtime(&["resume", &paused, "--json"]);
    let resumed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(resumed["status"], "completed", "{resumed}");
    assert_eq!(hit_calls(&env), vec!["c1"], "the approved call ran exactly once");
    assert_eq!(
        env.card_kinds(&resumed),
        vec!["crashed", "side_effect_uncertain"],
        "the killed resume is closed; the uncertain call is named: {:?}",
        env.cards(&resumed)
    );
    let receipt = env.receipt(&resumed);
    let last = receipt["tool_calls"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["outcome"], "SIDE_EFFECT_UNCERTAIN", "{last}");
    // And a finished run has nothing left to resume.
    let again = env.runtime(&["resume", &paused]);
    assert_eq!(again.status.code(), Some(2));
    assert_eq!(hit_calls(&env), vec!["c1"]);
}

/// [`counter_env`] with an asked call `c1` (`tools/bump.sh`) then an allowed one `c2`
/// (`tools/bump2.sh`, the same counter), paused on `c1` and approved: the paused run.
fn approved_pause_then_a_call() -> (TestEnv, String) {
    approved_pause_then(false)
}

/// [`approved_pause_then_a_call`], with `c2` asked too when `c2_asks`.
fn approved_pause_then(c2_asks: bool) -> (TestEnv, String) {
    let env = counter_env(true);
    let trace = serde_json::json!({"version": 1, "turns": [
        {"tool_calls": [{"id": "c1", "name": "run_command", "arguments": {"command": "sh tools/bump.sh"}}]},
        {"tool_calls": [{"id": "c2", "name": "run_command", "arguments": {"command": "sh tools/bump2.sh"}}]},
        {"content": "# Done\nbumped twice"}
    ]});
    env.write("evals/t/replay.json", &trace.to_string());
    env.write("tools/bump2.sh", &env.read("tools/bump.sh"));
    let (list, rule) = match c2_asks {
        true => ("    - \"Bash(sh tools/bump.sh)\"", "    - \"Bash(sh tools/bump.sh)\""),
        false => ("    - \"Bash(head*)\"", "    - \"Bash(head*)\""),
    };
    let settings =
        (env.read("settings/runtime.yaml")).replacen(list, &format!("{rule}\n    - \"Bash(sh tools/bump2.sh)\""), 1);
    env.write("settings/runtime.yaml", &settings);
    env.commit_all("c1 asks, then c2");
    let (code, summary, _) = env.fire("t");
    assert_eq!(code, 4, "waiting for approval: {summary}");
    let paused = summary["run_id"].as_str().unwrap().to_string();
    let ok = env.builder(&["approve-call", &paused, "c1", "--by", "Eng <eng@example.com>"]);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    (env, paused)
}

/// A `runtime resume` killed after a later call than the approved one completed is
/// continued from its own checkpoint, by the next `runtime resume` or the task's next
/// fire: that call never runs again (helper-98: the pause was continued from its own
/// checkpoint, and the model's asking again ran the call twice). One whose records
/// were all written had finished: the next fire commits them and closes the pause,
/// and a `runtime resume` of it says there is nothing left to resume.
#[test]
fn a_killed_resume_is_continued_from_its_own_checkpoint_and_no_call_runs_twice() {
    for next in ["resume", "fire"] {
        let (env, paused) = approved_pause_then_a_call();
        let out = runtime_crashing(&env, "after-model-response@2", &["resume", &paused, "--json"]);
        assert!(killed(&out), "the crash point fired: {:?}", out.status);
        assert_eq!(hit_calls(&env), vec!["c1", "c2"]);
        let out = match next {
            "resume" => env.runtime(&["resume", &paused, "--json"]),
            _ => env.runtime(&["fire", "t", "--json"]),
        };
        let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(summary["status"], "completed", "{next}: {summary}");
        assert_eq!(hit_calls(&env), vec!["c1", "c2"], "{next}: no call ran twice");
    }
    let (env, paused) = approved_pause_then_a_call();
    let out = runtime_crashing(&env, "between-records-and-commit", &["resume", &paused, "--json"]);
    assert!(killed(&out), "the crash point fired: {:?}", out.status);
    let again = env.runtime(&["resume", &paused]);
    assert_eq!(
        again.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(String::from_utf8_lossy(&again.stderr).contains("nothing is left to resume"));
    assert_eq!(hit_calls(&env), vec!["c1", "c2"]);
    let finished = runs(&env)
        .into_iter()
        .find(|r| r["run_id"] != paused.as_str() && r["status"] == "completed")
        .expect("the finished resume's row says what its receipt says");
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 4, "a new run pauses on c1 again: {summary}\n{stderr}");
    let receipt = finished["receipt_path"].as_str().unwrap();
    let held = env.git_in(&env.root, &["cat-file", "-e", &format!("HEAD:{receipt}")]);
    assert!(held.status.success(), "the finished resume's receipt is committed");
    // Killed inside its commit (records staged, the branch not moved yet, or moved
    // with the kept records not dropped): it ended all the same (helper-100: the pause
    // was continued again and c2 ran twice).
    for point in ["before-ref-update", "before-pending-dropped"] {
        let (env, paused) = approved_pause_then_a_call();
        let out = runtime_crashing(&env, point, &["resume", &paused, "--json"]);
        assert!(killed(&out), "the crash point {point} fired: {:?}", out.status);
        let (code, summary, stderr) = env.fire("t");
        assert_eq!(code, 4, "{point}: a fresh run pauses on c1: {summary}\n{stderr}");
        assert_eq!(hit_calls(&env), vec!["c1", "c2"], "{point}: no call ran twice");
        let again = env.runtime(&["resume", &paused]);
        assert_eq!(
            again.status.code(),
            Some(2),
            "{point}: {}",
            String::from_utf8_lossy(&again.stderr)
        );
    }
}

/// A resume that paused again (a second call asked) and was killed before its commit
/// keeps its new pause: once that call is approved, `runtime resume` runs it
/// (helper-100: the pause was taken for ended, and the approved call never ran).
#[test]
fn a_resume_that_paused_again_and_was_killed_keeps_its_new_pause() {
    let (env, paused) = approved_pause_then(true);
    let out = runtime_crashing(&env, "between-records-and-commit", &["resume", &paused, "--json"]);
    assert!(killed(&out), "the crash point fired: {:?}", out.status);
    assert_eq!(hit_calls(&env), vec!["c1"], "c2 waits for approval");
    let ok = env.builder(&["approve-call", &paused, "c2", "--by", "Eng <eng@example.com>"]);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    let out = env.runtime(&["resume", &paused, "--json"]);
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(
        summary["status"],
        "completed",
        "{summary} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(hit_calls(&env), vec!["c1", "c2"], "the approved c2 ran once");
}

#[test]
fn the_next_fire_resumes_an_interrupted_run_under_its_id_and_never_reruns_its_command() {
    let env = counter_env(false);
    let out = runtime_crashing(&env, "after-tool-side-effect", &["fire", "t", "--json"]);
    assert!(killed(&out), "the crash point fired: {:?}", out.status);
    assert_eq!(hit_calls(&env), vec!["c1"]);
    let killed_run = runs(&env)[0]["run_id"].as_str().unwrap().to_string();
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 5, "completed with a card: {stderr}");
    assert_eq!(
        summary["run_id"],
        killed_run.as_str(),
        "the interrupted run is continued"
    );
    assert_eq!(summary["status"], "completed");
    assert_eq!(hit_calls(&env), vec!["c1"], "the command ran once");
    assert_eq!(env.card_kinds(&summary), vec!["side_effect_uncertain"]);
    let rows = runs(&env);
    assert_eq!(rows.len(), 1, "one run, one row: {rows:?}");
    assert_eq!(rows[0]["status"], "completed");
    let receipt = env.receipt(&summary);
    assert_eq!(receipt["run_id"], killed_run.as_str());
    assert_eq!(receipt["tool_calls"][0]["outcome"], "SIDE_EFFECT_UNCERTAIN");
    let paths = env.last_commit_paths();
    assert!(paths.iter().any(|p| p.starts_with("runs/t/")), "{paths:?}");
}

/// A resumed run killed again before its first new checkpoint is resumed again, not
/// closed as crashed: the fire that continued it took its row over without wiping
/// its checkpoint (it wrote step 0 and no state, so the next fire found "no
/// checkpoint yet", removed the run's finished report and receipt and ran its
/// completed command again in a fresh run: helper-96). Killed at its final model
/// response, then its resume killed at its first, the third fire finishes the one
/// run, whose command ran once.
#[test]
fn a_resumed_run_killed_again_is_resumed_again_and_never_reruns_its_command() {
    let env = counter_env(false);
    for point in ["after-model-response@2", "after-model-response"] {
        let out = runtime_crashing(&env, point, &["fire", "t", "--json"]);
        assert!(killed(&out), "the crash point {point} fired: {:?}", out.status);
        assert_eq!(hit_calls(&env), vec!["c1"]);
    }
    let rows = runs(&env);
    assert_eq!(rows.len(), 1, "{rows:?}");
    let run = rows[0]["run_id"].as_str().unwrap().to_string();
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(
        summary["run_id"],
        run.as_str(),
        "the interrupted run is continued: {stderr}"
    );
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(hit_calls(&env), vec!["c1"], "the command ran once");
    let receipt = env.receipt(&summary);
    assert_eq!(receipt["run_id"], run.as_str());
    assert!(env
        .last_commit_paths()
        .iter()
        .any(|p| p.ends_with(&format!("{run}.json"))));
}

/// While a person's merge (or rebase) is in progress, HEAD is not the branch the
/// interrupted run committed to: no fire resumes or closes it then (a resume would
/// write again, untracked, records the operation's commits may hold, which stops
/// `git rebase --abort`), `runtime resume` says why, and the first fire after the
/// operation resumes it under its id.
#[test]
fn an_interrupted_run_waits_for_a_persons_operation_to_end_before_it_is_resumed() {
    let env = counter_env(false);
    let out = runtime_crashing(&env, "after-tool-side-effect", &["fire", "t", "--json"]);
    assert!(killed(&out), "the crash point fired: {:?}", out.status);
    let killed_run = runs(&env)[0]["run_id"].as_str().unwrap().to_string();
    let merge_head = env.root.join(".git/MERGE_HEAD");
    std::fs::write(&merge_head, format!("{}\n", env.head_id())).unwrap();
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(
        (code, &summary["records_kept"]),
        (1, &Value::Bool(true)),
        "{summary}\n{stderr}"
    );
    assert_ne!(summary["run_id"], killed_run.as_str(), "resumed inside the merge");
    let killed_row = |env: &TestEnv| {
        runs(env)
            .into_iter()
            .find(|r| r["run_id"] == killed_run.as_str())
            .map(|r| r["status"].clone())
    };
    assert_eq!(
        killed_row(&env),
        Some(Value::from("running")),
        "settled inside the merge"
    );
    let resumed = env
        .command("runtime", &["resume", &killed_run, "--json"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&resumed.stderr);
    assert_eq!(resumed.status.code(), Some(1), "{said}");
    assert!(
        said.contains("is not resumed now") && said.contains("a merge is in progress"),
        "{said}"
    );
    std::fs::remove_file(&merge_head).unwrap();
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 5, "completed with a card: {summary}\n{stderr}");
    assert_eq!(
        summary["run_id"],
        killed_run.as_str(),
        "the interrupted run is continued"
    );
    assert_eq!(killed_row(&env), Some(Value::from("completed")));
}

/// [`counter_env`] whose first fire is killed between writing its records and
/// committing them, its prompt then changed (so the next fire does not resume it):
/// the env, the killed run's id and its receipt's path.
fn finished_but_uncommitted() -> (TestEnv, String, String) {
    let env = counter_env(false);
    let out = runtime_crashing(&env, "between-records-and-commit", &["fire", "t", "--json"]);
    assert!(killed(&out), "the crash point fired: {:?}", out.status);
    let finished = runs(&env)[0]["run_id"].as_str().unwrap().to_string();
    let day = std::fs::read_dir(env.root.join("runs/t"))
        .unwrap()
        .flatten()
        .next()
        .unwrap();
    let receipt = format!("runs/t/{}/{finished}.json", day.file_name().to_string_lossy());
    assert!(env.root.join(&receipt).is_file(), "the killed run wrote its receipt");
    env.write("prompts/t.md", &format!("{PLAIN_PROMPT}\nCarefully.\n"));
    for args in [
        &["add", "prompts/t.md"][..],
        &["commit", "-qm", "a prompt change: the killed run is not resumed"],
    ] {
        assert!(env.git_in(&env.root, args).status.success());
    }
    (env, finished, receipt)
}

/// Two calls of one response under one id (the model chose both; a redacted id can
/// repeat too): killed after the first completed and the second was handed on, the
/// resumed run names the second uncertain on a card, and runs nothing twice
/// (helper-105: it took the first's ledger entry for both, exit 0, no card). Each
/// call keeps an id of its own (`dup`, `dup_dup2`) in the receipt and the trace.
#[test]
fn two_calls_under_one_id_are_two_calls_across_a_kill() {
    let env = counter_env(false);
    let bump = serde_json::json!({"command": "sh tools/bump.sh"});
    let trace = serde_json::json!({"version": 1, "turns": [
        {"tool_calls": [
            {"id": "dup", "name": "run_command", "arguments": bump},
            {"id": "dup", "name": "run_command", "arguments": bump}
        ]},
        {"content": "# Done\nbumped"}
    ]});
    env.write("evals/t/replay.json", &trace.to_string());
    env.commit_all("two calls under one id");
    let out = runtime_crashing(&env, "after-ledger-started@2", &["fire", "t", "--json"]);
    assert!(killed(&out), "the crash point fired: {:?}", out.status);
    let killed_run = runs(&env)[0]["run_id"].as_str().unwrap().to_string();
    assert_eq!(hit_calls(&env), vec!["dup"], "the first call ran before the kill");
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(summary["run_id"], killed_run.as_str(), "the run is resumed: {stderr}");
    assert_eq!(code, 5, "{summary}\n{stderr}");
    assert_eq!(hit_calls(&env), vec!["dup"], "nothing ran twice");
    let receipt = env.receipt(&summary);
    let calls: Vec<(String, String)> = (receipt["tool_calls"].as_array().unwrap().iter())
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_string(),
                c["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        calls,
        [
            ("dup".to_string(), "ok".to_string()),
            ("dup_dup2".to_string(), "SIDE_EFFECT_UNCERTAIN".to_string())
        ]
    );
    assert_eq!(env.card_kinds(&summary), vec!["side_effect_uncertain"]);
    // `runtime show` lists both: the resumed fire's from its trace, the first from the
    // ledger (the killed fire stored no trace; helper-105: it was left out).
    let shown = env.runtime(&["show", &killed_run]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("dup_dup2"), "{text}");
    let from_ledger = text
        .split("calls no stored trace lists")
        .nth(1)
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        from_ledger
            .lines()
            .any(|l| l.trim_start().starts_with("dup ") && l.contains("completed")),
        "{text}"
    );
}

/// A run killed between writing its records and committing them had finished: when
/// the next fire does not resume it (here its prompt changed since), its report,
/// receipt and the model's outputs its receipt lists are committed by that fire, as
/// it wrote them, its row says what its receipt says, and no `crashed` card stands in
/// for them (they were removed, kept nowhere: helper-96; the outputs were left out:
/// helper-98). A record changed after the run wrote it (another task's tool may edit
/// an uncommitted report) is not committed as the run's: it stays as it is, named on
/// a card.
#[test]
fn a_finished_run_killed_before_its_commit_is_committed_by_the_next_fire_not_removed() {
    let (env, finished, receipt) = finished_but_uncommitted();
    let written = std::fs::read(env.root.join(&receipt)).unwrap();
    let listed: serde_json::Value = serde_json::from_slice(&written).unwrap();
    let outputs: Vec<String> = (listed["outputs"].as_array().unwrap().iter())
        .map(|o| o.as_str().unwrap().to_string())
        .collect();
    assert!(outputs.iter().any(|o| o.starts_with("reports/hits/")), "{outputs:?}");
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 0, "{stderr}");
    assert_ne!(summary["run_id"], finished.as_str());
    let committed = |rel: &str| env.git_in(&env.root, &["cat-file", "-p", &format!("HEAD:{rel}")]);
    let held = committed(&receipt);
    assert!(held.status.success(), "the receipt is not committed: {stderr}");
    assert_eq!(held.stdout, written, "committed as the run wrote it");
    for output in &outputs {
        assert!(
            committed(output).status.success(),
            "{output} is not committed: {stderr}"
        );
    }
    let rows = runs(&env);
    let row = rows.iter().find(|r| r["run_id"] == finished.as_str()).unwrap();
    assert_eq!(row["status"], "completed", "{rows:?}");
    // Its fire never stored its trace; `runtime show` lists its calls from the ledger.
    let shown = env.runtime(&["show", &finished]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success(), "{text}");
    assert!(text.contains("calls no stored trace lists"), "{text}");
    let call = text
        .lines()
        .find(|l| l.trim_start().starts_with("c1 "))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(call.contains("run_command") && call.contains("completed"), "{text}");
    let shown = env.runtime(&["show", &finished, "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(json["ledger"][0]["call_id"], "c1", "{json}");

    let (env, finished, receipt) = finished_but_uncommitted();
    let report = receipt.replace("runs/", "reports/").replace(".json", ".md");
    let edited = format!("{}\nEDITED LATER\n", env.read(&report));
    env.write(&report, &edited);
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 5, "{stderr}");
    assert!(committed_in(&env, &receipt), "the receipt is committed");
    assert!(
        !committed_in(&env, &report),
        "the changed report is not committed as the run's"
    );
    assert_eq!(env.read(&report), edited, "and is left as it is");
    let card = (env.cards(&summary).into_iter())
        .find(|c| c["kind"].as_str() == Some("output_rejected"))
        .unwrap();
    assert!(card["summary"].as_str().unwrap().contains(&finished), "{card:?}");
    let evidence: Vec<&str> = (card["evidence"].as_sequence().unwrap().iter())
        .filter_map(|e| e.as_str())
        .collect();
    assert_eq!(evidence, [report.as_str()], "{card:?}");

    // Removed (another task's tool): named too, not committed silently without it.
    let (env, _, receipt) = finished_but_uncommitted();
    let report = receipt.replace("runs/", "reports/").replace(".json", ".md");
    std::fs::remove_file(env.root.join(&report)).unwrap();
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 5, "{stderr}");
    assert!(committed_in(&env, &receipt), "the receipt is committed");
    let card = (env.cards(&summary).into_iter())
        .find(|c| c["kind"].as_str() == Some("output_rejected"))
        .unwrap_or_else(|| panic!("no card names the missing report: {summary}"));
    let evidence: Vec<&str> = (card["evidence"].as_sequence().unwrap().iter())
        .filter_map(|e| e.as_str())
        .collect();
    assert_eq!(evidence, [format!("{report} (missing)")], "{card:?}");
}

/// Whether HEAD holds `rel`.
fn committed_in(env: &TestEnv, rel: &str) -> bool {
    env.git_in(&env.root, &["cat-file", "-e", &format!("HEAD:{rel}")])
        .status
        .success()
}

#[test]
fn a_run_killed_before_its_first_checkpoint_is_closed_as_crashed_and_the_fire_starts_fresh() {
    let env = counter_env(false);
    let out = runtime_crashing(&env, "after-model-response", &["fire", "t", "--json"]);
    assert!(killed(&out), "the crash point fired: {:?}", out.status);
    let killed_run = runs(&env)[0]["run_id"].as_str().unwrap().to_string();
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 5, "completed with a card: {stderr}");
    assert_ne!(summary["run_id"], killed_run.as_str());
    assert_eq!(hit_calls(&env), vec!["c1"], "the fresh run ran the command once");
    assert_eq!(env.card_kinds(&summary), vec!["crashed"]);
    let card = &env.cards(&summary)[0];
    assert!(card["summary"].as_str().unwrap().contains(&killed_run), "{card:?}");
    assert!(card["summary"].as_str().unwrap().contains("after step 0"), "{card:?}");
    let rows = runs(&env);
    let old = rows.iter().find(|r| r["run_id"] == killed_run.as_str()).unwrap();
    assert_eq!(old["status"], "crashed");
}

#[test]
fn an_interrupted_run_older_than_the_window_is_closed_not_resumed() {
    let env = counter_env(false);
    let settings = env.read("settings/runtime.yaml") + "limits: {resume_window_s: 0}\n";
    env.write("settings/runtime.yaml", &settings);
    env.commit_all("no resume window");
    let out = runtime_crashing(&env, "after-tool-side-effect", &["fire", "t", "--json"]);
    assert!(killed(&out), "the crash point fired: {:?}", out.status);
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 5, "{stderr}");
    assert_eq!(env.card_kinds(&summary), vec!["crashed"]);
    let detail = env.cards(&summary)[0]["detail"].as_str().unwrap().to_string();
    assert!(detail.contains("resume_window_s"), "{detail}");
    assert!(
        detail.contains("after step 1")
            || env.cards(&summary)[0]["summary"]
                .as_str()
                .unwrap()
                .contains("after step 1")
    );
    assert_eq!(hits(&env).len(), 2, "the fresh run is a new run: it runs its own call");
}

#[test]
fn a_cron_tick_while_a_run_waits_for_approval_adds_no_card_and_no_commit() {
    let env = counter_env(true);
    let (code, summary, _) = env.fire("t");
    assert_eq!(code, 4, "waiting for approval");
    let paused = summary["run_id"].as_str().unwrap().to_string();
    let head = env.head_id();
    for _ in 0..2 {
        let (code, tick, stderr) = env.fire("t");
        assert_eq!(code, 4, "{stderr}");
        assert_eq!(tick["status"], "waiting_approval");
        assert!(tick["cards"].as_array().unwrap().is_empty());
        assert!(tick["commit"].is_null());
        assert!(tick["message"].as_str().unwrap().contains(&paused), "{tick}");
    }
    assert_eq!(env.head_id(), head, "no commit");
    assert!(hits(&env).is_empty());
    let rows = runs(&env);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["status"], "waiting_approval");
}

#[test]
fn runtime_resume_continues_a_named_interrupted_run_whatever_its_age() {
    let env = counter_env(false);
    let settings = env.read("settings/runtime.yaml") + "limits: {resume_window_s: 0}\n";
    env.write("settings/runtime.yaml", &settings);
    env.commit_all("no resume window");
    let out = runtime_crashing(&env, "after-tool-side-effect", &["fire", "t", "--json"]);
    assert!(killed(&out), "the crash point fired: {:?}", out.status);
    let run_id = runs(&env)[0]["run_id"].as_str().unwrap().to_string();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let out = env.runtime(&["resume", &run_id, "--json"]);
    let resumed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(5), "{resumed}");
    assert_eq!(resumed["run_id"], run_id.as_str(), "continued under its own id");
    assert_eq!(resumed["status"], "completed");
    assert_eq!(env.card_kinds(&resumed), vec!["side_effect_uncertain"]);
    assert_eq!(hit_calls(&env), vec!["c1"], "the command ran once");
    let again = env.runtime(&["resume", &run_id]);
    assert_eq!(again.status.code(), Some(2), "nothing left to resume");
}

/// Whether process `pid` is gone (no such process, or a zombie nobody reaped yet).
pub fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// The host pid of the live process whose `/proc/<pid>/cmdline` (NUL-separated, no
/// trailing NUL) is `cmdline`.
pub fn process_with_cmdline(cmdline: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|entry| {
        let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
        let found = std::fs::read(entry.path().join("cmdline")).ok()?;
        (found.strip_suffix(b"\0").unwrap_or(&found) == cmdline.as_bytes() && !gone(pid)).then_some(pid)
    })
}

/// [`counter_env`] whose model plays `turns`, with `tools/slow.sh NAME SECONDS`
/// allowed too: it writes `reports/hits/NAME.started`, then becomes `sleep SECONDS`.
/// The command runs in its own PID namespace, where its `$$` means nothing out here,
/// so a test finds it by a sleep length no other process uses.
fn slow_command_env(turns: Value) -> TestEnv {
    let env = counter_env(false);
    env.write(
        "evals/t/replay.json",
        &serde_json::json!({"version": 1, "turns": turns}).to_string(),
    );
    env.write(
        "tools/slow.sh",
        "echo started > reports/hits/$1.started\nexec sleep $2\n",
    );
    let settings = env
        .read("settings/runtime.yaml")
        .replace("Bash(sh tools/bump.sh)", "Bash(sh tools/*)");
    env.write("settings/runtime.yaml", &settings);
    env.commit_all("a slow command");
    env
}

#[test]
fn nothing_the_fire_started_outlives_a_sigkill_of_the_runtime() {
    let env = slow_command_env(serde_json::json!([
        {"tool_calls": [{"id": "c1", "name": "run_command", "arguments": {"command": "sh tools/slow.sh slow 29.731"}}]},
        {"content": "# Done"}
    ]));
    let mut fire = env
        .command("runtime", &["fire", "t", "--json"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The script's marker reaches the work tree only when its call ends (the sandbox
    // copies writes back after each call): the sleep's own process shows it runs.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let pid: i32 = loop {
        if let Some(p) = process_with_cmdline("sleep\x0029.731") {
            break p;
        }
        assert!(std::time::Instant::now() < deadline, "the command never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(!gone(pid), "the command runs while the fire does");
    fire.kill().unwrap();

    fire.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !gone(pid) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(gone(pid), "the tool command {pid} outlived the SIGKILLed runtime");
}

/// The worker asks the kernel for its death signal itself (the runtime spawns it
/// with no hook in the child, as a `vfork`), so a runtime that ended before the
/// worker asked would leave it unbound: a worker whose named runtime is no longer its
/// parent refuses to start. Named rightly, it starts and waits for its configuration.
#[test]
fn a_tool_worker_whose_runtime_has_ended_refuses_to_start() {
    let worker = |parent: u32| {
        std::process::Command::new(bin("runtime"))
            .arg(shared::worker::WORKER_COMMAND)
            .env("RUNTIME_WORKER_PARENT", parent.to_string())
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    // Not its parent: what a worker sees once its runtime died and it was reparented.
    let orphan = worker(1);
    assert_eq!(orphan.status.code(), Some(1), "{orphan:?}");
    let said = String::from_utf8_lossy(&orphan.stderr);
    assert!(said.contains("(1) has ended"), "{said}");
    assert!(orphan.stdout.is_empty(), "it answered: {orphan:?}");
    // Its parent (this test): it starts, finds no configuration on stdin, and says so.
    let bound = worker(std::process::id());
    let said = String::from_utf8_lossy(&bound.stderr);
    assert!(!said.contains("has ended"), "{said}");
}

/// The host pid of the tool worker serving the namespace `pid` runs in: its nearest
/// ancestor whose command line is the worker's (the clone that is PID 1 in there).
fn worker_of(pid: i32) -> Option<i32> {
    let mut at = pid;
    for _ in 0..16 {
        let stat = std::fs::read_to_string(format!("/proc/{at}/stat")).ok()?;
        let ppid: i32 = stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()?;
        let cmdline = std::fs::read(format!("/proc/{ppid}/cmdline")).ok()?;
        if String::from_utf8_lossy(&cmdline).contains(shared::worker::WORKER_COMMAND) {
            return Some(ppid);
        }
        at = ppid;
    }
    None
}

/// Waits for the sleep the script `marker` names becomes (its marker file reaches the
/// work tree only when the call ends), then SIGKILLs the tool worker running that
/// sleep (as the OOM killer would); returns its pid.
fn kill_worker_running(marker: &str, sleep_cmdline: &str) -> i32 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let sleep = loop {
        if let Some(p) = process_with_cmdline(sleep_cmdline) {
            break p;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{marker}: the command never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let worker = worker_of(sleep).expect("the sleep runs under a tool worker");
    // A process of this test's own fire.
    kernel::signal::kill(worker as u32, kernel::signal::Signal::Kill).unwrap();
    worker
}

/// A tool worker killed before it reported its sandbox (the OOM killer, while the
/// runtime prepares) is replaced by the spare, as one killed in a call is: the fire
/// runs its call and completes. It ended as `sandbox_unavailable`, its hint pointing
/// at Landlock (helper-96). Held at `during-recovery`, the runtime has not sent the
/// worker its configuration yet, so the worker dies before any report.
#[test]
fn a_tool_worker_killed_before_its_sandbox_report_is_replaced_by_the_spare() {
    let env = counter_env(false);
    let held = crate::checkout_ops::fire_held_at(&env, "t", "during-recovery");
    let worker = tool_worker_of(held.id() as i32);
    kernel::signal::kill(worker as u32, kernel::signal::Signal::Kill).unwrap();
    while !gone(worker) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let (out, summary) = crate::checkout_ops::resume_held(held);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{summary}\n{stderr}");
    assert_eq!(hit_calls(&env), vec!["c1"], "the call ran, on the spare");
}

/// The tool worker the runtime `runtime` started (not its parked spare, `/bin/sh -c
/// ...`, the worker command only once woken).
fn tool_worker_of(runtime: i32) -> i32 {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .find(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(1)?.parse::<i32>().ok());
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            ppid == Some(runtime)
                && cmdline.split(|b| *b == 0).nth(1) == Some(shared::worker::WORKER_COMMAND.as_bytes())
        })
        .expect("the held fire's tool worker")
}

/// Whether `pid` has no signal pending (a signal sent to it was handled).
fn no_signal_pending(pid: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    ["SigPnd:", "ShdPnd:"].iter().all(|field| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .is_some_and(|v| v.trim().trim_start_matches('0').is_empty())
    })
}

/// A tool worker sent SIGTERM outside a call (by a person's `pkill`, or a service
/// manager), before its sandbox report or while the model thinks between two calls,
/// takes it as an interrupt of the running command, and none runs then: the
/// interrupt is dropped, and the next command runs instead of being cancelled at its
/// start (helper-100: the call ended `TIMEOUT` at once, with no card; helper-107: the
/// first fix held only before the report).
#[test]
fn an_interrupt_sent_to_the_tool_worker_outside_a_call_cancels_no_later_call() {
    for (point, calls) in [("during-recovery", 1), ("after-model-response@2", 2)] {
        let env = counter_env(false);
        let call = |id: &str| serde_json::json!({"tool_calls": [{"id": id, "name": "run_command", "arguments": {"command": "sh tools/bump.sh"}}]});
        let turns: Vec<serde_json::Value> = (1..=calls)
            .map(|i| call(&format!("c{i}")))
            .chain([serde_json::json!({"content": "# Done"})])
            .collect();
        env.write(
            "evals/t/replay.json",
            &serde_json::json!({"version": 1, "turns": turns}).to_string(),
        );
        env.commit_all("calls");
        let held = crate::checkout_ops::fire_held_at(&env, "t", point);
        let worker = tool_worker_of(held.id() as i32);
        kernel::signal::kill(worker as u32, kernel::signal::Signal::Term).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !no_signal_pending(worker) {
            assert!(
                std::time::Instant::now() < deadline,
                "{point}: the worker never took the signal"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert!(!gone(worker), "{point}: the worker caught SIGTERM and lives on");
        let (out, summary) = crate::checkout_ops::resume_held(held);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{point}: {summary}\n{stderr}");
        let receipt = env.receipt(&summary);
        let outcomes: Vec<&str> = (receipt["tool_calls"].as_array().unwrap().iter())
            .map(|c| c["outcome"].as_str().unwrap())
            .collect();
        assert_eq!(outcomes, vec!["ok"; calls], "{point}: {receipt}");
        let ran: Vec<String> = (1..=calls).map(|i| format!("c{i}")).collect();
        assert_eq!(hit_calls(&env), ran, "{point}: every command ran");
    }
}

#[test]
fn a_tool_worker_killed_mid_call_is_replaced_once() {
    // c1 and c3 sleep until their worker is killed; c2 and c4 count.
    let env = slow_command_env(serde_json::json!([
        {"tool_calls": [{"id": "c1", "name": "run_command", "arguments": {"command": "sh tools/slow.sh one 29.713"}}]},
        {"tool_calls": [{"id": "c2", "name": "run_command", "arguments": {"command": "sh tools/bump.sh"}}]},
        {"tool_calls": [{"id": "c3", "name": "run_command", "arguments": {"command": "sh tools/slow.sh two 29.717"}}]},
        {"tool_calls": [{"id": "c4", "name": "run_command", "arguments": {"command": "sh tools/bump.sh"}}]},
        {"content": "# Done"}
    ]));
    let fire = env
        .command("runtime", &["fire", "t", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let first = kill_worker_running("one.started", "sleep\x0029.713");
    let second = kill_worker_running("two.started", "sleep\x0029.717");
    assert_ne!(first, second, "the second call ran on another worker");
    let out = fire.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {stderr}"));
    assert_eq!(out.status.code(), Some(5), "completed with cards: {stderr}");
    // c2 ran once, on the spare; c4 found no worker left and ran nowhere.
    let run = summary["run_id"].as_str().unwrap();
    let counted: Vec<String> = hits(&env).into_iter().filter(|h| h.contains(":c")).collect();
    assert_eq!(counted, vec![format!("{run}:c2")]);
    let receipt = env.receipt(&summary);
    let outcomes: Vec<String> = receipt["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["outcome"].to_string())
        .collect();
    assert_eq!(outcomes.len(), 4, "{outcomes:?}");
    assert!(outcomes[0].contains("SIDE_EFFECT_UNCERTAIN"), "{outcomes:?}");
    assert_eq!(outcomes[1], "\"ok\"", "c2 ran on the new worker: {outcomes:?}");
    assert!(outcomes[2].contains("SIDE_EFFECT_UNCERTAIN"), "{outcomes:?}");
    assert!(
        outcomes[3].contains("FAILED"),
        "no worker left, c4 did not run: {outcomes:?}"
    );
    let kinds = env.card_kinds(&summary);
    assert_eq!(
        kinds.iter().filter(|k| *k == "side_effect_uncertain").count(),
        2,
        "one card per call that may have run: {kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| *k == "sandbox_unavailable").count(),
        1,
        "one card says no worker was left for c4: {kinds:?}"
    );
    let paths = env.last_commit_paths();
    assert!(
        paths.iter().any(|p| p.starts_with("runs/")),
        "the records are committed: {paths:?}"
    );
    assert!(gone(first) && gone(second));
}

/// The files and directories a fire of `env`'s task `t` fsynced, as `strace -y`
/// names them (repo-relative, the run id as `RUN`, a pid between dots as `PID`), and
/// the fire's summary; `None` when `strace` cannot run here. A file fsynced twice
/// is listed twice.
fn fsyncs_of_a_fire(env: &TestEnv) -> Option<(Vec<String>, Value)> {
    if !std::process::Command::new("strace")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        return None;
    }
    let log = env.home.join("fsyncs.txt");
    let _ = std::fs::remove_file(&log);
    let fire = env.command("runtime", &["fire", "t", "--json"]);
    let mut traced = std::process::Command::new("strace");
    traced
        .args(["-f", "-qq", "-y", "-e", "trace=fsync,fdatasync", "-o"])
        .arg(&log)
        .arg(fire.get_program())
        .args(fire.get_args())
        .current_dir(&env.root)
        .env_clear();
    for (k, v) in fire.get_envs() {
        if let Some(v) = v {
            traced.env(k, v);
        }
    }
    let out = traced.output().unwrap();
    let summary: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let run = summary["run_id"].as_str().unwrap().to_string();
    let root = env.root.display().to_string();
    let mut files: Vec<String> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once("fsync(").map(|(_, rest)| rest))
        .filter_map(|rest| {
            rest.split_once('<')
                .and_then(|(_, p)| p.split_once('>'))
                .map(|(p, _)| p)
        })
        .map(|p| {
            p.replace(&root, "")
                .replace(&run, "RUN")
                .split('.')
                .map(|seg| {
                    // A pid, alone or with a temporary name's random part (`4242-5a4211e5`).
                    let pid = seg.split_once('-').map_or(seg, |(pid, _)| pid);
                    match !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) {
                        true => "PID",
                        false => seg,
                    }
                })
                .collect::<Vec<_>>()
                .join(".")
        })
        .collect();
    files.sort();
    Some((files, summary))
}

#[test]
fn durability_strict_fsyncs_checkpoints_and_records_and_normal_does_not() {
    let env = counter_env(false);
    let Some((normal, summary)) = fsyncs_of_a_fire(&env) else {
        crate::skip::skip(Capability::Strace, "strace cannot run here");
        return;
    };
    assert_eq!(summary["exit_code"], 0, "{summary}");
    let day = summary["receipt"]
        .as_str()
        .unwrap()
        .split('/')
        .nth(2)
        .unwrap()
        .to_string();
    let record_syncs = |files: &[String]| -> Vec<String> {
        files
            .iter()
            .filter(|f| f.starts_with("/runs/") || f.starts_with("/reports/") || f.starts_with("/cards/"))
            .cloned()
            .collect()
    };
    assert_eq!(
        record_syncs(&normal),
        Vec::<String>::new(),
        "normal: no record fsync: {normal:?}"
    );
    let wal = |files: &[String]| files.iter().filter(|f| *f == "/.runtime/state.db-wal").count();
    let settings = env.read("settings/runtime.yaml");
    env.write("settings/runtime.yaml", &format!("{settings}durability: strict\n"));
    env.commit_all("durability: strict");
    let (strict, summary) = fsyncs_of_a_fire(&env).unwrap();
    assert_eq!(summary["exit_code"], 0, "{summary}");
    let day2 = summary["receipt"]
        .as_str()
        .unwrap()
        .split('/')
        .nth(2)
        .unwrap()
        .to_string();
    assert_eq!(day, day2, "the test ran across midnight; run it again");
    for expected in [
        format!("/runs/t/{day}/.RUN.json.PID.tmp"),
        format!("/runs/t/{day}"),
        format!("/reports/t/{day}/.RUN.md.PID.tmp"),
        format!("/reports/t/{day}"),
        "/.runtime/state.db-wal".to_string(),
    ] {
        assert!(strict.contains(&expected), "strict: {expected} fsynced: {strict:?}");
    }
    // The run's row, two checkpoints after model responses, the call's `started`
    // entry, its completion and the final answer's checkpoint: each fsynced under
    // strict, none under normal (where the log is synced only when SQLite copies it
    // into the database).
    assert!(
        wal(&strict) >= 5 && wal(&strict) >= wal(&normal) + 4,
        "strict fsyncs each checkpoint: {} fsyncs of the log against {} under normal",
        wal(&strict),
        wal(&normal)
    );
}

#[test]
fn a_wall_clock_stepped_forward_does_not_close_a_resumable_run() {
    let env = counter_env(false);
    let out = runtime_crashing(&env, "after-tool-side-effect", &["fire", "t", "--json"]);
    assert!(killed(&out), "the crash point fired: {:?}", out.status);
    let run_id = runs(&env)[0]["run_id"].as_str().unwrap().to_string();
    // The wall clock jumps three hours ahead of the last checkpoint (as an NTP step or
    // a person's `date -s` would make it look); the boot clock knows it was a moment.
    let db = rusqlite::Connection::open(env.root.join(".runtime/state.db")).unwrap();
    let stepped = (chrono::Utc::now() - chrono::Duration::hours(3)).to_rfc3339();
    let changed = db
        .execute(
            "UPDATE live_runs SET updated_at = ?1 WHERE run_id = ?2",
            [&stepped, &run_id],
        )
        .unwrap();
    assert_eq!(changed, 1);
    let boot: Option<i64> = db
        .query_row("SELECT boot_ns FROM live_runs WHERE run_id = ?1", [&run_id], |r| {
            r.get(0)
        })
        .unwrap();
    assert!(boot.is_some(), "the checkpoint carries the boot clock");
    drop(db);
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 5, "{summary}\n{stderr}");
    assert_eq!(summary["run_id"], run_id.as_str(), "resumed, not closed: {summary}");
    assert_eq!(hit_calls(&env), vec!["c1"], "the side effect did not repeat");

    // The boot clock decides the other way too: an hour and more on it closes the run.
    let env = counter_env(false);
    let out = runtime_crashing(&env, "after-tool-side-effect", &["fire", "t", "--json"]);
    assert!(killed(&out));
    let db = rusqlite::Connection::open(env.root.join(".runtime/state.db")).unwrap();
    db.execute(
        "UPDATE live_runs SET boot_ns = boot_ns - 7200000000000, updated_at = ?1",
        [chrono::Utc::now().to_rfc3339()],
    )
    .unwrap();
    drop(db);
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 5, "{summary}\n{stderr}");
    assert_eq!(env.card_kinds(&summary), vec!["crashed"], "{summary}");
    let detail = env.cards(&summary)[0]["detail"].as_str().unwrap().to_string();
    assert!(detail.contains("resume_window_s"), "{detail}");
}

#[test]
fn no_release_build_carries_the_crash_points() {
    // A release build has no debug assertions unless a profile turns them on; the
    // points compile only with them (`shared/src/failpoints.rs`).
    let manifest =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml")).unwrap();
    let mut section = String::new();
    for line in manifest.lines() {
        if line.starts_with('[') {
            section = line.trim().to_string();
        }
        let on = line.replace(' ', "").starts_with("debug-assertions=true");
        assert!(
            !(on && (section == "[profile.release]"
                || section == "[profile.profiling]"
                || section == "[profile.bench]")),
            "{section} turns on debug assertions: its builds would carry the crash points"
        );
    }
    let source =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/src/failpoints.rs"))
            .unwrap();
    assert!(source.contains("#[cfg(all(feature = \"failpoints\", debug_assertions))]\n        ::fail::fail_point!"));
}

#[test]
fn a_killed_prefetch_worker_is_named_as_such() {
    let env = counter_env(false);
    env.write(
        "tools/ctx.sh",
        "#!/bin/sh\necho started > reports/hits/ctx.started\nexec sleep 26.317\n",
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(env.root.join("tools/ctx.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    env.write(
        "prompts/t.md",
        "---\ndescription: test task\nprefetch:\n  - name: ctx\n    run: tools/ctx.sh\n---\nDo the test task.\n",
    );
    env.commit_all("a slow prefetch");
    let fire = env
        .command("runtime", &["fire", "t", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The prefetch worker is killed as the OOM killer would.
    let worker = kill_worker_running("ctx.started", "sleep\x0026.317");
    let out = fire.wait_with_output().unwrap();
    let summary: Value =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert!(gone(worker));
    assert_eq!(out.status.code(), Some(1), "{summary}");
    let cards = env.cards(&summary);
    assert_eq!(
        env.card_kinds(&summary),
        vec!["prefetch_failed"],
        "not sandbox_unavailable: {cards:?}"
    );
    let detail = cards[0]["detail"].as_str().unwrap();
    assert!(
        detail.contains("killed by signal 9 (SIGKILL)") && detail.contains("not the sandbox"),
        "{detail}"
    );
    assert!(
        !summary["hint"].as_str().unwrap_or("").contains("landlock"),
        "{summary}"
    );
}

/// A killed sync step's intent record, naming a lock its dead process created: the
/// next fire settles it (the lock goes) before it reads its tree.
fn plant_a_killed_sync_step(env: &TestEnv) -> (std::path::PathBuf, std::path::PathBuf) {
    let dir = env.root.join(".runtime/locks");
    std::fs::create_dir_all(&dir).unwrap();
    let lock = env.root.join(".git/refs/heads/synced.lock");
    let record = dir.join("sync-intent-999999.json");
    let body = serde_json::json!({"pid": 999999, "start_time": null, "locks": [{"path": lock}]});
    std::fs::write(&record, body.to_string()).unwrap();
    std::fs::write(&lock, "").unwrap();
    (record, lock)
}

/// A fire yields to a run waiting for approval before it writes anything, settling a
/// killed sync step included (docs/design.md: exit 4, nothing written). Shown live
/// first: without a waiting run, the same record's lock is removed by the fire.
#[test]
fn a_run_waiting_for_approval_leaves_a_killed_sync_steps_locks_for_later() {
    let free = counter_env(false);
    let (record, lock) = plant_a_killed_sync_step(&free);
    let (code, summary, stderr) = free.fire("t");
    assert_eq!(code, 0, "{summary} {stderr}");
    assert!(!lock.exists() && !record.exists(), "the killed step was not settled");

    let env = counter_env(true);
    let (code, _, _) = env.fire("t");
    assert_eq!(code, 4, "waiting for approval");
    let head = env.head_id();
    let (record, lock) = plant_a_killed_sync_step(&env);
    let (code, tick, stderr) = env.fire("t");
    assert_eq!(code, 4, "{tick} {stderr}");
    assert_eq!(tick["status"], "waiting_approval");
    assert!(lock.exists() && record.exists(), "settled before the answer");
    assert_eq!(env.head_id(), head, "no commit");
}

/// A fire removes what a dead writer left half-written among the records, without
/// listing the task's whole history each time: only the day directories that changed
/// since shortly before the task's last sweep (marked on the task's lock) are listed.
#[test]
fn a_dead_writers_file_is_removed_and_unchanged_days_are_not_listed_again() {
    let env = TestEnv::new();
    let (code, _, stderr) = env.fire("digest");
    assert_eq!(code, 0, "{stderr}");
    // A pid no process can have (above the kernel's largest): its writer is dead.
    let dead = |day: &str| {
        let dir = env.root.join("runs/digest").join(day);
        std::fs::create_dir_all(&dir).unwrap();
        let temp = dir.join(".20250101T000000Z-deadbeef.json.4194305-0badf00d.tmp");
        std::fs::write(&temp, "{\"half\": ").unwrap();
        (dir, temp)
    };
    // A day that changed now, after the mark: listed, the file removed.
    let (_, fresh) = dead("2026-11-30");
    // A day last changed two days ago, before the mark's margin: not listed (its file
    // could only be there if the sweep that made the mark had seen it).
    let (old_dir, stale) = dead("2025-01-01");
    let two_days_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(2 * 86_400);
    std::fs::File::open(&old_dir)
        .unwrap()
        .set_modified(two_days_ago)
        .unwrap();
    let lock = env.root.join(".runtime/locks/digest.lock");
    let marked = || std::fs::metadata(&lock).unwrap().modified().unwrap();
    let first_mark = marked();
    // A live writer's file (this test's own pid): left, and the mark stays where it
    // was, so the next sweep lists that day again.
    let live_dir = env.root.join("runs/digest/2026-11-29");
    std::fs::create_dir_all(&live_dir).unwrap();
    let live = live_dir.join(format!(".x.json.{}-0badf00d.tmp", std::process::id()));
    std::fs::write(&live, "{").unwrap();
    let (code, _, stderr) = env.fire("digest");
    assert_eq!(code, 0, "{stderr}");
    assert!(!fresh.exists(), "a changed day is swept: {stderr}");
    assert!(stale.exists(), "an unchanged day is not listed again");
    assert!(live.exists(), "a live writer's file stays");
    assert_eq!(
        marked(),
        first_mark,
        "a sweep that met a live writer keeps the earlier mark"
    );
    std::fs::remove_file(&live).unwrap();
    let (code, _, stderr) = env.fire("digest");
    assert_eq!(code, 0, "{stderr}");
    assert!(marked() > first_mark, "a clean sweep moves the mark");
    assert!(stale.exists(), "still not listed");
    // Without the mark (a lock file no sweep marked: a new box) every day is listed.
    std::fs::remove_file(env.root.join(".runtime/locks/digest.lock")).unwrap();
    let (code, _, stderr) = env.fire("digest");
    assert_eq!(code, 0, "{stderr}");
    assert!(!stale.exists(), "a sweep with no mark lists every day: {stderr}");
}
