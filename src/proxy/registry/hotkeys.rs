//! HOTKEYS (Redis 8.6: START, STOP, GET, RESET) answered from the proxy's own detector,
//! in Redis's reply format. Redis samples one node's keys by CPU time and network bytes
//! for a session; the proxy answers for every key its clients touch, on every node behind
//! it, unsampled: a session adds up what each closed detection window says of the keys it
//! lists (`add_window`), from START until STOP, its DURATION, or RESET.
//!
//! What the figures are: `by-cpu-time-us` is the node time the proxy estimates a key
//! cost: one microsecond per command (the order of a node's time for a small command,
//! bench/README.md "CPU per request"), plus the time estimated for its costly reads (hot by
//! cost); `by-net-bytes` is the bytes its costly reads moved (reads whose replies are under
//! the cost floor are not counted). `total-cpu-time-*-ms` are the proxy process's own CPU
//! over the session. `SAMPLE` is taken and reported, but nothing is sampled; `SLOTS` is
//! taken and reported, and keys of other slots are left out on a Redis Cluster.
//!
//! Over Valkey nodes (HELLO reports `valkey`), HOTKEYS GET and RESET are Valkey 9.2's
//! always-on form instead: GET lists the last closed window's hottest keys by estimated
//! queries per second, each as `key`, `db`, `qps` (a map in RESP3, a flat field/value
//! array in RESP2), as the Valkey documentation's pull request for the command describes
//! it; RESET clears it. No Valkey 9.2 server was at hand to compare with: `db` is 0 (the
//! detector counts keys, not databases).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use crate::command::Cmd;
use crate::hotkey::HotSnapshot;
use crate::resp::{encode_map_header, Proto, Request, Value};

/// Most keys a session keeps: the heaviest of them are listed.
const MAX_KEYS: usize = 4096;

/// The one HOTKEYS session of this proxy (Redis keeps one per node), and the last closed
/// window's hottest keys with their rates (Valkey's always-on HOTKEYS GET).
#[derive(Default)]
pub struct Hotkeys(Mutex<Option<Session>>, Mutex<Vec<(Vec<u8>, f64)>>);

/// Most keys Valkey's form of HOTKEYS GET lists.
const VALKEY_TOP: usize = 32;

struct Session {
    cpu: bool,
    net: bool,
    count: usize,
    sample: i64,
    slots: Vec<u16>,
    started: Instant,
    started_unix_ms: u64,
    duration: Option<Duration>,
    stopped: Option<Instant>,
    /// The proxy's own CPU (user, system) in ms at START.
    cpu_at_start: (u64, u64),
    cpu_at_stop: Option<(u64, u64)>,
    /// Per key: estimated node microseconds, and bytes.
    keys: HashMap<Vec<u8>, (f64, f64)>,
    all_us: f64,
    all_bytes: f64,
    /// The last window added, so that none is counted twice.
    last_window_at: u64,
}

impl Session {
    fn active(&self, now: Instant) -> bool {
        self.stopped.is_none() && self.duration.is_none_or(|d| now < self.started + d)
    }

    fn end(&self) -> Instant {
        let by_duration = self.duration.map(|d| self.started + d);
        match (self.stopped, by_duration) {
            (Some(s), Some(d)) => s.min(d),
            (Some(s), None) => s,
            (None, Some(d)) => d.min(Instant::now()),
            (None, None) => Instant::now(),
        }
    }
}

/// The proxy's user and system CPU in milliseconds (`/proc/self/stat`).
fn own_cpu_ms() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of the line (utime, stime), in clock ticks of 10 ms.
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) * 10;
    (tick(11), tick(12))
}

impl Hotkeys {
    /// A closed detection window: what it says of each key, added to the session.
    /// `slot_of` gives a key's slot on a Redis Cluster (None elsewhere).
    pub fn add_window(&self, snap: &HotSnapshot, slot_of: impl Fn(&[u8]) -> Option<u16>) {
        let mut top: Vec<(Vec<u8>, f64)> = snap
            .keys
            .iter()
            .map(|k| (k.key.clone(), k.reads_per_sec + k.writes_per_sec))
            .filter(|(_, qps)| *qps >= 0.5)
            .collect();
        top.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        top.truncate(VALKEY_TOP);
        *self.1.lock().unwrap_or_else(|p| p.into_inner()) = top;
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let Some(s) = g.as_mut() else { return };
        if !s.active(Instant::now()) || snap.at_unix_ms <= s.last_window_at {
            return;
        }
        s.last_window_at = snap.at_unix_ms;
        let secs = snap.window_ms as f64 / 1000.0;
        s.all_us += (snap.total_reads_per_sec + snap.total_writes_per_sec) * secs;
        for k in &snap.keys {
            if !s.slots.is_empty() && slot_of(&k.key).is_some_and(|slot| !s.slots.contains(&slot)) {
                continue;
            }
            let us = ((k.reads_per_sec + k.writes_per_sec) + k.node_ms_per_sec * 1000.0) * secs;
            let bytes = k.bytes_per_sec * secs;
            s.all_us += k.node_ms_per_sec * 1000.0 * secs;
            s.all_bytes += bytes;
            if s.keys.len() < MAX_KEYS || s.keys.contains_key(&k.key) {
                let e = s.keys.entry(k.key.clone()).or_insert((0.0, 0.0));
                e.0 += us;
                e.1 += bytes;
            }
        }
    }

    /// HOTKEYS START|STOP|GET|RESET: the reply; GET and RESET in Valkey's form when the
    /// nodes are Valkey (`valkey`).
    pub fn command(&self, sub: Cmd, req: &Request, proto: Proto, valkey: bool) -> Bytes {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let session = g.as_ref().is_some_and(|s| s.active(now));
        match sub {
            Cmd::HotkeysGet if valkey && g.is_none() => return self.valkey_get(proto),
            Cmd::HotkeysReset if valkey && !session => {
                self.1.lock().unwrap_or_else(|p| p.into_inner()).clear();
                *g = None;
                return Bytes::from_static(b"+OK\r\n");
            }
            _ => {}
        }
        match sub {
            Cmd::HotkeysStart => {
                if g.as_ref().is_some_and(|s| s.active(now)) {
                    return error("ERR hotkeys tracking is already in progress");
                }
                match start(req) {
                    Ok(s) => {
                        *g = Some(s);
                        Bytes::from_static(b"+OK\r\n")
                    }
                    Err(e) => error(e),
                }
            }
            Cmd::HotkeysStop => match g.as_mut() {
                Some(s) if s.active(now) => {
                    s.stopped = Some(now);
                    s.cpu_at_stop = Some(own_cpu_ms());
                    Bytes::from_static(b"+OK\r\n")
                }
                _ => error("ERR hotkeys tracking is not active"),
            },
            Cmd::HotkeysReset => {
                if g.as_ref().is_some_and(|s| s.active(now)) {
                    return error("ERR hotkeys tracking is active: stop it first");
                }
                *g = None;
                Bytes::from_static(b"+OK\r\n")
            }
            _ => match g.as_ref() {
                None => Bytes::from_static(if proto == Proto::Resp3 {
                    b"_\r\n"
                } else {
                    b"*-1\r\n"
                }),
                Some(s) => report(s, now, proto),
            },
        }
    }
}

impl Hotkeys {
    /// Valkey 9.2's HOTKEYS GET: the last window's hottest keys, by queries per second.
    fn valkey_get(&self, proto: Proto) -> Bytes {
        let top = self.1.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let bulk = |b: &[u8]| Value::Bulk(Bytes::copy_from_slice(b));
        let entries = top
            .into_iter()
            .map(|(key, qps)| {
                Value::Map(vec![
                    (bulk(b"key"), bulk(&key)),
                    (bulk(b"db"), Value::Integer(0)),
                    (bulk(b"qps"), Value::Integer(qps.round() as i64)),
                ])
            })
            .collect();
        Value::Array(entries).to_bytes(proto)
    }
}

fn error(msg: &str) -> Bytes {
    Bytes::from(format!("-{msg}\r\n"))
}

/// `HOTKEYS START METRICS count [CPU] [NET] [COUNT k] [DURATION seconds] [SAMPLE ratio]
/// [SLOTS count slot ...]`.
fn start(req: &Request) -> Result<Session, &'static str> {
    const SYNTAX: &str = "ERR syntax error";
    let arg = |i: usize| String::from_utf8_lossy(req.arg(i)).to_ascii_uppercase();
    let num = |i: usize| -> Result<i64, &'static str> {
        (i < req.argc())
            .then(|| arg(i).parse::<i64>().ok())
            .flatten()
            .ok_or("ERR value is not an integer or out of range")
    };
    if arg(2) != "METRICS" {
        return Err(SYNTAX);
    }
    let n = num(3)?;
    let (mut cpu, mut net, mut i) = (false, false, 4);
    for _ in 0..n.max(0) {
        match (i < req.argc()).then(|| arg(i)).as_deref() {
            Some("CPU") => cpu = true,
            Some("NET") => net = true,
            _ => return Err(SYNTAX),
        }
        i += 1;
    }
    if !(cpu || net) {
        return Err(SYNTAX);
    }
    let unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let (started_unix_ms, cpu_at_start) = (unix_ms, own_cpu_ms());
    let mut s = Session {
        cpu,
        net,
        count: 10,
        sample: 1,
        slots: Vec::new(),
        started: Instant::now(),
        started_unix_ms,
        duration: None,
        stopped: None,
        cpu_at_start,
        cpu_at_stop: None,
        keys: HashMap::new(),
        all_us: 0.0,
        all_bytes: 0.0,
        last_window_at: started_unix_ms,
    };
    while i < req.argc() {
        match arg(i).as_str() {
            "COUNT" => {
                s.count = usize::try_from(num(i + 1)?)
                    .map_err(|_| SYNTAX)?
                    .clamp(1, 1000)
            }
            "DURATION" => {
                s.duration = Some(Duration::from_secs(
                    u64::try_from(num(i + 1)?).map_err(|_| SYNTAX)?,
                ))
            }
            "SAMPLE" => s.sample = num(i + 1)?.max(1),
            "SLOTS" => {
                let n = usize::try_from(num(i + 1)?).map_err(|_| SYNTAX)?;
                for j in 0..n {
                    let slot = num(i + 2 + j)?;
                    s.slots.push(
                        u16::try_from(slot)
                            .ok()
                            .filter(|&x| x < 16384)
                            .ok_or(SYNTAX)?,
                    );
                }
                i += n;
            }
            _ => return Err(SYNTAX),
        }
        i += 2;
    }
    Ok(s)
}

/// HOTKEYS GET's reply: field and value pairs (a map in RESP3), Redis 8.6's fields.
fn report(s: &Session, now: Instant, proto: Proto) -> Bytes {
    let int = |n: f64| Value::Integer(n.round() as i64);
    let name = |t: &str| Value::Bulk(Bytes::copy_from_slice(t.as_bytes()));
    let end = s.end();
    let cpu_now = s.cpu_at_stop.unwrap_or_else(own_cpu_ms);
    let mut fields = vec![
        ("tracking-active", Value::Integer(s.active(now) as i64)),
        ("sample-ratio", Value::Integer(s.sample)),
        (
            "selected-slots",
            Value::Array(s.slots.iter().map(|&x| Value::Integer(x as i64)).collect()),
        ),
        ("all-commands-all-slots-us", int(s.all_us)),
        ("net-bytes-all-commands-all-slots", int(s.all_bytes)),
        (
            "collection-start-time-unix-ms",
            Value::Integer(s.started_unix_ms as i64),
        ),
        (
            "collection-duration-ms",
            Value::Integer(end.saturating_duration_since(s.started).as_millis() as i64),
        ),
    ];
    let top = |by: fn(&(f64, f64)) -> f64| {
        let mut v: Vec<(&Vec<u8>, f64)> = s.keys.iter().map(|(k, x)| (k, by(x))).collect();
        v.retain(|(_, x)| *x > 0.0);
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        v.truncate(s.count);
        Value::Array(
            v.into_iter()
                .flat_map(|(k, x)| [Value::Bulk(Bytes::copy_from_slice(k)), int(x)])
                .collect(),
        )
    };
    if s.cpu {
        fields.push((
            "total-cpu-time-user-ms",
            Value::Integer(cpu_now.0.saturating_sub(s.cpu_at_start.0) as i64),
        ));
        fields.push((
            "total-cpu-time-sys-ms",
            Value::Integer(cpu_now.1.saturating_sub(s.cpu_at_start.1) as i64),
        ));
        fields.push(("by-cpu-time-us", top(|x| x.0)));
    }
    if s.net {
        fields.push(("total-net-bytes", int(s.all_bytes)));
        fields.push(("by-net-bytes", top(|x| x.1)));
    }
    let mut out = BytesMut::new();
    encode_map_header(fields.len(), proto, &mut out);
    for (k, v) in fields {
        name(k).encode(proto, &mut out);
        v.encode(proto, &mut out);
    }
    out.freeze()
}
