//! Hooks a `Command` runs in its child between `fork` and `exec` (`pre_exec`): die
//! with the parent, leave no inherited descriptor open across `exec`, raise a
//! resource limit. Each hook makes only async-signal-safe calls, which is what the
//! child of a multithreaded parent may make there.

use std::os::unix::process::CommandExt;
use std::process::Command;

/// The child of `cmd` is SIGKILLed when the process that spawned it ends, also when
/// that one is SIGKILLed.
pub fn die_with_parent(cmd: &mut Command) -> &mut Command {
    // SAFETY: the hook makes one prctl with integer arguments, async-signal-safe,
    // touching no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        })
    }
}

/// Every descriptor above stderr the child of `cmd` inherited is closed at its
/// `exec` (`close_range` with `CLOSE_RANGE_CLOEXEC`).
pub fn close_inherited_descriptors(cmd: &mut Command) -> &mut Command {
    // SAFETY: close_range only marks descriptors close-on-exec; it is
    // async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC);
            Ok(())
        })
    }
}

/// Marks every descriptor of this process above stderr close-on-exec, so a child
/// spawned next inherits none of them past its `exec`. For a spawner that wants its
/// child made with `posix_spawn` (a `vfork`, no copy of the spawner's memory), which
/// a `pre_exec` hook such as [`close_inherited_descriptors`] rules out. Nothing is
/// closed here; a descriptor another thread opens without `O_CLOEXEC` after this call
/// would still be inherited, so the caller is the only thread opening descriptors.
pub fn mark_descriptors_close_on_exec() {
    // SAFETY: close_range(2) with CLOSE_RANGE_CLOEXEC takes integers and only sets a
    // flag on descriptors; no descriptor is closed under its owner.
    unsafe {
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC);
    }
}

/// The child of `cmd` may write core files of any size (`RLIMIT_CORE` unlimited).
pub fn unlimited_core_dumps(cmd: &mut Command) -> &mut Command {
    // SAFETY: setrlimit takes a `rlimit` the hook owns on its stack; it is
    // async-signal-safe and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            let all = libc::rlimit {
                rlim_cur: libc::RLIM_INFINITY,
                rlim_max: libc::RLIM_INFINITY,
            };
            libc::setrlimit(libc::RLIMIT_CORE, &all);
            Ok(())
        })
    }
}
