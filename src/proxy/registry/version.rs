//! What the proxy learns of its nodes: the Redis version it reports in HELLO (the lowest
//! `redis_version` among them, from `INFO server`, before the proxy serves and again
//! every minute), and the commands they know that its table lacks (`COMMAND LIST`, then
//! `COMMAND INFO`, `command::learn`), in the background once the proxy serves and again
//! whenever a node reconnects (a restart may have loaded a module) or its version changes.
//! A node restarted in a rolling upgrade teaches its new commands within a second or two
//! of the proxy reconnecting (a minute at most, if no connection of the proxy's broke);
//! until then the proxy answers them `unknown command`, as an older node would.
//!
//! A client may turn features on by that version: redis-py's client-side cache, for one,
//! starts only when HELLO says 7.4 or later. So the proxy never reports a version that some
//! node behind it does not have, nor one whose commands it has not learned yet (a node's
//! version counts once its commands are learned; until then it counts as `FALLBACK`, the
//! built-in table's). Until a node has answered it reports `FALLBACK`.

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

/// The version HELLO reports; and what was last seen of each node.
pub struct NodeVersion(
    ArcSwap<Reported>,
    std::sync::Mutex<std::collections::HashMap<usize, Seen>>,
);

/// A node's last version, and the version and connection count its commands were learned
/// at: they are learned again when either changes (an upgrade, a restart).
#[derive(Default)]
struct Seen {
    version: Server,
    learned_at: Option<(Server, u64)>,
}

/// What a node's `INFO server` says it is: its `redis_version`, and its `valkey_version` on
/// Valkey (whose `redis_version` stays 7.2.4 for compatibility).
#[derive(Default, Clone, PartialEq, Eq, Debug)]
pub struct Server {
    pub redis: String,
    pub valkey: Option<String>,
}

/// What HELLO reports: `server` and `version`.
pub struct Reported {
    pub server: &'static str,
    pub version: String,
}

impl Default for NodeVersion {
    fn default() -> Self {
        NodeVersion(
            ArcSwap::from_pointee(Reported {
                server: "redis",
                version: FALLBACK.to_string(),
            }),
            Default::default(),
        )
    }
}

impl NodeVersion {
    pub fn get(&self) -> Arc<Reported> {
        self.0.load_full()
    }
}

/// `redis_version:` (and `valkey_version:`) of an `INFO server` reply.
fn parse(info: &[u8]) -> Option<Server> {
    let text = std::str::from_utf8(info).ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .filter(|v| numbers(v).is_some())
            .map(str::to_string)
    };
    Some(Server {
        redis: field("redis_version:")?,
        valkey: field("valkey_version:"),
    })
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
            let v = match crate::salt::call(&backend, &[(index, ask)])
                .await
                .as_deref()
            {
                Ok([Value::Bulk(b)]) => parse(b),
                _ => None,
            };
            v.map(|v| (index, v))
        });
    }
    let mut answered = 0;
    while let Some(v) = asks.join_next().await {
        if let Ok(Some((index, v))) = v {
            answered += 1;
            let mut seen = version.1.lock().unwrap_or_else(|p| p.into_inner());
            seen.entry(index).or_default().version = v;
        }
    }
    if answered > 0 {
        publish(version);
    }
    answered == nodes.len()
}

/// Sets what HELLO reports: the lowest version over the nodes seen, each at the version its
/// commands were learned at (FALLBACK before they are); `valkey` and the lowest
/// `valkey_version` when every node is a Valkey whose commands are learned, as a Valkey node
/// reports itself, else `redis` and the lowest `redis_version`.
fn publish(version: &NodeVersion) {
    let seen = version.1.lock().unwrap_or_else(|p| p.into_inner());
    let at = |s: &Seen| s.learned_at.as_ref().map(|(at, _)| at.clone());
    let redis = seen
        .values()
        .map(|s| match at(s) {
            Some(at) => lower(at.redis, s.version.redis.clone()),
            None => FALLBACK.to_string(),
        })
        .reduce(lower);
    let valkey = seen
        .values()
        .map(
            |s| match (at(s).and_then(|a| a.valkey), &s.version.valkey) {
                (Some(at), Some(now)) => Some(lower(at, now.clone())),
                _ => None,
            },
        )
        .reduce(|a, b| Some(lower(a?, b?)))
        .flatten();
    drop(seen);
    let Some(redis) = redis else { return };
    let next = match valkey {
        Some(v) => Reported {
            server: "valkey",
            version: v,
        },
        None => Reported {
            server: "redis",
            version: redis,
        },
    };
    let now = version.get();
    if now.server != next.server || now.version != next.version {
        tracing::info!(server = next.server, version = %next.version, "reporting the nodes' lowest version in HELLO");
    }
    version.0.store(Arc::new(next));
}

/// Reconnects the proxy has made to node `index` so far (`NodeMetrics::connects`).
fn connects(backend: &Backend, index: usize) -> u64 {
    backend
        .node(index)
        .metrics
        .connects
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether some node was reconnected since its commands were last learned (its version is
/// then asked again, and its commands learned again: it may have restarted with more).
pub fn reconnected(backend: &Backend, version: &NodeVersion) -> bool {
    let seen = version.1.lock().unwrap_or_else(|p| p.into_inner());
    seen.iter().any(|(&i, s)| {
        s.learned_at
            .as_ref()
            .is_some_and(|(_, at)| *at != connects(backend, i))
    })
}

/// Learns the commands of every node whose version, or connection count, is new since its
/// commands were last learned (at start, after an upgrade, after a reconnect); each node at
/// once. A node that fails is asked again next time.
pub async fn learn_commands_of_new_versions(backend: &Backend, version: &NodeVersion) {
    let due: Vec<(usize, Server)> = {
        let seen = version.1.lock().unwrap_or_else(|p| p.into_inner());
        seen.iter()
            .filter(|(&i, s)| {
                s.learned_at.as_ref() != Some(&(s.version.clone(), connects(backend, i)))
            })
            .map(|(i, s)| (*i, s.version.clone()))
            .collect()
    };
    let mut asks = tokio::task::JoinSet::new();
    for (index, v) in due {
        let backend = backend.clone();
        asks.spawn(async move { learn_commands(&backend, index).await.then_some((index, v)) });
    }
    while let Some(done) = asks.join_next().await {
        if let Ok(Some((index, v))) = done {
            // Counted after learning: the connections the asking itself opened are in it.
            let n = connects(backend, index);
            let mut seen = version.1.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(e) = seen.get_mut(&index) {
                e.learned_at = Some((v, n));
            }
        }
    }
    publish(version);
}

/// Learns the commands node `index` lists that the table lacks, and the arity it gives
/// the ones the table has (a form a newer node accepts is not refused). The names are
/// asked in groups, so one reply stays small; every reply is in before any command is
/// learned, so a node's new commands become known together, not one group at a time.
async fn learn_commands(backend: &Backend, index: usize) -> bool {
    let list = crate::backend::wire(&["COMMAND", "LIST"]);
    let names: Vec<String> = match crate::salt::call(backend, &[(index, list)])
        .await
        .as_deref()
    {
        Ok([Value::Array(names)]) => names.iter().filter_map(text).collect(),
        _ => return false,
    };
    let mut infos = Vec::with_capacity(names.len());
    for group in names.chunks(32) {
        let mut args = vec!["COMMAND", "INFO"];
        args.extend(group.iter().map(String::as_str));
        let ask = crate::backend::wire(&args);
        match crate::salt::call(backend, &[(index, ask)]).await.as_deref() {
            Ok([Value::Array(group)]) => infos.extend(group.iter().filter_map(learned_of)),
            _ => return false,
        }
    }
    for info in infos {
        if crate::command::lookup(info.name.as_bytes()).is_some() {
            crate::command::learn_arity(&info.name, info.arity);
            for sub in &info.subcommands {
                crate::command::learn_arity(&sub.name, sub.arity);
            }
        } else if crate::command::learn(&info) {
            tracing::info!(command = %info.name, node = %backend.node(index).addr, "learned a command from a node");
        }
    }
    true
}

/// A string of a reply: a bulk or simple string.
fn text(v: &Value) -> Option<String> {
    match v {
        Value::Bulk(b) | Value::Simple(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
}

fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Integer(n) => Some(*n),
        _ => None,
    }
}

/// The value of `key` in a map reply (RESP2's flat array of pairs, or RESP3's map).
fn field<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    match v {
        Value::Array(items) => items
            .chunks(2)
            .find(|kv| text(&kv[0]).is_some_and(|k| k == key))
            .and_then(|kv| kv.get(1)),
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| text(k).is_some_and(|k| k == key))
            .map(|(_, v)| v),
        _ => None,
    }
}

fn texts(v: Option<&Value>) -> Vec<String> {
    match v {
        Some(Value::Array(a) | Value::Set(a)) => a.iter().filter_map(text).collect(),
        _ => Vec::new(),
    }
}

/// One entry of a `COMMAND INFO` reply (Redis 7's ten fields); None for a nil entry.
fn learned_of(v: &Value) -> Option<crate::command::Learned> {
    use crate::command::{BeginSearch, FindKeys, KeySpecInfo, Learned};
    let Value::Array(f) = v else { return None };
    let name = text(f.first()?)?;
    let arity = int(f.get(1)?)?;
    let spec_of = |ks: &Value| {
        let begin = field(ks, "begin_search")?;
        let spec = field(begin, "spec")?;
        let begin = match text(field(begin, "type")?)?.as_str() {
            "index" => BeginSearch::Index(int(field(spec, "index")?)?),
            "keyword" => BeginSearch::Keyword {
                keyword: text(field(spec, "keyword")?)?,
                startfrom: int(field(spec, "startfrom")?)?,
            },
            _ => BeginSearch::Unknown,
        };
        let find = field(ks, "find_keys")?;
        let spec = field(find, "spec")?;
        let find = match text(field(find, "type")?)?.as_str() {
            "range" => FindKeys::Range {
                lastkey: int(field(spec, "lastkey")?)?,
                keystep: int(field(spec, "keystep")?)?,
                limit: int(field(spec, "limit")?)?,
            },
            "keynum" => FindKeys::Keynum {
                keynumidx: int(field(spec, "keynumidx")?)?,
                firstkey: int(field(spec, "firstkey")?)?,
                keystep: int(field(spec, "keystep")?)?,
            },
            _ => FindKeys::Unknown,
        };
        Some(KeySpecInfo { begin, find })
    };
    let key_specs = match f.get(8) {
        // A spec that cannot be read leaves the keys unknown (an Unknown search).
        Some(Value::Array(specs)) => specs
            .iter()
            .map(|ks| {
                spec_of(ks).unwrap_or(KeySpecInfo {
                    begin: BeginSearch::Unknown,
                    find: FindKeys::Unknown,
                })
            })
            .collect(),
        _ => Vec::new(),
    };
    let subcommands = match f.get(9) {
        Some(Value::Array(subs)) => subs.iter().filter_map(learned_of).collect(),
        _ => Vec::new(),
    };
    Some(Learned {
        name,
        arity: i32::try_from(arity).ok()?,
        flags: texts(f.get(2)),
        cats: texts(f.get(6)),
        key_specs,
        subcommands,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_version_line_and_keeps_the_lowest() {
        let info = b"# Server\r\nredis_version:8.0.2\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(parse(info).map(|s| s.redis).as_deref(), Some("8.0.2"));
        let valkey =
            b"# Server\r\nredis_version:7.2.4\r\nserver_name:valkey\r\nvalkey_version:9.1.2\r\n";
        assert_eq!(
            parse(valkey),
            Some(Server {
                redis: "7.2.4".into(),
                valkey: Some("9.1.2".into())
            })
        );
        assert_eq!(parse(b"# Server\r\nredis_mode:standalone\r\n"), None);
        assert_eq!(parse(b"redis_version:garbage\r\n"), None);
        assert_eq!(lower("8.0.2".into(), "7.4.10".into()), "7.4.10");
        assert_eq!(lower("7.4.10".into(), "7.10.0".into()), "7.4.10");
        assert_eq!(lower("7.0.15".into(), "7.0.15".into()), "7.0.15");
    }
}
