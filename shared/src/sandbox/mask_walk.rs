//! What a worker's mount namespace masks, found by walking the directories it shows:
//! every path a `Read` deny glob matches under the repository, and every UNIX socket
//! in the repository (all of `.git` too) and in the read roots outside it (a host
//! process listening there, such as git's fsmonitor daemon on
//! `.git/fsmonitor--daemon.ipc`, would otherwise take a tool's connection: Landlock
//! scopes pathname sockets only from ABI 9).
//!
//! Listing a directory costs the kernel far more than a `stat` of it (about 20 µs
//! against 1 µs on ext4), and a repository's `.git` alone holds hundreds of
//! directories, so the runtime walks with a cache ([`WalkCache`], in `.runtime`,
//! which no tool can reach): a directory whose identity and change time (`ctime`)
//! are those recorded is not listed again. Any entry made, removed or renamed in a
//! directory sets its `ctime` to the present, which no process can set back; an
//! entry is kept only once its `ctime` is [`SETTLED`] older than the walk that
//! listed it, so a change in the same timestamp step as that listing cannot be taken
//! for none. Paths go to the worker as bytes: a name that is not UTF-8 is masked too.

use super::mask_links::{Follow, Through};
use super::namespaces::{NamespacePlan, NsError};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How a path is masked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mask {
    /// A UNIX socket: `/dev/null` over it.
    Socket,
    /// A file a deny glob matches: `/dev/null` over it.
    File,
    /// A directory a deny glob matches: an empty read-only tmpfs over it.
    Dir,
}

/// How much older than the walk a directory's `ctime` must be for the cache to keep
/// it: more than any file system's timestamp step (FAT's is 2 s; ext4, XFS, btrfs and
/// tmpfs keep nanoseconds of a clock tick of a few ms). The metadata manifest keeps a
/// hook's hash by the same rule ([`crate::manifest`]).
pub const SETTLED: Duration = Duration::from_secs(3);

/// Directories whose entries must have changed before the cache file is written
/// again, plus a tenth of the entries it holds (a cache that held nothing is written
/// at once). Every fire changes a few dozen (its
/// records' directories, `.git`'s object fan-out and ref directories, each dropped
/// while freshly changed and kept again once settled), which the next walk lists
/// again at about ten microseconds each; rewriting the file for them costs more (a
/// new file and a freed one, each slow on a file system that scans recently freed
/// inodes, and the whole cache serialized, about a microsecond an entry).
const CACHE_WRITE_AFTER: usize = 32;

/// Where the runtime keeps its walk cache, under the state directory.
pub const CACHE_FILE: &str = "mask-walk.json";

/// The cache file's format: 2 keeps each directory's links.
const CACHE_VERSION: u32 = 2;

/// Everything `plan`'s namespace masks: the repository walked for deny globs and
/// sockets, its `.git` and the read roots for sockets. With `cache` (a file the
/// runtime alone writes), directories unchanged since the last walk are not listed
/// again; the cache is written back when the walk changed more of its entries than
/// [`CACHE_WRITE_AFTER`] says (best effort: a cache that cannot be written
/// costs the next walk its time, nothing else).
pub fn plan_masks(plan: &NamespacePlan, cache: Option<&Path>) -> Result<Vec<(PathBuf, Mask)>, NsError> {
    let (found, write) = walk_masks(plan, cache)?;
    write.finish();
    Ok(found)
}

/// The cache a walk changed, written by [`CacheWrite::finish`].
pub struct CacheWrite(Option<(PathBuf, WalkCache)>);

impl CacheWrite {
    pub fn finish(self) {
        if let Some((file, cache)) = self.0 {
            let _ = cache.store(&file);
        }
    }
}

/// As [`plan_masks`], with the cache written only when the returned [`CacheWrite`]
/// is finished: the masks can go to the worker first.
pub fn walk_masks(plan: &NamespacePlan, cache: Option<&Path>) -> Result<(Vec<(PathBuf, Mask)>, CacheWrite), NsError> {
    // Relative globs match names relative to the repository; absolute ones (`/srv/**`,
    // `/**`) match a name's absolute form, under each spelling of the walk's root.
    let (relative, absolute): (Vec<String>, Vec<String>) =
        plan.masked.iter().cloned().partition(|g| !g.starts_with('/'));
    let absolute: Vec<String> = absolute.iter().map(|g| g[1..].to_string()).collect();
    let rel_set = glob_set(&relative)?;
    let abs_set = glob_set(&absolute)?;
    let any_depth: Vec<String> = relative
        .iter()
        .filter(|g| crate::rules::is_any_depth(g))
        .cloned()
        .collect();
    let any_depth_set = glob_set(&any_depth)?;
    let mut walk = Walk {
        cache: cache.map(|f| WalkCache::load(f, &plan.masked)).unwrap_or_default(),
        updated: 0,
        listed: 0,
        seen: Default::default(),
        now: SystemTime::now(),
        follow: Follow::new(plan),
    };
    // A cache that held nothing (none yet, or kept for other globs) is written as
    // soon as this walk settles anything, whatever the threshold.
    let held_nothing = walk.cache.dirs.is_empty();
    let repo_globs = Globs {
        rel: rel_set.as_ref(),
        abs: abs_set.as_ref(),
        rel_globs: &relative,
        abs_globs: &absolute,
        spellings: spellings(&plan.root),
        id: 1,
    };
    let mut found = walk.find_with(&plan.root, &repo_globs, true)?;
    // Sockets only: the repository's `.git` (the walk above passes over it) and the
    // read roots (a linked worktree's git directories, `additional_directories`).
    // (`.git` as the worker shows it: a link stays a link. A read root that is a link
    // is mounted at its path as the directory it points to, so it is walked as one.)
    if plan.root.join(".git").symlink_metadata().is_ok_and(|m| m.is_dir()) {
        found.extend(walk.find(&plan.root.join(".git"), None, false)?);
    }
    let read_root_globs = Globs {
        rel: any_depth_set.as_ref(),
        abs: abs_set.as_ref(),
        rel_globs: &any_depth,
        abs_globs: &absolute,
        spellings: Vec::new(),
        id: 0,
    };
    found.extend(walk.read_roots(plan, read_root_globs)?);
    tracing::debug!(listed = walk.listed, found = found.len(), "mask walk");
    // Only what this walk saw is kept: a directory gone (or no longer walked) leaves
    // the cache, which no model can grow by making and removing directories.
    let before = walk.cache.dirs.len();
    let seen = std::mem::take(&mut walk.seen);
    walk.cache.dirs.retain(|d, _| seen.contains(d));
    let updated = walk.updated + (before - walk.cache.dirs.len());
    let worth = updated > 0 && (held_nothing || updated >= CACHE_WRITE_AFTER + walk.cache.dirs.len() / 10);
    let write = match (cache, worth) {
        (Some(file), true) => {
            walk.cache.globs = plan.masked.clone();
            Some((file.to_path_buf(), walk.cache))
        }
        _ => None,
    };
    Ok((found, CacheWrite(write)))
}

/// The walk cache: per directory walked, what its listing held the last time.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct WalkCache {
    /// [`CACHE_VERSION`] when written (another: the cache is empty).
    #[serde(default)]
    version: u32,
    /// The deny globs the entries were matched with (other globs: the cache is empty).
    globs: Vec<String>,
    dirs: HashMap<PathBuf, CachedDir>,
}

/// One directory as a walk listed it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct CachedDir {
    /// Device, inode and `ctime` (seconds, nanoseconds) when it was listed.
    stamp: (u64, u64, i64, i64),
    /// The deny globs it was listed for (the walk's name for them, [`set_id`]): 0 for
    /// sockets alone, 1 for the repository's.
    globbed: u64,
    /// Listed as the repository's top (its `.git` and `.runtime` passed over).
    #[serde(default)]
    top: bool,
    /// Its subdirectories the walk went into.
    subdirs: Vec<String>,
    /// Its entries masked.
    masks: Vec<(String, Mask)>,
    /// Its symbolic links (a deny glob may name a path through one).
    #[serde(default)]
    links: Vec<String>,
}

impl WalkCache {
    fn load(file: &Path, globs: &[String]) -> WalkCache {
        let cache: WalkCache = std::fs::read(file)
            .ok()
            .and_then(|bytes| serde_json::from_slice(&bytes).ok())
            .unwrap_or_default();
        if cache.version == CACHE_VERSION && cache.globs == globs {
            cache
        } else {
            WalkCache::default()
        }
    }

    fn store(&self, file: &Path) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(&WalkCache {
            version: CACHE_VERSION,
            ..self.clone()
        })
        .map_err(std::io::Error::other)?;
        let tmp = file.with_extension(format!("tmp.{}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, file)
    }
}

/// A directory's entries the walk cares about, by name.
#[derive(Debug, Default)]
struct Listed {
    subdirs: Vec<OsString>,
    masks: Vec<(OsString, Mask)>,
    /// Symbolic links, listed in walks with deny globs ([`super::mask_links`]).
    links: Vec<OsString>,
}

impl Listed {
    fn from_cache(c: &CachedDir) -> Listed {
        Listed {
            subdirs: c.subdirs.iter().map(OsString::from).collect(),
            masks: c.masks.iter().map(|(n, m)| (OsString::from(n), *m)).collect(),
            links: c.links.iter().map(OsString::from).collect(),
        }
    }

    /// As the cache keeps it; `None` when a name is not UTF-8 (such a directory is
    /// listed every time).
    fn to_cache(&self, stamp: (u64, u64, i64, i64), globbed: u64, top: bool) -> Option<CachedDir> {
        Some(CachedDir {
            stamp,
            globbed,
            top,
            subdirs: self
                .subdirs
                .iter()
                .map(|n| n.to_str().map(str::to_string))
                .collect::<Option<_>>()?,
            masks: self
                .masks
                .iter()
                .map(|(n, m)| n.to_str().map(|n| (n.to_string(), *m)))
                .collect::<Option<_>>()?,
            links: self
                .links
                .iter()
                .map(|n| n.to_str().map(str::to_string))
                .collect::<Option<_>>()?,
        })
    }
}

struct Walk {
    cache: WalkCache,
    /// Directories whose cache entry this walk made, replaced or dropped.
    updated: usize,
    /// Directories listed (not served from the cache).
    listed: usize,
    /// Every directory this walk went through.
    seen: std::collections::HashSet<PathBuf>,
    /// When the walk started: a directory changed less than [`SETTLED`] before is
    /// listed, never kept in the cache.
    now: SystemTime,
    /// Which links the walk goes through.
    follow: Follow,
}

impl Walk {
    /// What to mask under `root`: every path the deny globs match and every socket.
    /// The walk has no cap (one that gave up past 100,000 entries left the rest
    /// unmasked, so a deny rule stopped holding for `cat` in a big repository); it
    /// skips only what no tool can read through it: with `repository`, `.git` (walked
    /// for sockets apart) and `.runtime` (masked whole) at its top; and directories
    /// it masks. Entry types come from the directory listing, not a `stat` per entry.
    /// A directory it cannot list but a tool could enter (searchable, not readable)
    /// fails the walk: a deny path inside could not be seen, so it could not be masked.
    fn find(
        &mut self,
        root: &Path,
        set: Option<&globset::GlobSet>,
        repository: bool,
    ) -> Result<Vec<(PathBuf, Mask)>, NsError> {
        let globs = Globs {
            rel: set,
            abs: None,
            rel_globs: &[],
            abs_globs: &[],
            spellings: Vec::new(),
            id: u64::from(set.is_some()),
        };
        self.find_with(root, &globs, repository)
    }

    /// The read roots of `plan`, walked for sockets and for the deny globs that reach
    /// outside the repository (`template`'s): those for any depth (`**/.env`) and the
    /// absolute ones (`//srv/x/**`), each matched against an entry's absolute form.
    fn read_roots(&mut self, plan: &NamespacePlan, template: Globs<'_>) -> Result<Vec<(PathBuf, Mask)>, NsError> {
        let mut found = Vec::new();
        for dir in plan.read_dirs.iter().filter(|d| d.metadata().is_ok_and(|m| m.is_dir())) {
            let mut globs = Globs {
                spellings: spellings(dir),
                ..template.clone()
            };
            if !globs.any() {
                found.extend(self.find(dir, None, false)?);
                continue;
            }
            // A read root a rule denies whole is masked whole (not one that holds the
            // repository: its own entries are judged by the repository's walk).
            if globs.is_match("") && !plan.root.starts_with(dir) {
                found.push((dir.clone(), Mask::Dir));
                continue;
            }
            globs.id = set_id(dir, &plan.masked);
            found.extend(self.find_with(dir, &globs, false)?);
        }
        Ok(found)
    }

    /// [`Walk::find`] with `globs` (relative and absolute, [`Globs`]).
    /// A directory reached through a link is listed afresh (the cache keeps
    /// directories by their own names) and masked by its path through the link.
    fn find_with(&mut self, root: &Path, globs: &Globs<'_>, repository: bool) -> Result<Vec<(PathBuf, Mask)>, NsError> {
        let mut out = Vec::new();
        let mut stack = vec![ToList {
            dir: root.to_path_buf(),
            rel: String::new(),
            top: repository,
            through: Vec::new(),
        }];
        while let Some(at) = stack.pop() {
            let listed = match at.through.is_empty() {
                true => self.list(&at.dir, &at.rel, globs, at.top)?,
                false => {
                    self.listed += 1;
                    list_dir(&at.dir, &at.rel, globs, at.top)?
                }
            };
            let Some(listed) = listed else {
                continue;
            };
            for (name, mask) in listed.masks {
                out.push((at.dir.join(name), mask));
            }
            for name in listed.links {
                let rel = join_rel(&at.rel, &name.to_string_lossy());
                let (matched, below) = (globs.is_match(&rel), globs.may_match_below(&rel));
                match self.follow.link(&at.dir, &name, &at.through, matched, below) {
                    Some(Through::Mask(mask)) => out.push((at.dir.join(name), mask)),
                    Some(Through::Walk(target)) => stack.push(ToList {
                        top: repository && self.follow.is_repository(&target),
                        through: [&at.through[..], &[target]].concat(),
                        dir: at.dir.join(name),
                        rel,
                    }),
                    None => {}
                }
            }
            for name in listed.subdirs {
                stack.push(ToList {
                    rel: join_rel(&at.rel, &name.to_string_lossy()),
                    dir: at.dir.join(name),
                    top: false,
                    through: at.through.clone(),
                });
            }
        }
        Ok(out)
    }

    /// One directory's masks and subdirectories: from the cache when it is unchanged,
    /// else listed (`None`: gone, or neither listable nor searchable).
    fn list(&mut self, dir: &Path, rel_dir: &str, globs: &Globs<'_>, top: bool) -> Result<Option<Listed>, NsError> {
        self.seen.insert(dir.to_path_buf());
        let meta = std::fs::symlink_metadata(dir).ok().filter(|m| m.is_dir());
        let stamp = meta.as_ref().map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()));
        if let (Some(stamp), Some(hit)) = (stamp, self.cache.dirs.get(dir)) {
            if hit.stamp == stamp && hit.globbed == globs.id && hit.top == top {
                return Ok(Some(Listed::from_cache(hit)));
            }
        }
        self.listed += 1;
        let Some(listed) = list_dir(dir, rel_dir, globs, top)? else {
            return Ok(None);
        };
        let settled = meta
            .as_ref()
            .and_then(changed_at)
            .is_some_and(|t| t + SETTLED < self.now);
        // A path the cache file cannot spell (not UTF-8) is listed every time.
        let entry = stamp
            .filter(|_| settled && dir.to_str().is_some())
            .and_then(|s| listed.to_cache(s, globs.id, top));
        match entry {
            Some(entry) if self.cache.dirs.get(dir) != Some(&entry) => {
                self.cache.dirs.insert(dir.to_path_buf(), entry);
                self.updated += 1;
            }
            Some(_) => {}
            None => self.updated += usize::from(self.cache.dirs.remove(dir).is_some()),
        }
        Ok(Some(listed))
    }
}

/// A directory a walk has still to list.
struct ToList {
    /// Its path, through the links followed to reach it.
    dir: PathBuf,
    /// The name deny globs match (relative to the walk's root).
    rel: String,
    /// The repository's top (its `.git` and `.runtime` passed over).
    top: bool,
    /// The targets of the links followed on the way (canonical).
    through: Vec<PathBuf>,
}

/// The deny globs one walk matches: `rel` against a name relative to the walk's root,
/// `abs` against its absolute form (without the leading `/`) under each spelling of
/// that root (as given without `.`, `..` or a trailing `/`, and with its links
/// resolved), so `/srv/**`, `/**` or `/srv/*/secret/**` hold under a read root
/// `/srv/data` however it is named. `id` is the walk cache's name for them (0: none).
#[derive(Clone)]
struct Globs<'a> {
    rel: Option<&'a globset::GlobSet>,
    abs: Option<&'a globset::GlobSet>,
    /// The globs of `rel` and of `abs` (without the leading `/`), as written.
    rel_globs: &'a [String],
    abs_globs: &'a [String],
    spellings: Vec<String>,
    id: u64,
}

impl Globs<'_> {
    fn any(&self) -> bool {
        self.rel.is_some() || self.abs.is_some()
    }

    /// Whether a deny glob may match a path below the entry `rel` (a link the walk
    /// may follow, [`crate::rules::may_match_below`]).
    fn may_match_below(&self, rel: &str) -> bool {
        use crate::rules::may_match_below;
        self.rel_globs.iter().any(|g| may_match_below(g, rel))
            || self.abs_globs.iter().any(|g| {
                self.spellings
                    .iter()
                    .any(|root| may_match_below(g, &format!("{root}/{rel}")))
            })
    }

    /// Whether a deny glob matches the entry `rel` (relative to the walk's root; `""`
    /// is the root itself).
    fn is_match(&self, rel: &str) -> bool {
        (!rel.is_empty() && self.rel.is_some_and(|s| s.is_match(rel)))
            || self.abs.is_some_and(|s| {
                self.spellings.iter().any(|root| match rel.is_empty() {
                    true => s.is_match(root),
                    false => s.is_match(format!("{root}/{rel}")),
                })
            })
    }
}

/// `dir`'s absolute spellings without the leading `/`: as given without `.`, `..` or
/// a trailing `/`, and with its links resolved.
fn spellings(dir: &Path) -> Vec<String> {
    let lexical: PathBuf = dir.components().fold(PathBuf::new(), |mut p, c| {
        match c {
            std::path::Component::CurDir => {}
            std::path::Component::ParentDir => {
                p.pop();
            }
            c => p.push(c),
        }
        p
    });
    let mut out: Vec<String> = Vec::new();
    for s in [Some(lexical), std::fs::canonicalize(dir).ok()].into_iter().flatten() {
        let s = s.to_string_lossy().trim_matches('/').to_string();
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// The set of `globs`, `None` when there is none (a walk for sockets alone).
fn glob_set(globs: &[String]) -> Result<Option<globset::GlobSet>, NsError> {
    if globs.is_empty() {
        return Ok(None);
    }
    crate::tools::exec::mask_set(globs)
        .map(Some)
        .map_err(|e| unlisted_error(std::io::Error::other(e.to_string())))
}

/// The walk cache's name for the deny globs `globs` under the read root `root` (2 or
/// more: 0 is none, 1 the repository's): a listing made under one root's globs is
/// never reused under another's.
fn set_id(root: &Path, globs: &[String]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    root.hash(&mut h);
    globs.hash(&mut h);
    h.finish().max(2)
}

/// A directory's `ctime` as a time.
fn changed_at(meta: &std::fs::Metadata) -> Option<SystemTime> {
    let secs = u64::try_from(meta.ctime()).ok()?;
    let nanos = u32::try_from(meta.ctime_nsec()).ok()?;
    Some(UNIX_EPOCH + Duration::new(secs, nanos))
}

/// Lists `dir`: its entries to mask and its subdirectories to walk.
fn list_dir(dir: &Path, rel_dir: &str, globs: &Globs<'_>, top: bool) -> Result<Option<Listed>, NsError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        // Neither listable nor searchable: no tool reaches inside either.
        Err(_) if std::fs::symlink_metadata(dir.join(".")).is_err() => return Ok(None),
        Err(e) => return Err(unlisted(dir, e)),
    };
    let mut listed = Listed::default();
    for e in entries {
        let e = e.map_err(|e| unlisted(dir, e))?;
        let kind = e.file_type().map_err(|e| unlisted(dir, e))?;
        let name = e.file_name();
        if top && (name == ".git" || name == crate::layout::STATE_DIR) {
            continue;
        }
        if kind.is_socket() {
            listed.masks.push((name, Mask::Socket));
            continue;
        }
        if kind.is_symlink() {
            if globs.any() {
                listed.links.push(name);
            }
            continue;
        }
        // A plain file matters only to deny globs: a walk for sockets alone (the
        // `.git` and read-root walks, most of the entries) allocates nothing for it.
        if !globs.any() && !kind.is_dir() {
            continue;
        }
        // The repository-relative name is what globs match (UTF-8: a name that is
        // not is matched by its lossy form).
        let matched = globs.any() && globs.is_match(&join_rel(rel_dir, &name.to_string_lossy()));
        if matched && kind.is_dir() {
            listed.masks.push((name, Mask::Dir));
        } else if matched && kind.is_file() {
            listed.masks.push((name, Mask::File));
        } else if kind.is_dir() {
            listed.subdirs.push(name);
        }
    }
    Ok(Some(listed))
}

fn join_rel(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

fn unlisted(dir: &Path, e: std::io::Error) -> NsError {
    unlisted_error(std::io::Error::new(
        e.kind(),
        format!(
            "cannot list {} to mask what `Read` deny rules match ({e})",
            dir.display()
        ),
    ))
}

fn unlisted_error(source: std::io::Error) -> NsError {
    NsError {
        piece: super::DENY_MASKS,
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A walk without a cache file, its clock `ahead` of now (every directory settled).
    fn walk(ahead: Option<u64>) -> Walk {
        Walk {
            cache: WalkCache::default(),
            updated: 0,
            listed: 0,
            seen: Default::default(),
            now: SystemTime::now() + Duration::from_secs(ahead.unwrap_or(0)),
            follow: Follow::default(),
        }
    }

    #[test]
    fn the_mask_walk_finds_deny_paths_and_sockets_everywhere_and_prunes_what_it_masks() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for d in ["a/b/c", "secrets/inner", ".git", ".runtime", "deep/1/2/3/4/5/6/7/8"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        for f in [
            ".env",
            "a/b/c/.env",
            "deep/1/2/3/4/5/6/7/8/.env",
            ".git/.env",
            ".runtime/.env",
            "secrets/inner/.env",
            "a/keep",
        ] {
            std::fs::write(root.join(f), "x").unwrap();
        }
        let _sock = std::os::unix::net::UnixListener::bind(root.join("a/b/s.sock")).unwrap();
        let set = crate::tools::exec::mask_set(&["**/.env".into(), "secrets".into()]).unwrap();
        let mut found: Vec<(String, Mask)> = walk(None)
            .find(root, Some(&set), true)
            .unwrap()
            .into_iter()
            .map(|(p, m)| (p.strip_prefix(root).unwrap().to_string_lossy().into_owned(), m))
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            found,
            [
                (".env".to_string(), Mask::File),
                ("a/b/c/.env".to_string(), Mask::File),
                ("a/b/s.sock".to_string(), Mask::Socket),
                ("deep/1/2/3/4/5/6/7/8/.env".to_string(), Mask::File),
                // Masked whole: nothing below it is listed.
                ("secrets".to_string(), Mask::Dir),
            ]
        );
        // Without deny globs only sockets are masked.
        let sockets = walk(None).find(root, None, true).unwrap();
        assert_eq!(sockets.len(), 1, "{sockets:?}");
    }

    #[test]
    fn a_cached_walk_lists_only_the_directories_that_changed_and_sees_a_new_socket() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        for d in ["a/b/c", "x/y", ".git/objects/ab", ".git/refs/heads"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::write(root.join("x/.env"), "x").unwrap();
        let set = crate::tools::exec::mask_set(&["**/.env".into()]).unwrap();
        let mut w = walk(Some(10));
        let first = w.find(root, Some(&set), true).unwrap();
        let git = w.find(&root.join(".git"), None, false).unwrap();
        assert_eq!((first.len(), git.len()), (1, 0));
        assert_eq!(w.listed, 11, "every directory is listed once");
        assert_eq!(w.updated, 11);
        let cached = w.cache.dirs.len();
        assert_eq!(cached, 11);

        // Nothing changed: nothing is listed, the same masks come back.
        w.listed = 0;
        assert_eq!(w.find(root, Some(&set), true).unwrap(), first);
        assert_eq!(w.find(&root.join(".git"), None, false).unwrap(), git);
        assert_eq!(w.listed, 0);

        // A socket made in `.git/objects/ab` and a new deny match in `a/b/c`: the two
        // directories are listed again (their ctime moved), and only they.
        let _sock = std::os::unix::net::UnixListener::bind(root.join(".git/objects/ab/d.sock")).unwrap();
        std::fs::write(root.join("a/b/c/.env"), "x").unwrap();
        w.listed = 0;
        let again = w.find(root, Some(&set), true).unwrap();
        let git = w.find(&root.join(".git"), None, false).unwrap();
        assert_eq!(w.listed, 2);
        assert_eq!(
            w.updated, 13,
            "two entries replaced: fewer than it takes to write the file again"
        );
        assert_eq!(git, vec![(root.join(".git/objects/ab/d.sock"), Mask::Socket)]);
        assert!(again.contains(&(root.join("a/b/c/.env"), Mask::File)), "{again:?}");

        // A directory replaced by another (a new inode) is listed, whatever its times.
        std::fs::remove_dir_all(root.join("x/y")).unwrap();
        std::fs::create_dir(root.join("x/y")).unwrap();
        std::os::unix::net::UnixListener::bind(root.join("x/y/s"))
            .map(drop)
            .unwrap();
        w.listed = 0;
        let found = w.find(root, Some(&set), true).unwrap();
        assert!(found.contains(&(root.join("x/y/s"), Mask::Socket)), "{found:?}");
    }

    #[test]
    fn a_directory_changed_moments_before_the_walk_is_never_cached() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("a")).unwrap();
        let mut w = walk(None);
        w.find(dir.path(), None, true).unwrap();
        assert!(w.cache.dirs.is_empty(), "{:?}", w.cache.dirs);
        w.listed = 0;
        w.find(dir.path(), None, true).unwrap();
        assert_eq!(w.listed, 2, "listed again");
    }

    #[test]
    fn the_cache_file_round_trips_and_other_globs_start_it_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(CACHE_FILE);
        let mut w = walk(Some(10));
        w.find(dir.path(), None, true).unwrap();
        w.cache.globs = vec!["**/.env".into()];
        w.cache.store(&file).unwrap();
        assert_eq!(WalkCache::load(&file, &["**/.env".into()]).dirs.len(), 1);
        assert!(WalkCache::load(&file, &["secrets".into()]).dirs.is_empty());
    }

    /// A deny rule that names a path through a person's link is masked through it
    /// (the mount lands on the target); a model's link in a writable directory is not
    /// followed, nor one out of what tools see; a loop ends.
    #[test]
    fn deny_globs_through_a_persons_link_are_masked_and_a_models_links_are_not_followed() {
        use std::os::unix::fs::symlink;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("repo");
        let outside = dir.path().join("outside");
        for d in ["data/secret", "reports", "deep/er"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        std::fs::create_dir_all(outside.join("secret")).unwrap();
        for f in ["data/secret/key", "data/notes", "outside/secret/key"] {
            let path = if f.starts_with("outside") {
                dir.path().join(f)
            } else {
                root.join(f)
            };
            std::fs::write(path, "x").unwrap();
        }
        symlink("data", root.join("alias")).unwrap();
        symlink("../../data", root.join("deep/er/inner")).unwrap();
        symlink(".", root.join("loop")).unwrap();
        symlink("../data", root.join("reports/model")).unwrap();
        symlink(&outside, root.join("away")).unwrap();
        symlink("data/notes", root.join("notes-link")).unwrap();
        let plan = NamespacePlan {
            root: root.clone(),
            read_dirs: Vec::new(),
            write_dirs: vec![root.join("reports")],
            masked: [
                "alias/secret/**",
                "deep/*/inner/notes",
                "loop/data/notes",
                "loop/**/never",
                "reports/model/**",
                "away/secret/**",
                "notes-link",
            ]
            .map(String::from)
            .to_vec(),
            network: false,
            write_bytes: 1 << 20,
            masks: super::super::namespaces::MaskSource::Walk,
            state_dir: None,
        };
        let (found, _) = walk_masks(&plan, None).unwrap();
        let mut found: Vec<(String, Mask)> = found
            .into_iter()
            .map(|(p, m)| (p.strip_prefix(&root).unwrap().to_string_lossy().into_owned(), m))
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            found,
            [
                ("alias/secret/key".to_string(), Mask::File),
                ("deep/er/inner/notes".to_string(), Mask::File),
                ("loop/data/notes".to_string(), Mask::File),
                ("notes-link".to_string(), Mask::File),
            ]
        );
    }

    #[test]
    fn a_path_that_is_not_utf8_goes_to_the_worker_whole() {
        use std::os::unix::ffi::OsStrExt;
        let path = PathBuf::from(std::ffi::OsStr::from_bytes(b"/r/reports/\xff/.env"));
        let line = crate::sandbox::namespaces::mask_line(Ok(vec![(path.clone(), Mask::File)]));
        let sent = serde_json::to_string(&line).unwrap();
        let read: crate::sandbox::namespaces::MaskLine = serde_json::from_str(&sent).unwrap();
        assert_eq!(read.unwrap(), vec![(path.as_os_str().as_bytes().to_vec(), Mask::File)]);
    }
}
