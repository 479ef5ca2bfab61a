//! Documentation in the repository (issue 13, item 10): the README's first command
//! (`./demo`) fires in a demo repository and never in the project's own history, man
//! pages for every subcommand, the systemd units verified where `systemd-analyze`
//! exists, and release builds without debug info. (The settings reference is checked
//! against the settings types by a unit test in `shared`, and every argument's help
//! text by unit tests in each binary.) And (issue 19, item 5) the README and every page
//! under `docs/`: each relative link resolves to a file of the repository (and its
//! `#anchor` to a heading), none leads outside it, and each `runtime ...`/`builder ...`
//! command they show names subcommands and flags that `--help` lists.

use crate::skip::Capability;
use crate::util::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A file of this workspace.
fn workspace_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

fn read_workspace_file(rel: &str) -> String {
    std::fs::read_to_string(workspace_file(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// `git args` in `dir` with no identity (the demo's own commits say who made them).
fn git(env: &TestEnv, dir: &Path, args: &[&str]) -> String {
    let out = env
        .isolated_command("git")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    succeeded(out, dir, args)
}

/// Stands in for `cargo` in the demo script: `cargo run -q -p <pkg> -- <args>` runs
/// the binary this test run built (a nested cargo would wait for the build lock).
const CARGO_SHIM: &str = r#"#!/bin/sh
[ "$1" = run ] || { echo "shim: only cargo run" >&2; exit 99; }
shift
while [ "$1" != "--" ]; do
  case "$1" in -p) pkg=$2; shift ;; esac
  shift
done
shift
exec "$DEMO_TEST_BIN_DIR/$pkg" "$@"
"#;

/// Runs `./demo <args>` in `project` with the cargo shim first on PATH.
fn demo(env: &TestEnv, project: &Path, args: &[&str]) -> Output {
    let shim_dir = env.home.parent().unwrap().join("shim");
    std::fs::create_dir_all(&shim_dir).unwrap();
    let shim = shim_dir.join("cargo");
    std::fs::write(&shim, CARGO_SHIM).unwrap();
    std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", shim_dir.display(), std::env::var("PATH").unwrap_or_default());
    env.isolated_command(project.join("demo"))
        .args(args)
        .current_dir(project)
        .env("PATH", path)
        .env("DEMO_TEST_BIN_DIR", bin("runtime").parent().unwrap())
        .output()
        .unwrap()
}

#[test]
fn the_readme_starts_with_the_demo_and_ci_runs_it_as_written() {
    let readme = read_workspace_file("README.md");
    let block = readme.split("```sh\n").nth(1).expect("a sh block in the README");
    let first = block.lines().next().unwrap();
    assert_eq!(first.split('#').next().unwrap().trim(), "./demo", "{first}");
    let ci = read_workspace_file(".ci/run");
    assert!(ci.lines().any(|l| l == "./demo"), "CI runs the README's first command");
    assert!(
        !ci.lines()
            .any(|l| l.contains("fire digest") && !l.trim_start().starts_with('#')),
        "CI fires nothing in the project's own checkout"
    );
    let test_cmd = block.lines().nth(1).unwrap().split('#').next().unwrap().trim();
    assert_eq!(test_cmd, "cargo build --workspace && cargo test --workspace");
    assert!(ci.contains(test_cmd), "CI keeps the README's test command");
    // A front door, not the reference (that is docs/).
    let lines = readme.lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines; move reference material to docs/"
    );
}

#[test]
fn the_demo_fires_in_its_own_repository_and_never_in_the_projects_history() {
    // The project: a committed repository that ignores target/, as this one does.
    let env = TestEnv::new();
    let project = env.root.clone();
    std::fs::write(project.join(".gitignore"), "/target/\n.runtime/\n").unwrap();
    std::fs::copy(workspace_file("demo"), project.join("demo")).unwrap();
    env.commit_all("the project, with its demo script");
    let project_head = env.head_id();
    let demo_repo = project.join("target/demo");

    let out = demo(&env, &project, &["--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["status"], "accepted", "{summary}");
    assert!(demo_repo.join(".git").is_dir(), "the demo is a repository of its own");
    assert!(demo_repo.join(summary["receipt"].as_str().unwrap()).is_file());
    let log = |dir: &Path| git(&env, dir, &["log", "--format=%an %s"]);
    let lines = log(&demo_repo);
    assert_eq!(lines.lines().count(), 2, "{lines}");
    assert!(
        lines
            .lines()
            .next()
            .unwrap()
            .starts_with("runtime runtime: digest accepted"),
        "{lines}"
    );

    // The project: same history, clean tree.
    assert_eq!(env.head_id(), project_head);
    assert_eq!(git(&env, &project, &["status", "--porcelain"]), "");

    // Again: the demo repository is reused, one more fire in its history.
    let out = demo(&env, &project, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(log(&demo_repo).lines().count(), 3);

    // A leftover directory without a repository (an interrupted first run) is made
    // afresh; `git -C` there would have found the project's repository instead.
    std::fs::remove_dir_all(&demo_repo).unwrap();
    std::fs::create_dir_all(demo_repo.join("reports")).unwrap();
    let out = demo(&env, &project, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(log(&demo_repo).lines().count(), 2);
    assert_eq!(env.head_id(), project_head, "the project's history never moves");
    assert_eq!(git(&env, &project, &["status", "--porcelain"]), "");
}

/// `<bin> man --dir <dir>`: the pages it says it wrote.
fn man_pages(env: &TestEnv, bin_name: &str, dir: &Path) -> Vec<String> {
    let out = env
        .command(bin_name, &["man", "--dir", dir.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let printed: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    let mut names = Vec::new();
    for p in &printed {
        let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert!(text.contains("\n.TH "), "{p} is a man page");
        names.push(Path::new(p).file_name().unwrap().to_string_lossy().into_owned());
    }
    let mut on_disk: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    on_disk.sort();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(sorted, on_disk, "it prints what it wrote");
    names
}

#[test]
fn man_dir_writes_one_page_per_subcommand_of_both_binaries() {
    let env = TestEnv::new();
    let dir = env.home.parent().unwrap().join("man/man1");
    let runtime = man_pages(&env, "runtime", &dir);
    assert_eq!(runtime[0], "runtime.1");
    for sub in ["fire", "resume", "runs", "show", "check", "completions", "man"] {
        assert!(
            runtime.contains(&format!("runtime-{sub}.1")),
            "runtime-{sub}.1 in {runtime:?}"
        );
    }
    let builder_dir = env.home.parent().unwrap().join("man-builder");
    let builder = man_pages(&env, "builder", &builder_dir);
    for page in [
        "builder.1",
        "builder-init.1",
        "builder-check.1",
        "builder-cards.1",
        "builder-cards-list.1",
        "builder-cards-triage.1",
        "builder-history-compare.1",
        "builder-retro.1",
        "builder-watch.1",
        "builder-audit.1",
        "builder-approve-call.1",
        "builder-eval.1",
        "builder-review.1",
    ] {
        assert!(builder.iter().any(|p| p == page), "{page} in {builder:?}");
    }
    // Without --dir: the top page on stdout, nothing written.
    let out = env.runtime(&["man"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("\n.TH runtime 1"));
}

#[test]
fn the_systemd_units_verify() {
    let service = read_workspace_file("contrib/systemd/runtime-fire@.service");
    let timer = read_workspace_file("contrib/systemd/runtime-fire@.timer");
    assert!(
        service.contains("\nExecStart=/usr/local/bin/runtime fire %i\n"),
        "{service}"
    );
    assert!(
        service.contains("\nSuccessExitStatus=3\n"),
        "a skipped fire is not a failure"
    );
    let readme = read_workspace_file("README.md");
    assert!(readme.contains("contrib/systemd/runtime-fire@.service") && readme.contains("/usr/local/bin/"));

    let Some(analyze) = which("systemd-analyze") else {
        crate::skip::skip(
            Capability::SystemdAnalyze,
            "systemd-analyze is not on PATH; the units were not verified",
        );
        return;
    };
    let env = TestEnv::new();
    let dir = env.home.parent().unwrap().join("units");
    std::fs::create_dir_all(&dir).unwrap();
    // The binary where this test run built it, instead of /usr/local/bin.
    let runtime = bin("runtime");
    std::fs::write(
        dir.join("runtime-fire@.service"),
        service.replace("/usr/local/bin/runtime", runtime.to_str().unwrap()),
    )
    .unwrap();
    std::fs::write(dir.join("runtime-fire@.timer"), &timer).unwrap();
    // Documentation=man:runtime-fire(1): the pages `runtime man --dir` writes.
    let man_root = env.home.parent().unwrap().join("man");
    man_pages(&env, "runtime", &man_root.join("man1"));
    let mut cmd = env.isolated_command(&analyze);
    cmd.arg("verify");
    if which("man").is_none() {
        eprintln!("note: `man` is not on PATH; Documentation= pages not checked");
        cmd.arg("--man=no");
    }
    let out = cmd
        .arg(dir.join("runtime-fire@digest.service"))
        .arg(dir.join("runtime-fire@digest.timer"))
        .env("MANPATH", &man_root)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // Unknown keys and bad values are warnings, exit 0: none may name our units.
    let ours: Vec<&str> = stderr.lines().filter(|l| l.contains("runtime-fire")).collect();
    assert!(ours.is_empty(), "systemd-analyze verify:\n{}", ours.join("\n"));
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(program))
            .find(|p| p.is_file())
    })
}

#[test]
fn release_builds_carry_no_debug_info_and_profiling_keeps_it() {
    let manifest = read_workspace_file("Cargo.toml");
    let section = |name: &str| -> Vec<String> {
        manifest
            .lines()
            .skip_while(|l| l.trim() != format!("[profile.{name}]"))
            .skip(1)
            .take_while(|l| !l.starts_with('['))
            .map(|l| l.split('#').next().unwrap().replace(' ', ""))
            .filter(|l| !l.is_empty())
            .collect()
    };
    let release = section("release");
    assert!(release.contains(&"debug=0".to_string()), "{release:?}");
    assert!(release.contains(&"strip=\"debuginfo\"".to_string()), "{release:?}");
    let profiling = section("profiling");
    assert!(profiling.contains(&"inherits=\"release\"".to_string()), "{profiling:?}");
    assert!(profiling.contains(&"debug=1".to_string()), "{profiling:?}");
}

// ---------------------------------------------------------------------------
// README.md and docs/*.md: links resolve, commands and flags exist (issue 19, item 5).
// A small reader of the markdown these pages use (fenced blocks, code spans, inline
// links, `#` headings): enough to find what must be checked, not a renderer.

/// README.md and every page under docs/, as (workspace-relative path, text).
fn doc_pages() -> Vec<(String, String)> {
    let mut rels = vec!["README.md".to_string()];
    let mut pages: Vec<String> = std::fs::read_dir(workspace_file("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    pages.sort();
    rels.extend(pages);
    rels.into_iter()
        .map(|r| {
            let text = read_workspace_file(&r);
            (r, text)
        })
        .collect()
}

/// A page split into the lines of its fenced code blocks and its prose (code blocks
/// left out, line count kept).
struct Markdown {
    code_lines: Vec<String>,
    prose: String,
}

fn parse_markdown(text: &str) -> Markdown {
    let mut code_lines = Vec::new();
    let mut prose = String::new();
    let mut in_fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            prose.push('\n');
        } else if in_fence {
            code_lines.push(line.to_string());
            prose.push('\n');
        } else {
            prose.push_str(line);
            prose.push('\n');
        }
    }
    Markdown { code_lines, prose }
}

/// The code spans of prose (a span may cross a line break), and the prose with each
/// span blanked out.
fn code_spans(prose: &str) -> (Vec<String>, String) {
    let chars: Vec<char> = prose.chars().collect();
    let mut spans = Vec::new();
    let mut rest = String::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            rest.push(chars[i]);
            i += 1;
            continue;
        }
        let run = chars[i..].iter().take_while(|c| **c == '`').count();
        let body_start = i + run;
        let mut j = body_start;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let n = chars[j..].iter().take_while(|c| **c == '`').count();
                if n == run {
                    close = Some(j);
                    break;
                }
                j += n;
            } else {
                j += 1;
            }
        }
        match close {
            Some(end) => {
                let body: String = chars[body_start..end].iter().collect();
                spans.push(body.replace('\n', " ").trim().to_string());
                rest.push(' ');
                i = end + run;
            }
            None => {
                rest.extend(&chars[i..body_start]);
                i = body_start;
            }
        }
    }
    (spans, rest)
}

/// The targets of the inline links `[text](target)` in prose without code spans.
fn link_targets(prose: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = prose;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        out.push(after[..end].trim().to_string());
        rest = &after[end..];
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens.
fn heading_anchors(text: &str) -> Vec<String> {
    let md = parse_markdown(text);
    md.prose
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| {
            l.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

/// The problems with the links of the page `rel`: a target outside the repository,
/// a file that does not exist, an anchor no heading makes.
fn link_problems(rel: &str, text: &str) -> Vec<String> {
    let root = workspace_file("").canonicalize().unwrap();
    let (_, prose) = code_spans(&parse_markdown(text).prose);
    let mut problems = Vec::new();
    for target in link_targets(&prose) {
        if target.contains("://") || target.starts_with("mailto:") {
            problems.push(format!("{rel}: link outside the repository: {target}"));
            continue;
        }
        let (file, anchor) = match target.split_once('#') {
            Some((f, a)) => (f, Some(a)),
            None => (target.as_str(), None),
        };
        if file.is_empty() {
            // An anchor of this page.
            if let Some(anchor) = anchor.filter(|a| !heading_anchors(text).iter().any(|h| h == a)) {
                problems.push(format!("{rel}: no heading for #{anchor}"));
            }
            continue;
        }
        let path = root.join(rel).parent().unwrap().join(file);
        let Ok(resolved) = path.canonicalize() else {
            problems.push(format!("{rel}: broken link: {target}"));
            continue;
        };
        if !resolved.starts_with(&root) {
            problems.push(format!("{rel}: link outside the repository: {target}"));
            continue;
        }
        if let Some(anchor) = anchor {
            let anchors = std::fs::read_to_string(&resolved)
                .map(|t| heading_anchors(&t))
                .unwrap_or_default();
            if !anchors.iter().any(|a| a == anchor) {
                problems.push(format!("{rel}: no heading for #{anchor} in {target}"));
            }
        }
    }
    problems
}

/// What `<bin> <subcommands...> --help` says: its subcommands and its flags, each
/// with whether it takes a value.
#[derive(Default)]
struct HelpPage {
    subcommands: Vec<String>,
    flags: Vec<(String, bool)>,
}

fn help_page(program: &str, path: &[String]) -> HelpPage {
    let out = Command::new(bin(program)).args(path).arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{program} {path:?} --help");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut page = HelpPage::default();
    let mut in_commands = false;
    for line in text.lines() {
        if line == "Commands:" {
            in_commands = true;
            continue;
        }
        if in_commands {
            match line.split_whitespace().next() {
                Some(name) if line.starts_with("  ") => page.subcommands.push(name.to_string()),
                _ => in_commands = false,
            }
            continue;
        }
        let trimmed = line.trim_start();
        if trimmed.starts_with('-') && line.starts_with("  ") {
            let signature = trimmed.split("  ").next().unwrap_or("");
            let takes_value = signature.contains('<');
            for name in signature.split(", ") {
                let name = name.split([' ', '=']).next().unwrap_or("").trim_end_matches("...");
                page.flags.push((name.to_string(), takes_value));
            }
        }
    }
    page
}

/// The commands of both binaries a page shows: every segment (split at `|`, `&&`,
/// `;` outside brackets, a `#` comment cut off) of a code block line or a code span
/// that starts with `runtime` or `builder`. A code block line that starts with
/// whitespace and `[` continues the command above it.
fn shown_commands(text: &str) -> Vec<String> {
    let md = parse_markdown(text);
    let (spans, _) = code_spans(&md.prose);
    let mut lines: Vec<String> = Vec::new();
    for line in &md.code_lines {
        let continues = line.starts_with(' ') && line.trim_start().starts_with('[');
        match lines.last_mut() {
            Some(last) if continues => {
                last.push(' ');
                last.push_str(line.trim());
            }
            _ => lines.push(line.clone()),
        }
    }
    lines.extend(spans);
    let mut commands = Vec::new();
    for line in lines {
        let line = match line.find(" #") {
            Some(at) => &line[..at],
            None if line.trim_start().starts_with('#') => "",
            None => line.as_str(),
        };
        let mut depth = 0i32;
        let mut segment = String::new();
        let mut chars = line.chars().peekable();
        let mut segments = Vec::new();
        while let Some(c) = chars.next() {
            match c {
                '[' => depth += 1,
                ']' => depth -= 1,
                _ => {}
            }
            let ends = depth <= 0 && (c == ';' || c == '|' || (c == '&' && chars.peek() == Some(&'&')));
            if ends {
                if c != ';' && chars.peek() == Some(&c) {
                    chars.next();
                }
                segments.push(std::mem::take(&mut segment));
            } else {
                segment.push(c);
            }
        }
        segments.push(segment);
        for s in segments {
            let s = s.trim().trim_start_matches("$ ");
            let first = s.split_whitespace().next().unwrap_or("");
            let named = |name: &str| first == name || (first.ends_with(&format!("/{name}")) && !first.contains('='));
            if named("runtime") || named("builder") {
                commands.push(s.to_string());
            }
        }
    }
    commands
}

/// What is wrong with one shown command: a subcommand or a flag `--help` does not
/// list. Subcommands are read until the first positional word.
fn command_problems(
    command: &str,
    help: &mut std::collections::HashMap<(String, Vec<String>), HelpPage>,
) -> Vec<String> {
    let mut words = command.split_whitespace();
    let program = words.next().unwrap().rsplit('/').next().unwrap().to_string();
    let mut path: Vec<String> = Vec::new();
    let mut positional = false;
    let mut problems = Vec::new();
    let mut skip_value = false;
    for raw in words {
        if skip_value {
            skip_value = false;
            continue;
        }
        let word = raw
            .trim_start_matches(['[', '(', '`', '"', '\''])
            .trim_end_matches([']', ')', ',', ':', '.', ';', '`', '"', '\'']);
        if word == "--" {
            break;
        }
        let page = help
            .entry((program.clone(), path.clone()))
            .or_insert_with(|| help_page(&program, &path));
        if word.starts_with('-') && word.len() > 1 {
            for piece in word.split('|').filter(|p| p.starts_with('-') && p.len() > 1) {
                let (name, inline_value) = match piece.split_once('=') {
                    Some((n, _)) => (n, true),
                    None => (piece, false),
                };
                match page.flags.iter().find(|(f, _)| f == name) {
                    Some((_, takes)) => skip_value = *takes && !inline_value && !word.contains('|'),
                    None => problems.push(format!(
                        "`{command}`: `{program} {}` has no flag {name}",
                        path.join(" ")
                    )),
                }
            }
        } else if !positional && !word.contains(['|', '<', '>']) && page.subcommands.iter().any(|s| s == word) {
            path.push(word.to_string());
        } else if !word.is_empty() && word != "|" {
            if !positional && path.is_empty() && !word.starts_with('<') {
                problems.push(format!("`{command}`: `{program}` has no subcommand {word}"));
            }
            positional = true;
        }
    }
    problems
}

#[test]
fn every_link_in_the_readme_and_docs_resolves_inside_the_repository() {
    let mut problems = Vec::new();
    for (rel, text) in doc_pages() {
        problems.extend(link_problems(&rel, &text));
        for outside in ["DESIGN.md", "../shared"] {
            if text.contains(outside) {
                problems.push(format!("{rel}: names {outside}, which is outside the repository"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));

    // The check can fail: a broken file, a missing anchor, a link out.
    let bad = "# Top\n\n[a](missing.md) [b](settings.md#no-such-key) [c](https://example.com) [d](#top)\n";
    let found = link_problems("docs/x.md", &format!("{bad}[e](#nowhere)\n"));
    assert_eq!(found.len(), 4, "{found:?}");
    assert!(found.iter().any(|p| p.ends_with("#nowhere")), "{found:?}");
}

#[test]
fn every_command_and_flag_the_readme_and_docs_show_exists() {
    let mut help = std::collections::HashMap::new();
    let mut problems = Vec::new();
    let mut checked = 0;
    for (rel, text) in doc_pages() {
        for command in shown_commands(&text) {
            checked += 1;
            for p in command_problems(&command, &mut help) {
                problems.push(format!("{rel}: {p}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(checked > 100, "only {checked} commands found in the docs");

    // The check can fail: a typo'd flag, an unknown subcommand, a flag of another
    // subcommand, in a code block and in a code span.
    let bad = "```sh\nbuilder cards list --staus open\nruntime fier digest\n```\n\
               and `builder approve x --pussh`, and `runtime fire t\n--json --otlp`\n";
    let shown = shown_commands(bad);
    assert_eq!(shown.len(), 4, "{shown:?}");
    let found: Vec<String> = shown.iter().flat_map(|c| command_problems(c, &mut help)).collect();
    assert_eq!(found.len(), 4, "{found:?}");
    assert!(found.iter().any(|p| p.contains("--staus")), "{found:?}");
    assert!(found.iter().any(|p| p.contains("fier")), "{found:?}");
}
