//! The fire's trace: spans for prefetch, each model call and each tool call (duration,
//! tokens, status), step budget reports and tool-call details, kept in memory during a
//! fire and stored in `.runtime/state.db`. Also reads runs back for `runtime runs` /
//! `runtime show`, and exports one run as OTLP/JSON with OpenTelemetry GenAI attribute
//! names (message content left out unless asked for).

use crate::records::{named, Receipt, RecordedDecision, ToolOutcome};
use crate::runs::RunSummary;
use crate::store::{Store, StoreError};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::time::{SystemTime, UNIX_EPOCH};

/// What a span times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(rename_all = "snake_case")]
pub enum SpanKind {
    Fire,
    Prefetch,
    Model,
    Tool,
    Acceptance,
    Commit,
}

impl SpanKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            SpanKind::Fire => "fire",
            SpanKind::Prefetch => "prefetch",
            SpanKind::Model => "model",
            SpanKind::Tool => "tool",
            SpanKind::Acceptance => "acceptance",
            SpanKind::Commit => "commit",
        }
    }
}

named!(
    SpanKind,
    "span kind",
    [
        SpanKind::Fire,
        SpanKind::Prefetch,
        SpanKind::Model,
        SpanKind::Tool,
        SpanKind::Acceptance,
        SpanKind::Commit,
    ]
);

/// How a span ended (`running` until it does).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(rename_all = "snake_case")]
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

impl SpanStatus {
    pub fn as_str(&self) -> &'static str {
        match self {
            SpanStatus::Running => "running",
            SpanStatus::Ok => "ok",
            SpanStatus::Error => "error",
            SpanStatus::Failed => "failed",
            SpanStatus::WallTime => "wall_time",
            SpanStatus::Cancelled => "cancelled",
        }
    }
}

named!(
    SpanStatus,
    "span status",
    [
        SpanStatus::Running,
        SpanStatus::Ok,
        SpanStatus::Error,
        SpanStatus::Failed,
        SpanStatus::WallTime,
        SpanStatus::Cancelled,
    ]
);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Span {
    pub id: u64,
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
    pub spans: Vec<Span>,
    pub steps: Vec<(u32, BudgetReport)>,
    pub calls: Vec<TracedCall>,
    next_id: u64,
}

pub fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

impl Trace {
    /// Opens a span; close it with [`Trace::end`].
    pub fn start(&mut self, kind: SpanKind, name: impl Into<String>, parent: Option<u64>) -> u64 {
        self.next_id += 1;
        let now = now_ns();
        self.spans.push(Span {
            id: self.next_id,
            parent,
            kind,
            name: name.into(),
            start_ns: now,
            end_ns: now,
            status: SpanStatus::Running,
            tokens_in: 0,
            tokens_out: 0,
            attributes: Default::default(),
        });
        self.next_id
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

    /// Stores the run row, spans, steps and calls in one transaction.
    pub fn save(
        &self,
        store: &mut Store,
        receipt: &Receipt,
        receipt_path: &str,
        report_path: &str,
    ) -> Result<(), StoreError> {
        store.write(|tx| {
            let r = receipt;
            crate::store::insert_run(tx, r, receipt_path, Some(report_path))?;
            for s in &self.spans {
                tx.execute(
                    "INSERT OR REPLACE INTO spans (run_id, span_id, parent_id, kind, name, start_ns, end_ns, status, tokens_in, tokens_out, attributes) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                    rusqlite::params![r.run_id, s.id as i64, s.parent.map(|p| p as i64), s.kind, s.name, s.start_ns as i64, s.end_ns as i64, s.status, s.tokens_in as i64, s.tokens_out as i64, Value::Object(s.attributes.clone()).to_string()],
                )?;
            }
            for (step, report) in &self.steps {
                tx.execute("INSERT OR REPLACE INTO steps (run_id, step, budget_report) VALUES (?1, ?2, ?3)", rusqlite::params![r.run_id, step, serde_json::to_string(report).unwrap_or_default()])?;
            }
            for c in &self.calls {
                tx.execute(
                    "INSERT OR REPLACE INTO tool_calls (run_id, call_id, step, name, arguments, args_hash, decision, rule, reason, outcome, duration_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                    rusqlite::params![r.run_id, c.call_id, c.step, c.name, c.arguments.to_string(), c.args_hash, c.decision, c.rule, c.reason, c.outcome, c.duration_ms as i64],
                )?;
            }
            Ok(())
        })
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
        "SELECT span_id, parent_id, kind, name, start_ns, end_ns, status, tokens_in, tokens_out, attributes FROM spans WHERE run_id = ?1 ORDER BY span_id",
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
    let trace = Trace {
        spans,
        steps,
        calls,
        ..Trace::default()
    };
    Ok(Some((row, trace)))
}

/// OTLP/JSON (`resourceSpans`) for one run, with GenAI semantic-convention names.
pub fn to_otlp(row: &RunSummary, trace: &Trace, include_content: bool) -> Value {
    let trace_id = {
        use sha2::{Digest, Sha256};
        hex::encode(&Sha256::digest(row.run_id.as_bytes())[..16])
    };
    let span_id = |id: u64| format!("{id:016x}");
    let kv = |k: &str, v: Value| {
        let value = match v {
            Value::Number(n) if n.is_i64() || n.is_u64() => json!({"intValue": n.to_string()}),
            Value::Number(n) => json!({"doubleValue": n}),
            Value::Bool(b) => json!({"boolValue": b}),
            Value::String(s) => json!({"stringValue": s}),
            other => json!({"stringValue": other.to_string()}),
        };
        json!({"key": k, "value": value})
    };
    let spans: Vec<Value> = trace
        .spans
        .iter()
        .map(|s| {
            let mut attrs = vec![kv("agent.run_id", json!(row.run_id)), kv("agent.task", json!(row.task))];
            match s.kind {
                SpanKind::Model => {
                    attrs.push(kv("gen_ai.operation.name", json!("chat")));
                    attrs.push(kv("gen_ai.usage.input_tokens", json!(s.tokens_in)));
                    attrs.push(kv("gen_ai.usage.output_tokens", json!(s.tokens_out)));
                }
                SpanKind::Tool => {
                    attrs.push(kv("gen_ai.operation.name", json!("execute_tool")));
                }
                SpanKind::Fire | SpanKind::Prefetch | SpanKind::Acceptance | SpanKind::Commit => {}
            }
            for (k, v) in &s.attributes {
                let is_content = k.starts_with("gen_ai.input.messages")
                    || k.starts_with("gen_ai.output.messages")
                    || k == "gen_ai.tool.call.arguments"
                    || k == "gen_ai.tool.call.result";
                if !is_content || include_content {
                    attrs.push(kv(k, v.clone()));
                }
            }
            let mut span = json!({
                "traceId": trace_id,
                "spanId": span_id(s.id),
                "name": s.name,
                "kind": if s.kind == SpanKind::Model { 3 } else { 1 },
                "startTimeUnixNano": s.start_ns.to_string(),
                "endTimeUnixNano": s.end_ns.to_string(),
                "attributes": attrs,
                "status": {"code": if s.status == SpanStatus::Ok { 1 } else { 2 }, "message": s.status.as_str()},
            });
            if let Some(p) = s.parent {
                span["parentSpanId"] = json!(span_id(p));
            }
            span
        })
        .collect();
    json!({
        "resourceSpans": [{
            "resource": {"attributes": [kv("service.name", json!("runtime"))]},
            "scopeSpans": [{"scope": {"name": "agent-runtime", "version": env!("CARGO_PKG_VERSION")}, "spans": spans}]
        }]
    })
}

#[cfg(test)]
mod tests {
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
