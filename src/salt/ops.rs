//! One command on a salted key: a counter write goes to one shard and is answered with an
//! estimate of the whole; the reads and key commands that can be merged run on the base
//! key and every shard in one pipelined round per node and are merged exactly.
//!
//! Pure parts (`classify`, `plan`; `merge` merges the replies) serve the session, which puts
//! the part commands in its round; `multi` answers multi-key commands over salted keys.
//! What cannot be merged (`Op::Other`) is not handled here: the session moves the shards
//! into the base key first (`fold::move_all`) and then forwards the command unchanged.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::members::{self, MOp};
use super::merge::{err, merge};
use super::record::Kind;
use super::{as_i64, call, SaltTable, Salted};
use crate::backend::{wire, Backend};
use crate::mitigate::combine::Combiner;
use crate::resp::{Proto, Value};

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

/// What `args` (command name first, the salted key second) does to a salted key of `kind`.
pub fn classify(kind: Kind, name: &str, args: &[Bytes]) -> Op {
    if kind == Kind::Fields && name == "HGETALL" && args.len() == 2 {
        return Op::HGetAll;
    }
    if kind.partitioned() {
        return match key_command(name, args.len()) {
            Some(op) => op,
            None => members::classify(kind, name, args).map_or(Op::Other, Op::Member),
        };
    }
    // Redis checks the increment before it looks at the key, with string2ll's rules.
    let int = |i: usize| -> Option<i64> { crate::resp::parse_i64(args.get(i)?) };
    let n = args.len();
    let write = |delta: Option<i64>, field: Option<Bytes>| match delta {
        Some(delta) => Op::Write { delta, field },
        None => Op::Reject(NOT_AN_INTEGER),
    };
    match (name, n) {
        ("INCR", 2) => write(Some(1), None),
        ("DECR", 2) => write(Some(-1), None),
        ("INCRBY", 3) => write(int(2), None),
        ("DECRBY", 3) => match int(2) {
            Some(d) => d
                .checked_neg()
                .map_or(Op::Reject("ERR decrement would overflow"), |delta| {
                    write(Some(delta), None)
                }),
            None => Op::Reject(NOT_AN_INTEGER),
        },
        ("HINCRBY", 4) => write(int(3), Some(args[2].clone())),
        ("GET", 2) => Op::Get,
        ("HGET", 3) => Op::HGet(args[2].clone()),
        ("HMGET", n) if n >= 3 => Op::HMGet(args[2..].to_vec()),
        ("HGETALL", 2) => Op::HGetAll,
        _ => key_command(name, n).unwrap_or(Op::Other),
    }
}

/// Redis's reply to an increment that is not an integer.
const NOT_AN_INTEGER: &str = "ERR value is not an integer or out of range";

/// A shard write is safe while the whole stays this far from i64's bounds: no sum of parts
/// can then overflow. Beyond it (a huge increment, or a total known to be near the bound),
/// the key is folded and the base key's node decides exactly, with Redis's own error.
pub const SAFE_TOTAL: i64 = 1 << 62;

/// Whether a shard write of `delta` keeps the whole (last known `total`) safe.
pub fn write_fits(total: i64, delta: i64) -> bool {
    total.unsigned_abs().saturating_add(delta.unsigned_abs()) < SAFE_TOTAL as u64
}

/// The commands on the key itself, whatever it holds: they act on every part.
fn key_command(name: &str, n: usize) -> Option<Op> {
    Some(match (name, n) {
        ("DEL" | "UNLINK", 2) => Op::Del,
        ("EXISTS" | "TOUCH", 2) => Op::Exists,
        ("EXPIRE" | "PEXPIRE" | "EXPIREAT" | "PEXPIREAT", n) if n >= 3 => Op::Expire,
        ("PERSIST", 2) => Op::Expire,
        ("TTL" | "PTTL" | "TYPE", 2) => Op::FirstExisting,
        _ => return None,
    })
}

/// The command `args` with its key (position 1) replaced by `part`.
fn on(args: &[Bytes], part: &Bytes) -> Bytes {
    let mut a = args.to_vec();
    a[1] = part.clone();
    wire(&a)
}

/// Combining for shard writes (salt+combine): the combiner and its window.
pub type CombineWith = Option<(Arc<Combiner>, Duration)>;

/// A shard just created takes the expiry the key's other parts have, so the key expires
/// as one.
pub async fn inherit_expiry(backend: &Backend, e: &Salted, part: usize) {
    let cmds: Vec<(usize, Bytes)> = e
        .parts
        .iter()
        .zip(&e.nodes)
        .enumerate()
        .filter(|(i, _)| *i != part)
        .map(|(_, (p, &n))| (n, wire(&[&b"PTTL"[..], p])))
        .collect();
    let Ok(ttls) = call(backend, &cmds).await else {
        return;
    };
    if let Some(ms) = ttls.iter().filter_map(as_i64).filter(|&t| t > 0).max() {
        let cmd = wire(&[&b"PEXPIRE"[..], &e.parts[part], ms.to_string().as_bytes()]);
        let _ = call(backend, &[(e.nodes[part], cmd)]).await;
    }
}

async fn merged(
    backend: &Backend,
    e: &Salted,
    op: Op,
    args: &[Bytes],
    careful: bool,
) -> Result<Value, Value> {
    let (cmds, _) = plan(e, &op, args, 0, careful);
    if careful && sums(&op) {
        return careful_read(backend, e, &op, &cmds).await;
    }
    let r = call(backend, &cmds).await.map_err(|e| err(&e))?;
    merge(e, &op, &r, careful)
}

/// Whether `op` adds up its parts (and so must count values in transit during a fold).
pub fn sums(op: &Op) -> bool {
    matches!(op, Op::Get | Op::HGet(_) | Op::HMGet(_) | Op::HGetAll)
}

/// A summing read while a fold may be moving values: the base key (with its applied list)
/// is read first, the shards (with their stashes) after it has answered. In that order a
/// moved value is counted exactly once: were a shard read before its take and the base
/// key after the add, it would be counted twice, and only reading the base key first rules
/// that out. The cost, a second round trip, is paid only while `Salt::careful` holds.
pub async fn careful_read(
    backend: &Backend,
    e: &Salted,
    op: &Op,
    cmds: &[(usize, Bytes)],
) -> Result<Value, Value> {
    let mut r = call(backend, &cmds[..1]).await.map_err(|e| err(&e))?;
    r.extend(call(backend, &cmds[1..]).await.map_err(|e| err(&e))?);
    merge(e, op, &r, true)
}

/// `careful_read` from a command's arguments.
pub async fn careful(backend: &Backend, e: &Salted, op: Op, args: &[Bytes]) -> Value {
    let (cmds, _) = plan(e, &op, args, 0, true);
    careful_read(backend, e, &op, &cmds)
        .await
        .unwrap_or_else(|e| e)
}

/// A counter write whose whole this proxy does not know to be safe: the whole is read
/// first (every part, with its fold bookkeeping). Clear of i64's bounds, the write goes to
/// its shard as usual; near them, the shards are folded into the base key and the command
/// runs there, so the node refuses an overflow with Redis's own error and nothing can take
/// the merged whole past what a read can answer.
pub async fn checked_write(
    backend: &Backend,
    salt: &super::Salt,
    e: &Arc<Salted>,
    op: Op,
    args: &[Bytes],
) -> Value {
    let Op::Write { delta, field } = &op else {
        return err("internal: not a counter write");
    };
    let (read, read_args) = match field {
        None => (Op::Get, vec![Bytes::from_static(b"GET"), e.key.clone()]),
        Some(f) => (
            Op::HGet(f.clone()),
            vec![Bytes::from_static(b"HGET"), e.key.clone(), f.clone()],
        ),
    };
    let whole = match careful(backend, e, read, &read_args).await {
        Value::Nil => Some(0),
        Value::Bulk(b) => crate::resp::parse_i64(&b),
        Value::Error(m) => return Value::Error(m),
        _ => None,
    };
    if whole.is_some_and(|t| write_fits(t, *delta)) {
        let (cmds, part) = plan(e, &op, args, super::now_ms(), false);
        return match call(backend, &cmds).await {
            Ok(r) => {
                let (v, created) = super::merge::written(e, &op, part, &r[0]);
                if created {
                    inherit_expiry(backend, e, part).await;
                }
                v
            }
            Err(m) => err(&m),
        };
    }
    e.forget();
    if let Err(m) = super::fold::move_all(backend, salt, &e.key).await {
        return err(&format!(
            "{} needs the salted key folded first, and that failed: {m}",
            String::from_utf8_lossy(&args[0])
        ));
    }
    match call(backend, &[(e.nodes[0], wire(args))]).await {
        Ok(mut r) => r.remove(0),
        Err(m) => err(&m),
    }
}

/// What to send for a mergeable `op`: the command on every part (a read or key command),
/// or on the shard writers use now (a write; the index of that part comes back too).
///
/// With `careful`, a summing read reads each part together with its fold bookkeeping
/// (`Salt::careful` says when); otherwise it is the plain command on each part.
pub fn plan(
    e: &Salted,
    op: &Op,
    args: &[Bytes],
    now_ms: u64,
    careful: bool,
) -> (Vec<(usize, Bytes)>, usize) {
    if let Op::Write { delta, field } = op {
        let part = e.write_shard(now_ms).map_or(0, |i| i + 1);
        let d = Bytes::from(delta.to_string());
        let shard = &e.parts[part];
        let cmd = match field {
            None => wire(&[&b"INCRBY"[..], shard, &d]),
            Some(f) => wire(&[&b"HINCRBY"[..], shard, f, &d]),
        };
        return (vec![(e.nodes[part], cmd)], part);
    }
    if let Op::Member(m) = op {
        return (members::plan(e, m), 0);
    }
    let sums = careful && sums(op);
    let cmds = e
        .parts
        .iter()
        .zip(&e.nodes)
        .enumerate()
        .map(|(i, (p, &n))| {
            if !sums {
                return (n, on(args, p));
            }
            // The part and its fold bookkeeping in one script: read atomically together.
            let aux_cmd: &[u8] = if i == 0 { b"HKEYS" } else { b"HGETALL" };
            let mut a: Vec<&[u8]> = vec![b"EVAL", READ_WITH_AUX.as_bytes(), b"2", p, &e.aux[i]];
            a.push(&args[0]);
            a.push(aux_cmd);
            a.extend(args[2..].iter().map(|x| &x[..]));
            (n, wire(&a))
        })
        .collect();
    (cmds, 0)
}

/// A summing read of one part with its fold bookkeeping: `{reply, aux}`. KEYS: part, aux
/// hash. ARGV: the command, the aux command (HKEYS of the base key's applied list, HGETALL
/// of a shard's stash), then the command's arguments after the key.
pub(super) const READ_WITH_AUX: &str =
    "return {redis.call(ARGV[1], KEYS[1], unpack(ARGV, 3)), redis.call(ARGV[2], KEYS[2])}";

/// MGET, DEL, UNLINK, EXISTS, TOUCH over several keys of which some are salted: each key
/// answered as on its own, then put together as the command would.
pub async fn multi(
    backend: &Backend,
    salt: &super::Salt,
    table: &SaltTable,
    args: &[Bytes],
    name: &str,
    proto: Proto,
) -> Bytes {
    let metrics = &salt.metrics;
    let mut out = Vec::with_capacity(args.len() - 1);
    for key in &args[1..] {
        let one = [
            Bytes::copy_from_slice(if name == "MGET" {
                b"GET"
            } else {
                name.as_bytes()
            }),
            key.clone(),
        ];
        let v = match table.get(key) {
            Some(e) => {
                metrics.merged_reads.inc();
                let op = classify(e.rec.kind, if name == "MGET" { "GET" } else { name }, &one);
                merged(backend, e, op, &one, salt.careful(e, super::now_ms())).await
            }
            None => call(backend, &[(backend.node_for(key), wire(&one))])
                .await
                .map(|mut r| r.remove(0))
                .map_err(|e| err(&e)),
        };
        match v {
            Ok(v) => out.push(v),
            Err(e) => return e.to_bytes(proto),
        }
    }
    if name == "MGET" {
        // A salted key holding a hash reads as nil under MGET, as Redis does for non-strings.
        let vals = out
            .into_iter()
            .map(|v| {
                if matches!(v, Value::Error(_)) {
                    Value::Nil
                } else {
                    v
                }
            })
            .collect();
        return Value::Array(vals).to_bytes(proto);
    }
    let n: i64 = out.iter().filter_map(as_i64).sum();
    Value::Integer(n).to_bytes(proto)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::salt::testing::*;

    #[test]
    fn counter_commands_become_shard_writes_others_fold() {
        let c = |l: &str| {
            let a = args(l);
            classify(Kind::String, std::str::from_utf8(&a[0]).unwrap(), &a)
        };
        assert_eq!(
            c("INCR k"),
            Op::Write {
                delta: 1,
                field: None
            }
        );
        assert_eq!(
            c("DECRBY k 5"),
            Op::Write {
                delta: -5,
                field: None
            }
        );
        assert_eq!(
            c("HINCRBY k f 3"),
            Op::Write {
                delta: 3,
                field: Some(b("f"))
            }
        );
        assert_eq!(c("INCRBY k x"), Op::Reject(NOT_AN_INTEGER));
        assert_eq!(c("INCRBY k +5"), Op::Reject(NOT_AN_INTEGER));
        assert_eq!(c("INCRBY k 007"), Op::Reject(NOT_AN_INTEGER));
        assert_eq!(
            c("INCRBY k 9223372036854775808"),
            Op::Reject(NOT_AN_INTEGER)
        );
        assert_eq!(c("HINCRBY k f 1.0"), Op::Reject(NOT_AN_INTEGER));
        assert_eq!(
            c("DECRBY k -9223372036854775808"),
            Op::Reject("ERR decrement would overflow")
        );
        assert_eq!(c("INCRBYFLOAT k 1.5"), Op::Other);
        assert_eq!(c("SET k 1"), Op::Other);
        assert_eq!(c("GET k"), Op::Get);
        assert_eq!(c("HMGET k a b"), Op::HMGet(vec![b("a"), b("b")]));
        assert_eq!(c("EXPIRE k 10 NX"), Op::Expire);
        assert_eq!(c("TYPE k"), Op::FirstExisting);
        let set = |l: &str| {
            let a = args(l);
            classify(Kind::Set, std::str::from_utf8(&a[0]).unwrap(), &a)
        };
        assert_eq!(
            set("INCR k"),
            Op::Other,
            "a set's key takes no counter writes"
        );
        assert_eq!(set("DEL k"), Op::Del);
        assert_eq!(set("SCARD k"), Op::Member(MOp::SCard));
    }
}
