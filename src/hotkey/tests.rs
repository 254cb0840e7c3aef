//! Detector-level tests: windows, early promotion, hysteresis and aggregation, driven by a
//! manual clock so no test sleeps.

use super::*;

fn manual(cfg: DetectorConfig) -> (Detector, ManualClock) {
    let clock = ManualClock::new();
    (
        Detector::with_clock(cfg, Clock::Manual(clock.clone())),
        clock,
    )
}

/// A cheap deterministic stream of background keys.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

fn listed(det: &Detector, key: &[u8]) -> Option<HotKey> {
    det.snapshot().keys.into_iter().find(|k| k.key == key)
}

/// Moves the clock to `ms`, lets this thread close its window and the aggregator catch up.
fn settle(det: &Detector, clock: &ManualClock, ms: u64) {
    clock.set_ms(ms);
    det.flush_local();
    det.sync();
}

#[test]
fn key_jumping_to_ten_times_its_threshold_is_reported_before_the_window_ends() {
    let (det, clock) = manual(DetectorConfig::default());
    let mut bg = Lcg(1);
    let mut reported_at = None;
    // 100k background reads per second over 10k keys, then "viral" at 20k/s (10x) from 1300 ms.
    for t in 0..2000u64 {
        clock.set_ms(t);
        for _ in 0..100 {
            det.observe(format!("bg:{}", bg.next(10_000)).as_bytes(), Kind::Read);
        }
        if t >= 1300 {
            for _ in 0..20 {
                det.observe(b"viral", Kind::Read);
            }
        }
        if t % 5 == 0 {
            det.sync();
            if t < 1300 {
                assert!(
                    det.snapshot().keys.is_empty(),
                    "background reported hot at {t}"
                );
            } else if reported_at.is_none() && listed(&det, b"viral").is_some() {
                reported_at = Some(t);
            }
        }
    }
    let at = reported_at.expect("viral key never reported inside its window");
    assert!(at - 1300 <= 150, "reported after {} ms", at - 1300);
    let hot = listed(&det, b"viral").unwrap();
    assert_eq!(hot.state, HotState::Hot);
    assert_eq!(hot.read_state, Some(HotState::Hot));
    assert!(hot.reads_per_sec >= 2000.0);
}

#[test]
fn a_uniform_stream_reports_nothing() {
    // 1000 keys at 1000/s each: every key at half the threshold, for three windows.
    let (det, clock) = manual(DetectorConfig::default());
    let mut rx = det.subscribe();
    let mut bg = Lcg(7);
    for t in 0..3000u64 {
        clock.set_ms(t);
        for _ in 0..1000 {
            det.observe(format!("k{}", bg.next(1000)).as_bytes(), Kind::Write);
        }
    }
    settle(&det, &clock, 3000);
    let snap = det.snapshot();
    assert!(snap.keys.is_empty(), "{:?}", snap.keys.first());
    assert!((snap.total_writes_per_sec - 1_000_000.0).abs() < 1.0);
    // No snapshot along the way listed anything either.
    assert!(rx.borrow_and_update().keys.is_empty());
}

#[test]
fn several_threads_feeding_one_detector_aggregate_correctly() {
    let cfg = DetectorConfig {
        write_hot_at_per_sec: 1000.0,
        ..DetectorConfig::default()
    };
    let (det, clock) = manual(cfg);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let det = det.clone();
            std::thread::spawn(move || {
                for i in 0..600u64 {
                    det.observe(b"a", Kind::Read);
                    if i % 2 == 0 {
                        det.observe(b"b", Kind::Write);
                    }
                    det.observe(format!("noise:{t}:{i}").as_bytes(), Kind::Read);
                }
            })
        })
        .collect();
    // Joining waits for thread-local destructors, which hand over window 0.
    for t in threads {
        t.join().unwrap();
    }
    settle(&det, &clock, 1000);
    let snap = det.snapshot();
    let a = listed(&det, b"a").expect("a is hot");
    assert_eq!(a.reads_per_sec, 2400.0);
    assert_eq!(a.read_state, Some(HotState::Hot));
    assert_eq!(a.write_state, None);
    let b = listed(&det, b"b").expect("b is hot");
    assert_eq!(b.writes_per_sec, 1200.0);
    assert_eq!(b.write_state, Some(HotState::Hot));
    assert_eq!(snap.total_reads_per_sec, 4800.0);
    assert_eq!(snap.total_writes_per_sec, 1200.0);
    assert!((a.share - 0.5).abs() < 1e-9);
    assert_eq!(snap.keys[0].key, b"a", "hottest first");
}

#[test]
fn a_key_concentrated_on_one_of_several_threads_is_still_promoted_early() {
    let (det, clock) = manual(DetectorConfig::default());
    let barrier = std::sync::Barrier::new(4);
    std::thread::scope(|s| {
        for _ in 0..3 {
            let (det, barrier) = (det.clone(), &barrier);
            s.spawn(move || {
                det.observe(b"quiet", Kind::Read);
                barrier.wait(); // main moves the clock to 1000
                barrier.wait();
                det.flush_local(); // hand over window 0, then stay registered but idle
                barrier.wait();
                barrier.wait(); // main is done
            });
        }
        det.observe(b"quiet", Kind::Read);
        barrier.wait();
        settle(&det, &clock, 1000);
        barrier.wait();
        barrier.wait();
        det.sync(); // window 0 closes with four reporting threads
        clock.set_ms(2000);
        // Only this thread sees the viral key: 20 per ms, 10x the threshold, so it alone must
        // step its reports up to the whole threshold.
        let mut at = None;
        for t in 2000..2300u64 {
            clock.set_ms(t);
            for _ in 0..20 {
                det.observe(b"viral", Kind::Read);
            }
            det.sync();
            if listed(&det, b"viral").is_some() {
                at = Some(t);
                break;
            }
        }
        barrier.wait();
        let at = at.expect("never promoted");
        assert!(at - 2000 <= 150, "promoted after {} ms", at - 2000);
    });
}

#[test]
fn early_promotions_are_published_together() {
    let (det, clock) = manual(DetectorConfig::default());
    det.observe(b"warm-up", Kind::Read);
    settle(&det, &clock, 1000);
    let published = || det.inner.link.published.snapshots.load(Ordering::Relaxed);
    let before = published();
    // 100 keys pass the threshold within the same millisecond: one snapshot, not 100 (each
    // sorts and copies every listed key).
    for i in 0..100 {
        let key = format!("k:{i}");
        for _ in 0..2100 {
            det.observe(key.as_bytes(), Kind::Read);
        }
    }
    det.sync();
    let keys = det.snapshot().keys;
    assert_eq!(keys.len(), 100, "every key promoted early");
    assert!(
        published() - before <= 2,
        "{} snapshots",
        published() - before
    );
}

#[test]
fn with_a_tiny_threshold_only_keys_with_real_counts_report_early() {
    // Read-hot from 2/s (a deep read cache): a key read ten times waits for the window
    // close instead of costing a message per read; a key read a hundred times is still
    // promoted within the window.
    let (det, clock) = manual(DetectorConfig {
        read_hot_at_per_sec: 2.0,
        read_cool_below_per_sec: 0.5,
        ..DetectorConfig::default()
    });
    det.observe(b"warm-up", Kind::Read);
    settle(&det, &clock, 1000);
    clock.set_ms(1100);
    for _ in 0..10 {
        det.observe(b"warm", Kind::Read);
    }
    for _ in 0..100 {
        det.observe(b"busy", Kind::Read);
    }
    det.sync();
    assert!(
        listed(&det, b"warm").is_none(),
        "reported early at 10 reads"
    );
    assert!(listed(&det, b"busy").is_some(), "100 reads promote early");
    settle(&det, &clock, 2000);
    assert!(listed(&det, b"warm").is_some(), "hot at the window close");
}

#[test]
fn a_cooling_key_stays_listed_until_below_cool_below() {
    let (det, clock) = manual(DetectorConfig::default());
    let feed = |n: u64, start: u64| {
        for i in 0..n {
            clock.set_ms(start + i * 1000 / n);
            det.observe(b"k", Kind::Write);
        }
    };
    feed(3000, 0);
    settle(&det, &clock, 1000);
    let hot = listed(&det, b"k").expect("hot after window 0");
    assert_eq!((hot.state, hot.writes_per_sec), (HotState::Hot, 3000.0));
    feed(1000, 1000);
    settle(&det, &clock, 2000);
    let cooling = listed(&det, b"k").expect("still listed while cooling");
    assert_eq!(cooling.state, HotState::Cooling);
    assert_eq!(cooling.writes_per_sec, 1000.0);
    assert_eq!(cooling.since_unix_ms, hot.since_unix_ms);
    feed(100, 2000);
    settle(&det, &clock, 3000);
    assert!(listed(&det, b"k").is_none(), "left below cool_below");
}

#[test]
fn thresholds_change_live_and_per_key_thresholds_apply() {
    struct Vip;
    impl KeyThresholds for Vip {
        fn thresholds(&self, key: &[u8], _: Kind) -> Option<Threshold> {
            key.starts_with(b"vip:").then_some(Threshold {
                hot_at_per_sec: 100.0,
                cool_below_per_sec: 50.0,
            })
        }
        fn lowest_hot_at_per_sec(&self, _: Kind) -> f64 {
            100.0
        }
    }
    let (det, clock) = manual(DetectorConfig::default());
    det.set_key_thresholds(Some(Arc::new(Vip)));
    let window = |w: u64| {
        for i in 0..1500u64 {
            clock.set_ms(w * 1000 + i * 1000 / 1500);
            det.observe(b"plain", Kind::Read);
            if i % 10 == 0 {
                det.observe(b"vip:1", Kind::Read);
                det.observe(b"other", Kind::Read);
            }
        }
        settle(&det, &clock, (w + 1) * 1000);
    };
    window(0);
    assert!(
        listed(&det, b"vip:1").is_some(),
        "150/s beats the vip threshold"
    );
    assert!(listed(&det, b"other").is_none());
    assert!(listed(&det, b"plain").is_none(), "1500/s is below 2000/s");
    let t = Threshold {
        hot_at_per_sec: 1000.0,
        cool_below_per_sec: 500.0,
    };
    let mut all = DetectorConfig::default().thresholds();
    all[0] = t;
    all[1] = t;
    det.set_thresholds(all);
    window(1);
    assert!(listed(&det, b"plain").is_some(), "new threshold applies");
}

#[test]
fn memory_per_thread_stays_bounded_with_ten_million_distinct_keys() {
    let (det, clock) = manual(DetectorConfig {
        top_k: 128,
        ..DetectorConfig::default()
    });
    for i in 0..10_000_000u64 {
        if i % 1_000_000 == 0 {
            clock.set_ms(i / 1000);
        }
        det.observe(&i.to_le_bytes(), Kind::Read);
        det.observe(&i.to_be_bytes(), Kind::Write);
    }
    let bytes = det.local_memory_bytes();
    assert!(bytes <= 1 << 20, "{bytes} bytes");
    assert!(bytes >= 2 * SKETCH_BYTES);
}

#[test]
fn dropping_a_detector_stops_its_aggregator_and_frees_thread_state() {
    let (det, _clock) = manual(DetectorConfig::default());
    det.observe(b"a", Kind::Read);
    drop(det);
    let (det2, _clock2) = manual(DetectorConfig::default());
    det2.observe(b"a", Kind::Read);
    let slots = local::LOCALS.with(|l| l.borrow().len());
    assert_eq!(slots, 1, "the dropped detector's state was purged");
}

#[test]
fn a_big_value_is_hot_by_bytes_early_and_small_keys_of_the_same_bandwidth_are_not() {
    let (det, clock) = manual(DetectorConfig::default());
    let mut bg = Lcg(7);
    let mut reported_at = None;
    // 400 reads a second of a 512 KiB value (200 MiB/s, 12x the 16 MiB/s threshold), and
    // the same bandwidth spread over 50,000 small keys (4 KiB each): 0.5 reads/s per key.
    for t in 0..1000u64 {
        clock.set_ms(1000 + t);
        if t % 5 == 0 {
            for _ in 0..2 {
                det.observe(b"page", Kind::Read);
                det.observe_cost(b"page", Kind::Bytes, 512 * 1024);
            }
            for _ in 0..256 {
                let k = format!("small:{}", bg.next(50_000));
                det.observe(k.as_bytes(), Kind::Read);
                det.observe_cost(k.as_bytes(), Kind::Bytes, 4096);
            }
            det.sync();
            if reported_at.is_none() && listed(&det, b"page").is_some() {
                reported_at = Some(t);
            }
        }
    }
    settle(&det, &clock, 2000);
    let at = reported_at.expect("the big value was reported");
    assert!(at < 200, "reported {at} ms into the load");
    let page = listed(&det, b"page").expect("still listed");
    assert_eq!(page.bytes_state, Some(HotState::Hot));
    assert_eq!(page.read_state, None, "400 reads/s is not hot by count");
    assert_eq!(page.hot_by(), vec!["bytes"]);
    assert_eq!(page.read_hot_state(), Some(HotState::Hot));
    assert!(
        (page.bytes_per_sec - 200.0 * 1024.0 * 1024.0).abs() < 20.0 * 1024.0 * 1024.0,
        "{}",
        page.bytes_per_sec
    );
    let snap = det.snapshot();
    assert_eq!(snap.keys.len(), 1, "{:?}", snap.keys);
}

#[test]
fn an_expensive_read_is_hot_by_node_time() {
    let (det, clock) = manual(DetectorConfig::default());
    for t in 0..1000u64 {
        clock.set_ms(1000 + t);
        if t % 5 == 0 {
            // 200 ZRANGEs a second of 12 ms each: 2400 node-ms a second.
            det.observe(b"board", Kind::Read);
            det.observe_cost(b"board", Kind::NodeUs, 12_000);
            // 200 cheap reads of another key at 5 µs: 1 ms a second.
            det.observe_cost(b"cheap", Kind::NodeUs, 5);
        }
    }
    settle(&det, &clock, 2000);
    let board = listed(&det, b"board").expect("listed");
    assert_eq!(board.node_state, Some(HotState::Hot));
    assert_eq!(board.hot_by(), vec!["node_time"]);
    assert!(
        (board.node_ms_per_sec - 2400.0).abs() < 100.0,
        "{}",
        board.node_ms_per_sec
    );
    assert!(listed(&det, b"cheap").is_none());
}
