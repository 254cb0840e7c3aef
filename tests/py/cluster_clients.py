"""redis-py against saltshaker in front of a real Redis Cluster (3 masters, 3 replicas):
the plain client (`redis.Redis`) and the cluster client (`redis.cluster.RedisCluster`,
which learns the proxy's one-node map from CLUSTER SLOTS) must both work unchanged.
Prints "redis-py cluster: N passed, N failed" and exits 0 only if every test passed."""

import os
import socket
import subprocess
import sys
import time

import redis
from redis.cluster import RedisCluster

import harness


def cluster_port():
    """A port whose cluster bus port (+10000) is free too, both below the ephemeral range
    (32768 and up) that other servers' bind(0) ports come from."""
    import random
    for _ in range(1000):
        p = random.randint(10000, 22700)
        try:
            for q in (p, p + 10000):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
    raise RuntimeError("no free cluster port")


def start_cluster(c, server="redis-server", masters=3, replicas=1, extra=()):
    """A Redis Cluster of `masters` masters with `replicas` replicas each, from `server`,
    each node given `extra` arguments too; returns the ports once every node says ok."""
    ports = []
    for _ in range(masters * (1 + replicas)):
        p = cluster_port()
        proc = c._spawn(f"redis-{p}", [
            server, "--port", str(p), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", c.logdir, "--dbfilename", f"dump-{p}.rdb",
            "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{p}.conf",
            "--cluster-node-timeout", "1500", "--repl-diskless-sync-delay", "0", *extra,
        ])
        harness.wait_for_port(p, proc, f"{server} on {p}")
        ports.append(p)
    out = subprocess.run(
        ["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports],
         "--cluster-replicas", str(replicas), "--cluster-yes"],
        capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise RuntimeError(f"redis-cli --cluster create failed: {out.stdout}{out.stderr}")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if all(b"cluster_state:ok" in redis.Redis(port=p).execute_command("CLUSTER", "INFO")
               for p in ports):
            return ports
        time.sleep(0.1)
    raise RuntimeError("the cluster did not become ok")


def setup(c):
    binary = harness.binary()
    ports = start_cluster(c)
    proxy, admin = harness.free_port(), harness.free_port()
    proc = c._spawn("proxy", [binary, "--listen", f"127.0.0.1:{proxy}",
                              "--admin", f"127.0.0.1:{admin}",
                              "--cluster", ",".join(f"127.0.0.1:{p}" for p in ports)])
    c.proxy_log = os.path.join(c.logdir, "proxy.log")
    harness.wait_for_port(proxy, proc, "saltshaker")
    direct = RedisCluster(host="127.0.0.1", port=ports[0])

    def plain_client():
        r = redis.Redis(port=proxy, socket_timeout=10)
        for i in range(200):
            assert r.set(f"plain:{i}", i)
        assert r.mget([f"plain:{i}" for i in range(200)]) == [str(i).encode() for i in range(200)]
        p = r.pipeline(transaction=False)
        for i in range(100):
            p.incr(f"plain:ctr:{i % 7}")
        assert sum(int(x) for x in p.execute()[-7:]) > 0
        assert r.dbsize() == 207
        # Written where the real cluster places them.
        assert direct.get("plain:42") == b"42"

    def cluster_client():
        rc = RedisCluster(host="127.0.0.1", port=proxy, socket_timeout=10)
        nodes = rc.get_nodes()
        assert [(n.host, n.port) for n in nodes] == [("127.0.0.1", proxy)], nodes
        for i in range(200):
            assert rc.set(f"rc:{i}", i)
        assert rc.mget_nonatomic([f"rc:{i}" for i in range(200)]) == \
            [str(i).encode() for i in range(200)]
        p = rc.pipeline()
        for i in range(50):
            p.incr(f"rc:ctr:{i % 5}")
        assert p.execute()[-1] == 10
        assert rc.keyslot("foo") == 12182
        assert direct.get("rc:7") == b"7"
        rc.close()

    def resp3_cluster_client():
        rc = RedisCluster(host="127.0.0.1", port=proxy, protocol=3, socket_timeout=10)
        assert rc.set("r3:a", "1") and rc.get("r3:a") == b"1"
        rc.close()

    return (plain_client, cluster_client, resp3_cluster_client)


if __name__ == "__main__":
    sys.exit(harness.run_suite("cluster", setup))
