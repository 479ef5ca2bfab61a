//! What the model left under `reports/`, sorted into what the fire commits and what
//! it leaves out. The runtime commits the model's files (reports are runtime-owned
//! and the runtime is their only committer), but only plain data: regular files with
//! one name, no git metadata, within the `limits.output_*` caps, read once through
//! [`crate::beneath::read_regular`] and committed from those bytes. Everything else
//! stays in the work tree, uncommitted, and is named in an `output_rejected` card.
//!
//! "Left by the model" means new since the fire started, by change time (which no
//! unprivileged process can set back), so an earlier fire's leftovers are not
//! re-judged by every later one. Only directories that gained or lost an entry during
//! the fire have their entries examined; a file rewritten in place inside an older
//! directory is not seen (and not committed: the runtime only adds new files).

use crate::beneath::{self, NotRegular};
use crate::settings::Limits;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// The only directory whose new files a fire commits besides its own records.
const OUTPUT_DIR: &str = "reports";
/// The most directory entries one walk looks at in full (a model cannot make the
/// fire's end arbitrarily slow by leaving a million files); past it, new entries are
/// looked at by name for [`GIT_READS`] only.
const MAX_ENTRIES: usize = 10_000;

/// The names git reads from the work tree ([`crate::gitpath::GIT_READS`]): rejected
/// like every `.git` name, and removed from the work tree too ([`super::finish`]).
pub(crate) use crate::gitpath::{is_git_read, GIT_READS};

/// The sorted result.
#[derive(Debug, Default)]
pub(crate) struct Outputs {
    /// Files to commit, with the bytes read once.
    pub accepted: Vec<(String, Vec<u8>)>,
    /// Files left out, and why.
    pub rejected: Vec<(String, String)>,
    /// Committed files the work tree no longer holds as committed (rewritten or
    /// removed during the fire), with HEAD's blob: put back by the fire's end.
    pub put_back: Vec<(String, git2::Oid)>,
    /// Committed names that now hold an entry of the other kind (a file where HEAD has
    /// a directory, or the reverse): nothing at or below them is committed (git could
    /// not hold both: helper-92, every later fire's commit failed).
    pub replaced: Vec<String>,
    /// Of [`Outputs::replaced`], the committed directories a file (or link) now stands
    /// in for: their committed files are in [`Outputs::put_back`], to be put back once
    /// that file is gone (helper-102: `reports/<task>` made a file sent every later
    /// report of the task to `runs/`, and its committed reports stayed deleted).
    pub dirs_replaced: Vec<String>,
    /// Of [`Outputs::replaced`], the committed files a directory now stands in for:
    /// in [`Outputs::put_back`] too, put back once the tools' directory is gone
    /// (helper-104: a report replaced by a directory stayed deleted).
    pub files_replaced: Vec<String>,
}

/// Why a committed name that now holds an entry of the other kind is named.
pub(crate) const REPLACED: &str = "committed as a";

/// Why a file named like a run's report that the tools wrote is named.
pub(crate) const FORGED_REPORT: &str = "named like a run's report, which only the runtime writes: not committed";

/// Why a committed file the work tree holds with other bytes is named.
pub(crate) const REWRITTEN: &str = "already committed: the runtime only adds new files";

/// Why a committed file missing from the work tree is named.
pub(crate) const MISSING: &str = "committed, missing from the work tree";

/// One entry of a directory in HEAD: its name, its object, and whether it is a tree.
pub(crate) type HeadEntry = (String, git2::Oid, bool);

/// Sorts the files under `reports/` changed at or after `since` (seconds, nanos since
/// the epoch), skipping `own` (the runtime's own records) and judging files that
/// HEAD already holds (`in_head` gives HEAD's blob id) as rewrites, unless their bytes
/// are HEAD's: a record a sync checked out during the fire is not an output. A
/// committed file rewritten or removed (a directory that changed during the fire
/// lacks an entry `head_dir` lists for it) is named and put back
/// ([`Outputs::put_back`]): records are only ever added (helper-91: a later fire's
/// model rewrote an earlier run's report, silently).
pub(crate) fn collect(root: &Path, since: (i64, i64), own: &[String], known: &Known<'_>, limits: &Limits) -> Outputs {
    let Known { in_head, head_dir, .. } = *known;
    let (found, mut out) = walked(root, since, head_dir);
    let dir = match beneath::open_root(root) {
        Ok(d) => d,
        Err(e) => {
            out.rejected
                .extend(found.into_iter().map(|p| (p, format!("not read: {e}"))));
            return out;
        }
    };
    // A file HEAD holds with these very bytes is no output, whatever its name (a
    // resumed run looks back to its pause, to the second: the scaffold's
    // `reports/.gitkeep` committed in that second reads as new).
    let unchanged = |rel: &str| {
        in_head(rel).is_some_and(|blob| {
            beneath::read_regular(&dir, Path::new(rel), limits.output_file_bytes)
                .ok()
                .and_then(|b| git2::Oid::hash_object(git2::ObjectType::Blob, &b).ok())
                == Some(blob)
        })
    };
    out.rejected.retain(|(rel, _)| !unchanged(rel));
    let mut total = 0u64;
    let mut kinds = HeadKinds::default();
    for rel in found {
        if own.contains(&rel) || out.replaced.contains(&rel) {
            continue;
        }
        // Below a name HEAD holds as a file (replaced this fire or an earlier one):
        // git cannot commit both (helper-92, helper-94: every later commit failed).
        if let Some(p) = kinds.committed_file_above(&rel, in_head, head_dir) {
            let why = format!("under {p}, which HEAD holds as a file: not committed");
            out.rejected.push((rel, why));
            continue;
        }
        if let Some(blob) = in_head(&rel) {
            if unchanged(&rel) {
                continue;
            }
            out.rejected.push((rel.clone(), REWRITTEN.into()));
            out.put_back.push((rel, blob));
            continue;
        }
        if let Some(why) = known.runtime_only(&rel) {
            out.rejected.extend(why.map(|why| (rel, why)));
            continue;
        }
        take_new(&dir, rel, limits, &mut total, &mut out);
    }
    refuse_files_in_the_way_of_reports(&mut out, known);
    out
}

/// What [`collect`] knows beyond the work tree.
#[derive(Clone, Copy)]
pub(crate) struct Known<'a> {
    /// HEAD's blob at a path.
    pub in_head: &'a dyn Fn(&str) -> Option<git2::Oid>,
    /// HEAD's entries of a directory.
    pub head_dir: &'a dyn Fn(&str) -> Vec<HeadEntry>,
    /// Whether this fire's tools wrote the path (the write-back's list: a file they
    /// only touched counts too).
    pub by_tools: &'a dyn Fn(&str) -> bool,
    /// Whether a file of a run report's shape is that run's report: the state
    /// database knows the run, of that task, started that day (a fire of this
    /// machine made it there).
    pub genuine_report: &'a dyn Fn(&str) -> bool,
}

impl Known<'_> {
    /// Whether `task` is a task of HEAD (its prompt is committed).
    fn is_task(&self, task: &str) -> bool {
        crate::layout::valid_task_name(task)
            && (self.in_head)(&format!("{}/{task}.md", crate::layout::PROMPTS_DIR)).is_some()
    }

    /// The task of `rel` and where it lies when `rel` is one of HEAD's tasks' report
    /// directory, a day directory of it, or lies inside one: where only the runtime
    /// writes.
    fn task_reports_of<'r>(&self, rel: &'r str) -> Option<(&'r str, ReportsPlace)> {
        let parts: Vec<&str> = rel.splitn(4, '/').collect();
        let (task, place) = match parts.as_slice() {
            [OUTPUT_DIR, task] => (*task, ReportsPlace::TaskDir),
            [OUTPUT_DIR, task, day] if crate::records::is_day_name(day) => (*task, ReportsPlace::DayDir),
            [OUTPUT_DIR, task, day, _] if crate::records::is_day_name(day) => (*task, ReportsPlace::Inside),
            _ => return None,
        };
        self.is_task(task).then_some((task, place))
    }

    /// For a new file under the runtime's own reports, `Some`: skipped quietly
    /// (`None` inside: another fire's report, written while this one ran, is that
    /// fire's to commit) or refused, with why. Inside a day directory of a task's
    /// reports (`reports/<task>/<day>/`) only the runtime writes: a file the tools
    /// wrote under a run's report name that is not that run's report (no run of this
    /// machine, or of another task or day: helper-107) is a forgery, and anything else
    /// there (a directory at a report's name holding a forged `README.md`, a lookalike
    /// name) would be taken for a report, or take the name of the next one
    /// (helper-102, helper-104). A run's own report is kept whatever the tools did to
    /// it (helper-105: one they touched was removed as a forgery).
    fn runtime_only(&self, rel: &str) -> Option<Option<String>> {
        if crate::records::is_report_path(rel) {
            let forged = (self.by_tools)(rel) && !(self.genuine_report)(rel);
            return Some(forged.then(|| FORGED_REPORT.to_string()));
        }
        match self.task_reports_of(rel)? {
            (task, ReportsPlace::Inside) => Some(Some(format!(
                "inside a day directory of task `{task}`'s reports, where only the runtime writes: not committed"
            ))),
            _ => None,
        }
    }
}

/// Where under a task's reports a path lies ([`Known::task_reports_of`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum ReportsPlace {
    /// `reports/<task>`.
    TaskDir,
    /// `reports/<task>/<day>`.
    DayDir,
    /// Below `reports/<task>/<day>`.
    Inside,
}

/// The candidate files under `reports/` changed since `since`, sorted, and what the
/// walk already knows: the names that cannot be candidates, and the committed files
/// missing or replaced in the directories that changed.
fn walked(root: &Path, since: (i64, i64), head_dir: &dyn Fn(&str) -> Vec<HeadEntry>) -> (Vec<String>, Outputs) {
    let mut w = Walk::new(root, since);
    w.walk(OUTPUT_DIR);
    let Walk {
        mut found,
        rejected,
        changed_dirs,
        ..
    } = w;
    let mut out = Outputs {
        rejected,
        ..Outputs::default()
    };
    for dir in &changed_dirs {
        removed_from(root, dir, head_dir, &mut out);
    }
    found.sort();
    (found, out)
}

/// Moves the accepted files that stand where a task's reports go to the rejected.
fn refuse_files_in_the_way_of_reports(out: &mut Outputs, known: &Known<'_>) {
    for (rel, bytes) in std::mem::take(&mut out.accepted) {
        match in_the_way_of_reports(&rel, known) {
            Some(why) => out.rejected.push((rel, why)),
            None => out.accepted.push((rel, bytes)),
        }
    }
}

/// Why a new file at `rel` would stand where the reports of a task of HEAD go:
/// `reports/<task>` or `reports/<task>/<day>`. Committed, it would send every later
/// report of that task (or day) to `runs/`, in every clone (helper-102). A name no
/// task has yet is any file's.
fn in_the_way_of_reports(rel: &str, known: &Known<'_>) -> Option<String> {
    match known.task_reports_of(rel)? {
        (task, ReportsPlace::TaskDir | ReportsPlace::DayDir) => {
            Some(format!("a file where the reports of task `{task}` go: not committed"))
        }
        (_, ReportsPlace::Inside) => None,
    }
}

/// A new file `rel` read once and accepted, or rejected with why (past a cap, not a
/// regular file with one name); `total` counts the bytes accepted so far.
fn take_new(dir: &std::os::fd::OwnedFd, rel: String, limits: &Limits, total: &mut u64, out: &mut Outputs) {
    if out.accepted.len() >= limits.output_files {
        out.rejected
            .push((rel, format!("over limits.output_files ({})", limits.output_files)));
        return;
    }
    match beneath::read_regular(dir, Path::new(&rel), limits.output_file_bytes) {
        Ok(bytes) if *total + bytes.len() as u64 > limits.output_total_bytes => out.rejected.push((
            rel,
            format!("over limits.output_total_bytes ({})", limits.output_total_bytes),
        )),
        Ok(bytes) => {
            *total += bytes.len() as u64;
            out.accepted.push((rel, bytes));
        }
        Err(NotRegular::TooLarge(n)) => out.rejected.push((
            rel,
            format!(
                "{n} bytes, over limits.output_file_bytes ({})",
                limits.output_file_bytes
            ),
        )),
        Err(why) => out.rejected.push((rel, why.to_string())),
    }
}

/// Which directories of a path HEAD holds, and as what, looked up once each.
#[derive(Default)]
struct HeadKinds(std::collections::HashMap<String, Option<bool>>);

impl HeadKinds {
    /// The nearest directory above `rel` that HEAD holds as something other than a
    /// tree (a file, a link, a submodule), if any.
    fn committed_file_above(
        &mut self,
        rel: &str,
        in_head: &dyn Fn(&str) -> Option<git2::Oid>,
        head_dir: &dyn Fn(&str) -> Vec<HeadEntry>,
    ) -> Option<String> {
        let dirs: Vec<&str> = rel.match_indices('/').map(|(i, _)| &rel[..i]).collect();
        for dir in dirs {
            let tree = *self.0.entry(dir.to_string()).or_insert_with(|| {
                in_head(dir)?;
                let (parent, name) = dir.rsplit_once('/').unwrap_or(("", dir));
                head_dir(parent).into_iter().find(|e| e.0 == name).map(|e| e.2)
            });
            match tree {
                // Not in HEAD: nothing below it is either.
                None => return None,
                Some(false) => return Some(dir.to_string()),
                Some(true) => {}
            }
        }
        None
    }
}

fn changed_since(meta: &std::fs::Metadata, since: (i64, i64)) -> bool {
    (meta.ctime(), meta.ctime_nsec()) >= since
}

/// Why an entry is never a candidate, whatever it holds.
enum Skip {
    /// Not this fire's at all: said nowhere.
    Quietly,
    /// A name the commit cannot take: the name as shown, and why (a rejection when
    /// the entry is new since the fire began).
    Refused(String, String),
}

/// Whether the entry `name` (at repo-relative `path`) is skipped by its name alone.
fn skip(name: &str, path: &str) -> Option<Skip> {
    if name.chars().any(char::is_control) {
        return Some(Skip::Refused(
            path.escape_debug().to_string(),
            "the name holds control characters".into(),
        ));
    }
    // Another fire's report being written (its temporary name, renamed into place
    // in a moment): that fire's, never an output of this one.
    if crate::beneath::temp_target(name)
        .is_some_and(|(n, _)| n.strip_suffix(".md").is_some_and(crate::records::is_run_id))
    {
        return Some(Skip::Quietly);
    }
    // A tool worker's copy on its way back from the sandbox ([`crate::sandbox::writeback`]),
    // another fire's at work, or one a worker killed mid-copy left half written
    // (helper-96): never an output, and no card (helper-99: another fire's copy made
    // a healthy fire need attention).
    if crate::sandbox::writeback::is_temp_name(name) {
        return Some(Skip::Quietly);
    }
    // Names git refuses or reads as its own metadata on some file system (a
    // nested repository, attributes, submodules, in every spelling git knows):
    // one refused name would fail the commit of the run's own records, and an
    // fsck-checking remote would refuse every later push.
    if let Some(why) = crate::gitpath::refused_component(name) {
        return Some(Skip::Refused(path.to_string(), why));
    }
    // A name the commit would refuse (and so refuse the run's records with it).
    if name.contains("..") {
        return Some(Skip::Refused(
            path.to_string(),
            "a name with `..`, which the commit refuses".into(),
        ));
    }
    None
}

/// One walk of a write directory: the candidate files it found, how many entries it
/// looked at in full, what cannot be a candidate at all (and why), and the
/// directories that gained or lost an entry during the fire.
struct Walk<'a> {
    root: &'a Path,
    since: (i64, i64),
    found: Vec<String>,
    seen: usize,
    rejected: Vec<(String, String)>,
    changed_dirs: Vec<String>,
}

impl<'a> Walk<'a> {
    fn new(root: &'a Path, since: (i64, i64)) -> Walk<'a> {
        Walk {
            root,
            since,
            found: Vec::new(),
            seen: 0,
            rejected: Vec::new(),
            changed_dirs: Vec::new(),
        }
    }

    /// Collects candidate files under `rel`; names what cannot be a candidate at
    /// all. A directory whose change time is older than the fire gained or lost no
    /// entry since: only its subdirectories are visited (by the entry type `readdir`
    /// gives, without a `stat` per entry), so a day directory with a thousand old
    /// reports costs one directory read, and one that also holds no subdirectory
    /// ([`is_leaf`]) costs none: a box's years of day directories are each a `stat`.
    fn walk(&mut self, rel: &str) {
        let root = self.root;
        let Ok(dir_meta) = std::fs::symlink_metadata(root.join(rel)) else {
            return;
        };
        let dir_changed = changed_since(&dir_meta, self.since);
        if !dir_changed && is_leaf(&dir_meta) {
            return;
        }
        let Ok(entries) = read_dir_restoring(&root.join(rel), &dir_meta) else {
            return;
        };
        if dir_changed {
            self.changed_dirs.push(rel.to_string());
        }
        for entry in entries.flatten() {
            let name = entry.file_name();
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if !dir_changed {
                if let (true, Some(name)) = (is_dir, name.to_str()) {
                    self.walk(&format!("{rel}/{name}"));
                }
                continue;
            }
            self.seen += 1;
            if self.seen == MAX_ENTRIES + 1 {
                self.rejected.push((
                    format!("{rel}/"),
                    format!("more than {MAX_ENTRIES} new entries: the rest was looked at only for .gitattributes and .gitignore"),
                ));
            }
            if self.seen > MAX_ENTRIES {
                self.past_the_cap(rel, &name, is_dir);
                continue;
            }
            let Some(name) = name.to_str() else {
                self.rejected.push((
                    format!("{rel}/{}", name.to_string_lossy()),
                    "the name is not UTF-8".into(),
                ));
                continue;
            };
            self.entry(rel, name);
        }
    }

    /// One entry `name` of the changed directory `rel`.
    fn entry(&mut self, rel: &str, name: &str) {
        let path = format!("{rel}/{name}");
        let Ok(meta) = std::fs::symlink_metadata(self.root.join(&path)) else {
            return;
        };
        let new = changed_since(&meta, self.since);
        match skip(name, &path) {
            Some(Skip::Refused(shown, why)) => {
                if new {
                    self.rejected.push((shown, why));
                }
                return;
            }
            Some(Skip::Quietly) => return,
            None => {}
        }
        if meta.file_type().is_dir() {
            self.walk(&path);
        } else if new {
            self.found.push(path);
        }
    }

    /// An entry past [`MAX_ENTRIES`]: looked at by name for [`GIT_READS`] only (and
    /// walked into, when a directory, for those).
    fn past_the_cap(&mut self, rel: &str, name: &std::ffi::OsStr, is_dir: bool) {
        let Some(name) = name.to_str() else {
            return;
        };
        let path = format!("{rel}/{name}");
        if is_dir {
            self.walk(&path);
        } else if GIT_READS.contains(&name)
            && std::fs::symlink_metadata(self.root.join(&path)).is_ok_and(|m| changed_since(&m, self.since))
        {
            if let Some(Skip::Refused(shown, why)) = skip(name, &path) {
                self.rejected.push((shown, why));
            }
        }
    }
}

/// The committed entries of the changed directory `dir` (as `head_dir` lists HEAD's)
/// the work tree no longer holds: each named, and its files put back. A removed
/// directory's files are listed from HEAD below it.
fn removed_from(root: &Path, dir: &str, head_dir: &dyn Fn(&str) -> Vec<HeadEntry>, out: &mut Outputs) {
    let kind = |tree: bool| if tree { "directory" } else { "file" };
    for (name, id, is_tree) in head_dir(dir) {
        let rel = format!("{dir}/{name}");
        if let Ok(meta) = std::fs::symlink_metadata(root.join(&rel)) {
            if meta.is_dir() != is_tree {
                let why = format!(
                    "{REPLACED} {}, now a {}: nothing at or below it is committed",
                    kind(is_tree),
                    kind(meta.is_dir())
                );
                out.rejected.push((rel.clone(), why));
                out.replaced.push(rel.clone());
                if is_tree {
                    files_below(&rel, head_dir, &mut out.put_back);
                    out.dirs_replaced.push(rel);
                } else {
                    out.put_back.push((rel.clone(), id));
                    out.files_replaced.push(rel);
                }
            }
            continue;
        }
        out.rejected.push((rel.clone(), MISSING.into()));
        if !is_tree {
            out.put_back.push((rel, id));
            continue;
        }
        files_below(&rel, head_dir, &mut out.put_back);
    }
}

/// Every file HEAD holds below its directory `dir`, with its blob.
fn files_below(dir: &str, head_dir: &dyn Fn(&str) -> Vec<HeadEntry>, files: &mut Vec<(String, git2::Oid)>) {
    let mut below = vec![dir.to_string()];
    while let Some(d) = below.pop() {
        for (name, id, is_tree) in head_dir(&d) {
            match is_tree {
                true => below.push(format!("{d}/{name}")),
                false => files.push((format!("{d}/{name}"), id)),
            }
        }
    }
}

/// Whether the directory `meta` holds no subdirectory: its link count is 2 (its name
/// and its own `.`; each subdirectory's `..` adds one), as ext4, XFS and tmpfs count
/// them. A file system that does not count them (btrfs, some network ones) says 1,
/// which is not taken for a leaf: such a directory is listed. No process sets a link
/// count, and making or removing a subdirectory moves the parent's change time too.
fn is_leaf(meta: &std::fs::Metadata) -> bool {
    meta.is_dir() && meta.nlink() == 2
}

/// Reads the directory `path` (`meta`: its own metadata, not followed). One a tool
/// made unreadable (`chmod 000 reports`) gets its owner's rights back first: the
/// runtime and its tools run as one user, so the tool could take them and the
/// runtime can give them back; left so, the fire's outputs under it would go unseen,
/// uncommitted and on no card.
fn read_dir_restoring(path: &Path, meta: &std::fs::Metadata) -> std::io::Result<std::fs::ReadDir> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::read_dir(path) {
        Err(e)
            if e.kind() == std::io::ErrorKind::PermissionDenied
                && meta.file_type().is_dir()
                && meta.uid() == rustix::process::geteuid().as_raw() =>
        {
            let mode = (meta.mode() & 0o7777) | 0o700;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
            tracing::warn!(path = %path.display(), mode = format!("{mode:o}"), "a tool made this directory unreadable: its owner's rights are back");
            std::fs::read_dir(path)
        }
        other => other,
    }
}

/// An entry past [`MAX_ENTRIES`]: a new [`GIT_READS`] file is rejected (so removed),
/// a directory walked on; nothing else is looked at.
/// The new [`GIT_READS`] files under the write directories `roots` other than
/// `reports/` (which [`collect`] walks), rejected with why: no output is committed
/// from them, but git reads these there all the same.
pub(crate) fn git_read_files(root: &Path, roots: &[String], since: (i64, i64)) -> Vec<(String, String)> {
    let mut rejected = Vec::new();
    for r in roots.iter().filter(|r| !Path::new(r.as_str()).starts_with(OUTPUT_DIR)) {
        let mut w = Walk::new(root, since);
        w.walk(r);
        rejected.extend(w.rejected.into_iter().filter(|(p, _)| is_git_read(p)));
    }
    rejected
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn git_read_files_are_found_past_the_cap_and_in_every_write_root() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir_all(p.join("reports/big")).unwrap();
        for i in 0..3 * MAX_ENTRIES {
            std::fs::write(p.join(format!("reports/big/{i}")), "").unwrap();
        }
        // Ten directories among 30,000 files: past the cap, whatever order the
        // directory is read in, unless all ten come in its first third.
        for i in 0..10 {
            std::fs::create_dir_all(p.join(format!("reports/big/d{i}"))).unwrap();
            std::fs::write(p.join(format!("reports/big/d{i}/.gitignore")), "*\n").unwrap();
        }
        let out = collect(p, (0, 0), &[], &known(&|_| None, &|_| Vec::new()), &limits());
        let rejected: Vec<&str> = out.rejected.iter().map(|(r, _)| r.as_str()).collect();
        for i in 0..10 {
            let f = format!("reports/big/d{i}/.gitignore");
            assert!(rejected.contains(&f.as_str()), "{f} not found");
        }
        assert!(rejected.contains(&"reports/big/"), "the cap is named");
        std::fs::create_dir_all(p.join("out/x")).unwrap();
        std::fs::write(p.join("out/x/.gitattributes"), "* -diff\n").unwrap();
        std::fs::write(p.join("out/y.txt"), "x").unwrap();
        let others = git_read_files(p, &["reports".into(), "out".into()], (0, 0));
        let others: Vec<&str> = others.iter().map(|(r, _)| r.as_str()).collect();
        assert_eq!(others, ["out/x/.gitattributes"]);
    }

    /// A tool worker's temporary copy (another fire's at work, or one a worker killed
    /// mid-copy left half written) is never an output, nor named; a file merely like
    /// it is one.
    #[test]
    fn a_write_back_temporary_copy_is_never_an_output() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir_all(p.join("reports/out")).unwrap();
        std::fs::write(p.join("reports/out/.sandbox-copy-00ff00ff00ff00ff"), "half").unwrap();
        std::fs::write(p.join("reports/out/.sandbox-copy-notes"), "mine").unwrap();
        let out = collect(p, (0, 0), &[], &known(&|_| None, &|_| Vec::new()), &limits());
        let accepted: Vec<&str> = out.accepted.iter().map(|(r, _)| r.as_str()).collect();
        assert_eq!(accepted, ["reports/out/.sandbox-copy-notes"]);
        assert!(out.rejected.is_empty(), "{:?}", out.rejected);
    }

    /// Years of day directories are passed by a `stat` each; a file new since the
    /// fire is still found in a new directory under an old one, and in an old one.
    #[test]
    fn old_leaf_directories_are_passed_and_new_files_below_old_ones_found() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        for day in ["2025-01-01", "2025-01-02"] {
            std::fs::create_dir_all(p.join(format!("reports/t/{day}"))).unwrap();
            std::fs::write(p.join(format!("reports/t/{day}/old.md")), "old").unwrap();
        }
        let leaf = std::fs::symlink_metadata(p.join("reports/t/2025-01-01")).unwrap();
        let parent = std::fs::symlink_metadata(p.join("reports/t")).unwrap();
        assert!(!is_leaf(&parent), "a directory holding directories is never a leaf");
        assert!(is_leaf(&leaf) || leaf.nlink() == 1, "{}", leaf.nlink());
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mark = p.join("mark");
        std::fs::write(&mark, "").unwrap();
        let m = std::fs::metadata(&mark).unwrap();
        let since = (m.ctime(), m.ctime_nsec());
        std::fs::create_dir(p.join("reports/t/2025-01-01/sub")).unwrap();
        std::fs::write(p.join("reports/t/2025-01-01/sub/new.md"), "new").unwrap();
        std::fs::write(p.join("reports/t/2025-01-02/new.md"), "new").unwrap();
        let out = collect(p, since, &[], &known(&|_| None, &|_| Vec::new()), &limits());
        let accepted: Vec<&str> = out.accepted.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(
            accepted,
            ["reports/t/2025-01-01/sub/new.md", "reports/t/2025-01-02/new.md"]
        );
    }

    /// What the tests' fires know: HEAD as given, no tools' list, no known run.
    fn known<'a>(
        in_head: &'a dyn Fn(&str) -> Option<git2::Oid>,
        head_dir: &'a dyn Fn(&str) -> Vec<HeadEntry>,
    ) -> Known<'a> {
        Known {
            in_head,
            head_dir,
            by_tools: &|_| false,
            genuine_report: &|_| false,
        }
    }

    fn limits() -> Limits {
        Limits {
            output_file_bytes: 10,
            output_total_bytes: 10,
            output_files: 3,
            ..Limits::default()
        }
    }

    #[test]
    fn only_new_small_regular_files_with_one_name_are_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir_all(p.join("reports/t")).unwrap();
        std::fs::create_dir_all(p.join("reports/sub/.git")).unwrap();
        std::fs::create_dir_all(p.join("prompts")).unwrap();
        std::fs::write(p.join("prompts/p.md"), "x").unwrap();
        std::fs::write(p.join("reports/a.md"), "aaaa").unwrap();
        std::fs::write(p.join("reports/b.md"), "bbbbbbbb").unwrap();
        std::fs::write(p.join("reports/big.md"), "x".repeat(11)).unwrap();
        std::fs::write(p.join("reports/t/own.md"), "runtime").unwrap();
        std::fs::write(p.join("reports/old.md"), "committed").unwrap();
        std::fs::write(p.join("reports/.gitattributes"), "* filter=x").unwrap();
        std::fs::write(p.join("reports/git~1"), "x").unwrap();
        std::fs::write(p.join("reports/.git."), "x").unwrap();
        std::fs::write(p.join("reports/a..b"), "x").unwrap();
        std::os::unix::fs::symlink("../prompts/p.md", p.join("reports/link")).unwrap();
        std::fs::hard_link(p.join("prompts/p.md"), p.join("reports/hard")).unwrap();
        let out = collect(
            p,
            (0, 0),
            &["reports/t/own.md".to_string()],
            &known(&|f| (f == "reports/old.md").then_some(git2::Oid::ZERO_SHA1), &|_| {
                Vec::new()
            }),
            &limits(),
        );
        let accepted: Vec<&str> = out.accepted.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(accepted, vec!["reports/a.md"]);
        let rejected: Vec<&str> = out.rejected.iter().map(|(p, _)| p.as_str()).collect();
        for r in [
            "reports/b.md",
            "reports/big.md",
            "reports/old.md",
            "reports/.gitattributes",
            "reports/git~1",
            "reports/.git.",
            "reports/a..b",
            "reports/sub/.git",
            "reports/link",
            "reports/hard",
        ] {
            assert!(rejected.contains(&r), "{r} not rejected: {:?}", out.rejected);
        }
        let why = |f: &str| {
            out.rejected
                .iter()
                .find(|(p, _)| p == f)
                .map(|(_, w)| w.clone())
                .unwrap()
        };
        assert!(why("reports/b.md").contains("output_total_bytes"));
        assert!(why("reports/big.md").contains("output_file_bytes"));
        assert!(why("reports/link").contains("symlink"));
        assert!(why("reports/hard").contains("hard link"));
        // Nothing older than the fire is judged at all.
        let later = collect(p, (i64::MAX, 0), &[], &known(&|_| None, &|_| Vec::new()), &limits());
        assert!(later.accepted.is_empty() && later.rejected.is_empty(), "{later:?}");
    }

    /// A committed report rewritten, and committed files removed (one alone, one
    /// with its whole directory), are named and put back; another run's report is
    /// left to that run.
    #[test]
    fn committed_files_rewritten_or_removed_are_named_and_put_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        let day = "reports/t/2026-12-01";
        std::fs::create_dir_all(p.join(day)).unwrap();
        let run = |n: u8| format!("{day}/20261201T0{n}0000Z-0000000{n}.md");
        std::fs::write(p.join(run(1)), "forged").unwrap();
        std::fs::write(p.join(run(2)), "another fire's report").unwrap();
        let blob = |n: u8| git2::Oid::from_bytes(&[n; 20]).unwrap();
        let committed = |rel: &str| (rel == run(1)).then_some(blob(1));
        let head_dir = |d: &str| -> Vec<HeadEntry> {
            match d {
                "reports/t/2026-12-01" => vec![
                    (run(1).rsplit('/').next().unwrap().to_string(), blob(1), false),
                    ("20261201T030000Z-00000003.md".into(), blob(3), false),
                ],
                "reports/t" => vec![
                    ("2026-12-01".into(), blob(9), true),
                    ("2026-11-30".into(), blob(8), true),
                ],
                "reports/t/2026-11-30" => vec![("old.md".into(), blob(4), false)],
                _ => Vec::new(),
            }
        };
        let out = collect(p, (0, 0), &[], &known(&committed, &head_dir), &limits());
        assert!(out.accepted.is_empty(), "{out:?}");
        let mut put_back = out.put_back.clone();
        put_back.sort();
        let mut expected = vec![
            (run(1), blob(1)),
            (format!("{day}/20261201T030000Z-00000003.md"), blob(3)),
            ("reports/t/2026-11-30/old.md".to_string(), blob(4)),
        ];
        expected.sort();
        assert_eq!(put_back, expected);
        let rejected: Vec<&str> = out.rejected.iter().map(|(p, _)| p.as_str()).collect();
        for r in [
            run(1).as_str(),
            "reports/t/2026-11-30",
            &format!("{day}/20261201T030000Z-00000003.md"),
        ] {
            assert!(rejected.contains(&r), "{r}: {:?}", out.rejected);
        }
        assert!(!rejected.contains(&run(2).as_str()), "{:?}", out.rejected);
    }

    /// A file written below a name HEAD holds as a file (a directory an earlier fire's
    /// model made in its place) is not committed: git could not hold both.
    #[test]
    fn nothing_below_a_committed_file_is_committed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::create_dir_all(p.join("reports/t/x.md")).unwrap();
        std::fs::write(p.join("reports/t/x.md/new.md"), "new").unwrap();
        let blob = git2::Oid::from_bytes(&[1; 20]).unwrap();
        let in_head = |rel: &str| matches!(rel, "reports" | "reports/t" | "reports/t/x.md").then_some(blob);
        let head_dir = |d: &str| -> Vec<HeadEntry> {
            match d {
                "" => vec![("reports".into(), blob, true)],
                "reports" => vec![("t".into(), blob, true)],
                "reports/t" => vec![("x.md".into(), blob, false)],
                _ => Vec::new(),
            }
        };
        let out = collect(p, (0, 0), &[], &known(&in_head, &head_dir), &limits());
        assert!(out.accepted.is_empty(), "{out:?}");
        assert!(
            out.rejected
                .iter()
                .any(|(r, why)| r == "reports/t/x.md/new.md" && why.contains("which HEAD holds as a file")),
            "{out:?}"
        );
    }
}
