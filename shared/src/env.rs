//! Environment variables passed on to child processes, named once. Both model-run
//! commands (`tools::exec`) and the `git gc --auto` the runtime starts (`git`) clear
//! their child's environment and pass through only these, so the list lives below
//! both of them.

/// Environment variables passed to model-run commands; everything else is dropped.
pub const PASSTHROUGH_ENV: &[&str] = &["PATH", "LANG", "LC_ALL", "TZ"];
