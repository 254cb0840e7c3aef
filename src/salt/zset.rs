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

use std::cmp::Ordering;
use std::collections::HashMap;

use bytes::Bytes;

use super::fold::{self, Claimed};
use super::members::{bulks, cmd, every, MOp};
use super::merge::err;
use super::names::{applied_name, shard_name, stash_name, Place};
use super::ops::READ_WITH_AUX;
use super::record::{hex, unhex, Move, Record};
use super::{as_i64, call, failpoint, Salt, Salted};
use crate::backend::Backend;
use crate::resp::Value;

/// A range read: by rank (`min`/`max` are start/stop) or by score, as the client gave it.
#[derive(Clone, Debug, PartialEq)]
pub struct ZRange {
    pub by_score: bool,
    pub rev: bool,
    /// For REV by score, the client's first bound is the max: stored here as given.
    pub a: Bytes,
    pub b: Bytes,
    pub limit: Option<(i64, i64)>,
    pub scores: bool,
}

fn float(b: &[u8]) -> Option<f64> {
    let f: f64 = std::str::from_utf8(b).ok()?.parse().ok()?;
    (!f.is_nan()).then_some(f)
}

/// A range read's options after the two bounds (`rest`); None when one has no merge here
/// (BYLEX, a malformed option): the key folds and Redis answers.
fn range(
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
                let n = |j: usize| -> Option<i64> {
                    std::str::from_utf8(rest.get(j)?).ok()?.parse().ok()
                };
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
pub fn classify(name: &str, args: &[Bytes]) -> Option<MOp> {
    let n = args.len();
    let distinct = || {
        let mut seen = std::collections::HashSet::new();
        args[2..]
            .iter()
            .filter(|m| seen.insert(&m[..]))
            .cloned()
            .collect::<Vec<_>>()
    };
    match name {
        "ZINCRBY" if n == 4 && float(&args[2]).is_some_and(f64::is_finite) => Some(MOp::ZIncrBy {
            delta: args[2].clone(),
            member: args[3].clone(),
            to_base: false,
            check: false,
        }),
        "ZSCORE" if n == 3 => Some(MOp::ZScore(args[2].clone())),
        "ZMSCORE" if n >= 3 => Some(MOp::ZMScore(args[2..].to_vec())),
        "ZREM" if n >= 3 => Some(MOp::ZRem(distinct())),
        "ZCARD" if n == 2 => Some(MOp::ZCard),
        "ZRANK" if n == 3 => Some(MOp::ZRank(args[2].clone(), false)),
        "ZREVRANK" if n == 3 => Some(MOp::ZRank(args[2].clone(), true)),
        "ZRANGE" if n >= 4 => range(args, false, false, &args[4..], true).map(MOp::ZRange),
        "ZREVRANGE" if n >= 4 => range(args, false, true, &args[4..], false).map(MOp::ZRange),
        "ZRANGEBYSCORE" if n >= 4 => range(args, true, false, &args[4..], false).map(MOp::ZRange),
        "ZREVRANGEBYSCORE" if n >= 4 => range(args, true, true, &args[4..], false).map(MOp::ZRange),
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

fn score(v: &Value) -> Option<f64> {
    match v {
        Value::Bulk(b) | Value::Double(b) => float(b),
        _ => None,
    }
}

/// A score as Redis writes it: the shortest form that reads back the same.
fn fmt(f: f64) -> Bytes {
    if f.is_infinite() {
        return Bytes::from_static(if f > 0.0 { b"inf" } else { b"-inf" });
    }
    Bytes::from(format!("{f}"))
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

/// Member/score pairs of a WITHSCORES reply in either protocol.
fn scored(v: &Value) -> Vec<(Bytes, f64)> {
    let Value::Array(a) = v else { return vec![] };
    if a.iter().all(|x| matches!(x, Value::Array(_))) {
        return a
            .iter()
            .filter_map(|x| match x {
                Value::Array(p) if p.len() == 2 => match (&p[0], score(&p[1])) {
                    (Value::Bulk(m), Some(s)) => Some((m.clone(), s)),
                    _ => None,
                },
                _ => None,
            })
            .collect();
    }
    a.chunks(2)
        .filter_map(|c| match (&c[0], c.get(1).and_then(score)) {
            (Value::Bulk(m), Some(s)) => Some((m.clone(), s)),
            _ => None,
        })
        .collect()
}

fn order(rev: bool) -> impl Fn(&(Bytes, f64), &(Bytes, f64)) -> Ordering {
    move |x, y| {
        let o =
            x.1.partial_cmp(&y.1)
                .unwrap_or(Ordering::Equal)
                .then_with(|| x.0.cmp(&y.0));
        if rev {
            o.reverse()
        } else {
            o
        }
    }
}

/// Every member with its summed score over all parts, in rank order.
async fn everything(backend: &Backend, e: &Salted, rev: bool) -> Result<Vec<(Bytes, f64)>, Value> {
    let cmds: Vec<(usize, Bytes)> = (0..e.parts.len())
        .map(|p| {
            (
                e.nodes[p],
                cmd(&[b"ZRANGE", &e.parts[p], b"0", b"-1", b"WITHSCORES"]),
            )
        })
        .collect();
    let r = call(backend, &cmds).await.map_err(|m| err(&m))?;
    if let Some(x) = r.iter().find(|v| matches!(v, Value::Error(_))) {
        return Err(x.clone());
    }
    let mut sums: HashMap<Bytes, f64> = HashMap::new();
    for (m, s) in r.iter().flat_map(scored) {
        *sums.entry(m).or_insert(0.0) += s;
    }
    let mut all: Vec<(Bytes, f64)> = sums.into_iter().collect();
    all.sort_by(order(rev));
    Ok(all)
}

/// ZCARD of every part, the base key last.
async fn cards(backend: &Backend, e: &Salted) -> Result<Vec<i64>, Value> {
    let r = call(backend, &every(e, b"ZCARD"))
        .await
        .map_err(|m| err(&m))?;
    r.iter()
        .map(|v| as_i64(v).ok_or_else(|| v.clone()))
        .collect()
}

/// Redis's rank window over `len` members: None when empty.
fn window(start: i64, stop: i64, len: i64) -> Option<(usize, usize)> {
    let norm = |i: i64| if i < 0 { i + len } else { i };
    let (start, stop) = (norm(start).max(0), norm(stop).min(len - 1));
    (start <= stop && start < len).then_some((start as usize, stop as usize))
}

/// A score bound as ZRANGEBYSCORE takes it: `(1.5` is exclusive, `-inf`/`+inf` unbounded.
fn bound(b: &[u8]) -> Option<(f64, bool)> {
    match b.strip_prefix(b"(") {
        Some(rest) => float(rest).map(|f| (f, true)),
        None => float(b).map(|f| (f, false)),
    }
}

fn reply(items: Vec<(Bytes, f64)>, scores: bool, resp3: bool) -> Value {
    Value::Array(
        items
            .into_iter()
            .flat_map(|(m, s)| match (scores, resp3) {
                (false, _) => vec![Value::Bulk(m)],
                (true, false) => vec![Value::Bulk(m), Value::Bulk(fmt(s))],
                (true, true) => vec![Value::Array(vec![Value::Bulk(m), Value::Double(fmt(s))])],
            })
            .collect(),
    )
}

/// Every member with its summed score while a fold may be moving scores: the base key with
/// its applied list first, then each shard with its stash, each part and its bookkeeping
/// read by one script; a stashed amount counts while its move is not applied. As for
/// counters (`ops::careful_read`), a score in transit is then counted exactly once.
async fn everything_careful(
    backend: &Backend,
    e: &Salted,
    rev: bool,
) -> Result<Vec<(Bytes, f64)>, Value> {
    let read = |p: usize| {
        let aux: &[u8] = if p == 0 { b"HKEYS" } else { b"HGETALL" };
        let c = cmd(&[
            b"EVAL",
            READ_WITH_AUX.as_bytes(),
            b"2",
            &e.parts[p],
            &e.aux[p],
            b"ZRANGE",
            aux,
            b"0",
            b"-1",
            b"WITHSCORES",
        ]);
        (e.nodes[p], c)
    };
    let base = call(backend, &[read(0)]).await.map_err(|m| err(&m))?;
    let shards: Vec<_> = (1..e.parts.len()).map(read).collect();
    let shards = call(backend, &shards).await.map_err(|m| err(&m))?;
    let split = |v: &Value| -> Result<(Value, Vec<Bytes>), Value> {
        match v {
            Value::Array(a) if a.len() == 2 => Ok((a[0].clone(), bulks(&a[1]))),
            v => Err(v.clone()),
        }
    };
    let (own, applied) = split(&base[0])?;
    let mut sums: HashMap<Bytes, f64> = HashMap::new();
    for (m, s) in scored(&own) {
        *sums.entry(m).or_insert(0.0) += s;
    }
    for v in &shards {
        let (own, stash) = split(v)?;
        for (m, s) in scored(&own) {
            *sums.entry(m).or_insert(0.0) += s;
        }
        for pair in stash.chunks(2) {
            let (Some(f), Some(amount)) = (pair.first(), pair.get(1).and_then(|a| float(a))) else {
                continue;
            };
            let Some(colon) = f.iter().position(|&c| c == b':') else {
                continue;
            };
            if applied.iter().any(|id| id[..] == f[..colon]) {
                continue;
            }
            let member = std::str::from_utf8(&f[colon + 1..]).ok().and_then(unhex);
            if let Some(m) = member {
                *sums.entry(Bytes::from(m)).or_insert(0.0) += amount;
            }
        }
    }
    let mut all: Vec<(Bytes, f64)> = sums.into_iter().collect();
    all.sort_by(order(rev));
    Ok(all)
}

/// Answers a zset read from every member while a fold may be moving scores.
async fn read_careful(
    backend: &Backend,
    e: &Salted,
    op: &MOp,
    resp3: bool,
) -> Result<Value, Value> {
    let rev = match op {
        MOp::ZRange(r) => r.rev,
        MOp::ZRank(_, rev) => *rev,
        _ => false,
    };
    let all = everything_careful(backend, e, rev).await?;
    let score_of = |m: &Bytes| {
        all.iter()
            .find(|(x, _)| x == m)
            .map_or(Value::Nil, |(_, s)| Value::Bulk(fmt(*s)))
    };
    Ok(match op {
        MOp::ZScore(m) => score_of(m),
        MOp::ZMScore(ms) => Value::Array(ms.iter().map(score_of).collect()),
        MOp::ZCard => Value::Integer(all.len() as i64),
        MOp::ZRange(r) => reply(slice(all, r)?, r.scores, resp3),
        MOp::ZRank(m, _) => all
            .iter()
            .position(|(x, _)| x == m)
            .map_or(Value::Nil, |i| Value::Integer(i as i64)),
        _ => return Err(err("internal: not a sorted-set read")),
    })
}

/// Answers the task zset reads (ZCARD, ranges, ranks; every read while a fold may run).
pub async fn read(
    backend: &Backend,
    e: &Salted,
    op: &MOp,
    careful: bool,
    resp3: bool,
) -> Result<Value, Value> {
    if careful {
        return read_careful(backend, e, op, resp3).await;
    }
    if let MOp::ZRank(m, rev) = op {
        if !e.base_maybe() {
            // The base key is known empty: no need to ask it.
            return rank_from_shards(backend, e, m, *rev).await;
        }
    }
    let c = cards(backend, e).await?;
    let base_empty = c.last() == Some(&0);
    let shards = &c[..c.len() - 1];
    match op {
        MOp::ZCard if base_empty => Ok(Value::Integer(shards.iter().sum())),
        MOp::ZCard => Ok(Value::Integer(
            everything(backend, e, false).await?.len() as i64
        )),
        MOp::ZRange(r) => {
            let items = if base_empty {
                from_shards(backend, e, r, shards.iter().sum()).await?
            } else {
                let all = everything(backend, e, r.rev).await?;
                slice(all, r)?
            };
            Ok(reply(items, r.scores, resp3))
        }
        MOp::ZRank(m, rev) if base_empty => rank_from_shards(backend, e, m, *rev).await,
        MOp::ZRank(m, rev) => {
            let all = everything(backend, e, *rev).await?;
            Ok(all
                .iter()
                .position(|(x, _)| x == m)
                .map_or(Value::Nil, |i| Value::Integer(i as i64)))
        }
        _ => Err(err("internal: not a sorted-set read")),
    }
}

/// Applies a range read to every member in rank order.
fn slice(all: Vec<(Bytes, f64)>, r: &ZRange) -> Result<Vec<(Bytes, f64)>, Value> {
    let bad = || Value::Error(Bytes::from_static(b"ERR min or max is not a float"));
    if !r.by_score {
        let (a, b) = (int(&r.a)?, int(&r.b)?);
        return Ok(match window(a, b, all.len() as i64) {
            Some((s, t)) => all[s..=t].to_vec(),
            None => vec![],
        });
    }
    // REV takes the max first.
    let (lo, hi) = if r.rev { (&r.b, &r.a) } else { (&r.a, &r.b) };
    let (lo, hi) = (bound(lo).ok_or_else(bad)?, bound(hi).ok_or_else(bad)?);
    let inside = |s: f64| {
        (if lo.1 { s > lo.0 } else { s >= lo.0 }) && (if hi.1 { s < hi.0 } else { s <= hi.0 })
    };
    let hits = all.into_iter().filter(|(_, s)| inside(*s));
    Ok(match r.limit {
        Some((off, _)) if off < 0 => vec![],
        Some((off, cnt)) if cnt >= 0 => hits.skip(off as usize).take(cnt as usize).collect(),
        Some((off, _)) => hits.skip(off as usize).collect(),
        None => hits.collect(),
    })
}

fn int(b: &[u8]) -> Result<i64, Value> {
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| {
            Value::Error(Bytes::from_static(
                b"ERR value is not an integer or out of range",
            ))
        })
}

/// The command each shard answers for a range read while the base key is empty (`KEY`
/// left empty): its first `stop + 1` members by rank, or its first `offset + count` by
/// score. Merged in order, the shards' answers hold the window of the whole, since no
/// member is in two shards. None when the window is empty. Rank bounds must not be
/// negative here (`read` resolves them against the size first).
fn shard_range(r: &ZRange) -> Result<Option<Vec<Bytes>>, Value> {
    let s = Bytes::from_static;
    let mut a = vec![s(b"ZRANGE"), Bytes::new()];
    if r.by_score {
        a.extend([r.a.clone(), r.b.clone(), s(b"BYSCORE")]);
        if r.rev {
            a.push(s(b"REV"));
        }
        if let Some((off, cnt)) = r.limit {
            if off < 0 {
                return Ok(None);
            }
            let want = if cnt < 0 { -1 } else { off.saturating_add(cnt) };
            a.extend([s(b"LIMIT"), s(b"0"), Bytes::from(want.to_string())]);
        }
    } else {
        let (start, stop) = (int(&r.a)?, int(&r.b)?);
        if start > stop || stop < 0 {
            return Ok(None);
        }
        a.extend([s(b"0"), Bytes::from(stop.to_string())]);
        if r.rev {
            a.push(s(b"REV"));
        }
    }
    a.push(s(b"WITHSCORES"));
    Ok(Some(a))
}

/// Whether a range read can be answered in one round from the shards alone (given the
/// base key is empty): by score, or by rank with bounds that need no size.
pub fn one_round(r: &ZRange) -> bool {
    r.by_score || (int(&r.a).is_ok_and(|a| a >= 0) && int(&r.b).is_ok_and(|b| b >= 0))
}

/// The shards' commands of a one-round range read (`one_round`).
pub fn plan_range(e: &Salted, r: &ZRange) -> Vec<(usize, Bytes)> {
    let Ok(Some(a)) = shard_range(r) else {
        return vec![];
    };
    (1..e.parts.len())
        .map(|p| {
            let mut a = a.clone();
            a[1] = e.parts[p].clone();
            (e.nodes[p], crate::backend::wire(&a))
        })
        .collect()
}

/// The window of the whole from the shards' answers to `plan_range`.
pub fn merge_range(r: &ZRange, got: &[Value]) -> Result<Value, Value> {
    if let Some(x) = got.iter().find(|v| matches!(v, Value::Error(_))) {
        return Err(x.clone());
    }
    // RESP3 answers WITHSCORES with [member, score] pairs: answer the way the nodes did.
    let resp3 = got.iter().any(
        |v| matches!(v, Value::Array(a) if a.first().is_some_and(|x| matches!(x, Value::Array(_)))),
    );
    let mut all: Vec<(Bytes, f64)> = got.iter().flat_map(scored).collect();
    all.sort_by(order(r.rev));
    Ok(reply(slice(all, r)?, r.scores, resp3))
}

/// A range read while the base key is empty, in a task: rank bounds resolved against the
/// size first, then `plan_range`'s commands.
async fn from_shards(
    backend: &Backend,
    e: &Salted,
    r: &ZRange,
    total: i64,
) -> Result<Vec<(Bytes, f64)>, Value> {
    let mut local = r.clone();
    if !r.by_score {
        let Some((start, stop)) = window(int(&r.a)?, int(&r.b)?, total) else {
            return Ok(vec![]);
        };
        local.a = Bytes::from(start.to_string());
        local.b = Bytes::from(stop.to_string());
    }
    if shard_range(&local)?.is_none() {
        return Ok(vec![]);
    }
    let got = call(backend, &plan_range(e, &local))
        .await
        .map_err(|m| err(&m))?;
    if let Some(x) = got.iter().find(|v| matches!(v, Value::Error(_))) {
        return Err(x.clone());
    }
    let mut all: Vec<(Bytes, f64)> = got.iter().flat_map(scored).collect();
    all.sort_by(order(r.rev));
    slice(all, &local)
}

/// ZRANK/ZREVRANK while the base key is empty: the member's score from its shard, then
/// from every shard the members ranked before it (a lower score, or the same score and a
/// member name before it; the other way round for ZREVRANK).
async fn rank_from_shards(
    backend: &Backend,
    e: &Salted,
    m: &Bytes,
    rev: bool,
) -> Result<Value, Value> {
    let p = e.shard_of(m);
    let r = call(backend, &[(e.nodes[p], cmd(&[b"ZSCORE", &e.parts[p], m]))])
        .await
        .map_err(|x| err(&x))?;
    let Some(s) = score(&r[0]) else {
        return Ok(Value::Nil);
    };
    let at = fmt(s);
    let excl = [&b"("[..], &at].concat();
    let (lo, hi): (&[u8], &[u8]) = if rev {
        (&excl, b"+inf")
    } else {
        (b"-inf", &excl)
    };
    let mut cmds = Vec::new();
    for q in 1..e.parts.len() {
        cmds.push((e.nodes[q], cmd(&[b"ZCOUNT", &e.parts[q], lo, hi])));
        cmds.push((
            e.nodes[q],
            cmd(&[b"ZRANGE", &e.parts[q], &at, &at, b"BYSCORE"]),
        ));
    }
    let got = call(backend, &cmds).await.map_err(|x| err(&x))?;
    let mut rank = 0i64;
    for pair in got.chunks(2) {
        rank += as_i64(&pair[0]).ok_or_else(|| pair[0].clone())?;
        rank += bulks(&pair[1])
            .iter()
            .filter(|x| if rev { *x > m } else { *x < m })
            .count() as i64;
    }
    Ok(Value::Integer(rank))
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
) -> Result<(), String> {
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
            return Err("unreadable ZRANGE reply from a shard".into());
        }
        let mv = Move {
            id: fold::move_id(salt),
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
        fold::journal(backend, key, c, Some(mv.clone())).await?;
        failpoint("fold-after-journal");
        apply(backend, key, &c.rec, &mv).await?;
        fold::journal(backend, key, c, None).await?;
        salt.metrics.fold_moves.inc();
    }
    Ok(())
}

/// Both steps of a journaled sorted-set move, each at most once: take, then add.
pub async fn apply(backend: &Backend, key: &[u8], rec: &Record, mv: &Move) -> Result<(), String> {
    let salt = *rec
        .salts
        .get(mv.shard as usize)
        .ok_or("a journaled move names a shard the record does not have")?;
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
        let m = unhex(h).ok_or("bad member in the journal")?;
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
    fold::take_then_add(backend, &shard, key, wire(&take), wire(&add)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::salt::testing::*;

    fn c(line: &str) -> Option<MOp> {
        let a = args(line);
        classify(std::str::from_utf8(&a[0]).unwrap(), &a)
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
