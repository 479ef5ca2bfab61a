//! The data behind `builder serve`'s pages, apart from any HTTP: which runs a filter
//! selects and how they page, one run's timeline read from the history index and,
//! where this machine fired it, from the runtime's trace, the versions of a task to
//! compare, and text cut to a size a page can hold. Every query reads the SQLite
//! history index (`.runtime/builder.db`) with the indexes its schema keeps for this,
//! so a page costs the same on a repository of 100,000 receipts as on ten. The
//! values serialise as the pages' JSON twins; where the command line prints the same
//! thing, they are its types ([`crate::runs::RunSummary`], [`crate::history::CardGroup`],
//! [`crate::history::RunDiff`], [`crate::history::Comparison`]).

pub mod compare;
pub mod run;
pub mod runs;

use serde::Serialize;

/// Text cut to at most a page's share of it: the first `limit` characters and how
/// long the whole is, so a page can link to the full text.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Excerpt {
    pub text: String,
    /// The whole text's length in characters.
    pub chars: usize,
    /// Characters were left out.
    pub cut: bool,
}

impl Excerpt {
    /// The first `limit` characters of `text`.
    pub fn of(text: &str, limit: usize) -> Excerpt {
        let chars = text.chars().count();
        if chars <= limit {
            return Excerpt {
                text: text.to_string(),
                chars,
                cut: false,
            };
        }
        Excerpt {
            text: text.chars().take(limit).collect(),
            chars,
            cut: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_excerpt_counts_characters_not_bytes() {
        let e = Excerpt::of("héllo wörld", 5);
        assert_eq!((e.text.as_str(), e.chars, e.cut), ("héllo", 11, true));
        let whole = Excerpt::of("short", 5);
        assert!(!whole.cut);
        assert_eq!(whole.text, "short");
    }
}
