//! Why a command failed. In the spirit of jj's `CommandError { kind, hints }`: a
//! command returns `Result<Outcome, CommandError>`; the library's typed errors convert
//! into a [`CommandError`] by what caused them (`shared::cause` walks the error's
//! source chain for `io::Error`, `git2::Error` and `rusqlite::Error`), so a permission
//! problem, a held lock or a full disk gets its exit code and a hint instead of
//! looking like a crash, and only an unclassified error (a bug) is [`Kind::Internal`].
//! Each binary maps a [`Kind`] to its own exit code (docs/exit-codes.md).
//!
//! Test-only hook: in debug builds (`cfg(debug_assertions)`), a non-empty variable
//! named by the binary makes every command fail at once with an internal error
//! ([`forced_internal_error`]), so the end-to-end exit-code tables can check code 70
//! without a real bug. Release builds ignore it.

use shared::cause::CauseKind;
use shared::diag::Diagnostics;
use shared::git::GitError;
use shared::review::ReviewError;
use shared::state::StateError;
use shared::store::StoreError;
use std::fmt::Write as _;

/// What kind of failure, which decides the exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Bad arguments: fix the command line.
    Usage,
    /// Bad settings or git config: fix the file named.
    Config,
    /// Permissions, locks, disk, a missing repository: fix the machine.
    Environment,
    /// A rule of the review workflow says no (self-approval, no valid approval).
    Refused,
    /// A bug.
    Internal,
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
    /// repeat their source in their own message), redacted as log lines are
    /// ([`shared::secrets::redact_log_line`]): a cause may quote what a server said,
    /// and a server may quote the key or token it was sent.
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
        shared::secrets::redact_log_line(&out).into_owned()
    }

    /// The hints, in order, redacted as [`CommandError::message`] is.
    pub fn hints(&self) -> impl Iterator<Item = String> + '_ {
        self.hints
            .iter()
            .map(|h| shared::secrets::redact_log_line(h).into_owned())
    }

    /// Prints [`CommandError::lines`] on stderr.
    pub fn print(&self, program: &str) {
        for line in self.lines(program) {
            eprintln!("{line}");
        }
    }

    /// `error: ...` and one `hint: ...` per hint (an internal error always ends with
    /// the request for a bug report about `program`).
    pub fn lines(&self, program: &str) -> Vec<String> {
        // A message may quote a file's text or a script's output: control characters
        // escaped, so nothing in it acts on the terminal.
        let mut lines = vec![format!("error: {}", shared::text::printable_multiline(&self.message()))];
        lines.extend(self.hints().map(|h| format!("hint: {}", shared::text::printable(&h))));
        if self.kind == Kind::Internal {
            lines.push(format!(
                "hint: this is a bug in {program}: please report it with the command line and its -vv output"
            ));
        }
        lines
    }
}

/// An exit-code table (code, meaning) as help text.
pub fn exit_codes_help(codes: &[(u8, &str)]) -> String {
    let mut out = String::from("Exit codes:\n");
    for (code, what) in codes {
        let _ = writeln!(out, "  {code:>2}  {what}");
    }
    out
}

/// The test-only hook (see the module doc): an internal error when `variable` is
/// set and not empty, in debug builds; always `Ok` in release builds.
pub fn forced_internal_error(variable: &str) -> Result<(), CommandError> {
    #[cfg(debug_assertions)]
    if std::env::var_os(variable).is_some_and(|v| !v.is_empty()) {
        return Err(CommandError::internal(format!(
            "forced by {variable} (a test-only hook of debug builds)"
        )));
    }
    #[cfg(not(debug_assertions))]
    let _ = variable;
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
    StateError,
    StoreError,
    shared::history::HistoryError,
    shared::scaffold::InitError,
    ReviewError,
    shared::manifest::ManifestError,
    serde_json::Error,
    Diagnostics,
);

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    fn kind_of(e: impl Into<CommandError>) -> Kind {
        e.into().kind
    }

    // What each cause is (io, git2, SQLite errors) is tested with `shared::cause`;
    // these test the command layer over it.

    #[test]
    fn the_printed_lines_are_redacted_of_what_a_fire_named_secret() {
        let said = "the server said: your token wallaby-phrase-5521 is refused";
        let e = CommandError::new(Kind::Environment, anyhow::Error::msg(said)).hint("wallaby-phrase-5521 again?");
        assert_eq!(e.lines("builder")[0], format!("error: {said}"), "not known yet");
        shared::secrets::redact_in_logs(&shared::secrets::Redactor::default().with_value("wallaby-phrase-5521"));
        assert_eq!(
            e.lines("builder"),
            [
                "error: the server said: your token [REDACTED] is refused",
                "hint: [REDACTED] again?"
            ]
        );
    }

    #[test]
    fn a_cause_deep_in_the_chain_decides() {
        let e = anyhow::Error::from(Error::from(ErrorKind::StorageFull))
            .context("writing the retro")
            .context("builder retro");
        let ce = CommandError::from(e);
        assert_eq!(ce.kind, Kind::Environment);
        assert!(ce.hints[0].contains("disk is full"), "{:?}", ce.hints);
    }

    #[test]
    fn outside_a_repository_and_without_an_identity() {
        let not_repo = GitError::NotARepo {
            path: "/tmp/x".into(),
            message: "not found".into(),
        };
        assert_eq!(kind_of(not_repo), Kind::Environment);
        let nobody = GitError::NoIdentity {
            repo: "/tmp/x".into(),
            message: "unset".into(),
        };
        assert_eq!(kind_of(nobody), Kind::Config);
    }

    #[test]
    fn a_refused_review_step_and_a_missing_proposal() {
        assert_eq!(kind_of(ReviewError::Refused("self-approval".into())), Kind::Refused);
        assert_eq!(kind_of(ReviewError::Usage("no proposal `x`".into())), Kind::Usage);
    }

    #[test]
    fn an_unrecognised_error_is_a_bug() {
        let e = CommandError::from(anyhow::anyhow!("something impossible"));
        assert_eq!(e.kind, Kind::Internal);
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
    fn the_help_lists_every_code_given() {
        let help = exit_codes_help(&[(0, "ok"), (70, "a bug")]);
        assert_eq!(help, "Exit codes:\n   0  ok\n  70  a bug\n");
    }
}
