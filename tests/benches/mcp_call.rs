//! What an MCP call costs beyond the server's own work (target: at most 2 ms a
//! call): one `tools/call` round trip with the official SDK's client over the stdio
//! pipes of the real test server (`mcp-test-server`, whose `echo` does no work of
//! its own), and the gate's share, the policy's decision on `mcp__<server>__<tool>`
//! with its arguments made canonical, against 20 rules.

#![forbid(unsafe_code)]
// Benchmark code is test code: a failed setup step should panic and stop the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion};
use rmcp::model::CallToolRequestParams;
use rmcp::ServiceExt;
use shared::policy::Policy;
use shared::settings::Permissions;
use std::hint::black_box;
use std::path::Path;

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mode = dir.path().join("mode");
    std::fs::write(&mode, "honest").unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(async {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_mcp-test-server"))
            .arg(&mode)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let (stdin, stdout) = (child.stdin.take().unwrap(), child.stdout.take().unwrap());
        let client = ().serve((stdout, stdin)).await.unwrap();
        (client, child)
    });
    let args = serde_json::json!({"text": "hello"}).as_object().cloned().unwrap();
    c.bench_function("mcp call: tools/call round trip over stdio (echo)", |b| {
        b.iter(|| {
            let params = CallToolRequestParams::new("echo").with_arguments(args.clone());
            rt.block_on(client.0.call_tool(black_box(params))).unwrap()
        })
    });
    let perms = Permissions {
        allow: (0..15)
            .map(|i| format!("mcp__server{i}"))
            .chain(["mcp__files".to_string()])
            .collect(),
        deny: (0..3)
            .map(|i| format!("mcp__files__tool{i}"))
            .chain([r#"mcp__files__echo(*"text":"secret*)"#.to_string()])
            .collect(),
        ..Permissions::default()
    };
    let policy = Policy::new(Path::new("/repo"), &perms, &[]).unwrap();
    let value = serde_json::Value::Object(args.clone());
    c.bench_function("mcp gate: canonical arguments and decision (20 rules)", |b| {
        b.iter(|| {
            let canonical = shared::mcp::lock::canonical_args(black_box(&value));
            policy.decide_mcp("files", "echo", &canonical)
        })
    });
    rt.block_on(async {
        let (client, mut child) = client;
        let _ = client.cancel().await;
        let _ = child.kill().await;
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
