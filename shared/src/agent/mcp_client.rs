//! Running the declared MCP servers for one fire. Each server gets a tool worker
//! process of its own, spawned before the runtime restricts itself (the worker makes
//! namespaces, which Landlock would refuse it) with the same sandbox as the tool
//! worker plus the server's own read roots and TCP ports; once sandboxed, the worker
//! starts the server on its stdin and stdout ([`run_server`]) and the runtime speaks
//! MCP through them with `rmcp`. The server never sees the key or the runtime's
//! environment: only the scrubbed tool environment and the variables its entry
//! allows. Servers are started and listed once, with a timeout; their tools are
//! checked against `settings/mcp.lock`; they are killed with the fire. A server that
//! announces a changed tool list during the fire (`notifications/tools/list_changed`)
//! is recorded ([`McpHub::list_changes`]), never listed again: the fire keeps what it
//! checked at its start. A `url:` server runs elsewhere: its session is opened from
//! the runtime ([`super::mcp_http`]), with no worker, and checked the same way.
//! `builder mcp pin` lists a server's tools the same ways ([`list_in_worker`],
//! [`list_at_url`]; its sandbox is set in [`super::mcp_pin`]).

use super::worker_client::{handshake, spawn_process_with_stderr, WorkerError};
use super::CardDraft;
use crate::mcp::config::{McpServer, McpServers};
use crate::mcp::digest::command_digest_cached;
use crate::mcp::launch::McpLaunch;
use crate::mcp::lock::{check_tools, McpLock};
use crate::provider::ToolDef;
use crate::records::CardKind;
use crate::sandbox::namespaces::NamespacePlan;
use crate::sandbox::SandboxSpec;
use crate::secrets::Redactor;
use crate::settings::LandlockMode;
use crate::tools::{ErrorClass, ToolResult};
use crate::worker::WorkerConfig;
use rmcp::model::{CallToolRequestParams, ContentBlock};
use rmcp::service::{RoleClient, RunningService};
use rmcp::ServiceExt;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout};

/// A worker process spawned for a server before the runtime restricted itself.
pub struct Spawned {
    server: String,
    child: std::io::Result<std::process::Child>,
}

/// Spawns one worker process per declared server (synchronous: before Landlock), its
/// stderr (the server's) a pipe the fire reads once the server starts ([`StderrTail`]).
pub fn spawn_workers(
    servers: &McpServers,
    worker_cmd: &(PathBuf, Vec<String>),
    env: &[(String, String)],
) -> Vec<Spawned> {
    let (exe, args) = worker_cmd;
    servers
        .iter()
        .filter(|(_, s)| s.url.is_none())
        .map(|(name, _)| Spawned {
            server: name.clone(),
            child: spawn_process_with_stderr(exe, args, env, Stdio::piped()),
        })
        .collect()
}

/// How much of a server's stderr is kept for its failure card: the last bytes only.
const STDERR_KEEP: usize = 16 * 1024;

/// The last [`STDERR_KEEP`] bytes a server wrote on stderr, read from its worker's pipe
/// as they come. Kept in memory, never in a file: a server that writes without end
/// fills nothing on the host (its writes to files are bounded by the sandbox's write
/// limit; a stderr file outside the sandbox would not be).
#[derive(Clone, Default)]
struct StderrTail {
    kept: Arc<std::sync::Mutex<Vec<u8>>>,
    /// Whether earlier bytes were dropped: the first line kept is then a part.
    cut: Arc<AtomicBool>,
    ended: Arc<AtomicBool>,
    /// A `url:` server's: its stderr is on its own host, so a card has none to show.
    elsewhere: bool,
}

impl StderrTail {
    /// The tail of a server with no stderr here (a `url:` server): empty, and ended.
    fn none() -> StderrTail {
        let tail = StderrTail {
            elsewhere: true,
            ..StderrTail::default()
        };
        tail.ended.store(true, Ordering::Release);
        tail
    }

    /// Reads `pipe` until its end on the fire's runtime (after Landlock: the reader is
    /// a task of the sandboxed runtime, not a thread that predates its restriction).
    fn follow(pipe: Option<std::process::ChildStderr>) -> StderrTail {
        use tokio::io::AsyncReadExt;
        let tail = StderrTail::default();
        let Some(mut pipe) = pipe.and_then(|p| tokio::process::ChildStderr::from_std(p).ok()) else {
            tail.ended.store(true, Ordering::Release);
            return tail;
        };
        let (kept, cut, ended) = (tail.kept.clone(), tail.cut.clone(), tail.ended.clone());
        tokio::spawn(async move {
            let mut buf = [0u8; 4096];
            while let Ok(n) = pipe.read(&mut buf).await {
                if n == 0 {
                    break;
                }
                if let Ok(mut k) = kept.lock() {
                    k.extend_from_slice(&buf[..n]);
                    let excess = k.len().saturating_sub(STDERR_KEEP);
                    if excess > 0 {
                        k.drain(..excess);
                        cut.store(true, Ordering::Release);
                    }
                }
            }
            ended.store(true, Ordering::Release);
        });
        tail
    }

    /// Waits a moment for the pipe's end (the worker was just killed or ended), so
    /// the last words before a crash are in the card.
    async fn settle(&self) {
        let waited = Instant::now();
        while !self.ended.load(Ordering::Acquire) && waited.elapsed() < Duration::from_millis(500) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// The whole lines kept: where earlier bytes were dropped, the first line is only
    /// the end of one and is left out, so no part of a secret the redactor would have
    /// known whole reaches a card (helper-110: the drop cut a token two characters in).
    /// What was kept of one line (no end in it, or only its own) is said, not shown.
    fn text(&self) -> String {
        let text = self
            .kept
            .lock()
            .map(|k| String::from_utf8_lossy(&k).into_owned())
            .unwrap_or_default();
        if !self.cut.load(Ordering::Acquire) {
            return text;
        }
        match text.split_once('\n') {
            Some((_, rest)) if !rest.trim().is_empty() => rest.to_string(),
            _ => format!(
                "(its last {} KiB were part of one line: not shown)\n",
                STDERR_KEEP / 1024
            ),
        }
    }
}

/// A tool offered to the model.
#[derive(Debug, Clone)]
pub struct Offered {
    pub server: String,
    pub tool: String,
    /// The pin its definition matched.
    pub pin: String,
    pub def: ToolDef,
}

/// The client's side of a server's notifications: counts the tool-list changes it
/// announces, and keeps the sandbox's notes its worker adds to the server's lines
/// (everything else is ignored, as by the SDK's default client).
#[derive(Clone, Default)]
struct ListWatch {
    changes: Arc<AtomicU32>,
    /// The server runs behind a worker of ours, which drops lines that pass for its
    /// notes: only then are notes taken (a `url:` server's would be its own words).
    behind_worker: bool,
    /// The git repositories the worker's write-back kept out of the repository.
    kept_out: Arc<std::sync::Mutex<crate::tools::WrittenBack>>,
}

impl ListWatch {
    fn behind_worker() -> ListWatch {
        ListWatch {
            behind_worker: true,
            ..ListWatch::default()
        }
    }
}

impl rmcp::ClientHandler for ListWatch {
    async fn on_tool_list_changed(&self, _context: rmcp::service::NotificationContext<RoleClient>) {
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    async fn on_custom_notification(
        &self,
        notification: rmcp::model::CustomNotification,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) {
        if !self.behind_worker || notification.method != crate::mcp::SANDBOX_NOTE {
            return;
        }
        let Ok(Some(note)) = notification.params_as::<crate::tools::WrittenBack>() else {
            return;
        };
        // Bounded whatever the note says: at most a card's worth named, the rest
        // counted.
        if let Ok(mut kept) = self.kept_out.lock() {
            let room = crate::records::CARD_EVIDENCE_MAX.saturating_sub(kept.nested_repositories.len());
            let over = note.nested_repositories.len().saturating_sub(room);
            kept.nested_repositories
                .extend(note.nested_repositories.into_iter().take(room));
            kept.more_repositories = (kept.more_repositories)
                .saturating_add(note.more_repositories)
                .saturating_add(over);
            let room = crate::loop_state::MADE_KEPT.saturating_sub(kept.made.len());
            kept.made.extend(note.made.into_iter().take(room));
        }
    }
}

/// A running server.
struct Live {
    /// The session; its handler counts the tool-list changes the server announced
    /// since its tools were listed.
    service: RunningService<RoleClient, ListWatch>,
    /// The worker of a stdio server; none for a `url:` server (it runs elsewhere).
    worker: Option<Worker>,
    /// Ends the worker's input (a stdio server's) while its output is still read.
    input: Option<InputCloser>,
    stderr: StderrTail,
    /// The server is gone (it crashed, or broke the protocol): why.
    gone: std::sync::Mutex<Option<String>>,
}

/// The session's writing end to a worker, which [`InputCloser`] can end on its own:
/// the worker then sees the end of its input, has the server end, copies what it
/// wrote last and says what that copy made, all on the output the session still
/// reads ([`McpHub::finish`]). rmcp's own cancel would stop reading as well.
struct ClosableInput(Arc<std::sync::Mutex<Option<ChildStdin>>>);

/// Ends a [`ClosableInput`].
struct InputCloser(Arc<std::sync::Mutex<Option<ChildStdin>>>);

impl InputCloser {
    fn close(&self) {
        if let Ok(mut stdin) = self.0.lock() {
            stdin.take();
        }
    }
}

impl tokio::io::AsyncWrite for ClosableInput {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        // Once closed, writes are dropped as if sent: rmcp answering a line the server
        // wrote after its input ended (an "invalid request" for a stray JSON object)
        // must not fail the session's writer, which would stop it reading the
        // worker's last note (helper-114).
        match self.0.lock().as_deref_mut() {
            Ok(Some(stdin)) => std::pin::Pin::new(stdin).poll_write(cx, buf),
            _ => std::task::Poll::Ready(Ok(buf.len())),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.0.lock().as_deref_mut() {
            Ok(Some(stdin)) => std::pin::Pin::new(stdin).poll_flush(cx),
            _ => std::task::Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.0.lock().as_deref_mut() {
            Ok(Some(stdin)) => std::pin::Pin::new(stdin).poll_shutdown(cx),
            _ => std::task::Poll::Ready(Ok(())),
        }
    }
}

/// The worker process of a server, killed and reaped when dropped: its namespace, and
/// the server and everything it forked in it, go with it.
struct Worker(std::process::Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How long a server has to end once its session is closed, before it is killed.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(1000);

/// The fire's running servers and the tools they offer.
#[derive(Default)]
pub struct McpHub {
    live: BTreeMap<String, Live>,
    /// The fire's redactor: a result or a server's stderr is redacted whole before it
    /// is cut, so a cut never leaves part of a secret the redactor would have caught
    /// whole (helper-109: a model chose the length that cut a token two characters
    /// short, and the rest reached git).
    redactor: Redactor,
    offered: BTreeMap<String, Offered>,
    /// How long starting each server took, for the receipt's log and the bench.
    pub start_ms: BTreeMap<String, u64>,
}

/// What starting the servers needs from the fire.
pub struct StartInput<'a> {
    pub root: &'a Path,
    pub scratch: &'a Path,
    pub servers: &'a McpServers,
    /// The tool worker's sandbox, which each server's widens by its own grants.
    pub spec: &'a SandboxSpec,
    pub mode: LandlockMode,
    /// `Read` deny globs, masked in the server's namespace as in the tools'.
    pub masked: Vec<String>,
    /// The size limit of everything the server writes (`sandbox.write_bytes`).
    pub write_bytes: u64,
    /// The scrubbed environment tools get; the server's allowed variables are added.
    pub env: Vec<(String, String)>,
    /// The runtime's `PATH`, where a server's program is resolved for its digest.
    pub path: String,
    pub home: Option<PathBuf>,
    /// The fire's redactor (see [`McpHub`]).
    pub redactor: &'a Redactor,
}

/// The outcome of starting the servers.
pub struct Started {
    pub hub: McpHub,
    /// Drift and failures to note (the fire goes on without those tools).
    pub cards: Vec<CardDraft>,
    /// A `required` server did not start: the fire stops with this card.
    pub fatal: Option<CardDraft>,
}

/// The last lines of a server's stderr, for a card.
fn stderr_tail(stderr: &StderrTail, redactor: &Redactor) -> String {
    let text = redactor.redact(&stderr.text()).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(20)..].join("\n");
    let cut: String = tail
        .chars()
        .rev()
        .take(2000)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    if cut.trim().is_empty() {
        "(nothing on stderr)".into()
    } else {
        cut
    }
}

/// Why a server did not start, and for a stdio server the last lines of its stderr,
/// `redactor` applied to both (the why can be the server's own error message).
fn failure_detail(why: &str, stderr: &StderrTail, redactor: &Redactor) -> String {
    let why = redactor.redact(why);
    if stderr.elsewhere {
        why.into_owned()
    } else {
        format!("{why}\nstderr (last lines):\n{}", stderr_tail(stderr, redactor))
    }
}

fn failed_card(server: &str, summary: String, why: &str, stderr: &StderrTail, redactor: &Redactor) -> CardDraft {
    let detail = failure_detail(why, stderr, redactor);
    CardDraft {
        kind: CardKind::McpServerFailed,
        summary,
        detail,
        evidence: vec![format!("server {server}")],
    }
}

/// Starts every declared server, lists its tools once and keeps those that match the
/// lock. A server whose command differs from its pin is not started.
pub async fn start(input: &StartInput<'_>, lock: &McpLock, spawned: Vec<Spawned>) -> Started {
    let mut out = Started {
        hub: McpHub {
            redactor: input.redactor.clone(),
            ..McpHub::default()
        },
        cards: Vec::new(),
        fatal: None,
    };
    let mut children: BTreeMap<String, std::io::Result<std::process::Child>> =
        spawned.into_iter().map(|s| (s.server, s.child)).collect();
    for (server, entry) in input.servers {
        let began = Instant::now();
        let result = match (&entry.url, children.remove(server)) {
            (Some(url), _) => start_http(input, lock, server, entry, url).await,
            (None, Some(child)) => start_one(input, lock, server, entry, child).await,
            (None, None) => continue,
        };
        let server = server.clone();
        out.hub
            .start_ms
            .insert(server.clone(), began.elapsed().as_millis() as u64);
        match result {
            Ok((live, offered, drift)) => {
                out.cards.extend(drift);
                for o in offered {
                    out.hub.offered.insert(o.def.name.clone(), o);
                }
                out.hub.live.insert(server, live);
            }
            Err(card) => match entry.required {
                true => {
                    out.fatal.get_or_insert(*card);
                }
                false => out.cards.push(*card),
            },
        }
    }
    out
}

type StartedServer = (Live, Vec<Offered>, Vec<CardDraft>);

/// The server's pin, when what its entry starts is what the pin says (the argv, and
/// the program's digest through the stat cache); otherwise the `mcp_drift` card.
fn pinned_start<'l>(
    input: &StartInput<'_>,
    lock: &'l McpLock,
    server: &str,
    entry: &McpServer,
) -> Result<&'l crate::mcp::lock::ServerPin, Box<CardDraft>> {
    let drift_card = |summary: String, detail: String| {
        Box::new(CardDraft {
            kind: CardKind::McpDrift,
            summary,
            detail,
            evidence: vec![
                format!("server {server}"),
                format!("lock {}", crate::mcp::lock::LOCK_FILE),
            ],
        })
    };
    let Some(pin) = lock.servers.get(server) else {
        return Err(drift_card(
            format!("MCP server `{server}` has no pin: not started"),
            "run `builder mcp pin` and review the lock".into(),
        ));
    };
    if let Some(url) = &entry.url {
        if pin.url.as_ref() != Some(url) {
            return Err(drift_card(
                format!("MCP server `{server}`: what it connects to differs from its pin; not started"),
                format!("pinned {}; settings say {url}", pin.starts().join(" ")),
            ));
        }
        return Ok(pin);
    }
    let state_dir = input.root.join(crate::layout::STATE_DIR);
    let digest = command_digest_cached(&entry.command, input.root, &input.path, &state_dir);
    if pin.command != entry.command || digest.as_ref().ok() != Some(&pin.command_digest) {
        let now = match &digest {
            Ok(d) => d.clone(),
            Err(e) => e.to_string(),
        };
        let scripts = crate::mcp::digest::file_arguments(&entry.command, input.root);
        let why = if scripts.is_empty() {
            String::new()
        } else {
            // Pins made before scripts were part of the digest differ for that alone.
            format!(
                "; the digest covers the file(s) the argv names in the repository ({}) and every file of their directories: a changed script or a file beside it is drift, and a lock pinned before these were covered needs `builder mcp pin` again, reviewed",
                scripts
                    .iter()
                    .map(|(i, _)| entry.command[*i].as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        return Err(drift_card(
            format!("MCP server `{server}`: what starts differs from its pin; not started"),
            format!(
                "pinned {:?} ({}); settings say {:?} ({now}){why}",
                pin.command, pin.command_digest, entry.command
            ),
        ));
    }
    Ok(pin)
}

async fn start_one(
    input: &StartInput<'_>,
    lock: &McpLock,
    server: &str,
    entry: &McpServer,
    child: std::io::Result<std::process::Child>,
) -> Result<StartedServer, Box<CardDraft>> {
    let mut child = child;
    let stderr = &StderrTail::follow(child.as_mut().ok().and_then(|c| c.stderr.take()));
    let began = Instant::now();
    let pin = pinned_start(input, lock, server, entry)?;
    let digested = began.elapsed();
    let failed = |why: String| {
        Box::new(failed_card(
            server,
            format!("MCP server `{server}` did not start"),
            &why,
            stderr,
            input.redactor,
        ))
    };
    let child = child.map_err(|e| failed(format!("cannot start its worker: {e}")))?;
    let config = launch_config(input, server, entry);
    let (service, tools, input, worker) =
        open_in_worker(child, &config, server, entry.start_timeout_s, stderr, (began, digested))
            .await
            .map_err(failed)?;
    let (offered, drift) = offered_tools(server, pin, &tools);
    let live = Live {
        service,
        worker: Some(worker),
        input: Some(input),
        stderr: stderr.clone(),
        gone: std::sync::Mutex::new(None),
    };
    Ok((live, offered, drift))
}

/// A server's session through its worker `child`: `config` sent, the worker's hello
/// read, MCP initialised and the tools listed within `timeout_s`. `Err`: why not, the
/// worker killed and its stderr read to its end (for the card). `times`: when the
/// start began and how long its digest took, for the debug log.
async fn open_in_worker(
    mut child: std::process::Child,
    config: &WorkerConfig,
    server: &str,
    timeout_s: u64,
    stderr: &StderrTail,
    times: (Instant, Duration),
) -> Result<
    (
        RunningService<RoleClient, ListWatch>,
        Vec<rmcp::model::Tool>,
        InputCloser,
        Worker,
    ),
    String,
> {
    let pipes = (child.stdin.take(), child.stdout.take());
    let worker = Worker(child);
    let (Some(stdin), Some(stdout)) = pipes else {
        return Err("its worker has no stdin or stdout".into());
    };
    let (stdin, stdout) = match (ChildStdin::from_std(stdin), ChildStdout::from_std(stdout)) {
        (Ok(i), Ok(o)) => (i, BufReader::new(o).lines()),
        (Err(e), _) | (_, Err(e)) => return Err(e.to_string()),
    };
    let (began, digested) = times;
    let connected = tokio::time::timeout(
        Duration::from_secs(timeout_s),
        connect(stdin, stdout, config, server, began, digested),
    )
    .await;
    let why = match connected {
        Ok(Ok((service, tools, input))) => return Ok((service, tools, input, worker)),
        Ok(Err(why)) => why,
        Err(_) => format!("no tool list within {timeout_s} s"),
    };
    drop(worker);
    stderr.settle().await;
    Err(why)
}

/// Opens the session with a `url:` server once its pin says this URL, lists its
/// tools and checks them, as [`start_one`] does for a stdio server.
async fn start_http(
    input: &StartInput<'_>,
    lock: &McpLock,
    server: &str,
    entry: &McpServer,
    url: &str,
) -> Result<StartedServer, Box<CardDraft>> {
    let pin = pinned_start(input, lock, server, entry)?;
    let stderr = StderrTail::none();
    let failed = |why: String| {
        Box::new(failed_card(
            server,
            format!("MCP server `{server}` at {url} could not be reached"),
            &why,
            &stderr,
            input.redactor,
        ))
    };
    let timeout = Duration::from_secs(entry.start_timeout_s);
    let (service, tools) = match tokio::time::timeout(
        timeout,
        super::mcp_http::connect(ListWatch::default(), entry, |v| std::env::var(v).ok()),
    )
    .await
    {
        Ok(Ok(pair)) => pair,
        Ok(Err(why)) => return Err(failed(why)),
        Err(_) => return Err(failed(format!("no tool list within {} s", entry.start_timeout_s))),
    };
    // What it announced before its list was read is in that list.
    service.service().changes.store(0, Ordering::SeqCst);
    let (offered, drift) = offered_tools(server, pin, &tools);
    let live = Live {
        service,
        worker: None,
        input: None,
        stderr,
        gone: std::sync::Mutex::new(None),
    };
    Ok((live, offered, drift))
}

/// The MCP session with a started worker: the sandbox handshake, MCP's
/// initialization, then the tool list; the phases' times are logged from `began`
/// (`digested`: when the program's digest was checked).
async fn connect(
    mut stdin: ChildStdin,
    mut stdout: Lines<BufReader<ChildStdout>>,
    config: &WorkerConfig,
    server: &str,
    began: Instant,
    digested: Duration,
) -> Result<
    (
        RunningService<RoleClient, ListWatch>,
        Vec<rmcp::model::Tool>,
        InputCloser,
    ),
    String,
> {
    handshake(&mut stdin, &mut stdout, config).await.map_err(|e| match e {
        WorkerError::Refused(why) => format!("its sandbox could not be entered: {why}"),
        other => other.to_string(),
    })?;
    let sandboxed = began.elapsed();
    let shared = Arc::new(std::sync::Mutex::new(Some(stdin)));
    let service = ListWatch::behind_worker()
        .serve((stdout.into_inner(), ClosableInput(shared.clone())))
        .await
        .map_err(|e| format!("MCP initialization failed: {e}"))?;
    let initialized = began.elapsed();
    let tools = service
        .peer()
        .list_all_tools()
        .await
        .map_err(|e| format!("tools/list failed: {e}"))?;
    tracing::debug!(
        server,
        digest_ms = digested.as_secs_f64() * 1e3,
        sandboxed_ms = sandboxed.as_secs_f64() * 1e3,
        initialized_ms = initialized.as_secs_f64() * 1e3,
        listed_ms = began.elapsed().as_secs_f64() * 1e3,
        "MCP server start, by phase (from its start, cumulative)"
    );
    // What it announced before its list was read is in that list.
    service.service().changes.store(0, Ordering::SeqCst);
    Ok((service, tools, InputCloser(shared)))
}

/// The listed tools that match their pins, offered to the model, and an `mcp_drift`
/// card for each that does not.
fn offered_tools(
    server: &str,
    pin: &crate::mcp::lock::ServerPin,
    tools: &[rmcp::model::Tool],
) -> (Vec<Offered>, Vec<CardDraft>) {
    let listed: Vec<serde_json::Value> = tools.iter().filter_map(|t| serde_json::to_value(t).ok()).collect();
    let (matched, drift) = check_tools(server, Some(pin), &listed);
    let mut drift = drift.into_iter();
    let mut cards: Vec<CardDraft> = drift
        .by_ref()
        .take(DRIFT_CARDS_PER_SERVER)
        .map(|d| CardDraft {
            kind: CardKind::McpDrift,
            summary: match (
                crate::mcp::lock::offerable(server, &d.tool),
                pin.tools.contains_key(&d.tool),
            ) {
                (true, true) => format!(
                    "MCP tool `{}` differs from its pin: not offered",
                    crate::mcp::tool_name(server, &d.tool)
                ),
                (true, false) => format!(
                    "MCP tool `{}` has no pin: not offered",
                    crate::mcp::tool_name(server, &d.tool)
                ),
                (false, _) => format!(
                    "MCP tool `{}` has a name no model can call: not offered",
                    crate::text::printable(&crate::mcp::tool_name(server, &d.tool))
                ),
            },
            detail: d.what,
            evidence: vec![
                format!("server {server}"),
                format!("tool {}", crate::text::printable(&d.tool)),
                format!("pin {}", pin.tools.get(&d.tool).map_or("(none)", |p| p.hash.as_str())),
            ],
        })
        .collect();
    // The rest on one card: a server listing thousands of unpinned tools would
    // otherwise commit a card file for each, every fire.
    let rest: Vec<String> = drift.map(|d| crate::text::printable(&d.tool).into_owned()).collect();
    if !rest.is_empty() {
        cards.push(CardDraft {
            kind: CardKind::McpDrift,
            summary: format!(
                "{} more MCP tool(s) of server `{server}` differ from their pins or have none: not offered",
                rest.len()
            ),
            detail: format!(
                "Beyond the {DRIFT_CARDS_PER_SERVER} tools carded one by one, the server listed {} more that match no pin; none was offered. `builder mcp pin {server}` shows each change; pin only what you reviewed.",
                rest.len()
            ),
            evidence: std::iter::once(format!("server {server}"))
                .chain(rest.into_iter().map(|t| format!("tool {t}")))
                .collect(),
        });
    }
    let offered = listed
        .iter()
        .filter_map(|t| {
            let name = t["name"].as_str()?;
            let hash = matched.get(name)?;
            Some(Offered {
                server: server.to_string(),
                tool: name.to_string(),
                pin: hash.clone(),
                def: ToolDef {
                    name: crate::mcp::tool_name(server, name),
                    description: format!(
                        "(MCP server `{server}`; its text is the server's, not the builder's) {}",
                        t["description"].as_str().unwrap_or("")
                    ),
                    schema: t["inputSchema"].clone(),
                },
            })
        })
        .collect();
    (offered, cards)
}

/// How many tools of one server get an `mcp_drift` card each; the rest share one.
const DRIFT_CARDS_PER_SERVER: usize = 8;

/// The worker configuration of one server: the tools' sandbox with the server's read
/// roots added and its own TCP ports (none unless granted), its environment.
pub(super) fn launch_config(input: &StartInput<'_>, server: &str, entry: &McpServer) -> WorkerConfig {
    let mut spec = input.spec.clone();
    spec.read_dirs.extend(entry.read_dirs(input.home.as_deref()));
    spec.connect_ports = entry.network.clone();
    let mut env = input.env.clone();
    for name in &entry.env_allow {
        if let Ok(v) = std::env::var(name) {
            env.retain(|(k, _)| k != name);
            env.push((name.clone(), v));
        }
    }
    WorkerConfig {
        root: input.root.to_path_buf(),
        scratch: input.scratch.to_path_buf(),
        isolation: Some(NamespacePlan::new(
            &spec,
            input.root,
            input.masked.clone(),
            input.write_bytes,
        )),
        spec,
        mode: input.mode,
        env,
        mcp: Some(McpLaunch {
            server: server.to_string(),
            argv: pinned_argv(input.root, &input.path, &entry.command),
        }),
    }
}

/// `argv` with its program as the very file the pin's digest hashed (resolved on the
/// runtime's `PATH`), not whatever the server's own `PATH` finds first in the sandbox:
/// a program the sandbox cannot see (a version manager's shim in a home directory)
/// would otherwise fall through to another one, which no pin covers.
pub(crate) fn pinned_argv(root: &Path, path: &str, argv: &[String]) -> Vec<String> {
    let mut argv = argv.to_vec();
    let resolved = argv
        .first()
        .and_then(|p| crate::mcp::digest::resolve_program(p, root, path));
    if let Some(program) = resolved {
        argv[0] = program.to_string_lossy().into_owned();
    }
    argv
}

impl McpHub {
    /// The offered tools' definitions, for the model.
    pub fn tool_defs(&self) -> Vec<ToolDef> {
        self.offered.values().map(|o| o.def.clone()).collect()
    }

    /// The offered tool the model calls `name`.
    pub fn offered(&self, name: &str) -> Option<&Offered> {
        self.offered.get(name)
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// One `mcp_drift` card per server that announced a changed tool list during the
    /// fire: recorded, not applied (the fire neither lists its tools again nor offers
    /// anything new; the next fire lists them and checks each against its pin).
    pub fn list_changes(&self) -> Vec<CardDraft> {
        self.live
            .iter()
            .filter_map(|(server, live)| {
                let n = live.service.service().changes.load(Ordering::SeqCst);
                (n > 0).then(|| CardDraft {
                    kind: CardKind::McpDrift,
                    summary: format!(
                        "MCP server `{server}` announced a changed tool list during the fire: not applied"
                    ),
                    detail: format!(
                        "The server sent notifications/tools/list_changed {n} time(s) after the fire had listed its tools and checked them against {lock}. The fire kept the tools it checked: it did not list them again and offered nothing new. A server that changes its tools after they were checked is what a rug pull looks like. The next fire lists the tools again and offers only those that match their pins; a changed one gets an mcp_drift card naming the change. If the change is one you want, run `builder mcp pin` and review the lock.",
                        lock = crate::mcp::lock::LOCK_FILE
                    ),
                    evidence: vec![format!("server {server}"), format!("list_changed {n}")],
                })
            })
            .collect()
    }

    /// Calls an offered tool; the result is capped at `cap` bytes. A server found gone
    /// also returns the card that says so (once per server).
    pub async fn call(
        &self,
        name: &str,
        args: serde_json::Map<String, serde_json::Value>,
        timeout: Duration,
        cap: usize,
    ) -> (ToolResult, Option<CardDraft>) {
        let began = Instant::now();
        let refused = |class, why: String| (ToolResult::error("", class, why), None);
        let Some(o) = self.offered.get(name) else {
            return refused(ErrorClass::UnknownTool, format!("`{name}` is not offered"));
        };
        let Some(live) = self.live.get(&o.server) else {
            return refused(ErrorClass::Failed, format!("MCP server `{}` is not running", o.server));
        };
        if let Some(why) = live.gone.lock().ok().and_then(|g| g.clone()) {
            return refused(ErrorClass::Failed, format!("MCP server `{}` is gone: {why}", o.server));
        }
        let params = CallToolRequestParams::new(o.tool.clone()).with_arguments(args);
        let answer = tokio::time::timeout(timeout, live.service.call_tool(params)).await;
        let mut result = match answer {
            Ok(Ok(r)) => self.answered(&r, cap),
            Ok(Err(e)) => {
                let why = e.to_string();
                let gone = matches!(
                    e,
                    rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_)
                );
                if gone {
                    if let Ok(mut g) = live.gone.lock() {
                        *g = Some(why.clone());
                    }
                    live.stderr.settle().await;
                    let card = failed_card(
                        &o.server,
                        format!("MCP server `{}` stopped during the fire", o.server),
                        &why,
                        &live.stderr,
                        &self.redactor,
                    );
                    let mut r = ToolResult::error(
                        "",
                        ErrorClass::SideEffectUncertain,
                        format!("MCP server `{}` is gone: {why}", o.server),
                    );
                    r.duration_ms = began.elapsed().as_millis() as u64;
                    return (r, Some(card));
                }
                // The server's error text is its output too: capped as results are.
                let text = self.redactor.redact(&format!("MCP error: {why}")).into_owned();
                let (output, truncated) = crate::tools::exec::cap_text(text, cap);
                let mut r = ToolResult::error("", ErrorClass::Failed, output);
                r.truncated = truncated;
                r
            }
            Err(_) => ToolResult::error(
                "",
                ErrorClass::Timeout,
                format!(
                    "no answer from MCP server `{}` within {} ms",
                    o.server,
                    timeout.as_millis()
                ),
            ),
        };
        result.duration_ms = began.elapsed().as_millis() as u64;
        (result, None)
    }

    /// The result of a call a server answered, redacted whole, then cut at `cap`.
    fn answered(&self, r: &rmcp::model::CallToolResult, cap: usize) -> ToolResult {
        let text = self
            .redactor
            .redact(&render(&r.content, r.structured_content.as_ref()))
            .into_owned();
        let (output, truncated) = crate::tools::exec::cap_text(text, cap);
        ToolResult {
            call_id: String::new(),
            error: r.is_error.unwrap_or(false).then_some(ErrorClass::Failed),
            output,
            truncated,
            duration_ms: 0,
            kernel_denied: false,
            written_back: None,
        }
    }

    /// Ends every server with the fire: the session is closed, so the server sees the
    /// end of its input; its worker copies what it wrote last into the repository and
    /// exits within [`SHUTDOWN_GRACE`], or is killed then. Either way its namespace,
    /// with all the server forked, goes with it.
    pub async fn shutdown(self) {
        for (_, live) in self.live {
            let Live {
                service, worker, input, ..
            } = live;
            // rmcp's cancel drops only its own handle on the worker's input.
            if let Some(input) = input {
                input.close();
            }
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, service.cancel()).await;
            end_worker(worker).await;
        }
    }

    /// Ends every server at the fire's end, hearing each worker out: its input is
    /// closed, so the server ends and the worker copies what it wrote last, and the
    /// session reads the worker's notes of that copy until its output ends (within
    /// [`SHUTDOWN_GRACE`]); then what the servers' copies made and kept out is noted in
    /// the run ([`note_heard`]), the last copy's included.
    pub async fn finish(self, root: &Path, state: &mut super::LoopState) {
        let mut heard = Vec::new();
        for (_, live) in self.live {
            let Live {
                service, worker, input, ..
            } = live;
            heard.push(service.service().kept_out.clone());
            match input {
                Some(input) => {
                    input.close();
                    if tokio::time::timeout(SHUTDOWN_GRACE, service.waiting()).await.is_err() {
                        // Not heard out in time: killed now, so no copy lands unnoted
                        // once nobody reads (helper-114).
                        drop(worker);
                        continue;
                    }
                    // rmcp hands each notification to a task of its own; on the
                    // fire's current-thread runtime the tasks the session queued
                    // before its end run, in order, at this yield.
                    tokio::task::yield_now().await;
                }
                None => {
                    let _ = tokio::time::timeout(SHUTDOWN_GRACE, service.cancel()).await;
                }
            }
            end_worker(worker).await;
        }
        note_heard(root, state, &heard);
    }
}

/// Names the git repositories the servers' workers kept out of the repository (from
/// their notes, [`crate::mcp::SANDBOX_NOTE`], `heard` from each session) in the run's
/// card for them, as the tools' are, and notes the entries their copies made.
fn note_heard(root: &Path, state: &mut super::LoopState, heard: &[Arc<std::sync::Mutex<crate::tools::WrittenBack>>]) {
    let mut lines = Vec::new();
    let mut more = 0;
    for kept in heard.iter().filter_map(|k| k.lock().ok()) {
        more += kept.more_repositories;
        for n in &kept.nested_repositories {
            let path = Path::new(&n.path);
            let rel = path.strip_prefix(root).unwrap_or(path).to_string_lossy();
            lines.push(super::nested_repository_line(&rel, n.left.as_deref()));
        }
    }
    super::note_nested_repositories(state, lines, more);
    for kept in heard.iter().filter_map(|k| k.lock().ok()) {
        state.note_made(root, &kept.made);
    }
}

/// Waits for a server's worker to exit (its session is over) within
/// [`SHUTDOWN_GRACE`], then kills and reaps it.
async fn end_worker(worker: Option<Worker>) {
    let Some(mut worker) = worker else {
        return;
    };
    let waited = Instant::now();
    while waited.elapsed() < SHUTDOWN_GRACE {
        if !matches!(worker.0.try_wait(), Ok(None)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(worker);
}

/// A call result as text for the model: text blocks as they are, other content named.
fn render(content: &[ContentBlock], structured: Option<&serde_json::Value>) -> String {
    let mut parts: Vec<String> = content
        .iter()
        .map(|c| match c {
            ContentBlock::Text(t) => t.text.clone(),
            other => format!(
                "[{} content omitted]",
                serde_json::to_value(other)
                    .ok()
                    .and_then(|v| v["type"].as_str().map(str::to_string))
                    .unwrap_or_else(|| "non-text".into())
            ),
        })
        .collect();
    if parts.is_empty() {
        if let Some(s) = structured {
            parts.push(s.to_string());
        }
    }
    parts.join("\n")
}

/// The tools a stdio server lists once it is started by a worker of `worker_cmd` in
/// the sandbox `config` describes, for `builder mcp pin` ([`super::mcp_pin`]); then
/// its session is closed and its worker ended. `Err`: why not, with the last lines of
/// its stderr, `redactor` applied to both.
pub(super) async fn list_in_worker(
    worker_cmd: &(PathBuf, Vec<String>),
    config: &WorkerConfig,
    server: &str,
    timeout_s: u64,
    redactor: &Redactor,
) -> Result<Vec<rmcp::model::Tool>, String> {
    let (exe, args) = worker_cmd;
    let mut child = spawn_process_with_stderr(exe, args, &config.env, Stdio::piped())
        .map_err(|e| format!("cannot start its sandbox's worker ({}): {e}", exe.display()))?;
    let stderr = StderrTail::follow(child.stderr.take());
    let began = Instant::now();
    match open_in_worker(child, config, server, timeout_s, &stderr, (began, Duration::ZERO)).await {
        Ok((service, tools, input, worker)) => {
            input.close();
            let _ = service.cancel().await;
            drop(worker);
            Ok(tools)
        }
        Err(why) => Err(failure_detail(&why, &stderr, redactor)),
    }
}

/// The tools a `url:` server lists, for `builder mcp pin`: its session is opened from
/// here (it runs elsewhere), with its token, and closed. `Err`: why not, redacted.
pub(super) async fn list_at_url(entry: &McpServer, redactor: &Redactor) -> Result<Vec<rmcp::model::Tool>, String> {
    let timeout = Duration::from_secs(entry.start_timeout_s);
    let listed = tokio::time::timeout(timeout, super::mcp_http::connect((), entry, |v| std::env::var(v).ok())).await;
    match listed {
        Ok(Ok((service, tools))) => {
            let _ = service.cancel().await;
            Ok(tools)
        }
        Ok(Err(why)) => Err(redactor.redact(&why).into_owned()),
        Err(_) => Err(format!(
            "no tool list from {} within {} s",
            entry.url.as_deref().unwrap_or_default(),
            entry.start_timeout_s
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_servers_card_has_no_stderr_section_and_a_stdio_servers_says_it_was_silent() {
        let none = Redactor::default();
        let remote = failed_card(
            "web",
            "web failed".into(),
            "connection refused",
            &StderrTail::none(),
            &none,
        );
        assert_eq!(remote.detail, "connection refused");
        let silent = StderrTail::default();
        let local = failed_card("files", "files failed".into(), "exited", &silent, &none);
        assert_eq!(local.detail, "exited\nstderr (last lines):\n(nothing on stderr)");
    }

    /// The stderr tail of `/bin/sh -c script`, once it ended.
    async fn tail_of(script: &str) -> StderrTail {
        let mut child = std::process::Command::new("/bin/sh")
            .args(["-c", script])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let tail = StderrTail::follow(child.stderr.take());
        // Waited for apart: the reader is a task of this (single-threaded) runtime.
        tokio::task::spawn_blocking(move || child.wait().unwrap())
            .await
            .unwrap();
        tail.settle().await;
        tail
    }

    #[tokio::test]
    async fn a_server_that_floods_stderr_leaves_only_its_last_words() {
        let tail = tail_of(
            "i=0; while [ $i -lt 6000 ]; do echo \"line $i key=TOKENVALUE-123456\"; i=$((i+1)); done >&2; echo ' the end' >&2",
        )
        .await;
        let text = tail.text();
        assert!(
            text.len() <= STDERR_KEEP && text.len() > STDERR_KEEP - 100,
            "kept the last {STDERR_KEEP} bytes only"
        );
        assert!(text.ends_with(" the end\n"), "{}", &text[text.len() - 20..]);
        // Whole lines only: the line the drop cut through is left out, so no line
        // starts with the end of a value (a secret's last characters, on a card).
        assert!(
            text.lines()
                .all(|l| l == " the end" || (l.starts_with("line ") && l.ends_with(" key=TOKENVALUE-123456"))),
            "{}",
            &text[..80]
        );
    }

    #[tokio::test]
    async fn a_server_whose_last_words_are_one_long_line_is_said_to_have_written_one() {
        let tail = tail_of("head -c 40000 /dev/zero | tr '\\0' k >&2").await;
        let ended = tail_of("head -c 40000 /dev/zero | tr '\\0' k >&2; echo >&2").await;
        assert_eq!(ended.text(), tail.text(), "a line whose end alone was kept");
        assert_eq!(tail.text(), "(its last 16 KiB were part of one line: not shown)\n");
        assert_eq!(
            stderr_tail(&tail, &Redactor::default()),
            "(its last 16 KiB were part of one line: not shown)"
        );
    }
}
