//! The tool worker's mask walk (the Read-deny files, sockets and other special files
//! of the work tree it must not see), run by the runtime with its cache in `.runtime/`
//! so an unchanged directory is not listed again. The walk runs once the runtime is in
//! its sandbox, on a thread of its own at a lower priority, while the worker builds its
//! root and the first model request goes out. (A walk started during the preparation, on a thread
//! stopped before the sandbox, made the first request 2.5-3 ms later on 2 cores and
//! the fire no shorter: docs/benchmarks.md.)

use crate::agent::worker_client::PendingMasks;
use crate::sandbox::mask_walk::{walk_masks, CACHE_FILE};
use crate::sandbox::namespaces::{mask_line, NamespacePlan};
use std::path::Path;

/// How much lower than the fire's own threads the walk runs (a nice value): where they
/// compete for a CPU, as on 2 cores while the first model request is made and the
/// worker builds its root, the walk gets about a tenth of it.
const WALK_NICE: i32 = 10;

/// The walk's thread, joined when dropped, so the process never exits in the middle of
/// the cache's write (which would leave its temporary file behind).
#[derive(Default)]
pub(super) struct WalkThread(Option<std::thread::JoinHandle<()>>);

impl Drop for WalkThread {
    fn drop(&mut self) {
        if let Some(walk) = self.0.take() {
            let _ = walk.join();
        }
    }
}

/// The worker's masks for `plan` in the work tree at `root`: walked on a thread of its
/// own at a lower priority and sent as soon as found; the cache is written after that.
/// (No thread: the masks' channel closes, and the worker refuses to start in every
/// mode, [`crate::sandbox::DENY_MASKS`].)
pub(super) fn masks(root: &Path, plan: NamespacePlan) -> (PendingMasks, WalkThread) {
    let (found, masks) = tokio::sync::oneshot::channel();
    let cache = root.join(crate::layout::STATE_DIR).join(CACHE_FILE);
    let walk = move || {
        if let Err(e) = kernel::process::lower_thread_priority(WALK_NICE) {
            tracing::debug!(error = %e, "the mask walk runs at the fire's priority");
        }
        match walk_masks(&plan, Some(&cache)) {
            Ok((masked, write)) => {
                let _ = found.send(mask_line(Ok(masked)));
                write.finish();
            }
            // The worker names the piece (`read deny masks`) as it refuses.
            Err(e) => {
                let _ = found.send(mask_line(Err(e.source.to_string())));
            }
        }
    };
    let thread = std::thread::Builder::new().name("mask-walk".into()).spawn(walk);
    if let Err(e) = &thread {
        tracing::warn!(error = %e, "no thread for the mask walk");
    }
    (masks, WalkThread(thread.ok()))
}
