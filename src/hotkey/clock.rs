//! The detector's coarse clock: milliseconds since the detector started, read on the request
//! path with one relaxed atomic load, and a manual variant so tests step through windows
//! instead of sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Where a detector takes its time from.
#[derive(Clone, Debug, Default)]
pub enum Clock {
    /// Real time. The aggregator thread refreshes a shared millisecond counter every
    /// [`COARSE_TICK_MS`], so `observe` never calls into the OS for the time.
    #[default]
    System,
    /// Time moves only when the owner of the [`ManualClock`] says so.
    Manual(ManualClock),
}

/// How often the aggregator refreshes the coarse clock. Detection latency goals are in
/// hundreds of milliseconds, so a few milliseconds of staleness are invisible.
pub const COARSE_TICK_MS: u64 = 2;

/// A clock that tests and benchmarks advance by hand.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now_ms: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::Relaxed)
    }

    pub fn advance_ms(&self, ms: u64) {
        // Release: what this thread sent the detector before moving time is seen first.
        self.now_ms.fetch_add(ms, Ordering::Release);
    }

    /// Moves the clock to `ms`; a clock never goes back, so an earlier value is ignored.
    pub fn set_ms(&self, ms: u64) {
        self.now_ms.fetch_max(ms, Ordering::Release);
    }
}

/// The clock as the detector's threads see it: a shared counter of milliseconds since start.
#[derive(Clone, Debug)]
pub(crate) struct CoarseClock {
    now_ms: Arc<AtomicU64>,
    /// Real time drives the counter from the aggregator; `None` when a test owns it.
    started: Option<Instant>,
    start_unix_ms: u64,
}

impl CoarseClock {
    pub(crate) fn new(clock: &Clock) -> Self {
        let start_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        match clock {
            Clock::System => CoarseClock {
                now_ms: Arc::new(AtomicU64::new(0)),
                started: Some(Instant::now()),
                start_unix_ms,
            },
            Clock::Manual(manual) => CoarseClock {
                now_ms: manual.now_ms.clone(),
                started: None,
                start_unix_ms,
            },
        }
    }

    #[inline]
    pub(crate) fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::Relaxed)
    }

    /// Called by the aggregator only; a no-op for a manual clock.
    pub(crate) fn refresh(&self) -> u64 {
        if let Some(started) = self.started {
            let ms = started.elapsed().as_millis() as u64;
            self.now_ms.fetch_max(ms, Ordering::Relaxed);
        }
        self.now_ms.load(Ordering::Acquire)
    }

    pub(crate) fn unix_ms(&self, now_ms: u64) -> u64 {
        self.start_unix_ms.saturating_add(now_ms)
    }
}
