//! Progress of a fire as events, so a person at a terminal can see what it is doing
//! (issue 13, item 5) while the library still prints nothing: the prefetch, the loop
//! and the providers report [`Event`]s to a [`ProgressSink`] the binary supplies, and
//! the binary decides how (or whether) to show them. A leaf module: it imports
//! nothing else from this crate, so anything may report through it.

use std::time::Duration;

/// One thing that happened during a fire, in the order it happened.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A prefetch script started (before any model call).
    PrefetchStarted { name: String },
    /// A prefetch script ended; `ok` is false when it failed (the fire then refuses).
    PrefetchFinished { name: String, elapsed: Duration, ok: bool },
    /// The loop began step `step` of at most `max_steps`.
    StepStarted { step: u32, max_steps: u32 },
    /// A model call went out (`provider` is the settings' kind: `openai`, ...).
    ModelCallStarted { step: u32, provider: String, model: String },
    /// The model call ended, after any retries and fallback.
    ModelCallFinished {
        step: u32,
        elapsed: Duration,
        /// Tool calls in the answer (0: a final answer or a failure).
        tool_calls: usize,
        ok: bool,
    },
    /// An HTTP attempt failed and will be retried after `wait`.
    Retry {
        /// The retry about to happen, from 1.
        attempt: u32,
        max_retries: u32,
        wait: Duration,
        /// Why: `HTTP 503`, `timeout`, ...
        reason: String,
    },
    /// The primary provider gave up; the fallback (its kind in `to`) is asked instead.
    Fallback { to: String, reason: String },
    /// The policy gate decided a tool call: `allow`, `deny`, `ask` or `none` (refused
    /// before the policy: unknown tool, invalid arguments).
    ToolDecided { name: String, decision: String },
    /// An allowed tool call returned; `outcome` is `ok` or its error class.
    ToolFinished {
        name: String,
        outcome: String,
        elapsed: Duration,
    },
    /// An acceptance check started, after the final answer.
    AcceptanceStarted { name: String },
}

/// Where events go. Implementations must be cheap: they are called inline, between
/// the steps of the fire.
pub trait ProgressSink: Send + Sync {
    fn event(&self, event: &Event);
}

/// A sink that drops every event: the default, for callers that show no progress.
#[derive(Debug, Clone, Copy, Default)]
pub struct Silent;

impl ProgressSink for Silent {
    fn event(&self, _: &Event) {}
}

/// The silent sink, for struct fields that want a `&dyn ProgressSink`.
pub static SILENT: Silent = Silent;
