//! Approvals pin what runs (issue 10 item 5): a run paused on `sh reports/p.sh` records
//! the script's content hash; swapping the script after the pause makes `runtime
//! resume` refuse the approved call with an `approval_stale` card (exit 1) before
//! anything runs, and an unchanged script runs as approved.

use crate::util::*;
use serde_json::Value;

const SCRIPT: &str = "echo approved-ran > reports/ran.md\n";
const SWAPPED: &str = "echo swapped-ran > reports/ran.md\necho payload > reports/swap-marker.md\n";

/// A repository whose task `t` pauses on `sh reports/p.sh` (an `ask` rule), fired once:
/// the paused run's id.
fn paused_on_script(env: &TestEnv) -> String {
    let trace = serde_json::json!({"version": 1, "turns": [
        {"tool_calls": [{"id": "c0", "name": "run_command", "arguments": {"command": "sh reports/p.sh"}}]},
        {"content": "# Done\nran the script"}
    ]});
    env.write("evals/digest/replay.json", &trace.to_string());
    let settings = env.read("settings/runtime.yaml").replace(
        "    - \"Bash(curl*)\"",
        "    - \"Bash(curl*)\"\n    - \"Bash(sh reports/*)\"",
    );
    env.write("settings/runtime.yaml", &settings);
    env.write("prompts/t.md", PLAIN_PROMPT);
    env.write("reports/p.sh", SCRIPT);
    env.commit_all("ask before running the report script");
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(code, 4, "waiting for approval: {stderr}");
    assert_eq!(env.cards(&summary)[0]["kind"].as_str(), Some("approval_needed"));
    assert!(
        !env.root.join("reports/ran.md").exists(),
        "nothing ran before the approval"
    );
    let run_id = summary["run_id"].as_str().unwrap().to_string();
    let ok = env.builder(&["approve-call", &run_id, "c0", "--by", "Eng <eng@example.com>"]);
    assert_eq!(ok.status.code(), Some(0), "{}", String::from_utf8_lossy(&ok.stderr));
    run_id
}

#[test]
fn a_script_swapped_after_the_pause_is_not_run_on_resume() {
    let env = TestEnv::new();
    let run_id = paused_on_script(&env);
    // The attack: the approved script is rewritten between the pause and the resume.
    env.write("reports/p.sh", SWAPPED);
    let proof = std::process::Command::new("sh")
        .arg(env.root.join("reports/p.sh"))
        .current_dir(&env.root)
        .status()
        .unwrap();
    assert!(proof.success());
    assert_eq!(
        env.read("reports/swap-marker.md"),
        "payload\n",
        "the swapped payload runs when run"
    );
    std::fs::remove_file(env.root.join("reports/swap-marker.md")).unwrap();
    std::fs::remove_file(env.root.join("reports/ran.md")).unwrap();
    let out = env.runtime(&["resume", &run_id, "--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "refused: {stderr}");
    let resumed: Value = serde_json::from_slice(&out.stdout).unwrap();
    let cards = env.cards(&resumed);
    let stale: Vec<_> = cards
        .iter()
        .filter(|c| c["kind"].as_str() == Some("approval_stale"))
        .collect();
    assert_eq!(stale.len(), 1, "{cards:?}");
    assert!(
        stale[0]["detail"].as_str().unwrap().contains("reports/p.sh"),
        "{:?}",
        stale[0]
    );
    let evidence = serde_yaml::to_string(&stale[0]["evidence"]).unwrap();
    assert!(evidence.contains("reports/p.sh: was sha256:"), "{evidence}");
    assert!(
        !env.root.join("reports/ran.md").exists(),
        "the swapped script did not run"
    );
    assert!(
        !env.root.join("reports/swap-marker.md").exists(),
        "its payload did not run"
    );
}

#[test]
fn an_unchanged_script_runs_as_approved() {
    let env = TestEnv::new();
    let run_id = paused_on_script(&env);
    let out = env.runtime(&["resume", &run_id, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let resumed: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(env.receipt(&resumed)["status"], "completed");
    assert_eq!(env.read("reports/ran.md"), "approved-ran\n");
}
