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

/// ACL WHOAMI and ACL USERS answer from the proxy's users, as a redis-server with the same
/// users answers; ACL CAT as the node does. The rest of ACL stays refused.
#[test]
fn acl_whoami_users_and_cat_answer_as_redis_does_for_the_same_users() {
    need_redis();
    let node = Redis::start();
    // The same users on a plain redis-server and in the proxy's config.
    let reference = Redis::start();
    let mut r = reference.client();
    assert_eq!(
        r.cmd(&["ACL", "SETUSER", "app", "on", ">apppw", "~app:*", "+@all"]),
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
    let refused = c.cmd(&["ACL", "SETUSER", "x", "on"]);
    assert!(
        refused.is_error() && refused.err().contains("saltshaker"),
        "{refused}"
    );
}
