//! What a read costs, for detection by cost: the bytes it moves (request and reply) and
//! an estimate of the node's time, attributed to its key once its reply is written.
//!
//! A single-key read, an MGET, or a single-key write of at least `GATE_BYTES` (a SET of a
//! big value) notes its key(s) and slot when it is acted on (`candidate`,
//! `RoundBuilder::note_cost`); the reply writer hands each noted reply to
//! `observe` once it is resolved. An MGET's values are each counted against their own key
//! (`observe_mget`), so a big value read only through MGET turns hot by bytes as it would
//! through GET. Only a cost
//! past the rules' floors (`rules::CostFloors`) reaches the detector: a reply under
//! `hot_at_bytes_per_sec / hot_at_per_sec` bytes (8 KiB by default) or under the node-time
//! pair's ratio (50 µs) belongs to a key that crosses the read-rate threshold first, so
//! counting it would change nothing. A reply of at least `NODE_LOAD_FLOOR_US` is added to
//! its node's load for node balance. A round whose replies together are under
//! `GATE_BYTES` costs one comparison.
//!
//! Measured first with a fixed 1 KiB floor: with every GET a 1 KiB value, detection cost
//! +19% proxy CPU per request at P16 (one sketch update without prefetch per read), against
//! +3% with small values (bench/README.md, "Hot by cost").
//!
//! The node-time estimate, from `INFO commandstats` of redis-server 7.0 on one core
//! (bench/README.md, "Hot by cost"): per call, about 1 µs, plus 84-240 ns per element of
//! an aggregate reply (ZRANGE 84, LRANGE 92, HGETALL 130, ZRANGE WITHSCORES 235, SMEMBERS
//! 240), plus 0.07 ns per byte of a string (GET of 512 KB: 35 µs). We take 120 ns per
//! element and 1 µs per 15 KB: within a factor of two of every one of those.

use bytes::Bytes;

use crate::command::{Access, Classified, Route, Split};
use crate::hotkey::{Detector, Kind};
use crate::resp::Request;
use crate::rules::CostFloors;

/// A read whose estimated node time reaches this adds it to its node's load (balance).
pub const NODE_LOAD_FLOOR_US: u64 = 10;
/// A reply shorter than this is neither counted nor estimated at 10 µs: an aggregate of
/// 75 elements (10 µs by the estimate) takes at least 300 bytes.
pub const GATE_BYTES: usize = 300;

/// A read whose reply's cost is counted against its key once written.
pub struct Cost {
    /// The read's reply slot in its round.
    pub slot: u32,
    pub request: u32,
    /// The key of a single-key read (empty for an MGET).
    pub key: Bytes,
    /// An MGET: its keys are its arguments, in the order of its reply's values. Boxed: a
    /// cost entry is pushed for every single-key read, and a `Request` inline made it
    /// 160 bytes, copied per GET.
    pub mget: Option<Box<Request>>,
    /// A write (a big value): counted against its key, not in its node's read cost.
    pub write: bool,
}

/// The cost entry of a single-key read, when detection is on (`detects`); its slot is
/// set by `RoundBuilder::note_cost` once the command is acted on.
pub(in crate::proxy) fn candidate(
    detects: bool,
    req: &Request,
    c: &Classified,
    floors: impl FnOnce() -> CostFloors,
) -> Option<Cost> {
    if !detects {
        return None;
    }
    let request = req.wire_len().min(u32::MAX as usize) as u32;
    // A write's cost is its request's, known now: one under the floors is not noted at all,
    // so that writes of middling values (1 KiB SETs) cost what they did before writes were
    // counted.
    let costly_write = c.access == Access::Write && request as usize >= GATE_BYTES && {
        let f = floors();
        request as usize >= f.bytes || 1 + u64::from(request) / 15_000 >= f.node_us
    };
    if c.access != Access::Read && !costly_write {
        return None;
    }
    if c.keys.len() == 1 {
        return Some(Cost {
            slot: 0,
            request,
            key: req.arg_bytes(c.keys[0] as usize),
            mget: None,
            write: costly_write,
        });
    }
    (c.access == Access::Read && c.route == Route::Split(Split::Mget)).then(|| Cost {
        slot: 0,
        request,
        key: Bytes::new(),
        mget: Some(Box::new(req.clone())),
        write: false,
    })
}

/// Counts each value of an MGET's reply against its key when past the floors (its bytes,
/// and a GET's node time for it); `node_load` gets each key whose value's estimated time
/// reaches `NODE_LOAD_FLOOR_US`.
pub fn observe_mget(
    detector: &Detector,
    floors: CostFloors,
    req: &Request,
    reply: &[u8],
    mut node_load: impl FnMut(&[u8], u64),
) {
    if !matches!(reply.first(), Some(b'*')) {
        return; // an error reply
    }
    let (n, mut rest) = header(reply);
    for i in 0..(n as usize).min(req.argc().saturating_sub(1)) {
        let len = match rest.first() {
            Some(b'$') if rest.get(1) != Some(&b'-') => header(rest).0 as usize,
            // A nil (`$-1` or RESP3's `_`): nothing read.
            Some(b'$' | b'_') => {
                let end = rest
                    .iter()
                    .position(|&b| b == b'\n')
                    .map_or(rest.len(), |p| p + 1);
                rest = &rest[end..];
                continue;
            }
            _ => return,
        };
        let (_, body) = header(rest);
        let whole = rest.len() - body.len() + len + 2;
        let Some(value) = rest.get(..whole) else {
            return;
        };
        rest = &rest[whole..];
        if whole < floors.bytes.min(GATE_BYTES) {
            continue;
        }
        let key = req.arg_bytes(i + 1);
        if whole >= floors.bytes {
            detector.observe_cost(&key, Kind::Bytes, whole as u64);
        }
        let us = node_us(value);
        if us >= floors.node_us {
            detector.observe_cost(&key, Kind::NodeUs, us);
        }
        if us >= NODE_LOAD_FLOOR_US {
            node_load(&key, us);
        }
    }
}

/// Counts one written reply's cost against its key when past the floors; returns its
/// estimated node microseconds when they reach `NODE_LOAD_FLOOR_US` (else 0). The caller
/// skips replies under `GATE_BYTES`.
pub fn observe(detector: &Detector, floors: CostFloors, cost: &Cost, reply: &[u8]) -> u64 {
    let bytes = reply.len() + cost.request as usize;
    if bytes >= floors.bytes {
        detector.observe_cost(&cost.key, Kind::Bytes, bytes as u64);
    }
    // A write's value is copied by the node as a read's is: 1 µs per 15 KB of it.
    let us = node_us(reply) + u64::from(cost.request) / 15_000;
    if us >= floors.node_us {
        detector.observe_cost(&cost.key, Kind::NodeUs, us);
    }
    if us >= NODE_LOAD_FLOOR_US {
        us
    } else {
        0
    }
}

/// The node's estimated microseconds for a command with this reply (see the module doc).
pub fn node_us(reply: &[u8]) -> u64 {
    let elements = match reply.first() {
        Some(b'*' | b'~' | b'>' | b'%') => {
            let (n, rest) = header(reply);
            let n = if reply[0] == b'%' { n * 2 } else { n };
            // RESP3 pairs (ZRANGE WITHSCORES): each element is an aggregate of its own.
            match rest.first() {
                Some(b'*' | b'~' | b'%') => n * header(rest).0.max(1),
                _ => n,
            }
        }
        Some(b'$' | b'=') => 1,
        _ => return 1,
    };
    1 + elements * 12 / 100 + reply.len() as u64 / 15_000
}

/// The count of an aggregate's or a bulk's header line, and what follows the line.
fn header(b: &[u8]) -> (u64, &[u8]) {
    let mut n = 0u64;
    let mut i = 1;
    while i < b.len() && b[i].is_ascii_digit() {
        n = n.saturating_mul(10).saturating_add(u64::from(b[i] - b'0'));
        i += 1;
    }
    // A negative count (`*-1`) is a nil: nothing.
    if b.get(1) == Some(&b'-') {
        n = 0;
    }
    let rest = b.get(i + 2..).unwrap_or_default();
    (n, rest)
}

#[cfg(test)]
mod tests {
    use super::node_us;

    #[test]
    fn the_estimate_follows_the_reply() {
        // A small GET is one microsecond; nothing of it reaches the floor.
        assert_eq!(node_us(b"$3\r\nabc\r\n"), 1);
        assert_eq!(node_us(b"+OK\r\n"), 1);
        assert_eq!(node_us(b"*-1\r\n"), 1);
        // ZRANGE of 100,000 members: 12 ms (redis-server measured 8.4).
        let mut z = b"*100000\r\n$7\r\nm000000\r\n".to_vec();
        z.resize(1_700_000, b'x');
        assert_eq!(node_us(&z), 1 + 12_000 + 113);
        // RESP3 WITHSCORES: 10,000 pairs are 20,000 elements.
        assert_eq!(node_us(b"*10000\r\n*2\r\n$2\r\nm1\r\n,1\r\n"), 1 + 2_400);
        // HGETALL as a RESP3 map: 50,000 fields are 100,000 elements.
        assert_eq!(node_us(b"%50000\r\n$2\r\nf1\r\n$2\r\nv1\r\n"), 1 + 12_000);
        // GET of 512 KB: 35 µs.
        let mut big = b"$524288\r\n".to_vec();
        big.resize(524_288 + 11, b'x');
        assert_eq!(node_us(&big), 1 + 34);
    }
}
