//! Metric handles held by the data path, one struct per module that records them (the
//! registry's names and help texts are in `mod.rs`, except for client-side caching's,
//! registered here).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::ExactnessLabel;

/// Metric handles of combining.
#[derive(Clone, Default)]
pub struct CombineMetrics {
    /// Client increments that went through a batch.
    pub ops: Counter,
    /// Backend writes issued for batches (one per batch, or n on fallback).
    pub backend_writes: Counter,
    /// Batches that fell back to one-by-one.
    pub fallbacks: Counter,
    /// Increments of a combined key sent as plain commands, to stay behind the client's
    /// own earlier command on the key.
    pub held_back: Counter,
    /// Write-hot keys not combined because their batches would not pay
    /// (`policy::DECLINE_PER_COMMAND`), keys combined again after that, and how many are
    /// declined now.
    pub declined: Counter,
    pub recombined: Counter,
    pub not_combined_keys: Gauge,
}

impl CombineMetrics {
    /// Registers combining's series, and whether combining a key pays
    /// (`policy::DECLINE_PER_COMMAND`).
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "combined_writes",
            "Client increments that went through a combine batch",
            self.ops.clone(),
        );
        r.register(
            "combine_backend_writes",
            "Backend writes issued for combine batches (one per batch; one per command on fallback)",
            self.backend_writes.clone(),
        );
        r.register(
            "combine_fallbacks",
            "Combine batches sent one by one after an error reply or an overflowing sum",
            self.fallbacks.clone(),
        );
        r.register(
            "combine_held_back",
            "Increments of a combined key sent as plain commands, behind the client's own earlier command on the key",
            self.held_back.clone(),
        );
        r.register(
            "combine_declined",
            "Write-hot keys not combined: their batches would carry under two increments per node command",
            self.declined.clone(),
        );
        r.register(
            "combine_recombined",
            "Write-hot keys combined again: their batches would carry two and a half increments per node command or more",
            self.recombined.clone(),
        );
        r.register(
            "combine_not_combined_keys",
            "Write-hot keys not combined now because their batches would not pay",
            self.not_combined_keys.clone(),
        );
    }
}

/// Metric handles of the cache.
#[derive(Clone, Default)]
pub struct CacheMetrics {
    pub hits: Counter,
    pub misses: Counter,
    /// Callers that waited for a fill already in flight instead of fetching.
    pub coalesced: Counter,
    pub stale_served: Counter,
    pub invalidations_write: Counter,
    pub invalidations_tracking: Counter,
    pub invalidations_flush: Counter,
    /// Waiters that gave up on a slow fill and fetched for themselves.
    pub wait_timeouts: Counter,
    /// Entries dropped to stay within the cache's bounds (lowest node time saved per byte).
    pub evictions: Counter,
    /// The node time hits saved, by the same estimate that ranks entries for eviction.
    pub node_seconds_saved: Counter<f64, std::sync::atomic::AtomicU64>,
    pub bytes: Gauge,
    pub entries: Gauge,
    /// Read-hot keys not cached because their cache would not pay (their writes would
    /// refill it too often), and keys cached again after that.
    pub declined: Counter,
    pub readmitted: Counter,
    /// Read-hot keys not cached now for that reason.
    pub not_cached_keys: Gauge,
}

impl CacheMetrics {
    /// Registers the figures of whether caching a key pays (`policy::DECLINE_FILL_SHARE`).
    pub fn register_pays(&self, r: &mut prometheus_client::registry::Registry) {
        r.register(
            "cache_declined",
            "Read-hot keys not cached: writes would turn a third or more of their reads into fills",
            self.declined.clone(),
        );
        r.register(
            "cache_readmitted",
            "Read-hot keys cached again: their writes fell under a quarter of their reads",
            self.readmitted.clone(),
        );
        r.register(
            "cache_not_cached_keys",
            "Read-hot keys not cached now because their cache would not pay",
            self.not_cached_keys.clone(),
        );
    }
}

/// Metric handles of salting.
#[derive(Clone, Default)]
pub struct SaltMetrics {
    pub salted_keys: Gauge,
    pub promotions: Counter,
    /// Write-hot keys that `auto` would have salted, not salted because their merged
    /// reads would cost the nodes more than the writes salting spreads
    /// (`salt::registry::salting_pays`), and how many are declined now.
    pub declined: Counter,
    pub not_salted_keys: Gauge,
    /// Keys `auto` salted, demoted while still write-hot because their merged reads came
    /// to cost the nodes more than the writes salting spreads
    /// (`salt::registry::salting_stopped_paying`).
    pub withdrawn: Counter,
    /// Promotions put in force before their boundary, every live proxy knowing them.
    pub early_starts: Counter,
    pub demotions: Counter,
    pub folds: Counter,
    pub fold_moves: Counter,
    /// Shards of keys salted by member moved off a master they shared with another shard.
    pub shard_moves: Counter,
    pub shard_writes: Counter,
    /// Writes to a salted key sent to its base key: promotion not yet in force, demoted,
    /// or the registry not read for too long.
    pub base_writes: Counter,
    pub merged_reads: Counter,
    /// Of `merged_reads`, those answered by the identical read just before them.
    pub shared_reads: Counter,
    pub registry_up: Gauge,
    pub registry_errors: Counter,
    /// `SALTSHAKER.INCRBY`: applied, answered as a retry of an applied ID, and IDs
    /// forgotten early because a key held `max_ids` of them.
    pub idem_applied: Counter,
    pub idem_duplicates: Counter,
    pub idem_evicted: Counter,
    /// Display tier: merged reads served from a rollup, and rollup refreshes.
    pub display_reads: Counter,
    pub display_refreshes: Counter,
    /// Salted keys by exactness (four label sets at most).
    pub by_exactness: Family<ExactnessLabel, Gauge>,
}

/// Client-side caching through the proxy (CLIENT TRACKING).
#[derive(Clone, Default)]
pub struct TrackingMetrics {
    /// Clients with tracking on now.
    pub clients: Gauge,
    /// Keys remembered for them now.
    pub keys: Gauge,
    /// `invalidate` messages queued for clients, by cause (`INVALIDATION_CAUSES`).
    pub invalidations: Family<CauseLabel, Counter>,
    /// Clients told to drop everything: a node was flushed, or a tracker or a tracked
    /// connection was lost, so changes may have been missed.
    pub flushes: Counter,
    /// Keys forgotten for room (`limits.tracking_max_keys`), their clients told.
    pub evictions: Counter,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabel {
    pub cause: &'static str,
}

/// Why a tracking client is told to drop a key: it `changed` (its node said so), it was
/// read where the node cannot track it for the proxy (`untracked`: a salted key, a
/// blocking read, a WATCHed transaction, a node whose tracker was down), its rule keeps
/// only hot keys and it is not hot (`not_hot`), it was forgotten for room (`evicted`), or
/// its slot moved (`moved`).
pub const INVALIDATION_CAUSES: [&str; 5] = ["changed", "untracked", "not_hot", "evicted", "moved"];

impl TrackingMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "tracking_clients",
            "Clients with CLIENT TRACKING on (client-side caching through the proxy)",
            self.clients.clone(),
        );
        r.register(
            "tracking_keys",
            "Keys the proxy remembers its tracking clients read",
            self.keys.clone(),
        );
        for cause in INVALIDATION_CAUSES {
            let _ = self.invalidations.get_or_create(&CauseLabel { cause });
        }
        r.register(
            "tracking_invalidations",
            "invalidate messages queued for tracking clients, one per key, by cause",
            self.invalidations.clone(),
        );
        r.register(
            "tracking_flushes",
            "Tracking clients told to drop their whole cache (a node flushed, or tracking lost with changes maybe missed)",
            self.flushes.clone(),
        );
        r.register(
            "tracking_evictions",
            "Keys forgotten to keep within limits.tracking_max_keys (their clients are told to drop them)",
            self.evictions.clone(),
        );
    }
}

impl SaltMetrics {
    /// Registers whether salting a key pays (`salt::registry::salting_pays`).
    pub fn register_pays(&self, r: &mut Registry) {
        r.register(
            "salt_declined",
            "Write-hot keys auto would salt, not salted: their merged reads would cost the nodes more than the writes salting spreads",
            self.declined.clone(),
        );
        r.register(
            "salt_not_salted_keys",
            "Write-hot keys not salted now because salting them would not pay",
            self.not_salted_keys.clone(),
        );
        r.register(
            "salt_withdrawn",
            "Keys auto salted, demoted while write-hot: their merged reads came to cost the nodes over twice what salting takes off their node",
            self.withdrawn.clone(),
        );
    }
}
