//! Defects that more clients' own test suites found (ioredis, hiredis, Predis, Redis's TCL
//! suite): each checked here against a real redis-server given the same commands, field
//! by field, with a raw RESP client.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};
use support::*;

/// The value of `field` in a `k=v k=v` line.
fn field(line: &str, name: &str) -> String {
    line.split(' ')
        .find_map(|f| f.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name} in {line}"))
        .trim()
        .to_string()
}

/// The value of `name` in an INFO reply.
fn info_field(info: &Reply, name: &str) -> i64 {
    let text = info.as_str();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in INFO:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Redis writes a script call's MONITOR line itself, before the script runs (EVAL,
/// EVALSHA, EVAL_RO, FCALL, FCALL_RO are CMD_SKIP_MONITOR only for that): the proxy shows
/// the same lines, inside MULTI too. The script's own commands (`[0 lua] ...`) run inside
/// the node, where the proxy cannot see them: they are left out of the comparison.
#[test]
fn monitor_shows_script_calls_as_redis_does() {
    need_redis();
    let node = Redis::start();
    let other = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let script = "return redis.call('get', KEYS[1])";
    let lib = "#!lua name=suite\nredis.register_function{function_name='getk', callback=function(keys) return redis.call('get', keys[1]) end, flags={'no-writes'}}";
    let mut seen = Vec::new();
    for addr in [other.addr(), proxy.addr()] {
        let mut c = Client::connect(&addr);
        let sha = c.cmd(&["SCRIPT", "LOAD", script]).as_str();
        assert_eq!(
            c.cmd(&["FUNCTION", "LOAD", "REPLACE", lib]),
            Reply::bulk("suite")
        );
        let mut m = Client::connect(&addr);
        assert_eq!(m.cmd(&["MONITOR"]), Reply::ok(), "{addr}");
        let me = field(&c.cmd(&["CLIENT", "INFO"]).as_str(), "addr");
        c.cmd(&["EVAL", script, "1", "k"]);
        c.cmd(&["EVALSHA", &sha, "1", "k"]);
        c.cmd(&["EVAL_RO", script, "1", "k"]);
        c.cmd(&["FCALL", "getk", "1", "k"]);
        c.cmd(&["FCALL_RO", "getk", "1", "k"]);
        let r = c.pipeline(&[
            vec!["MULTI"],
            vec!["EVAL", script, "1", "k"],
            vec!["SET", "k", "v"],
            vec!["EXEC"],
        ]);
        assert_eq!(r[3].as_array().len(), 2, "{addr}: {r:?}");
        let want = 10;
        let mut lines = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while lines.len() < want && Instant::now() < deadline {
            let Reply::Simple(l) = m.read_reply() else {
                panic!("{addr}: MONITOR sends simple strings")
            };
            let (_, rest) = l.split_once(' ').unwrap();
            if rest.contains(" lua] ") {
                continue;
            }
            lines.push(rest.replace(&me, "CLIENT"));
        }
        seen.push(lines);
    }
    let sha = "[0 CLIENT] \"EVALSHA\"";
    assert!(
        seen[0].iter().any(|l| l.starts_with(sha)),
        "redis-server: {:?}",
        seen[0]
    );
    assert_eq!(seen[0].len(), 10, "redis-server's lines: {:?}", seen[0]);
    assert_eq!(seen[1], seen[0], "the proxy's lines");
}

/// Redis queues UNWATCH, SELECT, CLIENT SETNAME, CLIENT ID and the rest inside MULTI and
/// runs them in EXEC; it refuses SAVE (and the other `no-multi` commands) with its own
/// text, and the EXEC is then aborted.
#[test]
fn connection_commands_inside_multi_are_queued_and_run_in_exec_as_redis_does() {
    need_redis();
    let node = Redis::start();
    let other = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let scripts: Vec<Vec<Vec<&str>>> = vec![
        vec![
            vec!["MULTI"],
            vec!["SET", "a", "1"],
            vec!["UNWATCH"],
            vec!["EXEC"],
            vec!["GET", "a"],
        ],
        vec![
            vec!["MULTI"],
            vec!["CLIENT", "SETNAME", "nm"],
            vec!["CLIENT", "GETNAME"],
            vec!["SET", "b", "2"],
            vec!["PING"],
            vec!["EXEC"],
            vec!["CLIENT", "GETNAME"],
        ],
        vec![
            vec!["MULTI"],
            vec!["SELECT", "1"],
            vec!["SET", "sel", "1"],
            vec!["EXEC"],
            vec!["GET", "sel"],
            vec!["SELECT", "0"],
            vec!["GET", "sel"],
        ],
        vec![
            vec!["MULTI"],
            vec!["SELECT", "99"],
            vec!["SET", "x", "1"],
            vec!["EXEC"],
            vec!["GET", "x"],
        ],
        vec![vec!["MULTI"], vec!["SELECT", "x"], vec!["EXEC"]],
        vec![
            vec!["MULTI"],
            vec!["SET", "c", "1"],
            vec!["SAVE"],
            vec!["EXEC"],
            vec!["GET", "c"],
        ],
        vec![
            vec!["MULTI"],
            vec!["WATCH", "w"],
            vec!["SET", "d", "1"],
            vec!["EXEC"],
        ],
        vec![vec!["MULTI"], vec!["CLIENT", "SETNAME"], vec!["EXEC"]],
    ];
    for (i, script) in scripts.iter().enumerate() {
        let direct = other.client().pipeline(script);
        let through = proxy.client().pipeline(script);
        assert_eq!(through, direct, "script {i}: {script:?}");
    }
    // The database a SELECT inside MULTI chose is where the key went, on the node too.
    let mut n = node.client();
    assert!(n.cmd(&["GET", "sel"]).is_nil());
    assert_eq!(n.cmd(&["SELECT", "1"]), Reply::ok());
    assert_eq!(n.cmd(&["GET", "sel"]), Reply::bulk("1"));
    // CLIENT ID inside MULTI is the client's own id, as outside.
    let mut c = proxy.client();
    let id = c.cmd(&["CLIENT", "ID"]);
    let r = c.pipeline(&[
        vec!["MULTI"],
        vec!["CLIENT", "ID"],
        vec!["GET", "a"],
        vec!["EXEC"],
    ]);
    assert_eq!(r[3].as_array(), [id, Reply::bulk("1")], "{r:?}");
    // The proxy's shared connections stayed in database 0.
    for _ in 0..20 {
        assert_eq!(proxy.client().cmd(&["GET", "a"]), Reply::bulk("1"));
    }
}

/// A subscriber that sends SUBSCRIBE without waiting for its confirmation, and a
/// publisher that publishes at once on a connection already open (as Predis's tests do):
/// how many of 100 messages the subscriber never gets.
fn lost_publishes(addr: &str) -> usize {
    let mut publisher = Client::connect(addr);
    let mut lost = 0;
    for i in 0..100 {
        let ch = format!("race:{i}");
        // The subscriber's connection is open and has been used, as a client's is.
        let mut sub = TcpStream::connect(addr).unwrap();
        sub.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        sub.write_all(&encode(&["PING"])).unwrap();
        let mut pong = [0u8; 7];
        sub.read_exact(&mut pong).unwrap();
        assert_eq!(&pong, b"+PONG\r\n");
        sub.write_all(&encode(&["SUBSCRIBE", &ch])).unwrap();
        let got = publisher.cmd(&["PUBLISH", &ch, "hello"]).as_int();
        if got == 0 {
            lost += 1;
        } else {
            let mut seen = Vec::new();
            let mut buf = [0u8; 256];
            while !String::from_utf8_lossy(&seen).contains("hello") {
                match sub.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => seen.extend_from_slice(&buf[..n]),
                }
            }
            assert!(
                String::from_utf8_lossy(&seen).contains("hello"),
                "counted as delivered, never seen"
            );
        }
    }
    lost
}

#[test]
fn a_publish_right_after_another_connections_subscribe_is_not_lost() {
    need_redis();
    let node = Redis::start();
    let other = Redis::start();
    // One worker thread reads both clients in the order they wrote, as redis-server
    // does: nothing may be lost (before the spare connections: 96-99 of 100). Two threads
    // read them in parallel and race, more often the busier the machine: that figure is
    // printed, not held to (bench/README.md, "A PUBLISH right after a SUBSCRIBE").
    for threads in ["1", "2"] {
        let proxy = Proxy::start(&[&node], &["--threads", threads]);
        let direct = lost_publishes(&other.addr());
        let through = lost_publishes(&proxy.addr());
        eprintln!("--threads {threads}: lost of 100: direct {direct}, through the proxy {through}");
        if threads == "1" {
            assert!(
                through <= direct,
                "--threads 1: lost of 100: direct {direct}, through the proxy {through}"
            );
        }
    }
    let proxy = Proxy::start(&[&node], &[]);
    // A subscriber that named itself keeps its name on the node's connection.
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["CLIENT", "SETNAME", "listener"]), Reply::ok());
    let r = c.cmd(&["SUBSCRIBE", "named"]);
    assert_eq!(r.as_array()[0], Reply::bulk("subscribe"));
    let list = node.client().cmd(&["CLIENT", "LIST"]).as_str();
    assert!(list.contains("name=listener"), "{list}");
    assert_eq!(
        proxy.client().cmd(&["PUBLISH", "named", "m"]),
        Reply::Int(1)
    );
    let m = c.read_reply();
    assert_eq!(m.as_array()[2], Reply::bulk("m"));
}

/// A script that keeps its node busy for 50 ms.
const SPIN: &str = "local t = redis.call('TIME') local start = t[1] * 1000000 + t[2] \
    while true do local n = redis.call('TIME') \
    if n[1] * 1000000 + n[2] - start > 50000 then break end end return 1";

/// Redis's stream tests: XREADGROUP ... BLOCK 0, wait for `blocked_clients`, DEL the key,
/// expect the blocked client's UNBLOCKED error. Through the proxy a client counts as
/// blocked only once its node has it blocked, so the DEL always comes after.
#[test]
fn a_client_counts_as_blocked_only_once_its_node_has_blocked_it() {
    need_redis();
    let node = Redis::start_with(&["--tcp-backlog", "1"]);
    let other = Redis::start_with(&["--tcp-backlog", "1"]);
    let proxy = Proxy::start_with_config(&[&node], "  connect_timeout_ms: 5000", &[]);
    let (other_addr, node_addr) = (other.addr(), node.addr());
    for (name, addr) in [("redis", other.addr()), ("proxy", proxy.addr())] {
        for round in 0..3 {
            let key = format!("s:{round}");
            let mut c = Client::connect(&addr);
            assert_eq!(
                c.cmd(&["XGROUP", "CREATE", &key, "g", "$", "MKSTREAM"]),
                Reply::ok()
            );
            // The node is busy for a moment (a script that spins 50 ms) and its accept
            // queue (`tcp-backlog 1`) fills meanwhile, so a new connection to it waits for
            // its SYN to be sent again, as under load: the proxy's connection for the
            // blocking command too.
            let target = if name == "redis" {
                other_addr.clone()
            } else {
                node_addr.clone()
            };
            let mut busy = Client::connect(&target);
            busy.send_raw(&encode(&["EVAL", SPIN, "0"]));
            std::thread::sleep(Duration::from_millis(5));
            let fillers: Vec<_> = (0..4)
                .map(|_| {
                    let t = target.clone();
                    std::thread::spawn(move || TcpStream::connect(t))
                })
                .collect();
            std::thread::sleep(Duration::from_millis(5));
            let blocker_addr = addr.clone();
            let k = key.clone();
            let blocker = std::thread::spawn(move || {
                let mut b = Client::connect(&blocker_addr);
                b.cmd(&[
                    "XREADGROUP",
                    "GROUP",
                    "g",
                    "c",
                    "BLOCK",
                    "0",
                    "STREAMS",
                    &k,
                    ">",
                ])
            });
            // As fast as the test suites poll: no pause between two INFOs.
            let end = Instant::now() + Duration::from_secs(5);
            while info_field(&c.cmd(&["INFO", "clients"]), "blocked_clients") != 1 {
                assert!(Instant::now() < end, "{name}: no blocked client seen");
            }
            assert_eq!(c.cmd(&["DEL", &key]), Reply::Int(1));
            let got = blocker.join().unwrap();
            assert!(
                got.is_error() && got.err().starts_with("UNBLOCKED"),
                "{name}, round {round}: {got:?}"
            );
            assert_eq!(busy.read_reply(), Reply::Int(1));
            for f in fillers {
                let _ = f.join();
            }
        }
    }
}

/// `~*` is `allkeys` and `&*` is `allchannels`: Redis 7.0 takes them again after either.
/// Any other pattern after them is an error, with the same text.
#[test]
fn acl_setuser_takes_the_all_keys_and_all_channels_patterns_again_as_redis_does() {
    need_redis();
    let node = Redis::start();
    let other = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let cases: &[&[&str]] = &[
        &["u1", "+SET", "~*"],
        &["u1", "+SET", "~*"],
        &["u2", "~*", "~*"],
        &["u3", "allkeys", "~*"],
        &["u4", "allkeys", "~foo"],
        &["u5", "allkeys", "%R~*"],
        &["u6", "~*", "%RW~*"],
        &["u7", "%R~*", "~*"],
        &["u8", "allchannels", "&*"],
        &["u9", "&*", "&*"],
        &["u10", "allchannels", "&foo"],
        &["u11", "resetkeys", "~*", "resetkeys", "~a", "~b"],
    ];
    let (mut d, mut p) = (other.client(), proxy.client());
    for case in cases {
        let mut args = vec!["ACL", "SETUSER"];
        args.extend_from_slice(case);
        assert_eq!(p.cmd(&args), d.cmd(&args), "{args:?}");
    }
}

/// The arity of every command the proxy answers itself, against a real redis-server.
#[test]
fn commands_the_proxy_answers_check_their_arity_as_redis_does() {
    need_redis();
    let node = Redis::start();
    let other = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let cases: &[&[&str]] = &[
        &["PING", "x", "y", "z"],
        &["PING", "x", "y"],
        &["PING", "x"],
        &["PING"],
        &["ECHO"],
        &["ECHO", "a", "b"],
        &["SELECT"],
        &["SELECT", "1", "2"],
        &["AUTH", "a", "b", "c"],
        &["AUTH"],
        &["HELLO", "3", "AUTH", "x"],
        &["HELLO", "4"],
        &["HELLO", "x"],
        &["HELLO", "2", "SETNAME"],
        &["RESET", "x"],
        &["CLIENT", "ID", "x"],
        &["CLIENT", "SETNAME"],
        &["CLIENT", "SETNAME", "a", "b"],
        &["CLIENT", "GETNAME", "x"],
        &["CLIENT", "INFO", "x"],
        &["CLIENT", "REPLY"],
        &["CLIENT", "REPLY", "foo"],
        &["CLIENT", "KILL"],
        &["CLIENT", "PAUSE"],
        &["CLIENT", "UNPAUSE", "x"],
        &["CLIENT", "TRACKING"],
        &["CLIENT", "CACHING"],
        &["CLIENT", "GETREDIR", "x"],
        &["CLIENT", "UNBLOCK"],
        &["CLIENT", "NOSUCH"],
        &["CLIENT"],
    ];
    let (mut d, mut p) = (other.client(), proxy.client());
    for args in cases {
        assert_eq!(p.cmd(args), d.cmd(args), "{args:?}");
    }
    // QUIT takes any arguments, and answers OK.
    for addr in [other.addr(), proxy.addr()] {
        assert_eq!(
            Client::connect(&addr).cmd(&["QUIT", "x"]),
            Reply::ok(),
            "{addr}"
        );
    }
}

/// CLIENT REPLY OFF and SKIP: the replies they drop are not on the wire at all, and the
/// others keep their order, byte for byte as redis-server writes them.
#[test]
fn client_reply_off_and_skip_drop_replies_as_redis_does() {
    need_redis();
    let node = Redis::start();
    let other = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let cmds: &[&[&str]] = &[
        &["CLIENT", "REPLY", "OFF"],
        &["SET", "a", "x"],
        &["INCR", "a"],
        &["CLIENT", "REPLY", "SKIP"],
        &["SET", "b", "y"],
        &["CLIENT", "REPLY", "ON"],
        &["GET", "a"],
        &["CLIENT", "REPLY", "SKIP"],
        &["GET", "b"],
        &["NOSUCHCOMMAND"],
        &["GET", "b"],
        &["CLIENT", "REPLY", "SKIP"],
        &["CLIENT", "REPLY", "SKIP"],
        &["GET", "a"],
        &["GET", "b"],
    ];
    let mut wire = Vec::new();
    for c in cmds {
        wire.extend_from_slice(&encode(c));
    }
    let mut seen = Vec::new();
    for addr in [other.addr(), proxy.addr()] {
        let mut c = Client::connect(&addr);
        c.send_raw(&wire);
        let (bytes, _) = c.read_until_quiet(Duration::from_millis(500));
        seen.push(String::from_utf8_lossy(&bytes).into_owned());
    }
    assert!(
        seen[0].starts_with("+OK\r\n$1\r\nx\r\n"),
        "redis-server: {:?}",
        seen[0]
    );
    assert_eq!(seen[1], seen[0], "through the proxy");
    // Pipelined one command per write too, waiting for nothing.
    let mut c = proxy.client();
    for cmd in cmds {
        c.send_raw(&encode(cmd));
        std::thread::sleep(Duration::from_millis(2));
    }
    let (bytes, _) = c.read_until_quiet(Duration::from_millis(500));
    assert_eq!(
        String::from_utf8_lossy(&bytes),
        seen[0],
        "one write per command"
    );
}

/// CLIENT LIST of a subscriber: `sub` counts its channels and `psub` its patterns, its
/// flags are `P` while subscribed, and after UNSUBSCRIBE with no arguments `flags=N
/// sub=0 cmd=unsubscribe`, as Redis shows (its pub/sub tests wait for that line).
#[test]
fn client_list_describes_a_subscriber_as_redis_does() {
    need_redis();
    let node = Redis::start();
    let other = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    for (name, addr) in [("redis", other.addr()), ("proxy", proxy.addr())] {
        let mut s = Client::connect(&addr);
        let id = s.cmd(&["CLIENT", "ID"]).as_int().to_string();
        let mut admin = Client::connect(&addr);
        let line = |admin: &mut Client| admin.cmd(&["CLIENT", "LIST", "ID", &id]).as_str();
        s.send_raw(&encode(&["SUBSCRIBE", "c1", "c2"]));
        s.read_reply();
        s.read_reply();
        s.send_raw(&encode(&["PSUBSCRIBE", "p*"]));
        s.read_reply();
        // flags, sub, psub and cmd, as the line shows them.
        let shown = |admin: &mut Client| {
            let l = line(admin);
            let f = ["flags", "sub", "psub", "cmd"].map(|n| field(&l, n));
            (f.join(" "), l)
        };
        let (got, l) = shown(&mut admin);
        assert_eq!(got, "P 2 1 psubscribe", "{name}: {l}");
        let pubsub = admin.cmd(&["CLIENT", "LIST", "TYPE", "pubsub"]).as_str();
        assert!(pubsub.contains(&format!("id={id} ")), "{name}: {pubsub}");
        s.send_raw(&encode(&["PUNSUBSCRIBE"]));
        s.read_reply();
        s.send_raw(&encode(&["UNSUBSCRIBE"]));
        s.read_reply();
        s.read_reply();
        assert!(
            wait_until(Duration::from_secs(2), || {
                let l = line(&mut admin);
                field(&l, "cmd") == "unsubscribe"
            }),
            "{name}: {}",
            line(&mut admin)
        );
        let (got, l) = shown(&mut admin);
        assert_eq!(got, "N 0 0 unsubscribe", "{name}: {l}");
        let normal = admin.cmd(&["CLIENT", "LIST", "TYPE", "normal"]).as_str();
        assert!(normal.contains(&format!("id={id} ")), "{name}: {normal}");
    }
}

/// A user without permission spends nothing of another user's admission budget: the ACL
/// is checked before admission, so a NOPERM command takes no token of its key's bucket.
#[test]
fn a_command_the_acl_refuses_spends_no_admission_token() {
    need_redis();
    let node = Redis::start();
    let dir = TempDir::new("acl-admit");
    let rules = dir.0.join("rules.yaml");
    std::fs::write(
        &rules,
        "version: 1\nrules:\n  - match: \"quota:*\"\n    admit: { limit_per_sec: 1, burst: 5 }\n",
    )
    .unwrap();
    let yaml = format!(
        "auth:\n  users:\n    - name: app\n      passwords_sha256: [\"{}\"]\n      keys: [\"~quota:*\"]\n      commands: [\"+@all\"]\n    - name: nosy\n      passwords_sha256: [\"{}\"]\n      keys: [\"~other:*\"]\n      commands: [\"+@all\"]\n",
        passwd_hash("app-pw"),
        passwd_hash("nosy-pw")
    );
    let proxy = Proxy::start_with_config(&[&node], &yaml, &["--rules", &path_str(&rules)]);
    let mut nosy = proxy.client();
    assert_eq!(nosy.cmd(&["AUTH", "nosy", "nosy-pw"]), Reply::ok());
    for _ in 0..20 {
        let r = nosy.cmd(&["INCR", "quota:a"]);
        assert!(r.is_error() && r.err().starts_with("NOPERM"), "{r:?}");
    }
    let mut app = proxy.client();
    assert_eq!(app.cmd(&["AUTH", "app", "app-pw"]), Reply::ok());
    // The whole burst is still there for the user who may.
    for i in 1..=5 {
        assert_eq!(
            app.cmd(&["INCR", "quota:a"]),
            Reply::Int(i),
            "increment {i}"
        );
    }
}
