//! One run's page (`/runs/<id>`): what went wrong pinned at the top (status, stop
//! reason, denied calls, cards), the receipt's facts, the start of the transcript,
//! the timeline (a page of rows; htmx loads the next page when the last row comes
//! into view, so a run of 5,000 calls renders 200 rows at a time) and the report.
//! Payloads and reports are cut; full texts have their own URLs.

use super::{blocking, non_empty, plain_text, printable, printable_multiline, respond, App, Layout, PageError, Wants};
use axum::extract::{Path as UrlPath, Query, State};
use axum::response::Response;
use shared::pages::run::{self as page, Payload, RunView, TimelineEntry, TimelinePage};
use shared::pages::Excerpt;
use std::collections::HashMap;
use std::sync::Arc;

/// Timeline rows per page.
pub const TIMELINE_ROWS: usize = 200;

#[derive(serde::Serialize)]
pub struct RunData {
    #[serde(flatten)]
    view: RunView,
    timeline: TimelinePage,
}

fn esc_id(id: &str) -> String {
    url::form_urlencoded::byte_serialize(id.as_bytes()).collect()
}

fn offset_of(q: &HashMap<String, String>) -> Result<usize, PageError> {
    q.get("offset")
        .map(|o| {
            o.parse::<usize>()
                .map_err(|_| PageError::bad_request("`offset` is not a number"))
        })
        .transpose()
        .map(|o| o.unwrap_or(0))
}

fn load(app: &App, id: &str, offset: usize) -> Result<RunData, PageError> {
    app.with_trace(|trace| {
        app.with_index(true, |ix| {
            let view = page::run_view(&app.root, &ix.repo, &ix.store, trace, id)
                .map_err(|e| PageError::internal(e.to_string()))?
                .ok_or_else(|| {
                    PageError::not_found(format!("no run `{}` in the history index", printable(id)))
                        .hint("records must be committed to be indexed; a unique prefix of a run id is enough")
                })?;
            let timeline = page::timeline(&ix.store, trace, &view.run.run_id, offset, TIMELINE_ROWS)
                .map_err(PageError::from_display)?;
            Ok(RunData { view, timeline })
        })
    })
}

pub async fn page(
    State(app): State<Arc<App>>,
    wants: Wants,
    UrlPath(id): UrlPath<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let q = non_empty(q);
    let data = match offset_of(&q) {
        Ok(offset) => blocking(&app, move |app| load(app, &id, offset)).await,
        Err(e) => Err(e),
    };
    let layout = Layout::of(&app, "Run");
    respond(wants, data, move |d| askama::Template::render(&html(layout, &d)))
}

/// A page of timeline rows, for the sentinel that asks for it.
#[derive(serde::Serialize)]
pub struct TimelineData {
    #[serde(skip)]
    run_id: String,
    #[serde(flatten)]
    page: TimelinePage,
}

pub async fn timeline(
    State(app): State<Arc<App>>,
    wants: Wants,
    UrlPath(id): UrlPath<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let q = non_empty(q);
    let data = match offset_of(&q) {
        Ok(offset) => {
            blocking(&app, move |app| {
                app.with_trace(|trace| {
                    app.with_index(false, |ix| {
                        let run = shared::runs::run(&ix.store, &id)
                            .map_err(PageError::from_display)?
                            .ok_or_else(|| PageError::not_found(format!("no run `{}`", printable(&id))))?;
                        let page = page::timeline(&ix.store, trace, &run.run_id, offset, TIMELINE_ROWS)
                            .map_err(PageError::from_display)?;
                        Ok(TimelineData {
                            run_id: run.run_id,
                            page,
                        })
                    })
                })
            })
            .await
        }
        Err(e) => Err(e),
    };
    respond(wants, data, |t| {
        let base = format!("/runs/{}", esc_id(&t.run_id));
        askama::Template::render(&TimelineRows {
            rows: t.page.entries.iter().map(|e| entry_row(e, &base)).collect(),
            more: more(&t.page, &base),
        })
    })
}

fn more(t: &TimelinePage, base: &str) -> Option<More> {
    t.next.map(|n| More {
        fragment: format!("{base}/timeline?offset={n}"),
        page: format!("{base}?offset={n}"),
        offset: n,
    })
}

/// The run's report, whole, as plain text.
pub async fn report(State(app): State<Arc<App>>, wants: Wants, UrlPath(id): UrlPath<String>) -> Response {
    let text = blocking(&app, move |app| {
        app.with_index(false, |ix| {
            let run = shared::runs::run(&ix.store, &id)
                .map_err(PageError::from_display)?
                .ok_or_else(|| PageError::not_found(format!("no run `{}`", printable(&id))))?;
            run.report_path
                .as_deref()
                .and_then(|p| shared::records::record_text(&app.root, &ix.repo, p))
                .ok_or_else(|| PageError::not_found("this run has no report"))
        })
    })
    .await;
    match text {
        Ok(t) => plain_text(t),
        Err(e) => e.render(wants),
    }
}

/// One payload of one span of the run's trace, whole, as plain text.
pub async fn span(
    State(app): State<Arc<App>>,
    wants: Wants,
    UrlPath((id, span, which)): UrlPath<(String, String, String)>,
) -> Response {
    let text = blocking(&app, move |app| {
        let which = match which.as_str() {
            "input" => Payload::Input,
            "output" => Payload::Output,
            _ => return Err(PageError::not_found("a span's payload is `input` or `output`")),
        };
        app.with_trace(|trace| {
            let trace = trace.ok_or_else(|| PageError::not_found("this machine holds no trace (.runtime/state.db)"))?;
            let run_id = app.with_index(false, |ix| {
                shared::runs::run(&ix.store, &id)
                    .map_err(PageError::from_display)?
                    .map(|r| r.run_id)
                    .ok_or_else(|| PageError::not_found(format!("no run `{}`", printable(&id))))
            })?;
            page::span_text(trace, &run_id, &span, which)
                .map_err(PageError::from_display)?
                .ok_or_else(|| PageError::not_found("no such payload in this run's trace"))
        })
    })
    .await;
    match text {
        Ok(t) => plain_text(t),
        Err(e) => e.render(wants),
    }
}

#[derive(askama::Template)]
#[template(path = "run.html")]
struct RunHtml {
    l: Layout,
    run_id: String,
    task: String,
    task_href: String,
    status: String,
    stop_reason: String,
    health: &'static str,
    started_at: String,
    facts: Vec<(String, String)>,
    denials: Vec<Denial>,
    denials_more: i64,
    cards: Vec<CardLine>,
    acceptance: Vec<(String, bool, String)>,
    traced: bool,
    prompt: Option<Text>,
    source: &'static str,
    total: usize,
    rows: Vec<Row>,
    more: Option<More>,
    report: Option<Text>,
    /// Why the receipt is not the runtime's (`FORGED`), when it is not.
    forged: Option<String>,
}

#[derive(askama::Template)]
#[template(path = "timeline_rows.html")]
struct TimelineRows {
    rows: Vec<Row>,
    more: Option<More>,
}

struct Denial {
    seq: i64,
    name: String,
    rule: String,
    reason: String,
}

struct CardLine {
    id: String,
    kind: String,
    status: String,
    summary: String,
    href: String,
}

/// Text that may be cut, with where to read the whole.
struct Text {
    text: String,
    cut: bool,
    chars: usize,
    full: String,
}

fn text(e: &Excerpt, full: String) -> Text {
    Text {
        text: printable_multiline(&e.text),
        cut: e.cut,
        chars: e.chars,
        full,
    }
}

struct Row {
    seq: usize,
    kind: &'static str,
    name: String,
    step: String,
    decision: String,
    rule: String,
    reason: String,
    outcome: String,
    ms: String,
    tokens: String,
    budget: String,
    input: Option<Text>,
    output: Option<Text>,
}

/// The sentinel that loads the next page of rows.
struct More {
    fragment: String,
    page: String,
    offset: usize,
}

fn entry_row(e: &TimelineEntry, base: &str) -> Row {
    let span_href = |which: &str| {
        e.span_id
            .as_deref()
            .map(|s| format!("{base}/spans/{s}/{which}"))
            .unwrap_or_default()
    };
    Row {
        seq: e.seq,
        kind: match e.kind {
            page::EntryKind::Model => "model",
            page::EntryKind::Tool => "tool",
            page::EntryKind::Prefetch => "prefetch",
            page::EntryKind::Acceptance => "acceptance",
            page::EntryKind::Commit => "commit",
        },
        name: printable(&e.name),
        step: e.step.map(|s| s.to_string()).unwrap_or_default(),
        decision: e.decision.map(|d| d.to_string()).unwrap_or_default(),
        rule: e.rule.as_deref().map(printable).unwrap_or_default(),
        reason: e.reason.as_deref().map(printable).unwrap_or_default(),
        outcome: printable(&e.outcome),
        ms: format!("{:.1}", e.duration_ms),
        tokens: if e.tokens_in + e.tokens_out > 0 {
            format!("{} in / {} out", e.tokens_in, e.tokens_out)
        } else {
            String::new()
        },
        budget: e
            .budget
            .as_ref()
            .map(|b| {
                let mut s = format!(
                    "{} of {} tokens; {} included, {} summarised, {} dropped",
                    b.used, b.budget, b.included, b.summarised, b.dropped
                );
                if !b.reasons.is_empty() {
                    s.push_str(&format!(" ({})", b.reasons.join("; ")));
                }
                printable(&s)
            })
            .unwrap_or_default(),
        input: e.input.as_ref().map(|x| text(x, span_href("input"))),
        output: e.output.as_ref().map(|x| text(x, span_href("output"))),
    }
}

fn html(l: Layout, d: &RunData) -> RunHtml {
    let v = &d.view;
    let base = format!("/runs/{}", esc_id(&v.run.run_id));
    let mut facts = vec![
        ("steps".to_string(), v.run.steps.to_string()),
        ("tokens".into(), v.run.tokens.to_string()),
        ("cost".into(), format!("${:.4}", v.run.cost_usd)),
        ("duration".into(), format!("{} ms", v.run.duration_ms)),
        ("tool calls".into(), v.calls.to_string()),
        (
            "commit".into(),
            v.run.commit_id.as_deref().map(printable).unwrap_or_else(|| "-".into()),
        ),
        (
            "prompt blob".into(),
            v.run
                .prompt_blob
                .as_deref()
                .map(printable)
                .unwrap_or_else(|| "-".into()),
        ),
    ];
    let mut acceptance = Vec::new();
    if let Some(r) = &v.receipt {
        facts.push((
            "provider / model".into(),
            printable(&format!("{} / {}", r.inputs.provider, r.inputs.model)),
        ));
        facts.push((
            "sandbox".into(),
            format!(
                "landlock {} (ABI {}), {}",
                r.sandbox.landlock,
                r.sandbox.abi.map_or("-".into(), |a| a.to_string()),
                r.sandbox.mode
            ),
        ));
        facts.push(("retries".into(), r.retries.to_string()));
        if !r.outputs.is_empty() {
            facts.push(("outputs".into(), printable(&r.outputs.join(", "))));
        }
        if let Some(a) = &r.inputs.approval {
            facts.push(("approval".into(), printable(&format!("{} by {}", a.id, a.approver))));
        }
        acceptance = r
            .acceptance
            .iter()
            .map(|a| (printable(&a.check), a.passed, printable(&a.detail)))
            .collect();
    }
    let t = &d.timeline;
    RunHtml {
        l,
        run_id: printable(&v.run.run_id),
        task: printable(&v.run.task),
        task_href: format!(
            "/runs?{}",
            url::form_urlencoded::Serializer::new(String::new())
                .append_pair("task", &v.run.task)
                .finish()
        ),
        status: v.run.status.to_string(),
        stop_reason: v.run.stop_reason.to_string(),
        health: v.health.as_str(),
        started_at: printable(&v.run.started_at),
        forged: v.forged.as_ref().map(|f| {
            printable(&format!(
                "this run's records came in commit {}, which the runtime did not make ({})",
                shared::text::short_id(&f.commit),
                f.why
            ))
        }),
        facts,
        denials: v
            .denials
            .iter()
            .map(|c| Denial {
                seq: c.seq,
                name: printable(&c.name),
                rule: c.rule.as_deref().map(printable).unwrap_or_else(|| "(built-in)".into()),
                reason: printable(&c.reason),
            })
            .collect(),
        denials_more: v.denial_count - v.denials.len() as i64,
        cards: v
            .cards
            .iter()
            .map(|c| CardLine {
                id: printable(&c.id),
                kind: c.kind.to_string(),
                status: c.status.to_string(),
                summary: printable(&c.summary),
                href: format!(
                    "/cards?{}",
                    url::form_urlencoded::Serializer::new(String::new())
                        .append_pair("fingerprint", &c.fingerprint)
                        .finish()
                ),
            })
            .collect(),
        acceptance,
        traced: v.traced,
        prompt: v.prompt.as_ref().map(|p| text(p, String::new())),
        source: match t.source {
            page::TimelineSource::Trace => "the runtime's trace on this machine",
            page::TimelineSource::Receipt => "the receipt (this machine holds no trace of the run)",
        },
        total: t.total,
        rows: t.entries.iter().map(|e| entry_row(e, &base)).collect(),
        more: more(t, &base),
        report: v.report.as_ref().map(|r| text(r, format!("{base}/report"))),
    }
}
