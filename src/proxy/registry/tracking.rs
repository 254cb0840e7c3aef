//! Client-side caching through the proxy: `CLIENT TRACKING` as Redis does it, for the
//! proxy's clients.
//!
//! A client in RESP3 that turns tracking on sends every command to a node over a
//! connection of that node whose reads Redis tracks, with invalidations redirected to the
//! node's tracker (`backend::tracking`): the node then tells the proxy when any key read
//! through it changes, whoever changes it (this proxy, another one, a script, expiry,
//! eviction, FLUSHALL). The proxy keeps which of its clients read which key (`Table`, as
//! Redis's tracking table: key -> client ids, a key forgotten once invalidated) and pushes
//! `invalidate` to each of them.
//!
//! Where the node cannot track a read for the proxy (a salted key's merged read, a node
//! whose tracker is down), the client is told at once, right after the reply, so it never
//! keeps a value nobody will invalidate. When a tracker or a tracked connection is lost,
//! every tracking client is told to flush (`invalidate` with a null), as Redis does on
//! FLUSHALL. Pushes go through the session's reader, after every round it has sent, so an
//! invalidation never overtakes the reply it invalidates.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use bytes::Bytes;
use smallvec::SmallVec;

use super::clients::{Client, Clients};
use crate::backend::tracking::{Filler, Invalidation, Tracker};
use crate::backend::{Backend, ConnHandle};
use crate::metrics::{CauseLabel, TrackingMetrics};
use crate::resp::Proto;

/// What the proxy's tracking clients read, and how to reach them.
pub struct ClientTracking {
    /// Most keys remembered (Redis's `tracking-table-max-keys`); past it, a key is
    /// forgotten and its clients told to drop it.
    max_keys: AtomicUsize,
    table: Mutex<HashMap<Bytes, SmallVec<[u64; 2]>>>,
    /// Each tracking client, and the client its invalidations go to (itself, or the one
    /// it named with REDIRECT).
    clients: Mutex<HashMap<u64, u64>>,
    /// The BCAST clients and their prefixes (none: every key), in order.
    bcast: Mutex<HashMap<u64, Vec<Bytes>>>,
    registry: Arc<Clients>,
    metrics: TrackingMetrics,
    /// The nodes, for what a cluster's hook starts (the hook holds this weakly).
    backend: Backend,
    /// By node index: the node's tracker and its tracked connections, started when a
    /// tracking client first reaches the node.
    nodes: Box<[OnceLock<NodeTrack>]>,
    me: Weak<ClientTracking>,
}

struct NodeTrack {
    tracker: Tracker,
    /// By (RESP3?, database).
    fillers: Mutex<HashMap<(bool, u32), Arc<Filler>>>,
    /// Broadcasting (BCAST clients): a tracker of its own, told of every key written on
    /// the node by a connection in BCAST mode, started with the first such client.
    bcast: OnceLock<(Tracker, Filler)>,
}

impl ClientTracking {
    pub fn new(
        max_keys: usize,
        registry: Arc<Clients>,
        metrics: TrackingMetrics,
        backend: Backend,
    ) -> Arc<ClientTracking> {
        Arc::new_cyclic(|me| ClientTracking {
            max_keys: AtomicUsize::new(max_keys.max(1)),
            table: Mutex::default(),
            clients: Mutex::default(),
            bcast: Mutex::default(),
            registry,
            metrics,
            backend,
            nodes: (0..crate::backend::MAX_NODES)
                .map(|_| OnceLock::new())
                .collect(),
            me: me.clone(),
        })
    }

    pub fn set_max_keys(&self, n: usize) {
        self.max_keys.store(n.max(1), Ordering::Relaxed);
    }

    /// Client `id` turns tracking on; its invalidations go to client `to`.
    pub fn join(&self, id: u64, to: u64) {
        let mut c = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        c.insert(id, to);
        self.metrics.clients.set(c.len() as i64);
    }

    /// A client turns tracking off or leaves: nothing more is sent to it (what it read
    /// stays in the table until invalidated, as on Redis, and is skipped then).
    pub fn leave(&self, id: u64) {
        let mut c = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        c.remove(&id);
        self.metrics.clients.set(c.len() as i64);
        drop(c);
        self.bcast
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    /// Client `id` (joined) broadcasts: it is told of every key written that starts with
    /// one of `prefixes` (any key if none), whoever reads it. Starts every node's
    /// broadcasting tracker.
    pub fn broadcast_to(&self, id: u64, mut prefixes: Vec<Bytes>) {
        prefixes.sort();
        self.bcast
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(id, prefixes);
        self.start_broadcasting();
    }

    /// Slots moved on a cluster: a master new since the BCAST clients joined gets its
    /// broadcasting connection, and since writes there before it was up may be missed,
    /// the BCAST clients are told to drop everything.
    pub fn slots_moved(&self) {
        let to: Vec<u64> = {
            let b = self.bcast.lock().unwrap_or_else(|e| e.into_inner());
            let c = self.clients.lock().unwrap_or_else(|e| e.into_inner());
            b.keys().filter_map(|id| c.get(id).copied()).collect()
        };
        if to.is_empty() {
            return;
        }
        self.start_broadcasting();
        for c in to.into_iter().filter_map(|id| self.registry.get(id)) {
            self.metrics.flushes.inc();
            c.inbox.flush();
        }
    }

    /// Every node's broadcasting tracker and BCAST connection, started once.
    fn start_broadcasting(&self) {
        let backend = &self.backend;
        for node in 0..backend.len() {
            if let Some(track) = self.node(node) {
                track.bcast.get_or_init(|| {
                    let n = backend.node(node);
                    let tracker = self.tracker(n, ClientTracking::broadcast);
                    let hs = crate::backend::Handshake {
                        tracking_bcast: true,
                        ..n.handshake(Proto::Resp2, 0)
                    };
                    let filler = Filler::spawn(&tracker, &hs, n.metrics.clone(), n.cluster_link());
                    (tracker, filler)
                });
            }
        }
    }

    /// Keys a node says were written: one `invalidate` per BCAST client and prefix that
    /// they match, as Redis batches them.
    fn broadcast(&self, keys: Vec<Bytes>) {
        let sends: Vec<(u64, Vec<Vec<Bytes>>)> = self
            .bcast
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(&id, prefixes)| {
                // (The empty prefix, BCAST without PREFIX, matches every key.)
                let messages = prefixes
                    .iter()
                    .map(|p| keys.iter().filter(|k| k.starts_with(p)).cloned().collect())
                    .collect();
                (id, messages)
            })
            .collect();
        for (id, messages) in sends {
            if let Some(c) = self.inbox(id) {
                for m in messages.into_iter().filter(|m: &Vec<Bytes>| !m.is_empty()) {
                    self.count("changed");
                    c.inbox.add_message(m);
                }
            }
        }
    }

    /// Clients with tracking on (INFO's `tracking_clients`).
    pub fn clients(&self) -> usize {
        self.clients.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Keys remembered (INFO's `tracking_total_keys`).
    pub fn keys(&self) -> usize {
        self.table.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Client `id` read `key`: it is told when the key changes.
    pub fn remember(&self, key: &[u8], id: u64) {
        let mut evicted = None;
        {
            let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(ids) = t.get_mut(key) {
                if !ids.contains(&id) {
                    ids.push(id);
                }
                return;
            }
            if t.len() >= self.max_keys.load(Ordering::Relaxed) {
                if let Some(k) = t.keys().next().cloned() {
                    evicted = t.remove(&k).map(|ids| (k, ids));
                    self.metrics.evictions.inc();
                }
            }
            t.insert(Bytes::copy_from_slice(key), SmallVec::from_elem(id, 1));
            self.metrics.keys.set(t.len() as i64);
        }
        if let Some((k, ids)) = evicted {
            self.tell(k, &ids, "evicted");
        }
    }

    /// NOLOOP: client `id` wrote `key` itself and is not told of it.
    pub fn forget(&self, key: &[u8], id: u64) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ids) = t.get_mut(key) {
            ids.retain(|i| *i != id);
            if ids.is_empty() {
                t.remove(key);
                self.metrics.keys.set(t.len() as i64);
            }
        }
    }

    /// Tells client `id` at once that `key` may change unseen (it was read where the
    /// proxy cannot track it).
    pub fn now(&self, key: &[u8], id: u64, cause: &'static str) {
        if let Some(c) = self.inbox(id) {
            self.count(cause);
            c.inbox.add(Bytes::copy_from_slice(key));
        }
    }

    /// The client that takes client `id`'s invalidations, if both are still here.
    fn inbox(&self, id: u64) -> Option<Arc<Client>> {
        let to = *self
            .clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)?;
        self.registry.get(to)
    }

    fn count(&self, cause: &'static str) {
        self.metrics
            .invalidations
            .get_or_create(&CauseLabel { cause })
            .inc();
    }

    fn tell(&self, key: Bytes, ids: &[u64], cause: &'static str) {
        for &id in ids {
            if let Some(c) = self.inbox(id) {
                self.count(cause);
                c.inbox.add(key.clone());
            }
        }
    }

    /// A node says these keys changed.
    pub fn invalidate(&self, keys: Vec<Bytes>) {
        let told: Vec<(Bytes, SmallVec<[u64; 2]>)> = {
            let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
            let told = keys
                .into_iter()
                .filter_map(|k| t.remove(&k).map(|ids| (k, ids)))
                .collect();
            self.metrics.keys.set(t.len() as i64);
            told
        };
        for (k, ids) in told {
            self.tell(k, &ids, "changed");
        }
    }

    /// Keys matching `moved` changed owner (a slot moved): the new owner tracks nothing
    /// of them.
    pub fn invalidate_matching(&self, moved: &dyn Fn(&[u8]) -> bool) {
        let gone: Vec<(Bytes, SmallVec<[u64; 2]>)> = {
            let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
            let keys: Vec<Bytes> = t.keys().filter(|k| moved(k)).cloned().collect();
            let gone = keys
                .into_iter()
                .filter_map(|k| t.remove(&k).map(|ids| (k, ids)))
                .collect();
            self.metrics.keys.set(t.len() as i64);
            gone
        };
        for (k, ids) in gone {
            self.tell(k, &ids, "moved");
        }
    }

    /// Changes may have been missed (a tracker or a tracked connection was lost): every
    /// tracking client flushes, and the table starts again.
    pub fn invalidate_all(&self) {
        self.table.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let to: Vec<u64> = self
            .clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .copied()
            .collect();
        self.metrics.keys.set(0);
        if !to.is_empty() {
            tracing::info!(
                clients = to.len(),
                "telling tracking clients to drop everything: a node was flushed, or its tracking connection was lost"
            );
        }
        for c in to.into_iter().filter_map(|id| self.registry.get(id)) {
            self.metrics.flushes.inc();
            c.inbox.flush();
        }
    }

    /// Starts every node's tracker and tracked connection for this protocol and database,
    /// so that a client turning tracking on finds them up by its first reads (a read before
    /// is told at once instead).
    pub fn prepare(&self, proto: Proto, db: u32) {
        for node in 0..self.backend.len() {
            let _ = self.conn(node, proto, db);
        }
    }

    /// The tracked connection to `node` in this protocol and database; None while the
    /// node's tracker is not connected (its reads cannot be tracked now).
    pub fn conn(&self, node: usize, proto: Proto, db: u32) -> Option<ConnHandle> {
        let track = self.node(node)?;
        let n = self.backend.node(node);
        let filler = {
            let mut f = track.fillers.lock().unwrap_or_else(|e| e.into_inner());
            f.entry((proto == Proto::Resp3, db))
                .or_insert_with(|| {
                    Arc::new(Filler::spawn(
                        &track.tracker,
                        &n.handshake(proto, db),
                        n.metrics.clone(),
                        n.cluster_link(),
                    ))
                })
                .clone()
        };
        filler.conn()
    }

    /// Node `node`'s tracker, started on first use.
    fn node(&self, node: usize) -> Option<&NodeTrack> {
        let backend = &self.backend;
        let slot = self.nodes.get(node)?;
        if node >= backend.len() {
            return None;
        }
        let n = backend.node(node);
        Some(slot.get_or_init(|| NodeTrack {
            tracker: self.tracker(n, ClientTracking::invalidate),
            fillers: Mutex::default(),
            bcast: OnceLock::new(),
        }))
    }

    /// A tracker on node `n` whose keys go to `keys`; losing it flushes every client.
    fn tracker(&self, n: &crate::backend::Node, keys: fn(&ClientTracking, Vec<Bytes>)) -> Tracker {
        let me = self.me.clone();
        Tracker::spawn(&n.handshake(Proto::Resp2, 0), move |inv| {
            if let Some(me) = me.upgrade() {
                match inv {
                    Invalidation::Keys(k) => keys(&me, k),
                    Invalidation::All => me.invalidate_all(),
                }
            }
        })
    }
}

/// How a client asked to be tracked (`CLIENT TRACKING ON ...`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Every key it reads.
    #[default]
    All,
    /// Only the reads right after `CLIENT CACHING YES`.
    OptIn,
    /// Every read but those right after `CLIENT CACHING NO`.
    OptOut,
}

/// One session's tracking.
pub struct Tracking {
    /// The client its invalidations go to (REDIRECT), 0 for itself.
    pub redirect: u64,
    pub mode: Mode,
    pub noloop: bool,
    /// `CLIENT CACHING` was given for the next command (or the rest of the MULTI).
    pub caching: bool,
    /// The command `caching` was for has run: it is cleared before the next one.
    pub spent: bool,
    /// BCAST: the prefixes it is told of (an empty one: every key), sorted.
    pub prefixes: Option<Vec<Bytes>>,
    /// By node: whether its last command there went on the node's tracked connection.
    pub on_tracked: Vec<Option<bool>>,
}

impl Tracking {
    /// Whether the command being run has its keys remembered.
    pub fn remembers(&self) -> bool {
        match self.mode {
            Mode::All => true,
            Mode::OptIn => self.caching,
            Mode::OptOut => !self.caching,
        }
    }

    /// CLIENT TRACKINGINFO's flags.
    pub fn flags(&self) -> Vec<&'static str> {
        let mut f = vec!["on"];
        if self.prefixes.is_some() {
            f.push("bcast");
        }
        match (self.mode, self.caching) {
            (Mode::OptIn, true) => f.extend(["optin", "caching-yes"]),
            (Mode::OptIn, false) => f.push("optin"),
            (Mode::OptOut, true) => f.extend(["optout", "caching-no"]),
            (Mode::OptOut, false) => f.push("optout"),
            (Mode::All, _) => {}
        }
        if self.noloop {
            f.push("noloop");
        }
        f
    }
}
