//! COMMAND through the proxy says what the proxy serves: a node's commands less the ones
//! the proxy refuses, plus its own (HOTKEYS, SALTSHAKER.INCRBY). Compared field by field
//! with a real Redis 8.0.2 node's replies for the commands they share; every command the
//! proxy leaves out of `COMMAND LIST` is one it refuses, and HELLO reports the nodes'
//! version only once their commands are learned.

mod support;

use std::collections::BTreeSet;
use support::*;

fn names(r: &Reply) -> BTreeSet<String> {
    r.as_array()
        .iter()
        .map(|n| n.as_str().to_lowercase())
        .collect()
}

#[test]
fn command_through_the_proxy_lists_what_it_serves() {
    need_redis();
    let bin = redis8();
    let node = Redis::start_bin(&bin, &[], free_port);
    let other = Redis::start_bin(&bin, &[], free_port);
    let proxy = Proxy::start(&[&node], &[]);
    let mut c = proxy.client();
    let mut d = other.client();

    // HELLO's version comes with its commands: VADD is served when 8.0.2 is reported.
    let hello = c.cmd(&["HELLO", "2"]);
    let fields = hello.as_array();
    let at = fields.iter().position(|f| f.as_str() == "version").unwrap();
    assert_eq!(fields[at + 1].as_str(), "8.0.2");
    assert_eq!(c.cmd(&["VCARD", "nothing"]), Reply::Int(0));

    // Shared commands: the node's own entries and docs, field by field (a container's
    // subcommands come in each process's own hash order, so none is compared whole).
    for argv in [
        vec!["COMMAND", "INFO", "GET", "VADD", "ZRANK", "XREADGROUP"],
        vec!["COMMAND", "DOCS", "GET", "VSIM"],
    ] {
        assert_eq!(c.cmd(&argv), d.cmd(&argv), "{argv:?}");
    }
    let geo = ["COMMAND", "LIST", "FILTERBY", "ACLCAT", "geo"];
    assert_eq!(names(&c.cmd(&geo)), names(&d.cmd(&geo)));

    // Refused ones are nil, as an unknown name is; the proxy's own are described.
    let info = c.cmd(&[
        "COMMAND",
        "INFO",
        "SAVE",
        "SHUTDOWN",
        "SALTSHAKER.INCRBY",
        "HOTKEYS",
    ]);
    let e = info.as_array();
    assert!(
        matches!(e[0], Reply::Bulk(None) | Reply::Array(None) | Reply::Null),
        "{e:?}"
    );
    assert!(
        matches!(e[1], Reply::Bulk(None) | Reply::Array(None) | Reply::Null),
        "{e:?}"
    );
    let incrby = e[2].as_array();
    assert_eq!(incrby[0].as_str(), "saltshaker.incrby");
    assert_eq!(incrby[1], Reply::Int(4));
    assert_eq!(
        (&incrby[3], &incrby[4], &incrby[5]),
        (&Reply::Int(1), &Reply::Int(1), &Reply::Int(1))
    );
    let hot = e[3].as_array();
    assert_eq!(hot[0].as_str(), "hotkeys");
    assert_eq!(
        hot[9].as_array().len(),
        4,
        "HOTKEYS START, STOP, GET, RESET"
    );
    // A container's refused subcommands are left out of its entry.
    let cluster = c.cmd(&["COMMAND", "INFO", "CLUSTER"]);
    let subs = names(&Reply::Array(Some(
        cluster.as_array()[0].as_array()[9]
            .as_array()
            .iter()
            .map(|s| s.as_array()[0].clone())
            .collect(),
    )));
    assert!(
        subs.contains("cluster|slots") && !subs.contains("cluster|addslots"),
        "{subs:?}"
    );

    // LIST: the node's less the refused, plus the proxy's own; COUNT agrees with it.
    let theirs = names(&d.cmd(&["COMMAND", "LIST"]));
    let ours = names(&c.cmd(&["COMMAND", "LIST"]));
    let added: Vec<&String> = ours.difference(&theirs).collect();
    assert_eq!(added, vec!["hotkeys", "saltshaker.incrby"]);
    let dropped: Vec<&String> = theirs.difference(&ours).collect();
    for name in [
        "save",
        "shutdown",
        "sync",
        "module",
        "cluster|addslots",
        "failover",
    ] {
        assert!(
            dropped.iter().any(|d| *d == name),
            "{name} left out: {dropped:?}"
        );
    }
    // Every command left out is refused through the proxy (with 0 to 3 arguments, one
    // count passes its arity; a container's HELP is refused as well).
    for name in dropped.iter().filter(|n| !n.contains('|')) {
        let mut tries: Vec<Vec<&str>> = (0..4)
            .map(|n| {
                std::iter::once(name.as_str())
                    .chain(std::iter::repeat_n("x", n))
                    .collect()
            })
            .collect();
        tries.push(vec![name.as_str(), "HELP"]);
        let refused = tries.iter().any(|argv| {
            let r = c.cmd(argv);
            r.is_error() && r.err().starts_with("ERR saltshaker:")
        });
        assert!(
            refused,
            "{name} is left out of COMMAND LIST but not refused"
        );
    }
    let top = ours.iter().filter(|n| !n.contains('|')).count() as i64;
    assert_eq!(c.cmd(&["COMMAND", "COUNT"]), Reply::Int(top));
    let all = c.cmd(&["COMMAND"]);
    assert_eq!(
        all.as_array().len() as i64,
        top,
        "COMMAND lists each command once"
    );
    assert_eq!(
        c.cmd(&["COMMAND", "LIST", "FILTERBY", "PATTERN", "salt*"]),
        Reply::Array(Some(vec![Reply::Bulk(Some(b"saltshaker.incrby".to_vec()))]))
    );
    // INFO says what HELLO reports and how many commands were learned.
    let info = c.cmd(&["INFO", "proxy"]).as_str();
    assert!(info.contains("hello_version:8.0.2"), "{info}");
    let learned: usize = info
        .lines()
        .find_map(|l| l.strip_prefix("learned_commands:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap();
    assert!(learned >= 12, "the vector-set commands at least: {info}");
}

/// Over a Valkey 9.1.2 node: what the proxy leaves out of COMMAND LIST is what it does not
/// serve, subcommands included (Valkey's newer CLUSTER subcommands, which the proxy's own
/// CLUSTER does not know); the rest of the node's list is there.
#[test]
fn over_valkey_command_list_leaves_out_only_what_the_proxy_does_not_serve() {
    need_redis();
    let node = Redis::start_bin(&valkey9(), &[], free_port);
    let proxy = Proxy::start(&[&node], &[]);
    let mut c = proxy.client();
    let theirs = names(&node.client().cmd(&["COMMAND", "LIST"]));
    let ours = names(&c.cmd(&["COMMAND", "LIST"]));
    let dropped: Vec<&String> = theirs.difference(&ours).collect();
    assert!(
        dropped.iter().any(|d| *d == "cluster|slot-stats"),
        "{dropped:?}"
    );
    assert!(ours.contains("delifeq") && ours.contains("msetex") && ours.contains("client|capa"));
    for name in dropped {
        // 0 to 3 arguments: one count passes its arity.
        let refused = (0..4).any(|n| {
            let argv: Vec<&str> = name.split('|').chain(std::iter::repeat_n("x", n)).collect();
            let r = c.cmd(&argv);
            r.is_error()
                && (r.err().starts_with("ERR saltshaker:")
                    || r.err().contains("unknown subcommand"))
        });
        assert!(refused, "{name} is left out of COMMAND LIST but served");
    }
}
