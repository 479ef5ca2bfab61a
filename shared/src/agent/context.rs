//! The context builder: system (runtime persona + `scope/SCOPE.md`), task prompt with
//! prefetched context, then the history of turns, fitted to the model's context
//! budget. Older tool outputs are summarised first, then the oldest whole turns are
//! dropped; every choice is recorded in a [`BudgetReport`] stored with the step.

use crate::provider::Message;
use crate::trace::BudgetReport;

/// Kept from an older tool output when it is summarised.
const SUMMARY_KEEP: usize = 240;

/// The runtime's persona, before the scope document.
pub const PERSONA: &str = "You are the runtime of an agent repository, firing unattended. Do the task with the tools you have. \
Your final answer (a message with no tool calls) becomes the run's report. Tool results come back as observations; \
an ERROR observation names its class (PERMISSION_DENIED, NOT_FOUND, ...). Do not retry a denied call: it will be denied again.";

pub fn system_prompt(scope: &str) -> String {
    format!("{PERSONA}\n\n{}", scope.trim())
}

/// Fits `messages` (system and task first, then history) into `budget` tokens.
pub fn fit(messages: &[Message], budget: u64) -> (Vec<Message>, BudgetReport) {
    let mut out: Vec<Message> = messages.to_vec();
    let mut report = BudgetReport {
        budget,
        ..BudgetReport::default()
    };
    let fixed = out.len().min(2);
    // The last turn (assistant + its results) is what the model must answer to.
    let last_turn_start = out
        .iter()
        .rposition(|m| matches!(m, Message::Assistant { .. }))
        .unwrap_or(out.len())
        .max(fixed);
    if total_tokens(&out) > budget {
        summarise_older_outputs(&mut out, fixed..last_turn_start, budget, &mut report);
    }
    drop_oldest_turns(&mut out, fixed, budget, &mut report);
    let used = total_tokens(&out);
    if used > budget {
        report.reasons.push(format!(
            "still {used} tokens over a budget of {budget}: the task prompt and latest turn alone exceed it"
        ));
    }
    report.used = used;
    report.included = out.len();
    (out, report)
}

fn total_tokens(messages: &[Message]) -> u64 {
    messages.iter().map(Message::approx_tokens).sum::<u64>()
}

/// Cuts the tool outputs in `older` (oldest first) to [`SUMMARY_KEEP`] bytes, until
/// `out` fits `budget`.
fn summarise_older_outputs(out: &mut [Message], older: std::ops::Range<usize>, budget: u64, report: &mut BudgetReport) {
    for i in older {
        if total_tokens(out) <= budget {
            break;
        }
        if let Message::Tool { content, .. } = &mut out[i] {
            if content.len() > SUMMARY_KEEP + 80 {
                let mut cut = SUMMARY_KEEP;
                while !content.is_char_boundary(cut) {
                    cut -= 1;
                }
                let dropped = content.len() - cut;
                *content = format!(
                    "{}\n[summarised: {dropped} bytes of older output left out to fit the context budget]",
                    &content[..cut]
                );
                report.summarised += 1;
            }
        }
    }
    if report.summarised > 0 {
        report
            .reasons
            .push(format!("summarised {} older tool outputs", report.summarised));
    }
}

/// Drops the oldest whole turns after the `fixed` part, never the last one, until
/// `out` fits `budget`.
fn drop_oldest_turns(out: &mut Vec<Message>, fixed: usize, budget: u64, report: &mut BudgetReport) {
    while total_tokens(out) > budget {
        let Some(start) = out
            .iter()
            .skip(fixed)
            .position(|m| matches!(m, Message::Assistant { .. }))
            .map(|p| p + fixed)
        else {
            break;
        };
        let end = out
            .iter()
            .skip(start + 1)
            .position(|m| matches!(m, Message::Assistant { .. }))
            .map(|p| p + start + 1);
        match end {
            Some(end)
                if end < out.len()
                    && out[end..].iter().any(|m| matches!(m, Message::Assistant { .. }))
                    && start < out.len() - 1 =>
            {
                let n = end - start;
                out.drain(start..end);
                report.dropped += n;
            }
            _ => break,
        }
    }
    if report.dropped > 0 {
        report
            .reasons
            .push(format!("dropped {} messages of the oldest turns", report.dropped));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::ToolCall;

    fn turn(i: usize, size: usize) -> Vec<Message> {
        vec![
            Message::Assistant {
                content: None,
                tool_calls: vec![ToolCall {
                    id: format!("c{i}"),
                    name: "read_file".into(),
                    arguments: "{}".into(),
                }],
            },
            Message::Tool {
                call_id: format!("c{i}"),
                name: "read_file".into(),
                content: "x".repeat(size),
                is_error: false,
            },
        ]
    }

    fn convo(turns: usize, size: usize) -> Vec<Message> {
        let mut m = vec![
            Message::System { content: "s".into() },
            Message::User { content: "u".into() },
        ];
        for i in 0..turns {
            m.extend(turn(i, size));
        }
        m
    }

    #[test]
    fn everything_fits_untouched() {
        let m = convo(3, 100);
        let (out, r) = fit(&m, 10_000);
        assert_eq!(out, m);
        assert_eq!((r.summarised, r.dropped, r.included), (0, 0, 8));
    }

    #[test]
    fn summarises_older_outputs_first() {
        let m = convo(4, 4000);
        let (out, r) = fit(&m, 2000);
        assert!(r.summarised >= 1 && r.dropped == 0, "{r:?}");
        assert!(r.used <= 2000);
        // The latest output is intact.
        assert_eq!(out.last(), m.last());
        assert!(matches!(&out[3], Message::Tool { content, .. } if content.contains("[summarised")));
    }

    #[test]
    fn drops_oldest_turns_when_summaries_are_not_enough() {
        let m = convo(30, 400);
        let (out, r) = fit(&m, 700);
        assert!(r.dropped > 0, "{r:?}");
        assert!(matches!(out[0], Message::System { .. }) && matches!(out[1], Message::User { .. }));
        assert!(
            matches!(out[2], Message::Assistant { .. }),
            "history starts with a whole turn"
        );
        assert_eq!(out.last(), m.last());
        assert!(!r.reasons.is_empty());
    }
}
