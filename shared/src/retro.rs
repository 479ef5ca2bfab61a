//! `builder retro`: a markdown summary of what the runtime did since the last retro:
//! runs by status, top card fingerprints, cost and tokens per day (with an SVG chart),
//! denied calls, missing tools and the slowest steps. Reads the history index.

use crate::store::{Store, StoreError};
use rusqlite::params;
use std::fmt::Write;

/// The markdown and the chart.
pub struct Retro {
    pub markdown: String,
    pub svg: String,
}

fn q<T>(
    store: &Store,
    sql: &str,
    since: &str,
    f: impl FnMut(&rusqlite::Row) -> rusqlite::Result<T>,
) -> Result<Vec<T>, StoreError> {
    store.query_all(sql, params![since], f)
}

/// Builds the retro for everything since `since` (RFC 3339). `svg_name` is how the
/// markdown refers to the chart file.
pub fn build(store: &Store, since: &str, until: &str, svg_name: &str) -> Result<Retro, StoreError> {
    let mut md = format!("# Retro: {since} to {until}\n\n");
    let by_status = q(
        store,
        "SELECT status, count(*) FROM runs WHERE started_at >= ?1 GROUP BY status ORDER BY count(*) DESC",
        since,
        |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
    )?;
    let total: i64 = by_status.iter().map(|(_, n)| n).sum();
    let _ = writeln!(md, "## Runs by status\n\n{total} runs.\n\n| status | runs |\n|---|---|");
    for (s, n) in &by_status {
        let _ = writeln!(md, "| {s} | {n} |");
    }
    let cards = q(
        store,
        "SELECT fingerprint, kind, task, count(*), max(summary) FROM cards WHERE created_at >= ?1 GROUP BY fingerprint ORDER BY count(*) DESC, max(created_at) DESC LIMIT 10",
        since,
        |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, i64>(3)?, r.get::<_, String>(4)?)),
    )?;
    let _ = writeln!(
        md,
        "\n## Top cards\n\n| count | kind | task | summary | fingerprint |\n|---|---|---|---|---|"
    );
    for (fp, kind, task, n, summary) in &cards {
        let _ = writeln!(
            md,
            "| {n} | {kind} | {task} | {} | `{fp}` |",
            summary.replace('|', "\\|")
        );
    }
    let days = q(
        store,
        "SELECT substr(started_at, 1, 10) AS day, count(*), sum(tokens_in + tokens_out), sum(cost_usd) FROM runs WHERE started_at >= ?1 GROUP BY day ORDER BY day",
        since,
        |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?, r.get::<_, f64>(3)?)),
    )?;
    let _ = writeln!(md, "\n## Cost and tokens per day\n\n![cost and tokens per day]({svg_name})\n\n| day | runs | tokens | cost |\n|---|---|---|---|");
    for (d, n, t, c) in &days {
        let _ = writeln!(md, "| {d} | {n} | {t} | ${c:.4} |");
    }
    let denied = q(
        store,
        "SELECT c.name, coalesce(c.rule, '(built-in)'), c.reason, count(*) FROM tool_calls c JOIN runs r ON r.run_id = c.run_id WHERE r.started_at >= ?1 AND c.decision = 'deny' GROUP BY c.name, c.rule, c.reason ORDER BY count(*) DESC LIMIT 10",
        since,
        |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, String>(2)?, r.get::<_, i64>(3)?)),
    )?;
    let _ = writeln!(
        md,
        "\n## Denied calls\n\n| count | tool | rule | reason |\n|---|---|---|---|"
    );
    for (tool, rule, reason, n) in &denied {
        let _ = writeln!(md, "| {n} | {tool} | `{rule}` | {} |", reason.replace('|', "\\|"));
    }
    let missing = q(store, "SELECT summary, count(*) FROM cards WHERE created_at >= ?1 AND kind = 'missing_tool' GROUP BY summary ORDER BY count(*) DESC", since, |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
    let _ = writeln!(md, "\n## Missing tools\n");
    if missing.is_empty() {
        let _ = writeln!(md, "None.");
    }
    for (s, n) in &missing {
        let _ = writeln!(md, "- {s} ({n}x)");
    }
    let slow = q(
        store,
        "SELECT c.run_id, c.name, c.duration_ms, c.outcome FROM tool_calls c JOIN runs r ON r.run_id = c.run_id WHERE r.started_at >= ?1 ORDER BY c.duration_ms DESC LIMIT 10",
        since,
        |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, i64>(2)?, r.get::<_, String>(3)?)),
    )?;
    let _ = writeln!(
        md,
        "\n## Slowest steps\n\n| ms | tool | outcome | run |\n|---|---|---|---|"
    );
    for (run, tool, ms, outcome) in &slow {
        let _ = writeln!(md, "| {ms} | {tool} | {outcome} | `{run}` |");
    }
    Ok(Retro {
        markdown: md,
        svg: chart(&days),
    })
}

/// Bars for cost, a line for tokens, one slot per day.
fn chart(days: &[(String, i64, i64, f64)]) -> String {
    let (w, h, pad) = (720.0f64, 260.0f64, 40.0f64);
    let n = days.len().max(1) as f64;
    let slot = (w - 2.0 * pad) / n;
    let max_cost = days.iter().map(|d| d.3).fold(0.0f64, f64::max).max(1e-9);
    let max_tokens = days.iter().map(|d| d.2).max().unwrap_or(0).max(1) as f64;
    let mut s = format!("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{pad}\" y=\"20\">cost per day (bars, max ${max_cost:.4}) and tokens (line, max {max_tokens})</text>\n");
    let mut points = Vec::new();
    for (i, (day, _, tokens, cost)) in days.iter().enumerate() {
        let x = pad + i as f64 * slot;
        let bh = (cost / max_cost) * (h - 2.0 * pad);
        let _ = writeln!(s, "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" fill=\"#4a90d9\"><title>{day}: ${cost:.4}</title></rect>", x + slot * 0.15, h - pad - bh, slot * 0.7);
        points.push(format!(
            "{:.1},{:.1}",
            x + slot / 2.0,
            h - pad - (*tokens as f64 / max_tokens) * (h - 2.0 * pad)
        ));
        if days.len() <= 31 {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                x + slot / 2.0,
                h - pad + 14.0,
                &day[5..]
            );
        }
    }
    if !points.is_empty() {
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"#d9534f\" stroke-width=\"2\" points=\"{}\"/>",
            points.join(" ")
        );
    }
    let _ = writeln!(
        s,
        "<line x1=\"{pad}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"black\"/>\n</svg>",
        h - pad,
        w - pad
    );
    s
}
