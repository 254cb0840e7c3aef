//! One command on a salted key: a counter write goes to one shard and is answered with an
//! estimate of the whole; the reads and key commands that can be merged run on the base
//! key and every shard in one pipelined round per node and are merged exactly.
//!
//! Pure parts (`classify`, `plan`; `merge` merges the replies) serve the session, which puts
//! the part commands in its round; `multi` answers multi-key commands over salted keys.
//! What cannot be merged (`Op::Other`) is not handled here: the session moves the shards
//! into the base key first (`fold::move_all`) and then forwards the command unchanged.
//!
//! This is where a command meets its key's kind: `classify` and `plan` ask `kinds::of`
//! for the kind's part, `merge` for member commands, `quiet` for removals.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::kind::{cmd, MOp, Op};
use super::merge::{careful, careful_read, plan_parts, sums};
use super::record::Kind;
use super::{as_i64, call, err, kinds, Salt, SaltTable, Salted};
use crate::backend::{wire, Backend};
use crate::command::{Classified, Cmd, Spec};
use crate::mitigate::combine::Combiner;
use crate::resp::{Proto, Value};

/// What `args` (command name first, the salted key second) does to a salted key of `kind`.
pub fn classify(kind: Kind, c: &Classified, args: &[Bytes]) -> Op {
    key_command(c.spec.cmd, args.len()).unwrap_or_else(|| kinds::of(kind).classify(c, args))
}

/// A shard write is safe while the whole stays this far from i64's bounds: no sum of parts
/// can then overflow. Beyond it (a huge increment, or a total known to be near the bound),
/// the key is folded and the base key's node decides exactly, with Redis's own error.
pub const SAFE_TOTAL: i64 = 1 << 62;

/// Whether a shard write of `delta` keeps the whole (last known `total`) safe.
pub fn write_fits(total: i64, delta: i64) -> bool {
    total.unsigned_abs().saturating_add(delta.unsigned_abs()) < SAFE_TOTAL as u64
}

/// The commands on the key itself, whatever it holds: they act on every part.
fn key_command(which: Cmd, n: usize) -> Option<Op> {
    Some(match (which, n) {
        (Cmd::Del | Cmd::Unlink, 2) => Op::Del,
        (Cmd::Exists | Cmd::Touch, 2) => Op::Exists,
        (Cmd::Expire | Cmd::Pexpire | Cmd::Expireat | Cmd::Pexpireat, n) if n >= 3 => Op::Expire,
        (Cmd::Persist, 2) => Op::Expire,
        (Cmd::Ttl | Cmd::Pttl | Cmd::Type, 2) => Op::FirstExisting,
        _ => return None,
    })
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
        return err(format!(
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
    plan_in_turn(e, op, args, now_ms, careful, None)
}

/// `plan`, with a write sent to the shard of combine window `turn` (`Salted::write_shard`).
pub fn plan_in_turn(
    e: &Salted,
    op: &Op,
    args: &[Bytes],
    now_ms: u64,
    careful: bool,
    turn: Option<u64>,
) -> (Vec<(usize, Bytes)>, usize) {
    if let Op::Write { delta, field } = op {
        let part = e.write_shard(now_ms, turn).map_or(0, |i| i + 1);
        let d = Bytes::from(delta.to_string());
        let shard = &e.parts[part];
        let cmd = match field {
            None => wire(&[&b"INCRBY"[..], shard, &d]),
            Some(f) => wire(&[&b"HINCRBY"[..], shard, f, &d]),
        };
        return (vec![(e.nodes[part], cmd)], part);
    }
    if let Op::Member(m) = op {
        return (kinds::of(e.rec.kind).plan(e, m), 0);
    }
    (plan_parts(e, op, args, careful), 0)
}

/// Merges the replies of every part (in `plan`'s order) into the reply one key would give.
pub fn merge(e: &Salted, op: &Op, r: &[Value], careful: bool) -> Result<Value, Value> {
    match op {
        Op::Member(m) => kinds::of(e.rec.kind).merge(m, r),
        op => super::merge::merge(e, op, r, careful),
    }
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
                return match call(backend, &kinds::of(e.rec.kind).plan(e, op)).await {
                    Ok(r) => kinds::of(e.rec.kind).merge(op, &r).unwrap_or_else(|v| v),
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

/// MGET, DEL, UNLINK, EXISTS, TOUCH over several keys of which some are salted: each key
/// answered as on its own, then put together as the command would.
pub async fn multi(
    backend: &Backend,
    salt: &super::Salt,
    table: &SaltTable,
    args: &[Bytes],
    spec: &Spec,
    proto: Proto,
) -> Bytes {
    let mget = spec.cmd == Cmd::Mget;
    let metrics = &salt.metrics;
    let mut out = Vec::with_capacity(args.len() - 1);
    for key in &args[1..] {
        let one = [
            Bytes::copy_from_slice(if mget { b"GET" } else { spec.name.as_bytes() }),
            key.clone(),
        ];
        let v = match table.get(key) {
            Some(e) => {
                metrics.merged_reads.inc();
                // One key of the command, classified as sent on its own (MGET's as GET).
                let op = match crate::command::classify(&one[..]) {
                    Ok(c) => classify(e.rec.kind, &c, &one),
                    Err(_) => Op::Other,
                };
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
    if mget {
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

    const NOT_AN_INTEGER: &str = "ERR value is not an integer or out of range";

    #[test]
    fn counter_commands_become_shard_writes_others_fold() {
        let c = |l: &str| {
            let a = args(l);
            classify(Kind::String, &crate::command::classify(&a[..]).unwrap(), &a)
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
            classify(Kind::Set, &crate::command::classify(&a[..]).unwrap(), &a)
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
