//! The agent loop's state as plain data: what a checkpoint of a run holds (its
//! messages, budgets, card drafts and the call paused for approval with the files it
//! pins) and a builder's decision on that call. It sits in the stores' layer, below
//! the loop ([`crate::agent`]) that drives it, so the state store that keeps
//! checkpoints and decisions ([`crate::state`]) never imports the loop.

use crate::provider::{Message, ToolCall};
use crate::records::{CardKind, Tokens, ToolCallRecord};
use crate::trace::Trace;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// A failure the builder should hear about; becomes a card file at the end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CardDraft {
    pub kind: CardKind,
    pub summary: String,
    pub detail: String,
    pub evidence: Vec<String>,
}

/// A call paused for approval, bound to its exact content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingApproval {
    pub call: ToolCall,
    pub args_hash: String,
    pub step: u32,
    /// The repository files the call names, as they were at the pause: `runtime
    /// resume` refuses the approved call when any changed ([`crate::agent::pins`]).
    #[serde(default)]
    pub pins: Vec<Pin>,
}

/// Everything needed to continue a run: the checkpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LoopState {
    pub messages: Vec<Message>,
    pub step: u32,
    pub tokens: Tokens,
    pub cost_usd: f64,
    pub retries: u32,
    pub denials: u32,
    pub tool_calls: Vec<ToolCallRecord>,
    pub cards: Vec<CardDraft>,
    pub final_answer: Option<String>,
    pub last_content: Option<String>,
    pub pending: Option<PendingApproval>,
    pub(crate) recent_calls: Vec<String>,
    pub(crate) recent_errors: Vec<String>,
    pub(crate) missing_tools: Vec<String>,
    pub(crate) denied_fingerprints: Vec<String>,
    pub trace: Trace,
    /// The entries (repository-relative) the tool workers' write-backs made, replaced
    /// or removed in the write directories this run, as they named them
    /// ([`crate::tools::WrittenBack::made`]), at most [`MADE_KEPT`]: the model's doing,
    /// which the fire's end may remove when it rejects them, or put back when they
    /// were committed.
    #[serde(default)]
    pub made_by_tools: std::collections::BTreeSet<String>,
    /// Files git reads (`.gitattributes`, `.gitignore`) the tools made, removed before
    /// the acceptance checks ran, with why: the fire's card names them with the other
    /// rejected outputs.
    #[serde(default)]
    pub removed_before_checks: Vec<(String, String)>,
}

/// The most entries [`LoopState::made_by_tools`] keeps (a checkpoint carries them).
pub const MADE_KEPT: usize = 2000;

impl LoopState {
    /// Notes entries the tools made (absolute paths under `root`, as a worker names
    /// them), up to [`MADE_KEPT`] (files git reads always).
    pub fn note_made(&mut self, root: &std::path::Path, made: &[String]) {
        for path in made {
            // Files git reads count past the cap (the checks must not meet one).
            if self.made_by_tools.len() >= MADE_KEPT && !crate::gitpath::is_git_read(path) {
                continue;
            }
            if let Ok(rel) = std::path::Path::new(path).strip_prefix(root) {
                self.made_by_tools.insert(rel.to_string_lossy().into_owned());
            }
        }
    }
}

/// A builder's decision on a paused call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum CallDecision {
    Approve,
    Deny,
}

impl CallDecision {
    /// The form stored in the state database's `approvals` table.
    pub fn as_str(self) -> &'static str {
        self.into()
    }

    /// Reads the stored form; anything but an approval counts as a denial (fail closed).
    pub fn from_stored(s: &str) -> CallDecision {
        if s == "approve" {
            CallDecision::Approve
        } else {
            CallDecision::Deny
        }
    }
}

/// One file a paused call names, and what it was when the run paused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pin {
    /// Repository-relative path.
    pub path: String,
    /// `sha256:<hex>` of a regular file's content, or why there is none
    /// (`absent`, `symlink`, `directory`, ...).
    pub state: String,
}

/// Hash binding an approval to one exact call (tool name + raw arguments).
pub fn call_hash(name: &str, arguments: &str) -> String {
    let canonical = serde_json::from_str::<serde_json::Value>(arguments)
        .map(|v| v.to_string())
        .unwrap_or_else(|_| arguments.to_string());
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update([0]);
    h.update(canonical.as_bytes());
    hex::encode(h.finalize())
}
