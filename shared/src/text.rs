//! Record text made inert for the people who read it: one module, used by every
//! command that prints and every markdown output (and the web view).
//!
//! Terminals. Cards, receipts, reports, proposals, commit messages and eval cases hold
//! text a model or a proposer chose (summaries, details, final answers, file names,
//! commands), and a model that writes an escape sequence into one could move the
//! cursor, rewrite earlier lines, set the window title or worse on the engineer's
//! terminal when a command prints it. Every field a command prints passes through
//! [`printable`] (one line) or [`printable_multiline`]: control characters (C0, DEL,
//! C1) and the bidirectional overrides that reorder what is shown come out as visible
//! `\x1b`/`\u{202e}` escapes; newline and tab are kept only in fields that are
//! multi-line by nature.
//!
//! Markdown (a pull-request comment, an issue, an export). Model- and
//! proposer-derived text goes in code: [`markdown_fence`] for blocks (a fence longer
//! than any backtick run inside, so a closed fence in the text closes nothing),
//! [`markdown_code`] / [`markdown_cell`] for one-line fields; prose outside code goes
//! through [`markdown_text`], which escapes HTML, links, images, headings, emphasis and
//! table pipes and breaks `@mentions` and bare URLs.

use std::borrow::Cow;

fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

fn escape(s: &str, keep: impl Fn(char) -> bool, push: impl Fn(&mut String, char)) -> Cow<'_, str> {
    let bad = |c: char| (c.is_control() || is_bidi_control(c)) && !keep(c);
    if !s.chars().any(bad) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if bad(c) {
            push(&mut out, c);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

fn visible(out: &mut String, c: char) {
    let n = u32::from(c);
    if n < 0x100 {
        out.push_str(&format!("\\x{n:02x}"));
    } else {
        out.push_str(&format!("\\u{{{n:x}}}"));
    }
}

/// A one-line field (summary, kind, task, path): every control character escaped,
/// newline and tab included, so the field cannot fake another line of output.
pub fn printable(s: &str) -> Cow<'_, str> {
    escape(s, |_| false, visible)
}

/// A multi-line field (a card file, a receipt, a report, a diff): newline and tab
/// kept, every other control character escaped.
pub fn printable_multiline(s: &str) -> Cow<'_, str> {
    escape(s, |c| c == '\n' || c == '\t', visible)
}

/// JSON text for a terminal or a pipe: `serde_json` already escapes C0 characters in
/// strings; this escapes DEL, C1 and bidi overrides too as `\u00XX` (still valid JSON,
/// decoding to the same string). Outside strings JSON holds no such characters.
pub fn printable_json(s: &str) -> Cow<'_, str> {
    escape(
        s,
        |c| c == '\n' || c == '\t' || c == '\r',
        |out, c| out.push_str(&format!("\\u{:04x}", u32::from(c))),
    )
}

/// The longest run of backticks in `s`.
fn longest_backtick_run(s: &str) -> usize {
    let (mut best, mut run) = (0, 0);
    for c in s.chars() {
        if c == '`' {
            run += 1;
            best = best.max(run);
        } else {
            run = 0;
        }
    }
    best
}

/// `s` as markdown prose on one line, outside any code: every character markdown or
/// GitHub would act on is escaped (HTML and autolink brackets, link and image syntax,
/// emphasis, headings, lists, tables, entities), and `:`/`.` are escaped so no bare URL
/// becomes a link. GitHub links some text after markdown is rendered, so an escape
/// cannot stop it: a word joiner follows each `@` (no mention notifies anyone), each
/// `#` and the `-` of `GH-` (no `#123` or `GH-123` cross-references an issue, which
/// shows in that issue's timeline) and each `:` (no `:shortcode:` becomes an emoji).
pub fn markdown_text(s: &str) -> String {
    inert_on_github(s, true)
}

/// `s` on one line for a GitHub field that is not markdown but is still linked (an
/// issue's title): no escapes, the word joiners of [`markdown_text`].
pub fn github_plain(s: &str) -> String {
    inert_on_github(s, false)
}

/// [`markdown_text`], with markdown's escapes only when `escape`.
fn inert_on_github(s: &str, escape: bool) -> String {
    let one_line = printable(s);
    let mut out = String::with_capacity(one_line.len() + 8);
    for c in one_line.chars() {
        let escaped = matches!(
            c,
            '\\' | '`'
                | '*'
                | '_'
                | '{'
                | '}'
                | '['
                | ']'
                | '('
                | ')'
                | '+'
                | '.'
                | '!'
                | '|'
                | '<'
                | '>'
                | '~'
                | '&'
                | '='
                | '"'
                | '\''
                | '#'
                | ':'
                | '-'
        );
        // Before `c` goes in: whether it is the `-` of `GH-`.
        let tail = out.len().checked_sub(2).and_then(|at| out.get(at..));
        let after_gh = c == '-' && tail.is_some_and(|t| t.eq_ignore_ascii_case("gh"));
        if escape && escaped {
            out.push('\\');
        }
        out.push(c);
        if matches!(c, '#' | ':' | '@') || after_gh {
            out.push(WORD_JOINER);
        }
    }
    out
}

/// U+2060: invisible, not a space, and it ends the word GitHub's autolinkers match.
const WORD_JOINER: char = '\u{2060}';

/// `s` as an inline code span on one line: delimited by more backticks than any run
/// inside it, padded so a backtick at either end stays inside. Nothing in a code span
/// is HTML, a link, an image or a mention.
pub fn markdown_code(s: &str) -> String {
    let one_line = printable(s);
    let ticks = "`".repeat(longest_backtick_run(&one_line) + 1);
    // Markdown strips one space from each end of a span that has both: pad only where
    // a backtick (or a space that should stay) sits at an end.
    let pad = [one_line.chars().next(), one_line.chars().last()]
        .iter()
        .any(|c| matches!(c, Some('`' | ' ')));
    let pad = if pad { " " } else { "" };
    format!("{ticks}{pad}{one_line}{pad}{ticks}")
}

/// [`markdown_code`] for a table cell: a pipe would end the cell, so it is escaped
/// (GitHub reads `\|` as a pipe inside a code span in a table).
pub fn markdown_cell(s: &str) -> String {
    markdown_code(s).replace('|', "\\|")
}

/// `s` (any number of lines) as a fenced code block with info string `info`: the fence
/// is longer than any backtick run in `s`, so no line of it closes the block.
pub fn markdown_fence(s: &str, info: &str) -> String {
    let body = printable_multiline(s);
    let fence = "`".repeat((longest_backtick_run(&body) + 1).max(3));
    let newline = if body.ends_with('\n') || body.is_empty() {
        ""
    } else {
        "\n"
    };
    format!("{fence}{}\n{body}{newline}{fence}\n", printable(info))
}

/// How many characters of a commit, tree or approval id a message shows.
pub const SHORT_ID: usize = 12;

/// The first [`SHORT_ID`] characters of an id (all of a shorter one), as messages show
/// it.
pub fn short_id(id: &str) -> &str {
    id.get(..SHORT_ID).unwrap_or(id)
}

/// [`short_id`] of an object id.
pub fn short_oid(id: git2::Oid) -> String {
    short_id(&id.to_string()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_drives_a_terminal() {
        assert_eq!(printable("plain"), "plain");
        assert!(matches!(printable("plain"), Cow::Borrowed(_)));
        assert_eq!(printable("a\x1b[2Jb\nc\td"), "a\\x1b[2Jb\\x0ac\\x09d");
        assert_eq!(
            printable_multiline("a\x1b]0;t\x07\nb\tc\r"),
            "a\\x1b]0;t\\x07\nb\tc\\x0d"
        );
        assert_eq!(printable("x\u{9b}31m\u{7f}"), "x\\x9b31m\\x7f");
        assert_eq!(printable("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert_eq!(printable("héllo ✓"), "héllo ✓");
    }

    /// Hostile model text: an escape sequence, a closed fence, an image that calls out,
    /// a mention, a forged heading, a link, a bare URL and raw HTML.
    const HOSTILE: &str = "\x1b[2J```\n## Approved\n<img src=http://evil.example/x.png> @team [ok](http://evil.example) http://evil.example <b>";

    #[test]
    fn markdown_prose_references_no_issue_and_shows_no_emoji() {
        let t = markdown_text("fixes #12, gh-7 and o/r#3 :tada: bench-final");
        let wj = WORD_JOINER;
        assert_eq!(
            t,
            format!("fixes \\#{wj}12, gh\\-{wj}7 and o/r\\#{wj}3 \\:{wj}tada\\:{wj} bench\\-final")
        );
        // What GitHub's filters match, on the text a renderer makes of it (escapes
        // dropped): a `#` or `GH-` right before a digit, a `:` right before a letter.
        let rendered = t.replace('\\', "").to_ascii_lowercase();
        for (i, _) in rendered.match_indices(['#', ':']).chain(rendered.match_indices("gh-")) {
            let at = i + rendered[i..].find(['#', ':', '-']).unwrap_or(0) + 1;
            let next = rendered[at..].chars().next();
            assert!(!next.is_some_and(|c| c.is_ascii_alphanumeric()), "{rendered}");
        }
        // An issue title (not markdown) gets the joiners and no escapes.
        assert_eq!(
            github_plain("fixes #12 @team gh-7"),
            format!("fixes #{wj}12 @{wj}team gh-{wj}7")
        );
        // A multi-byte character before a `-` is not cut.
        assert_eq!(markdown_text("✓-x"), "✓\\-x");
    }

    #[test]
    fn markdown_prose_is_inert() {
        let t = markdown_text(HOSTILE);
        assert_eq!(
            t,
            "\\\\x1b\\[2J\\`\\`\\`\\\\x0a\\#\u{2060}\\#\u{2060} Approved\\\\x0a\\<img src\\=http\\:\u{2060}//evil\\.example/x\\.png\\> @\u{2060}team \\[ok\\]\\(http\\:\u{2060}//evil\\.example\\) http\\:\u{2060}//evil\\.example \\<b\\>"
        );
        assert!(!t.contains('\n') && !t.contains('\x1b'));
    }

    #[test]
    fn code_spans_and_fences_outlast_every_backtick_run() {
        assert_eq!(markdown_code("a`b"), "``a`b``");
        assert_eq!(markdown_code("`x"), "`` `x ``");
        assert_eq!(markdown_code("plain"), "`plain`");
        assert_eq!(markdown_cell("ls | wc"), "`ls \\| wc`");
        let f = markdown_fence(HOSTILE, "text");
        assert_eq!(
            f,
            "````text\n\\x1b[2J```\n## Approved\n<img src=http://evil.example/x.png> @team [ok](http://evil.example) http://evil.example <b>\n````\n"
        );
        // Only the closing line is a fence as long as the opening one.
        let closers = f.lines().filter(|l| l.starts_with("````")).count();
        assert_eq!(closers, 2);
        let longer = markdown_fence("`````", "");
        assert!(longer.starts_with("``````\n"), "{longer}");
    }

    #[test]
    fn json_stays_json() {
        let v = serde_json::json!({"s": "a\u{1b}[31m\u{9b}b\u{202e}"});
        let text = serde_json::to_string_pretty(&v).unwrap();
        let safe = printable_json(&text);
        assert!(
            !safe.chars().any(|c| c == '\u{1b}' || c == '\u{9b}' || c == '\u{202e}'),
            "{safe}"
        );
        let back: serde_json::Value = serde_json::from_str(&safe).unwrap();
        assert_eq!(back, v);
    }
}
