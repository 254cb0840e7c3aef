//! The read cache's store: one *bucket* per key (every cached command of that key, so a
//! write drops them all with one removal), sharded, bounded by weight, evicting by the node
//! time a bucket saves per byte it holds.
//!
//! Why our own and not moka, which held the cache until 2026-12-04: moka's TinyLFU admits
//! and evicts by how often a key is read, so a ZRANGE of 100,000 members that costs its node
//! 8 ms per call (bench/README.md, "Hot by cost") ranked below a 10-byte GET read a little
//! more often, and it has no place for the cost of a miss. `bench/cache_cost.py` measures the
//! difference: under the same pressure the node spent far less time on the costly replies
//! with this store (figures in bench/README.md, "Eviction by cost saved").
//!
//! Eviction is Greedy-Dual-Size-Frequency (Cherkasova, 1998), approximated by sampling the
//! way Redis approximates LRU (`maxmemory-samples`): while the store is over its weight,
//! `SAMPLES` buckets drawn at random (every bucket, while there are few) are compared and
//! the lowest goes. A bucket's priority
//! is `L + (saved + cost) / weight`: the node microseconds its hits saved so far plus what
//! one fill costs, per byte it holds, raised by `L`, the priority of the last bucket evicted
//! before it was stored, so that a key no longer read ages out behind newer ones. A bucket
//! past its stale window goes before anything else.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use tokio::time::Instant;

use crate::metrics::CacheMetrics;

const SHARDS: usize = 16;
/// Buckets compared per eviction (Redis's `maxmemory-samples` default is 5).
const SAMPLES: usize = 5;
/// Up to this many entries, eviction compares every bucket.
const EXACT_BELOW: i64 = 64;

/// One cached command of a key.
#[derive(Clone)]
pub struct Stored {
    pub request: Bytes,
    pub reply: Bytes,
    pub fresh_until: Instant,
    pub stale_until: Instant,
    /// The node's estimated microseconds to answer it: what a hit saves.
    pub cost_us: u64,
}

/// Every cached command of one key. Immutable but for its saved time: a fill builds a new one.
pub struct Bucket {
    pub entries: Vec<Stored>,
    /// Real bytes, for the gauge.
    pub bytes: u64,
    /// Bytes, with each entry counted as at least the store's unit, so that a bound on
    /// weight also bounds the entry count.
    weight: u64,
    /// One fill of every entry, in node microseconds.
    cost_us: u64,
    /// When the last entry's stale window ends.
    until: Instant,
    /// The store's level when the bucket was stored.
    base: f64,
    /// Node microseconds its hits saved (carried, halved, into the bucket that replaces it).
    saved_us: AtomicU64,
    /// The key's figures for the window (`Tally`), shared with the buckets before and
    /// after it.
    pub tally: Arc<Tally>,
}

/// What one cached key saved its node and cost it since the last `Tally::take`: counted
/// by hits (on the bucket's `Arc`, without a lock) and by fills and invalidations (under
/// the cache's shard lock).
#[derive(Default, Debug)]
pub struct Tally {
    hits: AtomicU64,
    hit_bytes: AtomicU64,
    saved_us: AtomicU64,
    fills: AtomicU64,
    invalidations: AtomicU64,
}

/// A `Tally` read and reset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tallied {
    /// Reads answered without the node: fresh and stale hits, and callers that waited on
    /// another's fill.
    pub hits: u64,
    /// Reply bytes the node did not send for the hits (a caller that waited on a fill
    /// counts as a read saved, not in bytes or time: its reply was not known yet).
    pub hit_bytes: u64,
    /// The node microseconds the hits would have cost (the reply's estimate).
    pub saved_us: u64,
    /// Fills sent to the node.
    pub fills: u64,
    /// Times a write or a tracking message dropped the key's entries or its fills.
    pub invalidations: u64,
}

impl Tally {
    pub fn hit(&self, bytes: usize, cost_us: u64) {
        self.hits.fetch_add(1, Ordering::Relaxed);
        self.hit_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.saved_us.fetch_add(cost_us, Ordering::Relaxed);
    }

    pub fn fill(&self) {
        self.fills.fetch_add(1, Ordering::Relaxed);
    }

    pub fn invalidated(&self) {
        self.invalidations.fetch_add(1, Ordering::Relaxed);
    }

    /// The figures since the last call, and a fresh start.
    pub fn take(&self) -> Tallied {
        let t = |a: &AtomicU64| a.swap(0, Ordering::Relaxed);
        Tallied {
            hits: t(&self.hits),
            hit_bytes: t(&self.hit_bytes),
            saved_us: t(&self.saved_us),
            fills: t(&self.fills),
            invalidations: t(&self.invalidations),
        }
    }
}

impl Tallied {
    pub fn is_empty(&self) -> bool {
        *self == Tallied::default()
    }
}

impl Bucket {
    pub fn new(
        entries: Vec<Stored>,
        key_len: usize,
        unit: u64,
        overhead: u64,
        tally: Arc<Tally>,
    ) -> Bucket {
        let (mut bytes, mut weight, mut cost_us) = (0u64, 0u64, 0u64);
        let mut until = None::<Instant>;
        for e in &entries {
            let b = (key_len + e.request.len() + e.reply.len()) as u64 + overhead;
            bytes += b;
            weight += b.max(unit);
            cost_us += e.cost_us;
            until = Some(until.map_or(e.stale_until, |u| u.max(e.stale_until)));
        }
        Bucket {
            entries,
            bytes,
            weight: weight.max(1),
            cost_us,
            until: until.unwrap_or_else(Instant::now),
            base: 0.0,
            saved_us: AtomicU64::new(0),
            tally,
        }
    }

    /// Notes a hit on an entry costing `cost_us`, with a reply of `bytes`.
    pub fn hit(&self, bytes: usize, cost_us: u64) {
        self.saved_us.fetch_add(cost_us, Ordering::Relaxed);
        self.tally.hit(bytes, cost_us);
    }

    fn priority(&self, now: Instant) -> f64 {
        if now >= self.until {
            return f64::NEG_INFINITY;
        }
        let saved = self.saved_us.load(Ordering::Relaxed) + self.cost_us;
        self.base + saved as f64 / self.weight as f64
    }
}

/// One shard: buckets in a vector (so one can be drawn at random) with an index by key.
#[derive(Default)]
struct Slots {
    slots: Vec<(Bytes, Arc<Bucket>)>,
    index: HashMap<Bytes, usize>,
}

impl Slots {
    fn get(&self, key: &[u8]) -> Option<&Arc<Bucket>> {
        self.index.get(key).map(|&i| &self.slots[i].1)
    }

    fn put(&mut self, key: Bytes, b: Arc<Bucket>) -> Option<Arc<Bucket>> {
        match self.index.get(&key) {
            Some(&i) => Some(std::mem::replace(&mut self.slots[i].1, b)),
            None => {
                self.index.insert(key.clone(), self.slots.len());
                self.slots.push((key, b));
                None
            }
        }
    }

    fn take(&mut self, key: &[u8]) -> Option<Arc<Bucket>> {
        let i = self.index.remove(key)?;
        let (_, b) = self.slots.swap_remove(i);
        if let Some((moved, _)) = self.slots.get(i) {
            self.index.insert(moved.clone(), i);
        }
        Some(b)
    }
}

pub struct Store {
    shards: Vec<Mutex<Slots>>,
    max_weight: u64,
    used: AtomicU64,
    /// GDSF's L, as f64 bits.
    level: AtomicU64,
    /// Entries stored: `Cache::is_empty` reads it.
    live: AtomicI64,
    rng: AtomicU64,
    metrics: CacheMetrics,
}

impl Store {
    pub fn new(max_weight: u64, metrics: CacheMetrics) -> Store {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x5eed);
        Store {
            shards: (0..SHARDS).map(|_| Mutex::new(Slots::default())).collect(),
            max_weight,
            used: AtomicU64::new(0),
            level: AtomicU64::new(0f64.to_bits()),
            live: AtomicI64::new(0),
            rng: AtomicU64::new(seed),
            metrics,
        }
    }

    fn shard(&self, key: &[u8]) -> MutexGuard<'_, Slots> {
        lock(&self.shards[xxhash_rust::xxh3::xxh3_64(key) as usize % SHARDS])
    }

    /// The key's bucket, unless its stale window has ended (it is then dropped).
    pub fn get(&self, key: &[u8]) -> Option<Arc<Bucket>> {
        let mut shard = self.shard(key);
        let b = shard.get(key)?;
        if Instant::now() < b.until {
            return Some(b.clone());
        }
        let gone = shard.take(key);
        drop(shard);
        gone.inspect(|b| self.removed(b))
    }

    /// Stores `b` for `key`, replacing its bucket (whose saved time it inherits, halved).
    /// Does not evict: `evict` does, outside the caller's locks.
    pub fn insert(&self, key: Bytes, mut b: Bucket) {
        b.base = f64::from_bits(self.level.load(Ordering::Relaxed));
        let n = b.entries.len() as i64;
        // Counted before the insert, as the gauges must never go below what is stored.
        self.live.fetch_add(n, Ordering::SeqCst);
        self.metrics.entries.inc_by(n);
        self.metrics.bytes.inc_by(b.bytes as i64);
        self.used.fetch_add(b.weight, Ordering::SeqCst);
        let mut shard = self.shard(&key);
        if let Some(old) = shard.get(&key) {
            b.saved_us = AtomicU64::new(old.saved_us.load(Ordering::Relaxed) / 2);
        }
        let old = shard.put(key, Arc::new(b));
        drop(shard);
        if let Some(old) = old {
            self.removed(&old);
        }
    }

    pub fn remove(&self, key: &[u8]) -> bool {
        let gone = self.shard(key).take(key);
        gone.inspect(|b| self.removed(b)).is_some()
    }

    /// Drops every key for which `pred` holds; returns how many.
    pub fn remove_matching(&self, pred: &impl Fn(&[u8]) -> bool) -> u64 {
        let mut n = 0;
        for s in &self.shards {
            let mut shard = lock(s);
            let keys: Vec<Bytes> = shard
                .slots
                .iter()
                .filter(|(k, _)| pred(k))
                .map(|(k, _)| k.clone())
                .collect();
            for k in keys {
                if let Some(b) = shard.take(&k) {
                    self.removed(&b);
                    n += 1;
                }
            }
        }
        n
    }

    /// Evicts the lowest of `SAMPLES` random buckets until the store is within its weight.
    pub fn evict(&self) {
        while self.used.load(Ordering::SeqCst) > self.max_weight {
            let now = Instant::now();
            let mut low: Option<(f64, usize, Bytes, Arc<Bucket>)> = None;
            let mut keep_lower = |p: f64, s: usize, k: &Bytes, b: &Arc<Bucket>| {
                if low.as_ref().is_none_or(|l| p < l.0) {
                    low = Some((p, s, k.clone(), b.clone()));
                }
            };
            if self.live() <= EXACT_BELOW {
                // Few buckets: compare them all (samples would mostly find empty shards).
                for (s, shard) in self.shards.iter().enumerate() {
                    for (k, b) in &lock(shard).slots {
                        keep_lower(b.priority(now), s, k, b);
                    }
                }
            } else {
                let mut found = 0;
                for _ in 0..4 * SAMPLES {
                    let s = (self.draw() % SHARDS as u64) as usize;
                    if let Some((p, k, b)) = self.sample(s, now) {
                        keep_lower(p, s, &k, &b);
                        found += 1;
                        if found == SAMPLES {
                            break;
                        }
                    }
                }
            }
            let Some((p, s, key, b)) = low else { return };
            let mut shard = lock(&self.shards[s]);
            if !shard.get(&key).is_some_and(|cur| Arc::ptr_eq(cur, &b)) {
                continue; // replaced or removed meanwhile: draw again
            }
            shard.take(&key);
            drop(shard);
            self.removed(&b);
            self.metrics.evictions.inc();
            if p.is_finite() {
                let level = f64::from_bits(self.level.load(Ordering::Relaxed));
                if p > level {
                    self.level.store(p.to_bits(), Ordering::Relaxed);
                }
            }
        }
    }

    /// A random bucket of shard `s`, with its priority.
    fn sample(&self, s: usize, now: Instant) -> Option<(f64, Bytes, Arc<Bucket>)> {
        let shard = lock(&self.shards[s]);
        if shard.slots.is_empty() {
            return None;
        }
        let (k, b) = &shard.slots[(self.draw() % shard.slots.len() as u64) as usize];
        Some((b.priority(now), k.clone(), b.clone()))
    }

    pub fn live(&self) -> i64 {
        self.live.load(Ordering::SeqCst)
    }

    /// The weight stored (tests).
    #[cfg(test)]
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::SeqCst)
    }

    /// Every bucket's key and real bytes (tests).
    #[cfg(test)]
    pub fn buckets(&self) -> Vec<(Bytes, u64)> {
        let mut out = Vec::new();
        for s in &self.shards {
            out.extend(lock(s).slots.iter().map(|(k, b)| (k.clone(), b.bytes)));
        }
        out
    }

    fn removed(&self, b: &Bucket) {
        let n = b.entries.len() as i64;
        self.live.fetch_sub(n, Ordering::SeqCst);
        self.metrics.entries.dec_by(n);
        self.metrics.bytes.dec_by(b.bytes as i64);
        self.used.fetch_sub(b.weight, Ordering::SeqCst);
    }

    /// splitmix64 over an atomic counter: lock-free, good enough to draw samples.
    fn draw(&self) -> u64 {
        splitmix(self.rng.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed))
    }
}

pub fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
