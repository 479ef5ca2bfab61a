//! `builder mcp pin [<server>]`: write `settings/mcp.lock`, the pins a fire checks
//! each MCP server's command and tool definitions against (see `shared::mcp`). It
//! prints what changed in words; commit the lock and propose it for review.

use crate::command_error::{CommandError, Kind, Outcome};
use std::path::Path;

/// MCP tool servers: pin what review approves
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: McpCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum McpCommand {
    /// Start each declared server once, list its tools and write settings/mcp.lock
    Pin {
        /// Pin only this server (the others keep their pins)
        server: Option<String>,
    },
}

pub fn run(args: Args, repo_path: &Path) -> Result<Outcome, CommandError> {
    let McpCommand::Pin { server } = args.command;
    let wt = super::open_repo(repo_path)?;
    let settings = shared::settings::load(&wt.root).map_err(CommandError::from)?.runtime;
    if settings.mcp.is_empty() {
        return Err(
            CommandError::usage("settings/runtime.yaml declares no MCP server (`mcp:`)")
                .hint("docs/mcp.md shows an entry"),
        );
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CommandError::new(Kind::Environment, e))?;
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    let pinned = rt
        .block_on(shared::agent::mcp_pin::pin(
            &wt.root,
            &settings.mcp,
            server.as_deref(),
            &path,
        ))
        .map_err(|e| match e {
            shared::agent::mcp_pin::PinError::Unknown(_) | shared::agent::mcp_pin::PinError::Unpinned { .. } => {
                CommandError::new(Kind::Config, e)
            }
            other => CommandError::new(Kind::Environment, other),
        })?;
    for p in &pinned {
        println!("pinned {}: {} tool(s)", p.server, p.tools);
        for c in &p.changes {
            println!("  {c}");
        }
    }
    println!(
        "wrote {}: commit it and `builder propose` it for review",
        shared::mcp::lock::LOCK_FILE
    );
    Ok(Outcome::Ok)
}
