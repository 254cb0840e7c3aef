//! HyperLogLogs salted by element: PFADD sends each element to its shard
//! (`Salted::shard_of`), so the shards' registers cover disjoint elements. PFCOUNT counts
//! the union of the parts' registers on the base key's node (the shards' sums while the
//! base key is empty), which is the estimate the unsalted key would give.
//!
//! A fold merges a shard's registers into the base key (PFMERGE, which is idempotent) and
//! deletes the shard only if no PFADD changed it meanwhile; a changed shard is merged
//! again on the next pass. No journal is needed: merging twice changes nothing.

use bytes::Bytes;

use crate::backend::Backend;
use crate::command::{Classified, Cmd};
use crate::resp::Value;
use crate::salt::journal::Claimed;
use crate::salt::kind::{cmd, every, Facts, MOp, Op, SaltKind};
use crate::salt::names::{on_node, shard_name, Place};
use crate::salt::record::{Move, Record};
use crate::salt::{as_i64, call, err, failpoint, Fut, Salt, SaltError, Salted};

/// What `args` does to a salted HyperLogLog; None: fold first, then run.
pub fn classify(cmd: Cmd, args: &[Bytes]) -> Option<MOp> {
    match (cmd, args.len()) {
        (Cmd::Pfadd, n) if n >= 3 => Some(MOp::PfAdd(args[2..].to_vec())),
        (Cmd::Pfcount, 2) => Some(MOp::PfCount),
        _ => None,
    }
}

/// The commands of an inline `op`: PFADD per shard's elements, PFCOUNT on every part.
pub fn plan(e: &Salted, op: &MOp) -> Vec<(usize, Bytes)> {
    match op {
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
        // With the base key empty, the shards' counts add up (their elements are disjoint):
        // each within the HyperLogLog's error, as the unsalted key's count is.
        MOp::PfCount => every(e, b"PFCOUNT"),
        _ => Vec::new(),
    }
}

/// Merges the replies of an inline `op`.
pub fn merge(op: &MOp, r: &[Value]) -> Result<Value, Value> {
    if let Some(e) = r.iter().find(|v| matches!(v, Value::Error(_))) {
        return Err(e.clone());
    }
    Ok(match op {
        MOp::PfAdd(_) => Value::Integer(r.iter().any(|v| as_i64(v) == Some(1)) as i64),
        MOp::PfCount => Value::Integer(r.iter().filter_map(as_i64).sum()),
        _ => return Err(err("internal: not an inline HyperLogLog command")),
    })
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
    c: &mut Claimed,
    i: usize,
) -> Result<(), SaltError> {
    let shard = shard_name(key, c.rec.salts[i], backend.tag());
    let node = backend.node_of(&shard);
    let r = call(backend, &[(node, cmd(&[b"GET", &shard]))]).await?;
    let raw = match &r[0] {
        Value::Nil => return Ok(()),
        Value::Bulk(b) => b.clone(),
        v => {
            return Err(SaltError::Reply(format!(
                "unexpected GET reply from a shard: {v:?}"
            )))
        }
    };
    let tmp = scratch(backend, key, 1).remove(0);
    let merge = cmd(&[b"EVAL", MERGE_HLL.as_bytes(), b"2", key, &tmp, &raw]);
    let r = call(backend, &[(backend.node_of(key), merge)]).await?;
    if let Value::Error(e) = &r[0] {
        return Err(SaltError::Reply(format!(
            "fold merge failed: {}",
            String::from_utf8_lossy(e)
        )));
    }
    failpoint("fold-after-add").await;
    let del = cmd(&[b"EVAL", DEL_IF_SAME.as_bytes(), b"1", &shard, &raw]);
    call(backend, &[(node, del)]).await?;
    salt.metrics.fold_moves.inc();
    Ok(())
}

/// The HyperLogLog kind.
pub struct Hll;

impl SaltKind for Hll {
    fn family(&self) -> &'static str {
        "hyperloglogs"
    }

    fn takes(&self, f: Facts) -> bool {
        matches!(f.redis_type, None | Some("string")) && (f.hll || f.redis_type.is_none())
    }

    /// A HyperLogLog shard's move journals nothing: PFMERGE into the base key is the same
    /// however often it runs (`move_hll`).
    fn apply<'a>(
        &'a self,
        _backend: &'a Backend,
        _key: &'a [u8],
        _rec: &'a Record,
        _mv: &'a Move,
    ) -> Fut<'a, Result<(), SaltError>> {
        Box::pin(async {
            Err(SaltError::Journal(
                "a HyperLogLog's shards are moved without a journal".into(),
            ))
        })
    }

    fn classify(&self, c: &Classified, args: &[Bytes]) -> Op {
        classify(c.spec.cmd, args).map_or(Op::Other, Op::Member)
    }

    fn inline(&self, op: &MOp, careful: bool, base_empty: bool) -> bool {
        match op {
            MOp::PfAdd(_) => true,
            MOp::PfCount => !careful && base_empty,
            _ => false,
        }
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
        _careful: bool,
        _resp3: bool,
    ) -> Fut<'a, Result<Value, Value>> {
        Box::pin(async move {
            match op {
                MOp::PfCount => pfcount(backend, e).await,
                _ => Err(err("internal: not a HyperLogLog read")),
            }
        })
    }

    fn move_shard<'a>(
        &'a self,
        backend: &'a Backend,
        salt: &'a Salt,
        key: &'a [u8],
        c: &'a mut Claimed,
        i: usize,
    ) -> Fut<'a, Result<(), SaltError>> {
        Box::pin(move_hll(backend, salt, key, c, i))
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
    fn hll_commands_have_merges_others_fold() {
        assert_eq!(c("PFADD k a b"), Some(MOp::PfAdd(vec![b("a"), b("b")])));
        assert_eq!(c("PFADD k"), None);
        assert_eq!(c("PFCOUNT k"), Some(MOp::PfCount));
        assert_eq!(c("SADD k a"), None);
    }
}
