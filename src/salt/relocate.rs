//! Moving one shard of a key partitioned by member (a set, HyperLogLog, sorted set or hash
//! by field) off an owner it shares with another of the key's shards: what a slot move, a
//! failover or a new master can leave behind. A counter only points its writers at new
//! salts (`coordinator::respread`); a partitioned shard holds members that every reader
//! looks for in that shard, so its members must move, and no reader may miss one meanwhile.
//!
//! Three phases at epoch boundaries, each written to the key's registry record before it
//! takes effect, so any proxy's coordinator resumes the move from the record alone:
//!
//! 1. **Hold.** From boundary B1 the doubled shard `h` is held: writes of its members go to
//!    the base key, which every read takes into account (`Record::held`).
//! 2. **Empty.** An epoch after B1 (a proxy whose clock lags by less than that has seen
//!    the hold too), under the key's fold claim, shard `h` is moved into the base key by its
//!    kind's journaled `move_shard`, exactly as a fold moves it, pass after pass until it
//!    stays empty. Readers read carefully while the claim is held.
//! 3. **Replace.** In the same claim the record gains a salt on the owner that has no shard
//!    and two steps: from B2 the list names it in `h`'s place, held (readers still on step
//!    1 read `h`, empty, and the base key; nobody writes the new shard yet), and from
//!    B2 + epoch it is written. The old salt stays listed, so whole reads and the fold
//!    still cover it.
//!
//! Members moved into the base key stay there until a set's spread moves them into their
//! new shard (`fold::spread`); the other kinds read the base key beside the shards.

use std::time::Duration;

use super::journal::{release, update};
use super::names::{doubled, salt_on, shard_name, Place};
use super::record::{boundary_after, Record, Step};
use super::{as_i64, call, fold, now_ms, registry, Salt, SaltError};
use crate::backend::{wire, Backend};

/// Advances the move of `key`'s shards by whatever its record says is due now: nothing,
/// a hold (phase 1), or the emptying and the replacement (phases 2 and 3).
pub async fn advance(
    backend: &Backend,
    salt: &Salt,
    key: &[u8],
    rec: &Record,
    now: u64,
    epoch: u64,
) -> Result<(), SaltError> {
    let Some(last) = rec.steps.last() else {
        return Ok(());
    };
    let claimed = rec.fold.as_ref().is_some_and(|f| f.lease_until_ms > now);
    if !rec.kind.partitioned() || rec.demote_ms.is_some() || claimed || last.from_ms > now {
        return Ok(());
    }
    match held_shard(rec) {
        None => hold(backend, key, rec, now, epoch).await,
        Some(_) if now < last.from_ms.saturating_add(epoch) => Ok(()),
        Some(h) => empty_and_replace(backend, salt, key, last, h, epoch).await,
    }
}

/// The shard the last step holds in phase 1: a step that keeps its predecessor's list
/// and holds one of it. (A replacement's held step is never the last one: the step that
/// ends its hold is written with it.)
fn held_shard(rec: &Record) -> Option<usize> {
    let [.., prev, last] = rec.steps.as_slice() else {
        return None;
    };
    let n = rec.salts.len();
    match last.hold.as_slice() {
        [h] if last.in_use(n) == prev.in_use(n) && last.in_use(n).contains(&(*h as usize)) => {
            Some(*h as usize)
        }
        _ => None,
    }
}

/// Phase 1: when two shards in use share an owner and another owner has none, holds the
/// later of the two from the next boundary.
async fn hold(
    backend: &Backend,
    key: &[u8],
    rec: &Record,
    now: u64,
    epoch: u64,
) -> Result<(), SaltError> {
    let Some(last) = rec.steps.last() else {
        return Ok(());
    };
    if !last.hold.is_empty() {
        return Ok(());
    }
    let list = last.in_use(rec.salts.len());
    let Some((pos, _)) = doubled(backend, key, &rec.salts, &list) else {
        return Ok(());
    };
    let Some((raw, mut fresh)) = registry::get(backend, key).await? else {
        return Ok(());
    };
    if fresh != *rec {
        return Ok(());
    }
    let h = list[pos];
    let from_ms = boundary_after(now, epoch);
    fresh.steps.push(Step {
        from_ms,
        n: list.len() as u32,
        shards: list.iter().map(|&i| i as u32).collect(),
        hold: vec![h as u32],
    });
    if registry::cas(backend, key, Some(&raw), Some(fresh.encode().as_bytes())).await? {
        let node = backend.node_of(&shard_name(key, rec.salts[h], backend.tag()));
        tracing::info!(key = %String::from_utf8_lossy(key), shard = h, node = %backend.node(node).addr, from_ms, "moving a salted key's shard off a master it shares: its members are written to the base key from the next epoch");
        registry::announce(backend, key).await;
    }
    Ok(())
}

/// Phases 2 and 3, under the key's fold claim: empties held shard `h` into the base key,
/// then writes the steps that put a salt on the owner without a shard in its place.
async fn empty_and_replace(
    backend: &Backend,
    salt: &Salt,
    key: &[u8],
    held: &Step,
    h: usize,
    epoch: u64,
) -> Result<(), SaltError> {
    let Some(mut c) = fold::claim(backend, salt, key).await? else {
        return Ok(());
    };
    // The claim adopted the record as it is now: go on only if it is still this move's.
    if c.rec.demote_ms.is_some() || c.rec.steps.last() != Some(held) {
        return release(backend, key, c).await;
    }
    // Readers read carefully (shards before the base key) once they see a claim: give
    // every proxy three registry ticks to see this one before anything moves.
    registry::announce(backend, key).await;
    tokio::time::sleep(Duration::from_millis(3 * salt.tick_ms())).await;
    update(backend, key, &mut c).await?;
    let shard = shard_name(key, c.rec.salts[h], backend.tag());
    let exists = (backend.node_of(&shard), wire(&[&b"EXISTS"[..], &shard]));
    let mut empty = false;
    for _pass in 0..5 {
        fold::move_shard(backend, salt, key, &mut c, h).await?;
        // A write sent before the hold reached this proxy's peers lands late: look again.
        tokio::time::sleep(Duration::from_millis(20)).await;
        if as_i64(&call(backend, std::slice::from_ref(&exists)).await?[0]) == Some(0) {
            empty = true;
            break;
        }
    }
    if !empty {
        return release(backend, key, c).await;
    }
    // The crash test dies here: the shard is empty and held, its replacement not written.
    super::failpoint("relocate-after-empty").await;
    for _ in 0..3 {
        if c.rec.steps.last() != Some(held) || c.rec.demote_ms.is_some() {
            break;
        }
        let (salts, steps) = replacement(backend, key, &c.rec, held, h, epoch);
        c.rec.salts = salts;
        c.rec.steps.extend(steps.iter().cloned());
        // `update` keeps a concurrent change (a heartbeat) and drops ours: check it took.
        update(backend, key, &mut c).await?;
        if c.rec.steps.ends_with(&steps) {
            let to = steps[0].shards.iter().find(|&&i| !held.shards.contains(&i));
            let node = to.map(|&i| {
                let s = shard_name(key, c.rec.salts[i as usize], backend.tag());
                backend.node(backend.node_of(&s)).addr.clone()
            });
            salt.metrics.shard_moves.inc();
            tracing::info!(key = %String::from_utf8_lossy(key), shard = h, to = %node.unwrap_or_else(|| "(unchanged)".into()), from_ms = steps[0].from_ms, "a salted key's shard was emptied into its base key; its members get a shard of their own again from the next epoch");
            break;
        }
    }
    release(backend, key, c).await?;
    registry::announce(backend, key).await;
    Ok(())
}

/// The salts and the two steps that replace held shard `h`: from B2 a salt on the owner
/// without a shard takes `h`'s place in the list, held for an epoch, then written. When
/// no owner is without a shard any more (the slot moved back), `h` simply stops being held.
fn replacement(
    p: &dyn Place,
    key: &[u8],
    rec: &Record,
    held: &Step,
    h: usize,
    epoch: u64,
) -> (Vec<u32>, Vec<Step>) {
    let b2 = boundary_after(now_ms(), epoch);
    let list = held.in_use(rec.salts.len());
    let mut salts = rec.salts.clone();
    let mut shards: Vec<u32> = list.iter().map(|&i| i as u32).collect();
    let target = doubled(p, key, &rec.salts, &list).filter(|&(pos, _)| list[pos] == h);
    let step = |from_ms, hold: Vec<u32>, shards: &Vec<u32>| Step {
        from_ms,
        n: shards.len() as u32,
        shards: shards.clone(),
        hold,
    };
    let Some(s) = target.and_then(|(_, owner)| salt_on(p, key, &salts, owner)) else {
        return (salts, vec![step(b2, vec![], &shards)]);
    };
    salts.push(s);
    let j = salts.len() as u32 - 1;
    if let Some(at) = shards.iter().position(|&i| i as usize == h) {
        shards[at] = j;
    }
    let steps = vec![
        step(b2, vec![j], &shards),
        step(b2 + epoch, vec![], &shards),
    ];
    (salts, steps)
}
