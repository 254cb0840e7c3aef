//! Combining write-hot increments: many INCRs become one INCRBY, every caller still gets
//! the exact reply it would have had one by one, and nothing is lost or counted twice.

mod support;

use std::sync::{Arc, Barrier};
use std::thread;

use support::*;

const RULES: &str = r#"version: 1
rules:
  - match: "likes:*"
    pin: true
    write: { strategy: combine, combine: { window_us: 2000 } }
  - match: "plain:*"
    write: { strategy: off }
"#;

fn proxy_with_rules(nodes: &[&Redis], dir: &TempDir) -> Proxy {
    let path = dir.0.join("rules.yaml");
    std::fs::write(&path, RULES).unwrap();
    let p = path_str(&path);
    Proxy::start(nodes, &["--rules", &p])
}

#[test]
fn concurrent_incrs_get_exact_distinct_replies_and_lose_nothing() {
    need_redis();
    let nodes = pool(2);
    let dir = TempDir::new("combine");
    let proxy = proxy_with_rules(&[&nodes[0], &nodes[1]], &dir);
    let (threads, batches, per) = (12usize, 150usize, 10usize);
    let start = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (addr, start) = (proxy.addr(), start.clone());
            thread::spawn(move || {
                let mut c = Client::connect(&addr);
                let mut seen = Vec::with_capacity(batches * per);
                start.wait();
                for _ in 0..batches {
                    let cmds: Vec<Vec<&str>> = (0..per).map(|_| vec!["INCR", "likes:1"]).collect();
                    let replies = c.pipeline(&cmds);
                    let ints: Vec<i64> = replies.iter().map(|r| r.as_int()).collect();
                    // In one pipeline, our own increments are applied in order.
                    assert!(
                        ints.windows(2).all(|w| w[0] < w[1]),
                        "replies out of order: {ints:?}"
                    );
                    // Read-your-writes: a GET after our INCRs sees at least our last reply.
                    let now = c.cmd(&["GET", "likes:1"]).as_str().parse::<i64>().unwrap();
                    assert!(
                        now >= *ints.last().unwrap(),
                        "GET {now} older than own INCR {}",
                        ints.last().unwrap()
                    );
                    seen.extend(ints);
                }
                seen
            })
        })
        .collect();
    let mut all: Vec<i64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let n = (threads * batches * per) as i64;
    all.sort_unstable();
    assert_eq!(all.len() as i64, n);
    assert!(
        all.iter().copied().eq(1..=n),
        "every reply 1..={n} exactly once"
    );
    assert_eq!(
        proxy.client().cmd(&["GET", "likes:1"]).as_str(),
        n.to_string()
    );
    let owner = &nodes[owner(&nodes, "likes:1")];
    assert_eq!(
        owner.client().cmd(&["GET", "likes:1"]).as_str(),
        n.to_string(),
        "on the node itself"
    );
    // The node saw far fewer writes than the clients sent.
    let writes = calls(owner, "incrby") + calls(owner, "incr");
    eprintln!("{n} INCRs through the proxy became {writes} backend writes");
    assert!(
        writes * 3 <= n,
        "expected combining: {writes} backend writes for {n} increments"
    );
    let (_, metrics) = proxy.admin_get("/metrics");
    assert!(
        metrics.contains("saltshaker_combined_writes_total"),
        "{metrics}"
    );
}

#[test]
fn mixed_deltas_and_hash_fields_sum_exactly() {
    need_redis();
    let nodes = pool(2);
    let dir = TempDir::new("combine-mixed");
    let proxy = proxy_with_rules(&[&nodes[0], &nodes[1]], &dir);
    let handles: Vec<_> = (0..6)
        .map(|t| {
            let addr = proxy.addr();
            thread::spawn(move || {
                let mut c = Client::connect(&addr);
                let mut sum = 0i64;
                for i in 0..300i64 {
                    let d = (i * 7 + t) % 11 - 5;
                    let cmds = vec![
                        vec!["INCRBY".to_string(), "likes:mixed".into(), d.to_string()],
                        vec!["DECRBY".to_string(), "likes:mixed".into(), (-d).to_string()],
                        vec![
                            "HINCRBY".to_string(),
                            "likes:hash".into(),
                            format!("f{}", i % 3),
                            "2".into(),
                        ],
                        vec!["DECR".to_string(), "likes:mixed".into()],
                    ];
                    let r = c.pipeline(&cmds);
                    assert!(r.iter().all(|x| !x.is_error()), "{r:?}");
                    sum += 2 * d - 1;
                }
                sum
            })
        })
        .collect();
    let expect: i64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["GET", "likes:mixed"]).as_str(), expect.to_string());
    for f in ["f0", "f1", "f2"] {
        assert_eq!(
            c.cmd(&["HGET", "likes:hash", f]).as_int(),
            6 * 100 * 2,
            "field {f}"
        );
    }
}

#[test]
fn a_batch_that_errors_gives_each_caller_its_own_answer() {
    need_redis();
    let node = Redis::start();
    let dir = TempDir::new("combine-err");
    let proxy = proxy_with_rules(&[&node], &dir);
    node.client().cmd(&["SET", "likes:text", "not a number"]);
    node.client()
        .cmd(&["SET", "likes:max", &i64::MAX.to_string()]);
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let addr = proxy.addr();
            thread::spawn(move || {
                let mut c = Client::connect(&addr);
                let r = c.pipeline(&[
                    vec!["INCR", "likes:text"],
                    vec!["INCRBY", "likes:max", "1"],
                    vec!["PING"],
                ]);
                (r[0].clone(), r[1].clone(), r[2].clone())
            })
        })
        .collect();
    for h in handles {
        let (a, b, p) = h.join().unwrap();
        assert!(a.err().contains("not an integer"), "{a:?}");
        assert!(b.err().contains("overflow"), "{b:?}");
        assert_eq!(p.as_str(), "PONG");
    }
    assert_eq!(
        node.client().cmd(&["GET", "likes:max"]).as_str(),
        i64::MAX.to_string()
    );
    // A key whose rule says off is never combined: INCR arrives as INCR.
    let mut c = proxy.client();
    for _ in 0..50 {
        c.cmd(&["INCR", "plain:1"]);
    }
    assert!(calls(&node, "incr") >= 50);
}

/// Pipelines that mix a combined key with plain ones, as a busy client sends them: the hot
/// key's increments still join batches (commands on other keys in flight do not hold them
/// back), and every key keeps its order inside each pipeline.
#[test]
fn pipelines_mixing_plain_keys_still_combine_and_keep_each_key_in_order() {
    need_redis();
    let node = Redis::start();
    let dir = TempDir::new("combine-pipelined");
    let proxy = proxy_with_rules(&[&node], &dir);
    let (threads, rounds) = (8usize, 150usize);
    let start = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (addr, start) = (proxy.addr(), start.clone());
            thread::spawn(move || {
                let mut c = Client::connect(&addr);
                let (a, s) = (format!("plain:{t}:a"), format!("plain:{t}:s"));
                start.wait();
                for i in 0..rounds {
                    let v = format!("v{i}");
                    let mut cmds: Vec<Vec<&str>> = vec![
                        vec!["INCR", &a],
                        vec!["INCR", "likes:2"],
                        vec!["SET", &s, &v],
                        vec!["INCR", "likes:2"],
                        vec!["GET", &s],
                        vec!["INCR", "likes:2"],
                        vec!["INCR", &a],
                        vec!["INCR", "likes:2"],
                    ];
                    let check_hot = i % 10 == 0;
                    if check_hot {
                        cmds.insert(0, vec!["GET", "likes:2"]);
                        cmds.push(vec!["GET", "likes:2"]);
                    }
                    let r = c.pipeline(&cmds);
                    let r = if check_hot {
                        let before: i64 = match r[0].is_nil() {
                            true => 0,
                            false => r[0].as_str().parse().unwrap(),
                        };
                        let after: i64 = r[r.len() - 1].as_str().parse().unwrap();
                        assert!(before < r[2].as_int(), "a GET saw a later INCR: {r:?}");
                        assert!(
                            after >= r[8].as_int(),
                            "a GET missed an earlier INCR: {r:?}"
                        );
                        &r[1..r.len() - 1]
                    } else {
                        &r[..]
                    };
                    let n = 2 * i as i64;
                    assert_eq!((r[0].as_int(), r[6].as_int()), (n + 1, n + 2), "{r:?}");
                    assert_eq!(r[4].as_str(), v, "{r:?}");
                    let hot: Vec<i64> = [1, 3, 5, 7].iter().map(|&j| r[j].as_int()).collect();
                    assert!(hot.windows(2).all(|w| w[0] < w[1]), "{hot:?}");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let hot = (threads * rounds * 4) as i64;
    assert_eq!(
        proxy.client().cmd(&["GET", "likes:2"]).as_str(),
        hot.to_string()
    );
    // Every plain INCR reaches the node as INCR; of the hot key's, only those that could
    // not join a batch (a GET of the key earlier in the pipeline) do, and a batch that
    // closed with one increment in it (sent as the INCR itself; its window simply found no
    // other).
    let plain = (threads * rounds * 2) as i64;
    let uncombined = calls(&node, "incr") - plain;
    eprintln!("{uncombined} of {hot} hot INCRs went to the node uncombined");
    assert_eq!(proxy.metric("saltshaker_combine_fallbacks_total"), 0.0);
    let alone =
        proxy.metric("saltshaker_combine_backend_writes_total") - calls(&node, "incrby") as f64;
    assert_eq!(
        proxy.metric("saltshaker_combine_held_back_total") + alone,
        uncombined as f64,
        "every uncombined hot increment is held back or alone in its batch"
    );
    assert!(
        uncombined * 2 <= hot,
        "{uncombined} of {hot} hot increments were not combined"
    );
}

/// Combining proves it pays: a key written hot by one client at a time, whose batches
/// would each carry one increment, is not combined, and /hotkeys and the metrics say why;
/// a key written by many clients at once stays combined. Every reply stays exact.
#[test]
fn a_trickle_is_not_combined_and_a_crowd_is() {
    need_redis();
    let node = Redis::start();
    let dir = TempDir::new("combine-pays");
    let path = dir.0.join("rules.yaml");
    std::fs::write(
        &path,
        "version: 1\ndefaults:\n  write: { hot_at_per_sec: 200, cool_below_per_sec: 50, strategy: combine, combine: { window_us: 500 } }\n",
    )
    .unwrap();
    let p = Proxy::start(&[&node], &["--rules", &path_str(&path)]);
    // The crowd: 16 clients INCR `crowd` at once, for as long as the trickle runs.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let crowd: Vec<_> = (0..16)
        .map(|_| {
            let (addr, stop) = (p.addr(), stop.clone());
            thread::spawn(move || {
                let mut c = Client::connect(&addr);
                let mut last = 0i64;
                let mut n = 0i64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let Reply::Int(v) = c.cmd(&["INCR", "crowd"]) else {
                        panic!("INCR crowd did not answer an integer");
                    };
                    assert!(v > last, "replies of one client rise: {last} then {v}");
                    last = v;
                    n += 1;
                }
                n
            })
        })
        .collect();
    // The trickle: one client, one INCR at a time.
    let mut c = p.client();
    let end = std::time::Instant::now() + std::time::Duration::from_secs(4);
    let mut trickle = 0i64;
    let mut seen = None;
    let mut crowd_ledger = false;
    while std::time::Instant::now() < end {
        for _ in 0..50 {
            trickle += 1;
            assert_eq!(c.cmd(&["INCR", "trickle"]), Reply::Int(trickle));
        }
        let hk = p.hotkeys();
        let keys = hk["keys"].as_array().cloned().unwrap_or_default();
        if let Some(e) = keys.iter().find(|e| e["key"] == "trickle") {
            if e["not_combined"].is_string() {
                seen = Some(e.clone());
            }
        }
        if let Some(e) = keys.iter().find(|e| e["key"] == "crowd") {
            assert!(e["not_combined"].is_null(), "the crowd's batches pay: {e}");
            // Its ledger: increments that reached the node as fewer commands.
            let l = &e["ledger"]["combine"];
            if let (Some(saved), Some(cost)) = (
                l["saved"]["commands"].as_u64(),
                l["cost"]["commands"].as_u64(),
            ) {
                assert!(
                    saved >= cost,
                    "batches of two or more save a command each: {e}"
                );
                crowd_ledger = true;
            }
        }
    }
    let e = seen.expect("/hotkeys never said why the trickle is not combined");
    assert!(
        crowd_ledger,
        "/hotkeys never showed the crowd's combine ledger"
    );
    assert!(
        e["not_combined"]
            .as_str()
            .unwrap()
            .starts_with("batches would carry"),
        "{e}"
    );
    assert_eq!(e["phase"], "detected", "{e}");
    assert!(p.metric("saltshaker_combine_declined_total") >= 1.0);
    assert!(p.metric("saltshaker_combine_not_combined_keys") >= 1.0);
    // From now on the trickle's increments go to the node one by one, and the crowd's
    // are still combined: the crowd's INCRs reach the node as fewer commands.
    let combined_before = p.metric("saltshaker_combined_writes_total");
    let incrs_before = calls(&node, "incr");
    for _ in 0..200 {
        trickle += 1;
        assert_eq!(c.cmd(&["INCR", "trickle"]), Reply::Int(trickle));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let crowd_total: i64 = crowd.into_iter().map(|h| h.join().unwrap()).sum();
    let combined = p.metric("saltshaker_combined_writes_total") - combined_before;
    let incrs = calls(&node, "incr") - incrs_before;
    assert!(
        incrs >= 200,
        "the trickle's INCRs reach the node one by one: {incrs}"
    );
    assert!(combined > 0.0, "the crowd is still combined");
    // Exact: nothing lost, nothing counted twice.
    let mut d = node.client();
    assert_eq!(
        d.cmd(&["GET", "trickle"]),
        Reply::bulk(&trickle.to_string())
    );
    assert_eq!(
        d.cmd(&["GET", "crowd"]),
        Reply::bulk(&crowd_total.to_string())
    );
}
