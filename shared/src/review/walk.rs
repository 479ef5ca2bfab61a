//! The walk from a commit down to its nearest reviewed commit: the commit whose
//! settings judge a branch's approvals ([`super::base::protected_settings`]) and lend
//! an eval its powers ([`super::base::reviewed_ancestor`]). Along first parents while
//! commits owe review; at a merge that owes review, every parent's line is walked down
//! to its own reviewed commit and the one that holds all the others is taken
//! ([`merge_line`]), so that no order of parents makes older or foreign rules the
//! judge: `git commit-tree <tree> -p <old or orphan commit> -p main` is a fast-forward
//! of `main` whose first line would lead down to rules the branch left behind, or to
//! a root with review off.

use super::trust::Trust;
use super::ReviewError;
use git2::{Commit, Oid, Repository};

/// How many merges that owe review, one inside another's line, the walk looks through.
const MERGE_DEPTH: usize = 8;

/// The way from a commit down to its nearest reviewed ancestor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewedPath {
    /// The nearest ancestor that owes no review (the commit itself when it owes none).
    pub reviewed: Oid,
    /// The commits walked that owe review, newest first.
    pub owed: Vec<Oid>,
}

/// The nearest commit from `base` down that owes no review under `trust`'s rule, and
/// the commits that owe it on the way.
pub fn reviewed_below(repo: &Repository, trust: &mut Trust<'_>, base: Oid) -> Result<ReviewedPath, ReviewError> {
    walk_down(repo, trust, base, MERGE_DEPTH)
}

fn walk_down(repo: &Repository, trust: &mut Trust<'_>, from: Oid, depth: usize) -> Result<ReviewedPath, ReviewError> {
    let mut at = from;
    let mut owed = Vec::new();
    while trust.review_owed(at)? || switched_off_over_review(repo, trust, at, depth)? {
        owed.push(at);
        let commit = repo.find_commit(at)?;
        if commit.parent_count() > 1 {
            let below = merge_line(repo, trust, &commit, depth)?;
            owed.extend(below.owed);
            return Ok(ReviewedPath {
                reviewed: below.reviewed,
                owed,
            });
        }
        at = commit.parent_ids().next().ok_or_else(|| nothing_reviewed(repo, from))?;
    }
    Ok(ReviewedPath { reviewed: at, owed })
}

/// Whether `at`, which owes no review by its own history, is a merge whose settings
/// turn review off over a later parent whose line judged under review (its reviewed
/// commit asks review): a switch-off no approval gave, brought in by a merge whose
/// first line never asked review (a commit on the root, or such a merge stacked on an
/// earlier one, whose later parent is itself unreviewed and so lends the merge no
/// reviewed tree to have replaced). The walk treats it as owing review. Past
/// [`MERGE_DEPTH`] nested merges it is taken as owing (the walk then refuses).
fn switched_off_over_review(
    repo: &Repository,
    trust: &mut Trust<'_>,
    at: Oid,
    depth: usize,
) -> Result<bool, ReviewError> {
    let commit = repo.find_commit(at)?;
    if commit.parent_count() < 2 || super::review_flags_of_commit(repo, at)?.0 {
        return Ok(false);
    }
    if depth == 0 {
        return Ok(true);
    }
    for parent in commit.parent_ids().skip(1) {
        if repo.find_commit(parent).is_err() {
            continue;
        }
        if let Ok(line) = walk_down(repo, trust, parent, depth - 1) {
            if super::review_flags_of_commit(repo, line.reviewed)?.0 {
                return Ok(true);
            }
        }
    }
    Ok(false)
}

/// At `merge`, which owes review: each parent's line walked down to its reviewed
/// commit, and the one taken that holds (is, or descends from) every other. Where none
/// does, the same among those whose builder tree rests on an approval that counts (an
/// unrelated line with review off, or an old tree put back, rests on none, or on an
/// older one the branch's holds). Where none of them rests on one, review is off on
/// every line and the first parent's judges; otherwise the lines disagree, and
/// nothing judges (refused). A parent's line with nothing reviewed below lends
/// nothing; a parent this clone lacks (a shallow clone) is refused.
fn merge_line(
    repo: &Repository,
    trust: &mut Trust<'_>,
    merge: &Commit,
    depth: usize,
) -> Result<ReviewedPath, ReviewError> {
    let at = merge.id();
    if depth == 0 {
        return Err(ReviewError::Refused(format!(
            "{} sits under more than {MERGE_DEPTH} merges that owe review: there is no trusted base to judge from",
            short(at)
        )));
    }
    let mut lines = Vec::new();
    for parent in merge.parent_ids() {
        if repo.find_commit(parent).is_err() {
            return Err(ReviewError::Refused(format!(
                "{} merges {}, which this clone does not have (a shallow clone): there is no trusted base to judge from; fetch the whole history",
                short(at),
                short(parent)
            )));
        }
        match walk_down(repo, trust, parent, depth - 1) {
            Ok(line) => lines.push(line),
            Err(ReviewError::Git(e)) => return Err(e.into()),
            Err(_) => {}
        }
    }
    if let Some(i) = holding_all(repo, &lines, &vec![true; lines.len()])? {
        return Ok(lines.swap_remove(i));
    }
    let mut approved = Vec::with_capacity(lines.len());
    for line in &lines {
        approved.push(trust.commit(line.reviewed)?.approval.is_some());
    }
    if !approved.contains(&true) {
        return lines.into_iter().next().ok_or_else(|| nothing_reviewed(repo, at));
    }
    match holding_all(repo, &lines, &approved)? {
        Some(i) => Ok(lines.swap_remove(i)),
        None => Err(ReviewError::Refused(format!(
            "{} joins lines whose reviewed commits ({}) hold none of each other: there is no trusted base to judge from",
            short(at),
            lines.iter().map(|l| short(l.reviewed)).collect::<Vec<_>>().join(", ")
        ))),
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

/// The refusal of a walk from `from` that reached a root owing review.
fn nothing_reviewed(repo: &Repository, from: Oid) -> ReviewError {
    // A shallow clone's boundary commits read as roots.
    let shallow = match repo.is_shallow() {
        true => " (this clone is shallow: `git fetch --unshallow` fetches the whole history)",
        false => "",
    };
    ReviewError::Refused(format!(
        "no reviewed commit below {}: there is no trusted base to judge from{shallow}",
        short(from)
    ))
}

fn short(id: Oid) -> String {
    id.to_string()[..12].to_string()
}
