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
    if !have_redis() {
        return;
    }
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
    if !have_redis() {
        return;
    }
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
        assert_eq!(c.cmd(&["GET", "profile:1"]).is_error(), false);
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
    if !have_redis() {
        return;
    }
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
