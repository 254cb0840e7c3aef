//! Sending the round built so far ahead of a command that must not join it: `flush` (a
//! salted task, an admission delay), `settle`, which also waits until every earlier
//! reply is in (a change of database, protocol or lane: two connections are not ordered
//! at the node), `paused`, the wait of a command that CLIENT PAUSE holds, and `may_read`,
//! the wait before a read while the client owes (or would owe) more than its output limit.

use tokio::sync::{mpsc, watch};

use crate::command::Cmd;
use crate::proxy::act::mitigation::wait_barrier;
use crate::proxy::conn::round::{Queued, RoundBuilder};
use crate::proxy::conn::state::Session;
use crate::resp::Proto;

/// Before a read of the client: the writer may say it owes more than the output limit
/// (read none of its commands, TCP pushes back, until it has read enough or is given up),
/// and the replies already asked for may pass that limit (`round::Inflight`: read
/// nothing more until the writer takes some). False when the connection is to end.
pub(in crate::proxy) async fn may_read(
    s: &Session,
    tx: &mpsc::Sender<Queued>,
    owing: &mut watch::Receiver<bool>,
    killed: &mut watch::Receiver<bool>,
) -> bool {
    if *owing.borrow() {
        tokio::select! {
            biased;
            _ = tx.closed() => return false,
            r = owing.wait_for(|o| !*o) => if r.is_err() { return false },
        }
    }
    let limit = s.ctx().max_output;
    while limit > 0 && s.inflight.over(limit) {
        tokio::select! {
            biased;
            _ = tx.closed() => return false,
            _ = killed.wait_for(|k| *k) => return false,
            _ = s.inflight.freed() => {}
        }
    }
    true
}

/// Whether CLIENT PAUSE WRITE holds `c`: it writes or may (EVAL, PUBLISH), or is EXEC,
/// whatever it queued.
pub(in crate::proxy) fn writes(c: &crate::command::Classified) -> bool {
    use crate::command::flags::{MAY_REPLICATE, WRITE};
    c.spec.has(WRITE | MAY_REPLICATE) || c.spec.cmd == Cmd::Exec
}

/// A command CLIENT PAUSE holds: the commands read before it go first, as on Redis; it
/// waits until the pause ends, counted in blocked_clients. False when the client is gone
/// or killed meanwhile.
pub(in crate::proxy) async fn paused(
    s: &mut Session,
    c: &crate::command::Classified,
    rb: &mut RoundBuilder,
    tx: &mpsc::Sender<Queued>,
    killed: &mut watch::Receiver<bool>,
) -> bool {
    if !rb.is_empty() && !flush(s, rb, tx).await {
        return false;
    }
    let _paused = crate::proxy::conn::round::Blocked::new(&s.me, None);
    tokio::select! {
        _ = s.ctx().pause.wait(writes(c)) => true,
        _ = killed.wait_for(|k| *k) => false,
    }
}

/// Sends the round built so far, before a command that must not join it; false when the
/// client is gone.
pub(in crate::proxy) async fn flush(
    s: &mut Session,
    rb: &mut RoundBuilder,
    tx: &mpsc::Sender<Queued>,
) -> bool {
    let proto = s.proto();
    send_ahead(s, rb, tx, proto, None).await
}

/// After a command that changed the connection's database or protocol (SELECT, HELLO,
/// RESET), or before one that takes another lane to its node (a script): the commands
/// before it leave on the old database's (protocol's, lane's) shared connections, and the
/// commands after it on the new one's. Two connections are not ordered against each other
/// at the node, so the round built so far is sent, in the old protocol, and the session
/// waits until every earlier reply is in before it goes on: each command runs in the
/// database its client had selected when it sent it, and after everything it sent before.
/// A client changes database rarely (once, after connecting, when nothing is in flight),
/// so the wait costs nothing on the common path. False when the client is gone.
pub(in crate::proxy) async fn settle(
    s: &mut Session,
    rb: &mut RoundBuilder,
    tx: &mpsc::Sender<Queued>,
    proto: Proto,
) -> bool {
    let (done_tx, done) = tokio::sync::oneshot::channel();
    if !send_ahead(s, rb, tx, proto, Some(done_tx)).await {
        return false;
    }
    // The writer answers rounds in order: once this one is answered, so is every earlier
    // one. A writer that gave up drops the sender, which ends the wait as well.
    let _ = done.await;
    true
}

/// Sends the round built so far; what comes next (a salted task, a combined write) waits
/// for it. `done` fires once it is answered.
async fn send_ahead(
    s: &mut Session,
    rb: &mut RoundBuilder,
    tx: &mpsc::Sender<Queued>,
    proto: Proto,
    done: Option<tokio::sync::oneshot::Sender<()>>,
) -> bool {
    wait_barrier(s, rb).await;
    let mut rb = std::mem::take(rb);
    let keys = std::mem::take(&mut rb.keys);
    let mut round = rb.send(s.ctx().backend.request_timeout, &s.inflight).await;
    let track = s.tracks_keys();
    s.order.flushed(&mut round, keys, track);
    round.acked.extend(done);
    tx.send(Box::new((round, proto))).await.is_ok()
}
