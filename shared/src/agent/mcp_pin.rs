//! `builder mcp pin`: starts (or, for a `url:` server, connects to) each declared
//! server once, lists its tools and writes
//! what it found to `settings/mcp.lock`, saying in words what changed against the
//! lock before (a new tool, a gained parameter, a changed description): the lock is a
//! builder change that review approves like any other.
//!
//! Pinning runs a stdio server's program in the sandbox a fire gives it (a worker of
//! the `runtime` binary: [`PinSandbox`]), handed the person's variables it asks for,
//! and connects to a `url:` server with the person's token. The sandbox keeps the
//! person's files out of its reach, but not what it is handed or the ports it is
//! granted; so what it would start is trusted first, as `direnv allow` trusts an `.envrc`: the first pin of
//! a server, and every pin after its declaration or its program's files changed, is
//! refused with what would run until the person says `--trust`, which is remembered
//! (per machine, outside the repository: [`TrustStore`]). A reviewer who pins a
//! proposal's branch without reading it runs nothing of it (helper-108: its script
//! read the reviewer's files, and its `url:` server got the reviewer's token).

use super::mcp_client::{list_for_pin, PinSandbox};
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
    #[error("not trusted yet: pinning would run (a program in a fire's sandbox, with what it is handed):\n{}", .0.join("\n"))]
    Untrusted(Vec<String>),
    #[error("the list of trusted MCP servers ({path}) could not be {doing}: {why}")]
    TrustStore {
        path: String,
        doing: &'static str,
        why: String,
    },
}

/// Where a person's trust in what `builder mcp pin` starts is remembered: a file of
/// fingerprints outside every repository (`$XDG_STATE_HOME/builder/mcp-trusted`,
/// else `~/.local/state/builder/mcp-trusted`), so no branch can bring its own.
pub struct TrustStore {
    pub path: std::path::PathBuf,
    /// `--trust`: what is not trusted yet is, from now on.
    pub trust_new: bool,
}

impl TrustStore {
    /// The store of the person running the command, from the environment.
    pub fn of_person(trust_new: bool) -> Option<TrustStore> {
        let base = std::env::var_os("XDG_STATE_HOME")
            .filter(|v| Path::new(v).is_absolute())
            .map(std::path::PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|h| Path::new(h).is_absolute())
                    .map(|h| Path::new(&h).join(".local/state"))
            })?;
        Some(TrustStore {
            path: base.join("builder/mcp-trusted"),
            trust_new,
        })
    }

    fn trusted(&self) -> Result<std::collections::BTreeSet<String>, PinError> {
        match crate::regular::read(&self.path, crate::regular::WORK_TREE_FILE_MAX) {
            Ok(bytes) => Ok(String::from_utf8_lossy(&bytes)
                .lines()
                .filter_map(|l| l.split_whitespace().next())
                .map(String::from)
                .collect()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Default::default()),
            Err(e) => Err(self.failed("read", e)),
        }
    }

    fn add(&self, lines: &[String]) -> Result<(), PinError> {
        use std::io::Write;
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| self.failed("written", e))?;
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| self.failed("written", e))?;
        f.write_all(lines.iter().map(|l| format!("{l}\n")).collect::<String>().as_bytes())
            .map_err(|e| self.failed("written", e))
    }

    fn failed(&self, doing: &'static str, e: std::io::Error) -> PinError {
        PinError::TrustStore {
            path: self.path.display().to_string(),
            doing,
            why: e.to_string(),
        }
    }
}

/// What pinning `name` hands over, in words: the program it runs (and the digest of
/// its files) or the URL it connects to, with the person's variables it passes and
/// what its sandbox grants beyond a fire's tools' (its read roots and ports).
fn what_runs(name: &str, entry: &McpServer, digest: &str) -> String {
    let mut out = match &entry.url {
        Some(url) => format!("  `{name}`: connects to {}", crate::text::printable(url)),
        None => format!(
            "  `{name}`: runs {} ({})",
            crate::text::printable(&entry.command.join(" ")),
            digest
        ),
    };
    let vars: Vec<&str> = entry
        .token_env
        .iter()
        .chain(&entry.env_allow)
        .map(String::as_str)
        .collect();
    if !vars.is_empty() {
        out.push_str(&format!(", handing it ${}", vars.join(", $")));
    }
    if entry.url.is_none() && !entry.read.is_empty() {
        out.push_str(&format!(", reading {}", crate::text::printable(&entry.read.join(", "))));
    }
    if entry.url.is_none() && !entry.network.is_empty() {
        let ports: Vec<String> = entry.network.iter().map(u16::to_string).collect();
        out.push_str(&format!(", connecting to port(s) {}", ports.join(", ")));
    }
    out
}

/// The fingerprint of what pinning `name` starts, in the repository at `root`: its
/// declaration and its program's digest (argv and files).
fn start_fingerprint(root: &Path, name: &str, entry: &McpServer, digest: &str) -> String {
    use sha2::{Digest, Sha256};
    let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
    let declared = serde_json::json!({
        "root": root.to_string_lossy(), "server": name, "digest": digest, "command": entry.command,
        "url": entry.url, "token_env": entry.token_env, "env_allow": entry.env_allow,
        "network": entry.network, "read": entry.read,
    });
    hex::encode(Sha256::digest(declared.to_string().as_bytes()))
}

/// A server to pin: its name, its declaration, and what it starts (its package and
/// digest, [`what_starts`]).
type Start<'s> = (&'s String, &'s McpServer, (Option<String>, String));

/// What each server to pin (`only`, or all) starts, once every one of them is trusted
/// ([`require_trust`]).
fn trusted_starts<'s>(
    root: &Path,
    servers: &'s McpServers,
    only: Option<&str>,
    path: &str,
    store: &TrustStore,
) -> Result<(Vec<Start<'s>>, Vec<String>), PinError> {
    if let Some(name) = only {
        if !servers.contains_key(name) {
            return Err(PinError::Unknown(name.to_string()));
        }
    }
    let mut starts = Vec::new();
    for (name, entry) in servers.iter().filter(|(n, _)| only.is_none_or(|o| o == n.as_str())) {
        starts.push((name, entry, what_starts(root, name, entry, path)?));
    }
    let digests: Vec<_> = starts.iter().map(|(n, e, (_, d))| (*n, *e, d.clone())).collect();
    let trusted_now = require_trust(root, &digests, store)?;
    Ok((starts, trusted_now))
}

/// Refuses, naming what would run, unless every server to pin is trusted (or `store`
/// trusts the new ones now, remembering them: what they run, in words, is returned).
fn require_trust(
    root: &Path,
    servers: &[(&String, &McpServer, String)],
    store: &TrustStore,
) -> Result<Vec<String>, PinError> {
    let trusted = store.trusted()?;
    let new: Vec<(String, String)> = servers
        .iter()
        .map(|(name, entry, digest)| {
            (
                start_fingerprint(root, name, entry, digest),
                what_runs(name, entry, digest),
            )
        })
        .filter(|(fp, _)| !trusted.contains(fp))
        .collect();
    if new.is_empty() {
        return Ok(Vec::new());
    }
    if !store.trust_new {
        return Err(PinError::Untrusted(new.into_iter().map(|(_, said)| said).collect()));
    }
    // One line per fingerprint, its words made printable: no declaration can add a
    // line of its own (helper-111: a URL's newline, which the URL parser drops).
    let root = root.to_string_lossy();
    let root = crate::text::printable(&root);
    store.add(
        &new.iter()
            .map(|(fp, said)| format!("{fp} {root}:{}", crate::text::printable(said.trim())))
            .collect::<Vec<_>>(),
    )?;
    Ok(new.into_iter().map(|(_, said)| said).collect())
}

/// What a pin did: the servers it trusted now (`--trust`: what each runs, in words)
/// and what pinning each server changed.
#[derive(Debug, Clone, PartialEq)]
pub struct Pinning {
    pub trusted_now: Vec<String>,
    pub pinned: Vec<Pinned>,
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

/// `listed`, unless a definition holds the value of the server's `token_env` or of a
/// variable it is handed (`env_allow`, which a fire's redactor treats as secrets): a
/// server that echoes one would have it committed in the lock (helper-110).
fn without_token(entry: &McpServer, listed: Vec<serde_json::Value>) -> Result<Vec<serde_json::Value>, String> {
    let text: Vec<String> = listed.iter().map(ToString::to_string).collect();
    for var in entry.secret_vars() {
        // As the redactor: values shorter than 6 bytes would match by chance.
        let Some(value) = std::env::var(var).ok().filter(|t| t.len() >= 6) else {
            continue;
        };
        if text.iter().any(|t| t.contains(&value)) {
            return Err(format!(
                "a tool definition contains the value of `{var}`: not pinned, it would be committed"
            ));
        }
    }
    Ok(listed)
}

/// Pins `only` (or every declared server) and writes the lock; servers not pinned
/// this time keep their pins, servers no longer declared lose them.
pub async fn pin(
    root: &Path,
    servers: &McpServers,
    only: Option<&str>,
    path: &str,
    store: &TrustStore,
    sandbox: &PinSandbox,
) -> Result<Pinning, PinError> {
    let (starts, trusted_now) = trusted_starts(root, servers, only, path, store)?;
    let mut lock = McpLock::load(root)?;
    let before = lock.clone();
    lock.version = 1;
    lock.servers.retain(|name, _| servers.contains_key(name));
    let mut pinned = Vec::new();
    for (name, entry, (package, digest)) in starts {
        let listed = list_for_pin(root, name, entry, path, sandbox)
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
    Ok(Pinning {
        trusted_now,
        pinned: out,
    })
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
