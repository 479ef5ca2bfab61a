//! The agent loop itself, run in this process: `shared::agent::Agent` against the
//! `replay` provider playing a scripted conversation, with a real tool worker (the
//! `runtime` binary's worker command, outside any sandbox: the loop is under test
//! here, the sandbox in its own suites). Each case checks what the loop decides
//! (its stop, its cards, what goes back to the model, what it counts), with no
//! receipt, commit or state database in between.

use crate::util::bin;
use serde_json::{json, Value};
use shared::agent::worker_client::{spawn_process, WorkerClient};
use shared::agent::{Agent, CallDecision, LoopConfig, LoopState};
use shared::policy::Policy;
use shared::provider::{Message, Provider, ProviderChain, RetryPolicy};
use shared::records::{CardKind, RecordedDecision, StopReason};
use shared::sandbox::SandboxSpec;
use shared::settings::{Budgets, LandlockMode, Limits, Permissions, ProviderKind, ProviderSettings};
use shared::tools::exec::ExecContext;
use shared::tools::Tool;
use shared::worker::WorkerConfig;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One loop's world: a directory the tools work in, a scratch, the script.
struct Script {
    _dir: tempfile::TempDir,
    root: PathBuf,
    scratch: PathBuf,
    permissions: Permissions,
    budgets: Budgets,
    limits: Limits,
    /// Directories (`None`) and files made once the loop's sweep window has begun,
    /// before its first step (what a process an earlier call left running made in
    /// between).
    made_meanwhile: Vec<(&'static str, Option<&'static str>)>,
}

/// A call in a scripted turn.
fn call(id: &str, name: &str, arguments: Value) -> Value {
    json!({ "id": id, "name": name, "arguments": arguments })
}

/// A turn that asks for `calls`, counting `input`/`output` tokens.
fn asks(calls: Vec<Value>, input: u64, output: u64) -> Value {
    json!({ "tool_calls": calls, "usage": { "input": input, "output": output } })
}

/// A turn that answers `text`.
fn answers(text: &str) -> Value {
    json!({ "content": text, "usage": { "input": 10, "output": 5 } })
}

impl Script {
    /// `turns` as the model's answers, in a fresh directory, with the given rules.
    fn new(turns: Vec<Value>, allow: &[&str], ask: &[&str], deny: &[&str]) -> Script {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        let scratch = dir.path().join("scratch");
        std::fs::create_dir_all(root.join("reports")).unwrap();
        std::fs::create_dir_all(&scratch).unwrap();
        let trace = json!({ "version": 1, "model": "scripted", "turns": turns });
        std::fs::write(root.join("trace.json"), trace.to_string()).unwrap();
        let strings = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Script {
            _dir: dir,
            root,
            scratch,
            permissions: Permissions {
                allow: strings(allow),
                ask: strings(ask),
                deny: strings(deny),
                write: vec!["reports/**".into()],
                ..Permissions::default()
            },
            budgets: Budgets::default(),
            limits: Limits::default(),
            made_meanwhile: Vec::new(),
        }
    }

    /// `turns` with only reads allowed (what most cases need).
    fn reading(turns: Vec<Value>) -> Script {
        Script::new(turns, &["Read(**)"], &[], &[])
    }

    /// Runs the loop from a fresh state until it stops: the stop and the state.
    fn fresh(&self) -> (StopReason, LoopState) {
        let mut state = LoopState::default();
        let stop = self.run(&mut state, None, false);
        (stop, state)
    }

    /// Runs the loop on `state` until it stops; `decision` answers a paused call's
    /// approval lookup; `cancelled` starts it already cancelled.
    fn run(&self, state: &mut LoopState, decision: Option<CallDecision>, cancelled: bool) -> StopReason {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(self.run_async(state, decision, cancelled))
    }

    async fn run_async(&self, state: &mut LoopState, decision: Option<CallDecision>, cancelled: bool) -> StopReason {
        let provider = Provider::new(
            &ProviderSettings {
                kind: ProviderKind::Replay,
                base_url: None,
                model: None,
                api_key_env: None,
                replay: Some("trace.json".into()),
                max_context_tokens: None,
            },
            &self.root,
            RetryPolicy::from_limits(&self.limits),
        )
        .unwrap();
        let chain = ProviderChain::new(provider, None, Duration::from_secs(300));
        let policy = Policy::new(&self.root, &self.permissions, &[]).unwrap();
        let cfg = LoopConfig {
            task: "scripted".into(),
            run_id: "20261202T000000Z-scripted".into(),
            model: "scripted".into(),
            tools: Tool::ALL.to_vec(),
            budgets: self.budgets,
            limits: self.limits,
            max_context: 128_000,
            max_output_tokens: 1024,
            prices: Default::default(),
            redactor: shared::secrets::Redactor::default(),
            trace_input: false,
            committed: Box::new(|_| false),
            root: self.root.clone(),
            write_roots: vec!["reports".into()],
            decision: Box::new(move |_, _| decision),
        };
        let env = ExecContext::scrubbed_env(&self.scratch);
        let spec = SandboxSpec {
            read_dirs: vec![self.root.clone()],
            write_dirs: vec![self.root.join("reports"), self.scratch.clone()],
            write_files: vec!["/dev/null".into()],
            connect_ports: vec![],
            scope_ipc: false,
            max_abi: None,
        };
        let config = WorkerConfig {
            root: self.root.clone(),
            scratch: self.scratch.clone(),
            spec,
            mode: LandlockMode::Off,
            env: env.clone(),
            isolation: None,
            mcp: None,
        };
        let child = spawn_process(&bin("runtime"), &[shared::worker::WORKER_COMMAND.to_string()], &env).unwrap();
        let mut worker = WorkerClient::start(child, &config).await.unwrap();
        let (_cancel_tx, mut cancel) = tokio::sync::watch::channel(cancelled);
        let hub = shared::agent::mcp_client::McpHub::default();
        let sweep = shared::agent::SweepWindow::opening_now();
        for (path, content) in &self.made_meanwhile {
            match content {
                None => std::fs::create_dir_all(self.root.join(path)).unwrap(),
                Some(text) => std::fs::write(self.root.join(path), text).unwrap(),
            }
        }
        if !self.made_meanwhile.is_empty() {
            // Older than any one call's window, with its margin for the file clock.
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        let stop = Agent {
            cfg: &cfg,
            provider: &chain,
            policy: &policy,
            worker: &mut worker,
            cancel: &mut cancel,
            started: Instant::now(),
            progress: &shared::progress::SILENT,
            journal: None,
            mcp: &hub,
            sweep,
        }
        .run(state)
        .await;
        worker.shutdown().await;
        stop
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
}

/// The text of the tool result the model was sent for `call_id`.
fn tool_result(state: &LoopState, call_id: &str) -> String {
    state
        .messages
        .iter()
        .find_map(|m| match m {
            Message::Tool {
                call_id: id, content, ..
            } if id == call_id => Some(content.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no tool result for {call_id} in {:#?}", state.messages))
}

/// A model that asks for `command` (under an ask rule), then answers `answer`.
fn pausing(command: &str, answer: &str) -> Script {
    let ask = asks(vec![call("p1", "run_command", json!({ "command": command }))], 10, 5);
    Script::new(vec![ask, answers(answer)], &["Read(**)"], &["Bash(echo*)"], &[])
}

/// Fails unless the loop left a card of `kind`.
fn assert_carded(state: &LoopState, kind: CardKind) {
    let kinds: Vec<CardKind> = state.cards.iter().map(|c| c.kind).collect();
    assert!(kinds.contains(&kind), "no {kind:?} card: {kinds:?}");
}

fn exists(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok()
}

/// A worker without a write-back: the sweep after a writing call looks back to where
/// the last one began (here the loop's start), not to the call's own start, so a
/// repository made between calls (by a process an earlier call left running, or
/// during a read) is found and named; a bare one's HEAD too.
#[test]
fn the_sweep_finds_what_was_made_between_calls() {
    let mut s = Script::new(
        vec![
            asks(vec![call("w1", "run_command", json!({"command": "true"}))], 10, 5),
            answers("done"),
        ],
        &["Bash(true)"],
        &[],
        &[],
    );
    s.made_meanwhile = vec![
        ("reports/between/.git", None),
        ("reports/bare/objects", None),
        ("reports/bare/refs", None),
        ("reports/bare/HEAD", Some("ref: refs/heads/main\n")),
    ];
    let (stop, state) = s.fresh();
    assert_eq!(stop, StopReason::FinalAnswer);
    assert!(!s.path("reports/between/.git").exists());
    assert!(!s.path("reports/bare/HEAD").exists());
    let card = state
        .cards
        .iter()
        .find(|c| c.summary.contains("nested git"))
        .unwrap_or_else(|| panic!("no card: {:#?}", state.cards));
    assert!(
        card.detail.contains("reports/between/.git") && card.detail.contains("reports/bare/HEAD"),
        "{}",
        card.detail
    );
}

#[test]
fn a_final_answer_ends_the_loop_at_its_step_with_its_tokens_counted() {
    let s = Script::reading(vec![answers("all quiet")]);
    let (stop, state) = s.fresh();
    assert_eq!(stop, StopReason::FinalAnswer);
    assert_eq!(state.final_answer.as_deref(), Some("all quiet"));
    assert_eq!(state.step, 1);
    assert_eq!((state.tokens.input, state.tokens.output), (10, 5));
    assert!(state.tool_calls.is_empty() && state.cards.is_empty(), "{state:#?}");
}

#[test]
fn an_allowed_call_runs_in_the_worker_and_its_output_goes_back_to_the_model() {
    let s = Script::new(
        vec![
            asks(vec![call("c1", "read_file", json!({"path": "notes.txt"}))], 100, 20),
            asks(
                vec![call(
                    "c2",
                    "write_file",
                    json!({"path": "reports/out.md", "content": "written by the loop"}),
                )],
                100,
                20,
            ),
            answers("read and wrote"),
        ],
        &["Read(**)", "Write(reports/**)"],
        &[],
        &[],
    );
    std::fs::write(s.path("notes.txt"), "seventeen-apples\n").unwrap();
    let (stop, state) = s.fresh();
    assert_eq!(stop, StopReason::FinalAnswer, "{state:#?}");
    assert!(tool_result(&state, "c1").contains("seventeen-apples"));
    assert_eq!(
        std::fs::read_to_string(s.path("reports/out.md")).unwrap(),
        "written by the loop"
    );
    assert_eq!(state.step, 3);
    assert_eq!(state.tool_calls.len(), 2);
    assert!(state.tool_calls.iter().all(|c| c.decision == RecordedDecision::Allow));
    assert_eq!((state.tokens.input, state.tokens.output), (210, 45));
}

#[test]
fn denials_past_the_limit_stop_the_loop_and_no_denied_call_runs() {
    let mut s = Script::new(
        vec![
            asks(
                vec![call("d1", "run_command", json!({"command": "touch reports/one"}))],
                10,
                5,
            ),
            asks(
                vec![call("d2", "run_command", json!({"command": "touch reports/two"}))],
                10,
                5,
            ),
            answers("never reached"),
        ],
        &["Read(**)"],
        &[],
        &["Bash(touch*)"],
    );
    s.limits.max_denials = 1;
    let (stop, state) = s.fresh();
    assert_eq!(stop, StopReason::PermissionDenied, "{state:#?}");
    assert_eq!(state.denials, 2);
    // The model was told each time, and neither command ran.
    for id in ["d1", "d2"] {
        let told = tool_result(&state, id);
        assert!(
            told.contains("PERMISSION_DENIED") && told.contains("deny rule"),
            "{told}"
        );
    }
    assert!(!exists(&s.path("reports/one")) && !exists(&s.path("reports/two")));
    assert!(state.tool_calls.iter().all(|c| c.decision == RecordedDecision::Deny));
}

#[test]
fn the_same_call_over_and_over_stops_as_repeated_call() {
    let same = || asks(vec![call("r", "list_dir", json!({"path": "."}))], 10, 5);
    let s = Script::reading(vec![same(), same(), same(), same(), answers("never reached")]);
    let (stop, state) = s.fresh();
    assert_eq!(stop, StopReason::RepeatedCall, "{state:#?}");
    assert_eq!(state.tool_calls.len(), 3, "stops at the third identical call");
    assert_carded(&state, CardKind::RepeatedCall);
}

#[test]
fn max_steps_stops_before_the_next_model_call_with_a_card_naming_the_last_calls() {
    let mut s = Script::reading(vec![
        asks(vec![call("a", "list_dir", json!({"path": "."}))], 10, 5),
        asks(vec![call("b", "read_file", json!({"path": "notes.txt"}))], 10, 5),
        asks(vec![call("c", "grep", json!({"pattern": "x", "path": "."}))], 10, 5),
        answers("never reached"),
    ]);
    std::fs::write(s.path("notes.txt"), "x\n").unwrap();
    s.budgets.max_steps = 2;
    let (stop, state) = s.fresh();
    assert_eq!(stop, StopReason::MaxSteps);
    assert_eq!(state.step, 2);
    assert_eq!(state.tool_calls.len(), 2, "the third turn is never asked for");
    let card = state.cards.iter().find(|c| c.kind == CardKind::MaxSteps).unwrap();
    assert!(card.evidence.iter().any(|e| e.contains("read_file")), "{card:?}");
}

#[test]
fn the_token_budget_stops_the_loop_once_a_response_passes_it() {
    let mut s = Script::reading(vec![
        asks(vec![call("a", "list_dir", json!({"path": "."}))], 600, 100),
        asks(vec![call("b", "list_dir", json!({"path": "reports"}))], 600, 100),
        answers("never reached"),
    ]);
    s.budgets.max_tokens = 1_000;
    let (stop, state) = s.fresh();
    assert_eq!(stop, StopReason::TokenBudget, "{state:#?}");
    assert_eq!(state.tokens.input + state.tokens.output, 1_400);
    assert_carded(&state, CardKind::BudgetExceeded);
}

#[test]
fn an_ask_call_pauses_without_running_and_runs_once_approved_on_resume() {
    let s = pausing("echo approved > reports/flag", "flag set");
    let (stop, mut state) = s.fresh();
    assert_eq!(stop, StopReason::WaitingApproval, "{state:#?}");
    let pending = state.pending.clone().expect("the call waits");
    assert_eq!(pending.call.id, "p1");
    assert!(!exists(&s.path("reports/flag")), "a paused call does not run");

    // Resumed from the same state with the builder's approval: the call runs once,
    // and the loop goes on to the model's next turn.
    let stop = s.run(&mut state, Some(CallDecision::Approve), false);
    assert_eq!(stop, StopReason::FinalAnswer, "{state:#?}");
    assert_eq!(std::fs::read_to_string(s.path("reports/flag")).unwrap(), "approved\n");
    assert!(state.pending.is_none());
    assert_eq!(state.final_answer.as_deref(), Some("flag set"));
}

#[test]
fn an_ask_call_denied_on_resume_never_runs_and_the_model_is_told() {
    let s = pausing("echo refused > reports/flag", "understood");
    let (stop, mut state) = s.fresh();
    assert_eq!(stop, StopReason::WaitingApproval);
    let stop = s.run(&mut state, Some(CallDecision::Deny), false);
    assert_eq!(stop, StopReason::FinalAnswer, "{state:#?}");
    assert!(!exists(&s.path("reports/flag")));
    assert!(
        tool_result(&state, "p1").contains("denied"),
        "{}",
        tool_result(&state, "p1")
    );
}

#[test]
fn a_script_that_runs_out_stops_as_a_provider_error_with_its_card() {
    let s = Script::reading(vec![asks(vec![call("a", "list_dir", json!({"path": "."}))], 10, 5)]);
    let (stop, state) = s.fresh();
    assert_eq!(stop, StopReason::ProviderError, "{state:#?}");
    let card = state.cards.iter().find(|c| c.kind == CardKind::ProviderError).unwrap();
    assert!(card.detail.contains("turn 2"), "{card:?}");
}

#[test]
fn a_cancelled_fire_stops_before_its_first_model_call() {
    let s = Script::reading(vec![answers("never reached")]);
    let mut state = LoopState::default();
    let stop = s.run(&mut state, None, true);
    assert_eq!(stop, StopReason::Cancelled);
    assert_eq!(state.step, 0);
    assert!(state.messages.iter().all(|m| !matches!(m, Message::Assistant { .. })));
}

#[test]
fn a_call_to_an_unknown_tool_is_answered_as_an_error_and_the_loop_goes_on() {
    let s = Script::reading(vec![
        asks(vec![call("u", "launch_rockets", json!({"count": 3}))], 10, 5),
        answers("no rockets then"),
    ]);
    let (stop, state) = s.fresh();
    assert_eq!(stop, StopReason::FinalAnswer, "{state:#?}");
    assert!(
        tool_result(&state, "u").contains("launch_rockets"),
        "{}",
        tool_result(&state, "u")
    );
}
