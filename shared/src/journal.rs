//! The run journal in the state database: a run exists from its first moment. Its
//! `runs` row is written as `running` (with the owning process) before prefetch, a
//! checkpoint follows every step in one SQLite transaction (the loop state with its
//! messages, budgets and decisions, the row's totals, and the tool ledger), and each
//! call the tool worker runs moves through the ledger `intended -> started ->
//! completed` (with a hash of its result), keyed by run id and call id. The loop sees
//! the state only as serialized text, so this module sits below `agent` (which writes
//! it) and beside `state` (which owns the schema and opens the file).

use crate::store::{Store, StoreError};
use chrono::{DateTime, Utc};
use rusqlite::OptionalExtension;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Where a call stands in the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[serde(rename_all = "snake_case")]
pub enum CallStage {
    /// The model asked for it; nothing has run.
    Intended,
    /// Handed to the tool worker: its side effect may have happened.
    Started,
    /// Its result is recorded: never run again.
    Completed,
}

impl CallStage {
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    fn from_stored(s: &str) -> CallStage {
        match s {
            "completed" => CallStage::Completed,
            "intended" => CallStage::Intended,
            // Anything else may have run: treat it as started (fail safe).
            _ => CallStage::Started,
        }
    }
}

/// One call's ledger entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerEntry {
    pub call_id: String,
    pub name: String,
    pub args_hash: String,
    pub stage: CallStage,
    /// The recorded result (serialized), once completed.
    pub result: Option<String>,
}

impl LedgerEntry {
    /// SHA-256 of the recorded result, stored beside it.
    fn result_hash(&self) -> Option<String> {
        self.result.as_deref().map(|r| sha256_hex(r.as_bytes()))
    }
}

/// A run's first row: who runs it, on which inputs.
pub struct RunStart<'a> {
    pub run_id: &'a str,
    pub task: &'a str,
    pub started_at: DateTime<Utc>,
    /// The run whose tool ledger this run continues (the paused run it resumes), or
    /// this run's own id.
    pub ledger_run: &'a str,
    /// The input versions (serialized receipt inputs), for recovery's comparison.
    pub inputs: &'a str,
    /// `strict`: every write of the run (its row, checkpoints, ledger) is fsynced
    /// before it returns (SQLite `synchronous=FULL`).
    pub durability: crate::settings::Durability,
}

/// The running totals a checkpoint writes into the run's row.
#[derive(Debug, Clone, Copy, Default)]
pub struct Totals {
    pub step: u32,
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub cost_usd: f64,
    pub denials: u32,
    pub retries: u32,
}

/// An interrupted or live run as the journal knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveRun {
    pub run_id: String,
    pub task: String,
    pub pid: u32,
    pub pid_start: Option<u64>,
    pub ledger_run: String,
    pub step: u32,
    pub state: Option<String>,
    pub inputs: String,
    pub started_at: String,
    pub updated_at: String,
    /// The boot (`/proc/sys/kernel/random/boot_id`) and `CLOCK_BOOTTIME` reading of its
    /// last checkpoint, where known.
    pub boot: Option<BootTime>,
    /// The SHA-256 of each record the run wrote, by path (JSON), noted before its
    /// receipt ([`crate::state::StateDb::note_records`]); `None` before that.
    pub records: Option<String>,
}

/// The SHA-256 of `bytes`, in hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

impl LiveRun {
    /// The SHA-256 of each record the run wrote, by path, if noted.
    pub fn record_hashes(&self) -> Option<std::collections::BTreeMap<String, String>> {
        serde_json::from_str(self.records.as_deref()?).ok()
    }

    /// Whether the process that ran it is gone (killed, crashed, rebooted).
    pub fn owner_gone(&self) -> bool {
        crate::git::process_is_gone(self.pid, self.pid_start)
    }

    /// How long ago its last checkpoint was written: on the boot clock when it was
    /// written in this boot (a wall clock stepped forward, by NTP or a person, does
    /// not age it), else by the wall clock (after a reboot the boot clock starts over).
    pub fn idle(&self, now: DateTime<Utc>) -> std::time::Duration {
        if let (Some(then), Some(current)) = (&self.boot, BootTime::now()) {
            if then.boot_id == current.boot_id {
                return std::time::Duration::from_nanos(current.ns.saturating_sub(then.ns).max(0) as u64);
            }
        }
        let last = DateTime::parse_from_rfc3339(&self.updated_at)
            .map(|t| t.with_timezone(&Utc))
            .unwrap_or(DateTime::<Utc>::MIN_UTC);
        (now - last).to_std().unwrap_or_default()
    }
}

/// A reading of the boot clock: which boot, and `CLOCK_BOOTTIME` in nanoseconds
/// (monotonic, counting suspend, never stepped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootTime {
    pub boot_id: String,
    pub ns: i64,
}

impl BootTime {
    /// Now, or `None` without `/proc` (then the wall clock is all there is). The boot
    /// id is read once per process: it cannot change while the process lives.
    pub fn now() -> Option<BootTime> {
        static BOOT_ID: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
        let boot_id = BOOT_ID.get_or_init(|| {
            let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
            Some(id.trim().to_string())
        });
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        Some(BootTime {
            boot_id: boot_id.clone()?,
            ns: t.tv_sec.saturating_mul(1_000_000_000).saturating_add(t.tv_nsec),
        })
    }
}

/// The open journal of one run.
pub struct Journal {
    store: Store,
    run_id: String,
    ledger_run: String,
}

impl Journal {
    /// Writes the run's `running` row and its live row in one transaction, and keeps
    /// the store for the run's checkpoints.
    pub fn begin(mut store: Store, run: &RunStart) -> Result<Journal, StoreError> {
        store.sync_every_commit(run.durability.fsyncs())?;
        let pid = std::process::id();
        let pid_start = crate::git::process_start_time(pid).map(|t| t as i64);
        let at = run.started_at.to_rfc3339();
        let boot = BootTime::now();
        let (boot_id, boot_ns) = (boot.as_ref().map(|b| b.boot_id.clone()), boot.map(|b| b.ns));
        store.write(|tx| {
            tx.execute(
                "INSERT OR REPLACE INTO runs (run_id, task, status, stop_reason, started_at) VALUES (?1, ?2, 'running', 'not_started', ?3)",
                rusqlite::params![run.run_id, run.task, at],
            )?;
            // A resumed run (an interrupted one this fire continues under its run id)
            // keeps its checkpoint and its time (the resume window counts from the
            // checkpoint, not from attempts): this process takes the row over, and a kill before
            // its first new checkpoint leaves the same run to resume again, not one
            // with "no checkpoint yet" that is closed as crashed, its finished records
            // removed and its completed calls run again (helper-96).
            tx.execute(
                "INSERT INTO live_runs (run_id, task, pid, pid_start, ledger_run, step, state, inputs, updated_at, boot_id, boot_ns) VALUES (?1, ?2, ?3, ?4, ?5, 0, NULL, ?6, ?7, ?8, ?9)
                 ON CONFLICT(run_id) DO UPDATE SET pid = excluded.pid, pid_start = excluded.pid_start, ledger_run = excluded.ledger_run",
                rusqlite::params![run.run_id, run.task, pid, pid_start, run.ledger_run, run.inputs, at, boot_id, boot_ns],
            )
        })?;
        Ok(Journal {
            store,
            run_id: run.run_id.to_string(),
            ledger_run: run.ledger_run.to_string(),
        })
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// The state database the journal writes to.
    pub fn db_path(&self) -> &str {
        self.store.path()
    }

    /// The run whose ledger this run's calls go into.
    pub fn ledger_run(&self) -> &str {
        &self.ledger_run
    }

    /// The checkpoint after a step: the serialized loop state, the row's totals and
    /// the ledger entries that changed, in one transaction (durable as the store's
    /// `synchronous` setting makes it before this returns).
    pub fn checkpoint(&mut self, state: &str, totals: Totals, ledger: &[LedgerEntry]) -> Result<(), StoreError> {
        let (run, ledger_run) = (&self.run_id, &self.ledger_run);
        let now = Utc::now().to_rfc3339();
        let boot = BootTime::now();
        let (boot_id, boot_ns) = (boot.as_ref().map(|b| b.boot_id.clone()), boot.map(|b| b.ns));
        self.store.write(|tx| {
            tx.prepare_cached(
                "UPDATE live_runs SET step = ?2, state = ?3, updated_at = ?4, boot_id = ?5, boot_ns = ?6 WHERE run_id = ?1",
            )?
            .execute(rusqlite::params![run, totals.step, state, now, boot_id, boot_ns])?;
            tx.prepare_cached(
                "UPDATE runs SET steps = ?2, tokens_in = ?3, tokens_out = ?4, cost_usd = ?5, denials = ?6, retries = ?7 WHERE run_id = ?1 AND status = 'running'",
            )?
            .execute(rusqlite::params![
                run,
                totals.step,
                totals.tokens_in as i64,
                totals.tokens_out as i64,
                totals.cost_usd,
                totals.denials,
                totals.retries
            ])?;
            for e in ledger {
                put_entry(tx, ledger_run, e, &now)?;
            }
            Ok(())
        })
    }

    /// Marks one call `started`, durably, before the worker gets it.
    pub fn started(&mut self, entry: &LedgerEntry) -> Result<(), StoreError> {
        let ledger_run = &self.ledger_run;
        let now = Utc::now().to_rfc3339();
        self.store.write(|tx| put_entry(tx, ledger_run, entry, &now))?;
        Ok(())
    }

    /// What the ledger holds for `call_id` of this run's ledger.
    pub fn entry(&self, call_id: &str) -> Result<Option<LedgerEntry>, StoreError> {
        ledger_entry(&self.store, &self.ledger_run, call_id)
    }

    /// Gives the store back (the run's records are written through it).
    pub fn into_store(self) -> Store {
        self.store
    }
}

fn put_entry(tx: &rusqlite::Transaction, ledger_run: &str, e: &LedgerEntry, now: &str) -> rusqlite::Result<usize> {
    // A stage never moves back: a completed call stays completed.
    tx.prepare_cached(
        "INSERT INTO tool_ledger (run_id, call_id, name, args_hash, stage, result_hash, result, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (run_id, call_id) DO UPDATE SET stage = excluded.stage, result_hash = excluded.result_hash, result = excluded.result, at = excluded.at
         WHERE tool_ledger.stage <> 'completed'",
    )?
    .execute(rusqlite::params![
        ledger_run,
        e.call_id,
        e.name,
        e.args_hash,
        e.stage.as_str(),
        e.result_hash(),
        e.result,
        now
    ])
}

/// The ledger entry of `call_id` in run `ledger_run`.
pub fn ledger_entry(store: &Store, ledger_run: &str, call_id: &str) -> Result<Option<LedgerEntry>, StoreError> {
    store
        .conn()
        .query_row(
            "SELECT call_id, name, args_hash, stage, result FROM tool_ledger WHERE run_id = ?1 AND call_id = ?2",
            [ledger_run, call_id],
            |r| {
                Ok(LedgerEntry {
                    call_id: r.get(0)?,
                    name: r.get(1)?,
                    args_hash: r.get(2)?,
                    stage: CallStage::from_stored(&r.get::<_, String>(3)?),
                    result: r.get(4)?,
                })
            },
        )
        .optional()
        .map_err(store.sql_error())
}

/// A call of a run as its tool ledger keeps it: what `runtime show` lists for a run
/// whose trace was never stored (a fire killed before its finish, whose records the
/// next fire's recovery committed).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LedgerCall {
    pub call_id: String,
    pub name: String,
    pub stage: &'static str,
    /// When the call reached its stage (RFC 3339).
    pub at: String,
}

/// The calls of the ledger of run `ledger_run`, in the order they reached their stage.
pub fn ledger_calls(store: &Store, ledger_run: &str) -> Result<Vec<LedgerCall>, StoreError> {
    store.query_all(
        "SELECT call_id, name, stage, at FROM tool_ledger WHERE run_id = ?1 ORDER BY at, call_id",
        [ledger_run],
        |r| {
            Ok(LedgerCall {
                call_id: r.get(0)?,
                name: r.get(1)?,
                stage: CallStage::from_stored(&r.get::<_, String>(2)?).as_str(),
                at: r.get(3)?,
            })
        },
    )
}

/// The runs of `task` still marked `running`, oldest first.
pub fn live_runs(store: &Store, task: &str) -> Result<Vec<LiveRun>, StoreError> {
    query_live(store, "l.task = ?1", task)
}

/// The run `run_id` if it is still marked `running`.
pub fn live_run(store: &Store, run_id: &str) -> Result<Option<LiveRun>, StoreError> {
    Ok(query_live(store, "l.run_id = ?1", run_id)?.into_iter().next())
}

fn query_live(store: &Store, filter: &str, value: &str) -> Result<Vec<LiveRun>, StoreError> {
    store.query_all(
        &format!(
            "SELECT l.run_id, l.task, l.pid, l.pid_start, l.ledger_run, l.step, l.state, l.inputs, r.started_at, l.updated_at,
                    l.boot_id, l.boot_ns, l.records
             FROM live_runs l JOIN runs r ON r.run_id = l.run_id
             WHERE {filter} AND r.status = 'running' ORDER BY r.started_at, l.run_id"
        ),
        [value],
        |r| {
            Ok(LiveRun {
                run_id: r.get(0)?,
                task: r.get(1)?,
                pid: r.get(2)?,
                pid_start: r.get::<_, Option<i64>>(3)?.map(|t| t as u64),
                ledger_run: r.get(4)?,
                step: r.get(5)?,
                state: r.get(6)?,
                inputs: r.get(7)?,
                started_at: r.get(8)?,
                updated_at: r.get(9)?,
                boot: match (r.get::<_, Option<String>>(10)?, r.get::<_, Option<i64>>(11)?) {
                    (Some(boot_id), Some(ns)) => Some(BootTime { boot_id, ns }),
                    _ => None,
                },
                records: r.get(12)?,
            })
        },
    )
}

/// Forgets the live row of a run that ended (its `runs` row says how).
pub fn end(tx: &rusqlite::Transaction, run_id: &str) -> rusqlite::Result<usize> {
    tx.execute("DELETE FROM live_runs WHERE run_id = ?1", [run_id])
}

/// Closes a run that ended before it had records (a stop with nothing worth a card):
/// its row says `failed`, not `running`.
pub fn close_unrecorded(store: &mut Store, run_id: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
    store.write(|tx| {
        tx.execute(
            "UPDATE runs SET status = 'failed', finished_at = ?2 WHERE run_id = ?1 AND status = 'running'",
            rusqlite::params![run_id, at.to_rfc3339()],
        )?;
        end(tx, run_id)
    })?;
    Ok(())
}

/// Closes an interrupted run that is not resumed: its row says `crashed`.
pub fn close_crashed(store: &mut Store, run_id: &str, at: DateTime<Utc>) -> Result<(), StoreError> {
    store.write(|tx| {
        tx.execute(
            "UPDATE runs SET status = 'crashed', finished_at = ?2 WHERE run_id = ?1 AND status = 'running'",
            rusqlite::params![run_id, at.to_rfc3339()],
        )?;
        end(tx, run_id)
    })?;
    Ok(())
}
