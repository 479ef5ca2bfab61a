//! `builder approve <name> [--push]`: record an approval of the proposal's exact tree
//! of builder-owned paths as a commit on its own ref `refs/builder/approved/<id>`;
//! with `--push`, fetch first (the remote's proposal branch counts) and publish it
//! ([`shared::review::land::approve_and_publish`]). Refused (exit 1) for an author of
//! the proposal, for the runtime identity, and for a local proposal branch behind or
//! diverged from the remote's, and for a head other than the one the reviewer saw
//! (`--head`, else the one `builder review` last showed here, else with `--push` the
//! one this clone had before the fetch: [`shared::review::reviewed`]). Signed with SSH when git is
//! configured to sign (`gpg.format ssh`, `user.signingkey`) or `--key` names a key;
//! with `review.require_signed` an approval the allowed-signers file would not count
//! is refused before it is written.

use crate::command_error::{CommandError, Outcome};
use shared::review::reviewed::{self, Seen, SeenFrom};
use shared::review::{parse_person, proposals, refuse_runtime};
use std::path::{Path, PathBuf};

/// Approve a proposal's current builder-owned tree (someone other than its authors)
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The proposal's name
    #[arg(required_unless_present = "bootstrap")]
    pub name: Option<String>,
    /// Approve HEAD's builder tree as the repository's first approval (review was
    /// turned on by a direct commit; refused once any approval exists)
    #[arg(long, conflicts_with = "name")]
    pub bootstrap: bool,
    /// Who approves, as "Name <email>" (default: git's author identity)
    #[arg(long, value_name = "IDENT")]
    pub reviewer: Option<String>,
    /// Sign with this SSH private key (default: git's user.signingkey with gpg.format ssh)
    #[arg(long, value_name = "PATH")]
    pub key: Option<std::path::PathBuf>,
    /// Fetch the remote first, then push the approval (and any other it lacks)
    #[arg(long)]
    pub push: bool,
    /// The remote (default: settings sync.remote, the branch's upstream, or origin)
    #[arg(long, value_name = "NAME")]
    pub remote: Option<String>,
    /// Approve only if the proposal's head is this commit id (the one you reviewed);
    /// without it, the head `builder review` last showed here must still be the head
    #[arg(long, value_name = "COMMIT", conflicts_with = "bootstrap")]
    pub head: Option<String>,
}

pub fn run(args: Args, repo_path: &Path) -> Result<Outcome, CommandError> {
    let wt = super::open_repo(repo_path)?;
    let Some(name) = args.name else {
        let who = Approver::of(&wt, args.reviewer.as_deref(), true, args.key, args.remote.as_deref())?;
        let approval =
            shared::review::bootstrap::approve_head(&wt.repo, &who.reviewer, &who.rule, who.signing.as_ref())?;
        println!(
            "approved HEAD's builder tree {} by {} as the first approval (approval {})",
            approval.body.tree,
            approval.body.approver,
            shared::text::short_oid(approval.id)
        );
        if args.push {
            let Some(r) = super::team_remote(&wt.repo, args.remote.as_deref(), &who.settings, true)? else {
                return Err(CommandError::usage("--push: this repository has no remote"));
            };
            let n = shared::review::remote::publish_approvals(&wt.repo, &wt.root, &r)?;
            println!("pushed {n} approval(s) to {r} (it has every approval this clone has)");
        }
        return Ok(Outcome::Ok);
    };
    let seen = match &args.head {
        Some(rev) => Some(Seen {
            head: named_commit(&wt.repo, rev)?,
            from: SeenFrom::Named,
        }),
        None => None,
    };
    let done = approve_proposal(
        &wt,
        &name,
        Approving {
            reviewer: args.reviewer.as_deref(),
            reviewer_flag: true,
            key: args.key,
            push: args.push,
            remote: args.remote.as_deref(),
            seen,
        },
    )?;
    let (approved, pushed, remote) = (done.approved, done.pushed, done.remote);
    let approval = &approved.approval;
    println!(
        "{} proposals/{} by {}: builder tree {} (approval {})",
        if approved.recorded {
            "approved"
        } else {
            "already approved"
        },
        name,
        approval.body.approver,
        approval.body.tree,
        shared::text::short_oid(approval.id)
    );
    if approval.body.signature.is_some() {
        println!("signed (SSH, namespace {})", shared::review::signing::NAMESPACE);
    }
    match (pushed, &remote) {
        (Some(n), Some(r)) => println!("pushed {n} approval(s) to {r} (it has every approval this clone has)"),
        (None, Some(r)) => println!(
            "hint: publish it with `builder approve {name} --push` (or `git push {r} {}`)",
            shared::review::approvals::approval_ref(approval.id)
        ),
        (_, None) => println!("hint: no remote yet: `git remote add origin <url>`, `builder install-hooks`, then `builder approve {name} --push`"),
    }
    Ok(Outcome::Ok)
}

/// Who approves and by which rule: the protected branch's committed settings judge
/// (never a checked-out proposal's; fetched first in a clone that lacks the branch,
/// [`super::settings_fetched_if_missing`]), the reviewer is `--reviewer` or git's acting
/// identity (never the runtime's), the key `--key` or git's signing key.
struct Approver {
    settings: shared::settings::RuntimeSettings,
    reviewer: shared::git::Person,
    rule: shared::review::signing::ApprovalRule,
    signing: Option<shared::review::approvals::Signing>,
}

impl Approver {
    /// `reviewer_flag`: whether the caller has `--reviewer` to name someone (the web
    /// view has not: its hint for a missing git identity does not offer it).
    fn of(
        wt: &shared::git::WorkTree,
        reviewer: Option<&str>,
        reviewer_flag: bool,
        key: Option<PathBuf>,
        remote: Option<&str>,
    ) -> Result<Approver, CommandError> {
        let (settings, _) = super::settings_fetched_if_missing(wt, remote, super::Landing::No)?;
        let reviewer = match reviewer {
            Some(r) => parse_person(r).ok_or_else(|| {
                CommandError::usage(format!("--reviewer `{r}` is not \"Name <email>\""))
                    .hint("for example: --reviewer \"Ann Lee <ann@example.com>\"")
            })?,
            None if reviewer_flag => super::acting_identity(&wt.repo, "--reviewer")?,
            None => shared::git::acting_identity(&wt.repo).map_err(|e| {
                CommandError::from(e).hint("set git's user.name and user.email for the person running builder serve")
            })?,
        };
        refuse_runtime(&reviewer, &super::runtime_person(&settings), "approve")?;
        let rule = super::approval_rule(&settings)?;
        let (configured, program) = shared::review::signing::git_signing_key(&wt.repo);
        let signing = key
            .or(configured)
            .map(|key| shared::review::approvals::Signing { key, program });
        Ok(Approver {
            settings,
            reviewer,
            rule,
            signing,
        })
    }
}

/// The commit `--head` names: a commit id, whole or a prefix of at least 7 hex digits
/// that names one commit. Never a ref name: a branch or tag the author pushed, named
/// like the short id `builder review` printed, would win over the id in git's lookup.
fn named_commit(repo: &git2::Repository, rev: &str) -> Result<git2::Oid, CommandError> {
    let hex = rev.len() >= 7 && rev.len() <= 40 && rev.chars().all(|c| c.is_ascii_hexdigit());
    if !hex {
        return Err(CommandError::usage(format!(
            "--head `{rev}` is not a commit id: give the id `builder review` printed (7 to 40 hex digits), not a branch or tag"
        )));
    }
    repo.find_commit_by_prefix(rev)
        .map(|c| c.id())
        .map_err(|e| CommandError::usage(format!("--head `{rev}` names no one commit here: {}", e.message())))
}

/// How to approve a proposal: `builder approve`'s flags (the web view passes none).
pub struct Approving<'a> {
    pub reviewer: Option<&'a str>,
    /// Whether the caller has `--reviewer` (for the hint when git names nobody).
    pub reviewer_flag: bool,
    pub key: Option<PathBuf>,
    pub push: bool,
    pub remote: Option<&'a str>,
    /// The head the reviewer saw (`--head`, or the web view's page); `None`: the head
    /// `builder review` last showed in this clone, if it showed one
    /// ([`shared::review::reviewed`]).
    pub seen: Option<Seen>,
}

/// What approving a proposal did: the approval, the remote judged against, and with
/// `push` how many approvals it was sent.
pub struct ApprovedProposal {
    pub approved: proposals::Approved,
    pub pushed: Option<usize>,
    pub remote: Option<String>,
}

/// Approves proposal `name`: the one path of `builder approve <name>` and of the web
/// view's approve action. Settles what an interrupted builder left first, judges by
/// the protected branch's committed settings ([`Approver`]), judges the remote's
/// proposal branch as last fetched (with `push`: fetched now, and the approval
/// published).
pub fn approve_proposal(
    wt: &shared::git::WorkTree,
    name: &str,
    how: Approving<'_>,
) -> Result<ApprovedProposal, CommandError> {
    let who = Approver::of(wt, how.reviewer, how.reviewer_flag, how.key, how.remote)?;
    super::recover_interrupted(wt)?;
    let remote = super::team_remote(&wt.repo, how.remote, &who.settings, how.push)?;
    let seen = how.seen.or_else(|| reviewed::last_review(wt.repo.commondir(), name));
    let reviewer = proposals::Reviewer {
        person: &who.reviewer,
        rule: &who.rule,
        signing: who.signing.as_ref(),
    };
    let (approved, pushed) = match (&remote, how.push) {
        (Some(r), true) => {
            let done = shared::review::land::approve_and_publish(&wt.repo, &wt.root, name, &reviewer, r, seen)?;
            (done.approved, Some(done.pushed))
        }
        _ => (
            proposals::approve(&wt.repo, name, &reviewer, remote.as_deref(), seen.as_ref())?,
            None,
        ),
    };
    Ok(ApprovedProposal {
        approved,
        pushed,
        remote,
    })
}
