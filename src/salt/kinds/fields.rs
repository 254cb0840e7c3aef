//! Hashes of counters placed by field (`salt.by: field`): each field lives in the shard
//! its name hashes to, so a hash with many hot fields spreads over the nodes and a point
//! read asks one shard and the base key (which holds what was written before the
//! promotion). A field's value is the sum of its value in the base key and in its shard.
//!
//! - HINCRBY goes to the field's shard; while the base key may hold fields it also reads
//!   the field there, so the reply is the field's whole value, exactly.
//! - HGET, HMGET: the field's shard and the base key, summed. HEXISTS: either. HDEL: both.
//! - HLEN: the shards' lengths add up while the base key is empty; otherwise the union of
//!   field names is counted. HGETALL sums every part (`Op::HGetAll`).
//! - HSET and any command without a merge fold the key first, then run on the whole.
//!
//! The fold moves fields with the counters' journal (`journal::move_counters`), a page of fields
//! at a time; while it may run, HGET, HMGET and HGETALL read each part with its fold
//! bookkeeping (`merge::careful_read`), and HEXISTS, HDEL and HLEN wait for it.

use std::collections::HashSet;

use bytes::Bytes;

use crate::backend::{wire, Backend};
use crate::command::{Classified, Cmd, Counter};
use crate::resp::Value;
use crate::salt::journal::{apply_counters, move_counters, Claimed, Shape};
use crate::salt::kind::{bulks, every, pairs, Facts, MOp, Op, SaltKind};
use crate::salt::merge;
use crate::salt::record::{Move, Record};
use crate::salt::{as_i64, call, err, Fut, Salt, SaltError, Salted};

/// What `c` (its arguments `args`) does to a hash placed by field; None: fold first, then
/// run.
pub fn classify(c: &Classified, args: &[Bytes]) -> Option<MOp> {
    let n = args.len();
    let integer = matches!(c.counter, Some(Counter { delta: Ok(_), .. }));
    match c.spec.cmd {
        Cmd::Hincrby if n == 4 && integer => Some(MOp::HIncrBy {
            field: args[2].clone(),
            delta: args[3].clone(),
            to_base: false,
            check: false,
        }),
        Cmd::Hget if n == 3 => Some(MOp::HGetF(args[2].clone())),
        Cmd::Hmget if n >= 3 => Some(MOp::HMGetF(args[2..].to_vec())),
        Cmd::Hexists if n == 3 => Some(MOp::HExists(args[2].clone())),
        Cmd::Hdel if n >= 3 => {
            let mut seen = HashSet::new();
            let fields = args[2..]
                .iter()
                .filter(|f| seen.insert(&f[..]))
                .cloned()
                .collect();
            Some(MOp::HDel(fields))
        }
        Cmd::Hlen if n == 2 => Some(MOp::HLen),
        _ => None,
    }
}

/// The commands of an inline `op`, in the order `merge` reads them.
pub fn plan(e: &Salted, op: &MOp) -> Vec<(usize, Bytes)> {
    match op {
        MOp::HIncrBy {
            field,
            delta,
            to_base,
            check,
        } => {
            let (t, o) = if *to_base {
                (0, e.shard_of(field))
            } else {
                (e.shard_of(field), 0)
            };
            let mut out = vec![(
                e.nodes[t],
                wire(&[&b"HINCRBY"[..], &e.parts[t], field, delta]),
            )];
            if *check {
                out.push((e.nodes[o], wire(&[&b"HGET"[..], &e.parts[o], field])));
            }
            out
        }
        MOp::HGetF(f) => pairs(e, std::slice::from_ref(f), b"HGET"),
        MOp::HMGetF(fs) => pairs(e, fs, b"HGET"),
        MOp::HExists(f) => pairs(e, std::slice::from_ref(f), b"HEXISTS"),
        MOp::HDel(fs) => pairs(e, fs, b"HDEL"),
        _ => vec![],
    }
}

/// A field's value from its two parts: one present is returned as it is (a value set
/// before the promotion may be any string); two are summed as integers.
fn sum(a: &Value, b: &Value) -> Result<Value, Value> {
    match (a, b) {
        (Value::Nil, Value::Nil) => Ok(Value::Nil),
        (v, Value::Nil) | (Value::Nil, v) => Ok(v.clone()),
        (x, y) => match (as_i64(x), as_i64(y)) {
            (Some(x), Some(y)) => x
                .checked_add(y)
                .map(|s| Value::Bulk(Bytes::from(s.to_string())))
                .ok_or_else(|| err("salted field overflows a 64-bit integer")),
            _ => Err(err(
                "a salted hash field holds a value that is not an integer",
            )),
        },
    }
}

/// Merges the replies of an inline `op`.
pub fn merge(op: &MOp, r: &[Value]) -> Result<Value, Value> {
    if let Some(e) = r.iter().find(|v| matches!(v, Value::Error(_))) {
        return Err(e.clone());
    }
    let either = |i: usize| as_i64(&r[2 * i]) == Some(1) || as_i64(&r[2 * i + 1]) == Some(1);
    Ok(match op {
        MOp::HIncrBy { check: false, .. } => r[0].clone(),
        MOp::HIncrBy { .. } => match sum(&r[0], &r[1])? {
            Value::Bulk(b) => Value::Integer(as_i64(&Value::Bulk(b)).unwrap_or(0)),
            v => v,
        },
        MOp::HGetF(_) => sum(&r[0], &r[1])?,
        MOp::HMGetF(fs) => Value::Array(
            (0..fs.len())
                .map(|i| sum(&r[2 * i], &r[2 * i + 1]))
                .collect::<Result<_, _>>()?,
        ),
        MOp::HExists(_) => Value::Integer(either(0) as i64),
        MOp::HDel(fs) => Value::Integer((0..fs.len()).filter(|&i| either(i)).count() as i64),
        _ => return Err(err("internal: not an inline hash command")),
    })
}

/// HLEN: the shards' lengths while the base key is empty, else the union of field names.
pub async fn hlen(backend: &Backend, e: &Salted) -> Result<Value, Value> {
    let lens = call(backend, &every(e, b"HLEN"))
        .await
        .map_err(|m| err(&m))?;
    if let Some(x) = lens.iter().find(|v| as_i64(v).is_none()) {
        return Err(x.clone());
    }
    if lens.last().and_then(as_i64) == Some(0) {
        return Ok(Value::Integer(lens.iter().filter_map(as_i64).sum()));
    }
    let keys = call(backend, &every(e, b"HKEYS"))
        .await
        .map_err(|m| err(&m))?;
    let names: HashSet<Bytes> = keys.iter().flat_map(bulks).collect();
    Ok(Value::Integer(names.len() as i64))
}

/// Answers a task `op`: HLEN, and HEXISTS while a fold may run.
pub async fn read(backend: &Backend, e: &Salted, op: &MOp, careful: bool) -> Result<Value, Value> {
    match op {
        MOp::HExists(f) if careful => {
            let args = [Bytes::from_static(b"HGET"), e.key.clone(), f.clone()];
            match merge::careful(backend, e, Op::HGet(f.clone()), &args).await {
                v @ Value::Error(_) => Err(v),
                Value::Nil => Ok(Value::Integer(0)),
                _ => Ok(Value::Integer(1)),
            }
        }
        MOp::HLen if careful => {
            let args = [Bytes::from_static(b"HGETALL"), e.key.clone()];
            match merge::careful(backend, e, Op::HGetAll, &args).await {
                Value::Map(m) => Ok(Value::Integer(m.len() as i64)),
                v => Err(v),
            }
        }
        MOp::HLen => hlen(backend, e).await,
        _ => Err(err("internal: not a hash read")),
    }
}

/// The kind of a hash of counters placed by field.
pub struct Fields;

impl SaltKind for Fields {
    fn family(&self) -> &'static str {
        "hashes"
    }

    fn takes(&self, f: Facts) -> bool {
        matches!(f.redis_type, None | Some("hash")) && f.by_field
    }

    fn move_shard<'a>(
        &'a self,
        backend: &'a Backend,
        salt: &'a Salt,
        key: &'a [u8],
        c: &'a mut Claimed,
        i: usize,
    ) -> Fut<'a, Result<(), SaltError>> {
        Box::pin(move_counters(backend, salt, key, c, i, Shape::Hash))
    }

    fn apply<'a>(
        &'a self,
        backend: &'a Backend,
        key: &'a [u8],
        rec: &'a Record,
        mv: &'a Move,
    ) -> Fut<'a, Result<(), SaltError>> {
        Box::pin(apply_counters(backend, key, rec, mv, Shape::Hash))
    }

    fn classify(&self, c: &Classified, args: &[Bytes]) -> Op {
        if c.spec.cmd == Cmd::Hgetall && args.len() == 2 {
            return Op::HGetAll;
        }
        classify(c, args).map_or(Op::Other, Op::Member)
    }

    fn inline(&self, op: &MOp, careful: bool, base_empty: bool) -> bool {
        match op {
            MOp::HIncrBy { .. } | MOp::HDel(_) => true,
            MOp::HGetF(_) | MOp::HMGetF(_) | MOp::HExists(_) => !careful,
            MOp::HLen => !careful && base_empty,
            _ => false,
        }
    }

    fn plan(&self, e: &Salted, op: &MOp) -> Vec<(usize, Bytes)> {
        match op {
            MOp::HLen => every(e, b"HLEN"),
            op => plan(e, op),
        }
    }

    fn merge(&self, op: &MOp, r: &[Value]) -> Result<Value, Value> {
        match op {
            MOp::HLen => match r.iter().find(|v| matches!(v, Value::Error(_))) {
                Some(x) => Err(x.clone()),
                None => Ok(Value::Integer(r.iter().filter_map(as_i64).sum())),
            },
            op => merge(op, r),
        }
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::salt::testing::*;

    #[test]
    fn a_field_is_its_base_value_plus_its_shard_value() {
        let v = |s: &str| Value::Bulk(b(s));
        assert_eq!(sum(&Value::Nil, &Value::Nil).unwrap(), Value::Nil);
        assert_eq!(sum(&v("hello"), &Value::Nil).unwrap(), v("hello"));
        assert_eq!(sum(&v("3"), &v("-5")).unwrap(), v("-2"));
        assert!(sum(&v("x"), &v("1")).is_err());
        assert!(sum(&v(&i64::MAX.to_string()), &v("1")).is_err());
        let inc = MOp::HIncrBy {
            field: b("f"),
            delta: b("2"),
            to_base: false,
            check: true,
        };
        assert_eq!(
            merge(&inc, &[Value::Integer(2), v("40")]).unwrap(),
            Value::Integer(42)
        );
        let of = |l: &str| {
            let a = l.split(' ').map(b).collect::<Vec<_>>();
            classify(&crate::command::classify(&a[..]).unwrap(), &a)
        };
        assert_eq!(of("HINCRBY k f x"), None);
        assert_eq!(of("HSET k f 1"), None);
        assert_eq!(of("HDEL k f f g"), Some(MOp::HDel(vec![b("f"), b("g")])));
    }
}
