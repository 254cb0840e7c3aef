//! Hot-key detection: which keys carry far more reads or writes than the rest, measured on
//! every request with bounded memory. Knows nothing of Redis: callers hand it key bytes and a
//! [`Kind`]; the proxy decides what a hot key means.
//!
//! Shape. Each worker thread keeps, per kind, a Count-Min sketch with conservative update
//! (4 rows x 2^14 `u32`, 256 KiB, one xxh3 hash per key) and a top-k tracker
//! ([`DetectorConfig::top_k`] keys). Counters halve every window. Nothing on the request path
//! is shared: a shared sketch turns the hot key into contention inside the proxy itself. Once
//! per window each thread hands its tracked keys' window counts to one aggregator thread,
//! which sums them, applies thresholds with hysteresis (hot at `hot_at`, listed as cooling
//! until below `cool_below`) and publishes a [`HotSnapshot`]. A key does not wait for the
//! tick: when a tracked key's sliding one-window count passes a report level, the thread says
//! so at once, and the aggregator promotes it as soon as the reports add up to its threshold.
//!
//! Why our own sketch: `probabilistic-collections` (last release 2020) hashes each key twice
//! with SipHash (about 8x slower than this hand-written sketch as the issue measured it; our
//! benchmark's emulation of that insert path alone costs more than our whole `observe`,
//! top-k and thread-local included: see bench/detector), has no top-k, no decay and no
//! conservative update, and derives its rows by double hashing, so a cold key that collides
//! with a hot one in two rows collides in all four and is reported hot (see `sketch` for how
//! our rows avoid that). `heavykeeper` is good but has no decay.
//!
//! Module map: `sketch` (hash, rows, Count-Min), `topk` (tracked keys), `local` (per-thread
//! state, thread-local registry), `aggregate` (windows, thresholds, snapshots), `clock`.

mod aggregate;
mod clock;
mod local;
mod sketch;
mod topk;

#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::watch;

pub use clock::{Clock, ManualClock};
pub use sketch::SKETCH_BYTES;

use aggregate::Aggregator;
use local::Control;
use local::{with_existing, with_local, Link, Msg, Published};

/// A key as the operator's views show it (`/hotkeys`, `saltshaker top`, log lines): its
/// text, or with `hotkeys.hash_names` its 64-bit xxh3 as `h:<16 hex digits>`, the same
/// everywhere so that a hashed key can be followed from a log line to `/hotkeys`.
pub fn shown(key: &[u8], hash_names: bool) -> String {
    if hash_names {
        format!("h:{:016x}", xxhash_rust::xxh3::xxh3_64(key))
    } else {
        String::from_utf8_lossy(key).into_owned()
    }
}

/// The most keys a thread's top-k can track per kind (`detection.top_k` is validated
/// against it; the tracker's slot table indexes entries with `u16`).
pub const MAX_TOP_K: usize = 8192;

/// What is counted. `Read` and `Write` count requests; `Bytes` and `NodeUs` are
/// weighted: each observation adds what one read cost (bytes moved, request and reply;
/// the node's estimated service time in microseconds). A key is hot when any kind
/// crosses its threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Read = 0,
    Write = 1,
    Bytes = 2,
    NodeUs = 3,
}

/// How many kinds a detector counts.
pub const KINDS: usize = 4;

impl Kind {
    pub const ALL: [Kind; KINDS] = [Kind::Read, Kind::Write, Kind::Bytes, Kind::NodeUs];

    /// What one count in the sketch stands for. Bytes are counted in 64-byte units, so a
    /// `u32` cell holds 256 GiB per window rather than 4 GiB; rates and thresholds outside
    /// this module are in bytes.
    pub const fn unit(self) -> u64 {
        match self {
            Kind::Bytes => 64,
            _ => 1,
        }
    }
}

/// Detection settings. Rates are per second, summed over all threads of this process.
#[derive(Clone, Debug)]
pub struct DetectorConfig {
    /// Counters halve and the aggregator closes a window this often. Default 1000.
    pub window_ms: u64,
    /// Keys tracked per thread and per kind. Default 128; keys beyond the top-k of every
    /// thread cannot be reported.
    pub top_k: usize,
    /// Default 2000.
    pub read_hot_at_per_sec: f64,
    /// Default 2000.
    pub write_hot_at_per_sec: f64,
    /// A hot key stays listed as cooling until its rate falls below this. Default 500.
    pub read_cool_below_per_sec: f64,
    /// Default 500.
    pub write_cool_below_per_sec: f64,
    /// Bytes per second (request and reply of reads). Default 16 MiB hot, 4 MiB cool.
    pub bytes_per_sec: Threshold,
    /// The node's microseconds per second. Default 100,000 hot (a tenth of the node's one
    /// command thread), 25,000 cool.
    pub node_us_per_sec: Threshold,
}

/// The default cost thresholds (docs/rules.md says how they were chosen).
pub const BYTES_HOT_AT_PER_SEC: f64 = 16.0 * 1024.0 * 1024.0;
pub const BYTES_COOL_BELOW_PER_SEC: f64 = 4.0 * 1024.0 * 1024.0;
pub const NODE_US_HOT_AT_PER_SEC: f64 = 100_000.0;
pub const NODE_US_COOL_BELOW_PER_SEC: f64 = 25_000.0;

impl Default for DetectorConfig {
    fn default() -> Self {
        DetectorConfig {
            window_ms: 1000,
            top_k: 128,
            read_hot_at_per_sec: 2000.0,
            write_hot_at_per_sec: 2000.0,
            read_cool_below_per_sec: 500.0,
            write_cool_below_per_sec: 500.0,
            bytes_per_sec: Threshold {
                hot_at_per_sec: BYTES_HOT_AT_PER_SEC,
                cool_below_per_sec: BYTES_COOL_BELOW_PER_SEC,
            },
            node_us_per_sec: Threshold {
                hot_at_per_sec: NODE_US_HOT_AT_PER_SEC,
                cool_below_per_sec: NODE_US_COOL_BELOW_PER_SEC,
            },
        }
    }
}

impl DetectorConfig {
    /// The thresholds of every kind, indexed by `Kind as usize`.
    pub fn thresholds(&self) -> [Threshold; KINDS] {
        [
            Threshold {
                hot_at_per_sec: self.read_hot_at_per_sec,
                cool_below_per_sec: self.read_cool_below_per_sec,
            },
            Threshold {
                hot_at_per_sec: self.write_hot_at_per_sec,
                cool_below_per_sec: self.write_cool_below_per_sec,
            },
            self.bytes_per_sec,
            self.node_us_per_sec,
        ]
    }
}

/// One kind's thresholds for a key.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    pub hot_at_per_sec: f64,
    pub cool_below_per_sec: f64,
}

/// Per-key thresholds (from rules). Consulted by the aggregator only, never on the request path.
pub trait KeyThresholds: Send + Sync {
    /// `None` means the detector's defaults apply.
    fn thresholds(&self, key: &[u8], kind: Kind) -> Option<Threshold>;
    /// The lowest `hot_at_per_sec` that `thresholds` can return for `kind`: threads use it to
    /// decide when a key is worth an early report.
    fn lowest_hot_at_per_sec(&self, kind: Kind) -> f64;
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum HotState {
    #[default]
    Hot,
    Cooling,
}

#[derive(Clone, Debug, Default)]
pub struct HotSnapshot {
    pub window_ms: u64,
    /// Hot and cooling keys, hottest first.
    pub keys: Vec<HotKey>,
    /// Over the last closed window.
    pub total_reads_per_sec: f64,
    pub total_writes_per_sec: f64,
    /// When this snapshot was published.
    pub at_unix_ms: u64,
    /// Read load of the keys the threads tracked in the last closed window, heaviest first
    /// (at most `MAX_READ_RATES`), hot or not: reads per second plus the node microseconds
    /// per second of their costly reads (a plain read counts as one). What a consumer needs
    /// to choose the keys that take a given load off a node (`mitigate::balance`).
    pub read_rates: Arc<Vec<(Box<[u8]>, f64)>>,
}

/// Most keys in `HotSnapshot::read_rates`: a node busier than the others needs at most a
/// few hundred of its keys cached (bench/zipf_placement.py --greedy).
pub const MAX_READ_RATES: usize = 4096;

#[derive(Clone, Debug, Default)]
pub struct HotKey {
    pub key: Vec<u8>,
    pub reads_per_sec: f64,
    pub writes_per_sec: f64,
    /// Of all traffic of its hot kind (the larger share if both kinds are listed).
    pub share: f64,
    /// `Hot` if hot in either kind.
    pub state: HotState,
    /// When the key became hot in this listing.
    pub since_unix_ms: u64,
    /// Per kind, `None` when the key is not listed for that kind.
    pub read_state: Option<HotState>,
    pub write_state: Option<HotState>,
    /// What its reads cost: bytes moved (request and reply), and the node's estimated
    /// milliseconds, per second. Counted only for reads whose cost passes the caller's
    /// floor (the proxy's `cost` module), so 0 for a key of small values.
    pub bytes_per_sec: f64,
    pub node_ms_per_sec: f64,
    pub bytes_state: Option<HotState>,
    pub node_state: Option<HotState>,
}

impl HotKey {
    /// Hot or cooling by what its reads cost (bytes or node time).
    pub fn cost_state(&self) -> Option<HotState> {
        match (self.bytes_state, self.node_state) {
            (Some(HotState::Hot), _) | (_, Some(HotState::Hot)) => Some(HotState::Hot),
            (None, None) => None,
            _ => Some(HotState::Cooling),
        }
    }

    /// Hot or cooling as a read: by its read rate or by what its reads cost.
    pub fn read_hot_state(&self) -> Option<HotState> {
        match (self.read_state, self.cost_state()) {
            (Some(HotState::Hot), _) | (_, Some(HotState::Hot)) => Some(HotState::Hot),
            (None, None) => None,
            _ => Some(HotState::Cooling),
        }
    }

    /// The measures that made it hot (or keep it listed): `reads`, `writes`, `bytes`,
    /// `node_time`.
    pub fn hot_by(&self) -> Vec<&'static str> {
        [
            (self.read_state, "reads"),
            (self.write_state, "writes"),
            (self.bytes_state, "bytes"),
            (self.node_state, "node_time"),
        ]
        .into_iter()
        .filter(|(s, _)| s.is_some())
        .map(|(_, n)| n)
        .collect()
    }
}

/// Cheap to clone. `observe` keeps per-thread state in a thread-local keyed by this
/// detector's id, so several detectors can live in one process (tests run several proxies).
/// The aggregator is a std thread: no runtime needed to create one.
#[derive(Clone)]
pub struct Detector {
    inner: Arc<Inner>,
}

struct Inner {
    link: Link,
    snapshots: watch::Receiver<Arc<HotSnapshot>>,
    aggregator: Mutex<Option<JoinHandle<()>>>,
}

static NEXT_DETECTOR: AtomicU64 = AtomicU64::new(1);

impl Detector {
    pub fn new(cfg: DetectorConfig) -> Self {
        Self::with_clock(cfg, Clock::System)
    }

    /// A detector on the given clock; tests and benchmarks pass a [`ManualClock`].
    pub fn with_clock(cfg: DetectorConfig, clock: Clock) -> Self {
        let window_ms = cfg.window_ms.max(1);
        let clock = clock::CoarseClock::new(&clock);
        let published = Arc::new(Published::default());
        let (tx, rx) = mpsc::channel();
        let (snap_tx, snap_rx) = watch::channel(Arc::new(HotSnapshot {
            window_ms,
            ..HotSnapshot::default()
        }));
        let defaults = cfg.thresholds();
        let agg = Aggregator::new(
            window_ms,
            clock.clone(),
            published.clone(),
            snap_tx,
            defaults,
        );
        let handle = std::thread::Builder::new()
            .name("saltshaker-hotkey".into())
            .spawn(move || agg.run(rx))
            .ok();
        Detector {
            inner: Arc::new(Inner {
                link: Link {
                    id: NEXT_DETECTOR.fetch_add(1, Ordering::Relaxed),
                    tx,
                    clock,
                    window_ms,
                    top_k: cfg.top_k,
                    published,
                },
                snapshots: snap_rx,
                aggregator: Mutex::new(handle),
            }),
        }
    }

    /// Counts one access. The request path: no lock, no atomic read-modify-write. The
    /// key's sketch cells are prefetched now and counted at this thread's next `observe`
    /// (or `flush_local`, `sync`, a window's end), so a key's count may lag by one
    /// observation.
    #[inline]
    pub fn observe(&self, key: &[u8], kind: Kind) {
        with_local(&self.inner.link, |local| local.observe(key, kind));
    }

    /// Counts what one read cost, in `kind`'s natural unit (bytes for `Bytes`,
    /// microseconds for `NodeUs`). Counted at once (no prefetch): callers only report costs
    /// past a floor, which ordinary small reads do not reach.
    #[inline]
    pub fn observe_cost(&self, key: &[u8], kind: Kind, weight: u64) {
        with_local(&self.inner.link, |local| {
            local.observe_weighted(key, kind, weight)
        });
    }

    /// The latest published snapshot.
    pub fn snapshot(&self) -> HotSnapshot {
        HotSnapshot::clone(&self.inner.snapshots.borrow())
    }

    /// Snapshots as they are published (on every window close and every early promotion).
    pub fn subscribe(&self) -> watch::Receiver<Arc<HotSnapshot>> {
        self.inner.snapshots.clone()
    }

    /// Replaces the default thresholds of every kind (indexed by `Kind as usize`), live.
    pub fn set_thresholds(&self, t: [Threshold; KINDS]) {
        self.control(Control::Thresholds(t));
    }

    /// Installs (or removes) per-key thresholds, live.
    pub fn set_key_thresholds(&self, per_key: Option<Arc<dyn KeyThresholds>>) {
        self.control(Control::KeyThresholds(per_key));
    }

    /// Tracks up to `keys` read keys per thread (from each thread's next window) while above
    /// the configured `top_k`; 0 goes back to `top_k`.
    pub fn set_read_depth(&self, keys: usize) {
        self.inner
            .link
            .published
            .read_depth
            .store(keys.min(MAX_TOP_K), Ordering::Relaxed);
    }

    /// Hands this thread's counts over now if its window has ended, as its next `observe`
    /// would. Useful before a worker thread parks for long, and in tests.
    pub fn flush_local(&self) {
        with_local(&self.inner.link, |local| local.roll_if_due());
    }

    /// Waits (up to ten seconds) until the aggregator has handled everything sent before this
    /// call and closed every window that is due, the calling thread's last observation
    /// counted. For tests and benchmarks.
    pub fn sync(&self) {
        with_existing(&self.inner.link, |local| {
            let now = self.inner.link.clock.now_ms();
            local.settle(now);
        });
        let (tx, rx) = mpsc::sync_channel(1);
        self.control(Control::Sync(tx));
        let _ = rx.recv_timeout(Duration::from_secs(10));
    }

    /// Bytes the calling thread holds for this detector (sketches, trackers, tracked keys).
    pub fn local_memory_bytes(&self) -> usize {
        with_local(&self.inner.link, |local| local.heap_bytes()).unwrap_or(0)
    }

    fn control(&self, c: Control) {
        let _ = self.inner.link.tx.send(Msg::Control(c));
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.link.published.closed.store(true, Ordering::Relaxed);
        let _ = self.link.tx.send(Msg::Control(Control::Shutdown));
        if let Ok(mut handle) = self.aggregator.lock() {
            if let Some(h) = handle.take() {
                let _ = h.join();
            }
        }
    }
}
