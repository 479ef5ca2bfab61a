//! The trusted base of a revision under review or eval: where it meets the protected
//! branch, as this clone knows that branch. Its settings are the powers eval fires
//! run under and its tree is what a review compares with, so it is found without the
//! revision's help: not its first parent (a proposal of two commits would make its
//! own first commit the "trusted" configuration), not the checked-out branch (a
//! reviewer who checked the proposal out would compare it with itself), and not the
//! work tree's settings (which may be the proposal's).
//!
//! A base whose builder tree owes review nobody gave (pushed past the pre-push hook)
//! lends no powers: evals trust its nearest reviewed ancestor's settings
//! ([`reviewed_ancestor`]: along first parents, and at a merge that owes review the
//! reviewed commit of the parent line that holds the others, [`super::walk`]).
//!
//! The protected branch is the one the remote's `HEAD` names, else `main`, or the
//! `sync.branch` that branch's own committed settings name (those of its nearest
//! reviewed ancestor, [`reviewed_ancestor`]); its remote-tracking ref
//! when the clone has one (what the team pushed, past the pre-push hook), else the
//! local branch.

use super::remote::{judging_remote, protected_branch, tracking_ref};
use super::ReviewError;
use git2::{Oid, Repository};

/// The protected branch's tip: how it is named to a person, and the commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtectedTip {
    /// `origin/main`, or `main` for the local branch.
    pub name: String,
    pub commit: Oid,
    /// The remote whose remote-tracking ref it is (what the team pushed); `None` for
    /// the local branch.
    pub remote: Option<String>,
    /// The branch's name.
    pub branch: String,
}

/// The protected branch's tip as this clone knows it (see the module's doc); `None`
/// when the clone has neither its remote-tracking ref nor a local branch of it.
pub fn protected_tip(repo: &Repository) -> Result<Option<ProtectedTip>, git2::Error> {
    Ok(protected_tip_judged(repo)?.map(|(tip, _)| tip))
}

/// [`protected_tip`], with the tip's nearest commit that owes no review when that was
/// found on the way ([`reviewed_ancestor`]: the tip is the guessed branch's, whose
/// settings were judged to read its `sync.branch`).
fn protected_tip_judged(repo: &Repository) -> Result<Option<(ProtectedTip, Option<Oid>)>, git2::Error> {
    let remote = judging_remote(repo)?;
    let tip_of = |branch: &str| -> Option<ProtectedTip> {
        let tracked = remote.as_deref().and_then(|r| {
            repo.refname_to_id(&tracking_ref(r, branch))
                .ok()
                .map(|commit| ProtectedTip {
                    name: format!("{r}/{branch}"),
                    commit,
                    remote: Some(r.to_string()),
                    branch: branch.to_string(),
                })
        });
        tracked.or_else(|| {
            repo.refname_to_id(&format!("refs/heads/{branch}"))
                .ok()
                .map(|commit| ProtectedTip {
                    name: branch.to_string(),
                    commit,
                    remote: None,
                    branch: branch.to_string(),
                })
        })
    };
    let guess = remote
        .as_deref()
        .map_or_else(|| "main".to_string(), |r| protected_branch(repo, r, None));
    let Some(first) = tip_of(&guess) else {
        return Ok(None);
    };
    // The branch's settings as review left them: a tip pushed past review (a
    // colleague's `sync.branch: <their branch>`) names no branch of its own choosing,
    // which would make the proposal, or anything its author pushed, the base.
    let reviewed = match approval_rule_of(repo, first.commit)?.map(|rule| reviewed_below(repo, first.commit, rule)) {
        Some(Ok(path)) => Some(path.reviewed),
        Some(Err(ReviewError::Git(e))) => return Err(e),
        // Settings that do not load, or nothing reviewed below: no branch followed.
        _ => None,
    };
    let named = match reviewed {
        Some(c) => super::sync_branch_of_commit(repo, c)?,
        None => None,
    }
    .filter(|b| *b != guess && !b.starts_with(super::PROPOSAL_PREFIX));
    // Another branch named: only if the guessed branch did not go back from the
    // commit this clone judged it by (a forced push of an orphan naming her branch
    // would otherwise lead the judge to a branch with no mark of its own).
    let named = match (named, reviewed) {
        (Some(b), Some(c)) => match judge_forward(repo, &first, c) {
            Ok(f) if f.at == c => {
                // Remembered too, so a later forced push of this branch has a mark to
                // meet even while the judge follows the other one.
                f.remember();
                Some(b)
            }
            Ok(f) => super::sync_branch_of_commit(repo, f.at)?
                .filter(|n| *n != guess && !n.starts_with(super::PROPOSAL_PREFIX)),
            Err(_) => None,
        },
        _ => None,
    };
    Ok(Some(match named.and_then(|b| tip_of(&b)) {
        Some(tip) => (tip, None),
        None => (first, reviewed),
    }))
}

/// Where `head` meets the protected branch, and that branch's tip.
pub fn trusted_base(repo: &Repository, head: Oid) -> Result<(Oid, ProtectedTip), ReviewError> {
    let Some(tip) = protected_tip(repo)? else {
        return Err(ReviewError::Usage(
            "no protected branch to judge against: this clone has neither the remote's default branch nor `main`"
                .into(),
        ));
    };
    match repo.merge_base(tip.commit, head) {
        Ok(base) => Ok((base, tip)),
        Err(e) if e.code() == git2::ErrorCode::NotFound => Err(ReviewError::Refused(format!(
            "{} shares no history with {}: there is no trusted base to judge it from",
            crate::text::short_oid(head),
            tip.name
        ))),
        Err(e) => Err(e.into()),
    }
}

/// The committed settings a command acting on the protected branch judges by: those
/// of the branch's tip as review left it ([`reviewed_ancestor`]), never the work
/// tree's, which are a proposal's when the proposal is checked out (a CI job landing
/// the branch it was started for). Their approval rule, allowed-signers list and
/// `sync` are then the branch's, not the author's: an absolute
/// `review.allowed_signers` pointing into the checkout would otherwise make the
/// author's own list the only judge of the author's approval. `None` when the clone
/// has no protected branch to read (the caller falls back to the work tree's).
pub fn protected_settings(
    repo: &Repository,
) -> Result<Option<(ProtectedTip, crate::settings::RuntimeSettings)>, super::delta::DeltaError> {
    Ok(protected_judgement(repo)?.map(|p| (p.tip, p.settings)))
}

/// The protected branch as this clone's commands judge by it.
pub struct Protected {
    pub tip: ProtectedTip,
    /// The commit whose settings judge: the branch's nearest reviewed commit, or the
    /// one this clone judged by before when the branch went back ([`super::judged`]).
    pub commit: Oid,
    pub settings: crate::settings::RuntimeSettings,
}

/// [`protected_settings`], with the commit they are read from.
pub fn protected_judgement(repo: &Repository) -> Result<Option<Protected>, super::delta::DeltaError> {
    let Some((tip, reviewed)) = protected_tip_judged(repo)? else {
        return Ok(None);
    };
    let at = match reviewed.map_or_else(|| reviewed_found(repo, tip.commit), |c| Ok(reviewed_at(c))) {
        Ok(super::walk::Found::Reviewed(path)) => path.reviewed,
        // Nothing reviewed below: the tip's own settings, which judge it owing review
        // (a repository before its first approval). In a shallow clone the walk also
        // ends at the cut, whose commits read as roots: an honest tip (records on a
        // reviewed tree) reads as owing review there too, so the tip's settings judge
        // as well (a known limit, docs/approved-tree.md).
        Ok(super::walk::Found::Nothing) => tip.commit,
        Err(ReviewError::Git(e)) => return Err(e.into()),
        // The walk refused: nothing judges, least of all the tip's own settings.
        Err(e) => return Err(super::delta::DeltaError::NoTrustedBase(format!("{}: {e}", tip.name))),
    };
    let forward = judge_forward(repo, &tip, at)?;
    if let Some(back) = &forward.back {
        tracing::warn!(
            "{back}; judging by that commit's settings until the branch's tree is approved again (approve a new commit on top of {}; fetch approvals first: `git fetch {}`), or remove {} to accept the branch's rules",
            back.tip,
            back.remote,
            back.mark.display()
        );
    }
    forward.remember();
    Ok(Some(Protected {
        tip,
        commit: forward.at,
        settings: forward.settings,
    }))
}

/// `commit` itself as the reviewed commit (nothing owed on the way).
fn reviewed_at(commit: Oid) -> super::walk::Found {
    super::walk::Found::Reviewed(ReviewedPath {
        reviewed: commit,
        owed: Vec::new(),
    })
}

/// What the forward rule ([`super::judged`]) makes of judging `tip` by its reviewed
/// commit, before any effect: the commit whose settings judge and those settings, why
/// that is not the reviewed commit, and the point to remember.
struct Forward {
    at: Oid,
    settings: crate::settings::RuntimeSettings,
    back: Option<super::judged::WentBack>,
    remember: Option<Remember>,
}

impl Forward {
    /// Writes the point to remember, if any (a failure is said, not fatal: the
    /// judgement stands).
    fn remember(&self) {
        if let Some(r) = &self.remember {
            if let Err(e) = r.mark.write(r.seen.as_ref(), &r.point) {
                tracing::warn!(error = %e, mark = %r.mark.path().display(), "remembering the reviewed commit this clone judged by failed");
            }
        }
    }
}

/// A point to remember once the settings judged, unless the mark moved from `seen`.
struct Remember {
    mark: super::judged::Mark,
    seen: Option<super::judged::Point>,
    point: super::judged::Point,
}

/// [`Forward`] for `tip`, whose reviewed commit is `at`. A local branch with no
/// remote-tracking ref and a shallow clone (whose walk ends at its cut) are judged as
/// found. Nothing is remembered unless `at`'s settings load.
fn judge_forward(repo: &Repository, tip: &ProtectedTip, at: Oid) -> Result<Forward, super::delta::DeltaError> {
    use super::judged::{decide, Decision, Line, Mark, Point, WentBack};
    let label = |c: Oid| format!("{} ({})", tip.name, crate::text::short_oid(c));
    let settings = super::delta::settings_of_commit(repo, at, &label(at))?;
    let as_found = |settings, remember| Forward {
        at,
        settings,
        back: None,
        remember,
    };
    let Some(remote) = tip.remote.as_deref().filter(|_| !repo.is_shallow()) else {
        return Ok(as_found(settings, None));
    };
    let mark = Mark::of(repo.commondir(), remote, &tip.branch);
    let tree = super::builder_tree_of_commit(repo, at)?;
    let Some(before) = mark.read() else {
        let point = Point {
            commit: at,
            tree,
            approval: newest_counting(repo, at, None)?,
        };
        return Ok(as_found(
            settings,
            Some(Remember {
                mark,
                seen: None,
                point,
            }),
        ));
    };
    let line = Line::of(repo, &before, at)?;
    let mut now = Point {
        commit: at,
        tree,
        approval: newest_counting(repo, at, (line.kept && !line.on_line).then_some(before.commit))?,
    };
    if now.tree == before.tree && now.approval.is_none() {
        now.approval = before.approval.clone();
    }
    let why = match decide(&before, &now, &line, settings.require_reviewed, |a, b| {
        super::forward::older(repo, a, b)
    }) {
        Decision::Stay => return Ok(as_found(settings, None)),
        Decision::Forward => {
            let seen = Some(before);
            return Ok(as_found(settings, Some(Remember { mark, seen, point: now })));
        }
        Decision::Back(why) => why,
    };
    let back = WentBack {
        tip: tip.name.clone(),
        remote: remote.to_string(),
        before,
        now,
        why,
        mark: mark.path().to_path_buf(),
    };
    let kept = back.before.commit;
    if !line.kept || super::builder_tree_of_commit(repo, kept)? != back.before.tree {
        return Err(super::delta::DeltaError::WentBack(Box::new(back)));
    }
    Ok(Forward {
        at: kept,
        settings: super::delta::settings_of_commit(repo, kept, &label(kept))?,
        back: Some(back),
        remember: None,
    })
}

/// The newest approval of `at`'s builder tree that counts: by the rules of `at`'s own
/// history, or, with `on` (a remembered commit the branch's history lost), as a
/// change on that commit would be judged (its rule and its signers list): the rules of
/// a history that replaced the branch never judge their own approvals.
fn newest_counting(repo: &Repository, at: Oid, on: Option<Oid>) -> Result<Option<super::forward::Stamp>, git2::Error> {
    let Some(rule) = approval_rule_of(repo, on.unwrap_or(at))? else {
        return Ok(None);
    };
    let mut trust = super::trust::Trust::new(repo, rule)?;
    let judged = match on {
        Some(base) => trust.proposal(base, at)?,
        None => trust.commit(at)?,
    };
    let stamps: Vec<_> = judged.counting.iter().filter_map(super::forward::Stamp::of).collect();
    Ok(super::forward::newest(repo, &stamps).cloned())
}

/// Whose settings an eval of `base` trusts: `base`, or, when its builder tree owes
/// review that no approval gave (a colleague pushed past the pre-push hook onto the
/// protected branch), its nearest ancestor that owes none ([`reviewed_below`], by the
/// approval rule of `base`'s own settings). The base itself is still what a review
/// compares with; its eval is then judged against that ancestor's powers like the
/// head's. Settings that do not load leave `base` as it is (the eval refuses them
/// itself).
pub fn reviewed_ancestor(repo: &Repository, base: Oid) -> Result<Oid, ReviewError> {
    Ok(reviewed_ancestor_path(repo, base)?.reviewed)
}

/// [`reviewed_ancestor`], with the commits that owe review on the way to it.
pub fn reviewed_ancestor_path(repo: &Repository, base: Oid) -> Result<ReviewedPath, ReviewError> {
    match approval_rule_of(repo, base)? {
        Some(rule) => reviewed_below(repo, base, rule),
        None => Ok(ReviewedPath {
            reviewed: base,
            owed: Vec::new(),
        }),
    }
}

pub use super::walk::ReviewedPath;

/// The approval rule `commit` is judged by: its committed settings' rule as
/// [`super::trust::Trust::rule_in_force`] holds it (an unapproved switch-off of
/// signatures, or to another list, is judged by the rule before it); `None` when the
/// settings do not load.
fn approval_rule_of(repo: &Repository, commit: Oid) -> Result<Option<super::signing::ApprovalRule>, git2::Error> {
    let Ok(settings) = super::delta::settings_of_commit(repo, commit, "the base") else {
        return Ok(None);
    };
    let Ok(rule) = super::signing::ApprovalRule::from_settings(&settings) else {
        return Ok(None);
    };
    super::trust::Trust::rule_in_force(repo, commit, rule, None).map(Some)
}

/// The nearest commit from `base` down that owes no review under `rule`, and the
/// commits that owe it on the way ([`super::walk`]); nothing reviewed below is refused.
fn reviewed_below(
    repo: &Repository,
    base: Oid,
    rule: super::signing::ApprovalRule,
) -> Result<ReviewedPath, ReviewError> {
    let mut trust = super::trust::Trust::new(repo, rule)?;
    match super::walk::reviewed_below(repo, &mut trust, base)? {
        super::walk::Found::Reviewed(path) => Ok(path),
        super::walk::Found::Nothing => Err(super::walk::nothing_reviewed(repo, base)),
    }
}

/// [`reviewed_ancestor`], telling "nothing reviewed below" (a repository before its
/// first approval) apart from a walk that refused (lines that disagree, a shallow
/// clone's missing parent): only the first may fall back to the tip's own settings.
fn reviewed_found(repo: &Repository, base: Oid) -> Result<super::walk::Found, ReviewError> {
    match approval_rule_of(repo, base)? {
        Some(rule) => {
            let mut trust = super::trust::Trust::new(repo, rule)?;
            super::walk::reviewed_below(repo, &mut trust, base)
        }
        None => Ok(reviewed_at(base)),
    }
}

/// The base `builder eval` compares `head` with by default: where it meets the
/// protected branch, named after it; for a commit on that branch's first-parent line
/// already (its tip, a commit made on `main` and not pushed yet), its first parent,
/// unnamed (`None`: the caller says `<head>^`), and no base at the root. A commit
/// merged into the branch from another line has no base of its own: a usage error.
pub fn eval_base(repo: &Repository, head: Oid) -> Result<Option<(Option<String>, Oid)>, ReviewError> {
    let (base, tip) = trusted_base(repo, head)?;
    if base != head {
        let name = if base == tip.commit {
            tip.name
        } else {
            format!("where the head meets {}", tip.name)
        };
        return Ok(Some((Some(name), base)));
    }
    let mut next = Some(tip.commit);
    while let Some(c) = next {
        if c == head {
            let parent = repo.find_commit(head)?.parent_ids().next();
            return Ok(parent.map(|p| (None, p)));
        }
        next = repo.find_commit(c)?.parent_ids().next();
    }
    Err(ReviewError::Usage(format!(
        "{} was merged into {} from another line: name the revision to compare with (--base REV)",
        crate::text::short_oid(head),
        tip.name
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(repo: &Repository, branch: &str, parent: Option<Oid>, settings: &str) -> Oid {
        let blob = repo.blob(settings.as_bytes()).unwrap();
        let mut dir = repo.treebuilder(None).unwrap();
        dir.insert("runtime.yaml", blob, 0o100644).unwrap();
        let dir = dir.write().unwrap();
        let mut top = repo.treebuilder(None).unwrap();
        top.insert("settings", dir, 0o040000).unwrap();
        let tree = repo.find_tree(top.write().unwrap()).unwrap();
        let sig = git2::Signature::now("Eng", "eng@example.com").unwrap();
        let parents: Vec<git2::Commit> = parent.iter().map(|p| repo.find_commit(*p).unwrap()).collect();
        let refs: Vec<&git2::Commit> = parents.iter().collect();
        repo.commit(Some(&format!("refs/heads/{branch}")), &sig, &sig, "c", &tree, &refs)
            .unwrap()
    }

    /// Rev's approval of `commit`'s builder tree, as proposal `name`.
    fn approve(repo: &Repository, name: &str, commit: Oid) {
        let rev = crate::git::Person {
            name: "Rev".into(),
            email: "rev@example.com".into(),
        };
        let tree = crate::review::builder_tree_of_commit(repo, commit).unwrap();
        crate::review::approvals::record(repo, name, tree, commit, &rev).unwrap();
    }

    #[test]
    fn the_protected_branch_is_found_from_committed_settings_never_from_a_proposal() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        assert_eq!(protected_tip(&repo).unwrap(), None);
        let main = commit(&repo, "main", None, "version: 1\n");
        let tip = protected_tip(&repo).unwrap().unwrap();
        assert_eq!((tip.name.as_str(), tip.commit), ("main", main));
        // A proposal naming itself as the sync branch is not believed: main's
        // settings are read, not the proposal's.
        let prop = commit(
            &repo,
            "proposals/p",
            Some(main),
            "sync: {remote: origin, branch: proposals/p}\n",
        );
        assert_eq!(protected_tip(&repo).unwrap().unwrap().commit, main);
        assert_eq!(trusted_base(&repo, prop).unwrap().0, main);
        assert_eq!(eval_base(&repo, prop).unwrap(), Some((Some("main".to_string()), main)));
        // main's own settings name `prod`: that branch is the protected one.
        let to_prod = "version: 1\nprovider: {kind: replay, replay: x}\nsync: {remote: origin, branch: prod}\n";
        let main2 = commit(&repo, "main", Some(main), to_prod);
        let prod = commit(&repo, "prod", Some(main2), to_prod);
        assert_eq!(protected_tip(&repo).unwrap().unwrap().commit, prod);
        // A commit on the branch's first-parent line is compared with its parent.
        assert_eq!(eval_base(&repo, prod).unwrap(), Some((None, main2)));
        assert_eq!(eval_base(&repo, main).unwrap(), None, "the root has no base");
        let stray = commit(&repo, "stray", None, "version: 1 # another history\n");
        let r = trusted_base(&repo, stray);
        assert!(matches!(r, Err(ReviewError::Refused(_))), "{r:?}");
    }

    #[test]
    fn a_base_pushed_past_review_lends_no_powers_its_reviewed_ancestor_does() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let on = "version: 1\nprovider: {kind: replay, replay: x}\nrequire_reviewed: true\n";
        let off = format!("{on}sandbox: {{landlock: \"off\"}}\n");
        let reviewed_tip = commit(&repo, "main", None, on);
        approve(&repo, "p", reviewed_tip);
        // Pushed past the hook: wider settings, no approval.
        let pushed = commit(&repo, "main", Some(reviewed_tip), &off);
        let prop = commit(&repo, "proposals/p", Some(pushed), &format!("{off}# p\n"));
        assert_eq!(
            trusted_base(&repo, prop).unwrap().0,
            pushed,
            "the review compares with it"
        );
        assert_eq!(
            reviewed_ancestor(&repo, pushed).unwrap(),
            reviewed_tip,
            "its powers are not trusted"
        );
        assert_eq!(reviewed_ancestor(&repo, reviewed_tip).unwrap(), reviewed_tip);
        // Approved, it is trusted.
        approve(&repo, "q", pushed);
        assert_eq!(reviewed_ancestor(&repo, pushed).unwrap(), pushed);
    }

    /// An orphan history with review off, merged onto `main` with its own line first
    /// (`git commit-tree -p <orphan> -p main`: a fast-forward of `main`, pushed past the
    /// hook). The merge owes review (it replaced a reviewed tree); the walk down to a
    /// reviewed commit goes on along the line it replaced, never down the orphan's,
    /// whose root owes nothing and would lend its settings (review off, the sandbox
    /// off) to every command that judges and every eval.
    #[test]
    fn a_merge_over_an_orphan_line_lends_the_orphans_settings_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let (reviewed_tip, merge) = merge_over_an_orphan_line(&repo);
        assert_eq!(protected_tip(&repo).unwrap().unwrap().commit, merge);
        assert_eq!(
            reviewed_ancestor_path(&repo, merge).unwrap(),
            ReviewedPath {
                reviewed: reviewed_tip,
                owed: vec![merge]
            }
        );
        let (_, settings) = protected_settings(&repo).unwrap().unwrap();
        assert!(settings.require_reviewed, "the orphan's settings judge: {settings:?}");
    }

    /// Review on and `main` approved; Mallory's orphan line (review and Landlock off)
    /// merged with `main` as its second parent, keeping her tree, and `main` moved to
    /// the merge past the hook. Returns the reviewed tip and the merge.
    fn merge_over_an_orphan_line(repo: &Repository) -> (Oid, Oid) {
        let on = "version: 1\nprovider: {kind: replay, replay: x}\nrequire_reviewed: true\n";
        let off = "version: 1\nprovider: {kind: replay, replay: x}\nsandbox: {landlock: \"off\"}\n";
        let reviewed_tip = commit(repo, "main", None, on);
        approve(repo, "p", reviewed_tip);
        let orphan = repo.find_commit(commit(repo, "o", None, off)).unwrap();
        let main = repo.find_commit(reviewed_tip).unwrap();
        let sig = git2::Signature::now("Mallory", "mallory@example.com").unwrap();
        let merge = repo
            .commit(None, &sig, &sig, "m", &orphan.tree().unwrap(), &[&orphan, &main])
            .unwrap();
        repo.reference("refs/heads/main", merge, true, "fast-forward past the hook")
            .unwrap();
        (reviewed_tip, merge)
    }

    /// A clone of `full`'s `main` at `--depth 1` (a CI checkout's default), at `at`,
    /// with the approvals fetched.
    fn shallow_clone(full: &std::path::Path, at: &std::path::Path) -> Repository {
        let url = format!("file://{}", full.display());
        let cloned = std::process::Command::new("git")
            .args(["clone", "-q", "--depth", "1", "--branch", "main", &url])
            .arg(at)
            .output()
            .unwrap();
        assert!(cloned.status.success(), "{}", String::from_utf8_lossy(&cloned.stderr));
        crate::review::remote::fetch(at, "origin").unwrap();
        Repository::open(at).unwrap()
    }

    /// The same merge in a shallow clone (`--depth 1`) that has the approvals but
    /// neither parent (its boundary commits read as roots): no walk reaches a reviewed
    /// commit there, and the refusal says the clone is shallow. (What the builder
    /// commands then judge by is the tip's own settings, as in an honest shallow clone
    /// below: a known limit.)
    #[test]
    fn a_shallow_clone_missing_the_reviewed_parent_says_it_is_shallow() {
        let dir = tempfile::tempdir().unwrap();
        let full = dir.path().join("full");
        let (reviewed_tip, merge) = merge_over_an_orphan_line(&Repository::init(&full).unwrap());
        let clone = shallow_clone(&full, &dir.path().join("shallow"));
        assert!(clone.is_shallow());
        assert!(
            clone.find_commit(reviewed_tip).is_err(),
            "the clone has the reviewed parent"
        );
        assert!(
            !crate::review::approvals::load(&clone).unwrap().is_empty(),
            "the clone has no approvals"
        );
        let r = reviewed_ancestor_path(&clone, merge);
        assert!(
            matches!(&r, Err(ReviewError::Refused(why)) if why.contains("shallow")),
            "{r:?}"
        );
    }

    /// An honest shallow clone (a CI checkout at `--depth 1`): `main`'s reviewed tree,
    /// then a records-only commit on top, approvals fetched. Its walk reaches the cut
    /// without a reviewed commit, but the builder commands still run, by its settings.
    #[test]
    fn an_honest_shallow_clone_is_judged_by_its_tips_settings() {
        let dir = tempfile::tempdir().unwrap();
        let full = dir.path().join("full");
        let repo = Repository::init(&full).unwrap();
        let on = "version: 1\nprovider: {kind: replay, replay: x}\nrequire_reviewed: true\n";
        let reviewed = commit(&repo, "main", None, on);
        approve(&repo, "p", reviewed);
        let tree = repo.find_commit(reviewed).unwrap().tree().unwrap();
        let sig = git2::Signature::now("runtime", "runtime@localhost").unwrap();
        let parent = repo.find_commit(reviewed).unwrap();
        let mut records = repo.treebuilder(Some(&tree)).unwrap();
        let blob = repo.blob(b"# report\n").unwrap();
        let mut reports = repo.treebuilder(None).unwrap();
        reports.insert("r.md", blob, 0o100644).unwrap();
        records.insert("reports", reports.write().unwrap(), 0o040000).unwrap();
        let records = repo.find_tree(records.write().unwrap()).unwrap();
        let tip = repo
            .commit(
                Some("refs/heads/main"),
                &sig,
                &sig,
                "runtime: records",
                &records,
                &[&parent],
            )
            .unwrap();
        let clone = shallow_clone(&full, &dir.path().join("shallow"));
        assert!(clone.is_shallow() && clone.find_commit(reviewed).is_err());
        let (found, settings) = protected_settings(&clone).unwrap().unwrap();
        assert_eq!(found.commit, tip);
        assert!(settings.require_reviewed);
    }

    /// An ordinary merge pushed past the hook with review on (a feature line that
    /// forked from `main` before `main` tightened its settings) keeps to its first
    /// parent: the judge is `main`'s reviewed tip, not the older commit the feature
    /// line forked from, whose looser settings a later review removed.
    #[test]
    fn an_ordinary_merge_past_review_is_judged_along_its_first_parent() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let on = "version: 1\nprovider: {kind: replay, replay: x}\nrequire_reviewed: true\n";
        let forked = commit(&repo, "main", None, &format!("{on}sandbox: {{landlock: \"off\"}}\n"));
        approve(&repo, "p", forked);
        let feature = commit(
            &repo,
            "feature",
            Some(forked),
            &format!("{on}sandbox: {{landlock: \"off\"}}\n# f\n"),
        );
        let tightened = commit(&repo, "main", Some(forked), on);
        approve(&repo, "q", tightened);
        let (first, second) = (repo.find_commit(tightened).unwrap(), repo.find_commit(feature).unwrap());
        let sig = git2::Signature::now("Eng", "eng@example.com").unwrap();
        let merge = repo
            .commit(
                Some("refs/heads/main"),
                &sig,
                &sig,
                "merge",
                &second.tree().unwrap(),
                &[&first, &second],
            )
            .unwrap();
        assert_eq!(
            reviewed_ancestor_path(&repo, merge).unwrap(),
            ReviewedPath {
                reviewed: tightened,
                owed: vec![merge]
            }
        );
    }

    /// A `sync.branch` pushed past review onto the protected branch does not pick the
    /// base: naming the proposal's own branch would make a review compare the proposal
    /// with itself (an empty diff, no regression). Once reviewed, it is followed.
    #[test]
    fn a_sync_branch_pushed_past_review_picks_no_base() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let on = "version: 1\nprovider: {kind: replay, replay: x}\nrequire_reviewed: true\n";
        let reviewed_tip = commit(&repo, "main", None, on);
        approve(&repo, "p", reviewed_tip);
        let pushed = commit(
            &repo,
            "main",
            Some(reviewed_tip),
            &format!("{on}sync: {{remote: origin, branch: hers}}\n"),
        );
        let prop = commit(&repo, "hers", Some(pushed), &format!("{on}# her change\n"));
        assert_eq!(protected_tip(&repo).unwrap().unwrap().commit, pushed);
        assert_eq!(trusted_base(&repo, prop).unwrap().0, pushed, "not the proposal itself");
        approve(&repo, "q", pushed);
        assert_eq!(
            protected_tip(&repo).unwrap().unwrap().commit,
            prop,
            "reviewed, it is followed"
        );
        // Settings that do not load say nothing of which branch is protected.
        let broken = commit(
            &repo,
            "main",
            Some(pushed),
            "sync: {remote: origin, branch: hers}\nnot_a_setting: 1\n",
        );
        assert_eq!(protected_tip(&repo).unwrap().unwrap().commit, broken);
    }
}
