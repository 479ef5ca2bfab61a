//! Signed approvals' cost on every fire under review: reading 100 approvals from
//! `refs/builder/approvals` and judging each (parsing its SSHSIG signature and
//! verifying it against a 10-key allowed-signers file), against reading them by
//! identity alone. Keys and signatures are made once with the real `ssh-keygen`.
// Benchmark code is test code: a failed setup step should panic and stop the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion};
use shared::git::Person;
use shared::review::approvals::{self, Approvals, Signing};
use shared::review::signing::{AllowedSigners, ApprovalRule};
use std::path::Path;

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let repo = git2::Repository::init(dir.path().join("repo")).unwrap();
    let mut signers = String::new();
    let mut keys = Vec::new();
    for i in 0..10 {
        let key = dir.path().join(format!("k{i}"));
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
    let blob = repo.blob(b"x").unwrap();
    for n in 0..100 {
        let mut tb = repo.treebuilder(None).unwrap();
        tb.insert(format!("f{n}"), blob, 0o100644).unwrap();
        let tree = tb.write().unwrap();
        let i = n % 10;
        let who = Person {
            name: format!("R{i}"),
            email: format!("r{i}@example.com"),
        };
        let signing = Signing {
            key: keys[i].clone(),
            program: "ssh-keygen".into(),
        };
        let body = approvals::signed_body("p", tree, tree, &who, Some(&signing)).unwrap();
        approvals::write(&repo, body, &who).unwrap();
    }
    let signed = ApprovalRule {
        runtime_email: "runtime@localhost".into(),
        signers: Some(AllowedSigners::parse(Path::new("allowed_signers"), &signers).unwrap()),
    };
    let unsigned = ApprovalRule::unsigned("runtime@localhost");
    assert_eq!(Approvals::read(&repo, &signed).unwrap().trees().len(), 100);
    c.bench_function("approvals: read and verify 100 signed (10 keys)", |b| {
        b.iter(|| Approvals::read(&repo, &signed).unwrap())
    });
    c.bench_function("approvals: read 100 by identity only", |b| {
        b.iter(|| Approvals::read(&repo, &unsigned).unwrap())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
