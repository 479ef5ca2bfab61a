//! The kernel interface of the workspace, and the only crate in it allowed `unsafe`.
//! Everything here is mechanism with a safe signature: clone into namespaces, apply a
//! Landlock ruleset, install seccomp programs, set hooks that run in a child between
//! `fork` and `exec`, send signals, hold a file lock, read a terminal's size. What the
//! product decides (which paths, which system calls, which signals end a fire) stays
//! in `shared`, which forbids `unsafe` and calls these functions. Every `unsafe` block
//! here carries a `// SAFETY:` comment (the workspace denies one without).

pub mod cancel;
pub mod fs;
pub mod hardening;
pub mod landlock;
pub mod libgit2;
pub mod mount;
pub mod namespaces;
pub mod probes;
pub mod process;
pub mod seccomp;
pub mod signal;
pub mod spawn;
pub mod term;
pub mod usage;
