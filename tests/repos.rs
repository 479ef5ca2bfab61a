//! Where people keep repositories (issue 13, item 3): a fire in a linked worktree
//! (`.git` is a file, the git directory lives in the main checkout), a fire from a
//! subdirectory (`-C` and the working directory), and every subcommand of both
//! binaries outside a repository: the documented exit code, a line that says so, and
//! nothing left behind.

use crate::util::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

/// Runs `bin args` with `dir` as the working directory.
fn run_in(env: &TestEnv, bin: &str, dir: &Path, args: &[&str]) -> Output {
    env.command(bin, args).current_dir(dir).output().expect("run binary")
}

/// `runtime fire <task> --json` in `dir`: (exit code, summary, stderr).
fn fire_in(env: &TestEnv, dir: &Path, extra: &[&str]) -> (i32, Value, String) {
    let mut args = extra.to_vec();
    args.extend(["fire", "digest", "--json"]);
    let out = run_in(env, "runtime", dir, &args);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let summary =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("no JSON ({e}):\nstdout: {stdout}\nstderr: {stderr}"));
    (out.status.code().unwrap_or(-1), summary, stderr)
}

/// Every entry beneath `dir` (relative paths, sorted), `.git` left out.
fn listing(dir: &Path) -> Vec<String> {
    fn go(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(base).unwrap().to_string_lossy().to_string();
            if rel == ".git" {
                continue;
            }
            out.push(rel);
            if p.is_dir() && !p.is_symlink() {
                go(base, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    go(dir, dir, &mut out);
    out.sort();
    out
}

/// A linked worktree of `env`'s repository on a new branch `wt`, made with the git CLI.
fn linked_worktree(env: &TestEnv) -> PathBuf {
    let wt = env.home.parent().unwrap().join("linked");
    env.git_ok(&env.root, &["worktree", "add", "-q", "-b", "wt", wt.to_str().unwrap()]);
    assert!(wt.join(".git").is_file(), "a linked worktree has a .git file");
    wt
}

#[test]
fn a_fire_in_a_linked_worktree_commits_on_its_branch_and_leaves_the_main_checkout_alone() {
    let env = TestEnv::new();
    let wt = linked_worktree(&env);
    let main_head = env.head_id();
    let main_files = listing(&env.root);
    let main_git = env.git_snapshot();

    let (code, summary, stderr) = fire_in(&env, &wt, &[]);
    assert_eq!(code, 0, "{summary}\n{stderr}");
    assert_eq!(summary["status"], "accepted", "{summary}");
    let commit = summary["commit"].as_str().expect("a commit");
    let branch_tip = env.git_ok(&wt, &["rev-parse", "refs/heads/wt"]);
    assert!(
        branch_tip.starts_with(commit),
        "{commit} is not the tip of wt ({branch_tip})"
    );
    assert_eq!(env.git_ok(&wt, &["rev-parse", "HEAD^"]), main_head);
    assert_eq!(
        env.git_ok(&wt, &["log", "-1", "--format=%an <%ae>"]),
        "runtime <runtime@localhost>"
    );
    for rel in [&summary["report"], &summary["receipt"]] {
        assert!(wt.join(rel.as_str().unwrap()).is_file(), "{rel} in the worktree");
    }
    assert_eq!(env.git_ok(&wt, &["status", "--porcelain"]), "", "the worktree is clean");

    // The main checkout: same branch tip, same files, same git config and hooks.
    assert_eq!(env.head_id(), main_head, "main's branch did not move");
    assert_eq!(listing(&env.root), main_files);
    assert_eq!(env.git_snapshot(), main_git);
    assert_eq!(env.git_ok(&env.root, &["status", "--porcelain"]), "");

    // The tool worker sees the repository as in a plain checkout: `git log` (the
    // example's second call) reads objects from the main checkout's git directory.
    let receipt: Value =
        serde_json::from_str(&std::fs::read_to_string(wt.join(summary["receipt"].as_str().unwrap())).unwrap()).unwrap();
    let git_log = receipt["tool_calls"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "run_command")
        .expect("the example runs git log");
    assert_eq!(git_log["outcome"], "ok", "{git_log}");
    let show = run_in(
        &env,
        "runtime",
        &wt,
        &["show", summary["run_id"].as_str().unwrap(), "--json"],
    );
    assert_eq!(show.status.code(), Some(0));
    let short = &main_head[..7];
    assert!(
        String::from_utf8_lossy(&show.stdout).contains(&format!("{short} scaffold")),
        "git log in the worktree's sandbox printed the scaffold commit"
    );
}

#[test]
fn a_linked_worktree_refuses_its_own_dirty_prompt_not_the_main_checkouts() {
    let env = TestEnv::new();
    let wt = linked_worktree(&env);
    // An edit in the main checkout is not the worktree's business.
    env.write("prompts/digest.md", "edited in main\n");
    let (code, summary, stderr) = fire_in(&env, &wt, &[]);
    assert_eq!(code, 0, "{summary}\n{stderr}");

    std::fs::write(wt.join("prompts/digest.md"), "edited in the worktree\n").unwrap();
    let out = run_in(&env, "runtime", &wt, &["fire", "digest"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("refusing to fire on unreviewed changes: prompts/digest.md"),
        "{stderr}"
    );
}

#[test]
fn a_fire_from_a_subdirectory_works_with_c_and_as_the_working_directory() {
    let env = TestEnv::new();
    let sub = env.root.join("notes/deep");
    std::fs::create_dir_all(&sub).unwrap();
    let before = env.head_id();

    let (code, summary, stderr) = fire_in(&env, &env.home, &["-C", sub.to_str().unwrap()]);
    assert_eq!(code, 0, "{summary}\n{stderr}");
    let first = summary["commit"].as_str().unwrap().to_string();
    assert!(env.root.join(summary["receipt"].as_str().unwrap()).is_file());

    let (code, summary, stderr) = fire_in(&env, &sub, &[]);
    assert_eq!(code, 0, "{summary}\n{stderr}");
    assert!(env.root.join(summary["report"].as_str().unwrap()).is_file());
    assert!(env.head_id().starts_with(summary["commit"].as_str().unwrap()));
    assert_eq!(
        env.commit_authors().len(),
        3,
        "scaffold {before} + {first} + the second fire"
    );

    // Records, state and the lock live at the root, never in the subdirectory.
    assert!(listing(&sub).is_empty(), "{:?}", listing(&sub));
    assert!(listing(&env.home).is_empty(), "{:?}", listing(&env.home));
    // Every other command resolves the same root from there.
    let out = run_in(&env, "runtime", &sub, &["runs"]);
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stdout).matches("digest").count(), 2);
    let out = run_in(&env, "builder", &sub, &["history", "runs"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).matches("digest").count(), 2);
    let out = run_in(&env, "builder", &sub, &["check"]);
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(listing(&sub).is_empty(), "{:?}", listing(&sub));
}

/// The subcommands `<bin> [<group>] --help` lists (without `help`).
fn listed_subcommands(env: &TestEnv, bin: &str, group: &[&str]) -> Vec<String> {
    let mut args = group.to_vec();
    args.push("--help");
    let out = env.command(bin, &args).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout).to_string();
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn every_subcommand_outside_a_repository_exits_as_documented_and_leaves_nothing() {
    let env = TestEnv::new();
    let outside = env.home.parent().unwrap().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let ceiling = env.home.parent().unwrap().to_str().unwrap().to_string();
    // (binary, arguments, exit code): every subcommand; those that need a repository
    // exit 1 saying so; printing completions or the man page needs none.
    let cases: &[(&str, &[&str], i32)] = &[
        ("runtime", &["fire", "digest"], 1),
        ("runtime", &["fire", "digest", "--json"], 1),
        ("runtime", &["resume", "20261129T101042Z-f0c37453"], 1),
        ("runtime", &["runs"], 1),
        ("runtime", &["show", "20261129T101042Z-f0c37453"], 1),
        ("runtime", &["check"], 1),
        ("runtime", &["completions", "bash"], 0),
        ("runtime", &["man"], 0),
        ("builder", &["check"], 1),
        ("builder", &["cards", "list"], 1),
        ("builder", &["cards", "show", "0123456789abcdef"], 1),
        ("builder", &["cards", "triage", "0123456789abcdef", "--accept"], 1),
        ("builder", &["cards", "export"], 1),
        ("builder", &["history", "index"], 1),
        ("builder", &["history", "runs"], 1),
        ("builder", &["history", "show", "r1"], 1),
        ("builder", &["history", "diff", "r1", "r2"], 1),
        ("builder", &["history", "compare", "digest", "--before", "HEAD"], 1),
        ("builder", &["retro"], 1),
        ("builder", &["watch"], 1),
        ("builder", &["audit"], 1),
        ("builder", &["approve-call", "r1", "call_1"], 1),
        ("builder", &["propose", "tighter-scope"], 1),
        ("builder", &["proposals"], 1),
        ("builder", &["approve", "tighter-scope"], 1),
        ("builder", &["merge", "tighter-scope"], 1),
        ("builder", &["land", "tighter-scope"], 1),
        ("builder", &["install-hooks"], 1),
        ("builder", &["eval"], 1),
        ("builder", &["review", "tighter-scope"], 1),
        ("builder", &["serve", "--port", "0"], 1),
        ("builder", &["mcp", "pin"], 1),
        ("builder", &["completions", "bash"], 0),
        ("builder", &["man"], 0),
    ];
    // `builder init` is left out on purpose: making a repository there is its job.
    for (bin, group) in [
        ("runtime", &[][..]),
        ("builder", &[][..]),
        ("builder", &["cards"][..]),
        ("builder", &["history"][..]),
        ("builder", &["mcp"][..]),
    ] {
        for sub in listed_subcommands(&env, bin, group) {
            let mut path = group.to_vec();
            path.push(&sub);
            let covered = (bin, group) == ("builder", &[][..]) && sub == "init"
                || cases.iter().any(|(b, a, _)| *b == bin && a.starts_with(&path));
            assert!(covered, "`{bin} {}` is not covered here", path.join(" "));
        }
    }
    for (bin, args, code) in cases {
        for with_c in [false, true] {
            let mut full: Vec<&str> = Vec::new();
            if with_c {
                full.extend(["-C", outside.to_str().unwrap()]);
            }
            full.extend(args.iter());
            let out = env
                .command(bin, &full)
                .current_dir(if with_c { &env.home } else { &outside })
                .env("GIT_CEILING_DIRECTORIES", &ceiling)
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            let shown = format!("{bin} {}", full.join(" "));
            assert_eq!(out.status.code(), Some(*code), "{shown}: {stderr}");
            if *code == 1 {
                let first = stderr.lines().next().unwrap_or("");
                assert!(
                    first.starts_with("error: ") && first.contains("not a git repository"),
                    "{shown}: {stderr}"
                );
                assert!(
                    out.stdout.is_empty(),
                    "{shown} printed {:?}",
                    String::from_utf8_lossy(&out.stdout)
                );
            }
            assert!(listing(&outside).is_empty(), "{shown} left {:?}", listing(&outside));
            assert!(
                listing(&env.home).is_empty(),
                "{shown} left {:?} in HOME",
                listing(&env.home)
            );
        }
    }
}

#[test]
fn runtime_check_outside_a_repository_says_so_and_prints_no_sandbox_facts() {
    let env = TestEnv::new();
    let outside = env.home.parent().unwrap().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let out = env
        .command("runtime", &["check"])
        .current_dir(&outside)
        .env("GIT_CEILING_DIRECTORIES", env.home.parent().unwrap())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let canon = outside.canonicalize().unwrap();
    assert!(
        stderr.starts_with(&format!("error: {}: not a git repository", canon.display())),
        "{stderr}"
    );
    assert!(
        stderr.contains("hint: run inside an agent repository or pass -C <repo>"),
        "{stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "no ABI line: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(listing(&outside).is_empty());
}
