//! A promotion in force as soon as every live proxy knows it, not at the epoch boundary.
//!
//! A promotion is written to start at the first boundary at least one whole epoch ahead
//! (`record::boundary_after`, 5-10 s by default), so that every proxy knows the record
//! before any proxy writes a shard: a reader that did not know it would read the base key
//! alone. Until then the key is combined (the bridge), which leaves one node taking each
//! proxy's batches.
//!
//! What the boundary waits for can be seen instead. Every proxy keeps one subscription on
//! the registry's node, named `saltshaker-ID` (`coordinator::listen`), so that node's client
//! list names the live fleet. A proxy that has installed a promotion not yet in force says
//! so in the registry hash (field `saltshaker:seen:ID`, its value a token per pending
//! promotion, rewritten each tick while one is pending and removed after). When a proxy
//! finds every live subscriber's token for a pending promotion, it moves the promotion's
//! start to now, by compare-and-set, and announces it. Readers merge every salt of a record
//! they know, and every live proxy knows this one; writers that have not heard yet keep
//! combining into the base key, which readers merge: the safe path, as before.
//!
//! Anything missing leaves the boundary as it was: the client list cannot be read (an ACL
//! without CLIENT LIST), a proxy does not answer, a subscriber is not a saltshaker.
//! A proxy whose subscription is down while it reconnects (at most 500 ms) is not listed
//! and so not waited for; it reads the registry each tick, so it knows the record within a
//! tick of its next read, as a proxy started during a promotion does.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;

use super::names::{CHANNEL, REGISTRY_KEY, SEEN};
use super::record::Record;
use super::registry::{announce, change_if_same, node};
use super::{call, kinds, Salt, SaltError};
use crate::backend::{wire, Backend};
use crate::resp::Value;

/// The name of a proxy's subscription connection.
pub const CLIENT_NAME: &str = "saltshaker-";

/// One pending promotion: its key and its start, hashed.
fn token(key: &[u8], from_ms: u64) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(key) ^ from_ms)
}

/// Promotions not yet in force: one step, ahead of now, not demoted, not pinned, of a kind
/// that is not partitioned by member.
///
/// A pin (an SRE's promotion, or a rule's) is made ahead of a known event and gains
/// nothing from starting early; it keeps the boundary.
///
/// A key salted by member (a set, a sorted set, a hash by field) keeps the boundary: each
/// proxy learns that its base key is empty by asking it a tick after salting is in force
/// (`coordinator::check_bases`), and from then on sends a member's write to its shard
/// alone. That holds only if no proxy still writes the base key by then, which the
/// boundary's one instant for all guarantees and an early start does not: a proxy that
/// heard of the start later than a tick wrote a member into the base key after another
/// had found it empty, and a ZINCRBY then missed it (`tests/differential.rs`, one run in
/// CI). A counter's base key is merged by every read and never assumed empty.
fn pending<'a>(records: &'a [(Bytes, Record)], now: u64) -> Vec<&'a (Bytes, Record)> {
    records
        .iter()
        .filter(|(_, r)| {
            r.steps.len() == 1
                && r.steps[0].from_ms > now
                && r.demote_ms.is_none()
                && !r.pinned
                && !kinds::of(r.kind).partitioned()
        })
        .collect()
}

/// What this proxy last acknowledged (so that it announces only a change, and clears it
/// once nothing is pending).
#[derive(Default)]
pub struct Acked {
    tokens: String,
}

/// Acknowledges this proxy's pending promotions and starts those every live proxy has
/// acknowledged. `acks` are the registry's acknowledgements as read with `records`.
pub async fn step(
    backend: &Backend,
    salt: &Salt,
    records: &[(Bytes, Record)],
    acks: &HashMap<String, HashSet<String>>,
    now: u64,
    mine: &mut Acked,
) -> Result<(), SaltError> {
    let pending = pending(records, now);
    let tokens: Vec<String> = pending
        .iter()
        .map(|(k, r)| token(k, r.steps[0].from_ms))
        .collect();
    let joined = tokens.join(" ");
    let field = format!("{SEEN}{}", salt.id);
    if joined.is_empty() {
        if !mine.tokens.is_empty() {
            let cmd = wire(&[b"HDEL", REGISTRY_KEY.as_bytes(), field.as_bytes()]);
            call(backend, &[(node(backend), cmd)]).await?;
            mine.tokens.clear();
        }
        // A proxy that ended during a promotion left its field: drop it once it is gone
        // from the fleet, so that a pool with nothing salted holds no saltshaker key.
        if acks.keys().any(|id| id != &salt.id) {
            if let Some(fleet) = live_fleet(backend).await {
                for id in acks.keys().filter(|id| !fleet.contains(id)) {
                    let f = format!("{SEEN}{id}");
                    let cmd = wire(&[b"HDEL", REGISTRY_KEY.as_bytes(), f.as_bytes()]);
                    call(backend, &[(node(backend), cmd)]).await?;
                }
            }
        }
        return Ok(());
    }
    let cmd = wire(&[
        b"HSET",
        REGISTRY_KEY.as_bytes(),
        field.as_bytes(),
        joined.as_bytes(),
    ]);
    call(backend, &[(node(backend), cmd)]).await?;
    if mine.tokens != joined {
        mine.tokens = joined;
        // The others look again now, not at their next tick.
        announce(backend, b"").await;
    }
    let Some(fleet) = live_fleet(backend).await else {
        return Ok(());
    };
    for ((key, rec), tok) in pending.into_iter().zip(&tokens) {
        let all = fleet
            .iter()
            .all(|id| id == &salt.id || acks.get(id).is_some_and(|t| t.contains(tok)));
        if !all {
            continue;
        }
        let from = rec.steps[0].from_ms;
        let started = change_if_same(backend, key, rec, |r| r.steps[0].from_ms = now).await?;
        if started {
            salt.metrics.early_starts.inc();
            tracing::info!(key = %String::from_utf8_lossy(key), lead_ms = from - now, proxies = fleet.len(), "salting in force now: every live proxy knows the promotion");
        }
    }
    Ok(())
}

/// The ids of the live proxies: the registry node's subscribers named `saltshaker-ID`.
/// None when the list cannot be read, or the channel has a subscriber not so named (a
/// proxy of an older version, which does not acknowledge).
async fn live_fleet(backend: &Backend) -> Option<Vec<String>> {
    let list = wire(&[&b"CLIENT"[..], b"LIST", b"TYPE", b"pubsub"]);
    let numsub = wire(&[&b"PUBSUB"[..], b"NUMSUB", CHANNEL.as_bytes()]);
    let r = call(backend, &[(node(backend), list), (node(backend), numsub)])
        .await
        .ok()?;
    let text = match &r[0] {
        Value::Bulk(b) | Value::Verbatim(b) => String::from_utf8_lossy(b).into_owned(),
        _ => return None,
    };
    let subscribers = match &r[1] {
        Value::Array(a) => a.get(1).and_then(super::as_i64)?,
        _ => return None,
    };
    let ids: Vec<String> = text
        .lines()
        .filter_map(|line| {
            let name = line.split(' ').find_map(|f| f.strip_prefix("name="))?;
            Some(name.strip_prefix(CLIENT_NAME)?.to_string())
        })
        .collect();
    (!ids.is_empty() && ids.len() as i64 == subscribers).then_some(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_promotions_ahead_of_now_are_pending() {
        let rec = |from: u64, demote: &str| {
            let json = format!(
                r#"{{"kind":"string","salts":[1,2],"steps":[{{"from_ms":{from},"n":2}}],"hot_ms":0,"pinned":false,"demote_ms":{demote},"fold":null,"by":"a"}}"#
            );
            Record::decode(json.as_bytes()).expect("a record")
        };
        let mut zset = rec(10_000, "null");
        zset.kind = Record::decode(br#"{"kind":"zset","salts":[1],"steps":[],"hot_ms":0,"pinned":false,"demote_ms":null,"fold":null,"by":"a"}"#)
            .expect("a record")
            .kind;
        let recs = vec![
            (Bytes::from_static(b"k1"), rec(10_000, "null")),
            (Bytes::from_static(b"k2"), rec(500, "null")),
            (Bytes::from_static(b"k3"), rec(10_000, "20000")),
            (Bytes::from_static(b"k4"), zset),
        ];
        let p = pending(&recs, 1000);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].0, Bytes::from_static(b"k1"));
        // The token names the promotion: another start is another promotion.
        assert_ne!(token(b"k1", 10_000), token(b"k1", 15_000));
        assert_ne!(token(b"k1", 10_000), token(b"k2", 10_000));
    }
}
