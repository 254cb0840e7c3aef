//! How keys map to nodes: one implementation of [`Keyspace`] per kind of backend, chosen
//! once at startup (`Backend::new`, `Backend::connect_cluster`). Everything else asks the
//! `Backend`, which asks its keyspace; nothing outside this file branches on which kind it
//! is, except through the questions the trait answers.
//!
//! - [`Single`]: one node holds every key and every database.
//! - [`Pool`]: a twemproxy-compatible pool; `placement` hashes keys to nodes.
//! - [`ClusterMap`]: a Redis Cluster; keys go by slot to the slot's master (or a replica
//!   for reads), and the map changes while the proxy runs (`cluster`).
//!
//! Adding a backend is one more implementation here and a constructor in `mod.rs`
//! (docs/architecture.md, "Adding a backend").

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::cluster::Cluster;
use super::node::NodeTable;
use super::placement::Placement;
use super::slots;

/// Where keys live, for one kind of backend.
pub trait Keyspace: Send + Sync {
    /// Where `key` goes: its group (keys that one command may touch together: the slot on
    /// a cluster, the node otherwise) and the node that owns it.
    fn group_of(&self, key: &[u8]) -> (u32, usize);

    /// The node that owns `key`.
    fn node_for(&self, key: &[u8]) -> usize {
        self.group_of(key).1
    }

    /// The node a read-only command on a key of `group` goes to. Err(master) when the
    /// settings want a replica and the master has no healthy one.
    fn reader_in(&self, group: (u32, usize)) -> Result<usize, usize> {
        Ok(group.1)
    }

    /// The nodes that together hold every key.
    fn masters(&self, nodes: &NodeTable) -> Vec<usize> {
        (0..nodes.len()).collect()
    }

    /// A node for a keyless command: the first one whose connection is up.
    fn any_node(&self, nodes: &NodeTable) -> usize {
        (0..nodes.len())
            .find(|&i| nodes.get(i).is_up())
            .unwrap_or(0)
    }

    /// One node is the whole keyspace: SELECT and every database work.
    fn is_single(&self) -> bool {
        false
    }

    /// How many databases SELECT may choose from.
    fn databases(&self) -> u32 {
        16
    }

    /// Whether keys are grouped by hash slot (a cluster): keys of one command must share a
    /// slot, and a slot's owner changes while the proxy runs.
    fn by_slot(&self) -> bool {
        false
    }

    /// A pool's hash tag (`hash_tag`), if it has one.
    fn tag(&self) -> Option<[u8; 2]> {
        None
    }

    /// Whether keys are placed at random (a pool with `distribution: random`): then no
    /// two keys can be counted on to share a node.
    fn random(&self) -> bool {
        false
    }

    /// The pool's placement, for code that needs the ring itself.
    fn placement(&self) -> Option<&Arc<Placement>> {
        None
    }

    /// The cluster's live map, for the cluster-only features (its CLUSTER commands, slot
    /// moves that invalidate caches).
    fn cluster(&self) -> Option<&Arc<Cluster>> {
        None
    }
}

/// One node: every key, every database (`databases` is learnt from the node).
pub struct Single {
    pub databases: Arc<AtomicU32>,
}

impl Keyspace for Single {
    fn group_of(&self, _key: &[u8]) -> (u32, usize) {
        (0, 0)
    }

    fn any_node(&self, _nodes: &NodeTable) -> usize {
        0
    }

    fn is_single(&self) -> bool {
        true
    }

    fn databases(&self) -> u32 {
        self.databases.load(Ordering::Relaxed)
    }
}

/// A twemproxy-compatible pool: the placement's hash and distribution pick the node.
pub struct Pool {
    pub placement: Arc<Placement>,
}

impl Keyspace for Pool {
    #[inline]
    fn group_of(&self, key: &[u8]) -> (u32, usize) {
        let n = self.placement.node_for(key);
        (n as u32, n)
    }

    fn tag(&self) -> Option<[u8; 2]> {
        self.placement.tag()
    }

    fn random(&self) -> bool {
        self.placement.is_random()
    }

    fn placement(&self) -> Option<&Arc<Placement>> {
        Some(&self.placement)
    }
}

/// A Redis Cluster: slots, their masters and replicas, kept current by `Cluster::run`.
pub struct ClusterMap(pub Arc<Cluster>);

impl Keyspace for ClusterMap {
    #[inline]
    fn group_of(&self, key: &[u8]) -> (u32, usize) {
        let slot = slots::slot_of(key);
        (slot as u32, self.0.owner(slot))
    }

    fn node_for(&self, key: &[u8]) -> usize {
        self.0.node_for(key)
    }

    fn reader_in(&self, group: (u32, usize)) -> Result<usize, usize> {
        self.0.reader(group.0 as u16)
    }

    fn masters(&self, _nodes: &NodeTable) -> Vec<usize> {
        self.0.masters().to_vec()
    }

    fn any_node(&self, nodes: &NodeTable) -> usize {
        let masters = self.0.masters();
        masters
            .iter()
            .copied()
            .find(|&i| nodes.get(i).is_up())
            .or(masters.first().copied())
            .unwrap_or(0)
    }

    fn databases(&self) -> u32 {
        1
    }

    fn by_slot(&self) -> bool {
        true
    }

    fn cluster(&self) -> Option<&Arc<Cluster>> {
        Some(&self.0)
    }
}
