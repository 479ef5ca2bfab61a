//! The runtime's local state in `.runtime/` (git-ignored): the state database
//! (`state.db`: run rows and traces, skipped fires, builder decisions on paused calls,
//! checkpoints of paused runs) and the lock files that keep two fires of one task, or
//! two commits, from running at once. Both binaries use this one home: the runtime
//! writes runs and checkpoints, `builder approve-call` records decisions.

use crate::agent::{call_hash, CallDecision, LoopState};
use crate::layout::STATE_DIR;
use crate::records::Receipt;
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
    ],
};

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
}

impl StateDb {
    /// Opens (creating and migrating) the state database of the repository at `root`.
    pub fn open(root: &Path) -> Result<StateDb, StoreError> {
        Ok(StateDb {
            store: Store::open(&db_path(root), RUNTIME_SCHEMA)?,
        })
    }

    /// The underlying store, for the run queries `runtime runs` and `show` share with
    /// the builder's history.
    pub fn store(&self) -> &Store {
        &self.store
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

    /// Forgets the task's last refusal: the task fired, so the next refusal is news.
    pub fn clear_refusal(&mut self, task: &str) -> Result<(), StoreError> {
        self.store
            .write(|tx| tx.execute("DELETE FROM refusals WHERE task = ?1", [task]))?;
        Ok(())
    }

    /// Stores a finished run: its row and its trace, in one transaction.
    pub fn save_run(
        &mut self,
        trace: &Trace,
        receipt: &Receipt,
        receipt_path: &str,
        report_path: &str,
    ) -> Result<(), StoreError> {
        trace.save(&mut self.store, receipt, receipt_path, report_path)
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
        self.store
            .write(|tx| tx.execute("DELETE FROM checkpoints WHERE run_id = ?1", [run_id]))?;
        Ok(())
    }
}

/// A held lock file; released when dropped (or when the process dies).
#[derive(Debug)]
pub struct LockFile {
    _file: File,
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
    use std::os::unix::io::AsRawFd;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)?;
    let op = match wait {
        LockWait::Wait => libc::LOCK_EX,
        LockWait::NoWait => libc::LOCK_EX | libc::LOCK_NB,
    };
    // SAFETY: flock on a descriptor we own.
    let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
    if rc == 0 {
        return Ok(Some(LockFile { _file: file }));
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(None)
    } else {
        Err(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::PendingApproval;
    use crate::provider::ToolCall;

    fn paused(call_id: &str) -> Checkpoint {
        let call = ToolCall {
            id: call_id.into(),
            name: "run_command".into(),
            arguments: r#"{"command":"curl x"}"#.into(),
        };
        let mut state = LoopState::default();
        state.step = 2;
        state.pending = Some(PendingApproval {
            args_hash: call_hash(&call.name, &call.arguments),
            call,
            step: 2,
        });
        Checkpoint {
            task: "t".into(),
            state,
        }
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
