//! Snapshot tests (insta) of the text people read: every command's `--help`, the
//! failure lines a cron log shows, `runtime show` of a run, and `builder review` of a
//! proposal. A change to any of them shows up as a diff of its `.snap` file under
//! `tests/snapshots/` to be accepted in review (`cargo insta review`, or
//! `INSTA_UPDATE=always cargo test ... snapshots::` and a look at `git diff`), not
//! as a silent change. What varies from run to run (run ids, dates, commit ids,
//! timings, temporary paths) is replaced by a fixed placeholder first.

use crate::review::{builder_ok, with_origin};
use crate::util::*;
use std::process::Output;

/// The placeholders for what differs between runs, most specific first.
fn filters(env: &TestEnv) -> Vec<(String, &'static str)> {
    let mut f: Vec<(String, &'static str)> = vec![
        (regex_escape(&env.root.display().to_string()), "[REPO]"),
        (regex_escape(&env.home.display().to_string()), "[HOME]"),
    ];
    f.extend(
        [
            (r"\d{8}T\d{6}Z-[0-9a-f]{8}", "[RUN]"),
            (
                r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})",
                "[TIME]",
            ),
            (r"\d{4}-\d{2}-\d{2}", "[DATE]"),
            (r"\b[0-9a-f]{40}\b", "[OID]"),
            (r"\b[0-9a-f]{12}\b", "[SHORT-OID]"),
            (r"\b\d+(\.\d+)? ?(ms|s)\b", "[DURATION]"),
            (r"version \S+", "version [VERSION]"),
        ]
        .map(|(re, to)| (re.to_string(), to)),
    );
    f
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$".contains(c);
            special.then_some('\\').into_iter().chain(std::iter::once(c))
        })
        .collect()
}

/// Exit code, stdout and stderr of one command, as one text.
fn shown(out: &Output) -> String {
    format!(
        "exit {}\n--- stdout\n{}--- stderr\n{}",
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Asserts `text` matches the snapshot `name`, with `env`'s placeholders.
fn check(env: &TestEnv, name: &str, text: &str) {
    check_with(env, name, text, &[]);
}

/// As [`check`], with `first` applied before the common placeholders (a table's
/// timing column, whose width moves the text around it).
fn check_with(env: &TestEnv, name: &str, text: &str, first: &[(&str, &str)]) {
    let mut settings = insta::Settings::clone_current();
    settings.set_prepend_module_to_snapshot(false);
    for (re, to) in first {
        settings.add_filter(re, *to);
    }
    for (re, to) in &filters(env) {
        settings.add_filter(re, *to);
    }
    settings.bind(|| insta::assert_snapshot!(name, text));
}

/// The subcommands a `--help` text lists under `Commands:`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn every_commands_help_text() {
    let env = TestEnv::new();
    for bin in ["runtime", "builder"] {
        let top = env.command(bin, &["--help"]).output().unwrap();
        assert!(top.status.success());
        let help = String::from_utf8_lossy(&top.stdout).to_string();
        check(&env, &format!("help-{bin}"), &help);
        let subs = subcommands(&help);
        assert!(subs.len() >= 5, "{bin} lists its commands: {subs:?}");
        for sub in subs {
            let out = env.command(bin, &[&sub, "--help"]).output().unwrap();
            assert!(out.status.success(), "{bin} {sub} --help");
            check(
                &env,
                &format!("help-{bin}-{sub}"),
                &String::from_utf8_lossy(&out.stdout),
            );
        }
    }
}

#[test]
fn failure_lines_a_cron_log_shows() {
    let env = TestEnv::new();
    check(&env, "fail-unknown-task", &shown(&env.runtime(&["fire", "nosuch"])));
    let settings = env.read("settings/runtime.yaml");
    env.write(
        "settings/runtime.yaml",
        &format!("{settings}\nbudgets:\n  max_steps: lots\n"),
    );
    env.commit_all("a bad budget");
    check(&env, "fail-invalid-settings", &shown(&env.runtime(&["fire", "digest"])));
    check(&env, "fail-builder-check", &shown(&env.builder(&["check"])));
}

#[test]
fn runtime_show_of_a_replayed_run() {
    let env = TestEnv::new();
    let (code, summary, stderr) = env.fire("digest");
    assert_eq!(code, 0, "{stderr}");
    let run = summary["run_id"].as_str().unwrap().to_string();
    let out = env.runtime(&["show", &run]);
    assert!(out.status.success(), "{}", shown(&out));
    // A span's duration is right-aligned: its width moves the columns.
    let spans = [(r"(?m)^ +\d+(\.\d+)? ?(ms|s) ", "[DURATION] ")];
    check_with(&env, "runtime-show", &String::from_utf8_lossy(&out.stdout), &spans);
    let runs = env.runtime(&["runs"]);
    // The last column is the run's wall time in ms.
    let ms = [(r"(?m) +\d+$", " [MS]")];
    check_with(&env, "runtime-runs", &String::from_utf8_lossy(&runs.stdout), &ms);
}

#[test]
fn builder_review_of_a_proposal() {
    let env = TestEnv::new();
    with_origin(&env);
    env.write(
        "prompts/digest.md",
        &format!("{}\nBe brief.\n", env.read("prompts/digest.md")),
    );
    builder_ok(&env, &env.root, None, &["propose", "brief", "-m", "Be brief"]);
    let out = env.builder(&["review", "brief"]);
    // An eval row's wall time in ms, before its result.
    let ms = [(r"(?m) +\d+  (ok|FAIL)", " [MS]  $1")];
    check_with(&env, "builder-review", &shown(&out), &ms);
}
