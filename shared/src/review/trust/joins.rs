//! Merges that join another line of history ([`super::Step::joined`]): a later
//! parent whose builder tree is not the merge's. The first-parent walk judges a tree
//! by the list its own line trusts; a merge whose first parent is an orphan history
//! (`git commit-tree <tree> -p <orphan> -p origin/main`) would bring a root of trust of
//! its own, its list trusted on first use, and a rule of its own (signatures off).
//! So the lines such a merge joined judge the tree too, and every tree above it whose
//! walk passes over it ([`super::lines`]): an approval counts only when the list each
//! of them trusts accepts it ([`Trust::joins_accept`]), and a signers list or rule
//! there is one the tree changed from ([`Trust::joined_specs`]). A line that made no
//! builder change since it forked from the first parent's history is not one
//! ([`Trust::judged_on_first_line`]): a stale feature branch adds nothing.

use super::lines::{ready, Line, Pending};
use super::{Judged, Step, Trust};
use git2::Oid;
use std::collections::HashSet;
use std::rc::Rc;

/// The lines joined in a run, each as its merge and later parent.
pub(super) type Joined = Rc<Vec<(Oid, Oid)>>;

/// Why a joined line refuses a tree's approvals.
struct Refused(Vec<String>);

/// The merges on the way to a joined line, the nearest first: a list each line
/// found below shares with the way to it, so d nested joins hold d links, not d².
#[derive(Clone, Default)]
struct Way(Option<Rc<(Oid, Way)>>);

impl Way {
    /// This way, on through `merge`.
    fn through(&self, merge: Oid) -> Way {
        Way(Some(Rc::new((merge, self.clone()))))
    }

    /// The merges on the way, the nearest first.
    fn merges(&self) -> impl Iterator<Item = Oid> + '_ {
        std::iter::successors(self.0.as_deref(), |(_, outer)| outer.0.as_deref()).map(|(m, _)| *m)
    }
}

impl Drop for Way {
    /// Unlinks the list from the nearest merge on, without recursion (a crafted
    /// nesting may be deep).
    fn drop(&mut self) {
        let mut next = self.0.take();
        while let Some(link) = next {
            next = match Rc::try_unwrap(link) {
                Ok((_, mut outer)) => outer.0.take(),
                Err(_) => None,
            };
        }
    }
}

/// A joined line to ask: its merge, its later parent, and the way to the merge.
type Ask = (Oid, Oid, Way);

/// What one judgement has asked already: the joined lines (merge and later parent),
/// and the runs and merges whose joined lines it gathered while walking them.
#[derive(Default)]
struct Seen {
    lines: HashSet<(Oid, Oid)>,
    runs: HashSet<Oid>,
    merges: HashSet<Oid>,
}

impl Refused {
    /// `judged`, its approval refused for these reasons.
    fn onto(self, judged: Judged) -> Judged {
        judged.refused(self.0)
    }
}

/// How many commits below a fire's HEAD (or a merge asked) [`Trust::unanswered_run_joins`]
/// looks for a covered one before asking the next merge of the run.
const ANSWERED_WITHIN: usize = 8;

/// Whether a merge joins another line ([`Trust::merge_joins`]).
pub(super) enum MergeJoins {
    Yes,
    No,
    /// Not known until the step of this later parent (holding the merge's own builder
    /// tree) is.
    Learn(Oid),
}

/// Whether a later parent holding its merge's own builder tree, whose step is
/// `theirs`, brings another line than the first parent, whose run ends at
/// `boundary`: its own run ends elsewhere (its walk goes down another history), or it
/// joins another line itself. The sync merge of a cron box (its records over the
/// branch's, both on the same builder change) does neither. Two boxes that update by
/// a bare `git pull` each take a builder change by a merge of their own, so their
/// later sync merges are other lines; a fire asks only its new one, and the other
/// box's tip is judged once ([`Trust::commit`]).
fn other_line(theirs: Step, boundary: Option<Oid>) -> bool {
    theirs.boundary != boundary || theirs.joined.is_some()
}

impl Trust<'_> {
    /// Whether a merge of builder tree `tree`, its first parent with its step `below`
    /// (`None`: a shallow clone lacks it) and its later parents `later`, joins another
    /// line in its own run's sense ([`Trust::joined_lines`]): its first parent has
    /// another builder tree (it took its tree from a later parent), a later parent
    /// has, or a later parent with its tree brings another line ([`other_line`]). A
    /// parent a shallow clone lacks is none.
    pub(super) fn merge_joins(
        &mut self,
        tree: Oid,
        below: Option<(Oid, Step)>,
        later: &[Oid],
    ) -> Result<MergeJoins, git2::Error> {
        let boundary = match below {
            Some((_, s)) if s.tree != tree => return Ok(MergeJoins::Yes),
            Some((_, s)) => s.boundary,
            None => None,
        };
        for parent in later {
            match self.present_tree(*parent)? {
                Some(theirs) if theirs != tree => return Ok(MergeJoins::Yes),
                Some(_) => match self.remembered(*parent) {
                    Some(theirs) if other_line(theirs, boundary) => return Ok(MergeJoins::Yes),
                    Some(_) => {}
                    None => return Ok(MergeJoins::Learn(*parent)),
                },
                None => {}
            }
        }
        Ok(MergeJoins::No)
    }

    /// The lines joined in the run of `commit` (from it down to its boundary), each as
    /// its merge and later parent: with `every`, every later parent of every merge (the
    /// runs a walk passes over); else those of merges whose tree is not their first
    /// parent's (the merge took it from a later parent), later parents whose builder
    /// tree is not the merge's, and later parents with the merge's tree that bring
    /// another line ([`other_line`]: a history pushed straight onto the branch and
    /// merged under an orphan line of the same tree). That is the judged commit's own
    /// run: the sync merges of a cron box, every tree and boundary the same, cost
    /// nothing.
    /// Remembered per commit.
    pub(super) fn joined_lines(&mut self, commit: Oid, every: bool) -> Result<Joined, git2::Error> {
        if let Some(known) = self.run_joins.get(&(commit, every)) {
            return Ok(known.clone());
        }
        let out = Rc::new(self.run_joins_until(commit, every, |_, _| false)?);
        self.run_joins.insert((commit, every), out.clone());
        Ok(out)
    }

    /// [`Trust::joined_lines`], not remembered, stopping at the first merge for which
    /// `stop` answers true.
    fn run_joins_until(
        &mut self,
        commit: Oid,
        every: bool,
        mut stop: impl FnMut(&Self, Oid) -> bool,
    ) -> Result<Vec<(Oid, Oid)>, git2::Error> {
        let step = self.step(commit)?;
        let mut out = Vec::new();
        let mut next = if every { step.merge } else { step.joined };
        while let Some(merge) = next.filter(|m| !stop(self, *m)) {
            self.merges_met += 1;
            let found = self.repo.find_commit(merge)?;
            // A merge whose tree is not its first parent's took it from a later parent:
            // every later parent is a line it joined, whatever its tree.
            let took = !every && self.present_tree(found.parent_id(0)?)? != Some(step.tree);
            for parent in found.parent_ids().skip(1) {
                let joins = match self.present_tree(parent)? {
                    None => false,
                    Some(theirs) if every || took || theirs != step.tree => true,
                    Some(_) => other_line(self.step(parent)?, step.boundary),
                };
                if joins {
                    out.push((merge, parent));
                }
            }
            let Some((_, below)) = self.below_in_run(merge, step.tree)? else {
                break;
            };
            next = if every { below.merge } else { below.joined };
        }
        Ok(out)
    }

    /// `judged` (the verdict on `tree` of `own` by the list its line trusts), held to
    /// the list every joined line trusts: the lines joined in the run of `own_run`, in
    /// every run the walks of `lines` passed over, and, the same way, in every run
    /// each joined line's walk passes over. The approval counts only when each of them
    /// accepts it, but for a line with no covered commit (no list to ask), one that
    /// trusts what `lines` trust, one whose trust a merge on the way to it replaced
    /// through review ([`Trust::trusted_on_first_line`]), and a stale one
    /// ([`Trust::judged_on_first_line`], asked last: it costs a merge base).
    pub(super) fn joins_accept(
        &mut self,
        tree: Oid,
        own_run: Option<Oid>,
        lines: &[Line],
        own: Oid,
        judged: Judged,
    ) -> Result<Pending<Judged>, git2::Error> {
        let firsts: Vec<Oid> = lines.iter().filter_map(|l| l.trusted).collect();
        if let Some(run) = own_run {
            let asked = self.unanswered_run_joins(run)?;
            let todo = asked.iter().map(|(m, p)| (*m, *p, Way::default())).collect();
            if let Some(refused) = ready!(self.joined_refuse(tree, todo, &firsts, own, &mut Seen::default())) {
                return Ok(Pending::Ready(refused.onto(judged)));
            }
            // Asked on the run's own line alone (no other line's list excusing one), the
            // merges answer for the run's newer commits ([`Trust::unanswered_run_joins`]).
            let step = self.step(run)?;
            if let [line] = lines {
                if line.start == step.boundary && tree == step.tree {
                    self.answered.extend(asked.iter().map(|(m, _)| *m));
                }
            }
        }
        // The walks' part is the same for every commit of a run, fire after fire:
        // remembered per walk while the approvals stay as they are.
        if let [line] = lines {
            if self.remembered_clear(line.start, tree) == Some(true) {
                return Ok(Pending::Ready(judged));
            }
            let refused = ready!(self.passed_refuse(tree, *line, own));
            self.remember_clear(line.start, tree, refused.is_none());
            return Ok(Pending::Ready(match refused {
                Some(refused) => Refused(refused.to_vec()).onto(judged),
                None => judged,
            }));
        }
        let mut todo = Vec::new();
        let mut passed = Seen::default();
        for line in lines {
            self.passed_joins(*line, &Way::default(), &mut passed, &mut todo)?;
        }
        let refused = ready!(self.joined_refuse(tree, todo, &firsts, own, &mut Seen::default()));
        Ok(Pending::Ready(match refused {
            Some(refused) => refused.onto(judged),
            None => judged,
        }))
    }

    /// The lines joined in the run of `commit` in its own run's sense
    /// ([`Trust::joined_lines`]) that no covered commit of the run answers for: below
    /// a covered commit of the run, the lines joined accepted this same tree, judged
    /// by the same walk. So a fire asks the lines its new merge joined, not every one
    /// since the last builder change (the last fire's HEAD, a few commits below, is
    /// covered: [`Trust::commit`] remembers it). A merge the verdict on an older
    /// commit of the run asked ([`Trust::answered`]) answers for itself and the rest.
    fn unanswered_run_joins(&mut self, commit: Oid) -> Result<Vec<(Oid, Oid)>, git2::Error> {
        // The commit below which the run is still to ask: the top, then each merge
        // asked. A covered commit just below it answers for the rest (or is the run's
        // boundary: no merge of the run lies below it).
        let mut lowest = commit;
        self.run_joins_until(commit, false, |t, merge| {
            if t.answered.contains(&merge) || (merge != lowest && t.answered_below(lowest, Some(merge))) {
                return true;
            }
            lowest = merge;
            false
        })
    }

    /// The later parents with the builder tree `tree` of the merges the run of
    /// `commit` still asks ([`Trust::unanswered_run_joins`]): each one covered answers
    /// for its whole line ([`Trust::joined_refuse`]), so [`Trust::cover_each`] judges
    /// them before `commit` (a cron box's sync merge then asks the other box's tip,
    /// judged once, not its run).
    pub(super) fn same_tree_later_parents(&mut self, commit: Oid, tree: Oid) -> Result<Vec<Oid>, git2::Error> {
        let mut out = Vec::new();
        for (_, parent) in self.unanswered_run_joins(commit)? {
            if self.step(parent)?.tree == tree {
                out.push(parent);
            }
        }
        Ok(out)
    }

    /// Whether a commit at most [`ANSWERED_WITHIN`] first parents below `commit`, and
    /// not below `to`, is known to be covered: the last fires' commits lie just below
    /// a fire's HEAD.
    fn answered_below(&self, commit: Oid, to: Option<Oid>) -> bool {
        let first = |c: Oid| self.repo.find_commit(c).ok().and_then(|c| c.parent_id(0).ok());
        let mut next = first(commit);
        for _ in 0..ANSWERED_WITHIN {
            match next {
                Some(c) if self.covered.get(&c) == Some(&true) => return true,
                Some(c) if Some(c) != to => next = first(c),
                _ => return false,
            }
        }
        false
    }

    /// Why the lines joined in the runs `line` passed over (and, the same way, in the
    /// runs each one's walk passes over) refuse the approvals of `tree`, if they do.
    /// The runs are asked oldest first, as one judgement would ask them, and answers
    /// are remembered per run, each for the runs from there down
    /// ([`Trust::passed_clear`]): the walk below a run is the same whichever commit
    /// above it is judged, so a chain of k builder changes alternating between a few
    /// trees costs k run answers, not k² ([`Trust::joins_accept`]). A chain of k
    /// distinct trees still asks k²/2 runs (no tree is asked twice), in time only.
    fn passed_refuse(
        &mut self,
        tree: Oid,
        line: Line,
        own: Oid,
    ) -> Result<Pending<Option<Rc<Vec<String>>>>, git2::Error> {
        let (fresh, known) = self.passed_runs_until(line, |t, run| t.passed_clear.contains_key(&(run, tree)))?;
        let below = known.and_then(|run| self.passed_clear.get(&(run, tree)).cloned().flatten());
        self.runs_asked += fresh.len();
        if let Some(refused) = below {
            if let Some(start) = fresh.first() {
                self.passed_clear.insert((*start, tree), Some(refused.clone()));
            }
            return Ok(Pending::Ready(Some(refused)));
        }
        let firsts: Vec<Oid> = line.trusted.into_iter().collect();
        let mut seen = Seen::default();
        for (n, run) in fresh.iter().enumerate().rev() {
            let todo = self
                .joined_lines(*run, true)?
                .iter()
                .map(|(m, p)| (*m, *p, Way::default()))
                .collect();
            let answer = ready!(self.joined_refuse(tree, todo, &firsts, own, &mut seen)).map(|r| Rc::new(r.0));
            // Remembered at the oldest run asked, where a refusal was found, and at
            // the walk's start (a refusal below is one for every run above it): two
            // answers a judgement, however many runs it passed. A later walk passing
            // the start stops there; one starting between them asks down to the other.
            let found = answer.is_some() || n == fresh.len() - 1;
            if found || n == 0 {
                self.passed_clear.insert((*run, tree), answer.clone());
            }
            if answer.is_some() {
                self.passed_clear.insert((fresh[0], tree), answer.clone());
                return Ok(Pending::Ready(answer));
            }
        }
        Ok(Pending::Ready(None))
    }

    /// The first joined line of `todo` (and, the same way, of the runs each one's walk
    /// passes over) whose trusted list refuses the approvals of `tree`, if any
    /// ([`Trust::joins_accept`]).
    fn joined_refuse(
        &mut self,
        tree: Oid,
        mut todo: Vec<Ask>,
        firsts: &[Oid],
        own: Oid,
        seen: &mut Seen,
    ) -> Result<Pending<Option<Refused>>, git2::Error> {
        while let Some((merge, parent, outer)) = todo.pop() {
            if !seen.lines.insert((merge, parent)) {
                continue;
            }
            // A later parent holding the judged tree known to be covered answers for
            // its whole line: its walk's list and every line joined on the way
            // accepted this same tree, asked from it with no way (the strictest).
            if self.covered.get(&parent) == Some(&true) && self.step(parent)?.tree == tree {
                continue;
            }
            let line = ready!(self.walk_line(Some(parent), tree));
            let way = outer.through(merge);
            self.passed_joins(line, &way, seen, &mut todo)?;
            let Some(trusted) = line.trusted.filter(|t| !firsts.contains(t)) else {
                continue;
            };
            // The cheap, remembered verdict first: each merge on the way costs a
            // question to the commit graph.
            let other = self.judge_tree(tree, Some(trusted), own);
            if other.approval.is_some() || self.replaced_on_the_way(&way, trusted)? {
                continue;
            }
            if ready!(self.stale(merge, parent, trusted)) {
                continue;
            }
            let mut rejected = other.rejected;
            rejected.push(format!(
                "a merge in its history joined the line of {}, whose trusted list (of commit {}) does not accept it",
                crate::text::short_oid(parent),
                crate::text::short_oid(trusted)
            ));
            return Ok(Pending::Ready(Some(Refused(rejected))));
        }
        Ok(Pending::Ready(None))
    }

    /// Adds to `todo` every line joined in the runs `line` passed over that no other
    /// walk of this judgement has passed (the walks are for one tree, so below a run
    /// passed already, the rest of the walk is the same), each with `way`: the merges
    /// on the way to it. Within a run, the merges are gathered down to the first one
    /// gathered already (from a newer commit of the run: the walks of two cron boxes'
    /// merges start at a new commit of the other box's run every time), so each
    /// merge's lines are gathered once a judgement, with the way of the first walk
    /// that met it (the oldest: the judgement asks its lines oldest first).
    fn passed_joins(&mut self, line: Line, way: &Way, seen: &mut Seen, todo: &mut Vec<Ask>) -> Result<(), git2::Error> {
        let (runs, _) = self.passed_runs_until(line, |_, run| seen.runs.contains(&run))?;
        for run in runs {
            seen.runs.insert(run);
            let lines = self.run_joins_until(run, true, |_, merge| !seen.merges.insert(merge))?;
            todo.extend(lines.into_iter().map(|(m, p)| (m, p, way.clone())));
        }
        Ok(())
    }

    /// Whether a merge on the way to a joined line has `trusted` in its first parent's
    /// history ([`Trust::trusted_on_first_line`]).
    fn replaced_on_the_way(&self, way: &Way, trusted: Oid) -> Result<bool, git2::Error> {
        for merge in way.merges() {
            if self.trusted_on_first_line(merge, trusted)? {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether the later parent `parent` of `merge`, whose line trusts `trusted`, is a
    /// stale branch the first parent's line judged: it made no builder change since the
    /// two forked ([`Trust::judged_on_first_line`]), the commit where they meet is
    /// covered, and `trusted` holds that commit's builder tree (so its list is one the
    /// first line judged by). Tree equality alone says nothing of where the parent's
    /// line goes: a merge of `main` keeping an orphan's tree meets the orphan at a
    /// commit no one approved.
    fn stale(&mut self, merge: Oid, parent: Oid, trusted: Oid) -> Result<Pending<bool>, git2::Error> {
        let Some(first) = self.repo.find_commit(merge)?.parent_ids().next() else {
            return Ok(Pending::Ready(false));
        };
        let base = match self.repo.merge_base(first, parent) {
            Ok(b) => b,
            Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(Pending::Ready(false)),
            Err(e) => return Err(e),
        };
        let at_base = self.step(base)?.tree;
        if self.present_tree(parent)? != Some(at_base) || self.step(trusted)?.tree != at_base {
            return Ok(Pending::Ready(false));
        }
        Ok(match self.known_covered(base)? {
            Some(covered) => Pending::Ready(covered),
            None => Pending::After(base),
        })
    }

    /// The merges in the run of `commit` with a later parent of another builder tree,
    /// each with that parent, but those in `done` (met already from another commit of
    /// the run, below which the rest of the run was met too); each one met is added to
    /// `done`.
    pub(super) fn later_trees(&mut self, commit: Oid, done: &mut HashSet<Oid>) -> Result<Vec<(Oid, Oid)>, git2::Error> {
        self.run_joins_until(commit, false, |_, merge| !done.insert(merge))
    }

    /// Whether `trusted` (the approved commit a joined line trusts) is in the history
    /// of `merge`'s first parent too: that line replaced its trust since, through
    /// approved changes (a key rotated, a reviewer added), so it is no other root.
    /// An orphan line's merge never has the branch it joined in its first parent's
    /// history.
    fn trusted_on_first_line(&self, merge: Oid, trusted: Oid) -> Result<bool, git2::Error> {
        let Some(first) = self.repo.find_commit(merge)?.parent_ids().next() else {
            return Ok(false);
        };
        Ok(first == trusted || self.repo.graph_descendant_of(first, trusted)?)
    }

    /// The signers lists (or none) the lines joined in the run of `commit` ask for,
    /// each with its later parent, but those whose trust the first parent's line
    /// replaced through review, and stale ones: for the rule in force, each is one the
    /// tree changed from.
    pub(super) fn joined_specs(&mut self, commit: Oid) -> Result<Vec<(Oid, Option<String>)>, git2::Error> {
        let tree = self.step(commit)?.tree;
        let mut out = Vec::new();
        for (merge, parent) in self.joined_lines(commit, false)?.iter().copied() {
            if let Some(trusted) = self.trusted_from(Some(parent), tree)? {
                if self.trusted_on_first_line(merge, trusted)? || self.settle(|t| t.stale(merge, parent, trusted))? {
                    continue;
                }
            }
            out.push((parent, self.settings_facts(parent)?.1));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::owed::tests::commit_on;
    use super::super::tests::{approve, rule};
    use super::*;
    use crate::review::approvals;
    use crate::review::signing::test_keys::keygen;
    use crate::review::signing::{ApprovalRule, SignerList};
    use git2::Repository;

    const LIST: &str = "settings/allowed_signers";

    /// Rev's list on `main` (approved by his key), and Mallory's key in Rev's name for
    /// lists of her own.
    struct Mallory {
        repo: Repository,
        rev_key: std::path::PathBuf,
        mal_key: std::path::PathBuf,
        hers: String,
        main: Oid,
    }

    /// A records-only commit on `at` (a fire's), with `parents`, unlike every other.
    fn record(repo: &Repository, at: Oid, parents: &[Oid]) -> Oid {
        static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        commit_on(repo, Some(at), parents, &[("runs/t/r.json", &n.to_string())])
    }

    fn mallory(dir: &std::path::Path) -> Option<Mallory> {
        let (rev_key, rev_pub) = keygen(dir, "rev")?;
        let (mal_key, mal_pub) = keygen(dir, "mallory").unwrap();
        let repo = Repository::init(dir.join("r")).unwrap();
        let revs = format!("rev@x.org {rev_pub}");
        let main = commit_on(&repo, None, &[], &[(LIST, &revs), ("prompts/a.md", "1")]);
        approve(&repo, main, &rev_key);
        Some(Mallory {
            repo,
            rev_key,
            mal_key,
            hers: format!("rev@x.org {mal_pub}"),
            main,
        })
    }

    /// An orphan line holding Mallory's key as Rev's, merged over the reviewed branch
    /// as its first parent (`git commit-tree <tree> -p <orphan> -p main`), its tree
    /// approved with her key: by its own line's list (trusted on first use, or by a
    /// planted approved root of its own) the approval counts; the branch it joined
    /// trusts Rev's list, which does not accept it.
    #[test]
    fn a_merge_of_an_orphan_line_is_judged_by_the_list_of_the_line_it_joined() {
        let dir = tempfile::tempdir().unwrap();
        let Some(Mallory {
            repo,
            rev_key: _,
            mal_key,
            hers,
            main,
        }) = mallory(dir.path())
        else {
            return;
        };
        // Straight onto the orphan, and with an approved root of her own below it.
        let orphan = commit_on(&repo, None, &[], &[(LIST, &hers), ("prompts/a.md", "EVIL")]);
        let planted = commit_on(&repo, None, &[], &[(LIST, &hers), ("prompts/a.md", "mine")]);
        approve(&repo, planted, &mal_key);
        let on_planted = commit_on(&repo, Some(planted), &[planted], &[("prompts/a.md", "EVIL 2")]);
        for line in [orphan, on_planted] {
            // `git commit-tree <line's tree> -p <line> -p main`.
            let merge = commit_on(&repo, Some(line), &[line, main], &[]);
            approve(&repo, merge, &mal_key);
            // The attack is live: the merge's own line trusts her list.
            let own = Trust::new(&repo, rule()).unwrap().commit(line).unwrap();
            assert!(matches!(
                own.by,
                super::super::JudgedBy::Bootstrap(_) | super::super::JudgedBy::Trusted(_)
            ));
            let judged = Trust::new(&repo, rule()).unwrap().commit(merge).unwrap();
            assert!(judged.approval.is_none(), "{:?}", judged.rejected);
            assert!(
                judged.rejected.iter().any(|r| r.contains("joined the line")),
                "{:?}",
                judged.rejected
            );
        }
    }

    /// The merge of an orphan line with builder changes on top of it (her prompt,
    /// approved with her key): the top commit's walk passes over the merge, whose
    /// joined line's list judges it as it judges the merge. So does a second orphan
    /// merged over that whole history (nested).
    #[test]
    fn a_change_on_top_of_a_merge_of_an_orphan_line_is_judged_by_the_list_of_the_line_it_joined() {
        let dir = tempfile::tempdir().unwrap();
        let Some(Mallory {
            repo,
            rev_key: _,
            mal_key,
            hers,
            main,
        }) = mallory(dir.path())
        else {
            return;
        };
        let orphan = commit_on(&repo, None, &[], &[(LIST, &hers), ("prompts/a.md", "O")]);
        let planted = commit_on(&repo, None, &[], &[(LIST, &hers), ("prompts/a.md", "P")]);
        approve(&repo, planted, &mal_key);
        let on_planted = commit_on(&repo, Some(planted), &[planted], &[("prompts/a.md", "P2")]);
        let judged = |at: Oid| Trust::new(&repo, rule()).unwrap().commit(at).unwrap();
        let refused = |at: Oid| {
            let j = judged(at);
            assert!(j.approval.is_none(), "{:?}", j.rejected);
            assert!(
                j.rejected.iter().any(|r| r.contains("joined the line")),
                "{:?}",
                j.rejected
            );
        };
        for line in [orphan, on_planted] {
            let merge = commit_on(&repo, Some(line), &[line, main], &[]);
            let change = commit_on(&repo, Some(merge), &[merge], &[("prompts/a.md", "EVIL")]);
            let records = commit_on(&repo, Some(change), &[change], &[("runs/t/1.json", "{}")]);
            approve(&repo, change, &mal_key);
            // The attack is live: by her line's own list the approval counts, and the
            // walk from `change` finds no joined merge in its own run.
            assert!(Trust::new(&repo, rule())
                .unwrap()
                .judge_tree(judged(change).tree, None, change)
                .approval
                .is_some());
            assert_eq!(Trust::new(&repo, rule()).unwrap().step(change).unwrap().joined, None);
            refused(change);
            refused(records);
            // Nested: a second orphan merged over the whole of it, and a change on top.
            let second = commit_on(&repo, None, &[], &[(LIST, &hers), ("prompts/a.md", "O2")]);
            let outer = commit_on(&repo, Some(second), &[second, records], &[]);
            let top = commit_on(&repo, Some(outer), &[outer], &[("prompts/a.md", "EVIL 2")]);
            approve(&repo, top, &mal_key);
            refused(top);
        }
    }

    /// Her orphan line with a root approved by her key, merged with `main` as a later
    /// parent whose builder tree the merge takes whole (`git commit-tree main^{tree}
    /// -p <orphan> -p main`, helper-48's finding), her change on top: the merge is
    /// uncovered (her line's list rejects Rev's approval of main's tree), so her
    /// change's walk passes over it, and the line it joined judges her change,
    /// whatever the trees. So with a third parent of hers (octopus), and with her line
    /// taking main's tree itself before the merge (every tree the same).
    #[test]
    fn a_merge_taking_mains_tree_over_an_orphan_line_still_answers_to_main() {
        let dir = tempfile::tempdir().unwrap();
        let Some(Mallory {
            repo,
            rev_key: _,
            mal_key,
            hers,
            main,
        }) = mallory(dir.path())
        else {
            return;
        };
        let root = commit_on(&repo, None, &[], &[(LIST, &hers), ("prompts/a.md", "O")]);
        approve(&repo, root, &mal_key);
        let x = commit_on(&repo, Some(root), &[root], &[("prompts/x.md", "x")]);
        let same = commit_on(&repo, Some(main), &[root], &[]);
        for parents in [vec![root, main], vec![root, x, main], vec![same, main]] {
            let merge = commit_on(&repo, Some(main), &parents, &[]);
            let evil = commit_on(&repo, Some(merge), &[merge], &[(LIST, &hers), ("prompts/a.md", "EVIL")]);
            approve(&repo, evil, &mal_key);
            // The attack is live: the walk passes over the merge to her root.
            let mut trust = Trust::new(&repo, rule()).unwrap();
            let judged = trust.commit(evil).unwrap();
            assert!(!trust.covered(merge).unwrap());
            assert!(matches!(judged.by, super::super::JudgedBy::Trusted(t) if t == root || t == same));
            assert!(judged.approval.is_none(), "{parents:?}: {:?}", judged.rejected);
        }
    }

    /// A feature branch that merged `main` before `main` rotated Rev's key out for
    /// Carol's, landed after with Carol's approval: inside the feature's line, the
    /// back-merge joined `main` when it trusted Rev's list, but the landing merge's
    /// first parent has replaced that trust through review (helper-48's finding), so
    /// Carol's approval counts.
    #[test]
    fn a_back_merge_before_a_key_rotation_does_not_block_the_landing_approved_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let Some((rev_key, rev_pub)) = keygen(dir.path(), "rev") else {
            return;
        };
        let (carol_key, carol_pub) = keygen(dir.path(), "carol").unwrap();
        let repo = Repository::init(dir.path().join("r")).unwrap();
        let revs = format!("rev@x.org {rev_pub}");
        let carols = format!("rev@x.org {carol_pub}");
        let c0 = commit_on(
            &repo,
            None,
            &[],
            &[(LIST, &revs), ("prompts/a.md", "1"), ("prompts/b.md", "1")],
        );
        approve(&repo, c0, &rev_key);
        let f1 = commit_on(&repo, Some(c0), &[c0], &[("prompts/b.md", "2")]);
        let m1 = commit_on(&repo, Some(c0), &[c0], &[("prompts/a.md", "2")]);
        approve(&repo, m1, &rev_key);
        let back = commit_on(&repo, Some(m1), &[f1, m1], &[("prompts/b.md", "2")]);
        let rotated = commit_on(&repo, Some(m1), &[m1], &[(LIST, &carols)]);
        approve(&repo, rotated, &rev_key);
        let landed = commit_on(&repo, Some(rotated), &[rotated, back], &[("prompts/b.md", "2")]);
        approve(&repo, landed, &carol_key);
        let judged = Trust::new(&repo, rule()).unwrap().commit(landed).unwrap();
        assert!(judged.approval.is_some(), "{:?}", judged.rejected);
    }

    /// A history rewritten from scratch with a root of her own approved by her key
    /// (force-pushed over the branch), her change on top: it trusts her root, not the
    /// approved tree of the branch it arrives over, and does not descend from it, so
    /// that tree's list judges it too (helper-48's finding 8).
    #[test]
    fn an_unrelated_history_with_a_root_of_its_own_answers_to_the_branch_it_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let Some(Mallory {
            repo,
            rev_key,
            mal_key,
            hers,
            main,
        }) = mallory(dir.path())
        else {
            return;
        };
        let root = commit_on(&repo, None, &[], &[(LIST, &hers), ("prompts/a.md", "O")]);
        approve(&repo, root, &mal_key);
        let evil = commit_on(&repo, Some(root), &[root], &[("prompts/a.md", "EVIL")]);
        approve(&repo, evil, &mal_key);
        // The attack is live: on its own, the rewritten history counts.
        assert!(Trust::new(&repo, rule())
            .unwrap()
            .commit(evil)
            .unwrap()
            .approval
            .is_some());
        let judged = Trust::new(&repo, rule()).unwrap().incoming(evil, main).unwrap();
        assert!(judged.approval.is_none(), "{:?}", judged.rejected);
        // Rev's own approval of her tree counts by the branch's list: reviewed.
        approve(&repo, evil, &rev_key);
        assert!(Trust::new(&repo, rule())
            .unwrap()
            .incoming(evil, main)
            .unwrap()
            .approval
            .is_some());
    }

    /// helper-49's two ways around the joins, each with her root (her list, approved
    /// by her key) as the merge's first parent. A: a later parent that merged `main`
    /// into an orphan keeping the orphan's tree looks stale (its tree is the one where
    /// it meets her line), but they meet at a commit no one approved, so `main`'s list
    /// judges. B: a later parent on `main` (her tree pushed there directly) whose tree
    /// the merge takes whole. Both refused by the fire and by a sync over `main`; and
    /// so is B with every tree the same (her line takes that tree first), by the fire
    /// alone too (a box that updates by a bare `git pull`): the later parent's line is
    /// another one.
    #[test]
    fn a_later_parent_that_only_looks_stale_or_lends_its_tree_still_answers_to_main() {
        let dir = tempfile::tempdir().unwrap();
        let Some(Mallory {
            repo,
            rev_key: _,
            mal_key,
            hers,
            main,
        }) = mallory(dir.path())
        else {
            return;
        };
        let refused = |at: Oid| {
            let own = Trust::new(&repo, rule()).unwrap().commit(at).unwrap();
            assert!(own.approval.is_none(), "{:?}", own.rejected);
            let synced = Trust::new(&repo, rule()).unwrap().incoming(at, main).unwrap();
            assert!(synced.approval.is_none(), "{:?}", synced.rejected);
        };
        // A.
        let z = commit_on(&repo, None, &[], &[("prompts/z.md", "z")]);
        let p = commit_on(&repo, Some(z), &[main, z], &[]);
        let root = commit_on(&repo, Some(z), &[z], &[(LIST, &hers), ("prompts/a.md", "R")]);
        approve(&repo, root, &mal_key);
        let j = commit_on(&repo, Some(root), &[root, p], &[("prompts/a.md", "EVIL")]);
        approve(&repo, j, &mal_key);
        refused(j);
        // B.
        let pushed = commit_on(&repo, Some(main), &[main], &[(LIST, &hers), ("prompts/a.md", "EVIL B")]);
        let k = commit_on(&repo, Some(pushed), &[root, pushed], &[]);
        approve(&repo, k, &mal_key);
        refused(k);
        // B, every tree the same: the later parent's run ends at another boundary
        // (`main`, where her line's ends at her root), so it is another line.
        let same = commit_on(&repo, Some(pushed), &[root], &[]);
        let k2 = commit_on(&repo, Some(pushed), &[same, pushed], &[]);
        approve(&repo, k2, &mal_key);
        assert_eq!(Trust::new(&repo, rule()).unwrap().step(k2).unwrap().joined, Some(k2));
        refused(k2);
    }

    /// helper-50's DoS-1: a run of 2,000 merges on `main`, each with a fresh records
    /// commit of the same tree as its later parent (no approval needed). Each merge
    /// waits for its later parent's step; the run is walked down once and learned on
    /// from where it waited, not walked again from its top after each later parent
    /// (2,000²/2 commit reads).
    #[test]
    fn a_run_of_merges_waiting_for_their_later_parents_is_walked_once() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path().join("r")).unwrap();
        let main = commit_on(&repo, None, &[], &[("prompts/a.md", "1")]);
        let n = 2000;
        let mut tip = main;
        for i in 0..n {
            let x = commit_on(&repo, Some(main), &[main], &[(&format!("runs/t/x{i}.json"), "{}")]);
            tip = commit_on(&repo, Some(tip), &[tip, x], &[]);
        }
        let mut trust = Trust::new(&repo, rule()).unwrap();
        let step = trust.step(tip).unwrap();
        assert_eq!((step.boundary, step.joined, step.merge), (None, None, Some(tip)));
        assert!(trust.commits_read <= 2 * n + 2, "{}", trust.commits_read);
    }

    /// helper-49's D: her root (her list, approved by her key) merged with `main`, so
    /// `main`'s list refuses what lies above, then a chain of 2,000 builder changes
    /// alternating between two trees she approved. Every commit of the chain is
    /// judged (an approval names its tree), each walk passing over every change below
    /// it; the runs' answers are remembered for the walks above them, so each commit
    /// asks a few runs, not all those below it (k² of them in all).
    #[test]
    fn a_chain_of_alternating_trees_asks_each_run_once() {
        let dir = tempfile::tempdir().unwrap();
        let Some(Mallory {
            repo,
            mal_key,
            hers,
            main,
            ..
        }) = mallory(dir.path())
        else {
            return;
        };
        let root = commit_on(&repo, None, &[], &[(LIST, &hers), ("prompts/a.md", "R")]);
        approve(&repo, root, &mal_key);
        let c1 = commit_on(&repo, Some(root), &[root, main], &[("prompts/a.md", "A")]);
        approve(&repo, c1, &mal_key);
        let c2 = commit_on(&repo, Some(c1), &[c1], &[("prompts/a.md", "B")]);
        approve(&repo, c2, &mal_key);
        let k = 2000;
        let mut tip = c2;
        for n in 0..k {
            tip = commit_on(&repo, Some(tip), &[tip], &[("prompts/a.md", ["A", "B"][n % 2])]);
        }
        let mut trust = Trust::new(&repo, rule()).unwrap();
        let judged = trust.commit(tip).unwrap();
        assert!(judged.approval.is_none());
        assert!(
            judged.rejected.iter().any(|r| r.contains("joined the line")),
            "{:?}",
            judged.rejected
        );
        // A few runs asked per commit, however long the chain (k²/2 without the
        // answers remembered).
        assert!(trust.runs_asked <= 4 * (k + 3), "{}", trust.runs_asked);
    }

    /// Lines joined inside lines 3,000 deep (each merge joins an orphan root's line,
    /// the next merge down as its later parent), under a tree approved on top: each
    /// joined line's walk finds the next, so the way to the deepest passes 3,000
    /// merges. Asked in a thread with a small stack, with the ways shared and dropped
    /// without recursion.
    #[test]
    fn lines_joined_thousands_deep_are_asked_without_recursion() {
        let dir = tempfile::tempdir().unwrap();
        let Some((rev_key, rev_pub)) = keygen(dir.path(), "rev") else {
            return;
        };
        let repo = Repository::init(dir.path().join("r")).unwrap();
        let revs = format!("rev@x.org {rev_pub}");
        let mut tip = commit_on(&repo, None, &[], &[(LIST, &revs), ("prompts/a.md", "0")]);
        for n in 1..=3000 {
            let other = commit_on(&repo, None, &[], &[(LIST, &revs), ("prompts/a.md", &n.to_string())]);
            tip = commit_on(&repo, Some(other), &[other, tip], &[]);
        }
        let top = commit_on(&repo, Some(tip), &[tip], &[("prompts/a.md", "top")]);
        approve(&repo, top, &rev_key);
        let path = repo.path().to_path_buf();
        let judged = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || {
                let repo = Repository::open(path).unwrap();
                let mut trust = Trust::new(&repo, rule()).unwrap();
                let judged = trust.commit(top).unwrap();
                (judged.approval.is_some(), judged.rejected, trust.lines.len())
            })
            .unwrap()
            .join()
            .unwrap();
        assert!(judged.0, "{:?}", judged.1);
        assert!(judged.2 >= 3000, "every nested line was asked: {}", judged.2);
    }

    /// helper-50's DoS-3: that chain with 300 distinct trees, each approved by her
    /// key. Each commit's walk passes every run below it with a tree no other walk
    /// asked; the answers kept are two per judgement, not one per run passed (k²/2).
    #[test]
    fn a_chain_of_distinct_trees_keeps_two_answers_a_judgement() {
        let dir = tempfile::tempdir().unwrap();
        let Some(Mallory {
            repo,
            mal_key,
            hers,
            main,
            ..
        }) = mallory(dir.path())
        else {
            return;
        };
        let root = commit_on(&repo, None, &[], &[(LIST, &hers), ("prompts/a.md", "R")]);
        approve(&repo, root, &mal_key);
        let k = 300;
        let mut tip = commit_on(&repo, Some(root), &[root, main], &[("prompts/a.md", "t0")]);
        approve(&repo, tip, &mal_key);
        for n in 1..k {
            tip = commit_on(&repo, Some(tip), &[tip], &[("prompts/a.md", &format!("t{n}"))]);
            approve(&repo, tip, &mal_key);
        }
        let mut trust = Trust::new(&repo, rule()).unwrap();
        let judged = trust.commit(tip).unwrap();
        assert!(judged.approval.is_none());
        assert!(
            trust.runs_asked >= k * (k - 1) / 2 - k,
            "every run asked: {}",
            trust.runs_asked
        );
        assert!(trust.passed_clear.len() <= 2 * k, "{}", trust.passed_clear.len());
    }

    /// Her tree on two commits of her own line, both on her root (one boundary), one
    /// of them a merge of `main` into her line: a merge of the two with the plain one
    /// first brings `main` in through a later parent whose run ends where the first
    /// parent's does. That run joins `main`'s line, which is not in the first
    /// parent's history, so `main`'s list judges the merge.
    #[test]
    fn a_later_parent_whose_run_merged_main_still_answers_to_main() {
        let dir = tempfile::tempdir().unwrap();
        let Some(Mallory {
            repo,
            mal_key,
            hers,
            main,
            ..
        }) = mallory(dir.path())
        else {
            return;
        };
        let root = commit_on(&repo, None, &[], &[(LIST, &hers), ("prompts/a.md", "R")]);
        approve(&repo, root, &mal_key);
        let f = commit_on(&repo, Some(root), &[root], &[("prompts/a.md", "EVIL")]);
        let p = commit_on(&repo, Some(f), &[root, main], &[]);
        let merge = commit_on(&repo, Some(f), &[f, p], &[]);
        approve(&repo, merge, &mal_key);
        let mut trust = Trust::new(&repo, rule()).unwrap();
        // The later parent's run ends at her root, as the first parent's does.
        assert_eq!(trust.step(p).unwrap().boundary, trust.step(f).unwrap().boundary);
        assert_eq!(trust.step(merge).unwrap().joined, Some(merge));
        let judged = trust.commit(merge).unwrap();
        assert!(judged.approval.is_none(), "{:?}", judged.rejected);
    }

    /// Two cron boxes on `main`, each adding records and merging the other's with a
    /// bare `git pull`, box into box: every merge holds one builder tree and every
    /// parent's run ends at the same boundary, so none joins a line, and the tree is
    /// judged by `main`'s own approval alone. After a builder change that each box
    /// took by a merge of its own, their runs end at different commits: each sync
    /// merge joins the other box's line, and a fire asks only its new one.
    #[test]
    fn the_sync_merges_of_two_cron_boxes_ask_only_the_new_line() {
        let dir = tempfile::tempdir().unwrap();
        let Some(Mallory {
            repo, main, rev_key, ..
        }) = mallory(dir.path())
        else {
            return;
        };
        let records = |at: Oid, parents: &[Oid], n: &str| commit_on(&repo, Some(at), parents, &[("runs/t/r.json", n)]);
        let a1 = records(main, &[main], "a1");
        let b1 = records(main, &[main], "b1");
        let a2 = records(a1, &[a1, b1], "a2");
        let b2 = records(b1, &[b1], "b2");
        let b3 = records(b2, &[b2, a2], "b3");
        let a3 = records(a2, &[a2], "a3");
        let a4 = records(a3, &[a3, b3], "a4");
        let mut trust = Trust::new(&repo, rule()).unwrap();
        for merge in [a2, b3, a4] {
            assert_eq!(trust.step(merge).unwrap().joined, None, "{merge}");
            assert_eq!(trust.step(merge).unwrap().merge, Some(merge), "{merge}");
        }
        assert!(trust.joined_lines(a4, false).unwrap().is_empty());
        assert!(trust.commit(a4).unwrap().approval.is_some());
        // A builder change Rev approved reaches box A by a merge of its own, and box B
        // by merging box A: their runs end at different commits, so each sync merge
        // joins the other box's line. Each is accepted, and a fire asks only its new
        // merge: the last fire's HEAD, a commit below, is covered, and so is the
        // other box's tip once judged.
        let c = commit_on(&repo, Some(main), &[main], &[("prompts/a.md", "2")]);
        approve(&repo, c, &rev_key);
        let ma = commit_on(&repo, Some(c), &[a4, c], &[]);
        let mb = commit_on(&repo, Some(c), &[b3, ma], &[]);
        let a5 = records(ma, &[ma], "a5");
        let b5 = records(mb, &[mb], "b5");
        let a6 = records(a5, &[a5, b5], "a6");
        let b6 = records(b5, &[b5, a6], "b6");
        let a7 = records(a6, &[records(a6, &[a6], "a7r"), b6], "a7");
        let mut trust = Trust::new(&repo, rule()).unwrap();
        assert_eq!(trust.step(a6).unwrap().joined, Some(a6));
        assert!(trust.commit(a6).unwrap().approval.is_some());
        assert_eq!(trust.unanswered_run_joins(a7).unwrap(), vec![(a7, b6)]);
        assert!(!trust.covered.contains_key(&b6));
        assert!(trust.commit(a7).unwrap().approval.is_some());
        assert_eq!(trust.covered.get(&b6), Some(&true));
    }

    /// Two cron boxes that each took a builder change by a merge of their own, then
    /// synced by a bare `git pull` 300 times: a box's first fire with no memos judges
    /// the other box's tips the oldest first, each finding the one before covered
    /// just below, so the walks meet each merge a few times, not once per tip above
    /// it (that was 1.6 s at 1,000 sync merges).
    #[test]
    fn the_first_fire_over_two_boxes_sync_merges_judges_each_tip_once() {
        let dir = tempfile::tempdir().unwrap();
        let Some(Mallory {
            repo, main, rev_key, ..
        }) = mallory(dir.path())
        else {
            return;
        };
        let records = |at: Oid, parents: &[Oid]| record(&repo, at, parents);
        let (a, b) = (records(main, &[main]), records(main, &[main]));
        let c = commit_on(&repo, Some(main), &[main], &[("prompts/a.md", "2")]);
        approve(&repo, c, &rev_key);
        let mut a = commit_on(&repo, Some(c), &[a, c], &[]);
        let mut b = commit_on(&repo, Some(c), &[b, a], &[]);
        let rounds = 300;
        for round in 0..rounds {
            for _ in 0..3 {
                a = records(a, &[a]);
                b = records(b, &[b]);
            }
            if round % 2 == 0 {
                a = records(a, &[a, b]);
            } else {
                b = records(b, &[b, a]);
            }
        }
        let mut trust = Trust::new(&repo, rule()).unwrap();
        assert!(trust.commit(a).unwrap().approval.is_some());
        assert!(trust.merges_met <= 8 * rounds, "{}", trust.merges_met);
    }

    /// helper-52's history: a run of merges of `main` over an approved change, a
    /// record far above each merge (beyond [`ANSWERED_WITHIN`]) taken by a merge of
    /// another line, and a commit joining that line. Each record is judged before
    /// the commit that joined it, and its run is asked down to the merges the record
    /// before it asked ([`Trust::answered`]), not down to the change: the walks meet
    /// each merge a few times, not once per record above it.
    #[test]
    fn records_far_above_the_merges_of_their_run_each_ask_only_their_new_merges() {
        let dir = tempfile::tempdir().unwrap();
        let Some(Mallory {
            repo,
            main,
            rev_key,
            mal_key,
            ..
        }) = mallory(dir.path())
        else {
            return;
        };
        let records = |at: Oid, parents: &[Oid]| record(&repo, at, parents);
        let merges = 300;
        let history = |change: Oid| {
            let (mut k, mut g) = (change, change);
            for _ in 0..merges {
                k = commit_on(&repo, Some(k), &[k, main], &[]);
                for _ in 0..10 {
                    k = records(k, &[k]);
                }
                g = records(g, &[g, k]);
                for _ in 0..9 {
                    k = records(k, &[k]);
                }
            }
            records(change, &[change, g])
        };
        let change = commit_on(&repo, Some(main), &[main], &[("prompts/a.md", "2")]);
        approve(&repo, change, &rev_key);
        let top = history(change);
        // The same over a change her key approved, which `main`'s list refuses: no
        // record is judged before the commit, whose line refuses it at once.
        let hers = commit_on(&repo, Some(main), &[main], &[("prompts/a.md", "3")]);
        approve(&repo, hers, &mal_key);
        let refused = history(hers);
        let mut trust = Trust::new(&repo, rule()).unwrap();
        assert!(trust.commit(top).unwrap().approval.is_some());
        assert!(trust.merges_met <= 8 * merges, "{}", trust.merges_met);
        let mut trust = Trust::new(&repo, rule()).unwrap();
        assert!(trust.commit(refused).unwrap().approval.is_none());
        assert!(trust.merges_met <= 2 * merges, "{}", trust.merges_met);
    }

    /// helper-53's case: the verdict on a commit of a run marks the merges it asked
    /// and accepted ([`Trust::answered`]); a newer merge of the same run joining her
    /// planted root, whose list refuses the tree, is still asked, and refuses.
    #[test]
    fn a_run_answered_below_still_asks_its_newer_merges() {
        let dir = tempfile::tempdir().unwrap();
        let Some(Mallory {
            repo,
            main,
            rev_key,
            mal_key,
            hers,
        }) = mallory(dir.path())
        else {
            return;
        };
        let change = commit_on(&repo, Some(main), &[main], &[("prompts/a.md", "2")]);
        approve(&repo, change, &rev_key);
        let k1 = commit_on(&repo, Some(change), &[change, main], &[]);
        let c1 = record(&repo, k1, &[k1]);
        let planted = commit_on(&repo, None, &[], &[(LIST, &hers), ("prompts/a.md", "mine")]);
        approve(&repo, planted, &mal_key);
        let k2 = commit_on(&repo, Some(c1), &[c1, planted], &[]);
        let c2 = record(&repo, k2, &[k2]);
        // One judge, as `builder audit` judges commit after commit (a judge reads the
        // approvals once, when it is made).
        let mut trust = Trust::new(&repo, rule()).unwrap();
        assert!(trust.commit(c1).unwrap().approval.is_some());
        assert!(trust.answered.contains(&k1));
        let marked = trust.commit(c2).unwrap();
        let fresh = Trust::new(&repo, rule()).unwrap().commit(c2).unwrap();
        for judged in [marked, fresh] {
            assert!(judged.approval.is_none(), "{:?}", judged.rejected);
            assert!(
                judged.rejected.iter().any(|r| r.contains("joined the line")),
                "{:?}",
                judged.rejected
            );
        }
    }

    /// Merges nested 3,000 deep through their later parents, each first parent a root
    /// of its own: learning the tip's step learns every later parent first, from a
    /// stack, so it fits in a thread with a small stack.
    #[test]
    fn merges_nested_through_later_parents_are_learned_without_recursion() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path().join("r")).unwrap();
        let mut tip = commit_on(&repo, None, &[], &[("prompts/a.md", "1")]);
        for n in 0..3000 {
            let root = commit_on(
                &repo,
                None,
                &[],
                &[("prompts/a.md", "1"), ("runs/t/r.json", &n.to_string())],
            );
            tip = commit_on(&repo, Some(root), &[root, tip], &[]);
        }
        let path = repo.path().to_path_buf();
        let step = std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || {
                let repo = Repository::open(path).unwrap();
                Trust::new(&repo, rule()).unwrap().step(tip).unwrap()
            })
            .unwrap()
            .join()
            .unwrap();
        assert_eq!((step.boundary, step.joined, step.merge), (None, None, Some(tip)));
    }

    /// The same orphan line turning signatures off (its settings ask none), its tree
    /// approved by hand in Rev's name without a signature: the line it joined asked
    /// for Rev's signed list, so the rule in force is that list's, and the unsigned
    /// approval counts for nothing.
    #[test]
    fn signatures_switched_off_by_a_merge_of_an_orphan_line_are_judged_by_the_joined_list() {
        let dir = tempfile::tempdir().unwrap();
        let Some((rev_key, rev_pub)) = keygen(dir.path(), "rev") else {
            return;
        };
        let repo = Repository::init(dir.path().join("r")).unwrap();
        let signed = "review:\n  require_signed: true\n  allowed_signers: settings/allowed_signers\n";
        let settings = crate::layout::SETTINGS_FILE;
        let revs = format!("rev@x.org {rev_pub}");
        let main = commit_on(
            &repo,
            None,
            &[],
            &[(LIST, &revs), (settings, signed), ("prompts/a.md", "1")],
        );
        approve(&repo, main, &rev_key);
        let orphan = commit_on(
            &repo,
            None,
            &[],
            &[(settings, "version: 1\n"), ("prompts/a.md", "EVIL")],
        );
        let merge = commit_on(&repo, Some(orphan), &[orphan, main], &[]);
        let who = crate::git::Person {
            name: "Rev".into(),
            email: "rev@x.org".into(),
        };
        let merged_tree = crate::review::builder_tree_of_commit(&repo, merge).unwrap();
        let body = approvals::signed_body("p", merged_tree, merge, &who, None).unwrap();
        approvals::write(&repo, body, &who).unwrap();
        let identity = ApprovalRule::unsigned("runtime@localhost");
        // The attack is live: by identity, the hand-made approval counts.
        assert!(Trust::new(&repo, identity.clone())
            .unwrap()
            .commit(merge)
            .unwrap()
            .approval
            .is_some());
        let ruled = Trust::rule_in_force(&repo, merge, identity, None).unwrap();
        assert!(
            matches!(&ruled.signers, Some(SignerList::Repository(l)) if l == LIST),
            "{:?}",
            ruled.signers.as_ref().map(|_| "another list")
        );
        assert!(Trust::new(&repo, ruled)
            .unwrap()
            .commit(merge)
            .unwrap()
            .approval
            .is_none());
    }

    /// A feature branch forked before `main`'s list rotated Rev's key out for Carol's
    /// (approved), merged with a new tree Carol approved: the feature's line still
    /// trusts the old list, but `main` replaced that trust through review, so it is no
    /// other root and Carol's approval counts.
    #[test]
    fn a_branch_forked_before_a_key_rotation_merged_after_it_is_judged_by_the_new_list() {
        let dir = tempfile::tempdir().unwrap();
        let Some((rev_key, rev_pub)) = keygen(dir.path(), "rev") else {
            return;
        };
        let (carol_key, carol_pub) = keygen(dir.path(), "carol").unwrap();
        let repo = Repository::init(dir.path().join("r")).unwrap();
        let revs = format!("rev@x.org {rev_pub}");
        let c0 = commit_on(
            &repo,
            None,
            &[],
            &[(LIST, &revs), ("prompts/a.md", "1"), ("prompts/b.md", "1")],
        );
        approve(&repo, c0, &rev_key);
        let feature = commit_on(&repo, Some(c0), &[c0], &[("prompts/b.md", "2")]);
        // Carol's key as Rev's address, so an approval by her key names Rev.
        let carols = format!("rev@x.org {carol_pub}");
        let rotated = commit_on(&repo, Some(c0), &[c0], &[(LIST, &carols), ("prompts/a.md", "2")]);
        approve(&repo, rotated, &rev_key);
        let merge = commit_on(&repo, Some(rotated), &[rotated, feature], &[("prompts/b.md", "2")]);
        approve(&repo, merge, &carol_key);
        let judged = Trust::new(&repo, rule()).unwrap().commit(merge).unwrap();
        assert!(judged.approval.is_some(), "{:?}", judged.rejected);
    }
}
