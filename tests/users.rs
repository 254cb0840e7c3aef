//! Users on the proxy: AUTH and HELLO AUTH as named users with hashed passwords, key
//! patterns and command categories refused with Redis's own NOPERM text, and the admin
//! port's bearer token.

mod support;

use std::process::Command;

use support::*;

/// SHA-256 of `pw` as `saltshaker passwd` prints it.
fn hash(pw: &str) -> String {
    passwd_hash(pw)
}

fn users_yaml() -> String {
    format!(
        "auth:\n  users:\n    - name: app\n      passwords_sha256: [\"{}\"]\n      keys: [\"~app:*\"]\n      commands: [\"+@read\", \"+@write\", \"-@dangerous\", \"+ping\", \"+multi\", \"+exec\", \"+@pubsub\"]\n    - name: ops\n      passwords_sha256: [\"{}\"]\n      keys: [\"*\"]\n      commands: [\"+@all\"]\n    - name: gone\n      passwords_sha256: [\"{}\"]\n      enabled: false\n      commands: [\"+@all\"]\n",
        hash("app-pw"),
        hash("ops-pw"),
        hash("gone-pw")
    )
}

#[test]
fn users_log_in_and_are_held_to_their_keys_and_categories() {
    need_redis();
    let node = Redis::start();
    let p = Proxy::start_with_config(&[&node], &users_yaml(), &[]);
    let mut c = p.client();
    // With users and no default password, nothing runs before AUTH.
    assert!(c.cmd(&["GET", "app:1"]).err().starts_with("NOAUTH"));
    assert!(c.cmd(&["AUTH", "app-pw"]).err().starts_with("WRONGPASS"));
    assert!(c
        .cmd(&["AUTH", "app", "nope"])
        .err()
        .starts_with("WRONGPASS"));
    assert!(c
        .cmd(&["AUTH", "gone", "gone-pw"])
        .err()
        .starts_with("WRONGPASS"));
    assert_eq!(c.cmd(&["AUTH", "app", "app-pw"]).as_str(), "OK");
    assert_eq!(c.cmd(&["SET", "app:1", "x"]).as_str(), "OK");
    assert_eq!(c.cmd(&["GET", "app:1"]).as_str(), "x");
    assert_eq!(c.cmd(&["PING"]).as_str(), "PONG");
    assert_eq!(
        c.cmd(&["GET", "other"]).err(),
        "NOPERM this user has no permissions to access one of the keys used as arguments"
    );
    assert_eq!(
        c.cmd(&["MGET", "app:1", "other"]).err(),
        "NOPERM this user has no permissions to access one of the keys used as arguments"
    );
    assert_eq!(
        c.cmd(&["FLUSHALL"]).err(),
        "NOPERM this user has no permissions to run the 'flushall' command"
    );
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "maxmemory"]).err(),
        "NOPERM this user has no permissions to run the 'config|get' command"
    );
    assert!(node.client().cmd(&["GET", "other"]).is_nil());
    // A refused command inside MULTI aborts the EXEC, as in Redis.
    assert_eq!(c.cmd(&["MULTI"]).as_str(), "OK");
    assert!(c.cmd(&["SET", "other", "1"]).err().starts_with("NOPERM"));
    assert!(c.cmd(&["EXEC"]).err().starts_with("EXECABORT"));
    assert!(node.client().cmd(&["GET", "other"]).is_nil());

    // A subscribed connection is a pipe to the node: only unrestricted users get one.
    assert!(c
        .cmd(&["SUBSCRIBE", "app:news"])
        .err()
        .starts_with("NOPERM saltshaker: only users with every command, key and channel"));
    assert_eq!(
        c.cmd(&["PING"]).as_str(),
        "PONG",
        "still a normal connection"
    );

    // HELLO 3 AUTH user pass logs in and switches protocol at once.
    let mut h = p.client();
    let r = h.cmd(&["HELLO", "3", "AUTH", "ops", "ops-pw"]);
    assert!(!r.is_error(), "{r:?}");
    assert_eq!(h.cmd(&["GET", "app:1"]).as_str(), "x");
    assert_eq!(h.cmd(&["SET", "other", "y"]).as_str(), "OK");
    let mut sub = p.client();
    assert_eq!(sub.cmd(&["AUTH", "ops", "ops-pw"]).as_str(), "OK");
    let r = sub.cmd(&["SUBSCRIBE", "app:news"]);
    assert_eq!(
        r,
        Reply::Array(Some(vec![
            Reply::bulk("subscribe"),
            Reply::bulk("app:news"),
            Reply::Int(1)
        ]))
    );
    let mut h2 = p.client();
    assert!(h2
        .cmd(&["HELLO", "3", "AUTH", "ops", "bad"])
        .err()
        .starts_with("WRONGPASS"));

    // A real client: redis-cli --user.
    need_tool("redis-cli");
    let out = Command::new("redis-cli")
        .args([
            "-p",
            &p.port.to_string(),
            "--user",
            "app",
            "--pass",
            "app-pw",
        ])
        .args(["--no-auth-warning", "GET", "app:1"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "x");

    // Counted, by user and reason.
    let (_, m) = p.admin_get("/metrics");
    let line = |label: &str| -> f64 {
        m.lines()
            .find(|l| l.starts_with("saltshaker_acl_denied_total") && l.contains(label))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert_eq!(
        line("reason=\"key\",user=\"app\"") + line("user=\"app\",reason=\"key\""),
        3.0,
        "{m}"
    );
    assert_eq!(
        line("reason=\"command\",user=\"app\"") + line("user=\"app\",reason=\"command\""),
        2.0,
        "{m}"
    );
    assert_eq!(p.metric("saltshaker_auth_failures_total"), 4.0);
}

#[test]
fn the_default_password_still_works_beside_users() {
    need_redis();
    let node = Redis::start();
    let yaml = format!(
        "auth:\n  password: shared\n  users:\n    - name: ro\n      passwords_sha256: [\"{}\"]\n      keys: [\"*\"]\n      commands: [\"+@read\"]\n",
        hash("ro-pw")
    );
    let p = Proxy::start_with_config(&[&node], &yaml, &[]);
    let mut c = p.client();
    assert!(c.cmd(&["PING"]).err().starts_with("NOAUTH"));
    assert_eq!(c.cmd(&["AUTH", "shared"]).as_str(), "OK");
    assert_eq!(c.cmd(&["SET", "k", "1"]).as_str(), "OK");
    let mut r = p.client();
    assert_eq!(r.cmd(&["AUTH", "ro", "ro-pw"]).as_str(), "OK");
    assert_eq!(r.cmd(&["GET", "k"]).as_str(), "1");
    assert_eq!(
        r.cmd(&["SET", "k", "2"]).err(),
        "NOPERM this user has no permissions to run the 'set' command"
    );
    // RESET logs out.
    r.cmd(&["RESET"]);
    assert!(r.cmd(&["GET", "k"]).err().starts_with("NOAUTH"));
}

#[test]
fn bad_user_rules_are_refused_with_their_place() {
    let dir = TempDir::new("users-bad");
    let path = dir.0.join("s.yaml");
    std::fs::write(
        &path,
        "backend:\n  nodes: [\"127.0.0.1:1\"]\nauth:\n  users:\n    - name: app\n      commands: [\"+@read\", \"+@nosuch\"]\n",
    )
    .unwrap();
    let out = saltshaker(&["check", &path_str(&path)]);
    let err =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("auth.users[0].commands[1]") && err.contains("@nosuch"),
        "{err}"
    );
    assert!(err.contains(":6:"), "the line is named: {err}");
}

#[test]
fn the_admin_port_asks_for_its_token_except_on_probes() {
    need_redis();
    let node = Redis::start();
    let dir = TempDir::new("admin-token");
    let token = dir.0.join("token");
    std::fs::write(&token, "s3cret-token\n").unwrap();
    let p = Proxy::start_with_config(
        &[&node],
        &format!("admin_token_file: \"{}\"\n", path_str(&token)),
        &[],
    );
    let admin = p.admin_addr();
    assert_eq!(http_get(&admin, "/metrics").0, 401);
    assert_eq!(http_get(&admin, "/hotkeys").0, 401);
    assert_eq!(
        http_request(&admin, "POST", "/hotkeys/promote?key=x").0,
        401
    );
    assert_eq!(
        http_request_with(&admin, "GET", "/metrics", &["Authorization: Bearer wrong"]).0,
        401
    );
    assert_eq!(http_get(&admin, "/healthz").0, 200);
    let (status, body) = http_request_with(
        &admin,
        "GET",
        "/metrics",
        &["Authorization: Bearer s3cret-token"],
    );
    assert_eq!(status, 200);
    assert!(
        body.lines()
            .any(|l| l.starts_with("saltshaker_admin_unauthorized_total") && l.ends_with(" 4")),
        "{body}"
    );
    // `saltshaker top` sends it.
    let once = |args: &[&str]| {
        Command::new(BIN)
            .args(["top", "--admin", &admin, "--once"])
            .args(args)
            .output()
            .unwrap()
    };
    assert!(once(&["--token-file", &path_str(&token)]).status.success());
    assert!(!once(&[]).status.success());
}
