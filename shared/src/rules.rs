//! Permission rules in Claude Code syntax: `Tool`, `Tool(specifier)`. Bash rules take a
//! command pattern (`git log*`, `npm run test:*`); file rules take gitignore-like path
//! patterns (`src/**`, `*.env`, `/abs-from-repo`, `//absolute`, `~/home`). A rule is
//! parsed and compiled once and then matched many times. The grammar imports
//! nothing from this crate: `settings` checks rule syntax with it when loading, and
//! the `policy` engine matches calls with it.

use globset::{GlobBuilder, GlobMatcher};
use std::fmt;
use std::path::Path;

/// Tool names a rule may name (Claude Code's built-in tools).
pub const RULE_TOOLS: &[&str] = &[
    "Bash",
    "Read",
    "Edit",
    "Write",
    "MultiEdit",
    "NotebookEdit",
    "Grep",
    "Glob",
    "LS",
    "WebFetch",
    "WebSearch",
    "Task",
];

/// Why a rule did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("empty rule")]
    Empty,
    #[error("unknown tool `{0}` (expected one of {tools})", tools = RULE_TOOLS.join(", "))]
    UnknownTool(String),
    #[error("unbalanced parentheses")]
    Unbalanced,
    #[error("empty specifier `()`; write `{0}` alone to match every call")]
    EmptySpecifier(String),
    #[error("`:*` is only allowed at the end of a command pattern")]
    MisplacedPrefix,
    #[error("invalid path pattern: {0}")]
    Glob(String),
}

/// A compiled permission rule.
#[derive(Debug, Clone)]
pub struct Rule {
    /// The rule as written, reported as the matched rule.
    pub source: String,
    pub tool: String,
    pub spec: Spec,
}

#[derive(Debug, Clone)]
pub enum Spec {
    /// `Tool` alone, or `Tool(*)`, `Tool(**)`: every call of the tool.
    Any,
    Command(CommandPattern),
    Path(PathPattern),
    /// Any other specifier (WebFetch domains, MCP tools): compared literally.
    Literal(String),
}

/// A Bash command pattern.
#[derive(Debug, Clone)]
pub struct CommandPattern {
    /// The pattern text, without a trailing `:*`.
    text: String,
    /// The literal text before the first `*` (a cheap first check).
    literal_prefix: String,
    /// Basename of the program of a flag-aware pattern.
    program: Option<String>,
    /// `npm run test:*`: prefix match on a word boundary.
    word_prefix: bool,
    /// Canonical form for flag-aware matching of deny and ask rules; `None` when the
    /// pattern has wildcards in the middle and only literal matching is sound.
    canon: Option<(Vec<String>, bool)>,
}

/// A path pattern, matched against repo-relative or absolute paths.
#[derive(Debug, Clone)]
pub struct PathPattern {
    matcher: GlobMatcher,
    absolute: bool,
}

impl Rule {
    pub fn parse(raw: &str) -> Result<Rule, RuleError> {
        let s = raw.trim();
        if s.is_empty() {
            return Err(RuleError::Empty);
        }
        let (tool, spec) = match s.find('(') {
            None => {
                if s.contains(')') {
                    return Err(RuleError::Unbalanced);
                }
                (s, None)
            }
            Some(i) => {
                if !s.ends_with(')') {
                    return Err(RuleError::Unbalanced);
                }
                (&s[..i], Some(&s[i + 1..s.len() - 1]))
            }
        };
        if !(RULE_TOOLS.contains(&tool) || tool.starts_with("mcp__")) {
            return Err(RuleError::UnknownTool(tool.to_string()));
        }
        let spec = match spec {
            None => Spec::Any,
            Some("") => return Err(RuleError::EmptySpecifier(tool.to_string())),
            Some("*") | Some(":*") if tool == "Bash" => Spec::Any,
            Some(sp) => match tool {
                "Bash" => Spec::Command(CommandPattern::parse(sp)?),
                "Read" | "Edit" | "Write" | "MultiEdit" | "NotebookEdit" | "Grep" | "Glob" | "LS" => {
                    Spec::Path(PathPattern::parse(sp)?)
                }
                _ => Spec::Literal(sp.to_string()),
            },
        };
        Ok(Rule {
            source: s.to_string(),
            tool: tool.to_string(),
            spec,
        })
    }

    /// Does this rule apply to calls of any of `tools`?
    pub fn names_any(&self, tools: &[&str]) -> bool {
        tools.contains(&self.tool.as_str())
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

impl CommandPattern {
    fn parse(sp: &str) -> Result<CommandPattern, RuleError> {
        let (text, word_prefix) = match sp.strip_suffix(":*") {
            Some(t) => (t.trim_end(), true),
            None => (sp, false),
        };
        if text.contains(":*") {
            return Err(RuleError::MisplacedPrefix);
        }
        let trailing = word_prefix || text.ends_with('*');
        let body = text.trim_end_matches('*');
        let canon = if body.contains('*') || body.contains('"') || body.contains('\'') || body.trim().is_empty() {
            None
        } else {
            Some((body.split_whitespace().map(str::to_string).collect(), trailing))
        };
        let literal_prefix = text.split('*').next().unwrap_or("").to_string();
        let program = canon
            .as_ref()
            .and_then(|(w, _): &(Vec<String>, bool)| w.first())
            .map(|p| p.rsplit('/').next().unwrap_or(p).to_string());
        Ok(CommandPattern {
            program,
            literal_prefix,
            text: text.to_string(),
            word_prefix,
            canon,
        })
    }

    /// Literal matching, used for allow rules: `*` matches any run of characters.
    pub fn matches_line(&self, line: &str, open_args: bool) -> bool {
        if self.word_prefix {
            return line == self.text || (line.starts_with(&self.text) && line[self.text.len()..].starts_with(' '));
        }
        if open_args && !self.text.ends_with('*') {
            return false;
        }
        if !line.starts_with(&self.literal_prefix) {
            return false;
        }
        wildcard_match(&self.text, line)
    }

    /// The program a flag-aware pattern is about (`rm` for `rm -rf*`).
    pub fn program(&self) -> Option<&str> {
        self.program.as_deref()
    }

    /// The pattern's first word when it is literal (`git` for `git log*`); a
    /// command whose first word differs cannot match.
    pub fn first_word(&self) -> Option<&str> {
        let first = self.text.split(' ').next()?;
        (!first.contains('*') && self.text.len() > first.len() || !self.text.contains('*') && !first.is_empty())
            .then_some(first)
    }

    /// Flag-aware matching, used for deny and ask rules, so `rm -rf*` also catches
    /// `rm -fr`, `rm -r -f` and `rm --recursive --force`, and `git push*` catches
    /// `git -C . push`.
    pub fn matches_canon(&self, cmd: &Canon) -> bool {
        let Some((words, trailing)) = &self.canon else {
            return false;
        };
        let rule = Canon::from_words(words.iter().map(String::as_str));
        if rule.program != cmd.program || !cmd.has_all_flags_of(&rule) {
            return false;
        }
        if *trailing {
            cmd.positionals.starts_with(&rule.positionals)
        } else {
            cmd.positionals == rule.positionals
        }
    }
}

/// `*` matches any (possibly empty) run of characters; everything else literally.
pub fn wildcard_match(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

impl PathPattern {
    /// The glob this pattern matches with (repo-relative, or absolute).
    pub fn glob(&self) -> &str {
        self.matcher.glob().glob()
    }

    fn parse(sp: &str) -> Result<PathPattern, RuleError> {
        let (pattern, absolute) = if let Some(abs) = sp.strip_prefix("//") {
            (format!("/{abs}"), true)
        } else if let Some(home) = sp.strip_prefix("~/") {
            let h = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
            (format!("{}/{home}", h.trim_end_matches('/')), true)
        } else if let Some(rel) = sp.strip_prefix('/') {
            (rel.to_string(), false)
        } else {
            let rel = sp.strip_prefix("./").unwrap_or(sp);
            // gitignore: a pattern without a slash matches at any depth.
            if rel.trim_end_matches('/').contains('/') || rel.starts_with("**") {
                (rel.to_string(), false)
            } else {
                (format!("**/{rel}"), false)
            }
        };
        let pattern = match pattern.strip_suffix('/') {
            Some(dir) => format!("{dir}/**"),
            None => pattern,
        };
        let glob = GlobBuilder::new(&pattern)
            .literal_separator(true)
            .build()
            .map_err(|e| RuleError::Glob(e.to_string()))?;
        Ok(PathPattern {
            matcher: glob.compile_matcher(),
            absolute,
        })
    }

    /// `rel` is the repo-relative path when the path is inside the repo.
    pub fn matches(&self, rel: Option<&str>, abs: &Path) -> bool {
        if self.absolute {
            self.matcher.is_match(abs)
        } else {
            rel.is_some_and(|r| self.matcher.is_match(r) || self.matcher.is_match(format!("{r}/")))
        }
    }

    /// As [`PathPattern::matches`], and a relative pattern that begins with `**/`
    /// ("at any depth") also matches a path outside the repository (in a read root)
    /// by its absolute form: what deny and ask rules mean (`Read(**/.env)` covers
    /// `/srv/data/.env` in `additional_directories`). Allow rules keep to
    /// [`PathPattern::matches`], so no allow reaches past the repository this way.
    pub fn matches_anywhere(&self, rel: Option<&str>, abs: &Path) -> bool {
        self.matches(rel, abs) || (rel.is_none() && self.anywhere() && self.matcher.is_match(abs))
    }

    /// A relative pattern for any depth (`**/x`, or `**`).
    pub fn anywhere(&self) -> bool {
        !self.absolute && is_any_depth(self.glob())
    }
}

/// Whether the relative glob `glob` is one for any depth (`**/.env`, `**`): such a
/// rule holds in the read roots outside the repository too.
pub fn is_any_depth(glob: &str) -> bool {
    glob == "**" || glob.starts_with("**/")
}

/// Whether the glob `glob` (`/`-separated, as [`GlobBuilder`] with a literal separator
/// reads it) may match a path below the directory `dir` (its components): what tells a
/// walk that a deny rule can reach through a link named `dir`. Conservative: a
/// component it cannot read alone (an alternation, which may hold a `/`) may match.
/// A glob for any depth (`**/x`) counts only when its match would begin inside `dir`
/// (`**/alias/secret` below `data/alias`): one that begins below `dir` matches the
/// link's target by its own path as well, which the walk sees anyway.
pub fn may_match_below(glob: &str, dir: &str) -> bool {
    let g: Vec<&str> = glob.split('/').filter(|c| !c.is_empty()).collect();
    let d: Vec<&str> = dir.split('/').filter(|c| !c.is_empty()).collect();
    match g.split_first() {
        Some((&"**", rest)) => (0..d.len())
            .any(|i| rest.first().is_some_and(|r| component_may_match(r, d[i])) && extends(&rest[1..], &d[i + 1..])),
        _ => extends(&g, &d),
    }
}

/// Whether the glob components `g` may match a path that starts with the components
/// `d` and goes on below them.
fn extends(g: &[&str], d: &[&str]) -> bool {
    match (g.split_first(), d.split_first()) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some((&"**", rest)), Some((_, below))) => extends(rest, d) || extends(g, below),
        (Some((c, rest)), Some((name, below))) => component_may_match(c, name) && extends(rest, below),
    }
}

/// Whether one glob component may match the name `name`.
fn component_may_match(component: &str, name: &str) -> bool {
    if !component.contains(['*', '?', '[', '{', '\\']) {
        return component == name;
    }
    if component.contains('{') {
        return true;
    }
    GlobBuilder::new(component)
        .literal_separator(true)
        .build()
        .map_or(true, |g| g.compile_matcher().is_match(name))
}

/// A command in canonical form for flag-aware matching: program basename, the set of
/// single flags (`-rf` becomes `-r`, `-f`; long flags mapped to short where known),
/// and the positional words in order. Git's global options are dropped. Borrows its
/// words, so building one allocates only its two small vectors.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Canon<'a> {
    pub program: &'a str,
    /// Sorted and deduplicated.
    pub flags: Vec<Flag<'a>>,
    pub positionals: Vec<&'a str>,
}

/// One flag: `-r` or `--name` (without any `=value`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Flag<'a> {
    Short(char),
    Long(&'a str),
}

/// Git options that come before the subcommand and take a value.
const GIT_GLOBAL_WITH_VALUE: &[&str] = &[
    "-C",
    "-c",
    "--git-dir",
    "--work-tree",
    "--namespace",
    "--exec-path",
    "--config-env",
];

impl<'a> Canon<'a> {
    pub fn of(argv: &[&'a str]) -> Canon<'a> {
        Canon::from_words(argv.iter().copied())
    }

    pub fn from_words(argv: impl IntoIterator<Item = &'a str>) -> Canon<'a> {
        let mut c = Canon::default();
        let mut rest = argv.into_iter().peekable();
        let Some(first) = rest.next() else { return c };
        c.program = first.rsplit('/').next().unwrap_or(first);
        if c.program == "git" {
            while let Some(a) = rest.peek().copied() {
                if GIT_GLOBAL_WITH_VALUE.contains(&a) {
                    rest.next();
                    rest.next();
                } else if a.starts_with('-') {
                    rest.next();
                } else {
                    break;
                }
            }
        }
        let mut only_positional = false;
        for a in rest {
            if only_positional || a == "-" || !a.starts_with('-') {
                c.positionals.push(a);
            } else if a == "--" {
                only_positional = true;
            } else if let Some(long) = a.strip_prefix("--") {
                let name = long.split('=').next().unwrap_or(long);
                c.flags.push(alias(c.program, Flag::Long(name)));
            } else {
                for ch in a[1..].chars().filter(char::is_ascii_alphanumeric) {
                    c.flags.push(alias(c.program, Flag::Short(ch)));
                }
            }
        }
        c.flags.sort_unstable();
        c.flags.dedup();
        c
    }

    fn has_all_flags_of(&self, other: &Canon) -> bool {
        other.flags.iter().all(|f| self.flags.binary_search(f).is_ok())
    }
}

/// Maps equivalent spellings of a flag to one canonical spelling.
fn alias<'a>(program: &str, flag: Flag<'a>) -> Flag<'a> {
    use Flag::{Long, Short};
    match (program, flag) {
        ("rm" | "cp" | "chmod" | "chown" | "chgrp" | "ls" | "grep", Short('R') | Long("recursive")) => Short('r'),
        ("rm" | "cp" | "mv" | "ln" | "git", Long("force")) => Short('f'),
        ("rm", Long("dir")) => Short('d'),
        ("rm" | "cp" | "mv", Long("interactive")) => Short('i'),
        ("sed" | "perl", Long("in-place")) => Short('i'),
        ("curl", Long("output")) => Short('o'),
        ("wget", Long("output-document")) => Short('O'),
        ("git", Long("delete")) => Short('d'),
        ("tar", Long("extract" | "get")) => Short('x'),
        ("tar", Long("create")) => Short('c'),
        ("tar", Long("file")) => Short('f'),
        ("tar", Long("directory")) => Short('C'),
        _ => flag,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_rule_forms() {
        assert!(matches!(Rule::parse("Bash").unwrap().spec, Spec::Any));
        assert!(matches!(Rule::parse("Bash(*)").unwrap().spec, Spec::Any));
        assert!(matches!(Rule::parse("Bash(git log*)").unwrap().spec, Spec::Command(_)));
        assert!(matches!(Rule::parse("Read(**/*.md)").unwrap().spec, Spec::Path(_)));
        assert!(matches!(
            Rule::parse("WebFetch(domain:example.com)").unwrap().spec,
            Spec::Literal(_)
        ));
        assert_eq!(Rule::parse("Bash(git log").unwrap_err(), RuleError::Unbalanced);
        assert_eq!(
            Rule::parse("Bsh(ls)").unwrap_err(),
            RuleError::UnknownTool("Bsh".into())
        );
        assert_eq!(
            Rule::parse("Bash()").unwrap_err(),
            RuleError::EmptySpecifier("Bash".into())
        );
        assert_eq!(Rule::parse("Bash(a:* b)").unwrap_err(), RuleError::MisplacedPrefix);
        assert!(matches!(Rule::parse("Read([)").unwrap_err(), RuleError::Glob(_)));
        assert_eq!(Rule::parse("  ").unwrap_err(), RuleError::Empty);
    }

    fn cmd(rule: &str) -> CommandPattern {
        match Rule::parse(rule).unwrap().spec {
            Spec::Command(c) => c,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn literal_command_matching() {
        assert!(cmd("Bash(git log*)").matches_line("git log --oneline", false));
        assert!(cmd("Bash(git log*)").matches_line("git log", false));
        assert!(!cmd("Bash(git log*)").matches_line("git push", false));
        assert!(cmd("Bash(npm run test:*)").matches_line("npm run test -- --watch", false));
        assert!(cmd("Bash(npm run test:*)").matches_line("npm run test", false));
        assert!(!cmd("Bash(npm run test:*)").matches_line("npm run testx", false));
        assert!(cmd("Bash(git * main)").matches_line("git checkout main", false));
        assert!(!cmd("Bash(ls)").matches_line("ls -la", false));
        assert!(!cmd("Bash(ls)").matches_line("ls", true));
    }

    #[test]
    fn canonical_matching_sees_through_flag_spellings() {
        let rule = cmd("Bash(rm -rf*)");
        for c in [
            &["rm", "-fr", "x"][..],
            &["rm", "-r", "-f", "x"],
            &["rm", "--recursive", "--force", "x"],
            &["/bin/rm", "-Rf", "x"],
            &["rm", "-v", "-rf", "x"],
        ] {
            assert!(rule.matches_canon(&Canon::of(c)), "{c:?}");
        }
        assert!(!rule.matches_canon(&Canon::of(&["rm", "-r", "x"])));
        let push = cmd("Bash(git push*)");
        assert!(push.matches_canon(&Canon::of(&["git", "-C", ".", "push"])));
        assert!(push.matches_canon(&Canon::of(&[
            "git",
            "--no-pager",
            "-c",
            "a=b",
            "push",
            "--force",
            "origin"
        ])));
        assert!(!push.matches_canon(&Canon::of(&["git", "log"])));
    }

    #[test]
    fn path_patterns_follow_gitignore_anchoring() {
        let p = |r: &str| match Rule::parse(r).unwrap().spec {
            Spec::Path(p) => p,
            other => panic!("{other:?}"),
        };
        let abs = Path::new("/repo/x");
        assert!(p("Read(*.env)").matches(Some("a/b/.env"), abs));
        assert!(p("Read(*.env)").matches(Some("x.env"), abs));
        assert!(p("Edit(src/**)").matches(Some("src/a/b.rs"), abs));
        assert!(!p("Edit(src/**)").matches(Some("lib/src/a.rs"), abs));
        assert!(p("Edit(/src/*.rs)").matches(Some("src/a.rs"), abs));
        assert!(!p("Edit(/src/*.rs)").matches(Some("src/a/b.rs"), abs));
        assert!(p("Read(//etc/**)").matches(None, Path::new("/etc/passwd")));
        assert!(!p("Read(//etc/**)").matches(Some("etc/passwd"), Path::new("/repo/etc/passwd")));
        assert!(p("Read(secrets/)").matches(Some("secrets/k"), abs));
    }

    #[test]
    fn wildcards() {
        assert!(wildcard_match("a*c", "abbbc"));
        assert!(wildcard_match("*", ""));
        assert!(!wildcard_match("a*c", "abd"));
        assert!(wildcard_match("git * --force", "git push origin --force"));
    }

    #[test]
    fn a_glob_may_match_below_a_directory_when_its_components_allow_it() {
        for (glob, dir) in [
            ("alias/secret/**", "alias"),
            ("alias/secret/**", "alias/secret"),
            ("a*/s?cret", "alias"),
            ("*/secret", "anything"),
            ("alias/**/key", "alias/x/y"),
            ("**/alias/secret", "data/alias"),
            ("**/al*/secret", "alias"),
            ("{alias,x}/secret", "alias"),
            ("alias/**", "alias"),
        ] {
            assert!(may_match_below(glob, dir), "{glob} below {dir}");
        }
        for (glob, dir) in [
            ("data/secret/**", "alias"),
            ("alias", "alias"),
            ("alias/secret", "alias/secret"),
            ("**/.env", "node_modules/pkg"),
            ("**/secret/**", "alias"),
            ("**", "alias"),
            ("a/b/c", "a/x"),
        ] {
            assert!(!may_match_below(glob, dir), "{glob} below {dir}");
        }
    }
}
