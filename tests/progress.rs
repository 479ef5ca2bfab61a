//! Progress you can see (issue 13, item 5): a live status line on a terminal's stderr,
//! redrawn in place and cleared before the end; no escape code on a stderr that is not
//! a terminal; `-v` lines; `NO_COLOR`; `--print-report`; and `--dry-run`, which shows
//! the first request with the key redacted and sends nothing.

use crate::util::*;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::process::Stdio;
use std::time::Duration;

const FAST: &str = "limits:\n  retry_base_ms: 10\n  request_timeout_s: 5\n  max_retries: 2\n";
const ERASE_LINE: &[u8] = b"\r\x1b[2K";

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

/// One allowed tool call, then a final answer; each reply after `delay`.
fn two_steps(delay: Duration) -> Vec<Reply> {
    let w = Wire::OpenAi;
    vec![
        turn(w, None, &[("c1", "run_command", r#"{"command":"ls"}"#)], (1, 1)).delayed(delay),
        turn(w, Some("All listed."), &[], (1, 1)).delayed(delay),
    ]
}

/// A pseudo-terminal: (controller, terminal) with a 120-column window.
fn pty() -> (OwnedFd, OwnedFd) {
    kernel::term::pty(120, 24).expect("a pseudo-terminal")
}

/// Runs `runtime <args>` with stderr on a pseudo-terminal; returns (exit code, every
/// byte the terminal received).
fn runtime_on_pty(env: &TestEnv, args: &[&str]) -> (i32, Vec<u8>) {
    let (controller, terminal) = pty();
    let mut child = {
        let mut cmd = env.command("runtime", args);
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(terminal));
        cmd.spawn().expect("run runtime")
        // `cmd`, and with it this process's copy of the terminal side, is dropped here:
        // the reader sees the end once the runtime and its worker have exited.
    };
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut file = std::fs::File::from(controller);
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        // Linux answers EIO once no process holds the terminal side: that is the end.
        while let Ok(n) = file.read(&mut buf) {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&buf[..n]);
        }
        let _ = tx.send(out);
    });
    let status = child.wait().expect("wait for runtime");
    let bytes = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("the pty's output ends when the runtime exits");
    (status.code().unwrap_or(-1), bytes)
}

/// The bytes with colour (SGR) sequences removed; erase-line and `\r` stay.
fn strip_sgr(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out = String::new();
    let mut rest = text.as_ref();
    while let Some(i) = rest.find("\x1b[") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let params = after.chars().take_while(|c| c.is_ascii_digit() || *c == ';').count();
        if after[params..].starts_with('m') {
            rest = &after[params + 1..];
        } else {
            out.push_str("\x1b[");
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// A colour sequence: ESC `[` digits/`;` then `m`.
fn has_sgr(bytes: &[u8]) -> bool {
    let text = String::from_utf8_lossy(bytes);
    strip_sgr(text.as_bytes()) != text
}

fn find_last(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).rposition(|w| w == needle)
}

#[test]
fn a_fire_at_a_terminal_shows_a_live_status_line_and_clears_it() {
    let server = ModelServer::start(two_steps(Duration::from_millis(700)));
    let env = repo_for(&server, "");
    let (code, raw) = runtime_on_pty(&env, &["fire", "t"]);
    let text = strip_sgr(&raw);
    assert_eq!(code, 0, "{text:?}");
    assert!(
        text.contains("\r\x1b[2Kstep 1/20"),
        "the step is drawn in place: {text:?}"
    );
    assert!(text.contains("step 2/20"), "{text:?}");
    assert!(text.contains("tool run_command allow"), "the tool decision: {text:?}");
    let elapsed: std::collections::BTreeSet<&str> = text
        .match_indices("model call 0.")
        .map(|(i, m)| &text[i..i + m.len() + 2])
        .collect();
    assert!(
        elapsed.len() >= 3,
        "the model call's elapsed time moves while it runs: {elapsed:?} in {text:?}"
    );
    assert!(has_sgr(&raw), "colour at a terminal without NO_COLOR: {text:?}");
    // Cleared at the end: an erase-line after the last status, and nothing drawn after.
    let last_clear = find_last(&raw, ERASE_LINE).expect("an erase-line");
    let last_status = find_last(&raw, b"step 2/20").expect("the last status");
    assert!(last_clear > last_status, "{text:?}");
    let after = String::from_utf8_lossy(&raw[last_clear + ERASE_LINE.len()..]).into_owned();
    assert!(after.trim().is_empty(), "nothing after the final clear: {after:?}");
}

#[test]
fn a_denied_call_shows_its_decision_at_the_terminal() {
    let w = Wire::OpenAi;
    let server = ModelServer::start(vec![
        turn(
            w,
            None,
            &[("c1", "run_command", r#"{"command":"git push origin main"}"#)],
            (1, 1),
        )
        .delayed(Duration::from_millis(300)),
        turn(w, Some("could not push"), &[], (1, 1)),
    ]);
    let env = repo_for(&server, "");
    let (code, raw) = runtime_on_pty(&env, &["fire", "t"]);
    let text = strip_sgr(&raw);
    assert_eq!(code, 5, "{text:?}");
    assert!(text.contains("tool run_command deny"), "{text:?}");
    // The failure line comes after the cleared status, on a line of its own.
    let last_clear = find_last(&raw, ERASE_LINE).expect("an erase-line");
    let after = String::from_utf8_lossy(&raw[last_clear + ERASE_LINE.len()..]).into_owned();
    assert!(after.starts_with("attention: t completed"), "{after:?}");
}

/// `runtime <args>` with stderr on a pipe: (exit code, stdout, stderr bytes).
fn run_piped(env: &TestEnv, args: &[&str], vars: &[(&str, &str)]) -> (i32, String, Vec<u8>) {
    let mut cmd = env.command("runtime", args);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run runtime");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        out.stderr,
    )
}

#[test]
fn no_escape_code_reaches_a_stderr_that_is_not_a_terminal() {
    let server = ModelServer::start(two_steps(Duration::from_millis(200)));
    let env = repo_for(&server, "");
    let (code, _, stderr) = run_piped(&env, &["fire", "t"], &[]);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&stderr));
    assert!(!stderr.contains(&0x1b), "{:?}", String::from_utf8_lossy(&stderr));
}

#[test]
fn verbose_prints_one_plain_line_per_event_without_escape_codes() {
    let w = Wire::OpenAi;
    let server = ModelServer::start(vec![
        Reply::status(503, "{\"error\":\"busy\"}"),
        turn(w, None, &[("c1", "run_command", r#"{"command":"ls"}"#)], (1, 1)),
        turn(w, Some("All listed."), &[], (1, 1)),
    ]);
    let env = repo_for(&server, FAST);
    let (code, _, stderr) = run_piped(&env, &["-v", "fire", "t"], &[]);
    let text = String::from_utf8_lossy(&stderr).into_owned();
    assert_eq!(code, 0, "{text}");
    assert!(!stderr.contains(&0x1b), "no escape code with -v either: {text:?}");
    for line in [
        "progress: step 1/20\n",
        "progress: step 1: model call to openai (test-model)\n",
        "progress: retry 1/2 in ",
        "(HTTP 503)\n",
        "progress: tool run_command allow\n",
        "progress: tool run_command ok in ",
        "progress: step 2/20\n",
        "progress: step 2: model call ",
    ] {
        assert!(text.contains(line), "missing `{line}` in:\n{text}");
    }
}

#[test]
fn a_fallback_switch_is_an_event() {
    let primary = ModelServer::start(vec![Reply::status(500, "{\"error\":\"down\"}")]);
    let fallback = ModelServer::start(vec![turn(Wire::Anthropic, Some("From the fallback."), &[], (1, 1))]);
    let fb = fallback
        .provider_yaml(Wire::Anthropic)
        .replacen("provider:", "fallback:", 1);
    let extra = format!("{fb}limits:\n  retry_base_ms: 10\n  request_timeout_s: 5\n  max_retries: 0\n");
    let env = repo_for(&primary, &extra);
    let (code, _, stderr) = run_piped(&env, &["-v", "fire", "t"], &[]);
    let text = String::from_utf8_lossy(&stderr).into_owned();
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("progress: fallback: anthropic (primary failed: server (HTTP 500, 0 retries))\n"),
        "{text}"
    );
    assert!(!stderr.contains(&0x1b), "{text:?}");
}

#[test]
fn no_color_with_progress_always_redraws_without_colour() {
    let server = ModelServer::start(two_steps(Duration::from_millis(200)));
    let env = repo_for(&server, "");
    let (code, _, stderr) = run_piped(&env, &["fire", "t", "--progress", "always"], &[("NO_COLOR", "1")]);
    let text = String::from_utf8_lossy(&stderr).into_owned();
    assert_eq!(code, 0, "{text:?}");
    assert!(text.contains("\r\x1b[2Kstep 1/20"), "always draws the line: {text:?}");
    assert!(text.contains("tool run_command allow"), "{text:?}");
    assert!(!has_sgr(&stderr), "NO_COLOR: no colour code: {text:?}");
    assert!(text.ends_with("\r\x1b[2K"), "cleared at the end: {text:?}");

    // The same without NO_COLOR has colour, so the assertion above can fail.
    let server = ModelServer::start(two_steps(Duration::ZERO));
    let env = repo_for(&server, "");
    let (code, _, stderr) = run_piped(&env, &["fire", "t", "--progress", "always"], &[]);
    assert_eq!(code, 0);
    assert!(has_sgr(&stderr), "{:?}", String::from_utf8_lossy(&stderr));

    // And `never` shows nothing, even with -v.
    let server = ModelServer::start(two_steps(Duration::ZERO));
    let env = repo_for(&server, "");
    let (code, _, stderr) = run_piped(&env, &["-v", "fire", "t", "--progress", "never"], &[]);
    assert_eq!(code, 0);
    let text = String::from_utf8_lossy(&stderr).into_owned();
    assert!(!text.contains("progress:"), "{text}");
}

#[test]
fn print_report_prints_the_report_the_fire_wrote() {
    let server = ModelServer::start(two_steps(Duration::ZERO));
    let env = repo_for(&server, "");
    let (code, stdout, stderr) = run_piped(&env, &["fire", "t", "--print-report"], &[]);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&stderr));
    let reports = report_files(&env);
    assert_eq!(reports.len(), 1, "{reports:?}");
    assert_eq!(stdout, env.read(&reports[0]), "stdout is the written report");
    assert!(stdout.contains("All listed."), "{stdout}");
    assert!(stdout.contains("| t |"), "{stdout}");
}

/// Repo-relative paths of every report file.
fn report_files(env: &TestEnv) -> Vec<String> {
    fn walk(dir: &std::path::Path, base: &std::path::Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, base, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p.strip_prefix(base).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    let mut out = Vec::new();
    walk(&env.root.join("reports"), &env.root, &mut out);
    out
}

/// Every file under the runtime's record directories.
fn record_files(env: &TestEnv) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for d in ["reports", "cards", "runs"] {
        fn walk(dir: &std::path::Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else {
                    out.push(p.display().to_string());
                }
            }
        }
        walk(&env.root.join(d), &mut out);
    }
    out.sort();
    out
}

#[test]
fn dry_run_shows_the_first_request_with_the_key_redacted_and_sends_nothing() {
    let server = ModelServer::start(vec![]);
    let env = repo_for(&server, "");
    env.write("tools/ctx.sh", "#!/bin/sh\necho PREFETCH-MARKER-42\n");
    std::fs::set_permissions(
        env.root.join("tools/ctx.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    env.write(
        "prompts/t.md",
        "---\nprefetch:\n  - name: context\n    run: tools/ctx.sh\n---\nDo the test task.\n",
    );
    env.commit_all("prefetch");
    let head = env.head_id();
    let records = record_files(&env);
    let (code, stdout, stderr) = run_piped(&env, &["fire", "t", "--dry-run"], &[]);
    let err = String::from_utf8_lossy(&stderr);
    assert_eq!(code, 0, "{err}");
    assert!(
        stdout.starts_with("dry run of task `t`: no model call, no records, no commit\n"),
        "{stdout}"
    );
    let url = format!("POST http://127.0.0.1:{}/v1/chat/completions\n", server.port);
    for part in [
        url.as_str(),
        "authorization: Bearer [REDACTED]\n",
        "\"model\": \"test-model\"",
        "\"name\": \"run_command\"",
        "Do the test task.",
        "PREFETCH-MARKER-42",
        "allow:   Read(**), Bash(git log*)",
        "deny:    Bash(rm -rf*), Bash(git push*)",
        "tools:     ",
        "provider:  openai test-model at http://127.0.0.1:",
        "(key from $E2E_PROVIDER_KEY)",
    ] {
        assert!(stdout.contains(part), "missing `{part}` in:\n{stdout}");
    }
    assert!(!stdout.contains(TEST_KEY) && !err.contains(TEST_KEY), "the key leaked");
    assert!(server.requests().is_empty(), "a dry run sends no request");
    assert_eq!(env.head_id(), head, "a dry run makes no commit");
    assert_eq!(record_files(&env), records, "a dry run writes no record");
    assert!(!env
        .root
        .join(".runtime/scratch")
        .read_dir()
        .is_ok_and(|mut d| d.next().is_some()));

    // --json: the same, as data, and the key redacted there too.
    let (code, stdout, _) = run_piped(&env, &["fire", "t", "--dry-run", "--json"], &[]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    assert_eq!(
        v["request"]["headers"][0],
        serde_json::json!(["authorization", "Bearer [REDACTED]"])
    );
    assert_eq!(v["request"]["body"]["model"], "test-model");
    assert!(v["prefetch"].as_str().unwrap().contains("PREFETCH-MARKER-42"));
    assert!(!stdout.contains(TEST_KEY));
    assert!(server.requests().is_empty());
}

#[test]
fn dry_run_builds_the_anthropic_request_through_the_provider() {
    let server = ModelServer::start(vec![]);
    let env = TestEnv::new();
    env.write(
        "settings/runtime.yaml",
        &settings_yaml(&server.provider_yaml(Wire::Anthropic), ""),
    );
    env.write("prompts/t.md", PLAIN_PROMPT);
    env.commit_all("anthropic");
    let (code, stdout, stderr) = run_piped(&env, &["fire", "t", "--dry-run"], &[]);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&stderr));
    let url = format!("POST http://127.0.0.1:{}/v1/messages\n", server.port);
    assert!(stdout.contains(&url), "{stdout}");
    assert!(stdout.contains("x-api-key: [REDACTED]\n"), "{stdout}");
    assert!(stdout.contains("anthropic-version: 2023-06-01\n"), "{stdout}");
    assert!(stdout.contains("\"input_schema\""), "the Anthropic wire body: {stdout}");
    assert!(!stdout.contains(TEST_KEY));
    assert!(server.requests().is_empty());
}

#[test]
fn dry_run_with_an_unset_key_variable_exits_2_and_writes_nothing() {
    let server = ModelServer::start(vec![]);
    let env = repo_for(&server, "");
    let head = env.head_id();
    let records = record_files(&env);
    let out = env
        .command("runtime", &["fire", "t", "--dry-run"])
        .env_remove(KEY_ENV)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "error: the provider's key variable `{KEY_ENV}` is unset or empty"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("hint: set `{KEY_ENV}` in the environment the fire runs in")),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
    assert!(server.requests().is_empty());
    assert_eq!(env.head_id(), head);
    assert_eq!(record_files(&env), records);
}

#[test]
fn dry_run_notes_uncommitted_builder_changes_and_shows_them() {
    let server = ModelServer::start(vec![]);
    let env = repo_for(&server, "");
    env.write("prompts/t.md", "---\n---\nThe edited, uncommitted prompt.\n");
    let (code, stdout, stderr) = run_piped(&env, &["fire", "t", "--dry-run"], &[]);
    assert_eq!(code, 0, "{}", String::from_utf8_lossy(&stderr));
    assert!(
        stdout.contains("note: a fire would refuse: 1 builder-owned path(s) have uncommitted changes: prompts/t.md\n"),
        "{stdout}"
    );
    assert!(stdout.contains("The edited, uncommitted prompt."), "{stdout}");
    assert!(server.requests().is_empty());
    // The fire itself still refuses.
    let (code, _, _) = run_piped(&env, &["fire", "t"], &[]);
    assert_eq!(code, 1);
}

#[test]
fn dry_run_with_a_failing_prefetch_says_why_and_writes_nothing() {
    let server = ModelServer::start(vec![]);
    let env = repo_for(&server, "");
    env.write("tools/ctx.sh", "#!/bin/sh\necho cannot reach the tracker >&2\nexit 3\n");
    std::fs::set_permissions(
        env.root.join("tools/ctx.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    env.write(
        "prompts/t.md",
        "---\nprefetch:\n  - name: context\n    run: tools/ctx.sh\n---\nDo it.\n",
    );
    env.commit_all("failing prefetch");
    let head = env.head_id();
    let records = record_files(&env);
    let (code, stdout, stderr) = run_piped(&env, &["fire", "t", "--dry-run"], &[]);
    let err = String::from_utf8_lossy(&stderr);
    assert_eq!(code, 1, "{err}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(
        err.starts_with("error: prefetch `context` failed\ntools/ctx.sh: "),
        "{err}"
    );
    assert!(err.contains("cannot reach the tracker"), "the script's output: {err}");
    assert!(server.requests().is_empty());
    assert_eq!(env.head_id(), head);
    assert_eq!(record_files(&env), records);
}

#[test]
fn fire_help_documents_the_new_flags() {
    let env = TestEnv::new();
    let out = env.runtime(&["fire", "--help"]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for part in [
        "--dry-run",
        "call no model",
        "with the API key redacted; writes no record and makes no commit",
        "--print-report",
        "Print the report the fire wrote to stdout at the end",
        "--progress <WHEN>",
        "Only when stderr is a terminal",
        "never",
        "always",
    ] {
        assert!(help.contains(part), "missing `{part}` in:\n{help}");
    }
}

/// Text a model chose reaches no terminal raw (helper-91): a tool name with escape
/// sequences in the `-v` lines and in the live line, and an acceptance check's output
/// quoting the model's report in the failure line `runtime fire` prints (plain and
/// `--json`, C1 controls and bidi overrides included).
#[test]
fn a_models_escape_sequences_reach_no_terminal_raw() {
    const TITLE: &str = "\x1b]0;PWNED\x07\x1b[2J";
    let w = Wire::OpenAi;
    let name = format!("{TITLE}tool");
    let replies = || {
        vec![
            turn(w, None, &[("c1", &name, r#"{"x":1}"#)], (1, 1)),
            turn(w, Some(&format!("{TITLE}\u{9b}2J\u{202e}first line\n")), &[], (1, 1)),
        ]
    };
    let server = ModelServer::start([replies(), replies(), replies()].concat());
    let env = repo_for(&server, "");
    env.write(
        "prompts/t.md",
        "---\ndescription: t\nacceptance:\n  - name: verified\n    run: tools/check.sh\n---\nDo it.\n",
    );
    env.write(
        "tools/check.sh",
        "#!/bin/sh\necho \"report lacks VERIFIED; first line: $(head -n1 \"$1\")\"\nexit 1\n",
    );
    std::fs::set_permissions(
        env.root.join("tools/check.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    env.commit_all("an acceptance check that quotes the report");
    let raw =
        |bytes: &[u8]| bytes.windows(4).any(|w| w == b"\x1b]0;") || bytes.windows(2).any(|w| w == "\u{9b}".as_bytes());
    for args in [
        &["-v", "fire", "t"][..],
        &["fire", "t", "--progress", "always"],
        &["fire", "t", "--json"],
    ] {
        let (code, stdout, stderr) = run_piped(&env, args, &[]);
        let text = String::from_utf8_lossy(&stderr).into_owned() + &stdout;
        // The attack ran: the tool was asked for by that name and the check failed
        // quoting the report.
        assert_eq!(code, 1, "{args:?}: {text}");
        assert!(
            text.contains("\\x1b]0;PWNED") || text.contains("\\u001b]0;PWNED"),
            "{args:?}: {text}"
        );
        assert!(
            !raw(&stderr) && !raw(stdout.as_bytes()),
            "{args:?}: raw escapes: {text:?}"
        );
        assert!(!text.contains('\u{202e}'), "{args:?}: a bidi override: {text:?}");
    }
}
