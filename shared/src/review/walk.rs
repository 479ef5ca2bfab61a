//! The walk from a commit down to its nearest reviewed commit: the commit whose
//! settings judge a branch's approvals ([`super::base::protected_settings`]) and lend
//! an eval its powers ([`super::base::reviewed_ancestor`]). Along first parents while
//! commits owe review; at a merge that owes review, every parent's line is walked down
//! to its own reviewed commit and the one that holds the others is taken
//! ([`Walker::merge_line`]), so that no order of parents makes older or foreign rules
//! the judge: `git commit-tree <tree> -p <old or orphan commit> -p main` is a
//! fast-forward of `main` whose first line would lead down to rules the branch left
//! behind, or to a root with review off.
//!
//! A walk that reaches a root owing review found nothing reviewed ([`Found::Nothing`]:
//! a repository before its first approval); every other refusal (lines that disagree,
//! too many merges that owe review, a parent a shallow clone lacks) is an error the
//! caller must not read as "nothing reviewed". Each commit's line is walked once per
//! walk (remembered), and at most [`MERGE_BUDGET`] merges that owe review are looked
//! through, so no history makes the walk slow.

use super::trust::Trust;
use super::ReviewError;
use git2::{Commit, Oid, Repository};
use std::collections::HashMap;

/// How many merges that owe review one walk looks through before it refuses.
const MERGE_BUDGET: usize = 64;

/// The way from a commit down to its nearest reviewed ancestor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewedPath {
    /// The nearest ancestor that owes no review (the commit itself when it owes none).
    pub reviewed: Oid,
    /// The commits walked that owe review, newest first.
    pub owed: Vec<Oid>,
}

/// What a walk found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    Reviewed(ReviewedPath),
    /// A root owing review: nothing below was ever reviewed.
    Nothing,
}

/// The nearest commit from `base` down that owes no review under `trust`'s rule, and
/// the commits that owe it on the way.
pub fn reviewed_below(repo: &Repository, trust: &mut Trust<'_>, base: Oid) -> Result<Found, ReviewError> {
    Walker {
        repo,
        trust,
        lines: HashMap::new(),
        merges: 0,
    }
    .walk_down(base)
}

/// The refusal of a walk from `from` that found nothing reviewed.
pub fn nothing_reviewed(repo: &Repository, from: Oid) -> ReviewError {
    // A shallow clone's boundary commits read as roots.
    let shallow = match repo.is_shallow() {
        true => " (this clone is shallow: `git fetch --unshallow` fetches the whole history)",
        false => "",
    };
    ReviewError::Refused(format!(
        "no reviewed commit below {}: there is no trusted base to judge from{shallow}",
        crate::text::short_oid(from)
    ))
}

struct Walker<'a, 'r> {
    repo: &'a Repository,
    trust: &'a mut Trust<'r>,
    /// Each commit's line, once walked.
    lines: HashMap<Oid, Found>,
    merges: usize,
}

impl Walker<'_, '_> {
    fn walk_down(&mut self, from: Oid) -> Result<Found, ReviewError> {
        if let Some(found) = self.lines.get(&from) {
            return Ok(found.clone());
        }
        let found = self.walk_uncached(from)?;
        self.lines.insert(from, found.clone());
        Ok(found)
    }

    fn walk_uncached(&mut self, from: Oid) -> Result<Found, ReviewError> {
        let mut at = from;
        let mut owed = Vec::new();
        while self.trust.review_owed(at)? {
            owed.push(at);
            let commit = self.repo.find_commit(at)?;
            if commit.parent_count() > 1 {
                let Found::Reviewed(below) = self.merge_line(&commit)? else {
                    return Ok(Found::Nothing);
                };
                owed.extend(below.owed);
                let reviewed = below.reviewed;
                return Ok(Found::Reviewed(ReviewedPath { reviewed, owed }));
            }
            let Some(parent) = commit.parent_ids().next() else {
                return Ok(Found::Nothing);
            };
            at = parent;
        }
        Ok(Found::Reviewed(ReviewedPath { reviewed: at, owed }))
    }

    /// At `merge`, which owes review: each parent's line walked down to its reviewed
    /// commit, and the one taken that holds (is, or descends from) every other. Where
    /// none does, the same among those resting on an approval that counts (an
    /// unrelated line with review off, or an old tree put back, rests on none, or on
    /// one the branch's holds); where still none does, the first of those in parent
    /// order (each was approved). Where none rests on one, review is off on every line
    /// and the first line's judges. A parent's line with nothing reviewed below lends
    /// nothing; a parent this clone lacks (a shallow clone) is refused.
    fn merge_line(&mut self, merge: &Commit) -> Result<Found, ReviewError> {
        let at = merge.id();
        self.merges += 1;
        if self.merges > MERGE_BUDGET {
            return Err(ReviewError::Refused(format!(
                "{} sits over more than {MERGE_BUDGET} merges that owe review: there is no trusted base to judge from",
                crate::text::short_oid(at)
            )));
        }
        let mut lines = Vec::new();
        for parent in merge.parent_ids() {
            if self.repo.find_commit(parent).is_err() {
                return Err(ReviewError::Refused(format!(
                    "{} merges {}, which this clone does not have (a shallow clone): there is no trusted base to judge from; fetch the whole history",
                    crate::text::short_oid(at),
                    crate::text::short_oid(parent)
                )));
            }
            if let Found::Reviewed(line) = self.walk_down(parent)? {
                lines.push(line);
            }
        }
        if let Some(i) = holding_all(self.repo, &lines, &vec![true; lines.len()])? {
            return Ok(Found::Reviewed(lines.swap_remove(i)));
        }
        let mut approved = Vec::with_capacity(lines.len());
        for line in &lines {
            approved.push(self.trust.owed_review(line.reviewed)?.covered_at.is_some());
        }
        let pick = match holding_all(self.repo, &lines, &approved)? {
            Some(i) => Some(i),
            None => approved.iter().position(|a| *a),
        };
        Ok(match pick {
            Some(i) => Found::Reviewed(lines.swap_remove(i)),
            None => lines.into_iter().next().map_or(Found::Nothing, Found::Reviewed),
        })
    }
}

/// The first of `lines` (among those `among` marks) whose reviewed commit is, or
/// descends from, every other's among them.
fn holding_all(repo: &Repository, lines: &[ReviewedPath], among: &[bool]) -> Result<Option<usize>, git2::Error> {
    'lines: for (i, line) in lines.iter().enumerate().filter(|(i, _)| among[*i]) {
        for (_, other) in lines.iter().enumerate().filter(|(j, _)| *j != i && among[*j]) {
            if other.reviewed != line.reviewed && !repo.graph_descendant_of(line.reviewed, other.reviewed)? {
                continue 'lines;
            }
        }
        return Ok(Some(i));
    }
    Ok(None)
}
