//! The loop controller: context builder -> provider -> policy gate -> tool executor ->
//! checkpoint, until a stop reason (docs/design.md). Every tool call is parsed
//! strictly, decided by the policy engine, and only then sent to the sandboxed tool
//! worker. Failures come back to the model as classified observations; those the
//! builder must hear about become card drafts.

pub mod context;
pub mod gate;
mod mcp_call;
pub mod mcp_client;
mod mcp_http;
pub mod mcp_pin;
pub mod pins;
pub mod worker_client;

use crate::journal::{CallStage, Journal, LedgerEntry, Totals};
use crate::policy::Policy;
use crate::progress::{Event, ProgressSink};
use crate::provider::{
    cost_usd, Message, ModelRequest, ModelResponse, ProviderChain, ProviderErrorKind, ToolCall, ToolDef,
};
use crate::records::{CardKind, RecordedDecision, StopReason, ToolCallRecord, ToolOutcome};
use crate::secrets::Redactor;
use crate::settings::{Budgets, Limits, Price};
use crate::tools::{ErrorClass, Tool, ToolArgs, ToolRequest, ToolResult};
use crate::trace::{SpanKind, SpanStatus, TracedCall};
use gate::{Gate, GateInput, Refusal};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use worker_client::WorkerClient;

/// The loop's checkpoint types live in the stores' layer ([`crate::loop_state`]), so
/// the state store can keep a checkpoint without importing the loop.
pub use crate::loop_state::{call_hash, CallDecision, CardDraft, LoopState, PendingApproval};

/// Looks up a builder's decision on a paused call, by `(call_id, args_hash)`: an
/// approval counts only for the exact call it names.
pub type DecisionLookup = Box<dyn Fn(&str, &str) -> Option<CallDecision>>;

/// Fixed inputs of the loop.
pub struct LoopConfig {
    pub task: String,
    pub run_id: String,
    pub model: String,
    pub tools: Vec<Tool>,
    pub budgets: Budgets,
    pub limits: Limits,
    pub max_context: u64,
    pub max_output_tokens: u32,
    pub prices: BTreeMap<String, Price>,
    pub redactor: Redactor,
    /// Record each model call's input messages in its span (settings
    /// `telemetry.include_content`); its output and tool results are always recorded
    /// locally, and exported only with that setting.
    pub trace_input: bool,
    /// Returns true for paths committed in HEAD (records are never rewritten).
    pub committed: Box<dyn Fn(&str) -> bool>,
    /// The repository root, where a write left `started` is reconciled on resume.
    pub root: std::path::PathBuf,
    /// The write ACL's literal directories (repo-relative): where a nested `.git` a
    /// tool made is looked for after each call that could write.
    pub write_roots: Vec<String>,
    pub decision: DecisionLookup,
}

/// What handling one call did to the loop.
enum CallOutcome {
    Done,
    /// The loop stops: the call waits for approval, or its step is not durable.
    Stop(StopReason),
}

/// One run of the loop: the fixed inputs and the live handles it drives.
pub struct Agent<'a> {
    pub cfg: &'a LoopConfig,
    pub provider: &'a ProviderChain,
    pub policy: &'a Policy,
    pub worker: &'a mut WorkerClient,
    /// Turns true on SIGINT/SIGTERM.
    pub cancel: &'a mut tokio::sync::watch::Receiver<bool>,
    /// When the fire started: the wall-time budget counts from here.
    pub started: Instant,
    /// Where steps, model calls and tool decisions are reported as they happen.
    pub progress: &'a dyn ProgressSink,
    /// The run's journal: a checkpoint after every step and the tool ledger. `None`
    /// where nothing is recorded.
    pub journal: Option<&'a mut Journal>,
    /// The fire's MCP servers and the tools they offer (empty without any).
    pub mcp: &'a mcp_client::McpHub,
    /// Where the next sweep for nested repositories looks from (a worker without a
    /// write-back, [`Agent::sweep_nested_git`]).
    pub sweep: SweepWindow,
}

/// The window of change times a sweep for nested repositories looks through: from
/// the loop's start for the first sweep, then from where the previous sweep began,
/// so what a process a call left behind made between calls (no PID namespace ends it
/// there) is still found; once one ran, one more runs as the loop ends.
#[derive(Debug, Clone, Copy)]
pub struct SweepWindow {
    from: std::time::SystemTime,
    ran: bool,
}

impl SweepWindow {
    /// A window that opens now ([`sweep_window_start`]), no sweep run yet.
    pub fn opening_now() -> SweepWindow {
        SweepWindow {
            from: sweep_window_start(),
            ran: false,
        }
    }
}

/// The tool definitions the model is offered, from the task's tool names.
pub fn tool_defs(tools: &[Tool]) -> Vec<ToolDef> {
    tools
        .iter()
        .map(|t| t.spec())
        .map(|s| ToolDef {
            name: s.name.into(),
            description: s.description.into(),
            schema: (s.schema)(),
        })
        .collect()
}

/// The model request for the conversation so far, fitted to the model's context
/// budget: what each step sends (and what a dry run shows for the first one).
pub fn model_request(
    cfg: &LoopConfig,
    messages: &[Message],
    tool_defs: &[ToolDef],
) -> (ModelRequest, crate::trace::BudgetReport) {
    let budget = cfg.max_context.saturating_sub(cfg.max_output_tokens as u64);
    let (messages, report) = context::fit(messages, budget);
    let req = ModelRequest {
        model: cfg.model.clone(),
        messages,
        tools: tool_defs.to_vec(),
        max_output_tokens: cfg.max_output_tokens,
    };
    (req, report)
}

/// How one call is recorded: in the receipt's list, the trace, and the conversation.
struct CallRecord<'c> {
    call: &'c ToolCall,
    step: u32,
    span: u64,
    args_json: serde_json::Value,
    decision: RecordedDecision,
    rule: Option<String>,
    reason: String,
}

/// Where one call is handled: the call, the step that asked for it, and its span.
#[derive(Clone, Copy)]
struct CallSite<'c> {
    call: &'c ToolCall,
    step: u32,
    span: u64,
}

impl<'c> CallSite<'c> {
    /// How the call is recorded, with the gate's decision and its rule and reason.
    fn record(
        self,
        args_json: serde_json::Value,
        decision: RecordedDecision,
        rule: Option<String>,
        reason: String,
    ) -> CallRecord<'c> {
        CallRecord {
            call: self.call,
            step: self.step,
            span: self.span,
            args_json,
            decision,
            rule,
            reason,
        }
    }
}

/// A call the gate paused for approval: what [`Gate::Pause`] holds.
struct Pause {
    args: ToolArgs,
    args_json: serde_json::Value,
    verdict: crate::policy::Verdict,
    args_hash: String,
}

impl Agent<'_> {
    fn wall(&self) -> Duration {
        Duration::from_secs(self.cfg.budgets.max_wall_s)
    }

    /// Runs the loop until a stop reason.
    pub async fn run(&mut self, state: &mut LoopState) -> StopReason {
        let stop = self.run_loop(state).await;
        // Without a write-back, what a call's leftover process made after the last
        // sweep: once more, as the loop ends.
        if self.sweep.ran {
            let lines = self.sweep_nested_git().await;
            note_nested_repositories(state, lines, 0);
        }
        stop
    }

    async fn run_loop(&mut self, state: &mut LoopState) -> StopReason {
        let mut tool_defs = tool_defs(&self.cfg.tools);
        tool_defs.extend(self.mcp.tool_defs());
        if let Some(stop) = self.settle_pending(state).await {
            return stop;
        }
        if state.final_answer.is_some() {
            // Resumed after the final answer's checkpoint: only the records are left.
            return StopReason::FinalAnswer;
        }
        if let Some(stop) = self.settle_interrupted(state).await {
            return stop;
        }
        loop {
            if let Some(stop) = self.check_limits(state) {
                return stop;
            }
            let resp = self.model_step(state, &tool_defs).await;
            let intended: Vec<LedgerEntry> = resp
                .as_ref()
                .map(|calls| {
                    calls
                        .iter()
                        .map(|c| ledger_entry(c, CallStage::Intended, None))
                        .collect()
                })
                .unwrap_or_default();
            crate::failpoint!("after-model-response");
            if let Some(stop) = self.checkpoint(state, &intended) {
                return stop;
            }
            let resp = match resp {
                Ok(r) => r,
                Err(stop) => return stop,
            };
            // The tool worker entered its sandbox while the model answered: no call
            // runs until it reported, and none if it could not (the fire says why).
            if !resp.is_empty() && self.worker.ready().await.is_err() {
                return StopReason::NotStarted;
            }
            let step = state.step;
            for call in &resp {
                if *self.cancel.borrow() || crate::cancel::requested() {
                    return StopReason::Cancelled;
                }
                if let CallOutcome::Stop(stop) = self.handle_call(state, call, step, false).await {
                    return stop;
                }
                if let Some(stop) = repetition(self.cfg, state) {
                    return stop;
                }
            }
            if state.denials > self.cfg.limits.max_denials {
                return StopReason::PermissionDenied;
            }
        }
    }

    /// A resumed run first settles the call it paused on.
    async fn settle_pending(&mut self, state: &mut LoopState) -> Option<StopReason> {
        let p = state.pending.clone()?;
        (self.cfg.decision)(&p.call.id, &p.args_hash)?;
        state.pending = None;
        if let Some(idx) = state
            .messages
            .iter()
            .position(|m| matches!(m, Message::Tool { call_id, .. } if *call_id == p.call.id))
        {
            state.messages.remove(idx);
        }
        crate::failpoint!("before-approved-call");
        let outcome = self.handle_call(state, &p.call, p.step, true).await;
        crate::failpoint!("after-approved-call");
        match outcome {
            CallOutcome::Done => None,
            CallOutcome::Stop(stop) => Some(stop),
        }
    }

    /// A resumed run first handles the calls of its last model response that have no
    /// result yet (the run was interrupted or paused among them), through the ledger:
    /// none runs twice.
    async fn settle_interrupted(&mut self, state: &mut LoopState) -> Option<StopReason> {
        let idx = state
            .messages
            .iter()
            .rposition(|m| matches!(m, Message::Assistant { .. }))?;
        let Message::Assistant { tool_calls, .. } = &state.messages[idx] else {
            return None;
        };
        let answered: Vec<&str> = state.messages[idx + 1..]
            .iter()
            .filter_map(|m| match m {
                Message::Tool { call_id, .. } => Some(call_id.as_str()),
                _ => None,
            })
            .collect();
        let open: Vec<ToolCall> = tool_calls
            .iter()
            .filter(|c| !answered.contains(&c.id.as_str()))
            .cloned()
            .collect();
        let step = state.step;
        for call in &open {
            if *self.cancel.borrow() || crate::cancel::requested() {
                return Some(StopReason::Cancelled);
            }
            if let CallOutcome::Stop(stop) = self.handle_call(state, call, step, true).await {
                return Some(stop);
            }
            if let Some(stop) = repetition(self.cfg, state) {
                return Some(stop);
            }
        }
        None
    }

    /// The stops checked before each step: cancellation, steps, wall time.
    fn check_limits(&self, state: &mut LoopState) -> Option<StopReason> {
        if *self.cancel.borrow() || crate::cancel::requested() {
            return Some(StopReason::Cancelled);
        }
        let budgets = &self.cfg.budgets;
        if state.step >= budgets.max_steps {
            state.cards.push(CardDraft {
                kind: CardKind::MaxSteps,
                summary: format!("stopped after {} steps without a final answer", state.step),
                detail: format!("max_steps {} reached", budgets.max_steps),
                evidence: last_calls(state),
            });
            return Some(StopReason::MaxSteps);
        }
        if self.started.elapsed() >= self.wall() {
            state.cards.push(CardDraft {
                kind: CardKind::BudgetExceeded,
                summary: "wall-time budget exhausted".into(),
                detail: format!("max_wall_s {} reached", budgets.max_wall_s),
                evidence: last_calls(state),
            });
            return Some(StopReason::MaxWallTime);
        }
        None
    }

    /// One model call: fit the context, ask the provider (racing cancellation and the
    /// wall clock), account tokens and cost. Returns the calls to handle, or the stop.
    async fn model_step(&mut self, state: &mut LoopState, tool_defs: &[ToolDef]) -> Result<Vec<ToolCall>, StopReason> {
        let cfg = self.cfg;
        let (req, span) = self.open_model_span(state, tool_defs);
        let step = state.step;
        let remaining = self.wall().saturating_sub(self.started.elapsed());
        self.progress.event(&Event::ModelCallStarted {
            step,
            provider: self.provider.primary.kind().to_string(),
            model: cfg.model.clone(),
        });
        let called = Instant::now();
        let progress = self.progress;
        let finished = |tool_calls: usize, ok: bool| {
            progress.event(&Event::ModelCallFinished {
                step,
                elapsed: called.elapsed(),
                tool_calls,
                ok,
            })
        };
        let answer = tokio::select! {
            r = self.provider.complete(&req, self.progress) => Some(r),
            _ = self.cancel.changed() => None,
            _ = tokio::time::sleep(remaining) => {
                finished(0, false);
                state.trace.end(span, SpanStatus::WallTime);
                state.cards.push(CardDraft {
                    kind: CardKind::BudgetExceeded,
                    summary: "wall-time budget exhausted during a model call".into(),
                    detail: format!("max_wall_s {} reached", cfg.budgets.max_wall_s),
                    evidence: vec![],
                });
                return Err(StopReason::MaxWallTime);
            }
        };
        finished(
            answer
                .as_ref()
                .and_then(|a| a.as_ref().ok())
                .map_or(0, |r| r.tool_calls.len()),
            matches!(answer, Some(Ok(_))),
        );
        let Some(answer) = answer else {
            state.trace.end(span, SpanStatus::Cancelled);
            return Err(StopReason::Cancelled);
        };
        match answer {
            Ok(resp) => self.take_response(state, span, resp),
            Err(e) => Err(provider_failed(cfg, state, span, step, &e)),
        }
    }

    /// Starts the next step: counts it, reports it, fits the request to the context
    /// budget and opens the model call's span. Returns the request and the span.
    fn open_model_span(&self, state: &mut LoopState, tool_defs: &[ToolDef]) -> (ModelRequest, u64) {
        let cfg = self.cfg;
        state.step += 1;
        let step = state.step;
        self.progress.event(&Event::StepStarted {
            step,
            max_steps: cfg.budgets.max_steps,
        });
        let (req, report) = model_request(cfg, &state.messages, tool_defs);
        state.trace.steps.push((step, report));
        let span = state.trace.start(SpanKind::Model, format!("chat {}", cfg.model));
        state.trace.attr(span, "gen_ai.request.model", cfg.model.clone());
        state.trace.attr(span, "agent.step", step);
        if cfg.trace_input {
            let input = cfg
                .redactor
                .redact(&semconv_messages(&req.messages).to_string())
                .into_owned();
            state.trace.attr(span, "gen_ai.input.messages", input);
        }
        (req, span)
    }

    /// Takes a model response into the run: its usage and serving provider on the
    /// span, the assistant message in the conversation, then the stop it causes (a
    /// final answer, a token or cost budget) or the tool calls to handle.
    fn take_response(
        &self,
        state: &mut LoopState,
        span: u64,
        mut resp: ModelResponse,
    ) -> Result<Vec<ToolCall>, StopReason> {
        let cfg = self.cfg;
        let step = state.step;
        redact_call_names(&cfg.redactor, &mut resp.tool_calls);
        unique_call_ids(&state.messages, &mut resp.tool_calls);
        account(cfg, state, span, &resp);
        let served = match &self.provider.fallback {
            Some(fallback) if resp.served_by.starts_with("fallback") => fallback,
            Some(_) | None => &self.provider.primary,
        };
        state.trace.attr(span, "gen_ai.provider.name", served.kind());
        state.messages.push(Message::Assistant {
            content: resp.content.clone(),
            tool_calls: resp.tool_calls.clone(),
        });
        if resp.content.is_some() {
            state.last_content = resp.content.clone();
        }
        if resp.tool_calls.is_empty() {
            state.final_answer = Some(resp.content.unwrap_or_default());
            return Err(StopReason::FinalAnswer);
        }
        match over_budget(cfg, state, step) {
            Some(stop) => Err(stop),
            None => Ok(resp.tool_calls),
        }
    }

    /// The checkpoint after a step or a call: the loop state and the changed ledger
    /// entries, in one transaction. One that cannot be written (a full disk, a
    /// read-only `.runtime`) stops the run before its next step: a later crash would
    /// otherwise repeat or lose what the step did. `Some` is that stop, with a
    /// `checkpoint_failed` card naming the state database.
    fn checkpoint(&mut self, state: &mut LoopState, ledger: &[LedgerEntry]) -> Option<StopReason> {
        let journal = self.journal.as_deref_mut()?;
        let e = save_checkpoint(journal, state, ledger).err()?;
        let what = format!("the checkpoint after step {}", state.step);
        Some(checkpoint_failed(state, journal, &what, e))
    }

    /// Marks `call` started in the ledger before the worker gets it; `Some` stops the
    /// run instead when that cannot be written: the call is not run.
    fn ledger_started(&mut self, state: &mut LoopState, call: &ToolCall) -> Option<StopReason> {
        let journal = self.journal.as_deref_mut()?;
        let e = journal
            .started(&ledger_entry(call, CallStage::Started, None))
            .err()?
            .to_string();
        let what = format!("the ledger entry of call {} (not run)", call.id);
        Some(checkpoint_failed(state, journal, &what, e))
    }

    /// On resume, what the ledger already knows of `call`: a completed call's recorded
    /// result (never run again); for a call left `started` (it may have taken effect),
    /// a write whose file already holds its content counts as done, a command or edit
    /// is `SIDE_EFFECT_UNCERTAIN` and not run again; `None` runs the call.
    fn recorded(&self, call: &ToolCall, args: &ToolArgs) -> Option<ToolResult> {
        let journal = self.journal.as_deref()?;
        let entry = match journal.entry(&call.id) {
            Ok(e) => e?,
            Err(e) => {
                tracing::warn!(error = %e, call = %call.id, "the ledger could not be read");
                return Some(uncertain(call, "its ledger entry could not be read"));
            }
        };
        if entry.args_hash != call_hash(&call.name, &call.arguments) {
            return None;
        }
        match entry.stage {
            CallStage::Intended => None,
            CallStage::Completed => Some(recorded_result(call, entry.result)),
            CallStage::Started => match args {
                ToolArgs::ReadFile { .. } | ToolArgs::ListDir { .. } | ToolArgs::Grep { .. } => None,
                ToolArgs::WriteFile { path, content } => match holds(&self.cfg.root, path, content) {
                    true => Some(ToolResult {
                        call_id: call.id.clone(),
                        error: None,
                        output: format!("wrote {path} (found written after an interruption; not written again)"),
                        truncated: false,
                        duration_ms: 0,
                        kernel_denied: false,
                        written_back: None,
                    }),
                    false => None,
                },
                ToolArgs::EditFile { .. } | ToolArgs::RunCommand { .. } => Some(uncertain(
                    call,
                    "the run was interrupted after this call started; it may or may not have taken effect and is not run again",
                )),
            },
        }
    }

    /// Gate one call, execute it if the gate says so, and record what happened.
    /// `resumed`: the call was decided before an interruption or a pause, so the
    /// ledger may already hold it.
    async fn handle_call(&mut self, state: &mut LoopState, call: &ToolCall, step: u32, resumed: bool) -> CallOutcome {
        let span = state.trace.start(SpanKind::Tool, format!("execute_tool {}", call.name));
        state.trace.attr(span, "gen_ai.tool.name", call.name.clone());
        state.trace.attr(span, "gen_ai.tool.call.id", call.id.clone());
        if crate::mcp::split_name(&call.name).is_some() {
            return self.handle_mcp_call(state, call, step, span, resumed).await;
        }
        let decided = gate::gate(
            call,
            &GateInput {
                tools: &self.cfg.tools,
                policy: self.policy,
                committed: &*self.cfg.committed,
                decision: &*self.cfg.decision,
            },
        );
        let decision = match &decided {
            Gate::Refuse {
                refusal: Refusal::Denied(_),
                ..
            } => "deny",
            Gate::Refuse { .. } => "none",
            Gate::Pause { .. } => "ask",
            Gate::Run { .. } => "allow",
        };
        self.progress.event(&Event::ToolDecided {
            name: call.name.clone(),
            decision: decision.into(),
        });
        let site = CallSite { call, step, span };
        match decided {
            Gate::Refuse { args_json, refusal } => self.refused(state, site, args_json, refusal),
            Gate::Pause {
                args,
                args_json,
                verdict,
                args_hash,
            } => self.paused(
                state,
                site,
                Pause {
                    args,
                    args_json,
                    verdict,
                    args_hash,
                },
            ),
            Gate::Run {
                args,
                args_json,
                verdict,
            } => self.run_allowed(state, site, resumed, args, args_json, verdict).await,
        }
    }

    /// A call the gate refused: its observation and card, recorded and checkpointed.
    fn refused(
        &mut self,
        state: &mut LoopState,
        site: CallSite,
        args_json: serde_json::Value,
        refusal: Refusal,
    ) -> CallOutcome {
        let call = site.call;
        let (rec, result) = refuse(state, call, refusal, |d, rule, reason| {
            site.record(args_json, d, rule, reason)
        });
        finish_call(self.cfg, state, rec, &result);
        match self.checkpoint(state, &[completed_entry(self.cfg, call, &result)]) {
            Some(stop) => CallOutcome::Stop(stop),
            None => CallOutcome::Done,
        }
    }

    /// A call that needs a builder's approval: the run pauses on it, with an
    /// `approval_needed` card binding the approval to its exact arguments.
    fn paused(&mut self, state: &mut LoopState, site: CallSite, pause: Pause) -> CallOutcome {
        let Pause {
            args,
            args_json,
            verdict,
            args_hash,
        } = pause;
        let CallSite { call, step, .. } = site;
        state.pending = Some(PendingApproval {
            call: call.clone(),
            args_hash: args_hash.clone(),
            step,
            pins: pins::pin(self.policy.ownership().root(), &args),
        });
        state.cards.push(CardDraft {
            kind: CardKind::ApprovalNeeded,
            summary: format!("`{}` needs approval", call.name),
            detail: format!("{} (rule {})", verdict.reason, verdict.rule.clone().unwrap_or_default()),
            evidence: vec![
                format!("run {} call {} hash {}", self.cfg.run_id, call.id, args_hash),
                self.cfg.redactor.redact(&args_json.to_string()).into_owned(),
            ],
        });
        let result = ToolResult::error(
            &call.id,
            ErrorClass::PermissionDenied,
            "waiting for a builder's approval",
        );
        finish_call(
            self.cfg,
            state,
            site.record(args_json, RecordedDecision::Ask, verdict.rule, verdict.reason),
            &result,
        );
        let stop = self.checkpoint(state, &[]);
        CallOutcome::Stop(stop.unwrap_or(StopReason::WaitingApproval))
    }

    /// Tells the progress sink that the call `name` finished, and how.
    fn report_finished(&self, name: &str, result: &ToolResult) {
        self.progress.event(&Event::ToolFinished {
            name: name.to_string(),
            outcome: result.error.map_or("ok", |c| c.as_str()).to_string(),
            elapsed: Duration::from_millis(result.duration_ms),
        });
    }

    /// A `side_effect_uncertain` card for a call that may or may not have taken effect
    /// (a built-in tool's or an MCP server's, interrupted or gone mid-call).
    fn card_if_uncertain(&self, state: &mut LoopState, call: &ToolCall, result: &ToolResult) {
        if result.error == Some(ErrorClass::SideEffectUncertain) {
            state.cards.push(CardDraft {
                kind: CardKind::SideEffectUncertain,
                summary: format!("`{}` may or may not have taken effect", call.name),
                detail: self.cfg.redactor.redact(&result.output).into_owned(),
                evidence: vec![format!("call {}", call.id)],
            });
        }
    }

    /// A call the gate allowed: run (or, resumed, replayed from the ledger), reported,
    /// recorded and checkpointed.
    async fn run_allowed(
        &mut self,
        state: &mut LoopState,
        site: CallSite<'_>,
        resumed: bool,
        args: ToolArgs,
        args_json: serde_json::Value,
        verdict: crate::policy::Verdict,
    ) -> CallOutcome {
        let call = site.call;
        let result = match self.run_or_replay(state, call, args, resumed).await {
            Ok(r) => r,
            Err(stop) => return CallOutcome::Stop(stop),
        };
        self.report_finished(&call.name, &result);
        self.card_if_uncertain(state, call, &result);
        if result.kernel_denied {
            state.denials += 1;
        }
        finish_call(
            self.cfg,
            state,
            site.record(args_json, RecordedDecision::Allow, verdict.rule, verdict.reason),
            &result,
        );
        match self.checkpoint(state, &[completed_entry(self.cfg, call, &result)]) {
            Some(stop) => CallOutcome::Stop(stop),
            None => CallOutcome::Done,
        }
    }

    /// The result of an allowed call: on resume, what the ledger already knows of it;
    /// otherwise it is marked started in the ledger, run, and any nested `.git` a
    /// writing call made is swept. `Err` is the stop when the ledger entry cannot be
    /// written (the call is not run).
    async fn run_or_replay(
        &mut self,
        state: &mut LoopState,
        call: &ToolCall,
        args: ToolArgs,
        resumed: bool,
    ) -> Result<ToolResult, StopReason> {
        let replayed = if resumed { self.recorded(call, &args) } else { None };
        let writes = !matches!(
            args,
            ToolArgs::ReadFile { .. } | ToolArgs::ListDir { .. } | ToolArgs::Grep { .. }
        );
        if let Some(r) = replayed {
            return Ok(r);
        }
        if let Some(stop) = self.ledger_started(state, call) {
            return Err(stop);
        }
        crate::failpoint!("after-ledger-started");
        let r = self.execute(call, args).await;
        crate::failpoint!("after-tool-side-effect");
        if writes {
            let (lines, uncounted) = match &r.written_back {
                // The worker's write-back never copied them, and removed them from
                // the tools' view, however many entries the call wrote.
                Some(wb) => {
                    let lines = wb
                        .nested_repositories
                        .iter()
                        .map(|n| {
                            let path = std::path::Path::new(&n.path);
                            let rel = path.strip_prefix(&self.cfg.root).unwrap_or(path).to_string_lossy();
                            nested_repository_line(&rel, n.left.as_deref())
                        })
                        .collect();
                    (lines, wb.more_repositories)
                }
                None => (self.sweep_nested_git().await, 0),
            };
            note_nested_repositories(state, lines, uncounted);
            if let Some(wb) = &r.written_back {
                state.note_made(&self.cfg.root, &wb.made);
            }
        }
        Ok(r)
    }

    /// After a call that could write, in a worker without a write-back (its writes
    /// went straight into the repository): every `.git` (a directory, or a `gitdir:`
    /// file, in any spelling git knows) and bare repository's `HEAD` made under the
    /// write ACL since the last sweep began (the loop's start for the first) is
    /// removed, by the worker (which may write there; the runtime may not, outside
    /// `reports/`). The lines for the card, one per repository.
    async fn sweep_nested_git(&mut self) -> Vec<String> {
        let next = SweepWindow {
            from: sweep_window_start(),
            ran: true,
        };
        let found = nested_git(&self.cfg.root, &self.cfg.write_roots, self.sweep.from);
        self.sweep = next;
        if found.is_empty() {
            return Vec::new();
        }
        let command = format!(
            "rm -rf -- {}",
            found
                .iter()
                .map(|p| crate::shell::quote(p))
                .collect::<Vec<_>>()
                .join(" ")
        );
        let req = ToolRequest {
            masked: Vec::new(),
            call_id: "sweep-nested-git".into(),
            args: ToolArgs::RunCommand {
                command,
                timeout_s: None,
            },
            timeout_ms: 10_000,
            output_limit: 4096,
            apart: false,
        };
        let done = self.worker.call(&req).await;
        found
            .iter()
            .map(|p| match std::fs::symlink_metadata(self.cfg.root.join(p)) {
                Err(_) => nested_repository_line(p, None),
                Ok(_) => {
                    tracing::warn!(path = %p, output = %done.output, "a nested git repository could not be removed");
                    nested_repository_line(p, Some(done.output.trim()))
                }
            })
            .collect()
    }

    /// Sends an allowed call to the sandboxed worker, within the tool timeout and what
    /// is left of the wall-time budget; a cancellation interrupts the running command.
    async fn execute(&mut self, call: &ToolCall, args: ToolArgs) -> ToolResult {
        let remaining = self.wall().saturating_sub(self.started.elapsed());
        let mut timeout = Duration::from_secs(self.cfg.limits.tool_timeout_s);
        if let ToolArgs::RunCommand { timeout_s: Some(t), .. } = &args {
            timeout = timeout.min(Duration::from_secs(*t));
        }
        let timeout = timeout.min(remaining).max(Duration::from_millis(100));
        let masked = match &args {
            ToolArgs::Grep { .. } => self.policy.read_masks(),
            ToolArgs::ReadFile { .. }
            | ToolArgs::ListDir { .. }
            | ToolArgs::WriteFile { .. }
            | ToolArgs::EditFile { .. }
            | ToolArgs::RunCommand { .. } => Vec::new(),
        };
        // The idempotency key a tool sees as `RUNTIME_CALL_ID`: the run whose ledger
        // holds the call, and the call's id (model call ids repeat across runs).
        let ledger_run = self
            .journal
            .as_deref()
            .map_or(self.cfg.run_id.as_str(), Journal::ledger_run);
        let req = ToolRequest {
            apart: false,
            masked,
            call_id: format!("{ledger_run}:{}", call.id),
            args,
            timeout_ms: timeout.as_millis() as u64,
            output_limit: self.cfg.limits.tool_output_bytes,
        };
        let interrupter = self.worker.interrupt_handle();
        let running = self.worker.call(&req);
        tokio::pin!(running);
        tokio::select! {
            r = &mut running => r,
            _ = self.cancel.changed() => interrupter.until_done(running).await,
        }
    }
}

/// The card's line for a nested repository at `rel`: removed, or `left` for why not.
fn nested_repository_line(rel: &str, left: Option<&str>) -> String {
    match left {
        None => format!(
            "{}: a nested git repository the model made: removed",
            rel.escape_debug()
        ),
        // One line each, whoever wrote `why`.
        Some(why) => format!(
            "{}: a nested git repository the model made: not removed ({})",
            rel.escape_debug(),
            why.replace(|c: char| c.is_control(), " ")
        ),
    }
}

/// Names the nested repositories of `lines`, and counts `uncounted` more the worker
/// did not name, in the run's one `output_rejected` card for them: its summary counts
/// them all, its detail and evidence keep the first [`crate::records::CARD_EVIDENCE_MAX`]
/// (the state is saved after every step). A nested repository left in the work tree
/// would run its config and hooks (`core.fsmonitor`, `core.pager`) for the engineer
/// who runs `git` inside it.
fn note_nested_repositories(state: &mut LoopState, lines: Vec<String>, uncounted: usize) {
    if lines.is_empty() && uncounted == 0 {
        return;
    }
    let found = state
        .cards
        .iter()
        .position(|c| c.kind == CardKind::OutputRejected && c.summary.contains("nested git"));
    let at = found.unwrap_or_else(|| {
        state.cards.push(CardDraft {
            kind: CardKind::OutputRejected,
            summary: String::new(),
            detail: String::new(),
            evidence: Vec::new(),
        });
        state.cards.len() - 1
    });
    let card = &mut state.cards[at];
    // The count so far is the summary's first word (this function wrote it).
    let before: usize = card.summary.split(' ').next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let total = before + lines.len() + uncounted;
    let room = crate::records::CARD_EVIDENCE_MAX.saturating_sub(card.evidence.len());
    for line in lines.into_iter().take(room) {
        if !card.detail.is_empty() {
            card.detail.push('\n');
        }
        card.detail.push_str(&line);
        card.evidence.push(line);
    }
    card.summary = format!(
        "{total} nested git repository(ies) the model made under the write ACL were kept out of the repository"
    );
}

/// How far behind the precise clock a file's times may be (the kernel stamps them
/// from its coarse clock, one tick at most: 10 ms at `HZ=100`), with a margin.
const FILE_CLOCK_LAG: std::time::Duration = std::time::Duration::from_millis(50);

/// Where a window of file change times that begins now starts: set back past the
/// kernel's coarse file clock ([`FILE_CLOCK_LAG`]), so a `.git` made in the next
/// milliseconds, stamped a tick behind, is inside it.
fn sweep_window_start() -> std::time::SystemTime {
    std::time::SystemTime::now() - FILE_CLOCK_LAG
}

/// The most directory entries one sweep for nested repositories looks at.
const SWEEP_ENTRIES: usize = 20_000;

/// Every `.git` ([`crate::gitpath::is_dot_git`]), and every `HEAD` that makes its
/// directory a bare repository ([`crate::gitpath::forms_repository`]: removing it
/// unmakes the repository, as the write-back does), changed at or after `since` under
/// the write roots of `root` (repo-relative paths, links never followed, at most
/// [`SWEEP_ENTRIES`] entries looked at).
fn nested_git(root: &std::path::Path, roots: &[String], since: std::time::SystemTime) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let since = since
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| (d.as_secs() as i64, i64::from(d.subsec_nanos())))
        .unwrap_or((0, 0));
    let mut found = Vec::new();
    let mut seen = 0usize;
    let mut stack: Vec<String> = roots.to_vec();
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&dir)) else {
            continue;
        };
        for entry in entries.flatten() {
            seen += 1;
            if seen > SWEEP_ENTRIES {
                return found;
            }
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            let path = format!("{dir}/{name}");
            let changed =
                |p: &std::path::Path| std::fs::symlink_metadata(p).is_ok_and(|m| (m.ctime(), m.ctime_nsec()) >= since);
            if crate::gitpath::is_dot_git(&name) {
                if changed(&root.join(&path)) {
                    found.push(path);
                }
                continue;
            }
            // A bare repository, whichever of its entries a call added last (one
            // assembled over calls is judged by the call that completed it). A
            // directory named `HEAD` is no repository's: it is walked like any other.
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            if name == "HEAD" && !is_dir {
                let here = root.join(&dir);
                let entry_of = |n: &std::ffi::CStr| n.to_str().map(|n| here.join(n));
                let present = |n: &std::ffi::CStr| entry_of(n).is_ok_and(|p| std::fs::symlink_metadata(p).is_ok());
                let completed_now = crate::gitpath::REPOSITORY_ENTRIES
                    .iter()
                    .any(|n| entry_of(n).is_ok_and(|p| changed(&p)));
                if crate::gitpath::forms_repository(present) && completed_now {
                    found.push(path);
                }
            } else if is_dir {
                stack.push(path);
            }
        }
    }
    found
}

/// Saves the checkpoint after a step: `state` serialized, the run row's totals and
/// the changed `ledger` entries, in one transaction of `journal`.
pub fn save_checkpoint(journal: &mut Journal, state: &LoopState, ledger: &[LedgerEntry]) -> Result<(), String> {
    let blob = serde_json::to_string(state).map_err(|e| e.to_string())?;
    journal
        .checkpoint(&blob, totals(state), ledger)
        .map_err(|e| e.to_string())
}

/// The stop of a run whose `what` (a checkpoint, a ledger entry) could not be written
/// to the journal's state database: a `checkpoint_failed` card naming the file.
fn checkpoint_failed(state: &mut LoopState, journal: &Journal, what: &str, error: String) -> StopReason {
    tracing::error!(error = %error, step = state.step, "{what} was not saved: the run stops");
    state.cards.push(CardDraft {
        kind: CardKind::CheckpointFailed,
        summary: format!(
            "{what} could not be written to {}: the fire stopped before its next step",
            journal.db_path()
        ),
        detail: error,
        evidence: vec![format!("step {}", state.step)],
    });
    StopReason::CheckpointFailed
}

/// The ledger entry of `call` at `stage`.
fn ledger_entry(call: &ToolCall, stage: CallStage, result: Option<String>) -> LedgerEntry {
    LedgerEntry {
        call_id: call.id.clone(),
        name: call.name.clone(),
        args_hash: call_hash(&call.name, &call.arguments),
        stage,
        result,
    }
}

/// The ledger entry of a call whose result is in, redacted as records are (the
/// result goes back to the model on resume, and no secret is stored in the clear).
fn completed_entry(cfg: &LoopConfig, call: &ToolCall, result: &ToolResult) -> LedgerEntry {
    // The text is redacted, not the JSON it is stored as: a redaction over JSON could
    // take an escaping backslash with it (`password=a\"b`), and a resume would find
    // the entry unreadable (helper-109).
    let mut redacted = result.clone();
    redacted.output = cfg.redactor.redact(&result.output).into_owned();
    // The names of what a call made are the model's choice: redacted as paths are.
    if let Some(wb) = &mut redacted.written_back {
        for n in &mut wb.nested_repositories {
            n.path = cfg.redactor.redact_path(&n.path);
        }
        for m in &mut wb.made {
            *m = cfg.redactor.redact_path(m);
        }
    }
    let stored = serde_json::to_string(&redacted).ok();
    ledger_entry(call, CallStage::Completed, stored)
}

/// A completed call's result as the ledger stored it; one that cannot be read is
/// uncertain (the call is never run again).
fn recorded_result(call: &ToolCall, stored: Option<String>) -> ToolResult {
    stored
        .and_then(|r| serde_json::from_str(&r).ok())
        .unwrap_or_else(|| uncertain(call, "its recorded result could not be read"))
}

/// The result of a call that may or may not have taken effect.
fn uncertain(call: &ToolCall, why: &str) -> ToolResult {
    ToolResult::error(
        &call.id,
        ErrorClass::SideEffectUncertain,
        format!("`{}` ({}): {why}", call.name, call.id),
    )
}

/// Whether the regular file at `path` (beneath `root`) holds exactly `content`.
fn holds(root: &std::path::Path, path: &str, content: &str) -> bool {
    let p = std::path::Path::new(path);
    let rel = match p.strip_prefix(root) {
        Ok(rel) => rel,
        Err(_) if p.is_relative() => p,
        Err(_) => return false,
    };
    crate::beneath::open_root(root)
        .ok()
        .and_then(|fd| crate::beneath::read_regular(&fd, rel, content.len() as u64 + 1).ok())
        .is_some_and(|bytes| bytes == content.as_bytes())
}

/// A checkpoint's totals for the run's row.
fn totals(state: &LoopState) -> Totals {
    Totals {
        step: state.step,
        tokens_in: state.tokens.input,
        tokens_out: state.tokens.output,
        cost_usd: state.cost_usd,
        denials: state.denials,
        retries: state.retries,
    }
}

/// Records a failed model call (after retries and any fallback) and the stop it
/// causes: `context_overflow` when the server refused the request for its length.
fn provider_failed(
    cfg: &LoopConfig,
    state: &mut LoopState,
    span: u64,
    step: u32,
    e: &crate::provider::ProviderError,
) -> StopReason {
    state.retries += e.retries;
    let detail = cfg.redactor.redact(&e.to_string()).into_owned();
    state.trace.attr(span, "error.type", e.kind.as_str());
    // `runtime show` prints it under the failed span.
    state.trace.attr(span, "error.message", detail.clone());
    state.trace.end(span, SpanStatus::Error);
    if e.kind == ProviderErrorKind::ContextOverflow {
        let last = state.trace.steps.last().map(|(_, r)| (r.used, r.budget));
        state.cards.push(CardDraft {
            kind: CardKind::ContextOverflow,
            summary: "the model server refused the request for its length".into(),
            detail,
            evidence: vec![
                format!("step {step}"),
                format!(
                    "context used/budget (estimated): {last:?} of max_context {}",
                    cfg.max_context
                ),
            ],
        });
        return StopReason::ContextOverflow;
    }
    state.cards.push(CardDraft {
        kind: CardKind::ProviderError,
        summary: format!("model call failed: {}", e.headline()),
        detail,
        evidence: vec![format!("step {step}")],
    });
    StopReason::ProviderError
}

/// A call's tool name and id are the model's free text, stored as they are in the
/// trace, the ledger and the checkpoint, and printed by `runtime show`: a secret in
/// them is redacted before the call enters the run (helper-102: a key in an unknown
/// tool's name reached `state.db` and `runtime show`). The conversation keeps the
/// redacted forms, so each result still names its call.
fn redact_call_names(redactor: &Redactor, calls: &mut [ToolCall]) {
    for call in calls {
        for text in [&mut call.name, &mut call.id] {
            if let std::borrow::Cow::Owned(redacted) = redactor.redact(text) {
                // In characters every provider takes back in a tool call's name and
                // id (`[REDACTED]` is not: a 400 on every later request, helper-107).
                let plain = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
                *text = redacted.chars().map(|c| if plain(c) { c } else { '_' }).collect();
            }
        }
    }
}

/// A call's id is the model's, and the ledger, a resume and the trace know a call by
/// it: an id the run already used (in this response or an earlier one) would share
/// the other call's ledger entry, and a resume would take one call's result for both
/// and never run the other (helper-105). A repeated id is renamed `<id>_dup<n>`
/// (characters every provider takes); the conversation keeps the new id, so the
/// result still answers its call.
fn unique_call_ids(messages: &[Message], calls: &mut [ToolCall]) {
    let mut seen: std::collections::HashSet<String> = messages
        .iter()
        .filter_map(|m| match m {
            Message::Assistant { tool_calls, .. } => Some(tool_calls.iter().map(|c| c.id.clone())),
            _ => None,
        })
        .flatten()
        .collect();
    for call in calls {
        if seen.contains(&call.id) {
            // `seen` is finite, so a free `_dup<n>` is always found at some n <= len + 2.
            let mut n = 2usize;
            while seen.contains(&format!("{}_dup{n}", call.id)) {
                n += 1;
            }
            call.id = format!("{}_dup{n}", call.id);
        }
        seen.insert(call.id.clone());
    }
}

/// Adds a model response's usage to the totals and its span.
fn account(cfg: &LoopConfig, state: &mut LoopState, span: u64, resp: &ModelResponse) {
    state.retries += resp.retries;
    state.tokens.add(resp.usage);
    state.cost_usd += cost_usd(&cfg.prices, &cfg.model, resp.usage);
    if let Some(s) = state.trace.span_mut(span) {
        s.tokens_in = resp.usage.input;
        s.tokens_out = resp.usage.output;
    }
    state.trace.attr(span, "agent.retries", resp.retries);
    state.trace.attr(span, "agent.served_by", resp.served_by.clone());
    let output = semconv_messages(&[Message::Assistant {
        content: resp.content.clone(),
        tool_calls: resp.tool_calls.clone(),
    }]);
    state.trace.attr(
        span,
        "gen_ai.output.messages",
        cfg.redactor.redact(&output.to_string()).into_owned(),
    );
    state
        .trace
        .attr(span, "gen_ai.response.tool_calls", resp.tool_calls.len() as u64);
    state.trace.end(span, SpanStatus::Ok);
}

/// The token and cost budgets, checked after each model call.
fn over_budget(cfg: &LoopConfig, state: &mut LoopState, step: u32) -> Option<StopReason> {
    let budgets = &cfg.budgets;
    if state.tokens.total() > budgets.max_tokens {
        state.cards.push(CardDraft {
            kind: CardKind::BudgetExceeded,
            summary: format!(
                "token budget exceeded: {} > {}",
                state.tokens.total(),
                budgets.max_tokens
            ),
            detail: format!("max_tokens {}", budgets.max_tokens),
            evidence: vec![format!("step {step}")],
        });
        return Some(StopReason::TokenBudget);
    }
    if state.cost_usd > budgets.max_cost_usd {
        state.cards.push(CardDraft {
            kind: CardKind::BudgetExceeded,
            summary: format!(
                "cost budget exceeded: ${:.4} > ${:.4}",
                state.cost_usd, budgets.max_cost_usd
            ),
            detail: format!("max_cost_usd {}", budgets.max_cost_usd),
            evidence: vec![format!("step {step}")],
        });
        return Some(StopReason::CostBudget);
    }
    None
}

/// The observation and card (at most one per missing tool or denial fingerprint) for
/// a call the gate refused.
fn refuse<'c>(
    state: &mut LoopState,
    call: &ToolCall,
    refusal: Refusal,
    record: impl FnOnce(RecordedDecision, Option<String>, String) -> CallRecord<'c>,
) -> (CallRecord<'c>, ToolResult) {
    match refusal {
        Refusal::Invalid { class, message } => {
            if class == ErrorClass::UnknownTool {
                missing_tool_card(
                    state,
                    call,
                    format!("the model asked for a tool that does not exist: `{}`", call.name),
                    format!("tool `{}` requested", call.name),
                    vec![format!("call {}", call.id), arguments_hash(call)],
                );
            }
            let result = ToolResult::error(&call.id, class, message.clone());
            (record(RecordedDecision::None, None, message), result)
        }
        Refusal::NotEnabled { message } => {
            missing_tool_card(
                state,
                call,
                format!("the model needed `{}`, which this task does not enable", call.name),
                message.clone(),
                vec![],
            );
            let result = ToolResult::error(&call.id, ErrorClass::UnknownTool, message.clone());
            (record(RecordedDecision::None, None, message), result)
        }
        Refusal::Denied(verdict) => {
            state.denials += 1;
            let rec = record(RecordedDecision::Deny, verdict.rule.clone(), verdict.reason.clone());
            let fingerprint = format!("{} {}", call.name, verdict.reason);
            if !state.denied_fingerprints.contains(&fingerprint) {
                state.denied_fingerprints.push(fingerprint);
                // Committed with the run: the call's arguments only as their hash
                // (`runtime show <run>` has them, redacted, on this machine).
                let reason = without_arguments(&verdict.reason, call);
                state.cards.push(CardDraft {
                    kind: CardKind::PermissionDenied,
                    summary: format!(
                        "`{}` denied: {}",
                        call.name,
                        reason.chars().take(120).collect::<String>()
                    ),
                    detail: reason,
                    evidence: vec![
                        format!("call {}", call.id),
                        arguments_hash(call),
                        format!("rule: {}", verdict.rule.unwrap_or_else(|| "(built-in)".into())),
                    ],
                });
            }
            let result = ToolResult::error(&call.id, ErrorClass::PermissionDenied, verdict.reason);
            (rec, result)
        }
    }
}

/// One `missing_tool` card per tool name and run.
fn missing_tool_card(state: &mut LoopState, call: &ToolCall, summary: String, detail: String, evidence: Vec<String>) {
    if state.missing_tools.contains(&call.name) {
        return;
    }
    state.missing_tools.push(call.name.clone());
    state.cards.push(CardDraft {
        kind: CardKind::MissingTool,
        summary,
        detail,
        evidence,
    });
}

/// Records a handled call everywhere it belongs: the receipt's call list, the trace
/// (call row and span), the conversation, and the repetition detectors.
fn finish_call(cfg: &LoopConfig, state: &mut LoopState, rec: CallRecord, result: &ToolResult) {
    let CallRecord {
        call,
        step,
        span,
        args_json,
        decision,
        rule,
        reason,
    } = rec;
    let outcome = ToolOutcome::from(result.error);
    let reason = cfg.redactor.redact(&reason).into_owned();
    // The receipt is committed: it keeps no argument text (a password typed in a
    // command), only the arguments' hash; the local trace keeps them, redacted.
    state.tool_calls.push(ToolCallRecord {
        id: call.id.clone(),
        name: call.name.clone(),
        decision,
        rule: rule.clone(),
        reason: without_arguments(&reason, call),
        outcome,
        duration_ms: result.duration_ms,
        mcp: None,
    });
    let arguments =
        serde_json::from_str(&cfg.redactor.redact(&args_json.to_string())).unwrap_or(serde_json::Value::Null);
    state.trace.calls.push(TracedCall {
        call_id: call.id.clone(),
        step,
        name: call.name.clone(),
        arguments,
        args_hash: call_hash(&call.name, &call.arguments),
        decision,
        rule,
        reason,
        outcome,
        duration_ms: result.duration_ms,
    });
    annotate_tool_span(cfg, state, span, decision, result);
    remember_call(cfg, state, call, result);
}

/// Ends a handled call's span with its decision, arguments (as the trace row keeps
/// them), outcome and result.
fn annotate_tool_span(
    cfg: &LoopConfig,
    state: &mut LoopState,
    span: u64,
    decision: RecordedDecision,
    result: &ToolResult,
) {
    let outcome = ToolOutcome::from(result.error);
    state.trace.attr(span, "agent.decision", decision.to_string());
    if let Some(args) = state.trace.calls.last().map(|c| c.arguments.to_string()) {
        state.trace.attr(span, "gen_ai.tool.call.arguments", args);
    }
    state.trace.attr(span, "agent.outcome", outcome.to_string());
    if result.kernel_denied {
        state.trace.attr(span, "agent.kernel_denied", true);
    }
    state.trace.attr(
        span,
        "gen_ai.tool.call.result",
        cfg.redactor
            .redact(&result.output)
            .chars()
            .take(2000)
            .collect::<String>(),
    );
    state.trace.end(
        span,
        if result.error.is_none() {
            SpanStatus::Ok
        } else {
            SpanStatus::Error
        },
    );
}

/// Puts a handled call's observation in the conversation and the call and its error
/// (if any) in the repetition detectors.
fn remember_call(cfg: &LoopConfig, state: &mut LoopState, call: &ToolCall, result: &ToolResult) {
    state.messages.push(Message::Tool {
        call_id: call.id.clone(),
        name: call.name.clone(),
        content: cfg.redactor.redact(&result.observation()).into_owned(),
        is_error: result.error.is_some(),
    });
    state.recent_calls.push(format!("{} {}", call.name, call.arguments));
    state.recent_errors.push(match result.error {
        Some(c) => format!(
            "{} {}: {}",
            call.name,
            c.as_str(),
            crate::records::normalise_detail(&result.output.chars().take(200).collect::<String>())
        ),
        None => String::new(),
    });
}

/// Messages in the shape the GenAI semantic conventions give `gen_ai.input.messages`
/// and `gen_ai.output.messages`: `[{role, parts: [{type, ...}]}]`.
fn semconv_messages(messages: &[Message]) -> serde_json::Value {
    use serde_json::json;
    let text = |content: &str| json!({"type": "text", "content": content});
    messages
        .iter()
        .map(|m| match m {
            Message::System { content } => json!({"role": "system", "parts": [text(content)]}),
            Message::User { content } => json!({"role": "user", "parts": [text(content)]}),
            Message::Assistant { content, tool_calls } => {
                let mut parts: Vec<serde_json::Value> = content.iter().map(|c| text(c)).collect();
                parts.extend(tool_calls.iter().map(|c| {
                    let arguments = serde_json::from_str::<serde_json::Value>(&c.arguments)
                        .unwrap_or_else(|_| c.arguments.clone().into());
                    json!({"type": "tool_call", "id": c.id, "name": c.name, "arguments": arguments})
                }));
                json!({"role": "assistant", "parts": parts})
            }
            Message::Tool { call_id, content, .. } => {
                json!({"role": "tool", "parts": [{"type": "tool_call_response", "id": call_id, "response": content}]})
            }
        })
        .collect()
}

fn last_calls(state: &LoopState) -> Vec<String> {
    state
        .tool_calls
        .iter()
        .rev()
        .take(5)
        .map(|c| format!("{} {} -> {}", c.id, c.name, c.outcome))
        .collect()
}

/// A call's arguments as records name them: their hash (the one an approval binds
/// to), never their text.
fn arguments_hash(call: &ToolCall) -> String {
    format!("arguments sha256:{}", &call_hash(&call.name, &call.arguments)[..16])
}

/// `text` with every backtick-quoted span (the policy quotes the command or path it
/// judged) replaced by the call's [`arguments_hash`]: a receipt or card is committed
/// and keeps no argument text, which may hold a password the redactor cannot know.
fn without_arguments(text: &str, call: &ToolCall) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('`') {
        let Some(close) = rest[open + 1..].find('`') else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&format!("`<{}>`", arguments_hash(call)));
        rest = &rest[open + 1 + close + 1..];
    }
    out.push_str(rest);
    out
}

/// The same call, or the same error, `n` times in a row.
fn repetition(cfg: &LoopConfig, state: &mut LoopState) -> Option<StopReason> {
    if let Some(last) = repeated(&state.recent_calls, cfg.limits.repeated_call as usize, |_| true) {
        // `last` is `<tool> <arguments>`: committed as the tool and the hash only.
        let (name, args) = last.split_once(' ').unwrap_or((last.as_str(), ""));
        let named = format!("{name} arguments sha256:{}", &call_hash(name, args)[..16]);
        state.cards.push(CardDraft {
            kind: CardKind::RepeatedCall,
            summary: format!("the same call was made {} times in a row", cfg.limits.repeated_call),
            detail: named.clone(),
            evidence: vec![named],
        });
        return Some(StopReason::RepeatedCall);
    }
    if let Some(last) = repeated(&state.recent_errors, cfg.limits.repeated_error as usize, |e| {
        !e.is_empty()
    }) {
        state.cards.push(CardDraft {
            kind: CardKind::RepeatedError,
            summary: format!("the same error {} times in a row", cfg.limits.repeated_error),
            detail: last.clone(),
            evidence: vec![last],
        });
        return Some(StopReason::RepeatedError);
    }
    None
}

/// The last entry of `recent` when its last `n` entries (n > 1) are equal and count.
fn repeated(recent: &[String], n: usize, counts: impl Fn(&str) -> bool) -> Option<String> {
    let last = recent.last()?;
    (n > 1 && recent.len() >= n && recent.iter().rev().take(n).all(|c| counts(c) && c == last)).then(|| last.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_id_the_run_already_used_is_renamed_in_the_conversation_it_enters() {
        let call = |id: &str| ToolCall {
            id: id.into(),
            name: "run_command".into(),
            arguments: "{}".into(),
        };
        let earlier = vec![Message::Assistant {
            content: None,
            tool_calls: vec![call("c1")],
        }];
        let mut calls = vec![call("c1"), call("dup"), call("dup"), call("dup_dup2"), call("c2")];
        unique_call_ids(&earlier, &mut calls);
        let ids: Vec<&str> = calls.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["c1_dup2", "dup", "dup_dup2", "dup_dup2_dup2", "c2"]);
    }

    #[test]
    fn the_sweep_finds_every_repository_a_tool_made_bare_ones_too() {
        let t = tempfile::tempdir().unwrap();
        let root = t.path();
        let make = |rel: &str| std::fs::create_dir_all(root.join(rel)).unwrap();
        let file = |rel: &str, text: &str| std::fs::write(root.join(rel), text).unwrap();
        make("reports/old/objects");
        make("reports/old/refs");
        file("reports/old/HEAD", "ref: refs/heads/main\n");
        make("reports/assembled/objects");
        file("reports/assembled/HEAD", "ref: refs/heads/main\n");
        // Past the window's margin, then made at once: stamped by the kernel's coarse
        // clock, these carry times a tick behind `now`, inside the window only for
        // its margin.
        std::thread::sleep(FILE_CLOCK_LAG * 2);
        let since = sweep_window_start();
        make("reports/n/.git");
        // A directory named HEAD is walked like any other.
        make("reports/HEAD/x/.git");
        make("reports/bare/objects");
        make("reports/bare/refs");
        file("reports/bare/HEAD", "ref: refs/heads/main\n");
        make("reports/borrow");
        file("reports/borrow/HEAD", "ref: refs/heads/main\n");
        file("reports/borrow/commondir", "../bare\n");
        // Its HEAD and `objects` from an earlier call, its `refs` from this one.
        make("reports/assembled/refs");
        // A file named HEAD alone, or beside `refs` only, is an ordinary file.
        make("reports/plain/refs");
        file("reports/plain/HEAD", "a note\n");
        let mut found = nested_git(root, &["reports".to_string()], since);
        found.sort();
        assert_eq!(
            found,
            [
                "reports/HEAD/x/.git",
                "reports/assembled/HEAD",
                "reports/bare/HEAD",
                "reports/borrow/HEAD",
                "reports/n/.git"
            ],
            "the repository made before `since` is an earlier call's, already judged"
        );
    }

    #[test]
    fn the_nested_repository_card_counts_them_all_and_keeps_a_sample() {
        let mut state = LoopState::default();
        note_nested_repositories(
            &mut state,
            (0..25).map(|i| format!("reports/{i}/.git: removed")).collect(),
            0,
        );
        note_nested_repositories(&mut state, vec!["reports/x/.git: removed".into()], 2);
        assert_eq!(state.cards.len(), 1);
        let card = &state.cards[0];
        assert!(
            card.summary.starts_with("28 nested git repository(ies)"),
            "{}",
            card.summary
        );
        assert_eq!(card.evidence.len(), crate::records::CARD_EVIDENCE_MAX);
        assert_eq!(card.detail.lines().count(), crate::records::CARD_EVIDENCE_MAX);
    }
}
