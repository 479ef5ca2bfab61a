//! The per-step checkpoint (issue 11): the loop state of a 10-step run serialized and
//! written with the run row's totals and one ledger entry in one SQLite transaction,
//! on disk, with each durability setting: `normal`, the default (WAL, `synchronous =
//! NORMAL`: survives a process crash; not a power loss; target at most 0.5 ms per
//! step), and `strict` (`synchronous = FULL`: an fsync per checkpoint).

#![forbid(unsafe_code)]
// Benchmark code is test code: a failed setup step should panic and stop the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion};
use shared::agent::{save_checkpoint, LoopState};
use shared::journal::{CallStage, Journal, LedgerEntry, RunStart};
use shared::provider::{Message, ToolCall};
use shared::settings::Durability;
use shared::state::StateDb;
use shared::trace::{SpanKind, SpanStatus};

/// The state after `steps` steps, each a model call asking for one command and its
/// 2 KB result, with the spans the loop records for both.
fn state_after(steps: u32) -> LoopState {
    let mut state = LoopState::default();
    state.trace.open_root("fire t", 0);
    state.messages.push(Message::System {
        content: "You are the runtime's agent. ".repeat(40),
    });
    state.messages.push(Message::User {
        content: "Summarise the repository's recent history. ".repeat(20),
    });
    for step in 1..=steps {
        state.step = step;
        let call = ToolCall {
            id: format!("call_{step}"),
            name: "run_command".into(),
            arguments: format!(r#"{{"command":"git log --oneline -n 20 -- src/{step}.rs"}}"#),
        };
        let model = state.trace.start(SpanKind::Model, "chat gpt-4o-mini");
        state.trace.attr(model, "gen_ai.output.messages", "x".repeat(300));
        state.trace.end(model, SpanStatus::Ok);
        state.messages.push(Message::Assistant {
            content: Some("Looking at the history.".into()),
            tool_calls: vec![call.clone()],
        });
        let tool = state.trace.start(SpanKind::Tool, "execute_tool run_command");
        let output = format!("{step:07x} a commit subject line of typical length\n").repeat(40);
        state.trace.attr(tool, "gen_ai.tool.call.result", output.clone());
        state.trace.end(tool, SpanStatus::Ok);
        state.messages.push(Message::Tool {
            call_id: call.id,
            name: call.name,
            content: output,
            is_error: false,
        });
        state.tokens.input += 1500;
        state.tokens.output += 60;
    }
    state
}

/// A journal in a fresh state database under `dir`, at `durability`.
fn journal(dir: &std::path::Path, durability: Durability) -> Journal {
    let store = StateDb::open(dir).unwrap().into_store();
    Journal::begin(
        store,
        &RunStart {
            run_id: "20261130T000000Z-bench",
            task: "t",
            started_at: chrono::Utc::now(),
            ledger_run: "20261130T000000Z-bench",
            inputs: "{}",
            durability,
        },
    )
    .unwrap()
}

fn bench(c: &mut Criterion) {
    let state = state_after(10);
    let blob = serde_json::to_string(&state).unwrap();
    println!("checkpoint of a 10-step run: {} bytes of state", blob.len());
    let entry = LedgerEntry {
        call_id: "call_10".into(),
        name: "run_command".into(),
        args_hash: "0".repeat(64),
        stage: CallStage::Completed,
        result: Some("r".repeat(2000)),
    };
    let first = state_after(1);
    for durability in [Durability::Normal, Durability::Strict] {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = journal(dir.path(), durability);
        let name = durability.as_str();
        c.bench_function(
            &format!("checkpoint ({name}): step 10 (state, totals, one ledger entry)"),
            |b| b.iter(|| save_checkpoint(&mut journal, &state, std::slice::from_ref(&entry)).unwrap()),
        );
        c.bench_function(&format!("checkpoint ({name}): step 1"), |b| {
            b.iter(|| save_checkpoint(&mut journal, &first, std::slice::from_ref(&entry)).unwrap())
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
