//! `builder mcp pin [<server>]`: write `settings/mcp.lock`, the pins a fire checks
//! each MCP server's command and tool definitions against (see `shared::mcp`). It
//! prints what changed in words; commit the lock and propose it for review. It runs
//! each stdio server's program in a fire's sandbox (a worker of the `runtime`
//! binary), handed the variables it asks for, and connects to each `url:` server with
//! your token, so what it would start must be trusted first (`--trust`, remembered
//! per machine: see `shared::agent::mcp_pin`).

use crate::command_error::{CommandError, Kind, Outcome};
use shared::agent::mcp_pin::{PinError, PinSandbox};
use std::path::Path;

/// MCP tool servers: pin what review approves
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub command: McpCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum McpCommand {
    /// Start each declared server once (trusted: see --trust), list its tools and write settings/mcp.lock
    Pin {
        /// Pin only this server (the others keep their pins)
        server: Option<String>,
        /// Trust what the servers run (their program, its files, the variables they
        /// get, their read roots and ports) after reading it: pinning runs it, in a
        /// fire's sandbox
        #[arg(long)]
        trust: bool,
    },
}

pub fn run(args: Args, repo_path: &Path) -> Result<Outcome, CommandError> {
    let McpCommand::Pin { server, trust } = args.command;
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
    let store = shared::agent::mcp_pin::TrustStore::of_person(trust).ok_or_else(|| {
        CommandError::new(
            Kind::Environment,
            anyhow::anyhow!("neither HOME nor XDG_STATE_HOME is set to an absolute path: nowhere to remember which servers you trust"),
        )
    })?;
    let trusted =
        shared::agent::mcp_pin::trust(&wt.root, &settings.mcp, server.as_deref(), &path, &store).map_err(pin_error)?;
    // Said before anything starts: a pin that fails after this has trusted them all
    // the same.
    for said in &trusted.now {
        println!("trusted now: {said}");
    }
    let sandbox = match trusted.starts_a_program() {
        true => {
            let worker_cmd = (
                super::eval::runtime_binary()?,
                vec![shared::worker::WORKER_COMMAND.to_string()],
            );
            Some(PinSandbox::of(&wt.root, &settings, worker_cmd, &path).map_err(pin_error)?)
        }
        false => None,
    };
    // A worker that ended (its server died, or its sandbox could not be entered) must
    // fail the write to it, not kill `builder` by SIGPIPE, which its `main` restored
    // for `builder ... | head` (CI saw a pin of a dying server end by a signal).
    kernel::signal::ignore(kernel::signal::Signal::Pipe);
    let pinned = rt
        .block_on(shared::agent::mcp_pin::pin(
            &wt.root,
            &settings.mcp,
            trusted,
            sandbox.as_ref(),
        ))
        .map_err(pin_error)?;
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

/// How a pin that failed is reported: what is not trusted yet is refused (exit 1, with
/// what to do), a declaration or rule that cannot be pinned is the settings' fault.
fn pin_error(e: PinError) -> CommandError {
    match e {
        PinError::Untrusted(_) => CommandError::new(Kind::Refused, e).hint(
            "read what it runs (the program, the files of its directory, the declaration in settings/runtime.yaml); then `builder mcp pin --trust`. Never pin a branch you have not read: a review needs no pin",
        ),
        PinError::Unknown(_) | PinError::Unpinned { .. } | PinError::Rules(_) => CommandError::new(Kind::Config, e),
        PinError::Lock(_) | PinError::Listing { .. } | PinError::TrustStore { .. } | PinError::Repository(_) => {
            CommandError::new(Kind::Environment, e)
        }
    }
}
