//! One shared, pipelined connection to a backend node, and its supervisor.
//!
//! Sessions hand the connection *jobs*: the wire bytes of one or more commands and a
//! oneshot for their replies. A writer drains every queued job into one vectored write
//! (many client commands in one syscall); a reader frames replies with `resp::ReplyFramer`
//! and completes jobs strictly in order. When the connection breaks, every job in flight
//! fails (its oneshot is dropped), and while the node is down the supervisor answers new
//! jobs at once with an error instead of letting clients wait: the other nodes keep serving.
//! A connection that breaks after it was up a while is reopened at once, and the jobs
//! queued meanwhile go on the new one; failed connects back off exponentially between
//! `reconnect_min_ms` and `reconnect_max_ms`.

use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::net::{ReadHalf, Stream, WriteHalf};
use bytes::{Bytes, BytesMut};
use smallvec::SmallVec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::cluster::Cluster;
use super::{BackendError, Handshake, NodeMetrics};
use crate::resp::{Proto, ReplyFramer};

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
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.buf.slice(start..self.ends[i] as usize)
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
}

impl Job {
    pub fn fail(self, e: BackendError) {
        let _ = self.tx.send(Err(e));
    }
}

/// Handle to a shared connection; cheap to clone.
#[derive(Clone)]
pub struct ConnHandle {
    tx: mpsc::Sender<Job>,
    up: Arc<AtomicBool>,
    who: Arc<Who>,
}

/// The node a call goes to and its timeout counter: one `Arc` clone per call.
struct Who {
    node: String,
    timeouts: prometheus_client::metrics::counter::Counter,
    /// The cluster of a cluster node: its calls follow MOVED and ASK (`Cluster::follow`).
    cluster: Option<Weak<Cluster>>,
    proto: Proto,
}

/// What a call to a cluster node needs to follow redirections: the commands again (the
/// cluster itself is reached through `Who`, only when a reply is an error).
type Redo = SmallVec<[Bytes; 4]>;

/// A job in flight: its replies, due by a deadline. The one way the proxy waits on a node,
/// so every wait has the same timeout, the same errors and the same metrics.
pub struct Call {
    rx: Option<ReplyRx>,
    /// Set when the job failed before it was queued (its queue was full past the deadline).
    failed: Option<BackendError>,
    who: Arc<Who>,
    redo: Option<Box<Redo>>,
}

impl ConnHandle {
    /// Starts the supervisor task for one shared connection.
    pub fn spawn(
        hs: Arc<Handshake>,
        metrics: NodeMetrics,
        cluster: Option<Weak<Cluster>>,
    ) -> ConnHandle {
        let (tx, rx) = mpsc::channel(4096);
        let up = Arc::new(AtomicBool::new(false));
        let who = Arc::new(Who {
            node: hs.addr.clone(),
            timeouts: metrics.errors("timeout"),
            cluster,
            proto: hs.proto,
        });
        tokio::spawn(supervise(hs, rx, up.clone(), metrics));
        ConnHandle { tx, up, who }
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Queues `count` commands (their wire bytes in `data`, written contiguously) and
    /// returns the call to wait on. Waits for room in the connection's queue until
    /// `deadline` at most: a node that stopped reading fills the queue, and its callers
    /// then get a timeout instead of holding their session forever.
    ///
    /// On a cluster node, a reply that redirects (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) is
    /// followed before `Call::wait` returns, for jobs of one command per buffer (a
    /// transaction sent as one buffer gets the node's reply as it is).
    pub async fn start(
        &self,
        data: SmallVec<[Bytes; 4]>,
        count: u32,
        deadline: Option<Instant>,
    ) -> Call {
        let redo = match &self.who.cluster {
            Some(_) if data.len() == count as usize => Some(Box::new(data.clone())),
            _ => None,
        };
        let mut call = self.start_direct(data, count, deadline).await;
        call.redo = redo;
        call
    }

    /// `start`, with replies given as the node sent them (no redirection followed).
    pub async fn start_direct(
        &self,
        data: SmallVec<[Bytes; 4]>,
        count: u32,
        deadline: Option<Instant>,
    ) -> Call {
        let (tx, rx) = oneshot::channel();
        let job = Job { data, count, tx };
        // The queue has room almost always: no timer unless it is full.
        let sent = match self.tx.try_send(job) {
            Ok(()) => Ok(Ok(())),
            Err(mpsc::error::TrySendError::Closed(_)) => Ok(Err(())),
            // Boxed: the timer and the queue's wait are large, and every session's future
            // would hold them beside its own.
            Err(mpsc::error::TrySendError::Full(job)) => {
                Box::pin(async {
                    let send = async { self.tx.send(job).await.map_err(|_| ()) };
                    match deadline {
                        Some(d) => tokio::time::timeout_at(d, send).await,
                        None => Ok(send.await),
                    }
                })
                .await
            }
        };
        let failed = match sent {
            Ok(Ok(())) => None,
            Ok(Err(_)) => Some(BackendError::Closed),
            Err(_) => {
                self.who.timeouts.inc();
                Some(BackendError::Timeout(self.who.node.clone()))
            }
        };
        Call {
            rx: failed.is_none().then_some(rx),
            failed,
            who: self.who.clone(),
            redo: None,
        }
    }

    /// `call` without following redirections (the cluster's own questions and hops).
    pub async fn call_direct(
        &self,
        data: SmallVec<[Bytes; 4]>,
        count: u32,
        deadline: Option<Instant>,
    ) -> Result<Replies, BackendError> {
        let mut call = self.start_direct(data, count, deadline).await;
        call.wait_direct(deadline).await
    }

    /// Sends `count` commands and waits for their replies until `deadline`.
    pub async fn call(
        &self,
        data: SmallVec<[Bytes; 4]>,
        count: u32,
        deadline: Option<Instant>,
    ) -> Result<Replies, BackendError> {
        self.start(data, count, deadline).await.wait(deadline).await
    }
}

impl Call {
    /// The replies, or why there are none: the node did not answer by `deadline` (counted
    /// as a `timeout` error of the node), or its connection broke with the job in flight.
    pub async fn wait(mut self, deadline: Option<Instant>) -> Result<Replies, BackendError> {
        let redo = self.redo.take();
        let r = self.wait_direct(deadline).await;
        let Some(data) = redo else {
            return r;
        };
        let cluster = || self.who.cluster.as_ref().and_then(Weak::upgrade);
        match r {
            // Only an error reply can be a redirection: most calls stop at this scan.
            Ok(replies) if !replies.has_error() => Ok(replies),
            Ok(replies) => match cluster() {
                Some(c) => Ok(c
                    .follow(replies, &data, self.who.proto, &self.who.node, deadline)
                    .await),
                None => Ok(replies),
            },
            Err(e) => {
                // The node may have failed over: read the map again soon.
                if let Some(c) = cluster() {
                    c.stale();
                }
                Err(e)
            }
        }
    }

    async fn wait_direct(&mut self, deadline: Option<Instant>) -> Result<Replies, BackendError> {
        let Some(rx) = self.rx.take() else {
            return Err(self.failed.take().unwrap_or(BackendError::Closed));
        };
        let r = match deadline {
            Some(d) => match tokio::time::timeout_at(d, rx).await {
                Ok(r) => r,
                Err(_) => {
                    self.who.timeouts.inc();
                    return Err(BackendError::Timeout(self.who.node.clone()));
                }
            },
            None => rx.await,
        };
        match r {
            Ok(r) => r,
            // The connection broke with this job in flight: from the caller's side the node
            // is down (the supervisor now fails new jobs at once until it reconnects).
            Err(_) => Err(BackendError::Down {
                node: self.who.node.clone(),
                reason: "connection lost before the reply; the command may or may not have run"
                    .into(),
            }),
        }
    }
}

/// Which of a node's shared connections carries a job: `spread` is the session's rotation
/// (route), a key's hash (combine batches: one connection per key keeps their order), or
/// the first command's index (salting's calls). The one place a connection is chosen.
pub fn pick(conns: &[ConnHandle], spread: usize) -> ConnHandle {
    conns[spread % conns.len()].clone()
}

/// The deadline of a request started now, under `timeout` (None: wait forever).
pub fn deadline(timeout: Option<Duration>) -> Option<Instant> {
    timeout.map(|t| Instant::now() + t)
}

/// A connection that lived at least this long before it broke is reopened at once; one
/// that broke sooner is treated like a failed connect (backoff), so a node that accepts
/// and then drops every connection is not hammered.
const RECONNECT_AT_ONCE_AFTER: Duration = Duration::from_secs(1);

async fn supervise(
    hs: Arc<Handshake>,
    mut rx: mpsc::Receiver<Job>,
    up: Arc<AtomicBool>,
    m: NodeMetrics,
) {
    let min = Duration::from_millis(hs.reconnect_min_ms);
    let max = Duration::from_millis(hs.reconnect_max_ms);
    let mut backoff = min;
    let mut was_down_logged = false;
    loop {
        let up_since = Instant::now();
        let reason = match hs.connect().await {
            Ok(stream) => {
                backoff = min;
                up.store(true, Ordering::Relaxed);
                m.up.set(1);
                m.connections.inc();
                if was_down_logged {
                    tracing::info!(node = %hs.addr, "backend node is back");
                    was_down_logged = false;
                }
                let reason = serve(stream, &mut rx, &hs, &m).await;
                up.store(false, Ordering::Relaxed);
                m.up.set(0);
                m.connections.dec();
                match reason {
                    None => return, // every handle dropped: shutting down
                    Some(r) => {
                        let kind = match r {
                            BackendError::Protocol(_) => "protocol",
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

/// Runs one established connection until it breaks (Some(reason)) or every handle is
/// dropped (None).
async fn serve(
    stream: Stream,
    rx: &mut mpsc::Receiver<Job>,
    hs: &Handshake,
    m: &NodeMetrics,
) -> Option<BackendError> {
    let (r, mut w) = stream.into_split();
    let (inflight_tx, inflight_rx) = mpsc::unbounded_channel::<(u32, ReplyTx)>();
    // Commands written and not answered on this connection (the node's pending gauge sums
    // them over its connections); what is left when the connection ends is taken off.
    let open = Pending {
        n: Arc::new(AtomicI64::new(0)),
        gauge: m.pending.clone(),
    };
    let mut reader = tokio::spawn(read_loop(r, inflight_rx, hs.max_reply_bulk, open.clone()));
    let mut jobs: Vec<Job> = Vec::with_capacity(64);
    let reason = loop {
        tokio::select! {
            res = &mut reader => {
                break match res {
                    Ok(e) => e,
                    Err(_) => BackendError::Io("reader task failed".into()),
                };
            }
            n = rx.recv_many(&mut jobs, 256) => {
                if n == 0 {
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
                if let Err(e) = write_jobs(&mut w, &mut jobs, &inflight_tx).await {
                    reader.abort();
                    break e;
                }
            }
        }
    };
    // Jobs still queued in `inflight` are dropped with the reader: their clients get an error.
    open.take(i64::MAX);
    Some(reason)
}

/// Commands in flight on one connection, mirrored in the node's gauge.
#[derive(Clone)]
struct Pending {
    n: Arc<AtomicI64>,
    gauge: prometheus_client::metrics::gauge::Gauge,
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
        }
    }
}

/// Registers each job as in flight (before its bytes leave, so the reader always finds
/// it) and writes all of them with as few syscalls as the kernel allows.
async fn write_jobs(
    w: &mut WriteHalf,
    jobs: &mut Vec<Job>,
    inflight: &mpsc::UnboundedSender<(u32, ReplyTx)>,
) -> Result<(), BackendError> {
    let mut bufs: Vec<Bytes> = Vec::with_capacity(jobs.len() * 2);
    for job in jobs.drain(..) {
        bufs.extend(job.data);
        if job.count > 0 && inflight.send((job.count, job.tx)).is_err() {
            return Err(BackendError::Io("connection reader stopped".into()));
        }
    }
    write_all_vectored(w, &mut bufs)
        .await
        .map_err(|e| BackendError::Io(e.to_string()))
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

/// Frames replies and completes jobs in order. Returns why it stopped.
async fn read_loop(
    mut r: ReadHalf,
    mut inflight: mpsc::UnboundedReceiver<(u32, ReplyTx)>,
    max_bulk: usize,
    open: Pending,
) -> BackendError {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut framer = ReplyFramer::new(max_bulk);
    let mut cur: Option<(u32, ReplyTx)> = None;
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
                Err(e) => return BackendError::Protocol(e.to_string()),
            };
            if buf[pos] == b'>' {
                // Shared connections never subscribe or track, so a push means the
                // stream is not what we think it is: reconnect rather than misattribute.
                return BackendError::Protocol(
                    "unexpected push message on a shared connection".into(),
                );
            }
            if cur.is_none() {
                match inflight.try_recv() {
                    Ok(p) => cur = Some(p),
                    Err(_) => return BackendError::Protocol("reply without a request".into()),
                }
            }
            pos += len;
            ends.push(pos as u32);
            let (count, _) = cur.as_ref().expect("set above");
            if ends.len() == *count as usize {
                let (count, tx) = cur.take().expect("set above");
                open.take(count as i64);
                let data = buf.split_to(pos).freeze();
                let _ = tx.send(Ok(Replies {
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
            Ok(0) => return BackendError::Io("connection closed by the node".into()),
            Ok(_) => {}
            Err(e) => return BackendError::Io(e.to_string()),
        }
    }
}
