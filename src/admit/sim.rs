//! The fleet simulator (`saltshaker simulate`): the proxy's own admission and salting code
//! (`Bucket`, `share::allocate`, `salt::names::choose_salts`) driven by simulated edges,
//! clients and backend partitions in virtual time, for figures no single machine can make.
//!
//! - `fleet`: edges sharing one global limit, with a skewed load that moves, and an edge
//!   that restarts; admitted per minute against the limit.
//! - `final_vote`: one key voted on far faster than one partition takes writes, with no
//!   mitigation, salted over N shards on distinct partitions, and salted and combined.

use super::bucket::Bucket;
use super::share::{allocate_expecting, smooth};
use super::{scaled_burst, start_tokens};
use crate::salt::names::{choose_salts, shard_name, Place};

/// Virtual time step of the fleet simulation: 1 ms.
const TICK_US: u64 = 1000;

/// The fleet scenario.
#[derive(Clone, Debug)]
pub struct Fleet {
    pub edges: usize,
    /// Fleet-wide limit, per second (60,000/min = 1000/s).
    pub limit_per_sec: f64,
    pub burst: f64,
    pub sync_ms: u64,
    pub start_share_pct: f64,
    /// The rule's `proxies`: an edge new to the limit starts at `limit / proxies`.
    pub proxies: Option<usize>,
    /// Offered per quiet edge per second; the busy edge is offered `skew` times that.
    pub quiet_per_sec: f64,
    pub skew: f64,
    pub minutes: u64,
    /// At this minute the busy edge's load moves to edge `edges / 2`.
    pub move_at_min: u64,
    /// At this minute the last edge restarts (its share and bucket start over).
    pub restart_at_min: u64,
}

impl Default for Fleet {
    fn default() -> Self {
        Fleet {
            edges: 60,
            limit_per_sec: 1000.0,
            burst: 100.0,
            sync_ms: 5000,
            start_share_pct: 5.0,
            proxies: Some(60),
            quiet_per_sec: 29.0,
            skew: 10.0,
            minutes: 10,
            move_at_min: 4,
            restart_at_min: 7,
        }
    }
}

#[derive(Clone, Debug)]
pub struct FleetReport {
    /// Admitted in each minute, fleet-wide.
    pub per_minute: Vec<u64>,
    pub offered_per_minute: Vec<u64>,
    /// The largest share by which one sync interval's admissions passed the limit of that
    /// interval (0.02 = 2% over), with the interval's start in seconds.
    pub worst_overshoot: (f64, f64),
}

struct Edge {
    bucket: Bucket,
    share: f64,
    offered: u64,
    /// Since when `offered` counts (start, or the last sync).
    since: u64,
    /// The demand it reported last.
    demand: Option<f64>,
}

/// A uniform draw in [0, 1) from a xorshift generator (the simulation is repeatable).
fn uniform(x: &mut u64) -> f64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    (*x >> 11) as f64 / (1u64 << 53) as f64
}

pub fn fleet(f: &Fleet) -> FleetReport {
    let start_share = match f.proxies {
        Some(n) => f.limit_per_sec / n as f64,
        None => f.limit_per_sec * f.start_share_pct / 100.0,
    };
    let fresh = |now: u64| Edge {
        bucket: Bucket::with(start_tokens(f.burst, f.limit_per_sec, start_share), now),
        share: start_share,
        offered: 0,
        since: now,
        demand: None,
    };
    let mut edges: Vec<Edge> = (0..f.edges).map(|_| fresh(0)).collect();
    // The registry: each edge's last entry (demand per second, when written).
    let mut registry: Vec<Option<(f64, u64)>> = vec![None; f.edges];
    let sync_us = f.sync_ms * 1000;
    let end_us = f.minutes * 60_000_000;
    let mut per_minute = vec![0u64; f.minutes as usize];
    let mut offered_per_minute = vec![0u64; f.minutes as usize];
    let intervals = (end_us / sync_us) as usize;
    let mut per_interval = vec![0u64; intervals + 1];
    let mut now = 0;
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    while now < end_us {
        let minute = (now / 60_000_000) as usize;
        let busy = if minute as u64 >= f.move_at_min {
            f.edges / 2
        } else {
            0
        };
        if minute as u64 == f.restart_at_min && now % 60_000_000 == 0 {
            let last = f.edges - 1;
            edges[last] = fresh(now);
            registry[last] = None;
        }
        for (i, e) in edges.iter_mut().enumerate() {
            // Edges sync at their own phase, as real proxies do.
            let phase = (i as u64 * sync_us) / f.edges as u64 / TICK_US * TICK_US;
            if now >= phase && (now - phase) % sync_us == 0 && now > 0 {
                let measured = e.offered as f64 / ((now - e.since) as f64 / 1e6);
                let demand = smooth(e.demand, measured);
                (e.offered, e.since, e.demand) = (0, now, Some(demand));
                registry[i] = Some((demand, now));
                let oldest = now.saturating_sub(3 * sync_us);
                let live: Vec<(usize, f64)> = registry
                    .iter()
                    .enumerate()
                    .filter_map(|(j, r)| r.filter(|(_, t)| *t >= oldest).map(|(d, _)| (j, d)))
                    .collect();
                let demands: Vec<f64> = live.iter().map(|(_, d)| *d).collect();
                let mine = live.iter().position(|(j, _)| *j == i).unwrap_or(0);
                e.share = allocate_expecting(f.limit_per_sec, &demands, f.proxies)[mine];
            }
            let rate = if i == busy {
                f.quiet_per_sec * f.skew
            } else {
                f.quiet_per_sec
            };
            // Poisson arrivals (by inversion: the rate per tick is well below one).
            let lambda = rate * TICK_US as f64 / 1e6;
            let mut n = 0u64;
            let (mut p, mut cdf) = ((-lambda).exp(), 0.0);
            let u = uniform(&mut rng);
            cdf += p;
            while u > cdf && n < 1000 {
                n += 1;
                p *= lambda / n as f64;
                cdf += p;
            }
            let burst = scaled_burst(f.burst, f.limit_per_sec, e.share);
            for _ in 0..n {
                e.offered += 1;
                offered_per_minute[minute] += 1;
                if e.bucket.take(e.share, burst, now) {
                    per_minute[minute] += 1;
                    per_interval[(now / sync_us) as usize] += 1;
                }
            }
        }
        now += TICK_US;
    }
    let cap = f.limit_per_sec * f.sync_ms as f64 / 1000.0;
    let worst = per_interval[..intervals]
        .iter()
        .enumerate()
        .map(|(i, &n)| (n as f64 / cap - 1.0, (i as u64 * f.sync_ms) as f64 / 1000.0))
        .fold((f64::MIN, 0.0), |a, b| if b.0 > a.0 { b } else { a });
    FleetReport {
        per_minute,
        offered_per_minute,
        worst_overshoot: worst,
    }
}

/// Partitions that each own an equal range of Redis Cluster's 16384 hash slots, as hash
/// partitions of a key-value store do.
struct Partitions(usize);

impl Place for Partitions {
    fn node_of(&self, key: &[u8]) -> usize {
        crate::backend::slots::slot_of(key) as usize * self.0 / 16384
    }
    fn nodes(&self) -> usize {
        self.0
    }
    fn tag(&self) -> [u8; 2] {
        *b"{}"
    }
    fn by_slot(&self) -> bool {
        true
    }
}

/// The televised final.
#[derive(Clone, Debug)]
pub struct Final {
    pub votes_per_sec: f64,
    pub edges: usize,
    pub partitions: usize,
    pub partition_writes_per_sec: f64,
    pub seconds: u64,
    /// Combine window, when combining (one write per shard per edge per window at most).
    pub window_us: u64,
}

impl Default for Final {
    fn default() -> Self {
        Final {
            votes_per_sec: 200_000.0,
            edges: 60,
            partitions: 256,
            partition_writes_per_sec: 1000.0,
            seconds: 5,
            window_us: 500,
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct FinalRow {
    pub shards: usize,
    pub combine: bool,
    /// Distinct partitions the shards landed on.
    pub partitions_used: usize,
    /// Share of votes refused by a partition.
    pub throttled: f64,
    /// Writes the partitions were sent per second.
    pub writes_per_sec: f64,
    /// A tally read: commands sent (the base key and every shard), and partitions asked.
    pub read_commands: usize,
    pub read_partitions: usize,
}

/// One run of the final with the key salted over `shards` (1 = no mitigation).
pub fn final_vote(v: &Final, shards: usize, combine: bool) -> FinalRow {
    let place = Partitions(v.partitions);
    let key = b"vote:final";
    let salts = if shards > 1 {
        choose_salts(&place, key, &[], shards)
    } else {
        Vec::new()
    };
    let names: Vec<Vec<u8>> = if salts.is_empty() {
        vec![key.to_vec()]
    } else {
        salts
            .iter()
            .map(|&s| shard_name(key, s, place.tag()).to_vec())
            .collect()
    };
    let part_of: Vec<usize> = names.iter().map(|n| place.node_of(n)).collect();
    let mut used = part_of.clone();
    used.sort_unstable();
    used.dedup();
    let cap = v.partition_writes_per_sec;
    let mut buckets: Vec<Bucket> = (0..v.partitions).map(|_| Bucket::full(cap, 0)).collect();
    // Open batches: (edge, shard) -> (closes at, votes in it).
    let mut open: Vec<Option<(u64, u64)>> = vec![None; v.edges * names.len()];
    let total = (v.votes_per_sec * v.seconds as f64) as u64;
    let gap_ns = 1e9 / v.votes_per_sec;
    let (mut throttled, mut writes) = (0u64, 0u64);
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut write = |part: usize, at_us: u64, votes: u64, throttled: &mut u64| {
        writes += 1;
        if !buckets[part].take(cap, cap, at_us) {
            *throttled += votes;
        }
    };
    for i in 0..total {
        let at_us = (i as f64 * gap_ns / 1000.0) as u64;
        let edge = (next() % v.edges as u64) as usize;
        let shard = (next() % names.len() as u64) as usize;
        if !combine {
            write(part_of[shard], at_us, 1, &mut throttled);
            continue;
        }
        let slot = &mut open[edge * names.len() + shard];
        match slot {
            Some((closes, n)) if at_us < *closes => *n += 1,
            _ => {
                if let Some((closes, n)) = slot.take() {
                    write(part_of[shard], closes, n, &mut throttled);
                }
                *slot = Some((at_us + v.window_us, 1));
            }
        }
    }
    if combine {
        for (i, slot) in open.iter().enumerate() {
            if let Some((closes, n)) = slot {
                write(part_of[i % names.len()], *closes, *n, &mut throttled);
            }
        }
    }
    let mut read_parts = used.clone();
    read_parts.push(place.node_of(key));
    read_parts.sort_unstable();
    read_parts.dedup();
    FinalRow {
        shards,
        combine,
        partitions_used: used.len(),
        throttled: throttled as f64 / total as f64,
        writes_per_sec: writes as f64 / v.seconds as f64,
        read_commands: if shards > 1 { names.len() + 1 } else { 1 },
        read_partitions: if shards > 1 { read_parts.len() } else { 1 },
    }
}

fn fleet_section(out: &mut String, title: &str, f: &Fleet) {
    let r = fleet(f);
    out.push_str(&format!(
        "## Fleet, {title}: {} edges, a global limit of {:.0}/min, sync every {} ms\n\n",
        f.edges,
        f.limit_per_sec * 60.0,
        f.sync_ms
    ));
    out.push_str(&format!(
        "Poisson arrivals; quiet edges are offered {}/s, the busy one {}x that (edge 0, then edge {} from minute {}); edge {} restarts at minute {}.\n\n",
        f.quiet_per_sec, f.skew, f.edges / 2, f.move_at_min + 1, f.edges - 1, f.restart_at_min + 1
    ));
    out.push_str("| minute | offered | admitted | vs limit |\n|---|---|---|---|\n");
    for (m, (a, o)) in r.per_minute.iter().zip(&r.offered_per_minute).enumerate() {
        let lim = f.limit_per_sec * 60.0;
        out.push_str(&format!(
            "| {} | {o} | {a} | {:+.2}% |\n",
            m + 1,
            (*a as f64 / lim - 1.0) * 100.0
        ));
    }
    out.push_str(&format!(
        "\nWorst one-interval overshoot: {:+.2}% (the {} ms from {:.0} s).\n\n",
        r.worst_overshoot.0 * 100.0,
        f.sync_ms,
        r.worst_overshoot.1
    ));
}

/// The report `saltshaker simulate` prints (markdown, for bench/README.md).
pub fn report() -> String {
    let mut out = String::new();
    for (title, f) in [
        ("every edge over its equal share", Fleet::default()),
        (
            "quiet edges just under their equal share",
            Fleet {
                quiet_per_sec: 16.0,
                ..Fleet::default()
            },
        ),
    ] {
        fleet_section(&mut out, title, &f);
    }
    let v = Final::default();
    out.push_str(&format!(
        "## Televised final: {:.0} votes/s on one key, {} edges, partitions of {:.0} writes/s\n\n",
        v.votes_per_sec, v.edges, v.partition_writes_per_sec
    ));
    out.push_str("Combine windows: 500 us (the default) and 5000 us.\n\n");
    out.push_str("| shards | combine | partitions used | throttled | writes/s to partitions | tally read: commands | tally read: partitions |\n|---|---|---|---|---|---|---|\n");
    for n in [1usize, 8, 50, 100, 200] {
        for window in [0u64, 500, 5000] {
            let v = Final {
                window_us: window.max(1),
                ..v.clone()
            };
            let row = final_vote(&v, n, window > 0);
            out.push_str(&format!(
                "| {} | {} | {} | {:.2}% | {:.0} | {} | {} |\n",
                n,
                if window > 0 {
                    format!("{window} us")
                } else {
                    "no".into()
                },
                row.partitions_used,
                row.throttled * 100.0,
                row.writes_per_sec,
                row.read_commands,
                row.read_partitions
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fleet_admits_its_limit_within_3_pct_each_minute() {
        let f = Fleet::default();
        let r = fleet(&f);
        for (m, a) in r.per_minute.iter().enumerate() {
            let dev = *a as f64 / 60_000.0 - 1.0;
            assert!(dev.abs() <= 0.03, "minute {}: {a} ({dev:+.3})", m + 1);
        }
        assert!(r.worst_overshoot.0 < 0.03, "{:?}", r.worst_overshoot);
        // Near their equal share, quiet edges waste some of theirs (arrivals are bursty and
        // a demand is measured over one interval): a little under the limit.
        let near = fleet(&Fleet {
            quiet_per_sec: 16.0,
            ..Fleet::default()
        });
        for a in &near.per_minute {
            let dev = *a as f64 / 60_000.0 - 1.0;
            assert!(dev.abs() <= 0.03, "{dev:+.3}");
        }
        assert!(near.worst_overshoot.0 < 0.10, "{:?}", near.worst_overshoot);
    }

    #[test]
    fn salting_over_distinct_partitions_takes_the_throttling_away() {
        let v = Final {
            seconds: 1,
            ..Final::default()
        };
        let none = final_vote(&v, 1, false);
        assert!(none.throttled > 0.99, "{none:?}");
        let salted = final_vote(&v, 200, false);
        assert_eq!(salted.partitions_used, 200);
        assert!(salted.throttled < 0.01, "{salted:?}");
        assert_eq!(salted.read_commands, 201);
        // Combining only pays when an edge sees several votes per shard and window.
        let wide = Final {
            window_us: 5000,
            ..v.clone()
        };
        let combined = final_vote(&wide, 8, true);
        assert!(
            combined.writes_per_sec < none.writes_per_sec / 2.0,
            "{combined:?}"
        );
    }
}
