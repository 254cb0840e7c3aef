//! Tests of the read cache: single-flight, errors, jitter, versioning, stale-while-revalidate, bounds.
//! Real (short) time: the crate's tokio has no `test-util`, so time cannot be paused.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::Notify;

use super::*;

fn policy(ttl_ms: u64, jitter_pct: u32, swr_ms: u64) -> CachePolicy {
    CachePolicy {
        enabled: true,
        ttl_ms,
        jitter_pct,
        stale_while_revalidate_ms: swr_ms,
    }
}

fn bulk(s: &str) -> Bytes {
    Bytes::from(format!("${}\r\n{}\r\n", s.len(), s))
}

const WAIT: Duration = Duration::from_secs(5);

/// A fill that counts its calls, takes `delay`, and answers `reply`.
fn counted(
    calls: &Arc<AtomicUsize>,
    delay: Duration,
    reply: FillReply,
) -> impl FnOnce() -> std::pin::Pin<Box<dyn Future<Output = FillReply> + Send>> + Send + 'static {
    let calls = calls.clone();
    move || {
        calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            reply
        })
    }
}

async fn burst(
    cache: &Arc<Cache>,
    n: usize,
    p: CachePolicy,
    calls: &Arc<AtomicUsize>,
    delay: Duration,
    reply: FillReply,
) -> Vec<FillReply> {
    let key = Bytes::from_static(b"hot");
    let req = Bytes::from_static(b"*2\r\n$3\r\nGET\r\n$3\r\nhot\r\n");
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let (cache, key, req) = (cache.clone(), key.clone(), req.clone());
        let fill = counted(calls, delay, reply.clone());
        tasks.push(tokio::spawn(async move {
            cache.get_or_fill(&key, &req, &p, WAIT, fill).await
        }));
    }
    let mut out = Vec::with_capacity(n);
    for t in tasks {
        out.push(t.await.expect("task"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_concurrent_callers_cause_one_fill_per_refresh() {
    let m = CacheMetrics::default();
    let cache = Cache::new(1000, 1 << 20, m.clone());
    let calls = Arc::new(AtomicUsize::new(0));
    let p = policy(1000, 0, 0);
    let d = Duration::from_millis(30);
    let out = burst(&cache, 3000, p, &calls, d, Ok(bulk("v1"))).await;
    assert!(out.iter().all(|r| r.as_deref() == Ok(&bulk("v1")[..])));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(m.misses.get(), 1);
    assert_eq!(m.hits.get() + m.coalesced.get() + m.misses.get(), 3000);

    // Cached: no fill at all.
    let out = burst(&cache, 1000, p, &calls, d, Ok(bulk("v2"))).await;
    assert!(out.iter().all(|r| r.as_deref() == Ok(&bulk("v1")[..])));
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Expired: exactly one more fill for the next burst.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let out = burst(&cache, 3000, p, &calls, d, Ok(bulk("v2"))).await;
    assert!(out.iter().all(|r| r.as_deref() == Ok(&bulk("v2")[..])));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_failing_fill_wakes_every_waiter_with_its_error_and_caches_nothing() {
    let cache = Cache::new(1000, 1 << 20, CacheMetrics::default());
    let calls = Arc::new(AtomicUsize::new(0));
    let p = policy(10_000, 0, 0);
    let d = Duration::from_millis(20);
    let down = FillError::Node(crate::backend::BackendError::Closed("127.0.0.1:1".into()));
    let out = burst(&cache, 500, p, &calls, d, Err(down)).await;
    let said = |r: &FillReply| r.as_ref().map_err(ToString::to_string).err();
    assert!(out
        .iter()
        .all(|r| said(r).as_deref() == Some("backend 127.0.0.1:1 connection closed")));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert!(cache.is_empty());

    // An error reply is a successful fetch, shared by the waiters, but not stored.
    let err = Bytes::from_static(b"-WRONGTYPE Operation against a key\r\n");
    let out = burst(&cache, 500, p, &calls, d, Ok(err.clone())).await;
    assert!(out.iter().all(|r| r.as_ref() == Ok(&err)));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(cache.is_empty());

    let out = burst(&cache, 10, p, &calls, d, Ok(bulk("ok"))).await;
    assert!(out.iter().all(|r| r.as_deref() == Ok(&bulk("ok")[..])));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert!(!cache.is_empty());
}

#[test]
fn jitter_spreads_ttls_uniformly_over_plus_minus_jitter() {
    let cache = Cache::new(10, 1 << 20, CacheMetrics::default());
    let p = policy(1000, 20, 0);
    let mut hist = [0usize; 10]; // 40 ms bins over 800..1200 ms
    let (mut lo, mut hi) = (u128::MAX, 0u128);
    for _ in 0..10_000 {
        let t = cache.inner.ttl(&p).as_micros();
        lo = lo.min(t);
        hi = hi.max(t);
        assert!((800_000..=1_200_000).contains(&t), "{t}");
        hist[((t - 800_000) / 40_000).min(9) as usize] += 1;
    }
    assert!(lo < 805_000 && hi > 1_195_000, "spread {lo}..{hi}");
    for (i, n) in hist.iter().enumerate() {
        assert!((850..=1150).contains(n), "bin {i}: {n} of 10000 ({hist:?})");
    }
    let none = policy(1000, 0, 0);
    assert_eq!(cache.inner.ttl(&none), Duration::from_millis(1000));
}

/// Fills `n` keys with `p` one after another; returns each key and when its fill started.
async fn fill_many(cache: &Arc<Cache>, n: usize, p: CachePolicy) -> Vec<(Bytes, Instant)> {
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let key = Bytes::from(format!("k{i}"));
        let req = Bytes::from(format!("GET k{i}"));
        let t0 = Instant::now();
        cache
            .get_or_fill(&key, &req, &p, WAIT, || async { Ok(bulk("v")) })
            .await
            .expect("fill");
        out.push((key, t0));
    }
    out
}

/// The TTL a stored entry got: from the start of its fill to its `fresh_until`.
fn stored_ttl(cache: &Cache, key: &Bytes, filled: Instant) -> Duration {
    let b = cache.inner.store.get(key).expect("stored");
    b.entries[0].fresh_until - filled
}

#[tokio::test]
async fn stored_entries_get_ttls_within_jitter_spread_over_the_range() {
    let cache = Cache::new(10_000, 64 << 20, CacheMetrics::default());
    let filled = fill_many(&cache, 2000, policy(1000, 20, 0)).await;
    let mut bins = [0usize; 10]; // 40 ms bins over 800..1200 ms
    for (key, t0) in &filled {
        let ms = stored_ttl(&cache, key, *t0).as_secs_f64() * 1000.0;
        // The fill itself takes a little: the stored TTL starts a few ms after t0 at most.
        assert!((800.0..=1205.0).contains(&ms), "{ms} ms");
        bins[(((ms - 800.0) / 40.0) as usize).min(9)] += 1;
    }
    // Uniform: 200 per bin expected; no bin empty or holding a crowd.
    assert!(
        bins.iter().all(|&n| (100..=300).contains(&n)),
        "TTLs not spread over +/-20%: {bins:?}"
    );
}

/// `cargo test --lib jitter_histogram -- --ignored --nocapture`: fills 2000 keys back to
/// back with `ttl_ms: 1000, jitter_pct: 20` and watches when each one actually stops being
/// served fresh, printing the histogram of those expiries (and of the TTLs drawn).
#[tokio::test]
#[ignore]
async fn jitter_histogram() {
    let n = 2000;
    let cache = Cache::new(10_000, 64 << 20, CacheMetrics::default());
    let filled = fill_many(&cache, n, policy(1000, 20, 0)).await;
    let drawn: Vec<f64> = filled
        .iter()
        .map(|(k, t0)| stored_ttl(&cache, k, *t0).as_secs_f64() * 1000.0)
        .collect();
    let mut pending: Vec<usize> = (0..n).collect();
    let mut expired = vec![0f64; n];
    let mut sweep_max = Duration::ZERO;
    while !pending.is_empty() {
        let s0 = Instant::now();
        pending.retain(|&i| {
            let (key, t0) = &filled[i];
            let req = format!("GET k{i}");
            if cache.inner.lookup(key, req.as_bytes()).is_fresh() {
                return true;
            }
            expired[i] = t0.elapsed().as_secs_f64() * 1000.0;
            false
        });
        sweep_max = sweep_max.max(s0.elapsed());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let fill_span = filled[n - 1].1 - filled[0].1;
    println!(
        "{n} entries, ttl_ms 1000, jitter_pct 20, filled over {fill_span:?}; expiry seen within \
         one sweep (2 ms sleep + at most {sweep_max:?})"
    );
    for (name, v) in [
        ("TTL drawn (stored fresh_until - fill start)", &drawn),
        (
            "observed expiry (first lookup not fresh - fill start)",
            &expired,
        ),
    ] {
        println!("\n{name}:");
        print!("{}", histogram(v, 760.0, 1240.0, 40.0));
    }
}

/// A text histogram of `v` (ms) in `step` bins from `lo` to `hi`, one `#` per 1% of values.
fn histogram(v: &[f64], lo: f64, hi: f64, step: f64) -> String {
    let bins = ((hi - lo) / step) as usize;
    let mut counts = vec![0usize; bins];
    for &x in v {
        let i = ((x - lo) / step).floor().clamp(0.0, (bins - 1) as f64) as usize;
        counts[i] += 1;
    }
    let (min, max) = v
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), &x| (a.min(x), b.max(x)));
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let mut out = format!("  min {min:.1} ms, mean {mean:.1} ms, max {max:.1} ms\n");
    for (i, c) in counts.iter().enumerate() {
        let from = lo + i as f64 * step;
        let bar = "#".repeat(c * 100 / v.len());
        out += &format!("  {from:>6.0}-{:<6.0} ms {c:>5}  {bar}\n", from + step);
    }
    out
}

#[tokio::test]
async fn a_fill_overtaken_by_invalidate_answers_its_callers_but_is_not_stored() {
    let cache = Cache::new(1000, 1 << 20, CacheMetrics::default());
    let p = policy(10_000, 0, 0);
    let key = Bytes::from_static(b"k");
    let req = Bytes::from_static(b"GET k");
    let release = Arc::new(Notify::new());
    let started = Arc::new(Notify::new());
    let fill = {
        let (release, started) = (release.clone(), started.clone());
        move || async move {
            started.notify_one();
            release.notified().await;
            Ok(bulk("old"))
        }
    };
    let first = {
        let (cache, key, req) = (cache.clone(), key.clone(), req.clone());
        tokio::spawn(async move { cache.get_or_fill(&key, &req, &p, WAIT, fill).await })
    };
    started.notified().await;
    assert!(
        !cache.is_empty(),
        "a fill in flight must make writes invalidate"
    );
    cache.invalidate(&key, Cause::Write);

    // A caller after the write must not join the old fill.
    let calls = Arc::new(AtomicUsize::new(0));
    let second = cache
        .get_or_fill(
            &key,
            &req,
            &p,
            WAIT,
            counted(&calls, Duration::ZERO, Ok(bulk("new"))),
        )
        .await;
    assert_eq!(second, Ok(bulk("new")));
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    release.notify_one();
    assert_eq!(first.await.expect("task"), Ok(bulk("old")));
    // The old reply was not stored over the new one.
    let third = cache
        .get_or_fill(
            &key,
            &req,
            &p,
            WAIT,
            counted(&calls, Duration::ZERO, Ok(bulk("x"))),
        )
        .await;
    assert_eq!(third, Ok(bulk("new")));
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    cache.invalidate(&key, Cause::Tracking);
    let fourth = cache
        .get_or_fill(
            &key,
            &req,
            &p,
            WAIT,
            counted(&calls, Duration::ZERO, Ok(bulk("y"))),
        )
        .await;
    assert_eq!(fourth, Ok(bulk("y")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_entry_is_served_stale_while_exactly_one_refresh_runs() {
    let m = CacheMetrics::default();
    let cache = Cache::new(1000, 1 << 20, m.clone());
    let calls = Arc::new(AtomicUsize::new(0));
    let p = policy(200, 0, 10_000);
    burst(&cache, 1, p, &calls, Duration::ZERO, Ok(bulk("v1"))).await;
    tokio::time::sleep(Duration::from_millis(250)).await;

    // The refresh takes a second; every caller meanwhile gets v1 at once.
    let t0 = std::time::Instant::now();
    let out = burst(
        &cache,
        2000,
        p,
        &calls,
        Duration::from_millis(1000),
        Ok(bulk("v2")),
    )
    .await;
    assert!(
        t0.elapsed() < Duration::from_millis(800),
        "{:?}",
        t0.elapsed()
    );
    assert!(out.iter().all(|r| r.as_deref() == Ok(&bulk("v1")[..])));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(m.stale_served.get(), 2000);

    // Once the refresh lands (fresh for 200 ms), it is what callers get, with no fill.
    let req = b"*2\r\n$3\r\nGET\r\n$3\r\nhot\r\n";
    while !matches!(cache.inner.lookup(b"hot", req), Lookup::Fresh(_)) {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let out = burst(&cache, 10, p, &calls, Duration::ZERO, Ok(bulk("v3"))).await;
    assert!(out.iter().all(|r| r.as_deref() == Ok(&bulk("v2")[..])));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

async fn fill_keys(cache: &Arc<Cache>, n: usize, reply_len: usize) {
    let p = policy(60_000, 0, 0);
    let reply = Bytes::from(vec![b'x'; reply_len]);
    for i in 0..n {
        let key = Bytes::from(format!("key:{i}"));
        let req = Bytes::from(format!("GET key:{i}"));
        let r = reply.clone();
        let got = cache
            .get_or_fill(&key, &req, &p, WAIT, move || async move { Ok(r) })
            .await;
        assert!(got.is_ok());
    }
    cache.run_pending_tasks();
}

#[tokio::test]
async fn entries_and_bytes_are_bounded() {
    let m = CacheMetrics::default();
    let cache = Cache::new(100, 1 << 20, m.clone());
    fill_keys(&cache, 2000, 10).await;
    assert!(cache.inner.store.live() <= 100);
    assert!(m.entries.get() <= 100, "{}", m.entries.get());
    assert!(m.entries.get() > 0);

    let m = CacheMetrics::default();
    let cache = Cache::new(1_000_000, 64 * 1024, m.clone());
    fill_keys(&cache, 2000, 1000).await;
    assert!(m.bytes.get() <= 64 * 1024, "{}", m.bytes.get());
    assert!(m.bytes.get() > 0);
    assert_eq!(m.bytes.get() as u64, {
        cache
            .inner
            .store
            .buckets()
            .iter()
            .map(|(_, b)| b)
            .sum::<u64>()
    });

    cache.invalidate_all(Cause::Flush);
    cache.run_pending_tasks();
    assert_eq!(m.bytes.get(), 0);
    assert_eq!(m.entries.get(), 0);
    assert!(cache.is_empty());
}

#[tokio::test]
async fn invalidate_drops_every_command_of_the_key_only() {
    let m = CacheMetrics::default();
    let cache = Cache::new(1000, 1 << 20, m.clone());
    let p = policy(60_000, 0, 0);
    let calls = Arc::new(AtomicUsize::new(0));
    for (k, r) in [("h", "HGET h a"), ("h", "HGET h b"), ("other", "GET other")] {
        let (k, r) = (Bytes::from(k), Bytes::from(r));
        let f = counted(
            &calls,
            Duration::ZERO,
            Ok(bulk(r.len().to_string().as_str())),
        );
        cache.get_or_fill(&k, &r, &p, WAIT, f).await.expect("fill");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    cache.invalidate(b"h", Cause::Write);
    assert_eq!(m.invalidations_write.get(), 1);
    cache.invalidate(b"h", Cause::Write); // nothing left: not counted
    assert_eq!(m.invalidations_write.get(), 1);
    for (k, r) in [("h", "HGET h a"), ("h", "HGET h b"), ("other", "GET other")] {
        let (k, r) = (Bytes::from(k), Bytes::from(r));
        let f = counted(&calls, Duration::ZERO, Ok(bulk("z")));
        cache.get_or_fill(&k, &r, &p, WAIT, f).await.expect("fill");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 5);

    cache.invalidate_matching(|k| k == b"other", Cause::Tracking);
    assert_eq!(m.invalidations_tracking.get(), 1);
    assert!(cache.inner.lookup(b"other", b"GET other").is_miss());
    assert!(!cache.inner.lookup(b"h", b"HGET h a").is_miss());
}

#[tokio::test]
async fn a_waiter_that_times_out_fetches_for_itself() {
    let m = CacheMetrics::default();
    let cache = Cache::new(1000, 1 << 20, m.clone());
    let p = policy(60_000, 0, 0);
    let calls = Arc::new(AtomicUsize::new(0));
    let slow = {
        let (cache, calls) = (cache.clone(), calls.clone());
        tokio::spawn(async move {
            let f = counted(&calls, Duration::from_millis(500), Ok(bulk("slow")));
            cache
                .get_or_fill(&Bytes::from("k"), &Bytes::from("GET k"), &p, WAIT, f)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    let f = counted(&calls, Duration::ZERO, Ok(bulk("own")));
    let got = cache
        .get_or_fill(
            &Bytes::from("k"),
            &Bytes::from("GET k"),
            &p,
            Duration::from_millis(30),
            f,
        )
        .await;
    assert_eq!(got, Ok(bulk("own")));
    assert_eq!(m.wait_timeouts.get(), 1);
    assert_eq!(slow.await.expect("task"), Ok(bulk("slow")));
}

#[tokio::test]
async fn a_disabled_policy_always_fetches() {
    let cache = Cache::new(1000, 1 << 20, CacheMetrics::default());
    let mut p = policy(60_000, 0, 0);
    p.enabled = false;
    let calls = Arc::new(AtomicUsize::new(0));
    for _ in 0..3 {
        let f = counted(&calls, Duration::ZERO, Ok(bulk("v")));
        cache
            .get_or_fill(&Bytes::from("k"), &Bytes::from("GET k"), &p, WAIT, f)
            .await
            .expect("fill");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert!(cache.is_empty());
}

impl Lookup {
    fn is_miss(&self) -> bool {
        matches!(self, Lookup::Miss)
    }

    fn is_fresh(&self) -> bool {
        matches!(self, Lookup::Fresh(_))
    }
}

/// `cargo test --release --lib hit_path_cost -- --ignored --nocapture`: the cost of a hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn hit_path_cost() {
    let cache = Cache::new(10_000, 64 << 20, CacheMetrics::default());
    let p = policy(600_000, 0, 0);
    let key = Bytes::from_static(b"user:1000:profile");
    let req = Bytes::from_static(b"*2\r\n$3\r\nGET\r\n$17\r\nuser:1000:profile\r\n");
    let v = Bytes::from(vec![b'x'; 200]);
    cache
        .get_or_fill(&key, &req, &p, WAIT, move || async move { Ok(v) })
        .await
        .expect("fill");
    for threads in [1usize, 2] {
        let n = 1_000_000;
        let t0 = std::time::Instant::now();
        let tasks: Vec<_> = (0..threads)
            .map(|_| {
                let (cache, key, req) = (cache.clone(), key.clone(), req.clone());
                tokio::spawn(async move {
                    for _ in 0..n {
                        let r = cache
                            .get_or_fill(&key, &req, &p, WAIT, || async {
                                Err(FillError::Lost("miss"))
                            })
                            .await;
                        assert!(r.is_ok());
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
        let per = t0.elapsed() / (n * threads) as u32;
        println!("{threads} thread(s) hitting one key: {per:?} per hit (wall / hits)");
    }
}

#[tokio::test]
async fn each_key_tallies_what_its_cache_saved_and_cost() {
    let cache = Cache::new(1000, 1 << 20, CacheMetrics::default());
    let calls = Arc::new(AtomicUsize::new(0));
    let p = policy(60_000, 0, 0);
    let reply = bulk("value");
    // One fill, then 9 hits: 10 reads, 9 the node never saw.
    for _ in 0..10 {
        let r = burst(&cache, 1, p, &calls, Duration::ZERO, Ok(reply.clone())).await;
        assert_eq!(r[0].as_ref().ok(), Some(&reply));
    }
    // A write drops the entry; the next read fills it again.
    cache.invalidate(b"hot", Cause::Write);
    burst(&cache, 1, p, &calls, Duration::ZERO, Ok(reply.clone())).await;
    let t = cache.take_tallies();
    assert_eq!(t.len(), 1);
    let (key, f) = &t[0];
    assert_eq!(&key[..], b"hot");
    assert_eq!((f.hits, f.fills, f.invalidations), (9, 2, 1));
    assert_eq!(f.hit_bytes, 9 * reply.len() as u64);
    // Taken: the next window starts from nothing, and a cached key is not forgotten.
    assert!(cache.take_tallies().is_empty());
    burst(&cache, 1, p, &calls, Duration::ZERO, Ok(reply.clone())).await;
    assert_eq!(cache.take_tallies()[0].1.hits, 1);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}
