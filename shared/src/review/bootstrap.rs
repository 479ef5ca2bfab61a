//! The first approval (issue 17 item 4): the first tree with `require_reviewed: true`
//! needs an approval itself, or an unapproved change that switches review off again
//! would never be judged. When review is turned on through a proposal, that proposal's
//! approval is the first. When it was turned on by a direct commit (or `builder init`
//! scaffolded it), `builder approve --bootstrap` approves HEAD's builder tree as it
//! is: a second person vouches for the whole tree, trust on first use, as SSH trusts a
//! host key the first time. It is refused once any approval exists (from then on every
//! change goes through a proposal), for the runtime identity, and for the author of
//! the commit that turned review on.

use super::approvals::{self, Approval, Signing};
use super::signing::ApprovalRule;
use super::trust::Trust;
use super::{builder_tree_of_commit, same_person, ReviewError};
use crate::git::Person;
use git2::{Oid, Repository};

/// The proposal name a bootstrap approval records.
pub const BOOTSTRAP: &str = "bootstrap";

/// The nearest first-parent ancestor of `head` (itself included) whose settings turned
/// `require_reviewed` on (its first parent's did not say it, or it has none).
fn turned_on(repo: &Repository, head: Oid) -> Result<Option<Oid>, git2::Error> {
    let mut at = head;
    loop {
        let commit = repo.find_commit(at)?;
        if !super::review_flags_of_commit(repo, at)?.0 {
            return Ok(None);
        }
        match commit.parent_ids().next() {
            Some(p) if super::review_flags_of_commit(repo, p)?.0 => at = p,
            _ => return Ok(Some(at)),
        }
    }
}

/// Approves HEAD's builder tree as the first approval of the repository, by
/// `approver`, signed with `signing` when given; refused (nothing written) when HEAD's
/// settings do not say `require_reviewed: true`, when any approval exists, for the
/// runtime identity, for the author of the commit that turned review on, and when the
/// approval would not count under `rule` (judged by HEAD's own allowed-signers list).
pub fn approve_head(
    repo: &Repository,
    approver: &Person,
    rule: &ApprovalRule,
    signing: Option<&Signing>,
) -> Result<Approval, ReviewError> {
    let head = repo.head()?.peel_to_commit()?.id();
    if same_person(&approver.email, &rule.runtime_email) {
        return Err(ReviewError::Refused(format!(
            "{approver} is the runtime identity (settings runtime_identity): the runtime cannot approve"
        )));
    }
    let Some(on) = turned_on(repo, head)? else {
        return Err(ReviewError::Refused(
            "HEAD's settings do not say `require_reviewed: true`: a bootstrap approval is the first approval under review; turn review on first (through a proposal, which is then the first approval)".into(),
        ));
    };
    let existing = approvals::Approvals::read(repo)?.trees().len();
    if existing > 0 {
        return Err(ReviewError::Refused(format!(
            "the repository has approvals already (of {existing} tree(s)): from the first approval on, every change goes through `builder propose` and `builder approve <name>`"
        )));
    }
    let on_commit = repo.find_commit(on)?;
    let author = on_commit.author();
    let author_email = author.email().unwrap_or("");
    if same_person(author_email, &approver.email) {
        return Err(ReviewError::Refused(format!(
            "{approver} turned require_reviewed on (commit {}): someone else approves the first tree",
            crate::text::short_oid(on)
        )));
    }
    if rule.signers.is_some() && signing.is_none() {
        return Err(ReviewError::Refused(
            "signed approvals are required (settings review.require_signed) and no signing key is configured: set git's `gpg.format ssh` and `user.signingkey`, or pass --key <private key>".into(),
        ));
    }
    let tree = builder_tree_of_commit(repo, head)?;
    let refused = super::links::refused_in_tree(repo, &repo.find_commit(head)?.tree()?)
        .map_err(|e| ReviewError::Refused(e.to_string()))?;
    if !refused.is_empty() {
        return Err(ReviewError::Refused(format!(
            "HEAD's builder-owned paths hold links that are never approved:{}",
            super::links::listed(&refused)
        )));
    }
    let body = approvals::signed_body(BOOTSTRAP, tree, head, approver, signing)?;
    Trust::new(repo, rule.clone())?
        .would_count(&body, head, head)?
        .map_err(|why| ReviewError::Refused(format!("this approval would not count, so it was not recorded: {why}")))?;
    approvals::write(repo, body, approver)
}
