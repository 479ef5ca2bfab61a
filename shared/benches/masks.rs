//! What the `Read` deny masks cost a tool worker's start (issue 10, item 6 of w3):
//! the worker walks the repository for paths a deny glob (`**/.env`) matches and for
//! UNIX sockets, and masks them in its mount namespace. Measured on a small
//! repository (the scaffold's size) and on one with 101,400 entries (200 directories
//! of 505 files and a `.env` each), entering the namespaces in forked children (a
//! process enters them once). Each child then reads every `.env` and reports how
//! many it could still read: a walk that stops early leaves those unmasked. Prints
//! medians; exits 1 when a `.env` stayed readable.

#![forbid(unsafe_code)]
// Benchmark code is test code: a failed setup step should panic and stop the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use shared::sandbox::{isolate, mask_walk, namespaces, SandboxSpec};
use shared::settings::LandlockMode;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const RUNS: usize = 11;
const DIRS: usize = 200;
const FILES_PER_DIR: usize = 505;

/// Runs `f` in a forked child (whose namespaced clone reports) and returns the
/// numbers it wrote.
fn in_child(f: impl FnOnce() -> Vec<u64>) -> Vec<u64> {
    let (mut r, w) = std::io::pipe().unwrap();
    // A plain fork of this single-threaded bench (the kernel crate checks it is).
    let pid = match kernel::process::clone(kernel::process::Namespaces::default()).expect("fork") {
        kernel::process::Cloned::Child => {
            drop(r);
            let out: Vec<u8> = f().iter().flat_map(|n| n.to_le_bytes()).collect();
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
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// A repository root with the scaffold's directories and `dirs` x `files` files
/// under `data/`, a `.env` holding a secret in each of those directories.
fn tree(dirs: usize, files: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    for d in [
        "prompts",
        "scope",
        "settings",
        "tools",
        "evals/digest",
        "reports",
        ".git/hooks",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    for f in [
        "prompts/digest.md",
        "scope/SCOPE.md",
        "settings/runtime.yaml",
        "tools/ctx.sh",
        ".env",
    ] {
        std::fs::write(root.join(f), "secret\n").unwrap();
    }
    for d in 0..dirs {
        let sub = root.join(format!("data/d{d:03}"));
        std::fs::create_dir_all(&sub).unwrap();
        for f in 0..files {
            std::fs::File::create(sub.join(format!("f{f:04}"))).unwrap();
        }
        std::fs::write(sub.join(".env"), "secret\n").unwrap();
    }
    std::fs::create_dir_all(root.join(".runtime/scratch/bench")).unwrap();
    dir
}

fn dotenvs(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.join(".env")];
    if let Ok(entries) = std::fs::read_dir(root.join("data")) {
        out.extend(entries.flatten().map(|e| e.path().join(".env")));
    }
    out
}

/// Median time to enter the namespaces (the mask walk included), and the most
/// `.env` files any child could still read.
fn measure(root: &Path) -> (Duration, u64) {
    let scratch = root.join(".runtime/scratch/bench");
    let mut read_dirs: Vec<PathBuf> = shared::sandbox::SYSTEM_READ_DIRS.iter().map(PathBuf::from).collect();
    read_dirs.push(root.to_path_buf());
    let spec = SandboxSpec {
        read_dirs,
        write_dirs: vec![scratch, root.join("reports")],
        write_files: vec!["/dev/null".into()],
        connect_ports: vec![],
        scope_ipc: true,
        max_abi: None,
    };
    let plan = namespaces::NamespacePlan::new(
        &spec,
        root,
        vec!["**/.env".into()],
        shared::settings::SandboxSettings::default().write_bytes,
    );
    let envs = dotenvs(root);
    let mut times = Vec::new();
    let mut readable = 0;
    for _ in 0..RUNS {
        let (plan, envs) = (plan.clone(), envs.clone());
        let got = in_child(move || {
            let t = Instant::now();
            isolate::before_landlock(Some(&plan), LandlockMode::Required, &mut || Ok(None)).expect("namespaces");
            let took = t.elapsed().as_nanos() as u64;
            let open = envs
                .iter()
                .filter(|p| std::fs::read_to_string(p).is_ok_and(|s| s.contains("secret")))
                .count() as u64;
            vec![took, open]
        });
        assert_eq!(got.len(), 2, "the child reported nothing");
        times.push(Duration::from_nanos(got[0]));
        readable = readable.max(got[1]);
    }
    times.sort();
    (times[times.len() / 2], readable)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if namespaces::probe().is_err() {
        println!("SKIPPED: user namespaces not available");
        return;
    }
    let small = tree(0, 0);
    let (t, open) = measure(small.path());
    println!(
        "worker namespaces, scaffold-sized repo: median {:.2} ms over {RUNS}; .env files still readable: {open}",
        t.as_secs_f64() * 1e3
    );
    let made = Instant::now();
    let big = tree(DIRS, FILES_PER_DIR);
    let entries = DIRS * (FILES_PER_DIR + 1) + DIRS;
    println!(
        "(made a tree of {entries} entries under data/ in {:.1} s)",
        made.elapsed().as_secs_f64()
    );
    let (t, open_big) = measure(big.path());
    println!(
        "worker namespaces, {entries} entries: median {:.2} ms over {RUNS}; .env files still readable: {open_big} of {}",
        t.as_secs_f64() * 1e3,
        DIRS + 1
    );
    // The runtime's walk for the same masks (it sends them to the worker), without
    // its cache, then with it once every directory is a second old (settled).
    let plan = namespaces::NamespacePlan::new(
        &SandboxSpec::default(),
        big.path(),
        vec!["**/.env".into()],
        shared::settings::SandboxSettings::default().write_bytes,
    );
    let cache_dir = tempfile::tempdir().unwrap();
    let cache = cache_dir.path().join(mask_walk::CACHE_FILE);
    let walk = |cache: Option<&Path>| {
        let mut times: Vec<Duration> = (0..RUNS)
            .map(|_| {
                let t = Instant::now();
                let found = mask_walk::plan_masks(&plan, cache).expect("walk");
                assert_eq!(found.len(), DIRS + 1, "every .env is found");
                t.elapsed()
            })
            .collect();
        times.sort();
        times[RUNS / 2].as_secs_f64() * 1e3
    };
    let uncached = walk(None);
    std::thread::sleep(Duration::from_millis(3_200));
    mask_walk::plan_masks(&plan, Some(&cache)).expect("walk");
    let cached = walk(Some(&cache));
    println!(
        "the runtime's mask walk, {entries} entries: median {uncached:.2} ms without its cache, {cached:.2} ms with it"
    );
    if open + open_big > 0 {
        println!("FAILS OPEN: a Read deny path stayed readable");
        std::process::exit(1);
    }
}
