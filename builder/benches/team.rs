//! Team benchmark (issue 18): `builder approve --push` and `builder land` on a
//! repository with 10,000 records-only commits and 1,000 approvals, against a bare
//! origin on disk, each under 1 s. Every timed run is the real binary doing the real
//! work: fetch, record, `ls-remote`, push (the pre-push hook judging the pushed range)
//! and, for land, the merge onto a tip the box moved just before. Prints the numbers
//! (best and median of 5); exits 1 if a median misses its target. The author's clone
//! is packed after the set-up, as a team's is (`TEAM_BENCH_LOOSE=1` keeps its 10,000
//! objects loose, the worst case, where git's automatic gc runs during the timed
//! commands).

#![forbid(unsafe_code)]
// Benchmark code is test code: a failed setup step should panic and stop the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use git2::{Repository, Signature};
use shared::git::Person;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const RECORDS: usize = 10_000;
const APPROVALS: usize = 1_000;
const RUNS: usize = 5;
const TARGET: Duration = Duration::from_secs(1);

fn with_env<'c>(cmd: &'c mut Command, who: (&str, &str)) -> &'c mut Command {
    cmd.env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", who.0)
        .env("GIT_AUTHOR_EMAIL", who.1)
        .env("GIT_COMMITTER_NAME", who.0)
        .env("GIT_COMMITTER_EMAIL", who.1)
}

fn builder(dir: &Path, who: (&str, &str), args: &[&str]) -> Output {
    let out = with_env(
        Command::new(env!("CARGO_BIN_EXE_builder")).args(args).current_dir(dir),
        who,
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "builder {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn git(dir: &Path, args: &[&str]) -> String {
    let bin = Path::new(env!("CARGO_BIN_EXE_builder")).parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let out = with_env(Command::new("git").args(args).current_dir(dir), ENG)
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

const ENG: (&str, &str) = ("Eng", "eng@example.com");
const REV: (&str, &str) = ("Rev", "rev@example.com");

/// 10,000 records-only commits on HEAD, as the runtime makes them.
fn records(repo: &Repository, n: usize, from: usize) {
    let sig = Signature::now("runtime", "runtime@localhost").unwrap();
    for i in from..from + n {
        let parent = repo.head().unwrap().peel_to_commit().unwrap();
        let mut update = git2::build::TreeUpdateBuilder::new();
        let path = format!(
            "runs/digest/2026-{:02}-{:02}/{i}.json",
            1 + i / 3100,
            1 + (i / 100) % 31
        );
        update.upsert(path.as_str(), repo.blob(b"{}").unwrap(), git2::FileMode::Blob);
        let tree = repo
            .find_tree(update.create_updated(repo, &parent.tree().unwrap()).unwrap())
            .unwrap();
        repo.commit(Some("HEAD"), &sig, &sig, "records", &tree, &[&parent])
            .unwrap();
    }
}

fn median(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    (v[0], v[v.len() / 2])
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let author = dir.path().join("author");
    let origin = dir.path().join("origin.git");
    let rev = dir.path().join("rev");
    let cron = dir.path().join("cron");
    builder(dir.path(), ENG, &["init", author.to_str().unwrap()]);
    git(&author, &["add", "-A"]);
    git(&author, &["commit", "-q", "-m", "scaffold"]);
    git(&author, &["branch", "-M", "main"]);
    git(
        dir.path(),
        &["init", "--bare", "-q", "-b", "main", origin.to_str().unwrap()],
    );
    git(&author, &["remote", "add", "origin", origin.to_str().unwrap()]);
    builder(&author, ENG, &["install-hooks"]);
    let repo = Repository::open(&author).unwrap();
    records(&repo, RECORDS, 0);
    let rev_person = Person {
        name: REV.0.into(),
        email: REV.1.into(),
    };
    let tree = shared::review::builder_tree_of_commit(&repo, repo.head().unwrap().target().unwrap()).unwrap();
    for i in 0..APPROVALS {
        let body = shared::review::approvals::signed_body(&format!("old{i}"), tree, tree, &rev_person, None).unwrap();
        shared::review::approvals::write(&repo, body, &rev_person).unwrap();
    }
    // The records were committed past the index: bring index and work tree along.
    git(&author, &["reset", "-q", "--hard"]);
    // As a team's clone holds them: packed (the box's fires run `git gc --auto`, and
    // clones receive packs). 10,000 loose objects would make every timed git command
    // start an automatic gc of the bench's own making.
    if std::env::var_os("TEAM_BENCH_LOOSE").is_none() {
        git(&author, &["gc", "-q"]);
    }
    git(&author, &["push", "-q", "-u", "origin", "main"]);
    git(&author, &["push", "-q"]);
    for d in [&rev, &cron] {
        git(
            dir.path(),
            &["clone", "-q", origin.to_str().unwrap(), d.to_str().unwrap()],
        );
    }
    builder(&rev, REV, &["install-hooks"]);
    git(&rev, &["fetch", "-q"]);
    println!(
        "setup: {RECORDS} records-only commits, {} approvals on the origin",
        git(
            &origin,
            &["for-each-ref", "--count=100000", "--format=x", "refs/builder/approved/"]
        )
        .lines()
        .count()
    );

    let mut approve_times = Vec::new();
    let mut land_times = Vec::new();
    for i in 0..RUNS {
        let name = format!("p{i}");
        let prompt = author.join("prompts/digest.md");
        let text = std::fs::read_to_string(&prompt).unwrap();
        std::fs::write(&prompt, format!("{text}\n{name}\n")).unwrap();
        builder(&author, ENG, &["propose", &name, "--push"]);
        let t = Instant::now();
        builder(&rev, REV, &["approve", &name, "--push"]);
        approve_times.push(t.elapsed());
        // The box moves the origin with records before the land.
        git(&cron, &["pull", "-q", "--no-rebase"]);
        let cron_repo = Repository::open(&cron).unwrap();
        records(&cron_repo, 1, RECORDS + i);
        git(&cron, &["reset", "-q", "--hard"]);
        git(&cron, &["push", "-q", "--no-verify", "origin", "HEAD:main"]);
        let t = Instant::now();
        builder(&author, ENG, &["land", &name]);
        land_times.push(t.elapsed());
    }
    let (ab, am) = median(approve_times);
    let (lb, lm) = median(land_times);
    println!("builder approve --push: best {ab:.2?}, median {am:.2?} (target {TARGET:?})");
    println!("builder land:           best {lb:.2?}, median {lm:.2?} (target {TARGET:?})");
    if am > TARGET || lm > TARGET {
        eprintln!("a target was missed");
        std::process::exit(1);
    }
}
