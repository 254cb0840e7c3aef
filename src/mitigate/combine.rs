//! Combining: same-key increments go to the backend as one INCRBY (or HINCRBY) of their
//! sum, and every caller still gets its exact reply.
//!
//! A key's batches are *paced*: at most one command per window. An increment to a key with
//! nothing in flight and no batch in the last window leaves at once, in its session's own
//! tick (so it shares the node write of everything else queued in that tick); increments
//! that arrive meanwhile gather, and leave as one command when the one in flight has
//! answered and the window since it left has passed. A key written rarely waits for nothing,
//! and a key written fast still reaches its node about once per window. (A first version
//! held every batch's first increment for the window: on a production-shaped counter load
//! that doubled the p99 and saved the nodes no CPU; bench/README.md, "Paced combining".)
//! Salted writes (`Pace::Turn`) keep that hold: each window's writes join one shard's
//! batch, so one proxy sends one batch per window over all the shards.
//!
//! The batch for a key collects `(delta, caller)` in arrival order. One `INCRBY key total`
//! runs; if it returns `V`, caller `i` gets `V - (delta[i+1] + ... + delta[n-1])`, which is
//! exactly what it would have seen had the batch run one by one in arrival order (nothing
//! else can run between them on the node, because they ran as one command). A batch of one
//! sends the caller's own command. An error reply (WRONGTYPE, not an integer, overflow) or a
//! sum that overflows i64 falls back to sending the batch's own commands one by one in one
//! job, so each caller gets its own true answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use smallvec::{smallvec, SmallVec};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::backend::{deadline, wire, BackendError, Call, ConnHandle};
pub use crate::metrics::CombineMetrics;
use crate::resp::{encode_error, encode_int, parse_value, Value};

/// What identifies one batch: the node connection's database, the key and, for HINCRBY, the field.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct BatchKey {
    pub node: usize,
    pub db: u32,
    pub key: Bytes,
    pub field: Option<Bytes>,
}

/// When a key's batch leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// At once when the key has nothing in flight and sent nothing in the last window;
    /// otherwise when the window since its last batch has passed.
    Now(Duration),
    /// At the end of the window its first increment opened (a salted shard's turn).
    Turn(Duration),
}

struct Entry {
    delta: i64,
    wire: Bytes,
    reply: oneshot::Sender<Bytes>,
    done: oneshot::Sender<()>,
}

#[derive(Default)]
struct Batch {
    entries: Vec<Entry>,
    total: Option<i64>, // None once the sum overflowed: fall back to one by one
    /// `request_timeout_ms` from the batch's first increment: its caller was read then.
    deadline: Option<Instant>,
}

/// What combining did for one key since the hot set was last built: the increments it
/// took, and the node commands they cost (one per batch that combined, one per increment
/// of a batch sent one by one).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Batched {
    pub increments: u64,
    pub commands: u64,
    /// Batches that carried one increment: they saved the node nothing.
    pub batches_of_one: u64,
}

impl Batched {
    /// Increments per node command; None before any batch ran.
    pub fn per_command(&self) -> Option<f64> {
        (self.commands > 0).then(|| self.increments as f64 / self.commands as f64)
    }
}

/// The keys this proxy combines now: a key is in `open` from its first increment until
/// its driver finds it idle for a backstop.
pub struct Combiner {
    open: Mutex<HashMap<BatchKey, Slot>>,
    /// Per key, what its batches did since `take_batched` (touched once per batch).
    batched: Mutex<HashMap<Bytes, Batched>>,
    metrics: CombineMetrics,
    /// `request_timeout_ms`, counted from when a batch opens: its callers were read then.
    timeout: Option<Duration>,
}

/// What a caller waits on: its reply, and the moment its write reached the node (the
/// session's barrier before its next command).
pub struct Pending {
    pub reply: oneshot::Receiver<Bytes>,
    pub done: oneshot::Receiver<()>,
}

/// One key's batches: the one gathering, and when the last left.
struct Slot {
    batch: Batch,
    left: Instant,
    /// A batch is at the node: the next leaves once it has answered.
    flying: bool,
}

impl Slot {
    /// The batch gathered so far, leaving now.
    fn take(&mut self, now: Instant) -> Batch {
        self.flying = true;
        self.left = now;
        std::mem::take(&mut self.batch)
    }
}

impl Pace {
    fn window(self) -> Duration {
        let (Pace::Now(w) | Pace::Turn(w)) = self;
        w
    }

    /// How long after a batch left its key's driver sends what gathered since, if no
    /// increment did: a window and a half with `Now`, so that at a rate that fills batches
    /// the next increment usually carries them in its session's write; a window with `Turn`.
    fn backstop(self) -> Duration {
        match self {
            Pace::Now(w) => w + w / 2,
            Pace::Turn(w) => w,
        }
    }
}

/// A batch on its way: the call, or its commands when the connection's queue was full.
struct Flight {
    batch: Batch,
    combined: bool,
    /// The commands the call carries: 1 combined, else one per increment.
    count: u32,
    call: Result<Call, SmallVec<[Bytes; 4]>>,
}

impl Combiner {
    pub fn new(metrics: CombineMetrics, timeout: Option<Duration>) -> Arc<Combiner> {
        Arc::new(Combiner {
            open: Mutex::new(HashMap::new()),
            batched: Mutex::new(HashMap::new()),
            metrics,
            timeout,
        })
    }

    /// Adds one increment to the key's batch. With `Pace::Now`, when the key has nothing in
    /// flight and sent nothing in the last window, the batch (with this increment) leaves at
    /// once, queued from the caller's own task. A key's first increment starts its driver.
    /// `wire` is the caller's own command, sent if the batch holds it alone or falls back.
    pub fn add(
        self: &Arc<Self>,
        bk: BatchKey,
        conn: ConnHandle,
        delta: i64,
        wire: Bytes,
        pace: Pace,
    ) -> Pending {
        let (reply_tx, reply) = oneshot::channel();
        let (done_tx, done) = oneshot::channel();
        let entry = Entry {
            delta,
            wire,
            reply: reply_tx,
            done: done_tx,
        };
        self.metrics.ops.inc();
        let now = Instant::now();
        let (go, start_driver) = {
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            // A slot lives as long as its driver: a new one starts a driver.
            let new = !open.contains_key(&bk);
            let slot = open.entry(bk.clone()).or_insert_with(|| Slot {
                batch: Batch::default(),
                left: match pace {
                    Pace::Now(w) => now.checked_sub(w).unwrap_or(now),
                    Pace::Turn(_) => now,
                },
                flying: false,
            });
            if matches!(pace, Pace::Turn(_)) && slot.batch.entries.is_empty() && !slot.flying {
                slot.left = now; // a turn's batch waits its window from its first write
            }
            slot.batch.push(entry, self.timeout);
            let go =
                (matches!(pace, Pace::Now(_)) && !slot.flying && now >= slot.left + pace.window())
                    .then(|| slot.take(now));
            (go, new)
        };
        if let Some(batch) = go {
            let flight = self.send(batch, &bk, &conn);
            let (me, bk, conn) = (self.clone(), bk.clone(), conn.clone());
            tokio::spawn(async move { me.fly(flight, &bk, &conn, pace).await });
        }
        if start_driver {
            // Its first look: when the batch just sent (Now) or opened (Turn) is due.
            tokio::spawn(self.clone().drive(bk, conn, pace, now + pace.backstop()));
        }
        Pending { reply, done }
    }

    /// What each key's batches did since the last call, and a fresh start.
    pub fn take_batched(&self) -> HashMap<Bytes, Batched> {
        std::mem::take(&mut *self.batched.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Lands a batch, and when more gathered meanwhile and the window since it left has
    /// passed, sends that too from here: this task runs in the tick the node's reply woke
    /// it, when the sessions it answered queue their next commands, so the batch shares
    /// their write to the node.
    async fn fly(&self, mut flight: Flight, bk: &BatchKey, conn: &ConnHandle, pace: Pace) {
        loop {
            self.land(flight, conn).await;
            let now = Instant::now();
            let next = {
                let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
                let Some(slot) = open.get_mut(bk) else { return };
                slot.flying = false;
                let due = matches!(pace, Pace::Now(_)) && now >= slot.left + pace.window();
                (due && !slot.batch.entries.is_empty()).then(|| slot.take(now))
            };
            match next {
                Some(batch) => flight = self.send(batch, bk, conn),
                None => return,
            }
        }
    }

    /// The key's backstop: what gathered and no increment or landing sent leaves at
    /// `pace.backstop()` after the last batch; a key idle that long leaves `open`, and its
    /// next increment starts a driver again.
    async fn drive(self: Arc<Self>, bk: BatchKey, conn: ConnHandle, pace: Pace, first: Instant) {
        let mut wake = first;
        loop {
            tokio::time::sleep_until(wake).await;
            // Sends what is due, again after each landing, until there is a time to wait for.
            loop {
                let now = Instant::now();
                let batch = {
                    let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
                    let Some(slot) = open.get_mut(&bk) else {
                        return;
                    };
                    let due = slot.left + pace.backstop();
                    if slot.flying {
                        // Its landing sends what gathered, or leaves it to this timer.
                        wake = due.max(now + pace.window());
                        break;
                    }
                    if now < due {
                        wake = due;
                        break;
                    }
                    if slot.batch.entries.is_empty() {
                        open.remove(&bk);
                        return;
                    }
                    slot.take(now)
                };
                let flight = self.send(batch, &bk, &conn);
                self.fly(flight, &bk, &conn, pace).await;
            }
        }
    }

    /// Queues the batch's one command (its sum, or its own commands when it holds one
    /// increment or its sum overflowed), without waiting, and counts it.
    fn send(&self, batch: Batch, bk: &BatchKey, conn: &ConnHandle) -> Flight {
        let n = batch.entries.len();
        let combined = n > 1 && batch.total.is_some();
        {
            let mut b = self.batched.lock().unwrap_or_else(|p| p.into_inner());
            let e = b.entry(bk.key.clone()).or_default();
            e.increments += n as u64;
            e.commands += if combined { 1 } else { n as u64 };
            e.batches_of_one += u64::from(n == 1);
        }
        let (data, count): (SmallVec<[Bytes; 4]>, u32) = match (combined, batch.total) {
            (true, Some(total)) => {
                let t = total.to_string();
                let cmd = match &bk.field {
                    Some(f) => wire(&[&b"HINCRBY"[..], &bk.key, f, t.as_bytes()]),
                    None => wire(&[&b"INCRBY"[..], &bk.key, t.as_bytes()]),
                };
                self.metrics.backend_writes.inc();
                (smallvec![cmd], 1)
            }
            _ => {
                if n > 1 {
                    self.metrics.fallbacks.inc();
                }
                self.metrics.backend_writes.inc_by(n as u64);
                (
                    batch.entries.iter().map(|e| e.wire.clone()).collect(),
                    n as u32,
                )
            }
        };
        Flight {
            call: conn.try_start(data, count),
            batch,
            combined,
            count,
        }
    }

    /// Waits for the batch's replies and gives each caller its own.
    async fn land(&self, f: Flight, conn: &ConnHandle) {
        let Flight {
            batch,
            combined,
            count,
            call,
        } = f;
        let d = batch.deadline;
        let call = match call {
            Ok(call) => call,
            Err(data) => conn.start(data, count, d).await,
        };
        let replies = match call.wait(d).await {
            Ok(r) => r,
            Err(err) => return fail_all(batch, &err),
        };
        if !combined {
            for (i, e) in batch.entries.into_iter().enumerate() {
                let _ = e.reply.send(replies.get(i));
                let _ = e.done.send(());
            }
            return;
        }
        match parse_value(&replies.get(0)) {
            Ok(Some((Value::Integer(v), _))) => {
                // Caller i sees V minus what the callers after it added.
                let mut after: i64 = 0;
                let mut out: Vec<Bytes> = Vec::with_capacity(batch.entries.len());
                for e in batch.entries.iter().rev() {
                    let mut b = BytesMut::with_capacity(24);
                    encode_int(v - after, &mut b);
                    out.push(b.freeze());
                    after += e.delta; // cannot overflow: the total did not
                }
                out.reverse();
                for (e, r) in batch.entries.into_iter().zip(out) {
                    let _ = e.reply.send(r);
                    let _ = e.done.send(());
                }
            }
            // An error reply: each caller must see its own.
            _ => self.one_by_one(batch, conn).await,
        }
    }

    async fn one_by_one(&self, batch: Batch, conn: &ConnHandle) {
        self.metrics.fallbacks.inc();
        let n = batch.entries.len();
        self.metrics.backend_writes.inc_by(n as u64);
        let wires = batch.entries.iter().map(|e| e.wire.clone()).collect();
        match conn.call(wires, n as u32, batch.deadline).await {
            Ok(r) => {
                for (i, e) in batch.entries.into_iter().enumerate() {
                    let _ = e.reply.send(r.get(i));
                    let _ = e.done.send(());
                }
            }
            Err(err) => fail_all(batch, &err),
        }
    }
}

impl Batch {
    fn push(&mut self, e: Entry, timeout: Option<Duration>) {
        if self.entries.is_empty() {
            self.total = Some(0);
            self.deadline = deadline(timeout);
        }
        self.total = self.total.and_then(|t| t.checked_add(e.delta));
        self.entries.push(e);
    }
}

/// Every caller of the batch gets the same backend error.
fn fail_all(batch: Batch, err: &BackendError) {
    let mut out = BytesMut::new();
    encode_error(&format!("ERR saltshaker: {err}"), &mut out);
    let out = out.freeze();
    for e in batch.entries {
        let _ = e.reply.send(out.clone());
        let _ = e.done.send(());
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn replies_are_running_totals_in_arrival_order() {
        // V = 10 after deltas [1, 2, 3] on a key that held 4: callers see 5, 7, 10.
        let deltas = [1i64, 2, 3];
        let v = 10i64;
        let mut after = 0;
        let mut seen = Vec::new();
        for d in deltas.iter().rev() {
            seen.push(v - after);
            after += d;
        }
        seen.reverse();
        assert_eq!(seen, vec![5, 7, 10]);
    }
}
