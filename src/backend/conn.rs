//! The handle to one shared, pipelined connection to a backend node, and the call that
//! waits on it: every wait on a node has a deadline, the same errors and the same metrics.
//! The task behind the handle (connect, write, read, reconnect) is `link`'s.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use bytes::Bytes;
use smallvec::SmallVec;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, Sleep};

use super::cluster::Cluster;
use super::job::{Job, Replies, ReplyRx, LOST};
use super::link::supervise;
use super::wire::{relay, Wire};
use super::{BackendError, Handshake, NodeMetrics};
use crate::resp::Proto;

/// Handle to a shared connection; cheap to clone.
#[derive(Clone)]
pub struct ConnHandle {
    inner: Arc<Inner>,
}

/// One connection's handles: every clone shares them, and the last one dropped closes the
/// connection (its supervisor drains and ends; the relays end with their queues).
struct Inner {
    /// Each worker thread's queue to its relay (`wire::relay`), started on first use.
    relays: Box<[OnceLock<mpsc::Sender<Job>>]>,
    wire: Arc<Wire>,
    up: Arc<AtomicBool>,
    who: Arc<Who>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.wire.close();
    }
}

/// How many jobs a worker's relay queues for one connection before its callers wait (a
/// node that stopped reading fills it, and they time out instead of queueing forever).
const QUEUE: usize = 4096;

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
        let up = Arc::new(AtomicBool::new(false));
        let who = Arc::new(Who {
            node: hs.addr.clone(),
            timeouts: metrics.errors("timeout"),
            cluster,
            proto: hs.proto,
        });
        let wire = Arc::new(Wire::new(hs.addr.clone(), metrics.clone()));
        tokio::spawn(supervise(hs, wire.clone(), up.clone(), metrics));
        let relays = (0..super::workers().max(1))
            .map(|_| OnceLock::new())
            .collect();
        ConnHandle {
            inner: Arc::new(Inner {
                relays,
                wire,
                up,
                who,
            }),
        }
    }

    pub fn is_up(&self) -> bool {
        self.inner.up.load(Ordering::Relaxed)
    }

    /// This worker thread's queue to the connection: its relay, on this thread's runtime,
    /// writes what it holds in one write per tick.
    fn queue(&self) -> &mpsc::Sender<Job> {
        let relays = &self.inner.relays;
        let i = super::worker().min(relays.len() - 1);
        relays[i].get_or_init(|| {
            let (tx, rx) = mpsc::channel(QUEUE);
            tokio::spawn(relay(rx, self.inner.wire.clone()));
            tx
        })
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
        match self.try_start(data, count) {
            Ok(call) => call,
            // The queue is full: wait for room until the deadline.
            Err(data) => {
                let redo = self.redo(&data, count);
                let mut call = self.start_direct(data, count, deadline).await;
                call.redo = redo;
                call
            }
        }
    }

    /// What a call needs to follow redirections: the commands, on a cluster node, for jobs
    /// of one command per buffer.
    fn redo(&self, data: &SmallVec<[Bytes; 4]>, count: u32) -> Option<Box<Redo>> {
        match &self.inner.who.cluster {
            Some(_) if data.len() == count as usize => Some(Box::new(data.clone())),
            _ => None,
        }
    }

    /// `start` without waiting: the commands come back when the queue is full. The
    /// request path's way in: a future of `start` inside every round's send made the
    /// session's future kilobytes larger, copied per read (bench/README.md, "One pass").
    pub fn try_start(
        &self,
        data: SmallVec<[Bytes; 4]>,
        count: u32,
    ) -> Result<Call, SmallVec<[Bytes; 4]>> {
        let redo = self.redo(&data, count);
        let (tx, rx) = oneshot::channel();
        let (rx, failed) = match self.queue().try_send(Job::new(data, count, tx)) {
            Ok(()) => (Some(rx), None),
            Err(mpsc::error::TrySendError::Closed(_)) => (
                None,
                Some(BackendError::Closed(self.inner.who.node.clone())),
            ),
            Err(mpsc::error::TrySendError::Full(job)) => return Err(job.data),
        };
        Ok(Call {
            rx,
            failed,
            who: self.inner.who.clone(),
            redo,
        })
    }

    /// `start`, with replies given as the node sent them (no redirection followed).
    pub async fn start_direct(
        &self,
        data: SmallVec<[Bytes; 4]>,
        count: u32,
        deadline: Option<Instant>,
    ) -> Call {
        let (tx, rx) = oneshot::channel();
        let job = Job::new(data, count, tx);
        // The queue has room almost always: no timer unless it is full.
        let sent = match self.queue().try_send(job) {
            Ok(()) => Ok(Ok(())),
            Err(mpsc::error::TrySendError::Closed(_)) => Ok(Err(())),
            // Boxed: the timer and the queue's wait are large, and every session's future
            // would hold them beside its own.
            Err(mpsc::error::TrySendError::Full(job)) => {
                Box::pin(async {
                    let send = async { self.queue().send(job).await.map_err(|_| ()) };
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
            Ok(Err(_)) => Some(BackendError::Closed(self.inner.who.node.clone())),
            Err(_) => {
                self.inner.who.timeouts.inc();
                Some(BackendError::Timeout(self.inner.who.node.clone()))
            }
        };
        Call {
            rx: failed.is_none().then_some(rx),
            failed,
            who: self.inner.who.clone(),
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
        call.wait_direct(deadline, None).await
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
    pub async fn wait(self, deadline: Option<Instant>) -> Result<Replies, BackendError> {
        self.wait_by(deadline, None).await
    }

    /// `wait`, with the deadline kept by `timer`, a timer the caller keeps from one call
    /// to the next, for calls whose deadlines do not go back in time (a session's rounds).
    ///
    /// A timer of its own per call costs every request an insertion into tokio's timer
    /// wheel and a removal; and when the new timer is the earliest the runtime knows of,
    /// its time driver wakes the runtime with an `eventfd` write. With two worker threads,
    /// `perf record -e syscalls:sys_enter_write --call-graph dwarf` put 97% of the proxy's
    /// `write` calls, 0.13-0.17 per request at pipeline 1, in that timer's first poll
    /// (bench/README.md, "The one-pass issue's goals: the closing run"). A kept timer is
    /// set once to the oldest call's deadline; when it fires before the call it is waiting
    /// for is due, it is set again to that call's deadline, so it fires at each call's
    /// deadline exactly, and is set about once per timeout, not once per request.
    pub async fn wait_by(
        mut self,
        deadline: Option<Instant>,
        timer: Option<Pin<&mut Sleep>>,
    ) -> Result<Replies, BackendError> {
        let redo = self.redo.take();
        let r = self.wait_direct(deadline, timer).await;
        let Some(data) = redo else {
            return r;
        };
        let cluster = || self.who.cluster.as_ref().and_then(Weak::upgrade);
        match r {
            // Only an error reply can be a redirection: most calls stop at this scan.
            Ok(replies) if !replies.has_error() => Ok(replies),
            Ok(replies) => match cluster() {
                // Boxed: following is rare, and its future is large; every wait on a
                // node would hold it.
                Some(c) => Ok(Box::pin(c.follow(
                    replies,
                    &data,
                    self.who.proto,
                    &self.who.node,
                    deadline,
                ))
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

    async fn wait_direct(
        &mut self,
        deadline: Option<Instant>,
        timer: Option<Pin<&mut Sleep>>,
    ) -> Result<Replies, BackendError> {
        let Some(mut rx) = self.rx.take() else {
            return Err(self
                .failed
                .take()
                .unwrap_or_else(|| BackendError::Closed(self.who.node.clone())));
        };
        let r = match (deadline, timer) {
            (Some(d), Some(mut t)) => {
                if t.deadline() > d {
                    t.as_mut().reset(d);
                }
                loop {
                    tokio::select! {
                        biased;
                        r = &mut rx => break r,
                        () = t.as_mut() => {
                            if Instant::now() >= d {
                                self.who.timeouts.inc();
                                return Err(BackendError::Timeout(self.who.node.clone()));
                            }
                            // Set for an earlier call, answered since: this one is due later.
                            t.as_mut().reset(d);
                        }
                    }
                }
            }
            (Some(d), None) => match tokio::time::timeout_at(d, rx).await {
                Ok(r) => r,
                Err(_) => {
                    self.who.timeouts.inc();
                    return Err(BackendError::Timeout(self.who.node.clone()));
                }
            },
            (None, _) => rx.await,
        };
        match r {
            Ok(r) => r,
            // The connection broke with this job in flight: from the caller's side the node
            // is down (the supervisor now fails new jobs at once until it reconnects).
            Err(_) => Err(BackendError::Down {
                node: self.who.node.clone(),
                reason: LOST.into(),
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
