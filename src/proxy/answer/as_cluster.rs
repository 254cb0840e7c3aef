//! The proxy presented to cluster-aware clients as a one-node Redis Cluster that owns all
//! 16384 slots at the proxy's own address: `CLUSTER SLOTS`, `SHARDS`, `NODES`, `INFO`,
//! `MYID` and `KEYSLOT` answer so, and `ASKING`, `READONLY` and `READWRITE` are accepted.
//! A client such as redis-py's `RedisCluster`, `redis-cli -c` or `redis-benchmark
//! --cluster` then sends every command here, and never sees a redirection (the proxy
//! follows the real cluster's).

use bytes::{Bytes, BytesMut};

use crate::backend::slots::{slot_of, SLOTS};
use crate::command::{Cmd, Spec};
use crate::proxy::conn::state::{err_bytes, Session};
use crate::resp::{encode_bulk, encode_int, encode_simple, Proto, Request};

/// A stable node id (40 hex digits) for the address clients reach the proxy at.
fn node_id(addr: &str) -> String {
    let a = xxhash_rust::xxh3::xxh3_128(addr.as_bytes());
    let b = xxhash_rust::xxh3::xxh3_64(format!("saltshaker {addr}").as_bytes());
    format!("{a:032x}{:08x}", b as u32)
}

/// The host and port clients reached this proxy at.
fn here(s: &Session) -> (String, u16) {
    match s.local().rsplit_once(':') {
        Some((h, p)) => (
            h.trim_matches(['[', ']']).to_string(),
            p.parse().unwrap_or(0),
        ),
        None => (s.local().to_string(), 0),
    }
}

fn array_header(n: usize, out: &mut BytesMut) {
    out.extend_from_slice(format!("*{n}\r\n").as_bytes());
}

/// A map of `n` pairs: a RESP3 map, or the flat array RESP2 clients expect.
fn map_header(proto: Proto, n: usize, out: &mut BytesMut) {
    match proto {
        Proto::Resp3 => out.extend_from_slice(format!("%{n}\r\n").as_bytes()),
        Proto::Resp2 => array_header(2 * n, out),
    }
}

/// The reply to a cluster command.
pub fn answer(s: &Session, req: &Request, spec: &Spec) -> Bytes {
    let (host, port) = here(s);
    let id = node_id(s.local());
    let mut out = BytesMut::new();
    match spec.cmd {
        Cmd::Asking | Cmd::Readonly | Cmd::Readwrite => encode_simple("OK", &mut out),
        Cmd::ClusterMyid => encode_bulk(id.as_bytes(), &mut out),
        Cmd::ClusterKeyslot => encode_int(slot_of(req.arg(2)) as i64, &mut out),
        Cmd::ClusterSlots => {
            array_header(1, &mut out);
            array_header(3, &mut out);
            encode_int(0, &mut out);
            encode_int(SLOTS as i64 - 1, &mut out);
            array_header(3, &mut out);
            encode_bulk(host.as_bytes(), &mut out);
            encode_int(port as i64, &mut out);
            encode_bulk(id.as_bytes(), &mut out);
        }
        Cmd::ClusterShards => {
            array_header(1, &mut out);
            map_header(s.proto(), 2, &mut out);
            encode_bulk(b"slots", &mut out);
            array_header(2, &mut out);
            encode_int(0, &mut out);
            encode_int(SLOTS as i64 - 1, &mut out);
            encode_bulk(b"nodes", &mut out);
            array_header(1, &mut out);
            map_header(s.proto(), 7, &mut out);
            for (k, v) in [
                ("id", id.as_str()),
                ("ip", host.as_str()),
                ("endpoint", host.as_str()),
                ("role", "master"),
                ("health", "online"),
            ] {
                encode_bulk(k.as_bytes(), &mut out);
                encode_bulk(v.as_bytes(), &mut out);
            }
            encode_bulk(b"port", &mut out);
            encode_int(port as i64, &mut out);
            encode_bulk(b"replication-offset", &mut out);
            encode_int(0, &mut out);
        }
        Cmd::ClusterNodes => {
            let line = format!(
                "{id} {host}:{port}@{} myself,master - 0 0 1 connected 0-{}\n",
                port as u32 + 10000,
                SLOTS - 1
            );
            encode_bulk(line.as_bytes(), &mut out);
        }
        Cmd::ClusterInfo => {
            let info = format!(
                "cluster_state:ok\r\ncluster_slots_assigned:{SLOTS}\r\ncluster_slots_ok:{SLOTS}\r\n\
                 cluster_slots_pfail:0\r\ncluster_slots_fail:0\r\ncluster_known_nodes:1\r\n\
                 cluster_size:1\r\ncluster_current_epoch:1\r\ncluster_my_epoch:1\r\n"
            );
            encode_bulk(info.as_bytes(), &mut out);
        }
        _ => {
            return err_bytes(&format!(
                "ERR saltshaker: {} is not supported through the proxy (it shows itself \
                 as a one-node cluster: CLUSTER SLOTS, SHARDS, NODES, INFO, MYID and KEYSLOT \
                 answer)",
                spec.name
            ))
        }
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_node_id_is_forty_hex_digits_and_stable() {
        let a = node_id("127.0.0.1:7000");
        assert_eq!(a.len(), 40);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(a, node_id("127.0.0.1:7000"));
        assert_ne!(a, node_id("127.0.0.1:7001"));
    }
}
