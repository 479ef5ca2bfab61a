//! Tests that need something of the machine (a Landlock ABI, root, a program, a
//! private mount namespace) skip where it is missing, and say so on stderr. The unit
//! tests of this crate and the e2e suite (`tests/skip.rs` re-exports this module,
//! through the `test-support` feature) skip through this one function. Cargo
//! hides a passing test's output, so a skip alone would let a capability that went
//! missing on CI pass unseen: a run that declares what its machine has
//! (`TEST_CAPABILITIES=landlock,root,...`, as `.ci/run` does) turns each skip for a
//! declared capability into a failure.

/// What a test may need of the machine. Names (kebab-case) are what
/// `TEST_CAPABILITIES` lists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::EnumString, strum::IntoStaticStr, strum::VariantNames)]
#[strum(serialize_all = "kebab-case")]
pub enum Capability {
    /// A kernel that enforces the Landlock ABI the runtime targets.
    Landlock,
    /// Running as root (daemons under `/var/lib`, runs as uid 65534).
    Root,
    /// `ssh-keygen` on PATH (signed approvals).
    SshKeygen,
    /// `strace` that can trace a fire (counting its fsyncs).
    Strace,
    /// `systemd-analyze` on PATH (the shipped units are verified).
    SystemdAnalyze,
    /// A private mount namespace (a read-only repository, a full disk).
    MountNamespace,
    /// A crashing process leaves a core file in its working directory
    /// (`/proc/sys/kernel/core_pattern` is a plain name).
    CoreFiles,
    /// The test hooks a debug build of the binaries carries.
    DebugHooks,
    /// A kernel that makes MPTCP sockets (`net.mptcp.enabled`), which Landlock's TCP
    /// port rules do not judge.
    Mptcp,
    /// A kernel that makes SCTP sockets (the `sctp` module), likewise.
    Sctp,
}

/// The variable a run declares its machine's capabilities in.
pub const DECLARED: &str = "TEST_CAPABILITIES";

/// Says a test (or part of one) is skipped for want of `cap`, and why; fails the test
/// instead where the run declared `cap`.
pub fn skip(cap: Capability, why: &str) {
    let name: &'static str = cap.into();
    assert!(
        !declared().contains(&cap),
        "{DECLARED} declares `{name}`, but this test would skip: {why}"
    );
    eprintln!("SKIPPED ({name}): {why}");
}

/// The capabilities the run declared. A name this list does not know fails: a typo
/// in CI must not declare nothing.
fn declared() -> Vec<Capability> {
    let Some(list) = std::env::var_os(DECLARED) else {
        return vec![];
    };
    list.to_string_lossy()
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse().unwrap_or_else(|_| {
                panic!(
                    "{DECLARED}: unknown capability `{s}` (known: {})",
                    <Capability as strum::VariantNames>::VARIANTS.join(", ")
                )
            })
        })
        .collect()
}
