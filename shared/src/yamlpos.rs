//! Line lookup for YAML sources. serde_yaml reports a location for syntax and type
//! errors, but semantic checks (a rule that does not parse, a tool that does not exist)
//! run on deserialised values that no longer know their line. This finds the line of
//! a dotted field path, and of a sequence item under it, by walking block-style YAML
//! by indentation — the style every file in an agent repo is written in.

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

#[cfg(test)]
mod tests {
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
}
