//! Redis Cluster's key placement, and reading its map: a key's slot is CRC16 (XMODEM) of
//! its hash tag (or of the whole key) mod 16384; the map from slots to nodes comes from
//! `CLUSTER SHARDS` (Redis 7), or `CLUSTER SLOTS` on older servers. Pure: parsing only.

use bytes::Bytes;

use crate::resp::Value;

/// Slots in a Redis Cluster.
pub const SLOTS: usize = 16384;

/// CRC16-CCITT (XMODEM), as Redis Cluster computes it (`crc16.c` in Redis).
pub fn crc16(data: &[u8]) -> u16 {
    // Table-driven, as Redis's own crc16.c: the bitwise loop was 4.5% of the proxy's
    // samples in a P16 GET run on a cluster (bench/README.md, "Redis Cluster").
    let mut crc: u16 = 0;
    for &b in data {
        crc = (crc << 8) ^ super::placement::CRC16_TABLE[((crc >> 8) as u8 ^ b) as usize] as u16;
    }
    crc
}

/// The part of `key` Redis Cluster hashes: the first non-empty `{...}`, else the whole key
/// (Redis's `keyHashSlot`).
pub fn hashed_part(key: &[u8]) -> &[u8] {
    key.iter()
        .position(|&c| c == b'{')
        .and_then(|s| {
            let e = key[s + 1..].iter().position(|&c| c == b'}')?;
            (e > 0).then(|| &key[s + 1..s + 1 + e])
        })
        .unwrap_or(key)
}

/// The slot of `key`: CRC16 of its hashed part.
pub fn slot_of(key: &[u8]) -> u16 {
    crc16(hashed_part(key)) & (SLOTS as u16 - 1)
}

/// One node of the map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterNode {
    /// `host:port` as the cluster announces it.
    pub addr: String,
    pub id: String,
    /// Serving: a replica that is loading or failed is never used.
    pub healthy: bool,
}

/// A master, its slot ranges and its replicas.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shard {
    pub slots: Vec<(u16, u16)>,
    pub master: ClusterNode,
    pub replicas: Vec<ClusterNode>,
}

/// The cluster's map, as one node told it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    pub shards: Vec<Shard>,
    /// Nodes of shards that serve no slot now: a master without slots (just added, or a
    /// node whose change to replica the answering node has not heard of yet), a failed old
    /// master. They are nodes of the cluster all the same, and may serve slots later.
    pub others: Vec<ClusterNode>,
}

impl Topology {
    /// Every node the map names, masters first.
    pub fn addrs(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let all = self
            .shards
            .iter()
            .map(|s| &s.master)
            .chain(self.shards.iter().flat_map(|s| &s.replicas))
            .chain(&self.others);
        for n in all {
            if !out.contains(&n.addr) {
                out.push(n.addr.clone());
            }
        }
        out
    }

    /// How many of the 16384 slots have an owner.
    pub fn covered(&self) -> usize {
        self.shards
            .iter()
            .flat_map(|s| &s.slots)
            .map(|&(a, b)| (b - a) as usize + 1)
            .sum()
    }
}

fn text(v: &Value) -> Option<String> {
    match v {
        Value::Bulk(b) | Value::Simple(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::Integer(i) => Some(i.to_string()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Integer(i) => Some(*i),
        Value::Bulk(b) | Value::Simple(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    }
}

/// A map reply (RESP3) or a flat array of pairs (RESP2), as pairs.
fn pairs(v: &Value) -> Option<Vec<(String, &Value)>> {
    match v {
        Value::Map(m) => Some(m.iter().filter_map(|(k, v)| Some((text(k)?, v))).collect()),
        Value::Array(a) if a.len() % 2 == 0 => Some(
            a.chunks(2)
                .filter_map(|p| Some((text(&p[0])?, &p[1])))
                .collect(),
        ),
        _ => None,
    }
}

fn items(v: &Value) -> Option<&[Value]> {
    match v {
        Value::Array(a) | Value::Set(a) => Some(a),
        _ => None,
    }
}

/// A node's address: its endpoint (or ip when the endpoint is unknown, `?` or empty) and
/// port.
fn address(endpoint: Option<String>, ip: Option<String>, port: i64) -> Option<String> {
    let host = endpoint
        .filter(|e| !e.is_empty() && e != "?")
        .or(ip.filter(|e| !e.is_empty()))?;
    Some(format!("{host}:{port}"))
}

/// Reads a `CLUSTER SHARDS` reply. `tls`: the proxy reaches nodes over TLS, so it takes
/// their `tls-port` where both are given.
/// The error says what is wrong with the reply.
pub fn parse_shards(v: &Value, tls: bool) -> Result<Topology, &'static str> {
    let bad = |what: &'static str| what;
    let mut shards = Vec::new();
    let mut others = Vec::new();
    for shard in items(v).ok_or_else(|| bad("not an array"))? {
        let fields = pairs(shard).ok_or_else(|| bad("a shard is not a map"))?;
        let get = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
        let ranges = items(get("slots").ok_or_else(|| bad("a shard has no slots"))?)
            .ok_or_else(|| bad("slots is not an array"))?;
        let mut slots = Vec::new();
        for r in ranges.chunks(2) {
            let (Some(a), Some(b)) = (r.first().and_then(int), r.get(1).and_then(int)) else {
                return Err(bad("a slot range is not two integers"));
            };
            if !(0..SLOTS as i64).contains(&a) || !(a..SLOTS as i64).contains(&b) {
                return Err(bad("a slot range is out of bounds"));
            }
            slots.push((a as u16, b as u16));
        }
        let mut master = None;
        let mut replicas = Vec::new();
        for n in items(get("nodes").ok_or_else(|| bad("a shard has no nodes"))?)
            .ok_or_else(|| bad("nodes is not an array"))?
        {
            let f = pairs(n).ok_or_else(|| bad("a node is not a map"))?;
            let g = |name: &str| f.iter().find(|(k, _)| k == name).map(|(_, v)| *v);
            // A node may have a plain port, a TLS port, or both (`tls-port`, 7.0 and up).
            let (first, second) = if tls {
                ("tls-port", "port")
            } else {
                ("port", "tls-port")
            };
            let port = g(first)
                .or(g(second))
                .and_then(int)
                .ok_or_else(|| bad("a node has no port"))?;
            let Some(addr) = address(g("endpoint").and_then(text), g("ip").and_then(text), port)
            else {
                continue;
            };
            let node = ClusterNode {
                addr,
                id: g("id").and_then(text).unwrap_or_default(),
                healthy: g("health").and_then(text).is_none_or(|h| h == "online"),
            };
            match g("role").and_then(text).as_deref() {
                // After a failover the old master stays listed, failed, beside the new one
                // until it rejoins as a replica: the healthy master is the shard's.
                Some("master") if node.healthy || master.is_none() => {
                    if let Some(old) = master.replace(node) {
                        replicas.push(old);
                    }
                }
                _ => replicas.push(node),
            }
        }
        // A shard without a master (all failed) or without slots serves nothing now.
        match master {
            Some(master) if !slots.is_empty() => shards.push(Shard {
                slots,
                master,
                replicas,
            }),
            master => others.extend(master.into_iter().chain(replicas)),
        }
    }
    Ok(Topology { shards, others })
}

/// Reads a `CLUSTER SLOTS` reply: one entry per slot range, master first.
pub fn parse_slots(v: &Value) -> Result<Topology, &'static str> {
    let bad = |what: &'static str| what;
    let mut t = Topology::default();
    for range in items(v).ok_or_else(|| bad("not an array"))? {
        let r = items(range).ok_or_else(|| bad("a range is not an array"))?;
        let (Some(a), Some(b)) = (r.first().and_then(int), r.get(1).and_then(int)) else {
            return Err(bad("a range does not start with two integers"));
        };
        if !(0..SLOTS as i64).contains(&a) || !(a..SLOTS as i64).contains(&b) {
            return Err(bad("a slot range is out of bounds"));
        }
        let mut nodes = Vec::new();
        for n in &r[2..] {
            let n = items(n).ok_or_else(|| bad("a node is not an array"))?;
            let port = n
                .get(1)
                .and_then(int)
                .ok_or_else(|| bad("a node has no port"))?;
            let Some(addr) = address(n.first().and_then(text), None, port) else {
                continue;
            };
            nodes.push(ClusterNode {
                addr,
                id: n.get(2).and_then(text).unwrap_or_default(),
                healthy: true,
            });
        }
        let mut nodes = nodes.into_iter();
        let Some(master) = nodes.next() else {
            continue;
        };
        let range = (a as u16, b as u16);
        match t.shards.iter_mut().find(|s| s.master.addr == master.addr) {
            Some(s) => s.slots.push(range),
            None => t.shards.push(Shard {
                slots: vec![range],
                master,
                replicas: nodes.collect(),
            }),
        }
    }
    Ok(t)
}

/// A redirection in a node's error reply: `MOVED 3999 127.0.0.1:6381` or `ASK ...`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Redirect {
    /// The slot lives on `addr` now: update the map and retry there.
    Moved { slot: u16, addr: String },
    /// The slot is migrating: this command goes to `addr` once, after ASKING.
    Ask { slot: u16, addr: String },
    /// TRYAGAIN or CLUSTERDOWN: the cluster is changing; retry after a pause.
    Retry,
}

/// The redirection a raw RESP reply asks for, if it is one.
pub fn redirect(reply: &[u8]) -> Option<Redirect> {
    let line = reply.strip_prefix(b"-")?;
    let line = &line[..line.iter().position(|&c| c == b'\r').unwrap_or(line.len())];
    if line.starts_with(b"TRYAGAIN") || line.starts_with(b"CLUSTERDOWN") {
        return Some(Redirect::Retry);
    }
    let (moved, rest) = if let Some(r) = line.strip_prefix(b"MOVED ") {
        (true, r)
    } else {
        (false, line.strip_prefix(b"ASK ")?)
    };
    let rest = std::str::from_utf8(rest).ok()?;
    let (slot, addr) = rest.split_once(' ')?;
    let slot: u16 = slot.parse().ok().filter(|&s| (s as usize) < SLOTS)?;
    let addr = addr.trim().to_string();
    // `MOVED 3999 :6381`: the node did not know its own address; the caller resolves it
    // against the address it asked.
    Some(if moved {
        Redirect::Moved { slot, addr }
    } else {
        Redirect::Ask { slot, addr }
    })
}

/// `ASKING` on the wire.
pub fn asking() -> Bytes {
    Bytes::from_static(b"*1\r\n$6\r\nASKING\r\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::Bulk(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn slots_follow_redis_cluster() {
        // The reference values of the Redis Cluster specification.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"bar"), 5061);
        assert_eq!(
            slot_of(b"{user1000}.following"),
            slot_of(b"{user1000}.followers")
        );
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        // An empty tag hashes the whole key; only the first tag counts.
        assert_eq!(slot_of(b"foo{}{bar}"), crc16(b"foo{}{bar}") & 16383);
        assert_eq!(slot_of(b"foo{{bar}}zap"), crc16(b"{bar") & 16383);
        assert_eq!(slot_of(b"foo{bar}{zap}"), slot_of(b"bar"));
        assert_eq!(slot_of(b""), 0);
    }

    #[test]
    fn a_shards_reply_gives_masters_their_ranges_and_healthy_replicas() {
        let node = |ip: &str, port: i64, role: &str, health: &str| {
            Value::Array(vec![
                bulk("id"),
                bulk(&format!("id-{port}")),
                bulk("port"),
                Value::Integer(port),
                bulk("ip"),
                bulk(ip),
                bulk("endpoint"),
                bulk(ip),
                bulk("role"),
                bulk(role),
                bulk("health"),
                bulk(health),
            ])
        };
        let reply = Value::Array(vec![
            Value::Array(vec![
                bulk("slots"),
                Value::Array(vec![Value::Integer(0), Value::Integer(5460)]),
                bulk("nodes"),
                Value::Array(vec![
                    node("127.0.0.1", 7006, "master", "failed"),
                    node("127.0.0.1", 7000, "master", "online"),
                    node("127.0.0.1", 7003, "replica", "loading"),
                ]),
            ]),
            Value::Array(vec![
                bulk("slots"),
                Value::Array(vec![
                    Value::Integer(5461),
                    Value::Integer(10922),
                    Value::Integer(10923),
                    Value::Integer(16383),
                ]),
                bulk("nodes"),
                Value::Array(vec![node("127.0.0.1", 7001, "master", "online")]),
            ]),
            // A shard that lost its master serves nothing.
            Value::Array(vec![
                bulk("slots"),
                Value::Array(vec![]),
                bulk("nodes"),
                Value::Array(vec![node("127.0.0.1", 7002, "replica", "failed")]),
            ]),
        ]);
        let t = parse_shards(&reply, false).unwrap();
        assert_eq!(t.shards.len(), 2);
        assert_eq!(t.shards[0].master.addr, "127.0.0.1:7000");
        assert_eq!(t.shards[0].replicas[1].addr, "127.0.0.1:7003");
        assert!(!t.shards[0].replicas[1].healthy);
        assert_eq!(
            t.shards[0].replicas[0].addr, "127.0.0.1:7006",
            "the failed old master"
        );
        assert_eq!(t.shards[1].slots, vec![(5461, 10922), (10923, 16383)]);
        assert_eq!(t.covered(), SLOTS);
        assert_eq!(
            t.others[0].addr, "127.0.0.1:7002",
            "a node of a slotless shard"
        );
        assert_eq!(t.addrs().len(), 5);
        assert!(parse_shards(&bulk("x"), false).is_err());
    }

    #[test]
    fn a_slots_reply_groups_ranges_by_master() {
        let n = |port: i64| {
            Value::Array(vec![
                bulk("127.0.0.1"),
                Value::Integer(port),
                bulk(&format!("id{port}")),
            ])
        };
        let r = |a: i64, b: i64, m: i64, rep: i64| {
            Value::Array(vec![Value::Integer(a), Value::Integer(b), n(m), n(rep)])
        };
        let t = parse_slots(&Value::Array(vec![
            r(0, 100, 7000, 7003),
            r(101, 200, 7001, 7004),
            r(201, 16383, 7000, 7003),
        ]))
        .unwrap();
        assert_eq!(t.shards.len(), 2);
        assert_eq!(t.shards[0].slots, vec![(0, 100), (201, 16383)]);
        assert_eq!(t.shards[1].replicas[0].addr, "127.0.0.1:7004");
        assert_eq!(t.covered(), SLOTS);
    }

    #[test]
    fn redirections_are_read_from_error_replies() {
        assert_eq!(
            redirect(b"-MOVED 3999 127.0.0.1:6381\r\n"),
            Some(Redirect::Moved {
                slot: 3999,
                addr: "127.0.0.1:6381".into()
            })
        );
        assert_eq!(
            redirect(b"-ASK 3999 127.0.0.1:6381\r\n"),
            Some(Redirect::Ask {
                slot: 3999,
                addr: "127.0.0.1:6381".into()
            })
        );
        assert_eq!(
            redirect(b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n"),
            Some(Redirect::Retry)
        );
        assert_eq!(
            redirect(b"-CLUSTERDOWN The cluster is down\r\n"),
            Some(Redirect::Retry)
        );
        assert_eq!(redirect(b"-ERR MOVED 1 x\r\n"), None);
        assert_eq!(redirect(b"-MOVED 99999 a:1\r\n"), None);
        assert_eq!(redirect(b"+OK\r\n"), None);
    }
}
