//! Key-level admission control: per-key token buckets at the edge, sampling of counters,
//! delays, priority shedding on overloaded nodes, and global limits shared by the fleet.
//!
//! The session asks `Admission::check` about each key of a command whose first matching
//! rule has an `admit:` section, and gets a `Verdict`. State is kept per key in a bounded
//! table: a key whose bucket has refilled to its burst knows nothing a new one would not,
//! so it is forgotten first, and the table never holds more than `MAX_KEYS` keys.
//!
//! Files: `bucket` (the token bucket, in explicit time), `share` (how a global limit is
//! split between proxies), `global` (the sync through the registry), `sim` (the fleet
//! simulator, in virtual time, on the same bucket and share code).
//!
//! It imports `rules` (the sections), `metrics`, and for the sync `backend`, `resp` and
//! `salt` (its registry call and node).

mod bucket;
pub mod global;
pub mod share;
pub mod sim;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use bytes::Bytes;
use prometheus_client::metrics::counter::Counter;

pub use bucket::Bucket;

use crate::metrics::AdmissionMetrics;
use crate::rules::{Admit, OverLimit, Priority, Rules, Scope};

/// Most keys holding admission state at once.
pub const MAX_KEYS: usize = 65_536;
const SHARDS: usize = 16;

/// The error prefix of a refused command: clients match `THROTTLED`.
pub const THROTTLED: &str = "THROTTLED";

/// What to do with one command.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    Admit,
    /// Admit, and tell `record` the integer the reply shows (a sampled key's last value).
    Record,
    /// Send the increment with its delta multiplied by this; `record` its reply.
    Scaled(i64),
    /// Answer the increment without sending it, with what the key shows when the answer is
    /// written (`last`): after the replies before it on the connection, so a client never
    /// sees its counter go back. The value here is what it showed at the decision.
    Answer(i64),
    /// Admit after this wait (its token is held meanwhile).
    Delay(Duration),
    /// Refuse with this error text.
    Reject(String),
}

/// The node a key lives on, as far as shedding cares.
pub struct NodeLoad<'a> {
    pub addr: &'a str,
    /// Commands sent to it and not answered yet.
    pub pending: u64,
}

struct KeyState {
    bucket: Bucket,
    /// The rate and burst the bucket refilled at when last asked.
    rate: f64,
    burst: f64,
    /// `limit_bytes_per_sec`: charged the bytes of each reply (`charge`).
    bytes: Bucket,
    /// Its rate (and burst: one second of it); 0 without a byte limit.
    bytes_rate: f64,
    /// Global: this proxy's share of the limit per second (None: not synced yet).
    share: Option<f64>,
    /// Global: commands offered since `since_us` (the key's first command, or the last
    /// sync): a key met mid-interval reports its true rate, not a part of it.
    offered: u64,
    since_us: u64,
    /// Global: the demand reported at the last sync (`share::smooth` starts from it).
    reported: Option<f64>,
    global: Option<GlobalKey>,
    /// Sample: over-limit increments answered since the last one sent.
    skipped: u32,
    /// Sample: what the key showed in the last reply seen.
    last: Option<i64>,
    /// When the key was last sampled or refused (for `/hotkeys`), from `Admission::epoch`.
    limited_at_us: u64,
    sampled_at_us: u64,
}

#[derive(Clone, Copy)]
struct GlobalKey {
    limit: f64,
    start_share_pct: f64,
    proxies: Option<u32>,
}

/// Per-rule counters, rebuilt when the rules change.
struct RuleCounters {
    rules: Arc<Rules>,
    by_rule: Vec<Option<[Counter; 5]>>,
}

/// Every key's admission state, and the fleet as the last sync saw it.
pub struct Admission {
    shards: Box<[Mutex<HashMap<Bytes, KeyState>>]>,
    epoch: Instant,
    counters: ArcSwapOption<RuleCounters>,
    pub metrics: AdmissionMetrics,
    /// Proxies seen sharing a key at the last sync (0: none seen yet).
    fleet: AtomicU32,
    /// True while the registry cannot be reached and global limits run on the fallback.
    fallback: std::sync::atomic::AtomicBool,
}

/// What `/hotkeys` says of a limited key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Marked {
    /// Sampled within the last 10 s: the key's value is an estimate.
    Sampled,
    /// Refused or shed within the last 10 s.
    Limited,
}

const MARK_US: u64 = 10_000_000;

impl Admission {
    pub fn new(metrics: AdmissionMetrics) -> Admission {
        Admission {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            epoch: Instant::now(),
            counters: ArcSwapOption::empty(),
            metrics,
            fleet: AtomicU32::new(0),
            fallback: false.into(),
        }
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    fn shard(&self, key: &[u8]) -> &Mutex<HashMap<Bytes, KeyState>> {
        let h = xxhash_rust::xxh3::xxh3_64(key);
        &self.shards[(h as usize) % SHARDS]
    }

    fn counters(&self, rules: &Arc<Rules>, rule: usize) -> Option<[Counter; 5]> {
        let cur = self.counters.load();
        if let Some(c) = cur.as_ref().filter(|c| Arc::ptr_eq(&c.rules, rules)) {
            return c.by_rule.get(rule).cloned().flatten();
        }
        let by_rule = rules
            .rules()
            .iter()
            .map(|r| r.admit.map(|_| self.metrics.for_rule(r.pattern.as_str())))
            .collect::<Vec<_>>();
        let out = by_rule.get(rule).cloned().flatten();
        self.counters.store(Some(Arc::new(RuleCounters {
            rules: rules.clone(),
            by_rule,
        })));
        out
    }

    /// Decides one command on `key`, which matched rule `rule` (with section `a`).
    /// `incr` is the delta of INCR, INCRBY, DECR and DECRBY (None for other commands).
    pub fn check(
        &self,
        rules: &Arc<Rules>,
        rule: usize,
        a: &Admit,
        key: &[u8],
        incr: Option<i64>,
        node: NodeLoad<'_>,
    ) -> Verdict {
        let shed_at = match a.priority {
            Priority::High => u64::MAX,
            Priority::Normal => rules.admission().shed_normal_at_pending,
            Priority::Low => rules.admission().shed_low_at_pending,
        };
        let shed = node.pending >= shed_at;
        let count = |i: usize| {
            if let Some(c) = self.counters(rules, rule) {
                c[i].inc();
            }
        };
        let pattern = rules.rules()[rule].pattern.as_str();
        if a.limit_per_sec.is_none() && a.limit_bytes_per_sec.is_none() && !shed {
            count(0);
            // A key sampled while its node sheds needs its last value when shedding starts.
            return if incr.is_some() && a.over_limit == OverLimit::Sample {
                self.record_only(key, a);
                Verdict::Record
            } else {
                Verdict::Admit
            };
        }
        let now = self.now_us();
        let mut map = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        let st = self.entry(&mut map, key, a, now);
        let (rate, burst) = rate_of(st, a);
        (st.rate, st.burst) = (rate, burst);
        if st.global.is_some() {
            st.offered += 1;
        }
        if let Some(limit) = a.limit_bytes_per_sec {
            if !shed && !st.bytes.has_tokens(limit, a.burst_bytes(), now) {
                st.limited_at_us = now;
                count(3);
                return Verdict::Reject(format!(
                    "{THROTTLED} saltshaker: key over its limit of {limit} bytes/s (rule \"{pattern}\")"
                ));
            }
        }
        let over = if shed {
            true
        } else if a.limit_per_sec.is_none() {
            false
        } else if a.over_limit == OverLimit::Delay {
            let max = a.max_delay_ms * 1000;
            match st.bucket.reserve(rate, burst, now, max) {
                Some(0) => false,
                Some(w) => {
                    count(1);
                    return Verdict::Delay(Duration::from_micros(w));
                }
                None => true,
            }
        } else {
            !st.bucket.take(rate, burst, now)
        };
        if !over {
            count(0);
            return if incr.is_some() && a.over_limit == OverLimit::Sample {
                Verdict::Record
            } else {
                Verdict::Admit
            };
        }
        if a.over_limit == OverLimit::Sample && incr.is_some() {
            count(if shed { 4 } else { 2 });
            st.sampled_at_us = now;
            let Some(v) = st.last else {
                // No value seen yet to answer with: send this one as it is.
                return Verdict::Record;
            };
            st.skipped += 1;
            if st.skipped >= a.sample_one_in {
                st.skipped = 0;
                return Verdict::Scaled(a.sample_one_in as i64);
            }
            return Verdict::Answer(v);
        }
        st.limited_at_us = now;
        count(if shed { 4 } else { 3 });
        let msg = if shed {
            format!(
                "{THROTTLED} saltshaker: node {} is overloaded ({} commands pending); keys of rule \"{pattern}\" ({} priority) are shed",
                node.addr,
                node.pending,
                priority_name(a.priority)
            )
        } else {
            let limit = a.limit_per_sec.unwrap_or(0.0);
            match (a.scope, st.share) {
                (Scope::Global, Some(share)) => format!(
                    "{THROTTLED} saltshaker: key over its limit of {limit}/s over the fleet (rule \"{pattern}\"; this proxy's share {share:.1}/s)"
                ),
                _ => format!(
                    "{THROTTLED} saltshaker: key over its limit of {limit}/s, burst {} (rule \"{pattern}\")",
                    a.burst()
                ),
            }
        };
        Verdict::Reject(msg)
    }

    fn new_state(&self, a: &Admit, now: u64) -> KeyState {
        let limit = a.limit_per_sec.unwrap_or(0.0);
        let global = (a.scope == Scope::Global).then_some(GlobalKey {
            limit,
            start_share_pct: a.start_share_pct,
            proxies: a.proxies,
        });
        let mut st = KeyState {
            bucket: Bucket::full(a.burst(), now),
            bytes: Bucket::full(a.burst_bytes(), now),
            bytes_rate: a.burst_bytes(),
            rate: limit,
            burst: a.burst(),
            share: None,
            offered: 0,
            since_us: now,
            reported: None,
            global,
            skipped: 0,
            last: None,
            limited_at_us: 0,
            sampled_at_us: 0,
        };
        if let Some(g) = global {
            // A proxy new to a key starts small: an equal share when it knows the fleet
            // (from a sync, else the rule's `proxies`), else start_share_pct (a restarted
            // proxy must not spend a whole budget).
            let fleet = self.fleet.load(Ordering::Relaxed);
            let share = match (fleet, g.proxies) {
                (n, _) if n > 0 => limit / n as f64,
                (_, Some(n)) => limit / n as f64,
                _ => limit * g.start_share_pct / 100.0,
            };
            st.share = Some(share);
            st.bucket = Bucket::with(start_tokens(a.burst(), limit, share), now);
        }
        st
    }

    /// Keeps the shard under its share of `MAX_KEYS`: first forgets keys whose bucket is
    /// full again (they know nothing a new one would not), then any key.
    fn make_room(&self, map: &mut HashMap<Bytes, KeyState>, now: u64) {
        if map.len() < MAX_KEYS / SHARDS {
            return;
        }
        let before = map.len();
        let recent = |t: u64| t > 0 && now.saturating_sub(t) <= MARK_US;
        map.retain(|_, st| {
            let forgettable = st.offered == 0
                && !recent(st.sampled_at_us)
                && !recent(st.limited_at_us)
                && st.bucket.is_full(st.rate, st.burst, now)
                && st.bytes.is_full(st.bytes_rate, st.bytes_rate, now);
            !forgettable
        });
        // Every key is busy: forget an eighth of them (whichever come first), so the sweep
        // runs once per that many new keys, not once per key.
        if map.len() >= MAX_KEYS / SHARDS {
            let drop: Vec<Bytes> = map.keys().take(MAX_KEYS / SHARDS / 8).cloned().collect();
            for k in drop {
                map.remove(&k);
            }
        }
        self.metrics.keys.dec_by((before - map.len()) as i64);
    }

    /// The key's state, made for rule section `a` if it has none (room made first).
    fn entry<'m>(
        &self,
        map: &'m mut HashMap<Bytes, KeyState>,
        key: &[u8],
        a: &Admit,
        now: u64,
    ) -> &'m mut KeyState {
        if !map.contains_key(key) {
            self.make_room(map, now);
            map.insert(Bytes::copy_from_slice(key), self.new_state(a, now));
            self.metrics.keys.inc();
        }
        map.get_mut(key).expect("inserted above")
    }

    /// Makes sure `key` has a state, so the value its replies show can be remembered.
    fn record_only(&self, key: &[u8], a: &Admit) {
        let now = self.now_us();
        let mut map = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        self.entry(&mut map, key, a, now);
    }

    /// A command on `key` under rule section `a` moved `n` bytes (request and reply).
    pub fn charge(&self, key: &[u8], a: &Admit, n: usize) {
        let Some(limit) = a.limit_bytes_per_sec else {
            return;
        };
        let now = self.now_us();
        let mut map = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        let st = self.entry(&mut map, key, a, now);
        st.bytes_rate = limit;
        st.bytes.charge(limit, a.burst_bytes(), now, n as f64);
    }

    /// What the key showed in the last reply seen, if any.
    pub fn last(&self, key: &[u8]) -> Option<i64> {
        let map = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        map.get(key).and_then(|st| st.last)
    }

    /// The reply to a `Record` or `Scaled` command showed the key at `value`.
    pub fn record(&self, key: &[u8], value: i64) {
        let mut map = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        if let Some(st) = map.get_mut(key) {
            st.last = Some(value);
        }
    }

    /// How `/hotkeys` should mark `key`, if admission limited it lately.
    pub fn marked(&self, key: &[u8]) -> Option<Marked> {
        let now = self.now_us();
        let map = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        let st = map.get(key)?;
        let recent = |t: u64| t > 0 && now.saturating_sub(t) <= MARK_US;
        if recent(st.sampled_at_us) {
            Some(Marked::Sampled)
        } else if recent(st.limited_at_us) {
            Some(Marked::Limited)
        } else {
            None
        }
    }

    /// Whether global limits run on the fallback now.
    pub fn in_fallback(&self) -> bool {
        self.fallback.load(Ordering::Relaxed)
    }
}

/// The rate and burst a key's bucket refills at: the rule's, or for a global limit this
/// proxy's share of them.
fn rate_of(st: &KeyState, a: &Admit) -> (f64, f64) {
    let limit = a.limit_per_sec.unwrap_or(0.0);
    match (a.scope, st.share) {
        (Scope::Global, Some(s)) => (s, scaled_burst(a.burst(), limit, s)),
        _ => (limit, a.burst()),
    }
}

/// A proxy's part of the burst: as its part of the rate, but never less than what its share
/// admits in `SHARE_BURST_SECS`, nor one command. Split by rate alone, the buckets of a
/// large fleet are too small for bursty arrivals: in the fleet simulator (60 edges, 1000/s,
/// Poisson arrivals near each edge's equal share, burst 100 split 60 ways = 1.7 each) the
/// fleet admitted 66% of its limit while 110% was offered, because quiet edges refused
/// their bursts while holding tokens nobody else could use. Half a second of share left it
/// 7% under, one second 3-4.5%, two seconds 1-2.5% (with the worst 5 s interval 4.7% over).
pub(crate) fn scaled_burst(burst: f64, limit: f64, share: f64) -> f64 {
    if limit <= 0.0 {
        return burst;
    }
    (burst * share / limit)
        .max(share * SHARE_BURST_SECS)
        .max(1.0)
}

/// What a proxy's bucket holds when it starts on a share: its part of the rule's burst by
/// rate only. The larger bucket of `scaled_burst` fills from unused share; starting full, a
/// fleet starting together (or a restarted proxy) would add that much at once.
pub(crate) fn start_tokens(burst: f64, limit: f64, share: f64) -> f64 {
    if limit <= 0.0 {
        return burst;
    }
    (burst * share / limit).max(1.0)
}

/// See `scaled_burst`.
const SHARE_BURST_SECS: f64 = 2.0;

fn priority_name(p: Priority) -> &'static str {
    match p {
        Priority::Low => "low",
        Priority::Normal => "normal",
        Priority::High => "high",
    }
}

#[cfg(test)]
mod tests;
