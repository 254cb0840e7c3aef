//! The fold: moving every shard of a salted key into its base key, when a command that
//! cannot be merged needs the whole (`move_all`) or when the key is demoted (`fold_key`),
//! and the spread of a salted set's base-key members into its shards (`spread`). Each
//! shard's move is its kind's (`SaltKind::move_shard`), journaled in the key's registry
//! record (`journal`), so a proxy that dies between two steps loses or doubles nothing: the
//! next claimant finishes the journaled move (`claim`).

use std::time::Duration;

use bytes::Bytes;

use super::journal::{self, journal, release, update, Claimed, LEASE_MS};
use super::kind::SaltKind;
use super::kinds::{self, set};
use super::names::{shard_name, stash_name, Place};
use super::record::{Fold, Move, Record};
use super::{as_i64, call, failpoint, now_ms, registry, Salt, SaltError};
use crate::backend::{wire, Backend};

/// Takes the key's fold slot, finishing the move a dead claimant left journaled. None when
/// the key is no longer salted; an error while another claim holds the slot (another
/// proxy's, or another task's of this proxy).
pub async fn claim(
    backend: &Backend,
    salt: &Salt,
    key: &[u8],
) -> Result<Option<Claimed>, SaltError> {
    for _ in 0..3 {
        let Some((raw, mut rec)) = registry::get(backend, key).await? else {
            return Ok(None);
        };
        let now = now_ms();
        // One claim per task, not per proxy: two sessions of one proxy folding the same key
        // (or a session and a spread) must take turns, as two proxies do.
        if let Some(f) = &rec.fold {
            if f.lease_until_ms > now {
                return Err(SaltError::Busy(format!(
                    "key is being folded by {}",
                    f.owner
                )));
            }
        }
        let pending = rec.fold.as_ref().and_then(|f| f.moving.clone());
        rec.fold = Some(Fold {
            owner: format!("{}#{}", salt.id, journal::move_id(salt) % 1_000_000),
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
            kinds::of(c.rec.kind)
                .apply(backend, key, &c.rec, &mv)
                .await?;
            journal(backend, key, &mut c, None).await?;
        }
        return Ok(Some(c));
    }
    Err(SaltError::Busy(
        "the key's registry record keeps changing".into(),
    ))
}

/// Moves every shard into the base key while the key stays salted: what a command that
/// cannot be merged needs before it runs on the base key. Waits up to ten seconds for a
/// fold another proxy is running.
pub async fn move_all(backend: &Backend, salt: &Salt, key: &[u8]) -> Result<(), SaltError> {
    let mut tries = 0;
    let mut c = loop {
        match claim(backend, salt, key).await {
            Ok(Some(c)) => break c,
            Ok(None) => return Ok(()),
            Err(e) if tries >= 200 => return Err(e),
            Err(_) => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    if nothing_to_move(backend, key, &c.rec).await? {
        // Every shard (and its stash) is empty: nothing would move, so no reader can see a
        // value in transit and there is nothing to announce. Without this, each command
        // that cannot be merged waited three registry ticks, and a pipeline of them looked
        // like a hang.
        return release(backend, key, c).await;
    }
    if c.rec.demote_ms.is_none() {
        // Readers of a salted key skip the fold's bookkeeping until they see a fold: give
        // every proxy three registry ticks to see this claim before anything moves.
        registry::announce(backend, key).await;
        tokio::time::sleep(Duration::from_millis(3 * salt.tick_ms())).await;
        update(backend, key, &mut c).await?;
    }
    for i in 0..c.rec.salts.len() {
        move_shard(backend, salt, key, &mut c, i).await?;
    }
    release(backend, key, c).await
}

/// True when no shard of `key`, and no shard's stash, holds anything.
async fn nothing_to_move(backend: &Backend, key: &[u8], rec: &Record) -> Result<bool, SaltError> {
    let tag = backend.tag();
    let cmds: Vec<(usize, Bytes)> = rec
        .salts
        .iter()
        .flat_map(|&s| [shard_name(key, s, tag), stash_name(backend, key, s)])
        .map(|k| (backend.node_of(&k), wire(&[&b"EXISTS"[..], &k])))
        .collect();
    let r = call(backend, &cmds).await?;
    Ok(r.iter().all(|v| as_i64(v) == Some(0)))
}

/// The whole fold of a demoted key: move every shard, check that none was written since,
/// and delete the registry record last. Returns true when the key is no longer salted.
pub async fn fold_key(backend: &Backend, salt: &Salt, key: &[u8]) -> Result<bool, SaltError> {
    let Some(mut c) = claim(backend, salt, key).await? else {
        return Ok(true);
    };
    // Removals from a set, sorted set or hash wait while a claim is held (`ops::quiet`):
    // give every proxy three ticks to see this one before anything moves.
    registry::announce(backend, key).await;
    tokio::time::sleep(Duration::from_millis(3 * salt.tick_ms())).await;
    update(backend, key, &mut c).await?;
    let epoch = salt.epoch_ms.load(std::sync::atomic::Ordering::Relaxed);
    for _pass in 0..5 {
        for i in 0..c.rec.salts.len() {
            move_shard(backend, salt, key, &mut c, i).await?;
        }
        // Each journaled step adopts the record as it is now. If the key was promoted
        // again meanwhile (an SRE's pin cancels a demotion), writers are back on the
        // shards: removing the record would strand what they write before they resync.
        if !c.rec.foldable(now_ms(), epoch) {
            tracing::info!(key = %String::from_utf8_lossy(key), "fold stopped: the key was promoted again while it was being folded");
            release(backend, key, c).await?;
            return Ok(false);
        }
        // Writers have left the shards: their increment IDs go to the base key's lists.
        super::idem::fold_ids(backend, key, &c.rec).await?;
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
            failpoint("fold-before-remove").await;
            if registry::cas(backend, key, Some(&c.raw), None).await? {
                salt.metrics.folds.inc();
                registry::announce(backend, key).await;
                return Ok(true);
            }
            return Err(SaltError::Busy(
                "the key's registry record changed before removal".into(),
            ));
        }
        // A straggler wrote a shard after it was moved: go round again.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    release(backend, key, c).await?;
    Ok(false)
}

/// Moves shard `i` into the base key, as its kind moves one.
pub async fn move_shard(
    backend: &Backend,
    salt: &Salt,
    key: &[u8],
    c: &mut Claimed,
    i: usize,
) -> Result<(), SaltError> {
    kinds::of(c.rec.kind)
        .move_shard(backend, salt, key, c, i)
        .await
}

/// Moves a set's base-key members (written before it was salted) into their shards, so
/// writes stop asking the base key and sizes are sums again. Holds the key's fold slot (so
/// readers read carefully and removals wait), announces it and waits three ticks as a live
/// fold does, then moves journaled batches: copy into the shards (SADD), then remove from
/// the base key (SREM), each step idempotent. Started by the coordinator when it finds a
/// salted set's base key not empty; `salt.spreading` keeps it to one at a time per key.
pub async fn spread(backend: &Backend, salt: &Salt, key: Bytes) {
    match spread_set(backend, salt, &key).await {
        Ok(0) => {}
        Ok(n) => {
            tracing::info!(key = %String::from_utf8_lossy(&key), members = n, "moved a salted set's base-key members into its shards")
        }
        Err(e) => {
            tracing::debug!(key = %String::from_utf8_lossy(&key), error = %e, "base-key members not moved into shards now")
        }
    }
    salt.spreading
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&key);
}

async fn spread_set(backend: &Backend, salt: &Salt, key: &[u8]) -> Result<usize, SaltError> {
    let Some(mut c) = claim(backend, salt, key).await? else {
        return Ok(0);
    };
    if !kinds::of(c.rec.kind).spreads_base() || c.rec.demote_ms.is_some() {
        release(backend, key, c).await?;
        return Ok(0);
    }
    registry::announce(backend, key).await;
    tokio::time::sleep(Duration::from_millis(3 * salt.tick_ms())).await;
    let mut moved = 0;
    for _ in 0..100_000 {
        let members = set::spread_batch(backend, key).await?;
        if members.is_empty() {
            break;
        }
        moved += members.len();
        let mv = Move {
            id: journal::move_id(salt),
            shard: set::SPREAD,
            delta: vec![],
            members,
            scores: vec![],
            ttl_ms: None,
        };
        journal(backend, key, &mut c, Some(mv.clone())).await?;
        set::Set.apply(backend, key, &c.rec, &mv).await?;
        journal(backend, key, &mut c, None).await?;
    }
    release(backend, key, c).await?;
    Ok(moved)
}
