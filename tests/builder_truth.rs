//! Builder commands that tell the truth (issue 13, item 8): triage status follows the
//! card files, re-triage keeps history, `--fixed-by` must resolve, filters reject what
//! they do not know, `history compare` judges by input version with Fisher's exact
//! test, and `retro` on stdout leaves its mark, draws a labelled chart and says when
//! there is too little data.

use crate::builder_cmds::{fire_n, json_out, repo_with_cards, setup_trace, PROMPT_V1, PROMPT_V2};
use crate::util::*;
use serde_json::{json, Value};
use std::process::Output;

fn text(o: &[u8]) -> String {
    String::from_utf8_lossy(o).into_owned()
}

/// (exit code, stdout, stderr).
fn run(env: &TestEnv, args: &[&str]) -> (i32, String, String) {
    let out: Output = env.builder(args);
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// `git checkout -- cards`: the work tree's card files back to HEAD's.
fn checkout_cards(env: &TestEnv) {
    let repo = git2::Repository::open(&env.root).unwrap();
    let mut co = git2::build::CheckoutBuilder::new();
    co.force().path("cards");
    repo.checkout_head(Some(&mut co)).unwrap();
}

fn denied_group(env: &TestEnv) -> Value {
    let groups = json_out(env, &["cards", "list", "--kind", "permission_denied", "--json"]);
    groups[0].clone()
}

#[test]
fn an_undone_triage_is_undone_in_list_export_and_retro() {
    let env = repo_with_cards();
    let fp = denied_group(&env)["fingerprint"].as_str().unwrap().to_string();
    let (code, out, err) = run(&env, &["cards", "triage", &fp, "--accept"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("triaged 5 card(s) as accepted by Eng <eng@example.com>"),
        "{out}"
    );

    let view = |env: &TestEnv| -> (String, String, String) {
        let (code, list, err) = run(env, &["cards", "list", "--kind", "permission_denied"]);
        assert_eq!(code, 0, "{err}");
        let line = list.lines().find(|l| l.contains(&fp)).unwrap_or_default().to_string();
        let (code, export, err) = run(env, &["cards", "export", "--kind", "permission_denied"]);
        assert_eq!(code, 0, "{err}");
        let issues: Value = serde_json::from_str(&export).unwrap();
        let body = issues[0]["body"].as_str().unwrap().to_string();
        let (code, retro, err) = run(env, &["retro", "--since", "2000-01-01"]);
        assert_eq!(code, 0, "{err}");
        let row = retro
            .lines()
            .find(|l| l.starts_with("| 5 | permission_denied | t |"))
            .unwrap_or_default()
            .to_string();
        (line, body, row)
    };
    let (line, body, row) = view(&env);
    assert!(line.contains(" accepted "), "list: {line}");
    assert!(body.contains("Status: accepted"), "export: {body}");
    assert!(
        row.starts_with("| 5 | permission_denied | t | accepted |"),
        "retro: {row}"
    );

    // `git checkout -- cards`: the triage is gone from the files, so from every view.
    checkout_cards(&env);
    let (line, body, row) = view(&env);
    assert!(line.contains(" open ") && !line.contains("accepted"), "list: {line}");
    assert!(body.contains("Status: open"), "export: {body}");
    assert!(row.starts_with("| 5 | permission_denied | t | open |"), "retro: {row}");
    let open = json_out(&env, &["cards", "list", "--status", "accepted", "--json"]);
    assert_eq!(open.as_array().unwrap().len(), 0, "{open}");
}

#[test]
fn a_retriage_keeps_the_earlier_decision() {
    let env = repo_with_cards();
    let g = denied_group(&env);
    let id = g["latest_id"].as_str().unwrap();
    let path = g["latest_path"].as_str().unwrap();
    let (code, _, err) = run(&env, &["cards", "triage", id, "--accept", "--note", "first look"]);
    assert_eq!(code, 0, "{err}");
    let (code, out, err) = run(&env, &["cards", "triage", id, "--reject", "--note", "second look"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("1 card(s) were triaged before: the earlier decision is kept in triage_history"),
        "{out}"
    );
    let card: serde_yaml::Value = serde_yaml::from_str(&env.read(path)).unwrap();
    assert_eq!(card["status"].as_str(), Some("rejected"));
    assert_eq!(card["triage"]["decision"].as_str(), Some("reject"));
    assert_eq!(card["triage"]["note"].as_str(), Some("second look"));
    let history = card["triage_history"].as_sequence().unwrap();
    assert_eq!(history.len(), 1, "{card:?}");
    assert_eq!(history[0]["decision"].as_str(), Some("accept"));
    assert_eq!(history[0]["note"].as_str(), Some("first look"));
    // The list shows the latest decision.
    assert_eq!(denied_group(&env)["status"], "rejected");
}

#[test]
fn fixed_by_must_name_a_commit_or_a_proposal() {
    let env = repo_with_cards();
    let g = denied_group(&env);
    let id = g["latest_id"].as_str().unwrap();
    let path = g["latest_path"].as_str().unwrap();
    let before = env.read(path);
    let (code, out, err) = run(&env, &["cards", "triage", id, "--fixed-by", "deadbeef"]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("error: --fixed-by `deadbeef` is neither a commit in this repository nor a proposal (no branch proposals/deadbeef)"),
        "{err}"
    );
    assert_eq!(env.read(path), before, "a refused triage writes nothing");

    // A commit is recorded by its full id.
    let head = env.head_id();
    let (code, _, err) = run(&env, &["cards", "triage", id, "--fixed-by", "HEAD"]);
    assert_eq!(code, 0, "{err}");
    let card: serde_yaml::Value = serde_yaml::from_str(&env.read(path)).unwrap();
    assert_eq!(card["triage"]["fixed_by"].as_str(), Some(head.as_str()));

    // A proposal is the branch proposals/<name>.
    let repo = git2::Repository::open(&env.root).unwrap();
    let commit = repo.head().unwrap().peel_to_commit().unwrap();
    repo.branch("proposals/stop-pushing", &commit, false).unwrap();
    let (code, _, err) = run(&env, &["cards", "triage", id, "--fixed-by", "stop-pushing"]);
    assert_eq!(code, 0, "{err}");
    let card: serde_yaml::Value = serde_yaml::from_str(&env.read(path)).unwrap();
    assert_eq!(card["triage"]["fixed_by"].as_str(), Some("proposals/stop-pushing"));
}

#[test]
fn bad_since_and_unknown_tasks_are_usage_errors() {
    let env = TestEnv::new();
    for args in [
        &["cards", "list", "--since", "yesterday"][..],
        &["cards", "export", "--since", "yesterday"][..],
        &["history", "runs", "--since", "yesterday"][..],
        &["retro", "--since", "yesterday"][..],
    ] {
        let (code, _, err) = run(&env, args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(
            err.contains("error: --since `yesterday` is not a date (YYYY-MM-DD) or RFC 3339 time"),
            "{args:?}: {err}"
        );
    }
    let (code, _, err) = run(&env, &["cards", "list", "--since", "2026-13-01"]);
    assert_eq!(code, 2, "a month 13 is not a date: {err}");
    for args in [
        &["cards", "list", "--task", "digset"][..],
        &["cards", "export", "--task", "digset"][..],
        &["history", "runs", "--task", "digset"][..],
        &["history", "compare", "digset", "--before", "HEAD"][..],
    ] {
        let (code, _, err) = run(&env, args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("error: no task `digset`"), "{args:?}: {err}");
        assert!(err.contains("hint: did you mean `digest`?"), "{args:?}: {err}");
    }
    // What does parse is accepted: a date, an RFC 3339 time with an offset, a known task.
    for args in [
        &["cards", "list", "--since", "2026-01-31", "--task", "digest"][..],
        &[
            "history",
            "runs",
            "--since",
            "2026-01-31T08:00:00+02:00",
            "--task",
            "digest",
        ][..],
    ] {
        let (code, _, err) = run(&env, args);
        assert_eq!(code, 0, "{args:?}: {err}");
    }
}

/// A repo whose task `t` ran `before` (accepted, failed) times on PROMPT_V1 and
/// `after` times on PROMPT_V2, with the same tool calls (so steps and tokens agree);
/// returns the V1 commit.
fn compare_repo(before: (usize, usize), after: (usize, usize)) -> (TestEnv, String) {
    let env = TestEnv::new();
    let calls = [("list_dir", json!({"path": "prompts"}))];
    let fire = |ok: usize, failed: usize| {
        setup_trace(&env, &calls, "# Report\nall fine");
        fire_n(&env, "t", ok);
        setup_trace(&env, &calls, "no title");
        fire_n(&env, "t", failed);
    };
    env.write("prompts/t.md", PROMPT_V1);
    env.commit_all("v1");
    let v1 = env.head_id();
    fire(before.0, before.1);
    env.write("prompts/t.md", PROMPT_V2);
    env.commit_all("v2");
    fire(after.0, after.1);
    (env, v1)
}

#[test]
fn compare_with_too_few_runs_says_so() {
    let (env, v1) = compare_repo((3, 0), (0, 2));
    let (code, out, err) = run(&env, &["history", "compare", "t", "--before", &v1]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains(&format!(
            "too few runs to compare: 3 on {v1} and 2 on HEAD; each side needs at least 5 (--min-runs)"
        )),
        "{out}"
    );
    assert!(!out.contains("REGRESSION"), "{out}");
    // Asking for fewer runs judges them: 3/3 then 0/2 is p = 0.1, not a regression.
    let (code, out, _) = run(&env, &["history", "compare", "t", "--before", &v1, "--min-runs", "2"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("no significant drop (Fisher's exact test, one-sided p = 0.1000)"),
        "{out}"
    );
}

#[test]
fn compare_flags_a_real_regression_with_fishers_test() {
    let (env, v1) = compare_repo((10, 0), (0, 10));
    let (code, out, err) = run(&env, &["history", "compare", "t", "--before", &v1]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("REGRESSION: success rate fell from 100% (10/10) to 0% (0/10): Fisher's exact test, one-sided p = 5.41e-6 < 0.05"),
        "{out}"
    );
    let out = env.builder(&["history", "compare", "t", "--before", &v1, "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let c: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(c["success_test"]["test"], "fisher_exact_one_sided");
    assert_eq!(c["success_test"]["regression"], true);
    assert_eq!(c["before"]["runs"], 10);
    assert_eq!(c["after"]["successes"], 0);
    // The version is the full set of inputs.
    for k in ["prompt_blob", "scope_blob", "settings_blob", "model"] {
        assert!(c["after"][k].is_string(), "{k}: {c}");
    }
    assert_ne!(c["before"]["prompt_blob"], c["after"]["prompt_blob"]);
    assert_eq!(c["before"]["settings_blob"], c["after"]["settings_blob"]);
}

#[test]
fn compare_does_not_flag_a_small_noisy_difference() {
    let (env, v1) = compare_repo((5, 1), (4, 2));
    let (code, out, err) = run(&env, &["history", "compare", "t", "--before", &v1]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(
            "success rate 83% (5/6) -> 67% (4/6): no significant drop (Fisher's exact test, one-sided p = 0.5000)"
        ),
        "{out}"
    );
    assert!(out.contains("no regressions"), "{out}");
}

#[test]
fn retro_to_stdout_leaves_the_mark_and_draws_a_labelled_chart() {
    let env = repo_with_cards();
    // One call that really runs, so the slowest steps have a measured time.
    setup_trace(
        &env,
        &[("run_command", json!({"command": "git log --oneline"}))],
        "# Report\nlogged",
    );
    fire_n(&env, "t", 1);
    env.commit_all("settle");
    let (code, md, err) = run(&env, &["retro"]);
    assert_eq!(code, 0, "{err}");
    assert!(md.contains("8 runs."), "{md}");
    let (code, md, err) = run(&env, &["retro", "--since-last"]);
    assert_eq!(code, 0, "{err}");
    assert!(md.contains("8 runs."), "a retro on stdout does not move the mark: {md}");
    // One day of runs: too little for a trend, said in the markdown and the chart.
    assert!(
        md.contains("Too little data for a trend: 1 day(s) with runs in this window; the chart needs at least 2."),
        "{md}"
    );
    let svg = env.read(".runtime/retro.svg");
    for label in [
        "cost (USD)",
        "tokens",
        "day (UTC)",
        "Too little data for a trend: 1 day(s)",
    ] {
        assert!(svg.contains(label), "{label}: {svg}");
    }
    assert!(
        svg.contains("<text") && svg.contains("$0.0000</text>"),
        "tick values: {svg}"
    );
    // Slowest steps: the call that ran, with a real duration; denied calls (0 ms) are not steps.
    let slow = md.split("## Slowest steps").nth(1).unwrap_or_default();
    let row = slow
        .lines()
        .find(|l| l.contains("| `run_command` | ok |"))
        .unwrap_or_else(|| panic!("{slow}"));
    let ms: i64 = row.trim_start_matches("| ").split(' ').next().unwrap().parse().unwrap();
    assert!(ms > 0, "{row}");
    assert!(!slow.contains("| 0 | `run_command` |"), "{slow}");
    // --mark moves it; the next retro starts there.
    let (code, _, err) = run(&env, &["retro", "--mark"]);
    assert_eq!(code, 0, "{err}");
    let (_, md, _) = run(&env, &["retro", "--since-last"]);
    assert!(md.contains("0 runs."), "{md}");
}
