//! Series of a Redis Cluster backend: redirections followed, map refreshes, slots served.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::ResultLabel;

/// What the proxy did for a cluster that changes under it.
#[derive(Clone, Default)]
pub struct ClusterMetrics {
    pub redirects: Family<RedirectLabel, Counter>,
    pub refreshes: Family<ResultLabel, Counter>,
    pub slots_served: Gauge,
}

/// A redirection a node answered: `moved`, `ask`, or `retry` (TRYAGAIN, CLUSTERDOWN).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RedirectLabel {
    pub kind: &'static str,
}

impl ClusterMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        for kind in ["moved", "ask", "retry"] {
            let _ = self.redirects.get_or_create(&RedirectLabel { kind });
        }
        r.register(
            "cluster_redirects",
            "Replies a cluster node answered with a redirection the proxy followed, by kind (moved, ask, retry: TRYAGAIN or CLUSTERDOWN); clients never see them",
            self.redirects.clone(),
        );
        for result in ["ok", "failed"] {
            let _ = self.refreshes.get_or_create(&ResultLabel { result });
        }
        r.register(
            "cluster_map_refreshes",
            "Reads of the cluster's slot map (CLUSTER SHARDS), by result (ok, failed)",
            self.refreshes.clone(),
        );
        r.register(
            "cluster_slots_served",
            "Slots of the 16384 that the proxy's map gives an owner (less than 16384: some keys answer CLUSTERDOWN)",
            self.slots_served.clone(),
        );
    }

    /// Counts a redirection of `kind`.
    pub fn redirect(&self, kind: &'static str) {
        self.redirects.get_or_create(&RedirectLabel { kind }).inc();
    }
}
