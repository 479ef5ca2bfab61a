//! What one stdio MCP server adds to a fire's start (issue 20: at most 50 ms). The
//! release `runtime` fires a task whose model is a scripted server on 127.0.0.1, in a
//! repository with the test server (`mcp-test-server`) declared and pinned and in one
//! without; fires of the two alternate, and the time from spawning `runtime fire` to
//! the model's first request is compared, median against median (the server must be
//! started, initialised and its tools listed and checked before the first request,
//! since they are offered in it). The server's own start (spawn to tools listed,
//! inside the sandbox, as the fire logs it at debug level) is reported apart, as is
//! the whole fire. Needs the release binaries beside the bench:
//! `cargo build --release -p runtime -p builder`, then
//! `cargo bench -p tests --bench mcp_start`.

#![forbid(unsafe_code)]
// Benchmark code is test code: a failed setup step should panic and stop the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
#[path = "../util.rs"]
mod util;

use std::time::{Duration, Instant};
use util::{turn, ModelServer, TestEnv, Wire, PLAIN_PROMPT};

/// Fires per variant.
const SAMPLES: usize = 20;
/// Unmeasured fires per variant first (page cache, the first index).
const WARMUP: usize = 2;

/// One repository of the comparison: its environment and its model server.
struct Variant {
    name: &'static str,
    env: TestEnv,
    model: ModelServer,
    _server_dir: tempfile::TempDir,
    first_request: Vec<Duration>,
    whole: Vec<Duration>,
    server_start: Vec<f64>,
}

impl Variant {
    fn new(name: &'static str, with_server: bool) -> Variant {
        let replies = (0..SAMPLES + WARMUP)
            .map(|_| turn(Wire::OpenAi, Some("# Report\ndone"), &[], (10, 5)))
            .collect();
        let model = ModelServer::start(replies);
        let env = TestEnv::new();
        let server_dir = tempfile::tempdir().unwrap();
        let mcp = if with_server {
            let exe = server_dir.path().join("mcp-test-server");
            std::fs::copy(util::bin("mcp-test-server"), &exe).unwrap();
            std::fs::write(server_dir.path().join("mode"), "honest").unwrap();
            let dir = server_dir.path().display();
            format!("mcp:\n  files:\n    command: [\"{dir}/mcp-test-server\", \"{dir}/mode\"]\n    read: [\"{dir}\"]\n")
        } else {
            String::new()
        };
        let allow = if with_server { ", \"mcp__files\"" } else { "" };
        env.write(
            "settings/runtime.yaml",
            &format!(
                "version: 1\n{provider}permissions:\n  allow: [\"Read(**)\"{allow}]\n  write: [\"reports/**\"]\nsandbox:\n  landlock: required\nprices:\n  test-model: {{input_per_mtok: 1.0, output_per_mtok: 2.0}}\n{mcp}",
                provider = model.provider_yaml(Wire::OpenAi),
            ),
        );
        env.write("prompts/t.md", PLAIN_PROMPT);
        if with_server {
            let out = env.builder(&["mcp", "pin", "--trust"]);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
        env.commit_all("the bench's task");
        Variant {
            name,
            env,
            model,
            _server_dir: server_dir,
            first_request: Vec::new(),
            whole: Vec::new(),
            server_start: Vec::new(),
        }
    }

    fn fire(&mut self, measured: bool) {
        let before = self.model.requests().len();
        let started = Instant::now();
        let out = self
            .env
            .command("runtime", &["fire", "t", "--log-format", "json"])
            .env("RUNTIME_LOG", "shared::fire::mcp_start=debug")
            .output()
            .unwrap();
        let whole = started.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{} fire failed: {stderr}", self.name);
        let seen = self.model.requests();
        assert_eq!(seen.len(), before + 1, "one model request per fire");
        if !measured {
            return;
        }
        self.first_request.push(seen[before].at - started);
        self.whole.push(whole);
        for line in stderr.lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if v["fields"]["message"] == "MCP server started" {
                self.server_start.push(v["fields"]["start_ms"].as_f64().unwrap());
            }
        }
    }
}

fn median_ms(v: &[Duration]) -> f64 {
    let mut ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    median(&mut ms)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let mut without = Variant::new("without a server", false);
    let mut with = Variant::new("with one stdio server", true);
    for i in 0..SAMPLES + WARMUP {
        without.fire(i >= WARMUP);
        with.fire(i >= WARMUP);
    }
    assert_eq!(
        with.server_start.len(),
        SAMPLES,
        "every fire with the server logged its start"
    );
    println!("{SAMPLES} fires each, alternating; medians");
    println!("{:<24}{:>20}{:>14}", "", "first request ms", "whole fire ms");
    for v in [&without, &with] {
        println!(
            "{:<24}{:>20.1}{:>14.1}",
            v.name,
            median_ms(&v.first_request),
            median_ms(&v.whole)
        );
    }
    let added = median_ms(&with.first_request) - median_ms(&without.first_request);
    println!(
        "the server adds {added:.1} ms before the first request (target <= 50); its own start, spawn to tools listed: {:.1} ms",
        median(&mut with.server_start)
    );
    if added > 50.0 {
        std::process::exit(1);
    }
}
