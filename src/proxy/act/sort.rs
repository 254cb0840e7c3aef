//! SORT and SORT_RO over a pool when their BY or GET patterns, or STORE's destination,
//! name keys on other nodes than the sorted key's: the proxy does what Redis's
//! `sortCommandGeneric` does, with the lookups sent to the nodes that hold each key.
//!
//! The elements come from the key's node (`SORT key BY nosort`, so the node checks the
//! type); a BY pattern's weights are read with GET or HGET (`->field`) on their nodes and
//! the elements sorted as Redis sorts them (numbers, or ALPHA bytes; a missing weight is
//! 0, or sorts first; equal weights by the element); LIMIT; then GET patterns (`#` is the
//! element). STORE writes the result on the destination's node in one MULTI. The command
//! leaves once every earlier reply of the session is in, and the next waits for it, so it
//! is ordered with the session's other commands; it is not atomic across nodes (a write
//! by another client between the reads may be seen, as between two commands).

use std::cmp::Ordering;
use tokio::time::Instant;

use bytes::Bytes;
use smallvec::smallvec;

use crate::backend::ConnHandle;
use crate::command::Classified;
use crate::command::Cmd;
use crate::proxy::conn::round::{RoundBuilder, Slot};
use crate::proxy::conn::state::{err_bytes, Session};
use crate::resp::{parse_value, Request, Value};

/// SORT's options, as Redis reads them.
struct Sort {
    ro: bool,
    key: Bytes,
    by: Option<Bytes>,
    gets: Vec<Bytes>,
    desc: bool,
    alpha: bool,
    limit: Option<(i64, i64)>,
    store: Option<Bytes>,
}

fn parse(req: &Request, ro: bool) -> Result<Sort, &'static str> {
    let mut s = Sort {
        ro,
        key: req.arg_bytes(1),
        by: None,
        gets: Vec::new(),
        desc: false,
        alpha: false,
        limit: None,
        store: None,
    };
    let is = |i: usize, w: &[u8]| req.arg(i).eq_ignore_ascii_case(w);
    let mut j = 2;
    while j < req.argc() {
        let left = req.argc() - j - 1;
        if is(j, b"ASC") {
            s.desc = false;
        } else if is(j, b"DESC") {
            s.desc = true;
        } else if is(j, b"ALPHA") {
            s.alpha = true;
        } else if is(j, b"LIMIT") && left >= 2 {
            let n = |i: usize| crate::resp::parse_i64(req.arg(i));
            match (n(j + 1), n(j + 2)) {
                (Some(o), Some(c)) => s.limit = Some((o, c)),
                _ => return Err("ERR value is not an integer or out of range"),
            }
            j += 2;
        } else if is(j, b"STORE") && left >= 1 && !ro {
            s.store = Some(req.arg_bytes(j + 1));
            j += 1;
        } else if is(j, b"BY") && left >= 1 {
            s.by = Some(req.arg_bytes(j + 1));
            j += 1;
        } else if is(j, b"GET") && left >= 1 {
            s.gets.push(req.arg_bytes(j + 1));
            j += 1;
        } else {
            return Err("ERR syntax error");
        }
        j += 1;
    }
    Ok(s)
}

/// A key, and the hash field in it when the pattern has `->field`.
type Named = (Vec<u8>, Option<Vec<u8>>);

/// The key (and hash field) a pattern names for an element, as Redis's
/// `lookupKeyByPattern`: None for a pattern without `*`.
fn substitute(pattern: &[u8], elem: &[u8]) -> Option<Named> {
    let star = pattern.iter().position(|&b| b == b'*')?;
    let arrow = pattern[star + 1..]
        .windows(2)
        .position(|w| w == b"->")
        .map(|a| star + 1 + a)
        .filter(|&a| a + 2 < pattern.len());
    let end = arrow.unwrap_or(pattern.len());
    let mut key = pattern[..star].to_vec();
    key.extend_from_slice(elem);
    key.extend_from_slice(&pattern[star + 1..end]);
    Some((key, arrow.map(|a| pattern[a + 2..].to_vec())))
}

/// Sends SORT across the nodes (see the module doc); the reply comes from a task.
pub(in crate::proxy) fn across(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    rb: &mut RoundBuilder,
) {
    let sort = match parse(req, c.spec.cmd == Cmd::SortRo) {
        Ok(x) => x,
        Err(e) => return rb.slots.push(Slot::Ready(err_bytes(e))),
    };
    let conns: Vec<ConnHandle> = (0..s.ctx().backend.len()).map(|n| s.conn(n)).collect();
    let ctx = s.ctx().clone();
    let proto = s.proto();
    let deadline = ctx.backend.request_timeout.map(|t| Instant::now() + t);
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let node_for = |k: &[u8]| ctx.backend.node_for(k);
        let reply = match run(&sort, &conns, &node_for, deadline).await {
            Ok(v) => {
                let mut out = bytes::BytesMut::new();
                v.encode(proto, &mut out);
                out.freeze()
            }
            Err(e) => e,
        };
        let _ = tx.send(reply);
    });
    rb.slots.push(Slot::Later(rx));
    // What the session sends next waits for this reply (STORE's list, say).
    s.settle_next();
}

/// One command on `node`; its reply as a value (an error reply is Err, as the client
/// would get it).
async fn ask(
    conns: &[ConnHandle],
    node: usize,
    args: &[&[u8]],
    deadline: Option<Instant>,
) -> Result<Value, Bytes> {
    let wire = crate::backend::wire(args);
    let r = conns[node]
        .call(smallvec![wire], 1, deadline)
        .await
        .map_err(|e| err_bytes(&format!("ERR saltshaker: {e}")))?;
    let raw = r.get(0);
    match parse_value(&raw) {
        Ok(Some((Value::Error(_), _))) => Err(raw),
        Ok(Some((v, _))) => Ok(v),
        _ => Err(err_bytes("ERR saltshaker: unreadable reply")),
    }
}

/// The values the keys (and hash fields) name, one lookup per key on its node, in
/// order; None where missing or of another type.
async fn lookups(
    conns: &[ConnHandle],
    node_for: &impl Fn(&[u8]) -> usize,
    names: &[Option<Named>],
    deadline: Option<Instant>,
) -> Result<Vec<Option<Bytes>>, Bytes> {
    let mut out = Vec::with_capacity(names.len());
    for n in names {
        let v = match n {
            None => None,
            Some((key, field)) => {
                let node = node_for(key);
                let got = match field {
                    Some(f) => ask(conns, node, &[b"HGET", key, f], deadline).await,
                    None => ask(conns, node, &[b"GET", key], deadline).await,
                };
                match got {
                    Ok(Value::Bulk(b)) => Some(b),
                    Ok(_) => None,
                    // Another type reads as missing, as in Redis; a node's failure fails.
                    Err(e) if e.starts_with(b"-WRONGTYPE") => None,
                    Err(e) => return Err(e),
                }
            }
        };
        out.push(v);
    }
    Ok(out)
}

async fn run(
    sort: &Sort,
    conns: &[ConnHandle],
    node_for: &impl Fn(&[u8]) -> usize,
    deadline: Option<Instant>,
) -> Result<Value, Bytes> {
    let home = node_for(&sort.key);
    let name: &[u8] = if sort.ro { b"SORT_RO" } else { b"SORT" };
    let by_weights = sort.by.as_ref().filter(|p| p.contains(&b'*'));
    // Without a BY pattern the key's node sorts; with one, it only lists.
    let mut args: Vec<&[u8]> = vec![name, &sort.key];
    let (off, cnt);
    if by_weights.is_some() || sort.by.is_some() {
        args.extend([&b"BY"[..], b"nosort"]);
    } else {
        if let Some((o, c)) = sort.limit {
            off = o.to_string();
            cnt = c.to_string();
            args.extend([&b"LIMIT"[..], off.as_bytes(), cnt.as_bytes()]);
        }
        args.push(if sort.desc { b"DESC" } else { b"ASC" });
        if sort.alpha {
            args.push(b"ALPHA");
        }
    }
    let Value::Array(items) = ask(conns, home, &args, deadline).await? else {
        return Err(err_bytes("ERR saltshaker: unexpected SORT reply"));
    };
    let mut elems: Vec<Bytes> = items
        .into_iter()
        .filter_map(|v| match v {
            Value::Bulk(b) => Some(b),
            _ => None,
        })
        .collect();
    if let Some(p) = by_weights {
        let names: Vec<_> = elems.iter().map(|e| substitute(p, e)).collect();
        let weights = lookups(conns, node_for, &names, deadline).await?;
        let mut keyed: Vec<(Option<Bytes>, f64, Bytes)> = Vec::with_capacity(elems.len());
        for (w, e) in weights.into_iter().zip(elems) {
            let num = match (&w, sort.alpha) {
                (Some(b), false) => std::str::from_utf8(b)
                    .ok()
                    .and_then(|t| t.trim().parse::<f64>().ok())
                    .filter(|x| !x.is_nan())
                    .ok_or_else(|| {
                        err_bytes("ERR One or more scores can't be converted into double")
                    })?,
                _ => 0.0,
            };
            keyed.push((w, num, e));
        }
        keyed.sort_by(|a, b| {
            let c = if sort.alpha {
                a.0.cmp(&b.0)
            } else {
                a.1.partial_cmp(&b.1).unwrap_or(Ordering::Equal)
            };
            let c = c.then_with(|| a.2.cmp(&b.2));
            if sort.desc {
                c.reverse()
            } else {
                c
            }
        });
        elems = keyed.into_iter().map(|k| k.2).collect();
    }
    if sort.by.is_some() {
        if let Some((o, c)) = sort.limit {
            let start = (o.max(0) as usize).min(elems.len());
            let end = if c < 0 {
                elems.len()
            } else {
                (start + c as usize).min(elems.len())
            };
            elems = elems[start..end].to_vec();
        }
    }
    let values: Vec<Option<Bytes>> = if sort.gets.is_empty() {
        elems.into_iter().map(Some).collect()
    } else {
        let mut names = Vec::new();
        let mut own = Vec::new();
        for e in &elems {
            for g in &sort.gets {
                own.push(g.as_ref() == b"#");
                names.push(if g.as_ref() == b"#" {
                    None
                } else {
                    substitute(g, e)
                });
            }
        }
        let got = lookups(conns, node_for, &names, deadline).await?;
        let per = sort.gets.len();
        got.into_iter()
            .enumerate()
            .map(|(i, v)| {
                if own[i] {
                    Some(elems[i / per].clone())
                } else {
                    v
                }
            })
            .collect()
    };
    let Some(dst) = &sort.store else {
        return Ok(Value::Array(
            values
                .into_iter()
                .map(|v| v.map_or(Value::Nil, Value::Bulk))
                .collect(),
        ));
    };
    // STORE: the list replaced in one MULTI on its node (missing values stored as "").
    let n = values.len();
    let mut data = smallvec![
        crate::backend::wire(&[&b"MULTI"[..]]),
        crate::backend::wire(&[&b"DEL"[..], dst]),
    ];
    if n > 0 {
        let mut push: Vec<&[u8]> = vec![b"RPUSH", dst];
        push.extend(values.iter().map(|v| v.as_deref().unwrap_or(b"")));
        data.push(crate::backend::wire(&push));
    }
    data.push(crate::backend::wire(&[&b"EXEC"[..]]));
    let count = data.len() as u32;
    let r = conns[node_for(dst)]
        .call(data, count, deadline)
        .await
        .map_err(|e| err_bytes(&format!("ERR saltshaker: {e}")))?;
    let exec = r.get(r.len() - 1);
    if exec.starts_with(b"-") {
        return Err(exec);
    }
    Ok(Value::Integer(n as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_name_keys_and_fields_as_redis_does() {
        assert_eq!(substitute(b"w_*", b"a"), Some((b"w_a".to_vec(), None)));
        assert_eq!(
            substitute(b"h_*->f", b"a"),
            Some((b"h_a".to_vec(), Some(b"f".to_vec())))
        );
        // "->" with nothing after it is part of the key; one before the '*' too.
        assert_eq!(substitute(b"h_*->", b"a"), Some((b"h_a->".to_vec(), None)));
        assert_eq!(
            substitute(b"a->b_*", b"x"),
            Some((b"a->b_x".to_vec(), None))
        );
        assert_eq!(substitute(b"nostar", b"a"), None);
    }
}
