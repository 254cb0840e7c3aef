//! The aggregator: one thread per detector that sums the threads' window counts, decides which
//! keys are hot or cooling (with hysteresis and per-key thresholds), promotes a key the moment
//! the threads' early reports add up to its threshold, and publishes snapshots. It also keeps
//! the coarse clock ticking. It never touches a thread's sketch.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::clock::{CoarseClock, COARSE_TICK_MS};
use super::local::{Control, Msg, Published};
use super::{HotKey, HotSnapshot, HotState, KeyThresholds, Kind, Threshold, KINDS};

/// (thread, sliding count, thread's time in ms) of the latest early report per thread.
type EarlyReport = (u64, f64, u64);

#[derive(Default)]
struct WindowAcc {
    totals: [u64; KINDS],
    keys: HashMap<(Kind, Box<[u8]>), u64>,
    reporters: HashSet<u64>,
}

#[derive(Clone, Copy, Debug)]
struct Status {
    state: HotState,
    since_ms: u64,
    share: f64,
    /// The window in which the key was last promoted. A key promoted early in window w+1
    /// (before window w closed) is not judged on window w.
    promoted_window: u64,
}

#[derive(Default)]
struct Listed {
    /// Per kind, in its natural unit per second (requests, bytes, node microseconds).
    rates: [f64; KINDS],
    kinds: [Option<Status>; KINDS],
}

pub(crate) struct Aggregator {
    pub window_ms: u64,
    pub clock: CoarseClock,
    pub published: Arc<Published>,
    pub snapshots: watch::Sender<Arc<HotSnapshot>>,
    pub defaults: [Threshold; KINDS],
    pub per_key: Option<Arc<dyn KeyThresholds>>,
    /// Registered threads and the first window each has not reported yet.
    threads: HashMap<u64, u64>,
    pending: BTreeMap<u64, WindowAcc>,
    /// The oldest window not closed yet.
    next_window: u64,
    listed: HashMap<Box<[u8]>, Listed>,
    early: HashMap<(Kind, Box<[u8]>), Vec<EarlyReport>>,
    totals_per_sec: [f64; KINDS],
    /// Read rates of the last closed window, hottest first.
    read_rates: Arc<Vec<(Box<[u8]>, f64)>>,
    /// An early promotion is waiting to be published.
    dirty: bool,
    last_publish_ms: u64,
}

/// Early promotions are published together, at most this often (plus at every window close
/// and every `sync`). A snapshot sorts and copies every listed key, and with thousands of
/// read-hot keys (a deep Zipf tail) publishing one per promotion took a third of the
/// proxy's CPU.
const EARLY_PUBLISH_MS: u64 = 20;

/// Keys a thread has seen fewer times than this in a window are left to the window close.
/// Early reports exist so a key far above its threshold is mitigated within the window; with
/// a threshold of a few reads per second (a deep read cache) every tracked key would
/// otherwise report at 1, 2, 3, ... reads, one channel message each, which cost the proxy
/// over half its throughput with 8192 keys tracked.
const MIN_FIRST_REPORT: u32 = 16;

impl Aggregator {
    pub(crate) fn new(
        window_ms: u64,
        clock: CoarseClock,
        published: Arc<Published>,
        snapshots: watch::Sender<Arc<HotSnapshot>>,
        defaults: [Threshold; KINDS],
    ) -> Self {
        let agg = Aggregator {
            window_ms,
            clock,
            published,
            snapshots,
            defaults,
            per_key: None,
            threads: HashMap::new(),
            pending: BTreeMap::new(),
            next_window: 0,
            listed: HashMap::new(),
            early: HashMap::new(),
            totals_per_sec: [0.0; KINDS],
            read_rates: Arc::default(),
            dirty: false,
            last_publish_ms: 0,
        };
        agg.publish_triggers(1);
        agg
    }

    pub(crate) fn run(mut self, rx: Receiver<Msg>) {
        let mut replies = Vec::new();
        loop {
            let first = match rx.recv_timeout(Duration::from_millis(COARSE_TICK_MS)) {
                Ok(msg) => Some(msg),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            // Read the time first, then drain the queue: every message a thread sent before
            // the clock reached `now` is handled before any window is closed at `now`.
            let now = self.clock.refresh();
            for msg in first
                .into_iter()
                .chain(std::iter::from_fn(|| rx.try_recv().ok()))
            {
                match msg {
                    Msg::Control(Control::Shutdown) => return,
                    Msg::Control(Control::Sync(reply)) => replies.push(reply),
                    msg => self.handle(msg, now),
                }
            }
            // A caller of sync() may have moved the clock after `now` was read; everything it
            // sent before its Sync was handled above, so its time is safe to use.
            let now = if replies.is_empty() {
                now
            } else {
                self.clock.refresh()
            };
            self.close_due_windows(now);
            if self.dirty && (!replies.is_empty() || now >= self.last_publish_ms + EARLY_PUBLISH_MS)
            {
                self.publish_snapshot(now);
            }
            for reply in replies.drain(..) {
                let _ = reply.send(());
            }
        }
    }

    fn window_secs(&self) -> f64 {
        self.window_ms as f64 / 1000.0
    }

    fn threshold(&self, key: &[u8], kind: Kind) -> Threshold {
        self.per_key
            .as_ref()
            .and_then(|p| p.thresholds(key, kind))
            .unwrap_or(self.defaults[kind as usize])
    }

    fn handle(&mut self, msg: Msg, now: u64) {
        match msg {
            Msg::Register { thread, window } => {
                self.threads.insert(thread, window);
            }
            Msg::Window {
                thread,
                window,
                totals,
                keys,
                next,
                last,
            } => {
                // A thread hands its window over at its next observation, so a thread that
                // went quiet reports after the window closed. Counts at most two windows late
                // go into the oldest open window rather than being lost (a bursty client on
                // several threads was otherwise seen at a fraction of its rate); older ones
                // would only distort the current rate.
                let target = if window >= self.next_window {
                    Some(window)
                } else if window + 2 >= self.next_window {
                    Some(self.next_window)
                } else {
                    None
                };
                if let Some(window) = target {
                    let acc = self.pending.entry(window).or_default();
                    for (acc, t) in acc.totals.iter_mut().zip(totals) {
                        *acc += t;
                    }
                    acc.reporters.insert(thread);
                    for (kind, key, n) in keys {
                        *acc.keys.entry((kind, key)).or_default() += u64::from(n);
                    }
                }
                if last {
                    self.threads.remove(&thread);
                } else if let Some(done) = self.threads.get_mut(&thread) {
                    *done = (*done).max(next);
                }
            }
            Msg::Early {
                thread,
                kind,
                key,
                sliding,
                at_ms,
            } => self.early_report(thread, kind, key, sliding, at_ms, now),
            Msg::Control(Control::Thresholds(t)) => {
                self.defaults = t;
                self.publish_triggers(self.active_threads());
            }
            Msg::Control(Control::KeyThresholds(p)) => {
                self.per_key = p;
                self.publish_triggers(self.active_threads());
            }
            Msg::Control(Control::Sync(_) | Control::Shutdown) => {}
        }
    }

    fn early_report(
        &mut self,
        thread: u64,
        kind: Kind,
        key: Box<[u8]>,
        sliding: f64,
        at_ms: u64,
        now: u64,
    ) {
        let already_hot = self
            .listed
            .get(&key)
            .and_then(|l| l.kinds[kind as usize])
            .is_some_and(|s| s.state == HotState::Hot);
        if already_hot {
            return;
        }
        let th = self.threshold(&key, kind);
        let window_ms = self.window_ms;
        let reports = self.early.entry((kind, key.clone())).or_default();
        reports.retain(|&(t, _, at)| t != thread && at + window_ms > now);
        reports.push((thread, sliding, at_ms));
        let sum: f64 = reports.iter().map(|r| r.1).sum::<f64>() * kind.unit() as f64;
        if sum < th.hot_at_per_sec * self.window_secs() {
            return;
        }
        self.early.remove(&(kind, key.clone()));
        let rate = sum / self.window_secs();
        let total = self.totals_per_sec[kind as usize].max(rate);
        let listed = self.listed.entry(key).or_default();
        listed.rates[kind as usize] = rate;
        // The thread's time, not ours: this thread may run behind the clock.
        let since_ms = listed.kinds[kind as usize].map_or(at_ms, |s| s.since_ms);
        listed.kinds[kind as usize] = Some(Status {
            state: HotState::Hot,
            since_ms,
            share: rate / total,
            promoted_window: at_ms / window_ms,
        });
        self.dirty = true;
    }

    fn close_due_windows(&mut self, now: u64) {
        let grace = (self.window_ms / 10).max(2 * COARSE_TICK_MS);
        loop {
            let w = self.next_window;
            let end = (w + 1) * self.window_ms;
            if now < end {
                return;
            }
            let all_in = self.threads.values().all(|&done| done > w);
            if !all_in && now < end + grace {
                return;
            }
            self.close_window(w, now);
            self.next_window = w + 1;
            // Skip runs of windows nobody reported once nothing is listed any more.
            if self.listed.is_empty() {
                let first_pending = self.pending.keys().next().copied();
                let current = now / self.window_ms;
                let skip_to = first_pending.map_or(current, |p| p.min(current));
                self.next_window = self.next_window.max(skip_to);
            }
        }
    }

    fn close_window(&mut self, w: u64, now: u64) {
        let acc = self.pending.remove(&w).unwrap_or_default();
        let secs = self.window_secs();
        self.totals_per_sec = Kind::ALL.map(|k| (acc.totals[k as usize] * k.unit()) as f64 / secs);
        let mut rates: HashMap<Box<[u8]>, [f64; KINDS]> = HashMap::new();
        for ((kind, key), n) in acc.keys {
            rates.entry(key).or_default()[kind as usize] = (n * kind.unit()) as f64 / secs;
        }
        // What a key's reads weigh on its node: one unit per read, plus the node
        // microseconds of its costly reads (the unit node balance counts a node's load in).
        let mut reads: Vec<(Box<[u8]>, f64)> = rates
            .iter()
            .map(|(k, r)| (k, r[Kind::Read as usize] + r[Kind::NodeUs as usize]))
            .filter(|(_, w)| *w > 0.0)
            .map(|(k, w)| (k.clone(), w))
            .collect();
        reads.sort_unstable_by(|a, b| b.1.total_cmp(&a.1));
        reads.truncate(super::MAX_READ_RATES);
        self.read_rates = Arc::new(reads);
        for key in self.listed.keys() {
            rates.entry(key.clone()).or_default();
        }
        for (key, r) in rates {
            let mut next = Listed {
                rates: r,
                kinds: [None; KINDS],
            };
            let prev = self.listed.get(&key);
            for kind in Kind::ALL {
                let k = kind as usize;
                let before = prev.and_then(|l| l.kinds[k]);
                let th = self.threshold(&key, kind);
                let share = r[k] / self.totals_per_sec[k].max(r[k]).max(f64::MIN_POSITIVE);
                next.kinds[k] = match before {
                    _ if r[k] >= th.hot_at_per_sec => Some(Status {
                        state: HotState::Hot,
                        since_ms: before.map_or(now, |s| s.since_ms),
                        share,
                        promoted_window: before.map_or(w, |s| s.promoted_window),
                    }),
                    Some(s) if s.state == HotState::Hot && s.promoted_window > w => {
                        // Promoted early after this window ended: judge it on its next one.
                        next.rates[k] = r[k].max(prev.map_or(0.0, |l| l.rates[k]));
                        Some(s)
                    }
                    Some(s) if r[k] >= th.cool_below_per_sec => Some(Status {
                        state: HotState::Cooling,
                        share,
                        ..s
                    }),
                    _ => None,
                };
            }
            if next.kinds.iter().any(Option::is_some) {
                self.listed.insert(key, next);
            } else {
                self.listed.remove(&key);
            }
        }
        let window_ms = self.window_ms;
        self.early.retain(|_, reports| {
            reports.retain(|r| r.2 + window_ms > now);
            !reports.is_empty()
        });
        self.publish_triggers(acc.reporters.len());
        self.publish_snapshot(now);
    }

    fn active_threads(&self) -> usize {
        self.threads.len()
    }

    /// The sliding count at which a thread first reports a key early: half of this thread's
    /// even share of the lowest hot threshold any key can have, and at least
    /// `MIN_FIRST_REPORT`.
    fn publish_triggers(&self, threads: usize) {
        for kind in Kind::ALL {
            let mut lowest = self.defaults[kind as usize].hot_at_per_sec;
            if let Some(p) = &self.per_key {
                lowest = lowest.min(p.lowest_hot_at_per_sec(kind));
            }
            let lowest = lowest / kind.unit() as f64;
            let per_thread = lowest * self.window_secs() / threads.max(1) as f64 / 2.0;
            let level = per_thread.clamp(MIN_FIRST_REPORT as f64, u32::MAX as f64) as u32;
            self.published.first_report[kind as usize].store(level, Ordering::Relaxed);
        }
    }

    fn publish_snapshot(&mut self, now: u64) {
        self.dirty = false;
        self.last_publish_ms = now;
        self.published.snapshots.fetch_add(1, Ordering::Relaxed);
        let mut keys: Vec<HotKey> = self
            .listed
            .iter()
            .map(|(key, l)| {
                let states = l.kinds.map(|s| s.map(|s| s.state));
                let [read, write, bytes, node] = states;
                let listed = l.kinds.iter().flatten();
                HotKey {
                    key: key.to_vec(),
                    reads_per_sec: l.rates[0],
                    writes_per_sec: l.rates[1],
                    bytes_per_sec: l.rates[2],
                    node_ms_per_sec: l.rates[3] / 1000.0,
                    share: listed.clone().map(|s| s.share).fold(0.0, f64::max),
                    state: if states.contains(&Some(HotState::Hot)) {
                        HotState::Hot
                    } else {
                        HotState::Cooling
                    },
                    since_unix_ms: self
                        .clock
                        .unix_ms(listed.map(|s| s.since_ms).min().unwrap_or(now)),
                    read_state: read,
                    write_state: write,
                    bytes_state: bytes,
                    node_state: node,
                }
            })
            .collect();
        keys.sort_by(|a, b| {
            let heat = |k: &HotKey| k.reads_per_sec.max(k.writes_per_sec);
            heat(b).total_cmp(&heat(a)).then_with(|| a.key.cmp(&b.key))
        });
        self.snapshots.send_replace(Arc::new(HotSnapshot {
            window_ms: self.window_ms,
            keys,
            total_reads_per_sec: self.totals_per_sec[0],
            total_writes_per_sec: self.totals_per_sec[1],
            at_unix_ms: self.clock.unix_ms(now),
            read_rates: self.read_rates.clone(),
        }));
    }
}
