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

use crate::backend::slots::{hashed_part, slot_of, SLOTS};

/// The registry hash: field = salted key, value = its JSON record.
pub const REGISTRY_KEY: &str = "saltshaker:registry";
/// Where a proxy announces a registry change; the message is only a hint to resync.
pub const CHANNEL: &str = "saltshaker:registry:changed";
/// Every name saltshaker writes starts with this; such keys are never salted.
pub const PREFIX: &[u8] = b"saltshaker:";
/// A registry field that is a proxy's acknowledgement of pending promotions, not a record
/// (`early`); no salted key has such a name.
pub const SEEN: &str = "saltshaker:seen:";

/// How far the salt search goes before it settles for any node (a pool where one node has
/// almost no share of the hash space).
const SEARCH: u32 = 20_000;

/// The placement the names are chosen for: the node of a key, and the tag delimiters.
pub trait Place {
    fn node_of(&self, key: &[u8]) -> usize;
    fn nodes(&self) -> usize;
    fn tag(&self) -> [u8; 2];
    /// A Redis Cluster: keys named by one script must share a slot, not just a node.
    fn by_slot(&self) -> bool {
        false
    }
    /// The nodes that own keys, in order: every node of a pool, a cluster's masters.
    fn owners(&self) -> Vec<usize> {
        (0..self.nodes()).collect()
    }
}

/// A placement with one owner left out: a key salted for node balance gets no shard on the
/// node that is busiest without it (`coordinator::balance_of`).
pub struct Without<'a> {
    pub place: &'a dyn Place,
    pub node: usize,
}

impl Place for Without<'_> {
    fn node_of(&self, key: &[u8]) -> usize {
        self.place.node_of(key)
    }
    fn nodes(&self) -> usize {
        self.place.nodes()
    }
    fn tag(&self) -> [u8; 2] {
        self.place.tag()
    }
    fn by_slot(&self) -> bool {
        self.place.by_slot()
    }
    fn owners(&self) -> Vec<usize> {
        let mut o = self.place.owners();
        o.retain(|&n| n != self.node);
        o
    }
}

/// `saltshaker:KIND:{H}:KEY`, a name in `like`'s slot: `H` is what Redis Cluster hashes of
/// `like`, or, when that part holds a `}` (which a tag cannot carry: `x{}y` hashes whole),
/// the smallest number whose slot is `like`'s (`slot_tag`).
fn in_slot_of(kind: &str, like: &[u8], key: &[u8]) -> Bytes {
    let h = hashed_part(like);
    let number;
    let h = match h.contains(&b'}') {
        true => {
            number = slot_tag(slot_of(like)).to_string();
            number.as_bytes()
        }
        false => h,
    };
    let mut b = BytesMut::with_capacity(key.len() + h.len() + 24);
    b.put_slice(b"saltshaker:");
    b.put_slice(kind.as_bytes());
    b.put_slice(b":{");
    b.put_slice(h);
    b.put_slice(b"}:");
    b.put_slice(key);
    b.freeze()
}

/// The smallest number whose decimal digits hash to `slot`: a hash tag for any slot. The
/// table is built once (about 170,000 CRC16s of short strings cover every slot).
fn slot_tag(slot: u16) -> u32 {
    static TAGS: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let mut t = vec![u32::MAX; SLOTS];
        let mut left = SLOTS;
        let mut n = 0u32;
        while left > 0 && n < u32::MAX {
            let s = slot_of(n.to_string().as_bytes()) as usize;
            if t[s] == u32::MAX {
                t[s] = n;
                left -= 1;
            }
            n += 1;
        }
        t
    });
    tags[slot as usize % SLOTS]
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

/// Writers for `n` shards spread as evenly over the owners as they allow, after a slot
/// move, a failover or a new master changed where the salts land: keeps the salts of
/// `have` whose node has room (in order) and adds salts on the nodes short of their share.
/// Returns the salts (`have` first, new ones appended) and the indexes writers use.
pub fn spread_salts(p: &dyn Place, key: &[u8], have: &[u32], n: usize) -> (Vec<u32>, Vec<u32>) {
    let rot = rotation(p, key);
    let mut salts = have.to_vec();
    if rot.is_empty() || n == 0 {
        return (salts, (0..n.min(have.len()) as u32).collect());
    }
    let cap = n.div_ceil(rot.len());
    let node = |s: u32| p.node_of(&shard_name(key, s, p.tag()));
    let mut count: std::collections::HashMap<usize, usize> = Default::default();
    let mut used: Vec<u32> = Vec::new();
    for (i, &s) in have.iter().enumerate() {
        let c = count.entry(node(s)).or_default();
        if used.len() < n && *c < cap && rot.contains(&node(s)) {
            *c += 1;
            used.push(i as u32);
        }
    }
    while used.len() < n {
        // The least-used owner, earliest in the key's rotation.
        let Some(&want) = rot
            .iter()
            .min_by_key(|o| count.get(o).copied().unwrap_or(0))
        else {
            break;
        };
        let spare =
            (0..salts.len() as u32).find(|i| !used.contains(i) && node(salts[*i as usize]) == want);
        let i = match spare {
            Some(i) => i,
            None => {
                let Some(s) = salt_on(p, key, &salts, want) else {
                    break;
                };
                salts.push(s);
                salts.len() as u32 - 1
            }
        };
        *count.entry(node(salts[i as usize])).or_default() += 1;
        used.push(i);
    }
    (salts, used)
}

/// The smallest salt not in `taken` whose shard of `key` lands on `node`, else the
/// smallest not taken (a node with almost no share of the hash space); None only when
/// every salt the search covers is taken.
pub fn salt_on(p: &dyn Place, key: &[u8], taken: &[u32], node: usize) -> Option<u32> {
    (0..SEARCH)
        .find(|s| !taken.contains(s) && p.node_of(&shard_name(key, *s, p.tag())) == node)
        .or_else(|| (0..SEARCH).find(|s| !taken.contains(s)))
}

/// A key partitioned by member whose shards `list` (indexes into `salts`) share an owner
/// while another owner holds none of them, after a slot move, a failover or a new master:
/// the position in `list` of the shard to move (the last one on an owner that holds two)
/// and the owner to move it to (the first without one in the key's rotation). Members
/// are placed by position (`Record::member_salt`), so replacing one entry of the list
/// moves that shard's members only.
pub fn doubled(p: &dyn Place, key: &[u8], salts: &[u32], list: &[usize]) -> Option<(usize, usize)> {
    let node = |i: usize| p.node_of(&shard_name(key, salts[i], p.tag()));
    let on: Vec<usize> = list.iter().map(|&i| node(i)).collect();
    let free = rotation(p, key).into_iter().find(|o| !on.contains(o))?;
    let pos = (0..on.len()).rev().find(|&k| on[..k].contains(&on[k]))?;
    Some((pos, free))
}

/// The first of `saltshaker:KIND:{N}:KEY` (N = 0, 1, ...) that lands on `node`: a name
/// every proxy derives alike, on the node whose script must update it atomically with data.
pub(super) fn on_node(p: &dyn Place, node: usize, kind: &str, key: &[u8]) -> Bytes {
    let name = |n: u32| owned_name(kind, n, p.tag(), key);
    if p.by_slot() && node == p.node_of(key) {
        // On a cluster a script's keys must share a slot: the base key's, here.
        return in_slot_of(kind, key, key);
    }
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
    beside_shard(p, "t", key, salt)
}

/// `saltshaker:KIND:SALT:...` on shard `salt`'s node (in its slot on a cluster).
fn beside_shard(p: &dyn Place, kind: &str, key: &[u8], salt: u32) -> Bytes {
    let shard = shard_name(key, salt, p.tag());
    let kind = format!("{kind}:{salt}");
    if p.by_slot() {
        // In the shard's slot: the shard's own tag, `{SALT}`.
        return in_slot_of(&kind, &shard, key);
    }
    on_node(p, p.node_of(&shard), &kind, key)
}

/// The increment IDs `SALTSHAKER.INCRBY` applied to the base key (`salt` None) or to a
/// shard: a hash (ID -> the value it left) and a sorted set (ID by expiry), beside it.
pub fn ids_names(p: &dyn Place, key: &[u8], salt: Option<u32>) -> (Bytes, Bytes) {
    match salt {
        None => {
            let node = p.node_of(key);
            (on_node(p, node, "i", key), on_node(p, node, "e", key))
        }
        Some(s) => (beside_shard(p, "i", key, s), beside_shard(p, "e", key, s)),
    }
}

/// The owners in `key`'s own rotation: starting after the key's node, so shard 0 of
/// different hot keys does not always pile onto one node.
fn rotation(p: &dyn Place, key: &[u8]) -> Vec<usize> {
    let owners = p.owners();
    let at = owners
        .iter()
        .position(|&o| o == p.node_of(key))
        .map_or(0, |i| i + 1);
    (0..owners.len())
        .map(|i| owners[(at + i) % owners.len()])
        .collect()
}

/// Salts for shards `have.len()..n`, keeping the ones in `have`.
pub fn choose_salts(p: &dyn Place, key: &[u8], have: &[u32], n: usize) -> Vec<u32> {
    let rot = rotation(p, key);
    if rot.is_empty() {
        return have.to_vec();
    }
    let mut out = have.to_vec();
    while out.len() < n {
        let want = rot[out.len() % rot.len()];
        match salt_on(p, key, &out, want) {
            Some(s) => out.push(s),
            None => break,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cluster of three masters owning equal slot ranges.
    struct Slots;
    impl Place for Slots {
        fn node_of(&self, key: &[u8]) -> usize {
            crate::backend::slots::slot_of(key) as usize * 3 / 16384
        }
        fn nodes(&self) -> usize {
            3
        }
        fn tag(&self) -> [u8; 2] {
            *b"{}"
        }
        fn by_slot(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_placement_without_a_node_puts_no_shard_there() {
        for key in [&b"likes:1"[..], b"votes", b"x"] {
            for skip in 0..3 {
                let p = Without {
                    place: &Slots,
                    node: skip,
                };
                let nodes: Vec<usize> = choose_salts(&p, key, &[], 2)
                    .into_iter()
                    .map(|s| Slots.node_of(&shard_name(key, s, *b"{}")))
                    .collect();
                assert!(!nodes.contains(&skip), "{nodes:?} holds {skip}");
                assert_ne!(nodes[0], nodes[1]);
            }
        }
    }

    #[test]
    fn on_a_cluster_bookkeeping_shares_the_slot_of_what_it_keeps_books_for() {
        let slot = crate::backend::slots::slot_of;
        // The last three hash with a `}` that a tag cannot carry: a number stands in.
        for key in [
            &b"likes:1"[..],
            b"{user9}.votes",
            b"a{b",
            b"x{y",
            b"x{}y",
            b"a}b",
            b"{}}",
        ] {
            assert_eq!(slot(&applied_name(&Slots, key)), slot(key), "{key:?}");
            for s in choose_salts(&Slots, key, &[], 3) {
                let shard = shard_name(key, s, *b"{}");
                assert_eq!(slot(&stash_name(&Slots, key, s)), slot(&shard));
                let (i, e) = ids_names(&Slots, key, Some(s));
                assert_eq!((slot(&i), slot(&e)), (slot(&shard), slot(&shard)));
            }
            let (i, e) = ids_names(&Slots, key, None);
            assert_eq!((slot(&i), slot(&e)), (slot(key), slot(key)));
            let scratch = on_node(&Slots, Slots.node_of(key), "u:0", key);
            assert_eq!(slot(&scratch), slot(key));
        }
        // Three shards on three masters.
        let mut nodes: Vec<usize> = choose_salts(&Slots, b"likes:1", &[], 3)
            .iter()
            .map(|&s| Slots.node_of(&shard_name(b"likes:1", s, *b"{}")))
            .collect();
        nodes.sort();
        assert_eq!(nodes, vec![0, 1, 2]);
    }
    #[test]
    fn every_slot_has_a_number_tag() {
        for s in 0..SLOTS as u16 {
            let t = slot_tag(s);
            assert_eq!(slot_of(t.to_string().as_bytes()), s);
        }
        assert_eq!(
            slot_of(&in_slot_of("a", b"x{}y", b"x{}y")),
            slot_of(b"x{}y")
        );
    }

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

    /// A pool where a slot move put shard `moved`'s name on `to`'s node.
    struct Moved<'a>(&'a P, Bytes, usize);
    impl Place for Moved<'_> {
        fn node_of(&self, key: &[u8]) -> usize {
            if key == &self.1[..] {
                return self.2;
            }
            self.0.node_of(key)
        }
        fn nodes(&self) -> usize {
            self.0.nodes()
        }
        fn tag(&self) -> [u8; 2] {
            self.0.tag()
        }
    }

    #[test]
    fn writers_move_apart_when_two_shards_come_to_share_a_node() {
        let p = pool(4, None);
        let key = b"likes:1";
        let salts = choose_salts(&p, key, &[], 4);
        // Nothing moved: the writers stay as they are.
        assert_eq!(
            spread_salts(&p, key, &salts, 4),
            (salts.clone(), vec![0, 1, 2, 3])
        );
        let onto = p.node_of(&shard_name(key, salts[0], p.tag()));
        let moved = Moved(&p, shard_name(key, salts[1], p.tag()), onto);
        let (more, used) = spread_salts(&moved, key, &salts, 4);
        assert_eq!(
            &more[..4],
            &salts[..],
            "the old salts stay listed, for readers"
        );
        assert_eq!(used.len(), 4);
        assert!(
            !used.contains(&1),
            "the shard that moved onto another's node is left"
        );
        let mut nodes: Vec<usize> = used
            .iter()
            .map(|&i| moved.node_of(&shard_name(key, more[i as usize], p.tag())))
            .collect();
        nodes.sort();
        assert_eq!(nodes, vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_partitioned_key_moves_one_shard_to_the_owner_that_has_none() {
        let p = pool(4, None);
        let key = b"who:liked";
        let salts = choose_salts(&p, key, &[], 3);
        let list = [0, 1, 2];
        assert_eq!(
            doubled(&p, key, &salts, &list),
            None,
            "three shards, three owners"
        );
        let onto = p.node_of(&shard_name(key, salts[0], p.tag()));
        let moved = Moved(&p, shard_name(key, salts[2], p.tag()), onto);
        let (pos, to) = doubled(&moved, key, &salts, &list).expect("two shards share an owner");
        assert_eq!(pos, 2, "the later of the two moves");
        let on: Vec<usize> = list
            .iter()
            .map(|&i| moved.node_of(&shard_name(key, salts[i], p.tag())))
            .collect();
        assert!(!on.contains(&to), "it goes where no shard of the key is");
        let s = salt_on(&moved, key, &salts, to).unwrap();
        assert!(!salts.contains(&s));
        assert_eq!(moved.node_of(&shard_name(key, s, p.tag())), to);
        // As many shards as owners, all of them taken: nowhere better to go.
        let four = choose_salts(&p, key, &[], 4);
        let onto = p.node_of(&shard_name(key, four[0], p.tag()));
        let full = Moved(&p, shard_name(key, four[3], p.tag()), onto);
        assert!(doubled(&full, key, &four, &[0, 1, 2, 3]).is_some());
        assert_eq!(doubled(&p, key, &four, &[0, 1, 2, 3]), None);
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
                let (i, e) = ids_names(&p, key, None);
                assert_eq!(
                    (p.node_of(&i), p.node_of(&e)),
                    (p.node_of(key), p.node_of(key))
                );
                for s in choose_salts(&p, key, &[], 4) {
                    let (i, e) = ids_names(&p, key, Some(s));
                    let shard = p.node_of(&shard_name(key, s, p.tag()));
                    assert_eq!((p.node_of(&i), p.node_of(&e)), (shard, shard));
                    let t = stash_name(&p, key, s);
                    assert_eq!(p.node_of(&t), p.node_of(&shard_name(key, s, p.tag())));
                    assert_ne!(t, stash_name(&p, key, s + 1));
                }
            }
        }
    }
}
