//! One run as `builder serve` shows it: what to pin at the top (status, stop reason,
//! denied calls, cards), the receipt, the report, and the timeline a page at a time.
//! The timeline comes from the runtime's trace (`.runtime/state.db`) when this
//! machine fired the run: model calls with their tokens and the step's budget
//! report, tool calls with decision, rule, outcome, arguments and result, prefetch
//! and acceptance spans; where the trace is not here (a run fired on the cron box),
//! from the receipt's calls in the history index. Long payloads are cut
//! ([`Excerpt`]); [`span_text`] gives the whole. A run of 5,000 calls costs one page
//! of rows: spans are paged by row id before their (large) attributes are read.

use super::runs::Health;
use super::Excerpt;
use crate::records::{record_text, CardKind, CardStatus, Receipt, RecordedDecision};
use crate::runs::RunSummary;
use crate::store::{Store, StoreError};
use crate::trace::BudgetReport;
use rusqlite::{params, OptionalExtension};
use serde::Serialize;
use serde_json::Value;
use std::path::Path;

/// Characters of a payload (arguments, a result, a model's answer) a timeline row shows.
pub const PAYLOAD_CHARS: usize = 600;
/// Characters of the report a run page shows.
pub const REPORT_CHARS: usize = 20_000;
/// Denied calls pinned at the top of a run page (the count says how many more).
const PINNED_DENIALS: usize = 20;

/// A tool call as the receipt recorded it (the history index's copy).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CallRow {
    /// Its place among the run's calls, from 0.
    pub seq: i64,
    pub call_id: String,
    pub name: String,
    pub decision: RecordedDecision,
    pub rule: Option<String>,
    pub reason: String,
    pub outcome: String,
    pub duration_ms: i64,
}

/// A card the run wrote, as the index holds it (status: what the card file says).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CardRef {
    pub id: String,
    pub kind: CardKind,
    pub status: CardStatus,
    pub summary: String,
    pub fingerprint: String,
    pub path: String,
}

/// What a run page shows above its timeline.
#[derive(Debug, Clone, Serialize)]
pub struct RunView {
    pub run: RunSummary,
    pub health: Health,
    /// The receipt, as `builder history show --json` prints it (`None` when its
    /// file is gone from the work tree and from HEAD).
    pub receipt: Option<Receipt>,
    /// The first denied calls, in order, and how many there are in all.
    pub denials: Vec<CallRow>,
    pub denial_count: i64,
    pub cards: Vec<CardRef>,
    /// Tool calls the receipt records.
    pub calls: i64,
    /// The runtime's trace of this run is on this machine (`.runtime/state.db`).
    pub traced: bool,
    /// The start of the conversation (system and user messages), when the trace
    /// kept model input.
    pub prompt: Option<Excerpt>,
    pub report: Option<Excerpt>,
    /// The receipt came in a commit the runtime did not make ([`Forged`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forged: Option<Forged>,
}

/// A receipt that came in a forged commit: named as the runtime without a valid
/// runtime signature, or a person's (`builder history show` says `FORGED`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Forged {
    pub commit: String,
    pub why: String,
}

/// Why a run page could not be made.
#[derive(Debug, thiserror::Error)]
pub enum RunPageError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{path}: {message}")]
    Record { path: String, message: String },
}

/// The runtime's state database of `root`, opened for reading only (`None` when this
/// machine never fired here, or the file cannot be read as it is: no trace then).
pub fn open_trace(root: &Path) -> Option<Store> {
    let path = crate::state::db_path(root);
    if !path.is_file() {
        return None;
    }
    Store::open_read_only(&path, crate::state::RUNTIME_SCHEMA).ok()
}

/// The page of run `id` (an id or unique prefix); `None` when the index has no such run.
pub fn run_view(
    root: &Path,
    repo: &git2::Repository,
    index: &Store,
    trace: Option<&Store>,
    id: &str,
) -> Result<Option<RunView>, RunPageError> {
    let Some(run) = crate::runs::run(index, id)? else {
        return Ok(None);
    };
    let rid = run.run_id.clone();
    let receipt = run_receipt(root, repo, run.receipt_path.as_deref())?;
    let forged = crate::history::forged_run(index, &run)?.map(|(commit, why)| Forged { commit, why });
    let denial_count: i64 = index
        .conn()
        .query_row(
            "SELECT count(*) FROM tool_calls WHERE run_id = ?1 AND decision = ?2",
            params![rid, RecordedDecision::Deny],
            |r| r.get(0),
        )
        .map_err(index.sql_error())?;
    let denials = index_calls(
        index,
        &rid,
        "AND decision = ?4",
        Some(RecordedDecision::Deny),
        0,
        PINNED_DENIALS,
    )?;
    let calls: i64 = index
        .conn()
        .query_row("SELECT count(*) FROM tool_calls WHERE run_id = ?1", [&rid], |r| {
            r.get(0)
        })
        .map_err(index.sql_error())?;
    let cards = run_cards(index, &rid)?;
    let traced = has_spans(trace, &rid)?;
    let prompt = match trace.filter(|_| traced) {
        Some(t) => first_input(t, &rid)?.map(|text| Excerpt::of(&text, REPORT_CHARS)),
        None => None,
    };
    let report = run
        .report_path
        .as_deref()
        .and_then(|p| record_text(root, repo, p))
        .map(|text| Excerpt::of(&text, REPORT_CHARS));
    Ok(Some(RunView {
        health: Health::of(run.status, !cards.is_empty()),
        run,
        receipt,
        denials,
        denial_count,
        cards,
        calls,
        traced,
        prompt,
        report,
        forged,
    }))
}

/// The run's receipt, read from its record (`None` without one).
fn run_receipt(
    root: &Path,
    repo: &git2::Repository,
    receipt_path: Option<&str>,
) -> Result<Option<Receipt>, RunPageError> {
    match receipt_path {
        Some(p) => record_text(root, repo, p)
            .map(|text| {
                serde_json::from_str::<Receipt>(&text).map_err(|e| RunPageError::Record {
                    path: p.to_string(),
                    message: format!("line {}: {e}", e.line()),
                })
            })
            .transpose(),
        None => Ok(None),
    }
}

/// The cards the run raised, oldest first.
fn run_cards(index: &Store, rid: &str) -> Result<Vec<CardRef>, StoreError> {
    index.query_all(
        "SELECT id, kind, status, summary, fingerprint, path FROM cards WHERE run_id = ?1 ORDER BY created_at, id",
        [rid],
        |r| {
            Ok(CardRef {
                id: r.get(0)?,
                kind: r.get(1)?,
                status: r.get(2)?,
                summary: r.get(3)?,
                fingerprint: r.get(4)?,
                path: r.get(5)?,
            })
        },
    )
}

/// Whether the trace holds any span of the run.
fn has_spans(trace: Option<&Store>, rid: &str) -> Result<bool, StoreError> {
    let traced = match trace {
        Some(t) => t
            .conn()
            .query_row("SELECT 1 FROM spans WHERE run_id = ?1 LIMIT 1", [rid], |_| Ok(()))
            .optional()
            .map_err(t.sql_error())?
            .is_some(),
        None => false,
    };
    Ok(traced)
}

/// The run's calls from the history index, in order.
fn index_calls(
    index: &Store,
    run_id: &str,
    extra: &str,
    decision: Option<RecordedDecision>,
    offset: usize,
    limit: usize,
) -> Result<Vec<CallRow>, StoreError> {
    // `call_id` is `<seq:04>-<id>`: the primary key's order is the run's order.
    let sql = format!(
        "SELECT step, call_id, name, decision, rule, reason, outcome, duration_ms FROM tool_calls
         WHERE run_id = ?1 {extra} ORDER BY call_id LIMIT ?2 OFFSET ?3"
    );
    let row = |r: &rusqlite::Row| {
        let call_id: String = r.get(1)?;
        Ok(CallRow {
            seq: r.get(0)?,
            call_id: call_id
                .split_once('-')
                .map_or(call_id.clone(), |(_, id)| id.to_string()),
            name: r.get(2)?,
            decision: r.get(3)?,
            rule: r.get(4)?,
            reason: r.get(5)?,
            outcome: r.get(6)?,
            duration_ms: r.get(7)?,
        })
    };
    match decision {
        Some(d) => index.query_all(&sql, params![run_id, limit as i64, offset as i64, d], row),
        None => index.query_all(&sql, params![run_id, limit as i64, offset as i64], row),
    }
}

/// What a timeline row times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    Model,
    Tool,
    Prefetch,
    Acceptance,
    Commit,
}

/// One row of a run's timeline.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TimelineEntry {
    /// Its place in the timeline, from 0.
    pub seq: usize,
    pub kind: EntryKind,
    pub name: String,
    /// The trace's span id (hex), where the row comes from the trace.
    pub span_id: Option<String>,
    /// The model step it belongs to.
    pub step: Option<u64>,
    pub call_id: Option<String>,
    pub decision: Option<RecordedDecision>,
    pub rule: Option<String>,
    pub reason: Option<String>,
    /// A tool call's outcome, or how a span ended.
    pub outcome: String,
    pub duration_ms: f64,
    pub tokens_in: u64,
    pub tokens_out: u64,
    /// A model step's context budget report.
    pub budget: Option<BudgetReport>,
    /// A call's arguments.
    pub input: Option<Excerpt>,
    /// A call's result, or the model's answer (text and the calls it asked for).
    pub output: Option<Excerpt>,
}

/// Where a timeline came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TimelineSource {
    /// The runtime's trace on this machine.
    Trace,
    /// The receipt's calls (no trace here).
    Receipt,
}

/// One page of a run's timeline.
#[derive(Debug, Clone, Serialize)]
pub struct TimelinePage {
    pub source: TimelineSource,
    pub entries: Vec<TimelineEntry>,
    pub total: usize,
    pub offset: usize,
    /// Where the next page starts (`None`: this is the last).
    pub next: Option<usize>,
}

/// `limit` timeline rows of run `run_id` (its full id) from `offset`.
pub fn timeline(
    index: &Store,
    trace: Option<&Store>,
    run_id: &str,
    offset: usize,
    limit: usize,
) -> Result<TimelinePage, StoreError> {
    let limit = limit.max(1);
    if let Some(t) = trace {
        let total: i64 = t
            .conn()
            .query_row(
                "SELECT count(*) FROM spans WHERE run_id = ?1 AND kind != 'fire'",
                [run_id],
                |r| r.get(0),
            )
            .map_err(t.sql_error())?;
        if total > 0 {
            let entries = trace_entries(t, run_id, offset, limit)?;
            return Ok(page(TimelineSource::Trace, entries, total as usize, offset, limit));
        }
    }
    let total: i64 = index
        .conn()
        .query_row("SELECT count(*) FROM tool_calls WHERE run_id = ?1", [run_id], |r| {
            r.get(0)
        })
        .map_err(index.sql_error())?;
    let entries = index_calls(index, run_id, "", None, offset, limit)?
        .into_iter()
        .enumerate()
        .map(|(i, c)| TimelineEntry {
            seq: offset + i,
            kind: EntryKind::Tool,
            name: c.name,
            span_id: None,
            step: None,
            call_id: Some(c.call_id),
            decision: Some(c.decision),
            rule: c.rule,
            reason: Some(c.reason),
            outcome: c.outcome,
            duration_ms: c.duration_ms as f64,
            tokens_in: 0,
            tokens_out: 0,
            budget: None,
            input: None,
            output: None,
        })
        .collect();
    Ok(page(TimelineSource::Receipt, entries, total as usize, offset, limit))
}

fn page(
    source: TimelineSource,
    entries: Vec<TimelineEntry>,
    total: usize,
    offset: usize,
    limit: usize,
) -> TimelinePage {
    let next = (offset + limit < total).then_some(offset + limit);
    TimelinePage {
        source,
        entries,
        total,
        offset,
        next,
    }
}

/// A trace span's row as the timeline reads it.
struct SpanRow {
    id: i64,
    kind: String,
    name: String,
    start_ns: i64,
    end_ns: i64,
    status: String,
    tokens_in: i64,
    tokens_out: i64,
    attributes: serde_json::Map<String, Value>,
}

/// The page's spans (all but the fire's own), in start order.
fn page_spans(t: &Store, run_id: &str, offset: usize, limit: usize) -> Result<Vec<SpanRow>, StoreError> {
    // The page's row ids first (a sort of small keys), then only their attributes.
    t.query_all(
        "SELECT span_id, kind, name, start_ns, end_ns, status, tokens_in, tokens_out, attributes FROM spans
         WHERE rowid IN (SELECT rowid FROM spans WHERE run_id = ?1 AND kind != 'fire' ORDER BY start_ns, span_id LIMIT ?2 OFFSET ?3)
         ORDER BY start_ns, span_id",
        params![run_id, limit as i64, offset as i64],
        |r| {
            Ok(SpanRow {
                id: r.get(0)?,
                kind: r.get(1)?,
                name: r.get(2)?,
                start_ns: r.get(3)?,
                end_ns: r.get(4)?,
                status: r.get(5)?,
                tokens_in: r.get(6)?,
                tokens_out: r.get(7)?,
                attributes: serde_json::from_str(&r.get::<_, String>(8)?).unwrap_or_default(),
            })
        },
    )
}

/// A span as the `seq`th entry of the timeline, before the details its kind adds;
/// with the span's attributes, which those details come from.
fn timeline_entry(s: SpanRow, seq: usize) -> (TimelineEntry, serde_json::Map<String, Value>) {
    let kind = match s.kind.as_str() {
        "model" => EntryKind::Model,
        "tool" => EntryKind::Tool,
        "prefetch" => EntryKind::Prefetch,
        "acceptance" => EntryKind::Acceptance,
        _ => EntryKind::Commit,
    };
    let step = s.attributes.get("agent.step").and_then(Value::as_u64);
    let e = TimelineEntry {
        seq,
        kind,
        name: s.name,
        span_id: Some(format!("{:016x}", s.id as u64)),
        step,
        call_id: None,
        decision: None,
        rule: None,
        reason: None,
        outcome: s.status,
        duration_ms: s.end_ns.saturating_sub(s.start_ns).max(0) as f64 / 1e6,
        tokens_in: s.tokens_in.max(0) as u64,
        tokens_out: s.tokens_out.max(0) as u64,
        budget: None,
        input: None,
        output: None,
    };
    (e, s.attributes)
}

fn trace_entries(t: &Store, run_id: &str, offset: usize, limit: usize) -> Result<Vec<TimelineEntry>, StoreError> {
    let spans = page_spans(t, run_id, offset, limit)?;
    let conn = t.conn();
    let mut call = conn
        .prepare_cached("SELECT rule, reason, step FROM tool_calls WHERE run_id = ?1 AND call_id = ?2")
        .map_err(t.sql_error())?;
    let mut budget = conn
        .prepare_cached("SELECT budget_report FROM steps WHERE run_id = ?1 AND step = ?2")
        .map_err(t.sql_error())?;
    let mut out = Vec::with_capacity(spans.len());
    for (i, s) in spans.into_iter().enumerate() {
        let (mut e, attributes) = timeline_entry(s, offset + i);
        let attr = |k: &str| attributes.get(k).and_then(Value::as_str).map(str::to_string);
        let step = e.step;
        match e.kind {
            EntryKind::Tool => {
                e.call_id = attr("gen_ai.tool.call.id");
                e.decision = attr("agent.decision").and_then(|d| d.parse().ok());
                if let Some(o) = attr("agent.outcome") {
                    e.outcome = o;
                }
                if let Some(id) = &e.call_id {
                    let found: Option<(Option<String>, String, i64)> = call
                        .query_row(params![run_id, id], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                        .optional()
                        .map_err(t.sql_error())?;
                    if let Some((rule, reason, step)) = found {
                        e.rule = rule;
                        e.reason = Some(reason);
                        e.step = u64::try_from(step).ok();
                    }
                }
                e.input = attr("gen_ai.tool.call.arguments").map(|a| Excerpt::of(&a, PAYLOAD_CHARS));
                e.output = attr("gen_ai.tool.call.result").map(|a| Excerpt::of(&a, PAYLOAD_CHARS));
            }
            EntryKind::Model => {
                if let Some(n) = step {
                    let report: Option<String> = budget
                        .query_row(params![run_id, n as i64], |r| r.get(0))
                        .optional()
                        .map_err(t.sql_error())?;
                    e.budget = report.and_then(|r| serde_json::from_str(&r).ok());
                }
                e.output = attr("gen_ai.output.messages").map(|m| Excerpt::of(&messages_text(&m), PAYLOAD_CHARS));
            }
            EntryKind::Prefetch | EntryKind::Acceptance | EntryKind::Commit => {}
        }
        out.push(e);
    }
    Ok(out)
}

/// GenAI semantic-convention messages (`[{role, parts: [...]}]`, as the trace keeps
/// model input and output) as plain text: each message's role, its text parts, the
/// calls it asked for and the call results it carries.
pub fn messages_text(json: &str) -> String {
    let Ok(Value::Array(messages)) = serde_json::from_str::<Value>(json) else {
        return json.to_string();
    };
    let mut out = String::new();
    for m in &messages {
        let role = m["role"].as_str().unwrap_or("?");
        for p in m["parts"].as_array().into_iter().flatten() {
            let line = match p["type"].as_str() {
                Some("text") => p["content"].as_str().unwrap_or("").to_string(),
                Some("tool_call") => format!("call {} {}", p["name"].as_str().unwrap_or("?"), p["arguments"]),
                Some("tool_call_response") => p["response"]
                    .as_str()
                    .map_or_else(|| p["response"].to_string(), str::to_string),
                _ => p.to_string(),
            };
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&format!("[{role}] {line}"));
        }
    }
    out
}

/// The first model call's input (the system prompt, the task and its prefetch), as
/// text, when the trace kept it.
fn first_input(t: &Store, run_id: &str) -> Result<Option<String>, StoreError> {
    let attrs: Option<String> = t
        .conn()
        .query_row(
            "SELECT attributes FROM spans WHERE run_id = ?1 AND kind = 'model' ORDER BY start_ns, span_id LIMIT 1",
            [run_id],
            |r| r.get(0),
        )
        .optional()
        .map_err(t.sql_error())?;
    Ok(attrs
        .and_then(|a| serde_json::from_str::<serde_json::Map<String, Value>>(&a).ok())
        .and_then(|a| {
            a.get("gen_ai.input.messages")
                .and_then(Value::as_str)
                .map(messages_text)
        }))
}

/// Which payload of a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// A tool call's arguments, or a model call's input messages.
    Input,
    /// A tool call's result, or a model call's answer.
    Output,
}

/// The whole text of one payload of span `span_id` (hex) of run `run_id`.
pub fn span_text(t: &Store, run_id: &str, span_id: &str, which: Payload) -> Result<Option<String>, StoreError> {
    let Ok(id) = u64::from_str_radix(span_id, 16) else {
        return Ok(None);
    };
    let row: Option<(String, String)> = t
        .conn()
        .query_row(
            "SELECT kind, attributes FROM spans WHERE run_id = ?1 AND span_id = ?2",
            params![run_id, id as i64],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(t.sql_error())?;
    let Some((kind, attrs)) = row else {
        return Ok(None);
    };
    let attrs: serde_json::Map<String, Value> = serde_json::from_str(&attrs).unwrap_or_default();
    let get = |k: &str| attrs.get(k).and_then(Value::as_str).map(str::to_string);
    Ok(match (kind.as_str(), which) {
        ("tool", Payload::Input) => get("gen_ai.tool.call.arguments"),
        ("tool", Payload::Output) => get("gen_ai.tool.call.result"),
        ("model", Payload::Input) => get("gen_ai.input.messages").map(|m| messages_text(&m)),
        ("model", Payload::Output) => get("gen_ai.output.messages").map(|m| messages_text(&m)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{ToolCallRecord, ToolOutcome};
    use crate::trace::{SpanKind, SpanStatus, Trace, TracedCall};

    /// A run of three calls (the second denied) in the history index, and its trace
    /// (one model step, one traced call with a long result) in a runtime store.
    fn fixture(dir: &Path) -> (Store, Store, String) {
        let mut r = crate::records::tests::sample_receipt();
        r.tool_calls = (0..3)
            .map(|i| ToolCallRecord {
                id: format!("c{i}"),
                name: "run_command".into(),
                decision: if i == 1 {
                    RecordedDecision::Deny
                } else {
                    RecordedDecision::Allow
                },
                rule: Some("Bash(git*)".into()),
                reason: format!("reason {i}"),
                outcome: ToolOutcome::Ok,
                duration_ms: i,
                mcp: None,
            })
            .collect();
        let mut index = crate::history::open_store(dir).unwrap();
        index
            .write(|tx| crate::history::insert_receipt(tx, &r, "runs/digest/x.json"))
            .unwrap();
        let mut t = Trace::default();
        let root = t.open_root("fire digest", crate::trace::now_ns());
        t.steps.push((
            1,
            BudgetReport {
                budget: 100,
                used: 40,
                included: 2,
                ..Default::default()
            },
        ));
        let m = t.start(SpanKind::Model, "chat m");
        t.attr(m, "agent.step", 1u32);
        t.attr(m, "gen_ai.output.messages", r#"[{"role":"assistant","parts":[{"type":"text","content":"looking"},{"type":"tool_call","id":"c1","name":"run_command","arguments":{"command":"git push"}}]}]"#);
        t.end(m, SpanStatus::Ok);
        let s = t.start(SpanKind::Tool, "execute_tool run_command");
        t.attr(s, "gen_ai.tool.call.id", "c1");
        t.attr(s, "agent.decision", "deny");
        t.attr(s, "agent.outcome", "PERMISSION_DENIED");
        t.attr(s, "gen_ai.tool.call.arguments", r#"{"command":"git push"}"#);
        t.attr(s, "gen_ai.tool.call.result", "y".repeat(1000));
        t.end(s, SpanStatus::Error);
        t.end(root, SpanStatus::Ok);
        t.calls.push(TracedCall {
            call_id: "c1".into(),
            step: 1,
            name: "run_command".into(),
            arguments: serde_json::json!({"command": "git push"}),
            args_hash: String::new(),
            decision: RecordedDecision::Deny,
            rule: Some("Bash(git push*)".into()),
            reason: "a deny rule".into(),
            outcome: ToolOutcome::Ok,
            duration_ms: 1,
        });
        let mut trace = Store::open(&dir.join("state.db"), crate::state::RUNTIME_SCHEMA).unwrap();
        trace.write(|tx| t.save(tx, &r, "runs/digest/x.json", "")).unwrap();
        (index, trace, r.run_id)
    }

    #[test]
    fn the_timeline_reads_the_trace_where_it_is_and_the_receipt_where_not() {
        let dir = tempfile::tempdir().unwrap();
        let (index, trace, id) = fixture(dir.path());
        let page = timeline(&index, Some(&trace), &id, 0, 10).unwrap();
        assert_eq!((page.source, page.total, page.next), (TimelineSource::Trace, 2, None));
        let model = &page.entries[0];
        assert_eq!((model.kind, model.step), (EntryKind::Model, Some(1)));
        assert_eq!(model.budget.as_ref().map(|b| b.used), Some(40));
        assert_eq!(
            model.output.as_ref().unwrap().text,
            "[assistant] looking\n[assistant] call run_command {\"command\":\"git push\"}"
        );
        let call = &page.entries[1];
        assert_eq!(call.decision, Some(RecordedDecision::Deny));
        assert_eq!(call.rule.as_deref(), Some("Bash(git push*)"));
        assert_eq!((call.step, call.outcome.as_str()), (Some(1), "PERMISSION_DENIED"));
        let result = call.output.as_ref().unwrap();
        assert!(result.cut && result.chars == 1000 && result.text.chars().count() == PAYLOAD_CHARS);
        let whole = span_text(&trace, &id, call.span_id.as_deref().unwrap(), Payload::Output).unwrap();
        assert_eq!(whole.map(|w| w.len()), Some(1000));
        // No trace here: the receipt's three calls, a page at a time.
        let page = timeline(&index, None, &id, 1, 1).unwrap();
        assert_eq!(
            (page.source, page.total, page.next),
            (TimelineSource::Receipt, 3, Some(2))
        );
        assert_eq!(page.entries.len(), 1);
        assert_eq!(
            (page.entries[0].seq, page.entries[0].decision),
            (1, Some(RecordedDecision::Deny))
        );
        assert_eq!(page.entries[0].call_id.as_deref(), Some("c1"));
    }

    #[test]
    fn a_run_page_pins_its_denials_and_refuses_a_path_outside_the_repository() {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init(dir.path()).unwrap();
        let (index, trace, id) = fixture(dir.path());
        let v = run_view(dir.path(), &repo, &index, Some(&trace), &id).unwrap().unwrap();
        assert_eq!((v.denial_count, v.calls, v.traced), (1, 3, true));
        assert_eq!(v.denials[0].reason, "reason 1");
        assert!(run_view(dir.path(), &repo, &index, None, "nosuchrun")
            .unwrap()
            .is_none());
        assert_eq!(record_text(dir.path(), &repo, "../etc/passwd"), None);
    }
}
