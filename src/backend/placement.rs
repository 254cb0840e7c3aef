//! Which node of a pool holds a key, placed exactly as twemproxy (nutcracker) 0.5 places it,
//! so an existing twemproxy pool can switch to saltshaker without moving a key. The hashes
//! themselves live in `hash.rs`; connections and failover are the pool's business.
//!
//! Compatibility covers what twemproxy derives from its configuration: the server name it
//! hashes (`parse_server`), the `hash_tag` rule, the ketama continuum with its float
//! arithmetic, modula's weight-repeated slots, and the order twemproxy sorts servers into
//! (by name) before placing them. Auto-ejection is not modelled: every node is placed as
//! live, which is twemproxy's placement with `auto_eject_hosts: false`.

#[path = "hash.rs"]
mod hash;

/// Shared with `slots::crc16`: Redis Cluster hashes slots with the same CRC16.
pub(super) use self::hash::CRC16_TABLE;
pub use self::hash::{hash, HashFn};

use std::cell::Cell;
use std::str::FromStr;

use super::{SetupError, UnknownName};

/// How keys are spread over nodes, named as twemproxy's `distribution:` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Distribution {
    Ketama,
    Modula,
    Random,
}

impl FromStr for Distribution {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, UnknownName> {
        match s {
            "ketama" => Ok(Self::Ketama),
            "modula" => Ok(Self::Modula),
            "random" => Ok(Self::Random),
            _ => Err(UnknownName {
                setting: "distribution",
                value: s.to_string(),
                known: "ketama, modula, random".into(),
            }),
        }
    }
}

/// The part of `key` that is hashed. twemproxy takes the first opening char, then the first
/// closing char after it; only a non-empty part between them replaces the key, so `a{}b`
/// and `a{b` hash whole, and `{}{x}` hashes whole too (the first pair decides).
pub fn hash_tag(key: &[u8], tag: Option<[u8; 2]>) -> &[u8] {
    let Some([open, close]) = tag else {
        return key;
    };
    let Some(start) = key.iter().position(|&b| b == open) else {
        return key;
    };
    let inner = &key[start + 1..];
    match inner.iter().position(|&b| b == close) {
        Some(end) if end > 0 => &inner[..end],
        _ => key,
    }
}

/// One node as twemproxy sees it for placement.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    /// The name twemproxy hashes: the explicit name if given, else "host:port" as written
    /// (only "host" when the port is 11211, libmemcached's convention twemproxy keeps).
    pub name: String,
    pub weight: u32,
}

/// A pool's placement, built once per server list; `node_for` is the per-key hot path.
#[derive(Clone, Debug)]
pub struct Placement {
    len: usize,
    hash: HashFn,
    tag: Option<[u8; 2]>,
    kind: Kind,
}

#[derive(Clone, Debug)]
enum Kind {
    /// The continuum sorted by point; `owners[i]` is the node of `points[i]`. Two arrays
    /// keep the search on a dense `u32` slice. `starts[b]` is the first point whose top
    /// `bits` bits are at least `b`, so a lookup binary-searches one bucket of about one
    /// point instead of the whole circle (measured: ~10 ns less per lookup at 16 nodes).
    Ketama {
        points: Vec<u32>,
        owners: Vec<u32>,
        starts: Vec<u32>,
        bits: u32,
    },
    /// twemproxy lays each node `weight` times in a row and picks slot `hash % total`:
    /// `ends` holds the running sums of weights, and the slot belongs to the first node
    /// whose running sum exceeds it; `owners` maps that position back to the caller's index.
    Modula {
        ends: Vec<u64>,
        owners: Vec<u32>,
    },
    Random,
}

const KETAMA_POINTS_PER_SERVER: f32 = 160.0;
const KETAMA_POINTS_PER_HASH: u32 = 4;
/// twemproxy formats "name-N" into a buffer of this size, so longer strings are cut.
const KETAMA_MAX_HOSTLEN: usize = 86;

impl Placement {
    /// Builds the placement for `nodes`; `node_for` returns indices into `nodes`. An empty
    /// list gives a placement of `len() == 0`. Names should be unique and weights at least
    /// 1, as twemproxy insists; `check_nodes` says so before a pool is built.
    pub fn new(
        dist: Distribution,
        hash: HashFn,
        hash_tag: Option<[u8; 2]>,
        nodes: &[NodeSpec],
    ) -> Self {
        let order = twemproxy_order(nodes);
        let kind = match dist {
            Distribution::Ketama => ketama_continuum(nodes, &order),
            Distribution::Modula => {
                let mut sum = 0u64;
                let ends = order
                    .iter()
                    .map(|&i| {
                        sum += u64::from(nodes[i as usize].weight);
                        sum
                    })
                    .collect();
                Kind::Modula {
                    ends,
                    owners: order,
                }
            }
            Distribution::Random => Kind::Random,
        };
        Placement {
            len: nodes.len(),
            hash,
            tag: hash_tag,
            kind,
        }
    }

    /// The pool's hash-tag delimiters, if any: salted shard names carry their own tag.
    pub fn tag(&self) -> Option<[u8; 2]> {
        self.tag
    }

    /// Random placement puts a key anywhere: a shard could not be found again.
    pub fn is_random(&self) -> bool {
        matches!(self.kind, Kind::Random) && self.len > 1
    }

    /// The index of the node that holds `key`. Never allocates. With `Random`, a fresh
    /// node per call with weights ignored, as twemproxy does.
    pub fn node_for(&self, key: &[u8]) -> usize {
        if self.len <= 1 {
            return 0;
        }
        let key = hash_tag(key, self.tag);
        // twemproxy skips the hash for an empty key and places it as hash 0.
        let h = if key.is_empty() {
            0
        } else {
            hash(self.hash, key)
        };
        self.node_for_hash(h)
    }

    /// The node for an already computed twemproxy hash (ketama and modula).
    pub fn node_for_hash(&self, h: u32) -> usize {
        match &self.kind {
            Kind::Ketama {
                points,
                owners,
                starts,
                bits,
            } => {
                // First point at or after the hash, wrapping to the start of the circle.
                // Points before the bucket are below `h` and the bucket's end is above it.
                let b = (u64::from(h) >> (32 - bits)) as usize;
                let (lo, hi) = match (starts.get(b), starts.get(b + 1)) {
                    (Some(&lo), Some(&hi)) => (lo as usize, hi as usize),
                    _ => (0, points.len()),
                };
                let i = lo
                    + points
                        .get(lo..hi)
                        .map_or(0, |s| s.partition_point(|&p| p < h));
                let i = if i >= points.len() { 0 } else { i };
                owners.get(i).map_or(0, |&o| o as usize)
            }
            Kind::Modula { ends, owners } => {
                let total = ends.last().copied().unwrap_or(0);
                if total == 0 {
                    return 0;
                }
                let slot = u64::from(h) % total;
                let i = ends.partition_point(|&e| e <= slot);
                owners.get(i).map_or(0, |&o| o as usize)
            }
            Kind::Random => (next_random() % self.len as u64) as usize,
        }
    }

    /// Number of nodes placed over.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Points on the ketama continuum (0 for modula and random); 160 per node of equal weight.
    pub fn continuum_len(&self) -> usize {
        match &self.kind {
            Kind::Ketama { points, .. } => points.len(),
            _ => 0,
        }
    }
}

/// The order twemproxy keeps its servers in: while checking for duplicate names it sorts
/// them by name (shorter first, then bytewise) and never restores the file's order. Modula
/// slots follow this order, and so do ties between equal ketama points.
fn twemproxy_order(nodes: &[NodeSpec]) -> Vec<u32> {
    let mut order: Vec<u32> = (0..nodes.len() as u32).collect();
    order.sort_by(|&a, &b| {
        let (a, b) = (
            nodes[a as usize].name.as_bytes(),
            nodes[b as usize].name.as_bytes(),
        );
        a.len().cmp(&b.len()).then_with(|| a.cmp(b))
    });
    order
}

/// Checks what twemproxy refuses at startup: duplicate names and zero weights.
pub fn check_nodes(nodes: &[NodeSpec]) -> Result<(), SetupError> {
    if let Some(n) = nodes.iter().find(|n| n.weight == 0) {
        return Err(SetupError::ZeroWeight(n.name.clone()));
    }
    let mut names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    names.sort_unstable();
    match names.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(SetupError::SharedName(w[0].to_string())),
        None => Ok(()),
    }
}

/// twemproxy's `ketama_update` with every node live.
fn ketama_continuum(nodes: &[NodeSpec], order: &[u32]) -> Kind {
    let total_weight: u64 = nodes.iter().map(|n| u64::from(n.weight)).sum();
    let live = nodes.len() as f32;
    let mut pairs: Vec<(u32, u32)> = Vec::with_capacity(nodes.len() * 160);
    let mut host = Vec::with_capacity(KETAMA_MAX_HOSTLEN + 16);
    for &index in order {
        let node = &nodes[index as usize];
        for p in 0..ketama_hashes_for(node.weight, total_weight, live) {
            host.clear();
            host.extend_from_slice(node.name.as_bytes());
            host.push(b'-');
            host.extend_from_slice(p.to_string().as_bytes());
            for value in hash::md5_words(ketama_host(&mut host)) {
                pairs.push((value, index));
            }
        }
    }
    // glibc's qsort is a merge sort here, so equal points keep server order.
    pairs.sort_by_key(|&(value, _)| value);
    let points: Vec<u32> = pairs.iter().map(|&(v, _)| v).collect();
    // About one point per bucket: 10 bits (4 KiB) for 4 nodes, 12 bits for 16.
    let bits = (points.len().max(1).next_power_of_two().trailing_zeros()).clamp(4, 16);
    let starts = (0..=1u64 << bits)
        .map(|b| points.partition_point(|&p| u64::from(p) < b << (32 - bits)) as u32)
        .collect();
    Kind::Ketama {
        owners: pairs.iter().map(|&(_, o)| o).collect(),
        points,
        starts,
        bits,
    }
}

/// How many "name-N" strings a node gets. The C code computes this in `float`, adds a
/// `double` epsilon and floors in `float` again; the same steps give the same counts for
/// weights whose share is not a whole number of points.
fn ketama_hashes_for(weight: u32, total_weight: u64, live: f32) -> u32 {
    if total_weight == 0 {
        return 0;
    }
    let pct = weight as f32 / total_weight as f32;
    let scaled = pct * KETAMA_POINTS_PER_SERVER / 4.0 * live;
    let floored = ((f64::from(scaled) + 0.000_000_000_1) as f32).floor();
    let points = (floored * 4.0) as u32;
    points / KETAMA_POINTS_PER_HASH
}

/// The bytes twemproxy hashes for one "name-N": `snprintf` into an 86-byte zeroed buffer
/// keeps 85 bytes and a NUL, while md5 reads the untruncated length. Past 86 bytes
/// twemproxy reads outside its buffer; we assume zeros there (names that long are rare).
fn ketama_host(host: &mut Vec<u8>) -> &[u8] {
    if host.len() >= KETAMA_MAX_HOSTLEN {
        let full = host.len();
        host.truncate(KETAMA_MAX_HOSTLEN - 1);
        host.resize(full, 0);
    }
    host
}

thread_local! {
    static RANDOM: Cell<u64> = Cell::new(seed());
}

/// A per-thread seed, so threads do not pick nodes in lockstep.
fn seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
        | 1
}

/// xorshift64*: node choice for `random` needs spread, not secrecy.
pub(crate) fn next_random() -> u64 {
    RANDOM.with(|s| {
        let mut x = s.get();
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        s.set(x);
        x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32
    })
}

/// Parses a twemproxy server line `host:port:weight [name]`; the weight may be left out
/// here (`host:port`, weight 1). Returns the address to connect to ("host:port") and the
/// node as twemproxy places it. Unix-socket lines are refused: the backends are TCP.
pub fn parse_server(s: &str) -> Result<(String, NodeSpec), SetupError> {
    let bad = |why: &'static str| SetupError::Server {
        line: s.to_string(),
        why,
    };
    let (spec, name) = match s.rfind(' ') {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    };
    if name == Some("") {
        return Err(bad("empty name after the space"));
    }
    if spec.starts_with('/') {
        return Err(bad("unix sockets are not supported"));
    }
    // Like twemproxy, split from the right, so an IPv6 host may keep its colons.
    let (host, port_text, weight) = match spec.matches(':').count() {
        0 => return Err(bad("missing port")),
        1 => {
            let (host, port) = spec.split_once(':').unwrap_or((spec, ""));
            (host, port, 1)
        }
        _ => {
            let mut parts = spec.rsplitn(3, ':');
            let weight_text = parts.next().unwrap_or("");
            let port = parts.next().unwrap_or("");
            let host = parts.next().unwrap_or("");
            let weight = c_atoi(weight_text).ok_or_else(|| bad("weight is not a number"))?;
            if weight == 0 {
                return Err(bad("weight must be at least 1"));
            }
            (host, port, weight)
        }
    };
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    let port = c_atoi(port_text).ok_or_else(|| bad("port is not a number"))?;
    if !(1..=65535).contains(&port) {
        return Err(bad("port out of range"));
    }
    let address = format!("{host}:{port_text}");
    let name = match name {
        Some(n) => n.to_string(),
        None if port == 11211 => host.to_string(),
        None => address.clone(),
    };
    Ok((address, NodeSpec { name, weight }))
}

/// twemproxy's `nc_atoi`: decimal digits only, no sign, and the value must fit an `int`.
fn c_atoi(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u32>().ok().filter(|&n| n <= i32::MAX as u32)
}

#[cfg(test)]
#[path = "placement_tests.rs"]
mod tests;
