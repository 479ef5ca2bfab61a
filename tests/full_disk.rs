//! Full disks recover (issue 22, item 4). Records written before the disk filled, or
//! that could not be written at all, are kept in git (`refs/runtime/pending/`) with one
//! `commit_blocked` card naming the full file system, and the next fire, once space is
//! back, writes back whatever the work tree lacks and commits them with its own. Each
//! case runs in a private mount namespace (`unshare -m`) on a small tmpfs: at
//! `.runtime`, filled at the named point between the records' write and their commit
//! (the debug build's pause before the commit), and at `reports/`, full before the
//! fire so the report itself cannot be written. The checks of the crash suite follow:
//! nothing lost, duplicated or left uncommitted or pending, `git fsck` clean.

use crate::exit_codes::no_mount_namespace;
use crate::skip::Capability;
use crate::util::*;
use serde_json::Value;

/// Runs `script` in a private mount namespace as `sh -c script <repo> <runtime> <out>`
/// with the fire's environment; returns the directory the script wrote its outputs to.
fn in_namespace(env: &TestEnv, script: &str) -> std::path::PathBuf {
    let out = env.home.join("out");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();
    let template = env.command("runtime", &[]);
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["-m", "sh", "-c", script])
        .arg(&env.root)
        .arg(bin("runtime"))
        .arg(&out)
        .env_clear();
    for (k, v) in template.get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    let ran = cmd.output().unwrap();
    assert!(
        ran.status.success(),
        "the namespace script failed: {}{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
    out
}

fn read(out: &std::path::Path, name: &str) -> String {
    std::fs::read_to_string(out.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// The `commit_blocked` card of a blocked fire, from HEAD (it is committed by the
/// next fire, with the records it speaks for).
fn blocked_card(env: &TestEnv, summary: &Value) -> serde_yaml::Value {
    let repo = git2::Repository::open(&env.root).unwrap();
    let tree = repo.head().unwrap().peel_to_tree().unwrap();
    let mut found = None;
    tree.walk(git2::TreeWalkMode::PreOrder, |dir, e| {
        if dir.starts_with("cards/") {
            let blob = repo.find_blob(e.id()).ok();
            let card: Option<serde_yaml::Value> = blob.and_then(|b| serde_yaml::from_slice(b.content()).ok());
            if let Some(c) =
                card.filter(|c| c["kind"] == "commit_blocked" && c["run_id"] == summary["run_id"].as_str().unwrap())
            {
                found = Some(c);
            }
        }
        git2::TreeWalkResult::Ok
    })
    .unwrap();
    found.expect("the commit_blocked card is committed")
}

/// `ls-tree -r --name-only HEAD` as the namespace saw it, and the checks on what it
/// saved: both runs' receipts and reports committed, nothing pending, the records in
/// the work tree as committed.
fn check_committed(env: &TestEnv, out: &std::path::Path, first: &Value, second: &Value) {
    let tree = read(out, "tree");
    for s in [first, second] {
        for key in ["receipt", "report"] {
            let path = s[key].as_str().unwrap();
            assert!(tree.lines().any(|l| l == path), "{path} is not committed:\n{tree}");
        }
    }
    assert_eq!(read(out, "pending").trim(), "", "records still pending");
    assert_eq!(read(out, "status").trim(), "", "records not as committed");
    let fsck = std::process::Command::new("git")
        .args(["-C", env.root.to_str().unwrap(), "fsck", "--no-progress"])
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .output()
        .unwrap();
    assert!(fsck.status.success(), "{}", String::from_utf8_lossy(&fsck.stderr));
}

/// What every script does at its end, in the repository: the tree, the pending refs
/// and the records' status, saved for [`check_committed`].
const SAVE: &str = r#"git ls-tree -r --name-only HEAD > "$2/tree" &&
git for-each-ref refs/runtime/pending > "$2/pending" &&
git status --porcelain --untracked-files=all -- runs cards reports > "$2/status""#;

#[test]
fn records_written_before_the_runtime_disk_filled_are_committed_once_space_is_back() {
    if let Some(why) = no_mount_namespace() {
        crate::skip::skip(Capability::MountNamespace, &why);
        return;
    }
    let env = TestEnv::new();
    // The first fire pauses between writing its records and committing them; the
    // disk of `.runtime` fills right then (its intent record, its run row, cannot be
    // written); the second fire runs once the space is back.
    let script = format!(
        r#"set -e; mkdir -p "$0/.runtime" && mount -t tmpfs -o size=2m tmpfs "$0/.runtime" && cd "$0"
RUNTIME_TEST_PAUSE_BEFORE_COMMIT=1 "$1" fire digest --json > "$2/1.json" 2> "$2/1.err" & fire=$!
n=0; while [ ! -e .runtime/test-pause.paused ]; do n=$((n+1)); [ $n -lt 600 ] || exit 9; sleep 0.05; done
dd if=/dev/zero of=.runtime/fill bs=4k 2>/dev/null || true
df -k .runtime | tail -1 > "$2/df"
touch .runtime/test-pause.go
set +e; wait $fire; echo $? > "$2/1.code"; set -e
rm .runtime/fill .runtime/test-pause.paused .runtime/test-pause.go
"$1" fire digest --json > "$2/2.json" 2> "$2/2.err"; echo $? > "$2/2.code"
{SAVE}
cp .runtime/state.db .runtime/state.db-wal "$2/""#
    );
    let out = in_namespace(&env, &script);
    let first: Value = serde_json::from_str(&read(&out, "1.json")).unwrap();
    // The disk was full when the commit came.
    let df = read(&out, "df");
    assert!(df.split_whitespace().nth(3) == Some("0"), "the fill ran: {df}");
    assert_eq!(read(&out, "1.code").trim(), "1", "{first}\n{}", read(&out, "1.err"));
    let message = first["message"].as_str().unwrap();
    assert!(message.contains("No space left on device"), "{message}");
    assert!(message.contains("refs/runtime/pending/"), "{message}");
    let second: Value = serde_json::from_str(&read(&out, "2.json")).unwrap();
    assert_eq!(read(&out, "2.code").trim(), "0", "{second}\n{}", read(&out, "2.err"));
    check_committed(&env, &out, &first, &second);
    let card = blocked_card(&env, &first);
    assert!(
        card["detail"].as_str().unwrap().contains("No space left on device"),
        "the card says what happened: {card:?}"
    );
    for f in ["state.db", "state.db-wal"] {
        std::fs::copy(out.join(f), env.root.join(".runtime").join(f)).unwrap();
    }
    crate::crash_suite::check(&env).unwrap();
}

#[test]
fn a_report_a_full_disk_kept_from_being_written_is_written_and_committed_by_the_next_fire() {
    if let Some(why) = no_mount_namespace() {
        crate::skip::skip(Capability::MountNamespace, &why);
        return;
    }
    let env = TestEnv::new();
    let script = format!(
        r#"set -e; cd "$0"; d=$(mktemp -d); cp -a reports/. "$d"
mount -t tmpfs -o size=256k tmpfs reports && cp -a "$d/." reports/ && rm -rf "$d"
dd if=/dev/zero of=reports/fill bs=4k 2>/dev/null || true
df -k reports | tail -1 > "$2/df"
set +e; "$1" fire digest --json > "$2/1.json" 2> "$2/1.err"; echo $? > "$2/1.code"; set -e
ls -a reports > "$2/ls-full"
rm reports/fill
"$1" fire digest --json > "$2/2.json" 2> "$2/2.err"; echo $? > "$2/2.code"
{SAVE}
cat "$(sed -n 's/.*"report": "\(.*\)".*/\1/p' "$2/1.json")" > "$2/report" "#
    );
    let out = in_namespace(&env, &script);
    let df = read(&out, "df");
    assert!(df.split_whitespace().nth(3) == Some("0"), "the fill ran: {df}");
    let first: Value = serde_json::from_str(&read(&out, "1.json")).unwrap();
    assert_eq!(read(&out, "1.code").trim(), "1", "{first}\n{}", read(&out, "1.err"));
    let message = first["message"].as_str().unwrap();
    assert!(
        message.contains("could not be written") && message.contains("No space left on device"),
        "{message}"
    );
    let second: Value = serde_json::from_str(&read(&out, "2.json")).unwrap();
    assert_eq!(read(&out, "2.code").trim(), "0", "{second}\n{}", read(&out, "2.err"));
    check_committed(&env, &out, &first, &second);
    // The report the full disk kept out of the work tree was written back as the
    // runtime made it.
    assert!(
        read(&out, "report").starts_with("<!-- runtime report -->"),
        "{}",
        read(&out, "report")
    );
    let card = blocked_card(&env, &first);
    assert!(
        card["detail"].as_str().unwrap().contains("No space left on device"),
        "{card:?}"
    );
}
