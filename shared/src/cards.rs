//! Card triage and export for `builder cards`: the builder's decision is written into
//! each card file of a fingerprint group as a `triage` block with the engineer's
//! identity (an earlier decision moves to `triage_history`), and groups export as
//! GitHub issue bodies.

use crate::history::CardGroup;
use crate::records::{Card, CardStatus, Triage, TriageKind};
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

/// What `--fixed-by` names, as the triage block records it: a commit (its full id, so
/// `HEAD~1` still means the same commit tomorrow) or a proposal (`proposals/<name>`,
/// the branch `builder propose` makes). `None` when the repository has neither.
pub fn resolve_fixed_by(repo: &git2::Repository, value: &str) -> Option<String> {
    let name = value.strip_prefix(crate::review::PROPOSAL_PREFIX).unwrap_or(value);
    let branch = format!("proposals/{name}");
    if !name.is_empty() && repo.find_branch(&branch, git2::BranchType::Local).is_ok() {
        return Some(branch);
    }
    repo.revparse_single(value)
        .and_then(|o| o.peel_to_commit())
        .ok()
        .map(|c| c.id().to_string())
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
        // Read once: the card and the text a person may have commented are one file.
        let original = std::fs::read_to_string(&full).map_err(|e| format!("{}: {e}", full.display()))?;
        let mut card = crate::records::parse_card(original.as_bytes())
            .map_err(|(line, e)| format!("{}:{line}: {e}", full.display()))?;
        let (duplicate_of, fixed_by) = match decision {
            TriageDecision::Accept | TriageDecision::Reject => (None, None),
            TriageDecision::DuplicateOf(d) => (Some(d.clone()), None),
            TriageDecision::FixedBy(f) => (None, Some(f.clone())),
        };
        card.status = decision.status();
        // A re-triage keeps the decision it replaces.
        if let Some(earlier) = card.triage.take() {
            card.triage_history.push(earlier);
        }
        card.triage = Some(Triage {
            decision: decision.kind(),
            by: by.to_string(),
            at: Utc::now(),
            duplicate_of,
            fixed_by,
            note: note.map(str::to_string),
        });
        let yaml = match triaged_text(&original, &card) {
            Some(edited) => edited,
            None => {
                tracing::warn!(card = %p, "the card file is written anew: comments in it are not kept");
                crate::records::card_yaml(&card).map_err(|e| e.to_string())?
            }
        };
        replace_whole(&full, yaml.as_bytes()).map_err(|e| format!("{p}: {e}"))?;
        out.push(card);
    }
    Ok(out)
}

/// The keys a triage writes in a card file.
const TRIAGE_KEYS: [&str; 3] = ["status", "triage", "triage_history"];

/// `original` (a card file's text) with its triage keys set as in `card`, and every
/// other line as it was: a person's comments and notes in the file are kept. Each
/// top-level key's block is replaced where it stands (a new one goes at the end);
/// `None` when the text cannot be edited so (then it is written anew): the result
/// must read back as exactly `card`.
fn triaged_text(original: &str, card: &Card) -> Option<String> {
    let serde_yaml::Value::Mapping(wanted) = serde_yaml::to_value(card).ok()? else {
        return None;
    };
    let block = |key: &str| -> Option<String> {
        let value = wanted.get(key)?;
        let mut one = serde_yaml::Mapping::new();
        one.insert(key.into(), value.clone());
        serde_yaml::to_string(&one).ok()
    };
    let top_key = |line: &str| -> Option<String> {
        let first = line.chars().next()?;
        if !(first.is_ascii_alphabetic() || first == '_') {
            return None;
        }
        let (key, _) = line.split_once(':')?;
        key.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            .then(|| key.to_string())
    };
    let mut out = String::new();
    let mut placed = Vec::new();
    let mut skipping = false;
    for line in original.split_inclusive('\n') {
        if let Some(key) = top_key(line) {
            skipping = TRIAGE_KEYS.contains(&key.as_str());
            if skipping && !placed.contains(&key) {
                out.push_str(&block(&key).unwrap_or_default());
                placed.push(key);
            }
        } else if skipping && line.starts_with('#') {
            // A comment at the margin ends a replaced block: it is a person's note.
            skipping = false;
        }
        if !skipping {
            out.push_str(line);
        }
    }
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    for key in TRIAGE_KEYS.iter().filter(|k| !placed.iter().any(|p| p == *k)) {
        out.push_str(&block(key).unwrap_or_default());
    }
    (crate::records::parse_card(out.as_bytes()).ok()? == *card).then_some(out)
}

/// A triage to record: the cards of `id` (a card id, or a fingerprint for its whole
/// group), the decision, who made it and an optional note.
#[derive(Debug, Clone)]
pub struct TriageRequest<'a> {
    pub id: &'a str,
    pub decision: &'a TriageDecision,
    pub by: &'a str,
    pub note: Option<&'a str>,
}

/// Why a triage was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum TriageError {
    /// No card has this id or fingerprint.
    #[error("no card or fingerprint `{0}`")]
    NoCard(String),
    /// A card file could not be read or written (the message names it).
    #[error("{0}")]
    Files(String),
    #[error(transparent)]
    History(#[from] crate::history::HistoryError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

/// Records a triage the way `builder cards triage` does, for every caller (the
/// command and `builder serve`): the card files of `req.id` get the triage block
/// ([`triage`]), and the work tree is looked at again so the index holds the edited
/// files (and knows they differ from HEAD, so undoing the edit undoes it there).
/// Nothing is committed: the card files are left for the engineer to commit.
pub fn triage_cards(
    repo: &git2::Repository,
    store: &mut crate::store::Store,
    req: &TriageRequest,
    skipped: &mut Vec<String>,
) -> Result<Vec<Card>, TriageError> {
    let root = repo
        .workdir()
        .map(Path::to_path_buf)
        .ok_or_else(|| TriageError::Files("the repository has no work tree".into()))?;
    let paths = crate::history::card_paths(store, req.id)?;
    if paths.is_empty() {
        return Err(TriageError::NoCard(req.id.to_string()));
    }
    let done = triage(&root, &paths, req.decision, req.by, req.note).map_err(TriageError::Files)?;
    crate::history::overlay_worktree_cards(repo, store, skipped)?;
    Ok(done)
}

/// Replaces the file at `path` with `bytes` whole or not at all: a temporary file
/// beside it, fsynced, renamed over it. A triage killed mid-write leaves the card as
/// it was (and at most a `.tmp*` file beside it), never a truncated card.
fn replace_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    if let Ok(m) = std::fs::metadata(path) {
        tmp.as_file().set_permissions(m.permissions())?;
    }
    tmp.write_all(bytes)?;
    tmp.as_file().sync_all()?;
    crate::failpoint!("triage-before-rename");
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

/// A GitHub issue body (POST /repos/{owner}/{repo}/issues).
#[derive(Debug, Clone, Serialize)]
pub struct GithubIssue {
    pub title: String,
    pub body: String,
    pub labels: Vec<String>,
}

/// One issue per fingerprint group; `latest` is the group's newest card. Card text
/// (summaries, details and evidence hold what the model chose) is in code spans and
/// fences ([`crate::text`]), so nothing of it is a live heading, image, link or mention
/// in the issue.
pub fn github_issue(group: &CardGroup, latest: Option<&Card>) -> GithubIssue {
    use crate::text::{markdown_code as code, markdown_fence, printable};
    let mut body = format!(
        "**{}** card for task {}, seen **{}** time(s) between {} and {}.\n\nFingerprint: {}  \nLatest card: {} ({})  \nStatus: {}\n",
        group.kind,
        code(&group.task),
        group.count,
        code(&group.first_seen),
        code(&group.last_seen),
        code(&group.fingerprint),
        code(&group.latest_id),
        code(&group.latest_path),
        group.status
    );
    if let Some(c) = latest {
        body.push_str(&format!(
            "\n### Summary\n\n{}",
            markdown_fence(c.summary.trim(), "text")
        ));
        body.push_str(&format!("\n### Detail\n\n{}", markdown_fence(c.detail.trim(), "text")));
        if !c.evidence.is_empty() {
            body.push_str("\n### Evidence\n\n");
            for e in &c.evidence {
                body.push_str(&format!("- {}\n", code(e)));
            }
        }
        body.push_str(&format!("\nRun: {}\n", code(&c.run_id)));
    }
    let summary: String = group.summary.chars().take(120).collect();
    GithubIssue {
        title: crate::text::github_plain(&format!("[{}] {} ({})", group.kind, summary, group.task)),
        body,
        labels: vec![
            "agent-card".into(),
            group.kind.to_string(),
            printable(&format!("task:{}", group.task)).into_owned(),
        ],
    }
}

/// The work tree's card files for card `id` (`cards/<day>/<id>.yaml`), repo-relative
/// and sorted. An id that is not a plain file name (empty, a `/`, `..`) names no card:
/// ids also come from commit trailers, which anyone can write.
pub fn work_tree_card_paths(root: &std::path::Path, id: &str) -> Vec<String> {
    if id.is_empty() || id.contains('/') || id.contains("..") {
        return Vec::new();
    }
    let Ok(days) = std::fs::read_dir(root.join("cards")) else {
        return Vec::new();
    };
    let mut out: Vec<String> = days
        .flatten()
        .filter(|d| d.path().join(format!("{id}.yaml")).is_file())
        .map(|d| format!("cards/{}/{id}.yaml", d.file_name().to_string_lossy()))
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::{card_yaml, read_card, CardKind};

    #[test]
    fn a_retriage_keeps_the_earlier_decision() {
        let dir = tempfile::tempdir().unwrap();
        let card = Card::new(CardKind::MaxSteps, "t", "run-1", "s", "d", vec![], Utc::now());
        let rel = card.rel_path();
        std::fs::create_dir_all(dir.path().join(rel.parent().unwrap())).unwrap();
        let yaml = card_yaml(&card).unwrap();
        assert!(!yaml.contains("triage_history"), "an untriaged card has no history key");
        std::fs::write(dir.path().join(&rel), yaml).unwrap();
        let paths = vec![rel.to_string_lossy().into_owned()];
        triage(dir.path(), &paths, &TriageDecision::Accept, "a <a@x>", Some("first")).unwrap();
        let once = read_card(&dir.path().join(&rel)).unwrap();
        assert!(once.triage_history.is_empty());
        triage(dir.path(), &paths, &TriageDecision::Reject, "b <b@x>", None).unwrap();
        let twice = read_card(&dir.path().join(&rel)).unwrap();
        assert_eq!(twice.status, CardStatus::Rejected);
        assert_eq!(twice.triage.as_ref().map(|t| t.decision), Some(TriageKind::Reject));
        assert_eq!(twice.triage_history.len(), 1);
        assert_eq!(twice.triage_history[0].decision, TriageKind::Accept);
        assert_eq!(twice.triage_history[0].note.as_deref(), Some("first"));
    }

    /// A person's comments in a card file survive its triage, first and again
    /// (helper-79: the file was written anew and they were gone).
    #[test]
    fn a_triage_keeps_the_comments_a_person_wrote_in_the_card_file() {
        let dir = tempfile::tempdir().unwrap();
        let card = Card::new(CardKind::MaxSteps, "t", "run-1", "s", "d", vec![], Utc::now());
        let rel = card.rel_path();
        std::fs::create_dir_all(dir.path().join(rel.parent().unwrap())).unwrap();
        let notes = [
            "# opened by the 3 a.m. fire",
            "# investigation: see ticket OPS-123",
            "# last line",
        ];
        let yaml = card_yaml(&card)
            .unwrap()
            .replace("status: open\n", &format!("status: open\n{}\n", notes[1]));
        let text = format!("{}\n{yaml}{}\n", notes[0], notes[2]);
        std::fs::write(dir.path().join(&rel), &text).unwrap();
        let paths = vec![rel.to_string_lossy().into_owned()];
        for (decision, status) in [
            (TriageDecision::Accept, CardStatus::Accepted),
            (TriageDecision::Reject, CardStatus::Rejected),
        ] {
            triage(dir.path(), &paths, &decision, "a <a@x>", Some("why")).unwrap();
            let written = std::fs::read_to_string(dir.path().join(&rel)).unwrap();
            for n in notes {
                assert!(written.contains(n), "{n} lost:\n{written}");
            }
            assert_eq!(read_card(&dir.path().join(&rel)).unwrap().status, status, "{written}");
        }
        let twice = read_card(&dir.path().join(&rel)).unwrap();
        assert_eq!(twice.triage_history.len(), 1);
        assert_eq!((twice.summary.as_str(), twice.detail.as_str()), ("s", "d"));
    }
}
