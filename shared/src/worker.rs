//! The tool worker: a separate process that enters its Landlock sandbox first thing,
//! then executes tool requests read as JSON lines on stdin and answers on stdout.
//! Everything the model can cause (file tools, `run_command` and its children) runs
//! here, so no write the model influences can bypass the kernel's rules, and the
//! runtime process that holds `.git` and `.runtime/` never runs model-chosen actions.

use crate::records::SandboxRecord;
use crate::sandbox::{isolate, landlock, namespaces::NamespacePlan, SandboxSpec};
use crate::settings::LandlockMode;
use crate::tools::exec::{execute, install_interrupt_handlers, ExecContext};
use crate::tools::{ErrorClass, ToolRequest, ToolResult};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::path::PathBuf;

/// Sent as the first line to a new worker.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerConfig {
    pub root: PathBuf,
    pub scratch: PathBuf,
    pub spec: SandboxSpec,
    pub mode: LandlockMode,
    pub env: Vec<(String, String)>,
    /// The worker's namespaces (issue 10): `None` runs it in the runtime's own.
    #[serde(default)]
    pub isolation: Option<NamespacePlan>,
    /// Run this MCP server instead of serving tool calls: once in its sandbox, the
    /// worker starts it on its own stdin and stdout and waits for it ([`crate::mcp`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<crate::mcp::McpLaunch>,
}

/// The worker's first answer: the sandbox it is in, or why it could not enter it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum WorkerHello {
    Ready(SandboxRecord),
    Refused(String),
}

/// The worker's main loop. Must run before any other thread of the process starts.
pub fn serve(input: impl BufRead, mut output: impl Write) -> std::io::Result<()> {
    // SIGTERM/SIGINT kill the running command, not the worker.
    install_interrupt_handlers();
    // SAFETY: close every inherited descriptor above stderr; this process uses only
    // stdin, stdout and stderr, and no other thread exists yet.
    unsafe {
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32);
    }
    let mut lines = input.lines();
    let Some(first) = lines.next().transpose()? else {
        return Ok(());
    };
    let config: WorkerConfig = match serde_json::from_str(&first) {
        Ok(c) => c,
        Err(e) => {
            writeln!(
                output,
                "{}",
                serde_json::to_string(&WorkerHello::Refused(format!("bad worker config: {e}")))?
            )?;
            return Ok(());
        }
    };
    let hello = match crate::sandbox::prepare_dirs(&config.spec)
        .map_err(|e| e.to_string())
        .and_then(|_| isolate::before_landlock(config.isolation.as_ref(), config.mode))
        .and_then(|layers| {
            let rec = landlock::enforce(&config.spec, config.mode).map_err(|e| e.to_string())?;
            isolate::after_landlock(config.isolation.as_ref(), config.mode, layers, rec)
        }) {
        Ok(rec) => WorkerHello::Ready(rec),
        Err(e) => WorkerHello::Refused(e),
    };
    let refused = matches!(hello, WorkerHello::Refused(_));
    writeln!(output, "{}", serde_json::to_string(&hello)?)?;
    output.flush()?;
    if refused {
        return Ok(());
    }
    if let Some(launch) = &config.mcp {
        return crate::mcp::run_server(&config.root, &config.env, launch);
    }
    let ctx = ExecContext {
        root: config.root,
        scratch: config.scratch,
        env: config.env,
    };
    for line in lines {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let result = match serde_json::from_str::<ToolRequest>(&line) {
            Ok(req) => {
                let result = execute(&ctx, &req);
                if matches!(req.args, crate::tools::ToolArgs::RunCommand { .. }) {
                    crate::sandbox::namespaces::end_of_call();
                }
                result
            }
            Err(e) => ToolResult::error("", ErrorClass::InvalidArguments, format!("bad request: {e}")),
        };
        writeln!(output, "{}", serde_json::to_string(&result)?)?;
        output.flush()?;
    }
    Ok(())
}
