//! The randomized differential test: seeded random command sequences (strings, counters,
//! hashes, sets, sorted sets, HyperLogLogs, expiry, MULTI, MGET, pipelines of mixed types)
//! run through two proxies over a 4-node pool and, in the same order, on one plain
//! redis-server, while their keys are promoted, pinned, demoted and folded under them
//! (short epochs, admin promotions and demotions, live rules reloads). Every reply must be
//! the reference's, except where the README says a reply differs: a salted counter write
//! answers an estimate of the whole, and a HyperLogLog counts within its error.
//!
//! `DIFF_SEED` picks the sequence (printed on failure), `DIFF_SECS` how long it runs
//! (default 60); `bench/differential.sh` runs it long.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::salting::*;
use support::*;

const RULES: &str = r#"version: 1
detection: { window_ms: 200 }
epoch_ms: 600
defaults:
  read: { hot_at_per_sec: 150, cool_below_per_sec: 40, cache: { enabled: true, ttl_ms: 2000 } }
  write: { hot_at_per_sec: 150, cool_below_per_sec: 40 }
rules:
  - match: "pin:c"
    pin: true
    write: { strategy: salt, salt: { shards: 4 } }
  - match: "c:*"
    write: { strategy: STRATEGY, combine: { window_us: 300 }, salt: { shards: 3 } }
  - match: "cc:*"
    write: { strategy: combine, combine: { window_us: 300 } }
  - match: "st:*"
    write: { strategy: salt, salt: { shards: 3, families: [sets] } }
  - match: "hl:*"
    write: { strategy: salt, salt: { shards: 3, families: [hyperloglogs] } }
  - match: "z:*"
    write: { strategy: salt, salt: { shards: 3, families: [sorted_sets] } }
  - match: "hf:*"
    write: { strategy: salt, salt: { shards: 3, families: [hashes], by: field } }
"#;

/// How a reply is compared with the reference's.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Cmp {
    Exact,
    /// The same elements in any order (SMEMBERS, HGETALL pairs).
    Unordered,
    /// A salted counter write: an estimate of the whole, so only its type must match.
    Estimate,
    /// A HyperLogLog count: within 3% (or 3) of the reference's.
    Approx,
    /// PFADD's "did a register change": per part on a salted key, so only its type.
    Type,
    /// TTL/PTTL: -2, -1 or positive, as the reference.
    Ttl,
}

const COUNTERS: &[&str] = &["c:0", "c:1", "c:2", "cc:0", "cc:1", "pin:c"];
const STRINGS: &[&str] = &["s:0", "s:1", "s:2"];
const HASHES: &[&str] = &["hf:0", "hf:1"];
const SETS: &[&str] = &["st:0", "st:1"];
const ZSETS: &[&str] = &["z:0", "z:1"];
const HLLS: &[&str] = &["hl:0", "hl:1"];

fn n(r: &mut Rng, lo: i64, hi: i64) -> String {
    (lo + r.next((hi - lo + 1) as u64) as i64).to_string()
}

/// The families a run draws from: `DIFF_ONLY=strings,zsets` narrows a failing seed down.
/// Each family owns a range of 0..100 (counters, strings, hashes, sets, zsets, hlls, multi).
fn families() -> Vec<(u64, u64)> {
    const RANGES: [(&str, u64, u64); 8] = [
        ("counters", 0, 30),
        ("strings", 30, 45),
        ("hashes", 45, 57),
        ("sets", 57, 70),
        ("zsets", 70, 85),
        ("hlls", 85, 95),
        ("multi", 95, 100),
        ("state", 100, 105),
    ];
    let only = std::env::var("DIFF_ONLY").unwrap_or_default();
    RANGES
        .iter()
        .filter(|(n, _, _)| only.is_empty() || only.split(',').any(|o| o == *n))
        .map(|&(_, lo, hi)| (lo, hi))
        .collect()
}

/// One random command and how to compare its reply.
fn command(r: &mut Rng, fams: &[(u64, u64)]) -> (Vec<String>, Cmp) {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let (lo, hi) = fams[r.next(fams.len() as u64) as usize];
    let family = lo + r.next(hi - lo);
    if family < 30 {
        let k = r.pick(COUNTERS);
        let salted_write = if k.starts_with("cc:") {
            Cmp::Exact
        } else {
            Cmp::Estimate
        };
        match r.next(20) {
            0..=5 => (s(&["INCR", k]), salted_write),
            6..=8 => (s(&["INCRBY", k, &n(r, -50, 50)]), salted_write),
            9 => (s(&["DECR", k]), salted_write),
            10..=15 => (s(&["GET", k]), Cmp::Exact),
            16 => (s(&["EXISTS", k]), Cmp::Exact),
            17 => (s(&["TTL", k]), Cmp::Ttl),
            18 => match r.next(4) {
                0 => (s(&["DEL", k]), Cmp::Exact),
                1 => (s(&["EXPIRE", k, "1000"]), Cmp::Exact),
                2 => (s(&["PERSIST", k]), Cmp::Exact),
                _ => (s(&["SET", k, &n(r, 0, 100)]), Cmp::Exact),
            },
            _ => (s(&["TYPE", k]), Cmp::Exact),
        }
    } else if family < 45 {
        let k = r.pick(STRINGS);
        match r.next(10) {
            0..=2 => (s(&["SET", k, &format!("v{}", r.next(1000))]), Cmp::Exact),
            3..=6 => (s(&["GET", k]), Cmp::Exact),
            7 => (s(&["APPEND", k, "x"]), Cmp::Exact),
            8 => (s(&["STRLEN", k]), Cmp::Exact),
            _ => {
                let (a, b) = (r.pick(STRINGS), r.pick(COUNTERS));
                (s(&["MGET", a, b, "nokey"]), Cmp::Exact)
            }
        }
    } else if family < 57 {
        let k = r.pick(HASHES);
        let f = format!("f{}", r.next(6));
        match r.next(12) {
            0..=4 => (s(&["HINCRBY", k, &f, &n(r, -5, 20)]), Cmp::Exact),
            5..=6 => (s(&["HGET", k, &f]), Cmp::Exact),
            7 => (s(&["HMGET", k, &f, "f1", "f9"]), Cmp::Exact),
            8 => (s(&["HGETALL", k]), Cmp::Unordered),
            9 => (s(&["HLEN", k]), Cmp::Exact),
            10 => (s(&["HEXISTS", k, &f]), Cmp::Exact),
            _ => (s(&["HDEL", k, &f]), Cmp::Exact),
        }
    } else if family < 70 {
        let k = r.pick(SETS);
        let m = format!("m{}", r.next(40));
        match r.next(10) {
            0..=3 => (s(&["SADD", k, &m]), Cmp::Exact),
            4 => (s(&["SREM", k, &m]), Cmp::Exact),
            5..=6 => (s(&["SISMEMBER", k, &m]), Cmp::Exact),
            7 => (s(&["SCARD", k]), Cmp::Exact),
            8 => (s(&["SMISMEMBER", k, &m, "m1", "zz"]), Cmp::Exact),
            _ => (s(&["SMEMBERS", k]), Cmp::Unordered),
        }
    } else if family < 85 {
        let k = r.pick(ZSETS);
        let m = format!("p{}", r.next(25));
        match r.next(10) {
            0..=3 => (s(&["ZINCRBY", k, &n(r, -3, 10), &m]), Cmp::Exact),
            4 => (s(&["ZSCORE", k, &m]), Cmp::Exact),
            5 => (s(&["ZCARD", k]), Cmp::Exact),
            6 => (s(&["ZRANGE", k, "0", "-1", "WITHSCORES"]), Cmp::Exact),
            7 => (s(&["ZREVRANGE", k, "0", "4", "WITHSCORES"]), Cmp::Exact),
            8 => (s(&["ZRANK", k, &m]), Cmp::Exact),
            _ => (s(&["ZREM", k, &m]), Cmp::Exact),
        }
    } else if family < 95 {
        let k = r.pick(HLLS);
        match r.next(4) {
            0..=2 => (s(&["PFADD", k, &format!("e{}", r.next(3000))]), Cmp::Type),
            _ => (s(&["PFCOUNT", k]), Cmp::Approx),
        }
    } else if family >= 100 {
        // Connection state changed inside a pipeline: each command after it sees it.
        let k = r.pick(STRINGS);
        (
            s(&["STATE-BLOCK", k, &format!("n{}", r.next(1000))]),
            Cmp::Exact,
        )
    } else {
        // A transaction on one key: inside MULTI a salted key is folded first.
        let k = r.pick(&["c:0", "cc:1", "s:1"]);
        (s(&["MULTI-BLOCK", k]), Cmp::Exact)
    }
}

fn same(cmp: Cmp, got: &Reply, want: &Reply) -> bool {
    match cmp {
        Cmp::Exact => got == want,
        Cmp::Unordered => got.sorted() == want.sorted(),
        Cmp::Estimate | Cmp::Type => {
            std::mem::discriminant(got) == std::mem::discriminant(want)
                && (!want.is_error() || got == want)
        }
        Cmp::Approx => {
            let (g, w) = (got.as_int(), want.as_int());
            (g - w).abs() as f64 <= (w as f64 * 0.03).max(3.0)
        }
        Cmp::Ttl => {
            let class = |r: &Reply| match r {
                Reply::Int(v) if *v > 0 => 1,
                Reply::Int(v) => *v,
                _ => i64::MIN,
            };
            class(got) == class(want)
        }
    }
}

/// Expands MULTI-BLOCK into the commands of one transaction, and STATE-BLOCK into
/// changes of the connection's state (SELECT, CLIENT SETNAME, HELLO) with commands that
/// see them, ending where it began (the reference is one connection, the proxies two).
fn expand(cmd: &[String]) -> Vec<Vec<String>> {
    let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<String>>();
    if cmd[0] == "STATE-BLOCK" {
        let (k, name) = (cmd[1].as_str(), cmd[2].as_str());
        return vec![
            v(&["CLIENT", "SETNAME", name]),
            v(&["SELECT", "0"]),
            v(&["HELLO", "3"]),
            v(&["GET", k]),
            v(&["CLIENT", "GETNAME"]),
            v(&["HELLO", "2"]),
            v(&["GET", k]),
            v(&["CLIENT", "SETNAME", ""]),
            v(&["CLIENT", "GETNAME"]),
        ];
    }
    if cmd[0] != "MULTI-BLOCK" {
        return vec![cmd.to_vec()];
    }
    let k = cmd[1].clone();
    let body = if k.starts_with("s:") {
        vec!["APPEND".into(), k.clone(), "t".into()]
    } else {
        vec!["INCR".into(), k.clone()]
    };
    vec![
        vec!["MULTI".into()],
        body,
        vec!["GET".into(), k],
        vec!["EXEC".into()],
    ]
}

fn metric_sum(p: &Proxy, name: &str) -> f64 {
    p.admin_get("/metrics")
        .1
        .lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn random_sequences_through_two_proxies_match_redis_while_keys_are_salted_and_folded() {
    need_redis();
    let seed: u64 = std::env::var("DIFF_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5a17_5ba4);
    let secs: u64 = std::env::var("DIFF_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    eprintln!("differential: seed {seed}, {secs} s (DIFF_SEED={seed} to repeat)");
    let dir = TempDir::new("diff");
    let rules = dir.0.join("rules.yaml");
    std::fs::write(&rules, RULES.replace("STRATEGY", "salt")).unwrap();
    let nodes = pool(4);
    let rules_arg = path_str(&rules);
    // The second proxy runs two workers: their commands to a node are gathered on shared
    // connections (backend/wire.rs), with the salt coordinator's and the folds'.
    let (a, b) = (
        proxy(&nodes, &rules_arg, &[]),
        Proxy::start_env(
            &nodes.iter().collect::<Vec<_>>(),
            &["--rules", &rules_arg, "--threads", "2"],
            &[],
        ),
    );
    let reference = Redis::start();
    let mut refc = reference.client();
    let mut clients = [a.client(), b.client()];
    for c in clients.iter_mut() {
        c.set_read_timeout(Duration::from_secs(20));
    }

    // Churn: admin promotions and demotions of random keys, and live rules reloads that
    // move the c:* counters between salt, salt+combine and combine and drop the pin.
    let stop = Arc::new(AtomicBool::new(false));
    // DIFF_CHURN=admin or =reload keeps one kind of churn (narrowing a failure down).
    let kinds = std::env::var("DIFF_CHURN").unwrap_or_else(|_| "admin,reload".into());
    let (churn_admin, churn_reload) = (kinds.contains("admin"), kinds.contains("reload"));
    let churn = {
        let (stop, a_admin, b_admin) = (stop.clone(), a.admin_addr(), b.admin_addr());
        let rules = rules.clone();
        thread::spawn(move || {
            let mut r = Rng(seed ^ 0x9e37_79b9);
            let mut reloads = 0u64;
            let mut admin = 0u64;
            let keys = [
                "c:0", "c:1", "c:2", "st:0", "st:1", "z:0", "z:1", "hf:0", "hl:0",
            ];
            let mut last_reload = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(400 + r.next(600)));
                let addr = if r.next(2) == 0 { &a_admin } else { &b_admin };
                let key = keys[r.next(keys.len() as u64) as usize].replace(':', "%3A");
                let path = if r.next(3) == 0 {
                    format!("/hotkeys/demote?key={key}")
                } else {
                    format!("/hotkeys/promote?key={key}&shards={}", 2 + r.next(3))
                };
                if churn_admin {
                    let _ = http_request(addr, "POST", &path);
                    admin += 1;
                }
                if churn_reload && last_reload.elapsed() > Duration::from_secs(3) {
                    let strategy = ["salt", "salt+combine", "combine"][r.next(3) as usize];
                    let mut text = RULES.replace("STRATEGY", strategy);
                    if r.next(2) == 0 {
                        text = text.replace("    pin: true\n", "");
                    }
                    std::fs::write(&rules, text).unwrap();
                    reloads += 1;
                    last_reload = Instant::now();
                }
            }
            (reloads, admin)
        })
    };

    let mut r = Rng(seed);
    let fams = families();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let (mut sent, mut loose, mut step) = (0u64, 0u64, 0u64);
    let mut wrong: Vec<String> = Vec::new();
    let mut by_cmp: BTreeMap<String, u64> = BTreeMap::new();
    // The last commands on each key, shown with a mismatch.
    let mut history: BTreeMap<String, Vec<String>> = BTreeMap::new();
    while Instant::now() < deadline && wrong.len() < 10 {
        step += 1;
        let which = r.next(2) as usize;
        let deep = r.next(4) == 0;
        let len = 1 + r.next(if deep { 30 } else { 4 }) as usize;
        let mut batch: Vec<Vec<String>> = Vec::new();
        let mut cmps: Vec<Cmp> = Vec::new();
        for _ in 0..len {
            let (cmd, cmp) = command(&mut r, &fams);
            for c in expand(&cmd) {
                batch.push(c);
                cmps.push(cmp);
            }
        }
        let want = refc.pipeline(&batch);
        let got = clients[which].pipeline(&batch);
        sent += batch.len() as u64;
        for i in 0..batch.len() {
            *by_cmp.entry(format!("{:?}", cmps[i])).or_default() += 1;
            let exec = batch[i][0] == "EXEC";
            let ok = if batch[i][0] == "HELLO" {
                // The proxy answers HELLO with its own server fields: the same shape.
                same(Cmp::Type, &got[i], &want[i])
            } else if exec {
                // EXEC's array holds the transaction's replies: compare its elements with
                // the same rules as the commands (an INCR inside may be an estimate only if
                // the key was not folded, which MULTI always does).
                got[i] == want[i]
            } else {
                same(cmps[i], &got[i], &want[i])
            };
            let key = batch[i].get(1).cloned().unwrap_or_default();
            if !ok {
                let past = history
                    .get(&key)
                    .map(|h| h.join("\n    "))
                    .unwrap_or_default();
                let on_nodes: Vec<String> = nodes
                    .iter()
                    .map(|n| format!("{:?}", n.client().cmd(&["GET", &key])))
                    .collect();
                let past = format!("{past}\n    on the nodes now: {on_nodes:?}");
                wrong.push(format!(
                    "step {step}, proxy {}, {:?}: got {:?}, redis {:?}; before it on {key}:\n    {past}",
                    ["a", "b"][which],
                    batch[i],
                    got[i],
                    want[i]
                ));
            } else if got[i] != want[i] {
                loose += 1;
            }
            let h = history.entry(key).or_default();
            h.push(format!(
                "step {step} {} {:?} -> {:?} (redis {:?})",
                ["a", "b"][which],
                batch[i],
                got[i],
                want[i]
            ));
            if h.len() > 8 {
                h.remove(0);
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let (reloads, admin) = churn.join().unwrap();
    // Once everything is demoted and folded, every key reads as in the reference.
    let promotions = metric_sum(&a, "saltshaker_salt_promotions_total")
        + metric_sum(&b, "saltshaker_salt_promotions_total");
    let folds = metric_sum(&a, "saltshaker_salt_folds_total")
        + metric_sum(&b, "saltshaker_salt_folds_total");
    eprintln!(
        "differential: seed {seed}: {sent} commands in {step} pipelines, {loose} within the \
         documented differences, {promotions} promotions, {folds} folds, {admin} admin \
         promotions/demotions, {reloads} rules reloads; by comparison: {by_cmp:?}"
    );
    assert!(
        wrong.is_empty(),
        "seed {seed}: {} replies differ from redis-server (DIFF_SEED={seed} repeats):\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    for k in COUNTERS.iter().chain(STRINGS) {
        let want = refc.cmd(&["GET", k]);
        let got = clients[0].cmd(&["GET", k]);
        assert_eq!(got, want, "seed {seed}: final GET {k}");
    }
    for k in SETS {
        assert_eq!(
            clients[1].cmd(&["SMEMBERS", k]).sorted(),
            refc.cmd(&["SMEMBERS", k]).sorted(),
            "seed {seed}: final SMEMBERS {k}"
        );
    }
    for k in ZSETS {
        assert_eq!(
            clients[0].cmd(&["ZRANGE", k, "0", "-1", "WITHSCORES"]),
            refc.cmd(&["ZRANGE", k, "0", "-1", "WITHSCORES"]),
            "seed {seed}: final ZRANGE {k}"
        );
    }
    for k in HASHES {
        assert_eq!(
            clients[1].cmd(&["HGETALL", k]).sorted(),
            refc.cmd(&["HGETALL", k]).sorted(),
            "seed {seed}: final HGETALL {k}"
        );
    }
    assert!(
        promotions > 0.0,
        "nothing was promoted: the test did not exercise salting"
    );
}
