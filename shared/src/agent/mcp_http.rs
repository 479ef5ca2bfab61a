//! Streamable-HTTP MCP servers (a `url:` entry): the session is opened from the
//! runtime process with the official SDK's client transport, and everything after it
//! (the tool list checked against its pins, the gate, the output caps, the records)
//! is the same as for a stdio server. Nothing of such a server runs here, so it has
//! no worker and no sandbox of ours: what review pins is the URL and each tool's
//! definition, and the runtime's own Landlock lets it connect to that port only.

use crate::mcp::config::McpServer;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::ServiceExt;

/// Opens an MCP session with the `url:` server `entry` and lists its tools once,
/// sending the value of its `token_env` variable (read from `env`) as a bearer token.
pub(super) async fn connect<H: rmcp::ClientHandler>(
    handler: H,
    entry: &McpServer,
    env: impl Fn(&str) -> Option<String>,
) -> Result<(RunningService<RoleClient, H>, Vec<rmcp::model::Tool>), String> {
    let url = entry.url.as_deref().unwrap_or_default();
    let mut config = StreamableHttpClientTransportConfig::with_uri(url);
    if let Some(var) = &entry.token_env {
        let token = env(var).ok_or_else(|| format!("`{var}` (its `token_env`) is not set"))?;
        config = config.auth_header(token);
    }
    // rmcp's HTTP client is built on its own reqwest, with rustls and no crypto
    // provider of its own: ring, which the providers' rustls already links, serves
    // the process (installing it twice is refused, and harmless).
    let _ = rustls::crypto::ring::default_provider().install_default();
    let transport = rmcp::transport::StreamableHttpClientTransport::from_config(config);
    let service = handler
        .serve(transport)
        .await
        .map_err(|e| format!("MCP initialization at {url} failed: {e}"))?;
    let tools = service
        .peer()
        .list_all_tools()
        .await
        .map_err(|e| format!("tools/list failed: {e}"))?;
    Ok((service, tools))
}
