//! Sets and HyperLogLogs, salted by member: a member's shard is calculated from the member
//! (`Salted::shard_of`), so members are partitioned across the shards, not copied. The
//! base key stays one more part: it holds what was written before the promotion (and
//! what writers send it after demotion), and every read takes it into account.
//!
//! - Writes go to the member's shard: SADD per member, PFADD per shard's elements. While
//!   the base key may hold members (`Salted::base_maybe`), an SADD also asks the base key
//!   whether the member is there, so its reply counts new members exactly as Redis would.
//!   A write sent to the base key (promotion not yet in force, demoted) asks the member's
//!   shard instead.
//! - Point reads (SISMEMBER, SMISMEMBER) ask the base key and the member's shard; SREM
//!   removes from both.
//! - Whole reads are unions: SMEMBERS, SRANDMEMBER and SSCAN walk every part; SCARD sums
//!   the shards' cardinalities when the base key is empty (the shards are disjoint), and
//!   counts the union of the members otherwise; PFCOUNT counts the union of the parts'
//!   registers on the base key's node, which is the estimate the unsalted key would give.
//!
//! A fold moves a set shard in batches: each batch is journaled, copied into the base key
//! (SADD) and only then removed from the shard (SREM), so a member is always in at least
//! one part and a re-run after a crash changes nothing twice. A HyperLogLog shard is
//! merged into the base key (PFMERGE, which is idempotent) and deleted only if it did not
//! change meanwhile. Reads while a fold may run read the shards first, then the base key:
//! a member that leaves a shard is in the base key before it leaves.

use std::collections::HashSet;

use bytes::Bytes;

use super::fold::{self, Claimed};
use super::merge::err;
use super::names::{on_node, shard_name, Place};
use super::record::{hex, unhex, Kind, Move};
use super::{as_i64, call, failpoint, fields, zset, Salt, Salted};
use crate::backend::{wire, Backend};
use crate::resp::Value;

/// A command on a salted set or HyperLogLog.
#[derive(Clone, Debug, PartialEq)]
pub enum MOp {
    /// SADD of distinct members, to their shards or (`to_base`) to the base key; `check`
    /// asks the other part (base key or shard) whether each member is already there.
    SAdd {
        members: Vec<Bytes>,
        to_base: bool,
        check: bool,
    },
    /// SREM of distinct members: from the base key and from each member's shard.
    SRem(Vec<Bytes>),
    SIsMember(Bytes),
    SMIsMember(Vec<Bytes>),
    SCard,
    SMembers,
    /// SSCAN: the client's cursor and the arguments after it (MATCH, COUNT).
    SScan {
        cursor: Bytes,
        rest: Vec<Bytes>,
    },
    /// SRANDMEMBER with its count, if any.
    SRandMember(Option<i64>),
    /// PFADD of at least one element.
    PfAdd(Vec<Bytes>),
    PfCount,
    /// ZINCRBY, to the member's shard or (`to_base`) the base key; `check` reads the
    /// member's score in the other part, so the reply is the sum.
    ZIncrBy {
        delta: Bytes,
        member: Bytes,
        to_base: bool,
        check: bool,
    },
    ZScore(Bytes),
    ZMScore(Vec<Bytes>),
    /// ZREM of distinct members: from the base key and each member's shard.
    ZRem(Vec<Bytes>),
    ZCard,
    ZRange(super::zset::ZRange),
    /// ZRANK (false) or ZREVRANK (true).
    ZRank(Bytes, bool),
    /// HINCRBY on a hash placed by field (`fields`), to the field's shard or the base key;
    /// `check` reads the field in the other part, so the reply is the whole value.
    HIncrBy {
        field: Bytes,
        delta: Bytes,
        to_base: bool,
        check: bool,
    },
    HGetF(Bytes),
    HMGetF(Vec<Bytes>),
    HExists(Bytes),
    /// HDEL of distinct fields: from the base key and each field's shard.
    HDel(Vec<Bytes>),
    HLen,
}

/// What `args` (command first, the key second) does to a salted key of `kind`; None when
/// the command has no merge (it folds the key first, then runs).
pub fn classify(kind: Kind, name: &str, args: &[Bytes]) -> Option<MOp> {
    let n = args.len();
    let distinct = |from: usize| {
        let mut seen = HashSet::new();
        args[from..]
            .iter()
            .filter(|m| seen.insert(&m[..]))
            .cloned()
            .collect::<Vec<_>>()
    };
    match (kind, name) {
        (Kind::Set, "SADD") if n >= 3 => Some(MOp::SAdd {
            members: distinct(2),
            to_base: false,
            check: false,
        }),
        (Kind::Set, "SREM") if n >= 3 => Some(MOp::SRem(distinct(2))),
        (Kind::Set, "SISMEMBER") if n == 3 => Some(MOp::SIsMember(args[2].clone())),
        (Kind::Set, "SMISMEMBER") if n >= 3 => Some(MOp::SMIsMember(args[2..].to_vec())),
        (Kind::Set, "SCARD") if n == 2 => Some(MOp::SCard),
        (Kind::Set, "SMEMBERS") if n == 2 => Some(MOp::SMembers),
        (Kind::Set, "SSCAN") if n >= 3 => Some(MOp::SScan {
            cursor: args[2].clone(),
            rest: args[3..].to_vec(),
        }),
        (Kind::Set, "SRANDMEMBER") if n == 2 => Some(MOp::SRandMember(None)),
        (Kind::Set, "SRANDMEMBER") if n == 3 => std::str::from_utf8(&args[2])
            .ok()
            .and_then(|c| c.parse().ok())
            .map(|c| MOp::SRandMember(Some(c))),
        (Kind::Hll, "PFADD") if n >= 3 => Some(MOp::PfAdd(args[2..].to_vec())),
        (Kind::Hll, "PFCOUNT") if n == 2 => Some(MOp::PfCount),
        (Kind::ZSet, name) => zset::classify(name, args),
        (Kind::Fields, name) => fields::classify(name, args),
        _ => None,
    }
}

/// Whether `op` is a write (it goes to the shards while writers use them).
pub fn is_write(op: &MOp) -> bool {
    matches!(
        op,
        MOp::SAdd { .. } | MOp::PfAdd(_) | MOp::ZIncrBy { .. } | MOp::HIncrBy { .. }
    )
}

/// Whether `op` joins the round (its parts are sent at once and merged by `merge`); the
/// others are answered by a task (`read`), which may read in order or in two rounds.
/// `careful`: a fold may be moving members, so point reads go shards first.
/// `base_empty`: the base key is known empty, so sizes add up over the shards and a range
/// is the shards' answers merged (a task checks the base key first otherwise).
pub fn inline(op: &MOp, careful: bool, base_empty: bool) -> bool {
    match op {
        MOp::SMembers => !careful,
        MOp::SCard | MOp::ZCard | MOp::HLen | MOp::PfCount => !careful && base_empty,
        MOp::ZRange(r) => !careful && base_empty && zset::one_round(r),
        MOp::SAdd { .. } | MOp::PfAdd(_) | MOp::SRem(_) | MOp::ZIncrBy { .. } => true,
        MOp::SIsMember(_) | MOp::SMIsMember(_) | MOp::ZScore(_) | MOp::ZMScore(_) => !careful,
        MOp::ZRem(_) | MOp::HIncrBy { .. } | MOp::HDel(_) => true,
        MOp::HGetF(_) | MOp::HMGetF(_) | MOp::HExists(_) => !careful,
        _ => false,
    }
}

/// Whether `op` must not run while members move (`quiet`): a removal racing a batch being
/// moved could see the member nowhere and then find it moved back.
pub fn needs_quiet(op: &MOp) -> bool {
    matches!(op, MOp::SRem(_) | MOp::ZRem(_) | MOp::HDel(_))
}

/// Runs a removal once no fold or spread holds the key (and this proxy's view of the
/// registry is fresh, so it would know of one starting: a claim is announced three ticks
/// before anything moves). Waits up to ten seconds; the removal is then made on the base
/// key and the member's shard as usual, or on the key alone if it is no longer salted.
pub async fn quiet(backend: &Backend, salt: &Salt, key: &Bytes, op: &MOp, args: &[Bytes]) -> Value {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let table = salt.table.load();
        let now = super::now_ms();
        match table.get(key) {
            None => {
                return call(
                    backend,
                    &[(backend.node_for(key), crate::backend::wire(args))],
                )
                .await
                .map(|mut r| r.remove(0))
                .unwrap_or_else(|m| err(&m));
            }
            Some(e) if e.rec.fold.is_none() && !salt.stale(now) => {
                return match call(backend, &plan(e, op)).await {
                    Ok(r) => merge(op, &r).unwrap_or_else(|v| v),
                    Err(m) => err(&m),
                };
            }
            Some(_) if std::time::Instant::now() >= end => {
                return err("the salted key has been moving members for ten seconds; try again");
            }
            Some(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
        }
    }
}

/// An SADD set up for where writers go now: `to_base` when they use the base key, and a
/// check of the other part when the member could already be there.
pub fn prepare(op: MOp, e: &Salted, to_base: bool, careful: bool) -> MOp {
    match op {
        MOp::SAdd { members, .. } => MOp::SAdd {
            members,
            to_base,
            check: to_base || careful || e.base_maybe(),
        },
        MOp::ZIncrBy { delta, member, .. } => MOp::ZIncrBy {
            delta,
            member,
            to_base,
            check: to_base || careful || e.base_maybe(),
        },
        MOp::HIncrBy { field, delta, .. } => MOp::HIncrBy {
            field,
            delta,
            to_base,
            check: to_base || careful || e.base_maybe(),
        },
        op => op,
    }
}

pub(super) fn cmd(parts: &[&[u8]]) -> Bytes {
    wire(parts)
}

/// The commands of an inline `op`, in the order `merge` reads their replies.
pub fn plan(e: &Salted, op: &MOp) -> Vec<(usize, Bytes)> {
    let on = |part: usize, c: &[u8], m: &[u8]| (e.nodes[part], cmd(&[c, &e.parts[part], m]));
    match op {
        MOp::SAdd {
            members,
            to_base,
            check,
        } => {
            let target = |m: &[u8]| if *to_base { 0 } else { e.shard_of(m) };
            let other = |m: &[u8]| if *to_base { e.shard_of(m) } else { 0 };
            let mut out: Vec<_> = members.iter().map(|m| on(target(m), b"SADD", m)).collect();
            if *check {
                out.extend(members.iter().map(|m| on(other(m), b"SISMEMBER", m)));
            }
            out
        }
        MOp::SRem(ms) => pairs(e, ms, b"SREM"),
        MOp::SIsMember(m) => pairs(e, std::slice::from_ref(m), b"SISMEMBER"),
        MOp::SMIsMember(ms) => pairs(e, ms, b"SISMEMBER"),
        MOp::PfAdd(elems) => {
            let mut by: Vec<Vec<&[u8]>> = vec![Vec::new(); e.parts.len()];
            for x in elems {
                by[e.shard_of(x)].push(x);
            }
            by.into_iter()
                .enumerate()
                .filter(|(_, xs)| !xs.is_empty())
                .map(|(p, xs)| {
                    let mut a: Vec<&[u8]> = vec![b"PFADD", &e.parts[p]];
                    a.extend(xs);
                    (e.nodes[p], cmd(&a))
                })
                .collect()
        }
        MOp::HIncrBy { .. } | MOp::HGetF(_) | MOp::HMGetF(_) | MOp::HExists(_) | MOp::HDel(_) => {
            fields::plan(e, op)
        }
        MOp::SMembers => every(e, b"SMEMBERS"),
        MOp::SCard => every(e, b"SCARD"),
        MOp::ZCard => every(e, b"ZCARD"),
        MOp::HLen => every(e, b"HLEN"),
        // With the base key empty, the shards' counts add up (their elements are disjoint):
        // each within the HyperLogLog's error, as the unsalted key's count is.
        MOp::PfCount => every(e, b"PFCOUNT"),
        MOp::ZRange(r) => zset::plan_range(e, r),
        op => zset::plan(e, op),
    }
}

/// For each member: the command on its shard, then on the base key.
pub(super) fn pairs(e: &Salted, ms: &[Bytes], c: &[u8]) -> Vec<(usize, Bytes)> {
    ms.iter()
        .flat_map(|m| {
            let p = e.shard_of(m);
            [
                (e.nodes[p], cmd(&[c, &e.parts[p], m])),
                (e.nodes[0], cmd(&[c, &e.parts[0], m])),
            ]
        })
        .collect()
}

fn one(v: &Value) -> bool {
    as_i64(v) == Some(1)
}

/// Merges the replies of an inline `op` (in `plan`'s order).
pub fn merge(op: &MOp, r: &[Value]) -> Result<Value, Value> {
    if let Some(e) = r.iter().find(|v| matches!(v, Value::Error(_))) {
        return Err(e.clone());
    }
    let either = |i: usize| one(&r[2 * i]) || one(&r[2 * i + 1]);
    Ok(match op {
        MOp::SAdd { members, check, .. } => {
            let k = members.len();
            let new = (0..k)
                .filter(|&i| one(&r[i]) && !(*check && one(&r[k + i])))
                .count();
            Value::Integer(new as i64)
        }
        MOp::SRem(ms) => Value::Integer((0..ms.len()).filter(|&i| either(i)).count() as i64),
        MOp::SIsMember(_) => Value::Integer(either(0) as i64),
        MOp::SMIsMember(ms) => Value::Array(
            (0..ms.len())
                .map(|i| Value::Integer(either(i) as i64))
                .collect(),
        ),
        MOp::PfAdd(_) => Value::Integer(r.iter().any(one) as i64),
        MOp::HIncrBy { .. } | MOp::HGetF(_) | MOp::HMGetF(_) | MOp::HExists(_) | MOp::HDel(_) => {
            return fields::merge(op, r)
        }
        MOp::SMembers => {
            let mut seen = HashSet::new();
            Value::Set(
                r.iter()
                    .flat_map(bulks)
                    .filter(|m| seen.insert(m.clone()))
                    .map(Value::Bulk)
                    .collect(),
            )
        }
        MOp::SCard | MOp::ZCard | MOp::HLen | MOp::PfCount => {
            Value::Integer(r.iter().filter_map(as_i64).sum())
        }
        MOp::ZRange(range) => return zset::merge_range(range, r),
        op => return zset::merge(op, r),
    })
}

/// Sends `cmds` (node, command) and returns the replies in order. With `careful` the base
/// key's commands (`base(i)`) go first, then the shards', then the base key's again, and
/// each base reply is the two merged (`both`): a member a fold moves (shard to base key)
/// or a spread moves (base key to shard) is copied before it is removed, so it is in one
/// of the three reads whichever way it goes.
async fn ordered(
    backend: &Backend,
    cmds: &[(usize, Bytes)],
    base: impl Fn(usize) -> bool,
    careful: bool,
) -> Result<Vec<Value>, Value> {
    if !careful {
        return call(backend, cmds).await.map_err(|m| err(&m));
    }
    let (shards, bases): (Vec<usize>, Vec<usize>) = (0..cmds.len()).partition(|&i| !base(i));
    let mut out = vec![Value::Nil; cmds.len()];
    for group in [&bases, &shards, &bases] {
        let sent: Vec<_> = group.iter().map(|&i| cmds[i].clone()).collect();
        for (&i, v) in group
            .iter()
            .zip(call(backend, &sent).await.map_err(|m| err(&m))?)
        {
            out[i] = both(std::mem::replace(&mut out[i], Value::Nil), v);
        }
    }
    Ok(out)
}

/// Two reads of one part as one: members of either, the larger count, an error if any.
fn both(a: Value, b: Value) -> Value {
    match (a, b) {
        (Value::Nil, b) => b,
        (e @ Value::Error(_), _) | (_, e @ Value::Error(_)) => e,
        (Value::Array(mut x) | Value::Set(mut x), Value::Array(y) | Value::Set(y)) => {
            x.extend(y);
            Value::Array(x)
        }
        (Value::Integer(x), Value::Integer(y)) => Value::Integer(x.max(y)),
        (a, _) => a,
    }
}

/// `name` on every part, the base key last.
pub(super) fn every(e: &Salted, name: &[u8]) -> Vec<(usize, Bytes)> {
    (1..e.parts.len())
        .chain([0])
        .map(|p| (e.nodes[p], cmd(&[name, &e.parts[p]])))
        .collect()
}

pub(super) fn bulks(v: &Value) -> Vec<Bytes> {
    match v {
        Value::Array(a) | Value::Set(a) => a
            .iter()
            .filter_map(|x| match x {
                Value::Bulk(b) => Some(b.clone()),
                _ => None,
            })
            .collect(),
        _ => vec![],
    }
}

/// The union of every part's members, shards first.
async fn union(backend: &Backend, e: &Salted, careful: bool) -> Result<Vec<Bytes>, Value> {
    let last = e.parts.len() - 1;
    let r = ordered(backend, &every(e, b"SMEMBERS"), |i| i == last, careful).await?;
    if let Some(x) = r.iter().find(|v| matches!(v, Value::Error(_))) {
        return Err(x.clone());
    }
    let mut seen = HashSet::new();
    Ok(r.iter()
        .flat_map(bulks)
        .filter(|m| seen.insert(m.clone()))
        .collect())
}

/// Answers a task `op` (whole reads, and point reads while a fold may run).
pub async fn read(
    backend: &Backend,
    e: &Salted,
    op: &MOp,
    careful: bool,
    resp3: bool,
) -> Result<Value, Value> {
    match op {
        MOp::SIsMember(_) | MOp::SMIsMember(_) => {
            // `pairs`: each member's shard, then the base key.
            let r = ordered(backend, &plan(e, op), |i| i % 2 == 1, careful).await?;
            merge(op, &r)
        }
        MOp::SCard => {
            let last = e.parts.len() - 1;
            let cards = ordered(backend, &every(e, b"SCARD"), |i| i == last, careful).await?;
            if let Some(x) = cards.iter().find(|v| matches!(v, Value::Error(_))) {
                return Err(x.clone());
            }
            let base = cards.last().and_then(as_i64).unwrap_or(0);
            if base == 0 {
                // The shards hold disjoint members: their sizes add up.
                return Ok(Value::Integer(cards.iter().filter_map(as_i64).sum()));
            }
            Ok(Value::Integer(
                union(backend, e, careful).await?.len() as i64
            ))
        }
        MOp::SMembers => Ok(Value::Set(
            union(backend, e, careful)
                .await?
                .into_iter()
                .map(Value::Bulk)
                .collect(),
        )),
        MOp::SRandMember(count) => {
            let all = union(backend, e, careful).await?;
            Ok(random_members(&all, *count))
        }
        MOp::SScan { cursor, rest } => sscan(backend, e, cursor, rest).await,
        MOp::PfCount => pfcount(backend, e).await,
        MOp::HExists(f) if careful => {
            let args = [Bytes::from_static(b"HGET"), e.key.clone(), f.clone()];
            let v = super::ops::careful(backend, e, super::ops::Op::HGet(f.clone()), &args).await;
            match v {
                Value::Error(_) => Err(v),
                Value::Nil => Ok(Value::Integer(0)),
                _ => Ok(Value::Integer(1)),
            }
        }
        MOp::HLen if careful => {
            let args = [Bytes::from_static(b"HGETALL"), e.key.clone()];
            match super::ops::careful(backend, e, super::ops::Op::HGetAll, &args).await {
                Value::Map(m) => Ok(Value::Integer(m.len() as i64)),
                v => Err(v),
            }
        }
        MOp::HLen => fields::hlen(backend, e).await,
        op => zset::read(backend, e, op, careful, resp3).await,
    }
}

/// SRANDMEMBER over the union: one member (or nil), `count` distinct members, or with a
/// negative count that many draws with repetition, as Redis answers.
fn random_members(all: &[Bytes], count: Option<i64>) -> Value {
    let pick = |n: usize| (crate::backend::placement::next_random() as usize) % n;
    match count {
        None if all.is_empty() => Value::Nil,
        None => Value::Bulk(all[pick(all.len())].clone()),
        Some(c) if c >= 0 => {
            let mut v = all.to_vec();
            let want = (c as usize).min(v.len());
            for i in 0..want {
                let j = i + pick(v.len() - i);
                v.swap(i, j);
            }
            v.truncate(want);
            Value::Array(v.into_iter().map(Value::Bulk).collect())
        }
        Some(c) => {
            if all.is_empty() {
                return Value::Array(vec![]);
            }
            let n = c.unsigned_abs().min(1 << 20) as usize;
            Value::Array(
                (0..n)
                    .map(|_| Value::Bulk(all[pick(all.len())].clone()))
                    .collect(),
            )
        }
    }
}

/// SSCAN over the parts in turn: the base key, every shard, the base key again. The
/// cursor carries the place in that order and the part's own cursor, `inner * places +
/// place`. A member moved during the scan is copied before it is removed, by a fold
/// (shard to base key) or a spread (base key to shard), so it is in one of the walks, and a
/// member present throughout is returned, as SCAN promises (duplicates are allowed).
async fn sscan(
    backend: &Backend,
    e: &Salted,
    cursor: &Bytes,
    rest: &[Bytes],
) -> Result<Value, Value> {
    let bad = || Value::Error(Bytes::from_static(b"ERR invalid cursor"));
    let c: u64 = std::str::from_utf8(cursor)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(bad)?;
    let places = e.parts.len() as u64 + 1;
    let (inner, place) = (c / places, (c % places) as usize);
    let part = if place + 1 == places as usize {
        0
    } else {
        place
    };
    let mut a: Vec<&[u8]> = vec![b"SSCAN", &e.parts[part]];
    let inner_s = inner.to_string();
    a.push(inner_s.as_bytes());
    a.extend(rest.iter().map(|x| &x[..]));
    let r = call(backend, &[(e.nodes[part], cmd(&a))])
        .await
        .map_err(|m| err(&m))?;
    let Value::Array(items) = &r[0] else {
        return Err(r[0].clone());
    };
    let next: u64 = items
        .first()
        .and_then(as_i64)
        .map(|x| x as u64)
        .or_else(|| match items.first() {
            Some(Value::Bulk(b)) => std::str::from_utf8(b).ok()?.parse().ok(),
            _ => None,
        })
        .ok_or_else(|| err("unreadable SSCAN reply"))?;
    let out = if next != 0 {
        next.checked_mul(places)
            .and_then(|x| x.checked_add(place as u64))
            .ok_or_else(|| err("SSCAN cursor too large to carry the part"))?
    } else if place + 1 < places as usize {
        place as u64 + 1
    } else {
        0
    };
    let members = items.get(1).cloned().unwrap_or(Value::Array(vec![]));
    Ok(Value::Array(vec![
        Value::Bulk(Bytes::from(out.to_string())),
        members,
    ]))
}

/// Counts the union of the shards' registers and the base key's on the base key's node.
/// KEYS: the base key, then one scratch key per shard value. ARGV: the shard values.
/// The scratch keys are written and deleted inside the script, so no one sees them.
const PFCOUNT_UNION: &str = r#"
for i = 1, #ARGV do redis.call('SET', KEYS[i + 1], ARGV[i]) end
local ok, c = pcall(redis.call, 'PFCOUNT', unpack(KEYS))
for i = 1, #ARGV do redis.call('DEL', KEYS[i + 1]) end
if not ok then return c end
return c
"#;

/// Scratch keys on the base key's node for the PFCOUNT union.
fn scratch(backend: &Backend, key: &[u8], n: usize) -> Vec<Bytes> {
    let node = backend.node_of(key);
    (0..n)
        .map(|i| on_node(backend as &dyn Place, node, &format!("u:{i}"), key))
        .collect()
}

/// PFCOUNT: the shards' registers (read first), counted together with the base key's.
async fn pfcount(backend: &Backend, e: &Salted) -> Result<Value, Value> {
    let gets: Vec<(usize, Bytes)> = (1..e.parts.len())
        .map(|p| (e.nodes[p], cmd(&[b"GET", &e.parts[p]])))
        .collect();
    let vals = call(backend, &gets).await.map_err(|m| err(&m))?;
    let mut raws = Vec::new();
    for v in vals {
        match v {
            Value::Bulk(b) => raws.push(b),
            Value::Nil => {}
            v => return Err(v),
        }
    }
    let base = &e.parts[0];
    let c = if raws.is_empty() {
        cmd(&[b"PFCOUNT", base])
    } else {
        let keys = scratch(backend, base, raws.len());
        let n = (1 + keys.len()).to_string();
        let mut a: Vec<&[u8]> = vec![b"EVAL", PFCOUNT_UNION.as_bytes(), n.as_bytes(), base];
        a.extend(keys.iter().map(|k| &k[..]));
        a.extend(raws.iter().map(|r| &r[..]));
        cmd(&a)
    };
    let r = call(backend, &[(e.nodes[0], c)])
        .await
        .map_err(|m| err(&m))?;
    match &r[0] {
        Value::Integer(_) => Ok(r[0].clone()),
        v => Err(v.clone()),
    }
}

/// Gives every part of a partitioned key the key's expiry: a shard created by a write after
/// an EXPIRE has none (a member write cannot tell that it created its shard, as a counter
/// write can), so the coordinator, ten times an epoch, sets the longest expiry any part has
/// on the parts that have none. Until then a new shard outlives the key by at most a tick.
pub async fn align_expiry(backend: &Backend, e: &Salted) {
    let cmds: Vec<(usize, Bytes)> = (0..e.parts.len())
        .map(|p| (e.nodes[p], cmd(&[b"PTTL", &e.parts[p]])))
        .collect();
    let Ok(ttls) = call(backend, &cmds).await else {
        return;
    };
    let ttls: Vec<i64> = ttls.iter().map(|v| as_i64(v).unwrap_or(-2)).collect();
    let Some(ms) = ttls.iter().copied().filter(|&t| t > 0).max() else {
        return;
    };
    let fix: Vec<(usize, Bytes)> = ttls
        .iter()
        .enumerate()
        .filter(|(_, &t)| t == -1)
        .map(|(p, _)| {
            let ms = ms.to_string();
            (e.nodes[p], cmd(&[b"PEXPIRE", &e.parts[p], ms.as_bytes()]))
        })
        .collect();
    if !fix.is_empty() {
        let _ = call(backend, &fix).await;
    }
}

/// The `shard` of a journaled move that spreads base-key members into their shards.
pub const SPREAD: u32 = u32::MAX;

/// Moves a set's base-key members (written before it was salted) into their shards, so
/// writes stop asking the base key and sizes are sums again. Holds the key's fold slot (so
/// readers read carefully and removals wait), announces it and waits three ticks as a live
/// fold does, then moves journaled batches: copy into the shards (SADD), then remove from
/// the base key (SREM), each step idempotent. Started by the coordinator when it finds a
/// salted set's base key not empty; `salt.spreading` keeps it to one at a time per key.
pub async fn spread(backend: &Backend, salt: &Salt, key: Bytes) {
    match spread_set(backend, salt, &key).await {
        Ok(0) => {}
        Ok(n) => {
            tracing::info!(key = %String::from_utf8_lossy(&key), members = n, "moved a salted set's base-key members into its shards")
        }
        Err(e) => {
            tracing::debug!(key = %String::from_utf8_lossy(&key), error = %e, "base-key members not moved into shards now")
        }
    }
    salt.spreading
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&key);
}

async fn spread_set(backend: &Backend, salt: &Salt, key: &[u8]) -> Result<usize, String> {
    let Some(mut c) = fold::claim(backend, salt, key).await? else {
        return Ok(0);
    };
    if c.rec.kind != Kind::Set || c.rec.demote_ms.is_some() {
        fold::release(backend, key, c).await?;
        return Ok(0);
    }
    super::registry::announce(backend, key).await;
    tokio::time::sleep(std::time::Duration::from_millis(3 * salt.tick_ms())).await;
    let node = backend.node_of(key);
    let mut moved = 0;
    for _ in 0..100_000 {
        let r = call(
            backend,
            &[(node, cmd(&[b"SSCAN", key, b"0", b"COUNT", b"256"]))],
        )
        .await?;
        let mut members: Vec<String> = match &r[0] {
            Value::Array(a) if a.len() == 2 => bulks(&a[1]).iter().map(|m| hex(m)).collect(),
            v => return Err(format!("unexpected SSCAN reply from the base key: {v:?}")),
        };
        if members.is_empty() {
            let n = call(backend, &[(node, cmd(&[b"SCARD", key]))]).await?;
            if as_i64(&n[0]).unwrap_or(0) == 0 {
                break;
            }
            let r = call(backend, &[(node, cmd(&[b"SRANDMEMBER", key, b"64"]))]).await?;
            members = bulks(&r[0]).iter().map(|m| hex(m)).collect();
        }
        moved += members.len();
        let mv = Move {
            id: fold::move_id(salt),
            shard: SPREAD,
            delta: vec![],
            members,
            scores: vec![],
            ttl_ms: None,
        };
        fold::journal(backend, key, &mut c, Some(mv.clone())).await?;
        apply_spread(backend, key, &c.rec, &mv).await?;
        fold::journal(backend, key, &mut c, None).await?;
    }
    fold::release(backend, key, c).await?;
    Ok(moved)
}

/// A journaled spread batch, safe to run again: copy each member into its shard, then
/// remove the batch from the base key.
async fn apply_spread(
    backend: &Backend,
    key: &[u8],
    rec: &super::record::Record,
    mv: &Move,
) -> Result<(), String> {
    let members: Vec<Vec<u8>> = mv
        .members
        .iter()
        .map(|h| unhex(h).ok_or("bad member in the journal"))
        .collect::<Result<_, _>>()?;
    let mut by: Vec<Vec<&[u8]>> = vec![Vec::new(); rec.salts.len()];
    for m in &members {
        by[super::member_shard(m, rec.salts.len())].push(m);
    }
    let adds: Vec<(usize, Bytes)> = by
        .iter()
        .enumerate()
        .filter(|(_, ms)| !ms.is_empty())
        .map(|(i, ms)| {
            let shard = shard_name(key, rec.salts[i], backend.tag());
            let mut a: Vec<&[u8]> = vec![b"SADD", &shard];
            a.extend(ms.iter().copied());
            (backend.node_of(&shard), cmd(&a))
        })
        .collect();
    let mut rem: Vec<&[u8]> = vec![b"SREM", key];
    rem.extend(members.iter().map(|m| &m[..]));
    fold::steps(
        backend,
        vec![
            (adds, "spread-after-add"),
            (
                vec![(backend.node_of(key), cmd(&rem))],
                "spread-after-remove",
            ),
        ],
    )
    .await
}

/// Most members journaled in one fold move (their total size is also bounded): the
/// journal rides in the registry record, which every proxy reads each tick.
const MOVE_MEMBERS: usize = 256;
const MOVE_BYTES: usize = 16 * 1024;

/// Moves set shard `i` into the base key, batch by batch (see the module notes).
pub async fn move_set(
    backend: &Backend,
    salt: &Salt,
    key: &[u8],
    c: &mut Claimed,
    i: usize,
) -> Result<(), String> {
    let shard = shard_name(key, c.rec.salts[i], backend.tag());
    let node = backend.node_of(&shard);
    // Each batch empties part of the shard; a shard written as fast as it is moved is
    // left for the next pass rather than chased forever.
    for _ in 0..10_000 {
        let count = MOVE_MEMBERS.to_string();
        let r = call(
            backend,
            &[(
                node,
                cmd(&[b"SSCAN", &shard, b"0", b"COUNT", count.as_bytes()]),
            )],
        )
        .await?;
        let page = match &r[0] {
            Value::Array(a) if a.len() == 2 => bulks(&a[1]),
            v => return Err(format!("unexpected SSCAN reply from a shard: {v:?}")),
        };
        let mut members = Vec::new();
        let mut bytes = 0;
        for m in page {
            if members.len() >= MOVE_MEMBERS || bytes >= MOVE_BYTES {
                break;
            }
            bytes += m.len();
            members.push(hex(&m));
        }
        if members.is_empty() {
            // SSCAN may return an empty first page of a non-empty set: ask directly.
            let n = call(backend, &[(node, cmd(&[b"SCARD", &shard]))]).await?;
            if as_i64(&n[0]).unwrap_or(0) == 0 {
                return Ok(());
            }
            let r = call(backend, &[(node, cmd(&[b"SRANDMEMBER", &shard, b"64"]))]).await?;
            members = bulks(&r[0]).iter().map(|m| hex(m)).collect();
        }
        let mv = Move {
            id: fold::move_id(salt),
            shard: i as u32,
            delta: vec![],
            members,
            scores: vec![],
            ttl_ms: None,
        };
        fold::journal(backend, key, c, Some(mv.clone())).await?;
        failpoint("fold-after-journal");
        apply_set(backend, key, &c.rec, &mv).await?;
        fold::journal(backend, key, c, None).await?;
        salt.metrics.fold_moves.inc();
    }
    Ok(())
}

/// A journaled set move, safe to run again: copy into the base key, then remove from the
/// shard.
pub async fn apply_set(
    backend: &Backend,
    key: &[u8],
    rec: &super::record::Record,
    mv: &Move,
) -> Result<(), String> {
    if mv.shard == SPREAD {
        return apply_spread(backend, key, rec, mv).await;
    }
    let salt = *rec
        .salts
        .get(mv.shard as usize)
        .ok_or("a journaled move names a shard the record does not have")?;
    let shard = shard_name(key, salt, backend.tag());
    let members: Vec<Vec<u8>> = mv
        .members
        .iter()
        .map(|h| unhex(h).ok_or("bad member in the journal"))
        .collect::<Result<_, _>>()?;
    let with = |name: &[u8], target: &[u8]| {
        let mut a: Vec<&[u8]> = vec![name, target];
        a.extend(members.iter().map(|m| &m[..]));
        cmd(&a)
    };
    fold::steps(
        backend,
        vec![
            (
                vec![(backend.node_of(key), with(b"SADD", key))],
                "fold-after-add",
            ),
            (
                vec![(backend.node_of(&shard), with(b"SREM", &shard))],
                "fold-after-take",
            ),
        ],
    )
    .await
}

/// Merges a HyperLogLog shard's registers into the base key. KEYS: base key, scratch key.
/// ARGV: the shard's value.
const MERGE_HLL: &str = r#"
redis.call('SET', KEYS[2], ARGV[1])
local ok, e = pcall(redis.call, 'PFMERGE', KEYS[1], KEYS[2])
redis.call('DEL', KEYS[2])
if not ok then return e end
return 1
"#;

/// Deletes a shard if it still holds `ARGV[1]`. KEYS: the shard.
const DEL_IF_SAME: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) return 1 end
return 0
"#;

/// Moves HyperLogLog shard `i` into the base key: merge its registers (idempotent), then
/// delete it if no PFADD changed it meanwhile (else the next pass merges it again).
pub async fn move_hll(
    backend: &Backend,
    salt: &Salt,
    key: &[u8],
    c: &Claimed,
    i: usize,
) -> Result<(), String> {
    let shard = shard_name(key, c.rec.salts[i], backend.tag());
    let node = backend.node_of(&shard);
    let r = call(backend, &[(node, cmd(&[b"GET", &shard]))]).await?;
    let raw = match &r[0] {
        Value::Nil => return Ok(()),
        Value::Bulk(b) => b.clone(),
        v => return Err(format!("unexpected GET reply from a shard: {v:?}")),
    };
    let tmp = scratch(backend, key, 1).remove(0);
    let merge = cmd(&[b"EVAL", MERGE_HLL.as_bytes(), b"2", key, &tmp, &raw]);
    let r = call(backend, &[(backend.node_of(key), merge)]).await?;
    if let Value::Error(e) = &r[0] {
        return Err(format!("fold merge failed: {}", String::from_utf8_lossy(e)));
    }
    failpoint("fold-after-add");
    let del = cmd(&[b"EVAL", DEL_IF_SAME.as_bytes(), b"1", &shard, &raw]);
    call(backend, &[(node, del)]).await?;
    salt.metrics.fold_moves.inc();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::salt::testing::*;

    fn c(kind: Kind, line: &str) -> Option<MOp> {
        let a = args(line);
        classify(kind, std::str::from_utf8(&a[0]).unwrap(), &a)
    }

    #[test]
    fn set_and_hll_commands_have_merges_others_fold() {
        assert_eq!(
            c(Kind::Set, "SADD k a b a"),
            Some(MOp::SAdd {
                members: vec![b("a"), b("b")],
                to_base: false,
                check: false
            })
        );
        assert_eq!(c(Kind::Set, "SREM k a a"), Some(MOp::SRem(vec![b("a")])));
        assert_eq!(
            c(Kind::Set, "SRANDMEMBER k -3"),
            Some(MOp::SRandMember(Some(-3)))
        );
        assert_eq!(c(Kind::Set, "SRANDMEMBER k x"), None);
        assert_eq!(c(Kind::Set, "SPOP k"), None);
        assert_eq!(
            c(Kind::Set, "PFADD k a"),
            None,
            "commands of another type fold"
        );
        assert_eq!(
            c(Kind::Hll, "PFADD k a b"),
            Some(MOp::PfAdd(vec![b("a"), b("b")]))
        );
        assert_eq!(c(Kind::Hll, "PFADD k"), None);
        assert_eq!(c(Kind::Hll, "PFCOUNT k"), Some(MOp::PfCount));
        assert_eq!(c(Kind::String, "SADD k a"), None);
    }

    #[test]
    fn replies_count_a_member_once_across_base_and_shard() {
        let i = Value::Integer;
        let sadd = MOp::SAdd {
            members: vec![b("a"), b("b"), b("c")],
            to_base: false,
            check: true,
        };
        // a new in its shard and not in the base key; b new in its shard but in the base
        // key already; c in its shard already.
        let r = [i(1), i(1), i(0), i(0), i(1), i(0)];
        assert_eq!(merge(&sadd, &r).unwrap(), i(1));
        let srem = MOp::SRem(vec![b("a"), b("b"), b("c")]);
        let r = [i(1), i(0), i(0), i(1), i(0), i(0)];
        assert_eq!(merge(&srem, &r).unwrap(), i(2));
        let mis = MOp::SMIsMember(vec![b("a"), b("b")]);
        assert_eq!(
            merge(&mis, &[i(0), i(1), i(0), i(0)]).unwrap(),
            Value::Array(vec![i(1), i(0)])
        );
        let e = Value::Error(b("WRONGTYPE x"));
        assert_eq!(merge(&srem, &[i(1), e.clone()]), Err(e));
    }

    #[test]
    fn random_members_follow_the_count_rules() {
        let all: Vec<Bytes> = (0..10).map(|x| b(&x.to_string())).collect();
        let Value::Array(v) = random_members(&all, Some(4)) else {
            panic!()
        };
        let distinct: HashSet<_> = v.iter().map(|x| format!("{x:?}")).collect();
        assert_eq!((v.len(), distinct.len()), (4, 4));
        let Value::Array(v) = random_members(&all, Some(50)) else {
            panic!()
        };
        assert_eq!(v.len(), 10);
        let Value::Array(v) = random_members(&all[..1], Some(-5)) else {
            panic!()
        };
        assert_eq!(v.len(), 5);
        assert_eq!(random_members(&[], None), Value::Nil);
    }
}
