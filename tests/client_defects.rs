//! Defects that real clients found (ioredis's and redis-py's own suites, a chaos soak, an
//! operator's habits), each reproduced here with real redis-server processes and a raw
//! RESP client, and checked against what the client sees and what each node holds.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use support::*;

/// Every command of one pipelined write runs in the database its client had selected
/// when it sent it (ioredis re-selects its database in the same write as the commands it
/// resends after a reconnect).
#[test]
fn a_pipelined_select_puts_each_command_in_the_database_selected_before_it() {
    need_redis();
    let node = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let mut c = proxy.client();
    let r = c.pipeline(&[
        vec!["SELECT", "3"],
        vec!["SET", "w3", "x"],
        vec!["SELECT", "0"],
        vec!["SET", "w0", "y"],
    ]);
    assert_eq!(r, vec![Reply::ok(); 4]);
    let mut direct = node.client();
    assert_eq!(
        direct.cmd(&["GET", "w0"]),
        Reply::bulk("y"),
        "w0 in database 0"
    );
    assert!(direct.cmd(&["GET", "w3"]).is_nil(), "w3 not in database 0");
    assert_eq!(direct.cmd(&["SELECT", "3"]), Reply::ok());
    assert_eq!(
        direct.cmd(&["GET", "w3"]),
        Reply::bulk("x"),
        "w3 in database 3"
    );
    assert!(direct.cmd(&["GET", "w0"]).is_nil(), "w0 not in database 3");

    // Reads too: database 2's value, then database 0's.
    assert_eq!(direct.cmd(&["SELECT", "2"]), Reply::ok());
    assert_eq!(direct.cmd(&["SET", "k", "two"]), Reply::ok());
    assert_eq!(direct.cmd(&["SELECT", "0"]), Reply::ok());
    assert_eq!(direct.cmd(&["SET", "k", "zero"]), Reply::ok());
    let r = c.pipeline(&[
        vec!["SELECT", "2"],
        vec!["GET", "k"],
        vec!["SELECT", "0"],
        vec!["GET", "k"],
        vec!["SELECT", "2"],
        vec!["GET", "k"],
    ]);
    assert_eq!(r[1], Reply::bulk("two"));
    assert_eq!(r[3], Reply::bulk("zero"));
    assert_eq!(r[5], Reply::bulk("two"));

    // A write in one database and FLUSHDB in another, in one write: the FLUSHDB runs after
    // the write, in its own database only.
    let r = c.pipeline(&[
        vec!["SELECT", "5"],
        vec!["SET", "keep", "1"],
        vec!["SELECT", "6"],
        vec!["SET", "gone", "1"],
        vec!["FLUSHDB"],
        vec!["SELECT", "5"],
        vec!["GET", "keep"],
    ]);
    assert_eq!(r[6], Reply::bulk("1"), "{r:?}");
    assert_eq!(direct.cmd(&["SELECT", "6"]), Reply::ok());
    assert_eq!(direct.cmd(&["DBSIZE"]), Reply::Int(0));
}

/// The protocol and the connection's name change in a pipeline too: each command is
/// answered in the protocol, and sees the name, set before it.
#[test]
fn hello_and_client_setname_in_a_pipeline_apply_from_the_next_command_on() {
    need_redis();
    let node = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let mut direct = node.client();
    assert_eq!(direct.cmd(&["HSET", "h", "f", "v"]), Reply::Int(1));
    let cmds = [
        vec!["HGETALL", "h"],
        vec!["HELLO", "3"],
        vec!["HGETALL", "h"],
        vec!["CLIENT", "SETNAME", "first"],
        vec!["CLIENT", "GETNAME"],
        vec!["HELLO", "2"],
        vec!["HGETALL", "h"],
        vec!["CLIENT", "SETNAME", "second"],
        vec!["CLIENT", "GETNAME"],
    ];
    let through = proxy.client().pipeline(&cmds);
    let straight = node.client().pipeline(&cmds);
    for (i, c) in cmds.iter().enumerate() {
        if c[0] == "HELLO" {
            continue; // the proxy answers HELLO with its own server fields
        }
        assert_eq!(through[i], straight[i], "reply {i} to {c:?}");
    }
    assert!(matches!(through[0], Reply::Array(_)), "{}", through[0]);
    assert!(matches!(through[2], Reply::Map(_)), "{}", through[2]);
    assert_eq!(through[4], Reply::bulk("first"));
    assert_eq!(through[8], Reply::bulk("second"));
}

/// A client that pipelines hundreds of large GETs and reads all the while gets every
/// reply (ioredis's "large pipelines" test), even past the output limit: the limit counts
/// what the client has not read, and the proxy writes while it resolves.
#[test]
fn a_client_that_reads_a_pipeline_larger_than_the_output_limit_gets_every_reply() {
    need_redis();
    let node = Redis::start();
    // A 64 MiB limit and 200 replies of 1 MiB: three times the limit.
    let proxy = Proxy::start_with_config(&[&node], "limits: { max_output_bytes: 67108864 }", &[]);
    let value = "v".repeat(1 << 20);
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["SET", "big", &value]), Reply::ok());
    let cmds: Vec<Vec<&str>> = (0..200).map(|_| vec!["GET", "big"]).collect();
    c.set_read_timeout(Duration::from_secs(20));
    let started = Instant::now();
    let replies = c.try_pipeline(&cmds).unwrap_or_else(|got| {
        panic!(
            "cut off after {} of 200 replies; proxy log:\n{}",
            got.len(),
            proxy.stderr()
        )
    });
    assert_eq!(replies.len(), 200);
    assert!(replies.iter().all(|r| *r == Reply::bulk(&value)));
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(
        proxy.metric("saltshaker_client_output_limit_closed_total"),
        0.0
    );
    assert!(!proxy.stderr().contains("leaves its replies unread"));
}

/// A client that is cut off for leaving its replies unread sees its socket closed at
/// once, and the connection gauge goes back to zero.
#[test]
fn a_client_cut_off_at_the_output_limit_has_its_socket_closed_at_once() {
    need_redis();
    let node = Redis::start();
    let proxy = Proxy::start_with_config(&[&node], "limits: { max_output_bytes: 4194304 }", &[]);
    let value = "v".repeat(1 << 20);
    assert_eq!(proxy.client().cmd(&["SET", "big", &value]), Reply::ok());
    let mut rude = TcpStream::connect(proxy.addr()).unwrap();
    // 64 GETs of 1 MiB, sent at once; nothing read until the proxy has given up.
    let mut batch = Vec::new();
    for _ in 0..64 {
        batch.extend_from_slice(&encode(&["GET", "big"]));
    }
    rude.write_all(&batch).unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || proxy
            .stderr()
            .contains("closing a client that leaves its replies unread")),
        "no log line:\n{}",
        proxy.stderr()
    );
    let gone_at = Instant::now();
    // Drain what was written before the cut; then the socket must end (EOF or reset).
    rude.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let ended = loop {
        match rude.read(&mut buf) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) => {
                break !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                )
            }
        }
    };
    assert!(ended, "the socket stayed open after the cut");
    assert!(gone_at.elapsed() < Duration::from_secs(5));
    assert!(wait_until(Duration::from_secs(2), || proxy
        .metric("saltshaker_client_connections")
        == 0.0));
}

/// No client can lock the proxy out of its nodes: CONFIG SET of the nodes' password (as
/// redis-py's own AUTH test sends), their port or their client limit is refused with an
/// error that says what to do instead, and new backend connections keep working.
#[test]
fn config_set_of_a_setting_that_would_lock_the_proxy_out_is_refused() {
    need_redis();
    let node = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let mut c = proxy.client();
    for args in [
        vec!["CONFIG", "SET", "requirepass", "x"],
        vec!["config", "set", "REQUIREPASS", "x"],
        vec!["CONFIG", "SET", "maxmemory", "0", "masterauth", "x"],
        vec!["CONFIG", "SET", "port", "1"],
        vec!["CONFIG", "SET", "maxclients", "1"],
    ] {
        let r = c.cmd(&args);
        assert!(
            r.is_error() && r.err().contains("lock saltshaker out of its nodes"),
            "{args:?}: {r}"
        );
    }
    let mut direct = node.client();
    assert_eq!(
        direct.cmd(&["CONFIG", "GET", "requirepass"]),
        Reply::Array(Some(vec![Reply::bulk("requirepass"), Reply::bulk("")]))
    );
    // Another setting still goes to the node.
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "slowlog-max-len", "77"]),
        Reply::ok()
    );
    assert_eq!(
        direct.cmd(&["CONFIG", "GET", "slowlog-max-len"]).as_array()[1],
        Reply::bulk("77")
    );
    // A blocking command opens a new backend connection: it works.
    assert_eq!(c.cmd(&["RPUSH", "q", "a"]), Reply::Int(1));
    assert_eq!(
        c.cmd(&["BLPOP", "q", "1"]),
        Reply::Array(Some(vec![Reply::bulk("q"), Reply::bulk("a")]))
    );
}

/// A shared backend connection killed on a healthy node (`CLIENT KILL TYPE normal`) is
/// reopened at once: the requests that arrive meanwhile wait for it instead of failing.
#[test]
fn a_dropped_connection_to_a_healthy_node_is_reopened_without_failing_requests() {
    need_redis();
    let node = Redis::start();
    // A long backoff, so that requests failed during it would be seen.
    let proxy = Proxy::start_with_config(
        &[&node],
        "  reconnect_min_ms: 1000\n  reconnect_max_ms: 2000",
        &[],
    );
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["SET", "k", "v"]), Reply::ok());
    let mut direct = node.client();
    let mut errors = Vec::new();
    // A connection that breaks within a second of opening backs off (a node that drops
    // every connection is not hammered): let the first one age.
    std::thread::sleep(Duration::from_millis(1100));
    for round in 0..3 {
        let killed = direct.cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
        assert!(
            killed.as_int() >= 1,
            "round {round}: {killed}; clients: {}\nproxy:\n{}",
            direct.cmd(&["CLIENT", "LIST"]).as_str(),
            proxy.stderr()
        );
        // Long enough that the connection opened after this kill is past its first second
        // at the next one, even when the machine is busy and the reconnect is slow.
        let until = Instant::now() + Duration::from_millis(1600);
        while Instant::now() < until {
            let r = c.cmd(&["GET", "k"]);
            if r != Reply::bulk("v") {
                errors.push(format!("round {round}: {r}"));
            }
        }
    }
    assert!(
        errors.is_empty(),
        "{} failed: {:?}\nproxy:\n{}",
        errors.len(),
        &errors[..errors.len().min(5)],
        proxy.stderr()
    );
}

/// The connection's name survives pub/sub: CLIENT GETNAME after SUBSCRIBE and UNSUBSCRIBE
/// answers the name set before (ioredis: "set the name before any subscribe command if
/// reconnected").
#[test]
fn the_connection_name_survives_subscribe_and_unsubscribe() {
    need_redis();
    let node = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["CLIENT", "SETNAME", "niceName"]), Reply::ok());
    let sub = c.cmd(&["SUBSCRIBE", "c"]);
    assert_eq!(sub.as_array()[0], Reply::bulk("subscribe"));
    let unsub = c.cmd(&["UNSUBSCRIBE", "c"]);
    assert_eq!(unsub.as_array()[0], Reply::bulk("unsubscribe"));
    assert_eq!(c.cmd(&["CLIENT", "GETNAME"]), Reply::bulk("niceName"));
}

/// A client that shuts down its sending side while a BLPOP waits gets no error reply: as
/// Redis, the proxy closes it without one (ioredis then resends the command on its new
/// connection). Replies to the commands before the BLPOP are still written.
#[test]
fn a_half_closed_client_with_a_pending_blpop_is_closed_without_an_error_reply() {
    need_redis();
    let node = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    for target in [node.addr(), proxy.addr()] {
        let mut s = TcpStream::connect(&target).unwrap();
        let mut batch = encode(&["PING"]);
        batch.extend_from_slice(&encode(&["BLPOP", "nothing-here", "0"]));
        s.write_all(&batch).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        s.shutdown(std::net::Shutdown::Write).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut got = Vec::new();
        let _ = s.read_to_end(&mut got);
        assert_eq!(
            String::from_utf8_lossy(&got),
            "+PONG\r\n",
            "through {target} (node {})",
            node.addr()
        );
    }
}

/// INFO inside MULTI is queued and answered in EXEC's reply, as Redis does (ioredis's
/// "batch all commands before ready event" sends it so).
#[test]
fn info_inside_multi_is_queued_and_answered_by_exec() {
    need_redis();
    let node = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let mut c = proxy.client();
    let r = c.pipeline(&[
        vec!["MULTI"],
        vec!["INFO", "server"],
        vec!["SET", "k", "v"],
        vec!["EXEC"],
    ]);
    assert_eq!(r[0], Reply::ok());
    assert_eq!(r[1], Reply::Simple("QUEUED".into()), "{}", r[1]);
    let exec = r[3].as_array();
    assert_eq!(exec.len(), 2, "{}", r[3]);
    assert!(exec[0].as_str().contains("redis_version"), "{}", exec[0]);
    assert_eq!(exec[1], Reply::ok());
}

/// A cluster seed that accepts connections and never answers does not hang startup
/// silently: the proxy logs the seed and what it waited for, retries, says why in /readyz,
/// and ends promptly on SIGTERM.
#[test]
fn a_cluster_seed_that_never_answers_is_named_retried_and_sigterm_still_ends_the_proxy() {
    need_redis();
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let seed = mute.local_addr().unwrap().to_string();
    // Accept every connection and keep it open, answering nothing.
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = held.clone();
    std::thread::spawn(move || {
        for s in mute.incoming().flatten() {
            keep.lock().unwrap().push(s);
        }
    });
    let mut proxy = Proxy::start_cluster_unmapped(&seed, &["--request-timeout-ms", "800"]);
    assert!(
        wait_until(Duration::from_secs(10), || {
            let log = proxy.stderr();
            log.contains(&seed) && log.contains("no reply to CLUSTER SHARDS within 800 ms")
        }),
        "no log line naming the seed:\n{}",
        proxy.stderr()
    );
    assert!(
        wait_until(Duration::from_secs(5), || proxy
            .stderr()
            .matches("not ready, retrying")
            .count()
            >= 2),
        "not retried:\n{}",
        proxy.stderr()
    );
    assert_eq!(proxy.admin_get("/healthz").0, 200);
    let (status, body) = proxy.admin_get("/readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("not ready") && body.contains(&seed), "{body}");
    let asked = Instant::now();
    proxy.signal("TERM");
    let exited = proxy.wait_exit(Duration::from_secs(5));
    assert!(
        exited.is_some(),
        "still running 5 s after SIGTERM:\n{}",
        proxy.stderr()
    );
    assert!(asked.elapsed() < Duration::from_secs(5));
}

/// SLOWLOG GET N over a pool answers N entries in all, newest first across the nodes
/// (it answered N per node); LEN is the sum over the nodes and RESET resets each.
#[test]
fn slowlog_get_over_a_pool_merges_the_nodes_newest_first_and_keeps_n() {
    need_redis();
    let nodes = pool(3);
    let refs: Vec<&Redis> = nodes.iter().collect();
    let proxy = Proxy::start(&refs, &[]);
    let mut c = proxy.client();
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "slowlog-log-slower-than", "0"]),
        Reply::ok()
    );
    assert_eq!(c.cmd(&["SLOWLOG", "RESET"]), Reply::ok());
    for k in spread_keys("slow", 30) {
        assert_eq!(c.cmd(&["SET", &k, "v"]), Reply::ok());
    }
    // The newest entry stands alone in its second.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(c.cmd(&["SET", "newest", "v"]), Reply::ok());
    let got = c.cmd(&["SLOWLOG", "GET", "5"]);
    let entries = got.as_array();
    assert_eq!(entries.len(), 5, "{got}");
    let times: Vec<i64> = entries.iter().map(|e| e.as_array()[1].as_int()).collect();
    assert!(
        times.windows(2).all(|w| w[0] >= w[1]),
        "not newest first: {times:?}"
    );
    // The proxy's own health PINGs may share the newest second; no older SET may come.
    let newest = entries
        .iter()
        .position(|e| e.as_array()[3].strings() == ["SET", "newest", "v"])
        .unwrap_or_else(|| panic!("SET newest is not among the 5 newest: {got}"));
    assert!(entries[..newest]
        .iter()
        .all(|e| e.as_array()[3].strings()[0] != "SET"));
    // No count: 10, as Redis; -1: every entry of every node.
    assert_eq!(c.cmd(&["SLOWLOG", "GET"]).as_array().len(), 10);
    let len = c.cmd(&["SLOWLOG", "LEN"]).as_int();
    let direct: i64 = nodes
        .iter()
        .map(|n| n.client().cmd(&["SLOWLOG", "LEN"]).as_int())
        .sum();
    assert!(len >= 31 && len <= direct, "LEN {len}, nodes {direct}");
    assert!(c.cmd(&["SLOWLOG", "GET", "-1"]).as_array().len() as i64 >= 31);
    assert_eq!(c.cmd(&["SLOWLOG", "RESET"]), Reply::ok());
    assert!(
        c.cmd(&["SLOWLOG", "LEN"]).as_int() <= 3,
        "one RESET entry per node at most"
    );
}

/// SORT's BY and GET patterns name keys that are in no key spec. Over a pool they were
/// forwarded as if those keys did not exist (BY w_* answered 1 2 3, Redis 3 2 1; GET o_*
/// three nils), then refused: now the proxy runs such a SORT across the nodes, and every
/// form answers as one redis-server with the same data answers.
#[test]
fn sort_by_and_get_patterns_over_a_pool_answer_as_redis_does() {
    need_redis();
    let nodes = pool(3);
    let refs: Vec<&Redis> = nodes.iter().collect();
    let proxy = Proxy::start(&refs, &["--hash-tag", "{}"]);
    let single = Redis::start();
    let mut seen = Vec::new();
    for addr in [single.addr(), proxy.addr()] {
        let mut c = Client::connect(&addr);
        let mut replies = Vec::new();
        let setup: Vec<Vec<&str>> = vec![
            vec!["RPUSH", "ids", "3", "1", "2", "4"],
            vec!["SADD", "set", "b", "a", "c"],
            vec!["ZADD", "z", "1", "x", "2", "y"],
            vec!["MSET", "w_1", "9", "w_2", "8", "w_3", "7"],
            vec!["MSET", "o_1", "obj1", "o_2", "obj2", "o_3", "obj3"],
            vec![
                "MSET", "a_a", "zz", "a_b", "yy", "a_c", "xx", "bad_1", "nan?",
            ],
            vec!["HSET", "h_1", "f", "3", "g", "one"],
            vec!["HSET", "h_2", "f", "1", "g", "two"],
            vec!["SET", "notalist", "x"],
            vec!["HSET", "w_4", "f", "1"],
        ];
        for cmd in &setup {
            c.cmd(cmd);
        }
        for args in [
            vec!["SORT", "ids", "BY", "w_*"],
            vec!["SORT", "ids", "BY", "w_*", "DESC"],
            vec!["SORT", "ids", "GET", "o_*"],
            vec!["SORT", "ids", "BY", "w_*", "GET", "#", "GET", "o_*"],
            vec!["SORT", "ids", "BY", "nosort", "GET", "#", "GET", "o_*"],
            vec!["SORT", "ids", "BY", "w_*", "LIMIT", "1", "2", "GET", "o_*"],
            vec!["SORT", "ids", "BY", "w_*", "LIMIT", "-1", "-1"],
            vec!["SORT_RO", "ids", "BY", "w_*"],
            vec!["SORT", "ids", "BY", "h_*->f", "GET", "h_*->g"],
            vec!["SORT", "ids", "BY", "w_*->", "GET", "#"],
            vec!["SORT", "set", "BY", "a_*", "ALPHA"],
            vec!["SORT", "set", "BY", "a_*", "ALPHA", "DESC", "GET", "a_*"],
            vec!["SORT", "z", "BY", "nosort", "GET", "o_*"],
            vec!["SORT", "ids", "BY", "bad_*"],
            vec!["SORT", "notalist", "BY", "w_*"],
            vec!["SORT", "ids", "BY", "w_*", "LIMIT", "x", "1"],
            vec!["SORT", "ids", "BY", "w_*", "BOGUS"],
            vec!["SORT", "missing", "BY", "w_*", "GET", "o_*"],
            vec!["SORT", "ids", "BY", "w_*", "GET", "o_*", "STORE", "out"],
            vec!["LRANGE", "out", "0", "-1"],
            vec!["SORT", "missing", "BY", "w_*", "STORE", "out"],
            vec!["EXISTS", "out"],
            vec!["SORT", "ids", "STORE", "out2"],
            vec!["LRANGE", "out2", "0", "-1"],
        ] {
            replies.push((args.join(" "), c.cmd(&args)));
        }
        // In one pipeline, a SORT sees the writes before it, and the reads after it see
        // what it stored.
        let piped = c.pipeline(&[
            vec!["SET", "w_1", "0"],
            vec!["SORT", "ids", "BY", "w_*", "STORE", "out3"],
            vec!["LRANGE", "out3", "0", "-1"],
        ]);
        replies.push(("pipeline".into(), Reply::Array(Some(piped))));
        seen.push(replies);
    }
    for (r, p) in seen[0].iter().zip(&seen[1]) {
        assert_eq!(
            r.1, p.1,
            "{}: redis-server, then the proxy over a pool",
            r.0
        );
    }
}

/// A command that stores its result, whose sources share a node and whose destination is on
/// another, was refused over a pool (keys on different nodes): now the result moves to the
/// destination's node, and every form answers, and leaves the destination, as one
/// redis-server does.
#[test]
fn a_store_destination_on_another_node_answers_as_redis_does() {
    need_redis();
    let nodes = pool(3);
    let refs: Vec<&Redis> = nodes.iter().collect();
    let proxy = Proxy::start(&refs, &["--hash-tag", "{}"]);
    // Destinations on another node than the sources' ({s}).
    let mut c = proxy.client();
    c.cmd(&["SET", "{s}probe", "1"]);
    let home = owner(&nodes, "{s}probe");
    let dests: Vec<String> = spread_keys("dst", 300)
        .into_iter()
        .filter(|k| {
            c.cmd(&["SET", k, "1"]);
            let away = owner(&nodes, k) != home;
            c.cmd(&["DEL", k]);
            away
        })
        .take(3)
        .collect();
    c.cmd(&["DEL", "{s}probe"]);
    let (d1, d2, d3) = (&dests[0], &dests[1], &dests[2]);
    let single = Redis::start();
    let mut seen = Vec::new();
    for addr in [single.addr(), proxy.addr()] {
        let mut c = Client::connect(&addr);
        let mut replies = Vec::new();
        for args in [
            vec!["SADD", "{s}a", "1", "2", "3"],
            vec!["SADD", "{s}b", "3", "4"],
            vec!["ZADD", "{s}z", "1", "a", "2", "b", "3", "c"],
            vec![
                "GEOADD", "{s}geo", "2.19", "41.43", "place1", "2.18", "41.40", "place2",
            ],
            vec!["SET", "{s}bits", "ab"],
            vec!["SET", d1, "old", "EX", "100"],
            vec!["SUNIONSTORE", d1, "{s}a", "{s}b"],
            vec!["SMEMBERS", d1],
            vec!["TTL", d1],
            vec!["SINTERSTORE", d1, "{s}a", "{s}missing"],
            vec!["EXISTS", d1],
            vec!["ZRANGESTORE", d2, "{s}z", "0", "1"],
            vec!["ZRANGE", d2, "0", "-1", "WITHSCORES"],
            vec![
                "GEOSEARCHSTORE",
                d2,
                "{s}geo",
                "FROMLONLAT",
                "2.19",
                "41.43",
                "BYRADIUS",
                "10",
                "km",
                "ASC",
                "STOREDIST",
            ],
            vec!["ZRANGE", d2, "0", "-1"],
            vec![
                "GEORADIUS",
                "{s}geo",
                "2.19",
                "41.43",
                "10",
                "km",
                "STORE",
                d3,
            ],
            vec!["ZRANGE", d3, "0", "-1", "WITHSCORES"],
            vec!["BITOP", "NOT", d3, "{s}bits"],
            vec!["GET", d3],
            vec!["COPY", "{s}a", d3],
            vec!["COPY", "{s}a", d3, "REPLACE"],
            vec!["SMEMBERS", d3],
            vec!["COPY", "{s}missing", d3, "REPLACE"],
            vec!["SCARD", d3],
            vec!["SUNIONSTORE", d1, "{s}z"],
        ] {
            let mut r = c.cmd(&args);
            if let Reply::Array(Some(items)) = &mut r {
                if args[0] == "SMEMBERS" {
                    items.sort_by_key(|i| i.as_str());
                }
            }
            replies.push((args.join(" "), r));
        }
        seen.push(replies);
    }
    for (r, p) in seen[0].iter().zip(&seen[1]) {
        assert_eq!(
            r.1, p.1,
            "{}: redis-server, then the proxy over a pool",
            r.0
        );
    }
    // No temporary key is left on any node.
    for n in &nodes {
        assert!(
            n.keys().iter().all(|k| !k.starts_with("saltshaker:store:")),
            "{:?}",
            n.keys()
        );
    }
}

const BUSY_SCRIPT: &str = "local t = redis.call('TIME') \
    while true do \
      local n = redis.call('TIME') \
      if (n[1] - t[1]) * 1000000 + (n[2] - t[2]) > 3000000 then break end \
    end \
    return 1";

/// A long script runs on its node's script lane: another client's command to that node
/// gets Redis's own BUSY at once (not the proxy's timeout), SCRIPT KILL through the proxy
/// ends the script, and the node serves again.
#[test]
fn a_busy_script_does_not_block_other_clients_who_get_busy_and_can_kill_it() {
    need_redis();
    let node = Redis::start_with(&["--busy-reply-threshold", "100"]);
    let proxy = Proxy::start(&[&node], &[]);
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["SET", "k", "v"]), Reply::ok());
    let addr = proxy.addr();
    let script = std::thread::spawn(move || {
        let mut a = Client::connect(&addr);
        a.set_read_timeout(Duration::from_secs(10));
        a.cmd(&["EVAL", BUSY_SCRIPT, "0"])
    });
    std::thread::sleep(Duration::from_millis(400));
    let asked = Instant::now();
    let r = c.cmd(&["GET", "k"]);
    let took = asked.elapsed();
    assert!(r.is_error() && r.err().starts_with("BUSY"), "{r}");
    assert!(
        took < Duration::from_millis(1500),
        "BUSY came after {took:?}"
    );
    assert_eq!(c.cmd(&["SCRIPT", "KILL"]), Reply::ok());
    let killed = script.join().unwrap();
    assert!(killed.is_error(), "{killed}");
    assert_eq!(c.cmd(&["GET", "k"]), Reply::bulk("v"));
}

/// Scripts and plain commands pipelined together still run in the order sent, though
/// they travel on two lanes.
#[test]
fn scripts_and_plain_commands_in_one_pipeline_run_in_order() {
    need_redis();
    let node = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let incr = "return redis.call('INCR', KEYS[1])";
    let mut cmds: Vec<Vec<&str>> = vec![vec!["SET", "n", "0"]];
    for _ in 0..50 {
        cmds.push(vec!["EVAL", incr, "1", "n"]);
        cmds.push(vec!["INCR", "n"]);
        cmds.push(vec!["GET", "n"]);
        cmds.push(vec!["EVAL", incr, "1", "n"]);
    }
    let through = proxy.client().pipeline(&cmds);
    let straight = node.client().pipeline(&cmds);
    assert_eq!(through, straight);
}

/// The other state changes that ride in a pipeline: RESET (database, name, protocol),
/// WATCH, MULTI/EXEC, and AUTH: each command is answered as Redis answers it when the same
/// write is sent to it directly.
#[test]
fn reset_watch_multi_and_auth_in_one_write_apply_from_the_next_command_on() {
    need_redis();
    let node = Redis::start_with(&["--requirepass", "pw"]);
    let proxy = Proxy::start_with_config(&[&node], "  password: pw\nauth:\n  password: pw", &[]);
    let cmds = [
        vec!["GET", "k"],
        vec!["AUTH", "wrong"],
        vec!["GET", "k"],
        vec!["AUTH", "pw"],
        vec!["SELECT", "4"],
        vec!["SET", "k", "in4"],
        vec!["CLIENT", "SETNAME", "before-reset"],
        vec!["RESET"],
        vec!["AUTH", "pw"],
        vec!["CLIENT", "GETNAME"],
        vec!["GET", "k"],
        vec!["SET", "k", "in0"],
        vec!["GET", "k"],
        vec!["WATCH", "k"],
        vec!["MULTI"],
        vec!["INCR", "n"],
        vec!["SET", "k", "tx"],
        vec!["EXEC"],
        vec!["SELECT", "4"],
        vec!["GET", "k"],
        vec!["SELECT", "0"],
        vec!["GET", "k"],
    ];
    let through = proxy.client().pipeline(&cmds);
    let mut direct = node.client();
    assert_eq!(direct.cmd(&["AUTH", "pw"]), Reply::ok());
    assert_eq!(direct.cmd(&["FLUSHALL"]), Reply::ok());
    let straight = node.client().pipeline(&cmds);
    for (i, c) in cmds.iter().enumerate() {
        let (t, s) = (&through[i], &straight[i]);
        if t.is_error() && s.is_error() {
            // The texts of a wrong password differ in wording only.
            let first = |r: &Reply| r.err().split(' ').next().unwrap_or("").to_string();
            assert_eq!(first(t), first(s), "reply {i} to {c:?}");
        } else {
            assert_eq!(t, s, "reply {i} to {c:?}");
        }
    }
    assert_eq!(through[19], Reply::bulk("in4"));
    assert_eq!(through[21], Reply::bulk("tx"));
}

/// WATCH holds its keys on a connection of its own; the commands a pipeline sends before
/// it, between it and EXEC, and after EXEC go on the shared one. Each runs in the order the
/// client sent it: a write of the session's own before EXEC aborts the transaction, as it
/// does on Redis, and a read after EXEC sees what EXEC wrote. Repeated, because a race
/// between the two connections shows only sometimes.
#[test]
fn watch_in_a_pipeline_is_ordered_with_the_commands_around_it() {
    need_redis();
    let node = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let cmds = [
        vec!["SET", "k", "a"],
        vec!["WATCH", "k"],
        vec!["GET", "k"],
        vec!["SET", "k", "b"],
        vec!["MULTI"],
        vec!["SET", "k", "c"],
        vec!["EXEC"],
        vec!["GET", "k"],
        vec!["WATCH", "k"],
        vec!["GET", "k"],
        vec!["MULTI"],
        vec!["INCR", "n"],
        vec!["SET", "k", "d"],
        vec!["EXEC"],
        vec!["GET", "k"],
        vec!["GET", "n"],
        vec!["DEL", "n"],
    ];
    let straight = node.client().pipeline(&cmds);
    assert_eq!(
        straight[6],
        Reply::Array(None),
        "Redis aborts the first EXEC"
    );
    let mut c = proxy.client();
    for round in 0..30 {
        let through = c.pipeline(&cmds);
        assert_eq!(through, straight, "round {round}");
    }
}
