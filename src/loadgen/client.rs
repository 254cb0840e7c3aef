//! One benchmark connection: write a batch of `pipeline` commands, read its replies, time
//! each one, repeat until the run's deadline or request budget is spent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::histogram::Histogram;
use super::workload::Generator;
use crate::resp::ReplyFramer;

/// What every client of a run shares.
pub(crate) struct Plan {
    pub pipeline: usize,
    pub deadline: Option<Instant>,
    /// Requests not yet claimed by a client; `None` when only the deadline ends the run.
    pub remaining: Option<AtomicU64>,
    /// Each client's share of the run's ops/s cap.
    pub rate_per_client: Option<f64>,
}

impl Plan {
    /// Claims up to `want` requests from the budget.
    fn claim(&self, want: u64) -> u64 {
        let Some(left) = &self.remaining else {
            return want;
        };
        let mut cur = left.load(Ordering::Relaxed);
        loop {
            let take = cur.min(want);
            if take == 0 {
                return 0;
            }
            match left.compare_exchange_weak(cur, cur - take, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return take,
                Err(now) => cur = now,
            }
        }
    }
}

/// What one client saw.
#[derive(Default)]
pub(crate) struct Tally {
    pub latency: Histogram,
    /// Replies received, error replies included.
    pub ops: u64,
    /// Error replies, plus commands whose reply never came because the connection failed.
    pub errors: u64,
    /// Commands on the viral key that got a non-error reply.
    pub viral_ops: u64,
    pub failure: Option<String>,
}

/// A token bucket: `rate` tokens a second, holding at most `cap`.
struct Bucket {
    rate: f64,
    cap: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn new(rate: f64, batch: usize) -> Bucket {
        // Room for 10 ms of tokens, so a timer that fires late does not lose rate.
        let cap = (batch as f64).max(rate / 100.0);
        Bucket {
            rate,
            cap,
            tokens: batch as f64,
            last: Instant::now(),
        }
    }

    /// Waits for `n` tokens and takes them; false if `deadline` comes first.
    async fn take(&mut self, n: usize, deadline: Option<Instant>) -> bool {
        let n = n as f64;
        loop {
            let now = Instant::now();
            let earned = now.duration_since(self.last).as_secs_f64() * self.rate;
            self.tokens = (self.tokens + earned).min(self.cap.max(n));
            self.last = now;
            if self.tokens >= n {
                self.tokens -= n;
                return true;
            }
            let mut wake = now + Duration::from_secs_f64(((n - self.tokens) / self.rate).min(1.0));
            if let Some(d) = deadline {
                if d <= now {
                    return false;
                }
                wake = wake.min(d);
            }
            tokio::time::sleep_until(wake).await;
        }
    }
}

/// Drives one connection until the run is over or the connection fails.
pub(crate) async fn drive(mut stream: TcpStream, mut gen: Generator, plan: Arc<Plan>) -> Tally {
    let mut tally = Tally::default();
    let mut bucket = plan.rate_per_client.map(|r| Bucket::new(r, plan.pipeline));
    let mut out = BytesMut::with_capacity(plan.pipeline * 64);
    let mut viral = Vec::with_capacity(plan.pipeline);
    let mut reader = Reader::new();
    loop {
        if let Some(b) = bucket.as_mut() {
            if !b.take(plan.pipeline, plan.deadline).await {
                break;
            }
        }
        if plan.deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        let n = plan.claim(plan.pipeline as u64) as usize;
        if n == 0 {
            break;
        }
        out.clear();
        viral.clear();
        for _ in 0..n {
            viral.push(gen.next(&mut out));
        }
        let sent = Instant::now();
        let res = match stream.write_all(&out).await {
            Ok(()) => reader.replies(&mut stream, sent, &viral, &mut tally).await,
            Err(e) => Err((0, format!("write: {e}"))),
        };
        if let Err((got, why)) = res {
            tally.errors += (n - got) as u64;
            tally.failure = Some(why);
            break;
        }
    }
    tally
}

/// The read side of a connection: a buffer and a framer that finds where each reply ends.
struct Reader {
    buf: Vec<u8>,
    framer: ReplyFramer,
}

/// Replies are counted, never kept: only their framing has to be checked.
const MAX_BULK: usize = 512 * 1024 * 1024;
const READ_CHUNK: usize = 64 * 1024;

impl Reader {
    fn new() -> Reader {
        Reader {
            buf: Vec::with_capacity(READ_CHUNK),
            framer: ReplyFramer::new(MAX_BULK),
        }
    }

    /// Reads one reply per entry of `viral` (in order). Each reply's latency runs from
    /// `sent` to the end of the read that completed it: one clock reading per read, not
    /// per reply. `Err` carries how many replies came before the failure.
    async fn replies(
        &mut self,
        stream: &mut TcpStream,
        sent: Instant,
        viral: &[bool],
        tally: &mut Tally,
    ) -> Result<(), (usize, String)> {
        let mut got = 0;
        let mut pos = 0;
        let mut now = sent;
        loop {
            let us = now.duration_since(sent).as_micros() as u64;
            while got < viral.len() {
                let start = pos;
                match self.framer.next_len(&self.buf[start..]) {
                    Ok(Some(len)) => {
                        pos += len;
                        let is_error = self.buf.get(start) == Some(&b'-');
                        tally.ops += 1;
                        tally.errors += u64::from(is_error);
                        tally.viral_ops += u64::from(viral[got] && !is_error);
                        tally.latency.record(us);
                        got += 1;
                    }
                    Ok(None) => break,
                    Err(e) => return Err((got, e.to_string())),
                }
            }
            if got == viral.len() {
                // The server answers only what was asked: nothing can follow the batch.
                self.buf.clear();
                return Ok(());
            }
            // Keep the unfinished reply at the front: the framer resumes from there.
            self.buf.drain(..pos);
            pos = 0;
            self.buf.reserve(READ_CHUNK);
            match stream.read_buf(&mut self.buf).await {
                Ok(0) => return Err((got, "connection closed by the server".into())),
                Ok(_) => now = Instant::now(),
                Err(e) => return Err((got, format!("read: {e}"))),
            }
        }
    }
}
