//! The builder's run history: an incremental SQLite index (`.runtime/builder.db`) of
//! the receipts and cards committed to git. Indexing diffs HEAD's tree against the
//! last indexed commit, so only records added or changed since are parsed; card files
//! changed in the work tree (triage not yet committed) are overlaid on top (see
//! `worktree`). Queries for `builder cards`, `builder history` and `builder retro`
//! read the index.

use crate::records::{CardKind, CardStatus, Receipt};
use crate::runs::{run, RunSummary};
use crate::store::{Schema, Store, StoreError, SHARED_HISTORY};
use git2::{Oid, Repository};
use rusqlite::{params, OptionalExtension, Transaction};
use serde::Serialize;
use std::path::Path;

mod worktree;

/// Where the builder keeps its index.
pub const BUILDER_DB: &str = ".runtime/builder.db";

#[derive(Debug, thiserror::Error)]
pub enum HistoryError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    #[error("{path}: {message}")]
    Record { path: String, message: String },
}

/// What one indexing pass did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct IndexStats {
    pub full: bool,
    pub receipts: usize,
    pub cards: usize,
    pub removed: usize,
    pub overlaid_cards: usize,
    pub head: Option<String>,
    /// Records that did not parse (path: reason); they are skipped, not fatal.
    pub skipped: Vec<String>,
    /// Records newly found to have come in a forged runtime commit (one named as the
    /// runtime without a valid signature, `review::runtime_commits`).
    pub forged: usize,
}

/// The history index's schema: the shared beginning, then the builder's own steps.
pub const BUILDER_SCHEMA: Schema = Schema {
    migrations: &[
        SHARED_HISTORY[0],
        SHARED_HISTORY[1],
        SHARED_HISTORY[2],
        // 4: the stat cache of work-tree card files (history::worktree).
        "CREATE TABLE card_files (path TEXT PRIMARY KEY, mtime_ns INTEGER NOT NULL, size INTEGER NOT NULL,
            blob TEXT NOT NULL, dirty INTEGER NOT NULL);",
        // 5: `compare` groups a task's runs by their full input version. The columns
        // (prompt, scope and settings blob ids, model) are filled from every receipt
        // since step 1, so this only indexes them; no re-index is needed.
        "CREATE INDEX runs_version ON runs(task, prompt_blob, scope_blob, settings_blob, model);",
        // 6: `builder serve` pages: the run list newest first over every task, a
        // run's cards (whether a run needs attention, the cards pinned on its page),
        // and the retro's denied and slowest calls without a pass over every call.
        // (`runs_started` covered the retro's sums per day until step 8's rollup.)
        "CREATE INDEX runs_started ON runs(started_at, run_id, tokens_in, tokens_out, cost_usd);
         CREATE INDEX runs_status ON runs(status, started_at);
         CREATE INDEX runs_duration ON runs(duration_ms);
         CREATE INDEX cards_run ON cards(run_id);
         CREATE INDEX tool_calls_decision ON tool_calls(decision);
         CREATE INDEX tool_calls_duration ON tool_calls(duration_ms, run_id);",
        // 7: records that came in a forged runtime commit (the commit, and why).
        "CREATE TABLE forged_records (path TEXT PRIMARY KEY, commit_id TEXT NOT NULL, why TEXT NOT NULL);",
        // 8: the retro over 100,000 runs. Runs per day and status with their tokens
        // and cost (`run_days`), kept by triggers as rows come and go, so the retro's
        // counts and chart add up days instead of every run (see `retro`). A receipt
        // indexed again is `INSERT OR REPLACE`, whose delete fires no delete trigger
        // (recursive triggers are off): the row it replaces is taken out before the
        // insert instead. And covering indexes for the top cards (each group's newest
        // card) and the denied calls of the window.
        "CREATE TABLE run_days (day TEXT NOT NULL, status TEXT NOT NULL, runs INTEGER NOT NULL,
            tokens INTEGER NOT NULL, cost_usd REAL NOT NULL, PRIMARY KEY (day, status)) WITHOUT ROWID;
         INSERT INTO run_days SELECT substr(started_at, 1, 10), status, count(*), sum(tokens_in + tokens_out), sum(cost_usd)
            FROM runs GROUP BY 1, 2;
         CREATE TRIGGER run_days_replaced BEFORE INSERT ON runs BEGIN
            UPDATE run_days SET runs = runs - 1, tokens = tokens - o.old_tokens, cost_usd = cost_usd - o.old_cost
            FROM (SELECT substr(started_at, 1, 10) AS old_day, status AS old_status,
                         tokens_in + tokens_out AS old_tokens, cost_usd AS old_cost
                  FROM runs WHERE run_id = NEW.run_id) AS o
            WHERE day = o.old_day AND status = o.old_status;
         END;
         CREATE TRIGGER run_days_added AFTER INSERT ON runs BEGIN
            INSERT INTO run_days VALUES (substr(NEW.started_at, 1, 10), NEW.status, 1, NEW.tokens_in + NEW.tokens_out, NEW.cost_usd)
            ON CONFLICT (day, status) DO UPDATE SET runs = runs + 1, tokens = tokens + excluded.tokens,
                cost_usd = cost_usd + excluded.cost_usd;
         END;
         CREATE TRIGGER run_days_removed AFTER DELETE ON runs BEGIN
            UPDATE run_days SET runs = runs - 1, tokens = tokens - (OLD.tokens_in + OLD.tokens_out), cost_usd = cost_usd - OLD.cost_usd
            WHERE day = substr(OLD.started_at, 1, 10) AND status = OLD.status;
         END;
         CREATE TRIGGER run_days_changed AFTER UPDATE OF started_at, status, tokens_in, tokens_out, cost_usd ON runs BEGIN
            UPDATE run_days SET runs = runs - 1, tokens = tokens - (OLD.tokens_in + OLD.tokens_out), cost_usd = cost_usd - OLD.cost_usd
            WHERE day = substr(OLD.started_at, 1, 10) AND status = OLD.status;
            INSERT INTO run_days VALUES (substr(NEW.started_at, 1, 10), NEW.status, 1, NEW.tokens_in + NEW.tokens_out, NEW.cost_usd)
            ON CONFLICT (day, status) DO UPDATE SET runs = runs + 1, tokens = tokens + excluded.tokens,
                cost_usd = cost_usd + excluded.cost_usd;
         END;
         CREATE INDEX cards_fp_time ON cards(fingerprint, created_at, id);
         DROP INDEX tool_calls_decision;
         CREATE INDEX tool_calls_denied ON tool_calls(decision, run_id, name, rule, reason);
         CREATE INDEX runs_id_started ON runs(run_id, started_at);",
    ],
};

/// Opens the builder's index. The index holds nothing git and the card files do not:
/// a damaged one (not a database, corrupt) is moved aside, with a warning, and built
/// again from them.
pub fn open_store(root: &Path) -> Result<Store, StoreError> {
    let path = root.join(BUILDER_DB);
    match Store::open(&path, BUILDER_SCHEMA) {
        Err(e) if e.is_damage() => {
            let aside = path.with_extension(format!("db.damaged-{}", chrono::Utc::now().format("%Y%m%dT%H%M%SZ")));
            tracing::warn!(error = %e, moved_to = %aside.display(), "the builder's index was damaged: it is built again from git");
            std::fs::rename(&path, &aside).map_err(|source| StoreError::Io {
                path: path.display().to_string(),
                source,
            })?;
            for side in ["-wal", "-shm"] {
                let mut p = path.clone().into_os_string();
                p.push(side);
                let _ = std::fs::remove_file(p);
            }
            Store::open(&path, BUILDER_SCHEMA)
        }
        other => other,
    }
}

fn meta(tx: &rusqlite::Connection, key: &str) -> rusqlite::Result<Option<String>> {
    tx.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
        .optional()
}

pub fn get_meta(store: &Store, key: &str) -> Result<Option<String>, StoreError> {
    meta(store.conn(), key).map_err(store.sql_error())
}

pub fn set_meta(store: &mut Store, key: &str, value: &str) -> Result<(), StoreError> {
    store.write(|tx| {
        tx.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)",
            params![key, value],
        )
        .map(|_| ())
    })
}

/// Records written by one index run past which the log is checkpointed right away
/// (a first index over a large history), so the next incremental index stays small.
const LARGE_INDEX_WRITE: usize = 5_000;

/// Brings the index up to date with HEAD (and the work tree's card files).
/// `progress(done, total)` is called while parsing.
pub fn index(repo: &Repository, store: &mut Store, progress: &dyn Fn(u64, u64)) -> Result<IndexStats, HistoryError> {
    crate::git::tune_for_history_walks();
    let mut stats = IndexStats::default();
    let head = match repo.head().ok().and_then(|h| h.peel_to_commit().ok()) {
        Some(c) => c,
        None => return Ok(stats),
    };
    stats.head = Some(head.id().to_string());
    let last = get_meta(store, "indexed_commit")?;
    if last.as_deref() != Some(head.id().to_string().as_str()) {
        let old_tree = last
            .as_deref()
            .and_then(|l| Oid::from_str(l).ok())
            .and_then(|o| repo.find_commit(o).ok())
            .map(|c| c.tree_id());
        stats.full = old_tree.is_none();
        let changes: Vec<(String, Option<Oid>)> =
            crate::git::diff_trees(repo, old_tree, Some(head.tree_id()), &["runs", "cards"])?
                .into_iter()
                .map(|c| (c.path, c.new.map(|(oid, _)| oid)))
                .collect();
        let total = changes.len() as u64;
        let head_id = head.id().to_string();
        let path = store.path().to_string();
        store
            .write(|tx| {
                for (i, (p, blob)) in changes.iter().enumerate() {
                    if i % 512 == 0 {
                        progress(i as u64, total);
                    }
                    match blob {
                        None => stats.removed += remove_record(tx, p)?,
                        Some(oid) => {
                            let Ok(b) = repo.find_blob(*oid) else { continue };
                            match upsert_record(tx, p, b.content()) {
                                Ok(Some(RecordKind::Receipt)) => stats.receipts += 1,
                                Ok(Some(RecordKind::Card)) => stats.cards += 1,
                                Ok(None) => {}
                                Err(RecordError::Parse(m)) => stats.skipped.push(format!("{p}: {m}")),
                                Err(RecordError::Sql(e)) => return Err(e),
                            }
                        }
                    }
                }
                progress(total, total);
                tx.execute(
                    "INSERT OR REPLACE INTO meta (key, value) VALUES ('indexed_commit', ?1)",
                    [&head_id],
                )?;
                Ok(())
            })
            .map_err(|e| match e {
                StoreError::Sqlite { source, .. } => HistoryError::Store(StoreError::Sqlite { path, source }),
                other => HistoryError::Store(other),
            })?;
        if changes.len() >= LARGE_INDEX_WRITE {
            store.checkpoint()?;
        }
    }
    stats.forged = mark_forged(repo, store, head.id())?;
    Ok(stats)
}

/// The meta key of the commit the forged-records walk reached. Its name changed when
/// people's receipts joined runtime-named commits in the walk, again when reports
/// joined receipts and cards, and again when people's cards, fallback reports and
/// runtime-named commits merged in from an old base joined, so an index made before
/// walks all of history again.
const FORGED_WALKED_TO: &str = "records_and_cards_judged_to";

/// Walks the commits since the last walk (all of them the first time) for commits
/// named as the runtime whose settings name a signing key and which carry no valid
/// runtime signature (the judge `builder audit` uses), and for commits of people that
/// add or rewrite a receipt or a run's report ([`crate::review::runtime_commits::record_written_by_a_person`]),
/// and remembers the records each wrote as forged. Returns how many records were
/// marked.
fn mark_forged(repo: &Repository, store: &mut Store, head: Oid) -> Result<usize, HistoryError> {
    let last = get_meta(store, FORGED_WALKED_TO)?.and_then(|l| Oid::from_str(&l).ok());
    if last == Some(head) {
        return Ok(0);
    }
    let runtime = crate::review::runtime_commits::runtime_identity_of(repo, &repo.find_commit(head)?.tree()?)?;
    let (name, email) = (runtime.name, runtime.email);
    let mut walk = repo.revwalk()?;
    walk.push(head)?;
    if let Some(l) = last.filter(|l| repo.find_commit(*l).is_ok()) {
        walk.hide(l)?;
    }
    let mut judge = crate::review::runtime_commits::RuntimeSignatures::new(repo);
    // A commit merged in from an old base is held to the key of the history it came
    // into too (as `audit` warns).
    let walked: Vec<Oid> = last.filter(|l| repo.find_commit(*l).is_ok()).into_iter().collect();
    let floors = crate::review::runtime_commits::Floors::of(repo, head, &walked)?;
    let mut differ = crate::git::TreeDiffer::open(repo)?;
    let mut marks: Vec<(String, String, String)> = Vec::new();
    for oid in walk {
        let commit = repo.find_commit(oid?)?;
        let runtime_named = crate::review::runtime_commits::runtime_named(&commit, &name, &email);
        let why = if runtime_named {
            let entry: Vec<Oid> = floors.entry(commit.id()).into_iter().collect();
            match judge.judge_under(&commit, &email, &entry)? {
                crate::review::runtime_commits::Authenticity::Forged(why) => why,
                _ => continue,
            }
        } else {
            let author = commit.author();
            format!(
                "written by {} <{}>, a commit not the runtime's",
                author.name().unwrap_or(""),
                author.email().unwrap_or("")
            )
        };
        let parent = commit.parent_ids().next().map(|p| repo.find_commit(p)).transpose()?;
        for c in differ.diff(
            parent.map(|p| p.tree_id()),
            Some(commit.tree_id()),
            &["runs", "cards", "reports"],
        )? {
            let forged = if runtime_named {
                c.kind != crate::git::ChangeKind::Deleted
            } else {
                crate::review::runtime_commits::record_written_by_a_person(repo, &commit, &c, (&name, &email))?
            };
            if forged {
                marks.push((c.path, commit.id().to_string(), why.clone()));
            }
        }
    }
    let head = head.to_string();
    store.write(|tx| {
        for (path, commit, why) in &marks {
            tx.execute(
                "INSERT OR REPLACE INTO forged_records (path, commit_id, why) VALUES (?1, ?2, ?3)",
                params![path, commit, why],
            )?;
        }
        tx.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)",
            [FORGED_WALKED_TO, &head],
        )?;
        Ok(())
    })?;
    Ok(marks.len())
}

/// Whether the run's receipt or report came in a forged commit: (commit, why) of the
/// first that did.
pub fn forged_run(store: &Store, run: &crate::runs::RunSummary) -> Result<Option<(String, String)>, StoreError> {
    for path in [&run.receipt_path, &run.report_path].into_iter().flatten() {
        if let Some(found) = forged_record(store, path)? {
            return Ok(Some(found));
        }
    }
    Ok(None)
}

/// Whether the record at `path` came in a forged runtime commit: (commit, why).
pub fn forged_record(store: &Store, path: &str) -> Result<Option<(String, String)>, StoreError> {
    store
        .conn()
        .query_row(
            "SELECT commit_id, why FROM forged_records WHERE path = ?1",
            [path],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()
        .map_err(store.sql_error())
}

/// Card files changed in the work tree (triage not committed yet, hand edits) win
/// over HEAD, and go back to HEAD's version once the edit is gone; see [`worktree`].
/// Every command that reads cards runs it after [`index`] (a stat of each card file,
/// hashing only what changed), and triage runs it again after writing the files, so
/// the index holds what the files say.
pub fn overlay_worktree_cards(
    repo: &Repository,
    store: &mut Store,
    skipped: &mut Vec<String>,
) -> Result<usize, HistoryError> {
    worktree::overlay(repo, store, skipped)
}

enum RecordKind {
    Receipt,
    Card,
}

enum RecordError {
    Parse(String),
    Sql(rusqlite::Error),
}

impl From<rusqlite::Error> for RecordError {
    fn from(e: rusqlite::Error) -> Self {
        RecordError::Sql(e)
    }
}

fn remove_record(tx: &Transaction, path: &str) -> rusqlite::Result<usize> {
    let a = tx.execute("DELETE FROM runs WHERE receipt_path = ?1", [path])?;
    let b = tx.execute("DELETE FROM cards WHERE path = ?1", [path])?;
    Ok(a + b)
}

/// A card record's path (other files under `cards/`, such as `.gitkeep`, are not).
fn upsert_record(tx: &Transaction, path: &str, bytes: &[u8]) -> Result<Option<RecordKind>, RecordError> {
    if crate::layout::is_receipt_path(path) {
        let r: Receipt =
            serde_json::from_slice(bytes).map_err(|e| RecordError::Parse(format!("line {}: {e}", e.line())))?;
        insert_receipt(tx, &r, path)?;
        Ok(Some(RecordKind::Receipt))
    } else if crate::records::is_card_path(path) {
        let c = crate::records::parse_card(bytes).map_err(|(_, e)| RecordError::Parse(e))?;
        tx.prepare_cached("INSERT OR REPLACE INTO cards (id, fingerprint, kind, task, run_id, created_at, status, summary, path) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)")?
            .execute(params![c.id, c.fingerprint, c.kind.as_str(), c.task, c.run_id, c.created_at.to_rfc3339(), c.status, c.summary, path])?;
        Ok(Some(RecordKind::Card))
    } else {
        Ok(None)
    }
}

pub(crate) fn insert_receipt(tx: &Transaction, r: &Receipt, path: &str) -> rusqlite::Result<()> {
    crate::store::insert_run(tx, r, path, r.outputs.first().map(String::as_str))?;
    tx.prepare_cached("DELETE FROM tool_calls WHERE run_id = ?1")?
        .execute([&r.run_id])?;
    let mut ins = tx.prepare_cached("INSERT OR REPLACE INTO tool_calls (run_id, call_id, step, name, arguments, args_hash, decision, rule, reason, outcome, duration_ms) VALUES (?1, ?2, ?3, ?4, '{}', '', ?5, ?6, ?7, ?8, ?9)")?;
    for (i, c) in r.tool_calls.iter().enumerate() {
        ins.execute(params![
            r.run_id,
            format!("{i:04}-{}", c.id),
            i as i64,
            c.name,
            c.decision,
            c.rule,
            c.reason,
            c.outcome,
            c.duration_ms as i64
        ])?;
    }
    Ok(())
}

/// A group of cards with the same fingerprint.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CardGroup {
    pub fingerprint: String,
    pub count: i64,
    pub first_seen: String,
    pub last_seen: String,
    pub task: String,
    pub kind: CardKind,
    pub status: CardStatus,
    pub summary: String,
    pub latest_id: String,
    pub latest_path: String,
}

#[derive(Debug, Clone, Default)]
pub struct CardFilter {
    pub task: Option<String>,
    pub kind: Option<CardKind>,
    /// The status of the group's latest card.
    pub status: Option<CardStatus>,
    pub since: Option<String>,
}

/// A `--since` value as the index compares it: a date (`YYYY-MM-DD`) as written, an
/// RFC 3339 time in UTC (the index stores UTC times, compared as text). `None` when
/// it is neither.
pub fn parse_since(since: &str) -> Option<String> {
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(since) {
        return Some(t.with_timezone(&chrono::Utc).to_rfc3339());
    }
    chrono::NaiveDate::parse_from_str(since, "%Y-%m-%d")
        .ok()
        .map(|d| d.format("%Y-%m-%d").to_string())
}

/// Every task name the repository knows: a prompt in the work tree, or runs or cards
/// of it in the index (a task whose prompt was removed still has history). Sorted.
pub fn known_tasks(root: &Path, store: &Store) -> Result<Vec<String>, StoreError> {
    let mut names = crate::prompt::task_names(root);
    names.extend(store.query_all(
        "SELECT DISTINCT task FROM runs UNION SELECT DISTINCT task FROM cards",
        [],
        |r| r.get::<_, String>(0),
    )?);
    names.sort();
    names.dedup();
    Ok(names)
}

/// Cards grouped by fingerprint, most recent first; status and summary are the
/// latest card's.
pub fn card_groups(store: &Store, f: &CardFilter) -> Result<Vec<CardGroup>, StoreError> {
    store.query_all(
        "WITH f AS (SELECT * FROM cards WHERE (?1 IS NULL OR task = ?1) AND (?2 IS NULL OR kind = ?2) AND (?4 IS NULL OR created_at >= ?4)),
                  g AS (SELECT fingerprint, count(*) AS n, min(created_at) AS first, max(created_at) AS last FROM f GROUP BY fingerprint),
                  latest AS (SELECT f.* FROM f JOIN g ON f.fingerprint = g.fingerprint AND f.created_at = g.last)
             SELECT g.fingerprint, g.n, g.first, g.last, l.task, l.kind, l.status, l.summary, l.id, l.path
             FROM g JOIN latest l ON l.fingerprint = g.fingerprint
             WHERE (?3 IS NULL OR l.status = ?3)
             GROUP BY g.fingerprint ORDER BY g.last DESC",
        params![f.task, f.kind, f.status, f.since],
        |r| {
            Ok(CardGroup {
                fingerprint: r.get(0)?,
                count: r.get(1)?,
                first_seen: r.get(2)?,
                last_seen: r.get(3)?,
                task: r.get(4)?,
                kind: r.get(5)?,
                status: r.get(6)?,
                summary: r.get(7)?,
                latest_id: r.get(8)?,
                latest_path: r.get(9)?,
            })
        },
    )
}

/// Paths of the cards with this id, or in this fingerprint group.
pub fn card_paths(store: &Store, id_or_fp: &str) -> Result<Vec<String>, StoreError> {
    store.query_all(
        "SELECT path FROM cards WHERE id = ?1 OR fingerprint = ?1 ORDER BY created_at",
        [id_or_fp],
        |r| r.get(0),
    )
}

/// Two runs side by side: the inputs they ran on (with the text diff between the
/// versions), metric deltas, and the report text diff.
#[derive(Debug, Clone, Serialize)]
pub struct RunDiff {
    pub a: RunSummary,
    pub b: RunSummary,
    pub inputs: Vec<InputDiff>,
    pub metrics: Vec<MetricDelta>,
    pub report_diff: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct InputDiff {
    pub name: String,
    pub a: Option<String>,
    pub b: Option<String>,
    pub diff: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct MetricDelta {
    pub name: String,
    pub a: f64,
    pub b: f64,
    pub delta: f64,
}

fn blob_text(repo: &Repository, id: Option<&str>) -> String {
    id.and_then(|i| Oid::from_str(i).ok())
        .and_then(|o| repo.find_blob(o).ok())
        .map(|b| String::from_utf8_lossy(b.content()).into_owned())
        .unwrap_or_default()
}

fn unified(a: &str, b: &str, name: &str) -> String {
    if a == b {
        return String::new();
    }
    similar::TextDiff::from_lines(a, b)
        .unified_diff()
        .context_radius(3)
        .header(&format!("a/{name}"), &format!("b/{name}"))
        .to_string()
}

fn input_blobs(store: &Store, run_id: &str) -> Result<[Option<String>; 3], StoreError> {
    store
        .conn()
        .query_row(
            "SELECT prompt_blob, scope_blob, settings_blob FROM runs WHERE run_id = ?1",
            [run_id],
            |r| Ok([r.get(0)?, r.get(1)?, r.get(2)?]),
        )
        .map_err(store.sql_error())
}

/// Diffs two indexed runs (ids or unique prefixes).
pub fn diff(repo: &Repository, store: &Store, a: &str, b: &str) -> Result<Option<RunDiff>, HistoryError> {
    let (Some(ra), Some(rb)) = (run(store, a)?, run(store, b)?) else {
        return Ok(None);
    };
    let ba = input_blobs(store, &ra.run_id)?;
    let bb = input_blobs(store, &rb.run_id)?;
    let names = [
        format!("prompts/{}.md", ra.task),
        crate::layout::SCOPE_FILE.to_string(),
        crate::layout::SETTINGS_FILE.to_string(),
    ];
    let inputs = names
        .iter()
        .enumerate()
        .map(|(i, name)| InputDiff {
            name: name.clone(),
            a: ba[i].clone(),
            b: bb[i].clone(),
            diff: if ba[i] == bb[i] {
                String::new()
            } else {
                unified(
                    &blob_text(repo, ba[i].as_deref()),
                    &blob_text(repo, bb[i].as_deref()),
                    name,
                )
            },
        })
        .collect();
    let m = |name: &str, x: f64, y: f64| MetricDelta {
        name: name.into(),
        a: x,
        b: y,
        delta: y - x,
    };
    let metrics = vec![
        m("steps", ra.steps as f64, rb.steps as f64),
        m("tokens", ra.tokens as f64, rb.tokens as f64),
        m("cost_usd", ra.cost_usd, rb.cost_usd),
        m("duration_ms", ra.duration_ms as f64, rb.duration_ms as f64),
    ];
    let root = repo.workdir().map(Path::to_path_buf).unwrap_or_default();
    let report = |r: &RunSummary| {
        r.report_path
            .as_deref()
            .and_then(|p| crate::records::record_text(&root, repo, p))
            .unwrap_or_default()
    };
    let report_diff = unified(&report(&ra), &report(&rb), "report.md");
    Ok(Some(RunDiff {
        a: ra,
        b: rb,
        inputs,
        metrics,
        report_diff,
    }))
}

/// The inputs a run was made from, the version `compare` groups runs by: the blob
/// ids of the task's prompt, the scope and the settings, and the model.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct InputVersion {
    pub prompt_blob: Option<String>,
    pub scope_blob: Option<String>,
    pub settings_blob: Option<String>,
    /// The model of the newest counted run on these files (`None`: no runs).
    pub model: Option<String>,
}

/// A task's metrics for one input version.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct VersionMetrics {
    pub rev: String,
    #[serde(flatten)]
    pub version: InputVersion,
    /// Runs counted: finished runs on this version (refused and paused ones left out).
    pub runs: i64,
    /// Of those, accepted or completed.
    pub successes: i64,
    /// Refused runs on these files (stop reason `not_started`), left out.
    pub refused: i64,
    /// Runs on these files with another model, left out.
    pub other_models: i64,
    pub success_rate: f64,
    pub avg_steps: f64,
    pub avg_tokens: f64,
    pub avg_cost_usd: f64,
    pub avg_denials: f64,
}

/// The test behind a success-rate verdict.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SuccessTest {
    /// `fisher_exact_one_sided`: the chance of a drop at least this large if both
    /// versions succeeded equally often.
    pub test: String,
    pub p_value: f64,
    pub alpha: f64,
    /// `p_value < alpha` and the rate fell.
    pub regression: bool,
}

/// The significance level a success-rate drop must reach to be a regression.
pub const REGRESSION_ALPHA: f64 = 0.05;

#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub task: String,
    pub before: VersionMetrics,
    pub after: VersionMetrics,
    /// Counted runs each side needs before anything is judged.
    pub min_runs: i64,
    /// Both sides have `min_runs`; when not, nothing is flagged.
    pub enough_runs: bool,
    /// `None` without enough runs.
    pub success_test: Option<SuccessTest>,
    /// Human-readable regressions (empty when none).
    pub regressions: Vec<String>,
}

/// The blob id of `path` in `tree`.
fn tree_blob(tree: &git2::Tree, path: &str) -> Option<String> {
    tree.get_path(Path::new(path)).ok().map(|e| e.id().to_string())
}

/// The input version of `task` at `rev`: the blob ids of its prompt, the scope and
/// the settings in that revision's tree (the model is left to the runs).
pub fn version_at(repo: &Repository, task: &str, rev: &str) -> Result<InputVersion, HistoryError> {
    let tree = repo.revparse_single(rev)?.peel_to_commit()?.tree()?;
    Ok(InputVersion {
        prompt_blob: tree_blob(&tree, &crate::prompt::prompt_path(task).to_string_lossy()),
        scope_blob: tree_blob(&tree, crate::layout::SCOPE_FILE),
        settings_blob: tree_blob(&tree, crate::layout::SETTINGS_FILE),
        model: None,
    })
}

/// One side of a comparison: the runs of `task` on the files of `version` (its
/// prompt, scope and settings blobs), named `rev`; the model is the newest counted
/// run's.
pub fn version_metrics(
    store: &Store,
    task: &str,
    rev: &str,
    version: &InputVersion,
) -> Result<VersionMetrics, HistoryError> {
    let mut version = InputVersion {
        model: None,
        ..version.clone()
    };
    const SAME_FILES: &str = "task = ?1 AND prompt_blob IS ?2 AND scope_blob IS ?3 AND settings_blob IS ?4";
    let files = params![task, version.prompt_blob, version.scope_blob, version.settings_blob];
    let refused: i64 = store
        .conn()
        .query_row(
            &format!("SELECT count(*) FROM runs WHERE {SAME_FILES} AND stop_reason = 'not_started'"),
            files,
            |r| r.get(0),
        )
        .map_err(store.sql_error())?;
    const COUNTED: &str = "stop_reason != 'not_started' AND status != 'waiting_approval'";
    // Models on these files, newest run first; the newest one's model is the version's.
    let models: Vec<(Option<String>, i64)> = store.query_all(
        &format!("SELECT model, count(*) FROM runs WHERE {SAME_FILES} AND {COUNTED} GROUP BY model ORDER BY max(started_at) DESC"),
        files,
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    version.model = models.first().and_then(|(m, _)| m.clone());
    let other_models = models.iter().skip(1).map(|(_, n)| n).sum();
    let (runs, successes, steps, tokens, cost, denials): (i64, i64, f64, f64, f64, f64) = store
        .conn()
        .query_row(
            &format!("SELECT count(*), coalesce(sum(status IN ('accepted', 'completed')), 0), coalesce(avg(steps), 0), coalesce(avg(tokens_in + tokens_out), 0), coalesce(avg(cost_usd), 0), coalesce(avg(denials), 0) FROM runs WHERE {SAME_FILES} AND {COUNTED} AND model IS ?5"),
            params![task, version.prompt_blob, version.scope_blob, version.settings_blob, version.model],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)),
        )
        .map_err(store.sql_error())?;
    Ok(VersionMetrics {
        rev: rev.to_string(),
        version,
        runs,
        successes,
        refused,
        other_models,
        success_rate: if runs > 0 { successes as f64 / runs as f64 } else { 0.0 },
        avg_steps: steps,
        avg_tokens: tokens,
        avg_cost_usd: cost,
        avg_denials: denials,
    })
}

/// Compares a task's runs on the input version (prompt, scope, settings, model) at
/// `before` with those at `after`. With fewer than `min_runs` counted runs on either
/// side nothing is judged. A success-rate drop is a regression only when Fisher's
/// exact test (one-sided) puts its p-value below [`REGRESSION_ALPHA`]; an average of
/// steps, tokens, cost or denials that rose by more than 10% is flagged as before.
pub fn compare(
    repo: &Repository,
    store: &Store,
    task: &str,
    before: &str,
    after: &str,
    min_runs: i64,
) -> Result<Comparison, HistoryError> {
    let b = version_metrics(store, task, before, &version_at(repo, task, before)?)?;
    let a = version_metrics(store, task, after, &version_at(repo, task, after)?)?;
    Ok(judge(task, b, a, min_runs))
}

/// Judges two sides of a comparison ([`compare`]).
pub fn judge(task: &str, b: VersionMetrics, a: VersionMetrics, min_runs: i64) -> Comparison {
    let enough_runs = b.runs >= min_runs && a.runs >= min_runs && b.runs > 0 && a.runs > 0;
    let mut regressions = Vec::new();
    let mut success_test = None;
    if enough_runs {
        let p = crate::stats::fisher_drop_p(b.successes as u64, b.runs as u64, a.successes as u64, a.runs as u64)
            .unwrap_or(1.0);
        let regression = a.success_rate < b.success_rate && p < REGRESSION_ALPHA;
        if regression {
            regressions.push(format!(
                "success rate fell from {:.0}% ({}/{}) to {:.0}% ({}/{}): Fisher's exact test, one-sided p = {} < {REGRESSION_ALPHA}",
                b.success_rate * 100.0,
                b.successes,
                b.runs,
                a.success_rate * 100.0,
                a.successes,
                a.runs,
                format_p(p)
            ));
        }
        success_test = Some(SuccessTest {
            test: "fisher_exact_one_sided".into(),
            p_value: p,
            alpha: REGRESSION_ALPHA,
            regression,
        });
        for (name, x, y) in [
            ("steps", b.avg_steps, a.avg_steps),
            ("tokens", b.avg_tokens, a.avg_tokens),
            ("cost", b.avg_cost_usd, a.avg_cost_usd),
            ("denials", b.avg_denials, a.avg_denials),
        ] {
            if y > x * 1.10 && y - x > 1e-9 {
                regressions.push(format!(
                    "average {name} rose from {x:.3} to {y:.3} (+{:.0}%)",
                    if x > 0.0 { (y / x - 1.0) * 100.0 } else { 100.0 }
                ));
            }
        }
    }
    Comparison {
        task: task.to_string(),
        before: b,
        after: a,
        min_runs,
        enough_runs,
        success_test,
        regressions,
    }
}

/// A p-value for people: four significant digits, scientific below 0.0001.
pub fn format_p(p: f64) -> String {
    if p < 1e-4 {
        format!("{p:.2e}")
    } else {
        format!("{p:.4}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{RunStatus, StopReason};

    /// A repo with one commit holding the task's prompt, the scope and the settings;
    /// returns the blob ids (prompt, scope, settings).
    fn repo_with_inputs(dir: &Path) -> (Repository, [String; 3]) {
        let repo = Repository::init(dir).unwrap();
        let mut ids = Vec::new();
        let mut idx = repo.index().unwrap();
        for (rel, body) in [
            ("prompts/t.md", "do it\n"),
            (crate::layout::SCOPE_FILE, "scope\n"),
            (crate::layout::SETTINGS_FILE, "version: 1\n"),
        ] {
            let p = dir.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, body).unwrap();
            idx.add_path(Path::new(rel)).unwrap();
            ids.push(repo.blob(body.as_bytes()).unwrap().to_string());
        }
        let tree = repo.find_tree(idx.write_tree().unwrap()).unwrap();
        let sig = git2::Signature::now("eng", "eng@x").unwrap();
        repo.commit(Some("HEAD"), &sig, &sig, "inputs", &tree, &[]).unwrap();
        drop(tree);
        (repo, [ids[0].clone(), ids[1].clone(), ids[2].clone()])
    }

    fn add_run(store: &mut Store, n: usize, blobs: &[String; 3], model: &str, status: RunStatus, stop: StopReason) {
        let mut r = crate::records::tests::sample_receipt();
        r.run_id = format!("run-{n:03}");
        r.task = "t".into();
        r.status = status;
        r.stop_reason = stop;
        r.inputs.prompt = Some(blobs[0].clone());
        r.inputs.scope = Some(blobs[1].clone());
        r.inputs.settings = Some(blobs[2].clone());
        r.inputs.model = model.into();
        r.started_at += chrono::Duration::seconds(n as i64);
        store
            .write(|tx| insert_receipt(tx, &r, &format!("runs/t/{n}.json")))
            .unwrap();
    }

    #[test]
    fn compare_counts_one_input_version_and_leaves_refused_runs_out() {
        let dir = tempfile::tempdir().unwrap();
        let (repo, blobs) = repo_with_inputs(dir.path());
        let mut store = open_store(dir.path()).unwrap();
        let mut n = 0;
        let mut add = |store: &mut Store, blobs: &[String; 3], model: &str, status, stop| {
            n += 1;
            add_run(store, n, blobs, model, status, stop);
        };
        for _ in 0..4 {
            add(&mut store, &blobs, "m1", RunStatus::Accepted, StopReason::FinalAnswer);
        }
        add(&mut store, &blobs, "m1", RunStatus::Failed, StopReason::FinalAnswer);
        // Refused: not counted, however many.
        for _ in 0..3 {
            add(&mut store, &blobs, "m1", RunStatus::Failed, StopReason::NotStarted);
        }
        // Other settings, or an older model on the same files: another version.
        let other = [blobs[0].clone(), blobs[1].clone(), "0".repeat(40)];
        add(&mut store, &other, "m1", RunStatus::Failed, StopReason::FinalAnswer);
        add(&mut store, &blobs, "m0", RunStatus::Failed, StopReason::FinalAnswer);
        // The newest counted run sets the model.
        add(&mut store, &blobs, "m1", RunStatus::Accepted, StopReason::FinalAnswer);
        let c = compare(&repo, &store, "t", "HEAD", "HEAD", 5).unwrap();
        let v = &c.before;
        assert_eq!(v.version.prompt_blob.as_deref(), Some(blobs[0].as_str()));
        assert_eq!(v.version.settings_blob.as_deref(), Some(blobs[2].as_str()));
        assert_eq!(v.version.model.as_deref(), Some("m1"));
        assert_eq!((v.runs, v.successes, v.refused, v.other_models), (6, 5, 3, 1));
        assert!(c.enough_runs);
        let t = c.success_test.unwrap();
        assert!(!t.regression && t.p_value > 0.5, "the same runs on both sides: {t:?}");
        assert!(c.regressions.is_empty());
        // Seven runs a side are needed, six are there: nothing is judged.
        let c = compare(&repo, &store, "t", "HEAD", "HEAD", 7).unwrap();
        assert!(!c.enough_runs && c.success_test.is_none());
    }

    #[test]
    fn since_takes_dates_and_rfc3339_times_in_utc() {
        assert_eq!(parse_since("2026-01-31").as_deref(), Some("2026-01-31"));
        assert_eq!(
            parse_since("2026-01-31T08:00:00+02:00").as_deref(),
            Some("2026-01-31T06:00:00+00:00")
        );
        assert_eq!(parse_since("2026-13-01"), None);
        assert_eq!(parse_since("yesterday"), None);
    }
}
