//! `saltshaker top` against a live proxy: a real redis-server, the real binary, one viral
//! key driven through the proxy, and the frame `top` would draw, checked on a buffer.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use saltshaker::top::{render, Poller};
use support::*;

/// Sends `n` pipelined `INCR key` and waits for their `n` replies.
fn incr_burst(s: &mut TcpStream, key: &str, n: usize) {
    let one = format!("*2\r\n$4\r\nINCR\r\n${}\r\n{key}\r\n", key.len());
    s.write_all(one.repeat(n).as_bytes()).expect("write burst");
    let (mut lines, mut buf) = (0, [0u8; 64 * 1024]);
    while lines < n {
        let k = s.read(&mut buf).expect("read replies");
        assert!(k > 0, "proxy closed the connection");
        assert!(
            !buf[..k].contains(&b'-'),
            "error reply: {}",
            String::from_utf8_lossy(&buf[..k])
        );
        lines += buf[..k].iter().filter(|b| **b == b'\n').count();
    }
}

fn assert_fits(frame: &str, width: usize, height: usize) {
    assert!(frame.lines().count() <= height, "{frame}");
    for l in frame.lines() {
        assert!(
            l.chars().count() <= width,
            "{} chars > {width}: {l:?}",
            l.chars().count()
        );
    }
}

#[test]
fn top_shows_a_viral_key_then_the_outage() {
    need_redis();
    let node = Redis::start();
    let mut proxy = Proxy::start(&[&node], &[]);
    let mut poller = Poller::new(&proxy.admin_addr(), 200);
    let first = poller.poll();
    assert!(first.error.is_none(), "{:?}", first.error);
    assert!(
        render(first, 80, 24).contains("no hot keys"),
        "{}",
        render(first, 80, 24)
    );

    let mut s = TcpStream::connect(proxy.addr()).expect("connect proxy");
    s.set_read_timeout(Some(Duration::from_secs(5))).ok();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        incr_burst(&mut s, "likes:1", 2000);
        let v = poller.poll();
        assert!(v.error.is_none(), "{:?}", v.error);
        let listed = v
            .snapshot
            .as_ref()
            .is_some_and(|snap| snap.keys.iter().any(|k| k.key == "likes:1"));
        if listed && v.history.samples("likes:1").len() >= 3 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "likes:1 never listed: {}",
            render(v, 120, 30)
        );
    }
    for width in [120, 80, 40] {
        let frame = render(poller.view(), width, 24);
        assert_fits(&frame, width, 24);
        assert!(frame.contains("likes:1"), "{frame}");
        assert!(
            frame.contains(&format!("saltshaker {}", proxy.admin_addr())),
            "{frame}"
        );
    }
    let frame = render(poller.view(), 120, 24);
    assert!(frame.contains(" hot"), "{frame}");
    assert!(
        frame.contains(&format!("127.0.0.1:{}", node.port)),
        "backend rate shown: {frame}"
    );
    assert!(
        frame.contains("max/mean 1.00"),
        "one node is always even: {frame}"
    );
    assert!(
        frame.chars().any(|c| ('▁'..='█').contains(&c)),
        "trend drawn: {frame}"
    );

    proxy.kill();
    let v = poller.poll();
    assert!(v.error.is_some());
    let frame = render(v, 80, 24);
    assert!(frame.contains("\nerror: "), "{frame}");
    assert!(frame.contains("likes:1"), "last good sample stays: {frame}");
}
