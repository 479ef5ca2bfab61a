//! Card triage and export for `builder cards`: the builder's decision is written into
//! each card file of a fingerprint group as a `triage` block with the engineer's
//! identity, and groups export as GitHub issue bodies.

use crate::history::CardGroup;
use crate::records::{read_card, Card, CardStatus, Triage, TriageKind};
use chrono::Utc;
use serde::Serialize;
use std::path::Path;

/// What the builder decided about a card.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TriageDecision {
    Accept,
    Reject,
    DuplicateOf(String),
    FixedBy(String),
}

impl TriageDecision {
    /// The decision as the triage block records it.
    pub fn kind(&self) -> TriageKind {
        match self {
            TriageDecision::Accept => TriageKind::Accept,
            TriageDecision::Reject => TriageKind::Reject,
            TriageDecision::DuplicateOf(_) => TriageKind::Duplicate,
            TriageDecision::FixedBy(_) => TriageKind::Fixed,
        }
    }

    /// The card status after this decision.
    pub fn status(&self) -> CardStatus {
        match self {
            TriageDecision::Accept => CardStatus::Accepted,
            TriageDecision::Reject => CardStatus::Rejected,
            TriageDecision::DuplicateOf(_) => CardStatus::Duplicate,
            TriageDecision::FixedBy(_) => CardStatus::Fixed,
        }
    }
}

/// Writes the triage block into each card file (repo-relative `paths`).
pub fn triage(
    root: &Path,
    paths: &[String],
    decision: &TriageDecision,
    by: &str,
    note: Option<&str>,
) -> Result<Vec<Card>, String> {
    let mut out = Vec::new();
    for p in paths {
        let full = root.join(p);
        let mut card = read_card(&full)?;
        let (duplicate_of, fixed_by) = match decision {
            TriageDecision::Accept | TriageDecision::Reject => (None, None),
            TriageDecision::DuplicateOf(d) => (Some(d.clone()), None),
            TriageDecision::FixedBy(f) => (None, Some(f.clone())),
        };
        card.status = decision.status();
        card.triage = Some(Triage {
            decision: decision.kind(),
            by: by.to_string(),
            at: Utc::now(),
            duplicate_of,
            fixed_by,
            note: note.map(str::to_string),
        });
        let yaml = crate::records::card_yaml(&card).map_err(|e| e.to_string())?;
        std::fs::write(&full, yaml).map_err(|e| format!("{p}: {e}"))?;
        out.push(card);
    }
    Ok(out)
}

/// A GitHub issue body (POST /repos/{owner}/{repo}/issues).
#[derive(Debug, Clone, Serialize)]
pub struct GithubIssue {
    pub title: String,
    pub body: String,
    pub labels: Vec<String>,
}

/// One issue per fingerprint group; `latest` is the group's newest card.
pub fn github_issue(group: &CardGroup, latest: Option<&Card>) -> GithubIssue {
    let mut body = format!(
        "**{}** card for task `{}`, seen **{}** time(s) between {} and {}.\n\nFingerprint: `{}`  \nLatest card: `{}` (`{}`)  \nStatus: {}\n",
        group.kind, group.task, group.count, group.first_seen, group.last_seen, group.fingerprint, group.latest_id, group.latest_path, group.status
    );
    if let Some(c) = latest {
        body.push_str(&format!("\n### Detail\n\n```\n{}\n```\n", c.detail.trim()));
        if !c.evidence.is_empty() {
            body.push_str("\n### Evidence\n\n");
            for e in &c.evidence {
                body.push_str(&format!("- `{}`\n", e.replace('`', "'")));
            }
        }
        body.push_str(&format!("\nRun: `{}`\n", c.run_id));
    }
    GithubIssue {
        title: format!(
            "[{}] {} ({})",
            group.kind,
            group.summary.chars().take(120).collect::<String>(),
            group.task
        ),
        body,
        labels: vec![
            "agent-card".into(),
            group.kind.to_string(),
            format!("task:{}", group.task),
        ],
    }
}
