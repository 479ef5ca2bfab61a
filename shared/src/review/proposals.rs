//! Proposals: `propose` moves the work tree's changes to builder-owned paths onto a
//! commit on `proposals/<name>` (parent: HEAD) and cleans them out of the work tree
//! and index, leaving the current branch where it was; `list` tells each proposal's
//! state; `approve` checks who may approve and records the approval of the proposal
//! head's builder tree; `merge` lands an approved proposal on the current branch as a
//! merge commit with `Reviewed-by:`, `Approved-tree:` and `Fixes-card:` trailers.

use super::approvals::{self, Approval, Signing};
use super::owned::OwnedPaths;
use super::signing::ApprovalRule;
use super::trust::Trust;
use super::{builder_tree_of, same_person, ReviewError, PROPOSAL_PREFIX};
use crate::git::Person;
use crate::layout::{Owner, Ownership};
use git2::{build::TreeUpdateBuilder, BranchType, FileMode, Oid, Repository, Signature};
use serde::Serialize;
use std::path::Path;

/// A proposal's state (docs/design.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// No approval of this proposal yet.
    Open,
    /// Its head's builder tree is approved.
    Approved,
    /// Approved once, but the proposal changed since: no approval covers its tree.
    Stale,
    /// Its head is in the current branch, and an approval of its tree counts.
    Merged,
    /// Its head is in the current branch, and no approval of its tree counts.
    MergedWithoutApproval,
}

impl State {
    pub fn name(self) -> &'static str {
        match self {
            State::Open => "open",
            State::Approved => "approved",
            State::Stale => "stale",
            State::Merged => "merged",
            State::MergedWithoutApproval => "merged without approval",
        }
    }
}

/// One proposal as `builder proposals` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Proposal {
    pub name: String,
    pub state: State,
    /// Distinct authors of the proposal's commits since its base (`Name <email>`).
    pub authors: Vec<String>,
    pub head: String,
    /// The builder tree of its head.
    pub tree: String,
    /// Where the proposal's branch stands against the remote's, when they differ or
    /// only one side has it (`not pushed`, `only on origin`, `behind origin`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
}

/// The trailer naming a card a proposal fixes.
pub const FIXES_CARD: &str = "Fixes-card:";

/// What `propose` did.
#[derive(Debug)]
pub struct Proposed {
    pub branch: String,
    pub commit: Oid,
    pub paths: Vec<String>,
}

fn branch_name(name: &str) -> String {
    format!("{PROPOSAL_PREFIX}{name}")
}

fn valid_name(name: &str) -> Result<(), ReviewError> {
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
        && git2::Branch::name_is_valid(&branch_name(name)).unwrap_or(false);
    if ok {
        Ok(())
    } else {
        Err(ReviewError::Usage(format!(
            "`{name}` is not a valid proposal name (letters, digits, `-`, `_`, `.`, `/`; a valid git branch name)"
        )))
    }
}

fn head_commit(repo: &Repository) -> Result<git2::Commit<'_>, ReviewError> {
    repo.head()
        .and_then(|h| h.peel_to_commit())
        .map_err(|_| ReviewError::Usage("HEAD names no commit yet: commit the scaffold first".into()))
}

/// Where a proposal's branch is: this clone's `proposals/<name>` and the remote's
/// (its remote-tracking ref, as last fetched).
#[derive(Debug, Clone, Copy)]
struct Heads {
    local: Option<Oid>,
    remote: Option<Oid>,
}

fn heads(repo: &Repository, name: &str, remote: Option<&str>) -> Result<Heads, ReviewError> {
    let local = match repo.find_branch(&branch_name(name), BranchType::Local) {
        Ok(b) => Some(b.get().peel_to_commit()?.id()),
        Err(e) if e.code() == git2::ErrorCode::NotFound => None,
        Err(e) => return Err(e.into()),
    };
    let remote = match remote {
        Some(r) => super::remote::remote_proposal(repo, r, name),
        // No remote named: the one remote that has the branch, if only one does.
        None => {
            let found: Vec<Oid> = repo
                .remotes()?
                .iter()
                .flatten()
                .flatten()
                .filter_map(|r| super::remote::remote_proposal(repo, r, name))
                .collect();
            match found.as_slice() {
                [one] => Some(*one),
                _ => None,
            }
        }
    };
    Ok(Heads { local, remote })
}

/// How a local proposal branch stands against the remote's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Same,
    LocalOnly,
    RemoteOnly,
    Ahead,
    Behind,
    Diverged,
}

fn standing(repo: &Repository, h: Heads) -> Result<Standing, ReviewError> {
    Ok(match (h.local, h.remote) {
        (Some(l), Some(r)) if l == r => Standing::Same,
        (Some(l), Some(r)) if repo.graph_descendant_of(r, l)? => Standing::Behind,
        (Some(l), Some(r)) if repo.graph_descendant_of(l, r)? => Standing::Ahead,
        (Some(_), Some(_)) => Standing::Diverged,
        (Some(_), None) => Standing::LocalOnly,
        (None, _) => Standing::RemoteOnly,
    })
}

/// The head of proposal `name`: this clone's branch, else the remote's (fetched).
pub(crate) fn proposal_head(repo: &Repository, name: &str, remote: Option<&str>) -> Result<Oid, ReviewError> {
    let h = heads(repo, name, remote)?;
    h.local.or(h.remote).ok_or_else(|| {
        ReviewError::Usage(match remote {
            Some(r) => format!(
                "no proposal `{name}` (no branch {0}, here or as {r}/{0}; `git fetch {r}` brings the remote's)",
                branch_name(name)
            ),
            None => format!("no proposal `{name}` (no branch {})", branch_name(name)),
        })
    })
}

/// The head of proposal `name` for an approval: this clone's branch only when it is
/// the remote's or ahead of it (not pushed yet); refused when it is behind (the author
/// changed it since) or diverged (the author rewrote it), naming the fix.
fn head_to_approve(repo: &Repository, name: &str, remote: Option<&str>) -> Result<Oid, ReviewError> {
    let h = heads(repo, name, remote)?;
    let r = remote.unwrap_or("origin");
    let branch = branch_name(name);
    let checked_out = repo
        .head()
        .ok()
        .and_then(|h| h.shorthand().ok().map(str::to_string))
        .is_some_and(|b| b == branch);
    let update = if checked_out {
        format!("`git merge --ff-only {r}/{branch}`")
    } else {
        format!("`git branch -f {branch} {r}/{branch}`")
    };
    match standing(repo, h)? {
        Standing::Behind => Err(ReviewError::Refused(format!(
            "your {branch} is behind {r}/{branch} (the author changed it since you fetched it): update it with {update}, review it again, then approve"
        ))),
        Standing::Diverged => Err(ReviewError::Refused(format!(
            "your {branch} and {r}/{branch} have diverged (the author rewrote it): take the author's with {} (your own commits on it are dropped), review it again, then approve",
            if checked_out {
                format!("`git reset --hard {r}/{branch}`")
            } else {
                format!("`git branch -f {branch} {r}/{branch}`")
            }
        ))),
        Standing::Same | Standing::LocalOnly | Standing::RemoteOnly | Standing::Ahead => {
            proposal_head(repo, name, remote)
        }
    }
}

/// Moves the work tree's changes to builder-owned paths onto a new commit on
/// `proposals/<name>`, authored by `author`; HEAD does not move, and those paths are
/// restored to HEAD's version in the index and the work tree (other changes stay).
pub fn propose(
    repo: &Repository,
    root: &Path,
    ownership: &Ownership,
    name: &str,
    message: &str,
    fixes: &[String],
    author: &Person,
) -> Result<Proposed, ReviewError> {
    valid_name(name)?;
    let branch = branch_name(name);
    if repo.find_branch(&branch, BranchType::Local).is_ok() {
        return Err(ReviewError::Refused(format!(
            "proposal `{name}` exists already (branch {branch})"
        )));
    }
    let head = head_commit(repo)?;
    let paths = crate::git::dirty_builder_paths(repo, ownership)?;
    if paths.is_empty() {
        return Err(ReviewError::Refused(
            "nothing to propose: no builder-owned path has uncommitted changes".into(),
        ));
    }
    let base_tree = head.tree()?;
    let mut update = work_tree_update(repo, root, &paths)?;
    let tree = repo.find_tree(update.create_updated(repo, &base_tree)?)?;
    if tree.id() == base_tree.id() {
        return Err(ReviewError::Refused(
            "nothing to propose: the changes to builder-owned paths undo each other".into(),
        ));
    }
    let sig = Signature::now(&author.name, &author.email)?;
    let msg = proposal_message(message, fixes);
    let commit = repo.commit(None, &sig, &sig, &msg, &tree, &[&head])?;
    let _work = super::work::Work::begin(
        repo,
        super::work::Op::Propose {
            branch: branch.clone(),
            head: head.id().to_string(),
            commit: commit.to_string(),
        },
    )?;
    let _locks = crate::git::LockIntent::hold(
        &super::work::intent_dir(repo),
        &[
            crate::git::lock_file_of(&repo.commondir().join(format!("refs/heads/{branch}"))),
            crate::git::lock_file_of(&repo.path().join("index")),
        ],
    )?;
    repo.branch(&branch, &repo.find_commit(commit)?, false)?;
    crate::failpoint!("propose-after-branch");
    // The change is safe on the branch: restore HEAD's version of those paths.
    restore_from_head(repo, root, &head, &paths)?;
    crate::failpoint!("propose-after-restore");
    Ok(Proposed { branch, commit, paths })
}

/// The tree update that makes `paths` what they are in the work tree: a symlink's
/// target, a regular file's bytes and executable bit, or gone.
fn work_tree_update(repo: &Repository, root: &Path, paths: &[String]) -> Result<TreeUpdateBuilder, ReviewError> {
    let mut update = TreeUpdateBuilder::new();
    for p in paths {
        let full = root.join(p);
        match std::fs::symlink_metadata(&full) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let target = std::fs::read_link(&full).map_err(|e| ReviewError::Io {
                    path: full.clone(),
                    source: e,
                })?;
                let oid = repo.blob(target.as_os_str().as_encoded_bytes())?;
                update.upsert(p.as_str(), oid, FileMode::Link);
            }
            Ok(meta) if meta.is_file() => {
                use std::os::unix::fs::PermissionsExt;
                let oid = repo.blob_path(&full)?;
                let mode = if meta.permissions().mode() & 0o111 != 0 {
                    FileMode::BlobExecutable
                } else {
                    FileMode::Blob
                };
                update.upsert(p.as_str(), oid, mode);
            }
            Ok(_) => {
                return Err(ReviewError::Refused(format!(
                    "{p}: not a regular file or symlink; cannot propose it"
                )))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                update.remove(p.as_str());
            }
            Err(e) => return Err(ReviewError::Io { path: full, source: e }),
        }
    }
    Ok(update)
}

/// The proposal commit's message: the proposer's, then a [`FIXES_CARD`] line per
/// card it says it fixes.
fn proposal_message(message: &str, fixes: &[String]) -> String {
    let mut msg = message.trim_end().to_string();
    if !fixes.is_empty() {
        msg.push_str("\n\n");
        for f in fixes {
            msg.push_str(&format!("{FIXES_CARD} {f}\n"));
        }
    }
    msg
}

/// Puts `paths` back to `head`'s version in the index and the work tree; a path not
/// in `head` is removed from both.
fn restore_from_head(repo: &Repository, root: &Path, head: &git2::Commit, paths: &[String]) -> Result<(), ReviewError> {
    let head_tree = head.tree()?;
    crate::git::cut_index_stamp(repo);
    let mut index = repo.index()?;
    index.read(false)?;
    let mut in_head = Vec::new();
    for p in paths {
        if head_tree.get_path(Path::new(p)).is_ok() {
            in_head.push(p.clone());
        } else {
            let _ = index.remove_path(Path::new(p));
            let full = root.join(p);
            match std::fs::remove_file(&full) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(ReviewError::Io { path: full, source: e }),
            }
        }
    }
    index.write()?;
    if !in_head.is_empty() {
        let mut co = git2::build::CheckoutBuilder::new();
        co.force().update_index(true).disable_pathspec_match(true);
        for p in &in_head {
            co.path(p);
        }
        repo.checkout_tree(head_tree.as_object(), Some(&mut co))?;
    }
    Ok(())
}

/// Commits of the proposal since its base: reachable from its head, not from the
/// protected branch as this clone knows it ([`super::base::protected_tip`]; HEAD when
/// the clone has neither): never from whatever HEAD is, which a writer who checked
/// out their own commit would otherwise hide from the check of who wrote it.
fn proposal_commits<'r>(repo: &'r Repository, head: Oid) -> Result<Vec<git2::Commit<'r>>, ReviewError> {
    let mut walk = repo.revwalk()?;
    walk.push(head)?;
    let base = match super::base::protected_tip(repo)? {
        Some(tip) => Some(tip.commit),
        None => repo.head().and_then(|h| h.peel_to_commit()).ok().map(|c| c.id()),
    };
    if let Some(base) = base {
        walk.hide(base)?;
    }
    let mut out = Vec::new();
    for oid in walk {
        out.push(repo.find_commit(oid?)?);
    }
    Ok(out)
}

/// Refuses `reviewer` when they wrote a commit of proposal `name`: authored it, or
/// committed it (a change written under another name is still committed by whoever
/// made the commit, unless they set that too: git's identities are the writer's to
/// choose, as docs/review.md says).
fn refuse_a_writer(commits: &[git2::Commit], name: &str, reviewer: &Person) -> Result<(), ReviewError> {
    if let Some(author) = authors_of(commits)
        .into_iter()
        .find(|a| same_person(&a.email, &reviewer.email))
    {
        return Err(ReviewError::Refused(format!(
            "{reviewer} cannot approve proposal `{name}`: {author} authored a commit of it (a proposal's authors never approve it)"
        )));
    }
    if let Some(c) = commits
        .iter()
        .find(|c| same_person(c.committer().email().unwrap_or(""), &reviewer.email))
    {
        return Err(ReviewError::Refused(format!(
            "{reviewer} cannot approve proposal `{name}`: they committed {} of it (a proposal's writers never approve it)",
            crate::text::short_oid(c.id())
        )));
    }
    Ok(())
}

fn authors_of(commits: &[git2::Commit]) -> Vec<Person> {
    let mut out: Vec<Person> = Vec::new();
    for c in commits {
        let a = c.author();
        let p = Person {
            name: a.name().unwrap_or("").to_string(),
            email: a.email().unwrap_or("").to_string(),
        };
        if !out.iter().any(|o| same_person(&o.email, &p.email)) {
            out.push(p);
        }
    }
    out
}

fn is_merged(repo: &Repository, head: Oid) -> Result<bool, ReviewError> {
    let Ok(current) = repo.head().and_then(|h| h.peel_to_commit()) else {
        return Ok(false);
    };
    Ok(current.id() == head || repo.graph_descendant_of(current.id(), head)?)
}

/// The commit a proposal is judged on: where it meets the current branch; the
/// current branch's tip when they share no history (an unrelated history is judged
/// by the list the branch trusts, not trusted on first use); its own head when there
/// is no current branch yet.
fn base_of(repo: &Repository, head: Oid) -> Result<Oid, ReviewError> {
    match repo.head().and_then(|h| h.peel_to_commit()) {
        Ok(current) => match repo.merge_base(current.id(), head) {
            Ok(base) => Ok(base),
            Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(current.id()),
            Err(e) => Err(e.into()),
        },
        Err(_) => Ok(head),
    }
}

fn state_of(repo: &Repository, trust: &mut Trust, name: &str, head: Oid) -> Result<State, ReviewError> {
    let counts = trust.proposal(base_of(repo, head)?, head)?.approval.is_some();
    if is_merged(repo, head)? {
        return Ok(if counts {
            State::Merged
        } else {
            State::MergedWithoutApproval
        });
    }
    if counts {
        return Ok(State::Approved);
    }
    Ok(if trust.approvals().of_proposal(name).next().is_some() {
        State::Stale
    } else {
        State::Open
    })
}

/// Every proposal (branches `proposals/*`), by name. A proposal is approved when an
/// approval of its tree counts by the allowed-signers list of its base ([`Trust`]).
pub fn list(repo: &Repository, rule: &ApprovalRule) -> Result<Vec<Proposal>, ReviewError> {
    list_with(repo, rule, None)
}

/// [`list`], with the proposals of `remote` too (its remote-tracking branches
/// `refs/remotes/<remote>/proposals/*`, as last fetched): one judged at this clone's
/// head when it has the branch, else at the remote's, with where the two stand.
pub fn list_with(repo: &Repository, rule: &ApprovalRule, remote: Option<&str>) -> Result<Vec<Proposal>, ReviewError> {
    let mut trust = Trust::new(repo, rule.clone())?;
    let mut names = std::collections::BTreeSet::new();
    for b in repo.branches(Some(BranchType::Local))? {
        let (b, _) = b?;
        if let Some(name) = b.name()?.and_then(|n| n.strip_prefix(PROPOSAL_PREFIX)) {
            names.insert(name.to_string());
        }
    }
    if let Some(r) = remote {
        let prefix = format!("refs/remotes/{r}/{PROPOSAL_PREFIX}");
        for reference in repo.references_glob(&format!("{prefix}*"))? {
            if let Some(name) = reference?.name().ok().and_then(|n| n.strip_prefix(&prefix)) {
                names.insert(name.to_string());
            }
        }
    }
    let mut out = Vec::new();
    for name in names {
        let h = heads(repo, &name, remote)?;
        let Some(head_id) = h.local.or(h.remote) else {
            continue;
        };
        let head = repo.find_commit(head_id)?;
        let tree = builder_tree_of(repo, &head.tree()?)?;
        let state = state_of(repo, &mut trust, &name, head.id())?;
        let commits = proposal_commits(repo, head.id())?;
        let commits = if commits.is_empty() {
            vec![head.clone()]
        } else {
            commits
        };
        let r = remote.unwrap_or("origin");
        let remote_note = match remote.map(|_| standing(repo, h)).transpose()? {
            None | Some(Standing::Same) => None,
            Some(Standing::LocalOnly) => Some("not pushed".to_string()),
            Some(Standing::RemoteOnly) => Some(format!("only on {r}")),
            Some(Standing::Ahead) => Some(format!("ahead of {r} (not pushed)")),
            Some(Standing::Behind) => Some(format!("behind {r}")),
            Some(Standing::Diverged) => Some(format!("diverged from {r}")),
        };
        out.push(Proposal {
            name,
            state,
            authors: authors_of(&commits).iter().map(|p| p.to_string()).collect(),
            head: head.id().to_string(),
            tree: tree.to_string(),
            remote: remote_note,
        });
    }
    Ok(out)
}

/// Who approves: the person, the rule their approval must satisfy (the protected
/// branch's), and the key it is signed with.
#[derive(Clone, Copy)]
pub struct Reviewer<'a> {
    pub person: &'a Person,
    pub rule: &'a ApprovalRule,
    pub signing: Option<&'a Signing>,
}

/// What [`approve`] did.
#[derive(Debug, Clone)]
pub struct Approved {
    pub approval: Approval,
    /// False when this reviewer's approval of this tree was there already (a second
    /// run, or a run after one that was killed): nothing new was written.
    pub recorded: bool,
}

/// Records `reviewer`'s approval of the proposal's current builder tree, signed with
/// `signing` when given. Refused for an author of the proposal, the runtime identity,
/// a merged proposal, and an approval that `rule` would not count (unsigned, or
/// signed by a key the allowed-signers file does not list for `reviewer`).
///
/// With `remote`, the remote's proposal branch (as last fetched) is seen too: a
/// proposal only the remote has is approved at its head, and this clone's branch is
/// refused when it is behind the remote's or diverged from it. An approval by the same
/// reviewer of the same tree that counts already is returned as it is, not written
/// again. With `seen`, a proposal at another head than the one the reviewer saw is
/// refused ([`super::reviewed`]).
pub fn approve(
    repo: &Repository,
    name: &str,
    who: &Reviewer<'_>,
    remote: Option<&str>,
    seen: Option<&super::reviewed::Seen>,
) -> Result<Approved, ReviewError> {
    let Reviewer {
        person: reviewer,
        rule,
        signing,
    } = *who;
    valid_name(name)?;
    let head = head_to_approve(repo, name, remote)?;
    if let Some(seen) = seen {
        seen.hold(name, head)?;
    }
    if same_person(&reviewer.email, &rule.runtime_email) {
        return Err(ReviewError::Refused(format!(
            "{reviewer} is the runtime identity (settings runtime_identity): the runtime can neither propose nor approve"
        )));
    }
    if is_merged(repo, head)? {
        return Err(ReviewError::Refused(format!(
            "proposal `{name}` is merged already: nothing to approve"
        )));
    }
    refuse_a_writer(&proposal_commits(repo, head)?, name, reviewer)?;
    if rule.signers.is_some() && signing.is_none() {
        return Err(ReviewError::Refused(
            "signed approvals are required (settings review.require_signed) and no signing key is configured: set git's `gpg.format ssh` and `user.signingkey`, or pass --key <private key>".into(),
        ));
    }
    let head_tree = repo.find_commit(head)?.tree()?;
    // A link the kernel would follow out of the builder-owned paths is never approved
    // (checked at the head being approved, the remote's when only it has the branch).
    let refused = super::links::refused_in_tree(repo, &head_tree).map_err(|e| ReviewError::Refused(e.to_string()))?;
    super::links::refusal("approve", &format!("{PROPOSAL_PREFIX}{name}'s"), &refused)?;
    let tree = builder_tree_of(repo, &head_tree)?;
    let mut trust = Trust::new(repo, rule.clone())?;
    let base = base_of(repo, head)?;
    let mine = trust
        .approvals()
        .naming(tree)
        .map(|(_, a)| a.clone())
        .filter(|a| a.body.proposal == name && same_person(&a.approver_email(), &reviewer.email))
        .collect::<Vec<_>>();
    for a in mine {
        if trust.would_count(&a.body, base, head)?.is_ok() {
            return Ok(Approved {
                approval: a,
                recorded: false,
            });
        }
    }
    let body = approvals::signed_body(name, tree, head, reviewer, signing)?;
    // An approval the rule would not count (a key the base's allowed-signers list does
    // not name for this reviewer) is refused before anything is written.
    trust
        .would_count(&body, base, head)?
        .map_err(|why| ReviewError::Refused(format!("this approval would not count, so it was not recorded: {why}")))?;
    Ok(Approved {
        approval: approvals::write(repo, body, reviewer)?,
        recorded: true,
    })
}

/// What `merge` did.
#[derive(Debug)]
pub struct Merged {
    pub commit: Oid,
    pub approval: Approval,
    /// Card ids from the proposal's `Fixes-card:` trailers.
    pub fixes: Vec<String>,
    /// The proposal was merged already (a second run): nothing was done.
    pub already: bool,
}

/// Refuses proposal `name` (head `prop`) when it changes, from `base`, paths outside
/// the builder-owned ones: an approval names the builder tree alone, so a merge or a
/// land under it would bring in what no one approved ([`super::unowned_changes`]).
pub(super) fn refuse_unowned(repo: &Repository, name: &str, base: Oid, prop: Oid) -> Result<(), ReviewError> {
    let unowned = super::unowned_changes(repo, base, prop)?;
    if unowned.is_empty() {
        return Ok(());
    }
    Err(ReviewError::Refused(format!(
        "proposal `{name}` also changes {} path(s) outside the builder-owned ones, which no approval covers: {}; bring those in through your ordinary code review, and keep the proposal to builder-owned paths",
        unowned.len(),
        unowned.iter().map(|p| crate::text::printable(p)).collect::<Vec<_>>().join(", ")
    )))
}

/// Merges the approved proposal `name` into the current branch: always a merge commit
/// (two parents), by `actor`, whose builder tree is exactly the approved one, and
/// which brings in no change outside the builder-owned paths.
pub fn merge(
    repo: &Repository,
    ownership: &Ownership,
    name: &str,
    actor: &Person,
    rule: &ApprovalRule,
) -> Result<Merged, ReviewError> {
    valid_name(name)?;
    let prop = proposal_head(repo, name, None)?;
    if same_person(&actor.email, &rule.runtime_email) {
        return Err(ReviewError::Refused(format!(
            "{actor} is the runtime identity: the runtime never commits builder-owned paths"
        )));
    }
    let head_ref = repo.head()?;
    if !head_ref.is_branch() {
        return Err(ReviewError::Usage(
            "HEAD is detached: check out the branch to merge into".into(),
        ));
    }
    let base = head_commit(repo)?;
    if is_merged(repo, prop)? {
        return merged_already(repo, rule, name, prop, base.id());
    }
    let prop_commit = repo.find_commit(prop)?;
    refuse_dirty_before_merge(repo, ownership, &prop_commit)?;
    let tree = builder_tree_of(repo, &prop_commit.tree()?)?;
    let approval = approval_to_merge(repo, rule, name, prop, tree)?;
    let from = match repo.merge_base(base.id(), prop) {
        Ok(b) => b,
        Err(e) if e.code() == git2::ErrorCode::NotFound => base.id(),
        Err(e) => return Err(e.into()),
    };
    refuse_unowned(repo, name, from, prop)?;
    let mut index = repo.merge_commits(&base, &prop_commit, None)?;
    if index.has_conflicts() {
        return Err(ReviewError::Refused(format!(
            "proposal `{name}` conflicts with {}: update the proposal on the current branch and have it approved again",
            head_ref.shorthand().unwrap_or("HEAD")
        )));
    }
    let merged_tree = repo.find_tree(index.write_tree_to(repo)?)?;
    let merged_builder = builder_tree_of(repo, &merged_tree)?;
    if merged_builder != tree {
        return Err(ReviewError::Refused(format!(
            "the merge would produce builder tree {merged_builder}, not the approved {tree}: builder-owned paths changed on {} since the proposal was made; update the proposal and have it approved again",
            head_ref.shorthand().unwrap_or("HEAD")
        )));
    }
    let fixes = fixes_of(&proposal_commits(repo, prop)?);
    let summary = prop_commit.summary().ok().flatten().unwrap_or("").to_string();
    let mut message = format!(
        "Merge proposal {name}\n\n{summary}\n\nReviewed-by: {}\nApproved-tree: {tree}\n",
        approval.body.approver
    );
    for f in &fixes {
        message.push_str(&format!("{FIXES_CARD} {f}\n"));
    }
    let sig = Signature::now(&actor.name, &actor.email)?;
    let commit = repo.commit(None, &sig, &sig, &message, &merged_tree, &[&base, &prop_commit])?;
    let branch = head_ref.name().unwrap_or("HEAD").to_string();
    super::work::move_checked_out(repo, &branch, base.id(), commit, super::work::Mover::Merge)?;
    Ok(Merged {
        commit,
        approval,
        fixes,
        already: false,
    })
}

/// Refuses a merge while builder-owned paths have uncommitted changes: owned by the
/// branch's settings (`ownership`) or by the proposal's, which the merge brings. An
/// edit left in either is an unreviewed change once merged.
fn refuse_dirty_before_merge(
    repo: &Repository,
    ownership: &Ownership,
    prop: &git2::Commit<'_>,
) -> Result<(), ReviewError> {
    let theirs = OwnedPaths::of_tree(repo, &prop.tree()?)?;
    let dirty = crate::git::dirty_paths_where(repo, ownership.has_extra_builder_paths() || theirs.has_extras(), |p| {
        ownership.classify(p) == Owner::Builder || theirs.is_builder(p)
    })?;
    if dirty.is_empty() {
        return Ok(());
    }
    Err(ReviewError::Refused(format!(
        "builder-owned paths have uncommitted changes: {} (propose or discard them first)",
        dirty.join(", ")
    )))
}

/// A second `merge` of proposal `name` (or one after a run killed once the branch
/// moved, now at `base`): done, when an approval of it counts.
fn merged_already(
    repo: &Repository,
    rule: &ApprovalRule,
    name: &str,
    prop: Oid,
    base: Oid,
) -> Result<Merged, ReviewError> {
    let mut trust = Trust::new(repo, rule.clone())?;
    if let Some(approval) = trust.proposal(prop, prop)?.approval {
        return Ok(Merged {
            commit: base,
            approval,
            fixes: Vec::new(),
            already: true,
        });
    }
    Err(ReviewError::Refused(format!("proposal `{name}` is merged already")))
}

/// The approval under `rule` that lets proposal `name` (head `prop`, builder tree
/// `tree`) merge; else the refusal, saying whether approvals were rejected, stale or
/// missing.
fn approval_to_merge(
    repo: &Repository,
    rule: &ApprovalRule,
    name: &str,
    prop: Oid,
    tree: Oid,
) -> Result<Approval, ReviewError> {
    let base = base_of(repo, prop)?;
    approval_that_counts(repo, rule, ProposalAt { name, base, prop, tree }, "merge")
}

/// A proposal as judged for merging or landing: its name, the base it is judged
/// against, its head and its builder tree.
pub(crate) struct ProposalAt<'a> {
    pub name: &'a str,
    pub base: Oid,
    pub prop: Oid,
    pub tree: Oid,
}

/// The approval under `rule` that counts for the proposal `at`; else the refusal to
/// `verb` it (`merge`, `land`), saying whether approvals were rejected, stale or
/// missing.
pub(crate) fn approval_that_counts(
    repo: &Repository,
    rule: &ApprovalRule,
    at: ProposalAt,
    verb: &str,
) -> Result<Approval, ReviewError> {
    let ProposalAt { name, base, prop, tree } = at;
    let mut trust = Trust::new(repo, rule.clone())?;
    let judged = trust.proposal(base, prop)?;
    if let Some(approval) = judged.approval.clone() {
        return Ok(approval);
    }
    let why = if !judged.rejected.is_empty() {
        format!(
            "no approval of it counts ({}; {})",
            judged.rejected.join("; "),
            judged.judged_by(rule)
        )
    } else if trust.approvals().of_proposal(name).next().is_some() {
        "its approval is stale: the proposal changed after it was approved".to_string()
    } else {
        "it has no approval".to_string()
    };
    Err(ReviewError::Refused(format!(
        "refusing to {verb} proposal `{name}`: {why} (builder tree {tree})"
    )))
}

/// The head of proposal `name` to land: as for an approval, this clone's branch only
/// when it is not behind or diverged from `remote`'s.
pub fn head_for_landing(repo: &Repository, name: &str, remote: &str) -> Result<Oid, ReviewError> {
    valid_name(name)?;
    head_to_approve(repo, name, Some(remote))
}

/// The cards named in `Fixes-card:` trailers of the proposal's commits from `head`
/// back to where it meets `onto`, oldest first.
pub fn fixes_of_proposal(repo: &Repository, head: Oid, onto: Oid) -> Result<Vec<String>, ReviewError> {
    let mut walk = repo.revwalk()?;
    walk.push(head)?;
    walk.hide(onto)?;
    let mut commits = Vec::new();
    for oid in walk {
        commits.push(repo.find_commit(oid?)?);
    }
    Ok(fixes_of(&commits))
}

/// The cards the proposal's commits name in `Fixes-card:` trailers, oldest first.
fn fixes_of(commits: &[git2::Commit]) -> Vec<String> {
    let mut fixes: Vec<String> = Vec::new();
    for c in commits.iter().rev() {
        for line in c.message().unwrap_or("").lines() {
            if let Some(id) = line.strip_prefix(FIXES_CARD) {
                let id = id.trim().to_string();
                if !id.is_empty() && !fixes.contains(&id) {
                    fixes.push(id);
                }
            }
        }
    }
    fixes
}

/// A proposal as `builder review` sees it: its head, the base it is compared with
/// (where it meets the protected branch, [`super::base::trusted_base`], whatever is
/// checked out) and the cards it says it fixes.
#[derive(Debug, Clone)]
pub struct UnderReview {
    pub head: Oid,
    pub base: Oid,
    pub fixes: Vec<String>,
}

/// The proposal `name`, for review.
pub fn under_review(repo: &Repository, name: &str) -> Result<UnderReview, ReviewError> {
    valid_name(name)?;
    let head = proposal_head(repo, name, None)?;
    let (base, _) = super::base::trusted_base(repo, head)?;
    Ok(UnderReview {
        head,
        base,
        fixes: fixes_of(&proposal_commits(repo, head)?),
    })
}
