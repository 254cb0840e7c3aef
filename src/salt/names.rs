//! Names of the keys saltshaker owns in the backend, and the choice of salts by the node
//! each shard lands on.
//!
//! Every name starts with `saltshaker:` (documented as reserved), so none can collide with a
//! user's key. A shard is `saltshaker:s:{SALT}:KEY`: the salt sits in the pool's hash-tag
//! delimiters (`{}` when the pool has none), so a hash tag inside KEY cannot pin every shard
//! to one node. Salts are searched, not drawn at random: shard `i` gets the smallest unused
//! salt whose name lands on the `i`-th node of the key's own rotation of the pool, so N
//! shards sit on N different nodes when the pool has that many, and every proxy computes
//! the same names from the same pool.

use bytes::{BufMut, Bytes, BytesMut};

/// The registry hash: field = salted key, value = its JSON record.
pub const REGISTRY_KEY: &str = "saltshaker:registry";
/// Where a proxy announces a registry change; the message is only a hint to resync.
pub const CHANNEL: &str = "saltshaker:registry:changed";
/// Every name saltshaker writes starts with this; such keys are never salted.
pub const PREFIX: &[u8] = b"saltshaker:";

/// How far the salt search goes before it settles for any node (a pool where one node has
/// almost no share of the hash space).
const SEARCH: u32 = 20_000;

/// The placement the names are chosen for: the node of a key, and the tag delimiters.
pub trait Place {
    fn node_of(&self, key: &[u8]) -> usize;
    fn nodes(&self) -> usize;
    fn tag(&self) -> [u8; 2];
}

/// `saltshaker:KIND:{N}:KEY`, with N in the pool's hash-tag delimiters.
fn owned_name(kind: &str, n: u32, tag: [u8; 2], key: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(key.len() + 24);
    b.put_slice(b"saltshaker:");
    b.put_slice(kind.as_bytes());
    b.put_u8(b':');
    b.put_u8(tag[0]);
    b.put_slice(n.to_string().as_bytes());
    b.put_u8(tag[1]);
    b.put_u8(b':');
    b.put_slice(key);
    b.freeze()
}

pub fn shard_name(key: &[u8], salt: u32, tag: [u8; 2]) -> Bytes {
    owned_name("s", salt, tag, key)
}

/// The first of `saltshaker:KIND:{N}:KEY` (N = 0, 1, ...) that lands on `node`: a name
/// every proxy derives alike, on the node whose script must update it atomically with data.
pub(super) fn on_node(p: &dyn Place, node: usize, kind: &str, key: &[u8]) -> Bytes {
    let name = |n: u32| owned_name(kind, n, p.tag(), key);
    (0..SEARCH)
        .map(name)
        .find(|n| p.node_of(n) == node)
        .unwrap_or_else(|| name(0))
}

/// The hash on the base key's node listing the fold moves already added to the base key.
pub fn applied_name(p: &dyn Place, key: &[u8]) -> Bytes {
    on_node(p, p.node_of(key), "a", key)
}

/// The hash on a shard's node holding what fold moves took out of that shard (`t` for
/// "in transit"), so a merged read counts a move exactly once at every step.
pub fn stash_name(p: &dyn Place, key: &[u8], salt: u32) -> Bytes {
    let node = p.node_of(&shard_name(key, salt, p.tag()));
    on_node(p, node, &format!("t:{salt}"), key)
}

/// Salts for shards `have.len()..n`, keeping the ones in `have`.
pub fn choose_salts(p: &dyn Place, key: &[u8], have: &[u32], n: usize) -> Vec<u32> {
    let nodes = p.nodes().max(1);
    // Each key starts its rotation at its own node + 1, so shard 0 of different hot keys
    // does not always pile onto node 0.
    let start = p.node_of(key) + 1;
    let mut out = have.to_vec();
    while out.len() < n {
        let want = (start + out.len()) % nodes;
        let pick = (0..SEARCH)
            .filter(|s| !out.contains(s))
            .find(|&s| p.node_of(&shard_name(key, s, p.tag())) == want)
            .or_else(|| (0..SEARCH).find(|s| !out.contains(s)));
        match pick {
            Some(s) => out.push(s),
            None => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::placement::{Distribution, HashFn, NodeSpec, Placement};

    struct P(Placement);
    impl Place for P {
        fn node_of(&self, key: &[u8]) -> usize {
            self.0.node_for(key)
        }
        fn nodes(&self) -> usize {
            self.0.len()
        }
        fn tag(&self) -> [u8; 2] {
            self.0.tag().unwrap_or(*b"{}")
        }
    }

    fn pool(n: usize, tag: Option<[u8; 2]>) -> P {
        let nodes: Vec<NodeSpec> = (0..n)
            .map(|i| NodeSpec {
                name: format!("127.0.0.1:{}", 7000 + i),
                weight: 1,
            })
            .collect();
        P(Placement::new(
            Distribution::Ketama,
            HashFn::Fnv1a_64,
            tag,
            &nodes,
        ))
    }

    #[test]
    fn n_shards_land_on_n_different_nodes() {
        let p = pool(4, None);
        for key in [&b"likes:1"[..], b"vote:final", b"x"] {
            let salts = choose_salts(&p, key, &[], 4);
            let mut nodes: Vec<usize> = salts
                .iter()
                .map(|&s| p.node_of(&shard_name(key, s, p.tag())))
                .collect();
            nodes.sort();
            assert_eq!(nodes, vec![0, 1, 2, 3], "{key:?}");
        }
    }

    #[test]
    fn more_shards_than_nodes_spread_evenly_and_growth_keeps_the_old_salts() {
        let p = pool(3, None);
        let first = choose_salts(&p, b"k", &[], 3);
        let more = choose_salts(&p, b"k", &first, 6);
        assert_eq!(&more[..3], &first[..]);
        let mut per = [0; 3];
        for &s in &more {
            per[p.node_of(&shard_name(b"k", s, p.tag()))] += 1;
        }
        assert_eq!(per, [2, 2, 2]);
        let mut uniq = more.clone();
        uniq.sort();
        uniq.dedup();
        assert_eq!(uniq.len(), 6);
    }

    #[test]
    fn a_hash_tag_in_the_key_does_not_pin_the_shards() {
        let p = pool(4, Some(*b"{}"));
        let key = b"user:{42}:likes";
        let salts = choose_salts(&p, key, &[], 4);
        let mut nodes: Vec<usize> = salts
            .iter()
            .map(|&s| p.node_of(&shard_name(key, s, p.tag())))
            .collect();
        nodes.sort();
        assert_eq!(nodes, vec![0, 1, 2, 3]);
        assert!(shard_name(key, 3, *b"{}").starts_with(b"saltshaker:s:{3}:user:{42}"));
    }

    #[test]
    fn fold_bookkeeping_lands_beside_the_data_it_describes() {
        for tag in [None, Some(*b"{}")] {
            let p = pool(4, tag);
            for key in [&b"likes:1"[..], b"user:{7}:votes"] {
                let a = applied_name(&p, key);
                assert_eq!(p.node_of(&a), p.node_of(key));
                assert!(a.starts_with(PREFIX));
                for s in choose_salts(&p, key, &[], 4) {
                    let t = stash_name(&p, key, s);
                    assert_eq!(p.node_of(&t), p.node_of(&shard_name(key, s, p.tag())));
                    assert_ne!(t, stash_name(&p, key, s + 1));
                }
            }
        }
    }
}
