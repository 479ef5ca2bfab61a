//! What a push is judged on: git gives a pre-push hook one line per ref it is about
//! to update (`<local ref> <local id> <remote ref> <remote id>`), and only the new
//! commits on the protected branch ([`crate::review::remote::protected_branch`]) are judged:
//! those reachable from the pushed id and from neither the remote's current id of
//! that branch nor its remote-tracking ref (commits the remote's branch already has
//! were judged when they arrived, or were pushed by someone past the hook: the next
//! push is not refused for them, and their revert is let through). A
//! proposal branch (unapproved by nature), approvals, other branches and deletions
//! are not judged. `builder audit --pre-push <remote>` (the hook) and
//! `builder audit --range OLD..NEW` (CI) both come here. It sits above both
//! `audit` and `review` (it uses each), so neither reaches up to it.

use crate::audit::{AuditReport, RuntimeIdentity};
use crate::layout::Ownership;
use crate::review::ReviewError;
use git2::{Oid, Repository};

/// One line of a pre-push hook's standard input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefUpdate {
    pub local_ref: String,
    pub local: Oid,
    pub remote_ref: String,
    /// The remote's id of `remote_ref` (zero when it does not exist there yet).
    pub remote: Oid,
}

/// Parses a pre-push hook's standard input.
pub fn parse_updates(input: &str) -> Result<Vec<RefUpdate>, ReviewError> {
    let mut out = Vec::new();
    for (n, line) in input.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let bad = || {
            ReviewError::Usage(format!(
                "pre-push input line {}: `{line}` is not `<local ref> <local id> <remote ref> <remote id>`",
                n + 1
            ))
        };
        let [local_ref, local, remote_ref, remote] = fields.as_slice() else {
            return Err(bad());
        };
        out.push(RefUpdate {
            local_ref: local_ref.to_string(),
            local: Oid::from_str(local).map_err(|_| bad())?,
            remote_ref: remote_ref.to_string(),
            remote: Oid::from_str(remote).map_err(|_| bad())?,
        });
    }
    Ok(out)
}

/// The verdict on one pushed ref.
#[derive(Debug)]
pub struct Judged {
    pub remote_ref: String,
    pub report: AuditReport,
}

/// What is judged and how: the repository's paths and identities and the approval
/// rule in force.
pub struct Judge<'a> {
    pub repo: &'a Repository,
    pub ownership: &'a Ownership,
    pub runtime: &'a RuntimeIdentity,
    pub rule: &'a crate::review::signing::ApprovalRule,
}

impl Judge<'_> {
    /// Judges the updates of a push to `remote` whose protected branch is
    /// `protected`: one verdict per update of that branch (none for the others).
    pub fn push(&self, remote: &str, protected: &str, updates: &[RefUpdate]) -> Result<Vec<Judged>, ReviewError> {
        let target = format!("refs/heads/{protected}");
        let mut out = Vec::new();
        for u in updates {
            if u.remote_ref != target || u.local.is_zero() {
                continue;
            }
            // Only the branch's own history counts as the remote's: the remote's
            // proposal branches hold unapproved commits, which a fast-forward of the
            // branch onto one must not pass for known.
            let mut known: Vec<Oid> = self
                .repo
                .refname_to_id(&crate::review::remote::tracking_ref(remote, protected))
                .into_iter()
                .collect();
            if !u.remote.is_zero() {
                known.push(u.remote);
            }
            out.push(Judged {
                remote_ref: u.remote_ref.clone(),
                report: self.range(u.local, &known)?,
            });
        }
        Ok(out)
    }

    /// Audits the commits reachable from `tip` and from none of `known`, under the
    /// rule in force at `tip` (an unapproved commit that turned signatures off is
    /// judged under them).
    pub fn range(&self, tip: Oid, known: &[Oid]) -> Result<AuditReport, ReviewError> {
        let rule = crate::review::trust::Trust::rule_in_force(self.repo, tip, self.rule.clone(), None)?;
        Ok(crate::audit::audit_range(
            self.repo,
            self.ownership,
            self.runtime,
            &rule,
            tip,
            known,
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pre_push_input_is_parsed_and_a_bad_line_named() {
        let z = "0".repeat(40);
        let a = "a".repeat(40);
        let input = format!("refs/heads/main {a} refs/heads/main {z}\n\n(delete) {z} refs/heads/x {a}\n");
        let got = parse_updates(&input).unwrap();
        assert_eq!(got.len(), 2);
        assert!(got[0].remote.is_zero() && got[1].local.is_zero());
        let err = parse_updates("refs/heads/main xyz").unwrap_err().to_string();
        assert!(err.contains("line 1") && err.contains("xyz"), "{err}");
    }
}
