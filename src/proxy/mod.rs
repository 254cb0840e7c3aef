//! The data path: the listener, the worker threads and the background tasks (this file),
//! and one session per client connection, in five rooms that follow a request's route.
//! The route is drawn once, in docs/architecture.md ("The request's route").
//!
//! Each room stands only on the rooms below it (`tests/layout.rs`):
//!
//! - `session/`: the pipeline: the read loop, and per command classify, check, admit,
//!   order, decide, observe, act;
//! - `answer/`: commands answered in the proxy (connection state, transactions, CLIENT,
//!   ACL, CLUSTER as one node, client-side caching);
//! - `act/`: commands that go to the nodes (jobs, splits, mitigations, salting, SORT and
//!   STORE across nodes);
//! - `conn/`: one connection's state and the way out (ctx, state, order, txn, round,
//!   reply, merge, cost, dedicated, tunnel, scan);
//! - `registry/`: process-wide (clients, tracking, monitor, version, hotkeys).

mod act;
mod answer;
mod conn;
mod registry;
mod session;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use conn::ctx::{CacheLayer, Ctx};

use tokio::net::TcpListener;

use crate::hotkey::shown;
use crate::net::tls::ServerTls;
use crate::net::Stream;
use crate::policy::HotSet;

/// A listening socket and, when it speaks TLS, the certificate it serves.
pub struct Listener {
    pub tcp: TcpListener,
    pub tls: Option<Arc<ServerTls>>,
}

/// Accepts clients on every listener until shutdown, on `threads` worker threads, then
/// waits (up to `drain`) for open sessions to finish their commands.
///
/// Worker 0 is the calling thread. Each other worker is a thread with a current-thread
/// runtime of its own, accepting on its own copy of every listening socket: a client's
/// session, its tasks and the node connections they use (`backend::set_worker`) all
/// stay on the thread that accepted it, so the request path never wakes another
/// thread. Measured against tokio's work-stealing scheduler on the same workers
/// (bench/README.md, "Worker threads").
pub async fn serve(listeners: Vec<Listener>, ctx: Arc<Ctx>, threads: usize, drain: Duration) {
    let mut workers = Vec::new();
    // A worker's runtime ends only once every worker has drained: the node connections
    // are shared (`backend::wire`), and a connection's reader, or a relay writing for
    // every worker, may run on any of them.
    let (release_tx, release) = tokio::sync::watch::channel(false);
    for i in 1..threads.max(1) {
        let copies = match listeners.iter().map(Listener::copy).collect() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, worker = i, "cannot copy a listening socket: fewer worker threads");
                break;
            }
        };
        let (ctx, (done_tx, done)) = (ctx.clone(), tokio::sync::oneshot::channel::<()>());
        let mut release = release.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("saltshaker-w{i}"))
            .spawn(move || {
                crate::backend::set_worker(i);
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => {
                        rt.block_on(async {
                            serve_worker(copies, ctx, drain).await;
                            let _ = done_tx.send(());
                            let _ = release.wait_for(|r| *r).await;
                        });
                        // Tasks still running past the drain (a node connection, a
                        // client past the deadline) end with the runtime.
                        rt.shutdown_timeout(Duration::from_millis(100));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, worker = i, "cannot start a worker");
                        let _ = done_tx.send(());
                    }
                }
            });
        match spawned {
            Ok(_) => workers.push(done),
            Err(e) => tracing::warn!(error = %e, worker = i, "cannot start a worker thread"),
        }
    }
    serve_worker(listeners, ctx, drain).await;
    for w in workers {
        let _ = tokio::time::timeout(drain + Duration::from_secs(1), w).await;
    }
    let _ = release_tx.send(true);
}

impl Listener {
    /// Another handle on the same listening socket, for another worker thread: the kernel
    /// hands each new connection to one of the threads waiting on it.
    fn copy(&self) -> std::io::Result<StdListener> {
        use std::os::fd::AsFd;
        let fd = self.tcp.as_fd().try_clone_to_owned()?;
        Ok(StdListener {
            tcp: std::net::TcpListener::from(fd),
            tls: self.tls.clone(),
        })
    }
}

/// A listener on its way to a worker thread, registered with that thread's runtime there.
struct StdListener {
    tcp: std::net::TcpListener,
    tls: Option<Arc<ServerTls>>,
}

/// What a worker serves: the listeners it was given, or copies to register on its runtime.
trait Listen: Send + 'static {
    fn listener(self) -> std::io::Result<Listener>;
}

impl Listen for Listener {
    fn listener(self) -> std::io::Result<Listener> {
        Ok(self)
    }
}

impl Listen for StdListener {
    fn listener(self) -> std::io::Result<Listener> {
        self.tcp.set_nonblocking(true)?;
        Ok(Listener {
            tcp: TcpListener::from_std(self.tcp)?,
            tls: self.tls,
        })
    }
}

/// One worker: accepts until shutdown, then waits for every client (on any worker) to
/// finish, up to `drain`.
async fn serve_worker<L: Listen>(listeners: Vec<L>, ctx: Arc<Ctx>, drain: Duration) {
    let mut shutdown = ctx.shutdown.clone();
    // Over one node or a pool, channels live on the first node: a connection waits there
    // for this worker's first subscriber (`Node::take_spare`). A cluster's pub/sub node
    // varies; its spares are opened by the first subscription to each.
    if !ctx.backend.by_slot() && ctx.backend.len() > 0 {
        ctx.backend.node(0).warm_spare(crate::resp::Proto::Resp2);
    }
    let mut accepts = Vec::new();
    for l in listeners {
        match l.listener() {
            Ok(l) => accepts.push(tokio::spawn(accept_loop(l, ctx.clone()))),
            Err(e) => tracing::warn!(error = %e, "cannot listen on a worker thread"),
        }
    }
    let _ = shutdown.wait_for(|v| *v).await;
    for a in accepts {
        // Each loop ends at shutdown and drops its listener: no new client gets in.
        let _ = a.await;
    }
    let deadline = Instant::now() + drain;
    while ctx.metrics.client_connections.get() > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let left = ctx.metrics.client_connections.get();
    if left > 0 && crate::backend::worker() == 0 {
        tracing::warn!(
            clients = left,
            "drain timeout: closing remaining client connections"
        );
    }
}

async fn accept_loop(l: Listener, ctx: Arc<Ctx>) {
    let mut shutdown = ctx.shutdown.clone();
    loop {
        tokio::select! {
            biased;
            _ = async { let _ = shutdown.wait_for(|v| *v).await; } => return,
            res = l.tcp.accept() => match res {
                Ok((tcp, peer)) => {
                    let m = &ctx.metrics;
                    if m.client_connections.get() as usize >= ctx.max_clients {
                        m.client_rejected.inc();
                        if l.tls.is_none() {
                            tokio::spawn(refuse(tcp));
                        }
                        continue;
                    }
                    m.client_connections_total.inc();
                    m.client_connections.inc();
                    let id = ctx.next_id.fetch_add(1, Ordering::Relaxed);
                    let (ctx, tls) = (ctx.clone(), l.tls.clone());
                    tokio::spawn(async move {
                        let stream = match tls {
                            None => Some(Stream::Tcp(tcp)),
                            // Boxed: the TLS handshake's future is as large as the session's, and
                            // would otherwise sit beside it in every connection's task.
                            Some(tls) => match Box::pin(tls.accept(tcp)).await {
                                Ok(s) => Some(s),
                                Err(e) => {
                                    ctx.metrics.security.tls_handshake_failures.inc();
                                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                    None
                                }
                            },
                        };
                        if let Some(stream) = stream {
                            Box::pin(session::run(stream, ctx.clone(), id)).await;
                        }
                        ctx.metrics.client_connections.dec();
                    });
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// Gives freed memory back to the system after client connections close.
///
/// glibc's malloc returns only the top of a heap: the buffers and futures of connections
/// that closed stay resident, scattered between live ones. Measured (bench/conn_memory.py,
/// 4,000 connections opened and closed, RSS 5 s later): 157, 167, 175 MB after three
/// rounds over 9 MB idle, never given back. `malloc_trim` releases every free page of
/// every arena. It runs on a blocking thread, at most every five seconds, and only after
/// at least 256 clients closed since the last time, so a steady proxy never pays for it.
/// mimalloc was measured instead and kept more per connection (35 kB against 16 kB).
pub fn spawn_memory_trim(ctx: Arc<Ctx>) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    tokio::spawn(async move {
        extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        let mut shutdown = ctx.shutdown.clone();
        let m = &ctx.metrics;
        let closed = || m.client_connections_total.get() as i64 - m.client_connections.get();
        let mut trimmed_at = closed();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                _ = shutdown.wait_for(|v| *v) => return,
            }
            let now = closed();
            if now - trimmed_at >= 256 {
                // SAFETY: malloc_trim only releases free memory; it takes glibc's own
                // arena locks and touches no memory the program holds.
                let _ = tokio::task::spawn_blocking(|| unsafe { malloc_trim(0) }).await;
                trimmed_at = now;
            }
        }
    });
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = ctx;
}

/// Learns the nodes' Redis version (what HELLO reports) before the first client is served,
/// waiting at most `wait` (a node that is down or mute does not hold the proxy back), then
/// every second until every node has answered, and every minute after that, or as soon as
/// a node was reconnected; and, in the background, the commands of each node seen at a new
/// version or reconnected (`version`).
pub async fn learn_node_version(ctx: Arc<Ctx>, wait: Duration) {
    // The commands too, within the same wait: HELLO reports a version only once its
    // commands are known (`version::publish`), so the first clients see both at once.
    let learn = async {
        let all = registry::version::learn(&ctx.backend, &ctx.version).await;
        registry::version::learn_commands_of_new_versions(&ctx.backend, &ctx.version).await;
        all
    };
    let mut all = tokio::time::timeout(wait, learn).await.unwrap_or(false);
    let mut shutdown = ctx.shutdown.clone();
    tokio::spawn(async move {
        loop {
            // The commands of a node seen at a new version or reconnected (at start: every
            // node).
            registry::version::learn_commands_of_new_versions(&ctx.backend, &ctx.version).await;
            let pause = if all {
                registry::version::EVERY
            } else {
                registry::version::RETRY
            };
            let asked = tokio::time::Instant::now();
            // A reconnect is looked for each RETRY, so a restarted node is asked again
            // within a second or two, not a minute.
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(registry::version::RETRY) => {}
                    _ = async { let _ = shutdown.wait_for(|v| *v).await; } => return,
                }
                if asked.elapsed() >= pause
                    || registry::version::reconnected(&ctx.backend, &ctx.version)
                {
                    break;
                }
            }
            all = registry::version::learn(&ctx.backend, &ctx.version).await;
        }
    });
}

/// Rebuilds the hot set whenever the detector publishes a snapshot or the rules change.
pub fn spawn_hot_updater(ctx: Arc<Ctx>, hash_names: bool) {
    let mut snaps = ctx.detector.subscribe();
    let mut gens = ctx.rules.subscribe();
    let mut shutdown = ctx.shutdown.clone();
    tokio::spawn(async move {
        // Write-hot keys mitigated in the last set: a key new to it is timed once.
        let mut mitigated: std::collections::HashSet<Vec<u8>> = Default::default();
        loop {
            let snap = snaps.borrow_and_update().clone();
            let by_slot = ctx.backend.by_slot();
            ctx.hotkeys
                .add_window(&snap, |k| by_slot.then(|| ctx.backend.group_of(k).0 as u16));
            let prev = ctx.hot.load_full();
            let measured = ledgers(&ctx);
            let hot = HotSet::build_after(&snap, ctx.rules.load(), Some(&prev), &measured);
            cache_decisions(&ctx, &hot, &prev, hash_names);
            combine_decisions(&ctx, &hot, &prev, hash_names);
            time_to_mitigate(&ctx, &snap, &hot, &mut mitigated);
            let m = &ctx.metrics.mitigated_keys;
            m.get_or_create(&crate::metrics::HotKindLabel { kind: "write" })
                .set(hot.write_keys() as i64);
            m.get_or_create(&crate::metrics::HotKindLabel { kind: "read" })
                .set(hot.read_keys() as i64);
            ctx.hot.store(Arc::new(hot));
            tokio::select! {
                r = snaps.changed() => if r.is_err() { return },
                r = gens.changed() => if r.is_err() { return },
                _ = shutdown.wait_for(|v| *v) => return,
            }
        }
    });
}

/// What each key's mitigations did since the last window: the cache's hits and fills, the
/// combiner's batches.
fn ledgers(ctx: &Ctx) -> std::collections::HashMap<bytes::Bytes, crate::policy::Ledger> {
    let mut out: std::collections::HashMap<bytes::Bytes, crate::policy::Ledger> =
        Default::default();
    for (k, b) in ctx.combiner.take_batched() {
        let l = out.entry(k).or_default();
        l.increments = b.increments;
        l.combine_commands = b.commands;
        l.batches_of_one = b.batches_of_one;
    }
    if let Some(c) = &ctx.cache {
        for (k, t) in c.cache.take_tallies() {
            let l = out.entry(k).or_default();
            l.cache_hits = t.hits;
            l.cache_hit_bytes = t.hit_bytes;
            l.cache_saved_us = t.saved_us;
            l.cache_fills = t.fills;
            l.cache_invalidations = t.invalidations;
        }
    }
    out
}

/// Counts and logs each read-hot key whose cache was declined because it does not pay
/// (`policy::DECLINE_FILL_SHARE`), and each cached again.
fn cache_decisions(ctx: &Ctx, hot: &HotSet, prev: &HotSet, hash_names: bool) {
    let show = |k: &[u8]| shown(k, hash_names);
    let (declined, again) = hot.cache_changes(prev);
    let m = &ctx.metrics.cache;
    for (k, why) in declined {
        m.declined.inc();
        let fills_pct = (why.share * 100.0).round();
        if why.measured {
            tracing::info!(key = %show(&k), fills_pct, "not caching a read-hot key any more: this share of its cached reads were fills in the last window");
        } else {
            tracing::info!(key = %show(&k), fills_pct, "not caching a read-hot key: its writes would refill the cache for this share of its reads");
        }
    }
    for k in again {
        m.readmitted.inc();
        tracing::info!(key = %show(&k), "caching a read-hot key again: its writes fell under a quarter of its reads");
    }
    m.not_cached_keys.set(hot.not_cached_count() as i64);
}

/// Counts and logs each write-hot key whose combining was declined because its batches
/// would not pay (`policy::DECLINE_PER_COMMAND`), and each combined again.
fn combine_decisions(ctx: &Ctx, hot: &HotSet, prev: &HotSet, hash_names: bool) {
    let (declined, again) = hot.combine_changes(prev);
    let m = &ctx.metrics.combine;
    for (k, per) in declined {
        m.declined.inc();
        tracing::info!(key = %shown(&k, hash_names), increments_per_command = (per * 100.0).round() / 100.0, "not combining a write-hot key: its batches would carry under two increments per node command");
    }
    for k in again {
        m.recombined.inc();
        tracing::info!(key = %shown(&k, hash_names), "combining a write-hot key again: its writes fill batches again");
    }
    m.not_combined_keys.set(hot.not_combined_count() as i64);
}

/// Observes `saltshaker_time_to_mitigate_seconds` for each key that is combined from now
/// on (write-hot in this snapshot, with a strategy that combines or salts it), measured
/// from when the detector listed it hot. Keys this proxy did not see hot itself, and
/// combines only because a promotion of them is announced (`policy::bridge`), are not
/// timed: the registry's announcement reaches every proxy within milliseconds of the
/// promotion.
fn time_to_mitigate(
    ctx: &Ctx,
    snap: &crate::hotkey::HotSnapshot,
    hot: &HotSet,
    mitigated: &mut std::collections::HashSet<Vec<u8>>,
) {
    let now = crate::salt::now_ms();
    let table = ctx.salt.table.load();
    let mut now_set = std::collections::HashSet::new();
    for k in &snap.keys {
        if k.write_state.is_none() || hot.write_hot(&k.key).is_none() {
            continue;
        }
        if !mitigated.contains(&k.key) && table.get(&k.key).is_none() {
            let secs = now.saturating_sub(k.since_unix_ms) as f64 / 1000.0;
            ctx.metrics.time_to_mitigate.observe(secs);
        }
        now_set.insert(k.key.clone());
    }
    *mitigated = now_set;
}

/// Runs the node-balance controller (see `mitigate::balance`) on a pool of nodes.
pub fn spawn_balancer(ctx: Arc<Ctx>, chosen: Arc<crate::mitigate::balance::Chosen>) {
    if ctx.backend.len() < 2 {
        return;
    }
    let gauges = ctx
        .backend
        .nodes()
        .iter()
        .map(|n| {
            ctx.metrics
                .balance_keys
                .get_or_create(&crate::metrics::NodeLabel {
                    node: n.addr.clone(),
                })
                .clone()
        })
        .collect();
    tokio::spawn(async move {
        crate::mitigate::balance::run(
            chosen,
            &ctx.backend,
            &ctx.detector,
            ctx.rules.clone(),
            gauges,
            ctx.shutdown.clone(),
        )
        .await
    });
}

/// Keeps the salt table in step with the registry in the backend (see `salt::registry`).
/// Starts the sync of global admission limits through the registry.
pub fn spawn_admission_sync(ctx: Arc<Ctx>) {
    tokio::spawn(async move {
        let (id, stop) = (ctx.salt.id.clone(), ctx.shutdown.clone());
        crate::admit::global::run(&ctx.admit, &ctx.backend, &ctx.rules, &id, stop).await
    });
}

pub fn spawn_salt_coordinator(ctx: Arc<Ctx>) {
    let owner = ctx.clone();
    let spread = move |key: bytes::Bytes| {
        let ctx = owner.clone();
        tokio::spawn(async move { crate::salt::fold::spread(&ctx.backend, &ctx.salt, key).await });
    };
    tokio::spawn(async move {
        crate::salt::coordinator::run(
            &ctx.backend,
            &ctx.salt,
            ctx.detector.subscribe(),
            &ctx.rules,
            ctx.shutdown.clone(),
            &spread,
        )
        .await;
    });
}

impl crate::salt::Control for Ctx {
    fn promote(
        &self,
        key: Vec<u8>,
        shards: u32,
    ) -> crate::salt::Fut<'_, Result<crate::salt::record::Record, crate::salt::SaltError>> {
        Box::pin(async move {
            let policy = self.rules.load().resolve(&key).write.salt;
            crate::salt::kinds::promote(&self.backend, &self.salt, &key, shards, true, policy, None)
                .await
        })
    }

    fn demote(
        &self,
        key: Vec<u8>,
    ) -> crate::salt::Fut<'_, Result<Option<crate::salt::record::Record>, crate::salt::SaltError>>
    {
        Box::pin(async move {
            let rules = self.rules.load();
            if let Some(rule) = crate::salt::registry::pinning_rule(&rules, &key) {
                return Err(crate::salt::SaltError::Refused(format!(
                    "the rules pin this key (rule `{rule}`); remove `pin: true` there to end its salting"
                )));
            }
            crate::salt::registry::demote(&self.backend, &self.salt, &key).await
        })
    }

    fn table(&self) -> Arc<crate::salt::SaltTable> {
        self.salt.table.load_full()
    }
}

async fn refuse(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let _ = stream
        .write_all(b"-ERR max number of clients reached\r\n")
        .await;
}
