//! The shipped alert rules under a real Prometheus: it scrapes a live proxy during a viral
//! workload and reports the hot-key alert firing for that key through its HTTP API; during
//! increments on a combined key that holds text it reports the combine-fallback alert firing,
//! while the cache alerts stay quiet for a healthy cache and every dashboard query evaluates.
//!
//! Only the `for:` durations of the shipped rules are shortened (a plain text substitution
//! checked line by line), so every expression Prometheus evaluates here is the shipped one.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use saltshaker::loadgen::{run_blocking, BenchArgs, Mix, Workload};
use serde_json::Value;
use support::*;

const VIRAL: &str = "likes:viral";
const HOT_ALERT: &str = "SaltshakerKeyHotTooLong";
const JOB: &str = "saltshaker";
const FALLBACK_ALERT: &str = "SaltshakerCombineFallbacks";
const HIT_RATIO_ALERT: &str = "SaltshakerCacheHitRatioLow";

/// One Prometheus and one load at a time: two would slow each other's scrapes on a small
/// machine.
static SERIAL: Mutex<()> = Mutex::new(());

/// What every `for:` becomes: one evaluation interval, so the alert still passes through
/// `pending` on its way to `firing`.
const SHORT_FOR: &str = "1s";

/// The shipped rules with each `for:` value replaced by `SHORT_FOR`, and the number of
/// lines changed. Panics if anything but a `for:` line would differ.
fn shortened_rules(shipped: &str) -> (String, usize) {
    let mut changed = 0;
    let mut out = String::with_capacity(shipped.len());
    for line in shipped.split_inclusive('\n') {
        let body = line.trim_end_matches(['\n', '\r']);
        let indent = body.len() - body.trim_start().len();
        match body.trim_start().strip_prefix("for:") {
            Some(value) => {
                let value = value.trim();
                assert!(
                    !value.is_empty() && value.chars().all(|c| c.is_ascii_alphanumeric()),
                    "unexpected `for:` line in the shipped rules: {body:?}"
                );
                out.push_str(&body[..indent]);
                out.push_str("for: ");
                out.push_str(SHORT_FOR);
                out.push_str(&line[body.len()..]);
                changed += 1;
            }
            None => out.push_str(line),
        }
    }
    let diff = shipped
        .lines()
        .zip(out.lines())
        .filter(|(a, b)| a != b)
        .count();
    assert_eq!(shipped.lines().count(), out.lines().count());
    assert_eq!(diff, changed, "only `for:` lines may change");
    (out, changed)
}

/// A Prometheus server of our own, killed (by its own pid) on drop.
struct Prometheus {
    addr: String,
    child: Child,
    _dir: TempDir,
}

impl Prometheus {
    fn start(rules: &str, target: &str) -> Prometheus {
        let dir = TempDir::new("prometheus");
        let rules_path = dir.0.join("alerts.yaml");
        std::fs::write(&rules_path, rules).expect("write rules copy");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files: [\"{}\"]\n\
             scrape_configs:\n  - job_name: {JOB}\n    static_configs:\n      - targets: [\"{target}\"]\n",
            path_str(&rules_path)
        );
        let config_path = dir.0.join("prometheus.yml");
        std::fs::write(&config_path, config).expect("write prometheus config");
        let log_path = dir.0.join("prometheus.log");
        let mut last = String::new();
        // A port from free_port() may be taken by someone else before Prometheus binds it.
        for _ in 0..3 {
            let addr = format!("127.0.0.1:{}", free_port());
            let log = std::fs::File::create(&log_path).expect("log file");
            let mut child = Command::new("prometheus")
                .arg(format!("--config.file={}", path_str(&config_path)))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    path_str(&dir.0.join("data"))
                ))
                .arg(format!("--web.listen-address={addr}"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawn prometheus");
            if wait_ready(&mut child, &addr, Duration::from_secs(20)) {
                return Prometheus {
                    addr,
                    child,
                    _dir: dir,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
            last = std::fs::read_to_string(&log_path).unwrap_or_default();
            if !last.contains("address already in use") {
                break;
            }
        }
        panic!("prometheus did not become ready:\n{last}");
    }

    /// `data` of a successful API answer.
    fn api(&self, path: &str) -> Value {
        let (status, body) = http_get(&self.addr, path);
        assert_eq!(status, 200, "{path}: {body}");
        let v: Value = serde_json::from_str(&body)
            .unwrap_or_else(|e| panic!("{path} is not JSON ({e}): {body}"));
        assert_eq!(v["status"], "success", "{path}: {body}");
        v["data"].clone()
    }

    /// Active (pending or firing) alerts.
    fn alerts(&self) -> Vec<Value> {
        self.api("/api/v1/alerts")["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    fn alerting_rules(&self) -> Vec<Value> {
        let data = self.api("/api/v1/rules?type=alert");
        let groups = data["groups"].as_array().cloned().unwrap_or_default();
        groups
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect()
    }
}

/// True once `child` answers 200 on /-/ready at `addr`; false if it exits or times out.
fn wait_ready(child: &mut Child, addr: &str, timeout: Duration) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if !matches!(child.try_wait(), Ok(None)) {
            return false;
        }
        if std::net::TcpStream::connect(addr).is_ok() && http_get(addr, "/-/ready").0 == 200 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The state of the hot-key alert for `key` and `kind`, if it is active.
fn hot_alert_state(alerts: &[Value], key: &str, kind: &str) -> Option<String> {
    alerts
        .iter()
        .find(|a| {
            let l = &a["labels"];
            l["alertname"] == HOT_ALERT && l["key"] == key && l["kind"] == kind
        })
        .map(|a| a["state"].as_str().unwrap_or("?").to_string())
}

fn names(alerts: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = alerts
        .iter()
        .map(|a| {
            format!(
                "{}{{key={},kind={}}}={}",
                a["labels"]["alertname"].as_str().unwrap_or("?"),
                a["labels"]["key"].as_str().unwrap_or("-"),
                a["labels"]["kind"].as_str().unwrap_or("-"),
                a["state"].as_str().unwrap_or("?")
            )
        })
        .collect();
    v.sort();
    v
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    while !f() {
        assert!(Instant::now() < end, "timed out after {timeout:?}: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until Prometheus has scraped `proxy` successfully.
fn wait_target_up(prom: &Prometheus, proxy: &Proxy) {
    wait_for(
        "the saltshaker target is up",
        Duration::from_secs(15),
        || {
            let t = prom.api("/api/v1/targets?state=active");
            t["activeTargets"].as_array().is_some_and(|ts| {
                ts.iter().any(|t| {
                    t["labels"]["job"] == JOB
                        && t["labels"]["instance"] == proxy.admin_addr().as_str()
                        && t["health"] == "up"
                })
            })
        },
    );
}

/// The active alert named `name`, if any.
fn active<'a>(alerts: &'a [Value], name: &str) -> Option<&'a Value> {
    alerts.iter().find(|a| a["labels"]["alertname"] == name)
}

/// Load in one-second runs until `stop` is set or `max` has passed.
fn load_until(stop: Arc<AtomicBool>, max: Duration, args: BenchArgs) -> JoinHandle<(u64, u64)> {
    std::thread::spawn(move || {
        let start = Instant::now();
        let (mut ops, mut errors) = (0, 0);
        while !stop.load(Ordering::Relaxed) && start.elapsed() < max {
            let r = run_blocking(BenchArgs {
                duration_ms: 1_000,
                ..args.clone()
            })
            .expect("saltshaker bench");
            ops += r.ops;
            errors += r.errors;
        }
        (ops, errors)
    })
}

fn bench(target: &str, rate: u64, workload: Workload, mix: Mix) -> BenchArgs {
    BenchArgs {
        target: target.to_string(),
        clients: 4,
        pipeline: 16,
        keyspace: 10_000,
        workload,
        mix,
        rate: Some(rate),
        ..BenchArgs::default()
    }
}

/// The lock that runs the Prometheus tests one at a time, or None (the test is skipped)
/// when redis-server or prometheus is missing.
fn serial_with_prometheus() -> Option<std::sync::MutexGuard<'static, ()>> {
    need_redis();
    need_tool("prometheus");
    Some(SERIAL.lock().unwrap_or_else(|e| e.into_inner()))
}

fn shipped_rules() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules/alerts.yaml");
    std::fs::read_to_string(path).expect("read the shipped alert rules")
}

#[test]
fn prometheus_fires_the_shipped_hot_key_alert_for_a_viral_key() {
    let Some(_serial) = serial_with_prometheus() else {
        return;
    };
    let started = Instant::now();
    let shipped = shipped_rules();
    let (rules, changed) = shortened_rules(&shipped);
    assert!(changed > 0, "the shipped rules have no `for:` to shorten");

    let node = Redis::start();
    let proxy = Proxy::start(&[&node], &[]);
    let prom = Prometheus::start(&rules, &proxy.admin_addr());

    // Every shipped alert is loaded, the hot-key one with the shortened hold time.
    let loaded = prom.alerting_rules();
    let shipped_count = shipped.matches("- alert:").count();
    assert_eq!(loaded.len(), shipped_count, "{loaded:?}");
    let hot_rule = loaded
        .iter()
        .find(|r| r["name"] == HOT_ALERT)
        .unwrap_or_else(|| panic!("no {HOT_ALERT} among {loaded:?}"));
    assert_eq!(hot_rule["duration"], 1, "{hot_rule}");

    wait_target_up(&prom, &proxy);

    // Uniform traffic under the hot threshold, for a few scrapes and evaluations: no hot-key
    // alert in any state (a rule that fired on every key would fail here).
    let stop = Arc::new(AtomicBool::new(false));
    let calm = load_until(
        stop.clone(),
        Duration::from_secs(3),
        bench(&proxy.addr(), 2_000, Workload::Uniform, Mix::default()),
    );
    let calm_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < calm_until {
        let active = prom.alerts();
        assert!(
            active.iter().all(|a| a["labels"]["alertname"] != HOT_ALERT),
            "hot-key alert without a hot key: {:?}",
            names(&active)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let (calm_ops, calm_errors) = calm.join().expect("calm load");
    assert_eq!(calm_errors, 0);
    assert!(calm_ops > 0, "the calm load sent nothing");

    // INCR on one key at several times the default write threshold (2000/s).
    let viral = load_until(
        stop.clone(),
        Duration::from_secs(30),
        bench(
            &proxy.addr(),
            10_000,
            Workload::Viral {
                key: VIRAL.into(),
                share: 0.9,
            },
            Mix {
                get: 0,
                set: 0,
                incr: 100,
            },
        ),
    );
    let load_start = Instant::now();
    let mut states: Vec<String> = Vec::new();
    let mut fired = None;
    while load_start.elapsed() < Duration::from_secs(30) && !viral.is_finished() {
        let active = prom.alerts();
        let state = hot_alert_state(&active, VIRAL, "write");
        if let Some(s) = &state {
            if states.last() != Some(s) {
                states.push(s.clone());
            }
        }
        if state.as_deref() == Some("firing") {
            fired = active
                .into_iter()
                .find(|a| a["labels"]["alertname"] == HOT_ALERT && a["labels"]["key"] == VIRAL);
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let to_firing = load_start.elapsed();
    let alerts_under_load = names(&prom.alerts());
    stop.store(true, Ordering::Relaxed);
    let (viral_ops, viral_errors) = viral.join().expect("viral load");
    let fired = fired.unwrap_or_else(|| {
        panic!(
            "{HOT_ALERT} for {VIRAL} not firing after {to_firing:?} ({viral_ops} ops sent); \
             states seen {states:?}; active {alerts_under_load:?}; /hotkeys {:?}",
            proxy.admin_get("/hotkeys").1
        )
    });
    assert_eq!(viral_errors, 0, "the viral load saw errors");
    assert_eq!(fired["labels"]["job"], JOB, "{fired}");
    assert_eq!(
        fired["labels"]["instance"],
        proxy.admin_addr().as_str(),
        "{fired}"
    );
    assert_eq!(fired["labels"]["severity"], "warning", "{fired}");
    let summary = fired["annotations"]["summary"].as_str().unwrap_or("");
    assert!(
        summary.contains(VIRAL),
        "summary does not name the key: {fired}"
    );
    // The value is the proxy's estimate of the key's writes/s: over the 2000/s threshold.
    let value: f64 = fired["value"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(value > 2_000.0, "alert value {value}: {fired}");
    eprintln!(
        "{HOT_ALERT} firing {to_firing:?} after the viral load began (states {states:?}, value {value:.0}); \
         active alerts: {alerts_under_load:?}"
    );

    // Without the load the key cools, its series leaves /metrics, and the alert resolves.
    let stopped = Instant::now();
    wait_for(
        "the hot-key alert resolves",
        Duration::from_secs(20),
        || hot_alert_state(&prom.alerts(), VIRAL, "write").is_none(),
    );
    eprintln!("resolved {:?} after the load stopped", stopped.elapsed());

    // No shipped rule failed to evaluate against real series.
    for r in prom.alerting_rules() {
        assert_ne!(
            r["health"], "err",
            "rule {} errs: {}",
            r["name"], r["lastError"]
        );
    }
    eprintln!("total {:?}", started.elapsed());
}

/// Rules for the combine and cache test: increments on `fallback:*` are combined from the
/// first one, reads of `cached:*` are cached from the first one.
const PINNED_RULES: &str = r#"version: 1
rules:
  - match: "fallback:*"
    pin: true
    write: { strategy: combine, combine: { window_us: 2000 } }
  - match: "cached:*"
    pin: true
    write: { strategy: off }
"#;

/// Every target expression of the shipped dashboard, with its title, and Grafana's variables
/// replaced by what selects everything.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/saltshaker.json");
    let d: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("read the dashboard"))
            .expect("dashboard JSON");
    let mut out = Vec::new();
    for p in d["panels"].as_array().into_iter().flatten() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_default();
            let expr = expr
                .replace("$__rate_interval", "1m")
                .replace("$job", ".*")
                .replace("$instance", ".*");
            out.push((p["title"].as_str().unwrap_or("?").to_string(), expr));
        }
    }
    out
}

/// The instant vector `expr` evaluates to now: (labels, value) pairs.
fn query(prom: &Prometheus, expr: &str) -> Vec<(Value, f64)> {
    let mut enc = String::new();
    for b in expr.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                enc.push(b as char)
            }
            _ => enc.push_str(&format!("%{b:02X}")),
        }
    }
    let data = prom.api(&format!("/api/v1/query?query={enc}"));
    assert_eq!(data["resultType"], "vector", "{expr}: {data}");
    data["result"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let v = r["value"][1].as_str().and_then(|v| v.parse().ok());
            (r["metric"].clone(), v.unwrap_or(f64::NAN))
        })
        .collect()
}

#[test]
fn prometheus_fires_the_combine_fallback_alert_and_keeps_a_healthy_cache_quiet() {
    let Some(_serial) = serial_with_prometheus() else {
        return;
    };
    let started = Instant::now();
    let (rules, _) = shortened_rules(&shipped_rules());

    let node = Redis::start();
    let dir = TempDir::new("prom-combine");
    let rules_path = dir.0.join("rules.yaml");
    std::fs::write(&rules_path, PINNED_RULES).expect("write rules");
    let proxy = Proxy::start(&[&node], &["--rules", &path_str(&rules_path)]);
    // A counter someone overwrote with text: every combined INCRBY on it fails.
    assert!(!node
        .client()
        .cmd(&["SET", "fallback:text", "not a number"])
        .is_error());
    assert!(!node.client().cmd(&["SET", "cached:page", "v1"]).is_error());
    let prom = Prometheus::start(&rules, &proxy.admin_addr());
    wait_target_up(&prom, &proxy);

    // Eight clients INCR the text key one command at a time, so their increments meet in
    // batches; two clients read the cached key in pipelines.
    let stop = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for _ in 0..8 {
        let (addr, stop) = (proxy.addr(), stop.clone());
        writers.push(std::thread::spawn(move || {
            let mut c = Client::connect(&addr);
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let r = c.cmd(&["INCR", "fallback:text"]);
                assert!(r.err().contains("not an integer"), "{r:?}");
                n += 1;
            }
            n
        }));
    }
    let mut readers = Vec::new();
    for _ in 0..2 {
        let (addr, stop) = (proxy.addr(), stop.clone());
        readers.push(std::thread::spawn(move || {
            let mut c = Client::connect(&addr);
            let gets = vec![["GET", "cached:page"]; 64];
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                for r in c.pipeline(&gets) {
                    assert_eq!(r.as_str(), "v1");
                    n += 1;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            n
        }));
    }

    let load_start = Instant::now();
    let mut states: Vec<String> = Vec::new();
    let mut fired = None;
    while load_start.elapsed() < Duration::from_secs(30) {
        let alerts = prom.alerts();
        let a = active(&alerts, FALLBACK_ALERT);
        if let Some(s) = a.and_then(|a| a["state"].as_str()) {
            if states.last().map(String::as_str) != Some(s) {
                states.push(s.to_string());
            }
        }
        // The cache serves the reads: its hit-ratio alert must not even be pending.
        assert!(
            active(&alerts, HIT_RATIO_ALERT).is_none(),
            "{HIT_RATIO_ALERT} on a healthy cache: {:?}",
            names(&alerts)
        );
        if a.is_some_and(|a| a["state"] == "firing") {
            fired = a.cloned();
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let to_firing = load_start.elapsed();
    let (_, metrics) = proxy.admin_get("/metrics");
    let fired = fired.unwrap_or_else(|| {
        panic!(
                "{FALLBACK_ALERT} not firing after {to_firing:?}; states seen {states:?}; \
             active {:?}; proxy counters:\n{}",
                names(&prom.alerts()),
                metrics
                    .lines()
                    .filter(|l| l.starts_with("saltshaker_combine")
                        || l.starts_with("saltshaker_cache"))
                    .collect::<Vec<_>>()
                    .join("\n")
            )
    });
    assert_eq!(fired["labels"]["job"], JOB, "{fired}");
    assert_eq!(
        fired["labels"]["instance"],
        proxy.admin_addr().as_str(),
        "{fired}"
    );
    assert_eq!(fired["labels"]["severity"], "warning", "{fired}");
    assert_eq!(
        fired["annotations"]["runbook"], "docs/operations.md#saltshakercombinefallbacks",
        "{fired}"
    );
    let value: f64 = fired["value"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(value > 1.0, "alert value {value}: {fired}");
    eprintln!(
        "{FALLBACK_ALERT} firing {to_firing:?} after the load began (states {states:?}, \
         value {value:.1} batches/s)"
    );

    // Every dashboard query evaluates on the real series; the cache and combine panels show
    // what the load did.
    let mut shown = Vec::new();
    for (title, expr) in dashboard_queries() {
        let result = query(&prom, &expr);
        if title == "Cache hit ratio" {
            let ratio = result.first().map(|r| r.1).unwrap_or(f64::NAN);
            assert!(ratio > 0.9, "{title} {ratio}: {expr}");
            shown.push(format!("{title} {ratio:.3}"));
        }
        if title == "Combine reduction factor" {
            // Every batch of two or more fell back: one failed INCRBY plus one write per
            // increment, so fewer increments than backend writes.
            let factor = result.first().map(|r| r.1).unwrap_or(f64::NAN);
            assert!(factor < 1.0, "{title} {factor}: {expr}");
            shown.push(format!("{title} {factor:.3}"));
        }
        if title == "Combine fallbacks" {
            let rate = result.first().map(|r| r.1).unwrap_or(0.0);
            assert!(rate > 1.0, "{title} {rate}: {expr}");
            shown.push(format!("{title} {rate:.0}/s"));
        }
    }
    assert_eq!(shown.len(), 3, "panels not found: {shown:?}");
    // The quiet hit-ratio alert meant something: its traffic floor (100 cached reads/s over
    // 5m) was met, so only the ratio kept it from firing.
    let cached_reads = query(&prom, "sum(rate(saltshaker_cache_hits_total[5m]))");
    let cached_reads = cached_reads.first().map(|r| r.1).unwrap_or(0.0);
    assert!(cached_reads > 100.0, "{cached_reads} cached reads/s");
    shown.push(format!("{cached_reads:.0} cache hits/s over 5m"));
    eprintln!("dashboard: {}", shown.join(", "));

    stop.store(true, Ordering::Relaxed);
    let incrs: u64 = writers.into_iter().map(|h| h.join().expect("writer")).sum();
    let gets: u64 = readers.into_iter().map(|h| h.join().expect("reader")).sum();
    eprintln!("{incrs} INCRs, {gets} GETs");
    assert!(incrs > 0 && gets > 0);

    // Every shipped rule has been evaluated against these series, without error.
    for r in prom.alerting_rules() {
        assert_eq!(
            r["health"], "ok",
            "rule {} is {}: {}",
            r["name"], r["health"], r["lastError"]
        );
    }
    eprintln!("total {:?}", started.elapsed());
}

#[test]
fn shortening_changes_only_for_lines() {
    let text =
        "  - alert: A\n    expr: x > 0\n    for: 10m\n    labels:\n      severity: warning\n\
                \x20   annotations:\n      summary: \"for: 10m here stays\"\n";
    let (out, n) = shortened_rules(text);
    assert_eq!(n, 1);
    assert!(out.contains("    for: 1s\n"), "{out}");
    assert!(out.contains("\"for: 10m here stays\""), "{out}");
}
