//! Prompt changes through review (docs/design.md): a
//! proposal is a branch `proposals/<name>`, an approval is a commit on its own ref
//! `refs/builder/approved/<id>` naming the exact tree of builder-owned paths it approved,
//! and a merge lands an approved proposal on its base with trailers. What counts is
//! always the tree: `builder audit` and the runtime (with `require_reviewed`) ask
//! "does an approval name the builder tree this commit produces", never trust a
//! trailer. With `review.require_signed`, an approval counts only with an SSH signature
//! from a key in the allowed-signers list of the tree trusted before the approved one
//! ([`signing`], [`trust`]).

pub mod approvals;
pub mod base;
pub mod bootstrap;
pub mod canonical;
pub mod committed;
pub mod delta;
pub mod forward;
pub mod hooks;
pub mod judged;
pub mod land;
pub mod links;
pub mod owned;
pub mod proposals;
pub mod remote;
pub mod reviewed;
pub mod runtime_commits;
pub mod signing;
pub mod trust;
pub mod walk;
pub mod work;

use crate::layout::BUILDER_DIRS;
use git2::{Oid, Repository};
use std::path::PathBuf;

/// The legacy chain of approvals (one commit per approval on one ref, each on the
/// last): still read, never written. A clone converts it once into
/// [`APPROVED_PREFIX`] refs ([`approvals::adopt_legacy`]).
pub const APPROVALS_REF: &str = "refs/builder/approvals";
/// Where approvals live: one ref per approval, `refs/builder/approved/<commit id>`,
/// created once and never updated or deleted by builder.
pub const APPROVED_PREFIX: &str = "refs/builder/approved/";
/// The refspec (fetch and push alike) that carries approvals: not forced, so a fetch
/// or push only ever adds approvals, and scoped to [`APPROVED_PREFIX`], so the legacy
/// chain (which was force-moved) can never make a fetch or pull fail.
pub const APPROVALS_REFSPEC: &str = "refs/builder/approved/*:refs/builder/approved/*";
pub use crate::layout::PROPOSAL_PREFIX;
/// The forced refspec earlier versions wrote for every `refs/builder/*` ref:
/// `builder install-hooks` replaces it with [`APPROVALS_REFSPEC`] (a forced fetch
/// let a `git pull` replace approvals the clone had not pushed yet).
pub const BUILDER_REFSPEC: &str = "+refs/builder/*:refs/builder/*";

/// Why a review step could not be done.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The workflow's rules say no (self-approval, no approval, nothing to propose):
    /// `builder` exits 1.
    #[error("{0}")]
    Refused(String),
    /// The command named something that is not there, or is malformed: exit 2.
    #[error("{0}")]
    Usage(String),
    #[error("git: {0}")]
    Git(#[from] git2::Error),
    #[error(transparent)]
    Repo(#[from] crate::git::GitError),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    /// A `git` command against the remote failed (unreachable, refused, no such
    /// remote): exit 1.
    #[error("{command}: {message}")]
    Remote { command: String, message: String },
}

/// The id of the approved tree of `tree`: a tree holding the builder-owned
/// directories of `tree` and, when its own settings name `builder_paths`, the paths
/// they match outside those directories (each top-level directory pruned to what they
/// match). Without such paths it is the id `git::builder_tree_id` writes (the test
/// oracle), so approvals made before `builder_paths` counted keep their meaning. It is
/// computed without writing any object, so a read-only audit (a server hook's
/// quarantine) can compute it too.
pub fn builder_tree_of(repo: &Repository, tree: &git2::Tree) -> Result<Oid, git2::Error> {
    // Nothing is read from a tree git refuses (two entries of one name read differently
    // by different programs).
    canonical::check(repo, tree.id(), "", false)?;
    let mut entries: Vec<(String, i32, Oid)> = Vec::new();
    for dir in BUILDER_DIRS.iter().filter(|d| **d != ".git") {
        if let Some(e) = tree.get_name(dir) {
            if e.filemode() == 0o040000 {
                canonical::check(repo, e.id(), dir, true)?;
            }
            entries.push((dir.to_string(), e.filemode(), e.id()));
        }
    }
    let owned = owned::OwnedPaths::of_tree(repo, tree)?;
    if owned.has_extras() {
        for e in tree.iter() {
            let name = String::from_utf8_lossy(e.name_bytes()).into_owned();
            if BUILDER_DIRS.contains(&name.as_str()) {
                continue;
            }
            if owned.is_builder(&name) {
                if e.filemode() == 0o040000 {
                    canonical::check(repo, e.id(), &name, true)?;
                }
                entries.push((name, e.filemode(), e.id()));
            } else if e.filemode() == 0o040000 && owned.may_hold_builder(&name) {
                if let Some(id) = pruned(repo, &owned, &name, e.id())? {
                    entries.push((name, 0o040000, id));
                }
            }
        }
    }
    Ok(hash_tree(&mut entries))
}

/// The id of the tree `entries` would make, in git's order, without writing it.
fn hash_tree(entries: &mut [(String, i32, Oid)]) -> Oid {
    entries.sort_by_key(|(name, mode, _)| canonical::order_key(name.as_bytes(), *mode));
    let mut raw = Vec::new();
    for (name, mode, id) in entries.iter() {
        raw.extend_from_slice(format!("{mode:o} {name}\0").as_bytes());
        raw.extend_from_slice(id.as_bytes());
    }
    // Hashing bytes in memory cannot fail; the zero id would never name a tree.
    Oid::hash_object(git2::ObjectType::Tree, &raw).unwrap_or(Oid::ZERO_SHA1)
}

/// The directory `dir` (at `path`) pruned to the paths `builder_paths` match, `None`
/// when none is there. Remembered per (directory, path, globs) for the thread: a walk
/// over records-only commits meets the same directories again and again.
fn pruned(repo: &Repository, owned: &owned::OwnedPaths, path: &str, dir: Oid) -> Result<Option<Oid>, git2::Error> {
    type Key = (Oid, String, u64);
    thread_local! {
        static PRUNED: std::cell::RefCell<std::collections::HashMap<Key, Option<Oid>>> =
            std::cell::RefCell::new(std::collections::HashMap::new());
    }
    let key = (dir, path.to_string(), owned.key());
    if let Some(hit) = PRUNED.with(|m| m.borrow().get(&key).copied()) {
        return Ok(hit);
    }
    canonical::check(repo, dir, path, false)?;
    let mut entries = Vec::new();
    for e in repo.find_tree(dir)?.iter() {
        let rel = format!("{path}/{}", String::from_utf8_lossy(e.name_bytes()));
        if owned.is_builder(&rel) {
            if e.filemode() == 0o040000 {
                canonical::check(repo, e.id(), &rel, true)?;
            }
            entries.push((rel[path.len() + 1..].to_string(), e.filemode(), e.id()));
        } else if e.filemode() == 0o040000 && owned.may_hold_builder(&rel) {
            if let Some(id) = pruned(repo, owned, &rel, e.id())? {
                entries.push((rel[path.len() + 1..].to_string(), 0o040000, id));
            }
        }
    }
    let out = (!entries.is_empty()).then(|| hash_tree(&mut entries));
    PRUNED.with(|m| {
        let mut m = m.borrow_mut();
        if m.len() >= 4096 {
            m.clear();
        }
        m.insert(key, out);
    });
    Ok(out)
}

/// Whether the symlink at `link` (repository-relative) with `target` stays inside the
/// builder-owned directories judged by its own text alone: what the two-key check did
/// before links were resolved component by component ([`links`]); kept to show, in
/// tests, why that is not enough.
#[cfg(test)]
pub fn link_stays_inside(link: &str, target: &str) -> bool {
    if target.starts_with('/') {
        return false;
    }
    let mut parts: Vec<&str> = link.split('/').collect();
    parts.pop();
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return false;
                }
            }
            c => parts.push(c),
        }
    }
    parts
        .first()
        .is_some_and(|top| BUILDER_DIRS.iter().any(|d| *d != ".git" && d == top))
}

/// `require_reviewed` and `review.require_signed` as the text of a
/// `settings/runtime.yaml` says them (false when it does not say, or does not parse).
pub fn review_flags(settings_yaml: &[u8]) -> (bool, bool) {
    let yaml = crate::yamlpos::lenient_value(settings_yaml);
    let flag = |v: Option<&serde_yaml::Value>| v.and_then(serde_yaml::Value::as_bool).unwrap_or(false);
    (
        flag(yaml.as_ref().and_then(|v| v.get("require_reviewed"))),
        flag(
            yaml.as_ref()
                .and_then(|v| v.get("review"))
                .and_then(|r| r.get("require_signed")),
        ),
    )
}

/// The text of the settings in the tree of `commit` (`None` without them).
fn settings_text(repo: &Repository, commit: Oid) -> Result<Option<Vec<u8>>, git2::Error> {
    let tree = repo.find_commit(commit)?.tree()?;
    let entry = match tree.get_path(std::path::Path::new(crate::layout::SETTINGS_FILE)) {
        Ok(e) => e,
        Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(Some(repo.find_blob(entry.id())?.content().to_vec()))
}

/// The `sync.branch` the settings in the tree of `commit` name, if any.
pub fn sync_branch_of_commit(repo: &Repository, commit: Oid) -> Result<Option<String>, git2::Error> {
    let Some(text) = settings_text(repo, commit)? else {
        return Ok(None);
    };
    let yaml = crate::yamlpos::lenient_value(&text);
    Ok(yaml
        .as_ref()
        .and_then(|v| v.get("sync"))
        .and_then(|s| s.get("branch"))
        .and_then(serde_yaml::Value::as_str)
        .map(str::to_string))
}

/// [`review_flags`] of the settings in the tree of `commit` (false without them).
pub fn review_flags_of_commit(repo: &Repository, commit: Oid) -> Result<(bool, bool), git2::Error> {
    Ok(settings_text(repo, commit)?.map_or((false, false), |t| review_flags(&t)))
}

/// With `review.require_signed` in the settings of `commit`: its
/// `review.allowed_signers` (the default path when it does not say).
pub fn signed_list_of_commit(repo: &Repository, commit: Oid) -> Result<Option<String>, git2::Error> {
    Ok(settings_text(repo, commit)?.and_then(|t| signed_list(&t)))
}

/// With `review.require_signed` in the settings text `settings_yaml`: its
/// `review.allowed_signers` (the default path when it does not say).
pub fn signed_list(settings_yaml: &[u8]) -> Option<String> {
    review_flags(settings_yaml)
        .1
        .then(|| allowed_signers_path(settings_yaml))
}

/// The `review.allowed_signers` of the settings text `settings_yaml`, the default
/// path when it does not say (whether signatures are asked or not).
pub fn allowed_signers_path(settings_yaml: &[u8]) -> String {
    let yaml = crate::yamlpos::lenient_value(settings_yaml);
    yaml.as_ref()
        .and_then(|v| v.get("review"))
        .and_then(|r| r.get("allowed_signers"))
        .and_then(serde_yaml::Value::as_str)
        .unwrap_or(signing::DEFAULT_ALLOWED_SIGNERS)
        .to_string()
}

/// The builder tree of the commit `commit`.
pub fn builder_tree_of_commit(repo: &Repository, commit: Oid) -> Result<Oid, git2::Error> {
    builder_tree_of(repo, &repo.find_commit(commit)?.tree()?)
}

/// The paths `head` changes from `base` that are not builder-owned (by `head`'s own
/// settings): an approval names the builder tree alone, so none covers them.
/// `builder review` lists them and `builder land` refuses a proposal that holds any.
pub fn unowned_changes(repo: &Repository, base: Oid, head: Oid) -> Result<Vec<String>, git2::Error> {
    changes_outside(repo, base, head, &[head])
}

/// The paths `head` changes from `base` that are not builder-owned by the settings of
/// any one of `judges` (commits): an eval judges by the base's `builder_paths` as well
/// as the head's, so a head cannot make its own change builder-owned.
pub fn changes_outside(repo: &Repository, base: Oid, head: Oid, judges: &[Oid]) -> Result<Vec<String>, git2::Error> {
    let head_tree = repo.find_commit(head)?.tree()?;
    let base_tree = repo.find_commit(base)?.tree()?;
    let owned = judges
        .iter()
        .map(|j| owned::OwnedPaths::of_tree(repo, &repo.find_commit(*j)?.tree()?))
        .collect::<Result<Vec<_>, _>>()?;
    let diff = repo.diff_tree_to_tree(Some(&base_tree), Some(&head_tree), None)?;
    let mut out: Vec<String> = Vec::new();
    for d in diff.deltas() {
        for path in [d.old_file().path(), d.new_file().path()].into_iter().flatten() {
            let path = path.to_string_lossy().into_owned();
            if !owned.iter().all(|o| o.is_builder(&path)) && !out.contains(&path) {
                out.push(path);
            }
        }
    }
    Ok(out)
}

/// Email addresses compare case-insensitively (docs/design.md).
pub fn same_person(a_email: &str, b_email: &str) -> bool {
    a_email.trim().eq_ignore_ascii_case(b_email.trim())
}

/// The runtime identity may neither propose nor approve (nor merge): refuses `actor`
/// when it is `runtime` (by email, case-insensitively).
pub fn refuse_runtime(actor: &crate::git::Person, runtime: &crate::git::Person, what: &str) -> Result<(), ReviewError> {
    if same_person(&actor.email, &runtime.email) {
        return Err(ReviewError::Refused(format!(
            "{actor} is the runtime identity (settings runtime_identity): the runtime cannot {what}"
        )));
    }
    Ok(())
}

/// Parses `Name <email>` (what `--reviewer` takes and approvals record).
pub fn parse_person(s: &str) -> Option<crate::git::Person> {
    let s = s.trim();
    let open = s.find('<')?;
    let close = s.rfind('>')?;
    let name = s[..open].trim();
    let email = s.get(open + 1..close)?.trim();
    if name.is_empty() || email.is_empty() || close != s.len() - 1 || !email.contains('@') {
        return None;
    }
    Some(crate::git::Person {
        name: name.to_string(),
        email: email.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builder_tree_hash_matches_the_written_tree() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let blob = repo.blob(b"x").unwrap();
        let mut sub = repo.treebuilder(None).unwrap();
        sub.insert("a.md", blob, 0o100644).unwrap();
        let sub = sub.write().unwrap();
        let mut top = repo.treebuilder(None).unwrap();
        for name in ["prompts", "scope", "reports", "settings"] {
            top.insert(name, sub, 0o040000).unwrap();
        }
        // A builder name that is a file, and one that sorts around a directory.
        top.insert("tools", blob, 0o100755).unwrap();
        top.insert("README.md", blob, 0o100644).unwrap();
        let top = repo.find_tree(top.write().unwrap()).unwrap();
        assert_eq!(
            builder_tree_of(&repo, &top).unwrap(),
            crate::git::builder_tree_id(&repo, &top).unwrap()
        );
        let empty = repo
            .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
            .unwrap();
        assert_eq!(
            builder_tree_of(&repo, &empty).unwrap(),
            crate::git::builder_tree_id(&repo, &empty).unwrap()
        );
    }

    #[test]
    fn builder_paths_outside_the_five_directories_join_the_builder_tree() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let build = |settings: &str, policy: &str| {
            let mut update = git2::build::TreeUpdateBuilder::new();
            for (path, body) in [
                ("settings/runtime.yaml", settings),
                ("prompts/t.md", "p"),
                ("docs/policy/a.md", policy),
                ("docs/other.md", "free"),
                ("reports/r.md", "model"),
            ] {
                update.upsert(path, repo.blob(body.as_bytes()).unwrap(), git2::FileMode::Blob);
            }
            let empty = repo.treebuilder(None).unwrap().write().unwrap();
            let empty = repo.find_tree(empty).unwrap();
            repo.find_tree(update.create_updated(&repo, &empty).unwrap()).unwrap()
        };
        // Without builder_paths: exactly the id of the five directories (the oracle).
        let plain = build("version: 1\n", "a");
        assert_eq!(
            builder_tree_of(&repo, &plain).unwrap(),
            crate::git::builder_tree_id(&repo, &plain).unwrap()
        );
        assert_eq!(
            builder_tree_of(&repo, &plain).unwrap(),
            builder_tree_of(&repo, &build("version: 1\n", "changed")).unwrap(),
            "not builder-owned without builder_paths"
        );
        // With them: a change to a matched file changes the tree; other files do not.
        let with = "version: 1\nbuilder_paths: [\"docs/policy/**\"]\n";
        let a = builder_tree_of(&repo, &build(with, "a")).unwrap();
        assert_ne!(a, builder_tree_of(&repo, &build(with, "b")).unwrap());
        let mut update = git2::build::TreeUpdateBuilder::new();
        update.upsert("docs/other.md", repo.blob(b"edited").unwrap(), git2::FileMode::Blob);
        update.upsert("reports/s.md", repo.blob(b"more").unwrap(), git2::FileMode::Blob);
        let t = repo
            .find_tree(update.create_updated(&repo, &build(with, "a")).unwrap())
            .unwrap();
        assert_eq!(builder_tree_of(&repo, &t).unwrap(), a);
    }

    #[test]
    fn a_link_counts_as_leaving_when_its_target_resolves_outside_the_builder_dirs() {
        for (link, target, inside) in [
            ("tools/x.sh", "real.sh", true),
            ("tools/a/x.sh", "../../prompts/p.md", true),
            ("tools/x.sh", "../lib/x.sh", false),
            ("tools/x.sh", "/etc/passwd", false),
            ("tools/x.sh", "../../tools/x.sh", false),
            ("tools/x.sh", "..", false),
            ("tools", "lib", false),
            ("tools/x", "../.git/hooks", false),
        ] {
            assert_eq!(link_stays_inside(link, target), inside, "{link} -> {target}");
        }
    }

    #[test]
    fn people_are_parsed_and_compared_by_email() {
        let p = parse_person("Ann Lee <Ann@Example.com>").unwrap();
        assert_eq!((p.name.as_str(), p.email.as_str()), ("Ann Lee", "Ann@Example.com"));
        assert!(same_person(&p.email, "ann@example.COM"));
        for bad in ["Ann", "<a@x>", "Ann <>", "Ann <a@x> extra", "Ann <ax>"] {
            assert!(parse_person(bad).is_none(), "{bad}");
        }
    }
}
