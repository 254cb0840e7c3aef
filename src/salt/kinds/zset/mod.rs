//! Sorted sets salted by member, for the live leaderboard: ZINCRBY goes to the member's
//! shard, and a member's score is the sum of its scores in the base key and its shard
//! (the base key holds what was written before the promotion). Scores only ever add up
//! on a salted sorted set: ZADD, which replaces a score, folds the key first and runs on
//! the whole, like every command without a merge.
//!
//! - ZSCORE, ZMSCORE: the member's shard and the base key, summed. ZREM: both parts.
//! - ZCARD: the shards' sizes add up while the base key is empty (the shards hold disjoint
//!   members); otherwise the union of members is counted.
//! - ZRANGE (by rank or by score, REV, LIMIT, WITHSCORES), ZREVRANGE, ZRANGEBYSCORE,
//!   ZREVRANGEBYSCORE, ZRANK, ZREVRANK: while the base key is empty, each shard is asked
//!   for its own part of the answer only (a top-10 read asks each shard for its top 10;
//!   a rank counts the members before the member's score on each shard) and the parts are
//!   merged in order; otherwise every part is read whole and the sums are ranked here.
//!
//! Reads and removals wait while a fold may move members (they fold the key first): a
//! member's score is in transit between two nodes during a move. The fold moves batches
//! with the counters' journal: take the scores out of the shard (ZINCRBY by minus the
//! score, removing a member that reaches 0) and add them to the base key, each step at
//! most once per move id. Scores are doubles, so a score's move is exact for integer
//! scores (the leaderboard case) and for any score no increment lands on meanwhile.

use bytes::Bytes;

use crate::backend::Backend;
use crate::command::{Classified, Cmd};
use crate::resp::{parse_i64, Value};
use crate::salt::journal::{self, Claimed};
use crate::salt::kind::{bulks, cmd, every, Facts, MOp, Op, SaltKind, ZRange};
use crate::salt::names::{applied_name, shard_name, stash_name, Place};
use crate::salt::record::{hex, unhex, Move, Record};
use crate::salt::{as_i64, call, err, failpoint, Fut, Salt, SaltError, Salted};
use read::plan_range;
use score::{float, fmt, score, scored};

mod read;
mod score;

/// A range read's options after the two bounds (`rest`); None when one has no merge here
/// (BYLEX, a malformed option): the key folds and Redis answers.
fn options(
    args: &[Bytes],
    by_score: bool,
    rev: bool,
    rest: &[Bytes],
    zrange: bool,
) -> Option<ZRange> {
    let mut r = ZRange {
        by_score,
        rev,
        a: args[2].clone(),
        b: args[3].clone(),
        limit: None,
        scores: false,
    };
    let mut i = 0;
    while i < rest.len() {
        let o = rest[i].to_ascii_uppercase();
        match &o[..] {
            b"WITHSCORES" => r.scores = true,
            b"BYSCORE" if zrange => r.by_score = true,
            b"REV" if zrange => r.rev = true,
            b"LIMIT" => {
                let n = |j: usize| -> Option<i64> { parse_i64(rest.get(j)?) };
                r.limit = Some((n(i + 1)?, n(i + 2)?));
                i += 2;
            }
            _ => return None,
        }
        i += 1;
    }
    if r.limit.is_some() && !r.by_score {
        return None;
    }
    Some(r)
}

/// What `args` does to a salted sorted set; None: fold first, then run.
pub fn classify(cmd: Cmd, args: &[Bytes]) -> Option<MOp> {
    let n = args.len();
    let distinct = || {
        let mut seen = std::collections::HashSet::new();
        args[2..]
            .iter()
            .filter(|m| seen.insert(&m[..]))
            .cloned()
            .collect::<Vec<_>>()
    };
    match cmd {
        Cmd::Zincrby if n == 4 && float(&args[2]).is_some_and(f64::is_finite) => {
            Some(MOp::ZIncrBy {
                delta: args[2].clone(),
                member: args[3].clone(),
                to_base: false,
                check: false,
            })
        }
        Cmd::Zscore if n == 3 => Some(MOp::ZScore(args[2].clone())),
        Cmd::Zmscore if n >= 3 => Some(MOp::ZMScore(args[2..].to_vec())),
        Cmd::Zrem if n >= 3 => Some(MOp::ZRem(distinct())),
        Cmd::Zcard if n == 2 => Some(MOp::ZCard),
        Cmd::Zrank if n == 3 => Some(MOp::ZRank(args[2].clone(), false)),
        Cmd::Zrevrank if n == 3 => Some(MOp::ZRank(args[2].clone(), true)),
        Cmd::Zrange if n >= 4 => options(args, false, false, &args[4..], true).map(MOp::ZRange),
        Cmd::Zrevrange if n >= 4 => options(args, false, true, &args[4..], false).map(MOp::ZRange),
        Cmd::Zrangebyscore if n >= 4 => {
            options(args, true, false, &args[4..], false).map(MOp::ZRange)
        }
        Cmd::Zrevrangebyscore if n >= 4 => {
            options(args, true, true, &args[4..], false).map(MOp::ZRange)
        }
        _ => None,
    }
}

/// The commands of an inline zset `op`, in the order `merge` reads them.
pub fn plan(e: &Salted, op: &MOp) -> Vec<(usize, Bytes)> {
    let pair = |m: &Bytes, c: &[u8]| {
        let p = e.shard_of(m);
        [
            (e.nodes[p], cmd(&[c, &e.parts[p], m])),
            (e.nodes[0], cmd(&[c, &e.parts[0], m])),
        ]
    };
    match op {
        MOp::ZIncrBy {
            delta,
            member,
            to_base,
            check,
        } => {
            let (t, o) = if *to_base {
                (0, e.shard_of(member))
            } else {
                (e.shard_of(member), 0)
            };
            let mut out = vec![(e.nodes[t], cmd(&[b"ZINCRBY", &e.parts[t], delta, member]))];
            if *check {
                out.push((e.nodes[o], cmd(&[b"ZSCORE", &e.parts[o], member])));
            }
            out
        }
        MOp::ZScore(m) => pair(m, b"ZSCORE").to_vec(),
        MOp::ZMScore(ms) | MOp::ZRem(ms) => {
            let c: &[u8] = if matches!(op, MOp::ZRem(_)) {
                b"ZREM"
            } else {
                b"ZSCORE"
            };
            ms.iter().flat_map(|m| pair(m, c)).collect()
        }
        _ => vec![],
    }
}

/// The sum of the present scores among `vs`; the reply itself when only one is present.
fn sum(vs: &[&Value]) -> Value {
    let present: Vec<&&Value> = vs.iter().filter(|v| score(v).is_some()).collect();
    match present.len() {
        0 => Value::Nil,
        1 => (*present[0]).clone(),
        _ => {
            let f: f64 = present.iter().filter_map(|v| score(v)).sum();
            match present[0] {
                Value::Double(_) => Value::Double(fmt(f)),
                _ => Value::Bulk(fmt(f)),
            }
        }
    }
}

/// Merges the replies of an inline zset `op`.
pub fn merge(op: &MOp, r: &[Value]) -> Result<Value, Value> {
    if let Some(e) = r.iter().find(|v| matches!(v, Value::Error(_))) {
        return Err(e.clone());
    }
    Ok(match op {
        MOp::ZIncrBy { check: false, .. } => r[0].clone(),
        MOp::ZIncrBy { .. } => sum(&[&r[0], &r[1]]),
        MOp::ZScore(_) => sum(&[&r[0], &r[1]]),
        MOp::ZMScore(ms) => Value::Array(
            (0..ms.len())
                .map(|i| sum(&[&r[2 * i], &r[2 * i + 1]]))
                .collect(),
        ),
        MOp::ZRem(ms) => Value::Integer(
            (0..ms.len())
                .filter(|&i| as_i64(&r[2 * i]) == Some(1) || as_i64(&r[2 * i + 1]) == Some(1))
                .count() as i64,
        ),
        _ => return Err(err("internal: not an inline sorted-set command")),
    })
}

/// Takes a journaled batch of scores out of a shard once, noting each amount in the stash
/// (`id:hex(member)`), where a careful read finds it until the add is applied. KEYS: stash,
/// shard. ARGV: the move id, then per member: member, minus its score, hex(member), score.
const TAKE_ONCE: &str = r#"
if redis.call('HSETNX', KEYS[1], ARGV[1], '1') == 0 then return 0 end
for i = 2, #ARGV, 4 do
  redis.call('HSET', KEYS[1], ARGV[1] .. ':' .. ARGV[i + 2], ARGV[i + 3])
  local n = redis.call('ZINCRBY', KEYS[2], ARGV[i + 1], ARGV[i])
  if tonumber(n) == 0 then redis.call('ZREM', KEYS[2], ARGV[i]) end
end
redis.call('EXPIRE', KEYS[1], 3600)
return 1
"#;

/// Adds a journaled batch of scores to the base key once. KEYS: applied list, base key.
/// ARGV: the move id, then per member: member, score.
const ADD_ONCE: &str = r#"
if redis.call('HSETNX', KEYS[1], ARGV[1], '1') == 0 then return 0 end
for i = 2, #ARGV, 2 do redis.call('ZINCRBY', KEYS[2], ARGV[i + 1], ARGV[i]) end
redis.call('EXPIRE', KEYS[1], 3600)
return 1
"#;

/// Moves sorted-set shard `i` into the base key, a journaled batch at a time.
pub async fn move_zset(
    backend: &Backend,
    salt: &Salt,
    key: &[u8],
    c: &mut Claimed,
    i: usize,
) -> Result<(), SaltError> {
    let shard = shard_name(key, c.rec.salts[i], backend.tag());
    let node = backend.node_of(&shard);
    for _ in 0..10_000 {
        let r = call(
            backend,
            &[(node, cmd(&[b"ZRANGE", &shard, b"0", b"255", b"WITHSCORES"]))],
        )
        .await?;
        let batch = scored(&r[0]);
        if batch.is_empty() {
            if bulks(&r[0]).is_empty() {
                return Ok(());
            }
            return Err(SaltError::Reply(
                "unreadable ZRANGE reply from a shard".into(),
            ));
        }
        let mv = Move {
            id: journal::move_id(salt),
            shard: i as u32,
            delta: vec![],
            members: batch.iter().map(|(m, _)| hex(m)).collect(),
            scores: batch
                .iter()
                .map(|(_, s)| fmt(*s))
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .collect(),
            ttl_ms: None,
        };
        journal::journal(backend, key, c, Some(mv.clone())).await?;
        failpoint("fold-after-journal").await;
        apply(backend, key, &c.rec, &mv).await?;
        journal::journal(backend, key, c, None).await?;
        salt.metrics.fold_moves.inc();
    }
    Ok(())
}

/// Both steps of a journaled sorted-set move, each at most once: take, then add.
pub async fn apply(
    backend: &Backend,
    key: &[u8],
    rec: &Record,
    mv: &Move,
) -> Result<(), SaltError> {
    let salt = *rec.salts.get(mv.shard as usize).ok_or(SaltError::Journal(
        "a journaled move names a shard the record does not have".into(),
    ))?;
    let shard = shard_name(key, salt, backend.tag());
    let id = mv.id.to_string();
    let stash = stash_name(backend, key, salt);
    let applied = applied_name(backend, key);
    let mut take: Vec<Vec<u8>> = vec![
        b"EVAL".to_vec(),
        TAKE_ONCE.into(),
        b"2".to_vec(),
        stash.to_vec(),
        shard.to_vec(),
        id.clone().into(),
    ];
    let mut add: Vec<Vec<u8>> = vec![
        b"EVAL".to_vec(),
        ADD_ONCE.into(),
        b"2".to_vec(),
        applied.to_vec(),
        key.to_vec(),
        id.into(),
    ];
    for (h, s) in mv.members.iter().zip(&mv.scores) {
        let m = unhex(h).ok_or(SaltError::Journal("bad member in the journal".into()))?;
        let neg = match s.strip_prefix('-') {
            Some(pos) => pos.to_string(),
            None => format!("-{s}"),
        };
        take.extend([
            m.clone(),
            neg.into_bytes(),
            h.clone().into_bytes(),
            s.clone().into_bytes(),
        ]);
        add.extend([m, s.clone().into_bytes()]);
    }
    let wire = |a: &[Vec<u8>]| crate::backend::wire(a);
    journal::take_then_add(backend, &shard, key, wire(&take), wire(&add)).await
}

/// The sorted-set kind.
pub struct ZSet;

impl SaltKind for ZSet {
    fn family(&self) -> &'static str {
        "sorted_sets"
    }

    fn takes(&self, f: Facts) -> bool {
        matches!(f.redis_type, None | Some("zset"))
    }

    fn classify(&self, c: &Classified, args: &[Bytes]) -> Op {
        classify(c.spec.cmd, args).map_or(Op::Other, Op::Member)
    }

    fn inline(&self, op: &MOp, careful: bool, base_empty: bool) -> bool {
        match op {
            MOp::ZCard => !careful && base_empty,
            MOp::ZRange(r) => !careful && base_empty && read::one_round(r),
            MOp::ZIncrBy { .. } | MOp::ZRem(_) => true,
            MOp::ZScore(_) | MOp::ZMScore(_) => !careful,
            _ => false,
        }
    }

    fn plan(&self, e: &Salted, op: &MOp) -> Vec<(usize, Bytes)> {
        match op {
            MOp::ZCard => every(e, b"ZCARD"),
            MOp::ZRange(r) => plan_range(e, r),
            op => plan(e, op),
        }
    }

    fn merge(&self, op: &MOp, r: &[Value]) -> Result<Value, Value> {
        if let Some(e) = r.iter().find(|v| matches!(v, Value::Error(_))) {
            return Err(e.clone());
        }
        match op {
            MOp::ZCard => Ok(Value::Integer(r.iter().filter_map(as_i64).sum())),
            MOp::ZRange(range) => read::merge_range(range, r),
            op => merge(op, r),
        }
    }

    fn read<'a>(
        &'a self,
        backend: &'a Backend,
        e: &'a Salted,
        op: &'a MOp,
        careful: bool,
        resp3: bool,
    ) -> Fut<'a, Result<Value, Value>> {
        Box::pin(read::read(backend, e, op, careful, resp3))
    }

    fn move_shard<'a>(
        &'a self,
        backend: &'a Backend,
        salt: &'a Salt,
        key: &'a [u8],
        c: &'a mut Claimed,
        i: usize,
    ) -> Fut<'a, Result<(), SaltError>> {
        Box::pin(move_zset(backend, salt, key, c, i))
    }

    fn apply<'a>(
        &'a self,
        backend: &'a Backend,
        key: &'a [u8],
        rec: &'a Record,
        mv: &'a Move,
    ) -> Fut<'a, Result<(), SaltError>> {
        Box::pin(apply(backend, key, rec, mv))
    }
}

#[cfg(test)]
mod tests {
    use super::read::slice;
    use super::*;
    use crate::salt::testing::*;

    fn c(line: &str) -> Option<MOp> {
        let a = args(line);
        classify(crate::command::classify(&a[..]).unwrap().spec.cmd, &a)
    }

    #[test]
    fn leaderboard_commands_have_merges_and_replacing_a_score_folds() {
        assert!(matches!(c("ZINCRBY k 2.5 m"), Some(MOp::ZIncrBy { .. })));
        assert_eq!(c("ZINCRBY k x m"), None);
        assert_eq!(c("ZADD k 1 m"), None);
        let Some(MOp::ZRange(r)) = c("ZRANGE k 5 (9 BYSCORE REV LIMIT 0 3 WITHSCORES") else {
            panic!()
        };
        assert!(r.by_score && r.rev && r.scores && r.limit == Some((0, 3)));
        assert_eq!(c("ZRANGE k a b BYLEX"), None);
        assert_eq!(c("ZRANGE k 0 1 LIMIT 0 1"), None, "LIMIT needs BYSCORE");
        assert_eq!(c("ZREVRANGE k 0 1 REV"), None);
    }

    #[test]
    fn windows_and_bounds_follow_redis() {
        let all: Vec<(Bytes, f64)> = (0..5).map(|i| (b(&format!("m{i}")), i as f64)).collect();
        let r = |a: &str, b_: &str, by_score, rev, limit| ZRange {
            by_score,
            rev,
            a: b(a),
            b: b(b_),
            limit,
            scores: false,
        };
        let names = |v: Vec<(Bytes, f64)>| {
            v.into_iter()
                .map(|(m, _)| String::from_utf8(m.to_vec()).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(slice(all.clone(), &r("-2", "-1", false, false, None)).unwrap()),
            ["m3", "m4"]
        );
        assert!(slice(all.clone(), &r("3", "1", false, false, None))
            .unwrap()
            .is_empty());
        assert_eq!(
            names(slice(all.clone(), &r("(1", "3", true, false, None)).unwrap()),
            ["m2", "m3"]
        );
        assert_eq!(
            names(slice(all.clone(), &r("-inf", "+inf", true, false, Some((1, 2)))).unwrap()),
            ["m1", "m2"]
        );
        assert!(slice(all, &r("x", "1", true, false, None)).is_err());
        assert_eq!(fmt(3.0), b("3"));
        assert_eq!(fmt(2.5), b("2.5"));
        assert_eq!(
            sum(&[&Value::Bulk(b("1.5")), &Value::Nil]),
            Value::Bulk(b("1.5"))
        );
        assert_eq!(
            sum(&[&Value::Bulk(b("1.5")), &Value::Bulk(b("2"))]),
            Value::Bulk(b("3.5"))
        );
    }
}
