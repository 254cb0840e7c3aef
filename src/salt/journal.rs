//! Moving shard values into the base key without losing or doubling an increment, even
//! when the proxy doing it dies between any two steps, and without a merged read ever
//! counting a moved value twice or not at all.
//!
//! A move of shard `i` is: read its value `v`; journal `{id, i, v}` in the key's registry
//! record (compare-and-set, which also renews this proxy's claim); take `v` out of the
//! shard; add `v` to the base key; clear the journal. Each middle step is one Lua script on
//! the node that holds the data, and runs at most once per move id:
//!
//! - *take* (shard's node): unless the stash hash already lists the move, record
//!   `id:field -> v` in it (`names::stash_name`, on the shard's node) and subtract `v` from
//!   the shard, atomically;
//! - *add* (base key's node): unless the applied hash lists the move
//!   (`names::applied_name`, on the base key's node), list it and add `v` to the base key,
//!   atomically.
//!
//! While a fold may be moving values, a summing read reads the base key with its applied
//! list first, then each shard with its stash (each part and its hash in one script), and
//! counts a stash entry only if its move is not in the applied list. A moved value is then
//! counted once: in the shard (read before the take), in the stash (the add came after
//! the base key was read), or in the base key (both steps done).
//! A proxy that finds a journaled move whose claimant's lease ran out re-runs both steps;
//! the lists make the re-run change nothing twice. Both hashes expire an hour after their
//! last move.
//!
//! Subtracting `v` (rather than deleting the shard) keeps increments that landed on the
//! shard after it was read: they stay in the shard for the next pass.
//!
//! This file is the journal and the claim's bookkeeping (no kind): `Claimed`, `journal`,
//! `release`, the two-step `take_then_add` with its scripts, and the counters' move
//! (strings, hashes, hashes by field), which sorted sets share. `fold` runs the fold.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

use super::names::{applied_name, shard_name, stash_name, Place};
use super::record::{hex, unhex, Move, Record};
use super::{as_i64, call, failpoint, now_ms, registry, Salt, SaltError};
use crate::backend::{wire, Backend};
use crate::resp::Value;

/// How long a claim on a key's fold slot holds without being renewed.
pub const LEASE_MS: u64 = 5000;

/// Takes a journaled move out of a shard once. KEYS: stash, shard. ARGV: `s` or `h`, the
/// move id, then per entry: hex(field), field, amount, minus amount. Values stay strings
/// end to end, so Lua's doubles never touch them.
const TAKE_ONCE: &str = r#"
if redis.call('HSETNX', KEYS[1], ARGV[2], '1') == 0 then return 0 end
for i = 3, #ARGV, 4 do
  redis.call('HSET', KEYS[1], ARGV[2] .. ':' .. ARGV[i], ARGV[i + 2])
  if ARGV[1] == 's' then
    if redis.call('INCRBY', KEYS[2], ARGV[i + 3]) == 0 then redis.call('DEL', KEYS[2]) end
  else
    if redis.call('HINCRBY', KEYS[2], ARGV[i + 1], ARGV[i + 3]) == 0 then
      redis.call('HDEL', KEYS[2], ARGV[i + 1])
    end
  end
end
redis.call('EXPIRE', KEYS[1], 3600)
return 1
"#;

/// Adds a journaled move to the base key once. KEYS: applied list, base key. ARGV: `s` or
/// `h`, the move id, the shard's time to live in ms (0: none), then per entry: field,
/// amount. A base key without an expiry takes the shard's: the key had it (an EXPIRE sets
/// every part that exists; a base key created later did not inherit it).
const ADD_ONCE: &str = r#"
if redis.call('HSETNX', KEYS[1], ARGV[2], '1') == 0 then return 0 end
for i = 4, #ARGV, 2 do
  if ARGV[1] == 's' then
    redis.call('INCRBY', KEYS[2], ARGV[i + 1])
  else
    redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1])
  end
end
if tonumber(ARGV[3]) > 0 and redis.call('PTTL', KEYS[2]) == -1 then
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
redis.call('EXPIRE', KEYS[1], 3600)
return 1
"#;

/// The key's record and its raw registry value, while this proxy holds the fold slot.
pub struct Claimed {
    pub raw: Bytes,
    pub rec: Record,
}

pub fn move_id(salt: &Salt) -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    let seed = format!(
        "{}:{}:{}",
        salt.id,
        now_ms(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    xxhash_rust::xxh3::xxh3_64(seed.as_bytes())
}

/// Writes `c.rec` over `c.raw`; fails if anyone changed the record in between.
pub async fn update(backend: &Backend, key: &[u8], c: &mut Claimed) -> Result<(), SaltError> {
    let mine = c.rec.fold.as_ref().map(|f| f.owner.clone());
    for _ in 0..5 {
        if let Some(f) = c.rec.fold.as_mut() {
            f.lease_until_ms = now_ms() + LEASE_MS;
        }
        let new = Bytes::from(c.rec.encode());
        if registry::cas(backend, key, Some(&c.raw), Some(&new)).await? {
            c.raw = new;
            return Ok(());
        }
        // Another proxy changed the record meanwhile (a heartbeat, a growth of N): keep
        // its change and write our fold state over it, as long as the claim is still ours.
        let Some((raw, mut fresh)) = registry::get(backend, key).await? else {
            return Err(SaltError::Busy(
                "the key's registry record vanished under the fold".into(),
            ));
        };
        if fresh.fold.as_ref().map(|f| f.owner.clone()) != mine {
            return Err(SaltError::Busy("another proxy took over the fold".into()));
        }
        fresh.fold = c.rec.fold.take();
        c.rec = fresh;
        c.raw = raw;
    }
    Err(SaltError::Busy(
        "the key's registry record keeps changing under the fold".into(),
    ))
}

/// Gives the fold slot back.
pub async fn release(backend: &Backend, key: &[u8], mut c: Claimed) -> Result<(), SaltError> {
    for _ in 0..5 {
        let mut rec = c.rec.clone();
        rec.fold = None;
        let new = Bytes::from(rec.encode());
        if registry::cas(backend, key, Some(&c.raw), Some(&new)).await? {
            return Ok(());
        }
        match registry::get(backend, key).await? {
            Some((raw, fresh)) if fresh.fold == c.rec.fold || fresh.fold.is_none() => {
                c.rec = fresh;
                c.raw = raw;
            }
            // Gone, or someone else's claim now: nothing of ours to release.
            _ => return Ok(()),
        }
    }
    Err(SaltError::Busy(
        "the key's registry record keeps changing".into(),
    ))
}

/// Records `mv` as the move in flight (None: no move in flight), renewing the claim.
pub async fn journal(
    backend: &Backend,
    key: &[u8],
    c: &mut Claimed,
    mv: Option<Move>,
) -> Result<(), SaltError> {
    if let Some(f) = c.rec.fold.as_mut() {
        f.moving = mv;
    }
    update(backend, key, c).await
}

/// What a counter shard is: one integer, or a hash of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shape {
    String,
    Hash,
}

/// Moves counter shard `i` (a string, or a hash's fields) into the base key (nothing to do
/// if it is empty).
pub async fn move_counters(
    backend: &Backend,
    salt: &Salt,
    key: &[u8],
    c: &mut Claimed,
    i: usize,
    shape: Shape,
) -> Result<(), SaltError> {
    let shard = shard_name(key, c.rec.salts[i], backend.tag());
    let node = backend.node_of(&shard);
    // A string moves in one step; a hash a page of fields at a time (a hash placed by
    // field may hold many), until the shard is empty. A shard written as fast as it is
    // moved is left for the fold's next pass rather than chased forever.
    let mut moved = std::collections::HashSet::new();
    for _ in 0..10_000 {
        let ttl = call(backend, &[(node, wire(&[&b"PTTL"[..], &shard]))]).await?;
        let ttl_ms = as_i64(&ttl[0]).filter(|&t| t > 0);
        let delta = match shape {
            Shape::String => {
                let r = call(backend, &[(node, wire(&[&b"GET"[..], &shard]))]).await?;
                match &r[0] {
                    Value::Nil => vec![],
                    // A shard at 0 still moves: it must not outlive the fold.
                    v => match as_i64(v) {
                        Some(n) => vec![(String::new(), n)],
                        None => {
                            return Err(SaltError::Reply(
                                "a shard holds a value that is not an integer".into(),
                            ))
                        }
                    },
                }
            }
            Shape::Hash => {
                let r = call(
                    backend,
                    &[(node, wire(&[&b"HSCAN"[..], &shard, b"0", b"COUNT", b"256"]))],
                )
                .await?;
                let items = match &r[0] {
                    Value::Array(a) if a.len() == 2 => match &a[1] {
                        Value::Array(items) => items.clone(),
                        v => {
                            return Err(SaltError::Reply(format!(
                                "unexpected HSCAN reply from a shard: {v:?}"
                            )))
                        }
                    },
                    v => {
                        return Err(SaltError::Reply(format!(
                            "unexpected HSCAN reply from a shard: {v:?}"
                        )))
                    }
                };
                let mut out = Vec::new();
                for pair in items.chunks(2) {
                    let (Value::Bulk(f), Some(n)) = (&pair[0], pair.get(1).and_then(as_i64)) else {
                        return Err(SaltError::Reply(
                            "a shard field holds a value that is not an integer".into(),
                        ));
                    };
                    out.push((hex(f), n));
                }
                out
            }
        };
        // Fields moved once in this call and written again since wait for the next pass.
        if delta.iter().all(|(f, _)| moved.contains(f)) {
            return Ok(());
        }
        moved.extend(delta.iter().map(|(f, _)| f.clone()));
        let mv = Move {
            id: move_id(salt),
            shard: i as u32,
            delta,
            members: vec![],
            scores: vec![],
            ttl_ms,
        };
        journal(backend, key, c, Some(mv.clone())).await?;
        failpoint("fold-after-journal").await;
        apply_counters(backend, key, &c.rec, &mv, shape).await?;
        journal(backend, key, c, None).await?;
        salt.metrics.fold_moves.inc();
    }
    Ok(())
}

/// Both steps of a journaled move, each at most once: the take, then the add.
pub async fn apply_counters(
    backend: &Backend,
    key: &[u8],
    rec: &Record,
    mv: &Move,
    shape: Shape,
) -> Result<(), SaltError> {
    let salt = *rec.salts.get(mv.shard as usize).ok_or(SaltError::Journal(
        "a journaled move names a shard the record does not have".into(),
    ))?;
    let shard = shard_name(key, salt, backend.tag());
    let kind = Bytes::from_static(match shape {
        Shape::String => b"s",
        Shape::Hash => b"h",
    });
    let id = Bytes::from(mv.id.to_string());
    let mut take = vec![
        Bytes::from_static(b"EVAL"),
        Bytes::from_static(TAKE_ONCE.as_bytes()),
        Bytes::from_static(b"2"),
        stash_name(backend, key, salt),
        shard.clone(),
        kind.clone(),
        id.clone(),
    ];
    let mut add = vec![
        Bytes::from_static(b"EVAL"),
        Bytes::from_static(ADD_ONCE.as_bytes()),
        Bytes::from_static(b"2"),
        applied_name(backend, key),
        Bytes::copy_from_slice(key),
        kind,
        id,
        Bytes::from(mv.ttl_ms.unwrap_or(0).max(0).to_string()),
    ];
    for (f, v) in &mv.delta {
        let field =
            Bytes::from(unhex(f).ok_or(SaltError::Journal("bad field in the journal".into()))?);
        let neg = v
            .checked_neg()
            .ok_or(SaltError::Journal("a shard value cannot be negated".into()))?;
        take.extend([
            Bytes::from(f.clone()),
            field.clone(),
            Bytes::from(v.to_string()),
            Bytes::from(neg.to_string()),
        ]);
        add.extend([field, Bytes::from(v.to_string())]);
    }
    take_then_add(backend, &shard, key, wire(&take), wire(&add)).await
}

/// A take-and-add move (counters, sorted sets, field hashes): the take script on the shard's
/// node, then the add script on the base key's node, each followed by its failpoint.
pub async fn take_then_add(
    backend: &Backend,
    shard: &[u8],
    key: &[u8],
    take: Bytes,
    add: Bytes,
) -> Result<(), SaltError> {
    steps(
        backend,
        vec![
            (vec![(backend.node_of(shard), take)], "fold-after-take"),
            (vec![(backend.node_of(key), add)], "fold-after-add"),
        ],
    )
    .await
}

/// Runs the steps of a move in order: each step's commands in one call (one job per node),
/// failing on any error reply, then the step's failpoint.
pub async fn steps(
    backend: &Backend,
    steps: Vec<(Vec<(usize, Bytes)>, &str)>,
) -> Result<(), SaltError> {
    for (cmds, point) in steps {
        let r = call(backend, &cmds).await?;
        if let Some(Value::Error(e)) = r.iter().find(|v| matches!(v, Value::Error(_))) {
            return Err(SaltError::Reply(format!(
                "fold step failed: {}",
                String::from_utf8_lossy(e)
            )));
        }
        failpoint(point).await;
    }
    Ok(())
}
