//! What a rules file says as written: the partial "patches" a rule may give (every field
//! optional; absent means "as in defaults"), how a patch merges over the defaults field by
//! field, and the document before merging and validation.

use serde::Deserialize;

use super::model::{
    Balance, ClientCache, Detection, Families, Policies, ReadPolicy, ReadTier, SaltBy, Shards,
    Strategy, WritePolicy,
};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CachePatch {
    enabled: Option<bool>,
    ttl_ms: Option<u64>,
    jitter_pct: Option<u32>,
    stale_while_revalidate_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadPatch {
    hot_at_per_sec: Option<f64>,
    cool_below_per_sec: Option<f64>,
    hot_at_bytes_per_sec: Option<f64>,
    cool_below_bytes_per_sec: Option<f64>,
    hot_at_node_ms_per_sec: Option<f64>,
    cool_below_node_ms_per_sec: Option<f64>,
    cache: Option<CachePatch>,
    salted: Option<SaltedReadsPatch>,
    client_cache: Option<ClientCache>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SaltedReadsPatch {
    tier: Option<ReadTier>,
    refresh_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct IdempotencyPatch {
    window_ms: Option<u64>,
    max_ids: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CombinePatch {
    window_us: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SaltPatch {
    shards: Option<Shards>,
    per_shard_per_sec: Option<f64>,
    max_shards: Option<u32>,
    families: Option<Families>,
    by: Option<SaltBy>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WritePatch {
    hot_at_per_sec: Option<f64>,
    cool_below_per_sec: Option<f64>,
    strategy: Option<Strategy>,
    combine: Option<CombinePatch>,
    salt: Option<SaltPatch>,
    idempotency: Option<IdempotencyPatch>,
}

fn set<T: Copy>(field: &mut T, v: Option<T>) {
    if let Some(v) = v {
        *field = v;
    }
}

impl ReadPatch {
    pub(crate) fn over(&self, mut r: ReadPolicy) -> ReadPolicy {
        set(&mut r.hot_at_per_sec, self.hot_at_per_sec);
        set(&mut r.cool_below_per_sec, self.cool_below_per_sec);
        set(&mut r.hot_at_bytes_per_sec, self.hot_at_bytes_per_sec);
        set(
            &mut r.cool_below_bytes_per_sec,
            self.cool_below_bytes_per_sec,
        );
        set(&mut r.hot_at_node_ms_per_sec, self.hot_at_node_ms_per_sec);
        set(
            &mut r.cool_below_node_ms_per_sec,
            self.cool_below_node_ms_per_sec,
        );
        if let Some(c) = &self.cache {
            set(&mut r.cache.enabled, c.enabled);
            set(&mut r.cache.ttl_ms, c.ttl_ms);
            set(&mut r.cache.jitter_pct, c.jitter_pct);
            set(
                &mut r.cache.stale_while_revalidate_ms,
                c.stale_while_revalidate_ms,
            );
        }
        if let Some(t) = &self.salted {
            set(&mut r.salted.tier, t.tier);
            set(&mut r.salted.refresh_ms, t.refresh_ms);
        }
        set(&mut r.client_cache, self.client_cache);
        r
    }
}

impl WritePatch {
    pub(crate) fn over(&self, mut w: WritePolicy) -> WritePolicy {
        set(&mut w.hot_at_per_sec, self.hot_at_per_sec);
        set(&mut w.cool_below_per_sec, self.cool_below_per_sec);
        set(&mut w.strategy, self.strategy);
        if let Some(c) = &self.combine {
            set(&mut w.combine.window_us, c.window_us);
        }
        if let Some(s) = &self.salt {
            set(&mut w.salt.shards, s.shards);
            set(&mut w.salt.per_shard_per_sec, s.per_shard_per_sec);
            set(&mut w.salt.max_shards, s.max_shards);
            set(&mut w.salt.families, s.families);
            set(&mut w.salt.by, s.by);
        }
        if let Some(i) = &self.idempotency {
            set(&mut w.idempotency.window_ms, i.window_ms);
            set(&mut w.idempotency.max_ids, i.max_ids);
        }
        w
    }
}

/// One entry of `rules:` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RuleDoc {
    #[serde(rename = "match")]
    pub pattern: String,
    pub read: Option<ReadPatch>,
    pub write: Option<WritePatch>,
    #[serde(default)]
    pub pin: bool,
    pub admit: Option<super::admit::Admit>,
}

/// The file as written, before merging and validation.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RulesDoc {
    pub version: u32,
    #[serde(default)]
    pub detection: Detection,
    #[serde(default = "default_epoch_ms")]
    pub epoch_ms: u64,
    #[serde(default)]
    pub defaults: Policies,
    #[serde(default)]
    pub balance: Balance,
    #[serde(default)]
    pub admission: super::admit::Admission,
    #[serde(default)]
    pub rules: Vec<RuleDoc>,
}

/// Promotions and demotions take effect on these wall-clock-aligned boundaries. Default 5000 ms.
pub(crate) fn default_epoch_ms() -> u64 {
    5000
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_patch_overrides_only_what_it_gives() {
        let p: WritePatch = serde_yaml_ng::from_str("salt: { shards: 8 }").unwrap();
        let base = WritePolicy {
            strategy: Strategy::Combine,
            ..WritePolicy::default()
        };
        let w = p.over(base);
        assert_eq!(w.salt.shards, Shards::Fixed(8));
        assert_eq!(w.salt.max_shards, 64);
        assert_eq!(w.strategy, Strategy::Combine);
    }

    #[test]
    fn shards_take_auto_or_a_count_and_nothing_else() {
        let s: SaltPatch = serde_yaml_ng::from_str("shards: auto").unwrap();
        assert_eq!(s.shards, Some(Shards::Auto));
        let s: SaltPatch = serde_yaml_ng::from_str("shards: 12").unwrap();
        assert_eq!(s.shards, Some(Shards::Fixed(12)));
        for bad in [
            "shards: -1",
            "shards: many",
            "shards: 1.5",
            "shards: 5000000000",
        ] {
            assert!(serde_yaml_ng::from_str::<SaltPatch>(bad).is_err(), "{bad}");
        }
        assert_eq!(serde_json::to_string(&Shards::Fixed(3)).unwrap(), "3");
        assert_eq!(serde_json::to_string(&Shards::Auto).unwrap(), "\"auto\"");
    }
}
