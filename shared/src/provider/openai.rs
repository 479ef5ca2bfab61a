//! OpenAI Chat Completions wire format (`/chat/completions`): `tools`, `tool_calls`,
//! `tool` messages and `usage`. Any compatible server (llama.cpp server, vLLM,
//! Ollama) works through `base_url`.

use super::{http, Message, ModelRequest, ModelResponse, ProviderError, RetryPolicy, ToolCall, WireRequest};
use crate::progress::ProgressSink;
use crate::records::Tokens;
use crate::settings::ProviderSettings;
use serde_json::{json, Value};

pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";

pub struct OpenAi {
    client: reqwest::Client,
    /// The base URL, without a trailing slash.
    base: String,
    url: String,
    key: Option<String>,
    retry: RetryPolicy,
}

impl OpenAi {
    pub fn new(s: &ProviderSettings, key: Option<String>, retry: RetryPolicy) -> Result<Self, ProviderError> {
        let base = s.base_url.as_deref().unwrap_or(DEFAULT_BASE_URL).trim_end_matches('/');
        Ok(OpenAi {
            client: http::client()?,
            base: base.to_string(),
            url: format!("{base}/chat/completions"),
            key,
            retry,
        })
    }

    pub async fn complete(
        &self,
        req: &ModelRequest,
        progress: &dyn ProgressSink,
    ) -> Result<ModelResponse, ProviderError> {
        let wire = self.wire(req, self.key.as_deref());
        http::exchange(&self.client, &wire, &self.retry, parse_response, progress).await
    }

    /// The HTTP request for `req`, authorised with `key`: the one place it is built,
    /// for the call and for a dry run (which passes a redacted key).
    pub fn wire(&self, req: &ModelRequest, key: Option<&str>) -> WireRequest {
        let mut headers = Vec::new();
        if let Some(k) = key {
            headers.push(("authorization", format!("Bearer {k}")));
        }
        WireRequest {
            url: self.url.clone(),
            headers,
            body: request_body(req),
        }
    }

    /// The base URL requests go under (`.../v1`).
    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn has_key(&self) -> bool {
        self.key.is_some()
    }

    /// The context window a local OpenAI-compatible server reports about itself:
    /// llama.cpp's `GET /props` (`default_generation_settings.n_ctx`, the context it
    /// actually runs with), else vLLM's `GET <base>/models` (`max_model_len`). Asked only
    /// of servers on this machine (a loopback host), within `timeout`; `None` when the
    /// server does not say.
    pub async fn served_context(&self, timeout: std::time::Duration) -> Option<u64> {
        let url = reqwest::Url::parse(&self.base).ok()?;
        let host = url.host_str()?;
        let loopback = host == "localhost"
            || host
                .trim_matches(['[', ']'])
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            return None;
        }
        let origin = url.origin().ascii_serialization();
        let get = |u: String| async move {
            let resp = self.client.get(u).timeout(timeout).send().await.ok()?;
            if !resp.status().is_success() {
                return None;
            }
            // A few KB of facts: a server that sends more is not one to learn from.
            let body = super::http::read_capped(resp, 1 << 20).await.ok()?;
            serde_json::from_slice::<Value>(&body).ok()
        };
        if let Some(props) = get(format!("{origin}/props")).await {
            let n = props["default_generation_settings"]["n_ctx"]
                .as_u64()
                .or_else(|| props["n_ctx"].as_u64());
            if let Some(n) = n.filter(|n| *n > 0) {
                return Some(n);
            }
        }
        let models = get(format!("{}/models", self.base)).await?;
        models["data"]
            .as_array()?
            .iter()
            .find_map(|m| m["max_model_len"].as_u64().filter(|n| *n > 0))
    }
}

pub fn request_body(req: &ModelRequest) -> Value {
    let messages: Vec<Value> = req
        .messages
        .iter()
        .map(|m| match m {
            Message::System { content } => json!({"role": "system", "content": content}),
            Message::User { content } => json!({"role": "user", "content": content}),
            Message::Assistant { content, tool_calls } => {
                let mut v = json!({"role": "assistant", "content": content});
                if !tool_calls.is_empty() {
                    v["tool_calls"] = tool_calls.iter().map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})).collect();
                }
                v
            }
            Message::Tool { call_id, content, .. } => json!({"role": "tool", "tool_call_id": call_id, "content": content}),
        })
        .collect();
    let mut body = json!({"model": req.model, "messages": messages, "max_tokens": req.max_output_tokens});
    if !req.tools.is_empty() {
        body["tools"] = req.tools.iter().map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.schema}})).collect();
    }
    body
}

pub fn parse_response(v: &Value) -> Result<ModelResponse, String> {
    let msg = v
        .pointer("/choices/0/message")
        .ok_or("no choices[0].message in the response")?;
    let content = msg
        .get("content")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    let mut tool_calls = Vec::new();
    if let Some(calls) = msg.get("tool_calls").and_then(Value::as_array) {
        for (i, c) in calls.iter().enumerate() {
            let f = c.get("function").ok_or(format!("tool_calls[{i}] has no function"))?;
            let name = f
                .get("name")
                .and_then(Value::as_str)
                .ok_or(format!("tool_calls[{i}].function has no name"))?;
            // Arguments are a JSON string on the wire; some servers send an object.
            let arguments = match f.get("arguments") {
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
                None => String::new(),
            };
            let id = c
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| format!("call_{i}"));
            tool_calls.push(ToolCall {
                id,
                name: name.to_string(),
                arguments,
            });
        }
    }
    let usage = Tokens {
        input: v.pointer("/usage/prompt_tokens").and_then(Value::as_u64).unwrap_or(0),
        output: v
            .pointer("/usage/completion_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0),
    };
    Ok(ModelResponse::parsed(content, tool_calls, usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tool_calls_and_usage() {
        let v = json!({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a\"}"}}]}}], "usage": {"prompt_tokens": 12, "completion_tokens": 3}});
        let r = parse_response(&v).unwrap();
        assert_eq!(r.tool_calls[0].arguments, "{\"path\":\"a\"}");
        assert_eq!(r.usage, Tokens { input: 12, output: 3 });
        assert!(r.content.is_none());
        assert!(parse_response(&json!({"error": "x"})).is_err());
    }
}
