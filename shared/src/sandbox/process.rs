//! Hardening of the runtime's own process (issue 17, item 6). The runtime holds the
//! provider's key in its memory and runs with the repository as its working
//! directory: a core dump (a crash, `SIGQUIT`, `SIGABRT`) would write that memory
//! into the work tree, where `git add` or a sync could take it. [`forbid_core_dumps`]
//! runs first thing in `main`, for the runtime and for the tool worker (the same
//! binary): the process is made non-dumpable, which also keeps other processes of its
//! uid from reading its memory, environment or descriptors through `/proc` or
//! `ptrace`, and its core size limit is 0 (inherited by everything it starts).

/// Why the process could not be hardened.
#[derive(Debug, thiserror::Error)]
#[error("cannot make the process non-dumpable ({what}): {source}")]
pub struct HardeningError {
    what: &'static str,
    #[source]
    source: std::io::Error,
}

/// Makes the calling process non-dumpable and sets its core size limit to 0.
pub fn forbid_core_dumps() -> Result<(), HardeningError> {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(HardeningError {
            what: "PR_SET_DUMPABLE",
            source: std::io::Error::last_os_error(),
        });
    }
    let none = rustix::process::Rlimit {
        current: Some(0),
        maximum: Some(0),
    };
    rustix::process::setrlimit(rustix::process::Resource::Core, none).map_err(|e| HardeningError {
        what: "RLIMIT_CORE",
        source: e.into(),
    })
}

/// Whether the calling process is dumpable (`PR_GET_DUMPABLE`).
pub fn dumpable() -> bool {
    // SAFETY: prctl with integer arguments, no pointer.
    unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) == 1 }
}
