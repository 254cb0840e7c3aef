//! The read-hot cache through the proxy: one backend fetch per refresh however many
//! readers, never stale after a write through the proxy, and a write made straight on the
//! node visible through the proxy within milliseconds (Redis tracking).

mod support;

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use support::*;

const RULES: &str = r#"version: 1
rules:
  - match: "celeb:*"
    pin: true
    read: { cache: { ttl_ms: 3000, jitter_pct: 0, stale_while_revalidate_ms: 0 } }
  - match: "profile:*"
    pin: true
    read: { cache: { ttl_ms: 300, jitter_pct: 0, stale_while_revalidate_ms: 0 } }
  - match: "nocache:*"
    pin: true
    read: { cache: { enabled: false } }
  - match: "likes:*"
    pin: true
    read: { cache: { enabled: false } }
    write: { strategy: combine, combine: { window_us: 2000 } }
  - match: "both:*"
    pin: true
    read: { cache: { ttl_ms: 3000, jitter_pct: 0, stale_while_revalidate_ms: 0 } }
    write: { strategy: combine, combine: { window_us: 2000 } }
"#;

fn proxy(nodes: &[&Redis], dir: &TempDir) -> Proxy {
    let path = dir.0.join("rules.yaml");
    std::fs::write(&path, RULES).unwrap();
    Proxy::start(nodes, &["--rules", &path_str(&path)])
}

/// Waits until the proxy's fill connection is tracked (first cached read succeeds as a hit).
fn warm(c: &mut Client, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        c.cmd(&["GET", key]);
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_stampede_of_readers_costs_one_fetch_per_refresh() {
    need_redis();
    let node = Redis::start();
    let dir = TempDir::new("cache-stampede");
    let p = proxy(&[&node], &dir);
    node.client().cmd(&["SET", "celeb:1", "hello"]);
    let mut c = p.client();
    warm(&mut c, "celeb:1");
    // Let the entry expire, then release 64 readers x 50 pipelined GETs at once.
    std::thread::sleep(Duration::from_millis(3100));
    node.client().cmd(&["CONFIG", "RESETSTAT"]);
    let (threads, per) = (64usize, 50usize);
    let start = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (addr, start) = (p.addr(), start.clone());
            thread::spawn(move || {
                let mut c = Client::connect(&addr);
                let cmds: Vec<Vec<&str>> = (0..per).map(|_| vec!["GET", "celeb:1"]).collect();
                start.wait();
                let replies = c.pipeline(&cmds);
                assert!(replies.iter().all(|r| r.as_str() == "hello"), "{replies:?}");
            })
        })
        .collect();
    let t0 = Instant::now();
    for h in handles {
        h.join().unwrap();
    }
    let took = t0.elapsed();
    let fetches = calls(&node, "get");
    // All readers finished inside one TTL, so one refresh: exactly one fetch.
    assert!(
        took < Duration::from_millis(2900),
        "readers took {took:?}, longer than a TTL"
    );
    assert_eq!(
        fetches,
        1,
        "{} readers caused {fetches} backend GETs",
        threads * per
    );
    let (_, m) = p.admin_get("/metrics");
    assert!(m.contains("saltshaker_cache_hits_total"), "{m}");
}

#[test]
fn never_stale_after_own_write_and_fast_after_a_direct_write() {
    need_redis();
    let node = Redis::start();
    let dir = TempDir::new("cache-fresh");
    let p = proxy(&[&node], &dir);
    let mut c = p.client();
    c.cmd(&["SET", "profile:1", "v0"]);
    warm(&mut c, "profile:1");
    // Read-your-write through the proxy, pipelined and not.
    for i in 1..200 {
        let v = format!("v{i}");
        let r = c.pipeline(&[vec!["SET", "profile:1", &v], vec!["GET", "profile:1"]]);
        assert_eq!(r[1].as_str(), v, "pipelined read after own write");
        assert_eq!(
            c.cmd(&["GET", "profile:1"]).as_str(),
            v,
            "read after own write"
        );
    }
    // A write straight on the node: visible through the proxy within 100 ms.
    let mut direct = node.client();
    let mut delays = Vec::new();
    for i in 0..100 {
        let v = format!("direct{i}");
        assert!(!c.cmd(&["GET", "profile:1"]).is_error());
        direct.cmd(&["SET", "profile:1", &v]);
        let t0 = Instant::now();
        loop {
            if c.cmd(&["GET", "profile:1"]).as_str() == v {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_millis(250),
                "direct write not visible after 250 ms"
            );
        }
        delays.push(t0.elapsed());
    }
    delays.sort();
    let pct = |q: f64| delays[((delays.len() as f64 - 1.0) * q) as usize];
    eprintln!(
        "direct write visible through the proxy after: p50 {:?} p99 {:?} max {:?}",
        pct(0.5),
        pct(0.99),
        delays.last().unwrap()
    );
    assert!(pct(0.99) < Duration::from_millis(100));
}

#[test]
fn rules_without_cache_and_resp3_clients_go_to_the_node() {
    need_redis();
    let node = Redis::start();
    let dir = TempDir::new("cache-off");
    let p = proxy(&[&node], &dir);
    node.client().cmd(&["SET", "nocache:1", "x"]);
    node.client().cmd(&["HSET", "profile:h", "a", "1"]);
    let mut c = p.client();
    for _ in 0..20 {
        assert_eq!(c.cmd(&["GET", "nocache:1"]).as_str(), "x");
    }
    assert!(
        calls(&node, "get") >= 20,
        "uncached key must reach the node"
    );
    // A RESP3 client gets RESP3 replies (a map), never a cached RESP2 array.
    let mut c3 = p.client();
    c3.cmd(&["HELLO", "3"]);
    warm(&mut p.client(), "profile:h");
    let r = c3.cmd(&["HGETALL", "profile:h"]);
    assert!(!r.as_map().is_empty(), "{r:?}");
}

fn metric(p: &Proxy, name: &str) -> f64 {
    p.metric(name)
}

/// An MGET's reply as strings, nil as "(nil)".
fn values(r: &Reply) -> Vec<String> {
    r.as_array()
        .iter()
        .map(|v| {
            if v.is_nil() {
                "(nil)".into()
            } else {
                v.as_str()
            }
        })
        .collect()
}

#[test]
fn mget_serves_read_hot_keys_from_the_cache_and_cold_keys_from_their_nodes() {
    need_redis();
    let nodes = pool(2);
    let dir = TempDir::new("cache-mget");
    let p = proxy(&nodes.iter().collect::<Vec<_>>(), &dir);
    let mut c = p.client();
    let cold = spread_keys("plain:", 4);
    for k in cold.iter().chain(
        ["celeb:1", "celeb:2"]
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .iter(),
    ) {
        c.cmd(&["SET", k, &format!("v-{k}")]);
    }
    // A hash under a cached pattern: GET says WRONGTYPE, MGET says nil.
    c.cmd(&["HSET", "celeb:h", "f", "1"]);
    warm(&mut c, "celeb:1");
    let keys = [
        cold[0].as_str(),
        "celeb:1",
        cold[1].as_str(),
        "celeb:2",
        "celeb:missing",
        "celeb:h",
        cold[2].as_str(),
        "celeb:1",
        cold[3].as_str(),
    ];
    let want: Vec<String> = keys
        .iter()
        .map(|k| match *k {
            "celeb:missing" | "celeb:h" => "(nil)".to_string(),
            k => format!("v-{k}"),
        })
        .collect();
    let mut mget = vec!["MGET"];
    mget.extend(keys);
    assert_eq!(values(&c.cmd(&mget)), want, "first MGET (fills)");
    for n in &nodes {
        n.client().cmd(&["CONFIG", "RESETSTAT"]);
    }
    let hits0 = metric(&p, "saltshaker_cache_hits_total");
    let rounds = 50;
    for _ in 0..rounds {
        assert_eq!(values(&c.cmd(&mget)), want);
    }
    // Pipelined with GETs of the same keys, in order.
    let r = c.pipeline(&[
        vec!["GET", "celeb:2"],
        mget.clone(),
        vec!["GET", cold[1].as_str()],
    ]);
    assert_eq!(r[0].as_str(), "v-celeb:2");
    assert_eq!(values(&r[1]), want);
    assert_eq!(r[2].as_str(), format!("v-{}", cold[1]));
    // Per MGET: celeb:1 twice, celeb:2 and celeb:missing are hits; celeb:h (an error reply,
    // never cached) is fetched each time.
    let hits = metric(&p, "saltshaker_cache_hits_total") - hits0;
    assert!(
        hits >= (4 * (rounds + 1) + 1) as f64,
        "{hits} cache hits over {} MGETs",
        rounds + 1
    );
    let gets: i64 = nodes.iter().map(|n| calls(n, "get")).sum();
    let mgets: i64 = nodes.iter().map(|n| calls(n, "mget")).sum();
    // Only celeb:h reaches a node as a GET (once per MGET), the other read-hot keys none.
    assert!(
        (rounds as i64 + 1..=rounds as i64 + 3).contains(&gets),
        "read-hot keys reached the nodes as {gets} GETs"
    );
    // The cold keys still go to their nodes, one MGET per node holding any.
    assert!(mgets >= rounds as i64, "cold keys fetched by {mgets} MGETs");
}

#[test]
fn mget_sees_a_write_to_a_read_hot_key_at_once() {
    need_redis();
    let nodes = pool(2);
    let dir = TempDir::new("cache-mget-ryw");
    let p = proxy(&nodes.iter().collect::<Vec<_>>(), &dir);
    let mut c = p.client();
    let mut other = p.client();
    let cold = spread_keys("plain:", 2);
    c.cmd(&["SET", &cold[0], "a"]);
    c.cmd(&["SET", &cold[1], "b"]);
    c.cmd(&["SET", "celeb:1", "v0"]);
    warm(&mut c, "celeb:1");
    let hits0 = metric(&p, "saltshaker_cache_hits_total");
    for i in 1..100 {
        // Own write, pipelined with the read.
        let v = format!("v{i}");
        let r = c.pipeline(&[
            vec!["SET", "celeb:1", &v],
            vec!["MGET", &cold[0], "celeb:1", &cold[1]],
        ]);
        assert_eq!(
            values(&r[1]),
            ["a", v.as_str(), "b"],
            "pipelined MGET after own write"
        );
        // Own write, then the read.
        let v = format!("w{i}");
        c.cmd(&["SET", "celeb:1", &v]);
        let r = c.cmd(&["MGET", "celeb:1", &cold[0]]);
        assert_eq!(values(&r), [v.as_str(), "a"], "MGET after own write");
        // Another client's write through the proxy, answered before this read.
        let v = format!("x{i}");
        other.cmd(&["SET", "celeb:1", &v]);
        assert_eq!(
            values(&c.cmd(&["MGET", "celeb:1", &cold[1]])),
            [v.as_str(), "b"]
        );
        // And read again: now from the cache.
        assert_eq!(
            values(&c.cmd(&["MGET", "celeb:1", &cold[1]])),
            [v.as_str(), "b"]
        );
    }
    assert!(
        metric(&p, "saltshaker_cache_hits_total") - hits0 >= 50.0,
        "repeated MGETs of the unchanged key were not served from the cache"
    );
}

/// A session that combines increments of one key still reads other read-hot keys from the
/// cache, and a read of a key it is combining waits for its own increment. (A write of a
/// key that is itself cached, as `both:1`, sends the round's later cached reads to the
/// node: `RoundBuilder::wrote_cached`.)
#[test]
fn combined_increments_hold_back_cached_reads_of_their_own_key_only() {
    need_redis();
    let node = Redis::start();
    let dir = TempDir::new("cache-combine");
    let p = proxy(&[&node], &dir);
    node.client().cmd(&["SET", "celeb:2", "star"]);
    node.client().cmd(&["SET", "both:1", "0"]);
    let mut c = p.client();
    warm(&mut c, "both:1");
    warm(&mut c, "celeb:2");
    let gets = calls(&node, "get");
    let hits = metric(&p, "saltshaker_cache_hits_total");
    for i in 1..=50i64 {
        let r = c.pipeline(&[
            vec!["INCR", "likes:1"],
            vec!["GET", "celeb:2"],
            vec!["INCR", "both:1"],
            vec!["GET", "both:1"],
        ]);
        assert_eq!(r[0].as_int(), i, "{r:?}");
        assert_eq!(r[1].as_str(), "star", "{r:?}");
        assert_eq!(r[2].as_int(), i, "{r:?}");
        assert_eq!(
            r[3].as_str(),
            i.to_string(),
            "a read missed its own combined INCR: {r:?}"
        );
    }
    let node_gets = calls(&node, "get") - gets;
    let hit = metric(&p, "saltshaker_cache_hits_total") - hits;
    // celeb:2 from the cache (but for a refill if its entry expires); both:1 from its node
    // (its own write is pending).
    assert!(hit >= 45.0, "{hit} cache hits for 50 reads of celeb:2");
    assert!(node_gets <= 60, "{node_gets} GETs reached the node");
}

/// A key written about as often as it is read is not cached: every write would drop its
/// entries and the next read fill them again, so the node would serve the write, the fill
/// and the tracking invalidation where it served one read. `/hotkeys` says why,
/// `saltshaker_cache_declined_total` counts it, and its reads reach the node. A key that is
/// only read, as hot, is cached, with exact replies throughout.
#[test]
fn a_key_written_as_often_as_it_is_read_is_not_cached_and_hotkeys_says_why() {
    need_redis();
    let node = Redis::start();
    let dir = TempDir::new("cache-pays");
    let path = dir.0.join("rules.yaml");
    std::fs::write(
        &path,
        "version: 1\ndefaults:\n  read: { hot_at_per_sec: 300, cool_below_per_sec: 100, cache: { ttl_ms: 10000 } }\n  write: { hot_at_per_sec: 1000000, cool_below_per_sec: 500000 }\n",
    )
    .unwrap();
    let p = Proxy::start(&[&node], &["--rules", &path_str(&path)]);
    let mut c = p.client();
    assert_eq!(c.cmd(&["SET", "churn", "0"]), Reply::ok());
    assert_eq!(c.cmd(&["SET", "steady", "s"]), Reply::ok());
    // At least 4 s, and until both were seen (at most 12 s): a round that writes a cached
    // key sends its later reads to the node (read-your-writes), so while churn is still
    // cached, in its first windows, steady's reads in the same rounds are not hits. With
    // 4 s only, 4 runs in 8 of the previous build failed so on a quiet machine.
    let start = Instant::now();
    let mut n = 0u64;
    let mut churn_seen = None;
    let mut steady_seen = false;
    while start.elapsed() < Duration::from_secs(4)
        || (start.elapsed() < Duration::from_secs(12) && !(churn_seen.is_some() && steady_seen))
    {
        // 100 reads and 100 writes of `churn`, 100 reads of `steady`, per round.
        let mut cmds: Vec<Vec<String>> = Vec::new();
        for i in 0..100 {
            n += 1;
            cmds.push(vec!["SET".into(), "churn".into(), n.to_string()]);
            cmds.push(vec!["GET".into(), "churn".into()]);
            cmds.push(vec!["GET".into(), "steady".into()]);
            let _ = i;
        }
        let r = c.pipeline(&cmds);
        // Exact: each GET sees the SET just before it.
        assert_eq!(r[r.len() - 2], Reply::bulk(&n.to_string()));
        assert_eq!(r[r.len() - 1], Reply::bulk("s"));
        let hk = p.hotkeys();
        let keys = hk["keys"].as_array().cloned().unwrap_or_default();
        if let Some(e) = keys.iter().find(|e| e["key"] == "churn") {
            if e["not_cached"].is_string() {
                churn_seen = Some(e.clone());
            }
        }
        if let Some(e) = keys.iter().find(|e| e["key"] == "steady") {
            assert!(e["not_cached"].is_null(), "a key only read is cached: {e}");
            // Once cached for a whole window, its ledger shows what it saved the node.
            let saved = &e["ledger"]["cache"]["saved"];
            if saved["commands"].as_u64().unwrap_or(0) > 0 {
                assert!(saved["bytes"].as_u64().unwrap() > 0, "{e}");
                steady_seen = true;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let e = churn_seen.expect("/hotkeys never said why churn is not cached");
    assert!(
        e["not_cached"]
            .as_str()
            .unwrap()
            .starts_with("writes would turn"),
        "{e}"
    );
    assert!(p.metric("saltshaker_cache_declined_total") >= 1.0);
    assert!(
        steady_seen,
        "steady was never listed read-hot with its cache's savings"
    );
    // Now the node serves every read of churn, and the cache serves steady's. One read of
    // steady first: a pipeline sent at once, landing just after its entry was refreshed
    // away, would wait on one fill (not counted as hits) for all 200 reads; once, under
    // load, the test saw 0 hits so.
    assert_eq!(c.cmd(&["GET", "steady"]), Reply::bulk("s"));
    let gets = |r: &Redis| calls(r, "get");
    // Served by the cache: hits, and reads that waited on another's fill (a pipeline
    // landing on an entry just dropped waits on one fill for all its reads).
    let served = |p: &Proxy| {
        p.metric("saltshaker_cache_hits_total") + p.metric("saltshaker_cache_coalesced_total")
    };
    // The same mix as before (a key's writes go on as they did). Tried up to five times, a
    // window apart: one CI run saw none of steady's 200 reads served by the cache in one
    // such pipeline, after /hotkeys had shown its savings (the cause is not pinned down;
    // a round that writes a cached key sends its later reads to the node, which would do
    // it while churn is cached again for a window). A cache that never serves steady fails.
    let mut cmds: Vec<Vec<&str>> = Vec::new();
    for _ in 0..200 {
        cmds.push(vec!["SET", "churn", "x"]);
        cmds.push(vec!["GET", "churn"]);
        cmds.push(vec!["GET", "steady"]);
    }
    let (mut to_node, mut hits) = (0, 0.0);
    for _ in 0..5 {
        let (before, hits_before) = (gets(&node), served(&p));
        c.pipeline(&cmds);
        to_node = gets(&node) - before;
        hits = served(&p) - hits_before;
        if hits >= 150.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(1000));
    }
    assert!(
        to_node >= 200,
        "churn's reads reach the node: {to_node} GETs"
    );
    assert!(
        hits >= 150.0,
        "steady's reads are cache hits: {hits}\n{}",
        p.admin_get("/metrics")
            .1
            .lines()
            .filter(|l| l.starts_with("saltshaker_cache"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// A cache proves that it pays, from what it measured, not only from the rates the proxy
/// sees: a key whose writes go straight to the node (another service, a script) looks
/// read-only to the proxy, so it is cached; each of those writes drops its entry (Redis
/// tracking) and the next read fills it again. Once its fills are a third of its cached
/// reads, it is declined, `/hotkeys` says so with the window's figures, and its reads reach
/// the node, with replies that follow the node's value.
#[test]
fn a_cache_whose_fills_outweigh_its_hits_is_withdrawn_on_what_it_measured() {
    need_redis();
    let node = Redis::start();
    let dir = TempDir::new("cache-measured");
    let path = dir.0.join("rules.yaml");
    std::fs::write(
        &path,
        "version: 1\ndefaults:\n  read: { hot_at_per_sec: 200, cool_below_per_sec: 50, cache: { ttl_ms: 10000, jitter_pct: 0 } }\n",
    )
    .unwrap();
    let p = Proxy::start(&[&node], &["--rules", &path_str(&path)]);
    let mut c = p.client();
    let mut direct = node.client();
    assert_eq!(direct.cmd(&["SET", "elsewhere", "0"]), Reply::ok());
    let end = Instant::now() + Duration::from_secs(8);
    let mut seen = None;
    let mut n = 0u64;
    while Instant::now() < end && seen.is_none() {
        for _ in 0..100 {
            // A write on the node, then two reads through the proxy: at most one of them
            // can be a hit, so fills are at least a third of the cached reads.
            n += 1;
            assert_eq!(
                direct.cmd(&["SET", "elsewhere", &n.to_string()]),
                Reply::ok()
            );
            c.cmd(&["GET", "elsewhere"]);
            c.cmd(&["GET", "elsewhere"]);
        }
        let hk = p.hotkeys();
        let keys = hk["keys"].as_array().cloned().unwrap_or_default();
        if let Some(e) = keys.iter().find(|e| e["key"] == "elsewhere") {
            if e["not_cached"].is_string() {
                seen = Some(e.clone());
            }
        }
    }
    let e = seen.expect("/hotkeys never said why `elsewhere` is not cached any more");
    assert!(
        e["not_cached"]
            .as_str()
            .unwrap()
            .ends_with("of its cached reads were fills in the last window"),
        "declined on its measure, not its rates (the proxy sees no writes): {e}"
    );
    assert_eq!(e["writes_per_sec"].as_f64(), Some(0.0), "{e}");
    let cost = &e["ledger"]["cache"]["cost"];
    assert!(cost["fills"].as_u64().unwrap_or(0) >= 16, "{e}");
    assert!(p.metric("saltshaker_cache_declined_total") >= 1.0);
    // Declined: every read reaches the node and sees its value.
    let gets = calls(&node, "get");
    for i in 0..50 {
        let v = format!("after-{i}");
        assert_eq!(direct.cmd(&["SET", "elsewhere", &v]), Reply::ok());
        assert_eq!(c.cmd(&["GET", "elsewhere"]), Reply::bulk(&v));
    }
    assert!(calls(&node, "get") - gets >= 50);
}
