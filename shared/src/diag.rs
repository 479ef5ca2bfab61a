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
}

impl Diagnostic {
    pub fn new(file: impl AsRef<Path>, line: usize, field: impl Into<String>, message: impl Into<String>) -> Self {
        Diagnostic {
            file: file.as_ref().to_path_buf(),
            line,
            field: field.into(),
            message: message.into(),
            hint: None,
        }
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
