//! `saltshaker bench`: a load generator for Redis and for the proxy, for the quick-start
//! demo (one viral key turning hot, live) and the benchmarks in `bench/`.
//!
//! - [`workload`] chooses keys (uniform, Zipf, one viral key) and commands (a GET/SET/INCR
//!   mix) and encodes them;
//! - [`client`] drives one connection: a batch of `pipeline` commands written at once, its
//!   replies counted and timed, optionally under a token bucket;
//! - [`histogram`] keeps latencies in log-linear buckets (1% precision), merged at the end;
//! - [`nodes`] reads each backend's `INFO commandstats` before and after the run, so the
//!   report shows the load every node really took.
//!
//! Cheap enough to drive well over 100k ops/s from one core: a command costs a few random
//! numbers and one copy into the batch buffer, and a reply costs a framing step and a
//! bucket increment; the clock is read once per batch write and once per socket read.

mod client;
mod histogram;
mod nodes;
mod report;
mod workload;
mod zipf;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

pub use histogram::Histogram;
pub use report::{NodeLoad, Report};
pub use workload::{Mix, Workload};
pub use zipf::{Rng, Zipf};

/// A benchmark run. Flag names follow `redis-benchmark` where one exists (`-c`, `-P`,
/// `-n`).
#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// Where to send the load, HOST:PORT: the proxy, or a Redis node directly.
    #[arg(long, default_value = "127.0.0.1:6379")]
    pub target: String,
    /// Connections, one task each.
    #[arg(long, short = 'c', default_value_t = 50)]
    pub clients: usize,
    /// Commands in flight per connection: each batch is written at once, then its replies read.
    #[arg(long, short = 'P', default_value_t = 1)]
    pub pipeline: usize,
    /// Run time in milliseconds; 0 = no time limit (then --requests is required).
    #[arg(long, default_value_t = 10_000)]
    pub duration_ms: u64,
    /// Stop after this many commands (the time limit still applies).
    #[arg(long, short = 'n')]
    pub requests: Option<u64>,
    /// Keys `{prefix}0` .. `{prefix}{keyspace-1}`.
    #[arg(long, default_value_t = 100_000)]
    pub keyspace: u64,
    /// uniform, zipf:S (key 0 hottest), or viral:KEY:SHARE (KEY takes SHARE of all ops).
    #[arg(long, default_value = "uniform")]
    pub workload: Workload,
    /// Command weights, e.g. get=80,set=10,incr=10.
    #[arg(long, default_value = "get=80,set=10,incr=10")]
    pub mix: Mix,
    /// Prefix of every key but the viral one.
    #[arg(long, default_value = "key:")]
    pub key_prefix: String,
    /// Size of SET values in bytes. Values are digits, so INCR after SET on a key works
    /// (up to 18 bytes).
    #[arg(long, default_value_t = 3)]
    pub value_size: usize,
    /// Backend nodes, HOST:PORT,...: their INFO commandstats before and after the run
    /// give the load each one took.
    #[arg(long, value_delimiter = ',')]
    pub nodes: Vec<String>,
    /// Cap on ops/s over all clients.
    #[arg(long)]
    pub rate: Option<u64>,
    /// Seed of every random choice: the same seed sends the same commands per client.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

impl Default for BenchArgs {
    fn default() -> Self {
        BenchArgs {
            target: "127.0.0.1:6379".into(),
            clients: 50,
            pipeline: 1,
            duration_ms: 10_000,
            requests: None,
            keyspace: 100_000,
            workload: Workload::Uniform,
            mix: Mix::default(),
            key_prefix: "key:".into(),
            value_size: 3,
            nodes: Vec::new(),
            rate: None,
            seed: 1,
        }
    }
}

impl BenchArgs {
    fn label(&self) -> String {
        format!(
            "{}, {} clients x pipeline {}, {}, {}",
            self.target, self.clients, self.pipeline, self.workload, self.mix
        )
    }
}

/// Why a bench run could not start or finish: an option, a node, or the run itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BenchError {
    /// A command-line value that makes no sense: which option, its value, and why.
    #[error("{option} {value:?}: {why}")]
    Option {
        option: &'static str,
        value: String,
        why: String,
    },
    /// Settings the run cannot start with.
    #[error("{0}")]
    Setting(&'static str),
    /// The target or a node failed: which, and how.
    #[error("{node}: {what}")]
    Node { node: String, what: String },
    /// The run's own machinery (its runtime, a client task) failed.
    #[error("{0}")]
    Internal(String),
}

/// Runs the benchmark on the current runtime. Connections are opened before the clock
/// starts; the run ends at the deadline or when `requests` are answered, and every batch
/// in flight is waited for. `Err` for invalid arguments or when the target or a node
/// cannot be reached at the start; a connection that fails later is reported in
/// [`Report::failures`], and its unanswered commands as errors.
pub async fn run(args: BenchArgs) -> Result<Report, BenchError> {
    if args.clients == 0 || args.pipeline == 0 {
        return Err(BenchError::Setting(
            "clients and pipeline must be at least 1",
        ));
    }
    if args.duration_ms == 0 && args.requests.is_none() {
        return Err(BenchError::Setting(
            "give a duration or a number of requests",
        ));
    }
    if args.rate == Some(0) {
        return Err(BenchError::Setting("rate must be above 0"));
    }
    let mut seeds = Rng::new(args.seed);
    let mut gens = Vec::with_capacity(args.clients);
    for _ in 0..args.clients {
        gens.push(workload::Generator::new(
            &args.workload,
            args.mix,
            args.keyspace,
            &args.key_prefix,
            args.value_size,
            seeds.next_u64(),
        )?);
    }
    let mut before = Vec::with_capacity(args.nodes.len());
    for node in &args.nodes {
        before.push(nodes::total_calls(node).await?);
    }
    let mut streams = Vec::with_capacity(args.clients);
    for _ in 0..args.clients {
        let s = TcpStream::connect(&args.target)
            .await
            .map_err(|e| BenchError::Node {
                node: args.target.clone(),
                what: format!("cannot connect: {e}"),
            })?;
        // Batches are written whole; Nagle would only hold the next one back.
        let _ = s.set_nodelay(true);
        streams.push(s);
    }

    let start = Instant::now();
    let plan = Arc::new(client::Plan {
        pipeline: args.pipeline,
        deadline: (args.duration_ms > 0).then(|| start + Duration::from_millis(args.duration_ms)),
        remaining: args.requests.map(AtomicU64::new),
        rate_per_client: args.rate.map(|r| r as f64 / args.clients as f64),
    });
    let tasks: Vec<_> = streams
        .into_iter()
        .zip(gens)
        .map(|(s, g)| tokio::spawn(client::drive(s, g, plan.clone())))
        .collect();
    let mut latency = Histogram::default();
    let (mut ops, mut errors, mut viral_ops) = (0, 0, 0);
    let mut failures = Vec::new();
    for t in tasks {
        let tally = t
            .await
            .map_err(|e| BenchError::Internal(format!("client task failed: {e}")))?;
        latency.merge(&tally.latency);
        ops += tally.ops;
        errors += tally.errors;
        viral_ops += tally.viral_ops;
        failures.extend(tally.failure);
    }
    let elapsed = start.elapsed();

    let mut per_node = Vec::with_capacity(args.nodes.len());
    for (node, b) in args.nodes.iter().zip(before) {
        let after = nodes::total_calls(node).await?;
        per_node.push(NodeLoad {
            node: node.clone(),
            // The INFO that took `before` is counted by `after`.
            commands: after.saturating_sub(b).saturating_sub(1),
        });
    }
    Ok(Report {
        label: args.label(),
        ops,
        errors,
        elapsed,
        ops_per_sec: ops as f64 / elapsed.as_secs_f64().max(1e-9),
        p50_us: latency.percentile(0.5),
        p99_us: latency.percentile(0.99),
        p999_us: latency.percentile(0.999),
        max_us: latency.max(),
        viral_ops,
        imbalance: report::imbalance(&per_node),
        per_node,
        failures,
    })
}

/// Runs the benchmark on a runtime of its own with one thread, as `redis-benchmark` does,
/// leaving the other cores to the server and the proxy being measured.
pub fn run_blocking(args: BenchArgs) -> Result<Report, BenchError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| BenchError::Internal(format!("cannot start runtime: {e}")))?
        .block_on(run(args))
}
