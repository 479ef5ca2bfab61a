//! How the box reaches its remote. The workspace's `git2` is built without default
//! features (no ssh or https), so a remote on disk (a path, `file://`) is fetched
//! and pushed by libgit2, and a network remote (`ssh://`, scp-like `host:path`,
//! `https://`, `http://`, `git://`) through the `git` command line, as cargo's
//! `net.git-fetch-with-cli` does: the operator's ssh keys and agent, `known_hosts`,
//! credential helpers and proxies apply unchanged.
//!
//! Both keep one contract. The fetch takes the branch and the approvals' namespace
//! into the box's private refs (never straight into refs a person uses), with no
//! prune. The push moves the remote branch by compare-and-swap against the tip the
//! box built on: for a remote on disk, the objects go into the remote's pack
//! directory and the branch moves under git's own ref lock in a transaction
//! ([`super::locks::set_ref`]; libgit2's own local push does not compare, and would
//! overwrite a push that landed meanwhile); through the command line,
//! `--force-with-lease=<branch>:<expected>`.

use super::locks::{self, Expect, Intent, Point, SetRef};
use super::{Ctx, SyncError};
use git2::{Oid, Repository};
use std::path::PathBuf;

/// How a fire reaches its remote.
pub(super) enum Transport {
    /// A local repository, through libgit2.
    Local(PathBuf),
    /// A network remote, through the `git` command line: the TCP ports of its fetch
    /// and push URLs.
    Cli { ports: Vec<u16> },
}

/// How one push ended.
pub(super) enum Sent {
    /// The remote branch is now `local`.
    Taken,
    /// The remote branch is not what the push expected: it moved.
    Moved,
    /// The remote branch's lock is held (past a short wait): by whom, and the fix.
    Locked { lock: String, fix: String },
}

/// How long a push waits for a remote ref lock held by someone else: git holds one
/// for milliseconds, so one held this long was left by a push that died.
pub(super) const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(3);

/// How long one `git fetch` or `git push` may take before it is killed (a hung ssh
/// connection must not hang the fire past its cron slot).
const CLI_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

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

impl Ctx<'_> {
    /// How this fire reaches the remote: its directory (local) or its URL and port
    /// (through the `git` command line); an error for a remote it cannot reach.
    pub(super) fn transport(&self) -> Result<Transport, SyncError> {
        let remote = self.repo.find_remote(&self.sync.remote).map_err(|e| {
            self.err(
                "setup",
                format!("no remote `{}` in this repository ({})", self.sync.remote, e.message()),
            )
        })?;
        let url = remote.url().unwrap_or("").to_string();
        // A push URL of its own where either URL is a directory: the runtime fetches
        // and pushes a local remote itself, through one path, so it would write its
        // records where it fetches from (a mirror another job overwrites), never where
        // they were meant to go. Refused, named, rather than a box that exits 0 while
        // its records never reach the origin.
        if let Some(push) = remote.pushurl().ok().flatten().filter(|p| *p != url) {
            let (fetch_dir, push_dir) = (local_path(&url, self.repo), local_path(push, self.repo));
            let elsewhere = fetch_dir != push_dir || fetch_dir.is_none();
            if elsewhere && (fetch_dir.is_some() || push_dir.is_some()) {
                return Err(self
                    .err(
                        "setup",
                        format!(
                            "remote `{}` fetches from `{url}` and pushes to `{push}`: with a local repository on either side the runtime syncs with one repository only",
                            self.sync.remote
                        ),
                    )
                    .hint(format!(
                        "point the remote at the repository the records must reach, for fetch and push alike (`git remote set-url {0} {push}`), and drop what sends pushes elsewhere (`remote.{0}.pushurl`, a `pushInsteadOf`)",
                        self.sync.remote
                    )));
            }
        }
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

    /// Fetches the branch into the private ref [`Ctx::fetched_ref`] and, with
    /// `approvals`, the approvals' namespace into the private staging namespace
    /// (never pruned, never straight into `refs/builder/`). Returns the remote tip.
    pub(super) fn fetch(&self, approvals: bool) -> Result<Oid, SyncError> {
        let mut specs = vec![format!("+{}:{}", self.local_ref(), self.fetched_ref())];
        if approvals {
            let (src, _) = approvals_namespace();
            specs.push(format!("+{src}*:{}*", self.staged_approvals()));
        }
        match self.transport()? {
            Transport::Local(dir) => {
                // A branch gone from the remote (deleted, renamed) fetches as nothing,
                // and the private ref would still hold its last tip: asked first.
                let there = Repository::open(&dir).map_err(self.git("fetch"))?;
                if there.find_reference(&self.local_ref()).is_err() {
                    return Err(self
                        .err(
                            "fetch",
                            format!(
                                "the remote has no branch `{}` (deleted or renamed there)",
                                self.sync.branch
                            ),
                        )
                        .hint(format!(
                            "set sync.branch to the branch the team pushes to, through review, or push `{}` back to the remote",
                            self.sync.branch
                        )));
                }
                // An anonymous remote of the same URL: fetching through the named one,
                // libgit2 also applies the remote's configured refspecs to what it
                // fetched (opportunistic updates), and moves the box's own
                // `refs/builder/approved/*` to whatever the origin was forced to,
                // whatever the refspec's force flag says.
                let named = self.repo.find_remote(&self.sync.remote).map_err(self.git("fetch"))?;
                let url = std::str::from_utf8(named.url_bytes()).map_err(|_| {
                    self.err(
                        "fetch",
                        format!("remote `{}` has a URL that is not UTF-8", self.sync.remote),
                    )
                })?;
                let mut remote = self.repo.remote_anonymous(url).map_err(self.git("fetch"))?;
                let mut opts = git2::FetchOptions::new();
                opts.prune(git2::FetchPrune::Off)
                    .update_fetchhead(false)
                    .download_tags(git2::AutotagOption::None);
                remote.fetch(&specs, Some(&mut opts), None).map_err(self.git("fetch"))?;
            }
            Transport::Cli { .. } => self.cli_fetch(&specs)?,
        }
        self.repo.refname_to_id(&self.fetched_ref()).map_err(|e| {
            self.err(
                "fetch",
                format!("the remote has no branch `{}` ({})", self.sync.branch, e.message()),
            )
        })
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
            "--no-prune",
            "--no-write-fetch-head",
            // Only the refspecs given here: with the remote's configured ones git
            // would also update `refs/builder/approved/*` opportunistically, and an
            // approval ref the origin was forced to move would fail the whole fetch.
            "--refmap=",
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

    /// One push of `commit` to the remote branch by compare-and-swap from `expected`
    /// (`None`: the branch must not exist yet).
    pub(super) fn send(&self, intent: &mut Intent, commit: Oid, expected: Option<Oid>) -> Result<Sent, SyncError> {
        let dir = match self.transport()? {
            Transport::Local(dir) => dir,
            Transport::Cli { .. } => return self.cli_push(commit, expected),
        };
        let git = self.git("push");
        let target = Repository::open(&dir).map_err(&git)?;
        self.send_objects(&target, commit, expected)?;
        crate::failpoint!("sync-remote-objects-sent");
        let msg = format!("push by the runtime ({}/{})", self.sync.remote, self.sync.branch);
        let deadline = std::time::Instant::now() + LOCK_PATIENCE;
        loop {
            let set = locks::set_ref(
                &target,
                intent,
                &self.local_ref(),
                commit,
                Expect::Is(expected),
                Point::Remote,
                &msg,
            )
            .map_err(&git)?;
            match set {
                SetRef::Set => return Ok(Sent::Taken),
                SetRef::Differs(_) => return Ok(Sent::Moved),
                SetRef::Locked(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                SetRef::Locked(lock) => {
                    let age = std::fs::metadata(&lock)
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|m| m.elapsed().ok())
                        .map(|a| format!(", made {} s ago", a.as_secs()))
                        .unwrap_or_default();
                    return Ok(Sent::Locked {
                        lock: format!("{}{age}", lock.display()),
                        fix: format!(
                            "if no git is pushing to {} now (a push was killed holding the lock), remove the lock: rm {}",
                            dir.display(),
                            shell_quote(&lock.to_string_lossy())
                        ),
                    });
                }
            }
        }
    }

    /// Writes the objects of `commit` the remote lacks into its pack directory, as
    /// libgit2's local push does (a pack and its index, each renamed into place once
    /// complete): nothing names them until the branch moves.
    fn send_objects(&self, target: &Repository, commit: Oid, have: Option<Oid>) -> Result<(), SyncError> {
        let git = self.git("push");
        let mut walk = self.repo.revwalk().map_err(&git)?;
        walk.push(commit).map_err(&git)?;
        let odb = target.odb().map_err(&git)?;
        for h in have
            .into_iter()
            .chain(self.repo.refname_to_id(&self.fetched_ref()).ok())
        {
            if odb.exists(h) && self.repo.find_commit(h).is_ok() {
                walk.hide(h).map_err(&git)?;
            }
        }
        let mut pack = self.repo.packbuilder().map_err(&git)?;
        pack.insert_walk(&mut walk).map_err(&git)?;
        if pack.object_count() == 0 {
            return Ok(());
        }
        let dir = target.path().join("objects").join("pack");
        pack.write(&dir, 0).map_err(&git)
    }

    /// One push through the `git` command line: a compare-and-swap of the remote
    /// branch from `expected` to `local`.
    fn cli_push(&self, local: Oid, expected: Option<Oid>) -> Result<Sent, SyncError> {
        let branch = self.local_ref();
        // An empty expected value: the branch must not exist yet.
        let expected = expected.map(|e| e.to_string()).unwrap_or_default();
        let lease = format!("--force-with-lease={branch}:{expected}");
        let spec = format!("{local}:{branch}");
        // `--no-verify`: a pre-push hook is the engineers' gate (the libgit2 path runs
        // none either); the runtime pushes only its records commits, checked before.
        let out = self.cli(
            "push",
            &["push", "--porcelain", "--no-verify", &lease, &self.sync.remote, &spec],
        )?;
        if out.status.success() {
            return Ok(Sent::Taken);
        }
        let stdout = String::from_utf8_lossy(&out.stdout);
        let rejected: Vec<&str> = stdout.lines().filter(|l| l.starts_with('!')).collect();
        if rejected.iter().any(|l| {
            ["stale info", "fetch first", "non-fast-forward"]
                .iter()
                .any(|why| l.contains(why))
        }) {
            return Ok(Sent::Moved);
        }
        if let Some(line) = rejected.iter().find(|l| l.contains("lock")) {
            return Ok(Sent::Locked {
                lock: format!("the remote could not lock {branch}: {}", line.trim()),
                fix: format!(
                    "a push to the remote died holding {branch}'s lock there: whoever administers the remote removes <repository>/{branch}.lock once no push runs"
                ),
            });
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
}

/// The approvals' namespace, from the refspec approvals travel with
/// ([`crate::review::BUILDER_REFSPEC`]): its source and destination prefixes
/// (`refs/builder/`), whatever its force flag (the box never forces an approval ref).
pub(super) fn approvals_namespace() -> (&'static str, &'static str) {
    let spec = crate::review::BUILDER_REFSPEC.trim_start_matches('+');
    let (src, dst) = spec.split_once(':').unwrap_or((spec, spec));
    (src.trim_end_matches('*'), dst.trim_end_matches('*'))
}

/// `s` quoted for a POSIX shell when it needs it.
fn shell_quote(s: &str) -> String {
    if s.chars().all(|c| c.is_ascii_alphanumeric() || "/._-+=:,@".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The TCP port of a network remote URL: the URL's own, else the scheme's (ssh 22,
/// https 443, http 80, git 9418); scp-like `[user@]host:path` is ssh. `None` for a
/// URL that is not one of those.
pub(super) fn network_port(url: &str) -> Option<u16> {
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
pub(super) fn local_path(url: &str, repo: &Repository) -> Option<PathBuf> {
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

/// Runs `command` in its own process group, collecting its output, and kills the
/// group (git and the ssh or https helper it started) when it outlasts `limit`.
pub(super) fn output_within(
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
            // The process group this function started.
            let _ = kernel::signal::kill_group(child.id(), kernel::signal::Signal::Kill);
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
    use super::*;

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

    #[test]
    fn the_approvals_namespace_comes_from_the_refspec_they_travel_with() {
        assert_eq!(approvals_namespace(), ("refs/builder/", "refs/builder/"));
        assert_eq!(
            shell_quote("/srv/git/a.git/refs/heads/main.lock"),
            "/srv/git/a.git/refs/heads/main.lock"
        );
        assert_eq!(shell_quote("/tmp/a b/x'y"), r"'/tmp/a b/x'\''y'");
    }
}
