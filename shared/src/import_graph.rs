//! Test-only: the top-level modules of this crate import each other without a cycle,
//! and a few named low-level modules do not reach back up. A cycle makes two modules
//! one unit (neither can be read, tested or moved alone), so each new one should fail
//! a test, not wait for a review to notice.
//!
//! The check reads every `.rs` file under `src/`, drops comments and string and char
//! literals, and collects each path that names another top-level module: `crate::x`
//! (also inside `use crate::{x, y::z}` groups) and `super::` chains that climb to the
//! crate root. `agent/context.rs` counts as module `agent`, and so on. It is a lexical
//! scan, not name resolution: a macro that builds a path from pieces would escape it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Where an edge was seen: file and line.
type Sites = Vec<(PathBuf, usize)>;
/// `from -> to -> where`, over top-level module names.
type Graph = BTreeMap<String, BTreeMap<String, Sites>>;

/// Imports that would point back up without closing a cycle (yet), with why each
/// direction is the right one.
const FORBIDDEN: &[(&str, &str, &str)] = &[
    (
        "tools",
        "policy",
        "the policy engine decides tool calls (it turns `ToolArgs` into its `Call`); tools never ask it, and the shell lexer both use is the leaf `shell`",
    ),
    (
        "records",
        "trace",
        "records are the leaf types every writer shares; the trace stores them",
    ),
    (
        "state",
        "fire",
        "the runtime's local state sits below the fire that uses it",
    ),
    (
        "git",
        "tools",
        "git helpers sit below tool execution; shared env lists live in `env`",
    ),
    (
        "trace",
        "history",
        "the runtime's trace sits below the builder's history index; run rows live in `runs`",
    ),
    (
        "trace",
        "agent",
        "the agent loop writes the trace, not the other way round",
    ),
    ("settings", "policy", "settings are plain data the policy engine reads"),
    (
        "tools",
        "worker",
        "the worker process serves tools; tools know nothing of it",
    ),
];

#[test]
fn top_level_modules_import_each_other_without_a_cycle() {
    let graph = crate_graph();
    let cycles = cycles(&graph);
    assert!(
        cycles.is_empty(),
        "import cycles between top-level modules of shared/src:\n{}",
        cycles.join("\n")
    );
}

#[test]
fn low_level_modules_do_not_import_higher_ones() {
    let graph = crate_graph();
    let found: Vec<String> = FORBIDDEN
        .iter()
        .filter_map(|(from, to, why)| {
            let sites = graph.get(*from)?.get(*to)?;
            Some(format!("{from} -> {to} ({why}) at {}", show_sites(sites)))
        })
        .collect();
    assert!(found.is_empty(), "imports pointing back up:\n{}", found.join("\n"));
}

/// The scan must see the imports that exist, or the two tests above pass on nothing.
#[test]
fn scan_sees_known_imports_of_this_crate() {
    let graph = crate_graph();
    for (from, to) in [
        ("fire", "agent"),
        ("agent", "tools"),
        ("history", "store"),
        ("check", "settings"),
    ] {
        assert!(
            graph.get(from).is_some_and(|t| t.contains_key(to)),
            "{from} -> {to} not found; the scan is broken: {graph:?}"
        );
    }
}

#[test]
fn scan_reads_paths_groups_and_super_but_not_comments_or_strings() {
    let src = r##"
        use crate::{alpha, beta::{x, y}, self as me};
        use super::gamma::Thing;
        // use crate::in_comment;
        /* crate::in_block /* nested */ crate::still_comment */
        fn f() -> &'static str {
            let _ = crate::delta::call();
            let _ = 'c';
            let _ = '\'';
            let _ = r#"crate::raw"# ;
            "crate::in_string"
        }
        mod tests {
            use super::super::epsilon;
            use super::*;
        }
    "##;
    let mut refs = BTreeSet::new();
    // As if the file were `src/zeta.rs`: `super::` from it reaches the crate root.
    scan(src, &["zeta".to_string()], &mut |m, _| {
        refs.insert(m.to_string());
    });
    let want: BTreeSet<String> = ["alpha", "beta", "gamma", "delta"].map(String::from).into();
    // `super::super::epsilon` from `zeta::tests` climbs to the root too.
    let want: BTreeSet<String> = want.into_iter().chain(["epsilon".to_string()]).collect();
    assert_eq!(refs, want);
}

#[test]
fn a_cycle_is_reported_with_where_it_is() {
    let mut g = Graph::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        g.entry(a.into())
            .or_default()
            .insert(b.into(), vec![(PathBuf::from(format!("{a}.rs")), 3)]);
    }
    let found = cycles(&g);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].starts_with("a, b, c:"), "{found:?}");
    assert!(found[0].contains("c -> a at c.rs:3"), "{found:?}");
}

/// The import graph of the top-level modules declared in `src/lib.rs`.
fn crate_graph() -> Graph {
    let src_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src_dir.join("lib.rs")).unwrap_or_default();
    let modules: BTreeSet<String> = strip(&lib)
        .lines()
        .filter_map(|l| {
            let l = l.trim().trim_start_matches("pub ").trim_start_matches("mod ");
            l.strip_suffix(';').filter(|m| is_ident(m)).map(str::to_string)
        })
        .collect();
    assert!(modules.len() > 10, "no modules found in lib.rs: {modules:?}");
    let mut files = Vec::new();
    rust_files(&src_dir, &mut files);
    let mut graph = Graph::new();
    for file in files {
        let rel = file.strip_prefix(&src_dir).unwrap_or(&file).to_path_buf();
        let path = module_path(&rel);
        let Some(top) = path.first().cloned() else { continue };
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        scan(&text, &path, &mut |target, line| {
            if target != top && modules.contains(target) {
                graph
                    .entry(top.clone())
                    .or_default()
                    .entry(target.to_string())
                    .or_default()
                    .push((rel.clone(), line));
            }
        });
    }
    graph
}

pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok()).map(|e| e.path()).collect();
    paths.sort();
    for p in paths {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// `agent/context.rs` -> `[agent, context]`, `policy/mod.rs` -> `[policy]`,
/// `lib.rs` -> `[]`.
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
        parts.pop();
    }
    parts
}

/// Calls `found(module, line)` for every path in `src` that leaves the crate root
/// for a top-level name; `path` is the module path of the file.
fn scan(src: &str, path: &[String], found: &mut dyn FnMut(&str, usize)) {
    let code = strip(src);
    let tokens = tokenize(&code);
    // Inline `mod name { ... }` blocks open a deeper module for `super::`.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let (tok, line) = (tokens[i].0.as_str(), tokens[i].1);
        match tok {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            "mod" if tokens.get(i + 2).is_some_and(|t| t.0 == "{") => {
                inline.push((tokens[i + 1].0.clone(), depth));
            }
            "crate" | "super" if !preceded_by_path_sep(&tokens, i) && next_is(&tokens, i, "::") => {
                let mut here: Vec<&str> = path.iter().map(String::as_str).collect();
                here.extend(inline.iter().map(|(m, _)| m.as_str()));
                let mut j = i;
                if tok == "crate" {
                    here.clear();
                    j += 2;
                } else {
                    while tokens.get(j).is_some_and(|t| t.0 == "super") && next_is(&tokens, j, "::") {
                        here.pop();
                        j += 2;
                    }
                }
                if here.is_empty() {
                    for name in first_names(&tokens, j) {
                        found(name, line);
                    }
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
}

fn preceded_by_path_sep(tokens: &[(String, usize)], i: usize) -> bool {
    i > 0 && tokens[i - 1].0 == "::"
}

fn next_is(tokens: &[(String, usize)], i: usize, what: &str) -> bool {
    tokens.get(i + 1).is_some_and(|t| t.0 == what)
}

/// The first name of the path at `j`, or of each item of a `{...}` group there.
fn first_names(tokens: &[(String, usize)], j: usize) -> Vec<&str> {
    match tokens.get(j).map(|t| t.0.as_str()) {
        Some("{") => {
            let mut names = Vec::new();
            let mut depth = 0;
            let mut item_start = true;
            for (t, _) in &tokens[j..] {
                match t.as_str() {
                    "{" => {
                        depth += 1;
                        item_start = depth == 1;
                        continue;
                    }
                    "}" => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    "," if depth == 1 => {
                        item_start = true;
                        continue;
                    }
                    name if item_start && depth == 1 && is_ident(name) && name != "self" => names.push(name),
                    _ => {}
                }
                item_start = false;
            }
            names
        }
        Some(name) if is_ident(name) => vec![name],
        _ => Vec::new(),
    }
}

fn is_ident(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Identifiers, `::` and single punctuation characters, each with its line.
fn tokenize(code: &str) -> Vec<(String, usize)> {
    let chars: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            out.push((chars[start..i].iter().collect(), line));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            out.push(("::".to_string(), line));
            i += 2;
        } else {
            out.push((c.to_string(), line));
            i += 1;
        }
    }
    out
}

/// `src` with comments and the contents of string and char literals blanked out
/// (newlines kept, so lines still count).
pub(crate) fn strip(src: &str) -> String {
    let chars: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        // `r"..."` and `br"..."` open raw strings; `for"` or `bar"` do not.
        let ident_char = |k: usize| chars[k].is_alphanumeric() || chars[k] == '_';
        let prev_ident = i > 0 && ident_char(i - 1) && !(chars[i - 1] == 'b' && (i < 2 || !ident_char(i - 2)));
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut level = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    level += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    level -= 1;
                    i += 2;
                    if level == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[i]);
                    i += 1;
                }
            }
        } else if c == 'r' && !prev_ident && matches!(next, Some('"' | '#')) && raw_string_at(&chars, i).is_some() {
            let (hashes, body_start) = raw_string_at(&chars, i).unwrap_or((0, i));
            let closing: Vec<char> = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            out.push_str("r\"");
            i = body_start;
            while i < chars.len() && !chars[i..].starts_with(&closing) {
                blank(&mut out, chars[i]);
                i += 1;
            }
            out.push('"');
            i += closing.len();
        } else if c == '"' {
            out.push('"');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if let Some(&ch) = chars.get(i) {
                    blank(&mut out, ch);
                }
                i += 1;
            }
            out.push('"');
            i += 1;
        } else if c == '\'' && next == Some('\\') {
            // An escaped char literal: quote, backslash, the escaped char, then up to
            // the closing quote (`'\u{..}'`).
            i += 3;
            while i < chars.len() && chars[i] != '\'' {
                i += 1;
            }
            out.push_str("' '");
            i += 1;
        } else if c == '\'' && chars.get(i + 2) == Some(&'\'') {
            // A plain char literal; any other `'` starts a lifetime or label.
            out.push_str("' '");
            i += 3;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// At `chars[i] == 'r'`: the number of `#` and where the body starts, when this
/// opens a raw string.
fn raw_string_at(chars: &[char], i: usize) -> Option<(usize, usize)> {
    let mut j = i + 1;
    while chars.get(j) == Some(&'#') {
        j += 1;
    }
    (chars.get(j) == Some(&'"')).then_some((j - i - 1, j + 1))
}

/// Every strongly connected component with more than one module, each with the
/// edges inside it and where they are written.
fn cycles(graph: &Graph) -> Vec<String> {
    let nodes: BTreeSet<&str> = graph
        .iter()
        .flat_map(|(a, t)| std::iter::once(a.as_str()).chain(t.keys().map(String::as_str)))
        .collect();
    let reaches = |from: &str| -> BTreeSet<&str> {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from];
        while let Some(n) = stack.pop() {
            for next in graph.get(n).into_iter().flat_map(|t| t.keys()) {
                if seen.insert(next.as_str()) {
                    stack.push(next.as_str());
                }
            }
        }
        seen
    };
    let reach: BTreeMap<&str, BTreeSet<&str>> = nodes.iter().map(|n| (*n, reaches(n))).collect();
    let mut done: BTreeSet<&str> = BTreeSet::new();
    let mut out = Vec::new();
    for n in &nodes {
        if done.contains(n) || !reach[n].contains(n) {
            continue;
        }
        let component: BTreeSet<&str> = reach[n].iter().copied().filter(|m| reach[m].contains(n)).collect();
        done.extend(component.iter().copied());
        let edges: Vec<String> = component
            .iter()
            .flat_map(|a| {
                graph[*a]
                    .iter()
                    .filter(|(b, _)| component.contains(b.as_str()))
                    .map(move |(b, sites)| format!("  {a} -> {b} at {}", show_sites(sites)))
            })
            .collect();
        let names: Vec<&str> = component.into_iter().collect();
        out.push(format!("{}:\n{}", names.join(", "), edges.join("\n")));
    }
    out
}

fn show_sites(sites: &Sites) -> String {
    sites
        .iter()
        .map(|(f, l)| format!("{}:{l}", f.display()))
        .collect::<Vec<_>>()
        .join(", ")
}
