//! Everything humans read is inert (issue 17, item 8): hostile text in a proposal
//! (prompt, eval case, commit author) and in what a model leaves (a tool name, a final
//! answer, prefetch output) reaches the terminal escaped, and a pull-request comment
//! or an exported issue only inside code or escaped prose: no escape sequence, no live
//! heading, image, link, HTML or `@mention`, no fence the text can close.

use crate::util::*;
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::process::Output;

/// An escape sequence that clears the screen and one that sets the window title, a
/// closed code fence, a forged approval heading, an image that calls out, a mention,
/// a link.
const HOSTILE: &str =
    "\x1b[2J\x1b]0;pwned\x07```\n## Approved\n<img src=http://evil.example/x.png> @team [click](http://evil.example)";

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// No control character but newline and tab reaches the terminal.
fn assert_terminal_inert(what: &str, text: &str) {
    let bad: Vec<char> = text
        .chars()
        .filter(|c| {
            (c.is_control() && *c != '\n' && *c != '\t')
                || ('\u{202a}'..='\u{202e}').contains(c)
                || ('\u{2066}'..='\u{2069}').contains(c)
        })
        .collect();
    assert!(bad.is_empty(), "{what}: raw control characters {bad:?} in:\n{text}");
}

/// `line` without its code spans (a run of backticks up to the next run as long).
fn prose_of(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let n = rest[start..].chars().take_while(|c| *c == '`').count();
        let after = &rest[start + n..];
        let closer = "`".repeat(n);
        // The closing run must be exactly `n` long.
        let mut end = None;
        let mut from = 0;
        while let Some(i) = after[from..].find(&closer) {
            let at = from + i;
            let run = after[at..].chars().take_while(|c| *c == '`').count();
            if run == n {
                end = Some(at);
                break;
            }
            from = at + run;
        }
        match end {
            Some(e) => rest = &after[e + n..],
            None => {
                out.push_str(&rest[start..]);
                return out;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Outside code fences, no heading but ours, no HTML, image, link or live mention;
/// every fence closes only with a line at least as long as the one that opened it.
fn assert_markdown_inert(what: &str, md: &str, ours: &[&str]) {
    assert_terminal_inert(what, md);
    let mut fence: Option<usize> = None;
    for line in md.lines() {
        let ticks = line.chars().take_while(|c| *c == '`').count();
        match fence {
            Some(n) if ticks >= n && line.trim_start_matches('`').trim().is_empty() => fence = None,
            Some(_) => {}
            None if ticks >= 3 => fence = Some(ticks),
            None => {
                if line.starts_with('#') {
                    assert!(
                        ours.iter().any(|h| line.starts_with(h)),
                        "{what}: a heading that is not ours: {line}\n{md}"
                    );
                }
                let prose = prose_of(line);
                for live in ["<img", "](http", "@team", "<b>"] {
                    // A markdown escape (`\<`) makes the character text.
                    let unescaped = prose.match_indices(live).any(|(i, _)| !prose[..i].ends_with('\\'));
                    assert!(!unescaped, "{what}: live `{live}` in: {line}");
                }
            }
        }
    }
    assert_eq!(fence, None, "{what}: a fence left open\n{md}");
}

#[test]
fn a_hostile_proposal_reads_inert_in_review_text_github_and_proposals() {
    let env = TestEnv::new();
    env.write(
        "prompts/digest.md",
        &format!("{}\n{HOSTILE}\n", env.read("prompts/digest.md")),
    );
    env.write(
        "evals/digest/hostile.yaml",
        &format!(
            "name: {}\nmodel: scripted\nscript:\n  - text: \"# Digest\"\nassert:\n  - report_contains: {}\n",
            serde_json::to_string(HOSTILE).unwrap(),
            serde_json::to_string(HOSTILE).unwrap()
        ),
    );
    let out = env
        .command("builder", &["propose", "tidy", "-m", "Tidy the digest"])
        .env("GIT_AUTHOR_NAME", "Eve\x1b]0;pwned\x07 @team")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let out = env.builder(&["review", "tidy"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "the hostile case fails: {text}");
    assert_terminal_inert("review text", &text);
    // The patch line, escaped as it is shown (snapshot).
    assert!(
        text.contains("\n+\\x1b[2J\\x1b]0;pwned\\x07```\n+## Approved\n"),
        "{text}"
    );
    // The case name, one line: the newline inside it is shown, not obeyed.
    assert!(
        text.contains("FAIL \\x1b[2J\\x1b]0;pwned\\x07```\\x0a## Approved\\x0a<img src=http://evil.example/x.png> @team [click](http://evil.example) (evals/digest/hostile.yaml)"),
        "{text}"
    );

    let out = env.builder(&["review", "tidy", "--format", "github"]);
    let md = stdout(&out);
    assert_markdown_inert("review github", &md, &["## ❌ builder review", "### "]);
    assert!(md.contains("<details><summary>diff</summary>\n\n````diff\n"), "{md}");
    // The case in the eval table (snapshot): a code span as long as it must be.
    assert!(
        md.contains("| ````\\x1b[2J\\x1b]0;pwned\\x07```\\x0a## Approved\\x0a<img src=http://evil.example/x.png> @team [click](http://evil.example)```` | head |"),
        "{md}"
    );

    let out = env.builder(&["proposals"]);
    let list = stdout(&out);
    assert_terminal_inert("proposals", &list);
    assert!(list.contains("tidy\topen\tEve\\x1b]0;pwned\\x07 @team"), "{list}");
}

#[test]
fn model_text_reads_inert_in_cards_export_show_and_the_dry_run() {
    let env = TestEnv::new();
    env.write("prompts/t.md", PLAIN_PROMPT);
    env.write("settings/runtime.yaml", crate::isolation::SETTINGS);
    let turns = json!({"version": 1, "turns": [
        {"tool_calls": [{"id": "c1", "name": format!("steal{HOSTILE}"), "arguments": {}}], "usage": {"input": 1, "output": 1}},
        {"content": HOSTILE, "usage": {"input": 1, "output": 1}}
    ]});
    env.write("evals/iso/trace.json", &turns.to_string());
    env.commit_all("a task the model answers with hostile text");
    let (_, summary, _) = env.fire("t");
    assert!(
        env.card_kinds(&summary).contains(&"missing_tool".to_string()),
        "{summary}"
    );

    let out = env.builder(&["cards", "list"]);
    assert_terminal_inert("cards list", &stdout(&out));
    let out = env.builder(&["cards", "export", "--format", "github"]);
    let issues: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let issue = issues
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["title"].as_str().unwrap().contains("missing_tool"))
        .unwrap();
    let title = issue["title"].as_str().unwrap();
    assert_terminal_inert("issue title", title);
    assert!(!title.contains("@team"), "{title}");
    assert_markdown_inert(
        "issue body",
        issue["body"].as_str().unwrap(),
        &["### Summary", "### Detail", "### Evidence"],
    );

    let run = summary["run_id"].as_str().unwrap();
    let out = env.runtime(&["show", run]);
    let shown = stdout(&out);
    assert_terminal_inert("runtime show", &shown);
    assert!(shown.contains("steal\\x1b[2J"), "{shown}");
    let out = env.runtime(&["runs"]);
    assert_terminal_inert("runtime runs", &stdout(&out));
    let out = env.builder(&["history", "runs"]);
    assert_terminal_inert("history runs", &stdout(&out));

    // A prefetch script whose output carries the text (an issue title it fetched).
    env.write(
        "tools/p.sh",
        &format!("#!/bin/sh\nprintf '%s\\n' {}\n", shell_quote(HOSTILE)),
    );
    std::fs::set_permissions(env.root.join("tools/p.sh"), PermissionsExt::from_mode(0o755)).unwrap();
    env.write(
        "prompts/t.md",
        "---\ndescription: test task\nprefetch:\n  - name: p\n    run: tools/p.sh\n---\nDo the test task.\n",
    );
    env.commit_all("a prefetch");
    let out = env.runtime(&["fire", "t", "--dry-run"]);
    let dry = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{dry}");
    assert_terminal_inert("dry run", &dry);
    assert!(dry.contains("\\x1b[2J\\x1b]0;pwned\\x07```"), "{dry}");
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}
