//! The builder's own commands are crash-safe (issue 22, item 3): `builder approve
//! --push`, `builder merge` and `builder land` are SIGKILLed at each of their named
//! crash points (the builder is built with the `failpoints` feature;
//! `RUNTIME_FAILPOINTS` arms them, as for the runtime) and at spread-out moments
//! after start, then run again without any failpoint: the next run of the same
//! command succeeds without a person's help, no approval this clone or the origin had
//! is lost, no git lock is left in the clone or the origin, the work tree is clean
//! and `git fsck` is clean.

use crate::team::{Team, AUTHOR, REV1};
use std::collections::BTreeSet;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::{Duration, Instant};

/// The named crash points of `approve --push`, in the order it reaches them.
const APPROVE_POINTS: &[&str] = &[
    "approve-after-fetch",
    "approve-before-ref",
    "approve-after-ref",
    "approve-before-push",
    "approve-after-push",
];
/// Those of `merge`.
const MERGE_POINTS: &[&str] = &[
    "merge-before-checkout",
    "merge-mid-checkout",
    "merge-before-ref",
    "merge-after-ref",
];
/// Those of `land`.
const LAND_POINTS: &[&str] = &[
    "land-after-fetch",
    "land-before-push",
    "land-after-push",
    "land-before-checkout",
    "land-mid-checkout",
    "land-before-ref",
    "land-after-ref",
];

/// How a run is killed.
#[derive(Debug, Clone, Copy)]
enum Kill {
    At(&'static str),
    After(Duration),
}

/// The `i`th kill of a command's trials: its named points first, then moments spread
/// over its run time: `fractions` of the median time the named-point trials took to
/// reach their points (spread through the command, so every moment falls inside a
/// run; the median, as the first run of a freshly built binary is slow). Measured,
/// not fixed: on a fast machine a fixed moment would fall after the command ended
/// and kill nothing.
fn trial(i: usize, points: &[&'static str], fractions: &[f64], reached: &[Duration]) -> Kill {
    match points.get(i) {
        Some(point) => Kill::At(point),
        None => {
            let mut sorted = reached.to_vec();
            sorted.sort();
            Kill::After(sorted[sorted.len() / 2].mul_f64(fractions[i - points.len()]))
        }
    }
}

/// Runs `builder args` in `dir` as `who`, killed as `kill` says; whether it died by
/// SIGKILL, and how long it ran. Waits for the `git` processes it started to end
/// (they outlive it).
fn run_killed(team: &Team, dir: &Path, who: (&str, &str), args: &[&str], kill: Kill) -> (bool, Duration) {
    let mut cmd = team.env.command("builder", args);
    cmd.current_dir(dir)
        .env("GIT_AUTHOR_NAME", who.0)
        .env("GIT_AUTHOR_EMAIL", who.1)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let started = std::time::Instant::now();
    let died = match kill {
        Kill::At(point) => {
            let status = cmd.env("RUNTIME_FAILPOINTS", point).status().unwrap();
            status.signal() == Some(libc::SIGKILL)
        }
        Kill::After(delay) => {
            let mut child = cmd.spawn().unwrap();
            std::thread::sleep(delay);
            let alive = child.try_wait().unwrap().is_none();
            if alive {
                child.kill().unwrap();
            }
            let status = child.wait().unwrap();
            alive && status.signal() == Some(libc::SIGKILL)
        }
    };
    let ran = started.elapsed();
    wait_for_children_of(dir);
    (died, ran)
}

/// Waits (up to 20 s) until no process names `dir` on its command line (the `git`
/// a killed builder started).
fn wait_for_children_of(dir: &Path) {
    let needle = dir.to_string_lossy().into_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let busy = std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                return false;
            };
            if pid == std::process::id() as i32 || crate::crash::gone(pid) {
                return false;
            }
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(&needle))
                .unwrap_or(false)
        });
        if !busy {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("processes on {} outlived 20 s", dir.display());
}

/// Every `*.lock` file under `dir`.
fn locks_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                stack.push(p);
            } else if p.to_string_lossy().ends_with(".lock") {
                out.push(p.display().to_string());
            }
        }
    }
    out
}

/// The checks after each trial's successful rerun: no lock in the clone or the
/// origin, a clean work tree, `git fsck` clean, and every approval seen still there.
fn check(team: &Team, dir: &Path, seen: &mut BTreeSet<String>) {
    for d in [dir.join(".git"), team.origin.clone()] {
        let left = locks_under(&d);
        assert!(left.is_empty(), "locks left: {left:?}");
    }
    assert_eq!(team.git(dir, &["status", "--porcelain", "--untracked-files=no"]), "");
    for d in [dir, team.origin.as_path()] {
        let (ok, out) = team.try_git(d, &["fsck", "--no-progress", "--no-dangling"]);
        assert!(ok && !out.contains("error"), "fsck in {}: {out}", d.display());
    }
    let now: BTreeSet<String> = team
        .approvals(dir)
        .union(&team.approvals(&team.origin))
        .cloned()
        .collect();
    assert!(
        seen.is_subset(&now),
        "approvals lost: {:?}",
        seen.difference(&now).collect::<Vec<_>>()
    );
    *seen = now;
}

/// Spread-out moments for the timed kills, as fractions of a run (between 0.05 and
/// 0.95; a fixed seed: the same trials each run).
fn moments(n: usize, seed: u64) -> Vec<f64> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            0.05 + ((x >> 33) % 900) as f64 / 1000.0
        })
        .collect()
}

#[test]
fn approve_push_killed_at_each_point_and_moment_succeeds_next_time_and_loses_nothing() {
    let team = Team::new();
    let mut seen = BTreeSet::new();
    let mut kills = 0;
    let fractions = moments(12, 7);
    let trials = APPROVE_POINTS.len() + fractions.len();
    let mut reached = Vec::new();
    for i in 0..trials {
        let kill = trial(i, APPROVE_POINTS, &fractions, &reached);
        let name = format!("a{i}");
        team.propose_pushed(&name);
        let (died, ran) = run_killed(&team, &team.rev1, REV1, &["approve", &name, "--push"], kill);
        if let Kill::At(p) = kill {
            assert!(died, "{p} was never reached");
            reached.push(ran);
        }
        kills += usize::from(died);
        let out = team.builder_ok(&team.rev1, REV1, &["approve", &name, "--push"]);
        assert!(out.contains("approved proposals/"), "{out}");
        check(&team, &team.rev1, &mut seen);
        let origin = team.approvals(&team.origin);
        assert_eq!(
            team.approvals(&team.rev1),
            origin,
            "after {kill:?}: the origin has every approval"
        );
        // One approval per proposal, however often the command was killed.
        let listed = team.builder_ok(&team.rev1, REV1, &["proposals"]);
        assert!(listed.contains(&format!("{name}\tapproved")), "{listed}");
    }
    assert_eq!(team.approvals(&team.origin).len(), 1 + trials, "one approval each");
    assert!(kills >= 5 + 6, "only {kills} runs were killed");
    eprintln!("approve --push: {kills} SIGKILLs");
}

#[test]
fn merge_and_land_killed_at_each_point_and_moment_succeed_next_time() {
    let team = Team::new();
    let mut seen = BTreeSet::new();
    let mut kills = 0;
    // merge, in the author's clone: each proposal approved, merged locally, pushed.
    for (i, point) in MERGE_POINTS.iter().enumerate() {
        let name = format!("m{i}");
        team.propose_pushed(&name);
        team.builder_ok(&team.rev1, REV1, &["approve", &name, "--push"]);
        team.git(team.author(), &["pull", "-q"]);
        assert!(
            run_killed(&team, team.author(), AUTHOR, &["merge", &name], Kill::At(point)).0,
            "{point}"
        );
        kills += 1;
        let out = team.builder_ok(team.author(), AUTHOR, &["merge", &name]);
        assert!(
            out.contains("merged proposals/") || out.contains("merged already"),
            "{out}"
        );
        check(&team, team.author(), &mut seen);
        team.git(team.author(), &["push", "-q"]);
    }
    // land: the box moves the origin before each; named points, then moments.
    let fractions = moments(12, 11);
    let mut reached = Vec::new();
    for i in 0..LAND_POINTS.len() + fractions.len() {
        let kill = trial(i, LAND_POINTS, &fractions, &reached);
        let name = format!("l{i}");
        team.propose_pushed(&name);
        team.builder_ok(&team.rev1, REV1, &["approve", &name, "--push"]);
        team.records_on_origin();
        let (died, ran) = run_killed(&team, team.author(), AUTHOR, &["land", &name], kill);
        if let Kill::At(p) = kill {
            assert!(died, "{p} was never reached");
            reached.push(ran);
        }
        kills += usize::from(died);
        let out = team.builder_ok(team.author(), AUTHOR, &["land", &name]);
        assert!(
            out.contains("landed proposals/") || out.contains("nothing to push"),
            "{out}"
        );
        check(&team, team.author(), &mut seen);
        assert_eq!(
            team.git(team.author(), &["rev-parse", "HEAD"]),
            team.origin_main(),
            "after {kill:?}: the author's main is the origin's"
        );
        let (code, out, _) = team.builder(team.author(), AUTHOR, &["audit"]);
        assert_eq!(code, 0, "after {kill:?}: {out}");
    }
    assert!(kills >= 4 + 7 + 6, "only {kills} runs were killed");
    eprintln!("merge and land: {kills} SIGKILLs");
}
