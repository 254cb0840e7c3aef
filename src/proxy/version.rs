//! The Redis version the proxy reports in HELLO: the lowest `redis_version` among its
//! nodes, read from `INFO server` before the proxy serves and again every minute.
//!
//! A client may turn features on by that version: redis-py's client-side cache, for one,
//! starts only when HELLO says 7.4 or later. So the proxy never reports a version that some
//! node behind it does not have. Until a node has answered it reports `FALLBACK`.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;

use crate::backend::Backend;
use crate::resp::Value;

/// Reported until a node has said its version (every node down at start).
pub const FALLBACK: &str = "7.0.0";

/// How often the nodes are asked again: a rolling upgrade (or a cluster node added) shows
/// within a minute.
pub const EVERY: Duration = Duration::from_secs(60);
/// How soon they are asked again while some node has not answered.
pub const RETRY: Duration = Duration::from_secs(1);

/// The version HELLO reports.
pub struct NodeVersion(ArcSwap<String>);

impl Default for NodeVersion {
    fn default() -> Self {
        NodeVersion(ArcSwap::from_pointee(FALLBACK.to_string()))
    }
}

impl NodeVersion {
    pub fn get(&self) -> Arc<String> {
        self.0.load_full()
    }
}

/// `redis_version:` of an `INFO server` reply.
fn parse(info: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(info).ok()?;
    let v = text
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))?
        .trim();
    numbers(v).map(|_| v.to_string())
}

fn numbers(v: &str) -> Option<Vec<u64>> {
    v.split('.').map(|p| p.parse().ok()).collect()
}

/// The lower of two versions, by their numbers.
fn lower(a: String, b: String) -> String {
    match (numbers(&a), numbers(&b)) {
        (Some(x), Some(y)) if y < x => b,
        _ => a,
    }
}

/// Asks every node at once and keeps the lowest version any of them gave. Nodes that do
/// not answer are left out; if none answers, the version stays as it was. True when every
/// node answered.
pub async fn learn(backend: &Backend, version: &NodeVersion) -> bool {
    let ask = crate::backend::wire(&["INFO", "server"]);
    let mut asks = tokio::task::JoinSet::new();
    let nodes = backend.nodes();
    for node in &nodes {
        let (backend, ask, index) = (backend.clone(), ask.clone(), node.index);
        asks.spawn(async move {
            match crate::salt::call(&backend, &[(index, ask)])
                .await
                .as_deref()
            {
                Ok([Value::Bulk(b)]) => parse(b),
                _ => None,
            }
        });
    }
    let (mut lowest, mut answered) = (None::<String>, 0);
    while let Some(v) = asks.join_next().await {
        if let Ok(Some(v)) = v {
            answered += 1;
            lowest = Some(match lowest {
                Some(l) => lower(l, v),
                None => v,
            });
        }
    }
    if let Some(v) = lowest {
        if *version.get() != v {
            tracing::info!(version = %v, "reporting the nodes' lowest Redis version in HELLO");
        }
        version.0.store(Arc::new(v));
    }
    answered == nodes.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_version_line_and_keeps_the_lowest() {
        let info = b"# Server\r\nredis_version:8.0.2\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(parse(info).as_deref(), Some("8.0.2"));
        assert_eq!(parse(b"# Server\r\nredis_mode:standalone\r\n"), None);
        assert_eq!(parse(b"redis_version:garbage\r\n"), None);
        assert_eq!(lower("8.0.2".into(), "7.4.10".into()), "7.4.10");
        assert_eq!(lower("7.4.10".into(), "7.10.0".into()), "7.4.10");
        assert_eq!(lower("7.0.15".into(), "7.0.15".into()), "7.0.15");
    }
}
