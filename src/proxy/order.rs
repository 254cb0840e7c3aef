//! A session's ordering rules, in one type: what must have reached a node, or have been
//! answered, before the session's next command may leave.
//!
//! A pipeline is answered in order because its jobs are queued in order on one connection
//! per node. Four things leave on other paths, and each leaves a receiver here that fires
//! when it is done:
//!
//! - a combined write (it leaves with its key's batch): the session's next jobs wait for
//!   it (`barrier`), so a read after a combined INCR sees it;
//! - a salted-key task (it runs on its own): later jobs and tasks wait for it too, and a
//!   combined write after it (`last_ack`);
//! - a cache fill (it reads on the node's fill connection): a later write of the same key
//!   waits for it (`fills`), so a read before a write never sees the write;
//! - a round that wrote keys: until its replies are in, those keys are not served from the
//!   cache (`unacked`), so a read after a write sees the write.
//!
//! The rules were found one by one by tests/differential.rs, which compares a pipeline
//! through the proxy with the same pipeline straight at Redis.

use bytes::Bytes;
use tokio::sync::oneshot::{self, error::TryRecvError};

use super::round::Round;

type Done = oneshot::Receiver<()>;

/// Most combined writes kept before the landed ones are forgotten.
const BARRIER_COMPACT: usize = 64;

#[derive(Default)]
pub struct Order {
    /// Combined writes and tasks not yet done: the next jobs wait for them.
    barrier: Vec<Done>,
    /// Fires when the last round with jobs is answered, or the last task is done: a
    /// salted task or a combined write must not overtake them.
    last_ack: Option<Done>,
    /// Cache fills this session started, by key.
    fills: Vec<(Bytes, Done)>,
    /// Keys written by rounds whose replies are not all in.
    unacked: Vec<(Vec<Bytes>, Done)>,
}

fn pending(d: &mut Done) -> bool {
    matches!(d.try_recv(), Err(TryRecvError::Empty))
}

/// A receiver for `round`'s last reply.
fn on_acked(round: &mut Round) -> Done {
    let (tx, rx) = oneshot::channel();
    round.acked.push(tx);
    rx
}

impl Order {
    /// The session's next jobs wait until this combined write has reached its node.
    pub fn combined(&mut self, done: Done) {
        if self.barrier.len() >= BARRIER_COMPACT {
            // A client that only ever increments hot keys never sends a job: forget the
            // writes that have landed so the barrier stays small.
            self.barrier.retain_mut(pending);
        }
        self.barrier.push(done);
    }

    /// Whether nothing of the session is still on its way: the last round with jobs is
    /// answered and no task is pending. A combine batch leaves on its own schedule, so an
    /// increment may join one only then (and only if its own round has no jobs yet).
    pub fn settled(&mut self) -> bool {
        match self.last_ack.as_mut().map(|a| a.try_recv()) {
            Some(Err(TryRecvError::Empty)) => false,
            Some(_) => {
                self.last_ack = None;
                true
            }
            None => true,
        }
    }

    /// No combined write or task is pending.
    pub fn no_barrier(&self) -> bool {
        self.barrier.is_empty()
    }

    /// Waits for the combined writes and tasks before jobs leave.
    pub async fn wait_barrier(&mut self) {
        for done in self.barrier.drain(..) {
            let _ = done.await;
        }
    }

    /// Waits for everything the session sent before: combined writes, tasks, the last
    /// round's replies (before a fold runs on its own).
    pub async fn wait_all(&mut self) {
        self.wait_barrier().await;
        if let Some(a) = self.last_ack.take() {
            let _ = a.await;
        }
    }

    /// A task that starts once everything before it is done: returns what it must wait
    /// for, and the two senders it fires when done (the later jobs' barrier, and the
    /// `last_ack` a later task or combined write waits for).
    pub fn task(&mut self) -> (Vec<Done>, oneshot::Sender<()>, oneshot::Sender<()>) {
        let mut prior: Vec<Done> = self.barrier.drain(..).collect();
        prior.extend(self.last_ack.take());
        let (done_tx, done_rx) = oneshot::channel();
        self.barrier.push(done_rx);
        let (then_tx, then_rx) = oneshot::channel();
        self.last_ack = Some(then_rx);
        (prior, done_tx, then_tx)
    }

    /// A round sent ahead of a salted command (`Flow::Flush`): what comes next waits for
    /// its replies.
    pub fn flushed(&mut self, round: &mut Round) {
        self.last_ack = Some(on_acked(round));
    }

    /// A round about to be sent. `wrote_cached`: it writes a read-hot key, so the next
    /// jobs wait for its replies (and the cache entries it dropped). `track`: keys may be
    /// salted or combined, so a later task or combined write waits for a round with jobs.
    /// `written`: the keys it writes, not served from the cache until it is answered.
    pub fn sent(
        &mut self,
        round: &mut Round,
        had_jobs: bool,
        wrote_cached: bool,
        track: impl FnOnce() -> bool,
        written: Vec<Bytes>,
    ) {
        if wrote_cached {
            self.barrier.push(on_acked(round));
        } else if had_jobs && track() {
            self.last_ack = Some(on_acked(round));
        }
        if !written.is_empty() {
            self.unacked.retain_mut(|(_, a)| pending(a));
            self.unacked.push((written, on_acked(round)));
        }
    }

    /// Whether this session wrote `key` in a round whose replies are not all in.
    pub fn unacked_write(&mut self, key: &[u8]) -> bool {
        self.unacked.retain_mut(|(_, a)| pending(a));
        self.unacked
            .iter()
            .any(|(keys, _)| keys.iter().any(|k| &k[..] == key))
    }

    /// A cache fill of `key` started by this session; `done` fires once it has read.
    pub fn fill(&mut self, key: Bytes, done: Done) {
        // Forget the fills that are done, so a session that only reads keeps few.
        self.fills.retain_mut(|(_, d)| pending(d));
        self.fills.push((key, done));
    }

    /// Before a write of `keys` leaves, this session's fills of those keys must have read
    /// the node.
    pub async fn wait_fills(&mut self, mut writes: impl FnMut(&[u8]) -> bool) {
        let mut i = 0;
        while i < self.fills.len() {
            if writes(&self.fills[i].0) {
                let (_, done) = self.fills.swap_remove(i);
                let _ = done.await;
            } else {
                i += 1;
            }
        }
    }

    /// No fill is pending (the common case: skip looking at the command's keys).
    pub fn no_fills(&self) -> bool {
        self.fills.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_waits_for_what_came_before_and_what_comes_after_waits_for_it() {
        let mut o = Order::default();
        let (c_tx, c_rx) = oneshot::channel();
        o.combined(c_rx);
        assert!(!o.no_barrier());
        let (prior, done, then) = o.task();
        assert_eq!(prior.len(), 1, "the combined write before the task");
        assert!(!o.settled(), "the task is pending");
        c_tx.send(()).unwrap();
        done.send(()).unwrap();
        then.send(()).unwrap();
        assert!(o.settled());
        o.wait_barrier().await;
        assert!(o.no_barrier());
    }

    #[test]
    fn the_barrier_forgets_landed_writes_past_its_bound() {
        let mut o = Order::default();
        let mut keep = Vec::new();
        for i in 0..200 {
            let (tx, rx) = oneshot::channel::<()>();
            o.combined(rx);
            if i % 2 == 0 {
                let _ = tx.send(());
            } else {
                keep.push(tx);
            }
        }
        assert!(o.barrier.len() <= BARRIER_COMPACT + 100);
    }
}
