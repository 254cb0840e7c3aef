//! Idempotent increments: `SALTSHAKER.INCRBY key delta id` adds `delta` once per
//! `(key, id)` within the rule's `write.idempotency.window_ms`, and a retry is answered
//! with the value the first try left instead of adding again.
//!
//! The IDs live beside the counter they were applied to (`names::ids_names`): a hash
//! (ID -> value left) and a sorted set (ID by expiry, to forget old IDs and to cap them at
//! `max_ids`). One script on that node checks the ID, increments and records it, so a
//! crash leaves both or neither.
//!
//! A salted counter's increment goes to the shard its ID hashes to among the shards of
//! the first step (`Placed`): the same shard on every proxy and at every epoch, so a
//! retry meets its ID. Where the ID may have been applied elsewhere within the window, it
//! is looked up there first (one HGET): on the base key for a window after the promotion
//! (IDs applied before it), on the ID's shard while the key is demoted (writes are back on
//! the base key). The fold moves a shard's IDs to the base key's lists before the record
//! goes (`fold_ids`), so after the fold the base key's lists know every ID.

use std::sync::Arc;

use bytes::Bytes;

use super::names::{ids_names, Place};
use super::record::Record;
use super::{as_i64, call, failpoint, kinds, Salt, SaltError, Salted};
use crate::backend::{wire, Backend};
use crate::resp::Value;

/// At most this many bytes of ID: an ID is a name, not a payload.
pub const MAX_ID_BYTES: usize = 256;

/// Checks the ID, increments, records the ID with its expiry, forgets expired IDs (a
/// hundred at a time) and, past `max_ids`, the oldest. Returns `{seen, value, evicted}`.
const ONCE: &str = r#"
local seen = redis.call('HGET', KEYS[2], ARGV[1])
if seen then return {1, seen, 0} end
local v = redis.call('INCRBY', KEYS[1], ARGV[2])
local now, window = tonumber(ARGV[3]), tonumber(ARGV[4])
local old = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)
if #old > 0 then
  redis.call('HDEL', KEYS[2], unpack(old))
  redis.call('ZREM', KEYS[3], unpack(old))
end
local evicted = 0
local over = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[5]) + 1
if over > 0 then
  local gone = redis.call('ZPOPMIN', KEYS[3], over)
  for i = 1, #gone, 2 do redis.call('HDEL', KEYS[2], gone[i]) end
  evicted = over
end
redis.call('HSET', KEYS[2], ARGV[1], v)
redis.call('ZADD', KEYS[3], now + window, ARGV[1])
redis.call('PEXPIRE', KEYS[2], window)
redis.call('PEXPIRE', KEYS[3], window)
return {0, tostring(v), evicted}
"#;

/// Adds IDs (triples: ID, value, expiry) to the base key's lists unless listed, keeping
/// the lists alive until the last expiry. A redo changes nothing.
const MERGE: &str = r#"
local now, last = tonumber(ARGV[1]), 0
for i = 2, #ARGV, 3 do
  local exp = tonumber(ARGV[i + 2])
  if exp > now and redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1]) == 1 then
    redis.call('ZADD', KEYS[2], exp, ARGV[i])
  end
  if exp > last then last = exp end
end
for _, k in ipairs(KEYS) do
  if last > now and redis.call('PTTL', k) < last - now then
    redis.call('PEXPIRE', k, last - now)
  end
end
return 0
"#;

/// One idempotent increment, as the client asked for it.
#[derive(Clone)]
pub struct Once {
    pub key: Bytes,
    pub delta: i64,
    pub id: Bytes,
    pub window_ms: u64,
    pub max_ids: u64,
}

/// Where an increment goes: the base key, or shard `i` of the record (`parts[1 + i]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placed {
    Base,
    Shard(usize),
}

/// Where the increment with `id` goes now, and where else it may have been applied
/// within the window. Err while salted writers are in doubt (the registry unread for an
/// epoch): an exact answer could not be promised.
pub fn places(
    rec: Option<&Record>,
    id: &[u8],
    now_ms: u64,
    fresh: bool,
    window_ms: u64,
) -> Result<(Placed, Option<Placed>), SaltError> {
    let Some(rec) = rec else {
        return Ok((Placed::Base, None));
    };
    if !fresh {
        return Err(SaltError::Refused(
            "the salt registry has not been read for an epoch: idempotent increments of a \
             salted key wait for it (retry)"
                .into(),
        ));
    }
    let first = rec
        .steps
        .first()
        .map_or((u64::MAX, 0), |s| (s.from_ms, s.n));
    let n0 = (first.1 as usize).min(rec.salts.len()).max(1);
    let shard = Placed::Shard((xxhash_rust::xxh3::xxh3_64(id) % n0 as u64) as usize);
    Ok(match rec.writers(now_ms) {
        Some(_) if now_ms < first.0.saturating_add(window_ms) => (shard, Some(Placed::Base)),
        Some(_) => (shard, None),
        None if rec.demote_ms.is_some() => (Placed::Base, Some(shard)),
        None => (Placed::Base, None),
    })
}

/// How an idempotent increment is sent.
pub enum Plan {
    /// One script on one node, in the session's round like any command: the ID cannot
    /// have been applied anywhere else. `finish` turns the script's reply into the client's.
    Inline { node: usize, cmd: Bytes, to: Placed },
    /// The ID is looked up elsewhere first: by a task (`incr`).
    Task,
}

/// How `once` is sent; Err when it is refused outright.
pub fn plan(
    backend: &Backend,
    entry: Option<&Salted>,
    once: &Once,
    now_ms: u64,
    fresh: bool,
) -> Result<Plan, SaltError> {
    counter_only(entry)?;
    let (to, other) = places(
        entry.map(|e| &e.rec),
        &once.id,
        now_ms,
        fresh,
        once.window_ms,
    )?;
    // The crash tests stop a proxy between the lookup and the script: only a task has both.
    if other.is_some() || armed() {
        return Ok(Plan::Task);
    }
    let (node, cmd) = script(backend, entry, once, now_ms, to);
    Ok(Plan::Inline { node, cmd, to })
}

fn armed() -> bool {
    static ARMED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ARMED.get_or_init(|| std::env::var_os("SALTSHAKER_FAILPOINT").is_some())
}

fn counter_only(entry: Option<&Salted>) -> Result<(), SaltError> {
    match entry {
        Some(e) if !kinds::of(e.rec.kind).idempotent() => Err(SaltError::Refused(format!(
            "SALTSHAKER.INCRBY counts strings, and this key is a salted {:?}",
            e.rec.kind
        ))),
        _ => Ok(()),
    }
}

/// The counter at `p`, and its ID lists.
fn names(
    backend: &Backend,
    entry: Option<&Salted>,
    key: &[u8],
    p: Placed,
) -> (Bytes, Bytes, Bytes) {
    match (p, entry) {
        (Placed::Shard(i), Some(e)) => {
            let (ids, exp) = ids_names(backend, key, Some(e.rec.salts[i]));
            (e.parts[1 + i].clone(), ids, exp)
        }
        _ => {
            let (ids, exp) = ids_names(backend, key, None);
            (Bytes::copy_from_slice(key), ids, exp)
        }
    }
}

/// The script that applies `once` at `to`, and its node.
fn script(
    backend: &Backend,
    entry: Option<&Salted>,
    once: &Once,
    now_ms: u64,
    to: Placed,
) -> (usize, Bytes) {
    let (target, ids, exp) = names(backend, entry, &once.key, to);
    let cmd = wire(&[
        &b"EVAL"[..],
        ONCE.as_bytes(),
        b"3",
        &target,
        &ids,
        &exp,
        &once.id,
        once.delta.to_string().as_bytes(),
        now_ms.to_string().as_bytes(),
        once.window_ms.to_string().as_bytes(),
        once.max_ids.to_string().as_bytes(),
    ]);
    (backend.node_of(&target), cmd)
}

/// The reply INCRBY would give (on a salted key, the estimate of the whole a salted INCRBY
/// gives), from the value the increment left or found.
fn answer(entry: Option<&Salted>, p: Placed, v: i64, seen: bool) -> Value {
    match (entry, p) {
        (Some(e), _) if seen => Value::Integer(e.known_total(None).unwrap_or(v)),
        (Some(e), Placed::Shard(i)) => Value::Integer(e.estimate(None, 1 + i, v)),
        (Some(e), Placed::Base) => Value::Integer(e.estimate(None, 0, v)),
        (None, _) => Value::Integer(v),
    }
}

/// The client's reply from the script's: counted in the metrics, this proxy's increment
/// noted for the display tier.
pub fn finish(salt: &Salt, entry: Option<&Salted>, to: Placed, delta: i64, r: &Value) -> Value {
    let (seen, v, evicted) = match r {
        Value::Array(a) if a.len() == 3 => match (as_i64(&a[0]), as_i64(&a[1]), as_i64(&a[2])) {
            (Some(s), Some(v), Some(n)) => (s == 1, v, n),
            _ => return unexpected(r),
        },
        // The node's own error (WRONGTYPE, not an integer, overflow): the client's to see.
        Value::Error(e) => return Value::Error(script_error(e)),
        r => return unexpected(r),
    };
    salt.metrics.idem_evicted.inc_by(evicted.max(0) as u64);
    if seen {
        salt.metrics.idem_duplicates.inc();
    } else {
        salt.metrics.idem_applied.inc();
        if let Some(e) = entry {
            e.rollup.wrote(None, delta);
        }
    }
    answer(entry, to, v, seen)
}

fn unexpected(r: &Value) -> Value {
    Value::Error(Bytes::from(format!(
        "ERR saltshaker: unexpected reply to an idempotent increment: {r:?}"
    )))
}

/// Applies `once` at most once, looking its ID up where else it may have gone first, and
/// answers as INCRBY does.
pub async fn incr(
    backend: &Backend,
    salt: &Salt,
    entry: Option<Arc<Salted>>,
    once: Once,
    now_ms: u64,
    fresh: bool,
) -> Value {
    match try_incr(backend, salt, entry.as_deref(), once, now_ms, fresh).await {
        Ok(v) => v,
        Err(e) => Value::Error(Bytes::from(format!("ERR saltshaker: {e}"))),
    }
}

async fn try_incr(
    backend: &Backend,
    salt: &Salt,
    entry: Option<&Salted>,
    once: Once,
    now_ms: u64,
    fresh: bool,
) -> Result<Value, SaltError> {
    counter_only(entry)?;
    let (to, other) = places(
        entry.map(|e| &e.rec),
        &once.id,
        now_ms,
        fresh,
        once.window_ms,
    )?;
    if let Some(p) = other {
        let (_, ids, _) = names(backend, entry, &once.key, p);
        let node = backend.node_of(&ids);
        let r = call(backend, &[(node, wire(&[&b"HGET"[..], &ids, &once.id]))]).await?;
        if let Some(v) = as_i64(&r[0]) {
            salt.metrics.idem_duplicates.inc();
            return Ok(answer(entry, p, v, true));
        }
    }
    failpoint("idem-after-check").await;
    let (node, cmd) = script(backend, entry, &once, now_ms, to);
    let r = call(backend, &[(node, cmd)]).await?;
    failpoint("idem-after-apply").await;
    Ok(finish(salt, entry, to, once.delta, &r[0]))
}

/// Redis appends the script's location to an error raised inside it: the client sees
/// INCRBY's own error, as for a plain INCRBY.
fn script_error(e: &Bytes) -> Bytes {
    let s = String::from_utf8_lossy(e);
    match s.find(" script: ") {
        Some(i) => Bytes::from(s[..i].to_string()),
        None => e.clone(),
    }
}

/// Moves every shard's increment IDs into the base key's lists, so that after the fold a
/// retry meets its ID on the base key. Each page is merged (idempotent) before the shard's
/// lists are deleted, so a fold that stops anywhere redoes this safely.
pub async fn fold_ids(backend: &Backend, key: &[u8], rec: &Record) -> Result<(), SaltError> {
    if !kinds::of(rec.kind).idempotent() {
        return Ok(());
    }
    let (base_ids, base_exp) = ids_names(backend, key, None);
    let base_node = backend.node_of(key);
    for &s in &rec.salts {
        let (ids, exp) = ids_names(backend, key, Some(s));
        let node = backend.node_of(&ids);
        let mut cursor = Bytes::from_static(b"0");
        loop {
            let r = call(
                backend,
                &[(
                    node,
                    wire(&[&b"HSCAN"[..], &ids, &cursor, b"COUNT", b"500"]),
                )],
            )
            .await?;
            let (next, items) = match &r[0] {
                Value::Array(a) if a.len() == 2 => match (&a[0], &a[1]) {
                    (Value::Bulk(c), Value::Array(items)) => (c.clone(), items.clone()),
                    _ => return Err(SaltError::Reply("unexpected HSCAN reply".into())),
                },
                v => return Err(SaltError::Reply(format!("unexpected HSCAN reply {v:?}"))),
            };
            if !items.is_empty() {
                let members: Vec<&Value> = items.iter().step_by(2).collect();
                let mut zm = vec![Bytes::from_static(b"ZMSCORE"), exp.clone()];
                zm.extend(members.iter().filter_map(|m| match m {
                    Value::Bulk(b) => Some(b.clone()),
                    _ => None,
                }));
                let scores = call(backend, &[(node, wire(&zm))]).await?;
                let Value::Array(scores) = &scores[0] else {
                    return Err(SaltError::Reply("unexpected ZMSCORE reply".into()));
                };
                let mut args = vec![
                    Bytes::from_static(b"EVAL"),
                    Bytes::from_static(MERGE.as_bytes()),
                    Bytes::from_static(b"2"),
                    base_ids.clone(),
                    base_exp.clone(),
                    Bytes::from(super::now_ms().to_string()),
                ];
                for (pair, score) in items.chunks(2).zip(scores) {
                    let (Value::Bulk(id), Value::Bulk(v)) = (&pair[0], &pair[1]) else {
                        continue;
                    };
                    // An ID without an expiry (its sorted-set entry trimmed) lives a window.
                    let exp = match score {
                        Value::Bulk(b) => String::from_utf8_lossy(b)
                            .parse::<f64>()
                            .map_or(0, |f| f as u64),
                        _ => 0,
                    };
                    args.extend([id.clone(), v.clone(), Bytes::from(exp.to_string())]);
                }
                let r = call(backend, &[(base_node, wire(&args))]).await?;
                if let Value::Error(e) = &r[0] {
                    return Err(SaltError::Reply(String::from_utf8_lossy(e).into_owned()));
                }
            }
            if &next[..] == b"0" {
                break;
            }
            cursor = next;
        }
        call(backend, &[(node, wire(&[&b"DEL"[..], &ids, &exp]))]).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::salt::record::Kind;

    fn rec(from_ms: u64, demote_ms: Option<u64>) -> Record {
        let mut r = Record::new(Kind::String, vec![3, 5, 9], from_ms, 0, "p");
        r.demote_ms = demote_ms;
        r
    }

    #[test]
    fn an_id_keeps_its_place_and_is_looked_up_where_it_may_have_gone() {
        let w = 60_000;
        assert_eq!(places(None, b"x", 5, false, w), Ok((Placed::Base, None)));
        // Before the promotion is in force: the base key, nothing elsewhere yet.
        let r = rec(10_000, None);
        assert_eq!(
            places(Some(&r), b"x", 9_999, true, w),
            Ok((Placed::Base, None))
        );
        // In force: the ID's shard, the same at every moment; the base key is asked for a
        // window after the promotion, then no more.
        let (to, other) = places(Some(&r), b"x", 10_000, true, w).unwrap();
        let Placed::Shard(i) = to else {
            panic!("{to:?}")
        };
        assert_eq!(other, Some(Placed::Base));
        assert_eq!(places(Some(&r), b"x", 10_000 + w, true, w), Ok((to, None)));
        // Shards spread over IDs.
        let mut seen = std::collections::HashSet::new();
        for n in 0..100 {
            let id = format!("id{n}");
            seen.insert(format!(
                "{:?}",
                places(Some(&r), id.as_bytes(), 20_000, true, w)
            ));
        }
        assert_eq!(seen.len(), 3);
        // Demoted: the base key, and the ID's shard is asked.
        let d = rec(10_000, Some(30_000));
        assert_eq!(
            places(Some(&d), b"x", 31_000, true, w),
            Ok((Placed::Base, Some(Placed::Shard(i))))
        );
        // In doubt about the registry: refused, not guessed.
        assert!(places(Some(&r), b"x", 20_000, false, w).is_err());
    }

    #[test]
    fn a_script_error_reads_as_the_command_s_own() {
        let e = Bytes::from_static(
            b"WRONGTYPE Operation against a key holding the wrong kind of value script: 1a2b, on @user_script:4.",
        );
        assert_eq!(
            &script_error(&e)[..],
            b"WRONGTYPE Operation against a key holding the wrong kind of value"
        );
    }
}
