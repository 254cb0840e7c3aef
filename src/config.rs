//! Startup settings: the YAML file, the command-line overrides, and strict validation.
//!
//! Units are in the names (`request_timeout_ms`, `max_bulk_bytes`), unknown fields are
//! rejected, and every error names the file, line, column and field, so `saltshaker check`
//! points an SRE straight at the problem. Defaults are declared next to each field.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

pub use crate::auth::{AuthConfig, UserConfig};
pub use crate::backend::BackendConfig;
pub use crate::net::tls::{ClientTlsConfig, ServerTlsConfig};

use serde::{Deserialize, Serialize};

/// The whole configuration file.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where clients connect. Default `127.0.0.1:6380`.
    pub listen: String,
    /// Admin HTTP (/metrics, /healthz, /readyz, /hotkeys). Default `127.0.0.1:9121`.
    pub admin: String,
    /// Worker threads; 0 = one per core. Default 1: the workers share each node's
    /// connections and gather their writes (`backend::wire`), which costs the proxy a
    /// cross-thread wake per reply to another worker's session; one thread holds nothing
    /// (README.md, "Choosing threads").
    pub threads: usize,
    pub backend: BackendConfig,
    pub limits: LimitsConfig,
    pub auth: AuthConfig,
    /// Path of the hot-key rules file, if any.
    pub rules: Option<PathBuf>,
    /// How hot keys are shown on /hotkeys and /metrics.
    pub hotkeys: HotkeysConfig,
    /// The read-hot cache's memory bounds (which keys are cached is up to the rules).
    pub cache: CacheConfig,
    /// Unix socket where this process waits to hand its listening sockets to a successor
    /// started with `--upgrade` (zero-downtime upgrade). None = upgrades disabled.
    pub upgrade_socket: Option<PathBuf>,
    /// TLS for clients: on `listen`, or on a port of its own (`tls.listen`).
    pub tls: Option<ServerTlsConfig>,
    /// A file holding the bearer token the admin HTTP port requires (all but /healthz
    /// and /readyz). None = no token.
    pub admin_token_file: Option<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:6380".into(),
            admin: "127.0.0.1:9121".into(),
            threads: 1,
            backend: BackendConfig::default(),
            limits: LimitsConfig::default(),
            auth: AuthConfig::default(),
            rules: None,
            upgrade_socket: None,
            cache: CacheConfig::default(),
            hotkeys: HotkeysConfig::default(),
            tls: None,
            admin_token_file: None,
        }
    }
}

/// Views of hot keys.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HotkeysConfig {
    /// Show key names as `h:` + a hex hash on /hotkeys and in metric labels, for keys that
    /// carry user data. Default false.
    pub hash_names: bool,
    /// Most per-key series on /metrics (hottest first). Default 64.
    pub max_key_series: usize,
}

impl Default for HotkeysConfig {
    fn default() -> Self {
        HotkeysConfig {
            hash_names: false,
            max_key_series: 64,
        }
    }
}

/// Bounds of the read-hot cache.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// false turns the cache and its tracking connections off whatever the rules say.
    pub enabled: bool,
    /// Most cached replies. Default 100000.
    pub max_entries: u64,
    /// Most bytes of cached replies (keys and requests included). Default 64 MiB.
    pub max_bytes: u64,
    /// How long a reader waits for another reader's fill before fetching itself.
    pub fill_wait_ms: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            enabled: true,
            max_entries: 100_000,
            max_bytes: 64 * 1024 * 1024,
            fill_wait_ms: 1000,
        }
    }
}

/// Limits, with Redis's own defaults.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest bulk string a client may send (Redis `proto-max-bulk-len`).
    pub max_bulk_bytes: usize,
    /// Most arguments in one command (Redis's multibulk limit).
    pub max_args: usize,
    /// Longest inline command line.
    pub max_inline_bytes: usize,
    /// Unparsed input plus unsent replies one client may hold (Redis `client-query-buffer-limit`).
    pub max_pending_bytes: usize,
    /// Most client connections at once; further ones are refused with an error.
    pub max_clients: usize,
    /// Replies one client may leave unread before it is closed (Redis's
    /// `client-output-buffer-limit` hard limit); 0 = no limit.
    pub max_output_bytes: usize,
    /// Most keys client-side caching remembers for the proxy's tracking clients (Redis's
    /// `tracking-table-max-keys`); past it a key is forgotten and its clients told.
    pub tracking_max_keys: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_bulk_bytes: 512 * 1024 * 1024,
            max_args: 1024 * 1024,
            max_inline_bytes: 64 * 1024,
            max_pending_bytes: 1024 * 1024 * 1024,
            max_clients: 10_000,
            max_output_bytes: 256 * 1024 * 1024,
            tracking_max_keys: 1_000_000,
        }
    }
}

/// A configuration problem, located.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    pub file: String,
    pub line: usize,
    pub column: usize,
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}:{}: {}: {}",
            self.file,
            self.line,
            self.column,
            if self.field.is_empty() {
                "(document)"
            } else {
                &self.field
            },
            self.message
        )
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let (text, file) = read_file(path)?;
        let mut cfg = Config::parse(&text, &file)?;
        // Paths in the file are relative to the file's folder, not to where we run.
        if let Some(dir) = path.parent() {
            let mut paths = vec![
                &mut cfg.rules,
                &mut cfg.upgrade_socket,
                &mut cfg.admin_token_file,
            ];
            if let Some(t) = cfg.tls.as_mut() {
                paths.push(&mut t.client_ca);
                let (cert, key) = (&mut t.cert, &mut t.key);
                for p in [cert, key] {
                    if p.is_relative() {
                        *p = dir.join(&*p);
                    }
                }
            }
            let b = &mut cfg.backend;
            for t in b.tls.iter_mut().chain(b.tls_per_node.values_mut()) {
                paths.extend([&mut t.ca, &mut t.cert, &mut t.key]);
            }
            for p in paths.into_iter().flatten() {
                if p.is_relative() {
                    *p = dir.join(&*p);
                }
            }
        }
        Ok(cfg)
    }

    /// Parses and validates YAML text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Config, ConfigError> {
        let cfg: Config = parse_yaml(text, file)?;
        cfg.validate().map_err(|(field, message)| {
            let (line, column) = locate_field(text, &field);
            ConfigError {
                file: file.into(),
                line,
                column,
                field,
                message,
            }
        })?;
        Ok(cfg)
    }

    /// Checks values that parse but make no sense. Returns (field, problem).
    pub fn validate(&self) -> Result<(), (String, String)> {
        check_addr("listen", &self.listen)?;
        check_addr("admin", &self.admin)?;
        if let Some(t) = &self.tls {
            if let Some(l) = &t.listen {
                check_addr("tls.listen", l)?;
                if l == &self.listen {
                    return Err((
                        "tls.listen".into(),
                        "is the same as listen; leave tls.listen out to serve TLS on listen".into(),
                    ));
                }
            }
            if t.handshake_timeout_ms == 0 {
                return Err((
                    "tls.handshake_timeout_ms".into(),
                    "must be at least 1".into(),
                ));
            }
        }
        crate::auth::Users::new(&self.auth)?;
        for addr in self.backend.tls_per_node.keys() {
            check_addr(&format!("backend.tls_per_node.{addr}"), addr)?;
        }
        let b = &self.backend;
        if let Some(c) = &b.cluster {
            if !b.nodes.is_empty() {
                return Err((
                    "backend.cluster".into(),
                    "give either backend.nodes (one node or a pool) or backend.cluster, not both"
                        .into(),
                ));
            }
            if c.seeds.is_empty() {
                return Err((
                    "backend.cluster.seeds".into(),
                    "at least one seed node (HOST:PORT) is required".into(),
                ));
            }
            for (i, s) in c.seeds.iter().enumerate() {
                check_addr(&format!("backend.cluster.seeds[{i}]"), s)?;
            }
        } else if b.nodes.is_empty() {
            return Err((
                "backend.nodes".into(),
                "at least one node is required (or backend.cluster with seed nodes)".into(),
            ));
        }
        for (i, n) in b.nodes.iter().enumerate() {
            crate::backend::placement::parse_server(n)
                .map_err(|e| (format!("backend.nodes[{i}]"), e.to_string()))?;
        }
        b.hash
            .parse::<crate::backend::placement::HashFn>()
            .map_err(|_| {
                (
                    "backend.hash".to_string(),
                    format!("unknown hash function {:?}", b.hash),
                )
            })?;
        b.distribution
            .parse::<crate::backend::placement::Distribution>()
            .map_err(|_| {
                (
                    "backend.distribution".to_string(),
                    format!("unknown distribution {:?}", b.distribution),
                )
            })?;
        if let Some(t) = &b.hash_tag {
            if t.len() != 2 {
                return Err((
                    "backend.hash_tag".into(),
                    "must be exactly two characters, like \"{}\"".into(),
                ));
            }
        }
        if b.connections_per_node == 0 || b.connections_per_node > 64 {
            return Err((
                "backend.connections_per_node".into(),
                "must be between 1 and 64".into(),
            ));
        }
        if b.reconnect_min_ms == 0 || b.reconnect_max_ms < b.reconnect_min_ms {
            return Err((
                "backend.reconnect_min_ms".into(),
                "must be > 0 and not above reconnect_max_ms".into(),
            ));
        }
        let l = &self.limits;
        if l.max_bulk_bytes < 1024 {
            return Err((
                "limits.max_bulk_bytes".into(),
                "must be at least 1024".into(),
            ));
        }
        if l.max_args == 0 {
            return Err(("limits.max_args".into(), "must be at least 1".into()));
        }
        if l.max_inline_bytes < 64 {
            return Err((
                "limits.max_inline_bytes".into(),
                "must be at least 64".into(),
            ));
        }
        if l.max_pending_bytes < l.max_inline_bytes {
            return Err((
                "limits.max_pending_bytes".into(),
                "must be at least max_inline_bytes".into(),
            ));
        }
        if self.cache.max_entries == 0 || self.cache.max_bytes < 1024 {
            return Err((
                "cache.max_bytes".into(),
                "max_entries must be > 0 and max_bytes at least 1024".into(),
            ));
        }
        if l.max_clients == 0 {
            return Err(("limits.max_clients".into(), "must be at least 1".into()));
        }
        Ok(())
    }

    pub fn listen_addr(&self) -> SocketAddr {
        self.listen.parse().expect("validated")
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin.parse().expect("validated")
    }
}

fn check_addr(field: &str, v: &str) -> Result<(), (String, String)> {
    v.parse::<SocketAddr>().map(|_| ()).map_err(|_| {
        (
            field.to_string(),
            format!("{v:?} is not HOST:PORT with a numeric IP and port"),
        )
    })
}

/// Reads a YAML file for `load`: its text and the name errors give it.
pub fn read_file(path: &Path) -> Result<(String, String), ConfigError> {
    let file = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => Ok((text, file)),
        Err(e) => Err(ConfigError {
            file,
            line: 0,
            column: 0,
            field: String::new(),
            message: format!("cannot read: {e}"),
        }),
    }
}

/// Deserializes YAML into `T`, turning the first error into a located `ConfigError`.
pub fn parse_yaml<T: serde::de::DeserializeOwned>(
    text: &str,
    file: &str,
) -> Result<T, ConfigError> {
    let de = serde_yaml_ng::Deserializer::from_str(text);
    serde_path_to_error::deserialize::<_, T>(de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        let (line, column) = match inner.location() {
            Some(loc) => (loc.line(), loc.column()),
            None => locate_field(text, &field),
        };
        ConfigError {
            file: file.into(),
            line,
            column,
            field: if field == "." { String::new() } else { field },
            message: strip_location(&inner.to_string()),
        }
    })
}

/// serde_yaml_ng appends " at line L column C"; we print the location ourselves.
fn strip_location(msg: &str) -> String {
    match msg.find(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

/// Best-effort position of a dotted field (`backend.nodes[1]`) in the YAML text, for
/// errors found after parsing: the line of the last key in the path and, for an index,
/// the line of that element in a block sequence. 1-based.
fn locate_field(text: &str, field: &str) -> (usize, usize) {
    let last = field.rsplit('.').next().unwrap_or(field);
    let name = last.split('[').next().unwrap_or(last);
    let index: Option<usize> = last
        .split('[')
        .nth(1)
        .and_then(|i| i.trim_end_matches(']').parse().ok());
    if name.is_empty() {
        return (1, 1);
    }
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let Some(rest) = trimmed.strip_prefix(name) else {
            continue;
        };
        let Some(value) = rest.trim_start().strip_prefix(':') else {
            continue;
        };
        let Some(idx) = index else {
            return (i + 1, indent + 1);
        };
        if value.trim().is_empty() {
            // Block sequence: the idx-th "- " line below, deeper than the key.
            let items = lines[i + 1..].iter().enumerate().filter(|(_, l)| {
                let t = l.trim_start();
                t.starts_with('-') && l.len() - t.len() >= indent
            });
            if let Some((j, l)) = items.clone().nth(idx) {
                return (i + 2 + j, l.len() - l.trim_start().len() + 1);
            }
        } else if let Some(pos) = nth_flow_item(line, idx) {
            return (i + 1, pos + 1);
        }
        return (i + 1, indent + 1);
    }
    (1, 1)
}

/// Column (0-based) of item `idx` of a one-line flow sequence `key: [a, b, c]`.
fn nth_flow_item(line: &str, idx: usize) -> Option<usize> {
    let open = line.find('[')?;
    let mut pos = open + 1;
    for (n, item) in line[open + 1..].split(',').enumerate() {
        if n == idx {
            return Some(pos + (item.len() - item.trim_start().len()));
        }
        pos += item.len() + 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str =
        "listen: 127.0.0.1:7000\nbackend:\n  nodes: [\"127.0.0.1:7001:1\", \"127.0.0.1:7002\"]\n";

    #[test]
    fn good_file_parses_with_defaults() {
        let c = Config::parse(GOOD, "s.yaml").unwrap();
        assert_eq!(c.listen, "127.0.0.1:7000");
        assert_eq!(c.backend.nodes.len(), 2);
        assert_eq!(c.backend.hash, "fnv1a_64");
        assert_eq!(c.limits.max_bulk_bytes, 512 * 1024 * 1024);
    }

    #[test]
    fn unknown_field_names_file_line_and_field() {
        let text =
            "listen: 127.0.0.1:7000\nbackend:\n  nodes: [\"127.0.0.1:7001\"]\n  hashh: md5\n";
        let e = Config::parse(text, "s.yaml").unwrap_err();
        assert_eq!(e.file, "s.yaml");
        assert_eq!(e.line, 4, "{e}");
        assert!(e.field.starts_with("backend"), "{e}");
        assert!(e.to_string().contains("hashh"), "{e}");
    }

    #[test]
    fn bad_value_is_located_after_parsing() {
        let text = "listen: nowhere\nbackend:\n  nodes: [\"127.0.0.1:7001\"]\n";
        let e = Config::parse(text, "s.yaml").unwrap_err();
        assert_eq!((e.line, e.field.as_str()), (1, "listen"), "{e}");
    }

    #[test]
    fn wrong_type_is_reported_with_field() {
        let text = "backend:\n  nodes: [\"127.0.0.1:7001\"]\n  connections_per_node: many\n";
        let e = Config::parse(text, "s.yaml").unwrap_err();
        assert_eq!(e.line, 3, "{e}");
        assert!(e.field.contains("connections_per_node"), "{e}");
    }

    #[test]
    fn bad_element_of_a_block_list_points_at_its_line() {
        let text = "backend:\n  nodes:\n    - \"127.0.0.1:7001\"\n    - \"127.0.0.1:70000\"\n";
        let e = Config::parse(text, "s.yaml").unwrap_err();
        assert_eq!(
            (e.line, e.column, e.field.as_str()),
            (4, 5, "backend.nodes[1]"),
            "{e}"
        );
        let text = "backend:\n  nodes: [\"127.0.0.1:7001\", \"127.0.0.1:99999\"]\n";
        let e = Config::parse(text, "s.yaml").unwrap_err();
        assert_eq!((e.line, e.column), (2, 29), "{e}");
    }

    #[test]
    fn empty_pool_is_refused() {
        let e = Config::parse("listen: 127.0.0.1:1\n", "s.yaml").unwrap_err();
        assert_eq!(e.field, "backend.nodes");
    }
}
