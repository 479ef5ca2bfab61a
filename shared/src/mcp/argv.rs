//! Which MCP server argvs a pin can cover. A pin hashes the program and the script
//! files the argv names with their directories ([`super::digest`]). An interpreter
//! can also be told to run code no file argument names: a module Python finds from
//! the working directory (`-m`, the repository's top), inline code (`-c`, `node -e`,
//! `perl -e`), code loaded by an option (`node --require`, `perl -M`/`-I`, `ruby
//! -r`/`-I`), or a directory or a name the interpreter completes (`python3 mcp/pkg`,
//! `node mcp/server` for `server.js`); and a launcher in front of it (`env`,
//! `timeout`, `uv run`, `npm start`) starts a program the pin never sees. Anyone who
//! can push changes such code without touching a builder-owned path, so such argvs
//! are refused, by `builder mcp pin` and at a fire alike: an interpreter must name its
//! script, a regular file (of the repository, or one installed on the machine), and
//! nothing before the script may load code. Registry runners (`npx`, `uvx`, `pipx`) start a pinned package version and
//! are allowed.

use std::path::Path;

/// Interpreters whose options are judged, by family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Python,
    Node,
    Perl,
    Ruby,
    Shell,
}

/// Programs that start another program named in their own arguments.
const LAUNCHERS: [&str; 24] = [
    "env", "timeout", "nice", "ionice", "nohup", "stdbuf", "setsid", "chrt", "taskset", "time", "xargs", "flock",
    "sudo", "doas", "su", "uv", "poetry", "pipenv", "pdm", "hatch", "rye", "npm", "pnpm", "yarn",
];

/// The family of the interpreter `program` (a path or a name), if it is one.
pub fn family(program: &str) -> Option<Family> {
    let name = Path::new(program).file_name()?.to_str()?;
    let versioned = |prefix: &str| {
        name.strip_prefix(prefix)
            .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
    };
    Some(match name {
        _ if versioned("python") || versioned("pypy") => Family::Python,
        "node" | "nodejs" | "bun" | "deno" => Family::Node,
        _ if versioned("perl") => Family::Perl,
        _ if versioned("ruby") => Family::Ruby,
        "sh" | "bash" | "dash" | "zsh" | "ksh" | "mksh" | "ash" => Family::Shell,
        _ => return None,
    })
}

/// Why `argv` cannot be pinned (see the module's comment); `None` when it can.
/// `script_at` is the position of the first argument naming a regular file (of the
/// repository, pinned with its directory, or of the machine: an installed server, which
/// is the machine's as the interpreter is), if any.
pub fn unpinnable(argv: &[String], script_at: Option<usize>) -> Option<String> {
    let program = argv.first()?;
    let name = Path::new(program).file_name()?.to_str()?;
    if LAUNCHERS.contains(&name) {
        return Some(format!(
            "`{name}` starts another program, which the pin cannot judge: name the interpreter or the server's program itself"
        ));
    }
    let family = family(program)?;
    let Some(script) = script_at else {
        return Some(format!(
            "`{name}` names no script file, so what it runs (a module, inline code, a directory, a name it completes) cannot be pinned: name the server's script file"
        ));
    };
    let mut skip_next = false;
    for token in &argv[1..script] {
        if std::mem::take(&mut skip_next) || !token.starts_with('-') || token == "-" {
            continue;
        }
        let (loads, takes_next) = loads_code(family, token);
        if loads {
            return Some(format!(
                "`{token}` makes `{name}` run or load code no pinned file holds: keep the server's code in its script's directory and name the script"
            ));
        }
        skip_next = takes_next;
    }
    None
}

/// Whether the option `token` (before the script) makes an interpreter of `family`
/// run or load code, and whether it takes the next argument as its value.
fn loads_code(family: Family, token: &str) -> (bool, bool) {
    if let Some(long) = token.strip_prefix("--") {
        let (name, value) = match long.split_once('=') {
            Some((n, _)) => (n, true),
            None => (long, false),
        };
        let loading: &[&str] = match family {
            Family::Node => &["eval", "print", "require", "import", "loader", "experimental-loader"],
            Family::Ruby => &["require"],
            _ => &[],
        };
        let with_value: &[&str] = match family {
            Family::Python => &["check-hash-based-pycs"],
            Family::Node => &["title", "conditions", "inspect-port", "env-file"],
            _ => &[],
        };
        return (loading.contains(&name), !value && with_value.contains(&name));
    }
    // Short options, run together: each letter is a switch, a code flag, or one whose
    // value is the rest of the token (or the next argument when nothing is left).
    let (code, rest_is_value): (&str, &str) = match family {
        Family::Python => ("cm", "WX"),
        Family::Node => ("epr", "C"),
        Family::Perl => ("eEMmI", "CdDFilx0"),
        Family::Ruby => ("erI", "CEFKTWx0"),
        Family::Shell => ("c", "oO"),
    };
    let letters = &token[1..];
    for (i, c) in letters.char_indices() {
        if code.contains(c) {
            return (true, false);
        }
        if rest_is_value.contains(c) {
            return (false, i + c.len_utf8() == letters.len());
        }
    }
    (false, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(argv: &[&str], script_at: Option<usize>) -> Option<String> {
        let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        unpinnable(&argv, script_at)
    }

    #[test]
    fn code_no_pinned_file_holds_is_refused_and_a_named_script_passes() {
        for (argv, script_at) in [
            (&["python3", "-m", "srv"][..], None),
            (&["/usr/bin/python3", "-W", "ignore", "-m", "srv"], None),
            (&["python3", "-X", "dev", "-c", "import srv"], None),
            (&["python3", "-Ic", "x", "mcp/s/server.py"], Some(3)),
            (&["python3", "mcp/pkg"], None),
            (&["node", "--require=./lib/evil.js", "mcp/s/server.js"], Some(2)),
            (&["node", "-r", "./lib/evil.js", "mcp/s/server.js"], Some(3)),
            (&["node", "mcp/s/server"], None),
            (&["bash", "-o", "errexit", "-c", "exec python3 srv.py"], None),
            (&["perl", "-MEncode", "mcp/s/server.pl"], Some(2)),
            (&["perl", "-Ilib/perl5", "mcp/s/server.pl"], Some(2)),
            (&["ruby", "-rbundler/setup", "mcp/s/server.rb"], Some(2)),
            (&["/usr/bin/env", "python3", "mcp/s/server.py"], Some(2)),
            (&["timeout", "60", "python3", "mcp/s/server.py"], Some(3)),
            (&["uv", "run", "python", "-m", "srv"], None),
        ] {
            assert!(judge(argv, script_at).is_some(), "{argv:?} passed");
        }
        for (argv, script_at) in [
            (
                &["python3", "-Wignore::DeprecationWarning", "mcp/s/server.py"][..],
                Some(2),
            ),
            (
                &["python3", "-Xfrozen_modules=off", "-u", "mcp/s/server.py", "-c", "conf"],
                Some(3),
            ),
            (
                &["python3", "-W", "error", "-X", "importtime", "mcp/s/server.py"],
                Some(5),
            ),
            (&["perl", "-CSDA", "-w", "mcp/s/server.pl"], Some(3)),
            (&["ruby", "-W0", "mcp/s/server.rb"], Some(2)),
            (&["node", "--title", "srv", "mcp/s/server.js"], Some(3)),
            (&["/opt/bin/python-docs-mcp", "-c", "/etc/conf.yaml"], None),
            (&["npx", "-y", "tickets-mcp@1.2.3"], None),
            (&["uvx", "mcp-server-fetch==1.0"], None),
        ] {
            assert_eq!(judge(argv, script_at), None, "{argv:?}");
        }
    }
}
