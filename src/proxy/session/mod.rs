//! The pipeline of one client connection: the read loop (this file) and the steps each
//! command of a read goes through. Read, parse, then per command: classify, check the
//! ACL, admit, order, decide, observe, act; the reply writer (`conn::reply`) answers in
//! request order. The one drawing of that route is in docs/architecture.md, "The
//! request's route".
//!
//! May touch every other room: `answer`, `act`, `conn`, `registry`. Nothing stands on
//! this room but `proxy/mod.rs`, which runs a session per accepted connection.
//!
//! - this file: the read loop: read, parse, a round per read; each read's handling a
//!   small boxed future, so an idle connection holds little;
//! - `step`: one command of a read: classify, check the ACL, admit, the whole path when
//!   nothing waits, the waits boxed;
//! - `admit`: the admit phase (per-key limits);
//! - `handle`: one command: order, decide once, observe, act; synchronous, a wait comes
//!   back as `Flow::Wait`;
//! - `plan`: the decide and observe phases of one command;
//! - `settle`: a round sent ahead of a command; the wait at a change of database,
//!   protocol or lane;
//! - `end`: how a connection's read phase hands over or closes.
//!
//! The reader task owns the connection's state (protocol, database, auth, transaction,
//! WATCH) and walks each read's commands in order, so a state change (HELLO 3, SELECT)
//! applies to the very next command of the same pipeline. Every command becomes a slot in
//! the round; commands for the same node share one job.

mod admit;
mod end;
mod handle;
mod plan;
mod settle;
mod step;

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::AsyncReadExt;

use crate::net::{ReadHalf, Stream};
use tokio::sync::{mpsc, watch};

use crate::proxy::conn::ctx::Ctx;
use end::{close, End};

use crate::command::{self};
use crate::proxy::act::mitigation::wait_barrier;
use crate::proxy::conn::reply;
use crate::proxy::conn::round::{Queued, Round, RoundBuilder, Slot};
use crate::proxy::conn::state::{err_bytes, Flow, Session};
use crate::proxy::conn::tunnel;
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
    // The waits beside the read, made once and kept: made and dropped per read, each
    // registered with and removed from its notifier's list, under its lock, on every
    // request at pipeline 1 (bench/README.md, "Instructions per request").
    // The writer gave the client up (it left its replies unread, or its socket failed):
    // end the connection now, not when the client next sends.
    let gone = tx.closed();
    // CLIENT KILL chose this connection.
    let mut kill = killed.clone();
    let kill = kill.wait_for(|k| *k);
    let stop = shutdown.wait_for(|v| *v);
    let inbox = me.inbox.notify.notified();
    tokio::pin!(gone, kill, stop, inbox);
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
        // Boxed, and only when it may wait: the common read allocates nothing here.
        let limit = s.ctx().max_output;
        if (*owing.borrow() || (limit > 0 && s.inflight.over(limit)))
            && !Box::pin(settle::may_read(s, tx, &mut owing, &mut killed)).await
        {
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
                _ = &mut gone => return End::Closed,
                _ = &mut kill => return End::Closed,
                // Invalidations to push: only a RESP3 session takes them (a RESP2 one
                // subscribed to `__redis__:invalidate` is a tunnel to a node, which the
                // proxy does not write into).
                _ = &mut inbox, if proto == crate::resp::Proto::Resp3 => {
                    inbox.set(me.inbox.notify.notified());
                    continue;
                }
                _ = &mut stop => {
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

/// One read's commands: parse, then for each check -> decide -> observe -> act (`step`),
/// and the round sent to the reply writer. Every wait on the way is boxed, so this future
/// (allocated per read) stays small.
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
        return Box::pin(too_long(s, tx)).await;
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
        // CLIENT REPLY OFF or SKIP: this command's replies are awaited but not written.
        // As on Redis, that is decided once the command ran (CLIENT REPLY ON is answered).
        let first = rb.slots.len();
        let Some((b, hook, shown)) = step::begin(s, req, &mut rb, &mut last, monitored) else {
            if s.reply_quiet() {
                hush(&mut rb, first);
            }
            s.reply_ran();
            continue;
        };
        let mut mark = rb.slots.len();
        let conn_state = (s.proto(), s.db());
        let flow = match step::now(s, b, &mut rb) {
            Ok(flow) => flow,
            Err(from) => {
                match Box::pin(step::slow(s, from, &mut rb, tx, killed, &mut mark)).await {
                    Some(flow) => flow,
                    None => return Step::Closed,
                }
            }
        };
        rb.commit_keys();
        if let Some(args) = shown {
            s.ctx().monitors.feed(s.db(), s.peer(), &args);
        }
        if let (Some(hook), Flow::Continue) = (hook, &flow) {
            if rb.slots.len() == mark + 1 {
                let slot = rb.slots.pop().expect("one slot pushed");
                rb.slots.push(Slot::Seen(Box::new(slot), hook));
            }
        }
        if s.reply_quiet() {
            hush(&mut rb, mark);
        }
        s.reply_ran();
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
            Flow::Flush(_) | Flow::Settle(_) | Flow::Wait(_) => rb.slots.push(Slot::Ready(
                err_bytes("ERR saltshaker: internal: command could not be ordered"),
            )),
            Flow::Continue => {}
            Flow::Close => {
                close = true;
                break;
            }
            Flow::Monitor => return Box::pin(monitor(s, rb, tx)).await,
            Flow::Tunnel(start) => {
                return Box::pin(tunnel(s, rb, tx, *start, reqs_iter, buf, last)).await
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
        // Built and queued without a wait almost always; the waits boxed, so that neither
        // the builder nor the round sits in this future (allocated per read) beside them.
        let q = if !rb.jobs.is_empty() && !s.order.no_writes_pending() {
            Box::pin(round_later(s, rb, close)).await
        } else {
            match round_now(s, rb, close) {
                Ok(q) => q,
                Err(f) => Box::pin(full_later(s, f)).await,
            }
        };
        if !queue(tx, q).await {
            return Step::Closed;
        }
    }
    if close || (ended && !*held_back) {
        return Step::Closed;
    }
    Step::Read
}

/// What the order keeps of a round once it is sent (`Order::sent`).
struct Sent {
    had_jobs: bool,
    want_ack: bool,
    written: Vec<bytes::Bytes>,
    keys: crate::proxy::conn::round::Keys,
    close: bool,
}

/// A round whose job met a full queue (`RoundBuilder::send_now`), and what the order keeps.
type Full = Box<(Box<crate::proxy::conn::round::Full>, Sent)>;

/// The round of a read, sent to its nodes and ready for the writer, unless a node's queue
/// is full. Only once the session's earlier writes have landed (`Order::wait_barrier`).
fn round_now(s: &mut Session, mut rb: RoundBuilder, close: bool) -> Result<Queued, Full> {
    let sent = Sent {
        want_ack: rb.wrote_cached,
        // Only a round with jobs has commands a later task or combined write could
        // overtake.
        had_jobs: !rb.jobs.is_empty(),
        written: std::mem::take(&mut rb.written),
        keys: std::mem::take(&mut rb.keys),
        close,
    };
    match rb.send_now(s.ctx().backend.request_timeout, &s.inflight) {
        Ok(round) => Ok(ordered(s, round, sent)),
        Err(full) => Err(Box::new((full, sent))),
    }
}

/// `round_now` after its waits: the session's earlier writes, and room in a full queue.
async fn round_later(s: &mut Session, rb: RoundBuilder, close: bool) -> Queued {
    wait_barrier(s, &rb).await;
    match round_now(s, rb, close) {
        Ok(q) => q,
        Err(f) => full_later(s, f).await,
    }
}

/// `round_now`'s round once its full queue had room.
async fn full_later(s: &mut Session, f: Full) -> Queued {
    let (full, sent) = *f;
    let round = full.finish().await;
    ordered(s, round, sent)
}

/// The round noted by the session's order, ready for the writer.
fn ordered(s: &mut Session, mut round: Round, sent: Sent) -> Queued {
    s.order.sent(
        &mut round,
        sent.had_jobs,
        sent.want_ack,
        s.tracks_keys(),
        sent.written,
        sent.keys,
    );
    round.close_after = sent.close;
    Box::new((round, s.proto()))
}

/// CLIENT REPLY: the slots from `from` on are written as nothing.
fn hush(rb: &mut RoundBuilder, from: usize) {
    for slot in &mut rb.slots[from..] {
        let inner = std::mem::replace(slot, Slot::Again);
        *slot = Slot::Quiet(Box::new(inner));
    }
}

/// Hands a round to the writer: false when the writer is gone. Waits (boxed) only when
/// the writer is 16 rounds behind.
async fn queue(tx: &mpsc::Sender<Queued>, q: Queued) -> bool {
    match tx.try_send(q) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Closed(_)) => false,
        Err(mpsc::error::TrySendError::Full(q)) => Box::pin(tx.send(q)).await.is_ok(),
    }
}

/// A read past `limits.max_pending`: answered with an error, and the connection closed.
async fn too_long(s: &mut Session, tx: &mpsc::Sender<Queued>) -> Step {
    let mut rb = RoundBuilder::new();
    rb.slots.push(Slot::Ready(err_bytes(
        "ERR Protocol error: client query buffer limit exceeded",
    )));
    let mut round = sent!(rb, s);
    round.close_after = true;
    s.ctx().metrics.protocol_errors.inc();
    let _ = tx.send(Box::new((round, s.proto()))).await;
    Step::Closed
}

/// MONITOR: the round so far goes out, and the connection streams commands from now on.
/// Whatever the client sent after MONITOR is not run, as on Redis.
async fn monitor(s: &mut Session, rb: RoundBuilder, tx: &mpsc::Sender<Queued>) -> Step {
    let lines = s.ctx().monitors.subscribe();
    s.order.wait_barrier().await;
    let round = sent!(rb, s);
    let _ = tx.send(Box::new((round, s.proto()))).await;
    Step::Monitor(lines)
}

/// SUBSCRIBE: the round so far goes out, and the client talks to the node from now on.
async fn tunnel(
    s: &mut Session,
    rb: RoundBuilder,
    tx: &mpsc::Sender<Queued>,
    mut start: tunnel::Start,
    rest: std::vec::Drain<'_, Request>,
    buf: &mut BytesMut,
    last: Option<&'static command::Spec>,
) -> Step {
    // CLIENT LIST shows cmd=subscribe, as tools look for it there.
    if let Some(spec) = last {
        s.me.touched(rb.started, buf.capacity(), spec);
    }
    // Everything the client sent after SUBSCRIBE goes straight to the node.
    for req in rest {
        start.pending.push(req.wire());
    }
    start.pending.push(buf.split().freeze());
    // The tunnel's commands take a connection of their own: nothing of the session may
    // still be on its way.
    s.order.wait_barrier().await;
    let mut round = sent!(rb, s);
    round.tunnel = start.take_end();
    let _ = tx.send(Box::new((round, s.proto()))).await;
    Step::Tunnel(start)
}
