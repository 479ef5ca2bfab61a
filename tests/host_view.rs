//! What the host shows a tool (issue 17, items 2 and 6), through real `runtime fire`s
//! with a permissive policy, as root and as uid 65534: host daemons listening on
//! pathname UNIX sockets (under `/var/lib`, `/srv`, a service account's home, a
//! `.git` subdirectory) are first reached by an unsandboxed process of the fire's
//! user, then never by a tool, whose own probe sees the host paths absent;
//! `/proc/self/mountinfo` and `/` show only the tool's minimal root; a model filling
//! `reports/` stops at `sandbox.write_bytes` while the fire's records are still
//! committed; and a core dump of the runtime or its worker never lands in the work
//! tree, nor can a process of the runtime's own uid read its environment (the key).

use crate::isolation::{
    am_root, env_with_prompt, fire_command, fire_payload, hand_to_nobody, kernel_ready, trace, As, Listeners, Payload,
    SETTINGS,
};
use crate::skip::Capability;
use crate::util::*;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A host daemon on a pathname UNIX socket that runs what a client sends: here it
/// writes each line it hears to its marker file (outside every sandbox).
struct Daemon {
    socket: PathBuf,
    marker: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// A directory the test made for it (removed at the end).
    made: Option<PathBuf>,
    _markers: tempfile::TempDir,
}

impl Daemon {
    /// Proves the daemon runs what an unsandboxed process of `who` sends it (then
    /// forgets that line): a later silence means a tool did not reach it.
    fn prove_live(&self, who: As) {
        let out = python_as(who, &connect_code(&self.socket, "control"));
        assert!(
            out.status.success(),
            "{who:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for _ in 0..200 {
            if !self.heard().is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(
            self.heard(),
            "ran: control\n",
            "{who:?}: the daemon at {:?} heard its control",
            self.socket
        );
        self.forget();
    }

    fn start(dir: &Path, made: Option<PathBuf>) -> Daemon {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::set_permissions(dir, PermissionsExt::from_mode(0o755)).unwrap();
        let socket = dir.join("sock");
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).unwrap();
        std::fs::set_permissions(&socket, PermissionsExt::from_mode(0o777)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let markers = tempfile::tempdir().unwrap();
        let marker = markers.path().join("heard");
        let stop = Arc::new(AtomicBool::new(false));
        let (stop2, marker2) = (stop.clone(), marker.clone());
        let thread = std::thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((conn, _)) => {
                        conn.set_nonblocking(false).unwrap();
                        conn.set_read_timeout(Some(std::time::Duration::from_secs(2))).unwrap();
                        let mut line = String::new();
                        let _ = BufReader::new(conn).read_line(&mut line);
                        let mut heard = std::fs::read_to_string(&marker2).unwrap_or_default();
                        heard.push_str(&format!("ran: {}\n", line.trim()));
                        std::fs::write(&marker2, heard).unwrap();
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
                }
            }
        });
        Daemon {
            socket,
            marker,
            stop,
            thread: Some(thread),
            made,
            _markers: markers,
        }
    }

    fn heard(&self) -> String {
        std::fs::read_to_string(&self.marker).unwrap_or_default()
    }

    fn forget(&self) {
        let _ = std::fs::remove_file(&self.marker);
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.socket);
        if let Some(d) = &self.made {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// A directory of the host this test may make and remove (`/var/lib/<x>`, ...).
fn host_dir(parent: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    Path::new(parent).join(format!("builder-e2e-{}-{nanos}", std::process::id()))
}

/// Runs `python3 -c <code>` as `who`, outside any sandbox.
fn python_as(who: As, code: &str) -> std::process::Output {
    let mut c = match who {
        As::Me => std::process::Command::new("/usr/bin/python3"),
        As::Nobody => {
            let mut c = std::process::Command::new("setpriv");
            c.args([
                "--reuid",
                "65534",
                "--regid",
                "65534",
                "--clear-groups",
                "/usr/bin/python3",
            ]);
            c
        }
    };
    c.arg("-c").arg(code).current_dir("/").output().unwrap()
}

fn connect_code(socket: &Path, line: &str) -> String {
    format!(
        "import socket; s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect({:?}); s.sendall(b'{line}\\n'); s.close()",
        socket.to_string_lossy()
    )
}

#[test]
fn host_daemons_on_pathname_sockets_are_never_reached_by_a_tool() {
    daemons_case(As::Me);
}

#[test]
fn host_daemons_on_pathname_sockets_are_never_reached_when_the_runtime_is_not_root() {
    if am_root() {
        daemons_case(As::Nobody);
    }
}

fn daemons_case(who: As) {
    if !kernel_ready() {
        return;
    }
    if !am_root() {
        crate::skip::skip(
            Capability::Root,
            "making daemons under /var/lib, /srv and /home needs root",
        );
        return;
    }
    let env = env_with_prompt();
    let l = Listeners::new();
    let (var_lib, srv, home) = (host_dir("/var/lib"), host_dir("/srv"), host_dir("/home"));
    let daemons = [
        Daemon::start(&var_lib, Some(var_lib.clone())),
        Daemon::start(&srv, Some(srv.clone())),
        Daemon::start(&home.join(".service"), Some(home.clone())),
        Daemon::start(&env.root.join(".git/x"), None),
    ];
    // Each daemon is reachable from an unsandboxed process of the fire's user, and
    // runs what it hears.
    for d in &daemons {
        d.prove_live(who);
    }
    let paths: Vec<String> = daemons
        .iter()
        .map(|d| d.socket.to_string_lossy().into_owned())
        .collect();
    let script = format!(
        r#"import errno, os, socket
open('reports/m/ran', 'w').write('ran')
out = []
for p in {paths:?}:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(p)
        s.sendall(b'tool\n')
        how = 'connected'
    except OSError as e:
        how = 'refused ' + errno.errorcode.get(e.errno, str(e.errno))
    out.append('%s|%s|%s' % (p, how, 'present' if os.path.lexists(p) else 'absent'))
open('reports/m/unix', 'w').write('\n'.join(out))
"#
    );
    let (m, _) = fire_payload(
        who,
        &env,
        &l,
        &Payload {
            case: "host daemons",
            ext: "py",
            interp: "/usr/bin/python3",
            script: &script,
            after: &[],
            settings: None,
        },
    );
    std::thread::sleep(std::time::Duration::from_millis(200));
    for d in &daemons {
        assert_eq!(
            d.heard(),
            "",
            "{who:?}: a tool reached the daemon at {:?}: {m:?}",
            d.socket
        );
    }
    let lines: Vec<&str> = m["unix"].lines().collect();
    assert_eq!(lines.len(), daemons.len(), "{m:?}");
    for (line, d) in lines.iter().zip(&daemons) {
        let fields: Vec<&str> = line.split('|').collect();
        assert_eq!(fields[0], d.socket.to_string_lossy(), "{m:?}");
        assert!(fields[1].starts_with("refused"), "{who:?}: {line}");
        if d.socket.starts_with(&env.root) {
            // Inside the repository: masked (a `/dev/null` over it), so refused.
            assert_eq!(fields[1], "refused ECONNREFUSED", "{who:?}: {line}");
        } else {
            // The host path does not exist for the tool.
            assert_eq!(fields[1], "refused ENOENT", "{who:?}: {line}");
            assert_eq!(fields[2], "absent", "{who:?}: {line}");
        }
    }
}

/// The runtime walks for sockets with a cache of the directories it listed (a
/// directory whose `ctime` has not moved is not listed again): a daemon that starts
/// listening in a `.git` directory after the cache holds it is still masked at the
/// next fire.
#[test]
fn a_socket_made_after_the_walk_cache_holds_its_directory_is_masked_at_the_next_fire() {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    let l = Listeners::new();
    std::fs::create_dir_all(env.root.join(".git/late")).unwrap();
    // Every directory settles (its change is more than 3 s old), so the first fire
    // caches it.
    std::thread::sleep(std::time::Duration::from_millis(3_200));
    let first = Payload {
        case: "walk cache",
        ext: "sh",
        interp: "/bin/sh",
        script: "echo ran > reports/m/ran\n",
        after: &[],
        settings: None,
    };
    let (m, _) = fire_payload(As::Me, &env, &l, &first);
    assert_eq!(m["ran"], "ran", "{m:?}");
    let cache = std::fs::read_to_string(env.root.join(".runtime/mask-walk.json")).unwrap();
    let late = env.root.join(".git/late");
    assert!(
        cache.contains(&format!("{:?}", late.to_string_lossy())),
        "the cache holds .git/late: {cache}"
    );
    let daemon = Daemon::start(&late, None);
    daemon.prove_live(As::Me);
    let script = format!(
        "import errno, socket\nopen('reports/m/ran', 'w').write('ran')\ns = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\ntry:\n    s.connect({:?})\n    s.sendall(b'tool\\n')\n    how = 'connected'\nexcept OSError as e:\n    how = errno.errorcode.get(e.errno, str(e.errno))\nopen('reports/m/unix', 'w').write(how)\n",
        daemon.socket.to_string_lossy()
    );
    let (m, _) = fire_payload(
        As::Me,
        &env,
        &l,
        &Payload {
            case: "walk cache, late daemon",
            ext: "py",
            interp: "/usr/bin/python3",
            script: &script,
            after: &[],
            settings: None,
        },
    );
    assert_eq!(m["ran"], "ran", "the payload ran: {m:?}");
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(daemon.heard(), "", "a tool reached the late daemon: {m:?}");
    assert_eq!(m["unix"], "ECONNREFUSED", "masked by /dev/null: {m:?}");
}

#[test]
fn a_tool_sees_only_its_minimal_root_in_mountinfo_and_git_still_works() {
    view_case(As::Me);
}

#[test]
fn a_tool_sees_only_its_minimal_root_when_the_runtime_is_not_root() {
    if am_root() {
        view_case(As::Nobody);
    }
}

fn view_case(who: As) {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    let l = Listeners::new();
    let script = "echo ran > reports/m/ran\ncat /proc/self/mountinfo > reports/m/mountinfo\nls -a / | tr '\\n' ' ' > reports/m/root\nls -a /etc | tr '\\n' ' ' > reports/m/etc\ngit log --format=%s -1 > reports/m/gitlog 2>&1\n";
    let (m, _) = fire_payload(
        who,
        &env,
        &l,
        &Payload {
            case: "mountinfo",
            ext: "sh",
            interp: "/bin/sh",
            script,
            after: &[],
            settings: None,
        },
    );
    // `git log` reads the repository as always (the commit fire_payload made).
    assert_eq!(m["gitlog"], "case mountinfo", "{who:?}: {m:?}");
    let root = env.root.to_string_lossy().into_owned();
    let first = env
        .root
        .components()
        .nth(1)
        .unwrap()
        .as_os_str()
        .to_string_lossy()
        .into_owned();
    let system = [
        "/", "/proc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
    ];
    let info = &m["mountinfo"];
    assert!(info.lines().count() > 3, "{info}");
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let (fs_root, point) = (fields[3], fields[4]);
        let fs_type = line.split(" - ").nth(1).and_then(|t| t.split(' ').next()).unwrap_or("");
        let in_view = system.contains(&point)
            || point == "/etc"
            || point.starts_with("/etc/")
            || point.starts_with("/dev/")
            || point == root
            || point.starts_with(&format!("{root}/"));
        assert!(in_view, "{who:?}: a mount outside the minimal root: {line}\n{info}");
        // A bind of a host directory or file shows the path it has on the host,
        // which is its path here too: nothing else of the host is named.
        // `/etc` is the snapshot of the host's entries in the repository's state
        // directory, which names nothing outside the repository either.
        let etc_snapshot = format!("{root}/.runtime/sandbox-etc/");
        if point == "/etc" {
            let stamp = fs_root.strip_prefix(&etc_snapshot);
            assert!(
                stamp.is_some_and(|s| s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit())),
                "{who:?}: /etc is not the snapshot: {line}"
            );
        } else if !["tmpfs", "proc", "overlay", "devtmpfs", "devpts"].contains(&fs_type) {
            assert_eq!(fs_root, point, "{who:?}: {line}");
        }
    }
    for host in [
        "/work",
        "/home",
        "/root ",
        "/var",
        "/srv",
        "/run",
        "/sys",
        "/mnt",
        "/opt",
        "/old_root",
        "/boot",
    ] {
        assert!(!info.contains(host), "{who:?}: `{host}` shows in mountinfo:\n{info}");
    }
    let mut entries: Vec<&str> = m["root"].split_whitespace().collect();
    entries.retain(|e| !["."].contains(e) && *e != "..");
    for e in &entries {
        assert!(
            ["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "dev", "proc"].contains(e) || *e == first,
            "{who:?}: `/{e}` exists for a tool: {entries:?}"
        );
    }
    let etc: Vec<&str> = m["etc"].split_whitespace().collect();
    assert!(etc.contains(&"passwd"), "{etc:?}");
    for secret in ["shadow", "gshadow", "npmrc", "pip.conf", "ld.so.preload", "machine-id"] {
        assert!(!etc.contains(&secret), "{who:?}: /etc/{secret} is in view: {etc:?}");
    }
}

#[test]
fn a_model_filling_reports_stops_at_the_write_limit_and_the_records_are_committed() {
    fill_case(As::Me);
}

#[test]
fn a_model_filling_reports_stops_at_the_write_limit_when_the_runtime_is_not_root() {
    if am_root() {
        fill_case(As::Nobody);
    }
}

/// The limit of the fill case: 8 MiB.
const LIMIT: u64 = 8 * 1024 * 1024;

fn fill_case(who: As) {
    if !kernel_ready() {
        return;
    }
    let env = env_with_prompt();
    let l = Listeners::new();
    let settings = SETTINGS.replace(
        "  landlock: required\n",
        &format!("  landlock: required\n  write_bytes: {LIMIT}\n"),
    );
    // 2 MiB files until a write fails (each over `limits.output_file_bytes`, so the
    // fire leaves them out with an `output_rejected` card), then the scratch.
    let script = r#"echo ran > reports/m/ran
mkdir -p reports/fill
i=0
while [ $i -lt 100 ]; do
  i=$((i+1))
  if ! err=$(dd if=/dev/zero of=reports/fill/$i bs=1M count=2 2>&1 >/dev/null); then break; fi
done
dd if=/dev/zero of="$TMPDIR/big" bs=1M count=64 2>/dev/null
scratch=$(stat -c %s "$TMPDIR/big")
rm -f "$TMPDIR/big" reports/fill/1
echo "$i" > reports/m/stopped
echo "$err" > reports/m/error
echo "$scratch" > reports/m/scratch
"#;
    let (m, summary) = fire_payload(
        who,
        &env,
        &l,
        &Payload {
            case: "fill",
            ext: "sh",
            interp: "/bin/sh",
            script,
            after: &[],
            settings: Some(&settings),
        },
    );
    let stopped: u64 = m["stopped"].parse().unwrap();
    assert!(
        (2..=5).contains(&stopped),
        "{who:?}: the loop stopped at {stopped}: {m:?}"
    );
    assert!(m["error"].contains("No space left on device"), "{who:?}: {m:?}");
    let scratch: u64 = m["scratch"].parse().unwrap();
    assert!(scratch < LIMIT, "{who:?}: the scratch took {scratch} bytes: {m:?}");
    // On the host: what the tool wrote, at most the limit (the card names each file
    // and its size as the runtime found it there; the fire's end then removed them,
    // its tools having made them).
    let detail = crate::records_hardening::rejected_detail(&env, &summary);
    let on_host: u64 = detail
        .lines()
        .filter(|l| l.starts_with("reports/fill/") && l.contains("removed from the work tree"))
        .filter_map(|l| l.split(": ").nth(1)?.split(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(on_host > 0, "the writes reached the repository: {detail}");
    assert!(on_host <= LIMIT, "{who:?}: {on_host} bytes on the host, over {LIMIT}");
    assert!(
        !env.root.join("reports/fill/1").exists(),
        "the tool's removal reached the repository too"
    );
    // The fire's receipt and its card are committed.
    let repo = git2::Repository::open(&env.root).unwrap();
    let tree = repo.head().unwrap().peel_to_tree().unwrap();
    let receipt = summary["receipt"].as_str().unwrap();
    assert!(
        tree.get_path(Path::new(receipt)).is_ok(),
        "{who:?}: receipt not committed: {summary}"
    );
    let kinds = env.card_kinds(&summary);
    assert!(
        kinds.contains(&"output_rejected".to_string()),
        "{who:?}: {kinds:?} {summary}"
    );
    for id in summary["cards"].as_array().unwrap() {
        let id = id.as_str().unwrap();
        let committed = std::fs::read_dir(env.root.join("cards"))
            .unwrap()
            .flatten()
            .map(|d| format!("cards/{}/{id}.yaml", d.file_name().to_string_lossy()))
            .any(|p| tree.get_path(Path::new(&p)).is_ok());
        assert!(committed, "{who:?}: card {id} not committed");
    }
}

/// A prompt whose prefetch script sleeps, so the runtime and a worker are alive.
fn slow_env() -> TestEnv {
    let env = env_with_prompt();
    env.write(
        "prompts/t.md",
        "---\ndescription: test task\nprefetch:\n  - name: slow\n    run: tools/slow.sh\n---\nDo the test task.\n",
    );
    env.write("tools/slow.sh", "#!/bin/sh\nsleep 4\necho context\n");
    std::fs::set_permissions(env.root.join("tools/slow.sh"), PermissionsExt::from_mode(0o755)).unwrap();
    env.write("settings/runtime.yaml", SETTINGS);
    env.write("evals/iso/trace.json", &trace(&[]));
    env.commit_all("a slow prefetch");
    env
}

/// The parent pid and command line of every process.
fn processes() -> Vec<(i32, i32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let Some(ppid) = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.split(' ').nth(1))
            .and_then(|p| p.parse().ok())
        else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        out.push((pid, ppid, String::from_utf8_lossy(&cmd).replace('\0', " ")));
    }
    out
}

/// Waits until the prefetch's `sleep` runs under the runtime `pid`; returns the pid of
/// the runtime's worker process (its child running `shared::worker::WORKER_COMMAND`).
fn wait_for_worker(pid: i32) -> i32 {
    for _ in 0..500 {
        let ps = processes();
        let worker = ps
            .iter()
            .find(|(_, ppid, cmd)| *ppid == pid && cmd.contains(shared::worker::WORKER_COMMAND))
            .map(|p| p.0);
        let sleeping = ps.iter().any(|(_, _, cmd)| cmd.starts_with("sleep 4"));
        if let (Some(w), true) = (worker, sleeping) {
            return w;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!("the prefetch never started under the runtime {pid}");
}

/// Every entry named `core*` under `dir`.
fn cores(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().starts_with("core") {
                out.push(e.path());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(e.path());
            }
        }
    }
    out
}

/// Lets `cmd` dump cores of any size (the runtime must lower it itself).
fn unlimited_cores(cmd: &mut std::process::Command) {
    kernel::spawn::unlimited_core_dumps(cmd);
}

#[test]
fn a_core_dump_of_the_runtime_or_its_worker_never_lands_in_the_work_tree() {
    if !kernel_ready() {
        return;
    }
    // The attack works here: a dumpable process killed by SIGQUIT leaves a core file
    // in its working directory.
    let control_dir = tempfile::tempdir().unwrap();
    let mut control = std::process::Command::new("sleep");
    control.arg("30").current_dir(control_dir.path());
    unlimited_cores(&mut control);
    let mut child = control.spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    let _ = kernel::signal::kill(child.id(), kernel::signal::Signal::Quit);
    let _ = child.wait();
    if cores(control_dir.path()).is_empty() {
        crate::skip::skip(
            Capability::CoreFiles,
            "a SIGQUIT leaves no core file in the working directory here (core_pattern)",
        );
        return;
    }
    let env = slow_env();
    let mut fire = fire_command(&env, As::Me, &[]);
    unlimited_cores(&mut fire);
    let mut runtime = fire
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = runtime.id() as i32;
    let worker = wait_for_worker(pid);
    // The runtime and its worker, processes of this test.
    let _ = kernel::signal::kill(worker as u32, kernel::signal::Signal::Quit);
    let _ = kernel::signal::kill(pid as u32, kernel::signal::Signal::Quit);
    let status = runtime.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        status.signal(),
        Some(libc::SIGQUIT),
        "the runtime took the signal: {status:?}"
    );
    let found = [cores(&env.root), cores(&env.home)].concat();
    assert!(found.is_empty(), "core files of the runtime: {found:?}");
}

#[test]
fn a_process_of_the_runtime_s_own_uid_cannot_read_its_environment() {
    if !kernel_ready() || !am_root() {
        return;
    }
    let read_environ = |pid: u32| {
        std::process::Command::new("setpriv")
            .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "cat"])
            .arg(format!("/proc/{pid}/environ"))
            .output()
            .unwrap()
    };
    // The probe works: a process of uid 65534 reads another one's environment.
    let mut control = std::process::Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "sleep", "30"])
        .env("CONTROL_SECRET", "visible-to-the-same-uid")
        .spawn()
        .unwrap();
    // Readable by uid 65534 once `setpriv` has become it and run `sleep` (before, it is
    // root's, then not dumpable): asked again until then, however loaded the machine.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let seen = loop {
        let seen = read_environ(control.id());
        if String::from_utf8_lossy(&seen.stdout).contains("visible-to-the-same-uid")
            || std::time::Instant::now() > deadline
        {
            break seen;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let _ = control.kill();
    let _ = control.wait();
    assert!(
        String::from_utf8_lossy(&seen.stdout).contains("visible-to-the-same-uid"),
        "control: {}",
        String::from_utf8_lossy(&seen.stderr)
    );
    // The runtime as uid 65534, the key in its environment: neither it nor its worker
    // lets another process of that uid read it.
    let env = slow_env();
    hand_to_nobody(&env);
    let runtime = fire_command(&env, As::Nobody, &[])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = runtime.id();
    let worker = wait_for_worker(pid as i32);
    let outs = [read_environ(pid), read_environ(worker as u32)];
    let done = runtime.wait_with_output().unwrap();
    crate::isolation::chown_tree(&env.root, 0);
    for out in &outs {
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!text.contains(TEST_KEY), "the key was read from /proc: {text}");
        assert!(
            !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("Permission denied"),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let summary: Value = serde_json::from_slice(&done.stdout).unwrap();
    assert_eq!(done.status.code(), Some(0), "the fire went on: {summary}");
}
