//! The reads of a salted sorted set that are not one round of the session's: ZCARD with
//! the base key not known empty, ranges (ZRANGE and its older forms), ZRANK and
//! ZREVRANK, and every read while a fold may move scores. While the base key is empty,
//! each shard is asked for its own part of the answer only and the parts are merged in
//! order (`plan_range`, `merge_range`, `from_shards`, `rank_from_shards`); otherwise every
//! member is read and ranked (`everything`, `slice`).

use bytes::Bytes;

use std::collections::HashMap;

use super::score::{float, fmt, order, score, scored};
use crate::backend::Backend;
use crate::resp::{parse_i64, Value};
use crate::salt::kind::{bulks, cmd, every, MOp, ZRange};
use crate::salt::merge::READ_WITH_AUX;
use crate::salt::record::unhex;
use crate::salt::{as_i64, call, err, Salted};

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
pub(super) async fn read(
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

pub(super) fn reply(items: Vec<(Bytes, f64)>, scores: bool, resp3: bool) -> Value {
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

/// Applies a range read to every member in rank order.
pub(super) fn slice(all: Vec<(Bytes, f64)>, r: &ZRange) -> Result<Vec<(Bytes, f64)>, Value> {
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

pub(super) fn int(b: &[u8]) -> Result<i64, Value> {
    parse_i64(b).ok_or_else(|| {
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
pub(super) fn one_round(r: &ZRange) -> bool {
    r.by_score || (int(&r.a).is_ok_and(|a| a >= 0) && int(&r.b).is_ok_and(|b| b >= 0))
}

/// The shards' commands of a one-round range read (`one_round`).
pub(super) fn plan_range(e: &Salted, r: &ZRange) -> Vec<(usize, Bytes)> {
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
pub(super) fn merge_range(r: &ZRange, got: &[Value]) -> Result<Value, Value> {
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
pub(super) async fn from_shards(
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
pub(super) async fn rank_from_shards(
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
