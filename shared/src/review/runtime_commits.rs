//! Runtime commits are authenticated (issue 17 item 5). Anyone who can push can author
//! a commit as the runtime, with a receipt it never wrote; `builder audit` judged such
//! a commit only by what it touched. With `runtime_identity.signing_key` (an SSH key on
//! the cron box), the runtime signs each records commit as git's SSH signing does: an
//! SSHSIG over the commit's text, in its `gpgsig` header. The namespace is
//! `builder-runtime`, not git's `git`: a signature made by the box's key then proves
//! "the runtime wrote this records commit" and nothing else (no commit signature git or
//! a forge would show as a person's, and no approval, which is `builder-approval`), and
//! a key listed for people's git signing does not vouch for runtime commits unless the
//! allowed-signers file names it for `builder-runtime`. The cost: `git log
//! --show-signature` checks namespace `git` and so cannot verify these; `builder audit`
//! does.
//!
//! Signing is done in-process with the `ssh-key` crate (no `ssh-keygen` child of the
//! sandboxed runtime), from an unencrypted key the runtime's account alone reads; a
//! key inside the repository is refused (tools read the repository). Verification is
//! the approvals' ([`super::signing::AllowedSigners::verify_in`]): a runtime-named
//! commit (author or committer is the runtime's name or email) whose own settings name
//! a signing key must carry a signature by a key the allowed-signers file of its own
//! tree (or the operator's absolute file) lists for the runtime's email; otherwise it
//! is forged. A change to that file is a builder change, judged by review like any
//! other. Without a key in the settings, runtime commits are unauthenticated, and
//! audit says so.

use super::signing::{AllowedSigners, DEFAULT_ALLOWED_SIGNERS};
use crate::diag::Diagnostic;
use crate::layout::SETTINGS_FILE;
use chrono::{DateTime, TimeZone, Utc};
use git2::{Oid, Repository};
use ssh_key::{HashAlg, LineEnding, PrivateKey, SshSig};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// The largest private key file read (an Ed25519 key is about 400 bytes, an RSA one
/// of 16384 bits about 13 KB).
const KEY_FILE_CAP: u64 = 64 * 1024;

/// The SSHSIG namespace of runtime commits.
pub const NAMESPACE: &str = "builder-runtime";

/// Why the runtime's signing key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("runtime_identity.signing_key {path}: {why}")]
    Unusable { path: PathBuf, why: String },
}

/// The absolute path `runtime_identity.signing_key` names (`~/` is `$HOME`).
pub fn key_path(setting: &str) -> PathBuf {
    match (setting.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => PathBuf::from(home).join(rest),
        _ => PathBuf::from(setting),
    }
}

/// Refuses a key file its group or other users may read or write, as OpenSSH refuses
/// an "unprotected private key file": a key others can read signs records as the box,
/// and one others can write is theirs to replace.
fn refuse_readable_by_others(file: &std::fs::File) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = file.metadata().map_err(|e| e.to_string())?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "mode {mode:04o} lets other users read or change the key (anyone who reads it signs records as this box): `chmod 600` it"
        ));
    }
    Ok(())
}

/// The runtime's signing key, loaded.
pub struct RuntimeKey {
    key: PrivateKey,
}

impl RuntimeKey {
    /// Loads the key `setting` names, refusing one inside the repository at `root`
    /// (every tool reads the repository) and an encrypted one (nobody is there to type
    /// a passphrase).
    pub fn load(setting: &str, root: &Path) -> Result<RuntimeKey, KeyError> {
        let path = key_path(setting);
        let unusable = |why: String| KeyError::Unusable {
            path: path.clone(),
            why,
        };
        let real = std::fs::canonicalize(&path).map_err(|e| unusable(e.to_string()))?;
        if let Ok(repo) = std::fs::canonicalize(root) {
            if real.starts_with(&repo) {
                return Err(unusable(
                    "the key lies inside the repository, where every tool can read it: keep it in the runtime account's home".into(),
                ));
            }
        }
        // A regular file of a key's size: a FIFO or a device named there must neither
        // hang nor flood the box.
        let file = crate::regular::open(&real, false).map_err(|e| unusable(e.to_string()))?;
        refuse_readable_by_others(&file).map_err(unusable)?;
        let text = crate::regular::read_open(&file, KEY_FILE_CAP).map_err(|e| unusable(e.to_string()))?;
        let key = PrivateKey::from_openssh(&text).map_err(|e| unusable(format!("not an OpenSSH private key: {e}")))?;
        if key.algorithm().is_rsa() {
            // Verifying a reviewer's RSA signature needs no secret; signing does, and
            // the RSA implementation at hand is not constant-time (RUSTSEC-2023-0071).
            return Err(unusable(
                "an RSA key: the runtime signs with Ed25519 or ECDSA P-256 keys only (`ssh-keygen -t ed25519`)".into(),
            ));
        }
        if key.is_encrypted() {
            return Err(unusable(
                "the key is encrypted: the runtime signs unattended, so use a key without a passphrase that only its account can read".into(),
            ));
        }
        Ok(RuntimeKey { key })
    }

    /// The key `setting` (`runtime_identity.signing_key`) names, to sign the box's
    /// commits with: `None` without a setting, or, warned, when the key cannot be used
    /// now (the fire checked it as it began): the commit is then made unsigned, which
    /// `builder audit` flags.
    pub fn for_commits(setting: Option<&str>, root: &Path) -> Option<RuntimeKey> {
        RuntimeKey::load(setting?, root)
            .map_err(|e| tracing::warn!(error = %e, "the runtime's commits are not signed"))
            .ok()
    }

    /// The armored SSHSIG of `commit_text` (a commit object's text without its
    /// signature), in namespace [`NAMESPACE`].
    pub fn sign(&self, commit_text: &str) -> Result<String, String> {
        SshSig::sign(&self.key, NAMESPACE, HashAlg::Sha512, commit_text.as_bytes())
            .and_then(|s| s.to_pem(LineEnding::LF))
            .map_err(|e| e.to_string())
    }

    /// Whether `armored` is this key's valid SSHSIG of `data` in [`NAMESPACE`].
    fn made(&self, data: &[u8], armored: &str) -> bool {
        SshSig::from_pem(armored).is_ok_and(|sig| self.key.public_key().verify(NAMESPACE, data, &sig).is_ok())
    }

    /// The key's fingerprint (SHA-256).
    pub fn fingerprint(&self) -> String {
        self.key.public_key().fingerprint(Default::default()).to_string()
    }
}

/// The runtime's signing keys on a box, for the commits its sync makes: the key of the
/// settings the fire runs under, and any other the tree of a commit the sync makes
/// names (a rotation of the key approved while the box held unpushed records, or
/// landed during a fire), each loaded once. `builder audit` judges a runtime commit by
/// the allowed signers of its own tree; a commit signed with the key of the tree it
/// carries passes it, where the fire's own key (rotated away there) would read as
/// forged.
pub struct RuntimeKeys {
    root: PathBuf,
    /// `runtime_identity.signing_key` of the fire's settings.
    own: Option<String>,
    loaded: std::cell::RefCell<HashMap<String, Option<Rc<RuntimeKey>>>>,
    /// The rule a remote tip is judged by before its settings may name the key of a
    /// commit the sync makes on it (a tip the box would not move to names nothing).
    rule: Option<super::signing::ApprovalRule>,
}

impl RuntimeKeys {
    /// The keys of the box whose repository is at `root`, firing under settings whose
    /// `runtime_identity.signing_key` is `own`.
    pub fn new(root: &Path, own: Option<&str>) -> RuntimeKeys {
        let keys = RuntimeKeys {
            root: root.to_path_buf(),
            own: own.filter(|k| !k.trim().is_empty()).map(str::to_string),
            loaded: Default::default(),
            rule: None,
        };
        if let Some(own) = keys.own.clone() {
            keys.key(&own);
        }
        keys
    }

    fn key(&self, setting: &str) -> Option<Rc<RuntimeKey>> {
        self.loaded
            .borrow_mut()
            .entry(setting.to_string())
            .or_insert_with(|| match RuntimeKey::load(setting, &self.root) {
                Ok(key) => Some(Rc::new(key)),
                Err(e) => {
                    tracing::warn!(error = %e, "a runtime signing key cannot be used");
                    None
                }
            })
            .clone()
    }

    /// Whether the box signs its records commits (its settings name a key it can
    /// use): then an unsigned runtime-named commit it did not make is a person's.
    pub fn signs(&self) -> bool {
        self.own().is_some()
    }

    /// Whether the commit `oid` carries a valid signature by a key of this box (the
    /// one it fires under, or one a rotation had it load): a commit of its own. A
    /// signature header alone says nothing: anyone can write one (helper-97: a
    /// forged records commit with a junk signature was replayed, and signed, as the
    /// box's own after a force push).
    pub fn signed_here(&self, repo: &Repository, oid: Oid) -> bool {
        let Ok((signature, data)) = repo.extract_signature(&oid, Some("gpgsig")) else {
            return false;
        };
        let Ok(armored) = std::str::from_utf8(&signature) else {
            return false;
        };
        if (self.loaded.borrow().values().flatten()).any(|key| key.made(&data, armored)) {
            return true;
        }
        // The key the commit's own settings name, if this box has it: a commit signed
        // before an approved rotation of the key (helper-99).
        let named = (repo.find_commit(oid).and_then(|c| c.tree()).ok())
            .and_then(|t| runtime_identity_of(repo, &t).ok())
            .and_then(|id| id.signing_key);
        named
            .and_then(|k| self.key(&k))
            .is_some_and(|key| key.made(&data, armored))
    }

    /// The key of the settings the box fires under.
    pub fn own(&self) -> Option<Rc<RuntimeKey>> {
        self.key(self.own.as_deref()?)
    }

    /// With the rule remote tips are judged by (see [`RuntimeKeys::rule`]).
    pub fn judging(mut self, rule: super::signing::ApprovalRule) -> RuntimeKeys {
        self.rule = Some(rule);
        self
    }

    /// The rule by which a remote tip must pass (the box would move to it) before its
    /// settings name the key of a commit the sync makes on it; `None`: no tip does.
    pub fn rule(&self) -> Option<&super::signing::ApprovalRule> {
        self.rule.as_ref()
    }

    /// The signer of a commit named by settings whose `runtime_identity.signing_key`
    /// is `setting` (a tip the box moves to, else its own branch; `None`: the box's
    /// own key): that key, falling back to the box's own when it is not here or
    /// cannot sign (warned: audit will flag the commit, and the records still reach
    /// the remote); `None` when neither key is here (the commit is made unsigned).
    pub fn signer(&self, setting: Option<&str>) -> Option<Box<crate::git::SignCommit<'static>>> {
        let named = setting.filter(|k| !k.trim().is_empty());
        let key = named.and_then(|k| self.key(k));
        if key.is_none() && named.is_some() && named != self.own.as_deref() {
            tracing::warn!(
                key = named.unwrap_or_default(),
                "the key the settings name cannot be used here: the box's own key signs"
            );
        }
        let own = self.own();
        if key.is_none() && own.is_none() {
            return None;
        }
        Some(Box::new(move |text: &str| {
            if let Some(key) = &key {
                match key.sign(text) {
                    Ok(sig) => return Ok(sig),
                    Err(e) => {
                        tracing::warn!(error = %e, "the key the settings name cannot sign: the box's own key signs")
                    }
                }
            }
            own.as_ref().ok_or_else(|| "no key can sign".to_string())?.sign(text)
        }))
    }
}

/// What audit makes of one runtime-named commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authenticity {
    /// A valid signature: the allowed-signers line and key that made it.
    Signed(String),
    /// Its settings name no signing key: nothing to check.
    Unauthenticated,
    /// Its settings name a signing key and it carries no valid signature: why.
    Forged(String),
}

/// What a commit's own settings say about runtime signatures.
#[derive(Debug, Clone, Default)]
struct Config {
    signed: bool,
    /// `review.allowed_signers` (the default path when it does not say).
    list: String,
}

/// The judge of runtime-named commits, with its memos (settings and lists by blob).
pub struct RuntimeSignatures<'r> {
    repo: &'r Repository,
    configs: HashMap<Oid, Config>,
    lists: HashMap<String, Rc<Result<AllowedSigners, Diagnostic>>>,
}

impl<'r> RuntimeSignatures<'r> {
    pub fn new(repo: &'r Repository) -> RuntimeSignatures<'r> {
        RuntimeSignatures {
            repo,
            configs: HashMap::new(),
            lists: HashMap::new(),
        }
    }

    fn config(&mut self, tree: &git2::Tree) -> Result<Config, git2::Error> {
        let id = match tree.get_path(Path::new(SETTINGS_FILE)) {
            Ok(e) => e.id(),
            Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(Config::default()),
            Err(e) => return Err(e),
        };
        if let Some(c) = self.configs.get(&id) {
            return Ok(c.clone());
        }
        let yaml = crate::yamlpos::lenient_value(self.repo.find_blob(id)?.content());
        let signed = yaml
            .as_ref()
            .and_then(|v| v.get("runtime_identity"))
            .and_then(|r| r.get("signing_key"))
            .and_then(serde_yaml::Value::as_str)
            .is_some_and(|k| !k.trim().is_empty());
        let list = yaml
            .as_ref()
            .and_then(|v| v.get("review"))
            .and_then(|r| r.get("allowed_signers"))
            .and_then(serde_yaml::Value::as_str)
            .unwrap_or(DEFAULT_ALLOWED_SIGNERS)
            .to_string();
        let c = Config { signed, list };
        self.configs.insert(id, c.clone());
        Ok(c)
    }

    fn list(&mut self, commit: &git2::Commit, tree: &git2::Tree, rel: &str) -> Rc<Result<AllowedSigners, Diagnostic>> {
        let key = if Path::new(rel).is_absolute() {
            rel.to_string()
        } else {
            match tree.get_path(Path::new(rel)) {
                Ok(e) => e.id().to_string(),
                Err(_) => format!("missing:{rel}"),
            }
        };
        if let Some(hit) = self.lists.get(&key) {
            return hit.clone();
        }
        let list = Rc::new(if Path::new(rel).is_absolute() {
            AllowedSigners::load_absolute(Path::new(rel))
        } else {
            AllowedSigners::from_tree(self.repo, commit.id(), tree, rel)
        });
        self.lists.insert(key, list.clone());
        list
    }

    /// The verdict on `commit`, named as the runtime (`runtime_email`), by its own
    /// settings alone.
    pub fn judge(&mut self, commit: &git2::Commit, runtime_email: &str) -> Result<Authenticity, git2::Error> {
        self.judge_under(commit, runtime_email, &[])
    }

    /// The verdict on `commit` by the strictest of its own settings and those of the
    /// commits in `floors` ([`Floors`]): a commit made on an old base whose settings
    /// name no key is still held to the key of the history it was brought into.
    /// Signed when any list that asks for a signature accepts its signature.
    pub fn judge_under(
        &mut self,
        commit: &git2::Commit,
        runtime_email: &str,
        floors: &[Oid],
    ) -> Result<Authenticity, git2::Error> {
        let own = commit.tree()?;
        let mut verdict = self.judge_by(commit, &own, runtime_email)?;
        for floor in floors {
            if matches!(verdict, Authenticity::Signed(_)) {
                break;
            }
            let tree = self.repo.find_commit(*floor)?.tree()?;
            match (self.judge_by(commit, &tree, runtime_email)?, &verdict) {
                (Authenticity::Unauthenticated, _) => {}
                (floor_verdict, Authenticity::Unauthenticated) => {
                    verdict = match floor_verdict {
                        Authenticity::Forged(why) => Authenticity::Forged(format!(
                            "{why} (its own settings name no key, but the history it came into, at {}, does)",
                            crate::text::short_oid(*floor)
                        )),
                        v => v,
                    }
                }
                (Authenticity::Signed(line), _) => verdict = Authenticity::Signed(line),
                (Authenticity::Forged(_), _) => {}
            }
        }
        Ok(verdict)
    }

    /// The verdict on `commit` by the settings (and allowed-signers list) in `tree`.
    fn judge_by(
        &mut self,
        commit: &git2::Commit,
        tree: &git2::Tree,
        runtime_email: &str,
    ) -> Result<Authenticity, git2::Error> {
        let config = self.config(tree)?;
        if !config.signed {
            return Ok(Authenticity::Unauthenticated);
        }
        let (signature, data) = match self.repo.extract_signature(&commit.id(), Some("gpgsig")) {
            Ok(found) => found,
            Err(e) if e.code() == git2::ErrorCode::NotFound => {
                return Ok(Authenticity::Forged(
                    "it is not signed, and its settings name runtime_identity.signing_key".into(),
                ))
            }
            Err(e) => return Err(e),
        };
        let Ok(armored) = std::str::from_utf8(&signature) else {
            return Ok(Authenticity::Forged("its signature is not text".into()));
        };
        let list = self.list(commit, tree, &config.list);
        let list = match list.as_ref() {
            Ok(l) => l,
            Err(d) => {
                return Ok(Authenticity::Forged(format!(
                    "no allowed-signers list to judge it by: {d}"
                )))
            }
        };
        let time = commit.committer().when();
        let at: DateTime<Utc> = Utc.timestamp_opt(time.seconds(), 0).single().unwrap_or_default();
        Ok(match list.verify_in(NAMESPACE, runtime_email, at, &data, armored) {
            Ok(line) => Authenticity::Signed(line),
            Err(why) => Authenticity::Forged(why),
        })
    }
}

/// The commits whose settings a runtime-named commit is held to besides its own
/// ([`RuntimeSignatures::judge_under`]). Anyone who can push can author a commit as
/// the runtime on an old base whose settings name no signing key, and bring it into
/// the branch with an ordinary merge: by its own settings it is only unauthenticated.
/// So, for a push, every new commit is held to the settings of the commits the remote
/// already has (its branch). And a commit off the branch's first-parent chain is held
/// to the settings of the chain where it came in (the first parent of the merge that
/// brought it): in all of history that cannot tell a forgery from records a box made
/// before it had the key and a person merged later, so that verdict is a warning.
#[derive(Debug)]
pub struct Floors {
    /// Off-chain commit -> the first parent of the merge that brought it in.
    entered_at: HashMap<Oid, Oid>,
    /// The commits the other side already has (the remote's tips, for a push).
    known: Vec<Oid>,
}

impl Floors {
    /// The floors of the commits reachable from `tip` and from none of `known`.
    pub fn of(repo: &Repository, tip: Oid, known: &[Oid]) -> Result<Floors, git2::Error> {
        let known: Vec<Oid> = known.iter().copied().filter(|k| repo.find_commit(*k).is_ok()).collect();
        let mut chain = Vec::new();
        let mut next = Some(tip);
        while let Some(oid) = next.filter(|o| !known.contains(o)) {
            let commit = repo.find_commit(oid)?;
            if commit.parent_count() > 1 {
                chain.push(commit.parent_ids().collect::<Vec<_>>());
            }
            next = commit.parent_ids().next();
        }
        let mut entered_at = HashMap::new();
        // Oldest merge first: what an older merge brought is behind every later
        // merge's first parent, so each commit is found once, where it came in.
        for parents in chain.iter().rev() {
            let mut walk = repo.revwalk()?;
            for other in &parents[1..] {
                walk.push(*other)?;
            }
            walk.hide(parents[0])?;
            for k in &known {
                walk.hide(*k)?;
            }
            for oid in walk {
                entered_at.entry(oid?).or_insert(parents[0]);
            }
        }
        Ok(Floors { entered_at, known })
    }

    /// The commits the other side already has: every new commit is held to their
    /// settings.
    pub fn known(&self) -> &[Oid] {
        &self.known
    }

    /// For a commit off the first-parent chain: the chain's commit where it came in.
    pub fn entry(&self, commit: Oid) -> Option<Oid> {
        self.entered_at.get(&commit).copied()
    }
}

/// The runtime identity the settings in `tree` name, read leniently (defaults for
/// what they do not say, or when they do not parse): for history walks, and for a
/// fire whose settings did not load, which still signs its refusal's commit.
pub fn runtime_identity_of(repo: &Repository, tree: &git2::Tree) -> Result<crate::settings::Identity, git2::Error> {
    let default = crate::settings::Identity::default();
    let yaml = match tree.get_path(Path::new(SETTINGS_FILE)) {
        Ok(e) => crate::yamlpos::lenient_value(repo.find_blob(e.id())?.content()),
        Err(e) if e.code() == git2::ErrorCode::NotFound => None,
        Err(e) => return Err(e),
    };
    let field = |k: &str| {
        yaml.as_ref()
            .and_then(|v| v.get("runtime_identity"))
            .and_then(|r| r.get(k))
            .and_then(serde_yaml::Value::as_str)
            .map(str::to_string)
    };
    Ok(crate::settings::Identity {
        name: field("name").unwrap_or(default.name),
        email: field("email").unwrap_or(default.email),
        signing_key: field("signing_key"),
    })
}

/// Whether `commit` wrote the run record `change` holds as a person: not named as the
/// runtime, the path a receipt or a run's report (in `reports/`, or the fallback
/// beside the receipt) added or rewritten, or a card added or rewritten beyond its
/// triage ([`beyond_triage`]; a deletion prunes, it forges nothing), and, for a merge,
/// held by no other parent (a `git pull` brings the runtime's records from the
/// origin; only content no parent had is the merge's own).
pub fn record_written_by_a_person(
    repo: &Repository,
    commit: &git2::Commit,
    change: &crate::git::TreeChange,
    runtime: (&str, &str),
) -> Result<bool, git2::Error> {
    let path = change.path.as_str();
    let run_record = crate::layout::is_receipt_path(path)
        || crate::records::is_report_path(path)
        || crate::records::is_fallback_report_path(path);
    let card = crate::records::is_card_path(path);
    if runtime_named(commit, runtime.0, runtime.1)
        || !(run_record || card)
        || change.kind == crate::git::ChangeKind::Deleted
    {
        return Ok(false);
    }
    let Some((blob, _)) = change.new else {
        return Ok(false);
    };
    if card && change.kind != crate::git::ChangeKind::Added {
        if let Some((old, _)) = change.old {
            if !beyond_triage(repo, old, blob)? {
                return Ok(false);
            }
        }
    }
    for parent in commit.parents().skip(1) {
        match parent.tree()?.get_path(Path::new(&change.path)) {
            Ok(e) if e.id() == blob => return Ok(false),
            Ok(_) => {}
            Err(e) if e.code() == git2::ErrorCode::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// The fields of a card people change when they triage it (`builder cards triage`):
/// everything else is what the runtime saw.
const TRIAGE_FIELDS: [&str; 3] = ["status", "triage", "triage_history"];

/// Whether the card blob `new` differs from `old` in more than its triage: its kind,
/// summary, detail or evidence rewritten (or a text that is no card at all).
fn beyond_triage(repo: &Repository, old: Oid, new: Oid) -> Result<bool, git2::Error> {
    let fields = |id: Oid| -> Result<Option<serde_yaml::Mapping>, git2::Error> {
        let blob = repo.find_blob(id)?;
        let mut map = match serde_yaml::from_slice::<serde_yaml::Value>(blob.content()) {
            Ok(serde_yaml::Value::Mapping(m)) => m,
            _ => return Ok(None),
        };
        for f in TRIAGE_FIELDS {
            map.remove(f);
        }
        Ok(Some(map))
    };
    Ok(match (fields(old)?, fields(new)?) {
        (Some(a), Some(b)) => a != b,
        _ => true,
    })
}

/// Whether `commit` is named as the runtime: its author or committer carries the
/// runtime's name or email (emails compared case-insensitively).
pub fn runtime_named(commit: &git2::Commit, name: &str, email: &str) -> bool {
    [commit.author(), commit.committer()]
        .iter()
        .any(|p| p.name().is_ok_and(|n| n == name) || p.email().is_ok_and(|e| super::same_person(e, email)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::signing::test_keys::keygen;

    #[test]
    fn a_key_file_other_users_may_read_or_write_is_refused_and_a_private_one_loads() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let Some((key, _)) = keygen(dir.path(), "box") else {
            return;
        };
        let repo = dir.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        for mode in [0o644, 0o640, 0o602] {
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(mode)).unwrap();
            let err = RuntimeKey::load(key.to_str().unwrap(), &repo).err().expect("refused");
            assert!(err.to_string().contains(&format!("mode {mode:04o}")), "{err}");
            assert!(err.to_string().contains("chmod 600"), "{err}");
        }
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(RuntimeKey::load(key.to_str().unwrap(), &repo).is_ok());
    }

    #[test]
    fn an_rsa_key_does_not_sign_the_runtimes_commits() {
        let dir = tempfile::tempdir().unwrap();
        let Some((key, _)) = crate::review::signing::test_keys::keygen_of(dir.path(), "box", "rsa") else {
            return;
        };
        let repo = dir.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        let err = RuntimeKey::load(key.to_str().unwrap(), &repo).err().expect("refused");
        assert!(err.to_string().contains("an RSA key"), "{err}");
    }

    #[test]
    fn a_signed_runtime_commit_verifies_and_an_unsigned_or_foreign_one_is_forged() {
        let dir = tempfile::tempdir().unwrap();
        let Some((key, public)) = keygen(dir.path(), "box") else {
            return;
        };
        let (other, _) = keygen(dir.path(), "other").unwrap();
        let repo = Repository::init(dir.path().join("r")).unwrap();
        let settings = format!(
            "version: 1\nruntime_identity: {{name: runtime, email: runtime@localhost, signing_key: {}}}\n",
            key.display()
        );
        let signers = format!("runtime@localhost namespaces=\"{NAMESPACE}\" {public}");
        let mut update = git2::build::TreeUpdateBuilder::new();
        update.upsert(
            SETTINGS_FILE,
            repo.blob(settings.as_bytes()).unwrap(),
            git2::FileMode::Blob,
        );
        update.upsert(
            "settings/allowed_signers",
            repo.blob(signers.as_bytes()).unwrap(),
            git2::FileMode::Blob,
        );
        let empty = repo.treebuilder(None).unwrap().write().unwrap();
        let tree = update.create_updated(&repo, &repo.find_tree(empty).unwrap()).unwrap();
        let tree = repo.find_tree(tree).unwrap();
        let sig = git2::Signature::now("runtime", "runtime@localhost").unwrap();
        let root = dir.path().join("r");
        let with = |k: &Path| {
            let rk = RuntimeKey::load(k.to_str().unwrap(), &root).unwrap();
            let sign = move |t: &str| rk.sign(t);
            crate::git::commit_object(&repo, &sig, &sig, "runtime: t", &tree, &[], Some(&sign)).unwrap()
        };
        let good = with(&key);
        let foreign = with(&other);
        let bare = crate::git::commit_object(&repo, &sig, &sig, "runtime: t", &tree, &[], None).unwrap();
        let mut judge = RuntimeSignatures::new(&repo);
        let verdict = |c: Oid, judge: &mut RuntimeSignatures| {
            judge.judge(&repo.find_commit(c).unwrap(), "runtime@localhost").unwrap()
        };
        assert!(matches!(verdict(good, &mut judge), Authenticity::Signed(_)));
        match verdict(foreign, &mut judge) {
            Authenticity::Forged(why) => assert!(why.contains("is not in settings/allowed_signers"), "{why}"),
            v => panic!("{v:?}"),
        }
        match verdict(bare, &mut judge) {
            Authenticity::Forged(why) => assert!(why.contains("not signed"), "{why}"),
            v => panic!("{v:?}"),
        }
        // git reads the header back as a signature over the same text.
        let (_, data) = repo.extract_signature(&good, Some("gpgsig")).unwrap();
        assert!(std::str::from_utf8(&data).unwrap().contains("runtime: t"));
        // A key inside the repository is refused.
        std::fs::copy(&key, root.join("k")).unwrap();
        assert!(RuntimeKey::load(root.join("k").to_str().unwrap(), &root)
            .err()
            .unwrap()
            .to_string()
            .contains("inside the repository"));
    }
}
