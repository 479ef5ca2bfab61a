//! The cron box (docs/design.md): with a `sync` section, a fire first
//! fetches the branch and the approvals from the remote and moves to the remote tip
//! when the box may fire it ([`before_fire`]); after its commit it pushes its records
//! ([`push_after`]). The box never strands its records and never goes quiet:
//!
//! * It moves to the tip only when [`Ctx::judge`] allows: the tip's tree of
//!   builder-owned paths is the one it runs, or is approved by the rule the box runs
//!   under (judged as every commit is, by [`crate::review::trust::Trust`]), the tip
//!   tracks nothing under `.runtime/`, and its settings name no key variable unset
//!   here. Otherwise it fires on what it has ([`Stuck`]): every such fire exits 5,
//!   the cause gets one card ([`crate::fire::sync::FireSync`]), and that card reaches the remote
//!   with the box's records.
//! * Records always reach the remote, whatever else moved there: rebuilt onto a tip
//!   that moved with records only (the box moves with them), or joined onto any other
//!   tip by a merge commit (the box's own commits, which its receipts name, keep
//!   their ids, and the box catches up before its next fire). A rejected push is
//!   retried on the new tip, at most `sync.push_attempts` times, never forced.
//! * A rewritten remote history (a force push) is detected against the tip the box
//!   last joined ([`Ctx::joined`]); the records the rewrite dropped or that were never
//!   pushed are replayed onto the new tip, and a card says what happened. The
//!   dropped history itself is never pushed back.
//! * Nothing it does leaves a lock: see [`locks`].
//!
//! The fetch never forces or prunes an approval: approvals arrive in a staging
//! namespace and are copied into `refs/builder/` when new or a fast-forward; a
//! rewritten approvals chain is joined with the box's, so every approval the box has
//! seen stays. `--no-commit` and eval fires never sync ([`crate::fire::sync::applies`]).

mod history;
mod locks;
mod transport;

use crate::review::runtime_commits::RuntimeKeys;
use crate::review::signing::ApprovalRule;
use crate::settings::SyncSettings;
use git2::{Oid, Repository};
use locks::{Expect, Intent, Point, SetRef};
use std::path::PathBuf;
use transport::{Sent, Transport};

/// A sync step that failed: which step, against which remote and branch, why, and
/// what to do when there is one thing to do.
#[derive(Debug, thiserror::Error)]
#[error("sync {step} with {remote}/{branch}: {message}")]
pub struct SyncError {
    pub step: &'static str,
    pub remote: String,
    pub branch: String,
    pub message: String,
    pub hint: Option<String>,
}

impl SyncError {
    fn hint(mut self, hint: impl Into<String>) -> SyncError {
        self.hint = Some(hint.into());
        self
    }
}

/// Why the box does not move to the remote's tip: it fires on what it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stuck {
    /// The tip's tree of builder-owned paths has no approval that counts; `why`
    /// says why each approval naming it does not count (empty when none names it).
    Unapproved { tip: Oid, tree: Oid, why: Vec<String> },
    /// The tip tracks a path under `.runtime/`, the runtime's private state (its state
    /// database, the walk memo of the two-key check): checking it out would let
    /// whoever pushed it write that state. `state`: the tracked `.runtime` tree.
    TracksState { tip: Oid, state: Oid },
    /// The box cannot check the tip out safely, whatever its approvals: a tree it
    /// would write is one git refuses (a link and a directory of one name write
    /// through the link), or a records directory is not a directory there (every
    /// fire's records would stay on the box). `why` names the path.
    Unsafe { tip: Oid, why: String },
    /// The tip's settings name a key variable unset or empty in the box's
    /// environment: a fire of it could not call its provider. `tree`: the tip's
    /// tree of builder-owned paths.
    KeyMissing { tip: Oid, var: String, tree: Oid },
    /// The tip's builder tree is approved, but its newest approval is older than
    /// that of the newest tree this box ran ([`crate::review::forward`]): moving
    /// there would run rules a later review replaced.
    Rollback {
        tip: Oid,
        back: Box<crate::review::forward::Rollback>,
    },
}

impl Stuck {
    /// One line saying why.
    pub fn reason(&self) -> String {
        match self {
            Stuck::Unapproved { tree, .. } => format!(
                "its builder tree {} has no approval that counts",
                crate::text::short_oid(*tree)
            ),
            Stuck::TracksState { tip, .. } => format!(
                "its tip {} tracks {}/, the runtime's private state",
                crate::text::short_oid(*tip),
                crate::layout::STATE_DIR
            ),
            Stuck::Unsafe { tip, why } => format!(
                "its tip {} cannot be checked out safely: {why}",
                crate::text::short_oid(*tip)
            ),
            Stuck::KeyMissing { var, .. } => format!("its settings name the key variable `{var}`, unset or empty here"),
            Stuck::Rollback { back, .. } => back.summary(),
        }
    }
}

/// How the box's branch stands against the remote's, and what the box does about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Way {
    /// The branch is the remote's.
    UpToDate,
    /// The branch has runtime commits the remote lacks, and nothing else differs.
    Ahead,
    /// The remote is ahead: the box moves to its tip.
    FastForward,
    /// Both moved: the box's unpushed records commits (newest first) go onto the tip.
    Join { runtime: Vec<Oid> },
    /// The remote's history was rewritten: the box's records go onto the tip, its
    /// dropped history does not.
    Replay { runtime: Vec<Oid> },
    /// The box cannot fire the tip, and stays.
    Stuck(Stuck),
}

/// A rewrite of the remote's history that took commits the box had.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    /// The tip the box last joined, which the remote no longer contains.
    pub from: Oid,
    /// How many commits of the box's branch it took away.
    pub lost: usize,
}

/// What the sync found (and, from [`before_fire`], did).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Look {
    /// The box's branch before the sync.
    pub local: Oid,
    /// The remote's tip.
    pub remote: Oid,
    /// Commits on the box's branch and not on the remote's, and the other way round.
    pub ahead: usize,
    pub behind: usize,
    pub rewritten: Option<Rewritten>,
    pub way: Way,
    /// Where the box moved before the fire.
    pub moved: Option<Oid>,
    /// Records replayed onto the tip after a rewrite.
    pub replayed: Vec<String>,
    /// The ref the box's old branch is kept at after a replay.
    pub kept: Option<String>,
    /// How many trees the approvals in `refs/builder/` name after the fetch (counted
    /// by [`look`] only: a fire does not need it).
    pub approvals: Option<usize>,
}

/// What [`push_after`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pushed {
    /// The remote branch is the box's branch.
    Pushed { attempts: u32, head: Oid },
    /// The remote moved beyond records (or holds a tip the box does not fire): the
    /// box's branch was joined onto it by the merge `head`, pushed; the box's branch
    /// is behind the remote's (an ancestor of it) until its next fire.
    Joined { attempts: u32, head: Oid },
    /// The remote's history was rewritten and the box does not join it: `records`
    /// records the remote lacked went onto it in `head`.
    Replayed { attempts: u32, head: Oid, records: usize },
    /// The remote's tip `tip` is one the box may not check out (a tree git refuses,
    /// a records directory that is not one): nothing was built onto it, and the box's
    /// records stay on its branch until someone replaces that tip.
    Held { tip: Oid, why: String },
}

pub(crate) struct Ctx<'a> {
    repo: &'a Repository,
    sync: &'a SyncSettings,
    /// Signs each commit the sync makes on the branch, as the fire signs its own
    /// (`runtime_identity.signing_key`), with the key the settings naming the commit
    /// name ([`RuntimeKeys::signer`]; the approvals-join commit, on the approvals ref,
    /// with the box's own key): a records commit rebuilt, joined or replayed
    /// without it would read as forged to `builder audit`. `None` where the sync only
    /// looks (`runtime check`), or signs nothing.
    sign: Option<&'a RuntimeKeys>,
}

impl Ctx<'_> {
    fn err(&self, step: &'static str, message: impl Into<String>) -> SyncError {
        SyncError {
            step,
            remote: self.sync.remote.clone(),
            branch: self.sync.branch.clone(),
            message: message.into(),
            hint: None,
        }
    }

    fn git(&self, step: &'static str) -> impl Fn(git2::Error) -> SyncError + '_ {
        move |e| self.err(step, e.message().to_string())
    }

    fn local_ref(&self) -> String {
        format!("refs/heads/{}", self.sync.branch)
    }

    fn tracking_ref(&self) -> String {
        format!("refs/remotes/{}/{}", self.sync.remote, self.sync.branch)
    }

    /// Where the fetch puts the remote's tip (the runtime's own ref).
    fn fetched_ref(&self) -> String {
        format!(
            "{}fetched/{}/{}",
            locks::PRIVATE_REFS,
            self.sync.remote,
            self.sync.branch
        )
    }

    /// The remote tip the box last joined: what a rewrite is detected against.
    fn joined_ref(&self) -> String {
        format!(
            "{}joined/{}/{}",
            locks::PRIVATE_REFS,
            self.sync.remote,
            self.sync.branch
        )
    }

    /// Where the fetch stages the remote's approvals (a prefix).
    fn staged_approvals(&self) -> String {
        format!("{}approvals/{}/", locks::PRIVATE_REFS, self.sync.remote)
    }

    /// The tip the box last joined: its own record of it, else (a box that synced
    /// before it kept one) the remote-tracking ref.
    fn joined(&self) -> Option<Oid> {
        self.repo
            .refname_to_id(&self.joined_ref())
            .or_else(|_| self.repo.refname_to_id(&self.tracking_ref()))
            .ok()
    }

    /// The repository's root, where `.runtime/` is.
    fn root(&self) -> PathBuf {
        self.repo
            .workdir()
            .map(std::path::Path::to_path_buf)
            .unwrap_or_else(|| self.repo.path().to_path_buf())
    }

    fn intents(&self) -> PathBuf {
        crate::git::intent_dir(&self.root())
    }

    /// Takes the box's sync lock and undoes what killed sync steps left.
    fn begin_step(&self, step: &'static str) -> Result<locks::SyncLock, SyncError> {
        let held = locks::take(&self.root()).map_err(|e| self.err(step, e))?;
        recover_locked(self.repo, &held, &self.intents()).map_err(|e| self.err(step, e))?;
        Ok(held)
    }

    /// The local branch tip; HEAD must be that branch.
    fn local_tip(&self) -> Result<Oid, SyncError> {
        let head = self.repo.head().map_err(self.git("setup"))?;
        if head.name().ok() != Some(self.local_ref().as_str()) {
            return Err(self
                .err(
                    "setup",
                    format!(
                        "HEAD is {}, not the sync branch {}",
                        head.shorthand().unwrap_or("detached"),
                        self.local_ref()
                    ),
                )
                .hint(format!("check out `{}` on the cron box", self.sync.branch)));
        }
        head.target().ok_or_else(|| self.err("setup", "HEAD names no commit"))
    }

    /// Sets a bookkeeping ref of the runtime's own (under the sync lock, no one else
    /// writes there).
    fn note_ref(&self, name: &str, to: Oid) {
        // Its log keeps the tips it named, whatever `core.logAllRefUpdates` says.
        let _ = self.repo.reference_ensure_log(name);
        if let Err(e) = self.repo.reference(name, to, true, "runtime sync") {
            tracing::warn!(name, error = %e, "a sync bookkeeping ref was not written");
        }
    }

    /// After the box joined `remote` (moved there, pushed it, or found it equal):
    /// the joined tip and, for people reading `git status` on the box, the
    /// remote-tracking ref.
    fn joined_now(&self, intent: &mut Intent, remote: Oid) {
        self.note_ref(&self.joined_ref(), remote);
        self.note_ref(&self.fetched_ref(), remote);
        self.track(intent, remote);
    }

    /// The remote-tracking ref, for people: best effort (a person's `git fetch` on the
    /// box may hold its lock).
    fn track(&self, intent: &mut Intent, remote: Oid) {
        match locks::set_ref(
            self.repo,
            intent,
            &self.tracking_ref(),
            remote,
            Expect::Any,
            Point::Other,
            "runtime sync",
        ) {
            Ok(SetRef::Set) => {}
            Ok(other) => tracing::warn!(?other, "the remote-tracking ref was not updated"),
            Err(e) => tracing::warn!(error = %e, "the remote-tracking ref was not updated"),
        }
    }

    /// Copies the staged approvals into `refs/builder/`: a ref the box lacks is
    /// created; an approval ref (`refs/builder/approved/<id>`) the box has is never
    /// moved; on the legacy chain, one the remote moved forward fast-forwards, and one whose history the
    /// remote rewrote is joined with the box's by a commit with both as parents (it
    /// approves nothing itself), so no approval the box has seen is ever lost.
    fn apply_approvals(&self, intent: &mut Intent, runtime_email: &str) -> Result<(), SyncError> {
        let git = self.git("fetch");
        let staged = self.staged_approvals();
        let (_, namespace) = transport::approvals_namespace();
        let mut incoming = Vec::new();
        for r in self.repo.references_glob(&format!("{staged}*")).map_err(&git)? {
            let r = r.map_err(&git)?;
            if let (Ok(name), Some(id)) = (r.name(), r.target()) {
                incoming.push((format!("{namespace}{}", &name[staged.len()..]), id));
            }
        }
        for (name, theirs) in incoming {
            // A ref under the approvals that names no approval (`<id>/x`, someone's
            // push) is not stored: it approves nothing, and stored, it would stop the
            // real `<id>` from being stored once the origin is repaired (helper-99).
            if name.starts_with(crate::review::APPROVED_PREFIX) && crate::review::approvals::named_id(&name).is_none() {
                tracing::warn!(
                    name,
                    "the remote holds a ref under the approvals that names no approval: not stored"
                );
                continue;
            }
            let ours = self.repo.refname_to_id(&name).ok();
            let to = match ours {
                None => theirs,
                Some(o) if o == theirs => continue,
                // One approval per ref, named by its own id: a ref the origin moved
                // was forced there, and the box keeps the approval it has.
                Some(_) if name.starts_with(crate::review::APPROVED_PREFIX) => {
                    tracing::warn!(name, moved_to = %theirs, "the remote moved an approval ref: kept the box's");
                    continue;
                }
                Some(o) if self.repo.graph_descendant_of(theirs, o).unwrap_or(false) => theirs,
                Some(o) if self.repo.graph_descendant_of(o, theirs).unwrap_or(false) => continue,
                Some(o) => match self.join_approvals(o, theirs, runtime_email) {
                    Ok(j) => j,
                    Err(e) => {
                        tracing::warn!(name, error = %e, "a rewritten approvals ref was kept as the box has it");
                        continue;
                    }
                },
            };
            // One ref the box cannot store (a name below one it holds, `approved/<id>/x`
            // beside `approved/<id>`) is passed over; the others still apply.
            let set = match locks::set_ref(
                self.repo,
                intent,
                &name,
                to,
                Expect::Is(ours),
                Point::Other,
                "runtime sync: approvals",
            ) {
                Ok(set) => set,
                Err(e) => {
                    tracing::warn!(name, error = %e, "an approvals ref cannot be stored here: passed over");
                    continue;
                }
            };
            if set != SetRef::Set {
                tracing::warn!(
                    name,
                    ?set,
                    "an approvals ref was not updated; the next fire tries again"
                );
            }
        }
        Ok(())
    }

    /// A commit joining two histories of an approvals ref (an empty tree: it approves
    /// nothing, and every approval of both stays reachable).
    fn join_approvals(&self, ours: Oid, theirs: Oid, runtime_email: &str) -> Result<Oid, git2::Error> {
        let a = self.repo.find_commit(ours)?;
        let b = self.repo.find_commit(theirs)?;
        let empty = self.repo.find_tree(self.repo.treebuilder(None)?.write()?)?;
        let sig = git2::Signature::now("runtime", runtime_email)?;
        crate::git::commit_object(
            self.repo,
            &sig,
            &sig,
            "runtime: approvals joined (the remote's history of this ref was rewritten; every approval the box has seen stays)\n",
            &empty,
            &[&a, &b],
            self.sign.and_then(|k| k.signer(None)).as_deref(),
        )
        .map_err(|e| git2::Error::from_str(&e.to_string()))
    }

    /// Fetches the branch (its tip is returned) and the approvals, applying them. The
    /// approvals are best effort: a ref the box cannot store (a colleague pushed
    /// `approved/<id>/x` where the box holds `approved/<id>`) or cannot apply is
    /// warned of, and the box goes on with the approvals it has (it does not move to
    /// a tip only the new ones would approve, and says so); never a box that stops
    /// firing for a ref anyone with push access can write.
    fn fetch_with_approvals(&self, intent: &mut Intent, runtime_email: &str) -> Result<Oid, SyncError> {
        // A fetch the staged copy of the approvals blocks (`approved/<id>` held here,
        // `approved/<id>/x` there) is tried once more from an empty staging area: it
        // only ever holds what the last fetch brought.
        let fetched = self.fetch(true).or_else(|e| {
            tracing::warn!(error = %e, "the approvals fetch failed: trying again from an empty staging area");
            self.clear_staged_approvals();
            self.fetch(true)
        });
        let remote = match fetched {
            Ok(remote) => remote,
            Err(e) => {
                let remote = self.fetch(false)?;
                tracing::warn!(error = %e, "the approvals could not be fetched: the box goes on with those it has");
                return Ok(remote);
            }
        };
        if let Err(e) = self.apply_approvals(intent, runtime_email) {
            tracing::warn!(error = %e, "the approvals fetched were not applied: the box goes on with those it has");
        }
        Ok(remote)
    }

    /// Removes every staged approval ref (under the sync lock: no one else writes
    /// there); the approvals the box has are elsewhere and stay.
    fn clear_staged_approvals(&self) {
        let staged = self.staged_approvals();
        let Ok(refs) = self.repo.references_glob(&format!("{staged}*")) else {
            return;
        };
        let names: Vec<String> = refs
            .flatten()
            .filter_map(|r| r.name().ok().map(str::to_string))
            .collect();
        for name in names {
            if let Err(e) = self.repo.find_reference(&name).and_then(|mut r| r.delete()) {
                tracing::warn!(name, error = %e, "a staged approval ref was not removed");
            }
        }
    }

    /// Under the sync lock: fetch, then what the box would do ([`Look`]), moving
    /// nothing.
    fn look(
        &self,
        rule: &ApprovalRule,
        memo: Option<&std::path::Path>,
        intent: &mut Intent,
    ) -> Result<Look, SyncError> {
        let local = self.local_tip()?;
        let remote = self.fetch_with_approvals(intent, &rule.runtime_email)?;
        let git = self.git("fetch");
        let (ahead, behind) = self.repo.graph_ahead_behind(local, remote).map_err(&git)?;
        let mut look = Look {
            local,
            remote,
            ahead,
            behind,
            rewritten: None,
            way: Way::UpToDate,
            moved: None,
            replayed: Vec::new(),
            kept: None,
            approvals: None,
        };
        if remote == local {
            return Ok(look);
        }
        let joined = self.joined();
        let unpushed = self.unpushed(local, remote, joined, &rule.runtime_email)?;
        look.rewritten = joined
            .filter(|o| *o != remote && unpushed.lost > 0)
            .filter(|o| !self.repo.graph_descendant_of(remote, *o).unwrap_or(false))
            .map(|from| Rewritten {
                from,
                lost: unpushed.lost,
            });
        look.way = if !unpushed.dropped.is_empty() {
            Way::Replay {
                runtime: unpushed.runtime,
            }
        } else if unpushed.runtime.is_empty() {
            Way::FastForward
        } else if behind == 0 {
            Way::Ahead
        } else {
            Way::Join {
                runtime: unpushed.runtime,
            }
        };
        if matches!(look.way, Way::FastForward | Way::Join { .. } | Way::Replay { .. }) {
            if let Some(stuck) = self.judge(rule, memo, local, remote)? {
                look.way = Way::Stuck(stuck);
            }
        }
        Ok(look)
    }

    /// Moves the branch from `from` to `to` after updating the index and work tree;
    /// `only` limits the work-tree update to those paths (records, inside the fire's
    /// sandbox). The branch moves by compare-and-swap, its lock and the index's named
    /// in `intent` first.
    fn move_to(&self, intent: &mut Intent, from: Oid, to: Oid, only: Option<&[String]>) -> Result<(), SyncError> {
        let git = self.git("checkout");
        // Never under a person's operation: a merge in progress would end on a first
        // parent its author never saw, with the remote's changes staged as theirs.
        if let Some(blocker) = crate::git::commit_blocker(self.repo).map_err(|e| self.err("checkout", e.to_string()))? {
            return Err(self.err("checkout", format!("the box's branch does not move now: {blocker}")));
        }
        let tree = self.repo.find_commit(to).and_then(|c| c.tree()).map_err(&git)?;
        let from_tree = self.repo.find_commit(from).and_then(|c| c.tree()).map_err(&git)?;
        let differ = match only {
            Some(paths) => paths.to_vec(),
            None => changed_between(self.repo, &from_tree, &tree).map_err(&git)?,
        };
        let moving = locks::Moving {
            branch: self.local_ref(),
            from: from.to_string(),
            to: to.to_string(),
            paths: only.map(<[String]>::to_vec),
        };
        intent
            .moving(Some(moving))
            .map_err(|e| self.err("checkout", format!("the sync intent record: {e}")))?;
        let index_lock = self.index_lock();
        let io = |e: std::io::Error| self.err("checkout", format!("{}: {e}", index_lock.display()));
        crate::git::cut_index_stamp(self.repo);
        intent.about_to_lock(&index_lock).map_err(io)?;
        let written = self.check_out(&tree, only);
        if let Err(e) = written {
            intent.released(&index_lock);
            // A checkout stopped after writing (git's index lock held by a person's
            // git: libgit2 takes it after the files) is undone, so the work tree is
            // the branch's again; one that could not be undone keeps its intent, and
            // the next fire finishes the move.
            if e.code() != git2::ErrorCode::Conflict {
                if let Err(undo) = undo_checkout(self.repo, &from_tree, &differ) {
                    tracing::warn!(error = %undo, "a stopped checkout was not undone: the next fire finishes the move");
                    return Err(git(e));
                }
            }
            let _ = intent.moving(None);
            return Err(git(e));
        }
        intent.released(&index_lock);
        let set = locks::set_ref(
            self.repo,
            intent,
            &self.local_ref(),
            to,
            Expect::Is(Some(from)),
            Point::Branch,
            &format!("runtime sync: {}/{}", self.sync.remote, self.sync.branch),
        )
        .map_err(&git)?;
        if let Err(e) = intent.moving(None) {
            tracing::warn!(error = %e, "the sync intent record was not updated");
        }
        match set {
            SetRef::Set => Ok(()),
            SetRef::Differs(now) => Err(self.err(
                "checkout",
                format!(
                    "{} moved to {} while the sync moved it from {from}",
                    self.local_ref(),
                    now.map(|o| o.to_string()).unwrap_or_else(|| "nothing".into())
                ),
            )),
            SetRef::Locked(lock) => Err(self
                .err(
                    "checkout",
                    format!("{} is locked by another git process", lock.display()),
                )
                .hint(format!("once no git runs on the box, `rm {}`", lock.display()))),
        }
    }

    /// The index's lock file.
    fn index_lock(&self) -> PathBuf {
        let mut p = self
            .repo
            .index()
            .ok()
            .and_then(|i| i.path().map(std::path::Path::to_path_buf))
            .unwrap_or_else(|| self.repo.path().join("index"))
            .into_os_string();
        p.push(".lock");
        PathBuf::from(p)
    }

    /// Checks out `tree` into the index and work tree: only `only` (forced, with the
    /// index then naming `tree` exactly), or everything by a safe checkout.
    fn check_out(&self, tree: &git2::Tree, only: Option<&[String]>) -> Result<(), git2::Error> {
        let mut co = git2::build::CheckoutBuilder::new();
        match only {
            Some(paths) => {
                co.force().update_index(true).disable_pathspec_match(true);
                for p in paths {
                    co.path(p);
                }
                let checked = match paths.is_empty() {
                    true => Ok(()),
                    false => self.repo.checkout_tree(tree.as_object(), Some(&mut co)),
                };
                // The index must name the new tree's records exactly (paths the
                // checkout did not touch are the same in both trees).
                checked.and_then(|()| {
                    // As on disk now (a handle read earlier in this process, before
                    // the fire's commit wrote the index, is stale): `read_tree` keeps
                    // the stat data of the entries it finds.
                    let mut index = self.repo.index()?;
                    index.read(false)?;
                    index.read_tree(tree)?;
                    index.write()
                })
            }
            None => {
                // A safe checkout finds every conflict before it writes anything.
                co.safe();
                self.repo.checkout_tree(tree.as_object(), Some(&mut co))
            }
        }
    }
}

/// The paths whose entries differ between `a` and `b`.
fn changed_between(repo: &Repository, a: &git2::Tree, b: &git2::Tree) -> Result<Vec<String>, git2::Error> {
    Ok(repo
        .diff_tree_to_tree(Some(a), Some(b), None)?
        .deltas()
        .filter_map(|d| d.new_file().path().or(d.old_file().path()))
        .map(|p| p.to_string_lossy().into_owned())
        .collect())
}

/// Puts `paths` back as `from` has them in the work tree (a path `from` lacks is
/// removed), without the index: what undoes a checkout that wrote files and then
/// failed, the index and branch still at `from`. The paths were clean before the
/// checkout (a safe one refuses otherwise), so nobody's work is undone.
fn undo_checkout(repo: &Repository, from: &git2::Tree, paths: &[String]) -> Result<(), git2::Error> {
    if paths.is_empty() {
        return Ok(());
    }
    let mut co = git2::build::CheckoutBuilder::new();
    co.force()
        .remove_untracked(true)
        .update_index(false)
        .disable_pathspec_match(true);
    for p in paths {
        co.path(p);
    }
    repo.checkout_tree(from.as_object(), Some(&mut co))
}

/// Under the sync lock: removes the locks killed sync steps left and finishes the
/// moves of the box's branch they left half done.
fn recover_locked(repo: &Repository, held: &locks::SyncLock, intents: &std::path::Path) -> Result<(), String> {
    let found = locks::recover(held, intents, repo.commondir());
    if !found.removed.is_empty() {
        tracing::warn!(removed = ?found.removed, "locks a killed sync step left were removed");
    }
    for (moving, dead) in found.moves {
        let mut intent = Intent::new(intents);
        finish_move(repo, &mut intent, &moving).map_err(|e| {
            format!(
                "a sync killed while moving {} from {} to {} left it half done, and finishing it failed: {e}",
                moving.branch, moving.from, moving.to
            )
        })?;
        tracing::warn!(
            branch = moving.branch,
            to = moving.to,
            "finished a move of the branch a killed sync step left"
        );
        let _ = std::fs::remove_file(dead);
    }
    Ok(())
}

/// Finishes a move a killed sync step left: when the branch is still where the move
/// started (or already where it ends), the paths that differ are written as the
/// target has them (the box's builder paths were clean when the move began, and
/// records are the runtime's own), the index is the target's, and the branch moves.
/// A branch someone moved elsewhere since is left alone.
fn finish_move(repo: &Repository, intent: &mut Intent, m: &locks::Moving) -> Result<(), git2::Error> {
    let (from, to) = (Oid::from_str(&m.from)?, Oid::from_str(&m.to)?);
    let now = repo.refname_to_id(&m.branch).ok();
    if now != Some(from) && now != Some(to) {
        tracing::warn!(
            branch = m.branch,
            "a half-done move of a branch that moved since is left alone"
        );
        return Ok(());
    }
    let io = |e: std::io::Error| git2::Error::from_str(&e.to_string());
    intent.moving(Some(m.clone())).map_err(io)?;
    crate::git::cut_index_stamp(repo);
    let to_tree = repo.find_commit(to)?.tree()?;
    let paths = match &m.paths {
        Some(p) => p.clone(),
        None => changed_between(repo, &repo.find_commit(from)?.tree()?, &to_tree)?,
    };
    if !paths.is_empty() {
        let mut co = git2::build::CheckoutBuilder::new();
        co.force()
            .remove_untracked(true)
            .update_index(false)
            .disable_pathspec_match(true);
        for p in &paths {
            co.path(p);
        }
        repo.checkout_tree(to_tree.as_object(), Some(&mut co))?;
    }
    let index_lock = repo.path().join("index.lock");
    intent.about_to_lock(&index_lock).map_err(io)?;
    let mut index = repo.index()?;
    index.read(false)?;
    index.read_tree(&to_tree)?;
    index.write()?;
    intent.released(&index_lock);
    if now == Some(from) {
        let set = locks::set_ref(
            repo,
            intent,
            &m.branch,
            to,
            Expect::Is(Some(from)),
            Point::Branch,
            "runtime sync: a move finished",
        )?;
        if set != SetRef::Set {
            return Err(git2::Error::from_str(&format!("{}: {set:?}", m.branch)));
        }
    }
    intent.moving(None).map_err(io)
}

/// Whether a killed sync step left an intent to settle ([`finish_interrupted`]): one
/// directory read, nothing written.
pub fn interrupted(repo: &Repository) -> bool {
    let Some(root) = repo.workdir() else { return false };
    std::fs::read_dir(crate::git::intent_dir(root))
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with(locks::INTENT_PREFIX))
}

/// Before a fire reads its work tree: when a killed sync step left locks or a half-done
/// move of the branch (and only then), takes the sync lock and undoes them, so the
/// fire neither trips over a lock nor takes the half-moved files for someone's
/// uncommitted changes. Nothing to do costs one directory read. Returns whether it
/// found anything to undo.
pub fn finish_interrupted(repo: &Repository) -> bool {
    let Some(root) = repo.workdir() else { return false };
    if !interrupted(repo) {
        return false;
    }
    let intents = crate::git::intent_dir(root);
    let done = locks::take(root).and_then(|held| recover_locked(repo, &held, &intents));
    if let Err(e) = done {
        tracing::warn!(error = %e, "what a killed sync step left was not undone; the sync step tries again");
    }
    true
}

/// What the runtime's own sandbox must also be allowed to write for `sync`: the
/// local remote's directory (none for a network remote, when there is no sync, or
/// when the remote cannot be resolved: the push then fails with a named error, not a
/// wider sandbox).
pub fn sandbox_dirs(repo: &Repository, sync: Option<&SyncSettings>) -> Vec<PathBuf> {
    let Some(sync) = sync else { return Vec::new() };
    match (Ctx { repo, sync, sign: None }).transport() {
        Ok(Transport::Local(dir)) => vec![dir],
        _ => Vec::new(),
    }
}

/// The TCP ports the runtime's own sandbox must also be allowed to connect to for
/// `sync`: a network remote's (its fetch and push URLs'), none for a local remote.
pub fn sandbox_ports(repo: &Repository, sync: Option<&SyncSettings>) -> Vec<u16> {
    let Some(sync) = sync else { return Vec::new() };
    match (Ctx { repo, sync, sign: None }).transport() {
        Ok(Transport::Cli { ports }) => ports,
        _ => Vec::new(),
    }
}

/// What a fire would find, without moving anything: fetches (the branch into the
/// runtime's own ref, the approvals) and judges the remote's tip exactly as
/// [`before_fire`] does. `runtime check` shows it.
pub fn look(
    repo: &Repository,
    sync: &SyncSettings,
    rule: &ApprovalRule,
    memo: Option<&std::path::Path>,
) -> Result<Look, SyncError> {
    let cx = Ctx { repo, sync, sign: None };
    let _held = cx.begin_step("fetch")?;
    let mut intent = Intent::new(&cx.intents());
    let mut look = cx.look(rule, memo, &mut intent)?;
    look.approvals = crate::review::approvals::Approvals::read(repo)
        .ok()
        .map(|a| a.trees().len());
    Ok(look)
}

/// Before a fire (outside its sandbox: it may update builder-owned paths): fetch,
/// judge, and move to the remote tip when the box may fire it (fast-forward, records
/// joined onto it, or replayed onto a rewritten history), remembering the walk of the
/// two-key check under `memo` (the repository root). The records commits it rebuilds
/// are signed through `sign`, as the fire's own.
pub fn before_fire(
    repo: &Repository,
    sync: &SyncSettings,
    rule: &ApprovalRule,
    memo: Option<&std::path::Path>,
    sign: Option<&RuntimeKeys>,
) -> Result<Look, SyncError> {
    let cx = Ctx { repo, sync, sign };
    let _held = cx.begin_step("fetch")?;
    let mut intent = Intent::new(&cx.intents());
    let mut look = cx.look(rule, memo, &mut intent)?;
    let (local, remote) = (look.local, look.remote);
    let to = match &look.way {
        Way::UpToDate | Way::Ahead => {
            cx.joined_now(&mut intent, remote);
            return Ok(look);
        }
        Way::Stuck(_) => return Ok(look),
        Way::FastForward => remote,
        Way::Join { runtime } => cx.rebuild(remote, local, runtime)?,
        Way::Replay { runtime } => {
            let from = look.rewritten.as_ref().map(|r| r.from);
            let replayed = cx.replay(remote, local, runtime, from)?;
            // The box's old branch stays reachable (its receipts name its commits).
            let kept = format!(
                "{}kept/{}/{}/{}",
                locks::PRIVATE_REFS,
                sync.remote,
                sync.branch,
                crate::text::short_oid(local)
            );
            cx.note_ref(&kept, local);
            look.kept = Some(kept);
            match replayed {
                Some((commit, paths)) => {
                    look.replayed = paths;
                    commit
                }
                None => remote,
            }
        }
    };
    // Joined before the move: a fire killed mid-move leaves a box whose branch holds
    // the remote's commits (the next fire finishes the move), and a later rewrite of
    // the remote must find them once had there, not a person's commits on the box. A
    // move that fails puts the joined tip back (the box never joined; a move left for
    // the next fire to finish is finished then), and the ref's log keeps every tip it
    // named either way ([`Ctx::once_had_tips`]).
    let was = cx.joined();
    cx.note_ref(&cx.joined_ref(), remote);
    crate::failpoint!("sync-joined-noted");
    if let Err(e) = cx.move_to(&mut intent, local, to, None) {
        // (A first join that fails leaves the ref: deleting it would delete its log.)
        if let Some(w) = was {
            cx.note_ref(&cx.joined_ref(), w);
        }
        return Err(e);
    }
    cx.joined_now(&mut intent, remote);
    look.moved = Some(to);
    Ok(look)
}

/// How the box's records go onto the remote's tip `remote` in one push attempt.
#[derive(Debug, Clone)]
enum Candidate {
    /// The box's branch itself (it descends from the tip).
    Direct(Oid),
    /// Rebuilt onto a tip that moved with records only; the box moved there.
    Rebuilt(Oid),
    /// A merge of the tip and the box's branch; the box stays.
    Merged(Oid),
    /// Records replayed onto a rewritten history; the box stays.
    Replayed(Oid, usize),
    /// The remote has every record already.
    Nothing,
    /// The remote's tip may not be checked out here ([`Pushed::Held`]).
    Held(Oid, String),
}

impl Ctx<'_> {
    /// The push's error when the remote's branch stays locked.
    fn remote_locked(&self, lock: &str, fix: String) -> SyncError {
        self.err(
            "push",
            format!(
                "the remote's branch is locked ({lock}) past a {}-second wait: a push that died there left the lock, and every push to the remote fails until it is gone (the laptop's too). This fire's records stay committed on the box and go with the next push",
                transport::LOCK_PATIENCE.as_secs()
            ),
        )
        .hint(fix)
    }

    /// After the remote took `candidate` on the `attempt`th push: the box's refs
    /// brought up to what was pushed, and what the push did.
    fn pushed(&self, intent: &mut Intent, candidate: Candidate, attempt: u32, local: Oid) -> Pushed {
        match candidate {
            Candidate::Replayed(head, records) => {
                self.note_ref(&self.fetched_ref(), head);
                self.track(intent, head);
                Pushed::Replayed {
                    attempts: attempt,
                    head,
                    records,
                }
            }
            Candidate::Merged(head) => {
                self.joined_now(intent, head);
                Pushed::Joined {
                    attempts: attempt,
                    head,
                }
            }
            Candidate::Direct(head) | Candidate::Rebuilt(head) => {
                self.joined_now(intent, head);
                Pushed::Pushed {
                    attempts: attempt,
                    head,
                }
            }
            Candidate::Nothing => Pushed::Pushed {
                attempts: attempt,
                head: local,
            },
            Candidate::Held(tip, why) => Pushed::Held { tip, why },
        }
    }

    fn candidate(
        &self,
        intent: &mut Intent,
        local: Oid,
        remote: Option<Oid>,
        runtime_email: &str,
    ) -> Result<Candidate, SyncError> {
        let Some(remote) = remote else {
            return Ok(Candidate::Direct(local));
        };
        if local == remote {
            return Ok(Candidate::Nothing);
        }
        let git = self.git("push");
        let joined = self.joined();
        let unpushed = self.unpushed(local, remote, joined, runtime_email)?;
        // Nothing is built onto a tip the box may not check out: its records would
        // move the box there (or write its tree) after all.
        if !self.repo.graph_descendant_of(local, remote).map_err(&git)? {
            let tip = self.repo.find_commit(remote).and_then(|c| c.tree()).map_err(&git)?;
            if let Some(why) = history::unsafe_to_check_out(self.repo, local, &tip).map_err(&git)? {
                return Ok(Candidate::Held(remote, why));
            }
        }
        if !unpushed.dropped.is_empty() {
            return Ok(match self.replay(remote, local, &unpushed.runtime, joined)? {
                Some((commit, paths)) => Candidate::Replayed(commit, paths.len()),
                None => Candidate::Nothing,
            });
        }
        if unpushed.runtime.is_empty() {
            return Ok(Candidate::Nothing);
        }
        if self.repo.graph_descendant_of(local, remote).map_err(&git)? {
            return Ok(Candidate::Direct(local));
        }
        let joined_tree = self.repo.find_tree(self.joined_tree(remote, local)?).map_err(&git)?;
        let local_tree = self.repo.find_commit(local).and_then(|c| c.tree()).map_err(&git)?;
        let changed = self.changed_paths(&local_tree, &joined_tree)?;
        if changed.iter().all(|p| history::is_record_path(p)) {
            let to = self.rebuild(remote, local, &unpushed.runtime)?;
            self.move_to(intent, local, to, Some(&changed))?;
            return Ok(Candidate::Rebuilt(to));
        }
        let why = if crate::review::builder_tree_of_commit(self.repo, remote).ok()
            == crate::review::builder_tree_of_commit(self.repo, local).ok()
        {
            "it moved beyond records; the box catches up before its next fire"
        } else {
            "its builder-owned paths differ from the tree the box fires; the box moves once it may"
        };
        Ok(Candidate::Merged(self.merge_onto(remote, local, why)?))
    }
}

/// After a fire's commit (inside the runtime's sandbox, which may write the records
/// directories, the git directories and a local remote, not builder-owned paths):
/// put the box's records on the remote. A tip that moved with records only gets them
/// rebuilt on it (the box moves too); any other tip gets a merge with the box's
/// branch (the box stays, and catches up before its next fire, when it may); a
/// rewritten history gets them replayed. A push the remote rejects because it moved
/// is retried on its new tip, and one that died is retried, at most
/// `sync.push_attempts` times, never forced. A lock on the remote's branch that
/// outlasts a short wait is reported with the command that removes it; the box
/// removes only the locks its own killed pushes left.
pub fn push_after(
    repo: &Repository,
    sync: &SyncSettings,
    runtime_email: &str,
    sign: Option<&RuntimeKeys>,
) -> Result<Pushed, SyncError> {
    let cx = Ctx { repo, sync, sign };
    let _held = cx.begin_step("push")?;
    let mut intent = Intent::new(&cx.intents());
    let attempts = sync.push_attempts.max(1);
    let mut remote = repo
        .refname_to_id(&cx.fetched_ref())
        .or_else(|_| repo.refname_to_id(&cx.tracking_ref()))
        .ok();
    for attempt in 1..=attempts {
        let local = cx.local_tip()?;
        let candidate = cx.candidate(&mut intent, local, remote, runtime_email)?;
        let head = match candidate {
            Candidate::Nothing => {
                return Ok(Pushed::Pushed {
                    attempts: attempt - 1,
                    head: remote.unwrap_or(local),
                })
            }
            Candidate::Held(tip, why) => return Ok(Pushed::Held { tip, why }),
            Candidate::Direct(h) | Candidate::Rebuilt(h) | Candidate::Merged(h) | Candidate::Replayed(h, _) => h,
        };
        let sent = match cx.send(&mut intent, head, remote) {
            Ok(sent) => sent,
            Err(e) if attempt < attempts => {
                // A push that died (a dropped connection, a git killed at its bound)
                // is tried again from a fresh fetch; a remote the fetch cannot reach
                // either is the push's error.
                tracing::warn!(error = %e, attempt, "the push failed; trying again");
                remote = Some(cx.fetch(false).map_err(|_| e)?);
                continue;
            }
            Err(e) => return Err(e),
        };
        match sent {
            Sent::Taken => {}
            Sent::Moved => {
                if attempt < attempts {
                    // With the approvals: a tip approved during the fire names the
                    // commit the box makes on it ([`Ctx::merge_onto`]).
                    remote = Some(cx.fetch_with_approvals(&mut intent, runtime_email)?);
                }
                continue;
            }
            Sent::Locked { lock, fix } => return Err(cx.remote_locked(&lock, fix)),
        }
        crate::failpoint!("sync-pushed");
        return Ok(cx.pushed(&mut intent, candidate, attempt, local));
    }
    Err(cx.err(
        "push",
        format!("the remote rejected {attempts} push(es): it kept moving (sync.push_attempts bounds the retries); the records stay committed locally and the next fire pushes them"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::signing::test_keys::keygen;
    use git2::Signature;
    use std::path::Path;

    /// Commits `files` on top of HEAD of `repo` (work tree and index too) as `who`.
    fn commit(repo: &Repository, files: &[(&str, &str)], who: &str) -> Oid {
        let root = repo.workdir().unwrap().to_path_buf();
        let mut index = repo.index().unwrap();
        for (p, body) in files {
            let full = root.join(p);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(&full, body).unwrap();
            index.add_path(Path::new(p)).unwrap();
        }
        index.write().unwrap();
        let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
        let sig = Signature::now(who, &format!("{who}@localhost")).unwrap();
        let parent = repo.head().ok().and_then(|h| h.peel_to_commit().ok());
        let parents: Vec<&git2::Commit> = parent.iter().collect();
        repo.commit(Some("HEAD"), &sig, &sig, who, &tree, &parents).unwrap()
    }

    /// A bare origin with one commit on `main`, and two clones of it.
    fn origin_and_clones(dir: &Path) -> (Repository, Repository, Repository) {
        let mut opts = git2::RepositoryInitOptions::new();
        opts.initial_head("main");
        let seed = Repository::init_opts(dir.join("seed"), &opts).unwrap();
        commit(&seed, &[("prompts/t.md", "hi\n")], "eng");
        let origin = Repository::init_bare(dir.join("origin.git")).unwrap();
        let mut r = seed.remote("origin", dir.join("origin.git").to_str().unwrap()).unwrap();
        r.push(&["refs/heads/main:refs/heads/main"], None).unwrap();
        origin.set_head("refs/heads/main").unwrap();
        let clone = |name: &str| Repository::clone(dir.join("origin.git").to_str().unwrap(), dir.join(name)).unwrap();
        (origin, clone("cron"), clone("other"))
    }

    fn sync() -> SyncSettings {
        SyncSettings {
            remote: "origin".into(),
            branch: "main".into(),
            push_attempts: 3,
        }
    }

    fn push_other(other: &Repository) {
        let mut r = other.find_remote("origin").unwrap();
        r.push(&["refs/heads/main:refs/heads/main"], None).unwrap();
    }

    /// Records in `repo` an approval of the builder tree of `commit` by `who`, signed
    /// with `key`.
    fn approve(repo: &Repository, commit: Oid, who: &str, key: &Path) {
        use crate::review::approvals;
        let person = crate::review::parse_person(who).unwrap();
        let tree = crate::review::builder_tree_of_commit(repo, commit).unwrap();
        let signing = approvals::Signing {
            key: key.to_path_buf(),
            program: "ssh-keygen".into(),
        };
        let body = approvals::signed_body("p", tree, commit, &person, Some(&signing)).unwrap();
        approvals::write(repo, body, &person).unwrap();
    }

    /// Pushes `main` (forced with `force`) and every approval ref, one refspec each:
    /// libgit2's push takes no glob refspecs.
    fn push_main_and_approvals(other: &Repository, force: bool) {
        let mut specs = vec![format!(
            "{}refs/heads/main:refs/heads/main",
            if force { "+" } else { "" }
        )];
        for r in other.references_glob("refs/builder/approved/*").unwrap() {
            let name = r.unwrap().name().unwrap().to_string();
            specs.push(format!("{name}:{name}"));
        }
        other.find_remote("origin").unwrap().push(&specs, None).unwrap();
    }

    fn push_all(other: &Repository) {
        push_main_and_approvals(other, false);
    }

    /// Approvals signed by a key the repository's `settings/allowed_signers` lists.
    fn repository_signers_rule() -> ApprovalRule {
        ApprovalRule {
            runtime_email: "runtime@localhost".into(),
            signers: Some(crate::review::signing::SignerList::Repository(
                "settings/allowed_signers".into(),
            )),
        }
    }

    /// Whether an approval of `commit` verifies by the allowed-signers `list` given as
    /// the operator's (`rule` otherwise).
    fn approved_by_list(repo: &Repository, rule: &ApprovalRule, list: &str, commit: Oid) -> bool {
        let mut own = crate::review::trust::Trust::new(
            repo,
            ApprovalRule {
                signers: Some(crate::review::signing::SignerList::Operator(
                    crate::review::signing::AllowedSigners::parse(Path::new("settings/allowed_signers"), list).unwrap(),
                )),
                ..rule.clone()
            },
        )
        .unwrap();
        own.commit(commit).unwrap().approval.is_some()
    }

    /// Forces over `main` (and pushes) an unrelated history: one commit with `tree_of`'s
    /// tree, approved as Rev with `key`.
    fn force_orphan_of(other: &Repository, tree_of: Oid, key: &Path) -> Oid {
        let tree = other.find_commit(tree_of).unwrap().tree().unwrap();
        let sig = Signature::now("mallory", "mallory@localhost").unwrap();
        let orphan = other.commit(None, &sig, &sig, "orphan", &tree, &[]).unwrap();
        other.reference("refs/heads/main", orphan, true, "force").unwrap();
        approve(other, orphan, "Rev <rev@x.org>", key);
        push_main_and_approvals(other, true);
        orphan
    }

    #[test]
    fn an_incoming_tip_is_judged_by_the_list_of_the_last_approved_tree_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let Some((rev_key, rev_pub)) = keygen(dir.path(), "rev") else {
            return;
        };
        let (mal_key, mal_pub) = keygen(dir.path(), "mallory").unwrap();
        let (_origin, cron, other) = origin_and_clones(dir.path());
        let rule = repository_signers_rule();
        let rev_line = format!("rev@x.org {rev_pub}");
        // The first signed tree, approved by Rev: judged by its own list (bootstrap).
        let first = commit(&other, &[("settings/allowed_signers", &rev_line)], "eng");
        approve(&other, first, "Rev <rev@x.org>", &rev_key);
        push_all(&other);
        assert!(before_fire(&cron, &sync(), &rule, None, None).unwrap().moved.is_some());
        // Mallory lists her key as Rev's and approves that very tree with it.
        let evil = commit(
            &other,
            &[
                ("settings/allowed_signers", &format!("{rev_line}rev@x.org {mal_pub}")),
                ("prompts/t.md", "mallory's\n"),
            ],
            "mallory",
        );
        approve(&other, evil, "Rev <rev@x.org>", &mal_key);
        push_all(&other);
        // The attack ran: by the list her tree brings, her approval verifies.
        let her_list = format!("{rev_line}rev@x.org {mal_pub}");
        assert!(approved_by_list(&other, &rule, &her_list, evil));
        // The cron box judges it by the list before it: it stays where it was.
        let before = cron.refname_to_id("refs/heads/main").unwrap();
        let look = before_fire(&cron, &sync(), &rule, None, None).unwrap();
        let want = crate::review::builder_tree_of_commit(&cron, evil).unwrap();
        assert!(
            matches!(&look.way, Way::Stuck(Stuck::Unapproved { tip, tree, .. }) if *tip == evil && *tree == want),
            "{look:?}"
        );
        assert_eq!(look.moved, None);
        assert_eq!(cron.refname_to_id("refs/heads/main").unwrap(), before);
        // A later change (dropping her key again) Rev approves with his own key is
        // judged by the list of the last approved tree (the first one, Mallory's being
        // unapproved): it moves.
        let fixed = commit(
            &other,
            &[("prompts/t.md", "reviewed\n"), ("settings/allowed_signers", &rev_line)],
            "eng",
        );
        approve(&other, fixed, "Rev <rev@x.org>", &rev_key);
        push_all(&other);
        let look = before_fire(&cron, &sync(), &rule, None, None).unwrap();
        assert_eq!((look.local, look.moved), (before, Some(fixed)));
        // An unrelated history forced over the branch, whose only tree lists her key
        // and carries her approval: no approved tree precedes it there, but the box
        // has one, and its list judges.
        let orphan = force_orphan_of(&other, evil, &mal_key);
        let look = before_fire(&cron, &sync(), &rule, None, None).unwrap();
        assert!(
            matches!(&look.way, Way::Stuck(Stuck::Unapproved { tip, .. }) if *tip == orphan),
            "{look:?}"
        );
        // The orphan history dropped everything the box had: a rewrite, named.
        assert_eq!(look.rewritten.as_ref().map(|r| r.from), Some(fixed));
        assert_eq!(cron.refname_to_id("refs/heads/main").unwrap(), fixed);
    }

    #[test]
    fn the_sandbox_may_write_a_local_remote_and_connect_only_to_a_network_remotes_port() {
        let dir = tempfile::tempdir().unwrap();
        let (_origin, cron, _) = origin_and_clones(dir.path());
        let want = std::fs::canonicalize(dir.path().join("origin.git")).unwrap();
        assert_eq!(sandbox_dirs(&cron, Some(&sync())), vec![want.clone()]);
        assert!(sandbox_dirs(&cron, None).is_empty());
        cron.remote_set_url("origin", &format!("file://{}", want.display()))
            .unwrap();
        assert_eq!(sandbox_dirs(&cron, Some(&sync())), vec![want]);
        for (url, port) in [
            ("https://example.com/a.git", 443),
            ("https://example.com:8443/a.git", 8443),
            ("http://example.com/a.git", 80),
            ("ssh://git@example.com/a.git", 22),
            ("ssh://git@example.com:2222/a.git", 2222),
            ("git@example.com:a.git", 22),
            ("git://127.0.0.1:9419/a.git", 9419),
        ] {
            cron.remote_set_url("origin", url).unwrap();
            assert!(sandbox_dirs(&cron, Some(&sync())).is_empty(), "{url}");
            assert_eq!(sandbox_ports(&cron, Some(&sync())), vec![port], "{url}");
        }
        // A push URL of its own adds its port, and only that.
        cron.remote_set_pushurl("origin", Some("ssh://git@example.com:2222/a.git"))
            .unwrap();
        assert_eq!(sandbox_ports(&cron, Some(&sync())), vec![2222, 9419]);
        cron.remote_set_pushurl("origin", None).unwrap();
        for url in ["ftp://example.com/a.git", "https://"] {
            cron.remote_set_url("origin", url).unwrap();
            assert!(sandbox_ports(&cron, Some(&sync())).is_empty(), "{url}");
            let e = before_fire(&cron, &sync(), &ApprovalRule::unsigned("runtime@localhost"), None, None).unwrap_err();
            assert_eq!(e.step, "setup");
            assert!(e.message.contains("neither a local repository nor"), "{e}");
        }
    }

    #[test]
    fn a_push_the_remote_rejects_is_rebuilt_on_the_new_tip_and_keeps_both_sides() {
        let dir = tempfile::tempdir().unwrap();
        let (origin, cron, other) = origin_and_clones(dir.path());
        let base = origin.refname_to_id("refs/heads/main").unwrap();
        let ours = commit(&cron, &[("runs/t/a.json", "{}")], "runtime");
        commit(&other, &[("reports/other/b.md", "b")], "other");
        push_other(&other);
        let theirs = origin.refname_to_id("refs/heads/main").unwrap();
        let pushed = push_after(&cron, &sync(), "runtime@localhost", None).unwrap();
        let Pushed::Pushed { attempts, head } = pushed else {
            panic!("not pushed: {pushed:?}")
        };
        assert_eq!(attempts, 2, "rejected once, then rebuilt and pushed");
        assert_eq!(origin.refname_to_id("refs/heads/main").unwrap(), head);
        assert_eq!(
            cron.head().unwrap().target(),
            Some(head),
            "the local branch is the remote's"
        );
        let rebuilt = cron.find_commit(head).unwrap();
        assert_eq!(
            rebuilt.parent_ids().collect::<Vec<_>>(),
            vec![theirs],
            "rebuilt on the new tip"
        );
        assert_ne!(head, ours, "our unpushed commit was rebuilt, not forced");
        assert!(origin.graph_descendant_of(head, base).unwrap());
        let tree = rebuilt.tree().unwrap();
        for p in ["runs/t/a.json", "reports/other/b.md", "prompts/t.md"] {
            assert!(tree.get_path(Path::new(p)).is_ok(), "{p} lost");
        }
        // The other side's record is in the cron box's work tree and index too.
        assert!(cron.workdir().unwrap().join("reports/other/b.md").is_file());
        let mut tracked = git2::StatusOptions::new();
        tracked.include_untracked(false);
        assert!(
            cron.statuses(Some(&mut tracked)).unwrap().is_empty(),
            "work tree and index match HEAD"
        );
    }

    #[test]
    fn a_remote_that_moved_beyond_records_gets_the_records_by_a_merge_and_a_foreign_local_commit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (origin, cron, other) = origin_and_clones(dir.path());
        let ours = commit(&cron, &[("runs/t/a.json", "{}")], "runtime");
        commit(&other, &[("prompts/t.md", "changed\n")], "other");
        push_other(&other);
        let theirs = origin.refname_to_id("refs/heads/main").unwrap();
        let Pushed::Joined { attempts, head } = push_after(&cron, &sync(), "runtime@localhost", None).unwrap() else {
            panic!("not joined")
        };
        assert_eq!(attempts, 2, "rejected once, then joined");
        assert_eq!(origin.refname_to_id("refs/heads/main").unwrap(), head);
        assert_eq!(
            origin.find_commit(head).unwrap().parent_ids().collect::<Vec<_>>(),
            vec![theirs, ours],
            "a merge: nothing of theirs rewritten, our commit kept as it is"
        );
        assert_eq!(
            cron.head().unwrap().target(),
            Some(ours),
            "the box did not check out their change"
        );
        assert_eq!(
            std::fs::read_to_string(cron.workdir().unwrap().join("prompts/t.md")).unwrap(),
            "hi\n"
        );
        // Work of someone else on the cron box's branch is never pushed for them.
        commit(&cron, &[("notes.md", "mine")], "eng");
        let e = push_after(&cron, &sync(), "runtime@localhost", None).unwrap_err();
        assert_eq!(e.step, "join");
        assert!(e.to_string().contains("not a runtime records commit"), "{e}");
        assert!(
            e.hint.as_deref().is_some_and(|h| h.contains("git reset --hard")),
            "{e:?}"
        );
        assert_eq!(origin.refname_to_id("refs/heads/main").unwrap(), head, "nothing pushed");
    }

    /// Fetches origin's `main` into `other` and merges it into HEAD; the merge.
    fn merge_origin_main(other: &Repository) -> Oid {
        let mut r = other.find_remote("origin").unwrap();
        r.fetch(&["refs/heads/main:refs/remotes/origin/main"], None, None)
            .unwrap();
        let tip = other.refname_to_id("refs/remotes/origin/main").unwrap();
        let a = other.find_commit(tip).unwrap();
        let b = other.head().unwrap().peel_to_commit().unwrap();
        let idx = other.merge_commits(&b, &a, None).unwrap().write_tree_to(other).unwrap();
        let sig = Signature::now("eng", "eng@localhost").unwrap();
        let t = other.find_tree(idx).unwrap();
        other.commit(Some("HEAD"), &sig, &sig, "merge", &t, &[&b, &a]).unwrap()
    }

    /// Forces `main` of `origin` (a bare repository) to one new commit on its root
    /// commit, dropping the rest of its history; the new commit.
    fn rewrite_main_from_its_root(origin: &Repository) -> Oid {
        let seed = origin
            .find_commit(origin.refname_to_id("refs/heads/main").unwrap())
            .unwrap();
        let base = {
            let mut c = seed;
            while c.parent_count() > 0 {
                c = c.parent(0).unwrap();
            }
            c.id()
        };
        let sig = Signature::now("eng", "eng@localhost").unwrap();
        let base_tree = origin.find_commit(base).unwrap().tree().unwrap();
        let rewritten = origin
            .commit(
                None,
                &sig,
                &sig,
                "rewritten",
                &base_tree,
                &[&origin.find_commit(base).unwrap()],
            )
            .unwrap();
        origin.reference("refs/heads/main", rewritten, true, "force").unwrap();
        rewritten
    }

    #[test]
    fn a_rewritten_remote_history_gets_the_boxs_records_replayed_and_loses_none() {
        let dir = tempfile::tempdir().unwrap();
        let (origin, cron, other) = origin_and_clones(dir.path());
        let rule = ApprovalRule::unsigned("runtime@localhost");
        // The box fires and pushes twice; an engineer's commit lands between.
        commit(&cron, &[("runs/t/1.json", "{}")], "runtime");
        push_after(&cron, &sync(), "runtime@localhost", None).unwrap();
        commit(&other, &[("notes/a.md", "a")], "eng");
        let merged = merge_origin_main(&other);
        push_other(&other);
        assert_eq!(
            before_fire(&cron, &sync(), &rule, None, None).unwrap().moved,
            Some(merged)
        );
        commit(&cron, &[("runs/t/2.json", "{}")], "runtime");
        push_after(&cron, &sync(), "runtime@localhost", None).unwrap();
        // One more fire's records, not pushed yet.
        commit(&cron, &[("runs/t/3.json", "{}")], "runtime");
        let old_branch = cron.head().unwrap().target().unwrap();
        // Someone force-pushes a history without the engineer's commit or the records.
        let rewritten = rewrite_main_from_its_root(&origin);
        let look = before_fire(&cron, &sync(), &rule, None, None).unwrap();
        let rw = look.rewritten.clone().expect("the rewrite is detected");
        assert!(rw.lost >= 3, "{look:?}");
        assert!(matches!(look.way, Way::Replay { .. }), "{look:?}");
        assert_eq!(look.replayed, vec!["runs/t/1.json", "runs/t/2.json", "runs/t/3.json"]);
        let moved = look.moved.unwrap();
        assert_eq!(
            cron.find_commit(moved).unwrap().parent_ids().collect::<Vec<_>>(),
            vec![rewritten],
            "replayed onto the new tip; the dropped history is not brought back"
        );
        assert!(cron
            .find_commit(moved)
            .unwrap()
            .tree()
            .unwrap()
            .get_path(Path::new("notes/a.md"))
            .is_err());
        assert_eq!(cron.refname_to_id(look.kept.as_deref().unwrap()).unwrap(), old_branch);
        // The next push sends the replay; every record is on the origin.
        let Pushed::Pushed { head, .. } = push_after(&cron, &sync(), "runtime@localhost", None).unwrap() else {
            panic!("not pushed")
        };
        let tree = origin.find_commit(head).unwrap().tree().unwrap();
        for p in ["runs/t/1.json", "runs/t/2.json", "runs/t/3.json"] {
            assert!(tree.get_path(Path::new(p)).is_ok(), "{p} lost");
        }
        // And the next sync is an ordinary one: no rewrite named again.
        let look = before_fire(&cron, &sync(), &rule, None, None).unwrap();
        assert_eq!((look.way, look.rewritten), (Way::UpToDate, None));
    }

    #[test]
    fn approvals_are_never_forced_or_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let (origin, cron, other) = origin_and_clones(dir.path());
        let rule = ApprovalRule::unsigned("runtime@localhost");
        let head = other.head().unwrap().target().unwrap();
        let approve = |repo: &Repository, who: &str| {
            let person = crate::review::parse_person(who).unwrap();
            let tree = crate::review::builder_tree_of_commit(repo, head).unwrap();
            let body = crate::review::approvals::signed_body("p", tree, head, &person, None).unwrap();
            crate::review::approvals::write(repo, body, &person).unwrap().id
        };
        let first = approve(&other, "Rev <rev@x.org>");
        let first_ref = crate::review::approvals::approval_ref(first);
        push_all(&other);
        before_fire(&cron, &sync(), &rule, None, None).unwrap();
        assert_eq!(cron.refname_to_id(&first_ref).unwrap(), first);
        // Someone deletes the first approval on the origin and pushes another.
        origin.find_reference(&first_ref).unwrap().delete().unwrap();
        let other2 = Repository::clone(dir.path().join("origin.git").to_str().unwrap(), dir.path().join("o2")).unwrap();
        let second = approve(&other2, "Ann <ann@x.org>");
        push_all(&other2);
        assert!(
            origin.refname_to_id(&first_ref).is_err(),
            "the attack ran: the origin lost it"
        );
        let look = before_fire(&cron, &sync(), &rule, None, None).unwrap();
        assert_eq!(cron.refname_to_id(&first_ref).unwrap(), first, "not pruned");
        let all = crate::review::approvals::load(&cron).unwrap();
        let ids: Vec<Oid> = all.iter().map(|a| a.id).collect();
        assert!(ids.contains(&first) && ids.contains(&second), "{ids:?}");
        assert_eq!(all.len(), 2, "the fetch approves nothing itself");
        assert_eq!(look.approvals, None, "a fire does not count them");
        assert_eq!(
            super::look(&cron, &sync(), &rule, None).unwrap().approvals,
            Some(1),
            "one approved tree"
        );
    }

    #[test]
    fn a_lock_on_the_remote_is_removed_only_when_the_boxs_own_killed_push_left_it() {
        let dir = tempfile::tempdir().unwrap();
        let (origin, cron, _other) = origin_and_clones(dir.path());
        let lock = dir.path().join("origin.git/refs/heads/main.lock");
        // A laptop's push killed on the origin: not the box's, never removed by it.
        std::fs::write(&lock, "").unwrap();
        commit(&cron, &[("runs/t/a.json", "{}")], "runtime");
        let e = push_after(&cron, &sync(), "runtime@localhost", None).unwrap_err();
        assert!(!e.message.contains("kept moving"), "{e}");
        assert!(e.message.contains("locked"), "{e}");
        let hint = e.hint.clone().unwrap();
        assert!(
            hint.contains(&format!("rm {}", lock.canonicalize().unwrap().display())),
            "{hint}"
        );
        assert!(lock.exists());
        std::fs::remove_file(&lock).unwrap();
        // The box's own push, killed holding the lock (its record names it by
        // identity, from a process that is gone): removed by the next push.
        std::fs::write(&lock, "").unwrap();
        let intents = crate::git::intent_dir(cron.workdir().unwrap());
        std::fs::create_dir_all(&intents).unwrap();
        let m = std::fs::metadata(&lock).unwrap();
        use std::os::unix::fs::MetadataExt;
        let record = serde_json::json!({"pid": 4_194_305, "start_time": 1, "locks": [{
            "path": lock, "ino": m.ino(), "ctime_ns": m.ctime() * 1_000_000_000 + m.ctime_nsec()}]});
        std::fs::write(intents.join("sync-intent-4194305.json"), record.to_string()).unwrap();
        let Pushed::Pushed { head, .. } = push_after(&cron, &sync(), "runtime@localhost", None).unwrap() else {
            panic!("not pushed")
        };
        assert_eq!(origin.refname_to_id("refs/heads/main").unwrap(), head);
        assert!(!lock.exists());
        let records = std::fs::read_dir(&intents)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("sync-intent-"))
            .count();
        assert_eq!(records, 0, "no record left");
    }

    #[test]
    fn a_tip_whose_settings_name_a_key_unset_here_is_not_moved_to() {
        let dir = tempfile::tempdir().unwrap();
        let (_origin, cron, other) = origin_and_clones(dir.path());
        let rule = ApprovalRule::unsigned("runtime@localhost");
        let var = "SYNC_TEST_KEY_THAT_IS_NEVER_SET";
        let settings = format!(
            "version: 1\nprovider: {{kind: openai, base_url: 'http://127.0.0.1:1/v1', model: m, api_key_env: {var}}}\n"
        );
        let tip = commit(&other, &[("settings/runtime.yaml", &settings)], "eng");
        let person = crate::review::parse_person("Rev <rev@x.org>").unwrap();
        let tree = crate::review::builder_tree_of_commit(&other, tip).unwrap();
        let body = crate::review::approvals::signed_body("p", tree, tip, &person, None).unwrap();
        crate::review::approvals::write(&other, body, &person).unwrap();
        push_all(&other);
        let before = cron.head().unwrap().target().unwrap();
        let look = before_fire(&cron, &sync(), &rule, None, None).unwrap();
        assert!(
            matches!(&look.way, Way::Stuck(Stuck::KeyMissing { tip: t, var: v, .. }) if *t == tip && v == var),
            "{look:?}"
        );
        assert_eq!(cron.head().unwrap().target(), Some(before));
    }

    /// A `git daemon` (git://, receive-pack on) serving `base` on a free port of
    /// 127.0.0.1: a network remote for the `git` command-line transport.
    struct Daemon {
        child: std::process::Child,
        port: u16,
    }

    impl Drop for Daemon {
        fn drop(&mut self) {
            // `git daemon` runs `git-daemon` as its child: the whole group goes.
            let _ = kernel::signal::kill_group(self.child.id(), kernel::signal::Signal::Kill);
            let _ = self.child.wait();
        }
    }

    fn git_daemon(base: &Path) -> Daemon {
        use std::os::unix::process::CommandExt;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new("git")
            .args(["daemon", "--reuseaddr", "--export-all", "--enable=receive-pack"])
            .arg("--listen=127.0.0.1")
            .arg(format!("--port={port}"))
            .arg(format!("--base-path={}", base.display()))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .process_group(0)
            .spawn()
            .unwrap();
        let daemon = Daemon { child, port };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return daemon;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!("git daemon did not listen on {port}");
    }

    /// In a thread inside the runtime's sandbox granted `ports`: a push from `cron`
    /// goes through, without writing `origin_dir` itself; one to `other_url` (another
    /// port) is refused.
    fn push_in_the_runtime_sandbox(cron: &Repository, ports: Vec<u16>, other_url: String, origin_dir: PathBuf) {
        let root = cron.workdir().unwrap().to_path_buf();
        let git_dirs = crate::git::git_dirs(cron);
        let cron_path = cron.path().to_path_buf();
        std::thread::spawn(move || {
            let spec = crate::sandbox::runtime_spec(&root, &git_dirs, &ports);
            crate::sandbox::prepare_dirs(&spec, &root).unwrap();
            crate::sandbox::landlock::enforce(&spec, crate::settings::LandlockMode::Required).unwrap();
            let cron = Repository::open(&cron_path).unwrap();
            let ours = commit(&cron, &[("runs/t/b.json", "{}")], "runtime");
            let pushed = push_after(&cron, &sync(), "runtime@localhost", None).unwrap();
            assert_eq!(
                pushed,
                Pushed::Pushed {
                    attempts: 1,
                    head: ours
                }
            );
            assert!(
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(origin_dir.join("HEAD"))
                    .is_err(),
                "the sandbox does not write the origin's directory itself"
            );
            cron.remote_set_url("origin", &other_url).unwrap();
            commit(&cron, &[("runs/t/c.json", "{}")], "runtime");
            let e = push_after(&cron, &sync(), "runtime@localhost", None).unwrap_err();
            assert_eq!(e.step, "push", "{e}");
            // The port that served this box's fetch outside the sandbox: refused inside.
            assert!(e.message.contains("unable to connect"), "{e}");
            assert!(e.message.contains("Permission denied"), "{e}");
        })
        .join()
        .unwrap();
    }

    #[test]
    fn over_a_network_remote_the_cli_fetches_pushes_by_compare_and_swap_and_the_sandbox_allows_only_its_port() {
        let dir = tempfile::tempdir().unwrap();
        let (origin, cron, other) = origin_and_clones(dir.path());
        let served = git_daemon(dir.path());
        let elsewhere = git_daemon(dir.path());
        let url = |d: &Daemon| format!("git://127.0.0.1:{}/origin.git", d.port);
        let rule = ApprovalRule::unsigned("runtime@localhost");

        // The other port is reachable from outside the sandbox: the fetch through it runs.
        cron.remote_set_url("origin", &url(&elsewhere)).unwrap();
        let _ = cron.find_reference("refs/remotes/origin/main").unwrap().delete();
        assert_eq!(
            before_fire(&cron, &sync(), &rule, None, None).unwrap().way,
            Way::UpToDate
        );
        assert!(cron.refname_to_id("refs/remotes/origin/main").is_ok(), "fetched");

        // The fetch takes refs/builder/* too.
        cron.remote_set_url("origin", &url(&served)).unwrap();
        let seed = origin.refname_to_id("refs/heads/main").unwrap();
        origin.reference("refs/builder/approvals", seed, true, "test").unwrap();
        assert_eq!(
            before_fire(&cron, &sync(), &rule, None, None).unwrap().way,
            Way::UpToDate
        );
        assert_eq!(cron.refname_to_id("refs/builder/approvals").unwrap(), seed);

        // A push that lost the race to another is rejected by the lease, never
        // forced: rebuilt on the new tip and pushed again.
        commit(&cron, &[("runs/t/a.json", "{}")], "runtime");
        commit(&other, &[("reports/other/b.md", "b")], "other");
        push_other(&other);
        let theirs = origin.refname_to_id("refs/heads/main").unwrap();
        let Pushed::Pushed { attempts, head } = push_after(&cron, &sync(), "runtime@localhost", None).unwrap() else {
            panic!("not pushed")
        };
        assert_eq!(attempts, 2, "rejected once, then rebuilt and pushed");
        assert_eq!(origin.refname_to_id("refs/heads/main").unwrap(), head);
        assert_eq!(
            cron.find_commit(head).unwrap().parent_ids().collect::<Vec<_>>(),
            vec![theirs]
        );

        // Inside the runtime's own sandbox (granted the remote's port and nothing
        // else), the push through `git` works on that port; the other port is refused.
        let ports = sandbox_ports(&cron, Some(&sync()));
        assert_eq!(ports, vec![served.port]);
        push_in_the_runtime_sandbox(&cron, ports, url(&elsewhere), dir.path().join("origin.git"));
        assert_ne!(
            origin.refname_to_id("refs/heads/main").unwrap(),
            cron.refname_to_id("refs/heads/main").unwrap(),
            "the refused push sent nothing"
        );
    }
}
