//! The registry record of one salted key, as every proxy reads it from the backend, and
//! the epoch arithmetic that says which shards writers use at a given instant.
//!
//! A record is JSON in one field of the registry hash (field = the key). It only ever
//! changes by compare-and-set of the whole value, so two proxies never interleave edits.

use serde::{Deserialize, Serialize};

/// What the key holds: a string counter (INCR family), a hash of counters (HINCRBY), a set
/// (SADD), a HyperLogLog (PFADD), a sorted set of scores (ZINCRBY), or a hash of counters
/// placed by field (HINCRBY with `salt.by: field`).
///
/// Counters and hashes are *summed*: any write may go to any shard (round robin), and a
/// read adds the parts up. Sets, HyperLogLogs, sorted sets and field-placed hashes are *partitioned*: a member's shard is
/// calculated from the member (`Salted::shard_of`), so each member lives in one shard, a
/// point read asks one shard (and the base key), and a read of the whole is a union.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    String,
    Hash,
    Set,
    Hll,
    #[serde(rename = "zset")]
    ZSet,
    /// A hash of counters placed by field (`salt.by: field`).
    Fields,
}

/// From `from_ms` on, writers spread over `n` salts: the first `n`, or, when `shards` is
/// not empty, those (indexes into `salts`: a step that moves shards off a master holding
/// two of them, after a slot move or a failover). For a kind partitioned by member the
/// same list is the placement: a member lives in `in_use[member_shard(m, in_use.len())]`
/// (`Record::member_salt`), so a step that replaces one salt of the list moves only that
/// shard's members. `hold` lists shards (indexes into `salts`) whose members are written
/// to the base key during the step instead: a shard being emptied, or one not yet read by
/// every proxy (docs/architecture.md, "Moving a partitioned key's shard").
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    pub from_ms: u64,
    pub n: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hold: Vec<u32>,
}

impl Step {
    /// The salts (indexes into the record's `salts`) writers use in this step.
    pub fn in_use(&self, salts: usize) -> Vec<usize> {
        match self.shards.is_empty() {
            true => (0..(self.n as usize).min(salts)).collect(),
            false => self
                .shards
                .iter()
                .map(|&i| i as usize)
                .filter(|&i| i < salts)
                .collect(),
        }
    }
}

/// One shard's move into the base key, journaled before it starts. `delta` holds
/// `(hex(field), value)`; a string shard has one entry with an empty field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Move {
    pub id: u64,
    pub shard: u32,
    pub delta: Vec<(String, i64)>,
    /// A set's move: hex of the members copied into the base key, then removed from the
    /// shard (`kinds::set::move_set`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<String>,
    /// A sorted set's move: the score of each member in `members` (`kinds::zset::move_zset`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scores: Vec<String>,
    /// A counter or hash move: the shard's time to live when it was read (ms), given to a
    /// base key that has none, so a key with an expiry keeps it through the fold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_ms: Option<i64>,
}

/// The fold journal: who folds, until when its claim holds, and the move in flight.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fold {
    pub owner: String,
    pub lease_until_ms: u64,
    #[serde(default)]
    pub moving: Option<Move>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub kind: Kind,
    /// Shard `i` is named after `salts[i]`. Readers merge every salt listed.
    pub salts: Vec<u32>,
    /// Increasing `from_ms`; N only grows while the key is salted.
    pub steps: Vec<Step>,
    /// The last time any proxy saw the key write-hot (or an SRE promoted it).
    pub hot_ms: u64,
    /// Promoted by an SRE: not demoted for cooling, only by `POST /hotkeys/demote`.
    #[serde(default)]
    pub pinned: bool,
    /// From this instant writers use the base key again; the fold follows.
    #[serde(default)]
    pub demote_ms: Option<u64>,
    #[serde(default)]
    pub fold: Option<Fold>,
    /// The proxy that promoted the key, for the log and /hotkeys.
    pub by: String,
}

/// The first epoch boundary at least one whole epoch after `now_ms`: every proxy resyncs
/// the registry several times per epoch, so all of them know of a change before it applies.
pub fn boundary_after(now_ms: u64, epoch_ms: u64) -> u64 {
    let e = epoch_ms.max(1);
    (now_ms / e + 2) * e
}

impl Record {
    pub fn new(kind: Kind, salts: Vec<u32>, from_ms: u64, now_ms: u64, by: &str) -> Record {
        let n = salts.len() as u32;
        Record {
            kind,
            salts,
            steps: vec![Step {
                from_ms,
                n,
                shards: vec![],
                hold: vec![],
            }],
            hot_ms: now_ms,
            pinned: false,
            demote_ms: None,
            fold: None,
            by: by.to_string(),
        }
    }

    /// How many salts writers use at `now_ms`; None means write the base key (promotion
    /// not yet in force, or demoted).
    pub fn writers(&self, now_ms: u64) -> Option<u32> {
        let s = self.step_at(now_ms)?;
        let n = match s.shards.is_empty() {
            true => s.n.min(self.salts.len() as u32),
            false => s.in_use(self.salts.len()).len() as u32,
        };
        (n > 0).then_some(n)
    }

    /// The step writers follow at `now_ms`; None while they write the base key.
    pub fn step_at(&self, now_ms: u64) -> Option<&Step> {
        if self.demote_ms.is_some_and(|d| now_ms >= d) {
            return None;
        }
        self.steps.iter().rev().find(|s| s.from_ms <= now_ms)
    }

    /// Partitioned kinds: the step whose list places members at `now_ms`. Before the
    /// promotion is in force the first one (writers use the base key, readers already
    /// read the shards), after demotion the last one in force (the fold empties them).
    pub fn placing(&self, now_ms: u64) -> Option<&Step> {
        self.steps
            .iter()
            .rev()
            .find(|s| s.from_ms <= now_ms)
            .or(self.steps.first())
    }

    /// Partitioned kinds: the salt (index into `salts`) that holds `member` at `now_ms`.
    pub fn member_salt(&self, member: &[u8], now_ms: u64) -> usize {
        let n = self.salts.len();
        let Some(step) = self.placing(now_ms) else {
            return member_shard(member, n);
        };
        // On the request path (every member of every member command): no allocation,
        // so not `in_use`, which it equals for any list whose indexes are in `salts`.
        match step.shards.as_slice() {
            [] => member_shard(member, (step.n as usize).min(n)),
            list => match list[member_shard(member, list.len())] as usize {
                i if i < n => i,
                _ => member_shard(member, n),
            },
        }
    }

    /// Whether `newer` differs from this record only by the time the key was last seen hot.
    pub fn heartbeat_of(&self, newer: &Record) -> bool {
        self.hot_ms != newer.hot_ms
            && Record {
                hot_ms: newer.hot_ms,
                ..self.clone()
            } == *newer
    }

    /// Partitioned kinds: whether a write of `member` goes to the base key at `now_ms`
    /// because its shard is held (being emptied, or not yet known to every proxy).
    pub fn held(&self, member: &[u8], now_ms: u64) -> bool {
        self.step_at(now_ms).is_some_and(|s| {
            !s.hold.is_empty() && s.hold.contains(&(self.member_salt(member, now_ms) as u32))
        })
    }

    /// The instant after which no step holds a shard any more (0: none ever did; u64::MAX:
    /// the last step still holds one). Until then other proxies may write the base key.
    pub fn holds_until(&self) -> u64 {
        match self.steps.iter().rposition(|s| !s.hold.is_empty()) {
            None => 0,
            Some(i) => self.steps.get(i + 1).map_or(u64::MAX, |s| s.from_ms),
        }
    }

    /// The shard count writers will use last (for growth decisions).
    pub fn target_n(&self) -> u32 {
        self.steps.last().map_or(0, |s| s.n)
    }

    /// Writers have been off the shards for `grace_ms`: the fold may start.
    pub fn foldable(&self, now_ms: u64, grace_ms: u64) -> bool {
        self.demote_ms
            .is_some_and(|d| now_ms >= d.saturating_add(grace_ms))
    }

    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    pub fn decode(b: &[u8]) -> Option<Record> {
        serde_json::from_slice(b).ok()
    }
}

/// The shard (0-based) that holds `member` of a key partitioned over `n` shards.
pub fn member_shard(member: &[u8], n: usize) -> usize {
    (xxhash_rust::xxh3::xxh3_64(member) % n.max(1) as u64) as usize
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_boundary_is_at_least_one_whole_epoch_ahead() {
        assert_eq!(boundary_after(0, 5000), 10_000);
        assert_eq!(boundary_after(4999, 5000), 10_000);
        assert_eq!(boundary_after(5000, 5000), 15_000);
        for now in [1u64, 777, 12_345, 99_999] {
            let b = boundary_after(now, 1000);
            assert!(b >= now + 1000 && b % 1000 == 0, "{now} -> {b}");
        }
    }

    #[test]
    fn a_heartbeat_is_told_apart_from_a_change_that_moves_writers() {
        let r = Record::new(Kind::ZSet, vec![1, 2], 10_000, 0, "p");
        let beat = Record {
            hot_ms: 20_000,
            ..r.clone()
        };
        assert!(r.heartbeat_of(&beat));
        let mut demoted = beat.clone();
        demoted.demote_ms = Some(30_000);
        assert!(!r.heartbeat_of(&demoted));
        // A pin cancelling the demotion: writers leave the base key at once.
        let mut cancelled = demoted.clone();
        cancelled.demote_ms = None;
        cancelled.pinned = true;
        assert!(!demoted.heartbeat_of(&cancelled));
    }

    #[test]
    fn writers_use_the_base_before_the_promotion_and_after_demotion() {
        let mut r = Record::new(Kind::String, vec![1, 2, 3, 4], 10_000, 0, "p");
        assert_eq!(r.writers(9_999), None);
        assert_eq!(r.writers(10_000), Some(4));
        r.salts.extend([5, 6]);
        r.steps.push(Step {
            from_ms: 20_000,
            n: 6,
            shards: vec![],
            hold: vec![],
        });
        assert_eq!(r.writers(19_999), Some(4));
        assert_eq!(r.writers(20_000), Some(6));
        r.demote_ms = Some(30_000);
        assert_eq!(r.writers(29_999), Some(6));
        assert_eq!(r.writers(30_000), None);
        assert!(!r.foldable(34_999, 5000));
        assert!(r.foldable(35_000, 5000));
    }

    #[test]
    fn a_step_that_replaces_one_shard_moves_only_that_shards_members() {
        let mut r = Record::new(Kind::Set, vec![10, 11, 12], 1000, 0, "p");
        let members: Vec<Vec<u8>> = (0..300).map(|i| format!("m{i}").into_bytes()).collect();
        let before: Vec<usize> = members.iter().map(|m| r.member_salt(m, 1500)).collect();
        // Before the promotion is in force the first step already places members.
        assert_eq!(
            before,
            members
                .iter()
                .map(|m| r.member_salt(m, 0))
                .collect::<Vec<_>>()
        );
        assert!(before.iter().all(|&i| i < 3));
        // Salt 12 (index 2) shares a master: hold it, then replace it by index 3.
        r.salts.push(13);
        r.steps.push(Step {
            from_ms: 2000,
            n: 3,
            shards: vec![0, 1, 2],
            hold: vec![2],
        });
        r.steps.push(Step {
            from_ms: 3000,
            n: 3,
            shards: vec![0, 1, 3],
            hold: vec![3],
        });
        assert_eq!(r.holds_until(), u64::MAX);
        r.steps.push(Step {
            from_ms: 4000,
            n: 3,
            shards: vec![0, 1, 3],
            hold: vec![],
        });
        assert_eq!(r.holds_until(), 4000);
        for (m, &b) in members.iter().zip(&before) {
            assert_eq!(r.member_salt(m, 2500), b);
            assert_eq!(r.held(m, 2500), b == 2, "held while index 2 is emptied");
            assert!(!r.held(m, 1999));
            let after = r.member_salt(m, 3500);
            assert_eq!(
                after,
                if b == 2 { 3 } else { b },
                "only index 2's members move"
            );
            assert_eq!(r.held(m, 3500), b == 2, "index 3 is held for one step");
            assert!(!r.held(m, 4000));
            assert_eq!(r.member_salt(m, 9999), after);
        }
        assert!(before.contains(&2) && before.contains(&0));
        // A demoted key keeps its last placement for the fold, and writes nothing held.
        r.demote_ms = Some(5000);
        assert_eq!(
            r.member_salt(&members[0], 6000),
            r.member_salt(&members[0], 4500)
        );
        assert!(!r.held(&members[0], 6000));
        assert_eq!(Record::decode(r.encode().as_bytes()), Some(r));
    }

    #[test]
    fn records_round_trip_and_garbage_is_refused() {
        let mut r = Record::new(Kind::Hash, vec![7, 9], 5, 1, "proxy-a");
        r.fold = Some(Fold {
            owner: "b".into(),
            lease_until_ms: 3,
            moving: Some(Move {
                id: 42,
                shard: 1,
                delta: vec![(hex(b"f\x00"), -5)],
                members: vec![],
                scores: vec![],
                ttl_ms: None,
            }),
        });
        assert_eq!(Record::decode(r.encode().as_bytes()), Some(r));
        assert_eq!(Record::decode(b"{not json"), None);
        assert_eq!(unhex(&hex(b"\x00\xffab")), Some(b"\x00\xffab".to_vec()));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }
}
