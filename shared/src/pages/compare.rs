//! What `builder serve`'s compare page puts side by side. Two runs: `history diff`'s
//! [`RunDiff`] (inputs with their text diff, metrics, report diff) and their tool
//! calls in order, row against row. Two versions of a task: the input versions its
//! runs were made on (prompt, scope and settings blobs), picked from the index, and
//! `history compare`'s [`Comparison`] of the runs on each. "Different only" is a
//! flag on each row, for the page to hide the same ones.

use super::run::CallRow;
use crate::history::{Comparison, HistoryError, InputVersion, RunDiff};
use crate::records::RecordedDecision;
use crate::store::{Store, StoreError};
use serde::Serialize;

/// Calls of each run a side-by-side page lists.
pub const CALL_ROWS: usize = 500;

/// Row `seq` of two runs' calls.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CallPair {
    pub seq: i64,
    pub a: Option<CallRow>,
    pub b: Option<CallRow>,
    /// Both runs made the same call here (tool, decision, outcome).
    pub same: bool,
}

/// Two runs side by side.
#[derive(Debug, Clone, Serialize)]
pub struct RunsCompared {
    #[serde(flatten)]
    pub diff: RunDiff,
    /// The first [`CALL_ROWS`] calls of each, row against row.
    pub calls: Vec<CallPair>,
}

/// Runs `a` and `b` (ids or unique prefixes) side by side; `None` when either is not
/// exactly one indexed run.
pub fn runs(repo: &git2::Repository, store: &Store, a: &str, b: &str) -> Result<Option<RunsCompared>, HistoryError> {
    let Some(diff) = crate::history::diff(repo, store, a, b)? else {
        return Ok(None);
    };
    let left = calls(store, &diff.a.run_id)?;
    let right = calls(store, &diff.b.run_id)?;
    let n = left.len().max(right.len());
    let mut left = left.into_iter();
    let mut right = right.into_iter();
    let pairs = (0..n)
        .map(|i| {
            let (a, b) = (left.next(), right.next());
            let same = match (&a, &b) {
                (Some(x), Some(y)) => x.name == y.name && x.decision == y.decision && x.outcome == y.outcome,
                _ => false,
            };
            CallPair {
                seq: i as i64,
                a,
                b,
                same,
            }
        })
        .collect();
    Ok(Some(RunsCompared { diff, calls: pairs }))
}

fn calls(store: &Store, run_id: &str) -> Result<Vec<CallRow>, StoreError> {
    store.query_all(
        "SELECT step, call_id, name, decision, rule, reason, outcome, duration_ms FROM tool_calls WHERE run_id = ?1 ORDER BY call_id LIMIT ?2",
        rusqlite::params![run_id, CALL_ROWS as i64],
        |r| {
            let call_id: String = r.get(1)?;
            Ok(CallRow {
                seq: r.get(0)?,
                call_id: call_id.split_once('-').map_or(call_id.clone(), |(_, id)| id.to_string()),
                name: r.get(2)?,
                decision: r.get::<_, RecordedDecision>(3)?,
                rule: r.get(4)?,
                reason: r.get(5)?,
                outcome: r.get(6)?,
                duration_ms: r.get(7)?,
            })
        },
    )
}

/// One input version of a task and its runs.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct VersionRow {
    /// The version's text form (`<prompt>.<scope>.<settings>`, `-` for none), as
    /// links carry it.
    pub key: String,
    #[serde(flatten)]
    pub version: InputVersion,
    pub runs: i64,
    pub first_run: String,
    pub last_run: String,
}

/// The text form of a version's files.
pub fn version_key(v: &InputVersion) -> String {
    let part = |b: &Option<String>| b.clone().unwrap_or_else(|| "-".into());
    format!(
        "{}.{}.{}",
        part(&v.prompt_blob),
        part(&v.scope_blob),
        part(&v.settings_blob)
    )
}

/// The files a version key names (`None` when it is not one).
pub fn parse_version_key(key: &str) -> Option<InputVersion> {
    let mut parts = key.split('.');
    let mut next = || -> Option<Option<String>> {
        let p = parts.next()?;
        if p == "-" {
            return Some(None);
        }
        (p.len() == 40 && p.bytes().all(|b| b.is_ascii_hexdigit())).then(|| Some(p.to_string()))
    };
    let v = InputVersion {
        prompt_blob: next()?,
        scope_blob: next()?,
        settings_blob: next()?,
        model: None,
    };
    parts.next().is_none().then_some(v)
}

/// The input versions `task`'s runs were made on, the newest first (the
/// `runs_version` index serves it).
pub fn versions(store: &Store, task: &str) -> Result<Vec<VersionRow>, StoreError> {
    store.query_all(
        "SELECT prompt_blob, scope_blob, settings_blob, count(*), min(started_at), max(started_at) FROM runs WHERE task = ?1
         GROUP BY prompt_blob, scope_blob, settings_blob ORDER BY max(started_at) DESC",
        [task],
        |r| {
            let version = InputVersion {
                prompt_blob: r.get(0)?,
                scope_blob: r.get(1)?,
                settings_blob: r.get(2)?,
                model: None,
            };
            Ok(VersionRow {
                key: version_key(&version),
                version,
                runs: r.get(3)?,
                first_run: r.get(4)?,
                last_run: r.get(5)?,
            })
        },
    )
}

/// `history compare` of `task`'s runs on two versions picked by their files
/// (`before`, `after`: version keys, also the sides' names).
pub fn versions_compared(
    store: &Store,
    task: &str,
    before: &InputVersion,
    after: &InputVersion,
    min_runs: i64,
) -> Result<Comparison, HistoryError> {
    let b = crate::history::version_metrics(store, task, &version_key(before), before)?;
    let a = crate::history::version_metrics(store, task, &version_key(after), after)?;
    Ok(crate::history::judge(task, b, a, min_runs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_keys_round_trip_and_refuse_anything_else() {
        let v = InputVersion {
            prompt_blob: Some("a".repeat(40)),
            scope_blob: None,
            settings_blob: Some("0123456789".repeat(4)),
            model: None,
        };
        assert_eq!(parse_version_key(&version_key(&v)), Some(v));
        for bad in [
            "",
            "x.y.z",
            &format!("{}.-", "a".repeat(40)),
            &format!("{0}.{0}.{0}.{0}", "a".repeat(40)),
        ] {
            assert_eq!(parse_version_key(bad), None, "{bad}");
        }
    }
}
