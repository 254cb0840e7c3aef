//! `saltshaker top`: a live terminal view of hot keys, polled from a proxy's admin port.
//!
//! Owns a tiny blocking HTTP/1.1 GET client (one connection per request, `Connection:
//! close`), the parsing of `/hotkeys` JSON and `/metrics` text, and a pure [`render`] of one
//! frame to a string, so tests check frames on a buffer without a terminal. It knows nothing
//! of the proxy's internals: only what the admin port serves. No terminal library: ANSI
//! escapes to redraw in place, and the size from `$COLUMNS`/`$LINES`, `stty size` or 80x24.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, IsTerminal, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What `saltshaker top` is given on the command line.
pub struct TopArgs {
    /// The proxy's admin HTTP address, HOST:PORT.
    pub admin: String,
    /// Time between refreshes.
    pub interval_ms: u64,
    /// Render one frame (after two samples, so rates are known) and return.
    pub once: bool,
}

/// Refreshes of history kept per key for its trend sparkline.
pub const HISTORY_LEN: usize = 30;
/// Keys whose trend is remembered; bounds memory when the hot set churns.
const MAX_TRACKED: usize = 256;
/// A larger admin response is not a saltshaker admin port.
const MAX_RESPONSE_BYTES: usize = 8 << 20;
const BLOCKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// One row of `/hotkeys`.
#[derive(Clone, Debug, PartialEq)]
pub struct HotKey {
    pub key: String,
    pub reads_per_sec: f64,
    pub writes_per_sec: f64,
    /// Fraction (0..1) of all commands in the window that went to this key.
    pub share: f64,
    /// "hot" or "cooling".
    pub state: String,
    pub since_unix_ms: u64,
}

impl HotKey {
    pub fn total_per_sec(&self) -> f64 {
        self.reads_per_sec + self.writes_per_sec
    }
}

/// One `/hotkeys` answer, hottest key first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    pub window_ms: u64,
    pub keys: Vec<HotKey>,
}

/// Parses `/hotkeys`. Missing numeric fields read as 0, so an older or newer proxy still shows.
pub fn parse_hotkeys(json: &str) -> Result<Snapshot, String> {
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("/hotkeys is not JSON: {e}"))?;
    let obj = v.as_object().ok_or("/hotkeys is not a JSON object")?;
    let rows = obj
        .get("keys")
        .and_then(|k| k.as_array())
        .ok_or("/hotkeys has no \"keys\" array")?;
    let num = |r: &serde_json::Value, f: &str| r.get(f).and_then(|x| x.as_f64()).unwrap_or(0.0);
    let mut keys = Vec::with_capacity(rows.len());
    for (i, r) in rows.iter().enumerate() {
        let key = r
            .get("key")
            .and_then(|k| k.as_str())
            .ok_or_else(|| format!("/hotkeys entry {i} has no key"))?;
        keys.push(HotKey {
            key: key.to_string(),
            reads_per_sec: num(r, "reads_per_sec"),
            writes_per_sec: num(r, "writes_per_sec"),
            share: num(r, "share"),
            state: r
                .get("state")
                .and_then(|s| s.as_str())
                .unwrap_or("hot")
                .to_string(),
            since_unix_ms: r.get("since").and_then(|s| s.as_u64()).unwrap_or(0),
        });
    }
    let window_ms = obj.get("window_ms").and_then(|w| w.as_u64()).unwrap_or(0);
    Ok(Snapshot { window_ms, keys })
}

/// The counters `top` turns into rates, read from `/metrics`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counters {
    /// `saltshaker_requests_total` by `class`.
    pub requests: BTreeMap<String, f64>,
    /// `saltshaker_backend_requests_total` by `node`.
    pub backend: BTreeMap<String, f64>,
}

/// Parses Prometheus or OpenMetrics text. Samples are accepted with or without the `_total`
/// suffix (OpenMetrics adds it to counter samples, older exporters may not); `_created`
/// samples, comments and everything after `# EOF` are ignored.
pub fn parse_counters(metrics_text: &str) -> Result<Counters, String> {
    let mut c = Counters::default();
    let mut saw_requests = false;
    for line in metrics_text.lines() {
        let line = line.trim();
        if line == "# EOF" {
            break;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, labels, value)) = parse_sample(line) else {
            continue;
        };
        let (map, label) = match name.strip_suffix("_total").unwrap_or(name) {
            "saltshaker_requests" => (&mut c.requests, "class"),
            "saltshaker_backend_requests" => (&mut c.backend, "node"),
            _ => continue,
        };
        saw_requests |= label == "class";
        let Some((_, v)) = labels.into_iter().find(|(k, _)| k == label) else {
            continue;
        };
        if value.is_finite() {
            *map.entry(v).or_insert(0.0) += value;
        }
    }
    if !saw_requests {
        return Err(
            "/metrics has no saltshaker_requests_total: is this a saltshaker admin port?".into(),
        );
    }
    Ok(c)
}

/// `name{a="x",b="y"} value [timestamp]` -> (name, labels, value).
/// Label pairs of one sample, in the order written.
type Labels = Vec<(String, String)>;

fn parse_sample(line: &str) -> Option<(&str, Labels, f64)> {
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let mut labels = Vec::new();
    let mut rest = &line[name_end..];
    if let Some(inner) = rest.strip_prefix('{') {
        let mut chars = inner.char_indices();
        let mut key = String::new();
        loop {
            let (i, ch) = chars.next()?;
            match ch {
                '}' => {
                    rest = &inner[i + 1..];
                    break;
                }
                ',' | ' ' => {}
                '=' => {
                    if chars.next()?.1 != '"' {
                        return None;
                    }
                    let mut val = String::new();
                    loop {
                        match chars.next()?.1 {
                            '"' => break,
                            '\\' => match chars.next()?.1 {
                                'n' => val.push('\n'),
                                other => val.push(other),
                            },
                            other => val.push(other),
                        }
                    }
                    labels.push((std::mem::take(&mut key), val));
                }
                other => key.push(other),
            }
        }
    }
    let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
    Some((name, labels, value))
}

/// Per-second rates from two scrapes of the counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rates {
    /// Client commands per second, all classes.
    pub commands_per_sec: f64,
    pub by_class: Vec<(String, f64)>,
    /// Backend commands per second by node, busiest first.
    pub nodes: Vec<(String, f64)>,
}

impl Rates {
    /// None when no time passed or a counter went backwards (the proxy restarted).
    pub fn between(prev: &Counters, next: &Counters, elapsed: Duration) -> Option<Rates> {
        let secs = elapsed.as_secs_f64();
        if secs <= 0.0 {
            return None;
        }
        let deltas =
            |a: &BTreeMap<String, f64>, b: &BTreeMap<String, f64>| -> Option<Vec<(String, f64)>> {
                b.iter()
                    .map(|(k, v)| {
                        let d = v - a.get(k).copied().unwrap_or(0.0);
                        (d >= 0.0).then(|| (k.clone(), d / secs))
                    })
                    .collect()
            };
        let by_class = deltas(&prev.requests, &next.requests)?;
        let mut nodes = deltas(&prev.backend, &next.backend)?;
        nodes.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let commands_per_sec = by_class.iter().map(|(_, r)| r).sum();
        Some(Rates {
            commands_per_sec,
            by_class,
            nodes,
        })
    }

    /// Busiest node's rate over the mean node rate: 1.0 is perfectly even. None without traffic.
    pub fn imbalance(&self) -> Option<f64> {
        let n = self.nodes.len() as f64;
        let sum: f64 = self.nodes.iter().map(|(_, r)| r).sum();
        let max = self.nodes.iter().map(|(_, r)| *r).fold(0.0, f64::max);
        (sum > 0.0).then(|| max / (sum / n))
    }
}

/// Each followed key's total rate over the last [`HISTORY_LEN`] refreshes, oldest first.
#[derive(Clone, Debug, Default)]
pub struct History {
    series: HashMap<String, Vec<f64>>,
}

impl History {
    /// Appends one sample per followed key (0 for keys no longer listed); forgets keys whose
    /// whole remembered history is 0.
    pub fn record(&mut self, snap: &Snapshot) {
        let listed: HashMap<&str, f64> = snap
            .keys
            .iter()
            .map(|k| (k.key.as_str(), k.total_per_sec()))
            .collect();
        for (key, samples) in self.series.iter_mut() {
            samples.push(listed.get(key.as_str()).copied().unwrap_or(0.0));
        }
        for (key, rate) in &listed {
            self.series
                .entry((*key).to_string())
                .or_insert_with(|| vec![*rate]);
        }
        for samples in self.series.values_mut() {
            let extra = samples.len().saturating_sub(HISTORY_LEN);
            samples.drain(..extra);
        }
        self.series.retain(|_, s| s.iter().any(|v| *v > 0.0));
        if self.series.len() > MAX_TRACKED {
            self.series.retain(|k, _| listed.contains_key(k.as_str()));
        }
    }

    pub fn samples(&self, key: &str) -> &[f64] {
        self.series.get(key).map(|s| s.as_slice()).unwrap_or(&[])
    }
}

/// Everything one frame shows.
#[derive(Clone, Debug, Default)]
pub struct View {
    pub admin: String,
    pub interval_ms: u64,
    pub now_unix_ms: u64,
    /// The last good `/hotkeys` answer, kept (and marked stale) while the port is unreachable.
    pub snapshot: Option<Snapshot>,
    /// When `snapshot` was taken.
    pub updated_unix_ms: Option<u64>,
    pub history: History,
    pub rates: Option<Rates>,
    /// Why the last refresh failed; cleared by the next good one.
    pub error: Option<String>,
}

/// Polls one admin port and keeps the [`View`] up to date.
pub struct Poller {
    view: View,
    prev: Option<(Instant, Counters)>,
    timeout: Duration,
}

impl Poller {
    pub fn new(admin: &str, interval_ms: u64) -> Poller {
        let view = View {
            admin: admin.to_string(),
            interval_ms,
            ..View::default()
        };
        // A refresh should not take longer than the interval; a second is plenty on localhost.
        Poller {
            view,
            prev: None,
            timeout: Duration::from_millis(interval_ms.clamp(500, 2000)),
        }
    }

    pub fn view(&self) -> &View {
        &self.view
    }

    /// Fetches `/hotkeys` and `/metrics` once and folds them into the view.
    pub fn poll(&mut self) -> &View {
        self.view.now_unix_ms = unix_ms();
        match self.fetch() {
            Ok((snap, counters, at)) => {
                self.view.history.record(&snap);
                self.view.rates = self
                    .prev
                    .as_ref()
                    .and_then(|(t, c)| Rates::between(c, &counters, at - *t));
                self.prev = Some((at, counters));
                self.view.snapshot = Some(snap);
                self.view.updated_unix_ms = Some(self.view.now_unix_ms);
                self.view.error = None;
            }
            Err(e) => {
                // Rates across a gap would average over it; start over once the port is back.
                self.prev = None;
                self.view.rates = None;
                self.view.error = Some(e);
            }
        }
        &self.view
    }

    fn fetch(&self) -> Result<(Snapshot, Counters, Instant), String> {
        let metrics = http_get(&self.view.admin, "/metrics", self.timeout)?;
        let at = Instant::now();
        let counters = parse_counters(&metrics)?;
        let snap = parse_hotkeys(&http_get(&self.view.admin, "/hotkeys", self.timeout)?)?;
        Ok((snap, counters, at))
    }
}

/// Loops: poll, redraw in place, sleep; Ctrl-C ends it. With `once`, prints one frame and
/// returns an error if the admin port could not be read, so scripts see a failing exit.
pub fn run(args: TopArgs) -> io::Result<()> {
    let interval = Duration::from_millis(args.interval_ms.max(100));
    let mut poller = Poller::new(&args.admin, interval.as_millis() as u64);
    let mut out = io::stdout();
    if args.once {
        if poller.poll().error.is_none() {
            std::thread::sleep(interval);
            poller.poll();
        }
        // A pipe gets every row; a terminal gets what fits.
        let (w, h) = terminal_size();
        let h = if out.is_terminal() { h } else { usize::MAX };
        writeln!(out, "{}", render(poller.view(), w, h))?;
        return match &poller.view().error {
            Some(e) => Err(io::Error::other(e.clone())),
            None => Ok(()),
        };
    }
    out.write_all(b"\x1b[2J")?;
    loop {
        let started = Instant::now();
        poller.poll();
        let (w, h) = terminal_size();
        let frame = render(poller.view(), w, h);
        // Home, overwrite each line and clear its tail, then clear below: no flicker.
        let mut buf = String::with_capacity(frame.len() + 64);
        buf.push_str("\x1b[H");
        buf.push_str(&frame.replace('\n', "\x1b[K\n"));
        buf.push_str("\x1b[K\x1b[J");
        out.write_all(buf.as_bytes())?;
        out.flush()?;
        std::thread::sleep(interval.saturating_sub(started.elapsed()));
    }
}

/// (columns, lines): `$COLUMNS`/`$LINES`, else `stty size` on our stdin, else 80x24.
pub fn terminal_size() -> (usize, usize) {
    let env = |name: &str| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|v| *v > 0)
    };
    let (mut cols, mut lines) = (env("COLUMNS"), env("LINES"));
    if cols.is_none() || lines.is_none() {
        let stty = Command::new("stty")
            .arg("size")
            .stdin(Stdio::inherit())
            .stderr(Stdio::null())
            .output();
        if let Ok(o) = stty
            .as_ref()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        {
            let mut it = o
                .split_whitespace()
                .filter_map(|v| v.parse::<usize>().ok())
                .filter(|v| *v > 0);
            if let (Some(r), Some(c)) = (it.next(), it.next()) {
                lines = lines.or(Some(r));
                cols = cols.or(Some(c));
            }
        }
    }
    (cols.unwrap_or(80), lines.unwrap_or(24))
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

// ---- HTTP: one GET per connection, enough for an admin port on localhost. ----

/// `GET path` from `addr` with `Connection: close`: the body of a 200, or an error that says
/// who failed. `timeout` bounds the connect and the whole exchange.
pub fn http_get(addr: &str, path: &str, timeout: Duration) -> Result<String, String> {
    let deadline = Instant::now() + timeout;
    let addrs = addr.to_socket_addrs().map_err(|e| format!("{addr}: {e}"))?;
    let mut last = format!("{addr}: resolves to no address");
    let mut stream = None;
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = format!("{addr}: {e}"),
        }
    }
    let mut stream = stream.ok_or(last)?;
    let io_err = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
            format!("{addr}{path}: no answer within {} ms", timeout.as_millis())
        }
        _ => format!("{addr}{path}: {e}"),
    };
    stream.set_read_timeout(Some(timeout)).map_err(io_err)?;
    stream.set_write_timeout(Some(timeout)).map_err(io_err)?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: saltshaker-top\r\nAccept: */*\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(req.as_bytes()).map_err(io_err)?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        // A server that trickles bytes would reset the read timeout forever.
        if Instant::now() > deadline {
            return Err(format!(
                "{addr}{path}: no complete answer within {} ms",
                timeout.as_millis()
            ));
        }
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(io_err(e)),
        }
        if raw.len() > MAX_RESPONSE_BYTES {
            return Err(format!(
                "{addr}{path}: answer larger than {MAX_RESPONSE_BYTES} bytes"
            ));
        }
    }
    parse_response(&raw).map_err(|e| format!("{addr}{path}: {e}"))
}

/// Splits a whole HTTP/1.x response into head and body; the body of a 200, else an error.
fn parse_response(raw: &[u8]) -> Result<String, String> {
    if raw.is_empty() {
        return Err("connection closed without an answer".into());
    }
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("answer ended inside its headers")?;
    let head = String::from_utf8_lossy(&raw[..split]);
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or("");
    let mut parts = status.splitn(3, ' ');
    if !parts.next().unwrap_or("").starts_with("HTTP/1.") {
        return Err("not an HTTP/1 answer".into());
    }
    let code: u16 = parts
        .next()
        .and_then(|c| c.parse().ok())
        .ok_or("bad HTTP status line")?;
    let reason = parts.next().unwrap_or("").trim();
    let (mut chunked, mut length) = (false, None);
    for h in lines {
        let Some((name, value)) = h.split_once(':') else {
            continue;
        };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        if name == "transfer-encoding" && value.to_ascii_lowercase().contains("chunked") {
            chunked = true;
        } else if name == "content-length" {
            length = Some(value.parse::<usize>().map_err(|_| "bad Content-Length")?);
        }
    }
    let mut body = &raw[split + 4..];
    let dechunked;
    if chunked {
        dechunked = dechunk(body)?;
        body = &dechunked;
    } else if let Some(n) = length {
        body = body
            .get(..n)
            .ok_or("answer shorter than its Content-Length")?;
    }
    let text = String::from_utf8_lossy(body).into_owned();
    if code != 200 {
        let first = text.lines().next().unwrap_or("").trim();
        return Err(format!(
            "HTTP {code} {reason}{}{first}",
            if first.is_empty() { "" } else { ": " }
        ));
    }
    Ok(text)
}

fn dechunk(mut body: &[u8]) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        let eol = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("chunked answer cut short")?;
        let size_line = String::from_utf8_lossy(&body[..eol]);
        let size_hex = size_line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size_hex, 16).map_err(|_| "bad chunk size")?;
        body = &body[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        out.extend_from_slice(body.get(..size).ok_or("chunked answer cut short")?);
        body = body.get(size + 2..).ok_or("chunked answer cut short")?;
    }
}

// ---- Rendering: pure, from a View to lines that never exceed the given size. ----

/// Draws one frame: header (address, time, commands/s, per-node rates and imbalance), a
/// status line, then the hot-key table. At most `height` lines of at most `width` characters.
pub fn render(view: &View, width: usize, height: usize) -> String {
    let mut lines = vec![header_line(view), nodes_line(view)];
    lines.extend(status_lines(view));
    lines.push(String::new());
    match &view.snapshot {
        None if view.error.is_some() => lines.push("waiting for the admin port...".into()),
        None => lines.push("waiting for the first sample...".into()),
        Some(snap) if snap.keys.is_empty() => lines.push(format!(
            "no hot keys: nothing crossed its threshold in the last {} ms window",
            snap.window_ms
        )),
        Some(snap) => {
            let longest = snap.keys.iter().map(|k| k.key.chars().count()).max();
            let cols = Columns::fit(width, longest.unwrap_or(0));
            lines.push(cols.header());
            let room = height.saturating_sub(lines.len());
            let show = if snap.keys.len() > room {
                room.saturating_sub(1)
            } else {
                snap.keys.len()
            };
            for k in &snap.keys[..show] {
                lines.push(cols.row(k, view.history.samples(&k.key)));
            }
            if show < snap.keys.len() && room > 0 {
                lines.push(format!("... {} more", snap.keys.len() - show));
            }
        }
    }
    lines.truncate(height);
    lines
        .iter()
        .map(|l| fit(l, width))
        .collect::<Vec<_>>()
        .join("\n")
}

fn header_line(view: &View) -> String {
    let rates = match &view.rates {
        None => "cmd/s -".to_string(),
        Some(r) => {
            let mut by_class: Vec<&(String, f64)> = r.by_class.iter().collect();
            by_class.sort_by_key(|(c, _)| (class_rank(c), c.clone()));
            let classes: Vec<String> = by_class
                .iter()
                .map(|(c, v)| format!("{c} {}", human(*v)))
                .collect();
            format!(
                "cmd/s {} ({})",
                human(r.commands_per_sec),
                classes.join(", ")
            )
        }
    };
    format!(
        "saltshaker {} {}  {rates}",
        view.admin,
        clock(view.now_unix_ms)
    )
}

fn class_rank(class: &str) -> usize {
    ["read", "write", "other"]
        .iter()
        .position(|c| *c == class)
        .unwrap_or(3)
}

fn nodes_line(view: &View) -> String {
    let Some(r) = &view.rates else {
        return "backend -".into();
    };
    if r.nodes.is_empty() {
        return "backend: no node has served a command yet".into();
    }
    let imbalance = r
        .imbalance()
        .map(|x| format!("{x:.2}"))
        .unwrap_or_else(|| "-".into());
    let nodes: Vec<String> = r
        .nodes
        .iter()
        .map(|(n, v)| format!("{n} {}", human(*v)))
        .collect();
    format!("backend cmd/s max/mean {imbalance}  {}", nodes.join("  "))
}

/// One line of counts, or two on error: what failed, and what is on screen meanwhile.
fn status_lines(view: &View) -> Vec<String> {
    let every = format!("{:.1}s", view.interval_ms as f64 / 1000.0);
    if let Some(e) = &view.error {
        // The header already names the address; narrow screens need the cause.
        let e = e.strip_prefix(&format!("{}: ", view.admin)).unwrap_or(e);
        let shown = match view.updated_unix_ms {
            Some(t) => format!("; showing data from {}", clock(t)),
            None => String::new(),
        };
        return vec![
            format!("error: {e}"),
            format!("retrying every {every}{shown}"),
        ];
    }
    let keys = view
        .snapshot
        .as_ref()
        .map(|s| s.keys.as_slice())
        .unwrap_or(&[]);
    let hot = keys.iter().filter(|k| k.state == "hot").count();
    let window = view.snapshot.as_ref().map(|s| s.window_ms).unwrap_or(0);
    vec![format!(
        "{hot} hot, {} cooling  window {window} ms  refresh {every}",
        keys.len() - hot
    )]
}

/// Which columns fit and how wide KEY and TREND are. Narrow terminals drop TREND, then
/// STATE, then SHARE, before the key gets too short to recognise.
struct Columns {
    key: usize,
    share: bool,
    state: bool,
    trend: usize,
}

const KEY_MIN: usize = 12;
const KEY_WANT: usize = 24;
const TREND_MIN: usize = 8;

impl Columns {
    /// `longest_key`: characters in the longest key shown, so short keys leave no gap.
    fn fit(width: usize, longest_key: usize) -> Columns {
        // KEY, READS/S and WRITES/S (8 each) always; each optional column brings its space.
        let mut c = Columns {
            key: 0,
            share: true,
            state: true,
            trend: 0,
        };
        let fixed = |c: &Columns| 18 + if c.share { 7 } else { 0 } + if c.state { 8 } else { 0 };
        let need = longest_key.max("KEY".len());
        let avail = width.saturating_sub(fixed(&c));
        let first = need.min(KEY_WANT);
        let for_trend = avail.saturating_sub(first + 1).min(HISTORY_LEN);
        if for_trend >= TREND_MIN {
            c.trend = for_trend;
            c.key = need.min(avail - for_trend - 1);
            return c;
        }
        let short = need.min(KEY_MIN);
        c.state = width.saturating_sub(fixed(&c)) >= short;
        c.share = width.saturating_sub(fixed(&c)) >= short;
        c.key = need.min(width.saturating_sub(fixed(&c))).max(1);
        c
    }

    fn header(&self) -> String {
        self.line("KEY", "READS/S", "WRITES/S", "SHARE", "STATE", "TREND")
    }

    fn row(&self, k: &HotKey, history: &[f64]) -> String {
        let share = format!("{:.1}%", k.share * 100.0);
        let trend = sparkline(history, self.trend);
        let (r, w) = (human(k.reads_per_sec), human(k.writes_per_sec));
        self.line(
            &shorten(&k.key, self.key),
            &r,
            &w,
            &share,
            &printable(&k.state),
            &trend,
        )
    }

    fn line(&self, key: &str, r: &str, w: &str, share: &str, state: &str, trend: &str) -> String {
        let mut s = format!("{key:<kw$} {r:>8} {w:>8}", kw = self.key);
        if self.share {
            s.push_str(&format!(" {share:>6}"));
        }
        if self.state {
            s.push_str(&format!(" {state:<7}"));
        }
        if self.trend > 0 {
            s.push_str(&format!(" {trend:<tw$}", tw = self.trend));
        }
        s.trim_end().to_string()
    }
}

/// The last `width` samples as block characters scaled to their own maximum, newest at the
/// right; a zero sample is a blank.
fn sparkline(samples: &[f64], width: usize) -> String {
    let tail = &samples[samples.len().saturating_sub(width)..];
    let max = tail.iter().copied().fold(0.0, f64::max);
    let mut s: String = " ".repeat(width - tail.len());
    for v in tail {
        if *v > 0.0 && max > 0.0 {
            let i = ((v / max) * BLOCKS.len() as f64).ceil() as usize;
            s.push(BLOCKS[i.clamp(1, BLOCKS.len()) - 1]);
        } else {
            s.push(' ');
        }
    }
    s
}

/// Keys are client data: control characters would move the cursor or recolour the screen.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// At most `width` characters, with an ellipsis where something was cut.
fn shorten(s: &str, width: usize) -> String {
    let s = printable(s);
    if s.chars().count() <= width {
        return s;
    }
    let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
    if width > 0 {
        out.push('…');
    }
    out
}

fn fit(line: &str, width: usize) -> String {
    shorten(line, width)
}

/// 950 -> "950", 52_000 -> "52.0k", 3_400_000 -> "3.40M".
fn human(v: f64) -> String {
    if !v.is_finite() || v < 0.0 {
        "-".into()
    } else if v < 999.5 {
        format!("{v:.0}")
    } else if v < 999_950.0 {
        format!("{:.1}k", v / 1e3)
    } else {
        format!("{:.2}M", v / 1e6)
    }
}

/// HH:MM:SS UTC; a terminal view needs no calendar.
fn clock(unix_ms: u64) -> String {
    let s = (unix_ms / 1000) % 86_400;
    format!("{:02}:{:02}:{:02} UTC", s / 3600, (s / 60) % 60, s % 60)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    const HOTKEYS: &str = r#"{"window_ms":1000,"keys":[
        {"key":"likes:1","reads_per_sec":0.0,"writes_per_sec":52000.0,"share":0.31,"state":"hot","since":1764460000000},
        {"key":"user:42:profile","reads_per_sec":9100.5,"writes_per_sec":3.0,"share":0.054,"state":"cooling","since":1764460001000}
    ]}"#;

    const METRICS: &str = "# HELP saltshaker_requests Client commands handled, by command class.\n\
        # TYPE saltshaker_requests counter\n\
        saltshaker_requests_total{class=\"read\"} 1000\n\
        saltshaker_requests_total{class=\"write\"} 52000\n\
        saltshaker_requests_total{class=\"other\"} 7\n\
        saltshaker_requests_created{class=\"read\"} 1764460000.5\n\
        # TYPE saltshaker_backend_requests counter\n\
        saltshaker_backend_requests_total{node=\"127.0.0.1:6379\"} 40000\n\
        saltshaker_backend_requests_total{node=\"127.0.0.1:6380\"} 13000\n\
        saltshaker_client_connections 20\n\
        # EOF\n\
        saltshaker_requests_total{class=\"read\"} 99999\n";

    fn view_with(keys: usize, samples: usize) -> View {
        let mut view = View {
            admin: "127.0.0.1:9901".into(),
            interval_ms: 1000,
            now_unix_ms: 45_296_000,
            ..View::default()
        };
        let snap = Snapshot {
            window_ms: 1000,
            keys: (0..keys)
                .map(|i| HotKey {
                    key: format!("key:{i}:{}", "x".repeat(i * 7)),
                    reads_per_sec: 100.0 * i as f64,
                    writes_per_sec: 52_000.0 / (i + 1) as f64,
                    share: 0.3 / (i + 1) as f64,
                    state: if i % 2 == 0 { "hot" } else { "cooling" }.into(),
                    since_unix_ms: 0,
                })
                .collect(),
        };
        for s in 0..samples {
            let mut step = snap.clone();
            for k in step.keys.iter_mut() {
                k.writes_per_sec *= (s + 1) as f64;
            }
            view.history.record(&step);
        }
        let prev = parse_counters(METRICS).unwrap();
        let mut next = prev.clone();
        *next.requests.get_mut("write").unwrap() += 52_000.0;
        *next.backend.get_mut("127.0.0.1:6379").unwrap() += 39_000.0;
        *next.backend.get_mut("127.0.0.1:6380").unwrap() += 13_000.0;
        view.rates = Rates::between(&prev, &next, Duration::from_secs(1));
        view.snapshot = Some(snap);
        view.updated_unix_ms = Some(view.now_unix_ms);
        view
    }

    fn assert_fits(frame: &str, width: usize, height: usize) {
        let lines: Vec<&str> = frame.lines().collect();
        assert!(
            lines.len() <= height,
            "{} lines > {height}:\n{frame}",
            lines.len()
        );
        for l in lines {
            assert!(
                l.chars().count() <= width,
                "line of {} chars > {width}: {l:?}",
                l.chars().count()
            );
        }
    }

    #[test]
    fn parse_hotkeys_reads_the_admin_json_in_order() {
        let s = parse_hotkeys(HOTKEYS).unwrap();
        assert_eq!(s.window_ms, 1000);
        assert_eq!(s.keys.len(), 2);
        assert_eq!(s.keys[0].key, "likes:1");
        assert_eq!(s.keys[0].writes_per_sec, 52000.0);
        assert_eq!(s.keys[0].since_unix_ms, 1764460000000);
        assert_eq!(s.keys[1].state, "cooling");
        assert_eq!(s.keys[1].total_per_sec(), 9103.5);
    }

    #[test]
    fn parse_hotkeys_tolerates_missing_fields_and_rejects_non_hotkeys() {
        let s = parse_hotkeys(r#"{"keys":[{"key":"a"}],"extra":1}"#).unwrap();
        assert_eq!(
            (s.window_ms, s.keys[0].share, s.keys[0].state.as_str()),
            (0, 0.0, "hot")
        );
        assert_eq!(
            parse_hotkeys(r#"{"window_ms":1000,"keys":[]}"#)
                .unwrap()
                .keys
                .len(),
            0
        );
        assert!(parse_hotkeys("not found").is_err());
        assert!(parse_hotkeys("[1,2]").is_err());
        assert!(parse_hotkeys(r#"{"window_ms":1}"#).is_err());
        assert!(parse_hotkeys(r#"{"keys":[{"reads_per_sec":1}]}"#).is_err());
    }

    #[test]
    fn parse_counters_reads_openmetrics_and_stops_at_eof() {
        let c = parse_counters(METRICS).unwrap();
        assert_eq!(
            c.requests.get("read"),
            Some(&1000.0),
            "sample after # EOF and _created ignored"
        );
        assert_eq!(c.requests.get("write"), Some(&52000.0));
        assert_eq!(c.requests.len(), 3);
        assert_eq!(c.backend.get("127.0.0.1:6380"), Some(&13000.0));
    }

    #[test]
    fn parse_counters_reads_prometheus_text_without_total_suffix_and_with_timestamps() {
        let text = "saltshaker_requests{class=\"read\"} 5 1764460000000\n\
            saltshaker_requests{ class=\"write\" , shard=\"a\" } 2.5e3\n\
            saltshaker_requests{class=\"write\",shard=\"b\"} 500\n\
            saltshaker_backend_requests{node=\"[::1]:6379\"} +Inf\n\
            saltshaker_backend_requests{node=\"x\\\"y,z}\"} 3\n";
        let c = parse_counters(text).unwrap();
        assert_eq!(c.requests.get("read"), Some(&5.0));
        assert_eq!(
            c.requests.get("write"),
            Some(&3000.0),
            "samples of one class add up"
        );
        assert_eq!(
            c.backend.get("[::1]:6379"),
            None,
            "infinite values are skipped"
        );
        assert_eq!(c.backend.get("x\"y,z}"), Some(&3.0));
    }

    #[test]
    fn parse_counters_without_request_series_is_an_error() {
        assert!(parse_counters("# EOF\n").is_err());
        assert!(
            parse_counters("redis_up 1\nsaltshaker_requests_total{class=\"read\" 3\n").is_err()
        );
        assert!(parse_counters("").is_err());
    }

    #[test]
    fn rates_come_from_counter_deltas_and_a_reset_gives_none() {
        let prev = parse_counters(METRICS).unwrap();
        let mut next = prev.clone();
        *next.requests.get_mut("read").unwrap() += 2000.0;
        *next.backend.get_mut("127.0.0.1:6380").unwrap() += 3000.0;
        next.backend.insert("127.0.0.1:6381".into(), 1000.0);
        let r = Rates::between(&prev, &next, Duration::from_secs(2)).unwrap();
        assert_eq!(r.commands_per_sec, 1000.0);
        assert_eq!(r.nodes[0], ("127.0.0.1:6380".to_string(), 1500.0));
        assert_eq!(r.nodes.len(), 3);
        assert!((r.imbalance().unwrap() - 1500.0 / (2000.0 / 3.0)).abs() < 1e-9);
        assert!(Rates::between(&next, &prev, Duration::from_secs(1)).is_none());
        assert!(Rates::between(&prev, &next, Duration::ZERO).is_none());
        assert_eq!(
            Rates::between(&prev, &prev, Duration::from_secs(1))
                .unwrap()
                .imbalance(),
            None
        );
    }

    #[test]
    fn render_fits_80_120_and_40_columns_with_keys_in_order() {
        for width in [80, 120, 40] {
            let frame = render(&view_with(5, 10), width, 24);
            assert_fits(&frame, width, 24);
            assert!(
                frame.starts_with("saltshaker 127.0.0.1:9901 12:34:56 UTC"),
                "{frame}"
            );
            let lines: Vec<&str> = frame.lines().collect();
            let table = lines
                .iter()
                .position(|l| l.starts_with("KEY"))
                .expect("table header");
            for i in 0..5 {
                assert!(
                    lines[table + 1 + i].starts_with(&format!("key:{i}:")),
                    "{frame}"
                );
            }
            assert_eq!(frame.contains("TREND"), width >= 80, "width {width}");
            assert_eq!(frame.contains("STATE"), width >= 80, "width {width}");
            assert!(frame.contains("SHARE"));
        }
        let frame = render(&view_with(2, 3), 120, 24);
        assert!(
            frame.contains("cmd/s 52.0k (read 0, write 52.0k, other 0)"),
            "{frame}"
        );
        assert!(
            frame.contains("max/mean 1.50  127.0.0.1:6379 39.0k  127.0.0.1:6380 13.0k"),
            "{frame}"
        );
        assert!(
            frame.contains("1 hot, 1 cooling  window 1000 ms"),
            "{frame}"
        );
    }

    #[test]
    fn short_keys_leave_no_gap_before_the_numbers() {
        let frame = render(&view_with(2, 3), 120, 24);
        let header = frame.lines().find(|l| l.starts_with("KEY")).unwrap();
        assert_eq!(
            header,
            format!(
                "{:<13} {:>8} {:>8} {:>6} {:<7} TREND",
                "KEY", "READS/S", "WRITES/S", "SHARE", "STATE"
            )
        );
    }

    #[test]
    fn long_keys_are_cut_with_an_ellipsis_and_tiny_screens_are_respected() {
        let frame = render(&view_with(8, 1), 80, 24);
        assert!(frame.contains("key:7:xxxxxxxxxxxxxxxxx… "), "{frame}");
        for (w, h) in [(1, 1), (10, 3), (33, 6), (0, 0)] {
            assert_fits(&render(&view_with(8, 4), w, h), w, h);
        }
        let frame = render(&view_with(30, 1), 80, 10);
        assert_fits(&frame, 80, 10);
        assert!(frame.ends_with("... 26 more"), "{frame}");
    }

    #[test]
    fn sparkline_grows_with_history_newest_at_the_right() {
        let trend = |samples: usize| {
            let frame = render(&view_with(1, samples), 120, 24);
            let row = frame
                .lines()
                .find(|l| l.starts_with("key:0:"))
                .unwrap()
                .to_string();
            row.chars().filter(|c| BLOCKS.contains(c)).count()
        };
        assert_eq!(trend(1), 1);
        assert_eq!(trend(5), 5);
        assert_eq!(trend(HISTORY_LEN + 10), HISTORY_LEN);
        assert_eq!(sparkline(&[1.0, 2.0, 4.0, 8.0], 6), "  ▁▂▄█");
        assert_eq!(sparkline(&[0.0, 3.0], 2), " █");
        assert_eq!(sparkline(&[], 3), "   ");
    }

    #[test]
    fn history_forgets_keys_that_stay_quiet() {
        let mut h = History::default();
        let snap = parse_hotkeys(HOTKEYS).unwrap();
        h.record(&snap);
        h.record(&Snapshot::default());
        assert_eq!(h.samples("likes:1"), &[52000.0, 0.0]);
        for _ in 0..HISTORY_LEN {
            h.record(&Snapshot::default());
        }
        assert!(h.samples("likes:1").is_empty());
    }

    #[test]
    fn empty_and_error_states_say_so() {
        let mut view = view_with(0, 0);
        let frame = render(&view, 80, 24);
        assert!(frame.contains("no hot keys"), "{frame}");
        assert!(!frame.contains("KEY"));
        view.error = Some("127.0.0.1:9901: Connection refused (os error 111)".into());
        let frame = render(&view, 80, 24);
        assert!(
            frame.contains("\nerror: Connection refused (os error 111)\n"),
            "{frame}"
        );
        assert!(frame.contains("showing data from 12:34:56 UTC"), "{frame}");
        let fresh = View {
            admin: "h:1".into(),
            error: view.error.clone(),
            ..View::default()
        };
        let frame = render(&fresh, 40, 24);
        assert_fits(&frame, 40, 24);
        assert!(frame.contains("waiting for the admin port"), "{frame}");
    }

    #[test]
    fn control_characters_in_keys_never_reach_the_terminal() {
        let mut view = view_with(1, 1);
        view.snapshot.as_mut().unwrap().keys[0].key = "evil\x1b[2J\r\nkey".into();
        let frame = render(&view, 80, 24);
        assert!(!frame.contains('\x1b') && !frame.contains('\r'));
        assert!(frame.contains("evil?[2J??key"), "{frame}");
    }

    #[test]
    fn http_answers_are_split_checked_and_dechunked() {
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello trailing";
        assert_eq!(parse_response(ok).unwrap(), "hello");
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), "abcde");
        let e =
            parse_response(b"HTTP/1.1 404 Not Found\r\n\r\nnot found: try /metrics\n").unwrap_err();
        assert_eq!(e, "HTTP 404 Not Found: not found: try /metrics");
        assert!(parse_response(b"").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\nshort").is_err());
        assert!(parse_response(b"SSH-2.0-OpenSSH\r\n\r\n").is_err());
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").is_err()
        );
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 3").is_err());
    }

    /// An admin port stand-in: answers each connection from `route`, `n` times.
    fn fake_admin(n: usize, route: fn(&str) -> String) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for s in l.incoming().take(n) {
                let mut s = s.unwrap();
                let mut req = Vec::new();
                let mut b = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    let k = s.read(&mut b).unwrap();
                    req.extend_from_slice(&b[..k]);
                }
                let path = String::from_utf8_lossy(&req)
                    .split(' ')
                    .nth(1)
                    .unwrap_or("")
                    .to_string();
                let _ = s.write_all(route(&path).as_bytes());
            }
        });
        addr
    }

    #[test]
    fn poller_reads_a_live_admin_port_and_reports_one_that_is_gone() {
        let addr = fake_admin(4, |path| {
            let body = if path == "/hotkeys" { HOTKEYS } else { METRICS };
            format!(
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            )
        });
        let mut p = Poller::new(&addr, 500);
        assert!(p.poll().error.is_none(), "{:?}", p.view().error);
        assert!(p.view().rates.is_none(), "one sample gives no rate");
        let v = p.poll();
        assert!(v.error.is_none());
        assert_eq!(v.rates.as_ref().unwrap().commands_per_sec, 0.0);
        assert_eq!(v.history.samples("likes:1").len(), 2);
        let frame = render(v, 80, 24);
        assert!(
            frame.contains("likes:1") && frame.contains("52.0k"),
            "{frame}"
        );

        // The fake server has answered its 4 requests and is gone.
        let v = p.poll();
        assert!(
            v.error.as_deref().unwrap_or("").contains(&addr),
            "{:?}",
            v.error
        );
        assert!(v.snapshot.is_some(), "the last good sample stays on screen");
        assert!(v.rates.is_none());
    }

    #[test]
    fn a_non_saltshaker_port_is_an_error_not_a_blank_screen() {
        let addr = fake_admin(1, |_| {
            "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello".to_string()
        });
        let mut p = Poller::new(&addr, 500);
        let e = p.poll().error.clone().unwrap_or_default();
        assert!(e.contains("no saltshaker_requests_total"), "{e}");
    }

    #[test]
    fn a_silent_server_times_out() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let started = Instant::now();
        let e = http_get(&addr, "/metrics", Duration::from_millis(200)).unwrap_err();
        assert!(e.contains("no answer within 200 ms"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(2));
        drop(l);
    }
}
