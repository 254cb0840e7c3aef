"""Data-type commands through the proxy as redis-py sends them: strings, hashes, lists,
sets, sorted sets, streams, HyperLogLog, bitmaps, geo and expiry. Every test uses its
own key prefix so tests do not depend on one another."""

import time

import redis

from harness import test


@test
def strings_roundtrip_and_counters(ctx):
    r = ctx.r
    assert r.set("str:a", "hello") is True
    assert r.get("str:a") == b"hello"
    assert r.set("str:a", "x", nx=True) is None
    assert r.set("str:a", "world", xx=True) is True
    assert r.getset("str:a", "again") == b"world"
    assert r.append("str:a", "!") == 6
    assert r.strlen("str:a") == 6
    assert r.getrange("str:a", 0, 1) == b"ag"
    assert r.setrange("str:a", 0, "AG") == 6
    assert r.get("str:a") == b"AGain!"
    assert r.getdel("str:a") == b"AGain!"
    assert r.get("str:a") is None
    assert r.incr("str:n") == 1
    assert r.incrby("str:n", 41) == 42
    assert r.decr("str:n") == 41
    assert r.decrby("str:n", 40) == 1
    assert abs(r.incrbyfloat("str:f", 1.5) - 1.5) < 1e-9
    assert r.setnx("str:nx", 1) is True
    assert r.setnx("str:nx", 2) is False
    assert r.get("str:missing") is None
    assert r.set("str:text", "abc")
    try:
        r.incr("str:text")
        raise AssertionError("INCR on text should fail")
    except redis.ResponseError as e:
        assert "not an integer" in str(e)
    # The connection stays usable after an error reply.
    assert r.ping() is True


@test
def strings_are_binary_safe_and_large(ctx):
    r = ctx.r
    weird = b"\r\n\x00$3\r\n*1\r\n" + bytes(range(256))
    assert r.set(b"bin:\r\nkey\x00", weird)
    assert r.get(b"bin:\r\nkey\x00") == weird
    assert r.set("bin:empty", "") and r.get("bin:empty") == b""
    big = b"x" * (1 << 20) + b"end"
    assert r.set("bin:big", big)
    assert r.get("bin:big") == big
    assert r.strlen("bin:big") == len(big)
    assert r.set("bin:ünïcødé", "✓") and r.get("bin:ünïcødé").decode() == "✓"


@test
def mget_mset_del_exists_span_nodes(ctx):
    r = ctx.r
    mapping = {f"multi:{i}": str(i) for i in range(200)}
    assert r.mset(mapping) is True
    keys = list(mapping)
    values = r.mget(keys + ["multi:absent"])
    assert values[:-1] == [v.encode() for v in mapping.values()]
    assert values[-1] is None
    assert r.exists(*keys[:50], "multi:absent") == 50
    assert r.exists("multi:1", "multi:1") == 2
    assert r.touch(*keys[:10]) == 10
    assert r.delete(*keys[:100]) == 100
    assert r.unlink(*keys[100:150], "multi:absent") == 50
    assert r.mget(keys[:3]) == [None, None, None]
    assert r.delete(*keys) == 50


@test
def hashes(ctx):
    r = ctx.r
    assert r.hset("h:1", mapping={"a": 1, "b": 2, "c": "three"}) == 3
    assert r.hget("h:1", "a") == b"1"
    assert r.hgetall("h:1") == {b"a": b"1", b"b": b"2", b"c": b"three"}
    assert r.hmget("h:1", ["a", "zz", "c"]) == [b"1", None, b"three"]
    assert r.hincrby("h:1", "a", 10) == 11
    assert abs(r.hincrbyfloat("h:1", "f", 0.25) - 0.25) < 1e-9
    assert r.hexists("h:1", "b") and not r.hexists("h:1", "zz")
    assert r.hlen("h:1") == 4
    assert sorted(r.hkeys("h:1")) == [b"a", b"b", b"c", b"f"]
    assert len(r.hvals("h:1")) == 4
    assert r.hsetnx("h:1", "a", 5) == 0
    assert r.hstrlen("h:1", "c") == 5
    assert r.hdel("h:1", "a", "b", "zz") == 2
    found = dict(r.hscan_iter("h:1"))
    assert set(found) == {b"c", b"f"}
    assert r.hrandfield("h:1") in (b"c", b"f")


@test
def lists_and_blocking_pop(ctx):
    r = ctx.r
    assert r.rpush("l:1", "a", "b", "c") == 3
    assert r.lpush("l:1", "z") == 4
    assert r.lrange("l:1", 0, -1) == [b"z", b"a", b"b", b"c"]
    assert r.llen("l:1") == 4
    assert r.lindex("l:1", 1) == b"a"
    assert r.lset("l:1", 1, "A") is True
    assert r.linsert("l:1", "after", "A", "a2") == 5
    assert r.lpos("l:1", "b") == 3
    assert r.lrem("l:1", 0, "a2") == 1
    assert r.lpop("l:1") == b"z"
    assert r.rpop("l:1") == b"c"
    assert r.ltrim("l:1", 0, 0) is True
    assert r.lrange("l:1", 0, -1) == [b"A"]
    assert r.rpush("{l}:src", 1, 2, 3) == 3
    assert r.lmove("{l}:src", "{l}:dst", "LEFT", "RIGHT") == b"1"
    assert r.lrange("{l}:dst", 0, -1) == [b"1"]
    # A blocking pop that times out, then one that finds data.
    start = time.monotonic()
    assert r.blpop(["l:empty"], timeout=1) is None
    assert time.monotonic() - start >= 0.9
    assert r.blpop(["l:1"], timeout=1) == (b"l:1", b"A")


@test
def blocking_pop_wakes_on_push_from_another_client(ctx):
    import threading

    waiter = ctx.client()
    got = []
    t = threading.Thread(target=lambda: got.append(waiter.brpop(["l:wake"], timeout=5)))
    t.start()
    time.sleep(0.3)
    ctx.r.lpush("l:wake", "v")
    t.join(6)
    assert got == [(b"l:wake", b"v")], got


@test
def sets(ctx):
    r = ctx.r
    assert r.sadd("s:1", "a", "b", "c") == 3
    assert r.sadd("s:1", "a") == 0
    assert r.smembers("s:1") == {b"a", b"b", b"c"}
    assert r.sismember("s:1", "a") and not r.sismember("s:1", "z")
    assert r.smismember("s:1", ["a", "z"]) == [1, 0]
    assert r.scard("s:1") == 3
    assert r.srandmember("s:1") in {b"a", b"b", b"c"}
    assert r.srem("s:1", "c") == 1
    assert r.spop("s:1") in {b"a", b"b"}
    assert r.sadd("{s}:x", 1, 2, 3) == 3 and r.sadd("{s}:y", 2, 3, 4) == 3
    assert r.sinter("{s}:x", "{s}:y") == {b"2", b"3"}
    assert r.sunion("{s}:x", "{s}:y") == {b"1", b"2", b"3", b"4"}
    assert r.sdiff("{s}:x", "{s}:y") == {b"1"}
    assert r.sinterstore("{s}:z", ["{s}:x", "{s}:y"]) == 2
    assert r.smove("{s}:x", "{s}:y", "1") is True
    assert r.scard("{s}:y") == 4
    assert set(r.sscan_iter("{s}:y")) == {b"1", b"2", b"3", b"4"}


@test
def sorted_sets(ctx):
    r = ctx.r
    assert r.zadd("z:1", {"a": 1, "b": 2, "c": 3}) == 3
    assert r.zscore("z:1", "b") == 2.0
    assert r.zincrby("z:1", 10, "a") == 11.0
    assert r.zrange("z:1", 0, -1) == [b"b", b"c", b"a"]
    assert r.zrange("z:1", 0, 0, withscores=True) == [(b"b", 2.0)]
    assert r.zrevrange("z:1", 0, 0) == [b"a"]
    assert r.zrangebyscore("z:1", 2, 3) == [b"b", b"c"]
    assert r.zrank("z:1", "c") == 1 and r.zrevrank("z:1", "c") == 1
    assert r.zcard("z:1") == 3 and r.zcount("z:1", "-inf", "+inf") == 3
    assert r.zmscore("z:1", ["a", "zz"]) == [11.0, None]
    assert r.zpopmin("z:1") == [(b"b", 2.0)]
    assert r.zrem("z:1", "c") == 1
    assert r.zadd("{z}:x", {"m": 1, "n": 2}) == 2 and r.zadd("{z}:y", {"n": 5}) == 1
    assert r.zunionstore("{z}:u", ["{z}:x", "{z}:y"]) == 2
    assert r.zscore("{z}:u", "n") == 7.0
    assert r.zinterstore("{z}:i", ["{z}:x", "{z}:y"]) == 1
    assert r.zrangebylex("{z}:x", "-", "+") == [b"m", b"n"]
    assert dict(r.zscan_iter("{z}:x")) == {b"m": 1.0, b"n": 2.0}


@test
def streams_and_consumer_groups(ctx):
    r = ctx.r
    ids = [r.xadd("x:1", {"n": i}) for i in range(5)]
    assert r.xlen("x:1") == 5
    entries = r.xrange("x:1")
    assert [e[0] for e in entries] == ids and entries[0][1] == {b"n": b"0"}
    assert len(r.xrevrange("x:1", count=2)) == 2
    read = r.xread({"x:1": "0-0"}, count=2)
    assert read[0][0] == b"x:1" and len(read[0][1]) == 2
    assert r.xgroup_create("x:1", "g", id="0") is True
    got = r.xreadgroup("g", "c1", {"x:1": ">"}, count=3)
    assert len(got[0][1]) == 3
    assert r.xack("x:1", "g", ids[0], ids[1]) == 2
    assert r.xpending("x:1", "g")["pending"] == 1
    assert r.xdel("x:1", ids[4]) == 1
    assert r.xtrim("x:1", maxlen=2, approximate=False) == 2
    assert r.xinfo_stream("x:1")["length"] == 2
    # XREAD BLOCK that times out with no data.
    assert r.xread({"x:empty": "$"}, block=200) in ([], None, {})


@test
def hyperloglog(ctx):
    r = ctx.r
    assert r.pfadd("{hll}:a", *[f"e{i}" for i in range(1000)]) == 1
    assert r.pfadd("{hll}:b", *[f"e{i}" for i in range(500, 1500)]) == 1
    assert 970 <= r.pfcount("{hll}:a") <= 1030
    assert r.pfmerge("{hll}:m", "{hll}:a", "{hll}:b") is True
    assert 1450 <= r.pfcount("{hll}:m") <= 1550


@test
def bitmaps(ctx):
    r = ctx.r
    assert r.setbit("b:1", 7, 1) == 0
    assert r.setbit("b:1", 7, 1) == 1
    assert r.getbit("b:1", 7) == 1 and r.getbit("b:1", 100) == 0
    assert r.get("b:1") == b"\x01"
    assert r.bitcount("b:1") == 1
    assert r.bitpos("b:1", 1) == 7
    r.set("{b}:x", b"\xff\x00")
    r.set("{b}:y", b"\x0f\x0f")
    assert r.bitop("AND", "{b}:and", "{b}:x", "{b}:y") == 2
    assert r.get("{b}:and") == b"\x0f\x00"
    bf = r.bitfield("b:f")
    assert bf.set("u8", 0, 200).incrby("u8", 0, 100, overflow="SAT").get("u8", 0).execute() \
        == [0, 255, 255]


@test
def geo(ctx):
    r = ctx.r
    assert r.geoadd("g:1", [13.361389, 38.115556, "Palermo", 15.087269, 37.502669, "Catania"]) == 2
    dist = r.geodist("g:1", "Palermo", "Catania", unit="km")
    assert 166 < dist < 167, dist
    (lon, lat), = r.geopos("g:1", "Palermo")
    assert abs(lon - 13.361389) < 1e-4 and abs(lat - 38.115556) < 1e-4
    assert r.geohash("g:1", "Palermo") == ["sqc8b49rny0"]
    near = r.geosearch("g:1", longitude=15, latitude=37, radius=200, unit="km", sort="ASC")
    assert near == [b"Catania", b"Palermo"]


@test
def expiry(ctx):
    r = ctx.r
    assert r.set("e:1", "v", ex=100)
    assert 98 <= r.ttl("e:1") <= 100
    assert 0 < r.pttl("e:1") <= 100000
    assert r.persist("e:1") is True and r.ttl("e:1") == -1
    assert r.ttl("e:absent") == -2
    assert r.expire("e:1", 50) is True
    assert r.expireat("e:1", int(time.time()) + 500) is True
    assert 400 < r.ttl("e:1") <= 500
    assert r.set("e:short", "v", px=150)
    assert r.pexpire("e:short2", 100) is False
    assert r.get("e:short") == b"v"
    time.sleep(0.3)
    assert r.get("e:short") is None and r.exists("e:short") == 0
    assert r.setex("e:2", 10, "v") and r.ttl("e:2") > 0
    assert r.getex("e:2", persist=True) == b"v" and r.ttl("e:2") == -1
    assert r.type("e:2") == b"string" and r.type("e:absent") == b"none"
