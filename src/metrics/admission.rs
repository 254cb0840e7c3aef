//! Series of key-level admission control (`crate::admit`). Labels are bounded: a rule's
//! pattern (at most 1024 rules) and a fixed set of results. Keys never become labels here:
//! a limited key shows up in `/hotkeys` only while it is in the capped hot-key set.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::ResultLabel;

/// What admission did with a command: every result a rule can count.
pub const ADMIT_RESULTS: [&str; 5] = ["admitted", "delayed", "sampled", "rejected", "shed"];

#[derive(Clone, Default)]
pub struct AdmissionMetrics {
    pub decisions: Family<AdmitLabel, Counter>,
    /// Keys holding a bucket or a sample counter now.
    pub keys: Gauge,
    pub global_syncs: Family<ResultLabel, Counter>,
    /// 1 while global limits run on `limit / proxies` because the registry is unreachable.
    pub global_fallback: Gauge,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmitLabel {
    pub rule: String,
    pub result: &'static str,
}

impl AdmissionMetrics {
    /// The counters of one rule, in `ADMIT_RESULTS` order.
    pub fn for_rule(&self, rule: &str) -> [Counter; 5] {
        ADMIT_RESULTS.map(|result| {
            self.decisions
                .get_or_create(&AdmitLabel {
                    rule: rule.to_string(),
                    result,
                })
                .clone()
        })
    }

    pub(super) fn register(&self, r: &mut Registry) {
        r.register(
            "admission",
            "Commands on keys under an admit rule, by rule and result (admitted, delayed, sampled, rejected, shed)",
            self.decisions.clone(),
        );
        r.register(
            "admission_keys",
            "Keys holding an admission bucket or sample counter",
            self.keys.clone(),
        );
        for result in ["ok", "failed"] {
            let _ = self.global_syncs.get_or_create(&ResultLabel { result });
        }
        r.register(
            "admission_global_syncs",
            "Syncs of global limits' allocations through the registry, by result",
            self.global_syncs.clone(),
        );
        r.register(
            "admission_global_fallback",
            "1 while global limits fall back to limit / proxies because the registry cannot be reached",
            self.global_fallback.clone(),
        );
    }
}
