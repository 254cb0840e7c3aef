//! Node balance: per-node read-hot thresholds that follow each node's load.
//!
//! Hashing places keys, not traffic. Under a skewed read load (a Zipf-like catalogue) the
//! keys one node owns can add up to far more than its share while no single key reaches
//! `read.hot_at_per_sec`, so a threshold that only catches keys too hot for any node leaves
//! the skew in place: measured in `bench/README.md` ("Read-hot keys"), the default 2000/s
//! cached ~20 keys and left Zipf 1.1 at 2.05x the mean on the busiest node (uniform: 1.01).
//! Caching every warm key instead needs thousands of entries and a very deep top-k
//! (`rules/examples/zipf-read-cache.yaml`, 0.69x throughput). Caching only what the busy
//! node needs is far cheaper: `bench/zipf_placement.py --greedy` finds that 25 to 650 keys
//! (rank under 1024) bring Zipf 1.1 and 1.3 over 100k keys within 5% of the mean.
//!
//! The controller below runs once per detection window. It reads the commands this proxy
//! sent each node (the load a cache hit takes away) and the read rates of the keys the
//! detector tracks, and for a node above the mean by more than `balance.over_mean_pct`
//! lowers the read-hot threshold of the keys that node owns (`Caps`, read by the detector
//! through its per-key thresholds) to the rate that takes its excess off, so the node's
//! hottest keys are cached first. When the node is clearly below the mean it raises the
//! threshold back, until the rules' own threshold is in force again.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;

use crate::backend::Backend;
use crate::hotkey::{Detector, HotSnapshot};
use crate::rules::{Balance, RulesHandle};

/// A node's read-hot threshold cap in reads per second; `NONE` = the rules' thresholds.
pub const NONE: f64 = f64::INFINITY;

/// A key read-hot by a node's cap cools below this share of the cap: the rules' own ratio
/// (500 of 2000). With half, a proxy whose traffic dipped by a third for a few seconds gave
/// back every key it had cached for balance, and cached them again when it recovered
/// (tests/balance.rs under a slow debug build).
pub const COOL_SHARE: f64 = 0.25;

/// The node that owns a key.
pub type NodeFor = Box<dyn Fn(&[u8]) -> usize + Send + Sync>;

/// A cap is judged by what it takes once every cold key read at least this share of it has
/// been pulled in too (see `Controller::step`).
const RATCHET: f64 = 0.8;

/// Per-node caps on the read-hot threshold, shared with the detector's thresholds.
pub struct Caps {
    caps: Box<[AtomicU64]>,
    node_for: NodeFor,
}

impl Caps {
    pub fn new(nodes: usize, node_for: NodeFor) -> Caps {
        Caps {
            caps: (0..nodes).map(|_| AtomicU64::new(NONE.to_bits())).collect(),
            node_for,
        }
    }

    /// The cap on the read-hot threshold of `key` (`NONE` when its node is not busy).
    #[inline]
    pub fn for_key(&self, key: &[u8]) -> f64 {
        if self.caps.len() < 2 {
            return NONE;
        }
        let n = (self.node_for)(key);
        self.caps
            .get(n)
            .map_or(NONE, |c| f64::from_bits(c.load(Ordering::Relaxed)))
    }

    /// The lowest cap of any node.
    pub fn lowest(&self) -> f64 {
        self.get().into_iter().fold(NONE, f64::min)
    }

    pub fn get(&self) -> Vec<f64> {
        self.caps
            .iter()
            .map(|c| f64::from_bits(c.load(Ordering::Relaxed)))
            .collect()
    }

    fn set(&self, caps: &[f64]) {
        for (c, v) in self.caps.iter().zip(caps) {
            c.store(v.to_bits(), Ordering::Relaxed);
        }
    }

    /// `(hot_at, cool_below)` for a key whose rule says `(hot, cool)` and caches reads.
    pub fn apply(&self, key: &[u8], hot: f64, cool: f64) -> (f64, f64) {
        let cap = self.for_key(key);
        if cap <= hot {
            // The cool threshold follows the cap, not the rules: a key cached for balance
            // at 800/s must go back when the cap rises past it, though the rules' own
            // hysteresis (hot from 2000, cool below 500) would keep it hot.
            (cap, cap * COOL_SHARE)
        } else {
            (hot, cool)
        }
    }
}

/// What one step did to a node, for the log.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Change {
    None,
    /// The node went over: its cap was set for the first time.
    Started,
    /// The cap went down to `min_reads_per_sec` and the node is still over.
    AtFloor,
    /// The cap went back to `NONE`.
    Ended,
}

/// The read rates of one node's tracked keys in the last window, hottest first: `cold` are
/// not read-hot now (the cache could take them), `hot` are (the cache serves them).
#[derive(Clone, Debug, Default)]
pub struct NodeKeys {
    pub cold: Vec<f64>,
    pub hot: Vec<f64>,
}

/// The controller's state: each node's cap, and how many steps it waits after a change
/// (a new cap promotes keys at the next window close, so the window after that is the
/// first whose load shows the change; stepping again before would overshoot).
pub struct Controller {
    pub caps: Vec<f64>,
    held: Vec<u8>,
    /// A busy node's keys may rank below what the detector tracks: track more.
    deepen: bool,
}

/// Read keys tracked per thread while balance is at work. The keys a busy node needs cached
/// rank up to ~1000 under Zipf 1.1 and 1.3 over 100k keys (bench/zipf_placement.py
/// --greedy), but tracking 1024 keys all the time costs the proxy +34% CPU per request on a
/// uniform load against +12% at the default 128 (bench/detection_overhead.sh, four rounds
/// each, one after the other): the top-k's boundary churns. So the read side goes this deep
/// only while a node is busy and its keys above `min_reads_per_sec` do not all fit in view.
pub const DEEP_TOP_K: usize = 1024;

impl Controller {
    pub fn new(nodes: usize) -> Controller {
        Controller {
            caps: vec![NONE; nodes],
            held: vec![0; nodes],
            deepen: false,
        }
    }

    /// Whether the detector should track `DEEP_TOP_K` read keys now.
    pub fn deep(&self) -> bool {
        self.deepen || self.caps.iter().any(|c| *c != NONE)
    }

    /// One step. `loads[i]` is the commands per second sent to node i, `None` for a node
    /// that is down (it leaves the mean and its cap is dropped); `keys[i]` its tracked keys;
    /// `hot_at` the rules' default read threshold (a cap at or above it is dropped);
    /// `saturated`: even the coolest key tracked is read at least `min_reads_per_sec`, so
    /// keys the cache could take may be out of view.
    ///
    /// A node over the mean by more than the margin gets the cap that takes its excess off:
    /// walking its cold keys hottest first, the rate of the key at which their rates add up
    /// to the load above the mean. A node clearly under the mean (a dead band of twice the
    /// margin, so a node just balanced does not give keys back at once) gets back half its
    /// room: the cap rises past its coolest cached keys that fit in it.
    pub fn step(
        &mut self,
        loads: &[Option<f64>],
        keys: &[NodeKeys],
        hot_at: f64,
        cfg: &Balance,
        saturated: bool,
    ) -> Vec<Change> {
        let mut changes = vec![Change::None; self.caps.len()];
        self.deepen = false;
        let up: Vec<f64> = loads.iter().flatten().copied().collect();
        let mean = up.iter().sum::<f64>() / up.len().max(1) as f64;
        let band = cfg.over_mean_pct / 100.0;
        let floor = cfg.min_reads_per_sec.min(hot_at);
        let active = cfg.enabled && up.len() >= 2;
        for (i, load) in loads.iter().enumerate() {
            let cap = self.caps[i];
            let (Some(load), true) = (*load, active) else {
                if cap != NONE {
                    self.caps[i] = NONE;
                    changes[i] = Change::Ended;
                }
                self.held[i] = 0;
                continue;
            };
            if self.held[i] > 0 {
                self.held[i] -= 1;
                continue;
            }
            let none = NodeKeys::default();
            let k = keys.get(i).unwrap_or(&none);
            let n = up.len() as f64;
            // A node over by less than one key at the floor cannot be helped by the cache.
            let over = load > mean * (1.0 + band) && load - mean >= floor;
            let by_rules = k.hot.iter().all(|&r| r >= hot_at);
            if cap != NONE && !over && by_rules && (cap >= hot_at || k.hot.is_empty()) {
                // Given back (or nothing left to give): every key still read-hot here is
                // hot by the rules alone.
                self.caps[i] = NONE;
                changes[i] = Change::Ended;
            } else if over {
                // Over. Try caps from the hottest cold key down; each takes every cold key
                // at or above it (keys with equal rates go together). Stop at the first that
                // brings the node within the margin of the mean after the change, or once
                // it would be under the band where keys are given back; of those tried,
                // take the one that leaves the busiest node least over the mean.
                let cold: Vec<f64> = k.cold.iter().copied().filter(|&r| r >= floor).collect();
                let others = loads
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .filter_map(|(_, l)| *l)
                    .fold(0.0, f64::max);
                let now_max = load.max(others) / mean.max(f64::MIN_POSITIVE);
                let (mut taken, mut inside, mut reached) = (0.0, 0, false);
                let (mut worst, mut inside_w) = (0.0, 0);
                let mut best: Option<(f64, f64)> = None;
                let outcome = |taken: f64| {
                    let mean_after = (mean - taken / n).max(f64::MIN_POSITIVE);
                    (
                        (load - taken) / mean_after,
                        (load - taken).max(others) / mean_after,
                    )
                };
                for &r in &cold {
                    // A little under the key's rate: it must still qualify next window.
                    let c = (r * 0.9).max(floor);
                    while inside < cold.len() && cold[inside] >= c {
                        taken += cold[inside];
                        inside += 1;
                    }
                    // Rates move from window to window, and a key once hot stays hot down to
                    // half the cap: keys a little under the cap get pulled in over time. Judge
                    // a cap also by what it takes once everything within RATCHET of it is in
                    // (with many keys at one rate, that is all of them).
                    while inside_w < cold.len() && cold[inside_w] >= c * RATCHET {
                        worst += cold[inside_w];
                        inside_w += 1;
                    }
                    let (after, max_after) = outcome(taken);
                    let (after_w, max_after_w) = outcome(worst);
                    let score = max_after.max(max_after_w);
                    if best.map_or(true, |(_, m)| score < m) {
                        best = Some((c, score));
                    }
                    if after <= 1.0 + band {
                        reached = true;
                    }
                    if reached || after_w < 1.0 - 2.0 * band {
                        break;
                    }
                }
                // Only a change that evens the nodes out is worth making.
                let best = best.filter(|(_, m)| *m < now_max).map(|(c, _)| c);
                if !reached && saturated {
                    self.deepen = true;
                }
                // None: no key of this node in view is worth a cache entry (uniform load on
                // an uneven placement looks like this), or every one would overshoot.
                let Some(next) = best else { continue };
                if next < cap.min(hot_at) {
                    changes[i] = if cap == NONE {
                        Change::Started
                    } else if next == floor {
                        Change::AtFloor
                    } else {
                        Change::None
                    };
                    self.caps[i] = next;
                    self.held[i] = 1;
                }
            } else if cap != NONE && load < mean * (1.0 - 2.0 * band) {
                // Under. Give back the coolest cached keys (a key cools below COOL_SHARE of
                // the cap, so lifting the cap past 1.1x a key's rate over COOL_SHARE sends
                // back every key up to that rate), as many as keep the node at most at the
                // mean after the change.
                let (mut back, mut best) = (0.0, None);
                for (j, &r) in k.hot.iter().rev().enumerate() {
                    back += r;
                    // Keys of equal rate go back together.
                    if k.hot.iter().rev().nth(j + 1).is_some_and(|&s| s < r * 1.1) {
                        continue;
                    }
                    if (load + back) / (mean + back / n) > 1.0 {
                        break;
                    }
                    // All of them: up to the rules' threshold (dropped at the next step).
                    best = Some(if j + 1 == k.hot.len() {
                        hot_at
                    } else {
                        r / COOL_SHARE * 1.1
                    });
                }
                let Some(next) = best else { continue };
                let next = next.min(hot_at).max(cap);
                if next != cap {
                    self.caps[i] = next;
                    self.held[i] = 1;
                }
            }
        }
        changes
    }
}

/// Splits the tracked keys' read rates by node and by whether they are read-hot now,
/// keeping only keys whose rule caches reads (the others a cap would not move).
pub fn node_keys(
    snap: &HotSnapshot,
    nodes: usize,
    node_for: impl Fn(&[u8]) -> usize,
    caches: impl Fn(&[u8]) -> bool,
) -> Vec<NodeKeys> {
    let hot: HashSet<&[u8]> = snap
        .keys
        .iter()
        .filter(|k| k.read_state.is_some())
        .map(|k| k.key.as_slice())
        .collect();
    let mut out = vec![NodeKeys::default(); nodes];
    for (key, rate) in snap.read_rates.iter() {
        if !caches(key) {
            continue;
        }
        let Some(n) = out.get_mut(node_for(key)) else {
            continue;
        };
        if hot.contains(&key[..]) {
            n.hot.push(*rate);
        } else {
            n.cold.push(*rate);
        }
    }
    out
}

/// Runs the controller until shutdown: one step per detection window.
pub async fn run(
    caps: Arc<Caps>,
    backend: &Backend,
    detector: &Detector,
    rules: RulesHandle,
    gauges: Vec<Gauge<f64, AtomicU64>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let nodes = backend.nodes();
    let count = || -> Vec<u64> { nodes.iter().map(|n| n.metrics.requests.get()).collect() };
    let mut prev = count();
    let mut last = Instant::now();
    let mut ctl = Controller::new(nodes.len());
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
        prev = counts;
        last = now;
        let snap = detector.subscribe().borrow().clone();
        let keys = node_keys(
            &snap,
            nodes.len(),
            |k| backend.node_for(k),
            |k| r.resolve(k).read.cache.enabled,
        );
        let hot_at = r.defaults().read.hot_at_per_sec;
        let floor = r.balance().min_reads_per_sec;
        let saturated = snap
            .read_rates
            .last()
            .is_some_and(|(_, rate)| *rate >= floor);
        let changes = ctl.step(&loads, &keys, hot_at, r.balance(), saturated);
        tracing::debug!(
            ?loads,
            caps = ?ctl.caps,
            cold = ?keys.iter().map(|k| k.cold.len()).collect::<Vec<_>>(),
            hot = ?keys.iter().map(|k| k.hot.len()).collect::<Vec<_>>(),
            tracked = snap.read_rates.len(),
            saturated,
            "balance step"
        );
        caps.set(&ctl.caps);
        detector.set_read_depth(if ctl.deep() { DEEP_TOP_K } else { 0 });
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
                    read_hot_at_per_sec = ctl.caps[i].round(),
                    "balance: node is busier than the others; caching its hottest keys"
                ),
                Change::AtFloor => tracing::info!(
                    node = %addr,
                    load_over_mean = %ratio,
                    "balance: node still busy at balance.min_reads_per_sec; the rest of its \
                     load is keys read less often than that (placement, or many warm keys)"
                ),
                Change::Ended => tracing::info!(
                    node = %addr,
                    "balance: node has room again; its keys follow the rules' read threshold"
                ),
            }
        }
        for (g, c) in gauges.iter().zip(&ctl.caps) {
            g.set(if *c == NONE { hot_at } else { *c });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Balance {
        Balance::default()
    }

    /// Node keys with Zipf-like rates: `n` keys, the first at `top` reads/s.
    fn zipf(top: f64, n: usize) -> Vec<f64> {
        (1..=n).map(|i| top / (i as f64).powf(1.1)).collect()
    }

    fn cold(rates: Vec<f64>) -> NodeKeys {
        NodeKeys {
            cold: rates,
            hot: Vec::new(),
        }
    }

    #[test]
    fn an_even_load_sets_no_cap() {
        let mut c = Controller::new(4);
        let keys = vec![cold(zipf(500.0, 100)); 4];
        let ch = c.step(&[Some(1000.0); 4], &keys, 2000.0, &cfg(), false);
        assert_eq!(c.caps, vec![NONE; 4]);
        assert!(ch.iter().all(|c| *c == Change::None));
    }

    #[test]
    fn a_busy_node_gets_the_cap_that_takes_its_excess_off() {
        let mut c = Controller::new(4);
        let rates = zipf(1000.0, 1000);
        let keys = vec![
            cold(rates.clone()),
            cold(vec![]),
            cold(vec![]),
            cold(vec![]),
        ];
        let loads = [Some(3000.0), Some(1000.0), Some(1000.0), Some(1000.0)];
        let after = |cap: f64| {
            let taken: f64 = rates.iter().filter(|&&r| r >= cap).sum();
            (3000.0 - taken) / (1500.0 - taken / 4.0)
        };
        let ch = c.step(&loads, &keys, 2000.0, &cfg(), false);
        assert_eq!(ch[0], Change::Started);
        let cap = c.caps[0];
        assert!(cap > 20.0, "a cap above the floor does it: {cap}");
        assert!(
            after(cap) <= 1.05 && after(cap) >= 0.9,
            "cap {cap} leaves the node at {:.3} of the mean",
            after(cap)
        );
        let hotter = rates
            .iter()
            .copied()
            .filter(|&r| r * 0.9 > cap)
            .fold(f64::MAX, f64::min);
        assert!(
            after(hotter * 0.9) > 1.05,
            "the next hotter cap would not have done"
        );
        assert_eq!(&c.caps[1..], &[NONE; 3]);
        // The next step waits for the load to show the change.
        c.step(&loads, &keys, 2000.0, &cfg(), false);
        assert_eq!(c.caps[0], cap);
    }

    #[test]
    fn keys_of_equal_rate_go_together_and_a_cap_never_overshoots_into_giving_back() {
        let mut c = Controller::new(2);
        // 20 keys at 50/s each on a node 300/s over: caching them all would leave it far
        // under the mean, and they cannot be told apart.
        let keys = vec![cold(vec![50.0; 20]), cold(vec![])];
        c.step(&[Some(1300.0), Some(1000.0)], &keys, 2000.0, &cfg(), false);
        assert_eq!(c.caps, vec![NONE; 2]);
    }

    #[test]
    fn with_too_few_warm_keys_every_one_worth_caching_is_cached() {
        let mut c = Controller::new(2);
        let keys = vec![cold(vec![100.0, 50.0, 10.0]), cold(vec![])];
        let ch = c.step(&[Some(3000.0), Some(1000.0)], &keys, 2000.0, &cfg(), false);
        assert_eq!(ch[0], Change::Started);
        assert_eq!(c.caps[0], 45.0, "down to the coolest key above the floor");
        assert!(c.deep(), "a capped node keeps the detector deep");
    }

    #[test]
    fn a_node_over_by_less_than_one_floor_key_is_left_alone() {
        let mut c = Controller::new(2);
        let keys = vec![cold(zipf(50.0, 10)); 2];
        // 10% over the mean, but by 10 commands/s: no key at >= 20/s can fix that.
        c.step(&[Some(110.0), Some(90.0)], &keys, 2000.0, &cfg(), false);
        assert_eq!(c.caps, vec![NONE; 2]);
    }

    #[test]
    fn inside_the_band_the_cap_holds_and_below_it_gives_keys_back() {
        let mut c = Controller::new(2);
        c.caps[0] = 100.0;
        let keys = vec![
            NodeKeys {
                cold: vec![90.0, 80.0],
                hot: vec![400.0, 300.0, 200.0, 150.0, 100.0],
            },
            cold(vec![]),
        ];
        c.step(&[Some(1020.0), Some(1000.0)], &keys, 2000.0, &cfg(), false);
        assert_eq!(c.caps[0], 100.0, "within 5%: hold");
        // Mean 1000, node 0 at 700: giving back 100 + 150 + 200 leaves it at 1150 / 1225
        // of the mean; adding the 300 key would put it over (1450 / 1375).
        let ch = c.step(&[Some(700.0), Some(1300.0)], &keys, 2000.0, &cfg(), false);
        assert_eq!(ch[0], Change::None);
        assert!(
            (c.caps[0] - 200.0 / COOL_SHARE * 1.1).abs() < 1e-9,
            "{:?}",
            c.caps
        );
        // Room for every cached key: the cap goes up to the rules' threshold...
        c.held[0] = 0;
        c.step(&[Some(10.0), Some(5000.0)], &keys, 2000.0, &cfg(), false);
        assert_eq!(c.caps[0], 2000.0);
        // ...and is dropped once every key still hot there is hot by the rules alone.
        c.held[0] = 0;
        let keys = vec![
            NodeKeys {
                cold: vec![400.0, 300.0],
                hot: vec![2500.0],
            },
            cold(vec![]),
        ];
        let ch = c.step(&[Some(1000.0), Some(1000.0)], &keys, 2000.0, &cfg(), false);
        assert_eq!(ch[0], Change::Ended);
        assert_eq!(c.caps[0], NONE);
    }

    #[test]
    fn a_down_node_drops_its_cap_and_leaves_the_mean() {
        let mut c = Controller::new(3);
        c.caps[0] = 100.0;
        let ch = c.step(
            &[None, Some(1000.0), Some(1000.0)],
            &[],
            2000.0,
            &cfg(),
            false,
        );
        assert_eq!(ch[0], Change::Ended);
        assert_eq!(c.caps, vec![NONE; 3]);
    }

    #[test]
    fn disabled_drops_every_cap() {
        let mut c = Controller::new(2);
        c.caps = vec![100.0, 50.0];
        let off = Balance {
            enabled: false,
            ..cfg()
        };
        c.step(&[Some(5000.0), Some(10.0)], &[], 2000.0, &off, false);
        assert_eq!(c.caps, vec![NONE; 2]);
    }

    #[test]
    fn caps_apply_to_the_keys_of_their_node_only() {
        let caps = Caps::new(2, Box::new(|k: &[u8]| usize::from(k[0] == b'b')));
        caps.set(&[NONE, 50.0]);
        assert_eq!(caps.apply(b"a", 2000.0, 500.0), (2000.0, 500.0));
        assert_eq!(caps.apply(b"b", 2000.0, 500.0), (50.0, 12.5));
        caps.set(&[NONE, 1800.0]);
        assert_eq!(
            caps.apply(b"b", 2000.0, 500.0),
            (1800.0, 450.0),
            "the cool threshold follows the cap, not the rules' 500"
        );
        caps.set(&[NONE, 50.0]);
        // A rule that is already lower keeps its own thresholds.
        assert_eq!(caps.apply(b"b", 10.0, 2.0), (10.0, 2.0));
        assert_eq!(caps.lowest(), 50.0);
    }

    #[test]
    fn node_keys_splits_by_node_and_heat_and_skips_keys_not_cached() {
        use crate::hotkey::{HotKey, HotState};
        let hot = |k: &str| HotKey {
            key: k.as_bytes().to_vec(),
            reads_per_sec: 300.0,
            writes_per_sec: 0.0,
            share: 0.1,
            state: HotState::Hot,
            since_unix_ms: 0,
            read_state: Some(HotState::Hot),
            write_state: None,
        };
        let snap = HotSnapshot {
            keys: vec![hot("a1")],
            read_rates: Arc::new(vec![
                (b"a1".to_vec().into(), 300.0),
                (b"b1".to_vec().into(), 200.0),
                (b"a2".to_vec().into(), 100.0),
                (b"lock".to_vec().into(), 90.0),
            ]),
            ..Default::default()
        };
        let k = node_keys(&snap, 2, |k| usize::from(k[0] == b'b'), |k| k != b"lock");
        assert_eq!(k[0].hot, vec![300.0]);
        assert_eq!(k[0].cold, vec![100.0]);
        assert_eq!(k[1].cold, vec![200.0]);
    }
}
