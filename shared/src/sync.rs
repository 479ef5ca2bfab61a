//! The cron box (DESIGN.md section 8, "Sync"): with a `sync` section, a fire first
//! fetches the branch and `refs/builder/*` from the remote ([`before_fire`]) and moves
//! to the remote tip only when the tip's tree of builder-owned paths is approved by
//! the rule the box already runs under, judged as every commit is ([`Trust`]: by the
//! allowed-signers list of the last approved tree before it, never the tip's own), or
//! is the tree it has (the remote brought records only); otherwise it fires on what it has, and the caller writes one
//! `unreviewed_changes` card per unapproved tree. After its commit the fire pushes
//! ([`push_after`]); a push the remote rejects because it moved is retried on the new
//! tip, the records commit rebuilt onto it (records are new paths: no conflict), at
//! most `sync.push_attempts` times, never forced.
//!
//! Receipts keep pointing at commits that exist: a pushed commit is never rewritten.
//! The one unpushed commit of this fire is rebuilt linearly (its receipt names the
//! commit it fired on, which the remote has); several unpushed commits (fires while
//! the remote tip was unapproved, whose receipts name each other) are joined to the
//! new tip by a merge commit, so every one of them stays in the branch's history.
//!
//! Transports: the workspace's `git2` is built without default features (no ssh or
//! https), so a local remote (a path, `file://`) is fetched and pushed by libgit2, and
//! a network remote (`ssh://`, scp-like `host:path`, `https://`, `http://`, `git://`)
//! through the `git` command line, as cargo's `net.git-fetch-with-cli` does: the
//! operator's ssh keys and agent, `known_hosts`, credential helpers and proxies apply
//! unchanged. Both keep the same contract: the fetch takes the branch and
//! `refs/builder/*`, and the push moves the remote branch by compare-and-swap against
//! the tip this fire built on (`--force-with-lease=<branch>:<expected>`: a laptop
//! push that landed meanwhile makes it fail, never get overwritten). A local remote
//! needs no network: the runtime's own sandbox may write that repository
//! ([`sandbox_dirs`]) and connect nowhere for it; a network remote gives the sandbox
//! its one TCP port ([`sandbox_ports`]: the URL's port, else 22, 443, 80 or 9418) and
//! no directory. The `git` child inherits that sandbox (it reads anything, writes only
//! the repository's git directories) and gets a scrubbed environment.

use crate::review::signing::ApprovalRule;
use crate::review::trust::Trust;
use crate::settings::SyncSettings;
use git2::{Oid, Repository};
use std::path::PathBuf;

/// A sync step that failed: which step, against which remote and branch, and why.
#[derive(Debug, thiserror::Error)]
#[error("sync {step} with {remote}/{branch}: {message}")]
pub struct SyncError {
    pub step: &'static str,
    pub remote: String,
    pub branch: String,
    pub message: String,
}

/// What [`before_fire`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Before {
    /// The local branch is the remote's.
    UpToDate,
    /// The local branch has runtime commits the remote lacks; the push sends them.
    Ahead,
    /// The branch moved to (or was joined with) the remote tip: `from` -> `to`.
    Moved { from: Oid, to: Oid },
    /// The remote tip's builder tree has no approval that counts: the fire runs on
    /// what it has, and neither moves its branch nor pushes.
    Unapproved { tip: Oid, tree: Oid },
    /// The remote tip's tree tracks a path under `.runtime/`, the runtime's private
    /// state (its state database, the walk memo of the two-key check): checking it
    /// out would let whoever pushed it write that state, so the fire runs on what it
    /// has, and neither moves its branch nor pushes.
    TracksState { tip: Oid },
}

/// What [`push_after`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pushed {
    /// The remote branch is the local branch; `attempts` pushes it took.
    Pushed { attempts: u32, head: Oid },
    /// Not pushed now: why (the next fire's [`before_fire`] joins and pushes).
    Deferred(String),
}

struct Ctx<'a> {
    repo: &'a Repository,
    sync: &'a SyncSettings,
}

impl Ctx<'_> {
    fn err(&self, step: &'static str, message: impl Into<String>) -> SyncError {
        SyncError {
            step,
            remote: self.sync.remote.clone(),
            branch: self.sync.branch.clone(),
            message: message.into(),
        }
    }

    fn git(&self, step: &'static str) -> impl Fn(git2::Error) -> SyncError + '_ {
        move |e| self.err(step, e.message().to_string())
    }

    fn local_ref(&self) -> String {
        format!("refs/heads/{}", self.sync.branch)
    }

    fn tracking_ref(&self) -> String {
        format!("refs/remotes/{}/{}", self.sync.remote, self.sync.branch)
    }

    /// How this fire reaches the remote: its directory (local) or its URL and port
    /// (through the `git` command line); an error for a remote it cannot reach.
    fn transport(&self) -> Result<Transport, SyncError> {
        let remote = self.repo.find_remote(&self.sync.remote).map_err(|e| {
            self.err(
                "setup",
                format!("no remote `{}` in this repository ({})", self.sync.remote, e.message()),
            )
        })?;
        let url = remote.url().unwrap_or("").to_string();
        if let Some(dir) = local_path(&url, self.repo) {
            return Ok(Transport::Local(dir));
        }
        let mut ports = Vec::new();
        for u in std::iter::once(url.as_str()).chain(remote.pushurl().ok().flatten()) {
            let port = network_port(u).ok_or_else(|| {
                self.err(
                    "setup",
                    format!(
                        "remote url `{u}` is neither a local repository nor an ssh, https, http or git url the runtime can sync with"
                    ),
                )
            })?;
            ports.push(port);
        }
        ports.sort_unstable();
        ports.dedup();
        Ok(Transport::Cli { ports })
    }

    /// Runs `git` on this repository's git directory with `args` (a scrubbed
    /// environment: what git, ssh and credential helpers need, no API keys, none of
    /// git's checkout variables; never a prompt).
    fn cli(&self, step: &'static str, args: &[&str]) -> Result<std::process::Output, SyncError> {
        let mut git = std::process::Command::new("git");
        git.arg("--git-dir")
            .arg(self.repo.path())
            .args(args)
            .env_clear()
            .env("GIT_TERMINAL_PROMPT", "0")
            .stdin(std::process::Stdio::null());
        let passed = crate::env::PASSTHROUGH_ENV.iter().chain(CLI_ENV);
        for key in passed {
            if let Some(v) = std::env::var_os(key) {
                git.env(key, v);
            }
        }
        output_within(&mut git, CLI_TIMEOUT).map_err(|e| self.err(step, format!("`git` for a network remote: {e}")))
    }

    /// Fetches `specs` through the `git` command line.
    fn cli_fetch(&self, specs: &[String]) -> Result<(), SyncError> {
        let mut args = vec![
            "fetch",
            "--quiet",
            "--no-tags",
            "--no-write-fetch-head",
            &self.sync.remote,
        ];
        args.extend(specs.iter().map(String::as_str));
        let out = self.cli("fetch", &args)?;
        if out.status.success() {
            return Ok(());
        }
        Err(self.err(
            "fetch",
            format!(
                "git fetch: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ))
    }

    /// One push through the `git` command line: a compare-and-swap of the remote
    /// branch from `expected` (none: it must not exist) to `local`. `Ok(false)` when
    /// the remote moved (the lease failed, or it is not a fast-forward) or its ref
    /// was locked by another push.
    fn cli_push(&self, local: Oid, expected: Option<Oid>) -> Result<bool, SyncError> {
        let branch = self.local_ref();
        // An empty expected value: the branch must not exist yet.
        let expected = expected.map(|e| e.to_string()).unwrap_or_default();
        let lease = format!("--force-with-lease={branch}:{expected}");
        let spec = format!("{local}:{branch}");
        // `--no-verify`: a pre-push hook is the engineers' gate (the libgit2 path runs
        // none either); the runtime pushes only its records commits, checked above.
        let out = self.cli(
            "push",
            &["push", "--porcelain", "--no-verify", &lease, &self.sync.remote, &spec],
        )?;
        if out.status.success() {
            return Ok(true);
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let rejected = stdout.lines().filter(|l| l.starts_with('!')).any(|l| {
            ["stale info", "fetch first", "non-fast-forward", "lock"]
                .iter()
                .any(|why| l.contains(why))
        });
        if rejected {
            return Ok(false);
        }
        Err(self.err(
            "push",
            format!(
                "git push: {}: {} {}",
                out.status,
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        ))
    }

    fn fetch(&self, with_builder: bool) -> Result<Oid, SyncError> {
        let transport = self.transport()?;
        let mut specs = vec![format!("+{}:{}", self.local_ref(), self.tracking_ref())];
        if with_builder {
            specs.push(crate::review::BUILDER_REFSPEC.to_string());
        }
        match transport {
            Transport::Local(_) => {
                let mut remote = self.repo.find_remote(&self.sync.remote).map_err(self.git("fetch"))?;
                remote.fetch(&specs, None, None).map_err(self.git("fetch"))?;
            }
            Transport::Cli { .. } => self.cli_fetch(&specs)?,
        }
        self.repo.refname_to_id(&self.tracking_ref()).map_err(|e| {
            self.err(
                "fetch",
                format!("the remote has no branch `{}` ({})", self.sync.branch, e.message()),
            )
        })
    }

    /// The local branch tip; HEAD must be that branch.
    fn local_tip(&self) -> Result<Oid, SyncError> {
        let head = self.repo.head().map_err(self.git("setup"))?;
        if head.name().ok() != Some(self.local_ref().as_str()) {
            return Err(self.err(
                "setup",
                format!(
                    "HEAD is {}, not the sync branch {}: check out `{}` on the cron box",
                    head.shorthand().unwrap_or("detached"),
                    self.local_ref(),
                    self.sync.branch
                ),
            ));
        }
        head.target().ok_or_else(|| self.err("setup", "HEAD names no commit"))
    }

    /// Commits on `local` and not on `remote`, newest first; each must be a runtime
    /// commit that only adds records (else the box has work of its own: an error).
    fn runtime_only(&self, local: Oid, remote: Oid, runtime_email: &str) -> Result<Vec<Oid>, SyncError> {
        let git = self.git("join");
        let mut walk = self.repo.revwalk().map_err(&git)?;
        walk.push(local).map_err(&git)?;
        walk.hide(remote).map_err(&git)?;
        let mut out = Vec::new();
        for oid in walk {
            let oid = oid.map_err(&git)?;
            let c = self.repo.find_commit(oid).map_err(&git)?;
            let ours = c
                .author()
                .email()
                .is_ok_and(|e| crate::review::same_person(e, runtime_email));
            let parent_tree = match c.parent(0) {
                Ok(p) => Some(p.tree().map_err(&git)?),
                Err(_) => None,
            };
            let diff = self
                .repo
                .diff_tree_to_tree(parent_tree.as_ref(), Some(&c.tree().map_err(&git)?), None)
                .map_err(&git)?;
            let records_only = diff.deltas().all(|d| {
                d.new_file()
                    .path()
                    .is_some_and(|p| is_record_path(&p.to_string_lossy()))
            });
            if !ours || !records_only {
                return Err(self.err(
                    "join",
                    format!(
                        "local commit {} is not a runtime records commit; the cron box's branch must hold only what the runtime commits (move that work to the laptop)",
                        &oid.to_string()[..12]
                    ),
                ));
            }
            out.push(oid);
        }
        Ok(out)
    }

    /// The tree of `onto` with the records of `local` added (a merge that cannot
    /// conflict: records are new paths).
    fn joined_tree(&self, onto: Oid, local: Oid) -> Result<Oid, SyncError> {
        let git = self.git("join");
        let a = self.repo.find_commit(onto).map_err(&git)?;
        let b = self.repo.find_commit(local).map_err(&git)?;
        let mut index = self.repo.merge_commits(&a, &b, None).map_err(&git)?;
        if index.has_conflicts() {
            return Err(self.err("join", "the records conflict with the remote's commits"));
        }
        index.write_tree_to(self.repo).map_err(&git)
    }

    /// Makes the commit that puts `local`'s unpushed records on `onto`: the one
    /// unpushed commit rebuilt with `onto` as its parent, or a merge of several.
    fn rebuild(&self, onto: Oid, local: Oid, unpushed: &[Oid]) -> Result<Oid, SyncError> {
        let git = self.git("join");
        let tree = self.repo.find_tree(self.joined_tree(onto, local)?).map_err(&git)?;
        let onto_c = self.repo.find_commit(onto).map_err(&git)?;
        let local_c = self.repo.find_commit(local).map_err(&git)?;
        let (author, committer) = (local_c.author(), local_c.committer());
        if let [only] = unpushed {
            let c = self.repo.find_commit(*only).map_err(&git)?;
            let msg = c.message().unwrap_or("runtime records");
            return self
                .repo
                .commit(None, &author, &committer, msg, &tree, &[&onto_c])
                .map_err(&git);
        }
        let msg = format!(
            "runtime: records of {} fire(s) joined onto {}/{}\n",
            unpushed.len(),
            self.sync.remote,
            self.sync.branch
        );
        self.repo
            .commit(None, &author, &committer, &msg, &tree, &[&onto_c, &local_c])
            .map_err(&git)
    }

    /// Moves the branch from `from` to `to` (compare-and-swap) after updating the
    /// index and work tree; `only` limits the work-tree update to those paths.
    fn move_to(&self, from: Oid, to: Oid, only: Option<&[String]>) -> Result<(), SyncError> {
        let git = self.git("checkout");
        let tree = self.repo.find_commit(to).and_then(|c| c.tree()).map_err(&git)?;
        let mut co = git2::build::CheckoutBuilder::new();
        match only {
            Some(paths) => {
                co.force().update_index(true).disable_pathspec_match(true);
                for p in paths {
                    co.path(p);
                }
                if !paths.is_empty() {
                    self.repo.checkout_tree(tree.as_object(), Some(&mut co)).map_err(&git)?;
                }
                // The index must name the new tree's records exactly (paths the
                // checkout did not touch are the same in both trees).
                let mut index = self.repo.index().map_err(&git)?;
                index.read_tree(&tree).map_err(&git)?;
                index.write().map_err(&git)?;
            }
            None => {
                co.safe();
                self.repo.checkout_tree(tree.as_object(), Some(&mut co)).map_err(&git)?;
            }
        }
        self.repo
            .reference_matching(
                &self.local_ref(),
                to,
                true,
                from,
                &format!("runtime sync: {}/{}", self.sync.remote, self.sync.branch),
            )
            .map_err(&git)?;
        Ok(())
    }

    /// One push of the branch: `Ok(true)` when the remote took it, `Ok(false)` when it
    /// moved since the last fetch (or another push held its lock). libgit2's local
    /// transport moves the remote's ref without comparing it to the value it read (a
    /// push landing in between would be overwritten), so the objects travel by a push
    /// to a ref of this process's own, and the branch then moves on the remote by a
    /// compare-and-swap against the tip this fire built on, under git's ref lock.
    fn push_once(&self, local: Oid) -> Result<bool, SyncError> {
        let git = self.git("push");
        let expected = self.repo.refname_to_id(&self.tracking_ref()).ok();
        if let Some(e) = expected {
            if e != local && !self.repo.graph_descendant_of(local, e).map_err(&git)? {
                return Ok(false);
            }
        }
        let dir = match self.transport()? {
            Transport::Local(dir) => dir,
            Transport::Cli { .. } => return self.cli_push(local, expected),
        };
        let target = Repository::open(dir).map_err(&git)?;
        let carrier = format!("refs/runtime-sync/{}", std::process::id());
        let mut remote = self.repo.find_remote(&self.sync.remote).map_err(&git)?;
        let spec = format!("+{}:{carrier}", self.local_ref());
        remote.push(&[spec.as_str()], None).map_err(&git)?;
        let msg = format!("push by the runtime ({}/{})", self.sync.remote, self.sync.branch);
        let moved = match expected {
            Some(e) => target
                .reference_matching(&self.local_ref(), local, true, e, &msg)
                .map(|_| ()),
            None => target.reference(&self.local_ref(), local, false, &msg).map(|_| ()),
        };
        if let Ok(mut r) = target.find_reference(&carrier) {
            let _ = r.delete();
        }
        match moved {
            Ok(()) => Ok(true),
            Err(e)
                if matches!(
                    e.code(),
                    git2::ErrorCode::Modified | git2::ErrorCode::Locked | git2::ErrorCode::Exists
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(self.err("push", e.message().to_string())),
        }
    }
}

/// How a fire reaches its remote.
enum Transport {
    /// A local repository, through libgit2.
    Local(PathBuf),
    /// A network remote, through the `git` command line: the TCP ports of its fetch
    /// and push URLs.
    Cli { ports: Vec<u16> },
}

/// What the `git` child may see of the runtime's environment besides
/// [`crate::env::PASSTHROUGH_ENV`]: where the operator's config, keys, agent,
/// certificates and proxies are, and the operator's choice of ssh command.
const CLI_ENV: &[&str] = &[
    "HOME",
    "USER",
    "XDG_CONFIG_HOME",
    "SSH_AUTH_SOCK",
    "GIT_SSH",
    "GIT_SSH_COMMAND",
    "GIT_CONFIG_GLOBAL",
    "GIT_CONFIG_NOSYSTEM",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "GIT_SSL_CAINFO",
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "NO_PROXY",
    "no_proxy",
];

/// The TCP port of a network remote URL: the URL's own, else the scheme's (ssh 22,
/// https 443, http 80, git 9418); scp-like `[user@]host:path` is ssh. `None` for a
/// URL that is not one of those.
fn network_port(url: &str) -> Option<u16> {
    if !url.contains("://") {
        // scp-like: a colon before any slash, and a host before it.
        let colon = url.find(':')?;
        let slash = url.find('/').unwrap_or(usize::MAX);
        return (colon > 0 && colon < slash).then_some(22);
    }
    let parsed = url::Url::parse(url).ok()?;
    parsed.host_str().filter(|h| !h.is_empty())?;
    let default = match parsed.scheme() {
        "ssh" | "git+ssh" | "ssh+git" => 22,
        "https" => 443,
        "http" => 80,
        "git" => 9418,
        _ => return None,
    };
    Some(parsed.port().unwrap_or(default))
}

/// `url` as a directory when it names a local repository (a path or `file://`).
fn local_path(url: &str, repo: &Repository) -> Option<PathBuf> {
    let path = if let Some(p) = url.strip_prefix("file://") {
        PathBuf::from(p)
    } else if url.contains("://") || (url.contains(':') && !url.starts_with('/') && !url.starts_with('.')) {
        return None; // ssh://, https://, git://, or scp-like host:path
    } else {
        PathBuf::from(url)
    };
    let base = repo.workdir().unwrap_or(repo.path());
    let full = if path.is_absolute() { path } else { base.join(path) };
    std::fs::canonicalize(full).ok()
}

/// A path the runtime commits: under one of the runtime directories.
fn is_record_path(p: &str) -> bool {
    crate::layout::RUNTIME_DIRS
        .iter()
        .any(|d| p.strip_prefix(d).is_some_and(|r| r.starts_with('/')))
}

/// What the runtime's own sandbox must also be allowed to write for `sync`: the
/// local remote's directory (none for a network remote, when there is no sync, or
/// when the remote cannot be resolved: the push then fails with a named error, not a
/// wider sandbox).
pub fn sandbox_dirs(repo: &Repository, sync: Option<&SyncSettings>) -> Vec<PathBuf> {
    let Some(sync) = sync else { return Vec::new() };
    match (Ctx { repo, sync }).transport() {
        Ok(Transport::Local(dir)) => vec![dir],
        _ => Vec::new(),
    }
}

/// The TCP ports the runtime's own sandbox must also be allowed to connect to for
/// `sync`: a network remote's (its fetch and push URLs'), none for a local remote.
pub fn sandbox_ports(repo: &Repository, sync: Option<&SyncSettings>) -> Vec<u16> {
    let Some(sync) = sync else { return Vec::new() };
    match (Ctx { repo, sync }).transport() {
        Ok(Transport::Cli { ports }) => ports,
        _ => Vec::new(),
    }
}

/// Before a fire: fetch, then fast-forward (or join the runtime's unpushed records)
/// to the remote tip when it tracks nothing under `.runtime/` and its builder tree
/// is approved under `rule` (judged by
/// [`Trust`] over the fetched approvals, remembering its walk in the walk memo under
/// `memo`, the repository root), or is the
/// tree the box has. Runs before the sandbox (it may update builder-owned paths).
pub fn before_fire(
    repo: &Repository,
    sync: &SyncSettings,
    rule: &ApprovalRule,
    memo: Option<&std::path::Path>,
) -> Result<Before, SyncError> {
    let cx = Ctx { repo, sync };
    let local = cx.local_tip()?;
    let remote = cx.fetch(true)?;
    let git = cx.git("fetch");
    if remote == local {
        return Ok(Before::UpToDate);
    }
    if repo.graph_descendant_of(local, remote).map_err(&git)? {
        return Ok(Before::Ahead);
    }
    let tip_commit = repo.find_commit(remote).map_err(&git)?;
    if tip_commit
        .tree()
        .map_err(&git)?
        .get_name(crate::layout::STATE_DIR)
        .is_some()
    {
        return Ok(Before::TracksState { tip: remote });
    }
    let tree_of = |c: Oid| crate::review::builder_tree_of_commit(repo, c).map_err(&git);
    let tip_tree = tree_of(remote)?;
    let approved = tip_tree == tree_of(local)?
        || Trust::new(repo, rule.clone())
            .map_err(&git)?
            .remembering(memo)
            .incoming(remote, local)
            .map_err(&git)?
            .approval
            .is_some();
    if !approved {
        return Ok(Before::Unapproved {
            tip: remote,
            tree: tip_tree,
        });
    }
    let to = if repo.graph_descendant_of(remote, local).map_err(&git)? {
        remote
    } else {
        let unpushed = cx.runtime_only(local, remote, &rule.runtime_email)?;
        cx.rebuild(remote, local, &unpushed)?
    };
    cx.move_to(local, to, None)?;
    Ok(Before::Moved { from: local, to })
}

/// After a fire's commit: push the branch; when the remote moved meanwhile, fetch,
/// rebuild the unpushed records onto its tip and push again, at most
/// `sync.push_attempts` times. Runs inside the runtime's sandbox, which may write the
/// records directories but not builder-owned paths: when the remote's new commits
/// change anything but records, the push is deferred to the next fire (whose
/// [`before_fire`] checks their approval and joins them outside the sandbox).
pub fn push_after(repo: &Repository, sync: &SyncSettings, runtime_email: &str) -> Result<Pushed, SyncError> {
    let cx = Ctx { repo, sync };
    let attempts = sync.push_attempts.max(1);
    for attempt in 1..=attempts {
        let local = cx.local_tip()?;
        if cx.push_once(local)? {
            let _ = repo.reference(&cx.tracking_ref(), local, true, "runtime sync: pushed");
            return Ok(Pushed::Pushed {
                attempts: attempt,
                head: local,
            });
        }
        if attempt == attempts {
            break;
        }
        let remote = cx.fetch(false)?;
        let git = cx.git("push");
        if repo.graph_descendant_of(local, remote).map_err(&git)? || local == remote {
            continue; // a lock, not a move: try again
        }
        let unpushed = cx.runtime_only(local, remote, runtime_email)?;
        let to = cx.rebuild(remote, local, &unpushed)?;
        let old_tree = repo.find_commit(local).and_then(|c| c.tree()).map_err(&git)?;
        let new_tree = repo.find_commit(to).and_then(|c| c.tree()).map_err(&git)?;
        let diff = repo
            .diff_tree_to_tree(Some(&old_tree), Some(&new_tree), None)
            .map_err(&git)?;
        let mut changed = Vec::new();
        for d in diff.deltas() {
            let Some(p) = d.new_file().path().or(d.old_file().path()) else {
                continue;
            };
            let p = p.to_string_lossy().into_owned();
            if !is_record_path(&p) {
                return Ok(Pushed::Deferred(format!(
                    "{}/{} moved with changes outside the records ({p}); the next fire checks their approval and pushes these records",
                    sync.remote, sync.branch
                )));
            }
            changed.push(p);
        }
        cx.move_to(local, to, Some(&changed))?;
    }
    Err(cx.err(
        "push",
        format!("the remote rejected {attempts} push(es): it kept moving (sync.push_attempts bounds the retries); the records stay committed locally and the next fire pushes them"),
    ))
}

/// How long one `git fetch` or `git push` may take before it is killed (a hung ssh
/// connection must not hang the fire past its cron slot).
const CLI_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

/// Runs `command` in its own process group, collecting its output, and kills the
/// group (git and the ssh or https helper it started) when it outlasts `limit`.
fn output_within(
    command: &mut std::process::Command,
    limit: std::time::Duration,
) -> std::io::Result<std::process::Output> {
    use std::io::Read;
    use std::os::unix::process::CommandExt;
    let mut child = command
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            // SAFETY: kill(2) of the process group this function started.
            unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
            let _ = child.wait();
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("killed after {} s without an answer from the remote", limit.as_secs()),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Ok(std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_git_that_hangs_is_killed_with_its_group_at_the_bound() {
        let marker = tempfile::tempdir().unwrap();
        let late = marker.path().join("late");
        // A child of the command (as ssh is of git) that would write after the bound.
        let mut cmd = std::process::Command::new("sh");
        cmd.arg("-c")
            .arg(format!("(sleep 1; touch {}) & echo started; sleep 30", late.display()));
        let started = std::time::Instant::now();
        let err = output_within(&mut cmd, std::time::Duration::from_millis(300)).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
        std::thread::sleep(std::time::Duration::from_millis(1500));
        assert!(!late.exists(), "the group's other process was killed too");
        let ok = output_within(
            std::process::Command::new("sh").arg("-c").arg("echo out; echo err >&2"),
            std::time::Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(
            (ok.stdout.as_slice(), ok.stderr.as_slice()),
            (&b"out\n"[..], &b"err\n"[..])
        );
    }

    use super::*;
    use crate::review::signing::test_keys::keygen;
    use git2::Signature;
    use std::path::Path;

    /// Commits `files` on top of HEAD of `repo` (work tree and index too) as `who`.
    fn commit(repo: &Repository, files: &[(&str, &str)], who: &str) -> Oid {
        let root = repo.workdir().unwrap().to_path_buf();
        let mut index = repo.index().unwrap();
        for (p, body) in files {
            let full = root.join(p);
            std::fs::create_dir_all(full.parent().unwrap()).unwrap();
            std::fs::write(&full, body).unwrap();
            index.add_path(Path::new(p)).unwrap();
        }
        index.write().unwrap();
        let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
        let sig = Signature::now(who, &format!("{who}@localhost")).unwrap();
        let parent = repo.head().ok().and_then(|h| h.peel_to_commit().ok());
        let parents: Vec<&git2::Commit> = parent.iter().collect();
        repo.commit(Some("HEAD"), &sig, &sig, who, &tree, &parents).unwrap()
    }

    /// A bare origin with one commit on `main`, and two clones of it.
    fn origin_and_clones(dir: &Path) -> (Repository, Repository, Repository) {
        let mut opts = git2::RepositoryInitOptions::new();
        opts.initial_head("main");
        let seed = Repository::init_opts(dir.join("seed"), &opts).unwrap();
        commit(&seed, &[("prompts/t.md", "hi\n")], "eng");
        let origin = Repository::init_bare(dir.join("origin.git")).unwrap();
        let mut r = seed.remote("origin", dir.join("origin.git").to_str().unwrap()).unwrap();
        r.push(&["refs/heads/main:refs/heads/main"], None).unwrap();
        origin.set_head("refs/heads/main").unwrap();
        let clone = |name: &str| Repository::clone(dir.join("origin.git").to_str().unwrap(), dir.join(name)).unwrap();
        (origin, clone("cron"), clone("other"))
    }

    fn sync() -> SyncSettings {
        SyncSettings {
            remote: "origin".into(),
            branch: "main".into(),
            push_attempts: 3,
        }
    }

    fn push_other(other: &Repository) {
        let mut r = other.find_remote("origin").unwrap();
        r.push(&["refs/heads/main:refs/heads/main"], None).unwrap();
    }

    /// Records in `repo` an approval of the builder tree of `commit` by `who`, signed
    /// with `key`.
    fn approve(repo: &Repository, commit: Oid, who: &str, key: &Path) {
        use crate::review::approvals;
        let person = crate::review::parse_person(who).unwrap();
        let tree = crate::review::builder_tree_of_commit(repo, commit).unwrap();
        let signing = approvals::Signing {
            key: key.to_path_buf(),
            program: "ssh-keygen".into(),
        };
        let body = approvals::signed_body("p", tree, commit, &person, Some(&signing)).unwrap();
        approvals::write(repo, body, &person).unwrap();
    }

    /// Pushes `main` (forced with `force`) and every approval ref, one refspec each:
    /// libgit2's push takes no glob refspecs.
    fn push_main_and_approvals(other: &Repository, force: bool) {
        let mut specs = vec![format!(
            "{}refs/heads/main:refs/heads/main",
            if force { "+" } else { "" }
        )];
        for r in other.references_glob("refs/builder/approved/*").unwrap() {
            let name = r.unwrap().name().unwrap().to_string();
            specs.push(format!("{name}:{name}"));
        }
        other.find_remote("origin").unwrap().push(&specs, None).unwrap();
    }

    fn push_all(other: &Repository) {
        push_main_and_approvals(other, false);
    }

    #[test]
    fn an_incoming_tip_is_judged_by_the_list_of_the_last_approved_tree_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let Some((rev_key, rev_pub)) = keygen(dir.path(), "rev") else {
            eprintln!("skipped: ssh-keygen is not installed");
            return;
        };
        let (mal_key, mal_pub) = keygen(dir.path(), "mallory").unwrap();
        let (_origin, cron, other) = origin_and_clones(dir.path());
        let rule = ApprovalRule {
            runtime_email: "runtime@localhost".into(),
            signers: Some(crate::review::signing::SignerList::Repository(
                "settings/allowed_signers".into(),
            )),
        };
        let rev_line = format!("rev@x.org {rev_pub}");
        // The first signed tree, approved by Rev: judged by its own list (bootstrap).
        let first = commit(&other, &[("settings/allowed_signers", &rev_line)], "eng");
        approve(&other, first, "Rev <rev@x.org>", &rev_key);
        push_all(&other);
        assert!(matches!(
            before_fire(&cron, &sync(), &rule, None).unwrap(),
            Before::Moved { .. }
        ));
        // Mallory lists her key as Rev's and approves that very tree with it.
        let evil = commit(
            &other,
            &[
                ("settings/allowed_signers", &format!("{rev_line}rev@x.org {mal_pub}")),
                ("prompts/t.md", "mallory's\n"),
            ],
            "mallory",
        );
        approve(&other, evil, "Rev <rev@x.org>", &mal_key);
        push_all(&other);
        // The attack ran: by the list her tree brings, her approval verifies.
        let mut own = crate::review::trust::Trust::new(
            &other,
            ApprovalRule {
                signers: Some(crate::review::signing::SignerList::Operator(
                    crate::review::signing::AllowedSigners::parse(
                        Path::new("settings/allowed_signers"),
                        &format!("{rev_line}rev@x.org {mal_pub}"),
                    )
                    .unwrap(),
                )),
                ..rule.clone()
            },
        )
        .unwrap();
        assert!(own.commit(evil).unwrap().approval.is_some());
        // The cron box judges it by the list before it: it stays where it was.
        let before = cron.refname_to_id("refs/heads/main").unwrap();
        assert_eq!(
            before_fire(&cron, &sync(), &rule, None).unwrap(),
            Before::Unapproved {
                tip: evil,
                tree: crate::review::builder_tree_of_commit(&cron, evil).unwrap()
            }
        );
        assert_eq!(cron.refname_to_id("refs/heads/main").unwrap(), before);
        // A later change (dropping her key again) Rev approves with his own key is
        // judged by the list of the last approved tree (the first one, Mallory's being
        // unapproved): it moves.
        let fixed = commit(
            &other,
            &[("prompts/t.md", "reviewed\n"), ("settings/allowed_signers", &rev_line)],
            "eng",
        );
        approve(&other, fixed, "Rev <rev@x.org>", &rev_key);
        push_all(&other);
        assert_eq!(
            before_fire(&cron, &sync(), &rule, None).unwrap(),
            Before::Moved {
                from: before,
                to: fixed
            }
        );
        // An unrelated history forced over the branch, whose only tree lists her key
        // and carries her approval: no approved tree precedes it there, but the box
        // has one, and its list judges.
        let tree = other.find_commit(evil).unwrap().tree().unwrap();
        let sig = Signature::now("mallory", "mallory@localhost").unwrap();
        let orphan = other.commit(None, &sig, &sig, "orphan", &tree, &[]).unwrap();
        other.reference("refs/heads/main", orphan, true, "force").unwrap();
        approve(&other, orphan, "Rev <rev@x.org>", &mal_key);
        push_main_and_approvals(&other, true);
        assert!(matches!(
            before_fire(&cron, &sync(), &rule, None).unwrap(),
            Before::Unapproved { tip, .. } if tip == orphan
        ));
        assert_eq!(cron.refname_to_id("refs/heads/main").unwrap(), fixed);
    }

    #[test]
    fn the_sandbox_may_write_a_local_remote_and_connect_only_to_a_network_remotes_port() {
        let dir = tempfile::tempdir().unwrap();
        let (_origin, cron, _) = origin_and_clones(dir.path());
        let want = std::fs::canonicalize(dir.path().join("origin.git")).unwrap();
        assert_eq!(sandbox_dirs(&cron, Some(&sync())), vec![want.clone()]);
        assert!(sandbox_dirs(&cron, None).is_empty());
        cron.remote_set_url("origin", &format!("file://{}", want.display()))
            .unwrap();
        assert_eq!(sandbox_dirs(&cron, Some(&sync())), vec![want]);
        for (url, port) in [
            ("https://example.com/a.git", 443),
            ("https://example.com:8443/a.git", 8443),
            ("http://example.com/a.git", 80),
            ("ssh://git@example.com/a.git", 22),
            ("ssh://git@example.com:2222/a.git", 2222),
            ("git@example.com:a.git", 22),
            ("git://127.0.0.1:9419/a.git", 9419),
        ] {
            cron.remote_set_url("origin", url).unwrap();
            assert!(sandbox_dirs(&cron, Some(&sync())).is_empty(), "{url}");
            assert_eq!(sandbox_ports(&cron, Some(&sync())), vec![port], "{url}");
        }
        // A push URL of its own adds its port, and only that.
        cron.remote_set_pushurl("origin", Some("ssh://git@example.com:2222/a.git"))
            .unwrap();
        assert_eq!(sandbox_ports(&cron, Some(&sync())), vec![2222, 9419]);
        cron.remote_set_pushurl("origin", None).unwrap();
        for url in ["ftp://example.com/a.git", "https://"] {
            cron.remote_set_url("origin", url).unwrap();
            assert!(sandbox_ports(&cron, Some(&sync())).is_empty(), "{url}");
            let e = before_fire(&cron, &sync(), &ApprovalRule::unsigned("runtime@localhost"), None).unwrap_err();
            assert_eq!(e.step, "setup");
            assert!(e.message.contains("neither a local repository nor"), "{e}");
        }
    }

    #[test]
    fn a_push_the_remote_rejects_is_rebuilt_on_the_new_tip_and_keeps_both_sides() {
        let dir = tempfile::tempdir().unwrap();
        let (origin, cron, other) = origin_and_clones(dir.path());
        let base = origin.refname_to_id("refs/heads/main").unwrap();
        let ours = commit(&cron, &[("runs/t/a.json", "{}")], "runtime");
        commit(&other, &[("reports/other/b.md", "b")], "other");
        push_other(&other);
        let theirs = origin.refname_to_id("refs/heads/main").unwrap();
        let pushed = push_after(&cron, &sync(), "runtime@localhost").unwrap();
        let Pushed::Pushed { attempts, head } = pushed else {
            panic!("not pushed: {pushed:?}")
        };
        assert_eq!(attempts, 2, "rejected once, then rebuilt and pushed");
        assert_eq!(origin.refname_to_id("refs/heads/main").unwrap(), head);
        assert_eq!(
            cron.head().unwrap().target(),
            Some(head),
            "the local branch is the remote's"
        );
        let rebuilt = cron.find_commit(head).unwrap();
        assert_eq!(
            rebuilt.parent_ids().collect::<Vec<_>>(),
            vec![theirs],
            "rebuilt on the new tip"
        );
        assert_ne!(head, ours, "our unpushed commit was rebuilt, not forced");
        assert!(origin.graph_descendant_of(head, base).unwrap());
        let tree = rebuilt.tree().unwrap();
        for p in ["runs/t/a.json", "reports/other/b.md", "prompts/t.md"] {
            assert!(tree.get_path(Path::new(p)).is_ok(), "{p} lost");
        }
        // The other side's record is in the cron box's work tree and index too.
        assert!(cron.workdir().unwrap().join("reports/other/b.md").is_file());
        assert!(
            cron.statuses(None).unwrap().is_empty(),
            "work tree and index match HEAD"
        );
    }

    #[test]
    fn a_remote_that_moved_beyond_records_defers_the_push_and_a_foreign_local_commit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (origin, cron, other) = origin_and_clones(dir.path());
        commit(&cron, &[("runs/t/a.json", "{}")], "runtime");
        commit(&other, &[("prompts/t.md", "changed\n")], "other");
        push_other(&other);
        let theirs = origin.refname_to_id("refs/heads/main").unwrap();
        match push_after(&cron, &sync(), "runtime@localhost").unwrap() {
            Pushed::Deferred(why) => assert!(why.contains("prompts/t.md"), "{why}"),
            p => panic!("expected a deferred push, got {p:?}"),
        }
        assert_eq!(
            origin.refname_to_id("refs/heads/main").unwrap(),
            theirs,
            "nothing forced"
        );
        // Work of someone else on the cron box's branch is never pushed for them.
        commit(&cron, &[("notes.md", "mine")], "eng");
        let e = push_after(&cron, &sync(), "runtime@localhost").unwrap_err();
        assert_eq!(e.step, "join");
        assert!(e.to_string().contains("not a runtime records commit"), "{e}");
    }

    /// A `git daemon` (git://, receive-pack on) serving `base` on a free port of
    /// 127.0.0.1: a network remote for the `git` command-line transport.
    struct Daemon {
        child: std::process::Child,
        port: u16,
    }

    impl Drop for Daemon {
        fn drop(&mut self) {
            // `git daemon` runs `git-daemon` as its child: the whole group goes.
            // SAFETY: kill(2) of the process group the daemon was started in.
            unsafe { libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL) };
            let _ = self.child.wait();
        }
    }

    fn git_daemon(base: &Path) -> Daemon {
        use std::os::unix::process::CommandExt;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new("git")
            .args(["daemon", "--reuseaddr", "--export-all", "--enable=receive-pack"])
            .arg("--listen=127.0.0.1")
            .arg(format!("--port={port}"))
            .arg(format!("--base-path={}", base.display()))
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .process_group(0)
            .spawn()
            .unwrap();
        let daemon = Daemon { child, port };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return daemon;
            }
            std::thread::sleep(std::time::Duration::from_millis(25));
        }
        panic!("git daemon did not listen on {port}");
    }

    #[test]
    fn over_a_network_remote_the_cli_fetches_pushes_by_compare_and_swap_and_the_sandbox_allows_only_its_port() {
        let dir = tempfile::tempdir().unwrap();
        let (origin, cron, other) = origin_and_clones(dir.path());
        let served = git_daemon(dir.path());
        let elsewhere = git_daemon(dir.path());
        let url = |d: &Daemon| format!("git://127.0.0.1:{}/origin.git", d.port);
        let rule = ApprovalRule::unsigned("runtime@localhost");

        // The other port is reachable from outside the sandbox: the fetch through it runs.
        cron.remote_set_url("origin", &url(&elsewhere)).unwrap();
        let _ = cron.find_reference("refs/remotes/origin/main").unwrap().delete();
        assert_eq!(before_fire(&cron, &sync(), &rule, None).unwrap(), Before::UpToDate);
        assert!(cron.refname_to_id("refs/remotes/origin/main").is_ok(), "fetched");

        // The fetch takes refs/builder/* too.
        cron.remote_set_url("origin", &url(&served)).unwrap();
        let seed = origin.refname_to_id("refs/heads/main").unwrap();
        origin.reference("refs/builder/approvals", seed, true, "test").unwrap();
        assert_eq!(before_fire(&cron, &sync(), &rule, None).unwrap(), Before::UpToDate);
        assert_eq!(cron.refname_to_id("refs/builder/approvals").unwrap(), seed);

        // A push that lost the race to another is rejected by the lease, never
        // forced: rebuilt on the new tip and pushed again.
        commit(&cron, &[("runs/t/a.json", "{}")], "runtime");
        commit(&other, &[("reports/other/b.md", "b")], "other");
        push_other(&other);
        let theirs = origin.refname_to_id("refs/heads/main").unwrap();
        let Pushed::Pushed { attempts, head } = push_after(&cron, &sync(), "runtime@localhost").unwrap() else {
            panic!("not pushed")
        };
        assert_eq!(attempts, 2, "rejected once, then rebuilt and pushed");
        assert_eq!(origin.refname_to_id("refs/heads/main").unwrap(), head);
        assert_eq!(
            cron.find_commit(head).unwrap().parent_ids().collect::<Vec<_>>(),
            vec![theirs]
        );

        // Inside the runtime's own sandbox (granted the remote's port and nothing
        // else), the push through `git` works on that port; the other port is refused.
        let root = cron.workdir().unwrap().to_path_buf();
        let git_dirs = crate::git::git_dirs(&cron);
        let ports = sandbox_ports(&cron, Some(&sync()));
        assert_eq!(ports, vec![served.port]);
        let cron_path = cron.path().to_path_buf();
        let other_url = url(&elsewhere);
        let origin_dir = dir.path().join("origin.git");
        std::thread::spawn(move || {
            let spec = crate::sandbox::runtime_spec(&root, &git_dirs, &ports);
            crate::sandbox::prepare_dirs(&spec).unwrap();
            crate::sandbox::landlock::enforce(&spec, crate::settings::LandlockMode::Required).unwrap();
            let cron = Repository::open(&cron_path).unwrap();
            let ours = commit(&cron, &[("runs/t/b.json", "{}")], "runtime");
            let pushed = push_after(&cron, &sync(), "runtime@localhost").unwrap();
            assert_eq!(
                pushed,
                Pushed::Pushed {
                    attempts: 1,
                    head: ours
                }
            );
            assert!(
                std::fs::OpenOptions::new()
                    .append(true)
                    .open(origin_dir.join("HEAD"))
                    .is_err(),
                "the sandbox does not write the origin's directory itself"
            );
            cron.remote_set_url("origin", &other_url).unwrap();
            commit(&cron, &[("runs/t/c.json", "{}")], "runtime");
            let e = push_after(&cron, &sync(), "runtime@localhost").unwrap_err();
            assert_eq!(e.step, "push", "{e}");
            // The port that served this box's fetch outside the sandbox: refused inside.
            assert!(e.message.contains("unable to connect"), "{e}");
            assert!(e.message.contains("Permission denied"), "{e}");
        })
        .join()
        .unwrap();
        assert_ne!(
            origin.refname_to_id("refs/heads/main").unwrap(),
            cron.refname_to_id("refs/heads/main").unwrap(),
            "the refused push sent nothing"
        );
    }
}
