//! Line lookup for YAML sources. serde_yaml reports a location for syntax and type
//! errors, but semantic checks (a rule that does not parse, a tool that does not exist)
//! run on deserialised values that no longer know their line. This finds the line of
//! a dotted field path, and of a sequence item under it, by walking block-style YAML
//! by indentation — the style every file in an agent repo is written in.

/// The most flow collections (`[...]`, `{...}`) one YAML file of an agent repository
/// may open. libyaml's scanner takes time quadratic in how deep they nest: a megabyte
/// of `[` held a parse for many minutes (a proposal's case file stalling
/// `builder review`). No file written by hand comes near the bound, and counting every
/// opening bracket, quoted or not, is a bound quotes cannot fool.
pub const MAX_FLOW_OPENINGS: usize = 10_000;

/// Why `src` is not parsed at all: more flow collections than [`MAX_FLOW_OPENINGS`].
pub fn too_many_flow_openings(src: &[u8]) -> Option<String> {
    let n = src.iter().filter(|b| matches!(b, b'[' | b'{')).count();
    (n > MAX_FLOW_OPENINGS).then(|| {
        format!("{n} opening `[` and `{{` (more than {MAX_FLOW_OPENINGS}): not parsed, as nesting that deep stalls the YAML parser; write it in block style")
    })
}

/// `src` as a YAML value, or `None` when it does not parse or is refused unparsed
/// ([`too_many_flow_openings`]): for the readers that take what does not parse as
/// saying nothing.
pub fn lenient_value(src: &[u8]) -> Option<serde_yaml::Value> {
    if too_many_flow_openings(src).is_some() {
        return None;
    }
    serde_yaml::from_slice(src).ok()
}

/// 1-based line of `path` (e.g. `["budgets", "max_steps"]`) in `src`, or of the
/// deepest ancestor found. Returns 1 when nothing matches, so errors always point
/// somewhere in the file.
pub fn line_of(src: &str, path: &[&str]) -> usize {
    let mut best = 1;
    let mut min_indent: isize = -1;
    let mut depth = 0;
    for (idx, raw) in src.lines().enumerate() {
        if depth == path.len() {
            break;
        }
        let trimmed = raw.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let indent = (raw.len() - trimmed.len()) as isize;
        if depth > 0 && indent <= min_indent {
            // Left the parent mapping without finding the child.
            break;
        }
        let key = trimmed.trim_start_matches("- ");
        let want = path[depth];
        let matches = key
            .strip_prefix(want)
            .is_some_and(|rest| rest.trim_start().starts_with(':'))
            || key
                .strip_prefix(&format!("\"{want}\""))
                .is_some_and(|rest| rest.trim_start().starts_with(':'));
        if matches && (depth == 0 || indent > min_indent) {
            best = idx + 1;
            min_indent = indent;
            depth += 1;
        }
    }
    best
}

/// 1-based line of the first line at or after the field `path` that contains
/// `needle` (used to point at one item of a list such as a permission rule).
pub fn line_of_item(src: &str, path: &[&str], needle: &str) -> usize {
    let start = line_of(src, path);
    src.lines()
        .enumerate()
        .skip(start.saturating_sub(1))
        .find(|(_, l)| l.contains(needle))
        .map(|(i, _)| i + 1)
        .unwrap_or(start)
}

/// Where a serde_yaml error is (the 1-based line, 0 when it names none) and what it
/// says. For a duplicate key serde_yaml names where the mapping begins; the line
/// that needs fixing is the duplicate's, the key's second appearance in it.
pub fn syntax_error(src: &str, e: &serde_yaml::Error) -> (usize, String) {
    let Some(at) = e.location() else {
        return (0, e.to_string());
    };
    let duplicate = duplicate_key(&e.to_string())
        .and_then(|key| Some((second_appearance(src, &key, at.line(), at.column())?, key)));
    match duplicate {
        Some((line, key)) => (
            line,
            format!(
                "duplicate key `{key}` (the mapping that begins at line {} has it twice)",
                at.line()
            ),
        ),
        None => (at.line(), e.to_string()),
    }
}

/// The key a "duplicate entry with key ..." message names.
fn duplicate_key(message: &str) -> Option<String> {
    let rest = message.split_once("duplicate entry with key ")?.1;
    let quoted = rest.strip_prefix('"')?;
    Some(quoted.split_once('"')?.0.to_string())
}

/// The line of `key`'s second appearance as a key of the block mapping that begins
/// at `line`, `column` (both 1-based).
fn second_appearance(src: &str, key: &str, line: usize, column: usize) -> Option<usize> {
    let indent = column.saturating_sub(1);
    let mut seen = 0;
    for (n, text) in src.lines().enumerate().skip(line.saturating_sub(1)) {
        let body = text.trim_start_matches(' ');
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        let depth = text.len() - body.len();
        if depth < indent {
            return None; // the mapping ended
        }
        let names_key = body
            .strip_prefix(key)
            .or_else(|| body.strip_prefix(&format!("\"{key}\"")))
            .or_else(|| body.strip_prefix(&format!("'{key}'")))
            .is_some_and(|after| after.trim_start().starts_with(':'));
        if depth == indent && names_key {
            seen += 1;
            if seen == 2 {
                return Some(n + 1);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_flow_bomb_is_refused_unparsed() {
        // Deep enough to hold libyaml for minutes if it were parsed (the test would
        // then time out rather than pass).
        let bomb = format!("name: x\nmodel: {}{}\n", "[".repeat(300_000), "]".repeat(300_000));
        let why = too_many_flow_openings(bomb.as_bytes()).expect("refused");
        assert!(why.contains("300000 opening"), "{why}");
        assert!(lenient_value(bomb.as_bytes()).is_none());
        // A file well inside the bound parses as before.
        let flat = format!("xs: [{}]\n", vec!["{a: 1}"; 2_000].join(", "));
        assert!(too_many_flow_openings(flat.as_bytes()).is_none());
        assert!(lenient_value(flat.as_bytes()).is_some());
    }
    use super::*;

    const SRC: &str = "version: 1\nprovider:\n  kind: openai\n  model: x\nbudgets:\n  # steps\n  max_steps: 20\npermissions:\n  allow:\n    - \"Read(**)\"\n    - \"Bash(ls*)\"\n";

    #[test]
    fn finds_nested_fields() {
        assert_eq!(line_of(SRC, &["version"]), 1);
        assert_eq!(line_of(SRC, &["provider", "model"]), 4);
        assert_eq!(line_of(SRC, &["budgets", "max_steps"]), 7);
        assert_eq!(line_of(SRC, &["budgets", "nope"]), 5);
        assert_eq!(line_of_item(SRC, &["permissions", "allow"], "Bash(ls*)"), 11);
    }

    #[test]
    fn a_duplicate_key_points_at_the_duplicate() {
        let cases = [
            (
                "version: 1\nbudgets:\n  max_steps: 3\ntools: []\nbudgets:\n  max_steps: 4\n",
                5,
            ),
            (
                "provider:\n  kind: openai\n  # a note\n  model: a\n\n  model: b\nfallback:\n  model: c\n",
                6,
            ),
            ("a:\n  model: x\nb:\n  model: y\n  \"model\": z\n", 5),
        ];
        for (src, want) in cases {
            let e = serde_yaml::from_str::<serde_yaml::Value>(src).unwrap_err();
            assert!(e.to_string().contains("duplicate entry"), "{e}");
            let (line, text) = syntax_error(src, &e);
            assert_eq!(line, want, "{src}\n{e}");
            assert!(text.starts_with("duplicate key `"), "{text}");
        }
        // Another syntax error keeps serde_yaml's own line.
        let src = "a: 1\nb: [\n";
        let e = serde_yaml::from_str::<serde_yaml::Value>(src).unwrap_err();
        assert_eq!(syntax_error(src, &e), (e.location().unwrap().line(), e.to_string()));
    }
}
