//! The registry in the backend and the coordinator that keeps this proxy in step with it.
//!
//! The registry is one hash (`saltshaker:registry`, on whichever node the pool places it):
//! field = salted key, value = its JSON `Record`. Every change is a compare-and-set of the
//! whole value (a Lua script on that node), then a `PUBLISH` on `saltshaker:registry:changed`
//! so the other proxies resync at once; they also resync several times per epoch, and on
//! start, in case they missed it. Every proxy stays subscribed to that channel, so its
//! subscriber count (`PUBSUB NUMSUB`) is the number of live proxies: `auto` sizes the
//! fleet's rate on a key from one proxy's view of it, and no key is written for it. A pool
//! with nothing salted holds no saltshaker key at all.
//!
//! Each tick the coordinator: reads the registry and swaps the table the data path reads;
//! promotes this proxy's write-hot keys whose rule salts; notes in each salted key's record
//! that it is still hot here (at most twice per epoch) and grows N at the next boundary if
//! `shards: auto` asks for more; demotes keys no proxy has seen hot for a whole epoch; and
//! folds demoted keys whose grace period has passed.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use super::names::{choose_salts, Place, CHANNEL, PREFIX, REGISTRY_KEY};
use super::record::{boundary_after, Kind, Record, Step};
use super::{as_i64, call, fold, now_ms, Salt, SaltTable, Salted};
use crate::backend::{wire, Backend, Dedicated};
use crate::hotkey::{HotSnapshot, HotState};
use crate::resp::{Proto, Value};
use crate::rules::{Families, Rules, RulesHandle, Shards, Strategy, WritePolicy};

/// Compare-and-set of one record: ARGV = field, expected ('' = absent), new ('' = delete).
const CAS: &str = r#"
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (cur == false and ARGV[2] == '') or cur == ARGV[2] then
  if ARGV[3] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) else redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) end
  return 1
end
return 0
"#;

fn node(backend: &Backend) -> usize {
    backend.node_for(REGISTRY_KEY.as_bytes())
}

/// The key's record and its raw value, if the key is salted.
pub async fn get(backend: &Backend, key: &[u8]) -> Result<Option<(Bytes, Record)>, String> {
    let cmd = wire(&[b"HGET", REGISTRY_KEY.as_bytes(), key]);
    let r = call(backend, &[(node(backend), cmd)]).await?;
    match &r[0] {
        Value::Bulk(b) => Record::decode(b)
            .map(|rec| Some((b.clone(), rec)))
            .ok_or_else(|| "unreadable registry record".into()),
        Value::Nil => Ok(None),
        v => Err(format!("registry read failed: {v:?}")),
    }
}

/// Replaces `old` (None = absent) with `new` (None = delete); false if the value was not `old`.
pub async fn cas(
    backend: &Backend,
    key: &[u8],
    old: Option<&[u8]>,
    new: Option<&[u8]>,
) -> Result<bool, String> {
    let cmd = wire(&[
        b"EVAL",
        CAS.as_bytes(),
        b"1",
        REGISTRY_KEY.as_bytes(),
        key,
        old.unwrap_or(b""),
        new.unwrap_or(b""),
    ]);
    let r = call(backend, &[(node(backend), cmd)]).await?;
    match &r[0] {
        Value::Integer(n) => Ok(*n == 1),
        v => Err(format!("registry update failed: {v:?}")),
    }
}

/// Tells the other proxies to resync now (best effort: they resync on a timer anyway).
pub async fn announce(backend: &Backend, key: &[u8]) {
    let _ = call(
        backend,
        &[(node(backend), wire(&[b"PUBLISH", CHANNEL.as_bytes(), key]))],
    )
    .await;
}

/// Every record in the registry.
async fn load_all(backend: &Backend) -> Result<Vec<(Bytes, Record)>, String> {
    let cmd = wire(&[b"HGETALL", REGISTRY_KEY.as_bytes()]);
    let r = call(backend, &[(node(backend), cmd)]).await?;
    let Value::Array(items) = &r[0] else {
        return Err(format!("registry read failed: {:?}", r[0]));
    };
    let mut out = Vec::new();
    for pair in items.chunks(2) {
        if let (Value::Bulk(k), Some(Value::Bulk(v))) = (&pair[0], pair.get(1)) {
            match Record::decode(v) {
                Some(rec) => out.push((k.clone(), rec)),
                None => {
                    tracing::warn!(key = %String::from_utf8_lossy(k), "skipping an unreadable registry record")
                }
            }
        }
    }
    Ok(out)
}

/// How many proxies are live: each keeps one subscription to the announcement channel on
/// the registry's node, so the channel's subscriber count is the fleet, and no key is
/// written for it.
async fn live_proxies(backend: &Backend) -> Result<usize, String> {
    let cmd = wire(&[b"PUBSUB", &b"NUMSUB"[..], CHANNEL.as_bytes()]);
    let r = call(backend, &[(node(backend), cmd)]).await?;
    let n = match &r[0] {
        Value::Array(a) => a.get(1).and_then(as_i64).unwrap_or(1),
        _ => 1,
    };
    Ok((n.max(1)) as usize)
}

/// How many shards a key writing `rate` per second on each of `proxies` proxies should have
/// under `p`, or None when its rule does not salt it at that rate.
pub fn wanted_shards(p: &WritePolicy, rate: f64, proxies: usize) -> Option<u32> {
    let per_batch_max = 1e6 / (p.combine.window_us.max(1) as f64);
    let fleet = rate * proxies as f64;
    let combined = rate.min(per_batch_max) * proxies as f64;
    let sized_on = match p.strategy {
        Strategy::Off | Strategy::Combine => return None,
        Strategy::Salt => fleet,
        Strategy::SaltCombine => combined,
        // combine first; salt only when what combining leaves is more than a shard carries.
        Strategy::Auto if combined > p.salt.per_shard_per_sec => combined,
        Strategy::Auto => return None,
    };
    let max = p.salt.max_shards.max(1);
    Some(match p.salt.shards {
        Shards::Fixed(n) => n.clamp(1, max),
        Shards::Auto => {
            ((sized_on / p.salt.per_shard_per_sec.max(1.0)).ceil() as u32).clamp(2, max)
        }
    })
}

/// Records a promotion of `key` to `n` shards from the next safe boundary. Returns the
/// record (the existing one if the key was already salted).
pub async fn promote(
    backend: &Backend,
    salt: &Salt,
    key: &[u8],
    n: u32,
    pinned: bool,
    families: Families,
) -> Result<Record, String> {
    if key.starts_with(PREFIX) {
        return Err("keys starting with saltshaker: belong to saltshaker".into());
    }
    if !salt.enabled {
        return Err("salting needs a pool that places keys by hash (not random)".into());
    }
    let (kind, family) = match key_type(backend, key).await?.as_str() {
        "string" | "none" => (Kind::String, "counters"),
        "hash" => (Kind::Hash, "hashes"),
        t => {
            return Err(format!(
                "a {t} cannot be salted (counters and hashes of counters only)"
            ))
        }
    };
    if !families.contains(family) {
        return Err(format!(
            "the key holds {family}, and its rule's write.salt.families is [{}]",
            families.names().join(", ")
        ));
    }
    let now = now_ms();
    let epoch = salt.epoch_ms.load(Ordering::Relaxed);
    let salts = choose_salts(backend, key, &[], n.max(1) as usize);
    let mut rec = Record::new(kind, salts, boundary_after(now, epoch), now, &salt.id);
    rec.pinned = pinned;
    let new = rec.encode();
    if cas(backend, key, None, Some(new.as_bytes())).await? {
        salt.metrics.promotions.inc();
        tracing::info!(key = %String::from_utf8_lossy(key), shards = n, from_ms = rec.steps[0].from_ms, pinned, "salting a write-hot key from the next epoch");
        announce(backend, key).await;
        salt.kick.notify_one();
        return Ok(rec);
    }
    match get(backend, key).await? {
        Some((raw, mut cur)) if pinned && !cur.pinned => {
            cur.pinned = true;
            cur.demote_ms = None;
            cas(backend, key, Some(&raw), Some(cur.encode().as_bytes())).await?;
            Ok(cur)
        }
        Some((_, cur)) => Ok(cur),
        None => Err("the registry changed during the promotion; try again".into()),
    }
}

/// Ends salting of `key` at the next safe boundary (the fold follows after a grace epoch).
pub async fn demote(backend: &Backend, salt: &Salt, key: &[u8]) -> Result<Option<Record>, String> {
    for _ in 0..5 {
        let Some((raw, mut rec)) = get(backend, key).await? else {
            return Ok(None);
        };
        if rec.demote_ms.is_some() {
            return Ok(Some(rec));
        }
        rec.pinned = false;
        rec.demote_ms = Some(boundary_after(
            now_ms(),
            salt.epoch_ms.load(Ordering::Relaxed),
        ));
        if cas(backend, key, Some(&raw), Some(rec.encode().as_bytes())).await? {
            salt.metrics.demotions.inc();
            tracing::info!(key = %String::from_utf8_lossy(key), demote_ms = rec.demote_ms, "demoting a salted key: writers return to the base key at the next epoch");
            announce(backend, key).await;
            salt.kick.notify_one();
            return Ok(Some(rec));
        }
    }
    Err("the registry keeps changing; try again".into())
}

async fn key_type(backend: &Backend, key: &[u8]) -> Result<String, String> {
    let r = call(backend, &[(backend.node_for(key), wire(&[b"TYPE", key]))]).await?;
    match &r[0] {
        Value::Simple(t) => Ok(String::from_utf8_lossy(t).into_owned()),
        v => Err(format!("TYPE failed: {v:?}")),
    }
}

/// The pattern of the rule that pins `key` for salting (a literal pattern naming it, with
/// `pin: true` and a salting strategy): such a key is salted from the start, and only a
/// rules change ends it.
pub fn pinning_rule(rules: &Rules, key: &[u8]) -> Option<String> {
    rules.rules().iter().find_map(|rule| {
        let pat = rule.pattern.as_str();
        let salts = matches!(rule.write.strategy, Strategy::Salt | Strategy::SaltCombine);
        (rule.pin && salts && is_literal(pat) && pat.as_bytes() == key).then(|| pat.to_string())
    })
}

fn is_literal(pattern: &str) -> bool {
    !pattern.contains(['*', '?', '[', '\\'])
}

/// Keeps this proxy's salt table in step with the registry until shutdown.
pub async fn run(
    backend: &Backend,
    salt: &Salt,
    mut snaps: watch::Receiver<Arc<HotSnapshot>>,
    rules: &RulesHandle,
    mut shutdown: watch::Receiver<bool>,
) {
    if !salt.enabled {
        tracing::warn!("salting is off: the pool places keys at random");
        return;
    }
    let listener = tokio::spawn(listen(
        backend.node(node(backend)).handshake(Proto::Resp2, 0),
        Arc::clone(&salt.kick),
    ));
    let mut warned = false;
    loop {
        let epoch = rules.snapshot().epoch_ms();
        salt.epoch_ms.store(epoch, Ordering::Relaxed);
        let snap = snaps.borrow_and_update().clone();
        match tick(backend, salt, &snap, rules, epoch).await {
            Ok(()) => {
                if warned {
                    tracing::info!("salt registry reachable again");
                }
                warned = false;
                salt.registry_ok.store(true, Ordering::Relaxed);
                salt.metrics.registry_up.set(1);
            }
            Err(e) => {
                salt.metrics.registry_errors.inc();
                salt.metrics.registry_up.set(0);
                salt.registry_ok.store(false, Ordering::Relaxed);
                if !warned {
                    tracing::warn!(error = %e, "salt registry unreachable: no new promotions; salted keys are written to their base key once the last registry read is an epoch old");
                }
                warned = true;
            }
        }
        let period = Duration::from_millis(salt.tick_ms());
        tokio::select! {
            _ = tokio::time::sleep(period) => {}
            _ = salt.kick.notified() => {}
            _ = shutdown.wait_for(|v| *v) => break,
        }
    }
    listener.abort();
}

/// Subscribes to the announcement channel and wakes the coordinator on every message.
async fn listen(hs: crate::backend::Handshake, kick: Arc<tokio::sync::Notify>) {
    loop {
        if let Ok(mut d) = Dedicated::open(&hs).await {
            let sub = [wire(&[b"SUBSCRIBE", CHANNEL.as_bytes()])];
            if d.call(&sub, 1).await.is_ok() {
                while d.call(&[], 1).await.is_ok() {
                    kick.notify_one();
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

async fn tick(
    backend: &Backend,
    salt: &Salt,
    snap: &HotSnapshot,
    rules: &RulesHandle,
    epoch: u64,
) -> Result<(), String> {
    let now = now_ms();
    let proxies = live_proxies(backend).await?;
    let records = load_all(backend).await?;
    install(backend, salt, &records, now);

    let rules = rules.load();
    let mut hot: HashMap<&[u8], f64> = HashMap::new();
    for k in &snap.keys {
        if matches!(k.write_state, Some(HotState::Hot) | Some(HotState::Cooling)) {
            hot.insert(&k.key, k.writes_per_sec);
        }
    }
    let salted: HashMap<&[u8], &(Bytes, Record)> = records.iter().map(|r| (&r.0[..], r)).collect();

    // Promotions: this proxy's hot keys (and pinned exact keys) whose rule salts them.
    let mut want: Vec<(Vec<u8>, u32, bool, Families)> = Vec::new();
    for k in &snap.keys {
        if k.write_state != Some(HotState::Hot) || salted.contains_key(&k.key[..]) {
            continue;
        }
        let r = rules.resolve(&k.key);
        if let Some(n) = wanted_shards(&r.write, k.writes_per_sec, proxies) {
            want.push((k.key.clone(), n, false, r.write.salt.families));
        }
    }
    for rule in rules.rules() {
        let pat = rule.pattern.as_str();
        if pinning_rule(&rules, pat.as_bytes()).is_some() && !salted.contains_key(pat.as_bytes()) {
            if let Some(n) = wanted_shards(&rule.write, rule.write.salt.per_shard_per_sec * 2.0, 1)
            {
                want.push((pat.as_bytes().to_vec(), n, true, rule.write.salt.families));
            }
        }
    }
    for (key, n, pinned, families) in want {
        if let Err(e) = promote(backend, salt, &key, n, pinned, families).await {
            tracing::debug!(key = %String::from_utf8_lossy(&key), error = %e, "not salted");
        }
    }

    for (key, rec) in &records {
        let r = rules.resolve(key);
        if let Some(&rate) = hot.get(&key[..]) {
            // Still hot here: say so (at most twice an epoch), and grow N if it should.
            let grow = wanted_shards(&r.write, rate, proxies).filter(|&n| n > rec.target_n());
            if rec.demote_ms.is_none()
                && (now.saturating_sub(rec.hot_ms) > epoch / 2 || grow.is_some())
            {
                let _ = refresh(backend, key, now, epoch, grow).await;
            }
            continue;
        }
        if rec.demote_ms.is_none()
            && !rec.pinned
            && now.saturating_sub(rec.hot_ms) > epoch
            && rec.steps.first().is_some_and(|s| now > s.from_ms)
        {
            demote(backend, salt, key).await?;
            continue;
        }
        let lease_free = rec.fold.as_ref().map_or(true, |f| f.lease_until_ms <= now);
        if rec.foldable(now, epoch) && lease_free {
            match fold::fold_key(backend, salt, key).await {
                Ok(true) => {
                    tracing::info!(key = %String::from_utf8_lossy(key), "salted key folded back into its base key")
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(key = %String::from_utf8_lossy(key), error = %e, "fold interrupted; it resumes on the next tick")
                }
            }
        }
    }
    Ok(())
}

/// Notes that the key is still hot and, with `grow`, adds shards from the next boundary.
async fn refresh(
    backend: &Backend,
    key: &[u8],
    now: u64,
    epoch: u64,
    grow: Option<u32>,
) -> Result<(), String> {
    let Some((raw, mut rec)) = get(backend, key).await? else {
        return Ok(());
    };
    if rec.demote_ms.is_some() {
        return Ok(());
    }
    rec.hot_ms = now;
    if let Some(n) = grow {
        let salts = choose_salts(backend, key, &rec.salts, n as usize);
        rec.salts = salts;
        rec.steps.push(Step {
            from_ms: boundary_after(now, epoch),
            n,
        });
        tracing::info!(key = %String::from_utf8_lossy(key), shards = n, "growing a salted key's shard count from the next epoch");
    }
    if cas(backend, key, Some(&raw), Some(rec.encode().as_bytes())).await? && grow.is_some() {
        announce(backend, key).await;
    }
    Ok(())
}

/// Swaps in the table built from `records`, reusing entries whose record did not change
/// (they keep their write rotation and last-known values).
fn install(backend: &Backend, salt: &Salt, records: &[(Bytes, Record)], now: u64) {
    let old = salt.table.load();
    let mut keys = HashMap::with_capacity(records.len());
    for (k, rec) in records {
        let e = match old.get(k) {
            Some(e) if e.rec == *rec => Arc::clone(e),
            // A record that changed (a heartbeat, growth, demotion) keeps the write
            // rotation where it was, so writes stay even over the shards.
            Some(e) => {
                let new = Salted::new(k.clone(), rec.clone(), backend as &dyn Place);
                Arc::new(new.continuing(e))
            }
            None => Arc::new(Salted::new(k.clone(), rec.clone(), backend as &dyn Place)),
        };
        keys.insert(k.clone(), e);
    }
    salt.metrics.salted_keys.set(keys.len() as i64);
    salt.table.store(Arc::new(SaltTable { keys }));
    salt.synced(now);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(strategy: Strategy, shards: Shards) -> WritePolicy {
        let mut p = WritePolicy {
            strategy,
            ..Default::default()
        };
        p.salt.shards = shards;
        p
    }

    #[test]
    fn salt_sizes_on_the_fleet_rate_and_auto_only_when_combining_is_not_enough() {
        let salt = policy(Strategy::Salt, Shards::Auto);
        // 100k/s on one proxy at 5000 per shard: 20 shards.
        assert_eq!(wanted_shards(&salt, 100_000.0, 1), Some(20));
        // The same rate seen on each of 4 proxies is 400k/s: capped at max_shards.
        assert_eq!(wanted_shards(&salt, 100_000.0, 4), Some(64));
        // Never fewer than two shards: one shard is the base key again.
        assert_eq!(wanted_shards(&salt, 10.0, 1), Some(2));
        assert_eq!(
            wanted_shards(&policy(Strategy::Salt, Shards::Fixed(8)), 1.0, 1),
            Some(8)
        );
        assert_eq!(
            wanted_shards(&policy(Strategy::Combine, Shards::Auto), 1e6, 9),
            None
        );
        assert_eq!(
            wanted_shards(&policy(Strategy::Off, Shards::Auto), 1e6, 9),
            None
        );

        // auto: one proxy's combined writes are at most one per 500 us window (2000/s),
        // under the 5000/s a shard carries: combining is enough.
        let auto = policy(Strategy::Auto, Shards::Auto);
        assert_eq!(wanted_shards(&auto, 100_000.0, 1), None);
        // Four proxies each combining to 2000/s put 8000/s on one node: salt, sized on
        // the combined rate.
        assert_eq!(wanted_shards(&auto, 100_000.0, 4), Some(2));
        assert_eq!(wanted_shards(&auto, 100_000.0, 16), Some(7));
        // A key below the window rate gains nothing from salting.
        assert_eq!(wanted_shards(&auto, 1000.0, 4), None);
    }
}
