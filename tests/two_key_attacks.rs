//! The two-key promise attacked as Mallory would: an engineer with push access to
//! the shared origin, her own git identity and SSH key, not listed as a signer. With
//! `require_reviewed` and signed approvals on, and a cron box that syncs from the
//! origin, she pushes commits and approval commits of her own making (real git
//! repositories, keys and signatures from the real `ssh-keygen`) and tries to get a
//! tree she wrote fired there. Each test first shows that her payload reached the
//! cron box (her commits and approvals on its refs, and, where it is a forged state
//! file, that it would have passed the check had it been used), then that the promise
//! held: her tree is not HEAD's, the fire ran on what the box had and said why in an
//! `unreviewed_changes` card.

use crate::review::{builder_ok, fire_in, git, with_origin, REVIEWER};
use crate::signed::{keygen, signed_review};
use crate::skip::Capability;
use crate::util::TestEnv;
use git2::{Oid, Repository};
use shared::review::approvals::{self, Signing};
use shared::review::signing::{ApprovalRule, SignerList};
use shared::review::trust::Trust;
use std::path::{Path, PathBuf};

const MALLORY: &str = "Mallory <mallory@evil.example>";

/// Signed review on (Rev's key), then sync turned on through signed review; the cron
/// box clones the origin and fires once. Returns (origin, cron clone, Rev's key), or
/// `None` without `ssh-keygen`.
fn signed_cron_box(env: &TestEnv) -> Option<(PathBuf, PathBuf, PathBuf)> {
    let (rev_key, _, _) = signed_review(env)?;
    let origin = with_origin(env);
    let settings = env.read("settings/runtime.yaml");
    env.write(
        "settings/runtime.yaml",
        &format!("{settings}sync:\n  remote: origin\n  branch: main\n"),
    );
    builder_ok(env, &env.root, None, &["propose", "cron", "-m", "Sync the cron box"]);
    builder_ok(
        env,
        &env.root,
        Some(REVIEWER),
        &["approve", "cron", "--key", rev_key.to_str().unwrap()],
    );
    builder_ok(env, &env.root, None, &["merge", "cron"]);
    git(
        env,
        &env.root,
        &["push", "-q", "origin", "main", "+refs/builder/*:refs/builder/*"],
    );
    let cron = env.home.join("cron");
    git(
        env,
        &env.home,
        &["clone", "-q", origin.to_str().unwrap(), cron.to_str().unwrap()],
    );
    builder_ok(env, &cron, None, &["install-hooks"]);
    let (code, summary) = fire_in(env, &cron, "digest");
    assert_eq!(code, 0, "the first fire of the cron box: {summary}");
    Some((origin, cron, rev_key))
}

/// Mallory's clone of the origin, with its approvals.
fn mallory_clone(env: &TestEnv, origin: &Path) -> Repository {
    let dir = env.home.join("mallory");
    git(
        env,
        &env.home,
        &["clone", "-q", origin.to_str().unwrap(), dir.to_str().unwrap()],
    );
    git(env, &dir, &["fetch", "-q", "origin", "+refs/builder/*:refs/builder/*"]);
    Repository::open(&dir).unwrap()
}

/// A commit by Mallory on `parent` replacing `files` (no ref moves; `*.sh` files are
/// executable).
fn commit_on(repo: &Repository, parent: Oid, files: &[(&str, &str)], msg: &str) -> Oid {
    let parent = repo.find_commit(parent).unwrap();
    let mut update = git2::build::TreeUpdateBuilder::new();
    for (path, body) in files {
        let mode = if path.ends_with(".sh") {
            git2::FileMode::BlobExecutable
        } else {
            git2::FileMode::Blob
        };
        update.upsert(*path, repo.blob(body.as_bytes()).unwrap(), mode);
    }
    let tree = repo
        .find_tree(update.create_updated(repo, &parent.tree().unwrap()).unwrap())
        .unwrap();
    let sig = git2::Signature::now("Mallory", "mallory@evil.example").unwrap();
    repo.commit(None, &sig, &sig, msg, &tree, &[&parent]).unwrap()
}

/// Mallory's approval of the builder tree of `commit`, signed with her key.
fn approve_as_mallory(repo: &Repository, commit: Oid, key: &Path) -> Oid {
    let tree = shared::review::builder_tree_of_commit(repo, commit).unwrap();
    let person = shared::review::parse_person(MALLORY).unwrap();
    let signing = Signing {
        key: key.to_path_buf(),
        program: "ssh-keygen".into(),
    };
    let body = approvals::signed_body("mallory", tree, commit, &person, Some(&signing)).unwrap();
    approvals::write(repo, body, &person).unwrap().id
}

/// Pushes `commit` as the origin's `main`, and every `refs/builder/*`, past any hook.
fn push(env: &TestEnv, repo: &Repository, commit: Oid) {
    let dir = repo.workdir().unwrap();
    git(
        env,
        dir,
        &[
            "push",
            "-q",
            "--no-verify",
            "origin",
            &format!("{commit}:refs/heads/main"),
            "+refs/builder/*:refs/builder/*",
        ],
    );
}

/// The path of the one card `summary` names, relative to the repository.
fn first_card(dir: &Path, summary: &serde_json::Value) -> String {
    let id = summary["cards"][0].as_str().unwrap();
    let day = std::fs::read_dir(dir.join("cards"))
        .unwrap()
        .flatten()
        .find(|d| d.path().join(format!("{id}.yaml")).is_file())
        .unwrap();
    format!("cards/{}/{id}.yaml", day.file_name().to_string_lossy())
}

/// Whether the box fetched `commit`: its `origin/main` is that commit or, once the
/// box pushed its records as a merge onto it, a descendant of it.
fn reached(env: &TestEnv, box_repo: &Repository, commit: Oid) -> bool {
    let dir = box_repo.workdir().unwrap();
    let tracked = Oid::from_str(&rev(env, dir, "refs/remotes/origin/main")).unwrap();
    tracked == commit || box_repo.graph_descendant_of(tracked, commit).unwrap()
}

fn rev(env: &TestEnv, dir: &Path, what: &str) -> String {
    git(env, dir, &["rev-parse", what])
}

/// The walk memo is a file in `.runtime/`, which no commit may bring: Mallory forges
/// one (her side commit Y, whose list holds only her key, as the boundary of the
/// approved tree) and pushes it in a commit that changes no builder-owned path, so
/// the cron box would take it without an approval; then her prompt change, approved
/// with her own key. Had the box checked the forged memo out, the walk would have
/// judged her change by Y's list and fired it.
#[test]
fn a_walk_memo_pushed_in_a_commit_never_reaches_the_cron_box() {
    let env = TestEnv::new();
    let Some((origin, cron, _)) = signed_cron_box(&env) else {
        crate::skip::skip(Capability::SshKeygen, "ssh-keygen is not installed");
        return;
    };
    let (mal_key, mal_pub) = keygen(&env, "mallory").unwrap();
    let mal = mallory_clone(&env, &origin);
    let x = Oid::from_str(&rev(&env, mal.workdir().unwrap(), "origin/main")).unwrap();
    let t_x = shared::review::builder_tree_of_commit(&mal, x).unwrap();

    // Y: a side commit whose list is hers, approved with her key; kept on a
    // refs/builder/* ref so the box's fetch brings it.
    let y = commit_on(
        &mal,
        x,
        &[
            (
                "settings/allowed_signers",
                &format!("mallory@evil.example namespaces=\"builder-approval\" {mal_pub}"),
            ),
            ("prompts/digest.md", "---\n---\nY.\n"),
        ],
        "side",
    );
    mal.reference("refs/builder/side", y, true, "side").unwrap();
    approve_as_mallory(&mal, y, &mal_key);
    let t_y = shared::review::builder_tree_of_commit(&mal, y).unwrap();
    // p1: the forged memo, no builder-owned path changed. c1: her prompt.
    let memo = format!("{}\n{x} {t_x} {y}\n{y} {t_y} -\n", shared::state::WALK_MEMO_HEADER);
    let p1 = commit_on(&mal, x, &[(".runtime/builder-tree-walk", &memo)], "notes");

    push(&env, &mal, p1);
    let (first_code, first) = fire_in(&env, &cron, "digest");
    let first_head = rev(&env, &cron, "HEAD");
    assert_eq!(first["commit"], first_head.as_str());
    // The box pushed its records (and its card) as a merge onto p1, which keeps the
    // memo tracked; her prompt change builds on that, as anyone's next push would.
    let mal_dir = mal.workdir().unwrap().to_path_buf();
    git(&env, &mal_dir, &["fetch", "-q", "origin"]);
    let base = Oid::from_str(&rev(&env, &mal_dir, "origin/main")).unwrap();
    assert!(mal.graph_descendant_of(base, p1).unwrap(), "the box's merge keeps p1");
    let c1 = commit_on(
        &mal,
        base,
        &[("prompts/digest.md", "---\n---\nMALLORY WAS HERE.\n")],
        "tweak",
    );
    approve_as_mallory(&mal, c1, &mal_key);
    push(&env, &mal, c1);
    let (code, summary) = fire_in(&env, &cron, "digest");

    // The payload reached the box: her commits and approvals are on its refs...
    let box_repo = Repository::open(&cron).unwrap();
    assert!(reached(&env, &box_repo, c1), "{summary}");
    assert_eq!(rev(&env, &cron, "refs/builder/side"), y.to_string());
    let hers = approvals::load(&box_repo)
        .unwrap()
        .into_iter()
        .filter(|a| a.body.approver == MALLORY)
        .count();
    assert_eq!(hers, 2, "her approvals are on the box's approvals ref");
    // ...and her memo is live: read from a `.runtime/` holding it, the check passes.
    let forged_root = env.home.join("forged");
    std::fs::create_dir_all(forged_root.join(".runtime")).unwrap();
    std::fs::write(forged_root.join(".runtime/builder-tree-walk"), &memo).unwrap();
    let rule = ApprovalRule {
        runtime_email: "runtime@localhost".into(),
        signers: Some(SignerList::Repository("settings/allowed_signers".into())),
    };
    let head = Oid::from_str(&rev(&env, &cron, "HEAD")).unwrap();
    let judged = Trust::new(&box_repo, rule.clone())
        .unwrap()
        .remembering(Some(&forged_root))
        .incoming(c1, p1)
        .unwrap();
    assert!(
        judged.approval.is_some(),
        "the forged memo would pass: {:?}",
        judged.rejected
    );
    // Without it, her change is judged by Rev's list and does not count.
    let honest = Trust::new(&box_repo, rule).unwrap().incoming(c1, head).unwrap();
    assert!(honest.approval.is_none());

    // The promise held: the box never moved onto her commits and never ran her prompt.
    let head = rev(&env, &cron, "HEAD");
    assert_ne!(head, c1.to_string(), "{summary}");
    assert!(!std::fs::read_to_string(cron.join("prompts/digest.md"))
        .unwrap()
        .contains("MALLORY"));
    let receipt = std::fs::read_to_string(cron.join(summary["receipt"].as_str().unwrap())).unwrap();
    let receipt: serde_json::Value = serde_json::from_str(&receipt).unwrap();
    assert_eq!(
        receipt["inputs"]["commit"], first["commit"],
        "it ran on what it had: {summary}"
    );
    assert_eq!(code, 5, "{summary}");
    // Her tip still tracks the forged memo: the cause the first fire carded, so this
    // fire adds no card and points at that one.
    let cards = crate::cron_box::env_cards(&cron, &summary);
    assert!(cards.is_empty(), "{summary}");
    let message = summary["message"].as_str().unwrap();
    assert!(
        message.contains("tracks .runtime/")
            && message.contains(&format!("carded by run {}", first["run_id"].as_str().unwrap())),
        "{summary}"
    );
    // The first fire already refused the tip that brought the memo, and said so once.
    assert_ne!(first_head, p1.to_string(), "{first}");
    assert_eq!(first_code, 5, "it fired on what it had: {first}");
    assert_eq!(crate::cron_box::env_cards(&cron, &first), vec!["unreviewed_changes"]);
    let card = git(
        &env,
        &cron,
        &["show", &format!("{first_head}:{}", first_card(&cron, &first))],
    );
    assert!(
        card.contains("tracks .runtime/") && card.contains(&p1.to_string()),
        "{card}"
    );
    let memo_now = std::fs::read_to_string(cron.join(".runtime/builder-tree-walk")).unwrap_or_default();
    assert!(
        !memo_now.contains(&y.to_string()),
        "her rows never entered the box's memo: {memo_now}"
    );
}

/// A symlink in `tools/` whose target lies outside the builder-owned directories:
/// an approval names the link (its target path), not what it reaches. The link lands
/// with an approval (Rev's, of "share the prefetch script with lib/"); Mallory then
/// changes only `lib/`, which leaves the builder tree as approved, so the cron box
/// moves onto her commit, where the prefetch would run her script.
#[test]
fn a_builder_link_that_leaves_the_builder_paths_is_never_covered() {
    let env = TestEnv::new();
    let Some((origin, cron, rev_key)) = signed_cron_box(&env) else {
        crate::skip::skip(Capability::SshKeygen, "ssh-keygen is not installed");
        return;
    };
    let script = "tools/digest-context.sh";
    git(&env, &env.root, &["pull", "-q", "--ff-only", "origin", "main"]);
    std::fs::create_dir_all(env.root.join("lib")).unwrap();
    std::fs::copy(env.root.join(script), env.root.join("lib/digest-context.sh")).unwrap();
    env.commit_all("lib: the digest context script");
    std::fs::remove_file(env.root.join(script)).unwrap();
    std::os::unix::fs::symlink("../lib/digest-context.sh", env.root.join(script)).unwrap();
    // `builder propose` (and approve, merge) refuse such a link outright; it lands
    // past them, with git and Rev's signed approval of its tree written directly (a
    // careless reviewer's, as the review once let through).
    let (code, _, err) = crate::review::builder_in(&env, &env.root, None, &["propose", "link", "-m", "Share"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("cannot propose") && err.contains("reaches lib"), "{err}");
    env.commit_all("Share the prefetch script");
    let laptop = Repository::open(&env.root).unwrap();
    let head = laptop.head().unwrap().peel_to_commit().unwrap().id();
    let tree = shared::review::builder_tree_of_commit(&laptop, head).unwrap();
    let rev_person = shared::review::parse_person("Rev <rev@example.com>").unwrap();
    let signing = Signing {
        key: rev_key.clone(),
        program: "ssh-keygen".into(),
    };
    let body = approvals::signed_body("link", tree, head, &rev_person, Some(&signing)).unwrap();
    approvals::write(&laptop, body, &rev_person).unwrap();
    // The pre-push hook's audit refuses the link; pushed past it (anyone with push
    // access can).
    let out = env.git_with_path(
        &env.root,
        &crate::review::path_with_builder(),
        &["push", "-q", "origin", "main"],
    );
    assert!(!out.status.success());
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("a symlink to ../lib/digest-context.sh"), "{said}");
    git(
        &env,
        &env.root,
        &[
            "push",
            "-q",
            "--no-verify",
            "origin",
            "main",
            "+refs/builder/*:refs/builder/*",
        ],
    );

    let mal = mallory_clone(&env, &origin);
    let tip = Oid::from_str(&rev(&env, mal.workdir().unwrap(), "origin/main")).unwrap();
    let payload = "#!/bin/sh\necho payload > reports/mallory-ran.md\necho context\n";
    let evil = commit_on(&mal, tip, &[("lib/digest-context.sh", payload)], "lib: tidy");
    assert_eq!(
        shared::review::builder_tree_of_commit(&mal, evil).unwrap(),
        shared::review::builder_tree_of_commit(&mal, tip).unwrap(),
        "her commit leaves the builder tree as approved"
    );
    push(&env, &mal, evil);
    let (code, summary) = fire_in(&env, &cron, "digest");

    // The attack ran: the box is on her commit, and its prefetch script reaches her code.
    let receipt = std::fs::read_to_string(cron.join(summary["receipt"].as_str().unwrap())).unwrap();
    let receipt: serde_json::Value = serde_json::from_str(&receipt).unwrap();
    assert_eq!(receipt["inputs"]["commit"], evil.to_string().as_str(), "{summary}");
    assert!(std::fs::symlink_metadata(cron.join(script))
        .unwrap()
        .file_type()
        .is_symlink());
    assert!(std::fs::read_to_string(cron.join(script))
        .unwrap()
        .contains("mallory-ran"));
    // The promise held: refused before anything ran, naming the link.
    assert_eq!(code, 1, "{summary}");
    assert!(!cron.join("reports/mallory-ran.md").exists(), "her script ran");
    assert_eq!(crate::cron_box::env_cards(&cron, &summary), vec!["unreviewed_changes"]);
    let message = summary["message"].as_str().unwrap();
    assert!(
        message.contains("tools/digest-context.sh -> ../lib/digest-context.sh"),
        "{message}"
    );
    // And the audit flags the link, approved as it was.
    let (code, out, _) = crate::review::builder_in(&env, &cron, None, &["audit", "--json"]);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["severity"] == "violation"
                && f["path"] == script
                && f["what"]
                    .as_str()
                    .unwrap()
                    .contains("a symlink to ../lib/digest-context.sh")),
        "{v}"
    );
}

/// The forgeries the judges already see through, against the cron box and then the
/// laptop that pulls them: Mallory's prompt change, which in the same commit adds her
/// key to `settings/allowed_signers` and turns `require_reviewed` off, pushed past
/// the hook with four approvals of its tree: by Rev's identity signed with her key,
/// Rev's real signature (of another tree) replayed over a body naming hers, her own
/// (her key is in the list her change brings), and Rev's identity unsigned.
#[test]
fn forged_approvals_of_a_change_that_disarms_review_count_for_nothing() {
    let env = TestEnv::new();
    let Some((origin, cron, _)) = signed_cron_box(&env) else {
        crate::skip::skip(Capability::SshKeygen, "ssh-keygen is not installed");
        return;
    };
    let (mal_key, mal_pub) = keygen(&env, "mallory").unwrap();
    let mal = mallory_clone(&env, &origin);
    let dir = mal.workdir().unwrap().to_path_buf();
    let tip = Oid::from_str(&rev(&env, &dir, "origin/main")).unwrap();
    let read = |rel: &str| std::fs::read_to_string(dir.join(rel)).unwrap();
    let signers = format!(
        "{}mallory@evil.example namespaces=\"builder-approval\" {mal_pub}",
        read("settings/allowed_signers")
    );
    let settings = read("settings/runtime.yaml").replace("require_reviewed: true", "require_reviewed: false");
    assert!(settings.contains("require_reviewed: false"));
    let evil = commit_on(
        &mal,
        tip,
        &[
            ("prompts/digest.md", "---\n---\nMALLORY WAS HERE.\n"),
            ("settings/allowed_signers", &signers),
            ("settings/runtime.yaml", &settings),
        ],
        "tweak",
    );
    let tree = shared::review::builder_tree_of_commit(&mal, evil).unwrap();
    let rev_person = shared::review::parse_person("Rev <rev@example.com>").unwrap();
    let signing = Signing {
        key: mal_key.clone(),
        program: "ssh-keygen".into(),
    };
    // Rev's real signed approval, found before Mallory writes one in his name.
    let real = approvals::load(&mal)
        .unwrap()
        .into_iter()
        .rev()
        .find(|a| a.body.approver == "Rev <rev@example.com>" && a.body.signature.is_some())
        .unwrap();
    let spoofed = approvals::signed_body("tweak", tree, evil, &rev_person, Some(&signing)).unwrap();
    approvals::write(&mal, spoofed, &rev_person).unwrap();
    let mut replayed = real.body.clone();
    replayed.tree = tree.to_string();
    approvals::write(&mal, replayed, &rev_person).unwrap();
    approve_as_mallory(&mal, evil, &mal_key);
    let unsigned = approvals::signed_body("tweak", tree, evil, &rev_person, None).unwrap();
    approvals::write(&mal, unsigned, &rev_person).unwrap();
    push(&env, &mal, evil);

    let before = rev(&env, &cron, "HEAD");
    let (code, summary) = fire_in(&env, &cron, "digest");
    // The attack reached the box: her commit and her four approvals are on its refs.
    let box_repo = Repository::open(&cron).unwrap();
    assert!(reached(&env, &box_repo, evil), "{summary}");
    let naming = approvals::load(&box_repo)
        .unwrap()
        .into_iter()
        .filter(|a| a.body.tree == tree.to_string())
        .count();
    assert_eq!(naming, 4, "the forged approvals are on the box");
    // The promise held: it fired on what it had, with one card.
    assert_eq!(code, 5, "{summary}");
    assert_eq!(crate::cron_box::env_cards(&cron, &summary), vec!["unreviewed_changes"]);
    let receipt = std::fs::read_to_string(cron.join(summary["receipt"].as_str().unwrap())).unwrap();
    let receipt: serde_json::Value = serde_json::from_str(&receipt).unwrap();
    assert_eq!(receipt["inputs"]["commit"], before.as_str());
    assert!(!std::fs::read_to_string(cron.join("prompts/digest.md"))
        .unwrap()
        .contains("MALLORY"));
    // Its card reached the origin: a merge of her tip and the box's records, which
    // keeps her builder tree as she pushed it and never moves the box onto it.
    let tip = rev(&env, &origin, "refs/heads/main");
    let origin_repo = Repository::open(&origin).unwrap();
    let tip_oid = Oid::from_str(&tip).unwrap();
    assert!(origin_repo.graph_descendant_of(tip_oid, evil).unwrap(), "{summary}");
    assert_eq!(
        shared::review::builder_tree_of_commit(&origin_repo, tip_oid).unwrap(),
        tree,
        "the box's push changed no builder-owned path"
    );
    git(
        &env,
        &origin,
        &["cat-file", "-e", &format!("{tip}:{}", first_card(&cron, &summary))],
    );
    let box_head = Oid::from_str(&rev(&env, &cron, "HEAD")).unwrap();
    assert!(
        origin_repo.graph_descendant_of(tip_oid, box_head).unwrap(),
        "the box's branch is in the origin's history, behind it: {summary}"
    );

    // A laptop that pulls it: the audit flags it, and a fire there refuses it, each
    // forged approval named with why it does not count.
    git(&env, &env.root, &["pull", "-q", "--ff-only", "origin", "main"]);
    git(
        &env,
        &env.root,
        &["fetch", "-q", "origin", "+refs/builder/*:refs/builder/*"],
    );
    assert_eq!(rev(&env, &env.root, "HEAD"), tip);
    let (code, out, _) = crate::review::builder_in(&env, &env.root, None, &["audit", "--json"]);
    assert_eq!(code, 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["severity"] == "violation" && f["path"] == "prompts/digest.md"),
        "{v}"
    );
    let (code, summary) = fire_in(&env, &env.root, "digest");
    assert_eq!(code, 1, "{summary}");
    assert_eq!(env.card_kinds(&summary), vec!["unreviewed_changes"]);
    let detail = env.cards(&summary)[0]["detail"].as_str().unwrap().to_string();
    assert_eq!(detail.matches("\n- approval ").count(), 4, "{detail}");
    assert!(
        detail.contains("the change that turned it off has no approval"),
        "{detail}"
    );
    assert!(
        detail.contains("it is not signed") && detail.contains("is not in settings/allowed_signers"),
        "{detail}"
    );
}

/// Turning `review.require_signed` off in the same commit as a prompt change, with an
/// unsigned approval under Rev's name (pushed past the hook): both `audit` and the
/// runtime took the rule from HEAD's own settings, where identities alone count, and
/// let it through; both now judge it under the signatures the change switched off.
#[test]
fn turning_signatures_off_in_the_same_change_does_not_let_an_identity_approve_it() {
    let env = TestEnv::new();
    let Some(_) = signed_review(&env) else {
        crate::skip::skip(Capability::SshKeygen, "ssh-keygen is not installed");
        return;
    };
    let repo = Repository::open(&env.root).unwrap();
    let head = repo.head().unwrap().peel_to_commit().unwrap().id();
    let settings = env.read("settings/runtime.yaml");
    let cut = settings.find("review:\n").unwrap();
    let downgraded = format!("{}\n", settings[..cut].trim_end());
    let evil = commit_on(
        &repo,
        head,
        &[
            ("prompts/digest.md", "---\n---\nMALLORY WAS HERE.\n"),
            ("settings/runtime.yaml", &downgraded),
        ],
        "tweak",
    );
    repo.reference("refs/heads/main", evil, true, "mallory").unwrap();
    git(&env, &env.root, &["reset", "-q", "--hard", &evil.to_string()]);
    let tree = shared::review::builder_tree_of_commit(&repo, evil).unwrap();
    let rev_person = shared::review::parse_person("Rev <rev@example.com>").unwrap();
    let body = approvals::signed_body("tweak", tree, evil, &rev_person, None).unwrap();
    approvals::write(&repo, body, &rev_person).unwrap();
    // The attack is in place: HEAD is hers, asks no signatures, and an unsigned
    // approval under Rev's name names its tree.
    assert_eq!(rev(&env, &env.root, "HEAD"), evil.to_string());
    assert!(!env.read("settings/runtime.yaml").contains("require_signed"));
    let (code, out, _) = crate::review::builder_in(&env, &env.root, None, &["audit"]);
    assert_eq!(code, 1, "the audit judges it under signatures: {out}");
    let (code, summary) = fire_in(&env, &env.root, "digest");
    assert_eq!(code, 1, "{summary}");
    assert_eq!(env.card_kinds(&summary), vec!["unreviewed_changes"]);
}

/// A raw tree of `entries` (mode, name, id) in the order given, as anyone can write
/// with `git mktree` or `git hash-object -t tree --literally`.
fn raw_tree(repo: &Repository, entries: &[(&str, &str, Oid)]) -> Oid {
    let mut raw = Vec::new();
    for (mode, name, id) in entries {
        raw.extend_from_slice(format!("{mode} {name}\0").as_bytes());
        raw.extend_from_slice(id.as_bytes());
    }
    repo.odb().unwrap().write(git2::ObjectType::Tree, &raw).unwrap()
}

/// `parent`'s tree with the top-level entry `name` set to `id` with `mode` (raw: git
/// would refuse nothing here), as a commit by Mallory.
fn commit_with_top(repo: &Repository, parent: Oid, name: &str, id: Oid, mode: &str, msg: &str) -> Oid {
    let parent = repo.find_commit(parent).unwrap();
    let old = parent.tree().unwrap();
    let mut entries: Vec<(String, String, Oid)> = old
        .iter()
        .filter(|e| e.name_bytes() != name.as_bytes())
        .map(|e| {
            (
                format!("{:o}", e.filemode()),
                String::from_utf8_lossy(e.name_bytes()).into_owned(),
                e.id(),
            )
        })
        .collect();
    entries.push((mode.to_string(), name.to_string(), id));
    let key = |(m, n, _): &(String, String, Oid)| format!("{n}{}", if m == "40000" { "/" } else { "" });
    entries.sort_by_key(key);
    let refs: Vec<(&str, &str, Oid)> = entries.iter().map(|(m, n, i)| (m.as_str(), n.as_str(), *i)).collect();
    let tree = repo.find_tree(raw_tree(repo, &refs)).unwrap();
    let sig = git2::Signature::now("Mallory", "mallory@evil.example").unwrap();
    repo.commit(None, &sig, &sig, msg, &tree, &[&parent]).unwrap()
}

/// The attack's premise: a plain libgit2 checkout from `from` to `to` (in a scratch
/// repository holding both) writes `written` through a link. The file is removed
/// after.
fn assert_libgit2_writes_through(env: &TestEnv, mal: &Repository, from: Oid, to: Oid, written: &Path) {
    let scratch_dir = env.home.join("scratch");
    git(env, &env.home, &["init", "-q", scratch_dir.to_str().unwrap()]);
    let theirs = mal.workdir().unwrap();
    for (c, name) in [(from, "from"), (to, "to")] {
        git(
            env,
            theirs,
            &[
                "push",
                "-q",
                "--no-verify",
                scratch_dir.to_str().unwrap(),
                &format!("{c}:refs/heads/{name}"),
            ],
        );
    }
    git(env, &scratch_dir, &["checkout", "-q", "from"]);
    let scratch = Repository::open(&scratch_dir).unwrap();
    let tree = scratch.find_commit(to).unwrap().tree().unwrap();
    let mut co = git2::build::CheckoutBuilder::new();
    co.safe();
    let _ = scratch.checkout_tree(tree.as_object(), Some(&mut co));
    assert!(written.exists(), "libgit2 wrote through the link");
    std::fs::remove_file(written).unwrap();
    std::fs::remove_dir_all(&scratch_dir).unwrap();
}

/// Mallory's two `docs/` trees on the origin's `main` (no builder-owned path):
/// `docs/h`, a link to `outside` (a directory outside the repository), in `c1`; and
/// in `c2` that link beside a directory `h` of one name holding `pwned.txt` (a tree
/// git refuses: duplicateEntries). The premise is checked: libgit2's checkout from
/// `c1` to `c2` writes `pwned.txt` through the link.
struct LinkAttack {
    outside: PathBuf,
    docs_link: Oid,
    docs_dup: Oid,
    c1: Oid,
    c2: Oid,
}

fn link_attack(env: &TestEnv, mal: &Repository) -> LinkAttack {
    let outside = env.home.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let link = mal.blob(outside.to_str().unwrap().as_bytes()).unwrap();
    let main = mal.refname_to_id("refs/remotes/origin/main").unwrap();
    let docs_link = raw_tree(mal, &[("120000", "h", link)]);
    let c1 = commit_with_top(mal, main, "docs", docs_link, "40000", "docs: a link");
    let payload = raw_tree(
        mal,
        &[("100644", "pwned.txt", mal.blob(b"MALLORY WAS HERE\n").unwrap())],
    );
    let docs_dup = raw_tree(mal, &[("120000", "h", link), ("40000", "h", payload)]);
    let c2 = commit_with_top(mal, c1, "docs", docs_dup, "40000", "docs");
    assert_libgit2_writes_through(env, mal, c1, c2, &outside.join("pwned.txt"));
    LinkAttack {
        outside,
        docs_link,
        docs_dup,
        c1,
        c2,
    }
}

/// Mallory changes no builder-owned path: `docs/h`, a link to a directory outside the
/// repository, then a `docs/` holding that link and a directory `h` of one name (a
/// tree git refuses: duplicateEntries). libgit2's checkout of the second writes the
/// directory's files through the link, outside the repository (or into `.git/hooks`,
/// or over the runtime's own copy of the approved tools). The box refuses to move
/// there: every fire exits 5 with one card naming the tree, nothing is written
/// outside, and the box's records stay on it. So does a tip where `cards` is a file.
#[test]
fn a_tree_git_refuses_outside_the_builder_paths_never_reaches_the_cron_box() {
    let env = TestEnv::new();
    let Some((origin, cron, _)) = signed_cron_box(&env) else {
        crate::skip::skip(Capability::SshKeygen, "ssh-keygen is not installed");
        return;
    };
    let mal = mallory_clone(&env, &origin);
    let LinkAttack {
        outside,
        docs_link,
        docs_dup,
        c1,
        c2: _,
    } = link_attack(&env, &mal);
    push(&env, &mal, c1);

    // The box takes c1 (a link outside the builder paths is no builder change)...
    let (code, summary) = fire_in(&env, &cron, "digest");
    assert_eq!(code, 0, "{summary}");
    assert!(reached(&env, &Repository::open(&cron).unwrap(), c1));
    // ...and refuses the same `docs/` on its records, once carded, every fire exiting 5.
    git(&env, mal.workdir().unwrap(), &["fetch", "-q", "origin"]);
    let main = mal.refname_to_id("refs/remotes/origin/main").unwrap();
    let c2 = commit_with_top(&mal, main, "docs", docs_dup, "40000", "docs");
    push(&env, &mal, c2);
    let (code, summary) = fire_in(&env, &cron, "digest");
    let fetched = "refs/runtime-sync/fetched/origin/main";
    assert_eq!(rev(&env, &cron, fetched), c2.to_string(), "the payload reached the box");
    assert_eq!(code, 5, "{summary}");
    assert!(!outside.join("pwned.txt").exists(), "written outside the repository");
    assert_ne!(rev(&env, &cron, "HEAD"), c2.to_string());
    assert_eq!(crate::cron_box::env_cards(&cron, &summary), vec!["unreviewed_changes"]);
    let card = std::fs::read_to_string(cron.join(first_card(&cron, &summary))).unwrap();
    assert!(card.contains("duplicateEntries") && card.contains("docs/h"), "{card}");
    let (code, again) = fire_in(&env, &cron, "digest");
    assert_eq!(code, 5, "{again}");
    assert!(
        crate::cron_box::env_cards(&cron, &again).is_empty(),
        "carded once: {again}"
    );
    assert!(!outside.join("pwned.txt").exists());
    // The box's records stay on it: nothing was built onto the refused tip.
    assert_eq!(
        rev(&env, &origin, "main"),
        c2.to_string(),
        "nothing pushed onto the refused tip"
    );

    // A tip where `cards`, or a task's records directory, is a file: the same, named
    // (helper-97: `runs/digest` as a file stopped every commit and push).
    let not_a_dir = mal.blob(b"not a directory\n").unwrap();
    let undone = commit_with_top(&mal, c2, "docs", docs_link, "40000", "docs: one h");
    let runs_file = raw_tree(&mal, &[("100644", "digest", not_a_dir)]);
    let cards_file = commit_with_top(&mal, undone, "cards", not_a_dir, "100644", "tidy");
    let cards_dir = (mal.find_commit(undone).unwrap().tree().unwrap())
        .get_name("cards")
        .unwrap()
        .id();
    let cards_back = commit_with_top(&mal, cards_file, "cards", cards_dir, "40000", "cards back");
    let runs_file = commit_with_top(&mal, cards_back, "runs", runs_file, "40000", "tidy");
    // And (helper-101) a file entry naming a tree, and a submodule where a task's
    // reports go: every checkout or commit over either failed.
    let top_of = |c: Oid, name: &str| mal.find_commit(c).unwrap().tree().unwrap().get_name(name).unwrap().id();
    let runs_back = commit_with_top(&mal, runs_file, "runs", top_of(undone, "runs"), "40000", "runs back");
    // A tree of its own, unknown to the origin (git's pack refuses to send a known
    // tree as a blob).
    let fresh = raw_tree(&mal, &[("100644", "x", mal.blob(b"hello, helper-101\n").unwrap())]);
    let docs_kind = commit_with_top(&mal, runs_back, "docs", fresh, "100644", "docs");
    let docs_back = commit_with_top(&mal, docs_kind, "docs", docs_link, "40000", "docs back");
    let submodule = raw_tree(&mal, &[("160000", "digest", undone)]);
    let reports_sub = commit_with_top(&mal, docs_back, "reports", submodule, "40000", "reports");
    let tips = [
        (cards_file, "`cards` is not a directory"),
        (runs_file, "`runs/digest` is not a directory"),
        (docs_kind, "`docs`: an entry of mode 100644 naming a tree"),
        (reports_sub, "`reports/digest` is not a directory"),
    ];
    for (tip, named) in tips {
        push(&env, &mal, tip);
        let (code, summary) = fire_in(&env, &cron, "digest");
        assert_eq!(code, 5, "{named}: {summary}");
        let cards = crate::cron_box::env_cards(&cron, &summary);
        assert_eq!(cards, vec!["unreviewed_changes"], "{summary}");
        let card = std::fs::read_to_string(cron.join(first_card(&cron, &summary))).unwrap();
        assert!(card.contains(named), "{card}");
        assert!(cron.join("cards").is_dir() && cron.join("runs/digest").is_dir());
    }
}

/// The same `docs/` pushed to the origin's `main` reaches a reviewer's laptop through
/// `builder land`, which merges the proposal onto the origin's tip and moves the
/// checked-out branch there with libgit2's checkout. The merge writes a tree git
/// writes (an index holds one entry a path), and the move would refuse one that is
/// not: nothing is written through the link.
#[test]
fn land_never_writes_through_a_link_a_tree_git_refuses_brought() {
    let env = TestEnv::new();
    let origin = with_origin(&env);
    git(&env, &env.root, &["push", "-q", "-u", "origin", "main"]);
    let mal = mallory_clone(&env, &origin);
    let LinkAttack { outside, c1, c2, .. } = link_attack(&env, &mal);
    push(&env, &mal, c1);
    git(&env, &env.root, &["pull", "-q", "--ff-only"]);
    push(&env, &mal, c2);
    env.write("prompts/digest.md", "---\n---\nBe brief.\n");
    builder_ok(&env, &env.root, None, &["propose", "brief", "--push"]);
    builder_ok(&env, &env.root, Some(REVIEWER), &["approve", "brief", "--push"]);
    let (code, out, err) = crate::review::builder_in(&env, &env.root, None, &["land", "brief"]);
    assert!(
        !outside.join("pwned.txt").exists(),
        "written through the link: {out}{err}"
    );
    assert_eq!(code, 0, "{out}{err}");
    let fsck = git(&env, &env.root, &["ls-tree", "HEAD:docs"]);
    assert_eq!(fsck.lines().count(), 1, "one `h` in the landed tree: {fsck}");
}
