//! Node balance: the read cache takes the excess off a node busier than the others.
//!
//! Hashing places keys, not traffic. Under a skewed read load (a Zipf-like catalogue) the
//! keys one node owns can add up to far more than its share while no single key reaches
//! `read.hot_at_per_sec`, so a threshold that only catches keys too hot for any node leaves
//! the skew in place: measured in `bench/README.md` ("Read-hot keys"), the default 2000/s
//! cached ~20 keys and left Zipf 1.1 at 2.05x the mean on the busiest node (uniform: 1.01).
//! Caching every warm key instead needs thousands of entries and a very deep top-k
//! (`rules/examples/zipf-read-cache.yaml`, 0.69x throughput). Caching only what the busy
//! node needs is far cheaper: `bench/zipf_placement.py --greedy` finds that 25 to 700 keys
//! (rank under ~1000) bring Zipf 1.1 and 1.3 over 100k keys within 5% of the mean.
//!
//! The controller below runs once per detection window. It reads the load this proxy sent
//! each node (the load a cache hit takes away): its commands, counted as a microsecond of
//! node time each, plus the estimated node time of its costly reads (big values, big
//! aggregates: `saltshaker_backend_read_cost_seconds_total`, from `proxy::conn::cost`), so a node
//! kept busy by a few expensive reads counts as busy. It also reads the load of each key the
//! detector tracks in the same unit (`HotSnapshot::read_rates`: its reads, plus the node
//! time of its costly reads), so a key is given back only if the node can take what it
//! really costs (weighed by its reads alone, a cached costly key was given back and taken
//! again by turns: tests/hot_by_cost.rs). For a node above the
//! mean by more than `balance.over_mean_pct`
//! chooses that node's hottest keys, as many as take its excess off, and makes them read-hot
//! (`Chosen`, read by the detector through its per-key thresholds). When the node is clearly
//! below the mean it gives the coolest chosen keys back.
//!
//! It chooses keys, not a lower threshold per node: a threshold cannot take some of many keys
//! read at one rate, and as rates move from window to window, keys just under a threshold
//! get pulled in one after the other until all are cached (measured in tests/balance.rs: a
//! node with 100 keys at 50/s each went from 1.2x the mean to nothing).

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;

use crate::backend::Backend;
use crate::hotkey::{Detector, HotSnapshot};
use crate::rules::{Balance, RulesHandle};

/// A chosen key is read-hot from `min_reads_per_sec` and cools below this share of it (the
/// rules' own ratio, 500 of 2000); the controller gives keys back by name, not by rate.
pub const COOL_SHARE: f64 = 0.25;

/// Read keys tracked per thread while balance is at work. The keys a busy node needs cached
/// rank up to ~1000 under Zipf 1.1 and 1.3 over 100k keys (bench/zipf_placement.py
/// --greedy), but tracking 1024 keys all the time costs the proxy +34% CPU per request on a
/// uniform load against +12% at the default 128 (bench/detection_overhead.sh, four rounds
/// each, one after the other): the top-k's boundary churns. So the read side goes this deep
/// only while a node is busy and its keys above `min_reads_per_sec` do not all fit in view.
pub const DEEP_TOP_K: usize = 1024;

/// The keys balance made read-hot, shared with the detector's thresholds and the admin views.
#[derive(Default)]
pub struct Chosen {
    keys: ArcSwap<HashSet<Box<[u8]>>>,
    /// `min_reads_per_sec` in force, as f64 bits.
    floor: AtomicU64,
}

impl Chosen {
    pub fn contains(&self, key: &[u8]) -> bool {
        self.keys.load().contains(key)
    }

    pub fn is_empty(&self) -> bool {
        self.keys.load().is_empty()
    }

    /// The read-hot threshold of a chosen key.
    pub fn floor(&self) -> f64 {
        f64::from_bits(self.floor.load(Ordering::Relaxed))
    }

    fn set(&self, keys: HashSet<Box<[u8]>>, floor: f64) {
        self.floor.store(floor.to_bits(), Ordering::Relaxed);
        self.keys.store(Arc::new(keys));
    }

    /// `(hot_at, cool_below)` for a key whose rule says `(hot, cool)` and caches reads.
    pub fn apply(&self, key: &[u8], hot: f64, cool: f64) -> (f64, f64) {
        if self.contains(key) {
            let floor = self.floor();
            (hot.min(floor), cool.min(floor * COOL_SHARE))
        } else {
            (hot, cool)
        }
    }

    /// The lowest read-hot threshold a key can have through balance.
    pub fn lowest(&self) -> f64 {
        if self.is_empty() {
            f64::INFINITY
        } else {
            self.floor()
        }
    }
}

/// What one step did to a node, for the log.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Change {
    None,
    /// The node went over and its first keys were chosen.
    Started,
    /// The node is still over and no key of it in view is worth a cache entry any more.
    AtFloor,
    /// Every key chosen on the node was given back.
    Ended,
}

/// One node's tracked keys with their read rates in the last window, hottest first: `cold`
/// are read-hot by nothing (the cache could take them), `chosen` are read-hot by balance.
#[derive(Clone, Debug, Default)]
pub struct NodeKeys {
    pub cold: Vec<(Box<[u8]>, f64)>,
    pub chosen: Vec<(Box<[u8]>, f64)>,
}

/// The controller's state: the keys chosen per node, and how many steps a node waits after a
/// change (new keys turn read-hot at the next window close, so the window after that is the
/// first whose load shows the change; stepping again before would overshoot).
pub struct Controller {
    pub chosen: Vec<HashSet<Box<[u8]>>>,
    held: Vec<u8>,
    /// A busy node's keys may rank below what the detector tracks: track more.
    deepen: bool,
    /// Whether `AtFloor` was said for the node since it last changed.
    at_floor: Vec<bool>,
}

impl Controller {
    pub fn new(nodes: usize) -> Controller {
        Controller {
            chosen: vec![HashSet::new(); nodes],
            held: vec![0; nodes],
            deepen: false,
            at_floor: vec![false; nodes],
        }
    }

    /// Whether the detector should track `DEEP_TOP_K` read keys now.
    pub fn deep(&self) -> bool {
        self.deepen || self.chosen.iter().any(|c| !c.is_empty())
    }

    /// Every chosen key.
    pub fn all(&self) -> HashSet<Box<[u8]>> {
        self.chosen.iter().flatten().cloned().collect()
    }

    /// One step. `loads[i]` is the commands per second sent to node i, `None` for a node
    /// that is down (it leaves the mean and its keys are given back); `keys[i]` its tracked
    /// keys; `saturated`: even the coolest key tracked is read at least `min_reads_per_sec`,
    /// so keys the cache could take may be out of view.
    ///
    /// A node over the mean by more than the margin gets its hottest cold keys chosen, as
    /// many as bring it to the mean after the change, or as close to the
    /// mean as it gets, and none when that would leave it further from the mean than now
    /// (a node whose load is one key read by everyone). A node clearly under the mean (a dead band
    /// of twice the margin, so a node just balanced does not give keys back at once) gives
    /// its coolest chosen keys back, as many as keep it at most at the mean.
    pub fn step(
        &mut self,
        loads: &[Option<f64>],
        keys: &[NodeKeys],
        cfg: &Balance,
        saturated: bool,
    ) -> Vec<Change> {
        let mut changes = vec![Change::None; self.chosen.len()];
        self.deepen = false;
        let up: Vec<f64> = loads.iter().flatten().copied().collect();
        let n = up.len() as f64;
        let mean = up.iter().sum::<f64>() / n.max(1.0);
        let band = cfg.over_mean_pct / 100.0;
        let floor = cfg.min_reads_per_sec;
        let active = cfg.enabled && up.len() >= 2;
        let none = NodeKeys::default();
        for (i, load) in loads.iter().enumerate() {
            let had = !self.chosen[i].is_empty();
            let (Some(load), true) = (*load, active) else {
                self.chosen[i].clear();
                self.held[i] = 0;
                if had {
                    changes[i] = Change::Ended;
                }
                continue;
            };
            let k = keys.get(i).unwrap_or(&none);
            // Chosen keys the detector no longer reports have cooled: forget them.
            let seen: HashSet<&[u8]> = k.chosen.iter().map(|(key, _)| &key[..]).collect();
            self.chosen[i].retain(|key| seen.contains(&key[..]));
            if self.held[i] > 0 {
                self.held[i] -= 1;
            } else if load > mean * (1.0 + band) && load - mean >= floor {
                // Over (by more than one key at the floor could fix). Judged by the node's
                // own distance from the mean after the change: when several nodes are over
                // they all shed in the same step, so the busiest of the others is no guide.
                let gap = |l: f64, m: f64| (l / m.max(f64::MIN_POSITIVE) - 1.0).abs();
                let now_gap = gap(load, mean);
                let (mut taken, mut best, mut reached) = (0.0, None::<(usize, f64)>, false);
                let cold = k.cold.iter().take_while(|(_, r)| *r >= floor);
                for (j, (_, r)) in cold.enumerate() {
                    taken += r;
                    let mean_after = mean - taken / n;
                    let after = (load - taken) / mean_after.max(f64::MIN_POSITIVE);
                    let g = gap(load - taken, mean_after);
                    if g < now_gap && best.is_none_or(|(_, b)| g < b) {
                        best = Some((j + 1, g));
                    }
                    // Aim at the mean, not the margin: the tracked rates are estimates
                    // (a Count-Min sketch over-counts), and a node aimed at the edge of the
                    // margin took many steps to get inside it (bench/read_hot.sh).
                    if after <= 1.0 {
                        reached = true;
                    }
                    if reached || after < 1.0 - 2.0 * band {
                        break;
                    }
                }
                if !reached && saturated {
                    self.deepen = true;
                }
                if let Some((count, _)) = best {
                    self.chosen[i].extend(k.cold[..count].iter().map(|(key, _)| key.clone()));
                    self.held[i] = 1;
                    self.at_floor[i] = false;
                    if !had {
                        changes[i] = Change::Started;
                    }
                } else if !reached && had && !self.at_floor[i] {
                    self.at_floor[i] = true;
                    changes[i] = Change::AtFloor;
                }
            } else if had && load < mean * (1.0 - 2.0 * band) {
                let mut back = 0.0;
                let mut give = Vec::new();
                for (key, r) in k.chosen.iter().rev() {
                    if (load + back + r) / (mean + (back + r) / n) > 1.0 {
                        break;
                    }
                    back += r;
                    give.push(key);
                }
                if !give.is_empty() {
                    for key in give {
                        self.chosen[i].remove(key);
                    }
                    self.held[i] = 1;
                    self.at_floor[i] = false;
                }
            }
            if had && self.chosen[i].is_empty() {
                changes[i] = Change::Ended;
            }
        }
        changes
    }
}

/// Splits the tracked keys' read rates by node: keys chosen by balance, and cold keys (read-hot
/// by nothing) whose rule caches reads (the others balance cannot move).
pub fn node_keys(
    snap: &HotSnapshot,
    nodes: usize,
    chosen: &HashSet<Box<[u8]>>,
    node_for: impl Fn(&[u8]) -> usize,
    caches: impl Fn(&[u8]) -> bool,
) -> Vec<NodeKeys> {
    let hot: HashSet<&[u8]> = snap
        .keys
        .iter()
        .filter(|k| k.read_hot_state().is_some())
        .map(|k| k.key.as_slice())
        .collect();
    let mut out = vec![NodeKeys::default(); nodes];
    for (key, rate) in snap.read_rates.iter() {
        let Some(n) = out.get_mut(node_for(key)) else {
            continue;
        };
        if chosen.contains(key) {
            n.chosen.push((key.clone(), *rate));
        } else if !hot.contains(&key[..]) && caches(key) {
            n.cold.push((key.clone(), *rate));
        }
    }
    out
}

/// Runs the controller until shutdown: one step per detection window.
pub async fn run(
    chosen: Arc<Chosen>,
    backend: &Backend,
    detector: &Detector,
    rules: RulesHandle,
    gauges: Vec<Gauge>,
    mut shutdown: watch::Receiver<bool>,
) {
    let nodes = backend.nodes();
    // A command is a microsecond of node time; costly reads add their estimate.
    let count = || -> Vec<u64> {
        nodes
            .iter()
            .map(|n| n.metrics.requests.get() + (n.metrics.read_cost.get() * 1e6) as u64)
            .collect()
    };
    let mut prev = count();
    let mut last = Instant::now();
    let mut ctl = Controller::new(nodes.len());
    let snaps = detector.subscribe();
    loop {
        let r = rules.load();
        let window = Duration::from_millis(r.window_ms().max(100));
        tokio::select! {
            _ = tokio::time::sleep(window) => {}
            _ = shutdown.wait_for(|v| *v) => return,
        }
        let now = Instant::now();
        let secs = now.duration_since(last).as_secs_f64().max(1e-3);
        let counts = count();
        let loads: Vec<Option<f64>> = nodes
            .iter()
            .zip(counts.iter().zip(&prev))
            .map(|(n, (c, p))| n.is_up().then(|| c.saturating_sub(*p) as f64 / secs))
            .collect();
        for (n, l) in nodes.iter().zip(&loads) {
            n.set_load(l.unwrap_or(0.0));
        }
        prev = counts;
        last = now;
        let snap = snaps.borrow().clone();
        let keys = node_keys(
            &snap,
            nodes.len(),
            &ctl.all(),
            |k| backend.node_for(k),
            |k| r.resolve(k).read.cache.enabled,
        );
        let cfg = r.balance();
        let saturated = snap
            .read_rates
            .last()
            .is_some_and(|(_, rate)| *rate >= cfg.min_reads_per_sec);
        let changes = ctl.step(&loads, &keys, cfg, saturated);
        chosen.set(ctl.all(), cfg.min_reads_per_sec);
        detector.set_read_depth(if ctl.deep() { DEEP_TOP_K } else { 0 });
        tracing::debug!(
            ?loads,
            chosen = ?ctl.chosen.iter().map(HashSet::len).collect::<Vec<_>>(),
            cold = ?keys.iter().map(|k| k.cold.len()).collect::<Vec<_>>(),
            tracked = snap.read_rates.len(),
            saturated,
            "balance step"
        );
        let up: Vec<f64> = loads.iter().flatten().copied().collect();
        let mean = up.iter().sum::<f64>() / up.len().max(1) as f64;
        for (i, ch) in changes.iter().enumerate() {
            let ratio = loads[i].unwrap_or(0.0) / mean.max(f64::MIN_POSITIVE);
            let addr = &nodes[i].addr;
            let ratio = format!("{ratio:.2}");
            match ch {
                Change::None => {}
                Change::Started => tracing::info!(
                    node = %addr,
                    load_over_mean = %ratio,
                    keys = ctl.chosen[i].len(),
                    "balance: node is busier than the others; caching its hottest keys"
                ),
                Change::AtFloor => tracing::info!(
                    node = %addr,
                    load_over_mean = %ratio,
                    keys = ctl.chosen[i].len(),
                    "balance: node still busy and no more of its keys are worth caching; the rest \
                     of its load is keys read less than balance.min_reads_per_sec (placement, or \
                     many keys read alike)"
                ),
                Change::Ended => tracing::info!(
                    node = %addr,
                    "balance: node has room again; its keys follow the rules' read threshold"
                ),
            }
        }
        for (g, c) in gauges.iter().zip(&ctl.chosen) {
            g.set(c.len() as i64);
        }
    }
}

#[cfg(test)]
#[path = "balance_tests.rs"]
mod tests;
