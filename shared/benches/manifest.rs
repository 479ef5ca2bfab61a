//! What the metadata manifest (issue 10, item 6) adds to a fire: the check before it
//! (scan git's index for builder-owned paths, `lstat` each, hash each hook, compare
//! with the recorded manifest read from `.runtime/state.db`) and the second scan at
//! its end. Measured on the scaffold (`builder init`) and on a repository with 2,000
//! more builder-owned files (`prompts/`, `tools/`, `evals/`) in 40 directories, both
//! committed, with the manifest already recorded (the steady state of a cron box).

#![forbid(unsafe_code)]
// Benchmark code is test code: a failed setup step should panic and stop the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion};
use shared::layout::Ownership;
use shared::manifest;
use shared::state::StateDb;
use std::path::Path;

/// A scaffolded repository with `extra` more builder-owned files, all committed.
fn repo(extra: usize) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    shared::scaffold::init(root).unwrap();
    for i in 0..extra {
        let top = ["prompts", "tools", "evals"][i % 3];
        let p = root.join(format!("{top}/d{:02}/f{i:04}.md", i % 40));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, format!("file {i}\n")).unwrap();
    }
    let repo = git2::Repository::open(root).unwrap();
    let mut index = repo.index().unwrap();
    index.add_all(["*"], git2::IndexAddOption::DEFAULT, None).unwrap();
    index.write().unwrap();
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let sig = git2::Signature::now("Eng", "eng@example.com").unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "scaffold", &tree, &[]).unwrap();
    dir
}

fn bench_repo(c: &mut Criterion, name: &str, root: &Path) {
    let repo = git2::Repository::open(root).unwrap();
    let ownership = Ownership::new(root);
    let mut db = StateDb::open(root).unwrap();
    let (now, changes) = manifest::check_and_record(&repo, root, &ownership, &mut db, true).unwrap();
    assert!(changes.is_empty());
    eprintln!(
        "{name}: {} builder-owned paths, {} hooks",
        now.files.len(),
        now.hooks.len()
    );
    c.bench_function(&format!("manifest check before a fire, {name}"), |b| {
        b.iter(|| {
            let (_, changes) = manifest::check_and_record(&repo, root, &ownership, &mut db, true).unwrap();
            assert!(changes.is_empty());
        })
    });
    c.bench_function(&format!("manifest scan at the end of a fire, {name}"), |b| {
        b.iter(|| {
            let end = manifest::scan(&repo, root, &ownership, Some(&now)).unwrap();
            assert!(end.changes_since(&now).is_empty());
        })
    });
}

fn manifest_cost(c: &mut Criterion) {
    let scaffold = repo(0);
    bench_repo(c, "scaffold", scaffold.path());
    let big = repo(2000);
    bench_repo(c, "2,000 builder files", big.path());
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(30);
    targets = manifest_cost
}
criterion_main!(benches);
