//! Approvals: one commit per approval, each holding one file, `approval.yaml`
//! (proposal, the approved tree of builder-owned paths, the approver, the time, and
//! the proposal's head commit for the record), each on a ref of its own,
//! `refs/builder/approved/<commit id>`, created once and never moved or deleted. Two
//! people's approvals are two refs, so no fetch, pull or push in any order replaces
//! one: they travel through the non-forced refspec [`super::APPROVALS_REFSPEC`] (see
//! [`super::hooks`]), which only ever adds refs. The legacy chain
//! `refs/builder/approvals` (every approval a commit on the one before, force-moved
//! by fetches) is still read, never written, and converted once into per-approval
//! refs ([`adopt_legacy`]). An approval covers only the tree it names: a later commit
//! to the proposal changes the tree and so is not covered by it. Whether an approval
//! counts at all is [`signing::ApprovalRule::judge`]'s call (never the runtime
//! identity; with signed approvals, only a valid signature by a key the list
//! [`super::trust`] picks names). Reading is cached per repository, keyed by the
//! approval refs and their targets: a fire's several judges read them once.

use super::signing;
use super::{ReviewError, APPROVALS_REF, APPROVED_PREFIX};
use crate::git::Person;
use crate::records::ApprovalRef;
use chrono::{DateTime, Utc};
use git2::{Oid, Repository, Signature};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// The file each approval commit holds.
pub const APPROVAL_FILE: &str = "approval.yaml";

/// The YAML body of one approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalBody {
    /// The proposal's name (without `proposals/`).
    pub proposal: String,
    /// The approved tree of builder-owned paths (full id).
    pub tree: String,
    /// `Name <email>`.
    pub approver: String,
    pub approved_at: DateTime<Utc>,
    /// The proposal's head commit when it was approved.
    #[serde(default)]
    pub head: Option<String>,
    /// The armored SSHSIG signature of [`signing::payload`], when signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signature: Option<String>,
}

/// One approval as read from its ref.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Approval {
    /// The approval's commit id.
    pub id: Oid,
    pub body: ApprovalBody,
}

impl Approval {
    /// What a receipt records of it.
    pub fn as_ref(&self) -> ApprovalRef {
        ApprovalRef {
            id: self.id.to_string(),
            tree: self.body.tree.clone(),
            approver: self.body.approver.clone(),
        }
    }

    /// The approver's email (empty when the body's approver is malformed).
    pub fn approver_email(&self) -> String {
        super::parse_person(&self.body.approver)
            .map(|p| p.email)
            .unwrap_or_default()
    }
}

/// The ref of the approval `id`.
pub fn approval_ref(id: Oid) -> String {
    format!("{APPROVED_PREFIX}{id}")
}

/// The approval id an approval ref's name holds: `refs/builder/approved/<id>`, the
/// id in full (40 or 64 hex digits) and nothing below it. Builder writes no other
/// name; another is someone's push, and names no approval.
pub fn named_id(name: &str) -> Option<Oid> {
    let id = name.strip_prefix(APPROVED_PREFIX)?;
    let hex = matches!(id.len(), 40 | 64) && id.bytes().all(|b| b.is_ascii_hexdigit());
    hex.then(|| Oid::from_str(id).ok()).flatten()
}

/// What the approvals of a repository are read from: every approval ref with its
/// target, and the legacy chain's tip. Two equal keys read to equal approvals
/// (objects are named by their content).
#[derive(Debug, Clone, PartialEq, Eq)]
struct RefsKey {
    refs: Vec<(String, Oid)>,
    legacy: Option<Oid>,
}

fn refs_key(repo: &Repository) -> Result<RefsKey, git2::Error> {
    let mut refs = Vec::new();
    for r in repo.references_glob(&format!("{APPROVED_PREFIX}*"))? {
        let r = r?;
        if let (Ok(name), Some(target)) = (r.name(), r.target()) {
            refs.push((name.to_string(), target));
        }
    }
    refs.sort();
    let legacy = match repo.refname_to_id(APPROVALS_REF) {
        Ok(t) => Some(t),
        Err(e) if e.code() == git2::ErrorCode::NotFound => None,
        Err(e) => return Err(e),
    };
    Ok(RefsKey { refs, legacy })
}

type Cache = Mutex<HashMap<PathBuf, (RefsKey, Arc<Vec<Approval>>)>>;

/// The approvals read per repository (by its common git directory), with the refs
/// they were read from.
fn cache() -> &'static Cache {
    static CACHE: OnceLock<Cache> = OnceLock::new();
    CACHE.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The approval the commit `oid` holds, `None` when it holds no readable
/// `approval.yaml` (it approves nothing), or is no commit at all: anyone who can push
/// a ref can point one at a blob, and such a ref must not stop every fire and every
/// judge of the repository that fetched it (approvals are never pruned).
fn read_one(repo: &Repository, oid: Oid) -> Result<Option<Approval>, git2::Error> {
    let commit = match repo.find_commit(oid) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(object = %oid, error = %e, "an approval ref that names no commit (ignored)");
            return Ok(None);
        }
    };
    let tree = commit.tree()?;
    let Some(entry) = tree.get_name(APPROVAL_FILE) else {
        return Ok(None);
    };
    let Ok(blob) = repo.find_blob(entry.id()) else {
        return Ok(None);
    };
    match serde_yaml::from_slice::<ApprovalBody>(blob.content()) {
        Ok(body) => Ok(Some(Approval { id: oid, body })),
        Err(e) => {
            tracing::warn!(commit = %oid, error = %e, "an approval commit without a readable approval.yaml");
            Ok(None)
        }
    }
}

/// The approvals on the legacy chain from `tip`, oldest first.
fn legacy_chain(repo: &Repository, tip: Oid) -> Result<Vec<Approval>, git2::Error> {
    if let Err(e) = repo.find_commit(tip) {
        tracing::warn!(object = %tip, error = %e, "the legacy approvals ref names no commit (ignored)");
        return Ok(Vec::new());
    }
    let mut walk = repo.revwalk()?;
    walk.set_sorting(git2::Sort::TOPOLOGICAL | git2::Sort::REVERSE)?;
    walk.push(tip)?;
    let mut out = Vec::new();
    for oid in walk {
        if let Some(a) = read_one(repo, oid?)? {
            out.push(a);
        }
    }
    Ok(out)
}

fn read_uncached(repo: &Repository, key: &RefsKey) -> Result<Vec<Approval>, git2::Error> {
    let mut out = match key.legacy {
        Some(tip) => legacy_chain(repo, tip)?,
        None => Vec::new(),
    };
    let mut seen: HashSet<Oid> = out.iter().map(|a| a.id).collect();
    let mut own = Vec::new();
    for (name, target) in &key.refs {
        // The approval is the commit the name holds, wherever the ref points now:
        // an origin takes a fast-forward of the ref from anyone who can push (a
        // child commit of theirs on it), and every clone's plain fetch follows it
        // (helper-95). The named commit stays in the object store as its parent.
        let Some(id) = named_id(name) else {
            tracing::warn!(name, "a ref under the approvals that names no approval (ignored)");
            continue;
        };
        if id != *target {
            tracing::warn!(name, now = %target, "an approval ref moved off its approval (someone's push): the approval its name holds is read");
        }
        if seen.insert(id) {
            if let Some(a) = read_one(repo, id)? {
                own.push(a);
            }
        }
    }
    own.sort_by_key(|a| (a.body.approved_at, a.id));
    out.extend(own);
    Ok(out)
}

/// Every approval the repository has: the legacy chain's, oldest first, then those
/// on `refs/builder/approved/*` not already on it, by time. A commit without a
/// readable `approval.yaml` is skipped (it approves nothing).
pub fn load(repo: &Repository) -> Result<Vec<Approval>, git2::Error> {
    Ok(load_shared(repo)?.as_ref().clone())
}

fn load_shared(repo: &Repository) -> Result<Arc<Vec<Approval>>, git2::Error> {
    let key = refs_key(repo)?;
    let dir = repo.commondir().to_path_buf();
    if let Ok(cached) = cache().lock() {
        if let Some((k, all)) = cached.get(&dir) {
            if *k == key {
                return Ok(all.clone());
            }
        }
    }
    let all = Arc::new(read_uncached(repo, &key)?);
    if let Ok(mut cached) = cache().lock() {
        cached.insert(dir, (key, all.clone()));
    }
    Ok(all)
}

/// The approvals in hand, looked up by tree. Whether one counts is judged by
/// [`super::trust::Trust`], which knows which allowed-signers list applies.
pub struct Approvals {
    all: Arc<Vec<Approval>>,
}

impl Approvals {
    /// Reads the approvals of `repo` (every one it has, the legacy chain's included),
    /// from the cache when its approval refs have not changed since the last read.
    pub fn read(repo: &Repository) -> Result<Approvals, git2::Error> {
        Ok(Approvals {
            all: load_shared(repo)?,
        })
    }

    /// Every approval, in [`load`]'s order.
    pub fn all(&self) -> &[Approval] {
        &self.all
    }

    /// The approvals naming `tree`, newest first, with their index (stable for the
    /// life of this value).
    pub fn naming(&self, tree: Oid) -> impl Iterator<Item = (usize, &Approval)> + '_ {
        let tree = tree.to_string();
        self.all
            .iter()
            .enumerate()
            .rev()
            .filter(move |(_, a)| a.body.tree == tree)
    }

    /// Every tree some approval names (whether or not it counts).
    pub fn trees(&self) -> std::collections::HashSet<Oid> {
        self.all
            .iter()
            .filter_map(|a| Oid::from_str(&a.body.tree).ok())
            .collect()
    }

    /// Whether any approval carries a signature.
    pub fn any_signed(&self) -> bool {
        self.all.iter().any(|a| a.body.signature.is_some())
    }

    /// Every approval of the proposal `name`, oldest first.
    pub fn of_proposal<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Approval> + 'a {
        self.all.iter().filter(move |a| a.body.proposal == name)
    }
}

/// How an approval is signed: the key file and git's signing program.
#[derive(Debug, Clone)]
pub struct Signing {
    pub key: std::path::PathBuf,
    pub program: String,
}

/// The body of an approval made now, signed with `signing` when given.
pub fn signed_body(
    proposal: &str,
    tree: Oid,
    head: Oid,
    approver: &Person,
    signing: Option<&Signing>,
) -> Result<ApprovalBody, ReviewError> {
    let mut body = ApprovalBody {
        proposal: proposal.to_string(),
        tree: tree.to_string(),
        approver: approver.to_string(),
        approved_at: Utc::now(),
        head: Some(head.to_string()),
        signature: None,
    };
    if let Some(s) = signing {
        body.signature =
            Some(signing::sign(&body, &s.key, &s.program).map_err(|e| ReviewError::Refused(e.to_string()))?);
    }
    Ok(body)
}

/// Records an unsigned approval by `approver` (a commit on a ref of its own). Returns
/// the approval.
pub fn record(
    repo: &Repository,
    proposal: &str,
    tree: Oid,
    head: Oid,
    approver: &Person,
) -> Result<Approval, ReviewError> {
    write(repo, signed_body(proposal, tree, head, approver, None)?, approver)
}

/// Writes `body` as a new approval commit by `approver` (a commit of its own, with no
/// parent) and creates its ref `refs/builder/approved/<id>` (never replacing one).
/// The ref's lock is named in an intent record first (in the work tree's
/// `.runtime/locks`), so a process killed holding it leaves nothing the next run
/// cannot remove ([`crate::git::recover_stale_locks`]).
pub fn write(repo: &Repository, body: ApprovalBody, approver: &Person) -> Result<Approval, ReviewError> {
    let tree = &body.tree;
    let proposal = &body.proposal;
    let yaml = serde_yaml::to_string(&body).map_err(|e| ReviewError::Refused(format!("approval YAML: {e}")))?;
    let blob = repo.blob(yaml.as_bytes())?;
    let mut tb = repo.treebuilder(None)?;
    tb.insert(APPROVAL_FILE, blob, 0o100644)?;
    let tree_obj = repo.find_tree(tb.write()?)?;
    let sig = Signature::now(&approver.name, &approver.email)?;
    let message =
        format!("Approve proposals/{proposal}: builder tree {tree}\n\nApproved-tree: {tree}\nApprover: {approver}\n");
    let id = repo.commit(None, &sig, &sig, &message, &tree_obj, &[])?;
    crate::failpoint!("approve-before-ref");
    create_ref(repo, id, &format!("approval {}", body.proposal))?;
    crate::failpoint!("approve-after-ref");
    Ok(Approval { id, body })
}

/// Creates `refs/builder/approved/<id>` for the approval commit `id`, under an
/// intent record naming its lock; an existing ref with that target is kept.
fn create_ref(repo: &Repository, id: Oid, log: &str) -> Result<(), ReviewError> {
    let name = approval_ref(id);
    let _intent = match repo.workdir() {
        Some(_) => Some(crate::git::LockIntent::hold(
            &super::work::intent_dir(repo),
            &[crate::git::lock_file_of(&repo.commondir().join(&name))],
        )?),
        None => None,
    };
    match repo.reference(&name, id, false, log) {
        Ok(_) => Ok(()),
        Err(e) if e.code() == git2::ErrorCode::Exists && repo.refname_to_id(&name).ok() == Some(id) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Gives each approval of the legacy chain `refs/builder/approvals` a ref of its own
/// (once: later calls find them made). Returns how many refs were created. The chain
/// itself is left as it is, read as before.
pub fn adopt_legacy(repo: &Repository) -> Result<usize, ReviewError> {
    let tip = match repo.refname_to_id(APPROVALS_REF) {
        Ok(t) => t,
        Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let mut made = 0;
    for a in legacy_chain(repo, tip)? {
        if repo.refname_to_id(&approval_ref(a.id)).is_err() {
            create_ref(repo, a.id, "adopt the legacy approvals chain")?;
            made += 1;
        }
    }
    Ok(made)
}

/// Every approval ref this repository has (`refs/builder/approved/*`), by name.
pub fn local_refs(repo: &Repository) -> Result<Vec<(String, Oid)>, git2::Error> {
    Ok(refs_key(repo)?.refs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_approval_round_trips_and_covers_only_its_tree() {
        let dir = tempfile::tempdir().unwrap();
        let repo = Repository::init(dir.path()).unwrap();
        let t1 = repo.treebuilder(None).unwrap().write().unwrap();
        let blob = repo.blob(b"x").unwrap();
        let mut tb = repo.treebuilder(None).unwrap();
        tb.insert("a", blob, 0o100644).unwrap();
        let t2 = tb.write().unwrap();
        let ann = Person {
            name: "Ann".into(),
            email: "ann@example.com".into(),
        };
        assert!(load(&repo).unwrap().is_empty());
        let a = record(&repo, "p", t1, t1, &ann).unwrap();
        let rt = Person {
            name: "runtime".into(),
            email: "RUNTIME@localhost".into(),
        };
        record(&repo, "q", t2, t2, &rt).unwrap();
        let all = Approvals::read(&repo).unwrap();
        let rule = signing::ApprovalRule::unsigned("runtime@localhost");
        let counting = |t| {
            all.naming(t)
                .find(|(_, x)| rule.judge(&x.body, None).is_ok())
                .map(|(_, x)| x.clone())
        };
        assert_eq!(counting(t1).map(|x| x.id), Some(a.id));
        assert!(counting(t2).is_none(), "the runtime's approval never counts");
        assert_eq!(all.of_proposal("p").count(), 1);
        assert_eq!(counting(t1).unwrap().as_ref().approver, "Ann <ann@example.com>");
    }
}
