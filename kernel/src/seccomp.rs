//! Installing seccomp programs on the calling thread (and what it starts
//! afterwards), and asking whether the kernel has seccomp at all. The programs are
//! the caller's policy, compiled with `seccompiler`.

use seccompiler::{apply_filter, BpfProgram};
use std::io;

/// The bit that marks an x32 syscall number on x86_64 (`__X32_SYSCALL_BIT`).
pub const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// Why the programs were not installed.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// `no_new_privs`, which the kernel requires of an unprivileged caller, was refused.
    #[error("{0}")]
    NoNewPrivs(#[source] io::Error),
    #[error(transparent)]
    Apply(#[from] seccompiler::Error),
}

/// Sets `no_new_privs`, then installs `programs` in order on the calling thread.
pub fn install(programs: &[BpfProgram]) -> Result<(), InstallError> {
    rustix::thread::set_no_new_privs(true).map_err(|e| InstallError::NoNewPrivs(e.into()))?;
    for p in programs {
        apply_filter(p)?;
    }
    Ok(())
}

/// The seccomp mode of the calling thread (`PR_GET_SECCOMP`); an error without
/// seccomp in the kernel (`EINVAL`).
pub fn mode() -> io::Result<i32> {
    // SAFETY: PR_GET_SECCOMP takes no pointer and changes nothing.
    let mode = unsafe { libc::prctl(libc::PR_GET_SECCOMP) };
    if mode < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(mode)
}
