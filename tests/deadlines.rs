//! The proxy's own questions to a node have deadlines (`backend::ASK_WITHIN`, 5 s): a node
//! frozen (SIGSTOP) while the proxy asks must not leave a task waiting for good, nor a
//! connection out of step. Each test freezes a node past that deadline, thaws it, and
//! checks what a client sees afterwards.

mod support;

use std::time::{Duration, Instant};

use support::*;

/// Longer than `backend::ASK_WITHIN`.
const PAST_THE_DEADLINE: Duration = Duration::from_millis(6_000);

/// A blocking command goes on a connection of the client's own, which first asks the node
/// its CLIENT ID (for CLIENT LIST and CLIENT UNBLOCK). A blocking command may wait as long
/// as it asks to, so the request timeout does not bound it: the question's own deadline
/// does. The node is frozen while it asks: BLPOP gets an error after that deadline, not
/// never, and the connection, which would get the late CLIENT ID reply once the node thaws,
/// is dropped. After the thaw the same client's BLPOP gets its own reply, not that one.
#[test]
fn a_blocking_command_whose_client_id_goes_unanswered_gets_an_error_and_no_stale_reply() {
    need_redis();
    let node = Redis::start();
    let proxy = Proxy::start(&[&node], &["--request-timeout-ms", "1000"]);
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["PING"]), Reply::Simple("PONG".into()));
    node.signal("STOP");
    let thaw = Thaw(&node);
    let t0 = Instant::now();
    let r = c.cmd(&["BLPOP", "list", "1"]);
    let took = t0.elapsed();
    assert!(r.is_error(), "BLPOP on a frozen node: {r:?}");
    assert!(
        took < Duration::from_secs(8),
        "the question's deadline: took {took:?}"
    );
    std::thread::sleep(PAST_THE_DEADLINE.saturating_sub(took) + Duration::from_millis(500));
    drop(thaw);
    assert_eq!(node.client().cmd(&["RPUSH", "list", "a"]), Reply::Int(1));
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let r = c.cmd(&["BLPOP", "list", "1"]);
        if !r.is_error() {
            assert_eq!(
                r,
                Reply::Array(Some(vec![
                    Reply::Bulk(Some(b"list".to_vec())),
                    Reply::Bulk(Some(b"a".to_vec()))
                ])),
                "BLPOP's own reply, not a late one of another command"
            );
            break;
        }
        assert!(Instant::now() < end, "BLPOP still failing: {r:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The proxy asks a single node its `databases` as it starts, so SELECT is refused with
/// Redis's own error when out of range. The node is frozen when the proxy starts, past the
/// question's deadline: the proxy serves meanwhile, asks again, and once the node thaws it
/// refuses a database the node does not have.
#[test]
fn a_node_frozen_while_the_proxy_asks_its_databases_is_asked_again() {
    need_redis();
    let node = Redis::start_with(&["--databases", "4"]);
    node.signal("STOP");
    let thaw = Thaw(&node);
    let proxy = Proxy::start(&[&node], &["--request-timeout-ms", "1000"]);
    std::thread::sleep(PAST_THE_DEADLINE);
    drop(thaw);
    let mut c = proxy.client();
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        let r = c.cmd(&["SELECT", "10"]);
        if r.is_error() && r.err().contains("DB index is out of range") {
            break;
        }
        assert!(
            Instant::now() < end,
            "SELECT 10 over a node of 4 databases, well after it thawed: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(c.cmd(&["SELECT", "3"]), Reply::ok());
}

/// The proxy's subscription to the fleet's salt announcements waits on a channel that may
/// stay quiet for long. Past 10 s of quiet it PINGs the node, and a node that does not
/// answer within the deadline is subscribed to again, so a frozen registry node cannot
/// stop the listener for good. Frozen past both, the listener says so in the log; thawed,
/// the node has the proxy's subscription again, on a new connection.
#[test]
fn a_registry_node_frozen_under_the_listener_is_subscribed_to_again() {
    need_redis();
    let node = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    // The listener's connection: named after the proxy, subscribed to one channel.
    let subscriber = || -> Option<String> {
        let Reply::Bulk(Some(list)) = node.client().cmd(&["CLIENT", "LIST"]) else {
            return None;
        };
        String::from_utf8_lossy(&list)
            .lines()
            .find(|l| l.contains(" name=saltshaker-") && l.contains(" sub=1 "))
            .and_then(|l| l.split(' ').find(|f| f.starts_with("id=")))
            .map(str::to_string)
    };
    let wait_for = |what: &str, within: Duration, ok: &dyn Fn() -> bool| {
        let end = Instant::now() + within;
        while !ok() {
            assert!(Instant::now() < end, "{what} within {within:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_for("the listener subscribed", Duration::from_secs(10), &|| {
        subscriber().is_some()
    });
    let first = subscriber().expect("subscribed");
    node.signal("STOP");
    let thaw = Thaw(&node);
    let t0 = Instant::now();
    wait_for(
        "the listener's PING deadline firing",
        Duration::from_secs(20),
        &|| {
            proxy
                .stderr()
                .contains("salt registry channel silent; subscribing again")
        },
    );
    // No sooner than the PING's own deadline after the freeze.
    assert!(
        t0.elapsed() >= Duration::from_secs(5),
        "gave up after {:?}, before the PING's deadline",
        t0.elapsed()
    );
    drop(thaw);
    wait_for(
        "the listener subscribed again on a new connection",
        Duration::from_secs(10),
        &|| subscriber().is_some_and(|id| id != first),
    );
}
