//! A Redis Cluster backend: which node owns each of the 16384 slots, kept current, and
//! the redirections a node answers with followed so that clients never see them.
//!
//! - The map is read from `CLUSTER SHARDS` (`CLUSTER SLOTS` on servers before 7) at start
//!   and by `run`: on a timer, after a MOVED, and after a node's connection fails, at most
//!   once per `MIN_REFRESH` however many ask (a storm of MOVED replies is one refresh).
//! - A MOVED reply updates the slot at once and the command is sent to the new owner; an
//!   ASK reply sends it once to the importing node after `ASKING`, leaving the map alone;
//!   TRYAGAIN and CLUSTERDOWN are retried with backoff until the command's deadline
//!   (`follow`). Only then does the client get the node's error.
//! - The nodes are those the cluster announced at start (masters and replicas), so a
//!   failover to a known replica is a change of the slot table; a master added later joins
//!   the node table when the map or a redirection first names it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::{Bytes, BytesMut};
use smallvec::{smallvec, SmallVec};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::map::{self, MapError};
use super::slots::{self, redirect, Redirect, Topology, SLOTS};
use super::{pick, wire, BackendError, Node, NodeTable, ReadFrom, Replies};
use crate::metrics::{ClusterMetrics, ResultLabel};
use crate::resp::Proto;

/// No slot owner known.
const NONE: u16 = u16::MAX;
/// The least time between two reads of the map.
pub const MIN_REFRESH: Duration = Duration::from_millis(100);
/// Redirections (MOVED, ASK) followed for one command before its last reply is given to
/// the client. TRYAGAIN and CLUSTERDOWN do not count: they are retried until the deadline.
const MAX_HOPS: usize = 5;
/// How long TRYAGAIN and CLUSTERDOWN are retried when no request timeout is configured:
/// a cluster that stays down must not hold a client for ever.
const RETRY_WITHOUT_DEADLINE: Duration = Duration::from_secs(5);

/// The slot map and the nodes of one cluster.
pub struct Cluster {
    /// Owner (node index) of each slot.
    slots: Box<[AtomicU16]>,
    nodes: Arc<NodeTable>,
    by_addr: Mutex<HashMap<String, usize>>,
    /// Builds the node of a master that joined after the proxy started.
    make: Box<dyn Fn(String, usize) -> Node + Send + Sync>,
    me: std::sync::OnceLock<std::sync::Weak<Cluster>>,
    /// Node indices of the masters now, in slot order.
    masters: ArcSwap<Vec<usize>>,
    /// The healthy replicas of each master now (by node index), for `read_from`.
    replicas: ArcSwap<HashMap<usize, Vec<usize>>>,
    read_from: ReadFrom,
    /// The map as last read, for `CLUSTER` answers and logs.
    topology: ArcSwap<Topology>,
    wake: Notify,
    last_refresh: Mutex<Option<Instant>>,
    pub refresh_every: Duration,
    /// Told which keys moved (by a predicate) whenever slots change owner: the cache drops
    /// their entries, client-side caching tells its clients.
    on_move: Mutex<Vec<MoveHook>>,
    metrics: ClusterMetrics,
}

/// What `on_move` runs: given a predicate that is true for keys whose slot moved.
type MoveHook = Box<dyn Fn(&dyn Fn(&[u8]) -> bool) + Send + Sync>;

impl Cluster {
    /// The cluster over `nodes` (every node the map names), owning slots as `topo` says;
    /// `make` builds a node for a master that shows up later. Starts every node's
    /// connections.
    pub fn new(
        nodes: Arc<NodeTable>,
        topo: Topology,
        refresh_every: Duration,
        read_from: ReadFrom,
        make: Box<dyn Fn(String, usize) -> Node + Send + Sync>,
        metrics: ClusterMetrics,
    ) -> Arc<Cluster> {
        let by_addr = nodes
            .all()
            .iter()
            .map(|n| (n.addr.clone(), n.index))
            .collect();
        let c = Arc::new(Cluster {
            slots: (0..SLOTS).map(|_| AtomicU16::new(NONE)).collect(),
            nodes,
            by_addr: Mutex::new(by_addr),
            make,
            me: std::sync::OnceLock::new(),
            masters: ArcSwap::from_pointee(Vec::new()),
            replicas: ArcSwap::from_pointee(HashMap::new()),
            read_from,
            topology: ArcSwap::from_pointee(Topology::default()),
            wake: Notify::new(),
            last_refresh: Mutex::new(None),
            refresh_every,
            on_move: Mutex::default(),
            metrics,
        });
        let _ = c.me.set(Arc::downgrade(&c));
        for n in c.nodes.all() {
            let _ = n.cluster.set(Arc::downgrade(&c));
            n.conns(Proto::Resp2, 0);
        }
        c.apply(topo);
        c
    }

    /// The node that owns `key`'s slot (node 0 while a slot has no owner: it answers
    /// CLUSTERDOWN, which is retried).
    #[inline]
    pub fn node_for(&self, key: &[u8]) -> usize {
        self.owner(slots::slot_of(key))
    }

    pub fn owner(&self, slot: u16) -> usize {
        match self.slots[slot as usize].load(Ordering::Relaxed) {
            NONE => 0,
            n => n as usize,
        }
    }

    /// Where a read of `slot` goes under `read_from`: the master, or one of its healthy
    /// replicas (the slot picks which, so reads of one key stay on one replica). With
    /// `replica`, never the master: Err(master) when it has no healthy replica now.
    pub fn reader(&self, slot: u16) -> Result<usize, usize> {
        let master = self.owner(slot);
        if self.read_from == ReadFrom::Master {
            return Ok(master);
        }
        match self.replicas.load().get(&master) {
            Some(r) if !r.is_empty() => Ok(r[slot as usize % r.len()]),
            _ if self.read_from == ReadFrom::Replica => Err(master),
            _ => Ok(master),
        }
    }

    /// The masters now, in slot order: where all-node commands go.
    pub fn masters(&self) -> Arc<Vec<usize>> {
        self.masters.load_full()
    }

    pub fn topology(&self) -> Arc<Topology> {
        self.topology.load_full()
    }

    pub fn index_of(&self, addr: &str) -> Option<usize> {
        self.by_addr
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(addr)
            .copied()
    }

    /// The node at `addr`, added (connections started) if the cluster named it only now:
    /// a master added to the cluster after the proxy started. None when the table is full.
    fn node_at(&self, addr: &str) -> Option<usize> {
        if let Some(i) = self.index_of(addr) {
            return Some(i);
        }
        let mut by_addr = self.by_addr.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&i) = by_addr.get(addr) {
            return Some(i);
        }
        let i = self.nodes.push(|i| (self.make)(addr.to_string(), i))?;
        let n = self.nodes.get(i);
        if let Some(me) = self.me.get() {
            let _ = n.cluster.set(me.clone());
        }
        n.conns(Proto::Resp2, 0);
        by_addr.insert(addr.to_string(), i);
        tracing::info!(node = %addr, index = i, "a node joined the cluster; connecting to it");
        Some(i)
    }

    /// Takes a map read from a node; returns what changed, for the log.
    fn apply(&self, topo: Topology) -> Vec<String> {
        let mut changed = Vec::new();
        let mut masters = Vec::new();
        let mut replicas = HashMap::new();
        let mut owner = vec![NONE; SLOTS];
        for shard in &topo.shards {
            let Some(i) = self.node_at(&shard.master.addr) else {
                changed.push(format!(
                    "master {} cannot be added: this proxy has {} nodes already",
                    shard.master.addr,
                    super::MAX_NODES
                ));
                continue;
            };
            if !masters.contains(&i) {
                masters.push(i);
            }
            // A replica that is loading or failed is never read from.
            let healthy: Vec<usize> = shard
                .replicas
                .iter()
                .filter(|r| r.healthy)
                .filter_map(|r| self.node_at(&r.addr))
                .collect();
            replicas.insert(i, healthy);
            for &(a, b) in &shard.slots {
                for s in a..=b {
                    owner[s as usize] = i as u16;
                }
            }
        }
        // In slot order, whichever node told the map.
        masters.sort_by_key(|&i| owner.iter().position(|&o| o == i as u16));
        let served = owner.iter().filter(|&&o| o != NONE).count();
        self.metrics.slots_served.set(served as i64);
        let mut moved = vec![false; SLOTS];
        for (s, &o) in owner.iter().enumerate() {
            moved[s] = self.slots[s].swap(o, Ordering::Relaxed) != o;
        }
        let n = moved.iter().filter(|&&m| m).count();
        if n > 0 {
            changed.push(format!("{n} slots changed owner"));
            self.moved_slots(&moved);
        }
        let old = self.masters.load();
        if **old != masters {
            let names: Vec<&str> = masters
                .iter()
                .map(|&i| &self.nodes.get(i).addr[..])
                .collect();
            changed.push(format!("masters are now {}", names.join(", ")));
            self.masters.store(Arc::new(masters));
        }
        self.replicas.store(Arc::new(replicas));
        self.topology.store(Arc::new(topo));
        changed
    }

    /// Runs `f` whenever slots change owner, with a predicate that is true for the keys of
    /// those slots.
    pub fn on_move(&self, f: impl Fn(&dyn Fn(&[u8]) -> bool) + Send + Sync + 'static) {
        self.on_move
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::new(f));
    }

    fn moved_slots(&self, moved: &[bool]) {
        for f in self
            .on_move
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            f(&|k: &[u8]| moved[slots::slot_of(k) as usize]);
        }
    }

    /// Asks for a refresh of the map soon (a MOVED, a node's connection failed).
    pub fn stale(&self) {
        self.wake.notify_one();
    }

    /// A MOVED reply: `slot` is on `addr` now. Returns that node's index.
    fn moved(&self, slot: u16, addr: &str) -> Option<usize> {
        let i = self.node_at(addr)?;
        if self.slots[slot as usize].swap(i as u16, Ordering::Relaxed) != i as u16 {
            let mut moved = vec![false; SLOTS];
            moved[slot as usize] = true;
            self.moved_slots(&moved);
        }
        self.stale();
        Some(i)
    }

    /// Reads the map from the first node that answers (masters first).
    pub async fn read_map(&self, timeout: Duration) -> Result<Topology, MapError> {
        let masters = self.masters();
        let order = masters
            .iter()
            .copied()
            .chain((0..self.nodes.len()).filter(|i| !masters.contains(i)));
        let mut last = MapError::NoNode;
        for i in order {
            let node = self.nodes.get(i);
            let conn = pick(&node.conns(Proto::Resp2, 0), 0);
            let deadline = Some(Instant::now() + timeout);
            let ask = |cmd: &'static [&'static str]| {
                let (conn, addr) = (&conn, &node.addr);
                async move {
                    conn.call_direct(smallvec![wire(cmd)], 1, deadline)
                        .await
                        .map_err(|e| MapError::call(addr, e))
                }
            };
            match map::read(&node.addr, node.is_tls(), ask).await {
                Ok(t) => return Ok(t),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Keeps the map current until the process ends: every `refresh_every`, and soon after
    /// `stale`, never more often than `MIN_REFRESH`.
    pub async fn run(self: Arc<Cluster>) {
        loop {
            let _ = tokio::time::timeout(self.refresh_every, self.wake.notified()).await;
            let since = self
                .last_refresh
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .map(|t| t.elapsed());
            if let Some(since) = since.filter(|&s| s < MIN_REFRESH) {
                tokio::time::sleep(MIN_REFRESH - since).await;
            }
            *self.last_refresh.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            let result = match self.read_map(Duration::from_secs(1)).await {
                Ok(t) => {
                    for c in self.apply(t) {
                        tracing::info!(change = %c, "cluster map changed");
                    }
                    "ok"
                }
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the cluster map");
                    "failed"
                }
            };
            self.metrics
                .refreshes
                .get_or_create(&ResultLabel { result })
                .inc();
        }
    }

    /// Follows the redirections in `replies` to the commands `data` (one command each):
    /// each redirected command is sent where the cluster says, until it gets a reply that
    /// is not a redirection, `MAX_HOPS` are used, or `deadline` passes.
    pub async fn follow(
        &self,
        replies: Replies,
        data: &[Bytes],
        proto: Proto,
        from: &str,
        deadline: Option<Instant>,
    ) -> Replies {
        if !(0..replies.len()).any(|i| is_redirect(&replies, i)) {
            return replies;
        }
        let mut out = BytesMut::with_capacity(replies.buf.len());
        let mut ends = SmallVec::new();
        let started = Instant::now();
        let retry_until = deadline.unwrap_or(started + RETRY_WITHOUT_DEADLINE);
        for (i, cmd) in data.iter().enumerate().take(replies.len()) {
            let mut reply = replies.get(i);
            let mut at = from.to_string();
            let (mut hops, mut retries) = (0, 0);
            while let Some(r) = redirect(&reply) {
                let (n, kind) = match r {
                    Redirect::Retry => (&mut retries, "retry"),
                    Redirect::Moved { .. } => (&mut hops, "moved"),
                    Redirect::Ask { .. } => (&mut hops, "ask"),
                };
                if *n == MAX_HOPS && !matches!(r, Redirect::Retry) {
                    break;
                }
                self.metrics.redirect(kind);
                let hop = *n;
                *n += 1;
                match self
                    .resend(&r, cmd, proto, &at, hop, deadline, retry_until)
                    .await
                {
                    Some((next, node)) => {
                        reply = next;
                        at = node;
                    }
                    None => break,
                }
            }
            if retries > 0 && redirect(&reply) == Some(Redirect::Retry) {
                reply = gave_up(&reply, &at, started.elapsed());
            }
            out.extend_from_slice(&reply);
            ends.push(out.len() as u32);
        }
        Replies {
            buf: out.freeze(),
            ends,
        }
    }

    /// One hop: the reply of `cmd` sent where redirection `r` (answered by `at`) says, and
    /// the node that gave it. None when there is nowhere to send it (an unknown node, or a
    /// retry that would end past `retry_until`): the redirection is then the client's reply.
    async fn resend(
        &self,
        r: &Redirect,
        cmd: &Bytes,
        proto: Proto,
        at: &str,
        hop: usize,
        deadline: Option<Instant>,
        retry_until: Instant,
    ) -> Option<(Bytes, String)> {
        // `MOVED 3999 :6381`: a node that does not know its own address.
        let resolve = |addr: &str| match addr.strip_prefix(':') {
            Some(port) => format!("{}:{port}", at.rsplit_once(':').map_or(at, |(h, _)| h)),
            None => addr.to_string(),
        };
        let (node, data, want): (usize, SmallVec<[Bytes; 4]>, usize) = match r {
            Redirect::Moved { slot, addr } => {
                let node = match self.moved(*slot, &resolve(addr)) {
                    Some(n) => n,
                    None => {
                        tracing::warn!(slot, node = %addr, "MOVED to a node this proxy cannot add: its node table is full");
                        let mut e = BytesMut::new();
                        crate::resp::encode_error(
                            &format!(
                                "ERR saltshaker: slot {slot} moved to {addr}, and this proxy \
                                 cannot add another node ({} already)",
                                super::MAX_NODES
                            ),
                            &mut e,
                        );
                        return Some((e.freeze(), at.to_string()));
                    }
                };
                (node, smallvec![cmd.clone()], 0)
            }
            Redirect::Ask { addr, .. } => {
                let node = self.node_at(&resolve(addr))?;
                // ASKING holds for the next command on the connection: one job writes both.
                (node, smallvec![slots::asking(), cmd.clone()], 1)
            }
            Redirect::Retry => {
                // TRYAGAIN (a multi-key command during a migration) or CLUSTERDOWN (a
                // failover): wait a little, then ask the node that answered again.
                let pause = Duration::from_millis(10 << hop.min(4));
                if Instant::now() + pause >= retry_until {
                    return None;
                }
                self.stale();
                tokio::time::sleep(pause).await;
                (self.index_of(at)?, smallvec![cmd.clone()], 0)
            }
        };
        let n = self.nodes.get(node);
        let count = data.len() as u32;
        let conn = pick(&n.conns(proto, 0), hop);
        match conn.call_direct(data, count, deadline).await {
            Ok(r) if r.len() > want => Some((r.get(want), n.addr.clone())),
            Ok(_) => None,
            // A retry that ran into the deadline: the client hears what the node kept
            // answering (`gave_up`), not that the last try was slow.
            Err(super::BackendError::Timeout(_)) if matches!(r, Redirect::Retry) => None,
            Err(e) => Some((error_reply(&e), n.addr.clone())),
        }
    }
}

fn is_redirect(r: &Replies, i: usize) -> bool {
    let b = r.get(i);
    b.first() == Some(&b'-') && redirect(&b).is_some()
}

/// The client's reply once TRYAGAIN or CLUSTERDOWN was retried until the deadline: the
/// node's own error (its first word is the code clients look at), the node that kept
/// answering it, and for how long.
fn gave_up(reply: &[u8], node: &str, waited: Duration) -> Bytes {
    let line = reply.strip_prefix(b"-").unwrap_or(reply);
    let line = &line[..line.iter().position(|&c| c == b'\r').unwrap_or(line.len())];
    let mut out = BytesMut::new();
    crate::resp::encode_error(
        &format!(
            "{} (saltshaker: {node} answered this to every retry for {} ms)",
            String::from_utf8_lossy(line),
            waited.as_millis()
        ),
        &mut out,
    );
    out.freeze()
}

fn error_reply(e: &BackendError) -> Bytes {
    let mut out = BytesMut::new();
    crate::resp::encode_error(&format!("ERR saltshaker: {e}"), &mut out);
    out.freeze()
}
