//! The task behind one shared, pipelined connection to a backend node: it connects,
//! serves, and reconnects.
//!
//! Sessions hand the connection *jobs*: the wire bytes of one or more commands and a
//! oneshot for their replies. Each worker thread's relay (`wire`) drains its sessions'
//! queued jobs into one vectored write (many client commands in one syscall); a reader
//! frames replies with `resp::ReplyFramer` and completes jobs strictly in order. When the
//! connection breaks, the reads in flight are sent again on the next connection (once),
//! and every other job in flight fails: it might have run. While the node is down new jobs
//! are answered at once with an error instead of letting clients wait: the other nodes
//! keep serving. A connection
//! that breaks after it was up a while is reopened at once, and the jobs queued meanwhile
//! go on the new one; failed connects back off exponentially between `reconnect_min_ms`
//! and `reconnect_max_ms`.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use smallvec::SmallVec;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::job::{Job, Replies};
use super::wire::{write_jobs, Pending, State, Wire, Writer};
use super::{BackendError, Handshake, NodeMetrics};
use crate::net::{ReadHalf, Stream};
use crate::resp::ReplyFramer;

/// A connection that lived at least this long before it broke is reopened at once; one
/// that broke sooner is treated like a failed connect (backoff), so a node that accepts
/// and then drops every connection is not hammered.
const RECONNECT_AT_ONCE_AFTER: Duration = Duration::from_secs(1);

pub(super) async fn supervise(
    hs: Arc<Handshake>,
    wire: Arc<Wire>,
    up: Arc<AtomicBool>,
    m: NodeMetrics,
) {
    let min = Duration::from_millis(hs.reconnect_min_ms);
    let max = Duration::from_millis(hs.reconnect_max_ms);
    let mut backoff = min;
    let mut was_down_logged = false;
    // The first connect of this link is not a reconnect (see `NodeMetrics::connects`).
    let mut first = true;
    // Reads that were in flight on a connection that broke, sent again first on the next.
    let mut again: Vec<Job> = Vec::new();
    loop {
        let up_since = Instant::now();
        let reason = match hs.connect().await {
            Ok(stream) => {
                backoff = min;
                up.store(true, Ordering::Relaxed);
                m.up.set(1);
                m.connections.inc();
                if !std::mem::take(&mut first) {
                    m.connects.fetch_add(1, Ordering::Relaxed);
                }
                if was_down_logged {
                    tracing::info!(node = %hs.addr, "backend node is back");
                    was_down_logged = false;
                }
                let reason = serve(stream, &wire, std::mem::take(&mut again), &hs, &m).await;
                up.store(false, Ordering::Relaxed);
                m.up.set(0);
                m.connections.dec();
                match reason {
                    None => return, // every handle dropped: shutting down
                    Some((r, unanswered)) => {
                        // Reads in flight are sent again on the next connection (once:
                        // what `serve` hands back was not already a second try); any
                        // other command might have run, and its caller is told so.
                        for mut job in unanswered {
                            match !job.again && job.retry_safe() {
                                true => {
                                    job.again = true;
                                    again.push(job);
                                }
                                false => job.lost(&hs.addr),
                            }
                        }
                        let kind = match r {
                            BackendError::Protocol { .. } => "protocol",
                            _ => "io",
                        };
                        m.errors(kind).inc();
                        // An open connection broke (CLIENT KILL, a node's timeout, a
                        // reset): the node is likely fine. Reconnect at once; jobs not yet
                        // written wait, within their deadlines, for the new connection.
                        // Only a failed connect, or a connection that breaks as soon as it
                        // opens, backs off and fails jobs meanwhile.
                        if up_since.elapsed() >= RECONNECT_AT_ONCE_AFTER {
                            tracing::info!(node = %hs.addr, error = %r, "backend connection broke; reconnecting at once");
                            continue;
                        }
                        r
                    }
                }
            }
            Err(e) => {
                m.errors("connect").inc();
                e
            }
        };
        for job in again.drain(..) {
            job.lost(&hs.addr);
        }
        if !was_down_logged {
            tracing::warn!(node = %hs.addr, error = %reason, "backend node is down; failing its requests until it reconnects");
            was_down_logged = true;
        }
        // While down, every job is answered at once: clients must not wait on a dead node.
        wire.set(State::Down(reason.to_string())).await;
        let until = tokio::time::Instant::now() + backoff;
        backoff = (backoff * 2).min(max);
        tokio::select! {
            _ = tokio::time::sleep_until(until) => {}
            _ = wire.closing.notified() => {}
        }
        wire.set(State::Connecting).await;
        if wire.is_closed() {
            return;
        }
    }
}

/// Runs one established connection until it breaks (Some(reason, the jobs it leaves
/// unanswered)) or every handle is dropped (None). `again` is written first: reads a
/// broken connection left unanswered. The relays write everything else (`wire`).
async fn serve(
    stream: Stream,
    wire: &Wire,
    again: Vec<Job>,
    hs: &Handshake,
    m: &NodeMetrics,
) -> Option<(BackendError, Vec<Job>)> {
    let (r, w) = stream.into_split();
    let (inflight_tx, inflight_rx) = mpsc::unbounded_channel::<Job>();
    // Commands written and not answered on this connection (the node's pending gauge sums
    // them over its connections); what is left when the connection ends is taken off.
    let open = Pending {
        n: Arc::new(AtomicI64::new(0)),
        gauge: m.pending.clone(),
        none: Arc::default(),
    };
    let mut reader = tokio::spawn(read_loop(
        r,
        inflight_rx,
        hs.max_reply_bulk,
        open.clone(),
        hs.addr.clone(),
    ));
    let mut wr = Writer {
        w,
        inflight: inflight_tx,
        open: open.clone(),
    };
    {
        // Under the lock, so that no relay writes before the reads sent again.
        let mut g = wire.state.lock().await;
        if !again.is_empty() {
            let mut again = again;
            let n: u64 = again.iter().map(|j| j.count as u64).sum();
            open.add(n as i64);
            if let Err((e, unsent)) = write_jobs(&mut wr, &mut again, &hs.addr).await {
                drop(g);
                let mut left = reader_leftovers(&mut reader).await;
                left.extend(unsent);
                open.take(i64::MAX);
                return Some((e, left));
            }
        }
        *g = State::Up(wr);
    }
    wire.changed.notify_waiters();
    let (reason, unanswered) = loop {
        tokio::select! {
            res = &mut reader => {
                break match res {
                    Ok(r) => r,
                    Err(_) => (BackendError::io(&hs.addr, "reader task failed"), Vec::new()),
                };
            }
            _ = wire.broken.notified() => {
                // A relay's write failed. What the reader holds unanswered goes back, in
                // order: reads among them go on the next connection, anything else fails.
                let mut g = wire.state.lock().await;
                let e = match std::mem::replace(&mut *g, State::Connecting) {
                    State::Broken(e) => e,
                    // A wake left from an earlier connection: this one is fine.
                    other => {
                        *g = other;
                        continue;
                    }
                };
                drop(g);
                break (e, reader_leftovers(&mut reader).await);
            }
            _ = wire.closing.notified() => {
                if !wire.is_closed() {
                    continue;
                }
                // Every handle dropped (shutdown, or a tracked connection replaced for a
                // new tracker): the commands already written get their replies first, for
                // a few seconds at most.
                let until = tokio::time::sleep(DRAIN_ON_DROP);
                tokio::pin!(until);
                while open.n.load(Ordering::Relaxed) > 0 {
                    tokio::select! {
                        _ = &mut reader => break,
                        _ = open.none.notified() => {}
                        _ = &mut until => break,
                    }
                }
                reader.abort();
                wire.set(State::Connecting).await;
                open.take(i64::MAX);
                return None;
            }
        }
    };
    // Take the writer back (if a relay has not): relays wait for the next connection.
    wire.set(State::Connecting).await;
    open.take(i64::MAX);
    Some((reason, unanswered))
}

/// How long a connection whose handles are all gone keeps reading the replies of the
/// commands it already wrote.
const DRAIN_ON_DROP: Duration = Duration::from_secs(5);

/// After a failed write: the jobs the reader holds unanswered, once it has seen the broken
/// connection too (a moment at most), so that reads among them are sent again rather than
/// failed.
async fn reader_leftovers(
    reader: &mut tokio::task::JoinHandle<(BackendError, Vec<Job>)>,
) -> Vec<Job> {
    match tokio::time::timeout(Duration::from_secs(1), &mut *reader).await {
        Ok(Ok((_, left))) => left,
        _ => {
            reader.abort();
            Vec::new()
        }
    }
}

/// Whether a push frame is Redis's `tracking-redir-broken`.
fn redirect_broken(frame: &[u8]) -> bool {
    matches!(
        crate::resp::parse_value(frame),
        Ok(Some((crate::resp::Value::Push(v), _)))
            if matches!(v.first(), Some(crate::resp::Value::Bulk(b)) if &b[..] == b"tracking-redir-broken")
    )
}

/// Frames replies and completes jobs in order. Returns why it stopped, and the jobs it
/// leaves unanswered, in order.
async fn read_loop(
    r: ReadHalf,
    mut inflight: mpsc::UnboundedReceiver<Job>,
    max_bulk: usize,
    open: Pending,
    node: String,
) -> (BackendError, Vec<Job>) {
    let mut cur: Option<Job> = None;
    let e = frame_replies(r, &mut inflight, &mut cur, max_bulk, open, &node).await;
    let mut left: Vec<Job> = cur.into_iter().collect();
    while let Ok(job) = inflight.try_recv() {
        left.push(job);
    }
    (e, left)
}

async fn frame_replies(
    mut r: ReadHalf,
    inflight: &mut mpsc::UnboundedReceiver<Job>,
    cur: &mut Option<Job>,
    max_bulk: usize,
    open: Pending,
    node: &str,
) -> BackendError {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut framer = ReplyFramer::new(max_bulk);
    let mut ends: SmallVec<[u32; 16]> = SmallVec::new();
    let mut pos = 0usize; // end of the last complete reply of the current job
    loop {
        // Frame every complete reply in the buffer.
        loop {
            if pos >= buf.len() {
                break;
            }
            let len = match framer.next_len(&buf[pos..]) {
                Ok(Some(len)) => len,
                Ok(None) => break,
                Err(e) => return BackendError::protocol(node, e),
            };
            if buf[pos] == b'>' {
                // A tracked connection (client-side caching) is told when the tracker it
                // redirects to is gone; the tracker's own reconnect handles that, and the
                // replies around the push are the jobs'. Shared connections never
                // subscribe, so any other push means the stream is not what we think it
                // is: reconnect rather than misattribute.
                if !redirect_broken(&buf[pos..pos + len]) {
                    return BackendError::protocol(
                        node,
                        "unexpected push message on a shared connection",
                    );
                }
                let mut rest = buf.split_off(pos);
                bytes::Buf::advance(&mut rest, len);
                buf.unsplit(rest);
                continue;
            }
            if cur.is_none() {
                match inflight.try_recv() {
                    Ok(p) => *cur = Some(p),
                    Err(_) => return BackendError::protocol(node, "reply without a request"),
                }
            }
            pos += len;
            ends.push(pos as u32);
            let count = cur.as_ref().map_or(0, |j| j.count);
            if ends.len() == count as usize {
                let Some(job) = cur.take() else {
                    return BackendError::protocol(node, "reply without a request");
                };
                open.take(count as i64);
                let data = buf.split_to(pos).freeze();
                let _ = job.tx.send(Ok(Replies {
                    buf: data,
                    ends: std::mem::take(&mut ends),
                }));
                pos = 0;
            }
        }
        if buf.capacity() - buf.len() < 16 * 1024 {
            buf.reserve(64 * 1024);
        }
        match r.read_buf(&mut buf).await {
            Ok(0) => return BackendError::io(node, "connection closed by the node"),
            Ok(_) => {}
            Err(e) => return BackendError::io(node, e),
        }
    }
}
