//! The task behind one shared, pipelined connection to a backend node: it connects,
//! serves, and reconnects.
//!
//! Sessions hand the connection *jobs*: the wire bytes of one or more commands and a
//! oneshot for their replies. A writer drains every queued job into one vectored write
//! (many client commands in one syscall); a reader frames replies with `resp::ReplyFramer`
//! and completes jobs strictly in order. When the connection breaks, the reads in flight
//! are sent again on the next connection (once), and every other job in flight fails: it
//! might have run. While the node is down the supervisor answers new jobs at once with
//! an error instead of letting clients wait: the other nodes keep serving. A connection
//! that breaks after it was up a while is reopened at once, and the jobs queued meanwhile
//! go on the new one; failed connects back off exponentially between `reconnect_min_ms`
//! and `reconnect_max_ms`.

use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::{BackendError, Handshake, NodeMetrics};
use crate::net::{ReadHalf, Stream, WriteHalf};
use crate::resp::ReplyFramer;

/// Replies to one job: `ends[i]` is where reply `i` ends in `buf`.
#[derive(Debug, Clone)]
pub struct Replies {
    pub buf: Bytes,
    pub ends: SmallVec<[u32; 16]>,
}

impl Replies {
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Whether any reply is an error (its first byte is `-`).
    pub fn has_error(&self) -> bool {
        let mut start = 0;
        for &end in &self.ends {
            if self.buf.get(start) == Some(&b'-') {
                return true;
            }
            start = end as usize;
        }
        false
    }

    /// Reply `i` as raw RESP bytes (zero-copy).
    pub fn get(&self, i: usize) -> Bytes {
        self.buf.slice(self.range(i))
    }

    /// Reply `i`, borrowed.
    pub fn get_ref(&self, i: usize) -> &[u8] {
        &self.buf[self.range(i)]
    }

    fn range(&self, i: usize) -> std::ops::Range<usize> {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        start..self.ends[i] as usize
    }
}

pub type ReplyTx = oneshot::Sender<Result<Replies, BackendError>>;
pub type ReplyRx = oneshot::Receiver<Result<Replies, BackendError>>;

/// Commands for one node, sent as one unit: their bytes are written contiguously, so a
/// `MULTI ... EXEC` job cannot interleave with other sessions' commands.
pub struct Job {
    pub data: SmallVec<[Bytes; 4]>,
    pub count: u32,
    pub tx: ReplyTx,
    /// Sent again after a connection broke with it unanswered: not tried a third time.
    again: bool,
}

impl Job {
    pub fn new(data: SmallVec<[Bytes; 4]>, count: u32, tx: ReplyTx) -> Job {
        Job {
            data,
            count,
            tx,
            again: false,
        }
    }

    pub fn fail(self, e: BackendError) {
        let _ = self.tx.send(Err(e));
    }

    /// Whether the job may be sent again after its connection broke with it unanswered:
    /// every command in it only reads (Redis's `readonly` flag, not blocking), one per
    /// buffer. A read run twice answers as once; a write might have run.
    fn retry_safe(&self) -> bool {
        self.count > 0
            && self.data.len() == self.count as usize
            && self.data.iter().all(|cmd| {
                command_name(cmd)
                    .and_then(crate::command::lookup)
                    .is_some_and(|spec| {
                        spec.is_read()
                            && !spec.is_write()
                            && !spec.is_container()
                            && !spec.has(crate::command::flags::BLOCKING)
                    })
            })
    }

    fn lost(self, node: &str) {
        self.fail(BackendError::Down {
            node: node.to_string(),
            reason: LOST.into(),
        })
    }
}

/// Why a job's caller got no reply: its connection broke with it in flight.
pub(super) const LOST: &str =
    "connection lost before the reply; the command may or may not have run";

/// The name of a command in RESP's request form (`*N\r\n$L\r\nNAME\r\n...`).
fn command_name(wire: &[u8]) -> Option<&[u8]> {
    let rest = wire.strip_prefix(b"*")?;
    let rest = &rest[rest.iter().position(|&b| b == b'\n')? + 1..];
    let rest = rest.strip_prefix(b"$")?;
    let nl = rest.iter().position(|&b| b == b'\n')?;
    let len: usize = std::str::from_utf8(rest[..nl].strip_suffix(b"\r")?)
        .ok()?
        .parse()
        .ok()?;
    rest.get(nl + 1..nl + 1 + len)
}

/// A connection that lived at least this long before it broke is reopened at once; one
/// that broke sooner is treated like a failed connect (backoff), so a node that accepts
/// and then drops every connection is not hammered.
const RECONNECT_AT_ONCE_AFTER: Duration = Duration::from_secs(1);

pub(super) async fn supervise(
    hs: Arc<Handshake>,
    mut rx: mpsc::Receiver<Job>,
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
                let reason = serve(stream, &mut rx, std::mem::take(&mut again), &hs, &m).await;
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
                        // written wait in the queue, within their deadlines, for the new
                        // connection. Only a failed connect, or a connection that breaks
                        // as soon as it opens, backs off and fails jobs meanwhile.
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
        // While down, answer every job at once: clients must not wait on a dead node.
        let until = tokio::time::Instant::now() + backoff;
        backoff = (backoff * 2).min(max);
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(until) => break,
                job = rx.recv() => match job {
                    Some(job) => {
                        m.errors("down").inc();
                        job.fail(BackendError::Down { node: hs.addr.clone(), reason: reason.to_string() });
                    }
                    None => return,
                },
            }
        }
    }
}

/// Runs one established connection until it breaks (Some(reason, the jobs it leaves
/// unanswered)) or every handle is dropped (None).
/// `again` is written first: reads a broken connection left unanswered.
async fn serve(
    stream: Stream,
    rx: &mut mpsc::Receiver<Job>,
    again: Vec<Job>,
    hs: &Handshake,
    m: &NodeMetrics,
) -> Option<(BackendError, Vec<Job>)> {
    let (r, mut w) = stream.into_split();
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
    let mut jobs: Vec<Job> = Vec::with_capacity(64);
    if !again.is_empty() {
        let mut again = again;
        let n: u64 = again.iter().map(|j| j.count as u64).sum();
        open.add(n as i64);
        if let Err((e, unsent)) = write_jobs(&mut w, &mut again, &inflight_tx, &hs.addr).await {
            let mut left = reader_leftovers(&mut reader).await;
            left.extend(unsent);
            open.take(i64::MAX);
            return Some((e, left));
        }
    }
    let (reason, unanswered) = loop {
        tokio::select! {
            res = &mut reader => {
                break match res {
                    Ok(r) => r,
                    Err(_) => (BackendError::io(&hs.addr, "reader task failed"), Vec::new()),
                };
            }
            n = rx.recv_many(&mut jobs, 256) => {
                if n == 0 {
                    // Every handle dropped (shutdown, or a tracked connection replaced for
                    // a new tracker): the commands already written get their replies
                    // first, for a few seconds at most.
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
                    open.take(i64::MAX);
                    return None;
                }
                let mut cmds = 0u64;
                for job in jobs.iter() {
                    cmds += job.count as u64;
                }
                m.requests.inc_by(cmds);
                open.add(cmds as i64);
                if let Err((e, unsent)) = write_jobs(&mut w, &mut jobs, &inflight_tx, &hs.addr).await {
                    // What the reader holds unanswered, then what never left, in order:
                    // reads among them go on the next connection, anything else fails.
                    let mut left = reader_leftovers(&mut reader).await;
                    for job in unsent {
                        // Never written: it may go again even if it writes, once.
                        if job.retry_safe() || job.again {
                            left.push(job);
                        } else {
                            job.fail(BackendError::Down {
                                node: hs.addr.clone(),
                                reason: "connection lost before the command was sent; it did not run".into(),
                            });
                        }
                    }
                    break (e, left);
                }
            }
        }
    };
    open.take(i64::MAX);
    Some((reason, unanswered))
}

/// How long a connection whose handles are all gone keeps reading the replies of the
/// commands it already wrote.
const DRAIN_ON_DROP: Duration = Duration::from_secs(5);

/// Commands in flight on one connection, mirrored in the node's gauge.
#[derive(Clone)]
struct Pending {
    n: Arc<AtomicI64>,
    gauge: prometheus_client::metrics::gauge::Gauge,
    /// Told when no command is left in flight (a connection draining before it closes).
    none: Arc<tokio::sync::Notify>,
}

impl Pending {
    fn add(&self, k: i64) {
        self.n.fetch_add(k, Ordering::Relaxed);
        self.gauge.inc_by(k);
    }

    /// Takes up to `k` off (never below zero, so a reader finishing while the connection
    /// is torn down cannot take the gauge negative).
    fn take(&self, k: i64) {
        if let Ok(was) = self
            .n
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v - v.min(k)))
        {
            self.gauge.dec_by(was.min(k));
            if was <= k {
                self.none.notify_one();
            }
        }
    }
}

/// Registers each job as in flight (before its bytes leave, so the reader always finds
/// it) and writes all of them with as few syscalls as the kernel allows.
/// On failure, the jobs not registered (the reader had stopped: the connection broke) come
/// back with the error: none of their bytes left, so any of them may go on the next one.
async fn write_jobs(
    w: &mut WriteHalf,
    jobs: &mut Vec<Job>,
    inflight: &mpsc::UnboundedSender<Job>,
    node: &str,
) -> Result<(), (BackendError, Vec<Job>)> {
    let mut bufs: Vec<Bytes> = Vec::with_capacity(jobs.len() * 2);
    let mut queue = jobs.drain(..);
    while let Some(job) = queue.next() {
        if job.count == 0 {
            bufs.extend(job.data);
            continue;
        }
        // The job keeps its bytes until answered, to be sent again if the connection
        // breaks first (a reference count each, no copy).
        bufs.extend(job.data.iter().cloned());
        if let Err(mpsc::error::SendError(job)) = inflight.send(job) {
            let mut unsent = vec![job];
            unsent.extend(queue);
            let e = BackendError::io(node, "connection reader stopped");
            return Err((e, unsent));
        }
    }
    drop(queue);
    write_all_vectored(w, &mut bufs)
        .await
        .map_err(|e| (BackendError::io(node, e), Vec::new()))
}

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

async fn write_all_vectored(w: &mut WriteHalf, bufs: &mut [Bytes]) -> std::io::Result<()> {
    let mut first = 0;
    while first < bufs.len() {
        let mut n = {
            let slices: SmallVec<[IoSlice<'_>; 64]> = bufs[first..]
                .iter()
                .take(64)
                .map(|b| IoSlice::new(b))
                .collect();
            w.write_vectored(&slices).await?
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while first < bufs.len() && n >= bufs[first].len() {
            n -= bufs[first].len();
            first += 1;
        }
        if n > 0 {
            let rest = bufs[first].slice(n..);
            bufs[first] = rest;
        }
    }
    // TLS holds records until flushed; for TCP this does nothing.
    w.flush().await
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

#[cfg(test)]
mod tests {
    use super::*;

    fn job(cmds: &[&[&str]], count: u32) -> Job {
        let data = cmds.iter().map(|c| crate::backend::wire(c)).collect();
        Job::new(data, count, oneshot::channel().0)
    }

    #[test]
    fn only_jobs_of_plain_reads_are_sent_again() {
        assert_eq!(
            command_name(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"),
            Some(&b"GET"[..])
        );
        assert_eq!(command_name(b"*1\r\n$4\r\nPI"), None);
        assert!(job(&[&["GET", "k"]], 1).retry_safe());
        assert!(job(&[&["GET", "k"], &["hgetall", "h"]], 2).retry_safe());
        assert!(!job(&[&["GET", "k"], &["INCR", "n"]], 2).retry_safe());
        assert!(!job(&[&["BLPOP", "q", "0"]], 1).retry_safe());
        assert!(!job(&[&["CLIENT", "LIST"]], 1).retry_safe());
        // A MULTI sent as one buffer: its commands are not looked into.
        assert!(!job(&[&["GET", "k"]], 3).retry_safe());
        assert!(!job(&[], 0).retry_safe());
    }
}
