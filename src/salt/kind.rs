//! What every salt kind shares and what each one implements: the operations a command on a
//! salted key can be (`Op`, and `MOp` for kinds partitioned by member), and the
//! `SaltKind` trait that each kind in `kinds/` implements (classify, plan, merge, read,
//! move, apply). The engine (this file, `journal`, `merge`, `registry`, the salt table)
//! knows no kind: `kinds::of` is the one place a `Kind` chooses its implementation.
//!
//! Also here: the plan helpers the partitioned kinds share (a command on every part, on a
//! member's shard and the base key, reads in the careful order a fold needs).

use bytes::Bytes;

use super::journal::Claimed;
use super::record::{Move, Record};
use super::{as_i64, call, err, Fut, Salt, SaltError, Salted};
use crate::backend::{wire, Backend};
use crate::command::Classified;
use crate::resp::Value;

/// What a command does to a salted key.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// INCR/INCRBY/DECR/DECRBY (field None) or HINCRBY.
    Write {
        delta: i64,
        field: Option<Bytes>,
    },
    Get,
    HGet(Bytes),
    HMGet(Vec<Bytes>),
    HGetAll,
    /// DEL / UNLINK: every part; 1 if any part existed.
    Del,
    /// EXISTS / TOUCH: 1 if any part exists.
    Exists,
    /// EXPIRE, PEXPIRE, EXPIREAT, PEXPIREAT (with their options), PERSIST: every part.
    Expire,
    /// TTL, PTTL, TYPE: the first part that exists answers.
    FirstExisting,
    /// A command on a set or HyperLogLog salted by member (`members`).
    Member(MOp),
    /// Refused with Redis's own error before anything is sent (an increment that is not
    /// an integer by Redis's rules, such as `+5` or `007`, or one that cannot be negated).
    Reject(&'static str),
    /// Anything else: fold the shards into the base key, then run it there.
    Other,
}

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
    ZRange(ZRange),
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

/// What a key is, as the kinds ask it: its Redis type (None: it does not exist yet),
/// whether a string holds a HyperLogLog, and whether its rule places a hash by field.
#[derive(Clone, Copy, Debug)]
pub struct Facts<'a> {
    pub redis_type: Option<&'a str>,
    pub hll: bool,
    pub by_field: bool,
}

/// One salt kind: how its commands are classified, planned and merged, how the reads
/// that need more than one round are answered, and how a fold moves a shard into the base
/// key (and finishes a journaled move a dead proxy left). The member methods have no
/// work to do for the counters, which merge in `merge`.
pub trait SaltKind: Sync {
    /// What `args` (command name first, the salted key second) does to a key of this
    /// kind; `Op::Other` when it has no merge (the key is folded first, then it runs).
    /// The key commands (DEL, EXPIRE, TTL, ...) are classified before this is asked.
    fn classify(&self, c: &Classified, args: &[Bytes]) -> Op;

    /// Whether member `op` joins the round (its parts are sent at once and merged by
    /// `merge`); the others are answered by a task (`read`). `careful`: a fold may be
    /// moving members. `base_empty`: the base key is known to hold nothing.
    fn inline(&self, _op: &MOp, _careful: bool, _base_empty: bool) -> bool {
        false
    }

    /// The commands of an inline member `op`, in the order `merge` reads their replies.
    fn plan(&self, _e: &Salted, _op: &MOp) -> Vec<(usize, Bytes)> {
        Vec::new()
    }

    /// Merges the replies of an inline member `op` (in `plan`'s order).
    fn merge(&self, _op: &MOp, _r: &[Value]) -> Result<Value, Value> {
        Err(err("internal: this kind has no member commands"))
    }

    /// Answers a member `op` that is not inline (whole reads, reads while a fold runs).
    fn read<'a>(
        &'a self,
        _backend: &'a Backend,
        _e: &'a Salted,
        _op: &'a MOp,
        _careful: bool,
        _resp3: bool,
    ) -> Fut<'a, Result<Value, Value>> {
        Box::pin(async { Err(err("internal: this kind has no member reads")) })
    }

    /// Moves shard `i` into the base key, journaling each step in `c` (see `journal`).
    fn move_shard<'a>(
        &'a self,
        backend: &'a Backend,
        salt: &'a Salt,
        key: &'a [u8],
        c: &'a mut Claimed,
        i: usize,
    ) -> Fut<'a, Result<(), SaltError>>;

    /// Both steps of a journaled move `mv`, each at most once (a re-run changes nothing).
    fn apply<'a>(
        &'a self,
        backend: &'a Backend,
        key: &'a [u8],
        rec: &'a Record,
        mv: &'a Move,
    ) -> Fut<'a, Result<(), SaltError>>;

    /// The family a rule names to let the proxy salt this kind (`write.salt.families`).
    fn family(&self) -> &'static str;

    /// Whether a key with these facts is of this kind (`kinds::identify`).
    fn takes(&self, facts: Facts) -> bool;

    /// Members are placed by a hash of the member, so the shard count cannot change while
    /// the key is salted (it would move every member). Every kind but the counters is.
    fn partitioned(&self) -> bool {
        true
    }

    /// Members the base key holds while the key is salted are spread into their shards in
    /// the background (`fold::spread`), so that whole reads stay one round.
    fn spreads_base(&self) -> bool {
        false
    }

    /// `SALTSHAKER.INCRBY`'s increments with an ID apply to it (`idem`).
    fn idempotent(&self) -> bool {
        false
    }
}

/// Whether `op` is a write (it goes to the shards while writers use them).
pub fn is_write(op: &MOp) -> bool {
    matches!(
        op,
        MOp::SAdd { .. } | MOp::PfAdd(_) | MOp::ZIncrBy { .. } | MOp::HIncrBy { .. }
    )
}

/// Whether `op` only reads: the same command twice in a row answers the same. Removals
/// (SREM, ZREM, HDEL) are not reads even though they place nothing: a second HDEL of a
/// field answers 0.
pub fn only_reads(op: &MOp) -> bool {
    matches!(
        op,
        MOp::SIsMember(_)
            | MOp::SMIsMember(_)
            | MOp::SCard
            | MOp::SMembers
            | MOp::SScan { .. }
            | MOp::SRandMember(_)
            | MOp::PfCount
            | MOp::ZScore(_)
            | MOp::ZMScore(_)
            | MOp::ZCard
            | MOp::ZRange(_)
            | MOp::ZRank(..)
            | MOp::HGetF(_)
            | MOp::HMGetF(_)
            | MOp::HExists(_)
            | MOp::HLen
    )
}

/// The members (elements, fields) a write `op` places; empty for the others.
pub fn written(op: &MOp) -> &[Bytes] {
    match op {
        MOp::SAdd { members, .. } => members,
        MOp::PfAdd(xs) => xs,
        MOp::ZIncrBy { member, .. } => std::slice::from_ref(member),
        MOp::HIncrBy { field, .. } => std::slice::from_ref(field),
        _ => &[],
    }
}

/// Whether `op` must not run while members move (`quiet`): a removal racing a batch being
/// moved could see the member nowhere and then find it moved back.
pub fn needs_quiet(op: &MOp) -> bool {
    matches!(op, MOp::SRem(_) | MOp::ZRem(_) | MOp::HDel(_))
}

impl MOp {
    /// Whether a prepared write goes to the base key (writers do not use the shards now).
    pub fn to_base(&self) -> bool {
        matches!(
            self,
            MOp::SAdd { to_base: true, .. }
                | MOp::ZIncrBy { to_base: true, .. }
                | MOp::HIncrBy { to_base: true, .. }
        )
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

pub fn cmd(parts: &[&[u8]]) -> Bytes {
    wire(parts)
}

/// For each member: the command on its shard, then on the base key.
pub fn pairs(e: &Salted, ms: &[Bytes], c: &[u8]) -> Vec<(usize, Bytes)> {
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

pub fn one(v: &Value) -> bool {
    as_i64(v) == Some(1)
}

/// Sends `cmds` (node, command) and returns the replies in order. With `careful` the base
/// key's commands (`base(i)`) go first, then the shards', then the base key's again, and
/// each base reply is the two merged (`both`): a member a fold moves (shard to base key)
/// or a spread moves (base key to shard) is copied before it is removed, so it is in one
/// of the three reads whichever way it goes.
pub async fn ordered(
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
pub fn both(a: Value, b: Value) -> Value {
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
pub fn every(e: &Salted, name: &[u8]) -> Vec<(usize, Bytes)> {
    (1..e.parts.len())
        .chain([0])
        .map(|p| (e.nodes[p], cmd(&[name, &e.parts[p]])))
        .collect()
}

pub fn bulks(v: &Value) -> Vec<Bytes> {
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
