//! `builder audit`: flag history that breaks the invariant; exit 1 on a violation, so
//! it can gate CI or run as a server-side hook.

use crate::command_error::{CommandError, Outcome};
use shared::audit::{self, RuntimeIdentity, Severity};
use std::path::Path;

/// Check git history: runtime commits outside runtime paths, unreviewed builder changes
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only commits after this revision
    #[arg(long)]
    pub since: Option<String>,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
    /// Accept the current modes, owners and hooks of builder-owned paths as intended
    #[arg(long)]
    pub accept_metadata: bool,
}

pub fn run(args: Args, repo_path: &Path) -> Result<Outcome, CommandError> {
    let shared::git::WorkTree { repo, root } = super::open_repo(repo_path)?;
    let (settings, ownership) = super::review_settings(&root)?;
    let identity = settings.runtime_identity.clone();
    let mut rule = super::approval_rule(&settings)?;
    // An unapproved commit that turned signatures off is judged under them.
    if let Ok(head) = repo.head().and_then(|h| h.peel_to_commit()) {
        rule = shared::review::trust::Trust::rule_in_force(&repo, head.id(), rule, None)?;
    }
    let since = match &args.since {
        Some(rev) => Some(super::resolve_commit(&repo, "--since", rev)?),
        None => None,
    };
    if args.accept_metadata {
        for change in shared::manifest::accept(&repo, &root, &ownership)? {
            println!("accepted: {}", shared::text::printable(&change.to_string()));
        }
    }
    let mut report = audit::audit(
        &repo,
        &ownership,
        &RuntimeIdentity {
            name: identity.name,
            email: identity.email,
        },
        &rule,
        since,
    )?;
    report.metadata = shared::manifest::work_tree_changes(&repo, &root, &ownership)?;
    if args.json {
        println!(
            "{}",
            shared::text::printable_json(&serde_json::to_string_pretty(&report)?)
        );
    } else {
        for f in &report.findings {
            let tag = match f.severity {
                Severity::Violation => "VIOLATION",
                Severity::Warning => "warning",
            };
            println!(
                "{tag}: {} {} {}: {}",
                f.commit,
                shared::text::printable(&f.author),
                shared::text::printable(&f.path),
                shared::text::printable(&f.what)
            );
        }
        for change in &report.metadata {
            println!(
                "VIOLATION: metadata changed outside git: {}",
                shared::text::printable(&change.to_string())
            );
        }
        if report.runtime_unauthenticated > 0 {
            println!(
                "note: {} runtime commit(s) are unauthenticated: their settings name no runtime_identity.signing_key, so anyone with push access could have made them",
                report.runtime_unauthenticated
            );
        }
        println!(
            "audited {} commits ({} by the runtime): {} violation(s), {} warning(s)",
            report.commits,
            report.runtime_commits,
            report.violations(),
            report.findings.len() - report.violations()
        );
    }
    Ok(if report.violations() > 0 {
        Outcome::Problems
    } else {
        Outcome::Ok
    })
}
