//! The read-hot cache: reply bytes of read commands on read-hot keys, keyed by key and full
//! command, filled at most once at a time per command, and never stale after a write.
//!
//! Storage and eviction are `store`'s: one bucket per key, bounded by bytes, evicting by the
//! node time a bucket saves per byte (the cost of a reply is the caller's estimate, given to
//! `with_cost`). Buckets are immutable (a fill builds a new one), so the weight and the byte
//! gauge always see what is stored.
//!
//! Single-flight is ours for three reasons: a fill that raced with a write must still answer
//! its own callers but must not be stored; stale-while-revalidate serves the old entry while
//! one refresh runs; and an error reply (`-ERR ...`) is a successful fetch that must not be
//! cached.
//! In-flight fills live in a small sharded map; `invalidate(key)` detaches and marks the
//! key's fills under the same shard lock that a completing fill takes to store its reply, so
//! "stored, then invalidated" and "invalidated, then discarded" are the only two orders.
//!
//! A fill runs as its own task: if the caller that started it goes away (client closed),
//! the callers waiting on it still get the reply.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

pub use super::store::Tallied;
use super::store::{lock, splitmix, Bucket, Store, Stored, Tally};

use crate::backend::BackendError;
pub use crate::metrics::CacheMetrics;
use crate::rules::CachePolicy;

const SHARDS: usize = 16;
/// A key read with many different commands (HGET over thousands of fields) keeps only this
/// many: a bucket is copied on every fill, so it must stay small.
const MAX_REQUESTS_PER_KEY: usize = 64;
/// Bookkeeping bytes per entry beyond key, request and reply (Arc, Bytes headers, times).
const ENTRY_OVERHEAD: u64 = 96;

/// Why entries were dropped (each has its own counter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    /// A write through this proxy.
    Write,
    /// Redis said the key changed (client-side-caching invalidation).
    Tracking,
    /// Tracking was lost, or FLUSHALL / FLUSHDB.
    Flush,
}

/// Why a read through the cache got no reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FillError {
    /// The fill's call to its node failed (the node is named).
    #[error(transparent)]
    Node(#[from] BackendError),
    /// The fill ended without a result: it failed (panicked or was aborted), vanished or
    /// was abandoned while a caller waited for it.
    #[error("cache fill {0}")]
    Lost(&'static str),
}

/// What a fill, or a caller waiting for another's, gets.
pub type FillReply = Result<Bytes, FillError>;

type FillResult = Option<FillReply>;

struct Flight {
    tx: watch::Sender<FillResult>,
    /// Set by an invalidation: the result answers its callers but is not stored.
    discarded: AtomicBool,
}

/// In-flight fills of the keys that hash to this shard: key -> (request, fill); and the
/// figures of the keys cached or filled since the last `take_tallies`.
#[derive(Default)]
struct Shard {
    flights: HashMap<Bytes, Vec<(Bytes, Arc<Flight>)>>,
    tallies: HashMap<Bytes, Arc<Tally>>,
}

impl Shard {
    fn tally(&mut self, key: &Bytes) -> &Arc<Tally> {
        self.tallies.entry(key.clone()).or_default()
    }
}

struct Inner {
    store: Store,
    shards: Vec<Mutex<Shard>>,
    flights: AtomicI64,
    unit: u64,
    max_reply: u64,
    /// The node's estimated microseconds to answer a command with this reply.
    cost: fn(&[u8]) -> u64,
    rng: AtomicU64,
    metrics: CacheMetrics,
}

/// The proxy's read cache. Shared by every session.
pub struct Cache {
    inner: Arc<Inner>,
}

/// A cached reply found, with what serving it saves.
struct Hit {
    reply: Bytes,
    bucket: Arc<Bucket>,
    cost_us: u64,
}

impl Hit {
    /// The reply, counting the node time it saves in its bucket and in the metric.
    fn served(self, m: &CacheMetrics) -> Bytes {
        self.bucket.hit(self.reply.len(), self.cost_us);
        m.node_seconds_saved.inc_by(self.cost_us as f64 / 1e6);
        self.reply
    }
}

enum Lookup {
    Fresh(Hit),
    Stale(Hit),
    Miss,
}

impl Cache {
    /// A cache in which every reply costs the same to fetch (eviction by hits per byte).
    pub fn new(max_entries: u64, max_bytes: u64, metrics: CacheMetrics) -> Arc<Cache> {
        Cache::with_cost(max_entries, max_bytes, metrics, |_| 1)
    }

    /// A cache that keeps the replies saving the most node time per byte, as `cost`
    /// estimates it from a reply.
    pub fn with_cost(
        max_entries: u64,
        max_bytes: u64,
        metrics: CacheMetrics,
        cost: fn(&[u8]) -> u64,
    ) -> Arc<Cache> {
        let unit = (max_bytes / max_entries.max(1)).max(1);
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x5eed);
        Arc::new(Cache {
            inner: Arc::new(Inner {
                store: Store::new(max_bytes, metrics.clone()),
                shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
                flights: AtomicI64::new(0),
                unit,
                // One reply may not take more than an eighth of the cache.
                max_reply: (max_bytes / 8).min(u32::MAX as u64),
                cost,
                rng: AtomicU64::new(seed),
                metrics,
            }),
        })
    }

    /// The cached reply for (key, request), filling it with `fill` on a miss. At most one
    /// fill per (key, request) is in flight: concurrent callers wait for it (up to
    /// `wait_timeout`, then fetch for themselves) and get its result, errors included. A
    /// failed fill or an error reply is not stored. Within `stale_while_revalidate_ms` past
    /// expiry, callers get the old reply at once while one refresh runs. A fill that an
    /// `invalidate` overtook answers its callers but is not stored.
    ///
    /// `request` identifies the command (its wire bytes); it must also tell databases apart
    /// if the cache serves more than one.
    pub async fn get_or_fill<F, Fut>(
        &self,
        key: &Bytes,
        request: &Bytes,
        policy: &CachePolicy,
        wait_timeout: Duration,
        fill: F,
    ) -> FillReply
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = FillReply> + Send + 'static,
    {
        if !policy.enabled {
            return fill().await;
        }
        let m = &self.inner.metrics;
        if let Lookup::Fresh(hit) = self.inner.lookup(key, request) {
            m.hits.inc();
            return Ok(hit.served(m));
        }
        let mut fill = Some(fill);
        let (mut rx, leader) = {
            let mut shard = self.inner.shard(key);
            // Looked up again under the lock: a fill may have stored its reply meanwhile.
            let stale = match self.inner.lookup(key, request) {
                Lookup::Fresh(hit) => {
                    m.hits.inc();
                    return Ok(hit.served(m));
                }
                Lookup::Stale(hit) => Some(hit),
                Lookup::Miss => None,
            };
            let existing = shard
                .flights
                .get(key)
                .and_then(|v| v.iter().find(|(r, _)| r == request))
                .map(|(_, f)| f.clone());
            let (rx, leader) = match existing {
                Some(f) => {
                    // Served by another's fill: a read the node does not see.
                    shard.tally(key).hit(0, 0);
                    (f.tx.subscribe(), false)
                }
                None => {
                    let (tx, rx) = watch::channel(None);
                    let flight = Arc::new(Flight {
                        tx,
                        discarded: AtomicBool::new(false),
                    });
                    shard
                        .flights
                        .entry(key.clone())
                        .or_default()
                        .push((request.clone(), flight.clone()));
                    self.inner.flights.fetch_add(1, Ordering::SeqCst);
                    let done = Completion {
                        inner: self.inner.clone(),
                        key: key.clone(),
                        request: request.clone(),
                        policy: *policy,
                        flight,
                        result: None,
                    };
                    let f = fill.take().expect("fill is used once");
                    tokio::spawn(run_fill(done, f));
                    (rx, true)
                }
            };
            if let Some(hit) = stale {
                m.stale_served.inc();
                return Ok(hit.served(m));
            }
            (rx, leader)
        };
        if leader {
            m.misses.inc();
        } else {
            m.coalesced.inc();
        }
        let wait = async {
            match rx.wait_for(|r| r.is_some()).await {
                Ok(r) => r.clone().unwrap_or(Err(FillError::Lost("vanished"))),
                Err(_) => Err(FillError::Lost("abandoned")),
            }
        };
        match fill.take() {
            // The leader's fill is bounded by the backend's own request timeout.
            None => wait.await,
            Some(own) => match tokio::time::timeout(wait_timeout, wait).await {
                Ok(r) => r,
                Err(_) => {
                    m.wait_timeouts.inc();
                    own().await
                }
            },
        }
    }

    /// Drops every entry of `key` and discards its fills in flight.
    /// A fresh cached reply, without waiting for anything: the hit path, which the session
    /// answers in place instead of spawning a fill task (measured: spawning per hit cost the
    /// cache-on runs of bench/read_hot.sh up to 14% of throughput). Counts a hit.
    pub fn get_fresh(&self, key: &[u8], request: &[u8]) -> Option<Bytes> {
        match self.inner.lookup(key, request) {
            Lookup::Fresh(hit) => {
                self.inner.metrics.hits.inc();
                Some(hit.served(&self.inner.metrics))
            }
            _ => None,
        }
    }

    pub fn invalidate(&self, key: &[u8], cause: Cause) {
        let mut shard = self.inner.shard(key);
        let mut hit = false;
        if let Some(flights) = shard.flights.remove(key) {
            hit = true;
            for (_, f) in flights {
                f.discarded.store(true, Ordering::SeqCst);
            }
        }
        hit |= self.inner.store.remove(key);
        if hit {
            if let Some(t) = shard.tallies.get(key) {
                t.invalidated();
            }
        }
        drop(shard);
        if hit {
            self.count(cause, 1);
        }
    }

    /// Each key's figures since the last call (keys with none are left out), and a fresh
    /// start; a key neither cached nor read since is forgotten.
    pub fn take_tallies(&self) -> Vec<(Bytes, Tallied)> {
        let mut out = Vec::new();
        for s in &self.inner.shards {
            let mut shard = lock(s);
            shard.tallies.retain(|k, t| {
                let f = t.take();
                let kept = !f.is_empty() || Arc::strong_count(t) > 1;
                if !f.is_empty() {
                    out.push((k.clone(), f));
                }
                kept
            });
        }
        out
    }

    /// Drops everything: tracking was lost, or FLUSHALL / FLUSHDB.
    pub fn invalidate_all(&self, cause: Cause) {
        self.invalidate_matching(|_| true, cause);
    }

    /// Drops every key for which `pred` holds (a node's keys when its tracking is lost).
    pub fn invalidate_matching(&self, pred: impl Fn(&[u8]) -> bool, cause: Cause) {
        // Every shard locked, in order: no fill can store while we sweep.
        let mut shards: Vec<MutexGuard<'_, Shard>> =
            (0..SHARDS).map(|i| lock(&self.inner.shards[i])).collect();
        let mut n = 0u64;
        for shard in shards.iter_mut() {
            shard.flights.retain(|k, flights| {
                if !pred(k) {
                    return true;
                }
                for (_, f) in flights.iter() {
                    f.discarded.store(true, Ordering::SeqCst);
                }
                n += 1;
                false
            });
        }
        n += self.inner.store.remove_matching(&pred);
        drop(shards);
        self.count(cause, n);
    }

    /// True when nothing is cached or being filled: a write may skip `invalidate`.
    pub fn is_empty(&self) -> bool {
        self.inner.store.live() <= 0 && self.inner.flights.load(Ordering::SeqCst) <= 0
    }

    /// Evicts what is over the bound now (tests, and before reading exact gauges; every
    /// fill already does it).
    pub fn run_pending_tasks(&self) {
        self.inner.store.evict();
    }

    fn count(&self, cause: Cause, n: u64) {
        let m = &self.inner.metrics;
        match cause {
            Cause::Write => m.invalidations_write.inc_by(n),
            Cause::Tracking => m.invalidations_tracking.inc_by(n),
            Cause::Flush => m.invalidations_flush.inc_by(n),
        };
    }
}

impl Inner {
    fn shard(&self, key: &[u8]) -> MutexGuard<'_, Shard> {
        let i = xxhash_rust::xxh3::xxh3_64(key) as usize % SHARDS;
        lock(&self.shards[i])
    }

    fn lookup(&self, key: &[u8], request: &[u8]) -> Lookup {
        let Some(bucket) = self.store.get(key) else {
            return Lookup::Miss;
        };
        let Some(e) = bucket.entries.iter().find(|e| e.request == request) else {
            return Lookup::Miss;
        };
        let now = Instant::now();
        let fresh = now < e.fresh_until;
        if !fresh && now >= e.stale_until {
            return Lookup::Miss;
        }
        let (reply, cost_us) = (e.reply.clone(), e.cost_us);
        let hit = Hit {
            reply,
            bucket,
            cost_us,
        };
        if fresh {
            Lookup::Fresh(hit)
        } else {
            Lookup::Stale(hit)
        }
    }

    /// Stores a reply in a new bucket for its key. Called under the key's shard lock; the
    /// caller evicts once the lock is released.
    fn store_reply(
        &self,
        key: &Bytes,
        request: &Bytes,
        reply: &Bytes,
        policy: &CachePolicy,
        tally: Arc<Tally>,
    ) {
        let now = Instant::now();
        let fresh_until = now + self.ttl(policy);
        let stale_until = fresh_until + Duration::from_millis(policy.stale_while_revalidate_ms);
        let mut entries: Vec<Stored> = match self.store.get(key.as_ref()) {
            Some(old) => old
                .entries
                .iter()
                .filter(|e| e.request != request && e.stale_until > now)
                .cloned()
                .collect(),
            None => Vec::new(),
        };
        if entries.len() >= MAX_REQUESTS_PER_KEY {
            // Make room by dropping the entry closest to its end.
            if let Some(i) = (0..entries.len()).min_by_key(|&i| entries[i].stale_until) {
                entries.swap_remove(i);
            }
        }
        entries.push(Stored {
            request: request.clone(),
            reply: reply.clone(),
            fresh_until,
            stale_until,
            cost_us: (self.cost)(reply),
        });
        let bucket = Bucket::new(entries, key.len(), self.unit, ENTRY_OVERHEAD, tally);
        self.store.insert(key.clone(), bucket);
    }

    /// `ttl_ms * (1 +/- jitter_pct/100)`, uniform, so entries filled together do not all
    /// expire together.
    fn ttl(&self, policy: &CachePolicy) -> Duration {
        jittered(policy, self.next_unit())
    }

    /// A uniform draw in [0, 1): splitmix64 over an atomic counter, lock-free.
    fn next_unit(&self) -> f64 {
        let z = splitmix(self.rng.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed));
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn jittered(policy: &CachePolicy, u: f64) -> Duration {
    let base_us = policy.ttl_ms as f64 * 1000.0;
    let j = f64::from(policy.jitter_pct.min(100)) / 100.0;
    let us = base_us * (1.0 + j * (2.0 * u - 1.0));
    Duration::from_micros(us.max(0.0) as u64)
}

/// Finishes a fill when dropped, so a fill that panics or is aborted still wakes its
/// waiters (with an error) and leaves the in-flight map.
struct Completion {
    inner: Arc<Inner>,
    key: Bytes,
    request: Bytes,
    policy: CachePolicy,
    flight: Arc<Flight>,
    result: Option<FillReply>,
}

async fn run_fill<F, Fut>(mut done: Completion, fill: F)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = FillReply>,
{
    done.result = Some(fill().await);
}

impl Drop for Completion {
    fn drop(&mut self) {
        let res = self.result.take().unwrap_or(Err(FillError::Lost("failed")));
        {
            let mut shard = self.inner.shard(&self.key);
            if let Some(v) = shard.flights.get_mut(&self.key) {
                v.retain(|(_, f)| !Arc::ptr_eq(f, &self.flight));
                if v.is_empty() {
                    shard.flights.remove(&self.key);
                }
            }
            let tally = shard.tally(&self.key).clone();
            tally.fill();
            if let Ok(reply) = &res {
                if !self.flight.discarded.load(Ordering::SeqCst)
                    && !reply.starts_with(b"-")
                    && (reply.len() as u64) <= self.inner.max_reply
                {
                    self.inner
                        .store_reply(&self.key, &self.request, reply, &self.policy, tally);
                }
            }
        }
        self.inner.store.evict();
        // After the store: a writer that saw no fill in flight also sees the entry.
        self.inner.flights.fetch_sub(1, Ordering::SeqCst);
        self.flight.tx.send_replace(Some(res));
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "cache_eviction_tests.rs"]
mod eviction_tests;
