//! `runtime show <run-id>`: one run's trace, readable, as JSON, or as OTLP/JSON.

use crate::command_error::{CommandError, Outcome};
use anyhow::Context;
use shared::state::StateDb;
use std::path::{Path, PathBuf};

/// Show one run's trace (spans, budget reports, tool calls)
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Run id (a unique prefix is enough)
    pub run_id: String,
    /// Print JSON
    #[arg(long)]
    pub json: bool,
    /// Write the trace as OTLP/JSON (OpenTelemetry GenAI names)
    #[arg(long)]
    pub otlp: bool,
    /// With --otlp: include message and tool content
    #[arg(long)]
    pub include_content: bool,
    /// Write to this file instead of stdout
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

pub fn run(args: Args, root: &Path) -> Result<Outcome, CommandError> {
    let db = StateDb::open_for_reading(root)?;
    let store = db.store();
    let Some((row, trace)) = shared::trace::load_run(store, &args.run_id)? else {
        return Err(
            CommandError::usage(format!("no run `{}` in {}", args.run_id, store.path()))
                .hint("`runtime runs` lists local runs"),
        );
    };
    // A fire killed before its end stores none of its trace (recovery committed its
    // records, or a later fire resumed the run and stored only its own part); a
    // `runtime resume` of a pause keeps its calls in the paused run's ledger: the
    // ledger says which calls the trace does not list.
    let mut ledger = shared::journal::ledger_calls(store, &row.run_id)?;
    ledger.retain(|l| !trace.calls.iter().any(|c| c.call_id == l.call_id));
    let text = if args.otlp {
        serde_json::to_string_pretty(&shared::trace::to_otlp(&row, &trace, args.include_content))?
    } else if args.json {
        let mut shown = serde_json::json!({"run": row, "trace": trace});
        if !ledger.is_empty() {
            shown["ledger"] = serde_json::to_value(&ledger)?;
        }
        serde_json::to_string_pretty(&shown)?
    } else {
        render(&row, &trace, &run_cards(root, &row), &ledger)
    };
    match &args.output {
        Some(p) => std::fs::write(p, text + "\n").with_context(|| p.display().to_string())?,
        // On the terminal: the trace holds model text; escape what would drive it.
        None if args.json || args.otlp => println!("{}", shared::text::printable_json(&text)),
        None => println!("{}", shared::text::printable_multiline(&text)),
    }
    Ok(Outcome::Ok)
}

/// The cards the run's receipt names, with their kinds (`<id> (<kind>)`); none when
/// the run left no receipt in this work tree.
fn run_cards(root: &Path, row: &shared::runs::RunSummary) -> Vec<String> {
    let Some(receipt) = row
        .receipt_path
        .as_ref()
        .and_then(|p| std::fs::read(root.join(p)).ok())
        .and_then(|b| serde_json::from_slice::<shared::records::Receipt>(&b).ok())
    else {
        return Vec::new();
    };
    receipt
        .cards
        .iter()
        .map(|id| {
            let kind = shared::cards::work_tree_card_paths(root, id)
                .first()
                .and_then(|p| shared::records::read_card(&root.join(p)).ok())
                .map(|c| c.kind.as_str().to_string());
            match kind {
                Some(k) => format!("{id} ({k})"),
                None => id.clone(),
            }
        })
        .collect()
}

/// The run as text: every field a model could have chosen goes through
/// [`shared::text::printable`]; a failed span shows its error message.
fn render(
    row: &shared::runs::RunSummary,
    trace: &shared::trace::Trace,
    cards: &[String],
    ledger: &[shared::journal::LedgerCall],
) -> String {
    use shared::text::printable as p;
    let mut out = format!(
        "run {}  task {}  {} ({})  steps {}  tokens {}  cost ${:.4}  {} ms\n",
        p(&row.run_id),
        p(&row.task),
        row.status,
        row.stop_reason,
        row.steps,
        row.tokens,
        row.cost_usd,
        row.duration_ms
    );
    out.push_str(&format!(
        "cards: {}\n\nspans:\n",
        if cards.is_empty() {
            "none".to_string()
        } else {
            p(&cards.join(", ")).into_owned()
        }
    ));
    for s in &trace.spans {
        let tokens = if s.tokens_in + s.tokens_out > 0 {
            format!("  tokens {}+{}", s.tokens_in, s.tokens_out)
        } else {
            String::new()
        };
        let served = match s.attributes.get("agent.served_by").and_then(|v| v.as_str()) {
            Some(by) => format!("  served by {by}"),
            None => String::new(),
        };
        out.push_str(&format!(
            "  {:>9.2} ms  {:<10} {:<40} {}{}{}\n",
            s.duration_ms(),
            s.kind,
            p(&s.name),
            s.status,
            tokens,
            served
        ));
        if let Some(message) = s.attributes.get("error.message").and_then(|v| v.as_str()) {
            out.push_str(&format!("               error: {}\n", p(message)));
        }
    }
    out.push_str("\nsteps (context budget):\n");
    for (step, r) in &trace.steps {
        out.push_str(&format!(
            "  {step:>3}: used {}/{} tokens, {} messages, {} summarised, {} dropped{}\n",
            r.used,
            r.budget,
            r.included,
            r.summarised,
            r.dropped,
            if r.reasons.is_empty() {
                String::new()
            } else {
                format!(" ({})", p(&r.reasons.join("; ")))
            }
        ));
    }
    out.push_str("\ntool calls:\n");
    out.push_str(&call_lines(&trace.calls));
    out.push_str(&ledger_lines(ledger));
    out
}

/// The trace's tool calls, one line each.
fn call_lines(calls: &[shared::trace::TracedCall]) -> String {
    use shared::text::printable as p;
    let mut out = String::new();
    for c in calls {
        out.push_str(&format!(
            "  step {:>2} {:<10} {:<11} {:<6} {:<20} {}  {}\n",
            c.step,
            p(&c.call_id),
            p(&c.name),
            c.decision,
            c.outcome,
            p(&c.arguments.to_string()),
            p(&c.reason)
        ));
    }
    out
}

/// The calls of the run's tool ledger that its stored trace does not list (a fire
/// killed before its end stored none; a resume of a pause keeps its calls under the
/// paused run), without arguments or results.
fn ledger_lines(ledger: &[shared::journal::LedgerCall]) -> String {
    use shared::text::printable as p;
    if ledger.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "  (calls no stored trace lists, from the tool ledger: a fire killed before its end stores no trace, and a resume of a pause keeps its calls under the paused run)\n",
    );
    for c in ledger {
        out.push_str(&format!(
            "  {:<10} {:<11} {:<9} {}\n",
            p(&c.call_id),
            p(&c.name),
            c.stage,
            c.at
        ));
    }
    out
}
