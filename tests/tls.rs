//! TLS on both sides, with real parts: certificates made by `openssl` in the test,
//! redis-server on a TLS port that requires a client certificate, `redis-cli --tls` and
//! `redis-benchmark --tls` as clients.

mod support;

use std::process::{Command, Stdio};
use std::thread;
use std::time::Duration;

use support::tls::{cli, cli_text, Certs, TlsRedis};
use support::*;

/// `backend.tls` (trust `ca`, present the client certificate) plus `fields` (", sni: x").
fn backend_tls(c: &Certs, fields: &str) -> String {
    format!(
        "  tls: {{ ca: \"{}\", cert: \"{}\", key: \"{}\"{fields} }}\n",
        c.path("ca.crt"),
        c.path("client.crt"),
        c.path("client.key")
    )
}

/// `tls:` for clients with the proxy's certificate `name` (`server`), plus `more` fields.
fn client_tls(c: &Certs, name: &str, more: &str) -> String {
    format!(
        "tls: {{ cert: \"{}\", key: \"{}\"{more} }}\n",
        c.path(&format!("{name}.crt")),
        c.path(&format!("{name}.key"))
    )
}

fn labelled(p: &Proxy, name: &str, label: &str) -> f64 {
    let (_, m) = p.admin_get("/metrics");
    m.lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn ok(out: &std::process::Output) -> String {
    cli_text(out)
}

#[test]
fn tls_on_both_sides_serves_redis_cli_and_benchmark_and_refuses_plain_clients() {
    let c = Certs::new("tls-both");
    let node = TlsRedis::start(&c, "server", &[]);
    let p = Proxy::start_addrs_with_config(
        &[node.addr()],
        &(backend_tls(&c, "") + &client_tls(&c, "server", "")),
        &[],
    );
    assert_eq!(
        ok(&cli(&c, p.port, "ca.crt", false, &["SET", "tls:k", "v1"])),
        "OK"
    );
    assert_eq!(
        ok(&cli(&c, p.port, "ca.crt", false, &["GET", "tls:k"])),
        "v1"
    );
    // The value went to the node over TLS.
    assert_eq!(
        ok(&cli(&c, node.port, "ca.crt", true, &["GET", "tls:k"])),
        "v1"
    );

    // Deep pipelines through TLS on both sides: every reply comes back.
    need_tool("redis-benchmark");
    let out = Command::new("timeout")
        .args([
            "120",
            "redis-benchmark",
            "--tls",
            "--cacert",
            &c.path("ca.crt"),
        ])
        .args(["-h", "127.0.0.1", "-p", &p.port.to_string()])
        .args(["-t", "set,get", "-n", "20000", "-P", "32", "-c", "4", "-q"])
        .output()
        .unwrap();
    let text = cli_text(&out);
    assert!(out.status.success(), "{text}");
    assert!(
        text.matches("requests per second").count() == 2 && !text.to_lowercase().contains("error"),
        "{text}"
    );

    // Pub/sub over TLS: the tunnel's two TLS ends.
    let sub = Command::new("timeout")
        .args(["4", "redis-cli", "--tls", "--cacert", &c.path("ca.crt")])
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &p.port.to_string(),
            "SUBSCRIBE",
            "tls:ch",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut delivered = 0;
    assert!(
        wait_until(Duration::from_secs(3), || {
            delivered = ok(&cli(
                &c,
                p.port,
                "ca.crt",
                false,
                &["PUBLISH", "tls:ch", "hello"],
            ))
            .parse()
            .unwrap_or(0);
            delivered == 1
        }),
        "the subscriber never registered"
    );
    let out = sub.wait_with_output().unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("hello"),
        "{out:?}"
    );

    // A plain client on the TLS port gets no answer, and is counted.
    let before = p.metric("saltshaker_tls_handshake_failures_total");
    let plain = Client::try_connect(&p.addr()).and_then(|mut k| k.try_cmd(&["PING"]));
    assert!(
        !matches!(&plain, Ok(Reply::Simple(s)) if s == "PONG"),
        "a plain client was served on the TLS port: {plain:?}"
    );
    assert!(wait_until(Duration::from_secs(3), || p
        .metric("saltshaker_tls_handshake_failures_total")
        > before));
    // And the proxy still serves.
    assert_eq!(
        ok(&cli(&c, p.port, "ca.crt", false, &["GET", "tls:k"])),
        "v1"
    );
}

#[test]
fn mtls_refuses_a_client_without_a_certificate_and_serves_one_with_it() {
    let c = Certs::new("tls-mtls");
    let node = Redis::start();
    let more = format!(", client_ca: \"{}\"", c.path("ca.crt"));
    let p = Proxy::start_with_config(&[&node], &client_tls(&c, "server", &more), &[]);
    let without = ok(&cli(&c, p.port, "ca.crt", false, &["PING"]));
    assert_ne!(without, "PONG", "served without a client certificate");
    assert_eq!(ok(&cli(&c, p.port, "ca.crt", true, &["PING"])), "PONG");
    assert_eq!(
        ok(&cli(&c, p.port, "ca.crt", true, &["SET", "m", "1"])),
        "OK"
    );
    assert_eq!(node.client().cmd(&["GET", "m"]).as_str(), "1");
}

#[test]
fn a_separate_tls_port_leaves_listen_plain() {
    let c = Certs::new("tls-port");
    let node = Redis::start();
    let tls_port = free_port();
    let more = format!(", listen: \"127.0.0.1:{tls_port}\"");
    let p = Proxy::start_with_config(&[&node], &client_tls(&c, "server", &more), &[]);
    assert_eq!(p.client().cmd(&["SET", "both", "1"]).as_str(), "OK");
    assert!(wait_until(Duration::from_secs(5), || ok(&cli(
        &c,
        tls_port,
        "ca.crt",
        false,
        &["GET", "both"]
    )) == "1"));
}

#[test]
fn node_certificates_are_checked_by_chain_and_by_name_unless_told_otherwise() {
    let c = Certs::new("tls-names");
    // A node whose certificate names elsewhere.example, not 127.0.0.1.
    let node = TlsRedis::start(&c, "wrongname", &[]);
    node_cli_set(&c, &node);
    let strict = Proxy::start_addrs_with_config(&[node.addr()], &backend_tls(&c, ""), &[]);
    let r = strict.client().cmd(&["GET", "n"]);
    assert!(
        r.is_error(),
        "a certificate for another name was accepted: {r:?}"
    );
    assert!(r.err().to_lowercase().contains("certificate"), "{r:?}");

    let loose = Proxy::start_addrs_with_config(
        &[node.addr()],
        &backend_tls(&c, ", verify_hostname: false"),
        &[],
    );
    assert_eq!(loose.client().cmd(&["GET", "n"]).as_str(), "v");
    let by_sni = Proxy::start_addrs_with_config(
        &[node.addr()],
        &backend_tls(&c, ", sni: elsewhere.example"),
        &[],
    );
    assert_eq!(by_sni.client().cmd(&["GET", "n"]).as_str(), "v");

    // verify_hostname: false still checks the chain: a node signed by another CA is refused.
    let other = TlsRedis::start(&c, "server2", &[]);
    let p = Proxy::start_addrs_with_config(
        &[other.addr()],
        &backend_tls(&c, ", verify_hostname: false"),
        &[],
    );
    let r = p.client().cmd(&["GET", "n"]);
    assert!(r.is_error(), "an untrusted chain was accepted: {r:?}");
}

fn node_cli_set(c: &Certs, node: &TlsRedis) {
    let out = Command::new("timeout")
        .args(["10", "redis-cli", "--tls", "--insecure"])
        .args([
            "--cert",
            &c.path("client.crt"),
            "--key",
            &c.path("client.key"),
        ])
        .args(["-p", &node.port.to_string(), "SET", "n", "v"])
        .output()
        .unwrap();
    assert_eq!(cli_text(&out), "OK");
}

#[test]
fn a_certificate_rotated_under_load_drops_no_connection_and_a_bad_one_keeps_the_old() {
    let c = Certs::new("tls-rotate");
    let node = Redis::start();
    // The proxy reads its certificate from files the test overwrites.
    let live = TempDir::new("tls-live");
    let (cert, key) = (live.0.join("proxy.crt"), live.0.join("proxy.key"));
    std::fs::copy(c.path("server.crt"), &cert).unwrap();
    std::fs::copy(c.path("server.key"), &key).unwrap();
    let yaml = format!(
        "tls: {{ cert: \"{}\", key: \"{}\" }}\n",
        path_str(&cert),
        path_str(&key)
    );
    let p = Proxy::start_with_config(&[&node], &yaml, &[]);
    assert_eq!(ok(&cli(&c, p.port, "ca.crt", false, &["PING"])), "PONG");

    // Load on 8 connections until the test stops it: redis-benchmark exits at the first
    // connection it loses, so still running at the end means none was dropped.
    need_tool("redis-benchmark");
    let mut bench = Command::new("redis-benchmark")
        .args(["--tls", "--cacert", &c.path("ca.crt")])
        .args(["-h", "127.0.0.1", "-p", &p.port.to_string()])
        .args(["-t", "get", "-n", "1000000000", "-c", "8", "-q"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map(Reaped)
        .unwrap();
    thread::sleep(Duration::from_millis(700));
    // Counted by the proxy, not the node: the benchmark's one key turns read-hot, and the
    // cache then answers it without a GET reaching the node.
    let gets = || p.metric("saltshaker_requests_total") as u64;

    // A broken certificate: counted, logged, and the old one keeps serving.
    std::fs::write(&cert, "not a certificate\n").unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || labelled(
            &p,
            "saltshaker_tls_reloads_total",
            "result=\"failed\""
        ) >= 1.0),
        "the bad certificate was not noticed"
    );
    assert_eq!(p.metric("saltshaker_tls_last_reload_failed"), 1.0);
    assert!(
        p.stderr().contains("TLS certificate not reloaded"),
        "{}",
        p.stderr()
    );
    assert_eq!(ok(&cli(&c, p.port, "ca.crt", false, &["PING"])), "PONG");

    // The new certificate (another CA): new connections get it.
    std::fs::copy(c.path("server2.key"), &key).unwrap();
    std::fs::copy(c.path("server2.crt"), &cert).unwrap();
    assert!(
        wait_until(Duration::from_secs(5), || ok(&cli(
            &c,
            p.port,
            "ca2.crt",
            false,
            &["PING"]
        )) == "PONG"),
        "the rotated certificate was not served: {}",
        p.stderr()
    );
    assert_ne!(ok(&cli(&c, p.port, "ca.crt", false, &["PING"])), "PONG");
    assert_eq!(p.metric("saltshaker_tls_last_reload_failed"), 0.0);

    // The benchmark's connections, opened before both reloads, are still served.
    let before = gets();
    thread::sleep(Duration::from_millis(1000));
    let after = gets();
    let running = bench.0.try_wait().unwrap().is_none();
    let _ = bench.0.kill();
    let out = bench.into_output();
    let text = cli_text(&out);
    assert!(running, "redis-benchmark lost a connection: {text}");
    assert!(
        after > before,
        "the old connections stopped getting answers ({before} GETs, then {after}): {text}\n{}",
        p.stderr()
    );
    assert!(!text.to_lowercase().contains("error"), "{text}");
}

/// A child killed when the test ends, however it ends.
struct Reaped(std::process::Child);

impl Reaped {
    fn into_output(mut self) -> std::process::Output {
        let child = std::mem::replace(&mut self.0, Command::new("true").spawn().unwrap());
        child.wait_with_output().unwrap()
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_read_cache_and_a_tracking_client_track_a_tls_node() {
    let c = Certs::new("tls-track");
    let node = TlsRedis::start(&c, "server", &[]);
    let dir = TempDir::new("tls-track-rules");
    let rules = dir.0.join("rules.yaml");
    std::fs::write(
        &rules,
        "version: 1\nrules:\n  - match: \"celeb:*\"\n    pin: true\n    read: { cache: { ttl_ms: 60000, jitter_pct: 0, stale_while_revalidate_ms: 0 } }\n",
    )
    .unwrap();
    let p = Proxy::start_addrs_with_config(
        &[node.addr()],
        &backend_tls(&c, ""),
        &["--rules", &path_str(&rules)],
    );
    assert_eq!(
        ok(&cli(
            &c,
            node.port,
            "ca.crt",
            true,
            &["SET", "celeb:1", "a"]
        )),
        "OK"
    );
    let mut k = p.client();
    // And an application caching in its own process (CLIENT TRACKING) reads it too.
    let mut t = p.client();
    t.cmd(&["HELLO", "3"]);
    assert_eq!(t.cmd(&["CLIENT", "TRACKING", "ON"]), Reply::ok());
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(t.cmd(&["GET", "celeb:1"]), Reply::bulk("a"));
    assert_eq!(t.next_push(Duration::from_millis(200)), None);
    // Cached once the tracked fill connection is up.
    assert!(wait_until(Duration::from_secs(5), || {
        k.cmd(&["GET", "celeb:1"]);
        p.metric("saltshaker_cache_hits_total") > 0.0
    }));
    // A write straight on the node reaches the cache as an invalidation.
    assert_eq!(
        ok(&cli(
            &c,
            node.port,
            "ca.crt",
            true,
            &["SET", "celeb:1", "b"]
        )),
        "OK"
    );
    assert!(
        wait_until(Duration::from_secs(2), || k
            .cmd(&["GET", "celeb:1"])
            .as_str()
            == "b"),
        "the cache kept a value the node changed"
    );
    assert_eq!(
        t.next_push(Duration::from_secs(2)),
        Some(Reply::invalidate(Some("celeb:1"))),
        "the tracking client over a TLS node"
    );
}

#[test]
fn bad_tls_settings_stop_the_start_with_the_file_named() {
    let c = Certs::new("tls-bad");
    let dir = TempDir::new("tls-bad-cfg");
    let path = dir.0.join("s.yaml");
    std::fs::write(
        &path,
        format!(
            "backend:\n  nodes: [\"127.0.0.1:1\"]\ntls: {{ cert: \"{}\", key: \"{}\" }}\n",
            c.path("server.crt"),
            c.path("client.key")
        ),
    )
    .unwrap();
    let out = saltshaker(&["--config", &path_str(&path)]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("client.key") && err.contains("tls"), "{err}");
}

#[test]
fn a_tls_redis_cluster_is_reached_at_its_tls_ports() {
    let c = Certs::new("tls-cluster");
    let nodes: Vec<TlsRedis> = (0..6)
        .map(|_| {
            TlsRedis::start_on(
                &c,
                "server",
                &[
                    "--cluster-enabled",
                    "yes",
                    "--tls-cluster",
                    "yes",
                    "--tls-replication",
                    "yes",
                    "--cluster-node-timeout",
                    "1500",
                ],
                support::cluster::cluster_port,
            )
        })
        .collect();
    let addrs: Vec<String> = nodes.iter().map(|n| n.addr()).collect();
    let out = Command::new("timeout")
        .args(["60", "redis-cli", "--tls", "--cacert", &c.path("ca.crt")])
        .args([
            "--cert",
            &c.path("client.crt"),
            "--key",
            &c.path("client.key"),
        ])
        .arg("--cluster")
        .arg("create")
        .args(&addrs)
        .args(["--cluster-replicas", "1", "--cluster-yes"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", cli_text(&out));
    assert!(
        wait_until(Duration::from_secs(30), || nodes.iter().all(|n| ok(&cli(
            &c,
            n.port,
            "ca.crt",
            true,
            &["CLUSTER", "INFO"]
        ))
        .contains("cluster_state:ok"))),
        "the TLS cluster did not become ok"
    );
    let dir = TempDir::new("tls-cluster-cfg");
    let cfg = dir.0.join("s.yaml");
    std::fs::write(
        &cfg,
        format!(
            "backend:\n  cluster: {{ seeds: [\"{}\"] }}\n{}",
            addrs[0],
            backend_tls(&c, "")
        ),
    )
    .unwrap();
    let p = Proxy::start_cluster(&addrs[..3].join(","), &["--config", &path_str(&cfg)]);
    let mut k = p.client();
    let keys: Vec<String> = (0..60).map(|i| format!("tlsc:{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(k.cmd(&["SET", key, &i.to_string()]).as_str(), "OK", "{key}");
    }
    let mut mget = vec!["MGET"];
    mget.extend(keys.iter().map(|s| s.as_str()));
    let got = k.cmd(&mget);
    let want: Vec<Reply> = (0..60).map(|i| Reply::bulk(&i.to_string())).collect();
    assert_eq!(got, Reply::Array(Some(want)));
    // Where the cluster itself places them (redis-cli -c follows MOVED over TLS).
    let out = Command::new("timeout")
        .args([
            "10",
            "redis-cli",
            "--tls",
            "-c",
            "--cacert",
            &c.path("ca.crt"),
        ])
        .args([
            "--cert",
            &c.path("client.crt"),
            "--key",
            &c.path("client.key"),
        ])
        .args(["-p", &nodes[0].port.to_string(), "GET", "tlsc:42"])
        .output()
        .unwrap();
    assert_eq!(cli_text(&out), "42");
    assert_eq!(k.cmd(&["DBSIZE"]).as_int(), 60);
}

#[test]
fn tls_per_node_settings_apply_to_their_node_only() {
    let c = Certs::new("tls-per-node");
    let good = TlsRedis::start(&c, "server", &[]);
    let odd = TlsRedis::start(&c, "wrongname", &[]);
    let yaml = format!(
        "{}  tls_per_node:\n    \"{}\": {{ ca: \"{}\", cert: \"{}\", key: \"{}\", verify_hostname: false }}\n",
        backend_tls(&c, ""),
        odd.addr(),
        c.path("ca.crt"),
        c.path("client.crt"),
        c.path("client.key")
    );
    let p = Proxy::start_addrs_with_config(&[good.addr(), odd.addr()], &yaml, &[]);
    let mut k = p.client();
    // Keys on both nodes: the strict default for one, the override for the other.
    // The varying part first: fnv1a_64 (as twemproxy has it) spreads last-byte changes
    // over a narrow arc of the ring, so "pn:0".."pn:39" can all land on one node.
    for i in 0..40 {
        let key = format!("{i}:pn");
        assert_eq!(k.cmd(&["SET", &key, "v"]).as_str(), "OK", "{key}");
    }
    // Both nodes took writes: the strict default for one, the override for the other.
    for n in [&good, &odd] {
        let sent = labelled(
            &p,
            "saltshaker_backend_requests_total",
            &format!("node=\"{}\"", n.addr()),
        );
        assert!(
            sent > 0.0,
            "no command reached {}: {}\n{}",
            n.addr(),
            p.admin_get("/metrics")
                .1
                .lines()
                .filter(|l| l.contains("backend_"))
                .collect::<Vec<_>>()
                .join("\n"),
            p.stderr()
        );
    }
    assert_eq!(k.cmd(&["DBSIZE"]).as_int(), 40);
}

#[test]
fn a_client_that_never_finishes_its_handshake_is_closed_at_the_timeout() {
    let c = Certs::new("tls-slow");
    let node = Redis::start();
    let p = Proxy::start_with_config(
        &[&node],
        &client_tls(&c, "server", ", handshake_timeout_ms: 300"),
        &[],
    );
    let mut idle = std::net::TcpStream::connect(p.addr()).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t0 = std::time::Instant::now();
    let mut buf = [0u8; 16];
    let n = std::io::Read::read(&mut idle, &mut buf);
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "closed after {:?}",
        t0.elapsed()
    );
    assert!(wait_until(Duration::from_secs(2), || p
        .metric("saltshaker_tls_handshake_failures_total")
        >= 1.0));
    assert_eq!(ok(&cli(&c, p.port, "ca.crt", false, &["PING"])), "PONG");
}

#[test]
fn a_tls_client_that_never_reads_is_closed_at_the_output_limit() {
    let c = Certs::new("tls-rude");
    let node = Redis::start();
    let yaml = client_tls(&c, "server", "") + "limits: { max_output_bytes: 8388608 }\n";
    let p = Proxy::start_with_config(&[&node], &yaml, &[]);
    let value = "x".repeat(100_000);
    assert_eq!(node.client().cmd(&["SET", "big", &value]).as_str(), "OK");
    // 4000 GETs of 100 kB (400 MB of replies) over TLS, none read.
    need_tool("python3");
    let script = format!(
        "import socket, ssl\nctx = ssl.create_default_context(cafile={:?})\ns = ctx.wrap_socket(socket.create_connection(('127.0.0.1', {})), server_hostname='127.0.0.1')\ns.settimeout(20)\nmsg = b'*2\\r\\n$3\\r\\nGET\\r\\n$3\\r\\nbig\\r\\n'\ntry:\n    for _ in range(4000):\n        s.sendall(msg)\n    print('sent all')\n    # Stay connected, reading nothing, until the proxy gives up on us.\n    import time\n    time.sleep(6)\nexcept Exception as e:\n    print('closed', type(e).__name__)\n",
        c.path("ca.crt"),
        p.port
    );
    let out = Command::new("timeout")
        .args(["60", "python3", "-c", &script])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", cli_text(&out));
    assert!(
        wait_until(Duration::from_secs(10), || p
            .stderr()
            .contains("closing a client that leaves its replies unread")),
        "{}",
        p.stderr()
    );
    assert_eq!(p.metric("saltshaker_client_output_limit_closed_total"), 1.0);
    assert_eq!(
        ok(&cli(&c, p.port, "ca.crt", false, &["STRLEN", "big"])),
        "100000"
    );
}
