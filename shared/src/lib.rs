//! Domain logic shared by the `runtime` and `builder` binaries: the agent-repo layout
//! and who owns which path, typed settings / prompt / record files, the policy engine,
//! the SQLite store, git helpers, providers, tools, the agent loop and the sandbox.
//! Nothing in here parses command lines or prints; the binaries do that.

#![forbid(unsafe_code)]

pub mod agent;
pub mod audit;
pub mod beneath;
pub mod cancel;
pub mod cards;
pub mod cause;
pub mod check;
pub mod diag;
pub mod durable;
pub mod env;
pub mod eval;
pub mod failpoints;
pub mod fire;
pub mod git;
pub mod gitpath;
pub mod history;
#[cfg(test)]
mod house;
#[cfg(test)]
mod import_graph;
pub mod journal;
pub mod layout;
pub mod loop_state;
pub mod manifest;
pub mod mcp;
pub mod pages;
pub mod pending;
pub mod policy;
pub mod powers;
pub mod progress;
pub mod prompt;
pub mod provider;
pub mod pushed;
pub mod records;
pub mod regular;
pub mod retro;
pub mod review;
pub mod review_report;
pub mod rules;
pub mod runs;
pub mod sandbox;
pub mod scaffold;
pub mod secrets;
pub mod settings;
pub mod shell;
pub mod state;
pub mod stats;
pub mod store;
pub mod sync;
pub mod telemetry;
#[cfg(any(test, feature = "test-support"))]
pub mod test_skip;
pub mod text;
pub mod tools;
pub mod trace;
pub mod worker;
pub mod yamlpos;
