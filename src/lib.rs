//! saltshaker: a transparent Redis/Valkey proxy that finds hot keys and takes the
//! pressure off them.
//!
//! The module map follows a request (parse, classify, admit, decide, observe, act, reply):
//!
//! | module     | owns                                                                   |
//! |------------|------------------------------------------------------------------------|
//! | `resp`     | the wire: request parser, reply framer, value tree and encoders         |
//! | `command`  | the command table, and the typed command made once per request: key   |
//! |            | positions, access class, ACL categories, route, a counter's delta;     |
//! |            | `Cmd`, each command by name (no name is compared as a string outside)  |
//! |            | the commands learned from the nodes (`COMMAND INFO`) beside it         |
//! | `hotkey`   | Count-Min sketch, top-k, windows, aggregation, per kind: reads, writes |
//! |            | and what reads cost (bytes, node time); knows nothing of Redis         |
//! | `rules`    | hot-key rules (YAML): thresholds, strategies, live reload              |
//! | `glob`     | Redis's glob patterns (rules, users' keys)                             |
//! | `auth`     | users: hashed passwords, key and channel patterns, ACL rules (NOPERM), |
//! |            | changed live by ACL SETUSER; ACL LOG                                    |
//! | `admit`    | admission: per-key token buckets, sampling, delay, shedding, global    |
//! |            | limits shared through the registry; the fleet simulator               |
//! | `policy`   | decide(command, hot set, salt view) -> Action; pure, table-tested; the |
//! |            | hot set, and whether a cache or combining pays (`hot`)                 |
//! | `mitigate` | combine (batched increments, exact replies); cache (read-hot replies,  |
//! |            | evicted by node time saved per byte); balance (a busy node's hottest   |
//! |            | keys made read-hot)                                                    |
//! | `salt`     | salted keys: an engine that knows no kind, the kinds (counters, hashes |
//! |            | by field, sets, HLLs, zsets) behind one trait, ops, fold, relocate     |
//! |            | (a shard off a shared master), coordinator; idempotent increments      |
//! |            | (`idem`), the display tier's rollups (`rollup`)                        |
//! | `backend`  | nodes, shared pipelined connections (every worker's writes gathered:   |
//! |            | `wire`), where keys live (`Keyspace`: one node, a pool's placement, a  |
//! |            | Redis Cluster), tracking invalidation,                                 |
//! |            | Redis Cluster (slot map kept current, MOVED/ASK followed in the call)  |
//! | `net`      | streams plain or TLS behind one type; client and node TLS (rustls)     |
//! | `proxy`    | listener and worker threads; five rooms along a request's route:      |
//! |            | `session` (read, classify, check, admit, order, decide, observe, act), |
//! |            | `answer` (answered here), `act` (to the nodes), `conn` (a connection's |
//! |            | state, its rounds and reply writer), `registry` (process-wide)         |
//! | `admin`    | HTTP: /metrics /healthz /readyz /hotkeys /rules                        |
//! | `config`   | startup settings, units in names, located errors                       |
//! | `metrics`  | every Prometheus series the proxy exports                              |
//! | `upgrade`  | zero-downtime upgrade: listening sockets handed to the new process     |
//! | `loadgen`  | `saltshaker bench`: uniform, Zipf and viral-key load, per-node load    |
//! | `top`      | `saltshaker top`: the live terminal view of hot keys                   |
//!
//! Imports flow one way: `main -> lib -> proxy, admin, rules::reload`;
//! `proxy -> admit, policy, mitigate, salt, backend, auth, net, command, hotkey, rules,
//! resp, metrics`; `admit -> salt, backend, rules, resp, metrics`;
//! `policy -> salt, command, hotkey, rules`; `salt -> mitigate, backend, command, hotkey, rules,
//! resp, metrics`; `mitigate -> backend, hotkey, rules, resp, metrics`;
//! `rules -> config, hotkey, glob`; `config -> backend, auth, net`; `auth -> command, glob`;
//! `backend -> net, resp, metrics`. The leaves (`resp`, `hotkey`, `metrics`, `net`, `glob`)
//! import nothing of the crate; `command` imports only `resp::parse_i64`
//! (Redis's integer rule is part of the wire format, and one parser serves the whole
//! crate). Nothing imports `proxy` or `admin`. Inside `salt/` and `proxy/` the files form
//! layers, and `proxy/`'s rooms stand on each other one way (see their module docs). `tests/layout.rs` checks all of this, that no file
//! of `src/` is over 600 lines, and that no code outside `salt/kinds/` names a salt kind. Every wait on a node goes through
//! `backend::ConnHandle::start`/`call` and `Call::wait`, with a deadline.

pub mod admin;
pub mod admit;
pub mod auth;
pub mod backend;
pub mod command;
pub mod config;
pub mod glob;
pub mod hotkey;
pub mod loadgen;
pub mod metrics;
pub mod mitigate;
pub mod net;
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
    let tls = match &cfg.tls {
        Some(t) => Some(net::tls::ServerTls::load(t).map_err(|e| format!("tls: {e}"))?),
        None => None,
    };
    let bound = listeners(&cfg, upgrade).await?;
    let threads = match cfg.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    // Before any node connection opens: each keeps a relay per worker thread.
    backend::set_workers(threads);
    let (admin_listener, successor) = (bound.admin, bound.successor);
    // Replies may carry any value a node stores; cap them at Redis's own bulk limit.
    let backend = match &cfg.backend.cluster {
        Some(c) => {
            // Until a seed gives the map, the admin port answers /healthz and says in
            // /readyz why the proxy is not ready, and a signal ends the process.
            let (why_tx, why) = watch::channel("reading the Redis Cluster map".to_string());
            let mut stop = shutdown.subscribe();
            tokio::select! {
                b = backend::Backend::connect_cluster(&cfg.backend, c, 512 * 1024 * 1024, &metrics, &why_tx) => b.map_err(|e| e.to_string())?,
                _ = admin::serve_starting(&admin_listener, why) => unreachable!("serves until dropped"),
                _ = stop.wait_for(|v| *v) => {
                    tracing::info!("shutdown before the Redis Cluster map was read");
                    return Ok(());
                }
            }
        }
        None => backend::Backend::new(&cfg.backend, 512 * 1024 * 1024, &metrics)
            .map_err(|e| e.to_string())?,
    };
    let rules = match &cfg.rules {
        Some(p) => rules::Rules::load(p).map_err(|e| e.to_string())?,
        None => rules::Rules::default(),
    };
    let detector = hotkey::Detector::new(hotkey::DetectorConfig {
        window_ms: rules.window_ms(),
        top_k: rules.top_k(),
        ..hotkey::DetectorConfig::default()
    });
    let d = rules.defaults();
    detector.set_thresholds(detector_thresholds(&d.read, &d.write));
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
        Arc::new(auth::Users::new(&cfg.auth).map_err(|(f, e)| format!("{f}: {e}"))?),
        shutdown.subscribe(),
        rules.clone(),
    );
    ctx.max_output = cfg.limits.max_output_bytes;
    ctx.set_tracking_max_keys(cfg.limits.tracking_max_keys);
    if cfg.cache.enabled {
        ctx.cache = Some(proxy::CacheLayer::start(&ctx.backend, &cfg.cache, &metrics));
    }
    let ctx = Arc::new(ctx);
    let wait = std::time::Duration::from_millis(cfg.backend.connect_timeout_ms.min(500));
    proxy::learn_node_version(ctx.clone(), wait).await;
    ctx.salt
        .hash_names
        .store(cfg.hotkeys.hash_names, std::sync::atomic::Ordering::Relaxed);
    proxy::spawn_hot_updater(ctx.clone(), cfg.hotkeys.hash_names);
    proxy::spawn_memory_trim(ctx.clone());
    proxy::spawn_salt_coordinator(ctx.clone());
    proxy::spawn_admission_sync(ctx.clone());
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
                let d = r.defaults();
                detector.set_thresholds(detector_thresholds(&d.read, &d.write));
            }
        });
    }
    let token = match &cfg.admin_token_file {
        Some(p) => Some(read_token(p)?),
        None => None,
    };
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
        admit: Some(ctx.admit.clone()),
        pays: Some({
            let ctx = ctx.clone();
            Arc::new(move |k: &[u8]| {
                let hot = ctx.hot.load();
                admin::Pays {
                    ledger: hot.ledger(k),
                    cache: hot.not_cached(k),
                    combine: hot.not_combined(k),
                    salt: ctx.salt.not_salted(k),
                }
            })
        }),
        token,
    });
    if let Some(path) = &cfg.upgrade_socket {
        use std::os::fd::AsRawFd;
        let mut fds = vec![bound.client.as_raw_fd(), admin_listener.as_raw_fd()];
        fds.extend(bound.tls.as_ref().map(|l| l.as_raw_fd()));
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
    let mut serving = Vec::new();
    if let Some(t) = &tls {
        let s = &ctx.metrics.security;
        t.spawn_reloader(
            s.tls_reloads
                .get_or_create(&metrics::ResultLabel { result: "ok" })
                .clone(),
            s.tls_reloads
                .get_or_create(&metrics::ResultLabel { result: "failed" })
                .clone(),
            s.tls_last_reload_failed.clone(),
        );
    }
    match bound.tls {
        // TLS on a port of its own; `listen` stays plain.
        Some(l) => {
            serving.push(proxy::Listener {
                tcp: bound.client,
                tls: None,
            });
            serving.push(proxy::Listener { tcp: l, tls });
        }
        None => serving.push(proxy::Listener {
            tcp: bound.client,
            tls,
        }),
    }
    tracing::info!(
        listen = %cfg.listen,
        tls = cfg.tls.as_ref().map(|t| t.listen.clone().unwrap_or_else(|| cfg.listen.clone())).unwrap_or_default(),
        admin = %cfg.admin,
        nodes = cfg.backend.nodes.len(),
        "saltshaker serving"
    );
    if !ctx
        .salt
        .first_sync(std::time::Duration::from_millis(500))
        .await
    {
        tracing::warn!("the salt registry was not read at start: serving anyway; reads of a salted key may miss its shards until it is");
    }
    proxy::serve(serving, ctx, threads, DRAIN_TIMEOUT).await;
    tracing::info!("saltshaker stopped");
    Ok(())
}

/// The listening sockets: clients, admin, and a TLS port of its own when `tls.listen` is set.
struct Bound {
    client: tokio::net::TcpListener,
    admin: tokio::net::TcpListener,
    tls: Option<tokio::net::TcpListener>,
    successor: Option<upgrade::Successor>,
}

/// Binds the listeners, or takes them over from the running process.
async fn listeners(cfg: &config::Config, upgrade: bool) -> Result<Bound, String> {
    let tls_listen = cfg.tls.as_ref().and_then(|t| t.listen.clone());
    if upgrade {
        let path = cfg
            .upgrade_socket
            .clone()
            .ok_or("--upgrade needs --upgrade-socket PATH")?;
        let want = 2 + tls_listen.is_some() as usize;
        let (fds, succ) = tokio::task::spawn_blocking(move || upgrade::receive(&path, want))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("upgrade: {e}"))?;
        let mut it = fds.into_iter().map(|fd| {
            let l = std::net::TcpListener::from(fd);
            l.set_nonblocking(true)?;
            tokio::net::TcpListener::from_std(l)
        });
        let mut take = |what: &str| {
            it.next()
                .ok_or(format!("upgrade: no {what} socket"))?
                .map_err(|e| e.to_string())
        };
        let client = take("client")?;
        let admin = take("admin")?;
        let tls = match tls_listen {
            Some(_) => Some(take("TLS")?),
            None => None,
        };
        return Ok(Bound {
            client,
            admin,
            tls,
            successor: Some(succ),
        });
    }
    let client = tokio::net::TcpListener::bind(cfg.listen_addr())
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", cfg.listen))?;
    let admin = admin::bind(cfg.admin_addr())
        .await
        .map_err(|e| format!("cannot listen on {} (admin): {e}", cfg.admin))?;
    let tls = match &tls_listen {
        Some(a) => Some(
            tokio::net::TcpListener::bind(a)
                .await
                .map_err(|e| format!("cannot listen on {a} (TLS): {e}"))?,
        ),
        None => None,
    };
    Ok(Bound {
        client,
        admin,
        tls,
        successor: None,
    })
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
            kind => detector_thresholds(&r.read, &r.write)[kind as usize],
        })
    }

    fn lowest_hot_at_per_sec(&self, kind: hotkey::Kind) -> f64 {
        let rules = self.rules.load();
        let (r, w) = rules.min_hot_at();
        let (bytes, node_ms) = rules.min_cost_hot_at();
        match kind {
            hotkey::Kind::Read => r.min(self.balance.lowest()),
            hotkey::Kind::Write => w,
            hotkey::Kind::Bytes => bytes,
            hotkey::Kind::NodeUs => node_ms * 1000.0,
        }
    }
}

/// A key's (or the defaults') thresholds for the detector, indexed by `hotkey::Kind`
/// (`Bytes` in bytes, `NodeUs` in node microseconds per second: the rules give node ms).
fn detector_thresholds(
    r: &rules::ReadPolicy,
    w: &rules::WritePolicy,
) -> [hotkey::Threshold; hotkey::KINDS] {
    let t = |hot_at_per_sec, cool_below_per_sec| hotkey::Threshold {
        hot_at_per_sec,
        cool_below_per_sec,
    };
    [
        t(r.hot_at_per_sec, r.cool_below_per_sec),
        t(w.hot_at_per_sec, w.cool_below_per_sec),
        t(r.hot_at_bytes_per_sec, r.cool_below_bytes_per_sec),
        t(
            r.hot_at_node_ms_per_sec * 1000.0,
            r.cool_below_node_ms_per_sec * 1000.0,
        ),
    ]
}

/// The admin token from its file: the first line, trimmed; an empty one is refused.
fn read_token(p: &std::path::Path) -> Result<String, String> {
    let t =
        std::fs::read_to_string(p).map_err(|e| format!("admin_token_file {}: {e}", p.display()))?;
    let t = t.lines().next().unwrap_or_default().trim().to_string();
    if t.is_empty() {
        return Err(format!(
            "admin_token_file {}: the file is empty",
            p.display()
        ));
    }
    Ok(t)
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
