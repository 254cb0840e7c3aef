//! A round: the commands of one read, their jobs per node, and their reply slots in
//! request order. The session builds rounds; the reply writer resolves them in order.
//!
//! Commands going to the same node in one round share one job (one channel send, one
//! reply buffer), so a pipelined client costs the proxy per round, not per command.

use std::time::Instant;

use bytes::Bytes;
use smallvec::SmallVec;
use tokio::sync::oneshot;

use crate::backend::{Call, ConnHandle};
use crate::metrics::Class;

/// The keys of a round's commands as a 1024-bit filter, two bits per key: whether a key
/// may be among them. A wrong "maybe" only costs order (an increment goes as a plain
/// command, a round waits for a combined write it need not wait for); "no" is always
/// right. `all`: a command whose keys are unknown (FLUSHALL, EXEC, a script without keys).
#[derive(Clone, Default)]
pub struct Keys {
    bits: [u64; 16],
    all: bool,
}

impl Keys {
    pub fn hash(key: &[u8]) -> u64 {
        xxhash_rust::xxh3::xxh3_64(key)
    }

    fn bits(h: u64) -> [(usize, u64); 2] {
        let (a, b) = ((h & 1023) as usize, ((h >> 10) & 1023) as usize);
        [(a >> 6, 1 << (a & 63)), (b >> 6, 1 << (b & 63))]
    }

    pub fn add(&mut self, h: u64) {
        for (w, m) in Keys::bits(h) {
            self.bits[w] |= m;
        }
    }

    pub fn add_all(&mut self) {
        self.all = true;
    }

    pub fn may_hold(&self, h: u64) -> bool {
        self.all || Keys::bits(h).iter().all(|&(w, m)| self.bits[w] & m != 0)
    }
}

/// Where reply `idx` of job `job` is.
#[derive(Clone, Copy, Debug)]
pub struct Part {
    pub job: u16,
    pub idx: u32,
}

/// How the replies of a fanned-out command become one reply.
pub enum Merge {
    /// Sum of integer replies (DEL, UNLINK, EXISTS, TOUCH, DBSIZE).
    SumInt(Vec<Part>),
    /// MGET: `order[i]` = (part, position in that part's array) of key i.
    Mget {
        parts: Vec<Part>,
        order: Vec<(u16, u32)>,
    },
    /// Every node must say the same; the first error otherwise.
    AllOk(Vec<Part>),
    /// Arrays concatenated (KEYS).
    Concat(Vec<Part>),
    /// SLOWLOG GET: every node's entries merged newest first (by time, then id), the first
    /// `count` (None: all).
    Slowlog {
        parts: Vec<Part>,
        count: Option<usize>,
    },
    /// Element-wise AND of integer arrays (SCRIPT EXISTS).
    AndArrays(Vec<Part>),
    /// Smallest integer (WAIT).
    MinInt(Vec<Part>),
    /// First non-nil reply (RANDOMKEY).
    FirstNonNil(Vec<Part>),
    /// SCAN on one node; the cursor in the reply is re-encoded with the node.
    Scan {
        /// One SCAN per node from `node` on: several when the scan starts a node afresh
        /// (see `route::scan_one`).
        parts: Vec<Part>,
        node: usize,
        nodes: usize,
    },
    /// INFO: the proxy's section, then the first node's reply, then a line per node. The
    /// node's `connected_clients` and `blocked_clients` are replaced by the proxy's own.
    Info {
        proxy: String,
        parts: Vec<Part>,
        addrs: Vec<String>,
        clients: i64,
        /// Clients blocked in the proxy itself (CLIENT PAUSE), and the nodes' `CLIENT
        /// LIST ID ...` of the connections the other blocked clients wait on: those
        /// flagged `b` count too.
        blocked: i64,
        blocked_asks: Vec<Part>,
        /// Clients with CLIENT TRACKING on, and the keys remembered for them.
        tracking: (usize, usize),
    },
    /// MULTI ... EXEC sent as one unit: the client wants EXEC's reply, the last one, with
    /// the replies of the commands the proxy ran itself put in their places
    /// (`txn::splice`).
    Exec(Part, Vec<(usize, Bytes)>),
    /// A command on a salted key: the replies of its parts (base first, or the one shard
    /// written) merged by `salt::ops`.
    Salted {
        parts: Vec<Part>,
        op: crate::salt::kind::Op,
        entry: std::sync::Arc<crate::salt::Salted>,
        /// For a write: the part written, and the proxy (a new shard takes the key's expiry).
        part: usize,
        ctx: Option<std::sync::Arc<super::ctx::Ctx>>,
    },
    /// `SALTSHAKER.INCRBY` as one script: its reply becomes INCRBY's (`salt::idem::finish`).
    Once {
        part: Part,
        entry: Option<std::sync::Arc<crate::salt::Salted>>,
        to: crate::salt::idem::Placed,
        delta: i64,
        salt: std::sync::Arc<crate::salt::Salt>,
    },
}

/// The reply to one command.
pub enum Slot {
    /// Answered by the proxy (or an error found before forwarding).
    Ready(Bytes),
    /// One reply from one job.
    Reply(Part),
    /// Several replies merged.
    Merge(Box<Merge>),
    /// Answered later by a task of the session (a combined write, a cache fill, a salted
    /// task, WATCH on the dedicated connection), due by the round's deadline.
    Later(oneshot::Receiver<Bytes>),
    /// A blocking command (BLPOP, XREAD BLOCK, ...): it may wait as long as it asks to, so
    /// the round's deadline does not apply. Counted as a blocked client until answered.
    Blocking(oneshot::Receiver<Bytes>, Blocked),
    /// Answered later, then rewritten (a combined shard write's reply becomes the estimate).
    LaterThen(
        oneshot::Receiver<Bytes>,
        Box<dyn FnOnce(Bytes) -> Bytes + Send + Sync>,
    ),
    /// An MGET with read-hot keys: some values from the cache, the rest from the nodes.
    MgetPerKey(Box<MgetPerKey>),
    /// Another slot whose reply is shown to a hook once written (admission remembers what
    /// a sampled counter showed). A `Seen` inside a `Seen` is written without its hook.
    Seen(Box<Slot>, SeenHook),
    /// Answered by the proxy when its turn to be written comes, from what the replies
    /// before it showed (a sampled increment that is not sent).
    Deferred(Box<dyn FnOnce() -> Bytes + Send + Sync>),
    /// The reply of the slot just before it, again: a pure read of a salted key identical
    /// to the one before it in the round (both read before the round was sent) is merged
    /// once and written twice.
    Again,
    /// Another slot whose reply is awaited in its turn but not written: CLIENT REPLY OFF,
    /// or the command after CLIENT REPLY SKIP.
    Quiet(Box<Slot>),
}

/// One client waiting in a blocking command: flagged `b` in its CLIENT LIST line while it
/// lives, and asked about by INFO's `blocked_clients` (`local::blocked_clients`).
pub struct Blocked(std::sync::Arc<crate::proxy::registry::clients::Client>);

impl Blocked {
    /// `on`: the node and the node's id of the connection the command waits on, for
    /// CLIENT UNBLOCK and INFO (None while paused by CLIENT PAUSE, which it cannot end).
    pub fn new(
        client: &std::sync::Arc<crate::proxy::registry::clients::Client>,
        on: Option<(usize, std::sync::Arc<std::sync::atomic::AtomicU64>)>,
    ) -> Blocked {
        client.set_blocked(true, on);
        Blocked(client.clone())
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        self.0.set_blocked(false, None);
    }
}

/// Shown a reply once it is written.
pub type SeenHook = Box<dyn FnOnce(&[u8]) + Send + Sync>;

/// An MGET answered key by key: `from[i]` is where key i's value is.
pub struct MgetPerKey {
    /// The MGET of the cold keys sent to each of their nodes.
    pub parts: Vec<Part>,
    pub from: Vec<MgetFrom>,
}

/// Where one key's value of an MGET comes from.
pub enum MgetFrom {
    /// Position `pos` in the array reply of `parts[part]`.
    Node { part: u16, pos: u32 },
    /// The reply to `GET key`, from the cache (`Ready`) or its fill (`Later`).
    Cache(CachedGet),
}

/// A `GET key` reply served by the cache: at once on a hit, or when its fill answers.
pub enum CachedGet {
    Ready(Bytes),
    Later(oneshot::Receiver<Bytes>),
}

/// A job being filled for one node.
pub struct JobBuilder {
    pub node: usize,
    pub conn: ConnHandle,
    pub data: SmallVec<[Bytes; 4]>,
    pub count: u32,
}

/// A round on its way to the reply writer, with the protocol its merged replies are
/// written in. Boxed: the writer's channel allocates its first block of 32 slots when a
/// connection opens, and a `Round` is over 500 bytes, so unboxed every idle connection
/// held 17 KB of empty slots (bench/conn_memory.py).
pub type Queued = Box<(Round, crate::resp::Proto)>;

/// One round, as handed to the reply writer.
pub struct Round {
    /// One call per node, awaited until the round's deadline.
    pub sent: SmallVec<[Call; 1]>,
    pub slots: Vec<Slot>,
    pub started: Instant,
    /// Every reply of the round is due by then (read time + `request_timeout_ms`), however
    /// deep the pipeline: all its waits run together, not one after another.
    pub deadline: Option<tokio::time::Instant>,
    pub counts: [u64; 3],
    /// Close the connection once this round's replies are written (QUIT, protocol error).
    pub close_after: bool,
    /// Hand the connection over to a pub/sub tunnel after this round.
    pub tunnel: Option<super::tunnel::TunnelEnd>,
    /// Fired once every reply of this round has arrived (the session's barrier after a
    /// write to a cached key).
    pub acked: Vec<oneshot::Sender<()>>,
    pub invalidate_after: Vec<Bytes>,
    /// Counts the round's commands in the session's `Inflight` until the writer has them.
    pub inflight: Option<Held>,
    /// Push messages only (client-side caching's invalidations): no command's reply.
    pub push: bool,
    /// Single-key reads whose reply's cost the writer counts against their key, by slot.
    pub costs: Vec<super::cost::Cost>,
    /// One of `costs` is a big write: its cost is in its request, however small the replies.
    pub big_write: bool,
}

impl Round {
    /// A round of push messages, written where the session's rounds have reached.
    pub fn push(messages: Bytes) -> Round {
        Round {
            sent: SmallVec::new(),
            slots: vec![Slot::Ready(messages)],
            started: Instant::now(),
            deadline: None,
            counts: [0; 3],
            close_after: false,
            tunnel: None,
            acked: Vec::new(),
            invalidate_after: Vec::new(),
            inflight: None,
            push: true,
            costs: Vec::new(),
            big_write: false,
        }
    }
}

/// The commands a session has sent whose replies the writer has not yet taken, and the
/// bytes a reply took lately: the session reads no more of its client while their product
/// passes `limits.max_output_bytes`. The writer's own limit starts only once replies are
/// resolved, and replies resolve while the client is not reading: without this, a client
/// that pipelines small GETs of a big value and never reads had every command of up to 16
/// queued rounds (thousands) answered by the node into the proxy's memory first.
#[derive(Default)]
pub struct Inflight {
    cmds: std::sync::atomic::AtomicUsize,
    /// Bytes per reply, as the writer last measured them (0 before the first round).
    per_reply: std::sync::atomic::AtomicUsize,
    freed: tokio::sync::Notify,
}

/// While no reply size is known (no round of the session resolved yet: its node may be
/// slow), replies are taken to be this big, so that a deep pipeline to a frozen node is
/// read at once (its commands' deadlines start when they are read) while a flood of GETs
/// of a big value stays within a few times the limit until the first round measures it.
const UNMEASURED_REPLY: usize = 32 * 1024;
/// And at least this many commands may be in flight, whatever the limit.
const UNMEASURED_MIN: usize = 256;

impl Inflight {
    /// Whether the replies in flight may already pass `limit` bytes.
    pub fn over(&self, limit: usize) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        let n = self.cmds.load(Relaxed);
        let per = self.per_reply.load(Relaxed);
        n > 0
            && if per == 0 {
                n > unmeasured(limit)
            } else {
                n.saturating_mul(per) > limit
            }
    }

    /// How many more commands may be asked for now (at least one).
    pub fn room(&self, limit: usize) -> usize {
        use std::sync::atomic::Ordering::Relaxed;
        let per = self.per_reply.load(Relaxed);
        let cap = if per == 0 {
            unmeasured(limit)
        } else {
            (limit / per).max(1)
        };
        cap.saturating_sub(self.cmds.load(Relaxed)).max(1)
    }

    /// Waits until the writer takes a round.
    pub async fn freed(&self) {
        self.freed.notified().await
    }
}

fn unmeasured(limit: usize) -> usize {
    (limit / UNMEASURED_REPLY).max(UNMEASURED_MIN)
}

/// A round's commands, counted in flight until dropped.
pub struct Held(std::sync::Arc<Inflight>, usize);

impl Held {
    /// The writer resolved the round into `bytes` of replies.
    pub fn resolved(self, bytes: usize) {
        if self.1 > 0 {
            let per = (bytes / self.1).max(1);
            self.0
                .per_reply
                .store(per, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.0
            .cmds
            .fetch_sub(self.1, std::sync::atomic::Ordering::Relaxed);
        self.0.freed.notify_one();
    }
}

/// Builds a round while the session walks the commands of one read.
pub struct RoundBuilder {
    /// This round writes a key whose reads are cached: the session's later cached reads wait
    /// until its replies are in (read-your-writes), and its own later reads go to the node.
    pub wrote_cached: bool,
    /// Keys whose cache entries are dropped again once this round's replies are in: a fill
    /// that reached the node just before the write must not outlive the write's reply.
    pub invalidate_after: Vec<Bytes>,
    /// Keys this round writes (while the cache is on): their reads are not served from the
    /// cache until the round's replies are in, whether or not they were read-hot when written
    /// (a fill on its own connection could otherwise overtake the write).
    pub written: Vec<Bytes>,
    pub jobs: SmallVec<[JobBuilder; 1]>,
    pub slots: Vec<Slot>,
    pub started: Instant,
    /// When the round's commands were read: their deadline counts from here.
    pub read_at: tokio::time::Instant,

    pub counts: [u64; 3],
    /// The slot that the run of `Slot::Again` at the end of `slots` repeats.
    pub repeated: usize,
    /// The keys of the commands handled so far (see `Order::may_combine`).
    pub keys: Keys,
    /// The keys of the command being handled: added to `keys` once it is handled, unless
    /// it left with a combine batch (`combined`). `None`: keys unknown.
    pub current: Option<SmallVec<[u64; 2]>>,
    /// See `Round::costs`.
    pub costs: Vec<super::cost::Cost>,
    pub big_write: bool,
}

impl RoundBuilder {
    pub fn new() -> Self {
        Self::with_capacity(16)
    }

    /// A round for about `commands` commands (one read's worth).
    pub fn with_capacity(commands: usize) -> Self {
        // One clock read per round: the latency histogram's start and the deadline's.
        let read_at = tokio::time::Instant::now();
        RoundBuilder {
            wrote_cached: false,
            invalidate_after: Vec::new(),
            written: Vec::new(),
            jobs: SmallVec::new(),
            slots: Vec::with_capacity(commands),
            started: read_at.into_std(),
            read_at,

            counts: [0; 3],
            repeated: 0,
            keys: Keys::default(),
            current: Some(SmallVec::new()),
            costs: Vec::new(),
            big_write: false,
        }
    }

    /// Notes a read's reply slot for detection by cost, if acting on it added exactly one
    /// slot (a command handed to a task or another connection is noted when it is acted on
    /// again).
    pub fn note_cost(&mut self, cost: Option<super::cost::Cost>, slots_before: usize) {
        if let Some(mut cost) = cost {
            if self.slots.len() == slots_before + 1 {
                cost.slot = slots_before as u32;
                if self.costs.capacity() == 0 {
                    // One allocation per round, not one per doubling.
                    self.costs.reserve(self.slots.capacity());
                }
                self.big_write |= cost.write;
                self.costs.push(cost);
            }
        }
    }

    /// The command being handled has the keys of `c` in `req` (none known: every key).
    pub fn note_keys(&mut self, req: &crate::resp::Request, keys: &[u32], known: bool) {
        self.current = known.then(|| {
            keys.iter()
                .map(|&k| Keys::hash(req.arg(k as usize)))
                .collect()
        });
    }

    /// The command being handled left with a combine batch: no job of the round holds it.
    pub fn combined(&mut self) {
        self.current = Some(SmallVec::new());
    }

    /// The command is handled: its keys join the round's.
    pub fn commit_keys(&mut self) {
        match self.current.replace(SmallVec::new()) {
            Some(hs) => hs.into_iter().for_each(|h| self.keys.add(h)),
            None => self.keys.add_all(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Adds one command's bytes to the job for `node`; returns where its reply will be.
    pub fn push(
        &mut self,
        node: usize,
        conn: impl FnOnce() -> ConnHandle,
        wire: Bytes,
        count: u32,
    ) -> Part {
        let job = match self.jobs.iter().position(|j| j.node == node) {
            Some(i) => i,
            None => {
                self.jobs.push(JobBuilder {
                    node,
                    conn: conn(),
                    data: SmallVec::new(),
                    count: 0,
                });
                self.jobs.len() - 1
            }
        };
        let j = &mut self.jobs[job];
        let idx = j.count + count - 1;
        j.data.push(wire);
        j.count += count;
        Part {
            job: job as u16,
            idx,
        }
    }

    pub fn count(&mut self, class: Class) {
        self.counts[class as usize] += 1;
    }

    /// Sends the round's jobs and returns the round for the writer; its replies are due
    /// `timeout` after the round was read, and its commands count in `inflight` until the
    /// writer has them. Waits only when a node's queue is full (`Full`).
    pub async fn send(
        self,
        timeout: Option<std::time::Duration>,
        inflight: &std::sync::Arc<Inflight>,
    ) -> Round {
        match self.send_now(timeout, inflight) {
            Ok(round) => round,
            Err(full) => Box::pin(full.finish()).await,
        }
    }

    /// `send` without waiting: `Err` when a job met a full queue, to be finished by
    /// `Full::finish` (boxed by the caller: it is rare, and its future large).
    pub fn send_now(
        self,
        timeout: Option<std::time::Duration>,
        inflight: &std::sync::Arc<Inflight>,
    ) -> Result<Round, Box<Full>> {
        let n = self.slots.len();
        inflight
            .cmds
            .fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        let held = Held(inflight.clone(), n);
        let deadline = timeout.map(|t| self.read_at + t);
        let mut round = Round {
            sent: SmallVec::new(),
            slots: self.slots,
            started: self.started,
            deadline,
            counts: self.counts,
            close_after: false,
            tunnel: None,
            acked: Vec::new(),
            invalidate_after: self.invalidate_after,
            inflight: Some(held),
            push: false,
            costs: self.costs,
            big_write: self.big_write,
        };
        let mut jobs = self.jobs.into_iter();
        while let Some(j) = jobs.next() {
            match j.conn.try_start(j.data, j.count) {
                Ok(call) => round.sent.push(call),
                Err(data) => {
                    let first = JobBuilder { data, ..j };
                    return Err(Box::new(Full {
                        round,
                        first,
                        rest: jobs,
                    }));
                }
            }
        }
        Ok(round)
    }
}

/// A round whose job met a full queue on its node: that job and the ones after it wait
/// for room, in order, until the round's deadline.
pub struct Full {
    round: Round,
    first: JobBuilder,
    rest: smallvec::IntoIter<[JobBuilder; 1]>,
}

impl Full {
    pub async fn finish(self: Box<Self>) -> Round {
        let Full {
            mut round,
            first,
            rest,
        } = *self;
        for j in std::iter::once(first).chain(rest) {
            let call = j.conn.start(j.data, j.count, round.deadline).await;
            round.sent.push(call);
        }
        round
    }
}

impl Default for RoundBuilder {
    fn default() -> Self {
        Self::new()
    }
}
