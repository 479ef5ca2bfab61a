//! Policy engine speed: one decision for a typical shell command against 100 rules
//! (target: median at most 2 µs), and one path classification (at most 200 ns).

#![forbid(unsafe_code)]
// Benchmark code is test code: a failed setup step should panic and stop the run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion};
use shared::layout::Ownership;
use shared::policy::{Call, Policy};
use shared::settings::Permissions;
use std::hint::black_box;
use std::path::Path;

fn hundred_rules() -> Policy {
    let mut allow: Vec<String> = (0..85).map(|i| format!("Bash(tool{i} --flag*)")).collect();
    allow.push("Read(**)".into());
    allow.push("Bash(git log*)".into());
    allow.push("Bash(git status)".into());
    allow.push("Bash(ls*)".into());
    allow.push("Bash(head*)".into());
    let deny: Vec<String> = (0..8)
        .map(|i| format!("Bash(danger{i} -rf*)"))
        .chain(["Bash(rm -rf*)".to_string(), "Bash(git push*)".to_string()])
        .collect();
    assert_eq!(allow.len() + deny.len(), 100);
    let perms = Permissions {
        allow,
        deny,
        write: vec!["reports/**".into()],
        ..Permissions::default()
    };
    Policy::new(Path::new("/repo"), &perms, &[]).unwrap()
}

fn bench(c: &mut Criterion) {
    let policy = hundred_rules();
    c.bench_function("decide: git log --oneline -n 20 (100 rules)", |b| {
        b.iter(|| policy.decide(black_box(Call::RunCommand("git log --oneline -n 20 -- src/main.rs"))))
    });
    c.bench_function("decide: rm -fr reports/tmp (100 rules)", |b| {
        b.iter(|| policy.decide(black_box(Call::RunCommand("rm -fr reports/tmp"))))
    });
    c.bench_function("decide: git log | head -n 5 (parser, 100 rules)", |b| {
        b.iter(|| policy.decide(black_box(Call::RunCommand("git log --oneline | head -n 5"))))
    });
    c.bench_function("decide: write_file reports/a.md", |b| {
        b.iter(|| policy.decide(black_box(Call::WriteFile("reports/a.md"))))
    });
    let own = Ownership::new("/repo");
    c.bench_function("classify: reports/../prompts/x.md", |b| {
        b.iter(|| own.classify(black_box("reports/../prompts/x.md")))
    });
    c.bench_function("classify: /repo/reports/t/2026-11-29/r.md", |b| {
        b.iter(|| own.classify(black_box("/repo/reports/t/2026-11-29/r.md")))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
