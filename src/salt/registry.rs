//! The registry in the backend: reading, compare-and-set, announcements, promotion and
//! demotion, and how many shards a key's rule wants (`coordinator` runs them each tick).
//!
//! The registry is one hash (`saltshaker:registry`, on whichever node the pool places it):
//! field = salted key, value = its JSON `Record`. Every change is a compare-and-set of the
//! whole value (a Lua script on that node), then a `PUBLISH` on `saltshaker:registry:changed`
//! so the other proxies resync at once; they also resync several times per epoch, and on
//! start, in case they missed it. Every proxy stays subscribed to that channel, so its
//! subscriber count (`PUBSUB NUMSUB`) is the number of live proxies: `auto` sizes the
//! fleet's rate on a key from one proxy's view of it, and no key is written for it. A pool
//! with nothing salted holds no saltshaker key at all.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::names::{choose_salts, Without, CHANNEL, PREFIX, REGISTRY_KEY, SEEN};
use super::record::{boundary_after, Kind, Record};
use super::{as_i64, call, now_ms, Salt, SaltError};
use crate::backend::{wire, Backend};
use crate::resp::Value;
use crate::rules::{Rules, Shards, Strategy, WritePolicy};

/// Compare-and-set of one record: ARGV = field, expected ('' = absent), new ('' = delete).
const CAS: &str = r#"
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if (cur == false and ARGV[2] == '') or cur == ARGV[2] then
  if ARGV[3] == '' then redis.call('HDEL', KEYS[1], ARGV[1]) else redis.call('HSET', KEYS[1], ARGV[1], ARGV[3]) end
  return 1
end
return 0
"#;

pub(super) fn node(backend: &Backend) -> usize {
    backend.node_for(REGISTRY_KEY.as_bytes())
}

/// The key's record and its raw value, if the key is salted.
pub async fn get(backend: &Backend, key: &[u8]) -> Result<Option<(Bytes, Record)>, SaltError> {
    let cmd = wire(&[b"HGET", REGISTRY_KEY.as_bytes(), key]);
    let r = call(backend, &[(node(backend), cmd)]).await?;
    match &r[0] {
        Value::Bulk(b) => Record::decode(b)
            .map(|rec| Some((b.clone(), rec)))
            .ok_or_else(|| SaltError::Reply("unreadable registry record".into())),
        Value::Nil => Ok(None),
        v => Err(SaltError::Reply(format!("registry read failed: {v:?}"))),
    }
}

/// Replaces `old` (None = absent) with `new` (None = delete); false if the value was not `old`.
pub async fn cas(
    backend: &Backend,
    key: &[u8],
    old: Option<&[u8]>,
    new: Option<&[u8]>,
) -> Result<bool, SaltError> {
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
        v => Err(SaltError::Reply(format!("registry update failed: {v:?}"))),
    }
}

/// Writes `rec` with `change` made to it, only if the registry still holds `rec` exactly
/// (a decision made from a record that changed meanwhile is made again next tick), and
/// tells the other proxies. True when written.
pub async fn change_if_same(
    backend: &Backend,
    key: &[u8],
    rec: &Record,
    change: impl FnOnce(&mut Record),
) -> Result<bool, SaltError> {
    let Some((raw, mut fresh)) = get(backend, key).await? else {
        return Ok(false);
    };
    if fresh != *rec {
        return Ok(false);
    }
    change(&mut fresh);
    let written = cas(backend, key, Some(&raw), Some(fresh.encode().as_bytes())).await?;
    if written {
        announce(backend, key).await;
    }
    Ok(written)
}

/// Tells the other proxies to resync now (best effort: they resync on a timer anyway).
pub async fn announce(backend: &Backend, key: &[u8]) {
    let _ = call(
        backend,
        &[(node(backend), wire(&[b"PUBLISH", CHANNEL.as_bytes(), key]))],
    )
    .await;
}

/// What the registry holds: every record, and the proxies' acknowledgements of pending
/// promotions (`early`): proxy id -> its tokens.
pub(super) struct Loaded {
    pub records: Vec<(Bytes, Record)>,
    pub acks: std::collections::HashMap<String, std::collections::HashSet<String>>,
}

/// Every record in the registry, with the acknowledgements beside them.
pub(super) async fn load_all(backend: &Backend) -> Result<Loaded, SaltError> {
    let cmd = wire(&[b"HGETALL", REGISTRY_KEY.as_bytes()]);
    let r = call(backend, &[(node(backend), cmd)]).await?;
    let Value::Array(items) = &r[0] else {
        return Err(SaltError::Reply(format!(
            "registry read failed: {:?}",
            r[0]
        )));
    };
    let mut out = Loaded {
        records: Vec::new(),
        acks: Default::default(),
    };
    for pair in items.chunks(2) {
        if let (Value::Bulk(k), Some(Value::Bulk(v))) = (&pair[0], pair.get(1)) {
            if let Some(id) = k.strip_prefix(SEEN.as_bytes()) {
                let tokens = String::from_utf8_lossy(v)
                    .split(' ')
                    .map(str::to_string)
                    .collect();
                out.acks
                    .insert(String::from_utf8_lossy(id).into_owned(), tokens);
                continue;
            }
            match Record::decode(v) {
                Some(rec) => out.records.push((k.clone(), rec)),
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
pub(super) async fn live_proxies(backend: &Backend) -> Result<usize, SaltError> {
    let cmd = wire(&[b"PUBSUB", &b"NUMSUB"[..], CHANNEL.as_bytes()]);
    let r = call(backend, &[(node(backend), cmd)]).await?;
    let n = match &r[0] {
        Value::Array(a) => a.get(1).and_then(as_i64).unwrap_or(1),
        _ => 1,
    };
    Ok((n.max(1)) as usize)
}

/// The nodes that hold keys as this proxy sees them, for `strategy: auto`'s balance test
/// (`wanted_shards`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Nodes {
    /// How many nodes hold keys (a pool's nodes, a cluster's masters): a key salted for
    /// balance gets a shard on each.
    pub count: u32,
    /// Their mean load over the last detection window, per second, as this proxy sent it
    /// (`Node::load`).
    pub mean: f64,
    /// `balance.over_mean_pct` as a fraction.
    pub band: f64,
}

/// Whether salting a key pays the nodes. Salting does not cut the nodes' commands: its
/// writes still run once each, spread over `shards` nodes, and each read merges the
/// shards (`shards` node commands where it was one). What it buys is balance: the writes
/// it moves off the key's node, `writes * (shards - 1) / shards`. It pays while the
/// commands its merged reads add, `reads * (shards - 1)`, are no more than that: while
/// `reads * shards <= writes`. A key read as often as it is written pays the nodes more
/// in merged reads than it takes off its node (bench/README.md, "Workloads": a 9.5 KB
/// value SET and GET alike, salted by `auto`, cost the nodes 15x twemproxy's CPU per
/// operation). `auto` declines such a key; `salt` and `salt_combine` are the operator's
/// explicit choice and are not second-guessed.
pub fn salting_pays(reads_per_sec: f64, writes_per_sec: f64, shards: u32) -> bool {
    reads_per_sec * f64::from(shards.max(1)) <= writes_per_sec
}

/// Salting `auto` started stops paying, and the key is demoted, once its merged reads add
/// over this many times the node commands it takes off the key's node: the gap between
/// this and `salting_pays`'s line is the hysteresis, so a key near the line is not
/// promoted and demoted by turns.
pub const WITHDRAW_FACTOR: f64 = 2.0;

/// Whether a key `auto` salted over `shards` shards has stopped paying: `reads * shards >
/// WITHDRAW_FACTOR * writes` (see `salting_pays`).
pub fn salting_stopped_paying(reads_per_sec: f64, writes_per_sec: f64, shards: u32) -> bool {
    reads_per_sec * f64::from(shards.max(1)) > WITHDRAW_FACTOR * writes_per_sec
}

/// Whether `auto` holds off salting the hot key `k` now, at `shards` shards: `Some(None)`
/// while its first hot window runs (its rates are only the threshold it crossed, its reads
/// maybe not counted yet), `Some(Some(reads per write))` when salting would not pay
/// (`salting_pays`); None to salt it. Other strategies are never held off.
pub fn auto_declines(
    p: &WritePolicy,
    k: &crate::hotkey::HotKey,
    shards: u32,
    now_ms: u64,
    window_ms: u64,
) -> Option<Option<f64>> {
    if p.strategy != Strategy::Auto {
        return None;
    }
    if now_ms.saturating_sub(k.since_unix_ms) < window_ms {
        return Some(None);
    }
    (!salting_pays(k.reads_per_sec, k.writes_per_sec, shards))
        .then(|| Some(k.reads_per_sec / k.writes_per_sec.max(1.0)))
}

impl Salt {
    /// Records the keys declined by this tick's promotions, counting and logging each
    /// one newly declined.
    pub fn note_not_salted(&self, now: HashMap<Bytes, f64>) {
        let mut was = self.not_salted.lock().unwrap_or_else(|p| p.into_inner());
        for (k, per_write) in &now {
            if !was.contains_key(k) {
                self.metrics.declined.inc();
                let key = self.shown(k);
                tracing::info!(key = %key, reads_per_write = (per_write * 100.0).round() / 100.0, "not salting a write-hot key: its merged reads would cost the nodes more than the writes salting spreads");
            }
        }
        self.metrics.not_salted_keys.set(now.len() as i64);
        *was = now;
    }

    /// A key as the log shows it: raw, or hashed with `hotkeys.hash_names`.
    pub fn shown(&self, key: &[u8]) -> String {
        crate::hotkey::shown(key, self.hash_names.load(Ordering::Relaxed))
    }

    /// Why a write-hot key is not salted, if salting it would not pay: its reads per
    /// write.
    pub fn not_salted(&self, key: &[u8]) -> Option<f64> {
        self.not_salted
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(key)
            .copied()
    }
}

/// How many shards a key writing `rate` per second on each of `proxies` proxies should have
/// under `p`, or None when its rule does not salt it at that rate. `nodes` is None where
/// node balance is off or there is one node.
///
/// `auto` combines first, and salts (combining per shard) when what combining leaves on the
/// key's one node, summed over the fleet, is either more than a shard should carry
/// (`salt.per_shard_per_sec`), or both more than one proxy's combining can leave (one write
/// per `combine.window_us`) and more than `balance.over_mean_pct` of a node's mean load:
/// then combining leaves the node busier than the others, and the key gets a shard on as
/// many nodes as bring each shard's share within that margin. So one proxy alone salts
/// only above `per_shard_per_sec`, whatever the rules (bench/README.md, "A spike through a
/// fleet": two proxies left a pool's busiest node at 1.13-1.20x the mean by combining).
pub fn wanted_shards(
    p: &WritePolicy,
    rate: f64,
    proxies: usize,
    nodes: Option<Nodes>,
) -> Option<u32> {
    let per_batch_max = 1e6 / (p.combine.window_us.max(1) as f64);
    let fleet = rate * proxies as f64;
    let combined = rate.min(per_batch_max) * proxies as f64;
    let unbalanced = nodes.filter(|n| {
        n.count >= 2 && combined > per_batch_max && combined > n.band * n.mean * proxies as f64
    });
    // Salted for balance: as many shards as bring each one's share of the key within the
    // margin of a node's mean (a shard per node of a small pool; a few of a large cluster's
    // masters, not all, whose reads would then merge every master), at most one per node.
    let spread = |n: Nodes| {
        let per_node = n.band * n.mean * proxies as f64;
        ((combined / per_node.max(1.0)).ceil() as u32).clamp(2, n.count)
    };
    let (sized_on, spread) = match p.strategy {
        Strategy::Off | Strategy::Combine => return None,
        Strategy::Salt => (fleet, 0),
        Strategy::SaltCombine => (combined, 0),
        // combine first; salt only when what combining leaves is more than a shard carries,
        // or leaves the key's node busier than the others.
        Strategy::Auto if combined > p.salt.per_shard_per_sec => {
            (combined, unbalanced.map_or(0, spread))
        }
        Strategy::Auto => (combined, spread(unbalanced?)),
    };
    let max = p.salt.max_shards.max(1);
    Some(match p.salt.shards {
        Shards::Fixed(n) => n.clamp(1, max),
        Shards::Auto => ((sized_on / p.salt.per_shard_per_sec.max(1.0)).ceil() as u32)
            .max(spread)
            .clamp(2, max),
    })
}

/// Records a promotion of `key`, of `kind` (`kinds::identify`), to `n` shards from the
/// next safe boundary, none of them on node `skip`. Returns the record (the existing one if
/// the key was already salted).
pub async fn promote(
    backend: &Backend,
    salt: &Salt,
    key: &[u8],
    kind: Kind,
    n: u32,
    pinned: bool,
    skip: Option<usize>,
) -> Result<Record, SaltError> {
    if key.starts_with(PREFIX) {
        return Err(SaltError::Refused(
            "keys starting with saltshaker: belong to saltshaker".into(),
        ));
    }
    if !salt.enabled {
        return Err(SaltError::Refused(
            "salting needs a pool that places keys by hash (not random)".into(),
        ));
    }
    let now = now_ms();
    let epoch = salt.epoch_ms.load(Ordering::Relaxed);
    let salts = match skip {
        Some(node) => choose_salts(
            &Without {
                place: backend,
                node,
            },
            key,
            &[],
            n.max(1) as usize,
        ),
        None => choose_salts(backend, key, &[], n.max(1) as usize),
    };
    let mut rec = Record::new(kind, salts, boundary_after(now, epoch), now, &salt.id);
    rec.pinned = pinned;
    let new = rec.encode();
    if cas(backend, key, None, Some(new.as_bytes())).await? {
        salt.metrics.promotions.inc();
        tracing::info!(key = %String::from_utf8_lossy(key), shards = n, from_ms = rec.steps[0].from_ms, pinned, "salting a write-hot key: in force once every live proxy acknowledges, at the latest from_ms");
        announce(backend, key).await;
        salt.kick.notify_one();
        return Ok(rec);
    }
    // Salted already: a pin cancels a demotion. The record may change under us (a fold
    // adopts it at each journaled step), so the pin is written by compare-and-set until it
    // holds; reporting success after a lost CAS left the demotion in force and the fold
    // went on to remove the record.
    for _ in 0..5 {
        match get(backend, key).await? {
            Some((raw, mut cur)) if pinned && (!cur.pinned || cur.demote_ms.is_some()) => {
                cur.pinned = true;
                cur.demote_ms = None;
                if cas(backend, key, Some(&raw), Some(cur.encode().as_bytes())).await? {
                    announce(backend, key).await;
                    salt.kick.notify_one();
                    return Ok(cur);
                }
            }
            Some((_, cur)) => return Ok(cur),
            None => break,
        }
    }
    Err(SaltError::Busy(
        "the registry changed during the promotion; try again".into(),
    ))
}

/// Ends salting of `key` at the next safe boundary (the fold follows after a grace epoch).
pub async fn demote(
    backend: &Backend,
    salt: &Salt,
    key: &[u8],
) -> Result<Option<Record>, SaltError> {
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
    Err(SaltError::Busy(
        "the registry keeps changing; try again".into(),
    ))
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

/// The load this proxy sent each node that holds keys (a pool's nodes, a cluster's masters)
/// over the last detection window (`Node::load`, measured by node balance).
pub(super) struct Loads {
    pub masters: Vec<usize>,
    pub loads: Vec<f64>,
    pub band: f64,
}

/// None with balance off, on one node, or before balance's first window.
pub(super) fn node_loads(backend: &Backend, balance: &crate::rules::Balance) -> Option<Loads> {
    let masters = backend.masters();
    let loads: Vec<f64> = masters.iter().map(|&i| backend.node(i).load()).collect();
    (balance.enabled && masters.len() >= 2 && loads.iter().sum::<f64>() > 0.0).then(|| Loads {
        masters,
        loads,
        band: balance.over_mean_pct / 100.0,
    })
}

/// The nodes for `wanted_shards`, for a key on node `home`, and the node its shards should
/// avoid: of the other nodes, one over their mean by more than the band. The placement of
/// the other keys made it busy, and a shard there would add to it. (The key's own node is
/// not judged: its load holds the key's own writes, combined or not, which salting
/// moves.) A ketama pool of 4 nodes on random ports puts its busiest at 1.075x the mean by
/// placement alone at the median, and over 1.10x for a quarter of port draws
/// (bench/spike.py's docstring).
pub(super) fn balance_of(l: &Loads, home: usize) -> (Nodes, Option<usize>) {
    let count = l.masters.len();
    let others: Vec<(usize, f64)> = l
        .masters
        .iter()
        .zip(&l.loads)
        .filter(|(&i, _)| i != home)
        .map(|(&i, &load)| (i, load))
        .collect();
    let others_mean = others.iter().map(|o| o.1).sum::<f64>() / others.len().max(1) as f64;
    let busy = others
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .filter(|o| count >= 3 && o.1 > others_mean * (1.0 + l.band))
        .map(|o| o.0);
    let nodes = Nodes {
        count: (count - usize::from(busy.is_some())) as u32,
        mean: l.loads.iter().sum::<f64>() / count as f64,
        band: l.band,
    };
    (nodes, busy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn salting_pays_while_merged_reads_add_fewer_commands_than_the_writes_it_spreads() {
        // A counter written 20,000/s and read 100/s over 4 shards: 300 more reads against
        // 15,000 writes moved off its node, pays.
        assert!(salting_pays(100.0, 20_000.0, 4));
        // Read as often as written (a 50% SET/GET key): never pays.
        assert!(!salting_pays(5_000.0, 5_000.0, 2));
        // 70% reads of a counter: 2.3 reads per write, over 3 shards: does not pay.
        assert!(!salting_pays(7_000.0, 3_000.0, 3));
        // At the line, reads * n == writes, pays; just above it does not.
        assert!(salting_pays(1_000.0, 3_000.0, 3));
        assert!(!salting_pays(1_001.0, 3_000.0, 3));
        // Withdrawn only past twice the line: 1,500 reads at 3 shards against 3,000
        // writes add 4,500 commands, 1.5x: salting goes on.
        assert!(!salting_stopped_paying(1_500.0, 3_000.0, 3));
        assert!(salting_stopped_paying(2_100.0, 3_000.0, 3));
    }

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
        assert_eq!(wanted_shards(&salt, 100_000.0, 1, None), Some(20));
        // The same rate seen on each of 4 proxies is 400k/s: capped at max_shards.
        assert_eq!(wanted_shards(&salt, 100_000.0, 4, None), Some(64));
        // Never fewer than two shards: one shard is the base key again.
        assert_eq!(wanted_shards(&salt, 10.0, 1, None), Some(2));
        assert_eq!(
            wanted_shards(&policy(Strategy::Salt, Shards::Fixed(8)), 1.0, 1, None),
            Some(8)
        );
        assert_eq!(
            wanted_shards(&policy(Strategy::Combine, Shards::Auto), 1e6, 9, None),
            None
        );
        assert_eq!(
            wanted_shards(&policy(Strategy::Off, Shards::Auto), 1e6, 9, None),
            None
        );

        // auto: one proxy's combined writes are at most one per 500 us window (2000/s),
        // under the 5000/s a shard carries: combining is enough.
        let auto = policy(Strategy::Auto, Shards::Auto);
        assert_eq!(wanted_shards(&auto, 100_000.0, 1, None), None);
        // Four proxies each combining to 2000/s put 8000/s on one node: salt, sized on
        // the combined rate.
        assert_eq!(wanted_shards(&auto, 100_000.0, 4, None), Some(2));
        assert_eq!(wanted_shards(&auto, 100_000.0, 16, None), Some(7));
        // A key below the window rate gains nothing from salting.
        assert_eq!(wanted_shards(&auto, 1000.0, 4, None), None);
    }

    #[test]
    fn auto_salts_over_every_node_when_combining_leaves_the_key_node_busier() {
        let auto = policy(Strategy::Auto, Shards::Auto);
        let pool = |mean| {
            Some(Nodes {
                count: 4,
                mean,
                band: 0.05,
            })
        };
        // Two proxies each combining to 2000/s leave 4000/s on one node of a pool whose
        // nodes take 12,000/s each from each proxy: more than 5% of the mean (1200/s over
        // both proxies). Salted with a shard on every node, though 4000/s is under a shard's
        // 5000/s.
        assert_eq!(wanted_shards(&auto, 20_000.0, 2, pool(12_000.0)), Some(4));
        // Nodes twice as busy need 2 shards for 4000/s to be within 5% (2400/s each).
        assert_eq!(wanted_shards(&auto, 20_000.0, 2, pool(24_000.0)), Some(2));
        // A cluster of 30 masters gets as many shards as the margin needs, not 30.
        let big = Some(Nodes {
            count: 30,
            mean: 12_000.0,
            band: 0.05,
        });
        assert_eq!(wanted_shards(&auto, 20_000.0, 2, big), Some(4));
        // The same key on nodes a hundred times busier is within the margin: combined.
        assert_eq!(wanted_shards(&auto, 20_000.0, 2, pool(1_200_000.0)), None);
        // One proxy never leaves more than one write per window (2000/s), however idle
        // the other nodes: combining stays exact there.
        assert_eq!(wanted_shards(&auto, 20_000.0, 1, pool(10.0)), None);
        // Without balance (one node, or balance off) only the shard rate counts.
        assert_eq!(wanted_shards(&auto, 20_000.0, 2, None), None);
        // Over the shard rate, a busy pool still gets a shard on every node.
        assert_eq!(wanted_shards(&auto, 20_000.0, 4, pool(12_000.0)), Some(4));
        assert_eq!(wanted_shards(&auto, 20_000.0, 16, pool(12_000.0)), Some(7));
        // A single node is no pool.
        let one = Some(Nodes {
            count: 1,
            mean: 10.0,
            band: 0.05,
        });
        assert_eq!(wanted_shards(&auto, 20_000.0, 2, one), None);
        // A fixed shard count is kept.
        let fixed = policy(Strategy::Auto, Shards::Fixed(3));
        assert_eq!(wanted_shards(&fixed, 20_000.0, 2, pool(12_000.0)), Some(3));
    }
}
