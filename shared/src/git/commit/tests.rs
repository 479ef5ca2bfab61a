//! The commit's crash-safety and race tests: locks held or left by dead runtimes,
//! HEAD moving under the commit, index writers racing it, records left for the next
//! commit.

use super::*;
use crate::git::locks::{intent_locks, lock_path_of, LockId, SideFiles, INTENT_PREFIX, LOCK_GRACE};
use crate::git::tests::repo;
use crate::git::*;
use crate::layout::{Owner, Ownership};
use git2::Status;

/// A repository with one engineer's commit, a record written in the work tree, and
/// options that wait briefly and keep intents in `.runtime/locks`.
fn setup() -> (tempfile::TempDir, Repository) {
    let (dir, repo) = super::tests::repo();
    std::fs::create_dir_all(dir.path().join("runs/t")).unwrap();
    std::fs::write(dir.path().join("runs/t/r1.json"), "{}").unwrap();
    (dir, repo)
}

fn opts(root: &Path) -> CommitOptions<'static> {
    CommitOptions {
        lock_wait: Duration::from_millis(300),
        ..CommitOptions::new(root)
    }
}

fn commit(repo: &Repository, o: &CommitOptions) -> Result<Oid, GitError> {
    commit_record(repo, "runs/t/r1.json", o)
}

/// The runtime's commit of the record `rel` (allowed: anything under `runs/`).
fn commit_record(repo: &Repository, rel: &str, o: &CommitOptions) -> Result<Oid, GitError> {
    commit_new_files_with(
        repo,
        &[rel.into()],
        |p| p.starts_with("runs/"),
        "runtime",
        "runtime@localhost",
        "runtime: t",
        o,
    )
}

/// The record is in HEAD's tree and in git's index as HEAD has it.
fn assert_committed_and_indexed(repo: &Repository, rel: &str) {
    let in_head = head_blob(repo, rel).unwrap().expect("record in HEAD");
    let mut index = repo.index().unwrap();
    index.read(true).unwrap();
    let entry = index.get_path(Path::new(rel), 0).expect("record in the index");
    assert_eq!(entry.id, in_head);
    let st = repo.status_file(Path::new(rel)).unwrap();
    assert_eq!(st, Status::CURRENT, "git status sees {rel} as committed");
}

#[test]
fn head_and_index_agree_after_a_commit_and_no_lock_or_intent_is_left() {
    let (dir, repo) = setup();
    let oid = commit(&repo, &opts(dir.path())).unwrap();
    assert_eq!(head_commit(&repo).unwrap(), Some(oid));
    assert_committed_and_indexed(&repo, "runs/t/r1.json");
    assert!(!repo.path().join("index.lock").exists());
    let left: Vec<_> = std::fs::read_dir(dir.path().join(".runtime/locks"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(INTENT_PREFIX))
        .collect();
    assert!(left.is_empty(), "intent records left: {left:?}");
    let reflog = repo.reflog("HEAD").unwrap();
    assert_eq!(reflog.get(0).unwrap().message().unwrap(), Some("commit: runtime: t"));
}

#[test]
fn an_engineers_staged_change_stays_staged_and_out_of_the_commit() {
    let (dir, repo) = setup();
    std::fs::write(dir.path().join("prompts/t.md"), "staged").unwrap();
    let mut idx = repo.index().unwrap();
    idx.add_path(Path::new("prompts/t.md")).unwrap();
    idx.write().unwrap();
    let oid = commit(&repo, &opts(dir.path())).unwrap();
    let tree = repo.find_commit(oid).unwrap().tree().unwrap();
    let committed = tree.get_path(Path::new("prompts/t.md")).unwrap().id();
    assert_eq!(repo.find_blob(committed).unwrap().content(), b"hi");
    let st = repo.status_file(Path::new("prompts/t.md")).unwrap();
    assert!(st.contains(Status::INDEX_MODIFIED), "still staged: {st:?}");
}

/// The race of an engineer's `echo > notes; git stash` with a fire's commit, made
/// exact: `prompts/t.md` changes, keeping its size and mtime, in the second the
/// index was written (`index_after` later than the file; the entry is "racily
/// clean" to git, which compares times by the second). ctime is not trusted here,
/// as on file systems whose ctime git cannot use, so only the racy rule can see it.
fn racy_change_survives_a_commit(index_after: Duration) {
    racy_change_survives(index_after, |repo, dir| {
        commit(repo, &opts(dir)).unwrap();
        assert_committed_and_indexed(repo, "runs/t/r1.json");
    });
}

/// [`racy_change_survives_a_commit`] for any writer of git's index.
fn racy_change_survives(index_after: Duration, write: impl FnOnce(&Repository, &Path)) {
    let (dir, repo) = setup();
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(args)
            .current_dir(dir.path())
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    git(&["config", "core.trustctime", "false"]);
    // Seconds ago (so that the fire's commit writes its index in a later second),
    // a tenth into a second (so that `index_after` stays within it).
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        - 10;
    let mtime = std::time::UNIX_EPOCH + Duration::from_secs(secs) + Duration::from_millis(100);
    let stamp = |path: &Path, at: std::time::SystemTime| {
        std::fs::File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(at)
            .unwrap()
    };
    let file = dir.path().join("prompts/t.md");
    stamp(&file, mtime);
    git(&["update-index", "--refresh"]);
    std::fs::write(&file, "ho").unwrap();
    stamp(&file, mtime);
    let index = repo.path().join("index");
    let racy = || stamp(&index, mtime + index_after);
    let changed = || git(&["diff-files", "--name-only"]);
    racy();
    assert_eq!(changed(), "prompts/t.md\n", "git sees the change before the commit");
    racy();
    write(&repo, dir.path());
    assert_eq!(
        changed(),
        "prompts/t.md\n",
        "git still sees the change after the index was written (index {index_after:?} after the file)"
    );
}

#[test]
fn a_libgit2_checkout_after_the_stamp_is_cut_hides_no_racy_change() {
    // What the box's sync and the builder's own checkouts do in a person's work
    // tree: a checkout that updates the index, then the index read from a tree
    // and written.
    racy_change_survives(Duration::from_millis(200), |repo, _| {
        cut_index_stamp(repo);
        let tree = repo.head().unwrap().peel_to_tree().unwrap();
        let mut co = git2::build::CheckoutBuilder::new();
        co.force().update_index(true).path("runs/t/none");
        repo.checkout_tree(tree.as_object(), Some(&mut co)).unwrap();
        let mut index = repo.index().unwrap();
        index.read_tree(&tree).unwrap();
        index.write().unwrap();
    });
}

#[test]
fn a_file_changed_in_the_instant_git_wrote_its_index_still_reads_as_changed_after_a_commit() {
    racy_change_survives_a_commit(Duration::ZERO);
}

#[test]
fn a_file_changed_earlier_in_the_second_git_wrote_its_index_still_reads_as_changed_after_a_commit() {
    // libgit2 compares times to the nanosecond and would take this entry as settled.
    racy_change_survives_a_commit(Duration::from_millis(200));
}

#[test]
fn a_racy_change_survives_a_commit_of_held_bytes_the_work_tree_holds() {
    // A fire's own commit: its records committed from the bytes it holds, which the
    // work tree holds too (index entries made from them, no work-tree read by
    // libgit2).
    for index_after in [Duration::ZERO, Duration::from_millis(200)] {
        racy_change_survives(index_after, |repo, dir| {
            let held = vec![("runs/t/r1.json".to_string(), b"{}".to_vec())];
            let o = CommitOptions {
                held: &held,
                ..opts(dir)
            };
            commit(repo, &o).unwrap();
            assert_committed_and_indexed(repo, "runs/t/r1.json");
        });
    }
}

#[test]
fn a_held_index_lock_is_waited_for_then_named_and_head_stays() {
    let (dir, repo) = setup();
    let before = head_commit(&repo).unwrap();
    let lock = repo.path().join("index.lock");
    std::fs::write(&lock, "").unwrap();
    let t = std::time::Instant::now();
    match commit(&repo, &opts(dir.path())) {
        Err(e @ GitError::Locked { .. }) => {
            assert!(e.to_string().contains(&lock.display().to_string()), "{e}");
        }
        other => panic!("expected Locked, got {other:?}"),
    }
    assert!(t.elapsed() >= Duration::from_millis(300), "it waited");
    assert_eq!(head_commit(&repo).unwrap(), before, "HEAD unmoved");
    assert!(lock.exists(), "a lock with no intent record is never removed");
    // Released by its holder, the next commit goes through.
    std::fs::remove_file(&lock).unwrap();
    commit(&repo, &opts(dir.path())).unwrap();
    assert_committed_and_indexed(&repo, "runs/t/r1.json");
}

/// A child process that stands for a runtime holding the lock.
fn holder() -> std::process::Child {
    std::process::Command::new("sleep").arg("30").spawn().unwrap()
}

fn write_intent(dir: &Path, pid: u32, start_time: Option<u64>, locks: Vec<IntentLock>) -> PathBuf {
    let locks_dir = dir.join(".runtime/locks");
    std::fs::create_dir_all(&locks_dir).unwrap();
    let path = locks_dir.join(format!("{INTENT_PREFIX}{pid}.json"));
    let record = IntentRecord {
        pid,
        start_time,
        locks,
        files: vec![],
        commit: None,
        saved_ns: None,
        blobs: Default::default(),
    };
    std::fs::write(&path, serde_json::to_vec(&record).unwrap()).unwrap();
    path
}

#[test]
fn records_left_for_the_next_commit_are_taken_in_while_their_bytes_are_unchanged() {
    let (dir, repo) = setup();
    let (r2, r3) = (b"{\"r\":2}".to_vec(), b"{\"r\":3}".to_vec());
    std::fs::write(dir.path().join("runs/t/r2.json"), &r2).unwrap();
    std::fs::write(dir.path().join("runs/t/r3.json"), &r3).unwrap();
    let intents = intent_dir(dir.path());
    leave_for_next_commit(&intents, &[("runs/t/r2.json".into(), r2)]).unwrap();
    leave_for_next_commit(&intents, &[("runs/t/r3.json".into(), r3)]).unwrap();
    // Edited after its run left it: not committed as someone else's bytes.
    std::fs::write(dir.path().join("runs/t/r3.json"), "forged").unwrap();
    commit(&repo, &opts(dir.path())).unwrap();
    assert_committed_and_indexed(&repo, "runs/t/r2.json");
    assert_committed_and_indexed(&repo, "runs/t/r1.json");
    assert!(head_blob(&repo, "runs/t/r3.json").unwrap().is_none());
    assert_eq!(
        std::fs::read_dir(&intents)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(INTENT_PREFIX))
            .count(),
        0
    );
}

#[test]
fn a_commit_that_fails_leaves_its_records_for_the_next_one() {
    let (dir, repo) = setup();
    let lock = repo.path().join("index.lock");
    std::fs::write(&lock, "").unwrap();
    assert!(matches!(commit(&repo, &opts(dir.path())), Err(GitError::Locked { .. })));
    std::fs::remove_file(&lock).unwrap();
    // Another record's commit takes the blocked one in.
    std::fs::write(dir.path().join("runs/t/r4.json"), "{}").unwrap();
    commit_record(&repo, "runs/t/r4.json", &opts(dir.path())).unwrap();
    assert_committed_and_indexed(&repo, "runs/t/r1.json");
    assert_committed_and_indexed(&repo, "runs/t/r4.json");
}

#[test]
fn a_live_runtimes_lock_is_kept_and_a_dead_ones_is_removed() {
    let (dir, repo) = setup();
    let lock = repo.path().join("index.lock");
    let mut child = holder();
    let pid = child.id();
    let intent = write_intent(dir.path(), pid, process_start_time(pid), vec![IntentLock::path(&lock)]);
    std::fs::write(&lock, "").unwrap();
    assert!(matches!(commit(&repo, &opts(dir.path())), Err(GitError::Locked { .. })));
    assert!(lock.exists() && intent.exists(), "the holder lives: nothing removed");
    child.kill().unwrap();
    child.wait().unwrap();
    commit(&repo, &opts(dir.path())).unwrap();
    assert!(!intent.exists(), "the dead runtime's intent is gone");
    assert!(!lock.exists());
    assert_committed_and_indexed(&repo, "runs/t/r1.json");
}

#[test]
fn a_reused_pid_is_not_taken_for_the_runtime_that_recorded_it() {
    let (dir, repo) = setup();
    let lock = repo.path().join("index.lock");
    let mut child = holder();
    let pid = child.id();
    // Same pid, another start time: the process that wrote the record is gone.
    let start = process_start_time(pid).unwrap();
    write_intent(dir.path(), pid, Some(start + 1), vec![IntentLock::path(&lock)]);
    std::fs::write(&lock, "").unwrap();
    let r = commit(&repo, &opts(dir.path()));
    child.kill().unwrap();
    child.wait().unwrap();
    r.unwrap();
    assert_committed_and_indexed(&repo, "runs/t/r1.json");
}

#[test]
fn a_dead_runtimes_intent_removes_only_its_own_locks() {
    let (dir, repo) = setup();
    let mut child = holder();
    let pid = child.id();
    let start = process_start_time(pid);
    child.kill().unwrap();
    child.wait().unwrap();
    let index_lock = repo.path().join("index.lock");
    let ref_lock = repo.path().join("refs/heads/other.lock");
    // The index lock was replaced since (another inode): someone else's now.
    std::fs::write(&index_lock, "").unwrap();
    let wrong_inode = {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(&index_lock).unwrap().ino() + 1
    };
    std::fs::write(&ref_lock, "").unwrap();
    let unnamed = repo.path().join("refs/heads/unnamed.lock");
    std::fs::write(&unnamed, "").unwrap();
    let intent = write_intent(
        dir.path(),
        pid,
        start,
        vec![
            IntentLock {
                path: index_lock.clone(),
                inode: Some(wrong_inode),
                ctime_ns: None,
            },
            IntentLock::path(&ref_lock),
        ],
    );
    let got = recover_stale_locks(&dir.path().join(".runtime/locks")).unwrap();
    assert_eq!(got.removed, vec![ref_lock.clone()]);
    assert!(index_lock.exists(), "another inode: not the dead runtime's lock");
    assert!(unnamed.exists(), "a lock no intent names is never removed");
    assert!(!ref_lock.exists() && !intent.exists());
}

#[test]
fn a_runtime_killed_while_writing_its_index_copy_leaves_no_file_in_git() {
    let (dir, repo) = setup();
    let mut child = holder();
    let pid = child.id();
    let start = process_start_time(pid);
    child.kill().unwrap();
    child.wait().unwrap();
    let index_path = repo.path().join("index");
    let index_lock = lock_path_of(&index_path);
    let ref_lock = repo.path().join("refs/heads/main.lock");
    let side = SideFiles::of(&index_path, pid);
    // Killed inside libgit2's write of the private copy: its lock, the copy, the
    // saved index and both git locks are on disk.
    let left = [
        index_lock.clone(),
        side.temp_index.clone(),
        lock_path_of(&side.temp_index),
        side.saved_index.clone(),
        ref_lock.clone(),
    ];
    for f in &left {
        std::fs::write(f, "").unwrap();
    }
    write_intent(dir.path(), pid, start, intent_locks(&index_lock, &side, &ref_lock));
    recover_stale_locks(&dir.path().join(".runtime/locks")).unwrap();
    for f in &left {
        assert!(!f.exists(), "{} left behind", f.display());
    }
}

#[test]
fn a_lock_on_a_reused_inode_is_someone_elses_and_kept() {
    let (dir, repo) = setup();
    let mut child = holder();
    let pid = child.id();
    let start = process_start_time(pid);
    child.kill().unwrap();
    child.wait().unwrap();
    // The dead runtime released its lock but died before dropping its intent; a
    // person's git took the lock since, on the very inode number (as file systems
    // reuse them): only the change time tells the two files apart.
    let lock = repo.path().join("index.lock");
    std::fs::write(&lock, "").unwrap();
    let now = LockId::of(&std::fs::metadata(&lock).unwrap());
    let recorded = IntentLock {
        path: lock.clone(),
        inode: Some(now.ino),
        ctime_ns: Some(now.ctime_ns - 1_000_000),
    };
    let intent = write_intent(dir.path(), pid, start, vec![recorded.clone()]);
    let got = recover_stale_locks(&dir.path().join(".runtime/locks")).unwrap();
    assert!(got.removed.is_empty(), "{got:?}");
    assert!(lock.exists(), "the person's lock stays");
    assert!(!intent.exists(), "the dead runtime's record is dropped");
    // The same inode and change time: the dead runtime's own lock, removed.
    let own = IntentLock {
        ctime_ns: Some(now.ctime_ns),
        ..recorded
    };
    write_intent(dir.path(), pid, start, vec![own]);
    let got = recover_stale_locks(&dir.path().join(".runtime/locks")).unwrap();
    assert_eq!(got.removed, vec![lock.clone()]);
}

#[test]
fn a_lock_newer_than_the_intent_is_kept() {
    let (dir, repo) = setup();
    let mut child = holder();
    let pid = child.id();
    let start = process_start_time(pid);
    child.kill().unwrap();
    child.wait().unwrap();
    let lock = repo.path().join("index.lock");
    let intent = write_intent(dir.path(), pid, start, vec![IntentLock::path(&lock)]);
    std::fs::write(&lock, "").unwrap();
    // Created well after the record was last written: not the dead runtime's.
    let later = std::time::SystemTime::now() + LOCK_GRACE + Duration::from_secs(5);
    std::fs::File::options()
        .write(true)
        .open(&lock)
        .unwrap()
        .set_modified(later)
        .unwrap();
    let got = recover_stale_locks(&dir.path().join(".runtime/locks")).unwrap();
    assert!(got.removed.is_empty());
    assert!(lock.exists());
    assert!(!intent.exists(), "the record of a dead process is dropped");
}

#[test]
fn head_moved_between_reading_and_updating_is_rebuilt_on_the_new_tip() {
    let (dir, repo) = setup();
    let moved = std::cell::Cell::new(None);
    let attempts = std::cell::Cell::new(0);
    let hook = |attempt: u32| {
        attempts.set(attempt);
        if attempt == 1 {
            // The engineer's commit lands between our read of HEAD and our update
            // (their git would wait for the index lock; this one writes the ref
            // directly, as `git update-ref` or another worktree does).
            let other = Repository::open(dir.path()).unwrap();
            let head = other.head().unwrap().peel_to_commit().unwrap();
            let sig = Signature::now("eng", "eng@x").unwrap();
            let tree = head.tree().unwrap();
            let id = other
                .commit(Some("HEAD"), &sig, &sig, "engineer", &tree, &[&head])
                .unwrap();
            moved.set(Some(id));
        }
    };
    let o = CommitOptions {
        before_ref_update: Some(&hook),
        ..opts(dir.path())
    };
    let oid = commit(&repo, &o).unwrap();
    assert_eq!(attempts.get(), 2, "built twice");
    let c = repo.find_commit(oid).unwrap();
    assert_eq!(Some(c.parent_id(0).unwrap()), moved.get(), "built on the new tip");
    assert_eq!(head_commit(&repo).unwrap(), Some(oid));
    assert_committed_and_indexed(&repo, "runs/t/r1.json");
}

#[test]
fn a_head_that_never_stops_moving_fails_within_the_bound() {
    let (dir, repo) = setup();
    // The engineer's `git commit` would wait for the index lock we hold: this one
    // moves the branch without git's index, as `update-ref` or another worktree does.
    let hook2 = |_: u32| {
        let other = Repository::open(dir.path()).unwrap();
        let head = other.head().unwrap().peel_to_commit().unwrap();
        let sig = Signature::now("eng", "eng@x").unwrap();
        other
            .commit(Some("HEAD"), &sig, &sig, "engineer", &head.tree().unwrap(), &[&head])
            .unwrap();
    };
    let o = CommitOptions {
        before_ref_update: Some(&hook2),
        tries: 3,
        ..opts(dir.path())
    };
    assert!(matches!(commit(&repo, &o), Err(GitError::HeadMoving { tries: 3, .. })));
    assert!(head_blob(&repo, "runs/t/r1.json").unwrap().is_none());
    assert!(!repo.path().join("index.lock").exists());
    let mut index = repo.index().unwrap();
    index.read(true).unwrap();
    assert!(
        index.get_path(Path::new("runs/t/r1.json"), 0).is_none(),
        "the index is put back: the record is not left staged"
    );
    assert!(index.get_path(Path::new("prompts/t.md"), 0).is_some());
}

#[test]
fn an_index_that_cannot_be_written_leaves_head_where_it_was() {
    let (dir, repo) = setup();
    let before = head_commit(&repo).unwrap();
    // Something occupies the private copy's path: the index cannot be written.
    let blocker = repo.path().join(format!("index.runtime-{}", std::process::id()));
    std::fs::create_dir(&blocker).unwrap();
    std::fs::write(blocker.join("x"), "").unwrap();
    assert!(commit(&repo, &opts(dir.path())).is_err());
    assert_eq!(head_commit(&repo).unwrap(), before, "HEAD unmoved");
    assert!(!repo.path().join("index.lock").exists(), "the lock is released");
    let mut index = repo.index().unwrap();
    index.read(true).unwrap();
    assert!(index.get_path(Path::new("runs/t/r1.json"), 0).is_none());
}

#[test]
fn the_index_has_the_records_before_the_branch_moves_and_the_lock_is_held_throughout() {
    // `git commit` reads HEAD, then the index, then takes the lock: whoever can see
    // the new HEAD must also see the new index.
    let (dir, repo) = setup();
    let before = head_commit(&repo).unwrap();
    let seen = std::cell::Cell::new(false);
    let hook = |_: u32| {
        let other = Repository::open(dir.path()).unwrap();
        let index = other.index().unwrap();
        assert!(index.get_path(Path::new("runs/t/r1.json"), 0).is_some(), "index first");
        assert_eq!(head_commit(&other).unwrap(), before, "then the branch");
        assert!(other.path().join("index.lock").exists(), "under the lock");
        seen.set(true);
    };
    let o = CommitOptions {
        before_ref_update: Some(&hook),
        ..opts(dir.path())
    };
    commit(&repo, &o).unwrap();
    assert!(seen.get());
    assert_committed_and_indexed(&repo, "runs/t/r1.json");
}

#[test]
fn records_a_dead_runtime_left_uncommitted_join_the_next_commit() {
    let (dir, repo) = setup();
    std::fs::write(dir.path().join("runs/t/r0.json"), "{\"dead\": true}").unwrap();
    let mut child = holder();
    let pid = child.id();
    let start = process_start_time(pid);
    child.kill().unwrap();
    child.wait().unwrap();
    let intent = write_intent(dir.path(), pid, start, vec![]);
    let mut record: IntentRecord = serde_json::from_slice(&std::fs::read(&intent).unwrap()).unwrap();
    record.files = vec!["runs/t/r0.json".into(), "prompts/t.md".into()];
    std::fs::write(&intent, serde_json::to_vec(&record).unwrap()).unwrap();
    let oid = commit(&repo, &opts(dir.path())).unwrap();
    assert_committed_and_indexed(&repo, "runs/t/r0.json");
    assert_committed_and_indexed(&repo, "runs/t/r1.json");
    let c = repo.find_commit(oid).unwrap();
    let parent = c.parent(0).unwrap();
    let blob = c.tree().unwrap().get_path(Path::new("prompts/t.md")).unwrap().id();
    assert_eq!(
        blob,
        parent.tree().unwrap().get_path(Path::new("prompts/t.md")).unwrap().id(),
        "a path outside the runtime's is never taken from an intent"
    );
}

#[test]
fn records_a_dead_runtime_committed_but_never_indexed_are_indexed_by_the_next_commit() {
    let (dir, repo) = setup();
    // A runtime moved the branch to a commit with runs/t/r0.json, then died
    // before writing the index.
    std::fs::write(dir.path().join("runs/t/r0.json"), "{}").unwrap();
    let blob = repo.blob(b"{}").unwrap();
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    let mut update = TreeUpdateBuilder::new();
    update.upsert("runs/t/r0.json", blob, FileMode::Blob);
    let tree = repo
        .find_tree(update.create_updated(&repo, &head.tree().unwrap()).unwrap())
        .unwrap();
    let sig = Signature::now("runtime", "r@x").unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "dead", &tree, &[&head]).unwrap();
    let mut child = holder();
    let pid = child.id();
    let start = process_start_time(pid);
    child.kill().unwrap();
    child.wait().unwrap();
    let intent = write_intent(dir.path(), pid, start, vec![]);
    let mut record: IntentRecord = serde_json::from_slice(&std::fs::read(&intent).unwrap()).unwrap();
    record.files = vec!["runs/t/r0.json".into()];
    std::fs::write(&intent, serde_json::to_vec(&record).unwrap()).unwrap();
    assert!(repo.index().unwrap().get_path(Path::new("runs/t/r0.json"), 0).is_none());
    commit(&repo, &opts(dir.path())).unwrap();
    assert_committed_and_indexed(&repo, "runs/t/r0.json");
    assert_committed_and_indexed(&repo, "runs/t/r1.json");
}

#[test]
fn a_record_an_engineers_stale_index_dropped_is_committed_again_by_the_next_commit() {
    let (dir, repo) = setup();
    // The engineer's `git commit` read the index before ours was written, and wrote
    // it back after: their next commit drops the record from HEAD.
    let stale = std::fs::read(repo.path().join("index")).unwrap();
    commit(&repo, &opts(dir.path())).unwrap();
    std::fs::write(repo.path().join("index"), stale).unwrap();
    let other = Repository::open(dir.path()).unwrap();
    let mut idx = other.index().unwrap();
    let tree = other.find_tree(idx.write_tree().unwrap()).unwrap();
    let head = other.head().unwrap().peel_to_commit().unwrap();
    let sig = Signature::now("eng", "eng@x").unwrap();
    other.commit(Some("HEAD"), &sig, &sig, "eng", &tree, &[&head]).unwrap();
    assert!(head_blob(&repo, "runs/t/r1.json").unwrap().is_none(), "dropped");
    std::fs::write(dir.path().join("runs/t/r2.json"), "{}").unwrap();
    commit_record(&repo, "runs/t/r2.json", &opts(dir.path())).unwrap();
    assert_committed_and_indexed(&repo, "runs/t/r1.json");
    assert_committed_and_indexed(&repo, "runs/t/r2.json");
}

#[test]
fn a_record_a_stale_index_write_back_lost_is_put_back_in_the_index() {
    let (dir, repo) = setup();
    let stale = std::fs::read(repo.path().join("index")).unwrap();
    commit(&repo, &opts(dir.path())).unwrap();
    std::fs::write(repo.path().join("index"), stale).unwrap();
    assert_ne!(repo.status_file(Path::new("runs/t/r1.json")).unwrap(), Status::CURRENT);
    std::fs::write(dir.path().join("runs/t/r2.json"), "{}").unwrap();
    commit_record(&repo, "runs/t/r2.json", &opts(dir.path())).unwrap();
    assert_committed_and_indexed(&repo, "runs/t/r1.json");
    assert_committed_and_indexed(&repo, "runs/t/r2.json");
}

#[test]
fn a_linked_worktree_commits_to_its_own_branch_and_index() {
    let (dir, repo) = setup();
    let linked = dir
        .path()
        .parent()
        .unwrap()
        .join(format!("{}-linked", dir.path().file_name().unwrap().to_string_lossy()));
    repo.worktree("wt", &linked, None).unwrap();
    let main_head = head_commit(&repo).unwrap();
    std::fs::create_dir_all(linked.join("runs/t")).unwrap();
    std::fs::write(linked.join("runs/t/r1.json"), "{}").unwrap();
    let wt = Repository::open(&linked).unwrap();
    let oid = commit(&wt, &opts(&linked)).unwrap();
    assert_eq!(head_commit(&wt).unwrap(), Some(oid));
    assert_committed_and_indexed(&wt, "runs/t/r1.json");
    assert_eq!(
        head_commit(&repo).unwrap(),
        main_head,
        "the main worktree's branch stays"
    );
    assert!(repo.index().unwrap().get_path(Path::new("runs/t/r1.json"), 0).is_none());
    let _ = std::fs::remove_dir_all(&linked);
}

#[test]
fn held_bytes_are_committed_not_the_file_the_work_tree_now_holds() {
    let (dir, repo) = repo();
    std::fs::create_dir_all(dir.path().join("reports/t")).unwrap();
    // The record was written, then replaced by a link to a builder file.
    std::os::unix::fs::symlink("../../prompts/t.md", dir.path().join("reports/t/a.md")).unwrap();
    let held = vec![("reports/t/a.md".to_string(), b"runtime bytes".to_vec())];
    let oid = commit_new_files(&repo, &["reports/t/a.md".into()], &held, |_| true, "r", "r@x", "m").unwrap();
    let tree = repo.find_commit(oid).unwrap().tree().unwrap();
    let entry = tree.get_path(Path::new("reports/t/a.md")).unwrap();
    assert_eq!(entry.filemode(), i32::from(FileMode::Blob));
    assert_eq!(repo.find_blob(entry.id()).unwrap().content(), b"runtime bytes");
    let index = repo.index().unwrap();
    let staged = index.get_path(Path::new("reports/t/a.md"), 0).unwrap();
    assert_eq!(staged.id, entry.id());
    assert_eq!(staged.mode, u32::from(FileMode::Blob));
}

#[test]
fn commits_only_new_allowed_files() {
    let (dir, repo) = repo();
    std::fs::create_dir_all(dir.path().join("reports/t")).unwrap();
    std::fs::write(dir.path().join("reports/t/a.md"), "a").unwrap();
    let own = Ownership::new(dir.path());
    let allowed = |p: &str| own.classify(p) == Owner::Runtime;
    let oid = commit_new_files(
        &repo,
        &["reports/t/a.md".into()],
        &[],
        allowed,
        "runtime",
        "runtime@localhost",
        "fire",
    )
    .unwrap();
    let c = repo.find_commit(oid).unwrap();
    assert_eq!(c.author().name().ok(), Some("runtime"));
    assert!(c.tree().unwrap().get_path(Path::new("prompts/t.md")).is_ok());
    assert!(head_blob(&repo, "reports/t/a.md").unwrap().is_some());
    let refused = commit_new_files(&repo, &["prompts/t.md".into()], &[], allowed, "r", "r@x", "m");
    assert!(matches!(refused, Err(GitError::Refused { .. })));
    let again = commit_new_files(&repo, &["reports/t/a.md".into()], &[], allowed, "r", "r@x", "m");
    assert!(
        matches!(again, Err(GitError::Refused { .. })),
        "rewriting a record is refused"
    );
    let statuses = repo.statuses(None).unwrap();
    assert!(statuses.iter().all(|s| s.path().ok() != Some("reports/t/a.md")));
}

/// A dead runtime's intent named the index lock but died before taking it; within
/// the grace time a live runtime took the lock (its mark names it): the dead record's
/// recovery leaves that lock alone.
#[test]
fn a_dead_intent_never_removes_a_lock_a_live_runtime_marked() {
    let (dir, repo) = setup();
    let lock = repo.path().join("index.lock");
    let mut child = holder();
    let (pid, start) = (child.id(), process_start_time(child.id()));
    child.kill().unwrap();
    child.wait().unwrap();
    write_intent(dir.path(), pid, start, vec![IntentLock::path(&lock)]);
    let me = std::process::id();
    let live = format!("runtime-lock {me} {}\n", process_start_time(me).unwrap());
    std::fs::write(&lock, &live).unwrap();
    let recovered = recover_stale_locks(&intent_dir(dir.path())).unwrap();
    assert!(recovered.removed.is_empty(), "{recovered:?}");
    assert_eq!(std::fs::read_to_string(&lock).unwrap(), live);
}

/// Kept records are not put back in the work tree while a person's operation is in
/// progress, and so leave the commit (which goes on if the operation ends before it
/// moves the branch): their pending set keeps its ref for a later commit.
#[test]
fn kept_records_wait_while_a_persons_operation_is_in_progress() {
    let (dir, repo) = setup();
    let kept = "runs/t/kept.json";
    let reference =
        crate::pending::keep(&repo, "r0", &[(kept.into(), b"{\"k\":1}".to_vec())], ("runtime", "r@x")).unwrap();
    let files = vec!["runs/t/r1.json".to_string()];
    let allowed = |_: &str| true;
    let mut others = Others::new(&repo, dir.path(), &files, &allowed);
    let mut taken = others.take_in_pending_refs().unwrap();
    assert_eq!(taken, vec![reference.clone()]);
    assert_eq!(others.adopted.len(), 1);
    // A person's rebase began after the commit's first check, and may end before the
    // commit moves the branch.
    std::fs::create_dir_all(repo.path().join("rebase-merge")).unwrap();
    others.put_back_in_work_tree(&mut taken, ("runtime", "r@x"));
    assert!(!dir.path().join(kept).exists(), "written into the operation");
    assert!(
        others.orphans.is_empty() && others.adopted.is_empty(),
        "a record the work tree lacks would be committed"
    );
    assert!(taken.is_empty(), "its pending set would be dropped");
    assert!(repo.find_reference(&reference).is_ok());
    // Once the operation is over, the next commit takes it in.
    std::fs::remove_dir_all(repo.path().join("rebase-merge")).unwrap();
    commit(&repo, &opts(dir.path())).unwrap();
    assert_committed_and_indexed(&repo, kept);
    assert!(dir.path().join(kept).is_file());
}

/// Kept records that cannot be put back in the work tree (a directory stands at one's
/// path) leave the commit, and their pending set keeps its ref for a later commit;
/// the commit's own record is committed.
#[test]
fn a_kept_record_that_cannot_be_put_back_waits_under_its_ref() {
    let (dir, repo) = setup();
    let kept = "runs/t/kept.json";
    let reference =
        crate::pending::keep(&repo, "r0", &[(kept.into(), b"{\"k\":1}".to_vec())], ("runtime", "r@x")).unwrap();
    std::fs::create_dir_all(dir.path().join(kept).join("in-the-way")).unwrap();
    commit(&repo, &opts(dir.path())).unwrap();
    assert_committed_and_indexed(&repo, "runs/t/r1.json");
    assert_eq!(head_blob(&repo, kept).unwrap(), None, "committed without its file");
    assert!(repo.find_reference(&reference).is_ok(), "the pending ref was dropped");
    // Once the way is clear, the next commit takes it in and drops the ref.
    std::fs::remove_dir_all(dir.path().join(kept)).unwrap();
    std::fs::write(dir.path().join("runs/t/r2.json"), "{}").unwrap();
    commit_record(&repo, "runs/t/r2.json", &opts(dir.path())).unwrap();
    assert_committed_and_indexed(&repo, kept);
    assert!(repo.find_reference(&reference).is_err());
}
