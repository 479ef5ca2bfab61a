//! The e2e suite's skips: [`shared::test_skip`], which the unit tests of `shared`
//! use too, and the test that a declared capability turns a skip into a failure.

pub use shared::test_skip::*;

#[test]
fn a_declared_capability_turns_a_skip_into_a_failure() {
    // Run in a child: the variable is the process's.
    let exe = std::env::current_exe().unwrap();
    let run = |declared: &str| {
        std::process::Command::new(&exe)
            .args(["--exact", "skip::skip_strace_for_the_test_above", "--include-ignored"])
            .env(DECLARED, declared)
            .output()
            .unwrap()
    };
    assert!(run("").status.success(), "nothing declared: the skip passes");
    assert!(
        run("root, landlock").status.success(),
        "strace not declared: the skip passes"
    );
    let failed = run("root,strace");
    assert!(!failed.status.success(), "strace declared: the skip fails the test");
    assert!(
        String::from_utf8_lossy(&failed.stdout).contains("declares `strace`"),
        "{}",
        String::from_utf8_lossy(&failed.stdout)
    );
    let typo = run("strance");
    assert!(!typo.status.success(), "an unknown name fails");
}

/// Driven by the test above only.
#[test]
#[ignore = "run by a_declared_capability_turns_a_skip_into_a_failure"]
fn skip_strace_for_the_test_above() {
    skip(Capability::Strace, "the test above asks for this skip");
}
