//! Real clients against the proxy: `redis-cli` (one-shot, `--pipe`, RESP3) and
//! `redis-benchmark` through a four-node pool, checking what lands on the nodes.

mod support;

use std::io::Write;
use std::process::{Command, Stdio};
use support::*;

/// Fails the test, naming the tool, when a real client is missing.
fn tools() -> bool {
    need_redis();
    need_tool("redis-cli");
    need_tool("redis-benchmark");
    true
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli");
    assert!(
        out.status.success(),
        "redis-cli {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).to_string()
}

#[test]
fn redis_cli_one_shot_commands_print_what_redis_prints() {
    if !tools() {
        return;
    }
    let node = Redis::start();
    let reference = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    assert_eq!(cli(proxy.port, &["SET", "a", "b"]), "OK\n");
    assert_eq!(cli(proxy.port, &["GET", "a"]), "b\n");
    assert_eq!(node.client().cmd(&["GET", "a"]), Reply::bulk("b"));
    for args in [
        &["SET", "a", "b"][..],
        &["INCR", "n"],
        &["RPUSH", "l", "x", "y", "z"],
        &["LRANGE", "l", "0", "-1"],
        &["HSET", "h", "f1", "v1", "f2", "v2"],
        &["HGETALL", "h"],
        &["GET", "missing"],
        &["NOSUCHCOMMAND"],
        &["--no-raw", "LRANGE", "l", "0", "-1"],
        &["--no-raw", "HGETALL", "h"],
        &["-3", "HGETALL", "h"],
        &["-3", "--no-raw", "HGETALL", "h"],
        &["-3", "SMEMBERS", "nothing"],
        &["-3", "GET", "missing"],
    ] {
        assert_eq!(
            cli(proxy.port, args),
            cli(reference.port, args),
            "redis-cli {args:?}"
        );
    }
}

#[test]
fn redis_cli_pipe_mode_loads_thousands_of_commands_into_a_pool() {
    if !tools() {
        return;
    }
    let nodes = pool(4);
    let refs: Vec<&Redis> = nodes.iter().collect();
    let proxy = Proxy::start(&refs, &[]);
    let n = 5000;
    let mut input = Vec::new();
    let keys = spread_keys("pipe", n);
    for (i, k) in keys.iter().enumerate() {
        input.extend(encode(&["SET", k, &format!("value-{i}")]));
    }
    input.extend(encode(&["INCRBY", "pipe:counter", "7"]));
    let mut child = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &proxy.port.to_string(), "--pipe"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn redis-cli --pipe");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&input)
        .expect("feed redis-cli");
    let out = child.wait_with_output().expect("redis-cli --pipe");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "redis-cli --pipe failed:\n{text}");
    assert!(
        text.contains(&format!("errors: 0, replies: {}", n + 1)),
        "redis-cli --pipe:\n{text}"
    );
    let sizes: Vec<i64> = nodes.iter().map(|n| n.dbsize()).collect();
    assert_eq!(
        sizes.iter().sum::<i64>(),
        n as i64 + 1,
        "keys on the nodes: {sizes:?}"
    );
    assert!(
        sizes.iter().all(|&s| s > 0),
        "a node got no keys: {sizes:?}"
    );
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["GET", &keys[4321]]), Reply::bulk("value-4321"));
    assert_eq!(c.cmd(&["GET", "pipe:counter"]), Reply::bulk("7"));
}

fn bench(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run redis-benchmark");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "redis-benchmark {args:?} failed:\n{stdout}\n{stderr}"
    );
    // redis-benchmark asks for CONFIG at start; a proxy may refuse that, which it tolerates.
    let errors: Vec<&str> = stdout
        .lines()
        .chain(stderr.lines())
        .filter(|l| l.contains("rror") || l.contains("ERR"))
        .filter(|l| !l.contains("Could not fetch server CONFIG"))
        .collect();
    assert!(
        errors.is_empty(),
        "redis-benchmark {args:?} reported errors:\n{}",
        errors.join("\n")
    );
    stdout
}

#[test]
fn redis_benchmark_runs_clean_through_a_pool() {
    if !tools() {
        return;
    }
    let nodes = pool(4);
    let refs: Vec<&Redis> = nodes.iter().collect();
    let proxy = Proxy::start(&refs, &[]);
    // redis-benchmark 7.0 has no built-in MGET test: MSET here, MGET as a custom command below.
    let out = bench(
        proxy.port,
        &[
            "-t",
            "get,set,incr,lpush,mset",
            "-n",
            "20000",
            "-P",
            "16",
            "-q",
            "-r",
            "1000",
        ],
    );
    for test in ["SET", "GET", "INCR", "LPUSH", "MSET"] {
        assert!(
            out.lines()
                .any(|l| l.trim_start().starts_with(test) && l.contains("requests per second")),
            "no result line for {test}:\n{out}"
        );
    }
    let mget = [
        "MGET",
        "key:__rand_int__",
        "key:__rand_int__",
        "key:__rand_int__",
        "key:__rand_int__",
    ];
    let mut args = vec!["-n", "20000", "-P", "16", "-q", "-r", "1000"];
    args.extend(mget);
    let out = bench(proxy.port, &args);
    assert!(out.contains("requests per second"), "MGET run:\n{out}");

    // Nothing lost: every INCR and LPUSH is on the nodes.
    // redis-benchmark's names ("key:000000000123") differ only in their last digits, and
    // fnv1a_64 keeps 32 bits, so how many land on each node depends on the nodes' ports: a
    // node may hold none. What must hold is that each name is on exactly one node.
    let mut counters = 0i64;
    let mut lists = Vec::new();
    let mut names = std::collections::HashMap::new();
    for (i, node) in nodes.iter().enumerate() {
        let mut c = node.client();
        let keys = node.keys();
        for k in keys.iter().filter(|k| k.starts_with("key:")) {
            if let Some(j) = names.insert(k.clone(), i) {
                panic!("{k} is on nodes {j} and {i}");
            }
        }
        for k in keys.iter().filter(|k| k.starts_with("counter:")) {
            counters += c.cmd(&["GET", k]).as_int();
        }
        if c.cmd(&["EXISTS", "mylist"]).as_int() == 1 {
            lists.push(c.cmd(&["LLEN", "mylist"]).as_int());
        }
    }
    // 20000 SETs over 1000 names miss one with odds near 1000 * e^-20.
    assert_eq!(names.len(), 1000, "key:* names over the nodes");
    assert_eq!(
        counters, 20000,
        "sum of counter:* over the nodes after 20000 INCRs"
    );
    assert_eq!(
        lists,
        vec![20000],
        "mylist: on exactly one node, with every LPUSH"
    );
    let total: i64 = nodes.iter().map(|n| n.dbsize()).sum();
    assert_eq!(proxy.client().cmd(&["DBSIZE"]), Reply::Int(total));
}
