//! Git's own rules for the names a tree may hold, applied to every file the runtime
//! commits. A model may leave a file under `reports/` whose name git itself refuses or
//! treats as its metadata on some file system: `.git` spelt with HFS+'s ignorable code
//! points (`.g\u{200c}it`), NTFS's 8.3 short names (`git~1`, `gitmod~1`) and trailing
//! dots or streams (`.git.`, `.git::$INDEX_ALLOCATION`). One such name committed
//! makes every fsck-checking remote (`receive.fsckObjects`) refuse every later push,
//! and a checkout on a Mac or Windows machine write into its `.git`. The rules are
//! git's, with `core.protectHFS` and `core.protectNTFS` both on whatever the local
//! config says: gitoxide's port of git's `verify_path` component check
//! ([`gix_validate::path::component`]) and libgit2's own matcher of `.gitmodules`,
//! `.gitattributes` and `.gitignore` lookalikes (`git_path_is_gitfile`), whose
//! contents fsck parses and checks (a `gitmod~1` blob is judged as a `.gitmodules`).
//! Beyond git, any name that reads `.git...` once the HFS+ ignorables are dropped is
//! refused, as the outputs walk always did for plain `.git*` names.

use gix_object::bstr::ByteSlice;
use std::ffi::CStr;

/// The entries that together make a directory a repository of its own to git
/// ([`forms_repository`]).
pub const REPOSITORY_ENTRIES: [&CStr; 4] = [c"HEAD", c"objects", c"refs", c"commondir"];

/// Whether a directory holding the entries `present` says it holds is what git takes
/// for a repository of its own (`is_git_directory`): a `HEAD` beside `objects` and
/// `refs`, or beside a `commondir` file (which points git at the objects, refs and
/// config of another directory). Removing the `HEAD` unmakes it.
pub fn forms_repository(present: impl Fn(&CStr) -> bool) -> bool {
    present(c"HEAD") && (present(c"commondir") || (present(c"objects") && present(c"refs")))
}

/// The names git reads from the work tree it checks out (on this file system, where
/// names are compared as they are): a model's `.gitattributes` would set filters,
/// encodings and merge drivers for whoever runs git in the box's checkout, and a
/// `.gitignore` would hide files from them.
pub const GIT_READS: [&str; 2] = [".gitattributes", ".gitignore"];

/// Whether the repo-relative `rel` names a file git reads ([`GIT_READS`]).
pub fn is_git_read(rel: &str) -> bool {
    GIT_READS.contains(&rel.rsplit('/').next().unwrap_or_default())
}

/// Code points HFS+ ignores when it compares names (git's `is_hfs_dot_generic`).
fn hfs_ignorable(c: char) -> bool {
    matches!(c as u32, 0x200c..=0x200f | 0x202a..=0x202e | 0x206a..=0x206f | 0xfeff)
}

/// Why git refuses (or treats as its metadata) the path component `name`; `None` for
/// a plain name. Each part after a `\` is judged too, as git's fsck does (a separator
/// on Windows: `x\.git` is refused by every remote that checks what it receives,
/// helper-91).
pub fn refused_component(name: &str) -> Option<String> {
    if let Some(why) = refused_part(name) {
        return Some(why);
    }
    name.split('\\')
        .skip(1)
        .filter(|part| !part.is_empty())
        .find_map(refused_part)
        .map(|why| format!("{why}, after a `\\` (a separator on Windows, which git's fsck judges apart)"))
}

/// [`refused_component`] of one part of a name.
fn refused_part(name: &str) -> Option<String> {
    let options = gix_validate::path::component::Options {
        protect_windows: false,
        protect_hfs: true,
        protect_ntfs: true,
    };
    // As a symlink, so `.gitmodules` lookalikes are judged too (git refuses them as
    // links; fsck parses them as submodule files when they are blobs).
    if name.contains('\0') {
        return Some("a name holding a NUL byte".into());
    }
    if let Some(file) = kernel::libgit2::lookalike_of(name) {
        let file = file.name();
        return Some(format!("git metadata: a name git reads as `{file}` on NTFS or HFS+"));
    }
    if let Err(e) = gix_validate::path::component(
        name.as_bytes().as_bstr(),
        Some(gix_validate::path::component::Mode::Symlink),
        options,
    ) {
        return Some(format!("git metadata: a name git refuses ({e})"));
    }
    let folded: String = name.chars().filter(|c| !hfs_ignorable(*c)).collect();
    if folded.to_ascii_lowercase().starts_with(".git") {
        return Some("git metadata (a name starting with `.git`)".into());
    }
    None
}

/// Whether `name` is `.git` in any spelling git knows (HFS+ ignorables, NTFS short
/// names and trailing dots): a nested repository's directory, or the `gitdir:` file
/// of a linked worktree, either of which makes git run that repository's config and
/// hooks for whoever runs `git` inside it.
pub fn is_dot_git(name: &str) -> bool {
    let options = gix_validate::path::component::Options {
        protect_windows: false,
        protect_hfs: true,
        protect_ntfs: true,
    };
    matches!(
        gix_validate::path::component(name.as_bytes().as_bstr(), None, options),
        Err(gix_validate::path::component::Error::DotGitDir)
    )
}

/// Why git refuses the repository-relative `path` (`/`-separated), naming the first
/// component it refuses; `None` when every component is plain.
pub fn refused_path(path: &str) -> Option<String> {
    path.split('/')
        .find_map(|c| refused_component(c).map(|why| format!("`{}`: {why}", c.escape_debug())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_metadata_in_every_spelling_is_refused() {
        for name in [
            ".git",
            ".GIT",
            ".git.",
            ".git ",
            "git~1",
            "GIT~1",
            ".git::$INDEX_ALLOCATION",
            ".g\u{200c}it",
            ".git\u{200d}",
            "\u{feff}.git",
            ".gitmodules",
            "gitmod~1",
            "GITMOD~4",
            "gi7eba~9",
            ".gitmodules\u{200c}",
            ".gitattributes",
            "gitatt~1",
            "gi7d29~1",
            ".git\u{200e}attributes",
            ".gitignore",
            "gitign~1",
            ".gitfoo",
            "..",
            ".",
            "x\\.git",
            "y\\git~1",
            "z\\.gitmodules",
            "w\\.GIT.",
            "a\\b\\.git",
        ] {
            assert!(refused_component(name).is_some(), "{name:?} passed");
        }
    }

    #[test]
    fn dot_git_in_every_spelling_is_a_nested_repository() {
        for name in [
            ".git",
            ".GIT",
            "git~1",
            ".git.",
            ".g\u{200c}it",
            ".git::$INDEX_ALLOCATION",
        ] {
            assert!(is_dot_git(name), "{name:?}");
        }
        for name in [".gitmodules", ".gitattributes", "git", "x.git", "gitmod~1"] {
            assert!(!is_dot_git(name), "{name:?}");
        }
    }

    #[test]
    fn plain_names_pass() {
        for name in [
            "report.md",
            "draft~1.md",
            "git",
            "notes.git",
            "a..b",
            "gitmodules",
            "über.txt",
            "x~1",
            "a\\b.md",
            "trailing\\",
        ] {
            assert_eq!(refused_component(name), None, "{name:?}");
        }
        assert_eq!(refused_path("reports/t/2026-01-01/r.md"), None);
        let why = refused_path("reports/sub/gitmod~1").unwrap();
        assert!(why.contains("gitmod~1"), "{why}");
    }
}
