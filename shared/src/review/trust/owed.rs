//! Whether a commit whose own settings have `require_reviewed` off still owes review
//! by its history, as `builder audit` judges a change ([`Trust::review_owed`]): a
//! builder change owes an approval when its own settings or those of the tree before
//! it say `require_reviewed`, and a merge that turns review off owes one when it
//! brought its tree in over a parent under review.
//!
//! The answer of a commit depends on the answers of older commits (the builder change
//! below it, the later parents of its merges), so the walk keeps a stack of the
//! commits still to answer, oldest answered first, and remembers every answer: however
//! deep merges nest in each other, nothing recurses, and each commit is answered once
//! per judge.

use super::{builder_tree_of, write_review_free, Step, Trust};
use git2::Oid;

/// One commit's answer: whether its history owes review, and whether that rests on
/// nothing but the history itself (every walk it took reached the root or the
/// review-free mark, none stopped at a covered commit: only then may it be remembered
/// as review-free for later fires).
#[derive(Debug, Clone, Copy)]
pub(super) struct Owed {
    owed: bool,
    to_root: bool,
    /// The covered commit the answer rests on, along the builder changes below it.
    covered_at: Option<Oid>,
}

const OWED: Owed = Owed {
    owed: true,
    to_root: true,
    covered_at: None,
};

/// What [`Trust::owed_review`] found: whether review is owed, and when it is not
/// because the walk reached a covered commit, that commit (whose approval the tree
/// rests on: approvals only move forward from there too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwedReview {
    pub owed: bool,
    pub covered_at: Option<Oid>,
}

/// What one look at a commit found: its answer, or the older commits to answer first.
enum Look {
    Answer(Owed),
    After(Vec<Oid>),
}

impl Trust<'_> {
    /// Whether `commit`, whose own settings have `require_reviewed` off, still owes
    /// review by its history. Walking builder changes back from `commit` to the nearest
    /// covered one, any that owes one means the switch-off was not approved (an
    /// unapproved commit that turns review off, and whatever follows it, still runs
    /// only with an approval). So does an uncovered tree a merge brought in over a
    /// parent under review, whatever its first parent's line says
    /// ([`Trust::replaced_reviewed_parent`]).
    ///
    /// This holds from the first moment: a repository with no approval yet whose
    /// history turned `require_reviewed` on owes review too (the first tree under
    /// review needs an approval itself: `builder approve --bootstrap`), so an unapproved
    /// switch-off before the first approval is judged. A walk that reaches the root
    /// finding none is remembered ([`super::REVIEW_FREE_FILE`]), unless no builder
    /// change lies below `commit` (then the walk is one step anyway): later fires stop
    /// at the nearest builder change instead of walking all of history again.
    ///
    /// In a shallow clone that has approvals, history that ends at a parent the clone
    /// lacks owes review: what lies beyond cannot be judged (`git fetch --unshallow`).
    pub fn review_owed(&mut self, commit: Oid) -> Result<bool, git2::Error> {
        Ok(self.owed_review(commit)?.owed)
    }

    /// [`Trust::review_owed`], with the covered commit an answer of "not owed" rests
    /// on, if any.
    pub fn owed_review(&mut self, commit: Oid) -> Result<OwedReview, git2::Error> {
        let owed = self.owed_walk(commit)?;
        if !owed.owed && owed.to_root {
            self.mark_review_free(commit)?;
        }
        self.save_memo();
        Ok(OwedReview {
            owed: owed.owed,
            covered_at: owed.covered_at.filter(|_| !owed.owed),
        })
    }

    /// A parent of the merge `merge` after the first that is under review: its
    /// settings say `require_reviewed` and its builder tree is not the merge's, or its
    /// history owes review (an unapproved switch-off on its line,
    /// [`Trust::review_owed`]), whatever its tree. Asked of merges whose own settings
    /// turn review off: the merge brought its tree in over a reviewed one, and its first
    /// parent's line (an orphan history with review off, `git merge -s ours` from it)
    /// never judged that, so the tree owes review. With review on, the commit that
    /// made the tree was judged on the first parent's line. A parent that made no
    /// builder change since it forked from the first parent's history is none
    /// ([`Trust::judged_on_first_line`]). `builder audit` judges merges by it too.
    pub fn replaced_reviewed_parent(&mut self, merge: Oid) -> Result<Option<Oid>, git2::Error> {
        let found = self.repo.find_commit(merge)?;
        let tree = builder_tree_of(self.repo, &found.tree()?)?;
        for parent in found.parent_ids().skip(1) {
            let Some(theirs) = self.present_tree(parent)? else {
                if self.shallow_with_approvals() {
                    return Ok(Some(parent));
                }
                continue;
            };
            let owed = self.owed_walk(parent)?.owed;
            let under_review = (theirs != tree && self.requires_review(parent)?) || owed;
            // A stale branch is excused only while its own history owes nothing: a
            // parent whose line an unreviewed merge put an old tree back on (its tree
            // then equals the one where the lines meet) is no stale branch.
            if under_review && (owed || !self.judged_on_first_line(&found, parent, theirs)?) {
                return Ok(Some(parent));
            }
        }
        Ok(None)
    }

    /// The answer of `commit`, and of every older commit it depends on, each answered
    /// once ([`Trust::look`]) and remembered.
    fn owed_walk(&mut self, commit: Oid) -> Result<Owed, git2::Error> {
        let free = self.memo.as_ref().and_then(|m| m.free);
        let mut pending = vec![commit];
        while let Some(&c) = pending.last() {
            if self.owed.contains_key(&c) {
                pending.pop();
                continue;
            }
            match self.look(c, free)? {
                Look::Answer(a) => {
                    self.owed.insert(c, a);
                    pending.pop();
                }
                Look::After(older) => pending.extend(older),
            }
        }
        Ok(self.owed[&commit])
    }

    /// One look at `commit`: its answer when the commits it depends on are answered,
    /// else those of them that are not.
    fn look(&mut self, commit: Oid, free: Option<Oid>) -> Result<Look, git2::Error> {
        if Some(commit) == free {
            return Ok(Look::Answer(Owed {
                owed: false,
                to_root: true,
                covered_at: None,
            }));
        }
        if self.covered(commit)? {
            return Ok(Look::Answer(Owed {
                owed: false,
                to_root: false,
                covered_at: Some(commit),
            }));
        }
        if self.requires_review(commit)? {
            return Ok(Look::Answer(OWED));
        }
        let step = self.step(commit)?;
        let (merges, stop) = self.run_merges(step, free)?;
        // The boundary: a change from a tree under review owes review itself. Or a
        // commit of the run whose answer is known, which holds from there down.
        let below = match (stop, step.boundary) {
            (Some(s), _) if Some(s) == free => None,
            (Some(s), _) => Some(s),
            (None, Some(b)) if Some(b) == free => None,
            (None, Some(b)) if self.requires_review(b)? => return Ok(Look::Answer(OWED)),
            (None, Some(b)) => Some(b),
            (None, None) if self.shallow_with_approvals() => return Ok(Look::Answer(OWED)),
            (None, None) => None,
        };
        let mut older: Vec<Oid> = below.into_iter().collect();
        for m in &merges {
            for p in self.repo.find_commit(*m)?.parent_ids().skip(1) {
                if self.present_tree(p)?.is_some() {
                    older.push(p);
                }
            }
        }
        let unanswered: Vec<Oid> = older.iter().copied().filter(|o| !self.owed.contains_key(o)).collect();
        if !unanswered.is_empty() {
            return Ok(Look::After(unanswered));
        }
        for m in merges {
            if self.replaced_reviewed_parent(m)?.is_some() {
                return Ok(Look::Answer(OWED));
            }
        }
        let answers: Vec<Owed> = older.iter().map(|o| self.owed[o]).collect();
        let below = below.map(|b| self.owed[&b]);
        Ok(Look::Answer(Owed {
            owed: below.is_some_and(|b| b.owed),
            to_root: answers.iter().all(|a| a.to_root),
            covered_at: below.and_then(|b| b.covered_at),
        }))
    }

    /// The merges of the run of `step` whose settings turn review off: its
    /// [`Step::merged`] and, through the first parents, the ones below it with the
    /// same builder tree; and a commit of the run below them whose answer is known
    /// (the review-free mark, or one answered before), where the run may stop: its
    /// answer holds for the rest of the run and the boundary below it. Without one,
    /// the run ends at its boundary.
    fn run_merges(&mut self, step: Step, free: Option<Oid>) -> Result<(Vec<Oid>, Option<Oid>), git2::Error> {
        let answered = |t: &Self, c: Oid| Some(c) == free || t.owed.contains_key(&c);
        let mut out = Vec::new();
        let mut merged = step.merged;
        while let Some(merge) = merged {
            if answered(self, merge) {
                return Ok((out, Some(merge)));
            }
            out.push(merge);
            let Some((first, below)) = self.below_in_run(merge, step.tree)? else {
                break;
            };
            if answered(self, first) {
                return Ok((out, Some(first)));
            }
            merged = below.merged;
        }
        Ok((out, None))
    }

    /// The first parent of `merge` and its step, when it is in the same run (its
    /// builder tree is `tree`) and the clone has it.
    pub(super) fn below_in_run(&mut self, merge: Oid, tree: Oid) -> Result<Option<(Oid, Step)>, git2::Error> {
        let Some(first) = self.repo.find_commit(merge)?.parent_ids().next() else {
            return Ok(None);
        };
        if self.present_tree(first)?.is_none() {
            return Ok(None);
        }
        let below = self.step(first)?;
        Ok((below.tree == tree).then_some((first, below)))
    }

    /// Whether the later parent `parent` of the merge `merge` (builder tree `theirs`)
    /// made no builder change since it forked from the merge's first parent's history:
    /// its tree is the one where they meet. That tree was judged on the first
    /// parent's line, so the merge brought in nothing of the parent's own (a stale
    /// feature branch merged after review was turned off through review). An orphan
    /// history meets nothing.
    pub(super) fn judged_on_first_line(
        &self,
        merge: &git2::Commit,
        parent: Oid,
        theirs: Oid,
    ) -> Result<bool, git2::Error> {
        let Some(first) = merge.parent_ids().next() else {
            return Ok(false);
        };
        match self.repo.merge_base(first, parent) {
            Ok(base) => Ok(super::super::builder_tree_of_commit(self.repo, base)? == theirs),
            Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The builder tree of `commit`, or `None` when a shallow clone lacks it.
    pub(super) fn present_tree(&self, commit: Oid) -> Result<Option<Oid>, git2::Error> {
        match self.repo.find_commit(commit) {
            Ok(c) => Ok(Some(builder_tree_of(self.repo, &c.tree()?)?)),
            Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A shallow clone of a repository under review: where its history ends, what lies
    /// beyond is not known to owe nothing.
    pub(super) fn shallow_with_approvals(&self) -> bool {
        self.shallow && !self.approvals.all().is_empty()
    }

    /// Remembers, after a walk from `commit` reached the root owing nothing, the
    /// nearest builder change below it (what the next fire's HEAD, a records commit on
    /// top, reaches first). With none (one builder tree all the way down), the next
    /// walk is one step as this one was, and a mark of `commit` would only be
    /// rewritten by every fire.
    fn mark_review_free(&mut self, commit: Oid) -> Result<(), git2::Error> {
        if self.memo.is_none() {
            return Ok(());
        }
        let Some(mark) = self.step(commit)?.boundary else {
            return Ok(());
        };
        let Some(memo) = self.memo.as_mut().filter(|m| m.free != Some(mark)) else {
            return Ok(());
        };
        match write_review_free(&memo.root, mark) {
            Ok(()) => memo.free = Some(mark),
            Err(e) => tracing::warn!(error = %e, "the review-free mark was not remembered"),
        }
        Ok(())
    }
}

#[cfg(test)]
pub(in crate::review::trust) mod tests {
    use super::*;
    use crate::review::approvals;
    use crate::review::signing::ApprovalRule;
    use git2::Repository;

    const SETTINGS: &str = crate::layout::SETTINGS_FILE;
    const ON: &str = "require_reviewed: true\n";
    const OFF: &str = "require_reviewed: false\n";

    /// A commit whose tree is `from`'s (or empty) with `files` replaced, on `parents`.
    pub(in crate::review::trust) fn commit_on(
        repo: &Repository,
        from: Option<Oid>,
        parents: &[Oid],
        files: &[(&str, &str)],
    ) -> Oid {
        let empty = repo.treebuilder(None).unwrap().write().unwrap();
        let base = match from {
            Some(c) => repo.find_commit(c).unwrap().tree().unwrap(),
            None => repo.find_tree(empty).unwrap(),
        };
        let mut update = git2::build::TreeUpdateBuilder::new();
        for (path, body) in files {
            update.upsert(*path, repo.blob(body.as_bytes()).unwrap(), git2::FileMode::Blob);
        }
        let tree = repo.find_tree(update.create_updated(repo, &base).unwrap()).unwrap();
        let sig = git2::Signature::now("eng", "eng@localhost").unwrap();
        let parents: Vec<git2::Commit> = parents.iter().map(|p| repo.find_commit(*p).unwrap()).collect();
        let refs: Vec<&git2::Commit> = parents.iter().collect();
        repo.commit(None, &sig, &sig, "c", &tree, &refs).unwrap()
    }

    /// An approval by identity of the builder tree of `commit`.
    fn approve(repo: &Repository, commit: Oid) {
        let who = crate::git::Person {
            name: "Rev".into(),
            email: "rev@x.org".into(),
        };
        let tree = crate::review::builder_tree_of_commit(repo, commit).unwrap();
        let body = approvals::signed_body("p", tree, commit, &who, None).unwrap();
        approvals::write(repo, body, &who).unwrap();
    }

    fn owed(repo: &Repository, commit: Oid) -> bool {
        Trust::new(repo, ApprovalRule::unsigned("runtime@localhost"))
            .unwrap()
            .review_owed(commit)
            .unwrap()
    }

    /// A side commit switches review off and brings the prompt at once, unapproved;
    /// a merge takes exactly its tree over an orphan's first parent. The side's tree
    /// is the merge's own, so only its history says it owes review.
    #[test]
    fn a_merge_taking_the_tree_of_a_side_that_owes_review_owes_it() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let main = commit_on(&repo, None, &[], &[(SETTINGS, ON), ("prompts/a.md", "1")]);
        approve(&repo, main);
        let side = commit_on(&repo, Some(main), &[main], &[(SETTINGS, OFF), ("prompts/a.md", "EVIL")]);
        let orphan = commit_on(&repo, None, &[], &[(SETTINGS, OFF), ("prompts/a.md", "plain")]);
        let merge = commit_on(&repo, Some(side), &[orphan, side], &[]);
        let head = commit_on(&repo, Some(merge), &[merge], &[("runs/t/1.json", "{}")]);
        assert!(owed(&repo, head));
        approve(&repo, side);
        assert!(!owed(&repo, head), "approved, the side's switch-off owes nothing");
    }

    /// Review turned off through review, a prompt tweak after it, then a feature
    /// branch forked while review was on (its settings still say so) merged: it made
    /// no builder change of its own, so the merge owes nothing. With a builder change
    /// of its own, it does.
    #[test]
    fn a_stale_feature_branch_merged_after_review_was_turned_off_owes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let on = commit_on(&repo, None, &[], &[(SETTINGS, ON), ("prompts/a.md", "1")]);
        approve(&repo, on);
        let feature = commit_on(&repo, Some(on), &[on], &[("docs/a.md", "notes")]);
        let off = commit_on(&repo, Some(on), &[on], &[(SETTINGS, OFF)]);
        approve(&repo, off);
        let tweak = commit_on(&repo, Some(off), &[off], &[("prompts/a.md", "2")]);
        let merge = commit_on(&repo, Some(tweak), &[tweak, feature], &[("docs/a.md", "notes")]);
        assert!(!owed(&repo, merge));
        let prompt = commit_on(&repo, Some(feature), &[feature], &[("prompts/a.md", "theirs")]);
        let merge = commit_on(&repo, Some(tweak), &[tweak, prompt], &[("docs/a.md", "notes")]);
        assert!(owed(&repo, merge), "the branch changed the prompt under review");
    }

    /// Thousands of merges nested in each other (each feature branch forked just
    /// before a prompt tweak, then merged) are judged without recursion: in a test
    /// thread's small stack, as in an audit thread's.
    #[test]
    fn merges_nested_thousands_deep_are_judged_without_recursion() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let mut tip = commit_on(&repo, None, &[], &[(SETTINGS, OFF), ("prompts/a.md", "0")]);
        for i in 1..=3000 {
            let feature = commit_on(&repo, Some(tip), &[tip], &[("docs/a.md", &i.to_string())]);
            let tweak = commit_on(&repo, Some(tip), &[tip], &[("prompts/a.md", &i.to_string())]);
            tip = commit_on(&repo, Some(tweak), &[tweak, feature], &[("docs/a.md", &i.to_string())]);
        }
        assert!(!owed(&repo, tip));
        assert!(Trust::new(&repo, ApprovalRule::unsigned("runtime@localhost"))
            .unwrap()
            .replaced_reviewed_parent(tip)
            .unwrap()
            .is_none());
    }

    /// A shallow clone whose history ends below an unapproved switch-off of review
    /// cannot see that it was one: with approvals in the clone, the missing history
    /// owes review, and nothing of the cut-off walk is remembered for after a
    /// `git fetch --unshallow`.
    #[test]
    fn a_shallow_clone_judges_the_history_it_lacks_as_owing_review() {
        let dir = tempfile::tempdir().unwrap();
        let origin = dir.path().join("origin");
        let repo = Repository::init(&origin).unwrap();
        let on = commit_on(&repo, None, &[], &[(SETTINGS, ON), ("prompts/a.md", "1")]);
        approve(&repo, on);
        let off = commit_on(&repo, Some(on), &[on], &[(SETTINGS, OFF), ("prompts/a.md", "EVIL")]);
        repo.reference("refs/heads/main", off, true, "tip").unwrap();
        repo.set_head("refs/heads/main").unwrap();
        let clone = dir.path().join("clone");
        let shallow = super::super::tests::shallow_clone(&origin, &clone);
        std::fs::create_dir_all(clone.join(crate::layout::STATE_DIR)).unwrap();
        let judge = || {
            Trust::new(&shallow, ApprovalRule::unsigned("runtime@localhost"))
                .unwrap()
                .remembering(Some(&clone))
                .review_owed(off)
                .unwrap()
        };
        assert!(judge(), "the history beyond the clone is not known to owe nothing");
        let memo = clone.join(crate::layout::STATE_DIR).join(crate::state::WALK_MEMO_FILE);
        assert!(!memo.exists(), "a shallow walk is remembered");
        let unshallow = std::process::Command::new("git")
            .args(["-C", clone.to_str().unwrap(), "fetch", "-q", "--unshallow", "origin"])
            .status()
            .unwrap();
        assert!(unshallow.success());
        let full = Repository::open(&clone).unwrap();
        assert!(!full.is_shallow());
        let owed = Trust::new(&full, ApprovalRule::unsigned("runtime@localhost"))
            .unwrap()
            .remembering(Some(&clone))
            .review_owed(off)
            .unwrap();
        assert!(owed, "the switch-off is judged once the history is there");
    }
}
