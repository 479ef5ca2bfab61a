//! Anthropic Messages wire format (`/v1/messages`): `tool_use` and `tool_result`
//! content blocks, a top-level `system`, and `usage`.

use super::{http, Message, ModelRequest, ModelResponse, ProviderError, RetryPolicy, ToolCall, WireRequest};
use crate::progress::ProgressSink;
use crate::records::Tokens;
use crate::settings::ProviderSettings;
use serde_json::{json, Value};

pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
pub const API_VERSION: &str = "2023-06-01";

pub struct Anthropic {
    client: reqwest::Client,
    url: String,
    key: Option<String>,
    retry: RetryPolicy,
}

impl Anthropic {
    pub fn new(s: &ProviderSettings, key: Option<String>, retry: RetryPolicy) -> Result<Self, ProviderError> {
        let base = s.base_url.as_deref().unwrap_or(DEFAULT_BASE_URL).trim_end_matches('/');
        let url = if base.ends_with("/v1") {
            format!("{base}/messages")
        } else {
            format!("{base}/v1/messages")
        };
        Ok(Anthropic {
            client: http::client()?,
            url,
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
        let mut headers = vec![("anthropic-version", API_VERSION.to_string())];
        if let Some(k) = key {
            headers.push(("x-api-key", k.to_string()));
        }
        WireRequest {
            url: self.url.clone(),
            headers,
            body: request_body(req),
        }
    }

    pub fn has_key(&self) -> bool {
        self.key.is_some()
    }
}

pub fn request_body(req: &ModelRequest) -> Value {
    let mut system = Vec::new();
    let mut messages: Vec<Value> = Vec::new();
    for m in &req.messages {
        match m {
            Message::System { content } => system.push(content.clone()),
            Message::User { content } => messages.push(json!({"role": "user", "content": content})),
            Message::Assistant { content, tool_calls } => {
                let mut blocks = Vec::new();
                if let Some(c) = content {
                    blocks.push(json!({"type": "text", "text": c}));
                }
                for c in tool_calls {
                    // The wire wants an object; invalid model JSON is sent as a string field.
                    let input = serde_json::from_str::<Value>(&c.arguments)
                        .ok()
                        .filter(Value::is_object)
                        .unwrap_or_else(|| json!({"_raw": c.arguments}));
                    blocks.push(json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input}));
                }
                messages.push(json!({"role": "assistant", "content": blocks}));
            }
            Message::Tool {
                call_id,
                content,
                is_error,
                ..
            } => {
                let block =
                    json!({"type": "tool_result", "tool_use_id": call_id, "content": content, "is_error": is_error});
                // Results of one turn's calls travel together in one user message.
                match messages.last_mut() {
                    Some(last)
                        if last["role"] == "user"
                            && last["content"]
                                .as_array()
                                .is_some_and(|a| a.iter().all(|b| b["type"] == "tool_result")) =>
                    {
                        if let Some(a) = last["content"].as_array_mut() {
                            a.push(block);
                        }
                    }
                    _ => messages.push(json!({"role": "user", "content": [block]})),
                }
            }
        }
    }
    let mut body = json!({"model": req.model, "max_tokens": req.max_output_tokens, "messages": messages});
    if !system.is_empty() {
        body["system"] = Value::String(system.join("\n\n"));
    }
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.schema}))
            .collect();
    }
    body
}

pub fn parse_response(v: &Value) -> Result<ModelResponse, String> {
    let blocks = v
        .get("content")
        .and_then(Value::as_array)
        .ok_or("no content blocks in the response")?;
    let mut text = String::new();
    let mut tool_calls = Vec::new();
    for (i, b) in blocks.iter().enumerate() {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => {
                let name = b
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or(format!("content[{i}] tool_use has no name"))?;
                let id = b
                    .get("id")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .unwrap_or_else(|| format!("toolu_{i}"));
                let arguments = b.get("input").map(Value::to_string).unwrap_or_else(|| "{}".into());
                tool_calls.push(ToolCall {
                    id,
                    name: name.to_string(),
                    arguments,
                });
            }
            _ => {}
        }
    }
    let usage = Tokens {
        input: v.pointer("/usage/input_tokens").and_then(Value::as_u64).unwrap_or(0),
        output: v.pointer("/usage/output_tokens").and_then(Value::as_u64).unwrap_or(0),
    };
    Ok(ModelResponse::parsed(
        (!text.is_empty()).then_some(text),
        tool_calls,
        usage,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::ToolDef;

    #[test]
    fn groups_tool_results_and_lifts_system() {
        let req = ModelRequest {
            model: "m".into(),
            messages: vec![
                Message::System { content: "sys".into() },
                Message::User { content: "hi".into() },
                Message::Assistant {
                    content: None,
                    tool_calls: vec![
                        ToolCall {
                            id: "a".into(),
                            name: "read_file".into(),
                            arguments: "{\"path\":\"x\"}".into(),
                        },
                        ToolCall {
                            id: "b".into(),
                            name: "list_dir".into(),
                            arguments: "{}".into(),
                        },
                    ],
                },
                Message::Tool {
                    call_id: "a".into(),
                    name: "read_file".into(),
                    content: "1".into(),
                    is_error: false,
                },
                Message::Tool {
                    call_id: "b".into(),
                    name: "list_dir".into(),
                    content: "2".into(),
                    is_error: true,
                },
            ],
            tools: vec![ToolDef {
                name: "read_file".into(),
                description: "d".into(),
                schema: json!({"type": "object"}),
            }],
            max_output_tokens: 100,
        };
        let b = request_body(&req);
        assert_eq!(b["system"], "sys");
        assert_eq!(b["messages"].as_array().unwrap().len(), 3);
        assert_eq!(b["messages"][2]["content"].as_array().unwrap().len(), 2);
        assert_eq!(b["messages"][1]["content"][0]["input"]["path"], "x");
        assert_eq!(b["tools"][0]["input_schema"]["type"], "object");
    }
}
