//! Why a `builder` command failed, and the one place its exit code is decided
//! (DESIGN.md section 7). In the spirit of jj's `CommandError { kind, hints }`: a
//! command returns `Result<Outcome, CommandError>`; the library's typed errors
//! convert into a [`CommandError`] by what caused them (walking the error's source
//! chain for `io::Error`, `git2::Error` and `rusqlite::Error`), so a permission
//! problem, a held lock or a full disk exits 1 with a hint instead of looking like a
//! crash, and only an unclassified error (a bug) exits 70. `main` prints the error
//! as `error: ...` then `hint: ...` and exits with [`exit_code`].
//!
//! Test-only hook: in debug builds (`cfg(debug_assertions)`), a non-empty
//! [`FORCE_INTERNAL_ERROR_ENV`] makes every command fail at once with an internal
//! error, so the end-to-end exit-code table can check code 70 without a real bug.
//! Release builds ignore the variable.

use shared::cause::CauseKind;
use shared::diag::Diagnostics;
use shared::git::GitError;
use shared::review::ReviewError;
use shared::store::StoreError;
use std::fmt::Write as _;

/// Test-only (debug builds): set to anything non-empty to force an internal error.
// Read only by the debug-build hook below.
#[cfg_attr(not(debug_assertions), allow(dead_code))]
pub const FORCE_INTERNAL_ERROR_ENV: &str = "BUILDER_TEST_FORCE_INTERNAL_ERROR";

/// The process exit codes of `builder` (DESIGN.md section 7), defined here only.
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
    let mut out = String::from("Exit codes:\n");
    for (code, what) in EXIT_CODES {
        let _ = writeln!(out, "  {code:>2}  {what}");
    }
    out
}

/// How a command that ran to its end came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Done, nothing to report.
    Ok,
    /// The command worked and found problems (check, audit, compare, a refused approval).
    Problems,
}

/// What kind of failure, which decides the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Bad arguments: fix the command line (exit 2).
    Usage,
    /// Bad settings or git config: fix the file named (exit 2).
    Config,
    /// Permissions, locks, disk, a missing repository: fix the machine (exit 1).
    Environment,
    /// The review workflow's rules say no (self-approval, no valid approval): exit 1.
    Refused,
    /// A bug (exit 70).
    Internal,
}

impl Kind {
    fn exit_code(self) -> u8 {
        match self {
            Kind::Usage | Kind::Config => exit::USAGE,
            Kind::Environment => exit::ENVIRONMENT,
            Kind::Refused => exit::PROBLEMS,
            Kind::Internal => exit::INTERNAL,
        }
    }
}

/// A failed command: what kind, the error with its causes, and what to do next.
#[derive(Debug)]
pub struct CommandError {
    pub kind: Kind,
    pub error: anyhow::Error,
    pub hints: Vec<String>,
}

impl CommandError {
    pub fn new(kind: Kind, error: impl Into<anyhow::Error>) -> Self {
        CommandError {
            kind,
            error: error.into(),
            hints: Vec::new(),
        }
    }

    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(Kind::Usage, anyhow::Error::msg(message.into()))
    }

    pub fn environment(message: impl Into<String>) -> Self {
        Self::new(Kind::Environment, anyhow::Error::msg(message.into()))
    }

    // Used by the debug-build hook (and by the builder for its own bugs).
    #[cfg_attr(not(debug_assertions), allow(dead_code))]
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Kind::Internal, anyhow::Error::msg(message.into()))
    }

    /// Adds a hint (printed after the error, in order).
    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hints.push(hint.into());
        self
    }

    /// Classifies any error by its source chain: the first cause we recognise
    /// decides; nothing recognised is a bug.
    pub fn classify(error: anyhow::Error) -> Self {
        let cause = shared::cause::classify(error.chain());
        let kind = match cause.as_ref().map(|c| c.kind) {
            Some(CauseKind::Usage) => Kind::Usage,
            Some(CauseKind::Config) => Kind::Config,
            Some(CauseKind::Environment) => Kind::Environment,
            Some(CauseKind::Refused) => Kind::Refused,
            Some(CauseKind::Internal) | None => Kind::Internal,
        };
        let mut e = CommandError::new(kind, error);
        e.hints.extend(cause.and_then(|c| c.hint));
        e
    }

    /// The error and its causes on one line, each cause once (typed errors often
    /// repeat their source in their own message).
    pub fn message(&self) -> String {
        let mut out = String::new();
        for cause in self.error.chain() {
            let text = cause.to_string();
            if out.contains(&text) {
                continue;
            }
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        out
    }

    /// Prints `error: ...` and one `hint: ...` per hint on stderr (an internal
    /// error always ends with the request for a bug report).
    pub fn print(&self) {
        eprintln!("error: {}", self.message());
        for h in &self.hints {
            eprintln!("hint: {h}");
        }
        if self.kind == Kind::Internal {
            eprintln!("hint: this is a bug in builder: please report it with the command line and its -vv output");
        }
    }
}

/// The exit code of a finished command: decided here and nowhere else.
pub fn exit_code(result: &Result<Outcome, CommandError>) -> u8 {
    match result {
        Ok(Outcome::Ok) => exit::OK,
        Ok(Outcome::Problems) => exit::PROBLEMS,
        Err(e) => e.kind.exit_code(),
    }
}

/// The test-only hook (see the module doc); always `Ok` in release builds.
pub fn forced_internal_error() -> Result<(), CommandError> {
    #[cfg(debug_assertions)]
    if std::env::var_os(FORCE_INTERNAL_ERROR_ENV).is_some_and(|v| !v.is_empty()) {
        return Err(CommandError::internal(format!(
            "forced by {FORCE_INTERNAL_ERROR_ENV} (a test-only hook of debug builds)"
        )));
    }
    Ok(())
}

macro_rules! classified_from {
    ($($t:ty),* $(,)?) => {
        $(impl From<$t> for CommandError {
            fn from(e: $t) -> Self {
                CommandError::classify(anyhow::Error::from(e))
            }
        })*
    };
}

classified_from!(
    anyhow::Error,
    std::io::Error,
    git2::Error,
    GitError,
    StoreError,
    shared::history::HistoryError,
    shared::scaffold::InitError,
    ReviewError,
    shared::manifest::ManifestError,
    serde_json::Error,
    notify::Error,
    ctrlc::Error,
);

impl From<Diagnostics> for CommandError {
    fn from(d: Diagnostics) -> Self {
        CommandError::classify(anyhow::Error::from(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    fn kind_of(e: impl Into<CommandError>) -> Kind {
        e.into().kind
    }

    #[test]
    fn io_errors_of_the_machine_are_environment_problems() {
        for k in [
            ErrorKind::PermissionDenied,
            ErrorKind::ReadOnlyFilesystem,
            ErrorKind::StorageFull,
            ErrorKind::NotFound,
        ] {
            assert_eq!(kind_of(Error::from(k)), Kind::Environment, "{k:?}");
        }
        assert_eq!(kind_of(Error::from(ErrorKind::InvalidData)), Kind::Internal);
    }

    #[test]
    fn a_cause_deep_in_the_chain_decides() {
        let e = anyhow::Error::from(Error::from(ErrorKind::StorageFull))
            .context("writing the retro")
            .context("builder retro");
        let ce = CommandError::from(e);
        assert_eq!(ce.kind, Kind::Environment);
        assert!(ce.hints[0].contains("disk is full"), "{:?}", ce.hints);
        assert_eq!(exit_code(&Err(ce)), 1);
    }

    #[test]
    fn a_git_lock_is_an_environment_problem() {
        let e = git2::Error::new(git2::ErrorCode::Locked, git2::ErrorClass::Os, "index.lock exists");
        assert_eq!(kind_of(GitError::Git(e)), Kind::Environment);
    }

    #[test]
    fn a_read_only_or_full_database_is_an_environment_problem() {
        for code in [rusqlite::ffi::SQLITE_READONLY, rusqlite::ffi::SQLITE_FULL] {
            let e = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None);
            let se = StoreError::Sqlite {
                path: ".runtime/builder.db".into(),
                source: e,
            };
            assert_eq!(kind_of(se), Kind::Environment);
        }
    }

    #[test]
    fn outside_a_repository_and_without_an_identity() {
        let not_repo = GitError::NotARepo {
            path: "/tmp/x".into(),
            message: "not found".into(),
        };
        assert_eq!(exit_code(&Err(not_repo.into())), 1);
        let nobody = GitError::NoIdentity {
            repo: "/tmp/x".into(),
            message: "unset".into(),
        };
        assert_eq!(exit_code(&Err(nobody.into())), 2);
    }

    #[test]
    fn an_unrecognised_error_is_a_bug() {
        let e = CommandError::from(anyhow::anyhow!("something impossible"));
        assert_eq!(e.kind, Kind::Internal);
        assert_eq!(exit_code(&Err(e)), 70);
    }

    #[test]
    fn each_cause_is_printed_once() {
        let io = Error::new(ErrorKind::PermissionDenied, "Permission denied (os error 13)");
        let e = CommandError::from(GitError::Io {
            path: "/r/.git/index".into(),
            source: io,
        });
        assert_eq!(e.message(), "/r/.git/index: Permission denied (os error 13)");
    }

    #[test]
    fn a_refused_review_step_exits_1_and_a_missing_proposal_2() {
        assert_eq!(exit_code(&Err(ReviewError::Refused("self-approval".into()).into())), 1);
        assert_eq!(exit_code(&Err(ReviewError::Usage("no proposal `x`".into()).into())), 2);
    }

    #[test]
    fn the_help_lists_every_code() {
        let help = exit_codes_help();
        for code in [0, 1, 2, 70] {
            assert!(help.contains(&format!("  {code:>2}  ")), "{help}");
        }
    }
}
