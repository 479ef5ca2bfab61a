//! The proposals pages: the list (`/proposals`, as `builder proposals` tells it), one
//! proposal (`/proposal?name=`) with its review loaded after the page (htmx asks
//! `/proposal/review`, which computes what `builder review` computes, evals
//! included, once per proposal head and base), and (with `--write`) the approval:
//! `shared::review::proposals::approve`, the function `builder approve` calls, as the
//! git identity of the person running the server, signed with git's signing key when
//! one is configured. Self-approval and the runtime identity are refused there.

use super::{blocking, non_empty, printable, printable_multiline, respond, App, Layout, PageError, Wants};
use axum::extract::{Form, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect, Response};
use shared::review::proposals::{self, Proposal};
use shared::review::ReviewError;
use shared::review_report::{ReportError, ReviewOptions, ReviewReport};
use std::collections::HashMap;
use std::sync::Arc;

fn review_error(e: ReviewError) -> PageError {
    match e {
        ReviewError::Refused(m) => PageError::new(StatusCode::FORBIDDEN, m),
        ReviewError::Usage(m) => PageError::bad_request(m),
        other => PageError::from_display(other),
    }
}

/// Every proposal, as `builder proposals --json` prints them.
fn all(app: &App) -> Result<Vec<Proposal>, PageError> {
    let wt = shared::git::open_work_tree(&app.root).map_err(PageError::from_display)?;
    let (settings, _) = crate::commands::protected_branch_settings(&wt).map_err(PageError::from_display)?;
    let rule = crate::commands::approval_rule(&settings).map_err(PageError::from_display)?;
    proposals::list(&wt.repo, &rule).map_err(review_error)
}

#[derive(askama::Template)]
#[template(path = "proposals.html")]
struct ListHtml {
    l: Layout,
    rows: Vec<Row>,
}

struct Row {
    name: String,
    href: String,
    state: &'static str,
    authors: String,
    head: String,
}

fn href(name: &str) -> String {
    format!(
        "/proposal?{}",
        url::form_urlencoded::Serializer::new(String::new())
            .append_pair("name", name)
            .finish()
    )
}

fn row(p: &Proposal) -> Row {
    Row {
        name: printable(&p.name),
        href: href(&p.name),
        state: p.state.name(),
        authors: printable(&p.authors.join(", ")),
        head: shared::text::short_id(&p.head).to_string(),
    }
}

pub async fn list(State(app): State<Arc<App>>, wants: Wants) -> Response {
    let data = blocking(&app, all).await;
    let layout = Layout::of(&app, "Proposals");
    respond(wants, data, move |d| {
        askama::Template::render(&ListHtml {
            l: layout,
            rows: d.iter().map(row).collect(),
        })
    })
}

#[derive(askama::Template)]
#[template(path = "proposal.html")]
struct PageHtml {
    l: Layout,
    p: Row,
    tree: String,
    review_href: String,
    /// Whether the page loads its review as it opens: only when the browser says the
    /// request came from this server's own pages (`same-origin`; see [`page`]).
    review_on_load: bool,
    name_raw: String,
    /// The head's full id, which the approve form carries.
    head_raw: String,
    approved: Option<String>,
}

pub async fn page(
    State(app): State<Arc<App>>,
    wants: Wants,
    headers: axum::http::HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    // The page asks for its review as it loads, and that request is the page's own:
    // another site that sent the browser here (a link, a redirect, `window.open`)
    // would start the evals, live cases spending the provider's key (helper-108). So
    // the review loads by itself only when the browser says the person came from this
    // server's own pages (`same-origin`); otherwise it waits for a click: `none` is a
    // typed address but also a link another program (chat, mail, a PDF) handed the
    // browser (helper-110), and a browser that says nothing is treated alike.
    let review_on_load = from_this_server(&headers);
    let q = non_empty(q);
    let Some(name) = q.get("name").cloned() else {
        return PageError::bad_request("which proposal? /proposal?name=<name>").render(wants);
    };
    let wanted = name.clone();
    let just_approved = q.get("approved").cloned();
    let data = blocking(&app, move |app| {
        let p = all(app)?
            .into_iter()
            .find(|p| p.name == wanted)
            .ok_or_else(|| PageError::not_found(format!("no proposal `{}`", printable(&wanted))))?;
        Ok((p, just_approved.and_then(|id| approval_notice(app, &wanted, &id))))
    })
    .await;
    let layout = Layout::of(&app, format!("Proposal {name}"));
    let (data, approved) = match data {
        Ok((p, approved)) => (Ok(p), approved),
        Err(e) => (Err(e), None),
    };
    respond(wants, data, move |p| {
        askama::Template::render(&PageHtml {
            l: layout,
            tree: p.tree.clone(),
            review_href: format!(
                "/proposal/review?{}",
                url::form_urlencoded::Serializer::new(String::new())
                    .append_pair("name", &p.name)
                    .finish()
            ),
            review_on_load,
            name_raw: p.name.clone(),
            head_raw: p.head.clone(),
            p: row(&p),
            approved,
        })
    })
}

/// The notice the page shows after an approval from it: the address names only the
/// approval's id (any page could link here with words of its own), and the words
/// come from that approval of this proposal as written, or there is no notice.
fn approval_notice(app: &App, proposal: &str, id: &str) -> Option<String> {
    let wt = shared::git::open_work_tree(&app.root).ok()?;
    let approvals = shared::review::approvals::Approvals::read(&wt.repo).ok()?;
    let found = approvals.of_proposal(proposal).find(|a| a.id.to_string() == id)?;
    Some(printable(&format!(
        "approval {} by {}",
        shared::text::short_oid(found.id),
        found.body.approver
    )))
}

#[derive(askama::Template)]
#[template(path = "review.html")]
struct ReviewHtml {
    base: String,
    head: String,
    ok: bool,
    verdict: &'static str,
    changes: Vec<(String, &'static str)>,
    patch: String,
    unowned: Vec<String>,
    unreviewed_base: Option<BaseHtml>,
    check: Vec<String>,
    history: String,
    delta: Vec<Delta>,
    evals: Vec<EvalRow>,
    failures: Vec<String>,
    fixes: Vec<String>,
}

/// The base's changes no approval covers ([`shared::review_report::UnreviewedBase`]).
struct BaseHtml {
    reviewed: String,
    commits: Vec<String>,
    changes: Vec<(String, &'static str)>,
    patch: String,
}

struct Delta {
    before: String,
    after: String,
    from: String,
    to: String,
    count: usize,
    calls: Vec<String>,
}

struct EvalRow {
    case: String,
    revision: &'static str,
    passed: String,
    failed: bool,
    steps: u64,
    calls: u64,
    tokens: u64,
    cost: String,
    denials: u64,
    ms: u64,
}

/// The review of proposal `name`: made once per (head, base), then kept.
fn review_of(app: &App, name: &str) -> Result<Arc<ReviewReport>, PageError> {
    let wt = shared::git::open_work_tree(&app.root).map_err(PageError::from_display)?;
    let p = proposals::under_review(&wt.repo, name).map_err(review_error)?;
    let key = format!("{name}\n{}\n{}", p.head, p.base);
    if let Some(r) = app.cached_review(&key) {
        return Ok(r);
    }
    let opts = ReviewOptions {
        root: wt.root.clone(),
        name: name.to_string(),
        history: wt
            .root
            .join(shared::layout::STATE_DIR)
            .join(shared::state::STATE_DB_FILE),
        since: None,
        runtime: crate::commands::eval::runtime_binary().map_err(PageError::from_display)?,
        // The web view reviews as `builder review` does by default: the eval fires
        // run under the base's powers, never the proposal's.
        trusted: shared::eval::trusted::TrustedSource::Base,
        max_live_fires: shared::eval::DEFAULT_MAX_LIVE_FIRES,
    };
    let report = shared::review_report::review(&wt.repo, &opts).map_err(|e| match e {
        ReportError::Review(e) => review_error(e),
        other => PageError::internal(other.to_string()),
    })?;
    let report = Arc::new(report);
    app.keep_review(key, report.clone());
    Ok(report)
}

/// Whether the browser says the request comes from this server's own pages
/// (`Sec-Fetch-Site: same-origin`).
fn from_this_server(headers: &axum::http::HeaderMap) -> bool {
    headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) == Some("same-origin")
}

pub async fn review(
    State(app): State<Arc<App>>,
    wants: Wants,
    headers: axum::http::HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    // A review fires the evals of base and head (live cases spend the provider's key):
    // only this server's own page starts one. It asks with `HX-Request` (a header no
    // other site can add without a CORS preflight this server never answers), or a
    // browser says the request is the page's own (`Sec-Fetch-Site: same-origin`). A
    // link or image elsewhere, a link in a chat (`none`), or an old browser that says
    // nothing gets 403; a client that is no browser sends `HX-Request: true`.
    let from_page = headers.contains_key("hx-request") || from_this_server(&headers);
    if !from_page {
        return PageError::new(
            axum::http::StatusCode::FORBIDDEN,
            "a review runs evals: start it from this server's own proposal page",
        )
        .render(wants);
    }
    let q = non_empty(q);
    let Some(name) = q.get("name").cloned() else {
        return PageError::bad_request("which proposal? /proposal/review?name=<name>").render(wants);
    };
    let data = blocking(&app, move |app| review_of(app, &name)).await;
    // The JSON twin is `builder review --format json`.
    respond(wants, data.map(|r| (*r).clone()), |r| {
        askama::Template::render(&ReviewHtml {
            base: r.base.clone(),
            head: r.head.clone(),
            ok: r.ok,
            verdict: shared::review_report::verdict(&r),
            changes: r.changes.iter().map(|c| (printable(&c.path), c.status)).collect(),
            patch: printable_multiline(&r.patch),
            unowned: r.unowned.iter().map(|p| printable(p)).collect(),
            unreviewed_base: r.unreviewed_base.as_ref().map(|u| BaseHtml {
                reviewed: u.reviewed.clone(),
                commits: u
                    .commits
                    .iter()
                    .map(|c| {
                        printable(&format!(
                            "{} {}: {}",
                            shared::text::short_id(&c.id),
                            c.author,
                            c.summary
                        ))
                    })
                    .chain((u.more_commits > 0).then(|| format!("... and {} more commit(s)", u.more_commits)))
                    .collect(),
                changes: u.changes.iter().map(|c| (printable(&c.path), c.status)).collect(),
                patch: printable_multiline(&u.patch),
            }),
            check: r.check.iter().map(|d| printable(&d.to_string())).collect(),
            history: printable(&format!(
                "{} recorded call(s) from {}{}",
                r.history.calls,
                r.history.database,
                r.history
                    .since
                    .as_deref()
                    .map(|s| format!(" since {s}"))
                    .unwrap_or_default()
            )),
            delta: r
                .capability_delta
                .iter()
                .map(|g| Delta {
                    before: printable(g.rule_before.as_deref().unwrap_or("(no rule)")),
                    after: printable(g.rule_after.as_deref().unwrap_or("(no rule)")),
                    from: decision_name(g.from),
                    to: decision_name(g.to),
                    count: g.count,
                    calls: g
                        .calls
                        .iter()
                        .take(20)
                        .map(|c| printable(&format!("{} {} {}: {}", c.run_id, c.call_id, c.tool, c.command_or_path)))
                        .collect(),
                })
                .collect(),
            evals: r
                .evals
                .rows
                .iter()
                .map(|row| EvalRow {
                    case: printable(&row.case),
                    revision: row.revision,
                    passed: format!("{}/{}", row.run.passed, row.run.runs),
                    failed: row.failed,
                    steps: row.run.steps,
                    calls: row.run.tool_calls,
                    tokens: row.run.tokens,
                    cost: format!("{:.4}", row.run.cost_usd),
                    denials: row.run.denials,
                    ms: row.run.duration_ms,
                })
                .collect(),
            failures: r
                .evals
                .summary
                .failures
                .iter()
                .map(|f| {
                    printable(&format!(
                        "FAIL {} ({}): {}: {}{}",
                        f.case,
                        f.file,
                        f.assertion,
                        f.detail,
                        if f.regression { " [regression]" } else { "" }
                    ))
                })
                .collect(),
            fixes: r
                .fixes
                .iter()
                .map(|f| {
                    printable(&format!(
                        "{}: {} ({})",
                        f.card,
                        f.method,
                        if f.shown { "shown" } else { "not shown" }
                    ))
                })
                .collect(),
        })
    })
}

fn decision_name(d: shared::policy::Decision) -> String {
    match d {
        shared::policy::Decision::Allow => "allow",
        shared::policy::Decision::Ask => "ask",
        shared::policy::Decision::Deny => "deny",
    }
    .into()
}

/// The approve form.
#[derive(serde::Deserialize)]
pub struct ApproveForm {
    csrf: String,
    name: String,
    /// The head the page showed: a proposal moved since is refused, not approved.
    head: Option<String>,
}

/// What an approval recorded (the JSON twin of the form's answer).
#[derive(serde::Serialize)]
struct Approved {
    proposal: String,
    approval: String,
    approver: String,
    tree: String,
    signed: bool,
}

pub async fn approve(State(app): State<Arc<App>>, wants: Wants, Form(form): Form<ApproveForm>) -> Response {
    if !app.csrf_ok(&form.csrf) {
        return PageError::new(
            StatusCode::FORBIDDEN,
            "the form's CSRF token is not this server's: reload the page",
        )
        .render(wants);
    }
    let Some(Ok(head)) = form.head.as_deref().map(git2::Oid::from_str) else {
        return PageError::new(
            StatusCode::BAD_REQUEST,
            "the form names no proposal head: reload the page",
        )
        .render(wants);
    };
    let name = form.name.clone();
    let done = blocking(&app, move |app| {
        let wt = shared::git::open_work_tree(&app.root).map_err(PageError::from_display)?;
        // Exactly `builder approve <name>` as the person running the server, without
        // --push: publishing the approval stays a separate step.
        let how = crate::commands::approve::Approving {
            reviewer: None,
            reviewer_flag: false,
            key: None,
            push: false,
            remote: None,
            seen: Some(shared::review::reviewed::Seen {
                head,
                from: shared::review::reviewed::SeenFrom::Page,
            }),
        };
        let a = crate::commands::approve::approve_proposal(&wt, &form.name, how)
            .map_err(PageError::from_display)?
            .approved
            .approval;
        Ok(Approved {
            proposal: form.name.clone(),
            approval: a.id.to_string(),
            approver: a.body.approver.to_string(),
            tree: a.body.tree.to_string(),
            signed: a.body.signature.is_some(),
        })
    })
    .await;
    match (done, wants) {
        (Err(e), _) => e.render(wants),
        (Ok(a), Wants::Json) => axum::Json(a).into_response(),
        (Ok(a), Wants::Html) => {
            let q = url::form_urlencoded::Serializer::new(String::new())
                .append_pair("name", &name)
                .append_pair("approved", &a.approval)
                .finish();
            Redirect::to(&format!("/proposal?{q}")).into_response()
        }
    }
}
