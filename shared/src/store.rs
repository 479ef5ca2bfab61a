//! The SQLite store under both local databases, `.runtime/state.db` (the runtime's
//! state: [`crate::state`]) and `.runtime/builder.db` (the builder's history index:
//! [`crate::history`]): a versioned schema per database, each with its own migration
//! list, WAL, a busy timeout, and `BEGIN IMMEDIATE` for every write so concurrent fires
//! queue instead of failing on lock upgrades.

use crate::records::Receipt;
use rusqlite::{Connection, Transaction, TransactionBehavior};
use std::path::Path;
use std::time::Duration;

/// Pages of write-ahead log after which a commit checkpoints it into the database
/// (SQLite's default is 1,000): what a process's first open reads to rebuild the
/// log's index.
const WAL_AUTOCHECKPOINT: i64 = 100;

/// The migrations both databases began with, when they shared one list: a file
/// written then is at one of these versions, whichever database it is, so both lists
/// keep them as their first three steps. Each migration moves the schema from version
/// `i` to `i + 1`.
pub const SHARED_HISTORY: [&str; 3] = [
    // 1: runs, steps, tool calls, spans, card index.
    "CREATE TABLE runs (
        run_id TEXT PRIMARY KEY, task TEXT NOT NULL, status TEXT NOT NULL, stop_reason TEXT NOT NULL,
        started_at TEXT NOT NULL, finished_at TEXT, steps INTEGER NOT NULL DEFAULT 0,
        tokens_in INTEGER NOT NULL DEFAULT 0, tokens_out INTEGER NOT NULL DEFAULT 0,
        cost_usd REAL NOT NULL DEFAULT 0, denials INTEGER NOT NULL DEFAULT 0, retries INTEGER NOT NULL DEFAULT 0,
        duration_ms INTEGER NOT NULL DEFAULT 0, commit_id TEXT, prompt_blob TEXT, scope_blob TEXT,
        settings_blob TEXT, provider TEXT, model TEXT, receipt_path TEXT, report_path TEXT);
     CREATE INDEX runs_task ON runs(task, started_at);
     CREATE TABLE steps (
        run_id TEXT NOT NULL, step INTEGER NOT NULL, budget_report TEXT NOT NULL,
        PRIMARY KEY (run_id, step));
     CREATE TABLE tool_calls (
        run_id TEXT NOT NULL, call_id TEXT NOT NULL, step INTEGER NOT NULL, name TEXT NOT NULL,
        arguments TEXT NOT NULL, args_hash TEXT NOT NULL, decision TEXT NOT NULL, rule TEXT, reason TEXT NOT NULL,
        outcome TEXT NOT NULL, duration_ms INTEGER NOT NULL, PRIMARY KEY (run_id, call_id));
     CREATE TABLE spans (
        run_id TEXT NOT NULL, span_id INTEGER NOT NULL, parent_id INTEGER, kind TEXT NOT NULL, name TEXT NOT NULL,
        start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL, status TEXT NOT NULL,
        tokens_in INTEGER NOT NULL DEFAULT 0, tokens_out INTEGER NOT NULL DEFAULT 0, attributes TEXT NOT NULL DEFAULT '{}',
        PRIMARY KEY (run_id, span_id));
     CREATE TABLE cards (
        id TEXT PRIMARY KEY, fingerprint TEXT NOT NULL, kind TEXT NOT NULL, task TEXT NOT NULL, run_id TEXT NOT NULL,
        created_at TEXT NOT NULL, status TEXT NOT NULL, summary TEXT NOT NULL, path TEXT NOT NULL);
     CREATE INDEX cards_fp ON cards(fingerprint);",
    // 2: approvals bound to the exact call, and index bookkeeping.
    "CREATE TABLE approvals (
        run_id TEXT NOT NULL, call_id TEXT NOT NULL, args_hash TEXT NOT NULL, decision TEXT NOT NULL,
        by TEXT NOT NULL, at TEXT NOT NULL, PRIMARY KEY (run_id, call_id));
     CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);",
    // 3: the conversation checkpoint of a run, for `runtime resume`.
    "CREATE TABLE checkpoints (run_id TEXT PRIMARY KEY, step INTEGER NOT NULL, state TEXT NOT NULL);",
];

/// One database's schema: its migrations, in order.
#[derive(Debug, Clone, Copy)]
pub struct Schema {
    pub migrations: &'static [&'static str],
}

impl Schema {
    /// The version a fully migrated file has.
    pub const fn version(&self) -> usize {
        self.migrations.len()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{path}: {source}")]
    Sqlite { path: String, source: rusqlite::Error },
    #[error("{path}: schema version {found} is newer than this binary understands ({known})")]
    TooNew { path: String, found: usize, known: usize },
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
}

impl StoreError {
    /// Whether SQLite says the file is not a database or is corrupt (as opposed to
    /// busy, read-only, full or missing).
    pub fn is_damage(&self) -> bool {
        match self {
            StoreError::Sqlite { source, .. } => matches!(
                source.sqlite_error_code(),
                Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt)
            ),
            StoreError::TooNew { .. } | StoreError::Io { .. } => false,
        }
    }
}

/// An open store.
pub struct Store {
    /// `None` only once [`Drop`] has taken it to keep.
    conn: Option<Connection>,
    path: String,
    /// The file this connection was opened on, when the connection may be kept for
    /// this process's next open of it ([`Kept`]); `None` for a read-only open.
    keep: Option<FileId>,
    /// Called with the database's path once this store is closed
    /// ([`Store::call_on_close`]).
    on_close: Option<fn(&Path)>,
}

/// A database file's identity: device and inode. A file moved aside and made anew
/// (a damaged state database is) has another.
type FileId = (u64, u64);

/// A connection this process closed, kept open for its next [`Store::open`] of the
/// same file. A fire opens the state database several times (the recovery, the
/// manifest, the run's row, its journal, its end), and every fresh connection parses
/// the whole schema again before its first statement: with the connection kept, the
/// fire pays for that once.
struct Kept {
    path: String,
    file: FileId,
    conn: Connection,
}

/// At most this many connections are kept, the oldest closed first (a command uses
/// one or two databases; a test process, many at once).
const KEPT_MAX: usize = 16;

static KEPT: std::sync::Mutex<Vec<Kept>> = std::sync::Mutex::new(Vec::new());

impl Store {
    /// Whether the database file at this store's path is still the one it opened (not
    /// moved aside and replaced since, as a damaged file is).
    pub fn still_on_its_file(&self) -> bool {
        self.keep.is_some() && file_id(Path::new(&self.path)) == self.keep
    }
}

fn file_id(path: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The connection kept for `path`, if it is still on the same file.
fn take_kept(path: &str, file: FileId) -> Option<Connection> {
    let mut kept = KEPT.lock().ok()?;
    let at = kept.iter().position(|k| k.path == path)?;
    let k = kept.swap_remove(at);
    (k.file == file).then_some(k.conn)
}

impl Drop for Store {
    fn drop(&mut self) {
        if let (Some(file), Some(conn)) = (self.keep, self.conn.take()) {
            keep(&self.path, file, conn);
        }
        if let Some(f) = self.on_close {
            f(Path::new(&self.path));
        }
    }
}

/// Keeps `conn`, closed by a store on `path`, for the process's next open of it.
fn keep(path: &str, file: FileId, conn: Connection) {
    // A connection inside a transaction (a panic unwinding through a write) is not
    // handed on: rusqlite has rolled it back, but keep nothing uncertain.
    if !conn.is_autocommit() || file_id(Path::new(path)) != Some(file) {
        return;
    }
    if let Ok(mut kept) = KEPT.lock() {
        kept.retain(|k| k.path != path);
        if kept.len() >= KEPT_MAX {
            kept.remove(0);
        }
        kept.push(Kept {
            path: path.to_string(),
            file,
            conn,
        });
    }
}

impl Store {
    /// Opens (creating and migrating to `schema`) the database at `path`: with the
    /// connection this process last closed on the same file, if it kept one.
    pub fn open(path: &Path, schema: Schema) -> Result<Store, StoreError> {
        let p = path.display().to_string();
        if let Some(conn) = file_id(path).and_then(|file| take_kept(&p, file)) {
            let mut store = Store {
                conn: Some(conn),
                keep: file_id(path),
                path: p,
                on_close: None,
            };
            // What a user of the last open may have changed; the rest of
            // [`Store::configure`] holds for the connection's life.
            store.sync_every_commit(false)?;
            store.migrate(schema)?;
            return Ok(store);
        }
        Store::open_new(path, schema)
    }

    /// As [`Store::open`], always with a new connection: one that reads the file
    /// itself, not pages a kept connection has cached (what a check of the whole
    /// file needs).
    pub fn open_new(path: &Path, schema: Schema) -> Result<Store, StoreError> {
        let p = path.display().to_string();
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| StoreError::Io {
                path: p.clone(),
                source: e,
            })?;
        }
        let conn = Connection::open(path).map_err(|e| StoreError::Sqlite {
            path: p.clone(),
            source: e,
        })?;
        let mut store = Store {
            conn: Some(conn),
            keep: file_id(path),
            path: p,
            on_close: None,
        };
        store.configure()?;
        store.migrate(schema)?;
        Ok(store)
    }

    /// Opens the database at `path` for reading only, for commands that only read
    /// (`runtime runs`, `show`) where it cannot be written: a read-only `.runtime`, a
    /// full disk. SQLite needs the write-ahead log's shared-memory file to read a WAL
    /// database; where that cannot be created, the file is read as immutable (what a
    /// read-only file system guarantees anyway). The schema must be current: a read
    /// cannot migrate. A missing (or empty) file reads as an empty database.
    pub fn open_read_only(path: &Path, schema: Schema) -> Result<Store, StoreError> {
        use rusqlite::OpenFlags;
        let p = path.display().to_string();
        let sql = |e| StoreError::Sqlite {
            path: p.clone(),
            source: e,
        };
        // Missing, or created empty by an open that then could not write.
        if std::fs::metadata(path).map_or(true, |m| m.len() == 0) {
            let mut store = Store {
                conn: Some(Connection::open_in_memory().map_err(sql)?),
                path: p.clone(),
                keep: None,
                on_close: None,
            };
            store.migrate(schema)?;
            return Ok(store);
        }
        let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_URI | OpenFlags::SQLITE_OPEN_NO_MUTEX;
        let mut last = None;
        for extra in ["", "&immutable=1"] {
            let uri = format!("file:{}?mode=ro{extra}", uri_path(path));
            let store = Connection::open_with_flags(&uri, flags).map(|conn| Store {
                conn: Some(conn),
                path: p.clone(),
                keep: None,
                on_close: None,
            });
            let version = store.and_then(|s| {
                s.conn().busy_timeout(Duration::from_secs(10))?;
                let v: i64 = s.conn().pragma_query_value(None, "user_version", |r| r.get(0))?;
                Ok((s, v as usize))
            });
            match version {
                Ok((s, v)) if v == schema.version() => return Ok(s),
                Ok((_, v)) if v > schema.version() => {
                    return Err(StoreError::TooNew {
                        path: p.clone(),
                        found: v,
                        known: schema.version(),
                    })
                }
                Ok((_, v)) => {
                    return Err(StoreError::Sqlite {
                        path: p.clone(),
                        source: rusqlite::Error::SqliteFailure(
                            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_READONLY),
                            Some(format!(
                                "schema version {v} needs migrating to {}, which a read-only open cannot do",
                                schema.version()
                            )),
                        ),
                    })
                }
                Err(e) => last = Some(e),
            }
        }
        Err(sql(last.unwrap_or(rusqlite::Error::InvalidQuery)))
    }

    /// Turns a SQLite error into one that names this store's file.
    pub fn sql_error(&self) -> impl Fn(rusqlite::Error) -> StoreError + Copy + '_ {
        move |e| StoreError::Sqlite {
            path: self.path.clone(),
            source: e,
        }
    }

    fn configure(&mut self) -> Result<(), StoreError> {
        self.conn()
            .busy_timeout(Duration::from_secs(10))
            .map_err(self.sql_error())?;
        self.conn()
            .pragma_update(None, "journal_mode", "WAL")
            .map_err(self.sql_error())?;
        self.conn()
            .pragma_update(None, "synchronous", "NORMAL")
            .map_err(self.sql_error())?;
        self.conn()
            .pragma_update(None, "foreign_keys", "ON")
            .map_err(self.sql_error())?;
        // A fire opens the store briefly; checkpointing (and fsyncing) on every close
        // would cost more than the write. SQLite still checkpoints automatically as the
        // WAL grows, and a later open sees everything.
        self.conn()
            .set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, true)
            .map_err(self.sql_error())?;
        // But the first open in a process rebuilds the WAL's index by reading every
        // frame in it, and a fire opens the store a few times: with SQLite's default
        // of a checkpoint every 1,000 pages (4 MB) that read cost up to several ms an
        // open. A checkpoint every WAL_AUTOCHECKPOINT pages bounds it.
        self.conn()
            .pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT)
            .map_err(self.sql_error())?;
        Ok(())
    }

    fn migrate(&mut self, schema: Schema) -> Result<(), StoreError> {
        // A plain read first: a file already at this schema needs no write transaction,
        // so `runtime runs` and `show` work on a full disk and a read-only `.runtime`.
        let current = self.schema_version()?;
        if current == schema.version() {
            return Ok(());
        }
        if current > schema.version() {
            return Err(StoreError::TooNew {
                path: self.path.clone(),
                found: current,
                known: schema.version(),
            });
        }
        // Ok(Some(v)): the file's schema is newer than this binary (another process
        // migrated it meanwhile).
        let newer = self.write(|tx| {
            let version = tx.pragma_query_value(None, "user_version", |r| r.get::<_, i64>(0))? as usize;
            if version > schema.version() {
                return Ok(Some(version));
            }
            for (i, m) in schema.migrations.iter().enumerate().skip(version) {
                tx.execute_batch(m)?;
                tx.pragma_update(None, "user_version", (i + 1) as i64)?;
            }
            Ok(None)
        })?;
        match newer {
            Some(found) => Err(StoreError::TooNew {
                path: self.path.clone(),
                found,
                known: schema.version(),
            }),
            None => Ok(()),
        }
    }

    /// Runs `f` in a `BEGIN IMMEDIATE` transaction and commits it.
    pub fn write<T>(&mut self, f: impl FnOnce(&Transaction) -> rusqlite::Result<T>) -> Result<T, StoreError> {
        let path = self.path.clone();
        let e = |e| StoreError::Sqlite {
            path: path.clone(),
            source: e,
        };
        let tx = self
            .conn_mut()
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(e)?;
        let out = f(&tx).map_err(e)?;
        tx.commit().map_err(e)?;
        Ok(out)
    }

    /// Whether each committed transaction is fsynced before the commit returns
    /// (`synchronous=FULL`: survives a power loss) or only the write-ahead log is
    /// written, synced at checkpoints (`NORMAL`, the default: survives a crash of the
    /// process).
    pub fn sync_every_commit(&self, full: bool) -> Result<(), StoreError> {
        self.conn()
            .pragma_update(None, "synchronous", if full { "FULL" } else { "NORMAL" })
            .map_err(self.sql_error())
    }

    /// SQLite's `PRAGMA quick_check`: `None` when the file is sound, else what it
    /// found (the first few problems).
    pub fn quick_check(&self) -> Result<Option<String>, StoreError> {
        let found = self.query_all("PRAGMA quick_check(5)", [], |r| r.get::<_, String>(0))?;
        if found.len() == 1 && found[0] == "ok" {
            return Ok(None);
        }
        Ok(Some(found.join("; ")))
    }

    /// Copies the write-ahead log into the database file and empties it. Worth it
    /// after a large write: otherwise the next small write pays for the copy (SQLite
    /// checkpoints automatically once the log passes 1,000 pages) and every read until
    /// then searches the log.
    pub fn checkpoint(&mut self) -> Result<(), StoreError> {
        self.conn()
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .map_err(self.sql_error())
    }

    /// Every row of a query, each mapped by `f`.
    pub fn query_all<T, P: rusqlite::Params>(
        &self,
        sql: &str,
        params: P,
        f: impl FnMut(&rusqlite::Row) -> rusqlite::Result<T>,
    ) -> Result<Vec<T>, StoreError> {
        let e = self.sql_error();
        let mut stmt = self.conn().prepare(sql).map_err(e)?;
        let rows = stmt.query_map(params, f).map_err(e)?;
        rows.collect::<Result<Vec<_>, _>>().map_err(e)
    }

    /// Has `f` called with the database's path once this store is closed (and its
    /// connection kept or closed): after the last write it made.
    pub fn call_on_close(&mut self, f: fn(&Path)) {
        self.on_close = Some(f);
    }

    /// Read-only access.
    pub fn conn(&self) -> &Connection {
        match &self.conn {
            Some(conn) => conn,
            None => unreachable!("a store's connection is taken only when it is dropped"),
        }
    }

    fn conn_mut(&mut self) -> &mut Connection {
        match &mut self.conn {
            Some(conn) => conn,
            None => unreachable!("a store's connection is taken only when it is dropped"),
        }
    }

    pub fn schema_version(&self) -> Result<usize, StoreError> {
        let v: i64 = self
            .conn()
            .pragma_query_value(None, "user_version", |r| r.get(0))
            .map_err(self.sql_error())?;
        Ok(v as usize)
    }

    pub fn path(&self) -> &str {
        &self.path
    }
}

/// `path` for a SQLite `file:` URI: `%`, `?` and `#` escaped.
fn uri_path(path: &Path) -> String {
    let mut out = String::new();
    for c in path.to_string_lossy().chars() {
        match c {
            '%' => out.push_str("%25"),
            '?' => out.push_str("%3f"),
            '#' => out.push_str("%23"),
            c => out.push(c),
        }
    }
    out
}

/// Writes one run's row into the `runs` table both databases have (the runtime's
/// state after a fire, the builder's index from a committed receipt). In the
/// builder's index, triggers keep the per-day rollup (`run_days`, history schema step
/// 8) from `INSERT OR REPLACE` and `DELETE`: another way of writing `runs` there (an
/// `INSERT OR IGNORE`, recursive triggers turned on) needs its own look at them.
pub fn insert_run(
    tx: &Transaction,
    r: &Receipt,
    receipt_path: &str,
    report_path: Option<&str>,
) -> rusqlite::Result<()> {
    let duration = (r.finished_at - r.started_at).num_milliseconds().max(0);
    tx.prepare_cached(
        "INSERT OR REPLACE INTO runs (run_id, task, status, stop_reason, started_at, finished_at, steps, tokens_in, tokens_out, cost_usd, denials, retries, duration_ms, commit_id, prompt_blob, scope_blob, settings_blob, provider, model, receipt_path, report_path)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)",
    )?
    .execute(rusqlite::params![
        r.run_id,
        r.task,
        r.status.as_str(),
        r.stop_reason.as_str(),
        r.started_at.to_rfc3339(),
        r.finished_at.to_rfc3339(),
        r.steps,
        // A receipt is a file a person can edit: its counts are held to the cap the
        // runtime holds them to, so no sum of them overflows.
        r.tokens.input.min(crate::records::Tokens::CAP) as i64,
        r.tokens.output.min(crate::records::Tokens::CAP) as i64,
        r.cost_usd,
        r.denials,
        r.retries,
        duration,
        r.inputs.commit,
        r.inputs.prompt,
        r.inputs.scope,
        r.inputs.settings,
        r.inputs.provider,
        r.inputs.model,
        receipt_path,
        report_path
    ])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEST_SCHEMA: Schema = Schema {
        migrations: &SHARED_HISTORY,
    };

    /// Whether `store` runs on the connection that made the marker table (a TEMP
    /// table lives and dies with its connection).
    fn same_connection(store: &Store) -> bool {
        store
            .conn()
            .query_row(
                "SELECT count(*) FROM temp.sqlite_master WHERE name = 'marker'",
                [],
                |r| r.get::<_, i64>(0),
            )
            .unwrap()
            == 1
    }

    #[test]
    fn a_reopen_in_the_same_process_takes_the_kept_connection_until_the_file_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".runtime/state.db");
        let s = Store::open(&path, TEST_SCHEMA).unwrap();
        s.conn().execute_batch("CREATE TEMP TABLE marker (x)").unwrap();
        s.sync_every_commit(true).unwrap();
        drop(s);
        let s = Store::open(&path, TEST_SCHEMA).unwrap();
        assert!(same_connection(&s), "the closed connection was kept and taken again");
        let sync: i64 = s.conn().query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap();
        assert_eq!(sync, 1, "a kept connection is back at synchronous=NORMAL");
        drop(s);
        let fresh = Store::open_new(&path, TEST_SCHEMA).unwrap();
        assert!(!same_connection(&fresh), "open_new never takes a kept connection");
        drop(fresh);
        // A file moved aside and made anew (as a damaged state database is) is another
        // file: the kept connection, on the old one, is not taken.
        let s = Store::open(&path, TEST_SCHEMA).unwrap();
        s.conn().execute_batch("CREATE TEMP TABLE marker (x)").unwrap();
        drop(s);
        std::fs::rename(&path, dir.path().join("aside.db")).unwrap();
        let s = Store::open(&path, TEST_SCHEMA).unwrap();
        assert!(!same_connection(&s), "a new file gets a new connection");
        assert_eq!(s.schema_version().unwrap(), TEST_SCHEMA.version());
    }

    #[test]
    fn migrates_fresh_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".runtime/state.db");
        let mut s = Store::open(&path, TEST_SCHEMA).unwrap();
        assert_eq!(s.schema_version().unwrap(), TEST_SCHEMA.version());
        s.write(|tx| tx.execute("INSERT INTO meta(key, value) VALUES ('a', 'b')", []))
            .unwrap();
        drop(s);
        let s = Store::open(&path, TEST_SCHEMA).unwrap();
        let v: String = s
            .conn()
            .query_row("SELECT value FROM meta WHERE key='a'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(v, "b");
        let mode: String = s.conn().query_row("PRAGMA journal_mode", [], |r| r.get(0)).unwrap();
        assert_eq!(mode, "wal");
    }

    #[test]
    fn refuses_newer_schema() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        {
            let c = Connection::open(&path).unwrap();
            c.pragma_update(None, "user_version", 99).unwrap();
        }
        assert!(matches!(
            Store::open(&path, TEST_SCHEMA),
            Err(StoreError::TooNew { found: 99, .. })
        ));
    }

    #[test]
    fn opening_a_current_store_takes_no_write_lock() {
        // A writer holds the database: a migrating open would wait for it (busy
        // timeout) and then fail, as it would on a full disk or a read-only file.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        drop(Store::open(&path, TEST_SCHEMA).unwrap());
        let mut writer = Connection::open(&path).unwrap();
        let tx = writer
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        let t = std::time::Instant::now();
        let s = Store::open(&path, TEST_SCHEMA).unwrap();
        assert!(t.elapsed() < Duration::from_secs(2), "waited {:?}", t.elapsed());
        assert_eq!(s.schema_version().unwrap(), TEST_SCHEMA.version());
        tx.rollback().unwrap();
    }

    #[test]
    fn damage_is_told_from_other_failures() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        std::fs::write(&path, vec![7u8; 4096]).unwrap();
        let e = Store::open(&path, TEST_SCHEMA).err().expect("not a database");
        assert!(e.is_damage(), "{e}");
        let busy = StoreError::Sqlite {
            path: "x".into(),
            source: rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY), None),
        };
        assert!(!busy.is_damage());
    }

    #[test]
    fn concurrent_writers_queue() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.db");
        Store::open(&path, TEST_SCHEMA).unwrap();
        let handles: Vec<_> = (0..4)
            .map(|t| {
                let path = path.clone();
                std::thread::spawn(move || {
                    let mut s = Store::open(&path, TEST_SCHEMA).unwrap();
                    for i in 0..25 {
                        s.write(|tx| tx.execute("INSERT INTO meta(key, value) VALUES (?1, 'v')", [format!("{t}-{i}")]))
                            .unwrap();
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        let s = Store::open(&path, TEST_SCHEMA).unwrap();
        let n: i64 = s
            .conn()
            .query_row("SELECT count(*) FROM meta", [], |r| r.get(0))
            .unwrap();
        assert_eq!(n, 100);
    }
}
