//! The links a mask walk follows. A `Read` deny rule may name a path through a link
//! (`Read(alias/secret/**)` with `alias -> data`, or a repository's `data ->
//! /srv/data`); a script reads through the link as the kernel resolves it, so the walk
//! goes through such a link and masks what the rule names under it (a mount on a
//! path through a link lands on the link's target). Only a link a person made is
//! followed: one outside every writable directory (a model's links live there), whose
//! target is a directory in the repository or a read root (what a tool sees) and not
//! in a writable directory either, and only when a deny glob may match the link or a
//! path below it ([`crate::rules::may_match_below`]); a link a followed walk meets
//! again (a loop) or past [`MAX_LINKS`] links is not.

use super::mask_walk::Mask;
use super::namespaces::NamespacePlan;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};

/// How many links one path may go through before the walk stops following.
const MAX_LINKS: usize = 8;

/// What the walk may follow: the canonical places a tool sees and writes.
#[derive(Debug, Default)]
pub(super) struct Follow {
    /// The repository.
    repo: Option<PathBuf>,
    /// The repository and the read roots.
    seen_by_tools: Vec<PathBuf>,
    /// The write ACL's directories and the scratch.
    writable: Vec<PathBuf>,
}

/// What a link asks of the walk.
#[derive(Debug, PartialEq)]
pub(super) enum Through {
    /// A deny glob matches the link itself: its target is masked (through it).
    Mask(Mask),
    /// A deny glob may match below it: its target (canonical) is walked through it.
    Walk(PathBuf),
}

impl Follow {
    pub(super) fn new(plan: &NamespacePlan) -> Follow {
        let canonical = |dirs: &mut dyn Iterator<Item = &PathBuf>| -> Vec<PathBuf> {
            dirs.filter_map(|d| std::fs::canonicalize(d).ok()).collect()
        };
        Follow {
            repo: std::fs::canonicalize(&plan.root).ok(),
            seen_by_tools: canonical(&mut std::iter::once(&plan.root).chain(&plan.read_dirs)),
            writable: canonical(&mut plan.write_dirs.iter()),
        }
    }

    /// Whether `target` (canonical) is the repository's top.
    pub(super) fn is_repository(&self, target: &Path) -> bool {
        self.repo.as_deref() == Some(target)
    }

    /// What the link `name` in `dir` asks of the walk, which reached `dir` through the
    /// links to `through`: `matched` when a deny glob matches the link's own name,
    /// `below` when one may match a path below it.
    pub(super) fn link(
        &self,
        dir: &Path,
        name: &OsStr,
        through: &[PathBuf],
        matched: bool,
        below: bool,
    ) -> Option<Through> {
        if !(matched || below) || through.len() >= MAX_LINKS {
            return None;
        }
        // Where the link really is: one in a writable directory is a model's.
        let real_dir = std::fs::canonicalize(dir).ok()?;
        let target = std::fs::canonicalize(dir.join(name)).ok()?;
        if self.is_writable(&real_dir)
            || self.is_writable(&target)
            || !self.seen_by_tools.iter().any(|r| target.starts_with(r))
            || through.contains(&target)
        {
            return None;
        }
        let meta = std::fs::metadata(&target).ok()?;
        match (matched, meta.is_dir()) {
            (true, true) => Some(Through::Mask(Mask::Dir)),
            (true, false) => meta.is_file().then_some(Through::Mask(Mask::File)),
            (false, true) => Some(Through::Walk(target)),
            (false, false) => None,
        }
    }

    fn is_writable(&self, path: &Path) -> bool {
        self.writable.iter().any(|w| path.starts_with(w))
    }
}
