//! `builder cards triage`: a person's decision on a card, or on every card of a
//! fingerprint, written into the card files with who decided.

use super::no_card;
use crate::command_error::{CommandError, Outcome};
use crate::commands::index::Indexed;
use shared::cards::{self, TriageDecision};

#[derive(Debug, clap::Args)]
pub struct Args {
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

pub fn run(t: Args, ix: &mut Indexed) -> Result<Outcome, CommandError> {
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
        None => crate::commands::acting_identity(&ix.repo, "--by")?.to_string(),
    };
    let req = cards::TriageRequest {
        id: &t.id,
        decision: &decision,
        by: &by,
        note: t.note.as_deref(),
    };
    let done = cards::triage_cards(&ix.repo, &mut ix.store, &req, &mut ix.stats.skipped).map_err(|e| match e {
        cards::TriageError::NoCard(id) => no_card(&id),
        // The library reports a card it cannot read or write as text only.
        cards::TriageError::Files(e) => CommandError::environment(e).hint("check the card files named above"),
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
