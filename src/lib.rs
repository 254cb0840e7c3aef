//! saltshaker: a transparent Redis/Valkey proxy that finds hot keys and takes the
//! pressure off them.
//!
//! The module map follows a request (parse, classify, observe, decide, act, reply):
//!
//! | module     | owns                                                                  |
//! |------------|-----------------------------------------------------------------------|
//! | `resp`     | the wire: request parser, reply framer, value encoder (RESP2/RESP3)    |
//! | `command`  | the command table: key positions, read/write, routing class           |
//! | `hotkey`   | Count-Min sketch, top-k, windows, aggregation; knows nothing of Redis |
//! | `backend`  | nodes, shared pipelined connections, placement (single, ketama)       |
//! | `proxy`    | listener, session (read, classify, observe, decide, act, reply)       |
//! | `admin`    | HTTP: /metrics /healthz /readyz /hotkeys                              |
//! | `config`   | startup settings, units in names, strict validation                   |
//! | `metrics`  | every Prometheus series the proxy exports                             |
//!
//! Imports flow one way: `proxy -> resp, command, hotkey, backend, metrics`;
//! leaves (`resp`, `command`, `hotkey`, `config`, `metrics`) import nothing of the crate
//! except `command -> resp`-free helpers.

pub mod admin;
pub mod backend;
pub mod command;
pub mod config;
pub mod hotkey;
pub mod metrics;
pub mod proxy;
pub mod resp;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// How long open client connections get to finish on shutdown.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the proxy with a validated config until `shutdown` turns true, then drains.
pub async fn run(cfg: config::Config, shutdown: watch::Receiver<bool>) -> Result<(), String> {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = metrics::Metrics::new(&mut registry);
    let limits = resp::Limits {
        max_bulk_len: cfg.limits.max_bulk_bytes,
        max_args: cfg.limits.max_args,
        max_inline_len: cfg.limits.max_inline_bytes,
    };
    // Replies may carry any value a node stores; cap them at Redis's own bulk limit.
    let backend = backend::Backend::new(&cfg.backend, 512 * 1024 * 1024, &metrics)?;
    let detector = hotkey::Detector::new(hotkey::DetectorConfig::default());
    let listener = tokio::net::TcpListener::bind(cfg.listen_addr())
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", cfg.listen))?;
    let admin_listener =
        admin::bind(cfg.admin_addr()).await.map_err(|e| format!("cannot listen on {} (admin): {e}", cfg.admin))?;
    let ctx = Arc::new(proxy::Ctx::new(
        backend,
        metrics.clone(),
        detector.clone(),
        limits,
        cfg.limits.max_pending_bytes,
        cfg.limits.max_clients,
        cfg.auth.password.clone(),
        shutdown.clone(),
    ));
    let ready_ctx = ctx.clone();
    let state = Arc::new(admin::AdminState {
        registry,
        metrics,
        detector,
        ready: Box::new(move || ready_ctx.backend.nodes().iter().any(|n| n.is_up())),
    });
    tokio::spawn(admin::serve(admin_listener, state, shutdown.clone()));
    tracing::info!(listen = %cfg.listen, admin = %cfg.admin, nodes = cfg.backend.nodes.len(), "saltshaker serving");
    proxy::serve(listener, ctx, DRAIN_TIMEOUT).await;
    tracing::info!("saltshaker stopped");
    Ok(())
}
