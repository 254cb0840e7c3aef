//! The hot set: the keys under mitigation now, rebuilt from each detector snapshot
//! (`HotSet::build_after`), and whether each mitigation pays the nodes: a cache whose
//! writes would turn its reads into fills, combining whose batches would carry one
//! increment, are declined here, with hysteresis.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::hotkey::{HotSnapshot, HotState};
use crate::rules::{CachePolicy, ClientCacheKeys, Rules, Strategy, WritePolicy};

/// Caching a key pays while its hits are at least twice its fills. Every write to a
/// cached key (through any proxy, or directly) drops its entries, and the next read
/// fills them again: with reads R and writes W per second, about min(W, R) of the reads
/// are fills, and for each the node serves the write, the fill and the tracking
/// invalidation, where without the cache it served the read alone. A key whose writes
/// would make a third of its reads fills is not cached (measured: on a 50% SET workload
/// the cache added 10-15% of node CPU, issue #45); it is cached again only below a quarter,
/// so a key near the line does not flap.
pub const DECLINE_FILL_SHARE: f64 = 1.0 / 3.0;
/// See `DECLINE_FILL_SHARE`.
pub const READMIT_FILL_SHARE: f64 = 0.25;

/// Combining pays while a key's batches carry at least this many increments per node
/// command: below it, the node still gets about one command per increment, and each
/// caller waited up to the window for nothing. Declined below it, combined again at
/// `RECOMBINE_PER_COMMAND` (the gap is the hysteresis).
pub const DECLINE_PER_COMMAND: f64 = 2.0;
/// See `DECLINE_PER_COMMAND`.
pub const RECOMBINE_PER_COMMAND: f64 = 2.5;

/// The fewest combine batches of a key, in one detection window, whose increments per
/// node command may decline its combining: fewer say little (a key just turned hot).
pub const MIN_BATCHES_TO_JUDGE: u64 = 16;

/// The increments a batch of a key written `writes_per_sec` would carry, from the
/// detector's rate: the one that opens it, and those arriving within its window.
pub fn per_batch(writes_per_sec: f64, window: Duration) -> f64 {
    1.0 + writes_per_sec.max(0.0) * window.as_secs_f64()
}

/// The share of a key's reads that its writes would turn into cache fills.
pub fn fill_share(reads_per_sec: f64, writes_per_sec: f64) -> f64 {
    if reads_per_sec <= 0.0 {
        return 0.0;
    }
    writes_per_sec.min(reads_per_sec) / reads_per_sec
}

/// A write-hot key and how to treat it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WriteHot {
    pub strategy: Strategy,
    pub combine_window: Duration,
}

/// The keys under mitigation now, and pinned patterns.
#[derive(Default)]
pub struct HotSet {
    write: HashMap<Bytes, WriteHot>,
    read: HashMap<Bytes, CachePolicy>,
    /// Every read-hot key, cached or not (client-side caching's `hot_only`).
    read_hot: std::collections::HashSet<Bytes>,
    /// Read-hot keys whose rule caches but whose cache would not pay (`fill_share`): the
    /// share of their reads that writes would turn into fills.
    not_cached: HashMap<Bytes, f64>,
    /// Write-hot keys whose rule combines but whose batches would not pay
    /// (`DECLINE_PER_COMMAND`): the increments per node command they carry.
    not_combined: HashMap<Bytes, f64>,
    rules: Option<Arc<Rules>>,
    has_pins: bool,
}

impl HotSet {
    /// Write-hot keys (hot or cooling) whose rule allows combining, from a detector
    /// snapshot and the rules; pinned patterns count as hot from the first request.
    pub fn build(snap: &HotSnapshot, rules: Arc<Rules>) -> HotSet {
        HotSet::build_after(snap, rules, None, &HashMap::new())
    }

    /// `build`, knowing the set before it: a key whose cache was declined there is cached
    /// again only once its writes are well under the line (`READMIT_FILL_SHARE`).
    /// `batched`: per key, the increments per node command its combine batches carried
    /// since the last build (`mitigate::combine::Combiner::take_batched`), for keys with
    /// enough batches to judge by (`MIN_BATCHES_TO_JUDGE`).
    pub fn build_after(
        snap: &HotSnapshot,
        rules: Arc<Rules>,
        prev: Option<&HotSet>,
        batched: &HashMap<Bytes, f64>,
    ) -> HotSet {
        let mut write = HashMap::new();
        let mut not_combined = HashMap::new();
        let mut read = HashMap::new();
        let mut read_hot = std::collections::HashSet::new();
        let mut not_cached = HashMap::new();
        for k in &snap.keys {
            // Read-hot by rate, or by what its reads cost (bytes, node time).
            if k.read_hot_state().is_some() {
                read_hot.insert(Bytes::copy_from_slice(&k.key));
                let p = rules.resolve(&k.key).read.cache;
                if p.enabled {
                    let share = fill_share(k.reads_per_sec, k.writes_per_sec);
                    let declined = prev.is_some_and(|h| h.not_cached.contains_key(&k.key[..]));
                    let line = if declined {
                        READMIT_FILL_SHARE
                    } else {
                        DECLINE_FILL_SHARE
                    };
                    if share >= line {
                        not_cached.insert(Bytes::copy_from_slice(&k.key), share);
                    } else {
                        read.insert(Bytes::copy_from_slice(&k.key), p);
                    }
                }
            }
            if !matches!(k.write_state, Some(HotState::Hot) | Some(HotState::Cooling)) {
                continue;
            }
            let p = rules.resolve(&k.key).write;
            if let Some(h) = write_hot(&p) {
                // Combining pays only where batches carry increments. A key is combined
                // as soon as it is hot, and its batches measured: declined once they
                // carry too few (the rate of a key's first hot window is only the
                // threshold it crossed, too early to judge by), and taken again when
                // its rate, over a whole window, would fill batches.
                let was_declined = prev.is_some_and(|h| h.not_combined.contains_key(&k.key[..]));
                let (per, line) = match was_declined {
                    true => (
                        Some(per_batch(k.writes_per_sec, h.combine_window)),
                        RECOMBINE_PER_COMMAND,
                    ),
                    false => (batched.get(&k.key[..]).copied(), DECLINE_PER_COMMAND),
                };
                match per {
                    Some(per) if per < line => {
                        not_combined.insert(Bytes::copy_from_slice(&k.key), per);
                    }
                    _ => {
                        write.insert(Bytes::copy_from_slice(&k.key), h);
                    }
                }
            }
        }
        let has_pins = rules.rules().iter().any(|r| r.pin);
        HotSet {
            write,
            read,
            read_hot,
            not_cached,
            not_combined,
            rules: Some(rules),
            has_pins,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.write.is_empty() && self.read.is_empty() && !self.has_pins
    }

    /// The cache policy of `key`, if it is read-hot (or pinned) and its rule caches.
    pub fn read_hot(&self, key: &[u8]) -> Option<CachePolicy> {
        if let Some(p) = self.read.get(key) {
            return Some(*p);
        }
        if self.has_pins {
            let r = self.rules.as_ref()?.resolve(key);
            if r.pin && r.read.cache.enabled {
                return Some(r.read.cache);
            }
        }
        None
    }

    /// Whether a tracking client may keep `key` in its own process under its rule's
    /// `read.client_cache` (`all`, or `hot_only` and the key read-hot or pinned now).
    pub fn client_may_keep(&self, key: &[u8], rules: &Rules) -> bool {
        let r = rules.resolve(key);
        match r.read.client_cache.keys {
            ClientCacheKeys::All => true,
            ClientCacheKeys::HotOnly => r.pin || self.read_hot.contains(key),
        }
    }

    pub fn read_keys(&self) -> usize {
        self.read.len()
    }

    /// How many read-hot keys are not cached because their cache would not pay.
    pub fn not_cached_count(&self) -> usize {
        self.not_cached.len()
    }

    /// Why a read-hot key is not cached, if its cache would not pay: the share of its
    /// reads that its writes would turn into fills.
    pub fn not_cached(&self, key: &[u8]) -> Option<f64> {
        self.not_cached.get(key).copied()
    }

    /// The keys declined here that `prev` cached or did not list (newly declined), and the
    /// keys `prev` declined that this set caches again.
    pub fn cache_changes(&self, prev: &HotSet) -> (Vec<(Bytes, f64)>, Vec<Bytes>) {
        changes(&self.not_cached, &prev.not_cached, |k| {
            self.read.contains_key(k)
        })
    }

    /// How many write-hot keys are not combined because their batches would not pay.
    pub fn not_combined_count(&self) -> usize {
        self.not_combined.len()
    }

    /// Why a write-hot key is not combined, if its batches would not pay: the increments
    /// per node command they carry (measured, or estimated from its rate).
    pub fn not_combined(&self, key: &[u8]) -> Option<f64> {
        self.not_combined.get(key).copied()
    }

    /// The keys whose combining is declined here and was not before, and the keys
    /// declined before that this set combines again.
    pub fn combine_changes(&self, prev: &HotSet) -> (Vec<(Bytes, f64)>, Vec<Bytes>) {
        changes(&self.not_combined, &prev.not_combined, |k| {
            self.write.contains_key(k)
        })
    }

    /// Whether any key may be served from the cache now (read-hot keys, or pins).
    pub fn may_cache(&self) -> bool {
        !self.read.is_empty() || self.has_pins
    }

    /// How `key` is treated for writes, if it is write-hot or pinned.
    pub fn write_hot(&self, key: &[u8]) -> Option<WriteHot> {
        if let Some(h) = self.write.get(key) {
            return Some(*h);
        }
        if self.has_pins {
            let r = self.rules.as_ref()?.resolve(key);
            if r.pin {
                return write_hot(&r.write);
            }
        }
        None
    }

    /// Whether any write may be combined now (a write-hot key, or a pin).
    pub fn may_combine(&self) -> bool {
        !self.write.is_empty() || self.has_pins
    }

    pub fn write_keys(&self) -> usize {
        self.write.len()
    }
}

/// Between two hot sets, for one mitigation: the keys declined now and not before (with
/// their figure), and the keys declined before that `applied` says are mitigated again.
fn changes(
    now: &HashMap<Bytes, f64>,
    before: &HashMap<Bytes, f64>,
    applied: impl Fn(&Bytes) -> bool,
) -> (Vec<(Bytes, f64)>, Vec<Bytes>) {
    let declined = now
        .iter()
        .filter(|(k, _)| !before.contains_key(*k))
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let again = before.keys().filter(|k| applied(k)).cloned().collect();
    (declined, again)
}

fn write_hot(p: &WritePolicy) -> Option<WriteHot> {
    match p.strategy {
        Strategy::Off => None,
        // `salt` too: a write-hot key is combined on this proxy from the moment it is
        // detected until its salting is in force (`bridge`), so a spike is mitigated
        // within the detection time, not at the next epoch.
        Strategy::Salt | Strategy::Combine | Strategy::SaltCombine | Strategy::Auto => {
            Some(WriteHot {
                strategy: p.strategy,
                combine_window: Duration::from_micros(p.combine.window_us),
            })
        }
    }
}
