//! What a command that ignores SIGPIPE prints on stdout (`runtime fire` and `resume`:
//! a closed pipe to a dead tool worker must be an error they handle, never a signal
//! that kills them mid-run), through [`outln!`](crate::outln) and
//! [`out!`](crate::out) instead of `println!`, which panics on a broken pipe: the
//! fire would end with exit 101 after its records were committed. Here a reader that
//! went away (`runtime fire t --json | head -c 100`) ends the printing, and the
//! command exits with its own code. Other commands keep the default SIGPIPE and end
//! quietly like any Unix tool.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once a write to stdout failed: later output is not attempted.
static GONE: AtomicBool = AtomicBool::new(false);

/// Writes `args` to stdout unless an earlier write failed.
pub fn write(args: std::fmt::Arguments<'_>) {
    if GONE.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    if out.write_fmt(args).and_then(|()| out.flush()).is_err() {
        GONE.store(true, Ordering::Relaxed);
    }
}

/// `println!` for the binaries' stdout ([`write`]).
#[macro_export]
macro_rules! outln {
    () => {
        $crate::stdout::write(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` for the binaries' stdout ([`write`]).
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::stdout::write(format_args!($($arg)*))
    };
}
