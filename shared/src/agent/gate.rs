//! The policy gate: the pure decision, for one tool call the model asked for, of what
//! happens to it: run it, refuse it (and why), or pause the fire for a builder's
//! approval. It changes nothing; the loop then executes and records what it decided.

use super::{call_hash, CallDecision};
use crate::policy::{Call, Decision, Policy, Verdict};
use crate::provider::ToolCall;
use crate::tools::{parse_args, ErrorClass, Tool, ToolArgs};
use serde_json::Value;

/// What the gate asks of the fire it runs in.
pub struct GateInput<'a> {
    /// The tools this task enables.
    pub tools: &'a [Tool],
    pub policy: &'a Policy,
    /// True for paths committed in HEAD (records are never rewritten).
    pub committed: &'a dyn Fn(&str) -> bool,
    /// A builder's decision on a paused call: `(call_id, args_hash)`.
    pub decision: &'a dyn Fn(&str, &str) -> Option<CallDecision>,
}

/// Why a call does not run.
#[derive(Debug, Clone, PartialEq)]
pub enum Refusal {
    /// The arguments did not parse, or the tool does not exist at all.
    Invalid { class: ErrorClass, message: String },
    /// A real tool this task does not enable.
    NotEnabled { message: String },
    /// Denied by a rule, by the records rule, or by a builder.
    Denied(Verdict),
}

/// The gate's answer for one call.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    Run {
        args: ToolArgs,
        args_json: Value,
        verdict: Verdict,
    },
    Refuse {
        args_json: Value,
        refusal: Refusal,
    },
    Pause {
        args: ToolArgs,
        args_json: Value,
        verdict: Verdict,
        args_hash: String,
    },
}

/// Decides `call`: parse strictly, check the tool is enabled, ask the policy, never
/// rewrite a committed record, and settle `ask` with a builder's recorded decision or
/// a pause.
pub fn gate(call: &ToolCall, input: &GateInput) -> Gate {
    let args = match parse_args(&call.name, &call.arguments) {
        Ok(a) => a,
        Err((class, message)) => {
            return Gate::Refuse {
                args_json: serde_json::json!({"_invalid": call.arguments.chars().take(2000).collect::<String>()}),
                refusal: Refusal::Invalid { class, message },
            }
        }
    };
    let args_json = serde_json::to_value(&args).unwrap_or_default();
    if !input.tools.contains(&args.tool()) {
        return Gate::Refuse {
            args_json,
            refusal: Refusal::NotEnabled {
                message: format!("tool `{}` is not enabled for this task", args.name()),
            },
        };
    }
    let mut verdict = input.policy.decide(Call::from(&args));
    if verdict.decision != Decision::Deny {
        if let Some(path) = rewritten_record(&args, input) {
            verdict = Verdict {
                decision: Decision::Deny,
                rule: None,
                reason: format!("`{path}` is a committed record; records are never rewritten"),
            };
        }
    }
    if verdict.decision == Decision::Ask {
        let args_hash = call_hash(&call.name, &call.arguments);
        verdict = match (input.decision)(&call.id, &args_hash) {
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
                return Gate::Pause {
                    args,
                    args_json,
                    verdict,
                    args_hash,
                }
            }
        };
    }
    match verdict.decision {
        Decision::Deny => Gate::Refuse {
            args_json,
            refusal: Refusal::Denied(verdict),
        },
        Decision::Allow => Gate::Run {
            args,
            args_json,
            verdict,
        },
        // Settled above: an ask is either decided by a builder or paused.
        Decision::Ask => Gate::Refuse {
            args_json,
            refusal: Refusal::Denied(Verdict {
                decision: Decision::Deny,
                rule: verdict.rule,
                reason: "an unsettled `ask` never runs".into(),
            }),
        },
    }
}

/// The path a write or edit would rewrite, when it is a record committed in HEAD.
fn rewritten_record<'a>(args: &'a ToolArgs, input: &GateInput) -> Option<&'a str> {
    let (ToolArgs::WriteFile { path, .. } | ToolArgs::EditFile { path, .. }) = args else {
        return None;
    };
    let root = input.policy.ownership().root();
    let rel = crate::layout::normalize(root, &root.join(path).to_string_lossy())?;
    (input.committed)(&rel).then_some(path.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::Permissions;

    fn policy(root: &std::path::Path) -> Policy {
        let perms = Permissions {
            allow: vec!["Read(**)".into(), "Bash(ls*)".into()],
            ask: vec!["Bash(curl*)".into()],
            deny: vec!["Bash(rm*)".into()],
            write: vec!["reports/**".into()],
            ..Permissions::default()
        };
        Policy::new(root, &perms, &[]).unwrap()
    }

    fn call(name: &str, args: &str) -> ToolCall {
        ToolCall {
            id: "c1".into(),
            name: name.into(),
            arguments: args.into(),
        }
    }

    fn decide(c: &ToolCall, committed: &dyn Fn(&str) -> bool, decision: Option<CallDecision>) -> Gate {
        let dir = tempfile::tempdir().unwrap();
        let policy = policy(dir.path());
        let tools = [Tool::ReadFile, Tool::WriteFile, Tool::RunCommand];
        let decided = move |_: &str, _: &str| decision;
        gate(
            c,
            &GateInput {
                tools: &tools,
                policy: &policy,
                committed,
                decision: &decided,
            },
        )
    }

    #[test]
    fn runs_allowed_calls_and_refuses_the_rest_with_the_reason() {
        let none = |_: &str| false;
        assert!(matches!(
            decide(&call("run_command", r#"{"command":"ls -la"}"#), &none, None),
            Gate::Run { .. }
        ));
        match decide(&call("run_command", r#"{"command":"rm -rf x"}"#), &none, None) {
            Gate::Refuse {
                refusal: Refusal::Denied(v),
                ..
            } => assert_eq!(v.decision, Decision::Deny),
            other => panic!("expected a denial, got {other:?}"),
        }
        assert!(matches!(
            decide(&call("grep", r#"{"pattern":"x","path":"."}"#), &none, None),
            Gate::Refuse {
                refusal: Refusal::NotEnabled { .. },
                ..
            }
        ));
        assert!(matches!(
            decide(&call("teleport", "{}"), &none, None),
            Gate::Refuse {
                refusal: Refusal::Invalid {
                    class: ErrorClass::UnknownTool,
                    ..
                },
                ..
            }
        ));
        assert!(matches!(
            decide(&call("run_command", "{not json"), &none, None),
            Gate::Refuse {
                refusal: Refusal::Invalid {
                    class: ErrorClass::InvalidArguments,
                    ..
                },
                ..
            }
        ));
    }

    #[test]
    fn ask_pauses_until_a_builder_decides() {
        let none = |_: &str| false;
        let curl = call("run_command", r#"{"command":"curl example.org"}"#);
        match decide(&curl, &none, None) {
            Gate::Pause { args_hash, .. } => assert_eq!(args_hash, call_hash(&curl.name, &curl.arguments)),
            other => panic!("expected a pause, got {other:?}"),
        }
        assert!(matches!(
            decide(&curl, &none, Some(CallDecision::Approve)),
            Gate::Run { .. }
        ));
        assert!(matches!(
            decide(&curl, &none, Some(CallDecision::Deny)),
            Gate::Refuse {
                refusal: Refusal::Denied(_),
                ..
            }
        ));
    }

    #[test]
    fn a_committed_record_is_never_rewritten() {
        let committed = |rel: &str| rel == "reports/old.md";
        let write = call("write_file", r#"{"path":"reports/old.md","content":"x"}"#);
        match decide(&write, &committed, None) {
            Gate::Refuse {
                refusal: Refusal::Denied(v),
                ..
            } => assert!(v.reason.contains("committed record"), "{}", v.reason),
            other => panic!("expected a denial, got {other:?}"),
        }
        let fresh = call("write_file", r#"{"path":"reports/new.md","content":"x"}"#);
        assert!(matches!(decide(&fresh, &committed, None), Gate::Run { .. }));
    }
}
