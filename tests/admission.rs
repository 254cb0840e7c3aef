//! Admission control against real redis-server nodes and real proxies: a per-key limit held
//! over 10 s, a sampled counter that stays close to what was offered, a global limit shared
//! unevenly by two proxies (one restarted mid-run), the registry lost mid-run, a limit
//! changed by a live reload under load, and low-priority keys shed by an overloaded node.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use support::*;

/// What a paced client saw: commands answered OK, refused with THROTTLED, anything else.
#[derive(Default, Debug, Clone, Copy)]
struct Seen {
    ok: u64,
    throttled: u64,
    other: u64,
}

/// Sends `INCR key` at about `per_sec` (a pipeline every 10 ms) on one connection until
/// `stop`, counting replies.
fn offer(
    addr: String,
    key: String,
    per_sec: u64,
    stop: Arc<AtomicBool>,
) -> thread::JoinHandle<Seen> {
    thread::spawn(move || {
        let mut c = Client::connect(&addr);
        let mut seen = Seen::default();
        let start = Instant::now();
        let mut sent = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let due = (start.elapsed().as_secs_f64() * per_sec as f64) as u64;
            let n = due.saturating_sub(sent).min(500);
            if n > 0 {
                let cmds: Vec<[&str; 2]> = (0..n).map(|_| ["INCR", key.as_str()]).collect();
                for r in c.pipeline(&cmds) {
                    match r {
                        Reply::Int(_) => seen.ok += 1,
                        Reply::Error(e) if e.starts_with("THROTTLED ") => seen.throttled += 1,
                        other => {
                            seen.other += 1;
                            eprintln!("unexpected reply {other:?}");
                        }
                    }
                }
                sent += n;
            }
            thread::sleep(Duration::from_millis(10));
        }
        seen
    })
}

fn with_rules(nodes: &[&Redis], dir: &TempDir, rules: &str, extra: &[&str]) -> Proxy {
    let path = dir.0.join("rules.yaml");
    std::fs::write(&path, rules).unwrap();
    let p = path_str(&path);
    let mut args = vec!["--rules", p.as_str()];
    args.extend_from_slice(extra);
    Proxy::start(nodes, &args)
}

fn int(r: Reply) -> i64 {
    match r {
        Reply::Int(n) => n,
        Reply::Bulk(Some(b)) => String::from_utf8_lossy(&b).parse().unwrap_or(-1),
        Reply::Bulk(None) => 0,
        r => panic!("{r:?}"),
    }
}

#[test]
fn a_per_key_limit_holds_within_10_pct_over_10_s_and_the_count_is_exact() {
    need_redis();
    let node = Redis::start();
    let dir = TempDir::new("admit-limit");
    let rules = "version: 1\nrules:\n  - match: \"quota:*\"\n    admit: { limit_per_sec: 300, burst: 30 }\n";
    let proxy = with_rules(&[&node], &dir, rules, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let t = offer(proxy.addr(), "quota:a".into(), 1000, stop.clone());
    // A key of its own keeps its own bucket, and an unlimited key is never refused.
    let u = offer(proxy.addr(), "free:a".into(), 1000, stop.clone());
    thread::sleep(Duration::from_secs(10));
    stop.store(true, Ordering::Relaxed);
    let (s, f) = (t.join().unwrap(), u.join().unwrap());
    let rate = s.ok as f64 / 10.0;
    assert!(
        (270.0..=330.0).contains(&rate),
        "admitted {rate}/s for a 300/s limit: {s:?}"
    );
    assert!(s.throttled > 5000, "{s:?}");
    assert_eq!((s.other, f.other, f.throttled), (0, 0, 0), "{s:?} {f:?}");
    // Exactly the admitted increments reached the node.
    assert_eq!(int(node.client().cmd(&["GET", "quota:a"])), s.ok as i64);
    assert_eq!(admission_count(&proxy, "rejected") as u64, s.throttled);
    assert_eq!(admission_count(&proxy, "admitted") as u64, s.ok);
    assert!(proxy.admin_get("/metrics").1.contains("rule=\"quota:*\""));
}

#[test]
fn a_sampled_counter_stays_within_3_pct_of_what_was_offered() {
    need_redis();
    let node = Redis::start();
    let dir = TempDir::new("admit-sample");
    let rules = "version: 1\nrules:\n  - match: \"views:*\"\n    admit: { limit_per_sec: 100, burst: 10, over_limit: sample, sample_one_in: 10 }\n";
    let proxy = with_rules(&[&node], &dir, rules, &[]);
    let mut c = proxy.client();
    let mut last = 0;
    let mut offered = 0;
    for _ in 0..200 {
        let cmds: Vec<[&str; 2]> = (0..100).map(|_| ["INCR", "views:v"]).collect();
        for r in c.pipeline(&cmds) {
            let v = int(r);
            // Each reply is a value the key held: never below an earlier one on this client.
            assert!(v >= last, "{v} after {last}");
            last = v;
        }
        offered += 100;
    }
    let held = int(node.client().cmd(&["GET", "views:v"]));
    let err = (held - offered).abs() as f64 / offered as f64;
    assert!(
        err <= 0.03,
        "the key holds {held} after {offered} increments"
    );
    // Most of them were not sent one by one.
    let sent = node.client().cmd(&["INFO", "commandstats"]);
    let stats = sent.as_str().to_string();
    let calls = |cmd: &str| {
        stats
            .lines()
            .find(|l| l.starts_with(&format!("cmdstat_{cmd}:")))
            .and_then(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .unwrap_or(0)
    };
    let n = calls("incr") + calls("incrby");
    assert!(
        n < offered as u64 / 4,
        "{n} increments reached the node for {offered}"
    );
    assert!(proxy.metric("saltshaker_admission_total") >= offered as f64);
}

/// A global limit of 400/s: proxy A is offered 1200/s, proxy B 100/s.
const GLOBAL: &str = "version: 1\nrules:\n  - match: \"api:*\"\n    admit: { limit_per_sec: 400, burst: 40, scope: global, sync_ms: 500 }\n";

#[test]
fn a_global_limit_is_shared_by_two_proxies_by_demand_and_survives_a_restart() {
    need_redis();
    let node = Redis::start();
    let (da, db) = (TempDir::new("admit-ga"), TempDir::new("admit-gb"));
    let a = with_rules(&[&node], &da, GLOBAL, &[]);
    let mut b = with_rules(&[&node], &db, GLOBAL, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let ta = offer(a.addr(), "api:k".into(), 1200, stop.clone());
    let tb = offer(b.addr(), "api:k".into(), 100, stop.clone());
    // Let the shares settle, then measure 6 s.
    thread::sleep(Duration::from_secs(2));
    let base = int(node.client().cmd(&["GET", "api:k"]));
    thread::sleep(Duration::from_secs(6));
    let held = int(node.client().cmd(&["GET", "api:k"])) - base;
    let total = held as f64 / 6.0;
    assert!(
        (380.0..=420.0).contains(&total),
        "{total}/s over both proxies for a 400/s limit"
    );
    stop.store(true, Ordering::Relaxed);
    let (sa, sb) = (ta.join().unwrap(), tb.join().unwrap());
    // The quiet proxy got what it asked for; the busy one the rest.
    // (Its first interval runs on the start share, 5% of the limit.)
    assert!(
        sb.throttled * 10 < sb.ok,
        "quiet proxy refused too often: {sb:?}"
    );
    assert!(sa.ok > 3 * sb.ok, "busy {sa:?} quiet {sb:?}");
    assert_eq!(sa.other + sb.other, 0);

    // B restarts (a new process, a new name in the registry) and is offered 1200/s at once:
    // it starts from a small share, and the fleet stays near its limit.
    b.kill();
    let b2 = with_rules(&[&node], &db, GLOBAL, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let ta = offer(a.addr(), "api:k".into(), 1200, stop.clone());
    let tb = offer(b2.addr(), "api:k".into(), 1200, stop.clone());
    thread::sleep(Duration::from_millis(400));
    let early = admission_count(&b2, "admitted");
    let base = int(node.client().cmd(&["GET", "api:k"]));
    thread::sleep(Duration::from_secs(5));
    let held = int(node.client().cmd(&["GET", "api:k"])) - base;
    stop.store(true, Ordering::Relaxed);
    let (sa, sb) = (ta.join().unwrap(), tb.join().unwrap());
    let total = held as f64 / 5.0;
    assert!(
        (360.0..=440.0).contains(&total),
        "{total}/s after the restart"
    );
    // In its first 400 ms the new proxy admitted about 5% of the limit, not all of it.
    assert!(
        early <= 80.0,
        "restarted proxy admitted {early} in its first 400 ms"
    );
    // Both busy now: about half each.
    assert!(sb.ok * 3 > sa.ok, "a {sa:?} b {sb:?}");
}

/// `saltshaker_admission_total` for one result, summed over rules.
fn admission_count(p: &Proxy, result: &str) -> f64 {
    let m = p.admin_get("/metrics").1;
    m.lines()
        .filter(|l| {
            l.starts_with("saltshaker_admission_total{")
                && l.contains(&format!("result=\"{result}\""))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn losing_the_registry_falls_back_to_limit_over_proxies_and_says_so() {
    need_redis();
    let mut nodes = pool(2);
    let dir = TempDir::new("admit-reg");
    let rules = "version: 1\nrules:\n  - match: \"api:*\"\n    admit: { limit_per_sec: 400, burst: 40, scope: global, sync_ms: 300, proxies: 2 }\n";
    let proxy = with_rules(&[&nodes[0], &nodes[1]], &dir, rules, &[]);
    // Find the registry node (it holds the allocation hash after a sync) and a key that
    // lives on the other node.
    let mut c = proxy.client();
    let keys = spread_keys("api", 16);
    for k in &keys {
        let r = c.cmd(&["INCR", k]);
        assert!(matches!(r, Reply::Int(1)), "{r:?}");
    }
    let hash = format!("{{saltshaker:registry}}:admit:{}", keys[0]);
    let mut reg = None;
    assert!(wait_until(Duration::from_secs(5), || {
        reg = (0..2).find(|&i| int(nodes[i].client().cmd(&["EXISTS", hash.as_str()])) == 1);
        reg.is_some()
    }));
    let reg = reg.unwrap();
    let other = 1 - reg;
    let key = keys
        .iter()
        .find(|k| int(nodes[other].client().cmd(&["EXISTS", k.as_str()])) == 1)
        .unwrap_or_else(|| panic!("no key on node {other}; registry on {reg}"))
        .clone();
    let stop = Arc::new(AtomicBool::new(false));
    let t = offer(proxy.addr(), key.clone(), 1000, stop.clone());
    thread::sleep(Duration::from_secs(2));
    nodes[reg].stop();
    assert!(wait_until(Duration::from_secs(5), || proxy
        .metric("saltshaker_admission_global_fallback")
        == 1.0));
    thread::sleep(Duration::from_millis(500));
    let base = int(nodes[other].client().cmd(&["GET", &key]));
    thread::sleep(Duration::from_secs(4));
    let held = int(nodes[other].client().cmd(&["GET", &key])) - base;
    stop.store(true, Ordering::Relaxed);
    let s = t.join().unwrap();
    let rate = held as f64 / 4.0;
    // limit / proxies = 200/s.
    assert!(
        (170.0..=230.0).contains(&rate),
        "{rate}/s on the fallback: {s:?}"
    );
    assert!(
        proxy.stderr().contains("registry unreachable"),
        "{}",
        proxy.stderr()
    );
    let m = proxy.admin_get("/metrics").1;
    assert!(
        m.lines().any(|l| l
            .starts_with("saltshaker_admission_global_syncs_total{result=\"failed\"}")
            && !l.ends_with(" 0")),
        "{m}"
    );
    assert_eq!(s.other, 0, "{s:?}");
}

#[test]
fn a_reload_changes_a_limit_under_load_without_dropping_a_connection() {
    need_redis();
    let node = Redis::start();
    let dir = TempDir::new("admit-reload");
    let rule = |n: u32| {
        format!("version: 1\nrules:\n  - match: \"q:*\"\n    admit: {{ limit_per_sec: {n}, burst: 10 }}\n")
    };
    let proxy = with_rules(&[&node], &dir, &rule(100), &[]);
    // The start-up check's connection is counted once the proxy has accepted it.
    assert!(wait_until(Duration::from_secs(5), || proxy
        .metric("saltshaker_client_connections_accepted_total")
        >= 1.0));
    let accepted = proxy.metric("saltshaker_client_connections_accepted_total");
    let stop = Arc::new(AtomicBool::new(false));
    let t = offer(proxy.addr(), "q:r".into(), 1000, stop.clone());
    thread::sleep(Duration::from_secs(2));
    let gen = proxy.metric("saltshaker_rules_generation");
    std::fs::write(dir.0.join("rules.yaml"), rule(400)).unwrap();
    assert!(wait_until(Duration::from_secs(5), || proxy
        .metric("saltshaker_rules_generation")
        > gen));
    thread::sleep(Duration::from_millis(300));
    let base = int(node.client().cmd(&["GET", "q:r"]));
    thread::sleep(Duration::from_secs(3));
    let held = int(node.client().cmd(&["GET", "q:r"])) - base;
    stop.store(true, Ordering::Relaxed);
    // The client thread panics if its connection drops; it ran to the end.
    let s = t.join().expect("client kept its connection");
    let rate = held as f64 / 3.0;
    assert!(
        (340.0..=460.0).contains(&rate),
        "{rate}/s after raising the limit to 400/s"
    );
    assert_eq!(s.other, 0, "{s:?}");
    // One client connection over the whole run: the reload dropped none.
    assert_eq!(
        proxy.metric("saltshaker_client_connections_accepted_total"),
        accepted + 1.0
    );
}

#[test]
fn an_overloaded_node_sheds_low_priority_keys_and_serves_high_ones() {
    need_redis();
    let node = Redis::start();
    let dir = TempDir::new("admit-shed");
    let rules = "version: 1\nadmission: { shed_low_at_pending: 50, shed_normal_at_pending: 100000 }\nrules:\n  - match: \"views:*\"\n    admit: { priority: low }\n  - match: \"likes:*\"\n    admit: { priority: high }\n";
    let proxy = with_rules(&[&node], &dir, rules, &["--request-timeout-ms", "5000"]);
    // Freeze the node for a second; meanwhile 200 high-priority increments queue up.
    node.client().cmd(&["CLIENT", "PAUSE", "1500", "ALL"]);
    let addr = proxy.addr();
    let high = thread::spawn(move || {
        let mut c = Client::connect(&addr);
        let cmds: Vec<[&str; 2]> = (0..200).map(|_| ["INCR", "likes:1"]).collect();
        c.pipeline(&cmds)
    });
    thread::sleep(Duration::from_millis(300));
    let mut c = proxy.client();
    let t0 = Instant::now();
    let low = c.cmd(&["INCR", "views:1"]);
    let took = t0.elapsed();
    match &low {
        Reply::Error(e) => assert!(
            e.starts_with("THROTTLED ") && e.contains("overloaded"),
            "{e}"
        ),
        r => panic!("low-priority key served by a frozen node: {r:?}"),
    }
    assert!(
        took < Duration::from_millis(500),
        "the refusal took {took:?}"
    );
    let replies = high.join().unwrap();
    let ok = replies
        .iter()
        .filter(|r| matches!(r, Reply::Int(_)))
        .count();
    assert!(
        ok * 100 >= replies.len() * 99,
        "{ok} of {} high-priority increments served",
        replies.len()
    );
    // Once the node has caught up, low-priority keys are served again.
    assert!(wait_until(Duration::from_secs(3), || matches!(
        c.cmd(&["INCR", "views:1"]),
        Reply::Int(_)
    )));
    assert!(proxy.metric("saltshaker_admission_total") > 0.0);
}
