//! `builder retro`: a markdown summary of what the runtime did since the last retro:
//! runs by status, top card fingerprints, cost and tokens per day (with an SVG chart),
//! denied calls, missing tools and the slowest steps. Reads the history index.

use crate::store::{Store, StoreError};
use crate::text::{markdown_cell, markdown_text};
use rusqlite::params;
use std::fmt::Write;

/// The markdown and the chart.
pub struct Retro {
    pub markdown: String,
    pub svg: String,
}

/// The window's runs per day and status, with their tokens and cost: whole days from
/// the index's rollup (`run_days`, kept by triggers), the first day, which the window
/// may start in the middle of, from its runs. Days are the receipt's own date
/// (`started_at`'s first ten characters), as the window compares `started_at` as text.
const WINDOW_DAYS: &str = "SELECT day, status, runs, tokens, cost_usd FROM run_days WHERE day > substr(?1, 1, 10)
    UNION ALL
    SELECT substr(started_at, 1, 10), status, count(*), sum(tokens_in + tokens_out), sum(cost_usd) FROM runs
    WHERE started_at >= ?1 AND started_at < date(substr(?1, 1, 10), '+1 day') GROUP BY 1, 2";

fn q<T>(
    store: &Store,
    sql: &str,
    since: &str,
    f: impl FnMut(&rusqlite::Row) -> rusqlite::Result<T>,
) -> Result<Vec<T>, StoreError> {
    store.query_all(sql, params![since], f)
}

/// Builds the retro for everything since `since`, as `history::parse_since` gives it
/// (RFC 3339 in UTC, or a bare date; receipts' times are UTC, and the window compares
/// them as text). `svg_name` is how the markdown refers to the chart file.
pub fn build(store: &Store, since: &str, until: &str, svg_name: &str) -> Result<Retro, StoreError> {
    let mut md = format!("# Retro: {since} to {until}\n\n");
    runs_by_status(store, since, &mut md)?;
    top_cards(store, since, &mut md)?;
    let days = days_table(store, since, svg_name, &mut md)?;
    denied_calls(store, since, &mut md)?;
    missing_tools(store, since, &mut md)?;
    slowest(store, since, &mut md)?;
    Ok(Retro {
        markdown: md,
        svg: chart(&days),
    })
}

/// The runs of the window by status, most first.
fn runs_by_status(store: &Store, since: &str, md: &mut String) -> Result<(), StoreError> {
    let by_status = q(
        store,
        &format!("SELECT status, sum(runs) FROM ({WINDOW_DAYS}) GROUP BY status HAVING sum(runs) > 0 ORDER BY sum(runs) DESC, status"),
        since,
        |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)),
    )?;
    let total: i64 = by_status.iter().map(|(_, n)| n).sum();
    let _ = writeln!(md, "## Runs by status\n\n{total} runs.\n\n| status | runs |\n|---|---|");
    for (s, n) in &by_status {
        let _ = writeln!(md, "| {s} | {n} |");
    }
    Ok(())
}

/// The ten card groups (by fingerprint) raised most in the window.
fn top_cards(store: &Store, since: &str, md: &mut String) -> Result<(), StoreError> {
    // Status is the group's newest card's, as `builder cards list` shows it: the index
    // holds what the card files say (work-tree triage overlaid, undone triage undone).
    let cards = q(
        store,
        "SELECT c.fingerprint, c.kind, c.task, count(*), max(c.summary),
                (SELECT l.status FROM cards l WHERE l.fingerprint = c.fingerprint AND l.created_at >= ?1 ORDER BY l.created_at DESC, l.id DESC LIMIT 1)
         FROM cards c WHERE c.created_at >= ?1 GROUP BY c.fingerprint ORDER BY count(*) DESC, max(c.created_at) DESC LIMIT 10",
        since,
        |r| {
            Ok(TopCard {
                fingerprint: r.get(0)?,
                kind: r.get(1)?,
                task: r.get(2)?,
                count: r.get(3)?,
                summary: r.get(4)?,
                status: r.get(5)?,
            })
        },
    )?;
    let _ = writeln!(
        md,
        "\n## Top cards\n\n| count | kind | task | status | summary | fingerprint |\n|---|---|---|---|---|---|"
    );
    for c in &cards {
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | `{}` |",
            c.count,
            c.kind,
            c.task,
            c.status,
            markdown_text(&c.summary),
            c.fingerprint
        );
    }
    Ok(())
}

/// Runs, tokens and cost per day, under the chart (`svg_name`); returns the days
/// for the chart.
fn days_table(
    store: &Store,
    since: &str,
    svg_name: &str,
    md: &mut String,
) -> Result<Vec<(String, i64, i64, f64)>, StoreError> {
    let days = q(
        store,
        &format!("SELECT day, sum(runs), sum(tokens), sum(cost_usd) FROM ({WINDOW_DAYS}) GROUP BY day HAVING sum(runs) > 0 ORDER BY day"),
        since,
        |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?, r.get::<_, f64>(3)?)),
    )?;
    let _ = writeln!(
        md,
        "\n## Cost and tokens per day\n\n![cost and tokens per day]({svg_name})\n"
    );
    if days.len() < MIN_CHART_POINTS {
        let _ = writeln!(md, "{}\n", too_little_data(days.len()));
    }
    let _ = writeln!(md, "| day | runs | tokens | cost |\n|---|---|---|---|");
    for (d, n, t, c) in &days {
        let _ = writeln!(md, "| {d} | {n} | {t} | ${c:.4} |");
    }
    Ok(days)
}

/// The ten denials most made in the window: tool, rule and reason.
fn denied_calls(store: &Store, since: &str, md: &mut String) -> Result<(), StoreError> {
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
        let _ = writeln!(
            md,
            "| {n} | {} | {} | {} |",
            markdown_cell(tool),
            markdown_cell(rule),
            markdown_text(reason)
        );
    }
    Ok(())
}

/// The tools the runs said they missed, most asked first.
fn missing_tools(store: &Store, since: &str, md: &mut String) -> Result<(), StoreError> {
    let missing = q(store, "SELECT summary, count(*) FROM cards WHERE created_at >= ?1 AND kind = 'missing_tool' GROUP BY summary ORDER BY count(*) DESC", since, |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
    let _ = writeln!(md, "\n## Missing tools\n");
    if missing.is_empty() {
        let _ = writeln!(md, "None.");
    }
    for (s, n) in &missing {
        let _ = writeln!(md, "- {} ({n}x)", markdown_text(s));
    }
    Ok(())
}

/// The slowest tool calls that ran (their measured time, from the receipts), and
/// the slowest runs split into time in tool calls and the rest: receipts do not time
/// model calls one by one, so the rest (model calls, prefetch, acceptance checks,
/// the commit) is the run's wall time less its tool calls.
fn slowest(store: &Store, since: &str, md: &mut String) -> Result<(), StoreError> {
    let calls = q(
        store,
        "SELECT c.run_id, c.name, c.duration_ms, c.outcome FROM tool_calls c JOIN runs r ON r.run_id = c.run_id
         -- `+`: walk the calls by duration (tool_calls_duration), not by decision.
         WHERE r.started_at >= ?1 AND +c.decision IN ('allow', 'ask') AND c.duration_ms > 0
         ORDER BY c.duration_ms DESC, c.run_id LIMIT 10",
        since,
        |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, String>(3)?,
            ))
        },
    )?;
    let _ = writeln!(
        md,
        "\n## Slowest steps\n\nTool calls that ran, by their measured time.\n"
    );
    if calls.is_empty() {
        let _ = writeln!(md, "No tool call that ran took 1 ms or more.");
    } else {
        let _ = writeln!(md, "| ms | tool | outcome | run |\n|---|---|---|---|");
        for (run, tool, ms, outcome) in &calls {
            let _ = writeln!(md, "| {ms} | {} | {outcome} | `{run}` |", markdown_cell(tool));
        }
    }
    let runs = q(
        store,
        // The ten slowest runs first, then the time in tool calls of those ten only
        // (summing every run's calls before picking cost a scan of all of them). `+`:
        // walk the runs by duration (runs_duration) and stop at ten, not every run of
        // the window by start and sort them (111 ms against 9 at 100,000 runs).
        "SELECT r.run_id, r.task, r.duration_ms,
                (SELECT coalesce(sum(c.duration_ms), 0) FROM tool_calls c WHERE c.run_id = r.run_id), r.steps
         FROM runs r WHERE +r.started_at >= ?1
         ORDER BY r.duration_ms DESC, r.run_id LIMIT 10",
        since,
        |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
            ))
        },
    )?;
    let _ = writeln!(
        md,
        "\nSlowest runs: wall time, the part in tool calls, and the rest (model calls, prefetch, acceptance checks, commit; receipts do not time model calls one by one).\n\n| ms | in tools | rest | steps | task | run |\n|---|---|---|---|---|---|"
    );
    for (run, task, ms, tools, steps) in &runs {
        let rest = (ms - tools).max(0);
        let _ = writeln!(md, "| {ms} | {tools} | {rest} | {steps} | {task} | `{run}` |");
    }
    Ok(())
}

/// One fingerprint group in the retro's top cards.
struct TopCard {
    fingerprint: String,
    kind: String,
    task: String,
    count: i64,
    summary: String,
    status: String,
}

/// Points (days with runs) a chart needs to show a trend.
const MIN_CHART_POINTS: usize = 2;

/// What the chart and the markdown say when the window has fewer days than that.
fn too_little_data(days: usize) -> String {
    format!("Too little data for a trend: {days} day(s) with runs in this window; the chart needs at least {MIN_CHART_POINTS}.")
}

/// Escapes text for SVG.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// Where the chart's plot sits in the picture, and the top of each axis.
struct Frame {
    w: f64,
    h: f64,
    left: f64,
    top: f64,
    plot_w: f64,
    plot_h: f64,
    max_cost: f64,
    max_tokens: f64,
}

/// The chart's axes: x along the bottom, cost on the left, tokens on the right, each
/// with its ticks and title.
fn chart_axes(s: &mut String, frame: &Frame) {
    let Frame {
        w,
        h,
        left,
        top,
        plot_w,
        plot_h,
        max_cost,
        max_tokens,
    } = *frame;
    let base = top + plot_h;
    let _ = writeln!(
        s,
        "<g stroke=\"black\"><line x1=\"{left}\" y1=\"{base}\" x2=\"{0}\" y2=\"{base}\"/><line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{base}\"/><line x1=\"{0}\" y1=\"{top}\" x2=\"{0}\" y2=\"{base}\"/></g>",
        left + plot_w
    );
    for i in 0..=4 {
        let f = i as f64 / 4.0;
        let y = base - f * plot_h;
        let _ = writeln!(
            s,
            "<line x1=\"{0}\" y1=\"{y:.1}\" x2=\"{left}\" y2=\"{y:.1}\" stroke=\"black\"/><text x=\"{1}\" y=\"{2:.1}\" text-anchor=\"end\">${3:.4}</text>",
            left - 4.0,
            left - 6.0,
            y + 4.0,
            max_cost * f
        );
        let _ = writeln!(
            s,
            "<line x1=\"{0}\" y1=\"{y:.1}\" x2=\"{1}\" y2=\"{y:.1}\" stroke=\"black\"/><text x=\"{2}\" y=\"{3:.1}\">{4:.0}</text>",
            left + plot_w,
            left + plot_w + 4.0,
            left + plot_w + 6.0,
            y + 4.0,
            max_tokens * f
        );
    }
    let _ = writeln!(
        s,
        "<text transform=\"translate(16 {0:.1}) rotate(-90)\" text-anchor=\"middle\">cost (USD)</text>\n<text transform=\"translate({1:.1} {0:.1}) rotate(90)\" text-anchor=\"middle\">tokens</text>\n<text x=\"{2:.1}\" y=\"{3:.1}\" text-anchor=\"middle\">day (UTC)</text>",
        top + plot_h / 2.0,
        w - 16.0,
        left + plot_w / 2.0,
        h - 12.0
    );
}

/// Bars for cost (left axis), a line for tokens (right axis), one slot per day, with
/// axis titles, tick values and each day's values written on the chart.
fn chart(days: &[(String, i64, i64, f64)]) -> String {
    let (w, h) = (760.0f64, 320.0f64);
    let (left, right, top, bottom) = (80.0f64, 80.0f64, 50.0f64, 60.0f64);
    let plot_w = w - left - right;
    let plot_h = h - top - bottom;
    let base = top + plot_h;
    let n = days.len().max(1) as f64;
    let slot = plot_w / n;
    let max_cost = days.iter().map(|d| d.3).fold(0.0f64, f64::max);
    let max_cost = if max_cost > 0.0 { max_cost } else { 1.0 };
    let max_tokens = days.iter().map(|d| d.2).max().unwrap_or(0).max(1) as f64;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{}\" y=\"22\" text-anchor=\"middle\" font-size=\"13\">Cost (bars, left axis) and tokens (line, right axis) per day</text>\n",
        w / 2.0
    );
    chart_axes(
        &mut s,
        &Frame {
            w,
            h,
            left,
            top,
            plot_w,
            plot_h,
            max_cost,
            max_tokens,
        },
    );
    let mut points = Vec::new();
    for (i, (day, runs, tokens, cost)) in days.iter().enumerate() {
        let x = left + i as f64 * slot;
        let mid = x + slot / 2.0;
        let bh = (cost / max_cost) * plot_h;
        let _ = writeln!(s, "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\" fill=\"#4a90d9\"><title>{}: ${cost:.4}, {tokens} tokens, {runs} runs</title></rect>", x + slot * 0.15, base - bh, slot * 0.7, esc(day));
        let ty = base - (*tokens as f64 / max_tokens) * plot_h;
        points.push(format!("{mid:.1},{ty:.1}"));
        if days.len() <= 31 {
            let _ = writeln!(
                s,
                "<text x=\"{mid:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                base + 16.0,
                esc(day.get(5..).unwrap_or(day))
            );
            let _ = writeln!(
                s,
                "<text x=\"{mid:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#2a5d99\">${cost:.4}</text>\n<circle cx=\"{mid:.1}\" cy=\"{ty:.1}\" r=\"3\" fill=\"#d9534f\"/><text x=\"{mid:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#d9534f\">{tokens} tokens</text>",
                (base - bh - 4.0).max(top + 10.0),
                (ty - 8.0).max(top + 22.0)
            );
        }
    }
    if points.len() >= 2 {
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"#d9534f\" stroke-width=\"2\" points=\"{}\"/>",
            points.join(" ")
        );
    }
    if days.len() < MIN_CHART_POINTS {
        let _ = writeln!(
            s,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"13\" fill=\"#a94442\">{}</text>",
            left + plot_w / 2.0,
            top + plot_h / 2.0,
            esc(&too_little_data(days.len()))
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::BUILDER_SCHEMA;
    use crate::store::Schema;

    /// The window's rows straight from `runs` (what the retro summed before the
    /// rollup), to hold `WINDOW_DAYS` against: (day, status, runs, tokens, cost in
    /// micro-dollars).
    fn direct(store: &Store, since: &str) -> Vec<(String, String, i64, i64, i64)> {
        q(
            store,
            "SELECT substr(started_at, 1, 10), status, count(*), sum(tokens_in + tokens_out), round(sum(cost_usd) * 1e6)
             FROM runs WHERE started_at >= ?1 GROUP BY 1, 2 ORDER BY 1, 2",
            since,
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get::<_, f64>(4)? as i64)),
        )
        .unwrap()
    }

    fn rolled_up(store: &Store, since: &str) -> Vec<(String, String, i64, i64, i64)> {
        q(
            store,
            &format!(
                "SELECT day, status, sum(runs), sum(tokens), round(sum(cost_usd) * 1e6) FROM ({WINDOW_DAYS})
                 GROUP BY 1, 2 HAVING sum(runs) > 0 ORDER BY 1, 2"
            ),
            since,
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get::<_, f64>(4)? as i64)),
        )
        .unwrap()
    }

    fn put(store: &mut Store, id: u64, day: u64, hour: u64, status: &str, tokens: i64, cost: f64) {
        store
            .write(|tx| {
                tx.execute(
                    "INSERT OR REPLACE INTO runs (run_id, task, status, stop_reason, started_at, tokens_in, tokens_out, cost_usd)
                     VALUES (?1, 't', ?2, 'done', ?3, ?4, 1, ?5)",
                    params![
                        format!("r{id}"),
                        status,
                        format!("2026-03-{:02}T{hour:02}:00:00+00:00", day + 1),
                        tokens,
                        cost
                    ],
                )
            })
            .unwrap();
    }

    /// Model text in cards and calls (an unknown tool's name in a `missing_tool`
    /// card, a denied tool's name and reason) is inert in the retro's markdown
    /// (helper-104: a backtick closed the span, and an image, a link and a mention
    /// were live).
    #[test]
    fn model_text_in_cards_and_calls_is_inert_in_the_retro() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = Store::open(&dir.path().join("builder.db"), BUILDER_SCHEMA).unwrap();
        let hostile =
            "`x` <img src=https://evil.example/p.png> [Click](https://evil.example/login) @octocat #1 `y` | z";
        store
            .write(|tx| {
                for (id, kind) in [("c1", "missing_tool"), ("c2", "permission_denied")] {
                    tx.execute(
                        "INSERT INTO cards (id, fingerprint, kind, task, run_id, created_at, status, summary, path) VALUES (?1, ?1, ?2, 't', 'r1', '2026-03-04T00:00:00+00:00', 'open', ?3, 'cards/x.yaml')",
                        params![id, kind, hostile],
                    )?;
                }
                Ok(())
            })
            .unwrap();
        let md = build(&store, "2026-03-01", "2026-03-05", "chart.svg").unwrap().markdown;
        for live in [" <img", "](https", "@octocat", " #1", "`x` <"] {
            assert!(!md.contains(live), "{live} is live: {md}");
        }
        assert!(md.contains("evil"), "the text is there, inert: {md}");
    }

    #[test]
    fn the_rollup_sums_what_the_runs_hold_through_inserts_replacements_updates_and_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("builder.db");
        // Runs indexed before the rollup existed are counted by the migration.
        let before = Schema {
            migrations: BUILDER_SCHEMA.migrations.split_at(7).0,
        };
        let mut old = Store::open(&path, before).unwrap();
        put(&mut old, 1_000, 3, 5, "ok", 10, 0.25);
        put(&mut old, 1_001, 3, 6, "failed", 7, 0.5);
        drop(old);
        let mut store = Store::open(&path, BUILDER_SCHEMA).unwrap();
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let statuses = ["ok", "failed", "needs_attention"];
        let sinces = [
            "2026-01-01T00:00:00+00:00",
            "2026-03-04T00:00:00+00:00",
            "2026-03-04T12:00:00+00:00",
            // A bare date, as `history::parse_since` keeps `--since 2026-03-04`.
            "2026-03-04",
            "2026-03-05T23:00:00+00:00",
            "2026-04-01T00:00:00+00:00",
        ];
        for step in 0..400 {
            let id = next(60);
            match next(10) {
                // A receipt indexed again (a replacement, maybe of another day or status).
                0..=6 => {
                    let status = statuses[next(3) as usize];
                    put(
                        &mut store,
                        id,
                        next(6),
                        next(24),
                        status,
                        next(1000) as i64,
                        next(100) as f64 / 8.0,
                    );
                }
                7 => {
                    store
                        .write(|tx| tx.execute("UPDATE runs SET status = 'ok', started_at = '2026-03-02T01:00:00+00:00' WHERE run_id = ?1", [format!("r{id}")]))
                        .unwrap();
                }
                _ => {
                    store
                        .write(|tx| tx.execute("DELETE FROM runs WHERE run_id = ?1", [format!("r{id}")]))
                        .unwrap();
                }
            }
            for since in sinces {
                assert_eq!(
                    rolled_up(&store, since),
                    direct(&store, since),
                    "step {step}, since {since}"
                );
            }
        }
        assert!(
            !direct(&store, sinces[0]).is_empty(),
            "the history ends with runs in it"
        );
    }
}
