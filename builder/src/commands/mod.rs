//! The `builder` command line: one module per subcommand, each with its `Args` (doc
//! comment = help text) beside its `run` function.

mod approve;
mod approve_call;
mod audit;
mod cards;
mod check;
mod eval;
mod history;
mod index;
mod init;
mod install_hooks;
mod land;
mod mcp;
mod merge;
mod proposals;
mod propose;
mod retro;
mod review;
mod serve;
mod watch;

use crate::command_error::{self, CommandError, Outcome};
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{CommandFactory, Parser, Subcommand};
use shared::records::{parse_name, Named};
use std::path::{Path, PathBuf};

/// Parses a `--kind` or `--status` value into one of the records' enums: help and
/// completions list the names, and an unknown name is a usage error (exit 2) that
/// lists them too.
fn named<T: Named + Clone + Send + Sync>() -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(T::ALL.iter().map(|v| v.name())).try_map(|s| parse_name::<T>(&s))
}

/// Build and review what the runtime runs: prompts, scope, settings, tools
#[derive(Debug, Parser)]
#[command(name = "builder", version = cli::VERSION, propagate_version = true, after_help = command_error::exit_codes_help())]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, clap::Args)]
pub struct Global {
    /// Run as if started in <REPO> (like git -C)
    #[arg(short = 'C', global = true, value_name = "REPO", default_value = ".")]
    pub repo: PathBuf,
    /// Log more (-v info, -vv debug); logs go to stderr
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    Init(init::Args),
    Check(check::Args),
    Cards(cards::Args),
    History(history::Args),
    Retro(retro::Args),
    Watch(watch::Args),
    Audit(audit::Args),
    Propose(propose::Args),
    Proposals(proposals::Args),
    Approve(approve::Args),
    Merge(merge::Args),
    Land(land::Args),
    InstallHooks(install_hooks::Args),
    Review(review::Args),
    Eval(eval::Args),
    ApproveCall(approve_call::Args),
    Serve(serve::Args),
    Mcp(mcp::Args),
    /// Print shell completions
    Completions {
        /// The shell to complete for
        shell: clap_complete::Shell,
    },
    Man(cli::man::Args),
}

pub fn run(cli: Cli) -> Result<Outcome, CommandError> {
    command_error::forced_internal_error()?;
    let repo = cli.global.repo;
    match cli.command {
        Command::Init(a) => init::run(a, &repo),
        Command::Check(a) => check::run(a, &repo),
        Command::Cards(a) => cards::run(a, &repo),
        Command::History(a) => history::run(a, &repo),
        Command::Retro(a) => retro::run(a, &repo),
        Command::Watch(a) => watch::run(a, &repo),
        Command::Audit(a) => audit::run(a, &repo),
        Command::Propose(a) => propose::run(a, &repo),
        Command::Proposals(a) => proposals::run(a, &repo),
        Command::Approve(a) => approve::run(a, &repo),
        Command::Merge(a) => merge::run(a, &repo),
        Command::Land(a) => land::run(a, &repo),
        Command::InstallHooks(a) => install_hooks::run(a, &repo),
        Command::Review(a) => review::run(a, &repo),
        Command::Eval(a) => eval::run(a, &repo),
        Command::ApproveCall(a) => approve_call::run(a, &repo),
        Command::Serve(a) => serve::run(a, &repo),
        Command::Mcp(a) => mcp::run(a, &repo),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "builder", &mut std::io::stdout());
            Ok(Outcome::Ok)
        }
        Command::Man(a) => cli::man::run(a, Cli::command()).map(|()| Outcome::Ok),
    }
}

/// Opens the repository containing `path` (the `-C` directory), the one way every
/// command does.
pub fn open_repo(path: &Path) -> Result<shared::git::WorkTree, CommandError> {
    Ok(shared::git::open_work_tree(path)?)
}

/// The commit `rev` names (`flag` is the option it came from): a revision that does
/// not resolve is a usage error.
pub fn resolve_commit(repo: &git2::Repository, flag: &str, rev: &str) -> Result<git2::Oid, CommandError> {
    repo.revparse_single(rev)
        .and_then(|o| o.peel_to_commit())
        .map(|c| c.id())
        .map_err(|e| match e.code() {
            git2::ErrorCode::NotFound
            | git2::ErrorCode::InvalidSpec
            | git2::ErrorCode::Ambiguous
            | git2::ErrorCode::Peel => CommandError::usage(format!(
                "{flag} {rev}: not a commit in this repository ({})",
                e.message()
            ))
            .hint("`git log --oneline` lists commits; any revision git understands works (HEAD~3, a tag, an id)"),
            _ => CommandError::from(e),
        })
}

/// The person acting (approver, triager): git's author identity, or an error that
/// says how to set it or which flag (`flag`) names someone explicitly.
pub fn acting_identity(repo: &git2::Repository, flag: &str) -> Result<shared::git::Person, CommandError> {
    shared::git::acting_identity(repo)
        .map_err(|e| CommandError::from(e).hint(format!("or name the person: {flag} \"Name <email>\"")))
}

/// The settings of the work tree (the runtime identity, extra builder paths), for the
/// commands that act on what is checked out (`propose`, `mcp`); bad
/// settings are a configuration error: judging with defaults would pass history it
/// should flag. Commands that judge approvals use [`protected_branch_settings`].
pub fn review_settings(
    root: &Path,
) -> Result<(shared::settings::RuntimeSettings, shared::layout::Ownership), CommandError> {
    let settings = shared::settings::load(root)
        .map_err(|d| {
            CommandError::from(d)
                .hint("this command needs the settings for the runtime identity and the builder-owned paths")
        })?
        .runtime;
    let ownership = ownership_of(root, &settings)?;
    Ok((settings, ownership))
}

/// Who owns which path in the work tree at `root`, by `settings`' `builder_paths`.
fn ownership_of(
    root: &Path,
    settings: &shared::settings::RuntimeSettings,
) -> Result<shared::layout::Ownership, CommandError> {
    shared::layout::Ownership::new(root)
        .with_globs(&settings.builder_paths, &[])
        .map_err(|e| CommandError::new(command_error::Kind::Config, e))
}

/// The settings (and ownership) every command that judges approvals goes by (`land`,
/// `merge`, `approve`, `proposals`, `audit`, the same actions in `builder serve`, the
/// pre-push hook): the protected branch's committed settings as review left them
/// ([`shared::review::base::protected_settings`]), never a checked-out proposal's
/// (its approval rule, allowed-signers list and `sync` are the author's); the work
/// tree's where the clone has no protected branch yet, without their `sync`: there
/// they may be a proposal's (a clone of it alone), whose `sync.branch` or
/// `sync.remote` would name which branch the pre-push hook judges and where `land`
/// and `approve --push` go.
pub fn protected_branch_settings(
    wt: &shared::git::WorkTree,
) -> Result<(shared::settings::RuntimeSettings, shared::layout::Ownership), CommandError> {
    match committed_protected_settings(wt)? {
        Some(settings) => {
            let ownership = ownership_of(&wt.root, &settings)?;
            Ok((settings, ownership))
        }
        None => {
            let (mut settings, ownership) = review_settings(&wt.root)?;
            settings.sync = None;
            Ok((settings, ownership))
        }
    }
}

/// The protected branch's committed settings ([`shared::review::base::protected_settings`]),
/// `None` when this clone has no protected branch.
fn committed_protected_settings(
    wt: &shared::git::WorkTree,
) -> Result<Option<shared::settings::RuntimeSettings>, CommandError> {
    match shared::review::base::protected_settings(&wt.repo) {
        Ok(found) => Ok(found.map(|(_, settings)| settings)),
        Err(shared::review::delta::DeltaError::Store(e)) => Err(CommandError::from(e)),
        Err(e @ shared::review::delta::DeltaError::NoTrustedBase(_)) => Err(CommandError::new(
            command_error::Kind::Refused,
            e,
        )
        .hint("the protected branch's history gives no reviewed commit to judge by: push its reviewed tip back, or fix the merge that owes review")),
        Err(shared::review::delta::DeltaError::WentBack(back)) => {
            let again = format!(
                "if {} went back by mistake, or was pushed back by someone who may not, push its newer tip again",
                back.tip
            );
            let accept = format!(
                "if it went back on purpose, approve a new commit on top of it (a newer approval), or remove {} to judge by its rules in this clone",
                back.mark.display()
            );
            let lost = format!("this clone no longer has commit {} to judge by", back.before.commit);
            Err(CommandError::new(command_error::Kind::Refused, *back)
                .hint(lost)
                .hint(again)
                .hint(accept))
        }
        Err(e) => Err(CommandError::new(command_error::Kind::Config, e)
            .hint("the protected branch's committed settings judge this command: fix them through review")),
    }
}

/// The settings and remote of a command that lands on the protected branch (`land`):
/// [`settings_fetched_if_missing`], where a remote with a protected branch is
/// required.
pub fn settings_to_land_by(
    wt: &shared::git::WorkTree,
    remote_flag: Option<&str>,
) -> Result<(shared::settings::RuntimeSettings, String), CommandError> {
    let (settings, remote) = settings_fetched_if_missing(wt, remote_flag, Landing::OntoIt)?;
    let remote = match remote {
        Some(r) => Some(r),
        None => team_remote(&wt.repo, remote_flag, &settings, true)?,
    };
    Ok((
        settings,
        remote.ok_or_else(|| CommandError::usage("this repository has no remote to land on"))?,
    ))
}

/// Whether the command lands on the protected branch, which must then exist.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Landing {
    OntoIt,
    No,
}

/// [`protected_branch_settings`] for a command that also speaks with the team's
/// remote (`land`, `approve`): in a clone without the protected branch (a checkout of
/// the proposal alone, as CI makes one), the judging remote (`remote_flag`, else
/// [`shared::review::remote::judging_remote`], never the work tree's `sync.remote`,
/// which may be the proposal's) is fetched first and its protected branch judges. A
/// repository with no remote, or whose remote has no protected branch yet (a new one,
/// before its first push), is judged by the work tree's settings without their
/// `sync`, except by `land`, which refuses. Returns the remote fetched, if any.
pub fn settings_fetched_if_missing(
    wt: &shared::git::WorkTree,
    remote_flag: Option<&str>,
    landing: Landing,
) -> Result<(shared::settings::RuntimeSettings, Option<String>), CommandError> {
    let work_tree = || -> Result<_, CommandError> {
        let (mut settings, _) = review_settings(&wt.root)?;
        settings.sync = None;
        Ok(settings)
    };
    if let Some(settings) = committed_protected_settings(wt)? {
        return Ok((settings, None));
    }
    let remote = match remote_flag {
        Some(_) => remote_by(&wt.repo, remote_flag, None, true)?,
        None => shared::review::remote::judging_remote(&wt.repo)?,
    };
    let Some(remote) = remote else {
        return Ok((work_tree()?, None));
    };
    shared::review::remote::fetch(&wt.root, &remote)?;
    let Some(settings) = committed_protected_settings(wt)? else {
        if landing == Landing::No {
            return Ok((work_tree()?, None));
        }
        return Err(CommandError::usage(format!(
            "{remote} has no protected branch to judge by (settings sync.branch, else the remote's default branch, `main` or `master`)"
        ))
        .hint("push the protected branch first, or run this in a clone that has it"));
    };
    let remote = team_remote(&wt.repo, remote_flag, &settings, true)?;
    Ok((settings, remote))
}

/// The rule approvals are judged by (`shared::review::signing::ApprovalRule`), from
/// the settings; an unreadable operator's allowed-signers file is a configuration
/// error (a list in the repository is read from the trusted tree when judging).
pub fn approval_rule(
    settings: &shared::settings::RuntimeSettings,
) -> Result<shared::review::signing::ApprovalRule, CommandError> {
    shared::review::signing::ApprovalRule::from_settings(settings)
        .map_err(|d| CommandError::from(shared::diag::Diagnostics(vec![d])))
}

/// Settles what an interrupted builder command left (its stale locks, a half-moved
/// work tree, a half-made proposal) and says what it did. Returns what was done.
pub fn recover_interrupted(wt: &shared::git::WorkTree) -> Result<shared::review::work::Recovered, CommandError> {
    let done = shared::review::work::recover(&wt.repo)?;
    for lock in &done.locks {
        eprintln!("recovered: removed {} an interrupted builder left", lock.display());
    }
    for (_, what) in &done.work {
        eprintln!("recovered: {}", shared::text::printable(what));
    }
    Ok(done)
}

/// The remote a review command talks to: `--remote`, else the default
/// ([`shared::review::remote::default_remote`]); `needed` makes its absence a usage
/// error.
pub fn team_remote(
    repo: &git2::Repository,
    flag: Option<&str>,
    settings: &shared::settings::RuntimeSettings,
    needed: bool,
) -> Result<Option<String>, CommandError> {
    remote_by(repo, flag, settings.sync.as_ref(), needed)
}

/// [`team_remote`] by `sync` alone (`None`: the branch's upstream, or origin).
fn remote_by(
    repo: &git2::Repository,
    flag: Option<&str>,
    sync: Option<&shared::settings::SyncSettings>,
    needed: bool,
) -> Result<Option<String>, CommandError> {
    if let Some(r) = flag {
        if repo.find_remote(r).is_err() {
            return Err(
                CommandError::usage(format!("--remote {r}: no such remote in this repository"))
                    .hint("`git remote -v` lists the remotes"),
            );
        }
        return Ok(Some(r.to_string()));
    }
    let found = shared::review::remote::default_remote(repo, sync)?;
    if found.is_none() && needed {
        return Err(CommandError::usage("this repository has no remote to publish to")
            .hint("`git remote add origin <url>` then `builder install-hooks`; or name one with --remote"));
    }
    Ok(found)
}

/// Says on stderr how many approvals this clone has that `remote` lacks (best effort:
/// an unreachable remote is named at -v only).
pub fn report_unpublished(wt: &shared::git::WorkTree, remote: &str) {
    let compared = match shared::review::remote::unpublished(&wt.repo, &wt.root, remote) {
        Ok(c) => c,
        Err(e) => return tracing::info!(remote, error = %e, "could not compare approvals with the remote"),
    };
    if let Some(first) = compared.malformed.first() {
        let first = shared::text::printable(first);
        eprintln!(
            "warning: {remote} holds {} ref(s) under the approvals that name no approval (someone's push, first `{first}`): every clone's `git pull` fails on them",
            compared.malformed.len()
        );
        eprintln!(
            "hint: delete each on {remote} (`git push {remote} :{first}`), then push this clone's approvals back; never run `git remote prune` (it deletes approvals)"
        );
    }
    if let Some(first) = compared.moved_off.first() {
        let first = shared::text::printable(first);
        let id = first.rsplit('/').next().unwrap_or_default();
        eprintln!(
            "warning: {remote} holds {} approval ref(s) force-moved off the approval their name holds (someone's forced push, first `{first}`): every clone's `git pull` and `git push` fail on them; the approval itself stands (it is read from the name)",
            compared.moved_off.len()
        );
        eprintln!(
            "hint: put each back where its name points (`git push --force {remote} {id}:{first}`); a protected `refs/builder/*` on the origin refuses such pushes (docs/team.md)"
        );
    }
    if !compared.missing.is_empty() {
        eprintln!(
            "warning: {remote} lacks {} approval(s) this clone has (a forced push there, or never pushed)",
            compared.missing.len()
        );
        eprintln!("hint: push them back with `git push {remote} 'refs/builder/approved/*:refs/builder/approved/*'`");
    }
}

/// The runtime identity of `settings` as a person.
pub fn runtime_person(settings: &shared::settings::RuntimeSettings) -> shared::git::Person {
    shared::git::Person {
        name: settings.runtime_identity.name.clone(),
        email: settings.runtime_identity.email.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `builder`, `builder-cards`, `builder-cards-list`, ...: the page names of the tree.
    fn page_names(cmd: &clap::Command, prefix: &str, out: &mut Vec<String>) {
        let name = if prefix.is_empty() {
            cmd.get_name().to_string()
        } else {
            format!("{prefix}-{}", cmd.get_name())
        };
        out.push(format!("{name}.1"));
        for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
            page_names(sub, &name, out);
        }
    }

    #[test]
    fn every_subcommand_and_argument_has_help() {
        let mut cmd = Cli::command();
        cmd.build();
        let missing = cli::help::missing_help(&cmd, "builder");
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }

    #[test]
    fn the_cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn man_dir_writes_a_page_per_subcommand() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("man1");
        let pages = cli::man::write_pages(Cli::command(), &out).unwrap();
        let mut names: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        let mut expected = Vec::new();
        page_names(&Cli::command(), "", &mut expected);
        expected.sort();
        assert_eq!(names, expected);
        for page in [
            "builder.1",
            "builder-cards-triage.1",
            "builder-history-compare.1",
            "builder-approve-call.1",
            "builder-eval.1",
            "builder-review.1",
        ] {
            assert!(names.iter().any(|n| n == page), "{page} in {names:?}");
        }
        assert_eq!(pages.len(), names.len());
        for p in pages {
            let text = std::fs::read_to_string(&p).unwrap();
            assert!(text.contains("\n.TH "), "{} is a man page", p.display());
        }
    }
}
