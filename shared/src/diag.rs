//! Diagnostics: one problem found in an input file, carrying the file, line and field
//! it came from, what was expected, and a hint. Loading functions collect every
//! problem they can find (not just the first) so `builder check` can list them all.

use std::fmt;
use std::path::{Path, PathBuf};

/// One problem in one input file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Diagnostic {
    /// Repo-relative path of the file the problem is in.
    pub file: PathBuf,
    /// 1-based line; 0 when the problem is about the file as a whole.
    pub line: usize,
    /// Dotted field path (`budgets.max_steps`), empty when not about a field.
    pub field: String,
    /// What is wrong and what was expected.
    pub message: String,
    /// What to do about it, when there is something obvious.
    pub hint: Option<String>,
    /// What sort of problem this is, for code that must tell problems apart (never
    /// by their message text). Not part of the printed or JSON form.
    #[serde(skip)]
    pub kind: DiagKind,
}

/// What sort of problem a [`Diagnostic`] reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DiagKind {
    /// The file itself is wrong: syntax, types, unknown keys, meaning.
    #[default]
    Input,
    /// A prompt's front matter widens the settings it may only narrow (model, tools,
    /// budgets). Meaningful only against the repository's own settings, so `builder
    /// check` leaves these out when it had to check against stand-in settings.
    Widens,
}

impl Diagnostic {
    pub fn new(file: impl AsRef<Path>, line: usize, field: impl Into<String>, message: impl Into<String>) -> Self {
        Diagnostic {
            file: file.as_ref().to_path_buf(),
            line,
            field: field.into(),
            message: message.into(),
            hint: None,
            kind: DiagKind::Input,
        }
    }

    pub fn with_kind(mut self, kind: DiagKind) -> Self {
        self.kind = kind;
        self
    }

    pub fn with_hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: ", self.file.display(), self.line)?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        write!(f, "{}", self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "\n  hint: {hint}")?;
        }
        Ok(())
    }
}

/// A non-empty list of diagnostics, the error type of every loader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Diagnostics {}

impl From<Diagnostic> for Diagnostics {
    fn from(d: Diagnostic) -> Self {
        Diagnostics(vec![d])
    }
}
