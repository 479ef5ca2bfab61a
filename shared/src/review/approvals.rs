//! Approvals: one commit per approval on `refs/builder/approvals`, each holding one
//! file, `approval.yaml` (proposal, the approved tree of builder-owned paths, the
//! approver, the time, and the proposal's head commit for the record). Because they
//! are commits on a ref, they travel with fetch and push through the refspec
//! `+refs/builder/*:refs/builder/*` (see [`super::hooks`]). An approval covers only
//! the tree it names: a later commit to the proposal changes the tree and so is not
//! covered by it. Whether an approval counts at all is [`signing::ApprovalRule::judge`]'s call
//! (never the runtime identity; with signed approvals, only a valid signature by a key
//! the list [`super::trust`] picks names).

use super::signing;
use super::{ReviewError, APPROVALS_REF};
use crate::git::Person;
use crate::records::ApprovalRef;
use chrono::{DateTime, Utc};
use git2::{Oid, Repository, Signature};
use serde::{Deserialize, Serialize};

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

/// One approval as read from the ref.
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

/// Every approval reachable from `refs/builder/approvals`, oldest first. A commit
/// without a readable `approval.yaml` is skipped (it approves nothing).
pub fn load(repo: &Repository) -> Result<Vec<Approval>, git2::Error> {
    let tip = match repo.refname_to_id(APPROVALS_REF) {
        Ok(t) => t,
        Err(e) if e.code() == git2::ErrorCode::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut walk = repo.revwalk()?;
    walk.set_sorting(git2::Sort::TOPOLOGICAL | git2::Sort::REVERSE)?;
    walk.push(tip)?;
    let mut out = Vec::new();
    for oid in walk {
        let oid = oid?;
        let commit = repo.find_commit(oid)?;
        let tree = commit.tree()?;
        let Some(entry) = tree.get_name(APPROVAL_FILE) else {
            continue;
        };
        let Ok(blob) = repo.find_blob(entry.id()) else {
            continue;
        };
        match serde_yaml::from_slice::<ApprovalBody>(blob.content()) {
            Ok(body) => out.push(Approval { id: oid, body }),
            Err(e) => tracing::warn!(commit = %oid, error = %e, "an approval commit without a readable approval.yaml"),
        }
    }
    Ok(out)
}

/// The approvals in hand, looked up by tree. Whether one counts is judged by
/// [`super::trust::Trust`], which knows which allowed-signers list applies.
pub struct Approvals {
    all: Vec<Approval>,
}

impl Approvals {
    /// Reads the approvals of `repo`.
    pub fn read(repo: &Repository) -> Result<Approvals, git2::Error> {
        Ok(Approvals { all: load(repo)? })
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

/// Records an unsigned approval: a new commit on `refs/builder/approvals` (on top of
/// its tip) by `approver`. Returns the approval.
pub fn record(
    repo: &Repository,
    proposal: &str,
    tree: Oid,
    head: Oid,
    approver: &Person,
) -> Result<Approval, ReviewError> {
    write(repo, signed_body(proposal, tree, head, approver, None)?, approver)
}

/// Writes `body` as a new approval commit by `approver`.
pub fn write(repo: &Repository, body: ApprovalBody, approver: &Person) -> Result<Approval, ReviewError> {
    let tree = &body.tree;
    let proposal = &body.proposal;
    let yaml = serde_yaml::to_string(&body).map_err(|e| ReviewError::Refused(format!("approval YAML: {e}")))?;
    let blob = repo.blob(yaml.as_bytes())?;
    let mut tb = repo.treebuilder(None)?;
    tb.insert(APPROVAL_FILE, blob, 0o100644)?;
    let tree_obj = repo.find_tree(tb.write()?)?;
    let parent = match repo.refname_to_id(APPROVALS_REF) {
        Ok(p) => Some(repo.find_commit(p)?),
        Err(e) if e.code() == git2::ErrorCode::NotFound => None,
        Err(e) => return Err(e.into()),
    };
    let sig = Signature::now(&approver.name, &approver.email)?;
    let message =
        format!("Approve proposals/{proposal}: builder tree {tree}\n\nApproved-tree: {tree}\nApprover: {approver}\n");
    let parents: Vec<&git2::Commit> = parent.iter().collect();
    let id = repo.commit(Some(APPROVALS_REF), &sig, &sig, &message, &tree_obj, &parents)?;
    Ok(Approval { id, body })
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
