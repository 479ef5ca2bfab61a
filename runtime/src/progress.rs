//! Shows a fire's progress events (`shared::progress`) on stderr: at a terminal, one
//! live status line redrawn in place (step, model call with its elapsed time, each
//! tool call with its decision, retries and their waits, fallback switches) and
//! cleared before the final output; with `-v`, one plain line per event instead;
//! nothing when stderr is not a terminal, so cron mail and pipes never get an escape
//! code. `--progress always` draws the live line anywhere; `NO_COLOR` turns colour off
//! but keeps the redraw.
//!
//! Hand-rolled rather than `indicatif`: indicatif throttles drawing (a tool decision
//! that lasts a few milliseconds would never reach the screen), decides colour and
//! terminal-ness itself, and would have to be kept off the log lines; this is one
//! line, four escape sequences and a 100 ms tick on the fire's own async runtime (no
//! thread: the runtime's Landlock sandbox covers only threads created after it).

use shared::progress::{Event, ProgressSink};
use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Turns colour off when set and not empty (<https://no-color.org>).
pub const NO_COLOR_ENV: &str = "NO_COLOR";
/// `TERM=dumb` terminals cannot erase a line: no live line there under `auto`.
pub const TERM_ENV: &str = "TERM";

/// How often the live line is redrawn while something runs (its elapsed time moves).
pub const TICK: Duration = Duration::from_millis(100);

/// Carriage return and erase-line: the start of every redraw, and the final clear.
const ERASE_LINE: &str = "\r\x1b[2K";

/// When to show the live status line (`--progress`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum When {
    /// Never show progress (not even with -v)
    Never,
    /// Only when stderr is a terminal
    #[default]
    Auto,
    /// Always draw the live line, even when stderr is not a terminal
    Always,
}

/// How progress is shown, decided once per fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Off,
    /// One plain line per event (`-v`): no escape code ever.
    Lines,
    /// The status line, redrawn in place with `\r` and erase-line.
    Live {
        colour: bool,
    },
}

/// What the terminal looks like to this process.
#[derive(Debug, Clone, Copy)]
pub struct Terminal {
    pub stderr_is_tty: bool,
    /// `TERM=dumb`.
    pub dumb: bool,
    /// `NO_COLOR` set and not empty.
    pub no_color: bool,
}

impl Terminal {
    pub fn detect() -> Terminal {
        Terminal {
            stderr_is_tty: std::io::stderr().is_terminal(),
            dumb: std::env::var_os(TERM_ENV).is_some_and(|t| t == "dumb"),
            no_color: no_color(),
        }
    }
}

/// `NO_COLOR` is set and not empty.
pub fn no_color() -> bool {
    std::env::var_os(NO_COLOR_ENV).is_some_and(|v| !v.is_empty())
}

/// The one decision: `--progress`, `-v` and the terminal.
pub fn mode(when: When, verbose: bool, term: Terminal) -> Mode {
    let colour = !term.no_color;
    match when {
        When::Never => Mode::Off,
        When::Auto | When::Always if verbose => Mode::Lines,
        When::Always => Mode::Live { colour },
        When::Auto if term.stderr_is_tty && !term.dumb => Mode::Live { colour },
        When::Auto => Mode::Off,
    }
}

/// Whether a live status line is on screen now. The log writer clears it before a
/// log line (and the next tick redraws it), so the two never share a line.
static LINE_SHOWN: Mutex<bool> = Mutex::new(false);

/// Clears the live status line, if one is shown, before something else is written to
/// stderr (a log line).
pub fn clear_line() {
    if let Ok(mut shown) = LINE_SHOWN.lock() {
        if *shown {
            let _ = write!(std::io::stderr().lock(), "{ERASE_LINE}");
            *shown = false;
        }
    }
}

/// The live line's content.
#[derive(Debug, Default)]
struct Status {
    /// `step 2/20`.
    step: Option<String>,
    /// What is going on: `model call`, `tool run_command allow`, `prefetch `x``.
    activity: String,
    /// The decision word of a tool call, coloured in the live line.
    decision: Option<String>,
    /// Since when the activity runs: its elapsed time is shown and ticks.
    since: Option<Instant>,
    /// After the activity: a retry or a fallback switch (highlighted), or how a tool
    /// call came out (dim), with its SGR style.
    note: Option<(String, &'static str)>,
    /// Finished: the line is cleared and stays so.
    done: bool,
}

/// Renders progress events in the [`Mode`] chosen for the fire.
pub struct Renderer {
    mode: Mode,
    status: Mutex<Status>,
}

impl Renderer {
    pub fn new(mode: Mode) -> Renderer {
        Renderer {
            mode,
            status: Mutex::new(Status::default()),
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Redraws the live line (its elapsed time moves); called every [`TICK`].
    pub fn tick(&self) {
        if let (Mode::Live { colour }, Ok(status)) = (self.mode, self.status.lock()) {
            if status.since.is_some() {
                draw(&status, colour);
            }
        }
    }

    /// Clears the live line for good, before the fire's final output.
    pub fn finish(&self) {
        if let Ok(mut status) = self.status.lock() {
            status.done = true;
        }
        if let Mode::Live { .. } = self.mode {
            clear_line();
        }
    }

    fn update(status: &mut Status, event: &Event) {
        match event {
            Event::PrefetchStarted { name } => {
                set(status, format!("prefetch `{name}`"), None, true);
            }
            Event::PrefetchFinished { name, elapsed, ok } => {
                let what = if *ok { "done" } else { "failed" };
                set(
                    status,
                    format!("prefetch `{name}` {what} in {}", secs(*elapsed)),
                    None,
                    false,
                );
            }
            Event::StepStarted { step, max_steps } => {
                status.step = Some(format!("step {step}/{max_steps}"));
                set(status, String::new(), None, false);
            }
            Event::ModelCallStarted { .. } => set(status, "model call".into(), None, true),
            Event::ModelCallFinished {
                elapsed,
                tool_calls,
                ok,
                ..
            } => {
                let what = match (ok, tool_calls) {
                    (false, _) => "failed".to_string(),
                    (true, 0) => "answered".to_string(),
                    (true, 1) => "1 tool call".to_string(),
                    (true, n) => format!("{n} tool calls"),
                };
                set(status, format!("model call {} · {what}", secs(*elapsed)), None, false);
            }
            Event::Retry {
                attempt,
                max_retries,
                wait,
                reason,
            } => {
                status.note = Some((
                    format!("retry {attempt}/{max_retries} in {} ({reason})", secs(*wait)),
                    "33",
                ));
            }
            Event::Fallback { to, .. } => status.note = Some((format!("fallback: {to}"), "33")),
            Event::ToolDecided { name, decision } => {
                let running = decision == "allow";
                set(status, format!("tool {name}"), Some(decision.clone()), running);
            }
            Event::ToolFinished { outcome, elapsed, .. } => {
                status.since = None;
                status.note = Some((format!("{outcome} in {}", secs(*elapsed)), "2"));
            }
            Event::AcceptanceStarted { name } => {
                set(status, format!("acceptance check `{name}`"), None, true);
            }
        }
    }
}

fn set(status: &mut Status, activity: String, decision: Option<String>, running: bool) {
    status.activity = activity;
    status.decision = decision;
    status.since = running.then(Instant::now);
    status.note = None;
}

impl ProgressSink for Renderer {
    fn event(&self, event: &Event) {
        match self.mode {
            Mode::Off => {}
            Mode::Lines => {
                clear_line();
                // Names a model chose (a tool's) with every control character
                // escaped: no escape sequence reaches the terminal (helper-91).
                eprintln!("progress: {}", shared::text::printable(&plain_line(event)));
            }
            Mode::Live { colour } => {
                if let Ok(mut status) = self.status.lock() {
                    Renderer::update(&mut status, event);
                    draw(&status, colour);
                }
            }
        }
    }
}

impl Drop for Renderer {
    fn drop(&mut self) {
        self.finish();
    }
}

/// One `-v` line for an event: plain text, no escape code.
pub fn plain_line(event: &Event) -> String {
    match event {
        Event::PrefetchStarted { name } => format!("prefetch `{name}` started"),
        Event::PrefetchFinished { name, elapsed, ok } => format!(
            "prefetch `{name}` {} in {}",
            if *ok { "done" } else { "failed" },
            secs(*elapsed)
        ),
        Event::StepStarted { step, max_steps } => format!("step {step}/{max_steps}"),
        Event::ModelCallStarted { step, provider, model } => {
            format!("step {step}: model call to {provider} ({model})")
        }
        Event::ModelCallFinished {
            step,
            elapsed,
            tool_calls,
            ok,
        } => match ok {
            true => format!("step {step}: model call {}, {tool_calls} tool call(s)", secs(*elapsed)),
            false => format!("step {step}: model call failed after {}", secs(*elapsed)),
        },
        Event::Retry {
            attempt,
            max_retries,
            wait,
            reason,
        } => format!("retry {attempt}/{max_retries} in {} ({reason})", secs(*wait)),
        Event::Fallback { to, reason } => format!("fallback: {to} (primary failed: {reason})"),
        Event::ToolDecided { name, decision } => format!("tool {name} {decision}"),
        Event::ToolFinished { name, outcome, elapsed } => {
            format!("tool {name} {outcome} in {}", secs(*elapsed))
        }
        Event::AcceptanceStarted { name } => format!("acceptance check `{name}`"),
    }
}

/// `1.2s`.
fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

/// The live line as (text, SGR style) pieces, elapsed time included.
fn pieces(status: &Status) -> Vec<(String, &'static str)> {
    let mut out: Vec<(String, &'static str)> = Vec::new();
    let sep = |out: &mut Vec<(String, &'static str)>| {
        if !out.is_empty() {
            out.push((" · ".into(), ""));
        }
    };
    if let Some(step) = &status.step {
        out.push((step.clone(), "1"));
    }
    if !status.activity.is_empty() {
        sep(&mut out);
        out.push((status.activity.clone(), ""));
    }
    if let Some(d) = &status.decision {
        let style = match d.as_str() {
            "allow" => "32",
            "deny" => "31",
            "ask" => "33",
            _ => "35",
        };
        out.push((" ".into(), ""));
        out.push((d.clone(), style));
    }
    if let Some(since) = status.since {
        out.push((format!(" {}", secs(since.elapsed())), "2"));
    }
    if let Some((note, style)) = &status.note {
        sep(&mut out);
        out.push((note.clone(), *style));
    }
    out
}

/// Draws the line: erase, then the pieces cut to the terminal's width (a wrapped line
/// could not be redrawn in place), coloured unless `NO_COLOR`.
fn draw(status: &Status, colour: bool) {
    if status.done {
        return;
    }
    let Ok(mut shown) = LINE_SHOWN.lock() else {
        return;
    };
    let mut room = terminal_width().map(|w| w.saturating_sub(1));
    let mut line = String::from(ERASE_LINE);
    for (text, style) in pieces(status) {
        let text = shared::text::printable(&text).into_owned();
        let text: String = match room {
            Some(r) => {
                let cut: String = text.chars().take(r).collect();
                room = Some(r - cut.chars().count());
                cut
            }
            None => text,
        };
        if text.is_empty() {
            continue;
        }
        if colour && !style.is_empty() {
            line.push_str(&format!("\x1b[{style}m{text}\x1b[0m"));
        } else {
            line.push_str(&text);
        }
    }
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(line.as_bytes());
    let _ = err.flush();
    *shown = true;
}

/// Columns of the terminal on stderr, when it is one.
fn terminal_width() -> Option<usize> {
    kernel::term::stderr_columns()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn term(tty: bool, dumb: bool, no_color: bool) -> Terminal {
        Terminal {
            stderr_is_tty: tty,
            dumb,
            no_color,
        }
    }

    #[test]
    fn auto_draws_only_at_a_terminal_that_can_erase() {
        assert_eq!(
            mode(When::Auto, false, term(true, false, false)),
            Mode::Live { colour: true }
        );
        assert_eq!(mode(When::Auto, false, term(false, false, false)), Mode::Off);
        assert_eq!(mode(When::Auto, false, term(true, true, false)), Mode::Off);
    }

    #[test]
    fn verbose_prints_lines_and_never_wins() {
        assert_eq!(mode(When::Auto, true, term(true, false, false)), Mode::Lines);
        assert_eq!(mode(When::Auto, true, term(false, false, false)), Mode::Lines);
        assert_eq!(mode(When::Always, true, term(false, false, false)), Mode::Lines);
        assert_eq!(mode(When::Never, true, term(true, false, false)), Mode::Off);
        assert_eq!(mode(When::Never, false, term(true, false, false)), Mode::Off);
    }

    #[test]
    fn no_color_keeps_the_redraw_without_colour() {
        assert_eq!(
            mode(When::Always, false, term(false, false, true)),
            Mode::Live { colour: false }
        );
        assert_eq!(
            mode(When::Auto, false, term(true, false, true)),
            Mode::Live { colour: false }
        );
    }

    #[test]
    fn the_status_shows_step_activity_decision_and_note() {
        let mut s = Status::default();
        Renderer::update(&mut s, &Event::StepStarted { step: 2, max_steps: 20 });
        Renderer::update(
            &mut s,
            &Event::ToolDecided {
                name: "run_command".into(),
                decision: "deny".into(),
            },
        );
        let text: String = pieces(&s).into_iter().map(|(t, _)| t).collect();
        assert_eq!(text, "step 2/20 · tool run_command deny");
        Renderer::update(
            &mut s,
            &Event::ModelCallStarted {
                step: 2,
                provider: "openai".into(),
                model: "m".into(),
            },
        );
        Renderer::update(
            &mut s,
            &Event::Retry {
                attempt: 2,
                max_retries: 3,
                wait: Duration::from_millis(500),
                reason: "HTTP 503".into(),
            },
        );
        let text: String = pieces(&s).into_iter().map(|(t, _)| t).collect();
        assert!(text.starts_with("step 2/20 · model call 0."), "{text}");
        assert!(text.ends_with("s · retry 2/3 in 0.5s (HTTP 503)"), "{text}");
    }
}
