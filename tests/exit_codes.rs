//! The exit-code table (docs/design.md, issue 9): each situation cron or a
//! person can meet, with the exact code and a line of stderr that says what went
//! wrong. Only a bug may exit 70; the forced internal error uses the binaries'
//! test-only hook (`*_TEST_FORCE_INTERNAL_ERROR`, honoured in debug builds only).
//! Rows that need a read-only or full file system run the binary in a private mount
//! namespace (`unshare -m`), so they work as root, for whom chmod protects nothing.

use crate::skip::Capability;
use crate::util::*;
use std::path::Path;
use std::process::{Command, Output};

/// One situation: what we ran, the exit code it must have, and text that one line
/// of its stderr must contain.
struct Row {
    situation: &'static str,
    code: i32,
    line: String,
    out: Output,
}

fn row(situation: &'static str, code: i32, line: impl Into<String>, out: Output) -> Row {
    Row {
        situation,
        code,
        line: line.into(),
        out,
    }
}

/// Checks every row and reports all mismatches at once.
fn check(rows: Vec<Row>) {
    let mut wrong = Vec::new();
    for r in &rows {
        let stderr = String::from_utf8_lossy(&r.out.stderr);
        let code = r.out.status.code().unwrap_or(-1);
        let has_line = stderr.lines().any(|l| l.contains(&r.line));
        println!("{:>3}  {}", code, r.situation);
        if code != r.code || !has_line {
            let bug_only = if code == 70 { " (70 is for bugs only)" } else { "" };
            wrong.push(format!(
                "{}: expected exit {} and a stderr line containing {:?}; got exit {code}{bug_only}, stderr:\n{stderr}",
                r.situation, r.code, r.line
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

/// A repo whose task `t` talks to `server` (OpenAI wire), committed.
fn env_with_server(server: &ModelServer) -> TestEnv {
    let env = TestEnv::new();
    let fast = "limits:\n  retry_base_ms: 10\n  request_timeout_s: 2\n  max_retries: 0\n";
    env.write(
        "settings/runtime.yaml",
        &settings_yaml(&server.provider_yaml(Wire::OpenAi), fast),
    );
    env.write("prompts/t.md", PLAIN_PROMPT);
    env.commit_all("test settings");
    env
}

/// Holds an exclusive flock on `path` until dropped, as a running fire does.
struct Flock {
    _file: std::fs::File,
}

fn flock(path: &Path) -> Flock {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap();
    let taken = kernel::fs::lock_exclusive(&f, kernel::fs::Wait::No);
    assert!(matches!(taken, Ok(true)), "could not take {}", path.display());
    Flock { _file: f }
}

/// Can this machine give a child a private mount namespace? (`None`: yes.)
pub(crate) fn no_mount_namespace() -> Option<String> {
    match Command::new("unshare").args(["-m", "true"]).output() {
        Ok(o) if o.status.success() => None,
        Ok(o) => Some(format!(
            "`unshare -m` fails here: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => Some(format!("`unshare` is not available: {e}")),
    }
}

/// Runs `cmd` in a private mount namespace after the shell `setup` (which sees the
/// repository as `$0`); variables and directory stay those of `cmd`.
pub(crate) fn in_namespace(env: &TestEnv, setup: &str, cmd: &Command) -> Output {
    let mut c = Command::new("unshare");
    c.args(["-m", "sh", "-c", &format!("{setup} && exec \"$@\"")])
        .arg(&env.root)
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .env_clear();
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            c.env(k, v);
        }
    }
    if let Some(d) = cmd.get_current_dir() {
        c.current_dir(d);
    }
    c.output().expect("run unshare")
}

const READ_ONLY: &str = "mount --bind -o ro \"$0\" \"$0\"";
const FULL_DISK: &str =
    "mkdir -p \"$0/.runtime\" && mount -t tmpfs -o size=64k tmpfs \"$0/.runtime\" && { dd if=/dev/zero of=\"$0/.runtime/fill\" bs=4k 2>/dev/null || true; }";

#[test]
fn exit_code_table() {
    let env = TestEnv::new();
    let outside = env.home.to_str().unwrap().to_string();
    let missing = env.home.join("no/such/dir");
    let missing = missing.to_str().unwrap();
    let mut rows = vec![
        row(
            "builder outside a git repository",
            1,
            "not a git repository",
            env.builder(&["-C", &outside, "cards", "list"]),
        ),
        row(
            "runtime outside a git repository",
            1,
            "not a git repository",
            env.runtime(&["-C", &outside, "fire", "digest"]),
        ),
        row(
            "runtime -C to a missing directory",
            1,
            format!("error: {missing}: No such file or directory"),
            env.runtime(&["-C", missing, "fire", "digest"]),
        ),
        row(
            "builder -C to a missing directory",
            1,
            format!("error: {missing}: No such file or directory"),
            env.builder(&["-C", missing, "history", "runs"]),
        ),
        row(
            "triage without a decision",
            2,
            "hint: say what you decided: --accept, --reject",
            env.builder(&["cards", "triage", "0123456789abcdef"]),
        ),
        row(
            "compare with a bad revision",
            2,
            "error: --before no-such-rev: not a commit in this repository",
            env.builder(&["history", "compare", "digest", "--before", "no-such-rev"]),
        ),
        row(
            "an unknown --status on cards list",
            2,
            "error: invalid value 'bogus' for '--status",
            env.builder(&["cards", "list", "--status", "bogus"]),
        ),
        row(
            "an unknown --status on history runs",
            2,
            "error: invalid value 'bogus' for '--status",
            env.builder(&["history", "runs", "--status", "bogus"]),
        ),
        row(
            "a typo'd task name",
            2,
            "error: no task `digets`: prompts/digets.md does not exist",
            env.runtime(&["fire", "digets"]),
        ),
        row(
            "no git identity for a triage",
            2,
            "who is acting?",
            env.command("builder", &["cards", "triage", "0123456789abcdef", "--accept"])
                .env_remove("GIT_AUTHOR_NAME")
                .env_remove("GIT_AUTHOR_EMAIL")
                .output()
                .unwrap(),
        ),
    ];
    if cfg!(debug_assertions) {
        rows.push(row(
            "builder: a forced internal error",
            70,
            "error: forced by BUILDER_TEST_FORCE_INTERNAL_ERROR",
            env.command("builder", &["check"])
                .env("BUILDER_TEST_FORCE_INTERNAL_ERROR", "1")
                .output()
                .unwrap(),
        ));
        rows.push(row(
            "runtime: a forced internal error",
            70,
            "error: forced by RUNTIME_TEST_FORCE_INTERNAL_ERROR",
            env.command("runtime", &["runs"])
                .env("RUNTIME_TEST_FORCE_INTERNAL_ERROR", "1")
                .output()
                .unwrap(),
        ));
    } else {
        crate::skip::skip(
            Capability::DebugHooks,
            "the forced internal error rows: the hook exists in debug builds only",
        );
    }

    let bad = TestEnv::new();
    bad.write("settings/runtime.yaml", "version: 1\nprovider: [unclosed\n");
    bad.commit_all("break the settings");
    rows.push(row(
        "bad settings YAML (fire)",
        2,
        "error: invalid settings: settings/runtime.yaml:",
        bad.runtime(&["fire", "digest"]),
    ));
    rows.push(row(
        "bad settings YAML (audit)",
        2,
        "settings/runtime.yaml:",
        bad.builder(&["audit"]),
    ));

    let server = ModelServer::start(vec![Reply::status(401, "{\"error\":\"bad key\"}")]);
    let failing = env_with_server(&server);
    rows.push(row(
        "a fire that fails (provider error)",
        1,
        "error: t failed (provider_error)",
        failing.runtime(&["fire", "t"]),
    ));

    let busy = TestEnv::new();
    let lock = busy.root.join(".runtime/locks/digest.lock");
    let held = flock(&lock);
    rows.push(row(
        "a skipped fire (-v)",
        3,
        "skipped: another fire of this task holds the lock",
        busy.runtime(&["-v", "fire", "digest"]),
    ));
    let quiet = busy.runtime(&["fire", "digest"]);
    assert_eq!(quiet.status.code(), Some(3));
    // A lock held only for a moment (a process a killed fire had just forked) is
    // waited for, not skipped on.
    drop(held);
    let moment = flock(&lock);
    let released = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(60));
        drop(moment);
    });
    let fired = busy.runtime(&["fire", "digest"]);
    released.join().unwrap();
    assert_eq!(
        fired.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&fired.stderr)
    );
    assert!(
        quiet.stderr.is_empty(),
        "a skip prints nothing unless -v: {}",
        String::from_utf8_lossy(&quiet.stderr)
    );

    check(rows);
}

/// Rows that need a private mount namespace: a read-only repository, a full disk.
#[test]
fn exit_code_table_read_only_and_full_disk() {
    if let Some(why) = no_mount_namespace() {
        crate::skip::skip(Capability::MountNamespace, &why);
        return;
    }
    let ro = TestEnv::new();
    let full = TestEnv::new();
    check(vec![
        row(
            "a read-only repository (builder)",
            1,
            "Read-only file system",
            in_namespace(&ro, READ_ONLY, &ro.command("builder", &["cards", "list"])),
        ),
        row(
            "a full disk (builder)",
            1,
            "hint: the disk is full",
            in_namespace(&full, FULL_DISK, &full.command("builder", &["cards", "list"])),
        ),
    ]);
}

/// Rows where the fire meets the machine: a held git lock, a read-only repository.
#[test]
fn exit_code_table_fire_environment() {
    let locked = TestEnv::new();
    std::fs::write(locked.root.join(".git/index.lock"), "").unwrap();
    let mut rows = vec![row(
        "a held git index.lock during a fire",
        1,
        ".git/index.lock",
        locked.runtime(&["fire", "digest"]),
    )];
    match no_mount_namespace() {
        None => {
            let ro = TestEnv::new();
            rows.push(row(
                "a read-only repository (fire)",
                1,
                "Read-only file system",
                in_namespace(&ro, READ_ONLY, &ro.command("runtime", &["fire", "digest"])),
            ));
        }
        Some(why) => crate::skip::skip(Capability::MountNamespace, &format!("the read-only fire row: {why}")),
    }
    check(rows);
}

#[test]
fn help_lists_every_exit_code() {
    let env = TestEnv::new();
    for (args, codes) in [
        (vec!["fire", "--help"], &[0, 1, 2, 3, 4, 5, 70][..]),
        (vec!["--help"], &[0, 1, 2, 3, 4, 5, 70][..]),
    ] {
        let out = env.runtime(&args);
        let text = String::from_utf8_lossy(&out.stdout);
        for c in codes {
            assert!(
                text.lines().any(|l| l.trim_start().starts_with(&format!("{c}  "))),
                "runtime {args:?} does not list exit code {c}:\n{text}"
            );
        }
    }
    let out = env.builder(&["--help"]);
    let text = String::from_utf8_lossy(&out.stdout);
    for c in [0, 1, 2, 70] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(&format!("{c}  "))),
            "builder --help does not list exit code {c}:\n{text}"
        );
    }
}

/// A reader that goes away (`runtime fire t --json | head -c 100`, a closed pipe
/// under cron) ends what a fire prints, not the fire: it still commits and exits with
/// its own code, and nothing panics (Rust's `println!` would, with exit 101, since a
/// fire ignores SIGPIPE). Other commands end as Unix tools do, by SIGPIPE.
#[test]
fn a_closed_stdout_ends_the_output_not_the_command() {
    use std::os::unix::process::ExitStatusExt;
    let env = TestEnv::new();
    let closed = || {
        let (read, write) = std::io::pipe().unwrap();
        drop(read);
        write
    };
    let before = git_commits(&env);
    let fire = env
        .command("runtime", &["fire", "digest", "--json"])
        .stdout(closed())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&fire.stderr);
    assert_eq!(fire.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(git_commits(&env), before + 1, "the fire's records are committed");
    let runs = env.command("runtime", &["runs"]).stdout(closed()).output().unwrap();
    let stderr = String::from_utf8_lossy(&runs.stderr);
    assert_eq!(
        runs.status.signal(),
        Some(13),
        "runs ends by SIGPIPE: {:?} {stderr}",
        runs.status
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

fn git_commits(env: &TestEnv) -> usize {
    let repo = git2::Repository::open(&env.root).unwrap();
    let mut walk = repo.revwalk().unwrap();
    walk.push_head().unwrap();
    walk.count()
}
