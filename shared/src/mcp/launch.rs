//! The worker's side of an MCP server: what a tool worker is told to start
//! ([`McpLaunch`], sent in its configuration) and how it runs it ([`run_server`]):
//! the server as its child, on the worker's own stdin and stdout, inside the sandbox
//! the worker already entered. Kept apart from the runtime's client
//! (`agent::mcp_client`) so the worker, below the agent loop, can reach it.

use serde::{Deserialize, Serialize};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What the worker starts: sent in its [`crate::worker::WorkerConfig`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpLaunch {
    pub server: String,
    pub argv: Vec<String>,
    /// Where the server's stderr goes (in the run's scratch), for failure cards.
    pub stderr: PathBuf,
}

/// In the sandboxed worker: runs the server on the worker's own stdin and stdout, in
/// the repository root with `env` only, and waits for it. The worker is PID 1 of its
/// namespace: when it ends, whatever the server forked ends with it.
pub fn run_server(root: &Path, env: &[(String, String)], launch: &McpLaunch) -> std::io::Result<()> {
    let stderr = std::fs::File::create(&launch.stderr)?;
    let Some((program, args)) = launch.argv.split_first() else {
        return Ok(());
    };
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(root)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::inherit())
        .stdout(Stdio::inherit())
        .stderr(Stdio::from(stderr.try_clone()?));
    // SAFETY: prctl only sets a flag of the child; async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    match cmd.spawn() {
        Ok(mut child) => {
            child.wait()?;
        }
        Err(e) => {
            use std::io::Write;
            let mut f = stderr;
            writeln!(f, "cannot start `{program}`: {e}")?;
        }
    }
    Ok(())
}
