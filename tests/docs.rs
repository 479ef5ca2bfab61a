//! Documentation in the repository (issue 13, item 10): the README's first command
//! (`./demo`) fires in a demo repository and never in the project's own history, man
//! pages for every subcommand, the systemd units verified where `systemd-analyze`
//! exists, and release builds without debug info. (The settings reference is checked
//! against the settings types by a unit test in `shared`, and every argument's help
//! text by unit tests in each binary.)

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

/// A command with the test environment of `env` (HOME, git config, identity).
fn with_env(env: &TestEnv, program: &Path) -> Command {
    let mut c = Command::new(program);
    c.env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into()))
        .env("HOME", &env.home)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1");
    c
}

fn git(env: &TestEnv, dir: &Path, args: &[&str]) -> String {
    let out = with_env(env, Path::new("git"))
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
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
    with_env(env, &project.join("demo"))
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
        eprintln!("skipped: systemd-analyze is not on PATH; the units were not verified");
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
    let mut cmd = with_env(&env, &analyze);
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
