//! Which rule judges a commit ([`Trust::rule_in_force`]): the rule its own settings
//! give, unless the change that brought its signers list (or its lack of one) was not
//! approved under the rule before it. Walking back from the commit, the first builder
//! change whose predecessor named another list is that change; a line a merge joined
//! that asks another list is one the tree changed from too ([`Trust::joined_specs`]).
//! Turning signatures on is judged by the new list only the first time: where the
//! history below (its line and the lines joined into it) asked signatures before, and
//! the switch-off was never approved under them, the earlier rule stays in force
//! ([`Trust::signed_before`]).

use super::{write_unsigned_below, Trust};
use crate::review::signing::{AllowedSigners, ApprovalRule, SignerList};
use git2::{Oid, Repository};
use std::collections::HashSet;

/// What [`Trust::signed_before`] found on the line walked from (`line`) and on the lines
/// joined into it (`joined`).
#[derive(Default)]
struct SignedBefore {
    line: Vec<Asked>,
    joined: Vec<Asked>,
}

/// A signers list asked below where signatures were off: `asker` asks `list`, and
/// `left` (the commit above it, or the merge that joined it) asks none.
struct Asked {
    left: Oid,
    list: String,
    asker: Oid,
}

impl<'r> Trust<'r> {
    /// The rule `commit` is judged by, its own settings giving `own`: `own`, unless the
    /// builder change that made the signers list what it is at `commit` (the nearest
    /// one back whose predecessor named another list, or asked no signatures, or
    /// asked them where `commit` does not) has no approval under the predecessor's
    /// rule; then that rule. So neither an unapproved switch-off of signatures nor an
    /// unapproved switch to another list (a new `review.allowed_signers` path in the
    /// repository, or an absolute one the author can write) can vouch for itself: the
    /// new list would otherwise judge the very change that brought it. Turning
    /// signatures on is judged by the new list (the first signed tree, by its own).
    /// Without any signed approval there was nothing signed to leave: `own`.
    /// `root`: where the walk memo lives ([`Trust::remembering`]), if anywhere.
    pub fn rule_in_force(
        repo: &'r Repository,
        commit: Oid,
        own: ApprovalRule,
        root: Option<&std::path::Path>,
    ) -> Result<ApprovalRule, git2::Error> {
        let mut walk = Trust::new(repo, own.clone())?.remembering(root);
        if !walk.approvals.any_signed() {
            return Ok(own);
        }
        let ruled = walk.list_change_rule(commit, own, root);
        walk.save_memo();
        ruled
    }

    /// [`Trust::rule_in_force`] once signed approvals exist: walks back from `commit`
    /// to the builder change that brought its signers list (or its lack of one).
    fn list_change_rule(
        &mut self,
        commit: Oid,
        own: ApprovalRule,
        root: Option<&std::path::Path>,
    ) -> Result<ApprovalRule, git2::Error> {
        let spec = self.settings_facts(commit)?.1;
        let mut changed = commit;
        loop {
            // A line a merge of this run joined: its list is one the tree changed from.
            for (parent, earlier) in self.joined_specs(changed)? {
                if earlier != spec {
                    if let Some(strict) = self.earlier_rule(changed, parent, earlier, spec.as_deref(), &own, root)? {
                        return Ok(strict);
                    }
                }
            }
            let Some(before) = self.step(changed)?.boundary else {
                return Ok(own);
            };
            let earlier = self.settings_facts(before)?.1;
            if earlier == spec {
                changed = before;
                continue;
            }
            return Ok(self
                .earlier_rule(changed, before, earlier, spec.as_deref(), &own, root)?
                .unwrap_or(own));
        }
    }

    /// The rule in force over the change `changed` from `earlier` (the list `from`
    /// asks, or none) to `spec`: [`Trust::strict_unless_approved`]. Where `earlier`
    /// asks no signatures and `spec` does, turning them on is judged by the new list
    /// only if the history below `from` never asked another list, or left each one it
    /// asked through an approval under it ([`Trust::signed_before`]); else that list's
    /// rule, unless `changed` is approved under it.
    fn earlier_rule(
        &mut self,
        changed: Oid,
        from: Oid,
        earlier: Option<String>,
        spec: Option<&str>,
        own: &ApprovalRule,
        root: Option<&std::path::Path>,
    ) -> Result<Option<ApprovalRule>, git2::Error> {
        if earlier.is_some() || spec.is_none() {
            return self.strict_unless_approved(changed, earlier, own, root);
        }
        let found = self.signed_before(from)?;
        let mut left_through_review: Vec<Asked> = Vec::new();
        for (on_line, asked) in found
            .line
            .into_iter()
            .map(|a| (true, a))
            .chain(found.joined.into_iter().map(|a| (false, a)))
        {
            // The same list: the walk of trust judges by it (the approved tree below is
            // trusted, not the one the switch-off left behind).
            if Some(asked.list.as_str()) == spec || (!on_line && self.left_with(&asked, &left_through_review)?) {
                continue;
            }
            if self
                .strict_unless_approved(asked.left, Some(asked.list.clone()), own, root)?
                .is_none()
            {
                left_through_review.push(asked);
                continue;
            }
            if let Some(strict) = self.strict_unless_approved(changed, Some(asked.list), own, root)? {
                return Ok(Some(strict));
            }
        }
        Ok(None)
    }

    /// Whether the list a joined line asked was left through review on the line
    /// walked from, where the two share that list's history: a branch forked while it
    /// was asked (they meet at a commit asking it) and merged after it was left asks it
    /// no more. A list of the same name left on an unrelated line (an orphan history's
    /// own "approved" switch-off) leaves nothing for the joined one.
    fn left_with(&mut self, joined: &Asked, left: &[Asked]) -> Result<bool, git2::Error> {
        for line in left.iter().filter(|l| l.list == joined.list) {
            let base = match self.repo.merge_base(joined.asker, line.left) {
                Ok(b) => b,
                Err(e) if e.code() == git2::ErrorCode::NotFound => continue,
                Err(e) => return Err(e),
            };
            if self.settings_facts(base)?.1.as_deref() == Some(joined.list.as_str()) {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// The signers lists asked below `from`, where no signatures were asked: walking
    /// back from `from` along its first parents, then along every line a merge on the
    /// way joined (stale ones too: asking which are costs more than the walk, each run
    /// walked once), to the nearest commit on each that asks a list (not beyond it).
    /// Each list comes with the commit that left it (the one above, asking none, or the
    /// merge that joined it). None when no list was ever asked; that answer, a fact of
    /// the history, is remembered ([`super::UNSIGNED_BELOW_FILE`]) so later fires stop
    /// at once.
    fn signed_before(&mut self, from: Oid) -> Result<SignedBefore, git2::Error> {
        let mut found = SignedBefore::default();
        if self.memo.as_ref().and_then(|m| m.unsigned) == Some(from) {
            return Ok(found);
        }
        let mut seen = HashSet::new();
        let mut done = HashSet::new();
        let mut joined = Vec::new();
        // `from`'s own line first, so that what it asked is found as its own.
        let mut next = Some((from, from));
        while let Some((c, left)) = next.take() {
            seen.insert(c);
            if let Some(list) = self.settings_facts(c)?.1 {
                found.line.push(Asked { left, list, asker: c });
                break;
            }
            next = self.step(c)?.boundary.map(|b| (b, c));
            joined.extend(self.later_trees(c, &mut done)?.into_iter().map(|(m, p)| (p, m)));
        }
        while let Some((c, left)) = joined.pop() {
            if !seen.insert(c) {
                continue;
            }
            if let Some(list) = self.settings_facts(c)?.1 {
                found.joined.push(Asked { left, list, asker: c });
                continue;
            }
            joined.extend(self.step(c)?.boundary.map(|b| (b, c)));
            joined.extend(self.later_trees(c, &mut done)?.into_iter().map(|(m, p)| (p, m)));
        }
        if found.line.is_empty() && found.joined.is_empty() && !self.shallow_with_approvals() {
            self.mark_unsigned_below(from);
        }
        Ok(found)
    }

    /// Remembers that nothing below `from` asked signatures.
    fn mark_unsigned_below(&mut self, from: Oid) {
        let Some(memo) = self.memo.as_mut().filter(|m| m.unsigned != Some(from)) else {
            return;
        };
        match write_unsigned_below(&memo.root, from) {
            Ok(()) => memo.unsigned = Some(from),
            Err(e) => tracing::warn!(error = %e, "the unsigned-below mark was not remembered"),
        }
    }

    /// The rule of the signers list `earlier` (the one before the change `changed`
    /// made), when no approval under it covers `changed`; `None` when one does, or when
    /// `earlier` asked no signatures (turning them on is judged by the new list: the
    /// first signed tree, by its own).
    fn strict_unless_approved(
        &mut self,
        changed: Oid,
        earlier: Option<String>,
        own: &ApprovalRule,
        root: Option<&std::path::Path>,
    ) -> Result<Option<ApprovalRule>, git2::Error> {
        let Some(list) = earlier else {
            return Ok(None);
        };
        let signers = if std::path::Path::new(&list).is_absolute() {
            match AllowedSigners::load_absolute(std::path::Path::new(&list)) {
                Ok(l) => SignerList::Operator(l),
                // The operator's file cannot be read: no tree holds that path
                // either, so no approval counts (closed, not open).
                Err(_) => SignerList::Repository(list),
            }
        } else {
            SignerList::Repository(list)
        };
        let strict = ApprovalRule {
            runtime_email: own.runtime_email.clone(),
            signers: Some(signers),
        };
        let approved = Trust::new(self.repo, strict.clone())?
            .remembering(root)
            .commit(changed)?
            .approval
            .is_some();
        Ok((!approved).then_some(strict))
    }
}

#[cfg(test)]
mod tests {
    use super::super::owed::tests::commit_on;
    use super::super::tests::approve;
    use super::super::{Judged, UNSIGNED_BELOW_FILE};
    use super::*;
    use crate::review::signing::test_keys::keygen;
    use std::path::{Path, PathBuf};

    const LIST: &str = "settings/allowed_signers";
    const HERS_AT: &str = "settings/her_signers";
    const SETTINGS: &str = crate::layout::SETTINGS_FILE;

    fn signed(list: &str) -> String {
        format!("review:\n  require_signed: true\n  allowed_signers: {list}\n")
    }

    /// `main`: Rev's list asked by its settings and approved by his key; Mallory's
    /// key (in Rev's name) for lists of her own.
    struct Team {
        _dir: tempfile::TempDir,
        repo: Repository,
        rev_key: PathBuf,
        mal_key: PathBuf,
        hers: String,
        main: Oid,
    }

    fn team() -> Option<Team> {
        let dir = tempfile::tempdir().unwrap();
        let (rev_key, rev_pub) = keygen(dir.path(), "rev")?;
        let (mal_key, mal_pub) = keygen(dir.path(), "mallory").unwrap();
        let repo = Repository::init(dir.path().join("r")).unwrap();
        let revs = format!("rev@x.org {rev_pub}");
        let main = commit_on(
            &repo,
            None,
            &[],
            &[(LIST, &revs), (SETTINGS, &signed(LIST)), ("prompts/a.md", "1")],
        );
        approve(&repo, main, &rev_key);
        Some(Team {
            _dir: dir,
            repo,
            rev_key,
            mal_key,
            hers: format!("rev@x.org {mal_pub}"),
            main,
        })
    }

    impl Team {
        /// On `below`, her prompt with signatures turned on by her own list at
        /// another path, approved with her key.
        fn her_change(&self, below: Oid, parents: &[Oid]) -> Oid {
            let change = commit_on(
                &self.repo,
                Some(below),
                parents,
                &[
                    (HERS_AT, &self.hers),
                    (LIST, &self.hers),
                    (SETTINGS, &signed(HERS_AT)),
                    ("prompts/a.md", "EVIL"),
                ],
            );
            approve(&self.repo, change, &self.mal_key);
            change
        }

        /// The verdict on `commit` under the rule in force (its own settings asking
        /// her list), and whether the attack was live: by her own rule it counts.
        fn judged(&self, commit: Oid, root: Option<&Path>) -> (Judged, bool) {
            let own = ApprovalRule {
                runtime_email: "runtime@localhost".into(),
                signers: Some(SignerList::Repository(HERS_AT.into())),
            };
            let live = Trust::new(&self.repo, own.clone())
                .unwrap()
                .commit(commit)
                .unwrap()
                .approval
                .is_some();
            let ruled = Trust::rule_in_force(&self.repo, commit, own, root).unwrap();
            (Trust::new(&self.repo, ruled).unwrap().commit(commit).unwrap(), live)
        }
    }

    /// A direct commit turns signatures off (no approval), and her change on top turns
    /// them on again with her own list at another path: Rev's list stays in force.
    /// Once Rev approves the switch-off, signatures were left through review, and
    /// turning them on is judged by the new list, as the first time.
    #[test]
    fn signatures_switched_off_without_approval_then_on_with_another_list_stay_under_the_earlier_list() {
        let Some(t) = team() else { return };
        let off = commit_on(&t.repo, Some(t.main), &[t.main], &[(SETTINGS, "version: 1\n")]);
        let change = t.her_change(off, &[off]);
        let (judged, live) = t.judged(change, None);
        assert!(live);
        assert!(judged.approval.is_none(), "{:?}", judged.rejected);
        approve(&t.repo, off, &t.rev_key);
        assert!(t.judged(change, None).0.approval.is_some());
    }

    /// Signatures left through review (Rev approves the switch-off), a branch forked
    /// while they were asked merged after, then turned on again with a new list: that
    /// is their first use again, judged by the new list. And the same left without an
    /// approval, with a stale branch of the switch-off merged between: the switch-off
    /// is found on the line itself (walked before any joined line), and Rev's list
    /// stays the rule.
    #[test]
    fn signatures_left_through_review_are_not_asked_again_by_a_branch_forked_before() {
        let Some(t) = team() else { return };
        let feature = commit_on(&t.repo, Some(t.main), &[t.main], &[("prompts/b.md", "feature")]);
        let off = commit_on(&t.repo, Some(t.main), &[t.main], &[(SETTINGS, "version: 1\n")]);
        approve(&t.repo, off, &t.rev_key);
        let merge = commit_on(&t.repo, Some(off), &[off, feature], &[("prompts/b.md", "feature")]);
        let on = t.her_change(merge, &[merge]);
        let (judged, _) = t.judged(on, None);
        assert!(judged.approval.is_some(), "{:?}", judged.rejected);

        let off = commit_on(&t.repo, Some(t.main), &[t.main], &[(SETTINGS, "version: 2\n")]);
        let stale = commit_on(&t.repo, Some(off), &[off], &[("docs/x.md", "x")]);
        let hers = commit_on(&t.repo, Some(off), &[off], &[("prompts/a.md", "mine")]);
        let merge = commit_on(&t.repo, Some(hers), &[hers, stale], &[]);
        let change = t.her_change(merge, &[merge]);
        let (judged, live) = t.judged(change, None);
        assert!(live);
        assert!(judged.approval.is_none(), "{:?}", judged.rejected);
    }

    /// A decoy on her orphan line: it asks Rev's list path with her key in it, and
    /// switches signatures off with an approval by her key (so "left through
    /// review" on a line of her own), then joins `main` and turns signatures on with
    /// her list elsewhere (helper-48's finding): `main`'s list was never left where
    /// the two lines share history (they share none), so it stays the rule.
    #[test]
    fn a_list_left_on_an_unrelated_line_is_still_asked_by_the_line_that_asked_it() {
        let Some(t) = team() else { return };
        let decoy = commit_on(
            &t.repo,
            None,
            &[],
            &[(LIST, &t.hers), (SETTINGS, &signed(LIST)), ("prompts/a.md", "O")],
        );
        approve(&t.repo, decoy, &t.mal_key);
        let off = commit_on(&t.repo, Some(decoy), &[decoy], &[(SETTINGS, "version: 1\n")]);
        approve(&t.repo, off, &t.mal_key);
        let merge = commit_on(&t.repo, Some(off), &[off, t.main], &[("prompts/a.md", "M")]);
        let change = t.her_change(merge, &[merge]);
        let (judged, live) = t.judged(change, None);
        assert!(live);
        assert!(judged.approval.is_none(), "{:?}", judged.rejected);
    }

    /// Her orphan line (no signatures) merged over `main` (`git commit-tree <tree>
    /// -p <orphan> -p main`), her change turning them on with her own list on top:
    /// Rev's list, which the merge joined, is the rule in force.
    #[test]
    fn signatures_turned_on_above_a_merge_of_an_orphan_line_are_judged_by_the_joined_list() {
        let Some(t) = team() else { return };
        let orphan = commit_on(&t.repo, None, &[], &[(SETTINGS, "version: 1\n"), ("prompts/a.md", "O")]);
        let merge = commit_on(&t.repo, Some(orphan), &[orphan, t.main], &[]);
        let change = t.her_change(merge, &[merge]);
        let (judged, live) = t.judged(change, None);
        assert!(live);
        assert!(judged.approval.is_none(), "{:?}", judged.rejected);
    }

    /// Her line asks her list from an approved root of its own, and joins a line
    /// with no signatures that had joined `main`: the signatures `main` asked are
    /// found through the line between.
    #[test]
    fn a_signed_line_joined_through_an_unsigned_one_keeps_its_rule() {
        let Some(t) = team() else { return };
        let unsigned = commit_on(&t.repo, None, &[], &[(SETTINGS, "version: 1\n"), ("prompts/a.md", "N")]);
        let between = commit_on(&t.repo, Some(unsigned), &[unsigned, t.main], &[]);
        let root = commit_on(
            &t.repo,
            None,
            &[],
            &[
                (HERS_AT, &t.hers),
                (LIST, &t.hers),
                (SETTINGS, &signed(HERS_AT)),
                ("prompts/a.md", "P"),
            ],
        );
        approve(&t.repo, root, &t.mal_key);
        let merge = commit_on(&t.repo, Some(root), &[root, between], &[("prompts/a.md", "EVIL")]);
        approve(&t.repo, merge, &t.mal_key);
        let (judged, live) = t.judged(merge, None);
        assert!(live);
        assert!(judged.approval.is_none(), "{:?}", judged.rejected);
    }

    /// Turning signatures on for the first time is judged by the new list, and that
    /// nothing below asked any is remembered: a mark naming where the walk began is
    /// read back (proven on the attack of the switch-off above, which it hides).
    #[test]
    fn the_first_signatures_are_judged_by_their_own_list_and_remembered() {
        let Some(t) = team() else { return };
        let root = t.repo.path().parent().unwrap().to_path_buf();
        std::fs::create_dir_all(root.join(crate::layout::STATE_DIR)).unwrap();
        let unsigned = commit_on(&t.repo, None, &[], &[(SETTINGS, "version: 1\n"), ("prompts/a.md", "0")]);
        let first = t.her_change(unsigned, &[unsigned]);
        let (judged, _) = t.judged(first, Some(&root));
        assert!(judged.approval.is_some(), "{:?}", judged.rejected);
        let mark = root.join(crate::layout::STATE_DIR).join(UNSIGNED_BELOW_FILE);
        assert_eq!(
            std::fs::read_to_string(&mark).unwrap(),
            format!("unsigned-below 1 {unsigned}\n")
        );
        let off = commit_on(&t.repo, Some(t.main), &[t.main], &[(SETTINGS, "version: 1\n")]);
        let change = t.her_change(off, &[off]);
        assert!(t.judged(change, Some(&root)).0.approval.is_none());
        std::fs::write(&mark, format!("unsigned-below 1 {off}\n")).unwrap();
        assert!(
            t.judged(change, Some(&root)).0.approval.is_some(),
            "the mark was not read"
        );
    }
}
