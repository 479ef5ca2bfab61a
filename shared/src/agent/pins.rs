//! What an approval pins: when a run pauses on a call, the state of every repository
//! file the call names (the script a command runs, `./tools/x`, the files it reads
//! or writes, the path a file tool names) is recorded with the checkpoint, and
//! `runtime resume` refuses to run the approved call when any of them changed since:
//! the builder approved `sh tools/x.sh` as it was, not whatever the file says later.
//! Names come from the same shell analysis the policy uses ([`crate::shell`]); every
//! literal word of a command that resolves inside the repository is pinned (a word
//! that names no file is pinned as absent, and must stay so). Files are read with
//! [`crate::beneath::read_regular`], so a FIFO or device is pinned by its kind and
//! never read; a symlink is pinned by its target and the content it reaches, a hard
//! link by its content (a command runs through either).

pub use crate::loop_state::Pin;
use crate::shell;
use crate::tools::ToolArgs;
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::path::Path;

/// The most files one call pins (a longer command line pins its first names).
const MAX_PINS: usize = 64;
/// Files larger than this are pinned by their size instead of their content.
const HASH_CAP: u64 = 64 << 20;

/// A pinned file that is no longer what the approval saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Changed {
    pub path: String,
    pub was: String,
    pub now: String,
}

impl std::fmt::Display for Changed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: was {}, now {}", self.path, self.was, self.now)
    }
}

/// The repository-relative paths `args` names, in order, without repeats.
pub fn named_paths(root: &Path, args: &ToolArgs) -> Vec<String> {
    let words: Vec<(Option<String>, String)> = match args {
        ToolArgs::ReadFile { path, .. }
        | ToolArgs::WriteFile { path, .. }
        | ToolArgs::EditFile { path, .. }
        | ToolArgs::ListDir { path }
        | ToolArgs::Grep { path, .. } => vec![(None, path.clone())],
        ToolArgs::RunCommand { command, .. } => {
            let Ok(segments) = shell::analyse(command) else {
                return vec![];
            };
            let mut out = Vec::new();
            for seg in &segments {
                let cwd = match &seg.cwd {
                    Some(w) if w.dynamic => continue,
                    Some(w) => Some(w.text.clone()),
                    None => None,
                };
                let named = seg
                    .argv
                    .iter()
                    .chain(seg.layers.iter().flatten())
                    .chain(&seg.reads)
                    .chain(&seg.writes)
                    .filter(|w| !w.dynamic && !w.text.starts_with('-') && !w.text.is_empty());
                out.extend(named.map(|w| (cwd.clone(), w.text.clone())));
            }
            out
        }
    };
    let mut seen = BTreeSet::new();
    let mut paths = Vec::new();
    for (cwd, word) in words {
        let joined = match cwd {
            Some(dir) if !word.starts_with('/') => format!("{dir}/{word}"),
            _ => word,
        };
        let Some(rel) = crate::layout::normalize(root, &joined) else {
            continue;
        };
        if rel.is_empty() || rel == ".git" || rel.starts_with(".git/") {
            continue;
        }
        if seen.insert(rel.clone()) {
            paths.push(rel);
        }
        if paths.len() == MAX_PINS {
            break;
        }
    }
    paths
}

/// What `rel` is now: its content hash, or its kind when it is no regular file. A
/// symlink is pinned by its target and what the target holds, a hard link by what it
/// holds: a command runs through either, so a retargeted link or a file changed
/// through its other name breaks the pin too.
fn state_of(root: &Path, dir: Option<&std::os::fd::OwnedFd>, rel: &str) -> String {
    use crate::beneath::NotRegular;
    let Some(dir) = dir else {
        return "unreadable repository".into();
    };
    match crate::beneath::read_regular(dir, Path::new(rel), HASH_CAP) {
        Ok(bytes) => hash(&bytes),
        Err(NotRegular::Io(e)) if e.contains("No such file") || e.contains("Not a directory") => "absent".into(),
        Err(e @ NotRegular::Special("symlink")) => {
            let target = std::fs::read_link(root.join(rel))
                .map_or_else(|e| format!("unreadable ({e})"), |t| t.display().to_string());
            format!("{e} -> {target}; {}", followed(&root.join(rel)))
        }
        Err(e @ NotRegular::HardLink(_)) => format!("{e}; {}", followed(&root.join(rel))),
        Err(e) => e.to_string(),
    }
}

/// `sha256:<hex>` of `bytes`.
fn hash(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The content hash of what `path` reaches, links followed: a regular file only,
/// opened without blocking (a FIFO swapped in meanwhile is named, never waited on)
/// and read up to [`HASH_CAP`].
fn followed(path: &Path) -> String {
    match crate::regular::read(path, HASH_CAP) {
        Ok(bytes) => hash(&bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "target absent".into(),
        Err(e) => match crate::regular::refused(&e) {
            Some(crate::regular::Refused::NotRegular(_)) => "target not a regular file".into(),
            Some(crate::regular::Refused::TooLarge(_)) => format!("target over {HASH_CAP} bytes"),
            None => format!("target unreadable ({e})"),
        },
    }
}

/// The pins of a call about to pause: every file it names, as it is now.
pub fn pin(root: &Path, args: &ToolArgs) -> Vec<Pin> {
    let dir = crate::beneath::open_root(root).ok();
    named_paths(root, args)
        .into_iter()
        .map(|path| Pin {
            state: state_of(root, dir.as_ref(), &path),
            path,
        })
        .collect()
}

/// The pinned files that changed since the pause (empty: the approval still holds).
pub fn changed(root: &Path, pins: &[Pin]) -> Vec<Changed> {
    let dir = crate::beneath::open_root(root).ok();
    pins.iter()
        .filter_map(|p| {
            let now = state_of(root, dir.as_ref(), &p.path);
            (now != p.state).then(|| Changed {
                path: p.path.clone(),
                was: p.state.clone(),
                now,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(command: &str) -> ToolArgs {
        ToolArgs::RunCommand {
            command: command.into(),
            timeout_s: None,
        }
    }

    #[test]
    fn a_command_pins_the_scripts_and_files_it_names() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let names = named_paths(
            root,
            &run("sh tools/x.sh && python3 reports/p.py < data/in.txt > reports/out.md"),
        );
        for want in ["tools/x.sh", "reports/p.py", "data/in.txt", "reports/out.md"] {
            assert!(names.contains(&want.to_string()), "{want} in {names:?}");
        }
        let names = named_paths(root, &run("cd tools && ./x --flag ../../outside"));
        assert!(names.contains(&"tools/x".to_string()), "{names:?}");
        assert!(!names.iter().any(|n| n.contains("outside")), "{names:?}");
        assert!(!names.iter().any(|n| n.starts_with('-')), "{names:?}");
        let read = ToolArgs::ReadFile {
            path: "./notes/../notes/a.md".into(),
            offset: None,
            limit: None,
        };
        assert_eq!(named_paths(root, &read), vec!["notes/a.md".to_string()]);
    }

    #[test]
    fn a_changed_created_or_replaced_file_breaks_the_pin() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("tools")).unwrap();
        std::fs::write(root.join("tools/x.sh"), "echo approved\n").unwrap();
        let pins = pin(root, &run("sh tools/x.sh tools/later.sh"));
        assert_eq!(pins.len(), 3, "{pins:?}");
        assert!(changed(root, &pins).is_empty(), "nothing changed yet");
        std::fs::write(root.join("tools/x.sh"), "echo swapped\n").unwrap();
        let c = changed(root, &pins);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(c[0].path, "tools/x.sh");
        assert!(c[0].was.starts_with("sha256:") && c[0].now.starts_with("sha256:"));
        std::fs::write(root.join("tools/x.sh"), "echo approved\n").unwrap();
        std::fs::write(root.join("tools/later.sh"), "echo new\n").unwrap();
        let c = changed(root, &pins);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!((c[0].path.as_str(), c[0].was.as_str()), ("tools/later.sh", "absent"));
        std::fs::remove_file(root.join("tools/later.sh")).unwrap();
        std::fs::remove_file(root.join("tools/x.sh")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.join("tools/x.sh")).unwrap();
        let c = changed(root, &pins);
        assert_eq!(c.len(), 1, "{c:?}");
        assert!(
            c[0].now
                .starts_with("not a regular file (symlink) -> /etc/passwd; sha256:"),
            "{c:?}"
        );
    }

    #[test]
    fn a_link_is_pinned_by_what_it_reaches() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("tools")).unwrap();
        std::fs::write(root.join("tools/real.sh"), "echo approved\n").unwrap();
        std::fs::write(root.join("tools/other.sh"), "echo approved\n").unwrap();
        std::os::unix::fs::symlink("real.sh", root.join("tools/x.sh")).unwrap();
        std::fs::hard_link(root.join("tools/real.sh"), root.join("tools/y.sh")).unwrap();
        let pins = pin(root, &run("sh tools/x.sh && sh tools/y.sh"));
        let links: Vec<&Pin> = pins.iter().filter(|p| p.path.starts_with("tools/")).collect();
        assert_eq!(links.len(), 2, "{pins:?}");
        assert!(links.iter().all(|p| p.state.contains("sha256:")), "{pins:?}");
        assert!(changed(root, &pins).is_empty());
        // The target changes through its own name: both links reach new content.
        std::fs::write(root.join("tools/real.sh"), "echo swapped\n").unwrap();
        let c = changed(root, &pins);
        assert_eq!(c.len(), 2, "{c:?}");
        std::fs::write(root.join("tools/real.sh"), "echo approved\n").unwrap();
        assert!(changed(root, &pins).is_empty(), "the same content again");
        // The symlink is retargeted at a file with the same content: still a change.
        std::fs::remove_file(root.join("tools/x.sh")).unwrap();
        std::os::unix::fs::symlink("other.sh", root.join("tools/x.sh")).unwrap();
        let c = changed(root, &pins);
        assert_eq!(c.len(), 1, "{c:?}");
        assert!(c[0].now.contains("-> other.sh"), "{c:?}");
        // A FIFO behind the link is named, not waited on.
        std::fs::remove_file(root.join("tools/x.sh")).unwrap();
        kernel::fs::make_fifo(&root.join("tools/fifo"), 0o600).unwrap();
        std::os::unix::fs::symlink("fifo", root.join("tools/x.sh")).unwrap();
        let c = changed(root, &pins);
        assert!(c[0].now.ends_with("target not a regular file"), "{c:?}");
    }
}
