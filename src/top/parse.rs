//! Parsing what the admin port serves: `/hotkeys` JSON and `/metrics` text.

use std::collections::BTreeMap;

use super::TopError;

/// One row of `/hotkeys`.
#[derive(Clone, Debug, PartialEq)]
pub struct HotKey {
    pub key: String,
    pub reads_per_sec: f64,
    pub writes_per_sec: f64,
    /// Bytes its reads move per second (0 from an older proxy, or below the cost floor).
    pub bytes_per_sec: f64,
    /// Fraction (0..1) of all commands in the window that went to this key.
    pub share: f64,
    /// "hot" or "cooling".
    pub state: String,
    pub since_unix_ms: u64,
    /// A write-hot key's way to mitigation: "detected", "combining", "salting", "salted"
    /// or "demoted" (None from an older proxy, or for a key hot by reads only).
    pub phase: Option<String>,
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
pub fn parse_hotkeys(json: &str) -> Result<Snapshot, TopError> {
    let bad = |what: String| TopError::Answer {
        endpoint: "/hotkeys",
        what,
    };
    let v: serde_json::Value =
        serde_json::from_str(json).map_err(|e| bad(format!("is not JSON: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| bad("is not a JSON object".into()))?;
    let rows = obj
        .get("keys")
        .and_then(|k| k.as_array())
        .ok_or_else(|| bad("has no \"keys\" array".into()))?;
    let num = |r: &serde_json::Value, f: &str| r.get(f).and_then(|x| x.as_f64()).unwrap_or(0.0);
    let mut keys = Vec::with_capacity(rows.len());
    for (i, r) in rows.iter().enumerate() {
        let key = r
            .get("key")
            .and_then(|k| k.as_str())
            .ok_or_else(|| bad(format!("entry {i} has no key")))?;
        keys.push(HotKey {
            key: key.to_string(),
            reads_per_sec: num(r, "reads_per_sec"),
            writes_per_sec: num(r, "writes_per_sec"),
            bytes_per_sec: num(r, "bytes_per_sec"),
            share: num(r, "share"),
            state: r
                .get("state")
                .and_then(|s| s.as_str())
                .unwrap_or("hot")
                .to_string(),
            since_unix_ms: r.get("since").and_then(|s| s.as_u64()).unwrap_or(0),
            phase: r.get("phase").and_then(|s| s.as_str()).map(str::to_string),
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
pub fn parse_counters(metrics_text: &str) -> Result<Counters, TopError> {
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
        return Err(TopError::Answer {
            endpoint: "/metrics",
            what: "has no saltshaker_requests_total: is this a saltshaker admin port?".into(),
        });
    }
    Ok(c)
}

/// `name{a="x",b="y"} value [timestamp]` -> (name, labels, value).
/// Label pairs of one sample, in the order written.
type Labels = Vec<(String, String)>;

pub(super) fn parse_sample(line: &str) -> Option<(&str, Labels, f64)> {
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
