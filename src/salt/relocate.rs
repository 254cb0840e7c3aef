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
use super::{as_i64, call, fold, kinds, now_ms, registry, Salt, SaltError};
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
    if !kinds::of(rec.kind).partitioned()
        || rec.demote_ms.is_some()
        || claimed
        || last.from_ms > now
    {
        return Ok(());
    }
    match held_shard(rec) {
        None if last.hold.is_empty() => hold(backend, key, rec, last, now, epoch).await,
        None => Ok(()),
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

/// Phase 1: when two shards of `last`'s list share an owner and another owner has none,
/// holds the later of the two from the next boundary.
async fn hold(
    backend: &Backend,
    key: &[u8],
    rec: &Record,
    last: &Step,
    now: u64,
    epoch: u64,
) -> Result<(), SaltError> {
    let list = last.in_use(rec.salts.len());
    let Some((pos, _)) = doubled(backend, key, &rec.salts, &list) else {
        return Ok(());
    };
    let h = list[pos];
    let from_ms = boundary_after(now, epoch);
    let step = Step {
        from_ms,
        n: list.len() as u32,
        shards: list.iter().map(|&i| i as u32).collect(),
        hold: vec![h as u32],
    };
    if registry::change_if_same(backend, key, rec, |r| r.steps.push(step)).await? {
        let node = backend.node_of(&shard_name(key, rec.salts[h], backend.tag()));
        tracing::info!(key = %String::from_utf8_lossy(key), shard = h, node = %backend.node(node).addr, from_ms, "moving a salted key's shard off a master it shares: its members are written to the base key from the next epoch");
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
            if node.is_some() {
                salt.metrics.shard_moves.inc();
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::salt::names::choose_salts;
    use crate::salt::record::Kind;

    /// Three owners splitting the slots evenly; `moved` lands on `onto` instead.
    struct Three {
        moved: Option<(Vec<u8>, usize)>,
    }
    impl Place for Three {
        fn node_of(&self, key: &[u8]) -> usize {
            match &self.moved {
                Some((k, onto)) if k == key => *onto,
                _ => crate::backend::slots::slot_of(key) as usize * 3 / 16384,
            }
        }
        fn nodes(&self) -> usize {
            3
        }
        fn tag(&self) -> [u8; 2] {
            *b"{}"
        }
        fn by_slot(&self) -> bool {
            true
        }
    }

    #[test]
    fn the_record_alone_says_which_phase_is_due_and_the_replacement_lands_where_none_is() {
        let key = b"who:liked";
        let even = Three { moved: None };
        let salts = choose_salts(&even, key, &[], 3);
        let mut rec = Record::new(Kind::Set, salts.clone(), 1000, 0, "p");
        assert_eq!(held_shard(&rec), None, "a promotion holds nothing");
        // Shard 2's slot moved onto shard 0's owner: shard 2 is the one to move.
        let onto = even.node_of(&shard_name(key, salts[0], *b"{}"));
        let moved = Three {
            moved: Some((shard_name(key, salts[2], *b"{}").to_vec(), onto)),
        };
        assert_eq!(
            doubled(&moved, key, &salts, &[0, 1, 2]).map(|d| d.0),
            Some(2)
        );
        let held = Step {
            from_ms: 2000,
            n: 3,
            shards: vec![0, 1, 2],
            hold: vec![2],
        };
        rec.steps.push(held.clone());
        assert_eq!(held_shard(&rec), Some(2), "phase 1: emptying is due");
        let (salts2, steps) = replacement(&moved, key, &rec, &held, 2, 1000);
        assert_eq!(&salts2[..3], &salts[..], "salts are only appended");
        assert_eq!(salts2.len(), 4);
        assert_eq!(steps.len(), 2);
        assert_eq!(
            (steps[0].shards.clone(), steps[0].hold.clone()),
            (vec![0, 1, 3], vec![3])
        );
        assert_eq!(
            (steps[1].shards.clone(), steps[1].hold.clone()),
            (vec![0, 1, 3], vec![])
        );
        assert_eq!(steps[1].from_ms, steps[0].from_ms + 1000);
        let mut owners: Vec<usize> = [0, 1, 3]
            .iter()
            .map(|&i| moved.node_of(&shard_name(key, salts2[i], *b"{}")))
            .collect();
        owners.sort();
        assert_eq!(owners, vec![0, 1, 2], "one shard per owner again");
        // Written: the last step holds nothing, so no phase is due until it is in force.
        rec.salts = salts2;
        rec.steps.extend(steps);
        assert_eq!(held_shard(&rec), None);
        assert_eq!(doubled(&moved, key, &rec.salts, &[0, 1, 3]), None);
        // Had the slot moved back meanwhile, the held shard would simply be written again.
        let mut back = Record::new(Kind::Set, salts.clone(), 1000, 0, "p");
        back.steps.push(held.clone());
        let (same, steps) = replacement(&even, key, &back, &held, 2, 1000);
        assert_eq!(same, salts);
        assert_eq!(steps.len(), 1);
        assert_eq!(
            (steps[0].shards.clone(), steps[0].hold.clone()),
            (vec![0, 1, 2], vec![])
        );
    }
}
