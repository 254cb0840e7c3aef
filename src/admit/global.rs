//! The second tier of global limits: the sync through the registry.
//!
//! Every interval (the shortest `sync_ms` of the global rules) each proxy writes, for each
//! key it limits globally, the rate it was offered (`share::smooth`: averaged over
//! intervals, a rise taken at once) into the hash
//! `{saltshaker:registry}:admit:<key>` (field = proxy id, value = "demand:unix_ms"; the
//! hash expires three intervals after its last write), and reads every proxy's entry back
//! in the same pipeline. Its share is its max-min fair part of the limit
//! (`share::allocate`): every proxy computes the same split from the same entries, so
//! the shares add up to the limit, give or take the entries that changed within one
//! interval. The hash tag puts these hashes in the registry's slot on a cluster; in a pool
//! they are sent to the registry's node.
//!
//! When the registry cannot be reached, each key falls back to `limit / proxies`
//! (`proxies` from the rule, else the number of proxies the last sync saw), which is
//! logged and shown in `saltshaker_admission_global_fallback`.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use super::share::{allocate_expecting, decode, encode, smooth};
use super::{Admission, GlobalKey};
use crate::backend::{wire, Backend};
use crate::metrics::ResultLabel;
use crate::resp::Value;
use crate::rules::{RulesHandle, Scope};

/// Most keys one sync carries (the busiest first); the rest keep their share until a
/// later sync.
pub const MAX_KEYS_PER_SYNC: usize = 1000;

/// The registry hash of one key's allocations.
pub fn hash_name(key: &[u8]) -> Vec<u8> {
    let mut n = b"{saltshaker:registry}:admit:".to_vec();
    n.extend_from_slice(key);
    n
}

/// Runs the sync until shutdown.
pub async fn run(
    adm: &Admission,
    backend: &Backend,
    rules: &RulesHandle,
    id: &str,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let interval = rules
            .snapshot()
            .rules()
            .iter()
            .filter_map(|r| r.admit.filter(|a| a.scope == Scope::Global))
            .map(|a| a.sync_ms)
            .min();
        let wait = Duration::from_millis(interval.unwrap_or(1000));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.wait_for(|v| *v) => return,
        }
        let Some(sync_ms) = interval else { continue };
        let keys = adm.collect();
        if keys.is_empty() {
            continue;
        }
        let now = crate::salt::now_ms();
        match exchange(backend, id, &keys, sync_ms, now).await {
            Ok(entries) => {
                adm.metrics
                    .global_syncs
                    .get_or_create(&ResultLabel { result: "ok" })
                    .inc();
                if adm.fallback.swap(false, Ordering::Relaxed) {
                    tracing::info!(
                        "registry reachable again: global limits are shared by allocation again"
                    );
                    adm.metrics.global_fallback.set(0);
                }
                adm.apply(&keys, &entries, id);
            }
            Err(e) => {
                adm.metrics
                    .global_syncs
                    .get_or_create(&ResultLabel { result: "failed" })
                    .inc();
                if !adm.fallback.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, fleet = adm.fleet.load(Ordering::Relaxed),
                        "registry unreachable: global limits fall back to limit / proxies on each proxy");
                    adm.metrics.global_fallback.set(1);
                }
                adm.fall_back(&keys);
            }
        }
    }
}

/// One key to sync: its name, the rate this proxy was offered since the last sync, its rule.
pub struct Synced {
    key: Bytes,
    demand: f64,
    g: GlobalKey,
}

/// Every proxy's (id, demand) for each key, in `keys` order.
type Entries = Vec<Vec<(Bytes, f64)>>;

async fn exchange(
    backend: &Backend,
    id: &str,
    keys: &[Synced],
    sync_ms: u64,
    now_ms: u64,
) -> Result<Entries, String> {
    let node = backend.node_for(crate::salt::names::REGISTRY_KEY.as_bytes());
    let ttl = (3 * sync_ms).to_string();
    let mut cmds = Vec::with_capacity(keys.len() * 3);
    for k in keys {
        let name = hash_name(&k.key);
        let entry = encode(k.demand, now_ms);
        cmds.push((
            node,
            wire(&[&b"HSET"[..], &name, id.as_bytes(), entry.as_bytes()]),
        ));
        cmds.push((node, wire(&[&b"PEXPIRE"[..], &name, ttl.as_bytes()])));
        cmds.push((node, wire(&[&b"HGETALL"[..], &name])));
    }
    let replies = crate::salt::call(backend, &cmds)
        .await
        .map_err(|e| e.to_string())?;
    let oldest = now_ms.saturating_sub(3 * sync_ms);
    let mut out = Vec::with_capacity(keys.len());
    for i in 0..keys.len() {
        let mut live = Vec::new();
        match &replies[3 * i + 2] {
            Value::Array(a) => {
                for pair in a.chunks(2) {
                    if let [Value::Bulk(f), Value::Bulk(v)] = pair {
                        if let Some((d, t)) = decode(v) {
                            if t >= oldest {
                                live.push((f.clone(), d));
                            }
                        }
                    }
                }
            }
            Value::Map(m) => {
                for (f, v) in m {
                    if let (Value::Bulk(f), Value::Bulk(v)) = (f, v) {
                        if let Some((d, t)) = decode(v) {
                            if t >= oldest {
                                live.push((f.clone(), d));
                            }
                        }
                    }
                }
            }
            v => return Err(format!("registry read failed: {v:?}")),
        }
        out.push(live);
    }
    Ok(out)
}

impl Admission {
    /// The globally limited keys, busiest first, with what each was offered since the
    /// last call (which starts their next interval).
    fn collect(&self) -> Vec<Synced> {
        let mut out = Vec::new();
        let now = self.now_us();
        for shard in self.shards.iter() {
            let mut map = shard.lock().unwrap_or_else(|p| p.into_inner());
            for (k, st) in map.iter_mut() {
                if let Some(g) = st.global {
                    let secs = (now.saturating_sub(st.since_us) as f64 / 1e6).max(0.001);
                    let measured = std::mem::take(&mut st.offered) as f64 / secs;
                    let demand = smooth(st.reported, measured);
                    (st.since_us, st.reported) = (now, Some(demand));
                    out.push(Synced {
                        key: k.clone(),
                        demand,
                        g,
                    });
                }
            }
        }
        out.sort_by(|a, b| b.demand.total_cmp(&a.demand));
        out.truncate(MAX_KEYS_PER_SYNC);
        out
    }

    fn apply(&self, keys: &[Synced], entries: &Entries, id: &str) {
        let mut fleet = 0;
        for (k, live) in keys.iter().zip(entries) {
            let mut demands: Vec<f64> = live.iter().map(|(_, d)| *d).collect();
            let mine = match live.iter().position(|(f, _)| f.as_ref() == id.as_bytes()) {
                Some(i) => i,
                None => {
                    demands.push(k.demand);
                    demands.len() - 1
                }
            };
            fleet = fleet.max(demands.len());
            let expected = k.g.proxies.map(|n| n as usize);
            let share = allocate_expecting(k.g.limit, &demands, expected)[mine];
            self.set_share(&k.key, share);
        }
        self.fleet.store(fleet as u32, Ordering::Relaxed);
    }

    fn fall_back(&self, keys: &[Synced]) {
        let fleet = self.fleet.load(Ordering::Relaxed);
        for k in keys {
            let share = match (k.g.proxies, fleet) {
                (Some(n), _) => k.g.limit / n as f64,
                (None, n) if n > 0 => k.g.limit / n as f64,
                _ => k.g.limit * k.g.start_share_pct / 100.0,
            };
            self.set_share(&k.key, share);
        }
    }

    fn set_share(&self, key: &[u8], share: f64) {
        let mut map = self.shard(key).lock().unwrap_or_else(|p| p.into_inner());
        if let Some(st) = map.get_mut(key) {
            st.share = Some(share);
        }
    }
}
