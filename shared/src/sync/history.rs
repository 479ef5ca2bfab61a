//! What the box's branch and the remote's have in common, and the commits that put
//! the box's records on the remote's tip.
//!
//! The box's branch holds what the remote had when the box last joined it, plus the
//! runtime's records commits. [`Ctx::unpushed`] sorts the box's commits the remote
//! lacks: the runtime's own, the ones a rewritten remote history dropped (they were
//! reachable from the tip the box last joined), and anything else, which is a
//! person's work on the box and is never pushed for them. Three ways put records on
//! a tip, each keeping receipts pointing at commits that exist:
//!
//! * [`Ctx::rebuild`]: the one unpushed commit rebuilt with the tip as parent, or
//!   several joined by a merge; the box then moves there.
//! * [`Ctx::merge_onto`]: a merge of the tip and the box's branch, for a box that
//!   does not move (the tip changed more than records during the fire, or cannot be
//!   fired): the box's own commits, which its later receipts name, reach the remote.
//! * [`Ctx::replay`]: after a rewrite, the records the remote lacks, added to its tip
//!   in one commit (the dropped history itself is never pushed back).
//!
//! [`Ctx::judge`] says whether the box may move its firing tree to a tip.

use super::{Ctx, Stuck, SyncError};
use crate::review::signing::ApprovalRule;
use crate::review::trust::Trust;
use git2::{Oid, Repository};
use std::collections::HashSet;

/// The box's commits the remote's tip lacks.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Unpushed {
    /// Runtime records commits, newest first.
    pub runtime: Vec<Oid>,
    /// Commits not the runtime's that the remote once had (reachable from the tip the
    /// box last joined) and its rewritten history dropped.
    pub dropped: Vec<Oid>,
    /// How many of all of them the remote once had: what a rewrite took away.
    pub lost: usize,
}

impl Ctx<'_> {
    /// Sorts the commits on `local` and not on `remote` ([`Unpushed`]); a commit that
    /// is neither the runtime's nor dropped by a rewrite is a person's work on the box:
    /// an error naming it.
    pub(super) fn unpushed(
        &self,
        local: Oid,
        remote: Oid,
        joined: Option<Oid>,
        runtime_email: &str,
    ) -> Result<Unpushed, SyncError> {
        let git = self.git("join");
        let mut tips = self.once_had_tips();
        tips.extend(joined);
        tips.remove(&remote);
        let once_had: HashSet<Oid> = match tips.is_empty() {
            true => HashSet::new(),
            false => {
                let mut walk = self.repo.revwalk().map_err(&git)?;
                for tip in tips {
                    // A tip gc removed is no longer there to say anything.
                    if self.repo.find_commit(tip).is_ok() {
                        walk.push(tip).map_err(&git)?;
                    }
                }
                walk.hide(remote).map_err(&git)?;
                walk.collect::<Result<_, _>>().map_err(&git)?
            }
        };
        let mut walk = self.repo.revwalk().map_err(&git)?;
        walk.push(local).map_err(&git)?;
        walk.hide(remote).map_err(&git)?;
        let mut out = Unpushed::default();
        let made_here = self
            .repo
            .workdir()
            .map(crate::git::made_by_this_runtime)
            .unwrap_or_default();
        for oid in walk {
            let oid = oid.map_err(&git)?;
            let had = once_had.contains(&oid);
            out.lost += usize::from(had);
            if self.is_runtime_records(oid, runtime_email, &made_here)? {
                out.runtime.push(oid);
            } else if had {
                out.dropped.push(oid);
            } else {
                let c = self.repo.find_commit(oid).map_err(&git)?;
                let short = crate::text::short_oid(oid);
                return Err(self
                    .err(
                        "join",
                        format!(
                            "local commit {short} by {} (\"{}\") is not a runtime records commit and {}/{} never had it: the cron box's branch must hold only what the runtime commits, and the runtime never pushes a person's work",
                            c.author().email().unwrap_or("?"),
                            crate::text::printable(c.summary().ok().flatten().unwrap_or("")),
                            self.sync.remote,
                            self.sync.branch
                        ),
                    )
                    .hint(format!(
                        "save that work as a patch (`git format-patch -1 {short} -o ~/box-work`, to propose from a laptop; no branch, which would hold the runtime's commits too) and take the box's branch back to before it: `git reset --hard {short}^`; the next fire commits again, as its own, the runtime's records made after it"
                    )));
            }
        }
        Ok(out)
    }

    /// Tips the remote once had, as this box saw them: the last [`ONCE_HAD_TIPS`] the
    /// joined ref's log names (a tip noted before a move that a kill cut short, or
    /// that failed, included), and as many of the remote-tracking ref's (a person's
    /// `git pull` on the box moves the branch onto the remote's commits without the
    /// box joining them).
    fn once_had_tips(&self) -> HashSet<Oid> {
        let mut tips = HashSet::new();
        for name in [self.joined_ref(), self.tracking_ref()] {
            if let Ok(log) = self.repo.reflog(&name) {
                // The log's newest entry comes first.
                tips.extend(
                    log.iter()
                        .take(ONCE_HAD_TIPS)
                        .map(|e| e.id_new())
                        .filter(|o| !o.is_zero()),
                );
            }
        }
        tips
    }

    /// Whether `oid` is a commit by the runtime that adds or changes records only: by
    /// the runtime's email now (signed, on a box that signs), or one this box's runtime
    /// remembers making (`made_here`; a box that fired before an approved change of
    /// `runtime_identity.email`, and could not push then, still owns those records;
    /// nobody else's commit is taken for its own by the identity some settings name).
    fn is_runtime_records(&self, oid: Oid, runtime_email: &str, made_here: &HashSet<Oid>) -> Result<bool, SyncError> {
        let git = self.git("join");
        let c = self.repo.find_commit(oid).map_err(&git)?;
        let Ok(parent) = c.parent(0) else {
            return Ok(false);
        };
        let old = parent.tree().map_err(&git)?;
        let by_runtime = c
            .author()
            .email()
            .is_ok_and(|e| crate::review::same_person(e, runtime_email));
        // A box that signs makes no commit without its own valid signature: one under
        // the runtime's name that carries none and that this runtime does not remember
        // making was rewritten by a person (a `git pull --rebase` on the box) or
        // forged, and is refused as theirs rather than pushed or replayed.
        let signed = || self.sign.is_some_and(|k| k.signed_here(self.repo, oid));
        let ours = match by_runtime {
            true => !self.sign.is_some_and(|k| k.signs()) || made_here.contains(&oid) || signed(),
            false => made_here.contains(&oid),
        };
        if !ours {
            return Ok(false);
        }
        let new = c.tree().map_err(&git)?;
        Ok(self.changed_paths(&old, &new)?.iter().all(|p| is_record_path(p)))
    }

    /// Every path that differs between two trees.
    pub(super) fn changed_paths(&self, old: &git2::Tree, new: &git2::Tree) -> Result<Vec<String>, SyncError> {
        let diff = self
            .repo
            .diff_tree_to_tree(Some(old), Some(new), None)
            .map_err(self.git("join"))?;
        Ok(diff
            .deltas()
            .filter_map(|d| d.new_file().path().or(d.old_file().path()))
            .map(|p| p.to_string_lossy().into_owned())
            .collect())
    }

    /// The tree of `onto` with the records of `local` added (a merge that cannot
    /// conflict: records are new paths).
    pub(super) fn joined_tree(&self, onto: Oid, local: Oid) -> Result<Oid, SyncError> {
        let git = self.git("join");
        let a = self.repo.find_commit(onto).map_err(&git)?;
        let b = self.repo.find_commit(local).map_err(&git)?;
        let mut index = self.repo.merge_commits(&a, &b, None).map_err(&git)?;
        if index.has_conflicts() {
            return Err(self.err("join", "the records conflict with the remote's commits"));
        }
        index.write_tree_to(self.repo).map_err(&git)
    }

    /// The commit that puts `local`'s unpushed records on `onto` for a box that moves
    /// there: the one unpushed commit rebuilt with `onto` as its parent (its receipt
    /// names a commit the remote has), or a merge of several (whose receipts name
    /// each other).
    pub(super) fn rebuild(&self, onto: Oid, local: Oid, unpushed: &[Oid]) -> Result<Oid, SyncError> {
        if let [only] = unpushed {
            let git = self.git("join");
            let tree = self.joined_tree(onto, local)?;
            let c = self.repo.find_commit(*only).map_err(&git)?;
            let msg = c.message().unwrap_or("runtime records").to_string();
            let rebuilt = self.runtime_commit(local, &msg, tree, &[onto], onto)?;
            self.watch_follows(unpushed, rebuilt);
            return Ok(rebuilt);
        }
        let msg = format!(
            "runtime: records of {} fire(s) joined onto {}/{}\n",
            unpushed.len(),
            self.sync.remote,
            self.sync.branch
        );
        let tree = self.joined_tree(onto, local)?;
        self.runtime_commit(local, &msg, tree, &[onto, local], onto)
    }

    /// A merge of `onto` and the box's branch `local`, for a box that stays where it
    /// is: the box's commits keep their ids on the remote.
    /// Named by `onto`'s settings when the box would move there (a tip its rule
    /// approves: an approved rotation of the runtime's key landed during the fire),
    /// else by the box's own branch.
    pub(super) fn merge_onto(&self, onto: Oid, local: Oid, why: &str) -> Result<Oid, SyncError> {
        let tree = self.joined_tree(onto, local)?;
        let msg = format!(
            "runtime: records joined onto {}/{} ({why})\n",
            self.sync.remote, self.sync.branch
        );
        self.runtime_commit(local, &msg, tree, &[onto, local], self.named_by(onto, local))
    }

    /// Which commit's settings name a commit the sync makes on `onto` for the box's
    /// branch `local`: `onto` when the box would move there (its rule approves it,
    /// [`crate::review::runtime_commits::RuntimeKeys::rule`]), else `local`. Never a tip the box would refuse, whose
    /// unreviewed settings would choose who the box commits as and with which key.
    fn named_by(&self, onto: Oid, local: Oid) -> Oid {
        let movable = self
            .sign
            .and_then(|k| k.rule())
            .is_some_and(|rule| matches!(self.judge(rule, self.repo.workdir(), local, onto), Ok(None)));
        if movable {
            onto
        } else {
            local
        }
    }

    /// After a rewrite of the remote's history: one commit on `onto` adding every
    /// record the `runtime` commits wrote (as `local` holds it) that `onto` lacks.
    /// `None` when `onto` has them all. Returns the commit and the paths replayed.
    pub(super) fn replay(
        &self,
        onto: Oid,
        local: Oid,
        runtime: &[Oid],
        rewritten_from: Option<Oid>,
    ) -> Result<Option<(Oid, Vec<String>)>, SyncError> {
        let git = self.git("replay");
        let onto_tree = self.repo.find_commit(onto).and_then(|c| c.tree()).map_err(&git)?;
        let local_tree = self.repo.find_commit(local).and_then(|c| c.tree()).map_err(&git)?;
        let mut paths = Vec::new();
        for oid in runtime {
            let c = self.repo.find_commit(*oid).map_err(&git)?;
            let parent = c.parent(0).and_then(|p| p.tree()).map_err(&git)?;
            for p in self.changed_paths(&parent, &c.tree().map_err(&git)?)? {
                if !paths.contains(&p) {
                    paths.push(p);
                }
            }
        }
        let mut update = git2::build::TreeUpdateBuilder::new();
        let mut replayed = Vec::new();
        paths.sort();
        for p in paths {
            let path = std::path::Path::new(&p);
            let Ok(entry) = local_tree.get_path(path) else {
                continue; // written, then gone from the box's tree
            };
            if onto_tree.get_path(path).is_ok() {
                continue;
            }
            let mode = match entry.filemode() {
                0o100755 => git2::FileMode::BlobExecutable,
                0o120000 => git2::FileMode::Link,
                _ => git2::FileMode::Blob,
            };
            update.upsert(p.as_str(), entry.id(), mode);
            replayed.push(p);
        }
        if replayed.is_empty() {
            return Ok(None);
        }
        let tree = update.create_updated(self.repo, &onto_tree).map_err(&git)?;
        let msg = format!(
            "runtime: {} record(s) replayed onto {}/{}\n\nIts history was rewritten{}; these records were on the cron box and not on the new tip.\n",
            replayed.len(),
            self.sync.remote,
            self.sync.branch,
            rewritten_from
                .map(|o| format!(" ({} is no longer in it)", crate::text::short_oid(o)))
                .unwrap_or_default()
        );
        let commit = self.runtime_commit(local, &msg, tree, &[onto], self.named_by(onto, local))?;
        self.watch_follows(runtime, commit);
        Ok(Some((commit, replayed)))
    }

    /// The runtime's watch of its last commits follows `now`, which puts the records of
    /// `replaced` on the branch in their place ([`crate::git::remember_replaced`]).
    fn watch_follows(&self, replaced: &[Oid], now: Oid) {
        if let Some(root) = self.repo.workdir() {
            crate::git::remember_replaced(root, replaced, now);
        }
    }

    /// A commit the sync makes in place of the runtime's commit `like` (or joining it),
    /// as the runtime, author and committer, at the time of `like`, signed as the fire
    /// signs. The identity and the signing key
    /// ([`crate::review::runtime_commits::RuntimeKeys::signer`]) are those the settings
    /// of `named_by` name: the tip the commit goes onto when the box would move there
    /// (approved, or holding the box's own builder tree: [`Ctx::named_by`]), else the
    /// box's own branch: never a tip the box refused, whose unreviewed settings would
    /// choose who the box commits as, or with which key. So records made before an
    /// approved change of that identity or key are rebuilt under the new one, and a
    /// person who rewrote one on the box is not taken over as its committer.
    fn runtime_commit(
        &self,
        like: Oid,
        msg: &str,
        tree: Oid,
        parents: &[Oid],
        named_by: Oid,
    ) -> Result<Oid, SyncError> {
        let git = self.git("join");
        let like = self.repo.find_commit(like).map_err(&git)?;
        let tree = self.repo.find_tree(tree).map_err(&git)?;
        let parents = parents
            .iter()
            .map(|p| self.repo.find_commit(*p))
            .collect::<Result<Vec<_>, _>>()
            .map_err(&git)?;
        let parents: Vec<&git2::Commit> = parents.iter().collect();
        let named_tree = self.repo.find_commit(named_by).and_then(|c| c.tree()).map_err(&git)?;
        let named = crate::review::runtime_commits::runtime_identity_of(self.repo, &named_tree).map_err(&git)?;
        let author = git2::Signature::new(&named.name, &named.email, &like.author().when()).map_err(&git)?;
        // Signed with the key the same settings name: a rotation approved while the
        // box held these records, or landed during a fire, has them signed with the
        // new key, which audit (judging by the commit's own tree) asks for.
        let setting = named.signing_key.as_deref();
        let signer = self.sign.and_then(|k| k.signer(setting));
        let sign = signer.as_deref();
        crate::git::commit_object(self.repo, &author, &author, msg, &tree, &parents, sign)
            .map_err(|e| self.err("join", e.to_string()))
    }

    /// Whether the box may move its firing tree from `local` to the remote tip `tip`
    /// (`None`), or why not: a tip that tracks the runtime's private state, a builder
    /// tree with no approval that counts or only one older than the tree the box ran
    /// (a rollback), or settings that name a key variable unset here. The one place
    /// that decides; `runtime check` asks it too.
    pub(super) fn judge(
        &self,
        rule: &ApprovalRule,
        memo: Option<&std::path::Path>,
        local: Oid,
        tip: Oid,
    ) -> Result<Option<Stuck>, SyncError> {
        let git = self.git("judge");
        let tip_commit = self.repo.find_commit(tip).map_err(&git)?;
        let whole = tip_commit.tree().map_err(&git)?;
        if let Some(state) = whole.get_name(crate::layout::STATE_DIR) {
            return Ok(Some(Stuck::TracksState { tip, state: state.id() }));
        }
        if let Some(why) = unsafe_to_check_out(self.repo, local, &whole).map_err(&git)? {
            return Ok(Some(Stuck::Unsafe { tip, why }));
        }
        let tree_of = |c: Oid| crate::review::builder_tree_of_commit(self.repo, c).map_err(&git);
        let tip_tree = tree_of(tip)?;
        if tip_tree == tree_of(local)? {
            return Ok(None); // records (or other paths) only: nothing new to fire
        }
        let judged = Trust::new(self.repo, rule.clone())
            .map_err(&git)?
            .remembering(memo)
            .incoming(tip, local)
            .map_err(&git)?;
        if judged.approval.is_none() {
            let mut why = judged.rejected.clone();
            if !why.is_empty() {
                why.push(judged.judged_by(rule));
            }
            return Ok(Some(Stuck::Unapproved {
                tip,
                tree: tip_tree,
                why,
            }));
        }
        // Approvals only move forward: a tip whose newest approval is older than
        // that of the tree this box ran is a rollback, and the box stays put.
        if let Some(root) = memo.or(self.repo.workdir()) {
            let ran = crate::review::forward::read(self.repo, root);
            if let Some(back) = crate::review::forward::check(self.repo, tip_tree, &judged.counting, ran.as_ref()) {
                return Ok(Some(Stuck::Rollback {
                    tip,
                    back: Box::new(back),
                }));
            }
        }
        if let Some(var) = key_missing(self.repo, tip) {
            return Ok(Some(Stuck::KeyMissing {
                tip,
                var,
                tree: tip_tree,
            }));
        }
        Ok(None)
    }
}

/// Why the box must not check out `tip` (the tip commit's whole tree) from `local`,
/// if it must not: a tree the move would write is one git refuses
/// ([`crate::review::canonical::check_changed`]), or a records directory is there as
/// something else than a directory.
pub(super) fn unsafe_to_check_out(
    repo: &Repository,
    local: Oid,
    tip: &git2::Tree,
) -> Result<Option<String>, git2::Error> {
    if let Some(path) = records_dir_not_a_dir(repo, tip) {
        return Ok(Some(format!(
            "`{path}` is not a directory there: the fires' records could not be written"
        )));
    }
    let old = repo.find_commit(local)?.tree_id();
    match crate::review::canonical::check_changed(repo, Some(old), tip.id(), "") {
        Ok(()) => Ok(None),
        Err(e) if crate::review::canonical::is_refused_tree(&e) => Ok(Some(e.message().to_string())),
        Err(e) => Err(e),
    }
}

/// A directory the fires write their records in that `tip` holds as something else
/// (a file, a link, a submodule): `reports`, `runs` and `cards`, `runs/<task>` for
/// each task of `prompts/`, and any day directory (`YYYY-MM-DD`) of these or of
/// `cards` (helper-97: `runs/digest` as a file stopped every commit and every push).
/// Below `reports/` only a submodule at `reports/<task>` or a day directory of it
/// counts: the tools write there, a model's file at a task's or a day's name is theirs
/// to write, and a report whose name is taken goes to `runs/` (helper-99).
fn records_dir_not_a_dir(repo: &Repository, tip: &git2::Tree) -> Option<String> {
    let is_dir = |e: &git2::TreeEntry| e.filemode() == 0o040000;
    let is_day = |name: &str| {
        name.len() == 10
            && name.bytes().enumerate().all(|(i, b)| match i {
                4 | 7 => b == b'-',
                _ => b.is_ascii_digit(),
            })
    };
    // The first day directory of `dir` (the tree `id`) that is not a directory.
    let days_of = |dir: &str, id: Oid| -> Option<String> {
        let tree = repo.find_tree(id).ok()?;
        let bad = tree.iter().find(|e| e.name().is_ok_and(is_day) && !is_dir(e))?;
        Some(format!("{dir}/{}", bad.name().unwrap_or_default()))
    };
    if let Some(top) = (crate::layout::RUNTIME_DIRS.iter()).find(|top| tip.get_name(top).is_some_and(|e| !is_dir(&e))) {
        return Some(top.to_string());
    }
    if let Some(bad) = tip.get_name("cards").and_then(|e| days_of("cards", e.id())) {
        return Some(bad);
    }
    let prompts = tip
        .get_name(crate::layout::PROMPTS_DIR)
        .and_then(|e| repo.find_tree(e.id()).ok());
    let tasks = (prompts.iter().flat_map(|t| t.iter()))
        .filter_map(|e| e.name().ok()?.strip_suffix(".md").map(str::to_string))
        .filter(|t| crate::layout::valid_task_name(t));
    let submodule = |e: &git2::TreeEntry| e.filemode() == 0o160000;
    for task in tasks {
        let dir = format!("runs/{task}");
        if let Ok(e) = tip.get_path(std::path::Path::new(&dir)) {
            if !is_dir(&e) {
                return Some(dir);
            }
            if let Some(bad) = days_of(&dir, e.id()) {
                return Some(bad);
            }
        }
        // Below `reports/` a file or a link at a task's or a day's name sends the
        // report to `runs/`; a submodule there leaves a directory git will not commit
        // into, and every commit fails (helper-101).
        let dir = format!("reports/{task}");
        let Ok(e) = tip.get_path(std::path::Path::new(&dir)) else {
            continue;
        };
        if submodule(&e) {
            return Some(dir);
        }
        let days = repo.find_tree(e.id()).ok().filter(|_| is_dir(&e));
        let bad = (days.iter().flat_map(|t| t.iter())).find(|d| d.name().is_ok_and(is_day) && submodule(d));
        if let Some(d) = bad {
            return Some(format!("{dir}/{}", d.name().unwrap_or_default()));
        }
    }
    None
}

/// The key variable the settings of commit `tip` name that is unset or empty in this
/// process's environment (settings that do not parse say nothing here: the fire
/// refuses them with their own error once it runs them).
fn key_missing(repo: &Repository, tip: Oid) -> Option<String> {
    let tree = repo.find_commit(tip).and_then(|c| c.tree()).ok()?;
    let entry = tree.get_path(std::path::Path::new(crate::layout::SETTINGS_FILE)).ok()?;
    let blob = repo.find_blob(entry.id()).ok()?;
    let text = std::str::from_utf8(blob.content()).ok()?;
    let mut diags = Vec::new();
    let settings = crate::settings::parse_runtime_yaml(text, &mut diags)?;
    settings.missing_key_variable().map(str::to_string)
}

/// How many of a ref's last tips count as ones the remote once had.
const ONCE_HAD_TIPS: usize = 64;

/// A path the runtime commits: under one of the runtime directories.
pub(super) fn is_record_path(p: &str) -> bool {
    crate::layout::in_runtime_dirs(p)
}
