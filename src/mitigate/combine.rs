//! Combining: same-key increments that arrive within a short window go to the backend as
//! one INCRBY (or HINCRBY) of their sum, and every caller still gets its exact reply.
//!
//! The batch for a key collects `(delta, caller)` in arrival order. When the window ends,
//! one `INCRBY key total` runs; if it returns `V`, caller `i` gets
//! `V - (delta[i+1] + ... + delta[n-1])`, which is exactly what it would have seen had the
//! batch run one by one in arrival order (nothing else can run between them on the node,
//! because they ran as one command). An error reply (WRONGTYPE, not an integer, overflow)
//! or a sum that overflows i64 falls back to sending the batch's own commands one by one in
//! one job, so each caller gets its own true answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::sync::oneshot;

use smallvec::smallvec;
use tokio::time::Instant;

use crate::backend::{deadline, wire, BackendError, ConnHandle};
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
}

/// What combining did for one key since the hot set was last built: the increments it
/// took, and the node commands they cost (one per batch that combined, one per increment
/// of a batch sent one by one).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Batched {
    pub increments: u64,
    pub commands: u64,
    /// Batches that carried one increment: each caller waited the window for nothing.
    pub batches_of_one: u64,
}

impl Batched {
    /// Increments per node command; None before any batch ran.
    pub fn per_command(&self) -> Option<f64> {
        (self.commands > 0).then(|| self.increments as f64 / self.commands as f64)
    }
}

/// All open batches of this proxy.
pub struct Combiner {
    open: Mutex<HashMap<BatchKey, Batch>>,
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

impl Combiner {
    pub fn new(metrics: CombineMetrics, timeout: Option<Duration>) -> Arc<Combiner> {
        Arc::new(Combiner {
            open: Mutex::new(HashMap::new()),
            batched: Mutex::new(HashMap::new()),
            metrics,
            timeout,
        })
    }

    /// Adds one increment to the key's batch, opening the batch (and its timer) if needed.
    /// `wire` is the caller's own command, used if the batch falls back.
    pub fn add(
        self: &Arc<Self>,
        bk: BatchKey,
        conn: ConnHandle,
        delta: i64,
        wire: Bytes,
        window: Duration,
    ) -> Pending {
        let (reply_tx, reply) = oneshot::channel();
        let (done_tx, done) = oneshot::channel();
        let entry = Entry {
            delta,
            wire,
            reply: reply_tx,
            done: done_tx,
        };
        let opened = {
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            let batch = open.entry(bk.clone()).or_insert_with(|| Batch {
                entries: Vec::new(),
                total: Some(0),
            });
            let opened = batch.entries.is_empty();
            batch.total = batch.total.and_then(|t| t.checked_add(delta));
            batch.entries.push(entry);
            opened
        };
        self.metrics.ops.inc();
        if opened {
            let me = self.clone();
            let deadline = deadline(self.timeout);
            tokio::spawn(async move {
                tokio::time::sleep(window).await;
                me.flush(bk, conn, deadline).await;
            });
        }
        Pending { reply, done }
    }

    /// What each key's batches did since the last call, and a fresh start.
    pub fn take_batched(&self) -> HashMap<Bytes, Batched> {
        std::mem::take(&mut *self.batched.lock().unwrap_or_else(|p| p.into_inner()))
    }

    async fn flush(&self, bk: BatchKey, conn: ConnHandle, deadline: Option<Instant>) {
        let batch = {
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            open.remove(&bk).unwrap_or_default()
        };
        if batch.entries.is_empty() {
            return;
        }
        let n = batch.entries.len() as u64;
        let commands = if batch.total.is_some() { 1 } else { n };
        {
            let mut b = self.batched.lock().unwrap_or_else(|p| p.into_inner());
            let e = b.entry(bk.key.clone()).or_default();
            e.increments += n;
            e.commands += commands;
            e.batches_of_one += u64::from(n == 1);
        }
        let combined = match batch.total {
            Some(total) if batch.entries.len() > 1 => {
                let cmd = match &bk.field {
                    Some(f) => wire(&[&b"HINCRBY"[..], &bk.key, f, total.to_string().as_bytes()]),
                    None => wire(&[&b"INCRBY"[..], &bk.key, total.to_string().as_bytes()]),
                };
                self.metrics.backend_writes.inc();
                match conn
                    .call(smallvec![cmd], 1, deadline)
                    .await
                    .map(|r| r.get(0))
                {
                    Ok(raw) => match parse_value(&raw) {
                        Ok(Some((Value::Integer(v), _))) => Some(Ok(v)),
                        _ => None, // an error reply: each caller must see its own
                    },
                    Err(e) => Some(Err(e)),
                }
            }
            _ => None,
        };
        match combined {
            Some(Ok(v)) => {
                // Caller i sees V minus what the callers after it added.
                let mut after: i64 = 0;
                let mut replies: Vec<Bytes> = Vec::with_capacity(batch.entries.len());
                for e in batch.entries.iter().rev() {
                    let mut out = BytesMut::with_capacity(24);
                    encode_int(v - after, &mut out);
                    replies.push(out.freeze());
                    after += e.delta; // cannot overflow: the total did not
                }
                replies.reverse();
                for (e, r) in batch.entries.into_iter().zip(replies) {
                    let _ = e.reply.send(r);
                    let _ = e.done.send(());
                }
            }
            Some(Err(err)) => fail_all(batch, &err),
            None => self.one_by_one(batch, &conn, deadline).await,
        }
    }

    async fn one_by_one(&self, batch: Batch, conn: &ConnHandle, deadline: Option<Instant>) {
        if batch.entries.len() > 1 {
            self.metrics.fallbacks.inc();
        }
        let n = batch.entries.len();
        self.metrics.backend_writes.inc_by(n as u64);
        let wires = batch.entries.iter().map(|e| e.wire.clone()).collect();
        match conn.call(wires, n as u32, deadline).await {
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
