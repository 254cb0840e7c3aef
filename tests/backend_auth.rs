//! Backend AUTH from config: a password, or an ACL user and password; and a clear error
//! when the credentials are wrong, with the proxy still serving.

mod support;

use support::*;

fn config(dir: &TempDir, backend_extra: &str) -> String {
    let path = dir.0.join("saltshaker.yaml");
    let text = format!("backend:\n  nodes: [\"127.0.0.1:1\"]\n{backend_extra}");
    std::fs::write(&path, text).unwrap();
    path_str(&path)
}

#[test]
fn backend_password_and_acl_user_are_used() {
    need_redis();
    let node = Redis::start_with(&["--requirepass", "s3cret"]);
    let mut admin = node.client();
    assert_eq!(admin.cmd(&["AUTH", "s3cret"]).as_str(), "OK");
    admin.cmd(&["ACL", "SETUSER", "app", "on", ">apppw", "~*", "+@all"]);

    let dir = TempDir::new("auth-pass");
    let cfg = config(&dir, "  password: s3cret\n");
    let p = Proxy::start(&[&node], &["--config", &cfg]);
    let mut c = p.client();
    assert_eq!(c.cmd(&["SET", "a", "1"]).as_str(), "OK");
    assert_eq!(c.cmd(&["GET", "a"]).as_str(), "1");

    let dir2 = TempDir::new("auth-acl");
    let cfg2 = config(&dir2, "  username: app\n  password: apppw\n");
    let p2 = Proxy::start(&[&node], &["--config", &cfg2]);
    let mut c2 = p2.client();
    assert_eq!(c2.cmd(&["GET", "a"]).as_str(), "1");
    let who = c2.cmd(&["INFO", "server"]);
    assert!(!who.is_error(), "{who:?}");
}

#[test]
fn wrong_backend_password_is_a_clear_error_and_the_proxy_keeps_serving() {
    need_redis();
    let node = Redis::start_with(&["--requirepass", "right"]);
    let dir = TempDir::new("auth-wrong");
    let cfg = config(&dir, "  password: wrong\n");
    let p = Proxy::start(&[&node], &["--config", &cfg]);
    let mut c = p.client();
    let r = c.cmd(&["GET", "a"]);
    assert!(r.err().contains("saltshaker"), "{r:?}");
    assert!(
        r.err().contains("WRONGPASS") || r.err().contains("down"),
        "{r:?}"
    );
    // The proxy itself still answers, on the same connection.
    assert_eq!(c.cmd(&["PING"]).as_str(), "PONG");
}
