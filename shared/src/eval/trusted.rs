//! The trusted configuration of an eval (docs/design.md):
//! where it comes from (the base revision's settings, read from git, or an operator's
//! file named on the command line), the file every eval fire is handed
//! (`runtime fire --eval --trusted-settings FILE`), the environment an eval fire gets
//! (an allow-list: nothing of the reviewer's but the locale, `PATH` and, for a case
//! that calls the live model, the trusted key variables), and each revision's powers
//! judged against it before anything of the revision runs ([`crate::powers`]): its
//! settings, its prompts' prefetch ports, and the MCP pins of its `settings/mcp.lock`
//! (a new or changed tool definition widens what a fire offers the model).

use super::scratch::Scratch;
use super::{EvalError, Revision};
use crate::mcp::lock::{lock_changes, McpLock, PinChange, LOCK_FILE};
use crate::powers::{self, Effect, PowerChange};
use crate::settings::RuntimeSettings;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the trusted configuration comes from.
#[derive(Debug, Clone)]
pub enum TrustedSource {
    /// The base revision's settings (`settings/` of its commit, from git).
    Base,
    /// An operator's settings file (the format of `settings/runtime.yaml`).
    File(PathBuf),
}

/// The trusted configuration, resolved, with the file eval fires read it from.
pub struct Trusted {
    pub settings: RuntimeSettings,
    /// In words: `the base (1a2b3c4d5e6f)` or the operator's file.
    pub from: String,
    /// The MCP pins a revision's lock is compared with.
    lock: TrustedLock,
    file: PathBuf,
    _dir: Scratch,
}

/// The trusted side's `settings/mcp.lock`: the lock of the base revision's commit, read
/// from git, whichever the source of the trusted settings (an operator's file names
/// servers, never their pins). With no base revision (an operator's file and a head
/// with no parent) nothing is pinned: every pin of the revision is new to it, and
/// widens. A base lock that does not parse counts as empty the same way.
struct TrustedLock {
    /// The lock's blob at the base, if it has one: a revision with the same blob
    /// changes no pin.
    blob: Option<git2::Oid>,
    lock: McpLock,
    /// The commit the lock was read from (none: nothing is pinned).
    commit: Option<git2::Oid>,
}

impl TrustedLock {
    fn of(repo: &git2::Repository, base: Option<&Revision>) -> Result<TrustedLock, EvalError> {
        let Some(b) = base else {
            return Ok(TrustedLock {
                blob: None,
                lock: McpLock::default(),
                commit: None,
            });
        };
        Self::of_commit(
            repo,
            git2::Oid::from_str(&b.commit).map_err(|e| EvalError::Worktree(e.to_string()))?,
        )
    }

    /// The lock of `commit`.
    fn of_commit(repo: &git2::Repository, commit: git2::Oid) -> Result<TrustedLock, EvalError> {
        let (blob, lock) = lock_of_commit(repo, &commit.to_string())?;
        Ok(TrustedLock {
            blob,
            lock: lock.unwrap_or_default(),
            commit: Some(commit),
        })
    }
}

/// The commit whose settings and MCP pins an eval against the base `b` trusts: the
/// base, or its nearest reviewed ancestor when it owes review nobody gave
/// ([`crate::review::base::reviewed_ancestor`]).
fn trusted_commit(repo: &git2::Repository, b: &Revision) -> Result<git2::Oid, EvalError> {
    let id = git2::Oid::from_str(&b.commit).map_err(|e| EvalError::Worktree(e.to_string()))?;
    crate::review::base::reviewed_ancestor(repo, id).map_err(|e| EvalError::Trusted(e.to_string()))
}

/// Bounds what an eval trusts by the protected branch ([`crate::review::base::protected_judgement`]):
/// approvals only move forward for evals too. A proposal made on an old commit of the
/// branch (or naming it as `--base`), whose settings or MCP pins a review approved once
/// with more powers than the branch grants now (a read directory, a port, Landlock
/// off, another provider, a tool pin since dropped), would otherwise be fired under
/// them on the reviewer's machine. Where the base's `settings` (unless they are an
/// operator's file: `bound_settings` false) or its `lock` grant what the branch's do
/// not, the branch's stand in, `from` says so, and the base is judged against them
/// like the head (so its eval is refused, named). A clone with no protected branch
/// keeps the base's.
fn bound_by_the_branch(
    repo: &git2::Repository,
    settings: &mut RuntimeSettings,
    bound_settings: bool,
    lock: &mut TrustedLock,
    from: &mut String,
) -> Result<(), EvalError> {
    let branch = match crate::review::base::protected_judgement(repo) {
        Ok(Some(p)) => p,
        Ok(None) => return Ok(()),
        // The operator's file answers for the settings; the base's pins stand.
        Err(e) if !bound_settings => {
            tracing::warn!(error = %e, "the protected branch's settings cannot be read: the base's MCP pins are not bounded by its");
            return Ok(());
        }
        Err(e) => {
            return Err(EvalError::Trusted(format!(
                "the protected branch's settings, which bound what an eval trusts, cannot be read: {e}"
            )))
        }
    };
    let widens = |changes: Vec<PowerChange>| -> Vec<PowerChange> {
        changes.into_iter().filter(|c| c.effect == Effect::Widens).collect()
    };
    let mut dropped = match bound_settings {
        true => widens(powers::changes(&branch.settings, settings)),
        false => Vec::new(),
    };
    if !dropped.is_empty() {
        *settings = branch.settings;
    }
    let branch_lock = TrustedLock::of_commit(repo, branch.commit)?;
    let pins = widens(pin_changes(&branch_lock, lock.blob, Ok(lock.lock.clone())));
    if !pins.is_empty() {
        *lock = branch_lock;
        dropped.extend(pins);
    }
    if !dropped.is_empty() {
        *from = format!(
            "{from}, bounded by {} ({}), which no longer grants: {} (rebase the proposal onto {}, fetched, or name an operator's file)",
            branch.tip.name,
            crate::text::short_oid(branch.commit),
            dropped.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
            branch.tip.name
        );
    }
    Ok(())
}

/// A head that changes paths outside the builder-owned ones (against `base`) is not
/// fired: no approval covers that code, yet a fire under the trusted powers would run
/// it. A module beside a pinned MCP server's script, shadowing one it imports, would
/// run with the server's read roots, ports and variables; a library a prefetch script
/// sources, with the prefetch's. `builder land` refuses such a proposal anyway. The
/// runtime's directories (`runs/`, `reports/`, `cards/`) are left out: a fire commits
/// there, and nothing loads code from there unless reviewed code names it.
pub fn refuse_code_outside_review(
    repo: &git2::Repository,
    base: &Revision,
    head: &Revision,
    powers: &mut RevisionPowers,
) -> Result<(), EvalError> {
    let id = |r: &Revision| git2::Oid::from_str(&r.commit).map_err(|e| EvalError::Worktree(e.to_string()));
    // By the base's `builder_paths` too: a head that names its own change
    // builder-owned has not had that reviewed either.
    let (base_id, head_id) = (id(base)?, id(head)?);
    // The runtime's records (a fire's receipt, report, cards and outputs) are data no
    // interpreter finds on its own: a head a fire committed onto is not refused for
    // them.
    let outside: Vec<String> = crate::review::changes_outside(repo, base_id, head_id, &[base_id, head_id])
        .map_err(|e| EvalError::Worktree(format!("the paths {} changes: {e}", head.rev)))?
        .into_iter()
        .filter(|p| !crate::layout::in_runtime_dirs(p))
        .collect();
    if outside.is_empty() {
        return Ok(());
    }
    let named = first_few(&outside);
    let mut changes = std::mem::take(&mut powers.changes);
    changes.push(PowerChange {
        key: "paths outside builder_paths".into(),
        before: base.rev.clone(),
        after: format!("{} changed: {named}", outside.len()),
        effect: Effect::Widens,
        why: "code no approval covers would run with the trusted powers (a module an MCP server or a script imports, beside it)".into(),
    });
    *powers = RevisionPowers::of(powers.revision, changes);
    Ok(())
}

/// The blob of `settings/mcp.lock` at `commit` (none when the commit has no lock)
/// and the lock it holds (a missing lock is an empty one), read from git.
fn lock_of_commit(
    repo: &git2::Repository,
    commit: &str,
) -> Result<(Option<git2::Oid>, Result<McpLock, String>), EvalError> {
    let id = git2::Oid::from_str(commit).map_err(|e| EvalError::Worktree(e.to_string()))?;
    let tree = repo
        .find_commit(id)
        .and_then(|c| c.tree())
        .map_err(|e| EvalError::Worktree(e.to_string()))?;
    let Ok(entry) = tree.get_path(Path::new(LOCK_FILE)) else {
        return Ok((None, Ok(McpLock::default())));
    };
    let blob = repo
        .find_blob(entry.id())
        .map_err(|e| EvalError::Worktree(format!("{LOCK_FILE} at {}: {e}", crate::text::short_id(commit))))?;
    let named = PathBuf::from(format!("{LOCK_FILE} at {}", crate::text::short_id(commit)));
    let lock = std::str::from_utf8(blob.content())
        .map_err(|e| format!("{}: not UTF-8: {e}", named.display()))
        .and_then(|text| McpLock::parse(text, &named).map_err(|e| e.to_string()));
    Ok((Some(entry.id()), lock))
}

/// The pins `proposed` (the revision's lock blob and what it holds) changes against
/// `trusted`: one change per server, its words joined. A lock that does not parse is
/// one change that widens: what it would offer cannot be told.
fn pin_changes(trusted: &TrustedLock, blob: Option<git2::Oid>, proposed: Result<McpLock, String>) -> Vec<PowerChange> {
    if blob == trusted.blob {
        return Vec::new();
    }
    let proposed = match proposed {
        Ok(l) => l,
        Err(why) => {
            return vec![PowerChange {
                key: LOCK_FILE.into(),
                before: "the trusted pins".into(),
                after: "a lock that does not parse".into(),
                effect: Effect::Widens,
                why: format!("{why}: what its pins would let a fire offer the model cannot be told"),
            }]
        }
    };
    let tools = |l: &McpLock, server: &str| {
        l.servers.get(server).map_or("none".to_string(), |p| {
            format!("[{}]", p.tools.keys().cloned().collect::<Vec<_>>().join(", "))
        })
    };
    lock_changes(Some(&trusted.lock), &proposed)
        .into_iter()
        .map(|(server, said)| PowerChange {
            key: format!("mcp.{server} pins"),
            before: tools(&trusted.lock, &server),
            after: tools(&proposed, &server),
            effect: if said.iter().any(PinChange::widens) {
                Effect::Widens
            } else {
                Effect::Narrows
            },
            why: said.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
        })
        .collect()
}

/// The builder-owned directories whose files the runtime and the builder read as
/// data, which no server is expected to load as code.
const DATA_DIRS: &[&str] = &["prompts", "scope", "settings", "evals"];

/// The trusted stdio MCP servers with grants of their own (ports, read roots,
/// variables) that a revision (`rev`) could hand code no pin covers, each with the
/// paths that could: a path it changes against the commit whose pins are trusted
/// (`trusted`), outside what the server's pin covers (the directory of each script
/// its arguments name, [`crate::mcp::digest`]) and outside [`DATA_DIRS`] and the
/// runtime's directories, may be code that server loads (a library its script
/// sources, a module it imports from elsewhere), which would run with the server's
/// grants before any review (helper-90: the review said "0 power changes", and the
/// proposal's code sent the repository to a listener through the server's port).
fn unpinned_code(
    repo: &git2::Repository,
    servers: &crate::mcp::McpServers,
    trusted: git2::Oid,
    rev: git2::Oid,
) -> Result<Vec<(String, Vec<String>)>, git2::Error> {
    let granted: Vec<_> = servers
        .iter()
        .filter(|(_, s)| s.url.is_none() && !(s.network.is_empty() && s.read.is_empty() && s.env_allow.is_empty()))
        .collect();
    if granted.is_empty() || trusted == rev {
        return Ok(Vec::new());
    }
    let old = repo.find_commit(trusted)?.tree()?;
    let new = repo.find_commit(rev)?.tree()?;
    let mut changed: Vec<String> = Vec::new();
    for d in repo.diff_tree_to_tree(Some(&old), Some(&new), None)?.deltas() {
        for path in [d.old_file().path(), d.new_file().path()].into_iter().flatten() {
            let path = path.to_string_lossy().into_owned();
            let data = DATA_DIRS.iter().any(|dir| Path::new(&path).starts_with(dir));
            if !data && !crate::layout::in_runtime_dirs(&path) && !changed.contains(&path) {
                changed.push(path);
            }
        }
    }
    let mut out = Vec::new();
    for (name, server) in granted {
        // A script named through a link (itself, or a directory on its way) pins its
        // target's directory, which this does not follow: it counts as pinning none
        // (helper-92: a changed library beside the link's own name ran unseen).
        let pinned: Vec<&Path> = server
            .command
            .iter()
            .skip(1)
            .map(|a| Path::new(a.strip_prefix("./").unwrap_or(a)))
            // A regular file, as the digest pins (a directory named pins nothing).
            .filter(|a| {
                old.get_path(a)
                    .is_ok_and(|e| matches!(e.filemode(), 0o100644 | 0o100755))
            })
            .filter(|a| !through_a_link(&old, a))
            .filter_map(Path::parent)
            .filter(|dir| !dir.as_os_str().is_empty())
            .collect();
        let outside: Vec<String> = changed
            .iter()
            .filter(|p| !pinned.iter().any(|dir| Path::new(p.as_str()).starts_with(dir)))
            .cloned()
            .collect();
        if !outside.is_empty() {
            out.push((name.clone(), outside));
        }
    }
    Ok(out)
}

/// Whether `path`, or a directory on its way, is a symbolic link in `tree`.
fn through_a_link(tree: &git2::Tree<'_>, path: &Path) -> bool {
    path.ancestors()
        .filter(|p| !p.as_os_str().is_empty())
        .any(|p| tree.get_path(p).is_ok_and(|e| e.filemode() == 0o120000))
}

/// The first five of `paths`, and how many more there are, for a power change.
fn first_few(paths: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut named = paths
        .iter()
        .take(SHOWN)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if paths.len() > SHOWN {
        named.push_str(&format!(" and {} more", paths.len() - SHOWN));
    }
    named
}

/// The widening a revision makes by changing `paths` the trusted server `server` may
/// load: its fires are refused (an eval fire cannot run the server without the grants
/// its settings name: the runtime refuses a revision wider than its trusted file).
fn unpinned_code_change(server: &str, paths: &[String]) -> PowerChange {
    let named = first_few(paths);
    PowerChange {
        key: format!("mcp.{server} code"),
        before: "what its pin covers".into(),
        after: format!("{} changed outside it: {named}", paths.len()),
        effect: Effect::Widens,
        why: "code the server may load from there (a library its script sources) would run with its ports, read roots and variables before any review".into(),
    }
}

/// One revision's powers against the trusted configuration.
#[derive(Debug, Clone, Serialize)]
pub struct RevisionPowers {
    /// `base` or `head`.
    pub revision: &'static str,
    /// Every power the revision sets differently (settings, MCP pins, and prompts'
    /// prefetch ports).
    pub changes: Vec<PowerChange>,
    /// Why the revision's eval was refused (it widens a power), if it was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

impl RevisionPowers {
    /// The powers `changes` of `revision`, refused when any widens.
    fn of(revision: &'static str, changes: Vec<PowerChange>) -> RevisionPowers {
        let widened: Vec<PowerChange> = changes.iter().filter(|c| c.effect == Effect::Widens).cloned().collect();
        RevisionPowers {
            revision,
            refused: (!widened.is_empty())
                .then(|| format!("refused, nothing of it ran: {}", powers::describe_widenings(&widened))),
            changes,
        }
    }
}

impl Trusted {
    /// Resolves `source`; `base` is the revision compared against, if any.
    pub fn resolve(
        repo: &git2::Repository,
        source: &TrustedSource,
        base: Option<&Revision>,
    ) -> Result<Trusted, EvalError> {
        // The base's nearest reviewed commit, found once: its settings (unless the
        // operator's file is given) and its MCP pins are what evals trust.
        let reviewed = match base {
            Some(b) => Some(Revision {
                rev: b.rev.clone(),
                commit: trusted_commit(repo, b)?.to_string(),
            }),
            None => None,
        };
        let (settings, from) = match (source, base, &reviewed) {
            (TrustedSource::File(path), _, _) => (
                powers::load_trusted_file(path).map_err(|e| EvalError::Trusted(e.to_string()))?,
                format!("the operator's file {}", path.display()),
            ),
            (TrustedSource::Base, Some(b), Some(r)) => {
                let id = git2::Oid::from_str(&r.commit).map_err(|e| EvalError::Worktree(e.to_string()))?;
                let s = crate::review::delta::settings_of_commit(repo, id, &b.rev)
                    .map_err(|e| EvalError::Trusted(format!("the base's settings cannot be trusted: {e}")))?;
                let from = if r.commit == b.commit {
                    format!("the base ({})", crate::text::short_id(&b.commit))
                } else {
                    format!(
                        "{}, the nearest reviewed commit below the base ({}, which owes review)",
                        crate::text::short_id(&r.commit),
                        crate::text::short_id(&b.commit)
                    )
                };
                (s, from)
            }
            (TrustedSource::Base, _, _) => {
                return Err(EvalError::Trusted(
                    "no base revision to take the trusted settings from (the head has no parent)".into(),
                ))
            }
        };
        let (mut settings, mut from) = (settings, from);
        let mut lock = TrustedLock::of(repo, reviewed.as_ref())?;
        let bound_settings = matches!(source, TrustedSource::Base);
        bound_by_the_branch(repo, &mut settings, bound_settings, &mut lock, &mut from)?;
        let dir = Scratch::new("builder-trusted-").map_err(|(path, source)| EvalError::Io { path, source })?;
        let file = dir.path().join("runtime.yaml");
        let text = powers::to_yaml(&settings).map_err(|e| EvalError::Trusted(e.to_string()))?;
        std::fs::write(&file, text).map_err(|source| EvalError::Io {
            path: file.clone(),
            source,
        })?;
        Ok(Trusted {
            settings,
            from,
            lock,
            file,
            _dir: dir,
        })
    }

    /// The settings file eval fires are handed.
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The powers of `rev` (its settings, its MCP pins and the prefetch entries of the
    /// prompts of `tasks`, all read from git) against the trusted configuration.
    pub fn judge(
        &self,
        repo: &git2::Repository,
        revision: &'static str,
        rev: &Revision,
        tasks: &[String],
    ) -> Result<RevisionPowers, EvalError> {
        let id = git2::Oid::from_str(&rev.commit).map_err(|e| EvalError::Worktree(e.to_string()))?;
        let mut changes = match crate::review::delta::settings_of_commit(repo, id, &rev.rev) {
            Ok(s) => powers::changes(&self.settings, &s),
            // Settings that do not load never fire (the fire refuses them itself).
            Err(_) => Vec::new(),
        };
        let (blob, lock) = lock_of_commit(repo, &rev.commit)?;
        changes.extend(pin_changes(&self.lock, blob, lock));
        if let Some(trusted) = self.lock.commit {
            let unpinned = unpinned_code(repo, &self.settings.mcp, trusted, id)
                .map_err(|e| EvalError::Worktree(format!("the paths {} changes: {e}", rev.rev)))?;
            changes.extend(
                unpinned
                    .iter()
                    .map(|(server, paths)| unpinned_code_change(server, paths)),
            );
        }
        let tree = repo
            .find_commit(id)
            .and_then(|c| c.tree())
            .map_err(|e| EvalError::Worktree(e.to_string()))?;
        for task in tasks {
            let rel = crate::prompt::prompt_path(task);
            let Some(text) = tree
                .get_path(&rel)
                .ok()
                .and_then(|e| repo.find_blob(e.id()).ok())
                .map(|b| String::from_utf8_lossy(b.content()).into_owned())
            else {
                continue;
            };
            if let Some(front) = crate::prompt::front_matter(&rel, &text) {
                changes.extend(powers::prefetch_widenings(
                    &self.settings,
                    &rel.to_string_lossy(),
                    &front.prefetch,
                ));
            }
        }
        Ok(RevisionPowers::of(revision, changes))
    }

    /// The key variables of the trusted providers, with their values in this
    /// process's environment (those set).
    fn keys(&self) -> Vec<(String, std::ffi::OsString)> {
        [Some(&self.settings.provider), self.settings.fallback.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|p| p.api_key_env.clone())
            .filter_map(|k| std::env::var_os(&k).map(|v| (k, v)))
            .collect()
    }

    /// `cmd` (an eval fire) with the allow-listed environment only: the locale and
    /// `PATH`, `home` as `HOME`, and with `live` (a case that calls the trusted model)
    /// the trusted key variables.
    pub fn environment(&self, cmd: &mut Command, home: &Path, live: bool) {
        cmd.env_clear();
        for k in crate::env::PASSTHROUGH_ENV {
            if let Some(v) = std::env::var_os(k) {
                cmd.env(k, v);
            }
        }
        cmd.env("HOME", home).env("GIT_CONFIG_NOSYSTEM", "1");
        if live {
            cmd.envs(self.keys());
        }
    }

    /// A redactor for what eval fires leave: the trusted key variables' values.
    pub fn redactor(&self) -> crate::secrets::Redactor {
        crate::fire::config::redactor(Some(&self.settings))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pinned(tools: &[serde_json::Value]) -> McpLock {
        let pin = crate::mcp::lock::ServerPin {
            command: vec!["srv".into()],
            command_digest: "sha256:0".into(),
            package: None,
            url: None,
            tools: tools
                .iter()
                .map(|t| (t["name"].as_str().unwrap().to_string(), crate::mcp::lock::pin_of(t)))
                .collect(),
        };
        McpLock {
            version: 1,
            servers: [("files".to_string(), pin)].into(),
        }
    }

    #[test]
    fn pin_changes_widen_on_a_new_tool_narrow_on_a_removed_one_and_widen_when_unreadable() {
        let echo = json!({"name": "echo", "inputSchema": {"type": "object", "properties": {}}});
        let row = json!({"name": "delete_row"});
        let trusted = TrustedLock {
            blob: Some(git2::Oid::hash_object(git2::ObjectType::Blob, b"trusted").unwrap()),
            lock: pinned(std::slice::from_ref(&echo)),
            commit: None,
        };
        let other = Some(git2::Oid::hash_object(git2::ObjectType::Blob, b"x").unwrap());
        let c = pin_changes(&trusted, other, Ok(pinned(&[echo.clone(), row.clone()])));
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].key.as_str(), c[0].effect, c[0].why.as_str()),
            ("mcp.files pins", Effect::Widens, "new tool `delete_row`")
        );
        assert_eq!(
            (c[0].before.as_str(), c[0].after.as_str()),
            ("[echo]", "[delete_row, echo]")
        );

        let c = pin_changes(&trusted, other, Ok(pinned(&[])));
        assert_eq!(
            (c[0].effect, c[0].why.as_str()),
            (Effect::Narrows, "tool `echo` removed")
        );

        let c = pin_changes(&trusted, other, Err("settings/mcp.lock:3: bad".into()));
        assert_eq!((c[0].key.as_str(), c[0].effect), (LOCK_FILE, Effect::Widens));
        assert!(c[0].why.starts_with("settings/mcp.lock:3: bad"), "{}", c[0].why);

        // The trusted lock's own blob changes nothing, whatever it holds.
        assert!(pin_changes(&trusted, trusted.blob, Err("unread".into())).is_empty());
    }
}
