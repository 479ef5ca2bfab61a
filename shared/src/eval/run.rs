//! Running eval cases against one revision: a temporary checkout of the commit in a
//! repository of its own (detached, under a temporary directory, removed afterwards;
//! never a linked worktree, whose git directory is the engineer's), and for each case one
//! or more real fires of the `runtime` binary there with `--no-commit`, so a case
//! runs the same loader, policy, tool worker and sandbox as cron does, commits
//! nothing and writes its records and `.runtime/` state into the throwaway worktree,
//! never the engineer's. Scripted cases answer from their script through the replay
//! provider (`runtime fire --replay`), offline and deterministically.
//!
//! Every fire runs under the trusted configuration ([`super::trusted`]): it is handed
//! the trusted settings file and an allow-listed environment, with `HOME` a scratch
//! directory beside the worktree.

use super::case::{Assertion, Case, CaseModel};
use super::scratch::Scratch;
use super::trusted::Trusted;
use super::{CaseRun, Failure};
use crate::records::{Receipt, RecordedDecision};
use crate::secrets::Redactor;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// git's variables that would point a child process at the engineer's checkout (a
/// hook's `GIT_INDEX_FILE`, a `GIT_WORK_TREE`) instead of the temporary worktree:
/// removed from every git and runtime process an eval starts.
pub const CHECKOUT_ENV: &[&str] = &[
    "GIT_DIR",
    "GIT_WORK_TREE",
    "GIT_INDEX_FILE",
    "GIT_COMMON_DIR",
    "GIT_PREFIX",
    "GIT_OBJECT_DIRECTORY",
    "GIT_ALTERNATE_OBJECT_DIRECTORIES",
    "GIT_QUARANTINE_PATH",
];

fn scrubbed(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    for var in CHECKOUT_ENV {
        cmd.env_remove(var);
    }
    cmd
}

/// Why a revision could not be evaluated at all.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("{0}")]
    Worktree(String),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// The trusted configuration cannot be had (no base, an unreadable file).
    #[error("{0}")]
    Trusted(String),
}

/// A checkout of one commit in a repository of its own, in a temporary directory;
/// removed on drop. Not a linked worktree of the engineer's repository: an eval fire's
/// tools may read the git directory of the repository they run in (`git log` works
/// there), and a linked worktree's common directory is the engineer's own (its
/// config with credentials, the stash, hooks, every branch). The repository holds
/// the commit's tree and nothing the engineer has besides.
pub struct TempWorktree {
    pub path: PathBuf,
    /// An empty directory beside the worktree: the `HOME` of its eval fires.
    pub home: PathBuf,
    _dir: Scratch,
}

impl TempWorktree {
    /// A fresh repository (`git init` with no template, so no hooks) that fetches
    /// `commit` alone from `repo` (whose work tree is `repo_root`; depth 1: no history,
    /// no other ref) and checks it out detached, with git's own commands; refused
    /// first when the checkout would be oversized ([`refuse_oversized`]).
    pub fn add(repo: &git2::Repository, repo_root: &Path, commit: &str) -> Result<TempWorktree, EvalError> {
        let dir = Scratch::new("builder-eval-").map_err(|(path, source)| EvalError::Io { path, source })?;
        let path = dir.path().join("wt");
        let home = dir.path().join("home");
        std::fs::create_dir(&home).map_err(|source| EvalError::Io {
            path: home.clone(),
            source,
        })?;
        refuse_oversized(repo, commit)?;
        let init = ["init", "--quiet", "--template="];
        git(dir.path(), GitConfig::RepositoryOnly, &init, &[path.as_os_str()])?;
        git(
            &path,
            GitConfig::Engineers,
            &["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", "--depth=1"],
            &[repo_root.as_os_str(), commit.as_ref()],
        )?;
        let checkout = ["checkout", "--quiet", "--detach"];
        git(&path, GitConfig::RepositoryOnly, &checkout, &[commit.as_ref()])?;
        // A test kills the eval here: the next eval sweeps what it left.
        crate::failpoint!("eval-checkout-made");
        Ok(TempWorktree { path, home, _dir: dir })
    }
}

/// The most a revision's checkout may write (blob bytes summed over its paths) and the
/// most entries its tree may hold. A proposal is small; a tree that repeats one blob
/// under many paths (a few kilobytes in git, gigabytes checked out) or holds a huge
/// file would otherwise fill the reviewer's disk before any sandbox.
pub const MAX_CHECKOUT_BYTES: u64 = 1 << 30;
pub const MAX_CHECKOUT_ENTRIES: u64 = 100_000;

/// Refuses `commit` of `repo` when checking it out would write more than
/// [`MAX_CHECKOUT_BYTES`] or [`MAX_CHECKOUT_ENTRIES`]. Walks the tree with a stack (no
/// recursion however deep it nests) and stops at the first excess, so a tree of
/// billions of paths costs no more than the bound to judge.
fn refuse_oversized(repo: &git2::Repository, commit: &str) -> Result<(), EvalError> {
    let git = |e: git2::Error| EvalError::Worktree(format!("reading {commit}: {}", e.message()));
    let odb = repo.odb().map_err(git)?;
    let oid = git2::Oid::from_str(commit).map_err(git)?;
    let mut stack = vec![repo.find_commit(oid).map_err(git)?.tree_id()];
    let (mut bytes, mut entries) = (0u64, 0u64);
    while let Some(id) = stack.pop() {
        let tree = repo.find_tree(id).map_err(git)?;
        for e in tree.iter() {
            entries += 1;
            match e.kind() {
                Some(git2::ObjectType::Tree) => stack.push(e.id()),
                Some(git2::ObjectType::Blob) => bytes += odb.read_header(e.id()).map_err(git)?.0 as u64,
                _ => {}
            }
            if bytes > MAX_CHECKOUT_BYTES || entries > MAX_CHECKOUT_ENTRIES {
                return Err(EvalError::Worktree(format!(
                    "{commit} is not checked out for evaluation: its tree would write more than {} MiB or {MAX_CHECKOUT_ENTRIES} entries (a blob repeated under many paths, or a huge file); nothing of it ran",
                    MAX_CHECKOUT_BYTES >> 20
                )));
            }
        }
    }
    Ok(())
}

/// Whose git configuration a git command of [`TempWorktree::add`] reads.
#[derive(Clone, Copy, PartialEq)]
enum GitConfig {
    /// The engineer's too (global and system): the fetch from their repository.
    Engineers,
    /// The new repository's own alone: the commands that write the revision's files.
    /// A proposal's `.gitattributes` picks which of the configured filters run on its
    /// content (git-lfs fetching from the URL its `.lfsconfig` names, any smudge
    /// command), and the engineer's `core.hooksPath` or `core.fsmonitor` would run
    /// beside it: none of them is configured here.
    RepositoryOnly,
}

fn git(root: &Path, config: GitConfig, args: &[&str], paths: &[&std::ffi::OsStr]) -> Result<(), EvalError> {
    let mut cmd = scrubbed(Path::new("git"));
    if config == GitConfig::RepositoryOnly {
        cmd.env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null");
        cmd.env_remove("GIT_CONFIG_PARAMETERS").env_remove("GIT_CONFIG_COUNT");
    }
    let out = cmd
        .arg("-C")
        .arg(root)
        .args(args)
        .args(paths)
        .output()
        .map_err(|e| EvalError::Worktree(format!("cannot run git: {e}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(EvalError::Worktree(format!(
            "git {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// What one fire of a case left, read back from the worktree.
struct Fired {
    receipt: Option<Receipt>,
    report: String,
    /// The bytes of every record the fire wrote (report, receipt, cards).
    records: Vec<Vec<u8>>,
    message: String,
    wall_ms: u64,
    /// The kinds of the cards the fire wrote.
    card_kinds: Vec<String>,
}

/// Where and how eval fires run: the `runtime` binary, the worktree, its scratch
/// `HOME`, and the trusted configuration.
#[derive(Clone, Copy)]
pub struct Firing<'a> {
    pub runtime: &'a Path,
    pub wt: &'a Path,
    pub home: &'a Path,
    pub trusted: &'a Trusted,
}

impl<'a> Firing<'a> {
    /// Eval fires of `wt` under `trusted`.
    pub fn new(runtime: &'a Path, wt: &'a TempWorktree, trusted: &'a Trusted) -> Firing<'a> {
        Firing {
            runtime,
            wt: &wt.path,
            home: &wt.home,
            trusted,
        }
    }
}

/// The most an eval reads of one record its fire wrote.
const FIRED_RECORD_CAP: u64 = 64 << 20;

/// A fire that never started, with why.
fn not_fired(message: String) -> Fired {
    Fired {
        receipt: None,
        report: String::new(),
        records: vec![],
        message,
        wall_ms: 0,
        card_kinds: vec![],
    }
}

/// Fires `case` once in the worktree of `f`. `n` numbers the fire (the scripted
/// trace's file name).
fn fire_once(f: &Firing, case: &Case, n: usize) -> Result<Fired, EvalError> {
    let (runtime, wt) = (f.runtime, f.wt);
    let mut cmd = Command::new(runtime);
    // A builder killed meanwhile (a CI job's timeout) takes the fire with it: no eval
    // fire runs on, unwatched, after the review that started it ended. This thread
    // waits for the fire, so the signal never comes while the fire is wanted.
    kernel::spawn::die_with_parent(&mut cmd);
    f.trusted
        .environment(&mut cmd, f.home, matches!(case.model, CaseModel::Provider));
    cmd.arg("-C").arg(wt).args([
        "fire",
        &case.task,
        "--no-commit",
        "--eval",
        "--json",
        "--progress",
        "never",
    ]);
    cmd.arg("--trusted-settings").arg(f.trusted.file());
    if let Err(why) = model_args(&mut cmd, case, wt, n) {
        return Ok(not_fired(why));
    }
    let started = Instant::now();
    let out = cmd
        .output()
        .map_err(|e| EvalError::Worktree(format!("cannot run {}: {e}", runtime.display())))?;
    let wall_ms = started.elapsed().as_millis() as u64;
    Ok(read_fired(wt, &out, wall_ms))
}

/// Adds the arguments that point the fire at the case's model: its script (written
/// into the worktree first) or replay trace; `Err` says why the case cannot fire.
fn model_args(cmd: &mut Command, case: &Case, wt: &Path, n: usize) -> Result<(), String> {
    match &case.model {
        CaseModel::Scripted(trace) => {
            // Written through no link the revision's tree may hold (a committed
            // `.runtime` linking into the reviewer's home is never written through):
            // anything at the name is removed first, the directories are made one by one.
            let rel = Path::new(crate::layout::STATE_DIR)
                .join("eval")
                .join(format!("script-{n}.json"));
            let body = serde_json::to_vec(trace).unwrap_or_default();
            let written = crate::beneath::open_root(wt).and_then(|root| {
                match crate::beneath::remove_file(&root, &rel) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
                crate::beneath::create_new(&root, &rel, &body)
            });
            if let Err(e) = written {
                return Err(format!(
                    "the case's script could not be written to {}: {e} (a link the revision put on the way is never followed)",
                    rel.display()
                ));
            }
            cmd.arg("--replay").arg(wt.join(&rel));
        }
        CaseModel::Replay(rel) => {
            let inside = Path::new(rel)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !inside {
                return Err(format!(
                    "the case's replay trace `{rel}` is not a path inside the repository"
                ));
            }
            cmd.arg("--replay").arg(wt.join(rel));
        }
        CaseModel::Provider => {}
    }
    Ok(())
}

/// What a finished fire left: its JSON summary's message (else its stderr), and its
/// receipt, report and cards read through no link the revision's tree may hold.
fn read_fired(wt: &Path, out: &std::process::Output, wall_ms: u64) -> Fired {
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let mut fired = Fired {
        receipt: None,
        report: String::new(),
        records: vec![],
        message: summary["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| String::from_utf8_lossy(&out.stderr).trim().to_string()),
        wall_ms,
        card_kinds: vec![],
    };
    // What the fire wrote, read through no link the revision's tree may hold.
    let root = crate::beneath::open_root(wt).ok();
    let read = |rel: &str| {
        let root = root.as_ref()?;
        crate::beneath::read_regular(root, Path::new(rel), FIRED_RECORD_CAP).ok()
    };
    if let Some(bytes) = summary["receipt"].as_str().and_then(read) {
        fired.receipt = serde_json::from_slice(&bytes).ok();
        fired.records.push(bytes);
    }
    if let Some(bytes) = summary["report"].as_str().and_then(read) {
        fired.report = String::from_utf8_lossy(&bytes).into_owned();
        fired.records.push(bytes);
    }
    for id in summary["cards"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_str())
    {
        for p in crate::cards::work_tree_card_paths(wt, id) {
            if let Some(bytes) = read(&p) {
                if let Ok(card) = serde_yaml::from_slice::<crate::records::Card>(&bytes) {
                    fired.card_kinds.push(card.kind.as_str().to_string());
                }
                fired.records.push(bytes);
            }
        }
    }
    fired
}

/// How a re-run of a recorded run ended.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Refired {
    /// The receipt's status, or `none` when the fire left no receipt.
    pub status: String,
    pub card_kinds: Vec<String>,
    pub message: String,
}

/// Fires `task` once in `wt` answering from `trace` (a run's recorded model
/// responses), without a commit.
pub fn refire(f: &Firing, task: &str, trace: crate::provider::ReplayTrace) -> Result<Refired, EvalError> {
    let case = Case {
        file: PathBuf::new(),
        name: "re-run".into(),
        task: task.to_string(),
        model: CaseModel::Scripted(trace),
        repeat: 1,
        min_pass: 1.0,
        asserts: vec![],
        fixes: vec![],
        base_version: false,
    };
    let fired = fire_once(f, &case, 0)?;
    Ok(Refired {
        status: fired.receipt.as_ref().map_or("none", |r| r.status.as_str()).to_string(),
        card_kinds: fired.card_kinds,
        message: fired.message,
    })
}

/// Runs `case` in `wt` (`repeat` times for a live model, once otherwise) and judges
/// every fire by the case's assertions. `secrets` finds secret values in records.
pub fn run_case(f: &Firing, case: &Case, secrets: &Redactor) -> Result<CaseRun, EvalError> {
    let runs = match case.model {
        CaseModel::Provider => case.repeat,
        CaseModel::Scripted(_) | CaseModel::Replay(_) => 1,
    };
    let mut row = CaseRun {
        runs,
        ..CaseRun::default()
    };
    for n in 0..runs as usize {
        let fired = fire_once(f, case, n)?;
        let failures = judge(case, &fired, secrets);
        if failures.is_empty() {
            row.passed += 1;
        }
        if let Some(r) = &fired.receipt {
            row.sandbox = Some(r.sandbox.clone());
            row.steps += r.steps as u64;
            row.tool_calls += r.tool_calls.len() as u64;
            row.tokens += r.tokens.total();
            row.cost_usd += r.cost_usd;
            row.denials += r.denials as u64;
            row.duration_ms += (r.finished_at - r.started_at).num_milliseconds().max(0) as u64;
        } else {
            row.duration_ms += fired.wall_ms;
        }
        for f in failures {
            if !row.failures.iter().any(|g: &Failure| g.assertion == f.assertion) {
                row.failures.push(f);
            }
        }
    }
    Ok(row)
}

/// The assertions `fired` breaks, each with what was seen.
fn judge(case: &Case, fired: &Fired, secrets: &Redactor) -> Vec<Failure> {
    let Some(r) = &fired.receipt else {
        return vec![Failure {
            assertion: "fire".into(),
            detail: format!("the fire left no receipt: {}", fired.message),
        }];
    };
    if r.stop_reason == crate::records::StopReason::NotStarted {
        return vec![Failure {
            assertion: "fire".into(),
            detail: format!("the fire was refused before its first step: {}", fired.message),
        }];
    }
    let seen = Seen {
        receipt: r,
        fired,
        secrets,
        called: r.tool_calls.iter().map(|c| c.name.as_str()).collect(),
        ran: r
            .tool_calls
            .iter()
            .filter(|c| c.decision == RecordedDecision::Allow)
            .map(|c| c.name.as_str())
            .collect(),
    };
    case.asserts
        .iter()
        .filter_map(|a| {
            seen.broken(a).map(|detail| Failure {
                assertion: a.label(),
                detail,
            })
        })
        .collect()
}

/// What one fire showed, for judging its case's assertions one by one.
struct Seen<'a> {
    receipt: &'a Receipt,
    fired: &'a Fired,
    secrets: &'a Redactor,
    /// The tools called, in order.
    called: Vec<&'a str>,
    /// Those of them the policy allowed.
    ran: Vec<&'a str>,
}

impl Seen<'_> {
    /// What breaks `a`, or `None` when it holds.
    fn broken(&self, a: &Assertion) -> Option<String> {
        let (r, fired, secrets) = (self.receipt, self.fired, self.secrets);
        let (called, ran) = (&self.called, &self.ran);
        match a {
            Assertion::MustCall(tools) => {
                let missing: Vec<&str> = tools.iter().map(String::as_str).filter(|t| !ran.contains(t)).collect();
                (!missing.is_empty()).then(|| {
                    format!(
                        "not called (and allowed): {}; calls: {}",
                        missing.join(", "),
                        shown(called)
                    )
                })
            }
            Assertion::MustNotCall(tools) => {
                let hit: Vec<&str> = tools
                    .iter()
                    .map(String::as_str)
                    .filter(|t| called.contains(t))
                    .collect();
                (!hit.is_empty()).then(|| format!("called: {}", hit.join(", ")))
            }
            Assertion::CallOrder(order) => {
                let mut it = called.iter();
                let in_order = order.iter().all(|want| it.any(|c| c == want));
                (!in_order).then(|| format!("calls were {}", shown(called)))
            }
            Assertion::ReportContains(needles) => {
                let missing: Vec<&str> = needles
                    .iter()
                    .map(String::as_str)
                    .filter(|n| !fired.report.contains(n))
                    .collect();
                (!missing.is_empty()).then(|| format!("the report lacks {}", quoted(&missing)))
            }
            Assertion::ReportMatches(re) => {
                (!re.is_match(&fired.report)).then(|| format!("the report does not match /{}/", re.as_str()))
            }
            Assertion::MaxSteps(n) => (r.steps > *n).then(|| format!("{} steps", r.steps)),
            Assertion::MaxCostUsd(x) => (r.cost_usd > *x).then(|| format!("cost {:.4} USD", r.cost_usd)),
            Assertion::NoDenials => (r.denials > 0).then(|| denials_shown(r)),
            Assertion::AcceptancePasses => acceptance_failure(r),
            Assertion::NoSecretInRecords => fired
                .records
                .iter()
                .any(|b| secrets.holds_secret(b))
                .then(|| "a record holds a secret value".to_string()),
        }
    }
}

/// The denied calls of a run, each with the rule (or reason) that denied it.
fn denials_shown(r: &Receipt) -> String {
    let denied: Vec<String> = r
        .tool_calls
        .iter()
        .filter(|c| c.decision == RecordedDecision::Deny)
        .map(|c| format!("{} ({})", c.name, c.rule.as_deref().unwrap_or(&c.reason)))
        .collect();
    format!("{} denial(s): {}", r.denials, denied.join(", "))
}

/// Why a run does not count as passing its acceptance checks, if it does not.
fn acceptance_failure(r: &Receipt) -> Option<String> {
    let failed: Vec<&str> = r
        .acceptance
        .iter()
        .filter(|a| !a.passed)
        .map(|a| a.check.as_str())
        .collect();
    if !failed.is_empty() {
        Some(format!("failed checks: {}", failed.join(", ")))
    } else if r.status != crate::records::RunStatus::Accepted && r.status != crate::records::RunStatus::Completed {
        Some(format!("the run ended {}", r.status.as_str()))
    } else {
        None
    }
}

fn shown(calls: &[&str]) -> String {
    if calls.is_empty() {
        "none".into()
    } else {
        calls.join(" → ")
    }
}

fn quoted(v: &[&str]) -> String {
    v.iter().map(|s| format!("\"{s}\"")).collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A commit whose tree nests `levels` directories of `fan` entries each over
    /// one blob of `blob` bytes, in a new repository.
    fn bomb(dir: &Path, blob: usize, fan: usize, levels: usize) -> (git2::Repository, String) {
        let repo = git2::Repository::init(dir).unwrap();
        let mut id = repo.blob(&vec![b'x'; blob]).unwrap();
        let mut mode = 0o100644;
        for _ in 0..levels {
            let mut b = repo.treebuilder(None).unwrap();
            for i in 0..fan {
                b.insert(format!("e{i}"), id, mode).unwrap();
            }
            id = b.write().unwrap();
            mode = 0o040000;
        }
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        let tree = repo.find_tree(id).unwrap();
        let commit = repo.commit(None, &sig, &sig, "bomb", &tree, &[]).unwrap().to_string();
        drop(tree);
        (repo, commit)
    }

    #[test]
    fn a_tree_that_would_check_out_too_much_is_refused_before_any_checkout() {
        let dir = tempfile::tempdir().unwrap();
        // 10^4 paths to one 1 MiB blob: 10 GiB checked out, kilobytes in git.
        let (repo, big) = bomb(&dir.path().join("bytes"), 1 << 20, 10, 4);
        let err = TempWorktree::add(&repo, &dir.path().join("bytes"), &big)
            .err()
            .expect("refused");
        assert!(err.to_string().contains("not checked out for evaluation"), "{err}");
        // 1000 x 1000 empty files: a million entries.
        let (repo, many) = bomb(&dir.path().join("entries"), 0, 1000, 2);
        let err = TempWorktree::add(&repo, &dir.path().join("entries"), &many)
            .err()
            .expect("refused");
        assert!(err.to_string().contains("100000 entries"), "{err}");
        // A small tree is checked out.
        let (repo, small) = bomb(&dir.path().join("small"), 10, 3, 2);
        let wt = TempWorktree::add(&repo, &dir.path().join("small"), &small).unwrap();
        assert!(wt.path.join("e0/e2").is_file());
    }
}
