//! What an MCP server's entry starts, as a digest: `sha256:` over the program its
//! `argv[0]` resolves to and the argv itself ([`command_digest`]). `builder mcp pin`
//! hashes the program every time; a fire checks it against the pin at every start, so
//! it goes through a stat cache ([`command_digest_cached`]) kept in the runtime's state
//! directory: a server run by an interpreter (`node`, `python3`) would otherwise hash
//! tens of megabytes before each fire's first model request. The cache follows git's
//! index: an entry counts only while the file has the same device, inode, size,
//! modification and change times as when it was hashed. And, as git's racy-entry rule,
//! only when both times were at least [`SETTLE_NS`] older than the moment hashing began:
//! file systems stamp times from a clock that ticks coarser than the wall clock (up to
//! a second), so a program rewritten in place within one tick of being hashed could
//! keep its stamp; such an entry is hashed again until it has settled. A replaced
//! program (a new inode) or one written in place (a new change time, which no user can
//! set back) misses. The cache lives where tools cannot reach (`.runtime/`, masked from
//! their sandbox).

use super::lock::LockError;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The cache file, under the runtime's state directory.
pub const CACHE_FILE: &str = "mcp-programs.json";

/// How much older than the hash a file's times must be for its entry to count: more
/// than the coarsest file-system timestamp tick (a second) and a little clock skew.
const SETTLE_NS: i128 = 2_000_000_000;

/// Where `program` resolves: a path (relative to the repository root) when it has a
/// `/`, else the first match on `path` (`PATH`'s syntax).
pub fn resolve_program(program: &str, root: &Path, path: &str) -> Option<PathBuf> {
    if program.contains('/') {
        let p = root.join(program);
        return p.is_file().then_some(p);
    }
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(program))
        .find(|p| p.is_file())
}

/// `sha256:` of the program `argv[0]` resolves to and of the argv itself: what a
/// server's pin says starts. Hashes the program now.
pub fn command_digest(argv: &[String], root: &Path, path: &str) -> Result<String, LockError> {
    let program = resolved(argv, root, path)?;
    let bytes = std::fs::read(&program).map_err(|source| LockError::Read { path: program, source })?;
    Ok(combine(&Sha256::digest(&bytes), argv))
}

/// [`command_digest`] through the stat cache in `state_dir` (see the module's
/// comment). A cache that cannot be read or written only costs the hash.
pub fn command_digest_cached(argv: &[String], root: &Path, path: &str, state_dir: &Path) -> Result<String, LockError> {
    let program = resolved(argv, root, path)?;
    let key = program.to_string_lossy().into_owned();
    let cache_file = state_dir.join(CACHE_FILE);
    let mut cache: BTreeMap<String, Cached> = std::fs::read(&cache_file)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let read_error = |source| LockError::Read {
        path: program.clone(),
        source,
    };
    let before = std::fs::metadata(&program).map_err(read_error)?;
    if let Some(hit) = cache.get(&key).filter(|c| c.stamp == Stamp::of(&before) && c.settled()) {
        if let Ok(sha) = hex::decode(&hit.sha256) {
            return Ok(combine(&sha, argv));
        }
    }
    let began_ns = now_ns();
    let bytes = std::fs::read(&program).map_err(read_error)?;
    let sha = Sha256::digest(&bytes);
    let after = std::fs::metadata(&program).map_err(read_error)?;
    if Stamp::of(&after) == Stamp::of(&before) {
        cache.insert(
            key,
            Cached {
                stamp: Stamp::of(&after),
                hashed_from_ns: began_ns,
                sha256: hex::encode(sha),
            },
        );
        if let Err(e) = save(&cache_file, &cache) {
            tracing::debug!(file = %cache_file.display(), error = %e, "the MCP program digest cache was not written");
        }
    }
    Ok(combine(&sha, argv))
}

fn resolved(argv: &[String], root: &Path, path: &str) -> Result<PathBuf, LockError> {
    let program = argv.first().map(String::as_str).unwrap_or("");
    resolve_program(program, root, path).ok_or_else(|| LockError::NoProgram {
        program: program.to_string(),
    })
}

/// The digest of a program whose own hash is `program_sha256`, started with `argv`.
fn combine(program_sha256: &[u8], argv: &[String]) -> String {
    let mut h = Sha256::new();
    h.update(program_sha256);
    for a in argv {
        h.update([0]);
        h.update(a.as_bytes());
    }
    format!("sha256:{}", hex::encode(h.finalize()))
}

/// What identifies a file's content without reading it, as git's index does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Cached {
    stamp: Stamp,
    /// When hashing began (wall clock, ns since the epoch).
    hashed_from_ns: i128,
    sha256: String,
}

impl Cached {
    /// Whether the file had last changed well before it was hashed (by [`SETTLE_NS`]),
    /// so what was read is what the stamp describes.
    fn settled(&self) -> bool {
        let limit = self.hashed_from_ns - SETTLE_NS;
        self.stamp.mtime_ns < limit && self.stamp.ctime_ns < limit
    }
}

fn now_ns() -> i128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// Written whole under a temporary name and renamed over the old cache.
fn save(file: &Path, cache: &BTreeMap<String, Cached>) -> std::io::Result<()> {
    let temp = file.with_extension(format!("{}.tmp", std::process::id()));
    std::fs::write(&temp, serde_json::to_vec(cache).map_err(std::io::Error::other)?)?;
    std::fs::rename(&temp, file).inspect_err(|_| {
        let _ = std::fs::remove_file(&temp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a cache that says `program` (as it is now, hashed long after it last
    /// changed) hashes to the SHA-256 of `claimed`.
    fn plant(state: &Path, program: &Path, claimed: &[u8], settled: bool) {
        let stamp = Stamp::of(&std::fs::metadata(program).unwrap());
        let after = if settled { 3 * SETTLE_NS } else { SETTLE_NS / 2 };
        let cache = BTreeMap::from([(
            program.to_string_lossy().into_owned(),
            Cached {
                stamp,
                hashed_from_ns: stamp.ctime_ns.max(stamp.mtime_ns) + after,
                sha256: hex::encode(Sha256::digest(claimed)),
            },
        )]);
        save(&state.join(CACHE_FILE), &cache).unwrap();
    }

    #[test]
    fn the_cache_answers_only_for_the_very_file_it_hashed() {
        let dir = tempfile::tempdir().unwrap();
        let (root, state) = (dir.path().join("repo"), dir.path().join("state"));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&state).unwrap();
        let program = dir.path().join("server");
        std::fs::write(&program, b"#!/bin/sh\necho one\n").unwrap();
        let argv = vec![program.display().to_string(), "--stdio".to_string()];
        let fresh = command_digest(&argv, &root, "").unwrap();
        // With no cache the digest is the pin's, and it is cached.
        assert_eq!(command_digest_cached(&argv, &root, "", &state).unwrap(), fresh);
        assert!(state.join(CACHE_FILE).exists(), "the digest was cached");
        // A settled entry is answered from the cache without reading the file: a
        // planted entry claiming other bytes shows it was used.
        plant(&state, &program, b"other bytes", true);
        let claimed = combine(&Sha256::digest(b"other bytes"), &argv);
        assert_ne!(claimed, fresh);
        assert_eq!(command_digest_cached(&argv, &root, "", &state).unwrap(), claimed);
        // An entry hashed within the settle time of the file's last change is not.
        plant(&state, &program, b"other bytes", false);
        assert_eq!(command_digest_cached(&argv, &root, "", &state).unwrap(), fresh);
        // Written in place, same size, its old modification time put back: the change
        // time still tells, so the planted entry no longer matches.
        plant(&state, &program, b"other bytes", true);
        let mtime = std::fs::metadata(&program).unwrap().modified().unwrap();
        std::fs::write(&program, b"#!/bin/sh\necho two\n").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&program)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let changed = command_digest(&argv, &root, "").unwrap();
        assert_ne!(changed, fresh);
        assert_eq!(command_digest_cached(&argv, &root, "", &state).unwrap(), changed);
        // Replaced by another file (a new inode).
        plant(&state, &program, b"other bytes", true);
        let other_file = dir.path().join("server.new");
        std::fs::write(&other_file, b"#!/bin/sh\necho six\n").unwrap();
        std::fs::rename(&other_file, &program).unwrap();
        assert_eq!(
            command_digest_cached(&argv, &root, "", &state).unwrap(),
            command_digest(&argv, &root, "").unwrap()
        );
        // A cache someone damaged costs a hash, not a wrong answer.
        std::fs::write(state.join(CACHE_FILE), b"{not json").unwrap();
        assert_eq!(
            command_digest_cached(&argv, &root, "", &state).unwrap(),
            command_digest(&argv, &root, "").unwrap()
        );
    }

    #[test]
    fn a_program_changed_as_it_was_hashed_is_not_trusted_from_the_cache() {
        let stamp = Stamp {
            dev: 1,
            ino: 2,
            size: 3,
            mtime_ns: 100,
            ctime_ns: 200,
        };
        let at = |hashed_from_ns| Cached {
            stamp,
            hashed_from_ns,
            sha256: String::new(),
        };
        assert!(at(201 + SETTLE_NS).settled());
        assert!(!at(200 + SETTLE_NS).settled(), "changed within a tick of the hash");
        assert!(!at(150).settled(), "changed while it was hashed");
    }
}
