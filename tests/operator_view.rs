//! What an operator and a client library see through the proxy when they ask about
//! clients: INFO's `connected_clients` and `blocked_clients` count the proxy's own clients,
//! checked against a real redis-server's answers to the same clients.

mod support;

use std::time::Duration;
use support::*;

/// The value of `field` in an INFO reply.
fn info_field(info: &Reply, field: &str) -> i64 {
    let text = info.as_str();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in INFO:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Three clients, one of them in a BLPOP: INFO clients says 3 connected and 1 blocked
/// through the proxy exactly as on the node directly (tools and test suites poll
/// `blocked_clients` to know that a BLPOP is waiting), and 0 blocked once it is answered.
#[test]
fn info_counts_the_proxys_connected_and_blocked_clients_as_redis_counts_its_own() {
    need_redis();
    let node = Redis::start();
    let other = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    for (name, addr) in [("redis", other.addr()), ("proxy", proxy.addr())] {
        let mut c = Client::connect(&addr);
        let _idle = Client::connect(&addr);
        let blocker_addr = addr.clone();
        let blocker = std::thread::spawn(move || {
            let mut b = Client::connect(&blocker_addr);
            b.cmd(&["BLPOP", "queue", "10"])
        });
        assert!(
            wait_until(Duration::from_secs(5), || {
                info_field(&c.cmd(&["INFO", "clients"]), "blocked_clients") == 1
            }),
            "{name}: no blocked client seen"
        );
        let info = c.cmd(&["INFO", "clients"]);
        assert_eq!(info_field(&info, "connected_clients"), 3, "{name}");
        assert_eq!(info_field(&info, "blocked_clients"), 1, "{name}");
        assert_eq!(c.cmd(&["RPUSH", "queue", "x"]), Reply::Int(1));
        let got = blocker.join().unwrap();
        assert_eq!(got.strings(), ["queue", "x"], "{name}");
        assert!(
            wait_until(Duration::from_secs(2), || {
                info_field(&c.cmd(&["INFO", "clients"]), "blocked_clients") == 0
            }),
            "{name}: the blocked client was not counted out"
        );
        assert!(
            wait_until(Duration::from_secs(2), || {
                info_field(&c.cmd(&["INFO"]), "connected_clients") == 2
            }),
            "{name}: the closed client is still counted"
        );
    }
}

/// ACL WHOAMI, ACL USERS and ACL GETUSER answer from the proxy's users, as a redis-server
/// with the same users answers; ACL CAT as the node does. ACL SAVE and LOAD are refused.
#[test]
fn acl_whoami_users_and_cat_answer_as_redis_does_for_the_same_users() {
    need_redis();
    let node = Redis::start();
    // The same users on a plain redis-server and in the proxy's config.
    let reference = Redis::start();
    let mut r = reference.client();
    assert_eq!(
        r.cmd(&["ACL", "SETUSER", "app", "on", ">apppw", "~app:*", "&*", "+@all"]),
        Reply::ok()
    );
    assert_eq!(
        r.cmd(&["CONFIG", "SET", "requirepass", "shared"]),
        Reply::ok()
    );
    let hash = passwd_hash("apppw");
    let proxy = Proxy::start_with_config(
        &[&node],
        &format!(
            "auth:\n  password: shared\n  users:\n    - name: app\n      passwords_sha256: [\"{hash}\"]\n      keys: [\"~app:*\"]\n      commands: [\"+@all\"]\n"
        ),
        &[],
    );
    for (name, addr) in [("redis", reference.addr()), ("proxy", proxy.addr())] {
        let mut c = Client::connect(&addr);
        assert_eq!(c.cmd(&["AUTH", "app", "apppw"]), Reply::ok(), "{name}");
        assert_eq!(c.cmd(&["ACL", "WHOAMI"]), Reply::bulk("app"), "{name}");
        assert_eq!(
            c.cmd(&["ACL", "USERS"]).strings(),
            ["app", "default"],
            "{name}"
        );
        let mut d = Client::connect(&addr);
        assert_eq!(d.cmd(&["AUTH", "shared"]), Reply::ok(), "{name}");
        assert_eq!(d.cmd(&["ACL", "WHOAMI"]), Reply::bulk("default"), "{name}");
    }
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["AUTH", "shared"]), Reply::ok());
    assert_eq!(
        c.cmd(&["ACL", "CAT"]).sorted(),
        r.cmd(&["ACL", "CAT"]).sorted()
    );
    assert_eq!(
        c.cmd(&["ACL", "GETUSER", "app"]),
        r.cmd(&["ACL", "GETUSER", "app"]),
        "a configured user, as redis-server shows the same user"
    );
    for cmd in ["SAVE", "LOAD"] {
        let refused = c.cmd(&["ACL", cmd]);
        assert!(
            refused.is_error() && refused.err().contains("config file"),
            "{refused}"
        );
    }
}

/// A CLIENT LIST or CLIENT INFO line as (field, value) pairs, in order.
fn fields(line: &str) -> Vec<(String, String)> {
    line.split_whitespace()
        .map(|f| {
            let (k, v) = f.split_once('=').unwrap_or((f, ""));
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn field(line: &str, name: &str) -> String {
    fields(line)
        .into_iter()
        .find(|(k, _)| k == name)
        .unwrap_or_else(|| panic!("no {name} in {line}"))
        .1
}

/// CLIENT INFO and CLIENT LIST give every field a real redis-server 7.0 gives, in its
/// order, with the proxy's values: its own clients (not a node's), each one's name,
/// database, protocol, MULTI state, last command and address; the errors of a bad filter
/// are Redis's own.
#[test]
fn client_info_and_list_describe_the_proxys_own_clients_field_by_field() {
    need_redis();
    let node = Redis::start();
    let other = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let mut want = Vec::new();
    for addr in [other.addr(), proxy.addr()] {
        let mut c = Client::connect(&addr);
        assert_eq!(c.cmd(&["CLIENT", "SETNAME", "probe"]), Reply::ok());
        assert_eq!(c.cmd(&["SELECT", "2"]), Reply::ok());
        let id = c.cmd(&["CLIENT", "ID"]).as_int();
        let info = c.cmd(&["CLIENT", "INFO"]).as_str();
        let names: Vec<String> = fields(&info).into_iter().map(|(k, _)| k).collect();
        want.push(names);
        assert_eq!(field(&info, "id"), id.to_string(), "{addr}: {info}");
        assert_eq!(field(&info, "name"), "probe");
        assert_eq!(field(&info, "db"), "2");
        assert_eq!(field(&info, "resp"), "2");
        assert_eq!(field(&info, "cmd"), "client|info");
        assert_eq!(field(&info, "flags"), "N");
        assert_eq!(field(&info, "multi"), "-1");
        assert_eq!(field(&info, "user"), "default");
        assert_eq!(field(&info, "laddr"), addr);
        // A second client in MULTI with one command queued, and a third that is idle.
        let mut m = Client::connect(&addr);
        assert_eq!(m.cmd(&["MULTI"]), Reply::ok());
        assert_eq!(m.cmd(&["SET", "k", "v"]), Reply::Simple("QUEUED".into()));
        let _idle = Client::connect(&addr);
        // The server accepts the new connection a moment after the client's connect returns.
        let mut list = String::new();
        wait_until(Duration::from_secs(2), || {
            list = c.cmd(&["CLIENT", "LIST"]).as_str();
            list.lines().count() >= 3
        });
        let lines: Vec<&str> = list.lines().collect();
        assert_eq!(
            lines.len(),
            3,
            "{addr}: only this server's three clients:\n{list}"
        );
        for l in &lines {
            let keys: Vec<String> = fields(l).into_iter().map(|(k, _)| k).collect();
            assert_eq!(keys, want[0], "{addr}: {l}");
        }
        let one = c.cmd(&["CLIENT", "LIST", "ID", &id.to_string()]).as_str();
        assert_eq!(one.lines().count(), 1, "{one}");
        assert_eq!(field(&one, "cmd"), "client|list");
        assert_eq!(m.cmd(&["EXEC"]), Reply::Array(Some(vec![Reply::ok()])));
    }
    assert_eq!(want[0], want[1], "the proxy's fields, in Redis's order");
    // The proxy's MULTI client, seen by another: flags x, one command queued.
    let mut a = proxy.client();
    let mut m = proxy.client();
    assert_eq!(m.cmd(&["MULTI"]), Reply::ok());
    assert_eq!(m.cmd(&["INCR", "n"]), Reply::Simple("QUEUED".into()));
    assert_eq!(m.cmd(&["SET", "k", "v"]), Reply::Simple("QUEUED".into()));
    let line = a
        .cmd(&["CLIENT", "LIST"])
        .as_str()
        .lines()
        .find(|l| field(l, "flags") == "x")
        .map(str::to_string)
        .expect("a client in MULTI");
    assert_eq!(field(&line, "multi"), "2");
    assert_eq!(field(&line, "cmd"), "set");
    // Bad filters: Redis's own errors.
    let mut direct = other.client();
    for bad in [
        vec!["CLIENT", "LIST", "TYPE", "bogus"],
        vec!["CLIENT", "LIST", "ID", "1", "x"],
        vec!["CLIENT", "LIST", "BOGUS"],
    ] {
        assert_eq!(a.cmd(&bad), direct.cmd(&bad), "{bad:?}");
    }
    assert_eq!(
        a.cmd(&["CLIENT", "LIST", "TYPE", "master"]),
        Reply::bulk(""),
        "the proxy has no master clients"
    );
}

/// CLIENT KILL closes the proxy's own clients: by ID, by address, the old `addr:port` form,
/// and the caller itself with `SKIPME no` after its reply; counts and errors as Redis
/// gives them.
#[test]
fn client_kill_closes_the_proxys_clients_as_redis_closes_its_own() {
    need_redis();
    let node = Redis::start();
    let other = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    for addr in [other.addr(), proxy.addr()] {
        let mut a = Client::connect(&addr);
        let mut b = Client::connect(&addr);
        let mut c = Client::connect(&addr);
        let bid = b.cmd(&["CLIENT", "ID"]).as_int().to_string();
        let c_addr = field(&c.cmd(&["CLIENT", "INFO"]).as_str(), "addr");
        assert_eq!(
            a.cmd(&["CLIENT", "KILL", "ID", &bid]),
            Reply::Int(1),
            "{addr}"
        );
        // Gone from the list at once, as on Redis (tools kill, then list to check).
        let list = a.cmd(&["CLIENT", "LIST"]).as_str();
        assert!(
            !list.lines().any(|l| field(l, "id") == bid),
            "{addr}: a killed client is still listed:\n{list}"
        );
        assert!(
            b.closed_within(Duration::from_secs(2)),
            "{addr}: b stays open"
        );
        assert_eq!(a.cmd(&["CLIENT", "KILL", &c_addr]), Reply::ok(), "{addr}");
        assert!(
            c.closed_within(Duration::from_secs(2)),
            "{addr}: c stays open"
        );
        assert_eq!(a.cmd(&["CLIENT", "KILL", "ID", "999999"]), Reply::Int(0));
        let no_such = a.cmd(&["CLIENT", "KILL", "10.9.8.7:6"]);
        assert_eq!(no_such.err(), "ERR No such client", "{addr}");
        let no_user = a.cmd(&["CLIENT", "KILL", "USER", "nobody"]);
        assert_eq!(no_user.err(), "ERR No such user 'nobody'", "{addr}");
        let bad = a.cmd(&["CLIENT", "KILL", "ID", "0"]);
        assert_eq!(
            bad.err(),
            "ERR client-id should be greater than 0",
            "{addr}"
        );
        assert_eq!(
            a.cmd(&["CLIENT", "KILL", "USER", "default", "SKIPME", "yes"]),
            Reply::Int(0),
            "{addr}: only the caller is left"
        );
        // A client in MONITOR is closed too.
        let mut m = Client::connect(&addr);
        let mid = m.cmd(&["CLIENT", "ID"]).as_int().to_string();
        assert_eq!(m.cmd(&["MONITOR"]), Reply::ok());
        assert_eq!(
            a.cmd(&["CLIENT", "KILL", "ID", &mid]),
            Reply::Int(1),
            "{addr}"
        );
        assert!(
            m.closed_within(Duration::from_secs(2)),
            "{addr}: the monitor stays open"
        );
        let aid = a.cmd(&["CLIENT", "ID"]).as_int().to_string();
        assert_eq!(
            a.cmd(&["CLIENT", "KILL", "ID", &aid, "SKIPME", "no"]),
            Reply::Int(1),
            "{addr}"
        );
        assert!(
            a.closed_within(Duration::from_secs(2)),
            "{addr}: a stays open"
        );
    }
}

/// MONITOR through the proxy streams every command that passes through it, in Redis's line
/// format: the same line Redis writes for the same command from the same client, but for
/// the time and the client's address (the client's own, as CLIENT INFO gives it). Redis
/// writes a line once the command ran: SELECT shows the database it selected.
#[test]
fn monitor_streams_each_command_in_redis_s_line_format() {
    need_redis();
    let node = Redis::start();
    let other = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let mut seen = Vec::new();
    for addr in [other.addr(), proxy.addr()] {
        let mut m = Client::connect(&addr);
        assert_eq!(m.cmd(&["MONITOR"]), Reply::ok(), "{addr}");
        let mut c = Client::connect(&addr);
        let me = field(&c.cmd(&["CLIENT", "INFO"]).as_str(), "addr");
        // Admin commands are not shown (Redis skips CMD_ADMIN as it skips CMD_SKIP_MONITOR).
        c.cmd(&["CLIENT", "LIST"]);
        assert_eq!(c.cmd(&["CLIENT", "KILL", "ID", "999999"]), Reply::Int(0));
        assert_eq!(c.cmd(&["SELECT", "3"]), Reply::ok());
        assert_eq!(c.cmd(&["SET", "k x", "a\"\r\n\u{1}"]), Reply::ok());
        assert_eq!(c.cmd(&["GET", "k x"]), Reply::bulk("a\"\r\n\u{1}"));
        let mut lines = Vec::new();
        while lines.len() < 4 {
            let Reply::Simple(l) = m.read_reply() else {
                panic!("{addr}: MONITOR sends simple strings")
            };
            // Without the time, and with the client's address as a placeholder.
            let (time, rest) = l.split_once(' ').unwrap();
            assert!(time.starts_with('+') || time.chars().next().unwrap().is_ascii_digit());
            lines.push(rest.replace(&me, "CLIENT"));
        }
        seen.push(lines);
    }
    assert_eq!(
        seen[0],
        [
            "[0 CLIENT] \"CLIENT\" \"INFO\"",
            "[3 CLIENT] \"SELECT\" \"3\"",
            "[3 CLIENT] \"SET\" \"k x\" \"a\\\"\\r\\n\\x01\"",
            "[3 CLIENT] \"GET\" \"k x\""
        ],
        "redis-server's lines"
    );
    assert_eq!(seen[1], seen[0], "the proxy's lines");
}

/// A monitoring client that never reads costs the others nothing: its queue is bounded,
/// the lines it cannot take are dropped and counted, and the proxy keeps its memory.
#[test]
fn a_monitor_that_never_reads_does_not_slow_or_grow_the_proxy() {
    need_redis();
    let node = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let mut m = proxy.client();
    assert_eq!(m.cmd(&["MONITOR"]), Reply::ok());
    let mut c = proxy.client();
    let value = "v".repeat(1000);
    let started = std::time::Instant::now();
    for round in 0..40 {
        let cmds: Vec<Vec<&str>> = (0..1000).map(|_| vec!["SET", "k", &value]).collect();
        let r = c.pipeline(&cmds);
        assert!(r.iter().all(|x| *x == Reply::ok()), "round {round}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "40,000 SETs took {:?} beside a stalled monitor",
        started.elapsed()
    );
    let dropped = proxy.metric("saltshaker_monitor_dropped_lines_total");
    assert!(dropped > 0.0, "a stalled monitor's lines are dropped");
    assert_eq!(proxy.metric("saltshaker_monitor_clients"), 1.0);
    drop(m);
    assert!(
        wait_until(Duration::from_secs(5), || {
            c.cmd(&["PING"]);
            proxy.metric("saltshaker_monitor_clients") == 0.0
        }),
        "the closed monitor is forgotten"
    );
}

/// INFO's keyspace through a pool is every node's, summed per database (what the client
/// stores through the proxy), not the first node's.
#[test]
fn info_keyspace_over_a_pool_sums_every_node() {
    need_redis();
    let nodes = pool(3);
    let refs: Vec<&Redis> = nodes.iter().collect();
    let proxy = Proxy::start(&refs, &[]);
    let mut c = proxy.client();
    let keys = spread_keys("ks", 40);
    for k in &keys {
        assert_eq!(c.cmd(&["SET", k, "v"]), Reply::ok());
    }
    for k in &keys[..10] {
        assert_eq!(c.cmd(&["EXPIRE", k, "1000"]), Reply::Int(1));
    }
    let per_node: Vec<i64> = nodes
        .iter()
        .map(|n| n.client().cmd(&["DBSIZE"]).as_int())
        .collect();
    assert!(
        per_node.iter().filter(|&&n| n > 0).count() > 1,
        "keys on several nodes: {per_node:?}"
    );
    let info = c.cmd(&["INFO", "keyspace"]).as_str();
    let db0 = info
        .lines()
        .find(|l| l.starts_with("db0:"))
        .unwrap_or_else(|| panic!("no db0 in:\n{info}"));
    let fields: Vec<&str> = db0["db0:".len()..].split(',').collect();
    assert_eq!(fields[0], "keys=40", "{db0}");
    assert_eq!(fields[1], "expires=10", "{db0}");
    let ttl: u64 = fields[2].strip_prefix("avg_ttl=").unwrap().parse().unwrap();
    // The nodes' own estimates (0 until a node has sampled its keys), never above the TTL.
    assert!(ttl <= 1_000_000, "{db0}");
    assert_eq!(
        info.lines().filter(|l| l.starts_with("db")).count(),
        1,
        "{info}"
    );
    // The sections that are one node's say which node they describe.
    let memory = c.cmd(&["INFO", "memory"]).as_str();
    let header = memory
        .lines()
        .find(|l| l.starts_with("# Memory"))
        .unwrap_or_default()
        .to_string();
    assert_eq!(
        header,
        format!("# Memory (node0, {})", nodes[0].addr()),
        "{memory}"
    );
    let clients = c.cmd(&["INFO", "clients"]).as_str();
    assert!(
        clients.lines().any(|l| l == "tracking_clients:0"),
        "{clients}"
    );
    assert!(clients.lines().any(|l| l == "# Clients"), "{clients}");
}
