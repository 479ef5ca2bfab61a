//! `builder audit`: flag history that breaks the invariant; exit 1 on a violation, so
//! it can gate CI or run as a server-side hook. `--range OLD..NEW` judges only the
//! commits NEW adds to OLD (CI on a push); `--pre-push <remote>` is the pre-push hook:
//! it reads git's ref updates on stdin and judges only the new commits on the
//! protected branch ([`shared::pushed`]). Every mode judges by the protected
//! branch's committed settings (the work tree's in a clone without one).

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
    /// Only the commits NEW adds to OLD, as OLD..NEW (the branch is NEW's first parents)
    #[arg(long, value_name = "OLD..NEW", conflicts_with_all = ["since", "pre_push"])]
    pub range: Option<String>,
    /// Judge a push to REMOTE as git's pre-push hook (ref updates on stdin)
    #[arg(long, value_name = "REMOTE", conflicts_with = "since")]
    pub pre_push: Option<String>,
}

pub fn run(args: Args, repo_path: &Path) -> Result<Outcome, CommandError> {
    let wt = super::open_repo(repo_path)?;
    // History is judged by the protected branch's committed settings, not those of
    // whatever is checked out: a proposal's own rule (CI auditing a pull request, the
    // hook judging a push from a proposal's checkout) would judge the proposal.
    let (settings, ownership) = super::protected_branch_settings(&wt)?;
    let shared::git::WorkTree { repo, root } = wt;
    let identity = settings.runtime_identity.clone();
    let mut rule = super::approval_rule(&settings)?;
    // An unapproved commit that turned signatures off is judged under them.
    if let Ok(head) = repo.head().and_then(|h| h.peel_to_commit()) {
        rule = shared::review::trust::Trust::rule_in_force(&repo, head.id(), rule, None)?;
    }
    if let Some(remote) = &args.pre_push {
        return pre_push(&repo, &ownership, &settings, rule, remote);
    }
    if let Some(range) = &args.range {
        let (old, new) = range.split_once("..").ok_or_else(|| {
            CommandError::usage(format!("--range `{range}` is not OLD..NEW"))
                .hint("for example: --range origin/main..HEAD")
        })?;
        let old = super::resolve_commit(&repo, "--range", old)?;
        let new = super::resolve_commit(&repo, "--range", new)?;
        let judge = shared::pushed::Judge {
            repo: &repo,
            ownership: &ownership,
            runtime: &RuntimeIdentity {
                name: identity.name,
                email: identity.email,
            },
            rule: &rule,
        };
        let report = judge.range(new, &[old])?;
        print_report(&report, args.json)?;
        return Ok(outcome(&report));
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
    print_report(&report, args.json)?;
    Ok(outcome(&report))
}

fn outcome(report: &audit::AuditReport) -> Outcome {
    if report.violations() > 0 {
        Outcome::Problems
    } else {
        Outcome::Ok
    }
}

fn print_report(report: &audit::AuditReport, json: bool) -> Result<(), CommandError> {
    if json {
        println!(
            "{}",
            shared::text::printable_json(&serde_json::to_string_pretty(report)?)
        );
        return Ok(());
    }
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
    if report.shallow_cut > 0 {
        println!(
            "note: this clone is shallow: {} commit(s) at its cut have no parent here, so what they changed is not judged, only whether an approval covers their builder tree (`git fetch --unshallow` brings the history)",
            report.shallow_cut
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
        report.findings.len() + report.metadata.len() - report.violations()
    );
    Ok(())
}

/// The pre-push hook: judge the new commits of each update of the protected branch
/// (git's ref updates on stdin); other refs pass. Output goes to stderr, which git
/// shows the person pushing.
fn pre_push(
    repo: &git2::Repository,
    ownership: &shared::layout::Ownership,
    settings: &shared::settings::RuntimeSettings,
    rule: shared::review::signing::ApprovalRule,
    remote: &str,
) -> Result<Outcome, CommandError> {
    use std::io::Read;
    let mut input = String::new();
    std::io::stdin().read_to_string(&mut input)?;
    let updates = shared::pushed::parse_updates(&input)?;
    let protected = shared::review::remote::protected_branch(repo, remote, settings.sync.as_ref());
    let runtime = RuntimeIdentity {
        name: settings.runtime_identity.name.clone(),
        email: settings.runtime_identity.email.clone(),
    };
    let judge = shared::pushed::Judge {
        repo,
        ownership,
        runtime: &runtime,
        rule: &rule,
    };
    let mut violations = 0;
    for judged in judge.push(remote, &protected, &updates)? {
        for f in &judged.report.findings {
            let tag = match f.severity {
                Severity::Violation => "VIOLATION",
                Severity::Warning => "warning",
            };
            eprintln!(
                "pre-push: {tag}: {} {} {}: {}",
                f.commit,
                shared::text::printable(&f.author),
                shared::text::printable(&f.path),
                shared::text::printable(&f.what)
            );
        }
        violations += judged.report.violations();
        eprintln!(
            "pre-push: {} on {remote}: {} new commit(s) judged, {} violation(s)",
            judged.remote_ref,
            judged.report.commits,
            judged.report.violations()
        );
    }
    if violations > 0 {
        eprintln!("pre-push: refusing to push unapproved builder changes to {protected}: land them through `builder propose --push`, `builder approve --push` (by someone else) and `builder land`");
        eprintln!("pre-push: a change already made can be covered after the fact: propose its tree and have it approved, or revert it");
        return Ok(Outcome::Problems);
    }
    Ok(Outcome::Ok)
}
