//! Every phase of a fire answers SIGINT, SIGTERM and SIGHUP (issue 11, item 5; SIGHUP
//! since issue 22): prefetch, the loop, acceptance; the fire ends as `cancelled` (exit 1, docs/design.md) with
//! its report, receipt and card committed, and nothing it started outlives it. The
//! signal lands at a named point: a marker the fire's own script writes while it runs,
//! or a crash point armed to raise SIGTERM or SIGINT (`RUNTIME_FAILPOINTS=name:term`).

use crate::crash::{counter_env, gone, hits, process_with_cmdline, runs};
use crate::util::*;
use serde_json::Value;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// Sends `signal` to the fire.
fn signal(child: &Child, signal: kernel::signal::Signal) {
    let _ = kernel::signal::kill(child.id(), signal);
}

/// Waits (20 s at most) until a live process has `cmdline` (the script's marker
/// file under `reports/` reaches the work tree only once its call ends: the sandbox
/// copies tools' writes back after each call, so the process is what shows it runs).
fn wait_for_process(cmdline: &str) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(p) = process_with_cmdline(cmdline) {
            return p;
        }
        assert!(Instant::now() < deadline, "{} never started", cmdline);
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for the fire to end (well before the sleeps of its scripts would); its
/// exit code and JSON summary.
fn ended(child: Child) -> (Option<i32>, Value) {
    let t0 = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "the fire took {:?} to end",
        t0.elapsed()
    );
    let summary =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code(), summary)
}

/// The fire ended as cancelled with its records committed by the runtime, and its
/// run row says so.
fn assert_cancelled(env: &TestEnv, code: Option<i32>, summary: &Value) {
    assert_eq!(code, Some(1), "{summary}");
    assert_eq!(summary["status"], "cancelled", "{summary}");
    let receipt = env.receipt(summary);
    assert_eq!(receipt["status"], "cancelled");
    assert_eq!(receipt["stop_reason"], "cancelled");
    assert!(summary["report"].is_string(), "a report is written: {summary}");
    let cards = env.cards(summary);
    assert!(
        cards
            .iter()
            .any(|c| c["summary"].as_str() == Some("the fire was cancelled by a signal")),
        "{cards:?}"
    );
    assert!(summary["commit"].is_string(), "{summary}");
    assert_eq!(env.commit_authors()[0], "runtime");
    let paths = env.last_commit_paths();
    assert!(
        paths.iter().any(|p| p.starts_with("runs/")),
        "the receipt is committed: {paths:?}"
    );
    let row = runs(env)
        .into_iter()
        .find(|r| r["run_id"] == summary["run_id"])
        .expect("a run row");
    assert_eq!(row["status"], "cancelled", "{row}");
}

/// Waits (20 s at most) and asserts that process `pid` is gone.
fn assert_gone(pid: i32, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gone(pid) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(gone(pid), "{what} {pid} outlived the cancelled fire");
}

fn executable(env: &TestEnv, rel: &str, body: &str) {
    env.write(rel, body);
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(env.root.join(rel), std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn sigterm_during_prefetch_ends_the_fire_cancelled_with_records_and_kills_the_script() {
    let env = counter_env(false);
    executable(
        &env,
        "tools/ctx.sh",
        "#!/bin/sh\necho started > reports/hits/ctx.started\nexec sleep 28.417\n",
    );
    env.write(
        "prompts/t.md",
        "---\ndescription: test task\nprefetch:\n  - name: ctx\n    run: tools/ctx.sh\n---\nDo the test task.\n",
    );
    env.commit_all("a slow prefetch");
    let fire = env
        .command("runtime", &["fire", "t", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let script = wait_for_process("sleep\x0028.417");
    signal(&fire, kernel::signal::Signal::Term);
    let (code, summary) = ended(fire);
    assert_cancelled(&env, code, &summary);
    assert_gone(script, "the prefetch script");
    // The cancelled script's writes never left its sandbox (they are copied back only
    // when a call ends), so `reports/hits` holds no tool call's mark.
    let _ = std::fs::remove_file(env.root.join("reports/hits/ctx.started"));
    assert!(hits(&env).is_empty(), "the loop never ran: no tool call");
}

#[test]
fn sigterm_during_an_acceptance_check_ends_the_fire_cancelled_and_kills_the_check() {
    let env = counter_env(false);
    executable(
        &env,
        "tools/check.sh",
        "#!/bin/sh\necho started > reports/hits/check.started\nexec sleep 27.913\n",
    );
    env.write(
        "prompts/t.md",
        "---\ndescription: test task\nacceptance:\n  - name: checked\n    run: tools/check.sh\n---\nDo the test task.\n",
    );
    env.commit_all("a slow acceptance check");
    let fire = env
        .command("runtime", &["fire", "t", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let check = wait_for_process("sleep\x0027.913");
    signal(&fire, kernel::signal::Signal::Term);
    let (code, summary) = ended(fire);
    assert_cancelled(&env, code, &summary);
    assert_gone(check, "the acceptance check");
}

#[test]
fn sigterm_and_sigint_at_named_points_end_the_fire_cancelled_and_the_next_fire_completes() {
    for (point, sig) in [
        ("after-model-response", "term"),
        ("after-ledger-started", "term"),
        ("after-model-response", "int"),
        ("after-ledger-started", "int"),
        // SIGHUP (a closed terminal or ssh session) is answered like SIGTERM.
        ("after-model-response", "hup"),
        ("after-ledger-started", "hup"),
    ] {
        let env = counter_env(false);
        // The signal is raised by the fire itself at the named point (a failpoint
        // armed to signal rather than kill): no timing involved.
        let out = crate::crash::runtime_crashing(&env, &format!("{point}:{sig}"), &["fire", "t", "--json"]);
        let summary: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{point}:{sig}: {e}: {}", String::from_utf8_lossy(&out.stderr)));
        assert_cancelled(&env, out.status.code(), &summary);
        let receipt = env.receipt(&summary);
        assert_eq!(
            receipt["steps"], 1,
            "{point}:{sig}: stopped in the first step: {receipt}"
        );
        let calls = receipt["tool_calls"].as_array().unwrap().len();
        let run = summary["run_id"].as_str().unwrap().to_string();
        let ran = hits(&env).iter().filter(|h| h.starts_with(&run)).count();
        match point {
            // The model asked for the call; the signal came before it was handled:
            // not run, not recorded.
            "after-model-response" => assert_eq!((calls, ran), (0, 0), "{point}:{sig}: {receipt}"),
            // Marked started, then the signal: the call is interrupted (the command
            // may have begun) and recorded; it never runs twice.
            _ => assert!(
                calls == 1 && ran <= 1,
                "{point}:{sig}: {calls} calls, ran {ran}: {receipt}"
            ),
        }
        // A later fire starts afresh (the cancelled run is closed, not resumed) and
        // completes, and nothing is lost, repeated or left uncommitted.
        let (code, next, stderr) = env.fire("t");
        assert_eq!(code, 0, "{point}:{sig}: {next}\n{stderr}");
        assert_ne!(next["run_id"], summary["run_id"]);
        crate::crash_suite::check(&env).unwrap_or_else(|e| panic!("{point}:{sig}: {e}"));
    }
}
