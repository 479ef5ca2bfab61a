//! `builder cards`: list cards grouped by fingerprint, show, triage, export.

use super::{index, named};
use crate::command_error::{CommandError, Outcome};
use anyhow::Context;
use shared::cards::{self, TriageDecision};
use shared::history::{self, CardFilter};
use shared::records::{CardKind, CardStatus};
use shared::text::{printable, printable_json, printable_multiline};
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
    /// The filter, once `--since` parses and `--task` names a task the repository knows.
    fn filter(&self, ix: &index::Indexed) -> Result<CardFilter, CommandError> {
        if let Some(t) = &self.task {
            index::known_task(ix, t)?;
        }
        Ok(CardFilter {
            task: self.task.clone(),
            kind: self.kind,
            status: self.status,
            since: index::since(self.since.clone())?,
        })
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
    /// Who decides (default: git's author identity, as `git commit` picks it)
    #[arg(long)]
    pub by: Option<String>,
}

pub fn run(args: Args, repo: &Path) -> Result<Outcome, CommandError> {
    // Status comes from the card files: the work tree's edits overlaid on HEAD's.
    let mut ix = index::open_with_cards(repo)?;
    match args.command.unwrap_or(CardsCommand::List(ListArgs::default())) {
        CardsCommand::List(a) => {
            let groups = history::card_groups(&ix.store, &a.filter.filter(&ix)?)?;
            if a.json {
                println!("{}", printable_json(&serde_json::to_string_pretty(&groups)?));
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
                        printable(&g.first_seen.chars().take(10).collect::<String>()),
                        printable(&g.last_seen.chars().take(10).collect::<String>()),
                        g.kind,
                        printable(&g.task),
                        g.status,
                        printable(&g.fingerprint),
                        printable(&g.summary)
                    );
                }
            }
            Ok(Outcome::Ok)
        }
        CardsCommand::Show { id } => {
            let paths = history::card_paths(&ix.store, &id)?;
            if paths.is_empty() {
                return Err(no_card(&id));
            }
            for p in &paths {
                let full = ix.root.join(p);
                println!("# {}", printable(p));
                print!(
                    "{}",
                    printable_multiline(&std::fs::read_to_string(&full).with_context(|| full.display().to_string())?)
                );
            }
            Ok(Outcome::Ok)
        }
        CardsCommand::Triage(t) => {
            let decision = match (t.accept, t.reject, t.duplicate_of, t.fixed_by) {
                (true, _, _, _) => TriageDecision::Accept,
                (_, true, _, _) => TriageDecision::Reject,
                (_, _, Some(d), _) => TriageDecision::DuplicateOf(d),
                (_, _, _, Some(f)) => match cards::resolve_fixed_by(&ix.repo, &f) {
                    Some(fix) => TriageDecision::FixedBy(fix),
                    None => {
                        return Err(CommandError::usage(format!(
                            "--fixed-by `{f}` is neither a commit in this repository nor a proposal (no branch proposals/{f})"
                        ))
                        .hint("name a commit (`git log --oneline`) or a proposal (`git branch --list 'proposals/*'`)"))
                    }
                },
                _ => {
                    return Err(CommandError::usage(format!("no decision for `{}`", t.id))
                        .hint("say what you decided: --accept, --reject, --duplicate-of <id> or --fixed-by <commit>"))
                }
            };
            let by = match t.by {
                Some(b) => b,
                None => super::acting_identity(&ix.repo, "--by")?.to_string(),
            };
            let req = cards::TriageRequest {
                id: &t.id,
                decision: &decision,
                by: &by,
                note: t.note.as_deref(),
            };
            let done =
                cards::triage_cards(&ix.repo, &mut ix.store, &req, &mut ix.stats.skipped).map_err(|e| match e {
                    cards::TriageError::NoCard(id) => no_card(&id),
                    // The library reports a card it cannot read or write as text only.
                    cards::TriageError::Files(e) => {
                        CommandError::environment(e).hint("check the card files named above")
                    }
                    cards::TriageError::History(e) => CommandError::from(e),
                    cards::TriageError::Store(e) => CommandError::from(e),
                })?;
            let retriaged = done.iter().filter(|c| !c.triage_history.is_empty()).count();
            println!("triaged {} card(s) as {} by {by}", done.len(), decision.status());
            if retriaged > 0 {
                println!("{retriaged} card(s) were triaged before: the earlier decision is kept in triage_history");
            }
            println!("hint: commit the card files to share the triage (git add cards && git commit)");
            Ok(Outcome::Ok)
        }
        CardsCommand::Export {
            format: ExportFormat::Github,
            filter,
        } => {
            let groups = history::card_groups(&ix.store, &filter.filter(&ix)?)?;
            let issues: Vec<_> = groups
                .iter()
                .map(|g| {
                    let latest = shared::records::read_card(&ix.root.join(&g.latest_path)).ok();
                    cards::github_issue(g, latest.as_ref())
                })
                .collect();
            println!("{}", printable_json(&serde_json::to_string_pretty(&issues)?));
            Ok(Outcome::Ok)
        }
    }
}

fn no_card(id: &str) -> CommandError {
    CommandError::usage(format!("no card or fingerprint `{id}`")).hint("`builder cards list` shows fingerprints")
}
