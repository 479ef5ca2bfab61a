//! The runtime's side of the tool worker: spawns the worker process (the `runtime`
//! binary's hidden `__tool-worker` command), sends it its sandbox, and exchanges one
//! JSON line per tool call. A worker that dies mid-call makes the call's side effect
//! uncertain rather than crashing the fire.

use crate::records::SandboxRecord;
use crate::tools::{ErrorClass, ToolRequest, ToolResult};
use crate::worker::{WorkerConfig, WorkerHello};
use std::os::unix::process::CommandExt;
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
            // SAFETY: signalling our own child process.
            unsafe {
                libc::kill(pid as i32, libc::SIGTERM);
            }
        }
    }
}

pub struct WorkerClient {
    child: Proc,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    pub sandbox: SandboxRecord,
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
    /// Starts `exe args...` as the worker and waits for its sandbox report.
    pub async fn spawn(exe: &Path, args: &[String], config: &WorkerConfig) -> Result<WorkerClient, WorkerError> {
        let child = spawn_process(exe, args, &config.env).map_err(WorkerError::Spawn)?;
        WorkerClient::adopt(child, config).await
    }

    /// Takes over a worker process started by [`spawn_process`] (before the runtime
    /// restricted itself: a worker entering namespaces needs mount calls Landlock
    /// refuses), sends it `config` and waits for its sandbox report.
    pub async fn adopt(mut child: std::process::Child, config: &WorkerConfig) -> Result<WorkerClient, WorkerError> {
        let protocol = |e: std::io::Error| WorkerError::Protocol(e.to_string());
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| WorkerError::Protocol("no stdin".into()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| WorkerError::Protocol("no stdout".into()))?;
        let (mut stdin, stdout) = match (ChildStdin::from_std(stdin), ChildStdout::from_std(stdout)) {
            (Ok(i), Ok(o)) => (i, o),
            (Err(e), _) | (_, Err(e)) => {
                drop(Proc(child));
                return Err(protocol(e));
            }
        };
        let mut stdout = BufReader::new(stdout).lines();
        let handshake = async {
            let line = serde_json::to_string(config).map_err(|e| WorkerError::Protocol(e.to_string()))?;
            stdin
                .write_all(format!("{line}\n").as_bytes())
                .await
                .map_err(protocol)?;
            stdin.flush().await.map_err(protocol)?;
            let hello = stdout
                .next_line()
                .await
                .map_err(protocol)?
                .ok_or_else(|| WorkerError::Protocol("worker exited before reporting its sandbox".into()))?;
            match serde_json::from_str::<WorkerHello>(&hello)
                .map_err(|e| WorkerError::Protocol(format!("{e}: {hello}")))?
            {
                WorkerHello::Ready(sandbox) => Ok(sandbox),
                WorkerHello::Refused(why) => Err(WorkerError::Refused(why)),
            }
        };
        match handshake.await {
            Ok(sandbox) => Ok(WorkerClient {
                child: Proc(child),
                stdin,
                stdout,
                sandbox,
            }),
            Err(e) => {
                drop(Proc(child));
                Err(e)
            }
        }
    }

    /// Runs one call. The worker enforces the per-call timeout; this adds a margin.
    pub async fn call(&mut self, req: &ToolRequest) -> ToolResult {
        let uncertain = |why: String| ToolResult::error(&req.call_id, ErrorClass::SideEffectUncertain, why);
        let line = match serde_json::to_string(req) {
            Ok(l) => l,
            Err(e) => return ToolResult::error(&req.call_id, ErrorClass::InvalidArguments, e.to_string()),
        };
        if let Err(e) = self.stdin.write_all(format!("{line}\n").as_bytes()).await {
            return uncertain(format!("tool worker gone: {e}"));
        }
        if let Err(e) = self.stdin.flush().await {
            return uncertain(format!("tool worker gone: {e}"));
        }
        let margin = std::time::Duration::from_millis(req.timeout_ms + 5_000);
        match tokio::time::timeout(margin, self.stdout.next_line()).await {
            Ok(Ok(Some(answer))) => {
                serde_json::from_str(&answer).unwrap_or_else(|e| uncertain(format!("unreadable worker answer: {e}")))
            }
            Ok(Ok(None)) => uncertain("tool worker exited during the call".into()),
            Ok(Err(e)) => uncertain(format!("tool worker read error: {e}")),
            Err(_) => {
                let _ = self.child.0.kill();
                uncertain("tool worker did not answer in time and was killed".into())
            }
        }
    }

    /// A handle that can interrupt the worker while a call borrows it.
    pub fn interrupt_handle(&self) -> Interrupter {
        Interrupter {
            pid: Some(self.child.0.id()),
        }
    }

    pub async fn shutdown(self) {
        let WorkerClient { mut child, stdin, .. } = self;
        // Closing stdin ends the worker's loop; it has two seconds to leave, waited
        // for off this thread, then it is killed.
        drop(stdin);
        let pid = child.0.id() as libc::pid_t;
        let waited = tokio::task::spawn_blocking(move || {
            let _ = child.0.wait();
            child
        });
        if tokio::time::timeout(std::time::Duration::from_secs(2), waited)
            .await
            .is_err()
        {
            // SAFETY: killing our own child, not reaped yet (the waiting thread
            // reaps it once it is gone).
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
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
    let mut cmd = std::process::Command::new(exe);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)));
    if let Ok(v) = std::env::var(crate::sandbox::SIMULATE_MISSING_ENV) {
        cmd.env(crate::sandbox::SIMULATE_MISSING_ENV, v);
    }
    // SAFETY: prctl only sets a flag of the child; async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            // The worker (and through it every command it runs) dies with the
            // runtime, also when the runtime is SIGKILLed.
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.spawn()
}
