//! OpenTelemetry end to end: a fire against the scripted model server exports its
//! trace over OTLP/HTTP to a receiver on 127.0.0.1, which decodes the protobuf body
//! with opentelemetry-proto's own types. One root span, every other span under it,
//! the GenAI attribute names, no content unless the settings opt in; `runtime show
//! --otlp` names the same trace and spans; a dead or silent collector changes neither
//! the exit code nor the fire's time by more than the export timeout.

use crate::util::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, KeyValue};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The runtime's export timeout (`shared::telemetry::EXPORT_TIMEOUT`).
const EXPORT_TIMEOUT: Duration = shared::telemetry::EXPORT_TIMEOUT;

/// Attributes that carry message or tool content.
const CONTENT: &[&str] = &[
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
];

/// A task with a prefetch, a tool call and an acceptance check: every kind of span.
const TRACED_PROMPT: &str = "---\ndescription: traced task\nprefetch:\n  - name: recent activity\n    run: tools/digest-context.sh\nacceptance:\n  - name: says done\n    report_contains: \"Done\"\n---\nDo the traced task.\n";

/// One POST the receiver got.
struct Received {
    path: String,
    content_type: String,
    body: Vec<u8>,
}

/// An OTLP/HTTP receiver on 127.0.0.1 that keeps every request and answers 200.
struct Receiver {
    port: u16,
    got: Arc<Mutex<Vec<Received>>>,
    server: Arc<tiny_http::Server>,
}

impl Receiver {
    fn start() -> Receiver {
        let server = Arc::new(tiny_http::Server::http("127.0.0.1:0").expect("bind 127.0.0.1"));
        let port = server.server_addr().to_ip().unwrap().port();
        let got = Arc::new(Mutex::new(Vec::new()));
        let (srv, got2) = (server.clone(), got.clone());
        std::thread::spawn(move || {
            for mut req in srv.incoming_requests() {
                let mut body = Vec::new();
                let _ = req.as_reader().read_to_end(&mut body);
                let content_type = req
                    .headers()
                    .iter()
                    .find(|h| h.field.equiv("content-type"))
                    .map(|h| h.value.to_string())
                    .unwrap_or_default();
                got2.lock().unwrap().push(Received {
                    path: req.url().to_string(),
                    content_type,
                    body,
                });
                let _ = req.respond(tiny_http::Response::empty(200));
            }
        });
        Receiver { port, got, server }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The one export received, decoded.
    fn export(&self) -> (ExportTraceServiceRequest, Vec<u8>) {
        let got = self.got.lock().unwrap();
        assert_eq!(got.len(), 1, "one export per fire");
        let r = &got[0];
        assert_eq!(r.path, "/v1/traces");
        assert_eq!(r.content_type, "application/x-protobuf");
        let req = ExportTraceServiceRequest::decode(r.body.as_slice()).expect("an OTLP protobuf body");
        (req, r.body.clone())
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.server.unblock();
    }
}

/// The model's script: one tool call, then a final answer.
fn script() -> Vec<Reply> {
    let w = Wire::OpenAi;
    vec![
        turn(
            w,
            None,
            &[("c1", "run_command", "{\"command\":\"echo tool-output-marker\"}")],
            (10, 5),
        ),
        turn(w, Some("Done: final-answer-marker"), &[], (20, 7)),
    ]
}

/// A committed repo whose task `t` (the traced prompt) talks to `server`.
fn traced_env(server: &ModelServer, extra: &str) -> TestEnv {
    let env = TestEnv::new();
    env.write(
        "settings/runtime.yaml",
        &settings_yaml(&server.provider_yaml(Wire::OpenAi), extra),
    );
    env.write("prompts/t.md", TRACED_PROMPT);
    env.commit_all("traced task");
    env
}

/// `runtime fire t --json` with `OTEL_EXPORTER_OTLP_ENDPOINT` set when `endpoint`
/// is: (exit code, summary, stderr, how long it took).
fn fire(env: &TestEnv, endpoint: Option<&str>) -> (i32, Value, String, Duration) {
    let mut cmd = env.command("runtime", &["fire", "t", "--json"]);
    if let Some(e) = endpoint {
        cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", e);
    }
    let t = Instant::now();
    let out = cmd.output().expect("run runtime");
    let took = t.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let summary = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("fire printed no JSON ({e}):\nstdout: {stdout}\nstderr: {stderr}"));
    (out.status.code().unwrap_or(-1), summary, stderr, took)
}

fn attr<'a>(attrs: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attrs
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref()?.value.as_ref())
}

fn string(attrs: &[KeyValue], key: &str) -> Option<String> {
    match attr(attrs, key) {
        Some(any_value::Value::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

fn spans(req: &ExportTraceServiceRequest) -> Vec<Span> {
    assert_eq!(req.resource_spans.len(), 1, "one resource: this fire");
    let rs = &req.resource_spans[0];
    assert_eq!(rs.scope_spans.len(), 1);
    rs.scope_spans[0].spans.clone()
}

/// The kind of each span, told by its GenAI operation or its name.
fn of_kind<'a>(spans: &'a [Span], prefix: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name.starts_with(prefix)).collect()
}

#[test]
fn a_fire_exports_one_rooted_trace_with_genai_names_and_no_content() {
    let receiver = Receiver::start();
    let server = ModelServer::start(script());
    let env = traced_env(&server, "");
    let (code, summary, stderr, _) = fire(&env, Some(&receiver.endpoint()));
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(summary["status"], "accepted");
    let run_id = summary["run_id"].as_str().unwrap().to_string();
    let (req, body) = receiver.export();

    let resource = req.resource_spans[0].resource.as_ref().expect("a resource");
    assert_eq!(string(&resource.attributes, "service.name").as_deref(), Some("runtime"));
    assert!(string(&resource.attributes, "service.version").is_some_and(|v| !v.is_empty()));
    assert_eq!(
        string(&resource.attributes, "agent.run_id").as_deref(),
        Some(run_id.as_str())
    );
    assert_eq!(string(&resource.attributes, "agent.task").as_deref(), Some("t"));

    let spans = spans(&req);
    let roots: Vec<&Span> = spans.iter().filter(|s| s.parent_span_id.is_empty()).collect();
    assert_eq!(roots.len(), 1, "exactly one root span");
    let root = roots[0];
    assert_eq!(root.name, "fire t");
    assert_eq!(root.trace_id.len(), 16);
    assert!(root.trace_id.iter().any(|b| *b != 0));
    let ids: Vec<&Vec<u8>> = spans.iter().map(|s| &s.span_id).collect();
    for s in &spans {
        assert_eq!(s.trace_id, root.trace_id, "{} is in the fire's trace", s.name);
        assert_eq!(s.span_id.len(), 8);
        if !s.parent_span_id.is_empty() {
            assert!(
                ids.contains(&&s.parent_span_id),
                "{}'s parent is a span of the trace",
                s.name
            );
            assert_eq!(s.parent_span_id, root.span_id, "{} hangs under the root", s.name);
        }
        assert!(s.start_time_unix_nano >= root.start_time_unix_nano, "{}", s.name);
        assert!(s.end_time_unix_nano <= root.end_time_unix_nano, "{}", s.name);
    }
    let mut sorted = ids.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), ids.len(), "span ids are unique");

    assert_eq!(of_kind(&spans, "prefetch ").len(), 1);
    assert_eq!(of_kind(&spans, "acceptance ").len(), 1);
    let models = of_kind(&spans, "chat ");
    assert_eq!(models.len(), 2, "two model calls");
    for m in &models {
        assert_eq!(string(&m.attributes, "gen_ai.operation.name").as_deref(), Some("chat"));
        assert_eq!(
            string(&m.attributes, "gen_ai.request.model").as_deref(),
            Some("test-model")
        );
        assert!(attr(&m.attributes, "gen_ai.usage.input_tokens").is_some());
        assert!(attr(&m.attributes, "gen_ai.usage.output_tokens").is_some());
    }
    let input: Vec<_> = models
        .iter()
        .map(|m| attr(&m.attributes, "gen_ai.usage.input_tokens").cloned())
        .collect();
    assert_eq!(
        input,
        vec![
            Some(any_value::Value::IntValue(10)),
            Some(any_value::Value::IntValue(20))
        ]
    );
    let tools = of_kind(&spans, "execute_tool ");
    assert_eq!(tools.len(), 1);
    assert_eq!(
        string(&tools[0].attributes, "gen_ai.operation.name").as_deref(),
        Some("execute_tool")
    );
    assert_eq!(
        string(&tools[0].attributes, "gen_ai.tool.name").as_deref(),
        Some("run_command")
    );
    assert_eq!(
        string(&tools[0].attributes, "gen_ai.tool.call.id").as_deref(),
        Some("c1")
    );

    for s in &spans {
        for key in CONTENT {
            assert!(
                attr(&s.attributes, key).is_none(),
                "{} carries {key} by default",
                s.name
            );
        }
    }
    let raw = String::from_utf8_lossy(&body);
    assert!(
        !raw.contains("tool-output-marker"),
        "the tool's command and output stay home"
    );
    assert!(!raw.contains("final-answer-marker"), "the model's answer stays home");
    assert!(!raw.contains(TEST_KEY));

    // `runtime show --otlp` is the same mapping of the same stored spans.
    let shown = env.runtime(&["show", &run_id, "--otlp"]);
    assert!(shown.status.success(), "{}", String::from_utf8_lossy(&shown.stderr));
    let o: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let json_spans = o["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().unwrap();
    let mut exported: Vec<(String, String, String)> = spans
        .iter()
        .map(|s| (hex(&s.trace_id), hex(&s.span_id), hex(&s.parent_span_id)))
        .collect();
    let mut stored: Vec<(String, String, String)> = json_spans
        .iter()
        .map(|s| {
            (
                s["traceId"].as_str().unwrap_or("").to_string(),
                s["spanId"].as_str().unwrap_or("").to_string(),
                s["parentSpanId"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect();
    exported.sort();
    stored.sort();
    assert_eq!(
        exported, stored,
        "the export and `show --otlp` name the same trace and spans"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn content_is_exported_only_when_the_settings_opt_in() {
    let receiver = Receiver::start();
    let server = ModelServer::start(script());
    let env = traced_env(&server, "telemetry:\n  include_content: true\n");
    let (code, _, stderr, _) = fire(&env, Some(&receiver.endpoint()));
    assert_eq!(code, 0, "{stderr}");
    let (req, body) = receiver.export();
    let spans = spans(&req);
    let tool = of_kind(&spans, "execute_tool ")[0];
    assert!(string(&tool.attributes, "gen_ai.tool.call.result").is_some_and(|r| r.contains("tool-output-marker")));
    assert!(string(&tool.attributes, "gen_ai.tool.call.arguments").is_some_and(|a| a.contains("echo")));
    let models = of_kind(&spans, "chat ");
    let input = string(&models[0].attributes, "gen_ai.input.messages").expect("the prompt");
    let messages: Value = serde_json::from_str(&input).expect("messages as JSON");
    assert_eq!(messages[0]["role"], "system");
    assert_eq!(messages[1]["role"], "user");
    let output = string(&models[1].attributes, "gen_ai.output.messages").expect("the answer");
    assert!(output.contains("final-answer-marker"), "{output}");
    assert!(
        !String::from_utf8_lossy(&body).contains(TEST_KEY),
        "content is redacted"
    );
}

#[test]
fn the_settings_endpoint_exports_without_the_variable() {
    let receiver = Receiver::start();
    let server = ModelServer::start(script());
    let env = traced_env(&server, &format!("telemetry:\n  endpoint: {}\n", receiver.endpoint()));
    let (code, _, stderr, _) = fire(&env, None);
    assert_eq!(code, 0, "{stderr}");
    let (req, _) = receiver.export();
    assert_eq!(spans(&req).iter().filter(|s| s.parent_span_id.is_empty()).count(), 1);
}

#[test]
fn a_dead_or_silent_collector_changes_neither_the_exit_code_nor_the_time_beyond_the_timeout() {
    // A closed port: the connection is refused at once.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap();
    // A silent one: the kernel accepts the connection, nobody ever answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();

    let baseline = {
        let server = ModelServer::start(script());
        let env = traced_env(&server, "");
        let (code, summary, stderr, took) = fire(&env, None);
        assert_eq!(code, 0, "{stderr}");
        assert_eq!(summary["status"], "accepted");
        took
    };
    for port in [closed, silent_port] {
        let server = ModelServer::start(script());
        let env = traced_env(&server, "");
        let endpoint = format!("http://127.0.0.1:{port}");
        let (code, summary, stderr, took) = fire(&env, Some(&endpoint));
        assert_eq!(code, 0, "port {port}: {stderr}");
        assert_eq!(summary["status"], "accepted");
        assert!(summary["commit"].is_string(), "the records are committed");
        assert_eq!(env.receipt(&summary)["status"], "accepted");
        // A hang would take far longer; two fires of one machine under the suite's
        // load differ by seconds, so the bound is generous.
        assert!(
            took < baseline * 3 + EXPORT_TIMEOUT + Duration::from_secs(10),
            "port {port}: {took:?} against {baseline:?} without an endpoint"
        );
        assert!(stderr.contains("the trace was not exported"), "port {port}: {stderr}");
    }
    drop(silent);
}

#[test]
fn a_refused_fire_exports_its_root_span_as_an_error() {
    let receiver = Receiver::start();
    let server = ModelServer::start(script());
    let env = traced_env(&server, "");
    env.write("prompts/t.md", "---\n---\nchanged but not committed\n");
    let (code, summary, stderr, _) = fire(&env, Some(&receiver.endpoint()));
    assert_eq!(code, 1, "{stderr}");
    assert_eq!(env.card_kinds(&summary), vec!["unreviewed_changes"]);
    let (req, _) = receiver.export();
    let spans = spans(&req);
    assert_eq!(spans.len(), 1, "a refusal has only its root span");
    assert!(spans[0].parent_span_id.is_empty());
    let status = spans[0].status.as_ref().expect("a status");
    assert_eq!(
        status.code,
        opentelemetry_proto::tonic::trace::v1::status::StatusCode::Error as i32
    );
    assert_eq!(string(&spans[0].attributes, "agent.status").as_deref(), Some("failed"));
    assert!(server.requests().is_empty(), "no model call");
}
