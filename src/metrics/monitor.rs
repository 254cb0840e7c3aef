//! Series of `MONITOR` through the proxy: how many clients watch, what they were sent, and
//! what a slow one was not sent (its queue was full).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

#[derive(Clone, Default)]
pub struct MonitorMetrics {
    pub clients: Gauge,
    pub lines: Counter,
    pub dropped: Counter,
}

impl MonitorMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "monitor_clients",
            "Clients in MONITOR on this proxy",
            self.clients.clone(),
        );
        r.register(
            "monitor_lines",
            "MONITOR lines queued for monitoring clients",
            self.lines.clone(),
        );
        r.register(
            "monitor_dropped_lines",
            "MONITOR lines not sent to a monitoring client that read too slowly (its queue was full)",
            self.dropped.clone(),
        );
    }
}
