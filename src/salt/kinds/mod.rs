//! The salt kinds, one file (or folder) each, every one implementing `kind::SaltKind`:
//! counters (strings and hashes salted by key), hashes placed by field, sets,
//! HyperLogLogs and sorted sets. A kind imports the engine (`kind`, `journal`, `merge`,
//! `names`, `record`, the salt table), never another kind; `of` is the one place a
//! `Kind` chooses its implementation, and `identify` asks each kind whether a key is its
//! (the type table is the kinds' own answers, not a list kept elsewhere).

pub mod counter;
pub mod fields;
pub mod hll;
pub mod set;
pub mod zset;

use super::kind::{Facts, SaltKind};
use super::record::{Kind, Record};
use super::{call, registry, Salt, SaltError};
use crate::backend::{wire, Backend};
use crate::resp::Value;
use crate::rules::{SaltBy, SaltPolicy};

/// Every kind, in the order a key's type is matched against them.
pub const ALL: [Kind; 6] = [
    Kind::String,
    Kind::Hash,
    Kind::Fields,
    Kind::Set,
    Kind::Hll,
    Kind::ZSet,
];

/// The implementation of `kind`.
pub fn of(kind: Kind) -> &'static dyn SaltKind {
    match kind {
        Kind::String => &counter::STRINGS,
        Kind::Hash => &counter::HASHES,
        Kind::Fields => &fields::Fields,
        Kind::Set => &set::Set,
        Kind::Hll => &hll::Hll,
        Kind::ZSet => &zset::ZSet,
    }
}

/// Salts `key` under `policy` to `n` shards from the next safe boundary, as the kind its
/// type makes it (`identify`).
pub async fn promote(
    backend: &Backend,
    salt: &Salt,
    key: &[u8],
    n: u32,
    pinned: bool,
    policy: SaltPolicy,
    skip: Option<usize>,
) -> Result<Record, SaltError> {
    let kind = identify(backend, key, &policy).await?;
    registry::promote(backend, salt, key, kind, n, pinned, skip).await
}

/// The kind `key` is salted as under `policy`: the first kind that takes its type, if its
/// family is one the rule allows. A key that does not exist yet (pinned before an event)
/// has no type, so only a rule that allows one salted family says what it will be;
/// otherwise the key is salted once its first write gives it a type (the coordinator
/// retries pins every tick). Salting it as a counter anyway would make every PFADD, SADD
/// or ZINCRBY on it a command that cannot be merged, each folding the key first.
pub async fn identify(
    backend: &Backend,
    key: &[u8],
    policy: &SaltPolicy,
) -> Result<Kind, SaltError> {
    let t = key_type(backend, key).await?;
    let redis_type = (t != "none").then_some(t.as_str());
    let facts = Facts {
        redis_type,
        hll: redis_type == Some("string") && is_hll(backend, key).await?,
        by_field: policy.by == SaltBy::Field,
    };
    choose(facts, policy)
}

/// `identify` once the facts are known.
fn choose(facts: Facts, policy: &SaltPolicy) -> Result<Kind, SaltError> {
    let families = policy.families;
    let takes = ALL.into_iter().filter(|&k| of(k).takes(facts));
    let Some(t) = facts.redis_type else {
        let mut allowed: Vec<&str> = Vec::new();
        for k in ALL {
            if families.contains(of(k).family()) && !allowed.contains(&of(k).family()) {
                allowed.push(of(k).family());
            }
        }
        let fits: Vec<Kind> = takes
            .filter(|&k| families.contains(of(k).family()))
            .collect();
        return match (&allowed[..], &fits[..]) {
            ([_], [k]) => Ok(*k),
            _ => Err(SaltError::Reply(format!("the key does not exist yet and its rule's write.salt.families is [{}]: it is salted once its first write gives it a type",
                allowed.join(", ")
            ))),
        };
    };
    let Some(kind) = takes.into_iter().next() else {
        return Err(SaltError::Reply(format!("a {t} cannot be salted (counters, hashes of counters, sets, HyperLogLogs and sorted sets only)"
        )));
    };
    let family = of(kind).family();
    if !families.contains(family) {
        return Err(SaltError::Reply(format!(
            "the key holds {family}, and its rule's write.salt.families is [{}]",
            families.names().join(", ")
        )));
    }
    Ok(kind)
}

/// A HyperLogLog is a string that starts with Redis's `HYLL` magic.
async fn is_hll(backend: &Backend, key: &[u8]) -> Result<bool, SaltError> {
    let r = call(
        backend,
        &[(
            backend.node_for(key),
            wire(&[&b"GETRANGE"[..], key, b"0", b"3"]),
        )],
    )
    .await?;
    Ok(matches!(&r[0], Value::Bulk(b) if &b[..] == b"HYLL"))
}

async fn key_type(backend: &Backend, key: &[u8]) -> Result<String, SaltError> {
    let r = call(backend, &[(backend.node_for(key), wire(&[b"TYPE", key]))]).await?;
    match &r[0] {
        Value::Simple(t) => Ok(String::from_utf8_lossy(t).into_owned()),
        v => Err(SaltError::Reply(format!("TYPE failed: {v:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::{Families, FAMILY_NAMES, SALTABLE};

    fn policy(families: &[&str], by_field: bool) -> SaltPolicy {
        SaltPolicy {
            families: Families(
                FAMILY_NAMES
                    .iter()
                    .filter(|(n, _)| families.contains(n))
                    .fold(0, |a, (_, b)| a | b),
            ),
            by: if by_field {
                SaltBy::Field
            } else {
                SaltPolicy::default().by
            },
            ..SaltPolicy::default()
        }
    }

    fn facts(t: Option<&str>, hll: bool, by_field: bool) -> Facts<'_> {
        Facts {
            redis_type: t,
            hll,
            by_field,
        }
    }

    const ALL_FAMILIES: &[&str] = &["counters", "hashes", "sets", "hyperloglogs", "sorted_sets"];

    #[test]
    fn each_type_is_the_kind_that_takes_it() {
        let p = policy(ALL_FAMILIES, false);
        let f = policy(ALL_FAMILIES, true);
        let k = |t, hll, p: &SaltPolicy| choose(facts(Some(t), hll, p.by == SaltBy::Field), p);
        assert_eq!(k("string", false, &p).unwrap(), Kind::String);
        assert_eq!(k("string", true, &p).unwrap(), Kind::Hll);
        assert_eq!(k("hash", false, &p).unwrap(), Kind::Hash);
        assert_eq!(k("hash", false, &f).unwrap(), Kind::Fields);
        assert_eq!(k("set", false, &p).unwrap(), Kind::Set);
        assert_eq!(k("zset", false, &p).unwrap(), Kind::ZSet);
        assert!(k("list", false, &p)
            .unwrap_err()
            .to_string()
            .contains("a list cannot be salted"));
        let only_counters = policy(&["counters"], false);
        assert!(k("set", false, &only_counters)
            .unwrap_err()
            .to_string()
            .contains("the key holds sets"));
    }

    #[test]
    fn a_key_not_there_yet_is_the_one_family_its_rule_allows() {
        let k =
            |fams: &[&str], by_field| choose(facts(None, false, by_field), &policy(fams, by_field));
        assert_eq!(k(&["counters"], false).unwrap(), Kind::String);
        assert_eq!(k(&["hashes"], false).unwrap(), Kind::Hash);
        assert_eq!(k(&["hashes"], true).unwrap(), Kind::Fields);
        assert_eq!(k(&["sets"], false).unwrap(), Kind::Set);
        assert_eq!(k(&["hyperloglogs"], false).unwrap(), Kind::Hll);
        assert_eq!(k(&["sorted_sets"], false).unwrap(), Kind::ZSet);
        let e = k(&["counters", "sets"], false).unwrap_err().to_string();
        assert!(e.contains("is [counters, sets]: it is salted once"), "{e}");
    }

    /// The rules' saltable families are exactly the kinds' (the rules model is a leaf of
    /// the configuration and cannot ask the kinds, so the two lists are checked here).
    #[test]
    fn the_rules_saltable_families_are_the_kinds() {
        let mut kinds: Vec<&str> = ALL.iter().map(|&k| of(k).family()).collect();
        kinds.sort();
        kinds.dedup();
        let mut rules: Vec<&str> = FAMILY_NAMES
            .iter()
            .filter(|(_, b)| SALTABLE & b != 0)
            .map(|(n, _)| *n)
            .collect();
        rules.sort();
        assert_eq!(kinds, rules);
    }
}
