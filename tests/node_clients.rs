//! node-redis (npm `redis`, version pinned in tests/node/package.json) through the proxy,
//! against a real redis-server: its client-side cache (`clientSideCache`, RESP3 tracking)
//! connects, serves repeated reads from the application's own memory, and sees a write
//! made on the node directly. The same script runs against the node directly first, so a
//! difference is the proxy's.

mod support;

use std::path::Path;
use std::process::Command;
use support::*;

/// Installs the pinned node-redis into tests/node once (the test installs what it needs,
/// so it never skips).
fn node_redis() -> &'static Path {
    need_tool("node");
    need_tool("npm");
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/node");
    let dir: &'static Path = Box::leak(dir.into_boxed_path());
    // The tests of this file run on parallel threads: one installs, the others wait for
    // it (two npm installs in one directory fail with ENOTEMPTY on a fresh clone).
    static INSTALL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _installing = INSTALL.lock().unwrap_or_else(|p| p.into_inner());
    if !dir.join("node_modules/redis/package.json").exists() {
        let out = Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--no-package-lock"])
            .current_dir(dir)
            .output()
            .expect("run npm");
        assert!(
            out.status.success(),
            "npm install in tests/node failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    dir
}

/// Runs the client-side cache script with the app on `app` and the nodes at `nodes`: its
/// JSON line's fields.
fn run(dir: &Path, app: &str, nodes: &[String]) -> serde_json::Value {
    let out = Command::new("node")
        .arg("client_side_cache.mjs")
        .arg(app)
        .args(nodes)
        .current_dir(dir)
        .output()
        .expect("run node");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| {
        panic!(
            "no JSON from the script ({e}): {text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// What the script must see through the proxy, and what it saw directly.
fn check(through: &serde_json::Value, direct: Option<&serde_json::Value>) {
    assert_eq!(
        through["error"],
        serde_json::Value::Null,
        "through the proxy: {through}"
    );
    assert_eq!(through["first"], "v1", "{through}");
    // Served from the application's memory: no GET reaches a node, as directly.
    if let Some(d) = direct {
        assert_eq!(d["error"], serde_json::Value::Null, "directly: {d}");
        assert_eq!(
            through["node_gets_for_100"], d["node_gets_for_100"],
            "{through}"
        );
    }
    assert_eq!(through["node_gets_for_100"], 0, "{through}");
    assert_eq!(through["hits"], 100, "{through}");
    // A write on the key's node, and one through another client, reach the cache fast.
    assert_eq!(through["after_write"], "v2", "{through}");
    assert!(through["saw_write_ms"].as_u64().unwrap() < 100, "{through}");
    assert_eq!(through["after_other"], "v3", "{through}");
    assert!(through["saw_other_ms"].as_u64().unwrap() < 100, "{through}");
    // An expiry (within Redis's own active-expire cycle, 100 ms, after the TTL ends), a
    // FLUSHALL, and a change while the proxy's tracking connection was killed: each seen
    // by the next reads, the key cached before each.
    for (cached, seen, within) in [
        ("cached_before_expiry", "seen_expiry_ms", 200),
        ("cached_before_flushall", "seen_flushall_ms", 100),
    ] {
        assert_eq!(through[cached], true, "{cached}: {through}");
        let ms = through[seen].as_i64().unwrap();
        assert!((0..within).contains(&ms), "{seen}: {through}");
    }
    assert!(
        through["killed_trackers"].as_i64().unwrap() >= 1,
        "{through}"
    );
    let ms = through["seen_after_kill_ms"].as_i64().unwrap();
    assert!((0..100).contains(&ms), "seen_after_kill_ms: {through}");
}

#[test]
fn node_redis_client_side_cache_works_through_the_proxy_as_on_the_node() {
    need_redis();
    let dir = node_redis();
    let node = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let direct = run(dir, &node.addr(), &[node.addr()]);
    let through = run(dir, &proxy.addr(), &[node.addr()]);
    check(&through, Some(&direct));
}

#[test]
fn node_redis_client_side_cache_works_through_the_proxy_over_a_pool() {
    need_redis();
    let dir = node_redis();
    let nodes = pool(4);
    let refs: Vec<&Redis> = nodes.iter().collect();
    let proxy = Proxy::start(&refs, &[]);
    let addrs: Vec<String> = nodes.iter().map(|n| n.addr()).collect();
    check(&run(dir, &proxy.addr(), &addrs), None);
}

#[test]
fn node_redis_client_side_cache_works_through_the_proxy_over_a_redis_cluster() {
    need_redis();
    let dir = node_redis();
    let cluster = support::cluster::RedisCluster::start(3, 0);
    let proxy = Proxy::start_cluster(&cluster.seeds(), &[]);
    let addrs: Vec<String> = cluster.nodes.iter().map(|n| n.addr()).collect();
    check(&run(dir, &proxy.addr(), &addrs), None);
}

/// node-redis with its cache on, reading one key through `app` (tests/node/watch.mjs):
/// the test changes the key, then asks how soon the application saw it.
struct Watch {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    out: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Watch {
    /// Starts the script; returns it and its first line (`ready`, `cached`).
    fn start(dir: &Path, app: &str, key: &str) -> (Watch, serde_json::Value) {
        use std::io::BufRead;
        use std::process::Stdio;
        let mut child = Command::new("node")
            .args(["watch.mjs", app, key])
            .current_dir(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run node");
        let stdin = child.stdin.take().unwrap();
        let out = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut w = Watch { child, stdin, out };
        let first = w.line();
        assert_eq!(first["error"], serde_json::Value::Null, "{first}");
        (w, first)
    }

    fn line(&mut self) -> serde_json::Value {
        let line = self.out.next().expect("a line from watch.mjs").unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    }

    /// The key now holds `now` (None: it is gone): how the application saw it.
    fn changed(&mut self, now: Option<&str>) -> serde_json::Value {
        use std::io::Write;
        writeln!(self.stdin, "{}", serde_json::json!(now)).unwrap();
        self.line()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Seen by the application's next reads within 100 ms.
fn seen_fast(step: &serde_json::Value, what: &str) {
    let ms = step["seen_ms"].as_i64().unwrap();
    assert!((0..100).contains(&ms), "{what}: {step}");
}

#[test]
fn node_redis_sees_a_write_through_another_proxy_and_to_a_salted_keys_shards() {
    use support::salting::{pool_with_rules, proxy, shard_keys, wait_in_force};
    need_redis();
    let dir = node_redis();
    let rules = "version: 1\ndetection: { window_ms: 200 }\nepoch_ms: 500\nrules:\n  - match: \"votes\"\n    pin: true\n    write: { strategy: salt, salt: { shards: 3 } }\n";
    let (nodes, _tmp, rules) = pool_with_rules("node-watch", rules);
    let (a, b) = (proxy(&nodes, &rules, &[]), proxy(&nodes, &rules, &[]));

    // A plain key, cached by the application on proxy A, written through proxy B.
    b.client().cmd(&["SET", "page", "v1"]);
    let (mut w, first) = Watch::start(dir, &a.addr(), "page");
    assert_eq!(first["ready"], "v1");
    assert_eq!(first["cached"], true, "{first}");
    b.client().cmd(&["SET", "page", "v2"]);
    let step = w.changed(Some("v2"));
    seen_fast(&step, "a write through another proxy");
    assert_eq!(step["cached_again"], true, "{step}");
    drop(w);

    // A salted counter: its increments through proxy B land on its shards, which no
    // tracked read of the application covers. Its merged reads are never kept.
    let mut c = b.client();
    c.cmd(&["INCRBY", "votes", "10"]);
    wait_in_force(&[&a, &b], "votes");
    let (mut w, first) = Watch::start(dir, &a.addr(), "votes");
    let before: i64 = first["ready"].as_str().unwrap().parse().unwrap();
    assert_eq!(
        first["cached"], false,
        "a merged read is never kept: {first}"
    );
    for _ in 0..3 {
        let total = c.cmd(&["INCR", "votes"]).as_int();
        assert!(total > before, "{total} after {before}");
        let step = w.changed(Some(&total.to_string()));
        seen_fast(&step, "an increment on a shard");
    }
    assert!(
        !shard_keys(&nodes).is_empty(),
        "the increments went to the shards"
    );
}

#[test]
fn node_redis_sees_a_write_after_its_keys_slot_moved() {
    need_redis();
    let dir = node_redis();
    let cluster = support::cluster::RedisCluster::start(3, 0);
    let proxy = Proxy::start_cluster(&cluster.seeds(), &[]);
    let key = "moving:{csc}";
    proxy.client().cmd(&["SET", key, "v1"]);
    let (mut w, first) = Watch::start(dir, &proxy.addr(), key);
    assert_eq!(first["ready"], "v1");
    assert_eq!(first["cached"], true, "{first}");
    let from = cluster.master_of(key);
    let to = cluster.masters().into_iter().find(|&m| m != from).unwrap();
    let slot = cluster.nodes[from]
        .client()
        .cmd(&["CLUSTER", "KEYSLOT", key])
        .as_int() as u16;
    cluster.move_slot(slot, from, to, 10, std::time::Duration::from_millis(0));
    assert_eq!(cluster.master_of(key), to);
    // The value did not change: the application still reads it, from wherever it is.
    let step = w.changed(Some("v1"));
    seen_fast(&step, "the value after the move");
    // A write on the slot's new owner, directly.
    cluster.nodes[to].client().cmd(&["SET", key, "v2"]);
    let step = w.changed(Some("v2"));
    seen_fast(&step, "a write on the new owner");
    assert_eq!(step["cached_again"], true, "{step}");
    cluster.nodes[to].client().cmd(&["SET", key, "v3"]);
    seen_fast(&w.changed(Some("v3")), "a second write on the new owner");
}
