//! Placement compatibility with a real twemproxy: keys are written through `nutcracker` to
//! four real `redis-server`s, then every server is asked what it holds, and
//! `Placement::node_for` must name the holder of every key.
//!
//! Self-contained on purpose (its own process handling and a tiny RESP client), so this
//! check does not lean on any of the crate's own parsing.

use saltshaker::backend::placement::{parse_server, Distribution, HashFn, NodeSpec, Placement};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

const NODES: usize = 4;
const KEYS: usize = 2000;
/// Out of twemproxy's order (it sorts servers by name length, then bytes), so a placement
/// that kept the file's order would fail the modula case.
const NAMES: [&str; NODES] = ["zeta", "alpha-long", "mu", "beta"];

fn have(tool: &str) -> bool {
    let ok = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("\n!!!!!! {tool} is not installed: SKIPPING twemproxy placement test !!!!!!\n");
    }
    ok
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

/// A child process killed (and reaped) on drop, so a failed assertion leaves nothing behind.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A scratch directory for nutcracker's config and log, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "saltshaker-twemproxy-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// ---- a tiny RESP client ----

#[derive(Debug, PartialEq)]
enum Reply {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Option<Vec<u8>>),
    Array(Vec<Reply>),
}

fn encode(args: &[&[u8]], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

fn read_reply(r: &mut impl BufRead) -> Reply {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line).expect("read reply line");
    assert!(line.ends_with(b"\r\n"), "truncated reply line {line:?}");
    let text = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
    match line[0] {
        b'+' => Reply::Simple(text),
        b'-' => Reply::Error(text),
        b':' => Reply::Int(text.parse().expect("integer reply")),
        b'$' => {
            let n: i64 = text.parse().expect("bulk length");
            if n < 0 {
                return Reply::Bulk(None);
            }
            let mut buf = vec![0; n as usize + 2];
            r.read_exact(&mut buf).expect("read bulk");
            buf.truncate(n as usize);
            Reply::Bulk(Some(buf))
        }
        b'*' => {
            let n: i64 = text.parse().expect("array length");
            Reply::Array((0..n.max(0)).map(|_| read_reply(r)).collect())
        }
        other => panic!("unexpected reply type {:?}", other as char),
    }
}

struct Conn {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Conn {
    fn open(port: u16) -> std::io::Result<Conn> {
        let w = TcpStream::connect(("127.0.0.1", port))?;
        w.set_read_timeout(Some(Duration::from_secs(20)))?;
        let r = BufReader::new(w.try_clone()?);
        Ok(Conn { w, r })
    }

    fn call(&mut self, args: &[&[u8]]) -> Reply {
        let mut out = Vec::new();
        encode(args, &mut out);
        self.w.write_all(&out).expect("write command");
        read_reply(&mut self.r)
    }

    /// True when PING is answered with PONG; false on any error. A proxy that is up but
    /// not yet connected to its servers may close the connection instead of answering.
    fn ping(&mut self) -> bool {
        let mut line = Vec::new();
        self.w.write_all(b"*1\r\n$4\r\nPING\r\n").is_ok()
            && self.r.read_until(b'\n', &mut line).is_ok()
            && line == b"+PONG\r\n"
    }

    /// Sends every command in one write, then reads the replies in order.
    fn pipeline(&mut self, cmds: &[Vec<&[u8]>]) -> Vec<Reply> {
        let mut out = Vec::new();
        for c in cmds {
            encode(c, &mut out);
        }
        self.w.write_all(&out).expect("write pipeline");
        cmds.iter().map(|_| read_reply(&mut self.r)).collect()
    }
}

/// Polls until `port` answers PING, or panics after a few seconds.
fn wait_ready(port: u16, what: &str) -> Conn {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(mut c) = Conn::open(port) {
            if c.ping() {
                return c;
            }
        }
        assert!(
            Instant::now() < deadline,
            "{what} on port {port} never answered PING"
        );
        sleep(Duration::from_millis(20));
    }
}

// ---- the pool under test ----

struct Redis {
    port: u16,
    _proc: Proc,
}

fn start_redis() -> Redis {
    let port = free_port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn redis-server");
    let proc = Proc(child);
    wait_ready(port, "redis-server");
    Redis { port, _proc: proc }
}

struct Case {
    hash: &'static str,
    dist: &'static str,
    /// Weight of each of the four servers.
    weights: [u32; NODES],
    hash_tag: Option<&'static str>,
    /// Explicit server names ("host:port:weight name").
    names: Option<[&'static str; NODES]>,
}

impl Case {
    fn ketama(hash: &'static str) -> Case {
        Case {
            hash,
            dist: "ketama",
            weights: [1; NODES],
            hash_tag: None,
            names: None,
        }
    }
}

/// 2,000 distinct keys: plain, hash-tagged, edge-case tags, and bytes >= 0x80 (which
/// twemproxy's hashes read as signed chars).
fn keys() -> Vec<Vec<u8>> {
    let mut keys: Vec<Vec<u8>> = Vec::with_capacity(KEYS);
    for i in 0..KEYS {
        let k = match i % 10 {
            0..=4 => format!("key:{i}").into_bytes(),
            5 => format!("{{user{}}}:field{i}", i % 37).into_bytes(),
            6 => format!("order:{{{}}}:{i}", i % 11).into_bytes(),
            7 => match i % 4 {
                0 => format!("empty{{}}tag{i}").into_bytes(),
                1 => format!("{{}}{{inner}}{i}").into_bytes(),
                2 => format!("open{{only{i}").into_bytes(),
                _ => format!("close}}first{{x}}{i}").into_bytes(),
            },
            8 => {
                let mut k = format!("bin:{i}:").into_bytes();
                k.extend_from_slice(&[0x80, 0xff, (i % 256) as u8, 0xc3, 0xa9]);
                k
            }
            _ => format!("caf\u{e9}:{i}:{}", "x".repeat(i % 29)).into_bytes(),
        };
        keys.push(k);
    }
    keys
}

/// Runs one twemproxy configuration over fresh (flushed) servers and checks every key.
fn check(redis: &[Redis], case: &Case) {
    for r in redis {
        assert_eq!(
            Conn::open(r.port).expect("connect").call(&[b"FLUSHALL"]),
            Reply::Simple("OK".into())
        );
    }
    let lines: Vec<String> = redis
        .iter()
        .zip(case.weights)
        .enumerate()
        .map(|(i, (r, w))| {
            let name = case.names.map_or(String::new(), |n| format!(" {}", n[i]));
            format!("127.0.0.1:{}:{w}{name}", r.port)
        })
        .collect();

    let dir = TempDir::new();
    let listen = free_port();
    let mut conf = format!(
        "pool:\n  listen: 127.0.0.1:{listen}\n  hash: {}\n  distribution: {}\n  redis: true\n  \
         auto_eject_hosts: false\n  timeout: 5000\n",
        case.hash, case.dist
    );
    if let Some(tag) = case.hash_tag {
        conf.push_str(&format!("  hash_tag: \"{tag}\"\n"));
    }
    conf.push_str("  servers:\n");
    for l in &lines {
        conf.push_str(&format!("   - {l}\n"));
    }
    let conf_path = dir.0.join("nutcracker.yml");
    std::fs::write(&conf_path, &conf).expect("write nutcracker.yml");
    let child = Command::new("nutcracker")
        .arg("-c")
        .arg(&conf_path)
        .arg("-o")
        .arg(dir.0.join("nutcracker.log"))
        .args(["-s", &free_port().to_string(), "-a", "127.0.0.1"])
        .arg("-p")
        .arg(dir.0.join("nutcracker.pid"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn nutcracker");
    let _nutcracker = Proc(child);
    let mut proxy = wait_ready(listen, "nutcracker");

    let keys = keys();
    let sets: Vec<Vec<&[u8]>> = keys.iter().map(|k| vec![&b"SET"[..], k, b"v"]).collect();
    for (chunk, replies) in sets.chunks(200).map(|c| (c, proxy.pipeline(c))) {
        for (cmd, reply) in chunk.iter().zip(replies) {
            assert_eq!(
                reply,
                Reply::Simple("OK".into()),
                "SET {:?} through nutcracker",
                cmd[1]
            );
        }
    }

    let mut holder: HashMap<Vec<u8>, usize> = HashMap::new();
    for (i, r) in redis.iter().enumerate() {
        let Reply::Array(items) = Conn::open(r.port).expect("connect").call(&[b"KEYS", b"*"])
        else {
            panic!("KEYS * did not return an array");
        };
        for item in items {
            let Reply::Bulk(Some(k)) = item else {
                panic!("KEYS item {item:?}")
            };
            assert!(
                holder.insert(k.clone(), i).is_none(),
                "key {k:?} on two servers"
            );
        }
    }
    assert_eq!(holder.len(), keys.len(), "every key is stored exactly once");

    let nodes: Vec<NodeSpec> = lines
        .iter()
        .map(|l| parse_server(l).expect("server line").1)
        .collect();
    let tag = case.hash_tag.map(|t| {
        let b = t.as_bytes();
        [b[0], b[1]]
    });
    let hash: HashFn = case.hash.parse().expect("hash name");
    let dist: Distribution = case.dist.parse().expect("distribution name");
    let placement = Placement::new(dist, hash, tag, &nodes);

    let mut per_node = [0usize; NODES];
    let mut wrong = Vec::new();
    for k in &keys {
        let actual = holder[k];
        per_node[actual] += 1;
        let predicted = placement.node_for(k);
        if predicted != actual {
            wrong.push((String::from_utf8_lossy(k).into_owned(), predicted, actual));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} keys misplaced for hash {} dist {} (key, predicted, actual), first: {:?}",
        wrong.len(),
        keys.len(),
        case.hash,
        case.dist,
        &wrong[..wrong.len().min(10)]
    );
    // Every node took a share, so the check exercised the whole continuum; libmemcached's
    // crc32 yields 15 bits, which on a 32-bit continuum all land before the first point.
    if !(case.hash == "crc32" && case.dist == "ketama") {
        assert!(
            per_node.iter().all(|&n| n > 0),
            "keys per node {per_node:?}"
        );
    }
}

fn pool() -> Option<Vec<Redis>> {
    if !have("redis-server") || !have("nutcracker") {
        return None;
    }
    Some((0..NODES).map(|_| start_redis()).collect())
}

#[test]
fn ketama_fnv1a_64_matches_nutcracker() {
    let Some(redis) = pool() else { return };
    check(&redis, &Case::ketama("fnv1a_64"));
}

#[test]
fn ketama_murmur_with_unequal_weights_and_hash_tag_matches_nutcracker() {
    let Some(redis) = pool() else { return };
    check(
        &redis,
        &Case {
            weights: [1, 2, 3, 5],
            hash_tag: Some("{}"),
            ..Case::ketama("murmur")
        },
    );
}

#[test]
fn ketama_md5_with_explicit_names_matches_nutcracker() {
    let Some(redis) = pool() else { return };
    check(
        &redis,
        &Case {
            names: Some(NAMES),
            ..Case::ketama("md5")
        },
    );
}

/// The remaining hashes and modula, over one set of servers to keep the run short.
#[test]
fn every_other_hash_and_modula_match_nutcracker() {
    let Some(redis) = pool() else { return };
    for hash in [
        "one_at_a_time",
        "crc16",
        "crc32",
        "crc32a",
        "fnv1_64",
        "fnv1_32",
        "fnv1a_32",
        "hsieh",
        "jenkins",
    ] {
        check(&redis, &Case::ketama(hash));
    }
    check(
        &redis,
        &Case {
            weights: [1, 2, 1, 3],
            hash_tag: Some("{}"),
            ..Case::ketama("md5")
        },
    );
    check(
        &redis,
        &Case {
            dist: "modula",
            weights: [2, 1, 3, 1],
            ..Case::ketama("fnv1a_64")
        },
    );
    check(
        &redis,
        &Case {
            dist: "modula",
            ..Case::ketama("crc32a")
        },
    );
    check(
        &redis,
        &Case {
            dist: "modula",
            names: Some(NAMES),
            weights: [1, 3, 1, 2],
            ..Case::ketama("murmur")
        },
    );
    check(
        &redis,
        &Case {
            dist: "modula",
            weights: [1, 1, 2, 1],
            ..Case::ketama("crc32")
        },
    );
}
