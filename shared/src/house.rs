//! Test-only: every function in this crate is under [`MAX_FN_LINES`] lines. A long
//! function hides its steps; naming each step as a function of its own is how this
//! code stays readable, so a new long one should fail a test, not wait for a review.
//!
//! The check reads every `.rs` file under `src/` with comments and string and char
//! literals blanked out (the same lexical pass as the import-graph test), finds each
//! `fn name`, and counts the lines from that line to the brace that closes its body.
//! Attributes and doc comments above the `fn` line do not count; a nested function
//! counts on its own and inside the one around it.

use std::path::Path;

use crate::import_graph::{rust_files, strip};

/// A function this long or longer fails the test.
const MAX_FN_LINES: usize = 80;

/// One function: its name, the line of its `fn` and its length in lines.
#[derive(Debug, PartialEq)]
struct FnSpan {
    name: String,
    line: usize,
    lines: usize,
}

#[test]
fn every_function_in_shared_is_under_80_lines() {
    let src_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src_dir, &mut files);
    assert!(
        files.len() > 50,
        "too few files found under {}: {files:?}",
        src_dir.display()
    );
    let mut offenders = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(&src_dir)
            .unwrap_or(&file)
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        for f in functions(&text) {
            if f.lines >= MAX_FN_LINES {
                offenders.push(format!("src/{rel}:{} fn {}: {} lines", f.line, f.name, f.lines));
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "functions of {MAX_FN_LINES} lines or more (split them into named steps):\n{}",
        offenders.join("\n")
    );
}

#[test]
fn a_long_function_is_caught_and_comments_strings_and_fn_types_are_not_counted() {
    let body: String = (0..85).map(|i| format!("    let _x{i} = {i};\n")).collect();
    let src = format!(
        r##"
/// fn in_doc() {{
fn short(f: fn(u8) -> u8) -> u8 {{
    // }} a closing brace in a comment
    let _ = "}} fn in_string() {{";
    let _ = r#"}}"#;
    let _ = '}}';
    f(1)
}}

pub(crate) async fn long<T: Into<u8>>(t: T) -> u8
where
    T: Copy,
{{
{body}    t.into()
}}

trait Shape {{
    fn area(&self) -> u8;
    fn one() -> u8 {{ 1 }}
}}
"##
    );
    let found = functions(&src);
    let span = |name: &str, line: usize, lines: usize| FnSpan {
        name: name.into(),
        line,
        lines,
    };
    assert_eq!(
        found,
        vec![span("short", 3, 7), span("long", 11, 91), span("one", 105, 1)],
        "{src}"
    );
}

/// Every function with a body in `src`, in the order they start.
fn functions(src: &str) -> Vec<FnSpan> {
    let code = strip(src);
    let tokens = tokens(&code);
    let mut out = Vec::new();
    for (i, &(tok, line)) in tokens.iter().enumerate() {
        let Some(&(name, _)) = tokens.get(i + 1) else { continue };
        if tok != "fn" || !name.starts_with(|c: char| c.is_alphabetic() || c == '_') {
            continue;
        }
        if let Some(end) = body_end(&tokens[i + 2..]) {
            out.push(FnSpan {
                name: name.to_string(),
                line,
                lines: end - line + 1,
            });
        }
    }
    out
}

/// After a function's name: the line of the brace that closes its body, or `None`
/// for a declaration without one (`fn f();`). The body opens at the first `{` outside
/// the parentheses and brackets of the signature.
fn body_end(after_name: &[(&str, usize)]) -> Option<usize> {
    let mut nesting = 0usize;
    let mut depth = 0usize;
    for &(tok, line) in after_name {
        match tok {
            "(" | "[" if depth == 0 => nesting += 1,
            ")" | "]" if depth == 0 => nesting = nesting.saturating_sub(1),
            ";" if depth == 0 && nesting == 0 => return None,
            "{" if depth > 0 || nesting == 0 => depth += 1,
            "}" if depth > 0 => {
                depth -= 1;
                if depth == 0 {
                    return Some(line);
                }
            }
            _ => {}
        }
    }
    None
}

/// Words and single punctuation characters of already stripped code, each with its
/// line.
fn tokens(code: &str) -> Vec<(&str, usize)> {
    let mut out = Vec::new();
    for (n, text) in code.lines().enumerate() {
        let mut rest = text;
        while let Some(start) = rest.find(|c: char| !c.is_whitespace()) {
            rest = &rest[start..];
            let len = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len())
                .max(rest.chars().next().map_or(1, char::len_utf8));
            out.push((&rest[..len], n + 1));
            rest = &rest[len..];
        }
    }
    out
}
