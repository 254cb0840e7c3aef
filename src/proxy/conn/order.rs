//! A session's ordering rules, in one type: what must have reached a node, or have been
//! answered, before the session's next command may leave.
//!
//! A pipeline is answered in order because its jobs are queued in order on one connection
//! per node. Four things leave on other paths, and each leaves a receiver here that fires
//! when it is done:
//!
//! - a combined write (it leaves with its key's batch): the session's next jobs that hold
//!   its key wait for it (`barrier`), so a read after a combined INCR sees it; and it may
//!   join its batch only while no job of the session still on its way holds its key
//!   (`rounds`, `may_combine`), so it never overtakes an earlier command on that key;
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

use super::round::{Keys, Round};

type Done = oneshot::Receiver<()>;

/// Most combined writes kept before the landed ones are forgotten.
const BARRIER_COMPACT: usize = 64;

#[derive(Default)]
pub struct Order {
    /// Combined writes (with their key's hash) and tasks (`None`) not yet done: the next
    /// jobs wait for every task, and for the combined writes of keys they hold.
    barrier: Vec<(Option<u64>, Done)>,
    /// Fires when the last round with jobs is answered, or the last task is done: a
    /// salted task or a combined write must not overtake them.
    last_ack: Option<Done>,
    /// Cache fills this session started, by key.
    fills: Vec<(Bytes, Done)>,
    /// Keys written by rounds whose replies are not all in.
    unacked: Vec<(Vec<Bytes>, Done)>,
    /// Rounds with jobs whose replies are not all in, with the keys of their commands.
    rounds: Vec<(Keys, Done)>,
    /// The last round with jobs sent while no key could be combined or was salted (its
    /// keys were not kept): until it is answered, nothing is combined. Rounds are answered
    /// in order, so it stands for every such round before it.
    untracked: Option<Done>,
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
    /// Forgets the combined writes and tasks that are done.
    fn prune(&mut self) {
        self.barrier.retain_mut(|(_, d)| pending(d));
    }

    /// The session's next jobs that hold the key (`hash`, `Keys::hash`) wait until this
    /// combined write has reached its node.
    pub fn combined(&mut self, hash: u64, done: Done) {
        if self.barrier.len() >= BARRIER_COMPACT {
            // A client that only ever increments hot keys never sends a job: forget the
            // writes that have landed so the barrier stays small.
            self.prune();
        }
        self.barrier.push((Some(hash), done));
    }

    /// Whether an increment of the key `hash` may join its combine batch now, as far as
    /// the rounds already sent and the tasks go (the caller checks the round being built).
    /// A batch leaves on its own schedule, so it could overtake the session's earlier
    /// commands: no task may be pending (it may read or write any key), and no round
    /// still on its way may hold the key. Commands on other keys it may overtake, as
    /// commands on two masters of a Redis Cluster overtake each other.
    pub fn may_combine(&mut self, hash: u64) -> bool {
        if self.untracked.as_mut().is_some_and(pending) {
            return false;
        }
        self.untracked = None;
        self.prune();
        if self.barrier.iter().any(|(k, _)| k.is_none()) {
            return false;
        }
        self.rounds.retain_mut(|(_, d)| pending(d));
        !self.rounds.iter().any(|(keys, _)| keys.may_hold(hash))
    }

    /// No combined write or task is pending.
    #[cfg(test)]
    pub fn no_barrier(&mut self) -> bool {
        self.prune();
        self.barrier.is_empty()
    }

    /// Nothing every job waits for is pending: no task, no round that wrote a cached key.
    pub fn nothing_for_all(&mut self) -> bool {
        self.prune();
        self.barrier.iter().all(|(k, _)| k.is_some())
    }

    /// A combined write of the key `hash` is pending: a read of the key must not be served
    /// from the cache before it lands.
    pub fn combining(&mut self, hash: u64) -> bool {
        self.prune();
        self.barrier.iter().any(|(k, _)| *k == Some(hash))
    }

    /// Waits for every combined write and task.
    pub async fn wait_barrier(&mut self) {
        for (_, done) in self.barrier.drain(..) {
            let _ = done.await;
        }
    }

    /// Before jobs holding `keys` leave: waits for every task, and for the combined writes
    /// of those keys.
    pub async fn wait_for(&mut self, keys: &Keys) {
        let mut i = 0;
        while i < self.barrier.len() {
            if self.barrier[i].0.is_none_or(|h| keys.may_hold(h)) {
                let (_, done) = self.barrier.swap_remove(i);
                let _ = done.await;
            } else {
                i += 1;
            }
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
        let mut prior: Vec<Done> = self.barrier.drain(..).map(|(_, d)| d).collect();
        prior.extend(self.last_ack.take());
        let (done_tx, done_rx) = oneshot::channel();
        self.barrier.push((None, done_rx));
        let (then_tx, then_rx) = oneshot::channel();
        self.last_ack = Some(then_rx);
        (prior, done_tx, then_tx)
    }

    /// A round sent ahead of a command that must not join it (`Flow::Flush`, an admission
    /// delay), holding `keys` (kept if `track`): what comes next waits for its replies.
    pub fn flushed(&mut self, round: &mut Round, keys: Keys, track: bool) {
        self.last_ack = Some(on_acked(round));
        match track {
            true => self.rounds.push((keys, on_acked(round))),
            false => self.untracked = Some(on_acked(round)),
        }
    }

    /// A round about to be sent. `wrote_cached`: it writes a read-hot key, so the next
    /// jobs wait for its replies (and the cache entries it dropped). `track`: keys may be
    /// salted or combined, so a later task or combined write waits for a round with jobs.
    /// `written`: the keys it writes, not served from the cache until it is answered.
    /// `keys`: the keys of its commands, which a combined write may not overtake.
    pub fn sent(
        &mut self,
        round: &mut Round,
        had_jobs: bool,
        wrote_cached: bool,
        track: bool,
        written: Vec<Bytes>,
        keys: Keys,
    ) {
        if wrote_cached {
            self.barrier.push((None, on_acked(round)));
        }
        if had_jobs && track {
            self.last_ack = Some(on_acked(round));
            self.rounds.retain_mut(|(_, d)| pending(d));
            self.rounds.push((keys, on_acked(round)));
        } else if had_jobs {
            self.untracked = Some(on_acked(round));
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

    /// No combined write or task is pending (the common case: nothing to wait for).
    pub fn no_writes_pending(&self) -> bool {
        self.barrier.is_empty()
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
        o.combined(7, c_rx);
        assert!(!o.no_barrier());
        let (prior, done, then) = o.task();
        assert_eq!(prior.len(), 1, "the combined write before the task");
        assert!(!o.may_combine(7), "the task is pending");
        assert!(!o.may_combine(8), "a task may touch any key");
        c_tx.send(()).unwrap();
        done.send(()).unwrap();
        then.send(()).unwrap();
        assert!(o.may_combine(7));
        o.wait_barrier().await;
        assert!(o.no_barrier());
    }

    #[test]
    fn the_barrier_forgets_landed_writes_past_its_bound() {
        let mut o = Order::default();
        let mut keep = Vec::new();
        for i in 0..200 {
            let (tx, rx) = oneshot::channel::<()>();
            o.combined(i, rx);
            if i % 2 == 0 {
                let _ = tx.send(());
            } else {
                keep.push(tx);
            }
        }
        assert!(o.barrier.len() <= BARRIER_COMPACT + 100);
    }

    #[tokio::test]
    async fn a_combined_write_waits_only_for_rounds_and_jobs_that_hold_its_key() {
        let (hot, cold) = (Keys::hash(b"hot"), Keys::hash(b"cold"));
        let mut o = Order::default();
        let mut cold_round = Keys::default();
        cold_round.add(cold);
        let (ack_tx, ack_rx) = oneshot::channel();
        o.rounds.push((cold_round.clone(), ack_rx));
        assert!(o.may_combine(hot), "a round of other keys on its way");
        assert!(!o.may_combine(cold), "a round holding the key on its way");
        let _ = ack_tx.send(());
        assert!(o.may_combine(cold), "the round is answered");

        let (w_tx, w_rx) = oneshot::channel();
        o.combined(hot, w_rx);
        // Jobs of other keys leave at once; jobs of the key wait for the write.
        tokio::time::timeout(std::time::Duration::from_secs(1), o.wait_for(&cold_round))
            .await
            .expect("no wait for another key's combined write");
        let mut hot_round = Keys::default();
        hot_round.add(hot);
        {
            let wait = o.wait_for(&hot_round);
            tokio::pin!(wait);
            assert!(
                tokio::time::timeout(std::time::Duration::from_millis(50), &mut wait)
                    .await
                    .is_err(),
                "a job of the key waits for its combined write"
            );
            let _ = w_tx.send(());
            wait.await;
        }
        assert!(o.no_barrier());
    }

    #[test]
    fn a_round_of_unknown_keys_holds_every_key() {
        let mut k = Keys::default();
        assert!(!k.may_hold(Keys::hash(b"a")));
        k.add(Keys::hash(b"a"));
        assert!(k.may_hold(Keys::hash(b"a")));
        let misses = (0..1000)
            .filter(|i| k.may_hold(Keys::hash(format!("other{i}").as_bytes())))
            .count();
        assert!(misses < 5, "{misses} of 1000 other keys look held");
        k.add_all();
        assert!(k.may_hold(Keys::hash(b"anything")));
    }

    #[test]
    fn nothing_combines_until_a_round_sent_without_keys_is_answered() {
        let mut o = Order::default();
        let (tx, rx) = oneshot::channel();
        o.untracked = Some(rx);
        assert!(!o.may_combine(Keys::hash(b"k")));
        let _ = tx.send(());
        assert!(o.may_combine(Keys::hash(b"k")));
    }
}
