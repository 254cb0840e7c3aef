//! Salting: a write-hot key (a counter, a hash of counters, a set, a HyperLogLog, a sorted
//! set) spread over N shard keys on N nodes, merged back on read, shared by every proxy
//! through a registry in the backend, and folded back when it cools.
//!
//! Three layers; imports go down only.
//!
//! - The engine, which knows no kind. This file: the salt table the data path reads, a
//!   salted key's parts and nodes, `call` (every node call of salting, with its deadline).
//!   `record`: the registry record and the epoch arithmetic (pure). `names`: shard and
//!   bookkeeping names, salts chosen by the node they land on (pure). `registry`: the
//!   registry in the backend (compare-and-set, announcements, promotion, demotion).
//!   `journal`: the fold's claim bookkeeping, journaled moves and the counters'
//!   take-then-add. `merge`: the parts' replies summed into one key's reply, values in
//!   transit. `kind`: the operations (`Op`, `MOp`) and the `SaltKind` trait. `idem`:
//!   `SALTSHAKER.INCRBY`, increments applied once per ID. `rollup`: the display tier's
//!   rollups of merged counter reads.
//! - The kinds (`kinds/`): counters, hashes by field, sets, HyperLogLogs, sorted sets,
//!   each implementing `SaltKind`; `kinds::of` is the one `match Kind`.
//! - On top: `ops` (one command on a salted key: classify, plan, merge, multi-key
//!   commands), `fold` (moving every shard into the base key; a set's spread), `relocate`
//!   (moving one shard of a key salted by member off a master it shares), and
//!   `coordinator` (the per-proxy task: resync, promote, heartbeat and grow, move shards
//!   apart, demote, fold), `early` (a promotion in force once every live proxy knows it).
//!
//! The data path reads `Salt::table` (an immutable snapshot swapped by the coordinator), so
//! a command on a key that is not salted costs one hash lookup, and nothing at all when no
//! key is salted.

pub mod coordinator;
pub mod early;
pub mod fold;
pub mod idem;
pub mod journal;
pub mod kind;
pub mod kinds;
pub mod merge;
pub mod names;
pub mod ops;
pub mod record;
pub mod registry;
pub mod relocate;
pub mod rollup;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use bytes::Bytes;
use tokio::sync::Notify;

use crate::backend::{Backend, BackendError};
pub use crate::metrics::SaltMetrics;
use crate::resp::{parse_value, Proto, Value};
use names::Place;
use record::Record;

/// A salted key as the data path sees it.
pub struct Salted {
    pub key: Bytes,
    pub rec: Record,
    /// `parts[0]` is the base key, `parts[1 + i]` shard `i`.
    pub parts: Vec<Bytes>,
    pub nodes: Vec<usize>,
    /// Fold bookkeeping beside each part: `aux[0]` the base key's applied list, `aux[1 + i]`
    /// shard `i`'s stash (see `fold`).
    pub aux: Vec<Bytes>,
    /// Shared with the entry this one replaced, so a session still holding the old entry
    /// advances the same rotation.
    rr: Arc<AtomicUsize>,
    /// Partitioned kinds: what this proxy knows of the base key (see `base_maybe`). Shared
    /// with the entry this one replaced.
    base: Arc<BaseState>,
    /// Last value seen per part, per hash field (None for a string), for the estimated
    /// reply of a shard write. Bounded: a hash with many fields keeps the first 1024.
    last: Mutex<HashMap<Option<Bytes>, Vec<i64>>>,
    /// The display tier's rollups of this key. Shared with the entry this one replaced.
    pub rollup: Arc<rollup::Rollups>,
}

impl Salted {
    pub fn new(key: Bytes, rec: Record, place: &dyn Place) -> Salted {
        let mut parts = vec![key.clone()];
        parts.extend(
            rec.salts
                .iter()
                .map(|&s| names::shard_name(&key, s, place.tag())),
        );
        let nodes = parts.iter().map(|p| place.node_of(p)).collect();
        let mut aux = vec![names::applied_name(place, &key)];
        aux.extend(rec.salts.iter().map(|&s| names::stash_name(place, &key, s)));
        Salted {
            key,
            rec,
            parts,
            nodes,
            aux,
            rr: Arc::new(AtomicUsize::new(0)),
            base: Arc::new(BaseState::default()),
            last: Mutex::new(HashMap::new()),
            rollup: Arc::default(),
        }
    }

    /// This entry, continuing `old`'s write rotation and what it knew of the base key.
    pub fn continuing(mut self, old: &Salted) -> Salted {
        self.rr = Arc::clone(&old.rr);
        self.base = Arc::clone(&old.base);
        self.rollup = Arc::clone(&old.rollup);
        self
    }

    /// Partitioned kinds: whether the base key may hold members (it did before the
    /// promotion, or a write went to it since). While it may, an SADD also asks the base
    /// key whether the member is there, so the reply counts it as Redis would. Reads never
    /// rely on this: they always take the base key into account.
    pub fn base_maybe(&self) -> bool {
        self.base.empty_at.load(Ordering::Acquire) != self.base.writes.load(Ordering::Acquire) + 1
    }

    /// The record changed other than by a heartbeat: ask the base key again, but not
    /// before `settle_ms` (see `coordinator::install`).
    pub fn changed(&self, settle_ms: u64) {
        self.note_base_write();
        self.base
            .check_from_ms
            .fetch_max(settle_ms, Ordering::AcqRel);
    }

    /// Whether a check of the base key may start at `now_ms`.
    pub fn base_checkable(&self, now_ms: u64) -> bool {
        now_ms >= self.base.check_from_ms.load(Ordering::Acquire)
    }

    /// This proxy sent a write to the base key.
    pub fn note_base_write(&self) {
        self.base.writes.fetch_add(1, Ordering::AcqRel);
    }

    /// The count of base-key writes before a check of the base key starts.
    pub fn base_writes(&self) -> u64 {
        self.base.writes.load(Ordering::Acquire)
    }

    /// A check that started after `writes` base-key writes found the base key empty: it
    /// stays known empty until this proxy writes it again.
    pub fn base_seen_empty(&self, writes: u64, now_ms: u64) {
        self.base.empty_at.store(writes + 1, Ordering::Release);
        self.base.empty_ms.store(now_ms, Ordering::Release);
    }

    /// A base key known empty is asked again once an epoch has passed since it was found
    /// so (a proxy without a fresh registry view writes it: `coordinator::check_bases`).
    pub fn base_recheck_due(&self, now_ms: u64, epoch_ms: u64) -> bool {
        now_ms
            >= self
                .base
                .empty_ms
                .load(Ordering::Acquire)
                .saturating_add(epoch_ms)
    }

    /// The part (1 + shard index) that holds `member` of a partitioned key: a hash of the
    /// member over the placing step's salts (`Record::member_salt`), the same on every
    /// proxy.
    pub fn shard_of(&self, member: &[u8]) -> usize {
        1 + self.rec.member_salt(member, now_ms())
    }

    /// The shard index the next write goes to, if writers use shards now: each write the
    /// next shard in turn, or with `turn`, the turn's shard.
    ///
    /// A combined write passes the number of the combine window it falls in, so every write
    /// of one window joins one shard's batch and the next window's go to the next shard: one
    /// proxy then sends about one batch per window over all the shards together. Each
    /// write to the next shard would open a batch on every shard in every window, as many
    /// commands as shards (bench/README.md, "Salted and combined: one batch per window").
    pub fn write_shard(&self, now_ms: u64, turn: Option<u64>) -> Option<usize> {
        let step = self.rec.step_at(now_ms)?;
        let n = self.rec.writers(now_ms)? as usize;
        let k = match turn {
            Some(t) => (t % n as u64) as usize,
            None => self.rr.fetch_add(1, Ordering::Relaxed) % n,
        };
        Some(match step.shards.get(k) {
            Some(&i) if (i as usize) < self.rec.salts.len() => i as usize,
            _ => k,
        })
    }

    /// Records `v` as part `part`'s value of `field` and returns the estimate of the whole:
    /// `v` plus the last known values of the other parts.
    pub fn estimate(&self, field: Option<&Bytes>, part: usize, v: i64) -> i64 {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        let n = self.parts.len();
        if !last.contains_key(&field.cloned()) && last.len() >= 1024 {
            return v;
        }
        let row = last.entry(field.cloned()).or_insert_with(|| vec![0; n]);
        row[part] = v;
        row.iter().fold(0i64, |a, &x| a.saturating_add(x))
    }

    /// The last known whole of `field` (the sum of every part's last seen value); None
    /// until this proxy has read every part (a merged read), or since a fold moved them.
    pub fn known_total(&self, field: Option<&Bytes>) -> Option<i64> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.get(&field.cloned())
            .map(|row| row.iter().fold(0i64, |a, &x| a.saturating_add(x)))
    }

    /// Forgets every part's last seen value: a fold moved them.
    pub fn forget(&self) {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }

    /// Remembers every part's value after a merged read.
    pub fn remember(&self, field: Option<&Bytes>, values: &[i64]) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.len() < 1024 || last.contains_key(&field.cloned()) {
            last.insert(field.cloned(), values.to_vec());
        }
    }
}

/// Whether a partitioned key's base key may hold members: `empty_at` is one more than the
/// count of base-key writes at the last check that found it empty (0: never found empty).
#[derive(Default)]
struct BaseState {
    writes: AtomicU64,
    empty_at: AtomicU64,
    /// No check of the base key before this instant (see `Salted::changed`).
    check_from_ms: AtomicU64,
    /// When a check last found the base key empty.
    empty_ms: AtomicU64,
}

/// The salted keys this proxy knows of.
#[derive(Default)]
pub struct SaltTable {
    keys: HashMap<Bytes, Arc<Salted>>,
}

impl std::fmt::Debug for SaltTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SaltTable({} keys)", self.keys.len())
    }
}

impl std::fmt::Debug for Salted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Salted")
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("kind", &self.rec.kind)
            .field("parts", &self.parts.len())
            .finish()
    }
}

impl SaltTable {
    /// A table of these entries, by key.
    pub fn from_entries(entries: impl IntoIterator<Item = Arc<Salted>>) -> SaltTable {
        SaltTable {
            keys: entries.into_iter().map(|e| (e.key.clone(), e)).collect(),
        }
    }

    pub fn get(&self, key: &[u8]) -> Option<&Arc<Salted>> {
        self.keys.get(key)
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Salted>> {
        self.keys.values()
    }
}

/// What every session and the coordinator share.
pub struct Salt {
    pub table: ArcSwap<SaltTable>,
    pub metrics: SaltMetrics,
    /// This proxy's name in the registry (host, pid and start time).
    pub id: String,
    /// Unix ms of the last successful registry read. A proxy that has not heard from the
    /// registry for an epoch writes base keys only (always safe: reads merge the base).
    synced_ms: AtomicU64,
    /// The coordinator's first registry read has ended (`first_sync`).
    first_read_done: std::sync::atomic::AtomicBool,
    pub epoch_ms: AtomicU64,
    /// False when the pool places keys at random: a shard could not be found again.
    pub enabled: bool,
    /// Wakes the coordinator (an announcement, an admin request).
    pub kick: Arc<Notify>,
    /// Sets whose base-key members this proxy is moving into their shards now
    /// (`fold::spread`), so the coordinator starts one spread per key at a time.
    pub spreading: Mutex<std::collections::HashSet<Bytes>>,
    /// Write-hot keys `auto` would salt but does not, because salting them would not pay
    /// (`registry::salting_pays`): their reads per write.
    not_salted: Mutex<HashMap<Bytes, f64>>,
    /// Log lines name a key by its hash (`hotkeys.hash_names`).
    pub hash_names: std::sync::atomic::AtomicBool,
}

impl Salt {
    pub fn new(backend: &Backend, metrics: SaltMetrics) -> Salt {
        let enabled = !backend.random();
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "proxy".into());
        Salt {
            table: ArcSwap::from_pointee(SaltTable::default()),
            metrics,
            id: format!("{host}:{}:{}", std::process::id(), now_ms()),
            synced_ms: AtomicU64::new(0),
            first_read_done: Default::default(),
            epoch_ms: AtomicU64::new(5000),
            enabled,
            kick: Arc::new(Notify::new()),
            spreading: Mutex::new(Default::default()),
            not_salted: Mutex::default(),
            hash_names: Default::default(),
        }
    }

    /// How often the coordinator reads the registry: ten times an epoch, at most every
    /// half second.
    pub fn tick_ms(&self) -> u64 {
        (self.epoch_ms.load(Ordering::Relaxed) / 10).clamp(50, 500)
    }

    /// Whether a summing read of `e` must read the fold's bookkeeping too: a fold may be
    /// moving values (the record says so, or the key is demoted), or this proxy's view of
    /// the registry is older than two ticks and might miss a move starting. A move that
    /// starts on a salted key waits three ticks after announcing itself (`fold::move_all`),
    /// so a proxy with a fresh view always knows of it in time.
    pub fn careful(&self, e: &Salted, now_ms: u64) -> bool {
        e.rec.fold.is_some() || e.rec.demote_ms.is_some() || self.stale(now_ms)
    }

    /// This proxy's registry view is older than two ticks: it might miss a fold starting.
    pub fn stale(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.synced_ms.load(Ordering::Relaxed)) >= 2 * self.tick_ms()
    }

    /// Whether writers may use shards: the registry was read within the last epoch.
    pub fn fresh(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.synced_ms.load(Ordering::Relaxed))
            < self.epoch_ms.load(Ordering::Relaxed)
    }

    fn synced(&self, now_ms: u64) {
        self.synced_ms.store(now_ms, Ordering::Relaxed);
    }

    /// Waits until the coordinator's first registry read has ended, at most `within`; false
    /// if the registry was not read. Clients are accepted after it: before its first read a
    /// proxy does not know which keys are salted, and would read a salted key's base alone.
    /// (A promotion in force within milliseconds of being announced, `early`, made the
    /// window visible: a proxy started just after one missed acknowledged increments in
    /// `tests/promotion.rs`.) A registry that does not answer delays no more than `within`.
    pub async fn first_sync(&self, within: Duration) -> bool {
        let end = tokio::time::Instant::now() + within;
        while self.enabled && !self.first_read_done.load(Ordering::Relaxed) {
            if tokio::time::Instant::now() >= end {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        !self.enabled || self.synced_ms.load(Ordering::Relaxed) > 0
    }

    /// The coordinator's first registry read has ended, read or not.
    pub(crate) fn first_read_ended(&self) {
        self.first_read_done.store(true, Ordering::Relaxed);
    }
}

/// The wall clock every epoch decision reads, in Unix milliseconds.
///
/// `SALTSHAKER_CLOCK_SKEW_MS` (signed) is added to it: the clock-skew tests run proxies
/// whose clocks differ by a known amount (`tests/promotion.rs`). Not for production use.
pub fn now_ms() -> u64 {
    static SKEW: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    let skew = *SKEW.get_or_init(|| {
        std::env::var("SALTSHAKER_CLOCK_SKEW_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    });
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
        .saturating_add_signed(skew)
}

impl Place for Backend {
    fn node_of(&self, key: &[u8]) -> usize {
        self.node_for(key)
    }
    fn nodes(&self) -> usize {
        self.len()
    }
    fn tag(&self) -> [u8; 2] {
        self.hash_tag().unwrap_or(*b"{}")
    }
    fn by_slot(&self) -> bool {
        Backend::by_slot(self)
    }
    fn owners(&self) -> Vec<usize> {
        self.masters()
    }
}

/// Sends `cmds` (node, command) with one job per node, all in flight at once, and returns
/// the replies in order. Any node failing fails the whole call: a merged answer is never
/// built from some of the parts.
pub async fn call(backend: &Backend, cmds: &[(usize, Bytes)]) -> Result<Vec<Value>, SaltError> {
    let mut per_node: Vec<(usize, Vec<usize>)> = Vec::new();
    for (i, (node, _)) in cmds.iter().enumerate() {
        match per_node.iter_mut().find(|(n, _)| n == node) {
            Some((_, idx)) => idx.push(i),
            None => per_node.push((*node, vec![i])),
        }
    }
    // The fold and the registry must not wait forever either: with no request timeout
    // configured they still give up after five seconds.
    let deadline = crate::backend::deadline(Some(
        backend.request_timeout.unwrap_or(Duration::from_secs(5)),
    ));
    let mut waits = Vec::with_capacity(per_node.len());
    for (node, idx) in &per_node {
        let conn = crate::backend::pick(&backend.node(*node).conns(Proto::Resp2, 0), idx[0]);
        let data = idx.iter().map(|&i| cmds[i].1.clone()).collect();
        waits.push(conn.start(data, idx.len() as u32, deadline).await);
    }
    let mut out = vec![Value::Nil; cmds.len()];
    for ((node, idx), call) in per_node.iter().zip(waits) {
        let addr = &backend.node(*node).addr;
        let replies = call.wait(deadline).await.map_err(SaltError::Node)?;
        for (j, &i) in idx.iter().enumerate() {
            if j >= replies.len() {
                return Err(BackendError::protocol(addr, "missing reply").into());
            }
            match parse_value(&replies.get(j)) {
                Ok(Some((v, _))) => out[i] = v,
                _ => return Err(BackendError::protocol(addr, "unreadable reply").into()),
            }
        }
    }
    Ok(out)
}

/// Stops at a named point when `SALTSHAKER_FAILPOINT` names it: `NAME` kills the process
/// there (the crash tests of the fold die between two journaled steps), `NAME+MS` pauses
/// the first task to reach it for MS milliseconds (the race tests change the registry
/// while a fold is between two steps). Not for production use.
pub async fn failpoint(name: &str) {
    static WANT: std::sync::OnceLock<Option<(String, Option<u64>)>> = std::sync::OnceLock::new();
    static PAUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let want = WANT.get_or_init(|| {
        let v = std::env::var("SALTSHAKER_FAILPOINT").ok()?;
        Some(match v.split_once('+') {
            Some((n, ms)) => (n.to_string(), ms.parse().ok()),
            None => (v, None),
        })
    });
    match want {
        Some((n, None)) if n == name => {
            tracing::error!(failpoint = name, "failpoint reached: aborting the process");
            std::process::abort();
        }
        Some((n, Some(ms))) if n == name && !PAUSED.swap(true, Ordering::Relaxed) => {
            tracing::warn!(
                failpoint = name,
                pause_ms = ms,
                "failpoint reached: pausing"
            );
            tokio::time::sleep(std::time::Duration::from_millis(*ms)).await;
        }
        _ => {}
    }
}

/// What goes wrong in salting: the fold, the registry, the coordinator and promotion
/// report it; the session turns it into an error reply. The text is what clients and logs
/// have always seen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SaltError {
    /// A node did not answer in time, was down, or its connection failed; the backend's
    /// own error, which names the node.
    #[error(transparent)]
    Node(#[from] crate::backend::BackendError),
    /// A node answered something salting cannot use: an error reply, a value of the wrong
    /// type, an unreadable record.
    #[error("{0}")]
    Reply(String),
    /// Another proxy (or task) holds the key's fold, or the registry record kept changing.
    #[error("{0}")]
    Busy(String),
    /// A journaled move or a record names something that cannot be (a shard the record
    /// does not have, an unreadable member).
    #[error("{0}")]
    Journal(String),
    /// A promotion that is not allowed (saltshaker's own keys, a pool that places keys at
    /// random, a type the rule does not salt).
    #[error("{0}")]
    Refused(String),
}

/// An error reply in saltshaker's words.
pub fn err(msg: impl std::fmt::Display) -> Value {
    Value::Error(Bytes::from(format!("ERR saltshaker: {msg}")))
}

/// An integer reply or bulk, as i64.
pub fn as_i64(v: &Value) -> Option<i64> {
    match v {
        Value::Integer(i) => Some(*i),
        Value::Bulk(b) => crate::resp::parse_i64(b),
        _ => None,
    }
}

/// A boxed future: what the kinds' trait methods and `Control` return.
pub type Fut<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// What the admin endpoints may ask of salting (the proxy implements it: it owns the backend).
pub trait Control: Send + Sync {
    /// Salts `key` over `shards` from the next safe boundary, pinned until demoted.
    fn promote(&self, key: Vec<u8>, shards: u32) -> Fut<'_, Result<Record, SaltError>>;
    /// Ends salting at the next safe boundary; None if the key was not salted.
    fn demote(&self, key: Vec<u8>) -> Fut<'_, Result<Option<Record>, SaltError>>;
    fn table(&self) -> Arc<SaltTable>;
}

/// Arguments for the unit tests of salting's pure parts.
#[cfg(test)]
pub(crate) mod testing {
    use bytes::Bytes;

    pub fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    /// A command line split on spaces.
    pub fn args(line: &str) -> Vec<Bytes> {
        line.split(' ').map(b).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::record::{Kind, Record};
    use super::*;

    struct One;
    impl Place for One {
        fn node_of(&self, _: &[u8]) -> usize {
            0
        }
        fn nodes(&self) -> usize {
            1
        }
        fn tag(&self) -> [u8; 2] {
            *b"{}"
        }
    }

    #[test]
    fn a_changed_record_asks_the_base_key_again_only_once_it_settles() {
        let rec = Record::new(Kind::ZSet, vec![1, 2], 1000, 0, "p");
        let e = Salted::new(Bytes::from_static(b"z"), rec.clone(), &One);
        assert!(e.base_maybe() && e.base_checkable(0));
        e.base_seen_empty(e.base_writes(), 0);
        assert!(!e.base_maybe());
        // A write this proxy sends to the base key: checkable again at once.
        e.note_base_write();
        assert!(e.base_maybe() && e.base_checkable(5000));
        e.base_seen_empty(e.base_writes(), 0);
        // The record changed (a pin cancelled a demotion): not before it settles.
        let next = Salted::new(Bytes::from_static(b"z"), rec, &One).continuing(&e);
        next.changed(9000);
        assert!(
            next.base_maybe() && e.base_maybe(),
            "shared with the old entry"
        );
        assert!(!next.base_checkable(8999) && next.base_checkable(9000));
        // Known empty since 0: asked again after an epoch.
        assert!(!e.base_recheck_due(999, 1000) && e.base_recheck_due(1000, 1000));
    }
}
