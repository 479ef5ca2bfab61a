//! What the sync means for one fire: [`FireSync::begin`] syncs before the fire and
//! says what the fire records (at most one card per cause, remembered in the state
//! database's refusals under the sync's own keys: one for why the box cannot move,
//! one for a rewritten remote history, so that either coming or going on its own
//! neither hides nor repeats the other's card); [`FireSync::push`] pushes after its
//! commit; [`FireSync::attention`] makes a fire on a box that cannot fire what the
//! remote holds end as needing attention (exit 5) every time, not only the first, with
//! the reason and the next step (through [`super::ending::Ending::worsen`]).

use super::ending::After;
use crate::agent::CardDraft;
use crate::records::{self, CardKind};
use crate::review::runtime_commits::RuntimeKeys;
use crate::review::signing::ApprovalRule;
use crate::settings::SyncSettings;
use crate::state::StateDb;
use crate::sync::{Look, Pushed, Stuck, SyncError, Way};
use git2::{Oid, Repository};
use std::path::Path;

/// The sync of one fire, from its start to its push.
pub(crate) struct FireSync {
    settings: SyncSettings,
    /// The runtime's signing keys: the commits the sync makes are signed as the
    /// fire's own, with the key their tree names ([`RuntimeKeys`]).
    keys: RuntimeKeys,
    /// Why the box fires what it has instead of the remote's tip.
    stuck: Option<Note>,
    /// The parts of the cause this fire cards that no earlier card covered,
    /// remembered once the card is committed.
    remember: Vec<Part>,
}

/// What a stuck fire says: its line and the next step.
#[derive(Debug, Clone)]
struct Note {
    message: String,
    hint: String,
}

/// One part of a cause, remembered on its own key ([`Of::key`]).
#[derive(Debug, Clone)]
struct Part {
    of: Of,
    key: String,
    kind: CardKind,
    subject: String,
}

/// Which part of a cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Of {
    /// Why the box cannot move to the remote's tip.
    Stuck,
    /// A rewrite of the remote's history.
    Rewrite,
}

impl Of {
    const ALL: [Of; 2] = [Of::Stuck, Of::Rewrite];

    /// The refusals key this part is remembered under: the sync's own, and for a
    /// rewrite that key with `:rewrite`.
    fn key(self, settings: &SyncSettings) -> String {
        let key = format!("sync:{}/{}", settings.remote, settings.branch);
        match self {
            Of::Stuck => key,
            Of::Rewrite => format!("{key}:rewrite"),
        }
    }
}

impl Part {
    fn new(of: Of, settings: &SyncSettings, kind: CardKind, subject: String) -> Part {
        Part {
            of,
            key: of.key(settings),
            kind,
            subject,
        }
    }

    fn fingerprint(&self) -> String {
        records::fingerprint(&self.key, self.kind, &self.subject)
    }
}

/// What [`FireSync::begin`] did.
pub(crate) struct Began {
    pub fire: FireSync,
    /// The commit the box moved to before the fire (its settings are the fire's now).
    pub moved: Option<Oid>,
    /// The card of a cause not carded before.
    pub card: Option<CardDraft>,
}

/// A cause, as a card and as the line every fire prints while it lasts.
struct Cause {
    parts: Vec<Part>,
    card: CardDraft,
    note: Option<Note>,
}

impl FireSync {
    /// Syncs ([`super::before_fire`]) and turns what it found into this fire's card
    /// (only for a cause not carded yet) and note.
    pub(crate) fn begin(
        repo: &Repository,
        root: &Path,
        (settings, signing_key): (SyncSettings, Option<&str>),
        rule: &ApprovalRule,
        started_at: chrono::DateTime<chrono::Utc>,
    ) -> Result<Began, SyncError> {
        let keys = RuntimeKeys::new(root, signing_key).judging(rule.clone());
        let look = crate::sync::before_fire(repo, &settings, rule, Some(root), Some(&keys))?;
        let mut fire = FireSync {
            settings,
            keys,
            stuck: None,
            remember: Vec::new(),
        };
        let mut db = StateDb::open(root)
            .map_err(|e| tracing::warn!(error = %e, "the sync's causes are not remembered: each fire cards them"))
            .ok();
        let cause = fire.cause(&look);
        // A part that ended is forgotten: its return is news.
        for of in Of::ALL {
            let present = cause.as_ref().is_some_and(|c| c.parts.iter().any(|p| p.of == of));
            if let (false, Some(db)) = (present, &mut db) {
                if let Err(e) = db.clear_refusal(&of.key(&fire.settings)) {
                    tracing::warn!(error = %e, "the sync's last cause was not forgotten");
                }
            }
        }
        let Some(cause) = cause else {
            return Ok(Began {
                fire,
                moved: look.moved,
                card: None,
            });
        };
        let mut stuck_seen = None;
        for part in cause.parts {
            let seen = db.as_mut().and_then(|db| {
                db.repeat_refusal(&part.key, &part.fingerprint(), &part.subject, started_at)
                    .ok()
                    .flatten()
            });
            match seen {
                Some(seen) if part.of == Of::Stuck => stuck_seen = Some(seen),
                Some(_) => {}
                None => fire.remember.push(part),
            }
        }
        let news = !fire.remember.is_empty();
        let card = match fire.remember.iter().any(|p| p.of == Of::Rewrite) {
            true => Some(cause.card),
            // The rewrite was carded already: the news is why the box cannot move,
            // on a card of that cause's own kind.
            false if news => fire
                .cause(&crate::sync::Look {
                    rewritten: None,
                    ..look.clone()
                })
                .map(|c| c.card),
            false => None,
        };
        fire.stuck = cause.note.map(|mut n| {
            if let (false, Some(seen)) = (news, &stuck_seen) {
                n.message = format!(
                    "{} (carded by run {}; {} fires since)",
                    n.message, seen.card_id, seen.count
                );
            }
            n
        });
        Ok(Began {
            fire,
            moved: look.moved,
            card,
        })
    }

    /// The cause `look` reports, if any: a tip the box cannot fire, or a rewritten
    /// remote history that took commits the box had.
    fn cause(&self, look: &Look) -> Option<Cause> {
        let s = &self.settings;
        let at = format!("{}/{}", s.remote, s.branch);
        let local = crate::text::short_oid(look.local);
        let stuck = match &look.way {
            Way::Stuck(stuck) => Some(stuck),
            _ => None,
        };
        let why = match stuck {
            Some(stuck) => stuck_why(&at, stuck),
            None => match &look.rewritten {
                Some(_) => StuckWhy {
                    reason: String::new(),
                    hint: String::new(),
                    kind: CardKind::SyncFailed,
                    subject: String::new(),
                    evidence: vec![],
                },
                None => return None,
            },
        };
        let rewritten = rewrite_detail(&at, look);
        let card = cause_card(&at, &local, look, stuck, rewritten, &why)?;
        let note = stuck.map(|_| Note {
            message: format!("{} (this fire ran on {local})", card.summary),
            hint: why.hint.clone(),
        });
        let parts = stuck
            .map(|_| Part::new(Of::Stuck, s, why.kind, why.subject))
            .into_iter()
            .chain(
                look.rewritten
                    .as_ref()
                    .map(|r| Part::new(Of::Rewrite, s, CardKind::SyncFailed, format!("rewrite:{}", r.from))),
            )
            .collect();
        Some(Cause { parts, card, note })
    }

    /// After the fire's commit: pushes its records ([`super::push_after`]).
    pub(crate) fn push(&self, repo: &Repository, runtime_email: &str) -> Result<Pushed, SyncError> {
        crate::sync::push_after(repo, &self.settings, runtime_email, Some(&self.keys))
    }

    /// What the push makes of the fire: a box that cannot fire what the remote holds
    /// needs attention on every fire (exit 5), with the reason and the next step; so
    /// does one whose push had to replay onto a history rewritten during the fire.
    /// `None` when neither holds.
    pub(crate) fn attention(&self, pushed: Option<&Pushed>) -> Option<After> {
        let note = match (&self.stuck, pushed) {
            (Some(n), _) => n.clone(),
            (None, Some(Pushed::Replayed { head, records, .. })) => Note {
                message: format!(
                    "{}/{} was rewritten during the fire: {records} record(s) replayed onto it ({}); the next fire decides whether the box can join the new history",
                    self.settings.remote,
                    self.settings.branch,
                    crate::text::short_oid(*head)
                ),
                hint: "`runtime check` on the box shows the state; the next fire cards what it finds".into(),
            },
            (None, Some(Pushed::Held { tip, why })) => Note {
                message: format!(
                    "{}/{} moved during the fire to a commit the box cannot check out safely ({}): {why}. This fire's records stay committed on the box and go with the first push after it is replaced",
                    self.settings.remote,
                    self.settings.branch,
                    crate::text::short_oid(*tip)
                ),
                hint: "replace that commit on the remote from a clone with one git writes; the next fire cards it".into(),
            },
            (None, _) => return None,
        };
        Some(After::Attention {
            message: note.message,
            hint: note.hint,
        })
    }

    /// Once this fire's card of the cause is committed, later fires add none for it
    /// (remembered only then: a crash before the commit leaves the card to the next
    /// fire, never a cause remembered with no card behind it).
    pub(crate) fn remember(&self, db: Option<&mut StateDb>, run_id: &str, at: chrono::DateTime<chrono::Utc>) {
        let Some(db) = db else {
            return;
        };
        for p in &self.remember {
            if let Err(e) = db.remember_refusal(&p.key, &p.fingerprint(), &p.subject, run_id, at) {
                tracing::warn!(error = %e, "the sync's cause was not remembered; the next fire cards it again");
            }
        }
    }
}

/// Whether a fire syncs: one that commits and is not an eval's. A `--no-commit` fire
/// leaves nothing to push (and must not move the branch under a person trying a
/// task); an eval fire runs in a throwaway worktree under review. The one place this
/// is decided.
pub fn applies(opts: &super::FireOptions) -> bool {
    !opts.no_commit && !opts.eval
}

/// Why the box cannot fire the remote's tip, and what its card records.
struct StuckWhy {
    reason: String,
    /// The next step.
    hint: String,
    kind: CardKind,
    /// What the card is about, remembered so the same cause is carded once.
    subject: String,
    evidence: Vec<String>,
}

/// Why a box stuck on `stuck` cannot fire the tip of `at` (`remote/branch`).
fn stuck_why(at: &str, stuck: &Stuck) -> StuckWhy {
    match stuck {
        Stuck::Unapproved { tip, tree, why } => StuckWhy {
            reason: format!("{at} holds builder tree {} with no approval that counts", crate::text::short_oid(*tree)),
            hint: format!(
                "approve that tree (`builder approve <proposal> --push`, by someone other than its authors) or revert it on {at}; `runtime check` on the box shows the state"
            ),
            kind: CardKind::UnreviewedChanges,
            subject: tree.to_string(),
            evidence: {
                let mut e = vec![tip.to_string()];
                e.extend(why.iter().cloned());
                e
            },
        },
        Stuck::TracksState { tip, state } => StuckWhy {
            reason: format!(
                "{at} moved to a commit that tracks {}/ ({})",
                crate::layout::STATE_DIR,
                crate::text::short_oid(*tip)
            ),
            hint: format!(
                "remove it on {at} from a clone: `git rm -r --cached {dir} && git commit -m 'untrack {dir}' && git push`",
                dir = crate::layout::STATE_DIR
            ),
            kind: CardKind::UnreviewedChanges,
            subject: format!("state:{state}"),
            evidence: vec![tip.to_string()],
        },
        Stuck::Unsafe { tip, why } => StuckWhy {
            reason: format!(
                "{at} moved to a commit the box cannot check out safely ({}): {why}",
                crate::text::short_oid(*tip)
            ),
            hint: format!("replace that commit on {at} from a clone with one git writes (`git fsck` names a tree git refuses; `reports`, `runs` and `cards` must be directories); the box stays on what it has"),
            kind: CardKind::UnreviewedChanges,
            subject: format!("unsafe:{tip}"),
            evidence: vec![tip.to_string()],
        },
        Stuck::KeyMissing { tip, var, tree } => StuckWhy {
            reason: format!("{at}'s settings name the key variable `{var}`, unset or empty on the cron box"),
            hint: format!(
                "set `{var}` in the cron job's environment (a line of the crontab, or the env file it sources); the next fire then moves to the tip"
            ),
            kind: CardKind::InvalidConfig,
            subject: format!("key:{var}:{tree}"),
            evidence: vec![tip.to_string()],
        },
        Stuck::Rollback { tip, back } => StuckWhy {
            reason: format!("{at} holds an older approved tree: {}", back.summary()),
            hint: format!(
                "to go back on purpose, have that tree approved again (propose the revert, approve, merge, push); otherwise push the newer tree back to {at}"
            ),
            kind: CardKind::UnreviewedChanges,
            subject: format!("rollback:{}", back.tree),
            evidence: vec![tip.to_string(), back.newest.id.clone(), back.ran.id.clone()],
        },
    }
}

/// What a rewritten remote history took from the box, for its card; `None` when the
/// history was not rewritten.
fn rewrite_detail(at: &str, look: &Look) -> Option<String> {
    look.rewritten.as_ref().map(|r| {
        let replayed = match look.replayed.len() {
            0 => String::new(),
            n => format!(
                "; {n} record(s) it dropped were replayed onto the new tip ({}{})",
                look.replayed.iter().take(20).cloned().collect::<Vec<_>>().join(", "),
                if n > 20 { ", ..." } else { "" }
            ),
        };
        format!(
            "{at} was rewritten (a force push): {} is no longer in it, and {} commit(s) the cron box had went with it{replayed}. Receipts of earlier fires may name commits the remote no longer has; the box's old branch is kept as {}. If the rewrite meant to remove records, remove them again with a new commit (a force push while the box runs brings them back)",
            crate::text::short_oid(r.from),
            r.lost,
            look.kept.as_deref().unwrap_or("(nothing kept)")
        )
    })
}

/// The card of a cause: why the box is stuck, the rewrite, or both; `None` for
/// neither.
fn cause_card(
    at: &str,
    local: &str,
    look: &Look,
    stuck: Option<&Stuck>,
    rewritten: Option<String>,
    stuck_why: &StuckWhy,
) -> Option<CardDraft> {
    let StuckWhy {
        reason,
        hint,
        kind: stuck_kind,
        evidence,
        ..
    } = stuck_why;
    let (summary, detail, kind, evidence) = match (stuck, rewritten) {
        (Some(_), None) => (
            format!("{reason}: the cron box fires what it has"),
            format!(
                "{reason}. The cron box keeps firing {local} (the tree it last moved to) and does not move until it can fire the tip: every fire exits 5 until then, with this card written once. {}{}\nNext: {hint}",
                match stuck {
                    Some(Stuck::Unsafe { .. }) => format!("Its records stay committed on the box, and reach {at} with the first push after that tip is replaced."),
                    _ => format!("Its records still reach {at}, joined onto its tip, so this card is there too."),
                },
                match stuck {
                    Some(Stuck::Unapproved { why, .. }) if !why.is_empty() => format!("\nWhy the approvals naming it do not count:\n- {}", why.join("\n- ")),
                    _ => String::new(),
                }
            ),
            *stuck_kind,
            evidence.clone(),
        ),
        (Some(_), Some(rw)) => (
            format!("{at} was rewritten and the cron box cannot fire its tip: {reason}"),
            format!(
                "{rw}.\nThe box cannot join the new history: {reason}. It keeps firing {local} and replays each fire's records onto {at}'s tip; every fire exits 5 until it can move.\nNext: {hint}"
            ),
            CardKind::SyncFailed,
            evidence.clone(),
        ),
        (None, Some(rw)) => (
            format!(
                "{at} was rewritten (a force push): the cron box {} its records and {}",
                if look.replayed.is_empty() { "kept" } else { "replayed" },
                match look.moved {
                    Some(to) => format!("moved to {}", crate::text::short_oid(to)),
                    None => "pushes them with this fire".into(),
                }
            ),
            format!("{rw}."),
            CardKind::SyncFailed,
            look.replayed.clone(),
        ),
        (None, None) => return None,
    };
    Some(CardDraft {
        kind,
        summary,
        detail,
        evidence,
    })
}
