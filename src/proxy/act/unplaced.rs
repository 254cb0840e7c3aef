//! A command learned from the nodes whose key specs do not say where its keys are
//! (`command::flags::UNPLACED`: a module command with two key ranges, a keyword search, a
//! movable-keys command without a spec), over a pool or a cluster. One node is asked
//! `COMMAND GETKEYS` with the command's own arguments, in a task of the session; the
//! command then goes to the node of the keys it names, with the usual cross-node error, or
//! to any node when it names none. It costs one more round to a node, only for these
//! commands; a built-in or well-specified one never comes here. Over one node such a
//! command is simply forwarded (`session::handle`).

use bytes::Bytes;
use smallvec::smallvec;
use tokio::time::Instant;

use crate::backend::{Backend, BackendError, ConnHandle};
use crate::command::Classified;
use crate::proxy::act::route::shared_group;
use crate::proxy::conn::round::{RoundBuilder, Slot};
use crate::proxy::conn::state::{err_bytes, Session};
use crate::resp::{parse_value, Request, Value};

/// Asks a node where the command's keys are, then sends it there; the reply comes from a
/// task, in the command's turn.
pub(in crate::proxy) fn via_getkeys(
    s: &mut Session,
    req: &Request,
    c: &Classified,
    rb: &mut RoundBuilder,
) {
    let backend = s.ctx().backend.clone();
    let conns: Vec<ConnHandle> = (0..backend.len()).map(|n| s.conn(n)).collect();
    let deadline = backend.request_timeout.map(|t| Instant::now() + t);
    let mut ask: Vec<&[u8]> = vec![b"COMMAND", b"GETKEYS"];
    ask.extend(req.args());
    let ask = crate::backend::wire(&ask);
    let wire = req.wire();
    let name = c.spec.fullname();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let reply = match run(&backend, &conns, ask, wire, &name, deadline).await {
            Ok(b) | Err(b) => b,
        };
        let _ = tx.send(reply);
    });
    rb.slots.push(Slot::Later(rx));
    // What the session sends next waits for this reply: it must not reach a node first.
    s.settle_next();
}

async fn run(
    backend: &Backend,
    conns: &[ConnHandle],
    ask: Bytes,
    wire: Bytes,
    name: &str,
    deadline: Option<Instant>,
) -> Result<Bytes, Bytes> {
    let failed = |e: BackendError| err_bytes(&format!("ERR saltshaker: {e}"));
    let any = backend.any_node();
    let r = conns[any]
        .call(smallvec![ask], 1, deadline)
        .await
        .map_err(failed)?;
    let node = match parse_value(&r.get(0)) {
        Ok(Some((Value::Array(keys), _))) => {
            let keys: Vec<Bytes> = keys
                .into_iter()
                .filter_map(|k| match k {
                    Value::Bulk(b) | Value::Simple(b) => Some(b),
                    _ => None,
                })
                .collect();
            shared_group(backend, name, keys.iter().map(|k| &k[..]))?.map_or(any, |(_, n)| n)
        }
        // No keys ("The command has no key arguments"), or arguments the node refuses:
        // the command goes to one node, which answers for itself.
        _ => any,
    };
    let r = conns[node]
        .call(smallvec![wire], 1, deadline)
        .await
        .map_err(failed)?;
    Ok(r.get(0))
}
