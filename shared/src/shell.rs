//! Shell command analysis for the policy engine. A command line is parsed with
//! tree-sitter-bash (the grammar openai/codex uses for the same job) into the simple
//! commands it would run: every segment of `&&`, `||`, `;`, pipes, `&`, newlines,
//! subshells, `$(...)`, backticks, process substitution, `bash -c` / `sh -c` / `eval`
//! payloads and heredocs fed to a shell; wrappers (`env`, `timeout`, `nice`, `nohup`,
//! `command`, `builtin`, `exec`, `sudo`, `xargs`, `find -exec`) are unwrapped. Each
//! segment carries the paths it would write (redirections and the targets of known
//! writing commands) and any inline interpreter code it cannot see into. Anything the
//! parser cannot understand is an error, which the engine turns into a denial.

use std::cell::RefCell;
use tree_sitter::{Node, Parser};

/// A word of a command line after quote removal. `dynamic` words contain expansions
/// whose value is only known at run time; their `text` is the source text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Word {
    pub text: String,
    pub dynamic: bool,
}

impl Word {
    fn lit(s: impl Into<String>) -> Word {
        Word {
            text: s.into(),
            dynamic: false,
        }
    }
}

/// One simple command the line would run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Segment {
    /// The command after unwrapping, program first.
    pub argv: Vec<Word>,
    /// The wrappers around `argv`, outermost first (empty for a plain command).
    pub layers: Vec<Vec<Word>>,
    /// More arguments are appended at run time (`xargs`, `find -exec`).
    pub open_args: bool,
    /// Paths this segment writes (redirect targets, write-command targets).
    pub writes: Vec<Word>,
    /// Files fed to it by input redirection (`< file`).
    pub reads: Vec<Word>,
    /// Inline code for an interpreter the analysis cannot see into.
    pub opaque_code: Vec<String>,
    /// Directory set by an earlier `cd` in the same line (`None`: the start directory).
    pub cwd: Option<Word>,
}

impl Segment {
    pub fn program(&self) -> &str {
        let p = self.argv.first().map(|w| w.text.as_str()).unwrap_or("");
        p.rsplit('/').next().unwrap_or(p)
    }
    pub fn line(&self) -> String {
        join(&self.argv)
    }
}

/// Input redirections of a statement reach every command it runs.
fn attach_reads(segments: &mut [Segment], reads: &[Word]) {
    for seg in segments {
        seg.reads.extend(reads.iter().cloned());
    }
}

/// Programs that read the files their arguments name, with how many leading
/// positional arguments are not files (a pattern or a script) unless `-e`/`-f` give it.
const READERS: &[(&str, usize)] = &[
    ("cat", 0),
    ("tac", 0),
    ("nl", 0),
    ("head", 0),
    ("tail", 0),
    ("less", 0),
    ("more", 0),
    ("wc", 0),
    ("sort", 0),
    ("uniq", 0),
    ("cut", 0),
    ("paste", 0),
    ("diff", 0),
    ("cmp", 0),
    ("comm", 0),
    ("od", 0),
    ("xxd", 0),
    ("hexdump", 0),
    ("strings", 0),
    ("base64", 0),
    ("base32", 0),
    ("md5sum", 0),
    ("sha1sum", 0),
    ("sha256sum", 0),
    ("sha512sum", 0),
    ("cp", 0),
    ("grep", 1),
    ("egrep", 1),
    ("fgrep", 1),
    ("rg", 1),
    ("sed", 1),
    ("awk", 1),
    ("jq", 1),
];

/// Whether a segment searches directories recursively (`grep -r`/`-R`, `rg`, `ag`):
/// it reads files its words never name.
pub fn searches_recursively(seg: &Segment) -> bool {
    match seg.program() {
        "rg" | "ag" | "ack" => true,
        "grep" | "egrep" | "fgrep" => seg.argv.iter().skip(1).any(|w| {
            let t = w.text.as_str();
            t == "--recursive"
                || t == "--dereference-recursive"
                || (t.starts_with('-') && !t.starts_with("--") && t.contains(['r', 'R']))
        }),
        _ => false,
    }
}

/// The files a segment reads that a `Read` rule should judge: its input redirects, and
/// the file arguments of a known reading command (flags and, for `grep`-like programs,
/// the pattern left out). Extra words only cost a check; a reader not listed here (or
/// a recursive search over a directory) is the kernel layer's to contain.
pub fn read_targets(seg: &Segment) -> Vec<&Word> {
    let mut out: Vec<&Word> = seg.reads.iter().collect();
    let Some(&(_, skip)) = READERS.iter().find(|(p, _)| *p == seg.program()) else {
        return out;
    };
    let args = &seg.argv[1.min(seg.argv.len())..];
    let given = args
        .iter()
        .any(|w| matches!(w.text.as_str(), "-e" | "-f" | "--regexp" | "--file") || w.text.starts_with("--regexp="));
    let mut positionals = args.iter().filter(|w| !w.text.starts_with('-') || w.text == "-");
    if !given {
        for _ in 0..skip {
            positionals.next();
        }
    }
    out.extend(positionals.filter(|w| w.text != "-"));
    out
}

/// Joins words with single spaces (the form rules are matched against).
pub fn join(words: &[Word]) -> String {
    let mut s = String::new();
    for (i, w) in words.iter().enumerate() {
        if i > 0 {
            s.push(' ');
        }
        s.push_str(&w.text);
    }
    s
}

/// Quotes `s` as one word for `sh` (single quotes, each `'` written `'\''`): how the
/// runtime passes a name it did not choose (a script's path, a file a model made) to
/// a command it runs itself.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Why a command line could not be analysed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShellError {
    #[error("the shell parser cannot understand this command: {0}")]
    Syntax(String),
    #[error("command name is not a literal word: `{0}`")]
    DynamicCommand(String),
    #[error("`{0}` runs code that is only known at run time")]
    DynamicPayload(String),
    #[error("nested shells deeper than {0} levels")]
    TooDeep(usize),
    #[error("empty command")]
    Empty,
}

const MAX_DEPTH: usize = 6;
const SHELLS: &[&str] = &["bash", "sh", "zsh", "dash", "ksh", "mksh", "ash", "busybox"];
const INTERPRETERS: &[(&str, &[&str])] = &[
    ("python", &["-c"]),
    ("python3", &["-c"]),
    ("python2", &["-c"]),
    ("perl", &["-e", "-E"]),
    ("ruby", &["-e"]),
    ("node", &["-e", "--eval", "-p", "--print"]),
    ("nodejs", &["-e", "--eval"]),
    ("php", &["-r"]),
    ("lua", &["-e"]),
    ("Rscript", &["-e"]),
    ("deno", &["eval"]),
];
/// Commands that only change the shell's own state; always allowed.
pub const NEUTRAL: &[&str] = &["cd", "pushd", "popd", "true", "false", ":"];

thread_local! {
    static PARSER: RefCell<Option<Parser>> = const { RefCell::new(None) };
}

/// Analyses a command line into its segments.
pub fn analyse(line: &str) -> Result<Vec<Segment>, ShellError> {
    let mut out = Vec::new();
    analyse_into(line, 0, &mut out)?;
    if out.is_empty() {
        return Err(ShellError::Empty);
    }
    // Track `cd` so later relative write targets resolve against it.
    let mut cwd: Option<Word> = None;
    for seg in out.iter_mut() {
        seg.cwd = cwd.clone();
        if matches!(seg.program(), "cd" | "pushd") {
            cwd = Some(match seg.argv.get(1) {
                Some(w) => w.clone(),
                None => Word {
                    text: "~".into(),
                    dynamic: true,
                },
            });
        }
    }
    Ok(out)
}

fn analyse_into(line: &str, depth: usize, out: &mut Vec<Segment>) -> Result<(), ShellError> {
    if depth > MAX_DEPTH {
        return Err(ShellError::TooDeep(MAX_DEPTH));
    }
    if is_plain(line) {
        for simple in line.split(['\n']) {
            let words: Vec<Word> = simple.split_whitespace().map(Word::lit).collect();
            if !words.is_empty() {
                unwrap_into(words, Vec::new(), depth, out)?;
            }
        }
        return Ok(());
    }
    let tree = PARSER.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            let mut p = Parser::new();
            // The grammar is compiled in, so this fails only on a build defect (a grammar
            // built for another tree-sitter version); the command is then refused.
            p.set_language(&tree_sitter_bash::LANGUAGE.into())
                .map_err(|e| ShellError::Syntax(format!("the bash grammar does not load: {e}")))?;
            *slot = Some(p);
        }
        Ok::<_, ShellError>(slot.as_mut().and_then(|parser| parser.parse(line, None)))
    })?;
    let tree = tree.ok_or_else(|| ShellError::Syntax("parser gave no tree".into()))?;
    let root = tree.root_node();
    if root.has_error() {
        return Err(ShellError::Syntax(first_error(root, line)));
    }
    let mut w = Walker { src: line, depth, out };
    w.walk(root)
}

/// Shell builtins and keywords: a plain line starting with one needs a shell.
const SHELL_BUILTINS: &[&str] = &[
    "cd", "pushd", "popd", "export", "unset", "set", "alias", "unalias", "source", ".", "exit", "return", "eval",
    "exec", "read", "ulimit", "umask", "wait", "trap", "shift", "times", "type", "hash", "command", "builtin", "local",
    "declare", "typeset", "readonly", "let", "getopts", "jobs", "fg", "bg", ":", "if", "for", "while", "until", "case",
    "function", "select", "time",
];

/// The argument vector of a line that a shell would run as one simple external
/// command (only characters with no shell meaning, not a builtin), so it can be
/// executed without a shell in between.
pub fn plain_argv(line: &str) -> Option<Vec<&str>> {
    if !is_plain(line) {
        return None;
    }
    let argv: Vec<&str> = line.split_whitespace().collect();
    (!argv.is_empty() && !SHELL_BUILTINS.contains(&argv[0])).then_some(argv)
}

/// A line made only of characters with no shell meaning splits on whitespace exactly
/// like the shell would; this skips the parser for the common simple case.
fn is_plain(line: &str) -> bool {
    !line.is_empty()
        && line.bytes().all(|b| {
            b.is_ascii_alphanumeric()
                || matches!(
                    b,
                    b' ' | b'\t' | b'_' | b'-' | b'.' | b'/' | b'=' | b':' | b',' | b'@' | b'%' | b'+'
                )
        })
        && !line.split_whitespace().next().is_some_and(|w| w.contains('='))
}

fn first_error(node: Node, src: &str) -> String {
    if node.is_error() || node.is_missing() {
        let t = node.utf8_text(src.as_bytes()).unwrap_or("");
        return format!(
            "near `{}` (byte {})",
            t.chars().take(40).collect::<String>(),
            node.start_byte()
        );
    }
    let mut c = node.walk();
    for ch in node.children(&mut c) {
        if ch.has_error() {
            return first_error(ch, src);
        }
    }
    "syntax error".into()
}

struct Walker<'a> {
    src: &'a str,
    depth: usize,
    out: &'a mut Vec<Segment>,
}

impl<'a> Walker<'a> {
    fn text(&self, n: Node) -> &'a str {
        n.utf8_text(self.src.as_bytes()).unwrap_or("")
    }

    fn walk(&mut self, node: Node) -> Result<(), ShellError> {
        match node.kind() {
            "command" => self.command(node, &[]),
            "redirected_statement" => self.redirected(node),
            "file_redirect" => {
                // A redirect with no command (`> file`) still creates the file.
                let mut seg = Segment::default();
                self.redirect(node, &mut seg)?;
                if !seg.writes.is_empty() {
                    seg.argv = vec![Word::lit(":")];
                    seg.layers = Vec::new();
                    self.out.push(seg);
                }
                Ok(())
            }
            _ => self.children(node),
        }
    }

    fn children(&mut self, node: Node) -> Result<(), ShellError> {
        let mut c = node.walk();
        let kids: Vec<Node> = node.children(&mut c).collect();
        for k in kids {
            self.walk(k)?;
        }
        Ok(())
    }

    /// Walks the command substitutions etc. nested inside a word.
    fn nested(&mut self, node: Node) -> Result<(), ShellError> {
        match node.kind() {
            "command_substitution" | "process_substitution" => self.children(node),
            _ => {
                let mut c = node.walk();
                let kids: Vec<Node> = node.children(&mut c).collect();
                for k in kids {
                    self.nested(k)?;
                }
                Ok(())
            }
        }
    }

    fn redirected(&mut self, node: Node) -> Result<(), ShellError> {
        let mut c = node.walk();
        let redirects: Vec<Node> = node.children_by_field_name("redirect", &mut c).collect();
        let mut extra = Segment::default();
        let mut stdin_code: Option<String> = None;
        for r in &redirects {
            match r.kind() {
                "heredoc_redirect" => {
                    let mut hc = r.walk();
                    for ch in r.children(&mut hc) {
                        match ch.kind() {
                            "heredoc_body" => stdin_code = Some(self.text(ch).to_string()),
                            "file_redirect" => self.redirect(ch, &mut extra)?,
                            "pipeline" | "command" | "list" => self.walk(ch)?,
                            _ => {}
                        }
                    }
                    self.nested(*r)?;
                }
                "herestring_redirect" => {
                    let mut hc = r.walk();
                    if let Some(v) = r.named_children(&mut hc).last() {
                        stdin_code = Some(self.word(v).text);
                    }
                    self.nested(*r)?;
                }
                _ => self.redirect(*r, &mut extra)?,
            }
        }
        match node.child_by_field_name("body") {
            Some(body) if body.kind() == "command" => {
                let start = self.out.len();
                self.command_with(body, &extra.writes, stdin_code)?;
                attach_reads(&mut self.out[start..], &extra.reads);
                Ok(())
            }
            Some(body) => {
                let start = self.out.len();
                self.walk(body)?;
                attach_reads(&mut self.out[start..], &extra.reads);
                // Redirects of a compound statement apply to its output as a whole.
                if !extra.writes.is_empty() {
                    if let Some(last) = self.out.get_mut(start..).and_then(|s| s.last_mut()) {
                        last.writes.extend(extra.writes);
                    } else {
                        extra.argv = vec![Word::lit(":")];
                        extra.layers = Vec::new();
                        self.out.push(extra);
                    }
                }
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn redirect(&mut self, node: Node, seg: &mut Segment) -> Result<(), ShellError> {
        let mut op = "";
        let mut c = node.walk();
        for ch in node.children(&mut c) {
            if !ch.is_named() {
                op = self.text(ch);
            }
        }
        let mut dc = node.walk();
        let dests: Vec<Node> = node.children_by_field_name("destination", &mut dc).collect();
        for d in dests {
            self.nested(d)?;
            let w = self.word(d);
            let is_fd_dup = matches!(op, ">&" | "<&" | ">&-" | "<&-")
                && (w.text.chars().all(|c| c.is_ascii_digit()) || w.text == "-");
            let writes = matches!(op, ">" | ">>" | ">|" | "&>" | "&>>" | "<>" | ">&");
            let reads = matches!(op, "<" | "<>");
            if reads && !is_fd_dup {
                seg.reads.push(w.clone());
            }
            if writes && !is_fd_dup {
                seg.writes.push(w);
            }
        }
        Ok(())
    }

    fn command(&mut self, node: Node, redirect_writes: &[Word]) -> Result<(), ShellError> {
        self.command_with(node, redirect_writes, None)
    }

    fn command_with(
        &mut self,
        node: Node,
        redirect_writes: &[Word],
        mut stdin_code: Option<String>,
    ) -> Result<(), ShellError> {
        let mut words = Vec::new();
        let mut seg_writes: Vec<Word> = redirect_writes.to_vec();
        let mut seg_reads: Vec<Word> = Vec::new();
        let mut c = node.walk();
        let kids: Vec<Node> = node.children(&mut c).collect();
        for k in kids {
            match k.kind() {
                "variable_assignment" => self.nested(k)?,
                "file_redirect" => {
                    let mut s = Segment::default();
                    self.redirect(k, &mut s)?;
                    seg_writes.extend(s.writes);
                    seg_reads.extend(s.reads);
                }
                "herestring_redirect" => {
                    self.nested(k)?;
                    let mut hc = k.walk();
                    if let Some(v) = k.named_children(&mut hc).last() {
                        stdin_code.get_or_insert(self.word(v).text);
                    }
                }
                "subshell" => self.walk(k)?,
                "command_name" => {
                    self.nested(k)?;
                    let w = match k.named_child(0) {
                        Some(inner) => self.word(inner),
                        None => self.word(k),
                    };
                    if w.dynamic {
                        return Err(ShellError::DynamicCommand(w.text));
                    }
                    words.push(w);
                }
                _ if k.is_named() => {
                    self.nested(k)?;
                    words.push(self.word(k));
                }
                // Anonymous tokens such as `$`, `==`, `=~` inside test-like commands.
                _ => words.push(Word::lit(self.text(k))),
            }
        }
        if words.is_empty() {
            return Ok(());
        }
        let start = self.out.len();
        unwrap_into(words, seg_writes, self.depth, self.out)?;
        attach_reads(&mut self.out[start..], &seg_reads);
        if let Some(code) = stdin_code {
            // A heredoc or herestring fed to a shell or interpreter is its program.
            let prog = self.out.get(start).map(|s| s.program().to_string()).unwrap_or_default();
            let takes_stdin_program = self
                .out
                .get(start)
                .is_some_and(|s| s.argv.len() == 1 || s.argv.iter().skip(1).all(|w| w.text.starts_with('-')));
            if SHELLS.contains(&prog.as_str()) && takes_stdin_program {
                analyse_into(&code, self.depth + 1, self.out)?;
            } else if interpreter_flags(&prog).is_some() || prog == "awk" {
                if let Some(seg) = self.out.get_mut(start) {
                    seg.opaque_code.push(code);
                }
            }
        }
        Ok(())
    }

    /// The value of a word-like node after quote removal.
    fn word(&self, n: Node) -> Word {
        match n.kind() {
            "word" | "number" => Word::lit(unescape_bare(self.text(n))),
            "raw_string" => {
                let t = self.text(n);
                Word::lit(t.get(1..t.len().saturating_sub(1)).unwrap_or(""))
            }
            "ansi_c_string" => {
                let t = self.text(n);
                Word::lit(unescape_ansi_c(t.get(2..t.len().saturating_sub(1)).unwrap_or("")))
            }
            "string" | "translated_string" => {
                let mut text = String::new();
                let mut dynamic = false;
                let mut c = n.walk();
                for ch in n.named_children(&mut c) {
                    match ch.kind() {
                        "string_content" => text.push_str(&unescape_double(self.text(ch))),
                        "string" => {
                            let w = self.word(ch);
                            dynamic |= w.dynamic;
                            text.push_str(&w.text);
                        }
                        _ => {
                            dynamic = true;
                            text.push_str(self.text(ch));
                        }
                    }
                }
                Word { text, dynamic }
            }
            "concatenation" => {
                let mut text = String::new();
                let mut dynamic = false;
                let mut c = n.walk();
                for ch in n.children(&mut c) {
                    let w = self.word(ch);
                    dynamic |= w.dynamic;
                    text.push_str(&w.text);
                }
                Word { text, dynamic }
            }
            _ if !n.is_named() => Word::lit(self.text(n)),
            _ => Word {
                text: self.text(n).to_string(),
                dynamic: true,
            },
        }
    }
}

fn unescape_bare(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some('\n') | None => {}
                Some(n) => out.push(n),
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn unescape_double(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.peek() {
                Some('"' | '\\' | '$' | '`') => out.push(chars.next().unwrap_or('\\')),
                Some('\n') => {
                    chars.next();
                }
                _ => out.push('\\'),
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn unescape_ansi_c(s: &str) -> String {
    let mut out = String::new();
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('x') => {
                let hex: String = std::iter::from_fn(|| chars.next_if(|c| c.is_ascii_hexdigit()))
                    .take(2)
                    .collect();
                if let Some(ch) = u8::from_str_radix(&hex, 16).ok().map(char::from) {
                    out.push(ch);
                }
            }
            Some(d @ '0'..='7') => {
                let mut oct = String::from(d);
                while oct.len() < 3 {
                    match chars.next_if(|c| ('0'..='7').contains(c)) {
                        Some(c) => oct.push(c),
                        None => break,
                    }
                }
                if let Some(ch) = u8::from_str_radix(&oct, 8).ok().map(char::from) {
                    out.push(ch);
                }
            }
            Some(o) => out.push(o),
            None => out.push('\\'),
        }
    }
    out
}

fn interpreter_flags(prog: &str) -> Option<&'static [&'static str]> {
    let base = prog.trim_end_matches(|c: char| c.is_ascii_digit() || c == '.');
    INTERPRETERS
        .iter()
        .find(|(name, _)| *name == prog || *name == base)
        .map(|(_, f)| *f)
}

/// Options of `sudo` and `doas` that take a value.
const SUDO_VALUE_OPTIONS: &[&str] = &[
    "-u", "-g", "-C", "-D", "-h", "-p", "-r", "-t", "-U", "--user", "--group",
];

/// Options of `xargs` that take a value.
const XARGS_VALUE_OPTIONS: &[&str] = &[
    "-a",
    "-d",
    "-E",
    "-I",
    "-L",
    "-n",
    "-P",
    "-s",
    "--arg-file",
    "--delimiter",
    "--max-args",
    "--max-procs",
    "--replace",
    "--max-lines",
];

/// Peels wrappers off `words` and pushes the resulting segment(s).
fn unwrap_into(words: Vec<Word>, writes: Vec<Word>, depth: usize, out: &mut Vec<Segment>) -> Result<(), ShellError> {
    let mut peeled = Peeled {
        layers: Vec::new(),
        cur: words,
        open_args: false,
        opaque: Vec::new(),
        writes,
    };
    loop {
        // `FOO=bar cmd` after a wrapper (env FOO=bar cmd) is an assignment, not a command.
        while peeled.cur.first().is_some_and(|w| is_assignment(&w.text)) && peeled.cur.len() > 1 {
            peeled.cur.remove(0);
        }
        let Some(first) = peeled.cur.first() else { break };
        if first.dynamic {
            return Err(ShellError::DynamicCommand(first.text.clone()));
        }
        let prog = first.text.rsplit('/').next().unwrap_or(&first.text).to_string();
        match peeled.inner(&prog, depth, out)? {
            Some(next) if !next.is_empty() => peeled.layers.push(std::mem::replace(&mut peeled.cur, next)),
            _ => break,
        }
    }
    peeled.push(out);
    Ok(())
}

/// A command with the wrappers peeled off it so far.
struct Peeled {
    /// The wrappers, outermost first.
    layers: Vec<Vec<Word>>,
    /// The command inside them.
    cur: Vec<Word>,
    /// A wrapper appends arguments the line does not show (`xargs`).
    open_args: bool,
    /// Inline code of interpreters (`python -c`, `awk '...'`).
    opaque: Vec<String>,
    writes: Vec<Word>,
}

impl Peeled {
    /// The command the wrapper `prog` (the program of `cur`) runs, if it is one.
    /// Nested shell scripts, `eval` payloads and `find -exec` commands push their own
    /// segments to `out`.
    fn inner(&mut self, prog: &str, depth: usize, out: &mut Vec<Segment>) -> Result<Option<Vec<Word>>, ShellError> {
        let args = &self.cur[1..];
        let rest = |skipped: Option<(Vec<Word>, Option<String>)>| skipped.map(|(rest, _)| rest);
        Ok(match prog {
            "env" => env_inner(args),
            "timeout" => skip_options(args, &["-s", "--signal", "-k", "--kill-after"], false)
                .map(|(rest, _)| rest.into_iter().skip(1).collect()),
            "nice" => nice_inner(args),
            "nohup" | "builtin" | "time" | "setsid" | "unbuffer" => rest(skip_options(args, &[], false)),
            "command" if !self.cur.iter().any(|w| w.text == "-v" || w.text == "-V") => {
                rest(skip_options(args, &[], false))
            }
            "exec" => rest(skip_options(args, &["-a"], false)),
            "stdbuf" => rest(skip_options(
                args,
                &["-i", "-o", "-e", "--input", "--output", "--error"],
                false,
            )),
            "ionice" => rest(skip_options(args, &["-c", "-n", "-p", "--class", "--classdata"], false)),
            "sudo" | "doas" => rest(skip_options(args, SUDO_VALUE_OPTIONS, false)),
            "xargs" => self.xargs_inner(),
            "find" => {
                self.push_find_execs(depth, out)?;
                None
            }
            "eval" => {
                let payload = &self.cur[1..];
                if payload.iter().any(|w| w.dynamic) {
                    return Err(ShellError::DynamicPayload("eval".into()));
                }
                analyse_into(&join(payload), depth + 1, out)?;
                None
            }
            p if SHELLS.contains(&p) => {
                if let Some(code) = shell_payload(&self.cur)? {
                    analyse_into(&code, depth + 1, out)?;
                }
                None
            }
            p => {
                self.note_inline_code(p);
                None
            }
        })
    }

    /// `xargs CMD`: runs CMD (`echo` when none) with arguments from its input, which
    /// name the paths CMD writes if it writes any.
    fn xargs_inner(&mut self) -> Option<Vec<Word>> {
        self.open_args = true;
        skip_options(&self.cur[1..], XARGS_VALUE_OPTIONS, false)
            .map(|(rest, _)| if rest.is_empty() { vec![Word::lit("echo")] } else { rest })
            .inspect(|rest| {
                if writes_something(rest) {
                    self.writes.push(Word {
                        text: "<paths from xargs input>".into(),
                        dynamic: true,
                    });
                }
            })
    }

    /// `find ... -exec CMD`: each CMD is a segment of its own, inside the `find`, with
    /// arguments the line does not show; `-delete` and `-fprint` add writes.
    fn push_find_execs(&mut self, depth: usize, out: &mut Vec<Segment>) -> Result<(), ShellError> {
        let (execs, find_writes) = find_effects(&self.cur);
        self.writes.extend(find_writes);
        for e in execs {
            let mut sub = Vec::new();
            unwrap_into(e, Vec::new(), depth, &mut sub)?;
            for mut s in sub {
                s.open_args = true;
                s.layers.insert(0, self.cur.clone());
                out.push(s);
            }
        }
        Ok(())
    }

    /// Keeps the inline code of an interpreter (`python -c CODE`, `awk 'CODE'`).
    fn note_inline_code(&mut self, prog: &str) {
        if let Some(code) = interpreter_payload(prog, &self.cur) {
            self.opaque.push(code);
        } else if prog == "awk" || prog == "gawk" || prog == "mawk" {
            if let Some(code) = self.cur[1..].iter().find(|w| !w.text.starts_with('-')) {
                self.opaque.push(code.text.clone());
            }
        }
    }

    /// Pushes the innermost command as a segment (none when it is empty).
    fn push(self, out: &mut Vec<Segment>) {
        let Peeled {
            layers,
            cur: argv,
            open_args,
            opaque: opaque_code,
            mut writes,
        } = self;
        if argv.is_empty() {
            return;
        }
        writes.extend(command_write_targets(&argv));
        out.push(Segment {
            argv,
            layers,
            open_args,
            writes,
            reads: Vec::new(),
            opaque_code,
            cwd: None,
        });
    }
}

/// `env [OPTIONS] [NAME=VALUE...] CMD`, and the command of `env -S 'CMD ARGS'`.
fn env_inner(args: &[Word]) -> Option<Vec<Word>> {
    skip_options(args, &["-u", "--unset", "-C", "--chdir", "-S", "--split-string"], true).map(|(rest, split)| {
        match split {
            Some(s) => s.split_whitespace().map(Word::lit).chain(rest).collect(),
            None => rest,
        }
    })
}

/// `nice [-N | -n N] CMD`.
fn nice_inner(args: &[Word]) -> Option<Vec<Word>> {
    let r = if args
        .first()
        .is_some_and(|w| w.text.starts_with('-') && w.text[1..].chars().all(|c| c.is_ascii_digit()) && w.text.len() > 1)
    {
        &args[1..]
    } else {
        args
    };
    skip_options(r, &["-n", "--adjustment"], false).map(|(rest, _)| rest)
}

fn is_assignment(s: &str) -> bool {
    match s.find('=') {
        Some(i) if i > 0 => {
            s[..i].chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !s[..1].chars().all(|c| c.is_ascii_digit())
        }
        _ => false,
    }
}

/// Skips leading options (and the values of `with_value` options) and assignments.
/// Returns the rest, plus the value of `-S`/`--split-string` when `env_split` is set.
fn skip_options(args: &[Word], with_value: &[&str], env_split: bool) -> Option<(Vec<Word>, Option<String>)> {
    let mut i = 0;
    let mut split = None;
    while i < args.len() {
        let a = &args[i].text;
        if a == "--" {
            i += 1;
            break;
        }
        if !a.starts_with('-') || a == "-" {
            if is_assignment(a) {
                i += 1;
                continue;
            }
            break;
        }
        let name = a.split('=').next().unwrap_or(a);
        let takes_value = with_value.contains(&name) && !a.contains('=');
        if env_split && (name == "-S" || name == "--split-string") {
            split = if a.contains('=') {
                a.split_once('=').map(|(_, v)| v.to_string())
            } else {
                args.get(i + 1).map(|w| w.text.clone())
            };
        }
        // `-uNAME` style: value glued to a short option.
        let glued = a.len() > 2 && !a.starts_with("--") && with_value.iter().any(|w| w.len() == 2 && a.starts_with(w));
        if env_split && a.starts_with("-S") && a.len() > 2 {
            split = Some(a[2..].to_string());
        }
        i += if takes_value && !glued { 2 } else { 1 };
    }
    Some((args.get(i..).unwrap_or(&[]).to_vec(), split))
}

/// The script of `bash -c SCRIPT` (also `-lc`, `-ec`, ...). `Ok(None)` when not `-c`.
fn shell_payload(argv: &[Word]) -> Result<Option<String>, ShellError> {
    let mut it = argv.iter().skip(1);
    while let Some(w) = it.next() {
        let t = &w.text;
        if t == "--" || !t.starts_with('-') {
            return Ok(None);
        }
        if t == "-o" || t == "+o" {
            it.next();
            continue;
        }
        if !t.starts_with("--") && t[1..].contains('c') {
            return match it.next() {
                Some(p) if p.dynamic => Err(ShellError::DynamicPayload(argv[0].text.clone())),
                Some(p) => Ok(Some(p.text.clone())),
                None => Ok(None),
            };
        }
    }
    Ok(None)
}

fn interpreter_payload(prog: &str, argv: &[Word]) -> Option<String> {
    let flags = interpreter_flags(prog)?;
    let mut it = argv.iter().skip(1);
    while let Some(w) = it.next() {
        if flags.contains(&w.text.as_str()) {
            return it.next().map(|p| p.text.clone());
        }
        // Glued forms: `-c'code'`, `-e'code'`.
        for f in flags {
            if f.len() == 2 && w.text.starts_with(f) && w.text.len() > 2 {
                return Some(w.text[2..].to_string());
            }
        }
        if !w.text.starts_with('-') {
            return None;
        }
    }
    None
}

/// `find`'s `-exec`/`-execdir`/`-ok` commands and the paths `-delete` / `-fprint` write.
fn find_effects(argv: &[Word]) -> (Vec<Vec<Word>>, Vec<Word>) {
    let mut execs = Vec::new();
    let mut writes = Vec::new();
    let roots: Vec<Word> = argv[1..]
        .iter()
        .take_while(|w| !w.text.starts_with('-') && w.text != "(" && w.text != "!")
        .cloned()
        .collect();
    let roots = if roots.is_empty() { vec![Word::lit(".")] } else { roots };
    let mut i = 1;
    while i < argv.len() {
        match argv[i].text.as_str() {
            "-exec" | "-execdir" | "-ok" | "-okdir" => {
                let start = i + 1;
                let mut end = start;
                while end < argv.len() && argv[end].text != ";" && argv[end].text != "+" {
                    end += 1;
                }
                let cmd: Vec<Word> = argv[start..end].iter().filter(|w| w.text != "{}").cloned().collect();
                if writes_something(&cmd) {
                    writes.extend(roots.iter().cloned());
                }
                if !cmd.is_empty() {
                    execs.push(cmd);
                }
                i = end;
            }
            "-delete" => writes.extend(roots.iter().cloned()),
            "-fprint" | "-fprint0" | "-fprintf" | "-fls" => {
                if let Some(f) = argv.get(i + 1) {
                    writes.push(f.clone());
                }
            }
            _ => {}
        }
        i += 1;
    }
    (execs, writes)
}

/// Would `cmd` write files if given one more path argument (`find -exec`, `xargs`)?
fn writes_something(cmd: &[Word]) -> bool {
    let mut probe = cmd.to_vec();
    probe.push(Word::lit("probe"));
    !command_write_targets(&probe).is_empty()
}

/// Paths a known file-changing command writes, from its arguments.
pub fn command_write_targets(argv: &[Word]) -> Vec<Word> {
    let Some(first) = argv.first() else {
        return Vec::new();
    };
    let prog = first.text.rsplit('/').next().unwrap_or(&first.text);
    let args = Args(&argv[1..]);
    match prog {
        "rm" | "rmdir" | "unlink" | "tee" => args.positional(&[]),
        "shred" => args.positional(&["-n", "-s", "--iterations", "--size"]),
        "touch" => args.positional(&["-r", "-d", "-t", "--reference", "--date"]),
        "mkdir" | "mkfifo" | "mknod" => args.positional(&["-m", "--mode"]),
        "truncate" => args.positional(&["-s", "--size", "-r", "--reference"]),
        "chmod" | "chown" | "chgrp" | "setfacl" | "chattr" => {
            args.positional(&["--reference"]).into_iter().skip(1).collect()
        }
        "mv" => args.positional(&["-t", "--target-directory", "-S", "--suffix"]),
        "cp" | "install" | "ln" | "rsync" | "scp" => copy_targets(prog, args),
        "sed" if args.flag("-i") || args.0.iter().any(|w| w.text.starts_with("--in-place")) => {
            sed_in_place_targets(args)
        }
        "perl" if args.flag("-i") || args.flag("-p") && args.flag("-i") => args.positional(&["-e", "-E", "-M", "-I"]),
        "dd" => args
            .0
            .iter()
            .filter_map(|w| {
                w.text.strip_prefix("of=").map(|t| Word {
                    text: t.into(),
                    dynamic: w.dynamic,
                })
            })
            .collect(),
        "tar" => tar_targets(args),
        "curl" => args.values_of(&["-o", "--output"]),
        "wget" => args.values_of(&["-O", "-P"]),
        "patch" => vec![Word::lit(".")],
        "git" => git_targets(args),
        _ => Vec::new(),
    }
}

/// The arguments of a command (its program word excluded).
#[derive(Clone, Copy)]
struct Args<'a>(&'a [Word]);

impl Args<'_> {
    /// The operands: arguments that are not options (all after `--`), skipping the
    /// value after each option in `skip_values`.
    fn positional(self, skip_values: &[&str]) -> Vec<Word> {
        let args = self.0;
        let mut out = Vec::new();
        let mut i = 0;
        let mut only = false;
        while i < args.len() {
            let t = &args[i].text;
            if !only && t == "--" {
                only = true;
            } else if !only && t.starts_with('-') && t.len() > 1 {
                if skip_values.contains(&t.as_str()) {
                    i += 1;
                }
            } else {
                out.push(args[i].clone());
            }
            i += 1;
        }
        out
    }

    /// Is option `f` given, alone or (when short) in a bundle like `-ri`?
    fn flag(self, f: &str) -> bool {
        self.0.iter().any(|w| {
            w.text == f
                || (f.len() == 2 && !w.text.starts_with("--") && w.text.starts_with('-') && w.text.contains(&f[1..]))
        })
    }

    /// The word after each of the options `names`.
    fn values_of(self, names: &[&str]) -> Vec<Word> {
        self.0
            .windows(2)
            .filter(|w| names.contains(&w[0].text.as_str()))
            .map(|w| w[1].clone())
            .collect()
    }
}

/// `cp`, `install`, `ln`, `rsync`, `scp`: the target directory, the directories
/// `install -d` makes, else the last operand.
fn copy_targets(prog: &str, args: Args) -> Vec<Word> {
    if let Some(i) = args
        .0
        .iter()
        .position(|w| w.text == "-t" || w.text == "--target-directory")
    {
        args.0.get(i + 1).cloned().into_iter().collect()
    } else if let Some(t) = args.0.iter().find_map(|w| w.text.strip_prefix("--target-directory=")) {
        vec![Word::lit(t)]
    } else if prog == "install" && args.flag("-d") {
        args.positional(&["-m", "--mode", "-o", "-g", "--owner", "--group"])
    } else {
        args.positional(&["-m", "--mode", "-o", "-g", "-S", "--suffix", "-e"])
            .last()
            .cloned()
            .into_iter()
            .collect()
    }
}

/// `sed -i`: the files, after the script unless `-e`/`-f` gives it.
fn sed_in_place_targets(args: Args) -> Vec<Word> {
    let has_script_flag = args.0.iter().any(|w| {
        w.text == "-e" || w.text == "-f" || w.text.starts_with("--expression") || w.text.starts_with("--file")
    });
    let p = args.positional(&["-e", "-f", "--expression", "--file", "-l", "--line-length"]);
    p.into_iter().skip(if has_script_flag { 0 } else { 1 }).collect()
}

/// `tar`: the directory it extracts into (`.` by default) and the archive it creates.
fn tar_targets(args: Args) -> Vec<Word> {
    let mode = |letter: char, short: &str, long: &str| {
        args.0
            .first()
            .is_some_and(|w| !w.text.starts_with('-') && w.text.contains(letter))
            || args.flag(short)
            || args.0.iter().any(|w| w.text == long)
    };
    let extract = mode('x', "-x", "--extract");
    let create = mode('c', "-c", "--create");
    let args = args.0;
    let mut out = Vec::new();
    for (i, w) in args.iter().enumerate() {
        if w.text == "-C" || w.text == "--directory" {
            if let Some(d) = args.get(i + 1) {
                out.push(d.clone());
            }
        } else if let Some(d) = w.text.strip_prefix("--directory=") {
            out.push(Word::lit(d));
        } else if create && (w.text == "-f" || w.text == "--file") {
            if let Some(f) = args.get(i + 1) {
                out.push(f.clone());
            }
        }
    }
    if extract && !out.iter().any(|_| true) {
        out.push(Word::lit("."));
    }
    out
}

/// Git subcommands that write nothing.
const GIT_READ_ONLY: &[&str] = &[
    "log",
    "show",
    "diff",
    "status",
    "blame",
    "grep",
    "ls-files",
    "ls-tree",
    "rev-parse",
    "rev-list",
    "describe",
    "shortlog",
    "cat-file",
    "help",
    "version",
    "whatchanged",
    "reflog",
    "for-each-ref",
    "name-rev",
    "merge-base",
    "show-ref",
    "var",
    "",
];

/// `git`: nothing for a read-only subcommand, else the repository and work tree.
fn git_targets(args: Args) -> Vec<Word> {
    let args = args.0;
    // The subcommand is the first word after git's global options.
    let mut i = 0;
    while i < args.len() && args[i].text.starts_with('-') {
        let takes_value = matches!(
            args[i].text.as_str(),
            "-C" | "-c" | "--git-dir" | "--work-tree" | "--namespace" | "--exec-path" | "--config-env"
        );
        i += if takes_value { 2 } else { 1 };
    }
    let sub = args.get(i).map(|w| w.text.as_str()).unwrap_or("");
    if GIT_READ_ONLY.contains(&sub) {
        Vec::new()
    } else {
        // Anything else may write the object store, refs, index or work tree.
        vec![Word::lit(".git"), Word::lit(".")]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progs(line: &str) -> Vec<String> {
        analyse(line).unwrap().iter().map(|s| s.line()).collect()
    }

    #[test]
    fn splits_every_control_operator() {
        assert_eq!(progs("a && b || c; d | e & f\ng"), ["a", "b", "c", "d", "e", "f", "g"]);
        assert_eq!(progs("(a; b) && { c; }"), ["a", "b", "c"]);
        assert_eq!(
            progs("echo $(rm -rf x) `touch y`"),
            ["rm -rf x", "touch y", "echo $(rm -rf x) `touch y`"]
        );
        assert_eq!(
            progs("diff <(cat a) >(tee b)"),
            ["cat a", "tee b", "diff <(cat a) >(tee b)"]
        );
    }

    #[test]
    fn removes_quotes_and_escapes() {
        assert_eq!(progs(r#"r\m -"rf" 'x y'"#), ["rm -rf x y"]);
        assert_eq!(progs("$'\\x72m' -rf x"), ["rm -rf x"]);
        assert_eq!(progs(r#""git" "push""#), ["git push"]);
    }

    #[test]
    fn unwraps_wrappers_and_nested_shells() {
        assert_eq!(
            progs("env -i FOO=1 timeout -s KILL 5 nice -n 3 nohup git push"),
            ["git push"]
        );
        assert_eq!(
            progs("bash -c 'cd x && git push'"),
            ["cd x", "git push", "bash -c cd x && git push"]
        );
        assert_eq!(
            progs("sh -lc \"eval 'rm -rf p'\""),
            ["rm -rf p", "eval rm -rf p", "sh -lc eval 'rm -rf p'"]
        );
        assert_eq!(progs("FOO=1 BAR=2 rm x"), ["rm x"]);
        assert_eq!(progs("xargs -0 -n 1 rm -f"), ["rm -f"]);
        assert!(analyse("xargs rm").unwrap()[0].open_args);
        assert_eq!(
            progs("find . -name x -exec rm {} \\;"),
            ["rm", "find . -name x -exec rm {} ;"]
        );
        assert_eq!(progs("env -S 'rm -rf x'"), ["rm -rf x"]);
    }

    #[test]
    fn collects_write_targets() {
        let w = |line: &str| -> Vec<String> {
            analyse(line)
                .unwrap()
                .iter()
                .flat_map(|s| s.writes.iter().map(|w| w.text.clone()))
                .collect()
        };
        assert_eq!(w("echo hi > a.txt 2>&1"), ["a.txt"]);
        assert_eq!(w("cat <<EOF > prompts/x\nhello\nEOF"), ["prompts/x"]);
        assert_eq!(w("sed -i 's/a/b/' f1 f2"), ["f1", "f2"]);
        assert_eq!(w("sed -i -e s/a/b/ f1"), ["f1"]);
        assert_eq!(w("cp a b c dest/"), ["dest/"]);
        assert_eq!(w("mv a b"), ["a", "b"]);
        assert_eq!(w("find reports -delete"), ["reports"]);
        assert_eq!(w("dd if=/dev/zero of=out.bin"), ["out.bin"]);
        assert_eq!(w("{ echo a; } >> log"), ["log"]);
        assert!(w("git log").is_empty());
        assert_eq!(w("git -C . push"), [".git", "."]);
    }

    #[test]
    fn heredoc_to_shell_is_parsed() {
        assert_eq!(progs("bash <<EOF\nrm -rf prompts\nEOF"), ["bash", "rm -rf prompts"]);
        let segs = analyse("python3 <<EOF\nopen('prompts/x','w')\nEOF").unwrap();
        assert!(segs[0].opaque_code[0].contains("prompts/x"));
        let segs = analyse("python3 -c 'import os'").unwrap();
        assert_eq!(segs[0].opaque_code, ["import os"]);
    }

    #[test]
    fn refuses_what_it_cannot_understand() {
        assert!(matches!(analyse("$CMD -rf x"), Err(ShellError::DynamicCommand(_))));
        assert!(matches!(analyse("bash -c \"$X\""), Err(ShellError::DynamicPayload(_))));
        assert!(matches!(analyse("echo 'unterminated"), Err(ShellError::Syntax(_))));
        assert!(matches!(analyse("if then fi ("), Err(ShellError::Syntax(_))));
    }

    #[test]
    fn tracks_cd() {
        let segs = analyse("cd prompts && rm x").unwrap();
        assert_eq!(segs[1].cwd.as_ref().unwrap().text, "prompts");
    }
}
