//! `builder mcp pin`: starts (or, for a `url:` server, connects to) each declared
//! server once, lists its tools and writes
//! what it found to `settings/mcp.lock`, saying in words what changed against the
//! lock before (a new tool, a gained parameter, a changed description): the lock is a
//! builder change that review approves like any other.

use super::mcp_client::list_for_pin;
use crate::mcp::config::{package_spec, McpServer, McpServers};
use crate::mcp::digest::command_digest;
use crate::mcp::lock::{lock_changes, pin_of, LockError, McpLock, ServerPin};
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error("no MCP server `{0}` in settings/runtime.yaml")]
    Unknown(String),
    #[error("MCP server `{server}`: {why}")]
    Unpinned { server: String, why: String },
    #[error("MCP server `{server}` could not be listed: {why}")]
    Listing { server: String, why: String },
    #[error(transparent)]
    Lock(#[from] LockError),
}

/// What pinning one server changed, in words.
#[derive(Debug, Clone, PartialEq)]
pub struct Pinned {
    pub server: String,
    pub tools: usize,
    pub changes: Vec<String>,
}

/// The package a stdio server's launcher fetches and the digest of its program; for a
/// `url:` server neither (it runs elsewhere: its URL is what the pin says starts).
fn what_starts(root: &Path, name: &str, entry: &McpServer, path: &str) -> Result<(Option<String>, String), PinError> {
    if entry.url.is_some() {
        return Ok((None, String::new()));
    }
    let package = package_spec(&entry.command).map_err(|why| PinError::Unpinned {
        server: name.to_string(),
        why,
    })?;
    Ok((package, command_digest(&entry.command, root, path)?))
}

/// `listed`, unless a definition holds the value of the server's `token_env` (a
/// server that echoes its token would have it committed in the lock).
fn without_token(entry: &McpServer, listed: Vec<serde_json::Value>) -> Result<Vec<serde_json::Value>, String> {
    // As the redactor: values shorter than 6 bytes would match by chance.
    let token = entry
        .token_env
        .as_deref()
        .and_then(|v| Some((v, std::env::var(v).ok().filter(|t| t.len() >= 6)?)));
    match token {
        Some((var, value)) if listed.iter().any(|t| t.to_string().contains(&value)) => Err(format!(
            "a tool definition contains the value of `{var}` (its token): not pinned, it would be committed"
        )),
        _ => Ok(listed),
    }
}

/// Pins `only` (or every declared server) and writes the lock; servers not pinned
/// this time keep their pins, servers no longer declared lose them.
pub async fn pin(root: &Path, servers: &McpServers, only: Option<&str>, path: &str) -> Result<Vec<Pinned>, PinError> {
    if let Some(name) = only {
        if !servers.contains_key(name) {
            return Err(PinError::Unknown(name.to_string()));
        }
    }
    let mut lock = McpLock::load(root)?;
    let before = lock.clone();
    lock.version = 1;
    lock.servers.retain(|name, _| servers.contains_key(name));
    let home = tempfile::tempdir().map_err(|e| PinError::Listing {
        server: String::new(),
        why: e.to_string(),
    })?;
    let mut pinned = Vec::new();
    for (name, entry) in servers.iter().filter(|(n, _)| only.is_none_or(|o| o == n.as_str())) {
        let (package, digest) = what_starts(root, name, entry, path)?;
        let mut env = crate::tools::exec::ExecContext::scrubbed_env(home.path());
        for v in &entry.env_allow {
            if let Ok(val) = std::env::var(v) {
                env.push((v.clone(), val));
            }
        }
        let listed = list_for_pin(root, entry, &env)
            .await
            .and_then(|listed| without_token(entry, listed))
            .map_err(|why| PinError::Listing {
                server: name.clone(),
                why,
            })?;
        let tools: std::collections::BTreeMap<String, _> = listed
            .iter()
            .map(|t| (t["name"].as_str().unwrap_or("").to_string(), pin_of(t)))
            .collect();
        warn_never_offered(name, tools.keys());
        lock.servers.insert(
            name.clone(),
            ServerPin {
                command: entry.command.clone(),
                command_digest: digest,
                url: entry.url.clone(),
                package,
                tools,
            },
        );
        pinned.push(name.clone());
    }
    lock.save(root)?;
    let mut said = lock_changes(Some(&before), &lock);
    let mut out: Vec<Pinned> = pinned
        .into_iter()
        .map(|server| Pinned {
            tools: lock.servers.get(&server).map_or(0, |p| p.tools.len()),
            changes: said
                .remove(&server)
                .unwrap_or_default()
                .iter()
                .map(ToString::to_string)
                .collect(),
            server,
        })
        .collect();
    // Servers no longer declared lost their pins: said too, not dropped silently.
    out.extend(
        said.into_iter()
            .filter(|(server, _)| !lock.servers.contains_key(server))
            .map(|(server, changes)| Pinned {
                tools: 0,
                changes: changes.iter().map(ToString::to_string).collect(),
                server,
            }),
    );
    Ok(out)
}

/// Warns of each listed tool of `server` a fire will never offer: its name is not one
/// providers accept ([`crate::mcp::lock::offerable`]); it is pinned all the same, so
/// the lock says what the server lists.
fn warn_never_offered<'a>(server: &str, tools: impl Iterator<Item = &'a String>) {
    for tool in tools.filter(|t| !crate::mcp::lock::offerable(server, t)) {
        tracing::warn!(
            "`{}` will never be offered: not a name providers accept (ASCII letters, digits, `_` and `-`, at most 64)",
            crate::text::printable(&crate::mcp::tool_name(server, tool))
        );
    }
}
