//! Isolation beyond Landlock (issue 10): namespaces and seccomp, tried through real
//! `runtime fire`s with a permissive policy (`Bash(*)`), so only the kernel layer
//! stands. Each payload is a script file under `reports/` run with the system
//! interpreter (the policy cannot see into it); it first writes a marker proving it
//! ran, then records what the kernel answered. Every case also checks that builder
//! files kept their content, mode, owner and times, that `.git` is unchanged, that
//! TCP, UDP and UNIX listeners outside the sandbox heard nothing, that the key is in
//! no record, and that the fire committed its own records.

use crate::skip::Capability;
use crate::util::*;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixListener;
use std::path::Path;

pub(crate) fn trace(calls: &[(&str, Value)]) -> String {
    let mut turns: Vec<Value> = calls
        .iter()
        .enumerate()
        .map(|(i, (name, args))| {
            json!({"tool_calls": [{"id": format!("c{i}"), "name": name, "arguments": args}], "usage": {"input": 10, "output": 5}})
        })
        .collect();
    turns.push(json!({"content": "# Done", "usage": {"input": 10, "output": 5}}));
    json!({"version": 1, "turns": turns}).to_string()
}

pub(crate) const SETTINGS: &str = "version: 1\nprovider:\n  kind: replay\n  replay: evals/iso/trace.json\npermissions:\n  allow: [\"Bash(*)\", \"Read(**)\", \"Write(reports/**)\"]\n  deny: [\"Read(**/.env)\"]\n  write: [\"reports/**\"]\nsandbox:\n  landlock: required\nbudgets:\n  max_steps: 10\nlimits:\n  max_denials: 10\n  repeated_call: 10\n  repeated_error: 10\n";

/// Mode, owner and modification time of every builder file and git hook.
pub(crate) fn metadata(root: &Path) -> BTreeMap<String, (u32, u32, u32, i64)> {
    let mut out = BTreeMap::new();
    let mut stack: Vec<_> = [
        "prompts",
        "settings",
        "tools",
        "scope",
        "evals",
        ".git/hooks",
        ".git/config",
    ]
    .iter()
    .map(|d| root.join(d))
    .collect();
    while let Some(p) = stack.pop() {
        let Ok(md) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        out.insert(
            p.strip_prefix(root).unwrap().to_string_lossy().to_string(),
            (md.mode(), md.uid(), md.gid(), md.mtime()),
        );
        if md.is_dir() {
            for e in std::fs::read_dir(&p).unwrap().flatten() {
                stack.push(e.path());
            }
        }
    }
    out
}

/// Listeners outside the sandbox that must hear nothing.
pub(crate) struct Listeners {
    tcp: TcpListener,
    udp: UdpSocket,
    unix: UnixListener,
    unix_path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Listeners {
    pub(crate) fn new() -> Listeners {
        let dir = tempfile::tempdir().unwrap();
        let unix_path = dir.path().join("host.sock");
        let l = Listeners {
            tcp: TcpListener::bind("127.0.0.1:0").unwrap(),
            udp: UdpSocket::bind("127.0.0.1:0").unwrap(),
            unix: UnixListener::bind(&unix_path).unwrap(),
            unix_path,
            _dir: dir,
        };
        l.tcp.set_nonblocking(true).unwrap();
        l.udp.set_nonblocking(true).unwrap();
        l.unix.set_nonblocking(true).unwrap();
        std::fs::set_permissions(l._dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        std::fs::set_permissions(&l.unix_path, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        l
    }

    fn assert_silent(&self, case: &str) {
        assert!(
            self.tcp.accept().is_err(),
            "{case}: the TCP listener heard a connection"
        );
        assert!(
            self.udp.recv(&mut [0u8; 64]).is_err(),
            "{case}: the UDP listener heard a datagram"
        );
        assert!(
            self.unix.accept().is_err(),
            "{case}: the UNIX listener heard a connection"
        );
    }
}

/// Who fires: the test's own user (root in CI), or `nobody` through `setpriv` on a
/// repository handed to it for the fire.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum As {
    Me,
    Nobody,
}

/// Hands the tree at `root` to `uid` (ownership of every entry, links not followed).
pub(crate) fn chown_tree(root: &Path, uid: u32) {
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        std::os::unix::fs::lchown(&p, Some(uid), Some(uid)).unwrap();
        if p.symlink_metadata().unwrap().is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
        }
    }
}

/// The repository and the directories above it become nobody's to use.
pub(crate) fn hand_to_nobody(env: &TestEnv) {
    chown_tree(&env.root, 65534);
    let mut up = env.root.parent();
    while let Some(d) = up.filter(|d| d.starts_with(std::env::temp_dir()) && *d != std::env::temp_dir()) {
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        up = d.parent();
    }
}

pub(crate) fn am_root() -> bool {
    kernel::process::is_root()
}

/// `runtime fire t --json` as `who`.
fn fire_as(env: &TestEnv, who: As, extra: &[(&str, &str)]) -> std::process::Output {
    fire_command(env, who, extra).output().unwrap()
}

/// The command of `runtime fire t --json` as `who` (through `setpriv` for `nobody`,
/// which execs the runtime: the child's pid is the runtime's).
pub(crate) fn fire_command(env: &TestEnv, who: As, extra: &[(&str, &str)]) -> std::process::Command {
    let mut c = env.command("runtime", &["fire", "t", "--json"]);
    c.env("PATH", "/usr/local/bin:/usr/bin:/bin");
    for (k, v) in extra {
        c.env(k, v);
    }
    if who == As::Me {
        return c;
    }
    as_nobody(&c, env)
}

/// `c` run as uid 65534 (`setpriv`) in the repository, with `c`'s variables and the
/// repository as its `HOME`.
pub(crate) fn as_nobody(c: &std::process::Command, env: &TestEnv) -> std::process::Command {
    let mut wrapped = std::process::Command::new("setpriv");
    wrapped
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(c.get_program())
        .args(c.get_args())
        .current_dir(&env.root)
        .env_clear();
    for (k, v) in c.get_envs() {
        if let Some(v) = v {
            wrapped.env(k, v);
        }
    }
    wrapped.env("HOME", &env.root);
    wrapped
}

/// Fires once with `script` written to `reports/p.<ext>` and run by `interp`, then
/// `after` (more commands in the same fire); returns the markers the payload left in
/// `reports/m/` and the fire's summary.
/// A payload: its case name, its script (`reports/p.<ext>`, run by `interp`), and
/// commands run after it in the same fire.
pub(crate) struct Payload<'a> {
    pub case: &'a str,
    pub ext: &'a str,
    pub interp: &'a str,
    pub script: &'a str,
    pub after: &'a [&'a str],
    /// `settings/runtime.yaml` when not [`SETTINGS`].
    pub settings: Option<&'a str>,
}

pub(crate) fn fire_payload(who: As, env: &TestEnv, l: &Listeners, p: &Payload) -> (BTreeMap<String, String>, Value) {
    let Payload {
        case,
        ext,
        interp,
        script,
        after,
        settings,
    } = *p;
    let _ = std::fs::remove_dir_all(env.root.join("reports/m"));
    let script = script
        .replace("@TCP@", &l.tcp.local_addr().unwrap().port().to_string())
        .replace("@UDP@", &l.udp.local_addr().unwrap().port().to_string())
        .replace("@UNIX@", &l.unix_path.to_string_lossy())
        .replace("@ROOT@", &env.root.to_string_lossy());
    let mut calls = vec![
        ("run_command", json!({"command": "mkdir -p reports/m"})),
        (
            "write_file",
            json!({"path": format!("reports/p.{ext}"), "content": script}),
        ),
        ("run_command", json!({"command": format!("{interp} reports/p.{ext}")})),
    ];
    for a in after {
        calls.push(("run_command", json!({ "command": a })));
    }
    env.write("settings/runtime.yaml", settings.unwrap_or(SETTINGS));
    env.write("evals/iso/trace.json", &trace(&calls));
    env.commit_all(&format!("case {case}"));
    if who == As::Nobody {
        hand_to_nobody(env);
    }
    let meta = metadata(&env.root);
    let files = env.builder_snapshot();
    let git = env.git_snapshot();
    let out = fire_as(env, who, &[("SECOND_SECRET", "planted-second-secret-5150")]);
    let meta_after = metadata(&env.root);
    if who == As::Nobody {
        // Back to the test's user, whose git library checks the owner.
        chown_tree(&env.root, 0);
    }
    let summary: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{case}: no JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(env.builder_snapshot(), files, "{case}: a builder file changed");
    assert_eq!(meta_after, meta, "{case}: a mode, owner or time changed");
    assert_eq!(env.git_snapshot(), git, "{case}: .git config, hooks or refs changed");
    assert_eq!(
        env.commit_authors()[0],
        "runtime",
        "{case}: the fire did not commit its records"
    );
    l.assert_silent(case);
    let records = env.all_record_text();
    assert!(!records.contains(TEST_KEY), "{case}: the key reached a record");
    assert!(
        !records.contains("planted-second-secret"),
        "{case}: the second secret reached a record"
    );
    let mut markers = BTreeMap::new();
    if let Ok(dir) = std::fs::read_dir(env.root.join("reports/m")) {
        for e in dir.flatten() {
            markers.insert(
                e.file_name().to_string_lossy().to_string(),
                std::fs::read_to_string(e.path()).unwrap_or_default().trim().to_string(),
            );
        }
    }
    assert_eq!(
        markers.get("ran").map(String::as_str),
        Some("ran"),
        "{case}: the payload never ran: {markers:?} {summary}"
    );
    (markers, summary)
}

pub(crate) fn env_with_prompt() -> TestEnv {
    let env = TestEnv::new();
    env.write("prompts/t.md", PLAIN_PROMPT);
    env.write(".env", "PLANTED_DOTENV=dotenv-secret-77\n");
    env
}

pub(crate) fn kernel_ready() -> bool {
    let abi = shared::sandbox::landlock::kernel_abi();
    if abi < shared::sandbox::landlock::TARGET_ABI as u32 {
        crate::skip::skip(Capability::Landlock, &format!("Landlock ABI {abi} is below the target"));
        return false;
    }
    true
}

const PROBE: &str = r#"echo ran > reports/m/ran
id -u > reports/m/uid
grep CapEff /proc/self/status | tr -d ' \t' > reports/m/capeff
ls /proc | grep -c '^[0-9]' > reports/m/procs
tr '\0' ' ' < /proc/1/cmdline > reports/m/init
if grep -qs -e SUPERSECRET -e planted-second /proc/[0-9]*/environ; then echo found > reports/m/environ; else echo absent > reports/m/environ; fi
if test -e "$PLANTED"; then echo visible > reports/m/tmp; else echo hidden > reports/m/tmp; fi
cat .env > reports/m/dotenv 2>&1
touch .git/hooks/new-hook 2> reports/m/githook; echo $? >> reports/m/githook
chmod 000 prompts/t.md 2> reports/m/chmod; echo $? >> reports/m/chmod
touch -d 2001-01-01 prompts/t.md 2> reports/m/utime; echo $? >> reports/m/utime
chmod -x .git/hooks/* 2>> reports/m/hookmode; echo $? >> reports/m/hookmode
chown 0:0 prompts/t.md 2> reports/m/chown; echo $? >> reports/m/chown
/usr/bin/python3 -c "import os; os.setxattr('.git/hooks/pre-push', 'user.x', b'1')" 2> reports/m/xattr; echo $? >> reports/m/xattr
mknod reports/m/null c 1 3 2> reports/m/mknod; echo $? >> reports/m/mknod
prlimit --pid 1 --nofile=1:1 2> reports/m/prlimit; echo $? >> reports/m/prlimit
"#;

#[test]
fn a_tool_sees_its_own_namespaces_and_changes_no_metadata() {
    probe_case(As::Me);
}

#[test]
fn a_tool_sees_its_own_namespaces_when_the_runtime_is_not_root() {
    if am_root() {
        probe_case(As::Nobody);
    } else {
        probe_case(As::Me);
    }
}

fn probe_case(who: As) {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    let l = Listeners::new();
    let planted = tempfile::NamedTempFile::new().unwrap();
    let script = format!("PLANTED={}\n{PROBE}", planted.path().display());
    let (m, summary) = fire_payload(
        who,
        &env,
        &l,
        &Payload {
            case: "probe",
            ext: "sh",
            interp: "/bin/sh",
            script: &script,
            after: &[],
            settings: None,
        },
    );
    if am_root() {
        assert_eq!(m["uid"], "65534", "{m:?}");
    } else {
        assert_eq!(m["uid"], kernel::process::effective_uid().to_string());
    }
    assert_eq!(m["capeff"], "CapEff:0000000000000000", "{m:?}");
    let procs: usize = m["procs"].parse().unwrap();
    assert!(procs <= 6, "own /proc shows only the worker's processes: {m:?}");
    assert!(
        m["init"].contains(shared::worker::WORKER_COMMAND),
        "PID 1 is the worker: {m:?}"
    );
    assert_eq!(m["environ"], "absent", "{m:?}");
    assert_eq!(m["tmp"], "hidden", "the host /tmp is replaced: {m:?}");
    assert!(
        !m["dotenv"].contains("dotenv-secret"),
        "a Read deny path is masked: {m:?}"
    );
    for k in [
        "githook", "chmod", "chown", "xattr", "utime", "hookmode", "mknod", "prlimit",
    ] {
        assert!(!m[k].ends_with("\n0") && m[k] != "0", "{k} was allowed: {m:?}");
    }
    assert!(m["chmod"].contains("Read-only file system"), "{m:?}");
    assert!(m["xattr"].contains("Read-only file system"), "{m:?}");
    assert!(m["mknod"].contains("Operation not permitted"), "{m:?}");
    assert!(m["prlimit"].contains("Operation not permitted"), "{m:?}");
    assert!(!env.root.join("reports/m/null").exists());
    assert!(!env.root.join(".git/hooks/new-hook").exists());
    let receipt = env.receipt(&summary);
    let rights = receipt["sandbox"]["rights"].to_string();
    assert!(
        rights.contains("namespaces: user, mount, pid, ipc, net") && rights.contains("seccomp"),
        "{rights}"
    );
}

#[test]
fn sockets_leave_nothing_outside() {
    sockets_case(As::Me);
}

#[test]
fn sockets_leave_nothing_outside_when_the_runtime_is_not_root() {
    if am_root() {
        sockets_case(As::Nobody);
    }
}

fn sockets_case(who: As) {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    let l = Listeners::new();
    let script = r#"use Socket;
open(my $m, '>', 'reports/m/ran'); print $m "ran\n"; close $m;
sub mark { my ($n, $v) = @_; open(my $f, '>', "reports/m/$n"); print $f "$v\n"; close $f; }
socket(my $u, PF_UNIX, SOCK_STREAM, 0) or die;
mark('unix', connect($u, pack_sockaddr_un('@UNIX@')) ? 'connected' : "refused $!");
if (socket(my $d, PF_INET, SOCK_DGRAM, 0)) {
  mark('udp', send($d, 'x', 0, pack_sockaddr_in(@UDP@, inet_aton('127.0.0.1'))) ? 'sent' : "refused $!");
} else { mark('udp', "refused $!"); }
if (socket(my $t, PF_INET, SOCK_STREAM, 0)) {
  mark('tcp', connect($t, pack_sockaddr_in(@TCP@, inet_aton('127.0.0.1'))) ? 'connected' : "refused $!");
} else { mark('tcp', "refused $!"); }
mark('raw', socket(my $r, PF_INET, SOCK_RAW, 1) ? 'opened' : "refused $!");
mark('dns', gethostbyname('example.com') ? 'resolved' : 'failed');
"#;
    let (m, _) = fire_payload(
        who,
        &env,
        &l,
        &Payload {
            case: "sockets",
            ext: "pl",
            interp: "/usr/bin/perl",
            script,
            after: &[],
            settings: None,
        },
    );
    for k in ["unix", "udp", "tcp", "raw"] {
        assert!(m[k].starts_with("refused"), "{k}: {m:?}");
    }
    assert_eq!(m["dns"], "failed", "{m:?}");
    assert!(
        m["udp"].contains("Operation not permitted"),
        "seccomp refuses UDP: {m:?}"
    );
}

#[test]
fn nothing_a_call_started_outlives_it() {
    outlive_case(As::Me);
}

#[test]
fn nothing_a_call_started_outlives_it_when_the_runtime_is_not_root() {
    if am_root() {
        outlive_case(As::Nobody);
    }
}

fn outlive_case(who: As) {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    let l = Listeners::new();
    // Leaves its session and process group twice over, then writes a marker a second
    // later; the next call looks for the marker two seconds on.
    let script = "echo ran > reports/m/ran\nsetsid sh -c '(sleep 1; echo alive > reports/m/late) &' < /dev/null > /dev/null 2>&1 &\n";
    let (m, _) = fire_payload(
        who,
        &env,
        &l,
        &Payload {
            case: "setsid",
            ext: "sh",
            interp: "/bin/sh",
            script,
            after: &[
                "sleep 2.5; if test -e reports/m/late; then echo survived; else echo gone; fi > reports/m/verdict",
            ],
            settings: None,
        },
    );
    assert_eq!(m["verdict"], "gone", "{m:?}");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    assert!(!env.root.join("reports/m/late").exists(), "a process outlived the fire");
}

/// In the sandbox commands are spawned with `posix_spawn`, which, unlike `execvp`,
/// does not run a file without `#!` as a shell script; and a command that sends its
/// output elsewhere closes its streams long before it exits.
#[test]
fn a_sandboxed_command_runs_a_plain_script_and_keeps_to_its_deadline() {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    let l = Listeners::new();
    let script = "echo ran > reports/m/ran\nprintf 'echo plain > reports/m/plain\\n' > reports/plain.sh\nchmod +x reports/plain.sh\n";
    let (m, summary) = fire_payload(
        As::Me,
        &env,
        &l,
        &Payload {
            case: "no #! and a quiet sleep",
            ext: "sh",
            interp: "/bin/sh",
            script,
            after: &[
                "reports/plain.sh",
                "date +%s%N > reports/m/before",
                "exec sleep 20 >/dev/null 2>&1",
                "date +%s%N > reports/m/after",
            ],
            settings: Some(&SETTINGS.replace("limits:", "limits:\n  tool_timeout_s: 1")),
        },
    );
    assert_eq!(m.get("plain").map(String::as_str), Some("plain"), "{m:?} {summary}");
    let took_ms = (m["after"].parse::<u128>().unwrap() - m["before"].parse::<u128>().unwrap()) / 1_000_000;
    assert!(
        (900..4_000).contains(&took_ms),
        "the quiet sleep was not killed at its 1 s deadline: {took_ms} ms {summary}"
    );
}

/// A link one fire's tool leaves in a write directory must not turn a later fire's
/// write directory into a builder directory: the runtime made the missing levels
/// through the link (as root) and the worker's overlay took the link's target as its
/// lower layer, so a tool's write reached `prompts/` on the host.
#[test]
fn a_link_left_in_a_write_directory_is_not_a_later_fires_write_directory() {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    let l = Listeners::new();
    let (m, summary) = fire_payload(
        As::Me,
        &env,
        &l,
        &Payload {
            case: "link left in reports",
            ext: "sh",
            interp: "/bin/sh",
            script: "echo ran > reports/m/ran\nln -s ../prompts reports/daily\n",
            after: &[],
            settings: None,
        },
    );
    assert_eq!(m["ran"], "ran", "{summary}");
    let left = env.root.join("reports/daily");
    // The link reached the host (the card names it); the fire's end removed it, as
    // its tools made it, but a fire killed before its end leaves it: put back here as
    // such a fire would.
    let detail = crate::records_hardening::rejected_detail(&env, &summary);
    assert!(
        detail.contains("reports/daily: not a regular file (symlink)"),
        "{detail}"
    );
    if std::fs::symlink_metadata(&left).is_err() {
        std::os::unix::fs::symlink("../prompts", &left).unwrap();
    }
    // The next fire writes under the link.
    let calls = [(
        "run_command",
        json!({"command": "d=reports/daily/x; echo planted > $d/evil.md"}),
    )];
    env.write(
        "settings/runtime.yaml",
        &SETTINGS.replace("write: [\"reports/**\"]", "write: [\"reports/daily/x/**\"]"),
    );
    env.write("evals/iso/trace.json", &trace(&calls));
    env.commit_all("write under the link");
    let out = fire_as(&env, As::Me, &[]);
    let summary: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    assert!(
        !env.root.join("prompts/x").exists(),
        "a write directory was made through the link: {summary}"
    );
    assert_ne!(summary["exit_code"], 0, "{summary}");
    assert!(
        env.card_kinds(&summary).contains(&"sandbox_unavailable".to_string()),
        "{summary}"
    );
    let cards = env.cards(&summary);
    let text = serde_yaml::to_string(&cards).unwrap();
    assert!(text.contains("symbolic link"), "the card does not say why: {text}");
}

/// The repository's own `.git` may be a link (to a git directory kept elsewhere):
/// only the write directories are refused through links.
#[test]
fn a_repository_whose_git_directory_is_a_link_still_fires() {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    env.write("settings/runtime.yaml", SETTINGS);
    env.write(
        "evals/iso/trace.json",
        &trace(&[("run_command", json!({"command": "mkdir -p reports/m"}))]),
    );
    env.commit_all("plain fire");
    let kept = env.root.parent().unwrap().join("kept.git");
    std::fs::rename(env.root.join(".git"), &kept).unwrap();
    std::os::unix::fs::symlink(&kept, env.root.join(".git")).unwrap();
    let out = fire_as(&env, As::Me, &[]);
    let summary: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(summary["exit_code"], 0, "{summary}");
}

#[test]
fn ptrace_is_refused() {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    let l = Listeners::new();
    let script = "import ctypes, os\nopen('reports/m/ran', 'w').write('ran')\nlibc = ctypes.CDLL(None, use_errno=True)\nr = libc.ptrace(16, 1, 0, 0)\nopen('reports/m/ptrace', 'w').write('%d %s' % (r, os.strerror(ctypes.get_errno())))\n";
    let (m, _) = fire_payload(
        As::Me,
        &env,
        &l,
        &Payload {
            case: "ptrace",
            ext: "py",
            interp: "/usr/bin/python3",
            script,
            after: &[],
            settings: None,
        },
    );
    assert_eq!(m["ptrace"], "-1 Operation not permitted", "{m:?}");
}

/// A repository whose task `t` runs `command` once under `sandbox.landlock:
/// best_effort`, committed.
fn best_effort_env(command: &str) -> TestEnv {
    let env = env_with_prompt();
    env.write(
        "settings/runtime.yaml",
        &SETTINGS.replace("landlock: required", "landlock: best_effort"),
    );
    env.write(
        "evals/iso/trace.json",
        &trace(&[("run_command", json!({ "command": command }))]),
    );
    env.commit_all("best effort");
    env
}

/// One fire of task `t` as `who` with the test hook simulating `missing` (the
/// repository handed to 65534 for the fire and back after): (exit code, summary).
fn fire_simulating(env: &TestEnv, who: As, missing: &str) -> (Option<i32>, Value) {
    if who == As::Nobody {
        hand_to_nobody(env);
    }
    let out = fire_command(env, who, &[(shared::sandbox::SIMULATE_MISSING_ENV, missing)])
        .output()
        .unwrap();
    if who == As::Nobody {
        chown_tree(&env.root, 0);
    }
    (out.status.code(), serde_json::from_slice(&out.stdout).unwrap())
}

#[test]
fn a_missing_layer_refuses_a_required_fire_and_names_the_setting() {
    if !kernel_ready() {
        return;
    }
    // One fire with `layer` reported missing by the worker: (exit code, summary).
    let fire_missing = |env: &TestEnv, layer: &str| {
        let out = env
            .command("runtime", &["fire", "t", "--json"])
            .env(shared::sandbox::SIMULATE_MISSING_ENV, layer)
            .output()
            .unwrap();
        (out.status.code(), serde_json::from_slice::<Value>(&out.stdout).unwrap())
    };
    let tool_trace = trace(&[("run_command", json!({"command": "echo ran > reports/ran"}))]);
    for (layer, names) in [("userns", "namespaces"), ("seccomp", "seccomp")] {
        let env = env_with_prompt();
        env.write("settings/runtime.yaml", SETTINGS);
        env.write("evals/iso/trace.json", &tool_trace);
        env.commit_all("missing layer");
        let (code, summary) = fire_missing(&env, layer);
        assert_ne!(code, Some(0), "{layer}: {summary}");
        assert!(
            env.card_kinds(&summary).contains(&"sandbox_unavailable".to_string()),
            "{layer}: {summary}"
        );
        let cards = serde_json::to_string(&env.cards(&summary)).unwrap();
        assert!(
            cards.contains(names) && cards.contains("best_effort"),
            "{layer}: {cards}"
        );
        assert!(!env.root.join("reports/ran").exists(), "{layer}: the tool ran");

        // A model that calls no tool: the worker was entering its sandbox while the
        // model answered, and the fire still ends on the missing layer, with the
        // model's step in its receipt.
        env.write("evals/iso/trace.json", &trace(&[]));
        env.commit_all("no tool");
        let (code, summary) = fire_missing(&env, layer);
        assert_eq!(code, Some(1), "{layer}: {summary}");
        assert!(
            env.card_kinds(&summary).contains(&"sandbox_unavailable".to_string()),
            "{layer}: {summary}"
        );
        let receipt = env.receipt(&summary);
        assert_eq!(receipt["steps"], 1, "{layer}: {receipt}");
        assert_eq!(
            receipt["tokens"]["input"], 10,
            "the spent request is counted: {receipt}"
        );
        env.write("evals/iso/trace.json", &tool_trace);
        env.commit_all("the tool again");

        let best = SETTINGS.replace("landlock: required", "landlock: best_effort");
        env.write("settings/runtime.yaml", &best);
        env.commit_all("best effort");
        let env = if layer == "userns" && am_root() {
            // As root, tools run as 65534 inside the namespaces only: without them
            // they would run as root, so `best_effort` refuses too.
            let (code, summary) = fire_missing(&env, layer);
            assert_eq!(code, Some(1), "{summary}");
            let cards = serde_json::to_string(&env.cards(&summary)).unwrap();
            assert!(cards.contains("would run as root"), "{cards}");
            assert!(!env.root.join("reports/ran").exists(), "the tool ran as root");
            // A runtime unprivileged (in a repository of its own) goes on without
            // them.
            best_effort_env("echo ran > reports/ran")
        } else {
            env
        };
        let who = if layer == "userns" && am_root() {
            As::Nobody
        } else {
            As::Me
        };
        let (_, summary) = fire_simulating(&env, who, layer);
        let receipt = env.receipt(&summary);
        assert!(
            receipt["sandbox"]["rights"]
                .to_string()
                .contains(&format!("missing: {names}")),
            "{layer}: {receipt}"
        );
        assert!(
            env.root.join("reports/ran").exists(),
            "{layer}: best effort runs the tool"
        );
    }
}

/// A step the worker's clone fails while building its root (its own `/proc`,
/// simulated here, as in a container whose `/proc` is partly covered)
/// ends the clone, not the worker. Under `best_effort` the worker goes on as it was
/// before the clone: in the runtime's namespaces, the receipt naming what is missing,
/// and the tools run. A clone that went on instead served the tools from a half-made
/// sandbox: namespaces of its own with neither the host's root nor one of its own, no
/// masks, no process cap (seen with the clone's report disabled, as root and as
/// 65534: every command failed, `/bin/sh: No such file or directory`). A runtime run
/// as root refuses under `best_effort` too: its tools would run as root without the
/// namespaces. Under `required` the fire is refused, naming the piece.
#[test]
fn a_root_the_clone_cannot_build_leaves_no_half_made_sandbox() {
    if kernel_ready() {
        a_root_the_clone_cannot_build(As::Me);
    }
}

/// The same with the runtime unprivileged (uid 65534, in a repository it owns).
#[test]
fn a_root_the_clone_cannot_build_leaves_no_half_made_sandbox_of_an_unprivileged_runtime() {
    if !kernel_ready() {
        return;
    }
    if !am_root() {
        crate::skip::skip(Capability::Root, "needs root to hand the repository to uid 65534");
        return;
    }
    a_root_the_clone_cannot_build(As::Nobody);
}

fn a_root_the_clone_cannot_build(who: As) {
    // As root, `best_effort` refuses to go on without namespaces: tools would run as
    // root there.
    let refused_as_root = who == As::Me && am_root();
    let env = best_effort_env(
        "echo payload-ran; echo uid=$(id -u); readlink /proc/self/ns/user /proc/self/ns/pid /proc/self/ns/mnt",
    );
    let fire = |env: &TestEnv| fire_simulating(env, who, "proc");
    let (code, summary) = fire(&env);
    let printed = crate::records_cases::ledger_results(&env).join("\n");
    if refused_as_root {
        assert_eq!(code, Some(1), "{summary}");
        let card = serde_json::to_string(&env.cards(&summary)).unwrap();
        assert!(
            card.contains("pid namespace /proc") && card.contains("would run as root"),
            "{card}"
        );
        assert!(!printed.contains("payload-ran"), "the tool ran as root: {printed}");
    } else {
        assert_eq!(code, Some(TestEnv::completed_code(&summary)), "{summary}");
        let rights = env.receipt(&summary)["sandbox"]["rights"].to_string();
        assert!(
            rights.contains("missing: namespaces (pid namespace /proc: simulated"),
            "{rights}"
        );
        let uid = if who == As::Nobody {
            65534
        } else {
            kernel::process::effective_uid()
        };
        ran_unprivileged_in_the_runtimes_namespaces(&printed, uid);
    }

    env.write("settings/runtime.yaml", SETTINGS);
    env.commit_all("required");
    let (code, summary) = fire(&env);
    assert_eq!(code, Some(1), "{summary}");
    assert_eq!(env.card_kinds(&summary), vec!["sandbox_unavailable"], "{summary}");
    let card = serde_json::to_string(&env.cards(&summary)).unwrap();
    let advice = if refused_as_root {
        "would run as root"
    } else {
        "best_effort"
    };
    assert!(card.contains("pid namespace /proc") && card.contains(advice), "{card}");
}

/// The file system's state failing the clone's root (a write directory gone before
/// its overlay, as another fire's tools could make it between the worker's opening it
/// and the mount; simulated here) is no layer the host lacks: an unprivileged
/// runtime under `best_effort` refuses the fire instead of going on without
/// namespaces (and so without the `Read` deny masks). The payload is shown live first,
/// in the same repository without the failure (seen failing with the classification
/// of `NotEntered::of_clone` disabled: the fire went on without namespaces).
#[test]
fn a_write_directory_gone_under_the_clone_buys_no_fire_without_namespaces() {
    if !kernel_ready() {
        return;
    }
    let who = if am_root() { As::Nobody } else { As::Me };
    let env = best_effort_env("echo payload-ran");
    let fire = |simulate: &str| {
        let (code, summary) = fire_simulating(&env, who, simulate);
        let run = format!("{}:", summary["run_id"].as_str().unwrap());
        let printed: Vec<String> = crate::records_cases::ledger_results(&env)
            .into_iter()
            .filter(|r| r.contains(&run))
            .collect();
        (code, summary, printed.join("\n"))
    };
    let (code, summary, printed) = fire("");
    assert_eq!(code, Some(TestEnv::completed_code(&summary)), "{summary}");
    assert!(printed.contains("payload-ran"), "the payload did not run: {printed}");

    let (code, summary, printed) = fire("write_dir_gone");
    assert_eq!(code, Some(1), "{summary}");
    assert_eq!(env.card_kinds(&summary), vec!["sandbox_unavailable"], "{summary}");
    let card = serde_json::to_string(&env.cards(&summary)).unwrap();
    assert!(
        card.contains("writable directories") && card.contains("No such file"),
        "{card}"
    );
    assert!(
        !printed.contains("payload-ran"),
        "the fire went on without namespaces: {printed}"
    );
}

/// The payload ran, as the runtime's uid (`uid`), in the runtime's namespaces: not in
/// a half-made clone's.
fn ran_unprivileged_in_the_runtimes_namespaces(printed: &str, uid: u32) {
    assert!(printed.contains("payload-ran"), "the payload did not run: {printed}");
    assert!(
        printed.contains(&format!("uid={uid}\\n")),
        "not as uid {uid}: {printed}"
    );
    for ns in ["user", "pid", "mnt"] {
        let runtimes = std::fs::read_link(format!("/proc/self/ns/{ns}")).unwrap();
        assert!(
            printed.contains(&*runtimes.to_string_lossy()),
            "the tools ran in namespaces of their own, half made ({ns}): {printed}"
        );
    }
}

#[test]
fn runtime_check_reports_each_layer() {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    env.write("settings/runtime.yaml", SETTINGS);
    env.write("evals/iso/trace.json", &trace(&[]));
    env.commit_all("check");
    let check = |missing: &str| -> Value {
        let out = env
            .command("runtime", &["check", "--json"])
            .env(shared::sandbox::SIMULATE_MISSING_ENV, missing)
            .output()
            .unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let all = check("");
    assert_eq!(all["user_namespaces"], "available", "{all}");
    assert_eq!(all["seccomp"], "available", "{all}");
    assert_eq!(all["ok"], true, "{all}");
    let no_filter = check("seccomp");
    assert!(
        no_filter["seccomp"].as_str().unwrap().starts_with("UNAVAILABLE"),
        "{no_filter}"
    );
    assert_eq!(no_filter["user_namespaces"], "available");
    assert_eq!(no_filter["ok"], false, "required refuses without seccomp: {no_filter}");
    let no_userns = check("userns,idmap");
    assert!(
        no_userns["user_namespaces"]
            .as_str()
            .unwrap()
            .starts_with("UNAVAILABLE"),
        "{no_userns}"
    );
    assert_eq!(no_userns["ok"], false);
    // `best_effort` fires without namespaces, but not a runtime run as root (its
    // tools would run as root).
    env.write(
        "settings/runtime.yaml",
        &SETTINGS.replace("landlock: required", "landlock: best_effort"),
    );
    env.commit_all("best effort");
    assert_eq!(check("seccomp")["ok"], true, "{}", check("seccomp"));
    assert_eq!(check("userns,idmap")["ok"], !am_root(), "{}", check("userns,idmap"));
}

#[test]
fn prefetch_scripts_run_in_the_namespaces() {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    env.write(
        "prompts/t.md",
        "---\ndescription: test task\nprefetch:\n  - name: probe\n    run: tools/probe.sh\n---\nDo the test task.\n",
    );
    env.write(
        "tools/probe.sh",
        "#!/bin/sh\nmkdir -p reports/m\necho ran > reports/m/ran\nid -u > reports/m/uid\ngrep CapEff /proc/self/status | tr -d ' \\t' > reports/m/capeff\nls /proc | grep -c '^[0-9]' > reports/m/procs\nchmod 000 prompts/t.md 2> reports/m/chmod\necho context\n",
    );
    std::fs::set_permissions(
        env.root.join("tools/probe.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    env.write("settings/runtime.yaml", SETTINGS);
    env.write("evals/iso/trace.json", &trace(&[]));
    env.commit_all("a prefetch probe");
    let meta = metadata(&env.root);
    let out = fire_as(&env, As::Me, &[]);
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{summary}");
    let read = |k: &str| std::fs::read_to_string(env.root.join("reports/m").join(k)).unwrap_or_default();
    assert_eq!(read("ran").trim(), "ran", "the prefetch script did not run");
    if am_root() {
        assert_eq!(read("uid").trim(), "65534");
    }
    assert_eq!(read("capeff").trim(), "CapEff:0000000000000000");
    assert!(read("procs").trim().parse::<usize>().unwrap() <= 6, "{}", read("procs"));
    assert!(read("chmod").contains("Read-only file system"), "{}", read("chmod"));
    assert_eq!(metadata(&env.root), meta);
}

#[test]
fn a_prefetch_entry_grants_tcp_to_its_ports_only() {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    let granted = TcpListener::bind("127.0.0.1:0").unwrap();
    let l = Listeners::new();
    let port = granted.local_addr().unwrap().port();
    env.write(
        "prompts/t.md",
        &format!("---\ndescription: test task\nprefetch:\n  - name: db\n    run: tools/db.pl\n    network: [{port}]\n---\nDo the test task.\n"),
    );
    let script = r#"use Socket;
sub mark { my ($n, $v) = @_; open(my $f, '>', "reports/m/$n"); print $f "$v\n"; close $f; }
mkdir 'reports/m';
mark('ran', 'ran');
socket(my $a, PF_INET, SOCK_STREAM, 0) or die;
mark('granted', connect($a, pack_sockaddr_in(@GRANTED@, inet_aton('127.0.0.1'))) ? 'connected' : "refused $!");
socket(my $b, PF_INET, SOCK_STREAM, 0) or die;
mark('other', connect($b, pack_sockaddr_in(@TCP@, inet_aton('127.0.0.1'))) ? 'connected' : "refused $!");
mark('udp', socket(my $d, PF_INET, SOCK_DGRAM, 0) ? 'opened' : "refused $!");
print "context\n";
"#
    .replace("@GRANTED@", &port.to_string())
    .replace("@TCP@", &l.tcp.local_addr().unwrap().port().to_string());
    env.write("tools/db.pl", &format!("#!/usr/bin/perl\n{script}"));
    env.write("settings/runtime.yaml", SETTINGS);
    env.write("evals/iso/trace.json", &trace(&[]));
    std::fs::set_permissions(
        env.root.join("tools/db.pl"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    env.commit_all("a prefetch with network");
    let out = fire_as(&env, As::Me, &[]);
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let read = |k: &str| std::fs::read_to_string(env.root.join("reports/m").join(k)).unwrap_or_default();
    assert_eq!(read("ran").trim(), "ran", "the prefetch script did not run: {summary}");
    assert_eq!(read("granted").trim(), "connected");
    granted.set_nonblocking(true).unwrap();
    assert!(granted.accept().is_ok(), "the granted port heard the script");
    assert!(read("other").starts_with("refused"), "{}", read("other"));
    assert!(read("udp").starts_with("refused"), "{}", read("udp"));
    l.assert_silent("prefetch network");
}

/// Every entry under `dir` on disk whose mode carries the setuid or setgid bit.
fn set_id_entries(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(md) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if md.mode() & 0o6000 != 0 {
            out.push(format!("{} {:o} uid {}", p.display(), md.mode(), md.uid()));
        }
        if md.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()));
        }
    }
    out
}

#[test]
fn a_tool_leaves_no_setuid_file_on_the_host() {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    let l = Listeners::new();
    // As root the tools write through idmapped mounts: a file `nobody` makes is the
    // repository owner's on disk, so a set-id bit would leave a root-owned setuid
    // program in the work tree for any local user to run.
    let script = r#"import ctypes, os
open('reports/m/ran', 'w').write('ran')
libc = ctypes.CDLL(None, use_errno=True)
def mark(n, r):
    open('reports/m/' + n, 'w').write('set' if r == 0 else 'refused ' + os.strerror(ctypes.get_errno()))
open('reports/m/a', 'w').write('#!/bin/sh\nid\n')
mark('chmod', libc.chmod(b'reports/m/a', 0o4755))
fd = os.open('reports/m/b', os.O_WRONLY | os.O_CREAT, 0o644)
mark('fchmod', libc.fchmod(fd, 0o2755))
os.close(fd)
mark('fchmodat', libc.fchmodat(-100, b'reports/m/b', 0o6755, 0))
mark('fchmodat2', libc.syscall(452, -100, b'reports/m/b', 0o4755, 0))
r = libc.syscall(2, b'reports/m/c', os.O_WRONLY | os.O_CREAT, 0o4755)
mark('open', 0 if r >= 0 else -1)
os.mkdir('reports/m/d')
mark('dir', libc.chmod(b'reports/m/d', 0o2777))
"#;
    let (m, _) = fire_payload(
        As::Me,
        &env,
        &l,
        &Payload {
            case: "setuid",
            ext: "py",
            interp: "/usr/bin/python3",
            script,
            after: &[],
            settings: None,
        },
    );
    for k in ["chmod", "fchmod", "fchmodat", "fchmodat2", "open", "dir"] {
        assert_eq!(m[k], "refused Operation not permitted", "{k}: {m:?}");
    }
    assert!(env.root.join("reports/m/a").is_file(), "the payload wrote its program");
    let left = set_id_entries(&env.root.join("reports"));
    assert!(left.is_empty(), "set-id entries on the host: {left:?} {m:?}");
}

/// The worker's protocol pipes are PID 1's: a tool that reaches them (its
/// `/proc/1/fd` or `pidfd_getfd`, same uid when the runtime is not root) answers for
/// the worker, here forging the pass of an acceptance script that always fails.
#[test]
fn a_tool_cannot_answer_for_the_worker() {
    if !kernel_ready() {
        return;
    }
    for who in [As::Me, As::Nobody] {
        if who == As::Nobody && !am_root() {
            continue;
        }
        let env = env_with_prompt();
        env.write(
            "prompts/t.md",
            "---\ndescription: test task\nacceptance:\n  - name: gate\n    run: tools/gate.sh\n---\nDo the test task.\n",
        );
        env.write("tools/gate.sh", "#!/bin/sh\necho never passes\nexit 1\n");
        std::fs::set_permissions(
            env.root.join("tools/gate.sh"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let l = Listeners::new();
        let script = r#"import ctypes, json, os
open('reports/m/ran', 'w').write('ran')
libc = ctypes.CDLL(None, use_errno=True)
def forged(call_id):
    return json.dumps({"call_id": call_id, "error": None, "output": "forged", "truncated": False, "duration_ms": 1}) + "\n"
lines = (forged("c2") + forged("acceptance-gate")).encode()
how = []
try:
    fd = os.open('/proc/1/fd/1', os.O_WRONLY)
    os.write(fd, lines)
    how.append('proc fd written')
except OSError as e:
    how.append('proc fd refused ' + e.strerror)
pidfd = libc.syscall(434, 1, 0)
fd = libc.syscall(438, pidfd, 1, 0) if pidfd >= 0 else -1
how.append('pidfd_getfd got' if fd >= 0 else 'pidfd_getfd refused ' + os.strerror(ctypes.get_errno()))
open('reports/m/how', 'w').write('; '.join(how))
"#;
        let (m, summary) = fire_payload(
            who,
            &env,
            &l,
            &Payload {
                case: "worker pipes",
                ext: "py",
                interp: "/usr/bin/python3",
                script,
                after: &[],
                settings: None,
            },
        );
        let receipt = env.receipt(&summary);
        let gate = &receipt["acceptance"][0];
        assert_eq!(gate["check"], "gate", "{receipt}");
        assert_eq!(
            gate["passed"], false,
            "{who:?}: a forged acceptance pass: {m:?} {receipt}"
        );
        assert!(
            m["how"].contains("proc fd refused") && m["how"].contains("pidfd_getfd refused"),
            "{who:?}: {m:?}"
        );
    }
}

/// The task and commit locks and the state database are the runtime's alone: a tool
/// that can open them can flock a lock file (opened read-only) or hold an SQLite
/// lock, and so skip or stall other tasks' fires for as long as its call runs.
#[test]
fn a_tool_cannot_reach_the_runtime_state() {
    if !kernel_ready() {
        return;
    }
    for who in [As::Me, As::Nobody] {
        if who == As::Nobody && !am_root() {
            continue;
        }
        let env = env_with_prompt();
        let l = Listeners::new();
        let script = r#"import fcntl, os
open('reports/m/ran', 'w').write('ran')
out = []
for p in ['.runtime/locks/commit.lock', '.runtime/locks/other.lock', '.runtime/state.db']:
    try:
        fd = os.open(p, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        out.append(p + ' locked')
    except OSError as e:
        out.append(p + ' refused ' + e.strerror)
open('reports/m/state', 'w').write('\n'.join(out))
open('reports/m/listing', 'w').write(' '.join(sorted(os.listdir('.runtime'))))
"#;
        let payload = Payload {
            case: "runtime state",
            ext: "py",
            interp: "/usr/bin/python3",
            script,
            after: &[],
            settings: None,
        };
        // A first fire leaves the state database and the commit lock; another task's
        // lock is planted beside them.
        fire_payload(who, &env, &l, &payload);
        std::fs::write(env.root.join(".runtime/locks/other.lock"), "").unwrap();
        assert!(env.root.join(".runtime/state.db").is_file());
        assert!(env.root.join(".runtime/locks/commit.lock").is_file());
        let (m, _) = fire_payload(who, &env, &l, &payload);
        for line in m["state"].lines() {
            assert!(line.contains("refused"), "{who:?}: {m:?}");
        }
        assert_eq!(m["listing"], "handoff scratch", "{who:?}: {m:?}");
    }
}

/// A fork bomb stops at the tools' process cap (the host's would be far higher and
/// shared with everything else `nobody` or the runtime's user runs).
#[test]
fn a_fork_bomb_stops_at_the_process_cap() {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    let l = Listeners::new();
    let script = r#"import os, signal
open('reports/m/ran', 'w').write('ran')
n, why = 0, 'none'
while n < 3000:
    try:
        pid = os.fork()
    except OSError as e:
        why = e.strerror
        break
    if pid == 0:
        # Off the call's output pipes, so the call ends when the payload does.
        null = os.open('/dev/null', os.O_RDWR)
        os.dup2(null, 1)
        os.dup2(null, 2)
        signal.pause()
        os._exit(0)
    n += 1
open('reports/m/forked', 'w').write('%d %s' % (n, why))
"#;
    let (m, _) = fire_payload(
        As::Me,
        &env,
        &l,
        &Payload {
            case: "fork bomb",
            ext: "py",
            interp: "/usr/bin/python3",
            script,
            after: &["sh -c 'ls /proc | grep -c \"^[0-9]\" > reports/m/left'"],
            settings: None,
        },
    );
    let (n, why) = m["forked"].split_once(' ').unwrap();
    let n: usize = n.parse().unwrap();
    assert!(n < shared::sandbox::namespaces::MAX_TOOL_PROCESSES as usize, "{m:?}");
    assert_eq!(why, "Resource temporarily unavailable", "{m:?}");
    let left: usize = m["left"].parse().unwrap();
    assert!(left <= 6, "the next call still sees the bomb: {m:?}");
}

/// With tools granted TCP ports, TCP Fast Open (`sendto` with `MSG_FASTOPEN` on an
/// unconnected socket) connects without the `connect` call Landlock checks: the
/// filter refuses the flag, so only the granted ports are reached.
#[test]
fn tcp_fast_open_does_not_pass_the_granted_ports() {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    let l = Listeners::new();
    let granted = TcpListener::bind("127.0.0.1:0").unwrap();
    let settings = SETTINGS.replace(
        "  landlock: required\n",
        &format!(
            "  landlock: required\n  network: [{}]\n",
            granted.local_addr().unwrap().port()
        ),
    );
    let script = r#"import socket
open('reports/m/ran', 'w').write('ran')
def attempt(flags):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        return 'sent %d' % s.sendto(b'hello', flags, ('127.0.0.1', @TCP@))
    except OSError as e:
        return 'refused ' + e.strerror
open('reports/m/fastopen', 'w').write(attempt(socket.MSG_FASTOPEN))
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.connect(('127.0.0.1', @GRANTED@))
open('reports/m/granted', 'w').write('connected')
"#
    .replace("@GRANTED@", &granted.local_addr().unwrap().port().to_string());
    let (m, _) = fire_payload(
        As::Me,
        &env,
        &l,
        &Payload {
            case: "tcp fast open",
            ext: "py",
            interp: "/usr/bin/python3",
            script: &script,
            after: &[],
            settings: Some(&settings),
        },
    );
    assert_eq!(m["granted"], "connected", "the granted port stays reachable: {m:?}");
    assert_eq!(m["fastopen"], "refused Operation not permitted", "{m:?}");
}

/// With tools granted TCP ports (host network), `listen` on an unbound socket binds
/// an ephemeral port on every address without the `bind` Landlock checks: a tool
/// would serve the host's network. The filter refuses `listen` there.
#[test]
fn a_tool_granted_ports_cannot_listen_on_the_host() {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    let l = Listeners::new();
    let settings = SETTINGS.replace("  landlock: required\n", "  landlock: required\n  network: [9]\n");
    let script = r#"import socket
open('reports/m/ran', 'w').write('ran')
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
try:
    s.listen(1)
    open('reports/m/port.tmp', 'w').write(str(s.getsockname()[1]))
    __import__('os').rename('reports/m/port.tmp', 'reports/m/port')
    s.settimeout(10)
    c, _ = s.accept()
    open('reports/m/listen', 'w').write('accepted')
except OSError as e:
    open('reports/m/listen', 'w').write('refused ' + e.strerror)
"#;
    // Plays the outside: connects to whatever port the payload announces.
    let port_file = env.root.join("reports/m/port");
    let knocker = std::thread::spawn(move || {
        for _ in 0..200 {
            if let Ok(p) = std::fs::read_to_string(&port_file) {
                return std::net::TcpStream::connect(("127.0.0.1", p.trim().parse::<u16>().unwrap())).is_ok();
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        false
    });
    let (m, _) = fire_payload(
        As::Me,
        &env,
        &l,
        &Payload {
            case: "listen",
            ext: "py",
            interp: "/usr/bin/python3",
            script,
            after: &[],
            settings: Some(&settings),
        },
    );
    assert!(
        !knocker.join().unwrap(),
        "a connection from outside reached the tool: {m:?}"
    );
    assert_eq!(m["listen"], "refused Operation not permitted", "{m:?}");
}

/// A 32-bit syscall (`int 0x80`, here the i386 `socket`) is another architecture
/// to the filter: it kills the caller rather than letting the call through a
/// filter written for x86-64 numbers.
#[test]
fn a_32_bit_syscall_kills_the_caller() {
    if !kernel_ready() || std::env::consts::ARCH != "x86_64" {
        return;
    }
    let env = env_with_prompt();
    let l = Listeners::new();
    let script = r#"import ctypes, mmap, os
open('reports/m/ran', 'w').write('ran')
# push rbx; mov eax, 359 (i386 socket); mov ebx, 2; mov ecx, 2; mov edx, 0; int 0x80; pop rbx; ret
code = bytes([0x53, 0xb8, 0x67, 0x01, 0, 0, 0xbb, 2, 0, 0, 0, 0xb9, 2, 0, 0, 0, 0xba, 0, 0, 0, 0, 0xcd, 0x80, 0x5b, 0xc3])
pid = os.fork()
if pid == 0:
    m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    m.write(code)
    r = ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))()
    open('reports/m/socket', 'w').write('returned %d' % r)
    os._exit(0)
_, st = os.waitpid(pid, 0)
open('reports/m/child', 'w').write('signal %d' % os.WTERMSIG(st) if os.WIFSIGNALED(st) else 'exit %d' % os.WEXITSTATUS(st))
"#;
    let (m, _) = fire_payload(
        As::Me,
        &env,
        &l,
        &Payload {
            case: "int 0x80",
            ext: "py",
            interp: "/usr/bin/python3",
            script,
            after: &[],
            settings: None,
        },
    );
    assert_eq!(m["child"], format!("signal {}", libc::SIGSYS), "{m:?}");
    assert!(!m.contains_key("socket"), "{m:?}");
}

/// A host process listening on a socket inside the repository (git's fsmonitor
/// daemon keeps `.git/fsmonitor--daemon.ipc`; any tool may leave one under a write
/// directory) hears no tool: Landlock does not scope pathname sockets, so the worker
/// masks the sockets it finds when it starts.
#[test]
fn a_host_socket_inside_the_repository_hears_no_tool() {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    let l = Listeners::new();
    std::fs::create_dir_all(env.root.join("reports/live")).unwrap();
    let listeners = [
        UnixListener::bind(env.root.join("reports/live/host.sock")).unwrap(),
        UnixListener::bind(env.root.join(".git/fsmonitor--daemon.ipc")).unwrap(),
    ];
    for s in &listeners {
        s.set_nonblocking(true).unwrap();
    }
    let script = r#"import socket
open('reports/m/ran', 'w').write('ran')
out = []
for p in ['reports/live/host.sock', '.git/fsmonitor--daemon.ipc']:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(p)
        out.append(p + ' connected')
    except OSError as e:
        out.append(p + ' refused ' + e.strerror)
open('reports/m/unix', 'w').write('\n'.join(out))
"#;
    let (m, _) = fire_payload(
        As::Me,
        &env,
        &l,
        &Payload {
            case: "in-repo socket",
            ext: "py",
            interp: "/usr/bin/python3",
            script,
            after: &[],
            settings: None,
        },
    );
    for s in &listeners {
        assert!(
            s.accept().is_err(),
            "a host socket in the repository heard a tool: {m:?}"
        );
    }
    for line in m["unix"].lines() {
        assert!(line.contains("refused"), "{m:?}");
    }
}

#[test]
fn a_read_deny_rule_holds_for_cat_past_100000_entries() {
    // The mask walk once gave up after 100,000 entries: in a repository that big the
    // `.env` files it had not reached yet stayed readable for `cat`. 200 directories
    // of 505 files and a `.env` each (101,400 entries, git-ignored, so the repository
    // stays cheap to commit): every `.env` must be masked, wherever the walk meets it.
    // (Not through `fire_payload`: its snapshots would hash the whole tree.)
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    let ignore = env.root.join(".gitignore");
    let mut text = std::fs::read_to_string(&ignore).unwrap_or_default();
    text.push_str("data/\n");
    std::fs::write(&ignore, text).unwrap();
    for d in 0..200 {
        let sub = env.root.join(format!("data/d{d:03}"));
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..505 {
            std::fs::File::create(sub.join(format!("f{f:04}"))).unwrap();
        }
        std::fs::write(sub.join(".env"), format!("dotenv-secret-{d}\n")).unwrap();
    }
    let script = "mkdir -p reports/m\necho ran > reports/m/ran\nls data | wc -l > reports/m/dirs\ncat data/d*/.env .env 2>/dev/null | grep -c dotenv-secret > reports/m/leaked\n";
    let calls = [
        ("write_file", json!({"path": "reports/p.sh", "content": script})),
        ("run_command", json!({"command": "/bin/sh reports/p.sh"})),
    ];
    env.write("settings/runtime.yaml", SETTINGS);
    env.write("evals/iso/trace.json", &trace(&calls));
    env.commit_all("big tree");
    let (code, summary, stderr) = env.fire("t");
    assert_eq!(
        env.read("reports/m/ran").trim(),
        "ran",
        "the payload never ran: {summary} {stderr}"
    );
    assert_eq!(env.read("reports/m/dirs").trim(), "200", "the payload saw the tree");
    assert_eq!(
        env.read("reports/m/leaked").trim(),
        "0",
        "a `.env` past the walk's old cap was readable"
    );
    assert!(code == 0 || code == 5, "{summary} {stderr}");
    // Outside the sandbox the files are there to read: the masks did it.
    assert_eq!(env.read("data/d199/.env").trim(), "dotenv-secret-199");
}
