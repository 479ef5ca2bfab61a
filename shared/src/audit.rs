//! `builder audit`: the history check of the invariant (DESIGN.md section 2). Walks
//! git history and flags (a) commits by the runtime identity that touch anything but
//! new files in runtime-owned paths, (b) changes to builder-owned paths without an
//! approved review (a `Reviewed-by:` trailer; reported as warnings until the review
//! workflow lands), (c) symlinks, gitlinks and mode-only changes in runtime commits.
//! Renames are not detected, so a move out of `prompts/` is a delete plus an add.

use crate::git::{ChangeKind, TreeDiffer};
use crate::layout::{Owner, Ownership};
use git2::{FileMode, Oid, Repository, Sort};
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
    crate::git::tune_for_history_walks();
    if repo.head().is_err() {
        return Ok(AuditReport::default());
    }
    let mut walk = repo.revwalk()?;
    walk.set_sorting(Sort::TOPOLOGICAL | Sort::REVERSE)?;
    walk.push_head()?;
    if let Some(s) = since {
        walk.hide(s)?;
    }
    let oids: Vec<Oid> = walk.collect::<Result<_, _>>()?;
    // Commits are independent: audit them on every core, each thread with its own
    // repository handle, and merge the findings back in history order.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    let chunk = oids.len().div_ceil(threads).max(1);
    let path = repo.path().to_path_buf();
    let parts: Vec<Result<AuditReport, git2::Error>> = std::thread::scope(|scope| {
        let handles: Vec<_> = oids
            .chunks(chunk)
            .map(|part| {
                let path = path.clone();
                scope.spawn(move || {
                    let repo = Repository::open(&path)?;
                    let mut differ = TreeDiffer::open(&repo)?;
                    let mut report = AuditReport::default();
                    // Newest first (see TreeDiffer), findings put back in history order.
                    // A commit's parent is usually the next one audited: read it once.
                    let mut per_commit = Vec::with_capacity(part.len());
                    let mut parent_read: Option<git2::Commit> = None;
                    for oid in part.iter().rev() {
                        let commit = match parent_read.take() {
                            Some(c) if c.id() == *oid => c,
                            _ => repo.find_commit(*oid)?,
                        };
                        let parent = commit.parent_ids().next().map(|p| repo.find_commit(p)).transpose()?;
                        audit_commit(&mut differ, ownership, runtime, &commit, parent.as_ref(), &mut report)?;
                        per_commit.push(std::mem::take(&mut report.findings));
                        parent_read = parent;
                    }
                    report.findings = per_commit.into_iter().rev().flatten().collect();
                    Ok(report)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(git2::Error::from_str("audit thread panicked")))
            })
            .collect()
    });
    let mut report = AuditReport::default();
    for part in parts {
        let part = part?;
        report.commits += part.commits;
        report.runtime_commits += part.runtime_commits;
        report.findings.extend(part.findings);
    }
    Ok(report)
}

/// Audits one commit against its first parent (all files added for a root commit).
fn audit_commit(
    differ: &mut TreeDiffer,
    ownership: &Ownership,
    runtime: &RuntimeIdentity,
    commit: &git2::Commit,
    parent: Option<&git2::Commit>,
    report: &mut AuditReport,
) -> Result<(), git2::Error> {
    report.commits += 1;
    let author = commit.author();
    let name = author.name().unwrap_or("");
    let email = author.email().unwrap_or("");
    let is_runtime = name == runtime.name && email == runtime.email;
    if is_runtime {
        report.runtime_commits += 1;
    }
    let reviewed = commit
        .message()
        .unwrap_or("")
        .lines()
        .any(|l| l.starts_with("Reviewed-by:"));
    let changes = differ.diff(parent.map(|p| p.tree_id()), Some(commit.tree_id()), &[])?;
    for c in changes {
        let owner = ownership.classify_normalized(&c.path);
        let mut flag = |severity: Severity, what: String| {
            report.findings.push(Finding {
                severity,
                commit: oid_short(commit.id()),
                author: format!("{name} <{email}>"),
                path: c.path.clone(),
                what,
            })
        };
        if is_runtime {
            if owner != Owner::Runtime {
                flag(
                    Severity::Violation,
                    format!("runtime commit {} a {} path", verb(c.kind), owner_name(owner)),
                );
            } else if c.kind != ChangeKind::Added {
                flag(
                    Severity::Violation,
                    format!(
                        "runtime commit {} an existing record (records are create-only)",
                        verb(c.kind)
                    ),
                );
            }
            let mode = c.new.map(|(_, m)| m);
            if mode == Some(i32::from(FileMode::Link)) {
                flag(Severity::Violation, "runtime commit adds a symlink".into());
            } else if mode == Some(i32::from(FileMode::Commit)) {
                flag(Severity::Violation, "runtime commit adds a gitlink (submodule)".into());
            } else if let (Some((oa, ma)), Some((ob, mb))) = (c.old, c.new) {
                if oa == ob && ma != mb {
                    flag(Severity::Violation, "runtime commit changes only a file mode".into());
                }
            }
        } else if owner == Owner::Builder && !reviewed {
            flag(
                Severity::Warning,
                format!(
                    "unreviewed change ({}) to a builder-owned path: no Reviewed-by trailer",
                    verb(c.kind)
                ),
            );
        }
    }
    Ok(())
}

fn oid_short(o: Oid) -> String {
    o.to_string()[..12].to_string()
}

fn verb(k: ChangeKind) -> &'static str {
    match k {
        ChangeKind::Added => "adds",
        ChangeKind::Deleted => "deletes",
        ChangeKind::Modified => "modifies",
    }
}

fn owner_name(o: Owner) -> &'static str {
    match o {
        Owner::Builder => "builder-owned",
        Owner::Runtime => "runtime-owned",
        Owner::Neither => "non-runtime",
    }
}
