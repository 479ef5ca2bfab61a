//! The operator's side of a fire (issue 13): no silent success (exit 5 when cards were
//! written), failure lines that say why and what to do next, a quiet skip, refusals
//! that cron does not commit again on every tick, a mistyped task that writes nothing,
//! and a missing key caught before any request.

use crate::util::*;
use serde_json::Value;

/// A repo whose task `t` talks to `server` (OpenAI wire), with `extra` settings.
fn repo_for(server: &ModelServer, extra: &str) -> TestEnv {
    let env = TestEnv::new();
    env.write(
        "settings/runtime.yaml",
        &settings_yaml(&server.provider_yaml(Wire::OpenAi), extra),
    );
    env.write("prompts/t.md", PLAIN_PROMPT);
    env.commit_all("test settings");
    env
}

fn commits(env: &TestEnv) -> usize {
    env.commit_authors().len()
}

/// `runtime fire <task>` without `--json`: (exit code, stdout, stderr).
fn fire_plain(env: &TestEnv, args: &[&str]) -> (i32, String, String) {
    let out = env.runtime(args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_fire_that_completes_with_cards_exits_5_and_says_why() {
    let w = Wire::OpenAi;
    let server = ModelServer::start(vec![
        turn(
            w,
            None,
            &[("c1", "run_command", r#"{"command":"git push origin main"}"#)],
            (1, 1),
        ),
        turn(w, Some("could not push"), &[], (1, 1)),
    ]);
    let env = repo_for(&server, "");
    let (code, stdout, stderr) = fire_plain(&env, &["fire", "t"]);
    assert_eq!(code, 5, "{stderr}");
    assert!(stdout.is_empty(), "cron reads stderr: {stdout}");
    assert!(
        stderr.starts_with("attention: t completed (final_answer), 2 steps"),
        "{stderr}"
    );
    assert!(stderr.contains("cards=1"), "{stderr}");
    assert!(stderr.contains("hint: `builder cards list`"), "{stderr}");
}

#[test]
fn an_empty_final_answer_is_not_a_silent_success() {
    let w = Wire::OpenAi;
    let server = ModelServer::start(vec![turn(w, Some("  \n"), &[], (1, 1))]);
    let env = repo_for(&server, "");
    let (code, summary, _) = env.fire("t");
    assert_eq!(code, 5);
    assert_eq!(env.card_kinds(&summary), vec!["empty_report"]);
}

#[test]
fn a_failed_acceptance_check_is_named_on_stderr() {
    let w = Wire::OpenAi;
    let server = ModelServer::start(vec![turn(w, Some("short"), &[], (1, 1))]);
    let env = repo_for(&server, "");
    env.write(
        "prompts/t.md",
        "---\nacceptance:\n  - name: has a title\n    report_contains: \"# Title\"\n---\nDo it.\n",
    );
    env.commit_all("acceptance");
    let (code, _, stderr) = fire_plain(&env, &["fire", "t"]);
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("acceptance check `has a title` failed: report does not contain `# Title`"),
        "{stderr}"
    );
}

#[test]
fn a_skipped_fire_is_quiet_unless_verbose() {
    let env = TestEnv::new();
    let lock_path = env.root.join(".runtime/locks/digest.lock");
    std::fs::create_dir_all(lock_path.parent().unwrap()).unwrap();
    let lock = std::fs::File::create(&lock_path).unwrap();
    assert!(kernel::fs::lock_exclusive(&lock, kernel::fs::Wait::Yes).unwrap());
    let (code, stdout, stderr) = fire_plain(&env, &["fire", "digest"]);
    assert_eq!(code, 3);
    assert_eq!(
        (stdout.as_str(), stderr.as_str()),
        ("", ""),
        "cron must not mail a skip"
    );
    let (code, _, stderr) = fire_plain(&env, &["-v", "fire", "digest"]);
    assert_eq!(code, 3);
    assert!(
        stderr.contains("skipped: another fire of this task holds the lock"),
        "{stderr}"
    );
}

#[test]
fn fifty_ticks_of_an_unchanged_refusal_commit_once() {
    let env = TestEnv::new();
    env.write("prompts/digest.md", "---\n---\nchanged but not committed\n");
    let before_first = commits(&env);
    let (code, _, stderr) = fire_plain(&env, &["fire", "digest"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("uncommitted changes: refusing to fire on unreviewed changes: prompts/digest.md"),
        "the refusal names the paths: {stderr}"
    );
    assert!(
        stderr.contains("hint: land the changes through review (`builder propose <name>`)"),
        "{stderr}"
    );
    let after_first = commits(&env);
    assert_eq!(
        after_first,
        before_first + 1,
        "the first refusal is recorded and committed"
    );
    for tick in 0..50 {
        let (code, summary, _) = env.fire("digest");
        assert_eq!(code, 1, "tick {tick}");
        assert!(summary["receipt"].is_null(), "tick {tick} wrote records: {summary}");
        if tick == 49 {
            let msg = summary["message"].as_str().unwrap();
            assert!(msg.contains("refused 51 times; not recorded again"), "{msg}");
        }
    }
    assert_eq!(
        commits(&env),
        after_first,
        "an unchanged refusal is not committed again"
    );
    // A different refusal is news: recorded and committed.
    env.write("scope/SCOPE.md", "changed too\n");
    let (code, summary, _) = env.fire("digest");
    assert_eq!(code, 1);
    assert!(summary["receipt"].is_string());
    assert_eq!(commits(&env), after_first + 1);
}

#[test]
fn a_mistyped_task_exits_2_with_a_suggestion_and_writes_nothing() {
    let env = TestEnv::new();
    let (code, stdout, stderr) = fire_plain(&env, &["fire", "digets"]);
    assert_eq!(code, 2, "{stdout}{stderr}");
    assert!(
        stderr.contains("error: no task `digets`: prompts/digets.md does not exist"),
        "{stderr}"
    );
    assert!(stderr.contains("hint: did you mean `digest`?"), "{stderr}");
    assert!(
        !env.root.join(".runtime").exists(),
        "no state directory for a task that is not one"
    );
    let status = std::process::Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=all"])
        .current_dir(&env.root)
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&status.stdout),
        "",
        "no records, no directories"
    );
}

#[test]
fn a_repository_without_commits_exits_2_and_says_to_commit_the_scaffold() {
    let dir = tempfile::tempdir().unwrap();
    let env = TestEnv::new();
    let fresh = dir.path().join("fresh");
    let out = env.builder(&["init", fresh.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = env.runtime(&["-C", fresh.to_str().unwrap(), "fire", "digest"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("error: the repository has no commits yet"), "{stderr}");
    assert!(stderr.contains("hint: commit the scaffold first"), "{stderr}");
    assert!(!fresh.join(".runtime").exists());
}

#[test]
fn an_unset_key_variable_exits_2_before_any_request() {
    let w = Wire::OpenAi;
    let server = ModelServer::start(vec![turn(w, Some("never asked"), &[], (1, 1))]);
    let env = repo_for(&server, "");
    let out = env
        .command("runtime", &["fire", "t", "--json"])
        .env_remove(KEY_ENV)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cards = env.cards(&summary);
    assert_eq!(cards[0]["kind"].as_str(), Some("invalid_config"));
    assert!(
        cards[0]["summary"]
            .as_str()
            .unwrap()
            .contains(&format!("`{KEY_ENV}` is unset or empty")),
        "{:?}",
        cards[0]
    );
    assert!(server.requests().is_empty(), "no request without a key");
    assert!(
        summary["hint"]
            .as_str()
            .unwrap()
            .starts_with(&format!("set `{KEY_ENV}` in the environment the fire runs in")),
        "{summary}"
    );
}

#[test]
fn a_pause_names_the_approve_call_command() {
    let env = TestEnv::new();
    let trace = serde_json::json!({"version": 1, "turns": [
        {"tool_calls": [{"id": "c0", "name": "run_command", "arguments": {"command": "curl example.org"}}]},
        {"content": "# Done"}
    ]});
    env.write("evals/digest/replay.json", &trace.to_string());
    env.write("prompts/t.md", PLAIN_PROMPT);
    env.commit_all("ask for curl");
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 4, "{stderr}");
    let run = summary["run_id"].as_str().unwrap();
    assert_eq!(
        summary["hint"].as_str().unwrap(),
        format!(
            "`builder approve-call {run} c0` decides the call (`--deny` to refuse it), then `runtime resume {run}`"
        )
    );
}

#[test]
fn after_a_fallback_answers_the_rest_of_the_fire_skips_the_primary() {
    let w = Wire::OpenAi;
    // The primary fails every request (past its script it answers 500).
    let primary = ModelServer::start(vec![]);
    let fallback = ModelServer::start(vec![
        turn(w, None, &[("c1", "list_dir", r#"{"path":"."}"#)], (1, 1)),
        turn(w, None, &[("c2", "list_dir", r#"{"path":"prompts"}"#)], (1, 1)),
        turn(w, Some("done"), &[], (1, 1)),
    ]);
    let fallback_yaml = fallback
        .provider_yaml(w)
        .replacen("provider:", "fallback:", 1)
        .replace("test-model", "fallback-model");
    let extra = format!("{fallback_yaml}limits:\n  retry_base_ms: 10\n  max_retries: 1\n");
    let env = repo_for(&primary, &extra);
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        primary.requests().len(),
        2,
        "one failed step's worth of tries (1 + 1 retry), then the breaker skips the primary"
    );
    assert_eq!(fallback.requests().len(), 3);
    let show = env.runtime(&["show", summary["run_id"].as_str().unwrap()]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert_eq!(
        text.matches("served by fallback (openai fallback-model)").count(),
        3,
        "runtime show names the provider of each step:\n{text}"
    );
}

#[test]
fn a_request_refused_for_length_is_a_context_overflow_stop() {
    let server = ModelServer::start(vec![Reply::status(
        400,
        r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}}"#,
    )]);
    let env = repo_for(&server, "");
    let (code, summary, _) = env.fire("t");
    assert_eq!(code, 1);
    let receipt = env.receipt(&summary);
    assert_eq!(receipt["stop_reason"], "context_overflow");
    assert_eq!(env.card_kinds(&summary), vec!["context_overflow"]);
    assert!(
        summary["hint"].as_str().unwrap().contains("max_context_tokens"),
        "{summary}"
    );
}

#[test]
fn prefetch_over_its_cap_keeps_head_and_tail_and_writes_a_card() {
    let w = Wire::OpenAi;
    let server = ModelServer::start(vec![turn(w, Some("# Report\nok"), &[], (1, 1))]);
    let env = repo_for(&server, "limits:\n  tool_output_bytes: 2000\n");
    env.write("tools/big.sh", "#!/bin/sh\nseq 1 40000\n");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(env.root.join("tools/big.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    env.write(
        "prompts/t.md",
        "---\nprefetch:\n  - name: numbers\n    run: tools/big.sh\n---\nSum them up.\n",
    );
    env.commit_all("big prefetch");
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 5, "{stderr}");
    assert_eq!(env.card_kinds(&summary), vec!["prefetch_truncated"]);
    let sent = server.requests()[0].body["messages"][1]["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(sent.contains("\n1\n2\n3\n"), "the head reached the model");
    assert!(sent.contains("\n39999\n40000"), "the tail reached the model");
    let total: usize = (1..=40000).map(|i: usize| i.to_string().len() + 1).sum();
    let marker = sent.lines().find(|l| l.starts_with("[... ")).expect("a cut marker");
    let cut: usize = marker[5..].split(' ').next().unwrap().parse().unwrap();
    assert!(cut > total - 2000 && cut < total, "{marker} of {total}");
}

#[test]
fn a_read_deny_rule_holds_for_cat_head_grep_and_the_grep_tool() {
    const SECRET: &str = "dotenv-SECRET-0000";
    let env = TestEnv::new();
    env.write(".env", &format!("KEY={SECRET}\n"));
    env.write("docs/.env", &format!("KEY={SECRET}\n"));
    env.write("docs/notes.md", "KEY is set in .env\n");
    let calls = serde_json::json!([
        {"id": "c1", "name": "run_command", "arguments": {"command": "cat .env"}},
        {"id": "c2", "name": "run_command", "arguments": {"command": "head -n 1 docs/.env"}},
        {"id": "c3", "name": "run_command", "arguments": {"command": "wc -c < .env"}},
        {"id": "c4", "name": "read_file", "arguments": {"path": "docs/.env"}},
        {"id": "c5", "name": "grep", "arguments": {"pattern": "KEY", "path": "."}},
        {"id": "c6", "name": "run_command", "arguments": {"command": "cat docs/notes.md"}}
    ]);
    let turns: Vec<Value> = calls
        .as_array()
        .unwrap()
        .iter()
        .map(|c| serde_json::json!({"tool_calls": [c]}))
        .chain([serde_json::json!({"content": "# Done"})])
        .collect();
    env.write(
        "evals/digest/replay.json",
        &serde_json::json!({"version": 1, "turns": turns}).to_string(),
    );
    // Four denials in a row must not stop the fire before the grep tool runs.
    let settings = env.read("settings/runtime.yaml");
    env.write(
        "settings/runtime.yaml",
        &format!("{settings}limits:\n  max_denials: 10\n"),
    );
    env.write("prompts/t.md", PLAIN_PROMPT);
    env.commit_all("secrets beside the code");
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 5, "{stderr}");
    let receipt = env.receipt(&summary);
    let calls = receipt["tool_calls"].as_array().unwrap();
    let decisions: Vec<(&str, &str)> = calls
        .iter()
        .map(|c| (c["decision"].as_str().unwrap(), c["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(
        decisions,
        vec![
            ("deny", "PERMISSION_DENIED"),
            ("deny", "PERMISSION_DENIED"),
            ("deny", "PERMISSION_DENIED"),
            ("deny", "PERMISSION_DENIED"),
            ("allow", "ok"),
            ("allow", "ok"),
        ],
        "{calls:?}"
    );
    for c in &calls[..4] {
        assert_eq!(c["rule"], "Read(**/.env)", "{c}");
    }
    let show = env.runtime(&["show", summary["run_id"].as_str().unwrap(), "--json"]);
    let trace = String::from_utf8_lossy(&show.stdout);
    assert!(
        trace.contains("docs/notes.md:1"),
        "the grep tool ran and found the allowed file"
    );
    assert!(trace.contains("not searched: a Read deny rule covers them"), "{trace}");
    assert!(!trace.contains(SECRET), "the denied file's content reached the model");
    assert!(!env.all_record_text().contains(SECRET));
}

#[test]
fn both_checks_say_when_the_key_variable_is_unset() {
    let server = ModelServer::start(vec![]);
    let env = repo_for(&server, "");
    let run = |bin: &str| env.command(bin, &["check"]).env_remove(KEY_ENV).output().unwrap();
    let runtime = run("runtime");
    let out = String::from_utf8_lossy(&runtime.stdout);
    assert_eq!(runtime.status.code(), Some(1), "{out}");
    assert!(
        out.contains(&format!("problem: the provider's key variable `{KEY_ENV}`")),
        "{out}"
    );
    let builder = run("builder");
    let err = String::from_utf8_lossy(&builder.stderr);
    assert_eq!(builder.status.code(), Some(0), "the files are fine: {err}");
    assert!(
        err.contains(&format!("note: the provider's key variable `{KEY_ENV}`")),
        "{err}"
    );
    // With the key set, neither says anything about it.
    let with_key = env.runtime(&["check"]);
    assert_eq!(
        with_key.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&with_key.stdout)
    );
    assert!(!String::from_utf8_lossy(&env.builder(&["check"]).stderr).contains("key variable"));
}

#[test]
fn a_local_servers_own_context_window_sizes_the_budget() {
    let w = Wire::OpenAi;
    let report = || turn(w, Some("# Report"), &[], (1, 1));
    let server = ModelServer::start(vec![report(), report()]);
    *server.props.lock().unwrap() = Some(serde_json::json!({"default_generation_settings": {"n_ctx": 8192}}));
    let env = repo_for(&server, "");
    let budget_of_a_fire = || {
        let (code, summary, stderr) = env.fire("t");
        assert_eq!(code, 0, "{stderr}");
        let show = env.runtime(&["show", summary["run_id"].as_str().unwrap(), "--json"]);
        let trace: Value = serde_json::from_slice(&show.stdout).unwrap();
        trace["trace"]["steps"][0][1]["budget"].clone()
    };
    let budget = budget_of_a_fire();
    assert_eq!(budget, 8192 - 4096, "n_ctx less the output cap: {budget}");
    assert_eq!(*server.gets.lock().unwrap(), ["/props"], "the first fire asks");
    // The next fire remembers the answer (in .runtime) instead of asking again.
    assert_eq!(budget_of_a_fire(), 8192 - 4096);
    assert_eq!(*server.gets.lock().unwrap(), ["/props"], "the second fire does not ask");
    assert!(env.root.join(".runtime/context-windows.json").is_file());
    // Settings win over what the server says.
    let server = ModelServer::start(vec![turn(w, Some("# Report"), &[], (1, 1))]);
    *server.props.lock().unwrap() = Some(serde_json::json!({"default_generation_settings": {"n_ctx": 8192}}));
    let provider = server.provider_yaml(w) + "  max_context_tokens: 20000\n";
    let env = TestEnv::new();
    env.write("settings/runtime.yaml", &settings_yaml(&provider, ""));
    env.write("prompts/t.md", PLAIN_PROMPT);
    env.commit_all("declared window");
    let (code, summary, _) = env.fire("t");
    assert_eq!(code, 0);
    let show = env.runtime(&["show", summary["run_id"].as_str().unwrap(), "--json"]);
    let trace: Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(trace["trace"]["steps"][0][1]["budget"], 20000 - 4096);
}

/// `runtime check` exits 1 where a fire would run and then keep its records
/// uncommitted (a detached HEAD, a rebase in progress), naming why, as the fire
/// does (helper-79: it said "ok: this repository can fire").
#[test]
fn check_names_a_state_in_which_a_fire_could_not_commit() {
    let env = TestEnv::new();
    let check = |env: &TestEnv| {
        let out = env.runtime(&["check"]);
        (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (code, out) = check(&env);
    assert_eq!(code, Some(0), "{out}");
    env.git_ok(&env.root, &["checkout", "-q", "--detach", "HEAD"]);
    let (code, out) = check(&env);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("keep its records uncommitted") && out.contains("detached"),
        "{out}"
    );
    let (fired, summary, _) = env.fire("digest");
    assert_eq!(fired, 1, "the fire agrees: {summary}");
    assert!(
        env.card_kinds(&summary).contains(&"commit_blocked".to_string()),
        "{summary}"
    );
}
