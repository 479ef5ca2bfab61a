//! Replacing a small file of the tools' own (a clone's judged mark, a builder
//! command's work record, a sync step's record) whole and durably: written to a
//! temporary file beside it, fsynced, renamed over it, and the directory fsynced. A
//! reader sees the old content or the new, never part of either, and after a power
//! loss the rename is not undone. The temporary file is `<name>.<pid>.tmp`: two
//! processes never share one, and what a killed writer left ends in [`TMP_SUFFIX`].

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
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{}{TMP_SUFFIX}", std::process::id()));
    let tmp = dir.join(name);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
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
}
