//! The one place a `runtime` command's exit code is decided (docs/exit-codes.md;
//! cron reads them). A command returns `Result<Outcome, CommandError>`: a fire's own
//! outcome (failed, skipped, waiting, needs attention) is an [`Outcome`], not an
//! error; a [`CommandError`] (shared with the builder, in the `cli` crate) is
//! classified by its cause into a [`Kind`], which [`exit_code`] maps to this binary's
//! code. `main` prints the error as `error: ...` then `hint: ...`.

pub use cli::error::{CommandError, Kind};
use shared::fire::{FireEnd, FireSummary};

/// Test-only (debug builds): set to anything non-empty to force an internal error
/// (see `cli::error::forced_internal_error`).
pub const FORCE_INTERNAL_ERROR_ENV: &str = "RUNTIME_TEST_FORCE_INTERNAL_ERROR";

/// The process exit codes of `runtime` (docs/exit-codes.md; cron reads them),
/// defined here only.
pub mod exit {
    pub const OK: u8 = 0;
    pub const FAILED: u8 = 1;
    pub const ENVIRONMENT: u8 = 1;
    pub const CONFIG: u8 = 2;
    pub const SKIPPED: u8 = 3;
    pub const WAITING: u8 = 4;
    pub const NEEDS_ATTENTION: u8 = 5;
    pub const INTERNAL: u8 = 70;
}

/// Every exit code with its meaning, for `runtime --help` and `runtime fire --help`.
const EXIT_CODES: &[(u8, &str)] = &[
    (exit::OK, "fire completed (accepted, or completed without acceptance checks); command ok"),
    (
        exit::FAILED,
        "fire failed, or an environment problem (permissions, disk, locks, no repository); cards written where possible",
    ),
    (exit::CONFIG, "usage or configuration error (bad settings, unknown task, unset key variable)"),
    (exit::SKIPPED, "skipped: another fire of the task holds the lock (prints nothing unless -v)"),
    (exit::WAITING, "waiting for approval (`builder approve-call`, then `runtime resume`)"),
    (exit::NEEDS_ATTENTION, "completed, but cards were written: needs attention"),
    (exit::INTERNAL, "internal error (a bug), and nothing else"),
];

/// The exit-code table as help text.
pub fn exit_codes_help() -> String {
    cli::error::exit_codes_help(EXIT_CODES)
}

/// How a command that ran to its end came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done: a fire completed, or a command did its work.
    Ok,
    /// The fire failed (its records say why), or `runtime check` found problems.
    Failed,
    /// Another fire of the task holds the lock.
    Skipped,
    /// The fire paused on a call that needs a builder's approval.
    Waiting,
    /// The fire completed but wrote cards.
    NeedsAttention,
}

/// The exit code of a failure of `kind`.
fn kind_code(kind: Kind) -> u8 {
    match kind {
        Kind::Usage | Kind::Config => exit::CONFIG,
        Kind::Environment | Kind::Refused => exit::ENVIRONMENT,
        Kind::Internal => exit::INTERNAL,
    }
}

/// The exit code of a finished command: decided here and nowhere else.
pub fn exit_code(result: &Result<Outcome, CommandError>) -> u8 {
    match result {
        Ok(Outcome::Ok) => exit::OK,
        Ok(Outcome::Failed) => exit::FAILED,
        Ok(Outcome::Skipped) => exit::SKIPPED,
        Ok(Outcome::Waiting) => exit::WAITING,
        Ok(Outcome::NeedsAttention) => exit::NEEDS_ATTENTION,
        Err(e) => kind_code(e.kind),
    }
}

/// How a fire's end comes out of the command: an [`Outcome`] the fire has printed, or
/// a [`CommandError`] carrying the fire's message and hint for `main` to print.
pub fn fire_outcome(s: &FireSummary) -> Result<Outcome, CommandError> {
    let error = |kind: Kind| {
        let e = CommandError::new(kind, anyhow::Error::msg(s.message.clone()));
        match &s.hint {
            Some(h) => e.hint(h.clone()),
            None => e,
        }
    };
    match s.end {
        FireEnd::Completed => Ok(Outcome::Ok),
        FireEnd::Failed => Ok(Outcome::Failed),
        FireEnd::Skipped => Ok(Outcome::Skipped),
        FireEnd::WaitingApproval => Ok(Outcome::Waiting),
        FireEnd::NeedsAttention => Ok(Outcome::NeedsAttention),
        FireEnd::InvalidInput => Err(error(Kind::Config)),
        FireEnd::Environment => Err(error(Kind::Environment)),
        FireEnd::Internal => Err(error(Kind::Internal)),
    }
}

/// The test-only hook: always `Ok` in release builds.
pub fn forced_internal_error() -> Result<(), CommandError> {
    cli::error::forced_internal_error(FORCE_INTERNAL_ERROR_ENV)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_get_the_design_codes() {
        for (kind, code) in [
            (Kind::Usage, 2),
            (Kind::Config, 2),
            (Kind::Environment, 1),
            (Kind::Refused, 1),
            (Kind::Internal, 70),
        ] {
            let e = CommandError::new(kind, anyhow::anyhow!("x"));
            assert_eq!(exit_code(&Err(e)), code, "{kind:?}");
        }
    }

    #[test]
    fn fire_ends_get_the_design_codes() {
        let summary = |end| FireSummary {
            run_id: "r".into(),
            task: "t".into(),
            status: shared::records::RunStatus::Failed,
            stop_reason: shared::records::StopReason::NotStarted,
            end,
            report: None,
            report_text: None,
            receipt: None,
            cards: vec![],
            commit: None,
            records_kept: false,
            message: "m".into(),
            hint: None,
        };
        for (end, code) in [
            (FireEnd::Completed, 0),
            (FireEnd::Failed, 1),
            (FireEnd::Environment, 1),
            (FireEnd::InvalidInput, 2),
            (FireEnd::Skipped, 3),
            (FireEnd::WaitingApproval, 4),
            (FireEnd::NeedsAttention, 5),
            (FireEnd::Internal, 70),
        ] {
            assert_eq!(exit_code(&fire_outcome(&summary(end))), code, "{end:?}");
        }
    }

    #[test]
    fn the_help_lists_every_code() {
        let help = exit_codes_help();
        for code in [0, 1, 2, 3, 4, 5, 70] {
            assert!(help.contains(&format!("  {code:>2}  ")), "{help}");
        }
    }
}
