//! `MONITOR` through the proxy: every command that passes through this proxy, streamed to
//! the clients that asked, in Redis's line format (`+<unix time> [<db> <client addr>]
//! "arg" ...`). A monitoring client that reads slowly never slows anyone else: each has a
//! bounded queue, and a line that finds it full is dropped and counted
//! (`saltshaker_monitor_dropped_lines_total`). With nobody monitoring, the request path
//! pays one relaxed atomic load per read.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::metrics::MonitorMetrics;
use crate::net::{ReadHalf, WriteHalf};
use crate::resp::Request;

/// Lines a monitoring client may have waiting before new ones are dropped for it.
const QUEUE: usize = 8192;

/// The monitoring clients of this proxy.
pub struct Monitors {
    active: AtomicUsize,
    subs: Mutex<Vec<mpsc::Sender<Bytes>>>,
    metrics: MonitorMetrics,
}

impl Monitors {
    pub fn new(metrics: MonitorMetrics) -> Monitors {
        Monitors {
            active: AtomicUsize::new(0),
            subs: Mutex::new(Vec::new()),
            metrics,
        }
    }

    /// Whether anyone monitors: read once per round by the sessions.
    pub fn active(&self) -> bool {
        self.active.load(Ordering::Relaxed) > 0
    }

    /// A new monitoring client's queue.
    pub fn subscribe(&self) -> mpsc::Receiver<Bytes> {
        let (tx, rx) = mpsc::channel(QUEUE);
        let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        subs.push(tx);
        self.count(subs.len());
        rx
    }

    fn count(&self, n: usize) {
        self.active.store(n, Ordering::Relaxed);
        self.metrics.clients.set(n as i64);
    }

    /// Sends one command's line to every monitoring client: `args` from `args`, and the
    /// database after the command ran (Redis writes the line once it has run).
    pub fn feed(&self, db: u32, addr: &str, args: &[u8]) {
        let line = line(db, addr, args);
        let mut subs = self.subs.lock().unwrap_or_else(|p| p.into_inner());
        let before = subs.len();
        subs.retain(|tx| match tx.try_send(line.clone()) {
            Ok(()) => {
                self.metrics.lines.inc();
                true
            }
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.metrics.dropped.inc();
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        });
        if subs.len() != before {
            self.count(subs.len());
        }
    }
}

/// Redis's MONITOR line for a command: the time, the database and the client's address,
/// then its arguments (`args`).
pub fn line(db: u32, addr: &str, args: &[u8]) -> Bytes {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut out = BytesMut::with_capacity(40 + args.len());
    out.extend_from_slice(
        format!(
            "+{}.{:06} [{db} {addr}]",
            now.as_secs(),
            now.subsec_micros()
        )
        .as_bytes(),
    );
    out.extend_from_slice(args);
    out.freeze()
}

/// A command's arguments as a MONITOR line ends: each quoted as `sdscatrepr` quotes it,
/// after a space, then CRLF. Passwords are redacted as Redis 7.0 redacts them (AUTH,
/// HELLO's AUTH, MIGRATE's AUTH and AUTH2).
pub fn args(req: &Request) -> BytesMut {
    let mut out = BytesMut::with_capacity(req.argc() * 8);
    let redacted = redacted(req);
    for i in 0..req.argc() {
        out.extend_from_slice(b" ");
        if redacted.contains(&i) {
            out.extend_from_slice(b"\"(redacted)\"");
        } else {
            quote(req.arg(i), &mut out);
        }
    }
    out.extend_from_slice(b"\r\n");
    out
}

/// The arguments Redis shows as `(redacted)`.
fn redacted(req: &Request) -> Vec<usize> {
    let is = |i: usize, w: &str| i < req.argc() && req.arg(i).eq_ignore_ascii_case(w.as_bytes());
    let n = req.argc();
    if is(0, "AUTH") {
        return (1..n).collect();
    }
    let mut out = Vec::new();
    if is(0, "HELLO") || is(0, "MIGRATE") {
        let mut i = 1;
        while i < n {
            if is(i, "AUTH") && is(0, "HELLO") {
                out.extend([i + 1, i + 2]);
                i += 3;
            } else if is(i, "AUTH") {
                out.push(i + 1);
                i += 2;
            } else if is(i, "AUTH2") {
                out.extend([i + 1, i + 2]);
                i += 3;
            } else {
                i += 1;
            }
        }
    }
    out
}

/// `sdscatrepr`: the bytes in double quotes, with `\\`, `\"`, `\n`, `\r`, `\t`, `\a`, `\b`
/// escaped and every other unprintable byte as `\xHH`.
fn quote(arg: &[u8], out: &mut BytesMut) {
    out.extend_from_slice(b"\"");
    for &b in arg {
        match b {
            b'\\' | b'"' => out.extend_from_slice(&[b'\\', b]),
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            b'\t' => out.extend_from_slice(b"\\t"),
            7 => out.extend_from_slice(b"\\a"),
            8 => out.extend_from_slice(b"\\b"),
            0x20..=0x7e => out.extend_from_slice(&[b]),
            _ => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
        }
    }
    out.extend_from_slice(b"\"");
}

/// Streams the lines to a monitoring client until it closes its connection. What it sends
/// meanwhile is read and discarded (QUIT closes it).
pub async fn pump(mut r: ReadHalf, mut w: WriteHalf, mut lines: mpsc::Receiver<Bytes>) {
    let mut sink = vec![0u8; 1024];
    let mut out = BytesMut::new();
    loop {
        tokio::select! {
            line = lines.recv() => {
                let Some(line) = line else { return };
                out.extend_from_slice(&line);
                // Everything already queued goes in the same write.
                while out.len() < 64 * 1024 {
                    match lines.try_recv() {
                        Ok(l) => out.extend_from_slice(&l),
                        Err(_) => break,
                    }
                }
                if w.write_all(&out).await.is_err() || w.flush().await.is_err() {
                    return;
                }
                out.clear();
            }
            n = r.read(&mut sink) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let said = String::from_utf8_lossy(&sink[..n]).to_ascii_uppercase();
                    if said.contains("QUIT") {
                        let _ = w.write_all(b"+OK\r\n").await;
                        return;
                    }
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_quote_and_redact_as_redis_does() {
        let req = Request::from_args(&[&b"SET"[..], b"k\"1", b"a\r\n\x01"]);
        let l = line(3, "127.0.0.1:5000", &args(&req));
        let l = String::from_utf8_lossy(&l);
        assert!(
            l.ends_with(" [3 127.0.0.1:5000] \"SET\" \"k\\\"1\" \"a\\r\\n\\x01\"\r\n"),
            "{l}"
        );
        assert!(l.starts_with('+'));
        let auth = Request::from_args(&[&b"AUTH"[..], b"u", b"pw"]);
        let l = String::from_utf8_lossy(&line(0, "a", &args(&auth))).into_owned();
        assert!(
            l.ends_with("\"AUTH\" \"(redacted)\" \"(redacted)\"\r\n"),
            "{l}"
        );
        let hello = Request::from_args(&[&b"HELLO"[..], b"3", b"AUTH", b"u", b"pw"]);
        let l = String::from_utf8_lossy(&line(0, "a", &args(&hello))).into_owned();
        assert!(
            l.ends_with("\"HELLO\" \"3\" \"AUTH\" \"(redacted)\" \"(redacted)\"\r\n"),
            "{l}"
        );
    }
}
