//! Replacing a small file of the tools' own (a clone's judged mark, a builder
//! command's work record, a sync step's record) whole and durably: written to a
//! temporary file beside it, fsynced, renamed over it, and the directory fsynced. A
//! reader sees the old content or the new, never part of either, and after a power
//! loss the rename is not undone. Each call writes a temporary file of its own
//! (`<name>.<random>.tmp`, created exclusively), so concurrent writers, threads of one
//! process included, never share one; what a killed writer left ends in [`TMP_SUFFIX`]
//! (removed by the owner's recovery, or by [`remove_leftovers`] once old).

use std::io::Write;
use std::path::Path;

/// How the name of a temporary file [`replace`] writes ends.
pub const TMP_SUFFIX: &str = ".tmp";

/// Replaces `path` with `bytes` (making its directory if missing), as the module says.
pub fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::create_dir_all(dir)?;
    let mut prefix = path.file_name().unwrap_or_default().to_os_string();
    prefix.push(".");
    let mut tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(TMP_SUFFIX)
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Removes what killed [`replace`] calls left beside `path` (its temporary files) once
/// they are older than `age`: no writer takes that long, so none is a live one's. For
/// files with no recovery of their own (a clone's judged marks).
pub fn remove_leftovers(path: &Path, age: std::time::Duration) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return;
    };
    let prefix = format!("{}.", name.to_string_lossy());
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let n = entry.file_name();
        let n = n.to_string_lossy();
        let old = || {
            entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|a| a > age)
        };
        if n.starts_with(&prefix) && n.ends_with(TMP_SUFFIX) && old() {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn leftovers_older_than_the_age_go_and_a_live_writers_stays() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("origin:main");
        super::replace(&path, b"mark").unwrap();
        let old = dir.path().join("origin:main.a1B2c3.tmp");
        let fresh = dir.path().join("origin:main.d4E5f6.tmp");
        let other = dir.path().join("elsewhere.a1B2c3.tmp");
        for p in [&old, &fresh, &other] {
            std::fs::write(p, b"half").unwrap();
        }
        let hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
        for p in [&old, &other] {
            std::fs::File::options()
                .write(true)
                .open(p)
                .unwrap()
                .set_modified(hour_ago)
                .unwrap();
        }
        super::remove_leftovers(&path, std::time::Duration::from_secs(3600));
        assert!(!old.exists(), "an old leftover stays");
        assert!(fresh.exists(), "a live writer's file was removed");
        assert!(other.exists(), "another file's leftover was removed");
        assert_eq!(std::fs::read(&path).unwrap(), b"mark");
    }

    #[test]
    fn a_file_is_replaced_whole_and_no_temporary_file_is_left() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("made/on.the.way");
        super::replace(&path, b"first").unwrap();
        super::replace(&path, b"second, longer").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second, longer");
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("on.the.way")]);
    }

    /// Threads of one process replacing one file at once (as `builder serve`'s page
    /// jobs remember a mark): every read finds one writer's bytes whole.
    #[test]
    fn concurrent_writers_never_publish_a_torn_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mark");
        let bodies: Vec<Vec<u8>> = (0..4).map(|i| vec![b'a' + i as u8; 10 + 4000 * i]).collect();
        std::thread::scope(|s| {
            for body in &bodies {
                let path = &path;
                s.spawn(move || {
                    for _ in 0..50 {
                        super::replace(path, body).unwrap();
                    }
                });
            }
            s.spawn(|| {
                for _ in 0..500 {
                    if let Ok(read) = std::fs::read(&path) {
                        assert!(bodies.contains(&read), "a torn file of {} bytes", read.len());
                    }
                }
            });
        });
        let left = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(left, 1, "temporary files left");
    }
}
