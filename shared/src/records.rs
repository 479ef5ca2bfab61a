//! Runtime records (docs/design.md): the run receipt (`runs/<task>/<day>/<id>.json`)
//! and failure cards (`cards/<day>/<id>.yaml`), their ids and fingerprints, and the
//! create-only writer. The runtime never rewrites a record once written; only the
//! builder adds a `triage` block to a card later.

use crate::tools::ErrorClass;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

/// A closed set of values and the names records spell them with (in receipts, cards,
/// the trace and SQLite columns), so a name read back, or given as a command-line
/// filter, parses into the value or is refused with the list of valid names.
pub trait Named: Sized + Copy + 'static {
    /// What the names are of, for errors (`card status`).
    const WHAT: &'static str;
    /// Every value, in the order help and errors list them.
    const ALL: &'static [Self];
    fn name(self) -> &'static str;
}

/// A name that is none of a [`Named`] type's values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} `{value}` (expected one of: {expected})")]
pub struct UnknownName {
    pub what: &'static str,
    pub value: String,
    pub expected: String,
}

/// The value of `T` spelled `name`.
pub fn parse_name<T: Named>(name: &str) -> Result<T, UnknownName> {
    T::ALL
        .iter()
        .copied()
        .find(|v| v.name() == name)
        .ok_or_else(|| UnknownName {
            what: T::WHAT,
            value: name.to_string(),
            expected: T::ALL.iter().map(|v| v.name()).collect::<Vec<_>>().join(", "),
        })
}

/// Implements [`Named`], `as_str`, `FromStr`, `Display`, the SQLite conversions and
/// the `TryFrom<String>` serde reads through, for a type whose names are derived
/// once: `strum::IntoStaticStr` (the name, `serialize_all = "snake_case"`) and
/// `strum::VariantArray` (every value, in declaration order), with
/// `#[serde(into = "&'static str", try_from = "String")]` so records, the trace and
/// SQLite columns spell the same names. A type with data in a variant (`ToolOutcome`)
/// gives its own `as_str` and every value instead (the list is checked to be
/// exhaustive: a new variant does not compile until it is listed).
macro_rules! named {
    ($t:ty, $what:literal) => {
        impl $t {
            pub fn as_str(&self) -> &'static str {
                (*self).into()
            }
        }
        impl TryFrom<String> for $t {
            type Error = $crate::records::UnknownName;
            fn try_from(s: String) -> Result<Self, $crate::records::UnknownName> {
                $crate::records::parse_name(&s)
            }
        }
        $crate::records::named!(@impls $t, $what, <$t as strum::VariantArray>::VARIANTS);
    };
    ($t:ty, $what:literal, [$($($v:ident)::+ $(($($inner:ident)::+))?),* $(,)?]) => {
        const _: () = {
            fn every_value_is_listed(v: $t) {
                match v {
                    $($($v)::+ $(($($inner)::+))?)|* => {}
                }
            }
            let _ = every_value_is_listed;
        };
        $crate::records::named!(@impls $t, $what, &[$($($v)::+ $(($($inner)::+))?),*]);
    };
    (@impls $t:ty, $what:literal, $all:expr) => {
        impl $crate::records::Named for $t {
            const WHAT: &'static str = $what;
            const ALL: &'static [Self] = $all;
            fn name(self) -> &'static str {
                self.as_str()
            }
        }
        impl std::str::FromStr for $t {
            type Err = $crate::records::UnknownName;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $crate::records::parse_name(s)
            }
        }
        impl std::fmt::Display for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.pad(self.as_str())
            }
        }
        /// Stored as its name (SQLite columns hold the text records hold).
        impl rusqlite::types::ToSql for $t {
            fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
                Ok(self.as_str().into())
            }
        }
        impl rusqlite::types::FromSql for $t {
            fn column_result(v: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
                $crate::records::parse_name(v.as_str()?).map_err(|e| rusqlite::types::FromSqlError::Other(Box::new(e)))
            }
        }
    };
}
pub(crate) use named;

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    Hash,
    PartialOrd,
    Ord,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
#[serde(into = "&'static str", try_from = "String")]
pub enum RunStatus {
    Accepted,
    Completed,
    Failed,
    Skipped,
    WaitingApproval,
    Cancelled,
    /// The run has started and not ended: its row is written before prefetch and
    /// closed when the run ends. A `running` row whose process is gone is an
    /// interrupted run, which the next fire of the task resumes or closes.
    Running,
    /// An interrupted run the next fire (or `runtime resume`) closed without resuming.
    Crashed,
}

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    Hash,
    PartialOrd,
    Ord,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
#[serde(into = "&'static str", try_from = "String")]
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
    /// A step's checkpoint (or a call's ledger entry) could not be written to the
    /// state database: the run stopped before its next step.
    CheckpointFailed,
}

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    Hash,
    PartialOrd,
    Ord,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
#[serde(into = "&'static str", try_from = "String")]
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
    /// A prefetch script wrote more than the output cap; its middle was cut.
    PrefetchTruncated,
    /// Files the model left under `reports/` that were not committed (not regular
    /// files, hard links, git metadata, over the caps, or at the report's own name).
    OutputRejected,
    /// The state database was damaged: moved aside and rebuilt empty.
    StateReset,
    /// With `sync`: the fetch or the push failed (the remote is unreachable, its
    /// transport unsupported, the local branch diverged with commits not the
    /// runtime's, or every push attempt was rejected).
    SyncFailed,
    /// `runtime resume` refused an approved call: a repository file it names (the
    /// script it runs, a file it reads or writes) changed since the run paused.
    ApprovalStale,
    /// The fire's records could not be committed (git's index lock held by another
    /// process past the wait, a branch that kept moving): they are left in the work
    /// tree for the next fire's commit, of any task.
    CommitBlocked,
    /// A step's checkpoint could not be written to the state database (a full disk,
    /// a read-only `.runtime`): the run stopped before its next step.
    CheckpointFailed,
    /// An MCP tool's definition (or what starts its server) differs from its pin in
    /// `settings/mcp.lock`, or has none: the tool is not offered.
    McpDrift,
    /// An MCP server did not start, timed out, broke the protocol or stopped mid-fire.
    McpServerFailed,
}

named!(RunStatus, "run status");
named!(StopReason, "stop reason");
named!(CardKind, "card kind");

/// A card's status: `open` when the runtime writes it, then what triage made it.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    Hash,
    PartialOrd,
    Ord,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
#[serde(into = "&'static str", try_from = "String")]
pub enum CardStatus {
    Open,
    Accepted,
    Rejected,
    Duplicate,
    Fixed,
}

named!(CardStatus, "card status");

/// The decision a triage block records (`duplicate_of` / `fixed_by` carry the rest).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash, strum::IntoStaticStr, strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
#[serde(into = "&'static str", try_from = "String")]
pub enum TriageKind {
    Accept,
    Reject,
    Duplicate,
    Fixed,
}

named!(TriageKind, "triage decision");

/// The policy decision recorded for a tool call; `none` for a call that never reached
/// the policy (unknown tool, invalid arguments, a tool the task does not enable).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash, strum::IntoStaticStr, strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
#[serde(into = "&'static str", try_from = "String")]
pub enum RecordedDecision {
    Allow,
    Ask,
    Deny,
    None,
}

named!(RecordedDecision, "decision");

/// How a tool call ended: `ok`, or its error class (`PERMISSION_DENIED`, `TIMEOUT`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolOutcome {
    Ok,
    Error(ErrorClass),
}

impl ToolOutcome {
    pub fn as_str(&self) -> &'static str {
        match self {
            ToolOutcome::Ok => "ok",
            ToolOutcome::Error(c) => c.as_str(),
        }
    }
}

impl From<Option<ErrorClass>> for ToolOutcome {
    fn from(error: Option<ErrorClass>) -> ToolOutcome {
        error.map_or(ToolOutcome::Ok, ToolOutcome::Error)
    }
}

named!(
    ToolOutcome,
    "tool outcome",
    [
        ToolOutcome::Ok,
        ToolOutcome::Error(ErrorClass::InvalidArguments),
        ToolOutcome::Error(ErrorClass::NotFound),
        ToolOutcome::Error(ErrorClass::PermissionDenied),
        ToolOutcome::Error(ErrorClass::Timeout),
        ToolOutcome::Error(ErrorClass::OutputTooLarge),
        ToolOutcome::Error(ErrorClass::SideEffectUncertain),
        ToolOutcome::Error(ErrorClass::UnknownTool),
        ToolOutcome::Error(ErrorClass::Failed),
    ]
);

impl Serialize for ToolOutcome {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ToolOutcome {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ToolOutcome, D::Error> {
        let name = String::deserialize(d)?;
        parse_name(&name).map_err(serde::de::Error::custom)
    }
}

/// What Landlock enforced (`""` in records of fires that ended before the sandbox).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, Hash, strum::IntoStaticStr, strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
#[serde(into = "&'static str", try_from = "String")]
pub enum LandlockStatus {
    #[default]
    #[strum(serialize = "")]
    NotEntered,
    FullyEnforced,
    PartiallyEnforced,
    NotEnforced,
    Off,
}

named!(LandlockStatus, "landlock status");

/// The Landlock mode the settings asked for, as recorded (`""` before the sandbox).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, Hash, strum::IntoStaticStr, strum::VariantArray,
)]
#[strum(serialize_all = "snake_case")]
#[serde(into = "&'static str", try_from = "String")]
pub enum SandboxMode {
    #[default]
    #[strum(serialize = "")]
    NotEntered,
    Required,
    BestEffort,
    Off,
}

named!(SandboxMode, "sandbox mode");

/// Versions a fire ran on.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Inputs {
    pub commit: Option<String>,
    pub prompt: Option<String>,
    pub scope: Option<String>,
    pub settings: Option<String>,
    pub provider: String,
    pub model: String,
    /// The approval a fire under review (`require_reviewed: true`) ran under; absent
    /// otherwise, so receipts without review read as they always did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalRef>,
}

/// Which approval covered the builder-owned tree a fire ran on (docs/design.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalRef {
    /// The approval's commit on `refs/builder/approvals`.
    pub id: String,
    /// The approved tree of builder-owned paths.
    pub tree: String,
    /// `Name <email>`.
    pub approver: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SandboxRecord {
    pub landlock: LandlockStatus,
    pub abi: Option<u32>,
    pub mode: SandboxMode,
    #[serde(default)]
    pub rights: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCallRecord {
    pub id: String,
    /// The name the model called (it may name no tool).
    pub name: String,
    pub decision: RecordedDecision,
    #[serde(default)]
    pub rule: Option<String>,
    pub reason: String,
    pub outcome: ToolOutcome,
    pub duration_ms: u64,
    /// An MCP tool's call: its server, tool and the pin its definition matched.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp: Option<McpCallRecord>,
}

/// What a receipt records of an MCP call besides its name and decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpCallRecord {
    pub server: String,
    pub tool: String,
    pub pin: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
}

impl Tokens {
    /// The most one count holds (about 1.1 trillion): far more than any run uses, small
    /// enough that the sum of millions of runs' counts stays exact in JSON numbers and
    /// in SQLite's integers. A provider's (or a trace's, or a hand-edited receipt's)
    /// larger number is taken as this.
    pub const CAP: u64 = (1 << 40) - 1;

    /// Counts as reported, each held to [`Tokens::CAP`].
    pub fn reported(input: u64, output: u64) -> Tokens {
        Tokens {
            input: input.min(Tokens::CAP),
            output: output.min(Tokens::CAP),
        }
    }

    /// Adds `more`, each count held to [`Tokens::CAP`].
    pub fn add(&mut self, more: Tokens) {
        *self = Tokens::reported(
            self.input.saturating_add(more.input),
            self.output.saturating_add(more.output),
        );
    }

    pub fn total(&self) -> u64 {
        self.input.saturating_add(self.output)
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
    pub decision: TriageKind,
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
    pub status: CardStatus,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub triage: Option<Triage>,
    /// Earlier triage decisions, oldest first; `triage` is the latest. Empty (and
    /// absent from the file) until a card is triaged a second time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub triage_history: Vec<Triage>,
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
            status: CardStatus::Open,
            triage: None,
            triage_history: Vec::new(),
        }
    }

    /// Repo-relative path of the card file.
    pub fn rel_path(&self) -> PathBuf {
        card_path(&self.id, self.created_at)
    }
}

/// The most evidence lines a card keeps (the rest are counted in one more line).
pub const CARD_EVIDENCE_MAX: usize = 20;
/// The most bytes of one evidence line, and of a card's summary.
pub const CARD_LINE_MAX: usize = 500;
/// The most bytes of a card's detail.
pub const CARD_DETAIL_MAX: usize = 8 * 1024;

/// Caps a card's size: a summary and evidence lines of at most [`CARD_LINE_MAX`]
/// bytes, a detail of at most [`CARD_DETAIL_MAX`] (its head kept, the cut said), at
/// most [`CARD_EVIDENCE_MAX`] evidence lines and one counting the rest. A card is read
/// by people and committed on every fire: one naming every path a model left behind
/// (hundreds of KB) helps nobody. The fingerprint stays the one of the whole detail.
pub fn cap_card(card: &mut Card) {
    card.summary = cap_text(&card.summary, CARD_LINE_MAX);
    card.detail = cap_text(&card.detail, CARD_DETAIL_MAX);
    let total = card.evidence.len();
    if total > CARD_EVIDENCE_MAX {
        card.evidence.truncate(CARD_EVIDENCE_MAX);
        card.evidence
            .push(format!("... and {} more (of {total})", total - CARD_EVIDENCE_MAX));
    }
    for e in &mut card.evidence {
        *e = cap_text(e, CARD_LINE_MAX);
    }
}

/// `text` cut to at most about `max` bytes at a character boundary, saying how much
/// was cut.
pub fn cap_text(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max.saturating_sub(40);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}[... {} bytes cut ...]", &text[..end], text.len() - end)
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

/// Whether `rel` has the shape of a run's report path (`reports/<task>/<day>/<run-id>.md`,
/// any run's): such a file belongs to the fire of that run, even when another fire of
/// another task sees it appear under `reports/` while it runs.
pub fn is_report_path(rel: &str) -> bool {
    is_run_file(rel, "reports", ".md")
}

/// Whether `rel` has the shape of the report a fire writes beside its receipt when
/// `reports/` cannot take it (`runs/<task>/<day>/<run-id>.report.md`).
pub fn is_fallback_report_path(rel: &str) -> bool {
    is_run_file(rel, "runs", ".report.md")
}

/// Whether `rel` is `<dir>/<task>/<day>/<run-id><suffix>`.
fn is_run_file(rel: &str, dir: &str, suffix: &str) -> bool {
    let parts: Vec<&str> = rel.split('/').collect();
    let [top, task, day, file] = parts.as_slice() else {
        return false;
    };
    let Some(id) = file.strip_suffix(suffix) else {
        return false;
    };
    *top == dir && crate::layout::valid_task_name(task) && is_day_name(day) && is_run_id(id)
}

/// Whether `name` is a day directory's name (`YYYY-MM-DD`, UTC), as records are kept.
pub fn is_day_name(name: &str) -> bool {
    chrono::NaiveDate::parse_from_str(name, "%Y-%m-%d").is_ok()
}

/// Whether `rel` is a card file: any `.yaml` under `cards/`, as the history index
/// reads cards (the runtime writes `cards/<day>/<id>.yaml`; a card anywhere else is
/// listed all the same).
pub fn is_card_path(rel: &str) -> bool {
    rel.starts_with("cards/") && rel.ends_with(".yaml")
}

/// The largest record a person is shown ([`record_text`]).
const MAX_SHOWN_RECORD: u64 = 16 << 20;

/// A record's text for people to read (`builder serve`'s pages, `builder history
/// diff`): the file `rel` under a runtime directory (`runs/`, `reports/`, `cards/`),
/// HEAD's blob of a regular file when HEAD holds one there (what was committed is the
/// record: a later fire's model may have rewritten the work tree's copy, helper-91),
/// else the work tree's (a record whose commit was blocked), read only as a regular
/// file with one name reached through no link. A receipt names its report's path,
/// and anyone who can push can write a receipt: a path elsewhere (`/etc/shadow`,
/// `.git/config`), a link (to the reader's private files) or a special file yields
/// `None`, so reading the history reads nothing else.
pub fn record_text(root: &Path, repo: &git2::Repository, rel: &str) -> Option<String> {
    let first = rel.split('/').next()?;
    if !crate::layout::RUNTIME_DIRS.contains(&first) || rel.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return None;
    }
    let committed = repo
        .head()
        .ok()
        .and_then(|h| h.peel_to_tree().ok())
        .and_then(|tree| tree.get_path(Path::new(rel)).ok());
    let bytes = match committed {
        Some(entry) => {
            if !matches!(entry.filemode(), 0o100644 | 0o100755) {
                return None;
            }
            let blob = repo.find_blob(entry.id()).ok()?;
            if blob.size() as u64 > MAX_SHOWN_RECORD {
                return None;
            }
            blob.content().to_vec()
        }
        None => {
            let dir = crate::beneath::open_root(root).ok()?;
            crate::beneath::read_regular(&dir, Path::new(rel), MAX_SHOWN_RECORD).ok()?
        }
    };
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// Whether `id` has the shape [`new_id`] gives (`20261129T073000Z-3f9a1c2b`).
pub fn is_run_id(id: &str) -> bool {
    let b = id.as_bytes();
    b.len() == 25
        && b[..8].iter().all(u8::is_ascii_digit)
        && b[8] == b'T'
        && b[9..15].iter().all(u8::is_ascii_digit)
        && &b[15..17] == b"Z-"
        && b[17..].iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
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

/// Creates `root/rel` with `bytes`; fails if anything is at that name (records are
/// write-once) or if a directory on the way is a symlink (see [`crate::beneath`]: the
/// model can reach `reports/` and must not be able to redirect the runtime's write).
pub fn create_new(root: &Path, rel: &Path, bytes: &[u8]) -> Result<(), WriteError> {
    create_new_synced(root, rel, bytes, false)
}

/// How long a record's writer waits for git's index lock before it makes a missing
/// records directory without it ([`crate::git::make_dirs_under_index_lock`]).
const RECORDS_DIR_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// [`create_new`], with `fsync` (`durability: strict`) the file fsynced before its
/// rename into place and its directory after. Without it (the default) a record
/// survives a crash of the process, not a power loss: it is committed to git right
/// away, and git's own object writes are not fsynced either.
pub fn create_new_synced(root: &Path, rel: &Path, bytes: &[u8], fsync: bool) -> Result<(), WriteError> {
    let io = |e: std::io::Error| WriteError::Io {
        path: rel.to_path_buf(),
        source: e,
    };
    let make_ahead = || {
        let parent = rel.parent().filter(|p| !p.as_os_str().is_empty())?;
        // A directory that cannot be made here (a link on the way) is refused by the
        // write, with its own error.
        crate::git::make_dirs_under_index_lock(root, parent, RECORDS_DIR_LOCK_WAIT)
            .inspect_err(|e| tracing::debug!(dir = %parent.display(), error = %e, "records directory not made ahead"))
            .ok()
    };
    use crate::beneath::MakeDirs;
    let dir = crate::beneath::open_root(root).map_err(io)?;
    make_ahead();
    // Written into the directories made under git's lock; one a person's checkout
    // removed since is made again the same way, and only a third time by the write
    // itself (a record is never lost to a moving work tree).
    let written = match crate::beneath::create_new_with(&dir, rel, bytes, fsync, MakeDirs::No) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            make_ahead();
            crate::beneath::create_new_with(&dir, rel, bytes, fsync, MakeDirs::Yes)
        }
        other => other,
    };
    written.map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            WriteError::Exists {
                path: rel.to_path_buf(),
            }
        } else {
            io(e)
        }
    })
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

/// The largest card file parsed. A card the runtime writes is capped ([`cap_card`])
/// at about 20 KB of text, at most four times that once YAML escapes control
/// characters; a file beyond the bound is no card of the runtime's and is not parsed
/// (a pushed file of nested `[` would hold the YAML parser for as long as its size
/// squared). Cards are not held to [`crate::yamlpos::MAX_FLOW_OPENINGS`]: their text
/// is the model's too (paths it named, its reasons), brackets included, and it is
/// always quoted, never nested.
pub const CARD_FILE_MAX: usize = 128 * 1024;

/// A card from the bytes of its file; `Err` says why not: the line (0 for the whole
/// file) and the message.
pub fn parse_card(bytes: &[u8]) -> Result<Card, (usize, String)> {
    if bytes.len() > CARD_FILE_MAX {
        return Err((
            0,
            format!(
                "{} bytes, larger than any card the runtime writes ({CARD_FILE_MAX}): not parsed",
                bytes.len()
            ),
        ));
    }
    serde_yaml::from_slice(bytes).map_err(|e| (e.location().map(|l| l.line()).unwrap_or(0), e.to_string()))
}

/// Reads a card file.
pub fn read_card(path: &Path) -> Result<Card, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_card(&bytes).map_err(|(line, e)| format!("{}:{line}: {e}", path.display()))
}

/// Reads a receipt file.
pub fn read_receipt(path: &Path) -> Result<Receipt, String> {
    let src = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&src).map_err(|e| format!("{}:{}: {e}", path.display(), e.line()))
}

/// Checks that `table` lists every value of `T` with its old serialized string, and
/// that names, `Display`, serde and parsing all agree with it.
#[cfg(test)]
pub(crate) fn check_names<T>(table: &[(T, &str)])
where
    T: Named + Serialize + serde::de::DeserializeOwned + std::fmt::Debug + PartialEq + std::fmt::Display,
{
    assert_eq!(table.len(), T::ALL.len(), "every {} is in the table", T::WHAT);
    for (v, name) in table {
        assert_eq!(v.name(), *name);
        assert_eq!(v.to_string(), *name);
        assert_eq!(serde_json::to_value(v).unwrap(), serde_json::json!(name));
        assert_eq!(&serde_json::from_value::<T>(serde_json::json!(name)).unwrap(), v);
        assert_eq!(&parse_name::<T>(name).unwrap(), v);
    }
    let err = parse_name::<T>("bogus").unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("unknown {} `bogus` (expected one of: ", T::WHAT)),
        "{err}"
    );
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn a_card_full_of_brackets_or_control_characters_reads_back_and_an_oversized_file_does_not() {
        let mut c: Card = serde_yaml::from_str(CARD_ON_DISK).unwrap();
        // Model text at every cap: brackets (paths a model named), then control
        // characters (which YAML escapes, four bytes each).
        for fill in ["[", "\u{1}"] {
            c.summary = fill.repeat(CARD_LINE_MAX * 2);
            c.detail = fill.repeat(CARD_DETAIL_MAX * 2);
            c.evidence = vec![fill.repeat(CARD_LINE_MAX * 2); CARD_EVIDENCE_MAX * 2];
            cap_card(&mut c);
            let yaml = card_yaml(&c).unwrap();
            assert!(yaml.len() <= CARD_FILE_MAX, "{} bytes", yaml.len());
            assert_eq!(parse_card(yaml.as_bytes()).unwrap().detail, c.detail);
        }
        let bomb = format!("id: x\nsummary: {}", "[".repeat(CARD_FILE_MAX));
        let (line, why) = parse_card(bomb.as_bytes()).unwrap_err();
        assert_eq!(line, 0);
        assert!(why.contains("not parsed"), "{why}");
    }

    #[test]
    fn report_paths_of_any_run_are_recognised() {
        let at = now();
        let id = new_id(at, "t");
        assert!(is_run_id(&id), "{id}");
        assert!(is_report_path(
            &report_path("nightly-report", &id, at).to_string_lossy()
        ));
        for other in [
            "reports/notes.md".to_string(),
            format!("reports/t/2026-11-29/{id}.txt"),
            format!("reports/t/2026-13-29/{id}.md"),
            format!("runs/t/2026-11-29/{id}.md"),
            "reports/t/2026-11-29/20261129T073000Z-XYZ.md".to_string(),
        ] {
            assert!(!is_report_path(&other), "{other}");
        }
    }

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
                approval: None,
            },
            sandbox: SandboxRecord {
                landlock: LandlockStatus::FullyEnforced,
                abi: Some(6),
                mode: SandboxMode::Required,
                rights: vec!["write_file".into()],
            },
            steps: 3,
            tool_calls: vec![ToolCallRecord {
                id: "c1".into(),
                name: "run_command".into(),
                decision: RecordedDecision::Deny,
                rule: Some("Bash(git push*)".into()),
                reason: "r".into(),
                outcome: ToolOutcome::Error(ErrorClass::PermissionDenied),
                duration_ms: 1,
                mcp: None,
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
            decision: TriageKind::Accept,
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

    /// A receipt as fires before the typed fields wrote it (every decision, an error
    /// outcome, a sandbox that was entered and one that was not).
    const RECEIPT_ON_DISK: &str = r#"{
  "run_id": "20261129T073000Z-3f9a1c2b",
  "task": "digest",
  "status": "failed",
  "stop_reason": "permission_denied",
  "started_at": "2026-11-29T07:30:00Z",
  "finished_at": "2026-11-29T07:31:00Z",
  "inputs": {
    "commit": "abc",
    "prompt": "p",
    "scope": null,
    "settings": "s",
    "provider": "replay",
    "model": "replay"
  },
  "sandbox": {
    "landlock": "partially_enforced",
    "abi": 4,
    "mode": "best_effort",
    "rights": [
      "fs.write_file",
      "runtime process: fully_enforced"
    ]
  },
  "steps": 3,
  "tool_calls": [
    {
      "id": "c1",
      "name": "run_command",
      "decision": "deny",
      "rule": "Bash(git push*)",
      "reason": "r",
      "outcome": "PERMISSION_DENIED",
      "duration_ms": 1
    },
    {
      "id": "c2",
      "name": "read_file",
      "decision": "allow",
      "rule": null,
      "reason": "inside the read roots",
      "outcome": "ok",
      "duration_ms": 2
    },
    {
      "id": "c3",
      "name": "teleport",
      "decision": "none",
      "rule": null,
      "reason": "there is no tool `teleport`",
      "outcome": "UNKNOWN_TOOL",
      "duration_ms": 0
    },
    {
      "id": "c4",
      "name": "run_command",
      "decision": "ask",
      "rule": "Bash(curl*)",
      "reason": "matches an ask rule",
      "outcome": "PERMISSION_DENIED",
      "duration_ms": 0
    }
  ],
  "tokens": {
    "input": 10,
    "output": 5
  },
  "cost_usd": 0.001,
  "retries": 1,
  "denials": 1,
  "outputs": [
    "reports/digest/2026-11-29/x.md"
  ],
  "cards": [
    "c"
  ],
  "acceptance": [
    {
      "check": "has-title",
      "passed": false,
      "detail": "no title"
    }
  ],
  "resumed_from": "20261129T070000Z-00000000"
}
"#;

    /// A card as the runtime wrote it and a builder triaged it.
    const CARD_ON_DISK: &str = "id: 20261129T073000Z-0123abcd
kind: missing_tool
task: digest
run_id: 20261129T073000Z-3f9a1c2b
fingerprint: d0f901c258a94903
created_at: 2026-11-29T07:30:00Z
summary: s
detail: d
evidence:
- e
status: fixed
triage:
  decision: fixed
  by: Eng <e@x>
  at: 2026-11-29T07:30:00Z
  fixed_by: abc123
  note: n
";

    #[test]
    fn records_on_disk_load_and_round_trip_byte_for_byte() {
        let r: Receipt = serde_json::from_str(RECEIPT_ON_DISK).unwrap();
        assert_eq!(r.sandbox.landlock, LandlockStatus::PartiallyEnforced);
        assert_eq!(r.sandbox.mode, SandboxMode::BestEffort);
        let calls: Vec<(RecordedDecision, ToolOutcome)> =
            r.tool_calls.iter().map(|c| (c.decision, c.outcome)).collect();
        assert_eq!(
            calls,
            vec![
                (RecordedDecision::Deny, ToolOutcome::Error(ErrorClass::PermissionDenied)),
                (RecordedDecision::Allow, ToolOutcome::Ok),
                (RecordedDecision::None, ToolOutcome::Error(ErrorClass::UnknownTool)),
                (RecordedDecision::Ask, ToolOutcome::Error(ErrorClass::PermissionDenied)),
            ]
        );
        assert_eq!(receipt_json(&r).unwrap(), RECEIPT_ON_DISK);

        // A fire that ended before the sandbox recorded empty strings.
        let early = RECEIPT_ON_DISK.replace(
            "\"landlock\": \"partially_enforced\",\n    \"abi\": 4,\n    \"mode\": \"best_effort\"",
            "\"landlock\": \"\",\n    \"abi\": null,\n    \"mode\": \"\"",
        );
        let r: Receipt = serde_json::from_str(&early).unwrap();
        assert_eq!(r.sandbox.landlock, LandlockStatus::NotEntered);
        assert_eq!(r.sandbox.mode, SandboxMode::NotEntered);
        assert_eq!(receipt_json(&r).unwrap(), early);

        let c: Card = serde_yaml::from_str(CARD_ON_DISK).unwrap();
        assert_eq!(c.status, CardStatus::Fixed);
        assert_eq!(c.triage.as_ref().map(|t| t.decision), Some(TriageKind::Fixed));
        assert_eq!(card_yaml(&c).unwrap(), CARD_ON_DISK);
        let open = CARD_ON_DISK.split("status:").next().unwrap_or_default().to_string() + "status: open\n";
        let c: Card = serde_yaml::from_str(&open).unwrap();
        assert_eq!((c.status, &c.triage), (CardStatus::Open, &None));
        assert_eq!(card_yaml(&c).unwrap(), open);

        let bad = RECEIPT_ON_DISK.replace("\"decision\": \"deny\"", "\"decision\": \"maybe\"");
        let err = serde_json::from_str::<Receipt>(&bad).unwrap_err().to_string();
        assert!(
            err.contains("unknown decision `maybe` (expected one of: allow, ask, deny, none)"),
            "{err}"
        );
    }

    // Each value's serialized form (serde, `as_str`, `Display`, `FromStr`) is the
    // string records held before these fields were typed: the three tests below, by
    // the record the values are in.

    #[test]
    fn tool_call_serialized_forms_are_the_old_strings() {
        check_names(&[
            (RecordedDecision::Allow, "allow"),
            (RecordedDecision::Ask, "ask"),
            (RecordedDecision::Deny, "deny"),
            (RecordedDecision::None, "none"),
        ]);
        check_names(&[
            (ToolOutcome::Ok, "ok"),
            (ToolOutcome::Error(ErrorClass::InvalidArguments), "INVALID_ARGUMENTS"),
            (ToolOutcome::Error(ErrorClass::NotFound), "NOT_FOUND"),
            (ToolOutcome::Error(ErrorClass::PermissionDenied), "PERMISSION_DENIED"),
            (ToolOutcome::Error(ErrorClass::Timeout), "TIMEOUT"),
            (ToolOutcome::Error(ErrorClass::OutputTooLarge), "OUTPUT_TOO_LARGE"),
            (
                ToolOutcome::Error(ErrorClass::SideEffectUncertain),
                "SIDE_EFFECT_UNCERTAIN",
            ),
            (ToolOutcome::Error(ErrorClass::UnknownTool), "UNKNOWN_TOOL"),
            (ToolOutcome::Error(ErrorClass::Failed), "FAILED"),
        ]);
    }

    #[test]
    fn card_serialized_forms_are_the_old_strings() {
        check_names(&[
            (CardStatus::Open, "open"),
            (CardStatus::Accepted, "accepted"),
            (CardStatus::Rejected, "rejected"),
            (CardStatus::Duplicate, "duplicate"),
            (CardStatus::Fixed, "fixed"),
        ]);
        check_names(&[
            (TriageKind::Accept, "accept"),
            (TriageKind::Reject, "reject"),
            (TriageKind::Duplicate, "duplicate"),
            (TriageKind::Fixed, "fixed"),
        ]);
        check_names(&[
            (CardKind::PermissionDenied, "permission_denied"),
            (CardKind::MissingTool, "missing_tool"),
            (CardKind::BudgetExceeded, "budget_exceeded"),
            (CardKind::MaxSteps, "max_steps"),
            (CardKind::RepeatedCall, "repeated_call"),
            (CardKind::RepeatedError, "repeated_error"),
            (CardKind::ProviderError, "provider_error"),
            (CardKind::PrefetchFailed, "prefetch_failed"),
            (CardKind::AcceptanceFailed, "acceptance_failed"),
            (CardKind::InvalidConfig, "invalid_config"),
            (CardKind::UnreviewedChanges, "unreviewed_changes"),
            (CardKind::SandboxUnavailable, "sandbox_unavailable"),
            (CardKind::SideEffectUncertain, "side_effect_uncertain"),
            (CardKind::ApprovalNeeded, "approval_needed"),
            (CardKind::Crashed, "crashed"),
            (CardKind::EmptyReport, "empty_report"),
            (CardKind::OutputRejected, "output_rejected"),
            (CardKind::ContextOverflow, "context_overflow"),
            (CardKind::PrefetchTruncated, "prefetch_truncated"),
            (CardKind::StateReset, "state_reset"),
            (CardKind::SyncFailed, "sync_failed"),
            (CardKind::ApprovalStale, "approval_stale"),
            (CardKind::CommitBlocked, "commit_blocked"),
            (CardKind::CheckpointFailed, "checkpoint_failed"),
            (CardKind::McpDrift, "mcp_drift"),
            (CardKind::McpServerFailed, "mcp_server_failed"),
        ]);
    }

    #[test]
    fn receipt_serialized_forms_are_the_old_strings() {
        check_names(&[
            (LandlockStatus::NotEntered, ""),
            (LandlockStatus::FullyEnforced, "fully_enforced"),
            (LandlockStatus::PartiallyEnforced, "partially_enforced"),
            (LandlockStatus::NotEnforced, "not_enforced"),
            (LandlockStatus::Off, "off"),
        ]);
        check_names(&[
            (SandboxMode::NotEntered, ""),
            (SandboxMode::Required, "required"),
            (SandboxMode::BestEffort, "best_effort"),
            (SandboxMode::Off, "off"),
        ]);
        check_names(&[
            (RunStatus::Accepted, "accepted"),
            (RunStatus::Completed, "completed"),
            (RunStatus::Failed, "failed"),
            (RunStatus::Skipped, "skipped"),
            (RunStatus::WaitingApproval, "waiting_approval"),
            (RunStatus::Cancelled, "cancelled"),
            (RunStatus::Running, "running"),
            (RunStatus::Crashed, "crashed"),
        ]);
        check_names(&[
            (StopReason::FinalAnswer, "final_answer"),
            (StopReason::MaxSteps, "max_steps"),
            (StopReason::MaxWallTime, "max_wall_time"),
            (StopReason::TokenBudget, "token_budget"),
            (StopReason::CostBudget, "cost_budget"),
            (StopReason::RepeatedCall, "repeated_call"),
            (StopReason::RepeatedError, "repeated_error"),
            (StopReason::Cancelled, "cancelled"),
            (StopReason::PermissionDenied, "permission_denied"),
            (StopReason::ProviderError, "provider_error"),
            (StopReason::ContextOverflow, "context_overflow"),
            (StopReason::WaitingApproval, "waiting_approval"),
            (StopReason::NotStarted, "not_started"),
            (StopReason::CheckpointFailed, "checkpoint_failed"),
        ]);
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

    /// A receipt anyone could push names its report's path: what a reader is shown is
    /// a record's own text and nothing the path or a link leads to.
    #[test]
    fn a_record_shown_to_a_person_is_a_record_and_never_what_a_link_or_path_names() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let repo = git2::Repository::init(root).unwrap();
        let secret = root.join("secret.txt");
        std::fs::write(&secret, "TOP-SECRET").unwrap();
        let day = root.join("reports/t/2026-12-07");
        std::fs::create_dir_all(&day).unwrap();
        std::fs::write(day.join("kept.md"), "the report").unwrap();
        std::fs::write(day.join("gone.md"), "committed only").unwrap();
        std::os::unix::fs::symlink(&secret, day.join("link.md")).unwrap();
        std::os::unix::fs::symlink(&secret, day.join("committed-link.md")).unwrap();
        // HEAD holds every one of them (the links as links).
        let mut index = repo.index().unwrap();
        index.add_all(["reports"], git2::IndexAddOption::DEFAULT, None).unwrap();
        let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
        let sig = git2::Signature::now("c", "c@example.com").unwrap();
        repo.commit(Some("HEAD"), &sig, &sig, "records", &tree, &[]).unwrap();
        std::fs::remove_file(day.join("gone.md")).unwrap();
        std::fs::remove_file(day.join("committed-link.md")).unwrap();
        let shown = |rel: &str| record_text(root, &repo, rel);
        assert_eq!(shown("reports/t/2026-12-07/kept.md").as_deref(), Some("the report"));
        assert_eq!(shown("reports/t/2026-12-07/gone.md").as_deref(), Some("committed only"));
        // The secret is there to be read, by a path that is not a record's.
        assert_eq!(std::fs::read_to_string(day.join("link.md")).unwrap(), "TOP-SECRET");
        for rel in [
            "reports/t/2026-12-07/link.md",
            "reports/t/2026-12-07/committed-link.md",
            secret.to_str().unwrap(),
            "secret.txt",
            ".git/config",
            "reports/../secret.txt",
            "reports//t/2026-12-07/kept.md",
            "../etc/passwd",
        ] {
            assert_eq!(shown(rel), None, "{rel}");
        }
    }
}
