//! The edge `runtime` and `builder` share: a command's error ([`error::CommandError`],
//! classified by its cause and printed as `error:` and `hint:` lines), the man pages
//! ([`man`]), the lint that every command and argument has help ([`help`]) and where
//! log lines go, redacted ([`log`]). Each
//! binary keeps what differs: its exit codes, its outcomes and which code each gets.

#![forbid(unsafe_code)]

/// `--version` of both binaries: the package version and the commit they were built
/// from (`unknown` outside a git checkout).
pub const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("BUILD_COMMIT"), ")");

pub mod error;
pub mod help;
pub mod log;
pub mod man;
pub mod stdout;
