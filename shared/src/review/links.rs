//! Links in the approved tree, resolved as the kernel would (issue 17 item 3). An
//! approval names a symlink's target text, not what it reaches, and the kernel
//! resolves a path component by component, following each link it meets, with `..`
//! taken from where the link led, not from where it stood. So two links that each look
//! "inside" when judged by their own text (`settings/x -> ../tools`, then
//! `settings/runtime.yaml -> x/../reports/r.yaml`) can make a builder file resolve
//! into `reports/`, which the model writes.
//!
//! [`resolve`] walks a path the kernel's way over a [`TreeView`] (a git tree, or the
//! work tree for `builder check`), judging every component it visits: each must be a
//! builder-owned path ([`OwnedPaths::is_builder`]) or a directory on the way to one,
//! never a path the write ACL reaches, and the walk may not climb above the
//! repository, follow an absolute target (`/proc/self/environ`, `/dev/...`, anything
//! outside the repository), enter a submodule or follow more than 40 links. Where it
//! ends must be builder-owned. [`refused_links`] applies it to every link among the
//! builder-owned paths of a tree: the one judgement `builder check`, `propose`,
//! `approve`, `merge`, `audit` (and so the pre-push hook) and the runtime all make.

use super::owned::OwnedPaths;
use std::collections::VecDeque;
use std::path::{Path, PathBuf};

/// The most links one resolution follows (the kernel's `ELOOP` limit).
pub const MAX_HOPS: usize = 40;

/// What is at one path of a tree, without following a link there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir,
    File,
    /// A symlink, with its target text.
    Link(String),
    /// A gitlink (another repository's commit).
    Submodule(String),
    Missing,
}

/// Why a tree could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// A tree to resolve paths in: [`GitView`] (a commit's tree) or [`WorkView`] (the
/// work tree, as `builder check` sees it).
pub trait TreeView {
    /// What is at `rel` (repo-relative, every component before the last a directory),
    /// not following a link at the last component.
    fn node(&self, rel: &str) -> Result<Node, ViewError>;
    /// The entries of the directory `rel` (`""`: the top), by name.
    fn children(&self, rel: &str) -> Result<Vec<(String, Node)>, ViewError>;
}

/// A git tree.
pub struct GitView<'a, 'r> {
    repo: &'r git2::Repository,
    tree: &'a git2::Tree<'r>,
}

impl<'a, 'r> GitView<'a, 'r> {
    pub fn new(repo: &'r git2::Repository, tree: &'a git2::Tree<'r>) -> GitView<'a, 'r> {
        GitView { repo, tree }
    }

    fn node_of(&self, mode: i32, id: git2::Oid) -> Result<Node, ViewError> {
        Ok(match mode {
            0o040000 => Node::Dir,
            0o120000 => Node::Link(String::from_utf8_lossy(self.repo.find_blob(id)?.content()).into_owned()),
            0o160000 => Node::Submodule(id.to_string()),
            _ => Node::File,
        })
    }
}

impl TreeView for GitView<'_, '_> {
    fn node(&self, rel: &str) -> Result<Node, ViewError> {
        if rel.is_empty() {
            return Ok(Node::Dir);
        }
        match self.tree.get_path(Path::new(rel)) {
            Ok(e) => self.node_of(e.filemode(), e.id()),
            Err(e) if e.code() == git2::ErrorCode::NotFound => Ok(Node::Missing),
            Err(e) => Err(e.into()),
        }
    }

    fn children(&self, rel: &str) -> Result<Vec<(String, Node)>, ViewError> {
        let sub;
        let tree = if rel.is_empty() {
            self.tree
        } else {
            let entry = match self.tree.get_path(Path::new(rel)) {
                Ok(e) => e,
                Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(Vec::new()),
                Err(e) => return Err(e.into()),
            };
            sub = self.repo.find_tree(entry.id())?;
            &sub
        };
        tree.iter()
            .map(|e| {
                let name = String::from_utf8_lossy(e.name_bytes()).into_owned();
                Ok((name, self.node_of(e.filemode(), e.id())?))
            })
            .collect()
    }
}

/// The work tree under `root`, read with `lstat` and `readlink` (no link followed).
pub struct WorkView<'a> {
    root: &'a Path,
}

impl<'a> WorkView<'a> {
    pub fn new(root: &'a Path) -> WorkView<'a> {
        WorkView { root }
    }
}

fn fs_node(path: &Path) -> Result<Node, ViewError> {
    let io = |source| ViewError::Io {
        path: path.to_path_buf(),
        source,
    };
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(Node::Missing)
        }
        Err(e) => return Err(io(e)),
    };
    let t = meta.file_type();
    Ok(if t.is_symlink() {
        Node::Link(std::fs::read_link(path).map_err(io)?.to_string_lossy().into_owned())
    } else if t.is_dir() {
        Node::Dir
    } else {
        Node::File
    })
}

impl TreeView for WorkView<'_> {
    fn node(&self, rel: &str) -> Result<Node, ViewError> {
        if rel.is_empty() {
            return Ok(Node::Dir);
        }
        fs_node(&self.root.join(rel))
    }

    fn children(&self, rel: &str) -> Result<Vec<(String, Node)>, ViewError> {
        let dir = self.root.join(rel);
        let entries = match std::fs::read_dir(&dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(ViewError::Io { path: dir, source }),
        };
        let mut out = Vec::new();
        for e in entries {
            let e = e.map_err(|source| ViewError::Io {
                path: dir.clone(),
                source,
            })?;
            let name = e.file_name().to_string_lossy().into_owned();
            let node = fs_node(&e.path())?;
            out.push((name, node));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

/// Where a path resolved to, inside the builder-owned paths.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The repo-relative path reached (no link left in it).
    pub path: String,
    /// A regular file is there (else a directory, or nothing: a dangling link).
    pub is_file: bool,
}

/// How a target that leaves the repository is named.
fn absolute(target: &str) -> String {
    let first = target.split('/').find(|c| !c.is_empty()).unwrap_or("");
    match first {
        "proc" => format!("follows the absolute path {target}: /proc is the reading process's own files (its environment, memory, descriptors)"),
        "dev" => format!("follows the absolute path {target}: a device, outside the repository"),
        _ => format!("follows the absolute path {target}, outside the repository"),
    }
}

/// Resolves `rel` in `view` component by component, following every link as the
/// kernel does; `Ok(Err(why))` when the walk visits or ends anywhere but builder-owned
/// paths (and the directories on the way to them), reaches what the write ACL grants,
/// climbs above the repository, follows an absolute target, enters a submodule or
/// follows more than [`MAX_HOPS`] links. Reaching nothing (a dangling link within the
/// builder-owned paths, which no tool can create) is not refused.
pub fn resolve(view: &dyn TreeView, owned: &OwnedPaths, rel: &str) -> Result<Result<Resolved, String>, ViewError> {
    let mut walk = Walk {
        done: Vec::new(),
        todo: rel.split('/').map(str::to_string).collect(),
        via: Vec::new(),
    };
    let refuse = |why: String, walk: &Walk| Ok(Err(walk.refusal(why)));
    let mut last = Node::Dir;
    while let Some(c) = walk.todo.pop_front() {
        match c.as_str() {
            "" | "." => continue,
            ".." => {
                if walk.done.pop().is_none() {
                    return refuse("climbs above the repository".into(), &walk);
                }
                last = Node::Dir;
                continue;
            }
            _ => walk.done.push(c),
        }
        let here = walk.done.join("/");
        if owned.writable(&here) {
            return refuse(format!("reaches {here}, which the write ACL lets tools write"), &walk);
        }
        let builder = owned.is_builder(&here);
        let on_the_way = || owned.may_hold_builder(&here);
        let leaves = || format!("reaches {here}, outside the builder-owned paths");
        let node = view.node(&here)?;
        match &node {
            Node::Link(target) => {
                if !builder && !on_the_way() {
                    return refuse(leaves(), &walk);
                }
                if let Err(why) = walk.follow(&here, target) {
                    return refuse(why, &walk);
                }
            }
            Node::Dir => {
                if !builder && !on_the_way() {
                    return refuse(leaves(), &walk);
                }
            }
            Node::File | Node::Missing => {
                if !builder {
                    return refuse(leaves(), &walk);
                }
                if walk.todo.iter().any(|c| !c.is_empty() && c != ".") {
                    // Nothing beneath a file or a missing name: the kernel stops here.
                    return Ok(Ok(Resolved {
                        path: here,
                        is_file: false,
                    }));
                }
            }
            Node::Submodule(id) => {
                return refuse(format!("enters {here}, a submodule (commit {id})"), &walk);
            }
        }
        last = node;
    }
    let path = walk.done.join("/");
    if !owned.is_builder(&path) {
        let at = if path.is_empty() {
            "the repository's top".to_string()
        } else {
            path.clone()
        };
        return refuse(format!("ends at {at}, outside the builder-owned paths"), &walk);
    }
    Ok(Ok(Resolved {
        is_file: last == Node::File,
        path,
    }))
}

/// Where [`resolve`]'s walk is: the components resolved so far, those still to
/// resolve, and the links followed on the way.
struct Walk {
    done: Vec<String>,
    todo: VecDeque<String>,
    via: Vec<String>,
}

impl Walk {
    /// `why`, naming the links followed when there was more than one.
    fn refusal(&self, why: String) -> String {
        if self.via.len() > 1 {
            format!("{why} (through {})", self.via.join(", "))
        } else {
            why
        }
    }

    /// Follows the link at `here` (the last component resolved) to `target`, as the
    /// kernel does; `Err` when it is one too many, empty or absolute.
    fn follow(&mut self, here: &str, target: &str) -> Result<(), String> {
        self.via.push(format!("{here} -> {target}"));
        if self.via.len() > MAX_HOPS {
            return Err(format!("follows more than {MAX_HOPS} links"));
        }
        if target.is_empty() {
            return Err(format!("{here} is an empty link"));
        }
        if target.starts_with('/') {
            return Err(absolute(target));
        }
        self.done.pop();
        for part in target.split('/').rev() {
            self.todo.push_front(part.to_string());
        }
        Ok(())
    }
}

/// A builder-owned link (or gitlink) that [`resolve`] refuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefusedLink {
    /// The link's repo-relative path.
    pub path: String,
    /// Its target text (for a gitlink: `submodule commit <id>`).
    pub target: String,
    /// Why it is refused.
    pub why: String,
}

impl std::fmt::Display for RefusedLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} -> {}: {}", self.path, self.target, self.why)
    }
}

/// Every link among the builder-owned paths of `view` (and on the way to
/// `builder_paths`) that [`resolve`] refuses, and every gitlink there, by path. An
/// approval names such a link, not what it reaches, so a tree holding one is never
/// covered, and nothing is loaded through it.
pub fn refused_links(view: &dyn TreeView, owned: &OwnedPaths) -> Result<Vec<RefusedLink>, ViewError> {
    let mut out = Vec::new();
    let mut stack = vec![String::new()];
    while let Some(dir) = stack.pop() {
        for (name, node) in view.children(&dir)? {
            if dir.is_empty() && (name == ".git" || name == crate::layout::STATE_DIR) {
                continue;
            }
            let rel = if dir.is_empty() { name } else { format!("{dir}/{name}") };
            if !owned.is_builder(&rel) && !owned.may_hold_builder(&rel) {
                continue;
            }
            match node {
                Node::Dir => stack.push(rel),
                Node::Link(target) => {
                    if let Err(why) = resolve(view, owned, &rel)? {
                        out.push(RefusedLink { path: rel, target, why });
                    }
                }
                Node::Submodule(id) => {
                    if owned.is_builder(&rel) {
                        out.push(RefusedLink {
                            path: rel,
                            target: format!("submodule commit {id}"),
                            why: "a submodule: its content is another repository's".into(),
                        });
                    }
                }
                Node::File | Node::Missing => {}
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// [`refused_links`] of the tree of a commit, judged by the paths its own settings
/// name.
pub fn refused_in_tree(repo: &git2::Repository, tree: &git2::Tree) -> Result<Vec<RefusedLink>, ViewError> {
    let owned = OwnedPaths::of_tree(repo, tree)?;
    refused_links(&GitView::new(repo, tree), &owned)
}

/// Refuses a review step (`what`: "propose", "approve", "merge") over `refused` links.
pub fn refusal(what: &str, whose: &str, refused: &[RefusedLink]) -> Result<(), super::ReviewError> {
    if refused.is_empty() {
        return Ok(());
    }
    Err(super::ReviewError::Refused(format!(
        "cannot {what}: {whose} builder-owned paths hold links the kernel would resolve outside them (an approval covers a link, not what it reaches):{}",
        listed(refused)
    )))
}

/// `builder propose`'s check: the work tree at `root` holds no refused link, judged by
/// `settings` (its `builder_paths` and write ACL).
pub fn refuse_in_work_tree(
    root: &Path,
    settings: &crate::settings::RuntimeSettings,
    what: &str,
) -> Result<(), super::ReviewError> {
    let owned = OwnedPaths::of_settings(settings);
    let refused =
        refused_links(&WorkView::new(root), &owned).map_err(|e| super::ReviewError::Refused(e.to_string()))?;
    refusal(what, "the work tree's", &refused)
}

/// `builder approve` and `merge`'s check: the tree of the proposal branch `name` (when
/// it exists; a missing one is the command's own error) holds no refused link.
pub fn refuse_in_proposal(repo: &git2::Repository, name: &str, what: &str) -> Result<(), super::ReviewError> {
    let branch = format!("{}{name}", super::PROPOSAL_PREFIX);
    let Ok(head) = repo
        .find_branch(&branch, git2::BranchType::Local)
        .and_then(|b| b.get().peel_to_commit())
    else {
        return Ok(());
    };
    let refused = refused_in_tree(repo, &head.tree()?).map_err(|e| super::ReviewError::Refused(e.to_string()))?;
    refusal(what, &format!("{branch}'s"), &refused)
}

/// The lines a refusal lists, one per link.
pub fn listed(links: &[RefusedLink]) -> String {
    links.iter().map(|l| format!("\n- {l}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree of `files` (path, content); a content starting with `->` is a link.
    fn tree<'r>(repo: &'r git2::Repository, files: &[(&str, &str)]) -> git2::Tree<'r> {
        let empty = repo.treebuilder(None).unwrap().write().unwrap();
        let empty = repo.find_tree(empty).unwrap();
        let mut update = git2::build::TreeUpdateBuilder::new();
        for (path, body) in files {
            match body.strip_prefix("->") {
                Some(target) => update.upsert(*path, repo.blob(target.as_bytes()).unwrap(), git2::FileMode::Link),
                None => update.upsert(*path, repo.blob(body.as_bytes()).unwrap(), git2::FileMode::Blob),
            };
        }
        repo.find_tree(update.create_updated(repo, &empty).unwrap()).unwrap()
    }

    fn refused(files: &[(&str, &str)], owned: &OwnedPaths) -> Vec<String> {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init(dir.path()).unwrap();
        let t = tree(&repo, files);
        let from_git: Vec<String> = refused_links(&GitView::new(&repo, &t), owned)
            .unwrap()
            .into_iter()
            .map(|l| l.path)
            .collect();
        // The work tree judged the same way.
        let work = dir.path().join("w");
        for (path, body) in files {
            let p = work.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            match body.strip_prefix("->") {
                Some(target) => std::os::unix::fs::symlink(target, &p).unwrap(),
                None => std::fs::write(&p, body).unwrap(),
            }
        }
        let from_work: Vec<String> = refused_links(&WorkView::new(&work), owned)
            .unwrap()
            .into_iter()
            .map(|l| l.path)
            .collect();
        assert_eq!(from_git, from_work, "git and the work tree agree");
        from_git
    }

    #[test]
    fn two_links_that_each_look_inside_are_resolved_as_the_kernel_does() {
        let owned = OwnedPaths::new(&[], &["reports/**".into()]);
        // Each link's own text stays inside; resolved, the second reaches reports/.
        let pair = [
            ("settings/x", "->../tools"),
            ("settings/runtime.yaml", "->x/../reports/r.yaml"),
            ("tools/t.sh", "echo"),
            ("reports/r.yaml", "version: 1"),
        ];
        assert!(crate::review::link_stays_inside("settings/x", "../tools"));
        assert!(crate::review::link_stays_inside(
            "settings/runtime.yaml",
            "x/../reports/r.yaml"
        ));
        assert_eq!(refused(&pair, &owned), vec!["settings/runtime.yaml"]);
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init(dir.path()).unwrap();
        let t = tree(&repo, &pair);
        let why = resolve(&GitView::new(&repo, &t), &owned, "settings/runtime.yaml")
            .unwrap()
            .unwrap_err();
        assert!(
            why.contains("reaches reports") && why.contains("settings/x -> ../tools"),
            "{why}"
        );
        // Inside links are fine, and resolve where the kernel would.
        let fine = [
            ("settings/x", "->../tools"),
            ("settings/runtime.yaml", "->x/../settings/real.yaml"),
            ("settings/real.yaml", "version: 1"),
            ("tools/t.sh", "->../prompts/nowhere.md"),
        ];
        assert!(refused(&fine, &owned).is_empty());
        let t = tree(&repo, &fine);
        let r = resolve(&GitView::new(&repo, &t), &owned, "settings/runtime.yaml")
            .unwrap()
            .unwrap();
        assert_eq!(
            r,
            Resolved {
                path: "settings/real.yaml".into(),
                is_file: true
            }
        );
    }

    #[test]
    fn links_out_of_the_repository_into_proc_or_the_write_acl_are_refused() {
        let owned = OwnedPaths::new(&["docs/policy/**".into()], &["out/**".into()]);
        for (files, why) in [
            (vec![("prompts/p.md", "->/proc/self/environ")], "/proc is the reading"),
            (vec![("prompts/p.md", "->/dev/zero")], "a device"),
            (vec![("tools/x", "->../../etc/passwd")], "climbs above"),
            (vec![("tools/x", "->../out/x.sh")], "write ACL"),
            (vec![("tools/x", "->../.git/hooks/pre-push")], "reaches .git"),
            (vec![("tools/x", "->..")], "the repository's top"),
            (vec![("tools/x", "->y"), ("tools/y", "->x")], "more than 40 links"),
            (vec![("docs/policy/a.md", "->../../reports/a.md")], "reaches reports"),
            (vec![("docs", "->reports")], "reaches reports"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let repo = git2::Repository::init(dir.path()).unwrap();
            let t = tree(&repo, &files);
            let got = refused_links(&GitView::new(&repo, &t), &owned).unwrap();
            assert!(!got.is_empty(), "{files:?}");
            assert!(got[0].why.contains(why), "{files:?}: {}", got[0]);
        }
        // A builder_paths file linked to another builder_paths file: fine.
        assert!(refused(
            &[
                ("docs/policy/a.md", "->b.md"),
                ("docs/policy/b.md", "x"),
                ("docs/other", "->../reports")
            ],
            &owned
        )
        .is_empty());
    }
}
