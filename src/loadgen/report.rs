//! The result of a benchmark run, as text for a person and JSON for `bench/` scripts.

use std::fmt::Write;
use std::time::Duration;

/// Commands one backend node executed during the run, from its `INFO commandstats`.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeLoad {
    pub node: String,
    pub commands: u64,
}

#[derive(Clone, Debug)]
pub struct Report {
    /// What was run: target, clients, pipeline, workload, mix.
    pub label: String,
    /// Replies received, error replies included.
    pub ops: u64,
    /// Error replies, plus commands left unanswered by a failed connection.
    pub errors: u64,
    pub elapsed: Duration,
    pub ops_per_sec: f64,
    /// Latency from a batch's write to each reply, in microseconds (within 1%).
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    /// Commands on the viral key that got a non-error reply (0 for other workloads): with
    /// an INCR-only mix, the value the key gained.
    pub viral_ops: u64,
    pub per_node: Vec<NodeLoad>,
    /// max/mean of `per_node` commands; `None` without nodes or without load.
    pub imbalance: Option<f64>,
    /// Why connections failed, one line each (at most one per client).
    pub failures: Vec<String>,
}

/// max/mean of the per-node command counts.
pub(crate) fn imbalance(per_node: &[NodeLoad]) -> Option<f64> {
    let max = per_node.iter().map(|n| n.commands).max()?;
    let sum: u64 = per_node.iter().map(|n| n.commands).sum();
    (sum > 0).then(|| max as f64 * per_node.len() as f64 / sum as f64)
}

fn duration_us(us: u64) -> String {
    match us {
        0..=9_999 => format!("{us} us"),
        10_000..=999_999 => format!("{:.2} ms", us as f64 / 1e3),
        _ => format!("{:.2} s", us as f64 / 1e6),
    }
}

impl Report {
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "saltshaker bench: {}", self.label);
        let _ = writeln!(
            s,
            "  ops        {} in {:.2} s = {:.0} ops/s, {} errors",
            self.ops,
            self.elapsed.as_secs_f64(),
            self.ops_per_sec,
            self.errors
        );
        let _ = writeln!(
            s,
            "  latency    p50 {}  p99 {}  p99.9 {}  max {}",
            duration_us(self.p50_us),
            duration_us(self.p99_us),
            duration_us(self.p999_us),
            duration_us(self.max_us)
        );
        if self.viral_ops > 0 {
            let share = self.viral_ops as f64 * 100.0 / self.ops.max(1) as f64;
            let _ = writeln!(
                s,
                "  viral key  {} ops ({share:.1}% of all)",
                self.viral_ops
            );
        }
        let total: u64 = self.per_node.iter().map(|n| n.commands).sum();
        for (i, n) in self.per_node.iter().enumerate() {
            let share = n.commands as f64 * 100.0 / total.max(1) as f64;
            let head = if i == 0 { "backend" } else { "" };
            let _ = writeln!(
                s,
                "  {head:<9}  {:<21} {:>10} commands ({share:.1}%)",
                n.node, n.commands
            );
        }
        if let Some(x) = self.imbalance {
            let _ = writeln!(s, "  imbalance  {x:.2} (max/mean commands per node)");
        }
        for f in &self.failures {
            let _ = writeln!(s, "  failure    {f}");
        }
        s
    }

    pub fn to_json(&self) -> String {
        let per_node: Vec<_> = self
            .per_node
            .iter()
            .map(|n| serde_json::json!({ "node": n.node, "commands": n.commands }))
            .collect();
        serde_json::json!({
            "label": self.label,
            "ops": self.ops,
            "errors": self.errors,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "ops_per_sec": self.ops_per_sec,
            "p50_us": self.p50_us,
            "p99_us": self.p99_us,
            "p999_us": self.p999_us,
            "max_us": self.max_us,
            "viral_ops": self.viral_ops,
            "per_node": per_node,
            "imbalance": self.imbalance,
            "failures": self.failures,
        })
        .to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(commands: u64) -> NodeLoad {
        NodeLoad {
            node: "n".into(),
            commands,
        }
    }

    #[test]
    fn imbalance_is_max_over_mean_and_absent_without_load() {
        assert_eq!(imbalance(&[node(30), node(10)]), Some(1.5));
        assert_eq!(imbalance(&[node(5), node(5), node(5)]), Some(1.0));
        assert_eq!(imbalance(&[node(0), node(0)]), None);
        assert_eq!(imbalance(&[]), None);
    }

    #[test]
    fn json_and_text_carry_every_figure() {
        let r = Report {
            label: "x".into(),
            ops: 1000,
            errors: 2,
            elapsed: Duration::from_millis(500),
            ops_per_sec: 2000.0,
            p50_us: 80,
            p99_us: 12_500,
            p999_us: 900,
            max_us: 2_000_000,
            viral_ops: 300,
            per_node: vec![node(700), node(300)],
            imbalance: Some(1.4),
            failures: vec!["read: reset".into()],
        };
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).expect("valid JSON");
        assert_eq!(v["ops"], 1000);
        assert_eq!(v["per_node"][1]["commands"], 300);
        assert_eq!(v["imbalance"], 1.4);
        let t = r.to_text();
        for part in [
            "2000 ops/s",
            "2 errors",
            "p50 80 us",
            "p99 12.50 ms",
            "max 2.00 s",
            "(70.0%)",
            "1.40",
            "read: reset",
            "300 ops (30.0%",
        ] {
            assert!(t.contains(part), "{part:?} missing from\n{t}");
        }
    }
}
