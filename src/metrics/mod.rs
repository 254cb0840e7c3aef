//! Every Prometheus series saltshaker exports, in one place: name, help, labels.
//!
//! Labels come from fixed sets (command class, node address, error kind). The data path
//! holds pre-resolved handles (an `Arc` clone of each counter), so recording a request
//! never looks up a label set. Per-key series exist only for the capped set of hot keys and
//! are rebuilt from the detector's snapshot at scrape time (see `admin`).
//!
//! The request latency histogram is our own small lock-free one: prometheus-client's
//! `Histogram` takes a lock per observation, and the session records one observation per
//! pipelined round, weighted by the round's command count.

mod admission;
mod cluster;
mod handles;
mod monitor;
mod node;
mod security;

pub use admission::{AdmissionMetrics, AdmitLabel, ADMIT_RESULTS};
pub use cluster::{ClusterMetrics, RedirectLabel};
pub use handles::{CacheMetrics, CauseLabel, CombineMetrics, SaltMetrics, TrackingMetrics};
pub use monitor::MonitorMetrics;
pub use node::NodeMetrics;
pub use security::{DeniedLabel, SecurityMetrics};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

/// The command classes requests are counted by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Read = 0,
    Write = 1,
    Other = 2,
}

const CLASSES: [&str; 3] = ["read", "write", "other"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    pub class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabel {
    pub node: String,
}

/// The kinds of `saltshaker_backend_errors_total`, each created at 0 for every node when
/// the proxy starts, so `rate()` over a node that never failed is 0, not "no data".
pub const ERROR_KINDS: [&str; 5] = ["connect", "io", "timeout", "down", "protocol"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeErrorLabel {
    pub node: String,
    pub kind: &'static str,
}

/// A salted key's exactness: `write` exact or combine, `read` exact or display.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExactnessLabel {
    pub write: &'static str,
    pub read: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HotKindLabel {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HotKeyLabel {
    pub key: String,
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KeyLabel {
    pub key: String,
}

/// Handles of every series. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    pub requests: [Counter; 3],
    pub request_seconds: Arc<RoundHistogram>,
    pub client_connections: Gauge,
    pub client_connections_total: Counter,
    pub client_rejected: Counter,
    pub protocol_errors: Counter,
    pub output_limit_closed: Counter,
    pub backend_requests: Family<NodeLabel, Counter>,
    pub backend_writes: Family<NodeLabel, Counter>,
    pub backend_errors: Family<NodeErrorLabel, Counter>,
    pub backend_connections: Family<NodeLabel, Gauge>,
    pub backend_up: Family<NodeLabel, Gauge>,
    pub backend_pending: Family<NodeLabel, Gauge>,
    pub backend_read_cost: Family<NodeLabel, Counter<f64, AtomicU64>>,
    pub hot_keys: Family<HotKindLabel, Gauge>,
    pub hot_key_rate: Family<HotKeyLabel, Gauge<f64, AtomicU64>>,
    /// Keys hot by what their reads cost: bytes moved, and the node's estimated ms.
    pub hot_key_bytes: Family<KeyLabel, Gauge<f64, AtomicU64>>,
    pub hot_key_node_ms: Family<KeyLabel, Gauge<f64, AtomicU64>>,
    pub rules_reloads_ok: Counter,
    pub rules_reloads_failed: Counter,
    pub rules_generation: Gauge,
    pub rules_last_reload_failed: Gauge,
    pub mitigated_keys: Family<HotKindLabel, Gauge>,
    /// From the moment the detector saw a key cross its write threshold to the moment
    /// this proxy combined it.
    pub time_to_mitigate: prometheus_client::metrics::histogram::Histogram,
    pub balance_keys: Family<NodeLabel, Gauge>,
    pub combine: CombineMetrics,
    pub cache: CacheMetrics,
    pub salt: SaltMetrics,
    pub security: SecurityMetrics,
    pub cluster: ClusterMetrics,
    pub admission: AdmissionMetrics,
    pub monitor: MonitorMetrics,
    pub tracking: TrackingMetrics,
}

impl Metrics {
    /// Creates a node's labelled series at 0 (errors of every kind, balanced keys).
    pub fn add_node(&self, node: &str) {
        for kind in ERROR_KINDS {
            let _ = self.backend_errors.get_or_create(&NodeErrorLabel {
                node: node.to_string(),
                kind,
            });
        }
        let _ = self.balance_keys.get_or_create(&NodeLabel {
            node: node.to_string(),
        });
    }

    /// Creates every series and registers it in `registry` under the `saltshaker_` prefix.
    pub fn new(registry: &mut Registry) -> Metrics {
        // One statement per label set: get_or_create returns a read guard, and a second call
        // for a new label in the same statement would wait for a write lock forever.
        let reloads = Family::<ResultLabel, Counter>::default();
        let reloads_ok = reloads.get_or_create(&ResultLabel { result: "ok" }).clone();
        let reloads_failed = reloads
            .get_or_create(&ResultLabel { result: "failed" })
            .clone();
        let requests_family = Family::<ClassLabel, Counter>::default();
        let requests = [0, 1, 2].map(|i| {
            requests_family
                .get_or_create(&ClassLabel { class: CLASSES[i] })
                .clone()
        });
        let m = Metrics {
            requests,
            request_seconds: Arc::new(RoundHistogram::new()),
            client_connections: Gauge::default(),
            client_connections_total: Counter::default(),
            client_rejected: Counter::default(),
            protocol_errors: Counter::default(),
            output_limit_closed: Counter::default(),
            backend_requests: Family::default(),
            backend_writes: Family::default(),
            backend_errors: Family::default(),
            backend_connections: Family::default(),
            backend_up: Family::default(),
            backend_pending: Family::default(),
            backend_read_cost: Family::default(),
            hot_keys: Family::default(),
            hot_key_rate: Family::default(),
            hot_key_bytes: Family::default(),
            hot_key_node_ms: Family::default(),
            rules_reloads_ok: reloads_ok,
            rules_reloads_failed: reloads_failed,
            rules_generation: Gauge::default(),
            rules_last_reload_failed: Gauge::default(),
            mitigated_keys: Family::default(),
            time_to_mitigate: prometheus_client::metrics::histogram::Histogram::new([
                0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0,
            ]),
            balance_keys: Family::default(),
            combine: Default::default(),
            cache: Default::default(),
            salt: Default::default(),
            security: SecurityMetrics::default(),
            cluster: ClusterMetrics::default(),
            admission: AdmissionMetrics::default(),
            monitor: MonitorMetrics::default(),
            tracking: TrackingMetrics::default(),
        };

        // Labelled series with a fixed label set exist from the start, at 0.
        for kind in ["read", "write"] {
            let _ = m.hot_keys.get_or_create(&HotKindLabel { kind });
            let _ = m.mitigated_keys.get_or_create(&HotKindLabel { kind });
        }

        let r = registry.sub_registry_with_prefix("saltshaker");
        r.register(
            "requests",
            "Client commands handled, by command class",
            requests_family,
        );
        r.register(
            "request_duration_seconds",
            "Time from reading a command to having its reply ready",
            ArcMetric(m.request_seconds.clone()),
        );
        r.register(
            "client_connections",
            "Open client connections",
            m.client_connections.clone(),
        );
        r.register(
            "client_connections_accepted",
            "Client connections accepted",
            m.client_connections_total.clone(),
        );
        r.register(
            "client_connections_rejected",
            "Client connections refused at max_clients",
            m.client_rejected.clone(),
        );
        r.register(
            "protocol_errors",
            "Client connections closed for malformed RESP",
            m.protocol_errors.clone(),
        );
        r.register(
            "client_output_limit_closed",
            "Client connections closed for leaving more than limits.max_output_bytes of replies unread",
            m.output_limit_closed.clone(),
        );
        r.register(
            "backend_requests",
            "Commands sent to each backend node",
            m.backend_requests.clone(),
        );
        r.register(
            "backend_writes",
            "Writes to each backend node's shared connections; commands per write (backend_requests / backend_writes) is how well the proxy batches toward the node",
            m.backend_writes.clone(),
        );
        r.register(
            "backend_errors",
            "Backend failures by node and kind (connect, io, timeout, down, protocol)",
            m.backend_errors.clone(),
        );
        r.register(
            "backend_connections",
            "Open shared connections per backend node",
            m.backend_connections.clone(),
        );
        r.register(
            "backend_up",
            "1 when the node's shared connection is established",
            m.backend_up.clone(),
        );
        r.register(
            "backend_pending_commands",
            "Commands sent to the node on its shared connections and not answered yet (admission sheds low-priority keys above admission.shed_low_at_pending)",
            m.backend_pending.clone(),
        );
        r.register(
            "backend_read_cost_seconds",
            "Estimated node time of the costly reads each node answered (reads of at least 10 us, estimated from the reply); node balance adds it to a node's load",
            m.backend_read_cost.clone(),
        );
        r.register(
            "hot_keys",
            "Keys currently hot, by kind (read, write)",
            m.hot_keys.clone(),
        );
        r.register(
            "hot_key_rate",
            "Per-second rate of each currently hot key (capped set; removed when the key cools)",
            m.hot_key_rate.clone(),
        );
        r.register(
            "hot_key_bytes_per_second",
            "Bytes per second the reads of each key hot by bytes move, request and reply (capped set; removed when the key cools)",
            m.hot_key_bytes.clone(),
        );
        r.register(
            "hot_key_node_milliseconds_per_second",
            "Estimated node milliseconds per second the reads of each key hot by node time cost (capped set; removed when the key cools)",
            m.hot_key_node_ms.clone(),
        );
        r.register(
            "rules_reloads",
            "Rules reload attempts, by result (ok, failed)",
            reloads,
        );
        r.register(
            "rules_generation",
            "Rules generation in force (0 = as loaded at start)",
            m.rules_generation.clone(),
        );
        r.register(
            "rules_last_reload_failed",
            "1 while the latest rules reload failed and the previous rules are still in force",
            m.rules_last_reload_failed.clone(),
        );
        r.register(
            "mitigated_keys",
            "Keys under mitigation now, by kind (write = combined)",
            m.mitigated_keys.clone(),
        );
        r.register(
            "time_to_mitigate_seconds",
            "Seconds from a key turning write-hot (the detector's threshold crossed) to its mitigation in force on this proxy (combined until salted)",
            m.time_to_mitigate.clone(),
        );
        r.register(
            "balance_keys",
            "Keys of each node made read-hot by balance (cached to take load off a node busier than the others)",
            m.balance_keys.clone(),
        );
        m.combine.register(r);
        m.security.register(r);
        m.cluster.register(r);
        m.admission.register(r);
        m.monitor.register(r);
        m.tracking.register(r);
        let s = &m.salt;
        r.register(
            "salted_keys",
            "Keys salted over shard keys now (as the registry in the backend says)",
            s.salted_keys.clone(),
        );
        s.register_pays(r);
        r.register(
            "salt_promotions",
            "Keys this proxy promoted to salted (detected or by an SRE)",
            s.promotions.clone(),
        );
        r.register(
            "salt_early_starts",
            "Promotions this proxy put in force before their epoch boundary, once every live proxy had acknowledged them",
            s.early_starts.clone(),
        );
        r.register(
            "salt_demotions",
            "Salted keys this proxy demoted (cooled, or by an SRE)",
            s.demotions.clone(),
        );
        r.register(
            "salt_folds",
            "Demoted keys whose shards this proxy folded back into the base key",
            s.folds.clone(),
        );
        r.register(
            "salt_fold_moves",
            "Shard values moved into a base key (journaled, exactly once)",
            s.fold_moves.clone(),
        );
        r.register(
            "salt_shard_moves",
            "Shards of keys salted by member that this proxy moved off a master they shared with another of the key's shards",
            s.shard_moves.clone(),
        );
        r.register(
            "salt_shard_writes",
            "Client increments written to a shard key",
            s.shard_writes.clone(),
        );
        r.register(
            "salt_base_writes",
            "Writes to a salted key sent to its base key (promotion not yet in force, demoted, or registry stale)",
            s.base_writes.clone(),
        );
        r.register(
            "salt_merged_reads",
            "Commands on a salted key answered by merging base and shards",
            s.merged_reads.clone(),
        );
        r.register(
            "salt_shared_reads",
            "Merged reads answered by the identical read just before them in the same pipeline (no commands of their own)",
            s.shared_reads.clone(),
        );
        r.register(
            "salt_registry_up",
            "1 while the salt registry in the backend answers; 0 means no new promotions",
            s.registry_up.clone(),
        );
        r.register(
            "salt_registry_errors",
            "Coordinator ticks that could not read or write the salt registry",
            s.registry_errors.clone(),
        );
        r.register(
            "idempotent_applied",
            "SALTSHAKER.INCRBY increments applied (the first time their ID was seen)",
            s.idem_applied.clone(),
        );
        r.register(
            "idempotent_duplicates",
            "SALTSHAKER.INCRBY retries answered without applying them again",
            s.idem_duplicates.clone(),
        );
        r.register(
            "idempotent_evicted",
            "Increment IDs forgotten before their window ended because the key held max_ids IDs",
            s.idem_evicted.clone(),
        );
        r.register(
            "salted_keys_by_exactness",
            "Keys salted now by their rule's exactness: write exact or combine, read exact or display",
            s.by_exactness.clone(),
        );
        r.register(
            "salt_display_reads",
            "Merged reads of a salted key served from its display-tier rollup",
            s.display_reads.clone(),
        );
        r.register(
            "salt_display_refreshes",
            "Display-tier rollups refreshed by a merged read",
            s.display_refreshes.clone(),
        );
        let c = &m.cache;
        r.register(
            "cache_hits",
            "Read replies served from the proxy cache",
            c.hits.clone(),
        );
        r.register(
            "cache_misses",
            "Cached reads that had to be fetched from the node",
            c.misses.clone(),
        );
        r.register(
            "cache_coalesced",
            "Cache misses that waited for a fill already in flight",
            c.coalesced.clone(),
        );
        c.register_pays(r);
        r.register(
            "cache_stale_served",
            "Expired replies served while one refresh ran",
            c.stale_served.clone(),
        );
        r.register(
            "cache_invalidations_write",
            "Cache entries dropped because this proxy wrote the key",
            c.invalidations_write.clone(),
        );
        r.register(
            "cache_invalidations_tracking",
            "Cache entries dropped because the node said the key changed (client-side caching)",
            c.invalidations_tracking.clone(),
        );
        r.register(
            "cache_invalidations_flush",
            "Cache flushes: tracking connection lost, or FLUSHALL/FLUSHDB",
            c.invalidations_flush.clone(),
        );
        r.register(
            "cache_wait_timeouts",
            "Waiters that gave up on a slow fill and fetched themselves",
            c.wait_timeouts.clone(),
        );
        r.register(
            "cache_evictions",
            "Cache entries evicted to stay within cache.max_bytes / max_entries (the lowest node time saved per byte go first)",
            c.evictions.clone(),
        );
        r.register(
            "cache_node_seconds_saved",
            "Node time the cache's hits saved, as estimated from each reply (1 us + 120 ns per element + 1 us per 15 KB)",
            c.node_seconds_saved.clone(),
        );
        r.register(
            "cache_bytes",
            "Bytes held by the proxy cache",
            c.bytes.clone(),
        );
        r.register(
            "cache_entries",
            "Entries held by the proxy cache",
            c.entries.clone(),
        );
        m
    }

    /// Counts `n` commands of a class.
    #[inline]
    pub fn count(&self, class: Class, n: u64) {
        self.requests[class as usize].inc_by(n);
    }
}

/// Upper bounds of the latency buckets, in seconds: 25 us to 2.5 s.
const BOUNDS: [f64; 12] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.05, 0.25, 2.5,
];

/// A histogram whose observations carry a weight: one round of `n` pipelined commands
/// that took `t` counts as `n` observations of `t`.
#[derive(Debug, Default)]
pub struct RoundHistogram {
    buckets: [AtomicU64; BOUNDS.len() + 1],
    count: AtomicU64,
    sum_nanos: AtomicU64,
}

impl RoundHistogram {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn observe(&self, seconds: f64, n: u64) {
        let i = BOUNDS
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(BOUNDS.len());
        self.buckets[i].fetch_add(n, Ordering::Relaxed);
        self.count.fetch_add(n, Ordering::Relaxed);
        self.sum_nanos
            .fetch_add((seconds * 1e9) as u64 * n, Ordering::Relaxed);
    }
}

/// Registers an `Arc`-shared metric.
#[derive(Debug)]
struct ArcMetric(Arc<RoundHistogram>);

impl TypedMetric for ArcMetric {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for ArcMetric {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let h = &self.0;
        let mut buckets: Vec<(f64, u64)> = BOUNDS
            .iter()
            .zip(h.buckets.iter())
            .map(|(b, c)| (*b, c.load(Ordering::Relaxed)))
            .collect();
        buckets.push((f64::MAX, h.buckets[BOUNDS.len()].load(Ordering::Relaxed)));
        let count = buckets.iter().map(|(_, c)| c).sum();
        let sum = h.sum_nanos.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weighted_round_counts_every_command() {
        let mut reg = Registry::default();
        let m = Metrics::new(&mut reg);
        m.request_seconds.observe(0.0003, 16);
        m.count(Class::Read, 16);
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap();
        assert!(
            out.contains("saltshaker_request_duration_seconds_count 16"),
            "{out}"
        );
        assert!(
            out.contains("saltshaker_requests_total{class=\"read\"} 16"),
            "{out}"
        );
        assert!(out.contains("le=\"0.0005\"} 16"), "{out}");
    }
}
