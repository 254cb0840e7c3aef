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

/// The fewest cache fills of a key, in one detection window, whose share of its reads may
/// decline its cache: fewer say little (its entries were just filled).
pub const MIN_FILLS_TO_JUDGE: u64 = 16;

/// What one key's mitigations did over the last detection window, as `mitigate` measured
/// it: what they saved the key's node, and what they cost it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Cache, saved: reads answered without the node (hits, stale hits, callers that
    /// waited on another's fill), their reply bytes, and the node microseconds they would
    /// have cost.
    pub cache_hits: u64,
    pub cache_hit_bytes: u64,
    pub cache_saved_us: u64,
    /// Cache, cost: fills sent to the node, and invalidations (a write or a tracking
    /// message dropping the key's entries; each is a tracking message from the node when
    /// the write came from elsewhere).
    pub cache_fills: u64,
    pub cache_invalidations: u64,
    /// Combining: increments taken, the node commands they cost, and batches that
    /// carried one increment (their callers waited the window for nothing).
    pub increments: u64,
    pub combine_commands: u64,
    pub batches_of_one: u64,
}

impl Ledger {
    /// Increments per node command, once enough batches ran to judge by
    /// (`MIN_BATCHES_TO_JUDGE`).
    pub fn per_command(&self) -> Option<f64> {
        (self.combine_commands >= MIN_BATCHES_TO_JUDGE)
            .then(|| self.increments as f64 / self.combine_commands as f64)
    }

    /// The share of the key's cached reads that were fills, once enough fills ran to judge
    /// by (`MIN_FILLS_TO_JUDGE`).
    pub fn fill_share(&self) -> Option<f64> {
        (self.cache_fills >= MIN_FILLS_TO_JUDGE)
            .then(|| self.cache_fills as f64 / (self.cache_fills + self.cache_hits) as f64)
    }

    pub fn cached(&self) -> bool {
        self.cache_hits + self.cache_fills + self.cache_invalidations > 0
    }

    pub fn combined(&self) -> bool {
        self.increments > 0
    }
}

/// Why a read-hot key is not cached: the share of its reads that were (measured) or would
/// be (estimated from its read and write rates) cache fills.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FillShare {
    pub share: f64,
    pub measured: bool,
    /// Windows a measured decline has been held.
    pub held: u32,
}

/// Windows a cache declined on its measured fills stays declined before it is tried again.
pub const HOLD_MEASURED_DECLINE: u32 = 10;

/// A key's combining declined: the increments per node command its batches carry (measured
/// when declined, estimated since), its write rate when declined, and the windows it has
/// been held.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Declined {
    per: f64,
    rate: f64,
    held: u32,
}

/// Detection windows a key's combining stays declined before it is combined again, to be
/// measured anew, unless its rate says sooner that its batches would fill. Batches are
/// paced (`mitigate::combine`): what one carries depends on how many clients write the key
/// at once, which no rate tells (one client writing fast fills no batch, and combining
/// slows it, so its rate jumps when it is declined). A trial costs one window in ten.
pub const HOLD_COMBINE_DECLINE: u32 = 10;

/// The increments per node command a declined key's batches would carry now, from what
/// they carried at `per` when it was declined at `rate`: the extra increments grow with the
/// rate.
pub fn per_batch_now(per: f64, rate: f64, writes_per_sec: f64) -> f64 {
    1.0 + (per - 1.0).max(0.0) * writes_per_sec.max(0.0) / rate.max(1.0)
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
    /// Read-hot keys whose rule caches but whose cache does not pay: the share of their
    /// reads that were fills (measured while cached) or that writes would turn into fills.
    not_cached: HashMap<Bytes, FillShare>,
    /// What each key's mitigations saved and cost over the last window.
    ledgers: HashMap<Bytes, Ledger>,
    /// Write-hot keys whose rule combines but whose batches would not pay
    /// (`DECLINE_PER_COMMAND`, `HOLD_COMBINE_DECLINE`).
    not_combined: HashMap<Bytes, Declined>,
    rules: Option<Arc<Rules>>,
    has_pins: bool,
}

impl HotSet {
    /// Write-hot keys (hot or cooling) whose rule allows combining, from a detector
    /// snapshot and the rules; pinned patterns count as hot from the first request.
    pub fn build(snap: &HotSnapshot, rules: Arc<Rules>) -> HotSet {
        HotSet::build_after(snap, rules, None, &HashMap::new())
    }

    /// `build`, knowing the set before it and what its mitigations did since (`measured`,
    /// per key). A cached key whose fills were a third of its reads or more is declined,
    /// as is a read-hot key whose writes would make them so; a declined key is cached
    /// again only once its writes are well under the line (`READMIT_FILL_SHARE`). A
    /// combined key whose batches carried too few increments per node command is declined
    /// (`DECLINE_PER_COMMAND`), and combined again when its rate would fill batches.
    pub fn build_after(
        snap: &HotSnapshot,
        rules: Arc<Rules>,
        prev: Option<&HotSet>,
        measured: &HashMap<Bytes, Ledger>,
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
                    let before = prev.and_then(|h| h.not_cached.get(&k.key[..]));
                    let declined = before.is_some();
                    // While cached, its own fills say whether it pays; before, and while
                    // declined, its rates. A key declined on its measure is held so for
                    // `HOLD_MEASURED_DECLINE` windows (its writes may come from elsewhere,
                    // where its rates cannot see them), then tried again.
                    let share = match (
                        before,
                        measured.get(&k.key[..]).and_then(Ledger::fill_share),
                    ) {
                        (Some(b), _) if b.measured && b.held < HOLD_MEASURED_DECLINE => FillShare {
                            held: b.held + 1,
                            ..*b
                        },
                        (None, Some(share)) => FillShare {
                            share,
                            measured: true,
                            held: 0,
                        },
                        _ => FillShare {
                            share: fill_share(k.reads_per_sec, k.writes_per_sec),
                            measured: false,
                            held: 0,
                        },
                    };
                    let line = if declined {
                        READMIT_FILL_SHARE
                    } else {
                        DECLINE_FILL_SHARE
                    };
                    let held = before.is_some_and(|b| b.measured && b.held < HOLD_MEASURED_DECLINE);
                    if held || share.share >= line {
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
                // threshold it crossed, too early to judge by), and taken again after
                // `HOLD_COMBINE_DECLINE` windows, or sooner when its rate has grown
                // enough that its batches would fill.
                let declined = prev.and_then(|h| h.not_combined.get(&k.key[..]));
                let stay = match declined {
                    Some(d) => Some(per_batch_now(d.per, d.rate, k.writes_per_sec))
                        .filter(|now| *now < RECOMBINE_PER_COMMAND && d.held < HOLD_COMBINE_DECLINE)
                        .map(|per| Declined {
                            per,
                            held: d.held + 1,
                            ..*d
                        }),
                    None => measured
                        .get(&k.key[..])
                        .and_then(Ledger::per_command)
                        .filter(|per| *per < DECLINE_PER_COMMAND)
                        .map(|per| Declined {
                            per,
                            rate: k.writes_per_sec,
                            held: 0,
                        }),
                };
                match stay {
                    Some(d) => {
                        not_combined.insert(Bytes::copy_from_slice(&k.key), d);
                    }
                    None => {
                        write.insert(Bytes::copy_from_slice(&k.key), h);
                    }
                }
            }
        }
        let has_pins = rules.rules().iter().any(|r| r.pin);
        let ledgers = snap
            .keys
            .iter()
            .filter_map(|k| measured.get_key_value(&k.key[..]))
            .map(|(k, l)| (k.clone(), *l))
            .collect();
        HotSet {
            write,
            read,
            read_hot,
            not_cached,
            ledgers,
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

    /// Why a read-hot key is not cached, if its cache does not pay: the share of its reads
    /// that were, or would be, fills.
    pub fn not_cached(&self, key: &[u8]) -> Option<FillShare> {
        self.not_cached.get(key).copied()
    }

    /// What the key's mitigations saved and cost its node over the last window.
    pub fn ledger(&self, key: &[u8]) -> Option<Ledger> {
        self.ledgers.get(key).copied()
    }

    /// The keys declined here that `prev` cached or did not list (newly declined), and the
    /// keys `prev` declined that this set caches again.
    pub fn cache_changes(&self, prev: &HotSet) -> (Vec<(Bytes, FillShare)>, Vec<Bytes>) {
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
        self.not_combined.get(key).map(|d| d.per)
    }

    /// The keys whose combining is declined here and was not before, and the keys
    /// declined before that this set combines again.
    pub fn combine_changes(&self, prev: &HotSet) -> (Vec<(Bytes, f64)>, Vec<Bytes>) {
        let (declined, again) = changes(&self.not_combined, &prev.not_combined, |k| {
            self.write.contains_key(k)
        });
        (
            declined.into_iter().map(|(k, d)| (k, d.per)).collect(),
            again,
        )
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
fn changes<T: Copy>(
    now: &HashMap<Bytes, T>,
    before: &HashMap<Bytes, T>,
    applied: impl Fn(&Bytes) -> bool,
) -> (Vec<(Bytes, T)>, Vec<Bytes>) {
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
