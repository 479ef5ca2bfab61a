//! The team scenario of issue 18, end to end with real git processes and the real
//! binaries: a bare origin, an author (the scaffolded laptop), two reviewers' clones,
//! a clone without hooks, and the cron box firing the scaffold's `digest` task with
//! sync on ([`crate::cron_world::Team`]). First the scripted path a new team takes
//! (`propose --push`, `review`, `approve --push` by a second identity, `land`, the box
//! picks the change up, its records come back to the author after a pull); then a
//! seeded interleaving of at least 200 operations (fires with and without the provider
//! key, propose, approve, land, `pull`, `pull --rebase`, plain pushes, fetch, an
//! unhooked direct push of a builder change, its revert or a covering approval, force
//! pushes, probes of the hook), checked after every step against what the issue
//! promises: no approval lost; every receipt on the origin within two fires; no hooked
//! push needing `--no-verify` or `--force`, and the hook refusing exactly the pushes
//! that bring an unapproved builder tree to `main`; the box never firing an unapproved
//! tree; every stuck fire exiting non-zero with a card the author sees after a pull.
//! The oracle is the test's own: it computes builder trees and approvals from the
//! repositories with libgit2 and predicts each outcome before running the step.
//! `TEAM_SCENARIO_SEED` replays a run, `TEAM_SCENARIO_OPS` changes its length; a
//! failure prints the seed, every operation so far and the origin's and the box's
//! graphs (`TEAM_SCENARIO_VERBOSE` prints the operations as they run,
//! `TEAM_SCENARIO_KEEP=DIR` keeps the repositories of a failed run there).

use crate::cron_world::Team;
use crate::review::builder_in;
use crate::team::{AUTHOR, REV1, REV2};
use crate::util::KEY_ENV;
use git2::{ObjectType, Oid, Repository};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The top-level directories whose tree an approval covers (the builder tree).
const BUILDER_DIRS: [&str; 5] = ["evals", "prompts", "scope", "settings", "tools"];
const DEFAULT_SEED: u64 = 0x0018_7ea3_5ce7_a210;
const DEFAULT_OPS: u64 = 200;
/// The line of the scaffold's settings after which the key variable is named.
const REPLAY_LINE: &str = "  replay: evals/digest/replay.json\n";
const HOOK_REFUSAL: &str = "pre-push: refusing to push unapproved builder changes to main";

fn key_line() -> String {
    format!("  api_key_env: {KEY_ENV}\n")
}

/// xorshift64: small and deterministic, enough to interleave operations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// A number from the environment (decimal or `0x` hex), else `default`.
fn env_number(name: &str, default: u64) -> u64 {
    let Ok(v) = std::env::var(name) else {
        return default;
    };
    let v = v.trim();
    let parsed = match v.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => v.parse(),
    };
    parsed.unwrap_or_else(|e| panic!("{name}={v}: {e}"))
}

fn open(dir: &Path) -> Repository {
    Repository::open(dir).unwrap_or_else(|e| panic!("open {}: {e}", dir.display()))
}

fn commit_of(repo: &Repository, spec: &str) -> Oid {
    repo.revparse_single(spec)
        .and_then(|o| o.peel_to_commit())
        .unwrap_or_else(|e| panic!("{spec} in {}: {e}", repo.path().display()))
        .id()
}

/// Whether `ancestor` is `tip` or in its history (false when either is unknown here).
fn contains(repo: &Repository, ancestor: Oid, tip: Oid) -> bool {
    ancestor == tip || repo.graph_descendant_of(tip, ancestor).unwrap_or(false)
}

/// The id of the tree holding only the builder-owned top-level directories of
/// `commit`, computed here (not by the product) from git's tree format.
fn builder_tree(repo: &Repository, commit: Oid) -> Oid {
    let tree = repo
        .find_commit(commit)
        .and_then(|c| c.tree())
        .unwrap_or_else(|e| panic!("tree of {commit}: {e}"));
    let mut entries: Vec<(Vec<u8>, i32, Oid)> = tree
        .iter()
        .filter(|e| BUILDER_DIRS.iter().any(|d| d.as_bytes() == e.name_bytes()))
        .map(|e| (e.name_bytes().to_vec(), e.filemode(), e.id()))
        .collect();
    // git orders a tree's entries by name, a directory's as if it ended in '/'.
    entries.sort_by_key(|(name, mode, _)| {
        let mut key = name.clone();
        if *mode == 0o040000 {
            key.push(b'/');
        }
        key
    });
    let mut body = Vec::new();
    for (name, mode, id) in entries {
        body.extend(format!("{mode:o} ").as_bytes());
        body.extend(name);
        body.push(0);
        body.extend(id.as_bytes());
    }
    Oid::hash_object(ObjectType::Tree, &body).unwrap()
}

/// What git's merge of proposal head `head` into `ours` gives, asked of libgit2's
/// own merge (onto a virtual base where the history is criss-cross, as git does),
/// the way `builder merge` and `builder land` merge.
struct MergeHere {
    /// `head` is in `ours` already, or the merge is clean and leaves the proposal's
    /// builder tree: what `merge` and `land` need to succeed as approved.
    approved_tree: bool,
    /// The paths that conflict.
    conflicts: Vec<String>,
    /// How many merge bases `ours` and `head` have.
    bases: usize,
    /// Paths outside the builder directories that `head` changes from its merge base
    /// with `ours`: no approval covers them, so `merge` and `land` refuse.
    unowned: Vec<String>,
}

impl MergeHere {
    fn ask(repo: &Repository, ours: Oid, head: Oid) -> MergeHere {
        let bases = repo.merge_bases(ours, head).map(|b| b.len()).unwrap_or(0);
        if contains(repo, head, ours) {
            return MergeHere {
                approved_tree: true,
                conflicts: Vec::new(),
                bases,
                unowned: Vec::new(),
            };
        }
        let unowned = unowned_from_merge_base(repo, ours, head);
        let (our_commit, their_commit) = (repo.find_commit(ours).unwrap(), repo.find_commit(head).unwrap());
        let index = repo.merge_commits(&our_commit, &their_commit, None).unwrap();
        if index.has_conflicts() {
            let conflicts = index
                .conflicts()
                .unwrap()
                .map(|c| {
                    let c = c.unwrap();
                    let entry = c.our.or(c.their).or(c.ancestor).unwrap();
                    String::from_utf8_lossy(&entry.path).into_owned()
                })
                .collect();
            return MergeHere {
                approved_tree: false,
                conflicts,
                bases,
                unowned,
            };
        }
        // The merged builder files against the proposal's, without writing a tree
        // into the repository under test.
        let merged: BTreeMap<Vec<u8>, (u32, Oid)> = index
            .iter()
            .filter(|e| in_builder_dir(&e.path))
            .map(|e| (e.path, (e.mode, e.id)))
            .collect();
        let mut proposed = BTreeMap::new();
        their_commit
            .tree()
            .unwrap()
            .walk(git2::TreeWalkMode::PreOrder, |dir, entry| {
                if entry.kind() == Some(ObjectType::Blob) {
                    let path = format!("{dir}{}", String::from_utf8_lossy(entry.name_bytes())).into_bytes();
                    if in_builder_dir(&path) {
                        proposed.insert(path, (entry.filemode() as u32, entry.id()));
                    }
                }
                git2::TreeWalkResult::Ok
            })
            .unwrap();
        MergeHere {
            approved_tree: merged == proposed,
            unowned,
            conflicts: Vec::new(),
            bases,
        }
    }

    /// A word for the log when the merge conflicts.
    fn describe(&self) -> String {
        let mut said = String::new();
        if !self.conflicts.is_empty() {
            said.push_str(&format!(
                " (conflicts in {} over {} merge base(s))",
                self.conflicts.join(", "),
                self.bases
            ));
        }
        if !self.unowned.is_empty() {
            said.push_str(&format!(
                " (carries {} outside the builder paths)",
                self.unowned.join(", ")
            ));
        }
        said
    }
}

/// The paths outside the builder directories that `head` changes from its merge
/// base with `ours` (git's `diff --name-only`, read through libgit2 here).
fn unowned_from_merge_base(repo: &Repository, ours: Oid, head: Oid) -> Vec<String> {
    let base = repo.merge_base(ours, head).unwrap_or(ours);
    let tree = |c: Oid| repo.find_commit(c).unwrap().tree().unwrap();
    let diff = repo
        .diff_tree_to_tree(Some(&tree(base)), Some(&tree(head)), None)
        .unwrap();
    let mut out: Vec<String> = diff
        .deltas()
        .flat_map(|d| [d.old_file().path(), d.new_file().path()])
        .flatten()
        .map(|p| p.to_string_lossy().into_owned())
        .filter(|p| !in_builder_dir(p.as_bytes()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Whether `path` lies under one of the builder-owned top-level directories.
fn in_builder_dir(path: &[u8]) -> bool {
    BUILDER_DIRS
        .iter()
        .any(|d| path.starts_with(d.as_bytes()) && path.get(d.len()) == Some(&b'/'))
}

/// The first guess of whether `head` merges into `ours` as approved: `ours` holds it
/// already, or kept the builder tree of where the two meet. With one merge base git
/// must then merge cleanly to the proposal's builder tree. The box's joins onto the
/// origin's main make criss-cross histories, where git merges onto a virtual base
/// and a builder change on one base's side can conflict with the proposal's (the
/// guess reads one base only), so there git's answer alone counts.
fn check_guess(repo: &Repository, ours: Oid, head: Oid, what: &str, merge: &MergeHere) {
    let base = repo.merge_base(ours, head).unwrap();
    let guess = contains(repo, head, ours) || builder_tree(repo, ours) == builder_tree(repo, base);
    assert!(
        merge.bases > 1 || !guess || merge.approved_tree,
        "{what}: one merge base {base}; the tip kept its builder tree: {guess}, yet git's merge leaves the approved builder tree: {}{}",
        merge.approved_tree,
        merge.describe()
    );
}

/// The text of `path` in `commit`, if it has one.
fn file_at(repo: &Repository, commit: Oid, path: &str) -> Option<String> {
    let entry = repo
        .find_commit(commit)
        .ok()?
        .tree()
        .ok()?
        .get_path(Path::new(path))
        .ok()?;
    let blob = repo.find_blob(entry.id()).ok()?;
    Some(String::from_utf8_lossy(blob.content()).into_owned())
}

/// Whether `commit`'s settings name the provider key variable.
fn needs_key(repo: &Repository, commit: Oid) -> bool {
    file_at(repo, commit, "settings/runtime.yaml").is_some_and(|s| s.contains(&key_line()))
}

/// Every approval ref in `repo` (`refs/builder/approved/*`) and the commit it names.
fn approval_refs(repo: &Repository) -> BTreeMap<String, Oid> {
    repo.references_glob("refs/builder/approved/*")
        .unwrap()
        .flatten()
        .filter_map(|r| Some((r.name().ok()?.to_string(), r.target()?)))
        .collect()
}

/// Flips the key variable's line in a settings text.
fn toggle_key(settings: &str) -> String {
    if settings.contains(&key_line()) {
        settings.replace(&key_line(), "")
    } else {
        assert!(settings.contains(REPLAY_LINE), "{settings}");
        settings.replace(REPLAY_LINE, &format!("{REPLAY_LINE}{}", key_line()))
    }
}

fn append(path: &Path, line: &str) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    std::fs::write(path, format!("{text}{line}\n")).unwrap();
}

/// What an approval says.
#[derive(Clone, Debug)]
struct Approval {
    id: Oid,
    tree: Oid,
    approver: String,
    at: chrono::DateTime<chrono::Utc>,
    head: Option<Oid>,
}

/// Whether approval `a` is older than `b`: the product's own rule
/// ([`shared::review::forward::older`], unit-tested there), on what the approvals say.
fn older(repo: &Repository, a: &Approval, b: &Approval) -> bool {
    shared::review::forward::older(repo, &a.stamp(), &b.stamp())
}

impl Approval {
    fn stamp(&self) -> shared::review::forward::Stamp {
        shared::review::forward::Stamp {
            id: self.id.to_string(),
            tree: self.tree,
            approved_at: self.at,
            head: self.head,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    Fire,
    FireKeyUnset,
    Propose,
    Approve,
    Land,
    Pull,
    PullRebase,
    MergeThenPullRebase,
    PushNote,
    Fetch,
    UnhookedPush,
    Revert,
    Cover,
    ForcePush,
    HookProbe,
}

/// Why the box cannot fire what the origin holds (each is carded once).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Cause {
    /// The origin's tip has this builder tree, which no approval covers.
    Unapproved(Oid),
    /// The origin's tip has this builder tree, whose newest approval is older than
    /// that of the newest tree the box ran (a rollback: an unapproved change).
    Rollback(Oid),
    /// The origin's tip (this builder tree) names the key variable the box lacks.
    TipKey(Oid),
    /// The tree the box would fire (this one) names the key variable it lacks.
    OwnKey(Oid),
    /// The origin was force-pushed, dropping this tip the box had joined last.
    Rewritten(Oid),
}

impl Cause {
    fn name(&self) -> &'static str {
        match self {
            Cause::Unapproved(_) => "unapproved tip",
            Cause::Rollback(_) => "rollback tip",
            Cause::TipKey(_) => "key missing for the tip",
            Cause::OwnKey(_) => "key missing for its own tree",
            Cause::Rewritten(_) => "rewritten origin",
        }
    }

    fn card_kind(&self) -> &'static str {
        match self {
            Cause::Unapproved(_) | Cause::Rollback(_) => "unreviewed_changes",
            Cause::TipKey(_) | Cause::OwnKey(_) => "invalid_config",
            Cause::Rewritten(_) => "sync_failed",
        }
    }
}

struct Proposal {
    name: String,
    head: Oid,
    tree: Oid,
    approved: bool,
    landed: bool,
    /// Refused by land (its base's builder tree is gone from main), or a covering
    /// proposal that is approved and never meant to land.
    dead: bool,
}

impl Proposal {
    /// Just proposed: not approved, not landed (`dead` for a covering proposal).
    fn new(name: String, head: Oid, tree: Oid, dead: bool) -> Proposal {
        Proposal {
            name,
            head,
            tree,
            approved: false,
            landed: false,
            dead,
        }
    }
}

/// A receipt the box wrote: its path, the fire (1-based) and that fire's exit, the
/// commit it fired on, and whether the origin has had it.
struct Receipt {
    path: String,
    fire: usize,
    code: i32,
    commit: Oid,
    reached: bool,
}

#[derive(Default)]
struct Tally {
    exits: BTreeMap<i32, usize>,
    /// Fires that met each kind of cause.
    causes: BTreeMap<&'static str, usize>,
    hooked_accepted: usize,
    hooked_refused: usize,
    approvals: usize,
    landed: usize,
    land_refused: usize,
    cards_seen_by_author: usize,
    resyncs: usize,
}

/// The team, what the test has seen, and what it expects.
struct Scenario {
    team: Team,
    rev1: PathBuf,
    rev2: PathBuf,
    rogue: PathBuf,
    seed: u64,
    rng: Rng,
    log: Vec<String>,
    counter: usize,
    step: usize,
    proposals: Vec<Proposal>,
    /// Every approval ref ever seen on the origin: none may go.
    approvals_seen: BTreeMap<String, Oid>,
    /// Approvals a reviewer made without `--push`: (ref, commit, proposal) per clone.
    pending: BTreeMap<PathBuf, Vec<(String, Oid, usize)>>,
    /// Every approval ref each clone ever had: none may go.
    clone_approvals: BTreeMap<PathBuf, BTreeMap<String, Oid>>,
    /// Approval commit -> (tree, approver), read once.
    approval_cache: BTreeMap<Oid, Option<Approval>>,
    /// The newest approval of the trees the box ran (approvals only move forward).
    ran_mark: Option<Approval>,
    /// Every record file the box ever had.
    records_seen: BTreeSet<String>,
    receipts: Vec<Receipt>,
    fires: usize,
    /// `fires` when the last force push happened.
    fires_at_force_push: usize,
    /// Hooked clones whose `main` the origin rewrote since their last pull.
    needs_resync: BTreeSet<PathBuf>,
    /// The causes of the last fire; those carded (a card of their own kind) and
    /// those reported on any card since the box last fired clean.
    prev_causes: BTreeSet<Cause>,
    carded: BTreeSet<Cause>,
    reported: BTreeSet<Cause>,
    /// A force push never goes behind this commit (the end of the scripted path).
    baseline: Oid,
    counts: BTreeMap<Op, usize>,
    tally: Tally,
}

impl Drop for Scenario {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let graph = |dir: &Path, what: &str| {
            let out = self
                .team
                .try_git(dir, &["log", "--graph", "--format=%h %an %s", "-n", "40", what]);
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        };
        // TEAM_SCENARIO_KEEP=DIR keeps every repository of the failed run there.
        if let Some(keep) = std::env::var_os("TEAM_SCENARIO_KEEP") {
            let keep = PathBuf::from(keep);
            let _ = std::fs::create_dir_all(&keep);
            for dir in [&self.team.env.root, &self.team.env.home] {
                let _ = std::process::Command::new("cp").arg("-a").arg(dir).arg(&keep).status();
            }
            eprintln!("the repositories are kept in {}", keep.display());
        }
        eprintln!(
            "\n=== team scenario failed at step {step}, seed {seed:#x} ===\nrerun: TEAM_SCENARIO_SEED={seed:#x} \
             cargo test -p tests --test e2e -- team_scenario:: --nocapture\n--- operations ({n}) ---\n{log}\n\
             --- origin main ---\n{origin}\n--- the box ---\n{boxed}",
            step = self.step,
            seed = self.seed,
            n = self.log.len(),
            log = self.log.join("\n"),
            origin = graph(&self.team.origin, "refs/heads/main"),
            boxed = graph(&self.team.cron, "HEAD"),
        );
    }
}

impl Scenario {
    fn note(&mut self, line: String) {
        if std::env::var_os("TEAM_SCENARIO_VERBOSE").is_some() {
            eprintln!("{line}");
        }
        self.log.push(line);
    }

    fn bump(&mut self) -> usize {
        self.counter += 1;
        self.counter
    }

    fn author(&self) -> PathBuf {
        self.team.laptop().to_path_buf()
    }

    fn who(&self, dir: &Path) -> &'static str {
        if dir == self.team.laptop() {
            "author"
        } else if dir == self.rev1 {
            "rev1"
        } else if dir == self.rev2 {
            "rev2"
        } else if dir == self.rogue {
            "unhooked"
        } else {
            "box"
        }
    }

    fn hooked_clones(&self) -> [PathBuf; 3] {
        [self.author(), self.rev1.clone(), self.rev2.clone()]
    }

    fn builder(&self, dir: &Path, who: (&str, &str), args: &[&str]) -> (i32, String, String) {
        builder_in(&self.team.env, dir, Some(who), args)
    }

    /// `git` in `dir`: (success, stdout and stderr).
    fn try_git(&self, dir: &Path, args: &[&str]) -> (bool, String) {
        let out = self.team.try_git(dir, args);
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    fn origin_tip(&self) -> Oid {
        commit_of(&open(&self.team.origin), "refs/heads/main")
    }

    /// What an approval commit's `approval.yaml` says (`None` for a commit without
    /// one), read once.
    fn approval(&mut self, repo: &Repository, id: Oid) -> Option<Approval> {
        if let Some(known) = self.approval_cache.get(&id) {
            return known.clone();
        }
        let read = file_at(repo, id, "approval.yaml").map(|text| {
            let yaml: serde_yaml::Value =
                serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("approval {id}: {e}: {text}"));
            let field = |f: &str| {
                yaml[f]
                    .as_str()
                    .unwrap_or_else(|| panic!("approval {id}: no {f}: {text}"))
            };
            Approval {
                id,
                tree: Oid::from_str(field("tree")).unwrap(),
                approver: field("approver").to_string(),
                at: chrono::DateTime::parse_from_rfc3339(field("approved_at"))
                    .unwrap()
                    .with_timezone(&chrono::Utc),
                head: yaml["head"].as_str().and_then(|h| Oid::from_str(h).ok()),
            }
        });
        self.approval_cache.insert(id, read.clone());
        read
    }

    /// Every approval in `dirs`.
    fn approvals(&mut self, dirs: &[&Path]) -> Vec<Approval> {
        let mut all = BTreeMap::new();
        for dir in dirs {
            let repo = open(dir);
            for id in approval_refs(&repo).into_values() {
                if let Some(a) = self.approval(&repo, id) {
                    all.insert(id, a);
                }
            }
        }
        all.into_values().collect()
    }

    /// The builder trees the approvals in `dirs` cover.
    fn approved_trees(&mut self, dirs: &[&Path]) -> BTreeSet<Oid> {
        self.approvals(dirs).into_iter().map(|a| a.tree).collect()
    }

    /// The newest approval of `tree` the origin or the box has.
    fn newest_approval_of(&mut self, tree: Oid) -> Option<Approval> {
        let (origin_dir, cron_dir) = (self.team.origin.clone(), self.team.cron.clone());
        let origin = open(&origin_dir);
        self.approvals(&[&origin_dir, &cron_dir])
            .into_iter()
            .filter(|a| a.tree == tree)
            .fold(None, |best: Option<Approval>, a| match best {
                Some(b) if !older(&origin, &b, &a) => Some(b),
                _ => Some(a),
            })
    }

    /// Whether the box may run `tree`: an approval covers it, and (approvals only
    /// move forward) its newest approval is not older than that of the newest tree
    /// the box ran, unless it is that tree.
    fn box_may_run(&mut self, tree: Oid) -> Result<(), Cause> {
        let Some(newest) = self.newest_approval_of(tree) else {
            return Err(Cause::Unapproved(tree));
        };
        match &self.ran_mark {
            Some(mark) if mark.tree != tree && older(&open(&self.team.origin), &newest, mark) => {
                Err(Cause::Rollback(tree))
            }
            _ => Ok(()),
        }
    }

    /// Whether the box may run the origin's tip.
    fn tip_approved(&mut self) -> bool {
        let tree = builder_tree(&open(&self.team.origin), self.origin_tip());
        self.box_may_run(tree).is_ok()
    }

    /// Brings a hooked clone to the origin's `main`: `git pull`, or, when the origin
    /// was force-pushed since, a fetch and `reset --hard origin/main` (git's own
    /// answer to a rewritten upstream; a pull would merge the dropped history back).
    fn sync(&mut self, dir: &Path) {
        if self.needs_resync.remove(dir) {
            self.team.git(dir, &["fetch", "-q", "origin"]);
            self.team.git(dir, &["reset", "-q", "--hard", "origin/main"]);
            self.tally.resyncs += 1;
            self.note(format!(
                "    {}: fetch, reset --hard origin/main (main was rewritten)",
                self.who(dir)
            ));
        } else {
            let (ok, out) = self.try_git(dir, &["pull", "-q"]);
            assert!(ok, "git pull in {}'s clone: {out}", self.who(dir));
        }
        assert_eq!(
            commit_of(&open(dir), "HEAD"),
            self.origin_tip(),
            "{}'s clone is at the origin's main after a pull",
            self.who(dir)
        );
    }

    /// Judges a push of `src` (a revision in `dir`) to the origin's `main` as the
    /// issue says the hook must: the new commits on its first-parent chain (neither on
    /// the origin's tip nor on `origin/main` here) that change the builder tree must
    /// each bring a tree some approval covers. `Err` names the first that does not.
    fn hook_verdict(&mut self, dir: &Path, src: &str) -> Result<(), String> {
        let origin_dir = self.team.origin.clone();
        let approved = self.approved_trees(&[&origin_dir, dir]);
        let repo = open(dir);
        let mut stops = vec![self.origin_tip()];
        stops.extend(repo.refname_to_id("refs/remotes/origin/main").ok());
        let mut commit = repo.find_commit(commit_of(&repo, src)).unwrap();
        loop {
            if stops.iter().any(|s| contains(&repo, commit.id(), *s)) {
                return Ok(());
            }
            let tree = builder_tree(&repo, commit.id());
            let parent = commit.parents().next();
            let changed = parent.as_ref().is_none_or(|p| builder_tree(&repo, p.id()) != tree);
            if changed && !approved.contains(&tree) {
                return Err(format!(
                    "new commit {} brings builder tree {tree}, which no approval covers",
                    commit.id()
                ));
            }
            match parent {
                Some(p) => commit = p,
                None => return Ok(()),
            }
        }
    }

    /// A push from a hooked clone, never with `--no-verify` or `--force`. `to_main`:
    /// the revision it sends to the origin's `main`, if it does. The hook must refuse
    /// it exactly when [`Scenario::hook_verdict`] does. Returns whether it was accepted.
    fn hooked_push(&mut self, dir: &Path, args: &[&str], to_main: Option<&str>) -> bool {
        assert!(
            !args
                .iter()
                .any(|a| a.starts_with("--no-verify") || a.starts_with("--force") || a.starts_with('+')),
            "a hooked clone never pushes past the hook or forces: {args:?}"
        );
        let verdict = match to_main {
            Some(src) => self.hook_verdict(dir, src),
            None => Ok(()),
        };
        let pushed = to_main.map(|src| commit_of(&open(dir), src));
        let before = self.origin_tip();
        let (ok, out) = self.try_git(dir, args);
        let who = self.who(dir);
        match (&verdict, ok) {
            (Ok(()), true) => {
                self.tally.hooked_accepted += 1;
                if args == ["push", "-q"] {
                    // A plain push carries the approvals too (install-hooks' refspec).
                    self.assert_published(dir);
                }
                if let Some(pushed) = pushed {
                    assert_eq!(
                        self.origin_tip(),
                        pushed,
                        "{who}: git {args:?} reached the origin's main"
                    );
                }
            }
            (Err(_), false) => {
                assert!(
                    out.contains(HOOK_REFUSAL),
                    "{who}: git {args:?} failed, but not by the hook's refusal: {out}"
                );
                assert_eq!(self.origin_tip(), before, "a refused push moved nothing");
                self.tally.hooked_refused += 1;
            }
            (Ok(()), false) => panic!(
                "{who}: the hook refused git {args:?}, which brings no unapproved builder tree to main \
                 (it would have needed --no-verify): {out}"
            ),
            (Err(why), true) => panic!("{who}: the hook let git {args:?} through: {why}: {out}"),
        }
        self.note(format!(
            "    {who}: git {} -> {}",
            args.join(" "),
            if ok { "accepted" } else { "refused by the hook" }
        ));
        ok
    }

    /// What is checked after every step.
    fn check_invariants(&mut self) {
        let origin = open(&self.team.origin);
        // No approval ever lost, on the origin or in any clone that had it.
        let now = approval_refs(&origin);
        for (name, id) in &self.approvals_seen {
            assert_eq!(
                now.get(name),
                Some(id),
                "approval {name} ({id}) is gone from the origin"
            );
        }
        self.approvals_seen.extend(now);
        let mut clones = self.hooked_clones().to_vec();
        clones.push(self.team.cron.clone());
        for dir in clones {
            let now = approval_refs(&open(&dir));
            let had = self.clone_approvals.entry(dir.clone()).or_default();
            for (name, id) in had.iter() {
                assert_eq!(
                    now.get(name),
                    Some(id),
                    "approval {name} ({id}) is gone from {}",
                    dir.display()
                );
            }
            had.extend(now);
        }
        // The box's branch is on an approved builder tree, whatever happened.
        let (origin_dir, cron_dir) = (self.team.origin.clone(), self.team.cron.clone());
        let approved = self.approved_trees(&[&origin_dir, &cron_dir]);
        let cron = open(&cron_dir);
        let head = commit_of(&cron, "HEAD");
        let tree = builder_tree(&cron, head);
        assert!(
            approved.contains(&tree),
            "the box's HEAD {head} has builder tree {tree}, which no approval covers"
        );
    }

    // ---------------------------------------------------------------------------
    // Operations

    /// A fire of the box (with the key variable set, or removed). The test predicts
    /// the tree it fires, the exit and the causes it must card, then checks the
    /// receipt, the cards, and the records on the origin.
    fn fire(&mut self, key_set: bool) {
        let (origin_dir, cron_dir) = (self.team.origin.clone(), self.team.cron.clone());
        let (origin, cron) = (open(&origin_dir), open(&cron_dir));
        let tip = commit_of(&origin, "refs/heads/main");
        let tip_tree = builder_tree(&origin, tip);
        let tip_verdict = self.box_may_run(tip_tree);
        let tip_approved = tip_verdict.is_ok();
        let tip_key = needs_key(&origin, tip);
        let head = commit_of(&cron, "HEAD");
        let (head_tree, head_key) = (builder_tree(&cron, head), needs_key(&cron, head));
        let rewritten_from = cron
            .refname_to_id("refs/runtime-sync/joined/origin/main")
            .ok()
            .filter(|joined| !contains(&origin, *joined, tip));
        let tip_fireable = tip_approved && (key_set || !tip_key);
        let (fires_tree, fires_key) = if tip_fireable {
            (tip_tree, tip_key)
        } else {
            (head_tree, head_key)
        };
        let mut causes = BTreeSet::new();
        if let Err(cause) = tip_verdict {
            causes.insert(cause);
        }
        if !key_set && fires_key {
            causes.insert(Cause::OwnKey(fires_tree));
        } else if !key_set && tip_approved && tip_key {
            causes.insert(Cause::TipKey(tip_tree));
        }
        if let Some(from) = rewritten_from {
            causes.insert(Cause::Rewritten(from));
        }
        // A rewrite the box can join is news once: a fire that cards it exits 5, and
        // the fire that joins after it was carded (the tip became fireable) exits 0.
        let news = causes
            .iter()
            .any(|c| !matches!(c, Cause::Rewritten(_)) || !self.reported.contains(c));
        let expected = if causes.iter().any(|c| matches!(c, Cause::OwnKey(_))) {
            2
        } else if news {
            5
        } else {
            0
        };

        for cause in &causes {
            *self.tally.causes.entry(cause.name()).or_default() += 1;
        }
        let unset: &[&str] = if key_set { &[] } else { &[KEY_ENV] };
        let fired = self.team.fire_with(&[], unset);
        self.fires += 1;
        *self.tally.exits.entry(fired.code).or_default() += 1;
        let ids: Vec<String> = fired.summary["cards"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        let cards: Vec<(String, String)> = ids.iter().map(|id| self.box_card(id)).collect();
        self.note(format!(
            "    fire #{} ({}): exit {} cards {:?}; expected exit {expected} for {causes:?}",
            self.fires,
            if key_set { "key set" } else { "key unset" },
            fired.code,
            cards.iter().map(|(k, _)| k).collect::<Vec<_>>()
        ));
        let context = format!(
            "fire #{} expected exit {expected} for causes {causes:?}: {fired}",
            self.fires
        );
        assert!(fired.summary.is_object(), "the fire printed no JSON summary: {context}");
        assert_eq!(fired.signal, None, "{context}");
        assert_eq!(fired.code, expected, "{context}");

        // At most one card per cause, and every cause on a card the first time a fire
        // meets it: a card of its own kind, or (as the docs have it) the one
        // `sync_failed` card of a rewrite that left a tip the box cannot fire, which
        // names that reason too.
        let kinds: Vec<&str> = cards.iter().map(|(k, _)| k.as_str()).collect();
        let rewrite_card = cards
            .iter()
            .find(|(k, _)| k == "sync_failed")
            .map(|(_, summary)| summary.as_str());
        for (kind, summary) in &cards {
            let of_kind: Vec<&Cause> = causes.iter().filter(|c| c.card_kind() == kind).collect();
            assert!(
                !of_kind.is_empty(),
                "a {kind} card ({summary}) with no cause for it: {context}"
            );
            assert!(
                kinds.iter().filter(|k| *k == kind).count() <= of_kind.len(),
                "more {kind} cards than causes {of_kind:?}: {context}"
            );
            assert!(
                of_kind
                    .iter()
                    .any(|c| !(self.prev_causes.contains(*c) && self.carded.contains(*c))),
                "a {kind} card again for a cause the previous fire carded already: {context}"
            );
        }
        for cause in &causes {
            let own = kinds.contains(&cause.card_kind());
            let on_rewrite_card = !matches!(cause, Cause::Rewritten(_))
                && rewrite_card.is_some_and(|s| s.contains("was rewritten and the cron box cannot fire its tip"));
            if own {
                self.carded.insert(cause.clone());
            }
            if own || on_rewrite_card {
                self.reported.insert(cause.clone());
            }
            let required = expected != 2 || cause.card_kind() == "invalid_config";
            assert!(
                !required || self.reported.contains(cause),
                "the first fire stuck on {cause:?} put it on no card: {context}"
            );
        }
        if fired.code == 0 {
            self.carded.clear();
            self.reported.clear();
            self.prev_causes.clear();
        } else {
            self.prev_causes = causes;
        }

        // The receipt: the fire ran an approved tree, the one predicted.
        let cron = open(&cron_dir);
        let approved = self.approved_trees(&[&origin_dir, &cron_dir]);
        match fired.summary["receipt"].as_str() {
            Some(path) => {
                let text = std::fs::read_to_string(cron_dir.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
                let receipt: Value = serde_json::from_str(&text).unwrap();
                let commit = Oid::from_str(receipt["inputs"]["commit"].as_str().unwrap()).unwrap();
                let tree = builder_tree(&cron, commit);
                assert!(
                    approved.contains(&tree),
                    "the box fired {commit}, builder tree {tree}, which no approval covers: {context}"
                );
                assert_eq!(
                    tree, fires_tree,
                    "the box fired another tree than the one it may: {context}"
                );
                if let Some(t) = receipt["inputs"]["approval"]["tree"].as_str() {
                    assert_eq!(
                        t,
                        tree.to_string(),
                        "the receipt's approval names the tree fired: {context}"
                    );
                }
                // The box remembers the newest approval of what it ran.
                if fired.summary["stop_reason"] != "not_started" {
                    let newest = self.newest_approval_of(tree).expect("approved");
                    let origin = open(&origin_dir);
                    let keep = self
                        .ran_mark
                        .as_ref()
                        .is_some_and(|m| m.id == newest.id || older(&origin, &newest, m));
                    if !keep {
                        self.ran_mark = Some(newest);
                    }
                }
                self.receipts.push(Receipt {
                    path: path.to_string(),
                    fire: self.fires,
                    code: fired.code,
                    commit,
                    reached: false,
                });
            }
            None => assert_ne!(fired.code, 0, "a fire that exits 0 wrote no receipt: {context}"),
        }

        // Records: every receipt reaches the origin within two fires (the one that
        // wrote it and the next); after a fire that syncs (exit 0 or 5), every
        // receipt is there, those a force push dropped replayed; after one that
        // exits 0, every record the box ever had.
        self.records_seen.extend(self.team.box_records());
        let files: BTreeSet<String> = self.team.origin_files().into_iter().collect();
        let fires = self.fires;
        for r in &mut self.receipts {
            r.reached |= files.contains(&r.path);
            assert!(
                r.reached || r.fire == fires,
                "receipt {} of fire #{} has not reached the origin by fire #{fires}",
                r.path,
                r.fire
            );
            // A configuration refusal (exit 2) fires nothing and, once carded,
            // commits and pushes nothing: it does not replay what a force push
            // dropped (the next fire that syncs does).
            assert!(
                fired.code == 2 || files.contains(&r.path),
                "receipt {} of fire #{} is not on the origin after fire #{fires} (exit {})",
                r.path,
                r.fire,
                fired.code
            );
        }
        if fired.code == 0 {
            let missing: Vec<&String> = self.records_seen.iter().filter(|r| !files.contains(*r)).collect();
            assert!(
                missing.is_empty(),
                "after a fire that exits 0 the origin lacks records: {missing:?}"
            );
            let origin = open(&origin_dir);
            let tip = commit_of(&origin, "refs/heads/main");
            for r in self
                .receipts
                .iter()
                .filter(|r| r.code == 0 && r.fire > self.fires_at_force_push)
            {
                assert!(
                    contains(&origin, r.commit, tip),
                    "receipt {} names {}, not in the origin's history",
                    r.path,
                    r.commit
                );
            }
        }

        // Every card of a stuck fire is visible from the author's clone after a pull.
        if !ids.is_empty() {
            let author = self.author();
            self.sync(&author);
            let listed = self.team.cards_listed(&author);
            for id in &ids {
                assert!(
                    listed.iter().any(|g| g["latest_id"] == id.as_str()),
                    "card {id} of fire #{} is not listed on the author's clone after a pull: {listed:#?}",
                    self.fires
                );
                self.tally.cards_seen_by_author += 1;
            }
        }
    }

    /// The kind and summary of a card in the box's work tree.
    fn box_card(&self, id: &str) -> (String, String) {
        let file = std::fs::read_dir(self.team.cron.join("cards"))
            .unwrap()
            .flatten()
            .map(|d| d.path().join(format!("{id}.yaml")))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("card {id} is not in the box's cards/"));
        let card: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        let field = |f: &str| card[f].as_str().unwrap_or_default().to_string();
        (field("kind"), field("summary"))
    }

    /// The author changes the prompt (and now and then whether the settings name the
    /// key variable) and proposes it with `--push`.
    fn propose(&mut self) {
        let author = self.author();
        self.sync(&author);
        let name = format!("p{}", self.bump());
        append(
            &author.join("prompts/digest.md"),
            &format!("{name}: say one thing about {name}."),
        );
        let toggled = self.rng.below(100) < 15;
        if toggled {
            let path = author.join("settings/runtime.yaml");
            let text = std::fs::read_to_string(&path).unwrap();
            std::fs::write(&path, toggle_key(&text)).unwrap();
        }
        let head_before = commit_of(&open(&author), "HEAD");
        let (code, out, err) = self.builder(&author, AUTHOR, &["propose", &name, "--push", "-m", &name]);
        assert_eq!(code, 0, "propose {name} --push: {out}{err}");
        assert!(
            out.contains(&format!("pushed proposals/{name} to origin")),
            "{out}{err}"
        );
        let repo = open(&author);
        let head = commit_of(&repo, &format!("refs/heads/proposals/{name}"));
        assert_eq!(
            commit_of(&open(&self.team.origin), &format!("refs/heads/proposals/{name}")),
            head,
            "the proposal is on the origin as proposed"
        );
        assert_eq!(
            commit_of(&repo, "HEAD"),
            head_before,
            "propose leaves main where it was"
        );
        let tree = builder_tree(&repo, head);
        self.note(format!(
            "    author: propose {name} --push{} -> {head}",
            if toggled { " (toggles the key variable)" } else { "" }
        ));
        self.proposals.push(Proposal::new(name, head, tree, false));
    }

    /// `dir`'s clone approves a proposal: exactly one new approval there, of the
    /// proposal's tree, by that reviewer (none when it approved it already). With
    /// `push`, it and every approval of this clone still unpublished reach the
    /// origin, and nothing else; without, it waits in the clone (through its pulls)
    /// for the reviewer's next plain push.
    fn approve(&mut self, index: usize, dir: &Path, who: (&str, &str), push: bool) {
        let origin_dir = self.team.origin.clone();
        let origin_before = approval_refs(&open(&origin_dir));
        let local_before = approval_refs(&open(dir));
        let (name, tree) = (self.proposals[index].name.clone(), self.proposals[index].tree);
        let mut args = vec!["approve", name.as_str()];
        if push {
            args.push("--push");
        } else {
            // Without --push the reviewer fetches first, to see the proposal.
            self.team.git(dir, &["fetch", "-q"]);
        }
        let (code, out, err) = self.builder(dir, who, &args);
        assert_eq!(code, 0, "{}: builder {args:?}: {out}{err}", who.0);
        let repo = open(dir);
        let made: Vec<(String, Oid)> = approval_refs(&repo)
            .into_iter()
            .filter(|(k, _)| !local_before.contains_key(k) && !origin_before.contains_key(k))
            .collect();
        let pending = self.pending.entry(dir.to_path_buf()).or_default();
        if pending.iter().any(|(_, _, i)| *i == index) {
            assert!(made.is_empty(), "a second approval of {name} by {who:?}: {made:?}");
            assert!(out.contains("already approved"), "{out}{err}");
        } else {
            assert_eq!(
                made.len(),
                1,
                "one approval made by builder {args:?}: {made:?}\n{out}{err}"
            );
            pending.push((made[0].0.clone(), made[0].1, index));
            let Approval {
                tree: approved_tree,
                approver,
                ..
            } = self.approval(&repo, made[0].1).expect("approval.yaml");
            assert_eq!(approved_tree, tree, "{name}'s approval names its tree");
            assert!(approver.contains(who.1), "approved by {who:?}: {approver}");
            self.tally.approvals += 1;
        }
        let mine: BTreeSet<String> = self.pending[dir].iter().map(|(r, _, _)| r.clone()).collect();
        self.note(format!(
            "    {}: builder {} -> {}",
            self.who(dir),
            args.join(" "),
            made.first().map_or("already approved".to_string(), |(r, _)| r.clone())
        ));
        if push {
            self.assert_published(dir);
            let reached: Vec<String> = approval_refs(&open(&origin_dir))
                .into_keys()
                .filter(|k| !origin_before.contains_key(k) && !mine.contains(k))
                .collect();
            assert!(
                reached.is_empty(),
                "approve --push published others' approvals: {reached:?}"
            );
        }
    }

    /// Every approval `dir`'s clone made and had not published is on the origin now
    /// (after its `approve --push` or a plain `git push`).
    fn assert_published(&mut self, dir: &Path) {
        let on_origin = approval_refs(&open(&self.team.origin));
        for (refname, id, index) in self.pending.remove(dir).unwrap_or_default() {
            assert_eq!(
                on_origin.get(&refname),
                Some(&id),
                "the approval {refname} of {} made in {}'s clone did not reach the origin with its push",
                self.proposals[index].name,
                self.who(dir)
            );
            self.proposals[index].approved = true;
        }
    }

    fn pick_reviewer(&mut self) -> (PathBuf, (&'static str, &'static str)) {
        if self.rng.below(2) == 0 {
            (self.rev1.clone(), REV1)
        } else {
            (self.rev2.clone(), REV2)
        }
    }

    fn pick_hooked(&mut self) -> PathBuf {
        let clones = self.hooked_clones();
        clones[self.rng.below(clones.len())].clone()
    }

    /// Indexes of the proposals `pred` holds for.
    fn proposals_where(&self, pred: impl Fn(&Proposal) -> bool) -> Vec<usize> {
        (0..self.proposals.len())
            .filter(|&i| pred(&self.proposals[i]))
            .collect()
    }

    /// What git's merge of proposal `index` into the origin's tip gives: `land`
    /// merges it as approved exactly when the tip holds it already or the merge is
    /// clean and leaves its builder tree.
    fn landable(&self, index: usize) -> MergeHere {
        let (name, head) = (&self.proposals[index].name, self.proposals[index].head);
        let origin = open(&self.team.origin);
        let tip = commit_of(&origin, "refs/heads/main");
        let merge = MergeHere::ask(&origin, tip, head);
        check_guess(&origin, tip, head, &format!("land {name}"), &merge);
        merge
    }

    /// `builder land`: succeeds exactly when git merges the proposal into the
    /// origin's tip cleanly to its approved builder tree (or the tip holds it
    /// already) and the proposal carries nothing outside the builder paths from its
    /// merge base; lands the approved tree, on top of the tip, never rewriting it.
    fn land(&mut self, index: usize) {
        let author = self.author();
        if self.needs_resync.contains(&author) {
            self.sync(&author);
        }
        let (name, head, tree) = {
            let p = &self.proposals[index];
            (p.name.clone(), p.head, p.tree)
        };
        let tip = self.origin_tip();
        let merge = self.landable(index);
        let landable = merge.approved_tree && merge.unowned.is_empty();
        let (code, out, err) = self.builder(&author, AUTHOR, &["land", &name]);
        let origin = open(&self.team.origin);
        let new_tip = commit_of(&origin, "refs/heads/main");
        self.note(format!(
            "    author: land {name} -> exit {code}{}",
            if landable {
                String::new()
            } else if merge.conflicts.is_empty() && merge.unowned.is_empty() {
                " (the tip changed builder paths since its base)".to_string()
            } else {
                merge.describe()
            }
        ));
        if code == 0 {
            assert!(
                contains(&origin, head, new_tip),
                "{name} is on the origin's main: {out}{err}"
            );
            assert!(
                contains(&origin, tip, new_tip),
                "land rewrote the origin's main: {out}{err}"
            );
            assert_eq!(
                builder_tree(&origin, new_tip),
                tree,
                "land of {name} left a builder tree other than the approved one (predicted landable: {landable}): {out}{err}"
            );
            assert_eq!(commit_of(&open(&author), "HEAD"), new_tip, "the author's main followed");
            self.proposals[index].landed = true;
            self.tally.landed += 1;
        } else {
            assert!(
                !landable,
                "land refused {name}, which the origin's tip allows: exit {code}: {out}{err}"
            );
            assert_eq!(code, 1, "{out}{err}");
            assert_eq!(new_tip, tip, "a refused land moved nothing");
            self.proposals[index].dead = true;
            self.tally.land_refused += 1;
        }
    }

    /// The author merges locally with `builder merge` while behind, then does what
    /// many teams' default does: `git pull --rebase` (which flattens the merge), and
    /// pushes. The hook judges the flattened commits by their trees.
    fn merge_then_pull_rebase(&mut self, index: usize) {
        let author = self.author();
        if self.needs_resync.contains(&author) {
            self.sync(&author);
        }
        // The approvals come with a fetch; main stays where it was.
        self.team.git(&author, &["fetch", "-q"]);
        let (name, head, tree) = {
            let p = &self.proposals[index];
            (p.name.clone(), p.head, p.tree)
        };
        let repo = open(&author);
        let local = commit_of(&repo, "HEAD");
        let merge = MergeHere::ask(&repo, local, head);
        check_guess(&repo, local, head, &format!("merge {name}"), &merge);
        let mergeable = merge.approved_tree && merge.unowned.is_empty();
        let (code, out, err) = self.builder(&author, AUTHOR, &["merge", &name]);
        self.note(format!("    author: merge {name} -> exit {code}{}", merge.describe()));
        if code != 0 {
            assert!(
                !mergeable,
                "merge refused {name}, which git merges here cleanly to its approved builder tree: {out}{err}"
            );
            return;
        }
        assert!(
            mergeable,
            "merge of {name} succeeded where git's merge leaves another builder tree{}: {out}{err}",
            merge.describe()
        );
        let merged = commit_of(&open(&author), "HEAD");
        assert_eq!(
            builder_tree(&open(&author), merged),
            tree,
            "merge of {name}: {out}{err}"
        );
        let (ok, out) = self.try_git(&author, &["pull", "--rebase", "-q"]);
        if !ok {
            self.note(format!(
                "    author: git pull --rebase stopped: {}",
                out.lines().next().unwrap_or("")
            ));
            self.try_git(&author, &["rebase", "--abort"]);
            self.team.git(&author, &["reset", "-q", "--hard", "origin/main"]);
            return;
        }
        self.note("    author: git pull --rebase".into());
        if self.hooked_push(&author, &["push", "-q"], Some("HEAD")) {
            self.proposals[index].landed = true;
        } else {
            self.team.git(&author, &["reset", "-q", "--hard", "origin/main"]);
        }
    }

    /// A hooked clone's plain pull: every approval the origin has comes with it.
    fn pull(&mut self) {
        let dir = self.pick_hooked();
        self.sync(&dir);
        self.note(format!("    {}: git pull", self.who(&dir)));
        self.assert_has_origins_approvals(&dir);
    }

    fn fetch(&mut self) {
        let dir = self.pick_hooked();
        self.team.git(&dir, &["fetch", "-q"]);
        self.note(format!("    {}: git fetch", self.who(&dir)));
        self.assert_has_origins_approvals(&dir);
    }

    fn assert_has_origins_approvals(&self, dir: &Path) {
        let here = approval_refs(&open(dir));
        for (name, id) in approval_refs(&open(&self.team.origin)) {
            assert_eq!(
                here.get(&name),
                Some(&id),
                "{}'s clone lacks the origin's approval {name} after a fetch",
                self.who(dir)
            );
        }
    }

    /// A note (no builder path) committed in a hooked clone and pushed plainly.
    fn commit_note(&mut self, dir: &Path) {
        let n = self.bump();
        let rel = format!("notes/{}-{n}.md", self.who(dir));
        std::fs::create_dir_all(dir.join("notes")).unwrap();
        std::fs::write(dir.join(&rel), format!("note {n}\n")).unwrap();
        self.team.git(dir, &["add", &rel]);
        self.team.git(dir, &["commit", "-qm", &format!("note {n}")]);
    }

    fn push_note(&mut self) {
        let dir = self.pick_hooked();
        self.sync(&dir);
        self.commit_note(&dir);
        self.hooked_push(&dir, &["push", "-q"], Some("HEAD"));
    }

    /// A note committed on a clone that is behind, then `git pull --rebase` and push.
    fn pull_rebase(&mut self) {
        let dir = self.pick_hooked();
        if self.needs_resync.contains(&dir) {
            self.sync(&dir);
        }
        self.commit_note(&dir);
        let (ok, out) = self.try_git(&dir, &["pull", "--rebase", "-q"]);
        assert!(ok, "{}: git pull --rebase of a note: {out}", self.who(&dir));
        self.note(format!("    {}: note, git pull --rebase", self.who(&dir)));
        self.hooked_push(&dir, &["push", "-q"], Some("HEAD"));
    }

    /// The clone without hooks pushes an unapproved prompt change straight to main.
    fn unhooked_push(&mut self) {
        let rogue = self.rogue.clone();
        self.team.git(&rogue, &["fetch", "-q", "origin"]);
        self.team.git(&rogue, &["reset", "-q", "--hard", "origin/main"]);
        let n = self.bump();
        append(
            &rogue.join("prompts/digest.md"),
            &format!("unreviewed {n}: ignore the cards."),
        );
        self.team.git(&rogue, &["commit", "-qam", &format!("unreviewed {n}")]);
        self.team.git(&rogue, &["push", "-q", "origin", "main"]);
        let tip = self.origin_tip();
        self.note(format!(
            "    unhooked: direct push of an unapproved prompt change -> {tip}"
        ));
        assert!(!self.tip_approved(), "the unhooked push left an unapproved tip");
    }

    /// The nearest first-parent ancestor of `dir`'s HEAD whose builder tree the box
    /// may run, and the commits above it that change the builder tree; `None` when
    /// there is none (a rewrite left only trees older than what the box ran).
    fn last_approved(&mut self, dir: &Path) -> Option<(Oid, Vec<Oid>)> {
        let repo = open(dir);
        let mut commit = repo.find_commit(commit_of(&repo, "HEAD")).unwrap();
        let mut changers = Vec::new();
        loop {
            let tree = builder_tree(&repo, commit.id());
            if self.box_may_run(tree).is_ok() {
                return Some((commit.id(), changers));
            }
            let parent = commit.parent(0).ok()?;
            if builder_tree(&repo, parent.id()) != tree {
                changers.push(commit.id());
            }
            commit = parent;
        }
    }

    /// The builder directories that `a` or `b` has.
    /// Puts `dirs` in `dir`'s index and work tree as commit `from` has them.
    fn restore_from(&self, dir: &Path, from: Oid, dirs: &[&str]) {
        let source = format!("--source={from}");
        let mut args = vec!["restore", source.as_str(), "--staged", "--worktree", "--"];
        args.extend(dirs);
        self.team.git(dir, &args);
    }

    fn builder_dirs_in(&self, dir: &Path, a: Oid, b: Oid) -> Vec<&'static str> {
        let repo = open(dir);
        BUILDER_DIRS
            .into_iter()
            .filter(|d| {
                [a, b].iter().any(|c| {
                    repo.find_commit(*c)
                        .and_then(|c| c.tree())
                        .is_ok_and(|t| t.get_name(d).is_some())
                })
            })
            .collect()
    }

    /// Recovery from an unapproved tip: a hooked clone reverts it (`git revert` of
    /// the one offending commit, else the builder paths put back to the last approved
    /// tree) and pushes plainly; the hook lets it through.
    fn revert(&mut self) {
        let dir = self.pick_hooked();
        self.sync(&dir);
        let Some((good, changers)) = self.last_approved(&dir) else {
            self.note("    no tree in main's history the box may run: cover the tip instead".into());
            return self.cover();
        };
        let repo = open(&dir);
        let single = changers.len() == 1 && repo.find_commit(changers[0]).unwrap().parent_count() == 1;
        let mut reverted = false;
        if single {
            let (ok, out) = self.try_git(&dir, &["revert", "--no-edit", &changers[0].to_string()]);
            if ok {
                reverted = true;
                self.note(format!("    {}: git revert {}", self.who(&dir), changers[0]));
            } else {
                self.note(format!("    {}: git revert stopped: {}", self.who(&dir), out.trim()));
                self.try_git(&dir, &["revert", "--abort"]);
            }
        }
        if !reverted {
            let head = commit_of(&repo, "HEAD");
            let dirs = self.builder_dirs_in(&dir, good, head);
            self.restore_from(&dir, good, &dirs);
            self.team.git(
                &dir,
                &["commit", "-qm", &format!("Back to the approved builder tree of {good}")],
            );
            self.note(format!(
                "    {}: builder paths back to {good} ({} unapproved change(s))",
                self.who(&dir),
                changers.len()
            ));
        }
        let head = commit_of(&open(&dir), "HEAD");
        assert_eq!(
            builder_tree(&open(&dir), head),
            builder_tree(&open(&dir), good),
            "the revert restores the approved tree"
        );
        assert!(
            self.hooked_push(&dir, &["push", "-q"], Some("HEAD")),
            "the revert goes through"
        );
        assert!(self.tip_approved());
    }

    /// Recovery from an unapproved tip the other way the docs give: a proposal whose
    /// tree is the tip's, approved by a reviewer, covers it after the fact.
    fn cover(&mut self) {
        let author = self.author();
        self.sync(&author);
        // The proposal's base: the nearest commit below the tip with another tree.
        let repo = open(&author);
        let tip = commit_of(&repo, "HEAD");
        let tip_tree = builder_tree(&repo, tip);
        let mut good = tip;
        while builder_tree(&repo, good) == tip_tree {
            good = repo
                .find_commit(good)
                .unwrap()
                .parent_id(0)
                .expect("the tip changed the tree once");
        }
        let name = format!("cover{}", self.bump());
        let branch = format!("proposals/{name}");
        self.team
            .git(&author, &["checkout", "-q", "-b", &branch, &good.to_string()]);
        let dirs = self.builder_dirs_in(&author, good, tip);
        self.restore_from(&author, tip, &dirs);
        self.team.git(
            &author,
            &["commit", "-qm", &format!("Propose the tree of {tip} as it is")],
        );
        let head = commit_of(&open(&author), "HEAD");
        self.note(format!("    author: {branch} at {good} with the tree of {tip}"));
        assert!(self.hooked_push(&author, &["push", "-q", "-u", "origin", &branch], None));
        self.team.git(&author, &["checkout", "-q", "main"]);
        let tree = builder_tree(&open(&author), head);
        assert_eq!(tree, builder_tree(&open(&author), tip));
        self.proposals.push(Proposal::new(name, head, tree, true));
        let (dir, who) = self.pick_reviewer();
        self.approve(self.proposals.len() - 1, &dir, who, true);
        assert!(self.tip_approved(), "the covering approval covers the tip");
    }

    /// The clone without hooks force-pushes a main rewritten from 1-3 commits back.
    fn force_push(&mut self) {
        let rogue = self.rogue.clone();
        self.team.git(&rogue, &["fetch", "-q", "origin"]);
        let origin = open(&self.team.origin);
        let tip = commit_of(&origin, "refs/heads/main");
        let back = 1 + self.rng.below(3);
        let mut target = tip;
        for _ in 0..back {
            if target == self.baseline {
                break;
            }
            target = origin.find_commit(target).unwrap().parent_id(0).unwrap();
        }
        if !contains(&origin, self.baseline, target) {
            target = self.baseline;
        }
        if target == tip {
            self.note("    unhooked: nothing to rewrite (main is at the baseline)".into());
            return;
        }
        self.team.git(&rogue, &["reset", "-q", "--hard", &target.to_string()]);
        let n = self.bump();
        let rel = format!("notes/rewrite-{n}.md");
        std::fs::create_dir_all(rogue.join("notes")).unwrap();
        std::fs::write(rogue.join(&rel), "rewritten\n").unwrap();
        self.team.git(&rogue, &["add", &rel]);
        self.team.git(&rogue, &["commit", "-qm", &format!("rewrite {n}")]);
        self.team.git(&rogue, &["push", "-q", "--force", "origin", "main"]);
        let new_tip = self.origin_tip();
        self.note(format!(
            "    unhooked: force push of main from {tip} to {new_tip} (on {target})"
        ));
        self.needs_resync.extend(self.hooked_clones());
        self.fires_at_force_push = self.fires;
        let origin = open(&self.team.origin);
        for p in self.proposals.iter_mut().filter(|p| p.landed) {
            if !contains(&origin, p.head, new_tip) {
                p.landed = false;
            }
        }
    }

    /// A hooked clone tries to push an unapproved prompt change to main (from main or
    /// from a side branch): refused; the same commit to a branch of its own or a
    /// proposal branch: accepted.
    fn hook_probe(&mut self) {
        let dir = self.pick_hooked();
        self.sync(&dir);
        let n = self.bump();
        let side = self.rng.below(2) == 0;
        let branch = format!("probe{n}");
        if side {
            self.team.git(&dir, &["checkout", "-q", "-b", &branch]);
        }
        append(&dir.join("prompts/digest.md"), &format!("probe {n}: unreviewed."));
        self.team.git(&dir, &["commit", "-qam", &format!("probe {n}")]);
        if side {
            let to_main = format!("{branch}:main");
            assert!(!self.hooked_push(&dir, &["push", "-q", "origin", &to_main], Some("HEAD")));
            let elsewhere = if self.rng.below(2) == 0 {
                format!("{branch}:proposals/{branch}")
            } else {
                branch.clone()
            };
            assert!(self.hooked_push(&dir, &["push", "-q", "origin", &elsewhere], None));
            self.team.git(&dir, &["checkout", "-q", "main"]);
            self.team.git(&dir, &["branch", "-q", "-D", &branch]);
        } else {
            assert!(!self.hooked_push(&dir, &["push", "-q", "origin", "main"], Some("HEAD")));
            self.team.git(&dir, &["reset", "-q", "--hard", "origin/main"]);
        }
    }

    fn choose(&mut self) -> Op {
        let stuck = !self.tip_approved();
        let open_live = self.proposals_where(|p| !p.landed && !p.dead).len();
        let approvable = !self.proposals_where(|p| !p.approved && !p.landed && !p.dead).is_empty();
        let landable = !self.proposals_where(|p| p.approved && !p.landed && !p.dead).is_empty();
        let mut menu = vec![
            (Op::Fire, 22),
            (Op::FireKeyUnset, 5),
            (Op::Pull, 6),
            (Op::PushNote, 6),
            (Op::Fetch, 4),
            (Op::PullRebase, 5),
            (Op::HookProbe, 5),
            (Op::ForcePush, 3),
            (Op::UnhookedPush, if stuck { 1 } else { 4 }),
        ];
        if open_live < 4 {
            menu.push((Op::Propose, 9));
        }
        if approvable {
            menu.push((Op::Approve, 9));
        }
        if landable {
            menu.push((Op::Land, 9));
            menu.push((Op::MergeThenPullRebase, 3));
        }
        if stuck {
            menu.push((Op::Revert, 8));
            menu.push((Op::Cover, 5));
        }
        let total: usize = menu.iter().map(|(_, w)| w).sum();
        let mut roll = self.rng.below(total);
        for (op, weight) in &menu {
            if roll < *weight {
                return *op;
            }
            roll -= weight;
        }
        unreachable!()
    }

    fn run(&mut self, op: Op) {
        match op {
            Op::Fire => self.fire(true),
            Op::FireKeyUnset => self.fire(false),
            Op::Propose => self.propose(),
            Op::Approve => {
                let candidates = self.proposals_where(|p| !p.approved && !p.landed && !p.dead);
                let index = candidates[self.rng.below(candidates.len())];
                let (dir, who) = self.pick_reviewer();
                let push = self.rng.below(3) != 0;
                self.approve(index, &dir, who, push);
            }
            Op::Land | Op::MergeThenPullRebase => {
                let mut candidates = self.proposals_where(|p| p.approved && !p.landed && !p.dead);
                // Mostly a proposal made on the current builder tree, as a team lands
                // the fresh one; now and then a stale one, which land must refuse.
                let fresh: Vec<usize> = candidates
                    .iter()
                    .copied()
                    .filter(|&i| {
                        let m = self.landable(i);
                        m.approved_tree && m.unowned.is_empty()
                    })
                    .collect();
                if !fresh.is_empty() && self.rng.below(4) != 0 {
                    candidates = fresh;
                }
                let index = candidates[self.rng.below(candidates.len())];
                if op == Op::Land {
                    self.land(index);
                } else {
                    self.merge_then_pull_rebase(index);
                }
            }
            Op::Pull => self.pull(),
            Op::PullRebase => self.pull_rebase(),
            Op::PushNote => self.push_note(),
            Op::Fetch => self.fetch(),
            Op::UnhookedPush => self.unhooked_push(),
            Op::Revert => self.revert(),
            Op::Cover => self.cover(),
            Op::ForcePush => self.force_push(),
            Op::HookProbe => self.hook_probe(),
        }
    }
}

/// The scripted path a new team takes, from the set-up `Team::new` did (init, the
/// origin, install-hooks, review and sync turned on through review).
fn scripted_path(s: &mut Scenario) {
    s.note("scripted: the box's first fire".into());
    s.fire(true);
    s.check_invariants();

    // The author proposes a prompt change and publishes it.
    let author = s.author();
    append(
        &author.join("prompts/digest.md"),
        "Open with the three changes that matter most.",
    );
    let (code, out, err) = s.builder(
        &author,
        AUTHOR,
        &["propose", "brief", "--push", "-m", "Lead with what matters"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("pushed proposals/brief to origin"), "{out}{err}");
    s.note("scripted: author: propose brief --push".into());

    // The reviewer sees it after a fetch, with no local branch, and reviews it.
    let rev1 = s.rev1.clone();
    s.team.git(&rev1, &["fetch", "-q"]);
    let (code, out, err) = s.builder(&rev1, REV1, &["proposals"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("brief\topen\tEng <eng@example.com>\tonly on origin"),
        "{out}{err}"
    );
    let started = Instant::now();
    let (code, out, err) = s.builder(&rev1, REV1, &["review", "brief"]);
    assert_eq!(code, 0, "review with sync on: {out}{err}");
    assert!(
        out.contains("prompts/digest.md"),
        "the review shows the changed prompt: {out}"
    );
    s.note(format!(
        "scripted: rev1: review brief ({:.1}s)",
        started.elapsed().as_secs_f64()
    ));

    // The second identity approves and publishes in one step.
    let (code, out, err) = s.builder(&rev1, REV1, &["approve", "brief", "--push"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("pushed 1 approval(s) to origin"), "{out}{err}");
    s.note("scripted: rev1: approve brief --push".into());
    s.check_invariants();

    // The test's builder tree is the one approvals name.
    let origin_dir = s.team.origin.clone();
    let origin = open(&origin_dir);
    let proposal = commit_of(&origin, "refs/heads/proposals/brief");
    let tree = builder_tree(&origin, proposal);
    assert!(
        s.approved_trees(&[&origin_dir]).contains(&tree),
        "the approval of brief names the builder tree {tree} this test computes"
    );

    // The author lands it on the origin's tip (the box pushed since the clone).
    let (code, out, err) = s.builder(&author, AUTHOR, &["land", "brief"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("landed proposals/brief on origin/main"), "{out}{err}");
    let landed = s.origin_tip();
    s.note(format!("scripted: author: land brief -> {landed}"));
    s.check_invariants();

    // The box picks it up on its next fire and its records flow back.
    s.fire(true);
    let cron = open(&s.team.cron);
    let receipt = s.receipts.last().unwrap();
    assert_eq!(receipt.commit, landed, "the box fired the landed merge");
    assert!(std::fs::read_to_string(s.team.cron.join("prompts/digest.md"))
        .unwrap()
        .contains("three changes that matter most"));
    assert!(contains(&open(&origin_dir), commit_of(&cron, "HEAD"), s.origin_tip()));
    let receipt_path = receipt.path.clone();
    s.sync(&author);
    assert!(
        author.join(&receipt_path).is_file(),
        "the box's receipt {receipt_path} is in the author's clone after a pull"
    );
    let (code, out, err) = s.builder(&author, AUTHOR, &["history", "runs"]);
    assert_eq!(code, 0, "{out}{err}");
    let run_id = Path::new(&receipt_path)
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        out.contains(&run_id),
        "builder history runs on the author's clone lists {run_id}: {out}"
    );
    s.note("scripted: the box fired the landed change; its receipt is in the author's clone".into());
    s.check_invariants();

    // The same path, with the other reviewer: the settings name the provider key
    // variable, so a fire without it is a stuck state the scenario can meet.
    s.sync(&author);
    let settings = author.join("settings/runtime.yaml");
    std::fs::write(&settings, toggle_key(&std::fs::read_to_string(&settings).unwrap())).unwrap();
    let (code, out, err) = s.builder(&author, AUTHOR, &["propose", "box-key", "--push", "-m", "Name the key"]);
    assert_eq!(code, 0, "{out}{err}");
    let rev2 = s.rev2.clone();
    let (code, out, err) = s.builder(&rev2, REV2, &["approve", "box-key", "--push"]);
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = s.builder(&author, AUTHOR, &["land", "box-key"]);
    assert_eq!(code, 0, "{out}{err}");
    s.note("scripted: box-key proposed, approved by rev2, landed".into());
    s.fire(true);
    assert!(needs_key(&open(&s.team.cron), commit_of(&open(&s.team.cron), "HEAD")));
    s.check_invariants();
}

#[test]
fn a_new_team_scripted_path_then_200_seeded_operations_lose_nothing() {
    let started = Instant::now();
    let seed = env_number("TEAM_SCENARIO_SEED", DEFAULT_SEED);
    let ops = env_number("TEAM_SCENARIO_OPS", DEFAULT_OPS) as usize;
    println!("team scenario: seed {seed:#x} (TEAM_SCENARIO_SEED), {ops} operations (TEAM_SCENARIO_OPS)");
    let team = Team::new();
    let clone = |name: &str, hooks: bool| {
        let dir = team.clone_as(name, hooks);
        // `git clone` takes branches only: the first fetch brings the approvals.
        team.git(&dir, &["fetch", "-q"]);
        dir
    };
    let (rev1, rev2, rogue) = (clone("rev1", true), clone("rev2", true), clone("unhooked", false));
    assert!(
        !rogue.join(".git/hooks/pre-push").exists(),
        "the unhooked clone has no pre-push hook"
    );
    let mut s = Scenario {
        team,
        rev1,
        rev2,
        rogue,
        seed,
        rng: Rng(if seed == 0 { DEFAULT_SEED } else { seed }),
        log: Vec::new(),
        counter: 0,
        step: 0,
        proposals: Vec::new(),
        approvals_seen: BTreeMap::new(),
        pending: BTreeMap::new(),
        clone_approvals: BTreeMap::new(),
        approval_cache: BTreeMap::new(),
        ran_mark: None,
        records_seen: BTreeSet::new(),
        receipts: Vec::new(),
        fires: 0,
        fires_at_force_push: 0,
        needs_resync: BTreeSet::new(),
        prev_causes: BTreeSet::new(),
        carded: BTreeSet::new(),
        reported: BTreeSet::new(),
        baseline: Oid::ZERO_SHA1,
        counts: BTreeMap::new(),
        tally: Tally::default(),
    };
    s.check_invariants();
    scripted_path(&mut s);
    s.baseline = s.origin_tip();
    let scripted = started.elapsed();

    for step in 1..=ops {
        s.step = step;
        let op = s.choose();
        *s.counts.entry(op).or_default() += 1;
        s.note(format!("#{step} {op:?}"));
        s.run(op);
        s.check_invariants();
    }

    // The end: recovered, the box fires clean twice and is at the origin's tip;
    // nothing was lost anywhere and the history audits clean.
    s.step = ops + 1;
    s.note("end: recover and fire".into());
    while !s.tip_approved() {
        s.note("end: revert".into());
        s.revert();
    }
    s.fire(true);
    s.fire(true);
    assert_eq!(s.prev_causes, BTreeSet::new(), "the box fires clean at the end");
    assert_eq!(commit_of(&open(&s.team.cron), "HEAD"), s.origin_tip());
    s.team.assert_no_lock_and_fsck_clean();
    for dir in s.hooked_clones() {
        s.sync(&dir);
        // A plain push publishes whatever a reviewer approved without --push.
        s.hooked_push(&dir, &["push", "-q"], Some("HEAD"));
        s.assert_has_origins_approvals(&dir);
    }
    assert!(
        s.pending.values().all(Vec::is_empty),
        "unpublished approvals: {:?}",
        s.pending
    );
    s.check_invariants();
    let author = s.author();
    let (code, out, err) = s.builder(&author, AUTHOR, &["audit"]);
    assert_eq!(code, 0, "builder audit on the author's clone at the end: {out}{err}");

    let counts: Vec<String> = s.counts.iter().map(|(op, n)| format!("{op:?} {n}")).collect();
    let t = &s.tally;
    println!(
        "team scenario: seed {seed:#x}: {ops} operations in {:.1}s (scripted path {:.1}s): {}; fires {} by exit {:?}, stuck on {:?}; \
         hooked pushes {} accepted, {} refused by the hook; approvals {}; lands {} (refused {}); cards seen by the \
         author {}; resyncs after force pushes {}",
        started.elapsed().as_secs_f64(),
        scripted.as_secs_f64(),
        counts.join(", "),
        s.fires,
        t.exits,
        t.causes,
        t.hooked_accepted,
        t.hooked_refused,
        t.approvals,
        t.landed,
        t.land_refused,
        t.cards_seen_by_author,
        t.resyncs,
    );
}
