//! Which paths of a tree belong to the approved tree, and which ones tools may write,
//! as that tree's own settings say (issue 17 item 3). The approved tree is the five
//! builder directories (`prompts/`, `scope/`, `settings/`, `tools/`, `evals/`) plus
//! every path `builder_paths` matches; what tools may write is the write ACL, taken
//! the way the kernel sandbox grants it: a glob's literal directory (`docs/*.md`
//! grants all of `docs/`), not only the names the glob matches. The link judge
//! ([`super::links`]) and the builder tree id ([`super::builder_tree_of`]) both ask
//! this one value, read from the tree being judged, so the rules that judge a tree
//! are part of what its approval names.

use crate::layout::{at_or_beneath, compile_globs, literal_prefix, BUILDER_DIRS, SETTINGS_FILE};
use git2::{Oid, Repository};
use globset::GlobSet;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// The builder-owned paths and the write reach of one tree (or one loaded settings).
#[derive(Debug, Clone, Default)]
pub struct OwnedPaths {
    /// `builder_paths`, compiled (a `dir/**` glob also matches `dir`).
    extra: Option<GlobSet>,
    /// The literal directory prefix of each `builder_paths` glob (`""`: it may match
    /// anywhere).
    extra_prefixes: Vec<String>,
    /// The write ACL, compiled.
    write: Option<GlobSet>,
    /// The write ACL's literal directories (what the sandbox grants beneath).
    write_dirs: Vec<String>,
    /// A hash of `builder_paths`, naming them in memos.
    key: u64,
}

impl OwnedPaths {
    /// From `builder_paths` and the write ACL; a glob that does not compile is left
    /// out (settings loading reports it with its line, and refuses the settings).
    pub fn new(builder_paths: &[String], write: &[String]) -> OwnedPaths {
        let compile = |globs: &[String]| {
            let good: Vec<String> = globs
                .iter()
                .filter(|g| globset::Glob::new(g.trim_end_matches('/')).is_ok())
                .cloned()
                .collect();
            compile_globs(&good).ok().flatten()
        };
        OwnedPaths {
            extra: compile(builder_paths),
            extra_prefixes: builder_paths.iter().map(|g| literal_prefix(g)).collect(),
            write: compile(write),
            write_dirs: write
                .iter()
                .map(|g| literal_prefix(g))
                .filter(|d| !d.is_empty())
                .collect(),
            key: {
                use std::hash::{Hash, Hasher};
                let mut h = std::collections::hash_map::DefaultHasher::new();
                builder_paths.hash(&mut h);
                h.finish()
            },
        }
    }

    /// A hash of the `builder_paths` these paths were made from.
    pub fn key(&self) -> u64 {
        self.key
    }

    /// The paths of loaded settings.
    pub fn of_settings(s: &crate::settings::RuntimeSettings) -> OwnedPaths {
        OwnedPaths::new(&s.builder_paths, &s.permissions.write)
    }

    /// The paths a `settings/runtime.yaml` text names (read leniently: what does not
    /// parse names nothing, and such settings refuse every fire anyway).
    pub fn of_settings_text(yaml: &[u8]) -> OwnedPaths {
        let value = crate::yamlpos::lenient_value(yaml);
        let list = |v: Option<&serde_yaml::Value>| -> Vec<String> {
            v.and_then(serde_yaml::Value::as_sequence)
                .map(|s| s.iter().filter_map(|g| g.as_str().map(str::to_string)).collect())
                .unwrap_or_default()
        };
        let builder = list(value.as_ref().and_then(|v| v.get("builder_paths")));
        let write = list(
            value
                .as_ref()
                .and_then(|v| v.get("permissions"))
                .and_then(|p| p.get("write")),
        );
        OwnedPaths::new(&builder, &write)
    }

    /// The paths the settings in `tree` name (its `settings/runtime.yaml`, a regular
    /// file or a link resolved within `settings/`), remembered per settings blob for
    /// the life of the thread: history walks ask about thousands of commits that share
    /// a handful of settings.
    pub fn of_tree(repo: &Repository, tree: &git2::Tree) -> Result<Rc<OwnedPaths>, git2::Error> {
        let Some(blob) = settings_blob(repo, tree)? else {
            return Ok(Rc::new(OwnedPaths::default()));
        };
        thread_local! {
            static BY_BLOB: RefCell<HashMap<Oid, Rc<OwnedPaths>>> = RefCell::new(HashMap::new());
        }
        if let Some(hit) = BY_BLOB.with(|m| m.borrow().get(&blob).cloned()) {
            return Ok(hit);
        }
        let owned = Rc::new(OwnedPaths::of_settings_text(repo.find_blob(blob)?.content()));
        BY_BLOB.with(|m| {
            let mut m = m.borrow_mut();
            if m.len() >= 256 {
                m.clear();
            }
            m.insert(blob, owned.clone());
        });
        Ok(owned)
    }

    /// Whether `builder_paths` name anything beyond the five directories.
    pub fn has_extras(&self) -> bool {
        self.extra.is_some()
    }

    /// Whether the repo-relative, normalised `rel` belongs to the approved tree: under
    /// one of the five builder directories (never `.git`, which no tree holds), or
    /// matched by `builder_paths`, or beneath a directory they match.
    pub fn is_builder(&self, rel: &str) -> bool {
        let first = rel.split('/').next().unwrap_or("");
        if BUILDER_DIRS.iter().any(|d| *d != ".git" && *d == first) {
            return true;
        }
        let Some(extra) = &self.extra else {
            return false;
        };
        let mut at = rel;
        loop {
            if extra.is_match(at) {
                return true;
            }
            match at.rfind('/') {
                Some(i) => at = &at[..i],
                None => return false,
            }
        }
    }

    /// Whether the directory `dir` may hold paths `builder_paths` match (it is one of
    /// their literal prefixes, or lies on the way to one): only such directories are
    /// walked for them.
    pub fn may_hold_builder(&self, dir: &str) -> bool {
        self.extra.is_some()
            && self
                .extra_prefixes
                .iter()
                .any(|p| at_or_beneath(p, dir) || at_or_beneath(dir, p))
    }

    /// Whether tools may write `rel`: a write glob matches it, or it lies at or beneath
    /// a directory the write ACL grants.
    pub fn writable(&self, rel: &str) -> bool {
        self.write.as_ref().is_some_and(|w| w.is_match(rel)) || self.write_dirs.iter().any(|d| at_or_beneath(rel, d))
    }
}

/// The blob of `settings/runtime.yaml` in `tree`: the file itself, or, when it is a
/// link, the file it names within `settings/` (one level, as the settings loader
/// resolves it); `None` when there is none.
fn settings_blob(repo: &Repository, tree: &git2::Tree) -> Result<Option<Oid>, git2::Error> {
    let entry = match tree.get_path(std::path::Path::new(SETTINGS_FILE)) {
        Ok(e) => e,
        Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    if entry.filemode() != i32::from(git2::FileMode::Link) {
        return Ok((entry.kind() == Some(git2::ObjectType::Blob)).then(|| entry.id()));
    }
    let owned = OwnedPaths::default();
    let view = super::links::GitView::new(repo, tree);
    match super::links::resolve(&view, &owned, SETTINGS_FILE) {
        Ok(Ok(r)) if r.is_file => Ok(tree.get_path(std::path::Path::new(&r.path)).ok().map(|e| e.id())),
        Ok(_) => Ok(None),
        Err(super::links::ViewError::Git(e)) => Err(e),
        Err(e) => Err(git2::Error::from_str(&e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_paths_extend_the_five_directories() {
        let o = OwnedPaths::new(&["docs/policy/**".into(), "lib/x.sh".into()], &["reports/**".into()]);
        for p in [
            "prompts/a.md",
            "tools/x",
            "docs/policy",
            "docs/policy/a/b.md",
            "lib/x.sh",
        ] {
            assert!(o.is_builder(p), "{p}");
        }
        for p in ["docs", "docs/other.md", "lib/y.sh", ".git/config", "reports/x", "runs"] {
            assert!(!o.is_builder(p), "{p}");
        }
        assert!(o.may_hold_builder("docs") && o.may_hold_builder("lib"));
        assert!(!o.may_hold_builder("reports") && !o.may_hold_builder("runs"));
        assert!(o.writable("reports") && o.writable("reports/a/b.md"));
        assert!(!o.writable("prompts/x") && !o.writable("reportsx"));
    }
}
