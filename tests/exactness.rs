//! The exactness tiers against a real 4-node pool and two proxy processes.
//!
//! `SALTSHAKER.INCRBY key delta id`: an increment ID counts once, whether the retry comes
//! to the same proxy or the other, on a plain key and on a salted one, across its
//! promotion, demotion and fold, and when the proxy dies between the steps of an increment.
//!
//! The display tier: reads of a salted counter are never staler than the bound, show the
//! reading proxy's own increments, and cost one merge per period.

mod support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use support::salting::*;
use support::*;

const RULES: &str = r#"version: 1
detection: { window_ms: 200 }
epoch_ms: 1000
rules:
  - match: "pay:*"
    write:
      hot_at_per_sec: 1000000
      cool_below_per_sec: 1
      strategy: salt
      salt: { shards: 4 }
      idempotency: { window_ms: 600000 }
  - match: "view:*"
    read: { salted: { tier: display, refresh_ms: 500 } }
    write:
      hot_at_per_sec: 1000000
      cool_below_per_sec: 1
      strategy: salt
      salt: { shards: 4 }
  - match: "short:*"
    write: { idempotency: { window_ms: 1000, max_ids: 3 } }
"#;

fn setup(tag: &str) -> (Vec<Redis>, TempDir, String) {
    pool_with_rules(tag, RULES)
}

fn once(c: &mut Client, key: &str, delta: i64, id: &str) -> i64 {
    match c.cmd(&["SALTSHAKER.INCRBY", key, &delta.to_string(), id]) {
        Reply::Int(v) => v,
        r => panic!("SALTSHAKER.INCRBY {key} {delta} {id}: {r:?}"),
    }
}

fn get(p: &Proxy, key: &str) -> i64 {
    int(&p.client().cmd(&["GET", key]))
}

/// A counter's GET reply (nil is 0).
fn int(r: &Reply) -> i64 {
    match r {
        Reply::Bulk(Some(b)) => String::from_utf8_lossy(b).parse().unwrap(),
        Reply::Bulk(None) => 0,
        r => panic!("a counter's GET: {r:?}"),
    }
}

/// Threads on both proxies send every ID of `ids` (each `times` over), all at once.
fn send_all(proxies: &[&Proxy], key: &str, ids: &[(String, i64)], times: usize) {
    let hs: Vec<_> = proxies
        .iter()
        .flat_map(|p| (0..2).map(move |t| (p.addr(), t)))
        .map(|(addr, t)| {
            let (key, ids) = (key.to_string(), ids.to_vec());
            thread::spawn(move || {
                let mut c = Client::connect(&addr);
                for _ in 0..times {
                    // Each thread walks the IDs from its own end, so retries interleave.
                    let order: Vec<&(String, i64)> = match t {
                        0 => ids.iter().collect(),
                        _ => ids.iter().rev().collect(),
                    };
                    for (id, d) in order {
                        once(&mut c, &key, *d, id);
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
}

fn ids(prefix: &str, n: usize) -> Vec<(String, i64)> {
    (0..n)
        .map(|i| (format!("{prefix}-{i}"), (i % 7) as i64 + 1))
        .collect()
}

/// A shard's ID list (`saltshaker:i:SALT:...`), not the base key's (`saltshaker:i:{N}:...`).
fn shard_ids(k: &str) -> bool {
    k.strip_prefix("saltshaker:i:")
        .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
}

fn total(ids: &[(String, i64)]) -> i64 {
    ids.iter().map(|(_, d)| d).sum()
}

#[test]
fn the_same_id_counts_once_through_one_proxy_or_both_and_a_retry_gets_the_first_reply() {
    need_redis();
    let (nodes, _dir, rules) = setup("idem-plain");
    let (a, b) = (proxy(&nodes, &rules, &[]), proxy(&nodes, &rules, &[]));
    let key = "plain:likes";
    let mut c = a.client();
    assert_eq!(once(&mut c, key, 5, "first"), 5);
    assert_eq!(
        once(&mut c, key, 5, "first"),
        5,
        "a retry to the same proxy"
    );
    assert_eq!(
        once(&mut b.client(), key, 5, "first"),
        5,
        "a retry to the other"
    );
    assert_eq!(once(&mut c, key, 2, "second"), 7);
    let batch = ids("p", 300);
    send_all(&[&a, &b], key, &batch, 2);
    assert_eq!(get(&a, key), 7 + total(&batch));
    assert_eq!(get(&b, key), 7 + total(&batch));
    let applied = a.metric("saltshaker_idempotent_applied_total")
        + b.metric("saltshaker_idempotent_applied_total");
    assert_eq!(applied, 302.0);
    let dups = a.metric("saltshaker_idempotent_duplicates_total")
        + b.metric("saltshaker_idempotent_duplicates_total");
    assert_eq!(dups, 2.0 + 300.0 * 8.0 - 300.0);
    // Errors are INCRBY's own, and nothing is recorded for them.
    let r = c.cmd(&["SALTSHAKER.INCRBY", key, "x", "bad"]);
    assert_eq!(
        r,
        Reply::Error("ERR value is not an integer or out of range".into())
    );
    c.cmd(&["SET", "plain:text", "hello"]);
    let r = c.cmd(&["SALTSHAKER.INCRBY", "plain:text", "1", "t"]);
    assert_eq!(
        r,
        Reply::Error("ERR value is not an integer or out of range".into())
    );
    let r = c.cmd(&["SALTSHAKER.INCRBY", key, "1"]);
    assert!(matches!(r, Reply::Error(e) if e.contains("wrong number of arguments")));
    c.cmd(&["MULTI"]);
    let r = c.cmd(&["SALTSHAKER.INCRBY", key, "1", "in-tx"]);
    assert!(matches!(r, Reply::Error(e) if e.contains("inside MULTI")));
    c.cmd(&["DISCARD"]);
    assert_eq!(get(&a, key), 7 + total(&batch));
}

#[test]
fn on_a_salted_key_an_id_counts_once_across_promotion_demotion_and_fold() {
    need_redis();
    let (nodes, _dir, rules) = setup("idem-salted");
    let (a, b) = (proxy(&nodes, &rules, &[]), proxy(&nodes, &rules, &[]));
    let key = "pay:total";
    let enc = "pay%3Atotal";
    // Applied before the promotion (on the base key), retried after it.
    let before = ids("before", 100);
    send_all(&[&a, &b], key, &before, 1);
    assert_eq!(
        a.admin_post(&format!("/hotkeys/promote?key={enc}&shards=4"))
            .0,
        200
    );
    wait_in_force(&[&a, &b], key);
    send_all(&[&a, &b], key, &before, 1);
    assert_eq!(get(&a, key), total(&before), "retries after the promotion");

    let during = ids("during", 400);
    send_all(&[&a, &b], key, &during, 2);
    let want = total(&before) + total(&during);
    assert_eq!(get(&a, key), want);
    assert_eq!(get(&b, key), want);
    // The IDs sit beside the shards they went to: on every node.
    let lists: Vec<usize> = nodes
        .iter()
        .map(|n| n.keys().iter().filter(|k| shard_ids(k)).count())
        .collect();
    assert!(lists.iter().all(|&n| n >= 1), "{lists:?}");

    // Demoted: writes are back on the base key, and retries still meet their IDs.
    assert_eq!(a.admin_post(&format!("/hotkeys/demote?key={enc}")).0, 200);
    wait_for(
        "the demotion to take effect",
        Duration::from_secs(10),
        || salted(&a, key).is_some_and(|e| e["demote_ms"].as_u64().is_some_and(|d| now_ms() > d)),
    );
    // Retries go on, round after round, while the fold moves the shards and their IDs.
    let until = Instant::now() + Duration::from_secs(30);
    let mut rounds = 0;
    while salted(&a, key).is_some() || salted(&b, key).is_some() {
        assert!(Instant::now() < until, "the fold did not finish");
        send_all(&[&a, &b], key, &during, 1);
        rounds += 1;
        assert_eq!(
            get(&a, key),
            want,
            "retries while demoted and folding ({rounds})"
        );
    }
    assert!(
        rounds >= 2,
        "{rounds} rounds of retries before the fold finished"
    );
    send_all(&[&a, &b], key, &before, 1);
    send_all(&[&a, &b], key, &during, 1);
    let owner = owner(&nodes, key);
    let direct: i64 = nodes[owner]
        .client()
        .cmd(&["GET", key])
        .as_str()
        .parse()
        .unwrap();
    assert_eq!(
        direct, want,
        "the base key after the fold, and retries after it"
    );
    assert!(
        nodes.iter().all(|n| n.keys().iter().all(|k| !shard_ids(k))),
        "no shard keeps its IDs after the fold"
    );
    // New IDs still count.
    assert_eq!(once(&mut a.client(), key, 10, "after"), want + 10);
}

#[test]
fn a_proxy_killed_between_the_steps_of_an_idempotent_increment_loses_and_doubles_nothing() {
    need_redis();
    let (nodes, _dir, rules) = setup("idem-crash");
    let steady = proxy(&nodes, &rules, &[]);
    let salted_key = "pay:crash";
    assert_eq!(
        steady
            .admin_post("/hotkeys/promote?key=pay%3Acrash&shards=4")
            .0,
        200
    );
    wait_in_force(&[&steady], salted_key);
    let mut want: HashMap<&str, i64> = HashMap::new();
    for (i, point) in ["idem-after-check", "idem-after-apply"].iter().enumerate() {
        for key in ["plain:crash", salted_key] {
            let mut dying = proxy(&nodes, &rules, &[("SALTSHAKER_FAILPOINT", point)]);
            if key == salted_key {
                wait_in_force(&[&dying], key);
            }
            let id = format!("crash-{i}");
            let mut c = dying.client();
            let r = c.try_cmd(&["SALTSHAKER.INCRBY", key, "3", &id]);
            assert!(r.is_err(), "{point}: the proxy should have died: {r:?}");
            assert!(dying.wait_exit(Duration::from_secs(5)).is_some());
            assert!(dying.stderr().contains(point), "{}", dying.stderr());
            // The client retries through the proxy that is up.
            let mut s = steady.client();
            once(&mut s, key, 3, &id);
            once(&mut s, key, 3, &id);
            *want.entry(key).or_default() += 3;
            assert_eq!(get(&steady, key), want[key], "{point} on {key}");
        }
    }
}

#[test]
fn ids_are_forgotten_after_their_window_and_past_max_ids_oldest_first() {
    need_redis();
    let (nodes, _dir, rules) = setup("idem-window");
    let p = proxy(&nodes, &rules, &[]);
    let key = "short:w";
    let mut c = p.client();
    assert_eq!(once(&mut c, key, 1, "a"), 1);
    assert_eq!(once(&mut c, key, 1, "a"), 1);
    thread::sleep(Duration::from_millis(1300));
    assert_eq!(
        once(&mut c, key, 1, "a"),
        2,
        "a window later the ID is new again"
    );
    // max_ids 3: the fourth ID pushes out the oldest ("a").
    for id in ["b", "c", "d"] {
        once(&mut c, key, 1, id);
    }
    assert_eq!(p.metric("saltshaker_idempotent_evicted_total"), 1.0);
    assert_eq!(once(&mut c, key, 1, "d"), 5, "d is remembered");
    assert_eq!(once(&mut c, key, 1, "a"), 6, "a was forgotten");
    let owner = owner(&nodes, key);
    let lists: Vec<String> = nodes[owner]
        .keys()
        .into_iter()
        .filter(|k| k.starts_with("saltshaker:i:"))
        .collect();
    assert_eq!(lists.len(), 1, "{lists:?}");
    let r = nodes[owner].client().cmd(&["HLEN", &lists[0]]);
    assert_eq!(r, Reply::Int(3), "memory stays at max_ids");
}

#[test]
fn display_tier_reads_keep_within_their_bound_show_own_writes_and_merge_once_a_period() {
    need_redis();
    let (nodes, _dir, rules) = setup("display");
    let (a, b) = (proxy(&nodes, &rules, &[]), proxy(&nodes, &rules, &[]));
    let key = "view:home";
    assert_eq!(
        a.admin_post("/hotkeys/promote?key=view%3Ahome&shards=4").0,
        200
    );
    wait_in_force(&[&a, &b], key);
    let e = salted(&a, key).unwrap();
    assert_eq!(e["exactness"]["read"], "display", "{e}");
    assert_eq!(e["exactness"]["refresh_ms"], 500, "{e}");
    wait_for("the exactness gauge", Duration::from_secs(5), || {
        let m = a.admin_get("/metrics").1;
        m.contains("saltshaker_salted_keys_by_exactness{write=\"exact\",read=\"display\"} 1")
            && m.contains("saltshaker_salted_keys_by_exactness{write=\"combine\",read=\"exact\"} 0")
    });

    // A writer increments through a, one at a time, noting when each was acknowledged.
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicI64::new(0));
    let log = Arc::new(Mutex::new(vec![(Instant::now(), 0i64)]));
    let writer = {
        let (addr, stop, acked, log) = (a.addr(), stop.clone(), acked.clone(), log.clone());
        thread::spawn(move || {
            let mut c = Client::connect(&addr);
            while !stop.load(Ordering::Relaxed) {
                assert!(matches!(c.cmd(&["INCR", "view:home"]), Reply::Int(_)));
                let n = acked.fetch_add(1, Ordering::SeqCst) + 1;
                log.lock().unwrap().push((Instant::now(), n));
            }
        })
    };
    // A reader through b: each value holds at least every increment acknowledged one
    // period plus one merge (allowed 250 ms here) before the read was sent.
    let acked_by = |t: Instant| -> i64 {
        let log = log.lock().unwrap();
        log.iter()
            .take_while(|(at, _)| *at <= t)
            .last()
            .map_or(0, |e| e.1)
    };
    let refreshes0 = b.metric("saltshaker_salt_display_refreshes_total");
    let mut r = b.client();
    let started = Instant::now();
    let (mut reads, mut worst) = (0, 0i64);
    while started.elapsed() < Duration::from_secs(4) {
        let sent = Instant::now();
        let v = int(&r.cmd(&["GET", key]));
        let upper = acked.load(Ordering::SeqCst) + 1;
        assert!(v <= upper, "{v} read, only {upper} sent");
        if let Some(then) = sent.checked_sub(Duration::from_millis(750)) {
            let floor = acked_by(then);
            assert!(
                v >= floor,
                "{v} read, {floor} acknowledged 750 ms before the read"
            );
            worst = worst.max(acked_by(sent) - v);
        }
        reads += 1;
    }
    let refreshes = b.metric("saltshaker_salt_display_refreshes_total") - refreshes0;
    assert!(
        refreshes <= 4.0 / 0.5 + 2.0,
        "{refreshes} merges for 4 s of reads at a 500 ms period"
    );
    assert!(reads > 200, "{reads} reads in 4 s");
    // Through the writing proxy, a client reads its own increments at once.
    let mut own = a.client();
    for _ in 0..50 {
        let before = acked.load(Ordering::SeqCst);
        let v = int(&own.cmd(&["GET", key]));
        assert!(
            v >= before,
            "a read through the writing proxy: {v} < {before}"
        );
    }
    let mut w = a.client();
    for _ in 0..20 {
        let before = acked.load(Ordering::SeqCst);
        let r = w.pipeline(&[vec!["INCR", key], vec!["GET", key]]);
        acked.fetch_add(1, Ordering::SeqCst);
        let v = int(&r[1]);
        assert!(
            v > before,
            "a GET pipelined after an INCR: {v}, {before} acknowledged before"
        );
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    // Exact on demand: the merged whole equals what was acknowledged.
    thread::sleep(Duration::from_millis(600));
    assert_eq!(get(&b, key), acked.load(Ordering::SeqCst));
    eprintln!("display tier: {reads} reads, {refreshes} merges, worst lag {worst} increments");
    // Another salted counter with the exact tier is merged on every read.
    let plain = "pay:exact";
    assert_eq!(
        a.admin_post("/hotkeys/promote?key=pay%3Aexact&shards=4").0,
        200
    );
    wait_in_force(&[&a], plain);
    let before = a.metric("saltshaker_salt_display_reads_total");
    let mut c = a.client();
    for i in 1..=20 {
        c.cmd(&["INCR", plain]);
        assert_eq!(c.cmd(&["GET", plain]).as_str(), i.to_string());
    }
    assert_eq!(a.metric("saltshaker_salt_display_reads_total"), before);
    assert_eq!(salted(&a, plain).unwrap()["exactness"]["read"], "exact");
}
