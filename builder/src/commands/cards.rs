//! `builder cards`: list cards grouped by fingerprint, show, triage, export.

use super::{index, named};
use anyhow::bail;
use shared::cards::{self, TriageDecision};
use shared::history::{self, CardFilter};
use shared::records::{CardKind, CardStatus};
use std::path::Path;

/// Work with the runtime's failure cards
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: Option<CardsCommand>,
}

#[derive(Debug, clap::Subcommand)]
pub enum CardsCommand {
    /// List cards grouped by fingerprint (one line per failure, however often seen)
    List(ListArgs),
    /// Show the cards of one id or fingerprint
    Show {
        /// Card id or fingerprint
        id: String,
    },
    /// Record a triage decision in the card files
    Triage(TriageArgs),
    /// Export card groups (as GitHub issue bodies)
    Export {
        /// Output format
        #[arg(long, value_enum, default_value = "github")]
        format: ExportFormat,
        #[command(flatten)]
        filter: FilterArgs,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum ExportFormat {
    Github,
}

#[derive(Debug, Clone, Default, clap::Args)]
pub struct FilterArgs {
    /// Only this task
    #[arg(long)]
    pub task: Option<String>,
    /// Only this kind
    #[arg(long, value_parser = named::<CardKind>())]
    pub kind: Option<CardKind>,
    /// Only groups whose latest card has this status
    #[arg(long, value_parser = named::<CardStatus>())]
    pub status: Option<CardStatus>,
    /// Only cards created on or after this date (YYYY-MM-DD or RFC 3339)
    #[arg(long)]
    pub since: Option<String>,
}

impl FilterArgs {
    fn filter(&self) -> CardFilter {
        CardFilter {
            task: self.task.clone(),
            kind: self.kind,
            status: self.status,
            since: self.since.clone(),
        }
    }
}

#[derive(Debug, Clone, Default, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub filter: FilterArgs,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct TriageArgs {
    /// Card id or fingerprint (a fingerprint triages every card in the group)
    pub id: String,
    /// Accept: a real problem to act on
    #[arg(long, group = "decision")]
    pub accept: bool,
    /// Reject: not a problem
    #[arg(long, group = "decision")]
    pub reject: bool,
    /// Duplicate of another card
    #[arg(long, group = "decision", value_name = "CARD")]
    pub duplicate_of: Option<String>,
    /// Fixed by a commit or proposal
    #[arg(long, group = "decision", value_name = "COMMIT|PROPOSAL")]
    pub fixed_by: Option<String>,
    /// A note to keep with the decision
    #[arg(long)]
    pub note: Option<String>,
    /// Who decides (default: git config user.name and user.email)
    #[arg(long)]
    pub by: Option<String>,
}

pub fn run(args: Args, repo: &Path) -> anyhow::Result<i32> {
    let mut ix = index::open(repo)?;
    match args.command.unwrap_or(CardsCommand::List(ListArgs::default())) {
        CardsCommand::List(a) => {
            let groups = history::card_groups(&ix.store, &a.filter.filter())?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&groups)?);
            } else if groups.is_empty() {
                println!("no cards");
            } else {
                println!(
                    "{:>5}  {:<10} {:<10} {:<20} {:<14} {:<10} {:<16}  SUMMARY",
                    "COUNT", "FIRST", "LAST", "KIND", "TASK", "STATUS", "FINGERPRINT"
                );
                for g in &groups {
                    println!(
                        "{:>5}  {:<10} {:<10} {:<20} {:<14} {:<10} {:<16}  {}",
                        g.count,
                        &g.first_seen[..10.min(g.first_seen.len())],
                        &g.last_seen[..10.min(g.last_seen.len())],
                        g.kind,
                        g.task,
                        g.status,
                        g.fingerprint,
                        g.summary
                    );
                }
            }
            Ok(0)
        }
        CardsCommand::Show { id } => {
            let paths = history::card_paths(&ix.store, &id)?;
            if paths.is_empty() {
                eprintln!("error: no card or fingerprint `{id}`");
                eprintln!("hint: `builder cards list` shows fingerprints");
                return Ok(2);
            }
            for p in &paths {
                println!("# {p}");
                print!("{}", std::fs::read_to_string(ix.root.join(p))?);
            }
            Ok(0)
        }
        CardsCommand::Triage(t) => {
            let decision = match (t.accept, t.reject, t.duplicate_of, t.fixed_by) {
                (true, _, _, _) => TriageDecision::Accept,
                (_, true, _, _) => TriageDecision::Reject,
                (_, _, Some(d), _) => TriageDecision::DuplicateOf(d),
                (_, _, _, Some(f)) => TriageDecision::FixedBy(f),
                _ => bail!("say what you decided: --accept, --reject, --duplicate-of <id> or --fixed-by <commit>"),
            };
            let by = match t.by {
                Some(b) => b,
                None => engineer(&ix.repo)?,
            };
            let paths = history::card_paths(&ix.store, &t.id)?;
            if paths.is_empty() {
                eprintln!("error: no card or fingerprint `{}`", t.id);
                return Ok(2);
            }
            let done =
                cards::triage(&ix.root, &paths, &decision, &by, t.note.as_deref()).map_err(anyhow::Error::msg)?;
            // Reflect the edit in the index right away.
            history::reindex_cards(&ix.root, &mut ix.store, &paths)?;
            println!("triaged {} card(s) as {} by {by}", done.len(), decision.status());
            println!("hint: commit the card files to share the triage (git add cards && git commit)");
            Ok(0)
        }
        CardsCommand::Export {
            format: ExportFormat::Github,
            filter,
        } => {
            let groups = history::card_groups(&ix.store, &filter.filter())?;
            let issues: Vec<_> = groups
                .iter()
                .map(|g| {
                    let latest = shared::records::read_card(&ix.root.join(&g.latest_path)).ok();
                    cards::github_issue(g, latest.as_ref())
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&issues)?);
            Ok(0)
        }
    }
}

/// The engineer's identity for triage: git config, then the usual environment.
fn engineer(repo: &git2::Repository) -> anyhow::Result<String> {
    if let Ok(sig) = repo.signature() {
        if let (Ok(n), Ok(e)) = (sig.name(), sig.email()) {
            return Ok(format!("{n} <{e}>"));
        }
    }
    match (std::env::var("GIT_AUTHOR_NAME"), std::env::var("GIT_AUTHOR_EMAIL")) {
        (Ok(n), Ok(e)) => Ok(format!("{n} <{e}>")),
        _ => bail!("who is triaging? set git config user.name and user.email, or pass --by \"Name <email>\""),
    }
}
