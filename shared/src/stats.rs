//! Small statistics for `builder history compare`: Fisher's exact test on two
//! success/failure counts, so a drop in a task's success rate is called a regression
//! only when chance alone would rarely produce it. Exact hypergeometric sums over
//! log-factorials in f64 (counts here are runs of one task: thousands at most), no
//! dependency.

/// `ln(k!)` for `k` in `0..=n`.
fn ln_factorials(n: u64) -> Vec<f64> {
    let mut out = Vec::with_capacity(n as usize + 1);
    let mut acc = 0.0f64;
    out.push(0.0);
    for k in 1..=n {
        acc += (k as f64).ln();
        out.push(acc);
    }
    out
}

/// One-sided Fisher's exact test that the "after" success rate is lower than the
/// "before" one: the probability, with the margins of the 2x2 table fixed, of
/// seeing at most `after_ok` successes after (a table at least as extreme as the one
/// observed, in the direction of a drop). `None` when either side has no runs.
pub fn fisher_drop_p(before_ok: u64, before_n: u64, after_ok: u64, after_n: u64) -> Option<f64> {
    if before_n == 0 || after_n == 0 || before_ok > before_n || after_ok > after_n {
        return None;
    }
    let n = before_n + after_n;
    let successes = before_ok + after_ok;
    let lf = ln_factorials(n);
    let ln_choose = |a: u64, b: u64| lf[a as usize] - lf[b as usize] - lf[(a - b) as usize];
    // P(X = x) for X the successes after: C(after_n, x) C(before_n, successes - x) / C(n, successes).
    let total = ln_choose(n, successes);
    let lo = successes.saturating_sub(before_n);
    let p: f64 = (lo..=after_ok)
        .map(|x| (ln_choose(after_n, x) + ln_choose(before_n, successes - x) - total).exp())
        .sum();
    Some(p.min(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn all_before_none_after_is_one_table_out_of_many() {
        // 10/10 then 0/10: only the observed table, 1 / C(20, 10).
        let p = fisher_drop_p(10, 10, 0, 10).unwrap();
        assert!(close(p, 1.0 / 184_756.0), "{p}");
        // 5/5 then 0/5: 1 / C(10, 5).
        assert!(close(fisher_drop_p(5, 5, 0, 5).unwrap(), 1.0 / 252.0));
    }

    #[test]
    fn a_small_drop_is_not_significant() {
        // 5/6 then 4/6: P(X <= 4) with 9 successes over 12, 6 after.
        // P(X=3) = C(6,3)C(6,6)/C(12,9) = 20/220, P(X=4) = C(6,4)C(6,5)/220 = 90/220.
        let p = fisher_drop_p(5, 6, 4, 6).unwrap();
        assert!(close(p, 110.0 / 220.0), "{p}");
        assert!(p > 0.05);
    }

    #[test]
    fn no_drop_or_a_rise_gives_large_p() {
        assert!(fisher_drop_p(3, 6, 3, 6).unwrap() > 0.5);
        assert!(close(fisher_drop_p(0, 6, 6, 6).unwrap(), 1.0));
        assert_eq!(fisher_drop_p(1, 0, 1, 3), None);
    }

    #[test]
    fn matches_a_known_value() {
        // The lady tasting tea: 3 of 4 right; one-sided p = 17/70.
        // As a drop: before 3/4 vs after 1/4 (8 runs, 4 successes).
        let p = fisher_drop_p(3, 4, 1, 4).unwrap();
        assert!(close(p, 17.0 / 70.0), "{p}");
    }
}
