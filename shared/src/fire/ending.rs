//! How a fire ends: its [`FireEnd`] (the exit code), its one closing line and the
//! next command. Decided once, from the run, after every card is known and before
//! any card, receipt or commit is written ([`Ending::of_run`], [`Ending::refused`]).
//! What happens afterwards (writing, committing, pushing) cannot undo that decision;
//! it can only make it worse, by one rule in one place ([`Ending::worsen`]): a
//! failure of the machine replaces the end and leads the line, a box that needs a
//! person turns a completed fire into one that needs attention.

use super::{Abort, FireEnd, FireSummary, RunRecords};
use crate::records::{AcceptanceRecord, CardKind, RunStatus, StopReason};

/// The end, the closing line and the next command of a fire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ending {
    pub end: FireEnd,
    pub message: String,
    pub hint: Option<String>,
}

/// What can happen to a fire after its ending was decided.
#[derive(Debug, Clone)]
pub(crate) enum After {
    /// Writing, committing or pushing the records failed: the machine's problem (or,
    /// for a record we built that does not serialise, ours).
    Failed {
        end: FireEnd,
        message: String,
        hint: Option<String>,
    },
    /// The records are safe, but the box needs a person (it cannot fire what its
    /// remote holds, or its push replayed onto a rewritten history).
    Attention { message: String, hint: String },
}

impl Ending {
    /// The ending of a prepared run (or of one stopped by an `abort`: no sandbox, no
    /// provider, a tool worker that could not enter its sandbox, before or after the
    /// loop), from its records with every card known: an abort says why; a run
    /// stopped by a checkpoint it could not save is the machine's problem; otherwise
    /// the run's status decides, and a completed run that left cards needs attention.
    pub fn of_run(task: &str, run_id: &str, rec: &RunRecords, abort: Option<&Abort>) -> Ending {
        let cards = &rec.state.cards;
        let unsaved = cards.iter().find(|c| c.kind == CardKind::CheckpointFailed);
        let (end, message) = match (abort, unsaved) {
            (Some(a), _) => (a.end, a.card.summary.clone()),
            (None, Some(card)) if rec.stop == StopReason::CheckpointFailed => {
                (FireEnd::Environment, card.summary.clone())
            }
            (None, _) => {
                let end = match end_of(rec.status) {
                    FireEnd::Completed if !cards.is_empty() => FireEnd::NeedsAttention,
                    end => end,
                };
                (end, closing_line(task, rec))
            }
        };
        let pending = rec.state.pending.as_ref().map(|p| p.call.id.as_str());
        Ending {
            end,
            message,
            hint: cards.first().and_then(|c| hint_for(c.kind, run_id, pending)),
        }
    }

    /// The ending of a fire refused before its loop, with the refusal's card.
    pub fn refused(end: FireEnd, message: String, hint: Option<String>) -> Ending {
        Ending { end, message, hint }
    }

    /// The one rule for what happens after the decision. A failure replaces the end,
    /// leads the line (the run's own line follows it) and brings its hint; a box that
    /// needs a person turns a completed fire (or one already needing attention) into
    /// one that needs attention, and leaves a failed one as it was.
    pub fn worsen(&mut self, after: After) {
        match after {
            After::Failed { end, message, hint } => {
                self.end = end;
                self.message = match self.message.is_empty() {
                    true => message,
                    false => format!("{message}; {}", self.message),
                };
                if hint.is_some() {
                    self.hint = hint;
                }
            }
            After::Attention { message, hint } => {
                if matches!(self.end, FireEnd::Completed | FireEnd::NeedsAttention) {
                    self.end = FireEnd::NeedsAttention;
                    self.message = message;
                    self.hint = Some(hint);
                }
            }
        }
    }
}

impl FireSummary {
    /// [`Ending::worsen`] on a summary already made, when something happened.
    pub(crate) fn worsen_with(&mut self, after: Option<After>) {
        let Some(after) = after else {
            return;
        };
        let mut ending = Ending {
            end: self.end,
            message: std::mem::take(&mut self.message),
            hint: self.hint.take(),
        };
        ending.worsen(after);
        self.end = ending.end;
        self.message = ending.message;
        self.hint = ending.hint;
    }
}

/// How a run's status ends the fire, when nothing went wrong afterwards.
fn end_of(status: RunStatus) -> FireEnd {
    match status {
        RunStatus::Accepted | RunStatus::Completed => FireEnd::Completed,
        RunStatus::Failed | RunStatus::Cancelled | RunStatus::Crashed => FireEnd::Failed,
        // A run's records are written when it ends; a row still running is a bug.
        RunStatus::Running => FireEnd::Internal,
        RunStatus::Skipped => FireEnd::Skipped,
        RunStatus::WaitingApproval => FireEnd::WaitingApproval,
    }
}

/// `<task> <status> (<stop>), <n> steps`, then each failed acceptance check and the
/// failed model call's card (the kind, the HTTP status or the timeout, the retries).
fn closing_line(task: &str, rec: &RunRecords) -> String {
    let model_failure = rec
        .state
        .cards
        .iter()
        .find(|c| matches!(c.kind, CardKind::ProviderError | CardKind::ContextOverflow))
        .map(|c| format!(": {}", c.summary))
        .unwrap_or_default();
    format!(
        "{task} {} ({}), {} steps{}{model_failure}",
        rec.status.as_str(),
        rec.stop.as_str(),
        rec.state.step,
        failed_checks_line(&rec.acceptance),
    )
}

/// `; acceptance check `x` failed: detail` for each failed check.
fn failed_checks_line(acceptance: &[AcceptanceRecord]) -> String {
    acceptance
        .iter()
        .filter(|a| !a.passed)
        .map(|a| format!("; acceptance check `{}` failed: {}", a.check, a.detail))
        .collect()
}

/// The next command for a fire whose first card is of `kind`.
pub(crate) fn hint_for(kind: CardKind, run_id: &str, pending_call: Option<&str>) -> Option<String> {
    Some(match kind {
        CardKind::InvalidConfig => "the card's detail names each problem with file:line; `builder check` lists them all".into(),
        CardKind::ApprovalNeeded => format!(
            "`builder approve-call {run_id} {}` decides the call (`--deny` to refuse it), then `runtime resume {run_id}`",
            pending_call.unwrap_or("<call-id>")
        ),
        CardKind::UnreviewedChanges => {
            "the card says what is not reviewed; `builder proposals` and `builder review <name>` show what waits for approval".into()
        }
        CardKind::SandboxUnavailable => {
            "`runtime check` shows what this kernel offers; settings `sandbox.landlock` chooses the mode".into()
        }
        CardKind::PrefetchFailed => "run the prefetch script by hand to see why; the card has its output".into(),
        CardKind::PrefetchTruncated => {
            "make the prefetch script print less, or raise limits.tool_output_bytes".into()
        }
        CardKind::OutputRejected => {
            "the card names each file left out of the commit and why; `limits.output_*` sets the caps".into()
        }
        CardKind::ContextOverflow => {
            "set `max_context_tokens` on the provider in settings/runtime.yaml to the server's real window".into()
        }
        CardKind::StateReset => {
            "the damaged file is kept beside the new one in .runtime/; runs it held waiting for approval must be fired again".into()
        }
        CardKind::ApprovalStale => {
            "look at what changed in the named files; if it is what you meant to run, fire the task again and approve the new pause".into()
        }
        CardKind::CheckpointFailed => {
            "a checkpoint that could not be saved: free space on (or make writable) the file system of .runtime/, and the next fire of the task resumes the run from its last checkpoint or closes it; a waiting run whose checkpoint could not be read was given up, and its task fired afresh".into()
        }
        CardKind::CommitBlocked => {
            "the card says what stood in the way (a lock, a rebase or merge, a detached HEAD, a full disk): once it is gone, the next fire of any task commits these records".into()
        }
        CardKind::SyncFailed => {
            "the card names the step that failed and git's message; the records stay committed locally and the next fire tries the sync again".into()
        }
        CardKind::McpDrift => {
            "the card says what changed; if the server's new definition is what you want, `builder mcp pin` and review the lock".into()
        }
        CardKind::McpServerFailed => {
            "the card has the server's stderr tail; run its command by hand, or set `required: false` to fire without it".into()
        }
        CardKind::PermissionDenied
        | CardKind::MissingTool
        | CardKind::BudgetExceeded
        | CardKind::MaxSteps
        | CardKind::RepeatedCall
        | CardKind::RepeatedError
        | CardKind::ProviderError
        | CardKind::AcceptanceFailed
        | CardKind::SideEffectUncertain
        | CardKind::Crashed
        | CardKind::EmptyReport => "`builder cards list` shows the cards; the receipt has the details".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::CardDraft;

    fn run(status: RunStatus, stop: StopReason, cards: &[CardKind]) -> RunRecords {
        let mut rec = RunRecords {
            status,
            stop,
            inputs: Default::default(),
            sandbox: Default::default(),
            state: Default::default(),
            acceptance: vec![],
        };
        rec.state.step = 3;
        rec.state.cards = cards
            .iter()
            .map(|&kind| CardDraft {
                kind,
                summary: format!("{} happened", kind.as_str()),
                detail: String::new(),
                evidence: vec![],
            })
            .collect();
        rec
    }

    #[test]
    fn a_run_ends_by_its_status_and_its_cards() {
        let clean = Ending::of_run("t", "r", &run(RunStatus::Accepted, StopReason::FinalAnswer, &[]), None);
        assert_eq!(clean.end, FireEnd::Completed);
        assert_eq!(clean.message, "t accepted (final_answer), 3 steps");
        assert_eq!(clean.hint, None);

        let carded = run(
            RunStatus::Completed,
            StopReason::FinalAnswer,
            &[CardKind::OutputRejected],
        );
        let carded = Ending::of_run("t", "r", &carded, None);
        assert_eq!(carded.end, FireEnd::NeedsAttention);
        assert!(carded.hint.is_some(), "the first card's next step");

        let mut checked = run(
            RunStatus::Failed,
            StopReason::FinalAnswer,
            &[CardKind::AcceptanceFailed],
        );
        checked.acceptance.push(AcceptanceRecord {
            check: "tests".into(),
            passed: false,
            detail: "exit 1".into(),
        });
        let checked = Ending::of_run("t", "r", &checked, None);
        assert_eq!(checked.end, FireEnd::Failed);
        assert!(
            checked.message.ends_with("; acceptance check `tests` failed: exit 1"),
            "{}",
            checked.message
        );

        let model = run(RunStatus::Failed, StopReason::ProviderError, &[CardKind::ProviderError]);
        let model = Ending::of_run("t", "r", &model, None);
        assert!(
            model.message.ends_with(": provider_error happened"),
            "{}",
            model.message
        );
    }

    #[test]
    fn an_abort_or_an_unsaved_checkpoint_decides_over_the_status() {
        let abort = Abort {
            end: FireEnd::InvalidInput,
            card: CardDraft {
                kind: CardKind::InvalidConfig,
                summary: "no provider".into(),
                detail: String::new(),
                evidence: vec![],
            },
        };
        let rec = run(RunStatus::Failed, StopReason::NotStarted, &[CardKind::InvalidConfig]);
        let ending = Ending::of_run("t", "r", &rec, Some(&abort));
        assert_eq!(
            (ending.end, ending.message.as_str()),
            (FireEnd::InvalidInput, "no provider")
        );

        let rec = run(
            RunStatus::Failed,
            StopReason::CheckpointFailed,
            &[CardKind::CheckpointFailed],
        );
        let ending = Ending::of_run("t", "r", &rec, None);
        assert_eq!(ending.end, FireEnd::Environment, "the machine's problem, not the run's");
        assert_eq!(ending.message, "checkpoint_failed happened");
    }

    #[test]
    fn afterwards_a_fire_only_gets_worse() {
        let completed = Ending::refused(FireEnd::Completed, "t completed".into(), None);

        let mut failed = completed.clone();
        failed.worsen(After::Failed {
            end: FireEnd::Environment,
            message: "disk full".into(),
            hint: Some("free space".into()),
        });
        assert_eq!(failed.end, FireEnd::Environment);
        assert_eq!(
            failed.message, "disk full; t completed",
            "the failure leads, the run's line follows"
        );
        assert_eq!(failed.hint.as_deref(), Some("free space"));

        let attention = After::Attention {
            message: "the remote was rewritten".into(),
            hint: "runtime check".into(),
        };
        let mut noted = completed.clone();
        noted.worsen(attention.clone());
        assert_eq!(noted.end, FireEnd::NeedsAttention);
        assert_eq!(noted.message, "the remote was rewritten");

        // A failed fire stays failed, with its own line: a note never softens it.
        let mut refused = Ending::refused(FireEnd::InvalidInput, "bad settings".into(), None);
        refused.worsen(attention);
        assert_eq!(
            refused,
            Ending::refused(FireEnd::InvalidInput, "bad settings".into(), None)
        );
    }
}
