//! `builder serve` on the 100,000-receipt scale repository (`common/scale_repo.rs`, its own
//! copy, with one more commit: a run of 5,000 tool calls whose trace, 5,100 spans
//! with arguments and results, is in `.runtime/state.db`). Starts the release
//! binary, asks each page 20 times (after one warm-up request) and prints the median
//! server time (the `Server-Timing` header: from the request's arrival to its
//! response, index refresh included) and the median round trip. Targets: every
//! page at most 200 ms, the 5,000-call run at most 300 ms, and the server's peak
//! memory (VmHWM) at most 50 MB. Exits 1 if a target is missed. The repository is
//! generated once under the system temp dir (`SERVE_REPO` overrides where).

#![forbid(unsafe_code)]
// Benchmark code is test code: a failed setup step should panic and stop the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "common/scale_repo.rs"]
mod scale_repo;

use git2::{build::TreeUpdateBuilder, FileMode, Repository, Signature};
use shared::records::{self, RecordedDecision, ToolCallRecord, ToolOutcome};
use shared::trace::{BudgetReport, SpanKind, SpanStatus, Trace, TracedCall};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Calls of the long run.
const LONG_RUN_CALLS: usize = 5_000;
/// Calls per model step in it.
const CALLS_PER_STEP: usize = 50;
const SAMPLES: usize = 20;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let root = std::env::var("SERVE_REPO")
        .map(PathBuf::from)
        .unwrap_or_else(|_| std::env::temp_dir().join("builder-serve-repo-v1"));
    if !root.join(".generated").exists() {
        let _ = std::fs::remove_dir_all(&root);
        let t = Instant::now();
        scale_repo::generate(&root);
        let long = long_run(&root);
        std::fs::write(root.join(".generated"), &long).unwrap();
        println!("generated the repository in {:.1} s", t.elapsed().as_secs_f64());
    }
    let long = std::fs::read_to_string(root.join(".generated")).unwrap();
    // A first index, as a first `builder` command would make (not part of a page).
    {
        let repo = Repository::open(&root).unwrap();
        let mut store = shared::history::open_store(&root).unwrap();
        let stats = shared::history::index(&repo, &mut store, &|_, _| {}).unwrap();
        if stats.full {
            println!("indexed {} receipts and {} cards", stats.receipts, stats.cards);
        }
    }
    let mut server = Command::new(env!("CARGO_BIN_EXE_builder"))
        .args(["serve", "--port", "0"])
        .current_dir(&root)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(server.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: SocketAddr = line
        .trim()
        .trim_start_matches("listening on http://")
        .trim_end_matches('/')
        .parse()
        .unwrap();
    let (a, b) = {
        let store = shared::history::open_store(&root).unwrap();
        let runs = shared::runs::runs(
            &store,
            &shared::runs::RunFilter {
                task: Some("digest".into()),
                limit: Some(2),
                ..Default::default()
            },
        )
        .unwrap();
        (runs[0].run_id.clone(), runs[1].run_id.clone())
    };
    let versions = {
        let store = shared::history::open_store(&root).unwrap();
        shared::pages::compare::versions(&store, "digest").unwrap()
    };
    // Page 500 of the full list: the cursor of a run 50,000 rows down.
    let deep = {
        let store = shared::history::open_store(&root).unwrap();
        let r = &shared::runs::runs(
            &store,
            &shared::runs::RunFilter {
                limit: Some(50_000),
                ..Default::default()
            },
        )
        .unwrap()[49_999];
        format!("{}|{}", r.started_at, r.run_id)
    };
    let enc = |s: &str| url_encode(s);
    let pages: Vec<(String, String, f64)> = vec![
        ("runs".into(), "/runs".into(), 200.0),
        ("runs, failed".into(), "/runs?health=failed".into(), 200.0),
        ("runs, needs attention".into(), "/runs?health=attention".into(), 200.0),
        (
            "runs, task + day".into(),
            "/runs?task=digest&day=2026-03-01".into(),
            200.0,
        ),
        (
            "runs, task + prompt version".into(),
            format!(
                "/runs?task=trader&prompt={}",
                enc(versions[0].version.prompt_blob.as_deref().unwrap_or(""))
            ),
            200.0,
        ),
        ("runs, page 500".into(), format!("/runs?after={}", enc(&deep)), 200.0),
        ("runs (JSON)".into(), "/runs?health=failed&json".into(), 200.0),
        ("run".into(), format!("/runs/{a}"), 200.0),
        ("run of 5,000 calls".into(), format!("/runs/{long}"), 300.0),
        ("run of 5,000 calls (JSON)".into(), format!("/runs/{long}?json"), 300.0),
        (
            "its last timeline page".into(),
            format!("/runs/{long}/timeline?offset=4900"),
            300.0,
        ),
        ("cards".into(), "/cards".into(), 200.0),
        (
            "cards, permission_denied".into(),
            "/cards?kind=permission_denied".into(),
            200.0,
        ),
        ("proposals".into(), "/proposals".into(), 200.0),
        ("compare two runs".into(), format!("/compare?a={a}&b={b}"), 200.0),
        (
            "compare two versions".into(),
            format!(
                "/compare?task=digest&before={}&after={}",
                versions[1].key, versions[0].key
            ),
            200.0,
        ),
        (
            "retro, the last week of runs".into(),
            "/retro?since=2026-07-21".into(),
            200.0,
        ),
        (
            "retro, all 100,000 runs".into(),
            "/retro?since=2026-01-01".into(),
            200.0,
        ),
    ];
    let mut missed = false;
    println!("{:<30} {:>12} {:>12} {:>8}", "page", "server ms", "round ms", "target");
    for (name, path, target) in &pages {
        let (path, json) = match path.strip_suffix("?json").or_else(|| path.strip_suffix("&json")) {
            Some(p) => (p.to_string(), true),
            None => (path.clone(), false),
        };
        get(addr, &path, json);
        let mut server_ms = Vec::new();
        let mut round_ms = Vec::new();
        for _ in 0..SAMPLES {
            let t = Instant::now();
            let (status, timing) = get(addr, &path, json);
            round_ms.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(status, 200, "{name}: {path}");
            server_ms.push(timing);
        }
        let (s, r) = (median(&mut server_ms), median(&mut round_ms));
        let ok = s <= *target;
        missed |= !ok;
        println!(
            "{name:<30} {s:>12.1} {r:>12.1} {:>8}",
            format!("{}{target:.0}", if ok { "<=" } else { "MISSED " })
        );
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.id())).unwrap();
    let kb = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let (peak, now) = (kb("VmHWM:") / 1024.0, kb("VmRSS:") / 1024.0);
    println!(
        "builder serve memory: peak {peak:.1} MB, now {now:.1} MB (anonymous {:.1} MB, file-backed {:.1} MB) (target <= 50 MB)",
        kb("RssAnon:") / 1024.0,
        kb("RssFile:") / 1024.0
    );
    missed |= peak > 50.0;
    let _ = server.kill();
    let _ = server.wait();
    if missed {
        println!("TARGET MISSED");
        std::process::exit(1);
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One GET (HTTP/1.1, connection closed after): the status and the server's time.
fn get(addr: SocketAddr, path: &str, json: bool) -> (u16, f64) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: {}\r\nConnection: close\r\n\r\n",
        if json { "application/json" } else { "text/html" }
    )
    .unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let text = String::from_utf8_lossy(&resp);
    let status = text.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let timing = text
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("server-timing:"))
        .and_then(|l| l.split("dur=").nth(1))
        .and_then(|d| d.trim().parse().ok())
        .unwrap_or(f64::NAN);
    (status, timing)
}

/// Commits a run of 5,000 calls (its receipt) and stores its trace in the runtime's
/// state database, as a fire on this machine would; returns its id.
fn long_run(root: &Path) -> String {
    let mut r = scale_repo::receipt(9_999_999);
    r.run_id = "20260801T000000Z-longrun0".into();
    r.task = "digest".into();
    r.started_at = chrono::DateTime::parse_from_rfc3339("2026-08-01T00:00:00Z")
        .unwrap()
        .to_utc();
    r.finished_at = r.started_at + chrono::Duration::seconds(900);
    r.steps = (LONG_RUN_CALLS / CALLS_PER_STEP) as u32;
    r.tool_calls = (0..LONG_RUN_CALLS)
        .map(|i| ToolCallRecord {
            id: format!("call_{i}"),
            name: "run_command".into(),
            decision: if i % 97 == 0 {
                RecordedDecision::Deny
            } else {
                RecordedDecision::Allow
            },
            rule: Some("Bash(git log*)".into()),
            reason: "matches an allow rule".into(),
            outcome: ToolOutcome::Ok,
            duration_ms: (i % 50) as u64,
            mcp: None,
        })
        .collect();
    let mut trace = Trace::default();
    let root_span = trace.open_root("fire digest", shared::trace::now_ns());
    for step in 1..=r.steps {
        trace.steps.push((
            step,
            BudgetReport {
                budget: 128_000,
                used: 1_000 * u64::from(step),
                included: step as usize,
                summarised: 0,
                dropped: 0,
                reasons: vec![],
            },
        ));
        let m = trace.start(SpanKind::Model, "chat gpt-4o-mini");
        trace.attr(m, "agent.step", step);
        trace.attr(
            m,
            "gen_ai.output.messages",
            format!(
                "[{{\"role\":\"assistant\",\"parts\":[{{\"type\":\"text\",\"content\":\"step {step}: {}\"}}]}}]",
                "x".repeat(400)
            ),
        );
        if let Some(s) = trace.span_mut(m) {
            s.tokens_in = 1_000;
            s.tokens_out = 80;
        }
        trace.end(m, SpanStatus::Ok);
        for c in 0..CALLS_PER_STEP {
            let i = (step as usize - 1) * CALLS_PER_STEP + c;
            let call = &r.tool_calls[i];
            let t = trace.start(SpanKind::Tool, "execute_tool run_command");
            trace.attr(t, "gen_ai.tool.name", "run_command");
            trace.attr(t, "gen_ai.tool.call.id", call.id.clone());
            trace.attr(t, "agent.decision", call.decision.to_string());
            trace.attr(
                t,
                "gen_ai.tool.call.arguments",
                format!("{{\"command\":\"git log -n {i}\"}}"),
            );
            trace.attr(t, "agent.outcome", "ok");
            trace.attr(t, "gen_ai.tool.call.result", "commit line\n".repeat(150));
            trace.end(t, SpanStatus::Ok);
            trace.calls.push(TracedCall {
                call_id: call.id.clone(),
                step,
                name: call.name.clone(),
                arguments: serde_json::json!({"command": format!("git log -n {i}")}),
                args_hash: String::new(),
                decision: call.decision,
                rule: call.rule.clone(),
                reason: call.reason.clone(),
                outcome: call.outcome,
                duration_ms: call.duration_ms,
            });
        }
    }
    trace.end(root_span, SpanStatus::Ok);
    let rel = records::receipt_path(&r.task, &r.run_id, r.started_at);
    let json = records::receipt_json(&r).unwrap();
    scale_repo::write(root, &rel, json.as_bytes());
    let repo = Repository::open(root).unwrap();
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    let mut update = TreeUpdateBuilder::new();
    update.upsert(
        rel.to_str().unwrap(),
        repo.blob(json.as_bytes()).unwrap(),
        FileMode::Blob,
    );
    let tree = repo
        .find_tree(update.create_updated(&repo, &head.tree().unwrap()).unwrap())
        .unwrap();
    let sig = Signature::now("runtime", "runtime@localhost").unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "runtime: the long run", &tree, &[&head])
        .unwrap();
    let mut state = shared::state::StateDb::open(root).unwrap().into_store();
    state.write(|tx| trace.save(tx, &r, rel.to_str().unwrap(), "")).unwrap();
    r.run_id
}
