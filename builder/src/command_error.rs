//! The one place a `builder` command's exit code is decided (docs/exit-codes.md). A
//! command returns `Result<Outcome, CommandError>`; a [`CommandError`] (shared with
//! the runtime, in the `cli` crate) is classified by its cause into a [`Kind`], which
//! [`exit_code`] maps to this binary's code. `main` prints the error as `error: ...`
//! then `hint: ...`.

pub use cli::error::{CommandError, Kind};

/// Test-only (debug builds): set to anything non-empty to force an internal error
/// (see `cli::error::forced_internal_error`).
pub const FORCE_INTERNAL_ERROR_ENV: &str = "BUILDER_TEST_FORCE_INTERNAL_ERROR";

/// The process exit codes of `builder` (docs/exit-codes.md), defined here only.
pub mod exit {
    pub const OK: u8 = 0;
    pub const PROBLEMS: u8 = 1;
    pub const ENVIRONMENT: u8 = 1;
    pub const USAGE: u8 = 2;
    pub const INTERNAL: u8 = 70;
}

/// Every exit code with its meaning, for `builder --help`.
const EXIT_CODES: &[(u8, &str)] = &[
    (exit::OK, "ok"),
    (
        exit::PROBLEMS,
        "a check, audit or compare found problems; a review step was refused (self-approval, no valid approval, nothing to propose); or an environment problem (permissions, disk, locks, no repository)",
    ),
    (
        exit::USAGE,
        "usage or configuration error (bad arguments, bad settings, no git identity)",
    ),
    (exit::INTERNAL, "internal error (a bug), and nothing else"),
];

/// The exit-code table as help text.
pub fn exit_codes_help() -> String {
    cli::error::exit_codes_help(EXIT_CODES)
}

/// How a command that ran to its end came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done, nothing to report.
    Ok,
    /// The command worked and found problems (check, audit, compare, a refused approval).
    Problems,
}

/// The exit code of a finished command: decided here and nowhere else.
pub fn exit_code(result: &Result<Outcome, CommandError>) -> u8 {
    match result {
        Ok(Outcome::Ok) => exit::OK,
        Ok(Outcome::Problems) => exit::PROBLEMS,
        Err(e) => match e.kind {
            Kind::Usage | Kind::Config => exit::USAGE,
            Kind::Environment => exit::ENVIRONMENT,
            Kind::Refused => exit::PROBLEMS,
            Kind::Internal => exit::INTERNAL,
        },
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
        assert_eq!(exit_code(&Ok(Outcome::Problems)), 1);
    }

    #[test]
    fn the_help_lists_every_code() {
        let help = exit_codes_help();
        for code in [0, 1, 2, 70] {
            assert!(help.contains(&format!("  {code:>2}  ")), "{help}");
        }
    }
}
