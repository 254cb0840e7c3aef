//! Eviction by node time saved per byte: what stays when the cache is full.

use std::time::Duration;

use bytes::Bytes;

use super::*;

fn policy(ttl_ms: u64) -> CachePolicy {
    CachePolicy {
        enabled: true,
        ttl_ms,
        jitter_pct: 0,
        stale_while_revalidate_ms: 0,
    }
}

const WAIT: Duration = Duration::from_secs(5);

/// A reply that starts with `*` stands for an aggregate the node takes 5 ms to build.
fn costly_if_aggregate(reply: &[u8]) -> u64 {
    if reply.first() == Some(&b'*') {
        5000
    } else {
        1
    }
}

/// Fills (key, reply) and reads it `reads` more times.
async fn read(cache: &Arc<Cache>, key: &str, reply: &Bytes, reads: usize) {
    let k = Bytes::from(key.to_string());
    let req = Bytes::from(format!("GET {key}"));
    for _ in 0..=reads {
        let r = reply.clone();
        let got = cache
            .get_or_fill(
                &k,
                &req,
                &policy(60_000),
                WAIT,
                move || async move { Ok(r) },
            )
            .await;
        assert!(got.is_ok());
    }
}

fn cached(cache: &Cache, key: &str) -> bool {
    cache
        .get_fresh(key.as_bytes(), format!("GET {key}").as_bytes())
        .is_some()
}

/// One 4 KB costly reply, then 200 cheap 1 KB replies read as often, through 64 KB.
async fn pressure(cache: &Arc<Cache>) {
    let mut big = vec![b'x'; 4000];
    big[0] = b'*';
    read(cache, "leaderboard", &Bytes::from(big), 3).await;
    let small = Bytes::from(vec![b'y'; 1000]);
    for i in 0..200 {
        read(cache, &format!("page:{i}"), &small, 3).await;
    }
}

#[tokio::test]
async fn a_costly_reply_outlives_cheap_ones_read_as_often() {
    let m = CacheMetrics::default();
    let cache = Cache::with_cost(1_000_000, 64 * 1024, m.clone(), costly_if_aggregate);
    pressure(&cache).await;
    assert!(m.evictions.get() > 100, "{}", m.evictions.get());
    assert!(cache.inner.store.used() <= 64 * 1024);
    // Its hits saved 3 x 5 ms, the cheap ones' at most 600 x 1 us (a cheap reply evicted
    // before its next read is fetched again).
    let saved = m.node_seconds_saved.get();
    assert!((0.015..=0.0156 + 1e-9).contains(&saved), "{saved}");
    assert!(
        cached(&cache, "leaderboard"),
        "the costly reply was evicted"
    );
}

#[tokio::test]
async fn counted_by_hits_alone_the_bigger_reply_goes_first() {
    // The same reads with every reply costing the same: the 4 KB reply saves least per
    // byte, and is evicted. This is what the cost changes.
    let m = CacheMetrics::default();
    let cache = Cache::new(1_000_000, 64 * 1024, m.clone());
    pressure(&cache).await;
    assert!(!cached(&cache, "leaderboard"), "the big reply stayed");
    assert!(cached(&cache, "page:199"));
}

#[tokio::test]
async fn a_reply_read_more_stays_among_replies_of_one_cost() {
    let m = CacheMetrics::default();
    let cache = Cache::new(1_000_000, 64 * 1024, m.clone());
    let small = Bytes::from(vec![b'y'; 1000]);
    read(&cache, "front", &small, 50).await;
    for i in 0..200 {
        read(&cache, &format!("page:{i}"), &small, 1).await;
    }
    assert!(cached(&cache, "front"));
    assert_eq!(m.entries.get(), cache.inner.store.live());
    assert!(m.bytes.get() as u64 <= 64 * 1024);
}

#[tokio::test]
async fn an_expired_bucket_goes_before_a_live_one() {
    let m = CacheMetrics::default();
    // 64 KB, so that a reply may take 8 KB.
    let cache = Cache::with_cost(1_000_000, 64 * 1024, m.clone(), costly_if_aggregate);
    let k = Bytes::from_static(b"brief");
    let req = Bytes::from_static(b"GET brief");
    let mut agg = vec![b'z'; 6000];
    agg[0] = b'*';
    let r = Bytes::from(agg);
    cache
        .get_or_fill(&k, &req, &policy(30), WAIT, move || async move { Ok(r) })
        .await
        .expect("fill");
    let small = Bytes::from(vec![b'y'; 1000]);
    for i in 0..50 {
        read(&cache, &format!("kept:{i}"), &small, 0).await;
    }
    tokio::time::sleep(Duration::from_millis(60)).await;
    // Over the bound: the expired (costly) bucket goes, not a live cheap one.
    assert_eq!(m.evictions.get(), 0);
    read(&cache, "more", &Bytes::from(vec![b'y'; 7000]), 0).await;
    assert!((0..50).all(|i| cached(&cache, &format!("kept:{i}"))));
    assert!(cached(&cache, "more"));
    assert_eq!(m.evictions.get(), 1);
}
