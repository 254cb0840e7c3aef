//! The reply phase: resolve each round's slots strictly in request order (fanned-out
//! replies are merged by `merge`), and write them to the client, several rounds per write
//! when they are ready.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

use super::ctx::Ctx;
use super::merge::{backend_error, later, merge, mget_per_key, part};
use super::round::{Queued, Round, Slot};
use crate::backend::{BackendError, Replies};
use crate::resp::{encode_error, Proto};

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
    /// True while the client owes more than the limit: the session reads no more of its
    /// commands (and so sends nothing more to the nodes) until it is false again.
    owing: watch::Sender<bool>,
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
        if self.unread() <= self.limit {
            return Ok(());
        }
        self.owing.send_replace(true);
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
        self.owing.send_replace(false);
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
    mut rounds: mpsc::Receiver<Queued>,
    ctx: Arc<Ctx>,
    me: Arc<crate::proxy::registry::clients::Client>,
    owing: watch::Sender<bool>,
) -> (W, Option<super::tunnel::TunnelEnd>) {
    let client = me.id;
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
        owing,
    };
    // The deadline timer of the common round's wait, kept from one round to the next
    // (`Call::wait_by`): set about once per request timeout, not once per request.
    let mut timer: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
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
        let Some(queued) = next else { break };
        let mut next = Some(queued);
        // Resolve every round that is already queued, then write once.
        while let Some(queued) = next.take() {
            let (mut round, proto) = *queued;
            let held = round.inflight.take();
            let before = out.unread();
            let close = round.close_after;
            let acked = std::mem::take(&mut round.acked);
            let again = std::mem::take(&mut round.invalidate_after);
            // The common round (one job, each slot its reply) waits here, unboxed; any
            // other is resolved in a boxed future, allocated per round, so an idle
            // connection's writer holds only the small futures of its waits
            // (bench/conn_memory.py).
            let resolved = match direct(&mut round) {
                Some(call) => {
                    let timer = round.deadline.map(|d| {
                        timer
                            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(d)))
                            .as_mut()
                    });
                    let replies = call.wait_by(round.deadline, timer).await;
                    match write_direct(&round, &replies, &ctx, &mut out.buf) {
                        true => out
                            .relieve(&ctx, client)
                            .await
                            .map(|()| round.tunnel.take()),
                        false => {
                            let replies = vec![replies];
                            Box::pin(write_round(round, replies, proto, &ctx, &mut out, client))
                                .await
                        }
                    }
                }
                None => Box::pin(resolve(round, proto, &ctx, &mut out, client)).await,
            };
            let tunnel = match resolved {
                Ok(t) => {
                    // What the client was written meanwhile is not known here; the growth
                    // of what it owes is a fair lower bound of the round's bytes.
                    if let Some(h) = held {
                        h.resolved(out.unread().saturating_sub(before));
                    }
                    t
                }
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
        me.set_output(out.unread());
    }
    out.finish().await;
    (out.w, None)
}

/// Appends the replies of one round to `out`, in order.
async fn resolve<W: AsyncWrite + Unpin>(
    mut round: Round,
    proto: Proto,
    ctx: &Ctx,
    sink: &mut Out<W>,
    client: u64,
) -> Result<Option<super::tunnel::TunnelEnd>, Cut> {
    // Every wait of the round runs against the same deadline, so a pipeline of many rounds
    // to a frozen node gets all its errors within request_timeout_ms, not one after another.
    let deadline = round.deadline;
    if round.push {
        for slot in round.slots {
            if let Slot::Ready(b) = slot {
                sink.buf.extend_from_slice(&b);
            }
        }
        sink.relieve(ctx, client).await?;
        return Ok(None);
    }
    let mut replies: Vec<Result<Replies, BackendError>> = Vec::with_capacity(round.sent.len());
    for call in std::mem::take(&mut round.sent) {
        replies.push(call.wait(deadline).await);
    }
    write_round(round, replies, proto, ctx, sink, client).await
}

/// The one call of a round whose slots are its replies in order, taken out of the round.
fn direct(round: &mut Round) -> Option<crate::backend::Call> {
    let one = !round.push
        && round.sent.len() == 1
        && round
            .slots
            .iter()
            .enumerate()
            .all(|(i, s)| matches!(s, Slot::Reply(p) if p.job == 0 && p.idx as usize == i));
    one.then(|| round.sent.pop()).flatten()
}

/// Writes a direct round's replies (see `direct`) when the node gave one per slot; false
/// when they are not that (an error, a short reply), for `write_round` to sort out.
fn write_direct(
    round: &Round,
    replies: &Result<Replies, BackendError>,
    ctx: &Ctx,
    out: &mut BytesMut,
) -> bool {
    let n = round.slots.len();
    let Ok(r) = replies else { return false };
    if r.len() != n {
        return false;
    }
    out.extend_from_slice(&r.buf);
    // The replies together under the gate, and no big write: nothing is costly.
    if r.buf.len() >= super::cost::GATE_BYTES || round.big_write {
        let mut floors = None;
        for c in &round.costs {
            count_cost(ctx, &mut floors, c, r.get_ref(c.slot as usize), true);
        }
    }
    record(ctx, &round.started, &round.counts, n as u64);
    true
}

/// Appends a round's replies, its calls' `replies` in hand, to `sink`, in order.
async fn write_round<W: AsyncWrite + Unpin>(
    round: Round,
    replies: Vec<Result<Replies, BackendError>>,
    proto: Proto,
    ctx: &Ctx,
    sink: &mut Out<W>,
    client: u64,
) -> Result<Option<super::tunnel::TunnelEnd>, Cut> {
    let deadline = round.deadline;
    // A task's reply (combine, fill, salted) is bounded by its own call to the node; this
    // grace only catches a task that never answers, with the node's error given priority.
    let late = deadline.map(|d| d + LATE_GRACE);
    let n = round.slots.len() as u64;
    // (A round of one job whose replies are exactly its slots never comes here when the
    // node answered as asked: the writer's `direct` path took it.)
    // The reply of the slot before, when the next slot repeats it (`Slot::Again`).
    let mut again = Vec::new();
    let mut costs = round.costs.iter().peekable();
    let mut floors = None;
    let mut slots = round.slots.into_iter().enumerate().peekable();
    while let Some((i, slot)) = slots.next() {
        let start = sink.buf.len();
        let (slot, quiet) = match slot {
            Slot::Quiet(inner) => (*inner, true),
            slot => (slot, false),
        };
        let (slot, hook) = match slot {
            Slot::Seen(inner, hook) => (*inner, Some(hook)),
            slot => (slot, None),
        };
        let from_node = matches!(slot, Slot::Reply(_));
        if let Slot::Again = slot {
            sink.buf.extend_from_slice(&again);
        } else {
            write_slot(slot, &replies, proto, late, &mut sink.buf).await?;
            if matches!(slots.peek(), Some((_, Slot::Again))) {
                again.clear();
                again.extend_from_slice(&sink.buf[start..]);
            }
        }
        if let Some(hook) = hook {
            hook(&sink.buf[start..]);
        }
        if let Some(c) = costs.next_if(|c| c.slot as usize == i) {
            count_cost(ctx, &mut floors, c, &sink.buf[start..], from_node);
        }
        if quiet {
            sink.buf.truncate(start);
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
        Slot::Blocking(rx, _blocked) => match rx.await {
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
        Slot::Quiet(inner) => {
            let at = out.len();
            Box::pin(write_slot(*inner, replies, proto, late, out)).await?;
            out.truncate(at);
        }
    }
    Ok(())
}

/// Counts a written reply's cost against its key (`cost::observe`; the rules' floors are
/// read once per round, at the first reply that needs them); a costly read the node
/// answered (not the cache) also adds its estimated time to the node's load, as node
/// balance sees it.
fn count_cost(
    ctx: &Ctx,
    floors: &mut Option<crate::rules::CostFloors>,
    c: &super::cost::Cost,
    reply: &[u8],
    from_node: bool,
) {
    if reply.len() + (c.request as usize) < super::cost::GATE_BYTES {
        return;
    }
    let floors = *floors.get_or_insert_with(|| ctx.rules.load().cost_floors());
    let b = &ctx.backend;
    let node_load = |key: &[u8], us: u64| {
        if from_node {
            b.node(b.node_for(key))
                .metrics
                .read_cost
                .inc_by(us as f64 / 1e6);
        }
    };
    match &c.mget {
        Some(req) => super::cost::observe_mget(&ctx.detector, floors, req, reply, node_load),
        None => {
            let us = super::cost::observe(&ctx.detector, floors, c, reply);
            if us > 0 && !c.write {
                node_load(&c.key, us);
            }
        }
    }
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
