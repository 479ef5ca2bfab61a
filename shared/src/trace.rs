//! The fire's trace: a root span per fire (kind `fire`) and, under it, spans for each
//! prefetch, model call, tool call and acceptance check (duration, tokens, status),
//! step budget reports and tool-call details, kept in memory during a fire and stored
//! in `.runtime/state.db`. Trace and span ids are random (16 and 8 bytes, as
//! OpenTelemetry wants them) and stored with the trace, so the fire's own OTLP export
//! and a later `runtime show --otlp` name the same spans. Also reads runs back for
//! `runtime runs` / `runtime show`, and holds the one mapping from these spans to
//! OTLP ([`otlp_request`], with OpenTelemetry GenAI attribute names and message content
//! left out unless asked for): protobuf for the export, its JSON form for `show`.

use crate::records::{named, Receipt, RecordedDecision, ToolOutcome};
use crate::runs::RunSummary;
use crate::store::{Store, StoreError};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, ArrayValue, InstrumentationScope, KeyValue};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{
    span::SpanKind as OtlpSpanKind, status::StatusCode, ResourceSpans, ScopeSpans, Status,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::{SystemTime, UNIX_EPOCH};

/// The service name of every exported trace (resource attribute `service.name`).
pub const SERVICE_NAME: &str = "runtime";

/// Span attributes that carry message or tool content: exported only when settings
/// opt in (`telemetry.include_content`), or with `runtime show --otlp --include-content`.
pub const CONTENT_ATTRIBUTES: &[&str] = &[
    "gen_ai.input.messages",
    "gen_ai.output.messages",
    "gen_ai.system_instructions",
    "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result",
];

/// What a span times.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash, strum::IntoStaticStr, strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
#[serde(into = "&'static str", try_from = "String")]
pub enum SpanKind {
    Fire,
    Prefetch,
    Model,
    Tool,
    Acceptance,
    Commit,
}

named!(SpanKind, "span kind");

/// How a span ended (`running` until it does).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash, strum::IntoStaticStr, strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
#[serde(into = "&'static str", try_from = "String")]
pub enum SpanStatus {
    Running,
    Ok,
    Error,
    /// An acceptance check did not pass.
    Failed,
    /// The wall-time budget ran out during the span.
    WallTime,
    Cancelled,
}

named!(SpanStatus, "span status");

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Span {
    /// The OTLP span id (8 random bytes, big-endian); never zero.
    pub id: u64,
    /// The enclosing span: the fire's root span for every span but the root.
    pub parent: Option<u64>,
    pub kind: SpanKind,
    pub name: String,
    pub start_ns: u64,
    pub end_ns: u64,
    pub status: SpanStatus,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub attributes: serde_json::Map<String, Value>,
}

impl Span {
    pub fn duration_ms(&self) -> f64 {
        self.end_ns.saturating_sub(self.start_ns) as f64 / 1e6
    }
}

/// A tool call as stored in the trace (arguments redacted, or marked invalid).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TracedCall {
    pub call_id: String,
    pub step: u32,
    pub name: String,
    /// The parsed arguments, or `{"_invalid": raw}` when they did not parse.
    pub arguments: Value,
    pub args_hash: String,
    pub decision: RecordedDecision,
    pub rule: Option<String>,
    pub reason: String,
    pub outcome: ToolOutcome,
    pub duration_ms: u64,
}

/// How the context of one step was fitted (made by `agent::context::fit`, stored
/// with the step).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BudgetReport {
    pub budget: u64,
    pub used: u64,
    pub included: usize,
    pub summarised: usize,
    pub dropped: usize,
    pub reasons: Vec<String>,
}

/// Collects one fire's trace.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Trace {
    /// The OTLP trace id, 32 hex digits; empty until [`Trace::open_root`] (and for runs
    /// stored before trace ids were, whose id [`Trace::otlp_trace_id`] derives).
    #[serde(default)]
    pub trace_id: String,
    /// The fire's root span, parent of every other span.
    #[serde(default)]
    pub root: Option<u64>,
    pub spans: Vec<Span>,
    pub steps: Vec<(u32, BudgetReport)>,
    pub calls: Vec<TracedCall>,
}

/// Now, in nanoseconds since the epoch, on a clock that never jumps: the wall clock is
/// read once per process and the monotonic clock counts from there, so a span's (and
/// a receipt's) duration is the time that passed even when NTP or an operator moves
/// the wall clock mid-fire.
pub fn now_ns() -> u64 {
    static ANCHOR: std::sync::OnceLock<(u64, std::time::Instant)> = std::sync::OnceLock::new();
    let (wall, since) = ANCHOR.get_or_init(|| {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        (wall, std::time::Instant::now())
    });
    wall.saturating_add(since.elapsed().as_nanos() as u64)
}

/// [`now_ns`] as a timestamp: when a fire starts and ends, so the receipt's two times
/// differ by the time that really passed.
pub fn now_utc() -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp_nanos(now_ns().min(i64::MAX as u64) as i64)
}

impl Trace {
    /// Opens the fire's root span (kind `fire`), started at `start_ns` (when the fire
    /// began), under a fresh random trace id. Close it with [`Trace::end`].
    pub fn open_root(&mut self, name: impl Into<String>, start_ns: u64) -> u64 {
        self.trace_id = loop {
            let id = format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>());
            if id.bytes().any(|b| b != b'0') {
                break id;
            }
        };
        let id = self.push(SpanKind::Fire, name.into(), None, start_ns);
        self.root = Some(id);
        id
    }

    /// Opens a span under the root span (a top-level span when no root is open);
    /// close it with [`Trace::end`].
    pub fn start(&mut self, kind: SpanKind, name: impl Into<String>) -> u64 {
        self.push(kind, name.into(), self.root, now_ns())
    }

    fn push(&mut self, kind: SpanKind, name: String, parent: Option<u64>, start_ns: u64) -> u64 {
        let id = loop {
            let id = rand::random::<u64>();
            if id != 0 && self.spans.iter().all(|s| s.id != id) {
                break id;
            }
        };
        self.spans.push(Span {
            id,
            parent,
            kind,
            name,
            start_ns,
            end_ns: start_ns,
            status: SpanStatus::Running,
            tokens_in: 0,
            tokens_out: 0,
            attributes: Default::default(),
        });
        id
    }

    /// The OTLP trace id as 16 bytes: the stored one, or for a run stored before trace
    /// ids were, one derived from its run id (stable across calls).
    pub fn otlp_trace_id(&self, run_id: &str) -> Vec<u8> {
        match hex::decode(&self.trace_id) {
            Ok(id) if id.len() == 16 => id,
            _ => {
                use sha2::{Digest, Sha256};
                Sha256::digest(run_id.as_bytes())[..16].to_vec()
            }
        }
    }

    pub fn end(&mut self, id: u64, status: SpanStatus) {
        if let Some(s) = self.spans.iter_mut().find(|s| s.id == id) {
            s.end_ns = now_ns();
            s.status = status;
        }
    }

    pub fn span_mut(&mut self, id: u64) -> Option<&mut Span> {
        self.spans.iter_mut().find(|s| s.id == id)
    }

    pub fn attr(&mut self, id: u64, key: &str, value: impl Into<Value>) {
        if let Some(s) = self.span_mut(id) {
            s.attributes.insert(key.into(), value.into());
        }
    }

    /// Stores the run row, spans, steps and calls in the caller's transaction (the
    /// runtime ends the run's live row in the same one).
    pub fn save(
        &self,
        tx: &rusqlite::Transaction,
        receipt: &Receipt,
        receipt_path: &str,
        report_path: &str,
    ) -> rusqlite::Result<()> {
        {
            let r = receipt;
            crate::store::insert_run(tx, r, receipt_path, Some(report_path))?;
            if !self.trace_id.is_empty() {
                tx.execute(
                    "INSERT OR REPLACE INTO traces (run_id, trace_id) VALUES (?1, ?2)",
                    rusqlite::params![r.run_id, self.trace_id],
                )?;
            }
            for s in &self.spans {
                tx.execute(
                    "INSERT OR REPLACE INTO spans (run_id, span_id, parent_id, kind, name, start_ns, end_ns, status, tokens_in, tokens_out, attributes) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                    rusqlite::params![r.run_id, s.id as i64, s.parent.map(|p| p as i64), s.kind, s.name, s.start_ns as i64, s.end_ns as i64, s.status, s.tokens_in as i64, s.tokens_out as i64, Value::Object(s.attributes.clone()).to_string()],
                )?;
            }
            for (step, report) in &self.steps {
                tx.execute(
                    "INSERT OR REPLACE INTO steps (run_id, step, budget_report) VALUES (?1, ?2, ?3)",
                    rusqlite::params![r.run_id, step, serde_json::to_string(report).unwrap_or_default()],
                )?;
            }
            for c in &self.calls {
                tx.execute(
                    "INSERT OR REPLACE INTO tool_calls (run_id, call_id, step, name, arguments, args_hash, decision, rule, reason, outcome, duration_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                    rusqlite::params![r.run_id, c.call_id, c.step, c.name, c.arguments.to_string(), c.args_hash, c.decision, c.rule, c.reason, c.outcome, c.duration_ms as i64],
                )?;
            }
            Ok(())
        }
    }
}

/// The local run list (`runtime runs`): the same `runs` table the builder's history
/// index has, so the same query serves both.
pub fn list_runs(store: &Store, task: Option<&str>, limit: usize) -> Result<Vec<RunSummary>, StoreError> {
    crate::runs::runs(
        store,
        &crate::runs::RunFilter {
            task: task.map(str::to_string),
            limit: Some(limit),
            ..Default::default()
        },
    )
}

/// Loads one run's trace from the store (`None` when unknown). A unique prefix of the
/// run id is enough.
pub fn load_run(store: &Store, run_id: &str) -> Result<Option<(RunSummary, Trace)>, StoreError> {
    let Some(row) = crate::runs::run(store, run_id)? else {
        return Ok(None);
    };
    let id = &row.run_id;
    let spans = store.query_all(
        "SELECT span_id, parent_id, kind, name, start_ns, end_ns, status, tokens_in, tokens_out, attributes FROM spans WHERE run_id = ?1 ORDER BY start_ns, span_id",
        [id],
        |r| {
            let attrs: String = r.get(9)?;
            Ok(Span {
                id: r.get::<_, i64>(0)? as u64,
                parent: r.get::<_, Option<i64>>(1)?.map(|p| p as u64),
                kind: r.get(2)?,
                name: r.get(3)?,
                start_ns: r.get::<_, i64>(4)? as u64,
                end_ns: r.get::<_, i64>(5)? as u64,
                status: r.get(6)?,
                tokens_in: r.get::<_, i64>(7)? as u64,
                tokens_out: r.get::<_, i64>(8)? as u64,
                attributes: serde_json::from_str(&attrs).unwrap_or_default(),
            })
        },
    )?;
    let steps = store.query_all(
        "SELECT step, budget_report FROM steps WHERE run_id = ?1 ORDER BY step",
        [id],
        |r| {
            Ok((
                r.get(0)?,
                serde_json::from_str(&r.get::<_, String>(1)?).unwrap_or_default(),
            ))
        },
    )?;
    let calls = store.query_all(
        "SELECT call_id, step, name, arguments, args_hash, decision, rule, reason, outcome, duration_ms FROM tool_calls WHERE run_id = ?1 ORDER BY step, call_id",
        [id],
        |r| {
            Ok(TracedCall {
                call_id: r.get(0)?,
                step: r.get(1)?,
                name: r.get(2)?,
                arguments: serde_json::from_str(&r.get::<_, String>(3)?).unwrap_or(Value::Null),
                args_hash: r.get(4)?,
                decision: r.get(5)?,
                rule: r.get(6)?,
                reason: r.get(7)?,
                outcome: r.get(8)?,
                duration_ms: r.get::<_, i64>(9)? as u64,
            })
        },
    )?;
    // A store without the table (or a run stored before it) has no trace id: the
    // export derives one.
    let trace_id = store
        .query_all("SELECT trace_id FROM traces WHERE run_id = ?1", [id], |r| r.get(0))
        .ok()
        .and_then(|ids: Vec<String>| ids.into_iter().next())
        .unwrap_or_default();
    let root = spans
        .iter()
        .find(|s| s.kind == SpanKind::Fire && s.parent.is_none())
        .map(|s| s.id);
    let trace = Trace {
        trace_id,
        root,
        spans,
        steps,
        calls,
    };
    Ok(Some((row, trace)))
}

/// OTLP/JSON (`resourceSpans`) for one run: the JSON form of [`otlp_request`].
pub fn to_otlp(row: &RunSummary, trace: &Trace, include_content: bool) -> Value {
    serde_json::to_value(otlp_request(&row.run_id, &row.task, trace, include_content)).unwrap_or(Value::Null)
}

/// The one mapping from a run's spans to OTLP: one resource (`service.name`,
/// `service.version`, task and run id), one scope, a span per span with its ids and
/// parent link, GenAI semantic-convention attributes, and content attributes
/// ([`CONTENT_ATTRIBUTES`]) only when `include_content`.
pub fn otlp_request(run_id: &str, task: &str, trace: &Trace, include_content: bool) -> ExportTraceServiceRequest {
    let trace_id = trace.otlp_trace_id(run_id);
    let spans = trace
        .spans
        .iter()
        .map(|s| otlp_span(s, &trace_id, run_id, task, include_content))
        .collect();
    let resource = Resource {
        attributes: vec![
            kv("service.name", &Value::from(SERVICE_NAME)),
            kv("service.version", &Value::from(env!("CARGO_PKG_VERSION"))),
            kv("agent.task", &Value::from(task)),
            kv("agent.run_id", &Value::from(run_id)),
        ],
        ..Default::default()
    };
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: SERVICE_NAME.into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    ..Default::default()
                }),
                spans,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    }
}

fn otlp_span(
    s: &Span,
    trace_id: &[u8],
    run_id: &str,
    task: &str,
    include_content: bool,
) -> opentelemetry_proto::tonic::trace::v1::Span {
    let mut attrs = Vec::new();
    let mut kind = OtlpSpanKind::Internal;
    match s.kind {
        SpanKind::Fire => {
            attrs.push(kv("gen_ai.operation.name", &Value::from("invoke_agent")));
            attrs.push(kv("gen_ai.agent.name", &Value::from(task)));
            attrs.push(kv("agent.task", &Value::from(task)));
            attrs.push(kv("agent.run_id", &Value::from(run_id)));
        }
        SpanKind::Model => {
            kind = OtlpSpanKind::Client;
            attrs.push(kv("gen_ai.operation.name", &Value::from("chat")));
            attrs.push(kv("gen_ai.usage.input_tokens", &Value::from(s.tokens_in)));
            attrs.push(kv("gen_ai.usage.output_tokens", &Value::from(s.tokens_out)));
        }
        SpanKind::Tool => {
            attrs.push(kv("gen_ai.operation.name", &Value::from("execute_tool")));
            attrs.push(kv("gen_ai.tool.type", &Value::from("function")));
        }
        SpanKind::Prefetch | SpanKind::Acceptance | SpanKind::Commit => {}
    }
    for (k, v) in &s.attributes {
        if include_content || !CONTENT_ATTRIBUTES.contains(&k.as_str()) {
            attrs.push(kv(k, v));
        }
    }
    let status = match s.status {
        SpanStatus::Ok => Status {
            code: StatusCode::Ok as i32,
            message: String::new(),
        },
        SpanStatus::Running => Status::default(),
        SpanStatus::Error | SpanStatus::Failed | SpanStatus::WallTime | SpanStatus::Cancelled => Status {
            code: StatusCode::Error as i32,
            message: s.status.to_string(),
        },
    };
    opentelemetry_proto::tonic::trace::v1::Span {
        trace_id: trace_id.to_vec(),
        span_id: s.id.to_be_bytes().to_vec(),
        parent_span_id: s.parent.map(|p| p.to_be_bytes().to_vec()).unwrap_or_default(),
        name: s.name.clone(),
        kind: kind as i32,
        start_time_unix_nano: s.start_ns,
        end_time_unix_nano: s.end_ns,
        attributes: attrs,
        status: Some(status),
        ..Default::default()
    }
}

/// One OTLP attribute from a stored JSON value (objects become their JSON text).
fn kv(key: &str, v: &Value) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(any_value(v)),
        ..Default::default()
    }
}

fn any_value(v: &Value) -> AnyValue {
    let value = match v {
        Value::Bool(b) => any_value::Value::BoolValue(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => any_value::Value::IntValue(i),
            None => any_value::Value::DoubleValue(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => any_value::Value::StringValue(s.clone()),
        Value::Array(items) => any_value::Value::ArrayValue(ArrayValue {
            values: items.iter().map(any_value).collect(),
        }),
        Value::Null | Value::Object(_) => any_value::Value::StringValue(v.to_string()),
    };
    AnyValue { value: Some(value) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::trace::v1::Span as OtlpSpan;

    fn fire_trace() -> Trace {
        let mut t = Trace::default();
        let root = t.open_root("fire digest", now_ns());
        let model = t.start(SpanKind::Model, "chat m");
        t.attr(model, "gen_ai.request.model", "m");
        t.attr(model, "gen_ai.output.messages", "[{\"role\":\"assistant\"}]");
        t.end(model, SpanStatus::Ok);
        let tool = t.start(SpanKind::Tool, "execute_tool read_file");
        t.attr(tool, "gen_ai.tool.name", "read_file");
        t.attr(tool, "gen_ai.tool.call.result", "secret file body");
        t.end(tool, SpanStatus::Error);
        t.end(root, SpanStatus::Ok);
        t
    }

    fn attr<'a>(s: &'a OtlpSpan, key: &str) -> Option<&'a any_value::Value> {
        s.attributes
            .iter()
            .find(|a| a.key == key)
            .and_then(|a| a.value.as_ref()?.value.as_ref())
    }

    #[test]
    fn one_root_and_every_other_span_under_it_with_random_ids() {
        let t = fire_trace();
        assert_eq!(t.trace_id.len(), 32);
        assert_ne!(fire_trace().trace_id, t.trace_id, "trace ids are random");
        let req = otlp_request("run-1", "digest", &t, false);
        let spans = &req.resource_spans[0].scope_spans[0].spans;
        assert_eq!(spans.len(), 3);
        let roots: Vec<&OtlpSpan> = spans.iter().filter(|s| s.parent_span_id.is_empty()).collect();
        assert_eq!(roots.len(), 1);
        assert_eq!(roots[0].name, "fire digest");
        for s in spans {
            assert_eq!(s.trace_id, hex::decode(&t.trace_id).unwrap());
            assert_eq!(s.span_id.len(), 8);
            if !s.parent_span_id.is_empty() {
                assert_eq!(s.parent_span_id, roots[0].span_id);
            }
        }
        let resource = req.resource_spans[0].resource.as_ref().unwrap();
        let keys: Vec<&str> = resource.attributes.iter().map(|a| a.key.as_str()).collect();
        assert_eq!(
            keys,
            vec!["service.name", "service.version", "agent.task", "agent.run_id"]
        );
    }

    #[test]
    fn genai_names_and_content_only_when_asked() {
        let t = fire_trace();
        let req = otlp_request("run-1", "digest", &t, false);
        let spans = &req.resource_spans[0].scope_spans[0].spans;
        let model = spans.iter().find(|s| s.name == "chat m").unwrap();
        assert_eq!(
            attr(model, "gen_ai.operation.name"),
            Some(&any_value::Value::StringValue("chat".into()))
        );
        assert!(attr(model, "gen_ai.usage.input_tokens").is_some());
        assert!(attr(model, "gen_ai.output.messages").is_none());
        let tool = spans.iter().find(|s| s.name.starts_with("execute_tool")).unwrap();
        assert!(attr(tool, "gen_ai.tool.name").is_some());
        assert!(attr(tool, "gen_ai.tool.call.result").is_none());
        assert_eq!(tool.status.as_ref().unwrap().code, StatusCode::Error as i32);
        let with = otlp_request("run-1", "digest", &t, true);
        let tool = with.resource_spans[0].scope_spans[0]
            .spans
            .iter()
            .find(|s| s.name.starts_with("execute_tool"))
            .unwrap();
        assert!(attr(tool, "gen_ai.tool.call.result").is_some());
    }

    #[test]
    fn json_form_is_the_same_mapping_with_hex_ids() {
        let t = fire_trace();
        // What `to_otlp` prints for a stored run.
        let json = serde_json::to_value(otlp_request("run-1", "digest", &t, false)).unwrap();
        let spans = json["resourceSpans"][0]["scopeSpans"][0]["spans"].as_array().unwrap();
        assert_eq!(spans[0]["traceId"], t.trace_id);
        assert_eq!(spans[0]["spanId"], format!("{:016x}", t.spans[0].id));
        assert_eq!(spans[1]["parentSpanId"], format!("{:016x}", t.spans[0].id));
        assert!(!json.to_string().contains("gen_ai.tool.call.result"));
    }

    #[test]
    fn a_run_stored_without_a_trace_id_gets_a_stable_one() {
        let t = Trace::default();
        assert_eq!(t.otlp_trace_id("run-1"), t.otlp_trace_id("run-1"));
        assert_eq!(t.otlp_trace_id("run-1").len(), 16);
    }
}

#[cfg(test)]
mod name_tests {
    use super::*;
    use crate::records::check_names;

    #[test]
    fn span_kinds_and_statuses_keep_their_stored_names() {
        check_names(&[
            (SpanKind::Fire, "fire"),
            (SpanKind::Prefetch, "prefetch"),
            (SpanKind::Model, "model"),
            (SpanKind::Tool, "tool"),
            (SpanKind::Acceptance, "acceptance"),
            (SpanKind::Commit, "commit"),
        ]);
        check_names(&[
            (SpanStatus::Running, "running"),
            (SpanStatus::Ok, "ok"),
            (SpanStatus::Error, "error"),
            (SpanStatus::Failed, "failed"),
            (SpanStatus::WallTime, "wall_time"),
            (SpanStatus::Cancelled, "cancelled"),
        ]);
    }
}
