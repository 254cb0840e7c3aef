//! The `saltshaker` command: parse flags, set up logging, load config, run the library.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use saltshaker::config::Config;

#[derive(Parser, Debug)]
#[command(
    name = "saltshaker",
    version,
    about = "A Redis proxy that finds hot keys and takes the pressure off them"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Configuration file (YAML). Flags override it.
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    /// Client listen address, HOST:PORT.
    #[arg(long)]
    listen: Option<String>,
    /// Backend nodes: HOST:PORT[:WEIGHT],... (one node, or a twemproxy-compatible pool).
    #[arg(long)]
    nodes: Option<String>,
    /// A Redis Cluster behind the proxy: seed nodes HOST:PORT,... (any one that answers).
    #[arg(long, conflicts_with = "nodes")]
    cluster: Option<String>,
    /// On a cluster, where single-slot reads go: master, prefer_replica or replica.
    #[arg(long, requires = "cluster")]
    read_from: Option<saltshaker::backend::ReadFrom>,
    /// Admin HTTP address, HOST:PORT.
    #[arg(long)]
    admin: Option<String>,
    /// Hot-key rules file.
    #[arg(long)]
    rules: Option<PathBuf>,
    /// Key hash function (twemproxy names: fnv1a_64, murmur, md5, ...).
    #[arg(long)]
    hash: Option<String>,
    /// Key distribution: ketama or modula.
    #[arg(long)]
    distribution: Option<String>,
    /// Hash tag, two characters such as "{}".
    #[arg(long)]
    hash_tag: Option<String>,
    /// Password clients must AUTH with.
    #[arg(long)]
    password: Option<String>,
    /// Worker threads (default 1; 0 = one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// A client waiting longer than this for a node gets an error (0 = wait forever).
    #[arg(long)]
    request_timeout_ms: Option<u64>,
    /// Unix socket for zero-downtime upgrades (this process hands over its sockets there).
    #[arg(long)]
    upgrade_socket: Option<PathBuf>,
    /// Take the listening sockets over from the process waiting at --upgrade-socket.
    #[arg(long)]
    upgrade: bool,
    /// Log filter, e.g. info or saltshaker=debug.
    #[arg(long, default_value = "info")]
    log_level: String,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Validate a configuration file and exit.
    Check { file: PathBuf },
    /// Load generator: uniform, Zipf or one-viral-key workloads of GET/SET/INCR.
    Bench {
        #[command(flatten)]
        args: saltshaker::loadgen::BenchArgs,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Live view of hot keys, refreshing in place like top.
    Top {
        /// The proxy's admin address, HOST:PORT.
        #[arg(long, default_value = "127.0.0.1:9121")]
        admin: String,
        /// Refresh interval.
        #[arg(long, default_value_t = 1000)]
        interval_ms: u64,
        /// Print one frame and exit.
        #[arg(long)]
        once: bool,
        /// A file holding the admin port's bearer token (the proxy's `admin_token_file`).
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// `rate` (as the proxy lists keys: hottest by reads or writes first) or `bytes`
        /// (by BYTES/S, what their reads move).
        #[arg(long, default_value = "rate", value_parser = ["rate", "bytes"])]
        sort: String,
    },
    /// Print the SHA-256 of a password read from stdin, for `auth.users[].passwords_sha256`.
    Passwd,
    /// Run the fleet simulator (admission and salting code in virtual time) and print its
    /// report as markdown (bench/README.md, "Admission control").
    Simulate,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Cmd::Check { file }) = &cli.cmd {
        return check(file);
    }
    if let Some(Cmd::Bench { args, json }) = &cli.cmd {
        return match saltshaker::loadgen::run_blocking(args.clone()) {
            Ok(report) => {
                println!(
                    "{}",
                    if *json {
                        report.to_json()
                    } else {
                        report.to_text()
                    }
                );
                if report.errors > 0 {
                    ExitCode::FAILURE
                } else {
                    ExitCode::SUCCESS
                }
            }
            Err(e) => {
                eprintln!("saltshaker bench: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(Cmd::Simulate) = &cli.cmd {
        print!("{}", saltshaker::admit::sim::report());
        return ExitCode::SUCCESS;
    }
    if let Some(Cmd::Passwd) = &cli.cmd {
        let mut line = String::new();
        if std::io::stdin().read_line(&mut line).is_err()
            || line.trim_end_matches(['\r', '\n']).is_empty()
        {
            eprintln!("saltshaker passwd: give the password on stdin");
            return ExitCode::FAILURE;
        }
        let pass = line.trim_end_matches(['\r', '\n']);
        println!(
            "{}",
            saltshaker::auth::hex(&saltshaker::auth::sha256(pass.as_bytes()))
        );
        return ExitCode::SUCCESS;
    }
    if let Some(Cmd::Top {
        admin,
        interval_ms,
        once,
        token_file,
        sort,
    }) = &cli.cmd
    {
        let token = match token_file {
            Some(p) => match std::fs::read_to_string(p) {
                Ok(t) => Some(t.lines().next().unwrap_or_default().trim().to_string()),
                Err(e) => {
                    eprintln!("saltshaker top: {}: {e}", p.display());
                    return ExitCode::FAILURE;
                }
            },
            None => None,
        };
        let args = saltshaker::top::TopArgs {
            admin: admin.clone(),
            interval_ms: *interval_ms,
            once: *once,
            token,
            sort_by_bytes: sort == "bytes",
        };
        return match saltshaker::top::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("saltshaker top: {e}");
                ExitCode::FAILURE
            }
        };
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(&cli.log_level)
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cfg = match load(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("saltshaker: {e}");
            return ExitCode::from(2);
        }
    };
    // The main thread's runtime: the control tasks (admin, rules, the salt coordinator,
    // detection's aggregation) and worker 0's clients. `proxy::serve` starts the other
    // workers, each a thread with a runtime of its own (docs/architecture.md, "Worker
    // threads").
    let built = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    let rt = match built {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("saltshaker: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let upgrade = cli.upgrade;
    let res = rt.block_on(async move {
        let (tx, _) = tokio::sync::watch::channel(false);
        let signal_tx = tx.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutdown requested: draining client connections");
            let _ = signal_tx.send(true);
            // Whatever the process is waiting on, a signal ends it within the drain time.
            std::thread::spawn(|| {
                std::thread::sleep(saltshaker::DRAIN_TIMEOUT + std::time::Duration::from_secs(2));
                eprintln!("saltshaker: still running past the drain time after a signal; exiting");
                std::process::exit(1);
            });
        });
        saltshaker::run(cfg, tx, upgrade).await
    });
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("saltshaker: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Validates a config file (and the rules file it names) or a rules file (a document
/// with `version:`), printing `FILE:LINE:COL: field: problem` for the first problem.
fn check(file: &std::path::Path) -> ExitCode {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let is_rules = text.lines().any(|l| l.starts_with("version:"));
    let res = if is_rules {
        saltshaker::rules::Rules::load(file).map(|_| ())
    } else {
        Config::load(file).and_then(|c| match &c.rules {
            Some(r) => saltshaker::rules::Rules::load(r).map(|_| ()),
            None => Ok(()),
        })
    };
    match res {
        Ok(()) => {
            println!("{}: ok", file.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(2)
        }
    }
}

/// The file (if any), then flags on top, then validation.
fn load(cli: &Cli) -> Result<Config, String> {
    let mut cfg = match &cli.config {
        Some(p) => Config::load(p).map_err(|e| e.to_string())?,
        None => Config::default(),
    };
    if let Some(v) = &cli.listen {
        cfg.listen = v.clone();
    }
    if let Some(v) = &cli.admin {
        cfg.admin = v.clone();
    }
    if let Some(v) = &cli.nodes {
        cfg.backend.nodes = v
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
    }
    if let Some(v) = &cli.cluster {
        let seeds = v
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        let c = cfg.backend.cluster.get_or_insert_with(Default::default);
        c.seeds = seeds;
        if let Some(r) = cli.read_from {
            c.read_from = r;
        }
        cfg.backend.nodes.clear();
    }
    if let Some(v) = &cli.rules {
        cfg.rules = Some(v.clone());
    }
    if let Some(v) = &cli.hash {
        cfg.backend.hash = v.clone();
    }
    if let Some(v) = &cli.distribution {
        cfg.backend.distribution = v.clone();
    }
    if let Some(v) = &cli.hash_tag {
        cfg.backend.hash_tag = Some(v.clone());
    }
    if let Some(v) = &cli.password {
        cfg.auth.password = Some(v.clone());
    }
    if let Some(v) = &cli.upgrade_socket {
        cfg.upgrade_socket = Some(v.clone());
    }
    if let Some(v) = cli.request_timeout_ms {
        cfg.backend.request_timeout_ms = v;
    }
    if let Some(v) = cli.threads {
        cfg.threads = v;
    }
    cfg.validate()
        .map_err(|(field, msg)| format!("{field}: {msg}"))?;
    Ok(cfg)
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
