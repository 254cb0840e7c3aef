//! The nodes: one backend node and its shared connections, and the table of all of them,
//! which a cluster grows when a master it did not know at start shows up (indices never
//! change, so a session's per-node state stays valid).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use super::cluster::Cluster;
use super::{BackendConfig, ConnHandle, Handshake, NodeMetrics};
use crate::metrics::Metrics;
use crate::resp::Proto;

/// Most nodes one proxy talks to (masters and replicas of a cluster, or a pool).
pub const MAX_NODES: usize = 1024;

/// Every node, by index: filled once per index, never emptied.
pub struct NodeTable {
    slots: Box<[OnceLock<Arc<Node>>]>,
    len: AtomicUsize,
    adding: Mutex<()>,
}

impl NodeTable {
    pub fn new(nodes: Vec<Node>) -> NodeTable {
        let t = NodeTable {
            slots: (0..MAX_NODES).map(|_| OnceLock::new()).collect(),
            len: AtomicUsize::new(0),
            adding: Mutex::new(()),
        };
        for n in nodes {
            let _ = t.push(|_| n);
        }
        t
    }

    /// Adds the node `make(index)` builds; None when the table is full.
    pub fn push(&self, make: impl FnOnce(usize) -> Node) -> Option<usize> {
        let _g = self.adding.lock().unwrap_or_else(|p| p.into_inner());
        let i = self.len.load(Ordering::Acquire);
        if i >= MAX_NODES {
            return None;
        }
        let _ = self.slots[i].set(Arc::new(make(i)));
        self.len.store(i + 1, Ordering::Release);
        Some(i)
    }

    /// Node `i`, which must be below `len()`.
    pub fn get(&self, i: usize) -> &Arc<Node> {
        self.slots[i].get().expect("a node index below len()")
    }

    pub fn len(&self) -> usize {
        self.len.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn all(&self) -> Vec<Arc<Node>> {
        (0..self.len()).map(|i| self.get(i).clone()).collect()
    }
}

/// A node's shared connections by (RESP3, database, lane), started on first use and
/// shared by every worker thread (each writes through its own relay: `wire`).
type ConnSets = Mutex<HashMap<(bool, u32, Lane), Arc<[ConnHandle]>>>;

thread_local! {
    static WORKER: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Marks this thread as worker `i` (0: the main thread). Each worker thread runs its own
/// runtime and writes its sessions' commands to every node through a relay of its own, on
/// connections all workers share, so that a node gets one connection's batches however
/// many threads there are (docs/architecture.md, "Worker threads").
pub fn set_worker(i: usize) {
    WORKER.with(|w| w.set(i));
}

/// This thread's worker index.
pub fn worker() -> usize {
    WORKER.with(|w| w.get())
}

static WORKERS: AtomicUsize = AtomicUsize::new(1);

/// How many worker threads there are (set once before they start): each shared connection
/// keeps a relay per worker (`wire`).
pub fn set_workers(n: usize) {
    WORKERS.store(n.max(1), Ordering::Relaxed);
}

pub fn workers() -> usize {
    WORKERS.load(Ordering::Relaxed)
}

/// Which of a node's shared lanes a command travels on. A node runs one connection's
/// commands one after another, so a long script on the lane every command takes would make
/// every client's command wait behind it until the request timeout. Scripts and functions
/// have a lane of their own: the main lane keeps flowing, and the node itself answers
/// `BUSY` while a script runs too long, so that `SCRIPT KILL` can be sent, as it would
/// to a client connected directly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Lane {
    #[default]
    Main,
    Scripts,
}

/// One backend node and its shared connections.
pub struct Node {
    pub addr: String,
    pub index: usize,
    base: Handshake,
    per_node: usize,
    pub metrics: NodeMetrics,
    conns: ConnSets,
    /// The cluster this node belongs to, if any: its calls follow redirections.
    pub(super) cluster: OnceLock<Weak<Cluster>>,
    /// The load this proxy sent the node over the last detection window, as f64 bits (see
    /// `load`).
    load: AtomicU64,
    /// A connection opened ahead for the next pub/sub tunnel, per (RESP3, worker thread):
    /// see `take_spare`.
    spares: Mutex<HashMap<(bool, usize), super::Dedicated>>,
}

impl Node {
    /// The shared connections for a protocol and database, started on first use.
    pub fn conns(&self, proto: Proto, db: u32) -> Arc<[ConnHandle]> {
        self.conns_in(proto, db, Lane::Main)
    }

    /// The shared connections of a lane, for a protocol and database.
    pub fn conns_in(&self, proto: Proto, db: u32, lane: Lane) -> Arc<[ConnHandle]> {
        let mut map = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        map.entry((proto == Proto::Resp3, db, lane))
            .or_insert_with(|| {
                let hs = Arc::new(self.handshake(proto, db));
                (0..self.per_node)
                    .map(|_| {
                        let c = self.cluster.get().cloned();
                        ConnHandle::spawn(hs.clone(), self.metrics.clone(), c)
                    })
                    .collect()
            })
            .clone()
    }

    /// A connection to the node opened ahead, in database 0 and `proto`, for a client that
    /// subscribes: its SUBSCRIBE then leaves at once, as on a client's own connection to
    /// the node. Opening one per subscription made the SUBSCRIBE wait for a connect and a
    /// handshake while a PUBLISH sent right after it by another client went out at once
    /// on a shared connection, and 83 such messages in 100 were lost, against none
    /// directly (tests/client_suites.rs). The taker opens the next one (`warm_spare`)
    /// once its SUBSCRIBE is out. None when none is open (the first subscription to a
    /// cluster node, or one the node closed).
    pub fn take_spare(&self, proto: Proto) -> Option<super::Dedicated> {
        let key = (proto == Proto::Resp3, worker());
        self.spares
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key)
            .filter(|d| !d.peer_closed())
    }

    /// Opens the spare connection `take_spare` gives, in the background, on this worker
    /// thread (a connection stays with the thread that opened it).
    pub fn warm_spare(self: &Arc<Self>, proto: Proto) {
        let key = (proto == Proto::Resp3, worker());
        let node = Arc::downgrade(self);
        let hs = self.handshake(proto, 0);
        tokio::spawn(async move {
            if let Ok(d) = super::Dedicated::open(&hs).await {
                if let Some(node) = node.upgrade() {
                    node.spares
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(key, d);
                }
            }
        });
    }

    /// True when the node is reached over TLS.
    pub fn is_tls(&self) -> bool {
        self.base.tls.is_some()
    }

    pub fn handshake(&self, proto: Proto, db: u32) -> Handshake {
        Handshake {
            proto,
            db,
            ..self.base.clone()
        }
    }

    /// The cluster this node belongs to, for connections made outside `conns`.
    pub fn cluster_link(&self) -> Option<Weak<Cluster>> {
        self.cluster.get().cloned()
    }

    /// True when the node's default shared connection is established.
    pub fn is_up(&self) -> bool {
        self.conns(Proto::Resp2, 0).iter().any(|c| c.is_up())
    }

    /// The load this proxy sent the node over the last detection window, per second: its
    /// commands, plus the estimated node time of its costly reads in microseconds. Node
    /// balance measures it (`mitigate::balance::run`, its only writer); the salt
    /// coordinator reads it to see whether a combined key still leaves its node busier than
    /// the others. 0 until the first window closes, and on a proxy with one node.
    pub fn load(&self) -> f64 {
        f64::from_bits(self.load.load(Ordering::Relaxed))
    }

    pub fn set_load(&self, per_sec: f64) {
        self.load.store(per_sec.to_bits(), Ordering::Relaxed);
    }
}

impl Node {
    pub fn new(
        cfg: &BackendConfig,
        addr: String,
        index: usize,
        max_reply_bulk: usize,
        metrics: &Metrics,
        tls: &super::NodeTls,
    ) -> Node {
        let mut base = Handshake::base(cfg, addr.clone(), max_reply_bulk, tls);
        base.readonly = cfg
            .cluster
            .as_ref()
            .is_some_and(|c| c.read_from != super::ReadFrom::Master);
        Node {
            metrics: NodeMetrics::new(metrics, &addr),
            addr,
            index,
            base,
            per_node: cfg.connections_per_node,
            conns: Mutex::new(HashMap::new()),
            cluster: OnceLock::new(),
            load: AtomicU64::new(0),
            spares: Mutex::default(),
        }
    }
}
