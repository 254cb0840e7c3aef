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

/// Runs the client-side cache script with the app on `app` and the node at `node`: its
/// JSON line's fields.
fn run(dir: &Path, app: &str, node: &str) -> serde_json::Value {
    let out = Command::new("node")
        .arg("client_side_cache.mjs")
        .args([app, node])
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

#[test]
fn node_redis_client_side_cache_works_through_the_proxy_as_on_the_node() {
    need_redis();
    let dir = node_redis();
    let node = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let direct = run(dir, &node.addr(), &node.addr());
    assert_eq!(
        direct["error"],
        serde_json::Value::Null,
        "directly: {direct}"
    );
    let through = run(dir, &proxy.addr(), &node.addr());
    assert_eq!(
        through["error"],
        serde_json::Value::Null,
        "through the proxy: {through}"
    );
    assert_eq!(through["first"], "v1", "{through}");
    // Served from the application's memory: no GET reaches the node, as directly.
    assert_eq!(
        through["node_gets_for_100"], direct["node_gets_for_100"],
        "{through}"
    );
    assert_eq!(through["node_gets_for_100"], 0, "{through}");
    assert_eq!(through["hits"], 100, "{through}");
    // A write on the node reaches the application's cache.
    assert_eq!(through["after_write"], "v2", "{through}");
    assert!(
        through["saw_write_ms"].as_u64().unwrap() < 1000,
        "{through}"
    );
}
