//! Test-only: the top-level modules of this crate stand in named layers ([`LAYERS`],
//! lowest first, each with why it sits there), no module imports from a layer above
//! its own, and they import each other without a cycle. A cycle makes two modules one
//! unit (neither can be read, tested or moved alone), and an import that reaches up
//! makes a low module carry everything above it, so each new one should fail a test,
//! not wait for a review to notice. Every module must be in exactly one layer: a new
//! one fails until it is placed.
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

/// A named floor of the crate: its modules may import modules of their own layer or of
/// any layer listed before it, never of one listed after it.
struct Layer {
    name: &'static str,
    /// Why the layer sits where it does: what it holds and what must not reach down
    /// into it.
    why: &'static str,
    modules: &'static [&'static str],
}

/// The layers of `shared`, lowest first. A new top-level module goes into the lowest
/// layer at or above every module it imports (the unassigned-module test names it).
const LAYERS: &[Layer] = &[
    Layer {
        name: "leaves",
        why: "helpers that import nothing of this crate: path safety, the repository's \
              names, text, the shell lexer, shared env lists (`env`), diagnostics, \
              files replaced durably",
        modules: &[
            "beneath",
            "regular",
            "cancel",
            "diag",
            "durable",
            "env",
            "failpoints",
            "gitpath",
            "layout",
            "progress",
            "rules",
            "secrets",
            "shell",
            "stats",
            "test_skip",
            "text",
            "yamlpos",
        ],
    },
    Layer {
        name: "git",
        why: "git helpers, with the records a blocked commit keeps in git; they sit below \
              tool execution (shared env lists live in `env`)",
        modules: &["git", "pending"],
    },
    Layer {
        name: "tools",
        why: "the tool vocabulary and its executor, and MCP servers' declarations: the policy \
              engine decides tool calls (it turns `ToolArgs` into its `Call`), tools never ask \
              it, and the shell lexer both use is the leaf `shell`; the worker process serves \
              tools, tools know nothing of it",
        modules: &["mcp", "tools"],
    },
    Layer {
        name: "typed files",
        why: "the typed files of a repository and the records a fire writes: records are the \
              leaf types every writer shares (the trace stores them), settings are plain data \
              the policy engine reads",
        modules: &["powers", "prompt", "records", "settings"],
    },
    Layer {
        name: "policy",
        why: "the policy engine: decides every tool call from settings and the layout",
        modules: &["policy"],
    },
    Layer {
        name: "sandbox",
        why: "sandbox policy and the tool worker that enters it and serves tools",
        modules: &["sandbox", "worker"],
    },
    Layer {
        name: "providers",
        why: "what leaves the machine: model providers and the trace's export",
        modules: &["provider", "telemetry"],
    },
    Layer {
        name: "stores",
        why: "the SQLite stores and what they hold: run rows (`runs`, below both the trace and \
              the builder's history index), the run journal, the trace, the loop's checkpoint \
              data (`loop_state`) and the runtime's local state; the agent loop writes the \
              trace and the state, not the other way round, and the state sits below the fire \
              that uses it",
        modules: &["journal", "loop_state", "runs", "state", "store", "trace"],
    },
    Layer {
        name: "agent loop",
        why: "the loop controller: provider, gate, worker, checkpoint, until a stop reason",
        modules: &["agent"],
    },
    Layer {
        name: "review",
        why: "proposals, approvals and the trust judge of builder changes; it reads stores, \
              never runs the loop",
        modules: &["review"],
    },
    Layer {
        name: "fire",
        why: "one fire from start to commit, with the metadata manifest and the cron box's \
              sync around it",
        modules: &["fire", "manifest", "sync"],
    },
    Layer {
        name: "commands",
        why: "what the binaries' verbs call on top of fires and reviews: the builder's history \
              index and what reads it, eval, check, audit, the review report, and the reading \
              of an error's cause for exit codes",
        modules: &[
            "audit",
            "cards",
            "cause",
            "check",
            "eval",
            "history",
            "pages",
            "pushed",
            "retro",
            "review_report",
            "scaffold",
        ],
    },
];

/// The test-only modules that check the house (this one, and `house`'s function
/// lengths): declared in `lib.rs` but no part of the house they check.
const HOUSE_CHECKS: &[&str] = &["import_graph", "house"];

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
fn no_module_imports_from_a_higher_layer() {
    let found = upward_imports(&crate_graph(), LAYERS);
    let layers: Vec<String> = LAYERS.iter().map(|l| format!("  {}: {}", l.name, l.why)).collect();
    assert!(
        found.is_empty(),
        "imports from a lower layer up to a higher one (move the imported item down):\n{}\n\
         the layers, lowest first (LAYERS in shared/src/import_graph.rs):\n{}",
        found.join("\n"),
        layers.join("\n")
    );
}

#[test]
fn every_top_level_module_is_in_exactly_one_layer() {
    let modules = crate_modules();
    let problems = layer_assignment_problems(&modules, &crate_graph(), LAYERS);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn an_upward_import_is_reported_with_file_line_and_layers() {
    const LOW: &[&str] = &["low"];
    const HIGH: &[&str] = &["high"];
    let layers = [
        Layer {
            name: "bottom",
            why: "",
            modules: LOW,
        },
        Layer {
            name: "top",
            why: "",
            modules: HIGH,
        },
    ];
    let mut g = Graph::new();
    for (a, b, file, line) in [("high", "low", "high.rs", 2), ("low", "high", "low/x.rs", 7)] {
        g.entry(a.into())
            .or_default()
            .insert(b.into(), vec![(PathBuf::from(file), line)]);
    }
    let found = upward_imports(&g, &layers);
    assert_eq!(
        found,
        ["low/x.rs:7: `low` (layer bottom) imports `high` (layer top)"],
        "{found:?}"
    );
}

#[test]
fn an_unassigned_twice_assigned_or_stale_module_is_reported() {
    const LOW: &[&str] = &["low", "twice", "gone"];
    const HIGH: &[&str] = &["high", "twice"];
    let layers = [
        Layer {
            name: "bottom",
            why: "",
            modules: LOW,
        },
        Layer {
            name: "top",
            why: "",
            modules: HIGH,
        },
    ];
    let mut g = Graph::new();
    g.entry("new".into())
        .or_default()
        .insert("high".into(), vec![(PathBuf::from("new.rs"), 1)]);
    let modules: BTreeSet<String> = ["low", "high", "twice", "new"].map(String::from).into();
    let found = layer_assignment_problems(&modules, &g, &layers);
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(found[0].starts_with("module `new` is in no layer"), "{found:?}");
    assert!(found[0].contains("shared/src/import_graph.rs"), "{found:?}");
    assert!(
        found[0].contains("the lowest it fits is layer top (it imports high)"),
        "{found:?}"
    );
    assert_eq!(found[1], "module `twice` is in more than one layer: bottom, top");
    assert_eq!(
        found[2],
        "`gone` (layer bottom) is not a module declared in src/lib.rs: remove it"
    );
}

/// The scan must see the imports that exist, or the cycle and layer tests pass on
/// nothing.
#[test]
fn scan_sees_known_imports_of_this_crate() {
    let graph = crate_graph();
    for (from, to) in [
        ("fire", "agent"),
        ("agent", "tools"),
        ("history", "store"),
        ("check", "settings"),
        ("state", "loop_state"),
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

/// Every import of `graph` that goes from a module to one in a higher layer, one
/// line per place it is written: `file:line: `from` (layer a) imports `to` (layer b)`.
/// Modules in no layer are left to [`layer_assignment_problems`].
fn upward_imports(graph: &Graph, layers: &[Layer]) -> Vec<String> {
    let mut found = Vec::new();
    for (from, targets) in graph {
        let Some(low) = layer_of(layers, from) else { continue };
        for (to, sites) in targets {
            let Some(high) = layer_of(layers, to) else { continue };
            if high <= low {
                continue;
            }
            for (file, line) in sites {
                found.push(format!(
                    "{}:{line}: `{from}` (layer {}) imports `{to}` (layer {})",
                    file.display(),
                    layers[low].name,
                    layers[high].name
                ));
            }
        }
    }
    found
}

/// The index of the first layer that lists `module`.
fn layer_of(layers: &[Layer], module: &str) -> Option<usize> {
    layers.iter().position(|l| l.modules.contains(&module))
}

/// Modules of `modules` in no layer (with the lowest layer each fits, from what it
/// imports in `graph`), modules in more than one, and layer entries that name no module.
fn layer_assignment_problems(modules: &BTreeSet<String>, graph: &Graph, layers: &[Layer]) -> Vec<String> {
    let mut problems = Vec::new();
    for module in modules.iter().filter(|m| layer_of(layers, m).is_none()) {
        let imports: Vec<&str> = graph
            .get(module)
            .into_iter()
            .flat_map(|t| t.keys())
            .map(String::as_str)
            .collect();
        let lowest = imports.iter().filter_map(|m| layer_of(layers, m)).max().unwrap_or(0);
        problems.push(format!(
            "module `{module}` is in no layer: add it to the `modules` of one in LAYERS \
             (shared/src/import_graph.rs); the lowest it fits is layer {} (it imports {})",
            layers.get(lowest).map_or("?", |l| l.name),
            if imports.is_empty() {
                "nothing of this crate".to_string()
            } else {
                imports.join(", ")
            }
        ));
    }
    for module in modules {
        let named: Vec<&str> = layers
            .iter()
            .filter(|l| l.modules.contains(&module.as_str()))
            .map(|l| l.name)
            .collect();
        if named.len() > 1 {
            problems.push(format!(
                "module `{module}` is in more than one layer: {}",
                named.join(", ")
            ));
        }
    }
    for layer in layers {
        for m in layer.modules.iter().filter(|m| !modules.contains(**m)) {
            problems.push(format!(
                "`{m}` (layer {}) is not a module declared in src/lib.rs: remove it",
                layer.name
            ));
        }
    }
    problems
}

/// The top-level modules declared in `src/lib.rs`, but for this test module.
fn crate_modules() -> BTreeSet<String> {
    let lib_rs = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs");
    let lib = std::fs::read_to_string(lib_rs).unwrap_or_default();
    let modules: BTreeSet<String> = strip(&lib)
        .lines()
        .filter_map(|l| {
            let l = l.trim().trim_start_matches("pub ").trim_start_matches("mod ");
            l.strip_suffix(';')
                .filter(|m| is_ident(m) && !HOUSE_CHECKS.contains(m))
                .map(str::to_string)
        })
        .collect();
    assert!(modules.len() > 10, "no modules found in lib.rs: {modules:?}");
    modules
}

/// The import graph of the top-level modules declared in `src/lib.rs`.
fn crate_graph() -> Graph {
    let src_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = crate_modules();
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
