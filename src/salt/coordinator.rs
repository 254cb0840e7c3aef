//! The coordinator: one task per proxy that keeps the salt table in step with the registry.
//!
//! Each tick (ten per epoch, and at once on an announcement or an admin request) it: reads
//! the registry and swaps the table the data path reads; promotes this proxy's write-hot
//! keys whose rule salts them; notes in each salted key's record that it is still hot here
//! (at most twice per epoch) and grows N at the next boundary if `shards: auto` asks for
//! more; demotes keys no proxy has seen hot for two epochs (`COOL_EPOCHS`); and folds demoted keys whose
//! grace period has passed. It also moves salted keys apart when a slot move, a failover
//! or a new master left two of a key's shards on one master: a counter's writers
//! (`respread`), a key salted by member one shard's members at a time (`relocate`).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use super::names::{shard_name, spread_salts, Place, CHANNEL};
use super::record::{boundary_after, Record, Step};
use super::registry::{
    announce, auto_declines, balance_of, cas, change_if_same, demote, get, live_proxies, load_all,
    node, node_loads, pinning_rule, salting_stopped_paying, wanted_shards,
};
use super::{
    as_i64, call, early, fold, kinds, now_ms, ops, relocate, Salt, SaltError, SaltTable, Salted,
};
use crate::backend::{wire, Backend, Dedicated};
use crate::hotkey::{HotSnapshot, HotState};
use crate::resp::Proto;
use crate::rules::{RulesHandle, SaltPolicy, Strategy};

/// Keeps this proxy's salt table in step with the registry until shutdown.
pub async fn run(
    backend: &Backend,
    salt: &Salt,
    mut snaps: watch::Receiver<Arc<HotSnapshot>>,
    rules: &RulesHandle,
    mut shutdown: watch::Receiver<bool>,
    spread: &Spawn,
) {
    if !salt.enabled {
        tracing::warn!("salting is off: the pool places keys at random");
        return;
    }
    // The subscription is named, so that the registry node's client list names the fleet
    // (`early`).
    let mut hs = backend.node(node(backend)).handshake(Proto::Resp2, 0);
    hs.name = Some(Bytes::from(format!("{}{}", early::CLIENT_NAME, salt.id)));
    let listener = tokio::spawn(listen(hs, Arc::clone(&salt.kick)));
    let mut acked = early::Acked::default();
    let mut warned = false;
    // Write-hot keys a snapshot already woke the coordinator for.
    let mut seen: std::collections::HashSet<Vec<u8>> = Default::default();
    loop {
        let epoch = rules.snapshot().epoch_ms();
        salt.epoch_ms.store(epoch, Ordering::Relaxed);
        let snap = snaps.borrow_and_update().clone();
        let result = tick(backend, salt, &snap, rules, epoch, spread, &mut acked).await;
        salt.first_read_ended();
        match result {
            Ok(()) => {
                if warned {
                    tracing::info!("salt registry reachable again");
                }
                warned = false;
                salt.metrics.registry_up.set(1);
            }
            Err(e) => {
                salt.metrics.registry_errors.inc();
                salt.metrics.registry_up.set(0);
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
            // A key turned write-hot: promote it now, not at the next tick.
            _ = newly_hot(&mut snaps, salt, &mut seen) => {}
            _ = shutdown.wait_for(|v| *v) => break,
        }
    }
    listener.abort();
}

/// Returns when a snapshot lists a write-hot key that is not salted and did not wake the
/// coordinator before (`seen`, forgotten once the key is no longer hot).
async fn newly_hot(
    snaps: &mut watch::Receiver<Arc<HotSnapshot>>,
    salt: &Salt,
    seen: &mut std::collections::HashSet<Vec<u8>>,
) {
    loop {
        if snaps.changed().await.is_err() {
            return std::future::pending().await;
        }
        let snap = snaps.borrow_and_update().clone();
        let table = salt.table.load();
        let hot: Vec<&[u8]> = snap
            .keys
            .iter()
            .filter(|k| k.write_state == Some(HotState::Hot))
            .map(|k| &k.key[..])
            .collect();
        seen.retain(|k| hot.contains(&&k[..]));
        let mut fresh = false;
        for k in hot {
            if table.get(k).is_none() && seen.insert(k.to_vec()) {
                fresh = true;
            }
        }
        if fresh {
            return;
        }
    }
}

/// Subscribes to the announcement channel and wakes the coordinator on every message. A
/// channel quiet for `QUIET` gets a PING; a node silent past `ASK_WITHIN` is subscribed to
/// again, so a frozen node cannot stop the listener for good.
async fn listen(hs: crate::backend::Handshake, kick: Arc<tokio::sync::Notify>) {
    const QUIET: Duration = Duration::from_secs(10);
    let within = crate::backend::ASK_WITHIN;
    loop {
        if let Ok(mut d) = Dedicated::open(&hs).await {
            let sub = [wire(&[b"SUBSCRIBE", CHANNEL.as_bytes()])];
            if d.call_within(&sub, 1, within).await.is_ok() {
                loop {
                    let heard = match tokio::time::timeout(QUIET, d.call(&[], 1)).await {
                        Ok(r) => r.is_ok(),
                        Err(_) => d.call_within(&[wire(&[b"PING"])], 1, within).await.is_ok(),
                    };
                    if !heard {
                        tracing::info!(node = %hs.addr, "salt registry channel silent; subscribing again");
                        break;
                    }
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
    spread: &Spawn,
    acked: &mut early::Acked,
) -> Result<(), SaltError> {
    let now = now_ms();
    let loaded = load_all(backend).await?;
    let records = loaded.records;
    // The fleet's size matters only to size a write-hot key: skip the query otherwise.
    let proxies = if snap.keys.iter().any(|k| k.write_state.is_some()) {
        live_proxies(backend).await?
    } else {
        1
    };
    install(backend, salt, &records, now);
    salt.first_read_ended();
    // After the install: an acknowledgement says this proxy reads the new records.
    early::step(backend, salt, &records, &loaded.acks, now, acked).await?;
    check_bases(backend, salt, now, spread).await;

    let rules = rules.load();
    exactness(salt, &records, &rules);
    // Write-hot keys: (writes, reads) per second.
    let mut hot: HashMap<&[u8], (f64, f64)> = HashMap::new();
    for k in &snap.keys {
        if matches!(k.write_state, Some(HotState::Hot) | Some(HotState::Cooling)) {
            hot.insert(&k.key, (k.writes_per_sec, k.reads_per_sec));
        }
    }
    let salted: HashMap<&[u8], &(Bytes, Record)> = records.iter().map(|r| (&r.0[..], r)).collect();

    let loads = node_loads(backend, rules.balance());
    // Balance is judged only on nodes busier than a write-hot key: a window with little load
    // (the one before the load began holds the registry's own traffic alone) says nothing
    // of placement.
    let nodes_for = |key: &[u8], floor: f64| match &loads {
        Some(l) if l.loads.iter().sum::<f64>() >= floor * l.loads.len() as f64 => {
            let (nodes, busy) = balance_of(l, backend.node_for(key));
            (Some(nodes), busy)
        }
        _ => (None, None),
    };
    // Promotions: this proxy's hot keys (and pinned exact keys) whose rule salts them.
    let mut want: Vec<Want> = Vec::new();
    let mut not_salted: HashMap<Bytes, f64> = HashMap::new();
    for k in &snap.keys {
        if k.write_state != Some(HotState::Hot) || salted.contains_key(&k.key[..]) {
            continue;
        }
        let r = rules.resolve(&k.key);
        let (nodes, busy) = nodes_for(&k.key, r.write.hot_at_per_sec);
        if let Some(n) = wanted_shards(&r.write, k.writes_per_sec, proxies, nodes) {
            if let Some(why) = auto_declines(&r.write, k, n, now, snap.window_ms) {
                not_salted.extend(why.map(|per_write| (Bytes::copy_from_slice(&k.key), per_write)));
                continue;
            }
            // Only `auto` salts for balance; the shards avoid the busy node when they fit on
            // the others.
            let skip = busy.filter(|_| {
                r.write.strategy == Strategy::Auto && nodes.is_some_and(|x| n <= x.count)
            });
            let balance = wanted_shards(&r.write, k.writes_per_sec, proxies, None).is_none();
            want.push(Want {
                key: k.key.clone(),
                n,
                pinned: false,
                policy: r.write.salt,
                skip,
                balance,
            });
        }
    }
    salt.note_not_salted(not_salted);
    for rule in rules.rules() {
        let pat = rule.pattern.as_str();
        if pinning_rule(&rules, pat.as_bytes()).is_some() && !salted.contains_key(pat.as_bytes()) {
            if let Some(n) = wanted_shards(
                &rule.write,
                rule.write.salt.per_shard_per_sec * 2.0,
                1,
                None,
            ) {
                want.push(Want {
                    key: pat.as_bytes().to_vec(),
                    n,
                    pinned: true,
                    policy: rule.write.salt,
                    skip: None,
                    balance: false,
                });
            }
        }
    }
    for Want {
        key,
        n,
        pinned,
        policy,
        skip,
        balance,
    } in want
    {
        let done = kinds::promote(backend, salt, &key, n, pinned, policy, skip).await;
        if done.is_ok() && balance {
            tracing::info!(
                key = %String::from_utf8_lossy(&key),
                shards = n,
                proxies,
                avoided = ?skip.map(|i| &backend.node(i).addr),
                "auto: combining left this key's node busier than the others; salted for node balance"
            );
        }
        if let Err(e) = done {
            tracing::debug!(key = %String::from_utf8_lossy(&key), error = %e, "not salted");
        }
    }

    for (key, rec) in &records {
        let moved = match kinds::of(rec.kind).partitioned() {
            true => relocate::advance(backend, salt, key, rec, now, epoch).await,
            false => respread(backend, key, rec, now, epoch).await,
        };
        if let Err(e) = moved {
            tracing::debug!(key = %String::from_utf8_lossy(key), error = %e, "shards not moved apart now");
        }
        let r = rules.resolve(key);
        if let Some(&(rate, reads)) = hot.get(&key[..]) {
            // Salted by `auto`, and its merged reads came to cost the nodes more than it
            // spreads: demoted though still hot (after its dwell, like any demotion).
            if r.write.strategy == Strategy::Auto
                && rec.demote_ms.is_none()
                && !rec.pinned
                && dwelt(rec, now, epoch)
                && salting_stopped_paying(reads, rate, rec.target_n())
            {
                salt.metrics.withdrawn.inc();
                tracing::info!(
                    key = %salt.shown(key),
                    reads_per_write = (reads / rate.max(1.0) * 100.0).round() / 100.0,
                    shards = rec.target_n(),
                    "no longer salting a write-hot key: its merged reads cost the nodes over twice what salting takes off its node"
                );
                demote(backend, salt, key).await?;
                continue;
            }
            // Still hot here: say so (at most twice an epoch), and grow N if it should.
            // A key partitioned by member keeps its shard count: more shards would move
            // every member.
            // Grown by rate only: once salted for balance the nodes even out, and judged by
            // balance again it would want the node it left out.
            let grow = wanted_shards(&r.write, rate, proxies, None)
                .filter(|&n| n > rec.target_n() && !kinds::of(rec.kind).partitioned());
            if rec.demote_ms.is_none() {
                if now.saturating_sub(rec.hot_ms) > epoch / 2 || grow.is_some() {
                    let _ = refresh(backend, key, now, epoch, grow).await;
                }
                continue;
            }
            // Demoted though still hot (by an operator, or withdrawn above): folded all
            // the same. (Skipping it here left such a key half-demoted for as long as any
            // proxy saw it hot: writes on the base key, reads still merging the shards.)
        }
        if rec.demote_ms.is_none()
            && !rec.pinned
            && now.saturating_sub(rec.hot_ms) > COOL_EPOCHS * epoch
            && dwelt(rec, now, epoch)
        {
            demote(backend, salt, key).await?;
            continue;
        }
        let lease_free = rec.fold.as_ref().is_none_or(|f| f.lease_until_ms <= now);
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

/// The flapping rule. A salted key is demoted only once no proxy has seen it hot for
/// `COOL_EPOCHS` whole epochs, and never before it has been salted for `DWELL_EPOCHS`. A
/// node that stalls for a second, or a proxy that restarts, makes a key look cool to the
/// detector (clients that wait send nothing), and with a one-epoch rule such a key was
/// demoted, folded and salted again seconds later. With these, a lull shorter than two
/// epochs never demotes, and a key goes round promote, demote and fold at most once per
/// four epochs plus its fold.
const COOL_EPOCHS: u64 = 2;
const DWELL_EPOCHS: u64 = 2;

/// Whether a salted key has been in force for `DWELL_EPOCHS`: no demotion comes sooner.
fn dwelt(rec: &Record, now: u64, epoch: u64) -> bool {
    rec.steps
        .first()
        .is_some_and(|s| now > s.from_ms + DWELL_EPOCHS * epoch)
}

/// A promotion this tick asks for.
struct Want {
    key: Vec<u8>,
    n: u32,
    pinned: bool,
    policy: SaltPolicy,
    /// The node its shards avoid (`balance_of`).
    skip: Option<usize>,
    /// Salted for node balance alone (said in the log).
    balance: bool,
}

/// `saltshaker_salted_keys_by_exactness`: every label set, so a tier with no key reads 0.
fn exactness(salt: &Salt, records: &[(Bytes, Record)], rules: &crate::rules::Rules) {
    use crate::{metrics::ExactnessLabel, rules::ReadTier};
    let mut n: HashMap<(&'static str, &'static str), i64> = HashMap::new();
    for w in ["exact", "combine"] {
        for r in ["exact", "display"] {
            n.insert((w, r), 0);
        }
    }
    for (key, _) in records {
        let p = rules.resolve(key);
        let w = match p.write.strategy {
            Strategy::SaltCombine | Strategy::Auto => "combine",
            _ => "exact",
        };
        let r = match p.read.salted.tier {
            ReadTier::Display => "display",
            ReadTier::Exact => "exact",
        };
        *n.entry((w, r)).or_default() += 1;
    }
    for ((write, read), v) in n {
        salt.metrics
            .by_exactness
            .get_or_create(&ExactnessLabel { write, read })
            .set(v);
    }
}

/// Starts `fold::spread` of a salted set's base-key members into its shards, in a task
/// of its own (it may take longer than a tick).
pub type Spawn = dyn Fn(Bytes) + Send + Sync;

/// Finds out which partitioned keys' base keys are empty, so writes to them stop asking
/// the base key, and moves a set's base-key members into its shards when they are not. A
/// check counts only once the promotion has been in force for a tick: before that, other
/// proxies still write the base key.
///
/// A base key found empty is asked again each epoch. A proxy that has not read the
/// registry for an epoch (`Salt::fresh`) writes members to the base key; the others learn
/// of it within an epoch and a tick, and until then their write replies (not their reads)
/// may miss what it wrote.
async fn check_bases(backend: &Backend, salt: &Salt, now: u64, spread: &Spawn) {
    let table = salt.table.load();
    let epoch = salt.epoch_ms.load(Ordering::Relaxed);
    for e in table.iter() {
        let in_force = e.rec.steps.first().map_or(u64::MAX, |s| s.from_ms);
        if !kinds::of(e.rec.kind).partitioned()
            || (!e.base_maybe() && !e.base_recheck_due(now, epoch))
            || e.rec.demote_ms.is_some()
            || e.rec.fold.is_some()
            || now < in_force.saturating_add(salt.tick_ms())
            || now < e.rec.holds_until().saturating_add(salt.tick_ms())
            || !e.base_checkable(now)
        {
            continue;
        }
        let writes = e.base_writes();
        let cmd = wire(&[&b"EXISTS"[..], &e.key]);
        match call(backend, &[(e.nodes[0], cmd)])
            .await
            .map(|r| as_i64(&r[0]))
        {
            Ok(Some(0)) => e.base_seen_empty(writes, now),
            Ok(Some(_)) if !e.base_maybe() => e.note_base_write(),
            Ok(Some(_)) if kinds::of(e.rec.kind).spreads_base() => {
                let mut busy = salt.spreading.lock().unwrap_or_else(|p| p.into_inner());
                if busy.insert(e.key.clone()) {
                    spread(e.key.clone());
                }
            }
            _ => {}
        }
    }
    for e in table.iter().filter(|e| kinds::of(e.rec.kind).partitioned()) {
        ops::align_expiry(backend, e).await;
    }
}

/// When a slot move, a failover or a new master leaves a salted counter's writers on fewer
/// nodes than they could cover (two shards on one master), adds a step from the next
/// boundary whose writers cover as many as they can (`names::spread_salts`). Readers merge
/// every salt listed, so the old shards keep counting until the fold. Counters only: a kind
/// salted by member moves one shard's members at a time (`relocate`).
async fn respread(
    backend: &Backend,
    key: &[u8],
    rec: &Record,
    now: u64,
    epoch: u64,
) -> Result<(), SaltError> {
    let Some(last) = rec.steps.last() else {
        return Ok(());
    };
    if kinds::of(rec.kind).partitioned()
        || rec.demote_ms.is_some()
        || rec.fold.is_some()
        || last.from_ms > now
    {
        return Ok(());
    }
    let cur = last.in_use(rec.salts.len());
    let node = |i: usize| backend.node_of(&shard_name(key, rec.salts[i], backend.tag()));
    let mut nodes: Vec<usize> = cur.iter().map(|&i| node(i)).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let owners = backend.owners();
    let reachable = cur.len().min(owners.len());
    if nodes.len() >= reachable && nodes.iter().all(|n| owners.contains(n)) {
        return Ok(());
    }
    let (salts, used) = spread_salts(backend, key, &rec.salts, cur.len());
    let mut covered: Vec<usize> = used
        .iter()
        .map(|&i| backend.node_of(&shard_name(key, salts[i as usize], backend.tag())))
        .collect();
    covered.sort_unstable();
    covered.dedup();
    if covered.len() <= nodes.len() {
        return Ok(());
    }
    let from_ms = boundary_after(now, epoch);
    let step = Step {
        from_ms,
        n: used.len() as u32,
        shards: used,
        hold: vec![],
    };
    if change_if_same(backend, key, rec, |r| {
        r.salts = salts;
        r.steps.push(step);
    })
    .await?
    {
        tracing::info!(key = %String::from_utf8_lossy(key), nodes_before = nodes.len(), nodes_after = covered.len(), from_ms, "moving a salted key's writers apart: its shards shared a node after a slot move, a failover or a new master");
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
) -> Result<(), SaltError> {
    let Some((raw, mut rec)) = get(backend, key).await? else {
        return Ok(());
    };
    if rec.demote_ms.is_some() {
        return Ok(());
    }
    rec.hot_ms = now;
    if let Some(n) = grow {
        let (salts, used) = spread_salts(backend, key, &rec.salts, n as usize);
        rec.salts = salts;
        let first_n = used.iter().enumerate().all(|(i, &u)| i as u32 == u);
        rec.steps.push(Step {
            from_ms: boundary_after(now, epoch),
            n,
            shards: if first_n { vec![] } else { used },
            hold: vec![],
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
///
/// A partitioned key whose record changed other than by a heartbeat asks its base key
/// again, and not before an epoch and a tick have passed. A fold's claim and release
/// change the record, and it may have moved members into the base key. A pin that cancels
/// a demotion already in force sends writers back to the shards at once, but a proxy that
/// has not heard of it yet still writes the base key; every fresh proxy (`Salt::fresh`)
/// has heard within an epoch. Checking sooner let a proxy find the base key empty just
/// before another wrote a member there, and its ZINCRBY replies then missed that member's
/// score (`tests/differential.rs`, one run in CI).
fn install(backend: &Backend, salt: &Salt, records: &[(Bytes, Record)], now: u64) {
    let old = salt.table.load();
    let mut keys = HashMap::with_capacity(records.len());
    for (k, rec) in records {
        let e = match old.get(k) {
            Some(e) if e.rec == *rec => Arc::clone(e),
            // A record that changed (a heartbeat, growth, demotion) keeps the write
            // rotation where it was, so writes stay even over the shards.
            Some(e) => {
                let new = Salted::new(k.clone(), rec.clone(), backend as &dyn Place).continuing(e);
                if kinds::of(rec.kind).partitioned() && !e.rec.heartbeat_of(rec) {
                    new.changed(now + salt.epoch_ms.load(Ordering::Relaxed) + salt.tick_ms());
                }
                Arc::new(new)
            }
            None => Arc::new(Salted::new(k.clone(), rec.clone(), backend as &dyn Place)),
        };
        keys.insert(k.clone(), e);
    }
    salt.metrics.salted_keys.set(keys.len() as i64);
    salt.table.store(Arc::new(SaltTable { keys }));
    salt.synced(now);
}
