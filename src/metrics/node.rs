//! The metric handles one backend node's connections hold.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use super::{Metrics, NodeErrorLabel, NodeLabel};

/// Pre-resolved metric handles of one node.
#[derive(Clone)]
pub struct NodeMetrics {
    pub requests: Counter,
    /// Writes to the node's shared connections, each with every command gathered for it.
    pub writes: Counter,
    pub connections: Gauge,
    pub up: Gauge,
    /// Commands sent and not answered yet, over the node's shared connections.
    pub pending: Gauge,
    /// Estimated node seconds of the costly reads it answered (`proxy::conn::cost`).
    pub read_cost: Counter<f64, std::sync::atomic::AtomicU64>,
    /// Reconnects to the node so far, over its shared connections (a connection's first
    /// connect is not counted: a new lane or protocol is no news of the node). One that
    /// grows means the node may have restarted, and what it knows is learned again.
    pub connects: std::sync::Arc<std::sync::atomic::AtomicU64>,
    node: String,
    errors: prometheus_client::metrics::family::Family<NodeErrorLabel, Counter>,
}

impl NodeMetrics {
    pub fn new(m: &Metrics, node: &str) -> Self {
        m.add_node(node);
        let l = NodeLabel {
            node: node.to_string(),
        };
        NodeMetrics {
            requests: m.backend_requests.get_or_create(&l).clone(),
            writes: m.backend_writes.get_or_create(&l).clone(),
            connections: m.backend_connections.get_or_create(&l).clone(),
            up: m.backend_up.get_or_create(&l).clone(),
            pending: m.backend_pending.get_or_create(&l).clone(),
            read_cost: m.backend_read_cost.get_or_create(&l).clone(),
            connects: Default::default(),
            node: node.to_string(),
            errors: m.backend_errors.clone(),
        }
    }

    /// Error counter by kind (connect, io, timeout, down, protocol). Errors are rare, so the
    /// label lookup is not on the fast path.
    pub fn errors(&self, kind: &'static str) -> Counter {
        self.errors
            .get_or_create(&NodeErrorLabel {
                node: self.node.clone(),
                kind,
            })
            .clone()
    }
}
