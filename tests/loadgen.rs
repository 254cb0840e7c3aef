//! `saltshaker bench` against real redis-server processes: the generator sends exactly
//! what it reports, the backends' own command counts agree with it, and the viral key
//! receives its share.

mod support;

use std::time::Duration;

use saltshaker::loadgen::{run_blocking, BenchArgs, BenchError, Mix, Workload};
use support::*;

fn args(target: &str) -> BenchArgs {
    BenchArgs {
        target: target.to_string(),
        clients: 4,
        pipeline: 8,
        duration_ms: 60_000,
        keyspace: 1_000,
        ..BenchArgs::default()
    }
}

fn incr_only() -> Mix {
    Mix {
        get: 0,
        set: 0,
        incr: 1,
    }
}

#[test]
fn counted_run_answers_every_request_and_the_node_saw_exactly_those() {
    need_redis();
    let (a, b) = (Redis::start(), Redis::start());
    let r = run_blocking(BenchArgs {
        // Not a multiple of clients x pipeline: the last batches are partial.
        requests: Some(10_001),
        nodes: vec![a.addr(), b.addr()],
        ..args(&a.addr())
    })
    .expect("run");
    assert_eq!((r.ops, r.errors), (10_001, 0), "{}", r.to_text());
    assert!(r.failures.is_empty());
    assert_eq!(r.per_node[0].commands, 10_001, "{}", r.to_text());
    assert_eq!(r.per_node[1].commands, 0);
    assert_eq!(r.imbalance, Some(2.0));
    assert!(r.p50_us <= r.p99_us && r.p99_us <= r.p999_us && r.p999_us <= r.max_us);
    assert!(r.ops_per_sec > 0.0);
    // SET values are digits, so INCRs on keys SET earlier succeed: no error above.
    // Uniform over 1000 keys with SETs and INCRs: most keys were written.
    assert!(a.dbsize() > 500, "dbsize {}", a.dbsize());
}

#[test]
fn viral_key_gets_its_share_and_its_value_equals_the_reported_count() {
    need_redis();
    let node = Redis::start();
    let r = run_blocking(BenchArgs {
        requests: Some(20_000),
        workload: "viral:likes:1:0.3".parse().expect("workload"),
        mix: incr_only(),
        key_prefix: "k:".into(),
        ..args(&node.addr())
    })
    .expect("run");
    assert_eq!((r.ops, r.errors), (20_000, 0));
    let share = r.viral_ops as f64 / r.ops as f64;
    assert!((0.28..0.32).contains(&share), "viral share {share}");
    let value = node.client().cmd(&["GET", "likes:1"]).as_str();
    assert_eq!(value, r.viral_ops.to_string());
    // Every other INCR went to a prefixed key; together they add up to the whole run.
    let mut total: u64 = value.parse().expect("integer");
    for k in node.keys().iter().filter(|k| k.starts_with("k:")) {
        total += node
            .client()
            .cmd(&["GET", k])
            .as_str()
            .parse::<u64>()
            .expect("integer");
    }
    assert_eq!(total, 20_000);
}

#[test]
fn zipf_run_puts_the_most_load_on_key_zero() {
    need_redis();
    let node = Redis::start();
    let r = run_blocking(BenchArgs {
        requests: Some(20_000),
        workload: Workload::Zipf(1.1),
        mix: incr_only(),
        keyspace: 1_000_000,
        key_prefix: "z:".into(),
        ..args(&node.addr())
    })
    .expect("run");
    assert_eq!(r.errors, 0);
    let get = |k: &str| {
        node.client()
            .cmd(&["GET", k])
            .as_str()
            .parse::<f64>()
            .unwrap_or(0.0)
    };
    let (first, second) = (get("z:0"), get("z:1"));
    // Theory for s = 1.1 over 1e6 keys: 1/H = 12.4% of all ops on z:0, z:1 at 2^-1.1 of that.
    assert!((0.11..0.14).contains(&(first / 20_000.0)), "z:0 = {first}");
    assert!(
        (0.4..0.55).contains(&(second / first)),
        "z:1/z:0 = {}",
        second / first
    );
}

#[test]
fn duration_ends_the_run_and_rate_caps_it() {
    need_redis();
    let node = Redis::start();
    let r = run_blocking(BenchArgs {
        duration_ms: 600,
        rate: Some(5_000),
        pipeline: 4,
        nodes: vec![node.addr()],
        ..args(&node.addr())
    })
    .expect("run");
    assert!(
        r.elapsed >= Duration::from_millis(600) && r.elapsed < Duration::from_secs(3),
        "{:?}",
        r.elapsed
    );
    // 5000 ops/s for 0.6 s, plus at most one bucket of burst per client.
    assert!((2_400..=3_600).contains(&r.ops), "{}", r.to_text());
    assert_eq!(r.per_node[0].commands, r.ops);

    // A rate far below one batch per client per run: one batch each, then the deadline.
    let r = run_blocking(BenchArgs {
        duration_ms: 300,
        rate: Some(1),
        ..args(&node.addr())
    })
    .expect("run");
    assert_eq!(r.ops, 4 * 8);
    assert!(r.elapsed < Duration::from_millis(1_500), "{:?}", r.elapsed);
}

#[test]
fn node_dying_mid_run_is_reported_not_hung() {
    need_redis();
    let mut node = Redis::start();
    let addr = node.addr();
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            node.stop();
        });
        run_blocking(BenchArgs {
            duration_ms: 5_000,
            ..args(&addr)
        })
    })
    .expect("a partial report, not an error");
    assert!(r.ops > 0, "{}", r.to_text());
    assert_eq!(r.failures.len(), 4, "{}", r.to_text());
    assert!(r.errors > 0);
    assert!(r.elapsed < Duration::from_secs(4));
}

#[test]
fn unreachable_target_and_bad_arguments_are_errors() {
    let port = free_port();
    let target = format!("127.0.0.1:{port}");
    let e = run_blocking(args(&target)).expect_err("nothing listens");
    assert!(
        matches!(&e, BenchError::Node { node, what } if *node == target && what.contains("cannot connect")),
        "{e}"
    );
    for bad in [
        BenchArgs {
            clients: 0,
            ..args("127.0.0.1:1")
        },
        BenchArgs {
            duration_ms: 0,
            requests: None,
            ..args("127.0.0.1:1")
        },
        BenchArgs {
            keyspace: 0,
            ..args("127.0.0.1:1")
        },
    ] {
        assert!(run_blocking(bad).is_err());
    }
}
