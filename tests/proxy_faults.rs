//! What a client and an SRE see when things go wrong: malformed input, unknown and
//! unsupported commands, a backend node dying and coming back, bad config files, and
//! SIGTERM with replies still owed.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::{Duration, Instant};
use support::*;

/// Send `input` (from a thread, so a peer that closes early cannot wedge us) and collect
/// everything the peer says until it closes or stays quiet: (text, closed).
fn raw_exchange(addr: &str, input: &[u8]) -> (String, bool) {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_millis(1500)))
        .unwrap();
    let mut w = s.try_clone().unwrap();
    let data = input.to_vec();
    let writer = std::thread::spawn(move || {
        for chunk in data.chunks(64 * 1024) {
            if w.write_all(chunk).is_err() {
                break;
            }
        }
    });
    let mut out = Vec::new();
    let mut buf = [0u8; 65536];
    let mut r = &s;
    let closed = loop {
        match r.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break false
            }
            Err(_) => break true, // reset
        }
    };
    let _ = s.shutdown(Shutdown::Both);
    let _ = writer.join();
    (String::from_utf8_lossy(&out).to_string(), closed)
}

fn show(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(&b[..b.len().min(60)]).to_string();
    if b.len() > 60 {
        format!("{s:?}... ({} bytes)", b.len())
    } else {
        format!("{s:?}")
    }
}

#[test]
fn malformed_resp_gets_a_protocol_error_and_only_that_connection_closes() {
    need_redis();
    let node = Redis::start();
    // Redis itself, with a bulk limit equal to the proxy's, is the oracle for the reply text.
    let reference = Redis::start_with(&["--proto-max-bulk-len", "1mb"]);
    let proxy = Proxy::start_with_config(&[&node], "limits: { max_bulk_bytes: 1048576 }", &[]);
    let mut bystander = proxy.client();
    assert_eq!(bystander.cmd(&["SET", "safe", "1"]), Reply::ok());
    let mut big_bulk = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2000000\r\n".to_vec();
    big_bulk.extend(std::iter::repeat_n(b'v', 2_000_000));
    big_bulk.extend_from_slice(b"\r\n");
    let inputs: Vec<Vec<u8>> = vec![
        b"*2\r\n$3\r\nGET\r\n$x\r\n".to_vec(),
        b"*x\r\n".to_vec(),
        b"*1\r\n+PING\r\n".to_vec(),
        b"*1\r\n$-1\r\n".to_vec(),
        b"*1000000000000\r\n".to_vec(),
        b"*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$x\r\n".to_vec(),
        big_bulk,
        vec![b'x'; 3 * 1024 * 1024],
    ];
    for input in &inputs {
        let (want, want_closed) = raw_exchange(&reference.addr(), input);
        assert!(
            want_closed && want.contains("-ERR Protocol error"),
            "oracle for {}: {want:?}",
            show(input)
        );
        let t = Instant::now();
        let (got, closed) = raw_exchange(&proxy.addr(), input);
        assert_eq!(got, want, "reply of the proxy to {}", show(input));
        assert!(
            closed,
            "the proxy kept the connection open after {}",
            show(input)
        );
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "closing took {:?}",
            t.elapsed()
        );
        assert_eq!(
            bystander.cmd(&["PING"]),
            Reply::Simple("PONG".into()),
            "bystander after {}",
            show(input)
        );
        assert_eq!(bystander.cmd(&["GET", "safe"]), Reply::bulk("1"));
    }
    assert_eq!(
        node.client().cmd(&["EXISTS", "k"]),
        Reply::Int(0),
        "an oversized bulk reached the node"
    );
    assert_eq!(
        proxy.client().cmd(&["INCR", "safe"]),
        Reply::Int(2),
        "new connections still work"
    );
}

#[test]
fn null_and_empty_multibulks_are_skipped_like_redis() {
    need_redis();
    let node = Redis::start();
    let reference = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    for input in [
        &b"*-1\r\n*1\r\n$4\r\nPING\r\n"[..],
        b"*0\r\n*1\r\n$4\r\nPING\r\n",
        b"*-5\r\n*1\r\n$4\r\nPING\r\n",
    ] {
        let want = raw_exchange(&reference.addr(), input);
        let got = raw_exchange(&proxy.addr(), input);
        assert_eq!(got, want, "(reply, closed) for {}", show(input));
    }
}

#[test]
fn unknown_commands_get_redis_errors_and_the_connection_stays_open() {
    need_redis();
    let node = Redis::start();
    let reference = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let mut p = proxy.client();
    let mut r = reference.client();
    for args in [
        &["FOOBAR", "x", "y"][..],
        &["foobar"],
        &["NOSUCHCMD", "a b", "c"],
        &["GET"],
        &["SET", "k"],
        &["CONFIG", "NOSUCHSUB"],
        &["OBJECT", "BOGUS", "k"],
    ] {
        let (got, want) = (p.cmd(args), r.cmd(args));
        assert!(want.is_error(), "oracle: {args:?} -> {want}");
        assert_eq!(got, want, "{args:?}");
        assert_eq!(
            p.cmd(&["PING"]),
            Reply::Simple("PONG".into()),
            "same connection after {args:?}"
        );
    }
    assert_eq!(p.cmd(&["SET", "k", "v"]), Reply::ok());
    assert_eq!(node.client().cmd(&["GET", "k"]), Reply::bulk("v"));
}

#[test]
fn unsupported_commands_get_a_saltshaker_error_and_nothing_reaches_the_node() {
    need_redis();
    for n in [1, 2] {
        let nodes = pool(n);
        let refs: Vec<&Redis> = nodes.iter().collect();
        let proxy = Proxy::start(&refs, &[]);
        let mut c = proxy.client();
        for args in [&["SAVE"][..], &["SHUTDOWN"], &["SHUTDOWN", "NOSAVE"]] {
            let r = c.cmd(args);
            assert!(
                r.is_error() && r.err().contains("saltshaker"),
                "{args:?} with {n} node(s): {r}"
            );
            assert!(!r.err().contains('\n'), "multi-line error: {r}");
            assert_eq!(
                c.cmd(&["PING"]),
                Reply::Simple("PONG".into()),
                "after {args:?}"
            );
        }
        assert_eq!(c.cmd(&["SET", "still", "here"]), Reply::ok());
        assert_eq!(c.cmd(&["GET", "still"]), Reply::bulk("here"));
        for node in &nodes {
            assert_eq!(
                node.client().cmd(&["PING"]),
                Reply::Simple("PONG".into()),
                "a node went away"
            );
        }
    }
}

#[test]
fn a_dead_node_fails_fast_for_its_keys_only_and_comes_back() {
    need_redis();
    let mut nodes = pool(4);
    let proxy = {
        let refs: Vec<&Redis> = nodes.iter().collect();
        Proxy::start(&refs, &[])
    };
    let keys = spread_keys("fault", 200);
    let sets: Vec<Vec<String>> = keys
        .iter()
        .map(|k| vec!["SET".into(), k.clone(), "v".into()])
        .collect();
    let mut c = proxy.client();
    assert!(c.pipeline(&sets).iter().all(|r| *r == Reply::ok()));
    let own: Vec<usize> = keys.iter().map(|k| owner(&nodes, k)).collect();
    let dead = 2;
    let (down_keys, up_keys): (Vec<_>, Vec<_>) =
        keys.iter().zip(&own).partition(|(_, &n)| n == dead);
    assert!(!down_keys.is_empty() && !up_keys.is_empty());
    nodes[dead].stop();

    for (k, _) in down_keys.iter().take(10) {
        let t = Instant::now();
        let r = c.cmd(&["GET", k]);
        let took = t.elapsed();
        assert!(
            r.is_error() && r.err().contains("down"),
            "GET {k} on the stopped node: {r}"
        );
        assert!(
            took < Duration::from_secs(1),
            "GET {k} on the stopped node took {took:?}"
        );
    }
    for (k, _) in up_keys.iter().take(30) {
        assert_eq!(
            c.cmd(&["GET", k]),
            Reply::bulk("v"),
            "GET {k} on a live node"
        );
    }
    // A pipeline over live and dead nodes: replies in order, errors only for the dead one.
    let gets: Vec<Vec<&str>> = keys.iter().map(|k| vec!["GET", k.as_str()]).collect();
    let t = Instant::now();
    for ((k, n), r) in keys.iter().zip(&own).zip(c.pipeline(&gets)) {
        if *n == dead {
            assert!(r.is_error() && r.err().contains("down"), "GET {k}: {r}");
        } else {
            assert_eq!(r, Reply::bulk("v"), "GET {k} on live node {n}");
        }
    }
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "pipeline took {:?}",
        t.elapsed()
    );
    let t = Instant::now();
    let mget: Vec<&str> = std::iter::once("MGET")
        .chain(keys.iter().map(|k| k.as_str()))
        .collect();
    let r = c.cmd(&mget);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "MGET with a dead node took {:?}",
        t.elapsed()
    );
    assert!(
        r.is_error() || r.as_array().len() == keys.len(),
        "MGET with a dead node: {r}"
    );
    assert_eq!(c.cmd(&["PING"]), Reply::Simple("PONG".into()));

    nodes[dead].restart();
    let t = Instant::now();
    let probe = down_keys[0].0;
    let back = loop {
        let r = c.cmd(&["SET", probe, "again"]);
        if r == Reply::ok() {
            break true;
        }
        if t.elapsed() > Duration::from_secs(5) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        back,
        "keys of the restarted node still fail {:?} after restart",
        t.elapsed()
    );
    for (k, _) in &down_keys {
        assert_eq!(c.cmd(&["SET", k, "again"]), Reply::ok());
        assert_eq!(c.cmd(&["GET", k]), Reply::bulk("again"));
    }
    assert_eq!(
        nodes[dead].dbsize(),
        down_keys.len() as i64,
        "writes after restart land on the node"
    );
    let fresh = proxy.client().cmd(&["GET", probe]);
    assert_eq!(fresh, Reply::bulk("again"));
}

fn write_config(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write config");
    path_str(&p)
}

fn check(path: &str) -> (bool, String) {
    let out = saltshaker(&["check", path]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// True if `text` holds "path:LINE:COL" with the given line (any line when None).
fn has_location(text: &str, path: &str, line: Option<u32>) -> bool {
    text.match_indices(path).any(|(i, _)| {
        let rest = &text[i + path.len()..];
        let mut parts = rest.splitn(4, ':');
        let _ = parts.next(); // empty: text right after the path
        let l = parts.next().and_then(|s| s.parse::<u32>().ok());
        let c = parts.next().and_then(|s| s.trim_end().parse::<u32>().ok());
        l.is_some() && c.is_some() && line.is_none_or(|want| l == Some(want))
    })
}

#[test]
fn check_accepts_a_good_file_and_points_at_the_problem_in_bad_ones() {
    let tmp = TempDir::new("check");
    let dir = tmp.0.clone();
    let good = write_config(
        &dir,
        "good.yaml",
        "listen: 127.0.0.1:6380\nadmin: 127.0.0.1:9121\nbackend:\n  nodes: [\"127.0.0.1:7001:1\", \"127.0.0.1:7002:1\"]\n  hash: fnv1a_64\n  distribution: ketama\n",
    );
    let (ok, text) = check(&good);
    assert!(ok, "check rejected a good file:\n{text}");

    let cases = [
        (
            "unknown.yaml",
            "listen: 127.0.0.1:6380\nbackend:\n  nodes: [\"127.0.0.1:7001\"]\n  bogus_field: 1\n",
            Some(4),
            "bogus_field",
        ),
        (
            "port.yaml",
            "admin: 127.0.0.1:9121\nlisten: 127.0.0.1:99999\nbackend:\n  nodes: [\"127.0.0.1:7001\"]\n",
            Some(2),
            "listen",
        ),
        (
            "nodeport.yaml",
            "listen: 127.0.0.1:6380\nbackend:\n  nodes:\n    - \"127.0.0.1:7001\"\n    - \"127.0.0.1:70000\"\n",
            Some(5),
            "nodes",
        ),
        (
            "broken.yaml",
            "listen: 127.0.0.1:6380\nbackend:\n  nodes: [\"127.0.0.1:7001\"\n  hash: fnv1a_64\n",
            None,
            "",
        ),
    ];
    // Every case is checked before failing, so one report shows all the problems.
    let mut problems = Vec::new();
    for (name, text, line, field) in cases {
        let path = write_config(&dir, name, text);
        let (ok, out) = check(&path);
        if ok {
            problems.push(format!("check accepted {name}:\n{text}"));
        }
        if !has_location(&out, &path, line) {
            let l = line.map_or("LINE".to_string(), |l| l.to_string());
            problems.push(format!(
                "check output for {name} lacks {path}:{l}:COL:\n{out}"
            ));
        }
        if !out.contains(field) {
            problems.push(format!(
                "check output for {name} does not name {field:?}:\n{out}"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let (ok, out) = check(&path_str(&dir.join("does-not-exist.yaml")));
    assert!(!ok, "check of a missing file succeeded: {out}");
}

#[test]
fn sigterm_flushes_every_owed_reply_before_closing() {
    need_redis();
    let node = Redis::start();
    let mut proxy = Proxy::start(&[&node], &[]);
    let mut c = proxy.client();
    c.set_read_timeout(Duration::from_secs(10));
    // A script that keeps the node busy for 500 ms holds the rest of the pipeline in flight.
    let busy = "local t0 = redis.call('TIME') \
                repeat local t = redis.call('TIME') \
                until (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > 500000 \
                return 'slept'";
    let mut cmds: Vec<Vec<String>> = (0..100)
        .map(|i| vec!["SET".into(), format!("t:{i}"), i.to_string()])
        .collect();
    cmds.push(vec!["EVAL".into(), busy.into(), "0".into()]);
    cmds.extend((0..500).map(|_| vec!["INCR".to_string(), "owed".to_string()]));
    let mut bytes = Vec::new();
    for cmd in &cmds {
        bytes.extend(encode(cmd));
    }
    c.send_raw(&bytes);
    std::thread::sleep(Duration::from_millis(150));
    proxy.signal("TERM");
    for i in 0..100 {
        assert_eq!(c.read_reply(), Reply::ok(), "reply {i} (SET) after SIGTERM");
    }
    assert_eq!(
        c.read_reply(),
        Reply::bulk("slept"),
        "reply 100 (EVAL) after SIGTERM"
    );
    for i in 0..500 {
        let r = c
            .try_read_reply()
            .unwrap_or_else(|e| panic!("reply {} (INCR) lost at SIGTERM: {e}", 101 + i));
        assert_eq!(r, Reply::Int(i + 1), "reply {} after SIGTERM", 101 + i);
    }
    assert!(
        c.closed_within(Duration::from_secs(5)),
        "connection still open 5 s after SIGTERM"
    );
    let st = proxy.wait_exit(Duration::from_secs(10));
    assert!(
        st.is_some(),
        "the proxy did not exit within 10 s of SIGTERM"
    );
    assert_eq!(node.client().cmd(&["GET", "owed"]), Reply::bulk("500"));
}

#[test]
fn a_client_vanishing_mid_pipeline_does_not_disturb_others() {
    need_redis();
    let node = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let mut steady = proxy.client();
    for round in 0..20 {
        let mut gone = proxy.client();
        let mut bytes = Vec::new();
        for i in 0..500 {
            bytes.extend(encode(&["SET", &format!("gone:{round}:{i}"), "x"]));
            bytes.extend(encode(&["GET", &format!("gone:{round}:{i}")]));
        }
        gone.send_raw(&bytes);
        drop(gone); // never reads a reply
        let cmds: Vec<Vec<String>> = (0..50)
            .map(|i| vec!["INCRBY".into(), "steady".into(), i.to_string()])
            .collect();
        let want_base: i64 = round * (0..50).sum::<i64>();
        let mut acc = want_base;
        for (i, r) in steady.pipeline(&cmds).into_iter().enumerate() {
            acc += i as i64;
            assert_eq!(
                r,
                Reply::Int(acc),
                "round {round}: a reply meant for a closed client leaked"
            );
        }
    }
    assert_eq!(steady.cmd(&["PING"]), Reply::Simple("PONG".into()));
}

#[test]
fn a_blocked_client_that_disconnects_does_not_swallow_a_later_push() {
    need_redis();
    let node = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let mut waiter = proxy.client();
    waiter.send_raw(&encode(&["BLPOP", "jobs", "0"]));
    std::thread::sleep(Duration::from_millis(200));
    drop(waiter);
    std::thread::sleep(Duration::from_millis(500));
    let mut c = proxy.client();
    assert_eq!(c.cmd(&["LPUSH", "jobs", "j1"]), Reply::Int(1));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        node.client().cmd(&["LRANGE", "jobs", "0", "-1"]),
        Reply::Array(Some(vec![Reply::bulk("j1")])),
        "a BLPOP of a client that had gone consumed the job"
    );
}
