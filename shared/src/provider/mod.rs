//! Model providers behind one adapter: OpenAI Chat Completions (and compatible
//! servers: llama.cpp, vLLM, Ollama), Anthropic Messages, and `replay` (answers from a
//! recorded trace). Each declares its capabilities. HTTP providers retry 429, 5xx,
//! connection errors and timeouts with exponential backoff and jitter, honour
//! `retry-after`, and never retry other 4xx; an optional fallback provider is tried
//! when the primary gives up. Keys come from environment variables only.

mod anthropic;
pub mod context_cache;
mod http;
mod openai;
mod replay;

use crate::progress::{Event, ProgressSink};
use crate::records::Tokens;
use crate::settings::{Limits, ProviderKind, ProviderSettings};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;

pub use replay::{Replay, ReplayCall, ReplayTrace, ReplayTurn, ReplayUsage, TRACE_CAP};

/// A tool call requested by the model. `arguments` is the raw JSON text as the
/// model sent it (it may be invalid).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    System {
        content: String,
    },
    User {
        content: String,
    },
    Assistant {
        content: Option<String>,
        tool_calls: Vec<ToolCall>,
    },
    Tool {
        call_id: String,
        name: String,
        content: String,
        is_error: bool,
    },
}

impl Message {
    /// Rough size in tokens (4 bytes a token), for context budgeting.
    pub fn approx_tokens(&self) -> u64 {
        let bytes = match self {
            Message::System { content } | Message::User { content } => content.len(),
            Message::Assistant { content, tool_calls } => {
                content.as_deref().map_or(0, str::len)
                    + tool_calls
                        .iter()
                        .map(|c| c.name.len() + c.arguments.len() + 16)
                        .sum::<usize>()
            }
            Message::Tool { content, .. } => content.len() + 16,
        };
        (bytes as u64).div_ceil(4) + 4
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    pub schema: serde_json::Value,
}

#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub model: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolDef>,
    pub max_output_tokens: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelResponse {
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Tokens,
    /// HTTP retries this answer took.
    pub retries: u32,
    /// Which provider answered (`primary` or `fallback`).
    pub served_by: String,
}

impl ModelResponse {
    /// One provider's answer as parsed, before the chain fills in how many retries it
    /// took and which provider served it.
    pub fn parsed(content: Option<String>, tool_calls: Vec<ToolCall>, usage: Tokens) -> Self {
        ModelResponse {
            content,
            tool_calls,
            usage: Tokens::reported(usage.input, usage.output),
            retries: 0,
            served_by: "primary".into(),
        }
    }
}

/// What a provider can do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    pub tool_calling: bool,
    pub parallel_calls: bool,
    pub streaming: bool,
    pub max_context: u64,
}

/// Why a model call failed. Its name (`rate_limited`) is derived once, for serde and
/// for every line and card that shows it ([`ProviderErrorKind::as_str`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, strum::IntoStaticStr)]
#[serde(rename_all = "snake_case")]
#[strum(serialize_all = "snake_case")]
pub enum ProviderErrorKind {
    RateLimited,
    Server,
    Auth,
    BadRequest,
    Timeout,
    Connect,
    Decode,
    ReplayExhausted,
    Config,
    /// The server refused the request for its length: the context did not fit.
    ContextOverflow,
}

impl ProviderErrorKind {
    pub fn as_str(self) -> &'static str {
        self.into()
    }
}

/// Why a model call failed, after retries: `rate_limited (HTTP 429, 3 retries): ...`.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}: {message}", self.headline())]
pub struct ProviderError {
    pub kind: ProviderErrorKind,
    pub status: Option<u16>,
    pub message: String,
    pub retries: u32,
    /// For a timeout: the request timeout that ran out, in seconds.
    pub timeout_s: Option<u64>,
}

impl ProviderError {
    /// What failed and how, without the server's text: the kind, the HTTP status or
    /// the timeout, and the retries taken (`timeout (no answer within 60 s, 3 retries)`).
    pub fn headline(&self) -> String {
        let retries = format!(
            "{} {}",
            self.retries,
            if self.retries == 1 { "retry" } else { "retries" }
        );
        match (self.status, self.kind) {
            (Some(s), _) => format!("{} (HTTP {s}, {retries})", self.kind.as_str()),
            (None, ProviderErrorKind::Timeout) => match self.timeout_s {
                Some(t) => format!("timeout (no answer within {t} s, {retries})"),
                None => format!("timeout ({retries})"),
            },
            (None, _) => format!("{} ({retries})", self.kind.as_str()),
        }
    }

    pub(crate) fn new(kind: ProviderErrorKind, status: Option<u16>, message: impl Into<String>) -> Self {
        ProviderError {
            kind,
            status,
            message: message.into(),
            retries: 0,
            timeout_s: None,
        }
    }
}

/// Retry and timeout policy for HTTP providers.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub max_retries: u32,
    pub base_delay: Duration,
    pub max_delay: Duration,
    pub request_timeout: Duration,
    /// The most bytes of a response body read (`limits.provider_response_bytes`).
    pub max_body_bytes: u64,
}

impl RetryPolicy {
    pub fn from_limits(l: &Limits) -> Self {
        RetryPolicy {
            max_retries: l.max_retries,
            base_delay: Duration::from_millis(l.retry_base_ms),
            max_delay: Duration::from_secs(30),
            request_timeout: Duration::from_secs(l.request_timeout_s),
            max_body_bytes: l.provider_response_bytes,
        }
    }
}

/// What stands in for the API key in a request shown to a person.
pub use crate::secrets::REDACTED;

/// One HTTP request as a provider sends it: URL, headers and JSON body.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WireRequest {
    pub url: String,
    pub headers: Vec<(&'static str, String)>,
    pub body: serde_json::Value,
}

enum Backend {
    OpenAi(openai::OpenAi),
    Anthropic(anthropic::Anthropic),
    Replay(replay::Replay),
}

/// One configured provider.
pub struct Provider {
    backend: Backend,
    settings: ProviderSettings,
    /// The context window the server reported ([`Provider::learn_context`]).
    served_context: Option<u64>,
}

impl Provider {
    /// Builds a provider; `root` resolves a replay trace path, read from the work tree.
    pub fn new(settings: &ProviderSettings, root: &Path, retry: RetryPolicy) -> Result<Provider, ProviderError> {
        Provider::with_replay(settings, retry, |rel| replay::Replay::load(root, &root.join(rel)))
    }

    /// Builds a provider whose replay trace (for `kind: replay`) `load` gives from its
    /// repository-relative path: a fire reads it from the commit it fires, as every
    /// other builder-owned file.
    pub fn with_replay(
        settings: &ProviderSettings,
        retry: RetryPolicy,
        load: impl FnOnce(&str) -> Result<replay::Replay, ProviderError>,
    ) -> Result<Provider, ProviderError> {
        let key = match &settings.api_key_env {
            Some(name) => std::env::var(name).ok(),
            None => None,
        };
        let backend = match settings.kind {
            ProviderKind::Openai => Backend::OpenAi(openai::OpenAi::new(settings, key, retry)?),
            ProviderKind::Anthropic => Backend::Anthropic(anthropic::Anthropic::new(settings, key, retry)?),
            ProviderKind::Replay => {
                let rel = settings.replay.as_deref().ok_or_else(|| {
                    ProviderError::new(ProviderErrorKind::Config, None, "replay provider needs `replay:`")
                })?;
                Backend::Replay(load(rel)?)
            }
        };
        Ok(Provider {
            backend,
            settings: settings.clone(),
            served_context: None,
        })
    }

    /// Asks a local OpenAI-compatible server for its context window, when the settings
    /// do not declare one (llama.cpp's `n_ctx`, vLLM's `max_model_len`). Settings win.
    /// The answer is remembered in `state_dir` ([`context_cache`]), so a server is
    /// asked at most once per [`context_cache::REMEMBERED_FOR`], not on every fire.
    #[tracing::instrument(level = "debug", skip_all)]
    pub async fn learn_context(&mut self, state_dir: &Path) {
        if self.settings.max_context_tokens.is_some() {
            return;
        }
        if let Backend::OpenAi(p) = &self.backend {
            let model = self.settings.model_name().to_string();
            let mut cache = context_cache::ContextCache::open(state_dir);
            let now = std::time::SystemTime::now();
            self.served_context = match cache.recall(p.base(), &model, now) {
                Some(known) => known,
                None => {
                    let asked = p.served_context(Duration::from_secs(1)).await;
                    cache.remember(p.base(), &model, asked, now);
                    asked
                }
            };
            if let Some(n) = self.served_context {
                tracing::debug!(n_ctx = n, "the model server reports its context window");
            }
        }
    }

    pub fn capabilities(&self) -> Capabilities {
        let declared = self.settings.max_context_tokens.or(self.served_context);
        match &self.backend {
            Backend::OpenAi(_) => Capabilities {
                tool_calling: true,
                parallel_calls: true,
                streaming: true,
                max_context: declared.unwrap_or(128_000),
            },
            Backend::Anthropic(_) => Capabilities {
                tool_calling: true,
                parallel_calls: true,
                streaming: true,
                max_context: declared.unwrap_or(200_000),
            },
            Backend::Replay(_) => Capabilities {
                tool_calling: true,
                parallel_calls: true,
                streaming: false,
                max_context: declared.unwrap_or(128_000),
            },
        }
    }

    /// `kind model`, for records of which provider served a step.
    pub fn describe(&self) -> String {
        format!("{} {}", self.kind(), self.model())
    }

    /// The settings' kind of this provider (`openai`, `anthropic`, `replay`), which is
    /// also its GenAI semantic-convention `gen_ai.provider.name`.
    pub fn kind(&self) -> &'static str {
        match self.settings.kind {
            ProviderKind::Openai => "openai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Replay => "replay",
        }
    }

    pub fn model(&self) -> String {
        match &self.backend {
            Backend::Replay(r) => self.settings.model.clone().unwrap_or_else(|| r.model().to_string()),
            Backend::OpenAi(_) | Backend::Anthropic(_) => self.settings.model_name().to_string(),
        }
    }

    /// Asks the model; HTTP retries are reported to `progress`.
    pub async fn complete(
        &self,
        req: &ModelRequest,
        progress: &dyn ProgressSink,
    ) -> Result<ModelResponse, ProviderError> {
        let answer = match &self.backend {
            Backend::OpenAi(p) => p.complete(req, progress).await,
            Backend::Anthropic(p) => p.complete(req, progress).await,
            Backend::Replay(p) => p.complete(req),
        };
        answer.map(|mut r| {
            r.served_by = self.describe();
            r
        })
    }

    /// The request [`Provider::complete`] would send for `req`, built by the same code,
    /// with the API key replaced by [`REDACTED`]; `None` for `replay`, which sends
    /// nothing.
    pub fn redacted_request(&self, req: &ModelRequest) -> Option<WireRequest> {
        match &self.backend {
            Backend::OpenAi(p) => Some(p.wire(req, p.has_key().then_some(REDACTED))),
            Backend::Anthropic(p) => Some(p.wire(req, p.has_key().then_some(REDACTED))),
            Backend::Replay(_) => None,
        }
    }
}

/// The TCP port a provider's base URL points at.
pub fn provider_port(s: &ProviderSettings) -> Option<u16> {
    let url = match s.kind {
        ProviderKind::Replay => return None,
        ProviderKind::Openai => s.base_url.clone().unwrap_or_else(|| openai::DEFAULT_BASE_URL.into()),
        ProviderKind::Anthropic => s.base_url.clone().unwrap_or_else(|| anthropic::DEFAULT_BASE_URL.into()),
    };
    let parsed = reqwest::Url::parse(&url).ok()?;
    parsed.port_or_known_default()
}

/// The primary provider with an optional fallback, behind a circuit breaker: once the
/// primary has failed and the fallback answered, calls go straight to the fallback
/// until `cooldown` has passed, instead of paying the primary's retries on every step.
/// After the cool-down the primary is tried again.
pub struct ProviderChain {
    pub primary: Provider,
    pub fallback: Option<Provider>,
    cooldown: Duration,
    /// While set and in the future, the breaker is open: the primary is skipped.
    open_until: std::sync::Mutex<Option<std::time::Instant>>,
}

impl ProviderChain {
    pub fn new(primary: Provider, fallback: Option<Provider>, cooldown: Duration) -> ProviderChain {
        ProviderChain {
            primary,
            fallback,
            cooldown,
            open_until: std::sync::Mutex::new(None),
        }
    }

    fn breaker_open(&self) -> bool {
        let guard = self.open_until.lock().unwrap_or_else(|p| p.into_inner());
        guard.is_some_and(|until| std::time::Instant::now() < until)
    }

    fn trip(&self) {
        let mut guard = self.open_until.lock().unwrap_or_else(|p| p.into_inner());
        *guard = Some(std::time::Instant::now() + self.cooldown);
    }

    /// Asks the primary, then the fallback when the primary gives up (or straight away
    /// while the breaker is open); retries and the switch are reported to `progress`.
    pub async fn complete(
        &self,
        req: &ModelRequest,
        progress: &dyn ProgressSink,
    ) -> Result<ModelResponse, ProviderError> {
        let fallback = match &self.fallback {
            Some(fb) if self.breaker_open() => return self.via_fallback(fb, req, 0, progress).await,
            Some(fb) => Some(fb),
            None => None,
        };
        match self.primary.complete(req, progress).await {
            Ok(mut r) => {
                r.served_by = format!("primary ({})", r.served_by);
                Ok(r)
            }
            Err(e) => match fallback {
                Some(fb) if e.kind != ProviderErrorKind::ReplayExhausted => {
                    tracing::warn!(error = %e, "primary provider failed; trying the fallback");
                    progress.event(&Event::Fallback {
                        to: fb.kind().to_string(),
                        reason: e.headline(),
                    });
                    let r = self.via_fallback(fb, req, e.retries, progress).await?;
                    self.trip();
                    Ok(r)
                }
                _ => Err(e),
            },
        }
    }

    async fn via_fallback(
        &self,
        fb: &Provider,
        req: &ModelRequest,
        retries: u32,
        progress: &dyn ProgressSink,
    ) -> Result<ModelResponse, ProviderError> {
        let mut freq = req.clone();
        freq.model = fb.model();
        let mut r = fb.complete(&freq, progress).await.map_err(|fe| ProviderError {
            retries: fe.retries + retries,
            ..fe
        })?;
        r.retries += retries;
        r.served_by = format!("fallback ({})", r.served_by);
        Ok(r)
    }
}

/// Price of a call in USD, from the settings' per-model table (0 when unknown).
pub fn cost_usd(
    prices: &std::collections::BTreeMap<String, crate::settings::Price>,
    model: &str,
    usage: Tokens,
) -> f64 {
    match prices.get(model) {
        Some(p) => (usage.input as f64 * p.input_per_mtok + usage.output as f64 * p.output_per_mtok) / 1_000_000.0,
        None => 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "sk-unit-SECRET-0123456789";

    fn provider(yaml: &str) -> Provider {
        let settings: ProviderSettings = serde_yaml::from_str(yaml).unwrap();
        let retry = RetryPolicy::from_limits(&Limits::default());
        let backend = match settings.kind {
            ProviderKind::Openai => Backend::OpenAi(openai::OpenAi::new(&settings, Some(KEY.into()), retry).unwrap()),
            ProviderKind::Anthropic => {
                Backend::Anthropic(anthropic::Anthropic::new(&settings, Some(KEY.into()), retry).unwrap())
            }
            ProviderKind::Replay => unreachable!("no key"),
        };
        Provider {
            backend,
            settings,
            served_context: None,
        }
    }

    fn request() -> ModelRequest {
        ModelRequest {
            model: "m".into(),
            messages: vec![
                Message::System { content: "sys".into() },
                Message::User { content: "hi".into() },
            ],
            tools: vec![],
            max_output_tokens: 10,
        }
    }

    #[test]
    fn the_redacted_request_is_the_wire_request_without_the_key() {
        let p = provider("kind: openai\nbase_url: http://127.0.0.1:9/v1/\n");
        let shown = p.redacted_request(&request()).unwrap();
        assert_eq!(shown.url, "http://127.0.0.1:9/v1/chat/completions");
        assert_eq!(shown.headers, vec![("authorization", "Bearer [REDACTED]".to_string())]);
        assert_eq!(shown.body, openai::request_body(&request()));
        let Backend::OpenAi(o) = &p.backend else { unreachable!() };
        let sent = o.wire(&request(), Some(KEY));
        assert_eq!(
            (sent.url, sent.body),
            (shown.url, shown.body),
            "the same code builds both"
        );
        assert_eq!(sent.headers[0].1, format!("Bearer {KEY}"));

        let p = provider("kind: anthropic\nbase_url: http://127.0.0.1:9\n");
        let shown = p.redacted_request(&request()).unwrap();
        assert_eq!(shown.url, "http://127.0.0.1:9/v1/messages");
        assert!(shown.headers.contains(&("x-api-key", REDACTED.to_string())));
        assert_eq!(shown.body["system"], "sys");
        assert!(!format!("{shown:?}").contains(KEY));
    }
}
