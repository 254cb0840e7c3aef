//! The rules document's types: the effective policies (what the data path reads). What a
//! rule may give, and how it merges over the defaults, is in `patch`.
//!
//! Built-in defaults live in the `Default` impls below and must agree with
//! `rules/default.yaml` (a test holds them together). Units are in the field names.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// How write pressure on a hot key is taken off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Strategy {
    /// Forward writes unchanged (locks, config rows: keys whose identity is the point).
    #[serde(rename = "off")]
    Off,
    /// Batch same-key increments arriving within `combine.window_us` into one.
    #[serde(rename = "combine")]
    Combine,
    /// Spread writes over shard keys on different nodes; reads merge them back.
    #[serde(rename = "salt")]
    Salt,
    /// Both: combine per shard.
    #[serde(rename = "salt+combine")]
    SaltCombine,
    /// The proxy chooses per key from its rate: combine while one node keeps up
    /// (`salt.per_shard_per_sec`), salt+combine above that.
    #[serde(rename = "auto")]
    Auto,
}

/// Salt count: fixed, or `auto` = ceil(peak write rate / `per_shard_per_sec`), capped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shards {
    Auto,
    Fixed(u32),
}

impl Serialize for Shards {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Shards::Auto => s.serialize_str("auto"),
            Shards::Fixed(n) => s.serialize_u32(*n),
        }
    }
}

impl<'de> Deserialize<'de> for Shards {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Shards;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("`auto` or a whole number of shards")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Shards, E> {
                match v {
                    "auto" => Ok(Shards::Auto),
                    _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
                }
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Shards, E> {
                u32::try_from(v)
                    .map(Shards::Fixed)
                    .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Shards, E> {
                u64::try_from(v)
                    .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
                    .and_then(|v| self.visit_u64(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// What a key holds, as far as salting cares. A rule lists the families it lets the proxy
/// salt; only those with an exact merge are accepted (see `SALTABLE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Families(pub u8);

/// Every family name a rule may write, with its bit.
pub const FAMILY_NAMES: [(&str, u8); 7] = [
    ("counters", 1),
    ("hashes", 2),
    ("sets", 4),
    ("hyperloglogs", 8),
    ("sorted_sets", 16),
    ("lists", 32),
    ("strings", 64),
];

/// Families salting can merge exactly today: integer counters (INCR family), hashes of
/// integer counters (HINCRBY), sets, HyperLogLogs and sorted sets (partitioned by member).
pub const SALTABLE: u8 = 1 | 2 | 4 | 8 | 16;

impl Families {
    pub fn contains(self, name: &str) -> bool {
        FAMILY_NAMES
            .iter()
            .any(|(n, bit)| *n == name && self.0 & bit != 0)
    }

    pub fn names(self) -> Vec<&'static str> {
        FAMILY_NAMES
            .iter()
            .filter(|(_, bit)| self.0 & bit != 0)
            .map(|(n, _)| *n)
            .collect()
    }
}

impl Serialize for Families {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.names().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Families {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let names = Vec::<String>::deserialize(d)?;
        let mut bits = 0;
        for n in &names {
            match FAMILY_NAMES.iter().find(|(f, _)| f == n) {
                Some((_, b)) => bits |= b,
                None => {
                    return Err(de::Error::custom(format!(
                        "unknown family `{n}` (one of counters, hashes, sets, hyperloglogs, sorted_sets, lists, strings)"
                    )))
                }
            }
        }
        Ok(Families(bits))
    }
}

/// How hot keys are found.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Detection {
    /// Count requests at all. Off only to measure what detection costs: nothing becomes hot.
    /// Default true.
    pub enabled: bool,
    /// Counters halve every window; rates are per window. Default 1000 ms.
    pub window_ms: u64,
    /// Keys tracked per thread and direction. Default 128.
    pub top_k: usize,
}

impl Default for Detection {
    fn default() -> Self {
        Detection {
            enabled: true,
            window_ms: 1000,
            top_k: 128,
        }
    }
}

/// Node balance: when skewed reads leave one node busier than the others, the keys read
/// most on that node become read-hot at a lower rate, so the cache takes the excess off it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Balance {
    /// Lower read-hot thresholds on busy nodes at all. Default true.
    pub enabled: bool,
    /// A node is busy when the commands it is sent exceed the nodes' mean by more than
    /// this. Default 5 percent.
    pub over_mean_pct: f64,
    /// The lowest rate at which a key may become read-hot for balance: below it a cache
    /// entry would mostly miss. Default 20 reads per second.
    pub min_reads_per_sec: f64,
}

impl Default for Balance {
    fn default() -> Self {
        Balance {
            enabled: true,
            over_mean_pct: 5.0,
            min_reads_per_sec: 20.0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CachePolicy {
    /// Serve read-hot keys from the proxy's cache. Default true.
    pub enabled: bool,
    /// Entry lifetime before jitter. Default 1000 ms.
    pub ttl_ms: u64,
    /// TTL varies by +/- this percentage so entries do not expire together. Default 20.
    pub jitter_pct: u32,
    /// How long past expiry a stale entry may be served while one refill runs. Default 250 ms.
    pub stale_while_revalidate_ms: u64,
}

impl Default for CachePolicy {
    fn default() -> Self {
        CachePolicy {
            enabled: true,
            ttl_ms: 1000,
            jitter_pct: 20,
            stale_while_revalidate_ms: 250,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReadPolicy {
    /// A key reading at least this often is read-hot. Default 2000 per second.
    pub hot_at_per_sec: f64,
    /// A read-hot key below this rate cools down (hysteresis). Default 500 per second.
    pub cool_below_per_sec: f64,
    /// A key whose reads move at least this many bytes a second (request and reply) is
    /// read-hot by bytes. Default 16 MiB (docs/rules.md says why).
    pub hot_at_bytes_per_sec: f64,
    /// Default 4 MiB.
    pub cool_below_bytes_per_sec: f64,
    /// A key whose reads cost the node at least this many milliseconds a second (estimated
    /// from each reply) is read-hot by node time. Default 100.
    pub hot_at_node_ms_per_sec: f64,
    /// Default 25.
    pub cool_below_node_ms_per_sec: f64,
    pub cache: CachePolicy,
    /// How merged reads of a salted key are served.
    pub salted: SaltedReads,
    /// Which keys clients with CLIENT TRACKING may keep in their own process.
    pub client_cache: ClientCache,
}

/// `read.client_cache`: the keys a tracking client may keep.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientCache {
    pub keys: ClientCacheKeys,
}

/// `all` (every key it reads, as on Redis), or `hot_only`: a read of a key that is not
/// read-hot now is invalidated right after its reply, so the application's cache holds
/// only the few keys that hurt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClientCacheKeys {
    #[default]
    All,
    HotOnly,
}

impl Default for ReadPolicy {
    fn default() -> Self {
        ReadPolicy {
            hot_at_per_sec: 2000.0,
            cool_below_per_sec: 500.0,
            hot_at_bytes_per_sec: crate::hotkey::BYTES_HOT_AT_PER_SEC,
            cool_below_bytes_per_sec: crate::hotkey::BYTES_COOL_BELOW_PER_SEC,
            hot_at_node_ms_per_sec: crate::hotkey::NODE_US_HOT_AT_PER_SEC / 1000.0,
            cool_below_node_ms_per_sec: crate::hotkey::NODE_US_COOL_BELOW_PER_SEC / 1000.0,
            cache: CachePolicy::default(),
            salted: SaltedReads::default(),
            client_cache: ClientCache::default(),
        }
    }
}

/// `read.salted`: the exactness tier of a salted key's merged reads.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SaltedReads {
    /// `exact` (every read merges every part) or `display` (reads are served from a
    /// rollup each proxy refreshes at most once per `refresh_ms`). Default exact.
    pub tier: ReadTier,
    /// Display tier: how old the rollup may be. Default 2000 ms.
    pub refresh_ms: u64,
}

impl Default for SaltedReads {
    fn default() -> Self {
        SaltedReads {
            tier: ReadTier::Exact,
            refresh_ms: 2000,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadTier {
    #[default]
    Exact,
    Display,
}

/// `write.idempotency`: how long `SALTSHAKER.INCRBY` remembers an increment ID, and how
/// many IDs one key (one part of a salted key) keeps at most.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Idempotency {
    /// Default 86400000 ms (24 h).
    pub window_ms: u64,
    /// Default 100000. Past it the oldest ID is forgotten first (counted in
    /// `saltshaker_idempotent_evicted_total`).
    pub max_ids: u64,
}

impl Default for Idempotency {
    fn default() -> Self {
        Idempotency {
            window_ms: 86_400_000,
            max_ids: 100_000,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CombinePolicy {
    /// A key's combined increments leave as one command per window at most (an increment
    /// to a key with nothing in flight leaves at once). Default 500 us.
    pub window_us: u64,
}

impl Default for CombinePolicy {
    fn default() -> Self {
        CombinePolicy { window_us: 500 }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SaltPolicy {
    /// `auto` or a fixed count. Default auto.
    pub shards: Shards,
    /// Write rate one shard (one node) should carry, for `auto`. Default 5000 per second:
    /// one proxy's combined writes (at most one per `window_us`, 2000/s by default) stay
    /// combined; salting starts when several proxies together exceed it.
    pub per_shard_per_sec: f64,
    /// Ceiling for `auto` and for a fixed count. Default 64.
    pub max_shards: u32,
    /// What the key may hold for the proxy to salt it. Default [counters].
    pub families: Families,
    /// How a hash of counters is spread: `random` (every HINCRBY to any shard, a read
    /// sums every part: for a few very hot fields) or `field` (each field in the shard its
    /// name hashes to: for many fields, point reads ask one shard). Default random.
    pub by: SaltBy,
}

/// How the writes of a salted hash are placed (`salt.by`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SaltBy {
    #[default]
    Random,
    Field,
}

impl Default for SaltPolicy {
    fn default() -> Self {
        SaltPolicy {
            shards: Shards::Auto,
            per_shard_per_sec: 5000.0,
            max_shards: 64,
            families: Families(1),
            by: SaltBy::Random,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WritePolicy {
    /// A key written at least this often is write-hot. Default 2000 per second.
    pub hot_at_per_sec: f64,
    /// A write-hot key below this rate is demoted at an epoch boundary. Default 500 per second.
    pub cool_below_per_sec: f64,
    /// Default auto.
    pub strategy: Strategy,
    pub combine: CombinePolicy,
    pub salt: SaltPolicy,
    pub idempotency: Idempotency,
}

impl Default for WritePolicy {
    fn default() -> Self {
        WritePolicy {
            hot_at_per_sec: 2000.0,
            cool_below_per_sec: 500.0,
            strategy: Strategy::Auto,
            combine: CombinePolicy::default(),
            salt: SaltPolicy::default(),
            idempotency: Idempotency::default(),
        }
    }
}

/// The `defaults:` section: what a key gets when no rule matches, and what rules inherit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policies {
    pub read: ReadPolicy,
    pub write: WritePolicy,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strategy_names_are_the_documented_ones() {
        let all = [
            Strategy::Off,
            Strategy::Combine,
            Strategy::Salt,
            Strategy::SaltCombine,
            Strategy::Auto,
        ];
        let names: Vec<String> = all
            .iter()
            .map(|s| serde_json::to_string(s).unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "\"off\"",
                "\"combine\"",
                "\"salt\"",
                "\"salt+combine\"",
                "\"auto\""
            ]
        );
    }
}
