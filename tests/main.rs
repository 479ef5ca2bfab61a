//! End-to-end tests: drive the real `runtime` and `builder` binaries against temporary
//! git repositories, model providers played by an HTTP server on 127.0.0.1 speaking
//! the real wire formats, SQLite on disk and Landlock in the real kernel.

#![forbid(unsafe_code)]
// This package is test code from top to bottom (helpers included, not only the
// `#[test]` functions clippy.toml covers): a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod util;

mod agent_loop;
mod approval_crash;
mod approval_pins;
mod approved_tree;
mod builder_cmds;
mod builder_truth;
mod checkout_ops;
mod concurrency;
mod crash;
mod crash_suite;
mod cron_box;
mod cron_world;
mod docs;
mod escape;
mod eval_review;
mod exit_codes;
mod failure_lines;
mod faults;
mod fire;
mod full_disk;
mod host_view;
mod hostile_review;
mod identity;
mod inert_output;
mod init_check;
mod isolation;
mod mcp;
mod metadata;
mod operator;
mod otlp;
mod progress;
mod races;
mod records_cases;
mod records_hardening;
mod repos;
mod review;
mod signals;
mod signed;
mod skip;
mod snapshots;
mod team;
mod team_crash;
mod team_scenario;
mod two_key_attacks;
