//! The retro page (`/retro`): `builder retro`'s summary since a date (default: the
//! last retro, else seven days back), with its chart inline as SVG. A look, as the
//! command's stdout is: the last-retro mark does not move.

use super::{blocking, non_empty, printable, printable_multiline, respond, App, Layout, PageError, Wants};
use axum::extract::{Query, State};
use axum::response::Response;
use chrono::{Duration, Utc};
use shared::history;
use std::collections::HashMap;
use std::sync::Arc;

/// The retro (its JSON twin: the markdown and the chart, as `builder retro -o` writes them).
#[derive(serde::Serialize)]
pub struct RetroData {
    since: String,
    until: String,
    markdown: String,
    svg: String,
}

#[derive(askama::Template)]
#[template(path = "retro.html")]
struct RetroHtml {
    l: Layout,
    since: String,
    markdown: String,
    /// Made by `shared::retro` from numbers and dates, text escaped there.
    svg: String,
}

pub async fn page(State(app): State<Arc<App>>, wants: Wants, Query(q): Query<HashMap<String, String>>) -> Response {
    let q = non_empty(q);
    let data = blocking(&app, move |app| {
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
        app.with_index(true, |ix| {
            let now = Utc::now();
            let since = match since {
                Some(s) => s,
                None => history::get_meta(&ix.store, "last_retro")
                    .map_err(PageError::from_display)?
                    .unwrap_or_else(|| (now - Duration::days(7)).to_rfc3339()),
            };
            let until = now.to_rfc3339();
            let retro =
                shared::retro::build(&ix.store, &since, &until, "retro.svg").map_err(PageError::from_display)?;
            Ok(RetroData {
                since,
                until,
                markdown: retro.markdown,
                svg: retro.svg,
            })
        })
    })
    .await;
    let layout = Layout::of(&app, "Retro");
    respond(wants, data, move |d| {
        askama::Template::render(&RetroHtml {
            l: layout,
            since: printable(&d.since),
            markdown: printable_multiline(&d.markdown),
            svg: d.svg,
        })
    })
}
