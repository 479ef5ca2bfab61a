//! Approvals only move forward (issue 17 item 4). Pushing an older approved tree
//! back (a revert to rules a later review removed, or the old commit itself) would
//! otherwise roll a box back under an approval that was current once: every tree in
//! it was approved. So a box never moves to, and a fire never runs, a builder tree
//! whose newest approval is older than the approval of the newest tree the box ran,
//! unless a newer approval names it again: a rollback is an unapproved change.
//!
//! "Older" is decided in two steps, so that a reviewer's clock running fast cannot
//! turn a later approval into an older one:
//!
//! 1. causally: each approval names the head commit it approved; when one head
//!    descends from the other, the descendant's approval is the newer (a proposal is
//!    made on the branch that holds the previous merge, so in the normal flow every
//!    approval's head descends from the previous one's);
//! 2. otherwise (unrelated histories, heads this clone lacks), by `approved_at`, the
//!    time inside the approval's body, which a signature covers.
//!
//! The box remembers the newest approved tree it ran in `.runtime/approvals-ran/`
//! (one file per approval, named by its id, holding the tree, the time and the head),
//! and again in git's directory (`runtime-approvals-ran/`), where `git clean -fdx` or
//! a `.runtime/` deleted to start afresh does not reach: the mark that a reset, a
//! pull, a sync moving HEAD or a tidy-up cannot lower. The fire judges
//! with [`check`] and records with [`remember`]; a sync judges an incoming tip the
//! same way before it moves ([`check`] with the tip's verdict).

use super::approvals::Approval;
use chrono::{DateTime, Utc};
use git2::{Oid, Repository};
use std::path::{Path, PathBuf};

/// Under `.runtime/`: the approvals of the trees this box ran.
pub const RAN_DIR: &str = "approvals-ran";

/// One approval's place in time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    /// The approval's commit id.
    pub id: String,
    /// The builder tree it names.
    pub tree: Oid,
    pub approved_at: DateTime<Utc>,
    /// The head commit it approved, when it names one.
    pub head: Option<Oid>,
}

impl Stamp {
    /// The stamp of `approval`; `None` when its tree is not an id.
    pub fn of(approval: &Approval) -> Option<Stamp> {
        Some(Stamp {
            id: approval.id.to_string(),
            tree: Oid::from_str(&approval.body.tree).ok()?,
            approved_at: approval.body.approved_at,
            head: approval.body.head.as_deref().and_then(|h| Oid::from_str(h).ok()),
        })
    }

    /// The mark's line: tree, time and head.
    pub(super) fn line(&self) -> String {
        format!(
            "{} {} {}\n",
            self.tree,
            self.approved_at.to_rfc3339(),
            self.head.map(|h| h.to_string()).unwrap_or_else(|| "-".into())
        )
    }

    /// Reads [`Stamp::line`] back.
    pub(super) fn parse(id: &str, line: &str) -> Option<Stamp> {
        let mut f = line.split_whitespace();
        let tree = Oid::from_str(f.next()?).ok()?;
        let approved_at = DateTime::parse_from_rfc3339(f.next()?).ok()?.with_timezone(&Utc);
        let head = match f.next()? {
            "-" => None,
            h => Some(Oid::from_str(h).ok()?),
        };
        Some(Stamp {
            id: id.to_string(),
            tree,
            approved_at,
            head,
        })
    }

    /// The approval id shortened for messages.
    fn short(&self) -> &str {
        crate::text::short_id(&self.id)
    }
}

/// Whether approval `a` is older than approval `b`: by their heads when one descends
/// from the other, else by their times.
pub fn older(repo: &Repository, a: &Stamp, b: &Stamp) -> bool {
    if let (Some(ha), Some(hb)) = (a.head, b.head) {
        if ha != hb {
            if repo.graph_descendant_of(hb, ha).unwrap_or(false) {
                return true;
            }
            if repo.graph_descendant_of(ha, hb).unwrap_or(false) {
                return false;
            }
        }
    }
    a.approved_at < b.approved_at
}

/// The newest of `stamps` by [`older`].
pub fn newest<'a>(repo: &Repository, stamps: impl IntoIterator<Item = &'a Stamp>) -> Option<&'a Stamp> {
    stamps.into_iter().fold(None, |best: Option<&Stamp>, s| match best {
        Some(b) if !older(repo, b, s) => Some(b),
        _ => Some(s),
    })
}

/// A rollback: the tree a fire or sync would run, whose newest approval is older than
/// the approval of a tree the box ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollback {
    pub tree: Oid,
    /// The newest approval of `tree` that counts.
    pub newest: Stamp,
    /// The newest approval of the trees the box ran.
    pub ran: Stamp,
}

impl Rollback {
    /// One line, for a card's summary.
    pub fn summary(&self) -> String {
        format!(
            "builder tree {} is a rollback: its newest approval is older than that of tree {}, which this box ran",
            crate::text::short_oid(self.tree),
            crate::text::short_oid(self.ran.tree)
        )
    }

    /// Why, in full, and what to do.
    pub fn detail(&self) -> String {
        format!(
            "builder tree {} has approvals, but the newest that counts ({}, {}) is older than approval {} ({}) of builder tree {}, the newest this box ran: going back would run rules a later review replaced, so it is an unapproved change. To go back on purpose, have it approved again (propose the revert, approve, merge): a newer approval naming the tree lets the box move to it.",
            self.tree,
            self.newest.short(),
            self.newest.approved_at.to_rfc3339(),
            self.ran.short(),
            self.ran.approved_at.to_rfc3339(),
            self.ran.tree
        )
    }
}

/// The judgement a fire and a sync make before running or moving to `tree`, whose
/// approvals that count are `counting` (newest first or not: the newest is picked
/// here), against what the box ran (`ran`, from [`read`]). `None`: forward (or the
/// same tree, or nothing ran yet under review).
pub fn check(repo: &Repository, tree: Oid, counting: &[Approval], ran: Option<&Stamp>) -> Option<Rollback> {
    let ran = ran?;
    if ran.tree == tree {
        return None;
    }
    let stamps: Vec<Stamp> = counting.iter().filter_map(Stamp::of).collect();
    let newest = newest(repo, &stamps)?;
    older(repo, newest, ran).then(|| Rollback {
        tree,
        newest: newest.clone(),
        ran: ran.clone(),
    })
}

fn ran_dir(root: &Path) -> PathBuf {
    root.join(crate::layout::STATE_DIR).join(RAN_DIR)
}

/// In git's directory of the work tree: the mark's second copy.
const GIT_RAN_DIR: &str = "runtime-approvals-ran";

/// Reads one entry of a copy of the mark by its name.
type ReadEntry<'a> = dyn Fn(&str) -> Option<Vec<u8>> + 'a;

/// The newest approval of the trees the box at `root` ran (`None` before its first
/// fire under review), by either copy of the mark. Unreadable entries are skipped.
pub fn read(repo: &Repository, root: &Path) -> Option<Stamp> {
    // Each copy's entries: a name that is an approval id, and its file's bytes (the
    // work tree's copy read through no link, as every file of `.runtime/`).
    let beneath = crate::beneath::open_root(root).ok();
    let in_work_tree = |name: &str| {
        let rel = Path::new(crate::layout::STATE_DIR).join(RAN_DIR).join(name);
        crate::beneath::read_regular(beneath.as_ref()?, &rel, 4096).ok()
    };
    let in_git_dir = |name: &str| {
        let path = repo.path().join(GIT_RAN_DIR).join(name);
        let regular = std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_file());
        regular.then(|| std::fs::read(&path).ok()).flatten()
    };
    let copies: [(PathBuf, &ReadEntry); 2] = [
        (ran_dir(root), &in_work_tree),
        (repo.path().join(GIT_RAN_DIR), &in_git_dir),
    ];
    let mut stamps = Vec::new();
    for (dir, bytes_of) in copies {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || Oid::from_str(&name).is_err() {
                continue;
            }
            if let Some(bytes) = bytes_of(&name) {
                stamps.extend(Stamp::parse(&name, &String::from_utf8_lossy(&bytes)));
            }
        }
    }
    newest(repo, &stamps).cloned()
}

/// Remembers that the box at `root` ran under `approval` (the newest that counts of
/// the tree it ran), unless what it remembers is newer; older entries are then
/// removed. A concurrent fire writing the same approval is no error.
pub fn remember(repo: &Repository, root: &Path, counting: &[Approval]) -> std::io::Result<()> {
    let stamps: Vec<Stamp> = counting.iter().filter_map(Stamp::of).collect();
    let Some(new) = newest(repo, &stamps) else {
        return Ok(());
    };
    let before = read(repo, root);
    // The newest stays the mark; each fire puts back a copy that is missing (a box
    // that ran this approval before the second copy existed, or was killed between
    // the two writes, or tidied).
    let mark = match &before {
        Some(b) if b.id == new.id || older(repo, new, b) => b.clone(),
        _ => new.clone(),
    };
    let dir = crate::beneath::open_root(root)?;
    let rel = Path::new(crate::layout::STATE_DIR).join(RAN_DIR).join(&mark.id);
    match crate::beneath::create_new(&dir, &rel, mark.line().as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let git_copy = repo.path().join(GIT_RAN_DIR).join(&mark.id);
    if std::fs::read(&git_copy).ok().as_deref() != Some(mark.line().as_bytes()) {
        crate::durable::replace(&git_copy, mark.line().as_bytes())?;
    }
    if let Some(b) = before.filter(|b| b.id != mark.id) {
        let old = Path::new(crate::layout::STATE_DIR).join(RAN_DIR).join(&b.id);
        let _ = crate::beneath::remove_file(&dir, &old);
        let _ = std::fs::remove_file(repo.path().join(GIT_RAN_DIR).join(&b.id));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::approvals::ApprovalBody;

    fn commit(repo: &Repository, parent: Option<Oid>, body: &str) -> Oid {
        let blob = repo.blob(body.as_bytes()).unwrap();
        let mut tb = repo.treebuilder(None).unwrap();
        tb.insert("f", blob, 0o100644).unwrap();
        let tree = repo.find_tree(tb.write().unwrap()).unwrap();
        let sig = git2::Signature::now("a", "a@x").unwrap();
        let parents: Vec<git2::Commit> = parent.iter().map(|p| repo.find_commit(*p).unwrap()).collect();
        let refs: Vec<&git2::Commit> = parents.iter().collect();
        repo.commit(None, &sig, &sig, body, &tree, &refs).unwrap()
    }

    fn approval(id: u8, tree: u8, at: &str, head: Option<Oid>) -> Approval {
        Approval {
            id: Oid::from_bytes(&[id; 20]).unwrap(),
            body: ApprovalBody {
                proposal: "p".into(),
                tree: Oid::from_bytes(&[tree; 20]).unwrap().to_string(),
                approver: "R <r@x>".into(),
                approved_at: at.parse().unwrap(),
                head: head.map(|h| h.to_string()),
                signature: None,
            },
        }
    }

    #[test]
    fn an_older_approved_tree_is_a_rollback_and_a_newer_approval_moves_it_forward() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let h1 = commit(&repo, None, "1");
        let h2 = commit(&repo, Some(h1), "2");
        let h3 = commit(&repo, Some(h2), "3");
        let t = |n: u8| Oid::from_bytes(&[n; 20]).unwrap();
        let a1 = approval(1, 1, "2026-01-01T10:00:00Z", Some(h1));
        // Approved later, but by a reviewer whose clock ran 5 minutes behind: the head
        // descends from a1's, so it is the newer.
        let a2 = approval(2, 2, "2026-01-01T09:55:00Z", Some(h2));
        let root = dir.path();
        std::fs::create_dir_all(root.join(".runtime")).unwrap();
        assert_eq!(read(&repo, root), None);
        assert_eq!(
            check(&repo, t(1), std::slice::from_ref(&a1), None),
            None,
            "nothing ran yet"
        );
        remember(&repo, root, std::slice::from_ref(&a1)).unwrap();
        assert_eq!(
            check(&repo, t(2), std::slice::from_ref(&a2), read(&repo, root).as_ref()),
            None
        );
        remember(&repo, root, std::slice::from_ref(&a2)).unwrap();
        let ran = read(&repo, root).unwrap();
        assert_eq!(ran.id, a2.id.to_string());
        assert_eq!(
            std::fs::read_dir(root.join(".runtime").join(RAN_DIR)).unwrap().count(),
            1,
            "the older mark is removed"
        );
        // Back to tree 1: a rollback, however it came.
        let back = check(&repo, t(1), std::slice::from_ref(&a1), Some(&ran)).unwrap();
        assert!(back.summary().contains("rollback"), "{}", back.summary());
        // Remembering an older one never lowers the mark.
        remember(&repo, root, std::slice::from_ref(&a1)).unwrap();
        assert_eq!(read(&repo, root).unwrap().id, a2.id.to_string());
        // Tree 1 approved again, on a head after h2: forward.
        let again = approval(3, 1, "2026-01-01T11:00:00Z", Some(h3));
        assert_eq!(check(&repo, t(1), &[a1.clone(), again.clone()], Some(&ran)), None);
        // Unrelated heads: by time.
        let elsewhere = commit(&repo, None, "other");
        let late = approval(4, 4, "2026-01-02T00:00:00Z", Some(elsewhere));
        assert_eq!(check(&repo, t(4), &[late], Some(&ran)), None);
        let early = approval(5, 5, "2025-12-31T00:00:00Z", Some(elsewhere));
        assert!(check(&repo, t(5), &[early], Some(&ran)).is_some());
    }
}
