//! One client connection: read -> parse -> classify -> observe -> decide -> act, then the
//! reply writer (`reply`) answers in request order.
//!
//! The reader task owns the connection's state (protocol, database, auth, transaction,
//! WATCH) and walks each read's commands in order, so a state change (HELLO 3, SELECT)
//! applies to the very next command of the same pipeline. Every command becomes a slot in
//! the round; commands for the same node share one job.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;
use tokio::io::AsyncReadExt;

use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};

use super::dedicated::DedicatedWorker;
use super::round::{Merge, Part, Round, RoundBuilder, Slot};
use super::{local, reply, scan, tunnel, Ctx};
use crate::backend::ConnHandle;
use crate::command::{self, flags, Agg, Args, Classified, Route, Split};
use crate::hotkey::Kind;
use crate::metrics::Class;
use crate::mitigate::cache::Cause;
use crate::mitigate::combine::BatchKey;
use crate::policy::{self, Action, HotSet};
use crate::resp::{encode_error, Proto, Request, RequestParser};
use crate::rules::CachePolicy;

impl Args for Request {
    fn argc(&self) -> usize {
        Request::argc(self)
    }
    fn arg(&self, i: usize) -> &[u8] {
        Request::arg(self, i)
    }
}

/// A queued MULTI.
pub struct Tx {
    pub wires: Vec<Bytes>,
    pub node: Option<usize>,
    pub dirty: bool,
}

/// Per-connection state, owned by the reader.
pub struct Session {
    pub ctx: Arc<Ctx>,
    pub id: u64,
    pub peer: String,
    pub local: String,
    pub proto: Proto,
    pub db: u32,
    pub name: Option<Bytes>,
    pub authed: bool,
    pub tx: Option<Tx>,
    /// Node of the WATCHed keys and the dedicated connection holding the WATCH.
    pub watch: Option<(usize, DedicatedWorker)>,
    blocking: Vec<(usize, DedicatedWorker)>,
    conns: Vec<Option<Arc<[ConnHandle]>>>,
    rr: usize,
    /// Combined writes not yet acknowledged by their node: this session's next jobs wait
    /// for them, so a read after a combined INCR sees it.
    barrier: Vec<oneshot::Receiver<()>>,
    pub gone: watch::Receiver<bool>,
    /// `detection.enabled` of the rules, read once per round rather than per command.
    detect: bool,
}

/// What the reader does after a command.
pub enum Flow {
    Continue,
    Close,
    Tunnel(tunnel::Start),
}

/// Serves one client connection until it closes.
pub async fn run(stream: TcpStream, ctx: Arc<Ctx>, id: u64) {
    let _ = stream.set_nodelay(true);
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let local = stream
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let (r, w) = stream.into_split();
    let (tx, rx) = mpsc::channel::<(Round, Proto)>(64);
    let writer = tokio::spawn(reply::write_loop(w, rx, ctx.clone()));
    let (gone_tx, gone_rx) = watch::channel(false);
    let mut s = Session {
        authed: ctx.password.is_none(),
        conns: vec![None; ctx.backend.len()],
        ctx,
        id,
        peer,
        local,
        proto: Proto::Resp2,
        db: 0,
        name: None,
        tx: None,
        watch: None,
        blocking: Vec::new(),
        rr: 0,
        barrier: Vec::new(),
        gone: gone_rx,
        detect: true,
    };
    let end = read_loop(r, &tx, &mut s).await;
    let _ = gone_tx.send(true);
    drop(tx);
    let (mut w, tunnel_end): (OwnedWriteHalf, _) = match writer.await {
        Ok(x) => x,
        Err(_) => return,
    };
    match (end, tunnel_end) {
        (End::Tunnel(r, start), Some(t)) => tunnel::pump(r, w, start, t).await,
        (End::Drained(mut r), _) => {
            // Every command read has its reply written. Send FIN, then discard what the
            // client sent after we stopped reading (it was never executed, so the client can
            // retry it elsewhere) instead of resetting the connection, which could destroy
            // replies still in flight to the client.
            use tokio::io::AsyncWriteExt;
            let _ = w.shutdown().await;
            let mut sink = [0u8; 4096];
            let linger = tokio::time::sleep(std::time::Duration::from_secs(2));
            tokio::pin!(linger);
            loop {
                tokio::select! {
                    _ = &mut linger => break,
                    n = r.read(&mut sink) => if matches!(n, Ok(0) | Err(_)) { break },
                }
            }
        }
        _ => {}
    }
}

/// How the read phase ended.
enum End {
    Closed,
    /// Shutdown: every complete command read was dispatched; close politely.
    Drained(OwnedReadHalf),
    Tunnel(OwnedReadHalf, tunnel::Start),
}

/// The read phase: until the client closes, the session becomes a pub/sub tunnel, or a
/// shutdown finds the connection at a command boundary.
async fn read_loop(
    mut r: OwnedReadHalf,
    tx: &mpsc::Sender<(Round, Proto)>,
    s: &mut Session,
) -> End {
    let limits = s.ctx.limits.clone();
    let mut parser = RequestParser::new(limits);
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut reqs: Vec<Request> = Vec::with_capacity(64);
    let mut shutdown = s.ctx.shutdown.clone();
    let mut draining = false;
    loop {
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        let n: std::io::Result<usize> = if draining {
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
                n = r.read_buf(&mut buf) => n,
                _ = shutdown.wait_for(|v| *v) => {
                    tracing::debug!(client = s.id, "draining on shutdown");
                    draining = true;
                    continue;
                }
            }
        };
        let eof = matches!(n, Ok(0) | Err(_));
        if buf.len() > s.ctx.max_pending {
            let mut rb = RoundBuilder::new();
            rb.slots.push(Slot::Ready(err_bytes(
                "ERR Protocol error: client query buffer limit exceeded",
            )));
            let mut round = rb.send().await;
            round.close_after = true;
            s.ctx.metrics.protocol_errors.inc();
            let _ = tx.send((round, s.proto)).await;
            return End::Closed;
        }
        s.detect = s.ctx.rules.snapshot().detection().enabled;
        let parsed = parser.parse(&mut buf, &mut reqs);
        let mut rb = RoundBuilder::new();
        let mut close = false;
        let mut reqs_iter = reqs.drain(..);
        while let Some(req) = reqs_iter.next() {
            match handle(s, req, &mut rb).await {
                Flow::Continue => {}
                Flow::Close => {
                    close = true;
                    break;
                }
                Flow::Tunnel(mut start) => {
                    // Everything the client sent after SUBSCRIBE goes straight to the node.
                    for rest in reqs_iter.by_ref() {
                        start.pending.push(rest.wire());
                    }
                    start.pending.push(buf.split().freeze());
                    wait_barrier(s, &rb).await;
                    let mut round = rb.send().await;
                    round.tunnel = start.take_end();
                    let _ = tx.send((round, s.proto)).await;
                    return End::Tunnel(r, start);
                }
            }
        }
        drop(reqs_iter);
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
            let mut round = rb.send().await;
            if want_ack {
                let (tx, rx) = oneshot::channel();
                round.acked = Some(tx);
                s.barrier.push(rx);
            }
            round.close_after = close;
            if tx.send((round, s.proto)).await.is_err() {
                return End::Closed;
            }
        }
        if close || eof {
            return End::Closed;
        }
    }
}

pub fn err_bytes(msg: &str) -> Bytes {
    let mut out = BytesMut::new();
    encode_error(msg, &mut out);
    out.freeze()
}

/// classify -> observe -> decide -> act, for one command.
async fn handle(s: &mut Session, req: Request, rb: &mut RoundBuilder) -> Flow {
    // classify
    let c = match command::classify(&req) {
        Ok(c) => c,
        Err(e) => {
            if let Some(tx) = s.tx.as_mut() {
                tx.dirty = true;
            }
            rb.slots.push(Slot::Ready(err_bytes(&e.to_string())));
            return Flow::Continue;
        }
    };
    if !s.authed && !matches!(c.spec.name, "AUTH" | "HELLO" | "QUIT" | "RESET") {
        rb.slots
            .push(Slot::Ready(err_bytes("NOAUTH Authentication required.")));
        return Flow::Continue;
    }
    // observe
    let class = observe(s, &req, &c);
    rb.count(class);
    // decide
    if s.tx.is_none() {
        let hot = s.ctx.hot.load();
        if class == Class::Write {
            invalidate_cached(s, &req, &c, &hot, rb);
        }
        match policy::decide(&c, &req, &hot) {
            Action::Combine {
                delta,
                field,
                window,
            } => {
                combine(s, &req, &c, delta, field, window, rb);
                return Flow::Continue;
            }
            Action::Cache(p) => {
                if cached_read(s, &req, &c, p, rb) {
                    return Flow::Continue;
                }
            }
            Action::Forward => {}
        }
    }
    // act
    if s.tx.is_some()
        && !matches!(
            c.spec.name,
            "EXEC" | "DISCARD" | "MULTI" | "WATCH" | "QUIT" | "RESET"
        )
    {
        let slot = queue_in_tx(s, &req, &c);
        rb.slots.push(slot);
        return Flow::Continue;
    }
    match c.route {
        Route::Keyed => forward_keyed(s, &req, &c, rb),
        Route::Blocking => {
            let slot = match keys_node(s, &req, &c) {
                Ok(node) => Slot::Later(blocking_worker(s, node).call(vec![req.wire()], 1)),
                Err(e) => Slot::Ready(e),
            };
            rb.slots.push(slot);
        }
        Route::Split(kind) => split(s, &req, &c, kind, rb),
        Route::AllNodes(agg) => all_nodes(s, &req, &c, agg, rb),
        Route::AnyNode => {
            let node = if is_pubsub_command(c.spec.name) {
                0
            } else {
                s.ctx.backend.any_node()
            };
            let part = push(s, rb, node, req.wire());
            rb.slots.push(Slot::Reply(part));
        }
        Route::Scan => scan_one(s, &req, rb),
        Route::RandomKey => {
            let parts = (0..s.ctx.backend.len())
                .map(|n| push(s, rb, n, req.wire()))
                .collect();
            rb.slots
                .push(Slot::Merge(Box::new(Merge::FirstNonNil(parts))));
        }
        Route::Local => return local::handle(s, &req, &c, rb),
        Route::Transaction => return local::transaction(s, &req, &c, rb),
        Route::Subscribe => return tunnel::begin(s, &req, rb).await,
        Route::Unsupported(why) => rb
            .slots
            .push(Slot::Ready(err_bytes(&format!("ERR saltshaker: {why}")))),
    }
    Flow::Continue
}

/// Sends a write-hot increment through the key's combine batch.
fn combine(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    delta: i64,
    field: Option<usize>,
    window: std::time::Duration,
    rb: &mut RoundBuilder,
) {
    let key = req.arg_bytes(c.keys[0] as usize);
    let node = s.ctx.backend.node_for(&key);
    let conns = s.ctx.backend.node(node).conns(Proto::Resp2, s.db);
    s.rr = s.rr.wrapping_add(1);
    let conn = conns[s.rr % conns.len()].clone();
    let bk = BatchKey {
        node,
        db: s.db,
        key,
        field: field.map(|f| req.arg_bytes(f)),
    };
    let pending = s.ctx.combiner.add(bk, conn, delta, req.wire(), window);
    if s.barrier.len() >= 64 {
        // A client that only ever increments hot keys never sends a job: forget the
        // writes that have landed so the barrier stays small.
        s.barrier
            .retain_mut(|d| matches!(d.try_recv(), Err(oneshot::error::TryRecvError::Empty)));
    }
    s.barrier.push(pending.done);
    rb.slots.push(Slot::Later(pending.reply));
}

/// A write drops the key's cached replies at once (a fill that raced with it is discarded
/// by the cache's versioning), and a FLUSHALL/FLUSHDB drops everything.
fn invalidate_cached(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    hot: &HotSet,
    rb: &mut RoundBuilder,
) {
    let Some(layer) = s.ctx.cache.as_ref() else {
        return;
    };
    if matches!(c.spec.name, "FLUSHALL" | "FLUSHDB") {
        layer.cache.invalidate_all(Cause::Flush);
        rb.wrote_cached = true;
        return;
    }
    if layer.cache.is_empty() && !hot.may_cache() {
        return;
    }
    for &k in &c.keys {
        let key = req.arg(k as usize);
        layer.cache.invalidate(key, Cause::Write);
        if hot.read_hot(key).is_some() {
            rb.wrote_cached = true;
            rb.invalidate_after.push(req.arg_bytes(k as usize));
        }
    }
}

/// Serves a read of a read-hot key from the cache, filling it on a miss through the node's
/// tracked fill connection. Returns false when the read must go to the node as usual:
/// RESP3 or another database (cached replies are RESP2 from database 0), this session's own
/// write to a cached key not yet acknowledged, or tracking not in force for the node.
fn cached_read(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    p: CachePolicy,
    rb: &mut RoundBuilder,
) -> bool {
    let Some(layer) = s.ctx.cache.as_ref() else {
        return false;
    };
    if s.proto != Proto::Resp2 || s.db != 0 || rb.wrote_cached || !s.barrier.is_empty() {
        return false;
    }
    let key = req.arg_bytes(c.keys[0] as usize);
    let node = s.ctx.backend.node_for(&key);
    let Some(conn) = layer.fillers[node].conn() else {
        return false;
    };
    let wire = req.wire();
    if let Some(hit) = layer.cache.get_fresh(&key, &wire) {
        rb.slots.push(Slot::Ready(hit));
        return true;
    }
    let (cache, wait, timeout) = (
        layer.cache.clone(),
        layer.fill_wait,
        s.ctx.backend.request_timeout,
    );
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        let fill_wire = wire.clone();
        let fill = move || fetch(conn, fill_wire, timeout);
        let reply = match cache.get_or_fill(&key, &wire, &p, wait, fill).await {
            Ok(r) => r,
            Err(e) => err_bytes(&format!("ERR saltshaker: {e}")),
        };
        let _ = tx.send(reply);
    });
    rb.slots.push(Slot::Later(rx));
    true
}

/// One command on a fill connection.
async fn fetch(
    conn: ConnHandle,
    wire: Bytes,
    timeout: Option<std::time::Duration>,
) -> Result<Bytes, String> {
    let (tx, rx) = oneshot::channel();
    conn.send(crate::backend::Job {
        data: smallvec::smallvec![wire],
        count: 1,
        tx,
    })
    .await;
    let r = match timeout {
        Some(t) => tokio::time::timeout(t, rx)
            .await
            .map_err(|_| "backend did not answer in time".to_string())?,
        None => rx.await,
    };
    match r {
        Ok(Ok(r)) => Ok(r.get(0)),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("backend connection lost before the reply".into()),
    }
}

/// Before this session's next jobs leave, its combined writes must have reached their node.
async fn wait_barrier(s: &mut Session, rb: &RoundBuilder) {
    if s.barrier.is_empty() || rb.jobs.is_empty() {
        return;
    }
    for done in s.barrier.drain(..) {
        let _ = done.await;
    }
}

fn is_pubsub_command(name: &str) -> bool {
    name == "PUBLISH" || name == "SPUBLISH" || name.starts_with("PUBSUB")
}

/// The observe phase: every key of every command feeds the hot-key detector.
fn observe(s: &Session, req: &Request, c: &Classified) -> Class {
    let f = c.spec.flags;
    let (kind, class) = if f & flags::WRITE != 0 {
        (Kind::Write, Class::Write)
    } else if f & flags::READ != 0 {
        (Kind::Read, Class::Read)
    } else {
        return Class::Other;
    };
    if s.detect {
        for &k in &c.keys {
            s.ctx.detector.observe(req.arg(k as usize), kind);
        }
    }
    class
}

/// The node of every key of a keyed command, or the error a client sees when they span nodes.
pub fn keys_node(s: &Session, req: &Request, c: &Classified) -> Result<usize, Bytes> {
    let b = &s.ctx.backend;
    let mut node: Option<usize> = None;
    for &k in &c.keys {
        let n = b.node_for(req.arg(k as usize));
        match node {
            None => node = Some(n),
            Some(m) if m != n => {
                return Err(err_bytes(&format!(
                    "ERR saltshaker: {} keys on different nodes ({} and {}); keep them together with a hash tag",
                    c.spec.name,
                    b.node(m).addr,
                    b.node(n).addr
                )))
            }
            _ => {}
        }
    }
    Ok(node.unwrap_or_else(|| b.any_node()))
}

fn forward_keyed(s: &mut Session, req: &Request, c: &Classified, rb: &mut RoundBuilder) {
    match keys_node(s, req, c) {
        Ok(node) => {
            let part = push(s, rb, node, req.wire());
            rb.slots.push(Slot::Reply(part));
        }
        Err(e) => rb.slots.push(Slot::Ready(e)),
    }
}

/// Adds a command to the node's job in this round.
pub fn push(s: &mut Session, rb: &mut RoundBuilder, node: usize, wire: Bytes) -> Part {
    push_n(s, rb, node, wire, 1)
}

pub fn push_n(
    s: &mut Session,
    rb: &mut RoundBuilder,
    node: usize,
    wire: Bytes,
    count: u32,
) -> Part {
    let (proto, db) = (s.proto, s.db);
    let ctx = &s.ctx;
    let conns = s.conns[node]
        .get_or_insert_with(|| ctx.backend.node(node).conns(proto, db))
        .clone();
    s.rr = s.rr.wrapping_add(1);
    let pick = s.rr % conns.len();
    rb.push(node, || conns[pick].clone(), wire, count)
}

/// Forget cached connections after a protocol or database change.
pub fn reset_conns(s: &mut Session) {
    for c in s.conns.iter_mut() {
        *c = None;
    }
}

fn split(s: &mut Session, req: &Request, c: &Classified, kind: Split, rb: &mut RoundBuilder) {
    let b = &s.ctx.backend;
    let step = if matches!(kind, Split::Mset) { 2 } else { 1 };
    // Group key positions by node, keeping request order inside each group.
    let mut groups: SmallVec<[(usize, Vec<u32>); 4]> = SmallVec::new();
    let mut order: Vec<(u16, u32)> = Vec::with_capacity(c.keys.len());
    for &k in &c.keys {
        let n = b.node_for(req.arg(k as usize));
        let g = match groups.iter().position(|(m, _)| *m == n) {
            Some(g) => g,
            None => {
                groups.push((n, Vec::new()));
                groups.len() - 1
            }
        };
        order.push((g as u16, groups[g].1.len() as u32));
        groups[g].1.push(k);
    }
    if groups.len() <= 1 {
        forward_keyed(s, req, c, rb);
        return;
    }
    let name = req.arg(0);
    let mut parts = Vec::with_capacity(groups.len());
    for (node, keys) in &groups {
        let mut args: Vec<&[u8]> = Vec::with_capacity(1 + keys.len() * step);
        args.push(name);
        for &k in keys {
            for j in 0..step {
                args.push(req.arg(k as usize + j));
            }
        }
        let wire = crate::backend::wire(&args);
        parts.push(push(s, rb, *node, wire));
    }
    let merge = match kind {
        Split::Mget => Merge::Mget { parts, order },
        Split::Mset => Merge::AllOk(parts),
        Split::SumInt => Merge::SumInt(parts),
    };
    rb.slots.push(Slot::Merge(Box::new(merge)));
}

fn all_nodes(s: &mut Session, req: &Request, _c: &Classified, agg: Agg, rb: &mut RoundBuilder) {
    let nodes = s.ctx.backend.len();
    if let Agg::First = agg {
        let node = s.ctx.backend.any_node();
        let part = push(s, rb, node, req.wire());
        rb.slots.push(Slot::Reply(part));
        return;
    }
    let parts: Vec<Part> = (0..nodes).map(|n| push(s, rb, n, req.wire())).collect();
    let merge = match agg {
        Agg::SumInt => Merge::SumInt(parts),
        Agg::AllOk => Merge::AllOk(parts),
        Agg::ConcatArrays => Merge::Concat(parts),
        Agg::AndArrays => Merge::AndArrays(parts),
        Agg::MinInt => Merge::MinInt(parts),
        Agg::First => unreachable!("handled above"),
    };
    rb.slots.push(Slot::Merge(Box::new(merge)));
}

fn scan_one(s: &mut Session, req: &Request, rb: &mut RoundBuilder) {
    let nodes = s.ctx.backend.len();
    let cursor = std::str::from_utf8(req.arg(1))
        .ok()
        .and_then(|c| c.parse::<u64>().ok());
    let Some(cursor) = cursor else {
        rb.slots.push(Slot::Ready(err_bytes("ERR invalid cursor")));
        return;
    };
    let (node, backend_cursor) = scan::decode_cursor(cursor, nodes);
    let mut args: Vec<Bytes> = (0..req.argc()).map(|i| req.arg_bytes(i)).collect();
    args[1] = Bytes::from(backend_cursor.to_string());
    let part = push(s, rb, node, crate::backend::wire(&args));
    rb.slots
        .push(Slot::Merge(Box::new(Merge::Scan { part, node, nodes })));
}

/// Inside MULTI: check and queue; the client sees +QUEUED (or the error Redis would give).
fn queue_in_tx(s: &mut Session, req: &Request, c: &Classified) -> Slot {
    let single = s.ctx.backend.is_single();
    let allowed = match c.route {
        Route::Keyed | Route::Blocking | Route::Split(_) | Route::AnyNode => true,
        Route::AllNodes(_) | Route::RandomKey | Route::Scan => single,
        Route::Local => matches!(c.spec.name, "PING" | "ECHO"),
        _ => false,
    };
    let node = if allowed {
        keys_node(s, req, c).map(Some)
    } else {
        Ok(None)
    };
    let tx = s.tx.as_mut().expect("in a transaction");
    let node = match node {
        Ok(Some(n)) => n,
        Ok(None) => {
            tx.dirty = true;
            return Slot::Ready(err_bytes(&format!(
                "ERR saltshaker: {} is not supported inside MULTI through the proxy",
                c.spec.name
            )));
        }
        Err(e) => {
            tx.dirty = true;
            return Slot::Ready(e);
        }
    };
    let keyless = c.keys.is_empty();
    match tx.node {
        _ if keyless => {}
        None => tx.node = Some(node),
        Some(m) if m != node => {
            tx.dirty = true;
            return Slot::Ready(err_bytes(&format!(
                "ERR saltshaker: MULTI across nodes is not supported (keys on {} and {})",
                s.ctx.backend.node(m).addr,
                s.ctx.backend.node(node).addr
            )));
        }
        _ => {}
    }
    tx.wires.push(req.wire());
    Slot::Ready(Bytes::from_static(b"+QUEUED\r\n"))
}

/// The session's dedicated connection to `node` for blocking commands, opened on first use.
fn blocking_worker(s: &mut Session, node: usize) -> &DedicatedWorker {
    if let Some(i) = s.blocking.iter().position(|(n, _)| *n == node) {
        return &s.blocking[i].1;
    }
    let hs = s.ctx.backend.node(node).handshake(s.proto, s.db);
    s.blocking
        .push((node, DedicatedWorker::spawn(hs, s.gone.clone())));
    &s.blocking.last().expect("just pushed").1
}

/// Drops dedicated connections that were opened for another protocol or database.
pub fn reset_dedicated(s: &mut Session) {
    s.blocking.clear();
    s.watch = None;
}

/// A oneshot already answered with `bytes`.
pub fn ready_later(bytes: Bytes) -> oneshot::Receiver<Bytes> {
    let (tx, rx) = oneshot::channel();
    let _ = tx.send(bytes);
    rx
}
