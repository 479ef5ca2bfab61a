//! One MCP tool call through the loop: the same gate as a built-in tool (the policy
//! decides `mcp__<server>__<tool>` deny over ask over allow, `ask` pauses the fire for
//! `builder approve-call` bound to the call's arguments), the same ledger, the same
//! records, caps, redaction and framing of the result; only execution differs (the
//! server, through [`crate::agent::mcp_client::McpHub`]). A name no offered tool has (no pin, drift,
//! a server that did not start) is an unknown tool, never a call.

use super::{
    call_hash, completed_entry, finish_call, refuse, Agent, CallDecision, CallOutcome, CallRecord, CardDraft,
    PendingApproval,
};
use crate::journal::CallStage;
use crate::policy::{Decision, Verdict};
use crate::progress::Event;
use crate::provider::ToolCall;
use crate::records::{CardKind, McpCallRecord, RecordedDecision, StopReason};
use crate::tools::{ErrorClass, ToolResult};
use gate_mcp::McpGate;
use std::time::Duration;

pub(super) mod gate_mcp {
    use super::*;
    use crate::agent::gate::Refusal;

    /// The gate's answer for one MCP call.
    pub enum McpGate {
        Run {
            args: serde_json::Map<String, serde_json::Value>,
            args_json: serde_json::Value,
            verdict: Verdict,
        },
        Refuse {
            args_json: serde_json::Value,
            refusal: Refusal,
        },
        Pause {
            args_json: serde_json::Value,
            verdict: Verdict,
            args_hash: String,
        },
    }

    impl McpGate {
        /// The decision's name in the `ToolDecided` progress event.
        pub fn decision_name(&self) -> &'static str {
            match self {
                McpGate::Refuse {
                    refusal: Refusal::Denied(_),
                    ..
                } => "deny",
                McpGate::Refuse { .. } => "none",
                McpGate::Pause { .. } => "ask",
                McpGate::Run { .. } => "allow",
            }
        }
    }

    /// The call's arguments: a JSON object whose keys the tool's pinned `schema`
    /// admits ([`undeclared_argument`]), or why not.
    fn checked_arguments(
        raw: &str,
        schema: &serde_json::Value,
    ) -> Result<serde_json::Map<String, serde_json::Value>, String> {
        let args = match serde_json::from_str::<serde_json::Value>(raw) {
            Ok(serde_json::Value::Object(m)) => m,
            Ok(_) => return Err("arguments must be a JSON object".into()),
            Err(e) => return Err(format!("arguments are not valid JSON: {e}")),
        };
        match undeclared_argument(schema, &args) {
            Some(extra) => Err(format!(
                "argument `{extra}` is not in the tool's pinned schema, which admits no other"
            )),
            None => Ok(args),
        }
    }

    /// The first argument the pinned schema does not name when it admits no other
    /// (`additionalProperties: false`): refused before the policy, whose argument
    /// patterns match the call's JSON as a whole, so a key the server ignores (holding
    /// the text an allow pattern looks for) cannot widen what a rule allows.
    pub(super) fn undeclared_argument<'a>(
        schema: &serde_json::Value,
        args: &'a serde_json::Map<String, serde_json::Value>,
    ) -> Option<&'a str> {
        // Keys admitted another way (patterns, composed or referenced schemas) are
        // not judged here: only a plain closed list of properties.
        let composed = ["patternProperties", "allOf", "anyOf", "oneOf", "$ref"]
            .iter()
            .any(|k| schema.get(k).is_some());
        if composed || schema.get("additionalProperties") != Some(&serde_json::Value::Bool(false)) {
            return None;
        }
        let declared = schema.get("properties").and_then(serde_json::Value::as_object);
        args.keys()
            .find(|k| !declared.is_some_and(|d| d.contains_key(k.as_str())))
            .map(String::as_str)
    }

    /// Decides an MCP call: offered, arguments a JSON object, then the policy, and an
    /// `ask` settled by a builder's recorded decision or a pause.
    pub fn gate(
        call: &ToolCall,
        hub: &crate::agent::mcp_client::McpHub,
        policy: &crate::policy::Policy,
        decision: &dyn Fn(&str, &str) -> Option<CallDecision>,
    ) -> McpGate {
        let raw = if call.arguments.trim().is_empty() {
            "{}"
        } else {
            call.arguments.as_str()
        };
        let invalid = |class, message: String| McpGate::Refuse {
            args_json: serde_json::json!({"_invalid": call.arguments.chars().take(2000).collect::<String>()}),
            refusal: Refusal::Invalid { class, message },
        };
        let Some(offered) = hub.offered(&call.name) else {
            return invalid(
                ErrorClass::UnknownTool,
                format!(
                    "there is no tool `{}` (an MCP tool is offered only when it matches its pin)",
                    call.name
                ),
            );
        };
        let args = match checked_arguments(raw, &offered.def.schema) {
            Ok(args) => args,
            Err(why) => return invalid(ErrorClass::InvalidArguments, why),
        };
        let args_json = serde_json::Value::Object(args.clone());
        let canonical = crate::mcp::lock::canonical_args(&args_json);
        let mut verdict = policy.decide_mcp(&offered.server, &offered.tool, &canonical);
        if verdict.decision == Decision::Ask {
            let args_hash = call_hash(&call.name, &call.arguments);
            verdict = match decision(&call.id, &args_hash) {
                Some(CallDecision::Approve) => Verdict {
                    decision: Decision::Allow,
                    rule: verdict.rule,
                    reason: "approved by a builder".into(),
                },
                Some(CallDecision::Deny) => Verdict {
                    decision: Decision::Deny,
                    rule: verdict.rule,
                    reason: "denied by a builder".into(),
                },
                None => {
                    return McpGate::Pause {
                        args_json,
                        verdict,
                        args_hash,
                    }
                }
            };
        }
        match verdict.decision {
            Decision::Allow => McpGate::Run {
                args,
                args_json,
                verdict,
            },
            Decision::Deny | Decision::Ask => McpGate::Refuse {
                args_json,
                refusal: Refusal::Denied(Verdict {
                    decision: Decision::Deny,
                    ..verdict
                }),
            },
        }
    }
}

impl Agent<'_> {
    /// Gates, runs and records one MCP call (see the module's comment).
    pub(super) async fn handle_mcp_call(
        &mut self,
        state: &mut super::LoopState,
        call: &ToolCall,
        step: u32,
        span: u64,
        resumed: bool,
    ) -> CallOutcome {
        let decided = gate_mcp::gate(call, self.mcp, self.policy, &*self.cfg.decision);
        self.progress.event(&Event::ToolDecided {
            name: call.name.clone(),
            decision: decided.decision_name().into(),
        });
        let record = |args_json, decision, rule, reason| CallRecord {
            call,
            step,
            span,
            args_json,
            decision,
            rule,
            reason,
        };
        let mcp_record = self.mcp.offered(&call.name).map(|o| McpCallRecord {
            server: o.server.clone(),
            tool: o.tool.clone(),
            pin: o.pin.clone(),
        });
        if let Some(m) = &mcp_record {
            state.trace.attr(span, "mcp.server", m.server.clone());
            state.trace.attr(span, "mcp.tool", m.tool.clone());
            state.trace.attr(span, "mcp.pin", m.pin.clone());
        }
        let (rec, result, stop) = match decided {
            McpGate::Refuse { args_json, refusal } => {
                let (rec, result) = refuse(state, call, refusal, |d, rule, reason| {
                    record(args_json, d, rule, reason)
                });
                (rec, result, None)
            }
            McpGate::Pause {
                args_json,
                verdict,
                args_hash,
            } => {
                let result = self.pause_for_approval(state, call, step, &args_json, &verdict, args_hash);
                let rec = record(args_json, RecordedDecision::Ask, verdict.rule, verdict.reason);
                (rec, result, Some(StopReason::WaitingApproval))
            }
            McpGate::Run {
                args,
                args_json,
                verdict,
            } => {
                let result = match self.run_mcp(state, call, args, resumed).await {
                    Ok(r) => r,
                    Err(stop) => return CallOutcome::Stop(stop),
                };
                self.report_finished(&call.name, &result);
                let rec = record(args_json, RecordedDecision::Allow, verdict.rule, verdict.reason);
                (rec, result, None)
            }
        };
        finish_call(self.cfg, state, rec, &result);
        if let Some(last) = state.tool_calls.last_mut() {
            last.mcp = mcp_record;
        }
        let ledger = match stop {
            Some(_) => Vec::new(),
            None => vec![completed_entry(self.cfg, call, &result)],
        };
        match (self.checkpoint(state, &ledger), stop) {
            (Some(s), _) | (None, Some(s)) => CallOutcome::Stop(s),
            (None, None) => CallOutcome::Done,
        }
    }

    /// Pauses the fire on an `ask` no builder has decided yet: the pending approval
    /// bound to the call's arguments, its card, and the result the model sees.
    fn pause_for_approval(
        &self,
        state: &mut super::LoopState,
        call: &ToolCall,
        step: u32,
        args_json: &serde_json::Value,
        verdict: &Verdict,
        args_hash: String,
    ) -> ToolResult {
        state.pending = Some(PendingApproval {
            call: call.clone(),
            args_hash: args_hash.clone(),
            step,
            pins: Vec::new(),
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
        ToolResult::error(
            &call.id,
            ErrorClass::PermissionDenied,
            "waiting for a builder's approval",
        )
    }

    /// The result of an allowed MCP call: the ledger's on resume, else the server's
    /// within the time left; `Err` when the ledger says the call may already have run.
    async fn run_mcp(
        &mut self,
        state: &mut super::LoopState,
        call: &ToolCall,
        args: serde_json::Map<String, serde_json::Value>,
        resumed: bool,
    ) -> Result<ToolResult, StopReason> {
        if let Some(r) = self.mcp_recorded(call, resumed) {
            // A call the ledger left started (or cannot tell of): said on a card, as a
            // built-in call's is. A server gone mid-call has its own card below.
            self.card_if_uncertain(state, call, &r);
            return Ok(r);
        }
        if let Some(stop) = self.ledger_started(state, call) {
            return Err(stop);
        }
        crate::failpoint!("after-ledger-started");
        let remaining = self.wall().saturating_sub(self.started.elapsed());
        let timeout = Duration::from_secs(self.cfg.limits.tool_timeout_s)
            .min(remaining)
            .max(Duration::from_millis(100));
        let (mut r, card) = self
            .mcp
            .call(&call.name, args, timeout, self.cfg.limits.tool_output_bytes)
            .await;
        crate::failpoint!("after-tool-side-effect");
        r.call_id = call.id.clone();
        if let Some(card) = card {
            state.cards.push(card);
        }
        Ok(r)
    }

    /// On resume, what the ledger knows of an MCP call: a completed call's result; a
    /// call left started may have taken effect and is not sent again.
    fn mcp_recorded(&self, call: &ToolCall, resumed: bool) -> Option<ToolResult> {
        if !resumed {
            return None;
        }
        let journal = self.journal.as_deref()?;
        let entry = match journal.entry(&call.id) {
            Ok(e) => e?,
            Err(e) => {
                tracing::warn!(error = %e, call = %call.id, "the ledger could not be read");
                return Some(super::uncertain(call, "its ledger entry could not be read"));
            }
        };
        if entry.args_hash != call_hash(&call.name, &call.arguments) {
            return None;
        }
        match entry.stage {
            CallStage::Intended => None,
            CallStage::Completed => Some(super::recorded_result(call, entry.result)),
            CallStage::Started => Some(super::uncertain(
                call,
                "the run was interrupted after this MCP call started; it may or may not have taken effect and is not sent again",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::gate_mcp::undeclared_argument;
    use serde_json::json;

    #[test]
    fn an_argument_a_closed_schema_does_not_name_is_found() {
        let closed =
            json!({"type": "object", "properties": {"path": {"type": "string"}}, "additionalProperties": false});
        let open = json!({"type": "object", "properties": {"path": {"type": "string"}}});
        let args = |v: serde_json::Value| v.as_object().unwrap().clone();
        let smuggled = args(json!({"path": "prompts/t.md", "z": {"path": "reports/"}}));
        assert_eq!(undeclared_argument(&closed, &smuggled), Some("z"));
        assert_eq!(undeclared_argument(&open, &smuggled), None, "an open schema admits it");
        assert_eq!(
            undeclared_argument(&closed, &args(json!({"path": "reports/a.md"}))),
            None
        );
    }
}
