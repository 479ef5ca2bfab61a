//! The failure line says why (issue 18, item 7): a provider failure names its kind,
//! HTTP status or timeout and the retries, on cron's stderr line and in the card's
//! summary, never a Rust Debug name; `runtime show` prints the failed span's message
//! and the run's cards; and each hint fits the situation it is printed in. Providers
//! are played by the 127.0.0.1 model server.

use crate::util::*;
use std::process::Output;
use std::time::Duration;

fn repo(server: &ModelServer, extra: &str) -> TestEnv {
    let env = TestEnv::new();
    env.write(
        "settings/runtime.yaml",
        &settings_yaml(&server.provider_yaml(Wire::OpenAi), extra),
    );
    env.write("prompts/t.md", PLAIN_PROMPT);
    env.commit_all("test settings");
    env
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The card `id`, read from its day directory.
fn card_file(env: &TestEnv, id: &str) -> serde_yaml::Value {
    for day in std::fs::read_dir(env.root.join("cards")).unwrap().flatten() {
        if let Ok(text) = std::fs::read_to_string(day.path().join(format!("{id}.yaml"))) {
            return serde_yaml::from_str(&text).unwrap();
        }
    }
    panic!("no card {id}");
}

/// The run id of the newest receipt.
fn last_run(env: &TestEnv) -> (String, Vec<String>) {
    let out = env.runtime(&["runs", "--json"]);
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let run = rows[0]["run_id"].as_str().unwrap().to_string();
    let receipt: serde_json::Value =
        serde_json::from_str(&env.read(rows[0]["receipt_path"].as_str().unwrap())).unwrap();
    let cards = receipt["cards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap().to_string())
        .collect();
    (run, cards)
}

#[test]
fn a_rate_limited_provider_names_status_and_retries_on_the_line_the_card_and_in_show() {
    let server = ModelServer::start(vec![
        Reply::status(429, "{\"error\":\"slow down\"}"),
        Reply::status(429, "{\"error\":\"slow down\"}"),
    ]);
    let env = repo(&server, "limits:\n  retry_base_ms: 10\n  max_retries: 1\n");
    let out = env.runtime(&["fire", "t"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let want = "model call failed: rate_limited (HTTP 429, 1 retry)";
    assert!(
        stderr.contains(&format!("error: t failed (provider_error), 1 steps: {want}\n")),
        "{stderr}"
    );
    let (run, cards) = last_run(&env);
    let card = card_file(&env, &cards[0]);
    assert_eq!(card["summary"].as_str(), Some(want), "{card:?}");
    let show = env.runtime(&["show", &run]);
    let (shown, _) = text(&show);
    assert!(
        shown.contains("error: rate_limited (HTTP 429, 1 retry): {\"error\":\"slow down\"}"),
        "{shown}"
    );
    assert!(
        shown.contains(&format!("cards: {} (provider_error)", cards[0])),
        "{shown}"
    );
    for t in [&stderr, &shown, &env.all_record_text()] {
        assert!(!t.contains("RateLimited"), "a Debug name: {t}");
    }
}

#[test]
fn a_timeout_names_its_seconds() {
    let server = ModelServer::start(vec![
        turn(Wire::OpenAi, Some("late"), &[], (1, 1)).delayed(Duration::from_secs(3))
    ]);
    let env = repo(&server, "limits:\n  request_timeout_s: 1\n  max_retries: 0\n");
    let out = env.runtime(&["fire", "t"]);
    let (_, stderr) = text(&out);
    assert!(
        stderr.contains("model call failed: timeout (no answer within 1 s, 0 retries)\n"),
        "{stderr}"
    );
    assert!(!stderr.contains("Timeout"), "{stderr}");
}

#[test]
fn each_hint_fits_its_situation() {
    let server = ModelServer::start(vec![]);
    let env = repo(&server, "");
    // An unset key: set it where the fire runs, not `builder check`.
    let out = env
        .command("runtime", &["fire", "t"])
        .env_remove(KEY_ENV)
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("hint: set `{KEY_ENV}` in the environment the fire runs in")),
        "{stderr}"
    );
    assert!(!stderr.contains("builder check"), "{stderr}");
    // Uncommitted builder changes: commit them through review, or stash them.
    env.write("prompts/t.md", &format!("{PLAIN_PROMPT}More.\n"));
    let out = env.runtime(&["fire", "t"]);
    let (_, stderr) = text(&out);
    assert!(stderr.contains("hint: ") && stderr.contains("git stash"), "{stderr}");
    // Nothing uncommitted, but the tree is unapproved: no stash to suggest.
    let settings = env.read("settings/runtime.yaml");
    env.write("settings/runtime.yaml", &format!("{settings}require_reviewed: true\n"));
    env.commit_all("require review");
    let out = env.runtime(&["fire", "t"]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("hint: have the change approved"), "{stderr}");
    assert!(!stderr.contains("git stash"), "{stderr}");
}

/// A key whose variable is named like no secret (`LLM_CRED`, not `*KEY*`) echoed back
/// in a provider's error body (a proxy that quotes the request's header) is redacted
/// from the `-v` log line that quotes the body, as it is from the records: log lines
/// are redacted of the variables the settings name, whatever their names.
/// An error body is kept by its first 300 characters, and only once it is redacted:
/// cut first, a key the body echoes across the cut would keep all but its last
/// characters, which the redactor no longer knows (helper-110: part of the key
/// reached the committed card).
#[test]
fn a_key_an_error_body_echoes_across_the_cut_is_redacted_whole() {
    const CRED: &str = "horse-battery-staple-9137";
    let lead = "x".repeat(300 - "refused: ".len() - CRED.len() + 3);
    let echoed = format!("refused: {lead}{CRED} for this request");
    let server = ModelServer::start(vec![Reply::status(401, &echoed)]);
    let provider = server.provider_yaml(Wire::OpenAi).replace(KEY_ENV, "LLM_CRED");
    let env = TestEnv::new();
    env.write("settings/runtime.yaml", &settings_yaml(&provider, ""));
    env.write("prompts/t.md", PLAIN_PROMPT);
    env.commit_all("test settings");
    let out = env
        .command("runtime", &["fire", "t"])
        .env("LLM_CRED", CRED)
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    assert_eq!(server.requests().len(), 1, "the request went out: {stderr}");
    let records = env.all_record_text();
    // The error reached the card (the payload ran), and no part of the key did.
    assert!(records.contains("refused: xxxx"), "{records}");
    let part = &CRED[..CRED.len() - 3];
    assert!(!records.contains(part), "{records}");
    assert!(!stderr.contains(part), "{stderr}");
}

#[test]
fn a_key_the_provider_echoes_is_redacted_from_log_lines_whatever_its_variable_is_named() {
    const CRED: &str = "horse-battery-staple-9137";
    let echoed = format!("upstream refused: header was {CRED}");
    let server = ModelServer::start(vec![Reply::status(503, &echoed), Reply::status(503, &echoed)]);
    let provider = server.provider_yaml(Wire::OpenAi).replace(KEY_ENV, "LLM_CRED");
    let env = TestEnv::new();
    env.write(
        "settings/runtime.yaml",
        &settings_yaml(&provider, "limits:\n  retry_base_ms: 10\n  max_retries: 1\n"),
    );
    env.write("prompts/t.md", PLAIN_PROMPT);
    env.commit_all("test settings");
    let out = env
        .command("runtime", &["-v", "fire", "t"])
        .env("LLM_CRED", CRED)
        .output()
        .unwrap();
    let (_, stderr) = text(&out);
    // The attack ran: the server got the key, and the log line quoting its body is there.
    let sent = server.requests();
    assert!(
        sent.iter()
            .any(|r| r.headers.iter().any(|(k, v)| k == "authorization" && v.contains(CRED))),
        "the key was sent"
    );
    assert!(
        stderr.contains("retrying model call") && stderr.contains("upstream refused: header was [REDACTED]"),
        "{stderr}"
    );
    assert!(!stderr.contains(CRED), "{stderr}");
    assert!(!env.all_record_text().contains(CRED));
    assert_eq!(out.status.code(), Some(1), "{stderr}");
}
