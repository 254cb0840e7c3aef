//! The write side of one shared connection to a node, shared by every worker thread.
//!
//! Each worker has a *relay* per connection: a task on the worker's own runtime that takes
//! the jobs its sessions queued in one tick. Relays *gather* their jobs for one writer: the
//! first relay to find no writer becomes it, and while the node still has commands of this
//! connection in hand (not yet answered), it holds what is gathered until they are
//! answered, then writes every worker's jobs in one vectored write, under the lock that
//! also registers their reply slots with the connection's reader (so replies are matched
//! in the order the bytes went out). The node so reads what every worker sent in one pass
//! per round trip, as it would from one worker: with a connection per worker it read once
//! per worker and per tick, and spent 1.1-1.3x its CPU per operation at two threads against
//! one (bench/README.md, "Workers that batch together"). No request wakes another thread on
//! its way to the node; the reply does, when its session lives on another worker than the
//! connection's reader, and so does the end of a hold.
//!
//! The supervisor (`link`) owns the connection's life: it publishes a writer when a
//! connection is up, takes it back when it breaks, and says when the node is down so
//! relays answer at once instead of waiting.

use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use smallvec::SmallVec;
use tokio::io::AsyncWriteExt;
use tokio::sync::{mpsc, Mutex, Notify};

use super::job::Job;
use super::{BackendError, NodeMetrics};
use crate::net::WriteHalf;

/// Where a connection stands, as the relays see it.
pub(super) enum State {
    /// Not connected yet, or reconnecting: jobs wait (their callers' deadlines run).
    Connecting,
    /// Connected: jobs are written.
    Up(Writer),
    /// A write failed; the supervisor has not taken the connection down yet.
    Broken(BackendError),
    /// The node is down: jobs fail at once with this reason, until the next connect.
    Down(String),
}

/// A connection's write half, with the queue of what its reader must answer.
pub(super) struct Writer {
    pub w: WriteHalf,
    pub inflight: mpsc::UnboundedSender<Job>,
    pub open: Pending,
}

/// The shared write side of one connection (see the module comment).
pub(super) struct Wire {
    pub state: Mutex<State>,
    gather: std::sync::Mutex<Gather>,
    /// Told when the writer took gathered jobs and a relay waits for room.
    taken: Notify,
    /// Told when `state` leaves `Connecting` (relays waiting on it look again).
    pub changed: Notify,
    /// Told when a relay's write failed (`State::Broken`).
    pub broken: Notify,
    /// Set when every handle to the connection is gone (shut down).
    closed: AtomicBool,
    pub closing: Notify,
    pub addr: String,
    m: NodeMetrics,
    /// Whether writers hold for the node's answers (`send`): only with several workers.
    /// One worker's tick already gathers all its sessions' jobs, and the node that has
    /// answered them reads the next tick's at once, as behind twemproxy.
    hold: bool,
}

impl Wire {
    pub fn new(addr: String, m: NodeMetrics) -> Wire {
        Wire {
            state: Mutex::new(State::Connecting),
            gather: Default::default(),
            taken: Notify::new(),
            changed: Notify::new(),
            broken: Notify::new(),
            closed: AtomicBool::new(false),
            closing: Notify::new(),
            addr,
            m,
            hold: super::workers() > 1,
        }
    }

    /// Every handle is gone: the supervisor drains what was written and ends.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.closing.notify_one();
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Sets the state and wakes the relays waiting for it to change.
    pub async fn set(&self, s: State) -> State {
        let old = std::mem::replace(&mut *self.state.lock().await, s);
        self.changed.notify_waiters();
        old
    }

    /// Writes `batch` on the connection, with every other worker's jobs queued meanwhile
    /// (see `Gather`), waits for a connection while connecting, or fails the jobs at once
    /// while the node is down. A write that fails marks the connection broken for the
    /// supervisor; the jobs of it that never left wait for the next connection if they only
    /// read, and fail otherwise (they did not run).
    pub async fn send(&self, batch: &mut Vec<Job>, rx: &mut mpsc::Receiver<Job>) {
        let mut open_rx = true;
        loop {
            match self.join(batch) {
                Joined::Flush => break,
                // Another worker is writing: these go in its next write.
                Joined::Left => return,
                Joined::Wait(taken) => taken.await,
            }
        }
        let mut jobs = Vec::new();
        loop {
            let mut st = self.state.lock().await;
            {
                // Taken under the state lock: the order jobs are taken in is the order
                // they are written and answered in.
                let mut g = self.gather.lock().unwrap_or_else(|p| p.into_inner());
                jobs.append(&mut g.jobs);
                if std::mem::take(&mut g.full) {
                    self.taken.notify_waiters();
                }
                if jobs.is_empty() {
                    g.flushing = false;
                    return;
                }
            }
            match &mut *st {
                State::Up(wr) => {
                    if self.hold && wr.open.n.load(Ordering::Relaxed) > 0 && jobs.len() < HOLD_UNDER
                    {
                        // The node has commands of this connection in hand: hold these
                        // until it answered them, gathering every worker's meanwhile, so
                        // it reads them in one pass rather than one per worker.
                        let none = wr.open.none.clone();
                        let answered = none.notified();
                        tokio::pin!(answered);
                        answered.as_mut().enable();
                        if wr.open.n.load(Ordering::Relaxed) > 0 {
                            drop(st);
                            // This worker's own queue keeps gathering meanwhile.
                            tokio::select! {
                                _ = answered => {}
                                n = rx.recv_many(&mut jobs, 256), if open_rx => open_rx = n > 0,
                            }
                            continue;
                        }
                    }
                    let cmds: u64 = jobs.iter().map(|j| j.count as u64).sum();
                    self.m.requests.inc_by(cmds);
                    self.m.writes.inc();
                    wr.open.add(cmds as i64);
                    let Err((e, unsent)) = write_jobs(wr, &mut jobs, &self.addr).await else {
                        continue;
                    };
                    wr.open.take(unsent.iter().map(|j| j.count as i64).sum());
                    *st = State::Broken(e);
                    drop(st);
                    self.broken.notify_one();
                    for job in unsent {
                        match job.retry_safe() {
                            true => jobs.push(job),
                            false => job.fail(BackendError::Down {
                                node: self.addr.clone(),
                                reason:
                                    "connection lost before the command was sent; it did not run"
                                        .into(),
                            }),
                        }
                    }
                }
                State::Down(reason) => {
                    for job in jobs.drain(..) {
                        self.m.errors("down").inc();
                        job.fail(BackendError::Down {
                            node: self.addr.clone(),
                            reason: reason.clone(),
                        });
                    }
                }
                State::Connecting | State::Broken(_) => {
                    if self.is_closed() {
                        for job in jobs.drain(..) {
                            job.fail(BackendError::Closed(self.addr.clone()));
                        }
                        continue;
                    }
                    // Registered before the lock is let go, so a change made right after
                    // is not missed.
                    let changed = self.changed.notified();
                    tokio::pin!(changed);
                    changed.as_mut().enable();
                    drop(st);
                    changed.await;
                }
            }
        }
    }
}

/// A flusher holds its jobs while the connection has commands in flight, unless it has
/// gathered this many.
const HOLD_UNDER: usize = 128;

/// Jobs from every worker waiting for one write. The first relay to add to an empty
/// gathering writes it (holding first while the node has commands in hand, with several
/// workers); relays that add while it is `flushing` leave theirs to it. So the workers'
/// commands for a node that arrive within one round trip go in one write, and the node
/// reads them in one pass.
#[derive(Default)]
pub(super) struct Gather {
    jobs: Vec<Job>,
    flushing: bool,
    /// A relay waits for room (`Wire::taken`).
    full: bool,
}

/// Most jobs gathered for a writer that has not taken them yet.
const GATHER_MAX: usize = 4096;

/// What a relay's batch became when it joined the gathering.
enum Joined<'a> {
    /// This relay writes (it found no writer).
    Flush,
    /// Left to the worker writing.
    Left,
    /// The gathering is full: wait for the writer to take it, then join again.
    Wait(std::pin::Pin<Box<tokio::sync::futures::Notified<'a>>>),
}

impl Wire {
    fn join(&self, batch: &mut Vec<Job>) -> Joined<'_> {
        let mut g = self.gather.lock().unwrap_or_else(|p| p.into_inner());
        if g.flushing && g.jobs.len() >= GATHER_MAX {
            // The writer is stuck (a node that stopped reading): wait for it to take what
            // is gathered rather than pile more up; this worker's queue fills, and its
            // callers wait within their deadlines.
            g.full = true;
            let mut taken = Box::pin(self.taken.notified());
            taken.as_mut().enable();
            return Joined::Wait(taken);
        }
        g.jobs.append(batch);
        match std::mem::replace(&mut g.flushing, true) {
            true => Joined::Left,
            false => Joined::Flush,
        }
    }
}

/// One worker's relay for one connection: writes what the worker's sessions queued, a
/// tick's worth at a time. Ends when every handle to the connection is gone.
pub(super) async fn relay(mut rx: mpsc::Receiver<Job>, wire: Arc<Wire>) {
    let mut jobs: Vec<Job> = Vec::with_capacity(64);
    while rx.recv_many(&mut jobs, 256).await > 0 {
        wire.send(&mut jobs, &mut rx).await;
    }
}

/// Commands in flight on one connection, mirrored in the node's gauge.
#[derive(Clone)]
pub(super) struct Pending {
    pub n: Arc<AtomicI64>,
    pub gauge: prometheus_client::metrics::gauge::Gauge,
    /// Told when no command is left in flight (a connection draining before it closes).
    pub none: Arc<Notify>,
}

impl Pending {
    pub fn add(&self, k: i64) {
        self.n.fetch_add(k, Ordering::Relaxed);
        self.gauge.inc_by(k);
    }

    /// Takes up to `k` off (never below zero, so a reader finishing while the connection
    /// is torn down cannot take the gauge negative).
    pub fn take(&self, k: i64) {
        if let Ok(was) = self
            .n
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| Some(v - v.min(k)))
        {
            self.gauge.dec_by(was.min(k));
            if was <= k {
                // Both: a writer holding made its `Notified` before it looked at the count,
                // and `notify_waiters` reaches it; the drain on close makes a new one per
                // turn of its loop, and the permit `notify_one` leaves reaches it even
                // between two turns.
                self.none.notify_waiters();
                self.none.notify_one();
            }
        }
    }
}

/// Registers each job as in flight (before its bytes leave, so the reader always finds
/// it) and writes all of them with as few syscalls as the kernel allows.
/// On failure, the jobs not registered (the reader had stopped: the connection broke) come
/// back with the error: none of their bytes left, so any of them may go on the next one.
pub(super) async fn write_jobs(
    wr: &mut Writer,
    jobs: &mut Vec<Job>,
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
        if let Err(mpsc::error::SendError(job)) = wr.inflight.send(job) {
            let mut unsent = vec![job];
            unsent.extend(queue);
            let e = BackendError::io(node, "connection reader stopped");
            return Err((e, unsent));
        }
    }
    drop(queue);
    write_all_vectored(&mut wr.w, &mut bufs)
        .await
        .map_err(|e| (BackendError::io(node, e), Vec::new()))
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
