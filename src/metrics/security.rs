//! Series of TLS, users and the admin token.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::ResultLabel;

/// TLS, users and the admin token.
#[derive(Clone, Default)]
pub struct SecurityMetrics {
    pub tls_handshake_failures: Counter,
    pub tls_reloads: Family<ResultLabel, Counter>,
    pub tls_last_reload_failed: Gauge,
    pub auth_failures: Counter,
    pub acl_denied: Family<DeniedLabel, Counter>,
    pub admin_unauthorized: Counter,
}

/// A NOPERM refusal: the user (from the config file, so bounded) and what was denied.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeniedLabel {
    pub user: String,
    pub reason: &'static str,
}

impl SecurityMetrics {
    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "tls_handshake_failures",
            "Client connections closed because their TLS handshake failed or timed out",
            self.tls_handshake_failures.clone(),
        );
        let _ = self
            .tls_reloads
            .get_or_create(&ResultLabel { result: "ok" });
        let _ = self
            .tls_reloads
            .get_or_create(&ResultLabel { result: "failed" });
        r.register(
            "tls_reloads",
            "Reloads of the client-facing certificate and key, by result (ok, failed)",
            self.tls_reloads.clone(),
        );
        r.register(
        "tls_last_reload_failed",
        "1 while the latest certificate reload failed and the previous certificate still serves",
        self.tls_last_reload_failed.clone(),
    );
        r.register(
            "auth_failures",
            "AUTH and HELLO AUTH attempts refused (WRONGPASS)",
            self.auth_failures.clone(),
        );
        r.register(
            "acl_denied",
            "Commands refused with NOPERM, by user and reason (command, key)",
            self.acl_denied.clone(),
        );
        r.register(
            "admin_unauthorized",
            "Admin HTTP requests refused for a missing or wrong bearer token",
            self.admin_unauthorized.clone(),
        );
    }
}
