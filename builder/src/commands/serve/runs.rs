//! The run list page (`/runs`): filters by task, health, day and prompt version,
//! counts per health, a page of rows at a time, each row linking to its run.

use super::{blocking, non_empty, printable, respond, App, Layout, PageError, Wants};
use axum::extract::{Query, State};
use axum::response::Response;
use shared::pages::runs::{self as page, Cursor, Health, HealthCounts, PromptVersion, RunRow, RunsQuery};
use shared::records::parse_name;
use std::collections::HashMap;
use std::sync::Arc;

/// Rows per page.
const PAGE_ROWS: usize = 100;

#[derive(serde::Serialize)]
pub struct RunsData {
    #[serde(flatten)]
    page: page::RunsPage,
    tasks: Vec<String>,
    /// The task's prompt versions (with a task filter only).
    prompt_versions: Vec<PromptVersion>,
}

#[derive(askama::Template)]
#[template(path = "runs.html")]
struct RunsHtml {
    l: Layout,
    tasks: Vec<Choice>,
    healths: Vec<Choice>,
    versions: Vec<Choice>,
    day: String,
    prompt: String,
    counts: HealthCounts,
    links: CountLinks,
    rows: Vec<Row>,
    next: Option<String>,
    first: Option<String>,
}

/// An `<option>`.
pub struct Choice {
    pub value: String,
    pub label: String,
    pub selected: bool,
}

struct CountLinks {
    all: String,
    failed: String,
    attention: String,
    ok: String,
}

struct Row {
    href: String,
    run_id: String,
    task: String,
    status: String,
    stop_reason: String,
    health: &'static str,
    started_at: String,
    steps: i64,
    tokens: i64,
    cost: String,
    ms: i64,
    cards: i64,
    prompt: String,
    forged: bool,
}

/// The filters of a query string.
fn query(q: &HashMap<String, String>) -> Result<RunsQuery, PageError> {
    let health = q
        .get("health")
        .map(|h| parse_name::<Health>(h).map_err(|e| PageError::bad_request(e.to_string())))
        .transpose()?;
    let day = q
        .get("day")
        .map(|d| {
            chrono::NaiveDate::parse_from_str(d, "%Y-%m-%d")
                .map_err(|_| PageError::bad_request(format!("day `{}` is not YYYY-MM-DD", printable(d))))
        })
        .transpose()?;
    let after = q
        .get("after")
        .map(|a| Cursor::parse(a).ok_or_else(|| PageError::bad_request("`after` is not a page cursor")))
        .transpose()?;
    Ok(RunsQuery {
        task: q.get("task").cloned(),
        health,
        day,
        prompt: q.get("prompt").cloned(),
        after,
        limit: PAGE_ROWS,
    })
}

/// `/runs?<filters>` with `key` set to `value` (or dropped) and the page cursor dropped.
fn link(q: &HashMap<String, String>, key: &str, value: Option<&str>) -> String {
    let mut pairs: Vec<(&str, &str)> = q
        .iter()
        .filter(|(k, _)| k.as_str() != key && k.as_str() != "after")
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    if let Some(v) = value {
        pairs.push((key, v));
    }
    pairs.sort();
    if pairs.is_empty() {
        return "/runs".into();
    }
    format!(
        "/runs?{}",
        url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(pairs)
            .finish()
    )
}

pub async fn page(State(app): State<Arc<App>>, wants: Wants, Query(q): Query<HashMap<String, String>>) -> Response {
    let q = non_empty(q);
    let filters = q.clone();
    let data = blocking(&app, move |app| {
        let rq = query(&filters)?;
        app.with_index(false, |ix| {
            let tasks = shared::history::known_tasks(&app.root, &ix.store).map_err(PageError::from_display)?;
            if let Some(t) = &rq.task {
                if !tasks.contains(t) {
                    return Err(PageError::bad_request(format!("no task `{}`", printable(t))));
                }
            }
            let runs = page::runs_page(&ix.store, &rq).map_err(PageError::from_display)?;
            let prompt_versions = match &rq.task {
                Some(t) => page::prompt_versions(&ix.store, t).map_err(PageError::from_display)?,
                None => Vec::new(),
            };
            Ok(RunsData {
                page: runs,
                tasks,
                prompt_versions,
            })
        })
    })
    .await;
    let app2 = app.clone();
    respond(wants, data, move |d| {
        let html = RunsHtml {
            l: Layout::of(&app2, "Runs"),
            tasks: choices(&d.tasks, q.get("task"), |t| t.clone()),
            healths: [Health::Failed, Health::Attention, Health::Ok]
                .iter()
                .map(|h| Choice {
                    value: h.as_str().into(),
                    label: health_label(*h).into(),
                    selected: q.get("health").map(String::as_str) == Some(h.as_str()),
                })
                .collect(),
            versions: d
                .prompt_versions
                .iter()
                .filter_map(|v| {
                    let blob = v.prompt_blob.clone()?;
                    Some(Choice {
                        selected: q.get("prompt") == Some(&blob),
                        label: format!(
                            "{} ({} runs, {} to {})",
                            &blob[..blob.len().min(10)],
                            v.runs,
                            day_of(&v.first_run),
                            day_of(&v.last_run)
                        ),
                        value: blob,
                    })
                })
                .collect(),
            day: q.get("day").map(|d| printable(d)).unwrap_or_default(),
            prompt: q.get("prompt").map(|d| printable(d)).unwrap_or_default(),
            counts: d.page.counts.clone(),
            links: CountLinks {
                all: link(&q, "health", None),
                failed: link(&q, "health", Some("failed")),
                attention: link(&q, "health", Some("attention")),
                ok: link(&q, "health", Some("ok")),
            },
            rows: d.page.runs.iter().map(row).collect(),
            next: d.page.next.as_deref().map(|n| {
                let mut with = q.clone();
                with.insert("after".into(), n.to_string());
                let mut pairs: Vec<(&String, &String)> = with.iter().collect();
                pairs.sort();
                format!(
                    "/runs?{}",
                    url::form_urlencoded::Serializer::new(String::new())
                        .extend_pairs(pairs)
                        .finish()
                )
            }),
            first: q.contains_key("after").then(|| link(&q, "after", None)),
        };
        askama::Template::render(&html)
    })
}

pub fn health_label(h: Health) -> &'static str {
    match h {
        Health::Failed => "failed",
        Health::Attention => "needs attention",
        Health::Ok => "ok",
    }
}

/// `<option>`s for `items`, `selected` marked.
pub fn choices<T>(items: &[T], selected: Option<&String>, value: impl Fn(&T) -> String) -> Vec<Choice> {
    items
        .iter()
        .map(|i| {
            let v = value(i);
            Choice {
                selected: selected == Some(&v),
                label: printable(&v),
                value: v,
            }
        })
        .collect()
}

fn day_of(t: &str) -> &str {
    t.get(..10).unwrap_or(t)
}

fn row(r: &RunRow) -> Row {
    Row {
        href: format!(
            "/runs/{}",
            url::form_urlencoded::byte_serialize(r.run.run_id.as_bytes()).collect::<String>()
        ),
        run_id: printable(&r.run.run_id),
        task: printable(&r.run.task),
        status: r.run.status.to_string(),
        stop_reason: r.run.stop_reason.to_string(),
        health: r.health.as_str(),
        started_at: r
            .run
            .started_at
            .get(..19)
            .unwrap_or(&r.run.started_at)
            .replace('T', " "),
        steps: r.run.steps,
        tokens: r.run.tokens,
        cost: format!("{:.4}", r.run.cost_usd),
        ms: r.run.duration_ms,
        cards: r.cards,
        forged: r.forged,
        prompt: r
            .run
            .prompt_blob
            .as_deref()
            .map(|p| p[..p.len().min(8)].to_string())
            .unwrap_or_else(|| "-".into()),
    }
}
