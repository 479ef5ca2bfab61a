//! The head a reviewer saw of a proposal, so that `builder approve` approves that head
//! and no other. An approval names a tree; between the review and the approval the
//! author can force-push the proposal, and a fetch (`approve --push`'s own, or a `git
//! pull` in between) would hand the approval the tree nobody looked at. What was seen
//! comes from, in order: `--head` (or the web view's form, which carries the head its
//! page showed); the head `builder review` last showed in this clone (kept in git's
//! directory, `builder-reviewed.json`: a review leaves nothing in the work tree, and
//! `git clean` does not forget it); and for `approve --push`, the head this clone had
//! before its fetch. A proposal at another head is refused, naming both. A proposal
//! this clone never had is approved at the head the fetch brings: a review made on
//! a forge's page is held to what it saw only with `--head`.

use git2::Oid;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// In git's (common) directory: proposal name to the head `builder review` last showed.
const FILE: &str = "builder-reviewed.json";

/// A head the reviewer is known to have seen, and how that is known (for the words
/// of a refusal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    pub head: Oid,
    pub from: SeenFrom,
}

/// Where [`Seen::head`] comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
pub enum SeenFrom {
    /// `builder approve --head`.
    #[strum(serialize = "the head you named with --head")]
    Named,
    /// The web view's approve form (the head its page showed).
    #[strum(serialize = "the head the page you approved from showed")]
    Page,
    /// `builder review` in this clone.
    #[strum(serialize = "the head `builder review` showed you in this clone")]
    Review,
    /// This clone's copy before `approve --push` fetched.
    #[strum(serialize = "the head this clone had before the fetch")]
    BeforeFetch,
}

impl Seen {
    /// Refuses `head` unless it is the one seen.
    pub fn hold(&self, name: &str, head: Oid) -> Result<(), super::ReviewError> {
        if head == self.head {
            return Ok(());
        }
        let from: &'static str = self.from.into();
        Err(super::ReviewError::Refused(format!(
            "proposal `{name}` is at {} now, not at {} ({from}): it changed after it was seen, and an approval names exactly one tree; review it again (`builder review {name}`), then approve",
            crate::text::short_oid(head),
            crate::text::short_oid(self.head),
        )))
    }
}

fn file(git_dir: &Path) -> PathBuf {
    git_dir.join(FILE)
}

fn read(git_dir: &Path) -> BTreeMap<String, String> {
    std::fs::read(file(git_dir))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default()
}

/// Remembers that `builder review` showed proposal `name` at `head` in the clone
/// whose git directory (common to its worktrees) is `git_dir`.
pub fn remember(git_dir: &Path, name: &str, head: Oid) -> std::io::Result<()> {
    let mut seen = read(git_dir);
    seen.insert(name.to_string(), head.to_string());
    let bytes = serde_json::to_vec_pretty(&seen).map_err(std::io::Error::other)?;
    crate::durable::replace(&file(git_dir), &bytes)
}

/// The head `builder review` last showed of proposal `name` in the clone of `git_dir`.
pub fn last_review(git_dir: &Path, name: &str) -> Option<Seen> {
    let head = read(git_dir).get(name).and_then(|h| Oid::from_str(h).ok())?;
    Some(Seen {
        head,
        from: SeenFrom::Review,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_review_is_remembered_per_proposal_and_another_head_is_refused_naming_both() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (
            Oid::from_str(&"a".repeat(40)).unwrap(),
            Oid::from_str(&"b".repeat(40)).unwrap(),
        );
        assert_eq!(last_review(dir.path(), "p/1"), None);
        remember(dir.path(), "p/1", a).unwrap();
        remember(dir.path(), "other", b).unwrap();
        let seen = last_review(dir.path(), "p/1").unwrap();
        assert_eq!(seen.head, a);
        assert!(seen.hold("p/1", a).is_ok());
        let refused = seen.hold("p/1", b).unwrap_err().to_string();
        assert!(
            refused.contains("bbbbbbbb") && refused.contains("aaaaaaaa") && refused.contains("builder review p/1"),
            "{refused}"
        );
        remember(dir.path(), "p/1", b).unwrap();
        assert_eq!(last_review(dir.path(), "p/1").unwrap().head, b);
    }
}
