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
    reply: Result<Bytes, String>,
) -> impl FnOnce() -> std::pin::Pin<Box<dyn Future<Output = Result<Bytes, String>> + Send>>
       + Send
       + 'static {
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
    reply: Result<Bytes, String>,
) -> Vec<Result<Bytes, String>> {
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
    let out = burst(&cache, 500, p, &calls, d, Err("backend down".into())).await;
    assert!(out.iter().all(|r| r == &Err("backend down".to_string())));
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
    assert!(cache.inner.store.entry_count() <= 100);
    assert!(m.entries.get() <= 100, "{}", m.entries.get());
    assert!(m.entries.get() > 0);

    let m = CacheMetrics::default();
    let cache = Cache::new(1_000_000, 64 * 1024, m.clone());
    fill_keys(&cache, 2000, 1000).await;
    assert!(m.bytes.get() <= 64 * 1024, "{}", m.bytes.get());
    assert!(m.bytes.get() > 0);
    assert_eq!(m.bytes.get() as u64, {
        cache.inner.store.iter().map(|(_, b)| b.bytes).sum::<u64>()
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
                            .get_or_fill(&key, &req, &p, WAIT, || async { Err("miss".into()) })
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
