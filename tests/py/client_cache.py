"""redis-py's client-side cache (`protocol=3, cache_config=CacheConfig()`) through saltshaker.

redis-py turns its cache on only when HELLO says the server is Redis 7.4 or later, so these
tests run over redis-server 8.0.2 (built by scripts/install-deps.sh beside Debian's 7.0).
The proxy reports the lowest version of its nodes in HELLO, never a version it does not
have: over a 7.0 node redis-py refuses to cache, as it does against that node directly.

Through one node and a 4-node pool:
- repeated reads are served from the application's memory (no GET reaches a node);
- a write on the key's node directly, a write through a second proxy, an expiry, a
  FLUSHALL, and a change made while the node dropped the proxy's tracking connection are
  each seen by the next reads within 100 ms (the expiry within 200 ms of its TTL's end:
  Redis expires an unread key in its active cycle, ten times a second).

Also Redis 8's vector sets (VADD, VSIM, ...), which the proxy learns from the nodes, through
redis-py over one node and the pool; and COMMAND, which says what the proxy serves.

Prints "redis-py client cache: N passed, N failed" and exits 0 only if every test passed."""

import hashlib
import os
import socket
import sys
import time

import redis
from redis.cache import CacheConfig

import harness

VERSION = "8.0.2"
SERVER = os.environ.get(
    "SALTSHAKER_REDIS_NEW",
    f"/usr/local/lib/saltshaker-test/redis-{VERSION}/redis-server",
)


def start_proxy(c, nodes, name):
    port, admin = harness.free_port(), harness.free_port()
    spec = ",".join(f"127.0.0.1:{p}:1 node{i}" for i, p in enumerate(nodes))
    proc = c._spawn(name, [harness.binary(), "--listen", f"127.0.0.1:{port}", "--nodes", spec,
                           "--admin", f"127.0.0.1:{admin}"])
    c.proxy_log = os.path.join(c.logdir, name + ".log")
    harness.wait_for_port(port, proc, name)
    return port


def hello(port):
    return redis.Redis(port=port, protocol=3).execute_command("HELLO", "3")


def node_version(port):
    return redis.Redis(port=port).info("server")["redis_version"]


def node_gets(ports):
    n = 0
    for p in ports:
        n += redis.Redis(port=p).info("commandstats").get("cmdstat_get", {}).get("calls", 0)
    return n


def until(app, key, want, within=2.0):
    """Milliseconds until a read of `key` through `app` gives `want`, or -1."""
    t = time.monotonic()
    while time.monotonic() - t < within:
        if app.get(key) == want:
            return (time.monotonic() - t) * 1000
        time.sleep(0.002)
    return -1


def cached(app, key, nodes):
    """Whether a read of `key` is served from the application's memory."""
    app.get(key)
    before = node_gets(nodes)
    app.get(key)
    return node_gets(nodes) == before


def scenario(app_port, other_port, nodes, key):
    app = redis.Redis(port=app_port, protocol=3, cache_config=CacheConfig())
    plain = redis.Redis(port=other_port)
    plain.set(key, "v1")
    owner = next(p for p in nodes if redis.Redis(port=p).exists(key))
    node = redis.Redis(port=owner)
    assert app.get(key) == b"v1"
    # The proxy starts a node's tracking connection at its first tracking client: a read
    # made before it is up is invalidated right after its reply, so the next one caches.
    deadline = time.monotonic() + 2
    while not cached(app, key, nodes):
        assert time.monotonic() < deadline, "reads never served from the application"
    before = node_gets(nodes)
    for _ in range(100):
        assert app.get(key) == b"v1"
    assert node_gets(nodes) == before, "100 repeated reads reached a node"

    node.set(key, "v2")
    ms = until(app, key, b"v2")
    assert 0 <= ms < 100, f"a write on the node seen after {ms} ms"

    assert cached(app, key, nodes)
    plain.set(key, "v3")
    ms = until(app, key, b"v3")
    assert 0 <= ms < 100, f"a write through the second proxy seen after {ms} ms"

    node.set(key, "short", px=150)
    ttl_end = time.monotonic() + 0.150
    assert until(app, key, b"short") >= 0
    assert cached(app, key, nodes)
    assert until(app, key, None) >= 0, "the expiry was never seen"
    late = (time.monotonic() - ttl_end) * 1000
    assert late < 200, f"an expiry seen {late:.0f} ms after the TTL's end"

    node.set(key, "v4")
    assert until(app, key, b"v4") >= 0
    assert cached(app, key, nodes)
    node.flushall()
    ms = until(app, key, None)
    assert 0 <= ms < 100, f"FLUSHALL seen after {ms} ms"

    node.set(key, "v5")
    assert until(app, key, b"v5") >= 0
    killed = node.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
    assert killed >= 1, "the proxy had no tracking connection on the node"
    node.set(key, "v6")
    ms = until(app, key, b"v6")
    assert 0 <= ms < 100, f"a change while the tracker was down seen after {ms} ms"
    app.close()


def setup(c):
    if not os.access(SERVER, os.X_OK):
        raise RuntimeError(f"missing redis-server {VERSION} at {SERVER}: "
                           "run scripts/install-deps.sh as root")
    c.start_redis()
    old = c.nodes[-1]
    new = []
    for _ in range(4):
        c.start_redis(server=SERVER)
        new.append(c.nodes[-1])
    assert node_version(new[0]) == VERSION
    over_old = start_proxy(c, [old], "proxy-old")
    mixed = start_proxy(c, [new[0], old], "proxy-mixed")
    single = start_proxy(c, new[:1], "proxy-single")
    single_b = start_proxy(c, new[:1], "proxy-single-b")
    pool = start_proxy(c, new, "proxy-pool")
    pool_b = start_proxy(c, new, "proxy-pool-b")

    def hello_reports_the_lowest_version_of_the_nodes():
        old_version = node_version(old)
        assert hello(over_old)[b"version"] == old_version.encode()
        assert hello(mixed)[b"version"] == old_version.encode()
        assert hello(single)[b"version"] == VERSION.encode()
        assert hello(pool)[b"server"] == b"redis"

    def redis_py_refuses_to_cache_over_an_old_node_as_it_does_directly():
        for port in (old, over_old):
            try:
                redis.Redis(port=port, protocol=3, cache_config=CacheConfig()).ping()
            except redis.exceptions.ConnectionError as e:
                assert "7.4" in str(e), e
            else:
                raise AssertionError(f"redis-py cached against {port}, a 7.0 server")

    def redis_py_caches_the_same_directly_on_the_node():
        scenario(new[0], new[0], new[:1], "csc:direct")

    def redis_py_caches_through_the_proxy_over_one_node():
        scenario(single, single_b, new[:1], "csc:single")

    def redis_py_caches_through_the_proxy_over_a_pool():
        # Keys whose owners differ: each is tracked on its own node.
        owners, seen = set(), []
        # fnv1a_64 (twemproxy's) places keys that differ only in their last bytes close
        # together on the ring: vary the whole key.
        for i in range(40):
            key = f"{hashlib.md5(str(i).encode()).hexdigest()[:8]}:csc"
            redis.Redis(port=pool).set(key, "x")
            owner = next(p for p in new if redis.Redis(port=p).exists(key))
            seen.append(owner)
            if owner in owners:
                continue
            owners.add(owner)
            scenario(pool, pool_b, new, key)
        assert len(owners) >= 3, (owners, seen)

    def redis_py_runs_redis_8_vector_sets_through_the_proxy_over_one_node_and_a_pool():
        # The proxy's own table is Redis 7.0's: VADD and its kin are learned from the
        # nodes (COMMAND INFO) in the background once it serves.
        for run, (port, nodes) in enumerate(((single, new[:1]), (pool, new))):
            r = redis.Redis(port=port)
            deadline = time.monotonic() + 10
            while True:
                try:
                    for cmd in ("VADD", "VCARD", "VDIM", "VSIM"):
                        try:
                            r.execute_command(cmd, "vprobe")
                        except redis.exceptions.ResponseError as e:
                            if "unknown command" in str(e):
                                raise
                    break
                except redis.exceptions.ResponseError as e:
                    assert "unknown command" in str(e), e
                    assert time.monotonic() < deadline, "VCARD still unknown"
                    time.sleep(0.05)
            owners = set()
            for i in range(12):
                key = f"{hashlib.md5(str(i).encode()).hexdigest()[:8]}:vec{run}"
                assert r.execute_command("VADD", key, "VALUES", 2, 1, 0, "a") == 1
                assert r.execute_command("VADD", key, "VALUES", 2, 0, 1, "b") == 1
                assert r.execute_command("VCARD", key) == 2
                assert r.execute_command("VDIM", key) == 2
                near = r.execute_command("VSIM", key, "VALUES", 2, 1, 0, "COUNT", 1)
                assert near == [b"a"], near
                owner = [p for p in nodes if redis.Redis(port=p).execute_command("VCARD", key)]
                assert len(owner) == 1, owner
                owners.add(owner[0])
            assert len(owners) == len(nodes) or len(owners) >= 3, owners

    def redis_py_reads_what_the_proxy_serves_from_command():
        # COMMAND through the proxy: the node's commands less the refused, plus the
        # proxy's own, in a reply redis-py parses as it parses a node's.
        r = redis.Redis(port=pool, decode_responses=True)
        table = r.command()
        # Redis 8's vector sets are a module: the node names them in upper case.
        assert "get" in table and "VADD" in table, sorted(table)[:5]
        assert "save" not in table and "shutdown" not in table
        incrby = table["saltshaker.incrby"]
        assert (incrby["first_key_pos"], incrby["last_key_pos"], incrby["step_count"]) == (1, 1, 1), incrby
        listed = r.command_list()
        assert "hotkeys" in listed and "save" not in listed
        assert r.command_count() == len([n for n in listed if "|" not in n]) == len(table)

    return [
        hello_reports_the_lowest_version_of_the_nodes,
        redis_py_reads_what_the_proxy_serves_from_command,
        redis_py_runs_redis_8_vector_sets_through_the_proxy_over_one_node_and_a_pool,
        redis_py_refuses_to_cache_over_an_old_node_as_it_does_directly,
        redis_py_caches_the_same_directly_on_the_node,
        redis_py_caches_through_the_proxy_over_one_node,
        redis_py_caches_through_the_proxy_over_a_pool,
    ]


if __name__ == "__main__":
    sys.exit(harness.run_suite("client cache", setup))
