//! `saltshaker top`: a live terminal view of hot keys, polled from a proxy's admin port.
//!
//! Owns a GET of the admin port (hyper's HTTP/1 client, one connection per request), the
//! parsing of `/hotkeys` JSON and `/metrics` text, and a pure [`render`] of one
//! frame to a string, so tests check frames on a buffer without a terminal. It knows nothing
//! of the proxy's internals: only what the admin port serves. No terminal library: ANSI
//! escapes to redraw in place, and the size from `$COLUMNS`/`$LINES`, `stty size` or 80x24.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, IsTerminal, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod http;
mod parse;
mod render;
#[cfg(test)]
mod tests;

pub use http::http_get;

/// Why a poll of the admin port gave no frame: where, and what went wrong.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TopError {
    /// The HTTP exchange with `at` (address and path) failed.
    #[error("{at}: {what}")]
    Http { at: String, what: String },
    /// An endpoint answered, but not as a saltshaker admin port does.
    #[error("{endpoint} {what}")]
    Answer {
        endpoint: &'static str,
        what: String,
    },
}
pub use parse::{parse_counters, parse_hotkeys, Counters, HotKey, Snapshot};
pub use render::render;

/// What `saltshaker top` is given on the command line.
pub struct TopArgs {
    /// The proxy's admin HTTP address, HOST:PORT.
    pub admin: String,
    /// Time between refreshes.
    pub interval_ms: u64,
    /// Render one frame (after two samples, so rates are known) and return.
    pub once: bool,
    /// The admin port's bearer token, when it asks for one.
    pub token: Option<String>,
    /// Order keys by BYTES/S rather than as the proxy lists them (hottest by rate first).
    pub sort_by_bytes: bool,
}

/// Refreshes of history kept per key for its trend sparkline.
pub const HISTORY_LEN: usize = 30;
/// Keys whose trend is remembered; bounds memory when the hot set churns.
pub(super) const MAX_TRACKED: usize = 256;
/// A larger admin response is not a saltshaker admin port.
pub(super) const MAX_RESPONSE_BYTES: usize = 8 << 20;
pub(super) const BLOCKS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

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
    /// `--sort bytes`: keys by BYTES/S.
    pub sort_by_bytes: bool,
}

/// Polls one admin port and keeps the [`View`] up to date.
pub struct Poller {
    view: View,
    prev: Option<(Instant, Counters)>,
    timeout: Duration,
    /// The admin port's bearer token (`admin_token_file`).
    pub token: Option<String>,
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
            token: None,
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
                self.view.error = Some(e.to_string());
            }
        }
        &self.view
    }

    fn fetch(&self) -> Result<(Snapshot, Counters, Instant), TopError> {
        let token = self.token.as_deref();
        let metrics = http_get(&self.view.admin, "/metrics", token, self.timeout)?;
        let at = Instant::now();
        let counters = parse_counters(&metrics)?;
        let snap = parse_hotkeys(&http_get(
            &self.view.admin,
            "/hotkeys",
            token,
            self.timeout,
        )?)?;
        Ok((snap, counters, at))
    }
}

/// Loops: poll, redraw in place, sleep; Ctrl-C ends it. With `once`, prints one frame and
/// returns an error if the admin port could not be read, so scripts see a failing exit.
pub fn run(args: TopArgs) -> io::Result<()> {
    let interval = Duration::from_millis(args.interval_ms.max(100));
    let mut poller = Poller::new(&args.admin, interval.as_millis() as u64);
    poller.token = args.token.clone();
    poller.view.sort_by_bytes = args.sort_by_bytes;
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

pub(super) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
