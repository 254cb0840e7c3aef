"""What the proxy adds beyond single commands: pipelines, transactions, pub/sub, RESP3,
errors, and the pool itself (each key on exactly one node, the same node twemproxy
would pick, fan-out commands, a node going down). Runs after test_types."""

import random
import threading
import time
import urllib.request

import redis

from harness import Skip, test
from resp3 import Raw


def placement(ctx, keys):
    """Index of the node that holds each key, read with direct connections; asserts
    that every key is on exactly one node."""
    where = {}
    for key in keys:
        holders = [i for i, node in enumerate(ctx.nodes) if node.exists(key)]
        assert len(holders) == 1, f"{key!r} is on nodes {holders}, expected exactly one"
        where[key] = holders[0]
    return where


def keys_on_two_nodes(ctx, prefix):
    """Two keys, written through the proxy, that live on different nodes. The keys are
    random-looking because fnv1a_64 ketama (twemproxy's, which the proxy matches)
    clumps short sequential keys, sometimes all onto one node."""
    rng = random.Random(prefix)
    keys = [f"{prefix}:{rng.getrandbits(64):016x}" for _ in range(64)]
    ctx.r.mset({k: 0 for k in keys})
    where = placement(ctx, keys)
    a = keys[0]
    return a, next(k for k in keys if where[k] != where[a])


@test
def pipeline_of_500_commands_replies_in_order(ctx):
    pipe = ctx.r.pipeline(transaction=False)
    expected = []
    for i in range(500):
        key = f"pipe:{i % 97}"
        if i % 3 == 0:
            pipe.set(key, i)
            expected.append(True)
        elif i % 3 == 1:
            pipe.get(key)
            expected.append(None)  # filled below from the last SET
        else:
            pipe.echo(f"m{i}")
            expected.append(f"m{i}".encode())
    last = {}
    for i in range(500):
        key = f"pipe:{i % 97}"
        if i % 3 == 0:
            last[key] = str(i).encode()
        elif i % 3 == 1:
            expected[i] = last.get(key)
    ctx.r.delete(*[f"pipe:{i}" for i in range(97)])
    assert pipe.execute() == expected


@test
def pipeline_error_stays_at_its_position(ctx):
    ctx.r.set("pipe:text", "abc")
    pipe = ctx.r.pipeline(transaction=False)
    pipe.set("pipe:x", 1).incr("pipe:text").incr("pipe:x").get("pipe:x")
    res = pipe.execute(raise_on_error=False)
    assert res[0] is True and res[2] == 2 and res[3] == b"2"
    assert isinstance(res[1], redis.ResponseError)


@test
def transaction_with_hash_tag(ctx):
    pipe = ctx.r.pipeline(transaction=True)
    pipe.set("{u1}:a", 1).incr("{u1}:a").set("{u1}:b", "x").get("{u1}:b")
    pipe.mget("{u1}:a", "{u1}:b")
    assert pipe.execute() == [True, 2, True, b"x", [b"2", b"x"]]
    assert ctx.r.get("{u1}:a") == b"2"


@test(pool_only=True)
def hash_tagged_keys_share_a_node(ctx):
    keys = [f"{{u1}}:{s}" for s in ("a", "b", "c", "d")]
    for k in keys:
        ctx.r.set(k, 1)
    assert len(set(placement(ctx, keys).values())) == 1


@test(pool_only=True)
def transaction_across_nodes_is_refused_cleanly(ctx):
    a, b = keys_on_two_nodes(ctx, "txn")
    pipe = ctx.r.pipeline(transaction=True)
    pipe.incr(a).incr(b)
    try:
        pipe.execute()
        raise AssertionError("MULTI over keys on two nodes should not succeed")
    except redis.RedisError:
        pass
    assert ctx.r.ping() is True


@test(pool_only=True)
def rename_across_nodes_names_the_problem(ctx):
    a, b = keys_on_two_nodes(ctx, "ren")
    try:
        ctx.r.rename(a, b)
        raise AssertionError("RENAME across nodes should fail")
    except redis.ResponseError as e:
        assert "different nodes" in str(e), str(e)
    assert ctx.r.get(a) == b"0"


@test
def pubsub_subscribe_publish_get_message(ctx):
    sub = ctx.client().pubsub()
    sub.subscribe("news")
    confirm = sub.get_message(timeout=2)
    assert confirm and confirm["type"] == "subscribe", confirm
    assert ctx.r.publish("news", "hello") == 1
    msg = sub.get_message(timeout=2)
    assert msg and msg["type"] == "message" and msg["data"] == b"hello", msg
    sub.unsubscribe("news")
    assert sub.get_message(timeout=2)["type"] == "unsubscribe"
    sub.close()


@test
def pubsub_over_resp3(ctx):
    sub = ctx.client(protocol=3).pubsub()
    sub.subscribe("news3")
    assert sub.get_message(timeout=2)["type"] == "subscribe"
    assert ctx.r.publish("news3", "hi") == 1
    msg = sub.get_message(timeout=2)
    assert msg and msg["data"] == b"hi", msg
    sub.close()


@test
def resp3_client_gets_resp3_types(ctx):
    r3 = ctx.client(protocol=3)
    r3.hset("r3:h", mapping={"f": "v"})
    r3.zadd("r3:z", {"m": 1.5})
    assert r3.hgetall("r3:h") == {b"f": b"v"}
    assert r3.zscore("r3:z", "m") == 1.5
    assert r3.get("r3:absent") is None
    assert r3.smembers("r3:absent") == set()
    raw = Raw(ctx.port)
    kind, hello = raw.call("HELLO", "3")
    assert kind == "%", (kind, hello)
    fields = {k[1]: v[1] for k, v in hello}
    assert fields.get(b"proto") == b"3", fields
    assert raw.call("HGETALL", "r3:h") == ("%", [(("$", b"f"), ("$", b"v"))])
    assert raw.call("ZSCORE", "r3:z", "m") == (",", b"1.5")
    assert raw.call("GET", "r3:absent") == ("_", None)
    assert raw.call("SMEMBERS", "r3:absent") == ("~", [])
    raw.close()
    # Other clients stay on RESP2.
    raw2 = Raw(ctx.port)
    assert raw2.call("HGETALL", "r3:h")[0] == "*"
    assert raw2.call("GET", "r3:absent") == ("$", None)
    raw2.close()


@test
def unknown_command_is_an_error_and_connection_survives(ctx):
    try:
        ctx.r.execute_command("NOSUCHCOMMAND", "x")
        raise AssertionError("unknown command should fail")
    except redis.ResponseError as e:
        assert "unknown command" in str(e).lower(), str(e)
    assert ctx.r.ping() is True
    raw = Raw(ctx.port)
    assert raw.call("NOSUCHCOMMAND")[0] == "-"
    assert raw.call("PING") == ("+", b"PONG")
    raw.close()


@test
def many_clients_at_once(ctx):
    errors = []

    def worker(n):
        try:
            c = ctx.client()
            for i in range(50):
                c.set(f"conc:{n}:{i}", i)
                assert c.get(f"conc:{n}:{i}") == str(i).encode()
            c.close()
        except Exception as e:  # reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors


@test
def dbsize_keys_and_scan_cover_every_node(ctx):
    r = ctx.r
    assert r.flushall() is True
    keys = {f"cover:{i}".encode() for i in range(120)}
    r.mset({k: 1 for k in keys})
    assert r.dbsize() == 120
    assert sum(node.dbsize() for node in ctx.nodes) == 120
    assert set(r.keys("cover:*")) == keys
    assert set(r.scan_iter(match="cover:*", count=7)) == keys
    assert r.flushdb() is True
    assert r.dbsize() == 0


@test(pool_only=True)
def each_key_lives_on_exactly_one_node(ctx):
    r = ctx.r
    for node in ctx.nodes:
        node.flushall()
    # Random-looking keys: twemproxy's fnv1a_64 ketama clumps short sequential keys
    # (place:0..399 can leave a node empty), and the proxy is meant to match it.
    rng = random.Random(7)
    keys = [f"place:{rng.getrandbits(64):016x}" for _ in range(400)]
    pipe = r.pipeline(transaction=False)
    for i, k in enumerate(keys):
        [pipe.set, pipe.sadd, pipe.rpush, pipe.incr][i % 4](*([k, 1] if i % 4 < 3 else [k]))
    pipe.execute()
    where = placement(ctx, keys)
    per_node = [list(where.values()).count(n) for n in range(len(ctx.nodes))]
    assert all(count >= 40 for count in per_node), f"skewed placement {per_node}"


@test(pool_only=True)
def placement_matches_twemproxy(ctx):
    nut_port = ctx.cluster.nutcracker_port or (ctx.cluster.start_nutcracker() and
                                               ctx.cluster.nutcracker_port)
    if not nut_port:
        raise Skip("nutcracker not installed")
    # twemproxy closes the connection on redis-py's CLIENT SETINFO: don't send it.
    nut = redis.Redis(port=nut_port, socket_timeout=10, lib_name=None, lib_version=None)
    keys = [f"twem:{i}" for i in range(200)] + [f"{{tag{i}}}:x" for i in range(50)]
    for node in ctx.nodes:
        node.flushall()
    for k in keys:
        nut.set(k, 1)
    theirs = placement(ctx, keys)
    for node in ctx.nodes:
        node.flushall()
    ctx.r.mset({k: 1 for k in keys})
    ours = placement(ctx, keys)
    differ = [k for k in keys if ours[k] != theirs[k]]
    assert not differ, f"{len(differ)} keys placed unlike nutcracker, e.g. {differ[:5]}"


@test(pool_only=True)
def admin_endpoints_answer(ctx):
    base = f"http://127.0.0.1:{ctx.cluster.admin_port}"
    for path in ("/healthz", "/readyz", "/metrics"):
        with urllib.request.urlopen(base + path, timeout=5) as resp:
            assert resp.status == 200, (path, resp.status)
            body = resp.read()
            if path == "/metrics":
                assert b"# TYPE" in body or b"# HELP" in body, body[:200]


@test(pool_only=True)
def node_down_fails_fast_for_its_keys_only(ctx):
    """Runs last: it kills a node."""
    rng = random.Random(11)
    keys = [f"down:{rng.getrandbits(64):016x}" for _ in range(80)]
    ctx.r.mset({k: 1 for k in keys})
    where = placement(ctx, keys)
    victim = where[keys[0]]
    dead = [k for k in keys if where[k] == victim]
    alive = [k for k in keys if where[k] != victim]
    assert dead and alive
    ctx.cluster.kill_node(victim)
    c = ctx.client()
    last = None
    for _ in range(3):
        start = time.monotonic()
        try:
            c.get(dead[0])
            raise AssertionError("GET of a key on a dead node should fail")
        except redis.ResponseError as e:
            last = str(e)
        assert time.monotonic() - start < 3.0, "error for a dead node was not immediate"
        time.sleep(0.2)
    assert "down" in last, last
    for k in alive:
        assert c.get(k) == b"1"
