//! Sets and HyperLogLogs salted by member, against a real 4-node pool: the same random
//! command sequence runs on a salted key through the proxy and on a plain key on a
//! redis-server of its own, and every reply must match; PFCOUNT of a salted HyperLogLog
//! must equal the unsalted key's exactly; concurrent SADDs through two proxies, a fold, and
//! a proxy killed in the middle of a fold lose no member and resurrect none.

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use support::salting::*;
use support::*;

const RULES: &str = r#"version: 1
detection: { window_ms: 200 }
epoch_ms: 1000
rules:
  - match: "set:*"
    write:
      hot_at_per_sec: 300
      cool_below_per_sec: 100
      strategy: salt
      salt: { shards: 4, families: [sets] }
  - match: "hll:*"
    write: { strategy: salt, salt: { shards: 3, families: [hyperloglogs] } }
  - match: "lb:*"
    write: { strategy: salt, salt: { shards: 4, families: [sorted_sets] } }
  - match: "fh:*"
    write: { strategy: salt, salt: { shards: 4, families: [hashes], by: field } }
"#;

fn setup(tag: &str) -> (Vec<Redis>, TempDir, String) {
    pool_with_rules(tag, RULES)
}

fn promote(p: &Proxy, key: &str, shards: u32) {
    let enc = key.replace(':', "%3A");
    let (code, body) = p.admin_post(&format!("/hotkeys/promote?key={enc}&shards={shards}"));
    assert_eq!(code, 200, "{body}");
}

fn members(r: &Reply) -> BTreeSet<String> {
    r.strings().into_iter().collect()
}

/// All members of `key` by SSCAN through `c`, following the cursor to 0.
fn scan_all(c: &mut Client, key: &str, count: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut cursor = "0".to_string();
    for _ in 0..10_000 {
        let r = c.cmd(&["SSCAN", key, &cursor, "COUNT", count]);
        let a = r.as_array();
        cursor = a[0].as_str();
        out.extend(a[1].strings());
        if cursor == "0" {
            return out;
        }
    }
    panic!("SSCAN never ended");
}

/// `cmd` on the salted key through `c` and on `plain` through `reference`: the same reply.
fn same(c: &mut Client, reference: &mut Client, cmd: &[&str], step: usize) {
    let mut on_plain = cmd.to_vec();
    on_plain[1] = "plain";
    assert_eq!(c.cmd(cmd), reference.cmd(&on_plain), "step {step}: {cmd:?}");
}

/// Runs `steps` random set commands on `key` through `c` and on `plain` through `reference`
/// and compares every reply.
fn compare_sets(c: &mut Client, reference: &mut Client, key: &str, seed: u64, steps: usize) {
    let plain = "plain";
    let mut rng = Rng(seed);
    let m = |rng: &mut Rng| format!("m{}", rng.next(40));
    for step in 0..steps {
        let what = rng.next(100);
        let (a, b) = (m(&mut rng), m(&mut rng));
        let cmd: Vec<String> = match what {
            0..=34 => vec!["SADD".into(), key.into(), a, b],
            35..=44 => vec!["SADD".into(), key.into(), a],
            45..=59 => vec!["SREM".into(), key.into(), a, b],
            60..=69 => vec!["SISMEMBER".into(), key.into(), a],
            70..=74 => vec!["SMISMEMBER".into(), key.into(), a, b.clone(), b],
            75..=84 => vec!["SCARD".into(), key.into()],
            85..=89 => vec!["SMEMBERS".into(), key.into()],
            90..=91 => vec!["EXISTS".into(), key.into()],
            92..=93 => vec!["TYPE".into(), key.into()],
            94 => vec!["DEL".into(), key.into()],
            95..=96 => {
                let got = scan_all(c, key, "3");
                let want = members(&reference.cmd(&["SMEMBERS", plain]));
                assert_eq!(got, want, "step {step}: SSCAN");
                continue;
            }
            _ => {
                let got = c.cmd(&["SRANDMEMBER", key, "3"]).strings();
                let card = reference.cmd(&["SCARD", plain]).as_int();
                assert_eq!(got.len() as i64, card.min(3), "step {step}: SRANDMEMBER 3");
                for x in got {
                    assert_eq!(reference.cmd(&["SISMEMBER", plain, &x]).as_int(), 1);
                }
                continue;
            }
        };
        let args: Vec<&str> = cmd.iter().map(|s| s.as_str()).collect();
        let mut on_plain = args.clone();
        on_plain[1] = plain;
        let (got, want) = (c.cmd(&args), reference.cmd(&on_plain));
        if args[0] == "SMEMBERS" {
            assert_eq!(members(&got), members(&want), "step {step}: {args:?}");
        } else {
            assert_eq!(got, want, "step {step}: {args:?}");
        }
    }
}

#[test]
fn a_salted_set_answers_every_command_as_a_plain_set_does() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-set");
    let a = proxy(&nodes, &rules, &[]);
    let reference_server = Redis::start();
    let mut reference = reference_server.client();
    let mut c = a.client();

    // One set with members from before the promotion (they stay in the base key, and the
    // replies must still count each member once), one salted while empty.
    for key in ["set:likes", "set:fresh"] {
        reference.cmd(&["DEL", "plain"]);
        if key == "set:likes" {
            for i in 0..30 {
                let m = format!("m{i}");
                assert_eq!(
                    c.cmd(&["SADD", key, &m]),
                    reference.cmd(&["SADD", "plain", &m])
                );
            }
        } else {
            // TYPE must say set for the promotion to partition it.
            c.cmd(&["SADD", key, "m0"]);
            reference.cmd(&["SADD", "plain", "m0"]);
        }
        let base = owner(&nodes, key);
        promote(&a, key, 4);
        wait_in_force(&[&a], key);
        let e = salted(&a, key).unwrap();
        assert_eq!(e["kind"], "set", "{e}");
        compare_sets(&mut c, &mut reference, key, 0x5eed + key.len() as u64, 1500);
        // Members really are partitioned over the four nodes.
        let shards = shard_keys(&nodes);
        let on: BTreeSet<usize> = shards
            .iter()
            .filter(|(_, k)| k.ends_with(key))
            .map(|(n, _)| *n)
            .collect();
        assert!(on.len() >= 3, "shards of {key}: {shards:?}");
        // The members written before the promotion are spread into their shards: the base
        // key empties while the set reads the same.
        wait_for(
            "the base key's members to move into the shards",
            Duration::from_secs(10),
            || nodes[base].client().cmd(&["EXISTS", key]).as_int() == 0,
        );
        let want = members(&reference.cmd(&["SMEMBERS", "plain"]));
        assert_eq!(members(&c.cmd(&["SMEMBERS", key])), want);
        // A command without a merge folds the key first, then runs on the whole set.
        let want = reference.cmd(&["SINTERCARD", "1", "plain"]);
        assert_eq!(c.cmd(&["SINTERCARD", "1", key]), want);
        assert!(shard_keys(&nodes).iter().all(|(_, k)| !k.ends_with(key)));
        compare_sets(&mut c, &mut reference, key, 0xfeed + key.len() as u64, 300);
    }

    // Demoted: the fold copies every shard into the base key.
    let want = members(&reference.cmd(&["SMEMBERS", "plain"]));
    let (code, body) = a.admin_post("/hotkeys/demote?key=set%3Afresh");
    assert_eq!(code, 200, "{body}");
    wait_for("the fold to finish", Duration::from_secs(20), || {
        salted(&a, "set:fresh").is_none()
    });
    assert!(shard_keys(&nodes)
        .iter()
        .all(|(_, k)| !k.ends_with("set:fresh")));
    let base = owner(&nodes, "set:fresh");
    assert_eq!(
        members(&nodes[base].client().cmd(&["SMEMBERS", "set:fresh"])),
        want
    );
}

#[test]
fn a_salted_hyperloglog_counts_the_union_exactly_and_a_fresh_one_within_its_error() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-hll");
    let a = proxy(&nodes, &rules, &[]);
    let reference_server = Redis::start();
    let mut reference = reference_server.client();
    let mut c = a.client();
    let key = "hll:viewers";
    let add = |c: &mut Client, reference: &mut Client, from: usize, to: usize| {
        for chunk in (from..to).collect::<Vec<_>>().chunks(50) {
            let mut args = vec!["PFADD".to_string(), key.to_string()];
            args.extend(chunk.iter().map(|i| format!("user:{i}")));
            let mut v: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
            assert!(!c.cmd(&v).is_error());
            v[1] = "plain";
            reference.cmd(&v);
        }
    };
    add(&mut c, &mut reference, 0, 2000);
    promote(&a, key, 3);
    wait_in_force(&[&a], key);
    assert_eq!(salted(&a, key).unwrap()["kind"], "hll");
    // Overlapping the elements from before the promotion, and new ones.
    add(&mut c, &mut reference, 1500, 20_000);
    assert_eq!(shard_keys(&nodes).len(), 3, "{:?}", shard_keys(&nodes));
    let want = reference.cmd(&["PFCOUNT", "plain"]).as_int();
    assert_eq!(c.cmd(&["PFCOUNT", key]).as_int(), want);
    assert!((want - 20_000).abs() < 20_000 / 50, "HLL estimate {want}");
    assert_eq!(c.cmd(&["TYPE", key]).as_str(), "string");
    // No scratch key is left behind by the reads.
    for n in &nodes {
        assert!(n.keys().iter().all(|k| !k.starts_with("saltshaker:u:")));
    }

    let (code, body) = a.admin_post("/hotkeys/demote?key=hll%3Aviewers");
    assert_eq!(code, 200, "{body}");
    wait_for("the fold to finish", Duration::from_secs(20), || {
        salted(&a, key).is_none()
    });
    assert!(shard_keys(&nodes).is_empty());
    let base = owner(&nodes, key);
    assert_eq!(
        nodes[base].client().cmd(&["PFCOUNT", key]).as_int(),
        want,
        "the base key after the fold"
    );
    assert_eq!(c.cmd(&["PFCOUNT", key]).as_int(), want);

    // Salted while empty: the base key stays empty, and PFCOUNT adds up the shards' counts
    // (their elements are disjoint), each within the HyperLogLog's error.
    let key = "hll:fresh";
    c.cmd(&["PFADD", key, "seed"]);
    promote(&a, key, 3);
    wait_in_force(&[&a], key);
    c.cmd(&["DEL", key]);
    reference.cmd(&["DEL", "plain"]);
    let add = |c: &mut Client, reference: &mut Client, from: usize, to: usize| {
        for chunk in (from..to).collect::<Vec<_>>().chunks(100) {
            let mut args = vec!["PFADD".to_string(), key.to_string()];
            args.extend(chunk.iter().map(|i| format!("v:{i}")));
            let mut v: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
            assert!(!c.cmd(&v).is_error());
            v[1] = "plain";
            reference.cmd(&v);
        }
    };
    add(&mut c, &mut reference, 0, 50_000);
    thread::sleep(Duration::from_millis(300));
    let (got, unsalted) = (
        c.cmd(&["PFCOUNT", key]).as_int(),
        reference.cmd(&["PFCOUNT", "plain"]).as_int(),
    );
    let err = |x: i64| (x - 50_000).abs() as f64 / 50_000.0;
    println!("PFCOUNT of 50000 elements: salted {got}, unsalted {unsalted}");
    assert!(err(got) < 0.03, "salted estimate {got}");
    assert!(err(unsalted) < 0.03, "unsalted estimate {unsalted}");
}

/// `threads` clients per proxy SADD members of their own until `stop`; each returns the
/// members acknowledged as added.
fn sadders(
    proxies: &[&Proxy],
    key: &str,
    threads: usize,
    stop: Arc<AtomicBool>,
) -> Vec<thread::JoinHandle<Vec<String>>> {
    let mut hs = Vec::new();
    for (pi, p) in proxies.iter().enumerate() {
        for t in 0..threads {
            let (addr, key, stop) = (p.addr(), key.to_string(), stop.clone());
            hs.push(thread::spawn(move || {
                let mut c = Client::connect(&addr);
                let mut added = Vec::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    let batch: Vec<String> =
                        (0..10).map(|j| format!("p{pi}t{t}:{}", i + j)).collect();
                    let cmds: Vec<Vec<&str>> = batch
                        .iter()
                        .map(|m| vec!["SADD", key.as_str(), m])
                        .collect();
                    if let Ok(rs) = c.try_pipeline(&cmds) {
                        for (m, r) in batch.iter().zip(rs) {
                            assert_eq!(r.as_int(), 1, "{m} is new");
                            added.push(m.clone());
                        }
                    }
                    i += 10;
                }
                added
            }));
        }
    }
    hs
}

fn scard(p: &Proxy, key: &str) -> i64 {
    p.client().cmd(&["SCARD", key]).as_int()
}

#[test]
fn concurrent_sadds_through_two_proxies_and_a_fold_killed_midway_lose_no_member() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-set-crash");
    for (i, point) in ["fold-after-journal", "fold-after-add"].iter().enumerate() {
        let key = format!("set:crash{i}");
        let mut dying = proxy(&nodes, &rules, &[("SALTSHAKER_FAILPOINT", point)]);
        let mut other = proxy(&nodes, &rules, &[]);
        // Hot by detection: no admin request.
        let stop = Arc::new(AtomicBool::new(false));
        let hs = sadders(&[&dying, &other], &key, 2, stop.clone());
        wait_in_force(&[&dying, &other], &key);
        thread::sleep(Duration::from_millis(800));
        stop.store(true, Ordering::Relaxed);
        let added: BTreeSet<String> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
        assert!(added.len() > 300, "too few writes: {}", added.len());
        assert_eq!(scard(&dying, &key), added.len() as i64);
        assert_eq!(scard(&other, &key), added.len() as i64);
        assert!(shard_keys(&nodes).len() >= 3);
        // Only the proxy with the fail point may fold.
        other.kill();
        let next = crash_fold_and_take_over(&mut dying, &nodes, &rules, &key, point);
        // Mid-fold, after the crash: every member is still there, once.
        assert_eq!(
            scard(&next, &key),
            added.len() as i64,
            "mid-fold after {point}"
        );
        wait_folded(&next, &key);
        let base = owner(&nodes, &key);
        let got = members(&nodes[base].client().cmd(&["SMEMBERS", &key]));
        assert_eq!(got, added, "after a crash at {point}\n{}", next.stderr());
        assert!(
            next.stderr().contains("completing a fold move"),
            "{}",
            next.stderr()
        );
    }
}

/// Runs `steps` random leaderboard commands on `key` through `c` and on `plain` through
/// `reference`, comparing every reply.
fn compare_zsets(c: &mut Client, reference: &mut Client, key: &str, seed: u64, steps: usize) {
    let mut rng = Rng(seed);
    for step in 0..steps {
        let m = format!("p{}", rng.next(30));
        let m2 = format!("p{}", rng.next(30));
        let (i, j) = (rng.next(12) as i64 - 4, rng.next(12) as i64 - 4);
        let (lo, hi) = (rng.next(40).to_string(), format!("({}", rng.next(60)));
        let delta = match rng.next(4) {
            0 => "-3".to_string(),
            1 => "0.5".to_string(),
            _ => (1 + rng.next(20)).to_string(),
        };
        let (i, j) = (i.to_string(), j.to_string());
        let cmd: Vec<&str> = match rng.next(100) {
            0..=39 => vec!["ZINCRBY", key, &delta, &m],
            40..=49 => vec!["ZSCORE", key, &m],
            50..=52 => vec!["ZMSCORE", key, &m, &m2],
            53..=57 => vec!["ZREM", key, &m, &m2],
            58..=62 => vec!["ZCARD", key],
            63..=69 => vec!["ZREVRANGE", key, "0", "9", "WITHSCORES"],
            70..=74 => vec!["ZRANGE", key, &i, &j],
            75..=77 => vec!["ZRANGE", key, &i, &j, "REV", "WITHSCORES"],
            78..=81 => vec!["ZRANGEBYSCORE", key, &lo, &hi, "WITHSCORES"],
            82..=84 => vec!["ZREVRANGEBYSCORE", key, &hi, &lo, "LIMIT", "1", "3"],
            85..=86 => vec!["ZRANGE", key, &lo, "+inf", "BYSCORE", "LIMIT", "0", "4"],
            87..=92 => vec!["ZRANK", key, &m],
            93..=97 => vec!["ZREVRANK", key, &m],
            98 => vec!["TYPE", key],
            _ => vec!["EXISTS", key],
        };
        same(c, reference, &cmd, step);
    }
}

#[test]
fn a_salted_leaderboard_answers_as_a_plain_sorted_set_does_and_folds_back() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-zset");
    let a = proxy(&nodes, &rules, &[]);
    let reference_server = Redis::start();
    let mut reference = reference_server.client();
    let mut c = a.client();
    let key = "lb:final";
    // Scores from before the promotion stay in the base key and add to the shards'.
    for i in 0..20 {
        let m = format!("p{i}");
        let d = (i * 7 % 11).to_string();
        assert_eq!(
            c.cmd(&["ZINCRBY", key, &d, &m]),
            reference.cmd(&["ZINCRBY", "plain", &d, &m])
        );
    }
    promote(&a, key, 4);
    wait_in_force(&[&a], key);
    assert_eq!(salted(&a, key).unwrap()["kind"], "zset");
    compare_zsets(&mut c, &mut reference, key, 0x1eade, 1500);
    assert!(shard_keys(&nodes).len() >= 3, "{:?}", shard_keys(&nodes));
    // ZADD replaces a score: the key folds first, then ZADD runs on the whole.
    assert_eq!(
        c.cmd(&["ZADD", key, "100", "p1"]),
        reference.cmd(&["ZADD", "plain", "100", "p1"])
    );
    assert!(shard_keys(&nodes).is_empty());
    // With the base key holding every member, and then with it empty (the shard-by-shard
    // top-N path).
    compare_zsets(&mut c, &mut reference, key, 0xb0a4d, 500);
    assert_eq!(
        c.cmd(&["DEL", key]).as_int(),
        reference.cmd(&["DEL", "plain"]).as_int()
    );
    compare_zsets(&mut c, &mut reference, key, 0x70b, 800);

    let want = reference.cmd(&["ZRANGE", "plain", "0", "-1", "WITHSCORES"]);
    let (code, body) = a.admin_post("/hotkeys/demote?key=lb%3Afinal");
    assert_eq!(code, 200, "{body}");
    wait_for("the fold to finish", Duration::from_secs(20), || {
        salted(&a, key).is_none()
    });
    assert!(shard_keys(&nodes).is_empty());
    let base = owner(&nodes, key);
    assert_eq!(
        nodes[base]
            .client()
            .cmd(&["ZRANGE", key, "0", "-1", "WITHSCORES"]),
        want,
        "the base key after the fold"
    );
}

/// Runs `steps` random per-field counter commands on `key` and on `plain`, comparing
/// every reply (HGETALL as a map: field order is not part of the contract).
fn compare_fields(c: &mut Client, reference: &mut Client, key: &str, seed: u64, steps: usize) {
    let plain = "plain";
    let mut rng = Rng(seed);
    for step in 0..steps {
        let f = format!("f{}", rng.next(60));
        let g = format!("f{}", rng.next(60));
        let d = (rng.next(21) as i64 - 5).to_string();
        let cmd: Vec<&str> = match rng.next(100) {
            0..=44 => vec!["HINCRBY", key, &f, &d],
            45..=59 => vec!["HGET", key, &f],
            60..=64 => vec!["HMGET", key, &f, &g, &f],
            65..=69 => vec!["HEXISTS", key, &f],
            70..=76 => vec!["HDEL", key, &f, &g],
            77..=84 => vec!["HLEN", key],
            85..=89 => vec!["EXISTS", key],
            90 => vec!["DEL", key],
            _ => {
                let got: std::collections::BTreeMap<String, String> = c
                    .cmd(&["HGETALL", key])
                    .pairs()
                    .into_iter()
                    .map(|(k, v)| (k, v.as_str()))
                    .collect();
                let want: std::collections::BTreeMap<String, String> = reference
                    .cmd(&["HGETALL", plain])
                    .pairs()
                    .into_iter()
                    .map(|(k, v)| (k, v.as_str()))
                    .collect();
                assert_eq!(got, want, "step {step}: HGETALL");
                continue;
            }
        };
        same(c, reference, &cmd, step);
    }
}

#[test]
fn a_hash_placed_by_field_answers_as_a_plain_hash_does_and_folds_back() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-fields");
    let a = proxy(&nodes, &rules, &[]);
    let reference_server = Redis::start();
    let mut reference = reference_server.client();
    let mut c = a.client();
    let key = "fh:votes";
    for i in 0..25 {
        let (f, v) = (format!("f{i}"), (i * 3).to_string());
        assert_eq!(
            c.cmd(&["HSET", key, &f, &v]),
            reference.cmd(&["HSET", "plain", &f, &v])
        );
    }
    promote(&a, key, 4);
    wait_in_force(&[&a], key);
    assert_eq!(salted(&a, key).unwrap()["kind"], "fields");
    compare_fields(&mut c, &mut reference, key, 0xf1e1d, 1500);
    // Each field in one shard: no field name appears in two shards.
    let mut seen = BTreeSet::new();
    for (n, k) in shard_keys(&nodes) {
        for f in nodes[n].client().cmd(&["HKEYS", &k]).strings() {
            assert!(seen.insert(f.clone()), "{f} in two shards");
        }
    }
    assert!(seen.len() > 20, "{seen:?}");
    // HSET replaces a value: the key folds first, then HSET runs on the whole hash.
    assert_eq!(
        c.cmd(&["HSET", key, "f1", "7"]),
        reference.cmd(&["HSET", "plain", "f1", "7"])
    );
    assert!(shard_keys(&nodes).is_empty());
    compare_fields(&mut c, &mut reference, key, 0xabc, 800);

    let want = reference.cmd(&["HGETALL", "plain"]).pairs();
    let (code, body) = a.admin_post("/hotkeys/demote?key=fh%3Avotes");
    assert_eq!(code, 200, "{body}");
    wait_for("the fold to finish", Duration::from_secs(20), || {
        salted(&a, key).is_none()
    });
    assert!(shard_keys(&nodes).is_empty());
    let base = owner(&nodes, key);
    let mut got = nodes[base].client().cmd(&["HGETALL", key]).pairs();
    let mut want = want;
    got.sort_by(|x, y| x.0.cmp(&y.0));
    want.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(got, want, "the base key after the fold");
}

/// `threads` clients per proxy ZINCRBY members `p0..p49` by 1 or 2 until `stop`; each
/// returns the increments acknowledged per member.
fn incrementers(
    proxies: &[&Proxy],
    key: &str,
    threads: usize,
    stop: Arc<AtomicBool>,
) -> Vec<thread::JoinHandle<Vec<i64>>> {
    let mut hs = Vec::new();
    for (pi, p) in proxies.iter().enumerate() {
        for t in 0..threads {
            let (addr, key, stop) = (p.addr(), key.to_string(), stop.clone());
            hs.push(thread::spawn(move || {
                let mut c = Client::connect(&addr);
                let mut acked = vec![0i64; 50];
                let mut rng = Rng(0x9e37 + (pi * 16 + t) as u64);
                while !stop.load(Ordering::Relaxed) {
                    let batch: Vec<(usize, i64)> = (0..10)
                        .map(|_| (rng.next(50) as usize, 1 + rng.next(2) as i64))
                        .collect();
                    let args: Vec<(String, String)> = batch
                        .iter()
                        .map(|(m, d)| (d.to_string(), format!("p{m}")))
                        .collect();
                    let cmds: Vec<Vec<&str>> = args
                        .iter()
                        .map(|(d, m)| vec!["ZINCRBY", key.as_str(), d, m])
                        .collect();
                    if let Ok(rs) = c.try_pipeline(&cmds) {
                        for ((m, d), r) in batch.iter().zip(rs) {
                            assert!(!r.is_error(), "{r:?}");
                            acked[*m] += d;
                        }
                    }
                }
                acked
            }));
        }
    }
    hs
}

fn scores(r: &Reply) -> Vec<(String, i64)> {
    let mut v: Vec<(String, i64)> = r
        .as_array()
        .chunks(2)
        .map(|c| (c[0].as_str(), c[1].as_str().parse().unwrap()))
        .collect();
    v.sort();
    v
}

#[test]
fn leaderboard_increments_through_two_proxies_survive_a_fold_killed_midway() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-zset-crash");
    for (i, point) in ["fold-after-take", "fold-after-add"].iter().enumerate() {
        let key = format!("lb:crash{i}");
        let mut dying = proxy(&nodes, &rules, &[("SALTSHAKER_FAILPOINT", point)]);
        let mut other = proxy(&nodes, &rules, &[]);
        dying.client().cmd(&["ZINCRBY", &key, "5", "p0"]);
        promote(&dying, &key, 4);
        wait_in_force(&[&dying, &other], &key);
        let stop = Arc::new(AtomicBool::new(false));
        let hs = incrementers(&[&dying, &other], &key, 2, stop.clone());
        thread::sleep(Duration::from_millis(800));
        stop.store(true, Ordering::Relaxed);
        let mut acked = vec![0i64; 50];
        acked[0] = 5;
        for h in hs {
            for (m, d) in h.join().unwrap().into_iter().enumerate() {
                acked[m] += d;
            }
        }
        let mut want: Vec<(String, i64)> = acked
            .iter()
            .enumerate()
            .filter(|(_, d)| **d > 0)
            .map(|(m, d)| (format!("p{m}"), *d))
            .collect();
        want.sort();
        let all = |p: &Proxy| scores(&p.client().cmd(&["ZRANGE", &key, "0", "-1", "WITHSCORES"]));
        assert_eq!(all(&other), want, "merged read through the other proxy");
        other.kill();
        let next = crash_fold_and_take_over(&mut dying, &nodes, &rules, &key, point);
        // Mid-fold, the dead proxy's move half done: every score is counted exactly once.
        assert_eq!(all(&next), want, "mid-fold read after a crash at {point}");
        assert_eq!(
            next.client().cmd(&["ZSCORE", &key, "p0"]).as_str(),
            acked[0].to_string()
        );
        wait_folded(&next, &key);
        let base = owner(&nodes, &key);
        let got = scores(
            &nodes[base]
                .client()
                .cmd(&["ZRANGE", &key, "0", "-1", "WITHSCORES"]),
        );
        assert_eq!(got, want, "after a crash at {point}\n{}", next.stderr());
        assert!(
            next.stderr().contains("completing a fold move"),
            "{}",
            next.stderr()
        );
        assert!(shard_keys(&nodes).iter().all(|(_, k)| !k.ends_with(&key)));
    }
}

#[test]
fn leaderboard_reads_stay_exact_while_commands_fold_the_key_over_and_over() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-zset-live");
    let (a, b) = (proxy(&nodes, &rules, &[]), proxy(&nodes, &rules, &[]));
    let key = "lb:live";
    a.client().cmd(&["ZINCRBY", key, "1", "p0"]);
    promote(&a, key, 4);
    wait_in_force(&[&a, &b], key);
    let acked = Arc::new(std::sync::atomic::AtomicI64::new(1));
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (addr, acked, stop) = (a.addr(), acked.clone(), stop.clone());
        thread::spawn(move || {
            let mut c = Client::connect(&addr);
            while !stop.load(Ordering::Relaxed) {
                assert!(!c.cmd(&["ZINCRBY", key, "1", "p0"]).is_error());
                acked.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    // ZRANDMEMBER has no merge: each one moves every shard into the base key first.
    let folded = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let folder = {
        let (addr, stop, folded) = (a.addr(), stop.clone(), folded.clone());
        thread::spawn(move || {
            let mut c = Client::connect(&addr);
            while !stop.load(Ordering::Relaxed) {
                assert!(!c.cmd(&["ZRANDMEMBER", key]).is_error());
                folded.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let mut c = b.client();
    let mut last = 0i64;
    let mut reads = 0;
    // At least 3 s, and until the key was folded three times (each fold waits three
    // registry ticks, longer on a busy machine), within 20 s.
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(3)
        || (folded.load(Ordering::SeqCst) < 3 && started.elapsed() < Duration::from_secs(20))
    {
        let r = c.cmd(&["ZSCORE", key, "p0"]);
        let high = acked.load(Ordering::SeqCst) + 1;
        let v: i64 = r.as_str().parse().unwrap_or_else(|_| panic!("{r:?}"));
        assert!(v >= last, "a read went backwards: {v} after {last}");
        assert!(v <= high, "{v} above the {high} increments sent");
        let top = c.cmd(&["ZREVRANGE", key, "0", "0", "WITHSCORES"]);
        assert_eq!(top.as_array()[0].as_str(), "p0", "{top:?}");
        last = v;
        reads += 1;
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    folder.join().unwrap();
    let folds = folded.load(Ordering::SeqCst);
    assert!(folds >= 3 && reads > 20, "folds {folds}, reads {reads}");
    let total = acked.load(Ordering::SeqCst);
    assert_eq!(c.cmd(&["ZSCORE", key, "p0"]).as_str(), total.to_string());
}

#[test]
fn a_salted_key_expires_as_one_even_with_shards_created_after_its_expire() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-expire");
    let a = proxy(&nodes, &rules, &[]);
    let mut c = a.client();
    let key = "hll:daily";
    c.cmd(&["PFADD", key, "seed"]);
    promote(&a, key, 3);
    wait_in_force(&[&a], key);
    assert_eq!(c.cmd(&["EXPIRE", key, "3"]).as_int(), 1);
    // New elements land on shards that did not exist when EXPIRE ran.
    for i in 0..30 {
        c.cmd(&["PFADD", key, &format!("visitor:{i}")]);
    }
    assert_eq!(shard_keys(&nodes).len(), 3);
    wait_for(
        "every shard to take the key's expiry",
        Duration::from_secs(2),
        || {
            shard_keys(&nodes)
                .iter()
                .all(|(n, k)| nodes[*n].client().cmd(&["PTTL", k]).as_int() > 0)
        },
    );
    let ttl = c.cmd(&["TTL", key]).as_int();
    assert!((1..=3).contains(&ttl), "{ttl}");
    wait_for("the key to expire whole", Duration::from_secs(6), || {
        c.cmd(&["EXISTS", key]).as_int() == 0
    });
    assert!(shard_keys(&nodes).is_empty(), "{:?}", shard_keys(&nodes));
    assert_eq!(c.cmd(&["PFCOUNT", key]).as_int(), 0);
}

#[test]
fn hyperloglog_and_field_folds_killed_midway_lose_nothing() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-hll-crash");
    let reference_server = Redis::start();
    let mut reference = reference_server.client();
    for (key, point) in [
        ("hll:crash", "fold-after-add"),
        ("fh:crash", "fold-after-take"),
    ] {
        let mut dying = proxy(&nodes, &rules, &[("SALTSHAKER_FAILPOINT", point)]);
        let other = proxy(&nodes, &rules, &[]);
        let plain = format!("plain:{key}");
        let hll = key.starts_with("hll");
        let seed: Vec<&str> = if hll {
            vec!["PFADD", key, "seed"]
        } else {
            vec!["HINCRBY", key, "seed", "1"]
        };
        dying.client().cmd(&seed);
        let mut on_plain = seed.clone();
        on_plain[1] = &plain;
        reference.cmd(&on_plain);
        promote(&dying, key, 4);
        wait_in_force(&[&dying, &other], key);
        // Writes through both proxies, mirrored on the reference key.
        for (i, p) in [&dying, &other].iter().enumerate() {
            let mut c = p.client();
            for j in 0..400 {
                let (m, d) = (
                    format!("m{}", (i * 400 + j) % 600),
                    ((j % 5) + 1).to_string(),
                );
                let cmd: Vec<&str> = if hll {
                    vec!["PFADD", key, &m]
                } else {
                    vec!["HINCRBY", key, &m, &d]
                };
                assert!(!c.cmd(&cmd).is_error());
                let mut on_plain = cmd.clone();
                on_plain[1] = &plain;
                reference.cmd(&on_plain);
            }
        }
        let read = |c: &mut Client, k: &str| -> Vec<(String, String)> {
            if hll {
                return vec![(String::new(), c.cmd(&["PFCOUNT", k]).as_int().to_string())];
            }
            let mut v: Vec<(String, String)> = c
                .cmd(&["HGETALL", k])
                .pairs()
                .into_iter()
                .map(|(f, x)| (f, x.as_str()))
                .collect();
            v.sort();
            v
        };
        let want = read(&mut reference, &plain);
        drop(other);
        let next = crash_fold_and_take_over(&mut dying, &nodes, &rules, key, point);
        let mut c = next.client();
        if !hll {
            // Mid-fold, a move half done: every increment counted exactly once.
            assert_eq!(read(&mut c, key), want, "{key}: mid-fold after {point}");
        }
        wait_folded(&next, key);
        assert!(shard_keys(&nodes).iter().all(|(_, k)| !k.ends_with(key)));
        if !hll {
            assert!(
                next.stderr().contains("completing a fold move"),
                "{}",
                next.stderr()
            );
        }
        let base = owner(&nodes, key);
        assert_eq!(
            read(&mut nodes[base].client(), key),
            want,
            "{key}: the base key after a crash at {point}\n{}",
            next.stderr()
        );
    }
}

/// A set, HyperLogLog and sorted set pinned before they exist (a vote prepared in advance),
/// under a rule that allows every family: each is salted once its first write gives it a
/// type, with that type, and pipelines of 2000 writes are answered in full and promptly,
/// before and after the promotion takes effect.
#[test]
fn pinned_absent_keys_take_the_type_of_their_first_write_and_pipelines_never_stall() {
    need_redis();
    const PINS: &str = r#"version: 1
epoch_ms: 2000
defaults:
  write:
    salt: { families: [counters, hashes, sets, hyperloglogs, sorted_sets] }
rules:
  - { match: "ev:hll", pin: true, write: { strategy: salt, salt: { shards: 4 } } }
  - { match: "ev:set", pin: true, write: { strategy: salt, salt: { shards: 4 } } }
  - { match: "ev:lb", pin: true, write: { strategy: salt, salt: { shards: 4 } } }
"#;
    let dir = TempDir::new("pins");
    let path = dir.0.join("rules.yaml");
    std::fs::write(&path, PINS).unwrap();
    let nodes = pool(4);
    let p = proxy(&nodes, &path_str(&path), &[]);
    let mut c = p.client();
    c.set_read_timeout(Duration::from_secs(30));
    // Absent keys with several allowed families are not salted before they have a type.
    thread::sleep(Duration::from_millis(1500));
    for key in ["ev:hll", "ev:set", "ev:lb"] {
        assert!(
            salted(&p, key).is_none(),
            "{key} salted before it had a type"
        );
    }
    let batch = |c: &mut Client, from: usize| {
        let cmds: Vec<Vec<String>> = (from..from + 2000)
            .flat_map(|i| {
                [
                    vec!["PFADD".into(), "ev:hll".into(), format!("e{i}")],
                    vec!["SADD".into(), "ev:set".into(), format!("m{i}")],
                    vec![
                        "ZINCRBY".into(),
                        "ev:lb".into(),
                        "1".into(),
                        format!("p{}", i % 50),
                    ],
                ]
            })
            .collect();
        let t = std::time::Instant::now();
        let replies = c.pipeline(&cmds);
        let took = t.elapsed();
        assert!(
            replies.iter().all(|r| !r.is_error()),
            "errors: {:?}",
            replies
                .iter()
                .filter(|r| r.is_error())
                .take(3)
                .collect::<Vec<_>>()
        );
        assert!(
            took < Duration::from_secs(10),
            "6000 pipelined writes took {took:?}"
        );
    };
    batch(&mut c, 0);
    for (key, kind) in [("ev:hll", "hll"), ("ev:set", "set"), ("ev:lb", "zset")] {
        wait_in_force(&[&p], key);
        let e = salted(&p, key).unwrap();
        assert_eq!(e["kind"], kind, "{key}: {e}");
    }
    batch(&mut c, 2000);
    assert_eq!(c.cmd(&["SCARD", "ev:set"]).as_int(), 4000);
    let n = c.cmd(&["PFCOUNT", "ev:hll"]).as_int();
    assert!((3900..=4100).contains(&n), "PFCOUNT {n} of 4000");
    assert_eq!(c.cmd(&["ZCARD", "ev:lb"]).as_int(), 50);
    assert_eq!(c.cmd(&["ZSCORE", "ev:lb", "p7"]).as_str(), "80");
    assert!(shard_keys(&nodes).len() >= 8, "the writes reached shards");
}

/// A removal repeated in one pipeline on a salted key answers as Redis does: the first
/// HDEL (SREM, ZREM) of a member removes it, the second finds nothing. A pipeline's repeat
/// of the same read is answered from the first's merged reply; a removal is not a read,
/// and sharing its reply answered 1 twice (found by the differential test, seed 2).
#[test]
fn a_removal_repeated_in_one_pipeline_on_a_salted_key_answers_as_redis_does() {
    need_redis();
    let (nodes, _dir, rules) = setup("salt-removals");
    let a = proxy(&nodes, &rules, &[]);
    let reference_server = Redis::start();
    let mut reference = reference_server.client();
    let mut c = a.client();
    let keys = ["fh:del", "set:del", "lb:del"];
    for i in 0..8 {
        let m = format!("m{i}");
        for cmd in [
            vec!["HINCRBY", "fh:del", &m, "2"],
            vec!["SADD", "set:del", &m],
            vec!["ZINCRBY", "lb:del", "1", &m],
        ] {
            assert_eq!(c.cmd(&cmd), reference.cmd(&cmd), "{cmd:?}");
        }
    }
    for key in keys {
        promote(&a, key, 4);
    }
    for key in keys {
        wait_in_force(&[&a], key);
    }
    for i in 0..8 {
        let m = format!("m{i}");
        let cmds = [
            vec!["HDEL", "fh:del", &m],
            vec!["HDEL", "fh:del", &m],
            vec!["HEXISTS", "fh:del", &m],
            vec!["SREM", "set:del", &m],
            vec!["SREM", "set:del", &m],
            vec!["SISMEMBER", "set:del", &m],
            vec!["ZREM", "lb:del", &m],
            vec!["ZREM", "lb:del", &m],
            vec!["ZSCORE", "lb:del", &m],
        ];
        assert_eq!(c.pipeline(&cmds), reference.pipeline(&cmds), "member {m}");
    }
}

/// A pin that cancels a demotion already in force sends writers back to the shards at
/// once, while a proxy that has not heard of it yet still writes the base key. The other
/// proxy must not conclude that the base key is empty before that one has heard: its
/// ZINCRBY would then answer from the member's shard alone. Here proxy B is stopped
/// (SIGSTOP) from the instant the demotion is in force until after A has cancelled it
/// and had time to check the base key, and its first command after SIGCONT is a member
/// write, handled before B rereads the registry.
#[test]
fn a_cancelled_demotion_does_not_let_a_proxy_trust_an_empty_base_key_too_soon() {
    need_redis();
    let (nodes, _dir, rules) = setup("zcancel");
    let (a, b) = (proxy(&nodes, &rules, &[]), proxy(&nodes, &rules, &[]));
    let (mut ca, mut cb) = (a.client(), b.client());
    for round in 0..3 {
        let (key, m) = (format!("lb:cancel{round}"), format!("m{round}"));
        promote(&a, &key, 2);
        wait_in_force(&[&a, &b], &key);
        assert_eq!(ca.cmd(&["ZINCRBY", &key, "1", &m]).as_f64(), 1.0);
        // Let A find the base key empty (a check a tick after the promotion is in force).
        thread::sleep(Duration::from_millis(700));
        let (code, body) =
            a.admin_post(&format!("/hotkeys/demote?key={}", key.replace(':', "%3A")));
        assert_eq!(code, 200, "{body}");
        let mut demote_ms = 0;
        wait_for(
            "both proxies to know of the demotion",
            Duration::from_secs(5),
            || {
                [&a, &b].iter().all(|p| {
                    salted(p, &key).is_some_and(|e| {
                        demote_ms = e["demote_ms"].as_u64().unwrap_or(0);
                        demote_ms > 0
                    })
                })
            },
        );
        // Writers use the base key from demote_ms; the fold starts an epoch later.
        while now_ms() < demote_ms + 20 {
            thread::sleep(Duration::from_millis(5));
        }
        b.signal("STOP");
        promote(&a, &key, 2);
        thread::sleep(Duration::from_millis(300));
        cb.send_raw(&encode(&["ZINCRBY", &key, "5", &m]));
        b.signal("CONT");
        let via_b = cb.read_reply();
        assert_eq!(via_b.as_f64(), 6.0, "round {round}: through B");
        let via_a = ca.cmd(&["ZINCRBY", &key, "1", &m]);
        assert_eq!(
            via_a.as_f64(),
            7.0,
            "round {round}: A's ZINCRBY missed what B wrote to the base key"
        );
        assert_eq!(ca.cmd(&["ZSCORE", &key, &m]).as_f64(), 7.0);
    }
}

/// A proxy that has not read the registry for an epoch writes a member to the base key
/// (it might have missed a fold). The others ask a base key they found empty again each
/// epoch, so their ZINCRBY replies count that write from then on.
#[test]
fn a_base_key_written_by_a_proxy_blind_to_the_registry_is_counted_within_an_epoch() {
    need_redis();
    let (nodes, _dir, rules) = setup("zblind");
    let (a, b) = (proxy(&nodes, &rules, &[]), proxy(&nodes, &rules, &[]));
    let (mut ca, mut cb) = (a.client(), b.client());
    let key = "lb:blind";
    promote(&a, key, 2);
    wait_in_force(&[&a, &b], key);
    assert_eq!(ca.cmd(&["ZINCRBY", key, "1", "m"]).as_f64(), 1.0);
    thread::sleep(Duration::from_millis(500));
    // Stopped for longer than an epoch (1000 ms): its first command after SIGCONT is
    // handled before it rereads the registry, so it goes to the base key.
    b.signal("STOP");
    thread::sleep(Duration::from_millis(1300));
    cb.send_raw(&encode(&["ZINCRBY", key, "5", "m"]));
    b.signal("CONT");
    assert_eq!(cb.read_reply().as_f64(), 6.0, "through B");
    assert_eq!(
        ca.cmd(&["ZSCORE", key, "m"]).as_f64(),
        6.0,
        "reads count every part"
    );
    // An epoch and two ticks (100 ms each) later, A's writes count the base key again.
    thread::sleep(Duration::from_millis(1300));
    assert_eq!(ca.cmd(&["ZINCRBY", key, "1", "m"]).as_f64(), 7.0);
}
