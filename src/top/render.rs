//! Rendering one frame: pure, from a View to lines that never exceed the given size.

use super::*;

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
            let mut keys: Vec<&HotKey> = snap.keys.iter().collect();
            if view.sort_by_bytes {
                keys.sort_by(|a, b| b.bytes_per_sec.total_cmp(&a.bytes_per_sec));
            }
            lines.push(cols.header());
            let room = height.saturating_sub(lines.len());
            let show = if snap.keys.len() > room {
                room.saturating_sub(1)
            } else {
                snap.keys.len()
            };
            for k in &keys[..show] {
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

pub(super) fn header_line(view: &View) -> String {
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

pub(super) fn class_rank(class: &str) -> usize {
    ["read", "write", "other"]
        .iter()
        .position(|c| *c == class)
        .unwrap_or(3)
}

pub(super) fn nodes_line(view: &View) -> String {
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
pub(super) fn status_lines(view: &View) -> Vec<String> {
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
/// BYTES/S, then STATE, then SHARE, before the key gets too short to recognise.
pub(super) struct Columns {
    key: usize,
    bytes: bool,
    share: bool,
    state: bool,
    trend: usize,
}

pub(super) const KEY_MIN: usize = 12;
pub(super) const KEY_WANT: usize = 24;
pub(super) const TREND_MIN: usize = 8;

impl Columns {
    /// `longest_key`: characters in the longest key shown, so short keys leave no gap.
    fn fit(width: usize, longest_key: usize) -> Columns {
        // KEY, READS/S and WRITES/S (8 each) always; each optional column brings its space.
        let mut c = Columns {
            key: 0,
            bytes: true,
            share: true,
            state: true,
            trend: 0,
        };
        let fixed = |c: &Columns| {
            18 + if c.bytes { 9 } else { 0 }
                + if c.share { 7 } else { 0 }
                + if c.state { 10 } else { 0 }
        };
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
        c.bytes = width.saturating_sub(fixed(&c)) >= short;
        c.state = width.saturating_sub(fixed(&c)) >= short;
        c.share = width.saturating_sub(fixed(&c)) >= short;
        c.key = need.min(width.saturating_sub(fixed(&c))).max(1);
        c
    }

    fn header(&self) -> String {
        self.line([
            "KEY", "READS/S", "WRITES/S", "BYTES/S", "SHARE", "STATE", "TREND",
        ])
    }

    fn row(&self, k: &HotKey, history: &[f64]) -> String {
        let share = format!("{:.1}%", k.share * 100.0);
        let trend = sparkline(history, self.trend);
        let (r, w) = (human(k.reads_per_sec), human(k.writes_per_sec));
        let b = human(k.bytes_per_sec);
        // A write-hot key's phase says more than "hot": combining, salting, salted.
        let state = printable(match k.phase.as_deref() {
            Some(p) if p != "detected" => p,
            _ => &k.state,
        });
        self.line([
            &shorten(&k.key, self.key),
            &r,
            &w,
            &b,
            &share,
            &state,
            &trend,
        ])
    }

    fn line(&self, cells: [&str; 7]) -> String {
        let [key, r, w, bytes, share, state, trend] = cells;
        let mut s = format!("{key:<kw$} {r:>8} {w:>8}", kw = self.key);
        if self.bytes {
            s.push_str(&format!(" {bytes:>8}"));
        }
        if self.share {
            s.push_str(&format!(" {share:>6}"));
        }
        if self.state {
            s.push_str(&format!(" {state:<9}"));
        }
        if self.trend > 0 {
            s.push_str(&format!(" {trend:<tw$}", tw = self.trend));
        }
        s.trim_end().to_string()
    }
}

/// The last `width` samples as block characters scaled to their own maximum, newest at the
/// right; a zero sample is a blank.
pub(super) fn sparkline(samples: &[f64], width: usize) -> String {
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
pub(super) fn printable(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// At most `width` characters, with an ellipsis where something was cut.
pub(super) fn shorten(s: &str, width: usize) -> String {
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

pub(super) fn fit(line: &str, width: usize) -> String {
    shorten(line, width)
}

/// 950 -> "950", 52_000 -> "52.0k", 3_400_000 -> "3.40M".
pub(super) fn human(v: f64) -> String {
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
pub(super) fn clock(unix_ms: u64) -> String {
    let s = (unix_ms / 1000) % 86_400;
    format!("{:02}:{:02}:{:02} UTC", s / 3600, (s / 60) % 60, s % 60)
}
