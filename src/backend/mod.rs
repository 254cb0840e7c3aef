//! Backend nodes: where a key lives, and the connections that reach it.
//!
//! `Backend` is the one interface the session talks to: `node_for(key)` places a key,
//! `node(i)` gives the node's shared pipelined connections (per protocol and database,
//! created on first use) and its handshake for dedicated connections. Where keys live is
//! one implementation of `keyspace::Keyspace`, chosen at startup: a single node, a
//! twemproxy-compatible pool (`placement`), or a Redis Cluster (`cluster`, `slots`), where
//! `node_for` is a slot lookup and a MOVED or ASK reply is followed by the node's call
//! before the session sees it.

pub mod cluster;
mod conn;
mod dedicated;
mod error;
mod handshake;
mod job;
pub mod keyspace;
mod link;
mod map;
mod node;
pub mod placement;
pub mod slots;
pub mod tracking;
mod wire;

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use crate::net::tls::ClientTlsConfig;
pub use conn::{deadline, pick, Call, ConnHandle};
pub use dedicated::Dedicated;
pub use error::{BackendError, NoReplica, SetupError, UnknownName};
pub use handshake::{Handshake, NodeTls};
pub use job::Replies;
pub use map::MapError;
pub use node::{set_worker, set_workers, worker, workers, Lane, Node, NodeTable, MAX_NODES};

use crate::metrics::Metrics;
pub use crate::metrics::NodeMetrics;
use crate::resp::{encode_command, Proto};
use keyspace::Keyspace;
use placement::{Distribution, HashFn, Placement};
use serde::{Deserialize, Serialize};

/// How to reach the nodes (`backend:` in the config file; flags override it).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BackendConfig {
    /// twemproxy-style server lines: `host:port[:weight] [name]`.
    pub nodes: Vec<String>,
    /// twemproxy hash function name. Default `fnv1a_64`.
    pub hash: String,
    /// `ketama` (default) or `modula`.
    pub distribution: String,
    /// Two characters such as `{}`; only the part between them is hashed.
    pub hash_tag: Option<String>,
    /// Shared pipelined connections per node and protocol. Default 1.
    pub connections_per_node: usize,
    pub connect_timeout_ms: u64,
    /// How long a client waits for a backend reply before it gets an error. 0 = forever.
    pub request_timeout_ms: u64,
    /// First reconnect delay after a failure; doubles up to `reconnect_max_ms`.
    pub reconnect_min_ms: u64,
    pub reconnect_max_ms: u64,
    /// Backend AUTH: password alone, or ACL user and password.
    pub username: Option<String>,
    pub password: Option<String>,
    /// A Redis Cluster instead of `nodes`.
    pub cluster: Option<ClusterConfig>,
    /// TLS to every node (and to nodes a cluster adds later).
    pub tls: Option<ClientTlsConfig>,
    /// TLS settings of particular nodes, by `host:port`, in place of `tls`.
    pub tls_per_node: std::collections::BTreeMap<String, ClientTlsConfig>,
}

impl Default for BackendConfig {
    fn default() -> Self {
        BackendConfig {
            nodes: Vec::new(),
            hash: "fnv1a_64".into(),
            distribution: "ketama".into(),
            hash_tag: None,
            connections_per_node: 1,
            connect_timeout_ms: 1000,
            request_timeout_ms: 5000,
            reconnect_min_ms: 50,
            reconnect_max_ms: 2000,
            username: None,
            password: None,
            cluster: None,
            tls: None,
            tls_per_node: Default::default(),
        }
    }
}

/// A Redis Cluster behind the proxy (`backend.cluster`, `--cluster`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Nodes to learn the map from, `host:port`; any one that answers will do.
    pub seeds: Vec<String>,
    /// How often the map is read again when nothing asks for it sooner.
    pub refresh_ms: u64,
    /// Where single-slot reads go: the slot's master (default), one of its healthy
    /// replicas when there is one (`prefer_replica`), or replicas only, the master
    /// serving while none is healthy (`replica`). Replicas lag their master: a read there
    /// may not see a write just made.
    pub read_from: ReadFrom,
}

/// `backend.cluster.read_from`.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ReadFrom {
    #[default]
    Master,
    PreferReplica,
    Replica,
}

impl std::str::FromStr for ReadFrom {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<ReadFrom, UnknownName> {
        match s {
            "master" => Ok(ReadFrom::Master),
            "prefer_replica" => Ok(ReadFrom::PreferReplica),
            "replica" => Ok(ReadFrom::Replica),
            _ => Err(UnknownName {
                setting: "read_from",
                value: s.to_string(),
                known: "master, prefer_replica, replica".into(),
            }),
        }
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            seeds: Vec::new(),
            refresh_ms: 1000,
            read_from: ReadFrom::Master,
        }
    }
}

/// The set of nodes and the rule that places keys on them. Cheap to clone: a handle.
#[derive(Clone)]
pub struct Backend {
    nodes: Arc<NodeTable>,
    /// Where keys live: a single node, a pool or a Redis Cluster (`keyspace`).
    keyspace: Arc<dyn Keyspace>,
    pub request_timeout: Option<Duration>,
}

impl Backend {
    /// Builds nodes from validated config and starts their default connections. Must run
    /// inside a tokio runtime.
    pub fn new(
        cfg: &BackendConfig,
        max_reply_bulk: usize,
        metrics: &Metrics,
    ) -> Result<Backend, SetupError> {
        let tls = NodeTls::load(cfg)?;
        let mut specs = Vec::new();
        let mut nodes = Vec::new();
        for (i, line) in cfg.nodes.iter().enumerate() {
            let (addr, spec) = placement::parse_server(line)?;
            let node = Node::new(cfg, addr, i, max_reply_bulk, metrics, &tls);
            node.conns(Proto::Resp2, 0);
            nodes.push(node);
            specs.push(spec);
        }
        let keyspace: Arc<dyn Keyspace> = if nodes.len() > 1 {
            let hash: HashFn = cfg.hash.parse()?;
            let dist: Distribution = cfg.distribution.parse()?;
            let tag = cfg.hash_tag.as_ref().map(|t| {
                let b = t.as_bytes();
                [b[0], b[1]]
            });
            Arc::new(keyspace::Pool {
                placement: Arc::new(Placement::new(dist, hash, tag, &specs)),
            })
        } else {
            let databases = Arc::new(std::sync::atomic::AtomicU32::new(16));
            if let Some(node) = nodes.first() {
                tokio::spawn(learn_databases(
                    node.handshake(Proto::Resp2, 0),
                    databases.clone(),
                ));
            }
            Arc::new(keyspace::Single { databases })
        };
        let request_timeout =
            (cfg.request_timeout_ms > 0).then(|| Duration::from_millis(cfg.request_timeout_ms));
        Ok(Backend {
            nodes: Arc::new(NodeTable::new(nodes)),
            keyspace,
            request_timeout,
        })
    }

    /// A Redis Cluster backend: reads the map from the first seed that answers, makes a
    /// node of every master and replica it names, and keeps the map current in a task.
    pub async fn connect_cluster(
        cfg: &BackendConfig,
        cc: &ClusterConfig,
        max_reply_bulk: usize,
        metrics: &Metrics,
        not_ready: &tokio::sync::watch::Sender<String>,
    ) -> Result<Backend, SetupError> {
        let tls = Arc::new(NodeTls::load(cfg)?);
        // Until a seed answers, retry with backoff; `not_ready` says why (for /readyz).
        let mut backoff = Duration::from_millis(cfg.reconnect_min_ms.max(50));
        let topo = loop {
            match discover(cfg, cc, max_reply_bulk, &tls).await {
                Ok(t) => break t,
                Err(e) => {
                    let e = format!("cannot read the Redis Cluster map: {e}");
                    tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "cannot read the Redis Cluster map yet; not ready, retrying");
                    let _ = not_ready.send(e);
                    tokio::time::sleep(backoff).await;
                    backoff =
                        (backoff * 2).min(Duration::from_millis(cfg.reconnect_max_ms.max(1000)));
                }
            }
        };
        // Every node the map names, and the seeds (a node the answering seed has not
        // heard of yet is still one of the cluster's).
        let mut addrs = topo.addrs();
        for s in &cc.seeds {
            if !addrs.contains(s) {
                addrs.push(s.clone());
            }
        }
        let nodes = Arc::new(NodeTable::new(
            addrs
                .into_iter()
                .enumerate()
                .map(|(i, a)| Node::new(cfg, a, i, max_reply_bulk, metrics, &tls))
                .collect(),
        ));
        // A master that joins later becomes a node like these.
        let (cfg2, m2) = (cfg.clone(), metrics.clone());
        let make =
            move |addr: String, i: usize| Node::new(&cfg2, addr, i, max_reply_bulk, &m2, &tls);
        let c = cluster::Cluster::new(
            nodes.clone(),
            topo,
            Duration::from_millis(cc.refresh_ms.max(100)),
            cc.read_from,
            Box::new(make),
            metrics.cluster.clone(),
        );
        tokio::spawn(c.clone().run());
        let request_timeout =
            (cfg.request_timeout_ms > 0).then(|| Duration::from_millis(cfg.request_timeout_ms));
        Ok(Backend {
            nodes,
            keyspace: Arc::new(keyspace::ClusterMap(c)),
            request_timeout,
        })
    }

    /// The cluster's map, for a Redis Cluster backend.
    pub fn cluster(&self) -> Option<&Arc<cluster::Cluster>> {
        self.keyspace.cluster()
    }

    /// Whether keys are grouped by hash slot (a Redis Cluster).
    pub fn by_slot(&self) -> bool {
        self.keyspace.by_slot()
    }

    /// Where `key` goes: its group (the slot on a cluster, where keys of one command must
    /// share a slot; the node otherwise) and its node.
    #[inline]
    pub fn group_of(&self, key: &[u8]) -> (u32, usize) {
        self.keyspace.group_of(key)
    }

    /// The node a read-only command on a key of `group` (from `group_of`) goes to: its
    /// master, or on a cluster with `read_from` set, a healthy replica of it. Err names
    /// the master when `read_from: replica` finds it without a healthy replica.
    #[inline]
    pub fn reader_in(&self, group: (u32, usize)) -> Result<usize, NoReplica> {
        self.keyspace.reader_in(group).map_err(|m| NoReplica {
            master: self.node(m).addr.clone(),
            slot: group.0,
        })
    }

    /// The nodes that together hold every key: all nodes, or a cluster's masters.
    pub fn masters(&self) -> Vec<usize> {
        self.keyspace.masters(&self.nodes)
    }

    /// The pool's placement (None for a single node or a cluster).
    pub fn placement(&self) -> Option<Arc<Placement>> {
        self.keyspace.placement().cloned()
    }

    /// A pool's hash tag, if it has one.
    pub fn hash_tag(&self) -> Option<[u8; 2]> {
        self.keyspace.tag()
    }

    /// Whether a pool places keys at random (`distribution: random`).
    pub fn random(&self) -> bool {
        self.keyspace.random()
    }

    /// The index of the node that owns `key`.
    #[inline]
    pub fn node_for(&self, key: &[u8]) -> usize {
        self.keyspace.node_for(key)
    }

    pub fn node(&self, i: usize) -> &Arc<Node> {
        self.nodes.get(i)
    }

    /// Every node now (a snapshot: a cluster may add one later).
    pub fn nodes(&self) -> Vec<Arc<Node>> {
        self.nodes.all()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// One node is the whole keyspace: SELECT and every database work.
    pub fn is_single(&self) -> bool {
        self.keyspace.is_single()
    }

    /// How many databases SELECT may choose from (a single node's `databases`).
    pub fn databases(&self) -> u32 {
        self.keyspace.databases()
    }

    /// The first node whose connection is up, for keyless commands (a master, on a
    /// cluster).
    pub fn any_node(&self) -> usize {
        self.keyspace.any_node(&self.nodes)
    }
}

/// Encodes a command into a standalone wire buffer.
pub fn wire<A: AsRef<[u8]>>(args: &[A]) -> Bytes {
    let mut out = BytesMut::new();
    encode_command(args, &mut out);
    out.freeze()
}

/// The cluster's map from the first seed that answers.
async fn discover(
    cfg: &BackendConfig,
    cc: &ClusterConfig,
    max_reply_bulk: usize,
    tls: &NodeTls,
) -> Result<slots::Topology, MapError> {
    let mut last = MapError::NoNode;
    // A seed that accepts and never answers must not hold startup: each question has a
    // deadline (the connect and the handshake have their own).
    let reply_within = Duration::from_millis(match cfg.request_timeout_ms {
        0 => 5000,
        ms => ms,
    });
    for seed in &cc.seeds {
        let hs = Handshake::base(cfg, seed.clone(), max_reply_bulk, tls);
        let ask = |cmd: &'static [&'static str]| {
            let hs = &hs;
            async move {
                let call = |e| MapError::call(&hs.addr, e);
                let mut d = Dedicated::open(hs).await.map_err(call)?;
                match tokio::time::timeout(reply_within, d.call(&[wire(cmd)], 1)).await {
                    Ok(r) => r.map_err(call),
                    Err(_) => Err(MapError::Silent {
                        node: hs.addr.clone(),
                        command: cmd.join(" "),
                        ms: reply_within.as_millis(),
                    }),
                }
            }
        };
        match map::read(seed, hs.tls.is_some(), ask).await {
            Ok(t) => {
                tracing::info!(seed = %seed, masters = t.shards.len(), slots = t.covered(), "read the cluster map");
                return Ok(t);
            }
            Err(e) => {
                tracing::warn!(seed = %seed, error = %e, "cluster seed did not give the map");
                last = e;
            }
        }
    }
    Err(last)
}

/// How long the proxy's own one-off questions to a node (its `databases`, a dedicated
/// connection's CLIENT ID, the registry's subscription) wait for the answer: a node that
/// accepts but never answers must not hold the asking task for good.
pub const ASK_WITHIN: std::time::Duration = std::time::Duration::from_secs(5);

/// Asks the node for its `databases` setting, retrying until it answers, so SELECT is
/// refused with Redis's own error when out of range. Keeps the default (16) if CONFIG is
/// disabled on the node. A node that does not answer within `ASK_WITHIN` (frozen, busy
/// loading) is asked again on a new connection, as one that refused the connection is.
async fn learn_databases(hs: Handshake, out: Arc<std::sync::atomic::AtomicU32>) {
    for attempt in 0..30u64 {
        if let Ok(stream) = hs.connect().await {
            let mut d = Dedicated::from_stream(&hs.addr, stream, hs.max_reply_bulk);
            let req = [wire(&["CONFIG", "GET", "databases"])];
            if let Ok(r) = d.call_within(&req, 1, ASK_WITHIN).await {
                if let Ok(Some((crate::resp::Value::Array(a), _))) =
                    crate::resp::parse_value(&r.get(0))
                {
                    if let Some(crate::resp::Value::Bulk(n)) = a.get(1) {
                        if let Some(n) = std::str::from_utf8(n)
                            .ok()
                            .and_then(|n| n.parse::<u32>().ok())
                        {
                            out.store(n, std::sync::atomic::Ordering::Relaxed);
                        }
                    }
                }
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(200 * (attempt + 1).min(10))).await;
    }
}
