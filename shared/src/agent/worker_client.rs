//! The runtime's side of the tool worker: spawns the worker process (the `runtime`
//! binary's hidden worker command, [`crate::worker::WORKER_COMMAND`]), sends it its sandbox, and exchanges one
//! JSON line per tool call. A worker that dies mid-call makes the call's side effect
//! uncertain rather than crashing the fire, and a spare worker started with it takes
//! its place, once.

use crate::records::SandboxRecord;
use crate::sandbox::namespaces::MaskLine;
use crate::tools::{ErrorClass, ToolRequest, ToolResult};
use crate::worker::{WorkerConfig, WorkerHello};
use std::path::Path;
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout};

/// Asks the worker to kill the command it is running (the fire is cancelled).
pub struct Interrupter {
    pid: Option<u32>,
}

impl Interrupter {
    pub fn interrupt(&self) {
        if let Some(pid) = self.pid {
            // Our own child process.
            let _ = kernel::signal::kill(pid, kernel::signal::Signal::Term);
        }
    }

    /// Interrupts the worker's call `running` until it ends, and returns its result:
    /// again every [`INTERRUPT_AGAIN`], as the worker drops an interrupt that reaches
    /// it before it read the call (one meant for no call must not cancel the next).
    pub async fn until_done(&self, running: impl std::future::Future<Output = ToolResult>) -> ToolResult {
        tokio::pin!(running);
        loop {
            self.interrupt();
            tokio::select! {
                r = &mut running => return r,
                _ = tokio::time::sleep(INTERRUPT_AGAIN) => {}
            }
        }
    }
}

/// How often a cancelled fire interrupts its worker's call again until it ends.
const INTERRUPT_AGAIN: std::time::Duration = std::time::Duration::from_millis(100);

pub struct WorkerClient {
    child: Proc,
    stdin: Pipe,
    stdout: Lines<BufReader<ChildStdout>>,
    /// The worker's sandbox report, read by [`WorkerClient::ready`].
    hello: Hello,
    /// A second worker process, started with the first (before the runtime restricted
    /// itself), and the configuration to send it: a worker that dies (the OOM killer,
    /// a crash) is replaced once by it instead of ending the fire's tools.
    spare: Option<Spare>,
    /// Why no worker is left (it died and no spare could take its place): later
    /// calls are not sent anywhere. A write into the dead worker's pipe could still
    /// succeed while the kernel tears its namespace down, and would make a call that
    /// never ran look uncertain.
    dead: Option<String>,
    /// A request was sent to it: on shutdown it is given time to write back what the
    /// calls wrote. A worker never asked anything has nothing to write back and is
    /// killed at once.
    asked: bool,
}

/// The pipe to the worker.
enum Pipe {
    Open(ChildStdin),
    /// The line after the configuration (the masks, which the runtime is still
    /// walking for) is written by a task of its own, which hands the pipe back.
    Sending(tokio::task::JoinHandle<Result<ChildStdin, WorkerError>>),
    /// Nothing can be sent.
    Closed,
}

/// The masks of a worker's namespace, still being found.
pub type PendingMasks = tokio::sync::oneshot::Receiver<MaskLine>;

/// Where the worker's sandbox report stands.
enum Hello {
    /// Sent its configuration; the report is not read yet.
    Pending,
    Ready(SandboxRecord),
    /// It could not enter its sandbox (or broke the protocol): why. No call is sent.
    Failed(String),
}

/// The spare worker process (killed and reaped if never used) and its configuration.
struct Spare {
    child: Option<std::process::Child>,
    config: WorkerConfig,
}

impl Drop for Spare {
    fn drop(&mut self) {
        if let Some(child) = self.child.take() {
            drop(Proc(child));
        }
    }
}

/// How an exchange with the worker failed: the worker is gone.
struct Gone {
    /// Whether the request reached the worker: when it did not, the call never ran.
    delivered: bool,
    why: String,
}

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("cannot start the tool worker: {0}")]
    Spawn(std::io::Error),
    #[error("the tool worker refused to start: {0}")]
    Refused(String),
    #[error("the tool worker broke the protocol: {0}")]
    Protocol(String),
}

impl WorkerClient {
    /// Takes over a worker process started by [`spawn_process`] (before the runtime
    /// restricted itself: a worker entering namespaces needs mount calls Landlock
    /// refuses), sends it `config` and waits for its sandbox report.
    pub async fn adopt(child: std::process::Child, config: &WorkerConfig) -> Result<WorkerClient, WorkerError> {
        let mut worker = WorkerClient::start(child, config).await?;
        match read_hello(&mut worker.stdout).await {
            Ok(sandbox) => {
                worker.hello = Hello::Ready(sandbox);
                Ok(worker)
            }
            Err(e) => Err(e), // the process is killed and reaped as `worker` drops
        }
    }

    /// As [`WorkerClient::adopt`], without waiting for the sandbox report: the worker
    /// enters its sandbox while the runtime goes on (a fresh fire sends its first
    /// model request meanwhile). [`WorkerClient::ready`] waits for the report; a call
    /// waits for it first, and runs nowhere if the worker could not enter its sandbox.
    pub async fn start(child: std::process::Child, config: &WorkerConfig) -> Result<WorkerClient, WorkerError> {
        let (mut worker, mut stdin) = WorkerClient::take_pipes(child)?;
        send_config(&mut stdin, config).await?;
        worker.stdin = Pipe::Open(stdin);
        Ok(worker)
    }

    /// As [`WorkerClient::start`], for a worker whose plan takes its masks from the
    /// line after the configuration ([`MaskSource::NextLine`]): the configuration
    /// goes now, and a task of its own sends the masks once they are found, while the
    /// worker builds its root and the runtime goes on. Masks that could not be found
    /// are the worker's refusal to start, reported by [`WorkerClient::ready`].
    ///
    /// [`MaskSource::NextLine`]: crate::sandbox::namespaces::MaskSource::NextLine
    pub async fn start_with_masks(
        child: std::process::Child,
        config: &WorkerConfig,
        masks: PendingMasks,
    ) -> Result<WorkerClient, WorkerError> {
        let (worker, mut stdin) = WorkerClient::take_pipes(child)?;
        send_config(&mut stdin, config).await?;
        Ok(worker.sending_masks(stdin, masks))
    }

    /// As [`WorkerClient::start_with_masks`], for a worker whose configuration was
    /// already sent ([`send_config_now`]).
    pub fn configured_with_masks(child: std::process::Child, masks: PendingMasks) -> Result<WorkerClient, WorkerError> {
        let (worker, stdin) = WorkerClient::take_pipes(child)?;
        Ok(worker.sending_masks(stdin, masks))
    }

    /// This client, with a task of its own sending the masks once they are found.
    fn sending_masks(mut self, mut stdin: ChildStdin, masks: PendingMasks) -> WorkerClient {
        self.stdin = Pipe::Sending(tokio::spawn(async move {
            let line: MaskLine = masks.await.unwrap_or_else(|e| Err(e.to_string()));
            send_line(&mut stdin, &line).await?;
            Ok(stdin)
        }));
        self
    }

    /// The client of `child`, its pipe to the worker apart (no configuration sent yet).
    fn take_pipes(mut child: std::process::Child) -> Result<(WorkerClient, ChildStdin), WorkerError> {
        let protocol = |e: std::io::Error| WorkerError::Protocol(e.to_string());
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| WorkerError::Protocol("no stdin".into()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| WorkerError::Protocol("no stdout".into()))?;
        let (stdin, stdout) = match (ChildStdin::from_std(stdin), ChildStdout::from_std(stdout)) {
            (Ok(i), Ok(o)) => (i, o),
            (Err(e), _) | (_, Err(e)) => {
                drop(Proc(child));
                return Err(protocol(e));
            }
        };
        let worker = WorkerClient {
            child: Proc(child),
            stdin: Pipe::Closed,
            stdout: BufReader::new(stdout).lines(),
            hello: Hello::Pending,
            spare: None,
            dead: None,
            asked: false,
        };
        Ok((worker, stdin))
    }

    /// The pipe to the worker, once its configuration is sent.
    async fn pipe(&mut self) -> Result<&mut ChildStdin, WorkerError> {
        if let Pipe::Sending(sending) = &mut self.stdin {
            let sent = sending
                .await
                .unwrap_or_else(|e| Err(WorkerError::Protocol(e.to_string())));
            self.stdin = match sent {
                Ok(stdin) => Pipe::Open(stdin),
                Err(e) => {
                    self.stdin = Pipe::Closed;
                    return Err(e);
                }
            };
        }
        match &mut self.stdin {
            Pipe::Open(stdin) => Ok(stdin),
            _ => Err(WorkerError::Protocol("no configuration was sent to the worker".into())),
        }
    }

    /// The worker's sandbox, once it reported entering it (waiting for the report the
    /// first time); why not when it could not (the same answer every time).
    pub async fn ready(&mut self) -> Result<&SandboxRecord, String> {
        if matches!(self.hello, Hello::Pending) {
            // What the worker says comes first: a worker that refused did not read on.
            let sent = self.pipe().await.map(|_| ());
            self.hello = match (read_hello(&mut self.stdout).await, sent) {
                (Ok(sandbox), Ok(())) => Hello::Ready(sandbox),
                (Ok(_), Err(e)) | (Err(e), _) => Hello::Failed(e.to_string()),
            };
            // A worker killed before its report (the OOM killer, a person's kill) says
            // nothing of the sandbox: the spare takes its place, as for a worker that
            // dies in a call (helper-96: the fire ended as `sandbox_unavailable`).
            let failed = match &self.hello {
                Hello::Failed(why) => Some(why.clone()),
                _ => None,
            };
            let killed = match failed {
                Some(why) if !crate::cancel::requested() => self.killed().await.then_some(why),
                _ => None,
            };
            if let Some(why) = killed {
                let why = format!("{why} (killed by SIGKILL)");
                match self.replace_by_spare().await {
                    Ok(()) => {
                        tracing::warn!(%why, new = self.child.0.id(), "the tool worker was killed before its sandbox report; the spare took its place")
                    }
                    Err(e) => self.hello = Hello::Failed(format!("{why}; {e}")),
                }
            }
        }
        match &self.hello {
            Hello::Ready(sandbox) => Ok(sandbox),
            Hello::Failed(why) => Err(why.clone()),
            Hello::Pending => unreachable!("the report was just read"),
        }
    }

    /// Keeps `spare` (a process from [`spawn_parked`]) to replace this worker once if
    /// it dies; it gets the same `config`.
    pub fn keep_spare(&mut self, spare: std::process::Child, config: WorkerConfig) {
        self.spare = Some(Spare {
            child: Some(spare),
            config,
        });
    }

    /// Why no tool worker is left (it died and no spare took its place), if so.
    pub fn lost(&self) -> Option<&str> {
        self.dead.as_deref()
    }

    /// Runs one call. The worker enforces the per-call timeout; this adds a margin. A
    /// worker found dead is replaced by the spare, once: a call it never received
    /// runs on the new worker; a call it was running may or may not have taken effect
    /// and is `SIDE_EFFECT_UNCERTAIN` (never run again).
    pub async fn call(&mut self, req: &ToolRequest) -> ToolResult {
        let uncertain = |why: String| ToolResult::error(&req.call_id, ErrorClass::SideEffectUncertain, why);
        let line = match serde_json::to_string(req) {
            Ok(l) => l,
            Err(e) => return ToolResult::error(&req.call_id, ErrorClass::InvalidArguments, e.to_string()),
        };
        let not_run = |why: &str| {
            ToolResult::error(
                &req.call_id,
                ErrorClass::Failed,
                format!("{why}: no tool worker is left; the call did not run"),
            )
        };
        if let Err(why) = self.ready().await.map(|_| ()) {
            return not_run(&why);
        }
        if let Some(why) = &self.dead {
            return not_run(why);
        }
        let gone = match self.exchange(&line, req.timeout_ms).await {
            Ok(answer) => return answer_of(&answer).unwrap_or_else(uncertain),
            Err(gone) => gone,
        };
        let restarted = match self.restart().await {
            Ok(()) => "; a new tool worker took its place",
            Err(e) => {
                tracing::warn!(error = %e, "the tool worker was not replaced");
                ""
            }
        };
        if restarted.is_empty() {
            self.dead = Some(gone.why.clone());
        }
        if gone.delivered {
            return uncertain(format!("{}{restarted}", gone.why));
        }
        if restarted.is_empty() {
            return not_run(&gone.why);
        }
        // The dead worker never read the call: the new one runs it.
        match self.exchange(&line, req.timeout_ms).await {
            Ok(answer) => answer_of(&answer).unwrap_or_else(uncertain),
            Err(again) => uncertain(again.why),
        }
    }

    /// Sends one request line and reads the answer line.
    async fn exchange(&mut self, line: &str, timeout_ms: u64) -> Result<String, Gone> {
        let undelivered = |e: std::io::Error| Gone {
            delivered: false,
            why: format!("tool worker gone: {e}"),
        };
        self.asked = true;
        let stdin = self
            .pipe()
            .await
            .map_err(|e| undelivered(std::io::Error::other(e.to_string())))?;
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(undelivered)?;
        stdin.flush().await.map_err(undelivered)?;
        let delivered = |why: String| Gone { delivered: true, why };
        let margin = std::time::Duration::from_millis(timeout_ms + 5_000);
        match tokio::time::timeout(margin, self.stdout.next_line()).await {
            Ok(Ok(Some(answer))) => Ok(answer),
            Ok(Ok(None)) => Err(delivered("tool worker exited during the call".into())),
            Ok(Err(e)) => Err(delivered(format!("tool worker read error: {e}"))),
            Err(_) => {
                let _ = self.child.0.kill();
                Err(delivered("tool worker did not answer in time and was killed".into()))
            }
        }
    }

    /// Replaces this worker, and every process the model's calls left in its
    /// namespaces, by the spare, which never ran a call: its own empty tmpfs and
    /// scratch, so nothing the model wrote outside the write ACL, and no space it
    /// filled, reaches what runs next (the acceptance checks, helper-91: a model that
    /// filled the shared tmpfs made a check's `TMPDIR` write fail, and the check pass).
    /// Refused when no spare is left (it replaced a worker that died).
    pub async fn fresh_for_checks(&mut self) -> Result<(), WorkerError> {
        if self.spare.as_ref().is_none_or(|s| s.child.is_none()) {
            return Err(WorkerError::Refused(
                "no spare worker left (it replaced a tool worker that died)".into(),
            ));
        }
        let old = self.child.0.id();
        let _ = self.child.0.kill();
        self.replace_by_spare().await?;
        tracing::debug!(
            old,
            new = self.child.0.id(),
            "the acceptance checks run in the spare worker"
        );
        Ok(())
    }

    /// Replaces the dead worker by the spare (once; not while the fire is being
    /// cancelled).
    async fn restart(&mut self) -> Result<(), WorkerError> {
        if crate::cancel::requested() {
            return Err(WorkerError::Refused("the fire is being cancelled".into()));
        }
        let old = self.child.0.id();
        self.replace_by_spare().await?;
        tracing::warn!(
            old,
            new = self.child.0.id(),
            "the tool worker died; the spare took its place"
        );
        Ok(())
    }

    /// Wakes the spare and makes it this worker (the old one is reaped as its handle
    /// drops).
    async fn replace_by_spare(&mut self) -> Result<(), WorkerError> {
        let Some(mut spare) = self.spare.take() else {
            return Err(WorkerError::Refused("no spare worker left".into()));
        };
        let Some(child) = spare.child.take() else {
            return Err(WorkerError::Refused("no spare worker left".into()));
        };
        let child = wake_parked(child).map_err(WorkerError::Spawn)?;
        let fresh = WorkerClient::adopt(child, &spare.config).await?;
        let WorkerClient {
            child,
            stdin,
            stdout,
            hello,
            ..
        } = fresh;
        // The dead worker is reaped as its handle drops.
        self.child = child;
        self.stdin = stdin;
        self.stdout = stdout;
        self.hello = hello;
        Ok(())
    }

    /// Whether SIGKILL ended the worker (the OOM killer, a person's `kill -9`: no
    /// fault of its sandbox; a worker whose sandbox failed exits, or dies of its own
    /// SIGSYS or SIGABRT, and keeps that failure). Asked for a little while, as a
    /// worker whose output just closed may not have been reaped yet.
    async fn killed(&mut self) -> bool {
        use std::os::unix::process::ExitStatusExt;
        for _ in 0..20 {
            match self.child.0.try_wait() {
                Ok(Some(status)) => return status.signal() == Some(libc::SIGKILL),
                Ok(None) => tokio::time::sleep(std::time::Duration::from_millis(5)).await,
                Err(_) => return false,
            }
        }
        false
    }

    /// A handle that can interrupt the worker while a call borrows it.
    pub fn interrupt_handle(&self) -> Interrupter {
        Interrupter {
            pid: Some(self.child.0.id()),
        }
    }

    pub async fn shutdown(self) {
        let WorkerClient {
            mut child,
            stdin,
            asked,
            spare,
            ..
        } = self;
        if let Pipe::Sending(sending) = &stdin {
            sending.abort();
        }
        // The spare, parked and never woken (it never ran a call), is killed now and
        // reaped off this thread with the worker: waiting for it here cost the fire's
        // end 0.2-0.6 ms.
        let spare = spare.and_then(|mut s| s.child.take()).map(|mut c| {
            let _ = c.kill();
            Proc(c)
        });
        if !asked {
            // Never asked anything, so it wrote nothing: killed now and reaped on a
            // thread of its own while the fire writes its records.
            let _ = child.0.kill();
            std::thread::spawn(move || drop((child, spare)));
            return;
        }
        // Closing stdin ends the worker's loop; it has two seconds to leave, waited
        // for off this thread, then it is killed.
        drop(stdin);
        let pid = child.0.id();
        let waited = tokio::task::spawn_blocking(move || {
            drop(spare);
            let _ = child.0.wait();
            child
        });
        if tokio::time::timeout(std::time::Duration::from_secs(2), waited)
            .await
            .is_err()
        {
            // Our own child, not reaped yet (the waiting thread reaps it once it is
            // gone), so the pid is still its own.
            let _ = kernel::signal::kill(pid, kernel::signal::Signal::Kill);
        }
    }
}

/// Sends a new worker its configuration and reads its sandbox report. The stdout
/// reader keeps whatever the worker wrote after the report (an MCP server's first
/// bytes, for [`crate::mcp`]).
pub(crate) async fn handshake(
    stdin: &mut ChildStdin,
    stdout: &mut Lines<BufReader<ChildStdout>>,
    config: &WorkerConfig,
) -> Result<SandboxRecord, WorkerError> {
    send_config(stdin, config).await?;
    read_hello(stdout).await
}

/// The first half of [`handshake`]: the configuration line.
async fn send_config(stdin: &mut ChildStdin, config: &WorkerConfig) -> Result<(), WorkerError> {
    send_line(stdin, config).await
}

/// Sends `config` to the worker `child` now, from outside any async runtime, so the
/// worker builds its sandbox while this process goes on; the client is made later
/// with [`WorkerClient::configured_with_masks`]. (The pipe's buffer holds a usual
/// configuration; a larger one waits for the worker, which is reading it.)
pub fn send_config_now(child: &mut std::process::Child, config: &WorkerConfig) -> std::io::Result<()> {
    use std::io::Write;
    let stdin = child
        .stdin
        .as_mut()
        .ok_or_else(|| std::io::Error::other("the worker has no stdin"))?;
    let mut line = serde_json::to_vec(config).map_err(std::io::Error::other)?;
    line.push(b'\n');
    stdin.write_all(&line)?;
    stdin.flush()
}

/// Writes `value` as one JSON line.
async fn send_line(stdin: &mut ChildStdin, value: &impl serde::Serialize) -> Result<(), WorkerError> {
    let protocol = |e: std::io::Error| WorkerError::Protocol(e.to_string());
    let line = serde_json::to_string(value).map_err(|e| WorkerError::Protocol(e.to_string()))?;
    stdin
        .write_all(format!("{line}\n").as_bytes())
        .await
        .map_err(protocol)?;
    stdin.flush().await.map_err(protocol)
}

/// The second half of [`handshake`]: the sandbox report.
async fn read_hello(stdout: &mut Lines<BufReader<ChildStdout>>) -> Result<SandboxRecord, WorkerError> {
    let protocol = |e: std::io::Error| WorkerError::Protocol(e.to_string());
    let hello = stdout
        .next_line()
        .await
        .map_err(protocol)?
        .ok_or_else(|| WorkerError::Protocol("worker exited before reporting its sandbox".into()))?;
    match serde_json::from_str::<WorkerHello>(&hello).map_err(|e| WorkerError::Protocol(format!("{e}: {hello}")))? {
        WorkerHello::Ready(sandbox) => Ok(sandbox),
        WorkerHello::Refused(why) => Err(WorkerError::Refused(why)),
    }
}

/// A worker's answer line as a result; `Err` names what was unreadable.
fn answer_of(answer: &str) -> Result<ToolResult, String> {
    serde_json::from_str(answer).map_err(|e| format!("unreadable worker answer: {e}"))
}

/// The worker process, killed and reaped when dropped (a fire that ends early leaves
/// none behind).
struct Proc(std::process::Child);

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// Starts `exe args...` as a worker process with piped stdin and stdout and only
/// `env` (plus the sandbox test hook [`crate::sandbox::SIMULATE_MISSING_ENV`] when
/// set). Synchronous: callable before the runtime restricts itself.
pub fn spawn_process(exe: &Path, args: &[String], env: &[(String, String)]) -> std::io::Result<std::process::Child> {
    spawn_process_with_stderr(exe, args, env, Stdio::inherit())
}

/// The shell line a parked worker waits in: one line on stdin, then the worker itself
/// (`$0 "$@"`) in its place, with the same stdin and stdout. The shell reads its line
/// a byte at a time from the pipe (POSIX `read` must not read past the newline), so
/// the configuration the runtime writes next reaches the worker whole.
const PARKED: &str = r#"read -r go && exec "$0" "$@""#;

/// As [`spawn_process`], parked: a small shell (`/bin/sh`) that starts the worker
/// only when [`wake_parked`] says so. The spare tool worker must be started before the
/// runtime restricts itself (a process under Landlock cannot set up the mounts a
/// worker's sandbox needs), but is used only when the first worker dies: parked, it
/// costs a shell's start instead of the runtime binary's on every fire.
pub fn spawn_parked(exe: &Path, args: &[String], env: &[(String, String)]) -> std::io::Result<std::process::Child> {
    let sh_args: Vec<String> = ["-c".to_string(), PARKED.to_string(), exe.display().to_string()]
        .into_iter()
        .chain(args.iter().cloned())
        .collect();
    spawn_process(Path::new("/bin/sh"), &sh_args, env)
}

/// Starts the worker a parked process ([`spawn_parked`]) waits to start.
pub fn wake_parked(mut child: std::process::Child) -> std::io::Result<std::process::Child> {
    use std::io::Write;
    let stdin = child
        .stdin
        .as_mut()
        .ok_or_else(|| std::io::Error::other("the parked worker has no stdin"))?;
    stdin.write_all(b"go\n")?;
    Ok(child)
}

/// As [`spawn_process`], with the worker's stderr sent to `stderr` (an MCP server's
/// worker: the server writes its complaints there, for its failure card).
pub fn spawn_process_with_stderr(
    exe: &Path,
    args: &[String],
    env: &[(String, String)],
    stderr: Stdio,
) -> std::io::Result<std::process::Child> {
    let mut cmd = std::process::Command::new(exe);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)));
    if let Ok(v) = std::env::var(crate::sandbox::SIMULATE_MISSING_ENV) {
        cmd.env(crate::sandbox::SIMULATE_MISSING_ENV, v);
    }
    // The worker (and through it every command it runs) dies with the runtime, also
    // when the runtime is SIGKILLed: it asks for that itself, first thing
    // ([`crate::worker::die_with_runtime`]), told who the runtime is. No hook runs in
    // the child, so the spawn is a `vfork` (`posix_spawn`): a fork of the runtime
    // copied its page tables, 1.5-3 ms for the worker and its spare on the way to the
    // first model request.
    cmd.env(crate::worker::PARENT_ENV, std::process::id().to_string());
    cmd.spawn()
}
