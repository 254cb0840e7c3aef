//! The act phase for commands that go to the nodes: which node a command's keys live on,
//! adding a command to that node's job in the round, and fanning a command out (split per
//! node, every node, SCAN one node at a time) with the merge its reply needs.

use bytes::Bytes;
use smallvec::SmallVec;

use crate::command::{Access, Agg, Classified, Cmd, Split};
use crate::proxy::conn::round::{Merge, Part, RoundBuilder, Slot};
use crate::proxy::conn::scan;
use crate::proxy::conn::state::{err_bytes, Session};
use crate::resp::Request;

/// The node of every key of a keyed command, or the error a client sees when they span
/// nodes (on a cluster: slots, with Redis Cluster's own CROSSSLOT error).
pub fn keys_node(s: &Session, req: &Request, c: &Classified) -> Result<usize, Bytes> {
    Ok(keys_group(s, req, c)?.map_or_else(|| s.ctx().backend.any_node(), |(_, n)| n))
}

/// The group (a cluster's slot, a pool's node) and node every key of a command shares;
/// None for a command without keys.
fn keys_group(s: &Session, req: &Request, c: &Classified) -> Result<Option<(u32, usize)>, Bytes> {
    let b = &s.ctx().backend;
    let keys = c.keys.iter().map(|&k| req.arg(k as usize));
    let group = shared_group(b, c.spec.name, keys)?;
    if matches!(c.spec.cmd, Cmd::Sort | Cmd::SortRo) && b.placement().is_some() {
        if let Some((_, n)) = group {
            sort_patterns_on(s, req, c, n)?;
        }
    }
    Ok(group)
}

/// The group (a cluster's slot, a pool's node) and node that every one of `keys` shares,
/// or the error a client sees when they span nodes (on a cluster: slots, with Redis
/// Cluster's own CROSSSLOT error); None without keys.
pub(in crate::proxy) fn shared_group<'k>(
    b: &crate::backend::Backend,
    name: &str,
    keys: impl Iterator<Item = &'k [u8]>,
) -> Result<Option<(u32, usize)>, Bytes> {
    let mut group: Option<(u32, usize)> = None;
    for key in keys {
        let g = b.group_of(key);
        match group {
            None => group = Some(g),
            Some((_, n)) if !b.by_slot() && n != g.1 => {
                return Err(err_bytes(&format!(
                    "ERR saltshaker: {} keys on different nodes ({} and {}); keep them together with a hash tag",
                    name,
                    b.node(n).addr,
                    b.node(g.1).addr
                )))
            }
            Some((slot, _)) if slot != g.0 => {
                return Err(err_bytes(
                    "CROSSSLOT Keys in request don't hash to the same slot",
                ))
            }
            _ => {}
        }
    }
    Ok(group)
}

/// SORT's BY and GET patterns name keys no key spec holds. On a pool they are answered
/// right only when every key they can form lives on the sorted key's node: the pattern's
/// hash tag comes before its `*` (so no element can change it) and places it there.
/// Otherwise the node would read them as missing and answer wrong, so the command is
/// refused as a multi-key command across nodes is. (A cluster's node applies Redis
/// Cluster's own rule for the same case.)
fn sort_patterns_on(s: &Session, req: &Request, c: &Classified, node: usize) -> Result<(), Bytes> {
    let b = &s.ctx().backend;
    let (tag, random) = (b.hash_tag(), b.random());
    for p in crate::command::sort_patterns(req) {
        let hashed = crate::backend::placement::hash_tag(p, tag);
        let star = p.iter().position(|&x| x == b'*').unwrap_or(0);
        let tag_end = hashed.as_ptr() as usize - p.as_ptr() as usize + hashed.len();
        let placed = !random && hashed.len() < p.len() && tag_end < star;
        if !placed || b.node_for(p) != node {
            return Err(err_bytes(&format!(
                "ERR saltshaker: {} BY/GET pattern '{}' names keys that may be on other nodes than {}; keep them together with a hash tag before the '*'",
                c.spec.name,
                String::from_utf8_lossy(p),
                b.node(node).addr
            )));
        }
    }
    Ok(())
}

/// SORT or SORT_RO on a pool whose BY/GET patterns or STORE destination name keys on other
/// nodes than the sorted key's: the proxy runs it across the nodes (`sort`).
pub(in crate::proxy) fn sort_spans_nodes(s: &Session, req: &Request, c: &Classified) -> bool {
    let b = &s.ctx().backend;
    if !matches!(c.spec.cmd, Cmd::Sort | Cmd::SortRo) || b.placement().is_none() {
        return false;
    }
    let home = b.node_for(req.arg(1));
    c.keys
        .iter()
        .any(|&k| b.node_for(req.arg(k as usize)) != home)
        || sort_patterns_on(s, req, c, home).is_err()
}

/// A storing command on a pool whose sources share a node and whose destination is on
/// another: the result moves there (`store`). The destination's place among the keys.
pub(in crate::proxy) fn store_spans_nodes(
    s: &Session,
    req: &Request,
    c: &Classified,
) -> Option<usize> {
    let b = &s.ctx().backend;
    if b.placement().is_none() || b.random() {
        return None;
    }
    let dest = super::store::destination(c)?;
    let node = |i: usize| b.node_for(req.arg(c.keys[i] as usize));
    let sources: Vec<usize> = (0..c.keys.len()).filter(|&i| i != dest).map(node).collect();
    let one = sources.first().copied()?;
    (sources.iter().all(|&n| n == one) && node(dest) != one).then_some(dest)
}

/// A command that only reads: on a cluster with `read_from`, a replica may answer it.
fn reads_only(c: &Classified) -> bool {
    c.access == Access::Read
}

pub(in crate::proxy) fn forward_keyed(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    rb: &mut RoundBuilder,
) {
    if sort_spans_nodes(s, req, c) {
        return super::sort::across(s, req, c, rb);
    }
    if let Some(dest) = store_spans_nodes(s, req, c) {
        return super::store::across(s, req, c, dest, rb);
    }
    let node = keys_group(s, req, c).and_then(|group| match group {
        Some(g) if reads_only(c) => s
            .ctx()
            .backend
            .reader_in(g)
            .map_err(|e| err_bytes(&e.to_string())),
        Some((_, n)) => Ok(n),
        None => Ok(s.ctx().backend.any_node()),
    });
    match node {
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
    rb.push(node, || s.conn(node), wire, count)
}

pub(in crate::proxy) fn split(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    kind: Split,
    rb: &mut RoundBuilder,
) {
    let b = &s.ctx().backend;
    let step = if matches!(kind, Split::Mset) { 2 } else { 1 };
    // Group key positions by node (by slot, on a cluster), keeping request order inside
    // each group.
    // ((group, node), key positions)
    type Groups = SmallVec<[((u32, usize), Vec<u32>); 4]>;
    let mut groups: Groups = SmallVec::new();
    let mut order: Vec<(u16, u32)> = Vec::with_capacity(c.keys.len());
    for &k in &c.keys {
        let n = b.group_of(req.arg(k as usize));
        let g = match groups.iter().position(|(m, _)| m.0 == n.0) {
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
    // MGET reads only: on a cluster with `read_from`, a replica of each slot answers.
    let mut nodes: SmallVec<[usize; 8]> = SmallVec::new();
    for group in groups.iter().map(|(g, _)| *g) {
        match kind {
            Split::Mget => match s.ctx().backend.reader_in(group) {
                Ok(n) => nodes.push(n),
                Err(e) => {
                    rb.slots.push(Slot::Ready(err_bytes(&e.to_string())));
                    return;
                }
            },
            _ => nodes.push(group.1),
        }
    }
    let mut parts = Vec::with_capacity(groups.len());
    for ((_, keys), node) in groups.iter().zip(&nodes) {
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

/// The command as it came, once to every master: the parts to merge.
pub(in crate::proxy) fn to_masters(
    s: &mut Session,
    req: &Request,
    rb: &mut RoundBuilder,
) -> Vec<Part> {
    s.ctx()
        .backend
        .masters()
        .into_iter()
        .map(|n| push(s, rb, n, req.wire()))
        .collect()
}

pub(in crate::proxy) fn all_nodes(
    s: &mut Session,
    req: &Request,
    _c: &Classified,
    agg: Agg,
    rb: &mut RoundBuilder,
) {
    if let Agg::First = agg {
        let node = s.ctx().backend.any_node();
        let part = push(s, rb, node, req.wire());
        rb.slots.push(Slot::Reply(part));
        return;
    }
    let parts = to_masters(s, req, rb);
    let merge = match agg {
        Agg::SumInt => Merge::SumInt(parts),
        Agg::AllOk => Merge::AllOk(parts),
        Agg::ConcatArrays => Merge::Concat(parts),
        Agg::Slowlog => {
            // Redis: no count is 10, -1 is every entry (a bad count is the nodes' error).
            let count = match req.argc() {
                2 => Some(10),
                _ => crate::resp::parse_i64(req.arg(2)).and_then(|n| usize::try_from(n).ok()),
            };
            Merge::Slowlog { parts, count }
        }
        Agg::AndArrays => Merge::AndArrays(parts),
        Agg::MinInt => Merge::MinInt(parts),
        Agg::First => unreachable!("handled above"),
    };
    rb.slots.push(Slot::Merge(Box::new(merge)));
}

/// SCAN walks the nodes that hold the keys (a cluster's masters) one after another; the
/// cursor carries the place in that list.
pub(in crate::proxy) fn scan_one(s: &mut Session, req: &Request, rb: &mut RoundBuilder) {
    let masters = s.ctx().backend.masters();
    let nodes = masters.len().max(1);
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
    let wire = crate::backend::wire(&args);
    // A node started afresh: the nodes after it start afresh too, in the same round, so
    // that a small keyspace is scanned in one call (cursor 0), as on one Redis. The merge
    // keeps the nodes up to the first one not finished; the rest are asked again later.
    let last = if backend_cursor == 0 { nodes } else { node + 1 };
    let parts = (node..last.min(nodes).max(node + 1))
        .map(|n| push(s, rb, masters.get(n).copied().unwrap_or(0), wire.clone()))
        .collect();
    rb.slots
        .push(Slot::Merge(Box::new(Merge::Scan { parts, node, nodes })));
}

/// SCRIPT KILL or FUNCTION KILL: sent at once to every node, each on a fresh connection of
/// its own, because a node running a script answers its shared connections only once the
/// script ends. The reply is what one node would say: OK if a node killed something, else
/// the first refusal other than NOTBUSY (UNKILLABLE: the script wrote), else NOTBUSY.
pub(in crate::proxy) fn kill(s: &mut Session, req: &Request, rb: &mut RoundBuilder) {
    let wire = req.wire();
    let timeout = s.ctx().backend.request_timeout;
    let handshakes: Vec<_> = s
        .ctx()
        .backend
        .nodes()
        .iter()
        .map(|n| n.handshake(crate::resp::Proto::Resp2, 0))
        .collect();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        // Every node at once: the busy one must not wait behind the others.
        let asks: Vec<_> = handshakes
            .into_iter()
            .map(|hs| {
                let wire = wire.clone();
                let addr = hs.addr.clone();
                let task = tokio::spawn(async move {
                    let ask = async {
                        let mut d = crate::backend::Dedicated::open(&hs).await?;
                        d.call(&[wire], 1).await.map(|r| r.get(0))
                    };
                    match timeout {
                        Some(t) => tokio::time::timeout(t, ask)
                            .await
                            .unwrap_or(Err(crate::backend::BackendError::Timeout(hs.addr.clone()))),
                        None => ask.await,
                    }
                });
                (addr, task)
            })
            .collect();
        let mut replies = Vec::with_capacity(asks.len());
        for (addr, a) in asks {
            replies.push(
                a.await
                    .unwrap_or(Err(crate::backend::BackendError::Closed(addr))),
            );
        }
        let _ = tx.send(kill_reply(replies));
    });
    rb.slots.push(Slot::Later(rx));
}

fn kill_reply(replies: Vec<Result<Bytes, crate::backend::BackendError>>) -> Bytes {
    let mut refusal = None;
    let mut notbusy = None;
    let mut failure = None;
    for r in replies {
        match r {
            Ok(b) if b.starts_with(b"+") => return b,
            Ok(b) if b.starts_with(b"-NOTBUSY") => notbusy = notbusy.or(Some(b)),
            Ok(b) => refusal = refusal.or(Some(b)),
            Err(e) => failure = failure.or(Some(err_bytes(&format!("ERR saltshaker: {e}")))),
        }
    }
    refusal
        .or(notbusy)
        .or(failure)
        .unwrap_or_else(|| err_bytes("ERR saltshaker: no node to send the command to"))
}

pub(in crate::proxy) fn is_pubsub_command(cmd: Cmd) -> bool {
    matches!(cmd, Cmd::Publish | Cmd::Spublish) || cmd.family() == Cmd::Pubsub
}

/// Where a pub/sub command goes. A pool keeps every channel on its first node, so every
/// proxy's subscribers meet every publisher there. A cluster broadcasts PUBLISH to every
/// node, so any master will do; its shard channels (SPUBLISH, SSUBSCRIBE) live on the
/// master of the channel's slot, and one SSUBSCRIBE names one slot.
pub(in crate::proxy) fn pubsub_node(s: &Session, req: &Request, cmd: Cmd) -> Result<usize, Bytes> {
    let b = &s.ctx().backend;
    if !b.by_slot() {
        return Ok(0);
    }
    if !matches!(cmd, Cmd::Spublish | Cmd::Ssubscribe | Cmd::Sunsubscribe) || req.argc() < 2 {
        return Ok(b.any_node());
    }
    let last = if cmd == Cmd::Spublish { 2 } else { req.argc() };
    let (slot, node) = b.group_of(req.arg(1));
    if (2..last).any(|i| b.group_of(req.arg(i)).0 != slot) {
        return Err(err_bytes(
            "CROSSSLOT Keys in request don't hash to the same slot",
        ));
    }
    Ok(node)
}
