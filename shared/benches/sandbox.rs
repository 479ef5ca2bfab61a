//! Sandbox costs, measured in forked children (Landlock cannot be undone, and a
//! process may stack only 16 rulesets): entering the tool worker's sandbox (target:
//! at most 2 ms), and a sandboxed `run_command` against an unsandboxed spawn of the
//! same command (target: at most 1.5 times). Then the worker's full isolation
//! (issues 10 and 17): entering its namespaces (the minimal root included), Landlock
//! and seccomp, and a `run_command` round trip in them, the end-of-call kill of the
//! namespace and the write-back of the write directories included (target: at most
//! 2 ms). Prints medians; exits 1 if a target is missed.

#![forbid(unsafe_code)]
// Benchmark code is test code: a failed setup step should panic and stop the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared::sandbox::{isolate, landlock, namespaces, SandboxSpec};
use shared::settings::LandlockMode;
use shared::tools::exec::{execute, ExecContext};
use shared::tools::{ToolArgs, ToolRequest};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const RUNS: usize = 40;
/// Workers entered for the median of the isolation's set-up.
const ENTERS: usize = 15;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Runs `f` in a forked child and returns the durations it reports.
fn in_child(f: impl FnOnce() -> Vec<Duration>) -> Vec<Duration> {
    let (mut r, w) = std::io::pipe().unwrap();
    // A plain fork of this single-threaded bench (the kernel crate checks it is).
    let pid = match kernel::process::clone(kernel::process::Namespaces::default()).expect("fork") {
        kernel::process::Cloned::Child => {
            drop(r);
            let out: Vec<u8> = f().iter().flat_map(|d| (d.as_nanos() as u64).to_le_bytes()).collect();
            let mut w = w;
            let _ = w.write_all(&out);
            drop(w);
            kernel::process::exit_now(0);
        }
        kernel::process::Cloned::Parent(pid) => pid,
    };
    drop(w);
    let mut buf = Vec::new();
    r.read_to_end(&mut buf).unwrap();
    let _ = kernel::process::wait(pid);
    buf.chunks(8)
        .map(|c| Duration::from_nanos(u64::from_le_bytes(c.try_into().unwrap())))
        .collect()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let abi = landlock::kernel_abi();
    println!("kernel Landlock ABI {abi}");
    if abi < landlock::TARGET_ABI as u32 {
        println!("SKIPPED: Landlock ABI {} not available", landlock::TARGET_ABI as u32);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let scratch = root.join(".runtime/scratch/bench");
    std::fs::create_dir_all(&scratch).unwrap();
    std::fs::create_dir_all(root.join("reports")).unwrap();
    let mut read_dirs: Vec<PathBuf> = shared::sandbox::SYSTEM_READ_DIRS.iter().map(PathBuf::from).collect();
    read_dirs.push(root.clone());
    let spec = SandboxSpec {
        read_dirs,
        write_dirs: vec![scratch.clone(), root.join("reports")],
        write_files: vec!["/dev/null".into()],
        connect_ports: vec![],
        scope_ipc: true,
        max_abi: None,
    };

    let enter: Vec<Duration> = (0..RUNS)
        .flat_map(|_| {
            let spec = spec.clone();
            in_child(move || {
                let t = Instant::now();
                landlock::enforce(&spec, LandlockMode::Required).expect("enforce");
                vec![t.elapsed()]
            })
        })
        .collect();
    let enter_med = median(enter);
    println!(
        "enter sandbox: median {:.3} ms over {RUNS} forks (target <= 2 ms)",
        enter_med.as_secs_f64() * 1e3
    );

    let ctx = ExecContext {
        root: root.clone(),
        scratch: scratch.clone(),
        env: ExecContext::scrubbed_env(&scratch),
    };
    let req = ToolRequest {
        apart: false,
        masked: Vec::new(),
        call_id: "b".into(),
        args: ToolArgs::RunCommand {
            command: "true".into(),
            timeout_s: None,
        },
        timeout_ms: 5000,
        output_limit: 65536,
    };
    let (spec_ns, ctx_ns, req_ns) = (spec.clone(), ctx.clone(), req.clone());
    let plain: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let t = Instant::now();
            let out = std::process::Command::new("/bin/sh")
                .arg("-c")
                .arg("true")
                .current_dir(&root)
                .output()
                .unwrap();
            assert!(out.status.success());
            t.elapsed()
        })
        .collect();
    let sandboxed = in_child(move || {
        landlock::enforce(&spec, LandlockMode::Required).expect("enforce");
        (0..RUNS)
            .map(|_| {
                let t = Instant::now();
                let r = execute(&ctx, &req);
                assert!(r.error.is_none(), "{r:?}");
                t.elapsed()
            })
            .collect()
    });
    let (p, s) = (median(plain), median(sandboxed));
    let ratio = s.as_secs_f64() / p.as_secs_f64();
    println!("spawn `sh -c true`: unsandboxed median {:.3} ms, sandboxed run_command median {:.3} ms, ratio {ratio:.2} (target <= 1.5)", p.as_secs_f64() * 1e3, s.as_secs_f64() * 1e3);

    // The worker's whole isolation: its namespaces and minimal root (issue 17:
    // pivot_root into a tmpfs of system binds, the repository and overlays for the
    // write directories), Landlock, seccomp; entered in ENTERS forked children (a
    // process enters once). The first child then runs RUNS round trips, the worker's
    // write-back after each as in `worker::serve`: `true`, and a command that writes
    // a new 1 KiB file under `reports/` (copied into the real directory).
    let plan = namespaces::NamespacePlan::new(
        &spec_ns,
        &root,
        vec!["**/.env".into()],
        shared::settings::SandboxSettings::default().write_bytes,
    );
    let writing = |prefix: &str| ToolRequest {
        args: ToolArgs::RunCommand {
            command: format!("head -c 1024 /dev/zero > reports/{prefix}-$RUNTIME_CALL_ID"),
            timeout_s: None,
        },
        ..req_ns.clone()
    };
    let writes = writing("w");
    // The same writing command under Landlock alone, writing the real directory: what
    // the command costs without the namespaces and the write-back.
    let (plain_writes, ctx_plain, spec_plain) = (writing("p"), ctx_ns.clone(), spec_ns.clone());
    let plain_write_rounds = in_child(move || {
        landlock::enforce(&spec_plain, LandlockMode::Required).expect("enforce");
        (0..RUNS)
            .map(|n| {
                let mut r = plain_writes.clone();
                r.call_id = format!("b{n}");
                let t = Instant::now();
                let res = execute(&ctx_plain, &r);
                assert!(res.error.is_none(), "{res:?}");
                t.elapsed()
            })
            .collect()
    });
    let mut enters = Vec::new();
    let mut rounds = Vec::new();
    let mut write_rounds = Vec::new();
    let mut syncs = Vec::new();
    for i in 0..ENTERS {
        let (plan, spec_ns, ctx_ns, req_ns, writes) = (
            plan.clone(),
            spec_ns.clone(),
            ctx_ns.clone(),
            req_ns.clone(),
            writes.clone(),
        );
        let got = in_child(move || {
            let t = Instant::now();
            let layers =
                isolate::before_landlock(Some(&plan), LandlockMode::Required, &mut || Ok(None)).expect("namespaces");
            let rec =
                landlock::enforce_with(&spec_ns, LandlockMode::Required, &layers.trusted_dirs()).expect("enforce");
            let (_, wb) = isolate::after_landlock(Some(&plan), LandlockMode::Required, layers, rec).expect("seccomp");
            let mut wb = wb.expect("the write-back of the write directories");
            let mut out = vec![t.elapsed()];
            let mut syncs = Vec::new();
            if i == 0 {
                for n in 0..2 * RUNS {
                    let mut r = if n < RUNS { req_ns.clone() } else { writes.clone() };
                    r.call_id = format!("b{n}");
                    let t = Instant::now();
                    let res = execute(&ctx_ns, &r);
                    kernel::process::kill_rest_of_namespace();
                    let synced = Instant::now();
                    let not_copied = wb.sync();
                    let full = wb.full();
                    out.push(t.elapsed());
                    syncs.push(synced.elapsed());
                    assert!(
                        res.error.is_none() && not_copied == Default::default() && !full,
                        "{res:?} {not_copied:?}"
                    );
                }
            }
            out.extend(syncs.into_iter().skip(RUNS));
            out
        });
        assert!(!got.is_empty(), "the isolated child reported nothing");
        enters.push(got[0]);
        if i == 0 {
            assert_eq!(got.len(), 1 + 3 * RUNS, "the isolated child stopped early");
            rounds = got[1..=RUNS].to_vec();
            write_rounds = got[RUNS + 1..=2 * RUNS].to_vec();
            syncs = got[2 * RUNS + 1..].to_vec();
        }
    }
    let written = std::fs::read_dir(root.join("reports"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("w-"))
        .count();
    assert_eq!(written, RUNS, "every file a call wrote reached the real reports/");
    let (setup, round, write_round) = (median(enters), median(rounds), median(write_rounds));
    let (plain_write, sync) = (median(plain_write_rounds), median(syncs));
    println!(
        "isolated worker: entering namespaces (minimal root included) + Landlock + seccomp median {:.3} ms over {ENTERS} workers; round trip (write-back included) median: run_command `true` {:.3} ms (target <= 2 ms); writing a 1 KiB report {:.3} ms against {:.3} ms under Landlock alone, of which the write-back {:.3} ms, over {RUNS} each",
        setup.as_secs_f64() * 1e3,
        round.as_secs_f64() * 1e3,
        write_round.as_secs_f64() * 1e3,
        plain_write.as_secs_f64() * 1e3,
        sync.as_secs_f64() * 1e3
    );
    if enter_med > Duration::from_millis(2) || ratio > 1.5 || round > Duration::from_millis(2) {
        println!("TARGET MISSED");
        std::process::exit(1);
    }
}
