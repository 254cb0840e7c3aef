//! ACL on the proxy's own users, CLIENT PAUSE/UNPAUSE/UNBLOCK over its own clients, and
//! DEBUG ERROR: each checked reply by reply against a real redis-server given the same
//! commands by the same kind of client.

mod support;

use std::time::{Duration, Instant};
use support::*;

const HASH: &str = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8";

/// GETUSER's reply as (field, value) pairs.
fn fields(r: &Reply) -> Vec<(String, Reply)> {
    r.as_array()
        .chunks(2)
        .map(|kv| (kv[0].as_str(), kv[1].clone()))
        .collect()
}

/// The same ACL commands, on redis-server and on the proxy: the same replies.
#[test]
fn acl_commands_answer_as_redis_does_for_the_proxys_own_users() {
    need_redis();
    let node = Redis::start();
    let other = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let mut seen = Vec::new();
    for addr in [other.addr(), proxy.addr()] {
        let mut c = Client::connect(&addr);
        let pw = format!("#{HASH}");
        let mut replies = Vec::new();
        for cmd in [
            vec![
                "ACL", "SETUSER", "u1", "reset", "on", ">p1", &pw, "+get", "~cache:*", "%W~obj:*",
                "&news:*",
            ],
            vec!["ACL", "SETUSER", "u2"],
            vec![
                "ACL",
                "SETUSER",
                "u3",
                "on",
                "nopass",
                "+@all",
                "~*",
                "(+set ~app*)",
            ],
            vec!["ACL", "SETUSER", "u1", "bogus"],
            vec!["ACL", "SETUSER", "u1", "get"],
            vec!["ACL", "SETUSER", "u1", "+nosuch"],
            vec!["ACL", "SETUSER", "u1", "+@nosuch"],
            vec!["ACL", "SETUSER", "u1", "#abc"],
            vec!["ACL", "SETUSER", "u1", "<nosuch"],
            vec!["ACL", "SETUSER", "u3", "~x"],
            vec!["ACL", "SETUSER", "u1", "(~x"],
            vec!["ACL", "DRYRUN", "u1", "get", "cache:1"],
            vec!["ACL", "DRYRUN", "u1", "get", "other"],
            vec!["ACL", "DRYRUN", "u1", "set", "cache:1", "x"],
            vec!["ACL", "DRYRUN", "u1", "nosuch"],
            vec!["ACL", "DRYRUN", "u1", "get"],
            vec!["ACL", "DRYRUN", "nobody", "get", "k"],
            vec!["ACL", "DRYRUN", "u3", "set", "app1", "x"],
            vec!["ACL", "GETUSER", "nobody"],
            vec!["ACL", "GENPASS", "0"],
            vec!["ACL", "GENPASS", "5000"],
            vec!["ACL", "DELUSER", "default"],
            vec!["ACL", "USERS"],
        ] {
            replies.push((cmd.join(" "), c.cmd(&cmd)));
        }
        // GETUSER field by field (the command rules too: each user has one rule at most,
        // which Redis 7.0 and the proxy describe alike).
        for u in ["u1", "u2", "u3", "default"] {
            replies.push((
                format!("GETUSER {u}"),
                Reply::Array(Some(
                    fields(&c.cmd(&["ACL", "GETUSER", u]))
                        .into_iter()
                        .flat_map(|(k, v)| [Reply::bulk(&k), v])
                        .collect(),
                )),
            ));
        }
        let list = c.cmd(&["ACL", "LIST"]);
        replies.push(("LIST".into(), list));
        for bits in ["1", "5", "256", "555"] {
            let n = c.cmd(&["ACL", "GENPASS", bits]).as_str().len();
            replies.push((format!("GENPASS {bits} length"), Reply::Int(n as i64)));
        }
        replies.push((
            "DELUSER".into(),
            c.cmd(&["ACL", "DELUSER", "u1", "u2", "u3", "nobody"]),
        ));
        replies.push(("USERS after".into(), c.cmd(&["ACL", "USERS"])));
        seen.push(replies);
    }
    for (r, p) in seen[0].iter().zip(&seen[1]) {
        assert_eq!(r.1, p.1, "{}: redis-server, then the proxy", r.0);
    }
    assert_eq!(seen[0].len(), seen[1].len());
}

/// A user changed with ACL SETUSER is checked by its new rules at its next command, its
/// refusals are in ACL LOG as Redis logs them, and ACL DELUSER closes its connections.
#[test]
fn acl_changes_apply_to_connected_clients_and_refusals_are_logged() {
    need_redis();
    let node = Redis::start();
    let other = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let mut logs = Vec::new();
    for addr in [other.addr(), proxy.addr()] {
        let mut admin = Client::connect(&addr);
        assert_eq!(
            admin.cmd(&["ACL", "SETUSER", "app", "on", ">pw", "+get", "+set", "~cache:*"]),
            Reply::ok()
        );
        assert_eq!(admin.cmd(&["ACL", "LOG", "RESET"]), Reply::ok());
        let mut app = Client::connect(&addr);
        assert_eq!(app.cmd(&["AUTH", "app", "pw"]), Reply::ok(), "{addr}");
        assert_eq!(app.cmd(&["SET", "cache:1", "x"]), Reply::ok(), "{addr}");
        let denied = app.cmd(&["GET", "other"]);
        assert!(denied.err().starts_with("NOPERM"), "{addr}: {denied:?}");
        assert!(app
            .cmd(&["HSET", "cache:1", "f", "v"])
            .err()
            .starts_with("NOPERM"));
        assert!(app.cmd(&["GET", "other"]).err().starts_with("NOPERM"));
        // Taken away while connected: refused at the next command.
        assert_eq!(admin.cmd(&["ACL", "SETUSER", "app", "-set"]), Reply::ok());
        let e = app.cmd(&["SET", "cache:1", "y"]);
        assert_eq!(
            e.err(),
            "NOPERM this user has no permissions to run the 'set' command",
            "{addr}"
        );
        let mut wrong = Client::connect(&addr);
        assert!(wrong
            .cmd(&["AUTH", "app", "nope"])
            .err()
            .starts_with("WRONGPASS"));
        let log = admin.cmd(&["ACL", "LOG"]);
        let entries: Vec<Vec<(String, String)>> = log
            .as_array()
            .iter()
            .map(|e| {
                fields(e)
                    .into_iter()
                    .filter(|(k, _)| !matches!(k.as_str(), "age-seconds" | "client-info"))
                    .map(|(k, v)| {
                        (
                            k,
                            match v {
                                Reply::Int(n) => n.to_string(),
                                v => v.as_str(),
                            },
                        )
                    })
                    .collect()
            })
            .collect();
        logs.push(entries);
        assert_eq!(admin.cmd(&["ACL", "DELUSER", "app"]), Reply::Int(1));
        assert!(
            app.closed_within(Duration::from_secs(2)),
            "{addr}: DELUSER closes its clients"
        );
    }
    assert!(logs[0].len() >= 4, "{:?}", logs[0]);
    assert_eq!(logs[0], logs[1], "ACL LOG: redis-server, then the proxy");
}

/// CLIENT PAUSE WRITE holds writes and lets reads through, CLIENT UNPAUSE ends it early,
/// and CLIENT UNBLOCK answers a client blocked through the proxy as Redis answers its own.
#[test]
fn client_pause_and_unblock_act_on_the_proxys_clients_as_redis_does() {
    need_redis();
    let node = Redis::start();
    let other = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    for addr in [other.addr(), proxy.addr()] {
        let mut admin = Client::connect(&addr);
        let mut c = Client::connect(&addr);
        for (cmd, want) in [
            (
                vec!["CLIENT", "PAUSE", "x"],
                "ERR timeout is not an integer or out of range",
            ),
            (vec!["CLIENT", "PAUSE", "-1"], "ERR timeout is negative"),
            (
                vec!["CLIENT", "PAUSE", "10", "bogus"],
                "ERR CLIENT PAUSE mode must be WRITE or ALL",
            ),
            (
                vec!["CLIENT", "UNBLOCK", "x"],
                "ERR value is not an integer or out of range",
            ),
            (
                vec!["CLIENT", "UNBLOCK", "1", "bogus"],
                "ERR CLIENT UNBLOCK reason should be TIMEOUT or ERROR",
            ),
        ] {
            assert_eq!(admin.cmd(&cmd).err(), want, "{addr}: {cmd:?}");
        }
        assert_eq!(admin.cmd(&["CLIENT", "PAUSE", "400", "WRITE"]), Reply::ok());
        let t = Instant::now();
        c.cmd(&["GET", "k"]);
        assert!(
            t.elapsed() < Duration::from_millis(200),
            "{addr}: a read is not paused"
        );
        assert_eq!(c.cmd(&["SET", "k", "v"]), Reply::ok());
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "{addr}: the write waited {:?}",
            t.elapsed()
        );
        // UNPAUSE lets a waiting write go at once.
        assert_eq!(
            admin.cmd(&["CLIENT", "PAUSE", "10000", "WRITE"]),
            Reply::ok()
        );
        let t = Instant::now();
        c.send_raw(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nw\r\n");
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(admin.cmd(&["CLIENT", "UNPAUSE"]), Reply::ok());
        assert_eq!(c.read_reply(), Reply::ok());
        assert!(t.elapsed() < Duration::from_secs(3), "{addr}");
        // UNBLOCK: 0 for a client that is not blocked; a blocked one gets nil (TIMEOUT) or
        // the UNBLOCKED error.
        let cid = c.cmd(&["CLIENT", "ID"]).as_int().to_string();
        assert_eq!(admin.cmd(&["CLIENT", "UNBLOCK", &cid]), Reply::Int(0));
        for (mode, want) in [
            ("TIMEOUT", Reply::Array(None)),
            (
                "ERROR",
                Reply::Error("UNBLOCKED client unblocked via CLIENT UNBLOCK".into()),
            ),
        ] {
            c.send_raw(b"*3\r\n$5\r\nBLPOP\r\n$5\r\nempty\r\n$1\r\n0\r\n");
            assert!(
                wait_until(Duration::from_secs(5), || admin
                    .cmd(&["CLIENT", "UNBLOCK", &cid, mode])
                    == Reply::Int(1)),
                "{addr}: {mode}"
            );
            assert_eq!(c.read_reply(), want, "{addr}: {mode}");
        }
        assert_eq!(c.cmd(&["GET", "k"]), Reply::bulk("w"));
    }
}

/// DEBUG ERROR is answered as Redis answers it, alone and inside MULTI; other DEBUG
/// subcommands are refused with the reason.
#[test]
fn debug_error_answers_as_redis_does() {
    need_redis();
    let node = Redis::start_with(&["--enable-debug-command", "yes"]);
    let other = Redis::start_with(&["--enable-debug-command", "yes"]);
    let proxy = Proxy::start(&[&node], &[]);
    let mut seen = Vec::new();
    for addr in [other.addr(), proxy.addr()] {
        let mut c = Client::connect(&addr);
        let mut r = vec![
            c.cmd(&["DEBUG", "ERROR", "LOADING fake message"]),
            c.cmd(&["DEBUG", "ERROR", "READONLY a\r\nb"]),
            c.cmd(&["MULTI"]),
            c.cmd(&["DEBUG", "ERROR", "OOM x"]),
        ];
        r.push(c.cmd(&["EXEC"]));
        seen.push(r);
    }
    assert_eq!(seen[0], seen[1], "redis-server, then the proxy");
    let mut c = proxy.client();
    let e = c.cmd(&["DEBUG", "SLEEP", "0"]);
    assert!(
        e.err().contains("DEBUG is refused through the proxy"),
        "{e:?}"
    );
}
