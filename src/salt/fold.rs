//! Moving shard values into the base key without losing or doubling an increment, even
//! when the proxy doing it dies between any two steps.
//!
//! A move of shard `i` is: read its value `v`; journal `{id, i, v}` in the key's registry
//! record (compare-and-set, which also renews this proxy's claim); add `v` to the base
//! key *once*; subtract `v` from the shard *once*; clear the journal. "Once" is a Lua
//! script on the node that holds the key: it sets a marker named after the move (placed on
//! that same node by `names::marker_name`) with `SET NX` and only then applies the change,
//! atomically. A proxy that finds a journaled move whose claimant's lease ran out re-runs
//! both halves; the markers make the re-run add and subtract nothing twice.
//!
//! Subtracting `v` (rather than deleting the shard) keeps increments that landed on the
//! shard after it was read: they stay in the shard for the next pass, and the sum over
//! base plus shards never changes at any step.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;

use super::names::{marker_name, shard_name, Place};
use super::record::{hex, unhex, Fold, Kind, Move, Record};
use super::{as_i64, call, failpoint, now_ms, registry, Salt};
use crate::backend::{wire, Backend};
use crate::resp::Value;

/// How long a claim on a key's fold slot holds without being renewed.
pub const LEASE_MS: u64 = 5000;

/// Adds (or subtracts) a journaled move to a key once. KEYS: marker, target.
/// ARGV: `s` or `h`, `-` to delete what reaches zero (the shard side) or `+`, then the
/// increment (string) or field/increment pairs (hash). Values stay strings end to end, so
/// Lua's doubles never touch them.
const MOVE_ONCE: &str = r#"
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', 604800) then return 0 end
if ARGV[1] == 's' then
  local v = redis.call('INCRBY', KEYS[2], ARGV[3])
  if ARGV[2] == '-' and v == 0 then redis.call('DEL', KEYS[2]) end
else
  for i = 3, #ARGV, 2 do
    local v = redis.call('HINCRBY', KEYS[2], ARGV[i], ARGV[i + 1])
    if ARGV[2] == '-' and v == 0 then redis.call('HDEL', KEYS[2], ARGV[i]) end
  end
end
return 1
"#;

/// The key's record and its raw registry value, while this proxy holds the fold slot.
pub struct Claimed {
    pub raw: Bytes,
    pub rec: Record,
}

fn move_id(salt: &Salt) -> u64 {
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
async fn update(backend: &Backend, key: &[u8], c: &mut Claimed) -> Result<(), String> {
    if let Some(f) = c.rec.fold.as_mut() {
        f.lease_until_ms = now_ms() + LEASE_MS;
    }
    let new = Bytes::from(c.rec.encode());
    if !registry::cas(backend, key, Some(&c.raw), Some(&new)).await? {
        return Err("the key's registry record changed under the fold".into());
    }
    c.raw = new;
    Ok(())
}

/// Takes the key's fold slot, finishing the move a dead claimant left journaled. None when
/// the key is no longer salted; an error when another live proxy holds the slot.
pub async fn claim(backend: &Backend, salt: &Salt, key: &[u8]) -> Result<Option<Claimed>, String> {
    for _ in 0..3 {
        let Some((raw, mut rec)) = registry::get(backend, key).await? else {
            return Ok(None);
        };
        let now = now_ms();
        if let Some(f) = &rec.fold {
            if f.owner != salt.id && f.lease_until_ms > now {
                return Err(format!("key is being folded by {}", f.owner));
            }
        }
        let pending = rec.fold.as_ref().and_then(|f| f.moving.clone());
        rec.fold = Some(Fold {
            owner: salt.id.clone(),
            lease_until_ms: now + LEASE_MS,
            moving: pending.clone(),
        });
        let new = Bytes::from(rec.encode());
        if !registry::cas(backend, key, Some(&raw), Some(&new)).await? {
            continue;
        }
        let mut c = Claimed { raw: new, rec };
        if let Some(mv) = pending {
            tracing::warn!(key = %String::from_utf8_lossy(key), move_id = mv.id, "completing a fold move left by a proxy that stopped");
            apply(backend, key, &c.rec, &mv).await?;
            if let Some(f) = c.rec.fold.as_mut() {
                f.moving = None;
            }
            update(backend, key, &mut c).await?;
        }
        return Ok(Some(c));
    }
    Err("the key's registry record keeps changing".into())
}

/// Gives the fold slot back.
pub async fn release(backend: &Backend, key: &[u8], mut c: Claimed) -> Result<(), String> {
    c.rec.fold = None;
    let new = Bytes::from(c.rec.encode());
    registry::cas(backend, key, Some(&c.raw), Some(&new)).await?;
    Ok(())
}

/// Moves shard `i` into the base key (nothing to do if it is empty).
pub async fn move_shard(
    backend: &Backend,
    salt: &Salt,
    key: &[u8],
    c: &mut Claimed,
    i: usize,
) -> Result<(), String> {
    let shard = shard_name(key, c.rec.salts[i], backend.tag());
    let node = backend.node_of(&shard);
    let delta = match c.rec.kind {
        Kind::String => {
            let r = call(backend, &[(node, wire(&[&b"GET"[..], &shard]))]).await?;
            match &r[0] {
                Value::Nil => vec![],
                v => match as_i64(v) {
                    Some(0) => vec![],
                    Some(n) => vec![(String::new(), n)],
                    None => return Err("a shard holds a value that is not an integer".into()),
                },
            }
        }
        Kind::Hash => {
            let r = call(backend, &[(node, wire(&[&b"HGETALL"[..], &shard]))]).await?;
            let Value::Array(items) = &r[0] else {
                return Err(format!("unexpected HGETALL reply from a shard: {:?}", r[0]));
            };
            let mut out = Vec::new();
            for pair in items.chunks(2) {
                let (Value::Bulk(f), Some(n)) = (&pair[0], pair.get(1).and_then(as_i64)) else {
                    return Err("a shard field holds a value that is not an integer".into());
                };
                if n != 0 {
                    out.push((hex(f), n));
                }
            }
            out
        }
    };
    if delta.is_empty() {
        return Ok(());
    }
    let mv = Move {
        id: move_id(salt),
        shard: i as u32,
        delta,
    };
    if let Some(f) = c.rec.fold.as_mut() {
        f.moving = Some(mv.clone());
    }
    update(backend, key, c).await?;
    failpoint("fold-after-journal");
    apply(backend, key, &c.rec, &mv).await?;
    if let Some(f) = c.rec.fold.as_mut() {
        f.moving = None;
    }
    update(backend, key, c).await?;
    salt.metrics.fold_moves.inc();
    Ok(())
}

/// Both halves of a journaled move, each at most once.
async fn apply(backend: &Backend, key: &[u8], rec: &Record, mv: &Move) -> Result<(), String> {
    let salt = *rec
        .salts
        .get(mv.shard as usize)
        .ok_or("a journaled move names a shard the record does not have")?;
    let shard = shard_name(key, salt, backend.tag());
    let kind = if rec.kind == Kind::String { "s" } else { "h" };
    for (target, side) in [(Bytes::copy_from_slice(key), "+"), (shard, "-")] {
        let node = backend.node_of(&target);
        let marker = marker_name(
            backend,
            node,
            mv.id,
            if side == "+" { "add" } else { "sub" },
        );
        let mut args: Vec<Bytes> = vec![
            Bytes::from_static(b"EVAL"),
            Bytes::from_static(MOVE_ONCE.as_bytes()),
            Bytes::from_static(b"2"),
            marker,
            target,
            Bytes::from_static(kind.as_bytes()),
            Bytes::from_static(side.as_bytes()),
        ];
        for (f, v) in &mv.delta {
            let v = if side == "-" {
                v.checked_neg().ok_or("a shard value cannot be negated")?
            } else {
                *v
            };
            if kind == "h" {
                args.push(Bytes::from(unhex(f).ok_or("bad field in the journal")?));
            }
            args.push(Bytes::from(v.to_string()));
        }
        let r = call(backend, &[(node, wire(&args))]).await?;
        if let Value::Error(e) = &r[0] {
            return Err(format!("fold step failed: {}", String::from_utf8_lossy(e)));
        }
        failpoint(if side == "+" {
            "fold-after-add"
        } else {
            "fold-after-sub"
        });
    }
    Ok(())
}

/// Moves every shard into the base key while the key stays salted: what a command that
/// cannot be merged needs before it runs on the base key. Waits up to two seconds for a
/// fold another proxy is running.
pub async fn move_all(backend: &Backend, salt: &Salt, key: &[u8]) -> Result<(), String> {
    let mut tries = 0;
    let mut c = loop {
        match claim(backend, salt, key).await {
            Ok(Some(c)) => break c,
            Ok(None) => return Ok(()),
            Err(e) if tries >= 40 => return Err(e),
            Err(_) => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    for i in 0..c.rec.salts.len() {
        move_shard(backend, salt, key, &mut c, i).await?;
    }
    release(backend, key, c).await
}

/// The whole fold of a demoted key: move every shard, check that none was written since,
/// and delete the registry record last. Returns true when the key is no longer salted.
pub async fn fold_key(backend: &Backend, salt: &Salt, key: &[u8]) -> Result<bool, String> {
    let Some(mut c) = claim(backend, salt, key).await? else {
        return Ok(true);
    };
    for _pass in 0..5 {
        for i in 0..c.rec.salts.len() {
            move_shard(backend, salt, key, &mut c, i).await?;
        }
        let cmds: Vec<(usize, Bytes)> = c
            .rec
            .salts
            .iter()
            .map(|&s| {
                let shard = shard_name(key, s, backend.tag());
                (backend.node_of(&shard), wire(&[&b"EXISTS"[..], &shard]))
            })
            .collect();
        let left = call(backend, &cmds).await?;
        if left.iter().all(|v| as_i64(v) == Some(0)) {
            failpoint("fold-before-remove");
            if registry::cas(backend, key, Some(&c.raw), None).await? {
                salt.metrics.folds.inc();
                registry::announce(backend, key).await;
                return Ok(true);
            }
            return Err("the key's registry record changed before removal".into());
        }
        // A straggler wrote a shard after it was moved: go round again.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    release(backend, key, c).await?;
    Ok(false)
}
