//! The run list of `builder serve`: runs filtered by task, health (failed, needs
//! attention, ok), day and prompt version, newest first, a page at a time, with the
//! count of each health under the same filter. Pages are keyset-paged (the cursor is
//! the last row's start time and id), so the hundredth page reads as few rows as the
//! first; each filter is added to the SQL only when given, so SQLite can use the
//! index that fits it (`runs_task`, `runs_started`, `runs_version`).

use crate::records::{named, RunStatus};
use crate::runs::{prefix_end, row_to_run, RunSummary, RUN_COLUMNS};
use crate::store::{Store, StoreError};
use rusqlite::types::ToSql;
use serde::{Deserialize, Serialize};

/// How a run went, as the run list groups it: the three answers cron's exit codes
/// give (section 7 of the design: failed, needs attention, ok).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash, strum::IntoStaticStr, strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
#[serde(into = "&'static str", try_from = "String")]
pub enum Health {
    /// Failed, cancelled or crashed.
    Failed,
    /// Waiting for an approval, still running, or finished with cards written.
    Attention,
    /// Accepted, completed or skipped, with no card.
    Ok,
}

impl Health {
    /// The health of a run with `status` that wrote cards or not.
    pub fn of(status: RunStatus, has_cards: bool) -> Health {
        match status {
            RunStatus::Failed | RunStatus::Cancelled | RunStatus::Crashed => Health::Failed,
            RunStatus::WaitingApproval | RunStatus::Running => Health::Attention,
            RunStatus::Accepted | RunStatus::Completed | RunStatus::Skipped => {
                if has_cards {
                    Health::Attention
                } else {
                    Health::Ok
                }
            }
        }
    }
}

named!(Health, "run health");

/// The statuses whose health is `health` whatever the cards say (`with_cards`
/// false), or only when the run wrote cards, as an SQL list of names.
fn statuses_sql(pick: impl Fn(RunStatus) -> bool) -> String {
    let names: Vec<String> = <RunStatus as crate::records::Named>::ALL
        .iter()
        .copied()
        .filter(|s| pick(*s))
        .map(|s| format!("'{}'", s.as_str()))
        .collect();
    if names.is_empty() {
        "NULL".into()
    } else {
        names.join(", ")
    }
}

/// The SQL condition on `runs r` selecting runs of `health`.
fn health_sql(health: Health) -> String {
    // Statuses whose health depends on whether the run wrote cards.
    let card_dependent = |s: RunStatus| Health::of(s, false) != Health::of(s, true);
    let has_cards = "EXISTS (SELECT 1 FROM cards c WHERE c.run_id = r.run_id)";
    let fixed = statuses_sql(|s| !card_dependent(s) && Health::of(s, false) == health);
    let when_no_cards = statuses_sql(|s| card_dependent(s) && Health::of(s, false) == health);
    let when_cards = statuses_sql(|s| card_dependent(s) && Health::of(s, true) == health);
    // `+r.status`: walk the runs newest first (`runs_started`) and stop at a page,
    // rather than gather every run of the statuses (`runs_status`) and sort them.
    format!(
        "(+r.status IN ({fixed}) OR (+r.status IN ({when_no_cards}) AND NOT {has_cards}) OR (+r.status IN ({when_cards}) AND {has_cards}))"
    )
}

/// Where a page of runs ends: the last row's start time and id. Its text form
/// (`<started_at>|<run_id>`) is what links carry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Cursor {
    pub started_at: String,
    pub run_id: String,
}

impl Cursor {
    pub fn parse(s: &str) -> Option<Cursor> {
        let (started_at, run_id) = s.split_once('|')?;
        (!started_at.is_empty() && !run_id.is_empty()).then(|| Cursor {
            started_at: started_at.to_string(),
            run_id: run_id.to_string(),
        })
    }

    pub fn text(&self) -> String {
        format!("{}|{}", self.started_at, self.run_id)
    }
}

/// What the run list shows.
#[derive(Debug, Clone, Default)]
pub struct RunsQuery {
    pub task: Option<String>,
    pub health: Option<Health>,
    /// Runs started on this day (UTC).
    pub day: Option<chrono::NaiveDate>,
    /// The prompt's blob id, or a prefix of it.
    pub prompt: Option<String>,
    /// Only runs older than this (the next page).
    pub after: Option<Cursor>,
    pub limit: usize,
}

/// One row of the run list: the row `builder history runs --json` prints, with the
/// run's health and how many cards it wrote.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RunRow {
    #[serde(flatten)]
    pub run: RunSummary,
    pub health: Health,
    pub cards: i64,
    /// Its receipt came in a forged commit (`builder history runs` marks it `FORGED`;
    /// `builder audit` says why).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub forged: bool,
}

/// Runs under the filter (day, task, prompt; health aside) by health.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct HealthCounts {
    pub failed: i64,
    pub attention: i64,
    pub ok: i64,
}

impl HealthCounts {
    pub fn total(&self) -> i64 {
        self.failed + self.attention + self.ok
    }
}

/// One page of the run list.
#[derive(Debug, Clone, Serialize)]
pub struct RunsPage {
    pub runs: Vec<RunRow>,
    pub counts: HealthCounts,
    /// The cursor of the next page (`None`: this is the last).
    pub next: Option<String>,
}

/// The SQL conditions of the filters but health and the cursor, with their values.
fn filters(q: &RunsQuery) -> (Vec<String>, Vec<Box<dyn ToSql>>) {
    let mut cond = Vec::new();
    let mut args: Vec<Box<dyn ToSql>> = Vec::new();
    let arg = |c: &str, v: Box<dyn ToSql>, args: &mut Vec<Box<dyn ToSql>>| {
        args.push(v);
        c.replace('?', &format!("?{}", args.len()))
    };
    if let Some(t) = &q.task {
        cond.push(arg("r.task = ?", Box::new(t.clone()), &mut args));
    }
    if let Some(d) = q.day {
        let next = d.succ_opt().unwrap_or(d);
        cond.push(arg(
            "r.started_at >= ?",
            Box::new(d.format("%Y-%m-%d").to_string()),
            &mut args,
        ));
        cond.push(arg(
            "r.started_at < ?",
            Box::new(next.format("%Y-%m-%d").to_string()),
            &mut args,
        ));
    }
    if let Some(p) = &q.prompt {
        cond.push(arg("r.prompt_blob >= ?", Box::new(p.clone()), &mut args));
        cond.push(arg("r.prompt_blob < ?", Box::new(prefix_end(p)), &mut args));
    }
    (cond, args)
}

fn where_clause(cond: &[String]) -> String {
    if cond.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", cond.join(" AND "))
    }
}

/// A page of runs under `q`, and the counts per health under its filters.
pub fn runs_page(store: &Store, q: &RunsQuery) -> Result<RunsPage, StoreError> {
    let (mut cond, mut args) = filters(q);
    let counts = health_counts(store, &cond, &args)?;
    if let Some(h) = q.health {
        cond.push(health_sql(h));
    }
    if let Some(c) = &q.after {
        args.push(Box::new(c.started_at.clone()));
        args.push(Box::new(c.run_id.clone()));
        cond.push(format!(
            "(r.started_at, r.run_id) < (?{}, ?{})",
            args.len() - 1,
            args.len()
        ));
    }
    let limit = q.limit.max(1);
    args.push(Box::new((limit + 1) as i64));
    let sql = format!(
        "SELECT {RUN_COLUMNS}, (SELECT count(*) FROM cards c WHERE c.run_id = r.run_id), EXISTS (SELECT 1 FROM forged_records f WHERE f.path IN (r.receipt_path, r.report_path)) FROM runs r {} ORDER BY r.started_at DESC, r.run_id DESC LIMIT ?{}",
        where_clause(&cond),
        args.len()
    );
    let params: Vec<&dyn ToSql> = args.iter().map(|a| a.as_ref()).collect();
    let mut runs = store.query_all(&sql, params.as_slice(), |r| {
        let run = row_to_run(r)?;
        let cards: i64 = r.get(13)?;
        Ok(RunRow {
            health: Health::of(run.status, cards > 0),
            run,
            cards,
            forged: r.get(14)?,
        })
    })?;
    let next = (runs.len() > limit).then(|| {
        runs.truncate(limit);
        runs.last().map(|r| {
            Cursor {
                started_at: r.run.started_at.clone(),
                run_id: r.run.run_id.clone(),
            }
            .text()
        })
    });
    Ok(RunsPage {
        runs,
        counts,
        next: next.flatten(),
    })
}

/// Runs under the filters by health: one count by status, one count by status of
/// the runs that wrote cards (the cards table is the smaller side of that join).
fn health_counts(store: &Store, cond: &[String], args: &[Box<dyn ToSql>]) -> Result<HealthCounts, StoreError> {
    let params: Vec<&dyn ToSql> = args.iter().map(|a| a.as_ref()).collect();
    let by_status: Vec<(RunStatus, i64)> = store.query_all(
        &format!(
            "SELECT r.status, count(*) FROM runs r {} GROUP BY r.status",
            where_clause(cond)
        ),
        params.as_slice(),
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let with_cards: Vec<(RunStatus, i64)> = store.query_all(
        &format!(
            "SELECT r.status, count(*) FROM runs r WHERE r.run_id IN (SELECT DISTINCT run_id FROM cards) {} GROUP BY r.status",
            cond.iter().map(|c| format!("AND {c}")).collect::<Vec<_>>().join(" ")
        ),
        params.as_slice(),
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    let mut counts = HealthCounts::default();
    for (status, n) in by_status {
        let carded = with_cards.iter().find(|(s, _)| *s == status).map_or(0, |(_, n)| *n);
        for (has_cards, n) in [(false, n - carded), (true, carded)] {
            match Health::of(status, has_cards) {
                Health::Failed => counts.failed += n,
                Health::Attention => counts.attention += n,
                Health::Ok => counts.ok += n,
            }
        }
    }
    Ok(counts)
}

/// One version of a task's prompt and the runs made on it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PromptVersion {
    pub prompt_blob: Option<String>,
    pub runs: i64,
    pub first_run: String,
    pub last_run: String,
}

/// The prompt versions `task`'s runs were made on, the newest first.
pub fn prompt_versions(store: &Store, task: &str) -> Result<Vec<PromptVersion>, StoreError> {
    store.query_all(
        "SELECT prompt_blob, count(*), min(started_at), max(started_at) FROM runs WHERE task = ?1 GROUP BY prompt_blob ORDER BY max(started_at) DESC",
        [task],
        |r| {
            Ok(PromptVersion {
                prompt_blob: r.get(0)?,
                runs: r.get(1)?,
                first_run: r.get(2)?,
                last_run: r.get(3)?,
            })
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{check_names, Card, CardKind, Receipt, StopReason};

    fn add(store: &mut Store, n: usize, task: &str, status: RunStatus, card: bool) {
        let mut r: Receipt = crate::records::tests::sample_receipt();
        r.run_id = format!("run-{n:04}");
        r.task = task.into();
        r.status = status;
        r.stop_reason = StopReason::FinalAnswer;
        r.started_at += chrono::Duration::hours(n as i64);
        r.inputs.prompt = Some(format!("{:040x}", n % 2));
        let path = format!("runs/{task}/{n}.json");
        store
            .write(|tx| {
                crate::store::insert_run(tx, &r, &path, None)?;
                if card {
                    let c = Card::new(CardKind::MaxSteps, task, &r.run_id, "s", "d", vec![], r.started_at);
                    tx.execute(
                        "INSERT INTO cards (id, fingerprint, kind, task, run_id, created_at, status, summary, path) VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'open', 's', 'p')",
                        rusqlite::params![format!("card-{n}"), c.fingerprint, c.kind.as_str(), task, r.run_id, c.created_at.to_rfc3339()],
                    )?;
                }
                Ok(())
            })
            .unwrap();
    }

    fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::history::open_store(dir.path()).unwrap();
        (dir, store)
    }

    #[test]
    fn health_names_stay() {
        check_names(&[
            (Health::Failed, "failed"),
            (Health::Attention, "attention"),
            (Health::Ok, "ok"),
        ]);
    }

    /// Eleven runs: 0..9 over tasks `a` and `b`, every third failed, every fourth
    /// ok run wrote a card; 10 waits for an approval.
    fn eleven_runs() -> (tempfile::TempDir, Store) {
        let (d, mut s) = store();
        for n in 0..10 {
            let status = if n % 3 == 0 {
                RunStatus::Failed
            } else {
                RunStatus::Accepted
            };
            add(&mut s, n, if n < 5 { "a" } else { "b" }, status, n % 4 == 1);
        }
        add(&mut s, 10, "a", RunStatus::WaitingApproval, false);
        (d, s)
    }

    /// Each health filter keeps only runs of that health, as many as its count.
    fn assert_health_filters_match_counts(s: &Store, counts: &HealthCounts) {
        for h in [Health::Failed, Health::Attention, Health::Ok] {
            let page = runs_page(
                s,
                &RunsQuery {
                    health: Some(h),
                    limit: 100,
                    ..Default::default()
                },
            )
            .unwrap();
            assert!(page.runs.iter().all(|r| r.health == h), "{h}: {:?}", page.runs);
            let want = match h {
                Health::Failed => counts.failed,
                Health::Attention => counts.attention,
                Health::Ok => counts.ok,
            };
            assert_eq!(page.runs.len() as i64, want, "{h}");
        }
    }

    /// The run ids of every page of `limit` runs, following each page's cursor.
    fn ids_page_by_page(s: &Store, limit: usize) -> Vec<String> {
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let page = runs_page(
                s,
                &RunsQuery {
                    after: after.clone(),
                    limit,
                    ..Default::default()
                },
            )
            .unwrap();
            seen.extend(page.runs.iter().map(|r| r.run.run_id.clone()));
            match page.next {
                Some(n) => after = Cursor::parse(&n),
                None => break,
            }
        }
        seen
    }

    #[test]
    fn runs_are_filtered_by_health_counted_and_keyset_paged() {
        let (_d, s) = eleven_runs();
        let all = runs_page(
            &s,
            &RunsQuery {
                limit: 100,
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(all.runs.len(), 11);
        assert_eq!(all.runs[0].run.run_id, "run-0010", "newest first");
        // Failed: 0, 3, 6, 9. Attention: 1, 5 (ok with a card; 9 is failed anyway), 10.
        assert_eq!(
            all.counts,
            HealthCounts {
                failed: 4,
                attention: 3,
                ok: 4
            }
        );
        assert_health_filters_match_counts(&s, &all.counts);
        // Pages of 3 cover every run once, in order.
        let seen = ids_page_by_page(&s, 3);
        let want: Vec<String> = all.runs.iter().map(|r| r.run.run_id.clone()).collect();
        assert_eq!(seen, want);
        // Task and prompt filters, and counts under them.
        let a = runs_page(
            &s,
            &RunsQuery {
                task: Some("a".into()),
                prompt: Some(format!("{:039x}1", 0)),
                limit: 100,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(
            a.runs
                .iter()
                .all(|r| r.run.task == "a" && r.run.run_id.ends_with(['1', '3'])),
            "{:?}",
            a.runs
        );
        assert_eq!(a.counts.total(), 2);
        // A day with no runs.
        let none = runs_page(
            &s,
            &RunsQuery {
                day: chrono::NaiveDate::from_ymd_opt(1999, 1, 1),
                limit: 10,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(none.runs.is_empty() && none.counts.total() == 0 && none.next.is_none());
        let versions = prompt_versions(&s, "a").unwrap();
        assert_eq!(versions.iter().map(|v| v.runs).sum::<i64>(), 6);
    }
}
