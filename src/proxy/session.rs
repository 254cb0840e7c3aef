//! One client connection: read -> parse -> admit -> classify -> decide -> observe -> act, then the
//! reply writer (`reply`) answers in request order.
//!
//! The reader task owns the connection's state (protocol, database, auth, transaction,
//! WATCH) and walks each read's commands in order, so a state change (HELLO 3, SELECT)
//! applies to the very next command of the same pipeline. Every command becomes a slot in
//! the round; commands for the same node share one job.

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::AsyncReadExt;

use crate::net::{ReadHalf, Stream};
use tokio::sync::{mpsc, watch};

use super::ctx::Ctx;
use super::end::{close, End};
use super::handle::{act, handle, proceed, resume};
use super::mitigation::wait_barrier;
use super::round::{Queued, Round, RoundBuilder, Slot};
use super::state::{err_bytes, Decided, Flow, Pending, Session};
use super::{reply, settle, tunnel};
use crate::command::{self};
use crate::resp::{Request, RequestParser};

/// The round with its jobs queued (`RoundBuilder::send_now`). The wait for a full queue is
/// boxed, so the read's future holds a pointer where it held the send's 2.4 kB.
macro_rules! sent {
    ($rb:expr, $s:expr) => {
        match $rb.send_now($s.ctx().backend.request_timeout, &$s.inflight) {
            Ok(round) => round,
            Err(full) => Box::pin(full.finish()).await,
        }
    };
}

/// Serves one client connection until it closes.
pub async fn run(stream: Stream, ctx: Arc<Ctx>, id: u64) {
    let _ = stream.set_nodelay(true);
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let local = stream
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let registered = ctx.clients.open(id, &peer, &local, stream.fd());
    let killed = registered.killed.clone();
    let (r, w) = stream.into_split();
    // Rounds on their way to the writer: few enough that a client that stops reading
    // holds little beyond the output limit (each round holds its replies).
    let (tx, rx) = mpsc::channel::<Queued>(16);
    let (owing_tx, owing) = watch::channel(false);
    let me = registered.client.clone();
    let writer = tokio::spawn(reply::write_loop(w, rx, ctx.clone(), me.clone(), owing_tx));
    let (gone_tx, gone_rx) = watch::channel(false);
    let mut s = Session::new(ctx, me, peer, local, gone_rx);
    // Boxed: an async fn's future passed by value is laid out twice in its caller's.
    let end = Box::pin(read_loop(r, &tx, owing, killed, &mut s)).await;
    let _ = gone_tx.send(true);
    drop(tx);
    // Once per connection, and boxed so that its futures do not sit in every
    // connection's task beside the read loop's.
    let me = registered.client.clone();
    Box::pin(close(end, writer, registered.killed.clone(), me)).await;
    drop(registered);
}

/// The read phase: until the client closes, the session becomes a pub/sub tunnel, or a
/// shutdown finds the connection at a command boundary.
async fn read_loop(
    mut r: ReadHalf,
    tx: &mpsc::Sender<Queued>,
    mut owing: watch::Receiver<bool>,
    mut killed: watch::Receiver<bool>,
    s: &mut Session,
) -> End {
    let limits = s.ctx().limits.clone();
    let mut parser = RequestParser::new(limits);
    // Allocated when data arrives, and given back whenever everything read was handled:
    // an idle connection holds no buffer (`read_some`).
    let mut buf = BytesMut::new();
    let mut reqs: Vec<Request> = Vec::new();
    let mut shutdown = s.ctx().shutdown.clone();
    let mut draining = false;
    // Whole commands left in `buf` by the in-flight bound, and whether the client closed
    // after sending them: they are handled before anything more is read.
    let mut held_back = false;
    let mut ended = false;
    // This connection in the registry: its inbox of invalidations (client-side caching).
    let me = s.me.clone();
    loop {
        // Invalidations for a tracking client, after every round sent before them.
        let resp3 = s.proto() == crate::resp::Proto::Resp3;
        if let Some(push) = resp3.then(|| s.me.inbox.take(true)).flatten() {
            if tx
                .send(Box::new((Round::push(push), s.proto())))
                .await
                .is_err()
            {
                return End::Closed;
            }
        }
        if !Box::pin(settle::may_read(s, tx, &mut owing, &mut killed)).await {
            return End::Closed;
        }
        let proto = s.proto();
        let n: std::io::Result<usize> = if held_back {
            Ok(buf.len())
        } else if draining {
            if buf.capacity() - buf.len() < 4096 {
                buf.reserve(16 * 1024);
            }
            // Drain at a command boundary: take what has already arrived; once nothing is
            // buffered and nothing is waiting, the connection is idle and can close.
            match r.try_read_buf(&mut buf) {
                Ok(n) => Ok(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if buf.is_empty() {
                        return End::Drained(r);
                    }
                    // A command is half read: give it a moment to complete.
                    match tokio::time::timeout(
                        std::time::Duration::from_millis(500),
                        r.read_buf(&mut buf),
                    )
                    .await
                    {
                        Ok(n) => n,
                        Err(_) => return End::Drained(r),
                    }
                }
                Err(e) => Err(e),
            }
        } else {
            tokio::select! {
                biased;
                n = r.read_some(&mut buf) => n,
                // The writer gave the client up (it left its replies unread, or its socket
                // failed): end the connection now, not when the client next sends.
                _ = tx.closed() => return End::Closed,
                // CLIENT KILL chose this connection.
                _ = killed.wait_for(|k| *k) => return End::Closed,
                _ = super::client_cache::invalidated(&me, proto) => continue,
                _ = shutdown.wait_for(|v| *v) => {
                    tracing::debug!(client = s.id(), "draining on shutdown");
                    draining = true;
                    continue;
                }
            }
        };
        ended |= matches!(n, Ok(0) | Err(_));
        // Everything after the read, boxed: allocated while a read is handled, so an idle
        // connection holds only the small future of the wait above (bench/conn_memory.py).
        let step = Box::pin(burst(
            s,
            &mut parser,
            &mut buf,
            &mut reqs,
            tx,
            &mut killed,
            &mut held_back,
            ended,
        ))
        .await;
        match step {
            Step::Read => {}
            Step::Closed => return End::Closed,
            Step::Monitor(lines) => return End::Monitor(r, lines),
            Step::Tunnel(start) => return End::Tunnel(r, start),
        }
    }
}

/// What the read loop does after a burst.
enum Step {
    Read,
    Closed,
    Monitor(tokio::sync::mpsc::Receiver<bytes::Bytes>),
    Tunnel(tunnel::Start),
}

/// One read's commands: parse, then for each check -> decide -> observe -> act, and the
/// round sent to the reply writer.
#[allow(clippy::too_many_arguments)]
async fn burst(
    s: &mut Session,
    parser: &mut RequestParser,
    buf: &mut BytesMut,
    reqs: &mut Vec<Request>,
    tx: &mpsc::Sender<Queued>,
    killed: &mut watch::Receiver<bool>,
    held_back: &mut bool,
    ended: bool,
) -> Step {
    if buf.len() > s.ctx().max_pending {
        let mut rb = RoundBuilder::new();
        rb.slots.push(Slot::Ready(err_bytes(
            "ERR Protocol error: client query buffer limit exceeded",
        )));
        let mut round = sent!(rb, s);
        round.close_after = true;
        s.ctx().metrics.protocol_errors.inc();
        let _ = tx.send(Box::new((round, s.proto()))).await;
        return Step::Closed;
    }
    s.begin_round();
    let monitored = s.ctx().monitors.active();
    let room = match s.ctx().max_output {
        0 => usize::MAX,
        limit => s.inflight.room(limit),
    };
    let parsed = parser.parse_at_most(buf, reqs, room);
    *held_back = reqs.len() >= room && !buf.is_empty();
    let mut rb = RoundBuilder::with_capacity(reqs.len().max(1));
    let mut close = false;
    let mut reqs_iter = reqs.drain(..);
    let mut last = None;
    while let Some(req) = reqs_iter.next() {
        // command: the request resolved once, for every phase after it.
        let c = match command::classify(&req) {
            Ok(c) => {
                last = Some(c.spec);
                c
            }
            Err(e) => {
                let slot = s.refuse(err_bytes(&e.to_string()));
                rb.slots.push(slot);
                continue;
            }
        };
        // admit
        let (req, c, hook) = if s.admits() {
            match super::admit::gate(s, req, c) {
                super::admit::Gate::Done(slot, class) => {
                    rb.count(class);
                    rb.slots.push(slot);
                    continue;
                }
                super::admit::Gate::Pass { req, c, hook, wait } => {
                    if !wait.is_zero() {
                        // What was read before it need not wait with it.
                        if !rb.is_empty() && !Box::pin(settle::flush(s, &mut rb, tx)).await {
                            return Step::Closed;
                        }
                        // The wait counts against the command's request_timeout_ms
                        // (its round was read before it), so it is never longer.
                        let timeout = s.ctx().backend.request_timeout.unwrap_or(wait);
                        tokio::time::sleep(wait.min(timeout)).await;
                    }
                    (req, c, hook)
                }
            }
        } else {
            (req, c, None)
        };
        // Redis shows neither CMD_SKIP_MONITOR nor CMD_ADMIN commands to monitors.
        if s.ctx().pause.holds(settle::writes(&c)).is_some()
            && !Box::pin(settle::paused(s, &c, &mut rb, tx, killed)).await
        {
            return Step::Closed;
        }
        let monitor = (monitored
            && !c
                .spec
                .has(command::flags::SKIP_MONITOR | command::flags::ADMIN))
        .then(|| super::monitor::args(&req));
        let mut mark = rb.slots.len();
        let conn_state = (s.proto(), s.db());
        let mut next = handle(s, req, c, &mut rb);
        let flow = loop {
            next = match next {
                Flow::Settle(p) => {
                    if !Box::pin(settle::settle(s, &mut rb, tx, s.proto())).await {
                        return Step::Closed;
                    }
                    mark = 0;
                    let Pending { req, c } = *p;
                    proceed(s, req, c, true, &mut rb)
                }
                Flow::Flush(p) => {
                    if !Box::pin(settle::flush(s, &mut rb, tx)).await {
                        return Step::Closed;
                    }
                    mark = 0;
                    let Decided { req, c, action } = *p;
                    act(s, req, c, action, &mut rb)
                }
                // Boxed: the rare waits keep their futures out of this one.
                Flow::Wait(p) => Box::pin(resume(s, p, &mut rb)).await,
                done => break done,
            };
        };
        rb.commit_keys();
        if let Some(args) = monitor {
            s.ctx().monitors.feed(s.db(), s.peer(), &args);
        }
        if let (Some(hook), Flow::Continue) = (hook, &flow) {
            if rb.slots.len() == mark + 1 {
                let slot = rb.slots.pop().expect("one slot pushed");
                rb.slots.push(Slot::Seen(Box::new(slot), hook));
            }
        }
        let settle_after = s.take_settle();
        if ((s.proto(), s.db()) != conn_state || settle_after)
            && matches!(flow, Flow::Continue)
            && !Box::pin(settle::settle(s, &mut rb, tx, conn_state.0)).await
        {
            return Step::Closed;
        }
        match flow {
            // A fresh round has no jobs, and the lane is switched, so this cannot
            // happen; answer rather than panic.
            Flow::Flush(_) | Flow::Settle(_) | Flow::Wait(_) => rb.slots.push(Slot::Ready(err_bytes(
                "ERR saltshaker: internal: command could not be ordered",
            ))),
            Flow::Continue => {}
            Flow::Close => {
                close = true;
                break;
            }
            Flow::Monitor => {
                // Whatever the client sent after MONITOR is not run, as on Redis.
                let lines = s.ctx().monitors.subscribe();
                s.order.wait_barrier().await;
                let round = sent!(rb, s);
                let _ = tx.send(Box::new((round, s.proto()))).await;
                return Step::Monitor(lines);
            }
            Flow::Tunnel(mut start) => {
                // CLIENT LIST shows cmd=subscribe, as tools look for it there.
                if let Some(spec) = last {
                    s.me.touched(rb.started, buf.capacity(), spec);
                }
                s.me.publish(super::clients::Shown {
                    pubsub: true,
                    ..s.me.shown()
                });
                // Everything the client sent after SUBSCRIBE goes straight to the node.
                for rest in reqs_iter.by_ref() {
                    start.pending.push(rest.wire());
                }
                start.pending.push(buf.split().freeze());
                // The tunnel's commands take a connection of their own: nothing of
                // the session may still be on its way.
                s.order.wait_barrier().await;
                let mut round = sent!(rb, s);
                round.tunnel = start.take_end();
                let _ = tx.send(Box::new((round, s.proto()))).await;
                return Step::Tunnel(start);
            }
        }
    }
    drop(reqs_iter);
    // What CLIENT LIST shows of this connection.
    if let Some(spec) = last {
        s.me.touched(rb.started, buf.capacity(), spec);
    }
    s.publish();
    if let Err(e) = parsed {
        if !close {
            rb.slots.push(Slot::Ready(err_bytes(&format!("ERR {e}"))));
            s.ctx().metrics.protocol_errors.inc();
            tracing::debug!(client = s.id(), peer = %s.peer(), error = %e, "closing client after a protocol error");
        }
        close = true;
    }
    if !rb.is_empty() || close {
        wait_barrier(s, &rb).await;
        let want_ack = rb.wrote_cached;
        // Only a round with jobs has commands a later task or combined write could
        // overtake.
        let had_jobs = !rb.jobs.is_empty();
        let written = std::mem::take(&mut rb.written);
        let keys = std::mem::take(&mut rb.keys);
        let mut round = sent!(rb, s);
        s.order.sent(
            &mut round,
            had_jobs,
            want_ack,
            s.tracks_keys(),
            written,
            keys,
        );
        round.close_after = close;
        if tx.send(Box::new((round, s.proto()))).await.is_err() {
            return Step::Closed;
        }
    }
    if close || (ended && !*held_back) {
        return Step::Closed;
    }
    Step::Read
}
