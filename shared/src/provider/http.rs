//! The shared HTTP call with retries: exponential backoff with full jitter on 429, 5xx,
//! connection errors and timeouts; `retry-after` (seconds or an HTTP date) honoured;
//! other 4xx never retried. Error bodies are shortened and never carry the key.

use super::{ProviderError, ProviderErrorKind, RetryPolicy, WireRequest};
use crate::progress::{Event, ProgressSink};
use std::time::Duration;

/// POSTs `wire`, retrying per `policy` (each retry reported to `progress` with its
/// wait); returns the JSON body and the number of retries taken.
pub async fn post_json(
    client: &reqwest::Client,
    wire: &WireRequest,
    policy: &RetryPolicy,
    progress: &dyn ProgressSink,
) -> Result<(serde_json::Value, u32), ProviderError> {
    let mut attempt: u32 = 0;
    loop {
        let mut req = client.post(&wire.url).timeout(policy.request_timeout).json(&wire.body);
        for (k, v) in &wire.headers {
            req = req.header(*k, v);
        }
        let outcome = req.send().await;
        let (err, retry_after) = match outcome {
            Ok(resp) => {
                let status = resp.status();
                let retry_after = parse_retry_after(resp.headers().get(reqwest::header::RETRY_AFTER));
                if status.is_success() {
                    let json = read_json(resp, policy).await.map_err(|e| with_retries(e, attempt))?;
                    return Ok((json, attempt));
                }
                (error_response(resp, policy).await, retry_after)
            }
            Err(e) => {
                let mut err = classify(e);
                if err.kind == ProviderErrorKind::Timeout {
                    err.timeout_s = Some(policy.request_timeout.as_secs());
                }
                (err, None)
            }
        };
        let retryable = matches!(
            err.kind,
            ProviderErrorKind::RateLimited
                | ProviderErrorKind::Server
                | ProviderErrorKind::Timeout
                | ProviderErrorKind::Connect
        );
        if !retryable || attempt >= policy.max_retries {
            return Err(with_retries(err, attempt));
        }
        let delay = retry_after
            .map(|d| d.min(Duration::from_secs(120)))
            .unwrap_or_else(|| backoff(policy, attempt));
        tracing::info!(attempt = attempt + 1, delay_ms = delay.as_millis() as u64, error = %err.message, status = err.status, "retrying model call");
        progress.event(&Event::Retry {
            attempt: attempt + 1,
            max_retries: policy.max_retries,
            wait: delay,
            reason: retry_reason(&err),
        });
        tokio::time::sleep(delay).await;
        attempt += 1;
    }
}

/// A successful response's body, read up to the cap and parsed as JSON.
async fn read_json(resp: reqwest::Response, policy: &RetryPolicy) -> Result<serde_json::Value, ProviderError> {
    let status = resp.status();
    let bytes = read_capped(resp, policy.max_body_bytes).await?;
    serde_json::from_slice(&bytes).map_err(|e| {
        ProviderError::new(
            ProviderErrorKind::Decode,
            Some(status.as_u16()),
            format!("response is not JSON: {e}"),
        )
    })
}

/// The error an unsuccessful response stands for, classed by its status (and, for a
/// plain 4xx, by whether its body says the request was too long).
async fn error_response(resp: reqwest::Response, policy: &RetryPolicy) -> ProviderError {
    let status = resp.status();
    // An error body is read for its first words only.
    let text = match read_capped(resp, ERROR_BODY_BYTES.min(policy.max_body_bytes)).await {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e) => e.message,
    };
    // Redacted whole, then cut: a cut first could leave most of a key the body echoes,
    // which the redactor then no longer knows (helper-110).
    let snippet: String = crate::secrets::redact_log_line(&text).chars().take(300).collect();
    let kind = match status.as_u16() {
        429 => ProviderErrorKind::RateLimited,
        401 | 403 => ProviderErrorKind::Auth,
        s if s >= 500 => ProviderErrorKind::Server,
        _ if refused_for_length(&text) => ProviderErrorKind::ContextOverflow,
        _ => ProviderErrorKind::BadRequest,
    };
    ProviderError::new(kind, Some(status.as_u16()), snippet)
}

/// The most bytes of an error response read (its first 300 characters are kept).
const ERROR_BODY_BYTES: u64 = 64 * 1024;

/// Reads a response body chunk by chunk, at most `cap` bytes: one that goes on (a
/// server streaming without end, a body larger than any model answer) is a `Decode`
/// error, never a runtime that fills its memory and dies without a record.
pub(super) async fn read_capped(mut resp: reqwest::Response, cap: u64) -> Result<Vec<u8>, ProviderError> {
    let status = resp.status().as_u16();
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(classify)? {
        if (body.len() + chunk.len()) as u64 > cap {
            return Err(ProviderError::new(
                ProviderErrorKind::Decode,
                Some(status),
                format!("the response body went over limits.provider_response_bytes ({cap} bytes); not read further"),
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Whether an error body says the request did not fit the model's context: OpenAI's
/// `context_length_exceeded`, llama.cpp's `exceed_context_size_error`, vLLM's and
/// Anthropic's "too long" messages.
pub fn refused_for_length(body: &str) -> bool {
    let b = body.to_ascii_lowercase();
    [
        "context_length_exceeded",
        "exceed_context_size",
        "exceeds the available context size",
        "maximum context length",
        "prompt is too long",
        "context window",
    ]
    .iter()
    .any(|m| b.contains(m))
}

/// Why an attempt is retried, in a few words: `HTTP 503`, `timeout`, `connection error`.
fn retry_reason(err: &ProviderError) -> String {
    match (err.status, err.kind) {
        (Some(status), _) => format!("HTTP {status}"),
        (None, ProviderErrorKind::Timeout) => "timeout".into(),
        (None, _) => "connection error".into(),
    }
}

/// One model call: POST with retries, then the wire format's `parse` of the answer.
/// A 200 whose body `parse` rejects is a `Decode` error carrying the retries taken.
pub async fn exchange(
    client: &reqwest::Client,
    wire: &WireRequest,
    policy: &RetryPolicy,
    parse: fn(&serde_json::Value) -> Result<super::ModelResponse, String>,
    progress: &dyn ProgressSink,
) -> Result<super::ModelResponse, ProviderError> {
    let (json, retries) = post_json(client, wire, policy, progress).await?;
    let mut resp =
        parse(&json).map_err(|m| with_retries(ProviderError::new(ProviderErrorKind::Decode, Some(200), m), retries))?;
    resp.retries = retries;
    Ok(resp)
}

fn with_retries(mut e: ProviderError, retries: u32) -> ProviderError {
    e.retries = retries;
    e
}

/// Exponential backoff with full jitter: uniform in [base * 2^n / 2, base * 2^n].
pub fn backoff(policy: &RetryPolicy, attempt: u32) -> Duration {
    let exp = policy
        .base_delay
        .saturating_mul(1u32 << attempt.min(16))
        .min(policy.max_delay);
    let jitter: f64 = 0.5 + rand::random::<f64>() * 0.5;
    exp.mul_f64(jitter)
}

fn classify(e: reqwest::Error) -> ProviderError {
    let kind = if e.is_timeout() {
        ProviderErrorKind::Timeout
    } else if e.is_connect() || e.is_request() {
        ProviderErrorKind::Connect
    } else if e.is_decode() || e.is_body() {
        ProviderErrorKind::Decode
    } else {
        ProviderErrorKind::Connect
    };
    // reqwest's Display includes the URL but never headers, so the key cannot leak.
    ProviderError::new(kind, e.status().map(|s| s.as_u16()), e.to_string())
}

/// `retry-after` as seconds or an HTTP date.
pub fn parse_retry_after(v: Option<&reqwest::header::HeaderValue>) -> Option<Duration> {
    let s = v?.to_str().ok()?.trim();
    if let Ok(secs) = s.parse::<f64>() {
        return (secs >= 0.0 && secs.is_finite()).then(|| Duration::from_secs_f64(secs));
    }
    let at = chrono::DateTime::parse_from_rfc2822(s).ok()?;
    let delta = at.with_timezone(&chrono::Utc) - chrono::Utc::now();
    Some(delta.to_std().unwrap_or(Duration::ZERO))
}

/// A client with sane defaults (no proxy surprises for loopback servers).
pub fn client() -> Result<reqwest::Client, ProviderError> {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("agent-runtime/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| {
            ProviderError::new(
                ProviderErrorKind::Config,
                None,
                format!("cannot build HTTP client: {e}"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_refusals_of_the_common_servers_are_recognised() {
        for body in [
            r#"{"error":{"message":"This model's maximum context length is 8192 tokens","code":"context_length_exceeded"}}"#,
            r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}}"#,
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
        ] {
            assert!(refused_for_length(body), "{body}");
        }
        assert!(!refused_for_length(r#"{"error":{"message":"unknown parameter: foo"}}"#));
    }

    #[test]
    fn retry_after_forms() {
        let h = |s: &str| reqwest::header::HeaderValue::from_str(s).unwrap();
        assert_eq!(parse_retry_after(Some(&h("2"))), Some(Duration::from_secs(2)));
        assert_eq!(parse_retry_after(Some(&h("0.5"))), Some(Duration::from_millis(500)));
        assert_eq!(
            parse_retry_after(Some(&h("Wed, 21 Oct 2015 07:28:00 GMT"))),
            Some(Duration::ZERO)
        );
        assert_eq!(parse_retry_after(Some(&h("soon"))), None);
        assert_eq!(parse_retry_after(None), None);
    }

    #[test]
    fn backoff_grows_with_jitter_and_caps() {
        let p = RetryPolicy {
            max_retries: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_millis(1000),
            request_timeout: Duration::from_secs(1),
            max_body_bytes: 1 << 20,
        };
        for attempt in 0..8 {
            let d = backoff(&p, attempt);
            let ceiling = (100u64 << attempt).min(1000);
            assert!(
                d.as_millis() as u64 <= ceiling && d.as_millis() as u64 >= ceiling / 2,
                "attempt {attempt}: {d:?}"
            );
        }
    }
}
