//! Sets salted by member: a member's shard is calculated from the member
//! (`Salted::shard_of`), so members are partitioned across the shards, not copied. The
//! base key stays one more part: it holds what was written before the promotion (and
//! what writers send it after demotion), and every read takes it into account.
//!
//! - SADD goes to the member's shard. While the base key may hold members
//!   (`Salted::base_maybe`), it also asks the base key whether the member is there, so its
//!   reply counts new members exactly as Redis would. An SADD sent to the base key
//!   (promotion not yet in force, demoted) asks the member's shard instead.
//! - Point reads (SISMEMBER, SMISMEMBER) ask the base key and the member's shard; SREM
//!   removes from both.
//! - Whole reads are unions: SMEMBERS, SRANDMEMBER and SSCAN walk every part; SCARD sums
//!   the shards' cardinalities when the base key is empty (the shards are disjoint), and
//!   counts the union of the members otherwise.
//!
//! A fold moves a set shard in batches: each batch is journaled, copied into the base key
//! (SADD) and only then removed from the shard (SREM), so a member is always in at least
//! one part and a re-run after a crash changes nothing twice. Reads while a fold may run
//! read the shards first, then the base key: a member that leaves a shard is in the base
//! key before it leaves. A spread (`fold::spread`) moves base-key members into their
//! shards the same way, the other way round.

use std::collections::HashSet;

use bytes::Bytes;

use crate::backend::Backend;
use crate::command::{Classified, Cmd};
use crate::resp::{parse_i64, Value};
use crate::salt::journal::Claimed;
use crate::salt::kind::{bulks, cmd, every, ordered, pairs, Facts, MOp, Op, SaltKind};
use crate::salt::record::{Move, Record};
use crate::salt::{as_i64, call, err, Fut, Salt, SaltError, Salted};

mod moves;
pub use moves::{apply_set, move_set, spread_batch, SPREAD};

/// What `args` (command first, the key second) does to a salted set; None when the
/// command has no merge (it folds the key first, then runs).
pub fn classify(cmd: Cmd, args: &[Bytes]) -> Option<MOp> {
    let n = args.len();
    let distinct = |from: usize| {
        let mut seen = HashSet::new();
        args[from..]
            .iter()
            .filter(|m| seen.insert(&m[..]))
            .cloned()
            .collect::<Vec<_>>()
    };
    match cmd {
        Cmd::Sadd if n >= 3 => Some(MOp::SAdd {
            members: distinct(2),
            to_base: false,
            check: false,
        }),
        Cmd::Srem if n >= 3 => Some(MOp::SRem(distinct(2))),
        Cmd::Sismember if n == 3 => Some(MOp::SIsMember(args[2].clone())),
        Cmd::Smismember if n >= 3 => Some(MOp::SMIsMember(args[2..].to_vec())),
        Cmd::Scard if n == 2 => Some(MOp::SCard),
        Cmd::Smembers if n == 2 => Some(MOp::SMembers),
        Cmd::Sscan if n >= 3 => Some(MOp::SScan {
            cursor: args[2].clone(),
            rest: args[3..].to_vec(),
        }),
        Cmd::Srandmember if n == 2 => Some(MOp::SRandMember(None)),
        Cmd::Srandmember if n == 3 => parse_i64(&args[2]).map(|c| MOp::SRandMember(Some(c))),
        _ => None,
    }
}

/// Whether a set `op` joins the round (see `SaltKind::inline`).
pub fn inline(op: &MOp, careful: bool, base_empty: bool) -> bool {
    match op {
        MOp::SMembers => !careful,
        MOp::SCard => !careful && base_empty,
        MOp::SAdd { .. } | MOp::SRem(_) => true,
        MOp::SIsMember(_) | MOp::SMIsMember(_) => !careful,
        _ => false,
    }
}

/// The commands of an inline set `op`, in the order `merge` reads their replies.
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
        MOp::SMembers => every(e, b"SMEMBERS"),
        MOp::SCard => every(e, b"SCARD"),
        _ => Vec::new(),
    }
}

fn one(v: &Value) -> bool {
    as_i64(v) == Some(1)
}

/// Merges the replies of an inline set `op` (in `plan`'s order).
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
        MOp::SCard => Value::Integer(r.iter().filter_map(as_i64).sum()),
        _ => return Err(err("internal: not an inline set command")),
    })
}

/// Answers a task set `op` (whole reads, and point reads while a fold may run).
pub async fn read(backend: &Backend, e: &Salted, op: &MOp, careful: bool) -> Result<Value, Value> {
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
        _ => Err(err("internal: not a set read")),
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

/// The set kind.
pub struct Set;

impl SaltKind for Set {
    fn family(&self) -> &'static str {
        "sets"
    }

    fn takes(&self, f: Facts) -> bool {
        matches!(f.redis_type, None | Some("set"))
    }

    fn spreads_base(&self) -> bool {
        true
    }

    fn classify(&self, c: &Classified, args: &[Bytes]) -> Op {
        classify(c.spec.cmd, args).map_or(Op::Other, Op::Member)
    }

    fn inline(&self, op: &MOp, careful: bool, base_empty: bool) -> bool {
        inline(op, careful, base_empty)
    }

    fn plan(&self, e: &Salted, op: &MOp) -> Vec<(usize, Bytes)> {
        plan(e, op)
    }

    fn merge(&self, op: &MOp, r: &[Value]) -> Result<Value, Value> {
        merge(op, r)
    }

    fn read<'a>(
        &'a self,
        backend: &'a Backend,
        e: &'a Salted,
        op: &'a MOp,
        careful: bool,
        _resp3: bool,
    ) -> Fut<'a, Result<Value, Value>> {
        Box::pin(read(backend, e, op, careful))
    }

    fn move_shard<'a>(
        &'a self,
        backend: &'a Backend,
        salt: &'a Salt,
        key: &'a [u8],
        c: &'a mut Claimed,
        i: usize,
    ) -> Fut<'a, Result<(), SaltError>> {
        Box::pin(move_set(backend, salt, key, c, i))
    }

    fn apply<'a>(
        &'a self,
        backend: &'a Backend,
        key: &'a [u8],
        rec: &'a Record,
        mv: &'a Move,
    ) -> Fut<'a, Result<(), SaltError>> {
        Box::pin(apply_set(backend, key, rec, mv))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::salt::testing::*;

    fn c(line: &str) -> Option<MOp> {
        let a = args(line);
        classify(crate::command::classify(&a[..]).unwrap().spec.cmd, &a)
    }

    #[test]
    fn set_commands_have_merges_others_fold() {
        assert_eq!(
            c("SADD k a b a"),
            Some(MOp::SAdd {
                members: vec![b("a"), b("b")],
                to_base: false,
                check: false
            })
        );
        assert_eq!(c("SREM k a a"), Some(MOp::SRem(vec![b("a")])));
        assert_eq!(c("SRANDMEMBER k -3"), Some(MOp::SRandMember(Some(-3))));
        assert_eq!(c("SRANDMEMBER k x"), None);
        assert_eq!(c("SRANDMEMBER k +3"), None, "Redis's integer rules");
        assert_eq!(c("SPOP k"), None);
        assert_eq!(c("PFADD k a"), None, "commands of another type fold");
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
