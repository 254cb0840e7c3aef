//! Salted counters against a real 4-node pool with two proxy processes: writes spread over
//! shards on different nodes, reads through either proxy merge exactly, and after demotion
//! the fold leaves the base key holding every acknowledged increment, even when the proxy
//! folding is killed between two journaled steps, and across a node restart.

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::salting::*;
use support::*;

/// Fast epochs so a test sees promotion, demotion and fold in seconds.
const RULES: &str = r#"version: 1
detection: { window_ms: 200 }
epoch_ms: 1000
rules:
  - match: "ctr:*"
    write:
      hot_at_per_sec: 300
      cool_below_per_sec: 100
      strategy: salt
      salt: { shards: 4 }
  - match: "cc:*"
    write: { strategy: salt+combine, combine: { window_us: 2000 }, salt: { shards: 4 } }
  - match: "auto:*"
    write:
      hot_at_per_sec: 300
      cool_below_per_sec: 100
      strategy: auto
      combine: { window_us: 1000 }
      salt: { per_shard_per_sec: 1500 }
  - match: "final:votes"
    pin: true
    write: { strategy: salt, salt: { shards: 3 } }
  - match: "grow:*"
    write:
      hot_at_per_sec: 300
      cool_below_per_sec: 100
      strategy: salt
      salt: { shards: auto, per_shard_per_sec: 100, max_shards: 6 }
  - match: "hctr:*"
    write: { strategy: salt, salt: { shards: 3, families: [hashes] } }
"#;

/// Four redis-server nodes and the rules file, kept in a directory of the test's own.
fn setup(tag: &str) -> (Vec<Redis>, TempDir, String) {
    let dir = TempDir::new(tag);
    let rules = rules_file(&dir);
    (pool(4), dir, rules)
}

fn rules_file(dir: &TempDir) -> String {
    let path = dir.0.join("rules.yaml");
    std::fs::write(&path, RULES).unwrap();
    path_str(&path)
}

/// `threads` clients per proxy INCR `key` until `stop`; returns the acknowledged count.
fn hammer(
    proxies: &[&Proxy],
    key: &str,
    threads: usize,
    stop: Arc<AtomicBool>,
) -> Vec<thread::JoinHandle<i64>> {
    let mut hs = Vec::new();
    for p in proxies {
        for _ in 0..threads {
            let (addr, key, stop) = (p.addr(), key.to_string(), stop.clone());
            hs.push(thread::spawn(move || {
                let mut c = Client::connect(&addr);
                let mut acked = 0i64;
                while !stop.load(Ordering::Relaxed) {
                    let cmds: Vec<Vec<&str>> =
                        (0..10).map(|_| vec!["INCR", key.as_str()]).collect();
                    match c.try_pipeline(&cmds) {
                        Ok(rs) => acked += rs.iter().filter(|r| !r.is_error()).count() as i64,
                        Err(rs) => {
                            acked += rs.iter().filter(|r| !r.is_error()).count() as i64;
                            c = Client::connect(&addr);
                        }
                    }
                }
                acked
            }));
        }
    }
    hs
}

fn get_int(p: &Proxy, key: &str) -> i64 {
    get_int_from(&mut p.client(), key)
}

#[test]
fn promoted_key_spreads_over_four_nodes_and_reads_through_either_proxy_are_exact() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-promote");
    let (a, b) = (proxy(&nodes, &rules, &[]), proxy(&nodes, &rules, &[]));
    let key = "ctr:final";
    assert_eq!(a.client().cmd(&["INCRBY", key, "100"]).as_int(), 100);
    let (code, body) = a.admin_post("/hotkeys/promote?key=ctr%3Afinal&shards=4");
    assert_eq!(code, 200, "{body}");
    wait_in_force(&[&a, &b], key);

    // One client, one INCR at a time: the writes rotate over the four shards evenly.
    let mut one = a.client();
    for _ in 0..400 {
        assert!(!one.cmd(&["INCR", key]).is_error());
    }
    let per: Vec<i64> = shard_keys(&nodes)
        .iter()
        .map(|(n, k)| {
            nodes[*n]
                .client()
                .cmd(&["GET", k])
                .as_str()
                .parse()
                .unwrap()
        })
        .collect();
    assert_eq!(per, vec![100; 4], "writes per shard");

    let stop = Arc::new(AtomicBool::new(false));
    let hs = hammer(&[&a, &b], key, 3, stop.clone());
    thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let acked: i64 = 400 + hs.into_iter().map(|h| h.join().unwrap()).sum::<i64>();
    assert!(acked > 100, "too few writes to say anything: {acked}");

    // The writes sit on four shards, one per node.
    let shards = shard_keys(&nodes);
    let on: BTreeSet<usize> = shards.iter().map(|(n, _)| *n).collect();
    assert_eq!(on.len(), 4, "shards on every node: {shards:?}");
    // Exact through either proxy, and the same key commands mean what they mean on one key.
    assert_eq!(get_int(&a, key), 100 + acked);
    assert_eq!(get_int(&b, key), 100 + acked);
    let mut c = b.client();
    assert_eq!(c.cmd(&["EXISTS", key]).as_int(), 1);
    assert_eq!(c.cmd(&["TYPE", key]).as_str(), "string");
    assert_eq!(c.cmd(&["TTL", key]).as_int(), -1);
    assert_eq!(c.cmd(&["EXPIRE", key, "600"]).as_int(), 1);
    let ttl = c.cmd(&["TTL", key]).as_int();
    assert!((590..=600).contains(&ttl), "{ttl}");
    for (n, k) in &shards {
        let t = nodes[*n].client().cmd(&["TTL", k]).as_int();
        assert!(t > 0, "shard {k} has no expiry: {t}");
    }
    assert_eq!(c.cmd(&["PERSIST", key]).as_int(), 1);
    // A shard created after EXPIRE takes the key's expiry.
    let before = get_int(&a, key);
    assert_eq!(c.cmd(&["DEL", key]).as_int(), 1);
    assert!(shard_keys(&nodes).is_empty());
    c.cmd(&["INCR", key]);
    assert_eq!(c.cmd(&["EXPIRE", key, "900"]).as_int(), 1);
    for _ in 0..3 {
        c.cmd(&["INCR", key]);
    }
    wait_for(
        "new shards to take the key's expiry",
        Duration::from_secs(2),
        || {
            let shards = shard_keys(&nodes);
            shards.len() == 4
                && shards
                    .iter()
                    .all(|(n, k)| nodes[*n].client().cmd(&["TTL", k]).as_int() > 800)
        },
    );
    assert_eq!(get_int(&a, key), 4);
    assert_eq!(c.cmd(&["PERSIST", key]).as_int(), 1);
    c.cmd(&["INCRBY", key, &(before - 4).to_string()]);
    let m = c.cmd(&["MGET", key, "other"]);
    assert_eq!(m.as_array()[0].as_str(), (100 + acked).to_string());
    assert!(m.as_array()[1].is_nil());
    // INCR answers with an estimate; it is never below what this client last read.
    let est = c.cmd(&["INCR", key]).as_int();
    assert!(est >= 100 + acked + 1 - 4 * 1000, "estimate far off: {est}");
    assert_eq!(get_int(&a, key), 101 + acked);

    // A command that cannot be merged folds the key first and then runs on the whole.
    assert_eq!(
        c.cmd(&["INCRBYFLOAT", key, "0.5"]).as_str(),
        format!("{}.5", 101 + acked)
    );
    assert_eq!(c.cmd(&["SET", key, "7"]), Reply::ok());
    assert_eq!(get_int(&a, key), 7);
    assert_eq!(c.cmd(&["DEL", key]).as_int(), 1);
    assert!(a.client().cmd(&["GET", key]).is_nil());
    assert_eq!(c.cmd(&["EXISTS", key]).as_int(), 0);
}

#[test]
fn demotion_folds_every_shard_into_the_base_key_and_nothing_is_lost() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-fold");
    let (a, b) = (proxy(&nodes, &rules, &[]), proxy(&nodes, &rules, &[]));
    let key = "ctr:votes";
    // Hot by detection alone: no admin request.
    let stop = Arc::new(AtomicBool::new(false));
    let hs = hammer(&[&a, &b], key, 2, stop.clone());
    wait_in_force(&[&a, &b], key);
    wait_for("writes on the shards", Duration::from_secs(5), || {
        shard_keys(&nodes).len() >= 3
    });
    stop.store(true, Ordering::Relaxed);
    let acked: i64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(get_int(&a, key), acked);

    // Cooled: demoted at an epoch boundary, then folded after a grace epoch.
    wait_for("the fold to finish", Duration::from_secs(20), || {
        salted(&a, key).is_none() && salted(&b, key).is_none()
    });
    assert!(shard_keys(&nodes).is_empty(), "{:?}", shard_keys(&nodes));
    let base = owner(&nodes, key);
    let direct: i64 = nodes[base]
        .client()
        .cmd(&["GET", key])
        .as_str()
        .parse()
        .unwrap();
    assert_eq!(direct, acked, "base key after the fold");
    assert_eq!(get_int(&b, key), acked);
    let logs = a.stderr() + &b.stderr();
    assert!(logs.contains("folded back"), "{logs}");
}

#[test]
fn a_proxy_killed_between_fold_steps_leaves_a_fold_the_next_proxy_completes() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-crash");
    for (i, point) in ["fold-after-journal", "fold-after-take", "fold-after-add"]
        .iter()
        .enumerate()
    {
        let key = format!("ctr:crash{i}");
        let mut dying = proxy(&nodes, &rules, &[("SALTSHAKER_FAILPOINT", point)]);
        let mut other = proxy(&nodes, &rules, &[]);
        let enc = key.replace(':', "%3A");
        let (code, body) = dying.admin_post(&format!("/hotkeys/promote?key={enc}&shards=4"));
        assert_eq!(code, 200, "{body}");
        wait_in_force(&[&dying, &other], &key);
        let stop = Arc::new(AtomicBool::new(false));
        let hs = hammer(&[&dying, &other], &key, 2, stop.clone());
        thread::sleep(Duration::from_millis(800));
        stop.store(true, Ordering::Relaxed);
        let acked: i64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(get_int(&other, &key), acked);
        // Only the proxy with the fail point may fold.
        other.kill();
        // A fresh proxy finds the journal, completes the move once, and ends the fold.
        // Until the dead proxy's claim runs out, the move it left half done stays so: a
        // merged read counts the moved value exactly once meanwhile.
        let next = crash_fold_and_take_over(&mut dying, &nodes, &rules, &key, point);
        assert_eq!(
            get_int(&next, &key),
            acked,
            "mid-fold read after a crash at {point}"
        );
        wait_folded(&next, &key);
        let got = get_int(&next, &key);
        assert_eq!(
            got,
            acked,
            "after a crash at {point}\n--- dying:\n{}\n--- next:\n{}",
            dying.stderr(),
            next.stderr()
        );
        assert!(shard_keys(&nodes).iter().all(|(_, k)| !k.ends_with(&key)));
        assert!(
            next.stderr().contains("completing a fold move"),
            "{point}: {}",
            next.stderr()
        );
    }
}

/// An SRE promotes a key again while its fold is between two steps: the promotion cancels
/// the demotion and writers return to the shards at once, so the fold must stop and leave
/// the record. (It used to finish and delete the record it had just adopted, and whatever
/// a proxy wrote to a shard before its next registry read was never counted again; the
/// random-kill fault test lost 4 acknowledged increments so.)
#[test]
fn a_key_promoted_again_mid_fold_stays_salted_and_loses_nothing() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-repromote");
    let key = "ctr:again";
    let p = proxy(
        &nodes,
        &rules,
        &[("SALTSHAKER_FAILPOINT", "fold-after-journal+2500")],
    );
    assert_eq!(
        p.admin_post("/hotkeys/promote?key=ctr%3Aagain&shards=4").0,
        200
    );
    wait_in_force(&[&p], key);
    let mut c = p.client();
    for _ in 0..200 {
        assert!(matches!(c.cmd(&["INCR", key]), Reply::Int(_)));
    }
    wait_for("writes on the shards", Duration::from_secs(5), || {
        shard_keys(&nodes).len() >= 3
    });
    assert_eq!(p.admin_post("/hotkeys/demote?key=ctr%3Aagain").0, 200);
    wait_for(
        "the fold to pause mid-move",
        Duration::from_secs(15),
        || p.stderr().contains("failpoint reached: pausing"),
    );
    let (code, body) = p.admin_post("/hotkeys/promote?key=ctr%3Aagain&shards=4");
    assert_eq!(code, 200, "{body}");
    // The pause ends and the fold goes on; it must see the new promotion and stop.
    wait_for(
        "the fold to stop or finish",
        Duration::from_secs(10),
        || {
            p.stderr()
                .contains("fold stopped: the key was promoted again")
                || salted(&p, key).is_none()
        },
    );
    // The proxy's view follows the registry at its coordinator's next read, which comes
    // after the fold returns: /hotkeys may show the demoted record for a few milliseconds.
    wait_for(
        "the view to show the key promoted again",
        Duration::from_secs(3),
        || salted(&p, key).is_none_or(|e| e["demote_ms"].is_null()),
    );
    let e = salted(&p, key).unwrap_or_else(|| panic!("the record was removed:\n{}", p.stderr()));
    assert!(e["demote_ms"].is_null(), "{e}");
    for _ in 0..100 {
        assert!(matches!(c.cmd(&["INCR", key]), Reply::Int(_)));
    }
    thread::sleep(Duration::from_millis(1200));
    assert!(salted(&p, key).is_some(), "still salted: it is pinned");
    assert_eq!(get_int(&p, key), 300, "{}", p.stderr());
}

#[test]
fn salt_plus_combine_batches_each_shard_and_loses_nothing() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-combine");
    let (a, b) = (proxy(&nodes, &rules, &[]), proxy(&nodes, &rules, &[]));
    let key = "cc:likes";
    assert_eq!(
        a.admin_post("/hotkeys/promote?key=cc%3Alikes&shards=4").0,
        200
    );
    wait_in_force(&[&a, &b], key);
    let stop = Arc::new(AtomicBool::new(false));
    let hs = hammer(&[&a, &b], key, 3, stop.clone());
    thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let acked: i64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(get_int(&a, key), acked);
    assert_eq!(get_int(&b, key), acked);
    let incrby: i64 = nodes.iter().map(|n| calls(n, "incrby")).sum();
    assert!(
        incrby * 3 < acked,
        "combining should send far fewer shard writes than increments: {incrby} for {acked}"
    );
    assert_eq!(shard_keys(&nodes).len(), 4);
}

#[test]
fn auto_combines_on_one_proxy_and_salts_when_several_proxies_together_are_too_much() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-auto");
    let a = proxy(&nodes, &rules, &[]);
    let key = "auto:votes";
    // One proxy combines to at most 1000 writes/s (window 1000 us): under the 1500/s a
    // shard carries, so it stays combined.
    let stop = Arc::new(AtomicBool::new(false));
    let mut hs = hammer(&[&a], key, 3, stop.clone());
    thread::sleep(Duration::from_millis(3000));
    assert!(salted(&a, key).is_none(), "one proxy alone must not salt");
    let metrics = a.admin_get("/metrics").1;
    let combined = metrics
        .lines()
        .find_map(|l| l.strip_prefix("saltshaker_combined_writes_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    assert!(
        combined > 1000.0,
        "the key was combined meanwhile: {combined}"
    );
    // Two proxies: 2000/s combined would reach the key's node; the key is salted.
    let b = proxy(&nodes, &rules, &[]);
    hs.extend(hammer(&[&b], key, 3, stop.clone()));
    wait_for("auto to salt the key", Duration::from_secs(15), || {
        salted(&a, key).is_some()
    });
    wait_in_force(&[&a, &b], key);
    thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let acked: i64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(get_int(&a, key), acked);
    assert!(!shard_keys(&nodes).is_empty());
}

#[test]
fn an_unreachable_registry_means_no_promotions_and_the_proxy_keeps_serving() {
    need_redis();
    let (mut nodes, _dir, rules) = setup("salt-registry-down");
    let a = proxy(&nodes, &rules, &[]);
    let registry = node_of(&a, &nodes, "saltshaker:registry");
    // A hot key on another node: detected, but not salted while the registry is away.
    let key = (0..1000)
        .map(|i| format!("ctr:{i}"))
        .find(|k| node_of(&a, &nodes, k) != registry)
        .unwrap();
    nodes[registry].stop();
    let stop = Arc::new(AtomicBool::new(false));
    let hs = hammer(&[&a], &key, 2, stop.clone());
    wait_for(
        "the registry outage in metrics",
        Duration::from_secs(10),
        || {
            a.admin_get("/metrics")
                .1
                .contains("saltshaker_salt_registry_up 0")
        },
    );
    thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let acked: i64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(acked > 500, "the proxy kept serving: {acked}");
    assert_eq!(get_int(&a, &key), acked);
    assert!(salted(&a, &key).is_none());
    assert!(
        a.stderr().contains("salt registry unreachable"),
        "{}",
        a.stderr()
    );
    let (code, body) = a.admin_post("/hotkeys/promote?key=ctr%3A1");
    assert_eq!(code, 409, "{body}");
    // Back: promotions work again.
    nodes[registry].restart();
    wait_for("the registry to be back", Duration::from_secs(10), || {
        a.admin_get("/metrics")
            .1
            .contains("saltshaker_salt_registry_up 1")
    });
    let enc = key.replace(':', "%3A");
    // The proxy reconnects with backoff: the first attempts may still find the node down.
    wait_for("a promotion to work again", Duration::from_secs(10), || {
        a.admin_post(&format!("/hotkeys/promote?key={enc}")).0 == 200
    });
}

/// The node the proxy places `key` on: written through the proxy, found, removed.
fn node_of(p: &Proxy, nodes: &[Redis], key: &str) -> usize {
    let mut c = p.client();
    c.cmd(&["SET", key, "probe"]);
    let at = owner(nodes, key);
    c.cmd(&["DEL", key]);
    at
}

#[test]
fn a_pinned_rule_salts_its_key_before_any_traffic_and_cooling_does_not_demote_it() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-pin");
    let a = proxy(&nodes, &rules, &[]);
    wait_in_force(&[&a], "final:votes");
    let e = salted(&a, "final:votes").unwrap();
    assert_eq!(
        (e["shards"].as_u64(), e["pinned"].as_bool()),
        (Some(3), Some(true))
    );
    let mut c = a.client();
    for _ in 0..30 {
        c.cmd(&["INCR", "final:votes"]);
    }
    assert_eq!(shard_keys(&nodes).len(), 3);
    // Three epochs without traffic: a pinned key stays salted.
    thread::sleep(Duration::from_millis(3000));
    assert!(salted(&a, "final:votes").is_some());
    assert_eq!(get_int(&a, "final:votes"), 30);
    // The pin is the rules': an admin demote is refused and says where to end it.
    let (code, body) = a.admin_post("/hotkeys/demote?key=final%3Avotes");
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("remove `pin: true`"), "{body}");
}

#[test]
fn reads_stay_exact_while_commands_fold_a_live_salted_key_over_and_over() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-live-fold");
    let (a, b) = (proxy(&nodes, &rules, &[]), proxy(&nodes, &rules, &[]));
    let key = "ctr:live";
    assert_eq!(
        a.admin_post("/hotkeys/promote?key=ctr%3Alive&shards=4").0,
        200
    );
    wait_in_force(&[&a, &b], key);
    let sent = Arc::new(AtomicI64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (addr, sent, stop) = (a.addr(), sent.clone(), stop.clone());
        thread::spawn(move || {
            let mut c = Client::connect(&addr);
            let mut acked = 0i64;
            while !stop.load(Ordering::Relaxed) {
                sent.fetch_add(1, Ordering::SeqCst);
                if !c.cmd(&["INCR", "ctr:live"]).is_error() {
                    acked += 1;
                }
            }
            acked
        })
    };
    let folder = {
        let (addr, stop) = (b.addr(), stop.clone());
        thread::spawn(move || {
            let mut c = Client::connect(&addr);
            let mut folds = 0;
            while !stop.load(Ordering::Relaxed) {
                // STRLEN cannot be merged: every call moves all shards into the base key.
                let r = c.cmd(&["STRLEN", "ctr:live"]);
                assert!(!r.is_error(), "STRLEN: {r}");
                folds += 1;
            }
            folds
        })
    };
    // Reads through the proxy that is not folding: never more than was sent, never less
    // than the read before.
    let mut r = b.client();
    let mut last = 0;
    let end = Instant::now() + Duration::from_secs(4);
    let mut reads = 0;
    while Instant::now() < end {
        let v = get_int_from(&mut r, key);
        let ceiling = sent.load(Ordering::SeqCst);
        assert!(
            v <= ceiling,
            "read {v} but only {ceiling} increments were sent"
        );
        assert!(v >= last, "read {v} after {last}");
        last = v;
        reads += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let acked = writer.join().unwrap();
    let folds = folder.join().unwrap();
    assert!(folds >= 3 && reads >= 50, "folds {folds}, reads {reads}");
    assert_eq!(get_int(&a, key), acked);
    assert_eq!(get_int(&b, key), acked);
}

/// GET as a number; a key not written yet reads as 0.
fn get_int_from(c: &mut Client, key: &str) -> i64 {
    let r = c.cmd(&["GET", key]);
    if r.is_nil() {
        return 0;
    }
    r.as_str()
        .parse()
        .unwrap_or_else(|_| panic!("GET {key}: {r}"))
}

#[test]
fn shards_auto_grows_n_at_an_epoch_boundary_and_nothing_is_lost() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-grow");
    let (a, b) = (proxy(&nodes, &rules, &[]), proxy(&nodes, &rules, &[]));
    let key = "grow:likes";
    assert_eq!(
        a.admin_post("/hotkeys/promote?key=grow%3Alikes&shards=2").0,
        200
    );
    wait_in_force(&[&a, &b], key);
    let stop = Arc::new(AtomicBool::new(false));
    let hs = hammer(&[&a, &b], key, 2, stop.clone());
    // Thousands of writes a second at 100 per shard: N grows to max_shards, 6.
    wait_for("N to grow", Duration::from_secs(15), || {
        salted(&a, key).is_some_and(|e| e["shards"] == 6)
    });
    thread::sleep(Duration::from_millis(2500));
    stop.store(true, Ordering::Relaxed);
    let acked: i64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(shard_keys(&nodes).len(), 6, "{:?}", shard_keys(&nodes));
    assert_eq!(get_int(&a, key), acked);
    assert_eq!(get_int(&b, key), acked);
    // Demoted (an admin promotion is pinned) and folded, every shard of both sizes.
    assert_eq!(b.admin_post("/hotkeys/demote?key=grow%3Alikes").0, 200);
    wait_for("the fold", Duration::from_secs(20), || {
        salted(&a, key).is_none()
    });
    assert!(shard_keys(&nodes).is_empty());
    assert_eq!(get_int(&b, key), acked);
}

#[test]
fn identical_reads_in_one_pipeline_share_one_merge_and_a_write_between_them_is_seen() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-shared-reads");
    let a = proxy(&nodes, &rules, &[]);
    let mut c = a.client();
    let key = "ctr:shared";
    c.cmd(&["INCRBY", key, "7"]);
    let (code, body) = a.admin_post("/hotkeys/promote?key=ctr%3Ashared&shards=4");
    assert_eq!(code, 200, "{body}");
    wait_in_force(&[&a], key);
    for _ in 0..8 {
        c.cmd(&["INCR", key]); // values on the shards too, not only in the base key
    }
    let before = a.metric("saltshaker_salt_shared_reads_total");
    let cmds: Vec<Vec<&str>> = vec![
        vec!["GET", key],
        vec!["GET", key],
        vec!["GET", key],
        vec!["INCR", key],
        vec!["GET", key],
        vec!["GET", key],
        vec!["EXISTS", key],
        vec!["GET", key],
    ];
    let got: Vec<String> = c
        .pipeline(&cmds)
        .iter()
        .map(|r| match r {
            Reply::Int(i) => i.to_string(),
            r => r.as_str(),
        })
        .collect();
    assert_eq!(
        got,
        ["15", "15", "15", "16", "16", "16", "1", "16"],
        "{got:?}"
    );
    // Shared: the 2nd and 3rd GET, the 6th; the EXISTS breaks the run, and the last GET
    // follows a read of another kind, so it is merged again.
    assert_eq!(a.metric("saltshaker_salt_shared_reads_total") - before, 3.0);
    assert_eq!(get_int_from(&mut c, key), 16);
}

#[test]
fn hash_counters_merge_field_by_field() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-hash");
    let a = proxy(&nodes, &rules, &[]);
    let mut c = a.client();
    c.cmd(&["HINCRBY", "hctr:poll", "yes", "10"]);
    let (code, body) = a.admin_post("/hotkeys/promote?key=hctr%3Apoll&shards=3");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"kind\":\"hash\""), "{body}");
    wait_in_force(&[&a], "hctr:poll");
    for i in 0..30 {
        c.cmd(&[
            "HINCRBY",
            "hctr:poll",
            if i % 3 == 0 { "no" } else { "yes" },
            "1",
        ]);
    }
    assert_eq!(c.cmd(&["HGET", "hctr:poll", "yes"]).as_str(), "30");
    assert_eq!(c.cmd(&["HGET", "hctr:poll", "no"]).as_str(), "10");
    let all = c.cmd(&["HGETALL", "hctr:poll"]).pairs();
    assert_eq!(all.len(), 2, "{all:?}");
    let m = c.cmd(&["HMGET", "hctr:poll", "no", "maybe", "yes"]);
    let m = m.as_array();
    assert_eq!(
        (m[0].as_str(), m[1].is_nil(), m[2].as_str()),
        ("10".into(), true, "30".into())
    );
    assert!(shard_keys(&nodes).len() >= 2);
    // HLEN cannot be merged: the key is folded, then HLEN runs on the whole hash.
    assert_eq!(c.cmd(&["HLEN", "hctr:poll"]).as_int(), 2);
    assert!(shard_keys(&nodes).is_empty());
    assert_eq!(c.cmd(&["HGET", "hctr:poll", "yes"]).as_str(), "30");

    // Keys of a type the rule does not let the proxy salt are refused, with the reason.
    c.cmd(&["HSET", "ctr:ahash", "f", "1"]);
    let (code, body) = a.admin_post("/hotkeys/promote?key=ctr%3Aahash");
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("families is [counters]"), "{body}");
    c.cmd(&["LPUSH", "hctr:list", "x"]);
    let (code, body) = a.admin_post("/hotkeys/promote?key=hctr%3Alist");
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("a list cannot be salted"), "{body}");
    let (code, body) = a.admin_post("/hotkeys/promote?key=saltshaker%3Aregistry");
    assert_eq!(code, 409, "{body}");
    assert_eq!(a.admin_post("/hotkeys/promote").0, 400);
    assert_eq!(a.admin_get("/hotkeys/promote?key=x").0, 405);
}

#[test]
fn a_node_down_gives_an_error_never_a_partial_sum_and_a_restart_with_aof_loses_nothing() {
    need_redis();
    let mut nodes: Vec<Redis> = (0..4)
        .map(|_| Redis::start_with(&["--appendonly", "yes", "--appendfsync", "always"]))
        .collect();
    let dir = TempDir::new("salt-restart");
    let rules = rules_file(&dir);
    let (a, b) = (proxy(&nodes, &rules, &[]), proxy(&nodes, &rules, &[]));
    let key = "ctr:restart";
    assert_eq!(
        a.admin_post("/hotkeys/promote?key=ctr%3Arestart&shards=4")
            .0,
        200
    );
    wait_in_force(&[&a, &b], key);
    let total = Arc::new(AtomicI64::new(0));
    let run = |ms: u64| {
        let stop = Arc::new(AtomicBool::new(false));
        let hs = hammer(&[&a, &b], key, 2, stop.clone());
        thread::sleep(Duration::from_millis(ms));
        stop.store(true, Ordering::Relaxed);
        total.fetch_add(
            hs.into_iter().map(|h| h.join().unwrap()).sum(),
            Ordering::Relaxed,
        );
    };
    run(500);
    // Take down a node holding a shard (not the registry's node, which the test also
    // needs). Writes pause around the kill itself: an INCR the node applied just before
    // dying, whose reply was lost, could not be told apart from one never applied.
    let shards = shard_keys(&nodes);
    let registry = owner(&nodes, "saltshaker:registry");
    let victim = shards
        .iter()
        .map(|(n, _)| *n)
        .find(|&n| n != registry)
        .unwrap();
    nodes[victim].stop();
    let r = a.client().cmd(&["GET", key]);
    assert!(
        r.is_error(),
        "a read with a shard's node down must fail, got {r}"
    );
    assert!(r.err().contains("saltshaker"), "{r}");
    // Writes while it is down: those for its shard fail, the others land.
    run(300);
    nodes[victim].restart();
    run(1500);
    let acked = total.load(Ordering::Relaxed);
    wait_for("reads to work again", Duration::from_secs(5), || {
        !a.client().cmd(&["GET", key]).is_error()
    });
    assert_eq!(get_int(&a, key), acked);
    assert_eq!(get_int(&b, key), acked);
    assert_eq!(b.admin_post("/hotkeys/demote?key=ctr%3Arestart").0, 200);
    wait_for("the fold", Duration::from_secs(20), || {
        salted(&a, key).is_none()
    });
    assert_eq!(get_int(&b, key), acked);
}

/// A salted counter refuses what Redis refuses, with Redis's own words: an increment that
/// is not an integer by string2ll's rules (`+5`, `007`), one that cannot be negated, and
/// one that would overflow the whole; and it stays readable afterwards.
#[test]
fn a_salted_counter_refuses_bad_and_overflowing_increments_as_redis_does() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-int");
    let a = proxy(&nodes, &rules, &[]);
    let reference = Redis::start();
    let mut r = reference.client();
    wait_in_force(&[&a], "final:votes");
    let mut c = a.client();
    let script: &[&[&str]] = &[
        &["INCRBY", "final:votes", "12"],
        &["INCRBY", "final:votes", "9223372036854775807"],
        &["INCRBY", "final:votes", "9223372036854775807"],
        &["INCRBY", "final:votes", "+5"],
        &["INCRBY", "final:votes", "007"],
        &["INCRBY", "final:votes", " 5"],
        &["INCRBY", "final:votes", "9223372036854775808"],
        &["DECRBY", "final:votes", "-9223372036854775808"],
        &["DECRBY", "final:votes", "abc"],
        &["INCRBY", "final:votes", "-9223372036854775808"],
        &["INCRBY", "final:votes", "-9223372036854775808"],
        &["INCR", "final:votes"],
        &["GET", "final:votes"],
    ];
    for cmd in script {
        let want = r.cmd(cmd);
        let got = c.cmd(cmd);
        match (&want, &got) {
            (Reply::Error(w), Reply::Error(g)) => assert_eq!(g, w, "{cmd:?}"),
            _ => assert_eq!(got, want, "{cmd:?}"),
        }
    }
    // The pin keeps it salted, and the whole stays readable and equal to Redis's.
    assert!(salted(&a, "final:votes").is_some());
    let want: i64 = r.cmd(&["GET", "final:votes"]).as_str().parse().unwrap();
    assert_eq!(get_int(&a, "final:votes"), want);
}
