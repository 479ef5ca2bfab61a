//! Review steps that publish, each one command for a person to type:
//! `builder approve --push` ([`approve_and_publish`]: fetch, record, publish) and
//! `builder land <name>` ([`land`]: fetch, merge the approved proposal onto the
//! remote's current tip of the protected branch, push, and when the remote moved
//! meanwhile (the cron box pushed records) fetch and merge onto the new tip again:
//! never a rebase, so the approved merge is pushed as it was made). Both are library
//! functions so other front ends (a web page) call the same steps.

use super::proposals::{self, Approved, Reviewer};
use super::remote::{self, Pushed, PUSH_TRIES};
use super::reviewed::{Seen, SeenFrom};
use super::signing::ApprovalRule;
use super::{builder_tree_of, ReviewError};
use crate::git::Person;
use git2::{Oid, Repository, Signature};
use std::path::Path;

/// What [`approve_and_publish`] did.
#[derive(Debug)]
pub struct Published {
    pub approved: Approved,
    /// Approvals pushed (this one, and any other this clone had that the remote
    /// lacked: a forced push there, or approvals not pushed before).
    pub pushed: usize,
}

/// `builder approve --push`: fetches `remote` (its proposal branches and approvals),
/// records the approval ([`proposals::approve`], which refuses a local branch behind
/// or diverged from the remote's, and a head other than the one `seen`, by default
/// the one this clone had before the fetch, if it had one), and pushes every approval
/// the remote lacks, retrying when another push held the remote's refs.
pub fn approve_and_publish(
    repo: &Repository,
    root: &Path,
    name: &str,
    who: &Reviewer<'_>,
    remote: &str,
    seen: Option<Seen>,
) -> Result<Published, ReviewError> {
    // What the reviewer saw, when nothing says: the head this clone had before the
    // fetch (the fetch may bring one the author force-pushed since the review).
    let before = proposals::proposal_head(repo, name, Some(remote)).ok();
    remote::fetch(root, remote)?;
    crate::failpoint!("approve-after-fetch");
    let seen = seen.or(before.map(|head| Seen {
        head,
        from: SeenFrom::BeforeFetch,
    }));
    let approved = proposals::approve(repo, name, who, Some(remote), seen.as_ref())?;
    crate::failpoint!("approve-before-push");
    let pushed = remote::publish_approvals(repo, root, remote)?;
    crate::failpoint!("approve-after-push");
    Ok(Published { approved, pushed })
}

/// How this clone's copy of the protected branch was brought along after a land.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LocalBranch {
    /// Checked out, and moved to the landed merge (work tree included).
    FastForwarded,
    /// Not checked out: the branch ref moved to the landed merge.
    Moved,
    /// At the landed merge already.
    Unchanged,
    /// It has commits the remote lacks: left as it is (`git pull` merges them).
    Diverged,
    /// This clone has no such branch.
    Absent,
}

/// What [`land`] did.
#[derive(Debug)]
pub struct Landed {
    /// The merge commit now on the remote (or, when the remote had the proposal
    /// already, the remote's tip).
    pub commit: Oid,
    /// The remote's tip it was merged onto.
    pub onto: Oid,
    /// Pushes tried (more than one when the remote moved meanwhile).
    pub tries: u32,
    /// The remote had the proposal already (a second run): nothing was pushed.
    pub already: bool,
    pub approval: Option<super::approvals::Approval>,
    /// Card ids from the proposal's `Fixes-card:` trailers.
    pub fixes: Vec<String>,
    pub local: LocalBranch,
    /// Approvals pushed along (the remote lacked them).
    pub approvals_pushed: usize,
}

/// `builder land <name>`: see the module doc. `branch` is the protected branch (no
/// `refs/heads/`).
pub fn land(
    repo: &Repository,
    root: &Path,
    name: &str,
    actor: &Person,
    rule: &ApprovalRule,
    remote: &str,
    branch: &str,
) -> Result<Landed, ReviewError> {
    if super::same_person(&actor.email, &rule.runtime_email) {
        return Err(ReviewError::Refused(format!(
            "{actor} is the runtime identity: the runtime never lands builder changes"
        )));
    }
    let tracking = remote::tracking_ref(remote, branch);
    let mut approvals_pushed = 0;
    for attempt in 1..=PUSH_TRIES {
        remote::fetch(root, remote)?;
        crate::failpoint!("land-after-fetch");
        let tip = repo.refname_to_id(&tracking).map_err(|_| {
            ReviewError::Usage(format!(
                "{remote} has no branch {branch} (the protected branch: settings sync.branch, else the remote's default branch)"
            ))
        })?;
        let prop = proposals::head_for_landing(repo, name, remote)?;
        if tip == prop || repo.graph_descendant_of(tip, prop)? {
            let local = bring_local_along(repo, branch, tip)?;
            return Ok(Landed {
                commit: tip,
                onto: tip,
                tries: attempt - 1,
                already: true,
                approval: None,
                fixes: Vec::new(),
                local,
                approvals_pushed,
            });
        }
        let merge = merge_onto(repo, name, actor, rule, tip, prop)?;
        // The remote gets the approval before the branch that needs it.
        approvals_pushed += remote::publish_approvals(repo, root, remote)?;
        crate::failpoint!("land-before-push");
        match remote::push(root, remote, &[format!("{}:refs/heads/{branch}", merge.commit)])? {
            Pushed::Done => {}
            Pushed::Moved(why) => {
                tracing::info!(attempt, why, "the remote moved: merging onto its new tip");
                continue;
            }
        }
        crate::failpoint!("land-after-push");
        // The push moved the remote-tracking ref only through the fetch refspec; set it.
        super::work::write_ref(repo, &tracking, merge.commit, None, "builder land: pushed")?;
        let local = bring_local_along(repo, branch, merge.commit)?;
        return Ok(Landed {
            commit: merge.commit,
            onto: tip,
            tries: attempt,
            already: false,
            approval: Some(merge.approval),
            fixes: merge.fixes,
            local,
            approvals_pushed,
        });
    }
    Err(ReviewError::Refused(format!(
        "{remote}/{branch} moved on each of {PUSH_TRIES} tries: nothing was pushed; run `builder land {name}` again"
    )))
}

struct MergeCommit {
    commit: Oid,
    approval: super::approvals::Approval,
    fixes: Vec<String>,
}

/// The merge commit of proposal head `prop` onto the remote's `tip` (first parent),
/// written but on no branch. Refused when no approval of the proposal counts, when it
/// changes paths outside the builder-owned ones (no approval covers them), when it
/// conflicts, and when the merged builder tree is not the approved one (the tip moved
/// with builder changes the proposal does not hold).
fn merge_onto(
    repo: &Repository,
    name: &str,
    actor: &Person,
    rule: &ApprovalRule,
    tip: Oid,
    prop: Oid,
) -> Result<MergeCommit, ReviewError> {
    let prop_commit = repo.find_commit(prop)?;
    let tip_commit = repo.find_commit(tip)?;
    let tree = builder_tree_of(repo, &prop_commit.tree()?)?;
    let base = match repo.merge_base(tip, prop) {
        Ok(b) => b,
        Err(e) if e.code() == git2::ErrorCode::NotFound => tip,
        Err(e) => return Err(e.into()),
    };
    let approval = super::proposals::approval_that_counts(
        repo,
        rule,
        super::proposals::ProposalAt { name, base, prop, tree },
        "land",
    )?;
    proposals::refuse_unowned(repo, name, base, prop)?;
    let mut index = repo.merge_commits(&tip_commit, &prop_commit, None)?;
    if index.has_conflicts() {
        return Err(ReviewError::Refused(format!(
            "proposal `{name}` conflicts with the remote's tip {}: update the proposal on it and have it approved again",
            crate::text::short_oid(tip)
        )));
    }
    let merged_tree = repo.find_tree(index.write_tree_to(repo)?)?;
    let merged_builder = builder_tree_of(repo, &merged_tree)?;
    if merged_builder != tree {
        return Err(ReviewError::Refused(format!(
            "landing would produce builder tree {merged_builder}, not the approved {tree}: the remote's branch changed builder-owned paths since the proposal was made ({}); update the proposal on it and have it approved again",
            crate::text::short_oid(tip)
        )));
    }
    let fixes = proposals::fixes_of_proposal(repo, prop, tip)?;
    let summary = prop_commit.summary().ok().flatten().unwrap_or("").to_string();
    let mut message = format!(
        "Merge proposal {name}\n\n{summary}\n\nReviewed-by: {}\nApproved-tree: {tree}\n",
        approval.body.approver
    );
    for f in &fixes {
        message.push_str(&format!("{} {f}\n", proposals::FIXES_CARD));
    }
    let sig = Signature::now(&actor.name, &actor.email)?;
    let commit = repo.commit(None, &sig, &sig, &message, &merged_tree, &[&tip_commit, &prop_commit])?;
    Ok(MergeCommit {
        commit,
        approval,
        fixes,
    })
}

/// Brings this clone's `branch` to `to` when that is a fast-forward: the work tree
/// too when it is checked out ([`super::work::move_checked_out`]).
fn bring_local_along(repo: &Repository, branch: &str, to: Oid) -> Result<LocalBranch, ReviewError> {
    let full = format!("refs/heads/{branch}");
    let Ok(at) = repo.refname_to_id(&full) else {
        return Ok(LocalBranch::Absent);
    };
    if at == to {
        return Ok(LocalBranch::Unchanged);
    }
    if !repo.graph_descendant_of(to, at)? {
        return Ok(LocalBranch::Diverged);
    }
    let checked_out = repo
        .head()
        .ok()
        .and_then(|h| h.name().ok().map(str::to_string))
        .as_deref()
        == Some(full.as_str());
    if checked_out {
        super::work::move_checked_out(repo, &full, at, to, super::work::Mover::Land)?;
        Ok(LocalBranch::FastForwarded)
    } else {
        super::work::write_ref(repo, &full, to, Some(at), "builder land: fast-forward")?;
        Ok(LocalBranch::Moved)
    }
}
