//! Environment variables passed on to child processes, named once. Both model-run
//! commands (`tools::exec`) and the `git gc --auto` the runtime starts (`git`) clear
//! their child's environment and pass through only these, so the list lives below
//! both of them.

/// Environment variables passed to model-run commands; everything else is dropped.
pub const PASSTHROUGH_ENV: &[&str] = &["PATH", "LANG", "LC_ALL", "TZ"];

/// Set for each model-run command to `<run-id>:<call-id>`, the tool call that runs it
/// (keyed as the tool ledger keys it): an idempotency key, so a tool the builder wrote
/// can tell a call it already served (the runtime never re-runs a completed call, nor
/// a command whose run an interruption left uncertain).
pub const CALL_ID_ENV: &str = "RUNTIME_CALL_ID";

/// Whether `name` is one of the system's own variables, which hold no secret and whose
/// values are common words and paths (`HOME`, `USER`, `LANG`, `LC_*`, `XDG_*`): an
/// MCP server's `env_allow` values are redacted as secrets, but not these.
pub fn is_well_known_setting(name: &str) -> bool {
    const NAMES: [&str; 11] = [
        "HOME", "USER", "LOGNAME", "PATH", "LANG", "LANGUAGE", "TZ", "TERM", "TMPDIR", "SHELL", "PWD",
    ];
    NAMES.contains(&name) || name.starts_with("LC_") || name.starts_with("XDG_")
}

/// Whether `name` can name an environment variable in settings: ASCII letters, digits
/// and `_` (`OPENAI_API_KEY`), nothing that could be a value put there by mistake.
pub fn is_variable_name(name: &str) -> bool {
    !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}
