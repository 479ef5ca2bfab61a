//! `builder cards`, `history`, `retro`, `watch` and `audit` end to end, on temporary
//! repos filled by real replay fires of the `runtime` binary.

use crate::util::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

pub(crate) fn replay(calls: &[(&str, Value)], answer: &str) -> String {
    let mut turns: Vec<Value> = calls.iter().enumerate().map(|(i, (n, a))| json!({"tool_calls": [{"id": format!("c{i}"), "name": n, "arguments": a}], "usage": {"input": 100, "output": 10}})).collect();
    turns.push(json!({"content": answer, "usage": {"input": 200, "output": 50}}));
    json!({"version": 1, "model": "replay-test", "turns": turns}).to_string()
}

pub(crate) const PROMPT_V1: &str =
    "---\ndescription: t\nacceptance:\n  - name: titled\n    report_contains: \"# Report\"\n---\nWrite the report.\n";
pub(crate) const PROMPT_V2: &str = "---\ndescription: t\nacceptance:\n  - name: titled\n    report_contains: \"# Report\"\n---\nWrite the report, shorter.\n";

pub(crate) fn setup_trace(env: &TestEnv, calls: &[(&str, Value)], answer: &str) {
    env.write("evals/digest/replay.json", &replay(calls, answer));
    env.commit_all("trace");
}

pub(crate) fn fire_n(env: &TestEnv, task: &str, n: usize) -> Vec<Value> {
    (0..n)
        .map(|_| {
            let (code, summary, stderr) = env.fire(task);
            assert!(
                code == 1 || code == TestEnv::completed_code(&summary),
                "fire exited {code}: {stderr}"
            );
            summary
        })
        .collect()
}

pub(crate) fn json_out(env: &TestEnv, args: &[&str]) -> Value {
    let out = env.builder(args);
    assert!(
        out.status.code() == Some(0) || out.status.code() == Some(1),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// A repo with 5 fires that hit the same denial and 2 that ask for a missing tool.
pub(crate) fn repo_with_cards() -> TestEnv {
    let env = TestEnv::new();
    env.write("prompts/t.md", PROMPT_V1);
    setup_trace(
        &env,
        &[("run_command", json!({"command": "git push origin main"}))],
        "# Report\nblocked",
    );
    fire_n(&env, "t", 5);
    setup_trace(&env, &[("send_email", json!({"to": "ops"}))], "# Report\nno mail");
    fire_n(&env, "t", 2);
    env.commit_all("settle");
    env
}

#[test]
fn cards_group_show_triage_and_export() {
    let env = repo_with_cards();
    let groups = json_out(&env, &["cards", "list", "--json"]);
    let groups = groups.as_array().unwrap();
    assert_eq!(groups.len(), 2, "{groups:?}");
    let denied = groups.iter().find(|g| g["kind"] == "permission_denied").unwrap();
    assert_eq!(denied["count"], 5);
    assert_eq!(denied["status"], "open");
    let missing = groups.iter().find(|g| g["kind"] == "missing_tool").unwrap();
    assert_eq!(missing["count"], 2);
    let only_missing = json_out(&env, &["cards", "list", "--kind", "missing_tool", "--json"]);
    assert_eq!(only_missing.as_array().unwrap().len(), 1);
    let fp = denied["fingerprint"].as_str().unwrap();
    let show = env.builder(&["cards", "show", fp]);
    let text = String::from_utf8_lossy(&show.stdout);
    assert_eq!(text.matches("kind: permission_denied").count(), 5, "{text}");
    let tri = env.builder(&[
        "cards",
        "triage",
        fp,
        "--accept",
        "--note",
        "push is not for the runtime",
        "--by",
        "Eng <eng@example.com>",
    ]);
    assert_eq!(tri.status.code(), Some(0), "{}", String::from_utf8_lossy(&tri.stderr));
    let paths: Vec<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# ").map(str::to_string))
        .collect();
    assert_eq!(paths.len(), 5);
    for p in &paths {
        let card: serde_yaml::Value = serde_yaml::from_str(&env.read(p)).unwrap();
        assert_eq!(card["status"].as_str(), Some("accepted"));
        assert_eq!(card["triage"]["decision"].as_str(), Some("accept"));
        assert_eq!(card["triage"]["by"].as_str(), Some("Eng <eng@example.com>"));
        assert_eq!(card["triage"]["note"].as_str(), Some("push is not for the runtime"));
    }
    let accepted = json_out(&env, &["cards", "list", "--status", "accepted", "--json"]);
    assert_eq!(accepted.as_array().unwrap().len(), 1);
    let open = json_out(&env, &["cards", "list", "--status", "open", "--json"]);
    assert_eq!(open[0]["kind"], "missing_tool");
    let dup = env.builder(&[
        "cards",
        "triage",
        missing["latest_id"].as_str().unwrap(),
        "--duplicate-of",
        "X-1",
    ]);
    assert_eq!(dup.status.code(), Some(0), "{}", String::from_utf8_lossy(&dup.stderr));
    let issues = json_out(&env, &["cards", "export", "--format", "github"]);
    let issues = issues.as_array().unwrap();
    assert_eq!(issues.len(), 2);
    let i = issues
        .iter()
        .find(|i| i["title"].as_str().unwrap().starts_with("[permission_denied]"))
        .unwrap();
    assert!(i["body"].as_str().unwrap().contains("seen **5** time(s)"), "{i}");
    assert!(i["body"].as_str().unwrap().contains("git push"), "{i}");
    assert_eq!(i["labels"][0], "agent-card");
    let none = env.builder(&["cards", "triage", fp]);
    assert_ne!(none.status.code(), Some(0), "a triage without a decision is refused");
}

#[test]
fn history_index_runs_show_diff_compare() {
    let env = TestEnv::new();
    env.write("prompts/t.md", PROMPT_V1);
    setup_trace(&env, &[("list_dir", json!({"path": "prompts"}))], "# Report\nall fine");
    let v1 = env.head_id();
    let first = fire_n(&env, "t", 5);
    let full = json_out(&env, &["history", "index", "--json"]);
    assert_eq!(full["full"], true);
    assert_eq!(full["receipts"], 5);
    let again = json_out(&env, &["history", "index", "--json"]);
    assert_eq!(again["receipts"], 0, "nothing new: nothing parsed");
    // A prompt change that breaks the acceptance check.
    env.write("prompts/t.md", PROMPT_V2);
    setup_trace(
        &env,
        &[
            ("list_dir", json!({"path": "prompts"})),
            ("list_dir", json!({"path": "scope"})),
        ],
        "no title any more",
    );
    let second = fire_n(&env, "t", 5);
    let inc = json_out(&env, &["history", "index", "--json"]);
    assert_eq!(inc["full"], false);
    assert_eq!(inc["receipts"], 5, "only the new receipts are parsed");
    let runs = json_out(&env, &["history", "runs", "--task", "t", "--json"]);
    assert_eq!(runs.as_array().unwrap().len(), 10);
    let failed = json_out(&env, &["history", "runs", "--status", "failed", "--json"]);
    assert_eq!(failed.as_array().unwrap().len(), 5);
    let a = first[0]["run_id"].as_str().unwrap();
    let b = second[0]["run_id"].as_str().unwrap();
    let show = json_out(&env, &["history", "show", a, "--json"]);
    assert_eq!(show["run_id"], a);
    let d = json_out(&env, &["history", "diff", a, b, "--json"]);
    let prompt = &d["inputs"][0];
    assert_eq!(prompt["name"], "prompts/t.md");
    assert!(
        prompt["diff"].as_str().unwrap().contains("+Write the report, shorter."),
        "{prompt}"
    );
    assert_eq!(d["inputs"][1]["diff"], "", "scope did not change");
    let steps = d["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "steps")
        .unwrap();
    assert_eq!(steps["delta"], 1.0);
    assert!(d["report_diff"].as_str().unwrap().contains("+no title any more"));
    let out = env.builder(&["history", "compare", "t", "--before", &v1, "--after", "HEAD", "--json"]);
    assert_eq!(out.status.code(), Some(1), "a regression makes compare exit 1");
    let c: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(c["before"]["runs"], 5);
    assert_eq!(c["before"]["success_rate"], 1.0);
    assert_eq!(c["after"]["runs"], 5);
    assert_eq!(c["after"]["success_rate"], 0.0);
    let regs: Vec<String> = c["regressions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_string())
        .collect();
    assert!(regs.iter().any(|r| r.contains("success rate")), "{regs:?}");
    assert!(regs.iter().any(|r| r.contains("steps")), "{regs:?}");
}

#[test]
fn retro_summarises_and_remembers_where_it_stopped() {
    let env = repo_with_cards();
    let out_path = env.home.join("retro.md");
    let out = env.builder(&["retro", "-o", out_path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let md = std::fs::read_to_string(&out_path).unwrap();
    assert!(md.contains("7 runs."), "{md}");
    assert!(
        md.contains("| completed | 7 |") || md.contains("| accepted | 7 |"),
        "{md}"
    );
    assert!(md.contains("| 5 | permission_denied | t |"), "{md}");
    assert!(md.contains("`Bash(git push*)`"), "denied calls name the rule: {md}");
    assert!(md.contains("send\\_email"), "missing tools, inert: {md}");
    assert!(md.contains("## Slowest steps"));
    let svg = std::fs::read_to_string(env.home.join("retro.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("<rect"), "{svg}");
    let next = env.builder(&["retro", "--since-last"]);
    let md = String::from_utf8_lossy(&next.stdout);
    assert!(
        md.contains("0 runs."),
        "the second retro starts where the first stopped: {md}"
    );
}

#[test]
fn history_index_overlays_card_edits_until_they_are_undone() {
    let env = repo_with_cards();
    json_out(&env, &["history", "index", "--json"]);
    let missing = |env: &TestEnv| -> Value {
        let groups = json_out(env, &["cards", "list", "--kind", "missing_tool", "--json"]);
        groups[0].clone()
    };
    let before = missing(&env);
    let path = before["latest_path"].as_str().unwrap().to_string();
    let committed = env.read(&path);
    let mut card: serde_yaml::Value = serde_yaml::from_str(&committed).unwrap();
    card["summary"] = "edited by hand".into();
    env.write(&path, &serde_yaml::to_string(&card).unwrap());
    let ix = json_out(&env, &["history", "index", "--json"]);
    assert_eq!(ix["overlaid_cards"], 1, "{ix}");
    assert_eq!(missing(&env)["summary"], "edited by hand");
    // The edit is undone in the work tree: the index goes back to the committed card.
    env.write(&path, &committed);
    let ix = json_out(&env, &["history", "index", "--json"]);
    assert_eq!(ix["overlaid_cards"], 0, "{ix}");
    assert_eq!(missing(&env)["summary"], before["summary"]);
    // An uncommitted card file that is deleted again leaves the index too.
    let extra = path.replace(".yaml", "-copy.yaml");
    let mut copy = card.clone();
    copy["id"] = "C-copy".into();
    copy["kind"] = "provider_error".into();
    env.write(&extra, &serde_yaml::to_string(&copy).unwrap());
    json_out(&env, &["history", "index", "--json"]);
    let kinds = json_out(&env, &["cards", "list", "--kind", "provider_error", "--json"]);
    assert_eq!(kinds.as_array().unwrap().len(), 1, "{kinds}");
    std::fs::remove_file(env.root.join(&extra)).unwrap();
    json_out(&env, &["history", "index", "--json"]);
    let kinds = json_out(&env, &["cards", "list", "--kind", "provider_error", "--json"]);
    assert_eq!(kinds.as_array().unwrap().len(), 0, "{kinds}");
}

#[test]
fn watch_prints_new_cards_and_receipts() {
    let env = TestEnv::new();
    env.write("prompts/t.md", PROMPT_V1);
    setup_trace(&env, &[("run_command", json!({"command": "git push"}))], "# Report\nx");
    let mut child = KillOnDrop(
        env.command("builder", &["watch", "--json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(line.contains("watching"), "{line}");
    let (code, summary, _) = env.fire("t");
    assert_eq!(code, TestEnv::completed_code(&summary));
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut got: Vec<Value> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < 2 && Instant::now() < deadline {
        if let Ok(l) = rx.recv_timeout(Duration::from_millis(200)) {
            got.push(serde_json::from_str(&l).unwrap());
        }
    }
    assert!(
        got.iter()
            .any(|e| e["type"] == "receipt" && e["run_id"] == summary["run_id"]),
        "{got:?}"
    );
    assert!(
        got.iter()
            .any(|e| e["type"] == "card" && e["kind"] == "permission_denied"),
        "{got:?}"
    );
    let _ = kernel::signal::kill(child.id(), kernel::signal::Signal::Int);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "Ctrl-C ends watch cleanly");
}

/// Kills a still-running child when a failed assertion unwinds past it.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for KillOnDrop {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

fn runtime_commit(env: &TestEnv, msg: &str, edit: impl FnOnce(&git2::Repository, &mut git2::Index)) -> String {
    let repo = git2::Repository::open(&env.root).unwrap();
    let mut idx = repo.index().unwrap();
    edit(&repo, &mut idx);
    idx.write().unwrap();
    let tree = repo.find_tree(idx.write_tree().unwrap()).unwrap();
    let sig = git2::Signature::now("runtime", "runtime@localhost").unwrap();
    let parent = repo.head().unwrap().peel_to_commit().unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, msg, &tree, &[&parent])
        .unwrap()
        .to_string()
}

fn audit(env: &TestEnv, args: &[&str]) -> (i32, Value) {
    let mut a = vec!["audit", "--json"];
    a.extend_from_slice(args);
    let out = env.builder(&a);
    (out.status.code().unwrap(), serde_json::from_slice(&out.stdout).unwrap())
}

fn violations(v: &Value) -> Vec<String> {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["severity"] == "violation")
        .map(|f| format!("{} {}", f["path"].as_str().unwrap(), f["what"].as_str().unwrap()))
        .collect()
}

#[test]
fn audit_flags_runtime_commits_outside_runtime_paths() {
    let env = TestEnv::new();
    fire_n(&env, "digest", 2);
    let (code, v) = audit(&env, &[]);
    assert_eq!(code, 0, "{v}");
    assert_eq!(v["runtime_commits"], 2);
    assert!(
        !v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["path"] == "prompts/digest.md"),
        "the scaffold commit is the baseline, no warning: {v}"
    );
    let clean_head = env.head_id();
    // (a) a runtime commit that edits a prompt.
    env.write("prompts/digest.md", "pwned\n");
    runtime_commit(&env, "runtime: oops", |_, idx| {
        idx.add_path(std::path::Path::new("prompts/digest.md")).unwrap()
    });
    // A move out of prompts/ is a delete plus an add.
    std::fs::rename(env.root.join("scope/SCOPE.md"), env.root.join("reports/SCOPE.md")).unwrap();
    runtime_commit(&env, "runtime: move", |_, idx| {
        idx.remove_path(std::path::Path::new("scope/SCOPE.md")).unwrap();
        idx.add_path(std::path::Path::new("reports/SCOPE.md")).unwrap();
    });
    // (c) a symlink and a mode-only change in runtime commits.
    std::os::unix::fs::symlink("../prompts", env.root.join("reports/link")).unwrap();
    runtime_commit(&env, "runtime: link", |_, idx| {
        idx.add_path(std::path::Path::new("reports/link")).unwrap()
    });
    let receipt = std::fs::read_dir(env.root.join("runs/digest"))
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    let receipt = std::fs::read_dir(receipt).unwrap().flatten().next().unwrap().path();
    std::fs::set_permissions(&receipt, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    runtime_commit(&env, "runtime: chmod", |_, idx| {
        idx.add_path(receipt.strip_prefix(&env.root).unwrap()).unwrap()
    });
    let (code, v) = audit(&env, &[]);
    assert_eq!(code, 1);
    let found = violations(&v);
    let has = |path: &str, what: &str| found.iter().any(|f| f.starts_with(path) && f.contains(what));
    assert!(has("prompts/digest.md", "modifies a builder-owned path"), "{found:?}");
    assert!(has("scope/SCOPE.md", "deletes a builder-owned path"), "{found:?}");
    assert!(has("reports/link", "symlink"), "{found:?}");
    assert!(
        found.iter().any(|f| f.contains("changes only a file mode")),
        "{found:?}"
    );
    // Findings come in history order (commits are audited newest first, in parallel).
    let at = |what: &str| found.iter().position(|f| f.contains(what)).unwrap();
    assert!(
        at("prompts/digest.md") < at("scope/SCOPE.md")
            && at("scope/SCOPE.md") < at("reports/link")
            && at("reports/link") < at("changes only a file mode"),
        "{found:?}"
    );
    // --since limits the walk to what came after a revision.
    let (code, v) = audit(&env, &["--since", "HEAD"]);
    assert_eq!((code, v["commits"].as_u64()), (0, Some(0)));
    let (code, v) = audit(&env, &["--since", &clean_head]);
    assert_eq!(code, 1);
    assert_eq!(v["commits"], 4);
}

/// `--status` and `--kind` take only the names records use: anything else is a usage
/// error (exit 2) that lists the valid names, before any index is opened.
#[test]
fn unknown_status_and_kind_filters_are_usage_errors() {
    let env = TestEnv::new();
    for (args, flag, valid) in [
        (
            &["cards", "list", "--status", "closed"][..],
            "--status <STATUS>",
            "[possible values: open, accepted, rejected, duplicate, fixed]",
        ),
        (
            &["cards", "export", "--kind", "denied"][..],
            "--kind <KIND>",
            "[possible values: permission_denied, missing_tool, budget_exceeded,",
        ),
        (
            &["history", "runs", "--status", "ok"][..],
            "--status <STATUS>",
            "[possible values: accepted, completed, failed, skipped, waiting_approval, cancelled, running, crashed]",
        ),
    ] {
        let out = env.builder(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        let bad = args[3];
        assert!(
            stderr.contains(&format!("error: invalid value '{bad}' for '{flag}'")),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains(valid), "{args:?}: {stderr}");
    }
    let ok = env.builder(&["cards", "list", "--status", "open", "--kind", "missing_tool", "--json"]);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
}

/// `builder serve --write --open` makes a token for the start and opens the server
/// without putting the token on a command line (any local user reads those in
/// `/proc`): `xdg-open` (here a script that records its arguments) gets a page only
/// its owner can read, which sends the browser on to the URL with the token.
#[test]
fn serve_open_hands_the_browser_its_token_through_a_private_page() {
    use std::os::unix::fs::PermissionsExt;
    let env = TestEnv::new();
    let bin_dir = env.home.join("fake-bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let opened = env.home.join("opened");
    let fake = bin_dir.join("xdg-open");
    std::fs::write(
        &fake,
        format!("#!/bin/sh\nprintf '%s\\n' \"$@\" > {}\n", opened.display()),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let mut child = env
        .command("builder", &["serve", "--port", "0", "--write", "--open"])
        .env("PATH", path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.as_mut().unwrap());
    let mut printed = String::new();
    while !printed.contains("?token=") {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "no token printed: {printed}");
        printed.push_str(&line);
    }
    let token = printed
        .split("?token=")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();
    assert!(token.len() >= 32, "{printed}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !opened.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    let argv = std::fs::read_to_string(&opened).expect("xdg-open ran");
    assert!(!argv.contains(&token), "the token on xdg-open's command line: {argv}");
    let page = std::path::PathBuf::from(argv.trim());
    assert_eq!(page, env.root.join(".runtime/serve-open.html"), "{argv}");
    let mode = std::fs::metadata(&page).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "only its owner reads the page");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains(&format!("?token={token}")) && html.contains("http-equiv=\"refresh\""),
        "{html}"
    );
}
