//! Hardening of the calling process (issue 17, item 6). The runtime holds the
//! provider's key in its memory and runs with the repository as its working
//! directory: a core dump (a crash, `SIGQUIT`, `SIGABRT`) would write that memory
//! into the work tree, where `git add` or a sync could take it. [`forbid_core_dumps`]
//! runs first thing in `main`, for the runtime and for the tool worker (the same
//! binary): the process is made non-dumpable, which also keeps other processes of its
//! uid from reading its memory, environment or descriptors through `/proc` or
//! `ptrace`, and its core size limit is 0 (inherited by everything it starts). Also
//! here: the other process-wide switches the tool worker throws as it restricts
//! itself (capabilities, the parent-death signal, inherited descriptors).

use std::io;

/// Why the process could not be hardened.
#[derive(Debug, thiserror::Error)]
#[error("cannot make the process non-dumpable ({what}): {source}")]
pub struct HardeningError {
    what: &'static str,
    #[source]
    source: io::Error,
}

/// Makes the calling process non-dumpable and sets its core size limit to 0.
pub fn forbid_core_dumps() -> Result<(), HardeningError> {
    set_dumpable(false).map_err(|source| HardeningError {
        what: "PR_SET_DUMPABLE",
        source,
    })?;
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

/// Makes the calling process dumpable or not (`PR_SET_DUMPABLE`): a non-dumpable
/// process's `/proc` files belong to root and no process of its uid may trace it.
pub fn set_dumpable(dumpable: bool) -> io::Result<()> {
    // SAFETY: prctl with integer arguments, no pointer.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, libc::c_ulong::from(dumpable), 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Has the kernel SIGKILL the calling process when its parent ends
/// (`PR_SET_PDEATHSIG`; a change of uid clears it).
pub fn die_with_parent() -> io::Result<()> {
    // SAFETY: prctl with integer arguments, no pointer.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// As [`die_with_parent`], for a process that sets it for itself after its `exec`
/// (spawned with no hook in the child, so the spawn can be a `vfork` rather than a
/// copy of the parent's page tables): `Err` when `expected`, the process that
/// spawned it, is no longer its parent. It ended before the signal was asked for, so
/// the kernel will never send it.
pub fn die_with_parent_of(expected: u32) -> io::Result<()> {
    die_with_parent()?;
    let parent = rustix::process::getppid().map_or(0, |p| p.as_raw_nonzero().get() as u32);
    if parent != expected {
        return Err(io::Error::other(format!(
            "the process that started this one ({expected}) has ended"
        )));
    }
    Ok(())
}

/// Empties the bounding, ambient, effective, permitted and inheritable capability
/// sets of the calling thread.
pub fn drop_capabilities() -> io::Result<()> {
    // SAFETY: prctl with integer arguments; an unknown capability answers EINVAL.
    unsafe {
        for cap in 0..64 {
            libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
        }
        libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0);
    }
    let none = rustix::thread::CapabilitySet::empty();
    rustix::thread::set_capabilities(
        None,
        rustix::thread::CapabilitySets {
            effective: none,
            permitted: none,
            inheritable: none,
        },
    )
    .map_err(io::Error::from)
}

/// Closes every descriptor above stderr this process inherited. For the first lines
/// of a process's `main`, before it opens a descriptor of its own: nothing of this
/// process refers to the ones closed.
pub fn close_inherited_descriptors() {
    // SAFETY: close_range(2) takes integers; at the start of `main` no object of
    // this process owns a descriptor above 2 (the caller's contract above), so none
    // is closed under an owner.
    unsafe {
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
    }
}
