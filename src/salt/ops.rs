//! One command on a salted key: a counter write goes to one shard and is answered with an
//! estimate of the whole; the reads and key commands that can be merged run on the base
//! key and every shard in one pipelined round per node and are merged exactly.
//!
//! Pure parts (`classify`, `plan`, `merge`, `written`) serve the session, which puts the
//! part commands in its round; `multi` answers multi-key commands over salted keys.
//! What cannot be merged (`Op::Other`) is not handled here: the session moves the shards
//! into the base key first (`fold::move_all`) and then forwards the command unchanged.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use std::collections::HashMap;

use super::record::{hex, unhex};
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
    /// Anything else: fold the shards into the base key, then run it there.
    Other,
}

/// What `args` (command name first, the salted key second) does to a salted key.
pub fn classify(name: &str, args: &[Bytes]) -> Op {
    let int = |i: usize| -> Option<i64> { std::str::from_utf8(args.get(i)?).ok()?.parse().ok() };
    let n = args.len();
    let write = |delta: Option<i64>, field: Option<Bytes>| match delta {
        Some(delta) => Op::Write { delta, field },
        // Not an integer: the base key's node gives Redis's own error.
        None => Op::Other,
    };
    match (name, n) {
        ("INCR", 2) => write(Some(1), None),
        ("DECR", 2) => write(Some(-1), None),
        ("INCRBY", 3) => write(int(2), None),
        ("DECRBY", 3) => write(int(2).and_then(i64::checked_neg), None),
        ("HINCRBY", 4) => write(int(3), Some(args[2].clone())),
        ("GET", 2) => Op::Get,
        ("HGET", 3) => Op::HGet(args[2].clone()),
        ("HMGET", n) if n >= 3 => Op::HMGet(args[2..].to_vec()),
        ("HGETALL", 2) => Op::HGetAll,
        ("DEL" | "UNLINK", 2) => Op::Del,
        ("EXISTS" | "TOUCH", 2) => Op::Exists,
        ("EXPIRE" | "PEXPIRE" | "EXPIREAT" | "PEXPIREAT", n) if n >= 3 => Op::Expire,
        ("PERSIST", 2) => Op::Expire,
        ("TTL" | "PTTL" | "TYPE", 2) => Op::FirstExisting,
        _ => Op::Other,
    }
}

fn err(msg: &str) -> Value {
    Value::Error(Bytes::from(format!("ERR saltshaker: {msg}")))
}

/// The command `args` with its key (position 1) replaced by `part`.
fn on(args: &[Bytes], part: &Bytes) -> Bytes {
    let mut a = args.to_vec();
    a[1] = part.clone();
    wire(&a)
}

/// The sum over parts of one counter; None when no part holds it. A single part holding a
/// non-integer (a value SET before the key was salted) is returned as it is.
fn sum(vals: &[Value]) -> Result<Option<(Value, Vec<i64>)>, Value> {
    let mut total: i64 = 0;
    let mut per = Vec::with_capacity(vals.len());
    let mut present: Vec<&Value> = Vec::new();
    let mut odd = None;
    for v in vals {
        match v {
            Value::Nil => per.push(0),
            v => {
                present.push(v);
                match as_i64(v) {
                    Some(n) => {
                        per.push(n);
                        total = total
                            .checked_add(n)
                            .ok_or_else(|| err("salted counter overflows a 64-bit integer"))?;
                    }
                    None => {
                        per.push(0);
                        odd = Some(v.clone());
                    }
                }
            }
        }
    }
    match (present.len(), odd) {
        (0, _) => Ok(None),
        (1, Some(v)) => Ok(Some((v, per))),
        (_, Some(_)) => Err(err("a salted key holds a value that is not an integer")),
        _ => Ok(Some((Value::Bulk(Bytes::from(total.to_string())), per))),
    }
}

/// The array element `i` of a reply (HMGET), or Nil.
fn nth(v: &Value, i: usize) -> Value {
    match v {
        Value::Array(a) => a.get(i).cloned().unwrap_or(Value::Nil),
        _ => Value::Nil,
    }
}

/// Field/value pairs of an HGETALL reply in either protocol.
fn pairs(v: &Value) -> Vec<(Bytes, Value)> {
    match v {
        Value::Array(a) => a
            .chunks(2)
            .filter_map(|c| match (&c[0], c.get(1)) {
                (Value::Bulk(f), Some(v)) => Some((f.clone(), v.clone())),
                _ => None,
            })
            .collect(),
        Value::Map(m) => m
            .iter()
            .filter_map(|(f, v)| match f {
                Value::Bulk(f) => Some((f.clone(), v.clone())),
                _ => None,
            })
            .collect(),
        _ => vec![],
    }
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
const READ_WITH_AUX: &str =
    "return {redis.call(ARGV[1], KEYS[1], unpack(ARGV, 3)), redis.call(ARGV[2], KEYS[2])}";

/// Splits the replies of a summing read into the parts' own replies and, per hex field,
/// the amounts fold moves have taken out of shards but not yet added to the base key.
fn unwrap_aux(r: &[Value]) -> (Vec<Value>, HashMap<Vec<u8>, i64>) {
    let mut vals = Vec::with_capacity(r.len());
    let mut applied: Vec<&[u8]> = Vec::new();
    let mut stash: Vec<(&[u8], i64)> = Vec::new();
    for (i, v) in r.iter().enumerate() {
        let (own, aux) = match v {
            Value::Array(a) if a.len() == 2 => (a[0].clone(), Some(&a[1])),
            v => (v.clone(), None),
        };
        vals.push(own);
        let Some(Value::Array(items)) = aux else {
            continue;
        };
        if i == 0 {
            applied.extend(items.iter().filter_map(|x| match x {
                Value::Bulk(b) => Some(&b[..]),
                _ => None,
            }));
        } else {
            for pair in items.chunks(2) {
                if let (Value::Bulk(f), Some(n)) = (&pair[0], pair.get(1).and_then(as_i64)) {
                    stash.push((&f[..], n));
                }
            }
        }
    }
    let mut pending: HashMap<Vec<u8>, i64> = HashMap::new();
    for (f, n) in stash {
        // `id` alone is the take's marker; `id:hexfield` an amount in transit.
        let Some(colon) = f.iter().position(|&c| c == b':') else {
            continue;
        };
        if !applied.contains(&&f[..colon]) {
            let slot = pending.entry(f[colon + 1..].to_vec()).or_insert(0);
            *slot = slot.saturating_add(n);
        }
    }
    (vals, pending)
}

/// `vals` plus the amount in transit for `hexfield`, as one more part.
fn with_pending(
    mut vals: Vec<Value>,
    pending: &HashMap<Vec<u8>, i64>,
    hexfield: &str,
) -> Vec<Value> {
    match pending.get(hexfield.as_bytes()) {
        Some(&n) if n != 0 => vals.push(Value::Bulk(Bytes::from(n.to_string()))),
        _ => vals.push(Value::Nil),
    }
    vals
}

/// The reply to a shard write `v` of part `part`: the estimate of the whole, and whether
/// the shard was just created (its expiry then follows the key's: `inherit_expiry`).
pub fn written(e: &Salted, op: &Op, part: usize, v: &Value) -> (Value, bool) {
    let (Op::Write { delta, field }, Value::Integer(v)) = (op, v) else {
        return (v.clone(), false);
    };
    (
        Value::Integer(e.estimate(field.as_ref(), part, *v)),
        *v == *delta && part > 0,
    )
}

/// Merges the replies of every part (base first) into the reply one key would give.
pub fn merge(e: &Salted, op: &Op, r: &[Value], careful: bool) -> Result<Value, Value> {
    if let Some(err) = r.iter().find(|v| matches!(v, Value::Error(_))) {
        return Err(err.clone());
    }
    let (r, pending) = match op {
        Op::Get | Op::HGet(_) | Op::HMGet(_) | Op::HGetAll if careful => unwrap_aux(r),
        _ => (r.to_vec(), HashMap::new()),
    };
    Ok(match op {
        Op::Get | Op::HGet(_) => {
            let field = match &op {
                Op::HGet(f) => Some(f),
                _ => None,
            };
            let hexfield = field.map(|f| hex(f)).unwrap_or_default();
            match sum(&with_pending(r, &pending, &hexfield))? {
                None => Value::Nil,
                Some((v, per)) => {
                    e.remember(field, &per);
                    v
                }
            }
        }
        Op::HMGet(fields) => {
            let fields = fields.clone();
            let mut out = Vec::with_capacity(fields.len());
            for (i, f) in fields.iter().enumerate() {
                let col: Vec<Value> = r.iter().map(|v| nth(v, i)).collect();
                out.push(match sum(&with_pending(col, &pending, &hex(f)))? {
                    None => Value::Nil,
                    Some((v, per)) => {
                        e.remember(Some(f), &per);
                        v
                    }
                });
            }
            Value::Array(out)
        }
        Op::HGetAll => {
            let mut order: Vec<Bytes> = Vec::new();
            let mut cols: std::collections::HashMap<Bytes, Vec<Value>> = Default::default();
            for (i, v) in r.iter().enumerate() {
                for (f, x) in pairs(v) {
                    let col = cols.entry(f.clone()).or_insert_with(|| {
                        order.push(f);
                        vec![Value::Nil; r.len()]
                    });
                    col[i] = x;
                }
            }
            for hf in pending.keys() {
                let Some(f) = std::str::from_utf8(hf).ok().and_then(unhex) else {
                    continue;
                };
                let f = Bytes::from(f);
                cols.entry(f.clone()).or_insert_with(|| {
                    order.push(f);
                    vec![Value::Nil; r.len()]
                });
            }
            let mut out = Vec::with_capacity(order.len());
            for f in order {
                let col = with_pending(cols[&f].clone(), &pending, &hex(&f));
                if let Some((v, _)) = sum(&col)? {
                    out.push((Value::Bulk(f), v));
                }
            }
            Value::Map(out)
        }
        Op::Del | Op::Exists | Op::Expire => {
            Value::Integer(r.iter().any(|v| as_i64(v).unwrap_or(0) > 0) as i64)
        }
        Op::FirstExisting => r
            .iter()
            .find(|v| !matches!(v, Value::Integer(-2)) && !is_none_type(v))
            .cloned()
            .unwrap_or_else(|| r[0].clone()),
        Op::Write { .. } | Op::Other => err("internal: not a merged command"),
    })
}

fn is_none_type(v: &Value) -> bool {
    matches!(v, Value::Simple(t) if &t[..] == b"none")
}

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
                let op = classify(if name == "MGET" { "GET" } else { name }, &one);
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

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    fn args(line: &str) -> Vec<Bytes> {
        line.split(' ').map(b).collect()
    }

    #[test]
    fn counter_commands_become_shard_writes_others_fold() {
        let c = |l: &str| {
            let a = args(l);
            classify(std::str::from_utf8(&a[0]).unwrap(), &a)
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
        assert_eq!(c("INCRBY k x"), Op::Other);
        assert_eq!(c("DECRBY k -9223372036854775808"), Op::Other);
        assert_eq!(c("INCRBYFLOAT k 1.5"), Op::Other);
        assert_eq!(c("SET k 1"), Op::Other);
        assert_eq!(c("GET k"), Op::Get);
        assert_eq!(c("HMGET k a b"), Op::HMGet(vec![b("a"), b("b")]));
        assert_eq!(c("EXPIRE k 10 NX"), Op::Expire);
        assert_eq!(c("TYPE k"), Op::FirstExisting);
    }

    #[test]
    fn a_value_in_transit_counts_until_its_move_is_applied() {
        let arr = |v: Vec<Value>| Value::Array(v);
        let base = |applied: &[&str]| {
            arr(vec![
                Value::Bulk(b("10")),
                arr(applied.iter().map(|a| Value::Bulk(b(a))).collect()),
            ])
        };
        // Shard 1 had 5 taken out by move 7 (marker `7`, amount under `7:`).
        let shard = arr(vec![
            Value::Nil,
            arr(vec![
                Value::Bulk(b("7")),
                Value::Bulk(b("1")),
                Value::Bulk(b("7:")),
                Value::Bulk(b("5")),
            ]),
        ]);
        let (vals, pending) = unwrap_aux(&[base(&[]), shard.clone()]);
        assert_eq!(vals, vec![Value::Bulk(b("10")), Value::Nil]);
        assert_eq!(pending.get(&b""[..]), Some(&5));
        let (_, pending) = unwrap_aux(&[base(&["7"]), shard]);
        assert!(
            pending.is_empty(),
            "applied moves are in the base key already"
        );
    }

    #[test]
    fn sums_are_exact_absent_parts_count_as_nothing() {
        let v = |s: &str| Value::Bulk(b(s));
        assert_eq!(sum(&[Value::Nil, Value::Nil]).unwrap(), None);
        let (total, per) = sum(&[v("10"), Value::Nil, v("-3"), v("5")])
            .unwrap()
            .unwrap();
        assert_eq!(total, v("12"));
        assert_eq!(per, vec![10, 0, -3, 5]);
        // A string SET before salting, with no shard written, reads back as it was.
        assert_eq!(
            sum(&[v("hello"), Value::Nil]).unwrap().unwrap().0,
            v("hello")
        );
        assert!(sum(&[v("hello"), v("1")]).is_err());
        assert!(sum(&[v(&i64::MAX.to_string()), v("1")]).is_err());
    }
}
