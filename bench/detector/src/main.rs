//! Detector benchmark: saltshaker's hot-key detector against exact counts. Measures accuracy on
//! Zipf streams, detection latency of a key that jumps to 10x its threshold, false reports on
//! uniform streams, a hot set that changes halfway, cost per observation and memory per
//! thread. Prints Markdown tables for bench/README.md.
//!
//! Simulated runs drive the detector's manual clock at 1M observations per second of detector
//! time, so results do not depend on machine load; the real-time runs use the system clock.

mod keys;

use std::collections::{HashMap, HashSet};
use std::hint::black_box;
use std::time::{Duration, Instant};

use keys::{decode, encode, key_id, zipf_probability};
use saltshaker::hotkey::{
    Clock, Detector, DetectorConfig, HotSnapshot, HotState, Kind, ManualClock, SKETCH_BYTES,
};
use saltshaker::loadgen::{Rng, Zipf};

const PER_MS: u64 = 1000;

/// The benchmark's Zipf parameters are constants, all valid.
fn zipf(n: u64, s: f64) -> Zipf {
    Zipf::new(n, s).expect("Zipf parameters are valid")
}

/// A detector on a manual clock that advances 1 ms every `PER_MS` observations.
struct Sim {
    det: Detector,
    clock: ManualClock,
    t_ms: u64,
    in_ms: u64,
}

impl Sim {
    fn new(cfg: DetectorConfig) -> Self {
        let clock = ManualClock::new();
        let det = Detector::with_clock(cfg, Clock::Manual(clock.clone()));
        Sim {
            det,
            clock,
            t_ms: 0,
            in_ms: 0,
        }
    }

    /// Counts one background observation; returns true when a millisecond has passed.
    fn tick(&mut self, key: &[u8]) -> bool {
        self.det.observe(key, Kind::Read);
        self.in_ms += 1;
        if self.in_ms < PER_MS {
            return false;
        }
        self.in_ms = 0;
        self.t_ms += 1;
        self.clock.set_ms(self.t_ms);
        true
    }

    /// Lets the window that just ended close and returns the snapshot.
    fn close(&self) -> HotSnapshot {
        self.det.flush_local();
        self.det.sync();
        self.det.snapshot()
    }
}

fn cfg(top_k: usize, hot: f64, cool: f64) -> DetectorConfig {
    DetectorConfig {
        top_k,
        read_hot_at_per_sec: hot,
        read_cool_below_per_sec: cool,
        ..DetectorConfig::default()
    }
}

fn hot_ids(snap: &HotSnapshot) -> HashSet<u64> {
    snap.keys
        .iter()
        .filter(|k| k.read_state == Some(HotState::Hot))
        .filter_map(|k| decode(&k.key))
        .collect()
}

#[derive(Default)]
struct Score {
    tp: u64,
    fp: u64,
    fn_: u64,
    max_rate_err: f64,
}

impl Score {
    fn add(&mut self, snap: &HotSnapshot, exact: &HashMap<u64, u32>, hot_count: u32) {
        let reported = hot_ids(snap);
        let truth: HashSet<u64> = exact
            .iter()
            .filter(|(_, &n)| n >= hot_count)
            .map(|(&id, _)| id)
            .collect();
        self.tp += reported.intersection(&truth).count() as u64;
        self.fp += reported.difference(&truth).count() as u64;
        self.fn_ += truth.difference(&reported).count() as u64;
        for k in &snap.keys {
            if let Some(n) = decode(&k.key).and_then(|id| exact.get(&id)) {
                let err = (k.reads_per_sec - f64::from(*n)).abs() / f64::from(*n);
                self.max_rate_err = self.max_rate_err.max(err);
            }
        }
    }

    fn precision(&self) -> f64 {
        self.tp as f64 / (self.tp + self.fp).max(1) as f64
    }

    fn recall(&self) -> f64 {
        self.tp as f64 / (self.tp + self.fn_).max(1) as f64
    }
}

/// Precision and recall of the hot set (threshold 0.1% of traffic) against exact window counts.
fn accuracy(s: f64, n: u64, top_k: usize, windows: u64) -> (Score, f64) {
    let hot = PER_MS as f64; // 0.1% of 1M/s
    let mut sim = Sim::new(cfg(top_k, hot, hot));
    let (z, mut rng, mut buf) = (zipf(n, s), Rng::new(n ^ top_k as u64), [0u8; 20]);
    let mut score = Score::default();
    let mut exact: HashMap<u64, u32> = HashMap::new();
    let mut truth_keys = 0.0;
    for w in 0..windows {
        exact.clear();
        for _ in 0..1000 * PER_MS {
            let id = key_id(z.sample(&mut rng), 0);
            sim.tick(encode(id, &mut buf));
            *exact.entry(id).or_default() += 1;
        }
        let snap = sim.close();
        if w > 0 {
            score.add(&snap, &exact, hot as u32);
            truth_keys += exact.values().filter(|&&c| c >= hot as u32).count() as f64;
        }
    }
    (score, truth_keys / (windows - 1) as f64)
}

/// Detector-time ms from a key jumping to 10x the default threshold until it is listed hot.
fn jump_latency(offset_ms: u64) -> Option<u64> {
    let mut sim = Sim::new(DetectorConfig::default());
    let (z, mut rng, mut buf) = (zipf(1_000_000, 0.99), Rng::new(offset_ms), [0u8; 20]);
    let rx = sim.det.subscribe();
    let viral = key_id(0, 7);
    let jump_at = 3000 + offset_ms;
    let mut vbuf = [0u8; 20];
    let vkey = encode(viral, &mut vbuf).to_vec();
    while sim.t_ms < jump_at + 1000 {
        // 20 per ms = 20k/s = 10x the 2000/s threshold, spread over the millisecond.
        if sim.t_ms >= jump_at && sim.in_ms % 50 == 0 {
            sim.det.observe(&vkey, Kind::Read);
        }
        let id = key_id(z.sample(&mut rng), 0);
        if sim.tick(encode(id, &mut buf)) && sim.t_ms > jump_at {
            sim.det.sync();
            if hot_ids(&rx.borrow()).contains(&viral) {
                return Some(sim.t_ms - jump_at);
            }
        }
    }
    None
}

/// The same in real time: background at 1M/s, the viral key at 20k/s, system clock.
fn realtime_jump(jump_after: Duration) -> Option<f64> {
    let det = Detector::new(DetectorConfig::default());
    let rx = det.subscribe();
    let viral = key_id(0, 9);
    let start = Instant::now();
    let feeder = {
        let det = det.clone();
        std::thread::spawn(move || {
            let (z, mut rng, mut buf, mut vbuf) =
                (zipf(1_000_000, 0.99), Rng::new(5), [0u8; 20], [0u8; 20]);
            let (mut bg, mut vi) = (0u64, 0u64);
            while start.elapsed() < jump_after + Duration::from_millis(1000) {
                let us = start.elapsed().as_micros() as u64;
                while bg < us {
                    det.observe(encode(key_id(z.sample(&mut rng), 0), &mut buf), Kind::Read);
                    bg += 1;
                }
                let since = us.saturating_sub(jump_after.as_micros() as u64);
                while us >= jump_after.as_micros() as u64 && vi < since / 50 {
                    det.observe(encode(viral, &mut vbuf), Kind::Read);
                    vi += 1;
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let mut found = None;
    while start.elapsed() < jump_after + Duration::from_millis(1000) {
        let el = start.elapsed();
        if el >= jump_after && found.is_none() && hot_ids(&rx.borrow()).contains(&viral) {
            found = Some((el - jump_after).as_secs_f64() * 1000.0);
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    let _ = feeder.join();
    found
}

/// Most keys listed at any check over a uniform stream of `keys` keys at 1M/s.
fn uniform(keys: u64, hot: f64, windows: u64) -> usize {
    let mut sim = Sim::new(cfg(64, hot, hot / 4.0));
    let (mut rng, mut buf, mut most) = (Rng::new(keys), [0u8; 20], 0);
    for _ in 0..windows {
        for _ in 0..1000 * PER_MS {
            if sim.tick(encode(key_id(rng.below(keys) + 1, 3), &mut buf)) && sim.t_ms % 10 == 0 {
                sim.det.sync();
                most = most.max(sim.det.snapshot().keys.len());
            }
        }
        most = most.max(sim.close().keys.len());
    }
    most
}

/// The hot set moves at the start of window 5: per window, precision, recall and old keys
/// still listed; and how long until every new key above 10x the threshold was listed.
fn hot_set_change() -> (Vec<(u64, Score, usize)>, Option<u64>) {
    let hot = PER_MS as f64;
    let mut sim = Sim::new(cfg(128, hot, hot / 4.0));
    let (z, mut rng, mut buf) = (zipf(1_000_000, 0.99), Rng::new(11), [0u8; 20]);
    let (mut rows, mut all_new_at) = (Vec::new(), None);
    let mut exact: HashMap<u64, u32> = HashMap::new();
    // Ranks whose expected rate is >= 10x the threshold.
    let big: Vec<u64> = (1..100)
        .filter(|&r| zipf_probability(1_000_000, 0.99, r) >= 0.01)
        .map(|r| key_id(r, 1))
        .collect();
    let old_top: HashSet<u64> = (1..10_000).map(|r| key_id(r, 0)).collect();
    for w in 0..9u64 {
        let phase = u64::from(w >= 5);
        exact.clear();
        for _ in 0..1000 * PER_MS {
            let id = key_id(z.sample(&mut rng), phase);
            *exact.entry(id).or_default() += 1;
            if sim.tick(encode(id, &mut buf)) && w == 5 && all_new_at.is_none() && sim.t_ms % 5 == 0
            {
                sim.det.sync();
                let listed = hot_ids(&sim.det.snapshot());
                if big.iter().all(|id| listed.contains(id)) {
                    all_new_at = Some(sim.t_ms - 5000);
                }
            }
        }
        let snap = sim.close();
        if w >= 3 {
            let mut score = Score::default();
            score.add(&snap, &exact, hot as u32);
            let old_listed = snap
                .keys
                .iter()
                .filter_map(|k| decode(&k.key))
                .filter(|id| old_top.contains(id))
                .count();
            rows.push((w, score, if w >= 5 { old_listed } else { 0 }));
        }
    }
    (rows, all_new_at)
}

fn ids(n: usize, mut gen: impl FnMut() -> u64) -> Vec<u64> {
    (0..n).map(|_| gen()).collect()
}

/// CPU time this thread has run, in ns (Linux schedstat), so other processes sharing the
/// cores do not inflate the figures; falls back to wall time elsewhere.
fn cpu_ns() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| START.get_or_init(Instant::now).elapsed().as_nanos() as u64)
}

/// CPU nanoseconds per `observe`, key encoding subtracted. Keys are encoded eight
/// observations ahead into a ring: reading bytes just written one at a time would stall on
/// store forwarding, which a proxy reading keys out of a socket buffer never sees.
fn cost(det: &Detector, stream: &[u64]) -> f64 {
    const AHEAD: usize = 8;
    let mut ring = [[0u8; 20]; 16];
    let t = cpu_ns();
    for i in 0..stream.len() {
        if let Some(&id) = stream.get(i + AHEAD) {
            encode(id, &mut ring[(i + AHEAD) % 16]);
        }
        black_box(&ring[i % 16]);
    }
    let base = cpu_ns() - t;
    for (i, &id) in stream.iter().take(AHEAD).enumerate() {
        encode(id, &mut ring[i]);
    }
    let t = cpu_ns();
    for i in 0..stream.len() {
        if let Some(&id) = stream.get(i + AHEAD) {
            encode(id, &mut ring[(i + AHEAD) % 16]);
        }
        det.observe(&ring[i % 16], Kind::Read);
    }
    (cpu_ns() - t).saturating_sub(base) as f64 / stream.len() as f64
}

/// What `probabilistic-collections` does per insert: two SipHash passes, rows by double
/// hashing, plain update. Bare sketch, no top-k, no thread-local.
fn siphash_double_cost(stream: &[u64]) -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let (s1, s2) = (
        std::collections::hash_map::RandomState::new(),
        std::collections::hash_map::RandomState::new(),
    );
    let mut table = vec![0u32; 4 << 14];
    let mut ring = [[0u8; 20]; 16];
    let t = cpu_ns();
    for i in 0..stream.len() {
        if let Some(&id) = stream.get(i + 8) {
            encode(id, &mut ring[(i + 8) % 16]);
        }
        let key = &ring[i % 16][..];
        let (mut a, mut b) = (s1.build_hasher(), s2.build_hasher());
        a.write(key);
        b.write(key);
        let (h1, h2) = (a.finish(), b.finish());
        for i in 0..4u64 {
            let idx = (h1.wrapping_add(i.wrapping_mul(h2)) % (1 << 14)) as usize;
            table[(i as usize) << 14 | idx] += 1;
        }
    }
    black_box(&table);
    (cpu_ns() - t) as f64 / stream.len() as f64
}

fn main() {
    if std::env::args().any(|a| a == "floor") {
        // For `perf stat`: instructions and cycles per observe of one cached key.
        let det = Detector::new(DetectorConfig::default());
        let mut buf = [0u8; 20];
        let key = encode(key_id(1, 5), &mut buf).to_vec();
        for _ in 0..200_000_000 {
            det.observe(black_box(&key), Kind::Read);
        }
        return;
    }
    let only_cost = std::env::args().any(|a| a == "cost");
    if !only_cost {
        report_detection();
    }
    report_cost();
}

fn report_detection() {
    println!(
        "## Accuracy against exact counts (hot = 0.1% of traffic, 1M obs/s, 7 windows scored)\n"
    );
    println!(
        "| stream | distinct keys | top_k | keys >= 0.1% | precision | recall | max rate error |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (s, n) in [
        (0.99, 1_000_000),
        (0.99, 10_000_000),
        (1.2, 1_000_000),
        (1.2, 10_000_000),
    ] {
        for top_k in [64, 128] {
            let (sc, truth) = accuracy(s, n, top_k, 8);
            println!(
                "| Zipf({s}) | {n} | {top_k} | {truth:.1} | {:.4} | {:.4} | {:.2}% |",
                sc.precision(),
                sc.recall(),
                sc.max_rate_err * 100.0
            );
        }
    }

    println!("\n## A key jumping to 10x its threshold (default config, Zipf(0.99) background)\n");
    let offsets = [0, 50, 137, 250, 400, 500, 650, 800, 850, 900, 950, 990];
    let lat: Vec<Option<u64>> = offsets.iter().map(|&o| jump_latency(o)).collect();
    println!(
        "| jump at ms into window | {} |",
        offsets.map(|o| o.to_string()).join(" | ")
    );
    println!("|---|{}", "---|".repeat(offsets.len()));
    let cells: Vec<String> = lat
        .iter()
        .map(|l| l.map_or("missed".into(), |v| v.to_string()))
        .collect();
    println!(
        "| ms until listed hot (detector clock) | {} |",
        cells.join(" | ")
    );
    let rt: Vec<String> = [1300u64, 1650, 1960]
        .iter()
        .map(|&ms| {
            realtime_jump(Duration::from_millis(ms)).map_or("missed".into(), |v| format!("{v:.0}"))
        })
        .collect();
    println!(
        "\nReal time (system clock, jumps at 1300/1650/1960 ms): {} ms",
        rt.join(" / ")
    );

    println!("\n## Uniform streams (1M obs/s, 10 windows): most keys ever listed\n");
    println!("| keys | each key's rate | hot_at | most keys listed |");
    println!("|---|---|---|---|");
    for (keys, hot) in [(1000u64, 2000.0), (1000, 1200.0), (10_000_000, 2000.0)] {
        let most = uniform(keys, hot, 10);
        println!("| {keys} | {}/s | {hot}/s | {most} |", 1e6 / keys as f64);
    }

    println!("\n## Hot set changes at the start of window 5 (Zipf(0.99), 1M keys, top_k 128)\n");
    let (rows, all_new_at) = hot_set_change();
    println!("| window | precision | recall | keys of the old set still listed |");
    println!("|---|---|---|---|");
    for (w, sc, old) in rows {
        println!(
            "| {w} | {:.4} | {:.4} | {old} |",
            sc.precision(),
            sc.recall()
        );
    }
    println!(
        "\nEvery new key above 10x the threshold listed {} ms after the change.",
        all_new_at.map_or("never".into(), |v| v.to_string())
    );
}

fn report_cost() {
    println!("\n## Cost per observation (real clock, release build, thread CPU time)\n");
    let det = Detector::new(DetectorConfig::default());
    let n = 20_000_000;
    let z99 = zipf(1_000_000, 0.99);
    let z12 = zipf(10_000_000, 1.2);
    let mut rng = Rng::new(1);
    let s99 = ids(n, || key_id(z99.sample(&mut rng), 0));
    let s12 = ids(n, || key_id(z12.sample(&mut rng), 0));
    let uni = ids(n, || key_id(rng.below(10_000_000) + 1, 0));
    cost(&det, &s99[..1_000_000]); // warm up
    println!("| stream | ns per observe |");
    println!("|---|---|");
    println!("| Zipf(0.99), 1M keys | {:.1} |", cost(&det, &s99));
    println!("| Zipf(1.2), 10M keys | {:.1} |", cost(&det, &s12));
    println!("| uniform, 10M keys | {:.1} |", cost(&det, &uni));
    let one = vec![key_id(1, 5); n];
    println!(
        "| one key every time (all in L1: the compute floor) | {:.1} |",
        cost(&det, &one)
    );
    let small = ids(n, || key_id(rng.below(1000) + 1, 6));
    println!(
        "| uniform, 1000 keys (sketch cells cached) | {:.1} |",
        cost(&det, &small)
    );
    let two: Vec<f64> = std::thread::scope(|s| {
        let hs: Vec<_> = [&s99, &s12]
            .map(|st| {
                let det = det.clone();
                s.spawn(move || cost(&det, st))
            })
            .into_iter()
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or(f64::NAN))
            .collect()
    });
    println!(
        "| two threads at once (Zipf 0.99 / Zipf 1.2) | {:.1} / {:.1} |",
        two[0], two[1]
    );
    println!(
        "| bare sketch as probabilistic-collections does it (2x SipHash, double hashing) | {:.1} |",
        siphash_double_cost(&s99)
    );
    let bytes = det.local_memory_bytes();
    println!(
        "\nMemory per thread after {n} observations over 10M distinct keys: {bytes} bytes \
         ({:.2} MiB; sketches {} KiB)",
        bytes as f64 / (1 << 20) as f64,
        2 * SKETCH_BYTES / 1024
    );
}
