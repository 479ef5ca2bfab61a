//! `builder audit`: the history check of the invariant (docs/design.md). Walks
//! git history and flags (a) commits by the runtime identity that touch anything but
//! new files in runtime-owned paths, (b) changes to builder-owned paths on the branch
//! (its first-parent chain) whose resulting tree of builder-owned paths no approval on
//! `refs/builder/approvals` names, (c) symlinks, gitlinks and mode-only changes in
//! runtime commits. Trailers prove nothing: only the tree counts. With signed
//! approvals from a list in the repository, whether an approval counts depends on the
//! commit (`review::trust`: the list of the last approved tree before it), so coverage
//! is judged per commit of the branch rather than per tree; a commit owes signatures
//! when its own settings or its parent's ask for them (so turning signing off is
//! judged under signatures). An unapproved change
//! is judged by the settings in that commit's own tree and its first parent's: a
//! warning before `require_reviewed` was turned on, a violation after (turning it off
//! included). A merge whose builder tree is
//! its first parent's brings no new builder tree (that parent was judged itself), and
//! a pulled-in approved change is covered by its approval; side-branch commits (a proposal's
//! intermediate steps) are judged at the merge that lands them. Renames are not
//! detected, so a move out of `prompts/` is a delete plus an add.

use crate::git::{ChangeKind, TreeChange, TreeDiffer};
use crate::layout::{Owner, Ownership, SETTINGS_FILE};
use crate::review::links::RefusedLink;
use crate::review::runtime_commits::{
    record_written_by_a_person, runtime_named, Authenticity, Floors, RuntimeSignatures,
};
use git2::{FileMode, Oid, Repository, Sort};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Violation,
    Warning,
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub commit: String,
    pub author: String,
    pub path: String,
    pub what: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
    pub commits: usize,
    pub runtime_commits: usize,
    /// Runtime-named commits with a valid runtime signature.
    pub runtime_signed: usize,
    /// Runtime-named commits whose settings name no `runtime_identity.signing_key`:
    /// anyone could have made them.
    pub runtime_unauthenticated: usize,
    pub findings: Vec<Finding>,
    /// Commits at a shallow clone's cut: their parents are not here, so what they
    /// changed is not known; only their builder tree is judged (they are not counted
    /// in `commits`).
    pub shallow_cut: usize,
    /// Modes, owners and hooks of the work tree that changed since the last accepted
    /// manifest ([`crate::manifest`]): each one a violation.
    pub metadata: Vec<crate::manifest::Change>,
}

impl AuditReport {
    pub fn violations(&self) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Violation)
            .count()
            + self.metadata.len()
    }
}

/// Who the runtime is in git history.
pub struct RuntimeIdentity {
    pub name: String,
    pub email: String,
}

/// Audits commits reachable from HEAD and not from `since` (all when `None`).
pub fn audit(
    repo: &Repository,
    ownership: &Ownership,
    runtime: &RuntimeIdentity,
    rule: &crate::review::signing::ApprovalRule,
    since: Option<Oid>,
) -> Result<AuditReport, git2::Error> {
    let Ok(Some(head)) = crate::git::head_commit(repo) else {
        return Ok(AuditReport::default());
    };
    audit_range(repo, ownership, runtime, rule, head, since.as_slice())
}

/// Audits the commits reachable from `tip` and from none of `known` (commits another
/// side has already: the remote's, for a push), `tip`'s first-parent chain being the
/// branch. A `known` commit this repository lacks is ignored.
pub fn audit_range(
    repo: &Repository,
    ownership: &Ownership,
    runtime: &RuntimeIdentity,
    rule: &crate::review::signing::ApprovalRule,
    tip: Oid,
    known: &[Oid],
) -> Result<AuditReport, git2::Error> {
    crate::git::tune_for_history_walks();
    let mut walk = repo.revwalk()?;
    walk.set_sorting(Sort::TOPOLOGICAL | Sort::REVERSE)?;
    walk.push(tip)?;
    for k in known {
        if repo.find_commit(*k).is_ok() {
            walk.hide(*k)?;
        }
    }
    let oids: Vec<Oid> = walk.collect::<Result<_, _>>()?;
    let review = review_context(repo, rule, tip, known, &oids)?;
    let review = &review;
    // A shallow clone's cut: commits whose parents this clone lacks read as roots,
    // which would "add" every file they hold. What they changed is not known here.
    let cut = shallow_cut(repo);
    let cut = &cut;
    // Commits are independent: audit them on every core, each thread with its own
    // repository handle, and merge the findings back in history order.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    let chunk = oids.len().div_ceil(threads).max(1);
    let path = repo.path().to_path_buf();
    let who = Who { ownership, runtime };
    let who = &who;
    let parts: Vec<Result<AuditReport, git2::Error>> = std::thread::scope(|scope| {
        let handles: Vec<_> = oids
            .chunks(chunk)
            .map(|part| {
                let path = path.clone();
                scope.spawn(move || audit_part(&path, part, review, who, cut))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(git2::Error::from_str("audit thread panicked")))
            })
            .collect()
    });
    let mut report = AuditReport::default();
    for part in parts {
        let part = part?;
        report.shallow_cut += part.shallow_cut;
        report.commits += part.commits;
        report.runtime_commits += part.runtime_commits;
        report.runtime_signed += part.runtime_signed;
        report.runtime_unauthenticated += part.runtime_unauthenticated;
        report.findings.extend(part.findings);
    }
    Ok(report)
}

/// The commits at a shallow clone's cut (git's `shallow` file): empty for a full clone.
fn shallow_cut(repo: &Repository) -> HashSet<Oid> {
    if !repo.is_shallow() {
        return HashSet::new();
    }
    std::fs::read_to_string(repo.commondir().join("shallow"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| Oid::from_str(l.trim()).ok())
        .collect()
}

/// What judging commits for review needs: the branch's first-parent chain among
/// `oids` and what the approvals on it cover, by the rule in force and (with signed
/// approvals in force) by identity alone.
fn review_context(
    repo: &Repository,
    rule: &crate::review::signing::ApprovalRule,
    tip: Oid,
    known: &[Oid],
    oids: &[Oid],
) -> Result<ReviewContext, git2::Error> {
    let on_branch = first_parent_chain(repo, tip, oids)?;
    let approved = Coverage::of(repo, rule, &on_branch)?;
    // Before `review.require_signed` (by the commit's own settings), an approval
    // counted without a signature: history from then is judged by that rule.
    let approved_unsigned = match rule.signers {
        Some(_) => Some(Coverage::of(
            repo,
            &crate::review::signing::ApprovalRule::unsigned(&rule.runtime_email),
            &on_branch,
        )?),
        None => None,
    };
    let covered_later = covered_later(repo, tip, &on_branch, &approved, approved_unsigned.as_ref())?;
    Ok(ReviewContext {
        approved,
        approved_unsigned,
        on_branch,
        covered_later,
        rule: rule.clone(),
        floors: Floors::of(repo, tip, known)?,
    })
}

/// Audits one slice of the commits (in history order) with its own repository
/// handle; findings come back in history order.
fn audit_part(
    path: &Path,
    part: &[Oid],
    review: &ReviewContext,
    who: &Who,
    cut: &HashSet<Oid>,
) -> Result<AuditReport, git2::Error> {
    let repo = Repository::open(path)?;
    let mut differ = TreeDiffer::open(&repo)?;
    let mut judge = Judge {
        repo: &repo,
        review,
        settings: Settings::new(&repo),
        refused: HashMap::new(),
        signatures: RuntimeSignatures::new(&repo),
        trust: None,
    };
    let mut report = AuditReport::default();
    // Newest first (see TreeDiffer), findings put back in history order.
    // A commit's parent is usually the next one audited: read it once.
    let mut per_commit = Vec::with_capacity(part.len());
    let mut parent_read: Option<git2::Commit> = None;
    for oid in part.iter().rev() {
        let commit = match parent_read.take() {
            Some(c) if c.id() == *oid => c,
            _ => repo.find_commit(*oid)?,
        };
        if cut.contains(oid) {
            // At a shallow clone's cut: what it changed is not known here (read as a
            // root it would add every file), but its builder tree is judged all the
            // same: one no approval covers is named, as any commit's would be.
            report.shallow_cut += 1;
            judge_at_cut(&mut judge, &commit, &mut report)?;
            per_commit.push(std::mem::take(&mut report.findings));
            continue;
        }
        let parent = commit.parent_ids().next().map(|p| repo.find_commit(p)).transpose()?;
        let against = judge.judged_against(&commit, parent.as_ref())?;
        audit_commit(
            &mut differ,
            &mut judge,
            who,
            &commit,
            against.as_ref().or(parent.as_ref()),
            &mut report,
        )?;
        per_commit.push(std::mem::take(&mut report.findings));
        parent_read = parent;
    }
    report.findings = per_commit.into_iter().rev().flatten().collect();
    Ok(report)
}

/// What is covered under one rule: trees, when the rule's verdict does not depend on
/// history (identities, or an operator's list); else commits, each judged by the
/// allowed-signers list of the last approved tree before it
/// ([`crate::review::trust`]).
enum Coverage {
    Trees(HashSet<Oid>),
    Commits(HashSet<Oid>),
}

impl Coverage {
    fn of(
        repo: &Repository,
        rule: &crate::review::signing::ApprovalRule,
        on_branch: &HashSet<Oid>,
    ) -> Result<Coverage, git2::Error> {
        let mut trust = crate::review::trust::Trust::new(repo, rule.clone())?;
        if let Some(trees) = trust.counting_trees() {
            return Ok(Coverage::Trees(trees));
        }
        let mut covered = HashSet::new();
        for c in on_branch {
            if trust.commit(*c)?.approval.is_some() {
                covered.insert(*c);
            }
        }
        Ok(Coverage::Commits(covered))
    }

    fn covers(&self, commit: Oid, tree: Oid) -> bool {
        match self {
            Coverage::Trees(t) => t.contains(&tree),
            Coverage::Commits(c) => c.contains(&commit),
        }
    }
}

/// What the review half of the audit needs, shared by every thread.
struct ReviewContext {
    /// What approvals that count under the rule in force cover.
    approved: Coverage,
    /// With signed approvals in force: what approvals that count by identity alone
    /// cover, for commits whose own settings did not ask for signatures.
    approved_unsigned: Option<Coverage>,
    /// The commits on the branch's first-parent chain (among those audited).
    on_branch: HashSet<Oid>,
    /// Those of them a later commit of the chain covers ([`covered_later`]).
    covered_later: HashSet<Oid>,
    /// The rule in force, for judging what a merge replaced ([`Judge::trust`]).
    rule: crate::review::signing::ApprovalRule,
    /// The settings runtime-named commits are held to besides their own.
    floors: Floors,
}

/// The commits of the first-parent chain from `tip` (among `on_branch`) that a later
/// commit of the chain covers: some commit after it, up to `tip`, has a builder tree
/// an approval covers, under the rule the commit that made that tree owes
/// ([`Settings::owes_signatures`]). An unapproved change there was undone or taken
/// into an approved tree since (a revert, an approved proposal built on it): history,
/// shown as a warning, never a violation. An approval that counts only by identity
/// covers nothing later while signatures are asked, or an unsigned approval would
/// excuse the change before it; and a records commit on a tree keeps the obligation
/// of the commit that made the tree (one that turned signatures off along with
/// review is judged under signatures, so an unsigned approval of its tree excuses
/// nothing either).
fn covered_later(
    repo: &Repository,
    tip: Oid,
    on_branch: &HashSet<Oid>,
    approved: &Coverage,
    approved_unsigned: Option<&Coverage>,
) -> Result<HashSet<Oid>, git2::Error> {
    let mut settings = Settings::new(repo);
    let mut chain = Vec::new();
    let mut next = Some(tip);
    while let Some(oid) = next.filter(|o| on_branch.contains(o)) {
        chain.push(oid);
        next = repo.find_commit(oid)?.parent_ids().next();
    }
    // Builder trees of the chain, read as far as the judgement needs.
    let mut trees: Vec<Option<Oid>> = vec![None; chain.len()];
    let mut tree_at = |i: usize| -> Result<Oid, git2::Error> {
        if let Some(t) = trees[i] {
            return Ok(t);
        }
        let t = crate::review::builder_tree_of(repo, &repo.find_commit(chain[i])?.tree()?)?;
        trees[i] = Some(t);
        Ok(t)
    };
    let mut out = HashSet::new();
    let mut run: Option<(Oid, usize)> = None;
    for i in 0..chain.len() {
        let tree = tree_at(i)?;
        // The commit that made this tree: the oldest of the run below with it (the
        // same as the commit before it in the chain, when that has this tree too).
        let maker = match run {
            Some((t, m)) if t == tree => m,
            _ => {
                let mut m = i;
                while m + 1 < chain.len() && tree_at(m + 1)? == tree {
                    m += 1;
                }
                m
            }
        };
        run = Some((tree, maker));
        let coverage = match approved_unsigned {
            Some(unsigned) if !settings.owes_signatures(&repo.find_commit(chain[maker])?)? => unsigned,
            Some(_) | None => approved,
        };
        if coverage.covers(chain[i], tree) {
            out.extend(chain[i + 1..].iter().copied());
            break;
        }
    }
    Ok(out)
}

/// The first-parent chain from `tip`, within the commits being audited.
fn first_parent_chain(repo: &Repository, tip: Oid, audited: &[Oid]) -> Result<HashSet<Oid>, git2::Error> {
    let audited: HashSet<Oid> = audited.iter().copied().collect();
    let mut out = HashSet::new();
    let mut next = Some(tip);
    while let Some(oid) = next.filter(|o| audited.contains(o)) {
        out.insert(oid);
        next = repo.find_commit(oid)?.parent_ids().next();
    }
    Ok(out)
}

/// `require_reviewed` and `review.require_signed` of commits, read once per settings blob.
struct Settings<'a> {
    repo: &'a Repository,
    by_blob: HashMap<Oid, (bool, bool)>,
}

impl<'a> Settings<'a> {
    fn new(repo: &'a Repository) -> Settings<'a> {
        Settings {
            repo,
            by_blob: HashMap::new(),
        }
    }

    /// `require_reviewed` and `review.require_signed` in the commit's own
    /// `settings/runtime.yaml` (false when the file is absent or does not say).
    fn of(&mut self, commit: &git2::Commit) -> Result<(bool, bool), git2::Error> {
        let entry = match commit.tree()?.get_path(std::path::Path::new(SETTINGS_FILE)) {
            Ok(e) => e,
            Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok((false, false)),
            Err(e) => return Err(e),
        };
        if let Some(v) = self.by_blob.get(&entry.id()) {
            return Ok(*v);
        }
        let on = crate::review::review_flags(self.repo.find_blob(entry.id())?.content());
        self.by_blob.insert(entry.id(), on);
        Ok(on)
    }

    /// Whether `commit`'s builder tree is judged under signatures: when its own
    /// settings ask for them, and also when its first parent's did (turning
    /// `require_signed` off is itself judged under signatures, or an identity approval
    /// would vouch for its own downgrade).
    fn owes_signatures(&mut self, commit: &git2::Commit) -> Result<bool, git2::Error> {
        if self.of(commit)?.1 {
            return Ok(true);
        }
        match commit.parents().next() {
            Some(parent) => Ok(self.of(&parent)?.1),
            None => Ok(false),
        }
    }
}

/// One thread's judge of builder changes: the shared context and the settings read.
struct Judge<'a> {
    repo: &'a Repository,
    review: &'a ReviewContext,
    settings: Settings<'a>,
    /// Refused links by tree id ([`crate::review::links`]).
    refused: HashMap<Oid, Vec<RefusedLink>>,
    /// The judge of runtime-named commits' signatures.
    signatures: RuntimeSignatures<'a>,
    /// The two-key walk, made when a merge is first judged for the parents it
    /// replaced (one predicate for fires and audit).
    trust: Option<crate::review::trust::Trust<'a>>,
}

impl Judge<'_> {
    /// `None` when the commit's builder change is covered (or not judged here);
    /// otherwise the severity and why.
    fn uncovered(&mut self, commit: &git2::Commit) -> Result<Option<(Severity, String)>, git2::Error> {
        if !self.review.on_branch.contains(&commit.id()) {
            return Ok(None);
        }
        let tree = crate::review::builder_tree_of(self.repo, &commit.tree()?)?;
        if self.covers(commit, tree)? {
            return Ok(None);
        }
        // A merge that keeps its first parent's builder tree (it brought only records)
        // changes nothing that was not judged on that parent. Another parent's tree is
        // no excuse: that parent is off the branch and was never judged, so `git merge
        // --no-ff` of an unapproved branch would pass. (A merge that replaced a
        // reviewed tree under review-off settings is diffed against that parent,
        // [`Judge::judged_against`], and judged here as any change.)
        if commit.parent_count() > 1 && self.judged_against(commit, commit.parents().next().as_ref())?.is_none() {
            if let Some(first) = commit.parents().next() {
                if crate::review::builder_tree_of(self.repo, &first.tree()?)? == tree {
                    return Ok(None);
                }
            }
        }
        let short = crate::text::short_oid(tree);
        let owed = self.owes_review(commit)?;
        // The branch's first commit (the scaffold) is its baseline: nothing came
        // before it to approve it against, so it is no warning; under review it is
        // judged as any commit.
        if commit.parent_count() == 0 && !owed {
            return Ok(None);
        }
        if owed && self.review.covered_later.contains(&commit.id()) {
            return Ok(Some((
                Severity::Warning,
                format!(
                    "no approval names its builder tree {short} (require_reviewed is on), but a later commit's tree is covered: history"
                ),
            )));
        }
        Ok(Some(if owed {
            (
                Severity::Violation,
                format!("no approval names its builder tree {short} (require_reviewed is on)"),
            )
        } else {
            (Severity::Warning, format!("no approval names its builder tree {short}"))
        }))
    }

    /// For a merge on the branch that keeps its first parent's builder tree (so no
    /// builder path changes): a finding when the first parent's tree is covered and
    /// the merge's is not. Then a line the merge joined trusts a list that does not
    /// accept the tree: an orphan line's own list, trusted on first use, merged over
    /// the branch with the orphan as first parent (`review::trust`'s joins).
    fn refused_by_a_joined_line(&mut self, commit: &git2::Commit) -> Result<Option<(Severity, String)>, git2::Error> {
        let Some(first) = commit.parents().next().filter(|_| commit.parent_count() > 1) else {
            return Ok(None);
        };
        if !self.review.on_branch.contains(&commit.id()) {
            return Ok(None);
        }
        let tree = crate::review::builder_tree_of(self.repo, &commit.tree()?)?;
        if crate::review::builder_tree_of(self.repo, &first.tree()?)? != tree
            || !self.covers(&first, tree)?
            || self.covers(commit, tree)?
        {
            return Ok(None);
        }
        let why = format!(
            "a merge joining another line: no approval of its builder tree {} counts by the list that line trusts",
            crate::text::short_oid(tree)
        );
        Ok(Some(if self.owes_review(commit)? {
            (Severity::Violation, format!("{why} (require_reviewed is on)"))
        } else {
            (Severity::Warning, why)
        }))
    }

    /// The builder-owned links of `commit`'s tree that the kernel would resolve outside
    /// the builder-owned paths (or into the write ACL, `/proc`, `/dev`, out of the
    /// repository), and gitlinks there, that its first parent did not already hold
    /// ([`crate::review::links`]): an approval names the link, not what it reaches, so
    /// they are flagged even when approved.
    fn new_refused_links(
        &mut self,
        commit: &git2::Commit,
        parent: Option<&git2::Commit>,
    ) -> Result<Vec<RefusedLink>, git2::Error> {
        let now = self.refused_in(&commit.tree()?)?;
        if now.is_empty() {
            return Ok(now);
        }
        let before = match parent {
            Some(p) => self.refused_in(&p.tree()?)?,
            None => Vec::new(),
        };
        Ok(now
            .into_iter()
            .filter(|l| !before.iter().any(|b| b.path == l.path && b.target == l.target))
            .collect())
    }

    fn refused_in(&mut self, tree: &git2::Tree) -> Result<Vec<RefusedLink>, git2::Error> {
        if let Some(hit) = self.refused.get(&tree.id()) {
            return Ok(hit.clone());
        }
        let found = crate::review::links::refused_in_tree(self.repo, tree).map_err(|e| match e {
            crate::review::links::ViewError::Git(g) => g,
            other => git2::Error::from_str(&other.to_string()),
        })?;
        self.refused.insert(tree.id(), found.clone());
        Ok(found)
    }

    /// Whether an unapproved builder change in `commit` is a violation: when its own
    /// settings or its first parent's say `require_reviewed` (so turning review off is
    /// itself judged under review, as turning signatures off is under signatures).
    fn owes_review(&mut self, commit: &git2::Commit) -> Result<bool, git2::Error> {
        if self.settings.of(commit)?.0 {
            return Ok(true);
        }
        match commit.parents().next() {
            Some(parent) if self.settings.of(&parent)?.0 => Ok(true),
            Some(_) => Ok(self.reviewed_parent_replaced(commit)?.is_some()),
            None => Ok(false),
        }
    }

    /// Whether an approval covers `tree` at `commit`, under the rule in force there
    /// (identities alone before `review.require_signed`).
    fn covers(&mut self, commit: &git2::Commit, tree: Oid) -> Result<bool, git2::Error> {
        let signed = self.settings.owes_signatures(commit)?;
        let approved = match &self.review.approved_unsigned {
            Some(unsigned) if !signed => unsigned,
            Some(_) | None => &self.review.approved,
        };
        Ok(approved.covers(commit.id(), tree))
    }

    /// The parent `commit` is judged against instead of its `first`: for a merge on
    /// the branch whose own settings turn review off and whose first parent keeps its
    /// uncovered builder tree, the parent under review whose tree it replaced
    /// ([`Judge::reviewed_parent_replaced`]), if any: the first parent's line (an
    /// orphan history, `git merge -s ours` from it) said review was off all along.
    /// Any other merge is judged against its first parent: with review on, the
    /// commit that made its tree was judged on that line (the box joining its
    /// records onto an unreviewed tip of the origin).
    fn judged_against<'c>(
        &mut self,
        commit: &git2::Commit<'c>,
        first: Option<&git2::Commit<'c>>,
    ) -> Result<Option<git2::Commit<'c>>, git2::Error> {
        let Some(first) = first.filter(|_| commit.parent_count() > 1) else {
            return Ok(None);
        };
        let tree = crate::review::builder_tree_of(self.repo, &commit.tree()?)?;
        if !self.review.on_branch.contains(&commit.id())
            || self.settings.of(commit)?.0
            || crate::review::builder_tree_of(self.repo, &first.tree()?)? != tree
            || self.covers(commit, tree)?
        {
            return Ok(None);
        }
        let replaced = self.reviewed_parent_replaced(commit)?;
        Ok(replaced.and_then(|p| commit.parents().find(|c| c.id() == p)))
    }

    /// A parent of the merge `commit` after the first whose builder tree is not the
    /// merge's and that is under review (its settings ask review, or its history owes
    /// it), as fires judge it ([`crate::review::trust::Trust::replaced_reviewed_parent`]):
    /// the merge replaced a reviewed tree, whatever its first parent says.
    fn reviewed_parent_replaced(&mut self, commit: &git2::Commit) -> Result<Option<Oid>, git2::Error> {
        let trust = match &mut self.trust {
            Some(t) => t,
            None => self
                .trust
                .insert(crate::review::trust::Trust::new(self.repo, self.review.rule.clone())?),
        };
        trust.replaced_reviewed_parent(commit.id())
    }
}

/// Whose commit, and whose paths.
struct Who<'a> {
    ownership: &'a Ownership,
    runtime: &'a RuntimeIdentity,
}

/// A commit at a shallow clone's cut: its builder tree judged for an approval, one
/// finding naming it when none covers it (its change cannot be diffed here).
fn judge_at_cut(judge: &mut Judge, commit: &git2::Commit, report: &mut AuditReport) -> Result<(), git2::Error> {
    if let Some((severity, what)) = judge.uncovered(commit)? {
        let author = commit.author();
        report.findings.push(Finding {
            severity,
            commit: crate::text::short_oid(commit.id()),
            author: format!("{} <{}>", author.name().unwrap_or(""), author.email().unwrap_or("")),
            path: "(its builder tree: at the shallow clone's cut)".into(),
            what,
        });
    }
    Ok(())
}

/// Audits one commit against its first parent (all files added for a root commit).
fn audit_commit(
    differ: &mut TreeDiffer,
    judge: &mut Judge,
    who: &Who,
    commit: &git2::Commit,
    parent: Option<&git2::Commit>,
    report: &mut AuditReport,
) -> Result<(), git2::Error> {
    let (ownership, runtime) = (who.ownership, who.runtime);
    report.commits += 1;
    let author = commit.author();
    let name = author.name().unwrap_or("");
    let email = author.email().unwrap_or("");
    // Named as the runtime by any of author and committer, name or email: held to the
    // runtime's rules (records only, create-only), whoever really wrote it, so a
    // person's commit cannot take the runtime's name to pass as neither.
    let is_runtime = runtime_named(commit, &runtime.name, &runtime.email);
    if is_runtime {
        report.runtime_commits += 1;
        count_runtime_signature(judge, commit, runtime, report)?;
    }
    let changes = differ.diff(parent.map(|p| p.tree_id()), Some(commit.tree_id()), &[])?;
    // Judged once per commit, and only when it changes a builder-owned path.
    let mut uncovered: Option<Option<(Severity, String)>> = None;
    let mut links_judged = false;
    let mut link_findings = Vec::new();
    for c in changes {
        let owner = ownership.classify_normalized(&c.path);
        let mut flag = |severity: Severity, what: String| {
            report.findings.push(Finding {
                severity,
                commit: crate::text::short_oid(commit.id()),
                author: format!("{name} <{email}>"),
                path: c.path.clone(),
                what,
            })
        };
        if is_runtime {
            for what in runtime_change_violations(&c, owner) {
                flag(Severity::Violation, what);
            }
        } else if record_written_by_a_person(judge.repo, commit, &c, (&runtime.name, &runtime.email))? {
            let (severity, what) = person_record_finding(&c.path, c.kind);
            flag(severity, what);
        } else if owner == Owner::Builder {
            if !links_judged {
                links_judged = true;
                link_findings = refused_link_findings(judge, commit, parent)?;
            }
            let verdict = match &uncovered {
                Some(v) => v.clone(),
                None => {
                    let v = judge.uncovered(commit)?;
                    uncovered = Some(v.clone());
                    v
                }
            };
            if let Some((severity, why)) = verdict {
                flag(
                    severity,
                    format!("unapproved change ({}) to a builder-owned path: {why}", verb(c.kind)),
                );
            }
        }
    }
    report.findings.extend(link_findings);
    if !links_judged {
        report.findings.extend(joined_line_finding(judge, commit)?);
    }
    Ok(())
}

/// The finding of a merge that changed no builder path but whose tree a joined line's
/// list does not accept ([`Judge::refused_by_a_joined_line`]), if any.
fn joined_line_finding(judge: &mut Judge, commit: &git2::Commit) -> Result<Option<Finding>, git2::Error> {
    Ok(judge.refused_by_a_joined_line(commit)?.map(|(severity, what)| Finding {
        severity,
        commit: crate::text::short_oid(commit.id()),
        author: author_of(commit),
        path: "-".into(),
        what,
    }))
}

/// Counts a runtime-named commit as signed or unauthenticated, or finds it forged.
fn count_runtime_signature(
    judge: &mut Judge,
    commit: &git2::Commit,
    runtime: &RuntimeIdentity,
    report: &mut AuditReport,
) -> Result<(), git2::Error> {
    let floors = &judge.review.floors;
    let mut verdict = judge.signatures.judge_under(commit, &runtime.email, floors.known())?;
    let mut severity = Severity::Violation;
    if let (Authenticity::Unauthenticated, Some(entry)) = (&verdict, floors.entry(commit.id())) {
        verdict = judge.signatures.judge_under(commit, &runtime.email, &[entry])?;
        severity = Severity::Warning;
    }
    match verdict {
        Authenticity::Signed(_) => report.runtime_signed += 1,
        Authenticity::Unauthenticated => report.runtime_unauthenticated += 1,
        Authenticity::Forged(why) => report.findings.push(Finding {
            severity,
            commit: crate::text::short_oid(commit.id()),
            author: author_of(commit),
            path: "-".into(),
            what: match severity {
                Severity::Violation => format!("forged runtime commit: named as the runtime without a valid runtime signature ({why})"),
                _ => format!("runtime commit without a valid runtime signature, merged into history that asks for one: forged, or records a box made before it had its key ({why})"),
            },
        }),
    }
    Ok(())
}

/// `Name <email>` of a commit's author, as findings name it.
fn author_of(commit: &git2::Commit) -> String {
    let author = commit.author();
    format!("{} <{}>", author.name().unwrap_or(""), author.email().unwrap_or(""))
}

/// What a runtime commit may not do to one path: touch a path it does not own,
/// change an existing record, add a symlink or gitlink, change only a mode.
fn runtime_change_violations(c: &TreeChange, owner: Owner) -> Vec<String> {
    let mut out = Vec::new();
    if owner != Owner::Runtime {
        out.push(format!("runtime commit {} a {} path", verb(c.kind), owner_name(owner)));
    } else if c.kind != ChangeKind::Added {
        out.push(format!(
            "runtime commit {} an existing record (records are create-only)",
            verb(c.kind)
        ));
    }
    let mode = c.new.map(|(_, m)| m);
    if mode == Some(i32::from(FileMode::Link)) {
        out.push("runtime commit adds a symlink".into());
    } else if mode == Some(i32::from(FileMode::Commit)) {
        out.push("runtime commit adds a gitlink (submodule)".into());
    } else if let (Some((oa, ma)), Some((ob, mb))) = (c.old, c.new) {
        if oa == ob && ma != mb {
            out.push("runtime commit changes only a file mode".into());
        }
    }
    out
}

/// A finding for each builder-owned link the commit adds that no approval can cover
/// (a violation when the commit owes review, else a warning).
fn refused_link_findings(
    judge: &mut Judge,
    commit: &git2::Commit,
    parent: Option<&git2::Commit>,
) -> Result<Vec<Finding>, git2::Error> {
    let refused = judge.new_refused_links(commit, parent)?;
    if refused.is_empty() {
        return Ok(Vec::new());
    }
    let severity = if judge.owes_review(commit)? {
        Severity::Violation
    } else {
        Severity::Warning
    };
    let findings = refused
        .into_iter()
        .map(|l| {
            let what = if l.target.starts_with("submodule commit") {
                format!(
                    "builder-owned path is a {}, outside the builder-owned paths: no approval covers what it reaches",
                    l.target
                )
            } else {
                format!(
                    "builder-owned path is a symlink to {}, which {}: no approval covers what it reaches",
                    l.target, l.why
                )
            };
            Finding {
                severity,
                commit: crate::text::short_oid(commit.id()),
                author: author_of(commit),
                path: l.path,
                what,
            }
        })
        .collect();
    Ok(findings)
}

/// The finding for a run record a person's commit added or changed. A receipt is the
/// run's account: a violation. A report a person edited (a typo, a redaction, a
/// formatter) or restored (`git revert` of its deletion) is worth a word, not a
/// refused push. `history` marks the run `FORGED` either way.
fn person_record_finding(path: &str, kind: ChangeKind) -> (Severity, String) {
    let (severity, record) = if crate::records::is_card_path(path) {
        let what = match kind {
            ChangeKind::Added => "a card",
            _ => "a card beyond its triage",
        };
        (Severity::Warning, what)
    } else if crate::layout::is_receipt_path(path) {
        (Severity::Violation, "a receipt")
    } else {
        (Severity::Warning, "a run's report")
    };
    let what = format!(
        "a commit not the runtime's {} {record}: the runtime did not write this record",
        verb(kind)
    );
    (severity, what)
}

fn verb(k: ChangeKind) -> &'static str {
    match k {
        ChangeKind::Added => "adds",
        ChangeKind::Deleted => "deletes",
        ChangeKind::Modified => "modifies",
    }
}

fn owner_name(o: Owner) -> &'static str {
    match o {
        Owner::Builder => "builder-owned",
        Owner::Runtime => "runtime-owned",
        Owner::Neither => "non-runtime",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::git::Person;
    use std::path::Path;

    /// Commits `files` (path, content) on top of `parents` as `who`, moving `HEAD` when asked.
    fn commit(repo: &Repository, parents: &[Oid], files: &[(&str, &str)], who: &str, head: bool) -> Oid {
        let base = parents.first().map(|p| repo.find_commit(*p).unwrap().tree().unwrap());
        let mut update = git2::build::TreeUpdateBuilder::new();
        for (path, body) in files {
            update.upsert(*path, repo.blob(body.as_bytes()).unwrap(), FileMode::Blob);
        }
        let empty = repo
            .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
            .unwrap();
        let tree = update.create_updated(repo, base.as_ref().unwrap_or(&empty)).unwrap();
        let tree = repo.find_tree(tree).unwrap();
        let email = match who {
            "runtime" => "runtime@localhost".to_string(),
            _ => format!("{}@example.com", who.to_lowercase()),
        };
        let sig = git2::Signature::now(who, &email).unwrap();
        let parents: Vec<git2::Commit> = parents.iter().map(|p| repo.find_commit(*p).unwrap()).collect();
        let refs: Vec<&git2::Commit> = parents.iter().collect();
        repo.commit(head.then_some("HEAD"), &sig, &sig, "c", &tree, &refs)
            .unwrap()
    }

    fn approve(repo: &Repository, commit: Oid) {
        let tree = crate::review::builder_tree_of_commit(repo, commit).unwrap();
        let rev = Person {
            name: "Rev".into(),
            email: "rev@example.com".into(),
        };
        crate::review::approvals::record(repo, "p", tree, commit, &rev).unwrap();
    }

    /// Findings (severity, commit, path) of the whole history under signed approvals,
    /// signers listed in the repository's `settings/allowed_signers`.
    fn signed_findings(repo: &Repository, dir: &Path) -> Vec<(Severity, String, String)> {
        let runtime = RuntimeIdentity {
            name: "runtime".into(),
            email: "runtime@localhost".into(),
        };
        let rule = crate::review::signing::ApprovalRule {
            runtime_email: runtime.email.clone(),
            signers: Some(crate::review::signing::SignerList::Repository(
                "settings/allowed_signers".into(),
            )),
        };
        let report = audit(repo, &Ownership::new(dir), &runtime, &rule, None).unwrap();
        report
            .findings
            .into_iter()
            .map(|f| (f.severity, f.commit, f.path))
            .collect()
    }

    fn findings(repo: &Repository, dir: &Path) -> Vec<(Severity, String)> {
        let runtime = RuntimeIdentity {
            name: "runtime".into(),
            email: "runtime@localhost".into(),
        };
        let rule = crate::review::signing::ApprovalRule::unsigned(&runtime.email);
        let report = audit(repo, &Ownership::new(dir), &runtime, &rule, None).unwrap();
        report.findings.into_iter().map(|f| (f.severity, f.path)).collect()
    }

    #[test]
    fn unapproved_changes_warn_before_require_reviewed_and_violate_after() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let off = "version: 1\n";
        let on = "version: 1\nrequire_reviewed: true\n";
        let root = commit(
            &repo,
            &[],
            &[("settings/runtime.yaml", off), ("prompts/t.md", "a")],
            "Eng",
            true,
        );
        assert_eq!(findings(&repo, dir.path()), vec![], "the first commit is the baseline");
        // Turning review on through an approved proposal: its intermediate commit is
        // on the side branch and judged at the merge, whose tree is approved.
        let step = commit(&repo, &[root], &[("prompts/t.md", "b")], "Eng", false);
        let proposal = commit(&repo, &[step], &[("settings/runtime.yaml", on)], "Eng", false);
        approve(&repo, proposal);
        let merge = commit(
            &repo,
            &[root, proposal],
            &[("settings/runtime.yaml", on), ("prompts/t.md", "b")],
            "Eng",
            true,
        );
        assert_eq!(findings(&repo, dir.path()).len(), 0, "the root is the baseline");
        // A direct change after it: a violation. A runtime records commit needs nothing.
        let direct = commit(&repo, &[merge], &[("prompts/t.md", "c")], "Eng", true);
        let rec = commit(&repo, &[direct], &[("runs/t/r.json", "{}")], "runtime", true);
        let got = findings(&repo, dir.path());
        assert_eq!(
            got.last(),
            Some(&(Severity::Violation, "prompts/t.md".into())),
            "{got:?}"
        );
        assert_eq!(got.len(), 1, "{got:?}");
        // Reverted to the approved tree: the direct change is history, a warning.
        let revert = commit(&repo, &[rec], &[("prompts/t.md", "b")], "Eng", true);
        let got = findings(&repo, dir.path());
        assert_eq!(got, vec![(Severity::Warning, "prompts/t.md".into())], "{got:?}");
        // A push of just the revert over the origin's `direct`: nothing to judge.
        let runtime = RuntimeIdentity {
            name: "runtime".into(),
            email: "runtime@localhost".into(),
        };
        let rule = crate::review::signing::ApprovalRule::unsigned(&runtime.email);
        let pushed = audit_range(&repo, &Ownership::new(dir.path()), &runtime, &rule, revert, &[rec]).unwrap();
        assert!(
            pushed.findings.is_empty() && pushed.commits == 1,
            "{:?}",
            pushed.findings
        );
    }

    #[test]
    fn turning_signed_approvals_off_is_judged_under_signatures() {
        let dir = tempfile::tempdir().unwrap();
        let Some((key, public)) = crate::review::signing::test_keys::keygen(dir.path(), "rev") else {
            return;
        };
        let root_dir = dir.path().join("r");
        let repo = Repository::init(&root_dir).unwrap();
        let signed = "version: 1\nrequire_reviewed: true\nreview:\n  require_signed: true\n";
        let first = commit(
            &repo,
            &[],
            &[
                ("settings/runtime.yaml", signed),
                ("settings/allowed_signers", &format!("rev@example.com {public}")),
                ("prompts/t.md", "a"),
            ],
            "Eng",
            true,
        );
        let rev = Person {
            name: "Rev".into(),
            email: "rev@example.com".into(),
        };
        let sign = |c: Oid| {
            let tree = crate::review::builder_tree_of_commit(&repo, c).unwrap();
            let signing = crate::review::approvals::Signing {
                key: key.clone(),
                program: "ssh-keygen".into(),
            };
            let body = crate::review::approvals::signed_body("p", tree, c, &rev, Some(&signing)).unwrap();
            crate::review::approvals::write(&repo, body, &rev).unwrap();
        };
        sign(first);
        // A direct commit turns signing off and changes the prompt, "approved" by an
        // identity alone: its own settings would accept that.
        let off = "version: 1\nrequire_reviewed: true\n";
        let downgrade = commit(
            &repo,
            &[first],
            &[("settings/runtime.yaml", off), ("prompts/t.md", "mallory's")],
            "Mallory",
            true,
        );
        approve(&repo, downgrade);
        let flagged = signed_findings(&repo, &root_dir);
        assert_eq!(
            flagged,
            vec![
                (
                    Severity::Violation,
                    crate::text::short_oid(downgrade),
                    "prompts/t.md".to_string()
                ),
                (
                    Severity::Violation,
                    crate::text::short_oid(downgrade),
                    "settings/runtime.yaml".to_string()
                ),
            ],
            "the first, signed tree is covered; the downgrade is not"
        );
        // Signed by Rev, the same commit is covered.
        sign(downgrade);
        let after = signed_findings(&repo, &root_dir);
        assert!(after.is_empty(), "{after:?}");
    }

    #[test]
    fn an_unsigned_approval_of_a_later_commit_excuses_nothing_under_signatures() {
        let dir = tempfile::tempdir().unwrap();
        let Some((key, public)) = crate::review::signing::test_keys::keygen(dir.path(), "rev") else {
            return;
        };
        let root_dir = dir.path().join("r");
        let repo = Repository::init(&root_dir).unwrap();
        let signed = "version: 1\nrequire_reviewed: true\nreview:\n  require_signed: true\n";
        let first = commit(
            &repo,
            &[],
            &[
                ("settings/runtime.yaml", signed),
                ("settings/allowed_signers", &format!("rev@example.com {public}")),
                ("prompts/t.md", "a"),
            ],
            "Eng",
            true,
        );
        let rev = Person {
            name: "Rev".into(),
            email: "rev@example.com".into(),
        };
        let tree = crate::review::builder_tree_of_commit(&repo, first).unwrap();
        let signing = crate::review::approvals::Signing {
            key,
            program: "ssh-keygen".into(),
        };
        let body = crate::review::approvals::signed_body("p", tree, first, &rev, Some(&signing)).unwrap();
        crate::review::approvals::write(&repo, body, &rev).unwrap();
        // A direct change with signatures still asked, "approved" by an unsigned
        // approval under Rev's name, and a records commit on top (the branch's tip,
        // same builder tree): the unsigned approval counts for neither.
        let tweak = commit(&repo, &[first], &[("prompts/t.md", "mallory's")], "Mallory", true);
        approve(&repo, tweak);
        commit(&repo, &[tweak], &[("runs/t/r.json", "{}")], "runtime", true);
        let flagged = signed_findings(&repo, &root_dir);
        assert_eq!(
            flagged,
            vec![(
                Severity::Violation,
                crate::text::short_oid(tweak),
                "prompts/t.md".to_string()
            )],
            "a violation, not history excused by the tip's unsigned approval"
        );
    }
}
