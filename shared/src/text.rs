//! Record text made safe to print on a terminal. Cards, receipts and reports hold
//! text the model chose (summaries, details, final answers, file names), and a model
//! that writes an escape sequence into one could move the cursor, rewrite earlier
//! lines, set the window title or worse on the engineer's terminal when a builder
//! command prints it. Every builder command that prints record content passes it
//! through one of these: control characters (C0, DEL, C1) and the bidirectional
//! overrides that reorder what is shown come out as visible `\x1b`/`\u{202e}`
//! escapes; newline and tab are kept only in fields that are multi-line by nature.

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
