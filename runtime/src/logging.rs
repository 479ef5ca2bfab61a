//! Logging through tracing to stderr: quiet by default (warnings and errors only),
//! `-v` for info, `-vv` for debug, `--log-format json` for machines. Every line passes
//! through the secret redactor before it is written, clears a live progress line
//! first, and carries colour only at a terminal without `NO_COLOR` (cron mail and
//! pipes get no escape code).

use shared::secrets::Redactor;
use std::io::{IsTerminal, Write};
use std::sync::Arc;

#[derive(Debug, Clone, Copy, clap::ValueEnum, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

struct RedactingStderr {
    redactor: Arc<Redactor>,
}

impl Write for RedactingStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        crate::progress::clear_line();
        std::io::stderr().write_all(self.redactor.redact(&text).as_bytes())?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

pub fn init(verbose: u8, format: LogFormat) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("RUNTIME_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let redactor = Arc::new(Redactor::from_secret_like_env());
    let make = move || RedactingStderr {
        redactor: redactor.clone(),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(make)
        .with_ansi(std::io::stderr().is_terminal() && !crate::progress::no_color())
        .with_target(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
