//! The eval's output forms, as text for the binary to print: a side-by-side table
//! (one row per case per revision, then the totals and every failing assertion), a
//! markdown table for a pull-request comment, and JUnit XML for CI.

use super::{EvalReport, Row, Totals};
use std::fmt::Write as _;

fn rate(passed: u32, runs: u32) -> String {
    format!("{passed}/{runs}")
}

fn total_line(label: &str, t: &Totals) -> String {
    format!(
        "{label:<5} {}/{} cases pass ({:.0}%), {} steps, {} tool calls, {} tokens, {:.4} USD, {} denials, {} ms",
        t.passed,
        t.cases,
        t.pass_rate * 100.0,
        t.steps,
        t.tool_calls,
        t.tokens,
        t.cost_usd,
        t.denials,
        t.duration_ms
    )
}

/// The table printed by `builder eval` (and `builder review`'s text form); every
/// field a proposer or a model chose goes through [`crate::text::printable`].
pub fn text(r: &EvalReport) -> String {
    use crate::text::printable as p;
    let mut o = String::new();
    let width = r.rows.iter().map(|x| x.case.len()).max().unwrap_or(4).max(4);
    if let Some(b) = &r.base {
        let _ = writeln!(o, "base: {} ({})", p(&b.rev), crate::text::short_id(&b.commit));
    }
    let _ = writeln!(
        o,
        "head: {} ({})",
        p(&r.head.rev),
        crate::text::short_id(&r.head.commit)
    );
    let _ = writeln!(o, "trusted: {} (every fire runs under its powers)", p(&r.trusted));
    for rev in &r.powers {
        for c in &rev.changes {
            let _ = writeln!(o, "power {}: {}", rev.revision, p(&c.to_string()));
        }
        if let Some(why) = &rev.refused {
            let _ = writeln!(o, "REFUSED {}: {}", rev.revision, p(why));
        }
    }
    let _ = writeln!(
        o,
        "{:<width$}  {:<4}  {:>5}  {:>5}  {:>5}  {:>7}  {:>8}  {:>7}  {:>8}  result",
        "case", "rev", "pass", "steps", "calls", "tokens", "cost", "denials", "ms"
    );
    for x in &r.rows {
        let _ = writeln!(
            o,
            "{:<width$}  {:<4}  {:>5}  {:>5}  {:>5}  {:>7}  {:>8.4}  {:>7}  {:>8}  {}",
            p(&x.case),
            x.revision,
            rate(x.run.passed, x.run.runs),
            x.run.steps,
            x.run.tool_calls,
            x.run.tokens,
            x.run.cost_usd,
            x.run.denials,
            x.run.duration_ms,
            p(&result(x))
        );
    }
    if let Some(b) = &r.summary.base {
        let _ = writeln!(o, "{}", total_line("base", b));
    }
    let _ = writeln!(o, "{}", total_line("head", &r.summary.head));
    for problem in &r.summary.problems {
        let _ = writeln!(o, "problem: {}", p(&problem.to_string()));
    }
    for f in &r.summary.failures {
        let _ = writeln!(
            o,
            "FAIL {} ({}): {}{}: {}",
            p(&f.case),
            p(&f.file),
            p(&f.assertion),
            if f.regression { " [regression]" } else { "" },
            p(&f.detail)
        );
    }
    o
}

fn result(x: &Row) -> String {
    if !x.failed && x.run.failures.is_empty() {
        "ok".into()
    } else {
        let broken: Vec<&str> = x.run.failures.iter().map(|f| f.assertion.as_str()).collect();
        format!("{}: {}", if x.failed { "FAIL" } else { "flaky" }, broken.join("; "))
    }
}

/// A markdown table, for `builder review --format github`.
pub fn markdown(r: &EvalReport) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "| case | rev | pass | steps | tool calls | tokens | cost (USD) | denials | ms | result |"
    );
    let _ = writeln!(
        o,
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
    );
    for x in &r.rows {
        let _ = writeln!(
            o,
            "| {} | {} | {} | {} | {} | {} | {:.4} | {} | {} | {} |",
            crate::text::markdown_cell(&x.case),
            x.revision,
            rate(x.run.passed, x.run.runs),
            x.run.steps,
            x.run.tool_calls,
            x.run.tokens,
            x.run.cost_usd,
            x.run.denials,
            x.run.duration_ms,
            crate::text::markdown_text(&result(x))
        );
    }
    o
}

fn xml(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' && c != '\r' => {}
            c => o.push(c),
        }
    }
    o
}

/// JUnit XML: one test suite per revision, one test case per case.
pub fn junit(r: &EvalReport) -> String {
    let mut o = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"builder eval\">\n");
    for rev in ["base", "head"] {
        let rows: Vec<&Row> = r.rows.iter().filter(|x| x.revision == rev).collect();
        if rows.is_empty() {
            continue;
        }
        let name = match rev {
            "base" => r.base.as_ref().map_or("base", |b| b.rev.as_str()),
            _ => r.head.rev.as_str(),
        };
        let failures = rows.iter().filter(|x| x.failed).count();
        let secs: f64 = rows.iter().map(|x| x.run.duration_ms as f64 / 1e3).sum();
        let _ = writeln!(
            o,
            "  <testsuite name=\"{rev}: {}\" tests=\"{}\" failures=\"{failures}\" time=\"{secs:.3}\">",
            xml(name),
            rows.len()
        );
        for x in rows {
            let _ = write!(
                o,
                "    <testcase classname=\"{}\" name=\"{}\" time=\"{:.3}\"",
                xml(&x.task),
                xml(&x.case),
                x.run.duration_ms as f64 / 1e3
            );
            if x.failed {
                let _ = writeln!(o, ">");
                for f in &x.run.failures {
                    let _ = writeln!(
                        o,
                        "      <failure message=\"{}\">{}</failure>",
                        xml(&f.assertion),
                        xml(&f.detail)
                    );
                }
                if x.run.failures.is_empty() {
                    let _ = writeln!(
                        o,
                        "      <failure message=\"min_pass: {}\">passed {} of {} runs</failure>",
                        x.min_pass, x.run.passed, x.run.runs
                    );
                }
                let _ = writeln!(o, "    </testcase>");
            } else {
                let _ = writeln!(o, "/>");
            }
        }
        let _ = writeln!(o, "  </testsuite>");
    }
    o.push_str("</testsuites>\n");
    o
}
