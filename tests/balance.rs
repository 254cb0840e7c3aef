//! Node balance through the proxy, on four real redis-server nodes: a skewed read load that
//! no single key makes read-hot leaves one node busy; with `balance` on, the proxy lowers
//! the read-hot threshold of that node's keys and the nodes even out, measured by each
//! node's own INFO commandstats.

mod support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::*;

/// No key is read-hot by the rules' own threshold; only balance can cache anything.
fn rules(enabled: bool) -> String {
    format!(
        "version: 1\ndefaults:\n  read:\n    hot_at_per_sec: 1000000\n    cool_below_per_sec: 500\n\
         balance:\n  enabled: {enabled}\n  over_mean_pct: 5\n  min_reads_per_sec: 20\n"
    )
}

/// A counter or gauge of the proxy's /metrics for one label set (or summed over all).
fn metric(p: &Proxy, name: &str, label: &str) -> f64 {
    let (_, m) = p.admin_get("/metrics");
    m.lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The proxy's log lines of balance steps and changes.
fn steps(p: &Proxy) -> String {
    p.stderr()
        .lines()
        .filter(|l| l.contains("balance"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// GET calls per node over `secs`, from the nodes' own commandstats.
fn node_gets(nodes: &[Redis], secs: f64) -> Vec<i64> {
    for n in nodes {
        n.client().cmd(&["CONFIG", "RESETSTAT"]);
    }
    thread::sleep(Duration::from_secs_f64(secs));
    nodes.iter().map(|n| calls(n, "get")).collect()
}

fn max_over_mean(v: &[i64]) -> f64 {
    let mean = v.iter().sum::<i64>() as f64 / v.len() as f64;
    *v.iter().max().unwrap() as f64 / mean.max(1.0)
}

#[test]
fn a_node_made_busy_by_warm_keys_is_evened_out_by_caching_its_hottest_keys() {
    need_redis();
    let nodes = pool(4);
    let refs: Vec<&Redis> = nodes.iter().collect();
    let dir = TempDir::new("balance");
    let path = dir.0.join("rules.yaml");
    std::fs::write(&path, rules(false)).unwrap();
    let proxy = Proxy::start(
        &refs,
        &["--rules", &path_str(&path), "--log-level", "debug"],
    );

    // 400 keys; the 30 warm ones all live on one node.
    let keys = spread_keys("item:", 400);
    let mut c = proxy.client();
    for k in &keys {
        assert_eq!(c.cmd(&["SET", k, &format!("v-{k}")]), Reply::ok());
    }
    let busy = owner(&nodes, &keys[0]);
    let warm: Vec<String> = keys
        .iter()
        .filter(|k| owner(&nodes, k) == busy)
        .take(30)
        .cloned()
        .collect();
    assert_eq!(warm.len(), 30, "spread_keys put 30 of 400 keys on one node");
    let rest: Vec<String> = keys.iter().filter(|k| !warm.contains(k)).cloned().collect();
    // The best balance caching the warm keys can give: the rest, read evenly, as placed.
    let mut per_node = vec![0i64; nodes.len()];
    for k in &rest {
        per_node[owner(&nodes, k)] += 1;
    }
    let skew_rest = max_over_mean(&per_node);

    // Each batch: 60 GETs over the warm keys, 40 over the rest: the busy node gets about 70%
    // of the reads, no key more than 2% of them.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let wrong = Arc::new(AtomicU64::new(0));
    let load = {
        let (addr, stop, sent, wrong) = (proxy.addr(), stop.clone(), sent.clone(), wrong.clone());
        let (warm, rest) = (warm.clone(), rest.clone());
        thread::spawn(move || {
            let mut c = Client::connect(&addr);
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let batch: Vec<[String; 2]> = (0..100)
                    .map(|j| {
                        i += 1;
                        let k = if j < 60 {
                            &warm[i % warm.len()]
                        } else {
                            &rest[i % rest.len()]
                        };
                        ["GET".to_string(), k.clone()]
                    })
                    .collect();
                for (cmd, r) in batch.iter().zip(c.pipeline(&batch)) {
                    if r != Reply::bulk(&format!("v-{}", cmd[1])) {
                        wrong.fetch_add(1, Ordering::Relaxed);
                    }
                }
                sent.fetch_add(100, Ordering::Relaxed);
            }
        })
    };

    // Balance off: the busy node stays busy.
    thread::sleep(Duration::from_secs(2));
    let off = node_gets(&nodes, 3.0);
    let skew_off = max_over_mean(&off);
    let rate = sent.load(Ordering::Relaxed) as f64 / 5.0;
    assert!(
        skew_off > 2.0,
        "without balance node {busy} should be busy: GETs per node {off:?} ({skew_off:.2}), {rate:.0} GETs/s"
    );
    // Every warm key is read at >= 20/s (the floor), so the cache can take them.
    assert!(
        rate * 0.02 >= 20.0,
        "load too slow for the test: {rate:.0} GETs/s"
    );
    assert_eq!(
        metric(&proxy, "saltshaker_mitigated_keys", "kind=\"read\""),
        0.0
    );

    // Balance on, by a live reload.
    std::fs::write(&path, rules(true)).unwrap();
    let busy_addr = nodes[busy].addr();
    let chosen = |p: &Proxy| {
        metric(
            p,
            "saltshaker_balance_keys",
            &format!("node=\"{busy_addr}\""),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while chosen(&proxy) == 0.0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(200));
    }
    let picked = chosen(&proxy);
    assert!(
        picked > 0.0,
        "no key of node {busy} chosen after 15 s:\n{}",
        steps(&proxy)
    );
    // A few windows to settle (the choice, its promotions, the load that follows).
    thread::sleep(Duration::from_secs(6));
    let hits0 = metric(&proxy, "saltshaker_cache_hits_total", "");
    let on = node_gets(&nodes, 3.0);
    let skew_on = max_over_mean(&on);
    let hits = metric(&proxy, "saltshaker_cache_hits_total", "") - hits0;
    let cached = metric(&proxy, "saltshaker_mitigated_keys", "kind=\"read\"");
    let (_, listing) = proxy.admin_get("/hotkeys");
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    // Within 15% of the figure the other keys' placement alone gives.
    assert!(
        skew_on < skew_rest * 1.15 && skew_on < skew_off / 1.5,
        "with balance GETs per node {on:?} ({skew_on:.2}), off was {off:?} ({skew_off:.2}), \
         the other keys alone {per_node:?} ({skew_rest:.2}); \
         {picked} keys chosen at first, {cached} cached, {hits} hits; the proxy's steps:\n{}",
        steps(&proxy)
    );
    // The warm keys, and some of the others where their placement is uneven (each is read
    // at ~50/s, over the floor), but never most of the key space.
    assert!(
        hits > 0.0 && cached > 0.0 && cached <= 200.0,
        "{cached} keys cached, {hits} hits"
    );
    assert_eq!(
        wrong.load(Ordering::Relaxed),
        0,
        "every GET answered its own value"
    );
    // Most of them: under a loaded machine one may sit just below the threshold at the
    // moment of the listing (a CI run once listed 29 of the 30).
    let listed: Vec<&String> = warm
        .iter()
        .filter(|k| listing.contains(&format!("\"key\":\"{k}\"")))
        .collect();
    assert!(
        listed.len() * 10 >= warm.len() * 8 && listing.contains("\"read_hot_by\":\"balance\""),
        "/hotkeys says the warm keys are read-hot by balance ({} of {} listed): {listing}",
        listed.len(),
        warm.len()
    );

    // Cached or not, a write through the proxy is read back at once.
    let k = &warm[0];
    assert_eq!(c.cmd(&["SET", k, "changed"]), Reply::ok());
    assert_eq!(c.cmd(&["GET", k]), Reply::bulk("changed"));
    assert!(
        proxy
            .stderr()
            .contains("balance: node is busier than the others"),
        "the log says why keys were cached:\n{}",
        proxy.stderr()
    );
}
