//! The read cache against a real redis-server: a write made elsewhere (a plain client, not
//! the proxy) reaches the cache as a client-side-caching invalidation within milliseconds,
//! and losing the node flushes the cache and tracking resumes once it is back.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use prometheus_client::registry::Registry;
use saltshaker::backend::tracking::{Filler, Invalidation, Tracker};
use saltshaker::backend::{wire, Backend, ConnHandle};
use saltshaker::config::BackendConfig;
use saltshaker::metrics::Metrics;
use saltshaker::mitigate::cache::{Cache, CacheMetrics, Cause, FillReply};
use saltshaker::resp::Proto;
use saltshaker::rules::CachePolicy;
use support::{need_redis, Redis};
use tokio::sync::mpsc;

type Events = mpsc::UnboundedReceiver<(Instant, Invalidation)>;

struct Rig {
    cache: Arc<Cache>,
    metrics: CacheMetrics,
    tracker: Tracker,
    filler: Filler,
    events: Events,
    _backend: Backend,
}

fn rig(redis: &Redis) -> Rig {
    let cfg = BackendConfig {
        nodes: vec![redis.addr()],
        reconnect_min_ms: 20,
        reconnect_max_ms: 200,
        ..Default::default()
    };
    let backend =
        Backend::new(&cfg, 512 << 20, &Metrics::new(&mut Registry::default())).expect("backend");
    let node = backend.node(0).clone();
    let hs = node.handshake(Proto::Resp2, 0);
    let metrics = CacheMetrics::default();
    let cache = Cache::new(10_000, 64 << 20, metrics.clone());
    let (tx, events) = mpsc::unbounded_channel();
    let c = cache.clone();
    let tracker = Tracker::spawn(&hs, move |inv| {
        match &inv {
            Invalidation::Keys(keys) => keys.iter().for_each(|k| c.invalidate(k, Cause::Tracking)),
            Invalidation::All => c.invalidate_all(Cause::Flush),
        }
        let _ = tx.send((Instant::now(), inv));
    });
    let filler = Filler::spawn(&tracker, &hs, node.metrics.clone(), None);
    Rig {
        cache,
        metrics,
        tracker,
        filler,
        events,
        _backend: backend,
    }
}

async fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn call(conn: ConnHandle, cmd: Bytes) -> FillReply {
    Ok(conn
        .call([cmd].into_iter().collect(), 1, None)
        .await?
        .get(0))
}

/// GET through the cache, filled through the tracked connection.
async fn cached_get(r: &Rig, key: &str) -> FillReply {
    let conn = until("the filler connection", || r.filler.conn()).await;
    let req = wire(&["GET", key]);
    let policy = CachePolicy {
        ttl_ms: 600_000,
        ..Default::default()
    };
    let fill_req = req.clone();
    r.cache
        .get_or_fill(
            &Bytes::from(key.to_string()),
            &req,
            &policy,
            Duration::from_secs(2),
            move || call(conn, fill_req),
        )
        .await
}

async fn next_event(events: &mut Events) -> (Instant, Invalidation) {
    tokio::time::timeout(Duration::from_secs(10), events.recv())
        .await
        .expect("an invalidation in time")
        .expect("tracker alive")
}

fn bulk(s: &str) -> Bytes {
    Bytes::from(format!("${}\r\n{}\r\n", s.len(), s))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_from_elsewhere_invalidate_the_cache_within_milliseconds() {
    need_redis();
    let mut redis = Redis::start();
    let mut r = rig(&redis);
    let mut plain = redis.client();
    let first_id = until("tracking", || r.tracker.client_id()).await;

    plain.cmd(&["SET", "hot", "v0"]);
    let mut delays = Vec::new();
    for i in 1..=200 {
        // A miss fills (and makes Redis track the key); the next read is a hit.
        let before = r.metrics.misses.get();
        assert_eq!(
            cached_get(&r, "hot").await,
            Ok(bulk(&format!("v{}", i - 1)))
        );
        assert_eq!(
            r.metrics.misses.get(),
            before + 1,
            "write {i} was not invalidated"
        );
        assert_eq!(
            cached_get(&r, "hot").await,
            Ok(bulk(&format!("v{}", i - 1)))
        );

        let t0 = Instant::now();
        plain.cmd(&["SET", "hot", &format!("v{i}")]);
        let (at, inv) = next_event(&mut r.events).await;
        assert_eq!(inv, Invalidation::Keys(vec![Bytes::from("hot")]));
        delays.push(at.duration_since(t0));
    }
    delays.sort();
    let pct = |p: usize| delays[(delays.len() * p / 100).min(delays.len() - 1)];
    println!(
        "write -> invalidation callback over {} writes: p50 {:?} p90 {:?} p99 {:?} max {:?}",
        delays.len(),
        pct(50),
        pct(90),
        pct(99),
        delays[delays.len() - 1]
    );
    assert!(pct(50) < Duration::from_millis(100), "p50 {:?}", pct(50));
    assert_eq!(r.metrics.invalidations_tracking.get(), 200);

    // FLUSHALL arrives as a nil payload: everything goes.
    assert_eq!(cached_get(&r, "hot").await, Ok(bulk("v200")));
    plain.cmd(&["FLUSHALL"]);
    assert_eq!(next_event(&mut r.events).await.1, Invalidation::All);
    r.cache.run_pending_tasks();
    assert!(r.cache.is_empty());

    // The fill connection drops (Redis forgets what it tracked): the cache is flushed, and
    // reads through its replacement are tracked again.
    plain.cmd(&["SET", "hot", "v201"]);
    assert_eq!(cached_get(&r, "hot").await, Ok(bulk("v201")));
    let list = plain.cmd(&["CLIENT", "LIST"]).as_str();
    let filler_id = list
        .lines()
        .find(|l| {
            l.split(' ')
                .any(|f| f.starts_with("flags=") && f.contains('t'))
        })
        .and_then(|l| l.strip_prefix("id="))
        .and_then(|l| l.split(' ').next())
        .expect("a tracking client")
        .to_string();
    plain.cmd(&["CLIENT", "KILL", "ID", &filler_id]);
    assert_eq!(next_event(&mut r.events).await.1, Invalidation::All);
    assert_eq!(cached_get(&r, "hot").await, Ok(bulk("v201")));
    plain.cmd(&["SET", "hot", "v202"]);
    let (_, inv) = next_event(&mut r.events).await;
    assert_eq!(inv, Invalidation::Keys(vec![Bytes::from("hot")]));
    assert_eq!(cached_get(&r, "hot").await, Ok(bulk("v202")));

    // The tracker's connection drops while the node lives on: All, then a new tracker id,
    // and the filler is rebuilt to redirect to it (the old one's pushes would go nowhere).
    let old_id = r.tracker.client_id().expect("tracking");
    plain.cmd(&["CLIENT", "KILL", "ID", &old_id.to_string()]);
    assert_eq!(next_event(&mut r.events).await.1, Invalidation::All);
    let new_id = until("a new tracker id", || r.tracker.client_id()).await;
    assert_ne!(new_id, old_id);
    assert_eq!(cached_get(&r, "hot").await, Ok(bulk("v202")));
    plain.cmd(&["SET", "hot", "v203"]);
    let (_, inv) = next_event(&mut r.events).await;
    assert_eq!(inv, Invalidation::Keys(vec![Bytes::from("hot")]));
    assert_eq!(cached_get(&r, "hot").await, Ok(bulk("v203")));

    // The node dies: the tracker reports All, then tracking resumes on a new connection.
    redis.stop();
    assert_eq!(next_event(&mut r.events).await.1, Invalidation::All);
    assert_eq!(r.tracker.client_id(), None);
    assert!(
        r.filler.conn().is_none(),
        "no filling while tracking is down"
    );
    redis.restart();
    let second_id = until("tracking again", || r.tracker.client_id()).await;
    println!("tracker client ids: first {first_id}, after the node restart {second_id}");
    let mut plain = redis.client();
    plain.cmd(&["SET", "hot", "after"]);
    assert_eq!(cached_get(&r, "hot").await, Ok(bulk("after")));
    assert_eq!(cached_get(&r, "hot").await, Ok(bulk("after")));
    plain.cmd(&["SET", "hot", "again"]);
    // After a restart the fill connection may report its own loss late: one more flush of
    // everything (never a stale entry). What must come is the key's invalidation.
    let mut inv = next_event(&mut r.events).await.1;
    for _ in 0..3 {
        if inv != Invalidation::All {
            break;
        }
        inv = next_event(&mut r.events).await.1;
    }
    assert_eq!(inv, Invalidation::Keys(vec![Bytes::from("hot")]));
    assert_eq!(cached_get(&r, "hot").await, Ok(bulk("again")));
}
