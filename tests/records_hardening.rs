//! The runtime as a confused deputy, and what the model may leave behind (issue 10,
//! items 3, 4 and the secrets of 6). Each case is a real `runtime fire` under the
//! real Landlock with permissive rules (`Bash(*)`), played by the replay provider:
//! it first proves its payload ran (a marker or its own effect under `reports/`),
//! then that the runtime's records were neither forged nor blocked, that builder
//! files are untouched, and that only plain data the model wrote was committed.

use crate::skip::Capability;
use crate::util::*;
use serde_json::{json, Value};
use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

pub(crate) fn cmd(c: &str) -> (&'static str, Value) {
    ("run_command", json!({ "command": c }))
}

/// A payload the policy cannot see into: written to `reports/` as a script, then run
/// with the system shell (only the kernel layer stands in its way).
pub(crate) fn script(name: &str, body: &str) -> [(&'static str, Value); 2] {
    [
        (
            "write_file",
            json!({"path": format!("reports/{name}.sh"), "content": body}),
        ),
        cmd(&format!("sh reports/{name}.sh")),
    ]
}

pub(crate) fn trace_json(calls: &[(&str, Value)], answer: &str) -> String {
    let mut turns: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"tool_calls": [{"id": format!("c{i}"), "name": name, "arguments": args}], "usage": {"input": 10, "output": 5}})
        })
        .collect();
    turns.push(json!({"content": answer, "usage": {"input": 10, "output": 5}}));
    json!({"version": 1, "turns": turns}).to_string()
}

pub(crate) fn settings(write: &str, limits: &str) -> String {
    format!(
        "version: 1\nprovider:\n  kind: replay\n  replay: evals/hardening/trace.json\n  api_key_env: {KEY_ENV}\npermissions:\n  allow: [\"Bash(*)\", \"Read(**)\"]\n  write: {write}\nsandbox:\n  landlock: required\nbudgets:\n  max_steps: 12\nlimits:\n  max_denials: 10\n  repeated_call: 10\n  repeated_error: 10\n{limits}"
    )
}

pub(crate) fn landlock_or_skip() -> bool {
    let abi = shared::sandbox::landlock::kernel_abi();
    if abi < shared::sandbox::landlock::TARGET_ABI as u32 {
        crate::skip::skip(
            Capability::Landlock,
            &format!("this kernel's Landlock ABI {abi} cannot enforce the kernel layer these cases need"),
        );
        return false;
    }
    true
}

/// A repo with task `t` whose replayed model makes `calls` then answers `answer`.
pub(crate) fn setup(calls: &[(&str, Value)], answer: &str, limits: &str) -> TestEnv {
    let env = TestEnv::new();
    env.write("prompts/t.md", PLAIN_PROMPT);
    env.write("settings/runtime.yaml", &settings("[\"reports/**\"]", limits));
    env.write("evals/hardening/trace.json", &trace_json(calls, answer));
    env.commit_all("hardening case");
    env
}

/// `runtime fire t --json` with extra variables, killed (and the test failed) if it
/// does not end within a minute: a hung fire is a failure, not a slow pass.
pub(crate) fn fire(env: &TestEnv, vars: &[(&str, &str)]) -> (i32, Value) {
    let mut c = env.command("runtime", &["fire", "t", "--json"]);
    c.env("PATH", "/usr/local/bin:/usr/bin:/bin");
    for (k, v) in vars {
        c.env(k, v);
    }
    let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("the fire hung for a minute");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (mut out, mut err) = (String::new(), String::new());
    child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    let summary: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("no JSON ({e}): {out}\nstderr: {err}"));
    (status.code().unwrap_or(-1), summary)
}

/// `(mode, bytes)` of `rel` in HEAD's tree.
pub(crate) fn committed(env: &TestEnv, rel: &str) -> Option<(i32, Vec<u8>)> {
    let repo = git2::Repository::open(&env.root).unwrap();
    let tree = repo.head().unwrap().peel_to_commit().unwrap().tree().unwrap();
    let entry = tree.get_path(std::path::Path::new(rel)).ok()?;
    let blob = repo.find_blob(entry.id()).ok()?;
    Some((entry.filemode(), blob.content().to_vec()))
}

pub(crate) fn rejected_detail(env: &TestEnv, summary: &Value) -> String {
    env.cards(summary)
        .iter()
        .filter(|c| c["kind"] == "output_rejected")
        .map(|c| c["detail"].as_str().unwrap().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

/// What every case checks after its fire: builder files and `.git` untouched, the
/// fire's records committed by the runtime and nothing outside runtime paths.
fn check_common(env: &TestEnv, before: &std::collections::BTreeMap<String, String>, summary: &Value) {
    assert_eq!(&env.builder_snapshot(), before, "a builder-owned file changed");
    assert_eq!(env.commit_authors()[0], "runtime");
    for p in env.last_commit_paths() {
        assert!(
            p.starts_with("reports/") || p.starts_with("cards/") || p.starts_with("runs/"),
            "runtime committed {p}"
        );
    }
    let receipt = summary["receipt"].as_str().unwrap();
    assert!(committed(env, receipt).is_some(), "the receipt was not committed");
    let report = summary["report"].as_str().unwrap();
    let (mode, bytes) = committed(env, report).expect("the report was not committed");
    assert_eq!(mode, i32::from(git2::FileMode::Blob));
    assert!(
        bytes.starts_with(b"<!-- runtime report -->"),
        "{}",
        String::from_utf8_lossy(&bytes)
    );
}

#[test]
fn a_link_planted_on_the_report_path_is_not_followed_and_the_report_goes_to_runs() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(
        &script(
            "plant",
            "mkdir -p reports/t && ln -s ../../prompts reports/t/$(date -u +%F) && echo ran > reports/marker.txt\n",
        ),
        "# Done",
        "",
    );
    let before = env.builder_snapshot();
    let (code, summary) = fire(&env, &[]);
    assert_eq!(
        committed(&env, "reports/marker.txt").map(|c| c.1),
        Some(b"ran\n".to_vec()),
        "the payload did not run"
    );
    assert_eq!(code, 5, "{summary}");
    check_common(&env, &before, &summary);
    // The planted link is named and removed before the report is written (never
    // through it), so the report takes its own name, inside a real directory.
    let detail = rejected_detail(&env, &summary);
    assert!(
        detail.contains("symlink") && detail.contains("removed from the work tree"),
        "{detail}"
    );
    let report = summary["report"].as_str().unwrap();
    assert!(report.starts_with("reports/t/"), "{report}");
    assert_eq!(env.receipt(&summary)["outputs"][0], report);
    let (_, bytes) = committed(&env, report).expect("the report was not committed");
    assert!(bytes.starts_with(b"<!-- runtime report -->"));
    let day = std::path::Path::new(report).parent().unwrap();
    assert!(!env.root.join(day).is_symlink(), "the planted link stayed");
    assert_eq!(
        std::fs::read_dir(env.root.join("prompts")).unwrap().count(),
        2,
        "nothing written into prompts/"
    );
}

#[test]
fn a_record_replaced_before_the_commit_is_committed_with_the_runtime_bytes() {
    if !landlock_or_skip() {
        return;
    }
    // A process that outlived its call would turn every report of the task into a
    // link to a builder file as soon as the runtime writes it. Tool processes cannot
    // outlive their call any more (each call's PID namespace dies with it: see
    // isolation::nothing_a_call_started_outlives_it), so this test plays that process
    // itself, from outside the sandbox, as on a kernel without the namespaces.
    let env = setup(&[cmd("echo started > reports/marker.txt")], "# Done", "");
    let before = env.builder_snapshot();
    // The fire pauses at the named point between writing its records and committing
    // them (a debug-build hook); it goes on only once the report has been replaced,
    // so the swap lands inside that window every time.
    let state = env.root.join(".runtime");
    let swap = |env: &TestEnv| {
        let mut swapped = String::new();
        for day in std::fs::read_dir(env.root.join("reports/t"))
            .into_iter()
            .flatten()
            .flatten()
        {
            for f in std::fs::read_dir(day.path()).into_iter().flatten().flatten() {
                let p = f.path();
                if p.extension().is_some_and(|e| e == "md") && !p.is_symlink() {
                    std::fs::remove_file(&p).unwrap();
                    std::os::unix::fs::symlink("../../../prompts/t.md", &p).unwrap();
                    let rel = p.strip_prefix(&env.root).unwrap().to_string_lossy().to_string();
                    swapped.push_str(&format!("{rel}\n"));
                }
            }
        }
        swapped
    };
    let (code, summary, swapped) = std::thread::scope(|s| {
        let fired = s.spawn(|| fire(&env, &[(shared::fire::PAUSE_BEFORE_COMMIT_ENV, "1")]));
        let deadline = Instant::now() + Duration::from_secs(30);
        while !state.join("test-pause.paused").exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let swapped = swap(&env);
        std::fs::write(state.join("test-pause.go"), b"").unwrap();
        let (code, summary) = fired.join().unwrap();
        (code, summary, swapped)
    });
    assert!(env.root.join("reports/marker.txt").exists(), "the payload did not run");
    let report = summary["report"].as_str().unwrap().to_string();
    assert!(
        swapped.lines().any(|l| l == report),
        "the swapper did not replace the report before the commit: the case proves nothing ({swapped})"
    );
    assert!(
        env.root.join(&report).is_symlink(),
        "the swapper never replaced the report: the case proves nothing"
    );
    assert_eq!(code, TestEnv::completed_code(&summary), "{summary}");
    check_common(&env, &before, &summary);
    // The index holds the runtime's bytes too, not the link.
    let repo = git2::Repository::open(&env.root).unwrap();
    let staged = repo
        .index()
        .unwrap()
        .get_path(std::path::Path::new(&report), 0)
        .unwrap();
    assert_eq!(staged.mode, u32::from(git2::FileMode::Blob));
}

#[test]
fn a_fifo_under_reports_does_not_hang_the_fire_and_is_named() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(
        &[cmd("mkfifo reports/fifo && echo ran > reports/marker.txt")],
        "# Done",
        "",
    );
    let before = env.builder_snapshot();
    let (code, summary) = fire(&env, &[]);
    assert!(
        committed(&env, "reports/marker.txt").is_some(),
        "the payload did not run"
    );
    assert_eq!(code, 5, "{summary}");
    check_common(&env, &before, &summary);
    assert!(committed(&env, "reports/fifo").is_none());
    // Named (the tool made it), and removed: the tools made it this fire.
    let detail = rejected_detail(&env, &summary);
    assert!(
        detail.contains("reports/fifo: not a regular file (FIFO); removed from the work tree"),
        "{detail}"
    );
    assert!(std::fs::symlink_metadata(env.root.join("reports/fifo")).is_err());
}

#[test]
fn links_git_metadata_and_oversize_files_are_left_out_and_named() {
    if !landlock_or_skip() {
        return;
    }
    let payload = [
        "ln -s ../prompts/t.md reports/link",
        "ln prompts/t.md reports/hard",
        "echo a > reports/a.txt && ln reports/a.txt reports/a2.txt",
        "printf '* filter=evil\\n' > reports/.gitattributes",
        "printf '[submodule \"x\"]\\n' > reports/.gitmodules",
        "mkdir -p reports/sub/.git && echo x > reports/sub/.git/config",
        "head -c 5000 /dev/zero > reports/big.bin",
        "echo x > reports/a..b.md",
        "mkdir -p reports/.GIT && echo x > reports/.GIT/config",
        "echo x > 'reports/x\\.git'",
        "echo ok > reports/good.md",
    ]
    .join("; ");
    let [write_special, run_special] = script(
        "special",
        "mknod reports/null c 1 3\npython3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('reports/sock')\"\n",
    );
    let env = setup(
        &[cmd(&payload), write_special, run_special],
        "# Done",
        "  output_file_bytes: 1000\n",
    );
    let before = env.builder_snapshot();
    let (code, summary) = fire(&env, &[]);
    assert_eq!(
        committed(&env, "reports/good.md").map(|c| c.1),
        Some(b"ok\n".to_vec()),
        "the payload did not run"
    );
    assert_eq!(code, 5, "{summary}");
    // A hard link a tool makes stays in its sandbox: the writes are copied back after
    // the call as files of their own (never through a link), so both names arrive as
    // plain files with their own bytes.
    for rel in ["reports/a.txt", "reports/a2.txt"] {
        assert_eq!(committed(&env, rel).map(|c| c.1), Some(b"a\n".to_vec()), "{rel}");
    }
    check_common(&env, &before, &summary);
    let detail = rejected_detail(&env, &summary);
    for (rel, why) in [
        ("reports/link", "symlink"),
        ("reports/.gitattributes", "git metadata"),
        ("reports/.gitmodules", "git metadata"),
        ("reports/sub/.git", "git metadata"),
        ("reports/big.bin", "output_file_bytes"),
        ("reports/a..b.md", "the commit refuses"),
        ("reports/.GIT", "git metadata"),
        // git's fsck judges each part after a `\`: every checking remote refused the
        // push (helper-91).
        ("reports/x\\.git", "after a `\\`"),
    ] {
        assert!(committed(&env, rel).is_none(), "{rel} was committed");
        assert!(
            detail.contains(&format!("{rel}: ")) && detail.contains(why),
            "{rel} ({why}) not named: {detail}"
        );
    }
    assert!(committed(&env, "reports/sub/.git/config").is_none());
    // What the tools made this fire and the commit refused is removed, so nothing
    // piles up over fires.
    for rel in ["reports/link", "reports/big.bin", "reports/a..b.md"] {
        assert!(
            detail.contains(&format!("{rel}: ")) && std::fs::symlink_metadata(env.root.join(rel)).is_err(),
            "{rel} stayed: {detail}"
        );
    }
    // The kernel refuses the hard link to a prompt; had it existed it would be named.
    assert!(!env.root.join("reports/hard").exists() || detail.contains("reports/hard: "));
    assert!(committed(&env, "reports/hard").is_none());
    // A device node (only as root) and a socket are named wherever they could be made.
    for (rel, why) in [("reports/null", "device"), ("reports/sock", "socket")] {
        let made = std::fs::symlink_metadata(env.root.join(rel)).is_ok();
        eprintln!("{rel}: made by the payload: {made}");
        assert!(
            !made || detail.contains(&format!("{rel}: not a regular file ({why})")),
            "{rel}: {detail}"
        );
        assert!(committed(&env, rel).is_none());
    }
    let receipt = env.receipt(&summary);
    assert!(
        receipt["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|o| o == "reports/good.md"),
        "{receipt}"
    );
    // Committed from the bytes read once, and staged so the work tree shows clean.
    let repo = git2::Repository::open(&env.root).unwrap();
    let status = repo.status_file(std::path::Path::new("reports/good.md")).unwrap();
    assert!(status.is_empty(), "{status:?}");
}

#[test]
fn the_model_cannot_write_receipts_or_cards_and_settings_cannot_let_it() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(
        &[
            cmd("echo ran > reports/marker.txt"),
            ("write_file", json!({"path": "cards/x.yaml", "content": "id: forged\n"})),
            cmd("python3 -c \"import os; os.makedirs('car'+'ds/2026-01-01', exist_ok=True); open('car'+'ds/2026-01-01/y.yaml','w').write('id: x')\""),
            cmd("python3 -c \"import os; os.makedirs('ru'+'ns/t', exist_ok=True); open('ru'+'ns/t/forged.json','w').write('{}')\""),
        ],
        "# Done",
        "",
    );
    let (_, summary) = fire(&env, &[]);
    assert!(
        committed(&env, "reports/marker.txt").is_some(),
        "the payload did not run"
    );
    let calls = env.receipt(&summary)["tool_calls"].as_array().unwrap().clone();
    assert_eq!(calls[1]["decision"], "deny", "{}", calls[1]);
    for c in &calls[2..] {
        assert_eq!(c["decision"], "allow", "{c}");
        assert_ne!(c["outcome"], "ok", "the kernel must refuse it: {c}");
    }
    assert!(!env.root.join("cards/x.yaml").exists());
    assert!(!env.root.join("cards/2026-01-01/y.yaml").exists());
    assert!(!env.root.join("runs/t/forged.json").exists());

    // A write ACL that reaches cards/ is an error in `builder check` and refuses a fire.
    env.write("settings/runtime.yaml", &settings("[\"reports/**\", \"cards/**\"]", ""));
    env.commit_all("write ACL reaches cards");
    let out = env.builder(&["check"]);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stdout.contains("settings/runtime.yaml:8: permissions.write: write glob `cards/**` reaches `cards/`"),
        "{stdout}"
    );
    let (code, summary) = fire(&env, &[]);
    assert_ne!(code, 0);
    assert_eq!(env.card_kinds(&summary), vec!["invalid_config"], "{summary}");
    assert_eq!(env.receipt(&summary)["steps"], 0);
}

#[test]
fn a_forged_card_prints_without_raw_escape_sequences() {
    let env = TestEnv::new();
    let at = chrono::Utc::now();
    let card = shared::records::Card::new(
        shared::records::CardKind::Crashed,
        "t\u{1b}[31m",
        "r1",
        "forged \u{1b}[2J\u{1b}]0;pwned\u{7}\u{9b}31m summary\nREGRESSION: fake line",
        "detail \u{1b}[1;1H line\nsecond line",
        vec!["\u{1b}[6n".into()],
        at,
    );
    env.write(
        &card.rel_path().to_string_lossy(),
        &shared::records::card_yaml(&card).unwrap(),
    );
    env.commit_all("a forged card");
    for args in [
        vec!["cards", "list"],
        vec!["cards", "list", "--json"],
        vec!["cards", "show", card.id.as_str()],
        vec!["cards", "export", "--format", "github"],
    ] {
        let out = env.builder(&args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("forged"), "{args:?}: the card was not printed: {text}");
        for bad in ['\u{1b}', '\u{9b}', '\u{7}'] {
            assert!(!text.contains(bad), "{args:?}: raw {bad:?} printed: {text:?}");
        }
        if args == ["cards", "list"] {
            assert!(text.contains("\\x1b[2J"), "{text}");
            assert!(!text.lines().any(|l| l.starts_with("REGRESSION")), "{text}");
        }
    }
}

#[test]
fn the_key_in_encoded_forms_never_reaches_a_record() {
    if !landlock_or_skip() {
        return;
    }
    use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
    use base64::Engine;
    let forms = [
        STANDARD.encode(TEST_KEY),
        URL_SAFE_NO_PAD.encode(TEST_KEY),
        STANDARD.encode(format!("{KEY_ENV}={TEST_KEY}\n")),
        hex::encode(TEST_KEY),
        hex::encode_upper(TEST_KEY),
        TEST_KEY.replace('-', "%2D"),
    ];
    let script = forms.iter().map(|f| format!("echo {f}")).collect::<Vec<_>>().join("; ");
    let env = setup(
        &[cmd(&format!("({script}) > reports/enc.txt"))],
        &format!("# Done\n\n{}", forms.join("\n")),
        "",
    );
    let (_, summary) = fire(&env, &[]);
    // The payload ran: the script's file was named, left out and removed.
    let detail = rejected_detail(&env, &summary);
    assert!(
        detail.contains("reports/enc.txt: holds a secret value: not committed; removed from the work tree"),
        "{detail}"
    );
    assert!(committed(&env, "reports/enc.txt").is_none());
    assert!(!env.root.join("reports/enc.txt").exists());
    let records = env.all_record_text();
    let report = env.read(summary["report"].as_str().unwrap());
    assert!(report.contains("[REDACTED]"), "{report}");
    for f in &forms {
        let core = &f[4..f.len() - 4];
        assert!(!records.contains(core), "{f} reached a record");
    }
}

/// The key in the names the model chooses (helper-102): a file named after it was
/// committed under that name, and an unknown tool named after it reached the trace,
/// the ledger and `runtime show`. The file is left out and removed; the tool's name
/// is redacted before the call enters the run.
#[test]
fn the_key_in_a_file_name_or_a_tool_name_never_reaches_git_or_the_state() {
    if !landlock_or_skip() {
        return;
    }
    let tool = format!("mystery_{TEST_KEY}");
    let (head, tail) = TEST_KEY.split_at(12);
    let escaped: String = TEST_KEY.bytes().map(|b| format!("%{b:02X}")).collect();
    let env = setup(
        &[
            cmd(&format!(
                "echo hi > reports/{TEST_KEY}.md; echo ran > reports/marker.txt"
            )),
            cmd(&format!(
                "mkdir -p reports/a/{head} && echo hi > reports/a/{head}/{tail}.md"
            )),
            cmd(&format!("echo hi > reports/{escaped}.md")),
            cmd(&format!(
                "echo hi > reports/{}%{:02x}{}.md",
                &TEST_KEY[..5],
                TEST_KEY.as_bytes()[5],
                &TEST_KEY[6..]
            )),
            cmd(&format!("mkdir -p reports/f/{head} && mkfifo reports/f/{head}/{tail}")),
            (tool.as_str(), json!({})),
        ],
        "# Done",
        "",
    );
    let (_, summary) = fire(&env, &[]);
    // The payload ran: the marker is committed, the file was named and removed.
    assert!(committed(&env, "reports/marker.txt").is_some(), "{summary}");
    let detail = rejected_detail(&env, &summary);
    assert!(
        detail.contains("its name holds a secret value: not committed; removed from the work tree"),
        "{detail}"
    );
    assert!(!env.root.join(format!("reports/{TEST_KEY}.md")).exists());
    assert_eq!(
        detail.matches("its name holds a secret value").count(),
        4,
        "whole, split across directories, escaped, partly escaped: {detail}"
    );
    // A rejected file of another kind (a FIFO) under a split name: the committed card
    // hides the name (helper-106: it named the key split across two directories).
    assert!(detail.contains("reports/[REDACTED]: not a regular file"), "{detail}");
    // Nothing committed holds it (the checkpoint in `.runtime/` keeps the model's
    // own messages: docs/security.md).
    let split = format!("{head}/{tail}");
    let found = env.git_in(
        &env.root,
        &["grep", "-F", &split, "HEAD", "--", "reports", "runs", "cards"],
    );
    assert!(
        !found.status.success(),
        "a committed record holds the split key: {}",
        String::from_utf8_lossy(&found.stdout)
    );
    let names = env.git_in(&env.root, &["log", "--all", "--name-only", "--format="]);
    assert!(names.status.success());
    assert!(
        !String::from_utf8_lossy(&names.stdout).contains(TEST_KEY),
        "a committed name holds the key"
    );
    let run = summary["run_id"].as_str().unwrap();
    let shown = env.runtime(&["show", run]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(
        text.contains("mystery__REDACTED_"),
        "the unknown tool was called: {text}"
    );
    for args in [&["show", run][..], &["show", run, "--json"], &["show", run, "--otlp"]] {
        let out = env.runtime(args);
        assert!(!String::from_utf8_lossy(&out.stdout).contains(TEST_KEY), "{args:?}");
    }
    // The trace's spans and calls and the ledger (the checkpoint keeps the model's
    // own messages as it sent them, to resume them: docs/security.md).
    let db = rusqlite::Connection::open(env.root.join(".runtime/state.db")).unwrap();
    let columns = [
        ("spans", "name"),
        ("spans", "attributes"),
        ("tool_calls", "name"),
        ("tool_calls", "arguments"),
        ("tool_ledger", "name"),
    ];
    for (table, column) in columns {
        let mut stmt = db.prepare(&format!("SELECT {column} FROM {table}")).unwrap();
        let values: Vec<String> = stmt.query_map([], |r| r.get(0)).unwrap().flatten().collect();
        assert!(!values.is_empty(), "{table} has rows");
        assert!(
            !values.iter().any(|v| v.contains(TEST_KEY)),
            "{table}.{column} holds the key: {values:?}"
        );
    }
}

/// Commits the replayed trace alone (`git add -A` would commit any record a killed
/// run left).
fn commit_trace(env: &TestEnv, message: &str) {
    for args in [&["add", "evals/hardening/trace.json"][..], &["commit", "-qm", message]] {
        assert!(env.git_in(&env.root, args).status.success());
    }
}

/// Files a model puts where the reports of a task go (`reports/<task>`, a day
/// directory), files named like a run's report, anything inside a task's day
/// directory (a directory at a report's name holding a forged `README.md`), and a
/// committed task directory replaced by a file (helper-102, helper-104: committed or
/// left, each sent every later report of its task to `runs/` in every clone, or was
/// committed as a report; the replaced directory's reports stayed deleted; the forged
/// reports stayed on no card). None is committed, the tools' files are removed, the
/// replaced directory's reports are put back, and the next fire of each task writes
/// its report where reports go. A real report of another run, which the tools only
/// touched, is left for its run to commit (helper-105: it was removed as a forgery).
#[test]
fn files_where_reports_go_are_never_committed_and_no_later_report_is_diverted() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(&[], "# First report", "");
    for task in ["weekly", "other"] {
        env.write(&format!("prompts/{task}.md"), PLAIN_PROMPT);
    }
    env.commit_all("two more tasks");
    let (_, first) = fire(&env, &[]);
    let one = first["report"].as_str().unwrap().to_string();
    let day = one.split('/').nth(2).unwrap().to_string();
    let out = crate::crash::runtime_crashing(&env, "between-records-and-commit", &["fire", "other", "--json"]);
    assert!(crate::crash::killed(&out), "the crash point fired: {:?}", out.status);
    let killed_report = std::fs::read_dir(env.root.join(format!("reports/other/{day}")))
        .unwrap()
        .flatten()
        .map(|e| format!("reports/other/{day}/{}", e.file_name().to_string_lossy()))
        .next()
        .expect("the killed run wrote its report");
    let forged = format!("reports/other/{day}/20261207T000000Z-deadbeef.md");
    // A run the state database knows, under another task's day: still a forgery.
    let known_id = std::path::Path::new(&one)
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let borrowed = format!("reports/other/{day}/{known_id}");
    let readme = format!("reports/other/{day}/20261207T000001Z-cafebabe.md/README.md");
    let body = format!(
        "rm -r reports/t && echo squat > reports/t\necho squat > reports/weekly\necho squat > reports/other/2099-01-01\nprintf '# accepted' > {forged}\nprintf '# accepted' > {borrowed}\nmkdir -p $(dirname {readme}) && printf '# accepted' > {readme}\ntouch {killed_report}\necho ran > reports/marker.txt\necho notes > reports/notes\n"
    );
    env.write(
        "evals/hardening/trace.json",
        &trace_json(&script("squat", &body), "# Second"),
    );
    // Only the trace: the killed run's records stay uncommitted.
    commit_trace(&env, "a hostile model");
    assert!(committed(&env, &killed_report).is_none());
    let (code, summary) = fire(&env, &[]);
    assert!(
        committed(&env, "reports/marker.txt").is_some(),
        "the attack ran: {summary}"
    );
    assert!(
        committed(&env, "reports/notes").is_some(),
        "a name no task has is any file's"
    );
    assert_eq!(code, 5, "{summary}");
    let detail = rejected_detail(&env, &summary);
    for (rel, why) in [
        ("reports/weekly", "a file where the reports of task `weekly` go"),
        (
            "reports/other/2099-01-01",
            "a file where the reports of task `other` go",
        ),
        (
            forged.as_str(),
            "named like a run's report, which only the runtime writes",
        ),
        (
            borrowed.as_str(),
            "named like a run's report, which only the runtime writes",
        ),
        (
            readme.as_str(),
            "inside a day directory of task `other`'s reports, where only the runtime writes",
        ),
    ] {
        assert!(
            detail.contains(&format!("{rel}: {why}: not committed; removed from the work tree")),
            "{rel}: {detail}"
        );
        assert!(committed(&env, rel).is_none() && !env.root.join(rel).exists(), "{rel}");
    }
    assert!(
        detail.contains("reports/t: committed as a directory, now a file: nothing at or below it is committed; put back as committed"),
        "{detail}"
    );
    assert!(!detail.contains(&killed_report), "{detail}");
    assert!(env.root.join(&killed_report).is_file(), "the killed run's report stays");
    assert_eq!(
        std::fs::read(env.root.join(&one)).unwrap(),
        committed(&env, &one).unwrap().1,
        "the first report is back as committed"
    );
    assert!(
        summary["report"].as_str().unwrap().starts_with("reports/t/"),
        "this fire's report went where reports go: {summary}"
    );
    // Later fires of the other tasks write their reports where their reports go, and
    // the killed run's report is committed by the next fire of its task.
    env.write("evals/hardening/trace.json", &trace_json(&[], "# Benign"));
    commit_trace(&env, "a benign model");
    assert!(committed(&env, &killed_report).is_none());
    for task in ["other", "weekly"] {
        let out = (env.command("runtime", &["fire", task, "--json"]))
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .output()
            .unwrap();
        let later: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(out.status.code(), Some(0), "{later}");
        assert!(
            later["report"]
                .as_str()
                .unwrap()
                .starts_with(&format!("reports/{task}/")),
            "{later}"
        );
    }
    assert!(
        committed(&env, &killed_report).is_some(),
        "the killed run's report is committed"
    );
    let status = env.git_in(&env.root, &["status", "--porcelain", "--", "reports"]);
    assert!(status.stdout.is_empty(), "{}", String::from_utf8_lossy(&status.stdout));
}

#[test]
fn prefetch_scripts_get_an_allow_listed_environment() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(&[cmd("echo ran > reports/marker.txt")], "# Done", "");
    env.write(
        "prompts/t.md",
        "---\ndescription: test task\nprefetch:\n  - name: env\n    run: tools/envdump.sh\n---\nDo the test task.\n",
    );
    env.write(
        "tools/envdump.sh",
        "#!/bin/sh\nenv > reports/prefetch-env.txt\necho context\n",
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(
        env.root.join("tools/envdump.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    env.commit_all("a prefetch script");
    let (_, summary) = fire(
        &env,
        &[
            ("MY_SERVICE_TOKEN", "tok-planted-SECOND-secret-42"),
            ("ARBITRARY_E2E_VARIABLE", "arbitrary-value-1234"),
        ],
    );
    let seen = String::from_utf8(std::fs::read(env.root.join("reports/prefetch-env.txt")).unwrap_or_default()).unwrap();
    assert!(seen.contains("PATH="), "the prefetch script did not run: {summary}");
    for leaked in [
        "tok-planted-SECOND-secret-42",
        "arbitrary-value-1234",
        TEST_KEY,
        KEY_ENV,
    ] {
        assert!(!seen.contains(leaked), "{leaked} reached the prefetch script: {seen}");
    }
}

#[test]
fn tools_get_an_allow_listed_environment() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(&[cmd("env > reports/env.txt")], "# Done", "");
    let (_, _) = fire(
        &env,
        &[
            ("MY_SERVICE_TOKEN", "tok-planted-SECOND-secret-42"),
            ("ARBITRARY_E2E_VARIABLE", "arbitrary-value-1234"),
            ("DATABASE_URL", "postgres://user:pw-planted@db/x"),
        ],
    );
    let (_, seen) = committed(&env, "reports/env.txt").expect("the payload did not run");
    let seen = String::from_utf8(seen).unwrap();
    assert!(seen.contains("PATH="), "{seen}");
    for leaked in [
        "tok-planted-SECOND-secret-42",
        "arbitrary-value-1234",
        "pw-planted",
        TEST_KEY,
        "MY_SERVICE_TOKEN",
        "ARBITRARY_E2E_VARIABLE",
        KEY_ENV,
    ] {
        assert!(!seen.contains(leaked), "{leaked} reached a tool: {seen}");
    }
}

#[test]
fn the_report_reaches_acceptance_scripts_through_a_runtime_only_directory() {
    if !landlock_or_skip() {
        return;
    }
    // The old hand-over file was `$HOME/report.md` (the scratch dir, which tools may
    // write): a link planted there sent the runtime's write into `.git`.
    let env = setup(
        &script(
            "plant",
            "ln -s \"$PWD/.git/hooks/post-commit\" \"$HOME/report.md\"; ln -s \"$PWD/.git/hooks/post-commit\" \"$TMPDIR/x\"; echo ran > reports/marker.txt\n",
        ),
        "# Done: the checked report",
        "",
    );
    env.write(
        "prompts/t.md",
        "---\ndescription: test task\nacceptance:\n  - name: checked\n    run: tools/check.sh\n---\nDo the test task.\n",
    );
    env.write("tools/check.sh", "#!/bin/sh\ngrep -q 'the checked report' \"$1\"\n");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(env.root.join("tools/check.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    env.commit_all("an acceptance script");
    let before = env.builder_snapshot();
    let git = env.git_snapshot();
    let (code, summary) = fire(&env, &[]);
    assert!(
        committed(&env, "reports/marker.txt").is_some(),
        "the payload did not run"
    );
    assert_eq!(env.git_snapshot(), git, ".git changed");
    assert!(!env.root.join(".git/hooks/post-commit").exists());
    check_common(&env, &before, &summary);
    let receipt = env.receipt(&summary);
    assert_eq!(receipt["status"], "accepted", "{receipt}");
    assert_eq!(code, 0, "{summary}");
    // The report's hand-over is removed; only the copy of the committed tools/ stays
    // (written once per tree, reused by later fires).
    let left: Vec<String> = std::fs::read_dir(env.root.join(".runtime/handoff"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    assert!(
        left.iter().all(|n| n.starts_with("tools-")),
        "the hand-over directory was not removed: {left:?}"
    );
}

#[test]
fn file_tools_refuse_fifos_and_devices_without_hanging() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(
        &[
            cmd("mkfifo reports/fifo && ln -s /dev/zero reports/zero && echo ran > reports/marker.txt"),
            ("read_file", json!({"path": "reports/fifo"})),
            ("read_file", json!({"path": "reports/zero", "offset": 1, "limit": 5})),
            ("edit_file", json!({"path": "reports/fifo", "old": "a", "new": "b"})),
            ("grep", json!({"pattern": "x", "path": "reports"})),
        ],
        "# Done",
        "",
    );
    let t = Instant::now();
    let (_, summary) = fire(&env, &[]);
    assert!(
        committed(&env, "reports/marker.txt").is_some(),
        "the payload did not run"
    );
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "the file tools were slow: {:?}",
        t.elapsed()
    );
    let calls = env.receipt(&summary)["tool_calls"].as_array().unwrap().clone();
    assert_eq!(calls.len(), 5, "{calls:?}");
    for c in &calls[1..4] {
        assert_ne!(c["outcome"], "ok", "a file tool read a FIFO or a device: {c}");
    }
    // The FIFO is inside the write ACL: the policy let both calls through, and the
    // tool itself refused.
    assert_eq!(calls[1]["decision"], "allow", "{}", calls[1]);
    assert_eq!(calls[3]["decision"], "allow", "{}", calls[3]);
    assert_eq!(calls[4]["outcome"], "ok", "{}", calls[4]);
}

/// A commit that tracks `.runtime/` (a pull of someone's commit that wrote a state
/// database with a decision on a paused call, or the two-key check's walk memo) makes
/// the runtime refuse to fire or resume: nothing in that state can be trusted.
#[test]
fn a_head_that_tracks_the_runtimes_private_state_is_refused() {
    let env = TestEnv::new();
    let (code, _, stderr) = env.fire("digest");
    assert_eq!(code, 0, "a first fire makes .runtime/: {stderr}");
    let repo = git2::Repository::open(&env.root).unwrap();
    let mut idx = repo.index().unwrap();
    idx.add_path(std::path::Path::new(".runtime/state.db")).unwrap();
    idx.write().unwrap();
    let tree = repo.find_tree(idx.write_tree().unwrap()).unwrap();
    let sig = git2::Signature::now("Mallory", "m@example.com").unwrap();
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "track state", &tree, &[&head])
        .unwrap();
    assert!(
        head.tree().unwrap().get_name(".runtime").is_none()
            && repo
                .head()
                .unwrap()
                .peel_to_tree()
                .unwrap()
                .get_name(".runtime")
                .is_some(),
        "the attack commit tracks .runtime/"
    );
    let before = env.head_id();
    let (code, summary, stderr) = env.fire("digest");
    assert_eq!(code, 2, "{stderr}");
    assert!(summary["message"].as_str().unwrap().contains(".runtime/"), "{summary}");
    assert!(stderr.contains("git rm -r --cached .runtime"), "{stderr}");
    assert_eq!(env.head_id(), before, "nothing committed");
    // `resume` refuses before it reads the state database (the run id is not even
    // looked up).
    let resume = env.runtime(&["resume", "no-such-run"]);
    let resume_err = String::from_utf8_lossy(&resume.stderr);
    assert_eq!(resume.status.code(), Some(2), "{resume_err}");
    assert!(resume_err.contains("HEAD tracks paths under .runtime/"), "{resume_err}");
}

/// A link a model leaves where its task's reports go is removed from the work tree
/// (named on the card), so no later fire's report is diverted (helper-84: every later
/// fire's report went to `runs/`, with a card and exit 5, forever). The oversize file
/// the tools made goes too (left, such files piled up over fires, helper-89); a
/// person's untracked file stays.
#[test]
fn a_link_planted_where_the_reports_go_is_removed_so_no_later_fire_is_diverted() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(
        &[
            cmd("ln -s ../prompts reports/t"),
            cmd("head -c 300000 /dev/zero > reports/big.bin"),
        ],
        "# Done",
        "  output_file_bytes: 100000\n",
    );
    std::os::unix::fs::symlink("../prompts", env.root.join("reports/persons-link")).unwrap();
    let (code, summary) = fire(&env, &[]);
    assert_eq!(code, 5, "{summary}");
    // The attack ran: both were made, and named.
    let detail = rejected_detail(&env, &summary);
    assert!(
        detail.contains("reports/t: not a regular file (symlink); removed from the work tree"),
        "{detail}"
    );
    assert!(detail.contains("reports/big.bin: 300000 bytes"), "{detail}");
    assert!(
        detail.contains("reports/big.bin: 300000 bytes") && !env.root.join("reports/big.bin").exists(),
        "the oversize file the tools made stayed: {detail}"
    );
    assert!(
        env.root.join("reports/persons-link").is_symlink(),
        "a person's file went"
    );
    let t = std::fs::symlink_metadata(env.root.join("reports/t"));
    assert!(
        !t.is_ok_and(|m| m.file_type().is_symlink()),
        "the link stayed: {detail}"
    );
    // A later fire, whose model does nothing, writes its report where reports go.
    env.write("evals/hardening/trace.json", &trace_json(&[], "# Benign"));
    env.commit_all("a benign model");
    let (code, summary) = fire(&env, &[]);
    assert!(
        summary["report"].as_str().unwrap().starts_with("reports/t/"),
        "{summary}"
    );
    assert_eq!(code, 0, "{summary}");
}

/// A later fire's model cannot rewrite or remove an earlier run's committed report:
/// the rewrite and the removal are named on the card (exit 5), both reports are put
/// back as committed, and the history shows the committed text (helper-91: the fire
/// ended clean, and `history diff` showed the forgery as run 1's report).
#[test]
fn a_later_fire_cannot_rewrite_or_remove_an_earlier_runs_report() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(&[], "# First report", "");
    let (_, first) = fire(&env, &[]);
    let (_, second) = fire(&env, &[]);
    let (one, two) = (first["report"].as_str().unwrap(), second["report"].as_str().unwrap());
    assert!(committed(&env, one).is_some() && committed(&env, two).is_some());
    let body = format!("printf 'FORGED-BY-FIRE-3' > {one}\nrm {two}\necho ran > reports/marker.txt\n");
    env.write(
        "evals/hardening/trace.json",
        &trace_json(&script("rewrite", &body), "# Third"),
    );
    env.commit_all("a hostile model");
    let (code, summary) = fire(&env, &[]);
    // The attack ran.
    assert!(committed(&env, "reports/marker.txt").is_some(), "{summary}");
    assert_eq!(code, 5, "{summary}");
    let detail = rejected_detail(&env, &summary);
    assert!(
        detail.contains(&format!(
            "{one}: already committed: the runtime only adds new files; put back as committed"
        )),
        "{detail}"
    );
    assert!(
        detail.contains(&format!(
            "{two}: committed, missing from the work tree; put back as committed"
        )),
        "{detail}"
    );
    for rel in [one, two] {
        assert_eq!(
            std::fs::read(env.root.join(rel)).unwrap(),
            committed(&env, rel).unwrap().1,
            "{rel} as committed"
        );
    }
    let status = env.git_in(&env.root, &["status", "--porcelain", "--", "reports"]);
    assert!(status.stdout.is_empty(), "{}", String::from_utf8_lossy(&status.stdout));
}

/// A committed report the tools replaced by a directory (helper-104: it stayed
/// deleted on every later fire, and a person's `git add -A` committed the removal) is
/// put back as committed, the tools' directory gone.
#[test]
fn a_committed_report_replaced_by_a_directory_is_put_back() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(&[], "# First report", "");
    let (_, first) = fire(&env, &[]);
    let one = first["report"].as_str().unwrap().to_string();
    let body =
        format!("rm {one} && mkdir -p {one}/x && echo forged > {one}/x/README.md\necho ran > reports/marker.txt\n");
    env.write(
        "evals/hardening/trace.json",
        &trace_json(&script("swap", &body), "# Second"),
    );
    env.commit_all("a hostile model");
    let (code, summary) = fire(&env, &[]);
    assert!(
        committed(&env, "reports/marker.txt").is_some(),
        "the attack ran: {summary}"
    );
    assert_eq!(code, 5, "{summary}");
    let detail = rejected_detail(&env, &summary);
    assert!(
        detail.contains(&format!(
            "{one}: committed as a file, now a directory: nothing at or below it is committed; put back as committed"
        )),
        "{detail}"
    );
    assert_eq!(
        std::fs::read(env.root.join(&one)).unwrap(),
        committed(&env, &one).unwrap().1,
        "the report is back as committed"
    );
    let status = env.git_in(&env.root, &["status", "--porcelain", "--", "reports"]);
    assert!(status.stdout.is_empty(), "{}", String::from_utf8_lossy(&status.stdout));
}

/// A fire killed while it puts back a committed report a tool rewrote (SIGKILL at
/// `mid-put-back`, between writing HEAD's bytes to a temporary file and its rename)
/// leaves a file at the report's name, never none (it unlinked, then created: a kill
/// between the two left the report missing, and a person's `git commit -a` would
/// have committed the removal). The next fire resumes the killed run, judges its
/// outputs again and puts the report back.
#[test]
fn a_fire_killed_while_putting_back_a_report_leaves_one_and_its_resume_puts_it_back() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(&[], "# First report", "");
    let (_, first) = fire(&env, &[]);
    let one = first["report"].as_str().unwrap().to_string();
    let body = format!("printf 'FORGED-BY-FIRE-2' > {one}\n");
    env.write(
        "evals/hardening/trace.json",
        &trace_json(&script("rewrite", &body), "# Second"),
    );
    env.commit_all("a hostile model");
    let killed = env
        .command("runtime", &["fire", "t", "--json"])
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("RUNTIME_FAILPOINTS", "mid-put-back")
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        killed.status.signal(),
        Some(9),
        "{}",
        String::from_utf8_lossy(&killed.stderr)
    );
    // The attack ran, and the kill came mid-put-back: the tools' bytes still stand.
    assert_eq!(std::fs::read(env.root.join(&one)).unwrap(), b"FORGED-BY-FIRE-2");
    let (code, summary) = fire(&env, &[]);
    assert_eq!(code, 5, "{summary}");
    assert!(
        rejected_detail(&env, &summary).contains(&format!(
            "{one}: already committed: the runtime only adds new files; put back as committed"
        )),
        "{summary}"
    );
    assert_eq!(
        std::fs::read(env.root.join(&one)).unwrap(),
        committed(&env, &one).unwrap().1
    );
    let status = env.git_in(&env.root, &["status", "--porcelain", "--", "reports"]);
    assert!(status.stdout.is_empty(), "{}", String::from_utf8_lossy(&status.stdout));
}

/// Task `t` in `env` with one acceptance check, the script `path` holding `body`,
/// committed.
fn with_check(env: &TestEnv, path: &str, body: &str) {
    env.write(
        "prompts/t.md",
        &format!("---\ndescription: t\nacceptance:\n  - name: the check\n    run: {path}\n---\nWrite it.\n"),
    );
    env.write(path, body);
    std::fs::set_permissions(env.root.join(path), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    env.commit_all("a task with an acceptance check");
}

/// An acceptance check runs in a tool worker that ran none of the model's calls: a
/// model that fills the tools' tmpfs (`sandbox.write_bytes`) cannot make the check's
/// own `TMPDIR` write fail and so make it pass (helper-91). A control run without the
/// fill fails the same way, so the check works; with the fill, it still fails.
#[test]
fn a_model_that_fills_the_tools_tmpfs_cannot_make_a_check_pass() {
    if !landlock_or_skip() {
        return;
    }
    let check = "#!/bin/sh\ngrep -i 'internal-only' \"$1\" > \"$TMPDIR/hits\"\nif [ -s \"$TMPDIR/hits\" ]; then echo \"report leaks: $(cat \"$TMPDIR/hits\")\"; exit 1; fi\n";
    let answer = "# Digest\nThe INTERNAL-ONLY roadmap says ...";
    for fill in [
        "",
        "echo ran > reports/marker.txt; head -c 8M /dev/zero > $HOME/fill 2>/dev/null; df -k $HOME | tail -1; ",
    ] {
        let env = setup(
            &script("fill", &format!("{fill}echo ran > reports/marker.txt\n")),
            answer,
            "",
        );
        let yaml = env.read("settings/runtime.yaml").replace(
            "  landlock: required\n",
            "  landlock: required\n  write_bytes: 4194304\n",
        );
        env.write("settings/runtime.yaml", &yaml);
        with_check(&env, "tools/no-leaks.sh", check);
        let (code, summary) = fire(&env, &[]);
        assert!(
            committed(&env, "reports/marker.txt").is_some(),
            "the payload did not run: {summary}"
        );
        if !fill.is_empty() {
            // The tmpfs was full when the model's call ended (`df` said so).
            let seen = crate::records_cases::ledger_results(&env).join("\n");
            assert!(seen.contains(" 0 100% "), "not filled: {seen}");
        }
        assert_eq!(summary["status"], "failed", "fill `{fill}`: {summary}");
        assert_ne!(code, 0, "{summary}");
        assert!(
            summary["message"].as_str().unwrap_or_default().contains("report leaks"),
            "{summary}"
        );
    }
}

/// A person's edit of a committed report made while a fire runs is theirs: the fire
/// names the rewrite but leaves the bytes as the person wrote them (helper-92: the
/// put-back undid the edit). Only what the tools changed is put back.
#[test]
fn a_persons_edit_during_a_fire_is_not_undone() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(&[], "# First report", "");
    let (_, first) = fire(&env, &[]);
    let one = first["report"].as_str().unwrap().to_string();
    env.write("evals/hardening/trace.json", &trace_json(&[cmd("echo hi")], "# Second"));
    env.commit_all("a model with one call");
    let child = crate::checkout_ops::fire_held_at(&env, "t", "after-tool-side-effect");
    // As `sed -i` and editors save: a new file renamed over the old.
    let tmp = env.root.join(format!("{one}.swp"));
    std::fs::write(&tmp, "a person's note\n").unwrap();
    std::fs::rename(&tmp, env.root.join(&one)).unwrap();
    let (_, summary) = crate::checkout_ops::resume_held(child);
    let detail = rejected_detail(&env, &summary);
    assert!(
        detail.contains(&format!(
            "{one}: already committed: the runtime only adds new files; left as it is"
        )),
        "{detail}"
    );
    assert_eq!(
        std::fs::read_to_string(env.root.join(&one)).unwrap(),
        "a person's note\n"
    );
}

/// A committed file replaced by a directory (and a committed directory by a file)
/// stops no commit: nothing at or below such a name is committed, the fire's own
/// records are, and so are a later fire's (helper-92: every later fire's commit
/// failed with a D/F conflict).
#[test]
fn a_committed_name_of_another_kind_stops_no_commit() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(
        &[cmd(
            "mkdir -p reports/old/d && echo r > reports/old/d/r.md && echo a > reports/a.txt",
        )],
        "# First",
        "",
    );
    let (_, first) = fire(&env, &[]);
    assert!(
        committed(&env, "reports/a.txt").is_some() && committed(&env, "reports/old/d/r.md").is_some(),
        "{first}"
    );
    // A person commits a link and a script under reports/ too.
    std::os::unix::fs::symlink("a.txt", env.root.join("reports/latest.md")).unwrap();
    env.write("reports/run.sh", "#!/bin/sh\necho run\n");
    std::fs::set_permissions(
        env.root.join("reports/run.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let swap = "rm reports/a.txt && mkdir reports/a.txt && echo MARK > reports/a.txt/inner && rm -r reports/old/d && echo f > reports/old/d && rm reports/latest.md && mkdir reports/latest.md && echo x > reports/latest.md/x.md && echo tampered >> reports/run.sh && echo ran > reports/marker.txt";
    env.write("evals/hardening/trace.json", &trace_json(&[cmd(swap)], "# Second"));
    env.commit_all("a model that swaps kinds");
    let (code, second) = fire(&env, &[]);
    assert!(
        committed(&env, "reports/marker.txt").is_some(),
        "the payload did not run: {second}"
    );
    assert_eq!(code, 5, "{second}");
    assert!(second["commit"].is_string(), "{second}");
    let detail = rejected_detail(&env, &second);
    for said in [
        "reports/a.txt: committed as a file, now a directory",
        "reports/a.txt/inner: under reports/a.txt, which HEAD holds as a file",
        "reports/old/d: committed as a directory, now a file",
        "reports/latest.md: committed as a file, now a directory",
        "reports/run.sh: already committed: the runtime only adds new files; put back as committed",
    ] {
        assert!(detail.contains(said), "{said}: {detail}");
    }
    // Put back as committed: its bytes and its mode (helper-93: it came back 0644).
    let status = env.git_in(&env.root, &["status", "--porcelain", "--", "reports/run.sh"]);
    assert!(status.stdout.is_empty(), "{}", String::from_utf8_lossy(&status.stdout));
    env.write("evals/hardening/trace.json", &trace_json(&[], "# Third"));
    env.commit_all("a benign model");
    let (_, third) = fire(&env, &[]);
    assert!(
        third["commit"].is_string(),
        "a later fire's records were not committed: {third}"
    );
}

/// A `.gitignore` (or `.gitattributes`) the model leaves is gone before the acceptance
/// checks run: a check that asks git for stray files sees them (helper-91: the model's
/// `.gitignore` of `*` hid them, and the check passed). The control, without it, fails
/// the same way; the card names the file removed.
#[test]
fn a_models_gitignore_cannot_hide_files_from_an_acceptance_check() {
    if !landlock_or_skip() {
        return;
    }
    let check = "#!/bin/sh\nstray=$(git status --porcelain --untracked-files=all -- reports | grep -v '^?? reports/t/')\n[ -z \"$stray\" ] || { echo \"stray files: $stray\"; exit 1; }\n";
    for hide in ["", "printf '*\\n' > reports/.gitignore; "] {
        let env = setup(
            &[cmd(&format!(
                "echo junk > reports/stray.bin; {hide}echo ran > reports/marker.txt"
            ))],
            "# Done",
            "",
        );
        with_check(&env, "tools/no-stray.sh", check);
        let (code, summary) = fire(&env, &[]);
        assert!(
            committed(&env, "reports/marker.txt").is_some(),
            "the payload did not run: {summary}"
        );
        assert_eq!(summary["status"], "failed", "`{hide}`: {summary}");
        assert_ne!(code, 0, "{summary}");
        assert!(
            summary["message"].as_str().unwrap_or_default().contains("stray files"),
            "{summary}"
        );
        if !hide.is_empty() {
            let detail = rejected_detail(&env, &summary);
            assert!(
                detail.contains("reports/.gitignore: git metadata: a file git reads; removed from the work tree before the acceptance checks"),
                "{detail}"
            );
        }
    }
}

/// A report a person removed with `git rm` is theirs to commit: the next fire, writing
/// beside it, neither names it nor puts it back (helper-94: a card on every fire).
#[test]
fn a_report_a_person_removed_with_git_rm_is_theirs_to_commit() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(&[], "# First", "");
    let (_, first) = fire(&env, &[]);
    fire(&env, &[]);
    let one = first["report"].as_str().unwrap().to_string();
    // The next fire's tools write beside it (its directory changes during the fire).
    let day = std::path::Path::new(&one).parent().unwrap().display().to_string();
    let calls = [cmd(&format!("echo x > {day}/notes.txt"))];
    env.write("evals/hardening/trace.json", &trace_json(&calls, "# Second"));
    env.commit_all("a model that writes beside it");
    env.git_ok(&env.root, &["rm", "-q", &one]);
    let (_, second) = fire(&env, &[]);
    // The payload ran (and, written where only the runtime writes, was left out).
    let detail = rejected_detail(&env, &second);
    assert!(
        detail.contains(&format!("{day}/notes.txt: inside a day directory")),
        "the payload did not run: {second}\n{detail}"
    );
    assert!(!detail.contains(&one), "a person's removal must not be named: {detail}");
    assert!(!env.root.join(&one).exists(), "put back over a person's removal");
}
