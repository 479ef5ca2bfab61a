//! The approved bytes are what fires (issue 17 item 3): a fire reads its prompt, scope
//! and settings as git blobs of the commit it runs on, never through the work tree,
//! where a link is resolved by the kernel wherever it leads. A path is resolved inside
//! the committed tree, component by component, by the same judge as every other step
//! ([`super::links::resolve`]), so a link that reaches outside the builder-owned paths
//! loads nothing. The dirty check already says the work tree equals HEAD; reading
//! blobs makes that the only truth instead of a precondition.
//!
//! Scripts the sandbox executes (prefetch and acceptance `run:` under `tools/`) are
//! made from blobs too: [`Committed::tools_copy`] writes the committed `tools/` into a
//! directory only the runtime writes, which tool processes see read-only, named by the
//! tree's id (written once per tree, whole, then reused), and the fire runs the
//! script there. What executes is then the committed content by
//! construction, with no window between a check and the exec in which anything could
//! change it, and helpers a script finds next to itself (`$(dirname "$0")/lib.sh`) are
//! the committed ones too.

use super::links::{self, GitView, RefusedLink, TreeView, ViewError};
use super::owned::OwnedPaths;
use git2::{Oid, Repository};
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// The most bytes of `tools/` a fire writes out to run its scripts.
pub const MAX_TOOLS_BYTES: u64 = 64 << 20;
/// The most entries of `tools/` a fire writes out.
pub const MAX_TOOLS_ENTRIES: usize = 10_000;

/// Why a committed file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path} is not in the committed tree (commit {commit})")]
    Missing { path: String, commit: String },
    #[error("{path} is not a regular file in the committed tree (commit {commit})")]
    NotAFile { path: String, commit: String },
    #[error("{path} is a link that is not followed: {why}")]
    Refused { path: String, why: String },
    #[error("{path} is not UTF-8 text")]
    NotText { path: String },
    #[error(transparent)]
    View(#[from] ViewError),
    #[error("git: {0}")]
    Git(#[from] git2::Error),
}

/// Why `tools/` could not be written out.
#[derive(Debug, thiserror::Error)]
pub enum MaterialiseError {
    #[error("committed tools/ is larger than {max} ({what}); keep large helpers out of tools/")]
    TooLarge { max: String, what: String },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("git: {0}")]
    Git(#[from] git2::Error),
}

/// The tree of one commit, read as the approved bytes.
pub struct Committed<'r> {
    repo: &'r Repository,
    commit: Oid,
    tree: git2::Tree<'r>,
    owned: Rc<OwnedPaths>,
}

impl<'r> Committed<'r> {
    /// The tree of `commit`.
    pub fn at(repo: &'r Repository, commit: Oid) -> Result<Committed<'r>, git2::Error> {
        let tree = repo.find_commit(commit)?.tree()?;
        let owned = OwnedPaths::of_tree(repo, &tree)?;
        Ok(Committed {
            repo,
            commit,
            tree,
            owned,
        })
    }

    /// The tree of HEAD (read again while HEAD is being replaced, [`crate::git::head_resolved`]).
    pub fn at_head(repo: &'r Repository) -> Result<Committed<'r>, git2::Error> {
        let head = crate::git::head_resolved(repo)?.peel_to_commit()?.id();
        Committed::at(repo, head)
    }

    pub fn commit(&self) -> Oid {
        self.commit
    }

    pub fn tree(&self) -> &git2::Tree<'r> {
        &self.tree
    }

    /// The paths this tree's settings call builder-owned, and what they let tools write.
    pub fn owned(&self) -> &OwnedPaths {
        &self.owned
    }

    fn view(&self) -> GitView<'_, 'r> {
        GitView::new(self.repo, &self.tree)
    }

    /// The blob `rel` names, links resolved inside the tree.
    pub fn blob_id(&self, rel: &str) -> Result<Oid, ReadError> {
        let resolved = match links::resolve(&self.view(), &self.owned, rel)? {
            Ok(r) => r,
            Err(why) => {
                return Err(ReadError::Refused {
                    path: rel.to_string(),
                    why,
                })
            }
        };
        let commit = self.commit.to_string();
        if !resolved.is_file {
            return Err(match self.view().node(&resolved.path)? {
                links::Node::Missing => ReadError::Missing {
                    path: rel.to_string(),
                    commit,
                },
                _ => ReadError::NotAFile {
                    path: rel.to_string(),
                    commit,
                },
            });
        }
        Ok(self.tree.get_path(Path::new(&resolved.path))?.id())
    }

    /// The bytes of `rel`.
    pub fn read(&self, rel: &str) -> Result<Vec<u8>, ReadError> {
        Ok(self.repo.find_blob(self.blob_id(rel)?)?.content().to_vec())
    }

    /// The text of `rel`.
    pub fn read_to_string(&self, rel: &str) -> Result<String, ReadError> {
        String::from_utf8(self.read(rel)?).map_err(|_| ReadError::NotText { path: rel.to_string() })
    }

    /// Every link among the builder-owned paths that is refused ([`links::refused_links`]).
    pub fn refused_links(&self) -> Result<Vec<RefusedLink>, ViewError> {
        links::refused_links(&self.view(), &self.owned)
    }

    /// The committed `tools/` written out under `dir` (the hand-over directory, which
    /// only the runtime writes), once per `tools/` tree: `dir/tools-<tree id>/tools`,
    /// made in a temporary directory and renamed into place whole, then reused by every
    /// fire on that tree (its name is its content's id). Copies of other trees no fire
    /// used for a day are removed. Returns the directory's name under `dir`, `None` when the
    /// tree has no `tools/`.
    pub fn tools_copy(&self, dir: &Path) -> Result<Option<String>, MaterialiseError> {
        let Ok(entry) = self.tree.get_path(Path::new("tools")) else {
            return Ok(None);
        };
        if entry.filemode() != 0o040000 {
            return Ok(None);
        }
        let name = format!("tools-{}", entry.id());
        let target = dir.join(&name);
        let made = |p: &Path| std::fs::symlink_metadata(p.join("tools")).is_ok_and(|m| m.is_dir());
        if made(&target) {
            // In use again: its age counts from now, so the clean-up below (in another
            // fire, on another tree) never removes a copy a fire of the last day ran.
            if let Ok(d) = std::fs::File::open(&target) {
                let _ = d.set_modified(std::time::SystemTime::now());
            }
            return Ok(Some(name));
        }
        let temp = dir.join(format!(".{name}-{:016x}", rand::random::<u64>()));
        let written = self.materialise_tools(&temp).and_then(|()| {
            std::fs::rename(&temp, &target).or_else(|e| {
                // Another fire put the same tree in place first.
                if made(&target) {
                    Ok(())
                } else {
                    Err(MaterialiseError::Io {
                        path: target.clone(),
                        source: e,
                    })
                }
            })
        });
        if written.is_err() || temp.exists() {
            let _ = std::fs::remove_dir_all(&temp);
        }
        written?;
        let day = std::time::Duration::from_secs(24 * 3600);
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let other = e.file_name().to_string_lossy().into_owned();
            let stale = e
                .metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > day));
            if other.starts_with("tools-") && other != name && stale {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        Ok(Some(name))
    }

    /// Writes the committed `tools/` into `into` (which must not exist yet): regular
    /// files with their modes (0755 or 0644), links as links (their targets judged
    /// already: [`Committed::refused_links`]), nothing else. Returns the directory that
    /// now holds `tools/` (`into` itself). At most [`MAX_TOOLS_BYTES`] and
    /// [`MAX_TOOLS_ENTRIES`].
    pub fn materialise_tools(&self, into: &Path) -> Result<(), MaterialiseError> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| MaterialiseError::Io { path, source }
        };
        std::fs::DirBuilder::new().mode(0o755).create(into).map_err(io(into))?;
        let Ok(entry) = self.tree.get_path(Path::new("tools")) else {
            return Ok(());
        };
        if entry.filemode() != 0o040000 {
            return Ok(());
        }
        let (mut bytes, mut count) = (0u64, 0usize);
        let mut stack = vec![(into.join("tools"), entry.id())];
        while let Some((dir, id)) = stack.pop() {
            std::fs::DirBuilder::new().mode(0o755).create(&dir).map_err(io(&dir))?;
            for e in self.repo.find_tree(id)?.iter() {
                count += 1;
                if count > MAX_TOOLS_ENTRIES {
                    return Err(MaterialiseError::TooLarge {
                        max: format!("{MAX_TOOLS_ENTRIES} entries"),
                        what: "too many files".into(),
                    });
                }
                let name = String::from_utf8_lossy(e.name_bytes()).into_owned();
                if name.contains('/') || name == ".." || name == "." {
                    continue;
                }
                let path = dir.join(&name);
                match e.filemode() {
                    0o040000 => stack.push((path, e.id())),
                    0o120000 => {
                        let blob = self.repo.find_blob(e.id())?;
                        let target = String::from_utf8_lossy(blob.content()).into_owned();
                        std::os::unix::fs::symlink(&target, &path).map_err(io(&path))?;
                    }
                    0o100644 | 0o100755 => {
                        let blob = self.repo.find_blob(e.id())?;
                        bytes += blob.size() as u64;
                        if bytes > MAX_TOOLS_BYTES {
                            return Err(MaterialiseError::TooLarge {
                                max: format!("{} MiB", MAX_TOOLS_BYTES >> 20),
                                what: format!("at {}", path.display()),
                            });
                        }
                        let mode = if e.filemode() == 0o100755 { 0o755 } else { 0o644 };
                        let mut f = std::fs::OpenOptions::new()
                            .write(true)
                            .create_new(true)
                            .mode(mode)
                            .custom_flags(libc::O_NOFOLLOW)
                            .open(&path)
                            .map_err(io(&path))?;
                        std::io::Write::write_all(&mut f, blob.content()).map_err(io(&path))?;
                    }
                    // A gitlink is refused before anything runs; nothing to write.
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

impl crate::settings::SettingsSource for Committed<'_> {
    fn read_text(&self, rel: &Path) -> Result<String, String> {
        self.read_to_string(&rel.to_string_lossy()).map_err(|e| e.to_string())
    }

    fn json_files(&self) -> Vec<PathBuf> {
        let Ok(children) = self.view().children("settings") else {
            return Vec::new();
        };
        let mut out: Vec<PathBuf> = children
            .into_iter()
            .filter(|(name, node)| name.ends_with(".json") && !matches!(node, links::Node::Dir))
            .map(|(name, _)| Path::new("settings").join(name))
            .collect();
        out.sort();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_read_from_blobs_and_links_inside_the_tree() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let mut update = git2::build::TreeUpdateBuilder::new();
        let blob = |b: &str| repo.blob(b.as_bytes()).unwrap();
        update.upsert("settings/runtime.yaml", blob("real.yaml"), git2::FileMode::Link);
        update.upsert("settings/real.yaml", blob("version: 1\n"), git2::FileMode::Blob);
        update.upsert("prompts/p.md", blob("/proc/self/environ"), git2::FileMode::Link);
        update.upsert(
            "tools/run.sh",
            blob("#!/bin/sh\necho hi\n"),
            git2::FileMode::BlobExecutable,
        );
        update.upsert("tools/lib/x", blob("../run.sh"), git2::FileMode::Link);
        let empty = repo.treebuilder(None).unwrap().write().unwrap();
        let tree = update.create_updated(&repo, &repo.find_tree(empty).unwrap()).unwrap();
        let sig = git2::Signature::now("a", "a@x").unwrap();
        let tree = repo.find_tree(tree).unwrap();
        let c = repo.commit(Some("HEAD"), &sig, &sig, "c", &tree, &[]).unwrap();
        let committed = Committed::at(&repo, c).unwrap();
        assert_eq!(
            committed.read_to_string("settings/runtime.yaml").unwrap(),
            "version: 1\n"
        );
        let e = committed.read("prompts/p.md").unwrap_err();
        assert!(e.to_string().contains("/proc is the reading"), "{e}");
        assert!(matches!(
            committed.read("prompts/none.md"),
            Err(ReadError::Missing { .. })
        ));
        assert!(matches!(committed.read("tools/lib"), Err(ReadError::NotAFile { .. })));
        // The work tree plays no part: a file there is not read.
        std::fs::create_dir_all(dir.path().join("scope")).unwrap();
        std::fs::write(dir.path().join("scope/SCOPE.md"), "work tree only").unwrap();
        assert!(committed.read("scope/SCOPE.md").is_err());
        // tools/ written out with its modes and links, once per tree.
        std::fs::create_dir_all(dir.path().join("handoff")).unwrap();
        let name = committed.tools_copy(&dir.path().join("handoff")).unwrap().unwrap();
        assert_eq!(
            committed.tools_copy(&dir.path().join("handoff")).unwrap().unwrap(),
            name
        );
        let out = dir.path().join("handoff").join(&name);
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(out.join("tools/run.sh")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o755);
        assert_eq!(
            std::fs::read_to_string(out.join("tools/lib/x")).unwrap(),
            "#!/bin/sh\necho hi\n"
        );
        // A copy in use again counts its age from now; a fresh write removes copies of
        // other trees unused for a day, keeps recent ones, and leaves no temporary.
        let handoff = dir.path().join("handoff");
        let age = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap().elapsed().unwrap();
        let set_age = |p: &Path, secs: u64| {
            let when = std::time::SystemTime::now() - std::time::Duration::from_secs(secs);
            std::fs::File::open(p).unwrap().set_modified(when).unwrap();
        };
        set_age(&out, 2 * 24 * 3600);
        committed.tools_copy(&handoff).unwrap().unwrap();
        assert!(age(&out).as_secs() < 3600, "touched on reuse");
        for (other, secs) in [("tools-old", 2 * 24 * 3600), ("tools-recent", 3600)] {
            std::fs::create_dir_all(handoff.join(other).join("tools")).unwrap();
            set_age(&handoff.join(other), secs);
        }
        std::fs::remove_dir_all(&out).unwrap();
        committed.tools_copy(&handoff).unwrap().unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&handoff)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        let mut want = vec!["tools-recent".to_string(), name.clone()];
        want.sort();
        assert_eq!(left, want);
    }
}
