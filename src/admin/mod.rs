//! Admin HTTP: `/metrics` (Prometheus text), `/healthz`, `/readyz`, `/hotkeys` and `/rules` (JSON),
//! and `POST /hotkeys/promote|demote?key=K` (see `salt`).
//!
//! It reads only what it is handed: the metric registry, the detector's snapshot and a
//! readiness probe. Bound to localhost unless configured otherwise.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;

mod salt;

use crate::hotkey::{Detector, HotSnapshot};
use crate::metrics::{HotKeyLabel, HotKindLabel, Metrics};

pub struct AdminState {
    pub registry: Registry,
    pub metrics: Metrics,
    pub detector: Detector,
    pub ready: Box<dyn Fn() -> bool + Send + Sync>,
    pub rules: crate::rules::RulesHandle,
    pub views: crate::config::HotkeysConfig,
    /// Promote/demote endpoints and the salted-key listing; None in unit tests.
    pub salt: Option<Arc<dyn crate::salt::Control>>,
    /// The keys node balance chose, to say why a key is read-hot; None in unit tests.
    pub balance: Option<Arc<crate::mitigate::balance::Chosen>>,
    /// The bearer token every path but /healthz and /readyz requires; None = open.
    pub token: Option<String>,
    /// Admission state, to mark keys sampled or refused lately; None in unit tests.
    pub admit: Option<Arc<crate::admit::Admission>>,
    /// Whether a hot key's mitigations pay, from the hot set in force; None in unit tests.
    #[allow(clippy::type_complexity)]
    pub pays: Option<Arc<dyn Fn(&[u8]) -> Pays + Send + Sync>>,
}

/// Whether a hot key's mitigations pay: what they saved its node and cost it over the
/// last window, and why one its rule asks for is declined.
#[derive(Clone, Copy, Debug, Default)]
pub struct Pays {
    /// The last window's figures, for a key some mitigation acted on.
    pub ledger: Option<crate::policy::Ledger>,
    /// Not cached: the share of its reads that were (measured) or would be fills.
    pub cache: Option<crate::policy::FillShare>,
    /// Not combined: the increments per node command its batches would carry.
    pub combine: Option<f64>,
    /// Not salted by `auto`: its reads per write.
    pub salt: Option<f64>,
}

impl AdminState {
    /// A key as the views show it: raw (lossy UTF-8), or hashed when configured.
    fn show(&self, key: &[u8]) -> String {
        crate::hotkey::shown(key, self.views.hash_names)
    }
}

/// Serves admin requests until shutdown.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AdminState>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let (stream, _) = tokio::select! {
            _ = shutdown.wait_for(|v| *v) => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(_) => continue,
            },
        };
        let state = state.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let state = state.clone();
                async move { Ok::<_, Infallible>(route(&state, req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Serves the probes while the proxy starts (its backend is not known yet): /healthz is
/// ok, /readyz and every other path answer 503 with `why`. Runs until dropped.
pub async fn serve_starting(listener: &TcpListener, why: watch::Receiver<String>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let why = why.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                let why = why.borrow().clone();
                async move {
                    Ok::<_, Infallible>(match req.uri().path() {
                        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
                        _ => text(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "text/plain",
                            format!("not ready: starting: {why}\n"),
                        ),
                    })
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// True when the request may see `path`: probes always, the rest with the token.
fn authorized(state: &AdminState, req: &Request<Incoming>) -> bool {
    let Some(token) = &state.token else {
        return true;
    };
    if matches!(req.uri().path(), "/healthz" | "/readyz") {
        return true;
    }
    let given = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or_default();
    // Every byte compared, so the time says nothing of where a guess went wrong.
    given.len() == token.len()
        && given
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |d, (a, b)| d | (a ^ b))
            == 0
}

async fn route(state: &AdminState, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if !authorized(state, &req) {
        state.metrics.security.admin_unauthorized.inc();
        let mut r = text(
            StatusCode::UNAUTHORIZED,
            "text/plain",
            "unauthorized: send Authorization: Bearer <admin token>\n".into(),
        );
        r.headers_mut().insert(
            hyper::header::WWW_AUTHENTICATE,
            hyper::header::HeaderValue::from_static("Bearer"),
        );
        return r;
    }
    if let Some(action) = req.uri().path().strip_prefix("/hotkeys/") {
        let (status, body) = salt::action(state, req.method(), action, req.uri().query()).await;
        return text(status, "application/json", body);
    }
    match req.uri().path() {
        "/metrics" => {
            refresh_hot_series(state, &state.detector.snapshot());
            state
                .metrics
                .rules_last_reload_failed
                .set(state.rules.last_reload_failed() as i64);
            let mut out = String::new();
            match prometheus_client::encoding::text::encode(&mut out, &state.registry) {
                Ok(()) => text(
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    out,
                ),
                Err(_) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "text/plain",
                    "encoding failed\n".into(),
                ),
            }
        }
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => {
            if (state.ready)() {
                text(StatusCode::OK, "text/plain", "ready\n".into())
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "no backend node is reachable\n".into(),
                )
            }
        }
        "/rules" => text(
            StatusCode::OK,
            "application/json",
            state.rules.load().to_json() + "\n",
        ),
        "/hotkeys" => text(
            StatusCode::OK,
            "application/json",
            hotkeys_json(state, &state.detector.snapshot()),
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /metrics /hotkeys /rules /healthz /readyz\n".into(),
        ),
    }
}

fn text(status: StatusCode, ctype: &str, body: String) -> Response<Full<Bytes>> {
    Response::builder()
        .status(status)
        .header("content-type", ctype)
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))
}

/// Rebuilds the per-key series from the snapshot: only keys hot now, at most 64.
fn refresh_hot_series(state: &AdminState, snap: &HotSnapshot) {
    use crate::hotkey::HotState;
    let m = &state.metrics;
    m.hot_key_rate.clear();
    m.hot_key_bytes.clear();
    m.hot_key_node_ms.clear();
    // Hot now, per kind: a key listed as cooling, or hot for another kind only, is not.
    let is_hot = |s: Option<HotState>| s == Some(HotState::Hot);
    type State = fn(&crate::hotkey::HotKey) -> Option<HotState>;
    let kinds: [(&str, State); 4] = [
        ("read", |k| k.read_state),
        ("write", |k| k.write_state),
        ("bytes", |k| k.bytes_state),
        ("node_time", |k| k.node_state),
    ];
    for (kind, state_of) in kinds {
        let n = snap.keys.iter().filter(|k| is_hot(state_of(k))).count() as i64;
        m.hot_keys.get_or_create(&HotKindLabel { kind }).set(n);
    }
    let hot = snap.keys.iter().filter(|k| k.state == HotState::Hot);
    for k in hot.take(state.views.max_key_series) {
        let key = state.show(&k.key);
        let label = crate::metrics::KeyLabel { key: key.clone() };
        if is_hot(k.bytes_state) {
            m.hot_key_bytes.get_or_create(&label).set(k.bytes_per_sec);
        }
        if is_hot(k.node_state) {
            m.hot_key_node_ms
                .get_or_create(&label)
                .set(k.node_ms_per_sec);
        }
        if is_hot(k.read_state) {
            m.hot_key_rate
                .get_or_create(&HotKeyLabel {
                    key: key.clone(),
                    kind: "read",
                })
                .set(k.reads_per_sec);
        }
        if is_hot(k.write_state) {
            m.hot_key_rate
                .get_or_create(&HotKeyLabel { key, kind: "write" })
                .set(k.writes_per_sec);
        }
    }
}

/// Why a key is listed as read-hot: `rules` (its rule's threshold, by rate or by cost) or
/// `balance` (chosen to take load off a node busier than the others); null when it is not
/// read-hot or cooling.
fn read_hot_by(state: &AdminState, k: &crate::hotkey::HotKey) -> Option<&'static str> {
    k.read_hot_state()?;
    if k.read_state.is_none() {
        return Some("rules");
    }
    let hot_at = state.rules.load().resolve(&k.key).read.hot_at_per_sec;
    let chosen = state.balance.as_ref().is_some_and(|b| b.contains(&k.key));
    Some(if chosen && k.reads_per_sec < hot_at {
        "balance"
    } else {
        "rules"
    })
}

/// `sampled` (its increments are counted 1 in N: its value is an estimate) or `limited`
/// (commands on it refused lately), for keys an admit rule acted on in the last 10 s.
fn admission_mark(state: &AdminState, key: &[u8]) -> Option<&'static str> {
    match state.admit.as_ref()?.marked(key)? {
        crate::admit::Marked::Sampled => Some("sampled"),
        crate::admit::Marked::Limited => Some("limited"),
    }
}

/// Where a write-hot key is on its way to mitigation: `detected` (its rule neither
/// combines nor salts it), `combining` (on this proxy, not salted), `salting` (a promotion
/// is announced and in force from `salting_from`; combined meanwhile), `salted`, or
/// `demoted` (writers back on the base key, the fold to follow). None for a key that is
/// not write-hot.
fn phase(
    state: &AdminState,
    table: Option<&crate::salt::SaltTable>,
    k: &crate::hotkey::HotKey,
    now_ms: u64,
) -> (Option<&'static str>, Option<u64>) {
    if let Some(e) = table.and_then(|t| t.get(&k.key)) {
        let from = e.rec.steps.first().map(|st| st.from_ms);
        return match (e.rec.demote_ms, e.rec.step_at(now_ms)) {
            (Some(_), _) => (Some("demoted"), None),
            (None, Some(_)) => (Some("salted"), from),
            (None, None) => (Some("salting"), from),
        };
    }
    if k.write_state.is_none() {
        return (None, None);
    }
    let strategy = state.rules.load().resolve(&k.key).write.strategy;
    match strategy {
        crate::rules::Strategy::Off => (Some("detected"), None),
        _ => (Some("combining"), None),
    }
}

/// What a key's mitigations saved its node and cost it over the last window.
fn ledger_json(l: crate::policy::Ledger) -> serde_json::Value {
    let mut out = serde_json::Map::new();
    if l.cached() {
        out.insert(
            "cache".into(),
            serde_json::json!({
                "saved": {
                    "commands": l.cache_hits,
                    "bytes": l.cache_hit_bytes,
                    "node_us": l.cache_saved_us,
                },
                "cost": {
                    "fills": l.cache_fills,
                    "invalidations": l.cache_invalidations,
                },
            }),
        );
    }
    if l.combined() {
        out.insert(
            "combine".into(),
            serde_json::json!({
                "saved": { "commands": l.increments.saturating_sub(l.combine_commands) },
                "cost": {
                    "commands": l.combine_commands,
                    "batches_of_one": l.batches_of_one,
                },
            }),
        );
    }
    serde_json::Value::Object(out)
}

fn hotkeys_json(state: &AdminState, snap: &HotSnapshot) -> String {
    let table = state.salt.as_ref().map(|c| c.table());
    let now = crate::salt::now_ms();
    let keys: Vec<serde_json::Value> = snap
        .keys
        .iter()
        .map(|k| {
            let declined = state.pays.as_ref().map(|f| f(&k.key)).unwrap_or_default();
            let (phase, salting_from) = match phase(state, table.as_deref(), k, now) {
                // Its rule combines, but combining it would not pay.
                (Some("combining"), f) if declined.combine.is_some() => (Some("detected"), f),
                other => other,
            };
            serde_json::json!({
                "phase": phase,
                "salting_from": salting_from,
                "key": state.show(&k.key),
                "reads_per_sec": k.reads_per_sec,
                "writes_per_sec": k.writes_per_sec,
                "bytes_per_sec": k.bytes_per_sec,
                "node_ms_per_sec": k.node_ms_per_sec,
                "hot_by": k.hot_by(),
                "share": k.share,
                "state": format!("{:?}", k.state).to_lowercase(),
                "since": k.since_unix_ms,
                "read_hot_by": read_hot_by(state, k),
                "admission": admission_mark(state, &k.key),
                "not_cached": declined.cache.map(|why| match why.measured {
                    true => format!("{:.0}% of its cached reads were fills in the last window", why.share * 100.0),
                    false => format!("writes would turn {:.0}% of its reads into cache fills", why.share * 100.0),
                }),
                "ledger": declined.ledger.map(ledger_json),
                "not_combined": declined.combine.map(|per| {
                    format!("batches would carry {per:.1} increments per node command (under 2)")
                }),
                "not_salted": declined.salt.map(|per| {
                    format!("read {per:.1}x per write: merged reads would cost the nodes more than salting takes off its node")
                }),
            })
        })
        .collect();
    let salted = state
        .salt
        .as_ref()
        .map(|c| salt::listing(state, &c.table()));
    let mut s = serde_json::json!({ "window_ms": snap.window_ms, "keys": keys, "salted": salted })
        .to_string();
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(hash_names: bool) -> AdminState {
        let mut registry = Registry::default();
        let metrics = Metrics::new(&mut registry);
        AdminState {
            registry,
            metrics,
            detector: Detector::new(Default::default()),
            ready: Box::new(|| true),
            rules: crate::rules::RulesHandle::new(Default::default()),
            views: crate::config::HotkeysConfig {
                hash_names,
                max_key_series: 1,
            },
            salt: None,
            balance: None,
            token: None,
            admit: None,
            pays: None,
        }
    }

    fn snap() -> HotSnapshot {
        let key = |k: &str, w: f64| crate::hotkey::HotKey {
            key: k.as_bytes().to_vec(),
            reads_per_sec: 0.0,
            writes_per_sec: w,
            share: 0.5,
            state: crate::hotkey::HotState::Hot,
            since_unix_ms: 1,
            read_state: None,
            write_state: Some(crate::hotkey::HotState::Hot),
            ..Default::default()
        };
        HotSnapshot {
            window_ms: 1000,
            keys: vec![key("user:alice@example.com", 9000.0), key("b", 10.0)],
            ..Default::default()
        }
    }

    #[test]
    fn hashed_names_never_show_the_key_and_series_are_capped() {
        let st = state(true);
        let json = hotkeys_json(&st, &snap());
        assert!(!json.contains("alice"), "{json}");
        assert!(json.contains("\"key\":\"h:"), "{json}");
        refresh_hot_series(&st, &snap());
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &st.registry).unwrap();
        assert!(!out.contains("alice"), "{out}");
        assert_eq!(
            out.matches("saltshaker_hot_key_rate{").count(),
            1,
            "capped at max_key_series: {out}"
        );
        assert!(
            out.contains("saltshaker_hot_keys{kind=\"write\"} 2"),
            "{out}"
        );
    }

    #[test]
    fn raw_names_by_default() {
        let st = state(false);
        assert!(hotkeys_json(&st, &snap()).contains("user:alice@example.com"));
    }
}
