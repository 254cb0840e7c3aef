//! Checks on values that parse but make no sense, with the field each one is about.
//!
//! A problem names candidate fields, best first: for a cross-field check on a rule (its
//! `hot_at_per_sec` below the `cool_below_per_sec` it inherits), the locator points at
//! whichever of them the file actually spells out, so the SRE lands on the line to edit.

use super::model::{Balance, Detection, ReadPolicy, Shards, WritePolicy};
use super::problem::{problem, range, Problem};
use crate::glob::Glob;

/// Most rules in one file: `resolve` tries them in order on each lookup.
pub const MAX_RULES: usize = 1024;

pub fn version(v: u32) -> Result<(), Problem> {
    if v != 1 {
        return Err(problem(
            "",
            &["version"],
            format!("version {v} is not supported; this proxy reads version 1"),
        ));
    }
    Ok(())
}

pub fn detection(d: &Detection, epoch_ms: u64) -> Result<(), Problem> {
    range("detection", "window_ms", d.window_ms, 10, 60_000, " ms")?;
    range(
        "detection",
        "top_k",
        d.top_k,
        1,
        crate::hotkey::MAX_TOP_K,
        " keys",
    )?;
    if epoch_ms < d.window_ms {
        return Err(problem(
            "",
            &["epoch_ms", "detection.window_ms"],
            format!(
                "epoch_ms ({epoch_ms}) must be at least detection.window_ms ({}): a key must be measured before it moves",
                d.window_ms
            ),
        ));
    }
    range("", "epoch_ms", epoch_ms, d.window_ms, 3_600_000, " ms")
}

pub fn balance(b: &Balance) -> Result<(), Problem> {
    let pct = b.over_mean_pct;
    if !(pct.is_finite() && (0.5..=100.0).contains(&pct)) {
        return Err(problem(
            "balance",
            &["over_mean_pct"],
            format!("{pct} is out of range: must be 0.5..=100 percent (node loads are never exactly even)"),
        ));
    }
    let min = b.min_reads_per_sec;
    if !min.is_finite() || min <= 0.0 {
        return Err(problem(
            "balance",
            &["min_reads_per_sec"],
            format!("{min} must be a positive rate per second"),
        ));
    }
    Ok(())
}

/// Rates: positive, finite, and with room between cooling and heating (hysteresis).
/// `names`: the hot field and the cool field.
fn thresholds(base: &str, names: [&str; 2], hot: f64, cool: f64) -> Result<(), Problem> {
    let [hot_name, cool_name] = names;
    if !hot.is_finite() || hot <= 0.0 {
        return Err(problem(
            base,
            &[hot_name],
            format!("{hot} must be a positive rate per second"),
        ));
    }
    if !cool.is_finite() || cool < 0.0 {
        return Err(problem(
            base,
            &[cool_name],
            format!("{cool} must be a rate per second >= 0"),
        ));
    }
    if cool >= hot {
        return Err(problem(
            base,
            &[cool_name, hot_name],
            format!("{cool_name} ({cool}) must be below {hot_name} ({hot}), or keys flap between hot and cool"),
        ));
    }
    Ok(())
}

const PER_SEC: [&str; 2] = ["hot_at_per_sec", "cool_below_per_sec"];

/// `base` is where this policy lives: `defaults.read` or `rules[3].read`.
pub fn read(base: &str, r: &ReadPolicy) -> Result<(), Problem> {
    thresholds(base, PER_SEC, r.hot_at_per_sec, r.cool_below_per_sec)?;
    thresholds(
        base,
        ["hot_at_bytes_per_sec", "cool_below_bytes_per_sec"],
        r.hot_at_bytes_per_sec,
        r.cool_below_bytes_per_sec,
    )?;
    thresholds(
        base,
        ["hot_at_node_ms_per_sec", "cool_below_node_ms_per_sec"],
        r.hot_at_node_ms_per_sec,
        r.cool_below_node_ms_per_sec,
    )?;
    let c = format!("{base}.cache");
    range(&c, "ttl_ms", r.cache.ttl_ms, 1, 86_400_000, " ms")?;
    range(&c, "jitter_pct", r.cache.jitter_pct, 0, 100, " percent")?;
    range(
        &c,
        "stale_while_revalidate_ms",
        r.cache.stale_while_revalidate_ms,
        0,
        86_400_000,
        " ms",
    )?;
    let t = format!("{base}.salted");
    range(&t, "refresh_ms", r.salted.refresh_ms, 10, 3_600_000, " ms")
}

pub fn write(base: &str, w: &WritePolicy) -> Result<(), Problem> {
    thresholds(base, PER_SEC, w.hot_at_per_sec, w.cool_below_per_sec)?;
    range(
        &format!("{base}.combine"),
        "window_us",
        w.combine.window_us,
        1,
        1_000_000,
        " us",
    )?;
    let i = format!("{base}.idempotency");
    range(
        &i,
        "window_ms",
        w.idempotency.window_ms,
        1000,
        7 * 86_400_000,
        " ms",
    )?;
    range(&i, "max_ids", w.idempotency.max_ids, 1, 100_000_000, " IDs")?;
    let s = format!("{base}.salt");
    range(&s, "max_shards", w.salt.max_shards, 1, 1024, " shards")?;
    if let Shards::Fixed(n) = w.salt.shards {
        if n < 1 || n > w.salt.max_shards {
            return Err(problem(
                &s,
                &["shards", "max_shards"],
                format!(
                    "shards ({n}) must be between 1 and max_shards ({})",
                    w.salt.max_shards
                ),
            ));
        }
    }
    let per = w.salt.per_shard_per_sec;
    if !per.is_finite() || per <= 0.0 {
        return Err(problem(
            &s,
            &["per_shard_per_sec"],
            format!("{per} must be a positive rate per second"),
        ));
    }
    let bad = super::model::Families(w.salt.families.0 & !super::model::SALTABLE);
    if bad.0 != 0 {
        return Err(problem(
            &s,
            &["families"],
            format!(
                "{} cannot be salted: only counters, hashes of counters, sets, hyperloglogs and sorted sets have an exact merge",
                bad.names().join(", ")
            ),
        ));
    }
    Ok(())
}

/// Patterns: valid, and every rule reachable under first-match-wins.
pub fn patterns(patterns: &[&str]) -> Result<Vec<Glob>, Problem> {
    if patterns.len() > MAX_RULES {
        return Err(problem(
            "",
            &["rules"],
            format!("{} rules; at most {MAX_RULES}", patterns.len()),
        ));
    }
    let mut out = Vec::with_capacity(patterns.len());
    for (i, p) in patterns.iter().enumerate() {
        let at = format!("rules[{i}]");
        let g = Glob::new(p).map_err(|e| problem(&at, &["match"], format!("{p:?}: {e}")))?;
        if let Some(j) = patterns[..i].iter().position(|q| q == p || *q == "*") {
            let why = if patterns[j] == *p {
                "has the same pattern"
            } else {
                "matches every key"
            };
            return Err(problem(
                &at,
                &["match"],
                format!("{p:?} can never match: rules[{j}] {why} and the first match wins"),
            ));
        }
        out.push(g);
    }
    Ok(out)
}
