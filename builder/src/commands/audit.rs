//! `builder audit`: flag history that breaks the invariant; exit 1 on a violation, so
//! it can gate CI or run as a server-side hook.

use anyhow::Context;
use shared::audit::{self, RuntimeIdentity, Severity};
use shared::layout::Ownership;
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
}

pub fn run(args: Args, repo_path: &Path) -> anyhow::Result<i32> {
    let repo = git2::Repository::discover(repo_path)
        .with_context(|| format!("{}: not in a git repository", repo_path.display()))?;
    let root = repo
        .workdir()
        .context("bare repositories are not supported")?
        .to_path_buf();
    let settings = shared::settings::load(&root).ok().map(|s| s.runtime);
    let identity = settings
        .as_ref()
        .map(|s| s.runtime_identity.clone())
        .unwrap_or_default();
    let ownership = Ownership::new(&root).with_globs(
        settings.as_ref().map(|s| s.builder_paths.as_slice()).unwrap_or(&[]),
        &[],
    )?;
    let since = match &args.since {
        Some(rev) => Some(
            repo.revparse_single(rev)
                .with_context(|| format!("--since {rev}: no such revision"))?
                .peel_to_commit()?
                .id(),
        ),
        None => None,
    };
    let report = audit::audit(
        &repo,
        &ownership,
        &RuntimeIdentity {
            name: identity.name,
            email: identity.email,
        },
        since,
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        for f in &report.findings {
            let tag = match f.severity {
                Severity::Violation => "VIOLATION",
                Severity::Warning => "warning",
            };
            println!("{tag}: {} {} {}: {}", f.commit, f.author, f.path, f.what);
        }
        println!(
            "audited {} commits ({} by the runtime): {} violation(s), {} warning(s)",
            report.commits,
            report.runtime_commits,
            report.violations(),
            report.findings.len() - report.violations()
        );
    }
    Ok(if report.violations() > 0 { 1 } else { 0 })
}
