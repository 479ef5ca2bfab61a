//! The verdicts of one judge remembered between fires (`.runtime/trust-verdicts`):
//! which commits are covered, which commit each walk down a line trusts, and which
//! walks' joined lines accept the approvals of a tree ([`Trust::joins_accept`]). Both depend on the history (immutable), the rule
//! and the approvals, so the file is stamped with a fingerprint of the rule and of
//! every approval's id: while no approval is added (approvals are append-only, and
//! most fires add none), a fire reads its verdicts instead of walking every line a
//! merge below joined again; any new approval or another rule makes the stamp differ,
//! and the file is read as empty and written anew.
//!
//! A fire on a tree trusted on first use over a history of 1,000 merged branches
//! otherwise pays about 32 ms a fire to ask each branch's line
//! (docs/benchmarks.md).

use super::{Trust, VERDICTS_FILE};
use git2::Oid;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// What the first line of a verdicts file this version reads begins with. The stamp
/// also covers this and the walk memo's format: verdicts an older judge reached (one
/// that let through what this one refuses) are never read.
const VERDICTS_FORMAT: &str = "trust-verdicts 2 ";
/// The most rows written (and read).
const VERDICT_ROWS: usize = 4096;

/// The remembered verdicts of one rule over one set of approvals.
pub(super) struct Verdicts {
    root: PathBuf,
    stamp: Oid,
    /// Per commit: covered or not.
    pub(super) covered: HashMap<Oid, bool>,
    /// The commits of `covered` as the file lists them (the newest first), and those
    /// learned since, the newest last: the rows kept when the file is full are the
    /// newest (the last fires' HEADs, which the next fire's walk stops at).
    listed: Vec<Oid>,
    learned_covered: Vec<Oid>,
    /// Per walk `(start, tree)`: whether the lines joined in the runs it passed over
    /// accept the tree's approvals.
    pub(super) clear: HashMap<(Option<Oid>, Oid), bool>,
    /// Per walk `(start, tree)`: the commit it trusts, if any ([`super::lines::Line`]).
    pub(super) trusted: HashMap<(Option<Oid>, Oid), Option<Oid>>,
    /// Something was learned since the file was read.
    learned: bool,
}

impl Verdicts {
    /// The verdicts in `root`'s file when it carries `stamp`, else none.
    fn read(root: &Path, stamp: Oid) -> Verdicts {
        let mut v = Verdicts {
            root: root.to_path_buf(),
            stamp,
            covered: HashMap::new(),
            listed: Vec::new(),
            learned_covered: Vec::new(),
            clear: HashMap::new(),
            trusted: HashMap::new(),
            learned: false,
        };
        let rel = Path::new(crate::layout::STATE_DIR).join(VERDICTS_FILE);
        let Ok(dir) = crate::beneath::open_root(root) else {
            return v;
        };
        let Ok(bytes) = crate::beneath::read_regular(&dir, &rel, (VERDICT_ROWS as u64 + 1) * 128) else {
            return v;
        };
        let text = String::from_utf8_lossy(&bytes);
        let mut lines = text.lines();
        if lines.next() != Some(format!("{VERDICTS_FORMAT}{stamp}").as_str()) {
            return v;
        }
        let oid = |s: &str| Oid::from_str(s).ok();
        let maybe = |s: &str| if s == "-" { Some(None) } else { oid(s).map(Some) };
        let yes = |s: &str| match s {
            "1" => Some(true),
            "0" => Some(false),
            _ => None,
        };
        for line in lines {
            let f: Vec<&str> = line.split(' ').collect();
            match f.as_slice() {
                ["c", c, b] => {
                    if let (Some(c), Some(b)) = (oid(c), yes(b)) {
                        if v.covered.insert(c, b).is_none() {
                            v.listed.push(c);
                        }
                    }
                }
                ["j", s, t, b] => {
                    if let (Some(start), Some(t), Some(b)) = (maybe(s), oid(t), yes(b)) {
                        v.clear.insert((start, t), b);
                    }
                }
                ["l", s, t, by] => {
                    if let (Some(start), Some(t), Some(by)) = (maybe(s), oid(t), maybe(by)) {
                        v.trusted.insert((start, t), by);
                    }
                }
                _ => {}
            }
        }
        v
    }

    /// Remembers that `commit` is covered or not, as the newest row.
    fn remember(&mut self, commit: Oid, covered: bool) {
        if self.covered.insert(commit, covered) != Some(covered) {
            self.learned_covered.push(commit);
            self.learned = true;
        }
    }

    /// Writes the file again when something was learned, at most [`VERDICT_ROWS`]
    /// rows (beyond that, the file starts again from what this judge holds).
    fn write(&mut self) {
        if !self.learned {
            return;
        }
        let bit = |b: bool| if b { "1" } else { "0" };
        let dash = |o: &Option<Oid>| o.map(|o| o.to_string()).unwrap_or_else(|| "-".into());
        let mut text = format!("{VERDICTS_FORMAT}{}\n", self.stamp);
        let mut rows = Vec::new();
        for ((s, t), by) in &self.trusted {
            rows.push(format!("l {} {t} {}\n", dash(s), dash(by)));
        }
        for ((s, t), b) in &self.clear {
            rows.push(format!("j {} {t} {}\n", dash(s), bit(*b)));
        }
        // The walks' rows first (they spare the most), but at most half the file, so a
        // chain of thousands of walks still leaves coverage rows their share.
        rows.truncate(VERDICT_ROWS / 2);
        let mut kept = HashSet::new();
        let newest_first = self.learned_covered.iter().rev().chain(&self.listed);
        let listed: Vec<Oid> = newest_first
            .filter(|c| kept.insert(**c))
            .take(VERDICT_ROWS - rows.len())
            .copied()
            .collect();
        for c in &listed {
            rows.push(format!("c {c} {}\n", bit(self.covered[c])));
        }
        self.listed = listed;
        self.learned_covered.clear();
        text.extend(rows);
        let rel = Path::new(crate::layout::STATE_DIR).join(VERDICTS_FILE);
        let written = crate::beneath::open_root(&self.root).and_then(|dir| {
            match crate::beneath::remove_file(&dir, &rel) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            crate::beneath::create_new(&dir, &rel, text.as_bytes())
        });
        match written {
            Ok(()) => self.learned = false,
            Err(e) => tracing::warn!(error = %e, "the trust verdicts were not remembered"),
        }
    }
}

impl Trust<'_> {
    /// Reads the verdicts remembered in `root` for this judge's rule and approvals.
    pub(super) fn read_verdicts(&mut self, root: &Path) {
        let mut ids: Vec<String> = self.approvals.all().iter().map(|a| a.id.to_string()).collect();
        ids.sort();
        let Some(super::SignerList::Repository(list)) = &self.rule.signers else {
            return;
        };
        let rule = format!("{list}\n{}\n", self.rule.runtime_email);
        let text = format!(
            "{VERDICTS_FORMAT}\n{}\n{rule}{}",
            crate::state::WALK_MEMO_HEADER,
            ids.join("\n")
        );
        let Ok(stamp) = Oid::hash_object(git2::ObjectType::Blob, text.as_bytes()) else {
            return;
        };
        let v = Verdicts::read(root, stamp);
        for (c, b) in &v.covered {
            self.covered.insert(*c, *b);
        }
        self.verdicts = Some(v);
    }

    /// Remembers that `commit` is covered or not.
    pub(super) fn remember_covered(&mut self, commit: Oid, covered: bool) {
        if let Some(v) = self.verdicts.as_mut() {
            v.remember(commit, covered);
        }
    }

    /// Whether the lines joined below the walk `(start, tree)` were found to accept
    /// its approvals, when remembered.
    pub(super) fn remembered_clear(&self, start: Option<Oid>, tree: Oid) -> Option<bool> {
        self.verdicts.as_ref()?.clear.get(&(start, tree)).copied()
    }

    /// Remembers whether the lines joined below the walk `(start, tree)` accept its
    /// approvals.
    pub(super) fn remember_clear(&mut self, start: Option<Oid>, tree: Oid, clear: bool) {
        if let Some(v) = self.verdicts.as_mut() {
            if v.clear.insert((start, tree), clear) != Some(clear) {
                v.learned = true;
            }
        }
    }

    /// The commit the walk `(start, tree)` trusts, when remembered.
    pub(super) fn remembered_line(&self, start: Option<Oid>, tree: Oid) -> Option<Option<Oid>> {
        self.verdicts.as_ref()?.trusted.get(&(start, tree)).copied()
    }

    /// Remembers the commit the walk `(start, tree)` trusts.
    pub(super) fn remember_line(&mut self, start: Option<Oid>, tree: Oid, trusted: Option<Oid>) {
        if let Some(v) = self.verdicts.as_mut() {
            if v.trusted.insert((start, tree), trusted) != Some(trusted) {
                v.learned = true;
            }
        }
    }

    /// Writes what this judge learned ([`Trust::save_memo`] calls it).
    pub(super) fn save_verdicts(&mut self) {
        if let Some(v) = self.verdicts.as_mut() {
            v.write();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oid(n: usize) -> Oid {
        Oid::hash_object(git2::ObjectType::Blob, n.to_string().as_bytes()).unwrap()
    }

    /// More coverage rows than the file holds: the ones kept are the newest, so the
    /// last fires' HEADs are never the rows dropped.
    #[test]
    fn a_full_verdicts_file_keeps_the_newest_coverage_rows() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join(crate::layout::STATE_DIR)).unwrap();
        let stamp = oid(usize::MAX);
        let mut v = Verdicts::read(dir.path(), stamp);
        let covered = |n: usize| !n.is_multiple_of(3);
        for n in 0..VERDICT_ROWS + 500 {
            v.remember(oid(n), covered(n));
        }
        v.write();
        let mut again = Verdicts::read(dir.path(), stamp);
        assert_eq!(again.covered.len(), VERDICT_ROWS);
        for n in [500, 501, VERDICT_ROWS + 498, VERDICT_ROWS + 499] {
            assert_eq!(again.covered.get(&oid(n)), Some(&covered(n)), "{n}");
        }
        assert_eq!(again.covered.get(&oid(499)), None);
        // The next fire's rows go first, and the oldest kept so far are dropped.
        again.remember(oid(0), true);
        again.write();
        let third = Verdicts::read(dir.path(), stamp);
        assert_eq!(third.covered.get(&oid(0)), Some(&true));
        assert_eq!(
            third.covered.get(&oid(VERDICT_ROWS + 499)),
            Some(&covered(VERDICT_ROWS + 499))
        );
        assert_eq!(third.covered.get(&oid(501)), Some(&covered(501)));
        assert_eq!(third.covered.get(&oid(500)), None);
        assert_eq!(third.listed.first(), Some(&oid(0)));
    }
}
