//! The cards page (`/cards`): cards grouped by fingerprint with counts and first and
//! last seen, filtered like `builder cards list`, and (with `--write`) a triage form
//! per group that records the decision through `shared::cards::triage_cards`, the
//! function `builder cards triage` calls: the same card files, the same bytes, and,
//! as there, nothing committed.

use super::runs::{choices, Choice};
use super::{blocking, non_empty, printable, respond, App, Layout, PageError, Wants};
use axum::extract::{Form, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use shared::cards::{self, TriageDecision, TriageError, TriageRequest};
use shared::history::{self, CardFilter, CardGroup};
use shared::records::{parse_name, CardKind, CardStatus, Named};
use std::collections::HashMap;
use std::sync::Arc;

/// Groups per page.
const PAGE_GROUPS: usize = 100;

/// One page of groups (each as `builder cards list --json` prints it).
#[derive(serde::Serialize)]
pub struct CardsData {
    groups: Vec<CardGroup>,
    total: usize,
    offset: usize,
    next: Option<usize>,
    tasks: Vec<String>,
}

fn filter(q: &HashMap<String, String>) -> Result<CardFilter, PageError> {
    let kind = q
        .get("kind")
        .map(|k| parse_name::<CardKind>(k).map_err(|e| PageError::bad_request(e.to_string())))
        .transpose()?;
    let status = q
        .get("status")
        .map(|k| parse_name::<CardStatus>(k).map_err(|e| PageError::bad_request(e.to_string())))
        .transpose()?;
    let since = q
        .get("since")
        .map(|s| {
            history::parse_since(s).ok_or_else(|| {
                PageError::bad_request(format!(
                    "since `{}` is not a date (YYYY-MM-DD) or RFC 3339 time",
                    printable(s)
                ))
            })
        })
        .transpose()?;
    Ok(CardFilter {
        task: q.get("task").cloned(),
        kind,
        status,
        since,
    })
}

pub async fn page(State(app): State<Arc<App>>, wants: Wants, Query(q): Query<HashMap<String, String>>) -> Response {
    let q = non_empty(q);
    let params = q.clone();
    let data = blocking(&app, move |app| {
        let f = filter(&params)?;
        let offset = params
            .get("offset")
            .map(|o| {
                o.parse::<usize>()
                    .map_err(|_| PageError::bad_request("`offset` is not a number"))
            })
            .transpose()?
            .unwrap_or(0);
        app.with_index(true, |ix| {
            let mut groups = history::card_groups(&ix.store, &f).map_err(PageError::from_display)?;
            if let Some(fp) = params.get("fingerprint") {
                groups.retain(|g| &g.fingerprint == fp);
            }
            let total = groups.len();
            let groups: Vec<CardGroup> = groups.into_iter().skip(offset).take(PAGE_GROUPS).collect();
            let tasks = history::known_tasks(&app.root, &ix.store).map_err(PageError::from_display)?;
            Ok(CardsData {
                next: (offset + PAGE_GROUPS < total).then_some(offset + PAGE_GROUPS),
                groups,
                total,
                offset,
                tasks,
            })
        })
    })
    .await;
    let layout = Layout::of(&app, "Cards");
    respond(wants, data, move |d| {
        let mut notice = None;
        if let Some(fp) = q.get("triaged") {
            if let Some(g) = d.groups.iter().find(|g| &g.fingerprint == fp) {
                notice = Some(format!(
                    "Triage recorded for {}: its latest card is now {}. The card files changed in the work tree; commit them to share the triage (git add cards && git commit).",
                    printable(fp),
                    g.status
                ));
            }
        }
        let keep: Vec<(String, String)> = q
            .iter()
            .filter(|(k, _)| k.as_str() != "offset" && k.as_str() != "triaged")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let page_link = |o: usize| {
            let mut pairs = keep.clone();
            pairs.push(("offset".into(), o.to_string()));
            pairs.sort();
            format!(
                "/cards?{}",
                url::form_urlencoded::Serializer::new(String::new())
                    .extend_pairs(pairs)
                    .finish()
            )
        };
        askama::Template::render(&CardsHtml {
            tasks: choices(&d.tasks, q.get("task"), |t| t.clone()),
            kinds: names::<CardKind>(q.get("kind")),
            statuses: names::<CardStatus>(q.get("status")),
            since: q.get("since").map(|s| printable(s)).unwrap_or_default(),
            notice,
            total: d.total,
            groups: d.groups.iter().map(group_row).collect(),
            next: d.next.map(page_link),
            l: layout,
        })
    })
}

fn names<T: Named>(selected: Option<&String>) -> Vec<Choice> {
    T::ALL
        .iter()
        .map(|v| Choice {
            value: v.name().into(),
            label: v.name().into(),
            selected: selected.map(String::as_str) == Some(v.name()),
        })
        .collect()
}

#[derive(askama::Template)]
#[template(path = "cards.html")]
struct CardsHtml {
    l: Layout,
    tasks: Vec<Choice>,
    kinds: Vec<Choice>,
    statuses: Vec<Choice>,
    since: String,
    notice: Option<String>,
    total: usize,
    groups: Vec<GroupRow>,
    next: Option<String>,
}

struct GroupRow {
    fingerprint: String,
    count: i64,
    first_seen: String,
    last_seen: String,
    task: String,
    kind: String,
    status: String,
    summary: String,
    latest_id: String,
    latest_path: String,
}

fn group_row(g: &CardGroup) -> GroupRow {
    GroupRow {
        fingerprint: printable(&g.fingerprint),
        count: g.count,
        first_seen: printable(g.first_seen.get(..19).unwrap_or(&g.first_seen)),
        last_seen: printable(g.last_seen.get(..19).unwrap_or(&g.last_seen)),
        task: printable(&g.task),
        kind: g.kind.to_string(),
        status: g.status.to_string(),
        summary: printable(&g.summary),
        latest_id: printable(&g.latest_id),
        latest_path: printable(&g.latest_path),
    }
}

/// The triage form.
#[derive(serde::Deserialize)]
pub struct TriageForm {
    csrf: String,
    /// A card id or a fingerprint.
    id: String,
    /// `accept`, `reject`, `duplicate` or `fixed`.
    decision: String,
    /// The card a duplicate is of, or the commit or proposal that fixed it.
    #[serde(default)]
    target: String,
    #[serde(default)]
    note: String,
}

/// What a triage did (the JSON twin of the form's answer).
#[derive(serde::Serialize)]
struct Triaged {
    id: String,
    status: CardStatus,
    by: String,
    cards: Vec<shared::records::Card>,
}

pub async fn triage(State(app): State<Arc<App>>, wants: Wants, Form(form): Form<TriageForm>) -> Response {
    if !app.csrf_ok(&form.csrf) {
        return PageError::new(
            StatusCode::FORBIDDEN,
            "the form's CSRF token is not this server's: reload the page",
        )
        .render(wants);
    }
    let id = form.id.clone();
    let done = blocking(&app, move |app| {
        app.with_index(true, |ix| {
            let target = form.target.trim();
            let decision = match form.decision.as_str() {
                "accept" => TriageDecision::Accept,
                "reject" => TriageDecision::Reject,
                "duplicate" if !target.is_empty() => TriageDecision::DuplicateOf(target.to_string()),
                "fixed" if !target.is_empty() => match cards::resolve_fixed_by(&ix.repo, target) {
                    Some(fix) => TriageDecision::FixedBy(fix),
                    None => {
                        return Err(PageError::bad_request(format!(
                        "fixed by `{}`: neither a commit in this repository nor a proposal (no branch proposals/{})",
                        printable(target),
                        printable(target)
                    )))
                    }
                },
                "duplicate" | "fixed" => {
                    return Err(PageError::bad_request(format!(
                        "`{}` needs a card id or a commit in the field beside it",
                        printable(&form.decision)
                    )))
                }
                other => {
                    return Err(PageError::bad_request(format!(
                        "no decision `{}`: accept, reject, duplicate or fixed",
                        printable(other)
                    )))
                }
            };
            let by = shared::git::acting_identity(&ix.repo)
                .map_err(|e| {
                    PageError::bad_request(e.to_string())
                        .hint("set git's user.name and user.email for the person running builder serve")
                })?
                .to_string();
            let note = form.note.trim();
            let req = TriageRequest {
                id: &form.id,
                decision: &decision,
                by: &by,
                note: (!note.is_empty()).then_some(note),
            };
            let cards = cards::triage_cards(&ix.repo, &mut ix.store, &req, &mut ix.skipped).map_err(|e| match e {
                TriageError::NoCard(id) => PageError::not_found(format!("no card or fingerprint `{}`", printable(&id))),
                TriageError::Files(m) => PageError::internal(m),
                TriageError::History(e) => PageError::from_display(e),
                TriageError::Store(e) => PageError::from_display(e),
            })?;
            Ok(Triaged {
                id: form.id.clone(),
                status: decision.status(),
                by,
                cards,
            })
        })
    })
    .await;
    match (done, wants) {
        (Err(e), _) => e.render(wants),
        (Ok(t), Wants::Json) => axum::Json(t).into_response(),
        (Ok(t), Wants::Html) => {
            // The group, whichever id named it.
            let fp = t.cards.first().map(|c| c.fingerprint.clone()).unwrap_or(id);
            let q = url::form_urlencoded::Serializer::new(String::new())
                .append_pair("fingerprint", &fp)
                .append_pair("triaged", &fp)
                .finish();
            Redirect::to(&format!("/cards?{q}")).into_response()
        }
    }
}
