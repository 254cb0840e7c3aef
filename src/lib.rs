//! saltshaker: a transparent Redis/Valkey proxy that finds hot keys and takes the
//! pressure off them.
//!
//! The module map follows a request (parse, classify, observe, decide, act, reply):
//!
//! | module     | owns                                                                   |
//! |------------|------------------------------------------------------------------------|
//! | `resp`     | the wire: request parser, reply framer, value tree and encoders         |
//! | `command`  | the command table: key positions, read/write, routing class            |
//! | `hotkey`   | Count-Min sketch, top-k, windows, aggregation; knows nothing of Redis  |
//! | `rules`    | hot-key rules (YAML): thresholds, strategies, live reload              |
//! | `policy`   | decide(command, hot set, salt view) -> Action; pure, table-tested      |
//! | `mitigate` | combine (batched increments, exact replies); cache (read-hot replies); |
//! |            | balance (a busy node's hottest keys made read-hot)                     |
//! | `salt`     | salted keys: an engine that knows no kind, the kinds (counters, hashes |
//! |            | by field, sets, HLLs, zsets) behind one trait, ops, fold, coordinator; |
//! |            | idempotent increments (`idem`), the display tier's rollups (`rollup`)  |
//! | `backend`  | nodes, shared pipelined connections, placement, tracking invalidation, |
//! |            | Redis Cluster (slot map kept current, MOVED/ASK followed in the call)  |
//! | `proxy`    | listener, session (read, classify, decide, observe, act, reply)        |
//! | `admin`    | HTTP: /metrics /healthz /readyz /hotkeys /rules                        |
//! | `config`   | startup settings, units in names, located errors                       |
//! | `metrics`  | every Prometheus series the proxy exports                              |
//! | `upgrade`  | zero-downtime upgrade: listening sockets handed to the new process     |
//! | `loadgen`  | `saltshaker bench`: uniform, Zipf and viral-key load, per-node load    |
//! | `top`      | `saltshaker top`: the live terminal view of hot keys                   |
//!
//! Imports flow one way: `main -> lib -> proxy, admin, rules::reload`;
//! `proxy -> policy, mitigate, salt, backend, command, hotkey, rules, resp, metrics`;
//! `policy -> salt, command, hotkey, rules`; `salt -> mitigate, backend, hotkey, rules,
//! resp, metrics`; `mitigate -> backend, hotkey, rules, resp, metrics`;
//! `rules -> config, hotkey`; `config -> backend`; `backend -> resp, metrics`. The leaves (`resp`, `hotkey`,
//! `metrics`) import nothing of the crate; `command` imports only `resp::parse_i64`
//! (Redis's integer rule is part of the wire format, and one parser serves the whole
//! crate). Nothing imports `proxy` or `admin`. Inside `salt/` and `proxy/` the files form
//! layers (see their module docs). `tests/layout.rs` checks all of this, and that no file
//! of `src/` is over 600 lines. Every wait on a node goes through
//! `backend::ConnHandle::start`/`call` and `Call::wait`, with a deadline.

pub mod admin;
pub mod backend;
pub mod command;
pub mod config;
pub mod hotkey;
pub mod loadgen;
pub mod metrics;
pub mod mitigate;
pub mod policy;
pub mod proxy;
pub mod resp;
pub mod rules;
pub mod salt;
pub mod top;
pub mod upgrade;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// How long open client connections get to finish on shutdown.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs the proxy with a validated config until `shutdown` turns true (a signal, or a
/// successor that took over the listening sockets), then drains. With `upgrade`, the
/// listening sockets are taken from the process waiting at `cfg.upgrade_socket`.
pub async fn run(
    cfg: config::Config,
    shutdown: watch::Sender<bool>,
    upgrade: bool,
) -> Result<(), String> {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = metrics::Metrics::new(&mut registry);
    let limits = resp::Limits {
        max_bulk_len: cfg.limits.max_bulk_bytes,
        max_args: cfg.limits.max_args,
        max_inline_len: cfg.limits.max_inline_bytes,
    };
    let (listener, admin_listener, successor) = listeners(&cfg, upgrade).await?;
    // Replies may carry any value a node stores; cap them at Redis's own bulk limit.
    let backend = match &cfg.backend.cluster {
        Some(c) => {
            backend::Backend::connect_cluster(&cfg.backend, c, 512 * 1024 * 1024, &metrics).await?
        }
        None => backend::Backend::new(&cfg.backend, 512 * 1024 * 1024, &metrics)?,
    };
    let rules = match &cfg.rules {
        Some(p) => rules::Rules::load(p).map_err(|e| e.to_string())?,
        None => rules::Rules::default(),
    };
    let detector = hotkey::Detector::new(hotkey::DetectorConfig {
        window_ms: rules.window_ms(),
        top_k: rules.top_k(),
        read_hot_at_per_sec: rules.defaults().read.hot_at_per_sec,
        write_hot_at_per_sec: rules.defaults().write.hot_at_per_sec,
        read_cool_below_per_sec: rules.defaults().read.cool_below_per_sec,
        write_cool_below_per_sec: rules.defaults().write.cool_below_per_sec,
    });
    let rules = rules::RulesHandle::new(rules);
    let balance = Arc::new(mitigate::balance::Chosen::default());
    detector.set_key_thresholds(Some(Arc::new(RuleThresholds {
        rules: rules.clone(),
        balance: balance.clone(),
    })));
    metrics.rules_generation.set(rules.generation() as i64);
    match &cfg.rules {
        Some(p) => {
            rules::spawn_reloader(
                p.clone(),
                rules.clone(),
                metrics.rules_reloads_ok.clone(),
                metrics.rules_reloads_failed.clone(),
            );
        }
        None => ignore_sighup(),
    }
    let mut ctx = proxy::Ctx::new(
        backend,
        metrics.clone(),
        detector.clone(),
        limits,
        cfg.limits.max_pending_bytes,
        cfg.limits.max_clients,
        cfg.auth.password.clone(),
        shutdown.subscribe(),
        rules.clone(),
    );
    ctx.max_output = cfg.limits.max_output_bytes;
    if cfg.cache.enabled {
        ctx.cache = Some(proxy::CacheLayer::start(&ctx.backend, &cfg.cache, &metrics));
    }
    let ctx = Arc::new(ctx);
    proxy::spawn_hot_updater(ctx.clone());
    proxy::spawn_salt_coordinator(ctx.clone());
    proxy::spawn_balancer(ctx.clone(), balance.clone());
    {
        // Detector thresholds and the generation gauge follow the rules.
        let (mut gens, rules, detector, gauge) = (
            rules.subscribe(),
            rules.clone(),
            detector.clone(),
            metrics.rules_generation.clone(),
        );
        tokio::spawn(async move {
            while gens.changed().await.is_ok() {
                let r = rules.load();
                gauge.set(rules.generation() as i64);
                detector.set_thresholds(
                    hotkey::Threshold {
                        hot_at_per_sec: r.defaults().read.hot_at_per_sec,
                        cool_below_per_sec: r.defaults().read.cool_below_per_sec,
                    },
                    hotkey::Threshold {
                        hot_at_per_sec: r.defaults().write.hot_at_per_sec,
                        cool_below_per_sec: r.defaults().write.cool_below_per_sec,
                    },
                );
            }
        });
    }
    let ready_ctx = ctx.clone();
    let state = Arc::new(admin::AdminState {
        registry,
        metrics,
        detector,
        ready: Box::new(move || ready_ctx.backend.nodes().iter().any(|n| n.is_up())),
        rules: rules.clone(),
        views: cfg.hotkeys.clone(),
        salt: Some(ctx.clone() as Arc<dyn salt::Control>),
        balance: Some(balance.clone()),
    });
    if let Some(path) = &cfg.upgrade_socket {
        use std::os::fd::AsRawFd;
        let fds = [listener.as_raw_fd(), admin_listener.as_raw_fd()];
        let (path, tx) = (path.clone(), shutdown.clone());
        // A plain thread: it blocks in accept() until a successor comes, and must not keep
        // the runtime from shutting down.
        std::thread::spawn(move || match upgrade::hand_over(&path, &fds) {
            Ok(()) => {
                tracing::info!("upgrade: successor is serving; draining and exiting");
                let _ = tx.send(true);
            }
            Err(e) => {
                tracing::warn!(error = %e, path = %path.display(), "upgrade socket unavailable")
            }
        });
    }
    tokio::spawn(admin::serve(admin_listener, state, shutdown.subscribe()));
    if let Some(s) = successor {
        tokio::task::spawn_blocking(move || s.confirm())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("upgrade: could not confirm to the old process: {e}"))?;
        tracing::info!("upgrade: took over the listening sockets");
    }
    tracing::info!(listen = %cfg.listen, admin = %cfg.admin, nodes = cfg.backend.nodes.len(), "saltshaker serving");
    proxy::serve(listener, ctx, DRAIN_TIMEOUT).await;
    tracing::info!("saltshaker stopped");
    Ok(())
}

type Listeners = (
    tokio::net::TcpListener,
    tokio::net::TcpListener,
    Option<upgrade::Successor>,
);

/// Binds the listeners, or takes them over from the running process.
async fn listeners(cfg: &config::Config, upgrade: bool) -> Result<Listeners, String> {
    if upgrade {
        let path = cfg
            .upgrade_socket
            .clone()
            .ok_or("--upgrade needs --upgrade-socket PATH")?;
        let (fds, succ) = tokio::task::spawn_blocking(move || upgrade::receive(&path, 2))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("upgrade: {e}"))?;
        let mut it = fds.into_iter().map(|fd| {
            let l = std::net::TcpListener::from(fd);
            l.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(l)
        });
        let client = it
            .next()
            .ok_or("upgrade: no client socket")?
            .map_err(|e| e.to_string())?;
        let admin = it
            .next()
            .ok_or("upgrade: no admin socket")?
            .map_err(|e| e.to_string())?;
        return Ok((client, admin, Some(succ)));
    }
    let client = tokio::net::TcpListener::bind(cfg.listen_addr())
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", cfg.listen))?;
    let admin = admin::bind(cfg.admin_addr())
        .await
        .map_err(|e| format!("cannot listen on {} (admin): {e}", cfg.admin))?;
    Ok((client, admin, None))
}

/// Per-key detection thresholds: the rules in force, and `balance.min_reads_per_sec` for the
/// keys node balance chose (`mitigate::balance`).
struct RuleThresholds {
    rules: rules::RulesHandle,
    balance: Arc<mitigate::balance::Chosen>,
}

impl hotkey::KeyThresholds for RuleThresholds {
    fn thresholds(&self, key: &[u8], kind: hotkey::Kind) -> Option<hotkey::Threshold> {
        let r = self.rules.load().resolve(key);
        Some(match kind {
            hotkey::Kind::Read if r.read.cache.enabled => {
                let (hot, cool) =
                    self.balance
                        .apply(key, r.read.hot_at_per_sec, r.read.cool_below_per_sec);
                hotkey::Threshold {
                    hot_at_per_sec: hot,
                    cool_below_per_sec: cool,
                }
            }
            hotkey::Kind::Read => hotkey::Threshold {
                hot_at_per_sec: r.read.hot_at_per_sec,
                cool_below_per_sec: r.read.cool_below_per_sec,
            },
            hotkey::Kind::Write => hotkey::Threshold {
                hot_at_per_sec: r.write.hot_at_per_sec,
                cool_below_per_sec: r.write.cool_below_per_sec,
            },
        })
    }

    fn lowest_hot_at_per_sec(&self, kind: hotkey::Kind) -> f64 {
        let (r, w) = self.rules.load().min_hot_at();
        match kind {
            hotkey::Kind::Read => r.min(self.balance.lowest()),
            hotkey::Kind::Write => w,
        }
    }
}

/// Without a rules file, SIGHUP has nothing to reload; it must not kill the process.
fn ignore_sighup() {
    if let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                tracing::info!("SIGHUP: no rules file configured, nothing to reload");
            }
        });
    }
}
