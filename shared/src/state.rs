//! The runtime's local state in `.runtime/` (git-ignored): the state database
//! (`state.db`: run rows and traces, skipped fires, builder decisions on paused calls,
//! checkpoints of paused runs) and the lock files that keep two fires of one task, or
//! two commits, from running at once. Both binaries use this one home: the runtime
//! writes runs and checkpoints, `builder approve-call` records decisions.

use crate::layout::STATE_DIR;
use crate::loop_state::{call_hash, CallDecision, CardDraft, LoopState};
use crate::records::{CardKind, Receipt, RunStatus, StopReason};
use crate::store::{Schema, Store, StoreError, SHARED_HISTORY};
use crate::trace::Trace;
use chrono::{DateTime, Utc};
use rusqlite::OptionalExtension;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::path::{Path, PathBuf};

/// The state database's file name inside [`STATE_DIR`].
pub const STATE_DB_FILE: &str = "state.db";

/// The state database's schema: the shared beginning, then the runtime's own steps.
pub const RUNTIME_SCHEMA: Schema = Schema {
    migrations: &[
        SHARED_HISTORY[0],
        SHARED_HISTORY[1],
        SHARED_HISTORY[2],
        // 4: a file migrated while both databases shared one list got the builder's
        // card stat cache here; the runtime never used it.
        "DROP TABLE IF EXISTS card_files;",
        // 5: the last refusal of each task, so an unchanged refusal is counted here
        // instead of being committed again on every cron tick.
        "CREATE TABLE refusals (task TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, builder_tree TEXT NOT NULL,
            card_id TEXT NOT NULL, count INTEGER NOT NULL, first_at TEXT NOT NULL, last_at TEXT NOT NULL);",
        // 6: each run's OpenTelemetry trace id, so `runtime show --otlp` names the
        // trace the fire exported.
        "CREATE TABLE traces (run_id TEXT PRIMARY KEY, trace_id TEXT NOT NULL);",
        // 7: a run exists from its first moment (`crate::journal`): the process that
        // runs it and its checkpoint after every step; the tool ledger of its calls.
        "CREATE TABLE live_runs (run_id TEXT PRIMARY KEY, task TEXT NOT NULL, pid INTEGER NOT NULL, pid_start INTEGER,
            ledger_run TEXT NOT NULL, step INTEGER NOT NULL DEFAULT 0, state TEXT, inputs TEXT NOT NULL, updated_at TEXT NOT NULL);
         CREATE INDEX live_runs_task ON live_runs(task);
         CREATE TABLE tool_ledger (run_id TEXT NOT NULL, call_id TEXT NOT NULL, name TEXT NOT NULL, args_hash TEXT NOT NULL,
            stage TEXT NOT NULL, result_hash TEXT, result TEXT, at TEXT NOT NULL, PRIMARY KEY (run_id, call_id));",
        // 8: the last accepted modes, owners and hook hashes of builder-owned files
        // (`crate::manifest`), one row: git tracks none of them but the executable bit.
        "CREATE TABLE metadata_manifest (id INTEGER PRIMARY KEY CHECK (id = 1), manifest TEXT NOT NULL,
            recorded_at TEXT NOT NULL);",
        // 9: a live run's last checkpoint on the boot clock (`CLOCK_BOOTTIME`, with the
        // boot it counts from), so the resume window is not measured by a wall clock
        // that can step.
        "ALTER TABLE live_runs ADD COLUMN boot_id TEXT;
         ALTER TABLE live_runs ADD COLUMN boot_ns INTEGER;",
        // 10: the SHA-256 of each record a run wrote (its report, outputs, cards and
        // receipt), noted before its receipt: a run killed before its commit is
        // committed by the next fire only with the bytes it wrote.
        "ALTER TABLE live_runs ADD COLUMN records TEXT;",
    ],
};

/// The builder-tree walk memo of the two-key check (`review::trust`), in
/// [`STATE_DIR`]: [`WALK_MEMO_HEADER`], then one line per commit, `<commit> <builder
/// tree> <boundary or -> <merge or -> <join or -> <any merge or ->`, the boundary
/// being the nearest first-parent ancestor with another builder tree, the merge the
/// nearest one in between whose settings turn review off, the join the nearest one in
/// between with a later parent of another builder tree (or a first parent of
/// another), the last the nearest merge in between of any kind. These
/// are facts of immutable commits, so a fire walks only the commits since the last
/// fire's HEAD. A plain file rather than a table: opening `state.db` (its WAL
/// recovered by the first connection of a process) costs more than the whole check.
pub const WALK_MEMO_FILE: &str = "builder-tree-walk";
/// In [`STATE_DIR`]: a commit no builder change at or below which (first parents)
/// asked for review, so a walk for owed review stops there (`review::trust`).
pub const REVIEW_FREE_FILE: &str = "review-free";
/// In [`STATE_DIR`]: a commit below which (its line and the lines joined into it,
/// down to the root) no settings asked signatures, so turning them on above it is
/// their first use (`review::trust`).
pub const UNSIGNED_BELOW_FILE: &str = "unsigned-below";
/// In [`STATE_DIR`]: the verdicts of the walks under signed review, remembered while
/// the approvals stay the same (`review::trust`).
pub const VERDICTS_FILE: &str = "trust-verdicts";
/// The first line of a walk memo this version reads. A memo without it was written
/// before merges that replace a reviewed tree were remembered (the fourth column), and
/// one with `builder-tree-walk 2` remembered only merges over a parent whose own
/// settings asked review (not one whose history owed it), and one with `3` no merge
/// joining another line's tree (whose trusted list judges the tree too), and one with
/// `4` no merge of any kind (whose joined lines judge every tree whose walk passes
/// over it), and one with `5` no merge that took its tree from a later parent, so their
/// silence about such merges is no fact: they are ignored, and the walk done again
/// once.
pub const WALK_MEMO_HEADER: &str = "builder-tree-walk 8";
/// A walk memo larger than this is ignored (and rewritten): it holds one line per
/// builder change, about 100 bytes each.
const WALK_MEMO_MAX_BYTES: u64 = 16 << 20;

/// Why the runtime refuses to fire or resume in `repo`, as (message, hint), when
/// HEAD tracks anything under `.runtime/`: a pull of such a commit wrote the
/// runtime's private state (decisions on paused calls, checkpoints, the two-key
/// check's walk memo) from git, so nothing in it may be read or recorded. `None`
/// when HEAD tracks nothing there (or cannot be read).
pub fn tracked_state_refusal(repo: &git2::Repository) -> Option<(String, String)> {
    let tracked = repo
        .head()
        .and_then(|h| h.peel_to_tree())
        .is_ok_and(|t| t.get_name(STATE_DIR).is_some());
    tracked.then(|| {
        (
            format!("HEAD tracks paths under {STATE_DIR}/, the runtime's private state, which no commit may write"),
            format!(
                "remove them from git, delete the memos a checkout of them may have written, and fire again: `git rm -r --cached {STATE_DIR} && git commit -m 'untrack {STATE_DIR}' && rm -f {STATE_DIR}/{WALK_MEMO_FILE} {STATE_DIR}/{} {STATE_DIR}/{} {STATE_DIR}/{}`, then look at how they came in",
                VERDICTS_FILE,
                REVIEW_FREE_FILE,
                UNSIGNED_BELOW_FILE
            ),
        )
    })
}

/// One commit's line of the walk memo: `(commit, builder tree, boundary, merge,
/// join, any merge)`, `merge` being the nearest merge in its run under settings that
/// turn review off, `join` the nearest one in its run with a later parent of another
/// builder tree, `any merge` the nearest merge in its run, if any.
pub type BuilderTreeStep = (
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// The walk memo of the repository at `root`; empty when absent, unreadable or
/// without [`WALK_MEMO_HEADER`] (it is only a memo: the walk is then done again).
pub fn read_walk_memo(root: &Path) -> Vec<BuilderTreeStep> {
    let rel = Path::new(STATE_DIR).join(WALK_MEMO_FILE);
    let Ok(bytes) = crate::beneath::open_root(root)
        .map_err(|e| e.to_string())
        .and_then(|dir| crate::beneath::read_regular(&dir, &rel, WALK_MEMO_MAX_BYTES).map_err(|e| e.to_string()))
    else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&bytes);
    let mut lines = text.lines();
    if lines.next() != Some(WALK_MEMO_HEADER) {
        return Vec::new();
    }
    lines
        .filter_map(|line| {
            let mut f = line.split(' ');
            let (commit, tree, boundary) = (f.next()?, f.next()?, f.next()?);
            let mut oid = || f.next().filter(|o| *o != "-").map(str::to_string);
            let boundary = (boundary != "-").then(|| boundary.to_string());
            Some((commit.to_string(), tree.to_string(), boundary, oid(), oid(), oid()))
        })
        .collect()
}

/// Replaces the walk memo of the repository at `root` with `steps`. A concurrent
/// writer may win the race; either file is a correct memo.
pub fn write_walk_memo(root: &Path, steps: &[BuilderTreeStep]) -> std::io::Result<()> {
    let rel = Path::new(STATE_DIR).join(WALK_MEMO_FILE);
    let mut text = String::with_capacity(steps.len() * 124 + WALK_MEMO_HEADER.len() + 1);
    text.push_str(WALK_MEMO_HEADER);
    text.push('\n');
    for (commit, tree, boundary, merge, join, any) in steps {
        let or_dash = |o: &Option<String>| o.clone().unwrap_or_else(|| "-".into());
        text.push_str(&format!(
            "{commit} {tree} {} {} {} {}\n",
            or_dash(boundary),
            or_dash(merge),
            or_dash(join),
            or_dash(any)
        ));
    }
    let dir = crate::beneath::open_root(root)?;
    match crate::beneath::remove_file(&dir, &rel) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    crate::beneath::create_new(&dir, &rel, text.as_bytes())
}

/// A refusal already on record: the card that recorded it and how often it recurred.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepeatedRefusal {
    pub card_id: String,
    pub count: u64,
}

/// Path of the state database of the repository at `root`.
pub fn db_path(root: &Path) -> PathBuf {
    root.join(STATE_DIR).join(STATE_DB_FILE)
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{path}: unreadable checkpoint of run `{run_id}`: {message}")]
    Checkpoint {
        path: String,
        run_id: String,
        message: String,
    },
    #[error("run `{0}` has no checkpoint waiting for approval")]
    NoCheckpoint(String),
    #[error("run `{0}` is not waiting for an approval")]
    NotWaiting(String),
    #[error("run `{run_id}` waits on call `{waiting}`, not `{asked}`")]
    OtherCall {
        run_id: String,
        waiting: String,
        asked: String,
    },
    #[error("run `{0}`: the paused call does not match its recorded hash")]
    HashMismatch(String),
}

/// A paused run's saved conversation: what `runtime resume` continues from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Checkpoint {
    pub task: String,
    pub state: LoopState,
}

/// The open state database.
pub struct StateDb {
    store: Store,
    reset: Option<StateReset>,
}

/// A damaged state database found at open: where it went and what it held, as far as
/// it could be read. Kept as a note in `.runtime/` until a fire reports it with a
/// `state_reset` card (whoever opened the database first: a fire, `runtime runs`,
/// `builder approve-call`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateReset {
    /// What was wrong (SQLite's error, or what `PRAGMA quick_check` found).
    pub reason: String,
    /// Where the damaged file was moved (`.runtime/state.db.damaged-<timestamp>`).
    pub moved_to: PathBuf,
    /// What was lost, as far as the damaged file could be read: runs waiting for
    /// approval, the number of run rows. Empty when nothing could be read.
    pub lost: Vec<String>,
    /// Runs waiting for approval whose pause (checkpoint, run row and any decision)
    /// was read from the damaged file and kept in the new one.
    #[serde(default)]
    pub kept: Vec<String>,
    pub at: DateTime<Utc>,
}

impl StateReset {
    /// The `state_reset` card that reports it.
    pub fn card(&self) -> CardDraft {
        let lost = if self.lost.is_empty() {
            "nothing could be read from it".to_string()
        } else {
            format!("it held: {}", self.lost.join("; "))
        };
        let kept = if self.kept.is_empty() {
            String::new()
        } else {
            format!(
                " Kept in the new database (still waiting, `runtime resume` works as before): {}.",
                self.kept.join("; ")
            )
        };
        CardDraft {
            kind: CardKind::StateReset,
            summary: "the state database was damaged; it was moved aside and rebuilt".into(),
            detail: format!(
                "{}; moved to {}; {lost}. Local run history in it is gone from the runtime's view; a run that waited for approval and could not be kept is not waited on any more: the next fire of its task runs afresh and asks again.{kept}",
                self.reason,
                self.moved_to.display()
            ),
            evidence: self.lost.iter().chain(&self.kept).cloned().collect(),
        }
    }
}

/// Name prefix of the notes of resets not yet reported, in [`STATE_DIR`].
const RESET_NOTE_PREFIX: &str = "state-reset-";

/// The largest note read (a card is capped at a few KB when written).
const NOTE_CAP: u64 = 256 * 1024;

/// Name prefix of the notes of other cards owed to the next commit, in [`STATE_DIR`].
const OWED_CARD_PREFIX: &str = "card-owed-";

/// Leaves, durably, the note of `card` for the next fire's records, before the change
/// of the state database it reports (a paused run given up): a fire killed between
/// that change and its commit leaves the card to the next fire, never loses it. `key`
/// names the note (one per change: written again, it is replaced); its path is
/// returned.
pub fn owe_card(root: &Path, key: &str, card: &CardDraft) -> std::io::Result<PathBuf> {
    let key: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let note = root.join(STATE_DIR).join(format!("{OWED_CARD_PREFIX}{key}.json"));
    let body = serde_json::to_vec_pretty(card).map_err(std::io::Error::other)?;
    crate::durable::replace(&note, &body)?;
    Ok(note)
}

/// The cards owed to the next commit, each with its note's path: the resets not yet
/// reported (`state_reset`) and the cards [`owe_card`] left, in the notes' order.
pub fn owed_cards(root: &Path) -> Vec<(PathBuf, CardDraft)> {
    let Ok(dir) = std::fs::read_dir(root.join(STATE_DIR)) else {
        return vec![];
    };
    let mut out: Vec<(PathBuf, CardDraft)> = dir
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.ends_with(".json") {
                return None;
            }
            if !name.starts_with(RESET_NOTE_PREFIX) && !name.starts_with(OWED_CARD_PREFIX) {
                return None;
            }
            let unread = |why: String| tracing::warn!(note = %e.path().display(), why, "a note of a card owed cannot be read: it is left, and no card comes of it");
            let text = crate::regular::read(&e.path(), NOTE_CAP).map_err(|e| unread(e.to_string())).ok()?;
            let card = if name.starts_with(RESET_NOTE_PREFIX) {
                serde_json::from_slice::<StateReset>(&text).map(|r| r.card())
            } else {
                serde_json::from_slice::<CardDraft>(&text)
            };
            let card = card.map_err(|e| unread(e.to_string())).ok()?;
            Some((e.path(), card))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

/// Forgets an owed card once it is committed.
pub fn card_reported(note: &Path) {
    let _ = std::fs::remove_file(note);
}

/// The run of a task that waits for approval ([`StateDb::waiting_run`]), asked on
/// every fire: from the checkpoints (only runs that pause keep one) to their runs.
/// `CROSS JOIN` keeps that order; the planner otherwise walked every run the task ever
/// had through `runs_task`, reading each row's status, a read that grew with the
/// history (about 40 pages at 372 runs).
const WAITING_RUN_SQL: &str = "SELECT c.run_id FROM checkpoints c CROSS JOIN runs r ON r.run_id = c.run_id
     WHERE r.task = ?1 AND r.status = 'waiting_approval' ORDER BY r.started_at DESC LIMIT 1";

/// Drops the checkpoint of `run_id` (a paused run that no longer waits) in `store`
/// ([`StateDb::delete_checkpoint`], and recovery's, which holds the bare store).
pub fn delete_checkpoint_of(store: &mut Store, run_id: &str) -> Result<(), StoreError> {
    store.write(|tx| tx.execute("DELETE FROM checkpoints WHERE run_id = ?1", [run_id]))?;
    Ok(())
}

/// Why opening failed: a damaged file, or anything else (busy, read-only, full).
enum OpenFailure {
    Damaged(String),
    Other(StoreError),
}

impl StateDb {
    /// Opens (creating and migrating) the state database of the repository at `root`.
    /// A damaged file (not a SQLite database, or failing `PRAGMA quick_check`) is moved
    /// aside with its write-ahead log and a new, empty database made in its place;
    /// [`StateDb::reset`] then says so, and a note waits for the next fire's card.
    pub fn open(root: &Path) -> Result<StateDb, StoreError> {
        let path = db_path(root);
        let inode = file_inode(&path);
        match open_sound(&path) {
            Ok(mut store) => {
                mark_made(&path);
                store.call_on_close(record_sound);
                Ok(StateDb { store, reset: None })
            }
            Err(OpenFailure::Other(e)) => Err(e),
            Err(OpenFailure::Damaged(reason)) => {
                let mut reset = move_aside(root, &path, inode, reason)?;
                let mut store = Store::open(&path, RUNTIME_SCHEMA)?;
                if let Some(r) = &mut reset {
                    r.kept = salvage_pauses(&root.join(&r.moved_to), &mut store);
                    write_note(root, r);
                }
                Ok(StateDb { store, reset })
            }
        }
    }

    /// Opens the state database where it is sound, for a read taken before the
    /// caller holds any lock: `None` for a damaged (or emptied) file, which is left
    /// where it is for [`StateDb::open`] to move aside once the caller may change it,
    /// and for any other failure.
    pub fn open_if_sound(root: &Path) -> Option<StateDb> {
        match open_sound(&db_path(root)) {
            Ok(mut store) => {
                store.call_on_close(record_sound);
                Some(StateDb { store, reset: None })
            }
            Err(OpenFailure::Damaged(reason)) => {
                tracing::debug!(%reason, "the state database is damaged: left for the locked open");
                None
            }
            Err(OpenFailure::Other(e)) => {
                tracing::debug!(error = %e, "the state database was not opened early");
                None
            }
        }
    }

    /// Opens the state database for a command that only reads it (`runtime runs`,
    /// `show`): as [`StateDb::open`] does where it can write, else read-only (a
    /// read-only `.runtime`, a full disk), where a damaged file is an error instead.
    pub fn open_for_reading(root: &Path) -> Result<StateDb, StoreError> {
        match StateDb::open(root) {
            Ok(db) => Ok(db),
            Err(e @ StoreError::TooNew { .. }) => Err(e),
            Err(e) if e.is_damage() => Err(e),
            Err(e) => match Store::open_read_only(&db_path(root), RUNTIME_SCHEMA) {
                Ok(store) => {
                    tracing::debug!(error = %e, "the state database is read without writing");
                    Ok(StateDb { store, reset: None })
                }
                Err(_) => Err(e),
            },
        }
    }

    /// The reset this open made, if the file was damaged.
    pub fn reset(&self) -> Option<&StateReset> {
        self.reset.as_ref()
    }

    /// The underlying store, for the run queries `runtime runs` and `show` share with
    /// the builder's history.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The store, for a run's journal ([`crate::journal::Journal::begin`]).
    pub fn into_store(self) -> Store {
        self.store
    }

    /// The state database of `root` through a store [`StateDb::open`] opened there
    /// and [`StateDb::into_store`] gave a run's journal: the fire's end writes its
    /// records through the connection the run began with rather than opening another,
    /// unless the file was replaced since (another fire found it damaged and moved it
    /// aside) or emptied; then it is opened again, as [`StateDb::open`] does.
    pub(crate) fn reopen(store: Store, root: &Path) -> Result<StateDb, StoreError> {
        if store.still_on_its_file() && emptied(&db_path(root)).is_none() {
            return Ok(StateDb { store, reset: None });
        }
        drop(store);
        StateDb::open(root)
    }

    /// Records a skipped fire (another fire held the lock): a row, no files.
    pub fn record_skip(&mut self, run_id: &str, task: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
        self.store.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO runs (run_id, task, status, stop_reason, started_at, finished_at) VALUES (?1, ?2, 'skipped', 'not_started', ?3, ?3)",
                rusqlite::params![run_id, task, at.to_rfc3339()],
            )
        })?;
        Ok(())
    }

    /// When the task's last refusal had this fingerprint on this builder tree, counts
    /// one more and returns it; otherwise `None` (the refusal is new and gets records).
    pub fn repeat_refusal(
        &mut self,
        task: &str,
        fingerprint: &str,
        builder_tree: &str,
        at: DateTime<Utc>,
    ) -> Result<Option<RepeatedRefusal>, StoreError> {
        self.store.write(|tx| {
            let found: Option<(String, i64)> = tx
                .query_row(
                    "SELECT card_id, count FROM refusals WHERE task = ?1 AND fingerprint = ?2 AND builder_tree = ?3",
                    [task, fingerprint, builder_tree],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            let Some((card_id, count)) = found else {
                return Ok(None);
            };
            tx.execute(
                "UPDATE refusals SET count = count + 1, last_at = ?2 WHERE task = ?1",
                rusqlite::params![task, at.to_rfc3339()],
            )?;
            Ok(Some(RepeatedRefusal {
                card_id,
                count: count.max(0) as u64 + 1,
            }))
        })
    }

    /// Remembers a refusal just recorded with card `card_id`.
    pub fn remember_refusal(
        &mut self,
        task: &str,
        fingerprint: &str,
        builder_tree: &str,
        card_id: &str,
        at: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        self.store.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO refusals (task, fingerprint, builder_tree, card_id, count, first_at, last_at) VALUES (?1, ?2, ?3, ?4, 1, ?5, ?5)",
                rusqlite::params![task, fingerprint, builder_tree, card_id, at.to_rfc3339()],
            )
        })?;
        Ok(())
    }

    /// Notes, on the live row of `run_id`, the SHA-256 of each record it wrote (path
    /// and bytes), before its receipt ([`crate::journal::LiveRun::records`]).
    pub fn note_records(&mut self, run_id: &str, files: &[(String, &[u8])]) -> Result<(), StoreError> {
        let hashes: std::collections::BTreeMap<&str, String> = (files.iter())
            .map(|(path, bytes)| (path.as_str(), crate::journal::sha256_hex(bytes)))
            .collect();
        let json = serde_json::to_string(&hashes).unwrap_or_default();
        self.store.write(|tx| {
            tx.execute(
                "UPDATE live_runs SET records = ?2 WHERE run_id = ?1",
                rusqlite::params![run_id, json],
            )
        })?;
        Ok(())
    }

    /// Forgets the task's last refusal: the task fired, so the next refusal is news.
    pub fn clear_refusal(&mut self, task: &str) -> Result<(), StoreError> {
        self.store
            .write(|tx| tx.execute("DELETE FROM refusals WHERE task = ?1", [task]))?;
        Ok(())
    }

    /// The last accepted metadata manifest (JSON, see [`crate::manifest`]), if any.
    pub fn metadata_manifest(&self) -> Result<Option<String>, StoreError> {
        self.store
            .conn()
            .query_row("SELECT manifest FROM metadata_manifest WHERE id = 1", [], |r| r.get(0))
            .optional()
            .map_err(self.store.sql_error())
    }

    /// Replaces the metadata manifest with `manifest` (JSON), accepted at `at`.
    pub fn save_metadata_manifest(&mut self, manifest: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
        self.store.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO metadata_manifest (id, manifest, recorded_at) VALUES (1, ?1, ?2)",
                rusqlite::params![manifest, at.to_rfc3339()],
            )
        })?;
        Ok(())
    }

    /// Stores a finished run: its row and its trace, and forgets its live row, in one
    /// transaction (a process killed between the two left a finished run with a live
    /// row that no recovery looks at).
    pub fn save_run(
        &mut self,
        trace: &Trace,
        receipt: &Receipt,
        receipt_path: &str,
        report_path: &str,
    ) -> Result<(), StoreError> {
        self.store.write(|tx| {
            trace.save(tx, receipt, receipt_path, report_path)?;
            crate::journal::end(tx, &receipt.run_id)
        })?;
        Ok(())
    }

    /// The builder's decision on call `call_id` of `run_id`, if one was made for these
    /// exact arguments.
    pub fn decision(&self, run_id: &str, call_id: &str, args_hash: &str) -> Result<Option<CallDecision>, StoreError> {
        let found: Option<String> = self
            .store
            .conn()
            .query_row(
                "SELECT decision FROM approvals WHERE run_id = ?1 AND call_id = ?2 AND args_hash = ?3",
                [run_id, call_id, args_hash],
                |r| r.get(0),
            )
            .optional()
            .map_err(self.store.sql_error())?;
        Ok(found.as_deref().map(CallDecision::from_stored))
    }

    /// Records a builder's decision on the call `run_id` is paused on, bound to the
    /// call's hash; returns the call as `name arguments`.
    pub fn record_decision(
        &mut self,
        run_id: &str,
        call_id: &str,
        decision: CallDecision,
        by: &str,
    ) -> Result<String, StateError> {
        let checkpoint = self
            .checkpoint(run_id)?
            .ok_or_else(|| StateError::NoCheckpoint(run_id.into()))?;
        let pending = checkpoint
            .state
            .pending
            .ok_or_else(|| StateError::NotWaiting(run_id.into()))?;
        if pending.call.id != call_id {
            return Err(StateError::OtherCall {
                run_id: run_id.into(),
                waiting: pending.call.id,
                asked: call_id.into(),
            });
        }
        let hash = call_hash(&pending.call.name, &pending.call.arguments);
        if hash != pending.args_hash {
            return Err(StateError::HashMismatch(run_id.into()));
        }
        self.store.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO approvals (run_id, call_id, args_hash, decision, by, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                rusqlite::params![run_id, call_id, hash, decision.as_str(), by, Utc::now().to_rfc3339()],
            )
        })?;
        Ok(format!("{} {}", pending.call.name, pending.call.arguments))
    }

    /// The checkpoint of a paused run, read and decoded once.
    pub fn checkpoint(&self, run_id: &str) -> Result<Option<Checkpoint>, StateError> {
        let blob: Option<String> = self
            .store
            .conn()
            .query_row("SELECT state FROM checkpoints WHERE run_id = ?1", [run_id], |r| {
                r.get(0)
            })
            .optional()
            .map_err(self.store.sql_error())?;
        blob.map(|b| {
            serde_json::from_str(&b).map_err(|e| StateError::Checkpoint {
                path: self.store.path().to_string(),
                run_id: run_id.into(),
                message: e.to_string(),
            })
        })
        .transpose()
    }

    /// The run of `task` that waits for a builder's approval (its checkpoint kept for
    /// `runtime resume`), if one does.
    pub fn waiting_run(&self, task: &str) -> Result<Option<String>, StoreError> {
        self.store
            .conn()
            .query_row(WAITING_RUN_SQL, [task], |r| r.get(0))
            .optional()
            .map_err(self.store.sql_error())
    }

    /// Saves (or replaces) the checkpoint of `run_id`.
    pub fn save_checkpoint(&mut self, run_id: &str, checkpoint: &Checkpoint) -> Result<(), StateError> {
        let blob = serde_json::to_string(checkpoint).map_err(|e| StateError::Checkpoint {
            path: self.store.path().to_string(),
            run_id: run_id.into(),
            message: e.to_string(),
        })?;
        self.store.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO checkpoints (run_id, step, state) VALUES (?1, ?2, ?3)",
                rusqlite::params![run_id, checkpoint.state.step, blob],
            )
        })?;
        Ok(())
    }

    /// Drops the checkpoint of a run that no longer waits.
    pub fn delete_checkpoint(&mut self, run_id: &str) -> Result<(), StoreError> {
        delete_checkpoint_of(&mut self.store, run_id)
    }

    /// Ends run `run_id`, which waits for approval but whose checkpoint cannot be read
    /// (so no decision and no resume can ever finish it): failed, `checkpoint_failed`,
    /// its checkpoint dropped, so its task fires again.
    pub fn give_up_waiting(&mut self, run_id: &str) -> Result<(), StoreError> {
        let now = Utc::now().to_rfc3339();
        self.store.write(|tx| {
            tx.execute(
                "UPDATE runs SET status = ?2, stop_reason = ?3, finished_at = ?4 WHERE run_id = ?1 AND status = ?5",
                rusqlite::params![
                    run_id,
                    RunStatus::Failed.as_str(),
                    StopReason::CheckpointFailed.as_str(),
                    now,
                    RunStatus::WaitingApproval.as_str()
                ],
            )?;
            tx.execute("DELETE FROM checkpoints WHERE run_id = ?1", [run_id])
        })?;
        Ok(())
    }
}

/// Why the state database at `path` is empty where it must hold a schema: a file of
/// 0 bytes with no write-ahead log holding its pages (a full disk or a file system
/// crash truncated it, or someone did). SQLite would take it for a new database and
/// the runs waiting in it would be lost without a word.
fn emptied(path: &Path) -> Option<String> {
    // A database being created is 0 bytes for a moment too (a concurrent fire made
    // it), and one whose creator was killed right then never held anything: only a
    // database once opened with its schema counts.
    if !made_marker(path).exists() {
        return None;
    }
    let len = std::fs::metadata(path).ok()?.len();
    let mut wal = path.as_os_str().to_os_string();
    wal.push("-wal");
    let wal_len = std::fs::metadata(PathBuf::from(wal)).map(|m| m.len()).unwrap_or(0);
    (len == 0 && wal_len == 0).then(|| {
        format!(
            "{}: the file is empty (0 bytes): what it held was lost (a full disk, a crash of its file system, or a truncation)",
            path.display()
        )
    })
}

/// The file beside the state database that says it was once opened with its schema
/// (`state.db.made`), so a 0-byte database later is known to have lost what it held.
fn made_marker(path: &Path) -> PathBuf {
    let mut marker = path.as_os_str().to_os_string();
    marker.push(".made");
    PathBuf::from(marker)
}

/// Leaves [`made_marker`] once the database opened with its schema (best effort: a
/// missing marker only means a truncated database is taken for a new one).
fn mark_made(path: &Path) {
    let marker = made_marker(path);
    if !marker.exists() {
        if let Err(e) = std::fs::write(&marker, b"") {
            tracing::debug!(error = %e, "the state database's marker was not written");
        }
    }
}

/// Copies every pause the damaged database at `damaged` still shows (its checkpoint,
/// its run row and a builder's decision on it) into the new `store`, so a run that
/// waited for approval goes on waiting; returns the runs kept. Best effort: a row
/// that cannot be read is not kept (the card says the task asks again).
fn salvage_pauses(damaged: &Path, store: &mut Store) -> Vec<String> {
    use rusqlite::OpenFlags;
    let Ok(conn) = rusqlite::Connection::open_with_flags(damaged, OpenFlags::SQLITE_OPEN_READ_ONLY) else {
        return vec![];
    };
    type Row = (String, i64, String);
    let checkpoints: Vec<Row> = conn
        .prepare("SELECT run_id, step, state FROM checkpoints ORDER BY run_id")
        .and_then(|mut stmt| {
            stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
                .collect::<Result<Vec<_>, _>>()
        })
        .unwrap_or_default();
    let mut kept = Vec::new();
    for (run_id, step, state) in checkpoints {
        let Ok(task) = serde_json::from_str::<Checkpoint>(&state).map(|c| c.task) else {
            continue;
        };
        let started_at: String = conn
            .query_row("SELECT started_at FROM runs WHERE run_id = ?1", [&run_id], |r| r.get(0))
            .unwrap_or_else(|_| Utc::now().to_rfc3339());
        let decisions: Vec<(String, String, String, String, String)> = conn
            .prepare("SELECT call_id, args_hash, decision, by, at FROM approvals WHERE run_id = ?1")
            .and_then(|mut stmt| {
                stmt.query_map([&run_id], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
                })?
                .collect::<Result<Vec<_>, _>>()
            })
            .unwrap_or_default();
        let copied = store.write(|tx| {
            tx.execute(
                "INSERT OR IGNORE INTO runs (run_id, task, status, stop_reason, started_at) VALUES (?1, ?2, 'waiting_approval', 'waiting_approval', ?3)",
                rusqlite::params![run_id, task, started_at],
            )?;
            tx.execute(
                "INSERT OR IGNORE INTO checkpoints (run_id, step, state) VALUES (?1, ?2, ?3)",
                rusqlite::params![run_id, step, state],
            )?;
            for (call_id, hash, decision, by, at) in &decisions {
                tx.execute(
                    "INSERT OR IGNORE INTO approvals (run_id, call_id, args_hash, decision, by, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    rusqlite::params![run_id, call_id, hash, decision, by, at],
                )?;
            }
            Ok(())
        });
        match copied {
            Ok(()) => kept.push(format!("run {run_id} of task {task} waiting for approval")),
            Err(e) => tracing::warn!(run = %run_id, error = %e, "a paused run could not be kept"),
        }
    }
    kept
}

fn file_inode(path: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| m.ino())
}

/// Opens the store at `path` where it is sound: an emptied or damaged file is
/// [`OpenFailure::Damaged`], for the caller to move aside or leave.
fn open_sound(path: &Path) -> Result<Store, OpenFailure> {
    match emptied(path) {
        Some(reason) => Err(OpenFailure::Damaged(reason)),
        None => open_checked(path),
    }
}

/// Opens the store and checks it.
fn open_checked(path: &Path) -> Result<Store, OpenFailure> {
    // `quick_check` reads every page (160 ms at 70 MB): once per process and file is
    // enough, as a fire opens the database several times; later opens still catch a
    // file SQLite cannot read at all. Nor is it needed when the files are as this
    // runtime left them after its last write ([`left_as_recorded`]). The checked
    // open reads the file itself, through a new connection.
    let checked = !checked_in_process(path) && !left_as_recorded(path);
    let opened = if checked {
        Store::open_new(path, RUNTIME_SCHEMA)
    } else {
        Store::open(path, RUNTIME_SCHEMA)
    };
    let store = match opened {
        Ok(s) => s,
        Err(e) if e.is_damage() => return Err(OpenFailure::Damaged(e.to_string())),
        Err(e) => return Err(OpenFailure::Other(e)),
    };
    if !checked {
        mark_checked(path);
        return Ok(store);
    }
    match store.quick_check() {
        Ok(None) => {
            mark_checked(path);
            Ok(store)
        }
        Ok(Some(found)) => Err(OpenFailure::Damaged(format!(
            "{}: PRAGMA quick_check: {found}",
            path.display()
        ))),
        Err(e) if e.is_damage() => Err(OpenFailure::Damaged(e.to_string())),
        Err(e) => Err(OpenFailure::Other(e)),
    }
}

/// `state.db.sound`: the database's files (inode, size and modification time of
/// the file and its write-ahead log) as a runtime left them when it last closed a
/// connection on them, having found them sound when it opened them. A file changed
/// since by anything but that close (a truncation, another writer, a crash mid-way
/// through a write) no longer matches, and the next open checks it whole.
fn sound_stamp(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_os_string();
    p.push(".sound");
    PathBuf::from(p)
}

/// What [`sound_stamp`] records of the database's files now.
fn files_stamp(path: &Path) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).ok()?;
    let mut wal = path.as_os_str().to_os_string();
    wal.push("-wal");
    let wal = std::fs::metadata(PathBuf::from(wal))
        .map(|w| format!("{} {} {}.{}", w.ino(), w.len(), w.mtime(), w.mtime_nsec()))
        .unwrap_or_else(|_| "-".into());
    Some(format!(
        "{} {} {}.{}\n{wal}\n",
        m.ino(),
        m.len(),
        m.mtime(),
        m.mtime_nsec()
    ))
}

/// Whether the database's files are as [`record_sound`] last left them.
fn left_as_recorded(path: &Path) -> bool {
    let Ok(recorded) = std::fs::read_to_string(sound_stamp(path)) else {
        return false;
    };
    files_stamp(path).is_some_and(|now| now == recorded)
}

/// Records the database's files as this process leaves them: called as a store
/// opened sound closes (best effort: without it the next open checks the file).
/// Written in place and only when it changes: a fire closes the database several
/// times, and a new file for each (a temporary renamed over the stamp) is an inode
/// allocated and one freed every time. The stamp is a hint, so a torn or interleaved
/// write costs nothing but the next open's full check: it cannot match the files.
fn record_sound(path: &Path) {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let Some(now) = files_stamp(path) else {
        return;
    };
    let stamp = sound_stamp(path);
    if std::fs::read_to_string(&stamp).is_ok_and(|held| held == now) {
        return;
    }
    // Over the old bytes, then cut to length: truncating first would free the file's
    // block and allocate another for every stamp.
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&stamp)
        .and_then(|mut f| {
            f.write_all(now.as_bytes())?;
            f.set_len(now.len() as u64)
        });
    if let Err(e) = written {
        tracing::debug!(error = %e, "the state database's sound stamp was not written");
    }
}

/// Whether this process has already found the database at `path` sound.
fn checked_in_process(path: &Path) -> bool {
    CHECKED.lock().is_ok_and(|set| set.contains(path))
}

/// Notes that this process found the database at `path` sound.
fn mark_checked(path: &Path) {
    if let Ok(mut set) = CHECKED.lock() {
        set.insert(path.to_path_buf());
    }
}

/// The databases this process has checked whole ([`open_checked`]).
static CHECKED: std::sync::Mutex<std::collections::BTreeSet<PathBuf>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Moves the damaged database at `path` (and its write-ahead log) aside, reads what
/// it can of it, and leaves a note for the next fire. `None` when another process
/// moved it first (the file at `path` is no longer the one found damaged).
fn move_aside(root: &Path, path: &Path, inode: Option<u64>, reason: String) -> Result<Option<StateReset>, StoreError> {
    if inode.is_none() || file_inode(path) != inode {
        return Ok(None);
    }
    let at = Utc::now();
    let stamp = at.format("%Y%m%dT%H%M%S%.3fZ");
    let moved_to = path.with_file_name(format!("{STATE_DB_FILE}.damaged-{stamp}"));
    let io = |p: &Path| {
        let p = p.display().to_string();
        move |e| StoreError::Io { path: p, source: e }
    };
    match std::fs::rename(path, &moved_to) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(path)(e)),
    }
    let side = |p: &Path, suffix: &str| {
        let mut s = p.as_os_str().to_os_string();
        s.push(suffix);
        PathBuf::from(s)
    };
    // The log belongs to the damaged file (SQLite finds it by this name); the shared
    // memory index is rebuilt from the log.
    match std::fs::rename(side(path, "-wal"), side(&moved_to, "-wal")) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(&side(path, "-wal"))(e)),
    }
    let _ = std::fs::remove_file(side(path, "-shm"));
    let reset = StateReset {
        reason,
        lost: readable_contents(&moved_to),
        kept: Vec::new(),
        moved_to: moved_to.strip_prefix(root).unwrap_or(&moved_to).to_path_buf(),
        at,
    };
    tracing::warn!(moved_to = %moved_to.display(), reason = %reset.reason, "the state database was damaged; rebuilt empty");
    write_note(root, &reset);
    Ok(Some(reset))
}

/// Leaves (or rewrites) the note of `reset` for the next fire's `state_reset` card.
fn write_note(root: &Path, reset: &StateReset) {
    let stamp = reset.at.format("%Y%m%dT%H%M%S%.3fZ");
    let note = root.join(STATE_DIR).join(format!("{RESET_NOTE_PREFIX}{stamp}.json"));
    if let Ok(body) = serde_json::to_vec_pretty(reset) {
        if let Err(e) = std::fs::write(&note, body) {
            tracing::warn!(note = %note.display(), error = %e, "the reset note was not written");
        }
    }
}

/// What a damaged database still shows: runs waiting for approval (their
/// checkpoints), and how many run rows it had.
fn readable_contents(path: &Path) -> Vec<String> {
    use rusqlite::OpenFlags;
    let Ok(conn) = rusqlite::Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY) else {
        return vec![];
    };
    let mut lost = Vec::new();
    if let Ok(mut stmt) = conn.prepare("SELECT run_id, state FROM checkpoints ORDER BY run_id") {
        let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1).ok())));
        if let Ok(rows) = rows {
            for (run_id, state) in rows.flatten() {
                let task = state
                    .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
                    .and_then(|v| v["task"].as_str().map(str::to_string));
                lost.push(match task {
                    Some(t) => format!("run {run_id} of task {t} waiting for approval"),
                    None => format!("run {run_id} waiting for approval"),
                });
            }
        }
    }
    if let Ok(n) = conn.query_row("SELECT count(*) FROM runs", [], |r| r.get::<_, i64>(0)) {
        lost.push(format!("{n} run rows"));
    }
    lost
}

/// A held lock file; released when dropped (or when the process dies).
#[derive(Debug)]
pub struct LockFile {
    file: File,
}

impl LockFile {
    /// When the last sweep marked on this lock began ([`LockFile::mark_swept`]): the
    /// file's modification time, trusted only beside the access time the mark sets
    /// (the epoch; nothing reads a lock file, so nothing moves it). A lock file no
    /// sweep marked yet (new, or copied with a new box) reads as never swept.
    pub fn last_sweep(&self) -> Option<std::time::SystemTime> {
        let meta = self.file.metadata().ok()?;
        (meta.accessed().ok()? == std::time::UNIX_EPOCH)
            .then(|| meta.modified().ok())
            .flatten()
    }

    /// Marks a sweep that began at `began` ([`LockFile::last_sweep`]). It changes the
    /// times of the file only, so it makes no inode and writes no data.
    pub fn mark_swept(&self, began: std::time::SystemTime) -> std::io::Result<()> {
        self.file.set_times(
            std::fs::FileTimes::new()
                .set_accessed(std::time::UNIX_EPOCH)
                .set_modified(began),
        )
    }
}

/// Whether to wait for a busy lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockWait {
    Wait,
    NoWait,
}

/// Path of the lock that serialises fires of `task`.
pub fn task_lock_path(root: &Path, task: &str) -> PathBuf {
    root.join(STATE_DIR).join("locks").join(format!("{task}.lock"))
}

/// Path of the lock that serialises the runtime's commits.
pub fn commit_lock_path(root: &Path) -> PathBuf {
    root.join(STATE_DIR).join("locks").join("commit.lock")
}

/// Takes an flock on `path`; `Ok(None)` when busy and `wait` is [`LockWait::NoWait`].
pub fn take_lock(path: &Path, wait: LockWait) -> std::io::Result<Option<LockFile>> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    let wait = match wait {
        LockWait::Wait => kernel::fs::Wait::Yes,
        LockWait::NoWait => kernel::fs::Wait::No,
    };
    let taken = kernel::fs::lock_exclusive(&file, wait)?;
    Ok(taken.then_some(LockFile { file }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loop_state::PendingApproval;
    use crate::provider::ToolCall;

    fn paused(call_id: &str) -> Checkpoint {
        let call = ToolCall {
            id: call_id.into(),
            name: "run_command".into(),
            arguments: r#"{"command":"curl x"}"#.into(),
        };
        let state = LoopState {
            step: 2,
            pending: Some(PendingApproval {
                args_hash: call_hash(&call.name, &call.arguments),
                call,
                step: 2,
                pins: vec![],
            }),
            ..LoopState::default()
        };
        Checkpoint {
            task: "t".into(),
            state,
        }
    }

    #[test]
    fn the_waiting_run_is_found_from_the_checkpoints_not_the_tasks_history() {
        let dir = tempfile::tempdir().unwrap();
        let db = StateDb::open(dir.path()).unwrap();
        let plan: Vec<String> = db
            .store()
            .conn()
            .prepare(&format!("EXPLAIN QUERY PLAN {WAITING_RUN_SQL}"))
            .unwrap()
            .query_map(["t"], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert!(plan[0].starts_with("SCAN c"), "{plan:?}");
        assert!(
            plan[1].starts_with("SEARCH r USING INDEX sqlite_autoindex_runs_1"),
            "{plan:?}"
        );
    }

    #[test]
    fn a_decision_binds_to_the_paused_call_and_its_hash() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = StateDb::open(dir.path()).unwrap();
        db.save_checkpoint("r1", &paused("c1")).unwrap();
        assert!(matches!(
            db.record_decision("r1", "c2", CallDecision::Approve, "a <a@x>"),
            Err(StateError::OtherCall { .. })
        ));
        assert!(matches!(
            db.record_decision("r9", "c1", CallDecision::Approve, "a <a@x>"),
            Err(StateError::NoCheckpoint(_))
        ));
        let call = db
            .record_decision("r1", "c1", CallDecision::Approve, "a <a@x>")
            .unwrap();
        assert_eq!(call, r#"run_command {"command":"curl x"}"#);
        let hash = call_hash("run_command", r#"{"command":"curl x"}"#);
        assert_eq!(db.decision("r1", "c1", &hash).unwrap(), Some(CallDecision::Approve));
        assert_eq!(db.decision("r1", "c1", "other-hash").unwrap(), None);
    }

    #[test]
    fn checkpoints_round_trip_and_delete() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = StateDb::open(dir.path()).unwrap();
        assert!(db.checkpoint("r1").unwrap().is_none());
        db.save_checkpoint("r1", &paused("c1")).unwrap();
        let back = db.checkpoint("r1").unwrap().unwrap();
        assert_eq!(back.task, "t");
        assert_eq!(back.state.step, 2);
        db.delete_checkpoint("r1").unwrap();
        assert!(db.checkpoint("r1").unwrap().is_none());
    }

    #[test]
    fn a_state_db_from_the_shared_migration_list_still_opens() {
        // A file written when both databases shared one list is at version 4 with the
        // builder's card_files table: the runtime's list must accept it as current.
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(dir.path());
        let shared_list = Schema {
            migrations: &[
                SHARED_HISTORY[0],
                SHARED_HISTORY[1],
                SHARED_HISTORY[2],
                "CREATE TABLE card_files (path TEXT PRIMARY KEY);",
            ],
        };
        drop(Store::open(&path, shared_list).unwrap());
        let db = StateDb::open(dir.path()).unwrap();
        assert_eq!(db.store().schema_version().unwrap(), RUNTIME_SCHEMA.version());
    }

    #[test]
    fn an_unchanged_refusal_is_counted_until_the_task_fires() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = StateDb::open(dir.path()).unwrap();
        let now = Utc::now();
        assert_eq!(db.repeat_refusal("t", "fp", "tree1", now).unwrap(), None);
        db.remember_refusal("t", "fp", "tree1", "card-1", now).unwrap();
        let again = db.repeat_refusal("t", "fp", "tree1", now).unwrap().unwrap();
        assert_eq!((again.card_id.as_str(), again.count), ("card-1", 2));
        assert_eq!(db.repeat_refusal("t", "fp", "tree1", now).unwrap().unwrap().count, 3);
        assert_eq!(
            db.repeat_refusal("t", "fp", "tree2", now).unwrap(),
            None,
            "another tree is news"
        );
        assert_eq!(db.repeat_refusal("t", "other", "tree1", now).unwrap(), None);
        assert_eq!(db.repeat_refusal("u", "fp", "tree1", now).unwrap(), None);
        db.clear_refusal("t").unwrap();
        assert_eq!(db.repeat_refusal("t", "fp", "tree1", now).unwrap(), None);
    }

    #[test]
    fn a_file_that_is_not_a_database_is_moved_aside_rebuilt_and_noted() {
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(dir.path());
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, vec![0x5a; 8192]).unwrap();
        let mut db = StateDb::open(dir.path()).unwrap();
        let reset = db.reset().cloned().expect("the damage is reported");
        assert!(reset.reason.contains("not a database"), "{}", reset.reason);
        assert!(reset.lost.is_empty(), "nothing readable: {:?}", reset.lost);
        let moved = dir.path().join(&reset.moved_to);
        assert!(moved.starts_with(dir.path().join(STATE_DIR)));
        assert_eq!(
            std::fs::read(&moved).unwrap(),
            vec![0x5a; 8192],
            "the damaged file is kept"
        );
        // The new database works, and the next open finds nothing wrong.
        db.save_checkpoint("r1", &paused("c1")).unwrap();
        drop(db);
        let again = StateDb::open(dir.path()).unwrap();
        assert!(again.reset().is_none());
        assert!(again.checkpoint("r1").unwrap().is_some());
        // The note waits for a fire's card until reported.
        let pending = owed_cards(dir.path());
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].1, reset.card());
        let card = &pending[0].1;
        assert_eq!(card.kind, CardKind::StateReset);
        assert!(card.detail.contains(&reset.moved_to.display().to_string()));
        card_reported(&pending[0].0);
        assert!(owed_cards(dir.path()).is_empty());
    }

    #[test]
    fn a_database_left_as_the_last_close_recorded_it_needs_no_check_and_any_change_does() {
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(dir.path());
        let mut db = StateDb::open(dir.path()).unwrap();
        db.save_checkpoint("r1", &paused("c1")).unwrap();
        assert!(!left_as_recorded(&path), "nothing recorded before the first close");
        drop(db);
        assert!(left_as_recorded(&path), "the close recorded the files as it left them");
        // A write through another store (another process's fire) changes them.
        let mut other = Store::open_new(&path, RUNTIME_SCHEMA).unwrap();
        other
            .write(|tx| tx.execute("INSERT INTO meta (key, value) VALUES ('k', 'v')", []))
            .unwrap();
        assert!(!left_as_recorded(&path), "a write since the close shows");
        drop(other);
        // A close of a store opened sound records them again; a truncation of the
        // write-ahead log, as a crash or a person could leave it, shows.
        drop(StateDb::open(dir.path()).unwrap());
        assert!(left_as_recorded(&path));
        let mut wal = path.as_os_str().to_os_string();
        wal.push("-wal");
        std::fs::OpenOptions::new()
            .write(true)
            .open(PathBuf::from(wal))
            .unwrap()
            .set_len(0)
            .unwrap();
        assert!(!left_as_recorded(&path), "a truncated log shows");
    }

    #[test]
    fn a_database_failing_quick_check_is_reset_naming_the_runs_that_waited() {
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(dir.path());
        // Built without `StateDb::open`, whose first open in this process is the
        // checked one below.
        let mut db = StateDb {
            store: Store::open(&path, RUNTIME_SCHEMA).unwrap(),
            reset: None,
        };
        db.save_checkpoint("r-waiting", &paused("c1")).unwrap();
        // Many rows in a later table, so its pages lie at the end of the file.
        db.store
            .write(|tx| {
                for i in 0..2000 {
                    tx.execute(
                        "INSERT INTO meta (key, value) VALUES (?1, ?2)",
                        rusqlite::params![format!("k{i:05}"), "v".repeat(200)],
                    )?;
                }
                Ok(())
            })
            .unwrap();
        db.store.checkpoint().unwrap();
        drop(db);
        // Scribble over interior pages near the end of the file.
        let mut bytes = std::fs::read(&path).unwrap();
        let len = bytes.len();
        for b in &mut bytes[len - 40 * 4096..len - 20 * 4096] {
            *b = 0xff;
        }
        std::fs::write(&path, bytes).unwrap();
        let db = StateDb::open(dir.path()).unwrap();
        let reset = db.reset().cloned().expect("quick_check finds the damage");
        assert!(reset.reason.contains("quick_check"), "{}", reset.reason);
        assert!(
            reset
                .lost
                .iter()
                .any(|l| l.contains("r-waiting") && l.contains("task t")),
            "names the run that waited: {:?}",
            reset.lost
        );
        // The pause was readable: kept, so the run still waits (and can be resumed).
        assert!(
            reset.kept.iter().any(|k| k.contains("r-waiting")),
            "the readable pause is kept: {:?}",
            reset.kept
        );
        assert!(db.checkpoint("r-waiting").unwrap().is_some());
        assert_eq!(db.waiting_run("t").unwrap().as_deref(), Some("r-waiting"));
        assert!(reset.card().detail.contains("Kept in the new database"));
    }

    #[test]
    fn an_empty_database_file_is_a_reset_not_a_new_database() {
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(dir.path());
        let mut db = StateDb::open(dir.path()).unwrap();
        db.save_checkpoint("r1", &paused("c1")).unwrap();
        db.store.checkpoint().unwrap();
        drop(db);
        for side in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{side}", path.display()));
        }
        std::fs::write(&path, b"").unwrap();
        let db = StateDb::open(dir.path()).unwrap();
        let reset = db.reset().cloned().expect("an emptied file is reported");
        assert!(reset.reason.contains("empty (0 bytes)"), "{}", reset.reason);
        let card = reset.card();
        assert!(card.detail.contains("asks again"), "{}", card.detail);
        assert_eq!(owed_cards(dir.path()).len(), 1, "a note waits for the card");
        // A fresh database (never written) is not a reset.
        let other = tempfile::tempdir().unwrap();
        assert!(StateDb::open(other.path()).unwrap().reset().is_none());
    }

    #[test]
    fn a_journals_store_serves_the_fires_end_only_while_its_file_is_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = db_path(dir.path());
        let store = StateDb::open(dir.path()).unwrap().into_store();
        let store = StateDb::reopen(store, dir.path()).unwrap().into_store();
        assert!(store.still_on_its_file(), "the same file: the same connection");
        // Another fire found it damaged: moved aside (with its log), a new one made.
        for ext in ["", "-wal", "-shm"] {
            let from = format!("{}{ext}", path.display());
            let _ = std::fs::rename(&from, format!("{from}.aside"));
        }
        drop(StateDb::open(dir.path()).unwrap());
        assert!(!store.still_on_its_file());
        let again = StateDb::reopen(store, dir.path()).unwrap();
        assert!(again.store().still_on_its_file(), "opened on the new file");
    }

    #[test]
    fn a_sound_database_is_not_reset() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = StateDb::open(dir.path()).unwrap();
        db.save_checkpoint("r1", &paused("c1")).unwrap();
        drop(db);
        let db = StateDb::open(dir.path()).unwrap();
        assert!(db.reset().is_none());
        assert!(owed_cards(dir.path()).is_empty());
        assert!(db.checkpoint("r1").unwrap().is_some());
    }

    #[test]
    fn a_busy_lock_is_reported_not_waited_for() {
        let dir = tempfile::tempdir().unwrap();
        let path = task_lock_path(dir.path(), "t");
        let held = take_lock(&path, LockWait::NoWait).unwrap();
        assert!(held.is_some());
        assert!(take_lock(&path, LockWait::NoWait).unwrap().is_none());
        drop(held);
        assert!(take_lock(&path, LockWait::NoWait).unwrap().is_some());
    }
}
