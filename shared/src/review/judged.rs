//! A clone's judge only moves forward too (issue 17 item 4). The judging commands of a
//! clone (`approve`, `land`, `merge`, `proposals`, `audit`, the pre-push hook, `builder
//! serve`) go by the settings of the protected branch's nearest reviewed commit
//! ([`super::base::protected_settings`]). A colleague with push access who is not a
//! signer could move that commit back: force-push the branch to an older approved
//! commit (alone, or under commits of hers that owe review), or force-push another
//! history with review off at its root, or with approvals she wrote that only its own
//! rules accept. Every clone would then judge by rules a later review replaced, or by
//! hers.
//!
//! So each clone remembers, per remote-tracking branch, the reviewed commit its
//! commands last judged by ([`Mark`], in `<git common dir>/builder-judged/`: the
//! commit, its builder tree and the newest approval of that tree that counts). The
//! next judgement ([`decide`]) compares the branch's reviewed commit with it. On the
//! remembered commit's line (the tip holds it), the walk's own rules are trusted: they
//! descend from the remembered ones through approved changes. Off that line (the
//! branch's history lost it), the new commit's approvals are judged as a change on
//! the remembered commit would be (its rule, its signers list), never by the rules of
//! the history that replaced it. Either way, another builder tree whose newest
//! approval is older than the remembered one, or that rests on no approval while
//! review is on (or off the line at all), is a step back: the commands keep judging by
//! the remembered commit's settings and say so. A newer approval of the branch's tree
//! (approve a new commit on top of it) moves the mark on; a history rewritten with the
//! same builder tree is no step back.

use super::forward::Stamp;
use git2::{Oid, Repository};
use std::path::{Path, PathBuf};

/// Under the git common directory: one file per remote-tracking branch.
pub const JUDGED_DIR: &str = "builder-judged";

/// How old a mark's temporary file must be before a later write removes it as a killed
/// writer's (a live one takes milliseconds).
const LEFTOVER_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

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

/// `name` as one file-name component: `%`, `/` and `:` escaped, so that no two
/// (remote, branch) pairs share a file and no branch is a directory of another's.
fn escaped(name: &str) -> String {
    name.replace('%', "%25").replace('/', "%2F").replace(':', "%3A")
}

impl Mark {
    /// The mark of `remote`'s branch `branch` in the clone whose git common directory
    /// is `common_dir`.
    pub fn of(common_dir: &Path, remote: &str, branch: &str) -> Mark {
        Mark {
            path: common_dir
                .join(JUDGED_DIR)
                .join(format!("{}:{}", escaped(remote), escaped(branch))),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The remembered point; `None` before the first judgement. A file that does not
    /// parse (written whole and fsynced before it is renamed into place, so only a
    /// hand or a broken disk makes one) is said loudly and read as none.
    pub fn read(&self) -> Option<Point> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(mark = %self.path.display(), error = %e, "the reviewed commit this clone judged by cannot be read: judging as a fresh clone would");
                return None;
            }
        };
        let point = parse(&text);
        if point.is_none() {
            tracing::warn!(mark = %self.path.display(), "the reviewed commit this clone judged by does not parse: judging as a fresh clone would");
        }
        point
    }

    /// Remembers `point` unless another command moved the mark since `seen` was read
    /// (its judgement stands). The file is replaced whole and durably
    /// ([`crate::durable`]): a reader sees the old point or the new one.
    pub fn write(&self, seen: Option<&Point>, point: &Point) -> std::io::Result<()> {
        if self.read().as_ref() != seen {
            return Ok(());
        }
        let mut body = format!("{} {}\n", point.commit, point.tree);
        if let Some(a) = &point.approval {
            body.push_str(&format!("{} {}", a.id, a.line()));
        }
        crate::durable::replace(&self.path, body.as_bytes())?;
        crate::durable::remove_leftovers(&self.path, LEFTOVER_AGE);
        Ok(())
    }
}

fn parse(text: &str) -> Option<Point> {
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

/// Where the branch stands against the remembered commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Line {
    /// This clone still has the remembered commit.
    pub kept: bool,
    /// The new reviewed commit holds it (is it, or descends from it). Not the
    /// branch's tip: a merge that descends from it can still lead the walk down its
    /// other parent, to an older commit.
    pub on_line: bool,
    /// The new reviewed commit lies below it (an ancestor).
    pub below: bool,
}

impl Line {
    /// Where the reviewed commit `at` stands against `before`.
    pub fn of(repo: &Repository, before: &Point, at: Oid) -> Result<Line, git2::Error> {
        // A remembered commit this clone no longer has: the branch lost it long ago
        // (git gc pruned it), so nothing is on its line.
        let kept = repo.find_commit(before.commit).is_ok();
        Ok(Line {
            kept,
            on_line: kept && (at == before.commit || repo.graph_descendant_of(at, before.commit)?),
            below: kept && repo.graph_descendant_of(before.commit, at)?,
        })
    }
}

/// What [`decide`] made of a new reviewed point against the remembered one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Judge by the new point and remember it.
    Forward,
    /// Judge by the new point; the mark stays (it is the remembered one, or below it
    /// on the same line with the same rules).
    Stay,
    /// The branch went back: judge by the remembered point.
    Back(Why),
}

/// Why the branch went back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Why {
    /// Its reviewed tree's newest approval that counts is older than the remembered one.
    OlderApproval(Stamp),
    /// Its reviewed tree rests on no approval that counts: off the remembered line, or
    /// on it with review on (a walk that found nothing reviewed).
    NoApproval { on_line: bool },
}

/// The judgement of `now` (the branch's reviewed point, whose settings ask review when
/// `review_on`) against `before` (the remembered one), `line` being where `now`
/// stands. A clone that lost the remembered commit goes back from any other tree (it
/// has no rules left to judge the new one's approvals by). `older(a, b)` says whether approval `a` is older than `b`
/// ([`super::forward::older`]).
pub fn decide(
    before: &Point,
    now: &Point,
    line: &Line,
    review_on: bool,
    older: impl Fn(&Stamp, &Stamp) -> bool,
) -> Decision {
    if now.commit == before.commit {
        return Decision::Stay;
    }
    if now.tree != before.tree {
        // Other rules, and nothing left to judge their approvals by.
        if !line.kept && before.approval.is_some() {
            return Decision::Back(Why::NoApproval { on_line: false });
        }
        if let Some(why) = went_back(before, now, line.on_line, review_on, older) {
            return Decision::Back(why);
        }
    }
    if line.below {
        Decision::Stay
    } else {
        Decision::Forward
    }
}

/// Whether the rules of `now` (another builder tree than `before`'s) are older. A
/// clone that judged under no approval (review off) has nothing to lose; review
/// switched off through an approved change on the same line is no step back (the walk
/// to `now` judged that switch by the rules before it).
fn went_back(
    before: &Point,
    now: &Point,
    on_line: bool,
    review_on: bool,
    older: impl Fn(&Stamp, &Stamp) -> bool,
) -> Option<Why> {
    let judged = before.approval.as_ref()?;
    match &now.approval {
        Some(newest) => older(newest, judged).then(|| Why::OlderApproval(newest.clone())),
        None if on_line && !review_on => None,
        None => Some(Why::NoApproval { on_line }),
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
            crate::text::short_oid(now.tree),
            crate::text::short_id(&n.id),
            n.approved_at.to_rfc3339()
        ),
        Why::NoApproval { on_line: false } => format!(
            "its builder tree {} rests on no approval that the rules of commit {} accept, and does not descend from that commit",
            crate::text::short_oid(now.tree),
            crate::text::short_oid(before.commit)
        ),
        Why::NoApproval { on_line: true } => format!(
            "its builder tree {} rests on no approval, with review on",
            crate::text::short_oid(now.tree)
        ),
    },
    crate::text::short_oid(before.tree),
    crate::text::short_oid(before.commit)
)]
pub struct WentBack {
    /// The protected branch, as named to a person (`origin/main`).
    pub tip: String,
    /// Its remote.
    pub remote: String,
    pub before: Point,
    pub now: Point,
    pub why: Why,
    /// The mark's file.
    pub mark: PathBuf,
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

    const ON: Line = Line {
        kept: true,
        on_line: true,
        below: false,
    };
    const OFF: Line = Line {
        kept: true,
        on_line: false,
        below: false,
    };

    #[test]
    fn an_older_approval_goes_back_on_the_line_and_off_it() {
        let (before, now) = (point(2, Some("a2")), point(1, Some("a1")));
        for line in [ON, OFF] {
            assert_eq!(
                decide(&before, &now, &line, true, by_name),
                Decision::Back(Why::OlderApproval(now.approval.clone().unwrap()))
            );
        }
        assert_eq!(decide(&now, &before, &OFF, true, by_name), Decision::Forward, "newer");
    }

    #[test]
    fn resting_on_no_approval_goes_back_unless_an_approved_switch_off_on_the_line() {
        let (before, none) = (point(2, Some("a2")), point(3, None));
        let back = |on_line| Decision::Back(Why::NoApproval { on_line });
        assert_eq!(decide(&before, &none, &OFF, false, by_name), back(false));
        assert_eq!(decide(&before, &none, &OFF, true, by_name), back(false));
        assert_eq!(decide(&before, &none, &ON, true, by_name), back(true), "review on");
        assert_eq!(
            decide(&before, &none, &ON, false, by_name),
            Decision::Forward,
            "switched off"
        );
        assert_eq!(
            decide(&point(2, None), &point(1, Some("a1")), &OFF, true, by_name),
            Decision::Forward,
            "nothing judged under review before"
        );
    }

    #[test]
    fn a_clone_that_lost_the_remembered_commit_goes_back_from_any_other_tree() {
        let lost = Line {
            kept: false,
            on_line: false,
            below: false,
        };
        let back = Decision::Back(Why::NoApproval { on_line: false });
        assert_eq!(
            decide(&point(1, Some("a1")), &point(2, Some("a2")), &lost, true, by_name),
            back
        );
        let mut same = point(1, None);
        same.commit = Oid::from_bytes(&[9; 20]).unwrap();
        assert_eq!(
            decide(&point(1, Some("a1")), &same, &lost, true, by_name),
            Decision::Forward
        );
    }

    #[test]
    fn the_same_tree_is_no_step_back_and_a_point_below_leaves_the_mark() {
        let before = point(2, Some("a2"));
        let mut rewritten = point(2, None);
        rewritten.commit = Oid::from_bytes(&[7; 20]).unwrap();
        assert_eq!(decide(&before, &rewritten, &OFF, true, by_name), Decision::Forward);
        let below = Line { below: true, ..ON };
        assert_eq!(decide(&before, &rewritten, &below, true, by_name), Decision::Stay);
        assert_eq!(decide(&before, &before, &ON, true, by_name), Decision::Stay);
    }

    #[test]
    fn the_mark_round_trips_keeps_branches_apart_and_a_torn_one_reads_as_none() {
        let dir = tempfile::tempdir().unwrap();
        let mark = Mark::of(dir.path(), "origin", "release/1");
        assert_eq!(mark.read(), None);
        let mut seen = None;
        for p in [point(1, None), point(2, Some("a2"))] {
            mark.write(seen.as_ref(), &p).unwrap();
            let got = mark.read().unwrap();
            assert_eq!((got.commit, got.tree), (p.commit, p.tree));
            assert_eq!(got.approval.as_ref().map(|a| &a.id), p.approval.as_ref().map(|a| &a.id));
            seen = Some(got);
        }
        // Another command moved it since this one read it: its point stands.
        mark.write(None, &point(3, None)).unwrap();
        assert_eq!(mark.read().unwrap().commit, point(2, None).commit);
        // `release` and `release/1`, remote `a` branch `b/c` and remote `a/b` branch `c`.
        let release = Mark::of(dir.path(), "origin", "release");
        release.write(None, &point(4, None)).unwrap();
        assert_eq!(release.read().unwrap().commit, point(4, None).commit);
        assert_ne!(
            Mark::of(dir.path(), "a", "b/c").path(),
            Mark::of(dir.path(), "a/b", "c").path()
        );
        std::fs::write(mark.path(), "not a mark").unwrap();
        assert_eq!(mark.read(), None);
    }
}
