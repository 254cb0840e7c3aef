//! What every session shares: the backend, the metrics, the detector, the rules, the
//! hot set, the combiner, the cache and the salt table.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::watch;

use crate::backend::tracking::{Filler, Invalidation, Tracker};
use crate::backend::Backend;
use crate::hotkey::Detector;
use crate::metrics::Metrics;
use crate::mitigate::cache::{Cache, Cause};

/// Most keys client-side caching remembers for the proxy's clients until the config says
/// (`limits.tracking_max_keys`).
const TRACKING_MAX_KEYS: usize = 1_000_000;
use crate::mitigate::combine::Combiner;
use crate::policy::HotSet;
use crate::resp::Limits;
use crate::rules::RulesHandle;

/// What every session shares.
pub struct Ctx {
    pub backend: Backend,
    pub metrics: Metrics,
    pub detector: Detector,
    pub limits: Limits,
    pub max_pending: usize,
    pub max_clients: usize,
    /// Unread replies a client may owe before it is closed (0 = no limit).
    pub max_output: usize,
    /// Who may log in, and what each user may run.
    pub users: Arc<crate::auth::Users>,
    pub shutdown: watch::Receiver<bool>,
    pub started: Instant,
    /// Keys under mitigation now; rebuilt by `spawn_hot_updater`, read lock-free per round.
    pub hot: ArcSwap<HotSet>,
    pub rules: RulesHandle,
    pub combiner: Arc<Combiner>,
    /// The read-hot cache and its per-node fill connections; None when disabled.
    pub cache: Option<CacheLayer>,
    /// Salted keys (shared with every proxy through the backend's registry).
    pub salt: Arc<crate::salt::Salt>,
    /// Per-key admission limits (rules' `admit:` sections).
    pub admit: Arc<crate::admit::Admission>,
    pub(in crate::proxy) next_id: AtomicU64,
    /// What the clients with CLIENT TRACKING on read (client-side caching).
    pub(in crate::proxy) tracking: Arc<crate::proxy::registry::tracking::ClientTracking>,
    /// Every client connection, for CLIENT LIST, CLIENT INFO and CLIENT KILL.
    pub(in crate::proxy) clients: Arc<crate::proxy::registry::clients::Clients>,
    /// The clients in MONITOR.
    pub(in crate::proxy) monitors: crate::proxy::registry::monitor::Monitors,
    /// CLIENT PAUSE over this proxy's clients.
    pub(in crate::proxy) pause: crate::proxy::registry::clients::Pause,
    /// ACL LOG: the commands and logins this proxy refused.
    pub(in crate::proxy) acl_log: crate::auth::Log,
    /// The Redis version HELLO reports: the lowest of the nodes'.
    pub(in crate::proxy) version: crate::proxy::registry::version::NodeVersion,
    /// HOTKEYS's session, from the detector's windows.
    pub(in crate::proxy) hotkeys: crate::proxy::registry::hotkeys::Hotkeys,
}

impl Ctx {
    /// `limits.tracking_max_keys`.
    pub fn set_tracking_max_keys(&self, n: usize) {
        self.tracking.set_max_keys(n);
    }

    #[allow(clippy::too_many_arguments)]
    pub fn new(
        backend: Backend,
        metrics: Metrics,
        detector: Detector,
        limits: Limits,
        max_pending: usize,
        max_clients: usize,
        users: Arc<crate::auth::Users>,
        shutdown: watch::Receiver<bool>,
        rules: RulesHandle,
    ) -> Ctx {
        let combiner = Combiner::new(metrics.combine.clone(), backend.request_timeout);
        let salt = Arc::new(crate::salt::Salt::new(&backend, metrics.salt.clone()));
        let admit = Arc::new(crate::admit::Admission::new(metrics.admission.clone()));
        let monitors = crate::proxy::registry::monitor::Monitors::new(metrics.monitor.clone());
        let clients: Arc<crate::proxy::registry::clients::Clients> = Arc::default();
        let tracking = crate::proxy::registry::tracking::ClientTracking::new(
            TRACKING_MAX_KEYS,
            clients.clone(),
            metrics.tracking.clone(),
            backend.clone(),
        );
        if let Some(cl) = backend.cluster() {
            // A slot that moves: its new owner tracks none of its keys.
            let t = Arc::downgrade(&tracking);
            cl.on_move(move |moved| {
                if let Some(t) = t.upgrade() {
                    t.invalidate_matching(moved);
                    t.slots_moved();
                }
            });
        }
        Ctx {
            admit,
            salt,
            hot: ArcSwap::from_pointee(HotSet::default()),
            rules,
            combiner,
            cache: None,
            backend,
            metrics,
            detector,
            limits,
            max_pending,
            max_clients,
            max_output: 0,
            users,
            shutdown,
            started: Instant::now(),
            next_id: AtomicU64::new(1),
            tracking,
            clients,
            monitors,
            acl_log: crate::auth::Log::default(),
            pause: crate::proxy::registry::clients::Pause::default(),
            version: Default::default(),
            hotkeys: Default::default(),
        }
    }
}

/// The read-hot cache: entries, and per node a tracker (Redis tells it which keys changed)
/// and the fill connection whose reads Redis tracks. A node a cluster adds after start
/// gets its tracker and fill connection at its first cached read.
pub struct CacheLayer {
    pub cache: Arc<Cache>,
    /// By node index, like the node table (which only grows).
    fills: Box<[std::sync::OnceLock<NodeFill>]>,
    pub fill_wait: Duration,
}

/// One node's tracker and the fill connection it watches.
struct NodeFill {
    filler: Filler,
    _tracker: Tracker,
}

impl CacheLayer {
    /// Starts a tracker and a filler per node known now.
    pub fn start(
        backend: &Backend,
        cfg: &crate::config::CacheConfig,
        metrics: &Metrics,
    ) -> CacheLayer {
        let cache = Cache::with_cost(
            cfg.max_entries,
            cfg.max_bytes,
            metrics.cache.clone(),
            super::cost::node_us,
        );
        let layer = CacheLayer {
            cache: cache.clone(),
            fills: (0..crate::backend::MAX_NODES)
                .map(|_| std::sync::OnceLock::new())
                .collect(),
            fill_wait: Duration::from_millis(cfg.fill_wait_ms),
        };
        for node in backend.nodes() {
            layer.filler(backend, node.index);
        }
        if let Some(cl) = backend.cluster() {
            // A slot that moves (a reshard, a failover) takes its cached replies with it.
            let c = cache.clone();
            cl.on_move(move |moved| c.invalidate_matching(moved, Cause::Flush));
        }
        layer
    }

    /// Node `index`'s fill connection, started on first use.
    pub fn filler(&self, backend: &Backend, index: usize) -> Option<&Filler> {
        let slot = self.fills.get(index)?;
        if let Some(f) = slot.get() {
            return Some(&f.filler);
        }
        if index >= backend.len() {
            return None;
        }
        let f = slot.get_or_init(|| {
            let node = backend.node(index);
            let hs = node.handshake(crate::resp::Proto::Resp2, 0);
            let c = self.cache.clone();
            let placement = backend.placement();
            let tracker = Tracker::spawn(&hs, move |inv| match inv {
                Invalidation::Keys(keys) => {
                    for k in keys {
                        c.invalidate(&k, Cause::Tracking);
                    }
                }
                // Without tracking nothing bounds staleness but the TTL: drop the node's keys.
                Invalidation::All => match &placement {
                    Some(p) => c.invalidate_matching(|k| p.node_for(k) == index, Cause::Flush),
                    None => c.invalidate_all(Cause::Flush),
                },
            });
            let filler = Filler::spawn(&tracker, &hs, node.metrics.clone(), node.cluster_link());
            NodeFill {
                filler,
                _tracker: tracker,
            }
        });
        Some(&f.filler)
    }
}
