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
use super::local::queue_in_tx;
use super::mitigation::{
    cached_mget, cached_read, combine, invalidate_cached, wait_barrier, wait_fills,
};
use super::plan::{decide, observe, own_connection};
use super::round::{Blocked, Merge, Queued, Round, RoundBuilder, Slot};
use super::route::{
    all_nodes, forward_keyed, is_pubsub_command, keys_node, pubsub_node, push, scan_one, split,
};
use super::state::{blocking_worker, err_bytes, Decided, Flow, Pending, Session};
use super::{local, reply, settle, tunnel};
use crate::command::{self, Classified, Route};
use crate::metrics::Class;
use crate::policy::{self, Action};
use crate::resp::{Request, RequestParser};

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
    let limits = s.ctx.limits.clone();
    let mut parser = RequestParser::new(limits);
    // Allocated when data arrives, and given back whenever everything read was handled:
    // an idle connection holds no buffer (`read_some`).
    let mut buf = BytesMut::new();
    let mut reqs: Vec<Request> = Vec::new();
    let mut shutdown = s.ctx.shutdown.clone();
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
                    tracing::debug!(client = s.id, "draining on shutdown");
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
    if buf.len() > s.ctx.max_pending {
        let mut rb = RoundBuilder::new();
        rb.slots.push(Slot::Ready(err_bytes(
            "ERR Protocol error: client query buffer limit exceeded",
        )));
        let mut round = rb.send(s.ctx.backend.request_timeout, &s.inflight).await;
        round.close_after = true;
        s.ctx.metrics.protocol_errors.inc();
        let _ = tx.send(Box::new((round, s.proto()))).await;
        return Step::Closed;
    }
    {
        let rules = s.ctx.rules.snapshot();
        s.detect = rules.detection().enabled;
        s.admit = rules.any_admit();
        s.track = !s.ctx.salt.table.load().is_empty() || s.ctx.hot.load().may_combine();
    }
    let monitored = s.ctx.monitors.active();
    let room = match s.ctx.max_output {
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
        let (req, c, hook) = if s.admit {
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
                        let timeout = s.ctx.backend.request_timeout.unwrap_or(wait);
                        tokio::time::sleep(wait.min(timeout)).await;
                    }
                    (req, c, hook)
                }
            }
        } else {
            (req, c, None)
        };
        // Redis shows neither CMD_SKIP_MONITOR nor CMD_ADMIN commands to monitors.
        if s.ctx.pause.holds(settle::writes(&c)).is_some()
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
        let mut flow = handle(s, req, c, &mut rb).await;
        if let Flow::Settle(p) = flow {
            if !Box::pin(settle::settle(s, &mut rb, tx, s.proto())).await {
                return Step::Closed;
            }
            mark = 0;
            let Pending { req, c } = *p;
            flow = proceed(s, req, c, true, &mut rb).await;
        }
        if let Flow::Flush(p) = flow {
            if !Box::pin(settle::flush(s, &mut rb, tx)).await {
                return Step::Closed;
            }
            mark = 0;
            let Decided { req, c, action } = *p;
            flow = act(s, req, c, action, &mut rb).await;
        }
        rb.commit_keys();
        if let Some(args) = monitor {
            s.ctx.monitors.feed(s.db(), &s.peer, &args);
        }
        if let (Some(hook), Flow::Continue) = (hook, &flow) {
            if rb.slots.len() == mark + 1 {
                let slot = rb.slots.pop().expect("one slot pushed");
                rb.slots.push(Slot::Seen(Box::new(slot), hook));
            }
        }
        let settle_after = std::mem::take(&mut s.settle_after);
        if ((s.proto(), s.db()) != conn_state || settle_after)
            && matches!(flow, Flow::Continue)
            && !Box::pin(settle::settle(s, &mut rb, tx, conn_state.0)).await
        {
            return Step::Closed;
        }
        match flow {
            // A fresh round has no jobs, and the lane is switched, so this cannot
            // happen; answer rather than panic.
            Flow::Flush(_) | Flow::Settle(_) => rb.slots.push(Slot::Ready(err_bytes(
                "ERR saltshaker: internal: command could not be ordered",
            ))),
            Flow::Continue => {}
            Flow::Close => {
                close = true;
                break;
            }
            Flow::Monitor => {
                // Whatever the client sent after MONITOR is not run, as on Redis.
                let lines = s.ctx.monitors.subscribe();
                s.order.wait_barrier().await;
                let round = rb.send(s.ctx.backend.request_timeout, &s.inflight).await;
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
                let mut round = rb.send(s.ctx.backend.request_timeout, &s.inflight).await;
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
            s.ctx.metrics.protocol_errors.inc();
            tracing::debug!(client = s.id, peer = %s.peer, error = %e, "closing client after a protocol error");
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
        let mut round = rb.send(s.ctx.backend.request_timeout, &s.inflight).await;
        s.order
            .sent(&mut round, had_jobs, want_ack, s.track, written, keys);
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

/// check -> decide -> observe -> act, for one classified command.
async fn handle(s: &mut Session, req: Request, c: Classified, rb: &mut RoundBuilder) -> Flow {
    // The keys a combined write of this session must not overtake (see `Order`); a
    // command without keys that reaches a node may touch any.
    if s.track {
        let known = !c.keys.is_empty() || matches!(c.route, Route::Local);
        rb.note_keys(&req, &c.keys, known);
    }
    s.refresh_user();
    match &s.user {
        None if !matches!(c.spec.name, "AUTH" | "HELLO" | "QUIT" | "RESET") => {
            rb.slots
                .push(Slot::Ready(err_bytes("NOAUTH Authentication required.")));
            return Flow::Continue;
        }
        Some(u) if !u.unrestricted() => {
            if let Err(d) = u.check(&c, &req) {
                let label = crate::metrics::DeniedLabel {
                    user: u.name.clone(),
                    reason: d.reason(),
                };
                s.ctx
                    .metrics
                    .security
                    .acl_denied
                    .get_or_create(&label)
                    .inc();
                s.log_refusal(d.reason(), d.object(&c), &u.name.clone());
                let slot = s.refuse(err_bytes(&d.message()));
                rb.slots.push(slot);
                return Flow::Continue;
            }
        }
        _ => {}
    }
    proceed(s, req, c, false, rb).await
}

/// An allowed command: ordered against the session's earlier ones, decided once, carried
/// out. `settled`: every earlier reply is in.
async fn proceed(
    s: &mut Session,
    req: Request,
    c: Classified,
    settled: bool,
    rb: &mut RoundBuilder,
) -> Flow {
    // A command that takes another connection to its node than the session's last one
    // (a script's lane, WATCH's connection, a blocking command's) leaves once everything
    // the session sent before has arrived: two connections are not ordered at the node.
    let lane_change = s.tx.is_none()
        && !matches!(
            c.route,
            Route::Local
                | Route::Transaction
                | Route::Subscribe
                | Route::Unsupported(_)
                | Route::Blocking
                | Route::Kill
        )
        && s.switch_lane(c.spec.name);
    let switch = s.tracking.is_some() && super::client_cache::switches(s, &req, &c);
    if !settled && (lane_change || switch || own_connection(s, &req, &c)) {
        return Flow::Settle(Box::new(Pending { req, c }));
    }
    // decide
    let action = decide(s, &req, &c);
    let task = match &action {
        Action::Salted(p) => p.needs_flush(),
        Action::Idempotent { .. } => super::salted::idempotent_is_task(s, &req),
        _ => false,
    };
    if task && !rb.jobs.is_empty() {
        return Flow::Flush(Box::new(Decided { req, c, action }));
    }
    act(s, req, c, action, rb).await
}

/// observe -> act: carries out the decided plan.
async fn act(
    s: &mut Session,
    req: Request,
    c: Classified,
    mut action: Action,
    rb: &mut RoundBuilder,
) -> Flow {
    let c = &c;
    let req = &req;
    // observe
    let class = observe(s, req, c);
    rb.count(class);
    if s.tracking.is_some() {
        super::client_cache::note(s, req, c, class, &mut action);
    }
    if class == Class::Write {
        if !s.order.no_fills() {
            Box::pin(wait_fills(s, req, c)).await;
        }
        if s.tx.is_none() {
            invalidate_cached(s, req, c, &s.ctx.hot.load(), rb);
        }
    }
    // act
    if let Action::Idempotent { delta } = action {
        super::salted::idempotent(s, req, delta, rb);
        return Flow::Continue;
    }
    if let Action::Salted(plan) = action {
        let bridge = policy::bridge(c, req, &plan, crate::salt::now_ms(), &s.ctx.rules.load());
        // Rare paths are boxed: the session's future, held by every idle connection, stays
        // small (bench/conn_memory.py).
        if let super::salted::Next::Done = Box::pin(super::salted::act(s, req, c, plan, rb)).await {
            return Flow::Continue;
        }
        // Folded, or a write the base key takes: on as usual (it may be combined or
        // cached like any command on its key); an increment of a key whose promotion is
        // not in force yet is combined (`policy::bridge`).
        action = match (s.tx.is_none(), bridge) {
            (true, Some(bridge)) => bridge,
            (true, None) => policy::decide_plain(c, req, &s.ctx.hot.load()),
            (false, _) => Action::Forward,
        };
    }
    {
        match action {
            Action::Combine {
                delta,
                field,
                window,
            } => {
                // A batch leaves on its own schedule: only when nothing of this session is
                // still on its way, or it could overtake it (then: a plain command).
                if super::mitigation::may_combine_now(s, rb, req.arg(c.keys[0] as usize)) {
                    combine(s, req, c, delta, field, window, rb);
                    return Flow::Continue;
                }
                s.ctx.metrics.combine.held_back.inc();
            }
            Action::Cache(p) => {
                if cached_read(s, req, c, p, rb) {
                    return Flow::Continue;
                }
            }
            Action::CachePerKey(per_key) => {
                if cached_mget(s, req, c, &per_key, rb) {
                    return Flow::Continue;
                }
            }
            Action::Forward | Action::Salted(_) | Action::Idempotent { .. } => {}
        }
    }
    if s.tx.is_some()
        && !matches!(
            c.spec.name,
            "EXEC" | "DISCARD" | "MULTI" | "WATCH" | "QUIT" | "RESET"
        )
    {
        let slot = queue_in_tx(s, req, c);
        rb.slots.push(slot);
        return Flow::Continue;
    }
    match c.route {
        Route::Keyed => forward_keyed(s, req, c, rb),
        Route::Blocking => {
            let slot = match keys_node(s, req, c) {
                Ok(node) => {
                    let w = blocking_worker(s, node);
                    let rx = w.call(vec![req.wire()], 1);
                    let on = Some((node, w.node_id()));
                    Slot::Blocking(rx, Blocked::new(&s.ctx.blocked, &s.me, on))
                }
                Err(e) => Slot::Ready(e),
            };
            rb.slots.push(slot);
        }
        Route::Split(kind) => split(s, req, c, kind, rb),
        Route::AllNodes(agg) => all_nodes(s, req, c, agg, rb),
        Route::AnyNode => {
            let node = if is_pubsub_command(c.spec.name) {
                pubsub_node(s, req)
            } else {
                Ok(s.ctx.backend.any_node())
            };
            match node {
                Ok(node) => {
                    let part = push(s, rb, node, req.wire());
                    rb.slots.push(Slot::Reply(part));
                }
                Err(e) => rb.slots.push(Slot::Ready(e)),
            }
        }
        Route::Scan => scan_one(s, req, rb),
        Route::Kill => super::route::kill(s, req, rb),
        Route::RandomKey => {
            let parts = s
                .ctx
                .backend
                .masters()
                .into_iter()
                .map(|n| push(s, rb, n, req.wire()))
                .collect();
            rb.slots
                .push(Slot::Merge(Box::new(Merge::FirstNonNil(parts))));
        }
        Route::Local => return local::handle(s, req, c, rb),
        Route::Transaction => return local::transaction(s, req, c, rb),
        Route::Subscribe => match pubsub_node(s, req) {
            Ok(node) => {
                let mut hs = s.ctx.backend.node(node).handshake(s.proto(), s.db());
                // The client talks to the node from now on: it keeps its name there.
                hs.name = s.name.clone();
                match Box::pin(tunnel::open(&hs, req.wire())).await {
                    Ok(start) => return Flow::Tunnel(start),
                    Err(e) => rb
                        .slots
                        .push(Slot::Ready(err_bytes(&format!("ERR saltshaker: {e}")))),
                }
            }
            Err(e) => rb.slots.push(Slot::Ready(e)),
        },
        Route::Unsupported(why) => rb
            .slots
            .push(Slot::Ready(err_bytes(&format!("ERR saltshaker: {why}")))),
    }
    Flow::Continue
}
