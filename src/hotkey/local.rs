//! Per-thread detector state: a sketch and a top-k per kind, the thread's view of the window,
//! and what it hands to the aggregator. Nothing here is shared, so the request path takes no
//! lock and does no atomic read-modify-write; the only synchronisation is a channel send once
//! per window and when a tracked key's sliding count passes its next report level.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Sender, SyncSender};
use std::sync::Arc;

use super::clock::CoarseClock;
use super::sketch::{hash_key, CountMin, KeyHash, SKETCH_BYTES};
use super::topk::{Offer, TopK};
use super::{KeyThresholds, Kind, Threshold, KINDS};

/// What threads send the aggregator.
pub(crate) enum Msg {
    /// A thread's first observation falls in `window`.
    Register {
        thread: u64,
        window: u64,
    },
    /// The thread's counts for one window; sent when the thread first sees the window over,
    /// or when it exits (`last`).
    Window {
        thread: u64,
        window: u64,
        totals: [u64; KINDS],
        keys: Vec<(Kind, Box<[u8]>, u32)>,
        /// The window the thread moved on to (windows in between were idle).
        next: u64,
        last: bool,
    },
    /// A tracked key's sliding count (occurrences over one window length) passed a report
    /// level mid-window.
    Early {
        thread: u64,
        kind: Kind,
        key: Box<[u8]>,
        sliding: f64,
        at_ms: u64,
    },
    Control(Control),
}

/// What the detector's handle tells the aggregator, through the threads' channel.
pub(crate) enum Control {
    Thresholds([Threshold; KINDS]),
    KeyThresholds(Option<Arc<dyn KeyThresholds>>),
    /// Replies once every message sent before it is handled and due windows are closed.
    Sync(SyncSender<()>),
    Shutdown,
}

/// State the aggregator publishes for the threads and they read once per window.
#[derive(Debug, Default)]
pub(crate) struct Published {
    /// Per kind: the sliding count at which a key first earns an early report.
    pub first_report: [AtomicU32; KINDS],
    pub closed: AtomicBool,
    /// Snapshots published so far.
    pub snapshots: AtomicU64,
    /// Keys to track on the read side from the next window, when above `top_k` (0: none):
    /// deeper while node balance needs the read rates of warm keys.
    pub read_depth: AtomicUsize,
}

/// Everything a thread needs to reach one detector.
#[derive(Clone)]
pub(crate) struct Link {
    pub id: u64,
    pub tx: Sender<Msg>,
    pub clock: CoarseClock,
    pub window_ms: u64,
    pub top_k: usize,
    pub published: Arc<Published>,
}

struct Side {
    /// Made at the first observation: a thread that never sees a costly read holds no
    /// sketch for the cost kinds.
    sketch: Option<CountMin>,
    top: TopK,
    total: u64,
}

/// One thread's state for one detector.
pub(crate) struct Local {
    link: Link,
    thread: u64,
    window: u64,
    window_start_ms: u64,
    window_end_ms: u64,
    sides: [Side; KINDS],
    early_budget: u32,
    /// The last observation: its cells were prefetched and are counted at the next one
    /// (or when the thread hands its window over), so the sketch's cache misses overlap
    /// with the proxy's work on one command instead of stalling it.
    deferred: Option<(Kind, KeyHash)>,
    deferred_key: Vec<u8>,
    spare_key: Vec<u8>,
}

/// Longer keys are counted at once: copying them would cost more than the miss.
const MAX_DEFERRED_KEY: usize = 256;

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

impl Local {
    pub(crate) fn new(link: Link) -> Self {
        let thread = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
        let now = link.clock.now_ms();
        let window = now / link.window_ms;
        let _ = link.tx.send(Msg::Register { thread, window });
        let side = |k: usize| {
            let mut top = TopK::new(link.top_k);
            top.set_first_report(
                link.published.first_report[k]
                    .load(Ordering::Relaxed)
                    .max(1),
            );
            Side {
                // The request counts are used at once; the costs maybe never.
                sketch: (k < 2).then(CountMin::new),
                top,
                total: 0,
            }
        };
        Local {
            thread,
            window,
            window_start_ms: window * link.window_ms,
            window_end_ms: (window + 1) * link.window_ms,
            sides: [side(0), side(1), side(2), side(3)],
            early_budget: early_budget(link.top_k),
            deferred: None,
            deferred_key: Vec::with_capacity(64),
            spare_key: Vec::with_capacity(64),
            link,
        }
    }

    #[inline]
    pub(crate) fn observe(&mut self, key: &[u8], kind: Kind) {
        let now = self.link.clock.now_ms();
        if now >= self.window_end_ms {
            self.settle(now);
            self.roll(now);
        }
        let h = hash_key(key);
        let side = &mut self.sides[kind as usize];
        side.total += 1;
        if key.len() > MAX_DEFERRED_KEY {
            self.count(key, kind, h, now, 1);
            return;
        }
        if let Some(sketch) = &side.sketch {
            sketch.prefetch(h.mixed);
        }
        let mut key_buf = std::mem::take(&mut self.spare_key);
        key_buf.clear();
        key_buf.extend_from_slice(key);
        let prev_key = std::mem::replace(&mut self.deferred_key, key_buf);
        if let Some((prev_kind, prev_h)) = self.deferred.replace((kind, h)) {
            self.count(&prev_key, prev_kind, prev_h, now, 1);
        }
        self.spare_key = prev_key;
    }

    /// Counts one weighted observation (a read's bytes or node time) at once.
    pub(crate) fn observe_weighted(&mut self, key: &[u8], kind: Kind, weight: u64) {
        let now = self.link.clock.now_ms();
        if now >= self.window_end_ms {
            self.settle(now);
            self.roll(now);
        }
        let w = weight.div_ceil(kind.unit()).clamp(1, u32::MAX as u64) as u32;
        let h = hash_key(key);
        let side = &mut self.sides[kind as usize];
        side.total = side.total.saturating_add(u64::from(w));
        self.count(key, kind, h, now, w);
    }

    /// Counts the deferred observation, if any.
    pub(crate) fn settle(&mut self, now: u64) {
        if let Some((kind, h)) = self.deferred.take() {
            let key = std::mem::take(&mut self.deferred_key);
            self.count(&key, kind, h, now, 1);
            self.deferred_key = key;
        }
    }

    /// Counts one observation of weight `w` in the sketch and the top-k (its total is
    /// counted already).
    #[inline]
    fn count(&mut self, key: &[u8], kind: Kind, h: KeyHash, now: u64, w: u32) {
        let side = &mut self.sides[kind as usize];
        let sketch = side.sketch.get_or_insert_with(CountMin::new);
        let estimate = sketch.add_weighted(h.mixed, w);
        let Offer::Tracked(i) = side.top.offer(h.hash, key, estimate) else {
            return;
        };
        // The sliding count never exceeds the estimate: most hits stop at the gate.
        if estimate >= side.top.entries()[i].gate {
            self.maybe_report(kind, i, now);
        }
    }

    /// A tracked key's estimate reached its gate: report it if its sliding count really
    /// passed the next level, else raise the gate.
    #[inline(never)]
    fn maybe_report(&mut self, kind: Kind, i: usize, now: u64) {
        let f = (now - self.window_start_ms) as f64 / self.link.window_ms as f64;
        let first = self.link.published.first_report[kind as usize].load(Ordering::Relaxed);
        let entry = self.sides[kind as usize].top.entry_mut(i);
        let sliding = entry.sliding_count(f);
        if self.early_budget == 0 {
            entry.gate = u32::MAX;
            return;
        }
        if sliding < entry.next_report as f64 {
            // sliding = estimate - f * base passes the level only once the estimate passes
            // level + f * base, and f only grows inside a window.
            let gate = entry.next_report as f64 + f * entry.base as f64;
            entry.gate = gate.ceil().min(u32::MAX as f64) as u32;
            return;
        }
        // Linear steps while small, then 1/8 steps: bounded messages, bounded lag.
        let step = (first / 2).max((sliding / 8.0) as u32).max(1);
        entry.next_report = (sliding as u32).saturating_add(step);
        entry.gate = entry.next_report;
        self.early_budget -= 1;
        let _ = self.link.tx.send(Msg::Early {
            thread: self.thread,
            kind,
            key: entry.key.as_slice().into(),
            sliding,
            at_ms: now,
        });
    }

    /// Counts the deferred observation, and rolls to the window holding `now` if the
    /// current one is over.
    pub(crate) fn roll_if_due(&mut self) {
        let now = self.link.clock.now_ms();
        self.settle(now);
        if now >= self.window_end_ms {
            self.roll(now);
        }
    }

    #[cold]
    #[inline(never)]
    fn roll(&mut self, now: u64) {
        let window = now / self.link.window_ms;
        self.send_window(window, false);
        let elapsed = window.saturating_sub(self.window).max(1);
        for (k, side) in self.sides.iter_mut().enumerate() {
            let first = self.link.published.first_report[k].load(Ordering::Relaxed);
            if let Some(sketch) = &mut side.sketch {
                sketch.halve(elapsed);
            }
            side.top.roll(elapsed, first.max(1));
            side.total = 0;
        }
        let depth = self
            .link
            .top_k
            .max(self.link.published.read_depth.load(Ordering::Relaxed));
        if self.sides[0].top.cap() != depth {
            self.sides[0].top.resize(depth);
        }
        self.window = window;
        self.window_start_ms = window * self.link.window_ms;
        self.window_end_ms = self.window_start_ms + self.link.window_ms;
        self.early_budget = early_budget(self.link.top_k);
    }

    fn send_window(&self, next: u64, last: bool) {
        let mut keys = Vec::new();
        for (kind, side) in Kind::ALL.into_iter().zip(&self.sides) {
            for e in side.top.entries() {
                let n = e.window_count();
                if n > 0 {
                    keys.push((kind, e.key.as_slice().into(), n));
                }
            }
        }
        let _ = self.link.tx.send(Msg::Window {
            thread: self.thread,
            window: self.window,
            totals: self.sides.each_ref().map(|s| s.total),
            keys,
            next,
            last,
        });
    }

    /// Bytes this thread holds for the detector: sketches, trackers and their keys.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.sides
            .iter()
            .map(|s| if s.sketch.is_some() { SKETCH_BYTES } else { 0 } + s.top.heap_bytes())
            .sum::<usize>()
            + std::mem::size_of::<Self>()
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        // A thread that exits hands over what it counted in its last window.
        if !self.link.published.closed.load(Ordering::Relaxed) {
            let now = self.link.clock.now_ms().min(self.window_end_ms - 1);
            self.settle(now);
            self.send_window(self.window + 1, true);
        }
    }
}

fn early_budget(top_k: usize) -> u32 {
    (top_k as u32).saturating_mul(16)
}

thread_local! {
    /// One slot per live detector this thread has fed; usually exactly one.
    pub(super) static LOCALS: RefCell<Vec<(u64, Box<Local>)>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` on this thread's state for the detector behind `link`, creating it on first use.
/// Does nothing while the thread is being torn down.
#[inline]
pub(crate) fn with_local<R>(link: &Link, f: impl FnOnce(&mut Local) -> R) -> Option<R> {
    LOCALS
        .try_with(|cell| {
            let mut slots = cell.try_borrow_mut().ok()?;
            let i = match slots.iter().position(|(id, _)| *id == link.id) {
                Some(i) => i,
                None => first_use(&mut slots, link),
            };
            slots.get_mut(i).map(|(_, local)| f(local))
        })
        .ok()
        .flatten()
}

/// Runs `f` on this thread's state for the detector behind `link` if the thread has any.
pub(crate) fn with_existing(link: &Link, f: impl FnOnce(&mut Local)) {
    let _ = LOCALS.try_with(|cell| {
        if let Ok(mut slots) = cell.try_borrow_mut() {
            if let Some((_, local)) = slots.iter_mut().find(|(id, _)| *id == link.id) {
                f(local);
            }
        }
    });
}

/// Creates this thread's state for `link` and forgets that of detectors since dropped.
#[cold]
#[inline(never)]
fn first_use(slots: &mut Vec<(u64, Box<Local>)>, link: &Link) -> usize {
    slots.retain(|(_, l)| !l.link.published.closed.load(Ordering::Relaxed));
    slots.push((link.id, Box::new(Local::new(link.clone()))));
    slots.len() - 1
}
