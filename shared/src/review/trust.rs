//! Which allowed-signers list judges an approval (docs/design.md): an
//! approval of a tree is judged by the list of the tree trusted *before* it, never by
//! the list of the tree it approves, so a change that adds a key to
//! `settings/allowed_signers` cannot be approved with that same new key.
//!
//! * A proposal is judged as a commit on its base (the merge-base with the current
//!   branch): by the base's list when the base is approved, else as below from there.
//! * A commit's tree (the runtime's HEAD, an audited commit, a sync's incoming tip) is
//!   judged by the list of its nearest first-parent ancestor whose builder tree differs
//!   from the judged one and is itself covered by an approval, judged the same way. A
//!   direct, unapproved commit that adds a key is skipped over: its key is trusted for
//!   nothing. When no approved tree precedes it (the first approved tree of a
//!   repository), the judged tree's own list is used: trust on first use, as SSH does.
//! * With an absolute `review.allowed_signers` (an operator's file outside the
//!   repository), that file is the only list; no tree is consulted.
//!
//! The walk goes from builder change to builder change: each commit's nearest
//! first-parent ancestor with another builder tree (its *boundary*) is a fact of
//! immutable commits, remembered in `.runtime/builder-tree-walk`
//! ([`crate::state::read_walk_memo`]) when the caller asks, so a fire after 10,000
//! records-only commits reads its own new commit and one line per builder change
//! instead of 10,000 trees.

use super::approvals::{Approval, ApprovalBody, Approvals};
use super::builder_tree_of;
use super::signing::{AllowedSigners, ApprovalRule, SignerList};
use crate::diag::Diagnostic;
use git2::{Oid, Repository};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::rc::Rc;

mod joins;
mod lines;
mod owed;
mod rules;
mod verdicts;
pub use owed::OwedReview;

/// A commit's builder tree and its boundary (the nearest first-parent ancestor whose
/// builder tree differs; `None` when there is none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Step {
    tree: Oid,
    boundary: Option<Oid>,
    /// The nearest merge in the run from the commit down to its boundary (the commit
    /// itself included) whose own settings turn review off: a merge that may have
    /// brought its tree in over a reviewed one. Whether a later parent of it was under
    /// review is judged when asked ([`Trust::replaced_reviewed_parent`]): it depends on
    /// approvals, which grow, and a step holds only facts of immutable commits.
    merged: Option<Oid>,
    /// The nearest merge in the run (the commit itself included) joining another line
    /// ([`Trust::merge_joins`]: a later parent of another builder tree, or of its own
    /// that brings another line), whose trusted list judges the tree too ([`joins`]).
    joined: Option<Oid>,
    /// The nearest merge in the run (the commit itself included), of any kind: a walk
    /// that passes over the run answers to every line it joined ([`lines`]).
    merge: Option<Oid>,
}

/// What [`Trust::walk_down`] found: the commits to learn (the lowest last) and the
/// known commit below them, with its step.
type Walked = (Vec<(Oid, Oid, Option<Oid>, Vec<Oid>)>, Option<(Oid, Step)>);

/// A commit whose step [`Trust::step`] is learning, with what its walk down found and
/// is still to learn (`None` before the walk).
struct Unlearned {
    commit: Oid,
    walked: Option<Walked>,
}

/// Which list judged a tree's approvals.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum JudgedBy {
    /// Signatures are not required: identities only.
    Identity,
    /// The operator's file (an absolute `review.allowed_signers`).
    Operator(PathBuf),
    /// The list in the tree of this commit: the last approved tree before the judged one.
    Trusted(Oid),
    /// No approved tree precedes the judged one: its own list (of this commit), trusted
    /// on first use.
    Bootstrap(Oid),
}

/// The verdict on one builder tree.
#[derive(Debug, Clone)]
pub struct Judged {
    pub tree: Oid,
    /// The newest approval of the tree that counts.
    pub approval: Option<Approval>,
    /// Every approval of the tree that counts (the newest first, as stored), for the
    /// judgement that approvals only move forward ([`super::forward`]).
    pub counting: Vec<Approval>,
    /// Why each newer approval naming the tree does not count (newest first).
    pub rejected: Vec<String>,
    pub by: JudgedBy,
    /// The list that should have judged it could not be read.
    pub unreadable: Option<Diagnostic>,
}

impl Judged {
    /// No approval counted yet for `tree`, judged `by` that list.
    fn unapproved(tree: Oid, by: JudgedBy, unreadable: Option<Diagnostic>) -> Judged {
        Judged {
            tree,
            approval: None,
            counting: Vec::new(),
            rejected: Vec::new(),
            by,
            unreadable,
        }
    }

    /// This verdict with its approvals refused, for these reasons.
    fn refused(self, rejected: Vec<String>) -> Judged {
        Judged {
            approval: None,
            counting: Vec::new(),
            rejected,
            ..self
        }
    }

    /// Which list judged it, in words (for refusals and cards).
    pub fn judged_by(&self, rule: &ApprovalRule) -> String {
        let rel = match &rule.signers {
            Some(SignerList::Repository(rel)) => rel.as_str(),
            _ => "",
        };
        match &self.by {
            JudgedBy::Identity => "judged by identity (signatures are not required)".into(),
            JudgedBy::Operator(path) => format!("judged by the operator's allowed-signers file {}", path.display()),
            JudgedBy::Trusted(c) => format!(
                "judged by {rel} of commit {}, the last approved tree before it",
                crate::text::short_oid(*c)
            ),
            JudgedBy::Bootstrap(c) => format!(
                "judged by its own {rel} (commit {}): no approved tree precedes it, so its list is trusted on first use",
                crate::text::short_oid(*c)
            ),
        }
    }
}

/// A parsed list, or why it cannot be read; shared between the commits that hold the
/// same blob.
type List = Rc<Result<AllowedSigners, Diagnostic>>;

/// The judge of approvals under one rule, with its memos.
pub struct Trust<'r> {
    repo: &'r Repository,
    rule: ApprovalRule,
    approvals: Approvals,
    /// The operator's list, when the rule names one.
    operator: Option<List>,
    steps: HashMap<Oid, Step>,
    /// Per commit (a fire's HEAD, a later parent of a merge, the newest of a run a
    /// walk met): whether its builder tree is covered.
    covered: HashMap<Oid, bool>,
    /// Merges whose lines joined in their run's own sense (and those of every merge
    /// below them in the run) were asked, and accepted the run's tree on the run's
    /// line, by the verdict on a commit of that run ([`Trust::joins_accept`]): a
    /// newer commit of the run asks down to them, not past them.
    answered: HashSet<Oid>,
    /// `(start, tree)` -> the walk down the line from `start` for `tree`.
    lines: HashMap<(Option<Oid>, Oid), lines::Line>,
    /// Per commit and kind: the lines merges in its run joined ([`joins`]).
    run_joins: HashMap<(Oid, bool), joins::Joined>,
    /// `(run, tree)` -> why the lines joined in the runs a walk for `tree` passes over
    /// from `run` down refuse its approvals (`None`: they accept them), for one walk's
    /// part of [`joins`] ([`Trust::passed_refuse`]).
    passed_clear: HashMap<(Oid, Oid), Option<Rc<Vec<String>>>>,
    /// How many runs [`Trust::passed_refuse`] found unanswered, how many commits
    /// [`Trust::walk_down`] read, and how many merges the walks of runs' joins met:
    /// the measures of work the tests hold to the length of the history.
    runs_asked: usize,
    commits_read: usize,
    merges_met: usize,
    /// Commits known to be uncovered -> where a walk goes on below them (the next
    /// commit not known to be uncovered), shortened as walks learn ([`lines`]).
    skip: HashMap<Oid, Option<Oid>>,
    /// Per tree: whether any approval naming it could count under the rule.
    may_count: HashMap<Oid, bool>,
    /// Lists by blob id.
    lists: HashMap<Oid, List>,
    /// `(tree, which list)` -> verdict.
    judged: HashMap<(Oid, JudgedBy), Judged>,
    /// `require_reviewed` by settings blob.
    /// [`Trust::settings_facts`] by settings blob.
    facts: HashMap<Oid, (bool, Option<String>)>,
    /// Per commit: whether its history owes review ([`owed`]).
    owed: HashMap<Oid, owed::Owed>,
    /// The repository is a shallow clone: its history ends at parents it lacks.
    shallow: bool,
    memo: Option<Memo>,
    /// The verdicts remembered between fires ([`verdicts`]).
    verdicts: Option<verdicts::Verdicts>,
}

/// The walk memo of a repository: what the file held, and the commits this judge
/// asked about (what the next one will ask about again: its HEAD's parent and the
/// same builder changes).
struct Memo {
    root: PathBuf,
    known: HashMap<Oid, Step>,
    asked: Vec<Oid>,
    /// The file's commits, in order, to write it only when that changes.
    held: Vec<Oid>,
    /// The review-free mark ([`REVIEW_FREE_FILE`]), read once.
    free: Option<Oid>,
    /// The unsigned-below mark ([`UNSIGNED_BELOW_FILE`]), read once.
    unsigned: Option<Oid>,
}

/// The most rows the walk memo keeps (a row is about 124 bytes).
const MEMO_ROWS: usize = 256;

/// Records commits (a builder tree and boundary the memo already holds) a walk may
/// learn before the memo is written again. Each fire adds one such commit; rewriting
/// the file for it makes a file and frees one on every fire (slow on a file system
/// that scans recently freed inodes), while walking a few more commits next time
/// costs microseconds each.
const MEMO_SAVE_AFTER: usize = 8;

pub use crate::state::{REVIEW_FREE_FILE, UNSIGNED_BELOW_FILE, VERDICTS_FILE};
/// What a review-free mark this version reads begins with. An older version's mark
/// was written by a walk that did not look for merges replacing a reviewed tree (the
/// bare commit id), that counted a parent under review only by its own settings
/// (`review-free 2`), or that excused a later parent whose own history owes review as
/// a stale branch (`review-free 3`), so it is no fact now: it is ignored, and the walk
/// done again.
const REVIEW_FREE_FORMAT: &str = "review-free 4 ";

/// What an unsigned-below mark this version reads begins with.
const UNSIGNED_BELOW_FORMAT: &str = "unsigned-below 1 ";

/// The commit a mark under `.runtime/` names, when it is `format` then a commit id.
fn read_mark(root: &std::path::Path, file: &str, format: &str) -> Option<Oid> {
    let rel = std::path::Path::new(crate::layout::STATE_DIR).join(file);
    let dir = crate::beneath::open_root(root).ok()?;
    let bytes = crate::beneath::read_regular(&dir, &rel, 128).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    Oid::from_str(text.strip_prefix(format)?.trim()).ok()
}

/// Replaces the mark `file` under `.runtime/` with `format` and `commit`.
fn write_mark(root: &std::path::Path, file: &str, format: &str, commit: Oid) -> std::io::Result<()> {
    let rel = std::path::Path::new(crate::layout::STATE_DIR).join(file);
    let dir = crate::beneath::open_root(root)?;
    match crate::beneath::remove_file(&dir, &rel) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    crate::beneath::create_new(&dir, &rel, format!("{format}{commit}\n").as_bytes())
}

fn write_review_free(root: &std::path::Path, commit: Oid) -> std::io::Result<()> {
    write_mark(root, REVIEW_FREE_FILE, REVIEW_FREE_FORMAT, commit)
}

fn write_unsigned_below(root: &std::path::Path, commit: Oid) -> std::io::Result<()> {
    write_mark(root, UNSIGNED_BELOW_FILE, UNSIGNED_BELOW_FORMAT, commit)
}

impl<'r> Trust<'r> {
    /// Reads the approvals of `repo`, to be judged by `rule`.
    pub fn new(repo: &'r Repository, rule: ApprovalRule) -> Result<Trust<'r>, git2::Error> {
        let operator = match &rule.signers {
            Some(SignerList::Operator(list)) => Some(Rc::new(Ok(list.clone()))),
            _ => None,
        };
        Ok(Trust {
            repo,
            approvals: Approvals::read(repo)?,
            rule,
            operator,
            steps: HashMap::new(),
            answered: HashSet::new(),
            covered: HashMap::new(),
            lines: HashMap::new(),
            run_joins: HashMap::new(),
            passed_clear: HashMap::new(),
            runs_asked: 0,
            commits_read: 0,
            merges_met: 0,
            skip: HashMap::new(),
            may_count: HashMap::new(),
            lists: HashMap::new(),
            judged: HashMap::new(),
            facts: HashMap::new(),
            owed: HashMap::new(),
            shallow: repo.is_shallow(),
            memo: None,
            verdicts: None,
        })
    }

    /// Remembers the walk in (and reads it back from) the walk memo of the repository
    /// at `root` (`.runtime/builder-tree-walk`). The memo holds the shape of the
    /// history (each commit's builder tree and the builder change below it), which no
    /// rule changes, so every judge of a fire shares it.
    pub fn remembering(mut self, root: Option<&std::path::Path>) -> Trust<'r> {
        // A shallow clone's walk ends where its history does, not at the root: what
        // it would learn (a boundary that is none, a mark) is no fact of the history.
        let Some(root) = root.filter(|_| !self.shallow) else {
            return self;
        };
        let mut known = HashMap::new();
        let mut held = Vec::new();
        for (commit, tree, boundary, merged, joined, merge) in crate::state::read_walk_memo(root) {
            let oid = |o: Option<String>| match o {
                Some(b) => Oid::from_str(&b).ok().map(Some),
                None => Some(None),
            };
            let parsed = (|| {
                let step = Step {
                    tree: Oid::from_str(&tree).ok()?,
                    boundary: oid(boundary)?,
                    merged: oid(merged)?,
                    joined: oid(joined)?,
                    merge: oid(merge)?,
                };
                Some((Oid::from_str(&commit).ok()?, step))
            })();
            if let Some((c, step)) = parsed {
                known.insert(c, step);
                held.push(c);
            }
        }
        self.memo = Some(Memo {
            root: root.to_path_buf(),
            known,
            asked: Vec::new(),
            held,
            free: read_mark(root, REVIEW_FREE_FILE, REVIEW_FREE_FORMAT),
            unsigned: read_mark(root, UNSIGNED_BELOW_FILE, UNSIGNED_BELOW_FORMAT),
        });
        self.read_verdicts(root);
        self
    }

    /// Writes the walk memo: the steps of the commits asked about since it was read,
    /// then the file's other rows (a fire judges with a few judges, each asking about
    /// different commits: none may drop what another remembered), at most
    /// [`MEMO_ROWS`].
    fn save_memo(&mut self) {
        self.save_verdicts();
        let Some(memo) = self.memo.as_mut() else { return };
        let mut order = memo.asked.clone();
        for c in &memo.held {
            if !order.contains(c) {
                order.push(*c);
            }
        }
        order.truncate(MEMO_ROWS);
        if order == memo.held {
            return;
        }
        let learned: Vec<&Step> = self
            .steps
            .iter()
            .filter(|(c, _)| !memo.known.contains_key(c))
            .map(|(_, s)| s)
            .collect();
        let only_repeats = !memo.known.is_empty() && learned.iter().all(|s| memo.known.values().any(|k| k == *s));
        if only_repeats && learned.len() < MEMO_SAVE_AFTER {
            return;
        }
        let rows: Vec<_> = order
            .iter()
            .filter_map(|c| {
                let s = self.steps.get(c).or_else(|| memo.known.get(c))?;
                Some((
                    c.to_string(),
                    s.tree.to_string(),
                    s.boundary.map(|b| b.to_string()),
                    s.merged.map(|m| m.to_string()),
                    s.joined.map(|j| j.to_string()),
                    s.merge.map(|m| m.to_string()),
                ))
            })
            .collect();
        match crate::state::write_walk_memo(&memo.root, &rows) {
            Ok(()) => memo.held = order,
            Err(e) => tracing::warn!(error = %e, "the builder-tree walk was not remembered"),
        }
    }

    pub fn rule(&self) -> &ApprovalRule {
        &self.rule
    }

    pub fn approvals(&self) -> &Approvals {
        &self.approvals
    }

    /// Whether verdicts depend on history (signatures judged by a list in the
    /// repository): only then is there a walk to remember.
    pub fn walks(&self) -> bool {
        matches!(self.rule.signers, Some(SignerList::Repository(_)))
    }

    /// The verdict on the builder tree of `commit`.
    pub fn commit(&mut self, commit: Oid) -> Result<Judged, git2::Error> {
        if !self.walks() {
            let tree = super::builder_tree_of_commit(self.repo, commit)?;
            return Ok(self.judge_tree(tree, None, commit));
        }
        let step = self.step(commit)?;
        // The other box's tip of a sync merge, judged first ([`Trust::cover_each`]):
        // covered, it answers for its line, so the merge's line is answered at once.
        let later = self.same_tree_later_parents(commit, step.tree)?;
        self.cover_each(later)?;
        let judged = self.settle(|t| t.verdict(step.tree, step.boundary, Some(commit), commit))?;
        // The same verdict as [`Trust::cover`] reaches: remembered for the next fire,
        // whose own run stops asking below it.
        self.record_covered(commit, judged.approval.is_some());
        self.save_memo();
        Ok(judged)
    }

    /// The verdict on the builder tree of `commit` arriving over `known` (a sync's
    /// remote tip over the branch the box has): as [`Trust::commit`], except that an
    /// incoming history with no approved tree of its own (an unrelated history pushed
    /// over the branch) is not trusted on first use while `known` has one: it is then
    /// judged by the list of the last approved tree of `known`, and still by the lines
    /// it joined. And one that trusts an approved tree that does not descend from the
    /// one `known` trusts (a rewritten history with a root planted in it, or one that
    /// merged the branch in somewhere) answers to `known`'s list as well.
    pub fn incoming(&mut self, commit: Oid, known: Oid) -> Result<Judged, git2::Error> {
        let judged = self.commit(commit)?;
        let step = self.step(commit)?;
        let own = match judged.by {
            JudgedBy::Bootstrap(_) => self.settle(|t| t.walk_line(step.boundary, step.tree))?,
            JudgedBy::Trusted(_) if judged.approval.is_some() => return self.known_accepts(commit, known, judged),
            _ => return Ok(judged),
        };
        let on_known = self.settle(|t| t.verdict_also(step.tree, Some(known), Some(commit), Some(own), commit))?;
        self.save_memo();
        match on_known.by {
            JudgedBy::Trusted(_) => Ok(on_known),
            _ => Ok(judged),
        }
    }

    /// `judged` (an approval of the tree of `commit` that counts by the approved tree
    /// its own line trusts), held to the list of the approved tree `known` trusts too
    /// unless the tree it trusts is that one or descends from it.
    fn known_accepts(&mut self, commit: Oid, known: Oid, judged: Judged) -> Result<Judged, git2::Error> {
        let Some(theirs) = self.trusted_from(Some(known), judged.tree)? else {
            return Ok(judged);
        };
        let JudgedBy::Trusted(ours) = judged.by else {
            return Ok(judged);
        };
        // The approved tree it trusts must itself descend from the branch's: a history
        // that merely holds the branch somewhere (a merge of `main` into an orphan line
        // with a root of its own) brings another root.
        if ours == theirs || self.repo.graph_descendant_of(ours, theirs)? {
            return Ok(judged);
        }
        let other = self.judge_tree(judged.tree, Some(theirs), commit);
        if other.approval.is_some() {
            return Ok(judged);
        }
        let mut rejected = other.rejected;
        rejected.push(format!(
            "the approved tree it trusts does not descend from commit {}, the one the branch it arrives over trusts, whose list does not accept it",
            crate::text::short_oid(theirs)
        ));
        Ok(judged.refused(rejected))
    }

    /// The verdict on the builder tree of the proposal head `head`, as a commit on
    /// `base` would be judged.
    pub fn proposal(&mut self, base: Oid, head: Oid) -> Result<Judged, git2::Error> {
        let tree = super::builder_tree_of_commit(self.repo, head)?;
        if !self.walks() {
            return Ok(self.judge_tree(tree, None, head));
        }
        self.settle(|t| t.verdict(tree, Some(base), None, head))
    }

    /// `require_reviewed` in the settings of `commit`, remembered per settings blob.
    fn requires_review(&mut self, commit: Oid) -> Result<bool, git2::Error> {
        Ok(self.settings_facts(commit)?.0)
    }

    /// What the settings of `commit` say for judging: `require_reviewed`, and the
    /// signers list when they ask signatures ([`super::allowed_signers_path`]); remembered per
    /// settings blob, so a walk parses each version of the settings once.
    fn settings_facts(&mut self, commit: Oid) -> Result<(bool, Option<String>), git2::Error> {
        let tree = self.repo.find_commit(commit)?.tree()?;
        let id = match tree.get_path(std::path::Path::new(crate::layout::SETTINGS_FILE)) {
            Ok(e) => e.id(),
            Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok((false, None)),
            Err(e) => return Err(e),
        };
        if let Some(v) = self.facts.get(&id) {
            return Ok(v.clone());
        }
        let blob = self.repo.find_blob(id)?;
        // One parse for settings that ask no signatures, as `require_reviewed` alone took.
        let (reviewed, signed) = super::review_flags(blob.content());
        let v = (reviewed, signed.then(|| super::allowed_signers_path(blob.content())));
        self.facts.insert(id, v.clone());
        Ok(v)
    }

    /// Every tree an approval that counts names, where the list does not depend on
    /// history (no signatures, or the operator's list); `None` under a repository's
    /// list, where coverage belongs to a commit ([`Trust::commit`]).
    pub fn counting_trees(&mut self) -> Option<std::collections::HashSet<Oid>> {
        if self.walks() {
            return None;
        }
        let trees = self.approvals.trees();
        Some(
            trees
                .into_iter()
                .filter(|t| self.judge_tree(*t, None, Oid::ZERO_SHA1).approval.is_some())
                .collect(),
        )
    }

    /// The builder tree and boundary of `commit`: from the memos, else by walking its
    /// first parents until a remembered commit (or the root), learning each on the way.
    /// A merge's later parents that hold its own builder tree are learned first
    /// (whether their line is another decides whether the merge joins one,
    /// [`Trust::merge_joins`]), from an explicit stack: nothing recurses.
    fn step(&mut self, commit: Oid) -> Result<Step, git2::Error> {
        self.asked(commit);
        if let Some(s) = self.steps.get(&commit) {
            return Ok(*s);
        }
        let mut stack = vec![Unlearned { commit, walked: None }];
        let mut waiting = std::collections::HashSet::from([commit]);
        while let Some(frame) = stack.last_mut() {
            match self.learn_run(frame)? {
                None => {
                    waiting.remove(&frame.commit);
                    stack.pop();
                }
                Some(parent) if !waiting.insert(parent) => {
                    return Err(git2::Error::from_str(&format!(
                        "the walk of builder trees met commit {parent} twice: the history is not a graph of ancestors"
                    )));
                }
                Some(parent) => {
                    self.asked(parent);
                    stack.push(Unlearned {
                        commit: parent,
                        walked: None,
                    });
                }
            }
        }
        self.steps
            .get(&commit)
            .copied()
            .ok_or_else(|| git2::Error::from_str("no commit to walk from"))
    }

    /// Notes that `commit` was asked about, for the walk memo (only the first rows
    /// asked for are kept, [`Trust::save_memo`]).
    fn asked(&mut self, commit: Oid) {
        if let Some(memo) = self.memo.as_mut() {
            if memo.asked.len() < MEMO_ROWS && !memo.asked.contains(&commit) {
                memo.asked.push(commit);
            }
        }
    }

    /// Learns the steps from `frame`'s commit down its first parents to a known one
    /// (or the root). `Some(parent)`: a merge on the way has a later parent `parent`
    /// holding its own builder tree whose step is not known yet, to learn first; the
    /// frame keeps what is left to learn, so asking again goes on from that merge (a
    /// run of n such merges is walked once, not n times).
    fn learn_run(&mut self, frame: &mut Unlearned) -> Result<Option<Oid>, git2::Error> {
        let (mut pending, mut below) = match frame.walked.take() {
            Some(walked) => walked,
            None => self.walk_down(frame.commit)?,
        };
        while let Some((c, tree, merged_here, later)) = pending.pop() {
            let merge_here = (!later.is_empty()).then_some(c);
            let joined_here = match self.merge_joins(tree, below, &later)? {
                joins::MergeJoins::Learn(parent) => {
                    pending.push((c, tree, merged_here, later));
                    frame.walked = Some((pending, below));
                    return Ok(Some(parent));
                }
                joins::MergeJoins::Yes => merge_here,
                joins::MergeJoins::No => None,
            };
            let s = match below {
                Some((_, s)) if s.tree == tree => Step {
                    tree,
                    boundary: s.boundary,
                    merged: merged_here.or(s.merged),
                    joined: joined_here.or(s.joined),
                    merge: merge_here.or(s.merge),
                },
                Some((p, _)) => Step {
                    tree,
                    boundary: Some(p),
                    merged: merged_here,
                    joined: joined_here,
                    merge: merge_here,
                },
                None => Step {
                    tree,
                    boundary: None,
                    merged: merged_here,
                    joined: joined_here,
                    merge: merge_here,
                },
            };
            self.steps.insert(c, s);
            below = Some((c, s));
        }
        Ok(None)
    }

    /// The commits from `commit` down its first parents to a known one (or the root),
    /// the lowest last, each with its builder tree, itself when it is a merge whose
    /// settings turn review off, and its later parents; and the known one with its step.
    fn walk_down(&mut self, commit: Oid) -> Result<Walked, git2::Error> {
        let mut pending = Vec::new();
        let mut next = Some(commit);
        while let Some(c) = next {
            if let Some(s) = self.remembered(c) {
                return Ok((pending, Some((c, s))));
            }
            let found = match self.repo.find_commit(c) {
                Ok(f) => f,
                // A shallow clone's history ends at a parent it does not have: there
                // the walk ends as at a root.
                Err(e) if e.code() == git2::ErrorCode::NotFound && c != commit => break,
                Err(e) => return Err(e),
            };
            let tree = builder_tree_of(self.repo, &found.tree()?)?;
            let merged_here = (found.parent_count() > 1 && !self.requires_review(c)?).then_some(c);
            let later: Vec<Oid> = found.parent_ids().skip(1).collect();
            pending.push((c, tree, merged_here, later));
            self.commits_read += 1;
            next = found.parent_ids().next();
        }
        Ok((pending, None))
    }

    /// A step known in memory or in the walk memo.
    fn remembered(&mut self, commit: Oid) -> Option<Step> {
        if let Some(s) = self.steps.get(&commit) {
            return Some(*s);
        }
        let s = *self.memo.as_ref()?.known.get(&commit)?;
        self.steps.insert(commit, s);
        Some(s)
    }

    /// The list in the tree of `commit`.
    fn list_of(&mut self, commit: Oid) -> List {
        let Some(SignerList::Repository(rel)) = &self.rule.signers else {
            return Rc::new(Err(Diagnostic::new(
                "",
                0,
                "review.allowed_signers",
                "no list in the repository",
            )));
        };
        let rel = rel.clone();
        let tree = match self.repo.find_commit(commit).and_then(|c| c.tree()) {
            Ok(t) => t,
            Err(e) => {
                return Rc::new(Err(Diagnostic::new(
                    &rel,
                    0,
                    "review.allowed_signers",
                    format!("cannot read commit {commit}: {}", e.message()),
                )))
            }
        };
        let blob = tree.get_path(std::path::Path::new(&rel)).ok().map(|e| e.id());
        if let Some(hit) = blob.and_then(|b| self.lists.get(&b)) {
            return hit.clone();
        }
        let list = Rc::new(AllowedSigners::from_tree(self.repo, commit, &tree, &rel));
        if let Some(b) = blob {
            self.lists.insert(b, list.clone());
        }
        list
    }

    /// The list that judges a tree on top of `trusted` (else its own, of `own`).
    fn list_for(&mut self, trusted: Option<Oid>, own: Oid) -> (JudgedBy, Option<List>) {
        match (&self.rule.signers, trusted) {
            (None, _) => (JudgedBy::Identity, None),
            (Some(SignerList::Operator(l)), _) => (JudgedBy::Operator(l.path().to_path_buf()), self.operator.clone()),
            (Some(SignerList::Repository(_)), Some(c)) => (JudgedBy::Trusted(c), Some(self.list_of(c))),
            (Some(SignerList::Repository(_)), None) => (JudgedBy::Bootstrap(own), Some(self.list_of(own))),
        }
    }

    /// Whether an approval with `body` of the proposal head `head` would count, judged
    /// as [`Trust::proposal`] judges (what `builder approve` checks before writing).
    pub fn would_count(
        &mut self,
        body: &ApprovalBody,
        base: Oid,
        head: Oid,
    ) -> Result<Result<(), String>, git2::Error> {
        let tree = super::builder_tree_of_commit(self.repo, head)?;
        let trusted = if self.walks() {
            self.trusted_from(Some(base), tree)?
        } else {
            None
        };
        let (by, list) = self.list_for(trusted, head);
        let verdict = match list.as_deref() {
            Some(Ok(l)) => self.rule.judge(body, Some(l)),
            Some(Err(d)) => self.rule.judge(body, None).map_err(|why| format!("{why}: {d}")),
            None => self.rule.judge(body, None),
        };
        let judged = Judged::unapproved(tree, by, None);
        Ok(verdict.map_err(|why| format!("{why} ({})", judged.judged_by(&self.rule))))
    }

    /// Judges the approvals of `tree` by the list of `trusted`, else of `own` (trust on
    /// first use); both are ignored when the list does not come from the repository.
    fn judge_tree(&mut self, tree: Oid, trusted: Option<Oid>, own: Oid) -> Judged {
        let (by, list) = self.list_for(trusted, own);
        if let Some(hit) = self.judged.get(&(tree, by.clone())) {
            return hit.clone();
        }
        let (readable, unreadable) = match list.as_deref() {
            Some(Ok(l)) => (Some(l), None),
            Some(Err(d)) => (None, Some(d.clone())),
            None => (None, None),
        };
        let mut judged = Judged::unapproved(tree, by.clone(), unreadable.clone());
        for (_, a) in self.approvals.naming(tree) {
            match self.rule.judge(&a.body, readable) {
                Ok(()) => {
                    if judged.approval.is_none() {
                        judged.approval = Some(a.clone());
                    }
                    judged.counting.push(a.clone());
                }
                Err(_) if judged.approval.is_some() => {}
                Err(why) => {
                    let why = match &unreadable {
                        Some(d) if why.starts_with("no allowed-signers list") => format!("{why}: {d}"),
                        _ => why,
                    };
                    judged.rejected.push(format!(
                        "approval {} by {}: {why}",
                        crate::text::short_oid(a.id),
                        a.body.approver
                    ))
                }
            }
        }
        self.judged.insert((tree, by), judged.clone());
        judged
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::approvals::{self, Signing};
    use crate::review::signing::test_keys::keygen;
    use std::path::Path;

    /// A commit on HEAD replacing `files`, by `who`.
    fn commit(repo: &Repository, files: &[(&str, &str)], who: &str) -> Oid {
        let parent = repo.head().ok().and_then(|h| h.peel_to_commit().ok());
        let empty = repo
            .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
            .unwrap();
        let base = parent.as_ref().map(|p| p.tree().unwrap()).unwrap_or(empty);
        let mut update = git2::build::TreeUpdateBuilder::new();
        for (path, body) in files {
            update.upsert(*path, repo.blob(body.as_bytes()).unwrap(), git2::FileMode::Blob);
        }
        let tree = repo.find_tree(update.create_updated(repo, &base).unwrap()).unwrap();
        let sig = git2::Signature::now(who, &format!("{who}@localhost")).unwrap();
        let parents: Vec<&git2::Commit> = parent.iter().collect();
        repo.commit(Some("HEAD"), &sig, &sig, who, &tree, &parents).unwrap()
    }

    pub(super) fn approve(repo: &Repository, commit: Oid, key: &Path) {
        let who = crate::git::Person {
            name: "Rev".into(),
            email: "rev@x.org".into(),
        };
        let tree = super::super::builder_tree_of_commit(repo, commit).unwrap();
        let signing = Signing {
            key: key.to_path_buf(),
            program: "ssh-keygen".into(),
        };
        let body = approvals::signed_body("p", tree, commit, &who, Some(&signing)).unwrap();
        approvals::write(repo, body, &who).unwrap();
    }

    pub(super) fn rule() -> ApprovalRule {
        ApprovalRule {
            runtime_email: "runtime@localhost".into(),
            signers: Some(SignerList::Repository("settings/allowed_signers".into())),
        }
    }

    fn memo_lines(root: &Path) -> Vec<String> {
        let text =
            std::fs::read_to_string(root.join(crate::layout::STATE_DIR).join(crate::state::WALK_MEMO_FILE)).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(crate::state::WALK_MEMO_HEADER), "{text}");
        lines.map(str::to_string).collect()
    }

    #[test]
    fn a_key_added_by_an_unapproved_commit_is_trusted_for_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let Some((rev_key, rev_pub)) = keygen(dir.path(), "rev") else {
            return;
        };
        let (mal_key, mal_pub) = keygen(dir.path(), "mallory").unwrap();
        let repo = Repository::init(dir.path().join("r")).unwrap();
        let rev_line = format!("rev@x.org {rev_pub}");
        let both = format!("{rev_line}rev@x.org {mal_pub}");
        // The first approved tree: its own list (bootstrap).
        let c0 = commit(
            &repo,
            &[("settings/allowed_signers", &rev_line), ("prompts/a.md", "0")],
            "eng",
        );
        approve(&repo, c0, &rev_key);
        // A direct commit adds Mallory's key (no approval), then her change, approved
        // by her key under Rev's address.
        let c1 = commit(&repo, &[("settings/allowed_signers", &both)], "mallory");
        let c2 = commit(&repo, &[("prompts/a.md", "mallory's")], "mallory");
        approve(&repo, c2, &mal_key);
        let mut trust = Trust::new(&repo, rule()).unwrap();
        assert_eq!(trust.commit(c0).unwrap().by, JudgedBy::Bootstrap(c0));
        assert!(trust.commit(c0).unwrap().approval.is_some());
        assert!(trust.commit(c1).unwrap().approval.is_none());
        let judged = trust.commit(c2).unwrap();
        assert_eq!(judged.by, JudgedBy::Trusted(c0), "the unapproved c1 is skipped");
        assert!(judged.approval.is_none());
        assert!(
            judged.rejected[0].contains("is not in settings/allowed_signers"),
            "{:?}",
            judged.rejected
        );
        // The attack ran: by the list of c1 (the tree before hers), it would count.
        let c1_list = AllowedSigners::parse(Path::new("l"), &both).unwrap();
        let forged = approvals::load(&repo).unwrap().pop().unwrap();
        assert!(c1_list.verify(&forged.body).is_ok());
        // A proposal on c1 is judged the same way.
        assert_eq!(trust.proposal(c1, c2).unwrap().by, JudgedBy::Trusted(c0));
        // Rev approves a later change: judged by c0's list, it counts; and a change
        // after that is judged by that tree's list.
        let c3 = commit(&repo, &[("prompts/a.md", "reviewed")], "eng");
        approve(&repo, c3, &rev_key);
        let c4 = commit(&repo, &[("prompts/a.md", "next")], "eng");
        let mut trust = Trust::new(&repo, rule()).unwrap();
        assert!(trust.commit(c3).unwrap().approval.is_some());
        assert_eq!(trust.commit(c3).unwrap().by, JudgedBy::Trusted(c0));
        assert_eq!(trust.commit(c4).unwrap().by, JudgedBy::Trusted(c3));
    }

    /// A repository with the signers list approved (`c0`), an approved builder
    /// change (`c1`) and 50 records commits on top, and its state directory.
    /// Mallory's key and her prompt in one direct commit, approved with her key in
    /// Rev's name: a full clone judges it by the list before it; a shallow clone
    /// (`--depth 1`, approvals fetched) lacks that tree, and trusts her list for
    /// nothing either, where it used to trust it on first use.
    #[test]
    fn a_shallow_clone_trusts_no_list_of_its_own_on_first_use() {
        let dir = tempfile::tempdir().unwrap();
        let Some((rev_key, rev_pub)) = keygen(dir.path(), "rev") else {
            return;
        };
        let (mal_key, mal_pub) = keygen(dir.path(), "mallory").unwrap();
        let origin = dir.path().join("origin");
        let repo = Repository::init(&origin).unwrap();
        let rev_line = format!("rev@x.org {rev_pub}");
        let c0 = commit(
            &repo,
            &[("settings/allowed_signers", &rev_line), ("prompts/a.md", "0")],
            "eng",
        );
        approve(&repo, c0, &rev_key);
        let hers = format!("{rev_line}rev@x.org {mal_pub}");
        let c1 = commit(
            &repo,
            &[("settings/allowed_signers", &hers), ("prompts/a.md", "EVIL")],
            "mallory",
        );
        approve(&repo, c1, &mal_key);
        assert!(Trust::new(&repo, rule())
            .unwrap()
            .commit(c1)
            .unwrap()
            .approval
            .is_none());
        let shallow = shallow_clone(&origin, &dir.path().join("clone"));
        // The attack is live: her approval verifies by her list, the tip's own.
        let forged = approvals::load(&shallow)
            .unwrap()
            .into_iter()
            .find(|a| a.body.head.as_deref() == Some(c1.to_string().as_str()));
        let list = AllowedSigners::parse(Path::new("l"), &hers).unwrap();
        assert!(list.verify(&forged.expect("her approval was fetched").body).is_ok());
        let judged = Trust::new(&shallow, rule()).unwrap().commit(c1).unwrap();
        assert!(judged.approval.is_none(), "{:?}", judged.rejected);
        assert!(judged.rejected[0].contains("shallow"), "{:?}", judged.rejected);
        // Her change on top, approved with her key: in a clone two commits deep, her
        // list's tree is within the history and would be trusted as the approved
        // tree below; it is itself judged by nothing the clone has, so it is none.
        let c2 = commit(&repo, &[("prompts/a.md", "EVIL 2")], "mallory");
        approve(&repo, c2, &mal_key);
        let deeper = shallow_clone_at(&origin, &dir.path().join("deeper"), 2);
        let judged = Trust::new(&deeper, rule()).unwrap().commit(c2).unwrap();
        assert!(judged.approval.is_none(), "{:?}", judged.by);
    }

    /// `git clone --depth 1` of `origin`'s HEAD into `clone`, with its approvals.
    pub(super) fn shallow_clone(origin: &Path, clone: &Path) -> Repository {
        shallow_clone_at(origin, clone, 1)
    }

    /// `git clone --depth <depth>` of `origin`'s HEAD into `clone`, with its approvals.
    fn shallow_clone_at(origin: &Path, clone: &Path, depth: u32) -> Repository {
        let git = |args: &[&str]| {
            let out = std::process::Command::new("git").args(args).output().unwrap();
            assert!(out.status.success(), "git {args:?}: {out:?}");
        };
        let url = format!("file://{}", origin.display());
        let depth = depth.to_string();
        git(&["clone", "-q", "--depth", &depth, &url, clone.to_str().unwrap()]);
        git(&[
            "-C",
            clone.to_str().unwrap(),
            "fetch",
            "-q",
            "origin",
            crate::review::APPROVALS_REFSPEC,
        ]);
        let shallow = Repository::open(clone).unwrap();
        assert!(shallow.is_shallow());
        shallow
    }

    fn approved_history(dir: &Path) -> Option<(Repository, PathBuf, Oid, Oid)> {
        let (rev_key, rev_pub) = keygen(dir, "rev")?;
        let root = dir.join("r");
        let repo = Repository::init(&root).unwrap();
        let c0 = commit(
            &repo,
            &[("settings/allowed_signers", &format!("rev@x.org {rev_pub}"))],
            "eng",
        );
        approve(&repo, c0, &rev_key);
        let c1 = commit(&repo, &[("prompts/a.md", "1")], "eng");
        approve(&repo, c1, &rev_key);
        for i in 0..50 {
            commit(&repo, &[(&format!("runs/t/{i}.json"), "{}")], "runtime");
        }
        std::fs::create_dir_all(root.join(crate::layout::STATE_DIR)).unwrap();
        Some((repo, root, c0, c1))
    }

    /// Judges `at` with the walk memo of `root`: trusted by `c0`'s list.
    fn check_trusted(repo: &Repository, root: &Path, at: Oid, c0: Oid) {
        let judged = Trust::new(repo, rule())
            .unwrap()
            .remembering(Some(root))
            .commit(at)
            .unwrap();
        assert!(judged.approval.is_some(), "{:?}", judged.rejected);
        assert_eq!(judged.by, JudgedBy::Trusted(c0));
    }

    #[test]
    fn the_walk_is_remembered_so_a_fire_reads_only_its_new_commits() {
        let dir = tempfile::tempdir().unwrap();
        let Some((repo, root, c0, c1)) = approved_history(dir.path()) else {
            return;
        };
        let check = |at: Oid| check_trusted(&repo, &root, at, c0);
        let head = repo.head().unwrap().peel_to_commit().unwrap().id();
        let t1 = super::super::builder_tree_of_commit(&repo, c1).unwrap();
        let t0 = super::super::builder_tree_of_commit(&repo, c0).unwrap();
        check(head);
        // HEAD (its builder tree is c1's; the nearest ancestor with another is c0) and
        // the builder changes below it: what the next fire asks about again.
        let want = |at: Oid| vec![format!("{at} {t1} {c0} - - -"), format!("{c0} {t0} - - - -")];
        assert_eq!(memo_lines(&root), want(head));
        // A fire's new commit: the walk stops at the remembered parent. Proven by a
        // memo that lies about the parent: the new commit inherits the lie.
        let next = commit(&repo, &[("runs/t/next.json", "{}")], "runtime");
        std::fs::write(
            root.join(crate::layout::STATE_DIR).join(crate::state::WALK_MEMO_FILE),
            format!("{}\n{head} {t1} -\n", crate::state::WALK_MEMO_HEADER),
        )
        .unwrap();
        let judged = Trust::new(&repo, rule())
            .unwrap()
            .remembering(Some(&root))
            .commit(next)
            .unwrap();
        assert_eq!(judged.by, JudgedBy::Bootstrap(next), "read from the memo, not walked");
        // The truth again, and an unreadable memo is only a slower walk; so is one an
        // older version wrote (no header: its rows never say which merges replaced a
        // reviewed tree; version 2: only those over a parent whose own settings asked
        // review; version 3: no merge joining another line; version 4: no merge of
        // any kind; version 5: no merge taking a later parent's tree), however well it
        // reads.
        let older = |v: u32| format!("builder-tree-walk {v}\n{head} {t1} -\n");
        for stale in [
            "not a memo\n".to_string(),
            format!("{head} {t1} -\n"),
            older(2),
            older(3),
            older(4),
            older(5),
        ] {
            std::fs::write(
                root.join(crate::layout::STATE_DIR).join(crate::state::WALK_MEMO_FILE),
                stale,
            )
            .unwrap();
            // The verdicts remembered would spare the walk to c0 (a row fewer).
            let _ = std::fs::remove_file(root.join(crate::layout::STATE_DIR).join(VERDICTS_FILE));
            check(next);
            assert_eq!(memo_lines(&root), want(next));
        }
        check(next);
        assert_eq!(memo_lines(&root), want(next));
    }

    /// The verdicts a judge learned are read back by the next one while the approvals
    /// stay the same (proven by a lie: a remembered verdict is believed), and ignored
    /// once an approval is added.
    #[test]
    fn verdicts_are_remembered_while_the_approvals_stay_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let Some((repo, root, c0, c1)) = approved_history(dir.path()) else {
            return;
        };
        let head = repo.head().unwrap().peel_to_commit().unwrap().id();
        check_trusted(&repo, &root, head, c0);
        let file = root.join(crate::layout::STATE_DIR).join(VERDICTS_FILE);
        let text = std::fs::read_to_string(&file).unwrap();
        let t1 = super::super::builder_tree_of_commit(&repo, c1).unwrap();
        let row = format!("l {c0} {t1} -");
        assert!(text.contains(&format!("l {c0} {t1} {c0}")), "{text}");
        // Say the walk from c0 trusts nothing: the next judge believes it.
        std::fs::write(&file, text.replace(&format!("l {c0} {t1} {c0}"), &row)).unwrap();
        let judged = Trust::new(&repo, rule())
            .unwrap()
            .remembering(Some(&root))
            .commit(head)
            .unwrap();
        assert_eq!(
            judged.by,
            JudgedBy::Bootstrap(head),
            "the remembered verdict was not read"
        );
        // A new approval (of any tree) makes the file another set's: walked again.
        let (key, _) = keygen(dir.path(), "other").unwrap();
        approve(&repo, c0, &key);
        check_trusted(&repo, &root, head, c0);
    }

    /// A merge that brought an uncovered tree in over a reviewed parent owes review,
    /// and a review-free mark above it that an older version wrote (its walk never
    /// looked for such merges) does not hide it; a mark this version wrote is read.
    #[test]
    fn a_review_free_mark_of_an_older_version_hides_no_merge_over_a_reviewed_tree() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("r");
        let repo = Repository::init(&root).unwrap();
        std::fs::create_dir_all(root.join(crate::layout::STATE_DIR)).unwrap();
        let reviewed = commit(
            &repo,
            &[
                (crate::layout::SETTINGS_FILE, "require_reviewed: true\n"),
                ("prompts/a.md", "1"),
            ],
            "eng",
        );
        // An orphan line with review off, merged over the reviewed branch keeping its
        // own tree (`git merge -s ours`), then a builder change and records on top.
        repo.set_head_detached(reviewed).unwrap();
        let sig = git2::Signature::now("eng", "eng@localhost").unwrap();
        let mut own = git2::build::TreeUpdateBuilder::new();
        own.upsert("prompts/a.md", repo.blob(b"mine").unwrap(), git2::FileMode::Blob);
        let empty = repo
            .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
            .unwrap();
        let orphan_tree = repo.find_tree(own.create_updated(&repo, &empty).unwrap()).unwrap();
        let orphan = repo.commit(None, &sig, &sig, "orphan", &orphan_tree, &[]).unwrap();
        let parents = [&repo.find_commit(orphan).unwrap(), &repo.find_commit(reviewed).unwrap()];
        let merge = repo.commit(None, &sig, &sig, "merge", &orphan_tree, &parents).unwrap();
        repo.set_head_detached(merge).unwrap();
        commit(&repo, &[("prompts/a.md", "2")], "eng");
        let head = commit(&repo, &[("runs/t/1.json", "{}")], "runtime");
        let owed = |mark: Option<String>| {
            let path = root.join(crate::layout::STATE_DIR).join(REVIEW_FREE_FILE);
            let _ = std::fs::remove_file(&path);
            if let Some(m) = mark {
                std::fs::write(&path, m).unwrap();
            }
            Trust::new(&repo, rule())
                .unwrap()
                .remembering(Some(&root))
                .review_owed(head)
                .unwrap()
        };
        assert!(owed(None), "the merge replaced a reviewed tree");
        assert!(owed(Some(format!("{merge}\n"))), "an older version's mark is ignored");
        assert!(owed(Some(format!("review-free 2 {merge}\n"))), "so is version 2's");
        assert!(
            !owed(Some(format!("{REVIEW_FREE_FORMAT}{merge}\n"))),
            "this version's mark is read"
        );
    }

    /// A merge over a side commit that only switched review off, without an approval:
    /// the side's own settings ask no review, but its history owes it, so the merge
    /// replaced a tree under review and owes review, read back from the walk memo as
    /// walked. Once that switch-off is approved, the merge owes nothing.
    #[test]
    fn a_merge_over_an_unapproved_switch_off_owes_review_until_that_is_approved() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("r");
        let repo = Repository::init(&root).unwrap();
        std::fs::create_dir_all(root.join(crate::layout::STATE_DIR)).unwrap();
        let settings = crate::layout::SETTINGS_FILE;
        commit(
            &repo,
            &[(settings, "require_reviewed: true\n"), ("prompts/a.md", "1")],
            "eng",
        );
        let side = commit(&repo, &[(settings, "require_reviewed: false\n")], "eng");
        let commit_on = super::owed::tests::commit_on;
        let orphan = commit_on(
            &repo,
            None,
            &[],
            &[(settings, "require_reviewed: false\n"), ("prompts/a.md", "EVIL")],
        );
        let merge = commit_on(&repo, Some(orphan), &[orphan, side], &[]);
        repo.set_head_detached(merge).unwrap();
        let head = commit(&repo, &[("runs/t/1.json", "{}")], "runtime");
        let owed = || {
            Trust::new(&repo, ApprovalRule::unsigned("runtime@localhost"))
                .unwrap()
                .remembering(Some(&root))
                .review_owed(head)
                .unwrap()
        };
        assert!(owed(), "the merge replaced a side whose switch-off owes review");
        assert!(owed(), "read back from the walk memo");
        let who = crate::git::Person {
            name: "Rev".into(),
            email: "rev@x.org".into(),
        };
        let tree = super::super::builder_tree_of_commit(&repo, side).unwrap();
        let body = approvals::signed_body("p", tree, side, &who, None).unwrap();
        approvals::write(&repo, body, &who).unwrap();
        assert!(
            !owed(),
            "the switch-off is approved: the merge replaced nothing under review"
        );
    }

    /// A merge over a reviewed tree whose own builder tree is new (a conflict
    /// resolved, one byte added) owes review as one keeping its first parent's does.
    #[test]
    fn a_merge_making_a_new_tree_over_a_reviewed_one_owes_review() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path().join("r")).unwrap();
        let reviewed = commit(
            &repo,
            &[
                (crate::layout::SETTINGS_FILE, "require_reviewed: true\n"),
                ("prompts/a.md", "1"),
            ],
            "eng",
        );
        let sig = git2::Signature::now("eng", "eng@localhost").unwrap();
        let tree_of = |body: &[u8]| {
            let mut own = git2::build::TreeUpdateBuilder::new();
            own.upsert("prompts/a.md", repo.blob(body).unwrap(), git2::FileMode::Blob);
            let empty = repo
                .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
                .unwrap();
            repo.find_tree(own.create_updated(&repo, &empty).unwrap()).unwrap()
        };
        let orphan = repo.commit(None, &sig, &sig, "orphan", &tree_of(b"mine"), &[]).unwrap();
        let parents = [&repo.find_commit(orphan).unwrap(), &repo.find_commit(reviewed).unwrap()];
        let merge = repo
            .commit(None, &sig, &sig, "merge", &tree_of(b"mine, resolved"), &parents)
            .unwrap();
        let mut trust = Trust::new(&repo, rule()).unwrap();
        assert!(trust.review_owed(merge).unwrap());
    }

    /// Fires' records commits on top of a remembered HEAD are judged right, the memo
    /// left as it is until the walk from it grows to MEMO_SAVE_AFTER commits, then
    /// written again; a builder change is written at once.
    #[test]
    fn the_memo_is_written_again_once_enough_records_commits_pile_up() {
        let dir = tempfile::tempdir().unwrap();
        let Some((repo, root, c0, _)) = approved_history(dir.path()) else {
            return;
        };
        let head = repo.head().unwrap().peel_to_commit().unwrap().id();
        check_trusted(&repo, &root, head, c0);
        let first = memo_lines(&root);
        assert!(first[0].starts_with(&head.to_string()), "{first:?}");
        for i in 1..MEMO_SAVE_AFTER {
            let tip = commit(&repo, &[(&format!("runs/t/later{i}.json"), "{}")], "runtime");
            check_trusted(&repo, &root, tip, c0);
            assert_eq!(memo_lines(&root), first, "rewritten after {i} records commits");
        }
        let tip = commit(&repo, &[("runs/t/last.json", "{}")], "runtime");
        check_trusted(&repo, &root, tip, c0);
        assert!(memo_lines(&root)[0].starts_with(&tip.to_string()));
        let change = commit(&repo, &[("prompts/a.md", "2")], "eng");
        Trust::new(&repo, rule())
            .unwrap()
            .remembering(Some(&root))
            .commit(change)
            .unwrap();
        assert!(
            memo_lines(&root)[0].starts_with(&change.to_string()),
            "{:?}",
            memo_lines(&root)
        );
    }
}
