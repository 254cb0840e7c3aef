//! Merging the replies of a command that went to several places (a fan-out over nodes,
//! a salted key's parts, an MGET partly from the cache) into the one reply its client
//! expects. The reply writer (`reply`) calls `merge` for a `Slot::Merge` and only writes.

use bytes::{Bytes, BytesMut};
use tokio::sync::oneshot;

use super::round::{CachedGet, Merge, MgetFrom, MgetPerKey, Part};
use crate::backend::{BackendError, Replies};
use crate::resp::{
    encode_array_header, encode_bulk, encode_error, encode_int, parse_value, Proto, Value,
};

/// A task's reply, or the error text for a task that gave up or ran past `deadline`.
pub(in crate::proxy) async fn later(
    rx: oneshot::Receiver<Bytes>,
    deadline: Option<tokio::time::Instant>,
) -> Result<Bytes, &'static str> {
    let r = match deadline {
        Some(d) => tokio::time::timeout_at(d, rx)
            .await
            .map_err(|_| "ERR saltshaker: no reply within request_timeout_ms")?,
        None => rx.await,
    };
    r.map_err(|_| "ERR saltshaker: internal error (request abandoned)")
}

pub(in crate::proxy) fn part(
    replies: &[Result<Replies, BackendError>],
    p: Part,
) -> Result<Bytes, &BackendError> {
    match &replies[p.job as usize] {
        Ok(r) if (p.idx as usize) < r.len() => Ok(r.get(p.idx as usize)),
        Ok(_) => Ok(Bytes::from_static(
            b"-ERR saltshaker: internal error (missing reply)\r\n",
        )),
        Err(e) => Err(e),
    }
}

/// The connections the nodes list as blocked (flag `b`) in their `CLIENT LIST ID ...`
/// replies.
fn blocked_on_nodes(replies: &[Result<Replies, BackendError>], asks: &[Part]) -> i64 {
    let mut n = 0;
    for p in asks {
        let Ok(raw) = part(replies, *p) else { continue };
        let Ok(Some((Value::Bulk(b) | Value::Verbatim(b), _))) = parse_value(&raw) else {
            continue;
        };
        let text = String::from_utf8_lossy(b.strip_prefix(b"txt:").unwrap_or(&b[..])).into_owned();
        n += text
            .lines()
            .filter(|l| {
                l.split(' ')
                    .find_map(|f| f.strip_prefix("flags="))
                    .is_some_and(|f| f.contains('b'))
            })
            .count() as i64;
    }
    n
}

pub fn backend_error(e: &BackendError, out: &mut BytesMut) {
    encode_error(&format!("ERR saltshaker: {e}"), out);
}

/// Parses the replies of `parts`; the first backend failure or error reply wins.
fn values(replies: &[Result<Replies, BackendError>], parts: &[Part]) -> Result<Vec<Value>, Bytes> {
    let mut vals = Vec::with_capacity(parts.len());
    for p in parts {
        let raw = match part(replies, *p) {
            Ok(b) => b,
            Err(e) => {
                let mut o = BytesMut::new();
                backend_error(e, &mut o);
                return Err(o.freeze());
            }
        };
        match parse_value(&raw) {
            Ok(Some((Value::Error(_), _))) => return Err(raw),
            Ok(Some((v, _))) => vals.push(v),
            _ => {
                return Err(Bytes::from_static(
                    b"-ERR saltshaker: unreadable backend reply\r\n",
                ))
            }
        }
    }
    Ok(vals)
}

/// An MGET answered key by key. A cached value is the reply to `GET key`, used as the
/// key's element as it is, except WRONGTYPE, which MGET answers with nil. The node's
/// failure or another error reply (a failed fill) answers the whole command, as it would
/// a plain MGET.
pub(in crate::proxy) async fn mget_per_key(
    m: MgetPerKey,
    replies: &[Result<Replies, BackendError>],
    proto: Proto,
    late: Option<tokio::time::Instant>,
    out: &mut BytesMut,
) {
    let from_nodes = match values(replies, &m.parts) {
        Ok(vs) => vs,
        Err(e) => return out.extend_from_slice(&e),
    };
    let n = m.from.len();
    let mut items = BytesMut::new();
    for from in m.from {
        let get = match from {
            MgetFrom::Node { part, pos } => {
                let v = match &from_nodes[part as usize] {
                    Value::Array(vs) => vs.get(pos as usize).unwrap_or(&Value::Nil),
                    _ => &Value::Nil,
                };
                v.encode(proto, &mut items);
                continue;
            }
            MgetFrom::Cache(CachedGet::Ready(b)) => b,
            MgetFrom::Cache(CachedGet::Later(rx)) => match later(rx, late).await {
                Ok(b) => b,
                Err(e) => return encode_error(e, out),
            },
        };
        if get.starts_with(b"-WRONGTYPE") {
            Value::Nil.encode(proto, &mut items);
        } else if get.starts_with(b"-") {
            return out.extend_from_slice(&get);
        } else {
            items.extend_from_slice(&get);
        }
    }
    encode_array_header(n, out);
    out.extend_from_slice(&items);
}

pub(in crate::proxy) fn merge(
    m: Merge,
    replies: &[Result<Replies, BackendError>],
    proto: Proto,
    out: &mut BytesMut,
) {
    let result = match m {
        Merge::SumInt(parts) => values(replies, &parts).map(|vs| {
            let sum: i64 = vs
                .iter()
                .map(|v| if let Value::Integer(i) = v { *i } else { 0 })
                .sum();
            encode_int(sum, out);
        }),
        Merge::MinInt(parts) => values(replies, &parts).map(|vs| {
            let min = vs
                .iter()
                .filter_map(|v| {
                    if let Value::Integer(i) = v {
                        Some(*i)
                    } else {
                        None
                    }
                })
                .min();
            encode_int(min.unwrap_or(0), out);
        }),
        Merge::Mget { parts, order } => values(replies, &parts).map(|vs| {
            encode_array_header(order.len(), out);
            for (p, pos) in order {
                match &vs[p as usize] {
                    Value::Array(items) => match items.get(pos as usize) {
                        Some(v) => v.encode(proto, out),
                        None => Value::Nil.encode(proto, out),
                    },
                    _ => Value::Nil.encode(proto, out),
                }
            }
        }),
        Merge::AllOk(parts) => values(replies, &parts).map(|vs| match vs.first() {
            Some(v) => v.encode(proto, out),
            None => encode_error("ERR saltshaker: no node answered", out),
        }),
        Merge::Salted {
            parts,
            op,
            entry,
            part: written,
            ctx,
        } => values(replies, &parts).map(|vs| {
            let v = match (&op, ctx) {
                (crate::salt::kind::Op::Write { .. }, Some(ctx)) => {
                    let (v, created) = crate::salt::merge::written(&entry, &op, written, &vs[0]);
                    if created {
                        tokio::spawn(async move {
                            crate::salt::ops::inherit_expiry(&ctx.backend, &entry, written).await
                        });
                    }
                    v
                }
                _ => crate::salt::ops::merge(&entry, &op, &vs, false).unwrap_or_else(|e| e),
            };
            v.encode(proto, out);
        }),
        Merge::Once {
            part: p,
            entry,
            to,
            delta,
            salt,
        } => {
            // An error reply too goes through `finish`, which reads it as INCRBY's own.
            let v = match part(replies, p) {
                Ok(raw) => match parse_value(&raw) {
                    Ok(Some((v, _))) => v,
                    _ => Value::Error(Bytes::from_static(
                        b"ERR saltshaker: unreadable backend reply",
                    )),
                },
                Err(e) => {
                    let mut o = BytesMut::new();
                    backend_error(e, &mut o);
                    out.extend_from_slice(&o);
                    return;
                }
            };
            crate::salt::idem::finish(&salt, entry.as_deref(), to, delta, &v).encode(proto, out);
            Ok(())
        }
        Merge::Exec(p, locals) => match part(replies, p) {
            Ok(b) => {
                out.extend_from_slice(&super::txn::splice(b, &locals));
                Ok(())
            }
            Err(e) => {
                backend_error(e, out);
                Ok(())
            }
        },
        Merge::Concat(parts) => values(replies, &parts).map(|vs| {
            let items: Vec<Value> = vs
                .into_iter()
                .flat_map(|v| match v {
                    Value::Array(a) | Value::Set(a) => a,
                    _ => Vec::new(),
                })
                .collect();
            Value::Array(items).encode(proto, out);
        }),
        Merge::Slowlog { parts, count } => values(replies, &parts).map(|vs| {
            let mut items: Vec<Value> = vs
                .into_iter()
                .flat_map(|v| match v {
                    Value::Array(a) => a,
                    _ => Vec::new(),
                })
                .collect();
            // An entry is [id, unix time, microseconds, args, client, name].
            let at = |e: &Value, i: usize| match e {
                Value::Array(f) => match f.get(i) {
                    Some(Value::Integer(n)) => *n,
                    _ => 0,
                },
                _ => 0,
            };
            items.sort_by_key(|e| std::cmp::Reverse((at(e, 1), at(e, 0))));
            items.truncate(count.unwrap_or(usize::MAX));
            Value::Array(items).encode(proto, out);
        }),
        Merge::AndArrays(parts) => values(replies, &parts).map(|vs| {
            let mut acc: Vec<i64> = Vec::new();
            for (i, v) in vs.iter().enumerate() {
                if let Value::Array(a) = v {
                    let ints = a
                        .iter()
                        .map(|x| if let Value::Integer(n) = x { *n } else { 0 });
                    if i == 0 {
                        acc = ints.collect();
                    } else {
                        for (slot, n) in acc.iter_mut().zip(ints) {
                            *slot = (*slot != 0 && n != 0) as i64;
                        }
                    }
                }
            }
            Value::Array(acc.into_iter().map(Value::Integer).collect()).encode(proto, out);
        }),
        Merge::FirstNonNil(parts) => values(replies, &parts).map(|vs| {
            let v = vs
                .into_iter()
                .find(|v| !matches!(v, Value::Nil | Value::NilArray))
                .unwrap_or(Value::Nil);
            v.encode(proto, out);
        }),
        Merge::Scan { parts, node, nodes } => {
            let mut keys = Vec::new();
            let mut next = 0;
            let mut failed = None;
            for (i, p) in parts.iter().enumerate() {
                // A later node's failure ends this call at the nodes before it; the scan
                // meets the failure there next time.
                let v = match values(replies, &[*p]) {
                    Ok(mut v) => v.pop(),
                    Err(e) if i == 0 => {
                        failed = Some(e);
                        break;
                    }
                    Err(_) => break,
                };
                let Some(Value::Array(mut a)) =
                    v.filter(|v| matches!(v, Value::Array(a) if a.len() == 2))
                else {
                    failed = Some(Bytes::from_static(
                        b"-ERR saltshaker: unexpected SCAN reply\r\n",
                    ));
                    break;
                };
                let cursor = match &a[0] {
                    Value::Bulk(b) => std::str::from_utf8(b)
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok())
                        .unwrap_or(0),
                    _ => 0,
                };
                if let Some(Value::Array(k)) = a.pop() {
                    keys.extend(k);
                }
                next = super::scan::encode_cursor(cursor, node + i, nodes);
                // This node is not finished: the scan goes on here next time.
                if cursor != 0 {
                    break;
                }
            }
            match failed {
                Some(e) => Err(e),
                None => {
                    Value::Array(vec![
                        Value::Bulk(Bytes::from(next.to_string())),
                        Value::Array(keys),
                    ])
                    .encode(proto, out);
                    Ok(())
                }
            }
        }
        Merge::Info {
            proxy,
            parts,
            addrs,
            clients,
            blocked,
            blocked_asks,
            tracking: (tracking_clients, tracking_keys),
        } => {
            let mut text = proxy;
            let blocked = blocked + blocked_on_nodes(replies, &blocked_asks);
            let bodies: Vec<String> = parts
                .iter()
                .map(|p| {
                    match part(replies, *p)
                        .ok()
                        .and_then(|raw| parse_value(&raw).ok().flatten())
                    {
                        Some((Value::Bulk(b), _)) | Some((Value::Verbatim(b), _)) => {
                            String::from_utf8_lossy(b.strip_prefix(b"txt:").unwrap_or(&b[..]))
                                .into_owned()
                        }
                        _ => String::new(),
                    }
                })
                .collect();
            // The keyspace is every node's, summed per database.
            let keyspace = merged_keyspace(&bodies);
            for (i, body) in bodies.iter().enumerate() {
                if i == 0 {
                    // The clients are the proxy's, not the node's (whose clients are the
                    // proxies' shared connections).
                    for line in body.split_inclusive('\n') {
                        if line.starts_with("connected_clients:") {
                            text.push_str(&format!("connected_clients:{clients}\r\n"));
                        } else if line.starts_with("blocked_clients:") {
                            text.push_str(&format!("blocked_clients:{blocked}\r\n"));
                        } else if line.starts_with("tracking_clients:") {
                            // The proxy's clients that track (the node's count is the
                            // proxies' own tracked connections).
                            text.push_str(&format!("tracking_clients:{tracking_clients}\r\n"));
                        } else if line.starts_with("tracking_total_keys:") {
                            text.push_str(&format!("tracking_total_keys:{tracking_keys}\r\n"));
                        } else if line.starts_with("# Keyspace") {
                            text.push_str(line);
                            text.push_str(&keyspace);
                        } else if addrs.len() > 1
                            && line.starts_with("# ")
                            && !line.starts_with("# Clients")
                        {
                            // Over several nodes, the other sections are the first node's:
                            // the header says so (clients read '#' lines as comments).
                            let name = line.trim_end();
                            text.push_str(&format!("{name} (node0, {})\r\n", addrs[0]));
                        } else if db_line(line).is_none() {
                            text.push_str(line);
                        }
                    }
                }
                if addrs.len() > 1 {
                    if i == 0 {
                        text.push_str("\r\n# Nodes\r\n");
                    }
                    let up = if body.is_empty() { "down" } else { "up" };
                    let keys: u64 = body.lines().filter_map(db_line).map(|(_, k, _, _)| k).sum();
                    text.push_str(&format!(
                        "node{i}:addr={},status={up},keys={keys}\r\n",
                        addrs[i]
                    ));
                }
            }
            if proto == Proto::Resp3 {
                Value::Verbatim(Bytes::from(format!("txt:{text}"))).encode(proto, out);
            } else {
                encode_bulk(text.as_bytes(), out);
            }
            Ok(())
        }
    };
    if let Err(e) = result {
        out.extend_from_slice(&e);
    }
}

/// A keyspace line, `db<N>:keys=<k>,expires=<e>,avg_ttl=<t>`: (N, k, e, t).
fn db_line(line: &str) -> Option<(u32, u64, u64, u64)> {
    let (db, rest) = line.trim_end().split_once(':')?;
    let db = db.strip_prefix("db")?.parse().ok()?;
    let mut f = [0u64; 3];
    for (i, name) in ["keys=", "expires=", "avg_ttl="].iter().enumerate() {
        f[i] = rest
            .split(',')
            .find_map(|kv| kv.strip_prefix(name))?
            .parse()
            .ok()?;
    }
    Some((db, f[0], f[1], f[2]))
}

/// Every node's keyspace lines summed per database: keys and expires added, `avg_ttl`
/// the mean of the nodes' estimates weighted by their keys with an expiry (a node that has
/// no estimate yet says 0, and is left out of the mean).
fn merged_keyspace(bodies: &[String]) -> String {
    let mut dbs: std::collections::BTreeMap<u32, (u64, u64, u128, u128)> = Default::default();
    for (db, keys, expires, ttl) in bodies.iter().flat_map(|b| b.lines().filter_map(db_line)) {
        let e = dbs.entry(db).or_default();
        e.0 += keys;
        e.1 += expires;
        if ttl > 0 {
            e.2 += ttl as u128 * expires as u128;
            e.3 += expires as u128;
        }
    }
    dbs.iter()
        .map(|(db, (keys, expires, weighted, estimated))| {
            let ttl = weighted.checked_div(*estimated).unwrap_or(0);
            format!("db{db}:keys={keys},expires={expires},avg_ttl={ttl}\r\n")
        })
        .collect()
}
