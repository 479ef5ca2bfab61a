//! Streamable-HTTP MCP servers (a `url:` entry): the session is opened from the
//! runtime process with the official SDK's client transport, and everything after it
//! (the tool list checked against its pins, the gate, the output caps, the records)
//! is the same as for a stdio server. Nothing of such a server runs here, so it has
//! no worker and no sandbox of ours: what review pins is the URL and each tool's
//! definition, and the runtime's own Landlock domain gets the URL's TCP port.

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
    let transport = rmcp::transport::StreamableHttpClientTransport::with_client(client()?, config);
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

/// The HTTP client of a session: rustls with ring and the web's roots bundled in the
/// binary (as the providers have: no system store to load, none missing on a minimal
/// image), no redirects (a server cannot send the session, or its token, to another
/// URL than the pinned one), no proxy from the environment.
fn client() -> Result<reqwest_mcp::Client, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    let tls =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS set-up: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
    reqwest_mcp::Client::builder()
        .tls_backend_preconfigured(tls)
        .redirect(reqwest_mcp::redirect::Policy::none())
        .no_proxy()
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}
