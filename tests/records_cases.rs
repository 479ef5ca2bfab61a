//! The record cases of issue 17, item 6, each a real `runtime fire` whose payload is
//! first proven to have run, then proven held: names git refuses (`gitmod~1`, a
//! `.gitattributes` short name, a zero-width `.git`) are never committed, and an
//! fsck-checking remote still takes every push; a nested `.git` a tool made in the
//! write ACL is removed after the call, however many entries the call made and for a
//! bare repository too; a blocked commit keeps the bytes it held,
//! whatever a later fire's model does to the uncommitted report; a directory under
//! `reports/` set to mode 000 by a tool stops no fire of an unprivileged runtime
//! (uid 65534, in a repository that user owns); a provider streaming without end is a
//! `provider_error`, not a dead runtime; the tool ledger is redacted like records; a
//! password typed in a denied command never reaches git; and a card stays small
//! whatever the model leaves behind.

use crate::records_hardening::{cmd, committed, fire, landlock_or_skip, rejected_detail, script, settings, setup};
use crate::skip::Capability;
use crate::util::*;
use serde_json::{json, Value};
use std::io::{Read, Write};

/// Every record the runtime committed (HEAD's blobs under `reports/`, `runs/` and
/// `cards/`; the test's own replay trace, which holds the model's commands, is a
/// builder file), as text.
fn everything_committed(env: &TestEnv) -> String {
    let repo = git2::Repository::open(&env.root).unwrap();
    let tree = repo.head().unwrap().peel_to_tree().unwrap();
    let mut out = String::new();
    tree.walk(git2::TreeWalkMode::PreOrder, |dir, e| {
        let runtime = ["reports/", "runs/", "cards/"].iter().any(|d| dir.starts_with(d));
        if let (true, Ok(b)) = (runtime, repo.find_blob(e.id())) {
            out.push_str(&String::from_utf8_lossy(b.content()));
        }
        git2::TreeWalkResult::Ok
    })
    .unwrap();
    out
}

/// Every file under `reports/`, `runs/` and `cards/` in the work tree, as text.
fn record_files_text(env: &TestEnv) -> String {
    let mut out = String::new();
    let mut stack: Vec<std::path::PathBuf> = ["reports", "runs", "cards"].iter().map(|d| env.root.join(d)).collect();
    while let Some(p) = stack.pop() {
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.is_dir() => stack.extend(std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path())),
            Ok(m) if m.is_file() => out.push_str(&String::from_utf8_lossy(&std::fs::read(&p).unwrap())),
            _ => {}
        }
    }
    out
}

#[test]
fn names_git_refuses_are_never_committed_and_an_fsck_checking_remote_takes_the_push() {
    if !landlock_or_skip() {
        return;
    }
    let modules = "[submodule \"x\"]\n\tpath = -x\n\turl = --upload-pack=touch /tmp/pwned\n";
    let long_line = format!("* {}\n", "a".repeat(3000));
    let env = setup(
        &[
            ("write_file", json!({"path": "reports/gitmod~1", "content": modules})),
            (
                "write_file",
                json!({"path": "reports/sub/GITMOD~4", "content": modules}),
            ),
            ("write_file", json!({"path": "reports/gitatt~1", "content": long_line})),
            (
                "write_file",
                json!({"path": "reports/.gitattributes\u{200c}", "content": long_line}),
            ),
            // git's fsck judges each part after a `\` (helper-91).
            ("write_file", json!({"path": "reports/x\\.git", "content": "x"})),
            cmd("echo ok > reports/notes.git && echo ran > reports/marker.txt"),
        ],
        "# Done",
        "",
    );
    let (code, summary) = fire(&env, &[]);
    // The payload ran: the files were made (the card names each, and the fire
    // removed them: the tools made them), the plain ones committed.
    assert_eq!(
        committed(&env, "reports/marker.txt").map(|c| c.1),
        Some(b"ran\n".to_vec()),
        "the payload did not run: {summary}"
    );
    let detail = rejected_detail(&env, &summary);
    for f in [
        "reports/gitmod~1",
        "reports/sub/GITMOD~4",
        "reports/gitatt~1",
        "reports/.gitattributes\u{200c}",
        "reports/x\\.git",
    ] {
        assert!(
            detail.contains(&format!("{f}: ")),
            "{f} was never made: the case proves nothing: {detail}"
        );
        assert!(committed(&env, f).is_none(), "{f} was committed");
        assert!(!env.root.join(f).exists(), "{f} stayed in the work tree");
    }
    assert!(
        committed(&env, "reports/notes.git").is_some(),
        "a plain name is committed"
    );
    assert_eq!(code, 5, "{summary}");
    for f in ["reports/gitmod~1", "reports/sub/GITMOD~4", "reports/gitatt~1"] {
        assert!(
            detail.contains(&format!("{f}: git metadata")),
            "{f} not named: {detail}"
        );
    }
    // A remote that checks every object takes the push.
    let remote = env.home.join("checked.git");
    let git = |args: &[&str]| crate::races::git(&env, args);
    assert!(env
        .git_in(&env.home, &["init", "-q", "--bare", remote.to_str().unwrap()])
        .status
        .success());
    assert!(env
        .git_in(&remote, &["config", "receive.fsckObjects", "true"])
        .status
        .success());
    // (`--no-verify`: the scaffold's pre-push hook runs `builder audit`, not git's fsck.)
    let pushed = git(&["push", "--no-verify", remote.to_str().unwrap(), "HEAD:refs/heads/main"]);
    assert!(pushed.status.success(), "{}", String::from_utf8_lossy(&pushed.stderr));
    assert!(git(&["fsck", "--no-progress"]).status.success());
}

/// A `.gitattributes` or `.gitignore` a model leaves under `reports/` is not only kept
/// out of the commit: git reads them from the work tree, so for the person running git
/// in the box's checkout they would set diff and merge drivers, filters and encodings
/// on the runtime's records, or hide files. The fire removes them.
#[test]
fn a_models_gitattributes_and_gitignore_are_removed_from_the_work_tree() {
    if !landlock_or_skip() {
        return;
    }
    let [write_script, run_script] = script(
        "look",
        "git check-attr diff merge -- reports/x.md > reports/seen.txt; git check-ignore reports/t/y >> reports/seen.txt\n",
    );
    let env = setup(
        &[
            (
                "write_file",
                json!({"path": "reports/.gitattributes", "content": "*.md -diff merge=ours\n"}),
            ),
            ("write_file", json!({"path": "reports/t/.gitignore", "content": "*\n"})),
            cmd("echo '# x' > reports/x.md"),
            write_script,
            run_script,
        ],
        "# Done",
        "",
    );
    let (code, summary) = fire(&env, &[]);
    // The payload ran, and git in the sandbox read both files.
    let seen = String::from_utf8(
        committed(&env, "reports/seen.txt")
            .unwrap_or_else(|| panic!("the payload did not run: {summary} {:?}", env.cards(&summary)))
            .1,
    )
    .unwrap();
    assert!(
        seen.contains("reports/x.md: diff: unset")
            && seen.contains("reports/x.md: merge: ours")
            && seen.contains("reports/t/y"),
        "{seen}"
    );
    for f in ["reports/.gitattributes", "reports/t/.gitignore"] {
        assert!(committed(&env, f).is_none(), "{f} was committed");
        assert!(!env.root.join(f).exists(), "{f} stays in the work tree");
    }
    assert!(committed(&env, "reports/x.md").is_some(), "{summary}");
    // The person's git reads none of it.
    let attrs = crate::races::git(&env, &["check-attr", "diff", "merge", "--", "reports/x.md"]);
    let attrs = String::from_utf8_lossy(&attrs.stdout);
    assert!(!attrs.contains("unset") && !attrs.contains("ours"), "{attrs}");
    assert_eq!(code, 5, "{summary}");
    let detail = rejected_detail(&env, &summary);
    for f in ["reports/.gitattributes", "reports/t/.gitignore"] {
        assert!(
            detail.contains(f) && detail.contains("removed from the work tree"),
            "{f}: {detail}"
        );
    }
}

/// The detail of the fire's card naming the nested git repositories it kept out.
fn nested_git_card(env: &TestEnv, summary: &Value) -> String {
    let cards = env.cards(summary);
    let card = cards
        .iter()
        .find(|c| c["summary"].as_str().is_some_and(|s| s.contains("nested git")))
        .unwrap_or_else(|| panic!("a card names them: {cards:?}"));
    card["detail"].as_str().unwrap().to_string()
}

#[test]
fn a_nested_git_repository_a_tool_made_is_removed_after_its_call() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(
        &[
            cmd("mkdir -p reports/n/.git/hooks && printf '[core]\\n\\tfsmonitor = touch pwned\\n' > reports/n/.git/config && mkdir -p reports/w && echo 'gitdir: /tmp/elsewhere' > reports/w/.git && mkdir -p 'reports/z/.g\u{200c}it' && ls -a reports/n reports/w > reports/seen.txt"),
            cmd("ls -a reports/n reports/w > reports/after.txt"),
        ],
        "# Done",
        "",
    );
    let (code, summary) = fire(&env, &[]);
    // The payload ran: the first call saw what it made...
    let seen = String::from_utf8(committed(&env, "reports/seen.txt").expect("the payload did not run").1).unwrap();
    assert_eq!(seen.matches(".git").count(), 2, "{seen}");
    // ...and the next call found it gone: removed right after the call.
    let after = String::from_utf8(committed(&env, "reports/after.txt").unwrap().1).unwrap();
    assert!(!after.contains(".git"), "{after}");
    for gone in ["reports/n/.git", "reports/w/.git", "reports/z/.g\u{200c}it"] {
        assert!(
            std::fs::symlink_metadata(env.root.join(gone)).is_err(),
            "{gone} is still there"
        );
    }
    assert_eq!(code, 5, "{summary}");
    let detail = nested_git_card(&env, &summary);
    assert!(
        detail.contains("reports/n/.git") && detail.contains("reports/w/.git"),
        "{detail}"
    );
}

/// Under `best_effort` on a box without user namespaces the worker has no write-back
/// (tools write the real directories) and a sweep after each writing call stands in
/// for it: it removes a bare repository's `HEAD` (beside `objects` and `refs`, or a
/// `commondir`) as well as every `.git`, one assembled over two calls included.
#[test]
fn without_namespaces_the_sweep_removes_bare_repositories_too() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(
        &[
            cmd("mkdir -p reports/bare/objects reports/bare/refs reports/c/objects reports/c/refs reports/e reports/late/objects && echo 'ref: refs/heads/main' > reports/bare/HEAD && echo 'ref: refs/heads/main' > reports/e/HEAD && echo ../c > reports/e/commondir && echo 'ref: refs/heads/main' > reports/late/HEAD && (cd reports/e && git rev-parse --git-common-dir) > reports/seen.txt"),
            cmd("mkdir reports/late/refs && ls reports/bare reports/e > reports/after.txt"),
            cmd("ls reports/late > reports/last.txt"),
        ],
        "# Done",
        "",
    );
    env.write(
        "settings/runtime.yaml",
        &env.read("settings/runtime.yaml")
            .replace("landlock: required", "landlock: best_effort"),
    );
    env.commit_all("best effort");
    // A runtime run as root refuses to go on without namespaces (its tools would run
    // as root): this one runs unprivileged then.
    let without_userns = [(shared::sandbox::SIMULATE_MISSING_ENV, "userns")];
    let (code, summary) = if crate::isolation::am_root() {
        fire_as_nobody_with(&env, &without_userns)
    } else {
        fire(&env, &without_userns)
    };
    let receipt = env.receipt(&summary);
    assert!(
        receipt["sandbox"]["rights"].to_string().contains("missing: namespaces"),
        "the sweep, not the write-back: {receipt}"
    );
    // The payload ran: git took `reports/e` for a repository borrowing `reports/c`.
    let seen = String::from_utf8(committed(&env, "reports/seen.txt").expect("the payload did not run").1).unwrap();
    assert!(seen.trim().ends_with("reports/c"), "{seen}");
    // The next call found their HEADs gone, and the third the one its call completed.
    let after = String::from_utf8(committed(&env, "reports/after.txt").unwrap().1).unwrap();
    let last = String::from_utf8(committed(&env, "reports/last.txt").unwrap().1).unwrap();
    assert!(after.contains("objects") && !after.contains("HEAD"), "{after}");
    assert!(!last.contains("HEAD"), "{last}");
    for gone in ["reports/bare/HEAD", "reports/e/HEAD", "reports/late/HEAD"] {
        assert!(!env.root.join(gone).exists(), "{gone} is still there");
    }
    assert_eq!(code, 5, "{summary}");
    let detail = nested_git_card(&env, &summary);
    for named in ["reports/bare/HEAD", "reports/e/HEAD", "reports/late/HEAD"] {
        assert!(detail.contains(named), "{named}: {detail}");
    }
}

/// Past any count a walk of the real tree stops at: a `.git` beneath 25,000 empty
/// directories (which git does not commit), and a bare repository (`HEAD`, `objects`,
/// `refs`). The write-back looks at every entry the call changed, so neither reaches
/// the repository, and the tools' next call no longer sees them.
#[test]
fn a_git_repository_past_twenty_thousand_entries_or_bare_never_reaches_the_repository() {
    if landlock_or_skip() {
        planted_repositories_never_reach_the_repository(false);
    }
}

/// Every tool result the fire's ledger (`.runtime/state.db`) holds.
pub(crate) fn ledger_results(env: &TestEnv) -> Vec<String> {
    let db = rusqlite::Connection::open(env.root.join(".runtime/state.db")).unwrap();
    let mut q = db
        .prepare("SELECT result FROM tool_ledger WHERE result IS NOT NULL")
        .unwrap();
    let rows = q.query_map([], |r| r.get(0)).unwrap();
    rows.map(Result::unwrap).collect()
}

/// Whether fires of an unprivileged runtime can be tested here: Landlock, and root
/// to hand the repository to uid 65534. Says why when not.
fn unprivileged_fires_or_skip() -> bool {
    if !landlock_or_skip() {
        return false;
    }
    if !crate::isolation::am_root() {
        crate::skip::skip(Capability::Root, "needs root to hand the repository to uid 65534");
        return false;
    }
    true
}

/// The same as uid 65534, the runtime unprivileged (the overlay then keeps its marks
/// in `user.` extended attributes).
#[test]
fn a_git_repository_past_twenty_thousand_entries_never_reaches_the_repository_of_an_unprivileged_runtime() {
    if !unprivileged_fires_or_skip() {
        return;
    }
    planted_repositories_never_reach_the_repository(true);
}

fn planted_repositories_never_reach_the_repository(as_nobody: bool) {
    let env = setup(
        &[
            script(
                "plant",
                "mkdir -p reports/many/zz/.git/hooks && printf '[core]\\n\\tfsmonitor = touch pwned\\n' > reports/many/zz/.git/config && cd reports/many && seq 1 25000 | xargs mkdir && cd ../.. && mkdir -p reports/bare/objects reports/bare/refs && echo 'ref: refs/heads/main' > reports/bare/HEAD && mkdir -p reports/c/objects reports/c/refs reports/e && printf '[core]\\n\\tpager = touch pwned\\n' > reports/c/config && echo 'ref: refs/heads/main' > reports/e/HEAD && echo ../c > reports/e/commondir && ls -a reports/many/zz reports/bare reports/e > reports/seen.txt && ls reports/many | wc -l >> reports/seen.txt && (cd reports/e && git rev-parse --git-common-dir) >> reports/seen.txt\n",
            ),
            [cmd("ls -a reports/many/zz reports/bare reports/e > reports/after.txt"), cmd("true")],
        ]
        .concat(),
        "# Done",
        "",
    );
    let (code, summary) = if as_nobody {
        fire_as_nobody(&env)
    } else {
        fire(&env, &[])
    };
    // (Read from the work tree: past 10,000 new entries under `reports/` the fire
    // commits none of them, with a card of its own.)
    let seen = std::fs::read_to_string(env.root.join("reports/seen.txt"))
        .unwrap_or_else(|e| panic!("the payload did not run ({e}): {:?}", env.cards(&summary)));
    assert!(
        seen.contains(".git") && seen.contains("HEAD") && seen.contains("25001"),
        "{seen}"
    );
    // git took `reports/e` (a `HEAD` and a `commondir`) for a repository whose objects,
    // refs and config are `reports/c`'s.
    assert!(seen.trim_end().ends_with("/c"), "{seen}");
    let after = env.read("reports/after.txt");
    assert!(!after.contains(".git") && !after.contains("HEAD"), "{after}");
    assert!(
        after.contains("objects"),
        "the rest of the bare repository stays: {after}"
    );
    for gone in ["reports/many/zz/.git", "reports/bare/HEAD", "reports/e/HEAD"] {
        assert!(
            std::fs::symlink_metadata(env.root.join(gone)).is_err(),
            "{gone} reached the repository"
        );
    }
    assert!(
        env.root.join("reports/many/25000").is_dir(),
        "the empty directories were copied"
    );
    assert_eq!(code, 5, "{summary}");
    let detail = nested_git_card(&env, &summary);
    assert!(
        detail.contains("reports/many/zz/.git: a nested git repository the model made: removed")
            && detail.contains("reports/bare: a nested git repository the model made: removed")
            && detail.contains("reports/e: a nested git repository the model made: removed"),
        "{detail}"
    );
}

#[test]
fn a_blocked_commit_keeps_the_bytes_it_held_whatever_a_later_model_does() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(&[cmd("echo first > reports/first.txt")], "# Done: the real report", "");
    // A person's git holds the index lock through the first fire.
    let lock = env.root.join(".git/index.lock");
    std::fs::write(&lock, "a person's git").unwrap();
    let (code, first) = fire(&env, &[]);
    assert_eq!(code, 1, "{first}");
    std::fs::remove_file(&lock).unwrap();
    let report = first["report"].as_str().unwrap().to_string();
    let held = std::fs::read(env.root.join(&report)).unwrap();
    // The next fire's model rewrites the uncommitted report.
    let trace = crate::records_hardening::trace_json(
        &[cmd(&format!("echo FORGED > {report} && echo ran > reports/marker.txt"))],
        "# Done",
    );
    env.write("evals/hardening/trace.json", &trace);
    let git = |args: &[&str]| {
        let out = crate::races::git(&env, args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    git(&["add", "evals/hardening/trace.json"]);
    git(&["commit", "-q", "-m", "the second fire's model"]);
    let (code, second) = fire(&env, &[]);
    assert!(
        committed(&env, "reports/marker.txt").is_some(),
        "the payload did not run: {second}"
    );
    assert_eq!(code, TestEnv::completed_code(&second), "{second}");
    // The first run's report is committed as the runtime wrote it, and the work tree
    // holds those bytes again.
    assert_eq!(
        committed(&env, &report).map(|c| c.1),
        Some(held.clone()),
        "the report was forged"
    );
    assert_eq!(std::fs::read(env.root.join(&report)).unwrap(), held);
    crate::crash_suite::check(&env).unwrap();
}

/// `runtime fire t --json` as uid 65534 in a repository handed to that user (and
/// handed back to root after): the runtime unprivileged. Needs root.
fn fire_as_nobody(env: &TestEnv) -> (i32, Value) {
    fire_as_nobody_with(env, &[])
}

/// [`fire_as_nobody`] with `extra` in the runtime's environment.
fn fire_as_nobody_with(env: &TestEnv, extra: &[(&str, &str)]) -> (i32, Value) {
    use crate::isolation::{chown_tree, fire_command, hand_to_nobody, As};
    hand_to_nobody(env);
    let out = fire_command(env, As::Nobody, extra).output().unwrap();
    chown_tree(&env.root, 0);
    let summary = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", String::from_utf8_lossy(&out.stderr)));
    (out.status.code().unwrap_or(-1), summary)
}

#[test]
fn a_directory_under_reports_set_to_mode_000_stops_no_fire_of_an_unprivileged_runtime() {
    if !unprivileged_fires_or_skip() {
        return;
    }
    let env = setup(
        &script(
            "mode",
            "d=reports/t/$(date -u +%F); mkdir -p $d && chmod 000 $d reports/t && echo ran > reports/marker.txt && stat -c %a reports/t > reports/mode.txt\n",
        ),
        "# Done",
        "",
    );
    let (code, first) = fire_as_nobody(&env);
    // The payload ran: the tool set the mode (as the same user the runtime runs as).
    let mode = String::from_utf8(committed(&env, "reports/mode.txt").expect("the payload did not run").1).unwrap();
    assert_eq!(mode.trim(), "0", "{mode}");
    // The runtime wrote and committed its report all the same.
    assert_eq!(code, TestEnv::completed_code(&first), "{first}");
    assert_eq!(first["status"], "completed", "{first}");
    let report = first["report"].as_str().unwrap();
    assert!(report.starts_with("reports/t/"), "{report}");
    assert!(committed(&env, report).is_some(), "the report is committed");
    // And the next fire of the task, too.
    let (code, second) = fire_as_nobody(&env);
    assert_eq!(second["status"], "completed", "{second}");
    assert_eq!(code, TestEnv::completed_code(&second), "{second}");
}

/// Under `sandbox.landlock: best_effort`, with a `Read` deny rule on a data file and a
/// read root (`permissions.additional_directories`) that holds a directory the
/// unprivileged runtime can enter but not list (root's, mode 711), as a shared data
/// directory on a host may. The runtime's walk for the worker's masks cannot list it.
/// That failure reached the worker as a missing namespace layer, which `best_effort`
/// lets a fire go without: the worker went on without its masks, and the payload read
/// the denied file (seen with the rule in `isolate.rs` disabled). Masks that cannot be
/// had are no layer the kernel lacks: the worker refuses in every mode, named, and
/// nothing of the fire runs. The payload is shown live first, without the deny rule.
#[test]
fn an_unlistable_directory_in_a_read_root_buys_no_fire_without_masks_under_best_effort() {
    if !unprivileged_fires_or_skip() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let env = setup(
        &script("leak", "echo payload-ran; cat data/secret.txt 2>&1; true\n"),
        "# Done",
        "",
    );
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let private = shared.path().join("private");
    std::fs::create_dir(&private).unwrap();
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o711)).unwrap();
    let yaml = env
        .read("settings/runtime.yaml")
        .replace("landlock: required", "landlock: best_effort")
        .replace(
            "allow: [\"Bash(*)\", \"Read(**)\"]",
            &format!(
                "allow: [\"Bash(*)\", \"Read(**)\"]\n  deny: [\"Read(data/secret.txt)\"]\n  additional_directories: [\"{}\"]",
                shared.path().display()
            ),
        );
    env.write("data/secret.txt", "the-secret-bytes\n");
    // What the payload printed reaches the model (and the ledger), per run.
    let printed = |env: &TestEnv, summary: &Value| -> String {
        let run = format!("{}:", summary["run_id"].as_str().unwrap());
        ledger_results(env)
            .into_iter()
            .filter(|r| r.contains(&run))
            .collect::<Vec<_>>()
            .join("\n")
    };
    // Live: with no deny rule, the payload runs and reads the file.
    let plain = env.read("settings/runtime.yaml");
    env.write(
        "settings/runtime.yaml",
        &plain.replace("landlock: required", "landlock: best_effort"),
    );
    env.commit_all("best effort, no deny rule");
    let (code, summary) = fire_as_nobody(&env);
    assert_eq!(code, TestEnv::completed_code(&summary), "{summary}");
    let seen = printed(&env, &summary);
    assert!(
        seen.contains("payload-ran") && seen.contains("the-secret-bytes"),
        "{seen}"
    );
    env.write("settings/runtime.yaml", &yaml);
    env.commit_all("best effort, a denied file, a shared read root");
    let (code, summary) = fire_as_nobody(&env);
    let seen = printed(&env, &summary);
    assert!(
        !seen.contains("the-secret-bytes"),
        "the fire read the denied file: {seen}"
    );
    assert_eq!(code, 1, "{summary} {}", env.receipt(&summary)["sandbox"]);
    assert_eq!(env.card_kinds(&summary), vec!["sandbox_unavailable"], "{summary}");
    let card = serde_json::to_string(&env.cards(&summary)).unwrap();
    assert!(
        card.contains("read deny masks") && card.contains("cannot list"),
        "{card}"
    );
    assert!(!seen.contains("payload-ran"), "the payload ran: {seen}");
}

/// `chmod 000` on `reports` itself and on a directory in it, after the model wrote an
/// output in each and a name git refuses: the worker's write-back still lists them
/// (and keeps what it copied before, where it cannot), the runtime, unprivileged,
/// still walks them, commits the outputs and names the refused file in its
/// `output_rejected` card; a report committed before stays.
#[test]
fn reports_set_to_mode_000_loses_no_output_and_no_card_of_an_unprivileged_runtime() {
    if !unprivileged_fires_or_skip() {
        return;
    }
    let env = setup(
        &[
            ("write_file", json!({"path": "reports/gitmod~1", "content": "[submodule \"x\"]\n"})),
            ("write_file", json!({"path": "reports/ok2.md", "content": "legit\n"})),
            ("write_file", json!({"path": "reports/sub/inner.md", "content": "inner\n"})),
            cmd("chmod 000 reports/sub reports && stat -c mode=%a reports; ls reports > /dev/null 2>&1; echo ls-exit=$?"),
        ],
        "# Done",
        "",
    );
    env.write("reports/earlier.md", "kept\n");
    env.commit_all("an earlier report");
    let (code, summary) = fire_as_nobody(&env);
    // The payload ran: in the tools' view `reports` was mode 0 and unreadable.
    let results = ledger_results(&env);
    assert!(
        results.iter().any(|r| r.contains("mode=0") && r.contains("ls-exit=2")),
        "the chmod took effect in the tools' view: {results:?}"
    );
    assert_eq!(summary["status"], "completed", "{summary}");
    assert_eq!(code, TestEnv::completed_code(&summary), "{summary}");
    for (path, body) in [("reports/ok2.md", "legit\n"), ("reports/sub/inner.md", "inner\n")] {
        assert_eq!(
            committed(&env, path).map(|c| c.1),
            Some(body.as_bytes().to_vec()),
            "{path} is committed: {summary}"
        );
    }
    assert!(rejected_detail(&env, &summary).contains("gitmod~1"), "{summary}");
    assert_eq!(
        committed(&env, "reports/earlier.md").map(|c| c.1),
        Some(b"kept\n".to_vec()),
        "a report committed before is still in HEAD"
    );
    assert_eq!(env.read("reports/earlier.md"), "kept\n", "and in the work tree");
    let (code, second) = fire_as_nobody(&env);
    assert_eq!(code, TestEnv::completed_code(&second), "{second}");
}

/// A model server that answers every request with a 200 whose chunked body never
/// ends; returns its port and a counter of the body bytes it sent.
fn endless_server() -> (u16, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = sent.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let counter = counter.clone();
            std::thread::spawn(move || {
                let mut stream = stream;
                let mut buf = [0u8; 65536];
                let _ = stream.read(&mut buf);
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
                if stream.write_all(head.as_bytes()).is_err() {
                    return;
                }
                let chunk = vec![b' '; 32 * 1024];
                let framed = [format!("{:x}\r\n", chunk.len()).into_bytes(), chunk, b"\r\n".to_vec()].concat();
                while stream.write_all(&framed).is_ok() {
                    counter.fetch_add(32 * 1024, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    (port, sent)
}

#[test]
fn a_provider_streaming_without_end_is_a_provider_error_with_records() {
    let (port, sent) = endless_server();
    let env = TestEnv::new();
    let provider = format!(
        "provider:\n  kind: openai\n  base_url: http://127.0.0.1:{port}/v1\n  model: test-model\n  api_key_env: {KEY_ENV}\n"
    );
    env.write(
        "settings/runtime.yaml",
        &settings_yaml(
            &provider,
            "limits:\n  provider_response_bytes: 1048576\n  max_retries: 0\n",
        ),
    );
    env.write("prompts/t.md", PLAIN_PROMPT);
    env.commit_all("an endless provider");
    let started = std::time::Instant::now();
    let (code, summary, stderr) = env.fire("t");
    // The payload ran: the server streamed past the cap before the runtime let go.
    let streamed = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(streamed > 1048576, "the server sent only {streamed} bytes");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(code, 1, "{summary}\n{stderr}");
    assert_eq!(summary["stop_reason"], "provider_error", "{summary}");
    let cards = env.cards(&summary);
    let card = cards
        .iter()
        .find(|c| c["kind"] == "provider_error")
        .expect("a provider_error card");
    assert!(
        card["detail"].as_str().unwrap().contains("provider_response_bytes"),
        "{card:?}"
    );
    assert!(summary["commit"].is_string(), "the records are committed: {summary}");
}

#[test]
fn the_ledger_is_redacted_and_a_denied_commands_password_never_reaches_git() {
    if !landlock_or_skip() {
        return;
    }
    let shaped = "sk-proj-LEDGERSHAPEDSECRET0123456789";
    let password = "hunter2-plain-77";
    let env = TestEnv::new();
    env.write("prompts/t.md", PLAIN_PROMPT);
    env.write(
        "settings/runtime.yaml",
        &settings("[\"reports/**\"]", "").replace(
            "allow: [\"Bash(*)\", \"Read(**)\"]",
            "allow: [\"Bash(*)\", \"Read(**)\"]\n  deny: [\"Bash(rm -rf*)\"]",
        ),
    );
    env.write(
        "evals/hardening/trace.json",
        &crate::records_hardening::trace_json(
            &[
                cmd(&format!("echo {shaped}")),
                cmd(&format!("rm -rf /srv/data --token {password}")),
            ],
            "# Done",
        ),
    );
    env.commit_all("a secret in a result and a password in a denied command");
    let (_, summary) = fire(&env, &[]);
    // The payload ran: the echo's result is in the ledger, the command was denied.
    let results = ledger_results(&env);
    assert!(
        results.iter().any(|r| r.contains("[REDACTED]")),
        "the echo ran and its result is in the ledger: {results:?}"
    );
    assert!(
        !results.iter().any(|r| r.contains(shaped)),
        "the ledger holds the secret: {results:?}"
    );
    let receipt = env.receipt(&summary);
    assert_eq!(receipt["tool_calls"][1]["decision"], "deny", "{receipt}");
    assert!(
        receipt["tool_calls"][1]["reason"]
            .as_str()
            .unwrap()
            .contains("arguments sha256:"),
        "{receipt}"
    );
    // Nothing committed, nor any record in the work tree, holds the password.
    let committed_text = everything_committed(&env);
    assert!(
        !committed_text.contains(password),
        "the password was committed: {}",
        committed_text
            .lines()
            .filter(|l| l.contains(password))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        !record_files_text(&env).contains(password),
        "a record holds the password"
    );
    let denied = env
        .cards(&summary)
        .into_iter()
        .find(|c| c["kind"] == "permission_denied")
        .expect("a permission_denied card");
    let text = serde_yaml::to_string(&denied).unwrap();
    assert!(text.contains("arguments sha256:") && !text.contains(password), "{text}");
}

#[test]
fn a_card_stays_small_whatever_the_model_leaves_behind() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(
        &script(
            "many",
            "mkdir -p reports/many && i=0; while [ $i -lt 3000 ]; do ln -s ../../prompts/t.md reports/many/link-with-a-rather-long-name-$i; i=$((i+1)); done; echo ran > reports/marker.txt\n",
        ),
        "# Done",
        "",
    );
    let (code, summary) = fire(&env, &[]);
    // The payload ran: the card counts the 3000 links (below).
    assert_eq!(code, 5, "{summary}");
    let card_id = summary["cards"][0].as_str().unwrap();
    let path = std::fs::read_dir(env.root.join("cards"))
        .unwrap()
        .flatten()
        .map(|d| d.path().join(format!("{card_id}.yaml")))
        .find(|p| p.exists())
        .unwrap();
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(size < 16 * 1024, "the card is {size} bytes");
    let card: serde_yaml::Value = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(card["summary"].as_str().unwrap().contains("3000 file(s)"), "{card:?}");
    assert!(card["detail"].as_str().unwrap().contains("more"), "{card:?}");
    let evidence = card["evidence"].as_sequence().unwrap();
    assert!(evidence.len() <= 21, "{} evidence lines", evidence.len());
}

/// A person removes an earlier run's report (it leaked a name); the next fire's model
/// writes that path again with its own text. The runtime's watch of its recent commits
/// takes back only the bytes it committed, never the model's (helper-81: the model's
/// text was committed as the earlier run's report).
#[test]
fn a_removed_report_rewritten_by_a_later_model_is_not_committed_as_the_record() {
    let env = TestEnv::new();
    let (code, first, _) = env.fire("digest");
    assert_eq!(code, 0, "{first}");
    let report = first["report"].as_str().unwrap().to_string();
    env.git_ok(&env.root, &["rm", "-q", &report]);
    env.git_ok(&env.root, &["commit", "-qm", "remove a report that leaked a name"]);
    let mut trace: Value = serde_json::from_str(&env.read("evals/digest/replay.json")).unwrap();
    let forged = "# Digest\n\nFORGED by a later run: all clear.\n";
    trace["turns"].as_array_mut().unwrap().insert(
        0,
        serde_json::json!({"tool_calls": [{"id": "w1", "name": "write_file", "arguments": {"path": report, "content": forged}}]}),
    );
    env.write("evals/digest/replay.json", &trace.to_string());
    env.commit_all("the next fire's model is hostile");
    let (code, second, _) = env.fire("digest");
    assert_eq!(code, TestEnv::completed_code(&second), "{second}");
    assert_eq!(
        std::fs::read_to_string(env.root.join(&report)).unwrap(),
        forged,
        "the attack ran: the model wrote the path"
    );
    let in_head = env.git_in(&env.root, &["cat-file", "-e", &format!("HEAD:{report}")]);
    assert!(!in_head.status.success(), "the model's text was committed as {report}");
}

/// `Read` deny rules hold in the read roots outside the repository for every way of
/// reading: a rule for any depth (`Read(**/.env)`) and an absolute one
/// (`Read(//<root>/secret/**)`) mask those paths in the tools' mount namespace, so
/// a script the policy cannot see into reads neither, while the rest of the root
/// stays readable (helper-84: the read roots were walked for sockets only, and both
/// were read).
#[test]
fn read_deny_rules_mask_their_paths_in_the_read_roots_too() {
    if !landlock_or_skip() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let data = tempfile::tempdir().unwrap();
    let root = data.path();
    std::fs::create_dir(root.join("secret")).unwrap();
    std::fs::write(root.join("notes.txt"), "notes-bytes\n").unwrap();
    std::fs::write(root.join(".env"), "env-bytes\n").unwrap();
    std::fs::write(root.join("secret/key"), "key-bytes\n").unwrap();
    for p in [root.to_path_buf(), root.join("secret")] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for f in ["notes.txt", ".env", "secret/key"] {
        std::fs::set_permissions(root.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let r = root.display();
    let env = setup(
        &script(
            "leak",
            &format!("echo payload-ran; cat {r}/notes.txt {r}/.env {r}/secret/key 2>&1; true\n"),
        ),
        "# Done",
        "",
    );
    let yaml = env.read("settings/runtime.yaml").replace(
        "allow: [\"Bash(*)\", \"Read(**)\"]",
        &format!(
            "allow: [\"Bash(*)\", \"Read(**)\"]\n  deny: [\"Read(**/.env)\", \"Read(/{r}/secret/**)\"]\n  additional_directories: [\"{r}\"]"
        ),
    );
    assert!(yaml.contains("additional_directories"));
    env.write("settings/runtime.yaml", &yaml);
    env.commit_all("a read root with denied paths");
    let (code, summary) = fire(&env, &[]);
    assert_eq!(code, TestEnv::completed_code(&summary), "{summary}");
    let seen = ledger_results(&env).join("\n");
    // The payload ran and read the root.
    assert!(seen.contains("payload-ran") && seen.contains("notes-bytes"), "{seen}");
    assert!(!seen.contains("env-bytes"), "the .env was read: {seen}");
    assert!(!seen.contains("key-bytes"), "the secret was read: {seen}");
}

/// An absolute `Read` deny rule is masked however the read root is spelled (with a
/// trailing `/`, or through a link), with a wildcard above the root, and when it
/// names a path inside the repository (helper-86, helper-87: each of these was read
/// by a script the policy cannot see into).
#[test]
fn absolute_read_deny_rules_are_masked_whatever_the_spelling() {
    if !landlock_or_skip() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let data = tempfile::tempdir().unwrap();
    let root = data.path().join("data");
    std::fs::create_dir_all(root.join("secret")).unwrap();
    std::fs::write(root.join("notes.txt"), "notes-bytes\n").unwrap();
    std::fs::write(root.join("secret/key"), "key-bytes\n").unwrap();
    let link = data.path().join("datalink");
    std::os::unix::fs::symlink(&root, &link).unwrap();
    for p in [data.path().to_path_buf(), root.clone(), root.join("secret")] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for f in ["notes.txt", "secret/key"] {
        std::fs::set_permissions(root.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let r = root.display().to_string();
    // A wildcard above the read root (helper-87: only a rule whose literal start named
    // the root was masked).
    let parent = data.path().display();
    for spelled in [format!("{r}/"), link.display().to_string()] {
        let env = setup(
            &script(
                "leak",
                &format!(
                    "echo payload-ran; cat {spelled}/notes.txt {spelled}/secret/key data/in-repo.txt 2>&1; true\n"
                ),
            ),
            "# Done",
            "",
        );
        env.write("data/in-repo.txt", "repo-secret-bytes\n");
        let repo = env.root.display();
        let yaml = env.read("settings/runtime.yaml").replace(
            "allow: [\"Bash(*)\", \"Read(**)\"]",
            &format!(
                "allow: [\"Bash(*)\", \"Read(**)\"]\n  deny: [\"Read(/{parent}/*/secret/**)\", \"Read(/{repo}/data/in-repo.txt)\"]\n  additional_directories: [\"{spelled}\"]"
            ),
        );
        env.write("settings/runtime.yaml", &yaml);
        env.commit_all("a read root spelled otherwise");
        let (code, summary) = fire(&env, &[]);
        assert_eq!(code, TestEnv::completed_code(&summary), "{spelled}: {summary}");
        let seen = ledger_results(&env).join("\n");
        assert!(
            seen.contains("payload-ran") && seen.contains("notes-bytes"),
            "{spelled}: {seen}"
        );
        assert!(!seen.contains("key-bytes"), "{spelled}: the secret was read: {seen}");
        assert!(
            !seen.contains("repo-secret-bytes"),
            "{spelled}: the repository's file was read: {seen}"
        );
    }
}

/// A `Read` deny rule that names a path through a person's link (one to a directory
/// of the repository, one to a read root) is masked through it, so a script that
/// reads through the link reads nothing, while the rest of the target stays readable
/// (helper-89: only a rule naming the real path was masked).
#[test]
fn read_deny_rules_through_a_persons_link_are_masked_for_scripts() {
    if !landlock_or_skip() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let outside = tempfile::tempdir().unwrap();
    let ext = outside.path().join("data");
    std::fs::create_dir_all(ext.join("secret")).unwrap();
    std::fs::write(ext.join("notes.txt"), "ext-notes-bytes\n").unwrap();
    std::fs::write(ext.join("secret/key"), "ext-key-bytes\n").unwrap();
    for p in [outside.path().to_path_buf(), ext.clone(), ext.join("secret")] {
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    for f in ["notes.txt", "secret/key"] {
        std::fs::set_permissions(ext.join(f), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let env = setup(
        &script(
            "leak",
            "echo payload-ran; cat alias/notes.txt alias/secret/key ext/notes.txt ext/secret/key 2>&1; true\n",
        ),
        "# Done",
        "",
    );
    env.write("data/notes.txt", "repo-notes-bytes\n");
    env.write("data/secret/key", "repo-key-bytes\n");
    std::os::unix::fs::symlink("data", env.root.join("alias")).unwrap();
    std::os::unix::fs::symlink(&ext, env.root.join("ext")).unwrap();
    let yaml = env.read("settings/runtime.yaml").replace(
        "allow: [\"Bash(*)\", \"Read(**)\"]",
        &format!(
            "allow: [\"Bash(*)\", \"Read(**)\"]\n  deny: [\"Read(alias/secret/**)\", \"Read(ext/secret/**)\"]\n  additional_directories: [\"{}\"]",
            ext.display()
        ),
    );
    env.write("settings/runtime.yaml", &yaml);
    env.commit_all("deny rules that name paths through links");
    let (code, summary) = fire(&env, &[]);
    assert_eq!(code, TestEnv::completed_code(&summary), "{summary}");
    let seen = ledger_results(&env).join("\n");
    // The payload ran and read through both links.
    for read in ["payload-ran", "repo-notes-bytes", "ext-notes-bytes"] {
        assert!(seen.contains(read), "{read}: {seen}");
    }
    assert!(
        !seen.contains("repo-key-bytes"),
        "read through the repository's link: {seen}"
    );
    assert!(
        !seen.contains("ext-key-bytes"),
        "read through the link to the read root: {seen}"
    );
}

/// A deny rule naming a read root that holds the repository does not mask the
/// repository with it: the fire starts, and its tools write under `reports/`
/// (helper-89: every fire failed to start its sandbox).
#[test]
fn a_denied_read_root_that_holds_the_repository_leaves_the_fire_working() {
    if !landlock_or_skip() {
        return;
    }
    let env = setup(&[cmd("echo ran > reports/ran.txt")], "# Done", "");
    let parent = env.root.parent().unwrap().display().to_string();
    let yaml = env.read("settings/runtime.yaml").replace(
        "allow: [\"Bash(*)\", \"Read(**)\"]",
        &format!(
            "allow: [\"Bash(*)\", \"Read(**)\"]\n  deny: [\"Read(/{parent})\"]\n  additional_directories: [\"{parent}\"]"
        ),
    );
    env.write("settings/runtime.yaml", &yaml);
    env.commit_all("deny the read root that holds the repository");
    let (code, summary) = fire(&env, &[]);
    assert_eq!(code, TestEnv::completed_code(&summary), "{summary}");
    assert_eq!(
        committed(&env, "reports/ran.txt").map(|c| c.1),
        Some(b"ran\n".to_vec()),
        "{summary}"
    );
}
