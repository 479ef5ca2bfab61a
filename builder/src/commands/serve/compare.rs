//! The compare page (`/compare`): two runs side by side (`?a=<run>&b=<run>`: what
//! `builder history diff` shows, and their calls row against row), or two input
//! versions of a task over their runs (`?task=<t>&before=<version>&after=<version>`:
//! what `builder history compare` computes, the versions picked from the runs'), each
//! with a "different only" switch (`only=diff`) that hides the rows that agree.

use super::runs::{choices, Choice};
use super::{blocking, non_empty, printable, printable_multiline, respond, App, Layout, PageError, Wants};
use axum::extract::{Query, State};
use axum::response::Response;
use shared::history::Comparison;
use shared::pages::compare::{self as page, RunsCompared, VersionRow};
use std::collections::HashMap;
use std::sync::Arc;

/// Counted runs each side needs before anything is judged (`history compare`'s default).
const MIN_RUNS: i64 = 5;

/// What the page compares; the JSON twin is the compared value itself.
#[derive(serde::Serialize)]
#[serde(untagged)]
pub enum CompareData {
    Runs(Box<RunsCompared>),
    Versions {
        #[serde(flatten)]
        comparison: Box<Comparison>,
        versions: Vec<VersionRow>,
    },
    /// Nothing picked yet: the tasks, and a task's versions.
    Pick {
        tasks: Vec<String>,
        versions: Vec<VersionRow>,
    },
}

pub async fn page(State(app): State<Arc<App>>, wants: Wants, Query(q): Query<HashMap<String, String>>) -> Response {
    let q = non_empty(q);
    let params = q.clone();
    let data = blocking(&app, move |app| {
        app.with_index(false, |ix| {
            if let (Some(a), Some(b)) = (params.get("a"), params.get("b")) {
                let c = page::runs(&ix.repo, &ix.store, a, b)
                    .map_err(PageError::from_display)?
                    .ok_or_else(|| {
                        PageError::not_found(format!(
                            "`{}` or `{}` is not exactly one indexed run",
                            printable(a),
                            printable(b)
                        ))
                    })?;
                return Ok(CompareData::Runs(Box::new(c)));
            }
            let tasks = shared::history::known_tasks(&app.root, &ix.store).map_err(PageError::from_display)?;
            let Some(task) = params.get("task") else {
                return Ok(CompareData::Pick {
                    tasks,
                    versions: Vec::new(),
                });
            };
            if !tasks.contains(task) {
                return Err(PageError::bad_request(format!("no task `{}`", printable(task))));
            }
            let versions = page::versions(&ix.store, task).map_err(PageError::from_display)?;
            let side = |key: &str| {
                params
                    .get(key)
                    .map(|v| {
                        page::parse_version_key(v).ok_or_else(|| {
                            PageError::bad_request(format!("{key} is not a version (pick one from the list)"))
                        })
                    })
                    .transpose()
            };
            match (side("before")?, side("after")?) {
                (Some(b), Some(a)) => {
                    let comparison =
                        page::versions_compared(&ix.store, task, &b, &a, MIN_RUNS).map_err(PageError::from_display)?;
                    Ok(CompareData::Versions {
                        comparison: Box::new(comparison),
                        versions,
                    })
                }
                _ => Ok(CompareData::Pick { tasks, versions }),
            }
        })
    })
    .await;
    let layout = Layout::of(&app, "Compare");
    respond(wants, data, move |d| askama::Template::render(&html(layout, &q, d)))
}

#[derive(askama::Template)]
#[template(path = "compare.html")]
struct CompareHtml {
    l: Layout,
    only_diff: bool,
    a: String,
    b: String,
    tasks: Vec<Choice>,
    task: String,
    befores: Vec<Choice>,
    afters: Vec<Choice>,
    runs: Option<RunsHtml>,
    versions: Option<VersionsHtml>,
}

struct RunsHtml {
    a_id: String,
    b_id: String,
    a_href: String,
    b_href: String,
    heads: Vec<(String, String, String)>,
    metrics: Vec<Metric>,
    inputs: Vec<(String, String, String, String)>,
    report_diff: String,
    calls: Vec<CallPairRow>,
    hidden: usize,
}

struct Metric {
    name: String,
    a: String,
    b: String,
    delta: String,
    same: bool,
}

struct CallPairRow {
    seq: i64,
    a: String,
    b: String,
    same: bool,
}

struct VersionsHtml {
    metrics: Vec<Metric>,
    verdict: Vec<String>,
    hidden: usize,
}

fn html(l: Layout, q: &HashMap<String, String>, d: CompareData) -> CompareHtml {
    let only_diff = q.get("only").map(String::as_str) == Some("diff");
    let version_choices = |versions: &[VersionRow], key: &str| -> Vec<Choice> {
        versions
            .iter()
            .map(|v| Choice {
                selected: q.get(key) == Some(&v.key),
                label: format!(
                    "prompt {} · scope {} · settings {} ({} runs, {} to {})",
                    short(&v.version.prompt_blob),
                    short(&v.version.scope_blob),
                    short(&v.version.settings_blob),
                    v.runs,
                    v.first_run.get(..10).unwrap_or(&v.first_run),
                    v.last_run.get(..10).unwrap_or(&v.last_run)
                ),
                value: v.key.clone(),
            })
            .collect()
    };
    let mut out = CompareHtml {
        l,
        only_diff,
        a: q.get("a").map(|s| printable(s)).unwrap_or_default(),
        b: q.get("b").map(|s| printable(s)).unwrap_or_default(),
        tasks: Vec::new(),
        task: q.get("task").map(|s| printable(s)).unwrap_or_default(),
        befores: Vec::new(),
        afters: Vec::new(),
        runs: None,
        versions: None,
    };
    match d {
        CompareData::Runs(c) => {
            let d = &c.diff;
            let metrics: Vec<Metric> = d
                .metrics
                .iter()
                .map(|m| Metric {
                    name: m.name.clone(),
                    a: format!("{:.4}", m.a),
                    b: format!("{:.4}", m.b),
                    delta: format!("{:+.4}", m.delta),
                    same: m.delta.abs() < 1e-12,
                })
                .collect();
            let calls: Vec<CallPairRow> = c
                .calls
                .iter()
                .map(|p| {
                    let side = |c: &Option<shared::pages::run::CallRow>| {
                        c.as_ref()
                            .map(|c| printable(&format!("{} · {} · {}", c.name, c.decision, c.outcome)))
                            .unwrap_or_else(|| "—".into())
                    };
                    CallPairRow {
                        seq: p.seq,
                        a: side(&p.a),
                        b: side(&p.b),
                        same: p.same,
                    }
                })
                .collect();
            let hidden = if only_diff {
                metrics.iter().filter(|m| m.same).count() + calls.iter().filter(|c| c.same).count()
            } else {
                0
            };
            let run_href = |id: &str| {
                format!(
                    "/runs/{}",
                    url::form_urlencoded::byte_serialize(id.as_bytes()).collect::<String>()
                )
            };
            out.runs = Some(RunsHtml {
                a_id: printable(&d.a.run_id),
                b_id: printable(&d.b.run_id),
                a_href: run_href(&d.a.run_id),
                b_href: run_href(&d.b.run_id),
                heads: vec![
                    ("task".into(), printable(&d.a.task), printable(&d.b.task)),
                    ("status".into(), d.a.status.to_string(), d.b.status.to_string()),
                    (
                        "stop reason".into(),
                        d.a.stop_reason.to_string(),
                        d.b.stop_reason.to_string(),
                    ),
                    (
                        "commit".into(),
                        d.a.commit_id.as_deref().map(printable).unwrap_or_default(),
                        d.b.commit_id.as_deref().map(printable).unwrap_or_default(),
                    ),
                ]
                .into_iter()
                .filter(|(_, x, y)| !only_diff || x != y)
                .collect(),
                metrics: metrics.into_iter().filter(|m| !only_diff || !m.same).collect(),
                inputs: d
                    .inputs
                    .iter()
                    .filter(|i| !only_diff || !i.diff.is_empty())
                    .map(|i| {
                        (
                            printable(&i.name),
                            short(&i.a),
                            short(&i.b),
                            printable_multiline(&i.diff),
                        )
                    })
                    .collect(),
                report_diff: printable_multiline(&d.report_diff),
                calls: calls.into_iter().filter(|c| !only_diff || !c.same).collect(),
                hidden,
            });
        }
        CompareData::Versions {
            comparison: c,
            versions,
        } => {
            out.befores = version_choices(&versions, "before");
            out.afters = version_choices(&versions, "after");
            let m = |name: &str, x: f64, y: f64, fmt: fn(f64) -> String| Metric {
                name: name.into(),
                a: fmt(x),
                b: fmt(y),
                delta: fmt(y - x),
                same: (y - x).abs() < 1e-12,
            };
            let n = |v: f64| format!("{v:.0}");
            let f = |v: f64| format!("{v:.3}");
            let metrics = vec![
                m("runs counted", c.before.runs as f64, c.after.runs as f64, n),
                m("successes", c.before.successes as f64, c.after.successes as f64, n),
                m("success rate", c.before.success_rate, c.after.success_rate, f),
                m("average steps", c.before.avg_steps, c.after.avg_steps, f),
                m("average tokens", c.before.avg_tokens, c.after.avg_tokens, f),
                m("average cost $", c.before.avg_cost_usd, c.after.avg_cost_usd, |v| {
                    format!("{v:.5}")
                }),
                m("average denials", c.before.avg_denials, c.after.avg_denials, f),
                m("refused (left out)", c.before.refused as f64, c.after.refused as f64, n),
                m(
                    "other models (left out)",
                    c.before.other_models as f64,
                    c.after.other_models as f64,
                    n,
                ),
            ];
            let hidden = if only_diff {
                metrics.iter().filter(|m| m.same).count()
            } else {
                0
            };
            let mut verdict = Vec::new();
            if !c.enough_runs {
                verdict.push(format!(
                    "too few runs to compare: {} and {}; each side needs at least {}",
                    c.before.runs, c.after.runs, c.min_runs
                ));
            } else if let Some(t) = &c.success_test {
                verdict.push(format!(
                    "Fisher's exact test, one-sided: p = {}{}",
                    shared::history::format_p(t.p_value),
                    if t.regression {
                        " (a significant drop)"
                    } else {
                        " (no significant drop)"
                    }
                ));
            }
            verdict.extend(c.regressions.iter().map(|r| printable(&format!("REGRESSION: {r}"))));
            out.versions = Some(VersionsHtml {
                metrics: metrics.into_iter().filter(|m| !only_diff || !m.same).collect(),
                verdict,
                hidden,
            });
        }
        CompareData::Pick { tasks, versions } => {
            out.tasks = choices(&tasks, q.get("task"), |t| t.clone());
            out.befores = version_choices(&versions, "before");
            out.afters = version_choices(&versions, "after");
        }
    }
    out
}

fn short(id: &Option<String>) -> String {
    id.as_deref()
        .map(|s| printable(&s[..s.len().min(10)]))
        .unwrap_or_else(|| "-".into())
}
