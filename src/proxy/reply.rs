//! The reply phase: resolve each round's slots strictly in request order, merge fanned-out
//! replies, and write them to the client, several rounds per write when they are ready.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::ctx::Ctx;
use super::round::{CachedGet, Merge, MgetFrom, MgetPerKey, Part, Round, Slot};
use crate::backend::{BackendError, Replies};
use crate::resp::{
    encode_array_header, encode_bulk, encode_error, encode_int, parse_value, Proto, Value,
};

/// How long a client owing more than `limits.max_output_bytes` may take no byte at all
/// before it is closed. A client that reads, however slowly, is never cut off for what
/// the proxy produced faster than any client could read (Redis's limit counts what the
/// client has not read; the proxy has the node's whole pipelined reply at once).
const OUTPUT_STALL: Duration = Duration::from_secs(1);

/// The client's write half and the replies resolved for it but not yet written.
struct Out<W> {
    w: W,
    buf: BytesMut,
    /// How much of `buf` the client has taken; `buf` is cleared (keeping its capacity)
    /// once all of it is written.
    sent: usize,
    unflushed: bool,
    /// `limits.max_output_bytes` (usize::MAX for none).
    limit: usize,
}

/// The writer ends the connection: the client left more than the limit unread and took
/// nothing, or its socket failed (`Cut`); or a blocking command of a client that closed
/// its side was dropped (`Abandoned`): Redis closes such a client without a reply, so the
/// replies before it are written and the connection is closed without one.
enum Cut {
    Cut,
    Abandoned,
}
use Cut::Abandoned;

impl<W: AsyncWrite + Unpin> Out<W> {
    fn unread(&self) -> usize {
        self.buf.len() - self.sent
    }

    fn compact(&mut self) {
        if self.sent == self.buf.len() {
            self.sent = 0;
            self.buf.clear();
            // A burst of large replies is not kept for the rest of the connection.
            if self.buf.capacity() > 1024 * 1024 {
                self.buf = BytesMut::with_capacity(16 * 1024);
            }
        } else if self.sent >= 64 * 1024 {
            // A client that reads, but never all of it: drop what it took.
            bytes::Buf::advance(&mut self.buf, self.sent);
            self.sent = 0;
        }
    }

    /// One write; Err when the client is gone.
    async fn write_some(&mut self) -> Result<(), Cut> {
        match self.w.write(&self.buf[self.sent..]).await {
            Ok(0) | Err(_) => Err(Cut::Cut),
            Ok(n) => {
                self.sent += n;
                self.unflushed = true;
                Ok(())
            }
        }
    }

    /// Past the limit, the writer takes no more replies and writes until the client owes
    /// less than the limit again; a client that takes nothing for `OUTPUT_STALL` is cut.
    async fn relieve(&mut self, ctx: &Ctx, client: u64) -> Result<(), Cut> {
        while self.unread() > self.limit {
            match tokio::time::timeout(OUTPUT_STALL, self.write_some()).await {
                Ok(r) => r?,
                Err(_) => {
                    ctx.metrics.output_limit_closed.inc();
                    tracing::warn!(
                        client,
                        unread_bytes = self.unread(),
                        limit_bytes = self.limit,
                        stalled_ms = OUTPUT_STALL.as_millis() as u64,
                        "closing a client that leaves its replies unread (limits.max_output_bytes)"
                    );
                    return Err(Cut::Cut);
                }
            }
            self.compact();
        }
        Ok(())
    }

    async fn finish(&mut self) {
        let _ = self.w.write_all(&self.buf[self.sent..]).await;
        let _ = self.w.flush().await;
    }
}

/// Writes replies until the session ends. Returns the tunnel end if the session turned
/// into a pub/sub tunnel, so the caller can pump it.
///
/// Rounds are resolved as they come, also while the client is not reading, so unread
/// replies gather in `out`. Past `limits.max_output_bytes` unread, the writer stops taking
/// rounds (the session then stops reading the client) and only writes; a client that
/// takes nothing for `OUTPUT_STALL` while over the limit is closed. When the writer
/// returns, the session sees its channel closed and ends the connection at once.
pub async fn write_loop<W: AsyncWrite + Unpin>(
    w: W,
    mut rounds: mpsc::Receiver<(Round, Proto)>,
    ctx: Arc<Ctx>,
    client: u64,
) -> (W, Option<super::tunnel::TunnelEnd>) {
    let limit = if ctx.max_output == 0 {
        usize::MAX
    } else {
        ctx.max_output
    };
    let mut out = Out {
        w,
        buf: BytesMut::new(),
        sent: 0,
        unflushed: false,
        limit,
    };
    loop {
        out.compact();
        let next = if out.buf.is_empty() && out.unflushed {
            // TLS keeps written records until flushed (for TCP the flush does nothing).
            tokio::select! {
                biased;
                f = out.w.flush() => {
                    if f.is_err() {
                        return (out.w, None);
                    }
                    out.unflushed = false;
                    continue;
                }
                r = rounds.recv() => r,
            }
        } else if out.buf.is_empty() {
            rounds.recv().await
        } else {
            tokio::select! {
                biased;
                r = out.write_some() => {
                    if r.is_err() {
                        return (out.w, None);
                    }
                    continue;
                }
                r = rounds.recv() => r,
            }
        };
        let Some((round, proto)) = next else { break };
        let mut next = Some((round, proto));
        // Resolve every round that is already queued, then write once.
        while let Some((mut round, proto)) = next.take() {
            let close = round.close_after;
            let acked = std::mem::take(&mut round.acked);
            let again = std::mem::take(&mut round.invalidate_after);
            let tunnel = match resolve(round, proto, &ctx, &mut out, client).await {
                Ok(t) => t,
                Err(Cut::Cut) => return (out.w, None),
                Err(Abandoned) => {
                    out.finish().await;
                    return (out.w, None);
                }
            };
            if let Some(layer) = ctx.cache.as_ref() {
                for k in again {
                    layer
                        .cache
                        .invalidate(&k, crate::mitigate::cache::Cause::Write);
                }
            }
            for a in acked {
                let _ = a.send(());
            }
            if close || tunnel.is_some() {
                out.finish().await;
                return (out.w, tunnel);
            }
            if out.unread() < 256 * 1024 {
                next = rounds.try_recv().ok();
            }
        }
        if out.relieve(&ctx, client).await.is_err() {
            return (out.w, None);
        }
    }
    out.finish().await;
    (out.w, None)
}

/// Appends the replies of one round to `out`, in order.
async fn resolve<W: AsyncWrite + Unpin>(
    round: Round,
    proto: Proto,
    ctx: &Ctx,
    sink: &mut Out<W>,
    client: u64,
) -> Result<Option<super::tunnel::TunnelEnd>, Cut> {
    // Every wait of the round runs against the same deadline, so a pipeline of many rounds
    // to a frozen node gets all its errors within request_timeout_ms, not one after another.
    let deadline = round.deadline;
    let mut replies: Vec<Result<Replies, BackendError>> = Vec::with_capacity(round.sent.len());
    for call in round.sent {
        replies.push(call.wait(deadline).await);
    }
    // A task's reply (combine, fill, salted) is bounded by its own call to the node; this
    // grace only catches a task that never answers, with the node's error given priority.
    let late = deadline.map(|d| d + LATE_GRACE);
    let n = round.slots.len() as u64;
    // Fast path: one job whose replies are exactly the round's, in order.
    if replies.len() == 1
        && replies[0]
            .as_ref()
            .map(|r| r.len() as u64 == n)
            .unwrap_or(false)
    {
        let all_direct = round
            .slots
            .iter()
            .enumerate()
            .all(|(i, s)| matches!(s, Slot::Reply(p) if p.idx as usize == i));
        if all_direct {
            if let Ok(r) = &replies[0] {
                sink.buf.extend_from_slice(&r.buf);
            }
            record(ctx, &round.started, &round.counts, n);
            sink.relieve(ctx, client).await?;
            return Ok(round.tunnel);
        }
    }
    // The reply of the slot before, when the next slot repeats it (`Slot::Again`).
    let mut again = Vec::new();
    let mut slots = round.slots.into_iter().peekable();
    while let Some(slot) = slots.next() {
        let start = sink.buf.len();
        let (slot, hook) = match slot {
            Slot::Seen(inner, hook) => (*inner, Some(hook)),
            slot => (slot, None),
        };
        if let Slot::Again = slot {
            sink.buf.extend_from_slice(&again);
        } else {
            write_slot(slot, &replies, proto, late, &mut sink.buf).await?;
            if matches!(slots.peek(), Some(Slot::Again)) {
                again.clear();
                again.extend_from_slice(&sink.buf[start..]);
            }
        }
        if let Some(hook) = hook {
            hook(&sink.buf[start..]);
        }
        // A round of many large replies is written as it is resolved, not gathered whole.
        sink.relieve(ctx, client).await?;
    }
    record(ctx, &round.started, &round.counts, n);
    Ok(round.tunnel)
}

/// Writes one slot's reply.
async fn write_slot(
    slot: Slot,
    replies: &[Result<Replies, BackendError>],
    proto: Proto,
    late: Option<tokio::time::Instant>,
    out: &mut BytesMut,
) -> Result<(), Cut> {
    match slot {
        Slot::Ready(b) => out.extend_from_slice(&b),
        Slot::Reply(p) => match part(replies, p) {
            Ok(b) => out.extend_from_slice(&b),
            Err(e) => backend_error(e, out),
        },
        Slot::Merge(m) => merge(*m, replies, proto, out),
        Slot::Later(rx) => match later(rx, late).await {
            Ok(b) => out.extend_from_slice(&b),
            Err(e) => encode_error(e, out),
        },
        Slot::Blocking(rx) => match rx.await {
            Ok(b) => out.extend_from_slice(&b),
            Err(_) => return Err(Abandoned),
        },
        Slot::LaterThen(rx, then) => match later(rx, late).await {
            Ok(b) => out.extend_from_slice(&then(b)),
            Err(e) => encode_error(e, out),
        },
        Slot::MgetPerKey(m) => mget_per_key(*m, replies, proto, late, out).await,
        Slot::Deferred(answer) => out.extend_from_slice(&answer()),
        // `resolve` copies the reply before it; nothing else holds a repeat.
        Slot::Again => {}
        Slot::Seen(inner, _) => {
            return Box::pin(write_slot(*inner, replies, proto, late, out)).await
        }
    }
    Ok(())
}

fn record(ctx: &Ctx, started: &std::time::Instant, counts: &[u64; 3], n: u64) {
    ctx.metrics
        .request_seconds
        .observe(started.elapsed().as_secs_f64(), n);
    for (i, c) in counts.iter().enumerate() {
        if *c > 0 {
            ctx.metrics.requests[i].inc_by(*c);
        }
    }
}

/// How long past the round's deadline a task's reply may come: its own node call times out
/// at about the deadline and says which node; this only bounds a task that never answers.
const LATE_GRACE: Duration = Duration::from_millis(250);

/// A task's reply, or the error text for a task that gave up or ran past `deadline`.
async fn later(
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

fn part(replies: &[Result<Replies, BackendError>], p: Part) -> Result<Bytes, &BackendError> {
    match &replies[p.job as usize] {
        Ok(r) if (p.idx as usize) < r.len() => Ok(r.get(p.idx as usize)),
        Ok(_) => Ok(Bytes::from_static(
            b"-ERR saltshaker: internal error (missing reply)\r\n",
        )),
        Err(e) => Err(e),
    }
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
async fn mget_per_key(
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

fn merge(m: Merge, replies: &[Result<Replies, BackendError>], proto: Proto, out: &mut BytesMut) {
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
        Merge::Exec(p) => match part(replies, p) {
            Ok(b) => {
                out.extend_from_slice(&b);
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
        Merge::Scan {
            part: p,
            node,
            nodes,
        } => values(replies, &[p]).map(|vs| match vs.into_iter().next() {
            Some(Value::Array(mut a)) if a.len() == 2 => {
                let cursor = match &a[0] {
                    Value::Bulk(b) => std::str::from_utf8(b)
                        .ok()
                        .and_then(|s| s.parse::<u64>().ok())
                        .unwrap_or(0),
                    _ => 0,
                };
                let next = super::scan::encode_cursor(cursor, node, nodes);
                a[0] = Value::Bulk(Bytes::from(next.to_string()));
                Value::Array(a).encode(proto, out);
            }
            _ => encode_error("ERR saltshaker: unexpected SCAN reply", out),
        }),
        Merge::Info {
            proxy,
            parts,
            addrs,
        } => {
            let mut text = proxy;
            for (i, p) in parts.iter().enumerate() {
                let body = match part(replies, *p)
                    .ok()
                    .and_then(|raw| parse_value(&raw).ok().flatten())
                {
                    Some((Value::Bulk(b), _)) | Some((Value::Verbatim(b), _)) => {
                        String::from_utf8_lossy(if b.starts_with(b"txt:") {
                            &b[4..]
                        } else {
                            &b[..]
                        })
                        .into_owned()
                    }
                    _ => String::new(),
                };
                if i == 0 {
                    text.push_str(&body);
                }
                if addrs.len() > 1 {
                    if i == 0 {
                        text.push_str("\r\n# Nodes\r\n");
                    }
                    let up = if body.is_empty() { "down" } else { "up" };
                    let keys: u64 = body
                        .lines()
                        .filter(|l| l.starts_with("db"))
                        .filter_map(|l| {
                            l.split(&[':', ','][..])
                                .nth(1)?
                                .strip_prefix("keys=")?
                                .parse::<u64>()
                                .ok()
                        })
                        .sum();
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
