//! Where both binaries' log lines go: stderr, each line redacted first
//! ([`shared::secrets::redact_log_line`]: the secret-looking variables, and the key
//! and token variables a fire's settings name, whatever their names).

use std::io::Write;

/// A `tracing` writer to stderr that redacts each line; `before` runs first (the
/// runtime clears a live progress line there).
pub struct RedactingStderr {
    pub before: fn(),
}

impl Write for RedactingStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        (self.before)();
        std::io::stderr().write_all(shared::secrets::redact_log_line(&text).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// Log lines are redacted of every secret-looking variable of the environment from
/// the start of the process (`*KEY*`, `*TOKEN*`, `*SECRET*`, `*PASSWORD*`).
pub fn redact_secret_like_env() {
    shared::secrets::redact_in_logs(&shared::secrets::Redactor::from_secret_like_env());
}
