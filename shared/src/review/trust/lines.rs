//! The walks that judge a tree, without recursion. A tree is judged by the list of the
//! nearest covered commit below it on its line ([`Line::trusted`]), and by the lists
//! of every line joined on the way there: the merges in its own run and in each run
//! the walk passed over ([`Line::passed`]), and, the same way, in the runs each joined
//! line's walk passed over. A commit on top of a merge of an orphan history therefore
//! answers to the line that merge joined as the merge itself does, however many builder
//! changes lie between them and however deep such merges nest.
//!
//! Whether a commit is covered depends on whether older commits are, down its line and
//! the lines it joined. A judgement asks only what is already known
//! ([`Trust::known_covered`]); meeting a commit not yet judged, it answers
//! [`Pending::After`] with that commit, which [`Trust::cover`] judges first from an
//! explicit stack (its own older commits first the same way), and the judgement is
//! asked again. However deep the history or the nesting, nothing recurses.

use super::{Judged, Step, Trust};
use git2::Oid;
use std::collections::HashSet;

/// One walk down a line's first parents for a tree: the commit whose list judges it
/// (`None`: no covered commit with another builder tree lies below, so the tree's own
/// list is trusted on first use), and where the walk began. The commits it passed
/// over, each the newest of its run, are those from `start` down to `trusted`
/// ([`Trust::passed_runs_until`]); their merges' joined lines judge the tree too.
#[derive(Debug, Clone, Copy)]
pub(super) struct Line {
    pub(super) trusted: Option<Oid>,
    pub(super) start: Option<Oid>,
}

/// An answer, or the older commit whose coverage must be judged first.
pub(super) enum Pending<T> {
    Ready(T),
    After(Oid),
}

/// `?` for [`Pending`]: the answer, or return the commit to judge first.
macro_rules! ready {
    ($e:expr) => {
        match $e? {
            Pending::Ready(v) => v,
            Pending::After(c) => return Ok(Pending::After(c)),
        }
    };
}
pub(super) use ready;

impl Trust<'_> {
    /// Whether the builder tree of `commit` is covered: judged by the list its line
    /// trusts before it and by the lists of the lines joined on the way ([`Trust::verdict`]).
    pub(super) fn covered(&mut self, commit: Oid) -> Result<bool, git2::Error> {
        if let Some(v) = self.known_covered(commit)? {
            return Ok(v);
        }
        self.cover(commit)?;
        Ok(self.covered.get(&commit).copied().unwrap_or(false))
    }

    /// Whether `commit` is covered, when that is known without a walk: judged before,
    /// or no approval names its tree at all.
    pub(super) fn known_covered(&mut self, commit: Oid) -> Result<Option<bool>, git2::Error> {
        if let Some(v) = self.covered.get(&commit) {
            return Ok(Some(*v));
        }
        let tree = self.step(commit)?.tree;
        if !self.may_count(tree) {
            self.covered.insert(commit, false);
            return Ok(Some(false));
        }
        Ok(None)
    }

    /// Whether any approval naming `tree` could count under the rule: one exists, and
    /// carries a signature when the rule asks for one (an unsigned approval of the
    /// years before signatures counts for nothing, so those trees need no walk).
    fn may_count(&mut self, tree: Oid) -> bool {
        if let Some(v) = self.may_count.get(&tree) {
            return *v;
        }
        let signed = self.rule.signers.is_some();
        let v = self
            .approvals
            .naming(tree)
            .any(|(_, a)| !signed || a.body.signature.is_some());
        self.may_count.insert(tree, v);
        v
    }

    /// Judges whether `commit` is covered, and first every older commit its verdict
    /// depends on ([`Trust::cover_each`]).
    fn cover(&mut self, commit: Oid) -> Result<(), git2::Error> {
        self.cover_each(vec![commit])
    }

    /// Judges whether each commit of `commits` (the last first) is covered, and first
    /// every older commit its verdict depends on, from a stack; each answer is
    /// remembered. Before a commit whose line accepts its tree is judged, the later
    /// parents holding its tree that its run still asks ([`Trust::same_tree_later_parents`])
    /// are, the oldest first: each covered one answers for its whole line, and a
    /// commit's run is asked down to the merges an older covered commit of it asked
    /// ([`Trust::unanswered_run_joins`]), so two cron boxes' thousand sync merges are
    /// judged once each, not each down the whole history. Everything a commit waits
    /// for is an ancestor of it (a commit may be on the stack twice, pushed by two
    /// commits), so the stack ends; a commit waiting, through others, for one whose
    /// judgement waits for it is an error.
    pub(super) fn cover_each(&mut self, commits: Vec<Oid>) -> Result<(), git2::Error> {
        let mut stack = commits;
        let mut expanded = HashSet::new();
        let mut judging = HashSet::new();
        while let Some(&c) = stack.last() {
            if self.known_covered(c)?.is_some() {
                stack.pop();
                judging.remove(&c);
                continue;
            }
            let step = self.step(c)?;
            let next = if expanded.contains(&c) {
                None
            } else {
                match self.later_parents_first(c, step, &mut stack)? {
                    Pending::After(older) => Some(older),
                    Pending::Ready(pushed) => {
                        expanded.insert(c);
                        if pushed {
                            continue;
                        }
                        None
                    }
                }
            };
            let older = match next {
                Some(older) => older,
                None => match self.verdict(step.tree, step.boundary, Some(c), c)? {
                    Pending::Ready(judged) => {
                        self.record_covered(c, judged.approval.is_some());
                        stack.pop();
                        judging.remove(&c);
                        continue;
                    }
                    Pending::After(older) => older,
                },
            };
            if judging.contains(&older) {
                return Err(git2::Error::from_str(&format!(
                    "the walk of approvals found commit {older} waiting for a commit that waits for it: the history is not a graph of ancestors"
                )));
            }
            judging.insert(c);
            stack.push(older);
        }
        Ok(())
    }

    /// Pushes onto `stack` the later parents holding the tree of `c` (whose step is
    /// `step`) that its run still asks and no verdict answers yet
    /// ([`Trust::same_tree_later_parents`]), when its line accepts its tree; whether
    /// it pushed any. A run that joins no line has none.
    fn later_parents_first(&mut self, c: Oid, step: Step, stack: &mut Vec<Oid>) -> Result<Pending<bool>, git2::Error> {
        if step.joined.is_none() {
            return Ok(Pending::Ready(false));
        }
        let line = ready!(self.walk_line(step.boundary, step.tree));
        if self.judge_tree(step.tree, line.trusted, c).approval.is_none() {
            return Ok(Pending::Ready(false));
        }
        let before = stack.len();
        for parent in self.same_tree_later_parents(c, step.tree)? {
            if self.known_covered(parent)?.is_none() {
                stack.push(parent);
            }
        }
        Ok(Pending::Ready(stack.len() > before))
    }

    /// Whether `commit` is covered, known now: kept for this judge and remembered in
    /// the verdicts for the next fire.
    pub(super) fn record_covered(&mut self, commit: Oid, covered: bool) {
        self.covered.insert(commit, covered);
        self.remember_covered(commit, covered);
    }

    /// Runs `judge` until it no longer waits for an older commit, judging each one it
    /// waits for ([`Trust::cover`]).
    pub(super) fn settle<T>(
        &mut self,
        mut judge: impl FnMut(&mut Self) -> Result<Pending<T>, git2::Error>,
    ) -> Result<T, git2::Error> {
        loop {
            match judge(self)? {
                Pending::Ready(v) => return Ok(v),
                Pending::After(older) => self.cover(older)?,
            }
        }
    }

    /// The walk from `start` down its first parents for `tree`: to the nearest commit
    /// whose builder tree differs from `tree` and is covered, passing over the rest. A
    /// run of commits known to be uncovered is skipped in one step the next time
    /// ([`Trust::skip`]): such a run passes every walk, whatever its tree, so a chain
    /// of thousands of uncovered builder changes is walked once, not once per change.
    pub(super) fn walk_line(&mut self, start: Option<Oid>, tree: Oid) -> Result<Pending<Line>, git2::Error> {
        if let Some(line) = self.lines.get(&(start, tree)) {
            return Ok(Pending::Ready(*line));
        }
        if let Some(trusted) = self.remembered_line(start, tree) {
            return Ok(Pending::Ready(Line { trusted, start }));
        }
        let mut uncovered = Vec::new();
        let mut next = start;
        let trusted = loop {
            let Some(c) = next else { break None };
            if let Some(below) = self.skip.get(&c) {
                uncovered.push(c);
                next = *below;
                continue;
            }
            let s = self.step(c)?;
            let known = if s.tree != tree {
                match self.known_covered(c)? {
                    Some(true) => break Some(c),
                    Some(false) => Some(false),
                    None => return Ok(Pending::After(c)),
                }
            } else {
                self.covered.get(&c).copied()
            };
            if known == Some(false) {
                uncovered.push(c);
            } else {
                // A run that may stop another tree's walk ends the chain to skip.
                for u in uncovered.drain(..) {
                    self.skip.insert(u, Some(c));
                }
            }
            next = s.boundary;
        };
        for u in uncovered {
            self.skip.insert(u, next);
        }
        let line = Line { trusted, start };
        self.lines.insert((start, tree), line);
        self.remember_line(start, tree, trusted);
        Ok(Pending::Ready(line))
    }

    /// The commits a walk passed over (each the newest of its run), newest first, down
    /// to the first one for which `stop` answers true, which is returned apart.
    pub(super) fn passed_runs_until(
        &mut self,
        line: Line,
        stop: impl Fn(&Self, Oid) -> bool,
    ) -> Result<(Vec<Oid>, Option<Oid>), git2::Error> {
        let mut out = Vec::new();
        let mut next = line.start;
        while let Some(c) = next.filter(|c| Some(*c) != line.trusted) {
            if stop(self, c) {
                return Ok((out, Some(c)));
            }
            out.push(c);
            next = self.step(c)?.boundary;
        }
        Ok((out, None))
    }

    /// The commit whose list judges `tree` on top of `start` ([`Line::trusted`]).
    pub(super) fn trusted_from(&mut self, start: Option<Oid>, tree: Oid) -> Result<Option<Oid>, git2::Error> {
        Ok(self.settle(|t| t.walk_line(start, tree))?.trusted)
    }

    /// The verdict on `tree` (of `own`, whose list is trusted on first use) on the line
    /// from `start`, held to the lists of the lines joined in the run of `own_run` and
    /// in every run that walk passes over ([`Trust::joins_accept`]).
    pub(super) fn verdict(
        &mut self,
        tree: Oid,
        start: Option<Oid>,
        own_run: Option<Oid>,
        own: Oid,
    ) -> Result<Pending<Judged>, git2::Error> {
        self.verdict_also(tree, start, own_run, None, own)
    }

    /// [`Trust::verdict`], the runs `also` passed over judging too (the incoming
    /// line of a sync judged on the line of the branch it arrives over).
    pub(super) fn verdict_also(
        &mut self,
        tree: Oid,
        start: Option<Oid>,
        own_run: Option<Oid>,
        also: Option<Line>,
        own: Oid,
    ) -> Result<Pending<Judged>, git2::Error> {
        let line = ready!(self.walk_line(start, tree));
        let judged = self.judge_tree(tree, line.trusted, own);
        if line.trusted.is_none() && judged.approval.is_some() && self.shallow_with_approvals() {
            // Where a shallow clone's history ends, the approved tree whose list
            // should judge this one may lie beyond it: its own list is trusted for
            // nothing (trust on first use would let a pushed list approve itself).
            return Ok(Pending::Ready(judged.refused(vec![
                "this clone is shallow: the approved tree whose allowed-signers list judges this one may lie in the history it lacks, so no list of its own is trusted (`git fetch --unshallow`)".into(),
            ])));
        }
        if judged.approval.is_none() {
            return Ok(Pending::Ready(judged));
        }
        let lines: Vec<Line> = std::iter::once(line).chain(also).collect();
        self.joins_accept(tree, own_run, &lines, own, judged)
    }
}
