//! Hot by what it costs: keys that load a node with bytes or with node time while their
//! read rate stays far under `hot_at_per_sec`. Real redis-servers, the real proxy with its
//! default rules, and readers paced at a known rate.

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

fn hotkeys(p: &Proxy) -> Value {
    p.hotkeys()
}

fn entry(snap: &Value, key: &str) -> Option<Value> {
    snap["keys"]
        .as_array()?
        .iter()
        .find(|k| k["key"] == key)
        .cloned()
}

fn hot_by(e: &Value) -> Vec<String> {
    e["hot_by"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// One field of a node's INFO (all sections).
fn info_field(r: &Redis, field: &str) -> u64 {
    let info = r.client().cmd(&["INFO", "all"]).as_str();
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in INFO"))
}

/// The raw bytes of one RESP2 reply, read without building it (a 100,000-member reply
/// takes too long to build in a debug test build at the rates these tests need).
fn raw_reply(r: &mut BufReader<TcpStream>, out: &mut Vec<u8>) {
    let mut line = Vec::new();
    r.read_until(b'\n', &mut line).expect("reply line");
    out.extend_from_slice(&line);
    let n: i64 = std::str::from_utf8(&line[1..line.len() - 2])
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    match line[0] {
        b'*' => (0..n.max(0)).for_each(|_| raw_reply(r, out)),
        b'$' if n >= 0 => {
            let start = out.len();
            out.resize(start + n as usize + 2, 0);
            r.read_exact(&mut out[start..]).expect("bulk");
        }
        _ => {}
    }
}

fn raw_cmd(addr: &str, args: &[&str]) -> Vec<u8> {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
    let mut r = BufReader::new(s);
    r.get_mut().write_all(&encode(args)).expect("send");
    let mut out = Vec::new();
    raw_reply(&mut r, &mut out);
    out
}

/// Readers sending `args` at `per_sec` each (paced), checking every reply is `expect`
/// byte for byte; `reads` and `bytes` count what they got.
struct Readers {
    stop: Arc<AtomicBool>,
    reads: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    handles: Vec<JoinHandle<Result<(), String>>>,
}

impl Readers {
    fn start(addr: &str, args: &[&str], expect: Vec<u8>, threads: usize, per_sec: u64) -> Readers {
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new(AtomicU64::new(0));
        let expect = Arc::new(expect);
        let wire = encode(args);
        let handles = (0..threads)
            .map(|_| {
                let (stop, reads, bytes) = (stop.clone(), reads.clone(), bytes.clone());
                let (expect, wire, addr) = (expect.clone(), wire.clone(), addr.to_string());
                std::thread::spawn(move || {
                    let mut s = TcpStream::connect(&addr).map_err(|e| e.to_string())?;
                    s.set_read_timeout(Some(Duration::from_secs(10))).ok();
                    let mut buf = vec![0u8; expect.len()];
                    let every = Duration::from_micros(1_000_000 / per_sec);
                    let mut next = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        s.write_all(&wire).map_err(|e| e.to_string())?;
                        s.read_exact(&mut buf).map_err(|e| e.to_string())?;
                        if buf[..] != expect[..] {
                            return Err(format!(
                                "a read differs from the node's reply: {:?}",
                                String::from_utf8_lossy(&buf[..buf.len().min(64)])
                            ));
                        }
                        reads.fetch_add(1, Ordering::Relaxed);
                        bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
                        next += every;
                        if let Some(d) = next.checked_duration_since(Instant::now()) {
                            std::thread::sleep(d);
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        Readers {
            stop,
            reads,
            bytes,
            handles,
        }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for h in self.handles {
            if let Err(e) = h.join().expect("reader thread") {
                panic!("reader: {e}");
            }
        }
    }
}

/// A sorted set of `n` members `player:I` with score I, in ZADDs of 1000.
fn fill_zset(c: &mut Client, key: &str, n: usize) {
    for chunk in 0..n.div_ceil(1000) {
        let mut args = vec!["ZADD".to_string(), key.to_string()];
        for i in chunk * 1000..((chunk + 1) * 1000).min(n) {
            args.push(i.to_string());
            args.push(format!("player:{i}"));
        }
        c.cmd(&args);
    }
}

/// Waits until `key` is listed hot by `by`; returns how long it took.
fn until_hot_by(p: &Proxy, key: &str, by: &str, within: Duration) -> Duration {
    let start = Instant::now();
    loop {
        if let Some(e) = entry(&hotkeys(p), key) {
            if e["state"] == "hot" && hot_by(&e).iter().any(|b| b == by) {
                return start.elapsed();
            }
        }
        assert!(
            start.elapsed() < within,
            "{key} not hot by {by} within {within:?}: {}",
            hotkeys(p)
        );
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// What the owner node served, and what the clients got, over `d` of steady load.
fn served_over(node: &Redis, cmd: &str, r: &Readers, d: Duration) -> (u64, u64, u64, u64) {
    let calls0 = calls(node, cmd) as u64;
    let out0 = info_field(node, "total_net_output_bytes");
    let (reads0, bytes0) = (
        r.reads.load(Ordering::Relaxed),
        r.bytes.load(Ordering::Relaxed),
    );
    std::thread::sleep(d);
    let calls = calls(node, cmd) as u64 - calls0;
    let out = info_field(node, "total_net_output_bytes") - out0;
    let reads = r.reads.load(Ordering::Relaxed) - reads0;
    let bytes = r.bytes.load(Ordering::Relaxed) - bytes0;
    (calls, reads, out, bytes)
}

#[test]
fn a_big_value_read_400_times_a_second_is_hot_by_bytes_and_leaves_the_node() {
    need_redis();
    let _serial = one_at_a_time();
    let nodes = pool(2);
    let p = Proxy::start(&nodes.iter().collect::<Vec<_>>(), &[]);
    let value = "v".repeat(512 * 1024);
    p.client().cmd(&["SET", "page:home", &value]);
    let owner = &nodes[owner(&nodes, "page:home")];
    let expect = raw_cmd(&owner.addr(), &["GET", "page:home"]);
    assert_eq!(expect.len(), 512 * 1024 + 11);

    // 4 x 100 reads a second: 200 MiB/s, a fifth of the default read-hot rate.
    let readers = Readers::start(&p.addr(), &["GET", "page:home"], expect, 4, 100);
    let took = until_hot_by(&p, "page:home", "bytes", Duration::from_secs(3));
    eprintln!("hot by bytes after {took:?}");
    assert!(took <= Duration::from_secs(1), "reported after {took:?}");
    let e = entry(&hotkeys(&p), "page:home").expect("listed");
    assert!(e["reads_per_sec"].as_f64().unwrap_or(0.0) < 2000.0, "{e}");
    let bps = e["bytes_per_sec"].as_f64().unwrap_or(0.0);
    assert!(bps > 16.0 * 1024.0 * 1024.0, "{e}");
    assert_eq!(e["read_hot_by"], "rules", "{e}");

    // From then on the node serves at most a tenth of the reads, and its bytes out say so.
    std::thread::sleep(Duration::from_millis(300));
    let (calls, reads, out, bytes) = served_over(owner, "get", &readers, Duration::from_secs(2));
    eprintln!("node: {calls} GETs, {out} bytes out; clients: {reads} reads, {bytes} bytes");
    assert!(reads >= 400, "the readers kept up: {reads} reads in 2 s");
    assert!(calls * 10 <= reads, "node served {calls} of {reads} reads");
    assert!(out * 10 <= bytes, "node sent {out} of {bytes} bytes");

    let m = p.admin_get("/metrics").1;
    assert!(
        m.contains("saltshaker_hot_key_bytes_per_second{key=\"page:home\"}"),
        "{m}"
    );
    assert!(m.contains("saltshaker_hot_keys{kind=\"bytes\"} 1"), "{m}");
    readers.stop();
    // Not stale after a write.
    p.client().cmd(&["SET", "page:home", "new"]);
    assert_eq!(p.client().cmd(&["GET", "page:home"]).as_str(), "new");
}

#[test]
fn a_big_sorted_set_read_whole_is_hot_by_node_time_and_never_stale() {
    need_redis();
    let _serial = one_at_a_time();
    let nodes = pool(2);
    let p = Proxy::start(&nodes.iter().collect::<Vec<_>>(), &[]);
    let mut c = p.client();
    fill_zset(&mut c, "board", 100_000);
    // The fill's 100 ZADDs are writes of the key: within the detector's window they would
    // make its cache look as if writes refilled it (`policy::DECLINE_FILL_SHARE`), and the
    // node would serve the reads until the window passed. Two windows later they are gone.
    std::thread::sleep(Duration::from_millis(2100));
    let owner = &nodes[owner(&nodes, "board")];
    let zrange = ["ZRANGE", "board", "0", "-1"];
    let expect = raw_cmd(&owner.addr(), &zrange);

    // 2 x 100 a second (the node alone managed about 120 a second of these here).
    let readers = Readers::start(&p.addr(), &zrange, expect, 2, 100);
    let took = until_hot_by(&p, "board", "node_time", Duration::from_secs(3));
    eprintln!("hot by node time after {took:?}");
    assert!(took <= Duration::from_secs(1), "reported after {took:?}");
    let e = entry(&hotkeys(&p), "board").expect("listed");
    assert!(e["node_ms_per_sec"].as_f64().unwrap_or(0.0) > 100.0, "{e}");

    std::thread::sleep(Duration::from_millis(300));
    let (calls, reads, _, _) = served_over(owner, "zrange", &readers, Duration::from_secs(2));
    eprintln!("node: {calls} ZRANGEs; clients: {reads} reads");
    assert!(reads >= 200, "the readers kept up: {reads} reads in 2 s");
    // A fifth at most: with one worker thread (the default now) the node served 25-45 of
    // about 400 in this debug build, against 2-38 with two; not yet explained beyond the
    // refreshes (bench/README.md has the cache's figures in a release build). Without
    // the cache it serves every one.
    assert!(calls * 5 <= reads, "node served {calls} of {reads} reads");
    // Read while the load runs: once it stops the key cools and its series goes.
    let m = p.admin_get("/metrics").1;
    assert!(
        m.contains("saltshaker_hot_key_node_milliseconds_per_second{key=\"board\"}"),
        "{m}"
    );
    readers.stop();

    // A write is seen by the very next read, through the cache.
    for round in 0..3 {
        let member = format!("newcomer:{round}");
        c.cmd(&["ZADD", "board", "-1", &member]);
        let through = raw_cmd(&p.addr(), &zrange);
        let direct = raw_cmd(&owner.addr(), &zrange);
        assert!(through == direct, "stale read after ZADD {member}");
        assert!(String::from_utf8_lossy(&through[..64]).contains(&member));
    }
}

#[test]
fn many_small_keys_at_the_same_bandwidth_make_no_key_hot() {
    need_redis();
    need_tool("redis-benchmark");
    let _serial = one_at_a_time();
    let nodes = pool(2);
    let p = Proxy::start(&nodes.iter().collect::<Vec<_>>(), &[]);
    let bench = |test: &str, n: &str| {
        Command::new("redis-benchmark")
            .args([
                "-p",
                &p.port.to_string(),
                "-t",
                test,
                "-n",
                n,
                "-r",
                "10000",
            ])
            .args(["-d", "16384", "-c", "8", "-P", "4", "-q"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("redis-benchmark")
    };
    assert!(bench("set", "20000").success());
    let out0 = p.metric("saltshaker_requests_total");
    let start = Instant::now();
    let mut load = Command::new("redis-benchmark")
        .args([
            "-p",
            &p.port.to_string(),
            "-t",
            "get",
            "-n",
            "10000000",
            "-r",
            "10000",
        ])
        .args(["-c", "8", "-P", "4", "-q"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-benchmark");
    let mut listed = Vec::new();
    while start.elapsed() < Duration::from_secs(4) {
        std::thread::sleep(Duration::from_millis(100));
        if let Some(keys) = hotkeys(&p)["keys"].as_array() {
            listed.extend(keys.iter().map(|k| k["key"].to_string()));
        }
    }
    let _ = load.kill();
    let _ = load.wait();
    let reads = p.metric("saltshaker_requests_total") - out0;
    let secs = start.elapsed().as_secs_f64();
    let bandwidth = reads * 16384.0 / secs;
    eprintln!(
        "{reads} reads of 16 KiB in {secs:.1} s: {:.0} MiB/s",
        bandwidth / 1048576.0
    );
    // Teeth: together the keys moved more than one key may before it is hot.
    assert!(bandwidth > 32.0 * 1024.0 * 1024.0, "{bandwidth} B/s");
    assert!(listed.is_empty(), "listed: {listed:?}");
    let m = p.admin_get("/metrics").1;
    assert!(m.contains("saltshaker_hot_keys{kind=\"bytes\"} 0"), "{m}");
}

#[test]
fn a_byte_limit_admits_a_big_value_at_its_bytes_per_second() {
    need_redis();
    let _serial = one_at_a_time();
    let nodes = pool(2);
    let dir = TempDir::new("bytes-limit");
    let rules = dir.0.join("rules.yaml");
    std::fs::write(
        &rules,
        "version: 1\nrules:\n  - match: \"page:*\"\n    admit: { limit_bytes_per_sec: 2097152 }\n",
    )
    .expect("write rules");
    let p = Proxy::start(
        &nodes.iter().collect::<Vec<_>>(),
        &["--rules", &path_str(&rules)],
    );
    let mut c = p.client();
    c.cmd(&["SET", "page:home", &"v".repeat(512 * 1024)]);
    // 20 reads a second for 3 s: 30 MiB offered against 2 MiB/s plus one second's burst.
    let (mut admitted, mut refused) = (0, 0);
    let start = Instant::now();
    for i in 0..60u32 {
        let r = c.cmd(&["GET", "page:home"]);
        if r.is_error() {
            assert!(r.err().contains("2097152 bytes/s"), "{r}");
            refused += 1;
        } else {
            assert_eq!(r.as_str().len(), 512 * 1024);
            admitted += 1;
        }
        // Other keys are not limited.
        assert!(!c.cmd(&["GET", "other"]).is_error());
        let next = start + Duration::from_millis(50 * (i as u64 + 1));
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let allowed = (2.0 * secs + 2.0) * 2.0; // reads of 512 KiB in 2 MiB/s over secs, plus a burst
    eprintln!("{admitted} admitted, {refused} refused in {secs:.1} s (at most {allowed:.1})");
    assert!(refused > 0);
    assert!(admitted as f64 <= allowed + 1.0, "{admitted} > {allowed}");
    assert!(
        admitted as f64 >= allowed - 4.0,
        "{admitted} well under {allowed}"
    );
}

#[test]
fn node_balance_counts_what_reads_cost_the_node() {
    need_redis();
    let _serial = one_at_a_time();
    let nodes = pool(2);
    let p = Proxy::start(&nodes.iter().collect::<Vec<_>>(), &[]);
    let mut c = p.client();
    // 10,000 members: about 1.2 ms of node time per ZRANGE by the estimate; 50 a second is
    // 60 ms/s, under the 100 ms/s at which the key itself is hot by node time, and 50
    // reads/s is far under 2000. Counted in commands its node is less busy than the other.
    fill_zset(&mut c, "board:weekly", 10_000);
    let owner = &nodes[owner(&nodes, "board:weekly")];
    let zrange = ["ZRANGE", "board:weekly", "0", "-1"];
    let expect = raw_cmd(&owner.addr(), &zrange);
    // A background of small reads, two thirds on the other node: once the key is cached
    // its node is well under the mean. A key given back for what its reads count rather
    // than what they cost would be taken and given back by turns.
    let other = nodes
        .iter()
        .position(|n| n.addr() != owner.addr())
        .expect("two nodes");
    // Keys until each node holds enough: the pool's placement follows the nodes' random
    // ports, and one run put 580 of 600 keys on one node of two.
    let (mut far, mut near) = (Vec::new(), Vec::new());
    let mut other_client = nodes[other].client();
    for i in 0..20_000 {
        if far.len() > 100 && near.len() > 100 {
            break;
        }
        let k = format!("bg:{i}");
        c.cmd(&["SET", &k, "1"]);
        let on_other = other_client.cmd(&["EXISTS", &k]).as_int() == 1;
        if on_other { &mut far } else { &mut near }.push(k);
    }
    assert!(
        far.len() > 50 && near.len() > 50,
        "{} / {}",
        far.len(),
        near.len()
    );
    let bg_keys: Vec<String> = (0..300)
        .map(|i| {
            if i % 3 == 0 {
                near[i % near.len()].clone()
            } else {
                far[i % far.len()].clone()
            }
        })
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let bg = {
        let (addr, stop) = (p.addr(), stop.clone());
        std::thread::spawn(move || {
            let mut c = Client::connect(&addr);
            let mut rng = Rng(7);
            while !stop.load(Ordering::Relaxed) {
                let cmds: Vec<[String; 2]> = (0..20)
                    .map(|_| {
                        let k = &bg_keys[rng.next(bg_keys.len() as u64) as usize];
                        ["GET".to_string(), k.clone()]
                    })
                    .collect();
                c.pipeline(&cmds);
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let readers = Readers::start(&p.addr(), &zrange, expect, 1, 50);
    let start = Instant::now();
    let chosen = loop {
        let e = entry(&hotkeys(&p), "board:weekly");
        if let Some(e) = e.filter(|e| e["read_hot_by"] == "balance") {
            break e;
        }
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "balance never chose the key: {}",
            hotkeys(&p)
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("chosen by balance after {:?}: {chosen}", start.elapsed());
    assert!(hot_by(&chosen).iter().all(|b| b == "reads"), "{chosen}");
    let m = p.admin_get("/metrics").1;
    assert!(
        m.contains("saltshaker_backend_read_cost_seconds_total{node="),
        "{m}"
    );
    std::thread::sleep(Duration::from_millis(500));
    let (calls, reads, _, _) = served_over(owner, "zrange", &readers, Duration::from_secs(2));
    eprintln!("node: {calls} ZRANGEs; clients: {reads} reads");
    let stderr = p.stderr();
    let log: Vec<&str> = stderr.lines().filter(|l| l.contains("balance")).collect();
    assert!(
        calls * 5 <= reads,
        "node served {calls} of {reads} reads\n{}",
        log.join("\n")
    );
    readers.stop();
    stop.store(true, Ordering::Relaxed);
    bg.join().expect("background");
}

/// Sends GET of every key in `keys`, pipelined, `rounds_per_sec` times a second, and checks
/// each reply is the `len`-byte value; counts rounds.
fn cycle_reads(addr: &str, keys: Vec<String>, len: usize, rounds_per_sec: u64) -> Readers {
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let (s2, r2, addr) = (stop.clone(), reads.clone(), addr.to_string());
    let handle = std::thread::spawn(move || {
        let mut s = TcpStream::connect(&addr).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok();
        let wire: Vec<u8> = keys.iter().flat_map(|k| encode(&["GET", k])).collect();
        let one = format!("${len}\r\n").len() + len + 2;
        let mut buf = vec![0u8; one * keys.len()];
        let every = Duration::from_micros(1_000_000 / rounds_per_sec);
        let mut next = Instant::now();
        while !s2.load(Ordering::Relaxed) {
            s.write_all(&wire).map_err(|e| e.to_string())?;
            s.read_exact(&mut buf).map_err(|e| e.to_string())?;
            if !buf
                .chunks(one)
                .all(|r| r.starts_with(format!("${len}\r\n").as_bytes()))
            {
                return Err("a cheap read got another reply".into());
            }
            r2.fetch_add(keys.len() as u64, Ordering::Relaxed);
            next += every;
            if let Some(d) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
        }
        Ok(())
    });
    Readers {
        stop,
        reads,
        bytes: Arc::new(AtomicU64::new(0)),
        handles: vec![handle],
    }
}

#[test]
fn a_full_cache_keeps_the_reply_that_saves_the_node_most() {
    need_redis();
    let _serial = one_at_a_time();
    let nodes = pool(2);
    let dir = TempDir::new("cost-evict");
    // A 1 MiB cache (a reply may take 128 KiB), and every key read 20 times a second hot.
    let cfg = dir.0.join("saltshaker.yaml");
    // (The nodes given on the command line replace the file's.)
    let text = "backend:\n  nodes: [\"127.0.0.1:1\"]\ncache:\n  max_bytes: 1048576\n";
    std::fs::write(&cfg, text).expect("write config");
    let rules = dir.0.join("rules.yaml");
    std::fs::write(
        &rules,
        "version: 1\ndefaults:\n  read: { hot_at_per_sec: 20, cool_below_per_sec: 5 }\n",
    )
    .expect("write rules");
    let p = Proxy::start(
        &nodes.iter().collect::<Vec<_>>(),
        &["--config", &path_str(&cfg), "--rules", &path_str(&rules)],
    );
    let mut c = p.client();
    // The costly reply: 5,000 members, about 90 KB, some 600 us of node time per read.
    fill_zset(&mut c, "board", 5000);
    let owner = &nodes[owner(&nodes, "board")];
    let expect = raw_cmd(&owner.addr(), &["ZRANGE", "board", "0", "-1"]);
    // The cheap ones: 60 values of 20 KB (1.2 MB, more than the cache), a few us each.
    let keys: Vec<String> = (0..60).map(|i| format!("page:{i}")).collect();
    let value = "c".repeat(20_000);
    for k in &keys {
        c.cmd(&["SET", k, &value]);
    }
    let board = Readers::start(&p.addr(), &["ZRANGE", "board", "0", "-1"], expect, 1, 30);
    let pages = cycle_reads(&p.addr(), keys, 20_000, 30);
    until_hot_by(&p, "board", "reads", Duration::from_secs(5));
    std::thread::sleep(Duration::from_secs(1));
    let (served, reads, _, _) = served_over(owner, "zrange", &board, Duration::from_secs(3));
    let gets: i64 = nodes.iter().map(|n| calls(n, "get")).sum();
    let evictions = p.metric("saltshaker_cache_evictions_total");
    let saved = p.metric("saltshaker_cache_node_seconds_saved_total");
    board.stop();
    pages.stop();
    println!("ZRANGE: node served {served} of {reads} reads; node GETs so far {gets}; evictions {evictions}; node seconds saved {saved}");
    assert!(evictions > 10.0, "the cache was never full: {evictions}");
    assert!(reads >= 60, "{reads}");
    // Its TTL is 1 s: about one fill a second is the floor.
    assert!(
        served * 10 <= reads,
        "the node served {served} of {reads} ZRANGEs"
    );
    assert!(saved > 0.01, "{saved}");
}

#[test]
fn a_big_value_read_through_mget_is_hot_by_bytes_as_its_own_key() {
    need_redis();
    let _serial = one_at_a_time();
    let nodes = pool(2);
    let p = Proxy::start(&nodes.iter().collect::<Vec<_>>(), &[]);
    let value = "v".repeat(512 * 1024);
    let mut c = p.client();
    c.cmd(&["SET", "page:home", &value]);
    c.cmd(&["SET", "page:small", "s"]);
    let owner = &nodes[owner(&nodes, "page:home")];
    // A missing key first: each value is counted against the key in its place.
    let args = ["MGET", "page:none", "page:home", "page:small"];
    let expect = raw_cmd(&p.addr(), &args);
    assert_eq!(expect.len(), 4 + 5 + (512 * 1024 + 11) + 7);

    let readers = Readers::start(&p.addr(), &args, expect, 4, 100);
    let took = until_hot_by(&p, "page:home", "bytes", Duration::from_secs(3));
    eprintln!("hot by bytes after {took:?}");
    assert!(took <= Duration::from_secs(1), "reported after {took:?}");
    let snap = hotkeys(&p);
    assert!(entry(&snap, "page:none").is_none(), "{snap}");
    assert!(entry(&snap, "page:small").is_none(), "{snap}");
    // The MGET is split: the hot key from the cache, the others from their nodes.
    std::thread::sleep(Duration::from_millis(300));
    let (_, reads, out, bytes) = served_over(owner, "get", &readers, Duration::from_secs(2));
    eprintln!("node: {out} bytes out; clients: {reads} reads, {bytes} bytes");
    assert!(reads >= 400, "the readers kept up: {reads} reads in 2 s");
    assert!(out * 10 <= bytes, "node sent {out} of {bytes} bytes");
    readers.stop();
    c.cmd(&["SET", "page:home", "new"]);
    let got = raw_cmd(&p.addr(), &args);
    assert_eq!(got, b"*3\r\n$-1\r\n$3\r\nnew\r\n$1\r\ns\r\n".to_vec());
}

#[test]
fn a_big_value_written_200_times_a_second_is_hot_by_bytes() {
    need_redis();
    let _serial = one_at_a_time();
    let nodes = pool(2);
    let p = Proxy::start(&nodes.iter().collect::<Vec<_>>(), &[]);
    // 2 x 100 SETs a second of 256 KiB: 50 MiB/s, a tenth of the write-hot rate.
    let value = "w".repeat(256 * 1024);
    let writers = Readers::start(
        &p.addr(),
        &["SET", "feed:latest", &value],
        b"+OK\r\n".to_vec(),
        2,
        100,
    );
    let took = until_hot_by(&p, "feed:latest", "bytes", Duration::from_secs(3));
    eprintln!("hot by bytes after {took:?}");
    assert!(took <= Duration::from_secs(1), "reported after {took:?}");
    let e = entry(&hotkeys(&p), "feed:latest").expect("listed");
    assert!(e["writes_per_sec"].as_f64().unwrap_or(0.0) < 2000.0, "{e}");
    assert!(
        e["bytes_per_sec"].as_f64().unwrap_or(0.0) > 16.0 * 1024.0 * 1024.0,
        "{e}"
    );
    writers.stop();
    assert_eq!(
        p.client().cmd(&["STRLEN", "feed:latest"]).as_int(),
        256 * 1024
    );
    // Small writes are not counted by bytes at all.
    let mut c = p.client();
    for _ in 0..500 {
        c.cmd(&["SET", "feed:small", "x"]);
    }
    let snap = hotkeys(&p);
    assert!(
        entry(&snap, "feed:small").is_none_or(|e| e["bytes_per_sec"].as_f64() == Some(0.0)),
        "{snap}"
    );
}
