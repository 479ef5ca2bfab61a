//! The tool worker's mask walk (the Read-deny files, sockets and other special files
//! of the work tree it must not see), run by the runtime with its cache in `.runtime/`
//! so an unchanged directory is not listed again. A fire whose preparation runs
//! nothing in the work tree before the model (no prefetch) starts the walk as soon as
//! the worker has its configuration, on a thread joined before this process enters
//! Landlock (no thread of it stays outside its sandbox); the worker then has its masks
//! while the first model request is still being prepared. A walk not done by then is
//! stopped rather than waited for (the preparation is not held up), and the walk runs
//! again once the sandbox is entered, while the first request is out, as it does
//! without the early start.

use crate::agent::worker_client::PendingMasks;
use crate::sandbox::mask_walk::{walk_masks_until, CacheWrite, CACHE_FILE};
use crate::sandbox::namespaces::{mask_line, MaskLine, NamespacePlan};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// What a walk gives: the worker's mask line, and the cache write it leaves to do.
type Walked = (MaskLine, Option<CacheWrite>);

/// Where a fire's mask walk stands.
#[derive(Default)]
pub(super) enum MaskWalk {
    /// Not started: the loop's start walks ([`MaskWalk::masks`]).
    #[default]
    Later,
    /// Walking on a thread started in the preparation, until told to stop.
    Walking(EarlyWalk),
    /// Walked before the sandbox was entered.
    Walked(Walked),
}

impl MaskWalk {
    /// Starts the walk of `plan` for the work tree at `root` on a thread of its own,
    /// when every directory the sandbox's entry makes is there already (one made
    /// after the walk, which a deny rule matches, would not be masked): the records
    /// directories and the worker's write directories. Otherwise the walk waits.
    pub(super) fn start(root: &Path, plan: &NamespacePlan) -> MaskWalk {
        let is_dir = |d: &Path| d.symlink_metadata().is_ok_and(|m| m.is_dir());
        let in_place = crate::layout::RUNTIME_DIRS.iter().all(|d| is_dir(&root.join(d)))
            && plan.write_dirs.iter().all(|d| is_dir(d));
        if !in_place {
            return MaskWalk::Later;
        }
        let (plan, cache) = (plan.clone(), cache_file(root));
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        match std::thread::Builder::new()
            .name("mask-walk".into())
            .spawn(move || walk(&plan, &cache, &stopped))
        {
            Ok(thread) => MaskWalk::Walking(EarlyWalk {
                thread: Some(thread),
                stop,
            }),
            // Walked later, as without the early start.
            Err(_) => MaskWalk::Later,
        }
    }

    /// Ends a walk started early, called before this process enters Landlock: its
    /// masks when it is done, else it stops at its next directory and the walk is
    /// left to [`MaskWalk::masks`].
    pub(super) fn join(&mut self) {
        if let MaskWalk::Walking(early) = self {
            *self = match early.end() {
                Some(walked) => MaskWalk::Walked(walked),
                None => MaskWalk::Later,
            };
        }
    }

    /// The worker's masks: those walked already, or a walk of `plan` started now (on
    /// tokio's blocking pool, inside the sandbox). The cache is written after the
    /// worker has its masks.
    pub(super) fn masks(mut self, root: &Path, plan: NamespacePlan) -> PendingMasks {
        self.join();
        let (found, masks) = tokio::sync::oneshot::channel();
        match self {
            MaskWalk::Walked((line, write)) => {
                let _ = found.send(line);
                if let Some(write) = write {
                    tokio::task::spawn_blocking(move || write.finish());
                }
            }
            MaskWalk::Later | MaskWalk::Walking(..) => {
                let cache = cache_file(root);
                tokio::task::spawn_blocking(move || {
                    let (line, write) = walk(&plan, &cache, &AtomicBool::new(false));
                    let _ = found.send(line);
                    if let Some(write) = write {
                        write.finish();
                    }
                });
            }
        }
        masks
    }
}

/// The thread of an early walk, stopped and joined when dropped: a preparation that
/// ends before the sandbox leaves no walk behind.
pub(super) struct EarlyWalk {
    thread: Option<std::thread::JoinHandle<Walked>>,
    stop: Arc<AtomicBool>,
}

impl EarlyWalk {
    /// Its masks when it is done by now; else stopped (at its next directory) and
    /// joined, `None`.
    fn end(&mut self) -> Option<Walked> {
        let thread = self.thread.take()?;
        let done = thread.is_finished();
        self.stop.store(true, Ordering::Relaxed);
        let walked = thread.join().ok().filter(|_| done);
        tracing::debug!(done, "early mask walk ended");
        walked
    }
}

impl Drop for EarlyWalk {
    fn drop(&mut self) {
        let _ = self.end();
    }
}

fn cache_file(root: &Path) -> PathBuf {
    root.join(crate::layout::STATE_DIR).join(CACHE_FILE)
}

fn walk(plan: &NamespacePlan, cache: &Path, stop: &AtomicBool) -> Walked {
    match walk_masks_until(plan, Some(cache), stop) {
        Ok((masked, write)) => (mask_line(Ok(masked)), Some(write)),
        Err(e) => (mask_line(Err(e.to_string())), None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_early_walk_waits_while_a_directory_the_sandbox_makes_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let plan = NamespacePlan {
            root: dir.path().to_path_buf(),
            write_dirs: vec![dir.path().join("reports")],
            ..NamespacePlan::default()
        };
        assert!(matches!(MaskWalk::start(dir.path(), &plan), MaskWalk::Later));
        for d in crate::layout::RUNTIME_DIRS {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        let mut walk = MaskWalk::start(dir.path(), &plan);
        assert!(matches!(walk, MaskWalk::Walking(_)));
        // Ended before the sandbox: walked, or stopped and left for later; never running.
        walk.join();
        assert!(matches!(walk, MaskWalk::Walked(_) | MaskWalk::Later));
    }
}
