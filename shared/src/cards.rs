//! Card triage and export for `builder cards`: the builder's decision is written into
//! each card file of a fingerprint group as a `triage` block with the engineer's
//! identity, and groups export as GitHub issue bodies.

use crate::history::CardGroup;
use crate::records::{read_card, Card, Triage};
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
    fn name(&self) -> &'static str {
        match self {
            TriageDecision::Accept => "accept",
            TriageDecision::Reject => "reject",
            TriageDecision::DuplicateOf(_) => "duplicate",
            TriageDecision::FixedBy(_) => "fixed",
        }
    }

    /// The card status after this decision.
    pub fn status(&self) -> &'static str {
        match self {
            TriageDecision::Accept => "accepted",
            TriageDecision::Reject => "rejected",
            TriageDecision::DuplicateOf(_) => "duplicate",
            TriageDecision::FixedBy(_) => "fixed",
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
        card.status = decision.status().to_string();
        card.triage = Some(Triage {
            decision: decision.name().to_string(),
            by: by.to_string(),
            at: Utc::now(),
            duplicate_of: match decision {
                TriageDecision::DuplicateOf(d) => Some(d.clone()),
                _ => None,
            },
            fixed_by: match decision {
                TriageDecision::FixedBy(f) => Some(f.clone()),
                _ => None,
            },
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
        labels: vec!["agent-card".into(), group.kind.clone(), format!("task:{}", group.task)],
    }
}
