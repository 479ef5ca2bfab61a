//! `builder audit`: the history check of the invariant (DESIGN.md section 2). Walks
//! git history and flags (a) commits by the runtime identity that touch anything but
//! new files in runtime-owned paths, (b) changes to builder-owned paths without an
//! approved review (a `Reviewed-by:` trailer; reported as warnings until the review
//! workflow lands), (c) symlinks, gitlinks and mode-only changes in runtime commits.
//! Renames are not detected, so a move out of `prompts/` is a delete plus an add.

use crate::layout::{Owner, Ownership};
use git2::{Delta, FileMode, Oid, Repository, Sort};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Violation,
    Warning,
}

#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub severity: Severity,
    pub commit: String,
    pub author: String,
    pub path: String,
    pub what: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct AuditReport {
    pub commits: usize,
    pub runtime_commits: usize,
    pub findings: Vec<Finding>,
}

impl AuditReport {
    pub fn violations(&self) -> usize {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Violation)
            .count()
    }
}

/// Who the runtime is in git history.
pub struct RuntimeIdentity {
    pub name: String,
    pub email: String,
}

/// Audits commits reachable from HEAD and not from `since` (all when `None`).
pub fn audit(
    repo: &Repository,
    ownership: &Ownership,
    runtime: &RuntimeIdentity,
    since: Option<Oid>,
) -> Result<AuditReport, git2::Error> {
    let mut report = AuditReport::default();
    let mut walk = repo.revwalk()?;
    walk.set_sorting(Sort::TOPOLOGICAL | Sort::REVERSE)?;
    if repo.head().is_err() {
        return Ok(report);
    }
    walk.push_head()?;
    if let Some(s) = since {
        walk.hide(s)?;
    }
    for oid in walk {
        let commit = repo.find_commit(oid?)?;
        report.commits += 1;
        let author = commit.author();
        let name = author.name().unwrap_or("").to_string();
        let email = author.email().unwrap_or("").to_string();
        let is_runtime = name == runtime.name && email == runtime.email;
        if is_runtime {
            report.runtime_commits += 1;
        }
        let reviewed = commit
            .message()
            .unwrap_or("")
            .lines()
            .any(|l| l.starts_with("Reviewed-by:"));
        let tree = commit.tree()?;
        let parent_tree = commit.parent(0).ok().map(|p| p.tree()).transpose()?;
        let diff = repo.diff_tree_to_tree(parent_tree.as_ref(), Some(&tree), None)?;
        let who = format!("{name} <{email}>");
        let short = oid_short(commit.id());
        for d in diff.deltas() {
            let path = d
                .new_file()
                .path()
                .or(d.old_file().path())
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            let owner = ownership.classify_normalized(&path);
            let mut flag = |severity: Severity, what: String| {
                report.findings.push(Finding {
                    severity,
                    commit: short.clone(),
                    author: who.clone(),
                    path: path.clone(),
                    what,
                })
            };
            if is_runtime {
                if owner != Owner::Runtime {
                    flag(
                        Severity::Violation,
                        format!("runtime commit {} a {} path", verb(d.status()), owner_name(owner)),
                    );
                } else if d.status() != Delta::Added {
                    flag(
                        Severity::Violation,
                        format!(
                            "runtime commit {} an existing record (records are create-only)",
                            verb(d.status())
                        ),
                    );
                }
                let mode = d.new_file().mode();
                if matches!(mode, FileMode::Link) {
                    flag(Severity::Violation, "runtime commit adds a symlink".into());
                } else if matches!(mode, FileMode::Commit) {
                    flag(Severity::Violation, "runtime commit adds a gitlink (submodule)".into());
                } else if d.status() == Delta::Modified
                    && d.old_file().id() == d.new_file().id()
                    && d.old_file().mode() != mode
                {
                    flag(Severity::Violation, "runtime commit changes only a file mode".into());
                }
            } else if owner == Owner::Builder && !reviewed {
                flag(
                    Severity::Warning,
                    format!(
                        "unreviewed change ({}) to a builder-owned path: no Reviewed-by trailer",
                        verb(d.status())
                    ),
                );
            }
        }
    }
    Ok(report)
}

fn oid_short(o: Oid) -> String {
    o.to_string()[..12].to_string()
}

fn verb(d: Delta) -> &'static str {
    match d {
        Delta::Added => "adds",
        Delta::Deleted => "deletes",
        Delta::Modified => "modifies",
        Delta::Renamed => "renames",
        Delta::Copied => "copies",
        Delta::Typechange => "changes the type of",
        Delta::Unmodified | Delta::Ignored | Delta::Untracked | Delta::Unreadable | Delta::Conflicted => "touches",
    }
}

fn owner_name(o: Owner) -> &'static str {
    match o {
        Owner::Builder => "builder-owned",
        Owner::Runtime => "runtime-owned",
        Owner::Neither => "non-runtime",
    }
}
