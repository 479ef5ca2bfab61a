//! The context windows local model servers reported, remembered between fires.
//!
//! A fire whose settings declare no `max_context_tokens` asks a local
//! OpenAI-compatible server for its window (`GET /props`, then `GET <base>/models`).
//! Asking on every fire cost two round trips before the first model request, so the
//! answer (or the server's silence) is kept in `.runtime/context-windows.json`, keyed
//! by the provider's base URL and model, for [`REMEMBERED_FOR`]. A server restarted
//! with another window is seen again when the entry expires; settings always win.
//!
//! The file is a cache: unreadable, corrupt or unwritable, it is treated as empty and
//! the server is asked. It is replaced whole (a temporary file renamed over it), never
//! fsynced: losing it costs one more question, nothing else.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How long an answer is trusted.
pub const REMEMBERED_FOR: Duration = Duration::from_secs(60 * 60);

/// The cache's file name under the state directory.
pub const FILE: &str = "context-windows.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
struct Entry {
    /// The window the server reported; `None` when it said nothing usable.
    window: Option<u64>,
    /// When it was asked, in seconds since the epoch.
    asked_at: u64,
}

/// The remembered answers of one repository's fires.
pub struct ContextCache {
    path: PathBuf,
    entries: BTreeMap<String, Entry>,
}

fn key(base: &str, model: &str) -> String {
    format!("{base} {model}")
}

fn now_secs(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl ContextCache {
    /// The cache of the state directory `state_dir` (`.runtime`); empty when the file
    /// is missing or unreadable.
    pub fn open(state_dir: &Path) -> ContextCache {
        let path = state_dir.join(FILE);
        let entries = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        ContextCache { path, entries }
    }

    /// The remembered answer for `base` and `model` if it is younger than
    /// [`REMEMBERED_FOR`] at `now`: `Some(window)` (itself `None` when the server
    /// did not say), or `None` when the server must be asked.
    pub fn recall(&self, base: &str, model: &str, now: SystemTime) -> Option<Option<u64>> {
        let e = self.entries.get(&key(base, model))?;
        let age = now_secs(now).checked_sub(e.asked_at)?;
        (age < REMEMBERED_FOR.as_secs()).then_some(e.window)
    }

    /// Remembers the server's answer and writes the file; a write that fails is
    /// logged and forgotten (the next fire asks again).
    pub fn remember(&mut self, base: &str, model: &str, window: Option<u64>, now: SystemTime) {
        let asked_at = now_secs(now);
        self.entries.insert(key(base, model), Entry { window, asked_at });
        // Entries of servers no fire asked for a long time are dropped.
        let horizon = asked_at.saturating_sub(REMEMBERED_FOR.as_secs() * 24);
        self.entries.retain(|_, e| e.asked_at >= horizon);
        if let Err(e) = self.write() {
            tracing::debug!(path = %self.path.display(), error = %e, "context window cache not written");
        }
    }

    fn write(&self) -> std::io::Result<()> {
        use std::io::Write;
        let dir = self.path.parent().unwrap_or(Path::new("."));
        let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
        tmp.write_all(&serde_json::to_vec(&self.entries).map_err(std::io::Error::other)?)?;
        tmp.persist(&self.path).map_err(|e| e.error)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_recalled_until_it_expires_and_silence_is_remembered_too() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut c = ContextCache::open(dir.path());
        assert_eq!(c.recall("http://127.0.0.1:8080/v1", "m", t0), None);
        c.remember("http://127.0.0.1:8080/v1", "m", Some(8192), t0);
        c.remember("http://127.0.0.1:9090/v1", "m", None, t0);
        // A later fire reads the file.
        let c = ContextCache::open(dir.path());
        let later = t0 + REMEMBERED_FOR - Duration::from_secs(1);
        assert_eq!(c.recall("http://127.0.0.1:8080/v1", "m", later), Some(Some(8192)));
        assert_eq!(c.recall("http://127.0.0.1:9090/v1", "m", later), Some(None));
        assert_eq!(c.recall("http://127.0.0.1:8080/v1", "other", later), None);
        assert_eq!(c.recall("http://127.0.0.1:8080/v1", "m", t0 + REMEMBERED_FOR), None);
        // A clock that went backwards asks again rather than trust the entry.
        assert_eq!(
            c.recall("http://127.0.0.1:8080/v1", "m", t0 - Duration::from_secs(5)),
            None
        );
    }

    #[test]
    fn a_corrupt_file_is_an_empty_cache_and_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let t0 = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        std::fs::write(dir.path().join(FILE), b"{not json").unwrap();
        let mut c = ContextCache::open(dir.path());
        assert_eq!(c.recall("b", "m", t0), None);
        c.remember("b", "m", Some(4096), t0);
        assert_eq!(ContextCache::open(dir.path()).recall("b", "m", t0), Some(Some(4096)));
    }
}
