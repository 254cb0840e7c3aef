//! A real Redis Cluster for the tests: `redis-server --cluster-enabled yes` processes on
//! loopback ports whose bus ports (port + 10000) are free too, joined by
//! `redis-cli --cluster create ... --cluster-replicas R`.

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use super::*;

/// A port whose cluster bus port (+10000) is free as well, both below the kernel's
/// ephemeral range (32768 and up), where every other test's `bind(0)` ports come from: a
/// bus port there could be handed to another test's server between our check and Redis's
/// bind.
pub fn cluster_port() -> u16 {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let base = (std::process::id() as usize * 97) % 12000;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 10000 + (base + n * 7) % 12700;
        if TcpListener::bind(("127.0.0.1", port as u16)).is_ok()
            && TcpListener::bind(("127.0.0.1", port as u16 + 10000)).is_ok()
        {
            return port as u16;
        }
    }
}

pub struct RedisCluster {
    pub nodes: Vec<Redis>,
}

impl RedisCluster {
    /// `masters` masters with `replicas` replicas each, every slot assigned, every node
    /// agreeing that the cluster is ok.
    pub fn start(masters: usize, replicas: usize) -> RedisCluster {
        RedisCluster::start_bin("redis-server", masters, replicas)
    }

    /// `start`, with the server binary `bin` (`redis8()`).
    pub fn start_bin(bin: &str, masters: usize, replicas: usize) -> RedisCluster {
        RedisCluster::start_bin_with(bin, masters, replicas, &[])
    }

    /// `start_bin`, each node given `extra` arguments as well (`--loadmodule ...`).
    pub fn start_bin_with(
        bin: &str,
        masters: usize,
        replicas: usize,
        extra: &[&str],
    ) -> RedisCluster {
        need_redis();
        need_tool("redis-cli");
        let mut args = Self::node_args();
        args.extend_from_slice(extra);
        let nodes: Vec<Redis> = (0..masters * (1 + replicas))
            // cluster-require-full-coverage no: production clusters that want the rest of
            // the keyspace served while a master fails over set it, and the failure tests
            // need it. repl-diskless-sync-delay 0: a replica syncs at once (the default
            // waits 5 s for more replicas), so a master killed early can fail over.
            .map(|_| Redis::start_bin(bin, &args, cluster_port))
            .collect();
        let addrs: Vec<String> = nodes.iter().map(|n| n.addr()).collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let c = RedisCluster { nodes };
        c.wait_ok(Duration::from_secs(30));
        c
    }

    fn node_args() -> Vec<&'static str> {
        vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            "1500",
            "--cluster-require-full-coverage",
            "no",
            "--repl-diskless-sync-delay",
            "0",
        ]
    }

    /// Starts one more node and joins it as an empty master (`redis-cli --cluster
    /// add-node`); returns its index.
    pub fn add_master(&mut self) -> usize {
        let n = Redis::start_on(&Self::node_args(), cluster_port);
        let out = Command::new("redis-cli")
            .args(["--cluster", "add-node", &n.addr(), &self.nodes[0].addr()])
            .output()
            .expect("run redis-cli --cluster add-node");
        assert!(
            out.status.success(),
            "add-node failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let addr = n.addr();
        self.nodes.push(n);
        let known = wait_until(Duration::from_secs(20), || {
            self.nodes.iter().all(|m| {
                Client::try_connect(&m.addr())
                    .ok()
                    .and_then(|mut c| c.try_cmd(&["CLUSTER", "NODES"]).ok())
                    .is_some_and(|r| r.as_str().contains(&addr))
            })
        });
        assert!(known, "the new node did not join");
        self.wait_ok(Duration::from_secs(20));
        self.nodes.len() - 1
    }

    /// `redis-cli --cluster rebalance --cluster-use-empty-masters`: slots move to the new
    /// master, keys and all.
    pub fn rebalance(&self) {
        let out = Command::new("redis-cli")
            .args([
                "--cluster",
                "rebalance",
                &self.nodes[0].addr(),
                "--cluster-use-empty-masters",
            ])
            .output()
            .expect("run redis-cli --cluster rebalance");
        assert!(
            out.status.success(),
            "rebalance failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Every node's address, comma-separated (the proxy's seeds).
    pub fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(|n| n.addr())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Waits until every running node says `cluster_state:ok` and agrees on the masters.
    pub fn wait_ok(&self, timeout: Duration) {
        let ok = wait_until(timeout, || {
            let mut views = Vec::new();
            for n in &self.nodes {
                let Ok(mut c) = Client::try_connect(&n.addr()) else {
                    continue;
                };
                match c.try_cmd(&["CLUSTER", "INFO"]) {
                    Ok(r) if r.as_str().contains("cluster_state:ok") => {}
                    _ => return false,
                }
                // A replica counts once it has synced with its master.
                match c.try_cmd(&["INFO", "replication"]) {
                    Ok(r)
                        if r.as_str().contains("role:slave")
                            && !r.as_str().contains("master_link_status:up") =>
                    {
                        return false
                    }
                    Ok(_) => {}
                    Err(_) => return false,
                }
                views.push(self.masters_seen_by(&mut c));
            }
            !views.is_empty() && views.windows(2).all(|w| w[0] == w[1])
        });
        assert!(ok, "the cluster did not become ok within {timeout:?}");
    }

    fn masters_seen_by(&self, c: &mut Client) -> Vec<String> {
        let Ok(r) = c.try_cmd(&["CLUSTER", "SLOTS"]) else {
            return vec![];
        };
        let Reply::Array(Some(ranges)) = r else {
            return vec![];
        };
        let mut m: Vec<String> = ranges
            .iter()
            .map(|range| {
                let node = &range.as_array()[2];
                format!(
                    "{}:{}",
                    node.as_array()[0].as_str(),
                    node.as_array()[1].as_int()
                )
            })
            .collect();
        m.sort();
        m.dedup();
        m
    }

    /// The index (in `nodes`) of the node that serves `key`'s slot now.
    pub fn master_of(&self, key: &str) -> usize {
        for n in &self.nodes {
            let Ok(mut c) = Client::try_connect(&n.addr()) else {
                continue;
            };
            let Ok(slot) = c.try_cmd(&["CLUSTER", "KEYSLOT", key]) else {
                continue;
            };
            let slot = slot.as_int();
            let Ok(Reply::Array(Some(ranges))) = c.try_cmd(&["CLUSTER", "SLOTS"]) else {
                continue;
            };
            for r in &ranges {
                let a = r.as_array();
                if a[0].as_int() <= slot && slot <= a[1].as_int() {
                    let port = a[2].as_array()[1].as_int() as u16;
                    return self
                        .nodes
                        .iter()
                        .position(|n| n.port == port)
                        .expect("the owner is one of ours");
                }
            }
        }
        panic!("no node knows the owner of {key}");
    }

    /// The id of node `i` (`CLUSTER MYID`).
    pub fn id(&self, i: usize) -> String {
        self.nodes[i].client().cmd(&["CLUSTER", "MYID"]).as_str()
    }

    /// A replica of node `master` (an index into `nodes`).
    pub fn replica_of(&self, master: usize) -> usize {
        (0..self.nodes.len())
            .find(|&i| {
                let role = self.nodes[i].client().cmd(&["ROLE"]);
                let r = role.as_array();
                r[0].as_str() == "slave" && r[2].as_int() == self.nodes[master].port as i64
            })
            .expect("the master has a replica")
    }

    /// The masters now, as indices into `nodes`.
    pub fn masters(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| {
                Client::try_connect(&self.nodes[i].addr())
                    .ok()
                    .and_then(|mut c| c.try_cmd(&["ROLE"]).ok())
                    .is_some_and(|r| r.as_array()[0].as_str() == "master")
            })
            .collect()
    }

    /// Moves `slot` from node `from` to node `to` the way `redis-cli --cluster reshard`
    /// does: IMPORTING and MIGRATING, MIGRATE of its keys in batches of `batch` (with
    /// `pause` between batches, so traffic meets the slot mid-move), then the new owner
    /// everywhere.
    pub fn move_slot(&self, slot: u16, from: usize, to: usize, batch: usize, pause: Duration) {
        let (from_id, to_id) = (self.id(from), self.id(to));
        let s = slot.to_string();
        let mut src = self.nodes[from].client();
        let mut dst = self.nodes[to].client();
        assert_eq!(
            dst.cmd(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id]),
            Reply::ok()
        );
        assert_eq!(
            src.cmd(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id]),
            Reply::ok()
        );
        let port = self.nodes[to].port.to_string();
        loop {
            let keys = src
                .cmd(&["CLUSTER", "GETKEYSINSLOT", &s, &batch.to_string()])
                .strings();
            if keys.is_empty() {
                break;
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
            args.extend(keys.iter().map(|k| k.as_str()));
            let r = src.cmd(&args);
            assert!(!r.is_error(), "MIGRATE failed: {r}");
            thread::sleep(pause);
        }
        for n in [to, from] {
            let r = self.nodes[n]
                .client()
                .cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &to_id]);
            assert_eq!(r, Reply::ok());
        }
        for (i, n) in self.nodes.iter().enumerate() {
            if i != to && i != from {
                let _ = Client::try_connect(&n.addr())
                    .map(|mut c| c.try_cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &to_id]));
            }
        }
    }

    /// A manual failover of `key`'s master `old` to its replica: `CLUSTER FAILOVER` on the
    /// replica until the key's slot is served by another node (a manual failover gives up
    /// if the replica cannot catch up in time on a loaded machine: ask again, as an
    /// operator would). Returns the new master, or `old` if three tries failed.
    pub fn fail_over(&self, key: &str, old: usize) -> usize {
        let replica = self.replica_of(old);
        for _ in 0..3 {
            let r = self.nodes[replica].client().cmd(&["CLUSTER", "FAILOVER"]);
            assert_eq!(r, Reply::ok());
            let moved = || {
                let end = Instant::now() + Duration::from_secs(10);
                while Instant::now() < end {
                    if self.master_of(key) != old {
                        return true;
                    }
                    thread::sleep(Duration::from_millis(50));
                }
                false
            };
            if moved() {
                return self.master_of(key);
            }
        }
        old
    }

    /// Waits until `key`'s slot is served by a node other than `old`, and returns it.
    pub fn wait_new_master(&self, key: &str, old: usize, timeout: Duration) -> usize {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            let m = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.master_of(key)));
            if let Ok(m) = m {
                if m != old {
                    return m;
                }
            }
            thread::sleep(Duration::from_millis(100));
        }
        panic!("{key}'s slot did not get a new master within {timeout:?}");
    }
}
