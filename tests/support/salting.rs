//! Helpers of the salting tests: a proxy with a rules file, waiting for a promotion to
//! reach every proxy, and the shard keys on each node.

use std::thread;
use std::time::{Duration, Instant};

use super::*;

pub fn proxy(nodes: &[Redis], rules: &str, env: &[(&str, &str)]) -> Proxy {
    let refs: Vec<&Redis> = nodes.iter().collect();
    Proxy::start_env(&refs, &["--rules", rules], env)
}

/// Four pool nodes and a rules file holding `rules`, in a temp dir named after `tag`.
pub fn pool_with_rules(tag: &str, rules: &str) -> (Vec<Redis>, TempDir, String) {
    let dir = TempDir::new(tag);
    let path = dir.0.join("rules.yaml");
    std::fs::write(&path, rules).unwrap();
    let rules = path_str(&path);
    (pool(4), dir, rules)
}

pub fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f() {
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

/// The salted entry of `key` in the proxy's /hotkeys, if any.
pub fn salted(p: &Proxy, key: &str) -> Option<serde_json::Value> {
    let (code, body) = p.admin_get("/hotkeys");
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["salted"]
        .as_array()?
        .iter()
        .find(|e| e["key"] == key)
        .cloned()
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Waits until both proxies know of the promotion and it is in force.
pub fn wait_in_force(proxies: &[&Proxy], key: &str) {
    wait_for(
        "the promotion to reach every proxy and take effect",
        Duration::from_secs(15),
        || {
            proxies.iter().all(|p| {
                salted(p, key)
                    .is_some_and(|e| e["from_ms"].as_u64().is_some_and(|f| now_ms() > f + 50))
            })
        },
    );
}

pub fn shard_keys(nodes: &[Redis]) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, n) in nodes.iter().enumerate() {
        for k in n.keys() {
            if k.starts_with("saltshaker:s:") {
                out.push((i, k));
            }
        }
    }
    out
}

/// Demotes `key` through `dying` (started with a `SALTSHAKER_FAILPOINT`, the only proxy
/// left that may fold), waits for it to die at `point`, and starts the proxy that takes
/// over, returned once it knows of the key (its fold is then still half done).
pub fn crash_fold_and_take_over(
    dying: &mut Proxy,
    nodes: &[Redis],
    rules: &str,
    key: &str,
    point: &str,
) -> Proxy {
    let enc = key.replace(':', "%3A");
    let (code, body) = dying.admin_post(&format!("/hotkeys/demote?key={enc}"));
    assert_eq!(code, 200, "{body}");
    assert!(
        dying.wait_exit(Duration::from_secs(20)).is_some(),
        "{key}: the proxy did not reach fail point {point}:\n{}",
        dying.stderr()
    );
    assert!(dying.stderr().contains(point), "{}", dying.stderr());
    let next = proxy(nodes, rules, &[]);
    wait_for(
        "the next proxy to learn of the key",
        Duration::from_secs(5),
        || salted(&next, key).is_some(),
    );
    next
}

/// Waits until `p` no longer lists `key` as salted: its fold is complete.
pub fn wait_folded(p: &Proxy, key: &str) {
    wait_for("the fold to complete", Duration::from_secs(20), || {
        salted(p, key).is_none()
    });
}
