//! Runtime records (DESIGN.md section 6): the run receipt (`runs/<task>/<day>/<id>.json`)
//! and failure cards (`cards/<day>/<id>.yaml`), their ids and fingerprints, and the
//! create-only writer. The runtime never rewrites a record once written; only the
//! builder adds a `triage` block to a card later.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    Accepted,
    Completed,
    Failed,
    Skipped,
    WaitingApproval,
    Cancelled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    FinalAnswer,
    MaxSteps,
    MaxWallTime,
    TokenBudget,
    CostBudget,
    RepeatedCall,
    RepeatedError,
    Cancelled,
    PermissionDenied,
    ProviderError,
    /// The model server refused a request for its length.
    ContextOverflow,
    WaitingApproval,
    /// The fire stopped before the loop (bad config, dirty tree, prefetch, sandbox).
    NotStarted,
}

impl StopReason {
    pub fn as_str(&self) -> &'static str {
        match self {
            StopReason::FinalAnswer => "final_answer",
            StopReason::MaxSteps => "max_steps",
            StopReason::MaxWallTime => "max_wall_time",
            StopReason::TokenBudget => "token_budget",
            StopReason::CostBudget => "cost_budget",
            StopReason::RepeatedCall => "repeated_call",
            StopReason::RepeatedError => "repeated_error",
            StopReason::Cancelled => "cancelled",
            StopReason::PermissionDenied => "permission_denied",
            StopReason::ProviderError => "provider_error",
            StopReason::ContextOverflow => "context_overflow",
            StopReason::WaitingApproval => "waiting_approval",
            StopReason::NotStarted => "not_started",
        }
    }
}

impl RunStatus {
    pub fn as_str(&self) -> &'static str {
        match self {
            RunStatus::Accepted => "accepted",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Skipped => "skipped",
            RunStatus::WaitingApproval => "waiting_approval",
            RunStatus::Cancelled => "cancelled",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum CardKind {
    PermissionDenied,
    MissingTool,
    BudgetExceeded,
    MaxSteps,
    RepeatedCall,
    RepeatedError,
    ProviderError,
    PrefetchFailed,
    AcceptanceFailed,
    InvalidConfig,
    UnreviewedChanges,
    SandboxUnavailable,
    SideEffectUncertain,
    ApprovalNeeded,
    Crashed,
    /// The fire completed with an empty final answer: a report that says nothing.
    EmptyReport,
    /// The model server refused a request for its length.
    ContextOverflow,
}

impl CardKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            CardKind::PermissionDenied => "permission_denied",
            CardKind::MissingTool => "missing_tool",
            CardKind::BudgetExceeded => "budget_exceeded",
            CardKind::MaxSteps => "max_steps",
            CardKind::RepeatedCall => "repeated_call",
            CardKind::RepeatedError => "repeated_error",
            CardKind::ProviderError => "provider_error",
            CardKind::PrefetchFailed => "prefetch_failed",
            CardKind::AcceptanceFailed => "acceptance_failed",
            CardKind::InvalidConfig => "invalid_config",
            CardKind::UnreviewedChanges => "unreviewed_changes",
            CardKind::SandboxUnavailable => "sandbox_unavailable",
            CardKind::SideEffectUncertain => "side_effect_uncertain",
            CardKind::ApprovalNeeded => "approval_needed",
            CardKind::Crashed => "crashed",
            CardKind::EmptyReport => "empty_report",
            CardKind::ContextOverflow => "context_overflow",
        }
    }
}

/// Versions a fire ran on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Inputs {
    pub commit: Option<String>,
    pub prompt: Option<String>,
    pub scope: Option<String>,
    pub settings: Option<String>,
    pub provider: String,
    pub model: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// `fully_enforced`, `partially_enforced`, `not_enforced` or `off`.
    pub landlock: String,
    pub abi: Option<u32>,
    pub mode: String,
    #[serde(default)]
    pub rights: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    pub id: String,
    pub name: String,
    pub decision: String,
    #[serde(default)]
    pub rule: Option<String>,
    pub reason: String,
    /// `ok` or an error class (`PERMISSION_DENIED`, `TIMEOUT`, ...).
    pub outcome: String,
    pub duration_ms: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
}

impl Tokens {
    pub fn total(&self) -> u64 {
        self.input + self.output
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AcceptanceRecord {
    pub check: String,
    pub passed: bool,
    #[serde(default)]
    pub detail: String,
}

/// The run receipt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Receipt {
    pub run_id: String,
    pub task: String,
    pub status: RunStatus,
    pub stop_reason: StopReason,
    pub started_at: DateTime<Utc>,
    pub finished_at: DateTime<Utc>,
    pub inputs: Inputs,
    pub sandbox: SandboxRecord,
    pub steps: u32,
    pub tool_calls: Vec<ToolCallRecord>,
    pub tokens: Tokens,
    pub cost_usd: f64,
    pub retries: u32,
    pub denials: u32,
    pub outputs: Vec<String>,
    pub cards: Vec<String>,
    pub acceptance: Vec<AcceptanceRecord>,
    /// The paused run this one continued (`runtime resume`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resumed_from: Option<String>,
}

/// Builder triage of a card.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Triage {
    pub decision: String,
    pub by: String,
    pub at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicate_of: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fixed_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// A failure card.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Card {
    pub id: String,
    pub kind: CardKind,
    pub task: String,
    pub run_id: String,
    pub fingerprint: String,
    pub created_at: DateTime<Utc>,
    pub summary: String,
    pub detail: String,
    #[serde(default)]
    pub evidence: Vec<String>,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub triage: Option<Triage>,
}

impl Card {
    pub fn new(
        kind: CardKind,
        task: &str,
        run_id: &str,
        summary: impl Into<String>,
        detail: impl Into<String>,
        evidence: Vec<String>,
        now: DateTime<Utc>,
    ) -> Card {
        let detail = detail.into();
        let fingerprint = fingerprint(task, kind, &detail);
        Card {
            id: new_id(now, &fingerprint),
            kind,
            task: task.to_string(),
            run_id: run_id.to_string(),
            fingerprint,
            created_at: now,
            summary: summary.into(),
            detail,
            evidence,
            status: "open".into(),
            triage: None,
        }
    }

    /// Repo-relative path of the card file.
    pub fn rel_path(&self) -> PathBuf {
        card_path(&self.id, self.created_at)
    }
}

pub fn card_path(id: &str, at: DateTime<Utc>) -> PathBuf {
    PathBuf::from(format!("cards/{}/{id}.yaml", day(at)))
}

pub fn receipt_path(task: &str, run_id: &str, at: DateTime<Utc>) -> PathBuf {
    PathBuf::from(format!("runs/{task}/{}/{run_id}.json", day(at)))
}

pub fn report_path(task: &str, run_id: &str, at: DateTime<Utc>) -> PathBuf {
    PathBuf::from(format!("reports/{task}/{}/{run_id}.md", day(at)))
}

pub fn day(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d").to_string()
}

/// A sortable unique id: UTC timestamp plus random hex (`20261129T073000Z-3f9a1c2b`).
pub fn new_id(now: DateTime<Utc>, salt: &str) -> String {
    let mut h = Sha256::new();
    h.update(salt.as_bytes());
    h.update(rand::random::<u64>().to_le_bytes());
    h.update(std::process::id().to_le_bytes());
    format!("{}-{}", now.format("%Y%m%dT%H%M%SZ"), &hex::encode(h.finalize())[..8])
}

/// Same task, kind and normalised detail give the same fingerprint: numbers, hex ids,
/// timestamps and temp paths are replaced so one failure seen 40 times is one line.
pub fn fingerprint(task: &str, kind: CardKind, detail: &str) -> String {
    let mut h = Sha256::new();
    h.update(task.as_bytes());
    h.update([0]);
    h.update(kind.as_str().as_bytes());
    h.update([0]);
    h.update(normalise_detail(detail).as_bytes());
    hex::encode(h.finalize())[..16].to_string()
}

/// Replaces volatile parts of a detail string (digits, ids, temp paths) with `#`.
pub fn normalise_detail(detail: &str) -> String {
    let mut out = String::with_capacity(detail.len());
    for word in detail.split_inclusive(char::is_whitespace) {
        let (w, ws) = word.split_at(word.trim_end().len());
        if w.starts_with("/tmp/") {
            out.push_str("/tmp/#");
        } else {
            let mut last_hash = false;
            for c in w.chars() {
                if c.is_ascii_digit()
                    || (c.is_ascii_hexdigit() && w.len() >= 12 && w.chars().all(|c| c.is_ascii_hexdigit() || c == '-'))
                {
                    if !last_hash {
                        out.push('#');
                    }
                    last_hash = true;
                } else {
                    out.push(c);
                    last_hash = false;
                }
            }
        }
        out.push_str(ws);
    }
    out.trim().to_lowercase()
}

/// Why a record could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{path}: refusing to overwrite an existing record")]
    Exists { path: PathBuf },
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: cannot serialise: {message}")]
    Serialise { path: PathBuf, message: String },
}

/// Creates `root/rel` with `bytes`; fails if the file exists (records are write-once).
pub fn create_new(root: &Path, rel: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    let path = root.join(rel);
    let io = |e: std::io::Error| WriteError::Io {
        path: rel.to_path_buf(),
        source: e,
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io)?;
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                WriteError::Exists {
                    path: rel.to_path_buf(),
                }
            } else {
                io(e)
            }
        })?;
    // No fsync here: the record is committed to git right away, and git's own object
    // writes are not fsynced either; syncing only this file would not add durability.
    f.write_all(bytes).map_err(io)
}

pub fn card_yaml(card: &Card) -> Result<String, WriteError> {
    serde_yaml::to_string(card).map_err(|e| WriteError::Serialise {
        path: card.rel_path(),
        message: e.to_string(),
    })
}

pub fn receipt_json(r: &Receipt) -> Result<String, WriteError> {
    serde_json::to_string_pretty(r)
        .map(|s| s + "\n")
        .map_err(|e| WriteError::Serialise {
            path: receipt_path(&r.task, &r.run_id, r.started_at),
            message: e.to_string(),
        })
}

/// Reads a card file.
pub fn read_card(path: &Path) -> Result<Card, String> {
    let src = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_yaml::from_str(&src).map_err(|e| {
        let line = e.location().map(|l| l.line()).unwrap_or(0);
        format!("{}:{line}: {e}", path.display())
    })
}

/// Reads a receipt file.
pub fn read_receipt(path: &Path) -> Result<Receipt, String> {
    let src = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&src).map_err(|e| format!("{}:{}: {e}", path.display(), e.line()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        "2026-11-29T07:30:00Z".parse().unwrap()
    }

    pub(crate) fn sample_receipt() -> Receipt {
        Receipt {
            run_id: new_id(now(), "x"),
            task: "digest".into(),
            status: RunStatus::Accepted,
            stop_reason: StopReason::FinalAnswer,
            started_at: now(),
            finished_at: now(),
            inputs: Inputs {
                commit: Some("abc".into()),
                prompt: Some("p".into()),
                scope: None,
                settings: Some("s".into()),
                provider: "replay".into(),
                model: "replay".into(),
            },
            sandbox: SandboxRecord {
                landlock: "fully_enforced".into(),
                abi: Some(6),
                mode: "required".into(),
                rights: vec!["write_file".into()],
            },
            steps: 3,
            tool_calls: vec![ToolCallRecord {
                id: "c1".into(),
                name: "run_command".into(),
                decision: "deny".into(),
                rule: Some("Bash(git push*)".into()),
                reason: "r".into(),
                outcome: "PERMISSION_DENIED".into(),
                duration_ms: 1,
            }],
            tokens: Tokens { input: 10, output: 5 },
            cost_usd: 0.001,
            retries: 1,
            denials: 1,
            outputs: vec!["reports/digest/2026-11-29/x.md".into()],
            cards: vec!["c".into()],
            acceptance: vec![AcceptanceRecord {
                check: "has-title".into(),
                passed: true,
                detail: String::new(),
            }],
            resumed_from: None,
        }
    }

    #[test]
    fn receipt_round_trips() {
        let r = sample_receipt();
        let back: Receipt = serde_json::from_str(&receipt_json(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn card_round_trips_with_triage() {
        let mut c = Card::new(
            CardKind::PermissionDenied,
            "digest",
            "run-1",
            "denied",
            "`git push` matches deny",
            vec!["call c1".into()],
            now(),
        );
        let back: Card = serde_yaml::from_str(&card_yaml(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        c.triage = Some(Triage {
            decision: "accept".into(),
            by: "Eng <e@x>".into(),
            at: now(),
            duplicate_of: None,
            fixed_by: Some("abc123".into()),
            note: None,
        });
        let back: Card = serde_yaml::from_str(&card_yaml(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        assert_eq!(c.rel_path(), PathBuf::from(format!("cards/2026-11-29/{}.yaml", c.id)));
    }

    #[test]
    fn fingerprints_ignore_volatile_detail() {
        let a = fingerprint(
            "t",
            CardKind::ProviderError,
            "HTTP 500 after 3 retries at /tmp/run-123/x",
        );
        let b = fingerprint(
            "t",
            CardKind::ProviderError,
            "HTTP 502 after 4 retries at /tmp/run-999/y",
        );
        let c = fingerprint("t", CardKind::ProviderError, "HTTP 401 unauthorized");
        let d = fingerprint(
            "u",
            CardKind::ProviderError,
            "HTTP 500 after 3 retries at /tmp/run-123/x",
        );
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(a, d);
    }

    #[test]
    fn records_are_create_only() {
        let dir = tempfile::tempdir().unwrap();
        let rel = Path::new("cards/2026-11-29/a.yaml");
        create_new(dir.path(), rel, b"one").unwrap();
        assert!(matches!(
            create_new(dir.path(), rel, b"two"),
            Err(WriteError::Exists { .. })
        ));
        assert_eq!(std::fs::read(dir.path().join(rel)).unwrap(), b"one");
    }
}
