//! The runtime's side of the tool worker: spawns the worker process (the `runtime`
//! binary's hidden `__tool-worker` command), sends it its sandbox, and exchanges one
//! JSON line per tool call. A worker that dies mid-call makes the call's side effect
//! uncertain rather than crashing the fire.

use crate::records::SandboxRecord;
use crate::tools::{ErrorClass, ToolRequest, ToolResult};
use crate::worker::{WorkerConfig, WorkerHello};
use std::path::Path;
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

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
    child: Child,
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
        let mut command = Command::new(exe);
        // SAFETY: prctl only sets a flag of the child; async-signal-safe.
        unsafe {
            command.pre_exec(|| {
                // The worker (and through it every command it runs) dies with the
                // runtime, also when the runtime is SIGKILLed.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut child = command
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .env_clear()
            .envs(config.env.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(true)
            .spawn()
            .map_err(WorkerError::Spawn)?;
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| WorkerError::Protocol("no stdin".into()))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| WorkerError::Protocol("no stdout".into()))?;
        let mut stdout = BufReader::new(stdout).lines();
        let line = serde_json::to_string(config).map_err(|e| WorkerError::Protocol(e.to_string()))?;
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .map_err(|e| WorkerError::Protocol(e.to_string()))?;
        stdin.flush().await.map_err(|e| WorkerError::Protocol(e.to_string()))?;
        let hello = stdout
            .next_line()
            .await
            .map_err(|e| WorkerError::Protocol(e.to_string()))?
            .ok_or_else(|| WorkerError::Protocol("worker exited before reporting its sandbox".into()))?;
        match serde_json::from_str::<WorkerHello>(&hello).map_err(|e| WorkerError::Protocol(format!("{e}: {hello}")))? {
            WorkerHello::Ready(sandbox) => Ok(WorkerClient {
                child,
                stdin,
                stdout,
                sandbox,
            }),
            WorkerHello::Refused(why) => Err(WorkerError::Refused(why)),
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
                let _ = self.child.start_kill();
                uncertain("tool worker did not answer in time and was killed".into())
            }
        }
    }

    /// A handle that can interrupt the worker while a call borrows it.
    pub fn interrupt_handle(&self) -> Interrupter {
        Interrupter { pid: self.child.id() }
    }

    pub async fn shutdown(mut self) {
        drop(self.stdin);
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), self.child.wait()).await;
        let _ = self.child.start_kill();
    }
}
