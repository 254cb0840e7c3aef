//! The session's side of mitigation: sending a hot increment through its combine batch
//! (with the per-session barrier that keeps read-your-writes), and serving reads of
//! read-hot keys from the cache (with invalidation by this session's own writes).

use bytes::Bytes;
use tokio::sync::oneshot;

use smallvec::SmallVec;

use super::route::push;
use crate::backend::ConnHandle;
use crate::command::Classified;
use crate::command::Cmd;
use crate::mitigate::cache::Cause;
use crate::mitigate::cache::FillReply;
use crate::mitigate::combine::{BatchKey, Pace};
use crate::policy::HotSet;
use crate::proxy::conn::ctx::CacheLayer;
use crate::proxy::conn::round::{CachedGet, Keys, MgetFrom, MgetPerKey, RoundBuilder, Slot};
use crate::proxy::conn::state::{err_bytes, Session};
use crate::resp::{Proto, Request};
use crate::rules::CachePolicy;

/// Sends a write-hot increment through the key's combine batch.
pub(in crate::proxy) fn combine(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    delta: i64,
    field: Option<usize>,
    window: std::time::Duration,
    rb: &mut RoundBuilder,
) {
    let key = req.arg_bytes(c.keys[0] as usize);
    let node = s.ctx().backend.node_for(&key);
    let conn = combine_conn(s, node, s.db(), &key);
    let bk = BatchKey {
        node,
        db: s.db(),
        key,
        field: field.map(|f| req.arg_bytes(f)),
    };
    let hash = Keys::hash(&bk.key);
    let pending = s
        .ctx()
        .combiner
        .add(bk, conn, delta, req.wire(), Pace::Now(window));
    s.order.combined(hash, pending.done);
    rb.combined();
    rb.slots.push(Slot::Later(pending.reply));
}

/// Whether an increment of `key` may leave with a combine batch now. A batch is sent on
/// its own schedule, so it could overtake this session's earlier commands: it may combine
/// only when none of them still on its way holds the key (in this round, or in a round
/// whose replies are not all in) and no task is pending (`Order::may_combine`). Otherwise
/// it goes as a plain command, in order. Found by tests/differential.rs: a GET before an
/// INCR in one pipeline saw the INCR. Commands on other keys do not hold it back: a first
/// version that waited for every earlier command combined almost nothing at pipeline 16
/// (0.975 backend commands per client INCR in bench/write_hot.sh).
///
/// Only in a round whose keys were kept from its start (`Session::track`): a key that
/// turned hot in the middle of a read may follow a command of its own round.
pub(in crate::proxy) fn may_combine_now(s: &mut Session, rb: &RoundBuilder, key: &[u8]) -> bool {
    let hash = Keys::hash(key);
    s.tracks_keys() && !rb.keys.may_hold(hash) && s.order.may_combine(hash)
}

/// The connection a key's combine batches use: always the same one for a key, so two
/// batches of one key reach the node in the order they were sent.
pub(in crate::proxy) fn combine_conn(s: &Session, node: usize, db: u32, key: &[u8]) -> ConnHandle {
    let conns = s.ctx().backend.node(node).conns(Proto::Resp2, db);
    crate::backend::pick(&conns, xxhash_rust::xxh3::xxh3_64(key) as usize)
}

/// A write drops the key's cached replies at once (a fill that raced with it is discarded
/// by the cache's versioning), and a FLUSHALL/FLUSHDB drops everything.
pub(in crate::proxy) fn invalidate_cached(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    hot: &HotSet,
    rb: &mut RoundBuilder,
) {
    let Some(layer) = s.ctx().cache.as_ref() else {
        return;
    };
    if matches!(c.spec.cmd, Cmd::Flushall | Cmd::Flushdb) {
        layer.cache.invalidate_all(Cause::Flush);
        rb.wrote_cached = true;
        return;
    }
    if layer.cache.is_empty() && !hot.may_cache() {
        return;
    }
    for &k in &c.keys {
        let key = req.arg(k as usize);
        rb.written.push(req.arg_bytes(k as usize));
        layer.cache.invalidate(key, Cause::Write);
        if hot.read_hot(key).is_some() {
            rb.wrote_cached = true;
            rb.invalidate_after.push(req.arg_bytes(k as usize));
        }
    }
}

/// EXEC of a transaction that wrote `keys`: their cached replies are dropped, as for a
/// write outside MULTI.
pub(in crate::proxy) fn invalidate_keys(s: &Session, keys: &[Bytes], rb: &mut RoundBuilder) {
    let Some(layer) = s.ctx().cache.as_ref() else {
        return;
    };
    let hot = s.ctx().hot.load();
    for key in keys {
        rb.written.push(key.clone());
        layer.cache.invalidate(key, Cause::Write);
        if hot.read_hot(key).is_some() {
            rb.wrote_cached = true;
            rb.invalidate_after.push(key.clone());
        }
    }
}

/// Serves a read of a read-hot key from the cache, filling it on a miss through the node's
/// tracked fill connection. Returns false when the read must go to the node as usual:
/// RESP3 or another database (cached replies are RESP2 from database 0), this session's own
/// write to a cached key not yet acknowledged, or tracking not in force for the node.
pub(in crate::proxy) fn cached_read(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    p: CachePolicy,
    rb: &mut RoundBuilder,
) -> bool {
    // A clone: the layer is used while the session notes its fill.
    let ctx = s.ctx().clone();
    let Some(layer) = ctx.cache.as_ref().filter(|_| may_serve_cached(s, rb)) else {
        return false;
    };
    let key = req.arg_bytes(c.keys[0] as usize);
    if written_pending(s, rb, &key) {
        return false;
    }
    match from_cache(s, layer, key, req.wire(), p) {
        Some(CachedGet::Ready(hit)) => rb.slots.push(Slot::Ready(hit)),
        Some(CachedGet::Later(rx)) => rb.slots.push(Slot::Later(rx)),
        None => return false,
    }
    true
}

/// Serves an MGET with read-hot keys key by key: each read-hot key from the cache, keyed
/// as a `GET` of it (so MGET and GET share entries), the other keys by one MGET per node;
/// the reply keeps the request's order. Returns false (plain MGET) in the cases where
/// `cached_read` does.
pub(in crate::proxy) fn cached_mget(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    per_key: &[Option<CachePolicy>],
    rb: &mut RoundBuilder,
) -> bool {
    // A clone: the layer is used while cold keys are added to `s`'s jobs.
    let ctx = s.ctx().clone();
    let Some(layer) = ctx.cache.as_ref().filter(|_| may_serve_cached(s, rb)) else {
        return false;
    };
    // Cold keys grouped by node, in request order inside each group.
    let mut groups: SmallVec<[(usize, Vec<Bytes>); 4]> = SmallVec::new();
    let mut from = Vec::with_capacity(c.keys.len());
    for (&k, p) in c.keys.iter().zip(per_key) {
        let key = req.arg_bytes(k as usize);
        if let Some(p) = p.filter(|_| !written_pending(s, rb, &key)) {
            let get = crate::backend::wire(&[&b"GET"[..], &key]);
            if let Some(cached) = from_cache(s, layer, key.clone(), get, p) {
                from.push(MgetFrom::Cache(cached));
                continue;
            }
        }
        let node = s.ctx().backend.node_for(&key);
        let g = match groups.iter().position(|(n, _)| *n == node) {
            Some(g) => g,
            None => {
                groups.push((node, Vec::new()));
                groups.len() - 1
            }
        };
        from.push(MgetFrom::Node {
            part: g as u16,
            pos: groups[g].1.len() as u32,
        });
        groups[g].1.push(key);
    }
    let mut parts = Vec::with_capacity(groups.len());
    for (node, keys) in groups {
        let mut args: Vec<&[u8]> = Vec::with_capacity(1 + keys.len());
        args.push(b"MGET");
        args.extend(keys.iter().map(|k| &k[..]));
        parts.push(push(s, rb, node, crate::backend::wire(&args)));
    }
    rb.slots
        .push(Slot::MgetPerKey(Box::new(MgetPerKey { parts, from })));
    true
}

/// Whether this session wrote `key` in this round or in one whose replies are not all in:
/// then its read goes to the node, in order with the write.
pub(in crate::proxy) fn written_pending(s: &mut Session, rb: &RoundBuilder, key: &[u8]) -> bool {
    rb.written.iter().any(|k| &k[..] == key)
        || s.order.unacked_write(key)
        || s.order.combining(Keys::hash(key))
}

/// Whether this session may be served from the cache now: RESP2 on database 0 (cached
/// replies are RESP2 from database 0), no write of its own to a cached key pending, and no
/// task (it may write any key). A combined write holds back reads of its own key only
/// (`written_pending`).
fn may_serve_cached(s: &mut Session, rb: &RoundBuilder) -> bool {
    s.proto() == Proto::Resp2 && s.db() == 0 && !rb.wrote_cached && s.order.nothing_for_all()
}

/// `request` on `key` from the cache: the reply at once on a hit, else a receiver for the
/// (single-flight) fill through the node's tracked fill connection. None when tracking is
/// not in force for the node: the read must go to the node as usual.
///
/// A fill runs on its own connection, so a later write of this session could reach the
/// node first and the read would see it: the fill is noted in the session (`Order::fill`), and
/// such a write waits for it (`wait_fills`).
fn from_cache(
    s: &mut Session,
    layer: &CacheLayer,
    key: Bytes,
    request: Bytes,
    p: CachePolicy,
) -> Option<CachedGet> {
    let node = s.ctx().backend.node_for(&key);
    // Until the node's fill connection is tracked, its reads go to the node.
    let conn = layer.filler(&s.ctx().backend, node)?.conn()?;
    if let Some(hit) = layer.cache.get_fresh(&key, &request) {
        return Some(CachedGet::Ready(hit));
    }
    let (cache, wait, timeout) = (
        layer.cache.clone(),
        layer.fill_wait,
        s.ctx().backend.request_timeout,
    );
    let (tx, rx) = oneshot::channel();
    let (done_tx, done_rx) = oneshot::channel();
    s.order.fill(key.clone(), done_rx);
    tokio::spawn(async move {
        let fill_wire = request.clone();
        let fill = move || fetch(conn, fill_wire, timeout);
        let reply = match cache.get_or_fill(&key, &request, &p, wait, fill).await {
            Ok(r) => r,
            Err(e) => err_bytes(&format!("ERR saltshaker: {e}")),
        };
        let _ = tx.send(reply);
        let _ = done_tx.send(());
    });
    Some(CachedGet::Later(rx))
}

/// Before a write leaves, this session's cache fills of the keys it writes must have read
/// the node: a read before a write in one pipeline never sees that write.
pub(in crate::proxy) async fn wait_fills(s: &mut Session, req: &Request, c: &Classified) {
    if s.order.no_fills() {
        return;
    }
    s.order
        .wait_fills(|key| c.keys.iter().any(|&k| req.arg(k as usize) == key))
        .await;
}

/// One command on a fill connection.
async fn fetch(conn: ConnHandle, wire: Bytes, timeout: Option<std::time::Duration>) -> FillReply {
    let r = conn.call(
        smallvec::smallvec![wire],
        1,
        crate::backend::deadline(timeout),
    );
    Ok(r.await?.get(0))
}

/// Before this session's next jobs leave, its combined writes of the keys they hold (and
/// every salted-key task) must have reached their node.
pub(in crate::proxy) async fn wait_barrier(s: &mut Session, rb: &RoundBuilder) {
    if !rb.jobs.is_empty() {
        s.order.wait_for(&rb.keys).await;
    }
}
