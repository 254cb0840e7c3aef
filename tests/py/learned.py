"""Commands the proxy learns from its nodes, through redis-py, over each kind of backend:

- a Redis Cluster of three redis-server 8.0.2 masters with Redis's `keyspecs` test module
  loaded: vector sets and the module's commands through redis-py's plain and cluster
  clients (keys of several slots, each on its master; a module command whose keys only
  the node can find placed by `COMMAND GETKEYS`; CROSSSLOT across slots);
- a pool of two Valkey 9.1.2 nodes: DELIFEQ and MSETEX on each key's node, and the
  cross-node error for MSETEX over keys of both;
- a pool of two Redis 8.0.2 nodes with the module: its commands on their keys' node.

Prints "redis-py learned: N passed, N failed" and exits 0 only if every test passed."""

import hashlib
import os
import sys
import time

import redis
from redis.cluster import RedisCluster

import harness
from cluster_clients import start_cluster

REDIS8 = os.environ.get("SALTSHAKER_REDIS_NEW",
                        "/usr/local/lib/saltshaker-test/redis-8.0.2/redis-server")
MODULE = os.path.join(os.path.dirname(REDIS8), "keyspecs.so")
VALKEY = os.path.join(os.environ.get("SALTSHAKER_VALKEY_DIR",
                                     "/usr/local/lib/saltshaker-test/valkey-9.1.2"),
                      "valkey-server")


def node(c, server, extra=()):
    port = harness.free_port()
    proc = c._spawn(f"node-{port}", [
        server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
        "--appendonly", "no", "--dir", c.logdir, *extra])
    harness.wait_for_port(port, proc, f"{server} on {port}")
    return port


def proxy(c, backend):
    port, admin = harness.free_port(), harness.free_port()
    proc = c._spawn(f"proxy-{port}", [harness.binary(), "--listen", f"127.0.0.1:{port}",
                                      "--admin", f"127.0.0.1:{admin}", *backend])
    c.proxy_log = os.path.join(c.logdir, f"proxy-{port}.log")
    harness.wait_for_port(port, proc, "saltshaker")
    return port


def wait_learned(r, command, *args):
    """Until the proxy serves `command` (learned from its nodes once it serves)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            return r.execute_command(command, *args)
        except redis.exceptions.ResponseError as e:
            if "unknown command" not in str(e):
                return None
            assert time.monotonic() < deadline, f"{command} still unknown: {e}"
            time.sleep(0.05)


def holder(ports, key):
    """The one node of `ports` that holds `key` (a cluster node that does not own its slot
    answers MOVED)."""
    held = []
    for p in ports:
        try:
            if redis.Redis(port=p).exists(key):
                held.append(p)
        except redis.exceptions.ResponseError as e:
            assert str(e).startswith("MOVED"), e
    assert len(held) == 1, (key, held)
    return held[0]


def spread(prefix, i):
    """Key names whose hashes spread (twemproxy's hashes keep names that differ only at
    the end together)."""
    return f"{hashlib.md5(str(i).encode()).hexdigest()[:8]}:{prefix}"


def setup(c):
    for path in (REDIS8, MODULE, VALKEY):
        if not os.path.exists(path):
            raise RuntimeError(f"missing {path}: run scripts/install-deps.sh")
    masters = start_cluster(c, REDIS8, masters=3, replicas=0, extra=("--loadmodule", MODULE))
    on_cluster = proxy(c, ["--cluster", ",".join(f"127.0.0.1:{p}" for p in masters)])
    valkeys = [node(c, VALKEY) for _ in range(2)]
    on_valkey = proxy(c, ["--nodes", ",".join(f"127.0.0.1:{p}:1" for p in valkeys)])
    moduled = [node(c, REDIS8, ("--loadmodule", MODULE)) for _ in range(2)]
    on_module = proxy(c, ["--nodes", ",".join(f"127.0.0.1:{p}:1" for p in moduled)])

    def vector_sets_and_a_module_over_a_cluster():
        for client in (redis.Redis(port=on_cluster, socket_timeout=10),
                       RedisCluster(host="127.0.0.1", port=on_cluster, socket_timeout=10)):
            wait_learned(client, "VCARD", "probe")
            wait_learned(client, "kspec.tworanges", "{p}a", "{p}b")
            homes = set()
            for i in range(12):
                key = f"vec:{i}:{type(client).__name__}"
                assert client.execute_command("VADD", key, "VALUES", 2, 1, 0, "a") == 1
                assert client.execute_command("VCARD", key) == 1
                home = holder(masters, key)
                assert redis.Redis(port=home).execute_command("VCARD", key) == 1
                homes.add(home)
            assert len(homes) == 3, homes
            # Keys only the node can find: placed by COMMAND GETKEYS, run on their master.
            assert client.execute_command("kspec.tworanges", "{t}a", "{t}b") in (b"OK", "OK", True)
            assert client.execute_command("kspec.keyword", "x", "KEYS", "{t}a", "{t}b") in (b"OK", "OK", True)
            try:
                redis.Redis(port=on_cluster).execute_command("kspec.tworanges", "{t}a", "{u}b")
                raise AssertionError("keys of two slots were accepted")
            except redis.exceptions.ResponseError as e:
                assert "CROSSSLOT" in str(e), e
            client.close()

    def valkey_delifeq_and_msetex_over_a_pool():
        r = redis.Redis(port=on_valkey, socket_timeout=10)
        wait_learned(r, "DELIFEQ", "probe", "x")
        homes = set()
        for i in range(10):
            key = spread("lock", i)
            assert r.set(key, "me")
            assert r.execute_command("DELIFEQ", key, "someone") == 0
            homes.add(holder(valkeys, key))
            assert r.execute_command("DELIFEQ", key, "me") == 1
            assert r.exists(key) == 0
        assert len(homes) == 2, homes
        assert r.execute_command("MSETEX", 2, "{m}a", "1", "{m}b", "2", "EX", 100) == 1
        assert r.mget("{m}a", "{m}b") == [b"1", b"2"]
        assert 0 < r.ttl("{m}a") <= 100
        a = spread("k", 0)
        b = next(spread("k", i) for i in range(1, 50)
                 if holder_of(r, valkeys, spread("k", i)) != holder_of(r, valkeys, a))
        try:
            r.execute_command("MSETEX", 2, a, "1", b, "2", "EX", 100)
            raise AssertionError("keys of two nodes were accepted")
        except redis.exceptions.ResponseError as e:
            assert "different nodes" in str(e), e

    def a_modules_commands_over_a_pool():
        r = redis.Redis(port=on_module, socket_timeout=10)
        wait_learned(r, "kspec.keyword", "x", "KEYS", "probe")
        for i in range(8):
            key = spread("mod", i)
            r.set(key, "v")
            home = holder(moduled, key)
            before = calls(home, "kspec.keyword")
            assert r.execute_command("kspec.keyword", "x", "KEYS", key) in (b"OK", True)
            assert calls(home, "kspec.keyword") == before + 1, (key, home)

    return [vector_sets_and_a_module_over_a_cluster, valkey_delifeq_and_msetex_over_a_pool,
            a_modules_commands_over_a_pool]


def holder_of(r, ports, key):
    r.set(key, "x")
    return holder(ports, key)


def calls(port, command):
    stats = redis.Redis(port=port).info("commandstats")
    return stats.get(f"cmdstat_{command}", {}).get("calls", 0)


if __name__ == "__main__":
    sys.exit(harness.run_suite("learned", setup))
