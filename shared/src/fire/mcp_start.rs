//! The fire's MCP servers: the worker processes of stdio servers are spawned with the
//! tool worker's, before the runtime restricts itself, and started (sandboxed, listed,
//! checked against `settings/mcp.lock`) once the tool worker is up; `url:` servers are
//! connected to then. Drift and servers that did
//! not start become cards and the fire goes on without their tools; a `required`
//! server that did not start stops the fire.

use super::{Aborted, FireEnd, FireRun};
use crate::agent::mcp_client::McpHub;
use crate::agent::mcp_client::{start, StartInput};
use crate::mcp::lock::{McpLock, LOCK_FILE};
use crate::records::CardKind;
use crate::sandbox;
use crate::tools::exec::ExecContext;

impl FireRun {
    /// The lock of the commit the fire runs on, read as its settings are: a lock
    /// only in the work tree (ignored, or a committed one marked `--skip-worktree`
    /// and changed) pins nothing anyone reviewed. A commit without one pins nothing.
    fn committed_lock(&self) -> Result<McpLock, String> {
        use crate::review::committed::{Committed, ReadError};
        let commit = (self.inputs.commit.as_deref())
            .and_then(|c| git2::Oid::from_str(c).ok())
            .ok_or_else(|| "the fire has no commit to read it from".to_string())?;
        let committed = Committed::at(&self.repo, commit).map_err(|e| e.message().to_string())?;
        match committed.read_to_string(LOCK_FILE) {
            Ok(text) => McpLock::parse(&text, std::path::Path::new(LOCK_FILE)).map_err(|e| e.to_string()),
            Err(ReadError::Missing { .. }) => Ok(McpLock::empty()),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Spawns a worker process per declared server (before Landlock).
    pub(super) fn spawn_mcp_workers(&mut self, env: &[(String, String)]) {
        self.mcp_workers =
            crate::agent::mcp_client::spawn_workers(&self.config.settings.mcp, &self.ctx.opts.worker_cmd, env);
    }

    /// Starts the servers; `Err` when the lock cannot be read or a required server did
    /// not start.
    pub(super) async fn start_mcp(&mut self) -> Result<McpHub, Aborted> {
        let spawned = std::mem::take(&mut self.mcp_workers);
        if self.config.settings.mcp.is_empty() {
            return Ok(McpHub::default());
        }
        let root = self.ctx.opts.root.clone();
        let lock = match self.committed_lock() {
            Ok(l) => l,
            Err(why) => {
                return Err(self.abort(
                    FireEnd::InvalidInput,
                    CardKind::InvalidConfig,
                    "settings/mcp.lock could not be read".into(),
                    why,
                ))
            }
        };
        let spec = sandbox::worker_spec(
            &root,
            &crate::git::git_dirs(&self.repo),
            &self.config.scratch,
            &self.config.settings,
            self.config.policy.ownership(),
        );
        let input = StartInput {
            root: &root,
            scratch: &self.config.scratch,
            servers: &self.config.settings.mcp,
            spec: &spec,
            mode: self.config.settings.sandbox.landlock,
            masked: self.config.policy.read_masks(),
            write_bytes: self.config.settings.sandbox.write_bytes,
            env: ExecContext::scrubbed_env(&self.config.scratch),
            path: std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into()),
            home: std::env::var_os("HOME").map(Into::into),
            redactor: &self.config.redactor,
        };
        tracing::debug!(
            elapsed_ms = self.ctx.started.elapsed().as_secs_f64() * 1e3,
            "starting MCP servers"
        );
        let started = start(&input, &lock, spawned).await;
        for (server, ms) in &started.hub.start_ms {
            tracing::debug!(server = %server, start_ms = ms, "MCP server started");
        }
        self.state.cards.extend(started.cards);
        if let Some(card) = started.fatal {
            started.hub.shutdown().await;
            self.abort = Some(super::Abort {
                end: FireEnd::Failed,
                card,
            });
            return Err(Aborted);
        }
        Ok(started.hub)
    }
}
