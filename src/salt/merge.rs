//! Merging the replies of a salted key's parts into the reply one key would give: sums
//! of counters and fields, HGETALL merges, the key commands' "any part" and "first part"
//! rules, the count of values a fold has in transit, and the estimated reply of a shard
//! write. The session and `ops` call it with the parts'
//! replies. Also the summing reads themselves: every part's command (`plan_parts`), and
//! the careful read while a fold may move values (`careful_read`), which counters and
//! hashes by field share.

use std::collections::HashMap;

use bytes::Bytes;

use super::kind::Op;
use super::record::{hex, unhex};
use super::{as_i64, call, err, Salted};
use crate::backend::{wire, Backend};
use crate::resp::Value;

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

/// Splits the replies of a summing read into the parts' own replies and, per hex field,
/// the amounts fold moves have taken out of shards but not yet added to the base key.
pub(super) fn unwrap_aux(r: &[Value]) -> (Vec<Value>, HashMap<Vec<u8>, i64>) {
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
    e.rollup.wrote(field.as_ref(), *delta);
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
        // TTL/PTTL: the longest time to live of any part. An EXPIRE sets every part that
        // exists; a base key created afterwards (a write before the promotion is in force,
        // or after demotion) did not inherit it, and the fold gives it the shards' later.
        // TYPE: the first part that exists.
        Op::FirstExisting => match r
            .iter()
            .filter_map(|v| match v {
                Value::Integer(t) if *t >= 0 => Some(*t),
                _ => None,
            })
            .max()
        {
            Some(t) => Value::Integer(t),
            None => r
                .iter()
                .find(|v| !matches!(v, Value::Integer(-2)) && !is_none_type(v))
                .cloned()
                .unwrap_or_else(|| r[0].clone()),
        },
        // Member commands are merged by their kind (`ops::merge`).
        Op::Write { .. } | Op::Member(_) | Op::Other | Op::Reject(_) => {
            err("internal: not a merged command")
        }
    })
}

fn is_none_type(v: &Value) -> bool {
    matches!(v, Value::Simple(t) if &t[..] == b"none")
}

/// The command `args` with its key (position 1) replaced by `part`.
fn on(args: &[Bytes], part: &Bytes) -> Bytes {
    let mut a = args.to_vec();
    a[1] = part.clone();
    wire(&a)
}

/// Whether `op` adds up its parts (and so must count values in transit during a fold).
pub fn sums(op: &Op) -> bool {
    matches!(op, Op::Get | Op::HGet(_) | Op::HMGet(_) | Op::HGetAll)
}

/// The command `args` on every part (base key first): a mergeable read or key command.
/// With `careful`, a summing read reads each part together with its fold bookkeeping.
pub fn plan_parts(e: &Salted, op: &Op, args: &[Bytes], careful: bool) -> Vec<(usize, Bytes)> {
    let sums = careful && sums(op);
    e.parts
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
        .collect()
}

/// A summing read of one part with its fold bookkeeping: `{reply, aux}`. KEYS: part, aux
/// hash. ARGV: the command, the aux command (HKEYS of the base key's applied list, HGETALL
/// of a shard's stash), then the command's arguments after the key.
pub const READ_WITH_AUX: &str =
    "return {redis.call(ARGV[1], KEYS[1], unpack(ARGV, 3)), redis.call(ARGV[2], KEYS[2])}";

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
    let cmds = plan_parts(e, &op, args, true);
    careful_read(backend, e, &op, &cmds)
        .await
        .unwrap_or_else(|e| e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::salt::testing::*;

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
