//! The metadata manifest (issue 10, item 6), through real fires: a tool's `chmod` of
//! a builder file is stopped by the sandbox (the payload proves it ran first); the
//! same changes made from outside the sandbox, as another local process would
//! between fires (a chmod, a chown, a hook made non-executable), refuse the next fire
//! with an `unreviewed_changes` card naming each change, and `builder audit` reports
//! them (exit 1); the engineer's intended changes (a commit, `builder install-hooks`,
//! `builder audit --accept-metadata`) are accepted and the next fire runs.

use crate::isolation::{am_root, env_with_prompt, fire_payload, kernel_ready, trace, As, Listeners, Payload, SETTINGS};
use crate::util::*;
use serde_json::{json, Value};
use std::os::unix::fs::{MetadataExt, PermissionsExt};

const PAYLOAD: &str = "echo ran > reports/m/ran
chmod 0666 prompts/t.md 2> reports/m/chmod; echo $? >> reports/m/chmod
chmod -x .git/hooks/pre-push 2> reports/m/hook; echo $? >> reports/m/hook
";

fn mode_of(env: &TestEnv, rel: &str) -> u32 {
    std::fs::symlink_metadata(env.root.join(rel)).unwrap().mode() & 0o7777
}

fn chmod(env: &TestEnv, rel: &str, mode: u32) {
    std::fs::set_permissions(env.root.join(rel), std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Fires and expects a refusal for metadata: exit 1 and one `unreviewed_changes` card
/// whose detail names every one of `said`.
fn expect_refusal(env: &TestEnv, said: &[String]) -> Value {
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 1, "{summary} {stderr}");
    let cards = env.cards(&summary);
    assert_eq!(cards.len(), 1, "{summary}");
    assert_eq!(cards[0]["kind"].as_str(), Some("unreviewed_changes"), "{cards:?}");
    let detail = cards[0]["detail"].as_str().unwrap();
    for s in said {
        assert!(detail.contains(s.as_str()), "card detail lacks `{s}`: {detail}");
    }
    let audit = env.builder(&["audit"]);
    let out = String::from_utf8_lossy(&audit.stdout);
    assert_eq!(audit.status.code(), Some(1), "audit: {out}");
    for s in said {
        assert!(out.contains(s.as_str()), "audit lacks `{s}`: {out}");
    }
    summary
}

/// Fires and expects the fire to run (not refused): exit 0 or 5, a receipt with steps.
fn expect_fire(env: &TestEnv, why: &str) {
    let (code, summary, stderr) = env.fire("t");
    assert!(code == 0 || code == 5, "{why}: {summary} {stderr}");
    assert_ne!(
        env.receipt(&summary)["stop_reason"].as_str(),
        Some("not_started"),
        "{why}: {summary}"
    );
    let audit = env.builder(&["audit"]);
    assert_eq!(
        audit.status.code(),
        Some(0),
        "{why}: audit: {}",
        String::from_utf8_lossy(&audit.stdout)
    );
}

#[test]
fn metadata_changed_outside_git_refuses_the_next_fire_until_put_back_or_accepted() {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    let l = Listeners::new();
    // The tool tries, and the sandbox stops it (the repository is bound read-only);
    // the fire records the first manifest of this clone and refuses nothing.
    let (m, summary) = fire_payload(
        As::Me,
        &env,
        &l,
        &Payload {
            case: "metadata",
            ext: "sh",
            interp: "/bin/sh",
            script: PAYLOAD,
            after: &[],
            settings: None,
        },
    );
    assert!(m["chmod"].contains("Read-only file system"), "{m:?}");
    assert!(m["hook"].contains("Read-only file system"), "{m:?}");
    assert_ne!(env.receipt(&summary)["stop_reason"].as_str(), Some("not_started"));

    // Another local process changes the mode between fires.
    let was = mode_of(&env, "prompts/t.md");
    chmod(&env, "prompts/t.md", 0o666);
    expect_refusal(&env, &[format!("prompts/t.md: mode {was:04o} -> 0666")]);
    // Still refused on the next tick: the refused state was not recorded.
    let (code, _, _) = env.fire("t");
    assert_eq!(code, 1);
    chmod(&env, "prompts/t.md", was);
    expect_fire(&env, "the mode put back");

    // The pre-push hook made non-executable (it would silently stop auditing pushes).
    let hook_mode = mode_of(&env, ".git/hooks/pre-push");
    chmod(&env, ".git/hooks/pre-push", hook_mode & !0o111);
    expect_refusal(&env, &["hook pre-push: not executable".to_string()]);
    // The engineer reinstalls it on purpose: accepted.
    let out = env.builder(&["install-hooks"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(mode_of(&env, ".git/hooks/pre-push"), hook_mode);
    // A hook replaced by someone else is named too. install-hooks leaves a hook it
    // did not write alone, and does not accept it; removed and reinstalled, it is.
    let hook = env.root.join(".git/hooks/pre-push");
    std::fs::write(&hook, "#!/bin/sh\nexit 0\n").unwrap();
    expect_refusal(&env, &["hook pre-push: content changed".to_string()]);
    assert!(env.builder(&["install-hooks"]).status.success());
    let (code, summary, _) = env.fire("t");
    assert_eq!(code, 1, "still refused (counted, not recorded again): {summary}");
    let audit = env.builder(&["audit"]);
    assert!(String::from_utf8_lossy(&audit.stdout).contains("hook pre-push: content changed"));
    std::fs::remove_file(&hook).unwrap();
    assert!(env.builder(&["install-hooks"]).status.success());
    expect_fire(&env, "the hook reinstalled by builder install-hooks");

    if am_root() {
        let path = env.root.join("scope/SCOPE.md");
        let uid = std::fs::metadata(&path).unwrap().uid();
        std::os::unix::fs::lchown(&path, Some(1000), None).unwrap();
        expect_refusal(&env, &[format!("scope/SCOPE.md: owner {uid} -> 1000")]);
        // The engineer meant it: accepted by the builder command, the fire runs.
        let out = env.builder(&["audit", "--accept-metadata"]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&format!("accepted: scope/SCOPE.md: owner {uid} -> 1000")),
            "{text}"
        );
        assert_eq!(out.status.code(), Some(0), "{text}");
        expect_fire(&env, "an owner change accepted with --accept-metadata");
    }

    // An intended change through a commit: the prompt edited and its mode changed
    // with it; the new mode is recorded, not flagged.
    env.write("prompts/t.md", &format!("{PLAIN_PROMPT}Be brief.\n"));
    chmod(&env, "prompts/t.md", 0o600);
    env.commit_all("shorter prompt, private file");
    expect_fire(&env, "a mode that came with a committed change");
    chmod(&env, "prompts/t.md", 0o644);
    expect_refusal(&env, &["prompts/t.md: mode 0600 -> 0644".to_string()]);
}

#[test]
fn a_chmod_by_a_tool_without_the_sandbox_is_carded_in_its_own_fire_and_refuses_the_next() {
    // `landlock: off`: no kernel layer at all, so the payload's chmod succeeds; the
    // end of the fire compares the metadata again and says so.
    let env = env_with_prompt();
    let script = "mkdir -p reports/m\necho ran > reports/m/ran\nchmod 0666 prompts/t.md; echo $? > reports/m/chmod\n";
    let calls = [
        ("write_file", json!({"path": "reports/p.sh", "content": script})),
        ("run_command", json!({"command": "/bin/sh reports/p.sh"})),
    ];
    env.write(
        "settings/runtime.yaml",
        &SETTINGS.replace("landlock: required", "landlock: off"),
    );
    env.write("evals/iso/trace.json", &trace(&calls));
    env.commit_all("unsandboxed case");
    let was = mode_of(&env, "prompts/t.md");
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(
        env.read("reports/m/ran").trim(),
        "ran",
        "the payload never ran: {summary} {stderr}"
    );
    assert_eq!(env.read("reports/m/chmod").trim(), "0", "the chmod was not even tried");
    assert_eq!(mode_of(&env, "prompts/t.md"), 0o666);
    assert_eq!(code, 5, "{summary} {stderr}");
    let cards = env.cards(&summary);
    let said = format!("prompts/t.md: mode {was:04o} -> 0666");
    assert!(
        cards.iter().any(|c| c["kind"].as_str() == Some("unreviewed_changes")
            && c["detail"]
                .as_str()
                .is_some_and(|d| d.contains("during the fire") || d.contains("while the fire ran"))
            && c["detail"].as_str().is_some_and(|d| d.contains(&said))),
        "{cards:?}"
    );
    expect_refusal(&env, &[said]);
}
