//! A clone's judge only moves forward too (issue 17 item 4). The judging commands of a
//! clone (`approve`, `land`, `merge`, `proposals`, `audit`, the pre-push hook, `builder
//! serve`) go by the settings of the protected branch's nearest reviewed commit
//! ([`super::base::protected_settings`]). A colleague with push access who is not a
//! signer could move that commit back: force-push the branch to an older approved
//! commit (alone, or under commits of hers that owe review), push a revert to an older
//! approved tree past the hook, or force-push another history with review off at its
//! root. Every clone would then judge by rules a later review replaced, or by hers.
//!
//! So each clone remembers, per remote-tracking branch, the reviewed commit its
//! commands last judged by ([`Mark`], in `<git common dir>/builder-judged/<remote>/<branch>`:
//! the commit, its builder tree and the newest approval of that tree that counts). The
//! next judgement ([`decide`]) goes back when the new reviewed commit's builder tree
//! differs and either its newest approval is older than the remembered one
//! ([`super::forward::older`]: causally first, then by time), or it rests on no
//! approval in a history that lost the remembered commit. Then the commands keep
//! judging by the remembered commit's settings and say so; a newer approval of the
//! branch's tree (approve a new commit on top of it) moves the mark on. A history that
//! lost the remembered commit with the same builder tree (an honest rewrite of records)
//! is no step back. A local branch with no remote-tracking ref and a shallow clone keep
//! no mark.

use super::forward::{older, Stamp};
use git2::{Oid, Repository};
use std::path::{Path, PathBuf};

/// Under the git common directory: one file per remote-tracking branch.
pub const JUDGED_DIR: &str = "builder-judged";

/// A reviewed commit of the protected branch as a judge saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Point {
    pub commit: Oid,
    /// Its builder tree.
    pub tree: Oid,
    /// The newest approval of that tree that counts; `None` when it rests on none
    /// (review off there, or nothing reviewed below the tip).
    pub approval: Option<Stamp>,
}

/// Where a clone remembers the point its commands judged `<remote>/<branch>` by.
#[derive(Debug, Clone)]
pub struct Mark {
    path: PathBuf,
}

impl Mark {
    /// The mark of the remote-tracking branch `tip_name` (`origin/main`) in the clone
    /// whose git common directory is `common_dir`. Git's ref-name rules keep the name
    /// inside the directory (no `..` component, no leading `/`).
    pub fn of(common_dir: &Path, tip_name: &str) -> Mark {
        Mark {
            path: common_dir.join(JUDGED_DIR).join(tip_name),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The remembered point; `None` before the first judgement, or when the file does
    /// not parse (it is then written afresh).
    pub fn read(&self) -> Option<Point> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        let mut lines = text.lines();
        let mut first = lines.next()?.split_whitespace();
        let commit = Oid::from_str(first.next()?).ok()?;
        let tree = Oid::from_str(first.next()?).ok()?;
        let approval = match lines.next() {
            Some(line) => {
                let (id, rest) = line.split_once(' ')?;
                Some(Stamp::parse(id, rest)?)
            }
            None => None,
        };
        Some(Point { commit, tree, approval })
    }

    /// Remembers `point` (a temporary file renamed over the mark: a reader sees the
    /// old point or the new one).
    pub fn write(&self, point: &Point) -> std::io::Result<()> {
        let mut body = format!("{} {}\n", point.commit, point.tree);
        if let Some(a) = &point.approval {
            body.push_str(&format!("{} {}", a.id, a.line()));
        }
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self.path.with_extension(format!("tmp-{}", std::process::id()));
        std::fs::write(&tmp, body)?;
        std::fs::rename(&tmp, &self.path)
    }
}

/// What [`decide`] made of a new reviewed point against the remembered one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Judge by the new point and remember it.
    Forward,
    /// Judge by the new point; the mark stays (the new point is the remembered one, or
    /// below it on the same line with the same rules).
    Stay,
    /// The branch went back: judge by the remembered point.
    Back(Why),
}

/// Why the branch went back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// Its reviewed tree's newest approval is older than the remembered one.
    OlderApproval(Stamp),
    /// It rests on no approval, in a history that lost the remembered commit.
    NoApprovalOffTheLine,
}

/// The judgement of `now` (the branch's reviewed point; the branch's tip is `tip`)
/// against `before` (the remembered one).
pub fn decide(repo: &Repository, before: &Point, now: &Point, tip: Oid) -> Result<Decision, git2::Error> {
    if now.commit == before.commit {
        return Ok(Decision::Stay);
    }
    // A remembered commit this clone no longer has: the branch lost it long ago (git
    // gc pruned it), so nothing is on its line.
    let kept = repo.find_commit(before.commit).is_ok();
    let on_line = kept && (tip == before.commit || repo.graph_descendant_of(tip, before.commit)?);
    let below = kept && repo.graph_descendant_of(before.commit, now.commit)?;
    if now.tree != before.tree {
        if let Some(why) = went_back(before, now, on_line, |a, b| older(repo, a, b)) {
            return Ok(Decision::Back(why));
        }
    }
    Ok(if below { Decision::Stay } else { Decision::Forward })
}

/// Whether the rules of `now` (another builder tree than `before`'s) are older:
/// `older(a, b)` says whether approval `a` is older than `b`. A clone that judged under
/// no approval (review off) has nothing to lose; review switched off through an
/// approved change on the same line is no step back.
fn went_back(before: &Point, now: &Point, on_line: bool, older: impl Fn(&Stamp, &Stamp) -> bool) -> Option<Why> {
    let judged = before.approval.as_ref()?;
    match &now.approval {
        Some(newest) => older(newest, judged).then(|| Why::OlderApproval(newest.clone())),
        None => (!on_line).then_some(Why::NoApprovalOffTheLine),
    }
}

/// The branch went back, and this clone keeps judging by the remembered point (or
/// cannot: it lacks that commit).
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "{tip} went back to older rules: {}; this clone judged by builder tree {} (commit {}) before",
    match why {
        Why::OlderApproval(n) => format!(
            "its reviewed builder tree {} has no approval newer than {} ({})",
            short(&now.tree.to_string()),
            short(&n.id),
            n.approved_at.to_rfc3339()
        ),
        Why::NoApprovalOffTheLine => format!(
            "its builder tree {} rests on no approval, in a history without commit {}",
            short(&now.tree.to_string()),
            short(&before.commit.to_string())
        ),
    },
    short(&before.tree.to_string()),
    short(&before.commit.to_string())
)]
pub struct WentBack {
    /// The protected branch, as named to a person (`origin/main`).
    pub tip: String,
    pub before: Point,
    pub now: Point,
    pub why: Why,
    /// The mark's file.
    pub mark: PathBuf,
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(id: &str, tree: Oid) -> Stamp {
        Stamp {
            id: id.to_string(),
            tree,
            approved_at: chrono::Utc::now(),
            head: None,
        }
    }

    fn point(n: u8, approval: Option<&str>) -> Point {
        let tree = Oid::from_bytes(&[n; 20]).unwrap();
        Point {
            commit: Oid::from_bytes(&[n + 100; 20]).unwrap(),
            tree,
            approval: approval.map(|a| stamp(a, tree)),
        }
    }

    /// Approvals named "a1" < "a2" < ... by their names.
    fn by_name(a: &Stamp, b: &Stamp) -> bool {
        a.id < b.id
    }

    #[test]
    fn an_older_approval_goes_back_on_the_line_and_off_it() {
        let (before, now) = (point(2, Some("a2")), point(1, Some("a1")));
        for on_line in [true, false] {
            assert_eq!(
                went_back(&before, &now, on_line, by_name),
                Some(Why::OlderApproval(now.approval.clone().unwrap()))
            );
        }
        assert_eq!(went_back(&now, &before, false, by_name), None, "a newer approval");
    }

    #[test]
    fn resting_on_no_approval_goes_back_only_off_the_line() {
        let (before, off) = (point(2, Some("a2")), point(3, None));
        assert_eq!(
            went_back(&before, &off, false, by_name),
            Some(Why::NoApprovalOffTheLine)
        );
        assert_eq!(went_back(&before, &off, true, by_name), None, "an approved switch-off");
        assert_eq!(went_back(&point(2, None), &point(1, Some("a1")), false, by_name), None);
    }

    #[test]
    fn the_mark_round_trips_and_a_torn_one_reads_as_none() {
        let dir = tempfile::tempdir().unwrap();
        let mark = Mark::of(dir.path(), "origin/release/1");
        assert_eq!(mark.read(), None);
        for p in [point(1, None), point(2, Some("a2"))] {
            mark.write(&p).unwrap();
            let got = mark.read().unwrap();
            assert_eq!((got.commit, got.tree), (p.commit, p.tree));
            assert_eq!(got.approval.map(|a| a.id), p.approval.map(|a| a.id));
        }
        assert!(mark.path().ends_with("builder-judged/origin/release/1"));
        std::fs::write(mark.path(), "not a mark").unwrap();
        assert_eq!(mark.read(), None);
    }
}
