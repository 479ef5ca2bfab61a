//! Domain logic shared by the `runtime` and `builder` binaries: the agent-repo layout
//! and who owns which path, typed settings / prompt / record files, the policy engine,
//! the SQLite store, git helpers, providers, tools, the agent loop and the sandbox.
//! Nothing in here parses command lines or prints; the binaries do that.

pub mod check;
pub mod diag;
pub mod git;
pub mod layout;
pub mod policy;
pub mod prompt;
pub mod records;
pub mod scaffold;
pub mod settings;
pub mod store;
pub mod yamlpos;
