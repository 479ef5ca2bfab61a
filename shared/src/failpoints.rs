//! Named crash points for the crash suite (TiKV's `fail` crate), compiled in only
//! in builds made for tests: the `failpoints` cargo feature (which the end-to-end
//! tests crate turns on) *and* debug assertions (the dev and test profiles). A
//! whole-workspace `cargo build --release --workspace` unifies the feature into
//! `shared` too, because the tests crate is a member; without the second condition
//! its `runtime` would carry the points and `RUNTIME_FAILPOINTS` could kill a
//! production fire. [`crate::failpoint!`] marks a point; [`arm`] reads
//! `RUNTIME_FAILPOINTS` (`name[@n][:signal],...`: signal this process the `n`th time
//! the point is reached, the first by default; `kill` (SIGKILL, the default), `term`
//! (SIGTERM), `int` (SIGINT) or `hup` (SIGHUP), so a test cancels a fire at a named
//! point as a person or systemd would; `stop` (SIGSTOP), so a test changes the
//! repository under a fire held at a named point and then sends `SIGCONT`) once at
//! start. Outside test builds both
//! compile to nothing.

/// The environment variable that arms crash points.
pub const FAILPOINTS_ENV: &str = "RUNTIME_FAILPOINTS";

/// Whether this build carries the crash points (a test build: the `failpoints`
/// feature and debug assertions); release builds never do.
pub const COMPILED_IN: bool = cfg!(all(feature = "failpoints", debug_assertions));

/// Marks a named crash point.
#[macro_export]
macro_rules! failpoint {
    ($name:literal) => {
        #[cfg(all(feature = "failpoints", debug_assertions))]
        ::fail::fail_point!($name);
    };
}

/// Arms the crash points `RUNTIME_FAILPOINTS` names: each SIGKILLs the process (no
/// unwinding, no destructor, like the OOM killer) when reached the given time, or
/// sends it the SIGTERM or SIGINT its `:term` / `:int` asks for.
#[cfg(all(feature = "failpoints", debug_assertions))]
pub fn arm() {
    use kernel::signal::Signal;
    use std::sync::atomic::{AtomicU32, Ordering};
    let Ok(spec) = std::env::var(FAILPOINTS_ENV) else {
        return;
    };
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (item, signal) = match item.split_once(':') {
            Some((item, "term")) => (item, Signal::Term),
            Some((item, "int")) => (item, Signal::Int),
            Some((item, "hup")) => (item, Signal::Hup),
            Some((item, "stop")) => (item, Signal::Stop),
            Some((item, _)) => (item, Signal::Kill),
            None => (item, Signal::Kill),
        };
        let (name, nth) = match item.split_once('@') {
            Some((n, k)) => (n, k.parse::<u32>().unwrap_or(1).max(1)),
            None => (item, 1),
        };
        let seen = AtomicU32::new(0);
        let armed = fail::cfg_callback(name, move || {
            if seen.fetch_add(1, Ordering::SeqCst) + 1 == nth {
                // Its handler (SIGTERM, SIGINT) runs on this thread before `raise`
                // returns, and tells the async runtime's listener through the
                // shared registry.
                let _ = kernel::signal::raise(signal);
            }
        });
        if let Err(e) = armed {
            tracing::warn!(point = name, error = %e, "crash point not armed");
        }
    }
}

/// Outside test builds there is nothing to arm: `RUNTIME_FAILPOINTS` is ignored.
#[cfg(not(all(feature = "failpoints", debug_assertions)))]
pub fn arm() {}

#[cfg(test)]
mod tests {
    #[test]
    fn crash_points_exist_only_in_test_builds() {
        // `cargo test` builds with debug assertions; a release build never has them.
        assert_eq!(
            super::COMPILED_IN,
            cfg!(feature = "failpoints") && cfg!(debug_assertions)
        );
        const { assert!(!super::COMPILED_IN || cfg!(debug_assertions)) };
    }
}
