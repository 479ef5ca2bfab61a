//! Signed approvals' cost on every fire under review. (1) Reading 100 approvals from
//! `refs/builder/approvals` and judging each (parsing its SSHSIG signature and
//! verifying it against a 10-key allowed-signers file), against judging them by
//! identity alone. (2) The runtime's two-key check (`review::trust`) on a repository
//! whose last builder change is followed by 10,000 records-only runtime commits: the
//! list that judges HEAD's tree is the one of the last approved tree before it, found
//! by walking back from HEAD; with the walk remembered in `.runtime/builder-tree-walk`
//! (a fire adds one commit and reads one line per builder change), against walking all 10,000 commits every time.
//! Keys and signatures are made once with the real `ssh-keygen`. (4) What reading the
//! approved bytes from git adds to a fire. (5) The walk for owed review with review
//! off, in a history of 1,000 feature branches merged, each forked just before a
//! prompt change: every merge's other parent is judged too. (6) Signatures turned on
//! over that history: whether anything below asked signatures before. (8) Two cron
//! boxes that update with a bare `git pull`: 1,000 sync merges, each of the other
//! box's line, whose later parent's run is learned to see it brings no other line.
//! (9) A chain of 10,000 builder changes alternating between two trees approved by
//! a key only an orphan root's list holds, merged over `main`: each change answers to
//! `main`'s list through the runs below it.

#![forbid(unsafe_code)]
// Benchmark code is test code: a failed setup step should panic and stop the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use git2::{Oid, Repository, Signature};
use shared::git::Person;
use shared::review::approvals::{self, Signing};
use shared::review::signing::{AllowedSigners, ApprovalRule, SignerList};
use shared::review::trust::{JudgedBy, Trust};
use std::path::{Path, PathBuf};

/// Ten key pairs and the allowed-signers text listing `r<i>@example.com` for each.
fn keys(dir: &Path) -> (Vec<PathBuf>, String) {
    let mut signers = String::new();
    let mut keys = Vec::new();
    for i in 0..10 {
        let key = dir.join(format!("k{i}"));
        let ok = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&key)
            .status()
            .expect("ssh-keygen is needed for this bench")
            .success();
        assert!(ok);
        let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
        signers.push_str(&format!("r{i}@example.com {public}"));
        keys.push(key);
    }
    (keys, signers)
}

/// Records an approval of `tree` by `r<i>`, signed with its key.
fn approve_tree(repo: &Repository, keys: &[PathBuf], i: usize, tree: Oid, head: Oid) {
    let who = Person {
        name: format!("R{i}"),
        email: format!("r{i}@example.com"),
    };
    let signing = Signing {
        key: keys[i].clone(),
        program: "ssh-keygen".into(),
    };
    let body = approvals::signed_body("p", tree, head, &who, Some(&signing)).unwrap();
    approvals::write(repo, body, &who).unwrap();
}

/// Records `r<i>`'s signed approval of the builder tree of `commit`.
fn approve(repo: &Repository, keys: &[PathBuf], i: usize, commit: Oid) {
    let tree = shared::review::builder_tree_of_commit(repo, commit).unwrap();
    approve_tree(repo, keys, i, tree, commit);
}

/// The first commit on HEAD: `signers` as `settings/allowed_signers` and a prompt,
/// approved by `r0`.
fn signed_root(repo: &Repository, keys: &[PathBuf], signers: &str) -> Oid {
    let root = commit(
        repo,
        &[
            ("settings/allowed_signers", signers.as_bytes()),
            ("prompts/a.md", b"v0"),
        ],
        "eng",
    );
    approve(repo, keys, 0, root);
    root
}

/// A commit on HEAD with `files` added or replaced.
fn commit(repo: &Repository, files: &[(&str, &[u8])], who: &str) -> Oid {
    let parent = repo.head().ok().and_then(|h| h.peel_to_commit().ok());
    let empty = repo
        .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
        .unwrap();
    let base = parent.as_ref().map(|p| p.tree().unwrap()).unwrap_or(empty);
    let mut update = git2::build::TreeUpdateBuilder::new();
    for (path, body) in files {
        update.upsert(*path, repo.blob(body).unwrap(), git2::FileMode::Blob);
    }
    let tree = repo.find_tree(update.create_updated(repo, &base).unwrap()).unwrap();
    let sig = Signature::now(who, &format!("{who}@localhost")).unwrap();
    let parents: Vec<&git2::Commit> = parent.iter().collect();
    repo.commit(Some("HEAD"), &sig, &sig, "c", &tree, &parents).unwrap()
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let (keys, signers) = keys(dir.path());

    // (1) 100 signed approvals, judged by one list.
    let repo = Repository::init(dir.path().join("repo")).unwrap();
    let blob = repo.blob(b"x").unwrap();
    for n in 0..100 {
        let mut tb = repo.treebuilder(None).unwrap();
        tb.insert(format!("f{n}"), blob, 0o100644).unwrap();
        let tree = tb.write().unwrap();
        approve_tree(&repo, &keys, n % 10, tree, tree);
    }
    let signed = ApprovalRule {
        runtime_email: "runtime@localhost".into(),
        signers: Some(SignerList::Operator(
            AllowedSigners::parse(Path::new("allowed_signers"), &signers).unwrap(),
        )),
    };
    let unsigned = ApprovalRule::unsigned("runtime@localhost");
    let judge_all = |rule: &ApprovalRule| Trust::new(&repo, rule.clone()).unwrap().counting_trees().unwrap();
    assert_eq!(judge_all(&signed).len(), 100);
    c.bench_function("approvals: read and verify 100 signed (10 keys)", |b| {
        b.iter(|| judge_all(&signed))
    });
    c.bench_function("approvals: read 100 by identity only", |b| {
        b.iter(|| judge_all(&unsigned))
    });

    // (2) The two-key check after 10,000 records-only commits.
    let root = dir.path().join("agent");
    let repo = Repository::init(&root).unwrap();
    let c0 = signed_root(&repo, &keys, &signers);
    let c1 = commit(&repo, &[("prompts/a.md", b"v1")], "eng");
    approve(&repo, &keys, 1, c1);
    // Records as a fire writes them: a directory per day (100 fires a day here).
    let record = |i: usize| format!("runs/t/2026-{:02}-{:02}/{i}.json", 1 + i / 3100, 1 + (i / 100) % 31);
    for i in 0..10_000 {
        commit(&repo, &[(&record(i), b"{}")], "runtime");
    }
    let rule = ApprovalRule {
        runtime_email: "runtime@localhost".into(),
        signers: Some(SignerList::Repository("settings/allowed_signers".into())),
    };
    let head = repo.head().unwrap().peel_to_commit().unwrap().id();
    let check = |memo: bool, at: Oid| {
        let judged = Trust::new(&repo, rule.clone())
            .unwrap()
            .remembering(memo.then_some(root.as_path()))
            .commit(at)
            .unwrap();
        assert!(judged.approval.is_some(), "{:?}", judged.rejected);
        assert_eq!(
            judged.by,
            JudgedBy::Trusted(c0),
            "HEAD's tree is judged by the list before it"
        );
    };
    // The first fire under the memo walks once and remembers.
    check(true, head);
    c.bench_function("two-key check, 10,000 records-only commits since the last builder change: a fire's new commit, walk remembered in .runtime", |b| {
        let mut n = 10_000;
        // Each input is a new commit on the last; the routines run in order, so each
        // finds its parent remembered by the one before.
        b.iter_batched(
            || {
                n += 1;
                commit(&repo, &[(&record(n), b"{}")], "runtime")
            },
            |at| check(true, at),
            BatchSize::SmallInput,
        )
    });
    c.bench_function(
        "two-key check, 10,000 records-only commits since the last builder change: walking them all (no memo)",
        |b| b.iter(|| check(false, head)),
    );
    // (3) What a fire adds for the attacks of tests/two_key_attacks.rs: the links
    // out of the builder-owned directories (every fire under review), and, with
    // review or signatures off in HEAD's settings, the walk back to the last approved
    // tree.
    let tree = repo.find_commit(head).unwrap().tree().unwrap();
    c.bench_function(
        "two-key check: links out of the builder-owned directories of HEAD",
        |b| b.iter(|| assert!(shared::review::links::refused_in_tree(&repo, &tree).unwrap().is_empty())),
    );
    let identity = ApprovalRule::unsigned("runtime@localhost");
    let switch_off = |memo: Option<&std::path::Path>| {
        let mut trust = Trust::new(&repo, identity.clone()).unwrap().remembering(memo);
        assert!(!trust.review_owed(head).unwrap());
        Trust::rule_in_force(&repo, head, identity.clone(), memo).unwrap()
    };
    c.bench_function(
        "two-key check, review off in HEAD's settings: was the switch-off approved (10,000 records-only commits since; no memo)",
        |b| b.iter(|| switch_off(None)),
    );
    // As a fire runs it: the walk memo of .runtime, filled by the first call.
    switch_off(Some(root.as_path()));
    c.bench_function(
        "two-key check, review off in HEAD's settings: the same with the walk memo of .runtime",
        |b| b.iter(|| switch_off(Some(root.as_path()))),
    );
    // Under a signed rule every fire asks which builder change brought its signers
    // list, and whether the list before it approved that change: the walk back over
    // the builder changes (two here), with the walk memo of .runtime as a fire has it.
    c.bench_function(
        "two-key check, signatures on: which change brought the signers list (walk memo of .runtime)",
        |b| b.iter(|| Trust::rule_in_force(&repo, head, rule.clone(), Some(root.as_path())).unwrap()),
    );
}

/// (4) What reading the approved bytes adds to a fire (issue 17 item 3), on the
/// scaffold: settings, prompt and scope from HEAD's blobs against the work tree; every
/// builder-owned link of HEAD resolved; the committed `tools/` written out (once per
/// tree) and found again (every later fire).
fn approved_bytes(c: &mut Criterion) {
    use shared::review::committed::Committed;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    shared::scaffold::init(&root).unwrap();
    for args in [
        &["add", "-A"][..],
        &["-c", "user.name=E", "-c", "user.email=e@x", "commit", "-qm", "scaffold"],
    ] {
        assert!(std::process::Command::new("git")
            .arg("-C")
            .arg(&root)
            .args(args)
            .status()
            .unwrap()
            .success());
    }
    let repo = Repository::open(&root).unwrap();
    c.bench_function(
        "approved bytes: settings, prompt and scope from HEAD's blobs (scaffold)",
        |b| {
            b.iter(|| {
                let committed = Committed::at_head(&repo).unwrap();
                shared::settings::load_from(&committed).unwrap();
                committed.read_to_string("prompts/digest.md").unwrap();
                committed.read_to_string("scope/SCOPE.md").unwrap();
            })
        },
    );
    c.bench_function("the same from the work tree (what a fire read before)", |b| {
        b.iter(|| {
            shared::settings::load(&root).unwrap();
            std::fs::read_to_string(root.join("prompts/digest.md")).unwrap();
            std::fs::read_to_string(root.join("scope/SCOPE.md")).unwrap();
        })
    });
    c.bench_function(
        "approved bytes: every builder-owned link of HEAD resolved (scaffold)",
        |b| b.iter(|| assert!(Committed::at_head(&repo).unwrap().refused_links().unwrap().is_empty())),
    );
    let handoff = root.join(".runtime/handoff");
    std::fs::create_dir_all(&handoff).unwrap();
    let committed = Committed::at_head(&repo).unwrap();
    c.bench_function(
        "approved bytes: tools/ written out (the first fire on a tools tree)",
        |b| {
            b.iter_batched(
                || {
                    for e in std::fs::read_dir(&handoff).unwrap().flatten() {
                        std::fs::remove_dir_all(e.path()).unwrap();
                    }
                },
                |()| committed.tools_copy(&handoff).unwrap().unwrap(),
                BatchSize::SmallInput,
            )
        },
    );
    c.bench_function("approved bytes: tools/ copy found again (every later fire)", |b| {
        b.iter(|| committed.tools_copy(&handoff).unwrap().unwrap())
    });
}

/// (5) Review off from the first commit, 1,000 feature branches merged, each forked
/// just before a prompt change: every merge turns review off over a parent with
/// another builder tree, so the walk judges every merge's other parent as well.
fn merges(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("repo");
    let repo = Repository::init(&root).unwrap();
    std::fs::create_dir_all(root.join(shared::layout::STATE_DIR)).unwrap();
    let settings = shared::layout::SETTINGS_FILE;
    commit(
        &repo,
        &[(settings, b"require_reviewed: false\n"), ("prompts/a.md", b"0")],
        "eng",
    );
    let sig = Signature::now("eng", "eng@localhost").unwrap();
    for i in 0..1000 {
        let fork = repo.head().unwrap().peel_to_commit().unwrap().id();
        let feature = commit(&repo, &[("docs/a.md", format!("{i}").as_bytes())], "eng");
        repo.set_head_detached(fork).unwrap();
        let tweak = commit(&repo, &[("prompts/a.md", format!("{i}").as_bytes())], "eng");
        let mut update = git2::build::TreeUpdateBuilder::new();
        update.upsert(
            "docs/a.md",
            repo.blob(format!("{i}").as_bytes()).unwrap(),
            git2::FileMode::Blob,
        );
        let tree = update
            .create_updated(&repo, &repo.find_commit(tweak).unwrap().tree().unwrap())
            .unwrap();
        let parents = [&repo.find_commit(tweak).unwrap(), &repo.find_commit(feature).unwrap()];
        let merge = repo
            .commit(None, &sig, &sig, "merge", &repo.find_tree(tree).unwrap(), &parents)
            .unwrap();
        repo.set_head_detached(merge).unwrap();
    }
    let rule = ApprovalRule::unsigned("runtime@localhost");
    let head = commit(&repo, &[("runs/t/0.json", b"{}")], "runtime");
    let owed = |at: Oid, memo: Option<&Path>| {
        Trust::new(&repo, rule.clone())
            .unwrap()
            .remembering(memo)
            .review_owed(at)
            .unwrap()
    };
    assert!(!owed(head, None));
    c.bench_function(
        "two-key check, review off, 1,000 feature branches merged over prompt changes: the walk (no memo)",
        |b| b.iter(|| owed(head, None)),
    );
    owed(head, Some(root.as_path()));
    let mut n = 0;
    c.bench_function(
        "two-key check, review off, 1,000 feature branches merged over prompt changes: a fire's new commit (walk memo and review-free mark of .runtime)",
        |b| {
            b.iter_batched(
                || {
                    n += 1;
                    commit(&repo, &[(&format!("runs/t/{n}.json"), b"{}")], "runtime")
                },
                |at| assert!(!owed(at, Some(root.as_path()))),
                BatchSize::SmallInput,
            )
        },
    );
    // (6) Signatures turned on over that history, the change approved by its own
    // list: every fire asks whether anything below asked signatures before (the
    // first time, a walk over the 1,000 merges and the lines they joined; then the
    // unsigned-below mark of .runtime answers).
    let (keys, signers) = keys(dir.path());
    let on = commit(
        &repo,
        &[
            ("settings/allowed_signers", signers.as_bytes()),
            (
                settings,
                b"require_reviewed: false\nreview:\n  require_signed: true\n  allowed_signers: settings/allowed_signers\n",
            ),
        ],
        "eng",
    );
    approve(&repo, &keys, 0, on);
    let head = commit(&repo, &[("runs/t/signed.json", b"{}")], "runtime");
    let signed = ApprovalRule {
        runtime_email: "runtime@localhost".into(),
        signers: Some(SignerList::Repository("settings/allowed_signers".into())),
    };
    let ruled = |memo: Option<&Path>| Trust::rule_in_force(&repo, head, signed.clone(), memo).unwrap();
    assert!(matches!(ruled(None).signers, Some(SignerList::Repository(_))));
    c.bench_function(
        "signatures turned on over 1,000 unsigned merges: the rule in force (no memo: the first fire)",
        |b| b.iter(|| ruled(None)),
    );
    ruled(Some(root.as_path()));
    assert!(root
        .join(shared::layout::STATE_DIR)
        .join(shared::review::trust::UNSIGNED_BELOW_FILE)
        .exists());
    c.bench_function(
        "signatures turned on over 1,000 unsigned merges: the rule in force (walk memo and unsigned-below mark)",
        |b| b.iter(|| ruled(Some(root.as_path()))),
    );
    // (7) The fire's verdict on HEAD's tree there: the first signed tree, trusted on
    // first use, answers to every line joined below it (each merge's feature line).
    let judge = |memo: Option<&Path>| {
        let judged = Trust::new(&repo, signed.clone())
            .unwrap()
            .remembering(memo)
            .commit(head)
            .unwrap();
        assert!(judged.approval.is_some(), "{:?}", judged.rejected);
    };
    judge(Some(root.as_path()));
    c.bench_function(
        "signatures turned on over 1,000 unsigned merges: the verdict on HEAD's tree (walk memo)",
        |b| b.iter(|| judge(Some(root.as_path()))),
    );
}

criterion_group!(benches, bench, approved_bytes, merges, sync_merges, alternating_chain);
criterion_main!(benches);

/// A commit with `parents` (the first one's tree, `files` added or replaced).
fn commit_on(repo: &Repository, parents: &[Oid], files: &[(&str, &[u8])]) -> Oid {
    let parents: Vec<git2::Commit> = parents.iter().map(|p| repo.find_commit(*p).unwrap()).collect();
    let mut update = git2::build::TreeUpdateBuilder::new();
    for (path, body) in files {
        update.upsert(*path, repo.blob(body).unwrap(), git2::FileMode::Blob);
    }
    let tree = update.create_updated(repo, &parents[0].tree().unwrap()).unwrap();
    let sig = Signature::now("runtime", "runtime@localhost").unwrap();
    let refs: Vec<&git2::Commit> = parents.iter().collect();
    repo.commit(None, &sig, &sig, "c", &repo.find_tree(tree).unwrap(), &refs)
        .unwrap()
}

/// (8) Two cron boxes on one approved tree, each firing five times and then merging
/// the other's line with a bare `git pull` (1,000 such merges, 10,000 records
/// commits): a fire's new sync merge learns the other box's new commits, to see
/// that its later parent brings no other line (the same builder change below). And
/// the same after a builder change reached each box by a merge of its own (box A
/// merging the change, box B merging box A), so that the boxes' runs end at
/// different commits and every sync merge joins the other box's line.
fn sync_merges(c: &mut Criterion) {
    for after_change in [false, true] {
        two_boxes(c, after_change);
    }
}

/// Case (8), with or without the builder change before the 1,000 sync merges.
fn two_boxes(c: &mut Criterion, after_change: bool) {
    let dir = tempfile::tempdir().unwrap();
    let (keys, signers) = keys(dir.path());
    let root = dir.path().join("boxes");
    let repo = Repository::init(&root).unwrap();
    let c0 = signed_root(&repo, &keys, &signers);
    let (mut a, mut b) = (c0, c0);
    let mut n = 0;
    let mut fire = |at: Oid| {
        n += 1;
        commit_on(&repo, &[at], &[(&format!("runs/t/{n}.json"), b"{}")])
    };
    if after_change {
        a = fire(a);
        b = fire(b);
        let change = commit_on(&repo, &[c0], &[("prompts/a.md", b"v1")]);
        approve(&repo, &keys, 0, change);
        let tree = repo.find_commit(change).unwrap().tree_id();
        let sig = Signature::now("runtime", "runtime@localhost").unwrap();
        let merge = |first: Oid, later: Oid| {
            let parents = [&repo.find_commit(first).unwrap(), &repo.find_commit(later).unwrap()];
            repo.commit(None, &sig, &sig, "pull", &repo.find_tree(tree).unwrap(), &parents)
                .unwrap()
        };
        a = merge(a, change);
        b = merge(b, a);
    }
    for round in 0..1000 {
        for _ in 0..5 {
            a = fire(a);
            b = fire(b);
        }
        if round % 2 == 0 {
            a = commit_on(&repo, &[a, b], &[]);
        } else {
            b = commit_on(&repo, &[b, a], &[]);
        }
    }
    let rule = ApprovalRule {
        runtime_email: "runtime@localhost".into(),
        signers: Some(SignerList::Repository("settings/allowed_signers".into())),
    };
    let check = |at: Oid, memo: bool| {
        let judged = Trust::new(&repo, rule.clone())
            .unwrap()
            .remembering(memo.then_some(root.as_path()))
            .commit(at)
            .unwrap();
        assert!(judged.approval.is_some(), "{:?}", judged.rejected);
    };
    a = commit_on(&repo, &[a, b], &[]);
    let case = if after_change {
        "after a builder change merged by each box"
    } else {
        "on one builder change"
    };
    let mut group = c.benchmark_group("boxes");
    group.sample_size(20);
    group.bench_function(
        format!("two-key check, two cron boxes with 1,000 sync merges (git pull) {case}: the first fire (no memo)"),
        |bench| bench.iter(|| check(a, false)),
    );
    check(a, true);
    group.bench_function(
        format!("two-key check, two cron boxes with 1,000 sync merges (git pull) {case}: a fire's new merge of the other box's new commit (.runtime memos)"),
        |bench| {
            bench.iter_batched(
                || {
                    b = fire(b);
                    a = commit_on(&repo, &[fire(a), b], &[]);
                    a
                },
                |at| check(at, true),
                BatchSize::SmallInput,
            )
        },
    );
    group.finish();
}

/// (9) An orphan root whose list holds a key `main`'s does not, merged over `main`,
/// then 10,000 builder changes alternating between two trees that key approved (a
/// colleague's denial of service, helper-49's D): every change is judged, each walk
/// passing over every change below it, and refused by `main`'s list.
fn alternating_chain(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let (keys, signers) = keys(dir.path());
    let root = dir.path().join("chain");
    let repo = Repository::init(&root).unwrap();
    let list = "settings/allowed_signers";
    let only_r0 = signers.lines().next().unwrap().to_string() + "\n";
    let main = commit(&repo, &[(list, only_r0.as_bytes()), ("prompts/a.md", b"main")], "eng");
    approve(&repo, &keys, 0, main);
    repo.set_head_detached(main).unwrap();
    let sig = Signature::now("m", "m@localhost").unwrap();
    let mut update = git2::build::TreeUpdateBuilder::new();
    update.upsert(list, repo.blob(signers.as_bytes()).unwrap(), git2::FileMode::Blob);
    update.upsert("prompts/a.md", repo.blob(b"R").unwrap(), git2::FileMode::Blob);
    let empty = repo
        .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
        .unwrap();
    let tree = repo.find_tree(update.create_updated(&repo, &empty).unwrap()).unwrap();
    let hers = repo.commit(None, &sig, &sig, "root", &tree, &[]).unwrap();
    approve(&repo, &keys, 9, hers);
    let mut tip = commit_on(&repo, &[hers, main], &[("prompts/a.md", b"A")]);
    approve(&repo, &keys, 9, tip);
    tip = commit_on(&repo, &[tip], &[("prompts/a.md", b"B")]);
    approve(&repo, &keys, 9, tip);
    for n in 0..10_000 {
        tip = commit_on(&repo, &[tip], &[("prompts/a.md", [b"A", b"B"][n % 2])]);
    }
    let rule = ApprovalRule {
        runtime_email: "runtime@localhost".into(),
        signers: Some(SignerList::Repository(list.into())),
    };
    let refused = |memo: Option<&Path>| {
        let judged = Trust::new(&repo, rule.clone())
            .unwrap()
            .remembering(memo)
            .commit(tip)
            .unwrap();
        assert!(judged.approval.is_none());
    };
    let mut group = c.benchmark_group("chain");
    group.sample_size(10);
    group.bench_function(
        "two-key check, 10,000 builder changes alternating between two trees over an orphan merge: the verdict (no memo)",
        |b| b.iter(|| refused(None)),
    );
    refused(Some(root.as_path()));
    group.bench_function(
        "two-key check, 10,000 builder changes alternating between two trees over an orphan merge: the verdict (.runtime memos)",
        |b| b.iter(|| refused(Some(root.as_path()))),
    );
    group.finish();
}
