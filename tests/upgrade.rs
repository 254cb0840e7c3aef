//! Zero-downtime upgrade: a new saltshaker takes the listening sockets over from the
//! running one while a client pipelines INCRs, and no command fails, is lost or is doubled.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_saltshaker");

fn spawn(
    listen: &str,
    admin: &str,
    node: &str,
    sock: &str,
    upgrade: bool,
    dir: &std::path::Path,
    tag: &str,
) -> std::process::Child {
    let mut c = Command::new(BIN);
    c.args([
        "--listen",
        listen,
        "--admin",
        admin,
        "--nodes",
        node,
        "--upgrade-socket",
        sock,
    ]);
    if upgrade {
        c.arg("--upgrade");
    }
    c.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("{tag}.stderr"))).unwrap())
        .spawn()
        .expect("spawn saltshaker")
}

/// Counts `:N\r\n` replies in `buf`; every reply here is an integer (or an error, which fails).
fn count_int_replies(buf: &[u8]) -> Result<usize, String> {
    let mut n = 0;
    for line in buf.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        match line.first() {
            Some(b':') => n += 1,
            _ => return Err(String::from_utf8_lossy(line).into_owned()),
        }
    }
    Ok(n)
}

#[test]
fn upgrade_under_pipelined_load_loses_nothing() {
    need_redis();
    let redis = Redis::start();
    let dir = TempDir::new("upgrade");
    let sock = dir.0.join("upgrade.sock").to_string_lossy().into_owned();
    let listen = format!("127.0.0.1:{}", free_port());
    let admin = format!("127.0.0.1:{}", free_port());
    let mut old = spawn(&listen, &admin, &redis.addr(), &sock, false, &dir.0, "old");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(&listen).is_err() || !std::path::Path::new(&sock).exists() {
        assert!(Instant::now() < deadline, "old proxy did not start");
        std::thread::sleep(Duration::from_millis(20));
    }

    // A client that pipelines batches of INCRs. When the connection closes, the commands
    // without a reply were never read by the old process, so they are sent again on a new
    // connection: that is what "no command fails" means for a pipelining client.
    let stop = Arc::new(AtomicBool::new(false));
    let (stop2, listen2) = (stop.clone(), listen.clone());
    let client = std::thread::spawn(move || -> Result<(u64, u64), String> {
        const BATCH: usize = 50;
        let cmd = encode(&["INCR", "upgrade:counter"]);
        let (mut acked, mut reconnects) = (0u64, 0u64);
        let mut conn = TcpStream::connect(&listen2).map_err(|e| e.to_string())?;
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut pending = 0usize;
        while !stop2.load(Ordering::Relaxed) || pending > 0 {
            if pending == 0 {
                pending = BATCH;
            }
            let wire: Vec<u8> = cmd
                .iter()
                .copied()
                .cycle()
                .take(cmd.len() * pending)
                .collect();
            if conn.write_all(&wire).is_err() {
                conn = TcpStream::connect(&listen2).map_err(|e| e.to_string())?;
                conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                reconnects += 1;
                continue;
            }
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let done = count_int_replies(&got)?;
                if done == pending {
                    break;
                }
                match conn.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let done = count_int_replies(&got)?;
            acked += done as u64;
            pending -= done;
            if pending > 0 {
                conn = TcpStream::connect(&listen2).map_err(|e| e.to_string())?;
                conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                reconnects += 1;
            }
        }
        Ok((acked, reconnects))
    });

    std::thread::sleep(Duration::from_millis(500));
    let mut new = spawn(&listen, &admin, &redis.addr(), &sock, true, &dir.0, "new");
    let status = {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = old.try_wait().unwrap() {
                break st;
            }
            assert!(
                Instant::now() < deadline,
                "old proxy did not exit after the upgrade"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    assert!(status.success(), "old proxy exit: {status:?}");
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let (acked, reconnects) = client.join().unwrap().expect("no command may fail");
    let value = redis
        .client()
        .cmd(&["GET", "upgrade:counter"])
        .as_str()
        .parse::<u64>()
        .unwrap();
    assert_eq!(
        value, acked,
        "every acknowledged INCR counted once, none lost"
    );
    assert!(
        reconnects >= 1,
        "the client must have moved to the new process"
    );
    // The new process serves, on the same address.
    let mut c = Client::connect(&listen);
    assert_eq!(c.cmd(&["PING"]).as_str(), "PONG");
    // And it can itself be upgraded: the hand-over socket is in place again.
    let mut newer = spawn(&listen, &admin, &redis.addr(), &sock, true, &dir.0, "newer");
    let deadline = Instant::now() + Duration::from_secs(20);
    while new.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < deadline,
            "second upgrade: previous process did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut c = Client::connect(&listen);
    assert_eq!(
        c.cmd(&["INCR", "upgrade:counter"]).as_int() as u64,
        acked + 1
    );
    let _ = newer.kill();
    let _ = newer.wait();
    let stderr = std::fs::read_to_string(dir.0.join("new.stderr")).unwrap_or_default();
    assert!(stderr.contains("took over"), "new proxy log: {stderr}");
}
