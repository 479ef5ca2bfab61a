//! OpenTelemetry export: where a fire's trace goes, and sending it there. The
//! endpoint comes from `OTEL_EXPORTER_OTLP_ENDPOINT` in the fire's environment (the
//! standard OpenTelemetry variable) or the settings' `telemetry.endpoint`; at the end
//! of a fire the trace is POSTed once to `{endpoint}/v1/traces` as an OTLP/HTTP
//! protobuf body built from the official generated types ([`crate::trace::otlp_request`]).
//! An export is best effort: a short timeout, and a failure is the caller's warning,
//! never the fire's failure. The endpoint's port is one the runtime's own sandbox
//! lets it connect to ([`Exporter::port`]).

use crate::settings::{check_endpoint, Telemetry};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use std::time::Duration;

/// The OTLP base endpoint, as every OpenTelemetry SDK reads it; overrides the settings.
pub const ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The traces-only endpoint, used as given (nothing appended); overrides both others.
pub const TRACES_ENDPOINT_ENV: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// The longest an export may hold up the end of a fire.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(2);

/// Where and what one fire exports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exporter {
    /// The URL the trace is POSTed to (`…/v1/traces`).
    pub url: String,
    /// Send message and tool content too (settings `telemetry.include_content`).
    pub include_content: bool,
}

/// Why an export did not arrive.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("`{var}` is `{value}`, which {why}; no trace is exported")]
    BadEndpoint {
        var: &'static str,
        value: String,
        why: &'static str,
    },
    #[error("exporting the trace to {url} failed: {message}")]
    Send { url: String, message: String },
    #[error("{url} refused the trace: HTTP {status}")]
    Refused { url: String, status: u16 },
}

impl Exporter {
    /// The exporter the settings and the environment ask for (`var` reads a variable),
    /// `Ok(None)` when neither names an endpoint. A variable wins over the settings,
    /// as in every OpenTelemetry SDK; an unusable one is an error, not a fallback.
    pub fn resolve(
        settings: &Telemetry,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Exporter>, ExportError> {
        let set = |name: &'static str| var(name).filter(|v| !v.trim().is_empty()).map(|v| (name, v));
        let url = if let Some((name, traces)) = set(TRACES_ENDPOINT_ENV) {
            checked(name, &traces)?;
            traces
        } else if let Some((name, base)) = set(ENDPOINT_ENV) {
            checked(name, &base)?;
            traces_url(&base)
        } else {
            match &settings.endpoint {
                // The settings' endpoint was checked when they loaded.
                Some(base) => traces_url(base),
                None => return Ok(None),
            }
        };
        Ok(Some(Exporter {
            url,
            include_content: settings.include_content,
        }))
    }

    /// [`Exporter::resolve`] with this process's environment.
    pub fn from_env(settings: &Telemetry) -> Result<Option<Exporter>, ExportError> {
        Exporter::resolve(settings, |name| std::env::var(name).ok())
    }

    /// The TCP port the export connects to, for the runtime's sandbox.
    pub fn port(&self) -> Option<u16> {
        reqwest::Url::parse(&self.url).ok()?.port_or_known_default()
    }

    /// POSTs `request` as protobuf and waits at most [`EXPORT_TIMEOUT`] for the answer.
    /// Runs on a thread of its own, so it works inside or outside an async runtime.
    pub fn export(&self, request: &ExportTraceServiceRequest) -> Result<(), ExportError> {
        let body = request.encode_to_vec();
        let url = self.url.clone();
        let sender = std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || post(url, body))
            .map_err(|e| ExportError::Send {
                url: self.url.clone(),
                message: format!("cannot start the export thread: {e}"),
            })?;
        sender.join().unwrap_or_else(|_| {
            Err(ExportError::Send {
                url: self.url.clone(),
                message: "the export thread panicked".into(),
            })
        })
    }
}

/// One POST on a current-thread runtime of its own.
fn post(url: String, body: Vec<u8>) -> Result<(), ExportError> {
    let failed = |message: String| ExportError::Send {
        url: url.clone(),
        message,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| failed(e.to_string()))?;
    rt.block_on(async {
        let client = reqwest::Client::builder()
            .timeout(EXPORT_TIMEOUT)
            .connect_timeout(EXPORT_TIMEOUT)
            .user_agent(concat!("agent-runtime/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| failed(e.to_string()))?;
        let resp = client
            .post(&url)
            .header(reqwest::header::CONTENT_TYPE, "application/x-protobuf")
            .body(body)
            .send()
            .await
            .map_err(|e| failed(error_chain(&e)))?;
        if resp.status().is_success() {
            Ok(())
        } else {
            Err(ExportError::Refused {
                url: url.clone(),
                status: resp.status().as_u16(),
            })
        }
    })
}

/// An error with its sources: reqwest's own message rarely says why.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn checked(var: &'static str, value: &str) -> Result<(), ExportError> {
    check_endpoint(value).map_err(|why| ExportError::BadEndpoint {
        var,
        value: value.to_string(),
        why,
    })
}

/// `{base}/v1/traces`, the OTLP/HTTP signal path under a base endpoint.
fn traces_url(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
    }

    #[test]
    fn the_environment_wins_over_settings_and_the_signal_path_is_appended() {
        let settings = Telemetry {
            endpoint: Some("http://collector:4318/".into()),
            include_content: true,
        };
        let from_settings = Exporter::resolve(&settings, env(&[])).unwrap().unwrap();
        assert_eq!(from_settings.url, "http://collector:4318/v1/traces");
        assert!(from_settings.include_content);
        assert_eq!(from_settings.port(), Some(4318));
        let from_env = Exporter::resolve(&settings, env(&[(ENDPOINT_ENV, "https://otel.example")]))
            .unwrap()
            .unwrap();
        assert_eq!(from_env.url, "https://otel.example/v1/traces");
        assert_eq!(from_env.port(), Some(443));
        let traces = Exporter::resolve(
            &settings,
            env(&[(ENDPOINT_ENV, "http://a:1"), (TRACES_ENDPOINT_ENV, "http://b:2/custom")]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(traces.url, "http://b:2/custom");
    }

    #[test]
    fn no_endpoint_is_no_exporter_and_a_bad_variable_is_an_error() {
        assert_eq!(Exporter::resolve(&Telemetry::default(), env(&[])).unwrap(), None);
        assert_eq!(
            Exporter::resolve(&Telemetry::default(), env(&[(ENDPOINT_ENV, " ")])).unwrap(),
            None
        );
        let bad = Exporter::resolve(&Telemetry::default(), env(&[(ENDPOINT_ENV, "collector:4318")]));
        assert!(matches!(bad, Err(ExportError::BadEndpoint { .. })), "{bad:?}");
    }

    #[test]
    fn a_closed_port_fails_within_the_timeout() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap();
        let exporter = Exporter {
            url: format!("http://127.0.0.1:{port}/v1/traces"),
            include_content: false,
        };
        let t = std::time::Instant::now();
        let sent = exporter.export(&ExportTraceServiceRequest::default());
        assert!(matches!(sent, Err(ExportError::Send { .. })), "{sent:?}");
        assert!(t.elapsed() < EXPORT_TIMEOUT + Duration::from_millis(500));
    }
}
