//! `builder check`: lint prompts, scope and settings together and report every
//! problem with `file:line`, what is wrong and a hint. The runtime runs the same
//! loaders on every fire, so anything `check` passes, a fire can load.

use crate::diag::{DiagKind, Diagnostic};
use crate::layout::{PROMPTS_DIR, SCOPE_FILE, SETTINGS_FILE};
use crate::settings::{self, ProviderKind, RuntimeSettings, Settings};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// What [`check_repo`] found.
pub struct Checked {
    /// Every problem, sorted by file and line.
    pub problems: Vec<Diagnostic>,
    /// The settings a fire would run with, when every settings source loads; read in
    /// the same pass, so a caller that needs them does not read the files again.
    pub settings: Option<Settings>,
}

/// Every problem in the agent repo at `root`. Settings are read once.
pub fn check_repo(root: &Path) -> Checked {
    let mut diags = Vec::new();
    let linted = settings::lint(root, &mut diags);
    let provider_is_stand_in = linted
        .lenient
        .as_ref()
        .is_some_and(|l| l.stand_ins.iter().any(|k| k == "provider"));
    let loaded = linted.lenient.map(|l| l.settings);
    scope_problems(root, &mut diags);
    let stand_in = stand_in_settings();
    let s = loaded.as_ref().unwrap_or(&stand_in);
    if !provider_is_stand_in {
        replay_problems(root, loaded.as_ref(), &linted.runtime_src, &mut diags);
    }
    for path in prompt_files(root, &mut diags) {
        prompt_problems(root, &path, s, loaded.is_some(), &mut diags);
    }
    link_problems(root, loaded.as_ref(), &mut diags);
    lock_problems(root, &mut diags);
    crate::eval::case::load_cases(root, None, &mut diags);
    diags.sort_by(|a, b| (&a.file, a.line).cmp(&(&b.file, b.line)));
    Checked {
        problems: diags,
        settings: linted.settings,
    }
}

/// Builder-owned links of the work tree that the kernel would resolve outside the
/// builder-owned paths, into the write ACL, `/proc`, `/dev` or out of the repository
/// (and submodules there): the same judgement as `propose`, `approve`, `merge`, `audit`
/// and the runtime make ([`crate::review::links`]).
fn link_problems(root: &Path, loaded: Option<&RuntimeSettings>, diags: &mut Vec<Diagnostic>) {
    let owned = loaded
        .map(crate::review::owned::OwnedPaths::of_settings)
        .unwrap_or_default();
    match crate::review::links::refused_links(&crate::review::links::WorkView::new(root), &owned) {
        Ok(refused) => {
            for l in refused {
                diags.push(
                    Diagnostic::new(&l.path, 0, "link", format!("-> {}: {}", l.target, l.why)).with_hint(
                        "an approval covers a link, not what it reaches: put the content itself under the builder-owned paths",
                    ),
                );
            }
        }
        Err(e) => diags.push(Diagnostic::new(
            "",
            0,
            "link",
            format!("cannot read the work tree: {e}"),
        )),
    }
}

/// The boundary document must exist, be UTF-8 text and say something.
fn scope_problems(root: &Path, diags: &mut Vec<Diagnostic>) {
    let bytes = match crate::regular::read_within(root, Path::new(SCOPE_FILE), crate::regular::WORK_TREE_FILE_MAX) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            diags.push(Diagnostic::new(SCOPE_FILE, 0, "", format!("cannot read: {e}")));
            return;
        }
        Err(_) => {
            diags.push(
                Diagnostic::new(
                    SCOPE_FILE,
                    0,
                    "",
                    "missing: the boundary document is appended to every system prompt",
                )
                .with_hint("create scope/SCOPE.md (builder init writes an example)"),
            );
            return;
        }
    };
    match String::from_utf8(bytes) {
        Err(e) => {
            let at = e.utf8_error().valid_up_to();
            let line = 1 + e.as_bytes()[..at].iter().filter(|b| **b == b'\n').count();
            diags.push(
                Diagnostic::new(
                    SCOPE_FILE,
                    line,
                    "",
                    format!("not UTF-8 text (the first invalid byte is at offset {at})"),
                )
                .with_hint("save scope/SCOPE.md as UTF-8"),
            )
        }
        Ok(s) if s.trim().is_empty() => {
            diags.push(Diagnostic::new(SCOPE_FILE, 1, "", "the boundary document is empty"))
        }
        Ok(_) => {}
    }
}

/// The MCP lock (`settings/mcp.lock`) reads as a lock: a fire refuses one that does
/// not, so `builder check` says so first.
fn lock_problems(root: &Path, diags: &mut Vec<Diagnostic>) {
    match crate::mcp::lock::McpLock::load(root) {
        Ok(_) => {}
        Err(crate::mcp::lock::LockError::Parse { line, message, .. }) => {
            diags.push(Diagnostic::new(crate::mcp::lock::LOCK_FILE, line, "", message));
        }
        Err(e) => diags.push(Diagnostic::new(crate::mcp::lock::LOCK_FILE, 0, "", e.to_string())),
    }
}

/// A replay provider's (or fallback's) recorded trace must exist and read as a trace.
fn replay_problems(root: &Path, loaded: Option<&RuntimeSettings>, runtime_src: &str, diags: &mut Vec<Diagnostic>) {
    if let Some(rt) = loaded {
        for p in [Some(&rt.provider), rt.fallback.as_ref()].into_iter().flatten() {
            if let (ProviderKind::Replay, Some(replay)) = (p.kind, p.replay.as_ref()) {
                let line = crate::yamlpos::line_of_item(runtime_src, &["provider"], replay);
                let why = if !root.join(replay).is_file() {
                    Some(format!("replay trace `{replay}` does not exist"))
                } else {
                    crate::provider::Replay::load(root, &root.join(replay))
                        .err()
                        .map(|e| format!("replay trace: {}", e.message))
                };
                if let Some(why) = why {
                    diags.push(Diagnostic::new(SETTINGS_FILE, line, "provider.replay", why));
                }
            }
        }
    }
}

/// The task prompts (`prompts/*.md`), sorted; none is a problem.
fn prompt_files(root: &Path, diags: &mut Vec<Diagnostic>) -> Vec<PathBuf> {
    let mut prompts: Vec<_> = std::fs::read_dir(root.join(PROMPTS_DIR))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "md"))
                .collect()
        })
        .unwrap_or_default();
    prompts.sort();
    if prompts.is_empty() {
        diags.push(Diagnostic::new(
            PROMPTS_DIR,
            0,
            "",
            "no task prompts (prompts/<task>.md)",
        ));
    }
    prompts
}

/// One prompt: its name, its front matter against the settings `s` (widening judged
/// only when `s` are the repository's own settings), and the scripts it runs.
fn prompt_problems(root: &Path, path: &Path, s: &RuntimeSettings, own_settings: bool, diags: &mut Vec<Diagnostic>) {
    let task = path.file_stem().and_then(|s| s.to_str()).unwrap_or("").to_string();
    let rel = Path::new(PROMPTS_DIR).join(format!("{task}.md"));
    // The file found, whatever its name: a name that is no task's is said below.
    let found = path.strip_prefix(root).unwrap_or(&rel);
    let src = match crate::regular::read_text_within(root, found) {
        Ok(s) => s,
        Err(e) => {
            diags.push(Diagnostic::new(&rel, 0, "", format!("cannot read: {e}")));
            return;
        }
    };
    if !crate::prompt::valid_task_name(&task) {
        diags.push(Diagnostic::new(
            &rel,
            0,
            "",
            format!("`{task}` is not a valid task name (letters, digits, `-`, `_`)"),
        ));
        return;
    }
    if let Err(d) = crate::prompt::parse(&task, &rel, &src, s) {
        diags.extend(if own_settings {
            d
        } else {
            d.into_iter().filter(|d| d.kind != DiagKind::Widens).collect()
        });
    }
    let Some(front) = crate::prompt::front_matter(&rel, &src) else {
        return;
    };
    let scripts = front.prefetch.iter().map(|x| ("prefetch", &x.run)).chain(
        front
            .acceptance
            .iter()
            .filter_map(|a| a.run.as_ref().map(|r| ("acceptance", r))),
    );
    // A script outside tools/ is refused by the parse above; it is never looked for,
    // so a prompt under review cannot ask the reviewer's machine whether a file of
    // theirs exists (or is executable).
    for (what, script) in scripts.filter(|(_, s)| crate::prompt::script_under_tools(s)) {
        let line = crate::yamlpos::line_of_item(&src, &[what], script);
        match std::fs::metadata(root.join(script)) {
            Err(_) => diags.push(
                Diagnostic::new(&rel, line, what, format!("{what} script `{script}` does not exist"))
                    .with_hint("add it under tools/ or fix the path"),
            ),
            Ok(m) if m.permissions().mode() & 0o111 == 0 => diags.push(
                Diagnostic::new(&rel, line, what, format!("{what} script `{script}` is not executable"))
                    .with_hint(format!("chmod +x {script}")),
            ),
            Ok(_) => {}
        }
    }
}

/// Settings to check prompts against when the repository's own do not load.
// The YAML is a literal the loader accepts (the test
// `without_settings_widening_is_not_judged_but_other_prompt_problems_are` goes through
// here), and parsing it keeps the stand-in's defaults the loader's own. A failure is a
// bug, which is what a panic (exit 70) reports; a diagnostic would blame the user.
#[allow(clippy::expect_used)]
fn stand_in_settings() -> RuntimeSettings {
    let mut d = Vec::new();
    settings::parse_runtime_yaml("version: 1\nprovider: {kind: replay, replay: x}\n", &mut d)
        .expect("the built-in stand-in settings are valid")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scaffolded() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        crate::scaffold::init(dir.path()).unwrap();
        dir
    }

    #[test]
    fn a_scope_that_is_not_utf8_says_so_with_its_line_and_a_missing_one_says_missing() {
        let dir = scaffolded();
        std::fs::write(dir.path().join(SCOPE_FILE), b"# Scope\nok line\nbad \xff byte\n").unwrap();
        let checked = check_repo(dir.path());
        let scope: Vec<String> = checked
            .problems
            .iter()
            .filter(|d| d.file == Path::new(SCOPE_FILE))
            .map(|d| format!("{}: {}", d.line, d.message))
            .collect();
        assert_eq!(
            scope,
            vec!["3: not UTF-8 text (the first invalid byte is at offset 20)"]
        );
        std::fs::remove_file(dir.path().join(SCOPE_FILE)).unwrap();
        let checked = check_repo(dir.path());
        assert!(
            checked.problems.iter().any(|d| d.message.starts_with("missing:")),
            "{:?}",
            checked.problems
        );
    }

    #[test]
    fn a_script_outside_tools_is_refused_and_never_looked_for() {
        let dir = scaffolded();
        let outside = dir
            .path()
            .parent()
            .unwrap()
            .join(format!("outside-{}", std::process::id()));
        std::fs::write(&outside, "not a script\n").unwrap();
        let probe = |run: &str| {
            std::fs::write(
                dir.path().join("prompts/probe.md"),
                format!("---\ndescription: p\nacceptance:\n  - name: a\n    run: {run}\n---\nDo it.\n"),
            )
            .unwrap();
            let mut seen: Vec<String> = check_repo(dir.path())
                .problems
                .iter()
                .filter(|d| d.file == Path::new("prompts/probe.md"))
                .map(|d| d.message.clone())
                .collect();
            seen.sort();
            seen
        };
        // Inside tools/, the file is looked for: a missing one and a plain file say so.
        assert!(probe("tools/absent.sh")[0].contains("does not exist"));
        std::fs::write(dir.path().join("tools/plain.sh"), "echo\n").unwrap();
        assert!(probe("tools/plain.sh")[0].contains("is not executable"));
        // Outside, an existing file and a missing one read the same: refused, unlooked-for.
        let there = probe(outside.to_str().unwrap());
        let absent = probe("/nonexistent/probe.sh");
        assert_eq!(there.len(), 1, "{there:?}");
        assert!(there[0].contains("must be a script under tools/"), "{there:?}");
        assert_eq!(absent.len(), 1, "{absent:?}");
        std::fs::remove_file(&outside).unwrap();
    }

    #[test]
    fn check_hands_back_the_settings_it_read() {
        let dir = scaffolded();
        std::fs::write(
            dir.path().join("settings/extra.json"),
            r#"{"permissions": {"deny": ["Bash(curl*)"]}}"#,
        )
        .unwrap();
        let checked = check_repo(dir.path());
        assert!(checked.problems.is_empty(), "{:?}", checked.problems);
        let got = checked.settings.expect("settings load");
        let want = settings::load(dir.path()).unwrap();
        assert_eq!(got.runtime, want.runtime);
        assert_eq!(got.json_sources, vec![Path::new("settings/extra.json").to_path_buf()]);
    }

    #[test]
    fn a_broken_json_source_is_reported_once_and_withholds_the_settings() {
        let dir = scaffolded();
        std::fs::write(
            dir.path().join("settings/extra.json"),
            r#"{"permissions": {"deny": ["Bash(curl"]}}"#,
        )
        .unwrap();
        let checked = check_repo(dir.path());
        assert!(checked.settings.is_none());
        let fields: Vec<(&Path, &str)> = checked
            .problems
            .iter()
            .map(|d| (d.file.as_path(), d.field.as_str()))
            .collect();
        assert_eq!(fields, vec![(Path::new("settings/extra.json"), "permissions.deny")]);
    }

    /// What a fire would refuse with `invalid_config` is a problem `builder check` names
    /// first (helper-79): a replay trace that does not read as one, an MCP lock that
    /// does not parse, an eval case that asserts nothing, two cases of one name, and
    /// a prefetch given no time to run.
    #[test]
    fn what_a_fire_would_refuse_as_invalid_config_check_names_first() {
        let dir = scaffolded();
        let p = dir.path();
        std::fs::write(p.join("evals/digest/replay.json"), "{\"version\": 1, \"turns\": [").unwrap();
        std::fs::write(p.join("settings/mcp.lock"), "servers: 5\n").unwrap();
        std::fs::write(
            p.join("evals/digest/empty.yaml"),
            "model: scripted\nscript:\n  - text: hi\nassert: []\n",
        )
        .unwrap();
        std::fs::write(
            p.join("evals/digest/twin.yaml"),
            "name: twin\nmodel: scripted\nscript:\n  - text: hi\nassert:\n  - no_denials: true\n",
        )
        .unwrap();
        std::fs::write(
            p.join("evals/digest/twin2.yaml"),
            "name: twin\nmodel: scripted\nscript:\n  - text: hi\nassert:\n  - no_denials: true\n",
        )
        .unwrap();
        let prompt = std::fs::read_to_string(p.join("prompts/digest.md")).unwrap();
        let timed = prompt.replacen(
            "prefetch:\n",
            "prefetch:\n  - name: quick\n    run: tools/digest-context.sh\n    timeout_s: 0\n",
            1,
        );
        assert_ne!(timed, prompt, "the scaffold's prompt has a prefetch list");
        std::fs::write(p.join("prompts/digest.md"), timed).unwrap();
        let checked = check_repo(p);
        let got: Vec<(String, String)> = checked
            .problems
            .iter()
            .map(|d| (d.file.display().to_string(), d.field.clone()))
            .collect();
        for want in [
            ("settings/runtime.yaml", "provider.replay"),
            ("settings/mcp.lock", ""),
            ("evals/digest/empty.yaml", "assert"),
            ("evals/digest/twin2.yaml", "name"),
            ("prompts/digest.md", "prefetch[0].timeout_s"),
        ] {
            assert!(
                got.iter().any(|(f, x)| f == want.0 && x == want.1),
                "{want:?} not in {:?}",
                checked.problems
            );
        }
    }

    #[test]
    fn a_missing_replay_trace_points_at_its_line() {
        let dir = scaffolded();
        std::fs::remove_file(dir.path().join("evals/digest/replay.json")).unwrap();
        let checked = check_repo(dir.path());
        let d: Vec<(usize, &str)> = checked.problems.iter().map(|d| (d.line, d.field.as_str())).collect();
        assert_eq!(d, vec![(8, "provider.replay")], "{:?}", checked.problems);
    }

    #[test]
    fn without_settings_widening_is_not_judged_but_other_prompt_problems_are() {
        let dir = scaffolded();
        std::fs::remove_file(dir.path().join("settings/runtime.yaml")).unwrap();
        std::fs::write(
            dir.path().join("prompts/wide.md"),
            "---\nmodel: bigger\ntools: [teleport]\n---\nBody.\n",
        )
        .unwrap();
        let checked = check_repo(dir.path());
        let d: Vec<(&Path, &str)> = checked
            .problems
            .iter()
            .map(|d| (d.file.as_path(), d.field.as_str()))
            .collect();
        assert_eq!(
            d,
            vec![(Path::new("prompts/wide.md"), "tools"), (Path::new(SETTINGS_FILE), "")],
            "{:?}",
            checked.problems
        );
    }
}
