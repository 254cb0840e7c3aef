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
