//! The loop controller: context builder -> provider -> policy gate -> tool executor ->
//! checkpoint, until a stop reason (DESIGN.md section 4). Every tool call is parsed
//! strictly, decided by the policy engine, and only then sent to the sandboxed tool
//! worker. Failures come back to the model as classified observations; those the
//! builder must hear about become card drafts.

pub mod context;
pub mod worker_client;

use crate::policy::{Decision, Policy};
use crate::provider::{cost_usd, Message, ModelRequest, ProviderChain, ToolCall, ToolDef};
use crate::records::{CardKind, RecordedDecision, StopReason, Tokens, ToolCallRecord, ToolOutcome};
use crate::secrets::Redactor;
use crate::settings::{Budgets, Limits, Price};
use crate::tools::{parse_args, ErrorClass, Tool, ToolArgs, ToolRequest, ToolResult};
use crate::trace::{SpanKind, SpanStatus, Trace, TracedCall};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use worker_client::WorkerClient;

/// A failure the builder should hear about; becomes a card file at the end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CardDraft {
    pub kind: CardKind,
    pub summary: String,
    pub detail: String,
    pub evidence: Vec<String>,
}

/// A call paused for approval, bound to its exact content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingApproval {
    pub call: ToolCall,
    pub args_hash: String,
    pub step: u32,
}

/// Everything needed to continue a run: the checkpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LoopState {
    pub messages: Vec<Message>,
    pub step: u32,
    pub tokens: Tokens,
    pub cost_usd: f64,
    pub retries: u32,
    pub denials: u32,
    pub tool_calls: Vec<ToolCallRecord>,
    pub cards: Vec<CardDraft>,
    pub final_answer: Option<String>,
    pub last_content: Option<String>,
    pub pending: Option<PendingApproval>,
    recent_calls: Vec<String>,
    recent_errors: Vec<String>,
    missing_tools: Vec<String>,
    denied_fingerprints: Vec<String>,
    pub trace: Trace,
}

/// `(call_id, args_hash)` -> the builder's decision on a paused call, if any.
pub type ApprovalLookup = Box<dyn Fn(&str, &str) -> Option<bool>>;
// Arguments: (call_id, args_hash); an approval only counts for the exact call it names.

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
    /// Returns true for paths committed in HEAD (records are never rewritten).
    pub committed: Box<dyn Fn(&str) -> bool>,
    /// Looks up a builder's decision on a paused call: Some(true) approved.
    pub approval: ApprovalLookup,
}

/// Hash binding an approval to one exact call (tool name + raw arguments).
pub fn call_hash(name: &str, arguments: &str) -> String {
    let canonical = serde_json::from_str::<serde_json::Value>(arguments)
        .map(|v| v.to_string())
        .unwrap_or_else(|_| arguments.to_string());
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update([0]);
    h.update(canonical.as_bytes());
    hex::encode(h.finalize())
}

enum CallOutcome {
    Done,
    Waiting,
}

/// Runs the loop until a stop reason. `cancel` turns true on SIGINT/SIGTERM.
pub async fn run(
    cfg: &LoopConfig,
    state: &mut LoopState,
    provider: &ProviderChain,
    policy: &Policy,
    worker: &mut WorkerClient,
    cancel: &mut tokio::sync::watch::Receiver<bool>,
    started: Instant,
) -> StopReason {
    let wall = Duration::from_secs(cfg.budgets.max_wall_s);
    let tool_defs: Vec<ToolDef> = cfg
        .tools
        .iter()
        .map(|t| t.spec())
        .map(|s| ToolDef {
            name: s.name.into(),
            description: s.description.into(),
            schema: (s.schema)(),
        })
        .collect();
    // A resumed run first settles the call it paused on.
    if let Some(p) = state.pending.clone() {
        match (cfg.approval)(&p.call.id, &p.args_hash) {
            None => return StopReason::WaitingApproval,
            Some(_) => {
                state.pending = None;
                if let Some(idx) = state
                    .messages
                    .iter()
                    .position(|m| matches!(m, Message::Tool { call_id, .. } if *call_id == p.call.id))
                {
                    state.messages.remove(idx);
                }
                let _ = handle_call(cfg, state, policy, worker, &p.call, p.step, started, wall, cancel).await;
            }
        }
    }
    loop {
        if *cancel.borrow() {
            return StopReason::Cancelled;
        }
        if state.step >= cfg.budgets.max_steps {
            state.cards.push(CardDraft {
                kind: CardKind::MaxSteps,
                summary: format!("stopped after {} steps without a final answer", state.step),
                detail: format!("max_steps {} reached", cfg.budgets.max_steps),
                evidence: last_calls(state),
            });
            return StopReason::MaxSteps;
        }
        if started.elapsed() >= wall {
            state.cards.push(CardDraft {
                kind: CardKind::BudgetExceeded,
                summary: "wall-time budget exhausted".into(),
                detail: format!("max_wall_s {} reached", cfg.budgets.max_wall_s),
                evidence: last_calls(state),
            });
            return StopReason::MaxWallTime;
        }
        state.step += 1;
        let step = state.step;
        let budget = cfg.max_context.saturating_sub(cfg.max_output_tokens as u64);
        let (messages, report) = context::fit(&state.messages, budget);
        state.trace.steps.push((step, report));
        let req = ModelRequest {
            model: cfg.model.clone(),
            messages,
            tools: tool_defs.clone(),
            max_output_tokens: cfg.max_output_tokens,
        };
        let span = state.trace.start(SpanKind::Model, format!("chat {}", cfg.model), None);
        state.trace.attr(span, "gen_ai.request.model", cfg.model.clone());
        state.trace.attr(span, "agent.step", step);
        let remaining = wall.saturating_sub(started.elapsed());
        let answer = tokio::select! {
            r = provider.complete(&req) => Some(r),
            _ = cancel.changed() => None,
            _ = tokio::time::sleep(remaining) => {
                state.trace.end(span, SpanStatus::WallTime);
                state.cards.push(CardDraft { kind: CardKind::BudgetExceeded, summary: "wall-time budget exhausted during a model call".into(), detail: format!("max_wall_s {} reached", cfg.budgets.max_wall_s), evidence: vec![] });
                return StopReason::MaxWallTime;
            }
        };
        let Some(answer) = answer else {
            state.trace.end(span, SpanStatus::Cancelled);
            return StopReason::Cancelled;
        };
        let resp = match answer {
            Ok(r) => r,
            Err(e) => {
                state.retries += e.retries;
                let msg = cfg.redactor.redact(&e.to_string()).into_owned();
                state.trace.attr(span, "error.type", format!("{:?}", e.kind));
                state.trace.end(span, SpanStatus::Error);
                state.cards.push(CardDraft {
                    kind: CardKind::ProviderError,
                    summary: format!("model call failed: {:?}", e.kind),
                    detail: msg,
                    evidence: vec![format!("step {step}")],
                });
                return StopReason::ProviderError;
            }
        };
        state.retries += resp.retries;
        state.tokens.input += resp.usage.input;
        state.tokens.output += resp.usage.output;
        state.cost_usd += cost_usd(&cfg.prices, &cfg.model, resp.usage);
        if let Some(s) = state.trace.span_mut(span) {
            s.tokens_in = resp.usage.input;
            s.tokens_out = resp.usage.output;
        }
        state.trace.attr(span, "agent.retries", resp.retries);
        state.trace.attr(span, "agent.served_by", resp.served_by.clone());
        state
            .trace
            .attr(span, "gen_ai.response.tool_calls", resp.tool_calls.len() as u64);
        state.trace.end(span, SpanStatus::Ok);
        state.messages.push(Message::Assistant {
            content: resp.content.clone(),
            tool_calls: resp.tool_calls.clone(),
        });
        if resp.content.is_some() {
            state.last_content = resp.content.clone();
        }
        if resp.tool_calls.is_empty() {
            state.final_answer = Some(resp.content.unwrap_or_default());
            return StopReason::FinalAnswer;
        }
        if state.tokens.total() > cfg.budgets.max_tokens {
            state.cards.push(CardDraft {
                kind: CardKind::BudgetExceeded,
                summary: format!(
                    "token budget exceeded: {} > {}",
                    state.tokens.total(),
                    cfg.budgets.max_tokens
                ),
                detail: format!("max_tokens {}", cfg.budgets.max_tokens),
                evidence: vec![format!("step {step}")],
            });
            return StopReason::TokenBudget;
        }
        if state.cost_usd > cfg.budgets.max_cost_usd {
            state.cards.push(CardDraft {
                kind: CardKind::BudgetExceeded,
                summary: format!(
                    "cost budget exceeded: ${:.4} > ${:.4}",
                    state.cost_usd, cfg.budgets.max_cost_usd
                ),
                detail: format!("max_cost_usd {}", cfg.budgets.max_cost_usd),
                evidence: vec![format!("step {step}")],
            });
            return StopReason::CostBudget;
        }
        for call in &resp.tool_calls {
            if *cancel.borrow() {
                return StopReason::Cancelled;
            }
            match handle_call(cfg, state, policy, worker, call, step, started, wall, cancel).await {
                CallOutcome::Done => {}
                CallOutcome::Waiting => return StopReason::WaitingApproval,
            }
            if let Some(stop) = repetition(cfg, state) {
                return stop;
            }
        }
        if state.denials > cfg.limits.max_denials {
            return StopReason::PermissionDenied;
        }
    }
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

fn repetition(cfg: &LoopConfig, state: &mut LoopState) -> Option<StopReason> {
    let n = cfg.limits.repeated_call as usize;
    if n > 1
        && state.recent_calls.len() >= n
        && state
            .recent_calls
            .iter()
            .rev()
            .take(n)
            .all(|c| *c == state.recent_calls[state.recent_calls.len() - 1])
    {
        let last = state.recent_calls.last().cloned().unwrap_or_default();
        state.cards.push(CardDraft {
            kind: CardKind::RepeatedCall,
            summary: format!("the same call was made {n} times in a row"),
            detail: last.clone(),
            evidence: vec![last],
        });
        return Some(StopReason::RepeatedCall);
    }
    let n = cfg.limits.repeated_error as usize;
    if n > 1
        && state.recent_errors.len() >= n
        && state
            .recent_errors
            .iter()
            .rev()
            .take(n)
            .all(|c| !c.is_empty() && *c == state.recent_errors[state.recent_errors.len() - 1])
    {
        let last = state.recent_errors.last().cloned().unwrap_or_default();
        state.cards.push(CardDraft {
            kind: CardKind::RepeatedError,
            summary: format!("the same error {n} times in a row"),
            detail: last.clone(),
            evidence: vec![last],
        });
        return Some(StopReason::RepeatedError);
    }
    None
}

#[allow(clippy::too_many_arguments)]
async fn handle_call(
    cfg: &LoopConfig,
    state: &mut LoopState,
    policy: &Policy,
    worker: &mut WorkerClient,
    call: &ToolCall,
    step: u32,
    started: Instant,
    wall: Duration,
    cancel: &mut tokio::sync::watch::Receiver<bool>,
) -> CallOutcome {
    let span = state
        .trace
        .start(SpanKind::Tool, format!("execute_tool {}", call.name), None);
    state.trace.attr(span, "gen_ai.tool.name", call.name.clone());
    state.trace.attr(span, "gen_ai.tool.call.id", call.id.clone());
    let args_hash = call_hash(&call.name, &call.arguments);
    let record = |state: &mut LoopState,
                  args: serde_json::Value,
                  decision: RecordedDecision,
                  rule: Option<String>,
                  reason: String,
                  result: &ToolResult| {
        let outcome = ToolOutcome::from(result.error);
        let reason = cfg.redactor.redact(&reason).into_owned();
        state.tool_calls.push(ToolCallRecord {
            id: call.id.clone(),
            name: call.name.clone(),
            decision,
            rule: rule.clone(),
            reason: reason.clone(),
            outcome,
            duration_ms: result.duration_ms,
        });
        let args = serde_json::from_str(&cfg.redactor.redact(&args.to_string())).unwrap_or(serde_json::Value::Null);
        state.trace.calls.push(TracedCall {
            call_id: call.id.clone(),
            step,
            name: call.name.clone(),
            arguments: args,
            args_hash: args_hash.clone(),
            decision,
            rule,
            reason,
            outcome,
            duration_ms: result.duration_ms,
        });
        state.trace.attr(span, "agent.decision", decision.to_string());
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
    };
    let args = match parse_args(&call.name, &call.arguments) {
        Ok(a) => a,
        Err((class, msg)) => {
            let result = ToolResult::error(&call.id, class, msg.clone());
            if class == ErrorClass::UnknownTool && !state.missing_tools.contains(&call.name) {
                state.missing_tools.push(call.name.clone());
                state.cards.push(CardDraft {
                    kind: CardKind::MissingTool,
                    summary: format!("the model asked for a tool that does not exist: `{}`", call.name),
                    detail: format!("tool `{}` requested", call.name),
                    evidence: vec![cfg
                        .redactor
                        .redact(&format!("{} {}", call.name, call.arguments))
                        .chars()
                        .take(500)
                        .collect()],
                });
            }
            record(
                state,
                serde_json::json!({"_invalid": call.arguments.chars().take(2000).collect::<String>()}),
                RecordedDecision::None,
                None,
                msg,
                &result,
            );
            return CallOutcome::Done;
        }
    };
    let args_json = serde_json::to_value(&args).unwrap_or_default();
    if !cfg.tools.contains(&args.tool()) {
        let msg = format!("tool `{}` is not enabled for this task", args.name());
        let result = ToolResult::error(&call.id, ErrorClass::UnknownTool, msg.clone());
        if !state.missing_tools.contains(&call.name) {
            state.missing_tools.push(call.name.clone());
            state.cards.push(CardDraft {
                kind: CardKind::MissingTool,
                summary: format!("the model needed `{}`, which this task does not enable", call.name),
                detail: msg.clone(),
                evidence: vec![],
            });
        }
        record(state, args_json, RecordedDecision::None, None, msg, &result);
        return CallOutcome::Done;
    }
    let mut verdict = policy.decide(args.as_call());
    if verdict.decision != Decision::Deny {
        if let ToolArgs::WriteFile { path, .. } | ToolArgs::EditFile { path, .. } = &args {
            let rel = crate::layout::normalize(
                policy.ownership().root(),
                &policy.ownership().root().join(path).to_string_lossy(),
            );
            if rel.as_deref().is_some_and(|r| (cfg.committed)(r)) {
                verdict = crate::policy::Verdict {
                    decision: Decision::Deny,
                    rule: None,
                    reason: format!("`{path}` is a committed record; records are never rewritten"),
                };
            }
        }
    }
    if verdict.decision == Decision::Ask {
        match (cfg.approval)(&call.id, &args_hash) {
            Some(true) => {
                verdict = crate::policy::Verdict {
                    decision: Decision::Allow,
                    rule: verdict.rule,
                    reason: "approved by a builder".into(),
                }
            }
            Some(false) => {
                verdict = crate::policy::Verdict {
                    decision: Decision::Deny,
                    rule: verdict.rule,
                    reason: "denied by a builder".into(),
                }
            }
            None => {
                state.pending = Some(PendingApproval {
                    call: call.clone(),
                    args_hash: args_hash.clone(),
                    step,
                });
                state.cards.push(CardDraft {
                    kind: CardKind::ApprovalNeeded,
                    summary: format!("`{}` needs approval", call.name),
                    detail: format!("{} (rule {})", verdict.reason, verdict.rule.clone().unwrap_or_default()),
                    evidence: vec![
                        format!("run {} call {} hash {}", cfg.run_id, call.id, args_hash),
                        cfg.redactor.redact(&args_json.to_string()).into_owned(),
                    ],
                });
                let result = ToolResult::error(
                    &call.id,
                    ErrorClass::PermissionDenied,
                    "waiting for a builder's approval",
                );
                record(
                    state,
                    args_json,
                    RecordedDecision::Ask,
                    verdict.rule,
                    verdict.reason,
                    &result,
                );
                return CallOutcome::Waiting;
            }
        }
    }
    if verdict.decision == Decision::Deny {
        state.denials += 1;
        let result = ToolResult::error(&call.id, ErrorClass::PermissionDenied, verdict.reason.clone());
        let fp = format!("{} {}", call.name, verdict.reason);
        if !state.denied_fingerprints.contains(&fp) {
            state.denied_fingerprints.push(fp);
            state.cards.push(CardDraft {
                kind: CardKind::PermissionDenied,
                summary: format!(
                    "`{}` denied: {}",
                    call.name,
                    verdict.reason.chars().take(120).collect::<String>()
                ),
                detail: verdict.reason.clone(),
                evidence: vec![
                    format!("call {}", call.id),
                    cfg.redactor.redact(&args_json.to_string()).chars().take(500).collect(),
                    format!("rule: {}", verdict.rule.clone().unwrap_or_else(|| "(built-in)".into())),
                ],
            });
        }
        record(
            state,
            args_json,
            RecordedDecision::Deny,
            verdict.rule,
            verdict.reason,
            &result,
        );
        return CallOutcome::Done;
    }
    let remaining = wall.saturating_sub(started.elapsed());
    let mut timeout = Duration::from_secs(cfg.limits.tool_timeout_s);
    if let ToolArgs::RunCommand { timeout_s: Some(t), .. } = &args {
        timeout = timeout.min(Duration::from_secs(*t));
    }
    let timeout = timeout.min(remaining).max(Duration::from_millis(100));
    let req = ToolRequest {
        call_id: call.id.clone(),
        args: args.clone(),
        timeout_ms: timeout.as_millis() as u64,
        output_limit: cfg.limits.tool_output_bytes,
    };
    let result = {
        let interrupter = worker.interrupt_handle();
        let call = worker.call(&req);
        tokio::pin!(call);
        tokio::select! {
            r = &mut call => r,
            _ = cancel.changed() => {
                interrupter.interrupt();
                call.await
            }
        }
    };
    if result.error == Some(ErrorClass::SideEffectUncertain) {
        state.cards.push(CardDraft {
            kind: CardKind::SideEffectUncertain,
            summary: format!("`{}` may or may not have taken effect", call.name),
            detail: cfg.redactor.redact(&result.output).into_owned(),
            evidence: vec![format!("call {}", call.id)],
        });
    }
    if result.kernel_denied {
        state.denials += 1;
    }
    record(
        state,
        args_json,
        RecordedDecision::Allow,
        verdict.rule,
        verdict.reason,
        &result,
    );
    CallOutcome::Done
}
