//! What SREs deploy and watch stays true to the binary: every metric the alert rules and
//! dashboards name is one a live proxy exports, promtool accepts and passes the rules, the
//! dashboard is current Grafana JSON on a `${datasource}` variable, and the deploy files
//! parse and agree with the proxy's config (ports, probes, a config `saltshaker check` accepts).

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::Value as Json;
use serde_yaml_ng::Value as Yaml;
use support::{saltshaker, Proxy, Redis, TempDir};

/// Series the rules and dashboards may name before a running proxy shows them: each is
/// (exported name, the name it is registered under in src/metrics/). Accepted only while
/// metrics/ really registers it, so a renamed or dropped metric still fails here.
const LAZY: &[(&str, &str)] = &[
    ("saltshaker_rules_reloads_total", "rules_reloads"),
    ("saltshaker_rules_generation", "rules_generation"),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let p = root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// Identifiers starting with `saltshaker_`: a PromQL metric name is made of
/// `[A-Za-z0-9_:]`, so any other character ends one.
fn metric_names(text: &str) -> BTreeSet<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut out = BTreeSet::new();
    let mut start = None;
    for (i, c) in text.char_indices().chain([(text.len(), ' ')]) {
        match (ident(c), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                let tok = &text[s..i];
                if tok.starts_with("saltshaker_") {
                    out.insert(tok.to_string());
                }
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// Every sample name a scrape of `body` stores: counters as `<name>_total`, histograms as
/// `<name>_bucket`, `_sum`, `_count`, taken from the `# TYPE` lines (so a family with no
/// labelled series yet still counts) and from the sample lines.
fn exported(body: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let (Some(name), Some(kind)) = (it.next(), it.next()) else {
                continue;
            };
            match kind {
                "counter" => {
                    out.insert(format!("{name}_total"));
                }
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        out.insert(format!("{name}{suffix}"));
                    }
                }
                _ => {
                    out.insert(name.to_string());
                }
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            out.insert(line[..end].to_string());
        }
    }
    out
}

fn dashboards() -> Vec<PathBuf> {
    let dir = root().join("dashboards");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no dashboards/*.json");
    v
}

/// Waits until `/metrics` shows a sample line starting with `prefix`.
fn scrape_until(proxy: &Proxy, prefix: &str, wait: Duration, mut poke: impl FnMut()) -> String {
    let end = Instant::now() + wait;
    loop {
        let (status, body) = proxy.admin_get("/metrics");
        assert_eq!(status, 200, "GET /metrics: {body}");
        if body.lines().any(|l| l.starts_with(prefix)) || Instant::now() >= end {
            return body;
        }
        poke();
    }
}

#[test]
fn every_metric_in_alerts_and_dashboards_is_exported() {
    support::need_redis();
    let redis = Redis::start();
    let rules = root().join("rules/default.yaml");
    let proxy = Proxy::start(&[&redis], &["--rules", &support::path_str(&rules)]);
    let mut c = proxy.client();
    assert!(!c.cmd(&["SET", "ops:k", "1"]).is_error());
    assert!(!c.cmd(&["INCR", "ops:n"]).is_error());
    assert!(!c.cmd(&["GET", "ops:k"]).is_error());
    // A burst on one key, so the per-key series shows up too (best effort: the family's
    // TYPE line is enough for the name check).
    let burst: Vec<[&str; 2]> = vec![["GET", "ops:hot"]; 2000];
    let body = scrape_until(
        &proxy,
        "saltshaker_hot_key_rate{",
        Duration::from_secs(5),
        || {
            c.pipeline(&burst);
        },
    );
    if !body.contains("saltshaker_hot_key_rate{") {
        eprintln!(
            "note: no key turned hot within 5 s; saltshaker_hot_key_rate checked by its TYPE line"
        );
    }
    assert!(
        body.contains("saltshaker_backend_requests_total{node="),
        "{body}"
    );
    assert!(
        body.contains("saltshaker_requests_total{class=\"read\"}"),
        "{body}"
    );

    let live = exported(&body);
    // Prose (summaries, panel descriptions) may also cite a histogram by its family name.
    let mut cited = live.clone();
    cited.extend(
        live.iter()
            .filter_map(|n| n.strip_suffix("_bucket").map(String::from)),
    );

    // (file, text, names in it must be stored series: queries and test series).
    let alerts: Yaml = serde_yaml_ng::from_str(&read("rules/alerts.yaml")).expect("alerts.yaml");
    let tests: Yaml = serde_yaml_ng::from_str(&read("rules/alerts_test.yaml")).expect("test yaml");
    let mut sources = vec![
        (
            "rules/alerts.yaml".to_string(),
            read("rules/alerts.yaml"),
            false,
        ),
        (
            "rules/alerts.yaml exprs".to_string(),
            yaml_strings(&alerts, "expr"),
            true,
        ),
        (
            "rules/alerts_test.yaml".to_string(),
            read("rules/alerts_test.yaml"),
            false,
        ),
        (
            "rules/alerts_test.yaml series".to_string(),
            yaml_strings(&tests, "series"),
            true,
        ),
    ];
    for d in dashboards() {
        let text = std::fs::read_to_string(&d).expect("read dashboard");
        let rel = d.strip_prefix(root()).unwrap_or(&d).display().to_string();
        let json: Json = serde_json::from_str(&text).expect("dashboard json");
        let mut queries = String::new();
        for key in ["expr", "definition", "query"] {
            json_strings(&json, key, &mut queries);
        }
        sources.push((format!("{rel} queries"), queries, true));
        sources.push((rel, text, false));
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(root().join("src/metrics"))
        .expect("src/metrics")
        .map(|e| e.expect("entry").path())
        .collect();
    files.sort();
    let metrics_rs: String = files
        .iter()
        .map(|p| std::fs::read_to_string(p).expect("read metrics source"))
        .collect();
    let mut missing = Vec::new();
    for (file, text, query) in &sources {
        let names = metric_names(text);
        assert!(!names.is_empty(), "{file} names no saltshaker_ metric");
        let known = if *query { &live } else { &cited };
        for n in names {
            if known.contains(&n) {
                continue;
            }
            let lazy = LAZY.iter().find(|(name, _)| *name == n);
            match lazy {
                Some((_, registered)) if metrics_rs.contains(&format!("\"{registered}\"")) => {}
                Some((_, registered)) => missing.push(format!(
                    "{file}: {n} (not at /metrics, and src/metrics/ registers no \"{registered}\")"
                )),
                None => missing.push(format!("{file}: {n}")),
            }
        }
    }
    assert!(
        missing.is_empty(),
        "metrics named but not exported:\n  {}\nexported:\n  {}",
        missing.join("\n  "),
        live.into_iter().collect::<Vec<_>>().join("\n  ")
    );
}

/// Every string value under `key`, at any depth, one per line.
fn yaml_strings(v: &Yaml, key: &str) -> String {
    let mut out = String::new();
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        match v {
            Yaml::Mapping(m) => {
                for (k, val) in m {
                    match (k.as_str(), val.as_str()) {
                        (Some(k), Some(s)) if k == key => {
                            out.push_str(s);
                            out.push('\n');
                        }
                        _ => stack.push(val),
                    }
                }
            }
            Yaml::Sequence(s) => stack.extend(s),
            _ => {}
        }
    }
    out
}

fn json_strings(v: &Json, key: &str, out: &mut String) {
    match v {
        Json::Object(m) => {
            for (k, val) in m {
                match val.as_str() {
                    Some(s) if k == key => {
                        out.push_str(s);
                        out.push('\n');
                    }
                    _ => json_strings(val, key, out),
                }
            }
        }
        Json::Array(a) => a.iter().for_each(|x| json_strings(x, key, out)),
        _ => {}
    }
}

#[test]
fn promtool_checks_and_unit_tests_the_alert_rules() {
    support::need_tool("promtool");
    for args in [
        &["check", "rules", "alerts.yaml"][..],
        &["test", "rules", "alerts_test.yaml"][..],
    ] {
        let out = Command::new("promtool")
            .args(args)
            .current_dir(root().join("rules"))
            .output()
            .expect("run promtool");
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// The anchor GitHub gives a Markdown heading: lower case, spaces to dashes, and
/// punctuation other than `-` and `_` dropped.
fn heading_anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn runbook_annotations_point_at_sections_of_the_operations_doc() {
    let alerts: Yaml = serde_yaml_ng::from_str(&read("rules/alerts.yaml")).expect("alerts.yaml");
    let doc = read("docs/operations.md");
    let anchors: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|l| heading_anchor(l.trim_start_matches('#')))
        .collect();
    let rules = alerts["groups"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default());
    let mut with_runbook = 0;
    for r in rules {
        let name = r["alert"].as_str().unwrap_or("?").to_string();
        let expr = r["expr"].as_str().unwrap_or("");
        let runbook = r["annotations"]["runbook"].as_str();
        // The cache, combine and salt alerts carry one; any alert that has one must resolve.
        if expr.contains("saltshaker_cache_")
            || expr.contains("saltshaker_combine")
            || expr.contains("saltshaker_salt")
        {
            assert!(runbook.is_some(), "{name} has no runbook annotation");
        }
        let Some(runbook) = runbook else { continue };
        let (file, anchor) = runbook
            .split_once('#')
            .unwrap_or_else(|| panic!("{name}: runbook {runbook:?} names no section"));
        assert_eq!(file, "docs/operations.md", "{name}: runbook {runbook:?}");
        assert!(
            anchors.contains(anchor),
            "{name}: runbook {runbook:?}: no such heading in docs/operations.md"
        );
        assert_eq!(
            anchor,
            name.to_lowercase(),
            "{name}: the runbook section is named after the alert"
        );
        with_runbook += 1;
    }
    assert!(with_runbook >= 8, "{with_runbook} alerts have a runbook");
}

fn panels(d: &Json) -> Vec<&Json> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().into_iter().flatten() {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

#[test]
fn dashboards_are_current_grafana_json_on_a_datasource_variable() {
    for path in dashboards() {
        let name = path.display().to_string();
        let d: Json = serde_json::from_str(&std::fs::read_to_string(&path).expect("read"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(
            d["schemaVersion"].as_u64().unwrap_or(0) >= 39,
            "{name}: schemaVersion"
        );
        assert!(d["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty() && u.len() <= 40));
        let vars = d["templating"]["list"].as_array().expect("templating.list");
        let var = |n: &str| vars.iter().find(|v| v["name"] == n);
        let ds = var("datasource").unwrap_or_else(|| panic!("{name}: no datasource variable"));
        assert_eq!(
            (&ds["type"], &ds["query"]),
            (&"datasource".into(), &"prometheus".into())
        );
        for v in ["job", "instance"] {
            assert!(var(v).is_some(), "{name}: no {v} variable");
        }
        let mut ids = BTreeSet::new();
        let mut boxes: Vec<(u64, u64, u64, u64, String)> = Vec::new();
        for p in panels(&d) {
            let title = p["title"].as_str().unwrap_or("?").to_string();
            assert!(
                ids.insert(p["id"].as_u64().expect("panel id")),
                "{name}: id of {title}"
            );
            let g = &p["gridPos"];
            let b = [&g["x"], &g["y"], &g["w"], &g["h"]].map(|v| v.as_u64().expect("gridPos"));
            assert!(b[0] + b[2] <= 24, "{name}: {title} is wider than the grid");
            for o in &boxes {
                let apart = b[0] + b[2] <= o.0
                    || o.0 + o.2 <= b[0]
                    || b[1] + b[3] <= o.1
                    || o.1 + o.3 <= b[1];
                assert!(apart, "{name}: {title} overlaps {}", o.4);
            }
            boxes.push((b[0], b[1], b[2], b[3], title.clone()));
            if p["type"] == "row" {
                continue;
            }
            assert_eq!(p["datasource"]["uid"], "${datasource}", "{name}: {title}");
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{name}: {title} has no query");
            for t in targets {
                assert_eq!(t["datasource"]["uid"], "${datasource}", "{name}: {title}");
                let expr = t["expr"].as_str().unwrap_or("");
                // Every query names a saltshaker series (which
                // every_metric_in_alerts_and_dashboards_is_exported checks against /metrics).
                assert!(
                    !metric_names(expr).is_empty(),
                    "{name}: {title}: no saltshaker_ metric in {expr}"
                );
                assert!(
                    expr.contains("instance=~\"$instance\""),
                    "{name}: {title}: {expr}"
                );
            }
        }
    }
}

/// Every document of every YAML file under deploy/, parsed.
fn deploy_docs() -> Vec<(PathBuf, Yaml)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).expect("read deploy dir").flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(&root().join("deploy"), &mut files);
    files.sort();
    let mut docs = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read yaml");
        for doc in serde_yaml_ng::Deserializer::from_str(&text) {
            let v = Yaml::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            docs.push((f.clone(), v));
        }
    }
    docs
}

fn kind<'a>(docs: &'a [(PathBuf, Yaml)], k: &str) -> &'a Yaml {
    docs.iter()
        .map(|(_, d)| d)
        .find(|d| d["kind"] == k)
        .unwrap_or_else(|| panic!("no {k} under deploy/kubernetes"))
}

#[test]
fn deploy_files_parse_and_agree_with_the_proxy() {
    let docs = deploy_docs();
    assert!(docs.len() >= 6, "deploy/ has {} YAML documents", docs.len());
    // The sample config names `rules.yaml` beside it, as installed: check it so, with the
    // default rules.
    let sample = TempDir::new("ops-sample");
    let sample_cfg = sample.0.join("saltshaker.yaml");
    std::fs::write(&sample_cfg, read("deploy/saltshaker.prod.yaml")).expect("write");
    std::fs::write(sample.0.join("rules.yaml"), read("rules/default.yaml")).expect("write");
    let out = saltshaker(&["check", &support::path_str(&sample_cfg)]);
    assert!(
        out.status.success(),
        "deploy/saltshaker.prod.yaml: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // The ConfigMap's files are what a pod runs: the config must pass `saltshaker check`
    // and a proxy must start with the rules.
    let data = &kind(&docs, "ConfigMap")["data"];
    let dir = TempDir::new("ops-configmap");
    let (cfg_text, rules_text) = (
        data["saltshaker.yaml"].as_str().expect("saltshaker.yaml"),
        data["rules.yaml"].as_str().expect("rules.yaml"),
    );
    let (cfg_path, rules_path) = (dir.0.join("saltshaker.yaml"), dir.0.join("rules.yaml"));
    std::fs::write(&cfg_path, cfg_text).expect("write");
    std::fs::write(&rules_path, rules_text).expect("write");
    let out = saltshaker(&["check", &support::path_str(&cfg_path)]);
    assert!(
        out.status.success(),
        "ConfigMap saltshaker.yaml: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The TLS overlay's config passes too, and turns TLS on both sides on.
    let tls_cfg = docs
        .iter()
        .find(|(f, d)| f.ends_with("kubernetes/tls/configmap-tls.yaml") && d["kind"] == "ConfigMap")
        .map(|(_, d)| {
            d["data"]["saltshaker.yaml"]
                .as_str()
                .expect("tls saltshaker.yaml")
        })
        .expect("deploy/kubernetes/tls/configmap-tls.yaml");
    std::fs::write(&cfg_path, tls_cfg).expect("write");
    let out = saltshaker(&["check", &support::path_str(&cfg_path)]);
    assert!(
        out.status.success(),
        "TLS overlay saltshaker.yaml: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let t: Yaml = serde_yaml_ng::from_str(tls_cfg).expect("tls config yaml");
    assert!(t["tls"]["cert"].as_str().is_some() && t["backend"]["tls"]["ca"].as_str().is_some());
    std::fs::write(&cfg_path, cfg_text).expect("write");
    let cfg: Yaml = serde_yaml_ng::from_str(cfg_text).expect("config yaml");
    assert_eq!(
        cfg["rules"], "rules.yaml",
        "the rules.yaml mounted beside it"
    );
    let admin_port: u64 = cfg["admin"]
        .as_str()
        .and_then(|a| a.rsplit(':').next()?.parse().ok())
        .expect("admin port");
    support::need_redis();
    {
        let redis = Redis::start();
        let proxy = Proxy::start(&[&redis], &["--rules", &support::path_str(&rules_path)]);
        assert_eq!(proxy.admin_get("/healthz").0, 200);
    }

    // The Deployment probes and scrapes the admin port the config opens.
    let dep = kind(&docs, "Deployment");
    let pod = &dep["spec"]["template"];
    let ann = &pod["metadata"]["annotations"];
    assert_eq!(ann["prometheus.io/scrape"], "true");
    assert_eq!(
        ann["prometheus.io/port"]
            .as_str()
            .and_then(|p| p.parse().ok()),
        Some(admin_port)
    );
    let c = &pod["spec"]["containers"][0];
    let port = |name: &str| {
        c["ports"]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
    };
    assert_eq!(port("admin"), Some(admin_port));
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(c[probe]["httpGet"]["port"], "admin", "{probe}");
    }
    let mount = &c["volumeMounts"][0];
    assert_eq!(mount["mountPath"], "/etc/saltshaker");
    assert!(
        mount.get("subPath").is_none(),
        "a subPath mount never sees ConfigMap updates"
    );
    assert_eq!(
        kind(&docs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["port"],
        "admin"
    );

    let unit = read("deploy/systemd/saltshaker.service");
    assert!(
        unit.contains("ExecReload=/bin/kill -HUP $MAINPID"),
        "rules reload on systemctl reload"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_finds_names_inside_promql_and_json() {
        let n = metric_names(
            "sum by (le) (rate(saltshaker_request_duration_seconds_bucket{job=~\"$job\"}[5m]))\n\
             \"expr\": \"max(saltshaker_hot_key_rate)/2\", up, saltshaker check, xsaltshaker_no",
        );
        let want = [
            "saltshaker_hot_key_rate",
            "saltshaker_request_duration_seconds_bucket",
        ];
        assert_eq!(n.into_iter().collect::<Vec<_>>(), want);
    }

    #[test]
    fn heading_anchors_follow_github() {
        assert_eq!(
            heading_anchor(" SaltshakerCacheFlushing"),
            "saltshakercacheflushing"
        );
        assert_eq!(
            heading_anchor("Cache and combine counters"),
            "cache-and-combine-counters"
        );
        assert_eq!(
            heading_anchor("`max_clients`: a metric?"),
            "max_clients-a-metric"
        );
    }

    #[test]
    fn exported_names_follow_openmetrics_suffixes() {
        let e = exported(
            "# TYPE saltshaker_requests counter\nsaltshaker_requests_total{class=\"read\"} 1\n\
             # TYPE saltshaker_request_duration_seconds histogram\n\
             # TYPE saltshaker_hot_key_rate gauge\n# EOF\n",
        );
        for n in [
            "saltshaker_requests_total",
            "saltshaker_request_duration_seconds_bucket",
            "saltshaker_request_duration_seconds_count",
            "saltshaker_hot_key_rate",
        ] {
            assert!(e.contains(n), "{n}");
        }
        assert!(!e.contains("saltshaker_requests"));
    }
}
