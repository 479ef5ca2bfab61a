//! `runtime fire` end to end against a scripted model server speaking the OpenAI and
//! Anthropic wire formats: tool runs, failures, retries, budgets, denials and signals.
//! Every test checks the receipt, the cards, and that nothing outside runtime-owned
//! paths changed.

use crate::util::*;
use serde_json::Value;
use std::time::{Duration, Instant};

const FAST: &str = "limits:\n  retry_base_ms: 10\n  request_timeout_s: 2\n  max_retries: 2\n";

struct Fired {
    env: TestEnv,
    server: ModelServer,
    code: i32,
    summary: Value,
    receipt: Value,
    stderr: String,
}

/// A repo whose task `t` (the plain prompt) talks to `server` over `wire`, with
/// `extra` settings, all committed.
fn env_for(server: &ModelServer, wire: Wire, extra: &str) -> TestEnv {
    let env = TestEnv::new();
    env.write(
        "settings/runtime.yaml",
        &settings_yaml(&server.provider_yaml(wire), extra),
    );
    env.write("prompts/t.md", PLAIN_PROMPT);
    env.commit_all("test settings");
    env
}

/// Starts `runtime fire t --json` and returns once the model server has its first
/// request: the fire is past its checks and inside the loop.
fn fire_in_background(env: &TestEnv, server: &ModelServer) -> std::process::Child {
    let child = env
        .command("runtime", &["fire", "t", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.requests().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    child
}

fn fire_with(wire: Wire, replies: Vec<Reply>, extra: &str) -> Fired {
    let server = ModelServer::start(replies);
    let env = env_for(&server, wire, extra);
    let before = env.builder_snapshot();
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(
        env.builder_snapshot(),
        before,
        "a builder-owned or unowned file changed"
    );
    let receipt = env.receipt(&summary);
    assert_eq!(
        env.commit_authors()[0],
        "runtime",
        "the records are committed by the runtime identity"
    );
    for p in env.last_commit_paths() {
        assert!(
            p.starts_with("reports/") || p.starts_with("cards/") || p.starts_with("runs/"),
            "runtime committed {p}"
        );
    }
    assert!(
        !env.all_record_text().contains(TEST_KEY),
        "the API key leaked into the records"
    );
    Fired {
        env,
        server,
        code,
        summary,
        receipt,
        stderr,
    }
}

fn calls(f: &Fired) -> Vec<(String, String, String)> {
    f.receipt["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().into(),
                c["decision"].as_str().unwrap().into(),
                c["outcome"].as_str().unwrap().into(),
            )
        })
        .collect()
}

fn multi_step(wire: Wire) {
    let f = fire_with(
        wire,
        vec![
            turn(
                wire,
                None,
                &[("c1", "read_file", r#"{"path":"prompts/t.md"}"#)],
                (100, 10),
            ),
            turn(
                wire,
                Some("checking"),
                &[
                    ("c2", "run_command", r#"{"command":"ls prompts"}"#),
                    ("c3", "write_file", r#"{"path":"reports/notes.md","content":"n"}"#),
                ],
                (200, 20),
            ),
            turn(wire, Some("# Done\nall good"), &[], (300, 30)),
        ],
        FAST,
    );
    assert_eq!(f.code, 0, "{}", f.stderr);
    assert_eq!(f.receipt["status"], "completed");
    assert_eq!(f.receipt["stop_reason"], "final_answer");
    assert_eq!(f.receipt["steps"], 3);
    assert_eq!(f.receipt["tokens"]["input"], 600);
    assert_eq!(f.receipt["tokens"]["output"], 60);
    // 600 in at $1000/M + 60 out at $2000/M.
    assert!(
        (f.receipt["cost_usd"].as_f64().unwrap() - 0.72).abs() < 1e-9,
        "{}",
        f.receipt["cost_usd"]
    );
    assert_eq!(
        calls(&f),
        vec![
            ("read_file".into(), "allow".into(), "ok".into()),
            ("run_command".into(), "allow".into(), "ok".into()),
            ("write_file".into(), "allow".into(), "ok".into())
        ]
    );
    assert!(f.env.read("reports/notes.md") == "n");
    assert!(f.env.read(f.summary["report"].as_str().unwrap()).contains("all good"));
    let reqs = f.server.requests();
    assert_eq!(reqs.len(), 3);
    // The tool results travelled back in the provider's own format.
    match wire {
        Wire::OpenAi => {
            assert_eq!(reqs[0].path, "/v1/chat/completions");
            assert!(reqs[0]
                .headers
                .iter()
                .any(|(k, v)| k == "authorization" && v == &format!("Bearer {TEST_KEY}")));
            let msgs = reqs[2].body["messages"].as_array().unwrap();
            let tools: Vec<&Value> = msgs.iter().filter(|m| m["role"] == "tool").collect();
            assert_eq!(tools.len(), 3);
            assert!(tools[0]["content"].as_str().unwrap().contains("Do the test task"));
            assert_eq!(tools[1]["tool_call_id"], "c2");
            assert_eq!(reqs[0].body["tools"].as_array().unwrap().len(), 6);
        }
        Wire::Anthropic => {
            assert_eq!(reqs[0].path, "/v1/messages");
            assert!(reqs[0].headers.iter().any(|(k, v)| k == "x-api-key" && v == TEST_KEY));
            assert!(reqs[0].headers.iter().any(|(k, _)| k == "anthropic-version"));
            assert!(reqs[0].body["system"].as_str().unwrap().contains("Scope"));
            let msgs = reqs[2].body["messages"].as_array().unwrap();
            let last = msgs.last().unwrap();
            assert_eq!(last["role"], "user");
            let blocks = last["content"].as_array().unwrap();
            assert_eq!(blocks.len(), 2, "both results of one turn in one message");
            assert_eq!(blocks[0]["type"], "tool_result");
            assert_eq!(blocks[0]["tool_use_id"], "c2");
        }
    }
}

#[test]
fn openai_multi_step_tool_run() {
    multi_step(Wire::OpenAi);
}

#[test]
fn anthropic_multi_step_tool_run() {
    multi_step(Wire::Anthropic);
}

#[test]
fn final_answer_right_away() {
    for wire in [Wire::OpenAi, Wire::Anthropic] {
        let f = fire_with(
            wire,
            vec![turn(wire, Some("# Report\nnothing to do"), &[], (10, 5))],
            FAST,
        );
        assert_eq!(f.code, 0, "{}", f.stderr);
        assert_eq!(f.receipt["steps"], 1);
        assert!(f.receipt["cards"].as_array().unwrap().is_empty());
        assert!(f
            .env
            .read(f.summary["report"].as_str().unwrap())
            .contains("nothing to do"));
    }
}

#[test]
fn unknown_tool_makes_a_missing_tool_card_and_the_loop_goes_on() {
    let w = Wire::OpenAi;
    let f = fire_with(
        w,
        vec![
            turn(w, None, &[("c1", "send_email", r#"{"to":"x"}"#)], (10, 5)),
            turn(w, Some("done"), &[], (10, 5)),
        ],
        FAST,
    );
    assert_eq!(f.code, 5, "completed, but a card was written: {}", f.stderr);
    assert_eq!(
        calls(&f),
        vec![("send_email".into(), "none".into(), "UNKNOWN_TOOL".into())]
    );
    assert_eq!(f.env.card_kinds(&f.summary), vec!["missing_tool"]);
    let obs = &f.server.requests()[1].body["messages"];
    assert!(obs.to_string().contains("UNKNOWN_TOOL"));
}

#[test]
fn invalid_json_arguments_then_a_valid_call() {
    let w = Wire::OpenAi;
    let f = fire_with(
        w,
        vec![
            turn(w, None, &[("c1", "read_file", r#"{"path": "prompts/t.md""#)], (10, 5)),
            turn(w, None, &[("c2", "read_file", r#"{"path": "prompts/t.md"}"#)], (10, 5)),
            turn(w, Some("done"), &[], (10, 5)),
        ],
        FAST,
    );
    assert_eq!(f.code, 0, "{}", f.stderr);
    assert_eq!(
        calls(&f),
        vec![
            ("read_file".into(), "none".into(), "INVALID_ARGUMENTS".into()),
            ("read_file".into(), "allow".into(), "ok".into())
        ]
    );
    // The malformed call is stored as invalid, never as if it had parsed.
    let show = f
        .env
        .runtime(&["show", f.summary["run_id"].as_str().unwrap(), "--json"]);
    let trace: Value = serde_json::from_slice(&show.stdout).unwrap();
    let first = &trace["trace"]["calls"][0]["arguments"];
    assert!(first.get("_invalid").is_some(), "{first}");
    assert!(f.server.requests()[1].body.to_string().contains("INVALID_ARGUMENTS"));
}

#[test]
fn rate_limit_with_retry_after_then_success() {
    let w = Wire::OpenAi;
    let t0 = Instant::now();
    let f = fire_with(
        w,
        vec![
            Reply::status(429, "{\"error\":\"slow down\"}").header("retry-after", "1"),
            turn(w, Some("done"), &[], (10, 5)),
        ],
        FAST,
    );
    assert_eq!(f.code, 0, "{}", f.stderr);
    assert_eq!(f.receipt["retries"], 1);
    assert_eq!(f.server.requests().len(), 2);
    assert!(t0.elapsed() >= Duration::from_secs(1), "retry-after was not honoured");
}

#[test]
fn server_errors_until_retries_run_out() {
    for w in [Wire::OpenAi, Wire::Anthropic] {
        let f = fire_with(
            w,
            vec![
                Reply::status(500, "boom"),
                Reply::status(502, "boom"),
                Reply::status(503, "boom"),
            ],
            FAST,
        );
        assert_eq!(f.code, 1);
        assert_eq!(f.receipt["status"], "failed");
        assert_eq!(f.receipt["stop_reason"], "provider_error");
        assert_eq!(f.receipt["retries"], 2);
        assert_eq!(f.server.requests().len(), 3, "1 try + 2 retries");
        assert_eq!(f.env.card_kinds(&f.summary), vec!["provider_error"]);
    }
}

#[test]
fn unauthorized_is_not_retried() {
    for w in [Wire::OpenAi, Wire::Anthropic] {
        let f = fire_with(
            w,
            vec![
                Reply::status(401, &format!("{{\"error\":\"bad key {TEST_KEY}\"}}")),
                turn(w, Some("never"), &[], (1, 1)),
            ],
            FAST,
        );
        assert_eq!(f.code, 1);
        assert_eq!(f.server.requests().len(), 1);
        assert_eq!(f.receipt["retries"], 0);
        let cards = f.env.cards(&f.summary);
        assert_eq!(cards[0]["kind"].as_str(), Some("provider_error"));
        assert!(cards[0]["detail"].as_str().unwrap().contains("401"));
    }
}

#[test]
fn request_timeout_is_a_provider_error() {
    let w = Wire::OpenAi;
    let extra = "limits:\n  retry_base_ms: 10\n  request_timeout_s: 1\n  max_retries: 1\n";
    let f = fire_with(
        w,
        vec![
            turn(w, Some("late"), &[], (1, 1)).delayed(Duration::from_secs(3)),
            turn(w, Some("late"), &[], (1, 1)).delayed(Duration::from_secs(3)),
        ],
        extra,
    );
    assert_eq!(f.code, 1);
    assert_eq!(f.receipt["stop_reason"], "provider_error");
    assert_eq!(f.receipt["retries"], 1);
    let cards = f.env.cards(&f.summary);
    assert_eq!(
        cards[0]["summary"].as_str(),
        Some("model call failed: timeout (no answer within 1 s, 1 retry)"),
        "{:?}",
        cards[0]
    );
}

#[test]
fn max_steps_stops_the_loop() {
    let w = Wire::OpenAi;
    let replies = (0..5)
        .map(|i| {
            turn(
                w,
                None,
                &[(
                    "c",
                    "list_dir",
                    &format!(
                        "{{\"path\":\"{}\"}}",
                        ["prompts", "scope", "tools", "settings", "evals"][i]
                    ),
                )],
                (1, 1),
            )
        })
        .collect();
    let f = fire_with(w, replies, &format!("{FAST}budgets:\n  max_steps: 3\n"));
    assert_eq!(f.code, 1);
    assert_eq!(f.receipt["stop_reason"], "max_steps");
    assert_eq!(f.receipt["steps"], 3);
    assert_eq!(f.env.card_kinds(&f.summary), vec!["max_steps"]);
    assert!(f.env.read(f.summary["report"].as_str().unwrap()).contains("max_steps"));
}

#[test]
fn repeated_call_stops_the_loop() {
    let w = Wire::OpenAi;
    let replies = (0..5)
        .map(|_| turn(w, None, &[("c", "list_dir", r#"{"path":"prompts"}"#)], (1, 1)))
        .collect();
    let f = fire_with(w, replies, FAST);
    assert_eq!(f.code, 1);
    assert_eq!(f.receipt["stop_reason"], "repeated_call");
    assert_eq!(f.receipt["steps"], 3);
    assert_eq!(f.env.card_kinds(&f.summary), vec!["repeated_call"]);
}

#[test]
fn token_and_cost_budgets() {
    let w = Wire::OpenAi;
    let tool = turn(w, None, &[("c", "list_dir", r#"{"path":"prompts"}"#)], (6000, 10));
    let f = fire_with(
        w,
        vec![tool.clone(), tool.clone()],
        &format!("{FAST}budgets:\n  max_tokens: 5000\n  max_cost_usd: 100\n"),
    );
    assert_eq!(f.receipt["stop_reason"], "token_budget");
    assert_eq!(f.code, 1);
    assert_eq!(f.env.card_kinds(&f.summary), vec!["budget_exceeded"]);
    let f = fire_with(
        w,
        vec![tool.clone(), tool],
        &format!("{FAST}budgets:\n  max_cost_usd: 1.0\n"),
    );
    assert_eq!(f.receipt["stop_reason"], "cost_budget");
    assert!(f.receipt["cost_usd"].as_f64().unwrap() > 1.0);
    assert_eq!(f.env.card_kinds(&f.summary), vec!["budget_exceeded"]);
}

#[test]
fn denied_command_is_recorded_and_carded() {
    let w = Wire::OpenAi;
    let f = fire_with(
        w,
        vec![
            turn(
                w,
                None,
                &[(
                    "c1",
                    "run_command",
                    r#"{"command":"cd reports && git push origin main"}"#,
                )],
                (1, 1),
            ),
            turn(w, Some("could not push"), &[], (1, 1)),
        ],
        FAST,
    );
    assert_eq!(f.code, 5, "completed, but a card was written: {}", f.stderr);
    assert_eq!(f.receipt["denials"], 1);
    let c = &f.receipt["tool_calls"][0];
    assert_eq!(c["decision"], "deny");
    assert_eq!(c["rule"], "Bash(git push*)");
    assert_eq!(c["outcome"], "PERMISSION_DENIED");
    let cards = f.env.cards(&f.summary);
    assert_eq!(cards[0]["kind"].as_str(), Some("permission_denied"));
    assert!(f.server.requests()[1].body.to_string().contains("PERMISSION_DENIED"));
}

#[test]
fn sigterm_mid_run_ends_as_cancelled_with_records() {
    let w = Wire::OpenAi;
    let server = ModelServer::start(vec![
        turn(w, None, &[("c1", "run_command", r#"{"command":"sleep 20"}"#)], (1, 1)),
        turn(w, Some("never"), &[], (1, 1)),
    ]);
    let env = env_for(&server, w, "limits:\n  tool_timeout_s: 60\n");
    let before = env.builder_snapshot();
    let child = fire_in_background(&env, &server);
    std::thread::sleep(Duration::from_millis(300));
    let _ = kernel::signal::kill(child.id(), kernel::signal::Signal::Term);
    let t0 = Instant::now();
    let out = child.wait_with_output().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "cancellation took {:?}",
        t0.elapsed()
    );
    assert_eq!(out.status.code(), Some(1));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let receipt = env.receipt(&summary);
    assert_eq!(receipt["status"], "cancelled");
    assert_eq!(receipt["stop_reason"], "cancelled");
    assert_eq!(env.builder_snapshot(), before);
    assert_eq!(env.commit_authors()[0], "runtime");
}

#[test]
fn bad_config_exits_2_with_an_invalid_config_card() {
    let env = TestEnv::new();
    env.write(
        "settings/runtime.yaml",
        "version: 1\nprovider:\n  kind: replay\n  replay: evals/digest/replay.json\nbudgets:\n  max_steps: many\n",
    );
    env.commit_all("break settings");
    let (code, summary, _) = env.fire("digest");
    assert_eq!(code, 2);
    let cards = env.cards(&summary);
    assert_eq!(cards[0]["kind"].as_str(), Some("invalid_config"));
    let detail = cards[0]["detail"].as_str().unwrap();
    assert!(
        detail.contains("settings/runtime.yaml:6: budgets.max_steps"),
        "{detail}"
    );
}

#[test]
fn dirty_builder_paths_refuse_the_fire() {
    let env = TestEnv::new();
    env.write("prompts/digest.md", "---\n---\nchanged but not committed\n");
    let (code, summary, _) = env.fire("digest");
    assert_eq!(code, 1);
    assert_eq!(env.card_kinds(&summary), vec!["unreviewed_changes"]);
    assert_eq!(env.read("prompts/digest.md"), "---\n---\nchanged but not committed\n");
    let r = env.receipt(&summary);
    assert_eq!(r["steps"], 0);
}

#[test]
fn example_task_fires_offline_and_is_accepted() {
    let env = TestEnv::new();
    let before = env.builder_snapshot();
    let (code, summary, stderr) = env.fire("digest");
    assert_eq!(code, 0, "{stderr}");
    let r = env.receipt(&summary);
    assert_eq!(r["status"], "accepted");
    assert_eq!(r["sandbox"]["landlock"], "fully_enforced");
    assert!(r["acceptance"].as_array().unwrap().iter().all(|a| a["passed"] == true));
    assert_eq!(env.builder_snapshot(), before);
    assert_eq!(env.commit_authors(), vec!["runtime", "Eng"]);
    let runs = env.runtime(&["runs", "--json"]);
    let rows: Value = serde_json::from_slice(&runs.stdout).unwrap();
    assert_eq!(rows[0]["run_id"], summary["run_id"]);
    let otlp = env.runtime(&["show", summary["run_id"].as_str().unwrap(), "--otlp"]);
    let o: Value = serde_json::from_slice(&otlp.stdout).unwrap();
    let spans = o["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().unwrap();
    assert!(spans
        .iter()
        .any(|s| s["attributes"].to_string().contains("gen_ai.usage.input_tokens")));
    assert!(
        !o.to_string().contains("gen_ai.tool.call.result"),
        "content is left out unless asked for"
    );
}

#[test]
fn a_second_fire_of_the_same_task_is_skipped() {
    let w = Wire::OpenAi;
    let server = ModelServer::start(vec![turn(w, Some("slow"), &[], (1, 1)).delayed(Duration::from_secs(3))]);
    let env = env_for(&server, w, "");
    let first = fire_in_background(&env, &server);
    let (code, summary, _) = env.fire("t");
    assert_eq!(code, 3);
    assert_eq!(summary["status"], "skipped");
    let out = first.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn ask_pauses_then_approve_call_and_resume_continue_the_run() {
    let env = TestEnv::new();
    let trace = serde_json::json!({"version": 1, "turns": [
        {"tool_calls": [{"id": "c0", "name": "run_command", "arguments": {"command": "echo approved > reports/approved.md"}}]},
        {"content": "# Done\nwrote it"}
    ]});
    env.write("evals/digest/replay.json", &trace.to_string());
    let settings = env
        .read("settings/runtime.yaml")
        .replace("    - \"Bash(curl*)\"", "    - \"Bash(curl*)\"\n    - \"Bash(echo*)\"");
    env.write("settings/runtime.yaml", &settings);
    env.write("prompts/t.md", PLAIN_PROMPT);
    env.commit_all("ask for echo");
    let (code, summary, _) = env.fire("t");
    assert_eq!(code, 4, "waiting for approval");
    let run_id = summary["run_id"].as_str().unwrap().to_string();
    assert_eq!(summary["status"], "waiting_approval");
    let cards = env.cards(&summary);
    assert_eq!(cards[0]["kind"].as_str(), Some("approval_needed"));
    assert!(
        !env.root.join("reports/approved.md").exists(),
        "nothing ran before the approval"
    );
    let wrong = env.builder(&["approve-call", &run_id, "c9"]);
    assert_eq!(wrong.status.code(), Some(1), "an approval must name the paused call");
    let ok = env.builder(&["approve-call", &run_id, "c0", "--by", "Eng <eng@example.com>"]);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    let out = env.runtime(&["resume", &run_id, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let resumed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let receipt = env.receipt(&resumed);
    assert_eq!(receipt["resumed_from"], run_id.as_str());
    assert_eq!(receipt["status"], "completed");
    let calls = receipt["tool_calls"].as_array().unwrap();
    assert_eq!(calls[0]["decision"], "ask", "the paused call stays in the record");
    assert_eq!(calls.last().unwrap()["reason"], "approved by a builder");
    assert_eq!(calls.last().unwrap()["outcome"], "ok");
    assert_eq!(env.read("reports/approved.md"), "approved\n");
    let again = env.runtime(&["resume", &run_id]);
    assert_eq!(again.status.code(), Some(2), "a finished run has no checkpoint left");
}

/// Loose object files under `.git/objects/xx/`.
fn loose_objects(env: &TestEnv) -> usize {
    std::fs::read_dir(env.root.join(".git/objects"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|d| d.file_name().len() == 2)
        .map(|d| std::fs::read_dir(d.path()).unwrap().count())
        .sum()
}

#[test]
fn a_fire_packs_loose_objects_once_they_pass_gc_auto() {
    let server = ModelServer::start(vec![
        turn(Wire::OpenAi, Some("# Report\nfirst"), &[], (10, 5)),
        turn(Wire::OpenAi, Some("# Report\nsecond"), &[], (10, 5)),
    ]);
    let env = env_for(&server, Wire::OpenAi, FAST);
    let repo = git2::Repository::open(&env.root).unwrap();
    let mut config = repo.config().unwrap();
    // git estimates loose objects from one fan-out directory (`17/`): with a limit as
    // low as 256, two of ~100 objects landing there would already trigger a pack, so
    // the first fire runs well below its limit.
    config.set_i64("gc.auto", 100_000).unwrap();
    config.set_bool("gc.autoDetach", false).unwrap();
    // Below the limit: the fire leaves its objects loose.
    let (code, _, stderr) = env.fire("t");
    assert_eq!(code, 0, "{stderr}");
    let few = loose_objects(&env);
    assert!(few > 0 && few < 100, "{few} loose objects");
    // 3,000 more reachable loose objects (as a few hundred fires leave behind): the
    // next fire's commit packs them.
    let mut bulk = git2::build::TreeUpdateBuilder::new();
    for i in 0..3000 {
        let blob = repo.blob(format!("loose {i}").as_bytes()).unwrap();
        bulk.upsert(format!("reports/bulk/{i}.md"), blob, git2::FileMode::Blob);
    }
    let empty = repo
        .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
        .unwrap();
    let tree = repo.find_tree(bulk.create_updated(&repo, &empty).unwrap()).unwrap();
    let sig = git2::Signature::now("runtime", "runtime@localhost").unwrap();
    repo.commit(Some("refs/heads/bulk"), &sig, &sig, "bulk", &tree, &[])
        .unwrap();
    config.set_i64("gc.auto", 256).unwrap();
    let before = loose_objects(&env);
    assert!(before > 3000);
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 0, "{stderr}");
    let after = loose_objects(&env);
    assert!(
        after < before / 10,
        "{before} loose objects before the fire, {after} after"
    );
    let packs = std::fs::read_dir(env.root.join(".git/objects/pack"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pack"))
        .count();
    assert!(packs >= 1);
    // The packed history still reads: the fire's records are in HEAD.
    let head = repo.head().unwrap().peel_to_tree().unwrap();
    let receipt = summary["receipt"].as_str().unwrap();
    assert!(head.get_path(std::path::Path::new(receipt)).is_ok());
}

#[test]
fn a_file_staged_during_a_fire_stays_staged() {
    let w = Wire::OpenAi;
    let server = ModelServer::start(vec![
        turn(w, Some("# Report\nslow"), &[], (1, 1)).delayed(Duration::from_millis(1500))
    ]);
    // Not FAST: its 2 s request timeout left a loaded machine 0.5 s for everything
    // around the answer's 1.5 s, and a timed-out request used up the only answer.
    let env = env_for(&server, w, "limits:\n  request_timeout_s: 60\n");
    let child = fire_in_background(&env, &server);
    // The fire has checked the tree and is waiting for the model: stage a note.
    env.write("notes/todo.md", "staged while the fire ran\n");
    let repo = git2::Repository::open(&env.root).unwrap();
    let mut index = repo.index().unwrap();
    index.add_path(std::path::Path::new("notes/todo.md")).unwrap();
    index.write().unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stdout));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut index = repo.index().unwrap();
    index.read(true).unwrap();
    assert!(
        index.get_path(std::path::Path::new("notes/todo.md"), 0).is_some(),
        "the fire's commit dropped a file staged meanwhile"
    );
    let receipt = summary["receipt"].as_str().unwrap();
    assert!(
        index.get_path(std::path::Path::new(receipt), 0).is_some(),
        "the fire's own records are in the index"
    );
    let head = repo.head().unwrap().peel_to_tree().unwrap();
    assert!(
        head.get_path(std::path::Path::new("notes/todo.md")).is_err(),
        "the staged file is not swept into the runtime's commit"
    );
}
