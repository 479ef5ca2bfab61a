//! The `runs` table, which the runtime's `.runtime/state.db` and the builder's
//! history index both hold: its row type and the queries `runtime runs` / `show` and
//! `builder history` read. It sits below `trace` and `history` so both can use it
//! without one importing the other.

use crate::records::{RunStatus, StopReason};
use crate::store::{Store, StoreError};
use rusqlite::params;
use serde::Serialize;

/// One row of `builder history runs` and `runtime runs`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunSummary {
    pub run_id: String,
    pub task: String,
    pub status: RunStatus,
    pub stop_reason: StopReason,
    pub started_at: String,
    pub steps: i64,
    pub tokens: i64,
    pub cost_usd: f64,
    pub duration_ms: i64,
    pub prompt_blob: Option<String>,
    pub commit_id: Option<String>,
    /// `None` for runs that wrote no receipt (skipped fires in the runtime's store).
    pub receipt_path: Option<String>,
    pub report_path: Option<String>,
}

/// The columns [`row_to_run`] reads, in order.
pub(crate) const RUN_COLUMNS: &str = "run_id, task, status, stop_reason, started_at, steps, tokens_in + tokens_out, cost_usd, duration_ms, prompt_blob, commit_id, receipt_path, report_path";

/// Filters for run queries.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub task: Option<String>,
    pub status: Option<RunStatus>,
    pub since: Option<String>,
    pub limit: Option<usize>,
}

pub fn runs(store: &Store, f: &RunFilter) -> Result<Vec<RunSummary>, StoreError> {
    store.query_all(
        &format!("SELECT {RUN_COLUMNS}
             FROM runs WHERE (?1 IS NULL OR task = ?1) AND (?2 IS NULL OR status = ?2) AND (?3 IS NULL OR started_at >= ?3)
             ORDER BY started_at DESC, run_id DESC LIMIT ?4"),
        params![f.task, f.status, f.since, f.limit.map(|l| l as i64).unwrap_or(-1)],
        row_to_run,
    )
}

pub(crate) fn row_to_run(r: &rusqlite::Row) -> rusqlite::Result<RunSummary> {
    Ok(RunSummary {
        run_id: r.get(0)?,
        task: r.get(1)?,
        status: r.get(2)?,
        stop_reason: r.get(3)?,
        started_at: r.get(4)?,
        steps: r.get(5)?,
        tokens: r.get(6)?,
        cost_usd: r.get(7)?,
        duration_ms: r.get(8)?,
        prompt_blob: r.get(9)?,
        commit_id: r.get(10)?,
        receipt_path: r.get(11)?,
        report_path: r.get(12)?,
    })
}

/// One run by id or unique id prefix (a range scan on the primary key, never a
/// table scan: `LIKE` cannot use the index).
pub fn run(store: &Store, id: &str) -> Result<Option<RunSummary>, StoreError> {
    let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE run_id >= ?1 AND run_id < ?2 ORDER BY run_id LIMIT 2");
    let rows = store.query_all(&sql, params![id, prefix_end(id)], row_to_run)?;
    Ok(match rows.as_slice() {
        [one] => Some(one.clone()),
        [first, ..] if first.run_id == id => Some(first.clone()),
        _ => None,
    })
}

/// The smallest string greater than every string starting with `prefix`.
pub fn prefix_end(prefix: &str) -> String {
    format!("{prefix}\u{10FFFF}")
}
