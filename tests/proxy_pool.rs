//! A four-node pool behind the proxy: placement (spread, one owner per key, the same
//! placement as twemproxy), multi-key commands split and merged exactly, whole-pool
//! commands, and the commands a pool must refuse with a clear error.

mod support;

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use support::*;

fn pool4(extra: &[&str]) -> Option<(Vec<Redis>, Proxy)> {
    if !have_redis() {
        return None;
    }
    let nodes = pool(4);
    let refs: Vec<&Redis> = nodes.iter().collect();
    let proxy = Proxy::start(&refs, extra);
    Some((nodes, proxy))
}

fn set_cmds(keys: &[String]) -> Vec<Vec<String>> {
    keys.iter()
        .map(|k| vec!["SET".into(), k.clone(), format!("v-{k}")])
        .collect()
}

/// For each key, the nodes that hold it, from one EXISTS pipeline per node.
fn holders(nodes: &[Redis], keys: &[String]) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new(); keys.len()];
    for (n, node) in nodes.iter().enumerate() {
        let cmds: Vec<Vec<&str>> = keys.iter().map(|k| vec!["EXISTS", k.as_str()]).collect();
        for (i, r) in node.client().pipeline(&cmds).iter().enumerate() {
            if r.as_int() == 1 {
                out[i].push(n);
            }
        }
    }
    out
}

/// Node index of each key, asserting every key is on exactly one node.
fn owners(nodes: &[Redis], keys: &[String]) -> Vec<usize> {
    holders(nodes, keys)
        .into_iter()
        .zip(keys)
        .map(|(h, k)| {
            assert_eq!(
                h.len(),
                1,
                "key {k:?} should be on exactly one node, is on {h:?}"
            );
            h[0]
        })
        .collect()
}

/// Two keys (from a write through the proxy) that live on different nodes, and two on the same.
fn pairs(nodes: &[Redis], proxy: &Proxy) -> ((String, String), (String, String)) {
    let keys = spread_keys("pair", 40);
    proxy.client().pipeline(&set_cmds(&keys));
    let own = owners(nodes, &keys);
    let diff = (1..keys.len())
        .find(|&i| own[i] != own[0])
        .expect("two nodes among 40 keys");
    let same = (1..keys.len())
        .find(|&i| own[i] == own[0])
        .expect("two keys on one node among 40");
    (
        (keys[0].clone(), keys[diff].clone()),
        (keys[0].clone(), keys[same].clone()),
    )
}

#[test]
fn keys_spread_over_all_nodes_and_each_lives_on_exactly_one() {
    let Some((nodes, proxy)) = pool4(&[]) else {
        return;
    };
    let keys = spread_keys("user", 400);
    let mut c = proxy.client();
    assert!(c
        .pipeline(&set_cmds(&keys))
        .iter()
        .all(|r| *r == Reply::ok()));
    let sizes: Vec<i64> = nodes.iter().map(|n| n.dbsize()).collect();
    assert_eq!(sizes.iter().sum::<i64>(), 400, "DBSIZE per node {sizes:?}");
    assert!(
        sizes.iter().all(|&s| s >= 40),
        "keys are not spread over all 4 nodes: {sizes:?}"
    );
    let own = owners(&nodes, &keys);
    for (k, n) in keys.iter().zip(&own).take(50) {
        assert_eq!(
            nodes[*n].client().cmd(&["GET", k]),
            Reply::bulk(&format!("v-{k}"))
        );
    }
    let gets: Vec<Vec<&str>> = keys.iter().map(|k| vec!["GET", k.as_str()]).collect();
    for (k, r) in keys.iter().zip(c.pipeline(&gets)) {
        assert_eq!(
            r,
            Reply::bulk(&format!("v-{k}")),
            "GET {k} through the proxy"
        );
    }
    // One at a time, not only pipelined.
    for k in keys.iter().step_by(37) {
        assert_eq!(c.cmd(&["GET", k]), Reply::bulk(&format!("v-{k}")));
    }
}

#[test]
fn a_pipeline_across_nodes_keeps_request_order() {
    let Some((_nodes, proxy)) = pool4(&[]) else {
        return;
    };
    let mut c = proxy.client();
    let k = spread_keys("o", 500);
    let mut cmds: Vec<Vec<String>> = Vec::new();
    for i in 0..500 {
        cmds.push(vec!["SET".into(), k[i].clone(), i.to_string()]);
        cmds.push(vec!["INCR".into(), k[i].clone()]);
        cmds.push(vec!["GET".into(), k[i].clone()]);
        cmds.push(vec![
            "MGET".into(),
            k[i].clone(),
            k[i / 2].clone(),
            "o:none".into(),
        ]);
    }
    let replies = c.pipeline(&cmds);
    for i in 0..500usize {
        let r = &replies[4 * i..4 * i + 4];
        assert_eq!(r[0], Reply::ok(), "SET {}", k[i]);
        assert_eq!(r[1], Reply::Int(i as i64 + 1), "INCR {}", k[i]);
        assert_eq!(r[2], Reply::bulk(&(i + 1).to_string()), "GET {}", k[i]);
        let half = i / 2 + 1; // k[i/2] was set and incremented earlier in the pipeline
        let want = Reply::Array(Some(vec![
            Reply::bulk(&(i + 1).to_string()),
            Reply::bulk(&half.to_string()),
            Reply::Bulk(None),
        ]));
        assert_eq!(r[3], want, "MGET {} {}", k[i], k[i / 2]);
    }
}

#[test]
fn multi_key_commands_are_split_and_merged_exactly() {
    let Some((nodes, proxy)) = pool4(&[]) else {
        return;
    };
    let reference = Redis::start();
    let mut p = proxy.client();
    let mut r = reference.client();
    let mut same = |args: Vec<String>| {
        let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let (got, want) = (p.cmd(&a), r.cmd(&a));
        assert_eq!(
            got,
            want,
            "{:?}: proxy vs a single redis",
            &a[..a.len().min(6)]
        );
        got
    };
    let keys = spread_keys("mk", 100);
    let mut mset = vec!["MSET".to_string()];
    for k in &keys {
        mset.push(k.clone());
        mset.push(format!("val-{k}"));
    }
    assert_eq!(same(mset), Reply::ok());
    assert_eq!(nodes.iter().map(|n| n.dbsize()).sum::<i64>(), 100);
    let own = owners(&nodes, &keys);
    assert!(
        (0..4).all(|n| own.contains(&n)),
        "MSET did not reach every node: {own:?}"
    );
    assert_eq!(
        nodes[own[7]].client().cmd(&["GET", &keys[7]]),
        Reply::bulk(&format!("val-{}", keys[7]))
    );
    // MGET with missing keys and duplicates in between.
    let mut mget = vec!["MGET".to_string()];
    for (i, k) in keys.iter().enumerate() {
        mget.push(k.clone());
        if i % 10 == 0 {
            mget.push(format!("missing:{i}"));
            mget.push(keys[0].clone());
        }
    }
    same(mget);
    let pick = |f: &dyn Fn(usize) -> bool| -> Vec<String> {
        keys.iter()
            .enumerate()
            .filter(|(i, _)| f(*i))
            .map(|(_, k)| k.clone())
            .collect()
    };
    let mut exists = vec!["EXISTS".to_string()];
    exists.extend(pick(&|i| i % 3 == 0));
    exists.extend(["nope1".to_string(), keys[3].clone(), keys[3].clone()]);
    assert_eq!(same(exists), Reply::Int(34 + 2));
    let mut touch = vec!["TOUCH".to_string()];
    touch.extend(pick(&|i| i % 4 == 0));
    touch.extend(["nope".to_string(), keys[4].clone()]);
    same(touch);
    let mut del = vec!["DEL".to_string()];
    del.extend(pick(&|i| i < 50));
    del.extend(["nope".to_string(), keys[1].clone(), "nope2".to_string()]);
    assert_eq!(same(del), Reply::Int(50));
    let mut unlink = vec!["UNLINK".to_string()];
    unlink.extend(pick(&|i| (50..80).contains(&i)));
    unlink.push("nope".to_string());
    assert_eq!(same(unlink), Reply::Int(30));
    assert_eq!(same(vec!["DBSIZE".into()]), Reply::Int(20));
    let left: Vec<String> = nodes.iter().flat_map(|n| n.keys()).collect();
    assert_eq!(left.len(), 20);
    assert!(
        left.iter().all(|k| keys[80..].contains(k)),
        "wrong keys left on the nodes: {left:?}"
    );
    // Errors are merged as Redis gives them.
    same(vec!["MGET".into()]);
    same(vec!["MSET".into(), "a".into()]);
    same(vec!["DEL".into()]);
}

#[test]
fn dbsize_keys_scan_and_flush_cover_every_node() {
    let Some((nodes, proxy)) = pool4(&[]) else {
        return;
    };
    let mut c = proxy.client();
    let mut keys = spread_keys("cover", 500);
    keys.sort();
    c.pipeline(&set_cmds(&keys));
    c.cmd(&["SET", "other", "x"]);
    let per_node: Vec<i64> = nodes.iter().map(|n| n.dbsize()).collect();
    assert_eq!(
        c.cmd(&["DBSIZE"]),
        Reply::Int(per_node.iter().sum()),
        "per node {per_node:?}"
    );
    assert_eq!(c.cmd(&["DBSIZE"]), Reply::Int(501));
    let mut all = c.cmd(&["KEYS", "*"]).strings();
    all.sort();
    let mut want = keys.clone();
    want.push("other".into());
    want.sort();
    assert_eq!(all, want, "KEYS * through the proxy");
    let mut some = c.cmd(&["KEYS", "cover:a*"]).strings();
    some.sort();
    let want_a: Vec<String> = keys
        .iter()
        .filter(|k| k.starts_with("cover:a"))
        .cloned()
        .collect();
    assert!(!want_a.is_empty());
    assert_eq!(some, want_a, "KEYS cover:a*");
    for (pattern, expect) in [(None, &want), (Some("cover:*"), &keys)] {
        let mut seen: BTreeMap<String, usize> = BTreeMap::new();
        let mut cursor = "0".to_string();
        let mut rounds = 0;
        loop {
            let mut args = vec![
                "SCAN".to_string(),
                cursor.clone(),
                "COUNT".into(),
                "25".into(),
            ];
            if let Some(p) = pattern {
                args.extend(["MATCH".to_string(), p.to_string()]);
            }
            let r = c.cmd(&args);
            let parts = r.as_array();
            cursor = parts[0].as_str();
            for k in parts[1].strings() {
                *seen.entry(k).or_default() += 1;
            }
            rounds += 1;
            assert!(rounds < 10_000, "SCAN through the proxy does not terminate");
            if cursor == "0" {
                break;
            }
        }
        let dups: Vec<_> = seen.iter().filter(|(_, &n)| n > 1).collect();
        assert!(
            dups.is_empty(),
            "SCAN returned keys more than once: {dups:?}"
        );
        assert_eq!(
            seen.keys().cloned().collect::<Vec<_>>(),
            *expect,
            "SCAN MATCH {pattern:?}"
        );
        assert!(
            rounds > 4,
            "SCAN COUNT 25 over 501 keys in only {rounds} rounds"
        );
    }
    assert_eq!(c.cmd(&["FLUSHDB"]), Reply::ok());
    let sizes: Vec<i64> = nodes.iter().map(|n| n.dbsize()).collect();
    assert_eq!(sizes, vec![0, 0, 0, 0], "FLUSHDB left keys on nodes");
    assert_eq!(c.cmd(&["DBSIZE"]), Reply::Int(0));
    c.pipeline(&set_cmds(&keys));
    assert_eq!(c.cmd(&["FLUSHALL"]), Reply::ok());
    let sizes: Vec<i64> = nodes.iter().map(|n| n.dbsize()).collect();
    assert_eq!(sizes, vec![0, 0, 0, 0], "FLUSHALL left keys on nodes");
}

#[test]
fn rename_across_nodes_is_refused_and_on_one_node_works() {
    let Some((nodes, proxy)) = pool4(&[]) else {
        return;
    };
    let ((a, b), (x, y)) = pairs(&nodes, &proxy);
    let mut c = proxy.client();
    let r = c.cmd(&["RENAME", &a, &b]);
    assert!(
        r.is_error() && r.err().contains("saltshaker"),
        "RENAME across nodes: {r}"
    );
    assert_eq!(
        c.cmd(&["GET", &a]),
        Reply::bulk(&format!("v-{a}")),
        "refused RENAME changed data"
    );
    assert_eq!(
        c.cmd(&["GET", &b]),
        Reply::bulk(&format!("v-{b}")),
        "refused RENAME changed data"
    );
    for cmd in [
        &["SMOVE", &a, &b, "m"][..],
        &["RPOPLPUSH", &a, &b],
        &["SUNIONSTORE", &a, &b, &x],
    ] {
        let r = c.cmd(cmd);
        assert!(
            r.is_error() && r.err().contains("saltshaker"),
            "{cmd:?}: {r}"
        );
    }
    let n = owner(&nodes, &x);
    assert_eq!(
        c.cmd(&["RENAME", &x, &y]),
        Reply::ok(),
        "RENAME of two keys on one node"
    );
    assert_eq!(
        nodes[n].client().cmd(&["GET", &y]),
        Reply::bulk(&format!("v-{x}"))
    );
    assert_eq!(nodes[n].client().cmd(&["EXISTS", &x]), Reply::Int(0));
}

#[test]
fn a_shared_hash_tag_keeps_keys_together() {
    let Some((nodes, proxy)) = pool4(&["--hash-tag", "{}"]) else {
        return;
    };
    let mut c = proxy.client();
    let tagged: Vec<String> = (0..30).map(|i| format!("{{user:42}}.f{i}")).collect();
    c.pipeline(&set_cmds(&tagged));
    let own = owners(&nodes, &tagged);
    assert!(
        own.iter().all(|&n| n == own[0]),
        "keys with one hash tag spread over nodes: {own:?}"
    );
    // Different tags still spread.
    let spread: Vec<String> = spread_keys("t", 100)
        .iter()
        .map(|k| format!("{{{k}}}.x"))
        .collect();
    c.pipeline(&set_cmds(&spread));
    let own2 = owners(&nodes, &spread);
    assert!(
        (0..4).all(|n| own2.contains(&n)),
        "100 different tags did not reach 4 nodes: {own2:?}"
    );
    assert_eq!(
        c.cmd(&["RENAME", "{user:42}.f0", "{user:42}.renamed"]),
        Reply::ok()
    );
    assert_eq!(
        nodes[own[0]].client().cmd(&["GET", "{user:42}.renamed"]),
        Reply::bulk("v-{user:42}.f0")
    );
    assert_eq!(c.cmd(&["SADD", "{user:42}.s1", "a", "b"]), Reply::Int(2));
    assert_eq!(
        c.cmd(&["SMOVE", "{user:42}.s1", "{user:42}.s2", "a"]),
        Reply::Int(1)
    );
    assert_eq!(c.cmd(&["MULTI"]), Reply::ok());
    assert_eq!(
        c.cmd(&["INCR", "{user:42}.n"]),
        Reply::Simple("QUEUED".into())
    );
    assert_eq!(
        c.cmd(&["GET", "{user:42}.f1"]),
        Reply::Simple("QUEUED".into())
    );
    assert_eq!(
        c.cmd(&["EXEC"]),
        Reply::Array(Some(vec![Reply::Int(1), Reply::bulk("v-{user:42}.f1")]))
    );
}

#[test]
fn multi_exec_with_keys_on_one_node_works() {
    let Some((nodes, proxy)) = pool4(&[]) else {
        return;
    };
    let (_, (x, y)) = pairs(&nodes, &proxy);
    let n = owner(&nodes, &x);
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["MULTI"]), Reply::ok());
    assert_eq!(c.cmd(&["SET", &x, "tx"]), Reply::Simple("QUEUED".into()));
    assert_eq!(c.cmd(&["APPEND", &y, "+"]), Reply::Simple("QUEUED".into()));
    assert_eq!(c.cmd(&["GET", &x]), Reply::Simple("QUEUED".into()));
    let want = Reply::Array(Some(vec![
        Reply::ok(),
        Reply::Int(format!("v-{y}+").len() as i64),
        Reply::bulk("tx"),
    ]));
    assert_eq!(c.cmd(&["EXEC"]), want);
    assert_eq!(nodes[n].client().cmd(&["GET", &x]), Reply::bulk("tx"));
    assert_eq!(
        nodes[n].client().cmd(&["GET", &y]),
        Reply::bulk(&format!("v-{y}+"))
    );
    // Another client is not caught in this client's transaction.
    let mut other = proxy.client();
    assert_eq!(c.cmd(&["MULTI"]), Reply::ok());
    assert_eq!(c.cmd(&["SET", &x, "later"]), Reply::Simple("QUEUED".into()));
    assert_eq!(other.cmd(&["GET", &x]), Reply::bulk("tx"));
    assert_eq!(c.cmd(&["DISCARD"]), Reply::ok());
    assert_eq!(other.cmd(&["GET", &x]), Reply::bulk("tx"));
}

#[test]
fn a_transaction_spanning_nodes_is_refused_and_writes_nothing() {
    let Some((nodes, proxy)) = pool4(&[]) else {
        return;
    };
    let ((a, b), _) = pairs(&nodes, &proxy);
    let mut c = proxy.client();
    c.cmd(&["DEL", &a, &b]);
    assert_eq!(c.cmd(&["MULTI"]), Reply::ok());
    let first = c.cmd(&["SET", &a, "1"]);
    let second = c.cmd(&["SET", &b, "2"]);
    let exec = c.cmd(&["EXEC"]);
    let said = [&first, &second, &exec]
        .iter()
        .any(|r| r.is_error() && r.err().contains("saltshaker"));
    assert!(
        said,
        "no clear error for MULTI over two nodes: {first} / {second} / EXEC {exec}"
    );
    assert!(
        exec.is_error(),
        "EXEC of a refused cross-node transaction must fail, got {exec}"
    );
    for k in [&a, &b] {
        let h = holders(&nodes, std::slice::from_ref(k));
        assert!(
            h[0].is_empty(),
            "{k} was written by a refused transaction (on nodes {:?})",
            h[0]
        );
    }
    // The connection left the transaction.
    assert_eq!(c.cmd(&["SET", &a, "after"]), Reply::ok());
    assert_eq!(c.cmd(&["GET", &a]), Reply::bulk("after"));
}

#[test]
fn select_on_a_pool_refuses_other_databases() {
    let Some((nodes, proxy)) = pool4(&[]) else {
        return;
    };
    let mut c = proxy.client();
    let r = c.cmd(&["SELECT", "1"]);
    assert!(
        r.is_error() && r.err().contains("saltshaker"),
        "SELECT 1 on a pool: {r}"
    );
    assert_eq!(c.cmd(&["SELECT", "0"]), Reply::ok());
    let keys = spread_keys("db0", 40);
    c.pipeline(&set_cmds(&keys));
    assert_eq!(
        nodes.iter().map(|n| n.dbsize()).sum::<i64>(),
        40,
        "keys did not land in db 0"
    );
    assert_eq!(c.cmd(&["PING"]), Reply::Simple("PONG".into()));
    assert_eq!(c.cmd(&["ECHO", "hi"]), Reply::bulk("hi"));
}

/// twemproxy on the same four nodes: what saltshaker wrote, twemproxy finds.
struct Nutcracker {
    child: Child,
    port: u16,
    _dir: TempDir,
}

impl Drop for Nutcracker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn nutcracker(servers: &[String], hash: &str) -> Nutcracker {
    let tmp = TempDir::new("nutcracker");
    let dir = tmp.0.clone();
    let port = free_port();
    let servers: String = servers.iter().map(|s| format!("   - {s}\n")).collect();
    let conf = format!(
        "alpha:\n  listen: 127.0.0.1:{port}\n  hash: {hash}\n  distribution: ketama\n  redis: true\n  auto_eject_hosts: false\n  servers:\n{servers}"
    );
    let path = dir.join("nutcracker.yml");
    std::fs::write(&path, conf).expect("write nutcracker config");
    let child = Command::new("nutcracker")
        .arg("-c")
        .arg(&path)
        .args(["-s", &free_port().to_string(), "-a", "127.0.0.1"])
        .arg("-o")
        .arg(dir.join("log"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn nutcracker");
    let n = Nutcracker {
        child,
        port,
        _dir: tmp,
    };
    for _ in 0..250 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return n;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("nutcracker did not start");
}

#[test]
fn placement_matches_twemproxy() {
    need_redis();
    need_tool("nutcracker");
    let nodes = pool(4);
    let keys = spread_keys("compat", 300);
    let plain: Vec<String> = nodes.iter().map(|n| format!("{}:1", n.addr())).collect();
    // With names, twemproxy places by name; weights change the share of the continuum.
    let named: Vec<String> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{}:{} cache-{i}", n.addr(), [1, 2, 1, 3][i]))
        .collect();
    for (servers, hash) in [
        (&plain, "fnv1a_64"),
        (&plain, "murmur"),
        (&plain, "md5"),
        (&named, "fnv1a_64"),
    ] {
        let proxy = Proxy::start_nodes(
            &servers.join(","),
            &["--hash", hash, "--distribution", "ketama"],
        );
        assert!(proxy
            .client()
            .pipeline(&set_cmds(&keys))
            .iter()
            .all(|r| *r == Reply::ok()));
        let twem = nutcracker(servers, hash);
        let mut t = Client::connect(&format!("127.0.0.1:{}", twem.port));
        let gets: Vec<Vec<&str>> = keys.iter().map(|k| vec!["GET", k.as_str()]).collect();
        let misses: Vec<&String> = keys
            .iter()
            .zip(t.pipeline(&gets))
            .filter(|(k, r)| *r != Reply::bulk(&format!("v-{k}")))
            .map(|(k, _)| k)
            .collect();
        assert!(
            misses.is_empty(),
            "{servers:?} hash {hash}: twemproxy cannot find {} of 300 keys written by saltshaker, e.g. {:?}",
            misses.len(),
            &misses[..misses.len().min(5)]
        );
        for n in &nodes {
            n.client().cmd(&["FLUSHALL"]);
        }
    }
}

/// The connections on a node that carried the clients' commands (the proxy's shared
/// connections: its listeners and tracking connections run other commands).
fn connections(node: &Redis) -> usize {
    let list = node.client().cmd(&["CLIENT", "LIST"]).as_str();
    list.lines()
        .filter(|l| {
            ["cmd=get ", "cmd=set ", "cmd=mget "]
                .iter()
                .any(|c| l.contains(c))
        })
        .count()
}

#[test]
fn many_clients_in_parallel_get_only_their_own_replies() {
    // One worker thread, and four that share each node's connection (their relays write
    // into one socket, gathered: backend/wire.rs): each client's replies are its own and in
    // its order, and the node sees as many connections from four workers as from one.
    let mut seen = Vec::new();
    for threads in ["1", "4"] {
        seen.push(parallel_clients(&["--threads", threads]));
    }
    assert_eq!(
        seen[0], seen[1],
        "connections on each node from the proxy at --threads 1 and at --threads 4"
    );
}

/// Runs 12 clients in parallel through a pool and checks their replies; the connections
/// each node then has from the proxy.
fn parallel_clients(args: &[&str]) -> Vec<usize> {
    let Some((nodes, proxy)) = pool4(args) else {
        return Vec::new();
    };
    let addr = proxy.addr();
    let threads: Vec<_> = (0..12)
        .map(|t| {
            let addr = addr.clone();
            std::thread::spawn(move || {
                let mut c = Client::connect(&addr);
                let keys = spread_keys(&format!("par{t}"), 200);
                for round in 0..5 {
                    let mut cmds: Vec<Vec<String>> = Vec::new();
                    for k in &keys {
                        cmds.push(vec!["SET".into(), k.clone(), format!("{t}/{round}/{k}")]);
                        cmds.push(vec!["GET".into(), k.clone()]);
                    }
                    cmds.push(
                        ["MGET".to_string()]
                            .into_iter()
                            .chain(keys.iter().cloned())
                            .collect(),
                    );
                    let replies = c.pipeline(&cmds);
                    for (i, k) in keys.iter().enumerate() {
                        let want = format!("{t}/{round}/{k}");
                        assert_eq!(
                            replies[2 * i + 1],
                            Reply::bulk(&want),
                            "client {t} round {round}"
                        );
                    }
                    let all = replies.last().expect("MGET reply").strings();
                    assert!(all
                        .iter()
                        .zip(&keys)
                        .all(|(v, k)| *v == format!("{t}/{round}/{k}")));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a client thread failed");
    }
    assert_eq!(nodes.iter().map(|n| n.dbsize()).sum::<i64>(), 12 * 200);
    // Each client's pipeline of 401 commands is read at once and sent as a job per node:
    // the writes metric counts the gathered writes, several commands each.
    let commands = proxy.metric("saltshaker_backend_requests_total");
    let writes = proxy.metric("saltshaker_backend_writes_total");
    assert!(
        writes >= 4.0 && commands >= 2.0 * writes,
        "{args:?}: {commands} commands in {writes} writes to the nodes"
    );
    nodes.iter().map(connections).collect()
}

#[test]
fn resp3_clients_get_resp3_merged_replies() {
    let Some((_nodes, proxy)) = pool4(&[]) else {
        return;
    };
    let reference = Redis::start();
    let mut p = proxy.client();
    let mut r = reference.client();
    p.cmd(&["HELLO", "3"]);
    r.cmd(&["HELLO", "3"]);
    let keys = spread_keys("r3", 30);
    for k in &keys {
        assert_eq!(p.cmd(&["SET", k, "v"]), r.cmd(&["SET", k, "v"]));
    }
    let mut mget = vec!["MGET".to_string(), "nope".to_string()];
    mget.extend(keys.iter().cloned());
    let mut exists = vec!["EXISTS".to_string(), "nope".to_string()];
    exists.extend(keys.iter().cloned());
    for args in [
        mget,
        exists,
        vec!["DBSIZE".to_string()],
        vec!["KEYS".into(), "r3:*".into()],
    ] {
        let (got, want) = (p.cmd(&args), r.cmd(&args));
        assert_eq!(
            got.sorted(),
            want.sorted(),
            "{} in RESP3 through a pool",
            args[0]
        );
    }
}

#[test]
fn pubsub_and_blocking_commands_work_in_a_pool() {
    let Some((_nodes, proxy)) = pool4(&[]) else {
        return;
    };
    let mut sub = proxy.client();
    let mut other = proxy.client();
    assert_eq!(
        sub.cmd(&["SUBSCRIBE", "alerts"]).as_array()[0],
        Reply::bulk("subscribe")
    );
    assert_eq!(
        other.cmd(&["PUBLISH", "alerts", "disk full"]),
        Reply::Int(1)
    );
    assert_eq!(
        sub.read_reply(),
        Reply::Array(Some(vec![
            Reply::bulk("message"),
            Reply::bulk("alerts"),
            Reply::bulk("disk full")
        ]))
    );
    let mut waiter = proxy.client();
    waiter.send_raw(&encode(&["BRPOP", "pool:queue", "5"]));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(other.cmd(&["RPUSH", "pool:queue", "job"]), Reply::Int(1));
    assert_eq!(
        waiter.read_reply(),
        Reply::Array(Some(vec![Reply::bulk("pool:queue"), Reply::bulk("job")]))
    );
}

#[test]
fn eval_routes_by_its_keys() {
    let Some((nodes, proxy)) = pool4(&[]) else {
        return;
    };
    let ((a, b), (x, y)) = pairs(&nodes, &proxy);
    let mut c = proxy.client();
    let script = "return redis.call('GET', KEYS[1]) .. '+' .. redis.call('GET', KEYS[2])";
    assert_eq!(
        c.cmd(&["EVAL", script, "2", &x, &y]),
        Reply::bulk(&format!("v-{x}+v-{y}")),
        "EVAL with both keys on one node"
    );
    let r = c.cmd(&["EVAL", script, "2", &a, &b]);
    assert!(
        r.is_error() && r.err().contains("saltshaker"),
        "EVAL with keys on two nodes: {r}"
    );
    assert_eq!(
        c.cmd(&["EVAL", "return redis.call('INCR', KEYS[1])", "1", "ev:one"]),
        Reply::Int(1)
    );
    assert_eq!(holders(&nodes, &["ev:one".to_string()])[0].len(), 1);
    // Inline commands are routed like any other.
    c.send_raw(format!("GET {a}\r\n").as_bytes());
    assert_eq!(c.read_reply(), Reply::bulk(&format!("v-{a}")));
}
