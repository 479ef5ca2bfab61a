//! Logging through tracing to stderr: quiet by default (warnings and errors only),
//! `-v` for info, `-vv` for debug, `--log-format json` for machines. Every line passes
//! through the secret redactor before it is written, clears a live progress line
//! first, and carries colour only at a terminal without `NO_COLOR` (cron mail and
//! pipes get no escape code).

use std::io::IsTerminal;

#[derive(Debug, Clone, Copy, clap::ValueEnum, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

pub fn init(verbose: u8, format: LogFormat) {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let from_env = tracing_subscriber::EnvFilter::try_from_env("RUNTIME_LOG").ok();
    let spans = span_events(verbose >= 2 || from_env.is_some());
    let filter = from_env.unwrap_or_else(|| tracing_subscriber::EnvFilter::new(level));
    cli::log::redact_secret_like_env();
    let make = || cli::log::RedactingStderr {
        before: crate::progress::clear_line,
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(make)
        .with_ansi(std::io::stderr().is_terminal() && !crate::progress::no_color())
        .with_target(false)
        .with_span_events(spans);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// At `-vv` (or with a `RUNTIME_LOG` filter), each phase of a fire (a debug span)
/// prints its time when it closes: the fire's profile, phase by phase
/// (docs/benchmarks.md). Not at `-v`, where the info-level spans of libraries (an MCP
/// server's session) would print their own.
fn span_events(profiling: bool) -> tracing_subscriber::fmt::format::FmtSpan {
    if profiling {
        tracing_subscriber::fmt::format::FmtSpan::CLOSE
    } else {
        tracing_subscriber::fmt::format::FmtSpan::NONE
    }
}
