//! `builder mcp pin`: starts (or, for a `url:` server, connects to) each declared
//! server once, lists its tools and writes what it found to `settings/mcp.lock`,
//! saying in words what changed against the lock before (a new tool, a gained
//! parameter, a changed description): the lock is a builder change that review
//! approves like any other.
//!
//! Pinning runs a stdio server's program in the sandbox a fire gives it (a worker of
//! the `runtime` binary: [`PinSandbox`]), handed the person's variables it asks for,
//! and connects to a `url:` server with the person's token. The sandbox keeps the
//! person's files out of its reach, but not what it is handed or the ports it is
//! granted; so what it would start is trusted first ([`trust`]), as `direnv allow`
//! trusts an `.envrc`: the first pin of a server, and every pin after its declaration
//! or its program's files changed, is refused with what would run until the person
//! says `--trust`, which is remembered (per machine, outside the repository:
//! [`TrustStore`]). A reviewer who pins a proposal's branch without reading it runs
//! nothing of it (helper-108: its script read the reviewer's files, and its `url:`
//! server got the reviewer's token).

use super::mcp_client::{launch_config, list_at_url, list_in_worker, StartInput};
use crate::mcp::config::{package_spec, McpServer, McpServers};
use crate::mcp::digest::command_digest;
use crate::mcp::lock::{lock_changes, pin_of, LockError, McpLock, ServerPin};
use crate::sandbox::SandboxSpec;
use crate::secrets::Redactor;
use crate::settings::LandlockMode;
use std::path::{Path, PathBuf};

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
    #[error("not trusted yet: pinning would start (a program in a fire's sandbox, or a session with a URL) and hand over:\n{}", .0.join("\n"))]
    Untrusted(Vec<String>),
    #[error("the list of trusted MCP servers ({path}) could not be {doing}: {why}")]
    TrustStore {
        path: String,
        doing: &'static str,
        why: String,
    },
    /// The settings' rules, whose `Read` deny globs the sandbox masks, do not compile.
    #[error("settings/runtime.yaml: {0}")]
    Rules(#[from] crate::policy::PolicyError),
    /// The repository's git directories, which the sandbox shows, are unknown.
    #[error("the repository could not be opened: {}", .0.message())]
    Repository(#[from] git2::Error),
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

/// The servers a pin starts, every one of them trusted ([`trust`]).
pub struct Trusted<'s> {
    starts: Vec<Start<'s>>,
    /// What `--trust` trusted now, in words (one line per server).
    pub now: Vec<String>,
}

impl Trusted<'_> {
    /// Whether a server to pin is a program (a stdio server): it needs a [`PinSandbox`].
    pub fn starts_a_program(&self) -> bool {
        self.starts.iter().any(|(_, entry, _)| entry.url.is_none())
    }
}

/// What each server to pin (`only`, or all) starts, once every one of them is trusted
/// ([`require_trust`]): the first step of a pin, before anything is started.
pub fn trust<'s>(
    root: &Path,
    servers: &'s McpServers,
    only: Option<&str>,
    path: &str,
    store: &TrustStore,
) -> Result<Trusted<'s>, PinError> {
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
    let now = require_trust(root, &digests, store)?;
    Ok(Trusted { starts, now })
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
    Ok(new.into_iter().map(|(_, said)| said.trim_start().to_string()).collect())
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
/// variable it is handed (`env_allow`, which a fire's redactor treats as secrets), in
/// any form the redactor knows (percent-encoded, base64, hex, JSON-escaped), or
/// anything the redactor takes for a key or a credential (`ghp_...`, a URL's
/// `user:password@`), in the text as written or in a string of it read back: a server
/// that echoes one would have it committed in the lock (helper-110, helper-116;
/// helper-118: a token in `.git/config`'s remote URL, which a pinned server reads).
fn without_token(
    entry: &McpServer,
    redactor: &Redactor,
    listed: Vec<serde_json::Value>,
) -> Result<Vec<serde_json::Value>, String> {
    fn strings<'v>(value: &'v serde_json::Value, out: &mut Vec<&'v str>) {
        match value {
            serde_json::Value::String(s) => out.push(s),
            serde_json::Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
            serde_json::Value::Object(map) => map.iter().for_each(|(k, v)| {
                out.push(k);
                strings(v, out)
            }),
            _ => {}
        }
    }
    let written: Vec<String> = listed.iter().map(ToString::to_string).collect();
    let mut read_back = Vec::new();
    listed.iter().for_each(|t| strings(t, &mut read_back));
    let holds = |t: &str| redactor.holds_secret(t.as_bytes()) || redactor.redact(t) != t;
    if written.iter().any(|t| holds(t)) || read_back.iter().any(|t| holds(t)) {
        let vars: Vec<&str> = entry.secret_vars().collect();
        return Err(format!(
            "a tool definition contains the value of a variable it is handed (${}) or an encoded form of it, or something shaped like a key or a credential: not pinned, it would be committed",
            vars.join(", $")
        ));
    }
    Ok(listed)
}

/// Pins the `trusted` servers ([`trust`]; a stdio server is started in `sandbox`) and
/// writes the lock; servers not pinned this time keep their pins, servers no longer
/// declared lose them.
pub async fn pin(
    root: &Path,
    servers: &McpServers,
    trusted: Trusted<'_>,
    sandbox: Option<&PinSandbox>,
) -> Result<Vec<Pinned>, PinError> {
    let mut lock = McpLock::load(root)?;
    let before = lock.clone();
    lock.version = 1;
    lock.servers.retain(|name, _| servers.contains_key(name));
    let mut pinned = Vec::new();
    for (name, entry, (package, digest)) in trusted.starts {
        // What it is handed is what its failure must not show (helper-115, helper-117).
        let redactor = Redactor::from_env(entry.secret_vars());
        let listed = match (&entry.url, sandbox) {
            (Some(_), _) => list_at_url(entry, &redactor).await,
            (None, Some(sandbox)) => sandbox.list(root, name, entry, &redactor).await,
            (None, None) => Err("no sandbox to start it in".to_string()),
        };
        let listed = listed
            .map(|tools| tools.iter().filter_map(|t| serde_json::to_value(t).ok()).collect())
            .and_then(|listed| without_token(entry, &redactor, listed))
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

/// Where `builder mcp pin` starts a stdio server: as a fire starts it, in a worker of
/// the `runtime` binary, sandboxed. The sandbox is a fire's with nothing of the tools'
/// grants: the system directories, the repository and its git directories, the
/// server's own read roots and ports (`read:`, `network:`), the `Read` deny masks of
/// the settings, and a scratch directory as the only place it writes (removed after),
/// so a pin reads none of the person's files and leaves nothing in the repository
/// (the worker keeps what it makes for its sandbox in a directory of the pin's own,
/// not the repository's `.runtime`). Every layer is required, whatever the settings
/// say: a branch's `landlock: off` or `best_effort` does not let a pin go on where a
/// layer is missing (helper-115: without user namespaces a best-effort pin reached a
/// host socket and left a process behind).
pub struct PinSandbox {
    /// The `runtime` binary and its worker's argument.
    worker_cmd: (PathBuf, Vec<String>),
    git_dirs: Vec<PathBuf>,
    /// The settings' `Read` deny globs and [`PIN_MASKS`].
    masked: Vec<String>,
    write_bytes: u64,
    /// The person's `PATH`, where a server's program is resolved as its digest was.
    path: String,
}

/// Files a pinned server never sees in the repository, whatever the settings' `Read`
/// deny rules say: the settings are the branch's, not yet reviewed, and a checkout
/// holds the person's own secrets beside the tracked files (helper-115: a branch
/// without `Read(**/.env)` let its server read the person's untracked `.env`).
/// Names, not contents: what a checkout holds under another name is not masked, which
/// is why a definition shaped like a key or a credential is not pinned either
/// ([`without_token`]).
pub const PIN_MASKS: &[&str] = &[
    "**/.env",
    "**/.env.*",
    "**/.envrc",
    "**/.dev.vars",
    "**/.netrc",
    "**/.npmrc",
    "**/.pypirc",
    "**/.pgpass",
    "**/.git-credentials",
    "**/.aws/**",
    "**/.kube/**",
    "**/.docker/config.json",
    "**/secrets.json",
    "**/secrets.yaml",
    "**/secrets.yml",
    "**/secrets.toml",
    "**/credentials",
    "**/credentials.json",
    "**/*service-account*.json",
    "**/*.tfvars",
    "**/*.tfstate",
    "**/*.tfstate.backup",
    "**/*.pem",
    "**/*.key",
    "**/*.p12",
    "**/*.pfx",
    "**/id_rsa*",
    "**/id_ecdsa*",
    "**/id_ed25519*",
];

impl PinSandbox {
    /// The sandbox of a pin in the repository at `root` under `settings`, its workers
    /// started by `worker_cmd`, programs resolved on `path`.
    pub fn of(
        root: &Path,
        settings: &crate::settings::RuntimeSettings,
        worker_cmd: (PathBuf, Vec<String>),
        path: &str,
    ) -> Result<PinSandbox, PinError> {
        let policy = crate::policy::Policy::new(root, &settings.permissions, &settings.builder_paths)?;
        let git_dirs = crate::git::git_dirs(&git2::Repository::open(root)?);
        Ok(PinSandbox {
            worker_cmd,
            git_dirs,
            masked: policy
                .read_masks()
                .into_iter()
                .chain(PIN_MASKS.iter().map(|g| g.to_string()))
                .collect(),
            write_bytes: settings.sandbox.write_bytes,
            path: path.to_string(),
        })
    }

    /// Lists the tools of the stdio server `server` (`entry`), started in this sandbox
    /// with a scratch directory and a state directory of its own, both removed after.
    async fn list(
        &self,
        root: &Path,
        server: &str,
        entry: &McpServer,
        redactor: &Redactor,
    ) -> Result<Vec<rmcp::model::Tool>, String> {
        let temp = || tempfile::tempdir().map_err(|e| format!("no scratch directory for its sandbox: {e}"));
        let (scratch, state) = (temp()?, temp()?);
        let servers = McpServers::default();
        let spec = SandboxSpec {
            read_dirs: crate::sandbox::base_read_dirs(root, &self.git_dirs),
            write_dirs: vec![scratch.path().to_path_buf()],
            write_files: vec![PathBuf::from("/dev/null")],
            connect_ports: Vec::new(),
            scope_ipc: true,
            max_abi: crate::sandbox::abi_cap_from_env(),
        };
        let input = StartInput {
            root,
            scratch: scratch.path(),
            servers: &servers,
            spec: &spec,
            mode: LandlockMode::Required,
            masked: self.masked.clone(),
            write_bytes: self.write_bytes,
            env: crate::tools::exec::ExecContext::scrubbed_env(scratch.path()),
            path: self.path.clone(),
            home: std::env::var_os("HOME").map(Into::into),
            redactor,
        };
        // The server's own grants and the very program its digest hashed, as a fire
        // starts it (a bare name is never searched for where a branch could plant it).
        let mut config = launch_config(&input, server, entry);
        if let Some(plan) = config.isolation.as_mut() {
            plan.state_dir = Some(state.path().to_path_buf());
        }
        list_in_worker(&self.worker_cmd, &config, server, entry.start_timeout_s, redactor)
            .await
            .map_err(|why| match why.starts_with("its sandbox could not be entered") {
                // The refusal's own hint is a fire's (`best_effort`), which a pin ignores.
                true => format!("{why}\n(a pin needs every layer of the sandbox, whatever `sandbox.landlock` says: pin on a machine that has them)"),
                false => why,
            })
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_definition_holding_a_handed_secret_in_any_known_form_is_not_pinned() {
        use base64::Engine;
        let entry: McpServer = serde_yaml::from_str("command: [/bin/true]\nenv_allow: [TICKETS_AUTH, HOME]\n").unwrap();
        let secret = "tk-9f8e\"7d6c\\5b4a";
        let redactor = Redactor::default().with_value(secret);
        let tool = |description: &str| vec![serde_json::json!({"name": "echo", "description": description})];
        assert!(without_token(&entry, &redactor, tool("Echo text back.")).is_ok());
        let refused = [
            format!("token {secret}"),
            base64::engine::general_purpose::STANDARD.encode(secret),
            hex::encode(secret),
        ];
        for description in refused {
            let why = without_token(&entry, &redactor, tool(&description)).unwrap_err();
            assert!(why.contains("($TICKETS_AUTH)"), "{why}");
        }
        // Written out, the quote and backslash are escaped: the string read back holds it.
        assert!(!tool(&format!("x{secret}"))[0].to_string().contains(secret));
        assert!(without_token(&entry, &redactor, tool(&format!("x{secret}"))).is_err());
        // Something shaped like a credential, whoever's it is.
        let remote = tool("clones https://ci:ghp_16C7e42F292c6912E7710c838347Ae178B4a@github.com/o/r");
        assert!(without_token(&entry, &Redactor::default(), remote).is_err());
        // A key of the definition, too.
        let keyed = vec![serde_json::json!({"name": "echo", "inputSchema": {"properties": {secret: {}}}})];
        assert!(without_token(&entry, &redactor, keyed).is_err());
    }
}
