//! What kind of problem an error is, read off its cause chain: the machine's (a
//! permission, a lock, a full or read-only disk, no repository), the input's (a bad
//! revision, bad settings, no git identity), or a bug. Both binaries turn a failed
//! command into their exit code from this one reading (each in its
//! `command_error.rs`); the library only says what went wrong, never which code.

use crate::diag::Diagnostics;
use crate::git::GitError;
use crate::review::ReviewError;
use crate::state::StateError;
use crate::store::StoreError;
use std::error::Error as StdError;

/// The kind of a recognised cause.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CauseKind {
    /// Bad arguments: fix the command line.
    Usage,
    /// Bad settings or git config: fix the file named.
    Config,
    /// Permissions, locks, disk, a missing repository: fix the machine.
    Environment,
    /// A rule of the review workflow says no (self-approval, no valid approval).
    Refused,
    /// A bug.
    Internal,
}

/// A recognised cause: its kind and what to do about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    pub kind: CauseKind,
    pub hint: Option<String>,
}

impl Cause {
    fn new(kind: CauseKind, hint: Option<&str>) -> Option<Cause> {
        Some(Cause {
            kind,
            hint: hint.map(str::to_string),
        })
    }
}

/// The first cause in `chain` (outermost first) that we recognise, if any; an error
/// with none is a bug.
pub fn classify<'a>(chain: impl IntoIterator<Item = &'a (dyn StdError + 'static)>) -> Option<Cause> {
    chain.into_iter().find_map(classify_one)
}

/// The kind (and a hint) of one cause in an error chain, when we recognise it.
pub fn classify_one(cause: &(dyn StdError + 'static)) -> Option<Cause> {
    if let Some(e) = cause.downcast_ref::<GitError>() {
        return git_error(e);
    }
    if let Some(e) = cause.downcast_ref::<ReviewError>() {
        return match e {
            ReviewError::Refused(_) => Cause::new(CauseKind::Refused, None),
            ReviewError::Usage(_) => Cause::new(
                CauseKind::Usage,
                Some("`builder proposals` lists proposals and their states"),
            ),
            ReviewError::Remote { .. } => Cause::new(
                CauseKind::Environment,
                Some(
                    "check that the remote is reachable (`git fetch` shows the same error), then run the command again",
                ),
            ),
            // The cause below (git2, io, the repository) decides.
            ReviewError::Git(_) | ReviewError::Repo(_) | ReviewError::Io { .. } => None,
        };
    }
    if let Some(e) = cause.downcast_ref::<StateError>() {
        return state_error(e);
    }
    if cause.downcast_ref::<Diagnostics>().is_some() {
        return Cause::new(
            CauseKind::Config,
            Some("`builder check` and `runtime check` list every problem with file:line"),
        );
    }
    if let Some(e) = cause.downcast_ref::<StoreError>() {
        return store_error(e);
    }
    if let Some(e) = cause.downcast_ref::<std::io::Error>() {
        return io_error(e);
    }
    if let Some(e) = cause.downcast_ref::<git2::Error>() {
        return git2_error(e);
    }
    if let Some(e) = cause.downcast_ref::<rusqlite::Error>() {
        return sqlite_error(e);
    }
    None
}

fn git_error(e: &GitError) -> Option<Cause> {
    match e {
        GitError::NotARepo { .. } => Cause::new(
            CauseKind::Environment,
            Some("run inside an agent repository or pass -C <repo>; `builder init <path>` makes one"),
        ),
        GitError::NoIdentity { .. } => Cause::new(
            CauseKind::Config,
            Some("tell git who you are: git config user.name \"Your Name\" && git config user.email you@example.com"),
        ),
        // Only a fire commits, and it never asks to commit outside its paths.
        GitError::Refused { .. } => Cause::new(CauseKind::Internal, None),
        // A held lock, a branch that kept moving: the machine, not the input.
        GitError::Locked { .. } | GitError::HeadMoving { .. } | GitError::Undo { .. } => {
            Cause::new(CauseKind::Environment, None)
        }
        // A person's rebase or merge, a detached HEAD: the checkout's state, said in
        // the message with the way out.
        GitError::Blocked(_) => Cause::new(CauseKind::Environment, None),
        // The cause below (git2 or io) decides.
        GitError::Git(_) | GitError::Io { .. } => None,
    }
}

fn state_error(e: &StateError) -> Option<Cause> {
    match e {
        StateError::Store(store) => store_error(store),
        StateError::Checkpoint { .. } => Cause::new(
            CauseKind::Environment,
            Some("the run's checkpoint in .runtime/state.db is damaged: the run cannot be resumed"),
        ),
        StateError::NoCheckpoint(_)
        | StateError::NotWaiting(_)
        | StateError::OtherCall { .. }
        | StateError::HashMismatch(_) => Cause::new(
            CauseKind::Usage,
            Some("`runtime runs` lists runs; only `waiting_approval` runs can be resumed"),
        ),
    }
}

fn store_error(e: &StoreError) -> Option<Cause> {
    match e {
        StoreError::TooNew { .. } => Cause::new(
            CauseKind::Environment,
            Some("a newer binary wrote this database: update this one, or delete the .runtime/ file named"),
        ),
        // The source (SQLite or io) decides.
        StoreError::Sqlite { source, .. } => sqlite_error(source),
        StoreError::Io { source, .. } => io_error(source),
    }
}

fn io_error(e: &std::io::Error) -> Option<Cause> {
    use std::io::ErrorKind as K;
    let hint = match e.kind() {
        K::PermissionDenied => "check the permissions of the path named above (.runtime/, the records, .git)",
        K::ReadOnlyFilesystem => "the repository is on a read-only file system: run where it can be written",
        K::StorageFull | K::QuotaExceeded | K::FileTooLarge => "the disk is full: free some space and run again",
        K::NotFound => "check that the path exists (-C takes the repository's directory)",
        K::ResourceBusy | K::WouldBlock => "another process holds the file: wait for it and run again",
        K::AlreadyExists => "a file is in the way: move it aside if nothing else is using it",
        // Bad data or a bad call of ours: let the chain (or a bug report) decide.
        K::InvalidData | K::InvalidInput | K::Unsupported | K::Other => return None,
        _ => return Cause::new(CauseKind::Environment, None),
    };
    Cause::new(CauseKind::Environment, Some(hint))
}

fn git2_error(e: &git2::Error) -> Option<Cause> {
    use git2::{ErrorClass as C, ErrorCode as E};
    match (e.code(), e.class()) {
        (E::Locked, _) => Cause::new(
            CauseKind::Environment,
            Some("another git process holds the lock named above: wait for it, or remove the lock file if none is running"),
        ),
        (E::Owner, _) => Cause::new(
            CauseKind::Environment,
            Some("the repository belongs to another user: see `git config --global --add safe.directory <repo>`"),
        ),
        (_, C::Os) | (_, C::Filesystem) => Cause::new(CauseKind::Environment, None),
        (E::NotFound, C::Repository) => Cause::new(
            CauseKind::Environment,
            Some("run inside an agent repository or pass -C <repo>"),
        ),
        (E::NotFound, C::Reference) | (E::InvalidSpec, _) | (E::Ambiguous, _) => {
            Cause::new(CauseKind::Usage, Some("`git log --oneline` lists revisions"))
        }
        (_, C::Config) => Cause::new(
            CauseKind::Config,
            Some("check git's config (`git config --list --show-origin`)"),
        ),
        // libgit2's class of the shallow file (grafts) is one `git2` does not name.
        (E::GenericError, C::None) if e.message().contains("graft") => Cause::new(
            CauseKind::Environment,
            Some("the clone's list of shallow commits (`.git/shallow`) is damaged: `git fetch --unshallow`, or clone again"),
        ),
        (E::GenericError, C::Zlib | C::Odb) => Cause::new(
            CauseKind::Environment,
            Some("the repository's objects look damaged: `git fsck` names them; fetch them again from a good clone"),
        ),
        _ => None,
    }
}

fn sqlite_error(e: &rusqlite::Error) -> Option<Cause> {
    use rusqlite::ErrorCode as E;
    let rusqlite::Error::SqliteFailure(f, _) = e else {
        return None;
    };
    // A file that is no database, is corrupt, or lacks a table or column of its
    // schema (dropped or altered by hand): damage, not a bug.
    let schema_gone = f.code == E::Unknown
        && e.to_string()
            .split(": ")
            .any(|m| m.starts_with("no such table") || m.starts_with("no such column"));
    if matches!(f.code, E::NotADatabase | E::DatabaseCorrupt) || schema_gone {
        return Cause::new(
            CauseKind::Environment,
            Some("the database named above is damaged: move it aside (with its -wal and -shm files); the next fire makes a new state.db, and the next builder command rebuilds builder.db from git"),
        );
    }
    let hint = match f.code {
        E::ReadOnly => {
            "the database is read-only (a read-only file system or file): run where .runtime/ can be written"
        }
        E::DiskFull => "the disk is full: free some space and run again",
        E::DatabaseBusy | E::DatabaseLocked => "another process holds the database: wait for it and run again",
        E::PermissionDenied | E::CannotOpen => "check the permissions of .runtime/ and the database file",
        E::SystemIoFailure => "the file system failed a read or write: check the disk",
        _ => return None,
    };
    Cause::new(CauseKind::Environment, Some(hint))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    fn kind_of(e: &(dyn StdError + 'static)) -> Option<CauseKind> {
        classify_one(e).map(|c| c.kind)
    }

    #[test]
    fn io_errors_of_the_machine_are_environment_problems() {
        for k in [
            ErrorKind::PermissionDenied,
            ErrorKind::ReadOnlyFilesystem,
            ErrorKind::StorageFull,
            ErrorKind::NotFound,
        ] {
            assert_eq!(kind_of(&Error::from(k)), Some(CauseKind::Environment), "{k:?}");
        }
        assert_eq!(kind_of(&Error::from(ErrorKind::InvalidData)), None);
    }

    #[test]
    fn a_store_error_is_judged_by_its_source() {
        let full = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL), None);
        let e = StoreError::Sqlite {
            path: ".runtime/state.db".into(),
            source: full,
        };
        let cause = classify_one(&e).unwrap();
        assert_eq!(cause.kind, CauseKind::Environment);
        assert!(cause.hint.unwrap().contains("disk is full"));
        let state = StateError::Store(StoreError::TooNew {
            path: "x".into(),
            found: 9,
            known: 6,
        });
        assert_eq!(kind_of(&state), Some(CauseKind::Environment));
    }

    #[test]
    fn a_held_lock_and_a_bad_revision() {
        let locked = git2::Error::new(git2::ErrorCode::Locked, git2::ErrorClass::Os, "index.lock exists");
        assert_eq!(kind_of(&locked), Some(CauseKind::Environment));
        let bad = git2::Error::new(git2::ErrorCode::NotFound, git2::ErrorClass::Reference, "no such rev");
        assert_eq!(kind_of(&bad), Some(CauseKind::Usage));
    }

    /// A damaged `.git/shallow` (helper-79: `builder audit` exited 70) is the
    /// repository's trouble, named, not a bug.
    #[test]
    fn a_damaged_shallow_file_is_an_environment_problem() {
        let dir = tempfile::tempdir().unwrap();
        let repo = git2::Repository::init(dir.path()).unwrap();
        let sig = git2::Signature::now("a", "a@x").unwrap();
        let tree = repo
            .find_tree(repo.treebuilder(None).unwrap().write().unwrap())
            .unwrap();
        repo.commit(Some("HEAD"), &sig, &sig, "one", &tree, &[]).unwrap();
        std::fs::write(dir.path().join(".git/shallow"), "garbage\n").unwrap();
        let e = git2::Repository::open(dir.path())
            .err()
            .expect("the damaged file is read");
        let cause = classify_one(&e).expect("classified");
        assert_eq!(cause.kind, CauseKind::Environment, "{e}");
        assert!(cause.hint.as_deref().unwrap_or("").contains("shallow"), "{e}");
    }
}
