//! Signed approvals end to end (`review.require_signed`): keys made with the real
//! `ssh-keygen`, approvals signed by `builder approve` through git's signing settings
//! or `--key`. An approval that merely names a reviewer (an identity set through
//! environment variables), or one signed by a key the allowed-signers file does not
//! list for that reviewer, is written straight to `refs/builder/approvals` (the
//! attack), seen there, and then counts for none of the judges: `builder proposals`,
//! `builder merge`, `builder audit` and the runtime's two-key check.

use crate::review::{builder_in, builder_ok, fire_in, git, require_review_through_review, state, REVIEWER};
use crate::util::TestEnv;
use serde_json::Value;
use shared::review::approvals::{self, Signing};
use std::path::PathBuf;

/// An unencrypted Ed25519 key pair under the test's home: (private key path, public
/// key line). `None` when `ssh-keygen` is missing.
fn keygen(env: &TestEnv, name: &str) -> Option<(PathBuf, String)> {
    let key = env.home.join(format!("id_{name}"));
    let ok = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", name, "-f"])
        .arg(&key)
        .status()
        .ok()?
        .success();
    ok.then(|| {
        let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
        (key, public)
    })
}

/// Writes an approval of the proposal `name` straight to the approvals ref, the way
/// someone bypassing `builder approve` would, signed with `key` when given.
fn forge_approval(env: &TestEnv, name: &str, approver: &str, key: Option<&PathBuf>) {
    let repo = git2::Repository::open(&env.root).unwrap();
    let head = repo
        .find_branch(&format!("proposals/{name}"), git2::BranchType::Local)
        .unwrap()
        .get()
        .peel_to_commit()
        .unwrap();
    let tree = shared::review::builder_tree_of(&head.tree().unwrap()).unwrap();
    let person = shared::review::parse_person(approver).unwrap();
    let signing = key.map(|k| Signing {
        key: k.clone(),
        program: "ssh-keygen".into(),
    });
    let body = approvals::signed_body(name, tree, head.id(), &person, signing.as_ref()).unwrap();
    approvals::write(&repo, body, &person).unwrap();
}

#[test]
fn with_signed_approvals_required_only_a_key_listed_for_the_approver_counts() {
    let env = TestEnv::new();
    let Some((rev_key, rev_pub)) = keygen(&env, "rev") else {
        eprintln!("skipped: ssh-keygen is not installed");
        return;
    };
    let (eve_key, _) = keygen(&env, "eve").unwrap();
    let rev_key_arg = rev_key.to_str().unwrap();
    // Review is on already, with approvals by identity alone; turning signed review on
    // goes through review itself, the approval signed.
    require_review_through_review(&env);
    env.write(
        "settings/allowed_signers",
        &format!("# who may approve prompt changes\nrev@example.com namespaces=\"builder-approval\" {rev_pub}"),
    );
    let settings = env.read("settings/runtime.yaml");
    env.write(
        "settings/runtime.yaml",
        &format!("{settings}review:\n  require_signed: true\n  allowed_signers: settings/allowed_signers\n"),
    );
    builder_ok(
        &env,
        &env.root,
        None,
        &["propose", "signed", "-m", "Require signed review"],
    );
    let out = builder_ok(
        &env,
        &env.root,
        Some(REVIEWER),
        &["approve", "signed", "--key", rev_key_arg],
    );
    assert!(out.contains("signed (SSH, namespace builder-approval)"), "{out}");
    builder_ok(&env, &env.root, None, &["merge", "signed"]);
    let (code, summary) = fire_in(&env, &env.root, "digest");
    assert_eq!(code, 0, "{summary}");
    let signed_approval = git(&env, &env.root, &["rev-parse", "refs/builder/approvals"]);
    assert_eq!(
        env.receipt(&summary)["inputs"]["approval"]["id"],
        signed_approval.as_str()
    );

    // A prompt change, proposed by Eng.
    env.write("prompts/digest.md", "---\n---\nA tweak.\n");
    builder_ok(&env, &env.root, None, &["propose", "tweak"]);
    // Rev's name and address through GIT_AUTHOR_* but no key: refused, nothing written.
    let (code, _, err) = builder_in(&env, &env.root, Some(REVIEWER), &["approve", "tweak"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no signing key is configured"), "{err}");
    // Eve's key claiming to be Rev: refused before anything is written.
    let (code, _, err) = builder_in(
        &env,
        &env.root,
        None,
        &[
            "approve",
            "tweak",
            "--reviewer",
            "Rev <rev@example.com>",
            "--key",
            eve_key.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("would not count") && err.contains("is not in settings/allowed_signers"),
        "{err}"
    );
    assert_eq!(
        git(&env, &env.root, &["rev-parse", "refs/builder/approvals"]),
        signed_approval,
        "refused approvals write nothing"
    );

    // The attack: both approvals written to the ref directly. They are there...
    forge_approval(&env, "tweak", "Rev <rev@example.com>", None);
    forge_approval(&env, "tweak", "Rev <rev@example.com>", Some(&eve_key));
    let repo = git2::Repository::open(&env.root).unwrap();
    let all = approvals::load(&repo).unwrap();
    let forged: Vec<_> = all.iter().filter(|a| a.body.proposal == "tweak").collect();
    assert_eq!(forged.len(), 2, "the forged approvals are on the ref");
    assert!(forged[0].body.signature.is_none() && forged[1].body.signature.is_some());
    // ...and count for nobody.
    assert_ne!(state(&env, &env.root, "tweak"), "approved");
    let (code, _, err) = builder_in(&env, &env.root, None, &["merge", "tweak"]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("no approval of it counts"), "{err}");
    assert!(
        err.contains("it is not signed") && err.contains("is not in settings/allowed_signers"),
        "{err}"
    );
    // Landed without builder: the audit flags it and the runtime refuses to fire.
    let before = git(&env, &env.root, &["rev-parse", "HEAD"]);
    git(
        &env,
        &env.root,
        &["merge", "-q", "--no-ff", "--no-edit", "proposals/tweak"],
    );
    let (code, out, _) = builder_in(&env, &env.root, None, &["audit", "--json"]);
    assert_eq!(code, 1, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
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
    assert!(detail.contains("it is not signed"), "{detail}");

    // Undo the bypass; Rev signs through git's own SSH signing settings: it counts.
    git(&env, &env.root, &["reset", "-q", "--hard", &before]);
    git(&env, &env.root, &["config", "gpg.format", "ssh"]);
    git(&env, &env.root, &["config", "user.signingkey", rev_key_arg]);
    let out = builder_ok(&env, &env.root, Some(REVIEWER), &["approve", "tweak"]);
    assert!(out.contains("signed"), "{out}");
    assert_eq!(state(&env, &env.root, "tweak"), "approved");
    builder_ok(&env, &env.root, None, &["merge", "tweak"]);
    // History from before signatures were required is judged by its own settings:
    // the unsigned approval of that time still covers it.
    let (code, out, _) = builder_in(&env, &env.root, None, &["audit"]);
    assert_eq!(code, 0, "{out}");
    let (code, summary) = fire_in(&env, &env.root, "digest");
    assert_eq!(code, 0, "{summary}");
    assert_eq!(
        env.receipt(&summary)["inputs"]["approval"]["id"],
        git(&env, &env.root, &["rev-parse", "refs/builder/approvals"]).as_str()
    );
}
