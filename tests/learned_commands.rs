//! Commands the nodes know and the proxy's built-in table (Redis 7.0's) lacks: learned from
//! the nodes' `COMMAND INFO` at startup, then served like built-in ones. Checked against
//! real Redis 8.0.2 nodes (vector sets, hash field expiry, ZRANK ... WITHSCORE) over one
//! node, a pool and a Redis Cluster.

mod support;

use std::time::{Duration, Instant};
use support::cluster::RedisCluster;
use support::*;

fn unknown(r: &Reply) -> bool {
    r.is_error() && r.err().contains("unknown command")
}

/// Waits until the proxy at `addr` serves `probe`, a command it learns from its nodes.
fn wait_learned(addr: &str, probe: &str) {
    let end = Instant::now() + Duration::from_secs(10);
    let mut c = Client::connect(addr);
    loop {
        let r = c.cmd(&[probe, "probe:{x}"]);
        if !unknown(&r) {
            return;
        }
        assert!(
            Instant::now() < end,
            "VCARD still unknown through the proxy: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Every command a Redis 8.0.2 node lists in `COMMAND LIST` reaches it through the proxy
/// (or gets one of the documented refusals): none is `unknown command`. The ones the
/// built-in table lacks answer exactly as a node of their own answers them.
#[test]
fn no_command_a_redis_8_node_lists_is_unknown_through_the_proxy() {
    need_redis();
    every_listed_command_is_served(&redis8(), "VCARD");
}

/// The same for Valkey 9.1.2, with its own commands (DELIFEQ, MSETEX, COMMANDLOG, ...).
#[test]
fn no_command_a_valkey_9_node_lists_is_unknown_through_the_proxy() {
    need_redis();
    every_listed_command_is_served(&valkey9(), "DELIFEQ");
}

/// Sends every command a node of `bin` lists, without arguments, through a proxy in front
/// of one such node, once the proxy has learned `probe`.
fn every_listed_command_is_served(bin: &str, probe: &str) -> Vec<String> {
    let node = Redis::start_bin(bin, &[], free_port);
    let other = Redis::start_bin(bin, &[], free_port);
    let proxy = Proxy::start(&[&node], &[]);
    wait_learned(&proxy.addr(), probe);
    let names = other.client().cmd(&["COMMAND", "LIST"]).strings();
    assert!(names.len() > 240, "{} commands", names.len());
    let new: Vec<String> = {
        // The ones redis-server 7.0 does not know: those the proxy learned.
        let old = Redis::start();
        let mut o = old.client();
        names
            .iter()
            .filter(|n| o.cmd(&["COMMAND", "INFO", n.as_str()]).as_array()[0].is_nil())
            .cloned()
            .collect()
    };
    assert!(
        new.iter().any(|n| n.eq_ignore_ascii_case(probe)),
        "{probe} is not new: {new:?}"
    );
    let mut refused = Vec::new();
    for name in &names {
        let mut c = proxy.client();
        c.set_read_timeout(Duration::from_secs(3));
        // A subcommand (`parent|sub`, as Redis 7.2+ lists them) is sent as PARENT SUB.
        let cmd: Vec<&str> = name.split('|').collect();
        let r = c.try_cmd(&cmd).unwrap_or_else(|e| panic!("{name}: {e}"));
        // The containers the proxy answers itself keep their own subcommands (README).
        let own = ["client", "cluster", "acl"].contains(&cmd[0]);
        assert!(
            !unknown(&r) && !(r.is_error() && r.err().contains("unknown subcommand") && !own),
            "{name}: {r:?}"
        );
        if r.is_error() && r.err().starts_with("ERR saltshaker:") {
            refused.push(name.clone());
        }
        if new.contains(name) && !own {
            let direct = other.client().cmd(&cmd);
            assert_eq!(r, direct, "{name}, without arguments");
        }
    }
    eprintln!("{bin}: new since 7.0 ({}): {new:?}", new.len());
    eprintln!("{bin}: refused through the proxy: {refused:?}");
    new
}

/// Redis 8's commands and forms through the proxy, reply for reply as a node of its own
/// gives them.
#[test]
fn redis_8_commands_and_forms_answer_as_the_node_does() {
    need_redis();
    let bin = redis8();
    let node = Redis::start_bin(&bin, &[], free_port);
    let other = Redis::start_bin(&bin, &[], free_port);
    let proxy = Proxy::start(&[&node], &[]);
    for cmd in ["VADD", "VCARD", "VDIM", "VSIM", "VISMEMBER", "VREM"] {
        wait_learned(&proxy.addr(), cmd);
    }
    // Forms newer than 7.0 of commands the table has: ZRANK ... WITHSCORE (7.2), learned
    // in the same pass, which may end a little after VCARD's.
    let mut c = proxy.client();
    let end = Instant::now() + Duration::from_secs(10);
    while c.cmd(&["ZRANK", "z", "b", "WITHSCORE"]).is_error() {
        assert!(Instant::now() < end, "ZRANK ... WITHSCORE still refused");
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut c = proxy.client();
    let mut d = other.client();
    for cmd in [
        vec!["ZADD", "z", "1", "a", "2", "b"],
        vec!["ZRANK", "z", "b", "WITHSCORE"],
        vec!["ZREVRANK", "z", "b", "WITHSCORE"],
        vec!["HSETEX", "h", "EX", "100", "FIELDS", "1", "f", "v"],
        vec!["HGETEX", "h", "PERSIST", "FIELDS", "1", "f"],
        vec!["HGETDEL", "h", "FIELDS", "1", "f"],
        vec!["VADD", "v", "VALUES", "2", "1", "0", "a"],
        vec!["VADD", "v", "VALUES", "2", "0", "1", "b"],
        vec!["VCARD", "v"],
        vec!["VDIM", "v"],
        vec!["VSIM", "v", "VALUES", "2", "1", "0", "COUNT", "1"],
        vec!["VISMEMBER", "v", "a"],
        vec!["VREM", "v", "a"],
        vec!["VCARD", "v"],
    ] {
        assert_eq!(c.cmd(&cmd), d.cmd(&cmd), "{cmd:?}");
    }
    // The keys went to the node, and a learned write is counted as a write by detection.
    assert_eq!(node.client().cmd(&["VCARD", "v"]), Reply::Int(1));
}

/// Vector sets over a pool whose keys are on different nodes, and over a Redis Cluster:
/// each key reaches its own node, and a command over keys of two nodes gets the usual
/// cross-node error.
#[test]
fn vector_sets_reach_each_keys_node_over_a_pool_and_a_cluster() {
    need_redis();
    let bin = redis8();
    let nodes: Vec<Redis> = (0..2)
        .map(|_| Redis::start_bin(&bin, &[], free_port))
        .collect();
    let refs: Vec<&Redis> = nodes.iter().collect();
    let proxy = Proxy::start(&refs, &[]);
    for cmd in ["VADD", "VCARD", "VISMEMBER"] {
        wait_learned(&proxy.addr(), cmd);
    }
    let keys = spread_keys("vec:", 2);
    let mut c = proxy.client();
    for (i, k) in keys.iter().enumerate() {
        let x = (i + 1).to_string();
        assert_eq!(
            c.cmd(&["VADD", k, "VALUES", "2", &x, "0", "m"]),
            Reply::Int(1)
        );
        assert_eq!(c.cmd(&["VCARD", k]), Reply::Int(1));
        let owner = owner(&nodes, k);
        assert_eq!(
            nodes[owner].client().cmd(&["VCARD", k]),
            Reply::Int(1),
            "{k}"
        );
        assert_eq!(
            nodes[1 - owner].client().cmd(&["VCARD", k]),
            Reply::Int(0),
            "{k}"
        );
    }

    let cluster = RedisCluster::start_bin(&bin, 3, 1);
    let proxy = Proxy::start_cluster(&cluster.seeds(), &[]);
    for cmd in ["VADD", "VCARD", "VISMEMBER"] {
        wait_learned(&proxy.addr(), cmd);
    }
    let mut c = proxy.client();
    let mut masters = std::collections::HashSet::new();
    for i in 0..12 {
        let k = format!("cvec:{i}");
        assert_eq!(
            c.cmd(&["VADD", &k, "VALUES", "2", "1", "1", "m"]),
            Reply::Int(1)
        );
        assert_eq!(c.cmd(&["VISMEMBER", &k, "m"]), Reply::Int(1));
        let m = cluster.master_of(&k);
        masters.insert(m);
        assert_eq!(
            cluster.nodes[m].client().cmd(&["VCARD", &k]),
            Reply::Int(1),
            "{k}"
        );
    }
    assert!(masters.len() > 1, "the keys span masters");
}

/// Valkey 9's DELIFEQ and MSETEX over one node, a pool (keys on different nodes) and a
/// cluster: each key on its own node, MSETEX's keys together or the cross-node error.
#[test]
fn valkey_9_delifeq_and_msetex_over_one_node_a_pool_and_a_cluster() {
    need_redis();
    let bin = valkey9();
    let nodes: Vec<Redis> = (0..2)
        .map(|_| Redis::start_bin(&bin, &[], free_port))
        .collect();
    let refs: Vec<&Redis> = nodes.iter().collect();
    for (i, proxy) in [Proxy::start(&refs[..1], &[]), Proxy::start(&refs, &[])]
        .into_iter()
        .enumerate()
    {
        wait_learned(&proxy.addr(), "DELIFEQ");
        wait_learned(&proxy.addr(), "MSETEX");
        wait_learned(&proxy.addr(), "MSETEX");
        let mut c = proxy.client();
        // Two keys, on two nodes over the pool.
        let mut keys = spread_keys(&format!("vk{i}:"), 8);
        for k in &keys {
            assert_eq!(c.cmd(&["SET", k, "x"]), Reply::ok());
        }
        if i == 1 {
            let first = owner(&nodes, &keys[0]);
            let other = keys.iter().position(|k| owner(&nodes, k) != first).unwrap();
            keys.swap(1, other);
        }
        keys.truncate(2);
        for k in &keys {
            assert_eq!(c.cmd(&["SET", k, "v1"]), Reply::ok());
            assert_eq!(c.cmd(&["DELIFEQ", k, "other"]), Reply::Int(0));
            assert_eq!(c.cmd(&["DELIFEQ", k, "v1"]), Reply::Int(1));
            assert!(c.cmd(&["GET", k]).is_nil());
        }
        let r = c.cmd(&["MSETEX", "2", "{t}a", "1", "{t}b", "2", "EX", "100"]);
        assert_eq!(r, Reply::Int(1), "{r:?}");
        assert_eq!(c.cmd(&["GET", "{t}b"]), Reply::bulk("2"));
        let r = c.cmd(&["MSETEX", "2", &keys[0], "1", &keys[1], "2", "EX", "100"]);
        if i == 1 {
            assert!(r.is_error() && r.err().contains("different nodes"), "{r:?}");
        } else {
            assert_eq!(r, Reply::Int(1));
        }
    }

    let cluster = RedisCluster::start_bin(&bin, 3, 1);
    let proxy = Proxy::start_cluster(&cluster.seeds(), &[]);
    wait_learned(&proxy.addr(), "DELIFEQ");
    wait_learned(&proxy.addr(), "MSETEX");
    let mut c = proxy.client();
    for i in 0..8 {
        let k = format!("cvk:{i}");
        assert_eq!(c.cmd(&["SET", &k, "x"]), Reply::ok());
        assert_eq!(c.cmd(&["DELIFEQ", &k, "x"]), Reply::Int(1));
        let m = cluster.master_of(&k);
        assert_eq!(
            cluster.nodes[m].client().cmd(&["EXISTS", &k]),
            Reply::Int(0)
        );
    }
    let r = c.cmd(&["MSETEX", "2", "{c}a", "1", "{c}b", "2", "PX", "100000"]);
    assert_eq!(r, Reply::Int(1), "{r:?}");
    let r = c.cmd(&["MSETEX", "2", "a{1}", "1", "b{2}", "2"]);
    assert!(r.is_error() && r.err().starts_with("CROSSSLOT"), "{r:?}");
}

/// A module's commands, from Redis's own test module of key specs (`keyspecs.c`): one
/// whose keys a single range spec gives (`kspec.none`, keys at 1, 3, 5, ...) goes to its
/// keys' node over a pool, or gets the cross-node error; ones whose specs do not say where
/// the keys are (two ranges, a keyword search) are placed by the node's `COMMAND GETKEYS`,
/// with the same error for keys on two nodes. Over one node every one answers as the node
/// does.
#[test]
fn a_modules_commands_are_learned_from_their_key_specs() {
    need_redis();
    let bin = redis8();
    let module = keyspecs_module();
    let args = ["--loadmodule", module.as_str()];
    let nodes: Vec<Redis> = (0..2)
        .map(|_| Redis::start_bin(&bin, &args, free_port))
        .collect();
    let other = Redis::start_bin(&bin, &args, free_port);
    let commands = [
        "kspec.none",
        "kspec.nonewithgetkeys",
        "kspec.tworanges",
        "kspec.tworangeswithgap",
        "kspec.keyword",
        "kspec.complex1",
        "kspec.complex2",
    ];
    let one = Proxy::start(&[&nodes[0]], &[]);
    for name in commands {
        wait_learned(&one.addr(), name);
    }
    let mut c = one.client();
    let mut d = other.client();
    for name in commands {
        for argv in [
            vec![name, "k1", "v1", "k2", "v2"],
            vec![name, "k1", "KEYS", "k2", "k3"],
        ] {
            assert_eq!(c.cmd(&argv), d.cmd(&argv), "{argv:?} over one node");
        }
    }

    let refs: Vec<&Redis> = nodes.iter().collect();
    let pool = Proxy::start(&refs, &[]);
    for name in commands {
        wait_learned(&pool.addr(), name);
    }
    let mut c = pool.client();
    let keys = spread_keys("mod:", 8);
    for k in &keys {
        assert_eq!(c.cmd(&["SET", k, "x"]), Reply::ok());
    }
    let owners: Vec<usize> = keys.iter().map(|k| owner(&nodes, k)).collect();
    let on = |n: usize| {
        keys.iter()
            .zip(&owners)
            .filter(|(_, &o)| o == n)
            .map(|(k, _)| k.as_str())
            .collect::<Vec<_>>()
    };
    let (zero, first) = (on(0), on(1));
    assert!(
        !zero.is_empty() && !first.is_empty(),
        "keys on both nodes: {owners:?}"
    );
    let before = calls(&nodes[1], "kspec.none");
    assert_eq!(
        c.cmd(&["kspec.none", first[0], "v"]),
        Reply::Simple("OK".into())
    );
    assert_eq!(
        calls(&nodes[1], "kspec.none"),
        before + 1,
        "it ran on its key's node"
    );
    let r = c.cmd(&["kspec.none", zero[0], "v", first[0], "v"]);
    assert!(r.is_error() && r.err().contains("different nodes"), "{r:?}");
    // The ones whose specs the proxy cannot read: a node is asked `COMMAND GETKEYS`, and
    // the command goes to its keys' node, or gets the cross-node error.
    assert!(first.len() >= 2, "two keys on node 1: {owners:?}");
    for argv in [
        vec!["kspec.tworanges", first[0], first[1]],
        vec!["kspec.keyword", "x", "KEYS", first[0], first[1]],
        vec!["kspec.complex1", first[1]],
    ] {
        let before = calls(&nodes[1], argv[0]);
        assert_eq!(c.cmd(&argv), Reply::Simple("OK".into()), "{argv:?}");
        assert_eq!(
            calls(&nodes[1], argv[0]),
            before + 1,
            "{argv:?} ran on its keys' node"
        );
    }
    for argv in [
        vec!["kspec.tworanges", zero[0], first[0]],
        vec!["kspec.keyword", "x", "KEYS", zero[0], first[0]],
    ] {
        let r = c.cmd(&argv);
        assert!(
            r.is_error() && r.err().contains("different nodes"),
            "{argv:?}: {r:?}"
        );
    }
    // Arguments the node refuses: its own error, as directly.
    assert_eq!(
        c.cmd(&["kspec.keyword", "x"]),
        other.client().cmd(&["kspec.keyword", "x"])
    );
}

/// The module's commands over a Redis Cluster of 8.0.2 nodes: one with a plain key spec,
/// and ones whose keys only the node can find (`COMMAND GETKEYS`), reach their keys' master;
/// keys of two slots get CROSSSLOT.
#[test]
fn a_modules_commands_reach_their_keys_master_over_a_cluster() {
    need_redis();
    let module = keyspecs_module();
    let cluster = RedisCluster::start_bin_with(&redis8(), 3, 0, &["--loadmodule", module.as_str()]);
    let proxy = Proxy::start_cluster(&cluster.seeds(), &[]);
    for name in ["kspec.none", "kspec.tworanges", "kspec.keyword"] {
        wait_learned(&proxy.addr(), name);
    }
    let mut c = proxy.client();
    for (i, argv) in [
        vec!["kspec.none", "{m}a", "v"],
        vec!["kspec.tworanges", "{m}a", "{m}b"],
        vec!["kspec.keyword", "x", "KEYS", "{m}a", "{m}b"],
    ]
    .into_iter()
    .enumerate()
    {
        let home = cluster.master_of("{m}a");
        let before = calls(&cluster.nodes[home], argv[0]);
        assert_eq!(c.cmd(&argv), Reply::Simple("OK".into()), "{i}: {argv:?}");
        assert_eq!(
            calls(&cluster.nodes[home], argv[0]),
            before + 1,
            "{argv:?} on its master"
        );
    }
    for argv in [
        vec!["kspec.tworanges", "{m}a", "{n}b"],
        vec!["kspec.keyword", "x", "KEYS", "{m}a", "{n}b"],
    ] {
        let r = c.cmd(&argv);
        assert!(
            r.is_error() && r.err().starts_with("CROSSSLOT"),
            "{argv:?}: {r:?}"
        );
    }
}

/// A node restarted with a module loaded teaches the proxy its commands as soon as the
/// proxy has reconnected: within seconds, not at the next minute's check.
#[test]
fn a_node_restarted_with_a_module_teaches_its_commands_once_reconnected() {
    need_redis();
    let bin = redis8();
    let module = keyspecs_module();
    let mut node = Redis::start_bin(&bin, &[], free_port);
    let proxy = Proxy::start(&[&node], &[]);
    wait_learned(&proxy.addr(), "VCARD");
    let mut c = proxy.client();
    assert!(unknown(&c.cmd(&["kspec.none", "k1", "v1"])));
    node.restart_with(&["--loadmodule", module.as_str()]);
    let start = Instant::now();
    loop {
        let r = c.cmd(&["kspec.none", "k1", "v1"]);
        if r == Reply::Simple("OK".into()) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the module's command still not served after the node came back: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
